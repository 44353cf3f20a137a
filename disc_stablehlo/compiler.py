"""`compile`: frontend -> pipeline -> target -> loaded executable, and the callable a user gets."""

from __future__ import annotations

import hashlib
import importlib
import os
import pickle
import sys
import functools
import tempfile
from importlib.metadata import version
from typing import Any, Sequence

import numpy as np

from .passes.pipeline import LoweredModule, compile_to_llvm
from .runtime import RAL_LIBRARY, Executable, default_runtime, ral_library_dir
from .targets import get_target
from .targets.codegen import start_helper
from .targets.x86 import emit_objects, link_shared_object

frontends = importlib.import_module(f"{__package__}.import")


class CompiledFunction:
    """A function compiled once for every shape its signature admits.

    Call it with numpy arrays (numpy out), JAX arrays (JAX out), torch tensors (torch out) or
    tf.Tensors (tf.Tensor out); results follow the source function's structure (JAX pytrees, TF
    nests) or come as one array / a tuple."""

    def __init__(self, executable: Executable, imported: Any, lowered: LoweredModule, compile_count: int = 1):
        self._exe = executable
        self._imported = imported
        self._shapes = lowered.shapes
        self.signature = executable.signature
        self.llvm_ir = lowered.llvm_ir
        self.kernels = list(lowered.kernels)  # the loop nests (kind, ops inside) run on the RAL thread pool
        self.compile_count = compile_count  # native code generations: 1, or 0 when loaded from the cache

    def __call__(self, *args: Any) -> Any:
        imp = self._imported
        leaves, kind = _flatten(args, imp.in_tree is not None)
        if imp.kept_args is not None:
            if len(leaves) != imp.num_flat_args:
                from .errors import ShapeError

                raise ShapeError(f"expected {imp.num_flat_args} array arguments, got {len(leaves)}")
            leaves = [leaves[i] for i in imp.kept_args]
        outs = self._exe.run([x.detach().cpu().numpy() if kind == "torch" else np.asarray(x) for x in leaves])
        if kind == "jax":
            import jax.numpy as jnp

            outs = [jnp.asarray(o) for o in outs]
        elif kind == "torch":
            import torch

            outs = [torch.from_numpy(o) for o in outs]  # shares the buffer, no copy
        elif kind == "tensorflow":
            import tensorflow as tf

            outs = [tf.convert_to_tensor(o) for o in outs]
        if imp.pack_results is not None:
            return imp.pack_results(outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @property
    def symbolic_result_shapes(self) -> list[tuple[str, ...]]:
        """Each result's dims as expressions over the dimension variables (e.g. ('b', '2*s'))."""
        return [tuple(str(self._shapes.facts.canon(d)) for d in dims) for dims in self._shapes.results]

    def shape_report(self) -> str:
        """Dimension variables, symbolic shapes of arguments, results and intermediates, the
        facts collected, and which broadcasts rely on which fact."""
        return self._shapes.report()

    def memory_stats(self) -> dict[str, int]:
        return self._exe.runtime.memory_stats()

    def stats(self) -> dict[str, dict[str, float]]:
        """Per kernel of this function: calls, how many ran on the thread pool ("pool"), behind
        the row blocks of the GEMM whose epilogue it is ("fused") and inline ("inline": the
        small-size version chosen from the real sizes), and total seconds; plus the library
        GEMM entries (counted over the whole process). Kernels generated in versions
        (`kernels[i].version`) count separately, so the counts say which version ran."""
        from .runtime import kernel_stats, ral, symbol_address

        out = {k.name: kernel_stats(symbol_address(self._exe.lib, k.name)) for k in self.kernels}
        for name in ("disc_ral_gemm_f32", "disc_ral_gemm_f64"):
            if f"@{name}" in self.llvm_ir:  # the plain entry or the one with an epilogue
                out[name] = kernel_stats(symbol_address(ral(), name))
        return out


def _flatten(args: tuple, pytree: bool) -> tuple[list[Any], str]:
    """The array leaves, and which kind of array comes back: 'jax', 'torch' or 'numpy'."""
    if pytree:
        import jax

        leaves = jax.tree_util.tree_leaves(args)
    else:
        leaves = list(args)
    modules = {type(x).__module__.split(".")[0] for x in leaves}
    for kind, names in (("jax", ("jax", "jaxlib")), ("torch", ("torch",)), ("tensorflow", ("tensorflow",))):
        if modules & set(names):
            return leaves, kind
    return leaves, "numpy"


def compile(fn: Any, *specs: Any, constraints: Sequence[str] = (), dynamic_shapes: Any = None, target: str = "x86",
            buffer_reuse: bool = True) -> CompiledFunction:
    """Compiles `fn` once for every shape its signature admits.

    `fn` is a JAX function (with `jax.ShapeDtypeStruct` specs whose dims may be symbolic, from
    `jax.export.symbolic_shape`), a `jax.export.Exported`, or a StableHLO module as text, MLIR
    bytecode or a portable artifact, or a `torch.nn.Module` with example inputs and
    `dynamic_shapes=` in `torch.export` conventions (or a `torch.export.ExportedProgram`).

    `constraints` are facts over the dimension variables (`"s >= 8"`, `"mod(s, 8) == 0"`,
    `"b <= 64"`, `"s == 2*t"`; a StableHLO module's unnamed dims are `arg0.1` for argument 0,
    dim 1): the compiler may rely on them, and every call checks them before any kernel runs.
    `buffer_reuse=False` keeps every temporary until the call returns (for measuring what freeing
    buffers after their last use saves). `DISC_LOG=shapes` prints the shape report after compiling."""
    imported = frontends.load(fn, *specs, **({"dynamic_shapes": dynamic_shapes} if dynamic_shapes is not None else {}))
    return compile_imported(imported, constraints, target, buffer_reuse)


def compile_imported(imported: Any, constraints: Sequence[str] = (), target: str = "x86", buffer_reuse: bool = True) -> CompiledFunction:
    """The stages after the frontend (for frontends called from elsewhere, e.g. the dynamo backend).

    With `DISC_CACHE_DIR` set, compiled functions are kept there, keyed by the imported module,
    the constraints and options, the target, the package version and sources and the RAL build: a later
    process loads the shared object instead of generating code (its `compile_count` is 0)."""
    tgt = get_target(target)
    cache = os.environ.get("DISC_CACHE_DIR")
    if cache:
        os.makedirs(cache, exist_ok=True)
    entry_dir = os.path.join(cache, _cache_key(imported, constraints, tgt, buffer_reuse)) if cache else None
    if entry_dir and os.path.exists(os.path.join(entry_dir, "lowered.pkl")):
        with open(os.path.join(entry_dir, "lowered.pkl"), "rb") as f:
            lowered = pickle.load(f)
        exe = Executable(os.path.join(entry_dir, "compiled.so"), lowered.entry, imported.signature, lowered.assertions, default_runtime(),
                         lowered.params)
        return CompiledFunction(exe, imported, lowered, compile_count=0)
    if _op_count(imported.module) >= HELPER_MIN_OPS:
        start_helper()  # code generation's helper process starts up while the MLIR passes run
    lowered = compile_to_llvm(imported.module, imported.entry, imported.signature, imported.facts, imported.checked,
                              tuple(constraints), buffer_reuse, imported.params)
    if "shapes" in os.environ.get("DISC_LOG", "").split(","):
        print(lowered.shapes.report(), file=sys.stderr)
    objects, libmvec = emit_objects(lowered.llvm_ir, tgt, [k.name for k in lowered.kernels])
    with tempfile.TemporaryDirectory(prefix="disc-", dir=cache) as tmp:
        so_path = os.path.join(tmp, "compiled.so")
        link_shared_object(objects, so_path, ral_library_dir(), libmvec)
        if entry_dir:  # written aside, then renamed: a concurrent process sees all of it or nothing
            with open(os.path.join(tmp, "lowered.pkl"), "wb") as f:
                pickle.dump(lowered, f)
            try:
                os.rename(tmp, entry_dir)
                os.makedirs(tmp)  # for TemporaryDirectory's clean-up
                so_path = os.path.join(entry_dir, "compiled.so")
            except OSError:
                pass  # another process stored the same entry first
        exe = Executable(so_path, lowered.entry, imported.signature, lowered.assertions, default_runtime(),
                         lowered.params)
    return CompiledFunction(exe, imported, lowered)


# modules with fewer ops (in their functions' bodies, not counting nested regions) rarely have
# two kernels worth compiling apart: they leave the helper process unstarted
HELPER_MIN_OPS = 64


def _op_count(module: Any) -> int:
    return sum(len(f.regions[0].blocks[0].operations) for f in module.body.operations
               if len(f.regions) and len(f.regions[0].blocks))


def _cache_key(imported: Any, constraints: Sequence[str], tgt: Any, buffer_reuse: bool) -> str:
    h = hashlib.sha256()
    # without locations: JAX's record the caller's whole stack, so the same function compiled
    # from another call site (a later process, another test) would miss its entry
    for part in (imported.module.operation.get_asm(enable_debug_info=False), imported.entry, repr(imported.signature),
                 repr(imported.facts), repr(imported.checked), repr(tuple(constraints)), repr(buffer_reuse),
                 repr(tgt), version("disc_stablehlo")):
        h.update(part.encode())
        h.update(b"\0")
    h.update(_ral_digest())
    h.update(_compiler_digest())
    return h.hexdigest()[:32]


@functools.cache
def _compiler_digest() -> bytes:
    """The compiler's own sources (read once per process): a changed pass never reuses objects
    an older build compiled, version number or not."""
    root = os.path.dirname(os.path.abspath(__file__))
    return _digest(sorted(os.path.join(folder, f) for folder, _, files in os.walk(root) for f in files if f.endswith(".py")))


@functools.cache
def _ral_digest() -> bytes:
    """The RAL build a cached object was linked against (read once per process)."""
    return _digest([os.path.join(ral_library_dir(), RAL_LIBRARY)])


def _digest(paths: list[str]) -> bytes:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    return h.digest()
