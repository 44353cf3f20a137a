"""Transposes moved below slices.

A transpose is a copy; a slice, and a reshape that merges and splits runs of dims (`segments`),
are views of their operand's buffer. `nn.MultiheadAttention` unflattens its packed input
projection, transposes it ([seq, batch, 3, dim] to [3, seq, batch, 1, dim]) and slices queries,
keys and values out of the transpose: a copy of the whole projection just to take its three
parts. Here a transpose whose uses are slices (directly, or through a reshape whose uses are)
moves below them, each slice taking its part of the transpose's operand; a transpose that only
moves dims of size 1 is a reshape (a view); two transposes in a row are one, and one that keeps
every dim in place is nothing. A transpose that stays is copied where it stands, after the
slices: no more data than before (a slice's part), and a GEMM may read it in place
(`library_calls._fold_transpose`)."""

from __future__ import annotations

from torch_mlir import ir

from ..bounded_dynamism.analysis import ShapeFacts, find_segments, segments, set_segments
from ..bounded_dynamism.symbolic import Dim
from ..mlir_support import create_value, index_constant, int_constant, int_list, operation, walk

SLICES = ("stablehlo.slice", "stablehlo.real_dynamic_slice", "stablehlo.dynamic_slice")
_DIM_READS = ("tensor.dim", "stablehlo.get_dimension_size")


def transposes_below_slices(module: ir.Module) -> int:
    """Moves every transpose below the slices of it (see the module docstring), pass after pass
    until one changes nothing; returns the number of rewrites."""
    moves = 0
    while done := sum(map(_rewrite, [op for op in walk(module.operation) if op.name == "stablehlo.transpose"])):
        moves += done
    return moves


def _rewrite(op: ir.Operation) -> bool:
    """One rewrite of a transpose, if any applies (it erases only `op` of the transposes, so the
    others of a pass stay valid)."""
    perm = int_list(op, "permutation")
    _dims_read_before(op, perm)
    users = [operation(use.owner) for use in op.result.uses]
    if perm == list(range(len(perm))):
        op.result.replace_all_uses_with(op.operands[0])
    elif len(users) == 1 and users[0].name == "stablehlo.transpose":
        later = int_list(users[0], "permutation")
        users[0].operands[0] = op.operands[0]
        users[0].attributes["permutation"] = ir.DenseI64ArrayAttr.get([perm[p] for p in later])
    elif _moves_units_only(op):
        _as_reshape(op)
    elif users and all(u.name in SLICES for u in users):
        for u in users:
            _below_slice(op, u)
    elif not (len(users) == 1 and (segs := _segments_of(users[0])) is not None
              and all(use.owner.name in SLICES + _DIM_READS for use in users[0].result.uses)
              and _below_reshape(op, users[0], segs)):
        return False
    op.erase()
    return True


def _moves_units_only(transpose: ir.Operation) -> bool:
    xt, perm = ir.RankedTensorType(transpose.operands[0].type), int_list(transpose, "permutation")
    wide = [p for p in perm if not _unit(xt, p)]
    return wide == sorted(wide)


def _as_reshape(transpose: ir.Operation) -> None:
    """A transpose that only moves size-1 dims as the reshape it is: each dim larger than 1 with
    the size-1 dims before it (those after the last join it) is one segment."""
    x, perm = transpose.operands[0], int_list(transpose, "permutation")
    xt, zt = ir.RankedTensorType(x.type), ir.RankedTensorType(transpose.result.type)
    wide_x = [d for d in range(xt.rank) if not _unit(xt, d)]
    wide_z = [d for d in range(zt.rank) if not _unit(zt, d)]
    with ir.InsertionPoint(transpose), transpose.location:
        if zt.has_static_shape:
            out = create_value("stablehlo.reshape", [x], zt)
        else:
            sizes = [create_value("tensor.dim", [x, index_constant(p)], ir.IndexType.get()) for p in perm]
            shape = create_value("tensor.from_elements", sizes, ir.RankedTensorType.get([zt.rank], ir.IndexType.get()))
            out = create_value("stablehlo.dynamic_reshape", [x, shape], zt)
            if wide_x:
                bounds = list(zip([0] + [d + 1 for d in wide_x[:-1]], wide_x[:-1] + [xt.rank - 1]))
                zbounds = list(zip([0] + [d + 1 for d in wide_z[:-1]], wide_z[:-1] + [zt.rank - 1]))
                set_segments(out.owner, [(list(range(a, b + 1)), list(range(c, e + 1))) for (a, b), (c, e) in zip(bounds, zbounds)])
    transpose.result.replace_all_uses_with(out)


def _dims_read_before(transpose: ir.Operation, perm: list[int]) -> None:
    """Sizes of the transpose's dims read from its operand instead (dim d is the operand's perm[d])."""
    x = transpose.operands[0]
    for use in list(transpose.result.uses):
        user = operation(use.owner)
        if user.name == _DIM_READS[1]:
            d = ir.IntegerAttr(user.attributes["dimension"]).value
            user.attributes["dimension"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), perm[d])
            user.operands[0] = x
        elif user.name == _DIM_READS[0] and (d := int_constant(user.operands[1])) is not None:
            with ir.InsertionPoint(user), user.location:
                user.operands[1] = index_constant(perm[d])
            user.operands[0] = x


def _segments_of(op: ir.Operation) -> list[tuple[list[int], list[int]]] | None:
    """A reshape's segments: proven by the analysis (dynamic), or read from the static shapes."""
    if op.name == "stablehlo.dynamic_reshape":
        return segments(op)
    if op.name != "stablehlo.reshape":
        return None
    src, dst = (ir.RankedTensorType(v.type).shape for v in (op.operands[0], op.result))
    return find_segments(ShapeFacts(), [Dim.const(d) for d in src], [Dim.const(d) for d in dst])


def _unit(t: ir.RankedTensorType, d: int) -> bool:
    return not t.is_dynamic_dim(d) and t.shape[d] == 1


def _below_reshape(transpose: ir.Operation, reshape: ir.Operation, segs: list[tuple[list[int], list[int]]]) -> bool:
    """reshape(transpose(x)) as transpose'(reshape'(x)), when each segment's dims of x larger
    than 1 follow each other in x in the segment's order (x's size-1 dims aside): reshape'
    merges and splits those runs of x, in x's order (size-1 dims of x join the run after them,
    or the last), and transpose' puts the segments in the reshape's order. Returns whether the
    dims allowed it."""
    x = transpose.operands[0]
    xt, zt, perm = ir.RankedTensorType(x.type), ir.RankedTensorType(reshape.result.type), int_list(transpose, "permutation")
    wide = [d for d in range(xt.rank) if not _unit(xt, d)]
    blocks = [[perm[d] for d in src if not _unit(xt, perm[d])] for src, _ in segs]
    for b in blocks:
        if b and b != wide[wide.index(b[0]):wide.index(b[0]) + len(b)]:
            return False
    order = sorted((s for s, b in enumerate(blocks) if b), key=lambda s: blocks[s][0])
    if not order:
        return False
    ones = [d for s, b in enumerate(blocks) if not b for d in segs[s][1]]  # dims of size-1 segments: to the last
    w_dims, new_segs, start = [], [], 0
    for i, s in enumerate(order):
        end = blocks[s][-1] + 1 if i < len(order) - 1 else xt.rank
        dst = segs[s][1] + (ones if i == len(order) - 1 else [])
        new_segs.append((list(range(start, end)), list(range(len(w_dims), len(w_dims) + len(dst)))))
        w_dims += dst
        start = end
    wt = ir.RankedTensorType.get([zt.shape[d] for d in w_dims], zt.element_type)
    with ir.InsertionPoint(reshape), reshape.location:
        if reshape.name == "stablehlo.dynamic_reshape":
            w = create_value("stablehlo.dynamic_reshape", [x, _picked(reshape.operands[1], w_dims)], wt)
            set_segments(w.owner, new_segs)
        else:
            w = create_value("stablehlo.reshape", [x], wt)
        out = create_value("stablehlo.transpose", [w], zt, permutation=ir.DenseI64ArrayAttr.get([w_dims.index(d) for d in range(zt.rank)]))
    reshape.result.replace_all_uses_with(out)
    reshape.erase()
    return True


def _below_slice(transpose: ir.Operation, slice_: ir.Operation) -> None:
    """slice(transpose(x)) as transpose(slice'(x)), slice' taking each dim's part of x."""
    x = transpose.operands[0]
    perm = int_list(transpose, "permutation")
    inv = [perm.index(k) for k in range(len(perm))]  # x dim k is the transpose's dim inv[k]
    zt = ir.RankedTensorType(slice_.result.type)
    st = ir.RankedTensorType.get([zt.shape[i] for i in inv], zt.element_type)
    attrs = {name: slice_.attributes[name] for name in slice_.attributes}
    for name in ("start_indices", "limit_indices", "strides", "slice_sizes"):
        if name in attrs:
            attrs[name] = ir.DenseI64ArrayAttr.get([int_list(slice_, name)[i] for i in inv])
    with ir.InsertionPoint(slice_), slice_.location:
        if slice_.name == "stablehlo.real_dynamic_slice":
            operands = [x] + [_picked(v, inv) for v in list(slice_.operands)[1:]]
        elif slice_.name == "stablehlo.dynamic_slice":
            starts = list(slice_.operands)[1:]
            operands = [x] + [starts[i] for i in inv]
        else:
            operands = [x]
        part = ir.Operation.create(slice_.name, results=[st], operands=operands, attributes=attrs).result
        out = create_value("stablehlo.transpose", [part], zt, permutation=ir.DenseI64ArrayAttr.get(perm))
    slice_.result.replace_all_uses_with(out)
    slice_.erase()


def _picked(v: ir.Value, order: list[int]) -> ir.Value:
    """The 1-D tensor of `v`'s elements `order[0]`, `order[1]`, ... (a shape or a slice's bounds)."""
    t = ir.RankedTensorType(v.type)
    out_t = ir.RankedTensorType.get([len(order)], t.element_type)
    if not isinstance(v.owner, ir.Block) and v.owner.name in ("stablehlo.constant", "arith.constant"):
        values = [int(e) for e in ir.DenseIntElementsAttr(v.owner.attributes["value"])]
        return create_value(v.owner.name, [], out_t, value=ir.Attribute.parse(f"dense<{[values[i] for i in order]}> : {out_t}"))
    elements = [create_value("tensor.extract", [v, index_constant(i)], t.element_type) for i in order]
    return create_value("tensor.from_elements", elements, out_t)
