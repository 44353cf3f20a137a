"""Parameters: large constants (weights) leave the IR. Each becomes a trailing argument of the
entry function, and its bytes travel beside the module (stored once in the artifact's parameter
section, one copy at load), so no step prints, parses or rewrites weights as IR text and
compile time does not grow with the parameter count."""

from __future__ import annotations

import hashlib

import numpy as np
from torch_mlir import ir

from ..artifact import PARAM_MIN_BYTES
from ..bounded_dynamism.signature import ELEMENT_TYPES
from ..mlir_support import function_type


def add_parameter(func: ir.Operation, t: ir.Type, loc: ir.Location) -> ir.Value:
    """A new trailing argument of `func` (its type and argument attributes kept consistent)."""
    block = func.regions[0].blocks[0]
    arg = block.add_argument(t, loc)
    ftype = function_type(func)
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([*ftype.inputs, t], ftype.results))
    if "arg_attrs" in func.attributes:
        attrs = list(ir.ArrayAttr(func.attributes["arg_attrs"]))
        func.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs + [ir.DictAttr.get({})])
    return arg


def _data(constant: ir.Operation, t: ir.RankedTensorType) -> np.ndarray | None:
    """The constant's elements as an array of the type's dtype, or None (small ones, splats,
    types whose elements the bindings cannot hand over)."""
    dtype = ELEMENT_TYPES.get(str(t.element_type))
    if dtype is None or int(np.prod(t.shape, dtype=np.int64)) * dtype.itemsize < PARAM_MIN_BYTES:
        return None
    try:
        attr = constant.attributes["value"]  # complex elements: the bindings cannot even cast the attribute
        if not isinstance(attr, ir.DenseElementsAttr) or attr.is_splat:
            return None
        arr = np.asarray(attr)
    except Exception:  # bf16, complex: kept in the IR
        return None
    if arr.dtype.itemsize != dtype.itemsize or arr.size != int(np.prod(t.shape, dtype=np.int64)):
        return None
    return np.ascontiguousarray(arr).view(dtype).reshape(t.shape)


def hoist_parameters(entry: ir.Operation) -> list[np.ndarray]:
    """Turns the large constants of the entry's body (not of nested regions) into trailing
    arguments; returns their data in argument order. Equal constants share one argument."""
    block = entry.regions[0].blocks[0]
    params: list[np.ndarray] = []
    seen: dict[tuple[str, bytes], ir.Value] = {}
    for op in list(block.operations):
        op = op.operation
        if op.name != "stablehlo.constant":
            continue
        t = ir.RankedTensorType(op.result.type)
        data = _data(op, t)
        if data is None:
            continue
        key = (str(t), hashlib.sha256(data.data).digest())
        if key not in seen:
            seen[key] = add_parameter(entry, t, op.location)
            params.append(data)
        op.result.replace_all_uses_with(seen[key])
        op.erase()
    return params
