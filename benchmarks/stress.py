"""Stress: one compiled encoder layer (hidden 256, 4 heads, FFN 1024) called from 8 threads x 500
calls at random (batch, seq), against the same calls made one after another; and memory over
10,000 calls.

    python benchmarks/stress.py [--threads 8] [--calls 500] [--rss-calls 10000]

Prints, and checks:
- every threaded result identical (bit for bit) to the serial result of the same inputs;
- aggregate throughput of the threads against one thread calling alone (the same calls): no
  lower, within 5 % of timing noise;
- RSS after --rss-calls calls against RSS after a tenth of them (the runtime's cache is bounded,
  buffers go back with their arrays): within 5 %.
Exits 1 when a check fails. The machine's load is printed with the figures."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    import disc_stablehlo as disc
    from encoder import encoder_inputs, encoder_layer, encoder_params, encoder_specs

    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rss-calls", type=int, default=10000)
    opts = ap.parse_args()

    params = encoder_params(0)
    f = disc.compile(encoder_layer, *encoder_specs(params))
    rng = np.random.default_rng(0)
    shapes = [[(int(rng.integers(1, 9)), int(rng.integers(8, 65))) for _ in range(opts.calls)] for _ in range(opts.threads)]
    inputs = [[encoder_inputs(b, s, seed=t * opts.calls + i) for i, (b, s) in enumerate(calls)] for t, calls in enumerate(shapes)]
    print(f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, {opts.threads} threads x {opts.calls} calls", flush=True)

    start = time.perf_counter()
    serial = [[np.array(f(x, m, params)) for x, m in calls] for calls in inputs]
    alone = time.perf_counter() - start
    print(f"one thread, {opts.threads * opts.calls} calls: {alone:.2f} s ({opts.threads * opts.calls / alone:.0f} calls/s)", flush=True)

    results: list[list[np.ndarray | None]] = [[None] * opts.calls for _ in range(opts.threads)]
    failures: list[str] = []

    def worker(t: int) -> None:
        try:
            for i, (x, m) in enumerate(inputs[t]):
                results[t][i] = np.array(f(x, m, params))
        except Exception as e:  # noqa: BLE001  (reported below)
            failures.append(f"thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(opts.threads)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    together = time.perf_counter() - start
    print(f"{opts.threads} threads at once: {together:.2f} s ({opts.threads * opts.calls / together:.0f} calls/s), "
          f"{alone / together:.2f}x one thread's throughput; load {os.getloadavg()[0]:.2f}", flush=True)
    differ = sum(1 for t in range(opts.threads) for i in range(opts.calls)
                 if results[t][i] is None or not np.array_equal(results[t][i], serial[t][i]))
    print(f"results differing from the serial ones: {differ} of {opts.threads * opts.calls}", flush=True)

    x, m = inputs[0][0]
    marks = {}
    for i in range(1, opts.rss_calls + 1):
        f(x, m, params)
        if i in (opts.rss_calls // 10, opts.rss_calls):
            marks[i] = _rss_bytes()
    first, last = marks[opts.rss_calls // 10], marks[opts.rss_calls]
    print(f"RSS after {opts.rss_calls // 10} calls {first / 2**20:.1f} MiB, after {opts.rss_calls} {last / 2**20:.1f} MiB "
          f"({(last - first) / first:+.1%})", flush=True)
    ok = not failures and differ == 0 and alone / together >= 0.95 and last <= first * 1.05  # 5 %: timing noise
    for line in failures:
        print(line)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
