"""Fusion decisions of our own on linalg-on-tensors, around upstream's elementwise fusion.

- A tensor that holds one value everywhere (a `linalg.fill`, or a generic that yields a value
  from outside its body: the lowering of a broadcast scalar constant) is never materialised for
  a generic that reads it: the reader uses the scalar and the operand is dropped. Upstream fusion
  cannot do this when the reader indexes the tensor with a non-permutation map (a size-1 dim)."""

from __future__ import annotations

from torch_mlir import ir

from ..mlir_support import defined_outside, operation, walk


def _uniform_value(v: ir.Value) -> ir.Value | None:
    """The scalar every element of `v` equals, when the op that makes `v` says so."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    op = operation(owner)
    if op.name == "linalg.fill":
        scalar = op.operands[0]
        return scalar if scalar.type == ir.RankedTensorType(v.type).element_type else None
    if op.name == "linalg.generic" and _num_inputs(op) == 0:
        body = op.regions[0].blocks[0]
        ops = list(body.operations)
        if len(ops) == 1 and ops[0].name == "linalg.yield" and len(op.results) == 1:
            y = ops[0].operands[0]
            return y if defined_outside(y, op) else None
    return None


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
