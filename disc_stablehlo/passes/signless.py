"""After the StableHLO->linalg conversion, signedness lives in the arith ops (divui, cmpi ult,
extui, ...) and unsigned integer types survive only at function boundaries and in our templates'
tensor ops, joined to the converted code by `unrealized_conversion_cast`s that bufferization
rejects. Every unsigned type becomes the signless type of the same width (the bits and the C ABI
are the same), and the casts that became identities dissolve."""

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
