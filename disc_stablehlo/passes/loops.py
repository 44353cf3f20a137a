"""Loop fusion and the shape of the parallel loops, on buffers (after linalg -> scf.parallel).

- Fusion. Consecutive top-level `scf.parallel` loops whose leading dims are the same (same
  bounds: the shape analysis made equal dims the same SSA values) are fused over those dims, the
  "rows", when every buffer one of them writes and the other touches is accessed only at the
  current row (its leading indices are the row's induction variables). Each row then runs the
  loops' bodies one after the other, so what a row writes stays in cache until the next body
  reads it: a reduction with its consumers (softmax, layer norm: "stitch" fusion), with its
  producers ("input" fusion), or elementwise loops that upstream fusion could not merge ("loop").
- Shape. An elementwise loop's trailing dims that every buffer walks as one run of memory merge
  into one (`flatten_contiguous_loops`). A loop's leading dims (all but the innermost, which
  stays a loop LLVM vectorises) are then collapsed into one linear dim, so the thread pool
  splits all rows, not just the first dim (batch 1 would otherwise run on one thread)."""

from __future__ import annotations

import functools
import math
from typing import Callable

from torch_mlir import ir

from ..mlir_support import (clone_ops, create_value, defined_outside, find_function, identity_layout, index_compare,
                            index_constant, int_constant, nested_in, operation, run_pipeline, walk)

EPILOGUE_ATTR = "disc.gemm_epilogue"  # on a GEMM call and the loop that runs behind it: the same id

# ops between two loops that may move above the first one (their operands permitting)
_HOISTABLE = ("arith.", "memref.alloc", "memref.dim", "memref.expand_shape", "memref.collapse_shape", "memref.cast",
              "memref.subview", "memref.reinterpret_cast", "memref.extract_strided_metadata", "memref.view",
              "affine.apply")
VIEWS = ("memref.expand_shape", "memref.collapse_shape", "memref.cast", "memref.subview", "memref.reinterpret_cast",
          "memref.reshape", "memref.view", "memref.transpose")
FUSED_ATTR = "disc.fusion"  # on a fused loop: its fusion kind (read by the kernel descriptions)


def _binary(name: str, a: ir.Value, b: ir.Value) -> ir.Value:
    return create_value(name, [a, b], a.type)


def _in_parallel(op: ir.Operation) -> bool:
    return nested_in(op, "scf.parallel")


def _dims(loop: ir.Operation) -> int:
    return len(loop.regions[0].blocks[0].arguments)


def loop_bounds(loop: ir.Operation) -> list[tuple[ir.Value, ir.Value, ir.Value]]:
    """(lower bound, upper bound, step) per dim of an scf.parallel or scf.for."""
    ops = list(loop.operands)
    if loop.name == "scf.for":
        return [(ops[0], ops[1], ops[2])]
    n = _dims(loop)
    return [(ops[i], ops[n + i], ops[2 * n + i]) for i in range(n)]


def _new_loop(bounds: list[tuple[ir.Value, ir.Value, ir.Value]]) -> tuple[ir.Operation, ir.Block]:
    """An empty scf.parallel over `bounds` (at the current insertion point) and its body."""
    n = len(bounds)
    loop = ir.Operation.create("scf.parallel", operands=[b[0] for b in bounds] + [b[1] for b in bounds] + [b[2] for b in bounds],
                               attributes={"operandSegmentSizes": ir.DenseI32ArrayAttr.get([n, n, n, 0])}, regions=1)
    body = loop.regions[0].blocks.append(*[ir.IndexType.get()] * n)
    with ir.InsertionPoint(body):
        ir.Operation.create("scf.reduce")
    return loop, body


def _scf_for(lb: ir.Value, ub: ir.Value, step: ir.Value, inits: list[ir.Value]) -> tuple[ir.Operation, ir.Block]:
    """An scf.for at the current insertion point, its body empty (no terminator yet)."""
    loop = ir.Operation.create("scf.for", operands=[lb, ub, step, *inits], results=[v.type for v in inits], regions=1)
    return loop, loop.regions[0].blocks.append(ir.IndexType.get(), *[v.type for v in inits])


def _move_body(src: ir.Block, dst: ir.Block, ivs: list[ir.Value]) -> None:
    """Moves `src`'s ops but its terminator before `dst`'s terminator; `src`'s arguments become `ivs`."""
    for old, new in zip(src.arguments, ivs):
        old.replace_all_uses_with(new)
    terminator = list(dst.operations)[-1]
    for op in list(src.operations)[:-1]:
        op.operation.move_before(terminator)


def _replace(old: ir.Operation, new: ir.Operation) -> None:
    """Erases the (emptied) loop `old`; `new`, which took its body, keeps its attributes."""
    for name in old.attributes:
        if name != "operandSegmentSizes":
            new.attributes[name] = old.attributes[name]
    old.erase()


def _split(loop: ir.Operation, k: int) -> ir.Operation:
    """loop(d0..dn) -> loop(d0..dk-1) { loop(dk..dn) { body } }; returns the outer loop."""
    bounds = loop_bounds(loop)
    if k >= len(bounds):
        return loop
    with ir.InsertionPoint(loop), loop.location:
        outer, outer_body = _new_loop(bounds[:k])
    with ir.InsertionPoint(list(outer_body.operations)[-1]), loop.location:
        inner, inner_body = _new_loop(bounds[k:])
    body = loop.regions[0].blocks[0]
    _move_body(body, inner_body, list(outer_body.arguments) + list(inner_body.arguments))
    _replace(loop, outer)
    return outer


def _same_bound(a: ir.Value, b: ir.Value) -> bool:
    if a == b:
        return True
    ca, cb = (int_constant(v) for v in (a, b))
    return ca is not None and ca == cb


def _root(v: ir.Value) -> ir.Value:
    while not isinstance(v.owner, ir.Block) and operation(v.owner).name in VIEWS:
        v = operation(v.owner).operands[0]
    return v


def _accesses(loop: ir.Operation) -> list[tuple[ir.Value, list[ir.Value], bool]] | None:
    """(memref, indices, writes) of every load and store in `loop`; None if something else
    touches memory (a call, a copy), which this pass cannot reason about."""
    found = []
    for op in list(walk(loop))[1:]:
        if op.name in ("memref.load", "memref.store"):
            store = op.name == "memref.store"
            ref = op.operands[1] if store else op.operands[0]
            found.append((ref, list(op.operands)[2 if store else 1:], store))
        elif op.name in ("memref.dim", "memref.extract_strided_metadata") or op.name in VIEWS:
            continue
        elif any(isinstance(v.type, ir.MemRefType) for v in op.operands) or op.name.startswith(("func.call", "llvm.call")):
            return None
    return found


def _row_local(first: ir.Operation, second: ir.Operation, k: int) -> bool:
    """Whether fusing over the leading k dims keeps every dependence between the loops within
    one row: each buffer written by one and touched by the other is read and written through
    one memref value, always at indices that start with the row's induction variables."""
    acc1, acc2 = _accesses(first), _accesses(second)
    if acc1 is None or acc2 is None:
        return False
    ivs1, ivs2 = list(first.regions[0].blocks[0].arguments)[:k], list(second.regions[0].blocks[0].arguments)[:k]
    writes1 = {_root(r) for r, _, w in acc1 if w}
    writes2 = {_root(r) for r, _, w in acc2 if w}
    touched1, touched2 = {_root(r) for r, _, _ in acc1}, {_root(r) for r, _, _ in acc2}
    shared = (writes1 & touched2) | (writes2 & touched1)
    for root in shared:
        refs = set()
        for accesses, ivs in ((acc1, ivs1), (acc2, ivs2)):
            for ref, indices, _ in accesses:
                if _root(ref) != root:
                    continue
                ref, indices = _through_unit_expansions(ref, indices)
                refs.add(ref)
                if len(indices) < k or any(i != v for i, v in zip(indices[:k], ivs)):
                    return False
        if len(refs) > 1:
            return False
    return True


def _dim_value(ref: ir.Value, i: int) -> ir.Value | int | None:
    """Dim i of a buffer or view: its static size, or the SSA size its allocation or expansion
    was given (through collapses that merge it with size-1 dims); None when neither says."""
    t = ir.MemRefType(ref.type)
    if not t.is_dynamic_dim(i):
        return t.shape[i]
    if isinstance(ref.owner, ir.Block):
        return None
    op = operation(ref.owner)
    if op.name == "memref.collapse_shape":
        group = [int(d) for d in ir.ArrayAttr(op.attributes["reassociation"])[i]]
        src = ir.MemRefType(op.operands[0].type)
        sized = [d for d in group if src.is_dynamic_dim(d) or src.shape[d] != 1]
        return _dim_value(op.operands[0], sized[0]) if len(sized) == 1 else None
    dynamic = [d for d in range(t.rank) if t.is_dynamic_dim(d)]
    sizes = {"memref.alloc": list(op.operands), "memref.expand_shape": list(op.operands)[1:]}.get(op.name)
    return sizes[dynamic.index(i)] if sizes is not None and len(sizes) == len(dynamic) else None


def _resolve(v: ir.Value | int | None) -> ir.Value | int | None:
    """A size read by `memref.dim` of a view as the size the view was built from."""
    while isinstance(v, ir.Value) and not isinstance(v.owner, ir.Block) and operation(v.owner).name == "memref.dim":
        op = operation(v.owner)
        i = int_constant(op.operands[1])
        found = _dim_value(op.operands[0], i) if i is not None else None
        if found is None:
            return v
        v = found
    return int_constant(v) if isinstance(v, ir.Value) and int_constant(v) is not None else v


def _same_size(size: ir.Value | int | None, bound: ir.Value) -> bool:
    size, bound = _resolve(size), _resolve(bound)
    return size is not None and (size == bound if isinstance(size, int) or isinstance(bound, int) else _same_bound(size, bound))


def _through_unit_expansions(ref: ir.Value, indices: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
    """An access through `memref.expand_shape` views that only add size-1 dims (a reduction's
    kept dim, [b, h, s, 1, s] over [b, h, s, s]) as the same access of the expanded buffer."""
    while not isinstance(ref.owner, ir.Block) and operation(ref.owner).name == "memref.expand_shape":
        op, t = operation(ref.owner), ir.MemRefType(ref.type)
        base = []
        for group in ir.ArrayAttr(op.attributes["reassociation"]):
            sized = [int(d) for d in group if t.is_dynamic_dim(int(d)) or t.shape[int(d)] != 1]
            if len(sized) > 1:
                return ref, indices
            base.append(indices[sized[0] if sized else int(group[0])])
        ref, indices = op.operands[0], base
    return ref, indices


def _kind(loop: ir.Operation) -> str:
    if FUSED_ATTR in loop.attributes:
        return ir.StringAttr(loop.attributes[FUSED_ATTR]).value
    return "reduction" if any(op.name == "scf.for" for op in walk(loop)) else "loop"


def _fused_kind(first: str, second: str) -> str:
    """reduction then consumer: stitch; producer then reduction: input; otherwise the stronger."""
    if first in ("reduction", "input", "stitch") and second in ("loop", "stitch"):
        return "stitch"
    if "stitch" in (first, second):
        return "stitch"
    if second == "reduction" or "input" in (first, second):
        return "input"
    return "loop"


def copies_to_linalg(module: ir.Module) -> None:
    """Buffer copies bufferization inserts (`memref.copy`, a runtime call) become linalg copies:
    loops that run on the thread pool and can fuse with their neighbours."""
    for op in walk(module.operation):
        if op.name == "memref.copy":
            source, dest = op.operands
            with ir.InsertionPoint(op), op.location:
                copy = ir.Operation.create("linalg.copy", operands=[source, dest], regions=1,
                                           attributes={"operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1])})
                body = copy.regions[0].blocks.append(ir.MemRefType(source.type).element_type, ir.MemRefType(dest.type).element_type)
                with ir.InsertionPoint(body):
                    ir.Operation.create("linalg.yield", operands=[body.arguments[0]])
            op.erase()


def fuse_loops(module: ir.Module) -> int:
    """Fuses consecutive top-level parallel loops over their common rows; returns the number of
    fusions made."""
    fused = 0
    for func in [op for op in walk(module.operation) if op.name == "func.func"]:
        # blocks outside parallel loops (fusion erases loops, and the blocks inside them)
        blocks = [b for op in walk(func) if op.name != "scf.parallel" and not _in_parallel(op) for r in op.regions for b in r.blocks]
        for block in blocks:
            current, between = None, []  # the loop fusion may extend, the ops after it
            for op in [o.operation for o in block.operations]:
                if op.name != "scf.parallel":
                    if not op.name.startswith(_HOISTABLE) or op.regions:
                        current = None  # a barrier (a call, a store, another loop): loops on either side stay apart
                    between.append(op)
                    continue
                if op.results or _in_parallel(op):
                    current = None
                    continue
                merged = _try_fuse(current, op, between) if current is not None else None
                if merged is not None:
                    fused += 1
                current, between = merged or op, []
    return fused


def _try_fuse(first: ir.Operation, second: ir.Operation, between: list[ir.Operation]) -> ir.Operation | None:
    """The fused loop, or None when the two loops cannot fuse. `between`: the ops between them
    (allocations, shape arithmetic: nothing that reads or writes buffer contents), moved above
    the first loop."""
    b1, b2 = loop_bounds(first), loop_bounds(second)
    k = min(len(b1), len(b2))
    if any(not all(_same_bound(x, y) for x, y in zip(p, q)) for p, q in zip(b1[:k], b2[:k])):
        return None
    if not _row_local(first, second, k):
        return None
    for op in between:
        op.move_before(first)
    kind = _fused_kind(_kind(first), _kind(second))
    first = _split(first, k)
    second = _split(second, k)
    _move_body(second.regions[0].blocks[0], first.regions[0].blocks[0], list(first.regions[0].blocks[0].arguments))
    second.erase()
    first.attributes[FUSED_ATTR] = ir.StringAttr.get(kind)
    return first


def row_dims(loop: ir.Operation) -> int:
    """How many leading dims of a parallel loop are its rows: all of them for a loop whose body
    is another loop nest, all but the innermost (the one LLVM vectorises) otherwise."""
    body_loops = any(o.name in ("scf.parallel", "scf.for") for o in list(walk(loop))[1:])
    return _dims(loop) if body_loops else _dims(loop) - 1


def collapse_rows(module: ir.Module) -> None:
    """Every top-level parallel loop: its rows (`row_dims`) become one linear dim."""
    for op in [o for o in walk(module.operation) if o.name == "scf.parallel" and not o.results and not _in_parallel(o)]:
        k = row_dims(op)
        if k < 2:
            continue
        _collapse(_split(op, k))


def _collapse(loop: ir.Operation) -> None:
    bounds = loop_bounds(loop)
    with ir.InsertionPoint(loop), loop.location:
        counts = []
        for lb, ub, step in bounds:
            span = _binary("arith.subi", ub, lb)
            counts.append(_binary("arith.ceildivsi", span, step))
        total = counts[0]
        for c in counts[1:]:
            total = _binary("arith.muli", total, c)
        zero, one = index_constant(0), index_constant(1)
        linear, body = _new_loop([(zero, total, one)])
    old = loop.regions[0].blocks[0]
    with ir.InsertionPoint.at_block_begin(body), loop.location:
        rest, ivs = body.arguments[0], []
        for (lb, _, step), count in reversed(list(zip(bounds, counts))):
            i = _binary("arith.remsi", rest, count)
            rest = _binary("arith.divsi", rest, count)
            ivs.append(_binary("arith.addi", lb, _binary("arith.muli", i, step)))
    _move_body(old, body, list(reversed(ivs)))
    _replace(loop, linear)


def flatten_contiguous_loops(module: ir.Module, entry: ir.Operation, sources: list[list[int | tuple[int, int]]]) -> int:
    """Elementwise loops over contiguous dims walk them as one: a top-level parallel loop without
    nested loops whose trailing dims every buffer either walks in row-major order through those
    induction variables as its own last indices (a row-major buffer whose dims there are the
    loop's bounds: one run of memory), or does not index by at all (a broadcast operand), gets
    those dims merged into one, and each buffer it walks is read through a collapsed view. Its
    innermost loop, the one LLVM vectorises, then runs over the whole run: a kernel over [n, 24]
    or [n, c, 7, 7] no longer vectorises rows of 24 or 7. `sources` says which of the entry's
    argument dims are equal (`dims.argument_dim_sources`: the guard checked them). Returns the
    number of loops changed."""
    same = functools.partial(_same_dim, entry.regions[0].blocks[0], sources)
    changed = 0
    for loop in _top_loops(module):
        first = _contiguous_suffix(loop, same)
        if first is not None:
            _merge_trailing(loop, first)
            changed += 1
    return changed


def _contiguous_suffix(loop: ir.Operation, same: Callable[[ir.Value, int, ir.Value], bool]) -> int | None:
    """The first of the trailing dims `flatten_contiguous_loops` may merge (at least two), or None."""
    bounds, accesses = loop_bounds(loop), _accesses(loop)
    body_ops = list(walk(loop))[1:]
    if accesses is None or len(bounds) < 2 or any(o.name in ("scf.parallel", "scf.for", "scf.while") for o in body_ops) \
            or any(int_constant(lb) != 0 or int_constant(step) != 1 for lb, _, step in bounds):
        return None
    ivs = list(loop.regions[0].blocks[0].arguments)
    for first in range(len(bounds) - 1):
        merged = ivs[first:]
        # the merged induction variables are read only as the last indices of the accesses checked below
        uses_ok = all(operation(u.owner).name == "memref.load" and u.operand_number >= 1
                      or operation(u.owner).name == "memref.store" and u.operand_number >= 2 for iv in merged for u in iv.uses)
        if uses_ok and all(_walks_run(ref, indices, writes, merged, bounds[first:], loop, same) for ref, indices, writes in accesses):
            return first
    return None


def _walks_run(ref: ir.Value, indices: list[ir.Value], writes: bool, merged: list[ir.Value],
               bounds: list[tuple[ir.Value, ir.Value, ir.Value]], loop: ir.Operation,
               same: Callable[[ir.Value, int, ir.Value], bool]) -> bool:
    """Whether an access reads or writes one run of memory over the merged dims (or, a read, the
    same element whatever they are)."""
    if not any(i in merged for i in indices):
        return not writes
    n = len(merged)
    if indices[-n:] != merged or any(i in merged for i in indices[:-n]) or not defined_outside(ref, loop) \
            or not identity_layout(ir.MemRefType(ref.type)):
        return False
    rank = len(indices)
    return all(same(ref, rank - n + j, ub) for j, (_, ub, _) in enumerate(bounds) if j > 0)


def _same_dim(entry_block: ir.Block, sources: list[list[int | tuple[int, int]]], ref: ir.Value, i: int, bound: ir.Value) -> bool:
    """Whether dim i of `ref` is `bound`: by their SSA values, or for an entry argument by the dims
    the guard checked equal (the bound then reads the first argument dim of its size)."""
    if _same_size(_dim_value(ref, i), bound):
        return True
    if not isinstance(ref.owner, ir.Block) or ref.owner != entry_block or ir.BlockArgument(ref).arg_number >= len(sources):
        return False
    source, bound = sources[ir.BlockArgument(ref).arg_number][i], _resolve(bound)
    if isinstance(source, int) or not isinstance(bound, ir.Value) or isinstance(bound.owner, ir.Block):
        return source == bound
    read = operation(bound.owner)
    return (read.name == "memref.dim" and read.operands[0] == entry_block.arguments[source[0]]
            and int_constant(read.operands[1]) == source[1])


def _merge_trailing(loop: ir.Operation, first: int) -> None:
    bounds = loop_bounds(loop)
    merged = list(loop.regions[0].blocks[0].arguments)[first:]
    views: dict[ir.Value, ir.Value] = {}
    with ir.InsertionPoint(loop), loop.location:
        total = bounds[first][1]
        for _, ub, _ in bounds[first + 1:]:
            total = _binary("arith.muli", total, ub)
        accesses = [op for op in walk(loop) if op.name in ("memref.load", "memref.store") and list(op.operands)[-1] == merged[-1]]
        for op in accesses:
            ref = op.operands[1] if op.name == "memref.store" else op.operands[0]
            if ref not in views:
                t = ir.MemRefType(ref.type)
                keep = t.rank - len(merged)
                groups = [[d] for d in range(keep)] + [list(range(keep, t.rank))]
                tail = [t.shape[d] for d in range(keep, t.rank)]
                size = ir.ShapedType.get_dynamic_size() if any(t.is_dynamic_dim(d) for d in range(keep, t.rank)) else math.prod(tail)
                view_t = ir.MemRefType.get([t.shape[d] for d in range(keep)] + [size], t.element_type)
                reassociation = ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d) for d in g])
                                                  for g in groups])
                views[ref] = ir.Operation.create("memref.collapse_shape", results=[view_t], operands=[ref],
                                                 attributes={"reassociation": reassociation}).result
        flat, body = _new_loop(bounds[:first] + [(bounds[first][0], total, bounds[first][2])])
    new_ivs = list(body.arguments)
    for op in accesses:
        store = op.name == "memref.store"
        ref_at = 1 if store else 0
        operands = list(op.operands)
        keep = len(operands) - ref_at - 1 - len(merged)
        with ir.InsertionPoint(op), op.location:
            new = ir.Operation.create(op.name, results=[r.type for r in op.results],
                                      operands=operands[:ref_at] + [views[operands[ref_at]]] + operands[ref_at + 1:ref_at + 1 + keep]
                                      + [new_ivs[first]], attributes={name: op.attributes[name] for name in op.attributes})
        for old, res in zip(op.results, new.results):
            old.replace_all_uses_with(res)
        op.erase()
    _move_body(loop.regions[0].blocks[0], body, new_ivs[:first] + [new_ivs[first]] * len(merged))
    _replace(loop, flat)


_REDUCERS = ("arith.addf", "arith.mulf", "arith.maximumf", "arith.minimumf", "arith.maxnumf", "arith.minnumf")


def accumulate_in_registers(module: ir.Module) -> int:
    """A sequential loop that loads an accumulator from a buffer at loop-invariant indices and
    stores it back every iteration (linalg reductions lowered to loops) carries it as a loop
    value instead: one load before the loop, one store after. Float accumulations may then be
    reassociated, which lets LLVM vectorise the loop. Only accumulators in buffers of their own
    (no other access in the loop may alias them). Returns how many loops changed."""
    changed = 0
    for loop in [op for op in walk(module.operation) if op.name == "scf.for"]:
        while (pair := _accumulator(loop)) is not None:
            loop = _carry(loop, *pair)
            changed += 1
    return changed


def _accumulator(loop: ir.Operation) -> tuple[ir.Operation, ir.Operation] | None:
    """A (load, store) pair of the loop's body: same buffer and loop-invariant indices, the only
    accesses to that buffer's storage anywhere in the loop."""
    body = loop.regions[0].blocks[0]
    accesses = _accesses(loop)
    if accesses is None:
        return None
    top = [o.operation for o in body.operations]
    for load in top:
        if load.name != "memref.load":
            continue
        ref, indices = load.operands[0], list(load.operands)[1:]
        root = _root(ref)
        if isinstance(root.owner, ir.Block) or operation(root.owner).name not in ("memref.alloc", "memref.alloca"):
            continue
        if not all(defined_outside(i, loop) for i in indices) or sum(1 for r, _, _ in accesses if _root(r) == root) != 2:
            continue
        stores = [s for s in top if s.name == "memref.store" and s.operands[1] == ref and list(s.operands)[2:] == indices]
        if len(stores) == 1 and top.index(load) < top.index(stores[0]):
            return load, stores[0]
    return None


def _carry(loop: ir.Operation, load: ir.Operation, store: ir.Operation) -> ir.Operation:
    ref, indices = load.operands[0], list(load.operands)[1:]
    value_type = load.result.type
    with ir.InsertionPoint(loop), loop.location:
        init = ir.Operation.create("memref.load", results=[value_type], operands=[ref, *indices]).result
        carried = list(loop.results)
        new = ir.Operation.create("scf.for", results=[r.type for r in carried] + [value_type],
                                  operands=list(loop.operands) + [init], regions=1)
    old_body = loop.regions[0].blocks[0]
    body = new.regions[0].blocks.append(*[a.type for a in old_body.arguments], value_type)
    acc = body.arguments[len(old_body.arguments)]
    for old, arg in zip(old_body.arguments, body.arguments):
        old.replace_all_uses_with(arg)
    load.result.replace_all_uses_with(acc)
    stored = store.operands[0]
    old_yield = list(old_body.operations)[-1]
    yielded = list(old_yield.operands) + [stored]
    load.erase()
    store.erase()
    for op in list(old_body.operations)[:-1]:
        body.append(op.operation)
    with ir.InsertionPoint(body), loop.location:
        ir.Operation.create("scf.yield", operands=yielded)
    if not isinstance(stored.owner, ir.Block) and operation(stored.owner).name in _REDUCERS:
        operation(stored.owner).attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<reassoc,contract>")
    for old_result, new_result in zip(loop.results, new.results):
        old_result.replace_all_uses_with(new_result)
    loop.erase()
    with ir.InsertionPoint.after(new), new.location:
        ir.Operation.create("memref.store", operands=[new.results[len(new.results) - 1], ref, *indices])
    return new


SUM_BLOCK = 1024  # iterations of a loop's float sum added into one partial sum (of a vector sum: VECTOR_SUM_BLOCK)
VECTOR_SUM_BLOCK = 64


def blocked_float_sums(module: ir.Module) -> int:
    """A float sum a sequential loop carries (`accumulate_in_registers`) is taken in partial sums
    of SUM_BLOCK iterations (LLVM spreads a scalar sum over 64 lanes: 16 additions each), and the
    partial sums are added to the total with Kahan's compensation (a few operations per block): one
    accumulator over millions of values lost digits (0.1 summed 2^24 times came out 0.25 % low;
    XLA and numpy sum pairwise). A loop of at most one block's iterations known here stays as it
    is. Returns how many loops changed."""
    changed = 0
    for loop in [op for op in walk(module.operation) if op.name == "scf.for"]:
        sums = _float_sums(loop)
        block = VECTOR_SUM_BLOCK if any(isinstance(r.type, ir.VectorType) for r in loop.results) else SUM_BLOCK
        if sums and "unsignedCmp" not in loop.attributes and _constant_trip_count(loop) > block:
            _blocked(loop, block, sums)
            changed += 1
    return changed


def _float_sums(loop: ir.Operation) -> dict[int, ir.Operation]:
    """The loop's carried values that it only adds floats to: index -> their `arith.addf`."""
    body = loop.regions[0].blocks[0]
    yielded = list(body.operations)[-1].operands
    sums = {}
    for k, (arg, value) in enumerate(zip(list(body.arguments)[1:], yielded)):
        add = value.owner
        if (not isinstance(add, ir.Block) and add.name == "arith.addf" and add.parent == loop and arg in list(add.operands)
                and len(list(arg.uses)) == 1):
            sums[k] = add
    return sums


def _constant_trip_count(loop: ir.Operation) -> float:
    bounds = [int_constant(v) for v in list(loop.operands)[:3]]
    if None in bounds:
        return math.inf
    lower, upper, step = bounds
    return max(0, -(-(upper - lower) // step))


def _blocked(loop: ir.Operation, block: int, sums: dict[int, ir.Operation]) -> None:
    """`loop` as an outer loop over blocks of `block` iterations, whose body is the loop over one
    block: its float sums (`_float_sums`) start from -0.0 there, and the outer loop adds each
    block's to its total with Kahan's compensation (carried too); its other carried values pass
    through."""
    lower, upper, step, *inits = loop.operands
    index, types = ir.IndexType.get(), [v.type for v in inits]
    sum_types = [types[k] for k in sums]

    def zero(t: ir.Type) -> ir.Value:
        value = ir.Attribute.parse(f"dense<-0.0> : {t}" if isinstance(t, ir.VectorType) else f"-0.0 : {t}")
        return ir.Operation.create("arith.constant", results=[t], attributes={"value": value}).result

    with ir.InsertionPoint(loop), loop.location:
        stride = create_value("arith.muli", [step, index_constant(block)], index)
        outer = ir.Operation.create("scf.for", results=types + sum_types, operands=[lower, upper, stride, *inits, *map(zero, sum_types)],
                                    regions=1)
    head = outer.regions[0].blocks.append(index, *types, *sum_types)
    at, carried, compensations = head.arguments[0], list(head.arguments)[1:1 + len(types)], list(head.arguments)[1 + len(types):]
    with ir.InsertionPoint(head), loop.location:
        end = create_value("arith.minsi", [create_value("arith.addi", [at, stride], index), upper], index)
        starts = [zero(t) if k in sums else carried[k] for k, t in enumerate(types)]
        inner = ir.Operation.create("scf.for", results=types, operands=[at, end, step, *starts], regions=1)
        totals, kept = list(inner.results), []
        for k, compensation in zip(sums, compensations):  # Kahan: exact arithmetic, no reassociation
            t = types[k]
            part = create_value("arith.subf", [inner.results[k], compensation], t)
            totals[k] = create_value("arith.addf", [carried[k], part], t)
            kept.append(create_value("arith.subf", [create_value("arith.subf", [totals[k], carried[k]], t), part], t))
        ir.Operation.create("scf.yield", operands=totals + kept)
    old = loop.regions[0].blocks[0]
    body = inner.regions[0].blocks.append(*[a.type for a in old.arguments])
    for old_arg, arg in zip(old.arguments, body.arguments):
        old_arg.replace_all_uses_with(arg)
    for op in list(old.operations):
        body.append(op.operation)
    for old_result, result in zip(loop.results, outer.results):
        old_result.replace_all_uses_with(result)
    loop.erase()


def hoist_invariant_loads(module: ir.Module) -> int:
    """Loads at loop-invariant indices from a buffer the loop never writes (no write in it to the
    same storage) move before the loop, with the index arithmetic they need and the conditional
    reads around them (a padded input read under a bounds check, in a convolution's loop over
    output features): LLVM cannot prove that on its own for memref pointers, and a load it must
    repeat every iteration keeps the loop from vectorising (a conditional one becomes a gather).
    Inner loops first, so what leaves one loop can leave the next. Returns the count."""
    hoisted = 0
    loops = [op for op in walk(module.operation) if op.name in ("scf.for", "scf.parallel") and _in_parallel(op)]
    for loop in reversed(loops):
        accesses = _accesses(loop)
        if accesses is None:
            continue
        written = {_root(r) for r, _, w in accesses if w}
        moved: list[ir.Operation] = []
        for op in [o.operation for o in loop.regions[0].blocks[0].operations]:
            if _invariant_read(op, loop, written, moved):
                op.move_before(loop)
                moved.append(op)
                hoisted += 1
    return hoisted


def _invariant_read(op: ir.Operation, loop: ir.Operation, written: set, moved: list[ir.Operation]) -> bool:
    """Whether `op` computes the same value in every iteration of `loop` without side effects:
    pure index / arithmetic ops, loads from storage the loop never writes at indices from before
    the loop, and `scf.if`s (bounds checks) made of those, over values from outside the loop or
    from ops already moved out."""
    def outside(v: ir.Value) -> bool:
        return defined_outside(v, loop) or (not isinstance(v.owner, ir.Block) and operation(v.owner) in moved)

    def pure(o: ir.Operation) -> bool:  # no division: one hoisted out of a loop that runs no iteration could trap
        return o.name.startswith(("arith.", "affine.apply")) and "div" not in o.name and "rem" not in o.name and not o.regions

    if op.name == "memref.load":  # unguarded: only at indices computed before the loop (in bounds if the loop runs)
        return _root(op.operands[0]) not in written and all(defined_outside(v, loop) for v in op.operands)
    if pure(op):
        return all(outside(v) for v in op.operands)
    if op.name != "scf.if" or not op.results or not all(outside(v) for v in op.operands):
        return False
    inner = list(walk(op))[1:]
    for o in inner:
        if o.name == "memref.load" and _root(o.operands[0]) in written:
            return False
        if o.name not in ("memref.load", "scf.yield") and not pure(o):
            return False
        if not all(outside(v) or not defined_outside(v, op) for v in o.operands):
            return False
    return True


VERSION_ATTR = "disc.version"  # on a loop generated in several versions: which one it is
# on a loop generated for large inputs only: it runs on the thread pool whatever the host's work
# estimate says (which counts the loop's iterations and those of body loops with bounds known
# outside it: not the columns of a column block)
POOL_ATTR = "disc.pool"

COLUMN_VECTORS = 4  # vectors of columns per block of the column schedule (AVX-512: 64 f32, 256 bytes per row)
# The "wide" column schedule: about WIDE_BLOCKS blocks of 4 to WIDE_VECTORS vectors, for loops that
# read more than WIDE_BYTES (see schedule_column_reductions)
WIDE_BLOCKS, WIDE_VECTORS, WIDE_BYTES = 4, 64, 10 << 20


def _top_loops(module: ir.Module) -> list[ir.Operation]:
    """The outermost parallel loops that may be flattened or generated in versions (an epilogue
    loop runs behind its GEMM call and stays next to it)."""
    return [op for op in walk(module.operation) if op.name == "scf.parallel" and not op.results
            and not _in_parallel(op) and EPILOGUE_ATTR not in op.attributes]


def _read_as(op: ir.Operation, values: list[ir.Value], replacements: dict[int, ir.Value]) -> None:
    """In `op` and the ops nested in it, uses of values[i] read replacements[i]."""
    for inner in walk(op):
        for k, v in enumerate(inner.operands):
            if v in values and values.index(v) in replacements:
                inner.operands[k] = replacements[values.index(v)]


def _versions(loop: ir.Operation, use_first: ir.Value, names: tuple[str, str]) -> ir.Operation:
    """Puts `loop` and a copy of it under `scf.if use_first`: the loop runs when the condition
    holds, the copy otherwise; returns the copy. Each is marked with its version name."""
    with ir.InsertionPoint(loop), loop.location:
        branch = ir.Operation.create("scf.if", operands=[use_first], regions=2)
    first, second = (branch.regions[i].blocks.append() for i in range(2))
    for block in (first, second):
        with ir.InsertionPoint(block), loop.location:
            ir.Operation.create("scf.yield")
    copy = loop.clone(ir.InsertionPoint(list(second.operations)[0]))
    loop.move_before(list(first.operations)[0])
    prefix = f"{ir.StringAttr(loop.attributes[VERSION_ATTR]).value}, " if VERSION_ATTR in loop.attributes else ""
    loop.attributes[VERSION_ATTR] = ir.StringAttr.get(prefix + names[0])
    copy.attributes[VERSION_ATTR] = ir.StringAttr.get(prefix + names[1])
    return copy


def _column_reductions(loop: ir.Operation) -> list[ir.Operation]:
    """The reduction loops of a parallel loop whose rows reduce along a non-innermost dim (one,
    or several fused: a column's sum and maximum, its mean and then its variance): its body is
    `scf.for`s (no carried values) with ops around them that neither feed them nor each other
    across them, and inside each, the loop's innermost induction variable is the last index of a
    load while the reduction's is never a last index. Empty for anything else."""
    body = loop.regions[0].blocks[0]
    ops = [o.operation for o in body.operations][:-1]
    fors = [o for o in ops if o.name == "scf.for"]
    if not fors or any(f.results for f in fors) or any(o.regions for o in ops if o.name != "scf.for"):
        return []
    n = body.arguments[len(body.arguments) - 1]
    if int_constant(loop_bounds(loop)[-1][2]) != 1:
        return []
    groups, start = [], 0
    for red in fors:
        i = ops.index(red)
        groups += [ops[start:i], [red]]
        start = i + 1
    for group in groups + [ops[start:]]:
        inside = [x for op in group for x in walk(op)]
        for op in inside:
            for v in op.results:
                if any(not any(operation(u.owner) == x for x in inside) for u in v.uses):
                    return []  # a value crosses groups
    for red in fors:
        last = [list(op.operands)[-1] for op in walk(red) if op.name == "memref.load" and len(list(op.operands)) > 1]
        m = red.regions[0].blocks[0].arguments[0]
        if not any(v == n for v in last) or any(v == m for v in last):
            return []
    return fors


def _column_schedule(loop: ir.Operation, reds: list[ir.Operation], vector: int, kind: str) -> None:
    """parallel (..., n) { pre; for m { body }; post } ->
    parallel (..., block) { for n in block { pre }; for m { for n in block { body } }; for n in block { post } }
    (and so on for each of several reduction loops `reds`)
    (with `for m` a perfect nest of reduction loops, the column loop goes inside the innermost);
    blocks (`kind`) of COLUMN_VECTORS vectors ("narrow"), of the columns over WIDE_BLOCKS, rounded
    up to whole vectors, from COLUMN_VECTORS to WIDE_VECTORS vectors ("wide"), or of all columns
    up to SPLIT_BLOCK_VECTORS vectors ("split"; the last two computed at run time)"""
    bounds = loop_bounds(loop)
    lb, ub, _ = bounds[-1]
    old = loop.regions[0].blocks[0]
    ops = [o.operation for o in old.operations][:-1]
    with ir.InsertionPoint(loop), loop.location:
        extent = _binary("arith.subi", ub, lb)
        block = index_constant(COLUMN_VECTORS * vector)
        if kind == "wide":
            vectors = _binary("arith.ceildivsi", _binary("arith.ceildivsi", extent, index_constant(WIDE_BLOCKS)), index_constant(vector))
            vectors = _binary("arith.minsi", _binary("arith.maxsi", vectors, index_constant(COLUMN_VECTORS)), index_constant(WIDE_VECTORS))
            block = _binary("arith.muli", vectors, index_constant(vector))
        elif kind == "split":
            vectors = _binary("arith.minsi", _binary("arith.ceildivsi", extent, index_constant(vector)), index_constant(SPLIT_BLOCK_VECTORS))
            block = _binary("arith.muli", vectors, index_constant(vector))
        count = _binary("arith.ceildivsi", extent, block)
        new, body = _new_loop(bounds[:-1] + [(index_constant(0), count, index_constant(1))])
    for a, b in zip(list(old.arguments)[:-1], list(body.arguments)[:-1]):
        a.replace_all_uses_with(b)
    n_old = old.arguments[len(old.arguments) - 1]
    terminator = list(body.operations)[-1]
    with ir.InsertionPoint(terminator), loop.location:
        start = _binary("arith.addi", lb, _binary("arith.muli", body.arguments[len(body.arguments) - 1], block))
        end = _binary("arith.minsi", _binary("arith.addi", start, block), ub)

    def columns(group: list[ir.Operation], where: ir.Operation) -> None:
        """A loop over the block's columns at `where` running `group`."""
        with ir.InsertionPoint(where), loop.location:
            _, inner_body = _scf_for(start, end, index_constant(1), [])
        with ir.InsertionPoint(inner_body), loop.location:
            yield_op = ir.Operation.create("scf.yield")
        for op in group:
            op.move_before(yield_op)
            _read_as(op, [n_old], {0: inner_body.arguments[0]})

    after = 0  # the ops before each reduction loop, after the one before it
    for red in reds:
        i = ops.index(red)
        if ops[after:i]:
            columns(ops[after:i], terminator)
        after = i + 1
        red.move_before(terminator)
        # through perfectly nested reduction loops (a convolution's window rows, window columns and
        # input features): the block's columns become the innermost loop, under all of them
        while True:
            red_ops = [o.operation for o in red.regions[0].blocks[0].operations]
            nested = red_ops[0] if len(red_ops) == 2 and red_ops[0].name == "scf.for" and not red_ops[0].results else None
            if nested is None or any(v == n_old for v in nested.operands):
                break
            red = nested
        columns(red_ops[:-1], red_ops[-1])
    if ops[after:]:
        columns(ops[after:], terminator)
    _replace(loop, new)


def schedule_column_reductions(module: ir.Module, vector: int) -> int:
    """Speculation on the reduction schedule. A loop whose rows reduce along a dim that is not
    the innermost (a column reduction: a sum over the sequence of [b, s, h], over the batch of
    [n, h]) walks its input a whole row apart per step when each column runs its own reduction
    loop (the "row" schedule). The "column" schedule splits the columns into blocks and runs, per
    block, the reduction loop outside a contiguous, vectorisable loop over the block's columns,
    accumulating in the output row (which stays in L1). Host code runs the column version when
    the innermost extent is at least one vector wide (`vector`: f32 elements per vector of the
    target), the row version otherwise; each is its own kernel, so the statistics say which ran.
    The column version comes in several: blocks of COLUMN_VECTORS vectors ("narrow": the block's
    sums stay in registers), and, where the loop reads more than WIDE_BYTES (more than the caches
    hold), blocks of about a WIDE_BLOCKS-th of the columns ("wide": each row is read in longer
    runs, which memory streams faster; measured on this project's 2-core Zen 3, a column sum of
    (8192, 1024): 7.0 -> 12.0 GB/s, of (2, 2048, 768) over the middle dim 11.4 -> 24.2, while on
    inputs the caches hold the narrow blocks were as fast or faster: benchmarks/README.md). A wide
    loop with one reduction loop of accumulations (`_accumulations`) over at least 2 * SPLIT_MIN_ROWS rows runs
    "split" instead (`_split_schedule`): its reduced rows in chunks, each read whole by the pool's
    threads into a buffer of partial results, which a narrow loop then combines (a column sum of
    (8192, 1024): 13 -> 21 GB/s, of (200000, 16) 13 -> 22, as jax.jit). Several reductions fused
    over the same columns are scheduled together, and those independent of each other (a sum and
    a maximum; not a mean and the variance around it) become one loop first. Runs
    before rows are collapsed. Returns the count."""
    changed = 0
    for loop in _top_loops(module):
        reds = _column_reductions(loop)
        if not reds:
            continue
        reds = _fuse_sibling_reductions(loop, reds)
        lb, ub, _ = loop_bounds(loop)[-1]
        with ir.InsertionPoint(loop), loop.location:
            columns = index_compare("sge", _binary("arith.subi", ub, lb), index_constant(vector))
        _versions(loop, columns, ("column", "row"))
        red_lb, red_ub, _ = loop_bounds(reds[0])[0]
        narrow = loop
        if defined_outside(red_lb, loop) and defined_outside(red_ub, loop):
            with ir.InsertionPoint(loop), loop.location:  # the elements read, counted as f32
                elements = _binary("arith.subi", red_ub, red_lb)
                for dim_lb, dim_ub, _ in loop_bounds(loop):
                    elements = _binary("arith.muli", elements, _binary("arith.subi", dim_ub, dim_lb))
                large = index_compare("sgt", elements, index_constant(WIDE_BYTES // 4))
            narrow = _versions(loop, large, ("wide", "narrow"))
            for part in _fission(loop, reds) if len(reds) > 1 else [loop]:
                _large_schedule(part, _column_reductions(part), vector)
        _column_schedule(narrow, _column_reductions(narrow), vector, "narrow")
        changed += 1
    return changed


def _large_schedule(loop: ir.Operation, reds: list[ir.Operation], vector: int) -> None:
    """The schedule of a column loop that reads more than the caches hold: "split" where its one
    reduction loop accumulates (`_accumulations`) over at least 2 * SPLIT_MIN_ROWS rows, "wide"
    otherwise; both on the pool."""
    if len(reds) > 1 or _accumulations(loop, reds[0]) is None:
        loop.attributes[POOL_ATTR] = ir.UnitAttr.get()
        _column_schedule(loop, reds, vector, "wide")
        return
    red_lb, red_ub, _ = loop_bounds(reds[0])[0]
    with ir.InsertionPoint(loop), loop.location:
        tall = index_compare("sge", _binary("arith.subi", red_ub, red_lb), index_constant(2 * SPLIT_MIN_ROWS))
    wide = _versions(loop, tall, ("split", "wide"))
    wide.attributes[POOL_ATTR] = ir.UnitAttr.get()
    _column_schedule(wide, _column_reductions(wide), vector, "wide")
    first, part = _split_schedule(loop, reds[0])
    first.attributes[POOL_ATTR] = ir.UnitAttr.get()
    _column_schedule(first, [part], vector, "split")
    _column_schedule(loop, _column_reductions(loop), vector, "narrow")


def _fission(loop: ir.Operation, reds: list[ir.Operation]) -> list[ir.Operation]:
    """`loop` (several reduction loops, each with the ops before it; the last also with those
    after it) as one loop per reduction loop, one after the other, when every buffer it writes is
    accessed at its induction variables only (each column then sees its own elements in the same
    order); [loop] otherwise."""
    ivs = list(loop.regions[0].blocks[0].arguments)
    accesses = _accesses(loop)
    written = {_root(r) for r, _, w in accesses or [] if w}
    if accesses is None or any(_root(r) in written and indices != ivs for r, indices, _ in accesses):
        return [loop]
    ops = [o.operation for o in loop.regions[0].blocks[0].operations][:-1]
    cuts = [ops.index(red) + 1 for red in reds[:-1]] + [len(ops)]
    parts, start = [], 0
    for cut in cuts:
        with ir.InsertionPoint(loop), loop.location:
            part, body = _new_loop(loop_bounds(loop))
        terminator = list(body.operations)[-1]
        for op in ops[start:cut]:
            op.move_before(terminator)
            _read_as(op, ivs, dict(enumerate(body.arguments)))
        for name in loop.attributes:
            if name != "operandSegmentSizes":
                part.attributes[name] = loop.attributes[name]
        parts.append(part)
        start = cut
    loop.erase()
    return parts


# the "split" column schedule (schedule_column_reductions): the reduced rows in up to SPLIT_CHUNKS
# chunks of at least SPLIT_MIN_ROWS rows, each chunk's rows read whole (blocks of up to
# SPLIT_BLOCK_VECTORS vectors of columns: their partial results stay in L1)
SPLIT_CHUNKS, SPLIT_MIN_ROWS, SPLIT_BLOCK_VECTORS = 16, 64, 256
_IDENTITIES = {"arith.addf": -0.0, "arith.mulf": 1.0, "arith.maximumf": float("-inf"), "arith.minimumf": float("inf")}


def _fuse_sibling_reductions(loop: ir.Operation, reds: list[ir.Operation]) -> list[ir.Operation]:
    """Consecutive reduction loops of `loop` over the same range that touch no buffer the other
    writes (a column's sum and its maximum) become one loop, which reads the input once, when the
    ops between them touch nothing the first touches (they move above it); returns the loops left."""
    kept = [reds[0]]
    for red in reds[1:]:
        first = kept[-1]
        ops = [o.operation for o in loop.regions[0].blocks[0].operations]
        acc1, acc2 = _accesses(first), _accesses(red)
        between = ops[ops.index(first) + 1:ops.index(red)]
        touched1 = {_root(r) for r, _, _ in acc1 or []}
        written = {_root(r) for r, _, w in (acc1 or []) + (acc2 or []) if w}
        movable = all((o.name in ("memref.load", "memref.store") and _root(o.operands[1 if o.name == "memref.store" else 0]) not in touched1)
                      or (o.name.startswith(_HOISTABLE) and not o.regions) for o in between)
        nested = any(o.name in ("scf.for", "scf.parallel", "scf.while") for o in list(walk(first))[1:] + list(walk(red))[1:])
        if (acc1 is None or acc2 is None or nested or not movable
                or not all(_same_bound(a, b) for a, b in zip(loop_bounds(first)[0], loop_bounds(red)[0]))
                or written & ({_root(r) for r, _, _ in acc1} & {_root(r) for r, _, _ in acc2})):
            kept.append(red)
            continue
        for op in between:
            op.move_before(first)
        dst = first.regions[0].blocks[0]
        _move_body(red.regions[0].blocks[0], dst, [dst.arguments[0]])
        red.erase()
    return kept


def _accumulations(loop: ir.Operation, red: ir.Operation) -> list[tuple[ir.Operation, ir.Operation, ir.Operation]] | None:
    """(load, combine, store) of each float accumulator the reduction loop `red` of `loop` (whose
    dims start at 0 with step 1) updates: a buffer element at `loop`'s induction variables, each
    its own buffer, combined with add, mul, maximum or minimum; None unless that is all it writes
    and it otherwise only reads buffers nothing in `loop` writes."""
    if any(int_constant(lb) != 0 or int_constant(step) != 1 for lb, _, step in loop_bounds(loop)):
        return None
    body = [o.operation for o in red.regions[0].blocks[0].operations][:-1]
    stores = [o for o in body if o.name == "memref.store"]
    if not stores or any(o.regions for o in body) or _accesses(red) is None:
        return None
    ivs = list(loop.regions[0].blocks[0].arguments)
    found = []
    for store in stores:
        ref = store.operands[1]
        if list(store.operands)[2:] != ivs or isinstance(store.operands[0].owner, ir.Block):
            return None
        combine = operation(store.operands[0].owner)
        loads = [o for o in body if o.name == "memref.load" and _root(o.operands[0]) == _root(ref)]
        if (combine.name not in _IDENTITIES or len(loads) != 1 or loads[0].operands[0] != ref or list(loads[0].operands)[1:] != ivs
                or loads[0].result not in list(combine.operands) or len(list(loads[0].result.uses)) != 1
                or sum(_root(s.operands[1]) == _root(ref) for s in stores) != 1):
            return None
        found.append((loads[0], combine, store))
    written = {_root(o.operands[1]) for o in walk(loop) if o.name == "memref.store"}
    accumulators = [load for load, _, _ in found]
    if any(o.name == "memref.load" and o not in accumulators and _root(o.operands[0]) in written for o in body):
        return None
    return found


def _split_schedule(loop: ir.Operation, red: ir.Operation) -> tuple[ir.Operation, ir.Operation]:
    """parallel (i...) { pre; for m { A[i...] = combine(A[i...], v) }; post } ->
    parallel (c, i...) { P[c, i...] = identity; for m in chunk c { P[c, i...] = combine(P[c, i...], v) } };
    parallel (i...) { pre; for c { A[i...] = combine(A[i...], P[c, i...]) }; post }
    (P a new buffer; one per accumulator, `_accumulations`); returns the first loop and its
    reduction loop."""
    accumulations = _accumulations(loop, red)
    bounds = loop_bounds(loop)
    lb, ub, _ = loop_bounds(red)[0]
    ivs = list(loop.regions[0].blocks[0].arguments)
    with ir.InsertionPoint(loop), loop.location:
        rows = _binary("arith.subi", ub, lb)
        chunks = _binary("arith.maxsi", _binary("arith.minsi", _binary("arith.ceildivsi", rows, index_constant(SPLIT_MIN_ROWS)),
                                                index_constant(SPLIT_CHUNKS)), index_constant(1))
        per_chunk = _binary("arith.ceildivsi", rows, chunks)
        sizes = [chunks] + [b[1] for b in bounds]
        partials = {}  # accumulator buffer -> its chunks' partial results
        for _, _, store in accumulations:
            shape = ir.MemRefType.get([ir.ShapedType.get_dynamic_size()] * len(sizes), ir.MemRefType(store.operands[1].type).element_type)
            partials[store.operands[1]] = ir.Operation.create("memref.alloc", results=[shape], operands=sizes, attributes={
                "alignment": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 64),
                "operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(sizes), 0])}).result
        zero, one = index_constant(0), index_constant(1)
        first, body = _new_loop([(zero, chunks, one)] + bounds)
    first.attributes[VERSION_ATTR] = ir.StringAttr.get(f"{ir.StringAttr(loop.attributes[VERSION_ATTR]).value}, partial")
    terminator = list(body.operations)[-1]
    chunk, at = body.arguments[0], list(body.arguments)
    with ir.InsertionPoint(terminator), loop.location:
        for _, combine, store in accumulations:
            elem = ir.MemRefType(store.operands[1].type).element_type
            identity = ir.Operation.create("arith.constant", results=[elem],
                                           attributes={"value": ir.FloatAttr.get(elem, _IDENTITIES[combine.name])}).result
            ir.Operation.create("memref.store", operands=[identity, partials[store.operands[1]], *at])
        start = _binary("arith.addi", lb, _binary("arith.muli", chunk, per_chunk))
        end = _binary("arith.minsi", _binary("arith.addi", start, per_chunk), ub)
        part = red.clone()
    part.operands[0], part.operands[1] = start, end
    _read_as(part, ivs, dict(enumerate(at[1:])))
    for op in walk(part):  # each accumulator is its P[c, i...]
        if op.name == "memref.load" and op.operands[0] in partials:
            with ir.InsertionPoint(op), op.location:
                value = ir.Operation.create("memref.load", results=[op.result.type], operands=[partials[op.operands[0]], *at]).result
            op.result.replace_all_uses_with(value)
            op.erase()
        elif op.name == "memref.store" and op.operands[1] in partials:
            with ir.InsertionPoint(op), op.location:
                ir.Operation.create("memref.store", operands=[op.operands[0], partials[op.operands[1]], *at])
            op.erase()
    with ir.InsertionPoint(red), red.location:  # the chunks' results combined in each A
        merge, merge_body = _scf_for(zero, chunks, one, [])
    with ir.InsertionPoint(merge_body), red.location:
        for load, combine, store in accumulations:
            ref = store.operands[1]
            acc = ir.Operation.create("memref.load", results=[load.result.type], operands=[ref, *ivs]).result
            value = ir.Operation.create("memref.load", results=[load.result.type], operands=[partials[ref], merge_body.arguments[0], *ivs]).result
            merged = combine.clone()
            for k, v in enumerate(combine.operands):
                merged.operands[k] = acc if v == load.result else value
            ir.Operation.create("memref.store", operands=[merged.result, ref, *ivs])
        ir.Operation.create("scf.yield")
    # no Python object of an op inside `red` may outlive it: the bindings would take a later op at
    # the same address for it
    del accumulations, load, combine, store
    red.erase()
    return first, part


def _expansion_checks(loop: ir.Operation) -> list[tuple[ir.Value, ir.Value | None]]:
    """The run-time broadcast checks a loop's indexing depends on: conditions `d == 1` computed
    outside the loop that select an index (0 when the dim expands), each with the extent of the
    loop index it selects against when that is known outside the loop (a size-1 operand dim of
    a size-1 loop dim does not expand: both indices are 0)."""
    found: dict[ir.Value, ir.Value | None] = {}
    ops = list(walk(loop))[1:]
    for op in ops:
        if op.name != "arith.select" or not isinstance(op.result.type, ir.IndexType):
            continue
        cond = op.operands[0]
        if isinstance(cond.owner, ir.Block) or not defined_outside(cond, loop):
            continue
        check = operation(cond.owner)
        if check.name == "arith.cmpi" and ir.IntegerAttr(check.attributes["predicate"]).value == 0 \
                and int_constant(check.operands[1]) == 1:
            extent = _index_extent(op.operands[2], loop)
            if cond not in found:
                found[cond] = extent
            elif extent is None or found[cond] is None or found[cond] != extent:
                found[cond] = None
    for op in ops:  # a check read for anything but selecting an index must be false in the other version
        for k, v in enumerate(op.operands):
            if v in found and not (op.name == "arith.select" and k == 0 and isinstance(op.result.type, ir.IndexType)):
                found[v] = None
    return list(found.items())


def _index_extent(v: ir.Value, top: ir.Operation) -> ir.Value | None:
    """The upper bound of the loop whose induction variable `v` is, when the loop counts from 0
    by 1 and the bound is computed outside `top`."""
    if not isinstance(v.owner, ir.Block) or v.owner.owner is None:
        return None
    loop, position = operation(v.owner.owner), ir.BlockArgument(v).arg_number
    if loop.name not in ("scf.for", "scf.parallel") or position >= len(loop_bounds(loop)):
        return None
    lb, ub, step = loop_bounds(loop)[position]
    return ub if int_constant(lb) == 0 and int_constant(step) == 1 and defined_outside(ub, top) else None


def version_broadcasts(module: ir.Module) -> int:
    """Speculation: a loop whose indexing checks at run time whether broadcast dims expand (the
    broadcasts the shape analysis could not prove) is generated twice, and host code picks the
    version from the real sizes: when no dim expands, a broadcast-free version with plain
    indexing (no per-element select, vectorisable); otherwise the general one. Each version is
    its own kernel, so the statistics say which ran. Returns the number of loops versioned."""
    versioned = 0
    for loop in _top_loops(module):
        checks = _expansion_checks(loop)
        if not checks:
            continue
        i1 = ir.IntegerType.get_signless(1)
        with ir.InsertionPoint(loop), loop.location:
            false = ir.Operation.create("arith.constant", results=[i1], attributes={"value": ir.BoolAttr.get(False)}).result
            expands = None
            for cond, extent in checks:
                if extent is not None:
                    cond = _binary("arith.andi", cond, index_compare("ne", extent, index_constant(1)))
                expands = cond if expands is None else _binary("arith.ori", expands, cond)
        copy = _versions(loop, expands, ("general", "broadcast-free"))
        conds = [c for c, _ in checks]
        _read_as(copy, conds, dict.fromkeys(range(len(conds)), false))
        versioned += 1
    return versioned


# innermost kernel loops with at least this many ops in their bodies (an inline exp, GELU's erfc),
# or a call to a math function, are vectorised INTERLEAVE vectors per iteration
LONG_BODY = 24
INTERLEAVE = 4
# math ops that are one instruction or a few (every other math op left at this point is a call:
# tanh, log, sin, ... through libmvec)
_SHORT_MATH = ("math.absf", "math.absi", "math.copysign", "math.fma", "math.sqrt", "math.rsqrt", "math.floor", "math.ceil",
               "math.round", "math.roundeven", "math.trunc", "math.isnan", "math.isinf", "math.isfinite", "math.isnormal",
               "math.ctlz", "math.cttz", "math.ctpop")


def _work(loop: ir.Operation) -> int:
    """The ops in a loop's body, a math function (exp, log, tanh: a polynomial) counted LONG_BODY."""
    return sum(LONG_BODY if o.name.startswith("math.") and o.name not in _SHORT_MATH else 1 for o in list(walk(loop))[1:])


def interleave_long_loops(module: ir.Module, kernels: list[str]) -> int:
    """LLVM's vectoriser interleaves small loops only: a long body (GELU's erfc: three
    polynomials, an exp and two divisions, a dependency chain of over 100 cycles per vector) then
    runs one vector per iteration, and the out-of-order core, which holds about two iterations,
    waits on latency. The innermost loops of the `kernels` functions whose bodies have LONG_BODY
    ops or more, or a math call (tanh: the call's own chain), get interleave count INTERLEAVE
    (`llvm.loop` metadata on their back edge: independent vectors in each iteration); their
    remainders are vectorised at the full f32 vector width (`codegen.compile_part`), so short rows
    lose nothing (float64 loops are left alone: the forced width is f32's, so their remainders
    would run scalar). Over 1024 columns on 2 Zen 3 cores: GELU 6.7 -> 7.9 GB/s, softmax 13.1 -> 15.0,
    tanh GELU 8.5 -> 9.4. Runs just before the lowering to LLVM (the annotation must be on an
    scf.for: scf.parallel loops become nested scf.for here first); returns the number of loops
    annotated."""
    run_pipeline(module, "builtin.module(func.func(scf-parallel-for-to-nested-fors))", "parallel loops to nested loops")
    annotation = ir.Attribute.parse(f"#llvm.loop_annotation<interleave = #llvm.loop_interleave<count = {INTERLEAVE} : i32>>")
    count = 0
    for name in dict.fromkeys(kernels):
        for loop in [op for op in walk(find_function(module, name)) if op.name == "scf.for"]:
            body = list(walk(loop))[1:]
            f64 = any(isinstance(r.type, ir.F64Type) for o in body for r in o.results)
            if _work(loop) >= LONG_BODY and not f64 and not any(o.name in ("scf.for", "scf.while") for o in body):
                loop.attributes["loop_annotation"] = annotation
                count += 1
    return count



# prefetch_next_rows: the heavy loop runs in strips of PREFETCH_STRIP elements, each fetching the
# same columns of the next row, a cache line (LINE_BYTES) per prefetch, into L2 (locality 2), in
# rows of PREFETCH_MIN_ROW elements or more
PREFETCH_STRIP, LINE_BYTES, PREFETCH_LOCALITY, PREFETCH_MIN_ROW = 256, 64, 2, 1024


def _index_slice(values: list[ir.Value], leaves: list[ir.Value], outside: ir.Operation) -> list[ir.Operation] | None:
    """The ops, in order, that compute `values` from `leaves` and values defined outside
    `outside`, all single-result arith ops; None when they depend on anything else."""
    ops: list[ir.Operation] = []

    def visit(v: ir.Value) -> bool:
        if v in leaves or defined_outside(v, outside):
            return True
        if isinstance(v.owner, ir.Block):
            return False
        op = operation(v.owner)
        if not op.name.startswith("arith.") or len(op.results) != 1 or op.regions:
            return False
        if op not in ops:
            if not all(visit(o) for o in op.operands):
                return False
            ops.append(op)
        return True

    return ops if all(visit(v) for v in values) else None


def prefetch_next_rows(module: ir.Module) -> int:
    """A fused row kernel (softmax, log-softmax: "stitch" fusion) reads its row from memory in
    its first pass (the max), which the hardware prefetcher streams; its later passes run from
    the cache, and the heaviest (exp) is compute bound while memory idles. That pass now runs in
    strips, and each strip first prefetches the same columns of the next row of the inputs the
    first pass reads, so the next row's first pass reads from L2 and memory works while the core
    computes. Only kernels whose heaviest later pass has LONG_BODY ops or more (a math function
    counts as that many): light ones (layer norm) already run at the copy rate. Measured on this
    project's 2-core Zen 3 (benchmarks/README.md): softmax over (4096, 4096) 12.5 -> 14.6 GB/s,
    log-softmax 10.8 -> 13.8, unchanged within noise on rows the caches hold. Returns the count."""
    changed = 0
    for loop in [op for op in walk(module.operation) if op.name == "scf.parallel" and _dims(op) == 1
                 and FUSED_ATTR in op.attributes and ir.StringAttr(op.attributes[FUSED_ATTR]).value == "stitch"]:
        body = loop.regions[0].blocks[0]
        inner = [op.operation for op in body.operations if op.name in ("scf.for", "scf.parallel")]
        if len(inner) < 2 or not all(len(loop_bounds(i)) == 1 and not any(o.name in ("scf.for", "scf.parallel", "scf.while")
                                                                          for o in list(walk(i))[1:]) for i in inner):
            continue
        first, heavy = inner[0], max(inner[1:], key=_work)
        lb, ub, step = loop_bounds(heavy)[0]
        if (_work(heavy) < LONG_BODY or int_constant(step) != 1 or not (defined_outside(lb, loop) and defined_outside(ub, loop))
                or not all(_same_bound(a, b) for a, b in zip(loop_bounds(first)[0], (lb, ub, step)))):
            continue
        row, column = body.arguments[0], first.regions[0].blocks[0].arguments[0]
        written = {_root(o.operands[1]) for o in walk(loop) if o.name == "memref.store"}
        reads = []  # (memref, its indices, the ops computing them): loads the first pass makes every iteration
        for op in [o.operation for o in first.regions[0].blocks[0].operations]:
            if op.name != "memref.load" or not defined_outside(op.operands[0], loop) or _root(op.operands[0]) in written:
                continue
            ref, indices = op.operands[0], list(op.operands)[1:]
            computed = _index_slice(indices, [row, column], loop)
            if (indices and indices[-1] == column and computed is not None
                    and isinstance(ir.MemRefType(ref.type).element_type, ir.FloatType)):
                reads.append((ref, indices, computed))
        if not reads:
            continue
        with ir.InsertionPoint(loop), loop.location:
            long = index_compare("sge", _binary("arith.subi", ub, lb), index_constant(PREFETCH_MIN_ROW))
        with ir.InsertionPoint(heavy), heavy.location:
            _, rows, _ = loop_bounds(loop)[0]
            one = index_constant(1)
            following = _binary("arith.minsi", _binary("arith.addi", row, one), _binary("arith.subi", rows, one))
            inits = list(heavy.operands)[3:] if heavy.name == "scf.for" else []
            strip, strip_body = _scf_for(lb, ub, index_constant(PREFETCH_STRIP), inits)
        with ir.InsertionPoint(strip_body), heavy.location:
            start = strip_body.arguments[0]
            end = _binary("arith.minsi", _binary("arith.addi", start, index_constant(PREFETCH_STRIP)), ub)
            when_long = ir.Operation.create("scf.if", operands=[long], regions=2)  # no else
        with ir.InsertionPoint(when_long.regions[0].blocks.append()), heavy.location:
            for ref, indices, computed in reads:
                line = max(1, LINE_BYTES * 8 // ir.MemRefType(ref.type).element_type.width)
                fetch, fetch_body = _scf_for(start, end, index_constant(line), [])
                with ir.InsertionPoint(fetch_body):
                    mapping = clone_ops(computed, {row: following, column: fetch_body.arguments[0]})
                    ir.Operation.create("memref.prefetch", operands=[ref, *[mapping.get(v, v) for v in indices]], attributes={
                        "isWrite": ir.BoolAttr.get(False), "isDataCache": ir.BoolAttr.get(True),
                        "localityHint": ir.IntegerAttr.get(ir.IntegerType.get_signless(32), PREFETCH_LOCALITY)})
                    ir.Operation.create("scf.yield")
            ir.Operation.create("scf.yield")
        with ir.InsertionPoint(strip_body), heavy.location:
            part = heavy.clone()
            part.operands[0], part.operands[1] = start, end
            for k in range(len(inits)):
                part.operands[3 + k] = strip_body.arguments[1 + k]
            ir.Operation.create("scf.yield", operands=list(part.results))
        for old, new in zip(heavy.results, strip.results):
            old.replace_all_uses_with(new)
        heavy.erase()
        changed += 1
    return changed
