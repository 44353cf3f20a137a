"""The persistent compile cache (DISC_CACHE_DIR): a second process loads instead of compiling; kernels
are compiled once per structure, across functions and processes."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import numpy as np
import disc_stablehlo as disc
f = disc.compile('''func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %0 = stablehlo.tanh %x : tensor<?x8xf32>
  return %0 : tensor<?x8xf32> }''', constraints=CONSTRAINTS)
x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
assert np.allclose(f(x), np.tanh(x), atol=1e-6)
from disc_stablehlo import worker
print(worker._worker is not None, f.compile_count)
"""


def _run(cache: str, constraints: list[str]) -> tuple[bool, int]:
    """(whether the process started a compiler worker, the function's compile_count)."""
    env = dict(os.environ, DISC_CACHE_DIR=cache)
    proc = subprocess.run([sys.executable, "-c", SCRIPT.replace("CONSTRAINTS", repr(constraints))],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    started, count = proc.stdout.strip().splitlines()[-1].split()
    return started == "True", int(count)


def _entries(cache) -> list[str]:
    """The artifacts' and requests' entries (not the kernels' folder)."""
    return sorted(e.rsplit(".", 1)[1] for e in os.listdir(cache) if e != "kernels")


def test_second_process_loads_from_the_cache_without_a_worker(tmp_path):
    """A later process that sends the same request finds the artifact by the request's key
    (the `.source` entry beside it) and starts no compiler worker."""
    assert _run(str(tmp_path), []) == (True, 1)
    assert _run(str(tmp_path), []) == (False, 0)
    assert _run(str(tmp_path), ["arg0.0 >= 2"]) == (True, 1)  # other constraints: another entry
    assert _entries(tmp_path) == ["disc", "disc", "source", "source"]


def test_a_request_whose_artifact_is_gone_compiles_again(tmp_path):
    assert _run(str(tmp_path), []) == (True, 1)
    for e in os.listdir(tmp_path):
        if e.endswith(".disc"):
            os.unlink(tmp_path / e)
    assert _run(str(tmp_path), []) == (True, 1)
    assert _run(str(tmp_path), []) == (False, 0)


def test_cache_folder_is_created(tmp_path):
    cache = tmp_path / "not" / "there" / "yet"
    assert _run(str(cache), []) == (True, 1)
    assert _run(str(cache), []) == (False, 0)


def test_modules_that_differ_only_in_locations_share_an_entry(tmp_path, monkeypatch):
    """JAX records the caller's stack in the module's locations (the same model exported from a
    service's warm-up and from its request path differs only there); the cache key leaves
    locations out, so the second finds the first's entry."""
    import numpy as np

    import disc_stablehlo as disc

    text = """func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
      %0 = stablehlo.tanh %x : tensor<?x8xf32> loc(LOC)
      return %0 : tensor<?x8xf32>
    }"""
    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    first = disc.compile(text.replace("LOC", '"service.py":12:4'))
    second = disc.compile(text.replace("LOC", '"service.py":30:8'))
    assert (first.compile_count, second.compile_count) == (1, 0)
    x = np.linspace(-1, 1, 40, dtype=np.float32).reshape(5, 8)
    np.testing.assert_allclose(second(x), np.tanh(x), rtol=1e-6)


def test_threads_compiling_one_request_at_once_leave_one_entry(tmp_path, monkeypatch):
    import threading

    import disc_stablehlo as disc

    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    text = """func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
      %0 = stablehlo.exponential %x : tensor<?x8xf32>
      return %0 : tensor<?x8xf32> }"""
    errors: list[BaseException] = []

    def compile_once():
        try:
            disc.compile(text)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)
    threads = [threading.Thread(target=compile_once) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _entries(tmp_path) == ["disc", "source"]


def _layer(x, w1, b1, w3):
    import jax
    import jax.numpy as jnp

    return jnp.tanh(jax.nn.gelu(x @ w1 + b1, approximate=False) @ w3)


def _two_layers(x, w1, b1, w2, b2, w3):
    import jax

    return _layer(jax.nn.gelu(x @ w1 + b1, approximate=False), w2, b2, w3)


def _specs(count: int) -> list:
    import jax
    import jax.numpy as jnp
    from jax import export

    n, = export.symbolic_shape("n")
    mat, vec = jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32)
    return [jax.ShapeDtypeStruct((n, 64), jnp.float32), *[mat, vec] * count, mat]


def test_kernels_compile_once_per_structure_across_functions_and_processes(tmp_path, monkeypatch):
    """A function whose kernels another function had (the same loops: a layer of a stack compiled
    alone) generates code for its host code only; with DISC_CACHE_DIR the kernels' objects outlive
    the process (here: this process's cache emptied), and a damaged one is compiled again. The
    functions compute what JAX does, and each kernel's counters are found under its own name."""
    import jax
    import numpy as np

    import disc_stablehlo as disc
    from disc_stablehlo.targets import codegen

    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # code generation in this process, to be watched
    monkeypatch.setenv("DISC_COMPILE_HELPER", "0")
    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(codegen, "kernel_cache", codegen.KernelCache())
    kernel_parts, plain = [], codegen.compile_part

    def watched(text, spec, elsewhere=False):
        if elsewhere:
            kernel_parts.append(text)
        return plain(text, spec, elsewhere)

    monkeypatch.setattr(codegen, "compile_part", watched)
    rng = np.random.default_rng(0)
    x, w1, b1, w2, b2, w3 = (rng.standard_normal(s).astype(np.float32) / 8 for s in [(300, 64), (64, 64), (64,), (64, 64), (64,), (64, 64)])
    stack = disc.compile(_two_layers, *_specs(2))
    assert len(kernel_parts) == len({k.name for k in stack.kernels}) == 2  # the GELU loop (twice) and the tanh
    kernel_parts.clear()
    layer = disc.compile(_layer, *_specs(1))
    assert kernel_parts == [] and len(layer.kernels) == 2
    np.testing.assert_allclose(layer(x, w1, b1, w3), jax.jit(_layer)(x, w1, b1, w3), rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(stack(x, w1, b1, w2, b2, w3), jax.jit(_two_layers)(x, w1, b1, w2, b2, w3), rtol=2e-4, atol=2e-5)
    before = layer.stats()  # (conftest has the counters on)
    layer(x, w1, b1, w3)
    assert all(layer.stats()[k.name]["calls"] == before[k.name]["calls"] + 1 for k in layer.kernels)
    files = sorted((tmp_path / "kernels").iterdir())
    assert len(files) == 2
    # a later process: nothing in memory, the objects on disk (another constraint: not the same artifact)
    monkeypatch.setattr(codegen, "kernel_cache", codegen.KernelCache())
    again = disc.compile(_layer, *_specs(1), constraints=["n >= 2"])
    assert kernel_parts == [] and again.compile_count == 1
    np.testing.assert_allclose(again(x, w1, b1, w3), layer(x, w1, b1, w3), rtol=1e-6)
    for path in files:  # damaged: compiled again, and replaced
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    monkeypatch.setattr(codegen, "kernel_cache", codegen.KernelCache())
    damaged = disc.compile(_layer, *_specs(1), constraints=["n >= 3"])
    assert len(kernel_parts) == 2
    np.testing.assert_allclose(damaged(x, w1, b1, w3), layer(x, w1, b1, w3), rtol=1e-6)
    assert all(codegen.kernel_cache.get(p.stem) is not None for p in files)


_MODULE = """@MSG = internal constant [9 x i8] c"#1 !2 @k\\00"
declare float @llvm.exp.f32(float) #ATTR
declare void @other(ptr)
define void @NAME(ptr %0, i64 %1) {
  br label %3
3:
  %4 = phi i64 [ 0, %2 ], [ %7, %3 ]
  %5 = load float, ptr %0, align 4
  %6 = call float @llvm.exp.f32(float %5)
  store float %6, ptr %0, align 4
  call void @other(ptr @MSG)
  %7 = add i64 %4, CONSTANT
  %8 = icmp slt i64 %7, %1
  br i1 %8, label %3, label %9, !llvm.loop !LOOP
9:
  ret void
}
define void @main() {
  call void @NAME(ptr null, i64 4)
  ret void
}
attributes #ATTR = { nounwind }
!llvm.module.flags = !{!0}
!0 = !{i32 2, !"Debug Info Version", i32 3}
!LOOP = distinct !{!LOOP, !INTERLEAVE}
!INTERLEAVE = !{!"llvm.loop.interleave.count", i32 4}
"""


def _kernel_module(name: str, attr: int, loop: int, constant: int = 1, message: str = "msg") -> str:
    return (_MODULE.replace("NAME", name).replace("MSG", message).replace("#ATTR", f"#{attr}").replace("!LOOP", f"!{loop}")
            .replace("!INTERLEAVE", f"!{loop + 1}").replace("CONSTANT", str(constant)))


def test_a_kernel_is_named_by_its_structure():
    """A kernel's part holds the kernel and what it refers to (a global, declarations, its loop's
    metadata, attribute groups), numbered in the order they appear: the same loop under another
    name in another module (other numbers for its attributes and metadata, another name for its
    internal global, as a GPU kernel's shared memory is named after the kernel) has the same symbol
    and text; another constant, another symbol. Strings keep their text, and the part compiles alone."""
    import llvmlite.binding as llvm

    from disc_stablehlo.targets import codegen

    symbol, text = codegen.Functions(_kernel_module("k1", 0, 1)).kernel("k1")
    assert codegen.Functions(_kernel_module("__disc_par_7", 3, 5, message="msg_of_7")).kernel("__disc_par_7") == (symbol, text)
    assert f"@{symbol}$0 = internal constant" in text and "@msg" not in text
    other, _ = codegen.Functions(_kernel_module("k1", 0, 1, constant=2)).kernel("k1")
    assert symbol.startswith(codegen.KERNEL_STEM) and other != symbol
    assert 'c"#1 !2 @k' in text and "@main" not in text and "@k1" not in text
    mod = llvm.parse_assembly(text)
    mod.verify()
    assert [f.name for f in mod.functions if not f.is_declaration] == [symbol]


def test_with_a_cache_the_worker_loads_during_the_export_and_a_hit_ends_the_one_it_started(tmp_path, monkeypatch):
    """With DISC_CACHE_DIR the worker still starts (MLIR, LLVM and the importer loading) while the
    frontend exports, so a miss does not wait for it after the export; a hit ends the worker its
    own call started (a process whose compilations all hit keeps none), and keeps one that was
    already running."""
    import numpy as np

    import disc_stablehlo as disc
    from disc_stablehlo import worker

    frontends = __import__("disc_stablehlo.import", fromlist=["export"])
    events, prepare, export = [], worker.prepare, frontends.export

    def prepared(modules):
        events.append("prepare")
        started = prepare(modules)
        events.append(started)
        return started

    def exported(*args, **kwargs):
        events.append("export")
        return export(*args, **kwargs)

    monkeypatch.setattr(worker, "prepare", prepared)
    monkeypatch.setattr(frontends, "export", exported)
    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(worker, "_worker", None)  # this test's own workers (the suite's is restored after)
    text = """func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
      %0 = stablehlo.sine %x : tensor<?x8xf32>
      return %0 : tensor<?x8xf32> }"""
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    first = disc.compile(text)  # a miss: compiled by the worker started before the export
    started = events[1]
    assert events[0] == "prepare" and events[2] == "export" and started is not None
    assert first.compile_count == 1 and worker._worker is started and started.used
    assert disc.compile(text).compile_count == 0 and worker._worker is started  # a hit: the running worker stays
    events.clear()
    monkeypatch.setattr(worker, "_worker", None)  # as a fresh process: its call starts a worker, and the cache answers
    again = disc.compile(text)
    ended = events[1]
    assert again.compile_count == 0 and ended is not None and worker._worker is None
    assert ended.retired and ended.proc.poll() is not None
    np.testing.assert_allclose(again(x), np.sin(x), rtol=1e-6)
    started.close()


def test_a_pytorch_model_exported_again_has_the_same_request_key():
    """The request key of a PyTorch model (its saved program) is the same for every export of the
    same model, so a later process finds its artifact without the worker: torch names the
    archive's folder after the (temporary) file, draws a serialization id per save and records ids
    of its graph objects as provenance, and the held-back weights' stand-ins are saved with their
    one element. New weights give another key."""
    import dataclasses

    import torch

    from disc_stablehlo import cache
    from disc_stablehlo.compiler import _digest

    frontends = __import__("disc_stablehlo.import", fromlist=["export"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()).eval()
    x = torch.randn(3, 64)
    dims = {"input": {0: torch.export.Dim("b", max=64)}}

    def key() -> str:
        source, binding = frontends.export(model, (x,), dynamic_shapes=dims)
        try:
            source = dataclasses.replace(source, weights_digest=_digest(source.weights))  # as compile_source does with a cache
            return cache.source_key(source, binding.to_json(), (), "x86", True)
        finally:
            os.unlink(source.payload)
    first = key()
    assert key() == first
    with torch.no_grad():
        model[0].weight.mul_(2)
    assert key() != first
