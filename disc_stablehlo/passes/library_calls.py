"""Compute-intensive ops go to vendor libraries through the RAL (as in BladeDISC): f32/f64
`dot_general` becomes a batched GEMM call on [batch, inner, m, k] x [batch, inner, k, n] views
with strides of their own, writing [batch, inner, m, n] (contiguous, or into the transposed
result that is the product's only use). A right operand broadcast along the batch (a weight)
is read once for every batch entry (batch stride 0), or, when the left operand's batch entries
are contiguous, the batch becomes rows of one GEMM."""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from ..bounded_dynamism.analysis import reassociation
from ..mlir_support import broadcast_like, call_target, create_value, int_list, walk
from ..ops import ELEMENTWISE, GROUPED_GEMM_TARGET
from .lower import LoweringState, Text, register_rewrite, register_template

GEMM_ELEMENT_TYPES = frozenset({"f32", "f64"})
ELEMENT_BYTES = {"i32": 4, "i64": 8, "f32": 4, "f64": 8, "complex<f32>": 8, "complex<f64>": 16}  # of the buffers library calls take
STRIDED_RESULT_ATTR = "disc.strided_result"  # on a GEMM call that writes into a transposed result


def pointer(t: Text, buffer: str, btype: str, elem: str) -> tuple[str, list[str]]:
    """The address of a buffer's first element and its strides (in elements), read from the
    buffer itself: bufferization may hand a view (a slice) where an identity layout was asked
    for, so neither the offset nor the strides are assumed."""
    rank = ir.MemRefType(ir.Type.parse(btype)).rank
    meta = t.fresh("meta")
    sizes = ", ".join(["index"] * (1 + 2 * rank))
    t.emit(f"{meta}:{2 + 2 * rank} = memref.extract_strided_metadata {buffer} : {btype} -> memref<{elem}>, {sizes}")
    base = t(f"memref.extract_aligned_pointer_as_index {meta}#0 : memref<{elem}> -> index")
    first = t(f"arith.addi {base}, {t(f'arith.muli {meta}#1, {t.const(ELEMENT_BYTES[elem])} : index')} : index")
    address = t(f"llvm.inttoptr {t(f'arith.index_cast {first} : index to i64')} : i64 to !llvm.ptr")
    return address, [f"{meta}#{2 + rank + i}" for i in range(rank)]


def _product(t: Text, dims: list[str]) -> str:
    acc = t.const(1)
    for d in dims:
        acc = t(f"arith.muli {acc}, {d} : index")
    return acc


def keep_reads_at_their_calls(module: ir.Module) -> None:
    """A library call reads its operands through a `bufferization.to_buffer` of its own, just
    before the call: one-shot bufferization takes that op as the read. CSE would merge two
    reads of one tensor into the first, and an op writing in place between the two calls could
    then overwrite the buffer the second call still reads (attention whose queries are scaled
    three ways): each read gets a distinct attribute, so none merges with another."""
    reads = [op for op in walk(module.operation) if op.name == "bufferization.to_buffer"]
    for i, op in enumerate(reads):
        op.attributes["disc.read"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), i)


def _memref_type(vtype: ir.Type, elem: str, strided: bool = False) -> str:
    """The memref type of a tensor type's shape: row-major, or (`strided`) with strides and
    offset known only at run time."""
    rt = ir.RankedTensorType(vtype)
    layout = f", strided<[{', '.join('?' * rt.rank)}], offset: ?>" if strided else ""
    return f"memref<{''.join(('?' if rt.is_dynamic_dim(i) else str(rt.shape[i])) + 'x' for i in range(rt.rank))}{elem}{layout}>"


def identity_buffer(t: Text, value: str, vtype: ir.Type, elem: str) -> tuple[str, str]:
    """`value` as a buffer of the row-major type. Bufferization may still hand a view there (a
    slice whose strides are not known at compile time, as a cast it does not check): read its
    strides (`pointer`), or flatten it first (`contiguous_buffer`)."""
    mtype = _memref_type(vtype, elem)
    return t(f"bufferization.to_buffer {value} read_only : {vtype} to {mtype}"), mtype


def strided_buffer(t: Text, value: str, vtype: ir.Type, elem: str) -> tuple[str, str]:
    """`value`'s buffer as it is, a view at any strides (read them with `pointer`): no copy."""
    mtype = _memref_type(vtype, elem, strided=True)
    return t(f"bufferization.to_buffer {value} read_only : {vtype} to {mtype}"), mtype


def contiguous_buffer(t: Text, value: str, vtype: ir.Type, elem: str) -> tuple[str, str]:
    """`value`'s elements in row-major order, as a 1-D buffer: a reshape's operand must be
    contiguous, so bufferization copies a view (a slice) and passes anything else as it is."""
    count = _product(t, t.dims(value, vtype))
    flat = t(f"tensor.reshape {value}({t(f'tensor.from_elements {count} : tensor<1xindex>')}) : "
             f"({vtype}, tensor<1xindex>) -> tensor<?x{elem}>")
    return identity_buffer(t, flat, ir.Type.parse(f"tensor<?x{elem}>"), elem)


def _operand(t: Text, value: str, vtype: ir.Type, groups: list[list[int]], elem: str,
             inner: str) -> tuple[str, list[str], list[str]]:
    """A GEMM operand: its address, the element strides of the outer batch level, the inner
    batch level (`inner` entries), its rows and its columns, and the sizes of the three groups
    (batch dims, then the dims of its rows and of its columns). Groups of at most one dim each
    (two for the batch) are read in place at their strides, whatever their order in memory (a
    transposed view, e.g. the heads of [batch, seq, heads, dim], costs no copy); otherwise the
    operand is transposed so each group is contiguous and reshaped to 3-D."""
    rt = ir.RankedTensorType(vtype)
    dims = t.dims(value, vtype)
    batch, rows, cols = groups
    perm = batch + rows + cols
    if (perm != list(range(rt.rank)) and len(batch) <= 2 and len(rows) <= 1 and len(cols) <= 1
            and rt.rank - 1 in rows + cols):  # the contiguous dim is the rows' or the columns'
        address, strides = pointer(t, *strided_buffer(t, value, vtype, elem), elem)
        zero = t.const(0)
        outer, inner_stride = ([zero, zero] + [strides[d] for d in batch])[-2:]
        rows_stride, cols_stride = (strides[g[0]] if g else zero for g in (rows, cols))
        sizes = [_product(t, [dims[d] for d in g]) for g in groups]
        return address, [outer, inner_stride, rows_stride, cols_stride], sizes
    ttype = str(vtype)
    if perm != list(range(rt.rank)):
        ttype = f"tensor<{''.join(f'{rt.shape[p] if not rt.is_dynamic_dim(p) else chr(63)}x' for p in perm)}{elem}>"
        value = t(f"stablehlo.transpose {value}, dims = {perm} : ({vtype}) -> {ttype}")
    sizes = [_product(t, [dims[d] for d in g]) for g in groups]
    shape = t(f"tensor.from_elements {', '.join(sizes)} : tensor<3xindex>")
    flat = t(f"tensor.reshape {value}({shape}) : ({ttype}, tensor<3xindex>) -> tensor<?x?x?x{elem}>")
    address, strides = pointer(t, *identity_buffer(t, flat, ir.Type.parse(f"tensor<?x?x?x{elem}>"), elem), elem)
    batch_strides = [t(f"arith.muli {strides[0]}, {inner} : index"), strides[0]] if batch else [t.const(0)] * 2
    return address, [*batch_strides, strides[1], strides[2]], sizes


def _unflatten(t: Text, c: str, elem: str, out_t: ir.RankedTensorType, group_sizes: list[int], out_dims: list[str]) -> str:
    """The [batch, m, n] product as the result's dims: size-1 dims of empty groups collapse away,
    the rest expand into their groups (reshapes whose result dims fold to `out_dims`, so loops
    over the result get the same bounds as loops over its operands)."""
    starts = [sum(group_sizes[:i]) for i in range(3)]
    kept = [i for i in range(3) if group_sizes[i]]
    collapse, current = [], []
    for i in range(3):  # every empty group joins the next kept dim (the last kept one, at the end)
        current.append(i)
        if group_sizes[i]:
            collapse.append(current)
            current = []
    if current and collapse:
        collapse[-1] += current
    sizes = []
    for g in kept:
        dims = [out_t.shape[d] for d in range(starts[g], starts[g] + group_sizes[g])]
        sizes.append("?" if any(out_t.is_dynamic_dim(d) for d in range(starts[g], starts[g] + group_sizes[g]))
                     else str(_static_product(dims)))
    collapsed_dyn = f"tensor<{'?x' * len(kept)}{elem}>"
    flat = t(f"tensor.collapse_shape {c} {collapse} : tensor<?x?x?x{elem}> into {collapsed_dyn}")
    if not kept:
        return flat
    collapsed = f"tensor<{''.join(x + 'x' for x in sizes)}{elem}>"
    if collapsed != collapsed_dyn:
        flat = t(f"tensor.cast {flat} : {collapsed_dyn} to {collapsed}")
    expand = [list(range(starts[g], starts[g] + group_sizes[g])) for g in kept]
    shape = ", ".join(str(out_t.shape[d]) if not out_t.is_dynamic_dim(d) else out_dims[d] for d in range(out_t.rank))
    return t(f"tensor.expand_shape {flat} {expand} output_shape [{shape}] : {collapsed} into {out_t}")


def _static_product(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _is_blas_dot(op: ir.Operation) -> bool:
    """f32/f64 dots go to the BLAS; other element types to the upstream conversion's loops."""
    types = {str(ir.RankedTensorType(v.type).element_type) for v in [*op.operands, op.result]}
    return len(types) == 1 and types <= GEMM_ELEMENT_TYPES


# A GEMM reads a transposed operand in place unless its rows (or columns) are short runs of fewer
# than FOLD_MIN_RUN contiguous elements lying more than FOLD_MAX_STRIDE elements apart (or apart
# by a multiple of a dynamic dim): each such run is a cache line or a few on a page of its own, and
# packing them costs more than copying them once. The heads of a sequence-first attention,
# [seq, batch, heads, 64] with one entry's rows batch * 768 floats apart, took ViT-B's attention
# products 1.2 ms per layer longer at batch 4 than a copy did; rows of 768 floats read in place
# (a transposed activation as a projection's input) cost nothing extra.
FOLD_MIN_RUN = 256
FOLD_MAX_STRIDE = 1 << 14


def _fold_transpose(op: ir.Operation, side: int, batch: list[int], contracting: list[int]) -> tuple[list[int], list[int]]:
    """A transposed operand is read through the transpose (the GEMM takes any strides): the dims
    map back to the transpose's input, when its free dims keep their order (they order the
    result's dims) and its rows or columns are not short runs far apart (FOLD_MIN_RUN). Returns
    the operand's batch and contracting dims after the fold."""
    v = _through_same_dims(op.operands[side])
    if isinstance(v.owner, ir.Block) or v.owner.name != "stablehlo.transpose":
        return batch, contracting
    perm = list(ir.DenseI64ArrayAttr(v.owner.attributes["permutation"]))
    free = [perm[d] for d in range(len(perm)) if d not in batch + contracting]
    if free != sorted(free):
        return batch, contracting
    xt = ir.RankedTensorType(v.owner.operands[0].type)
    if not xt.is_dynamic_dim(xt.rank - 1) and xt.shape[-1] < FOLD_MIN_RUN:
        for d in free + [perm[d] for d in contracting]:
            after = range(d + 1, xt.rank)
            if d != xt.rank - 1 and (any(xt.is_dynamic_dim(i) for i in after) or _static_product([xt.shape[i] for i in after]) > FOLD_MAX_STRIDE):
                return batch, contracting
    op.operands[side] = v.owner.operands[0]
    return [perm[d] for d in batch], [perm[d] for d in contracting]


def _same_dims(op: ir.Operation) -> bool:
    """A broadcast that maps every dim onto itself and expands none, or a reshape the analysis
    proved to keep every dim: its result is its operand."""
    if op.name == "stablehlo.dynamic_reshape":
        groups = reassociation(op)
        return groups is not None and len(groups) == ir.RankedTensorType(op.operands[0].type).rank == ir.RankedTensorType(op.result.type).rank
    dims = _broadcast_source_dims(op)  # None for every other op (a use may be a `func.return`)
    return dims is not None and dims == list(range(ir.RankedTensorType(op.result.type).rank))


def _through_same_dims(v: ir.Value) -> ir.Value:
    """`v` before the broadcasts and reshapes that keep every dim (`_same_dims`)."""
    while not isinstance(v.owner, ir.Block) and _same_dims(v.owner):
        v = v.owner.operands[0]
    return v


def _is_scalar(v: ir.Value) -> bool:
    """A rank-0 value, a broadcast of one or a splat constant."""
    if ir.RankedTensorType(v.type).rank == 0:
        return True
    op = v.owner
    if isinstance(op, ir.Block):
        return False
    if op.name in ("stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim"):
        return ir.RankedTensorType(op.operands[0].type).rank == 0
    return op.name == "stablehlo.constant" and _splat(op) is not None


def _splat(constant: ir.Operation) -> ir.Attribute | None:
    """The value of a splat constant's elements; None when its elements differ, live in a
    resource or have no attribute of their own (complex)."""
    try:
        attr = constant.attributes["value"]
        return attr.get_splat_value() if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat else None
    except (TypeError, ValueError):
        return None


def _scalar_like(v: ir.Value, like: ir.Value) -> ir.Value:
    """A scalar operand (`_is_scalar`) for an op on `like` instead: the same rank-0 value, or
    its value broadcast to `like`'s shape."""
    if ir.RankedTensorType(v.type).rank == 0:
        return v
    elem = ir.RankedTensorType(v.type).element_type
    if v.owner.name == "stablehlo.constant":
        scalar_t = ir.RankedTensorType.get([], elem)
        scalar = create_value("stablehlo.constant", [], scalar_t, value=ir.DenseElementsAttr.get_splat(scalar_t, _splat(v.owner)))
    else:
        scalar = v.owner.operands[0]
    return broadcast_like(scalar, like)


def _scalar_op_of_transpose(op: ir.Operation) -> tuple[int, list[ir.Operation]] | None:
    """For an elementwise op on scalars and one tensor that is a transpose used there alone
    (through broadcasts and reshapes that keep every dim): that operand's position, and the ops
    from the operand back to the transpose."""
    name = op.name.removeprefix("stablehlo.")
    if name not in ELEMENTWISE or name == "bitcast_convert":
        return None
    tensors = [i for i, v in enumerate(op.operands) if not _is_scalar(v)]
    if len(tensors) != 1:
        return None
    chain, v = [], op.operands[tensors[0]]
    while not isinstance(v.owner, ir.Block) and len(list(v.uses)) == 1:
        chain.append(v.owner)
        if v.owner.name == "stablehlo.transpose":
            return tensors[0], chain
        if not _same_dims(v.owner):
            return None
        v = v.owner.operands[0]
    return None


def transposes_below_scalar_ops(module: ir.Module) -> None:
    """An elementwise op on one transposed tensor and scalars runs before the transpose instead:
    op(transpose(x), c) is transpose(op(x, c)). The op then fuses with what makes x (a GEMM's
    epilogue), and a GEMM reading the result reads through the transpose (`_fold_transpose`)
    with no copy: attention's queries scaled after the heads' transpose. Ops are visited in
    order, producers first, so a chain of such ops moves its transpose to its end, one op at a
    time (the ops a rewrite erases were visited before it)."""
    for op in walk(module.operation):
        if (match := _scalar_op_of_transpose(op)) is None:
            continue
        position, chain = match
        x = chain[-1].operands[0]
        with ir.InsertionPoint(op), op.location:
            operands = [x if i == position else _scalar_like(v, x) for i, v in enumerate(op.operands)]
            result_t = ir.RankedTensorType.get(ir.RankedTensorType(x.type).shape, ir.RankedTensorType(op.result.type).element_type)
            moved = ir.Operation.create(op.name, results=[result_t], operands=operands,
                                        attributes={name: op.attributes[name] for name in op.attributes}).result
            out = create_value("stablehlo.transpose", [moved], op.result.type, permutation=chain[-1].attributes["permutation"])
        op.result.replace_all_uses_with(out)
        op.erase()
        for dead in chain:
            dead.erase()


def _broadcast_source_dims(op: ir.Operation, expanded: int | None = None) -> list[int] | None:
    """The result dims a broadcast maps its operand's dims onto, when it expands none of them
    (it only adds dims) other than result dim `expanded`."""
    if op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim"):
        return None
    dims = int_list(op, "broadcast_dimensions")
    in_t, out_t = ir.RankedTensorType(op.operands[0].type), ir.RankedTensorType(op.result.type)
    kept = set(int_list(op, "known_nonexpanding_dimensions"))
    if all(d == expanded or i in kept or (not in_t.is_dynamic_dim(i) and not out_t.is_dynamic_dim(d) and in_t.shape[i] == out_t.shape[d])
           for i, d in enumerate(dims)):
        return dims
    return None


def _fold_batch_broadcast(op: ir.Operation, batch: list[int], contracting: list[int]) -> list[int] | None:
    """A right operand that is a broadcast along the batch dims only (a weight shared by every
    batch entry: torch-mlir's `matmul` of [b, s, k] by [k, n]) is read as the broadcast's
    operand, without batch dims (the GEMM reads it with batch stride 0). Returns the right
    operand's contracting dims after the fold (None: no fold)."""
    if not batch:
        return None
    v = _through_same_dims(op.operands[1])
    if isinstance(v.owner, ir.Block):
        return None
    dims = _broadcast_source_dims(v.owner)
    if dims is None or dims != [d for d in range(ir.RankedTensorType(v.type).rank) if d not in batch]:
        return None
    op.operands[1] = v.owner.operands[0]
    return [dims.index(d) for d in contracting]


def _merged_pair(op: ir.Operation) -> int | None:
    """For a reshape the analysis proved to merge (or split) one pair of adjacent dims and keep
    every other: the first dim of the pair on its longer side."""
    groups = reassociation(op)
    if groups is None:
        return None
    pairs = [g[0] for g in groups if len(g) == 2]
    return pairs[0] if len(pairs) == 1 and all(len(g) <= 2 for g in groups) else None


def _fold_grouped_broadcast(op: ir.Operation, side: int, batch: list[int]) -> bool:
    """An operand whose inner batch dim (the last, h) merges dims g and r where r is a
    broadcast (grouped-query attention's `repeat_kv`: keys of [b, g, s, d] expanded to
    [b, g, r, s, d] and reshaped to [b, g * r, s, d]) is read before the broadcast: entry j of
    the inner batch level reads entry j / r of g (the GEMM's operand group). The broadcast adds r, or
    expands a size-1 dim that a reshape of the same operand inserted (`k[:, :, None]`); the
    operand becomes what the broadcast or that reshape read, with the dims of the product's."""
    if not batch:
        return False
    h, reshape = batch[-1], _through_same_dims(op.operands[side]).owner
    if _merged_pair(reshape) != h or ir.RankedTensorType(reshape.operands[0].type).rank != ir.RankedTensorType(reshape.result.type).rank + 1:
        return False
    broadcast = reshape.operands[0].owner
    if isinstance(broadcast, ir.Block) or (dims := _broadcast_source_dims(broadcast, expanded=h + 1)) is None:
        return False  # not a broadcast, or a dim other than r may expand too
    source = broadcast.operands[0]
    src_t, out_t = ir.RankedTensorType(source.type), ir.RankedTensorType(broadcast.result.type)
    if dims == [d for d in range(out_t.rank) if d != h + 1]:  # r is a new dim
        op.operands[side] = source
        return True
    unsqueeze = source.owner  # r expands the size-1 dim a reshape inserted
    if (dims != list(range(out_t.rank)) or src_t.is_dynamic_dim(h + 1) or src_t.shape[h + 1] != 1
            or _merged_pair(unsqueeze) not in (h, h + 1) or ir.RankedTensorType(unsqueeze.operands[0].type).rank != src_t.rank - 1):
        return False
    op.operands[side] = unsqueeze.operands[0]
    return True


@register_rewrite("stablehlo.dot_general", when=_is_blas_dot)
def _dot_general(op: ir.Operation, state: LoweringState) -> None:
    elem = str(ir.RankedTensorType(op.result.type).element_type)
    dn = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, lc = list(dn.lhs_batching_dimensions), list(dn.lhs_contracting_dimensions)
    rb, rc = list(dn.rhs_batching_dimensions), list(dn.rhs_contracting_dimensions)
    if (folded := _fold_batch_broadcast(op, rb, rc)) is not None:
        rb, rc = [], folded  # the right operand is the same for every batch entry: batch stride 0
    lb, lc = _fold_transpose(op, 0, lb, lc)
    rb, rc = _fold_transpose(op, 1, rb, rc)
    # one operand may be grouped (keys or values are; queries and scores are not)
    grouped = next((side for side, batch in ((1, rb), (0, lb)) if _fold_grouped_broadcast(op, side, batch)), None)
    if grouped == 0:  # the keys or values before the broadcast, e.g. heads transposed
        lb, lc = _fold_transpose(op, 0, lb, lc)
    elif grouped == 1:
        rb, rc = _fold_transpose(op, 1, rb, rc)
    lhs_t, rhs_t = (ir.RankedTensorType(v.type) for v in op.operands)
    lf = [d for d in range(lhs_t.rank) if d not in lb and d not in lc]
    if lb and not rb and lb + lf + lc == list(range(lhs_t.rank)):
        lb, lf = [], lb + lf  # and the left's batch entries follow each other in memory: one GEMM of all their rows
    rf = [d for d in range(rhs_t.rank) if d not in rb and d not in rc]
    t = Text()
    sides = [("%a0", lhs_t, lb), ("%a1", rhs_t, rb)]
    v, vt, batch = sides[1 if grouped == 0 else 0]  # the batch dims of an operand not grouped
    batch_dims = [t.dim(v, vt, d) for d in batch]
    one = t.const(1)
    inner = batch_dims[-1] if batch_dims else one  # the batch's last dim: its inner level
    inners, groups = [inner, inner], [one, one]
    if grouped is not None:  # entries of the grouped operand's inner level each serve `group` of the product's
        v, vt, batch = sides[grouped]
        inners[grouped] = t.dim(v, vt, batch[-1])
        groups[grouped] = t(f"arith.divsi {inner}, {t(f'arith.maxsi {inners[grouped]}, {one} : index')} : index")
    users, swap = _transposed_result(op, len(lb), len(lf), len(rf))
    consumer = users[0] if users else None
    # A x B, or with the operands swapped C^T = B^T x A^T (rows: the right operand's free dim)
    operands = [(0, [lb, lf, lc]), (1, [rb, rc, rf])] if not swap else [(1, [rb, rf, rc]), (0, [lb, lc, lf])]
    (pa, sa, (_, m, k)), (pb, sb, (_, _, n)) = (_operand(t, sides[i][0], sides[i][1], g, elem, inners[i]) for i, g in operands)
    gemm_groups = [groups[i] for i, _ in operands]
    out_dims = batch_dims + [t.dim("%a0", lhs_t, d) for d in lf] + [t.dim("%a1", rhs_t, d) for d in rf]
    b = _product(t, batch_dims)
    if consumer is None:  # C contiguous: [b, m, n], reshaped to the result's dims
        mc = t(f"memref.alloc({b}, {m}, {n}) : memref<?x?x?x{elem}>")
        ctype = f"memref<?x?x?x{elem}>"
        entry = t(f"arith.muli {m}, {n} : index")
        sc = [t(f"arith.muli {entry}, {inner} : index"), entry, n]
    else:  # C written in place into the transposed result: its dims at their strides there
        rt = ir.RankedTensorType(consumer.result.type)
        perm = list(ir.DenseI64ArrayAttr(consumer.attributes["permutation"]))
        rdims = [out_dims[p] for p in perm]
        ctype = _memref_type(rt, elem)
        mc = t(f"memref.alloc({', '.join(rdims[i] for i in range(rt.rank) if rt.is_dynamic_dim(i))}) : {ctype}")
        stride = {p: _product(t, rdims[i + 1:]) for i, p in enumerate(perm)}  # product dim -> stride in the result
        zero = t.const(0)
        rows = [len(lb) + len(lf)] if swap and rf else [len(lb)] if not swap and lf else []  # the product dim of C's rows
        sc = ([zero, zero] + [stride[d] for d in range(len(lb))])[-2:] + [stride[rows[0]] if rows else n]
    outer = t(f"arith.divsi {b}, {t(f'arith.maxsi {inner}, {one} : index')} : index")
    gemm_call(t, elem, [outer, inner, m, n, k], pa, sa[:2] + gemm_groups[:1] + sa[2:], pb, sb[:2] + gemm_groups[1:] + sb[2:],
              pointer(t, mc, ctype, elem)[0], sc, strided=consumer is not None)
    name = state.fresh_symbol("gemm")
    if consumer is None:
        dyn3 = f"tensor<?x?x?x{elem}>"
        c = t(f"bufferization.to_tensor {mc} restrict writable : {ctype} to {dyn3}")
        result = _unflatten(t, c, elem, ir.RankedTensorType(op.result.type), [len(lb), len(lf), len(rf)], out_dims)
    else:
        result = t(f"bufferization.to_tensor {mc} restrict writable : {ctype} to {consumer.result.type}")
    replaced = consumer or op
    t.emit(f"return {result} : {replaced.result.type}")
    state.replace_with_call(op, t.function(name, op, [replaced.result.type]), name, users)


def gemm_call(t: Text, elem: str, sizes: list[str], pa: str, sa: list[str], pb: str, sb: list[str], pc: str, sc: list[str],
              strided: bool = False) -> None:
    """Emits the RAL's batched GEMM: `sizes` [outer batch, inner batch, m, n, k] (index values),
    A, B and C by address with their element strides ([outer, inner, group, rows, columns] for
    A and B, each inner entry of which serves `group` consecutive entries of C's, and [outer,
    inner, rows] for C, whose columns are contiguous); `strided` when C is a transposed result no
    epilogue may read row by row."""
    ints = [t(f"arith.index_cast {d} : index to i64") for d in sizes + sa + sb + sc]
    fn = f"disc_ral_gemm_{elem}"
    sig = ("(i64, i64, i64, i64, i64, !llvm.ptr, i64, i64, i64, i64, i64, !llvm.ptr, i64, i64, i64, i64, i64, "
           "!llvm.ptr, i64, i64, i64) -> ()")
    args = ints[:5] + [pa] + ints[5:10] + [pb] + ints[10:15] + [pc] + ints[15:]
    t.emit(f"func.call @{fn}({', '.join(args)}){f' {{{STRIDED_RESULT_ATTR}}}' if strided else ''} : {sig}")
    t.declarations.append(f"func.func private @{fn}{sig.replace(' -> ()', '')}")


def _transposed_result(op: ir.Operation, batch: int, lhs_free: int, rhs_free: int) -> tuple[list[ir.Operation], bool]:
    """The transpose that is the product's only use (through broadcasts and reshapes that keep
    every dim, each the only use of the one before), when the GEMM can write its result in place:
    batch at most two dims, and a free dim of one operand that stays the innermost, the other's
    free dims at most one: the right operand's (C's columns), or the left's (the operands swap,
    C^T = B^T x A^T: JAX's attention context, [b, heads, dim, q] transposed to [b, q, heads,
    dim]). Returns those ops, the transpose first, and whether the operands swap; else none."""
    if batch > 2:
        return [], False
    chain, v = [], op.result
    while len(uses := list(v.uses)) == 1:
        consumer = uses[0].owner
        chain.insert(0, consumer)
        if consumer.name == "stablehlo.transpose":
            last = list(ir.DenseI64ArrayAttr(consumer.attributes["permutation"]))[-1]
            if rhs_free == 1 and lhs_free <= 1 and last == batch + lhs_free:
                return chain, False
            if lhs_free == 1 and rhs_free <= 1 and last == batch:
                return chain, True
            return [], False
        if not _same_dims(consumer):
            return [], False
        v = consumer.result
    return [], False


def _is_integer_dot(op: ir.Operation) -> bool:
    """Integer operands and result; booleans (whose product is `and` and sum `or`) excepted."""
    elems = [ir.RankedTensorType(v.type).element_type for v in [*op.operands, op.result]]
    return all(isinstance(e, ir.IntegerType) and ir.IntegerType(e).width > 1 for e in elems)


def _widen(t: Text, v: str, src: ir.IntegerType, dst: ir.IntegerType) -> str:
    """An integer operand converted to the product's type as StableHLO converts (unsigned zero-,
    signed and signless sign-extended)."""
    if src.width == dst.width:
        return v
    if src.width > dst.width:
        return t(f"arith.trunci {v} : i{src.width} to i{dst.width}")
    return t(f"arith.{'extui' if src.is_unsigned or src.width == 1 else 'extsi'} {v} : i{src.width} to i{dst.width}")


@register_template("stablehlo.dot_general", when=_is_integer_dot)
def _integer_dot(op, t: Text, state: LoweringState):
    """An integer dot_general (no BLAS has one) as one loop nest ordered for vectorisation:
    batch, the lhs's free dims, then, when the rhs's innermost dim is a free one, the contracted
    dims before the rhs's free dims (C[i, :] += A[i, k] * B[k, :]: a vector loop over the row),
    else after them (a dot product per element, vectorised as a reduction)."""
    dn = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, lc = list(dn.lhs_batching_dimensions), list(dn.lhs_contracting_dimensions)
    rb, rc = list(dn.rhs_batching_dimensions), list(dn.rhs_contracting_dimensions)
    lhs_t, rhs_t, out_t = (ir.RankedTensorType(v.type) for v in (*op.operands, op.result))
    lf = [d for d in range(lhs_t.rank) if d not in lb and d not in lc]
    rf = [d for d in range(rhs_t.rank) if d not in rb and d not in rc]
    row_inner = rhs_t.rank - 1 in rf
    # loop dims: batch, lhs free, then contracted / rhs free in the chosen order
    order = ["b"] * len(lb) + ["m"] * len(lf) + (["k"] * len(lc) + ["n"] * len(rf) if row_inner else ["n"] * len(rf) + ["k"] * len(lc))
    pos = {kind: [i for i, o in enumerate(order) if o == kind] for kind in "bmkn"}
    lhs_map, rhs_map = [None] * lhs_t.rank, [None] * rhs_t.rank
    for dims, loops in ((lb, pos["b"]), (lf, pos["m"]), (lc, pos["k"])):
        for d, loop in zip(dims, loops):
            lhs_map[d] = loop
    for dims, loops in ((rb, pos["b"]), (rf, pos["n"]), (rc, pos["k"])):
        for d, loop in zip(dims, loops):
            rhs_map[d] = loop
    out_map = pos["b"] + pos["m"] + pos["n"]
    domain = ", ".join(f"d{i}" for i in range(len(order)))

    def amap(loops: list[int]) -> str:
        return f"affine_map<({domain}) -> ({', '.join(f'd{i}' for i in loops)})>"
    out_dims = [t.dim("%a0", lhs_t, d) for d in lb + lf] + [t.dim("%a1", rhs_t, d) for d in rf]
    elem = out_t.element_type
    acc_type = f"i{elem.width}"
    ty = str(op.result.type)
    zero = t.const(0, str(elem)) if elem.is_signless else t(f"builtin.unrealized_conversion_cast {t.const(0, acc_type)} : {acc_type} to {elem}")
    init = t(f"linalg.fill ins({zero} : {elem}) outs({t.empty(op.result.type, out_dims)} : {ty}) -> {ty}")
    kinds = ", ".join('"reduction"' if o == "k" else '"parallel"' for o in order)
    res = t.fresh("dot")
    t.emit(f"{res} = linalg.generic {{indexing_maps = [{amap(lhs_map)}, {amap(rhs_map)}, {amap(out_map)}], "
           f"iterator_types = [{kinds}]}} ins(%a0, %a1 : {lhs_t}, {rhs_t}) outs({init} : {ty}) {{")
    le, re_ = lhs_t.element_type, rhs_t.element_type
    t.emit(f"^bb0(%x: {le}, %y: {re_}, %acc: {elem}):")
    signless = []
    for name, e in (("%x", le), ("%y", re_), ("%acc", elem)):
        signless.append(name if e.is_signless else t(f"builtin.unrealized_conversion_cast {name} : {e} to i{e.width}"))
    x = _widen(t, signless[0], ir.IntegerType(le), ir.IntegerType(elem))
    y = _widen(t, signless[1], ir.IntegerType(re_), ir.IntegerType(elem))
    total = t(f"arith.addi {signless[2]}, {t(f'arith.muli {x}, {y} : {acc_type}')} : {acc_type}")
    if not elem.is_signless:
        total = t(f"builtin.unrealized_conversion_cast {total} : {acc_type} to {elem}")
    t.emit(f"linalg.yield {total} : {elem}")
    t.emit(f"}} -> {ty}")
    return [res]


def _is_grouped_gemm(op: ir.Operation) -> bool:
    return call_target(op) == GROUPED_GEMM_TARGET


@register_template("stablehlo.custom_call", when=_is_grouped_gemm)
def _grouped_gemm(op, t: Text, state: LoweringState):
    """PyTorch's grouped GEMM of mixture-of-experts layers (import/torch_ops.py) as the RAL's
    `disc_ral_grouped_gemm_<f32|f64>` (on a GPU its device version), which checks the offsets;
    transposed weights (transformers' experts keep them [G, N, K]) are read through the transpose
    where a GEMM's operand would be (`_fold_transpose`), at their strides."""
    (group,), (contracted,) = _fold_transpose(op, 1, [0], [1])
    free = 3 - group - contracted
    x_t, w_t, o_t, r_t = (ir.RankedTensorType(v.type) for v in (*op.operands, op.result))
    elem = str(x_t.element_type)
    rows, k = t.dims("%a0", x_t)
    w_dims = t.dims("%a1", w_t)
    groups, wk, n = (w_dims[d] for d in (group, contracted, free))
    t.check(state, op, t(f"arith.cmpi ne, {k}, {wk} : index"), "the input has {0} columns, the weights {1} rows", k, wk)
    counted = t.dim("%a2", o_t, 0)
    t.check(state, op, t(f"arith.cmpi ne, {counted}, {groups} : index"), "{0} offsets for {1} groups of weights", counted, groups)
    pointers = [pointer(t, *contiguous_buffer(t, f"%a{i}", v.type, e), e)[0]
                for i, (v, e) in enumerate(zip(op.operands, (elem, elem, "i64")))]
    mtype = _memref_type(r_t, elem)
    out = t(f"memref.alloc({', '.join(d for d, dynamic in ((rows, r_t.is_dynamic_dim(0)), (n, r_t.is_dynamic_dim(1))) if dynamic)}) : {mtype}")
    w_strides = [_product(t, w_dims[d + 1:]) for d in range(3)]  # the weights' buffer is row-major
    ints = [t(f"arith.index_cast {d} : index to i64") for d in (rows, n, k, groups, *(w_strides[d] for d in (group, contracted, free)))]
    sig = "(i64, i64, i64, i64, !llvm.ptr, !llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr) -> ()"
    fn = f"disc_ral_grouped_gemm_{elem}"
    args = ints[:4] + pointers[:2] + ints[4:] + [pointers[2], pointer(t, out, mtype, elem)[0]]
    t.emit(f"func.call @{fn}({', '.join(args)}) : {sig}")
    t.declarations.append(f"func.func private @{fn}{sig.replace(' -> ()', '')}")
    return [t(f"bufferization.to_tensor {out} restrict writable : {mtype} to {r_t}")]
