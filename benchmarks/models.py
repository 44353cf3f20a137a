"""Real models from transformers and torchvision, random weights from their configs: BERT-base,
GPT-2 small, a LLaMA-style 4-layer decoder, a Mixtral-style 2-layer mixture-of-experts decoder
(8 experts, 2 per token), ViT-B/16 (dynamic batch: its position table fixes
the image size), ResNet-50, MobileNetV3-Large and a sequence tagger over a 2-layer bidirectional
LSTM (hidden 512; dynamo runs recurrent layers in PyTorch, so torch.compile's is eager's LSTM). Per model, side by
side in one process with the same threads and the same torch tensors as inputs:

- disc_stablehlo: `disc.compile` once with dynamic batch and sequence / image size;
- torch eager;
- torch.compile(dynamic=True) (inductor).

For every peer the same treatment: its first call at each shape is timed and reported ("first
calls", compilation included: disc_stablehlo's `disc.compile` is counted there too), then the
median of --reps calls per shape, the shapes taken round robin and the peers' order rotated from
one repetition to the next. Each peer has its own copy of the weights, so none reads weights
another has just brought into the cache. Writes benchmarks/models.json (a
run of some models replaces their rows) and benchmarks/models.png.

    python benchmarks/models.py [--models bert,gpt2,llama,mixtral,vit,resnet50,mobilenet,bilstm] [--reps 6]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import limit_threads  # noqa: E402

THREADS = 2
limit_threads(THREADS)  # before any peer is imported
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # torch.compile compiles here, as disc_stablehlo does

import torch  # noqa: E402
from torch.export import Dim  # noqa: E402

import disc_stablehlo as disc  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))
from library_models import LastHiddenState, declare_torchvision_ops  # noqa: E402

torch.set_num_threads(THREADS)


def _torchvision():
    declare_torchvision_ops()
    import torchvision

    return torchvision


def text_model(name: str):
    _torchvision()  # transformers imports it
    import transformers as T

    if name == "bert":
        model = T.BertModel(T.BertConfig())
    elif name == "gpt2":
        model = T.GPT2Model(T.GPT2Config(use_cache=False))
    elif name == "mixtral":  # mixture of experts: 8 experts a layer, 2 per token (grouped GEMMs over the tokens each expert takes)
        model = T.MixtralModel(T.MixtralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=1408, num_hidden_layers=2,
                                               num_attention_heads=16, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
                                               max_position_embeddings=2048, use_cache=False))
    else:
        model = T.LlamaModel(T.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                           num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048, use_cache=False))
    model = LastHiddenState(model.eval()).eval()
    vocab = model.model.config.vocab_size

    def inputs(b: int, s: int):
        g = torch.Generator().manual_seed(b * 1000 + s)
        mask = torch.ones(b, s, dtype=torch.long)
        mask[0, -min(4, s - 1):] = 0
        return torch.randint(0, vocab, (b, s), generator=g), mask

    batch, seq = Dim("batch", max=64), Dim("seq", max=512)
    compile_args = (inputs(2, 16), {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    return model, inputs, [(1, 32), (4, 128), (8, 256)], compile_args


def vision_model(name: str):
    tv = _torchvision()
    model = {"resnet50": tv.models.resnet50, "mobilenet": tv.models.mobilenet_v3_large, "vit": tv.models.vit_b_16}[name]().eval()
    if name == "vit":  # torchvision starts the head at zero: every peer's output would be the bias, and match
        torch.nn.init.normal_(model.heads.head.weight, std=0.02, generator=torch.Generator().manual_seed(0))

    def inputs(b: int, s: int):
        return (torch.randn(b, 3, s, s, generator=torch.Generator().manual_seed(b * 1000 + s)),)

    if name == "vit":  # its position table fixes the image size: dynamic batch only
        return model, inputs, [(1, 224), (4, 224), (8, 224)], (inputs(2, 224), {"x": {0: Dim("batch", max=64)}})
    dims = {0: Dim("batch", max=64), 2: Dim("h", min=64, max=1024), 3: Dim("w", min=64, max=1024)}
    return model, inputs, [(1, 224), (4, 224), (2, 320)], (inputs(2, 224), {"x": dims})


class Tagger(torch.nn.Module):
    """A sequence tagger: embeddings, a 2-layer bidirectional LSTM, a classifier per token."""

    def __init__(self):
        super().__init__()
        self.emb, self.lstm = torch.nn.Embedding(32000, 256), torch.nn.LSTM(256, 512, num_layers=2, batch_first=True, bidirectional=True)
        self.out = torch.nn.Linear(1024, 32)

    def forward(self, tokens):
        return self.out(self.lstm(self.emb(tokens))[0])


def recurrent_model(name: str):
    torch.manual_seed(0)
    model = Tagger().eval()

    def inputs(b: int, s: int):
        return (torch.randint(0, 32000, (b, s), generator=torch.Generator().manual_seed(b * 1000 + s)),)

    return model, inputs, [(1, 32), (4, 128), (8, 256)], (inputs(2, 16), {"tokens": {0: Dim("batch", max=64), 1: Dim("seq", max=4096)}})


MODELS = {"bert": text_model, "gpt2": text_model, "llama": text_model, "mixtral": text_model, "vit": vision_model,
          "resnet50": vision_model, "mobilenet": vision_model, "bilstm": recurrent_model}
LABELS = {"bert": "BERT-base", "gpt2": "GPT-2 small", "llama": "LLaMA-style 4 layers", "mixtral": "Mixtral-style MoE 2 layers",
          "vit": "ViT-B/16", "resnet50": "ResNet-50", "mobilenet": "MobileNetV3-L", "bilstm": "BiLSTM tagger 2 layers"}


def measure(name: str, reps: int) -> dict:
    model, inputs, shapes, (example, dynamic_shapes) = MODELS[name](name)
    data = {name_: inputs(*shape) for name_, shape in zip(map(str, shapes), shapes)}
    peers = {}

    t0 = time.perf_counter()
    compiled = disc.compile(model, example, dynamic_shapes=dynamic_shapes)
    disc_compile = time.perf_counter() - t0
    peers["disc_stablehlo"] = compiled
    peers["torch eager"] = model
    # its own copy of the weights, as disc_stablehlo has: sharing eager's would let one of them read
    # weights the other just brought into the cache (this machine's L3 holds most of BERT-base's)
    peers["torch.compile"] = torch.compile(copy.deepcopy(model), dynamic=True)

    result = {"model": LABELS[name], "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
              "disc_compile_s": disc_compile, "kernels": len({k.name for k in compiled.kernels}),
              "first_calls_s": {}, "median_ms": {}, "max_abs_diff": {}}
    with torch.no_grad():
        want = {k: model(*v) for k, v in data.items()}
        for peer, fn in peers.items():
            t0 = time.perf_counter()
            for k, v in data.items():
                got = fn(*v)
                result["max_abs_diff"].setdefault(peer, 0.0)
                result["max_abs_diff"][peer] = max(result["max_abs_diff"][peer], float((got - want[k]).abs().max()))
            result["first_calls_s"][peer] = time.perf_counter() - t0 + (disc_compile if peer == "disc_stablehlo" else 0.0)
        times: dict[str, dict[str, list[float]]] = {p: {k: [] for k in data} for p in peers}
        names = list(peers)
        for rep in range(reps):
            for k, v in data.items():
                for peer in names[rep % len(names):] + names[:rep % len(names)]:  # each peer follows each other
                    fn = peers[peer]
                    t0 = time.perf_counter()
                    fn(*v)
                    times[peer][k].append(time.perf_counter() - t0)
    result["median_ms"] = {p: {k: statistics.median(ts) * 1e3 for k, ts in per.items()} for p, per in times.items()}
    result["load_1min"] = os.getloadavg()[0]
    return result


def report(rows: list[dict]) -> None:
    for r in rows:
        print(f"\n{r['model']} ({r['params_M']:.0f}M parameters; disc_stablehlo: compile {r['disc_compile_s']:.1f} s, "
              f"{r['kernels']} distinct kernels; load average {r['load_1min']:.2f})")
        shapes = list(next(iter(r["median_ms"].values())))
        print(f"{'peer':<16}{'first calls s':>14}" + "".join(f"{s:>16}" for s in shapes) + f"{'max |diff|':>12}")
        for peer, per in r["median_ms"].items():
            print(f"{peer:<16}{r['first_calls_s'][peer]:>14.1f}" + "".join(f"{per[s]:>13.1f} ms" for s in shapes)
                  + f"{r['max_abs_diff'][peer]:>12.1e}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rows):
        shapes = list(next(iter(r["median_ms"].values())))
        eager = r["median_ms"]["torch eager"]
        for i, (peer, per) in enumerate(r["median_ms"].items()):
            ax.bar([j + 0.27 * (i - 1) for j in range(len(shapes))], [eager[s] / per[s] for s in shapes], 0.27, label=peer)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(shapes)), shapes, fontsize=7)
        ax.set_title(r["model"], fontsize=9)
        ax.set_ylabel("speed vs torch eager (x)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ", ".join(MODELS))
    ap.add_argument("--reps", type=int, default=6)
    ns = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"{os.cpu_count()} cores, {THREADS} threads per peer, torch {torch.__version__}", flush=True)
    rows = []
    for name in ns.models.split(","):
        rows.append(measure(name, ns.reps))
        report(rows[-1:])
        sys.stdout.flush()
    # a run of some models replaces their rows and keeps the others' (each row: its peers side by side, one run)
    path = os.path.join(here, "models.json")
    kept = json.load(open(path))["rows"] if os.path.exists(path) else []
    measured = {r["model"] for r in rows}
    rows = sorted([r for r in kept if r["model"] not in measured] + rows, key=lambda r: list(LABELS.values()).index(r["model"]))
    with open(path, "w") as f:
        json.dump({"threads": THREADS, "rows": rows}, f, indent=1)
    plot(rows, os.path.join(here, "models.png"))


if __name__ == "__main__":
    main()
