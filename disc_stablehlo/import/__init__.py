"""Frontends: every supported input becomes one StableHLO module in a fresh MLIR context plus a
signature. The rest of the pipeline never knows where a module came from.

`import` is a Python keyword: the package loads this module with importlib."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from ..mlir_support import new_context  # first: loads torch-mlir's native modules (see _load_mlir)
from torch_mlir import ir  # noqa: E402

from ..bounded_dynamism.signature import Signature, signature_from_function
from ..errors import CompileError
from ..runtime import Binding


@dataclasses.dataclass
class Imported:
    module: ir.Module
    entry: str
    signature: Signature
    binding: Binding = dataclasses.field(default_factory=Binding)  # the caller's arguments and results
    facts: tuple[str, ...] = ()    # shape constraints the frontend checks itself (JAX's), as text
    checked: tuple[str, ...] = ()  # constraints the frontend knows but does not check (torch.export's ranges)
    params: tuple[np.ndarray, ...] = ()  # data of the entry's arguments after the signature's (weights)


Frontend = Callable[..., Imported]
_FRONTENDS: list[tuple[Callable[[Any], bool], Frontend]] = []


def register_frontend(accepts: Callable[[Any, tuple], bool], convert: Frontend) -> None:
    """Adds a frontend: `accepts(obj, specs)` says whether it handles `obj`; `convert(obj, *specs)`."""
    _FRONTENDS.append((accepts, convert))


def load(obj: Any, *specs: Any, **options: Any) -> Imported:
    """`options` are frontend-specific (`dynamic_shapes=` for PyTorch)."""
    for accepts, convert in _FRONTENDS:
        if accepts(obj, specs):
            return convert(obj, *specs, **options)
    raise CompileError(f"cannot compile a {type(obj).__name__}: expected a JAX function with ShapeDtypeStruct "
                       "specs, a jax.export.Exported, a torch.nn.Module or ExportedProgram, a TensorFlow function "
                       "with tf.TensorSpec specs, or a StableHLO module (text, bytecode or portable artifact)")


def find_entry(module: ir.Module) -> ir.Operation:
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
    from torch_mlir._mlir_libs import _stablehlo

    ctx = new_context()
    with ctx, ir.Location.unknown():
        if isinstance(source, (bytes, bytearray)):
            try:
                return _stablehlo.deserialize_portable_artifact(ctx, bytes(source))
            except Exception:
                pass  # not a portable artifact: plain MLIR bytecode
        if isinstance(source, str) and "chlo." in source:
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


def _from_stablehlo(source: str | bytes, *specs: Any) -> Imported:
    if specs:
        raise CompileError("a StableHLO module carries its own signature: pass no argument specs")
    module = parse_stablehlo(source)
    with module.context:
        entry = find_entry(module)
        return Imported(module, ir.StringAttr(entry.attributes["sym_name"]).value, signature_from_function(entry))


register_frontend(lambda obj, specs: isinstance(obj, (str, bytes, bytearray)), _from_stablehlo)

# before JAX's, which takes any other callable
from . import torch_frontend  # noqa: E402,F401  (registers itself)
from . import tf_frontend  # noqa: E402,F401  (registers itself)
from . import jax_frontend  # noqa: E402,F401  (registers itself)
