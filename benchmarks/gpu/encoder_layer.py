"""A BERT-base encoder layer (hidden 768, 12 heads, FFN 3072, f32) on a CUDA GPU: disc_stablehlo
against torch eager and torch.compile(dynamic=True) over the same weights, TF32 off for everyone.

    python benchmarks/gpu/encoder_layer.py prepare DIR     # here: compile for cuda, save artifact + weights
    python benchmarks/gpu/encoder_layer.py run DIR         # on the GPU machine (no MLIR there)

`run` times each peer alike with CUDA events, inputs already on the GPU as CUDA tensors, results
as CUDA tensors: steady state at three shapes (median of 20 calls after 5 warm-up calls, the same
for every peer), and a 150-request trace of random (batch, seq) end to end, torch.compile's
compilations included (disc_stablehlo's compilation happened once, in `prepare`: its time is
printed there and added to its trace total). Prints a JSON summary line last."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN, HEADS, FFN = 768, 12, 3072
SHAPES = [(1, 32), (8, 128), (16, 256)]


def prepare(folder: Path) -> None:
    import jax

    import disc_stablehlo as disc
    from encoder import encoder_layer, encoder_params, encoder_specs

    params = encoder_params(0, HIDDEN, FFN)
    start = time.perf_counter()
    f = disc.compile(lambda x, m, p: encoder_layer(x, m, p, HEADS), *encoder_specs(params), target="cuda")
    seconds = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    f.save(folder / "encoder.disc")
    np.savez(folder / "weights.npz", **params)
    order = [k for k, _ in sorted(params.items())]  # the order of the flat arguments after x and mask (a dict's leaves)
    assert len(jax.tree_util.tree_leaves(params)) == len(order)
    (folder / "encoder.json").write_text(json.dumps({"compile_s": seconds, "order": order, "kernels": [str(k) for k in f.kernels]}))
    print(f"compiled for cuda in {seconds:.2f} s: {len(f.kernels)} kernels")


def _time(call, reps: int, warm: int) -> float:
    import torch

    for _ in range(warm):
        call()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def run(folder: Path) -> None:
    import torch

    import disc_stablehlo as disc
    from encoder import encoder_inputs, torch_encoder

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    meta = json.loads((folder / "encoder.json").read_text())
    with np.load(folder / "weights.npz") as w:
        params = {k: w[k] for k in w.files}
    dev = torch.device("cuda")
    weights = [torch.from_numpy(params[k]).to(dev) for k in meta["order"]]
    f = disc.load(folder / "encoder.disc")
    eager = torch_encoder(params, HEADS, "cuda")
    compiled = torch.compile(torch_encoder(params, HEADS, "cuda"), dynamic=True)
    peers = {"disc_stablehlo": lambda x, m: f(x, m, *weights), "torch eager": eager, "torch.compile": compiled}
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}", flush=True)

    def inputs(b: int, s: int):
        x, m = encoder_inputs(b, s, hidden=HIDDEN)
        return torch.from_numpy(x).to(dev), torch.from_numpy(m).to(dev)

    # end to end over a trace (first: torch.compile's compilations happen here)
    rng = np.random.default_rng(0)
    trace = [(int(rng.integers(1, 17)), int(rng.integers(8, 257))) for _ in range(150)]
    data = [inputs(b, s) for b, s in trace]
    totals = {}
    with torch.no_grad():
        for name, peer in peers.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for x, m in data:
                peer(x, m)
            torch.cuda.synchronize()
            totals[name] = time.perf_counter() - start + (meta["compile_s"] if name == "disc_stablehlo" else 0.0)
            print(f"trace {name}: {totals[name]:.3f} s end to end", flush=True)
        x, m = inputs(4, 100)
        diff = float((peers["disc_stablehlo"](x, m) - eager(x, m)).abs().max())
        print(f"max |disc - eager| at (4, 100): {diff:.2e}", flush=True)
        steady = {}
        for b, s in SHAPES:
            x, m = inputs(b, s)
            steady[f"{b}x{s}"] = {name: _time(lambda p=peer: p(x, m), 20, 5) for name, peer in peers.items()}
            print(f"steady ({b}, {s}): " + ", ".join(f"{n} {t:.3f} ms" for n, t in steady[f'{b}x{s}'].items()), flush=True)
        # where disc_stablehlo's time goes at the largest shape: every kernel (ours and cuBLAS's), by CUPTI
        x, m = inputs(*SHAPES[-1])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                peers["disc_stablehlo"](x, m)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60), flush=True)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "trace_s": totals, "steady_ms": steady, "max_diff": diff,
                      "disc_compile_s": meta["compile_s"], "disc_kernels": len(meta["kernels"])}))


if __name__ == "__main__":
    cmd, folder = sys.argv[1], Path(sys.argv[2])
    prepare(folder) if cmd == "prepare" else run(folder)
