"""StableHLO control flow (`while`, `if`, `case`) to scf, and `composite` to a call of its
decomposition. The wheel has no such pass: the
regions are moved, not copied, into `scf.while`, `scf.if` and `scf.index_switch`.
`optimization_barrier` (which only orders XLA's scheduling) gives its operands through."""

from __future__ import annotations

from torch_mlir import ir

from ..mlir_support import walk
from .lower import LoweringState, move_ops, register_rewrite


def remove_optimization_barriers(module: ir.Module) -> None:
    for op in walk(module.operation):
        if op.name == "stablehlo.optimization_barrier":
            for result, operand in zip(op.results, op.operands):
                result.replace_all_uses_with(operand)
            op.erase()


def _extract_scalar(tensor: ir.Value) -> ir.Value:
    elem = ir.RankedTensorType(tensor.type).element_type
    return ir.Operation.create("tensor.extract", results=[elem], operands=[tensor]).result


def _adopt(src: ir.Region, dst: ir.Region, terminator: str, arg_types=()) -> ir.Block:
    """Moves the single block of `src` into `dst` and swaps its `stablehlo.return` for
    `terminator` (built by the caller from the returned values)."""
    block = dst.blocks.append(*arg_types)
    old = src.blocks[0]
    for a, b in zip(old.arguments, block.arguments):
        a.replace_all_uses_with(b)
    move_ops(old, block)
    ret = block.operations[len(block.operations) - 1]
    with ir.InsertionPoint(ret), ret.location:
        if terminator == "scf.condition":
            cond = _extract_scalar(ret.operands[0])
            ir.Operation.create("scf.condition", operands=[cond] + list(block.arguments))
        else:
            ir.Operation.create(terminator, operands=list(ret.operands))
    ret.erase()
    return block


def _finish(op: ir.Operation, new: ir.Operation) -> None:
    for old, repl in zip(op.results, new.results):
        old.replace_all_uses_with(repl)
    op.erase()


@register_rewrite("stablehlo.while")
def _while(op: ir.Operation, state: LoweringState) -> None:
    types = [v.type for v in op.operands]
    with ir.InsertionPoint(op), op.location:
        new = ir.Operation.create("scf.while", results=types, operands=list(op.operands), regions=2)
    _adopt(op.regions[0], new.regions[0], "scf.condition", types)
    _adopt(op.regions[1], new.regions[1], "scf.yield", types)
    _finish(op, new)


@register_rewrite("stablehlo.if")
def _if(op: ir.Operation, state: LoweringState) -> None:
    with ir.InsertionPoint(op), op.location:
        cond = _extract_scalar(op.operands[0])
        new = ir.Operation.create("scf.if", results=[r.type for r in op.results], operands=[cond], regions=2)
    _adopt(op.regions[0], new.regions[0], "scf.yield")
    _adopt(op.regions[1], new.regions[1], "scf.yield")
    _finish(op, new)


@register_rewrite("stablehlo.case")
def _case(op: ir.Operation, state: LoweringState) -> None:
    n = len(op.regions)
    with ir.InsertionPoint(op), op.location:
        raw = _extract_scalar(op.operands[0])
        index = ir.Operation.create("arith.index_cast", results=[ir.IndexType.get()], operands=[raw]).result
        # an out-of-range index selects the last branch: it is the default region
        new = ir.Operation.create("scf.index_switch", results=[r.type for r in op.results], operands=[index],
                                  attributes={"cases": ir.DenseI64ArrayAttr.get(list(range(n - 1)))}, regions=n)
    _adopt(op.regions[n - 1], new.regions[0], "scf.yield")
    for i in range(n - 1):
        _adopt(op.regions[i], new.regions[i + 1], "scf.yield")
    _finish(op, new)


@register_rewrite("stablehlo.composite")
def _composite(op: ir.Operation, state: LoweringState) -> None:
    callee = ir.FlatSymbolRefAttr(op.attributes["decomposition"])
    with ir.InsertionPoint(op), op.location:
        call = ir.Operation.create("func.call", results=[r.type for r in op.results], operands=list(op.operands),
                                   attributes={"callee": callee})
    _finish(op, call)
