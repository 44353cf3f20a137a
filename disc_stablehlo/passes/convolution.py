"""Convolutions, in every layout:

- ungrouped f32/f64 convolutions in PyTorch's layout (channels first, up to three spatial dims)
  are one call of the RAL's convolution (`disc_ral_conv_*`): per image, the kernel as stored
  (out features x input features * window) times blocks of patch columns that the RAL builds
  in cache (padding, input and window dilation, strides applied as it copies; a 1x1 window with
  unit strides reads the input itself), the output written in its own layout;
- ungrouped f32/f64 convolutions in other layouts (and in every layout on GPUs, whose RAL has
  no convolution): the input is padded (input dilation becomes
  interior padding), one linalg.generic copies the windows into a patch matrix ([batch, output
  positions..., window dims in the kernel's memory order], so the kernel is its other operand
  as it is stored, never copied), a `dot_general` multiplies it with the kernel (the BLAS
  rewrite takes it), and the product is transposed into the output layout (written in place by
  the GEMM);
- the others (grouped and depthwise convolutions, integer types) with a small
  window (window positions x the group's input features up to UNROLL_MAX: a depthwise 3x3 to
  7x7) are one elementwise linalg.generic summing the window's products, each window position
  reading a strided slice (a view) of the padded input: it fuses with the batch norm and
  activation after it and vectorises along the output's rows;
- larger windows are one linalg.generic whose affine maps encode the layout, window strides,
  rhs dilation and feature groups, reducing over the window and the input
  features of the output feature's group (the upstream conversion takes only a dynamic batch,
  and only in the [b, spatial..., f] layout).

With dynamic dims, the last two also take mixed element types (int8 accumulated in int32, float16
and bfloat16 in float32: the elements are widened before their products), and the last one
kernels whose features and window sizes are dynamic (the input's features are checked against
the kernel's at run time) and batch_group_count > 1. Its groups (of features or of the batch)
are split dims: the grouped input dim read as [groups, dim / groups], the kernel's and the
output's features as [groups, features / groups], the group an iteration dim of its own (a dim
that does not split evenly is a ShapeError). Window reversal is a reversed kernel
(`reverse_kernels`, before any of these)."""

from __future__ import annotations

import itertools

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from ..errors import UnsupportedOpError
from ..mlir_support import create_value, int_list, walk
from .dynamic_ops import _elem, _pad, padded_size
from .library_calls import GEMM_ELEMENT_TYPES, _static_product, contiguous_buffer, pointer
from .lower import GPU_ATTR, Text, register_template


def _is_dynamic(op: ir.Operation) -> bool:
    return any(not ir.RankedTensorType(v.type).has_static_shape for v in [*op.operands, op.result])


def _as_gemm(op: ir.Operation) -> bool:
    """Ungrouped float convolutions of one element type (what the BLAS takes)."""
    types = {str(ir.RankedTensorType(v.type).element_type) for v in [*op.operands[:2], op.result]}
    return (len(types) == 1 and types <= GEMM_ELEMENT_TYPES
            and ir.IntegerAttr(op.attributes["feature_group_count"]).value == 1
            and ir.IntegerAttr(op.attributes["batch_group_count"]).value == 1)


# window positions x input features per group up to which a convolution that is no GEMM is one
# elementwise sum of products (a depthwise 7x7 has 49)
UNROLL_MAX = 64


def _unrolled(op: ir.Operation) -> bool:
    """A convolution of one element type whose window (times its group's input features) is small."""
    rhs_t = ir.RankedTensorType(op.operands[1].type)
    dn = _stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    return (len({str(ir.RankedTensorType(v.type).element_type) for v in [*op.operands, op.result]}) == 1
            and ir.IntegerAttr(op.attributes["batch_group_count"]).value == 1 and rhs_t.has_static_shape
            and rhs_t.shape[dn.kernel_input_feature_dimension] * _static_product(
                [rhs_t.shape[d] for d in dn.kernel_spatial_dimensions]) <= UNROLL_MAX)


def _padding(op: ir.Operation, t: Text, n: int) -> list[int | str]:
    """Low and high padding of each of the `n` spatial dims: the attribute's ints, or (a
    dynamic_conv: padding computed from the shapes) index values read from its operand."""
    if op.name == "stablehlo.dynamic_conv":
        return [t.extract_index("%a2", op.operands[2].type, [t.const(s), t.const(j)]) for s in range(n) for j in (0, 1)]
    return int_list(op, "padding") or [0] * (2 * n)


@register_template("stablehlo.convolution", "stablehlo.dynamic_conv",
                   when=lambda op: op.name == "stablehlo.dynamic_conv" or _as_gemm(op) or _is_dynamic(op) or _unrolled(op))
def _convolution(op, t: Text, state):
    dn = _stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    lhs_t, rhs_t, out_t = (ir.RankedTensorType(v.type) for v in (op.operands[0], op.operands[1], op.result))
    n = len(dn.input_spatial_dimensions)
    strides = int_list(op, "window_strides") or [1] * n
    if len(strides) != n:
        raise UnsupportedOpError(f"window_strides has {len(strides)} entries for {n} spatial dimension(s)")
    padding = _padding(op, t, n)
    index = [t.const(p) if isinstance(p, int) else p for p in padding]
    lhs_dil = int_list(op, "lhs_dilation") or [1] * n
    rhs_dil = int_list(op, "rhs_dilation") or [1] * n
    groups = ir.IntegerAttr(op.attributes["feature_group_count"]).value
    batch_groups = ir.IntegerAttr(op.attributes["batch_group_count"]).value
    elem, in_elem, k_elem = _elem(op.result), _elem(op.operands[0]), _elem(op.operands[1])
    if not all(_widens(e, elem) for e in (in_elem, k_elem)):
        raise UnsupportedOpError(f"a convolution of {in_elem} and {k_elem} into {elem}: only signed integers or floats widened "
                                 "to the result's type")
    kernel_in = rhs_t.shape[dn.kernel_input_feature_dimension]
    out_features = rhs_t.shape[dn.kernel_output_feature_dimension]
    # output dims: batch from the input, features from the kernel, spatial from the window
    # sliding over the padded input (edge padding, and the input dilation as interior padding)
    in_dims, k_dims = t.dims("%a0", lhs_t), t.dims("%a1", rhs_t)
    if lhs_t.is_dynamic_dim(dn.input_feature_dimension) or rhs_t.is_dynamic_dim(dn.kernel_input_feature_dimension):
        features = in_dims[dn.input_feature_dimension]
        per_group = t(f"arith.muli {k_dims[dn.kernel_input_feature_dimension]}, {t.const(groups)} : index")
        t.check(state, op, t(f"arith.cmpi ne, {features}, {per_group} : index"),
                f"the input has {{0}} features, the kernel's {groups} group(s) read {{1}}", features, per_group)
    out_dims = [t.const(out_t.shape[d]) if not out_t.is_dynamic_dim(d) else None for d in range(out_t.rank)]
    if batch_groups > 1:  # the input's batch is batch_groups groups, one per group of output features
        batch = in_dims[dn.input_batch_dimension]
        remainder = t(f"arith.remsi {batch}, {t.const(batch_groups)} : index")
        t.check(state, op, t(f"arith.cmpi ne, {remainder}, {t.const(0)} : index"),
                f"the input's batch of {{0}} is not {batch_groups} groups of equal size (batch_group_count)", batch, t.const(batch_groups))
    if out_dims[dn.output_batch_dimension] is None:
        batch = in_dims[dn.input_batch_dimension]
        out_dims[dn.output_batch_dimension] = t(f"arith.divsi {batch}, {t.const(batch_groups)} : index") if batch_groups > 1 else batch
    if out_dims[dn.output_feature_dimension] is None:
        out_dims[dn.output_feature_dimension] = k_dims[dn.kernel_output_feature_dimension]
    for s, (od, idim, kd) in enumerate(zip(dn.output_spatial_dimensions, dn.input_spatial_dimensions, dn.kernel_spatial_dimensions)):
        if out_dims[od] is None:
            size = padded_size(t, in_dims[idim], index[2 * s], index[2 * s + 1], t.const(lhs_dil[s] - 1))
            extent = t(f"arith.muli {t(f'arith.subi {k_dims[kd]}, {t.const(1)} : index')}, {t.const(rhs_dil[s])} : index")
            reach = t(f"arith.addi {extent}, {t.const(1)} : index")
            steps = t(f"arith.floordivsi {t(f'arith.subi {size}, {reach} : index')}, {t.const(strides[s])} : index")
            out_dims[od] = t(f"arith.maxsi {t(f'arith.addi {steps}, {t.const(1)} : index')}, {t.const(0)} : index")
    gemm = _as_gemm(op) and rhs_t.has_static_shape
    if gemm and _channels_first(dn, n) and GPU_ATTR not in state.module.operation.attributes:
        return [_conv_call(t, op, in_dims, out_dims, strides, padding, lhs_dil, rhs_dil, elem)]
    # pad the input
    lows, highs, interiors = [0] * lhs_t.rank, [0] * lhs_t.rank, [0] * lhs_t.rank
    padded_shape = ["?" if lhs_t.is_dynamic_dim(d) else str(lhs_t.shape[d]) for d in range(lhs_t.rank)]
    for s, d in enumerate(dn.input_spatial_dimensions):
        lows[d], highs[d], interiors[d] = padding[2 * s], padding[2 * s + 1], lhs_dil[s] - 1
        if not lhs_t.is_dynamic_dim(d) and isinstance(padding[2 * s], int):
            size = lhs_t.shape[d]
            padded_shape[d] = str(padding[2 * s] + padding[2 * s + 1] + size + max(size - 1, 0) * (lhs_dil[s] - 1))
    padded_type = f"tensor<{'x'.join(padded_shape)}x{in_elem}>"
    padded = _pad(t, "%a0", lhs_t, _zero(t, in_elem), padded_type, lows, highs, interiors)
    padded_t = ir.RankedTensorType(ir.Type.parse(padded_type))
    if gemm:
        return [_gemm(t, op, dn, padded, padded_type, out_dims, strides, rhs_dil, elem)]
    rank = out_t.rank
    window = [rhs_t.shape[d] for d in dn.kernel_spatial_dimensions]
    ofd, ifd, ibd, kofd = (dn.output_feature_dimension, dn.input_feature_dimension, dn.input_batch_dimension,
                           dn.kernel_output_feature_dimension)
    grouped = max(groups, batch_groups)  # StableHLO allows one of the two above 1

    def maps(win: list[str], feat: str, sliced: bool = False, split: bool = False) -> tuple[list[str], list[str]]:
        """The input's and the kernel's indices at window position `win` and input feature `feat`
        of the output feature's group (iteration dims or constants); `sliced`: the input is the
        window position's strided slice, read at the output's spatial indices; `split`: the
        output feature is two iteration dims, its group and its index in the group, and the
        kernel's output features and the input's grouped dim are split likewise (any dims,
        dynamic too; otherwise the group is computed from the output feature: static features)."""
        split = split and grouped > 1

        def at(i: int) -> str:  # the iteration dim of the output's dim i (other than its feature dim)
            return f"d{i + 1 if split and i > ofd else i}"
        lhs_map, rhs_map = [""] * lhs_t.rank, [""] * rhs_t.rank
        lhs_map[ibd] = at(dn.output_batch_dimension)
        lhs_map[ifd] = feat if split or groups == 1 else f"(d{ofd} floordiv {out_features // groups}) * {kernel_in} + {feat}"
        rhs_map[dn.kernel_input_feature_dimension] = feat
        rhs_map[kofd] = f"d{ofd + 1}" if split else f"d{ofd}"
        for s in range(n):
            out_s = at(dn.output_spatial_dimensions[s])
            lhs_map[dn.input_spatial_dimensions[s]] = out_s if sliced else f"{out_s} * {strides[s]} + {win[s]} * {rhs_dil[s]}"
            rhs_map[dn.kernel_spatial_dimensions[s]] = win[s]
        if split:  # the group comes first in each split dim
            gd = ibd if batch_groups > 1 else ifd
            lhs_map[gd:gd + 1] = [f"d{ofd}", lhs_map[gd]]
            rhs_map[kofd:kofd + 1] = [f"d{ofd}", rhs_map[kofd]]
        return lhs_map, rhs_map
    mul, add = ("arith.mulf", "arith.addf") if _is_float(elem) else ("arith.muli", "arith.addi")
    if _unrolled(op):
        # one elementwise generic summing the window's products: it fuses with its consumers, and
        # its loops are the output's (LLVM vectorises along the output's rows). Each window
        # position reads a strided slice of the padded input (a view) of the output's spatial
        # extent, so the input's operands, not only the output, bound the loops (the output is
        # gone once a reduction consumer absorbs the generic)
        sizes = [t.dim(padded, padded_t, d) if padded_t.is_dynamic_dim(d) else str(padded_t.shape[d]) for d in range(lhs_t.rank)]
        for od, idim in zip(dn.output_spatial_dimensions, dn.input_spatial_dimensions):
            sizes[idim] = out_dims[od] if out_t.is_dynamic_dim(od) else str(out_t.shape[od])
        slice_type = f"tensor<{'x'.join('?' if v.startswith('%') else v for v in sizes)}x{in_elem}>"
        slices = {}
        for w in itertools.product(*map(range, window)):
            offsets, steps = ["0"] * lhs_t.rank, ["1"] * lhs_t.rank
            for s, idim in enumerate(dn.input_spatial_dimensions):
                offsets[idim], steps[idim] = str(w[s] * rhs_dil[s]), str(strides[s])
            slices[w] = t(f"tensor.extract_slice {padded}[{', '.join(offsets)}] [{', '.join(sizes)}] [{', '.join(steps)}] "
                          f": {padded_type} to {slice_type}")
        terms = [(w, f) for w in itertools.product(*map(range, window)) for f in range(kernel_in)]
        all_dims = ", ".join(f"d{i}" for i in range(rank))
        lhs_maps, rhs_maps = zip(*(maps(list(map(str, w)), str(f), sliced=True) for w, f in terms))
        indexing = [f"affine_map<({all_dims}) -> ({', '.join(m)})>" for m in [*lhs_maps, *rhs_maps, [f"d{i}" for i in range(rank)]]]
        body = []
        for i in range(len(terms)):
            (x_lines, x), (w_lines, w) = _widened(f"%x{i}", in_elem, elem), _widened(f"%w{i}", k_elem, elem)
            body += x_lines + w_lines + [f"{'%p0' if i == 0 else f'%q{i}'} = {mul} {x}, {w} : {elem}"]
            if i:
                body.append(f"%p{i} = {add} %p{i - 1}, %q{i} : {elem}")
        body.append(f"linalg.yield %p{len(terms) - 1} : {elem}")
        parallel = ", ".join(['"parallel"'] * rank)
        operands = ", ".join([slices[w] for w, _ in terms] + ["%a1"] * len(terms))
        types = ", ".join([slice_type] * len(terms) + [str(rhs_t)] * len(terms))
        args = ", ".join([f"%x{i}: {in_elem}" for i in range(len(terms))] + [f"%w{i}: {k_elem}" for i in range(len(terms))])
        name = t.fresh("conv")
        t.emit(f"{name} = linalg.generic {{indexing_maps = [{', '.join(indexing)}], iterator_types = [{parallel}]}} "
               f"ins({operands} : {types}) outs({t.empty(op.result.type, out_dims)} : {op.result.type}) {{\n"
               f"^bb0({args}, %acc: {elem}):\n  " + "\n  ".join(body) + f"\n}} -> {op.result.type}")
        return [name]
    # iteration space: output dims (the feature split into group and index in it when grouped), then
    # window dims, then the group's input features
    dims = rank + (grouped > 1)
    lhs_map, rhs_map = maps([f"d{dims + s}" for s in range(n)], f"d{dims + n}", split=True)
    x, x_type, w, w_type, result_type, result_dims = padded, padded_type, "%a1", str(rhs_t), op.result.type, out_dims
    if grouped > 1:
        if rhs_t.is_dynamic_dim(kofd):
            count = k_dims[kofd]
            t.check(state, op, t(f"arith.cmpi ne, {t(f'arith.remsi {count}, {t.const(grouped)} : index')}, {t.const(0)} : index"),
                    f"the kernel's {{0}} output features are not {grouped} groups of equal size", count, t.const(grouped))
        x, x_type = _split_dim(t, padded, padded_t, ibd if batch_groups > 1 else ifd, grouped)
        w, w_type = _split_dim(t, "%a1", rhs_t, kofd, grouped)
        result_dims = out_dims[:ofd] + [t.const(grouped), t(f"arith.divsi {out_dims[ofd]}, {t.const(grouped)} : index")] + out_dims[ofd + 1:]
        result_type = ir.Type.parse(_split_type(out_t, ofd, grouped))
    all_dims = ", ".join(f"d{i}" for i in range(dims + n + 1))
    indexing = [f"affine_map<({all_dims}) -> ({', '.join(m)})>" for m in (lhs_map, rhs_map, [f"d{i}" for i in range(dims)])]
    iterators = ", ".join(['"parallel"'] * dims + ['"reduction"'] * (n + 1))
    init = t(f"linalg.fill ins({_zero(t, elem)} : {elem}) outs({t.empty(result_type, result_dims)} : {result_type}) -> {result_type}")
    name = t.fresh("conv")
    (x_lines, xv), (w_lines, wv) = _widened("%x", in_elem, elem), _widened("%w", k_elem, elem)
    body = x_lines + w_lines + [f"%xw = {mul} {xv}, {wv} : {elem}", f"%sum = {add} %acc, %xw : {elem}", f"linalg.yield %sum : {elem}"]
    t.emit(f"{name} = linalg.generic {{indexing_maps = [{', '.join(indexing)}], iterator_types = [{iterators}]}} "
           f"ins({x}, {w} : {x_type}, {w_type}) outs({init} : {result_type}) {{\n"
           f"^bb0(%x: {in_elem}, %w: {k_elem}, %acc: {elem}):\n  " + "\n  ".join(body) + f"\n}} -> {result_type}")
    if grouped > 1:  # the group and the index in it: the output's feature again
        reassociation = [[d] if d < ofd else [d, d + 1] if d == ofd else [d + 1] for d in range(out_t.rank)]
        name = t(f"tensor.collapse_shape {name} {reassociation} : {result_type} into {op.result.type}")
    return [name]


def _split_type(x_t: ir.RankedTensorType, dim: int, count: int) -> str:
    """The type of `x_t` with its dim `dim` split into [count, dim / count]."""
    sizes = [str(x_t.shape[d]) if not x_t.is_dynamic_dim(d) else "?" for d in range(x_t.rank)]
    inner = "?" if x_t.is_dynamic_dim(dim) else str(x_t.shape[dim] // count)
    return f"tensor<{'x'.join(sizes[:dim] + [str(count), inner] + sizes[dim + 1:])}x{x_t.element_type}>"


def _split_dim(t: Text, x: str, x_t: ir.RankedTensorType, dim: int, count: int) -> tuple[str, str]:
    """`x` with its dim `dim` split into [count, dim / count]."""
    sizes = [t.dim(x, x_t, d) if x_t.is_dynamic_dim(d) else str(x_t.shape[d]) for d in range(x_t.rank)]
    inner = t(f"arith.divsi {sizes[dim]}, {t.const(count)} : index") if x_t.is_dynamic_dim(dim) else str(x_t.shape[dim] // count)
    shape = sizes[:dim] + [str(count), inner] + sizes[dim + 1:]
    groups = [[d] if d < dim else [d, d + 1] if d == dim else [d + 1] for d in range(x_t.rank)]
    out_type = _split_type(x_t, dim, count)
    return t(f"tensor.expand_shape {x} {groups} output_shape [{', '.join(shape)}] : {x_t} into {out_type}"), out_type


def _is_float(elem: str) -> bool:
    return elem.startswith(("f", "bf"))


_FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}


def _widens(src: str, dst: str) -> bool:
    """Whether products of `src` elements accumulate in `dst` by widening them first (the same
    type, a float to a wider float, a signed integer to a wider one)."""
    if src == dst:
        return True
    if _is_float(src) and _is_float(dst):
        return src in _FLOAT_BITS and dst in _FLOAT_BITS and _FLOAT_BITS[src] < _FLOAT_BITS[dst]
    return src[0] == dst[0] == "i" and src[1:].isdigit() and dst[1:].isdigit() and int(src[1:]) < int(dst[1:])


def _widened(value: str, src: str, dst: str) -> tuple[list[str], str]:
    """A block argument `value` of type `src` as `dst`: the body line that widens it (none when
    the types are the same) and the name to read."""
    if src == dst:
        return [], value
    return [f"{value}_wide = {'arith.extf' if _is_float(src) else 'arith.extsi'} {value} : {src} to {dst}"], f"{value}_wide"


def _zero(t: Text, elem: str) -> str:
    return t.const("0.0" if _is_float(elem) else 0, elem)


def _gemm(t: Text, op: ir.Operation, dn, padded: str, padded_type: str, out_dims: list[str], strides: list[int],
          rhs_dil: list[int], elem: str) -> str:
    """The convolution as patch matrix x kernel (see the module's docstring)."""
    rhs_t, out_t = ir.RankedTensorType(op.operands[1].type), ir.RankedTensorType(op.result.type)
    n = len(dn.input_spatial_dimensions)
    window = sorted(d for d in range(rhs_t.rank) if d != dn.kernel_output_feature_dimension)  # kernel memory order
    # patches[b, o_0..o_{n-1}, k...]: iteration dims d0 (batch), d1..dn (output positions), then one per window dim
    lhs = [""] * (n + 2)
    lhs[dn.input_batch_dimension] = "d0"
    for j, kd in enumerate(window):
        it = f"d{n + 1 + j}"
        if kd == dn.kernel_input_feature_dimension:
            lhs[dn.input_feature_dimension] = it
        else:
            s = list(dn.kernel_spatial_dimensions).index(kd)
            lhs[dn.input_spatial_dimensions[s]] = f"d{1 + s} * {strides[s]} + {it} * {rhs_dil[s]}"
    rank = n + 1 + len(window)
    rows = [out_dims[dn.output_batch_dimension]] + [out_dims[d] for d in dn.output_spatial_dimensions]
    row_static = [out_t.shape[dn.output_batch_dimension] if not out_t.is_dynamic_dim(dn.output_batch_dimension) else None] + [
        out_t.shape[d] if not out_t.is_dynamic_dim(d) else None for d in dn.output_spatial_dimensions]
    shape = ["?" if s is None else str(s) for s in row_static] + [str(rhs_t.shape[d]) for d in window]
    patches_type = f"tensor<{'x'.join(shape)}x{elem}>"
    patches = _copy_windows(t, padded, padded_type, lhs, patches_type, [r for r, s in zip(rows, row_static) if s is None], elem)
    # [b, o..., out features], then into the output's layout
    product_dims = [dn.output_batch_dimension, *dn.output_spatial_dimensions, dn.output_feature_dimension]
    product_type = f"tensor<{'x'.join('?' if out_t.is_dynamic_dim(d) else str(out_t.shape[d]) for d in product_dims)}x{elem}>"
    contracting = ", ".join(str(d) for d in range(n + 1, rank))
    product = t(f"stablehlo.dot_general {patches}, %a1, contracting_dims = [{contracting}] x [{', '.join(map(str, window))}] "
                f": ({patches_type}, {rhs_t}) -> {product_type}")
    perm = [product_dims.index(d) for d in range(out_t.rank)]
    if perm == sorted(perm):
        return t(f"tensor.cast {product} : {product_type} to {out_t}") if product_type != str(out_t) else product
    return t(f"stablehlo.transpose {product}, dims = [{', '.join(map(str, perm))}] : ({product_type}) -> {out_t}")


def _copy_windows(t: Text, padded: str, padded_type: str, read: list[str], patches_type: str, dynamic_sizes: list[str],
                  elem: str) -> str:
    """The patch matrix: one linalg.generic over its dims (d0, d1, ...) copying padded[read]."""
    rank = ir.RankedTensorType(ir.Type.parse(patches_type)).rank
    all_dims = ", ".join(f"d{i}" for i in range(rank))
    empty = t(f"tensor.empty({', '.join(dynamic_sizes)}) : {patches_type}")
    patches = t.fresh("patches")
    parallel = ", ".join(['"parallel"'] * rank)
    t.emit(f"{patches} = linalg.generic {{indexing_maps = [affine_map<({all_dims}) -> ({', '.join(read)})>, "
           f"affine_map<({all_dims}) -> ({all_dims})>], iterator_types = [{parallel}]}} "
           f"ins({padded} : {padded_type}) outs({empty} : {patches_type}) {{\n"
           f"^bb0(%x: {elem}, %o: {elem}):\n  linalg.yield %x : {elem}\n}} -> {patches_type}")
    return patches


def _channels_first(dn, n: int) -> bool:
    """PyTorch's layout, up to three spatial dims: input and output [batch, features, spatial...],
    kernel [out, in, spatial...]."""
    spatial = list(range(2, n + 2))
    return n <= 3 and (dn.input_batch_dimension, dn.input_feature_dimension, list(dn.input_spatial_dimensions)) == (0, 1, spatial) and (
        dn.kernel_output_feature_dimension, dn.kernel_input_feature_dimension, list(dn.kernel_spatial_dimensions)) == (0, 1, spatial) and (
        dn.output_batch_dimension, dn.output_feature_dimension, list(dn.output_spatial_dimensions)) == (0, 1, spatial)


def _conv_call(t: Text, op: ir.Operation, in_dims: list[str], out_dims: list[str], strides: list[int], padding: list[int],
               lhs_dil: list[int], rhs_dil: list[int], elem: str) -> str:
    """A channels-first convolution through the RAL (`disc_ral_conv_*`, see ral/ral.h): the input
    and kernel read as stored, the output [batch, out features, positions] written in place; the
    padding and input dilation happen as the RAL copies patch blocks into cache."""
    lhs_t, rhs_t, out_t = (ir.RankedTensorType(v.type) for v in (op.operands[0], op.operands[1], op.result))
    n = out_t.rank - 2
    out_features = rhs_t.shape[0]

    def spatial(values: list, fill: int) -> list[str]:  # three spatial dims, leading ones of size 1
        return [t.const(v) if isinstance(v, int) else v for v in [fill] * (3 - n) + values]

    positions = t.const(1)
    for d in out_dims[2:]:
        positions = t(f"arith.muli {positions}, {d} : index")
    x, x_type = contiguous_buffer(t, "%a0", lhs_t, elem)
    w, w_type = contiguous_buffer(t, "%a1", rhs_t, elem)
    result_mtype = f"memref<?x{out_features}x?x{elem}>"
    result = t(f"memref.alloc({out_dims[0]}, {positions}) : {result_mtype}")
    sizes = [out_dims[0], in_dims[1], t.const(rhs_t.shape[1]), t.const(out_features)]  # the input's features, the kernel's
    geometry = (spatial(in_dims[2:], 1) + spatial(out_dims[2:], 1) + spatial(list(rhs_t.shape[2:]), 1) + spatial(strides, 1)
                + spatial(padding[::2], 0) + spatial(lhs_dil, 1) + spatial(rhs_dil, 1))
    ints = [t(f"arith.index_cast {v} : index to i64") for v in sizes + geometry]
    pointers = [pointer(t, x, x_type, elem)[0], pointer(t, w, w_type, elem)[0], pointer(t, result, result_mtype, elem)[0]]
    fn = f"disc_ral_conv_{elem}"
    sig = f"({', '.join(['i64'] * 4 + ['!llvm.ptr'] * 3 + ['i64'] * 21)}) -> ()"
    t.emit(f"func.call @{fn}({', '.join(ints[:4] + pointers + ints[4:])}) : {sig}")
    t.declarations.append(f"func.func private @{fn}{sig.replace(' -> ()', '')}")
    flat = t(f"bufferization.to_tensor {result} restrict writable : {result_mtype} to tensor<?x{out_features}x?x{elem}>")
    flat_type = f"tensor<?x{out_features}x{'?' if any(out_t.is_dynamic_dim(2 + s) for s in range(n)) else _static_product(out_t.shape[2:])}x{elem}>"
    if flat_type != f"tensor<?x{out_features}x?x{elem}>":  # static positions
        flat = t(f"tensor.cast {flat} : tensor<?x{out_features}x?x{elem}> to {flat_type}")
    shape = ", ".join([out_dims[0], str(out_features)] + [str(out_t.shape[d]) if not out_t.is_dynamic_dim(d) else out_dims[d]
                                                           for d in range(2, out_t.rank)])
    expanded = f"tensor<?x{out_features}x{''.join(('?' if out_t.is_dynamic_dim(2 + s) else str(out_t.shape[2 + s])) + 'x' for s in range(n))}{elem}>"
    value = t(f"tensor.expand_shape {flat} [[0], [1], [{', '.join(str(2 + s) for s in range(n))}]] output_shape [{shape}] "
              f": {flat_type} into {expanded}")
    return t(f"tensor.cast {value} : {expanded} to {out_t}") if expanded != str(out_t) else value


def reverse_kernels(module: ir.Module) -> int:
    """A convolution with window reversal becomes one of the kernel reversed along those spatial
    dims (`stablehlo.reverse`, which takes any dims, dynamic too): the convolution's lowerings
    then see no reversal. Returns how many."""
    count = 0
    for op in walk(module.operation):
        if op.name not in ("stablehlo.convolution", "stablehlo.dynamic_conv") or "window_reversal" not in op.attributes:
            continue
        reversal = [bool(x) for x in ir.DenseBoolArrayAttr(op.attributes["window_reversal"])]
        if any(reversal):
            dn = _stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
            dims = [d for d, r in zip(dn.kernel_spatial_dimensions, reversal) if r]
            with ir.InsertionPoint(op), op.location:
                kernel = create_value("stablehlo.reverse", [op.operands[1]], op.operands[1].type,
                                      dimensions=ir.DenseI64ArrayAttr.get(dims))
            op.operands[1] = kernel
            count += 1
        del op.attributes["window_reversal"]
    return count
