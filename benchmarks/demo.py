"""The demo: compile a BERT-like encoder layer ONCE with symbolic batch and sequence, run it at
many shapes, print per-shape latency, the error against jax.jit, and the compile count."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

import disc_stablehlo as disc  # noqa: E402
from encoder import encoder_inputs, encoder_layer, encoder_params, encoder_specs  # noqa: E402

SHAPES = [(1, 7), (1, 32), (2, 64), (3, 500), (4, 128), (8, 128), (1, 1), (16, 256), (5, 33), (12, 77), (2, 200), (8, 16)]


def main() -> None:
    params = encoder_params()
    t0 = time.perf_counter()
    f = disc.compile(encoder_layer, *encoder_specs(params))
    print(f"compiled once in {time.perf_counter() - t0:.2f} s (symbolic batch and seq)")
    ref = jax.jit(encoder_layer)
    print(f"{'batch':>5} {'seq':>4} {'latency ms':>11} {'max |err| vs jax.jit':>22}")
    for bsz, seq in SHAPES:
        x, mask = encoder_inputs(bsz, seq)
        f(x, mask, params)  # warm the allocator cache for this size
        t = time.perf_counter()
        y = f(x, mask, params)
        ms = (time.perf_counter() - t) * 1e3
        err = float(np.abs(y - np.asarray(ref(x, mask, params))).max())
        print(f"{bsz:>5} {seq:>4} {ms:>11.2f} {err:>22.2e}")
    print(f"compile_count = {f.compile_count} across {len(SHAPES)} shapes")


if __name__ == "__main__":
    main()
