"""The encoder layer's GEMMs against the machine's peak (issue 15, item 3).

- The peak: a loop of independent AVX2 FMAs (12 sums in registers), compiled here with the C
  compiler and run on every thread at once, in GFLOP/s; it is no GEMM, just the rate the FMA
  units allow. The achievable SGEMM rate: the best of MKL (through the RAL, split over its pool
  as the compiled code does) and torch.mm (its own BLAS) on a square product of 2048.
- Each GEMM of the layer (hidden 256, 4 heads, FFN 1024) at (batch, seq) = (1, 32), (8, 128) and
  (16, 256), compiled once with dynamic dims: the runtime's own kernel (the default on CPUs with
  AVX2 and FMA and no AVX-512, and on AMD's with AVX-512), the same artifact on a runtime that
  gives single precision to MKL (DISC_GEMM=blas), and torch.matmul. 20 rounds of 5 calls, the peers alternating; GFLOP/s of
  the best round and of the median one (this VM's speed moves between rounds).
- The whole layer at the same shapes, on both runtimes, alternating.
Every peer on the same threads: 2, or `--threads N`.

    python benchmarks/gemm.py [--threads N]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import limit_threads, machine_load  # noqa: E402

THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 2
limit_threads(THREADS)  # before any peer is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402

PEAK_C = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
  long n = 50000000;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++)
    __asm__ volatile(
        "vfmadd231ps %%ymm14,%%ymm15,%%ymm0\n vfmadd231ps %%ymm14,%%ymm15,%%ymm1\n vfmadd231ps %%ymm14,%%ymm15,%%ymm2\n"
        "vfmadd231ps %%ymm14,%%ymm15,%%ymm3\n vfmadd231ps %%ymm14,%%ymm15,%%ymm4\n vfmadd231ps %%ymm14,%%ymm15,%%ymm5\n"
        "vfmadd231ps %%ymm14,%%ymm15,%%ymm6\n vfmadd231ps %%ymm14,%%ymm15,%%ymm7\n vfmadd231ps %%ymm14,%%ymm15,%%ymm8\n"
        "vfmadd231ps %%ymm14,%%ymm15,%%ymm9\n vfmadd231ps %%ymm14,%%ymm15,%%ymm10\n vfmadd231ps %%ymm14,%%ymm15,%%ymm11\n"
        ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%f\n", n * 12 * 16 / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / 1e9);
  return 0;
}
"""


def fma_peak(threads: int) -> float | None:
    """GFLOP/s of `threads` copies of the FMA loop at once (best of 3), or None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak")
        with open(src, "w") as f:
            f.write(PEAK_C)
        subprocess.run([cc, "-O2", src, "-o", exe], check=True)
        best = 0.0
        for _ in range(3):
            procs = [subprocess.Popen([exe], stdout=subprocess.PIPE, text=True) for _ in range(threads)]
            best = max(best, sum(float(p.communicate()[0]) for p in procs))
        return best


def blas_runtime_twin(f):
    """The artifact of `f` again, on a runtime of its own whose single-precision products go to the
    BLAS (MKL here): DISC_GEMM is read when a runtime is created."""
    from disc_stablehlo.runtime import CompiledFunction, Executable, Runtime

    os.environ["DISC_GEMM"] = "blas"
    try:
        runtime = Runtime(THREADS)
    finally:
        del os.environ["DISC_GEMM"]
    return CompiledFunction(Executable(f._exe.artifact, runtime), f._binding, compile_count=0)


def rounds(peers: dict, args: dict, n_rounds: int = 20, calls: int = 5) -> dict[str, tuple[float, float]]:
    """Seconds per call of each peer (best round, median round), over rounds of `calls`
    back-to-back calls, the peers alternating."""
    times: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(n_rounds):
        for name, fn in peers.items():
            fn(*args[name])  # wakes this peer's threads
            t = time.perf_counter()
            for _ in range(calls):
                fn(*args[name])
            times[name].append((time.perf_counter() - t) / calls)
    return {name: (min(t), float(np.median(t))) for name, t in times.items()}


def main() -> int:
    import torch

    import disc_stablehlo as disc
    from encoder import encoder_inputs, encoder_layer, encoder_params, encoder_specs

    torch.set_num_threads(THREADS)
    rng = np.random.default_rng(0)
    print(f"machine load (1 min average) {machine_load()}; {THREADS} threads per peer; float32")
    peak = fma_peak(THREADS)
    print(f"FMA peak ({THREADS} threads): " + (f"{peak:.0f} GFLOP/s" if peak else "no C compiler here, not measured"))

    def row(label, fn, tfn, dims, sizes, flops):
        """One product, compiled once for `dims` (its operands' dims, names dynamic), run at `sizes`."""
        scope = export.SymbolicScope()
        own = disc.compile(fn, *(jax.ShapeDtypeStruct(export.symbolic_shape(d, scope=scope), jnp.float32) for d in dims))
        blas = blas_runtime_twin(own)
        ops = [rng.standard_normal([sizes.get(x.strip(), 0) or int(x) for x in d.split(",")], dtype=np.float32) for d in dims]
        tops = [torch.from_numpy(o) for o in ops]
        t = rounds({"own": own, "mkl": blas, "torch": tfn}, {"own": ops, "mkl": ops, "torch": tops})
        rates = {k: (flops / best / 1e9, flops / median / 1e9) for k, (best, median) in t.items()}
        print(f"{label:<36}" + "".join(f" {rates[k][0]:>5.0f} /{rates[k][1]:>4.0f}" for k in ("own", "mkl", "torch"))
              + (f" {rates['own'][0] / peak:>8.0%}" if peak else ""))
        return rates

    n = 2048
    print(f"\n{'GFLOP/s, best / median':<36} {'RAL own':>11} {'RAL MKL':>11} {'torch':>11}" + (f" {'own/peak':>8}" if peak else ""))
    square = row(f"square {n}", lambda a, b: a @ b, torch.matmul, ["m, k", "k, n"], {"m": n, "k": n, "n": n}, 2 * n**3)
    achievable = max(square["mkl"][0], square["torch"][0])
    h, heads, ffn = 256, 4, 1024
    dh = h // heads
    for b, s in [(1, 32), (8, 128), (16, 256)]:
        t, sz = b * s, {"t": b * s, "b": b, "s": s}
        row(f"({b}, {s}) q/k/v/out [{t},{h}]x[{h},{h}]", lambda x, w: x @ w, torch.matmul, [f"t, {h}", f"{h}, {h}"], sz, 2 * t * h * h)
        row(f"({b}, {s}) FFN in [{t},{h}]x[{h},{ffn}]", lambda x, w: x @ w, torch.matmul, [f"t, {h}", f"{h}, {ffn}"], sz,
            2 * t * h * ffn)
        row(f"({b}, {s}) FFN out [{t},{ffn}]x[{ffn},{h}]", lambda x, w: x @ w, torch.matmul, [f"t, {ffn}", f"{ffn}, {h}"], sz,
            2 * t * h * ffn)
        row(f"({b}, {s}) scores q k^T (K {dh})", lambda q, k: q @ jnp.swapaxes(k, -1, -2), lambda q, k: q @ k.transpose(-1, -2),
            [f"b, {heads}, s, {dh}"] * 2, sz, 2 * b * heads * s * s * dh)
        row(f"({b}, {s}) context p v (K {s})", lambda p, v: p @ v, torch.matmul, [f"b, {heads}, s, s", f"b, {heads}, s, {dh}"], sz,
            2 * b * heads * s * s * dh)
    print(f"achievable SGEMM rate (best of MKL and torch.mm at {n}): {achievable:.0f} GFLOP/s"
          + (f" = {achievable / peak:.0%} of the FMA peak" if peak else ""))

    print("\nencoder layer, ms per call (best / median round)")
    params = encoder_params()
    own = disc.compile(encoder_layer, *encoder_specs(params))
    blas = blas_runtime_twin(own)
    for shape in [(1, 32), (8, 128), (16, 256)]:
        x, m = encoder_inputs(*shape)
        t = rounds({"own": own, "mkl": blas}, {"own": (x, m, params), "mkl": (x, m, params)})
        print(f"{str(shape):<12} RAL own {t['own'][0] * 1e3:7.2f} / {t['own'][1] * 1e3:7.2f}   RAL MKL {t['mkl'][0] * 1e3:7.2f} / "
              f"{t['mkl'][1] * 1e3:7.2f}   own/MKL {t['own'][0] / t['mkl'][0]:.2f} / {t['own'][1] / t['mkl'][1]:.2f}")
    print(f"machine load (1 min average) at the end {machine_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
