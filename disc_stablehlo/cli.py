"""The `disc-stablehlo` command: compile, run, bench and inspect artifacts from a shell."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from typing import Any, Sequence

import numpy as np

from .runtime import read_npz, write_npz

EXAMPLES = """examples:
  disc-stablehlo compile model.mlir -o model.disc                      # StableHLO text or bytecode
  disc-stablehlo compile mypkg.models:encoder --arg b,s,256:f32 --arg 256,256:f32 -o enc.disc
  disc-stablehlo compile exported.pt2 -o model.disc                    # torch.export.save(...) output
  disc-stablehlo run model.disc inputs.npz -o outputs.npz              # or one .npy per input
  disc-stablehlo bench model.disc --dims b=1,s=32 --dims b=16,s=256
  disc-stablehlo inspect model.disc
"""


def _jax_source(target: str, args: Sequence[str]) -> Any:
    """`module:function` with `--arg` specs (`b,s,256:f32`: dims, names for symbolic ones)."""
    import jax
    from jax import export

    from .bounded_dynamism.signature import ELEMENT_TYPES

    module_name, _, attr = target.partition(":")
    sys.path.insert(0, os.getcwd())
    fn = getattr(importlib.import_module(module_name), attr)
    names = sorted({d for a in args for d in a.split(":")[0].split(",") if not d.strip().isdigit()})
    symbols = dict(zip(names, export.symbolic_shape(",".join(names)))) if names else {}
    specs = []
    for a in args:
        dims, _, dtype = a.partition(":")
        if dtype not in ELEMENT_TYPES:
            raise SystemExit(f"--arg {a}: element type '{dtype}' is not one of {', '.join(ELEMENT_TYPES)}")
        shape = tuple(int(d) if d.strip().isdigit() else symbols[d.strip()] for d in dims.split(",") if d.strip())
        specs.append(jax.ShapeDtypeStruct(shape, ELEMENT_TYPES[dtype]))
    return fn, specs


def _compile(ns: argparse.Namespace) -> int:
    from . import compiler

    frontends = importlib.import_module(f"{__package__}.import")
    start = time.perf_counter()

    def progress(stage: str) -> None:  # a stage starts: the time since the start of the compilation
        if not ns.quiet:
            print(f"  {time.perf_counter() - start:7.2f}s  {stage}", file=sys.stderr, flush=True)

    if ns.input.endswith(".pt2"):
        import torch

        source, binding = frontends.export(torch.export.load(ns.input))
    elif ":" in ns.input and not os.path.exists(ns.input):
        fn, specs = _jax_source(ns.input, ns.arg)
        source, binding = frontends.export(fn, *specs)
    else:
        with open(ns.input, "rb") as f:
            data = f.read()
        try:
            text: str | bytes = data.decode()
        except UnicodeDecodeError:
            text = data
        source, binding = frontends.export(text)
    f = compiler.compile_source(source, binding, ns.constraint, ns.target, progress=progress)
    f.save(ns.output)
    print(f"wrote {ns.output} ({os.path.getsize(ns.output)} bytes) in {time.perf_counter() - start:.2f}s", file=sys.stderr)
    return 0


def _inputs(paths: Sequence[str]) -> list[np.ndarray]:
    if len(paths) == 1 and paths[0].endswith(".npz"):
        return read_npz(paths[0])
    return [np.load(p) for p in paths]


def _run(ns: argparse.Namespace) -> int:
    from . import load

    f = load(ns.artifact)
    outs = f(*_inputs(ns.inputs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    write_npz(ns.output, f, outs)
    for spec, o in zip(f.signature.results, outs):
        print(f"{spec.name}: {o.dtype.name}{list(o.shape)}")
    return 0


def _random_inputs(f: Any, dims: dict[str, int], rng: np.random.Generator) -> list[np.ndarray]:
    arrays = []
    for spec in f.signature.args:
        missing = [d for d in spec.shape if isinstance(d, str) and d not in dims]
        if missing:
            raise SystemExit(f"--dims does not give {', '.join(missing)} (argument '{spec.name}' is {spec.describe()})")
        shape = tuple(dims[d] if isinstance(d, str) else d for d in spec.shape)
        if spec.dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(spec.dtype))
        elif spec.dtype.kind == "c":
            arrays.append((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(spec.dtype))
        elif spec.dtype.kind == "b":
            arrays.append(rng.random(shape) < 0.5)
        else:
            arrays.append(rng.integers(0, 8, shape).astype(spec.dtype))
    return arrays


def _bench(ns: argparse.Namespace) -> int:
    from . import DiscError, load

    f = load(ns.artifact)
    rng = np.random.default_rng(0)
    print(f"{'dims':<28} {'median ms':>10} {'min ms':>10}")
    for text in ns.dims or [""]:
        dims = {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(",") if item.strip())}
        args = _random_inputs(f, dims, rng)
        try:
            for _ in range(ns.warmup):
                f(*args)
            times = []
            for _ in range(ns.repeat):
                t = time.perf_counter()
                f(*args)
                times.append((time.perf_counter() - t) * 1e3)
        except DiscError as e:
            print(f"{text:<28} {type(e).__name__}: {e}")
            continue
        print(f"{text:<28} {np.median(times):>10.3f} {min(times):>10.3f}")
    return 0


def _inspect(ns: argparse.Namespace) -> int:
    from .artifact import read

    art = read(ns.artifact)
    h = art.header
    t = h["target"]
    print(f"artifact {ns.artifact}: {os.path.getsize(ns.artifact)} bytes, package {h['package_version']}")
    device = f", kernels for {t['chip']} ({t['device_triple']})" if "chip" in t else ""
    print(f"target: {t['name']} {t['triple']} ({t['cpu']}; needs {', '.join(t['cpu_flags']) or 'nothing special'}){device}")
    sig = art.signature
    print("inputs:\n" + "".join(f"  {a.name}: {a.describe()}\n" for a in sig.args), end="")
    print("outputs:\n" + "".join(f"  {r.name}: {r.describe()}  = {' x '.join(dims) or 'scalar'}\n"
                                for r, dims in zip(sig.results, h["info"]["symbolic_result_shapes"])), end="")
    checks = [re.sub(r"\{\d+\}", "?", a.message) for a in art.assertions]
    print("checked before any kernel runs:\n" + "".join(f"  {c}\n" for c in checks) if checks else "no run-time shape checks\n", end="")
    nbytes = sum(p["nbytes"] for p in h["params"])
    print(f"parameters: {len(h['params'])} ({nbytes} bytes)")
    print(f"shared object: {h['sections']['object'][1]} bytes")
    print(f"kernels ({len(art.kernels)}):\n" + "".join(f"  {k}\n" for k in art.kernels), end="")
    if h["info"]["library_calls"]:
        print(f"library calls: {', '.join(h['info']['library_calls'])}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="disc-stablehlo", description="Compile once, run at every shape.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a model into a .disc artifact", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("input", help="StableHLO (.mlir text or bytecode), a JAX module:function, or a torch.export .pt2 file")
    c.add_argument("-o", "--output", required=True, help="the artifact to write")
    c.add_argument("--arg", action="append", default=[], help="JAX argument spec: dims (names for symbolic ones) and type, b,s,256:f32")
    c.add_argument("--constraint", action="append", default=[], help='a fact over the dims, checked at run time ("s >= 8")')
    c.add_argument("--target", default=None, help="code generation target: x86 (the default, or $DISC_TARGET), cuda[:sm_XX] "
                   "(rocm[:gfxNNN] is recognised, not generated yet)")
    c.add_argument("-q", "--quiet", action="store_true", help="no stage timings")
    r = sub.add_parser("run", help="run an artifact on .npy/.npz inputs")
    r.add_argument("artifact")
    r.add_argument("inputs", nargs="+", help="one .npz (arrays in argument order) or one .npy per argument")
    r.add_argument("-o", "--output", default="outputs.npz", help="where the results go (.npz)")
    b = sub.add_parser("bench", help="latency per shape on random inputs")
    b.add_argument("artifact")
    b.add_argument("--dims", action="append", help="values of the dimension variables, b=1,s=32 (repeat for several shapes)")
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--repeat", type=int, default=20)
    i = sub.add_parser("inspect", help="signature, checks, parameters and kernels of an artifact")
    i.add_argument("artifact")
    ns = parser.parse_args(argv)
    from .errors import DiscError

    try:
        return {"compile": _compile, "run": _run, "bench": _bench, "inspect": _inspect}[ns.command](ns)
    except DiscError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
