"""What every benchmark gives every peer alike: the same threads, and a memory bandwidth measured
without any peer's code."""

from __future__ import annotations

import os
import threading
import time

import numpy as np


def limit_threads(n: int) -> None:
    """Every peer gets `n` threads. Call before importing any peer. The process is pinned to `n`
    cores, so the pools that size themselves from the cores they may use (XLA's, IREE's) get `n`;
    each runtime's own setting is given too (torch: `torch.set_num_threads`, IREE: `iree_threads`).
    numpy's BLAS is no peer: one thread, so none of its threads spin beside the peers'."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:n])
    os.environ["DISC_NUM_THREADS"] = str(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"


def iree_threads(n: int) -> None:
    import iree.runtime as rt

    rt.flags.parse_flags(f"--task_topology_max_group_count={n}")


def machine_load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def memory_bandwidth(threads: int, mib: int = 256) -> float:
    """GB/s of a copy with numpy (read + write), split over `threads` Python threads (numpy lets go
    of the GIL while it copies): the best of 5."""
    src = np.ones(mib * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def copy(lo: int, hi: int) -> None:
        np.copyto(dst[lo:hi], src[lo:hi])

    best = float("inf")
    for _ in range(5):
        workers = [threading.Thread(target=copy, args=b) for b in bounds]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def best_time(fn, *args, reps: int = 15) -> float:
    """Best seconds of `fn(*args)` until its result is computed (JAX's asynchronous dispatch
    waited for), after one untimed call."""
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best
