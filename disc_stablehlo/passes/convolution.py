"""Convolutions with dynamic dims: the upstream conversion handles them only in the
[batch, spatial..., feature] x [spatial..., in, out] -> [batch, spatial..., feature] layout, so
other layouts (NCHW, JAX's default) are transposed into it and the result transposed back."""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from .lower import Text, register_template


def _layouts(op: ir.Operation) -> tuple[list[int], list[int], list[int]]:
    dn = _stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    lhs = [dn.input_batch_dimension, *dn.input_spatial_dimensions, dn.input_feature_dimension]
    rhs = [*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension]
    out = [dn.output_batch_dimension, *dn.output_spatial_dimensions, dn.output_feature_dimension]
    return lhs, rhs, out


def _needs_canonical_layout(op: ir.Operation) -> bool:
    dynamic = any(not ir.RankedTensorType(v.type).has_static_shape for v in [*op.operands, op.result])
    return dynamic and any(p != list(range(len(p))) for p in _layouts(op))


def _permuted_type(t: ir.Type, perm: list[int]) -> str:
    rt = ir.RankedTensorType(t)
    dims = "".join(f"{'?' if rt.is_dynamic_dim(p) else rt.shape[p]}x" for p in perm)
    return f"tensor<{dims}{rt.element_type}>"


def _transpose(t: Text, value: str, vtype: ir.Type | str, perm: list[int], result_type: str) -> str:
    if perm == list(range(len(perm))):
        return value
    return t(f"stablehlo.transpose {value}, dims = {perm} : ({vtype}) -> {result_type}")


@register_template("stablehlo.convolution", when=_needs_canonical_layout)
def _convolution(op, t: Text, state):
    lhs_perm, rhs_perm, out_perm = _layouts(op)
    n = len(lhs_perm) - 2
    lhs_t, rhs_t = _permuted_type(op.operands[0].type, lhs_perm), _permuted_type(op.operands[1].type, rhs_perm)
    out_t = _permuted_type(op.result.type, out_perm)
    lhs = _transpose(t, "%a0", op.operands[0].type, lhs_perm, lhs_t)
    rhs = _transpose(t, "%a1", op.operands[1].type, rhs_perm, rhs_t)
    spatial = ", ".join(str(i) for i in range(n))
    canonical = f"#stablehlo.conv<[b, {spatial}, f]x[{spatial}, i, o]->[b, {spatial}, f]>"
    attrs = ", ".join(f"{name} = {canonical if name == 'dimension_numbers' else op.attributes[name]}" for name in op.attributes)
    conv = t(f'"stablehlo.convolution"({lhs}, {rhs}) <{{{attrs}}}> : ({lhs_t}, {rhs_t}) -> {out_t}')
    inverse = [out_perm.index(i) for i in range(len(out_perm))]
    return [_transpose(t, conv, out_t, inverse, str(op.result.type))]
