"""Parallel loops on the RAL thread pool.

After bufferization every linalg op is an `scf.parallel` nest. Each outermost one is moved into
a public function `void __disc_par_N(void *slots, i64 lo, i64 hi)` that runs iterations [lo, hi)
of its first dimension, and the host instead packs the loop's captured values into a stack
array of 8-byte slots (memref descriptors field by field) and calls
`disc_ral_parallel_for(__disc_par_N, slots, n, work)`. The function's address is taken after
the lowering to LLVM (`llvm.mlir.addressof` only names LLVM functions)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from torch_mlir import ir

from ..artifact import Kernel
from ..mlir_support import defined_outside, facts_relied_on, nested_in, new_private_function, operation, walk
from .epilogues import call_of, epilogues, library_callee
from .loops import EPILOGUE_ATTR, FUSED_ATTR, POOL_ATTR, VERSION_ATTR, VIEWS, loop_bounds
from .lower import LoweringState, clone_captured_constants

PTR = "!llvm.ptr"
FNPTR_STEM = "__disc_fnptr_"
POOLED_WORK = 1 << 40  # a work estimate far above the RAL's RAL_PARALLEL_MIN_WORK


def _sink_views(op: ir.Operation) -> None:
    """Views of buffers the loop reads are rebuilt at the start of its body (views of views
    too): the kernel then receives the buffers, and LLVM sees that views of one buffer are
    the same memory at known offsets (a depthwise convolution reads its padded input through
    one strided view per window position: each would be a pointer of its own, and the
    vectorised loop would check each against the output for overlap)."""
    body = op.regions[0].blocks[0]
    while True:
        views = [(inner, i, v) for inner in walk(op) for i, v in enumerate(inner.operands)
                 if defined_outside(v, op) and not isinstance(v.owner, ir.Block) and operation(v.owner).name in VIEWS]
        if not views:
            return
        clones: dict[ir.Value, ir.Value] = {}
        for inner, i, v in views:
            if v not in clones:
                with ir.InsertionPoint.at_block_begin(body):
                    clones[v] = operation(v.owner).clone().result
            inner.operands[i] = clones[v]
        for v in clones:
            if not list(v.uses):
                operation(v.owner).erase()


def _captured(op: ir.Operation) -> list[ir.Value] | None:
    found: list[ir.Value] = []
    for inner in walk(op):
        for v in inner.operands:
            if defined_outside(v, op) and not any(v == f for f in found):
                found.append(v)
    for v in found:
        t = v.type
        if isinstance(t, ir.ComplexType):
            t = t.element_type
        if not (isinstance(t, (ir.MemRefType, ir.IndexType, ir.IntegerType, ir.F16Type, ir.BF16Type, ir.F32Type, ir.F64Type))):
            return None  # vectors: the loop stays serial
    return found


def _struct(t: ir.MemRefType) -> str:
    r = t.rank
    return "!llvm.struct<(ptr, ptr, i64)>" if r == 0 else f"!llvm.struct<(ptr, ptr, i64, array<{r} x i64>, array<{r} x i64>)>"


def _slots(t: ir.Type) -> list[tuple[str, list[int]]]:
    """(LLVM type, position) of each slot a value of type `t` takes: a memref descriptor's field
    (extractvalue position), a complex number's real [0] and imaginary [1] part."""
    if isinstance(t, ir.MemRefType):
        r = t.rank
        return [(PTR, [0]), (PTR, [1]), ("i64", [2])] + [("i64", [3, i]) for i in range(r)] + [("i64", [4, i]) for i in range(r)]
    if isinstance(t, ir.IndexType):
        return [("i64", [])]
    if isinstance(t, ir.ComplexType):
        return [(str(ir.ComplexType(t).element_type), [0]), (str(ir.ComplexType(t).element_type), [1])]
    return [(str(t), [])]


def _find(captured: list[ir.Value], v: ir.Value) -> int:
    return next(i for i, c in enumerate(captured) if c == v)


Bounds = list[tuple[int, int, int]]  # per loop dimension: captured positions of lower bound, upper bound, step


def pack_slots(captured: list[ir.Value]) -> list[str]:
    """Lines that store the captured values (`%v<i>`) into a stack array `%buf` of 8-byte slots
    (a memref descriptor in one store of its struct, whose fields fill consecutive slots: a quarter of the
    encoder's host LLVM IR was these stores field by field)."""
    lines, slot = ["%sp = llvm.intr.stacksave : !llvm.ptr"], 0
    total = sum(len(_slots(v.type)) for v in captured)
    lines += [f"%count = llvm.mlir.constant({total} : i64) : i64", "%buf = llvm.alloca %count x i64 : (i64) -> !llvm.ptr"]
    for i, v in enumerate(captured):
        if isinstance(v.type, ir.MemRefType):
            stores = [(f"%s{i}", _struct(v.type))]
            lines.append(f"%s{i} = builtin.unrealized_conversion_cast %v{i} : {v.type} to {_struct(v.type)}")
        elif isinstance(v.type, ir.ComplexType):
            stores = [(f"%f{i}_{k}", ty) for k, (ty, _) in enumerate(_slots(v.type))]
            lines += [f"%f{i}_{k} = complex.{part} %v{i} : {v.type}" for k, part in enumerate(("re", "im"))]
        elif isinstance(v.type, ir.IndexType):
            stores = [(f"%x{i}", "i64")]
            lines.append(f"%x{i} = arith.index_cast %v{i} : index to i64")
        else:
            stores = [(f"%v{i}", str(v.type))]
        for at, (value, ty) in enumerate(stores, slot):  # a descriptor's one store fills all its slots
            lines.append(f"%p{at} = llvm.getelementptr %buf[{at}] : (!llvm.ptr) -> !llvm.ptr, i64")
            lines.append(f"llvm.store {value}, %p{at} : {ty}, !llvm.ptr")
        slot += len(_slots(v.type))
    return lines


def trips(lines: list[str], dims: Bounds, stem: str, value: Callable[[int], str] = lambda i: f"%v{i}") -> str:
    """Appends the index arithmetic of the iterations of the loop dims `dims` (bounds by captured
    position, read as `value(position)`; `%zero` and `%one` defined) and returns their product."""
    total = "%one"
    for d, (lb, ub, step) in enumerate(dims):
        lines.append(f"%{stem}span{d} = arith.subi {value(ub)}, {value(lb)} : index")
        lines.append(f"%{stem}iters{d} = arith.ceildivsi %{stem}span{d}, {value(step)} : index")
        lines.append(f"%{stem}pos{d} = arith.maxsi %{stem}iters{d}, %zero : index")
        lines.append(f"%{stem}trips{d} = arith.muli {total}, %{stem}pos{d} : index")
        total = f"%{stem}trips{d}"
    return total


def _pack_text(name: str, par: str, captured: list[ir.Value], bounds: Bounds, inner: list[Bounds],
               library: ir.Operation | None, pooled: bool) -> str:
    """The host side: pack the captured values into slots and call the RAL. `bounds` are the
    loop's, `inner` those of the loops its body runs per iteration (for the work estimate);
    `library`: the library call the loop runs behind as its epilogue (its operands follow the
    captured values), or None; `pooled`: the loop runs on the thread pool whatever the estimate."""
    lines = pack_slots(captured)
    # iterations of the first dimension, and (unless `pooled`) an estimate of all scalar iterations:
    # the other dims times what the body's own loops run per iteration (at least 1)
    lines.append(f"%n = arith.maxsi {trips(lines, bounds[:1], 'first_')}, %zero : index")
    if pooled:
        lines.append(f"%work = arith.constant {POOLED_WORK} : index")
    else:
        per_row = "%zero"
        for i, dims in enumerate(inner):
            lines.append(f"%row{i} = arith.addi {per_row}, {trips(lines, dims, f'in{i}_')} : index")
            per_row = f"%row{i}"
        lines.append(f"%per_row = arith.maxsi {per_row}, %one : index")
        lines.append(f"%work = arith.muli {trips(lines, bounds, 'all_')}, %per_row : index")
    lines[:0] = ["%zero = arith.constant 0 : index", "%one = arith.constant 1 : index"]
    params = [f"%v{i}: {v.type}" for i, v in enumerate(captured)]
    callee, args, types = "disc_ral_parallel_for", [], []
    if library is not None:
        callee = f"{library_callee(library)}_epilogue"
        types = [str(v.type) for v in library.operands]
        args = [f"%g{i}" for i in range(len(types))]
        params += [f"{a}: {t}" for a, t in zip(args, types)]
    signature = ", ".join(types + ["!llvm.ptr", "!llvm.ptr", "i64", "i64"])
    lines += ["%n64 = arith.index_cast %n : index to i64", "%work64 = arith.index_cast %work : index to i64",
              f"%fp = func.call @{FNPTR_STEM}{par}() : () -> !llvm.ptr",
              f"func.call @{callee}({', '.join(args + ['%fp', '%buf', '%n64', '%work64'])}) : ({signature}) -> ()",
              "llvm.intr.stackrestore %sp : !llvm.ptr", "return"]
    return (f"func.func private @{FNPTR_STEM}{par}() -> !llvm.ptr\n"
            f"func.func private @{callee}({signature})\n"
            f"func.func private @{name}({', '.join(params)}) {{\n  " + "\n  ".join(lines) + "\n}")


def unpack_slots(captured: list[ir.Value], slots: list[str]) -> tuple[list[str], list[str]]:
    """Lines that rebuild the captured values from their slots' values (`slots`: one SSA name per
    slot, of the slot's type), and the rebuilt values' names."""
    lines, args, slot = [], [], 0
    for i, v in enumerate(captured):
        loaded = []
        for _, pos in _slots(v.type):
            loaded.append((slots[slot], pos))
            slot += 1
        if isinstance(v.type, ir.MemRefType):
            st, cur = _struct(v.type), f"%u{i}"
            lines.append(f"{cur} = llvm.mlir.undef : {st}")
            for k, (val, pos) in enumerate(loaded):
                lines.append(f"{cur}_{k} = llvm.insertvalue {val}, {cur if k == 0 else f'{cur}_{k - 1}'}[{', '.join(map(str, pos))}] : {st}")
            lines.append(f"%c{i} = builtin.unrealized_conversion_cast {cur}_{len(loaded) - 1} : {st} to {v.type}")
            args.append(f"%c{i}")
        elif isinstance(v.type, ir.IndexType):
            lines.append(f"%c{i} = arith.index_cast {loaded[0][0]} : i64 to index")
            args.append(f"%c{i}")
        elif isinstance(v.type, ir.ComplexType):
            lines.append(f"%c{i} = complex.create {loaded[0][0]}, {loaded[1][0]} : {v.type}")
            args.append(f"%c{i}")
        else:
            args.append(loaded[0][0])
    return lines, args


def slot_types(captured: list[ir.Value]) -> list[str]:
    return [ty for v in captured for ty, _ in _slots(v.type)]


def _unpack_text(par: str, body: str, captured: list[ir.Value], first: tuple[int, int, int]) -> str:
    """The worker side: rebuild the captured values from the slots, narrow the first dimension
    to iterations [lo, hi) and run the loop body."""
    lines, slots = [], slot_types(captured)
    for slot, ty in enumerate(slots):
        lines.append(f"%p{slot} = llvm.getelementptr %data[{slot}] : (!llvm.ptr) -> !llvm.ptr, i64")
        lines.append(f"%l{slot} = llvm.load %p{slot} : !llvm.ptr -> {ty}")
    rebuilt, args = unpack_slots(captured, [f"%l{i}" for i in range(len(slots))])
    lines += rebuilt
    lb, ub, step = (args[k] for k in first)
    lines += ["%lo_i = arith.index_cast %lo : i64 to index", "%hi_i = arith.index_cast %hi : i64 to index",
              f"%lo_off = arith.muli %lo_i, {step} : index", f"%hi_off = arith.muli %hi_i, {step} : index",
              f"%lb_new = arith.addi {lb}, %lo_off : index", f"%ub_far = arith.addi {lb}, %hi_off : index",
              f"%ub_new = arith.minsi %ub_far, {ub} : index"]
    types = ", ".join(["index", "index"] + [str(v.type) for v in captured])
    lines += [f"func.call @{body}(%lb_new, %ub_new, {', '.join(args)}) : ({types}) -> ()", "return"]
    return (f"func.func private @{body}({types})\n"
            f"func.func public @{par}(%data: !llvm.ptr, %lo: i64, %hi: i64) {{\n  " + "\n  ".join(lines) + "\n}")


def _move_into_function(op: ir.Operation, name: str, captured: list[ir.Value], module: ir.Module) -> ir.Operation:
    """Moves `op` into a new private function `name(lb0, ub0, captured...)` whose first two
    arguments replace the loop's first-dimension bounds; returns the function."""
    index = ir.IndexType.get()
    func, block = new_private_function(module, name, [index, index] + [v.type for v in captured], [])
    block.append(op)
    with ir.InsertionPoint(block), op.location:
        ir.Operation.create("func.return")
    dims = len(op.regions[0].blocks[0].arguments)
    op.operands[0] = block.arguments[0]
    op.operands[dims] = block.arguments[1]
    # constants are rebuilt in the kernel below: LLVM must see constant steps and bounds to vectorise
    replace = {v: arg for v, arg in zip(captured, list(block.arguments)[2:])
               if isinstance(v.owner, ir.Block) or operation(v.owner).name != "arith.constant"}
    for inner in walk(op):  # the kernel's own ops: a captured value's other uses may be everywhere
        for i, v in enumerate(inner.operands):
            if v in replace:
                inner.operands[i] = replace[v]
    clone_captured_constants(func, block)
    return func


# bookkeeping inside a kernel that says nothing about what it computes
_PLUMBING = ("memref.", "scf.", "arith.constant", "arith.index_cast", "llvm.", "builtin.", "affine.")


def _host_facts(values: list[ir.Value]) -> list[str]:
    """Facts the host computation of a kernel's index arguments (bounds, sizes) relies on: each
    op of that index arithmetic visited once."""
    found: list[str] = []
    seen: set[ir.Value] = set()
    todo = [v for v in values if isinstance(v.type, ir.IndexType)]
    while todo:
        v = todo.pop()
        if isinstance(v.owner, ir.Block) or v in seen:
            continue
        seen.add(v)
        op = operation(v.owner)
        found += facts_relied_on(op)
        todo += [x for x in op.operands if isinstance(x.type, ir.IndexType)]
    return found


def _describe(op: ir.Operation, captured: list[ir.Value], library: ir.Operation | None) -> Kernel:
    """What the loop `op` computes (its kernel's name is filled in once it is outlined)."""
    inner = list(walk(op))[1:]
    ops = tuple(dict.fromkeys(o.name for o in inner if not o.name.startswith(_PLUMBING)
                              and not all(isinstance(r.type, ir.IndexType) for r in o.results)))  # index math
    if FUSED_ATTR in op.attributes:
        kind = f"{ir.StringAttr(op.attributes[FUSED_ATTR]).value} fusion"
    elif any(o.name == "scf.for" for o in inner):
        kind = "reduction"
    elif ops:
        kind = "elementwise"
    else:
        kind = "copy" if any(o.name == "memref.load" for o in inner) else "fill"
    version = ir.StringAttr(op.attributes[VERSION_ATTR]).value if VERSION_ATTR in op.attributes else ""
    facts = [f for o in [op] + inner for f in facts_relied_on(o)] + _host_facts(captured)
    return Kernel("", kind, len(op.regions[0].blocks[0].arguments), ops, version, tuple(dict.fromkeys(facts)),
                  library_callee(library) if library is not None else "")


def _body_loops(op: ir.Operation) -> list[ir.Operation]:
    """The loops directly in `op`'s body (not inside another loop of it)."""
    found = []
    for inner in list(walk(op))[1:]:
        if inner.name in ("scf.for", "scf.parallel"):
            node = inner.parent
            while node is not None and node != op and node.name not in ("scf.for", "scf.parallel"):
                node = node.parent
            if node == op:
                found.append(inner)
    return found


def outermost_parallel_loops(module: ir.Module) -> list[ir.Operation]:
    """The scf.parallel nests (without reductions) of the module's functions not inside another."""
    funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    return [op for f in funcs for op in walk(f)
            if op.name == "scf.parallel" and not op.results and not nested_in(op, "scf.parallel")]


def outline_parallel_loops(module: ir.Module) -> list[Kernel]:
    """Outlines every outermost scf.parallel (without reductions) of the module's functions;
    returns what each outlined kernel is."""
    state = LoweringState(module)
    kernels = []
    # one kernel per distinct loop: a loop identical to an earlier one (the same body over
    # captured values of the same types, as the query, key and value bias adds of an attention
    # layer, or every layer of a stack) reuses its code, generated and compiled once
    outlined: dict[str, str] = {}
    pairs = epilogues(module)
    for op in outermost_parallel_loops(module):
        _sink_views(op)
        captured = _captured(op)
        if captured is None:
            continue
        bounds = [tuple(_find(captured, v) for v in bound) for bound in loop_bounds(op)]
        body, pack = state.fresh_symbol("par_body"), state.fresh_symbol("par_pack")
        inner = [[tuple(_find(captured, v) for v in bound) for bound in loop_bounds(loop)]
                 for loop in _body_loops(op) if all(v in captured for bound in loop_bounds(loop) for v in bound)]
        library = call_of(op, pairs)  # the epilogue's pack call makes the library call, at the loop's place
        if library is not None:
            del op.attributes[EPILOGUE_ATTR]  # found: the id would set apart loops that are the same
        kernel = _describe(op, captured, library)
        pooled = POOL_ATTR in op.attributes
        with ir.InsertionPoint(op), op.location:
            ir.Operation.create("func.call", operands=captured + (list(library.operands) if library else []),
                                attributes={"callee": ir.FlatSymbolRefAttr.get(pack)})
        func = _move_into_function(op, body, captured, module)
        code = func.get_asm(enable_debug_info=False, use_local_scope=True, assume_verified=True).replace(f"@{body}(", "(", 1)
        code += repr(bounds[0])
        par = outlined.get(code)
        if par is None:
            par = outlined[code] = state.fresh_symbol("par")
            state.declared.add(body)
            state.add_function(_unpack_text(par, body, captured, bounds[0]))
        else:  # the loop first, so that its Python object is not left pointing into the erased function
            op.erase()
            func.erase()
        kernels.append(dataclasses.replace(kernel, name=par))
        state.add_function(_pack_text(pack, par, captured, bounds, inner, library, pooled))
        if library is not None:
            library.erase()
    return kernels


def resolve_function_pointers(module: ir.Module) -> None:
    """After the lowering to LLVM: each `call @__disc_fnptr_X()` becomes the address of X."""
    ptr = ir.Type.parse(PTR)
    for op in walk(module.operation):
        if op.name == "llvm.call" and "callee" in op.attributes:
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee.startswith(FNPTR_STEM):
                with ir.InsertionPoint(op), op.location:
                    addr = ir.Operation.create("llvm.mlir.addressof", results=[ptr], attributes={
                        "global_name": ir.FlatSymbolRefAttr.get(callee.removeprefix(FNPTR_STEM))})
                op.results[0].replace_all_uses_with(addr.result)
                op.erase()
    for op in list(module.body.operations):
        if op.operation.name == "llvm.func" and ir.StringAttr(op.attributes["sym_name"]).value.startswith(FNPTR_STEM):
            op.operation.erase()
