"""Where the encoder layer's compile time goes (issue 15, item 4): `CompiledFunction.compile_seconds`
per stage, cold (each compilation the first of a fresh process: the compiler worker starts while
JAX exports) and warm (later compilations in one process, the worker kept), medians over the
runs, the cold and warm runs alternating. The layer is the trace's (hidden 256, 4 heads, FFN 1024),
compiled once for symbolic batch and sequence, on 2 threads. Writes compile_time.json.

    python benchmarks/compile_time.py [--runs 7]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import limit_threads, machine_load  # noqa: E402

limit_threads(2)


def compile_once(times: int) -> list[dict[str, float]]:
    """`times` compilations of the layer in this process, their `compile_seconds`."""
    import disc_stablehlo as disc
    from encoder import encoder_layer, encoder_params, encoder_specs

    params = encoder_params()
    return [disc.compile(encoder_layer, *encoder_specs(params)).compile_seconds for _ in range(times)]


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def main() -> None:
    if "--child" in sys.argv:  # one process: its first (cold) compilation, then a warm one
        print(json.dumps(compile_once(2)))
        return
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 7
    # the package's bytecode as an installation has it (dev.py does the same for `bench`)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(os.path.dirname(__file__), "..", "disc_stablehlo")],
                   check=True, capture_output=True)
    print(f"machine load (1 min average) {machine_load()}; {runs} fresh processes")
    cold, warm = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, check=True).stdout
        first, second = json.loads(out.strip().splitlines()[-1])
        cold.append(first)
        warm.append(second)
    stages = list(cold[0])
    table = {stage: {"cold_ms": 1e3 * median([r.get(stage, 0.0) for r in cold]),
                     "warm_ms": 1e3 * median([r.get(stage, 0.0) for r in warm])} for stage in stages}
    print(f"\n{'stage (median ms)':<50} {'cold':>8} {'warm':>8}")
    for stage, row in table.items():
        print(f"{stage:<50} {row['cold_ms']:>8.1f} {row['warm_ms']:>8.1f}")
    print(f"best total: cold {1e3 * min(r['total'] for r in cold):.1f} ms, warm {1e3 * min(r['total'] for r in warm):.1f} ms")
    print(f"machine load (1 min average) at the end {machine_load()}")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_time.json"), "w") as f:
        json.dump({"runs": runs, "median_ms": table, "cold": cold, "warm": warm}, f, indent=1)


if __name__ == "__main__":
    main()
