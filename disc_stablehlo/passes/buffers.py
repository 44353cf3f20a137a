"""Frees buffers right after their last use. MLIR's ownership-based deallocation places each
`memref.dealloc` at the end of the buffer's block (the whole function, for straight-line code);
moving it up to the last op of that block that touches the buffer, or anything derived from it
(views, extracted pointers and the arithmetic on them), lets the RAL's cache hand the memory to
the buffers allocated after it."""

from __future__ import annotations

from torch_mlir import ir

from ..mlir_support import operation, walk

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
                if top is not None and (last is None or last.is_before_in_block(top)):
                    last = top
        if last is not None and last.is_before_in_block(dealloc) and not last.name.endswith(("yield", "return", "condition")):
            dealloc.move_after(last)
