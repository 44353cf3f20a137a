"""Templates for the StableHLO ops that the upstream StableHLO->linalg conversion leaves behind
on dynamic shapes (and for gather/scatter/sort, which it never converts). Each is written once,
for every rank and element type, over tensor / linalg / scf / arith."""

from __future__ import annotations

import bisect
import itertools
import math

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from ..bounded_dynamism.analysis import IOTA_INDICES_ATTR, segments
from ..mlir_support import call_target, int_list
from ..ops import ASSERT_TARGET
from .lower import LoweringState, Text, register_rewrite, register_template


def _rank(v: ir.Value) -> int:
    return ir.RankedTensorType(v.type).rank


def _elem(v: ir.Value | ir.Type) -> str:
    t = v.type if isinstance(v, ir.Value) else v
    return str(ir.RankedTensorType(t).element_type)


def _result_dims(t: Text, op: ir.Operation, shape: str, shape_type: ir.Type) -> list[str]:
    """Result dims: static ones from the result type, the rest read from a shape operand."""
    rt = ir.RankedTensorType(op.result.type)
    return [t.const(rt.shape[i]) if not rt.is_dynamic_dim(i) else t.extract_index(shape, shape_type, [t.const(i)])
            for i in range(rt.rank)]


def _generic(t: Text, result_type: ir.Type, dims: list[str], body: list[str], value: str) -> str:
    """A linalg.generic that writes every element of a new tensor from its index (body lines may
    use %i0..%iN, the element's index)."""
    rank = ir.RankedTensorType(result_type).rank
    out = t.empty(result_type, dims)
    idx = ", ".join(f"d{i}" for i in range(rank))
    lines = [f"  %i{i} = linalg.index {i} : index" for i in range(rank)] + ["  " + b for b in body]
    name = t.fresh("g")
    iterators = ", ".join(['"parallel"'] * rank)
    t.emit(f"{name} = linalg.generic {{indexing_maps = [affine_map<({idx}) -> ({idx})>], "
           f"iterator_types = [{iterators}]}} outs({out} : {result_type}) {{\n"
           f"^bb0(%out: {_elem(result_type)}):\n" + "\n".join(lines) + f"\n  linalg.yield {value} : {_elem(result_type)}\n}} -> {result_type}")
    return name


def _index_to(t: Text, v: str, elem: str, lines: list[str]) -> str:
    """Converts an index value to `elem` inside a generic body (appends to `lines`)."""
    n = t.fresh("x")
    if elem.startswith("f") or elem == "bf16":
        lines.append(f"{n}i = arith.index_cast {v} : index to i64")
        lines.append(f"{n} = arith.sitofp {n}i : i64 to {elem}")
    elif elem.startswith("ui"):  # arith takes signless integers only; make_signless drops the cast later
        lines.append(f"{n}i = arith.index_castui {v} : index to {elem[1:]}")
        lines.append(f"{n} = builtin.unrealized_conversion_cast {n}i : {elem[1:]} to {elem}")
    else:
        lines.append(f"{n} = arith.index_cast {v} : index to {elem}")
    return n


def _is_identity(op: ir.Operation) -> bool:
    return op.operands[0].type == op.result.type


@register_rewrite("stablehlo.bitcast_convert", when=_is_identity)
def _identity_bitcast(op: ir.Operation, state: LoweringState) -> None:
    """Dropped: the upstream conversion crashes the process on complex identity bitcasts."""
    op.result.replace_all_uses_with(op.operands[0])
    op.erase()


def _bits_of(elem: ir.Type) -> int | None:
    """Bits of an element a bitcast reads or writes, or None (booleans and other types)."""
    if isinstance(elem, ir.ComplexType):
        half = _bits_of(ir.ComplexType(elem).element_type)
        return 2 * half if half else None
    if isinstance(elem, ir.IntegerType):
        return ir.IntegerType(elem).width if ir.IntegerType(elem).width >= 8 else None
    return ir.FloatType(elem).width if isinstance(elem, ir.FloatType) else None


def _resizes(op: ir.Operation) -> bool:
    """A bitcast between element types of different widths (each element split into, or joined
    from, the last dim of the other side)."""
    a, r = (ir.RankedTensorType(v.type).element_type for v in (op.operands[0], op.result))
    return None not in (_bits_of(a), _bits_of(r)) and _bits_of(a) != _bits_of(r)


def _to_int(elem: ir.Type, x: str, body: list[str], stem: str) -> str:
    """`x` of `elem` as the integer of its bits (a complex: its real part in the low half)."""
    bits = _bits_of(elem)
    if isinstance(elem, ir.ComplexType):
        part, half = ir.ComplexType(elem).element_type, bits // 2
        body += [f"{stem}rep = complex.re {x} : {elem}", f"{stem}imp = complex.im {x} : {elem}"]
        lo, hi = _to_int(part, f"{stem}rep", body, f"{stem}re"), _to_int(part, f"{stem}imp", body, f"{stem}im")
        body += [f"{stem}l = arith.extui {lo} : i{half} to i{bits}", f"{stem}h = arith.extui {hi} : i{half} to i{bits}",
                 f"{stem}s = arith.constant {half} : i{bits}", f"{stem}hs = arith.shli {stem}h, {stem}s : i{bits}",
                 f"{stem}v = arith.ori {stem}l, {stem}hs : i{bits}"]
        return f"{stem}v"
    if isinstance(elem, ir.IntegerType) and ir.IntegerType(elem).is_signless:
        return x
    cast = "builtin.unrealized_conversion_cast" if isinstance(elem, ir.IntegerType) else "arith.bitcast"  # ui64 -> i64
    body.append(f"{stem}v = {cast} {x} : {elem} to i{bits}")
    return f"{stem}v"


def _from_int(elem: ir.Type, v: str, body: list[str], stem: str) -> str:
    """The `elem` whose bits are the integer `v` (a complex: its real part from the low half)."""
    bits = _bits_of(elem)
    if isinstance(elem, ir.ComplexType):
        part, half = ir.ComplexType(elem).element_type, bits // 2
        body += [f"{stem}s = arith.constant {half} : i{bits}", f"{stem}hv = arith.shrui {v}, {stem}s : i{bits}",
                 f"{stem}l = arith.trunci {v} : i{bits} to i{half}", f"{stem}h = arith.trunci {stem}hv : i{bits} to i{half}"]
        re, im = _from_int(part, f"{stem}l", body, f"{stem}r"), _from_int(part, f"{stem}h", body, f"{stem}i")
        body.append(f"{stem}c = complex.create {re}, {im} : {elem}")
        return f"{stem}c"
    if isinstance(elem, ir.IntegerType) and ir.IntegerType(elem).is_signless:
        return v
    cast = "builtin.unrealized_conversion_cast" if isinstance(elem, ir.IntegerType) else "arith.bitcast"
    body.append(f"{stem}f = {cast} {v} : i{bits} to {elem}")
    return f"{stem}f"


@register_template("stablehlo.bitcast_convert", when=_resizes)
def _resizing_bitcast(op, t: Text, state):
    """Each element's bits, lowest first, split into the result's last dim, or joined from the
    operand's last dim (the memory order of a little-endian machine), at any dims (upstream's
    conversion aborts on dynamic ones, and on complex types)."""
    src, dst = (ir.RankedTensorType(v.type) for v in (op.operands[0], op.result))
    sb, db = _bits_of(src.element_type), _bits_of(dst.element_type)
    rank = dst.rank
    body: list[str] = []
    if sb > db:  # split: result [..., k] is chunk k of operand [...]
        idx = ", ".join(f"%i{i}" for i in range(rank - 1))
        body.append(f"%bc_x = tensor.extract %a0[{idx}] : {src}")
        v = _to_int(src.element_type, "%bc_x", body, "%bc_a")
        body += [f"%bc_k = arith.index_cast %i{rank - 1} : index to i{sb}", f"%bc_w = arith.constant {db} : i{sb}",
                 f"%bc_sh = arith.muli %bc_k, %bc_w : i{sb}", f"%bc_ch = arith.shrui {v}, %bc_sh : i{sb}",
                 f"%bc_t = arith.trunci %bc_ch : i{sb} to i{db}"]
        out = _from_int(dst.element_type, "%bc_t", body, "%bc_b")
        dims = t.dims("%a0", src) + [t.const(sb // db)]
    else:  # join: result [...] from operand [..., 0 .. n)
        acc = None
        for k in range(db // sb):
            idx = ", ".join([f"%i{i}" for i in range(rank)] + [t.const(k)])
            body.append(f"%bc_x{k} = tensor.extract %a0[{idx}] : {src}")
            v = _to_int(src.element_type, f"%bc_x{k}", body, f"%bc_a{k}")
            body += [f"%bc_e{k} = arith.extui {v} : i{sb} to i{db}", f"%bc_s{k} = arith.constant {k * sb} : i{db}",
                     f"%bc_p{k} = arith.shli %bc_e{k}, %bc_s{k} : i{db}"]
            if acc is not None:
                body.append(f"%bc_o{k} = arith.ori {acc}, %bc_p{k} : i{db}")
            acc = f"%bc_o{k}" if acc is not None else f"%bc_p{k}"
        out = _from_int(dst.element_type, acc, body, "%bc_b")
        dims = t.dims("%a0", src)[:-1]
    return [_generic(t, op.result.type, dims, body, out)]


@register_template("stablehlo.reverse")
def _reverse(op, t: Text, state):
    flipped = set(int_list(op, "dimensions"))
    dims = t.dims("%a0", op.operands[0].type)
    body, index = [], []
    for d in range(_rank(op.result)):
        if d in flipped:
            body.append(f"%r{d} = arith.subi {t(f'arith.subi {dims[d]}, {t.const(1)} : index')}, %i{d} : index")
            index.append(f"%r{d}")
        else:
            index.append(f"%i{d}")
    body.append(f"%e = tensor.extract %a0[{', '.join(index)}] : {op.operands[0].type}")
    return [_generic(t, op.result.type, dims, body, "%e")]


def _is_assertion(op: ir.Operation) -> bool:
    return call_target(op) == ASSERT_TARGET


@register_template("stablehlo.custom_call", when=_is_assertion)
def _assertion(op, t: Text, state):
    failed = t(f"arith.xori {t('tensor.extract %a0[] : tensor<i1>')}, {t('arith.constant true')} : i1")
    zero = t.const(0)
    t.check(state, op, failed, ir.StringAttr(op.attributes["error_message"]).value, zero, zero)
    return []


@register_template("stablehlo.get_dimension_size")
def _get_dimension_size(op, t: Text, state):
    d = t.dim("%a0", op.operands[0].type, ir.IntegerAttr(op.attributes["dimension"]).value)
    elem = _elem(op.result)
    v = t(f"arith.index_cast {d} : index to {elem}")
    return [t(f"tensor.from_elements {v} : {op.result.type}")]


@register_template("stablehlo.dynamic_broadcast_in_dim", "stablehlo.broadcast_in_dim",
                   when=lambda op: op.name == "stablehlo.dynamic_broadcast_in_dim" or not ir.RankedTensorType(op.operands[0].type).has_static_shape)
def _dynamic_broadcast_in_dim(op, t: Text, state):
    """Dims the shape analysis settled (known_(non)expanding_dimensions, or static) index the
    operand through a plain indexing map; an unsettled dynamic dim reads index 0 when the operand
    dim is 1 at run time (also a broadcast_in_dim's, to its static result dims), after a check
    that it is 1 or the result's. With every dim settled the op is an ordinary broadcast, which
    the elementwise fusion folds into its consumers."""
    operand, out_type = op.operands[0], op.result.type
    in_t, out_t = ir.RankedTensorType(operand.type), ir.RankedTensorType(out_type)
    bdims = int_list(op, "broadcast_dimensions")
    nonexpanding = set(int_list(op, "known_nonexpanding_dimensions"))
    expanding = set(int_list(op, "known_expanding_dimensions"))
    dims = _result_dims(t, op, "%a1", op.operands[1].type if len(op.operands) > 1 else None)
    settled = {}
    for i, od in enumerate(bdims):
        if i in expanding or (not in_t.is_dynamic_dim(i) and in_t.shape[i] == 1 and out_t.shape[od] != 1):
            settled[i] = "0"
        elif i in nonexpanding or not in_t.is_dynamic_dim(i):
            settled[i] = f"d{od}"
        if i not in nonexpanding and i not in expanding and (out_t.is_dynamic_dim(od) or in_t.is_dynamic_dim(i)) and in_t.shape[i] != 1:
            # nothing proved: the operand dim must be 1 or the result's (else it is read past its end)
            d = t.dim("%a0", operand.type, i)
            equal = t(f"arith.cmpi eq, {d}, {dims[od]} : index")
            one = t(f"arith.cmpi eq, {d}, {t.const(1)} : index")
            fits = t(f"arith.ori {equal}, {one} : i1")
            t.check(state, op, t(f"arith.xori {fits}, {t.const('true', 'i1')} : i1"),
                    f"operand dim {i} is {{0}}, result dim {od} is {{1}} (the operand's must be 1 or the same)", d, dims[od])
    if len(settled) == in_t.rank:
        rank = out_t.rank
        ds = ", ".join(f"d{i}" for i in range(rank))
        out = t.empty(out_type, dims)
        name, elem = t.fresh("bcast"), _elem(operand)
        in_map = ", ".join(settled[i] for i in range(in_t.rank))
        iterators = ", ".join(['"parallel"'] * rank)
        t.emit(f"{name} = linalg.generic {{indexing_maps = [affine_map<({ds}) -> ({in_map})>, affine_map<({ds}) -> ({ds})>], "
               f"iterator_types = [{iterators}]}} ins(%a0 : {operand.type}) outs({out} : {out_type}) {{\n"
               f"^bb0(%x: {elem}, %o: {elem}):\n  linalg.yield %x : {elem}\n}} -> {out_type}")
        return [name]
    body, index = [], []
    for i, od in enumerate(bdims):
        if i in settled:
            index.append(t.const(0) if settled[i] == "0" else f"%i{od}")
        else:  # expanding iff the operand dim is 1 at run time
            one = t(f"arith.cmpi eq, {t.dim('%a0', operand.type, i)}, {t.const(1)} : index")
            n = t.fresh("s")
            body.append(f"{n} = arith.select {one}, {t.const(0)}, %i{od} : index")
            index.append(n)
    body.append(f"%e = tensor.extract %a0[{', '.join(index)}] : {operand.type}")
    return [_generic(t, out_type, dims, body, "%e")]


def _is_shape_data(op: ir.Operation) -> bool:
    """A small integer tensor (a shape, a padding configuration): computed, not data."""
    t = ir.RankedTensorType(op.result.type)
    return t.has_static_shape and math.prod(t.shape) <= 16 and not isinstance(t.element_type, ir.FloatType)


@register_template("stablehlo.concatenate")
def _concatenate(op, t: Text, state):
    """Shape vectors are assembled from scalars on the host, not by a kernel: the element reads
    fold into the scalars the operands were built from. Data: each operand is inserted at its
    offset into an empty result; once bufferized, a producer writes straight into its part of
    the result (empty-tensor elimination) or the operand is copied there by a contiguous,
    vectorised loop (upstream's lowering reads every element through a chain of branches on
    its index, which the loop vectoriser does not take)."""
    axis = ir.IntegerAttr(op.attributes["dimension"]).value
    result = ir.RankedTensorType(op.result.type)
    if _is_shape_data(op):
        starts = list(itertools.accumulate((ir.RankedTensorType(v.type).shape[axis] for v in op.operands), initial=0))
        elems = []
        for index in itertools.product(*map(range, result.shape)):  # row-major, as from_elements reads them
            k = bisect.bisect_right(starts, index[axis]) - 1
            at = ", ".join(t.const(j - starts[k] if i == axis else j) for i, j in enumerate(index))
            elems.append(t(f"tensor.extract %a{k}[{at}] : {op.operands[k].type}"))
        return [t(f"tensor.from_elements {', '.join(elems)} : {op.result.type}")]
    first = t.dims("%a0", op.operands[0].type)
    offsets, total = [], t.const(0)
    for k, v in enumerate(op.operands):
        offsets.append(total)
        total = t(f"arith.addi {total}, {t.dim(f'%a{k}', v.type, axis)} : index")
    dest = t.empty(op.result.type, [total if i == axis else d for i, d in enumerate(first)])
    for k, v in enumerate(op.operands):
        vt = ir.RankedTensorType(v.type)
        offs = ", ".join(offsets[k] if i == axis else "0" for i in range(result.rank))
        sizes = ", ".join(_static_or(v.type, i, t.dim(f"%a{k}", v.type, i)) for i in range(vt.rank))
        ones = ", ".join("1" for _ in range(vt.rank))
        dest = t(f"tensor.insert_slice %a{k} into {dest}[{offs}] [{sizes}] [{ones}] : {v.type} into {op.result.type}")
    return [dest]


@register_template("stablehlo.dynamic_reshape")
def _dynamic_reshape(op, t: Text, state):
    """A reshape the analysis proved to merge runs of dims and split them (`segments`) is a
    collapse_shape and an expand_shape, each left out where it would do nothing: views of the
    operand's buffer (whose dims fold, and which upstream fusion moves through elementwise ops);
    one proved to keep every dim is its operand; any other is a tensor.reshape by the shape
    operand (of a contiguous buffer: a view is copied first)."""
    src, dst = op.operands[0].type, op.result.type
    segs = segments(op)
    if segs is None:  # nothing proved: the shape keeps the element count, or the call ends
        count = t.const(1)
        for d in t.dims("%a0", src):
            count = t(f"arith.muli {count}, {d} : index")
        product, wrapped = t.const(1, "i64"), t.const("false", "i1")
        for i, d in enumerate(_result_dims(t, op, "%a1", op.operands[1].type)):
            t.check(state, op, t(f"arith.cmpi slt, {d}, {t.const(0)} : index"), f"result dim {i} is {{0}}, negative", d, d)
            m, d64, zero = t.fresh("m"), t(f"arith.index_cast {d} : index to i64"), t.const(0, "i64")
            t.emit(f"{m}:2 = arith.mului_extended {product}, {d64} : i64")
            high = t(f"arith.cmpi ne, {m}#1, {zero} : i64")
            product, wrapped = f"{m}#0", t(f"arith.ori {wrapped}, {high} : i1")
        size = t(f"arith.index_cast {product} : i64 to index")
        differ = t(f"arith.cmpi ne, {count}, {size} : index")
        t.check(state, op, t(f"arith.ori {differ}, {wrapped} : i1"), "the operand has {0} elements, the result shape {1}", count, size)
        return [t(f"tensor.reshape %a0(%a1) : ({src}, {op.operands[1].type}) -> {dst}")]
    if all(len(s) == len(d) == 1 for s, d in segs):  # the dims stay
        return ["%a0" if src == dst else t(f"tensor.cast %a0 : {src} to {dst}")]
    st, rt = ir.RankedTensorType(src), ir.RankedTensorType(dst)
    value, vtype = "%a0", str(src)
    if any(len(s) > 1 for s, _ in segs):
        sizes = ["?" if any(st.is_dynamic_dim(i) for i in s) else str(math.prod(st.shape[i] for i in s)) for s, _ in segs]
        vtype = f"tensor<{''.join(x + 'x' for x in sizes)}{st.element_type}>"
        value = t(f"tensor.collapse_shape %a0 {[s for s, _ in segs]} : {src} into {vtype}")
    if all(len(d) == 1 for _, d in segs):
        return [value if vtype == str(dst) else t(f"tensor.cast {value} : {vtype} to {dst}")]
    dims = _result_dims(t, op, "%a1", op.operands[1].type)
    shape = ", ".join(str(rt.shape[i]) if not rt.is_dynamic_dim(i) else dims[i] for i in range(rt.rank))
    # a run of result dims is dynamic just where its operand dim is (a static 2 split into (?, 1): u0 proved 2)
    sizes = ["?" if any(rt.is_dynamic_dim(i) for i in d) else str(math.prod(rt.shape[i] for i in d)) for _, d in segs]
    if (expanded := f"tensor<{''.join(x + 'x' for x in sizes)}{st.element_type}>") != vtype:
        value, vtype = t(f"tensor.cast {value} : {vtype} to {expanded}"), expanded
    return [t(f"tensor.expand_shape {value} {[d for _, d in segs]} output_shape [{shape}] : {vtype} into {dst}")]


@register_template("stablehlo.real_dynamic_slice")
def _real_dynamic_slice(op, t: Text, state):
    rank = _rank(op.result)
    offs, sizes, strides = [], [], []
    for i in range(rank):
        start = t.extract_index("%a1", op.operands[1].type, [t.const(i)])
        limit = t.extract_index("%a2", op.operands[2].type, [t.const(i)])
        stride = t.extract_index("%a3", op.operands[3].type, [t.const(i)])
        size = t.dim("%a0", op.operands[0].type, i)
        below, beyond = t(f"arith.cmpi slt, {start}, {t.const(0)} : index"), t(f"arith.cmpi sgt, {start}, {limit} : index")
        outside = t(f"arith.ori {below}, {beyond} : i1")
        t.check(state, op, outside, f"start {{0}} of dim {i} is not within [0, limit {{1}}]", start, limit)
        t.check(state, op, t(f"arith.cmpi sgt, {limit}, {size} : index"), f"limit {{0}} of dim {i} exceeds the operand's size {{1}}", limit, size)
        t.check(state, op, t(f"arith.cmpi sle, {stride}, {t.const(0)} : index"), f"stride {{0}} of dim {i} is not positive", stride, stride)
        span = t(f"arith.subi {limit}, {start} : index")
        offs.append(start)
        strides.append(stride)
        sizes.append(t(f"arith.ceildivsi {span}, {stride} : index"))
    dyn_type = f"tensor<{'?x' * rank}{_elem(op.result)}>"
    s = t(f"tensor.extract_slice %a0[{', '.join(offs)}] [{', '.join(sizes)}] [{', '.join(strides)}] : {op.operands[0].type} to {dyn_type}")
    return [t(f"tensor.cast {s} : {dyn_type} to {op.result.type}")]


@register_template("stablehlo.dynamic_iota")
def _dynamic_iota(op, t: Text, state):
    dims = _result_dims(t, op, "%a0", op.operands[0].type)
    body: list[str] = []
    v = _index_to(t, f"%i{ir.IntegerAttr(op.attributes['iota_dimension']).value}", _elem(op.result), body)
    return [_generic(t, op.result.type, dims, body, v)]


# float type -> (bits, explicit mantissa bits, exponent bits)
_FLOAT_LAYOUT = {"f16": (16, 10, 5), "bf16": (16, 7, 8), "f32": (32, 23, 8), "f64": (64, 52, 11)}


@register_template("stablehlo.reduce_precision", when=lambda op: _elem(op.result) in _FLOAT_LAYOUT)
def _reduce_precision(op, t: Text, state):
    """Each element rounded to `mantissa_bits` (to nearest, ties to even) and its exponent
    clamped to `exponent_bits` (to zero or infinity, sign kept), on its bits; a NaN stays itself,
    or becomes infinity when the format has no mantissa bits to hold one (the spec's reference).
    Any dims (upstream's lowering aborts on dynamic ones)."""
    elem = _elem(op.result)
    width, mantissa, exponent = _FLOAT_LAYOUT[elem]
    m, e = (ir.IntegerAttr(op.attributes[a]).value for a in ("mantissa_bits", "exponent_bits"))
    it = f"i{width}"
    rank = ir.RankedTensorType(op.result.type).rank
    body = [f"%rp_x = tensor.extract %a0[{', '.join(f'%i{i}' for i in range(rank))}] : {op.operands[0].type}",
            f"%rp_b0 = arith.bitcast %rp_x : {elem} to {it}"]
    consts: dict[int, str] = {}

    def c(value: int) -> str:  # an iW constant, written signed
        value &= (1 << width) - 1
        if value not in consts:
            consts[value] = f"%rp_k{len(consts)}"
            body.append(f"{consts[value]} = arith.constant {value - (1 << width) if value >> (width - 1) else value} : {it}")
        return consts[value]

    bits = "%rp_b0"
    if m < mantissa:
        shift = mantissa - m
        body += [f"%rp_lb = arith.andi %rp_b0, {c(1 << shift)} : {it}", f"%rp_lb1 = arith.shrui %rp_lb, {c(shift)} : {it}",
                 f"%rp_bias = arith.addi %rp_lb1, {c((1 << (shift - 1)) - 1)} : {it}", f"%rp_rb = arith.addi %rp_b0, %rp_bias : {it}",
                 f"%rp_b1 = arith.andi %rp_rb, {c(~((1 << shift) - 1))} : {it}"]
        bits = "%rp_b1"
    if e < exponent:
        bias, reduced = (1 << (exponent - 1)) - 1, (1 << (e - 1)) - 1
        exp_mask = ((1 << exponent) - 1) << mantissa
        body += [f"%rp_xe = arith.andi {bits}, {c(exp_mask)} : {it}",
                 f"%rp_over = arith.cmpi ugt, %rp_xe, {c((bias + reduced) << mantissa)} : {it}",
                 f"%rp_under = arith.cmpi ule, %rp_xe, {c((bias - reduced) << mantissa)} : {it}",
                 f"%rp_sz = arith.andi {bits}, {c(1 << (width - 1))} : {it}", f"%rp_si = arith.ori %rp_sz, {c(exp_mask)} : {it}",
                 f"%rp_b2 = arith.select %rp_over, %rp_si, {bits} : {it}", f"%rp_b3 = arith.select %rp_under, %rp_sz, %rp_b2 : {it}"]
        bits = "%rp_b3"
    body += [f"%rp_r = arith.bitcast {bits} : {it} to {elem}", f"%rp_nan = arith.cmpf uno, %rp_x, %rp_x : {elem}"]
    if m > 0:
        body.append(f"%rp_out_v = arith.select %rp_nan, %rp_x, %rp_r : {elem}")
    else:
        body += [f"%rp_inf = arith.bitcast {c(((1 << exponent) - 1) << mantissa)} : {it} to {elem}",
                 f"%rp_out_v = arith.select %rp_nan, %rp_inf, %rp_r : {elem}"]
    return [_generic(t, op.result.type, t.dims("%a0", op.operands[0].type), body, "%rp_out_v")]


def padded_size(t: Text, size: str, low: str, high: str, interior: str) -> str:
    """A dim of `size` elements after edge padding `low` and `high` (may be negative) and
    `interior` padding between elements (index values)."""
    minus_one = t(f"arith.subi {size}, {t.const(1)} : index")
    gaps = t(f"arith.muli {t(f'arith.maxsi {minus_one}, {t.const(0)} : index')}, {interior} : index")
    edges = t(f"arith.addi {low}, {high} : index")
    return t(f"arith.addi {edges}, {t(f'arith.addi {size}, {gaps} : index')} : index")


def _pad(t: Text, src: str, src_type: ir.Type, pad_value: str, result_type: ir.Type | str,
         lows: list[int | str], highs: list[int | str], interiors: list[int | str]) -> str:
    """Pads `src` with the scalar `pad_value`: lows/highs may be negative, interior >= 0 (index
    values, or ints when known). Known edges that only grow the tensor and no interior padding:
    the result is filled and `src` inserted into it (a producer of `src` then writes into the
    result in place, see the concatenation); no padding at all is `src` itself. Otherwise each
    element of the result is read from `src` or is the pad value, by its index."""
    rank = ir.RankedTensorType(src_type).rank
    in_dims = t.dims(src, src_type)
    edges = [*lows, *highs, *interiors]
    if all(isinstance(e, int) for e in edges) and min(edges) >= 0 and not any(interiors):
        if not any(edges):
            return src if str(src_type) == str(result_type) else t(f"tensor.cast {src} : {src_type} to {result_type}")
        out_dims = [t(f"arith.addi {in_dims[i]}, {t.const(lows[i] + highs[i])} : index") for i in range(rank)]
        result_type = ir.Type.parse(str(result_type))
        filled = t(f"linalg.fill ins({pad_value} : {_elem(result_type)}) outs({t.empty(result_type, out_dims)} : {result_type}) "
                   f"-> {result_type}")
        sizes = ", ".join(_static_or(src_type, i, in_dims[i]) for i in range(rank))
        return t(f"tensor.insert_slice {src} into {filled}[{', '.join(map(str, lows))}] [{sizes}] [{', '.join(['1'] * rank)}] "
                 f": {src_type} into {result_type}")
    lows, highs, interiors = ([e if isinstance(e, str) else t.const(e) for e in es] for es in (lows, highs, interiors))
    out_dims = [padded_size(t, in_dims[i], lows[i], highs[i], interiors[i]) for i in range(rank)]
    body, conds, idx = [], [], []
    for i in range(rank):
        step = t(f"arith.addi {interiors[i]}, {t.const(1)} : index")
        body += [f"%p{i} = arith.subi %i{i}, {lows[i]} : index",
                 f"%q{i} = arith.divsi %p{i}, {step} : index",
                 f"%r{i} = arith.remsi %p{i}, {step} : index",
                 f"%ge{i} = arith.cmpi sge, %p{i}, {t.const(0)} : index",
                 f"%on{i} = arith.cmpi eq, %r{i}, {t.const(0)} : index",
                 f"%lt{i} = arith.cmpi slt, %q{i}, {in_dims[i]} : index",
                 f"%a{i}x = arith.andi %ge{i}, %on{i} : i1",
                 f"%ok{i} = arith.andi %a{i}x, %lt{i} : i1"]
        conds.append(f"%ok{i}")
        idx.append(f"%q{i}")
    inside = t.const(1, "i1")
    for c in conds:
        n = t.fresh("and")
        body.append(f"{n} = arith.andi {inside}, {c} : i1")
        inside = n
    elem = _elem(ir.Type.parse(str(result_type)))
    body += [f"%val = scf.if {inside} -> ({elem}) {{",
             f"  %e = tensor.extract {src}[{', '.join(idx)}] : {src_type}",
             "  scf.yield %e : " + elem,
             "} else {",
             f"  scf.yield {pad_value} : {elem}",
             "}"]
    return _generic(t, ir.Type.parse(str(result_type)), out_dims, body, "%val")


def _pad_op(t: Text, op, lows: list[str], highs: list[str], interiors: list[str]) -> str:
    pad_value = t(f"tensor.extract %a1[] : {op.operands[1].type}")
    return _pad(t, "%a0", op.operands[0].type, pad_value, op.result.type, lows, highs, interiors)


@register_template("stablehlo.dynamic_pad")
def _dynamic_pad(op, t: Text, state):
    rank = _rank(op.operands[0])
    vec = [[t.extract_index(f"%a{k}", op.operands[k].type, [t.const(i)]) for i in range(rank)] for k in (2, 3, 4)]
    return [_pad_op(t, op, *vec)]


@register_template("stablehlo.pad")
def _static_pad(op, t: Text, state):
    return [_pad_op(t, op, *(int_list(op, k) for k in ("edge_padding_low", "edge_padding_high", "interior_padding")))]


def _static_or(type_: ir.Type, i: int, dynamic: str) -> str:
    """A slice size: the literal when the type knows it (the op's types must agree)."""
    t = ir.RankedTensorType(type_)
    return dynamic if t.is_dynamic_dim(i) else str(t.shape[i])


def _clamped_starts(t: Text, op, first: int, in_dims: list[str], sizes: list[str]) -> list[str]:
    """Start indices (scalar tensors from operand `first` on) clamped so the slice fits."""
    return [t.clamp(t.extract_index(f"%a{first + i}", op.operands[first + i].type), t.const(0),
                    t(f"arith.subi {in_dims[i]}, {sizes[i]} : index")) for i in range(len(in_dims))]


@register_template("stablehlo.dynamic_update_slice")
def _dynamic_update_slice(op, t: Text, state):
    operand, update = op.operands[0], op.operands[1]
    in_dims, up_dims = t.dims("%a0", operand.type), t.dims("%a1", update.type)
    for i, (a, b) in enumerate(zip(up_dims, in_dims)):
        if not (ir.RankedTensorType(operand.type).has_static_shape and ir.RankedTensorType(update.type).has_static_shape):
            t.check(state, op, t(f"arith.cmpi sgt, {a}, {b} : index"), f"the update's dim {i} ({{0}}) exceeds the operand's ({{1}})", a, b)
    offs = _clamped_starts(t, op, 2, in_dims, up_dims)
    sizes = ", ".join(_static_or(update.type, i, d) for i, d in enumerate(up_dims))
    ones = ", ".join("1" for _ in up_dims)
    return [t(f"tensor.insert_slice %a1 into %a0[{', '.join(offs)}] [{sizes}] [{ones}] : {update.type} into {operand.type}")]


@register_template("stablehlo.dynamic_slice")
def _dynamic_slice(op, t: Text, state):
    operand = op.operands[0]
    sizes = int_list(op, "slice_sizes")
    in_dims = t.dims("%a0", operand.type)
    for i, size in enumerate(sizes):
        if ir.RankedTensorType(operand.type).is_dynamic_dim(i):
            t.check(state, op, t(f"arith.cmpi sgt, {t.const(size)}, {in_dims[i]} : index"),
                    f"slice size {{0}} of dim {i} exceeds the operand's size {{1}}", t.const(size), in_dims[i])
    offs = _clamped_starts(t, op, 1, in_dims, [t.const(s) for s in sizes])
    ones = ", ".join("1" for _ in sizes)
    return [t(f"tensor.extract_slice %a0[{', '.join(offs)}] [{', '.join(map(str, sizes))}] [{ones}] : {operand.type} to {op.result.type}")]


@register_template("stablehlo.gather", "stablehlo.dynamic_gather")
def _gather(op, t: Text, state):
    dn = _stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    operand, indices = op.operands[0], op.operands[1]
    op_rank, idx_rank, out_rank = _rank(operand), _rank(indices), _rank(op.result)
    if op.name == "stablehlo.dynamic_gather":
        slice_sizes = [t.extract_index("%a2", op.operands[2].type, [t.const(i)]) for i in range(op_rank)]
    else:
        slice_sizes = [t.const(s) for s in int_list(op, "slice_sizes")]
    offset_dims, collapsed = list(dn.offset_dims), set(dn.collapsed_slice_dims)
    op_batch, idx_batch = list(dn.operand_batching_dims), list(dn.start_indices_batching_dims)
    start_map, ivd = list(dn.start_index_map), dn.index_vector_dim
    in_dims = t.dims("%a0", operand.type)
    batch_out = [d for d in range(out_rank) if d not in offset_dims]  # output dims that index `indices`
    idx_dims_wo_ivd = [d for d in range(idx_rank) if d != ivd]  # in order, matching batch_out

    def batch_index(idx_dim: int) -> str:
        return f"%i{batch_out[idx_dims_wo_ivd.index(idx_dim)]}"

    body, full = [], [t.const(0)] * op_rank
    start = [None] * op_rank
    iota = list(ir.DenseI64ArrayAttr(op.attributes[IOTA_INDICES_ATTR])) if IOTA_INDICES_ATTR in op.attributes else None
    for k, od in enumerate(start_map):
        if iota is not None:  # the start index is the result index: no load, no clamp (the analysis proved it in bounds)
            start[od] = f"%i{iota[k]}"
            continue
        pos = [batch_index(d) if d != ivd else t.const(k) for d in range(idx_rank)]
        if ivd == idx_rank:
            pos = [batch_index(d) for d in range(idx_rank)]
        e = t.fresh("ix")
        body.append(f"{e} = tensor.extract %a1[{', '.join(pos)}] : {indices.type}")
        elem = _elem(indices)
        cast = "arith.index_castui" if elem.startswith("ui") else "arith.index_cast"
        body.append(f"{e}c = {cast} {e} : {elem.replace('ui', 'i')} to index")
        hi = t(f"arith.subi {in_dims[od]}, {slice_sizes[od]} : index")
        body.append(f"{e}m = arith.minsi {e}c, {hi} : index")
        body.append(f"{e}s = arith.maxsi {e}m, {t.const(0)} : index")
        start[od] = f"{e}s"
    for ob, ib in zip(op_batch, idx_batch):
        start[ob] = batch_index(ib)
    offset_operand_dims = [d for d in range(op_rank) if d not in collapsed and d not in op_batch]
    for od, out_d in zip(offset_operand_dims, offset_dims):
        full[od] = f"%i{out_d}"
    final = []
    for d in range(op_rank):
        if start[d] is None:
            final.append(full[d])
        else:
            n = t.fresh("fi")
            body.append(f"{n} = arith.addi {start[d]}, {full[d]} : index")
            final.append(n)
    body.append(f"%e = tensor.extract %a0[{', '.join(final)}] : {operand.type}")
    rt = ir.RankedTensorType(op.result.type)
    out_dims = []
    for d in range(out_rank):
        if not rt.is_dynamic_dim(d):
            out_dims.append(t.const(rt.shape[d]))
        elif d in offset_dims:
            out_dims.append(slice_sizes[offset_operand_dims[offset_dims.index(d)]])
        else:
            out_dims.append(t.dim("%a1", indices.type, idx_dims_wo_ivd[batch_out.index(d)]))
    return [_generic(t, op.result.type, out_dims, body, "%e")]
