"""`compile`: the frontend exports here, the compiler worker builds the artifact, and it is loaded
here as the callable a user gets."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from . import artifact, cache, worker
from .runtime import Binding, CompiledFunction, Executable, default_runtime


def compile(fn: Any, *specs: Any, constraints: Sequence[str] = (), dynamic_shapes: Any = None, target: str | None = None,
            buffer_reuse: bool = True) -> CompiledFunction:
    """Compiles `fn` once for every shape its signature admits.

    `fn` is a JAX function (with `jax.ShapeDtypeStruct` specs whose dims may be symbolic, from
    `jax.export.symbolic_shape`), a `jax.export.Exported`, or a StableHLO module as text, MLIR
    bytecode or a portable artifact, or a `torch.nn.Module` (or a function of torch tensors) with example inputs (a tuple of
    positional arguments, or those one by one, or a dict of keyword arguments) and `dynamic_shapes=` in `torch.export`
    conventions (or a `torch.export.ExportedProgram`).

    `constraints` are facts over the dimension variables (`"s >= 8"`, `"mod(s, 8) == 0"`,
    `"b <= 64"`, `"s == 2*t"`; a StableHLO module's unnamed dims are `arg0.1` for argument 0,
    dim 1): the compiler may rely on them, and every call checks them before any kernel runs.
    `buffer_reuse=False` keeps every temporary until the call returns (for measuring what freeing
    buffers after their last use saves). `target`: "x86" (the host's processor), "cuda" or
    "cuda:<sm_XX>" (docs/gpu.md); default $DISC_TARGET, else "x86". `DISC_LOG=shapes` prints the
    shape report after compiling, `DISC_LOG=compile` the time of each stage (`compile_seconds`)."""
    frontends = importlib.import_module(f"{__package__}.import")
    # MLIR, LLVM and the importer load while the frontend exports (a worker started here for a
    # request the cache then answers is ended: `compile_source`)
    started = worker.prepare(frontends.importer_modules(fn, *specs))
    start = time.perf_counter()
    source, binding = frontends.export(fn, *specs, **({"dynamic_shapes": dynamic_shapes} if dynamic_shapes is not None else {}))
    return compile_source(source, binding, constraints, target, buffer_reuse, export_seconds=time.perf_counter() - start,
                          prepared=started)


def compile_source(source: Any, binding: Binding, constraints: Sequence[str] = (), target: str | None = None,
                   buffer_reuse: bool = True, progress: Callable[[str], None] | None = None,
                   export_seconds: float | None = None, prepared: worker.Worker | None = None) -> CompiledFunction:
    """The stages after the frontend's export (for frontends called from elsewhere, e.g. the
    dynamo backend): compiled by the worker, loaded here.

    With `DISC_CACHE_DIR` set, artifacts are kept there, keyed by the imported module, the
    constraints and options, the target, the package version and sources and the RAL build: a
    later process loads the artifact instead of generating code (its `compile_count` is 0), and
    one that exports the same bytes with the same options loads it without the compiler worker
    (`cache.py`): `prepared`, a worker `compile` started while the frontend exported, is ended.
    `progress` is told the name of each stage as it starts. The result's `compile_seconds` holds
    the seconds each stage took (`export_seconds`: the frontend's export, when the caller timed
    it); `DISC_LOG=compile` prints them."""
    start = time.perf_counter()
    target = target or os.environ.get("DISC_TARGET", "x86")
    cache_dir = os.environ.get("DISC_CACHE_DIR")
    if source.weights and cache_dir:
        source = dataclasses.replace(source, weights_digest=_digest(source.weights))
    binding_json = binding.to_json()
    key = cache.source_key(source, binding_json, constraints, target, buffer_reuse) if cache_dir else None
    path = cache.lookup(cache_dir, key) if cache_dir else None
    if path is not None:  # this request compiled before: no worker
        if prepared is not None:
            worker.release(prepared)
        if source.kind == "torch":
            os.unlink(source.payload)
        return CompiledFunction(Executable(artifact.read(path, verify=True), default_runtime()), binding, compile_count=0)
    with tempfile.TemporaryDirectory(prefix="disc-") as tmp:
        compiled = worker.compile(source, binding_json, tuple(constraints), target, buffer_reuse,
                                  os.path.join(tmp, "compiled.disc"), progress)
        cached = compiled.partial is None
        if not cached and cache_dir:  # kept: the weights go into the file
            compiled.complete()
        loading = time.perf_counter()
        # mapped: the mapping outlives a temporary file; one just compiled needs no checksum, and
        # without a cache its weights stay in this process's memory until `save` (`Artifact.pending`)
        if cached or cache_dir:
            art = artifact.read(compiled.path, verify=cached)
        else:
            art = artifact.read(compiled.partial, verify=False, pending=compiled.fills)
    if cache_dir:
        cache.record(cache_dir, key, compiled.path)
    f = CompiledFunction(Executable(art, default_runtime()), binding, compile_count=0 if cached else 1)
    if not cached:
        end = time.perf_counter()
        f.compile_seconds = {**({"export": export_seconds} if export_seconds is not None else {}), **compiled.seconds,
                             "loading": end - loading, "total": end - start + (export_seconds or 0.0)}
        if "compile" in os.environ.get("DISC_LOG", "").split(","):
            print("compile time:\n" + "".join(f"  {stage:<48} {s * 1e3:8.1f} ms\n" for stage, s in f.compile_seconds.items()),
                  end="", file=sys.stderr)
    return f


def _digest(arrays: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.reshape(-1).view("u1"))
    return h.hexdigest()
