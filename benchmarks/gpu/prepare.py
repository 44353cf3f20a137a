"""Compiles the JAX test programs (tests/test_jax_programs.py) for a CUDA target on this machine
and writes, per program, its artifact and its inputs and jax.jit's outputs at three shapes, for
`run_cases.py` to run on a GPU machine that has no MLIR (docs/gpu.md). Then the same for PyTorch
models that only the PyTorch frontend brings (`torch_cases`: a mixture-of-experts decoder's
grouped GEMMs, sizes the data decides), their outputs from eager PyTorch, and inputs the
compiled function must refuse with a ShapeError (an assumption about such a size that fails).

    python benchmarks/gpu/prepare.py OUT_DIR [--target cuda:sm_90] [--only name,...]

Prints one line per program: compiled, or why not."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import disc_stablehlo as disc  # noqa: E402
from conftest import concrete, random_array, specs_for  # noqa: E402
from test_jax_programs import CASES  # noqa: E402


def torch_cases() -> list[dict]:
    """Each: name, model, example inputs, dynamic shapes, inputs at three shapes, tolerance, and
    inputs it must refuse with a ShapeError. A small Mixtral (tokens sorted by expert, counted by
    histc, grouped GEMMs over int32 offsets), and tests/test_torch_data_dependent.py's programs
    (boolean masks, nonzero, repeat_interleave, unique, .item() lengths: scatters and slices
    whose sizes the data decides, checks at run time)."""
    import torch
    from torch.export import Dim

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from library_models import LastHiddenState, declare_torchvision_ops

    declare_torchvision_ops()
    import transformers
    from test_torch_data_dependent import CASES as DATA_CASES
    from test_torch_data_dependent import EvenPrefix, PairsOfSelected, RaggedSum

    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=256,
                                        max_position_embeddings=256, use_cache=False)
    g = torch.Generator().manual_seed(1)

    def tokens(b: int, s: int) -> tuple:
        return torch.randint(0, 256, (b, s), generator=g), torch.ones(b, s, dtype=torch.long)
    batch, seq = Dim("batch", max=32), Dim("seq", max=256)
    cases = [dict(name="mixtral_moe", model=LastHiddenState(transformers.MixtralModel(config).eval()).eval(), example=tokens(2, 9),
                  dynamic={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
                  shapes=[tokens(1, 1), tokens(3, 17), tokens(4, 100)], tol=1e-4, refused=[])]
    rng = np.random.default_rng(0)

    def tensors(arrays) -> tuple:
        return tuple(torch.from_numpy(np.asarray(a)) for a in arrays)
    for name, make, inputs, spec in DATA_CASES:
        dims: dict = {}
        dynamic = tuple({axis: dims.setdefault(d, Dim(d)) for axis, d in s.items()} for s in spec)
        cases.append(dict(name=name, model=make().eval(), example=tensors(inputs(8, rng)), dynamic=dynamic,
                          shapes=[tensors(inputs(n, rng)) for n in (1, 13, 40)], tol=1e-5, refused=[]))
    ragged = next(c for c in cases if isinstance(c["model"], RaggedSum))  # a negative count; lengths not adding up
    ragged["refused"] = [tensors((np.ones((2, 3), np.float32), [2, -1, 1])), tensors((np.ones((5, 3), np.float32), [1, 2, 1]))]
    n = Dim("n")
    cases.append(dict(name="pairs_of_selected", model=PairsOfSelected().eval(), example=tensors([np.arange(-3, 5, dtype=np.float32)]),
                      dynamic=({0: n},), shapes=[tensors([np.array(v, np.float32)]) for v in ([5, 6], [1, -1, 2, 3, -4, 4], np.arange(-50, 51))],
                      tol=0, refused=[tensors([np.array([1, -1, 2, 3, -4, -5], np.float32)])]))
    cases.append(dict(name="even_prefix", model=EvenPrefix().eval(), example=(torch.randn(6), torch.tensor(2)), dynamic=({0: n}, None),
                      shapes=[tensors((np.zeros(k, np.float32), np.array(j))) for k, j in ((6, 4), (1, 0), (100, 64))], tol=0,
                      refused=[tensors((np.zeros(6, np.float32), np.array(3)))]))
    return cases


def _flat(values) -> list:
    return list(values) if isinstance(values, (tuple, list)) else [values]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--target", default="cuda:sm_90")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    index = []
    for name, fn, args, dims, envs, tol in CASES:
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            f = disc.compile(fn, *specs_for(args, dims), target=a.target)
        except disc.DiscError as e:
            print(f"{name}: not compiled: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        f.save(out / f"{name}.disc")
        rng = np.random.default_rng(0)
        for k, env in enumerate(envs):
            inputs = [random_array(concrete(shape, env), dtype, rng) for shape, dtype in args]
            want = [np.asarray(w) for w in jax.tree_util.tree_leaves(jax.jit(fn)(*inputs))]
            # .npz keeps no ml_dtypes type (bfloat16 would come back as raw bytes): stored as the
            # float32 it widens to exactly, with the dtype's name for the comparison
            dtypes = [w.dtype.name for w in want]
            want = [w.astype(np.float32) if w.dtype.type.__module__.startswith("ml_dtypes") else w for w in want]
            np.savez(out / f"{name}.{k}.npz", **{f"in{i}": x for i, x in enumerate(inputs)}, **{f"out{i}": w for i, w in enumerate(want)},
                     dtypes=np.array(dtypes))
        index.append({"name": name, "shapes": len(envs), "tol": tol, "envs": envs})
        print(f"{name}: compiled in {time.perf_counter() - start:.2f} s", flush=True)
    import torch

    cases = torch_cases()
    for c in cases:
        name, model = c["name"], c["model"]
        if only and name not in only:
            continue
        try:
            f = disc.compile(model, c["example"], dynamic_shapes=c["dynamic"], target=a.target)
        except disc.DiscError as e:
            print(f"{name}: not compiled: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        f.save(out / f"{name}.disc")
        for k, inputs in enumerate(c["shapes"]):
            with torch.no_grad():
                want = [w.detach().numpy() for w in _flat(model(*inputs))]
            np.savez(out / f"{name}.{k}.npz", **{f"in{i}": x.numpy() for i, x in enumerate(inputs)},
                     **{f"out{i}": w for i, w in enumerate(want)}, dtypes=np.array([w.dtype.name for w in want]))
        for k, inputs in enumerate(c["refused"]):
            np.savez(out / f"{name}.refused{k}.npz", **{f"in{i}": x.numpy() for i, x in enumerate(inputs)})
        index.append({"name": name, "shapes": len(c["shapes"]), "refused": len(c["refused"]), "tol": c["tol"],
                      "envs": [[list(x.shape) for x in inputs] for inputs in c["shapes"]]})
        print(f"{name}: compiled", flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"{len(index)} of {len(CASES) + len(cases) if not only else len(only)} programs compiled for {a.target}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DISC_COMPILE_HELPER", "0")
    sys.exit(main())
