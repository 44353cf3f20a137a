"""JAX's linear algebra on the CPU compiled by disc_stablehlo (its LAPACK custom calls on the
runtime's BLAS, the batch split over the RAL's threads) against jax.jit (the same calls on
jaxlib's LAPACK), both peers on the same 2 threads, each compiled once with a dynamic batch and
given its own arrays; best of 7 calls after a warm-up, the peers alternating.

    python benchmarks/linalg.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import best_time, limit_threads, machine_load  # noqa: E402

THREADS = 2
limit_threads(THREADS)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402

CASES = [  # name, function, argument shapes (the first dim the dynamic batch)
    ("solve 64 x (256 x 256, 8 rhs)", jnp.linalg.solve, [(64, 256, 256), (64, 256, 8)]),
    ("solve 1 x (1024 x 1024)", jnp.linalg.solve, [(1, 1024, 1024), (1, 1024, 1)]),
    ("cholesky 256 x (64 x 64)", lambda a: jnp.linalg.cholesky(a @ jnp.swapaxes(a, -1, -2) + 64 * jnp.eye(64)),
     [(256, 64, 64)]),
    ("eigh 32 x (128 x 128)", lambda a: jnp.linalg.eigh(a + jnp.swapaxes(a, -1, -2)), [(32, 128, 128)]),
    ("svd 16 x (256 x 128)", lambda a: jnp.linalg.svd(a, full_matrices=False), [(16, 256, 128)]),
    ("qr 64 x (128 x 64)", jnp.linalg.qr, [(64, 128, 64)]),
]


def main() -> int:
    import disc_stablehlo as disc

    print(f"machine load (1 min average) {machine_load()}; {THREADS} threads per peer; float32")
    print(f"{'op':<34} {'disc ms':>9} {'jax ms':>9} {'disc/jax':>9}")
    for name, fn, shapes in CASES:
        b = export.symbolic_shape("b")[0]
        f = disc.compile(fn, *[jax.ShapeDtypeStruct((b, *s[1:]), np.float32) for s in shapes])
        jitted = jax.jit(fn)
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        device = [jnp.asarray(a) for a in args]
        disc_t, jax_t = float("inf"), float("inf")
        for _ in range(3):  # alternating
            disc_t = min(disc_t, best_time(f, *args, reps=3))
            jax_t = min(jax_t, best_time(jitted, *device, reps=3))
        print(f"{name:<34} {disc_t * 1e3:9.2f} {jax_t * 1e3:9.2f} {disc_t / jax_t:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
