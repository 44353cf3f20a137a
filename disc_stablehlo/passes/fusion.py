"""Fusion decisions of our own on linalg-on-tensors, around upstream's elementwise fusion.

- A tensor that holds one value everywhere (a `linalg.fill`, or a generic that yields a value
  from outside its body or computed from such values alone: the lowering of a broadcast scalar
  constant; seen through reshapes) is never materialised for
  a generic that reads it: the reader uses the scalar and the operand is dropped. Upstream fusion
  cannot do this when the reader indexes the tensor with a non-permutation map (a size-1 dim).
- A broadcast read by several ops (an attention mask broadcast once for every layer) is
  computed again inside each reader instead of materialised: upstream fusion only fuses a
  producer into its single reader, so it is cloned, one copy per reader, before fusion.
- A generic on 0-d tensors (the computation regions of sort, scatter and reduce_window, inlined
  into the loops that walk the elements) becomes the scalar ops of its body: no 0-d tensor is
  allocated per element."""

from __future__ import annotations

from torch_mlir import ir

from ..mlir_support import clone_ops, defined_outside, operation, walk


def _uniform_value(v: ir.Value) -> ir.Value | None:
    """The scalar every element of `v` equals, when the ops that make `v` say so (a reshape or
    cast of such a tensor included). A generic whose body computes its value from values outside
    it alone (`arith.truncf` of a constant, which does not fold when inexact) has
    that computation moved before it."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    op = operation(owner)
    if op.name in ("tensor.collapse_shape", "tensor.expand_shape", "tensor.cast"):
        return _uniform_value(op.operands[0])
    if op.name == "linalg.fill":
        scalar = op.operands[0]
        return scalar if scalar.type == ir.RankedTensorType(v.type).element_type else None
    if op.name == "linalg.generic" and len(op.results) == 1:
        body = op.regions[0].blocks[0]
        *computed, terminator = [operation(o) for o in body.operations]
        y = terminator.operands[0]
        if not defined_outside(y, op) and all(_scalar_of_outside_values(c, op) for c in computed):
            for c in computed:
                c.move_before(op)
        return y if defined_outside(y, op) else None
    return None


def _scalar_of_outside_values(op: ir.Operation, generic: ir.Operation) -> bool:
    """An arith or math op on values defined outside `generic` or by ops of its body before it."""
    return (op.name.split(".")[0] in ("arith", "math") and not op.regions
            and not any(isinstance(x.owner, ir.Block) and x.owner == generic.regions[0].blocks[0] for x in op.operands))


def _num_inputs(op: ir.Operation) -> int:
    return ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])[0]


def forward_uniform_operands(module: ir.Module) -> None:
    """Generic ops read uniform inputs as scalars (canonicalize then drops the operands and the
    producers that lose their last reader)."""
    for op in walk(module.operation):
        if op.name != "linalg.generic":
            continue
        args = op.regions[0].blocks[0].arguments
        for i in range(_num_inputs(op)):
            scalar = _uniform_value(op.operands[i])
            if scalar is not None:
                args[i].replace_all_uses_with(scalar)


def _is_broadcast(op: ir.Operation) -> bool:
    """A generic that only expands its inputs: every loop parallel, one result, its body at most
    a few arithmetic ops on the inputs' elements, and some input read with fewer dims than the
    result has (so each element is computed from a smaller tensor)."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    if any("parallel" not in str(t) for t in ir.ArrayAttr(op.attributes["iterator_types"])):
        return False
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    inputs = maps[:_num_inputs(op)]
    body = list(op.regions[0].blocks[0].operations)
    return (any(len(m.results) < len(maps[-1].results) for m in inputs) and len(body) <= 4
            and all(o.name.startswith("arith.") for o in body[:-1]))


def duplicate_broadcasts(module: ir.Module) -> int:
    """Gives every reader but the first of a broadcast (`_is_broadcast`) a copy of it of its own,
    so elementwise fusion puts the broadcast into each reader; returns the copies made."""
    copies = 0
    for op in walk(module.operation):
        if not _is_broadcast(op):
            continue
        for use in list(op.results[0].uses)[1:]:
            reader = operation(use.owner)
            clone = op.clone(ir.InsertionPoint(reader))
            reader.operands[use.operand_number] = clone.results[0]
            copies += 1
    return copies


def _rank0(v: ir.Value) -> bool:
    return isinstance(v.type, ir.RankedTensorType) and ir.RankedTensorType(v.type).rank == 0


def scalarize_rank0_generics(module: ir.Module) -> int:
    """Replaces each linalg.generic whose operands and results are all 0-d tensors by its body's
    ops on the extracted scalars, the results rebuilt with `tensor.from_elements` (canonicalize
    then folds them against the `tensor.extract`s that read them); returns how many."""
    count = 0
    for op in walk(module.operation):
        if op.name != "linalg.generic" or not all(_rank0(v) for v in [*op.operands, *op.results]):
            continue
        body = op.regions[0].blocks[0]
        ops = list(body.operations)
        if any(len(o.regions) for o in ops):
            continue
        with ir.InsertionPoint(op), op.location:
            mapping = {arg: ir.Operation.create("tensor.extract", results=[ir.RankedTensorType(v.type).element_type],
                                                operands=[v]).result
                       for arg, v in zip(body.arguments, op.operands)}
            clone_ops(ops[:-1], mapping)
            for result, v in zip(op.results, ops[-1].operands):
                built = ir.Operation.create("tensor.from_elements", results=[result.type], operands=[mapping.get(v, v)]).result
                result.replace_all_uses_with(built)
        op.erase()
        count += 1
    return count
