"""Frees buffers right after their last use. MLIR's ownership-based deallocation places each
`memref.dealloc` at the end of the buffer's block (the whole function, for straight-line code);
moving it up to the last op of that block that touches the buffer, or anything derived from it
(views, extracted pointers and the arithmetic on them), lets the RAL's cache hand the memory to
the buffers allocated after it.

Where sizes are provably equal (same type, same size operands: `dims.unify_argument_dims` makes
proven-equal sizes the same SSA values), the plan is made at compile time instead: a buffer
allocated after another one of the same size was freed takes over that buffer's storage, with
no allocator call at all.

With bounded dims (or static shapes), `plan_arena` goes further: every buffer of the entry
function whose size has an upper bound gets a fixed offset in one arena of the upper-bound size,
planned once by liveness; a call allocates the arena (the RAL's cache hands back the same block
every call) and no buffer inside it."""

from __future__ import annotations

from torch_mlir import ir

from ..bounded_dynamism.analysis import ShapeAnalysis
from ..mlir_support import create_value, identity_layout, index_constant, int_constant, llvm_string, location_text, operation, walk
from .epilogues import behind, epilogues

ARENA_ALIGNMENT = 64
ARENA_BUFFER_LIMIT = 16 << 20  # bytes: a buffer whose bound is larger is allocated per call

# results that carry no address of the buffer they read
_NO_ALIAS = ("memref.load", "memref.dim", "affine.load")


def _derived(root: ir.Value) -> list[ir.Value]:
    """The buffer and every value computed from it that may carry its address."""
    found, todo = [root], [root]
    while todo:
        v = todo.pop()
        for use in v.uses:
            owner = operation(use.owner)
            if owner.name in _NO_ALIAS:
                continue
            for r in owner.results:
                if not any(r == f for f in found):
                    found.append(r)
                    todo.append(r)
    return found


def _top_level(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """The ancestor of `op` that sits directly in `block`."""
    while op is not None:
        if op.block == block:
            return op
        op = op.parent
    return None


def _root_allocation(v: ir.Value) -> ir.Value | None:
    """The `memref.alloc` a (view of a) buffer comes from; None for anything else (an argument,
    a loop-carried value) whose other aliases this pass cannot see."""
    while True:
        owner = v.owner
        if isinstance(owner, ir.Block):
            return None
        owner = operation(owner)
        if owner.name == "memref.alloc":
            return v
        if not owner.name.startswith("memref.") or not owner.operands:
            return None
        v = owner.operands[0]  # views, casts and strided metadata read their source first


def free_after_last_use(module: ir.Module) -> None:
    pairs = epilogues(module)
    for dealloc in [op for op in walk(module.operation) if op.name == "memref.dealloc"]:
        root = _root_allocation(dealloc.operands[0])
        block = dealloc.block
        if root is None or root.owner.operation.block != block:  # uses in enclosing blocks are out of sight
            continue
        last = None
        for v in _derived(root):
            for use in v.uses:
                owner = operation(use.owner)
                if owner == dealloc:
                    continue
                top = _top_level(owner, block)
                top = behind(top, pairs) if top is not None else None  # a GEMM reads its operands while its epilogue runs
                if top is not None and (last is None or last.is_before_in_block(top)):
                    last = top
        if last is not None and last.is_before_in_block(dealloc) and not last.name.endswith(("yield", "return", "condition")):
            dealloc.move_after(last)


def reuse_equal_buffers(module: ir.Module) -> int:
    """Within each block, a dynamically sized allocation that follows the (moved-up) free of a
    buffer with as many bytes takes that buffer's storage instead (a view of it, when the types
    differ); returns how many allocations were removed. (Statically sized buffers are left to
    the arena, which shares them by liveness as well.)"""
    reused = 0
    for func in [op for op in walk(module.operation) if op.name == "func.func"]:
        for block in [b for op in walk(func) for r in op.regions for b in r.blocks]:
            freed: dict[tuple, list[tuple[ir.Operation, ir.Value]]] = {}  # byte size -> (dealloc, buffer)
            for op in list(block.operations):
                op = op.operation
                if op.name == "memref.dealloc" and (key := _freed_key(op.operands[0], block)) is not None:
                    freed.setdefault(key, []).append((op, op.operands[0]))
                elif op.name == "memref.alloc" and op.operands and (key := _size_key(op.result.type, op.operands)) is not None and freed.get(key):
                    dealloc, buffer = freed[key].pop()
                    dealloc.erase()
                    if buffer.type != op.result.type or _dynamic_sizes(buffer) != list(op.operands):  # (n, m) for (m, n): a view
                        buffer = _view(_storage(buffer), op)
                    op.result.replace_all_uses_with(buffer)
                    op.erase()
                    reused += 1
    for op in walk(module.operation):  # a view's storage is freed through the allocation itself
        if op.name == "memref.dealloc" and _owner_name(op.operands[0]) == "memref.view":
            op.operands[0] = operation(op.operands[0].owner).operands[0]
    return reused


def _owner_name(v: ir.Value) -> str | None:
    return None if isinstance(v.owner, ir.Block) else operation(v.owner).name


def _freed_key(v: ir.Value, block: ir.Block) -> tuple | None:
    """The byte-size key of a buffer this block allocated (directly or as a view of bytes)."""
    if _owner_name(v) not in ("memref.alloc", "memref.view") or operation(v.owner).block != block:
        return None
    return _size_key(v.type, _dynamic_sizes(v))


def _dynamic_sizes(v: ir.Value) -> list[ir.Value]:
    """The dynamic dims of an allocation or a view of bytes, in order."""
    op = operation(v.owner)
    return list(op.operands) if op.name == "memref.alloc" else list(op.operands)[2:]


def _size_key(t: ir.Type, dynamic_sizes: list[ir.Value]) -> tuple | None:
    t = ir.MemRefType(t)
    elem = element_bytes(t.element_type)
    if elem is None or not dynamic_sizes or not identity_layout(t):  # views of byte buffers need it
        return None
    static = elem
    for i in range(t.rank):
        static *= 1 if t.is_dynamic_dim(i) else t.shape[i]
    return static, tuple(sorted(dynamic_sizes, key=hash))


def _storage(buffer: ir.Value) -> ir.Value:
    """The 1-D byte buffer behind `buffer`; a typed allocation is turned into bytes + a view."""
    op = operation(buffer.owner)
    if op.name == "memref.view":
        return op.operands[0]
    key = _size_key(buffer.type, list(op.operands))
    with ir.InsertionPoint(op), op.location:
        nbytes = index_constant(key[0])
        for d in op.operands:
            nbytes = create_value("arith.muli", [nbytes, d], nbytes.type)
        storage = _bytes(nbytes)
    view = _view(storage, op)
    buffer.replace_all_uses_with(view)
    op.erase()
    return storage


def _bytes(size: int | ir.Value) -> ir.Value:
    """A new 64-byte aligned byte buffer of `size` bytes (a constant, or an index value)."""
    static = isinstance(size, int)
    t = ir.MemRefType.get([size if static else ir.ShapedType.get_dynamic_size()], ir.IntegerType.get_signless(8))
    operands = [] if static else [size]
    return ir.Operation.create("memref.alloc", results=[t], operands=operands, attributes={
        "alignment": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), ARENA_ALIGNMENT),
        "operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(operands), 0])}).result


def _view(storage: ir.Value, alloc: ir.Operation, offset: int = 0) -> ir.Value:
    """`alloc`'s buffer as a view of `storage` at byte `offset` (inserted before `alloc`)."""
    with ir.InsertionPoint(alloc), alloc.location:
        return create_value("memref.view", [storage, index_constant(offset), *alloc.operands], alloc.result.type)


_INTERVAL_OPS = {
    "arith.addi": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "arith.subi": lambda a, b: (a[0] - b[1], a[1] - b[0]),
    "arith.muli": lambda a, b: (min(x * y for x in a for y in b), max(x * y for x in a for y in b)),
    "arith.maxsi": lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
    "arith.minsi": lambda a, b: (min(a[0], b[0]), min(a[1], b[1])),
    "arith.ceildivsi": lambda a, b: (-(-a[0] // b[1]), -(-a[1] // b[0])) if b[0] > 0 and a[0] >= 0 else None,
    "arith.divsi": lambda a, b: (a[0] // b[1], a[1] // b[0]) if b[0] > 0 and a[0] >= 0 else None,
}


def _interval(v: ir.Value, entry_block: ir.Block, shapes: ShapeAnalysis, used: set[str], depth: int = 0) -> tuple[int, int] | None:
    """Bounds of an index value computed from constants and argument dims (the dimension
    variables whose bounds it takes are added to `used`); None if unknown."""
    if isinstance(v.owner, ir.Block) or depth > 32:
        return None
    if (c := int_constant(v)) is not None:
        return c, c
    op = operation(v.owner)
    if op.name == "memref.dim":
        src, index = op.operands
        if (isinstance(src.owner, ir.Block) and src.owner == entry_block and src.arg_number < len(shapes.args)
                and (i := _interval(index, entry_block, shapes, used, depth + 1)) is not None):
            dim = shapes.facts.canon(shapes.args[src.arg_number][1][i[0]])
            used.update(dim.variables)
            return shapes.facts.range(dim)
        return None
    if op.name in ("arith.index_cast", "arith.index_castui"):
        return _interval(op.operands[0], entry_block, shapes, used, depth + 1)
    if op.name in _INTERVAL_OPS:
        a, b = (_interval(x, entry_block, shapes, used, depth + 1) for x in op.operands)
        return None if a is None or b is None else _INTERVAL_OPS[op.name](a, b)
    return None


def element_bytes(t: ir.Type) -> int | None:
    """Bytes of one element of a buffer of `t` (a boolean takes a byte), or None for a type of no
    fixed size."""
    if isinstance(t, ir.ComplexType):
        inner = element_bytes(t.element_type)
        return None if inner is None else 2 * inner
    if isinstance(t, ir.IndexType):
        return 8
    if isinstance(t, (ir.IntegerType, ir.FloatType)):
        return max(1, (t.width + 7) // 8)
    return None


def _upper_bytes(alloc: ir.Operation, entry_block: ir.Block, shapes: ShapeAnalysis, used: set[str]) -> int | None:
    t = ir.MemRefType(alloc.result.type)
    size = element_bytes(t.element_type)
    if size is None or not identity_layout(t):
        return None
    dynamic = iter(alloc.operands)
    for i in range(t.rank):
        if t.is_dynamic_dim(i):
            bounds = _interval(next(dynamic), entry_block, shapes, used)
            if bounds is None:
                return None
            size *= max(bounds[1], 0)
        else:
            size *= t.shape[i]
    return size


def plan_arena(entry: ir.Operation, shapes: ShapeAnalysis) -> None:
    """Places the entry block's bounded buffers (those it frees itself) in one arena; what it
    placed, and on which bounds each dynamically sized buffer relies, goes to `shapes.uses`."""
    block = entry.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    frees: dict[ir.Value, tuple[int, ir.Operation]] = {}  # buffer -> where the block frees it
    for i, op in enumerate(ops):
        if op.name == "memref.dealloc":
            frees[op.operands[0]] = (i, op)
    placed: list[tuple[int, int, int, int, ir.Operation, ir.Operation]] = []  # start, end, offset, size, alloc, dealloc
    name = ir.StringAttr(entry.attributes["sym_name"]).value
    relied: list[str] = []
    for start, op in enumerate(ops):
        if op.name != "memref.alloc" or op.result not in frees:
            continue
        end, dealloc = frees[op.result]
        used: set[str] = set()
        size = _upper_bytes(op, block, shapes, used)
        if size is None or size > ARENA_BUFFER_LIMIT:
            continue
        size = max(-(-size // ARENA_ALIGNMENT) * ARENA_ALIGNMENT, ARENA_ALIGNMENT)
        offset = 0
        for _, _, o, s in sorted((p[:4] for p in placed if p[0] < end and start < p[1]), key=lambda p: p[2]):
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        placed.append((start, end, offset, size, op, dealloc))
        if used:
            bounds = ", ".join(f"{v} <= {shapes.facts.upper[v]}" for v in sorted(used))
            relied.append(f"@{name}: buffer {op.result.type} at arena offset {offset} ({size} bytes at most) relies on {bounds}")
    total = max((p[2] + p[3] for p in placed), default=0)
    shapes.uses += [f"@{name}: {len(placed)} buffer(s) of bounded size placed in an arena of {total} bytes"] + relied
    if not placed:
        return
    with ir.InsertionPoint.at_block_begin(block), entry.location:
        arena = _bytes(total)
    for _, _, offset, _, alloc, dealloc in placed:
        alloc.result.replace_all_uses_with(_view(arena, alloc, offset))
        dealloc.erase()
        alloc.erase()
    terminator = list(block.operations)[-1]
    with ir.InsertionPoint(terminator), entry.location:
        ir.Operation.create("memref.dealloc", operands=[arena])


def check_allocation_sizes(module: ir.Module, functions: list[str]) -> int:
    """Before every allocation of a dynamically sized buffer in the host `functions`, a call of
    `disc_ral_check_alloc` with whether a dim is negative (and its value) or the byte count
    overflows 63 bits (a dim of 0 aside), and what the buffer is: the RAL then ends the call
    with a ShapeError instead of allocating a wrapped-around size that kernels would write past.
    Returns the number of checks."""
    i64, i1, ptr = ir.IntegerType.get_signless(64), ir.IntegerType.get_signless(1), ir.Type.parse("!llvm.ptr")
    top = ir.InsertionPoint.at_block_begin(module.body)
    checks = 0
    for func in [op.operation for op in module.body.operations if op.operation.name == "func.func"
                 and ir.StringAttr(op.attributes["sym_name"]).value in functions]:
        for alloc in [op for op in walk(func) if op.name == "memref.alloc" and list(op.operands)]:
            mt = ir.MemRefType(alloc.result.type)
            static = element_bytes(mt.element_type)
            for i in range(mt.rank):
                static *= 1 if mt.is_dynamic_dim(i) else mt.shape[i]
            site = f"__disc_alloc_site_{checks}"
            with alloc.location:
                top.insert(ir.Operation.parse(llvm_string(site, f"{location_text(alloc)}: a buffer of {mt}")))
            with ir.InsertionPoint(alloc), alloc.location:
                def const(v: int, t: ir.Type = i64) -> ir.Value:
                    return create_value("arith.constant", [], t, value=ir.IntegerAttr.get(t, v))

                def test(predicate: int, a: ir.Value) -> ir.Value:  # a against 0: 0 eq, 1 ne, 2 slt
                    return create_value("arith.cmpi", [a, const(0)], i1, predicate=ir.IntegerAttr.get(i64, predicate))

                def either(a: ir.Value, b: ir.Value) -> ir.Value:
                    return create_value("arith.ori", [a, b], i1)

                size, negative, value, overflow, empty = const(static), const(0, i1), const(0), const(0, i1), const(0, i1)
                for d in alloc.operands:
                    d = create_value("arith.index_cast", [d], i64)
                    value = create_value("arith.select", [negative, value, d], i64)  # the first negative dim, once one is
                    negative = either(negative, test(2, d))
                    empty = either(empty, test(0, d))
                    product = ir.Operation.create("arith.mului_extended", results=[i64, i64], operands=[size, d])
                    size = product.results[0]
                    overflow = either(overflow, either(test(1, product.results[1]), test(2, size)))
                overflow = create_value("arith.select", [empty, const(0, i1), overflow], i1)
                status = create_value("arith.select", [negative, const(1), create_value("arith.select", [overflow, const(2), const(0)], i64)], i64)
                address = create_value("llvm.mlir.addressof", [], ptr, global_name=ir.FlatSymbolRefAttr.get(site))
                ir.Operation.create("func.call", operands=[status, value, address],
                                    attributes={"callee": ir.FlatSymbolRefAttr.get("disc_ral_check_alloc")})
            checks += 1
    if checks:
        with ir.Location.unknown():
            top.insert(ir.Operation.parse("func.func private @disc_ral_check_alloc(i64, i64, !llvm.ptr)"))
    return checks
