"""Where a GPU call's host time goes: calls with CUDA tensors back to back, then the same under
cProfile (its figures are inflated by the profiler; their shares are what it tells), for a
single-kernel function (fusion.py's scale_add at (64, 3072), torch eager beside) and for the
encoder layer at (1, 32), on the GPU machine:

    python benchmarks/gpu/call_path.py FUSION_DIR ENCODER_DIR   # folders fusion.py / encoder_layer.py prepared"""

from __future__ import annotations

import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _per_call_us(call, calls: int) -> float:
    import torch

    for _ in range(calls // 10):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _profile(call, calls: int) -> None:
    import torch

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main(fusion: Path, encoder: Path) -> None:
    import torch

    import disc_stablehlo as disc
    from encoder import encoder_inputs, encoder_params

    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    f = disc.load(fusion / "scale_add.disc")
    x, y = torch.randn(64, 3072, device=dev), torch.randn(64, 3072, device=dev)
    print(f"scale_add (64, 3072), CUDA tensors: {_per_call_us(lambda: f(x, y), 1000):.1f} us a call (1000 back to back); "
          f"torch eager {_per_call_us(lambda: x * 1.5 + y, 1000):.1f} us", flush=True)
    _profile(lambda: f(x, y), 1000)
    meta = json.loads((encoder / "encoder.json").read_text())
    params = encoder_params(0, 768, 3072)
    weights = [torch.from_numpy(params[k]).to(dev) for k in meta["order"]]
    e = disc.load(encoder / "encoder.disc")
    xe, me = (torch.from_numpy(a).to(dev) for a in encoder_inputs(1, 32, hidden=768))
    print(f"encoder layer (1, 32): {_per_call_us(lambda: e(xe, me, *weights), 200):.1f} us a call (200 back to back)", flush=True)
    _profile(lambda: e(xe, me, *weights), 200)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
