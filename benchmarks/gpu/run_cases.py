"""Runs the artifacts `prepare.py` wrote on this machine's GPU, with only the runtime side of the
package (no MLIR, no LLVM): each program at its three shapes, with numpy arguments (copied to the
device and back), with CUDA tensors (on the caller's stream, results as CUDA tensors) and with
JAX GPU arrays (results as JAX GPU arrays), compared with jax.jit's outputs computed where the
artifacts were compiled.

    DISC_RAL_DIR=<ral build> python benchmarks/gpu/run_cases.py CASES_DIR

Prints the device, one line per program and a summary; exits 1 if any program failed."""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np


def main() -> int:
    import jax
    import torch

    import disc_stablehlo as disc

    folder = Path(sys.argv[1])
    index = json.loads((folder / "index.json").read_text())
    jax.config.update("jax_enable_x64", True)  # float64 and int64 arguments stay what they are
    gpu = jax.devices("gpu")[0]
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, jax {jax.__version__}",
          flush=True)
    failed = []
    for case in index:
        name, tol = case["name"], case["tol"]
        start = time.perf_counter()
        try:
            f = disc.load(folder / f"{name}.disc")
            worst = 0.0
            for k in range(case["shapes"]):
                with np.load(folder / f"{name}.{k}.npz") as data:
                    inputs = [data[f"in{i}"] for i in range(sum(1 for n in data.files if n.startswith("in")))]
                    want = [data[f"out{i}"] for i in range(sum(1 for n in data.files if n.startswith("out")))]
                    dtypes = [str(d) for d in data["dtypes"]]
                for mode in ("numpy", "cuda", "jax"):
                    if mode == "numpy":
                        got = f(*inputs)
                    elif mode == "cuda":
                        got = f(*[torch.from_numpy(np.array(x)).cuda() for x in inputs])  # np.array keeps rank 0
                        torch.cuda.synchronize()
                    else:
                        got = f(*[jax.device_put(x, gpu) for x in inputs])
                        kinds = {type(g).__module__.split(".")[0] for g in jax.tree_util.tree_leaves(got)}
                        assert kinds <= {"jax", "jaxlib"} and all(g.devices() == {gpu} for g in jax.tree_util.tree_leaves(got)), kinds
                    got = jax.tree_util.tree_leaves(got)  # the program's result structure, as compiled
                    for g, w, dtype in zip(got, want, dtypes):
                        if mode == "cuda":  # numpy has no bfloat16 of torch's: compared as float32
                            g = (g.float() if dtype == "bfloat16" else g).cpu().numpy()
                        else:
                            g = np.asarray(g)
                            assert g.dtype.name == dtype, f"dtype {g.dtype} != {dtype}"
                        assert g.shape == w.shape, f"{mode} at {case['envs'][k]}: shape {g.shape} != {w.shape}"
                        np.testing.assert_allclose(g.astype(w.dtype), w, rtol=tol, atol=tol, err_msg=f"{mode} at {case['envs'][k]}")
                        if w.size and np.issubdtype(w.dtype, np.number):
                            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
            for k in range(case.get("refused", 0)):  # inputs an assumption about a size from the data fails for
                with np.load(folder / f"{name}.refused{k}.npz") as data:
                    inputs = [data[f"in{i}"] for i in range(len(data.files))]
                for mode, args in (("numpy", inputs), ("cuda", [torch.from_numpy(np.array(x)).cuda() for x in inputs])):
                    try:
                        f(*args)
                    except disc.ShapeError as e:
                        refusal = str(e).splitlines()[0][:160]
                    else:
                        raise AssertionError(f"{mode}: refused input {k} was not refused")
            refused = f", {case.get('refused', 0)} inputs refused ({refusal})" if case.get("refused") else ""
            print(f"PASS {name}: {case['shapes']} shapes x (numpy, cuda tensors, jax arrays), max abs error {worst:.2e}{refused}, "
                  f"{time.perf_counter() - start:.2f} s", flush=True)
        except Exception as e:  # noqa: BLE001  (every program is tried and reported)
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:600]}", flush=True)
            traceback.print_exc(limit=3)
    print(f"{len(index) - len(failed)} of {len(index)} programs match on the GPU; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
