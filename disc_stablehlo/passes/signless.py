"""After the StableHLO->linalg conversion, signedness lives in the arith ops (divui, cmpi ult,
extui, ...) and unsigned integer types survive only at function boundaries and in our templates'
tensor ops, joined to the converted code by `unrealized_conversion_cast`s that bufferization
rejects. Every unsigned type becomes the signless type of the same width (the bits and the C ABI
are the same), and the casts that became identities dissolve.

After the lowering to LLVM, booleans in memory are accessed as the bytes they are
(`boolean_access_as_bytes`): LLVM's loop vectoriser leaves every loop that loads or stores an `i1`
scalar (an "irregular" type, one bit stored in a byte), so a select on a boolean mask ran one
element at a time."""

from __future__ import annotations

import re

from torch_mlir import ir

from ..mlir_support import walk

_UNSIGNED = re.compile(r"ui(\d+)")


def _signless(t: ir.Type) -> ir.Type | None:
    text = str(t)
    return ir.Type.parse(_UNSIGNED.sub(r"i\1", text)) if _UNSIGNED.search(text) else None


def make_signless(module: ir.Module) -> None:
    for op in walk(module.operation):
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    if (t := _signless(arg.type)) is not None:
                        arg.set_type(t)
        for res in op.results:
            if (t := _signless(res.type)) is not None:
                res.set_type(t)
        if op.name == "func.func":
            ftype = ir.TypeAttr(op.attributes["function_type"]).value
            if (t := _signless(ftype)) is not None:
                op.attributes["function_type"] = ir.TypeAttr.get(t)
    for op in walk(module.operation):
        if op.name == "builtin.unrealized_conversion_cast" and len(op.operands) == 1 and op.operands[0].type == op.results[0].type:
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()


def boolean_access_as_bytes(op: ir.Operation) -> None:
    """An `llvm.load` of an i1 becomes a load of its byte and a compare with zero (any nonzero
    byte is true, as numpy reads a bool), a store of an i1 a zero-extension and a byte store;
    the attributes (alignment, ordering, ...) stay. Other ops are left as they are."""
    i1 = ir.IntegerType.get_signless(1)
    if op.name == "llvm.load" and op.results[0].type == i1:
        i8, i64 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(64)
        attrs = {name: op.attributes[name] for name in op.attributes}
        with ir.InsertionPoint(op), op.location:
            byte = ir.Operation.create("llvm.load", results=[i8], operands=[op.operands[0]], attributes=attrs).result
            zero = ir.Operation.create("llvm.mlir.constant", results=[i8], attributes={"value": ir.IntegerAttr.get(i8, 0)}).result
            ne = ir.Operation.create("llvm.icmp", results=[i1], operands=[byte, zero],
                                     attributes={"predicate": ir.IntegerAttr.get(i64, 1)})  # ICmpPredicate::ne
        op.results[0].replace_all_uses_with(ne.result)
        op.erase()
    elif op.name == "llvm.store" and op.operands[0].type == i1:
        attrs = {name: op.attributes[name] for name in op.attributes}
        with ir.InsertionPoint(op), op.location:
            byte = ir.Operation.create("llvm.zext", results=[ir.IntegerType.get_signless(8)], operands=[op.operands[0]]).result
            ir.Operation.create("llvm.store", operands=[byte, op.operands[1]], attributes=attrs)
        op.erase()
