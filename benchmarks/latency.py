"""Call latency of the encoder layer (hidden 256, 4 heads, FFN 1024) at (batch 1, seq 32), where the
call path and the thread pool's wake-up weigh most:

- the call path: the wall time of a call minus the time spent in the compiled code
  (`CompiledFunction.entry_time`), i.e. arguments checked and passed, the context, results wrapped;
- a call after a pause against a back-to-back call: each pause either sleeps or runs other work
  in the process (numpy), then one call is timed; torch eager measured the same way.

    python benchmarks/latency.py [--calls 3000] [--pauses 200] [--pause-ms 20]

Prints the figures with the machine's load. Every peer runs with the same threads (2 unless
DISC_NUM_THREADS / torch.set_num_threads say otherwise)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _back_to_back(fn, calls: int) -> np.ndarray:
    times = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t
    return times


def _after_pauses(fn, pauses: int, pause_s: float, busy: bool) -> np.ndarray:
    """One call timed after each pause: sleeping, or (busy) numpy work in this thread."""
    a = np.random.default_rng(0).standard_normal(1 << 16)
    times = np.empty(pauses)
    for i in range(pauses):
        end = time.perf_counter() + pause_s
        if busy:
            while time.perf_counter() < end:
                np.sort(a)
        else:
            time.sleep(pause_s)
        t = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t
    return times


def main() -> int:
    import torch

    import disc_stablehlo as disc
    from encoder import encoder_inputs, encoder_layer, encoder_params, encoder_specs, torch_encoder

    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--pauses", type=int, default=200)
    ap.add_argument("--pause-ms", type=float, default=20.0)
    args = ap.parse_args()
    threads = int(os.environ.get("DISC_NUM_THREADS", "2"))
    os.environ["DISC_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)

    params = encoder_params()
    f = disc.compile(encoder_layer, *encoder_specs(params))
    x, mask = encoder_inputs(1, 32)
    model = torch_encoder(params)
    tx, tmask = torch.from_numpy(x), torch.from_numpy(mask)
    peers = {"disc_stablehlo": lambda: f(x, mask, params), "torch eager": lambda: model(tx, tmask)}
    print(f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, {threads} threads each; encoder layer at (1, 32)")
    with torch.inference_mode():
        # the call path first, before torch has run (its OpenMP threads spin on after a call)
        _back_to_back(peers["disc_stablehlo"], 200)
        overheads, walls = [], []
        for _ in range(10):  # in batches: the median batch, so a batch hit by the machine's noise does not count
            before = f.entry_time()
            wall = _back_to_back(peers["disc_stablehlo"], args.calls // 10).mean()
            after = f.entry_time()
            overheads.append(wall - (after["seconds"] - before["seconds"]) / (after["calls"] - before["calls"]))
            walls.append(wall)
        print(f"call path: {1e6 * np.median(overheads):.1f} us per call (median of 10 batches of {args.calls // 10}; "
              f"best {1e6 * min(overheads):.1f} us), of {1e3 * np.median(walls):.3f} ms per call")

        _back_to_back(peers["torch eager"], 200)  # the same warm-up
        for name, fn in peers.items():
            steady = np.median(_back_to_back(fn, args.calls))
            for busy in (False, True):
                paused = np.median(_after_pauses(fn, args.pauses, args.pause_ms / 1e3, busy))
                print(f"{name}: back to back {1e3 * steady:.3f} ms, after {args.pause_ms:g} ms "
                      f"{'of other work' if busy else 'asleep'} {1e3 * paused:.3f} ms ({paused / steady:.2f}x)")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
