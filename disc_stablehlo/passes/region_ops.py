"""Templates for ops that carry a computation region (scatter, sort, reduce_window): the region
becomes a private function on 0-d tensors, called from scf loops that walk the elements. A
reduce_window whose region is one add / multiply / max / min (pooling) is instead a
linalg.generic with the window as reduction dims, which runs on the thread pool."""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from ..mlir_support import call_target, find_function, int_list, operation
from .dynamic_ops import _elem, _pad, _rank
from .lower import LoweringState, Text, register_template


class Loops:
    """A nest of scf.for loops with tensor iter_args, written as text."""

    def __init__(self, t: Text, bounds: list[str], carried: list[tuple[str, str]]):
        self.t, self.ivs = t, []
        self.carried_types = [ty for _, ty in carried]
        current = [v for v, _ in carried]
        self.closers: list[list[str]] = []  # per loop, outermost first: its result names
        for ub in bounds:
            iv, names = t.fresh("iv"), [t.fresh("acc") for _ in carried]
            res = t.fresh("loop")
            iters = ", ".join(f"{n} = {c}" for n, c in zip(names, current))
            t.emit(f"{res}:{len(carried)} = scf.for {iv} = {t.const(0)} to {ub} step {t.const(1)} iter_args({iters}) -> ({', '.join(self.carried_types)}) {{")
            self.ivs.append(iv)
            self.closers.append([f"{res}#{i}" for i in range(len(carried))])
            current = names
        self.inner = current

    def close(self, yielded: list[str]) -> list[str]:
        types = ", ".join(self.carried_types)
        for results in reversed(self.closers):
            self.t.emit(f"scf.yield {', '.join(yielded)} : {types}")
            self.t.emit("}")
            yielded = results
        return yielded


def _call_region(t: Text, fn: str, scalars: list[tuple[str, str]], result_elems: list[str]) -> list[str]:
    """Calls a region function on scalars (wrapped as 0-d tensors) and returns scalars."""
    args = [t(f"tensor.from_elements {v} : tensor<{e}>") for v, e in scalars]
    types = ", ".join(f"tensor<{e}>" for _, e in scalars)
    outs = ", ".join(f"tensor<{e}>" for e in result_elems)
    res = t.fresh("call")
    t.emit(f"{res}:{len(result_elems)} = func.call @{fn}({', '.join(args)}) : ({types}) -> ({outs})")
    return [t(f"tensor.extract {res}#{i}[] : tensor<{e}>") for i, e in enumerate(result_elems)]


def _if(t: Text, cond: str, types: list[str], then_body, otherwise) -> list[str]:
    """scf.if: `then_body` emits the taken branch and returns its values; `otherwise` is the
    values of the other (computed before the if), or a function that emits them in its branch."""
    res = t.fresh("if")
    t.emit(f"{res}:{len(types)} = scf.if {cond} -> ({', '.join(types)}) {{")
    t.emit(f"scf.yield {', '.join(then_body())} : {', '.join(types)}")
    t.emit("} else {")
    t.emit(f"scf.yield {', '.join(otherwise() if callable(otherwise) else otherwise)} : {', '.join(types)}")
    t.emit("}")
    return [f"{res}#{i}" for i in range(len(types))]


def _all(t: Text, conds: list[str]) -> str:
    acc = t.const("true", "i1")
    for c in conds:
        acc = t(f"arith.andi {acc}, {c} : i1")
    return acc


def _in_range(t: Text, v: str, hi: str) -> str:
    return t(f"arith.andi {t(f'arith.cmpi sge, {v}, {t.const(0)} : index')}, {t(f'arith.cmpi slt, {v}, {hi} : index')} : i1")


@register_template("stablehlo.scatter")
def _scatter(op, t: Text, state: LoweringState):
    n = len(op.results)
    inputs, indices, updates = op.operands[:n], op.operands[n], op.operands[n + 1:]
    dn = _stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    window_dims, inserted = list(dn.update_window_dims), set(dn.inserted_window_dims)
    in_batch, idx_batch = list(dn.input_batching_dims), list(dn.scatter_indices_batching_dims)
    to_operand, ivd = list(dn.scattered_dims_to_operand_dims), dn.index_vector_dim
    fn = state.region_function(op.regions[0], "scatter_body", t)
    rank_in, rank_idx, rank_up = _rank(inputs[0]), _rank(indices), _rank(updates[0])
    in_dims = t.dims("%a0", inputs[0].type)
    up_dims = t.dims(f"%a{n + 1}", updates[0].type)
    loops = Loops(t, up_dims, [(f"%a{i}", str(inputs[i].type)) for i in range(n)])
    u = loops.ivs
    scatter_dims = [d for d in range(rank_up) if d not in window_dims]
    idx_dims = [d for d in range(rank_idx) if d != ivd]  # matched in order with scatter_dims

    def g(idx_dim):
        return u[scatter_dims[idx_dims.index(idx_dim)]]

    full = [t.const(0)] * rank_in
    for k, od in enumerate(to_operand):
        pos = [g(d) if d != ivd else t.const(k) for d in range(rank_idx)] if ivd < rank_idx else [g(d) for d in range(rank_idx)]
        full[od] = t.extract_index(f"%a{n}", indices.type, pos)
    for ib, sb in zip(in_batch, idx_batch):
        full[ib] = g(sb)
    window_operand_dims = [d for d in range(rank_in) if d not in inserted and d not in in_batch]
    for od, ud in zip(window_operand_dims, window_dims):
        full[od] = t(f"arith.addi {full[od]}, {u[ud]} : index")
    inside = _all(t, [_in_range(t, full[d], in_dims[d]) for d in range(rank_in)])
    elems = [_elem(v) for v in inputs]

    def apply():
        cur = [(t(f"tensor.extract {acc}[{', '.join(full)}] : {v.type}"), e) for acc, v, e in zip(loops.inner, inputs, elems)]
        upd = [(t(f"tensor.extract %a{n + 1 + i}[{', '.join(u)}] : {v.type}"), _elem(v)) for i, v in enumerate(updates)]
        new = _call_region(t, fn, cur + upd, elems)
        return [t(f"tensor.insert {x} into {acc}[{', '.join(full)}] : {v.type}") for x, acc, v in zip(new, loops.inner, inputs)]
    out = _if(t, inside, [str(v.type) for v in inputs], apply, loops.inner)
    return loops.close(out)


@register_template("stablehlo.sort")
def _sort(op, t: Text, state: LoweringState):
    """Stable bottom-up merge sort along `dimension` (every other index walks in an outer loop):
    runs of width 1, 2, 4, ... merged pairwise from the operands into a scratch buffer and back,
    two passes per step so each buffer keeps its role (and is updated in place): O(n log n)
    comparisons, the comparator's region inlined as scalar code."""
    n = len(op.operands)
    dim = ir.IntegerAttr(op.attributes["dimension"]).value
    fn = state.region_function(op.regions[0], "comparator", t)
    types = [str(v.type) for v in op.operands]
    elems = [_elem(v) for v in op.operands]
    dims = t.dims("%a0", op.operands[0].type)
    length = dims[dim]
    outer = Loops(t, [d for i, d in enumerate(dims) if i != dim], [(f"%a{i}", ty) for i, ty in enumerate(types)]
                  + [(t.buffer(v.type, dims), ty) for v, ty in zip(op.operands, types)])

    def at(pos: str) -> str:
        idx = list(outer.ivs)
        idx.insert(dim, pos)
        return ", ".join(idx)

    def read(buffers: list[str], pos: str) -> list[str]:
        return [t(f"tensor.extract {b}[{at(pos)}] : {ty}") for b, ty in zip(buffers, types)]

    def merge_pass(src: list[str], dst: list[str], width: str) -> list[str]:
        """Merges the runs [lo, lo + width) and [lo + width, lo + 2 width) of `src` into `dst`."""
        step = t(f"arith.muli {width}, {t.const(2)} : index")
        lo, runs, acc = t.fresh("lo"), t.fresh("runs"), [t.fresh("out") for _ in range(n)]
        t.emit(f"{runs}:{n} = scf.for {lo} = {t.const(0)} to {length} step {step} "
               f"iter_args({', '.join(f'{a} = {d}' for a, d in zip(acc, dst))}) -> ({', '.join(types)}) {{")
        mid = t(f"arith.minsi {t(f'arith.addi {lo}, {width} : index')}, {length} : index")
        hi = t(f"arith.minsi {t(f'arith.addi {lo}, {step} : index')}, {length} : index")
        last_left, last = t(f"arith.subi {mid}, {t.const(1)} : index"), t(f"arith.subi {hi}, {t.const(1)} : index")
        # k walks [lo, hi); i the left run, j the right one
        i, j, k, out = t.fresh("i"), t.fresh("j"), t.fresh("k"), [t.fresh("m") for _ in range(n)]
        merged = t.fresh("merge")
        sig = ", ".join(["index"] * 3 + types)
        t.emit(f"{merged}:{n + 3} = scf.while ({i} = {lo}, {j} = {mid}, {k} = {lo}, "
               f"{', '.join(f'{a} = {v}' for a, v in zip(out, acc))}) : ({sig}) -> ({sig}) {{")
        t.emit(f"scf.condition({t(f'arith.cmpi slt, {k}, {hi} : index')}) {i}, {j}, {k}, {', '.join(out)} : {sig}")
        t.emit("} do {")
        i2, j2, k2, out2 = t.fresh("i"), t.fresh("j"), t.fresh("k"), [t.fresh("m") for _ in range(n)]
        t.emit(f"^bb0({i2}: index, {j2}: index, {k2}: index, {', '.join(f'{a}: {ty}' for a, ty in zip(out2, types))}):")
        # positions clamped into their run: a used-up run is read but never taken
        left = read(src, t(f"arith.minsi {i2}, {last_left} : index"))
        right = read(src, t(f"arith.minsi {j2}, {last} : index"))
        left_open, right_open = t(f"arith.cmpi slt, {i2}, {mid} : index"), t(f"arith.cmpi slt, {j2}, {hi} : index")

        def right_first() -> list[str]:  # stable: the right element goes first only when strictly less
            return _call_region(t, fn, [(x, e) for r, l_, e in zip(right, left, elems) for x in (r, l_)], ["i1"])
        both = t(f"arith.andi {right_open}, {left_open} : i1")
        left_done = t(f"arith.xori {left_open}, {t.const('true', 'i1')} : i1")
        take_right = t(f"arith.andi {right_open}, {_if(t, both, ['i1'], right_first, [left_done])[0]} : i1")
        placed = [t(f"tensor.insert {t(f'arith.select {take_right}, {r}, {l_} : {e}')} into {o}[{at(k2)}] : {ty}")
                  for r, l_, e, o, ty in zip(right, left, elems, out2, types)]
        one = t.const(1)
        next_i = t(f"arith.select {take_right}, {i2}, {t(f'arith.addi {i2}, {one} : index')} : index")
        next_j = t(f"arith.select {take_right}, {t(f'arith.addi {j2}, {one} : index')}, {j2} : index")
        t.emit(f"scf.yield {next_i}, {next_j}, {t(f'arith.addi {k2}, {one} : index')}, {', '.join(placed)} : {sig}")
        t.emit("}")
        t.emit(f"scf.yield {', '.join(f'{merged}#{x + 3}' for x in range(n))} : {', '.join(types)}")
        t.emit("}")
        return [f"{runs}#{x}" for x in range(n)]

    # while width < length: width -> scratch, 2 width -> back (a last pass over one run copies)
    w, a, b = t.fresh("width"), [t.fresh("a") for _ in range(n)], [t.fresh("b") for _ in range(n)]
    steps = t.fresh("steps")
    sig = ", ".join(["index"] + types + types)
    start = ", ".join([f"{w} = {t.const(1)}"] + [f"{x} = {v}" for x, v in zip(a + b, outer.inner)])
    t.emit(f"{steps}:{2 * n + 1} = scf.while ({start}) : ({sig}) -> ({sig}) {{")
    t.emit(f"scf.condition({t(f'arith.cmpi slt, {w}, {length} : index')}) {w}, {', '.join(a + b)} : {sig}")
    t.emit("} do {")
    w2, a2, b2 = t.fresh("width"), [t.fresh("a") for _ in range(n)], [t.fresh("b") for _ in range(n)]
    t.emit(f"^bb0({w2}: index, {', '.join(f'{x}: {ty}' for x, ty in zip(a2 + b2, types + types))}):")
    scratch = merge_pass(a2, b2, w2)
    doubled = t(f"arith.muli {w2}, {t.const(2)} : index")
    back = merge_pass(scratch, a2, doubled)
    t.emit(f"scf.yield {t(f'arith.muli {doubled}, {t.const(2)} : index')}, {', '.join(back + scratch)} : {sig}")
    t.emit("}")
    return outer.close([f"{steps}#{x + 1}" for x in range(2 * n)])[:n]


def _window_count(t: Text, padded: str, window: str, stride: str, dilation: str) -> str:
    """How many windows fit in a padded extent (index values): (padded - reach) / stride + 1, at
    least 0, where reach = (window - 1) * dilation + 1."""
    one = t.const(1)
    span = t(f"arith.muli {t(f'arith.subi {window}, {one} : index')}, {dilation} : index")
    reach = t(f"arith.addi {span}, {one} : index")
    steps = t(f"arith.floordivsi {t(f'arith.subi {padded}, {reach} : index')}, {stride} : index")
    return t(f"arith.maxsi {t(f'arith.addi {steps}, {one} : index')}, {t.const(0)} : index")


def _window_reduce(t: Text, op, fn: str, n: int, window: list[str], strides: list[str], base_dil: list[str],
                   win_dil: list[str], pad_lo: list[str], pad_hi: list[str]) -> list[str]:
    """reduce_window over operands %a0..%a{n-1} with init values %a{n}..%a{2n-1}; every
    window parameter is an index value. Padding and base-dilation holes read the init value."""
    inputs, inits = op.operands[:n], op.operands[n:2 * n]
    rank = _rank(inputs[0])
    elems = [_elem(v) for v in inputs]
    in_dims = t.dims("%a0", inputs[0].type)
    rt = ir.RankedTensorType(op.results[0].type)
    one = t.const(1)
    out_dims = []
    for d in range(rank):
        if not rt.is_dynamic_dim(d):
            out_dims.append(t.const(rt.shape[d]))
            continue
        last = t(f"arith.subi {in_dims[d]}, {one} : index")
        dilated = t(f"arith.addi {t(f'arith.muli {last}, {base_dil[d]} : index')}, {one} : index")
        padded = t(f"arith.addi {dilated}, {t(f'arith.addi {pad_lo[d]}, {pad_hi[d]} : index')} : index")
        out_dims.append(_window_count(t, padded, window[d], strides[d], win_dil[d]))
    init_vals = [t(f"tensor.extract %a{n + i}[] : {v.type}") for i, v in enumerate(inits)]
    outs = [t.buffer(r.type, out_dims) for r in op.results]
    result_types = [str(r.type) for r in op.results]
    loops = Loops(t, out_dims, list(zip(outs, result_types)))
    # window positions: one scf.for nest carrying the accumulators
    win = Loops(t, window, list(zip(init_vals, elems)))
    src, conds = [], []
    for d in range(rank):
        base = t(f"arith.muli {loops.ivs[d]}, {strides[d]} : index")
        offset = t(f"arith.muli {win.ivs[d]}, {win_dil[d]} : index")
        p = t(f"arith.subi {t(f'arith.addi {base}, {offset} : index')}, {pad_lo[d]} : index")
        q = t(f"arith.divsi {p}, {base_dil[d]} : index")
        on_grid = t(f"arith.cmpi eq, {t(f'arith.remsi {p}, {base_dil[d]} : index')}, {t.const(0)} : index")
        conds += [t(f"arith.cmpi sge, {p}, {t.const(0)} : index"), on_grid, t(f"arith.cmpi slt, {q}, {in_dims[d]} : index")]
        src.append(q)
    inside = _all(t, conds)
    vals = _if(t, inside, elems, lambda: [t(f"tensor.extract %a{i}[{', '.join(src)}] : {v.type}") for i, v in enumerate(inputs)], init_vals)
    new = _call_region(t, fn, list(zip(win.inner, elems)) + list(zip(vals, elems)), elems)
    reduced = win.close(new)
    stored = [t(f"tensor.insert {r} into {acc}[{', '.join(loops.ivs)}] : {ty}") for r, acc, ty in zip(reduced, loops.inner, result_types)]
    return loops.close(stored)


# a window body that is one of these ops on its two arguments: float op, signed integer op
_WINDOW_COMBINERS = {"stablehlo.add": ("arith.addf", "arith.addi"), "stablehlo.multiply": ("arith.mulf", "arith.muli"),
                     "stablehlo.maximum": ("arith.maximumf", "arith.maxsi"), "stablehlo.minimum": ("arith.minimumf", "arith.minsi")}


def _window_combiner(op: ir.Operation, body: ir.Block, base_dilations: list[int]) -> str | None:
    """The arith op of a one-operand reduce_window whose body combines its two arguments with
    one of `_WINDOW_COMBINERS` (pooling: max, sum), without base dilation; else None."""
    if len(op.results) != 1 or any(d != 1 for d in base_dilations):
        return None
    ops = list(body.operations)
    if len(ops) != 2 or ops[0].name not in _WINDOW_COMBINERS or set(ops[0].operands) != set(body.arguments):
        return None
    elem = ir.RankedTensorType(op.operands[0].type).element_type
    if isinstance(elem, ir.FloatType):
        return _WINDOW_COMBINERS[ops[0].name][0]
    if isinstance(elem, ir.IntegerType) and elem.is_signless and elem.width > 1:
        return _WINDOW_COMBINERS[ops[0].name][1]
    return None


def _pooling(op, t: Text, combine: str, window: list[int], strides: list[int], dilations: list[int],
             pad_lo: list[int | str], pad_hi: list[int | str]) -> list[str]:
    """reduce_window as one linalg.generic: the output's dims parallel, the window's a
    reduction, the padded input read at `out * stride + window * dilation`. It becomes a
    parallel loop nest on the thread pool like any other reduction. Padding amounts are ints or
    index values (JAX's "SAME" padding over a dynamic dim)."""
    rank = _rank(op.operands[0])
    elem, in_type = _elem(op.operands[0]), ir.RankedTensorType(op.operands[0].type)
    init = t(f"tensor.extract %a1[] : {op.operands[1].type}")
    src, src_type = "%a0", str(in_type)
    if any(p != 0 for p in pad_lo + pad_hi):
        shape = "x".join("?" if in_type.is_dynamic_dim(d) or isinstance(pad_lo[d], str) or isinstance(pad_hi[d], str)
                         else str(in_type.shape[d] + pad_lo[d] + pad_hi[d]) for d in range(rank))
        src_type = f"tensor<{shape}x{elem}>"
        src = _pad(t, "%a0", in_type, init, src_type, pad_lo, pad_hi, [0] * rank)
    padded = t.dims(src, ir.Type.parse(src_type))
    out_dims = [_window_count(t, padded[d], t.const(window[d]), t.const(strides[d]), t.const(dilations[d])) for d in range(rank)]
    ty = str(op.results[0].type)
    acc = t(f"linalg.fill ins({init} : {elem}) outs({t.empty(op.results[0].type, out_dims)} : {ty}) -> {ty}")
    shape = t(f"tensor.empty() : tensor<{'x'.join(map(str, window))}x{elem}>")
    loops = ", ".join(f"d{i}" for i in range(2 * rank))
    read = ", ".join(f"d{d} * {strides[d]} + d{rank + d} * {dilations[d]}" for d in range(rank))
    maps = [f"affine_map<({loops}) -> ({read})>", f"affine_map<({loops}) -> ({', '.join(f'd{rank + d}' for d in range(rank))})>",
            f"affine_map<({loops}) -> ({', '.join(f'd{d}' for d in range(rank))})>"]
    kinds = ", ".join(['"parallel"'] * rank + ['"reduction"'] * rank)
    res = t.fresh("pool")
    t.emit(f"{res} = linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{kinds}]}} "
           f"ins({src}, {shape} : {src_type}, tensor<{'x'.join(map(str, window))}x{elem}>) outs({acc} : {ty}) {{")
    t.emit(f"^bb0(%x: {elem}, %w: {elem}, %acc: {elem}):")
    t.emit(f"  %r = {combine} %acc, %x : {elem}")
    t.emit(f"  linalg.yield %r : {elem}")
    t.emit(f"}} -> {ty}")
    return [res]


def _scan_dim(op: ir.Operation, window: list[int | None]) -> int | None:
    """The dim along which a reduce_window may be a cumulative op (cumsum, cummax, ...): the only
    dim whose window is not known to be 1, of a size not known to exceed its window; None when
    there is none or the op has several operands or a complex element type."""
    wide = [d for d, w in enumerate(window) if w != 1]
    if len(op.results) != 1 or _elem(op.operands[0]).startswith("complex") or len(wide) != 1:
        return None
    in_type = ir.RankedTensorType(op.operands[0].type)
    dim = wide[0]
    if window[dim] is not None and (in_type.is_dynamic_dim(dim) or in_type.shape[dim] > window[dim]):
        return None  # a sliding window, never a prefix
    return dim


def _scan(t: Text, op, fn: str, dim: int, backward: str, init: str, combine: str | None) -> str:
    """A cumulative op in one pass: element i along `dim` is fn(result at i - 1, x[i]) (i + 1 when
    `backward`, an i1 value), the first fn(init, x[first]); every other dim walks in row-major
    order, so the element before is one the loops wrote last. O(n), nothing allocated per
    element, the body's scalar code inlined. A sum or product of 16-bit floats (`combine`) runs
    in f32, each result rounded (a running sum rounded to bf16 at every step drifted: 64 off after
    1e5 steps, against XLA's 3.7, whose arithmetic on 16-bit floats is f32's)."""
    elem, ty = _elem(op.operands[0]), str(op.results[0].type)
    dims = t.dims("%a0", op.operands[0].type)
    if elem in ("bf16", "f16") and combine in ("arith.addf", "arith.mulf"):
        return _scan_in_f32(t, op, combine, dim, backward, init, dims)
    loops = Loops(t, dims, [(t.buffer(op.results[0].type, dims), ty)])
    at, prev, first = _scan_positions(t, loops, dims, dim, backward)
    out = loops.inner[0]
    before_value = t(f"tensor.extract {out}[{', '.join(prev)}] : {ty}")
    acc = t(f"arith.select {first}, {init}, {before_value} : {elem}")
    x = t(f"tensor.extract %a0[{', '.join(at)}] : {op.operands[0].type}")
    new = _call_region(t, fn, [(acc, elem), (x, elem)], [elem])[0]
    return loops.close([t(f"tensor.insert {new} into {out}[{', '.join(at)}] : {ty}")])[0]


def _scan_positions(t: Text, loops: Loops, dims: list[str], dim: int, backward: str) -> tuple[list[str], list[str], str]:
    """The element a scan writes (`at`), the one before it along `dim` (`prev`: in bounds, unused
    for the first), and whether it is the first."""
    one, last = t.const(1), t(f"arith.subi {dims[dim]}, {t.const(1)} : index")
    step = loops.ivs[dim]
    pos = t(f"arith.select {backward}, {t(f'arith.subi {last}, {step} : index')}, {step} : index")
    first = t(f"arith.cmpi eq, {step}, {t.const(0)} : index")
    before = t(f"arith.select {backward}, {t(f'arith.addi {pos}, {one} : index')}, {t(f'arith.subi {pos}, {one} : index')} : index")
    at, prev = list(loops.ivs), list(loops.ivs)
    at[dim] = pos
    prev[dim] = t(f"arith.select {first}, {pos}, {before} : index")
    return at, prev, first


def _scan_in_f32(t: Text, op, combine: str, dim: int, backward: str, init: str, dims: list[str]) -> str:
    """`_scan` of a 16-bit float sum or product: the running values in an f32 tensor beside the result."""
    elem, ty = _elem(op.operands[0]), str(op.results[0].type)
    wide_type = ir.RankedTensorType.get(ir.RankedTensorType(op.results[0].type).shape, ir.F32Type.get())
    wide = str(wide_type)
    loops = Loops(t, dims, [(t.buffer(op.results[0].type, dims), ty), (t.buffer(wide_type, dims), wide)])
    at, prev, first = _scan_positions(t, loops, dims, dim, backward)
    out, running = loops.inner
    before = t(f"tensor.extract {running}[{', '.join(prev)}] : {wide}")
    acc = t(f"arith.select {first}, {t(f'arith.extf {init} : {elem} to f32')}, {before} : f32")
    x = t(f"tensor.extract %a0[{', '.join(at)}] : {op.operands[0].type}")
    new = t(f"{combine} {acc}, {t(f'arith.extf {x} : {elem} to f32')} : f32")
    where = ", ".join(at)
    return loops.close([t(f"tensor.insert {t(f'arith.truncf {new} : f32 to {elem}')} into {out}[{where}] : {ty}"),
                        t(f"tensor.insert {new} into {running}[{where}] : {wide}")])[0]


def _scan_or(t: Text, op, fn: str, dim: int, window: list[str], strides: list[str], base_dil: list[str], win_dil: list[str],
             pad_lo: list[str], pad_hi: list[str], general, combine: str | None) -> list[str]:
    """reduce_window as a scan (`_scan`) where, at run time, it is a cumulative op along `dim`:
    unit strides and dilations, every other dim a window of 1 without padding, along `dim` a
    window at least the dim's size padded by window - 1 in front (element i reduces 0..i) or
    behind (i..n-1), and an init value the body leaves unchanged when combined with itself (0
    for a sum, 1 for a product, any for max / min), so the padding's extra inits change nothing.
    Otherwise `general()` (every parameter an index value)."""
    one, zero = t.const(1), t.const(0)

    def eq(a: str, b: str) -> str:
        return t(f"arith.cmpi eq, {a}, {b} : index")
    conds = [eq(v, one) for v in strides + base_dil + win_dil]
    for d in range(len(window)):
        if d != dim:
            conds += [eq(window[d], one), eq(pad_lo[d], zero), eq(pad_hi[d], zero)]
    reach = t(f"arith.subi {window[dim]}, {one} : index")
    forward = _all(t, [eq(pad_lo[dim], reach), eq(pad_hi[dim], zero)])
    backward = _all(t, [eq(pad_lo[dim], zero), eq(pad_hi[dim], reach)])
    conds += [t(f"arith.cmpi sge, {window[dim]}, {t.dim('%a0', op.operands[0].type, dim)} : index"),
              t(f"arith.ori {forward}, {backward} : i1")]
    elem = _elem(op.operands[0])
    init = t(f"tensor.extract %a1[] : {op.operands[1].type}")
    twice = _call_region(t, fn, [(init, elem), (init, elem)], [elem])[0]
    if elem.startswith("ui"):  # arith compares signless integers; make_signless drops the casts
        a, b = (t(f"builtin.unrealized_conversion_cast {v} : {elem} to {elem[1:]}") for v in (twice, init))
        conds.append(t(f"arith.cmpi eq, {a}, {b} : {elem[1:]}"))
    else:
        conds.append(t(f"arith.cmpf oeq, {twice}, {init} : {elem}" if elem.startswith(("f", "bf")) else f"arith.cmpi eq, {twice}, {init} : {elem}"))
    return _if(t, _all(t, conds), [str(op.results[0].type)], lambda: [_scan(t, op, fn, dim, backward, init, combine)], general)


@register_template("stablehlo.reduce_window")
def _reduce_window(op, t: Text, state: LoweringState):
    rank = _rank(op.operands[0])
    padding = int_list(op, "padding") or [0] * (2 * rank)
    window = int_list(op, "window_dimensions")
    strides, base = int_list(op, "window_strides") or [1] * rank, int_list(op, "base_dilations") or [1] * rank
    win_dil = int_list(op, "window_dilations") or [1] * rank
    combine = _window_combiner(op, op.regions[0].blocks[0], base)
    scan = _scan_dim(op, window)
    if scan is None and combine is not None and min(padding) >= 0:
        return _pooling(op, t, combine, window, strides, win_dil, padding[0::2], padding[1::2])
    fn = state.region_function(op.regions[0], "window_body", t)

    def idx(values: list[int]) -> list[str]:
        return [t.const(v) for v in values]
    params = (idx(window), idx(strides), idx(base), idx(win_dil), idx(padding[0::2]), idx(padding[1::2]))

    def general() -> list[str]:
        return _window_reduce(t, op, fn, len(op.results), *params)
    return general() if scan is None else _scan_or(t, op, fn, scan, *params, general, combine)


def _is_dynamic_reduce_window(op: ir.Operation) -> bool:
    return call_target(op) == "stablehlo.dynamic_reduce_window"


@register_template("stablehlo.custom_call", when=_is_dynamic_reduce_window)
def _dynamic_reduce_window(op, t: Text, state: LoweringState):
    """JAX's form of reduce_window whose parameters are run-time tensors: operands are inputs,
    init values, then window dims, strides, base and window dilations, padding [rank, 2]."""
    n = len(op.results)
    rank = _rank(op.operands[0])
    pad = op.operands[2 * n + 4].type
    lo = [t.extract_index(f"%a{2 * n + 4}", pad, [t.const(i), t.const(0)]) for i in range(rank)]
    hi = [t.extract_index(f"%a{2 * n + 4}", pad, [t.const(i), t.const(1)]) for i in range(rank)]
    known = [_constant_elements(op.operands[2 * n + k]) for k in range(4)]  # window, strides, base and window dilations
    fixed = [None if None in k else k for k in known]
    name = ir.FlatSymbolRefAttr(ir.ArrayAttr(op.attributes["called_computations"])[0]).value
    func = find_function(state.module, name)
    scan = _scan_dim(op, known[0])
    combine = _window_combiner(op, func.regions[0].blocks[0], fixed[2]) if None not in fixed and func is not None else None
    if scan is None and combine is not None:  # padding is checked for >= 0 by JAX's own formula (SAME / VALID)
        return _pooling(op, t, combine, fixed[0], fixed[1], fixed[3], lo, hi)
    fn = state.declare_function(name, t)

    def vec(k):
        return [t.extract_index(f"%a{2 * n + k}", op.operands[2 * n + k].type, [t.const(i)]) for i in range(rank)]
    params = (vec(0), vec(1), vec(2), vec(3), lo, hi)

    def general() -> list[str]:
        return _window_reduce(t, op, fn, n, *params)
    scan_combine = _window_combiner(op, func.regions[0].blocks[0], [1] * rank) if func is not None else None  # (dilations checked then)
    return general() if scan is None else _scan_or(t, op, fn, scan, *params, general, scan_combine)


def _constant_elements(v: ir.Value) -> list[int | None]:
    """The elements of an integer vector known at compile time (None for the others): a
    `stablehlo.constant` or a concatenation of parts (JAX builds window parameters so)."""
    size = ir.RankedTensorType(v.type).shape[0]
    op = None if isinstance(v.owner, ir.Block) else operation(v.owner)
    if op is not None and op.name == "stablehlo.concatenate":
        return [x for part in op.operands for x in _constant_elements(part)]
    if op is None or op.name != "stablehlo.constant":
        return [None] * size
    attr = ir.DenseIntElementsAttr(op.attributes["value"])
    return [int(attr[0])] * size if attr.is_splat else [int(x) for x in attr]


@register_template("stablehlo.select_and_scatter")
def _select_and_scatter(op, t: Text, state: LoweringState):
    """For each source element, the window element of the operand that `select` prefers
    (padding never wins) receives scatter(result[it], source)."""
    operand, source = op.operands[0], op.operands[1]
    rank = _rank(operand)
    window = int_list(op, "window_dimensions")
    strides = int_list(op, "window_strides") or [1] * rank
    padding = int_list(op, "padding") or [0] * (2 * rank)
    select = state.region_function(op.regions[0], "select", t)
    scatter = state.region_function(op.regions[1], "scatter", t)
    elem, ty = _elem(operand), str(op.result.type)
    in_dims = t.dims("%a0", operand.type)
    init = t(f"tensor.extract %a2[] : {op.operands[2].type}")
    filled = t(f"linalg.fill ins({init} : {elem}) outs({t.empty(op.result.type, in_dims)} : {ty}) -> {ty}")
    outer = Loops(t, t.dims("%a1", source.type), [(filled, ty)])
    carried = [(t.const("false", "i1"), "i1"), (init, elem)]  # (found one, best value): unread until found
    carried += [(t.const(0), "index")] * rank
    win = Loops(t, [t.const(w) for w in window], carried)
    has, best, best_idx = win.inner[0], win.inner[1], win.inner[2:]
    pos = []
    for o, w, s, lo in zip(outer.ivs, win.ivs, strides, padding[0::2]):
        start = t(f"arith.muli {o}, {t.const(s)} : index")
        pos.append(t(f"arith.subi {t(f'arith.addi {start}, {w} : index')}, {t.const(lo)} : index"))
    inside = _all(t, [_in_range(t, p, d) for p, d in zip(pos, in_dims)])

    def consider():
        val = t(f"tensor.extract %a0[{', '.join(pos)}] : {operand.type}")
        keep = _if(t, has, ["i1"], lambda: _call_region(t, select, [(best, elem), (val, elem)], ["i1"]), [t.const("false", "i1")])[0]
        take = t(f"arith.xori {keep}, {t.const('true', 'i1')} : i1")
        return [t.const("true", "i1"), t(f"arith.select {take}, {val}, {best} : {elem}")] + \
            [t(f"arith.select {take}, {p}, {b} : index") for p, b in zip(pos, best_idx)]
    chosen = win.close(_if(t, inside, ["i1", elem] + ["index"] * rank, consider, win.inner))
    acc = outer.inner[0]

    def scatter_into():
        cur = t(f"tensor.extract {acc}[{', '.join(chosen[2:])}] : {ty}")
        src = t(f"tensor.extract %a1[{', '.join(outer.ivs)}] : {source.type}")
        new = _call_region(t, scatter, [(cur, elem), (src, elem)], [elem])[0]
        return [t(f"tensor.insert {new} into {acc}[{', '.join(chosen[2:])}] : {ty}")]
    return outer.close(_if(t, chosen[0], [ty], scatter_into, [acc]))


@register_template("stablehlo.triangular_solve")
def _triangular_solve(op, t: Text, state: LoweringState):
    """Forward or backward substitution, one row of the solution at a time. The right-side
    form x op(a) = b is solved as op(a)^T x^T = b^T by swapping indices; complex elements with
    the complex dialect's arithmetic (ADJOINT: the conjugates of a's elements)."""
    a, b = op.operands
    left = ir.BoolAttr(op.attributes["left_side"]).value
    lower = ir.BoolAttr(op.attributes["lower"]).value
    unit = ir.BoolAttr(op.attributes["unit_diagonal"]).value
    transposed = "NO_TRANSPOSE" not in str(op.attributes["transpose_a"])
    forward = lower != transposed if left else lower == transposed  # is the effective matrix lower?
    rank, elem, ty = _rank(a), _elem(a), str(b.type)
    is_complex = elem.startswith("complex")
    mul, sub, div = ("complex.mul", "complex.sub", "complex.div") if is_complex else ("arith.mulf", "arith.subf", "arith.divf")
    conjugate = is_complex and "ADJOINT" in str(op.attributes["transpose_a"])
    dims = t.dims("%a1", b.type)
    m = t.dim("%a0", a.type, rank - 1)
    n = dims[rank - 1] if left else dims[rank - 2]
    batch = Loops(t, dims[:rank - 2], [("%a1", ty)])
    steps = Loops(t, [m], [(batch.inner[0], ty)])
    i = steps.ivs[0] if forward else t(f"arith.subi {t(f'arith.subi {m}, {steps.ivs[0]} : index')}, {t.const(1)} : index")

    def a_at(r: str, c: str) -> str:  # element (r, c) of the effective left-side matrix
        swap = transposed != (not left)
        value = t(f"tensor.extract %a0[{', '.join(batch.ivs + ([c, r] if swap else [r, c]))}] : {a.type}")
        return t(f"complex.conj {value} : {elem}") if conjugate else value

    def x_index(row: str, col: str) -> str:
        return ", ".join(batch.ivs + ([row, col] if left else [col, row]))
    cols = Loops(t, [n], [(steps.inner[0], ty)])
    x, c = cols.inner[0], cols.ivs[0]
    rhs = t(f"tensor.extract {x}[{x_index(i, c)}] : {ty}")
    count = i if forward else t(f"arith.subi {t(f'arith.subi {m}, {i} : index')}, {t.const(1)} : index")
    terms = Loops(t, [count], [(rhs, elem)])
    k = terms.ivs[0] if forward else t(f"arith.addi {t(f'arith.addi {i}, {t.const(1)} : index')}, {terms.ivs[0]} : index")
    product = t(f"{mul} {a_at(i, k)}, {t(f'tensor.extract {x}[{x_index(k, c)}] : {ty}')} : {elem}")
    acc = terms.close([t(f"{sub} {terms.inner[0]}, {product} : {elem}")])[0]
    value = acc if unit else t(f"{div} {acc}, {a_at(i, i)} : {elem}")
    solved = cols.close([t(f"tensor.insert {value} into {x}[{x_index(i, c)}] : {ty}")])
    return batch.close(steps.close(solved))
