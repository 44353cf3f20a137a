"""Compile time against parameter count (PyTorch MLPs of 1M to 100M parameters), with a cold
worker (a fresh process's first compilation: the worker starts) and a warm one (a second
compilation in the same process); then the artifact's size, its load time in a fresh process
and that process's first call. Writes benchmarks/compile_scaling.json.

    python benchmarks/compile_scaling.py [--sizes 1e6,1e7,1e8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

COMPILE = """
import json, sys, time
import torch
from torch.export import Dim
import disc_stablehlo as disc
width, path = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
def mlp():
    return torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]).eval()
x = torch.randn(2, width)
times = []
for model in (mlp(), mlp()):  # the first compilation starts the worker, the second finds it warm
    start = time.perf_counter()
    f = disc.compile(model, (x,), dynamic_shapes={"input": {0: Dim("batch")}})
    times.append(time.perf_counter() - start)
f.save(path)
with torch.no_grad():
    ok = bool(torch.allclose(f(x), model(x), rtol=1e-3, atol=1e-4))
print(json.dumps({"cold_s": times[0], "warm_s": times[1], "params": sum(p.numel() for p in model.parameters()), "ok": ok}))
"""

LOAD = """
import json, sys, time
start = time.perf_counter()
import numpy as np
import disc_stablehlo as disc
imported = time.perf_counter()
f = disc.load(sys.argv[1])
loaded = time.perf_counter()
x = np.ones((2, int(sys.argv[2])), np.float32)
f(x)
first = time.perf_counter()
f(x)
second = time.perf_counter()
print(json.dumps({"import_s": imported - start, "load_s": loaded - imported, "first_call_s": first - loaded,
                  "second_call_s": second - first}))
"""


def _run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1e6,1e7,1e8", help="parameter counts (4 layers of width x width)")
    ns = parser.parse_args()
    rows = []
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"machine load (1 min average) at the start: {load}; {os.cpu_count()} cores")
    print(f"{'params':>12} {'cold s':>8} {'warm s':>8} {'artifact MB':>12} {'load s':>8} {'1st call ms':>12} {'2nd call ms':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in (float(s) for s in ns.sizes.split(",")):
            width = int((size / 4) ** 0.5)
            path = os.path.join(tmp, f"mlp{width}.disc")
            c = _run(COMPILE, str(width), path)
            assert c["ok"], "compiled MLP differs from eager"
            ld = _run(LOAD, path, str(width))
            row = {"width": width, **c, "artifact_bytes": os.path.getsize(path), **ld}
            rows.append(row)
            print(f"{c['params']:>12} {c['cold_s']:>8.2f} {c['warm_s']:>8.2f} {row['artifact_bytes'] / 1e6:>12.1f} "
                  f"{ld['load_s']:>8.3f} {ld['first_call_s'] * 1e3:>12.2f} {ld['second_call_s'] * 1e3:>12.2f}")
    with open(os.path.join(HERE, "compile_scaling.json"), "w") as f:
        json.dump({"machine_load": load, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
