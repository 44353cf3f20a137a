"""A BERT-base encoder layer (hidden 768, 12 heads, FFN 3072, f32) on a CUDA GPU: disc_stablehlo
against torch eager, torch.compile(dynamic=True), jax.jit (a compilation per shape) and jax.jit
over padded buckets, over the same weights, TF32 off for everyone.

    python benchmarks/gpu/encoder_layer.py prepare DIR     # here: compile for cuda, save the artifact
    python benchmarks/gpu/encoder_layer.py run DIR         # on the GPU machine (no MLIR there)
    python benchmarks/gpu/encoder_layer.py run DIR --torch-only   # steady state against the torch peers alone

`run` times each peer alike, inputs already on the GPU in the peer's own arrays (CUDA tensors for
the torch peers and disc_stablehlo, JAX arrays for the JAX peers and for disc_stablehlo called
with them), results on the GPU in the same kind: steady state at three shapes (median of 20
calls after 5 warm-up calls, the same for every peer; CUDA events for the peers on torch's
stream, and wall clock from a synchronised start to a synchronised end for everyone), and a
150-request trace of random (batch, seq) end to end, every compilation included
(disc_stablehlo's happened once, in `prepare`: its time is printed there and added to its trace
total, and a second total has the load of the saved artifact instead, as a deployment or the
compile cache would; a peer still at it after TRACE_LIMIT_S is stopped, its total a lower bound). Prints a
JSON summary line last."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN, HEADS, FFN = 768, 12, 3072
SHAPES = [(1, 32), (8, 128), (16, 256)]
TRACE_LIMIT_S = 40.0  # a peer still serving the trace after this long is stopped there


def prepare(folder: Path) -> None:
    import jax

    import disc_stablehlo as disc
    from encoder import encoder_layer, encoder_params, encoder_specs

    params = encoder_params(0, HIDDEN, FFN)
    start = time.perf_counter()
    f = disc.compile(lambda x, m, p: encoder_layer(x, m, p, HEADS), *encoder_specs(params), target="cuda")
    seconds = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    f.save(folder / "encoder.disc")
    order = [k for k, _ in sorted(params.items())]  # the order of the flat arguments after x and mask (a dict's leaves)
    assert len(jax.tree_util.tree_leaves(params)) == len(order)
    (folder / "encoder.json").write_text(json.dumps({"compile_s": seconds, "order": order, "kernels": [str(k) for k in f.kernels]}))
    print(f"compiled for cuda in {seconds:.2f} s: {len(f.kernels)} kernels")


def _time(call, reps: int, warm: int) -> float:
    import torch

    for _ in range(warm):
        call()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def _wall(call, reps: int, warm: int) -> float:
    """Median ms of `call` from a synchronised start to its synchronised end (`call` waits)."""
    for _ in range(warm):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def _host(call, reps: int, warm: int) -> float:
    """Median ms until `call` returns, its work then waited for outside the timing: the host's
    share of a call (a call that waits for the GPU inside takes as long as its work)."""
    import torch

    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return float(np.median(times))


def _bucket(n: int, sizes: list[int]) -> int:
    return next(s for s in sizes if s >= n)


def run(folder: Path, torch_only: bool = False) -> None:
    """`torch_only`: the steady state of disc_stablehlo and the torch peers alone (no trace, no
    JAX: XLA's compilations take a GPU run past a short lease)."""
    import jax
    import torch

    import disc_stablehlo as disc
    from encoder import encoder_inputs, encoder_layer, encoder_params, torch_encoder

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 in JAX's GEMMs either
    meta = json.loads((folder / "encoder.json").read_text())
    params = encoder_params(0, HIDDEN, FFN)  # the weights `prepare` compiled with, made again from the seed
    dev = torch.device("cuda")
    weights = [torch.from_numpy(params[k]).to(dev) for k in meta["order"]]
    jax_params = jax.device_put(params, jax.devices("gpu")[0])
    jax_weights = [jax_params[k] for k in meta["order"]]
    start = time.perf_counter()
    f = disc.load(folder / "encoder.disc")
    load_s = time.perf_counter() - start
    eager = torch_encoder(params, HEADS, "cuda")
    compiled = torch.compile(torch_encoder(params, HEADS, "cuda"), dynamic=True)
    jitted = jax.jit(lambda x, m, p: encoder_layer(x, m, p, HEADS))

    def buckets(x, m):  # batch padded to a power of two, seq to a multiple of 64; padded keys masked out
        b, s = x.shape[:2]
        pb, ps = _bucket(b, [1, 2, 4, 8, 16]), _bucket(s, [64, 128, 192, 256])
        xp = jax.numpy.pad(x, ((0, pb - b), (0, ps - s), (0, 0)))
        mp = jax.numpy.pad(m, ((0, pb - b), (0, ps - s)), constant_values=-1e9)
        return jitted(xp, mp, jax_params)[:b, :s]

    torch_peers = {"disc_stablehlo": lambda x, m: f(x, m, *weights), "torch eager": eager, "torch.compile": compiled}
    jax_peers = {"disc_stablehlo (jax arrays)": lambda x, m: f(x, m, *jax_weights),
                 "jax.jit": lambda x, m: jitted(x, m, jax_params), "jax.jit buckets": buckets}
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, jax {jax.__version__}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    print("disc_stablehlo's kernels: " + "; ".join(meta["kernels"]), flush=True)

    def inputs(b: int, s: int, kind: str):
        x, m = encoder_inputs(b, s, hidden=HIDDEN)
        if kind == "jax":
            return jax.device_put(x, jax.devices("gpu")[0]), jax.device_put(m, jax.devices("gpu")[0])
        return torch.from_numpy(x).to(dev), torch.from_numpy(m).to(dev)

    def waited(peer, kind):  # the call, then its work done
        if kind == "jax":
            return lambda x, m: jax.block_until_ready(peer(x, m))
        return lambda x, m: (peer(x, m), torch.cuda.synchronize())

    # end to end over a trace (first: torch.compile's and jax.jit's compilations happen here)
    rng = np.random.default_rng(0)
    trace = [(int(rng.integers(1, 17)), int(rng.integers(8, 257))) for _ in range(150)]
    data = {kind: [inputs(b, s, kind) for b, s in trace] for kind in ("torch", "jax")}
    peers = {**{n: (p, "torch") for n, p in torch_peers.items()}, **({} if torch_only else {n: (p, "jax") for n, p in jax_peers.items()})}
    totals, served = {}, {}
    with torch.no_grad():
        for name, (peer, kind) in ({} if torch_only else peers).items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for done, (x, m) in enumerate(data[kind], 1):
                out = peer(x, m)
                if time.perf_counter() - start > TRACE_LIMIT_S:  # a peer this slow is stopped: its total is a lower bound
                    break
            jax.block_until_ready(out) if kind == "jax" else torch.cuda.synchronize()
            totals[name] = time.perf_counter() - start
            served[name] = done
            stopped = f" (stopped after {done} of {len(trace)} requests: more than this)" if done < len(trace) else ""
            if name.startswith("disc_stablehlo"):  # its compilation, or the artifact's load (a deployment's, or a cache's)
                totals[f"{name}, artifact loaded"] = totals[name] + load_s
                totals[name] += meta["compile_s"]
                print(f"trace {name}: {totals[name]:.3f} s end to end with its compilation ({meta['compile_s']:.2f} s), "
                      f"{totals[name + ', artifact loaded']:.3f} s with the artifact's load ({load_s:.3f} s) instead", flush=True)
            else:
                print(f"trace {name}: {totals[name]:.3f} s end to end{stopped}", flush=True)
        x, m = inputs(4, 100, "torch")
        diff = float((torch_peers["disc_stablehlo"](x, m) - eager(x, m)).abs().max())
        diff_jax = None
        if not torch_only:
            xj, mj = inputs(4, 100, "jax")
            diff_jax = float(jax.numpy.abs(jax_peers["disc_stablehlo (jax arrays)"](xj, mj) - jax_peers["jax.jit"](xj, mj)).max())
        print(f"max |disc - eager| at (4, 100): {diff:.2e}; max |disc - jax.jit| with jax arrays: {diff_jax}", flush=True)
        steady, steady_wall, host = {}, {}, {}
        for b, s in SHAPES:
            x, m = inputs(b, s, "torch")
            xj, mj = inputs(b, s, "jax")
            steady[f"{b}x{s}"] = {name: _time(lambda p=peer: p(x, m), 20, 5) for name, peer in torch_peers.items()}
            host[f"{b}x{s}"] = {name: _host(lambda p=peer: p(x, m), 20, 5) for name, peer in torch_peers.items()}
            steady_wall[f"{b}x{s}"] = {name: _wall(lambda p=waited(peer, kind), a=(x, m) if kind == "torch" else (xj, mj): p(*a), 20, 5)
                                       for name, (peer, kind) in peers.items()}
            print(f"steady ({b}, {s}), CUDA events: " + ", ".join(f"{n} {t:.3f} ms" for n, t in steady[f'{b}x{s}'].items()), flush=True)
            print(f"steady ({b}, {s}), wall clock: " + ", ".join(f"{n} {t:.3f} ms" for n, t in steady_wall[f'{b}x{s}'].items()),
                  flush=True)
            print(f"steady ({b}, {s}), host time until a call returns: " + ", ".join(
                f"{n} {t:.3f} ms" for n, t in host[f'{b}x{s}'].items()), flush=True)
        # where the time goes at the two larger shapes, ours against torch.compile's: every kernel
        # (ours, Triton's and cuBLAS's), by CUPTI, over 5 calls
        for b, s in SHAPES[1:]:
            x, m = inputs(b, s, "torch")
            for name in ("disc_stablehlo", "torch.compile"):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        torch_peers[name](x, m)
                    torch.cuda.synchronize()
                print(f"kernels of 5 calls of {name} at ({b}, {s}):", flush=True)
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60), flush=True)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "trace_s": totals, "trace_requests": served, "steady_ms": steady,
                      "steady_wall_ms": steady_wall, "host_ms": host, "max_diff": diff, "max_diff_jax": diff_jax,
                      "disc_compile_s": meta["compile_s"], "disc_kernels": len(meta["kernels"])}))


if __name__ == "__main__":
    cmd, folder = sys.argv[1], Path(sys.argv[2])
    prepare(folder) if cmd == "prepare" else run(folder, torch_only="--torch-only" in sys.argv[3:])
