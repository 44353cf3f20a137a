"""Epilogues: the loop that consumes a library call's result row by row runs behind it.

A library GEMM (`disc_ral_gemm_*`) writes C = [batch, m, n] row-major; a convolution
(`disc_ral_conv_*`) writes [batch, features, positions...] with rows along the last output dim.
When the next thing its block does with memory is a parallel loop that reads (and writes) the
result only in the row it is at (bias, activation, residual, batch norm, and whole stitch
fusions such as softmax or layer norm over the product's rows), the RAL runs that loop on each
block of the result right after the block is computed, on the same thread, while the block is
in cache (`disc_ral_*_epilogue`): one pass over the result and one thread-pool dispatch fewer.

This pass only decides and marks: the call and the loop get the same `disc.gemm_epilogue` id.
The buffer passes treat the loop as the last use of the call's operands (they are read while the
loop runs), and outlining hands the loop's kernel to the call's epilogue entry instead of the
pool."""

from __future__ import annotations

from torch_mlir import ir

from ..mlir_support import identity_layout, int_constant, operation, walk
from .library_calls import STRIDED_RESULT_ATTR
from .loops import (EPILOGUE_ATTR, _HOISTABLE, _accesses, _dim_value, _expansion_checks, _in_parallel, _root, _same_size,
                    loop_bounds, row_dims)

# the library entries with an epilogue: positions of their calls' operands (the inputs' and the
# result's pointers, and the length of the result's rows)
_GEMM = ((5, 11), 17, 3)  # A, B, C, n
_CONV = ((4, 5), 6, 12)  # input, kernel, output, the last output dim
_OPERANDS = {"disc_ral_gemm_f32": _GEMM, "disc_ral_gemm_f64": _GEMM, "disc_ral_conv_f32": _CONV, "disc_ral_conv_f64": _CONV}
_CONTIGUOUS_VIEWS = ("memref.expand_shape", "memref.collapse_shape", "memref.cast", "memref.reshape")


def library_callee(op: ir.Operation) -> str | None:
    """The library entry a call with an epilogue entry calls (a GEMM or a convolution), or None."""
    if op.name != "func.call":
        return None
    callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
    return callee if callee in _OPERANDS else None


def _buffer_of_pointer(v: ir.Value, depth: int = 0) -> ir.Value | None:
    """The memref a library call's pointer operand was extracted from (through the address arithmetic)."""
    if isinstance(v.owner, ir.Block) or depth > 8:
        return None
    op = operation(v.owner)
    if op.name == "memref.extract_strided_metadata":
        return op.operands[0]
    for x in op.operands:
        if (found := _buffer_of_pointer(x, depth + 1)) is not None:
            return found
    return None


def _contiguous_view_of(ref: ir.Value, root: ir.Value) -> bool:
    """Whether `ref` is `root` seen through reshapes only (row-major, every element)."""
    while ref != root:
        if isinstance(ref.owner, ir.Block) or operation(ref.owner).name not in _CONTIGUOUS_VIEWS:
            return False
        ref = operation(ref.owner).operands[0]
    return identity_layout(ref.type)


def _strip_cast(v: ir.Value) -> ir.Value:
    """An i64 operand of a library call as the index value it was cast from."""
    if not isinstance(v.owner, ir.Block) and operation(v.owner).name == "arith.index_cast":
        return operation(v.owner).operands[0]
    return v


def _rows_only(loop: ir.Operation, call: ir.Operation, c: ir.Value) -> bool:
    """Whether each row of the loop's leading dims (the rows the thread pool splits) reads and
    writes the call's result C only in that row: every access is through a row-major view of
    all of C whose leading dims are the loop's (from 0, step 1) and whose last dim is C's row,
    indexed by the loop's leading induction variables; and the loop writes none of the call's
    inputs."""
    accesses = _accesses(loop)
    k = row_dims(loop)
    if accesses is None or k < 1:
        return False
    bounds = loop_bounds(loop)[:k]
    if any(int_constant(lb) != 0 or int_constant(step) != 1 for lb, _, step in bounds):
        return False
    ivs = list(loop.regions[0].blocks[0].arguments)[:k]
    inputs, _, row = _OPERANDS[library_callee(call)]
    operands = {_root(b) for b in (_buffer_of_pointer(call.operands[i]) for i in inputs) if b is not None}
    n = _strip_cast(call.operands[row])
    touches_c = False
    for ref, indices, writes in accesses:
        root = _root(ref)
        if writes and root in operands:
            return False
        if root != c:
            continue
        touches_c = True
        t = ir.MemRefType(ref.type)
        if (t.rank != k + 1 or not _contiguous_view_of(ref, c) or indices[:k] != ivs
                or not all(_same_size(_dim_value(ref, i), ub) for i, (_, ub, _) in enumerate(bounds))
                or not _same_size(_dim_value(ref, k), n)):
            return False
    return touches_c


def fuse_epilogues(module: ir.Module) -> int:
    """Marks each library call whose result the next loop of its block consumes row by row, and
    that loop; returns how many. Run after loop fusion (the loop is whole) and before rows are
    collapsed (the row structure is still the loop's leading dims)."""
    marked = 0
    after: dict[ir.Operation, ir.Operation | None] = {}  # each op -> the next op of its block that is not hoistable
    for call in [op for op in walk(module.operation)
                 if library_callee(op) and not _in_parallel(op) and STRIDED_RESULT_ATTR not in op.attributes]:
        c = _buffer_of_pointer(call.operands[_OPERANDS[library_callee(call)][1]])
        if c is None or isinstance(c.owner, ir.Block) or operation(c.owner).name != "memref.alloc":
            continue
        if call not in after:  # once per block (listing it at each call was quadratic in BERT-base's)
            following = None
            for o in reversed([o.operation for o in call.block.operations]):
                after[o] = following
                if not o.name.startswith(_HOISTABLE) or o.regions:
                    following = o
        loop = after[call]
        if (loop is None or loop.name != "scf.parallel" or loop.results or _expansion_checks(loop)
                or not _rows_only(loop, call, c)):
            continue
        marked += 1
        for op in (call, loop):
            op.attributes[EPILOGUE_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), marked)
    return marked


def _mark(op: ir.Operation) -> int | None:
    """The mark `fuse_epilogues` gave a library call and its loop, or None."""
    return ir.IntegerAttr(op.attributes[EPILOGUE_ATTR]).value if EPILOGUE_ATTR in op.attributes else None


def epilogues(module: ir.Module) -> dict[int, tuple[ir.Operation, ir.Operation]]:
    """Each library call with an epilogue and its loop, by their mark (one walk: looking for the
    other of the pair in a block of thousands of ops, at each of BERT's, was quadratic)."""
    calls, loops = {}, {}
    for op in walk(module.operation):
        mark = _mark(op)
        if mark is not None:
            (loops if op.name == "scf.parallel" else calls)[mark] = op
    return {mark: (call, loops[mark]) for mark, call in calls.items() if mark in loops}


def behind(op: ir.Operation, pairs: dict[int, tuple[ir.Operation, ir.Operation]]) -> ir.Operation:
    """For a library call with an epilogue (`pairs`: `epilogues`), the epilogue loop (which runs
    inside the call, so it is where the call's operands are last used); any other op itself."""
    if op.name != "func.call" or _mark(op) not in pairs:
        return op
    return pairs[_mark(op)][1]


def call_of(loop: ir.Operation, pairs: dict[int, tuple[ir.Operation, ir.Operation]]) -> ir.Operation | None:
    """The library call an epilogue loop runs behind (`pairs`: `epilogues`), or None."""
    return pairs[_mark(loop)][0] if _mark(loop) in pairs else None
