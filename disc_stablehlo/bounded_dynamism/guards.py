"""Run-time guards. The frontends' shape constraints arrive as `custom_call @shape_assertion`
ops (JAX) inside the entry function; they are moved into a separate generated function,
`disc_guard`, that the host calls before the entry function and that returns, packed into one
i64 tensor, the index of the first failed assertion (or -1) followed by every assertion's error
operands. The entry function keeps no assertion, so no kernel ever runs on rejected shapes.
The guard is shape arithmetic on the host: it reads no tensor's data (a check of values the data
decides, `disc.assert`, stays in the entry, where the data is: on a GPU, in device memory)."""

from __future__ import annotations

from .. import mlir_support  # noqa: F401  (first: loads torch-mlir's native modules, see _load_mlir)
from torch_mlir import ir

from ..mlir_support import call_target, create_value, find_function, function_type, llvm_string, walk
from .analysis import ShapeAnalysis, _is_var, dim_value
from .signature import Assertion

GUARD_FUNCTION = "disc_guard"


def _is_shape_assertion(op: ir.Operation) -> bool:
    return op.name == "stablehlo.custom_call" and call_target(op) == "shape_assertion"


def _has_side_effect(op: ir.Operation) -> bool:
    return "has_side_effect" in op.attributes and ir.BoolAttr(op.attributes["has_side_effect"]).value


def _pack_function(asserts: list[ir.Operation], width: int) -> str:
    params, body, values = [], ["%r_init = arith.constant -1 : i64"], []
    for k, op in enumerate(asserts):
        cond, *vals = op.operands
        params.append(f"%c{k}: {cond.type}")
        body.append(f"%ok{k} = tensor.extract %c{k}[] : {cond.type}")
        for j, v in enumerate(vals):
            params.append(f"%v{k}_{j}: {v.type}")
            elem = str(ir.RankedTensorType(v.type).element_type)
            body.append(f"%e{k}_{j} = tensor.extract %v{k}_{j}[] : {v.type}")
            if elem == "i64":
                values.append(f"%e{k}_{j}")
            else:
                body.append(f"%w{k}_{j} = arith.extsi %e{k}_{j} : {elem} to i64")
                values.append(f"%w{k}_{j}")
    prev = "%r_init"
    for k in reversed(range(len(asserts))):  # the first failing assertion wins
        body.append(f"%k{k} = arith.constant {k} : i64")
        body.append(f"%r{k} = arith.select %ok{k}, {prev}, %k{k} : i64")
        prev = f"%r{k}"
    body.append(f"%packed = tensor.from_elements {', '.join([prev] + values)} : tensor<{width}xi64>")
    body.append(f"return %packed : tensor<{width}xi64>")
    return (f"func.func private @__disc_guard_pack({', '.join(params)}) -> tensor<{width}xi64> {{\n  "
            + "\n  ".join(body) + "\n}")


def extract_guard(module: ir.Module, entry: ir.Operation) -> list[Assertion]:
    """Moves the entry's shape assertions into a new public function `disc_guard` (same
    arguments) and returns them in order; returns [] and adds nothing if there are none."""
    asserts = [op for op in walk(entry) if _is_shape_assertion(op)]
    if not asserts:
        return []
    found = [Assertion(ir.StringAttr(op.attributes["error_message"]).value, len(op.operands) - 1) for op in asserts]
    with ir.InsertionPoint(module.body):
        guard = entry.clone()
    guard.attributes["sym_name"] = ir.StringAttr.get(GUARD_FUNCTION)
    for op in walk(guard):  # checks of the data (`disc.assert`: sizes the data decides) are the entry's
        if op.name == "stablehlo.custom_call" and not _is_shape_assertion(op) and not op.results and _has_side_effect(op):
            op.erase()
    guard_asserts = [op for op in walk(guard) if _is_shape_assertion(op)]
    width = 1 + sum(a.num_values for a in found)
    parsed = ir.Module.parse(_pack_function(guard_asserts, width))  # must outlive the move
    parsed.body.operations[0].move_before(guard)
    result_type = ir.RankedTensorType.get([width], ir.IntegerType.get_signless(64))
    block = guard.regions[0].blocks[0]
    ret = block.operations[len(block.operations) - 1]
    with ir.InsertionPoint(ret), ret.location:
        call = ir.Operation.create("func.call", results=[result_type],
                                   operands=[v for op in guard_asserts for v in op.operands],
                                   attributes={"callee": ir.FlatSymbolRefAttr.get("__disc_guard_pack")})
        ir.Operation.create("func.return", operands=[call.result])
    ret.erase()
    ftype = function_type(guard)
    guard.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ftype.inputs, [result_type]))
    if "res_attrs" in guard.attributes:
        del guard.attributes["res_attrs"]
    for op in guard_asserts + asserts:
        op.erase()
    return found


CHECK_SHAPE = "disc_ral_check_shape"


def emit_contract_checks(module: ir.Module, entry: ir.Operation, shapes: ShapeAnalysis) -> int:
    """At the start of the entry (on buffers: after `unify_argument_dims`, whose merged reads of
    equal dims would make the checks vacuous), before any kernel: each equality of dims an op's semantics
    assumed and nothing proved (elementwise operands, concatenated dims, a dot's contracting
    dims, ...) whose sides are computed from the arguments' dims, checked at run time: a call of
    `disc_ral_check_shape` that ends the call with a ShapeError naming the op, its location and
    both values. Listed in the shape report (those over intermediate dims too, which the ops'
    own lowerings check where they run). Returns the number of checks."""
    block = entry.regions[0].blocks[0]
    var_dim = {}
    for arg, (_, dims) in zip(block.arguments, shapes.args):
        for i, d in enumerate(dims):
            if _is_var(d):
                var_dim.setdefault(str(d), (arg, i))

    def name(d) -> str:
        places = shapes.variables.get(str(d)) if _is_var(d) else None
        return places[0] if places else str(d)

    i64, i1, ptr = ir.IntegerType.get_signless(64), ir.IntegerType.get_signless(1), ir.Type.parse("!llvm.ptr")
    top, checks = ir.InsertionPoint.at_block_begin(module.body), 0
    start = ir.InsertionPoint.at_block_begin(block)
    for a, b, why, site in shapes.facts.assumed:
        with start, ir.Location.unknown():
            va, vb = dim_value(a, var_dim), dim_value(b, var_dim)
            if va is None or vb is None:
                shapes.checks.append(f"{site}: {name(a)} == {name(b)} ({why}): over intermediate dims, not checked here")
                continue
            text = f"{site}: {name(a)} is {{0}}, but {name(b)} is {{1}} ({why}: they must be equal)"
            top.insert(ir.Operation.parse(llvm_string(f"__disc_argument_contract_{checks}", text)))
            differ = create_value("arith.cmpi", [va, vb], i1, predicate=ir.IntegerAttr.get(i64, 1))  # ne
            ir.Operation.create("func.call", operands=[
                create_value("arith.extui", [differ], i64),
                create_value("llvm.mlir.addressof", [], ptr, global_name=ir.FlatSymbolRefAttr.get(f"__disc_argument_contract_{checks}")),
                create_value("arith.index_cast", [va], i64), create_value("arith.index_cast", [vb], i64)],
                attributes={"callee": ir.FlatSymbolRefAttr.get(CHECK_SHAPE)})
        shapes.checks.append(f"{site}: {name(a)} == {name(b)} ({why})")
        checks += 1
    if checks and find_function(module, CHECK_SHAPE) is None:  # the ops' lowerings may have declared it
        with ir.Location.unknown():
            top.insert(ir.Operation.parse(f"func.func private @{CHECK_SHAPE}(i64, !llvm.ptr, i64, i64)"))
    return checks
