"""Frontends, in two halves.

In the caller's process, `export` turns a user's function or model into a `Source` (StableHLO
text or bytes, or a saved torch.export program, with the dims and names the frontend knows) and
a `Binding` (how call arguments and results map); it needs the framework, never MLIR. In the
compiler worker, `import_source` turns a `Source` into an `Imported`: one StableHLO module in a
fresh MLIR context plus a signature. The rest of the pipeline never knows where a module came from.

`import` is a Python keyword: the package loads this module with importlib."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..artifact import Deferred
from ..bounded_dynamism.signature import Dim, Signature
from ..errors import CompileError
from ..runtime import Binding

if TYPE_CHECKING:
    from torch_mlir import ir


@dataclasses.dataclass(frozen=True)
class Source:
    """What the caller hands the compiler worker (picklable, no MLIR)."""
    kind: str                      # "stablehlo" (payload: text or bytes), "torch" (a saved ExportedProgram's path), "tf"
    payload: str | bytes
    arg_dims: tuple[tuple[Dim, ...], ...] | None = None  # dims the frontend named (symbolic dims), per argument
    arg_names: tuple[str, ...] | None = None
    facts: tuple[str, ...] = ()    # shape constraints the frontend checks itself (JAX's), as text
    checked: tuple[str, ...] = ()  # constraints the frontend knows but does not check (torch.export's ranges)
    ops: tuple[str, ...] = ()      # TF: the graph's op names (for the message when TF's exporter leaves some)
    # torch: the program's large tensors, held back in the caller (the saved program has stand-ins
    # of their shape): named by `held_back`, written into the artifact by the caller (`Deferred`)
    held_back: tuple[str, ...] = ()
    weights: tuple[np.ndarray, ...] = dataclasses.field(default=(), repr=False, compare=False)
    weights_digest: str = ""       # their SHA-256, for the compile cache's key (set where one is used)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "weights": ()}  # never sent to the compiler worker


@dataclasses.dataclass
class Imported:
    module: ir.Module
    entry: str
    signature: Signature
    facts: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()
    params: tuple[np.ndarray | Deferred, ...] = ()  # the entry's arguments after the signature's (weights)


Exporter = Callable[..., tuple[Source, Binding]]
_EXPORTERS: list[tuple[Callable[[Any, tuple], bool], Exporter, tuple[str, ...]]] = []
_IMPORTERS: dict[str, Callable[[Source], Imported]] = {}


def register_frontend(accepts: Callable[[Any, tuple], bool], export: Exporter, kind: str | None = None,
                      importer: Callable[[Source], Imported] | None = None, importer_modules: tuple[str, ...] = ()) -> None:
    """Adds a frontend: `accepts(obj, specs)` says whether it handles `obj`; `export(obj, *specs,
    **options)` runs in the caller; `importer` turns its `kind` of Source into an `Imported` in the
    worker, with `importer_modules` (which the worker loads while the caller exports)."""
    _EXPORTERS.append((accepts, export, importer_modules))
    if kind is not None and importer is not None:
        _IMPORTERS[kind] = importer


def _frontend(obj: Any, specs: tuple) -> tuple[Exporter, tuple[str, ...]]:
    for accepts, convert, modules in _EXPORTERS:
        if accepts(obj, specs):
            return convert, modules
    raise CompileError(f"cannot compile a {type(obj).__name__}: expected a JAX function with ShapeDtypeStruct "
                       "specs, a jax.export.Exported, a torch.nn.Module, ExportedProgram or function with example tensors, a TensorFlow function "
                       "with tf.TensorSpec specs, or a StableHLO module (text, bytecode or portable artifact)")


def importer_modules(obj: Any, *specs: Any) -> tuple[str, ...]:
    """The modules the worker's importer for `obj` needs (loaded there while the caller exports)."""
    return _frontend(obj, specs)[1]


def export(obj: Any, *specs: Any, **options: Any) -> tuple[Source, Binding]:
    """`options` are frontend-specific (`dynamic_shapes=` for PyTorch)."""
    return _frontend(obj, specs)[0](obj, *specs, **options)


def import_source(source: Source) -> Imported:
    """In the compiler worker: the Source as an MLIR module and signature."""
    if source.kind not in _IMPORTERS:
        raise CompileError(f"unknown source kind '{source.kind}'; known: {', '.join(sorted(_IMPORTERS))}")
    return _IMPORTERS[source.kind](source)


def entry_name(entry: ir.Operation) -> str:
    from torch_mlir import ir

    return ir.StringAttr(entry.attributes["sym_name"]).value


def find_entry(module: ir.Module) -> ir.Operation:
    from torch_mlir import ir

    funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    public = [f for f in funcs if "sym_visibility" not in f.attributes or ir.StringAttr(f.attributes["sym_visibility"]).value == "public"]
    for f in public:
        if ir.StringAttr(f.attributes["sym_name"]).value == "main":
            return f
    if len(public) == 1:
        return public[0]
    names = [ir.StringAttr(f.attributes["sym_name"]).value for f in public]
    raise CompileError(f"no entry function: expected a public func named 'main' or exactly one public func, found {names}")


def parse_stablehlo(source: str | bytes) -> ir.Module:
    """Parses StableHLO text, MLIR bytecode, or a StableHLO portable artifact in a new context."""
    from torch_mlir import ir
    from torch_mlir._mlir_libs import _stablehlo

    from ..mlir_support import new_context

    ctx = new_context()
    with ctx, ir.Location.unknown():
        if isinstance(source, (bytes, bytearray)):
            try:
                return _stablehlo.deserialize_portable_artifact(ctx, bytes(source))
            except Exception:
                pass  # not a portable artifact: plain MLIR bytecode
        if isinstance(source, str) and "chlo." in source:
            if "chlo.scan" in source:
                from .chlo_scan import scans_as_loops

                source = scans_as_loops(source)
            return _stablehlo.deserialize_portable_artifact(ctx, _without_chlo(source))
        try:
            return ir.Module.parse(source)
        except Exception as e:
            raise CompileError(f"cannot parse the StableHLO module: {e}") from None


def _without_chlo(text: str) -> bytes:
    """torch-mlir's wheel has no CHLO dialect. jaxlib's StableHLO serializer rewrites each CHLO op
    as a `stablehlo.composite` with its decomposition (lowered by our composite rewrite)."""
    from jax._src.lib import _jax
    from torch_mlir._mlir_libs import _stablehlo

    try:
        return _jax.mlir.serialize_portable_artifact(text, _stablehlo.get_current_version())
    except Exception as e:
        raise CompileError(f"cannot parse the CHLO module: {e}") from None


def _export_stablehlo(source: str | bytes, *specs: Any) -> tuple[Source, Binding]:
    if specs:
        raise CompileError("a StableHLO module carries its own signature: pass no argument specs")
    return Source("stablehlo", bytes(source) if isinstance(source, bytearray) else source), Binding()


def import_stablehlo(source: Source) -> Imported:
    """A StableHLO module with the dims and argument names its frontend gave (JAX's symbolic dims)."""
    from ..bounded_dynamism.signature import signature_from_function

    module = parse_stablehlo(source.payload)
    with module.context:
        entry = find_entry(module)
        sig = signature_from_function(entry, source.arg_dims, source.arg_names)
        return Imported(module, entry_name(entry), sig, source.facts, source.checked)


register_frontend(lambda obj, specs: isinstance(obj, (str, bytes, bytearray)), _export_stablehlo, "stablehlo", import_stablehlo)

# before JAX's, which takes any other callable
from . import torch_frontend  # noqa: E402,F401  (registers itself)
from . import tf_frontend  # noqa: E402,F401  (registers itself)
from . import jax_frontend  # noqa: E402,F401  (registers itself)
