"""Fusion microbenchmarks: softmax, layer norm and a GELU chain, each compiled once with dynamic
dims by disc_stablehlo and run at several shapes next to jax.jit (softmax also over scores with
every tenth column masked at -1e9); throughput in GB/s (each input
read once and the output written once: what a fully fused kernel must move) against this
machine's memory bandwidth, measured with numpy copies on the same threads (no peer's code).
Both peers get 2 threads (the process is pinned to 2 cores) and their inputs in their own arrays
(numpy for disc_stablehlo, device arrays for JAX); each timed call returns once its result is
computed. Then the next-row prefetch of softmax and log-softmax (`loops.prefetch_next_rows`) vs
without, the reduction schedules (a column sum with the version host code picks vs without the
split schedule vs the row schedule alone; three fused column reductions), long loop bodies (exact and tanh
GELU, softmax) interleaved four vectors per iteration vs one (`loops.interleave_long_loops`),
GEMM epilogues (bias + GELU behind the GEMM vs as a loop of its own), and the encoder layer at (16, 256) in GFLOP/s against the
BLAS's measured SGEMM rate.

    python3 benchmarks/fusion_micro.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import best_time, limit_threads, machine_load, memory_bandwidth  # noqa: E402

THREADS = 2
limit_threads(THREADS)  # before any peer is imported
# compiled in this process: the side-by-side variants switch a pipeline step off here (`_without`),
# which a compiler worker would not see (the generated code is the same either way)
os.environ["DISC_COMPILE_WORKER"] = "0"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402

import disc_stablehlo as disc  # noqa: E402
from disc_stablehlo.passes import loops, pipeline  # noqa: E402
from encoder import FFN, HEADS, HIDDEN, encoder_inputs, encoder_layer, encoder_params, encoder_specs  # noqa: E402

SHAPES = [(64, 256), (1024, 1024), (4096, 4096)]


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5)


def gelu_chain(x):
    return jax.nn.gelu(x * 1.5 + 0.1, approximate=False) * 0.5


def _without(module, step: str, build, returns=0):
    """`build()` with one pipeline step switched off, returning `returns` (for side-by-side
    comparisons)."""
    kept = getattr(module, step)
    setattr(module, step, lambda *args: returns)
    try:
        return build()
    finally:
        setattr(module, step, kept)


def _alternating(fns, *args, rounds: int = 3) -> list[float]:
    """Each function's best time over `rounds` rounds that run them one after the other (this
    VM's speed moves between rounds)."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        best = [min(b, best_time(f, *args, reps=5)) for b, f in zip(best, fns)]
    return best


def main() -> None:
    r, c = export.symbolic_shape("r, c")
    spec = jax.ShapeDtypeStruct((r, c), jnp.float32)
    bandwidth = memory_bandwidth(THREADS)
    print(f"machine load (1 min average) {machine_load()}; {THREADS} threads per peer")
    print(f"memory bandwidth (numpy copy of 256 MiB on {THREADS} threads, read + write): {bandwidth:.1f} GB/s\n")
    print(f"{'op':<12} {'shape':>12} {'disc GB/s':>10} {'jax GB/s':>10} {'disc % of bw':>13} {'disc kernels':>13}")
    # "masked": every tenth column at -1e9, as attention scores under a padding mask
    for name, fn in [("softmax", softmax), ("masked", softmax), ("layer_norm", layer_norm), ("gelu_chain", gelu_chain)]:
        compiled = disc.compile(fn, spec)
        jitted = jax.jit(fn)
        for shape in SHAPES:
            x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
            if name == "masked":
                x[:, ::10] = -1e9
            moved = 2 * x.nbytes / 1e9
            gd, gj = moved / best_time(compiled, x), moved / best_time(jitted, jax.device_put(x))
            print(f"{name:<12} {str(shape):>12} {gd:>10.1f} {gj:>10.1f} {gd / bandwidth:>12.0%} {len(compiled.kernels):>13}")

    print(f"\n{'next row':<12} {'shape':>12} {'prefetch':>10} {'without':>10}  GB/s (best of 3 alternating rounds)")
    log_softmax = lambda x: jax.nn.log_softmax(x, axis=-1)  # noqa: E731
    for name, fn in [("softmax", softmax), ("log_softmax", log_softmax)]:
        both = (disc.compile(fn, spec), _without(pipeline, "prefetch_next_rows", lambda: disc.compile(fn, spec)))
        for shape in [(4096, 4096), (16384, 1000), (512, 32768), (16384, 256)]:
            x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
            best = _alternating(both, x)
            print(f"{name:<12} {str(shape):>12} {2 * x.nbytes / 1e9 / best[0]:>10.1f} {2 * x.nbytes / 1e9 / best[1]:>10.1f}")

    print(f"\n{'column sum':<12} {'shape':>12} {'disc GB/s':>10} {'no split':>10} {'row only':>10} {'jax GB/s':>10}  version run")
    disc.collect_stats()  # which version of the column sum ran
    column_sum = disc.compile(lambda x: x.sum(0), spec)
    no_split = _without(loops, "_accumulations", lambda: disc.compile(lambda x: x.sum(0), spec), returns=None)
    row_only = _without(pipeline, "schedule_column_reductions", lambda: disc.compile(lambda x: x.sum(0), spec))
    jitted = jax.jit(lambda x: x.sum(0))
    for shape in [(4096, 8), (4096, 256), (256, 4096), (8192, 1024), (16384, 512), (200000, 16)]:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        before = column_sum.stats()
        rates = [x.nbytes / 1e9 / best_time(f, x) for f in (column_sum, no_split, row_only)]
        rates.append(x.nbytes / 1e9 / best_time(jitted, jax.device_put(x)))
        after = column_sum.stats()
        ran = [k.version for k in column_sum.kernels if after[k.name]["calls"] > before[k.name]["calls"]]
        print(f"{'':<12} {str(shape):>12} {rates[0]:>10.1f} {rates[1]:>10.1f} {rates[2]:>10.1f} {rates[3]:>10.1f}  {', '.join(ran)}")
    column_stats = lambda x: (x.mean(0), x.var(0), x.max(0))  # noqa: E731  (fused: one kernel, three reductions)
    fused, jitted = disc.compile(column_stats, spec), jax.jit(column_stats)
    for shape in [(8192, 1024), (1024, 1024)]:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        rates = [x.nbytes / 1e9 / best_time(fused, x), x.nbytes / 1e9 / best_time(jitted, jax.device_put(x))]
        print(f"{'mean,var,max':<12} {str(shape):>12} {rates[0]:>10.1f} {'':>10} {'':>10} {rates[1]:>10.1f}")

    print(f"\n{'long bodies':<12} {'shape':>12} {'interleaved':>12} {'one vector':>11}  GB/s (best of 3 alternating rounds)")
    tanh_gelu = lambda x: jax.nn.gelu(x, approximate=True)  # noqa: E731
    for name, fn in [("gelu_chain", gelu_chain), ("softmax", softmax), ("tanh GELU", tanh_gelu)]:
        both = (disc.compile(fn, spec), _without(pipeline, "interleave_long_loops", lambda: disc.compile(fn, spec)))
        for shape in [(4096, 1024), (32768, 24)]:
            x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
            best = _alternating(both, x)
            print(f"{name:<12} {str(shape):>12} {2 * x.nbytes / 1e9 / best[0]:>12.1f} {2 * x.nbytes / 1e9 / best[1]:>11.1f}")

    n, = export.symbolic_shape("n")
    print(f"\n{'epilogue':<12} {'shape':>12} {'behind ms':>10} {'apart ms':>10} {'jax ms':>10}")
    dense = lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=False)  # noqa: E731
    specs = (jax.ShapeDtypeStruct((n, 1024), jnp.float32), jax.ShapeDtypeStruct((1024, 1024), jnp.float32),
             jax.ShapeDtypeStruct((1024,), jnp.float32))
    behind = disc.compile(dense, *specs)
    apart = _without(pipeline, "fuse_epilogues", lambda: disc.compile(dense, *specs))
    for rows in (64, 1024, 4096):
        args = [np.random.default_rng(i).standard_normal(s).astype(np.float32) for i, s in enumerate([(rows, 1024), (1024, 1024), (1024,)])]
        times = [best_time(f, *args) * 1e3 for f in (behind, apart)] + [best_time(jax.jit(dense), *jax.device_put(args)) * 1e3]
        print(f"{'bias+GELU':<12} {str((rows, 1024)):>12} {times[0]:>10.2f} {times[1]:>10.2f} {times[2]:>10.2f}")

    a = np.random.default_rng(2).standard_normal((4096, 1024)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((1024, 1024)).astype(np.float32)
    gemm = disc.compile(lambda x, y: x @ y, jax.ShapeDtypeStruct((n, 1024), jnp.float32), jax.ShapeDtypeStruct((1024, 1024), jnp.float32))
    sgemm = 2 * 4096 * 1024 * 1024 / best_time(gemm, a, w, reps=5) / 1e9
    params = encoder_params()
    layer = disc.compile(encoder_layer, *encoder_specs(params))
    b, s = 16, 256
    tokens = b * s
    flops = 2 * tokens * HIDDEN * HIDDEN * 4 + 2 * tokens * HIDDEN * FFN * 2 + 2 * 2 * b * HEADS * s * s * (HIDDEN // HEADS)
    x, mask = encoder_inputs(b, s)
    rate = flops / best_time(layer, x, mask, params, reps=5) / 1e9
    print(f"\nSGEMM 4096x1024x1024 through the RAL: {sgemm:.0f} GFLOP/s")
    print(f"encoder layer at (16, 256): {flops / 1e9:.2f} GFLOP, {rate:.0f} GFLOP/s = {rate / sgemm:.0%} of the SGEMM rate")


if __name__ == "__main__":
    main()
