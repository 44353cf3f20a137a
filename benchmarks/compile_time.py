"""Where the encoder layer's compile time goes (issue 15, item 4): `CompiledFunction.compile_seconds`
per stage, cold (each compilation the first of a fresh process: the compiler worker starts while
JAX exports), warm (the same function compiled again in that process, the worker kept: its
kernels come from the worker's kernel cache) and "cold, kernels on disk" (a fresh process with
DISC_CACHE_DIR whose kernels an earlier process compiled, but not this artifact: a model whose
kernels are unchanged), medians over the runs, the three alternating. The layer is the trace's (hidden 256, 4 heads, FFN 1024),
compiled once for symbolic batch and sequence, on 2 threads, for x86 (writes compile_time.json)
or a GPU target (compiled here, no GPU needed: writes compile_time_<target>.json).

    python benchmarks/compile_time.py [--runs 7] [--target cuda]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import limit_threads, machine_load  # noqa: E402

limit_threads(2)


def compile_once(times: int, target: str) -> list[dict[str, float]]:
    """`times` compilations of the layer in this process, their `compile_seconds`."""
    import disc_stablehlo as disc
    from encoder import encoder_layer, encoder_params, encoder_specs

    params = encoder_params()
    return [disc.compile(encoder_layer, *encoder_specs(params), target=target).compile_seconds for _ in range(times)]


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def main() -> None:
    target = sys.argv[sys.argv.index("--target") + 1] if "--target" in sys.argv else "x86"
    if "--child" in sys.argv:  # one process: its first (cold) compilation, then a warm one
        print(json.dumps(compile_once(2, target)))
        return
    if "--cached-child" in sys.argv:  # one process, one compilation, with the cache folder given
        os.environ["DISC_CACHE_DIR"] = sys.argv[sys.argv.index("--cached-child") + 1]
        print(json.dumps(compile_once(1, target)))
        return
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 7
    # the package's bytecode as an installation has it (dev.py does the same for `bench`)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(os.path.dirname(__file__), "..", "disc_stablehlo")],
                   check=True, capture_output=True)
    print(f"target {target}; machine load (1 min average) {machine_load()}; {runs} fresh processes")
    cold, warm, kernels_cached = [], [], []

    def child(*args: str) -> list[dict[str, float]]:
        out = subprocess.run([sys.executable, __file__, *args, "--target", target], capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    for _ in range(runs):
        first, second = child("--child")
        cold.append(first)
        warm.append(second)
        folder = tempfile.mkdtemp(prefix="disc-compile-time-")
        try:
            child("--cached-child", folder)  # fills the kernels and the artifact
            for entry in os.listdir(folder):  # the artifact goes, the kernels stay
                if entry != "kernels":
                    os.unlink(os.path.join(folder, entry))
            kernels_cached += child("--cached-child", folder)
        finally:
            shutil.rmtree(folder)
    columns = {"cold": cold, "warm": warm, "cold, kernels on disk": kernels_cached}
    table = {stage: {name: 1e3 * median([r.get(stage, 0.0) for r in rows]) for name, rows in columns.items()} for stage in cold[0]}
    print(f"\n{'stage (median ms)':<50} " + " ".join(f"{name:>22}" for name in columns))
    for stage, row in table.items():
        print(f"{stage:<50} " + " ".join(f"{row[name]:>22.1f}" for name in columns))
    print("best total: " + ", ".join(f"{name} {1e3 * min(r['total'] for r in rows):.1f} ms" for name, rows in columns.items()))
    print(f"machine load (1 min average) at the end {machine_load()}")
    name = "compile_time.json" if target == "x86" else f"compile_time_{target.replace(':', '_')}.json"
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "w") as f:
        json.dump({"target": target, "runs": runs, "median_ms": table, **columns}, f, indent=1)


if __name__ == "__main__":
    main()
