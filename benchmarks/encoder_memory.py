"""Peak bytes the RAL allocates per call of the encoder layer over the request trace, with
buffers freed after their last use (their memory goes to later buffers through the RAL's cache)
and without (every temporary lives until the call returns).

    python3 benchmarks/encoder_memory.py [--requests 40]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import disc_stablehlo as disc  # noqa: E402
from encoder_trace import make_trace  # noqa: E402
from encoder import encoder_inputs, encoder_layer, encoder_params, encoder_specs  # noqa: E402


def peaks(f, trace, params) -> list[int]:
    runtime = f._exe.runtime
    out = []
    for shape in trace:
        x, mask = encoder_inputs(*shape)
        runtime.reset_peak()
        base = runtime.memory_stats()["bytes_in_use"]
        f(x, mask, params)
        out.append(runtime.memory_stats()["peak_bytes"] - base)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    params = encoder_params()
    trace = make_trace(args.requests, args.seed)
    print(f"peak bytes per call over {len(trace)} requests (batch 1-16, seq 8-256)")
    print(f"{'buffers':<28} {'max MiB':>9} {'mean MiB':>9}")
    rows = {}
    for reuse in (True, False):
        f = disc.compile(encoder_layer, *encoder_specs(params), buffer_reuse=reuse)
        p = np.array(peaks(f, trace, params)) / 2**20
        rows[reuse] = p
        print(f"{'freed after last use' if reuse else 'kept until the call ends':<28} {p.max():>9.2f} {p.mean():>9.2f}")
    print(f"saving: {1 - rows[True].mean() / rows[False].mean():.0%} of the mean peak")


if __name__ == "__main__":
    main()
