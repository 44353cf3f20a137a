"""Converts, reshapes and broadcasts of splat constants folded before StableHLO's simplification,
which leaves them. A Python scalar in a torch model arrives as a one-element f64 or i64 tensor
converted to the operand's type and reshaped to rank 0 (`x.clamp_min(-3.4e38)`, `x / 8.0`);
unfolded, it reached the kernels as a one-element buffer filled at run time, a loop of its own
that kept the loops around it from fusing."""

from __future__ import annotations

import math

import numpy as np
from torch_mlir import ir

from ..bounded_dynamism.signature import ELEMENT_TYPES
from ..mlir_support import create_value, operation, walk

_FOLDED = ("stablehlo.convert", "stablehlo.reshape", "stablehlo.broadcast_in_dim")


def _numpy_type(t: ir.Type) -> np.dtype | None:
    """The numpy dtype of an element type this fold converts exactly as StableHLO does: bool,
    integers and IEEE floats (not bf16, whose ml_dtypes type is no numpy float, nor complex)."""
    dtype = ELEMENT_TYPES.get(str(t))
    return dtype if dtype is not None and dtype.kind in "biuf" else None


def _converted(value: float | int, to: np.dtype) -> float | int | None:
    """`value` converted as `stablehlo.convert` converts it (floats round to nearest even,
    integers wrap, nonzero is true), or None where the spec leaves the result to the
    implementation (a float outside the integer type's range, NaN or infinite)."""
    if to.kind == "b":
        return int(value != 0)
    if to.kind == "f":
        return float(np.array(value).astype(to))
    if isinstance(value, float):
        if not math.isfinite(value) or not np.iinfo(to).min <= math.trunc(value) <= np.iinfo(to).max:
            return None
        value = math.trunc(value)
    return int(np.array(value).astype(to))  # wraps, as two's complement


def fold_constant_converts(module: ir.Module) -> None:
    """Converts, reshapes and broadcasts of splat constants become splat constants."""
    for op in walk(module.operation):
        if op.name not in _FOLDED or isinstance(op.operands[0].owner, ir.Block) or not op.results[0].type.has_static_shape:
            continue
        source = operation(op.operands[0].owner)
        from_t, to_t = op.operands[0].type.element_type, op.results[0].type.element_type
        if source.name not in ("stablehlo.constant", "arith.constant") or not isinstance(from_t, (ir.IntegerType, ir.FloatType)):
            continue  # not a constant, or a complex one (the bindings cannot read its attribute)
        attr = source.attributes["value"]
        if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
            continue
        scalar = attr.get_splat_value()
        if op.name == "stablehlo.convert":
            if (source_type := _numpy_type(from_t)) is None or (to := _numpy_type(to_t)) is None:
                continue
            value = scalar.value
            if source_type.kind == "b":
                value = int(value != 0)  # an i1 true may read as -1
            if (converted := _converted(value, to)) is None:
                continue
            scalar = ir.FloatAttr.get(to_t, converted) if to.kind == "f" else ir.IntegerAttr.get(to_t, converted)
        with ir.InsertionPoint(op), op.location:
            folded = create_value("stablehlo.constant", [], op.results[0].type,
                                  value=ir.DenseElementsAttr.get_splat(op.results[0].type, scalar))
        op.results[0].replace_all_uses_with(folded)
        op.erase()
