"""Encoder layer over a trace of (batch, seq) requests, side by side in one process:
disc_stablehlo (compiled once, symbolic batch and seq) against jax.jit (compiles per shape).

Prints compile time, end-to-end trace time (every compilation included), first-request
latency, and steady-state latency at fixed shapes interleaved round-robin.

    python3 dev.py bench [--requests 150] [--seed 0] [--steady-reps 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

import disc_stablehlo as disc  # noqa: E402
from models import encoder_inputs, encoder_layer, encoder_params, encoder_specs  # noqa: E402

STEADY_SHAPES = [(1, 32), (8, 128), (16, 256)]


def make_trace(n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(1, 17)), int(rng.integers(8, 257))) for _ in range(n)]


def run_trace(name, make_fn, trace, params):
    inputs = {shape: encoder_inputs(*shape) for shape in set(trace)}
    t0 = time.perf_counter()
    fn = make_fn()
    first = None
    for shape in trace:
        out = fn(*inputs[shape], params)
        np.asarray(out)  # wait for the result (JAX is asynchronous)
        if first is None:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return {"name": name, "total_s": total, "first_s": first, "fn": fn}


def steady(fn, params, reps):
    inputs = {s: encoder_inputs(*s) for s in STEADY_SHAPES}
    for s in STEADY_SHAPES:
        np.asarray(fn(*inputs[s], params))
    times = {s: [] for s in STEADY_SHAPES}
    for _ in range(reps):
        for s in STEADY_SHAPES:  # round-robin: no shape runs twice in a row
            t = time.perf_counter()
            np.asarray(fn(*inputs[s], params))
            times[s].append(time.perf_counter() - t)
    return {s: float(np.median(v)) for s, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steady-reps", type=int, default=5)
    args = ap.parse_args()
    params = encoder_params()
    trace = make_trace(args.requests, args.seed)
    print(f"trace: {len(trace)} requests, {len(set(trace))} distinct (batch, seq) shapes, seed {args.seed}, "
          f"{os.cpu_count()} cores")

    compiles = {}

    def make_disc():
        t = time.perf_counter()
        f = disc.compile(encoder_layer, *encoder_specs(params))
        compiles["disc"] = time.perf_counter() - t
        return f

    results = [run_trace("disc_stablehlo", make_disc, trace, params),
               run_trace("jax.jit", lambda: jax.jit(encoder_layer), trace, params)]
    disc_fn = results[0]["fn"]
    print(f"\ndisc_stablehlo: compile {compiles['disc']:.2f} s, compile_count {disc_fn.compile_count}; "
          f"jax.jit compiled {len(set(trace))} times (once per distinct shape)")
    print(f"\n{'peer':<16} {'trace total s':>14} {'first request s':>16}")
    for r in results:
        print(f"{r['name']:<16} {r['total_s']:>14.2f} {r['first_s']:>16.2f}")
    print(f"\nsteady state, median ms over {args.steady_reps} round-robin passes")
    rows = {r["name"]: steady(r["fn"], params, args.steady_reps) for r in results}
    print(f"{'peer':<16} " + " ".join(f"{str(s):>12}" for s in STEADY_SHAPES))
    for name, row in rows.items():
        print(f"{name:<16} " + " ".join(f"{row[s] * 1e3:>12.2f}" for s in STEADY_SHAPES))
    ratio = {s: rows["disc_stablehlo"][s] / rows["jax.jit"][s] for s in STEADY_SHAPES}
    print("disc / jax.jit   " + " ".join(f"{ratio[s]:>12.2f}" for s in STEADY_SHAPES))
    print(f"trace total: disc / jax.jit = {results[0]['total_s'] / results[1]['total_s']:.2f}")


if __name__ == "__main__":
    main()
