"""Memory-bound fused kernels on a CUDA GPU: the encoder layer's softmax (scores plus the mask),
residual add + layer norm (and the same with the residual sum a result too) and bias + GELU, a
row sum, a column sum and an elementwise chain, each
compiled once with dynamic dims, in GB/s (every input read once and every output written once:
what a fully fused kernel must move) against the device's copy rate, measured with torch's
device-to-device copy of 512 MB (bytes read plus written). Torch eager runs the same functions
beside, as a reference.

    python benchmarks/gpu/fusion.py prepare DIR      # here: compile for cuda
    python benchmarks/gpu/fusion.py run DIR [DIR...] # on the GPU machine (no MLIR there)

`run` with several folders (the same functions compiled by different versions of the compiler)
measures each beside the others in one run, named by its folder.

Each call's figure is the median over 5 rounds of 20 back-to-back calls between two CUDA events
on the current stream (after 5 warm-up calls), inputs already on the GPU as CUDA tensors, for
every peer alike; each kernel figure is the device time of the call's kernels and copies (CUPTI,
through torch's profiler: 10 calls), which leaves out the call's host work. Prints a JSON
summary line last."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

# name -> argument shapes at each measured size: the encoder layer's at (8, 128) and (16, 256), then larger
CASES = {
    "softmax_masked": [[(8, 12, 128, 128), (8, 128)], [(16, 12, 256, 256), (16, 256)], [(32, 12, 512, 512), (32, 512)]],
    "add_layer_norm": [[(1024, 768), (1024, 768), (768,), (768,)], [(4096, 768), (4096, 768), (768,), (768,)],
                       [(65536, 768), (65536, 768), (768,), (768,)]],
    # the encoder layer's first layer norm: the residual sum is a result too (the second residual's input)
    "residual_layer_norm": [[(4096, 768), (4096, 768), (768,), (768,)], [(65536, 768), (65536, 768), (768,), (768,)]],
    "bias_gelu": [[(1024, 3072), (3072,)], [(4096, 3072), (3072,)], [(32768, 3072), (3072,)]],
    "row_sum": [[(1024, 3072)], [(4096, 3072)], [(16384, 4096)]],
    "column_sum": [[(1024, 3072)], [(4096, 3072)], [(16384, 4096)]],
    "scale_add": [[(1024, 3072), (1024, 3072)], [(4096, 3072), (4096, 3072)], [(32768, 3072), (32768, 3072)]],
}


def _jax_functions():
    import jax
    import jax.numpy as jnp

    def softmax_masked(s, m):
        return jax.nn.softmax(s + m[:, None, None, :], axis=-1)

    def add_layer_norm(x, r, g, b):
        h = x + r
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        return (h - mean) * jax.lax.rsqrt(var + 1e-5) * g + b

    return {"softmax_masked": softmax_masked, "add_layer_norm": add_layer_norm,
            "residual_layer_norm": lambda x, r, g, b: (x + r, add_layer_norm(x, r, g, b)),
            "bias_gelu": lambda x, b: jax.nn.gelu(x + b, approximate=False),
            "row_sum": lambda x: jnp.sum(x, axis=-1), "column_sum": lambda x: jnp.sum(x, axis=0),
            "scale_add": lambda x, y: x * 1.5 + y}


def _torch_functions():
    import torch
    import torch.nn.functional as F  # noqa: N812

    return {"softmax_masked": lambda s, m: torch.softmax(s + m[:, None, None, :], dim=-1),
            "add_layer_norm": lambda x, r, g, b: F.layer_norm(x + r, (x.shape[-1],), g, b, 1e-5),
            "residual_layer_norm": lambda x, r, g, b: (x + r, F.layer_norm(x + r, (x.shape[-1],), g, b, 1e-5)),
            "bias_gelu": lambda x, b: F.gelu(x + b),
            "row_sum": lambda x: x.sum(-1), "column_sum": lambda x: x.sum(0),
            "scale_add": lambda x, y: x * 1.5 + y}


def _specs(shapes):
    """Dims that differ between the measured sizes are symbolic (one symbol per distinct tuple of sizes)."""
    import jax
    from jax import export

    names: dict[tuple[int, ...], str] = {}
    dims = []
    for sizes in zip(*shapes):  # an argument's shape at each size
        dims.append([ds[0] if len(set(ds)) == 1 else names.setdefault(ds, f"d{len(names)}") for ds in zip(*sizes)])
    symbols = dict(zip(names.values(), export.symbolic_shape(", ".join(names.values())))) if names else {}
    return [jax.ShapeDtypeStruct(tuple(symbols.get(d, d) for d in dim), np.float32) for dim in dims]


def prepare(folder: Path) -> None:
    import time

    import disc_stablehlo as disc

    folder.mkdir(parents=True, exist_ok=True)
    for name, fn in _jax_functions().items():
        start = time.perf_counter()
        f = disc.compile(fn, *_specs(CASES[name]), target="cuda")
        f.save(folder / f"{name}.disc")
        print(f"{name}: compiled for cuda in {time.perf_counter() - start:.2f} s: {', '.join(str(k) for k in f.kernels)}", flush=True)


def _time_ms(call, rounds: int = 5, calls: int = 20) -> float:
    import torch

    for _ in range(5):
        call()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return float(np.median(times))


def _kernel_ms(call, calls: int = 10) -> float:
    """The device time of one call's kernels and copies (CUPTI, through torch's profiler): the
    call's own host work and launch gaps left out."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return sum(a.self_device_time_total for a in prof.key_averages()) / calls / 1e3


def _results(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _copy_rate(dev) -> float:
    """GB/s of a device-to-device copy of 512 MB, bytes read plus written."""
    import torch

    src = torch.empty(128 << 20, dtype=torch.float32, device=dev).normal_()
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _time_ms(lambda: dst.copy_(src)) / 1e6


def run(folders: list[Path]) -> None:
    import os

    import torch

    import disc_stablehlo as disc

    dev = torch.device("cuda")
    copy_gbs = _copy_rate(dev)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}; "
          f"device copy: {copy_gbs:.0f} GB/s (512 MB read + written)", flush=True)
    eager = _torch_functions()
    rows = []
    g = torch.Generator(device=dev).manual_seed(0)
    names = ["disc_stablehlo"] if len(folders) == 1 else [f"disc_stablehlo {folder.name}" for folder in folders]
    for name, sizes in CASES.items():
        compiled = {peer: disc.load(folder / f"{name}.disc") for peer, folder in zip(names, folders)}
        for shapes in sizes:
            args = [torch.randn(s, device=dev, generator=g) for s in shapes]
            want = _results(eager[name](*args))
            moved = sum(a.numel() for a in args) * 4 + sum(w.numel() for w in want) * 4
            row = {"kernel": name, "shapes": shapes, "MB": moved / 1e6}
            errors = []
            for peer, f in list(compiled.items()):
                try:
                    err = max(float((g - w).abs().max()) for g, w in zip(_results(f(*args)), want))
                except Exception as e:  # a version that fails is reported and left out; the others go on
                    errors.append(f"{peer} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    del compiled[peer]
                    continue
                wrong = "" if err <= 1e-3 * max(1.0, *(float(w.abs().max()) for w in want)) else " MISMATCH"
                row[f"max_error {peer}"] = err
                errors.append(f"{peer} {err:.1e}{wrong}")
            for peer, call in [*((p, lambda f=f: f(*args)) for p, f in compiled.items()), ("torch eager", lambda: eager[name](*args))]:
                ms, kernel_ms = _time_ms(call), _kernel_ms(call)
                row[peer] = {"ms": ms, "GB/s": moved / ms / 1e6, "of copy": moved / ms / 1e6 / copy_gbs,
                             "kernel_ms": kernel_ms, "kernel GB/s": moved / kernel_ms / 1e6, "kernel of copy": moved / kernel_ms / 1e6 / copy_gbs}
            rows.append(row)
            print(f"{name} {shapes}: {moved / 1e6:.0f} MB, max error {', '.join(errors)}; " + ", ".join(
                f"{p} {row[p]['ms'] * 1e3:.1f} us a call = {row[p]['GB/s']:.0f} GB/s, kernels {row[p]['kernel_ms'] * 1e3:.1f} us = "
                f"{row[p]['kernel GB/s']:.0f} GB/s ({100 * row[p]['kernel of copy']:.0f} % of copy)"
                for p in [*compiled, "torch eager"]), flush=True)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "copy_GBs": copy_gbs, "kernels": rows}))


if __name__ == "__main__":
    cmd, folders = sys.argv[1], [Path(a) for a in sys.argv[2:]]
    prepare(folders[0]) if cmd == "prepare" else run(folders)
