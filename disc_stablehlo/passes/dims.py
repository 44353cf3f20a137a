"""Dims the shape analysis proves equal become one SSA value.

Every dim read (`memref.dim`, `tensor.dim`) of an entry argument is replaced by the same dim of
the first argument whose symbolic size is the same (or by a constant, when the facts fix it).
CSE then merges the shape arithmetic built on them: loops over provably equal dims get identical
bounds (so they can fuse, whichever argument each loop's bounds were read from), and buffers of
provably equal size get identical size operands, which is what lets the buffer plan
(`buffers.reuse_equal_buffers`) share them. Both run once the loops exist, when every dim read
the lowering makes is there."""

from __future__ import annotations

from torch_mlir import ir

from ..bounded_dynamism.analysis import ShapeAnalysis
from ..mlir_support import create_value, index_constant, int_constant, operation, tag_facts, walk


def _argument_dim_reads(entry: ir.Operation, shapes: ShapeAnalysis) -> list[tuple[ir.Operation, int, int]]:
    """(op, argument, dim) of every dim read of an entry argument the signature describes, at a
    constant dim."""
    block = entry.regions[0].blocks[0]
    found = []
    for op in walk(entry):
        if op.name not in ("memref.dim", "tensor.dim") or not isinstance(op.operands[0].owner, ir.Block) or op.operands[0].owner != block:
            continue
        a, i = op.operands[0].arg_number, int_constant(op.operands[1])
        if i is not None and a < len(shapes.args):
            found.append((op, a, i))
    return found


def argument_dim_sources(shapes: ShapeAnalysis) -> list[list[int | tuple[int, int]]]:
    """Per entry argument and dim: its size when the facts fix it, else the (argument, dim) of the
    first argument dim with the same symbolic size, the one `unify_argument_dims` reads instead."""
    canon = [[shapes.facts.canon(d) for d in dims] for _, dims in shapes.args]
    first: dict[str, tuple[int, int]] = {}
    for a, dims in enumerate(canon):
        for i, d in enumerate(dims):
            first.setdefault(str(d), (a, i))
    return [[d.constant if d.constant is not None else first[str(d)] for d in dims] for dims in canon]


def unify_argument_dims(entry: ir.Operation, shapes: ShapeAnalysis) -> int:
    """Returns how many dim reads were replaced (each is listed in `shapes.uses`)."""
    block = entry.regions[0].blocks[0]
    canon = [[shapes.facts.canon(d) for d in dims] for _, dims in shapes.args]
    sources = argument_dim_sources(shapes)
    replaced = 0
    for op, a, i in _argument_dim_reads(entry, shapes):
        d, source = canon[a][i], sources[a][i]
        with ir.InsertionPoint(op), op.location:
            if isinstance(source, int):
                new = index_constant(source)
            elif source != (a, i):
                ra, ri = source
                new = create_value(op.name, [block.arguments[ra], index_constant(ri)], ir.IndexType.get())
            else:
                continue
        if (named := shapes.args[a][1][i]) != d:  # equal by a fact, not by name
            tag_facts(operation(new.owner), [f"{named} == {d}"])
        what = f"constant {d.constant}" if d.constant is not None else f"{shapes.args[ra][0]} dim {ri}"
        shapes.uses.append(f"{shapes.args[a][0]} dim {i} ({d}) read as {what}")
        op.result.replace_all_uses_with(new)
        op.erase()
        replaced += 1
    return replaced
