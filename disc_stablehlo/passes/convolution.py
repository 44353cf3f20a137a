"""Convolutions with dynamic dims (the upstream conversion takes only a dynamic batch, and only in
the [b, spatial..., f] layout). One lowering for every layout: the input is padded (lhs dilation
becomes interior padding), then one linalg.generic whose affine maps encode the layout, window
strides, rhs dilation, window reversal and feature groups reduces over the window and the
input features of the output feature's group."""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from ..errors import UnsupportedOpError
from ..mlir_support import int_list
from .dynamic_ops import _elem, _pad
from .lower import Text, register_template


def _is_dynamic(op: ir.Operation) -> bool:
    return any(not ir.RankedTensorType(v.type).has_static_shape for v in [*op.operands, op.result])


@register_template("stablehlo.convolution", when=_is_dynamic)
def _convolution(op, t: Text, state):
    dn = _stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    lhs_t, rhs_t, out_t = (ir.RankedTensorType(v.type) for v in (op.operands[0], op.operands[1], op.result))
    n = len(dn.input_spatial_dimensions)
    strides = int_list(op, "window_strides") or [1] * n
    padding = int_list(op, "padding") or [0] * (2 * n)
    lhs_dil = int_list(op, "lhs_dilation") or [1] * n
    rhs_dil = int_list(op, "rhs_dilation") or [1] * n
    reversal = [bool(x) for x in ir.DenseBoolArrayAttr(op.attributes["window_reversal"])] if "window_reversal" in op.attributes else [False] * n
    groups = ir.IntegerAttr(op.attributes["feature_group_count"]).value
    if ir.IntegerAttr(op.attributes["batch_group_count"]).value != 1:
        raise UnsupportedOpError("batch_group_count > 1 with dynamic dims")
    elem = _elem(op.result)
    if _elem(op.operands[0]) != elem or _elem(op.operands[1]) != elem:
        raise UnsupportedOpError("mixed element types with dynamic dims")
    kernel_in = rhs_t.shape[dn.kernel_input_feature_dimension]
    out_features = rhs_t.shape[dn.kernel_output_feature_dimension]
    if rhs_t.is_dynamic_dim(dn.kernel_input_feature_dimension) or rhs_t.is_dynamic_dim(dn.kernel_output_feature_dimension) or any(
            rhs_t.is_dynamic_dim(d) for d in dn.kernel_spatial_dimensions):
        raise UnsupportedOpError("dynamic kernel dims")
    # pad the input: spatial dims get edge padding and lhs dilation as interior padding
    lows, highs, interiors = [t.const(0)] * lhs_t.rank, [t.const(0)] * lhs_t.rank, [t.const(0)] * lhs_t.rank
    padded_shape = ["?" if lhs_t.is_dynamic_dim(d) else str(lhs_t.shape[d]) for d in range(lhs_t.rank)]
    for s, d in enumerate(dn.input_spatial_dimensions):
        lows[d], highs[d], interiors[d] = t.const(padding[2 * s]), t.const(padding[2 * s + 1]), t.const(lhs_dil[s] - 1)
        if not lhs_t.is_dynamic_dim(d):
            size = lhs_t.shape[d]
            padded_shape[d] = str(padding[2 * s] + padding[2 * s + 1] + size + max(size - 1, 0) * (lhs_dil[s] - 1))
    padded_type = f"tensor<{'x'.join(padded_shape)}x{elem}>"
    zero = t(f"arith.constant {'0.0' if elem.startswith(('f', 'bf')) else '0'} : {elem}")
    padded = _pad(t, "%a0", lhs_t, zero, padded_type, lows, highs, interiors)
    # output dims: batch from the input, features from the kernel, spatial from the window
    padded_t = ir.RankedTensorType(ir.Type.parse(padded_type))
    out_dims = [t.const(out_t.shape[d]) if not out_t.is_dynamic_dim(d) else None for d in range(out_t.rank)]
    if out_dims[dn.output_batch_dimension] is None:
        out_dims[dn.output_batch_dimension] = t.dim("%a0", lhs_t, dn.input_batch_dimension)
    for s, (od, idim, kd) in enumerate(zip(dn.output_spatial_dimensions, dn.input_spatial_dimensions, dn.kernel_spatial_dimensions)):
        if out_dims[od] is None:
            size = t.dim(padded, padded_t, idim)
            reach = t.const((rhs_t.shape[kd] - 1) * rhs_dil[s] + 1)
            steps = t(f"arith.floordivsi {t(f'arith.subi {size}, {reach} : index')}, {t.const(strides[s])} : index")
            out_dims[od] = t(f"arith.maxsi {t(f'arith.addi {steps}, {t.const(1)} : index')}, {t.const(0)} : index")
    # iteration space: output dims d0..d{R-1}, then window dims, then the group's input features
    rank = out_t.rank
    win = [f"d{rank + s}" for s in range(n)]
    feat = f"d{rank + n}"
    out_f = f"d{dn.output_feature_dimension}"
    group_in = f"({out_f} floordiv {out_features // groups}) * {kernel_in} + {feat}" if groups > 1 else feat
    lhs_map = [""] * lhs_t.rank
    lhs_map[dn.input_batch_dimension] = f"d{dn.output_batch_dimension}"
    lhs_map[dn.input_feature_dimension] = group_in
    rhs_map = [""] * rhs_t.rank
    rhs_map[dn.kernel_input_feature_dimension] = feat
    rhs_map[dn.kernel_output_feature_dimension] = out_f
    for s in range(n):
        lhs_map[dn.input_spatial_dimensions[s]] = f"d{dn.output_spatial_dimensions[s]} * {strides[s]} + {win[s]} * {rhs_dil[s]}"
        k = rhs_t.shape[dn.kernel_spatial_dimensions[s]]
        rhs_map[dn.kernel_spatial_dimensions[s]] = f"{k - 1} - {win[s]}" if reversal[s] else win[s]
    all_dims = ", ".join(f"d{i}" for i in range(rank + n + 1))
    maps = [f"affine_map<({all_dims}) -> ({', '.join(m)})>" for m in (lhs_map, rhs_map, [f"d{i}" for i in range(rank)])]
    iterators = ", ".join(['"parallel"'] * rank + ['"reduction"'] * (n + 1))
    init = t(f"linalg.fill ins({zero} : {elem}) outs({t.empty(op.result.type, out_dims)} : {op.result.type}) -> {op.result.type}")
    mul, add = ("arith.mulf", "arith.addf") if elem.startswith(("f", "bf")) else ("arith.muli", "arith.addi")
    name = t.fresh("conv")
    t.emit(f"{name} = linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{iterators}]}} "
           f"ins({padded}, %a1 : {padded_type}, {rhs_t}) outs({init} : {op.result.type}) {{\n"
           f"^bb0(%x: {elem}, %w: {elem}, %acc: {elem}):\n  %xw = {mul} %x, %w : {elem}\n  %sum = {add} %acc, %xw : {elem}\n"
           f"  linalg.yield %sum : {elem}\n}} -> {op.result.type}")
    return [name]
