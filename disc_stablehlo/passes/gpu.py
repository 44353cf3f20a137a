"""GPU kernels from the parallel loops, and host code that launches them through the RAL.

Each outermost `scf.parallel` nest becomes a kernel of the device module (`gpu.module
@disc_kernels`): one thread per CHUNK iterations of its innermost dim (LANES apart, so that a
warp's accesses are consecutive elements), all dims flattened (the innermost varies fastest),
in a grid-stride loop; what the body loops over itself (a reduction's inner dims) runs in the
thread. A body that works on rows along contiguous memory (reductions, softmax and layer norm
fused into one loop) runs one block of threads per row instead, or on CUDA, with many rows, one
warp per row (`_cooperative_rows`; the host code picks the version); a body whose reductions run
across rows runs a block per tile of LANES iterations, its warps sharing the rows
(`_cooperative_columns`). The host
packs the loop's captured values into 8-byte slots as for the CPU thread pool
(`parallel.pack_slots`): each slot is one kernel parameter, and `disc_ral_gpu_launch` passes
them by address. The number of threads is computed by the host from the run-time bounds; the
RAL picks the grid from it.

The host code keeps shape arithmetic and control flow. Memory it touches is device memory: its
allocations come from the RAL's device allocator, constants the kernels read are copied to the
device once (`disc_ral_gpu_constant`), and scalar reads or writes of tensors (a dynamic slice's
start index, a loop's condition) are copies through the RAL (`disc_ral_gpu_read/write`)."""

from __future__ import annotations

import dataclasses
import math

from torch_mlir import ir
from torch_mlir._mlir_libs._mlirDialectsLLVM import translate_module_to_llvmir

from ..artifact import Kernel
from ..errors import CompileError, UnsupportedOpError
from ..mlir_support import clone_ops, create_value, defined_outside, describe, index_constant, int_constant, nested_in, new_private_function, operation, run_pipeline, verify, walk
from .buffers import element_bytes
from .loops import VIEWS, _new_loop, loop_bounds
from .lower import LoweringState, clone_captured_constants
from .math_ops import contract_float_arithmetic
from .parallel import (Bounds, _captured, _describe, _find, _sink_views, outermost_parallel_loops, pack_slots, slot_types,
                       trips, unpack_slots)

DEVICE_MODULE = "disc_kernels"
BLOCK = 256  # threads per block
# accessors of the device code the host object embeds (defined with it, `targets/cuda.py`)
IMAGE, IMAGE_SIZE, PTX = "__disc_gpu_image", "__disc_gpu_image_size", "__disc_gpu_ptx"
LAUNCH_SIGNATURE = "!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, i64"


def outline_gpu_kernels(module: ir.Module, warps: bool) -> tuple[list[Kernel], ir.Module]:
    """Moves every outermost parallel loop of the module's functions into a kernel of a new
    device module (`gpu.module @disc_kernels` with the kernels and their bodies) and launches it
    from where it was; returns what each kernel is and the device module. `warps`: rows also get
    a version that runs a warp per row (CUDA)."""
    _one_thread(module)
    state = LoweringState(module)
    kernels: list[Kernel] = []
    device: list[str] = []
    outlined: dict[str, str] = {}  # a loop the same as an earlier one reuses its kernel
    for op in outermost_parallel_loops(module):
        one_thread = ONE_THREAD in op.attributes
        _hoist_globals(op)
        _sink_views(op)
        captured = _captured(op)
        if captured is None:
            raise UnsupportedOpError(f"a loop captures a value GPU kernels cannot take as a parameter (a vector "
                                     f"scalar): {describe(op)}")
        if any(isinstance(v.type, ir.MemRefType) and _host_memory(v) for v in captured):
            raise CompileError(f"a GPU kernel would access the host's memory (a compiler bug): {describe(op)}")
        bounds = [tuple(_find(captured, v) for v in bound) for bound in loop_bounds(op)]
        kernel = _describe(op, captured, None)
        body, launch = state.fresh_symbol("gpu_body"), state.fresh_symbol("gpu_launch")
        with ir.InsertionPoint(op), op.location:
            ir.Operation.create("func.call", operands=captured, attributes={"callee": ir.FlatSymbolRefAttr.get(launch)})
        func = _body_function(op, body, captured, module)
        # (schedule, body function): a row's work shared by a block, and, on CUDA, by a warp
        # (chosen at run time from the rows: WARP_ROWS); columns' reductions shared by a block's
        # row groups; else a thread per CHUNK iterations
        bodies = [("element", 0, func)]  # (schedule, elements a thread holds in registers (0: none), body)
        extent = None
        if _row_phases(func) is not None:
            _forward_stored_values(func)
            while _recompute_read_back(func):
                pass
            extent = _host_row_extent(func, len(bounds)) if _fits_in_registers(_row_phases(func)) else None
            bodies = [(schedule, count, func) for schedule in ("block", "warp")[:1 + warps] for count in _register_counts(schedule, extent)]
            bodies = [(schedule, count, f if i == 0 else _renamed_clone(f, state)) for i, (schedule, count, f) in enumerate(bodies)]
            for schedule, count, f in bodies:
                phases = _row_phases(f)
                _cooperative_rows(f, phases, schedule)
                if count:
                    _rows_in_registers(f, phases, schedule, count)
        elif _column_phases(func) is not None:
            _forward_stored_values(func)
            bodies = [("column", 0, func)]
            _cooperative_columns(func, _column_phases(func))
        codes = [f.get_asm(enable_debug_info=False, use_local_scope=True, assume_verified=True) for _, _, f in bodies]
        symbols = [ir.StringAttr(f.attributes["sym_name"]).value for _, _, f in bodies]
        key = "".join(c.replace(f"@{n}(", "(", 1) for c, n in zip(codes, symbols)) + repr(bounds)
        names = outlined.get(key)
        if names is None:
            names = outlined[key] = [state.fresh_symbol("gpu") for _ in bodies]
            for name, code, symbol, (schedule, _, f) in zip(names, codes, symbols, bodies):
                device += [code, _kernel_text(name, symbol, f, captured, bounds, schedule)]
        for _, _, f in bodies:
            f.erase()
        for name, (schedule, count, _) in zip(names, bodies):
            version = _VERSIONS.get(schedule, "one thread" if one_thread else "") + (f", {count} a thread in registers" if count else "")
            kernels.append(dataclasses.replace(kernel, name=name, version=version))
        state.add_function(_launch_text(launch, [(name, schedule, count) for name, (schedule, count, _) in zip(names, bodies)],
                                        captured, bounds, extent))
    text = f"module attributes {{gpu.container_module}} {{\ngpu.module @{DEVICE_MODULE} {{\n" + "\n".join(device) + "\n}\n}"
    return kernels, ir.Module.parse(text)


def _hoist_globals(op: ir.Operation) -> None:
    """Constants the loop reads from a global become values it captures (the host passes the
    device copy)."""
    for inner in list(walk(op)):
        if inner.name == "memref.get_global":
            inner.move_before(op)


def _body_function(op: ir.Operation, name: str, captured: list[ir.Value], module: ir.Module) -> ir.Operation:
    """Moves one iteration of the loop `op` into a new private function `name(iv..., captured...)`."""
    index = ir.IndexType.get()
    body = op.regions[0].blocks[0]
    dims = len(body.arguments)
    func, block = new_private_function(module, name, [index] * dims + [v.type for v in captured], [])
    block.append(op)
    replace = {v: arg for v, arg in zip(captured, list(block.arguments)[dims:])
               if isinstance(v.owner, ir.Block) or operation(v.owner).name != "arith.constant"}
    for inner in walk(op):
        for i, v in enumerate(inner.operands):
            if v in replace:
                inner.operands[i] = replace[v]
    for iv, arg in zip(body.arguments, block.arguments):
        iv.replace_all_uses_with(arg)
    for inner in list(body.operations)[:-1]:  # all but the terminator
        inner.move_before(op)
    op.erase()
    with ir.InsertionPoint(block), ir.Location.unknown():
        ir.Operation.create("func.return")
    clone_captured_constants(func, block)
    return func


def _kernel_text(name: str, body: str, func: ir.Operation, captured: list[ir.Value], bounds: Bounds, schedule: str) -> str:
    """The kernel: rebuild the captured values from the parameters, and run the body `func`
    (named `body`) for each flattened iteration of the grid-stride loop, as `schedule` says: a
    thread per CHUNK iterations ("element"); an iteration per block or warp ("block", "warp": the
    body's reductions are a row's, cooperative); or, for a tile of LANES iterations per block
    (the body's reductions are columns'), an iteration per lane with a row group per warp
    ("column": the body takes the block's shared buffers after the captured values)."""
    types = slot_types(captured)
    lines, args = unpack_slots(captured, [f"%a{i}" for i in range(len(types))])
    constants = {i: int_constant(v) for i, v in enumerate(captured) if isinstance(v.type, ir.IndexType)}
    for i, c in constants.items():
        if c is not None:  # constant bounds stay constants
            lines.append(f"%k{i} = arith.constant {c} : index")
            args[i] = f"%k{i}"
    lines += ["%zero = arith.constant 0 : index", "%one = arith.constant 1 : index", "%tid = gpu.thread_id x",
              "%bid = gpu.block_id x", "%bdim = gpu.block_dim x", "%gdim = gpu.grid_dim x"]
    lines += ["%first = arith.muli %bid, %bdim : index", "%flat = arith.addi %first, %tid : index", "%all = arith.muli %gdim, %bdim : index"]
    if schedule in ("block", "warp"):  # the threads of a row (a block's, or a warp's) run the same iteration
        lines += [f"%row_threads = arith.constant {_THREADS[schedule][0]} : index", "%start = arith.divui %flat, %row_threads : index",
                  "%stride = arith.divui %all, %row_threads : index"]
    elif schedule == "column":  # a block's iterations: a tile; a lane's: its place in the tile (below)
        lines += ["%start = arith.addi %bid, %zero : index", "%stride = arith.addi %gdim, %zero : index"]
    else:
        lines += ["%start = arith.addi %flat, %zero : index", "%stride = arith.addi %all, %zero : index"]
    total = _work_items(lines, bounds, schedule, lambda i: args[i])
    if schedule == "column":
        lines.append("%column = arith.remui %tid, %c_lanes : index")
    shared = [str(t) for t in ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).inputs[len(bounds) + len(captured):]]
    signature = ", ".join(["index"] * len(bounds) + [str(v.type) for v in captured] + shared)
    extra = [f"%wg{i}" for i in range(len(shared))]
    last = len(bounds) - 1
    sizes = [f"%all_pos{d}" for d in range(last)] + ["%chunks" if schedule == "element" else f"%all_pos{last}"]

    def loop(t: str, stem: str) -> list[str]:
        """The grid-stride loop with its index arithmetic in `t` (i32 or index): the dims of a
        flattened iteration are divisions, which cost several times more in 64 bits."""
        cast = (lambda v, to: f"arith.index_castui {v} : index to {to}") if t == "i32" else (lambda v, to: f"arith.addi {v}, %zero : index")
        out = [f"%{stem}start = {cast('%start', t)}", f"%{stem}stride = {cast('%stride', t)}", f"%{stem}total = {cast(total, t)}"]
        out += [f"%{stem}pos{d} = {cast(sizes[d], t)}" for d in range(1, len(bounds))]
        if schedule == "element":
            out.append(f"%{stem}lanes = {cast('%lanes', t)}")
        out.append(f"scf.for %{stem}i = %{stem}start to %{stem}total step %{stem}stride : {t} {{")
        rest, ivs = f"%{stem}i", []
        if schedule == "column":  # the lane's iteration; past the last, the last again (the same values stored twice)
            out += [f"%{stem}lanes = {cast('%c_lanes', t)}", f"%{stem}column = {cast('%column', t)}", f"%{stem}items = {cast('%all_trips' + str(last), t)}",
                    f"%{stem}tile = arith.muli {rest}, %{stem}lanes : {t}", f"%{stem}item = arith.addi %{stem}tile, %{stem}column : {t}",
                    f"%{stem}one = {cast('%one', t)}", f"%{stem}final = arith.subi %{stem}items, %{stem}one : {t}",
                    f"%{stem}clamped = arith.minui %{stem}item, %{stem}final : {t}"]
            rest = f"%{stem}clamped"
        for d in reversed(range(len(bounds))):
            lb, _, step = (args[k] for k in bounds[d])
            idx = rest
            if d > 0:
                out += [f"%{stem}idx{d} = arith.remui {rest}, %{stem}pos{d} : {t}", f"%{stem}rest{d} = arith.divui {rest}, %{stem}pos{d} : {t}"]
                idx, rest = f"%{stem}idx{d}", f"%{stem}rest{d}"
            if d == last and schedule == "element":  # a lane of a tile of the innermost dim: its elements below
                out += [f"%{stem}tat = arith.divui {idx}, %{stem}lanes : {t}", f"%{stem}tlane = arith.remui {idx}, %{stem}lanes : {t}"]
                at, lane = f"%{stem}tat", f"%{stem}tlane"
                if t == "i32":
                    out += [f"%{stem}at = arith.index_castui {at} : i32 to index", f"%{stem}lane = arith.index_castui {lane} : i32 to index"]
                    at, lane = f"%{stem}at", f"%{stem}lane"
                out += [f"%{stem}tile = arith.muli {at}, %span : index", f"%{stem}first = arith.addi %{stem}tile, {lane} : index"]
                continue
            if t == "i32":
                out.append(f"%{stem}x{d} = arith.index_castui {idx} : i32 to index")
                idx = f"%{stem}x{d}"
            out += [f"%{stem}off{d} = arith.muli {idx}, {step} : index", f"%{stem}iv{d} = arith.addi {lb}, %{stem}off{d} : index"]
            ivs.insert(0, f"%{stem}iv{d}")
        def call(innermost: list[str]) -> str:
            return f"func.call @{body}({', '.join(ivs + innermost + args + extra)}) : ({signature}) -> ()"

        if schedule != "element":
            return out + ["  " + call([]), "}"]
        lb, _, step = (args[k] for k in bounds[last])
        for k in range(CHUNK):  # the chunk's elements: the other dims' index arithmetic is shared
            out += [f"%{stem}e{k} = arith.addi %{stem}first, %chunk_at{k} : index", f"%{stem}in{k} = arith.cmpi ult, %{stem}e{k}, %all_pos{last} : index",
                    f"scf.if %{stem}in{k} {{", f"%{stem}o{k} = arith.muli %{stem}e{k}, {step} : index",
                    f"%{stem}last{k} = arith.addi {lb}, %{stem}o{k} : index", call([f"%{stem}last{k}"]), "}"]
        return out + ["}"]

    # the iterations' count decides (the same in every thread): 32-bit index arithmetic below 2^31
    if schedule == "element":  # the elements of a lane: `%lanes` apart
        for k in range(CHUNK):
            lines += [f"%chunk_k{k} = arith.constant {k} : index", f"%chunk_at{k} = arith.muli %lanes, %chunk_k{k} : index"]
    if schedule == "column":  # the tile's last lane's iteration
        lines.append(f"%reach = arith.addi %all_trips{last}, %c_lanes : index")
    lines += [f"%limit = arith.constant {2**31 - 1} : index", f"%fits = arith.cmpi ule, {'%reach' if schedule == 'column' else total}, %limit : index",
              "scf.if %fits {", *loop("i32", "n"), "} else {", *loop("index", "w"), "}", "gpu.return"]
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(types))
    workgroup = f" workgroup({', '.join(f'%wg{i} : {t}' for i, t in enumerate(shared))})" if shared else ""
    # the block size every launch has (`_launch_text`): ptxas keeps to the registers that many threads may have
    size = f"known_block_size = array<i32: {_THREADS[schedule][1]}, 1, 1>"
    return f"gpu.func @{name}({params}){workgroup} kernel attributes {{{size}}} {{\n  " + "\n  ".join(lines) + "\n}"


# a row's reduction: a block of REDUCTION_BLOCK threads per row, or (CUDA, WARP_ROWS rows or
# more) a warp per row, BLOCK // WARP rows a block (fewer rows a warp each leave most of the GPU
# idle: H200, a layer norm of (1024, 768) 10.4 us a warp per row, 5.1 us a block per row)
REDUCTION_BLOCK, WARP, WARP_ROWS = 128, 32, 4096
# columns' reductions: a block per tile of LANES columns, its COLUMN_GROUPS warps each taking every
# COLUMN_GROUPS-th row, their parts combined through shared memory
COLUMN_GROUPS = 32
_VERSIONS = {"block": "block per row", "warp": "warp per row", "column": "column tiles"}
# a per-element kernel: the innermost dim in tiles of up to LANES x CHUNK elements, a thread per
# lane taking CHUNK elements LANES apart (a warp's loads and stores are consecutive elements)
CHUNK, LANES = 4, 32
# each schedule's threads per work item (an iteration, or a tile for "column") and per block
_THREADS = {"element": (1, BLOCK), "block": (REDUCTION_BLOCK, REDUCTION_BLOCK), "warp": (WARP, BLOCK),
            "column": (LANES * COLUMN_GROUPS, LANES * COLUMN_GROUPS)}


def _work_items(lines: list[str], bounds: Bounds, schedule: str, value=lambda i: f"%v{i}") -> str:
    """Appends the index arithmetic of the loop's work items (`%zero`, `%one` defined; `value`
    names the captured value at a position) and returns their count (`schedule`: see
    `_kernel_text`): its iterations (a row each), its tiles of LANES iterations ("column"), or a
    lane per CHUNK iterations of the innermost dim ("element": its tiles of `%span` = `%lanes` x
    CHUNK iterations, `%lanes` = LANES or fewer where the dim is narrower)."""
    total = trips(lines, bounds, "all_", value)
    if schedule in ("block", "warp"):
        return total
    lines.append(f"%c_lanes = arith.constant {LANES} : index")
    if schedule == "column":
        lines.append(f"%tiles = arith.ceildivui {total}, %c_lanes : index")
        return "%tiles"
    last = len(bounds) - 1
    lines += [f"%c_chunk = arith.constant {CHUNK} : index",
              f"%per_lane = arith.ceildivui %all_pos{last}, %c_chunk : index", "%fewer = arith.minui %per_lane, %c_lanes : index",
              # at least one: an empty innermost dim has no tiles (the division by %span would trap on the host)
              "%lanes = arith.maxui %fewer, %one : index",
              "%span = arith.muli %lanes, %c_chunk : index", f"%tiles = arith.ceildivui %all_pos{last}, %span : index",
              "%chunks = arith.muli %tiles, %lanes : index",
              f"%items = arith.muli {f'%all_trips{last - 1}' if last else '%one'}, %chunks : index"]
    return "%items"


# a reduction's combining op -> gpu.all_reduce's name for it, and its identity ("lowest",
# "highest": of the type)
_COMBINERS = {"arith.addf": ("add", 0.0), "arith.mulf": ("mul", 1.0), "arith.maximumf": ("maximumf", "lowest"),
              "arith.minimumf": ("minimumf", "highest"), "arith.addi": ("add", 0), "arith.muli": ("mul", 1),
              "arith.maxsi": ("maxsi", "lowest"), "arith.minsi": ("minsi", "highest"), "arith.andi": ("and", -1),
              "arith.ori": ("or", 0), "arith.xori": ("xor", 0)}
# ops a cooperative body may hold besides its reductions (all threads of the block run them alike)
_UNIFORM = ("arith.", "math.", "memref.load", "memref.dim", "memref.extract_strided_metadata", "affine.apply", *VIEWS)


def _contiguous(loop: ir.Operation) -> bool:
    """Whether the loop's iterations access memory along the last dim of some buffer."""
    iv = loop.regions[0].blocks[0].arguments[0]
    return any(o.name in ("memref.load", "memref.store") and o.operands[len(o.operands) - 1] == iv
               and len(o.operands) > (2 if o.name == "memref.store" else 1) for o in walk(loop))


def _nested(loop: ir.Operation, names: tuple[str, ...]) -> bool:
    return any(o.name in names for o in list(walk(loop))[1:])


def _reduction(loop: ir.Operation) -> ir.Operation | None:
    """The combining op of an scf.for that folds one value (f32 or i32) and writes nothing, or None."""
    if loop.name != "scf.for" or len(loop.results) != 1 or str(loop.results[0].type) not in ("f32", "i32"):
        return None
    body = loop.regions[0].blocks[0]
    acc = body.arguments[1]
    yielded = body.operations[len(body.operations) - 1].operands[0]
    if isinstance(yielded.owner, ir.Block) or _nested(loop, ("memref.store", "scf.for", "scf.parallel", "scf.while", "func.call")):
        return None
    combine = operation(yielded.owner)
    uses = list(acc.uses)
    if combine.name not in _COMBINERS or len(uses) != 1 or operation(uses[0].owner) != combine:
        return None
    return combine


def _row_loop(loop: ir.Operation) -> bool:
    """A loop over a row's elements without a result (an scf.for, or a one-dim scf.parallel)
    along contiguous memory, with no loop or call inside, whose iterations the row's threads may
    take in any order: an scf.for's iterations must not read or write what another iteration
    writes (a scan, `out[i] = out[i - 1] + x[i]`, runs in one thread)."""
    if loop.name not in ("scf.for", "scf.parallel") or loop.results or len(loop.regions[0].blocks[0].arguments) != 1:
        return False
    if _nested(loop, ("scf.for", "scf.parallel", "scf.while", "scf.if", "func.call")) or not _contiguous(loop):
        return False
    return loop.name == "scf.parallel" or _own_elements(loop)


def _own_elements(loop: ir.Operation) -> bool:
    """Whether each iteration of `loop` accesses a buffer it writes only at the element it
    stores to (the same memref and the same index values: its own), so no iteration touches
    another's (buffers of unknown origin may be any)."""
    accesses = _accesses(loop)
    stores = [a for a in accesses if a[3]]
    return all(m == sm and len(ix) == len(six) and all(x == y for x, y in zip(ix, six))
               for b, m, ix, _ in accesses for sb, sm, six, _ in stores if b is None or sb is None or b == sb)


Phases = list[tuple[ir.Operation, str, "ir.Operation | None"]]


def _phases(func: ir.Operation, contiguous: bool) -> Phases | None:
    """Each op of the body with its kind: a reduction (with its combining op) along contiguous
    memory (`contiguous`) or not; a loop over a row's elements (`contiguous` only); a store; an
    op all threads run alike. None where the body is not made of these, or has no reduction or
    loop."""
    ops = [o.operation for o in func.regions[0].blocks[0].operations][:-1]  # without the return
    combines = [c if (c := _reduction(o)) is not None and _contiguous(o) == contiguous else None for o in ops]
    kinds = ["reduce" if combine is not None else "loop" if contiguous and _row_loop(o) else "store" if o.name == "memref.store"
             else "uniform" if o.name.startswith(_UNIFORM) else None for o, combine in zip(ops, combines)]
    if None in kinds or not {"reduce", "loop"} & set(kinds):
        return None
    return list(zip(ops, kinds, combines))


def _row_phases(func: ir.Operation) -> Phases | None:
    """The phases of a body that works on one row (one iteration of the kernel's loop) along
    contiguous memory (a softmax or a layer norm fused into one loop), or None (the body then
    runs otherwise)."""
    return _phases(func, contiguous=True)


def _column_phases(func: ir.Operation) -> Phases | None:
    """The phases of a body whose reductions run across rows (an iteration: a column's sums), or None."""
    return _phases(func, contiguous=False)


def _cooperative_rows(func: ir.Operation, phases: Phases, schedule: str) -> None:
    """Rewrites a row's body (its `phases`) so that a block's or a warp's threads (`schedule`) run
    it: each takes a strided part of each loop; the parts of a reduction are combined by
    `gpu.all_reduce` (a block: shuffles and shared memory) or by shuffles alone (a warp); one
    thread stores the row's values; and a barrier (a warp's: `__syncwarp`) ends each phase that
    writes what a later phase's threads may access otherwise (`_needs_barrier`)."""
    threads = _THREADS[schedule][0]
    block = func.regions[0].blocks[0]
    index, i1 = ir.IndexType.get(), ir.IntegerType.get_signless(1)
    with ir.InsertionPoint.at_block_begin(block), ir.Location.unknown():
        tid = create_value("gpu.thread_id", [], index, dimension=ir.Attribute.parse("#gpu<dim x>"))
        width = index_constant(threads)
        lane = create_value("arith.remui", [tid, width], index)
        zero = index_constant(0)
        first = create_value("arith.cmpi", [lane, zero], i1, predicate=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0))
    ret = block.operations[len(block.operations) - 1]
    barriers = [_needs_barrier(phases, i) for i in range(len(phases))]
    for i, (o, kind, combine) in enumerate(phases):
        after = phases[i + 1][0] if i + 1 < len(phases) else ret
        if kind in ("reduce", "loop"):  # each thread: iterations lane, lane + threads, ...
            n = 1 if o.name == "scf.for" else len(o.regions[0].blocks[0].arguments)
            with ir.InsertionPoint(o), o.location:
                lb, step = o.operands[0], o.operands[2 * n]
                o.operands[0] = create_value("arith.addi", [lb, create_value("arith.muli", [lane, step], index)], index)
                o.operands[2 * n] = create_value("arith.muli", [step, width], index)
        if kind == "reduce":
            name, identity = _COMBINERS[combine.name]
            t, init = o.results[0].type, o.operands[3]
            with ir.InsertionPoint(o), o.location:
                o.operands[3] = _constant(t, identity)
            uses = [(u.owner, u.operand_number) for u in o.results[0].uses]
            with ir.InsertionPoint(after), o.location:
                if threads == WARP:
                    total = _warp_reduce(o.results[0], combine.name)
                else:
                    total = ir.Operation.create("gpu.all_reduce", results=[t], operands=[o.results[0]], regions=1, attributes={
                        "op": ir.Attribute.parse(f"#gpu<all_reduce_op {name}>"), "uniform": ir.UnitAttr.get()}).result
                final = create_value(combine.name, [init, total], t)
            for owner, k in uses:
                owner.operands[k] = final
        elif kind == "store":  # one thread stores the row's value
            with ir.InsertionPoint(o), o.location:
                only = ir.Operation.create("scf.if", operands=[first], regions=2)
                then = only.regions[0].blocks.append()
            then.append(o)
            with ir.InsertionPoint(then), ir.Location.unknown():
                ir.Operation.create("scf.yield")
        if barriers[i]:
            with ir.InsertionPoint(after), ir.Location.unknown():
                if threads == WARP:  # CUDA's __syncwarp (a warp's lanes, its memory ordered)
                    i32 = ir.IntegerType.get_signless(32)
                    ir.Operation.create("nvvm.bar.warp.sync", operands=[create_value("arith.constant", [], i32, value=ir.IntegerAttr.get(i32, -1))])
                else:
                    ir.Operation.create("gpu.barrier")


# a row of at most this many iterations a thread is held in registers (`_rows_in_registers`):
# the host code launches the kernel of the fewest that fit the row (each kernel keeps to the
# registers its own count needs), the loops' kernel for longer rows: a warp's 32 threads up to 256
# elements, a block's 128 up to 1024: the counts measured to win, as each costs a kernel's
# compilation (the encoder layer's for CUDA: 1.18 -> 1.55 s). H200
# (benchmarks/gpu/fusion_h200_s38_counts.log): a softmax's rows of 128 and 256 8.9 -> 6.8 us and
# 47.3 -> 44.9 us, a layer norm of 1024 rows of 768 4.9 -> 4.0 us; 16 or 24 a thread were slower
# but for a layer norm with one result (a softmax's rows of 512: 321 -> 468 us with 16, 783 us
# with 24; a layer norm that also stores its residual sum 285 -> 473 us with 24; one with a
# single result 196 -> 147 us)
REGISTER_ITERATIONS = {"warp": (4, 8), "block": (8,)}

Extent = tuple  # a row loop's (start, end, step) as the host code has them: "%v<captured>" or an int


def _renamed_clone(func: ir.Operation, state: LoweringState) -> ir.Operation:
    clone = func.clone(ip=ir.InsertionPoint(func))
    clone.attributes["sym_name"] = ir.StringAttr.get(state.fresh_symbol("gpu_body"))
    return clone


def _host_row_extent(func: ir.Operation, iterations: int) -> Extent | None:
    """The bounds of a row body's loops as the launch code has them (a captured value, after the
    body's `iterations` loop indices, or a constant), or None where the body computes one."""
    loop = next(o for o, kind, _ in _row_phases(func) if kind in ("reduce", "loop"))
    found = []
    for v in list(loop.operands)[:3]:
        if isinstance(v, ir.BlockArgument) and v.owner == func.regions[0].blocks[0] and v.arg_number >= iterations:
            found.append(f"%v{v.arg_number - iterations}")
        elif int_constant(v) is not None:
            found.append(int_constant(v))
        else:
            return None
    return tuple(found)


def _register_counts(schedule: str, extent: Extent | None) -> list[int]:
    """The versions of a row kernel (elements a thread holds in registers; 0: the loops'): where
    the row's length is a constant, the one version it needs; else the loops' and one per count."""
    if extent is None:
        return [0]
    threads = _THREADS[schedule][0]
    if all(isinstance(x, int) for x in extent):
        start, end, step = extent
        return [next((c for c in REGISTER_ITERATIONS[schedule] if max(end - start, 0) <= c * threads * step), 0)]
    return [0, *REGISTER_ITERATIONS[schedule]]


def _fits_in_registers(phases: Phases) -> bool:
    """Whether a row's body (its phases, before `_cooperative_rows`) may also run from registers:
    it has several loops (what one loads or stores, a later one uses), they all take the same
    iterations and load numbers, and no phase needs a barrier (each thread touches only its own
    elements of what the row writes)."""
    loops = [o for o, kind, _ in phases if kind in ("reduce", "loop")]
    loaded = [o.results[0].type for loop in loops for o in walk(loop) if o.name == "memref.load"]
    return (len(loops) > 1 and all(isinstance(t, (ir.FloatType, ir.IntegerType)) for t in loaded)
            and all(_same_iterations(loops[0], o) for o in loops[1:])
            and not any(_needs_barrier(phases, i) for i in range(len(phases))))


def _rows_in_registers(func: ir.Operation, phases: Phases, schedule: str, count: int) -> None:
    """A cooperative row's body (after `_cooperative_rows`) for rows of at most `count` iterations
    a thread (the host code launches it only for those): each loop unrolled to `count`
    iterations (past the row's end: loads give 0 and their results are unused, reductions select
    their identity, stores are skipped), so the elements a thread loads or stores stay in
    registers from one phase to the next (a layer norm reads its inputs once, not once a phase;
    a softmax its scores, and writes its result once)."""
    block = func.regions[0].blocks[0]
    first = next(o for o, kind, _ in phases if kind in ("reduce", "loop"))
    start, end, stride = first.operands[0], first.operands[1], first.operands[2]  # this thread's: offset by its lane
    index, i1 = ir.IndexType.get(), ir.IntegerType.get_signless(1)
    slt = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 2)
    with ir.InsertionPoint(first), ir.Location.unknown():
        items = []  # this thread's iterations: (whether in the row, the iteration)
        for j in range(count):
            iv = start if j == 0 else create_value("arith.addi", [start, create_value("arith.muli", [stride, index_constant(j)], index)], index)
            items.append((create_value("arith.cmpi", [iv, end], i1, predicate=slt), iv))
    known: dict = {}  # (memref, *indices) -> this thread's value of that element
    unread: dict = {}  # (memref, *indices) -> the guarded store of this thread's element no load has read since
    elements = {element for _, element in items}
    for o in [o.operation for o in block.operations]:
        if any(o == p for p, kind, _ in phases if kind in ("reduce", "loop")):
            _unroll_in_registers(o, items, elements, known, unread)
            continue
        for inner in walk(o):  # a row's value stored by one thread, or read
            if inner.name in ("memref.store", "memref.load"):
                key = (inner.operands[1], *list(inner.operands)[2:]) if inner.name == "memref.store" else tuple(inner.operands)
                _forget(known, key, elements)
                _forget(unread, key, elements)


def _may_alias(a: tuple, b: tuple, elements: set) -> bool:
    """Whether element keys (memref, *indices) may name the same element: through one buffer (or
    one of unknown origin), unless one memref's indices differ where both are this thread's
    elements of the row (distinct ones wherever the iterations are in the row, and values past
    the row's end are never used)."""
    root_a, root_b = _buffer(a[0]), _buffer(b[0])
    if root_a is not None and root_b is not None and root_a != root_b:
        return False
    return not (a[0] == b[0] and len(a) == len(b) and any(x != y and x in elements and y in elements for x, y in zip(a[1:], b[1:])))


def _forget(table: dict, key: tuple, elements: set) -> None:
    """Drops the entries of `table` (keyed by element) that may name the element `key` does."""
    for k in [k for k in table if _may_alias(k, key, elements)]:
        del table[k]


def _unroll_in_registers(loop: ir.Operation, items: list[tuple[ir.Value, ir.Value]], elements: set, known: dict,
                         unread: dict) -> None:
    """`loop` (a thread's part of a row) as one copy of its body per item of `items` (whether the
    iteration is in the row, and the element it reads: one of `elements`); loads of an element this thread loaded or
    stored before become that value (`known`); stores are skipped past the row's end, and a store
    goes where a later one writes the same element before any load reads it (`unread`: a
    softmax's exponentials, overwritten by the quotients)."""
    body = loop.regions[0].blocks[0]
    ops = [o.operation for o in body.operations]
    ops, terminator = ops[:-1], ops[-1]
    reduce = loop.name == "scf.for" and len(loop.results) == 1
    acc = loop.operands[3] if reduce else None
    with ir.InsertionPoint(loop), loop.location:
        for inside, element in items:
            mapping = {body.arguments[0]: element}
            if reduce:
                mapping[body.arguments[1]] = acc
            for o in ops:
                operands = [mapping.get(v, v) for v in o.operands]
                if o.name == "memref.load":
                    key = tuple(operands)
                    if key not in known:  # past the row's end: 0, unused (predicated loads at one base's offsets)
                        t = o.results[0].type
                        load = ir.Operation.create("scf.if", results=[t], operands=[inside], regions=2)
                        with ir.InsertionPoint(load.regions[0].blocks.append()):
                            ir.Operation.create("scf.yield", operands=[create_value("memref.load", operands, t)])
                        with ir.InsertionPoint(load.regions[1].blocks.append()):
                            ir.Operation.create("scf.yield", operands=[_constant(t, 0)])
                        known[key] = load.results[0]
                        _forget(unread, key, elements)
                    mapping[o.results[0]] = known[key]
                elif o.name == "memref.store":
                    guard = ir.Operation.create("scf.if", operands=[inside], regions=2)
                    with ir.InsertionPoint(guard.regions[0].blocks.append()):
                        ir.Operation.create("memref.store", operands=operands)
                        ir.Operation.create("scf.yield")
                    stored = tuple(operands[1:])
                    _forget(known, stored, elements)
                    known[stored] = operands[0]
                    if stored in unread:
                        unread.pop(stored).erase()
                    unread[stored] = guard
                else:
                    clone_ops([o], mapping)
            if reduce:
                acc = create_value("arith.select", [inside, mapping.get(terminator.operands[0], terminator.operands[0]), acc], acc.type)
    if reduce:
        loop.results[0].replace_all_uses_with(acc)
    loop.erase()


# a thread's iterations of a reduction across rows taken at a time: its loads in flight together
# (H200, column sums of (4096, 3072) and (16384, 4096): 39 / 50 % of the copy rate with 16 row
# groups and none unrolled, 99 / 101 % with 32 groups and 4; rows' loops, which ptxas unrolls
# itself, were slower unrolled here: a softmax's (32, 12, 512, 512) 325 -> 377 us)
UNROLL = 4


def _unroll_reduction(loop: ir.Operation) -> None:
    """A thread's part of a reduction across rows (an scf.for folding one value, no stores) takes
    UNROLL iterations at a time, then the rest one by one: the loads of the UNROLL iterations are
    issued together, before the first is combined (LLVM's own unrolling keeps the exit test
    between them), and the values are combined in the same order (the result is the same)."""
    index = ir.IndexType.get()
    body = loop.regions[0].blocks[0]
    lb, ub, step, init = list(loop.operands)[:4]
    t = loop.results[0].type
    with ir.InsertionPoint(loop), loop.location:
        wide = create_value("arith.muli", [step, index_constant(UNROLL)], index)
        main_ub = create_value("arith.subi", [ub, create_value("arith.muli", [step, index_constant(UNROLL - 1)], index)], index)
        main = ir.Operation.create("scf.for", results=[t], operands=[lb, main_ub, wide, init], regions=1)
        block = main.regions[0].blocks.append(index, t)
        # the remainder starts at the first iteration the main loop does not take
        taken = create_value("arith.ceildivsi", [create_value("arith.maxsi", [create_value("arith.subi", [main_ub, lb], index),
                                                                               index_constant(0)], index), wide], index)
        loop.operands[0] = create_value("arith.addi", [lb, create_value("arith.muli", [taken, wide], index)], index)
    loop.operands[3] = main.results[0]
    ops = list(body.operations)
    yielded = ops[-1].operands[0]
    acc = block.arguments[1]
    with ir.InsertionPoint(block), loop.location:
        for k in range(UNROLL):
            iv = block.arguments[0] if k == 0 else create_value(
                "arith.addi", [block.arguments[0], create_value("arith.muli", [step, index_constant(k)], index)], index)
            mapping = clone_ops(ops[:-1], {body.arguments[0]: iv, body.arguments[1]: acc})
            acc = mapping.get(yielded, yielded)
        ir.Operation.create("scf.yield", operands=[acc])


# at most this many ops computed again where a row's element is read back: loads and arithmetic,
# no math functions (H200: a layer norm's residual sum computed again, (65536, 768) 252 -> 196 us;
# a softmax's exponentials computed again instead of read back, (16, 12, 256, 256) 47.3 -> 50.1 us)
RECOMPUTED_OPS = 24


def _recompute_read_back(func: ir.Operation) -> bool:
    """A row's loop that stores each element it computes (a layer norm's sum of its inputs) into
    a buffer that later loops over the same iterations read back, before a last one overwrites
    every element: each read computes the element again from the loop's inputs instead (at most
    RECOMPUTED_OPS loads and arithmetic ops), and the loop goes. The row then goes to device
    memory once, and the inputs it is computed from are read again from the cache. True if a
    loop went (the phases are then found again)."""
    phases = _row_phases(func)
    for i, (loop, kind, _) in enumerate(phases or []):
        found = _stored_element(loop) if kind == "loop" else None
        if found is None:
            continue
        store, chain = found
        memref, indices = store.operands[1], list(store.operands)[2:]
        target = _buffer(memref)
        inputs = [_buffer(o.operands[0]) for o in chain if o.name == "memref.load"]
        readers, final = [], None
        for later, later_kind, _ in phases[i + 1:]:
            accesses = _accesses(later)
            if any(store_ and (b is None or any(b == x for x in inputs)) for b, _, _, store_ in accesses):
                break  # the inputs change
            touching = [(m, ix, store_) for b, m, ix, store_ in accesses if b is None or b == target]
            if not touching:
                continue
            if (later_kind not in ("loop", "reduce") or not _same_iterations(loop, later)
                    or not all(m == memref and _same_element(indices, loop, ix, later) for m, ix, _ in touching)):
                break
            readers.append(later)
            if any(store_ for _, _, store_ in touching):
                final = later
                break
        if final is None or not _reads_before_writing(final, memref):
            continue
        for reader in readers:
            iv = reader.regions[0].blocks[0].arguments[0]
            for load in [o for o in walk(reader) if o.name == "memref.load" and o.operands[0] == memref]:
                with ir.InsertionPoint(load):
                    mapping = clone_ops(chain, {loop.regions[0].blocks[0].arguments[0]: iv})
                load.results[0].replace_all_uses_with(mapping.get(store.operands[0], store.operands[0]))
                load.erase()
        loop.erase()
        return True
    return False


def _stored_element(loop: ir.Operation) -> tuple[ir.Operation, list[ir.Operation]] | None:
    """The store of a loop whose body only computes one element and stores it at the loop's
    iteration (the last index; the others the same in every iteration), with the ops it computes
    it by (loads from buffers of known origin other than the one it stores to, and arithmetic);
    None for any other loop."""
    body = loop.regions[0].blocks[0]
    ops = [o.operation for o in body.operations][:-1]
    stores = [o for o in ops if o.name == "memref.store"]
    if len(stores) != 1 or len(ops) > RECOMPUTED_OPS + 1 or not all(
            o.name in ("memref.store", "memref.load") or o.name.startswith("arith.") for o in ops):
        return None
    store = stores[0]
    indices = list(store.operands)[2:]
    if not indices or indices[-1] != body.arguments[0] or not all(defined_outside(v, loop) for v in indices[:-1]):
        return None
    chain = [o for o in ops if o != store]
    target = _buffer(store.operands[1])
    sources = [_buffer(o.operands[0]) for o in chain if o.name == "memref.load"]
    if target is None or any(b is None or b == target for b in sources):
        return None
    return store, chain


def _reads_before_writing(loop: ir.Operation, memref: ir.Value) -> bool:
    """Whether each iteration of `loop` reads `memref`'s element before it stores to it."""
    ops = [o.operation for o in loop.regions[0].blocks[0].operations]
    first_store = next((i for i, o in enumerate(ops) if o.name == "memref.store" and o.operands[1] == memref), None)
    return first_store is not None and all(i < first_store for i, o in enumerate(ops)
                                           if o.name == "memref.load" and o.operands[0] == memref)


def _buffer(memref: ir.Value) -> ir.Value | None:
    """The body's argument that `memref` is, or is a view of; None where it comes from elsewhere
    (it may then be any buffer)."""
    while not isinstance(memref.owner, ir.Block):
        op = operation(memref.owner)
        if op.name not in VIEWS:
            return None
        memref = op.operands[0]
    return memref


Access = tuple["ir.Value | None", ir.Value, list[ir.Value], bool]  # (its buffer: `_buffer`, memref, indices, whether a store)


def _accesses(op: ir.Operation) -> list[Access]:
    """The memory accesses in `op` (itself included)."""
    found = [(o.operands[1], list(o.operands)[2:], True) if o.name == "memref.store" else (o.operands[0], list(o.operands)[1:], False)
             for o in walk(op) if o.name in ("memref.load", "memref.store")]
    return [(_buffer(m), m, ix, store) for m, ix, store in found]


def _needs_barrier(phases: Phases, i: int) -> bool:
    """Whether a later phase may access an element that phase i writes, or write one that it
    reads, from another thread of the row: unless both are loops over the same iterations (a
    thread takes the same ones in each) and access the element through the same memref at the
    same iteration. Distinct arguments of the body are distinct buffers (a kernel's buffers are
    all live while it runs); views of one buffer may overlap."""
    o, kind, _ = phases[i]
    if kind not in ("loop", "store"):
        return False  # a reduction's parts are combined by all the row's threads after it
    mine = _accesses(o)
    for later, later_kind, _ in phases[i + 1:]:
        if kind == later_kind == "store":
            continue  # the same thread stores the row's values
        for buffer, memref, indices, store in _accesses(later):
            clash = [(m, ix) for b, m, ix, s in mine if (s or store) and (b is None or buffer is None or b == buffer)]
            if clash and not (kind == "loop" and later_kind in ("loop", "reduce") and _same_iterations(o, later)
                              and all(m == memref and _same_element(ix, o, indices, later) for m, ix in clash)):
                return True
    return False


def _same_iterations(a: ir.Operation, b: ir.Operation) -> bool:
    """Whether two loops have the same bounds and step (the same values, or equal constants)."""
    return all(x == y or (int_constant(x) is not None and int_constant(x) == int_constant(y))
               for x, y in zip(list(a.operands)[:3], list(b.operands)[:3]))


def _same_element(a: list[ir.Value], loop_a: ir.Operation, b: list[ir.Value], loop_b: ir.Operation) -> bool:
    """Whether indices `a` in `loop_a` and `b` in `loop_b` name the same element at the same iteration."""
    iv_a, iv_b = loop_a.regions[0].blocks[0].arguments[0], loop_b.regions[0].blocks[0].arguments[0]
    return len(a) == len(b) and all(x == y or (x == iv_a and y == iv_b) for x, y in zip(a, b))


def _forward_stored_values(func: ir.Operation) -> None:
    """A row's body (or a column tile's) reads back the values it stored (a row's max and sum,
    stored to a buffer between its phases): each load of an element the body stored earlier,
    with no store to that buffer in between, becomes the stored value (a loop's loads of it too,
    which LLVM cannot hoist past the loop's stores to other buffers). Every thread of a row
    computes the same value (a column tile's thread stores and reads its own), so the barrier and
    the reload go. A store through a view ends what is known of its buffer (`_buffer`); distinct
    arguments of the body are distinct allocations (a kernel's buffers are all live while it runs)."""
    block = func.regions[0].blocks[0]
    arguments = list(block.arguments)
    stored: list[tuple[ir.Value, list[ir.Value], ir.Value]] = []  # (buffer, indices, value)

    def forward(load: ir.Operation) -> None:
        memref, indices = load.operands[0], list(load.operands)[1:]
        for m, ix, value in stored:
            if m == memref and len(ix) == len(indices) and all(x == y for x, y in zip(ix, indices)):
                load.results[0].replace_all_uses_with(value)
                load.erase()
                return

    for op in [o.operation for o in block.operations]:
        if op.name == "memref.load":
            forward(op)
            continue
        writes = [b for b, _, _, store in _accesses(op) if store]
        if any(b is None for b in writes):  # a buffer of unknown origin: it may be any
            stored.clear()
        stored = [s for s in stored if not any(b is not None and s[0] == b for b in writes)]
        if op.name == "memref.store" and any(op.operands[1] == a for a in arguments):
            stored.append((op.operands[1], list(op.operands)[2:], op.operands[0]))
        elif op.regions:
            for inner in [o for o in walk(op) if o.name == "memref.load"]:
                forward(inner)


def _cooperative_columns(func: ir.Operation, phases: Phases) -> None:
    """Rewrites a body whose reductions run across rows (its `phases`) so that the COLUMN_GROUPS
    warps of a block share each: warp g takes rows g, g + COLUMN_GROUPS, ...; the parts meet in a
    buffer shared by the block (one per reduction, a parameter of the body after the captured
    values), and each thread combines them in the same order, so every warp gets the same total
    and stores the same values (the body's stores need no guard)."""
    block = func.regions[0].blocks[0]
    index = ir.IndexType.get()
    with ir.InsertionPoint.at_block_begin(block), ir.Location.unknown():
        tid = create_value("gpu.thread_id", [], index, dimension=ir.Attribute.parse("#gpu<dim x>"))
        lanes, groups = index_constant(LANES), index_constant(COLUMN_GROUPS)
        lane, group = create_value("arith.remui", [tid, lanes], index), create_value("arith.divui", [tid, lanes], index)
    workgroup = ir.Attribute.parse("#gpu.address_space<workgroup>")
    ops = [o for o, _, _ in phases] + [block.operations[len(block.operations) - 1]]
    for i, (o, kind, combine) in enumerate(phases):
        if kind != "reduce":
            continue
        t, init = o.results[0].type, o.operands[3]
        shared = block.add_argument(ir.MemRefType.get([LANES * COLUMN_GROUPS], t, memory_space=workgroup), ir.Location.unknown())
        with ir.InsertionPoint(o), o.location:
            lb, step = o.operands[0], o.operands[2]
            o.operands[0] = create_value("arith.addi", [lb, create_value("arith.muli", [group, step], index)], index)
            o.operands[2] = create_value("arith.muli", [step, groups], index)
            o.operands[3] = _constant(t, _COMBINERS[combine.name][1])
        _unroll_reduction(o)
        uses = [(u.owner, u.operand_number) for u in o.results[0].uses]
        with ir.InsertionPoint(ops[i + 1]), o.location:
            slot = create_value("arith.addi", [create_value("arith.muli", [group, lanes], index), lane], index)
            ir.Operation.create("memref.store", operands=[o.results[0], shared, slot])
            ir.Operation.create("gpu.barrier")
            total = None
            for g in range(COLUMN_GROUPS):
                part = create_value("memref.load", [shared, create_value("arith.addi", [index_constant(g * LANES), lane], index)], t)
                total = part if total is None else create_value(combine.name, [total, part], t)
            ir.Operation.create("gpu.barrier")  # the buffer is the next tile's
            final = create_value(combine.name, [init, total], t)
        for owner, k in uses:
            owner.operands[k] = final
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([a.type for a in block.arguments], []))


def _warp_reduce(value: ir.Value, combine: str) -> ir.Value:
    """`value` combined over the lanes of a warp (a butterfly of xor shuffles: every lane gets the total)."""
    i32 = ir.IntegerType.get_signless(32)
    width = create_value("arith.constant", [], i32, value=ir.IntegerAttr.get(i32, WARP))
    step = WARP // 2
    while step:
        offset = create_value("arith.constant", [], i32, value=ir.IntegerAttr.get(i32, step))
        other = ir.Operation.create("gpu.shuffle", results=[value.type, ir.IntegerType.get_signless(1)],
                                    operands=[value, offset, width], attributes={"mode": ir.Attribute.parse("#gpu<shuffle_mode xor>")})
        value = create_value(combine, [value, other.results[0]], value.type)
        step //= 2
    return value


def _constant(t: ir.Type, value) -> ir.Value:
    if isinstance(t, ir.FloatType):
        v = {"lowest": float("-inf"), "highest": float("inf")}.get(value, value)
        return create_value("arith.constant", [], t, value=ir.FloatAttr.get(t, v))
    v = {"lowest": -(1 << 31), "highest": (1 << 31) - 1}.get(value, value)
    return create_value("arith.constant", [], t, value=ir.IntegerAttr.get(t, v))


def _launch_text(name: str, versions: list[tuple[str, str, int]], captured: list[ir.Value], bounds: Bounds,
                 extent: Extent | None) -> str:
    """The host side: pack the captured values and launch the kernel (its name, schedule and
    elements a thread holds in registers, as `_kernel_text` and `_rows_in_registers` say) with
    the threads its work items need: of a row kernel's versions, the warps' where there are
    WARP_ROWS rows or more, else the blocks'; of those, the one with the fewest elements in
    registers that hold the row (its `extent`), else the loops'."""
    lines = ["%zero = arith.constant 0 : index", "%one = arith.constant 1 : index", *pack_slots(captured)]
    total = _work_items(lines, bounds, versions[0][1])
    lines += [f"%image = func.call @{IMAGE}() : () -> !llvm.ptr", f"%size = func.call @{IMAGE_SIZE}() : () -> i64",
              f"%ptx = func.call @{PTX}() : () -> !llvm.ptr", f"%slots = llvm.mlir.constant({len(slot_types(captured))} : i64) : i64"]
    if extent is not None and any(count for _, _, count in versions):
        start, end, step = (f"%extent{i}" for i in range(3))
        lines += [f"{var} = arith.constant {v} : index" if isinstance(v, int) else f"{var} = arith.addi {v}, %zero : index"
                  for var, v in zip((start, end, step), extent)]
        lines.append(f"%row = arith.subi {end}, {start} : index")

    def launch(k: int, kernel: str, schedule: str) -> list[str]:
        per_item, block = _THREADS[schedule]
        return [f"%per_item{k} = arith.constant {per_item} : index", f"%all{k} = arith.muli {total}, %per_item{k} : index",
                f"%threads{k} = arith.index_cast %all{k} : index to i64", f"%name{k} = llvm.mlir.addressof @{kernel}_name : !llvm.ptr",
                f"%block{k} = llvm.mlir.constant({block} : i64) : i64",
                f"func.call @disc_ral_gpu_launch(%image, %size, %ptx, %name{k}, %buf, %slots, %threads{k}, %block{k}) : ({LAUNCH_SIGNATURE}) -> ()"]

    def choose(schedule: str) -> list[str]:  # the fewest elements in registers that hold the row, else the loops
        mine = sorted((count, k, kernel) for k, (kernel, s, count) in enumerate(versions) if s == schedule)
        out, closing = [], []
        for count, k, kernel in mine[1:] if mine[0][0] == 0 else []:
            holds = _THREADS[schedule][0] * count
            out += [f"%holds{k} = arith.constant {holds} : index", f"%reach{k} = arith.muli %holds{k}, {step} : index",
                    f"%fits{k} = arith.cmpi sle, %row, %reach{k} : index", f"scf.if %fits{k} {{", *launch(k, kernel, schedule), "} else {"]
            closing.append("}")
        count, k, kernel = mine[0]
        return out + launch(k, kernel, schedule) + closing

    if {s for _, s, _ in versions} == {"block", "warp"}:
        lines += [f"%warp_rows = arith.constant {WARP_ROWS} : index", f"%many = arith.cmpi uge, {total}, %warp_rows : index",
                  "scf.if %many {", *choose("warp"), "} else {", *choose("block"), "}"]
    else:
        lines += choose(versions[0][1])
    lines += ["llvm.intr.stackrestore %sp : !llvm.ptr", "return"]
    params = ", ".join(f"%v{i}: {v.type}" for i, v in enumerate(captured))
    return "\n".join([
        f"func.func private @{IMAGE}() -> !llvm.ptr", f"func.func private @{IMAGE_SIZE}() -> i64",
        f"func.func private @{PTX}() -> !llvm.ptr", f"func.func private @disc_ral_gpu_launch({LAUNCH_SIGNATURE})",
        *[f'llvm.mlir.global private constant @{kernel}_name("{kernel}\\00") {{addr_space = 0 : i32}}' for kernel, _, _ in versions],
        f"func.func private @{name}({params}) {{\n  " + "\n  ".join(lines) + "\n}"])


DEVICE_COPY = "__device"  # the suffix of a constant global the kernels or library calls read (`device_memory`)


# ops a serial loop nest may hold to run as a kernel of one thread
_SERIAL = ("scf.for", "scf.if", "scf.yield", "arith.", "math.", "complex.", "index.", "affine.apply", "memref.load", "memref.store",
           "memref.dim", "memref.extract_strided_metadata", *VIEWS)


ONE_THREAD = "disc.one_thread"  # on a serial loop nest that becomes a kernel of one thread


def mark_serial_loops(module: ir.Module, host_only: tuple[str, ...]) -> int:
    """Marks each loop nest the host code would run itself over device memory (a reduction to a
    scalar, a small static loop) to become a kernel of one thread (`outline_gpu_kernels`): its
    elements are then read on the device, not copied one by one to the host. Loops with results
    (values the host code uses) stay on the host. Returns how many loops were marked."""
    loops = [op for op in _device_side(module, host_only) if op.name == "scf.for" and not op.results
             and not nested_in(op, "scf.for") and not nested_in(op, "scf.parallel")
             and all(o.name.startswith(_SERIAL) for o in walk(op))
             and any(o.name in ("memref.load", "memref.store") for o in walk(op))]
    for op in loops:
        op.attributes[ONE_THREAD] = ir.UnitAttr.get()
    return len(loops)


def _one_thread(module: ir.Module) -> None:
    """Each marked loop nest into a parallel loop of one iteration (the kernel of one thread)."""
    for op in [op for op in walk(module.operation) if ONE_THREAD in op.attributes]:
        del op.attributes[ONE_THREAD]  # now the kernel's
        with ir.InsertionPoint(op), op.location:
            zero, one = index_constant(0), index_constant(1)
            loop, body = _new_loop([(zero, one, one)])
        loop.attributes[ONE_THREAD] = ir.UnitAttr.get()
        op.move_before(list(body.operations)[-1])


def reshapes_with_host_sizes(module: ir.Module) -> None:
    """Each `memref.reshape` of the host code reads its sizes from its shape buffer where it
    stands (loads: of the host's stack, or through the RAL when the buffer is device memory)
    and becomes a `memref.reinterpret_cast` with those sizes: the reshape itself may be rebuilt
    inside a kernel, which must not read the shape buffer (its memory may be the host's)."""
    index = ir.IndexType.get()
    dynamic = ir.ShapedType.get_dynamic_size()
    for op in [op for op in walk(module.operation) if op.name == "memref.reshape"]:
        source, shape = op.operands
        mt = ir.MemRefType(op.result.type)
        with ir.InsertionPoint(op), op.location:
            sizes: list[int | ir.Value] = []  # static, or the value loaded
            for d, static in enumerate(mt.shape):
                if static != dynamic:
                    sizes.append(static)
                    continue
                size = create_value("memref.load", [shape, index_constant(d)], ir.MemRefType(shape.type).element_type)
                sizes.append(size if isinstance(size.type, ir.IndexType) else create_value("arith.index_cast", [size], index))
            strides: list[int | ir.Value] = [1]
            for size in reversed(sizes[1:]):
                inner = strides[0]
                if isinstance(inner, int) and isinstance(size, int):
                    strides.insert(0, inner * size)
                else:
                    as_value = [index_constant(v) if isinstance(v, int) else v for v in (inner, size)]
                    strides.insert(0, create_value("arith.muli", as_value, index))
            values = [v for v in sizes + strides if not isinstance(v, int)]
            cast = ir.Operation.create("memref.reinterpret_cast", results=[mt], operands=[source, *values], attributes={
                "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 0, sum(not isinstance(v, int) for v in sizes),
                                                                 sum(not isinstance(v, int) for v in strides)]),
                "static_offsets": ir.DenseI64ArrayAttr.get([0]),
                "static_sizes": ir.DenseI64ArrayAttr.get([v if isinstance(v, int) else dynamic for v in sizes]),
                "static_strides": ir.DenseI64ArrayAttr.get([v if isinstance(v, int) else dynamic for v in strides])})
        op.result.replace_all_uses_with(cast.result)
        op.erase()


def host_buffers(module: ir.Module) -> None:
    """Before buffers are planned: small buffers of static shape that only the host code reads
    and writes (a reshape's shape, built from dims: `reshapes_with_host_sizes`) become stack buffers of the host;
    constant globals that the kernels or library calls read are copied to the device (their
    symbols get `DEVICE_COPY`), the others stay in host memory."""
    for op in [op for op in walk(module.operation) if op.name == "memref.alloc"]:
        if _host_only(op):
            mt = ir.MemRefType(op.result.type)
            if mt.has_static_shape and math.prod(mt.shape) * element_bytes(mt.element_type) <= 1024:
                _on_the_stack(op)
    globals_ = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in walk(module.operation) if op.name == "memref.global"}
    for op in [op for op in walk(module.operation) if op.name == "memref.get_global"]:
        name = ir.FlatSymbolRefAttr(op.attributes["name"]).value
        if _host_only(op) or name not in globals_:
            continue
        device = name + DEVICE_COPY
        if device not in globals_:
            globals_[device] = globals_[name].clone(ip=ir.InsertionPoint(globals_[name]))
            globals_[device].attributes["sym_name"] = ir.StringAttr.get(device)
        op.attributes["name"] = ir.FlatSymbolRefAttr.get(device)


def _host_only(op: ir.Operation) -> bool:
    """Whether the buffer `op` creates is only read or written by the host code itself."""
    for use in op.result.uses:
        o, n = use.owner, use.operand_number
        if o.name == "memref.dealloc":
            continue
        if not (o.name == "memref.load" or (o.name == "memref.store" and n == 1)) or nested_in(o, "scf.parallel") or _marked(o):
            return False
    return True


def _marked(op: ir.Operation) -> bool:
    """Whether `op` is in a loop nest marked to become a kernel of one thread."""
    node = op.parent
    while node is not None and ONE_THREAD not in node.attributes:
        node = node.parent
    return node is not None


def _on_the_stack(alloc: ir.Operation) -> None:
    with ir.InsertionPoint(alloc), alloc.location:
        stack = ir.Operation.create("memref.alloca", results=[alloc.result.type], attributes={
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([0, 0])})
    for use in list(alloc.result.uses):
        if use.owner.name == "memref.dealloc":
            use.owner.erase()
    alloc.result.replace_all_uses_with(stack.result)
    alloc.erase()


def _device_side(module: ir.Module, host_only: tuple[str, ...]) -> list[ir.Operation]:
    """The ops of the module's functions but those named in `host_only` (the guard: shape
    arithmetic whose result the caller reads in host memory) and their C interfaces."""
    names = set(host_only) | {f"_mlir_ciface_{n}" for n in host_only}
    return [op for f in module.body.operations if f.operation.name not in ("func.func", "llvm.func")
            or ir.StringAttr(f.attributes["sym_name"]).value not in names for op in walk(f.operation)]


def host_memory_through_the_ral(module: ir.Module, host_only: tuple[str, ...]) -> dict[str, int]:
    """After the kernels are outlined: the host code's own reads and writes of device buffers
    (scalars: indices, conditions) become copies through the RAL; returns the bytes of each
    constant global the device reads, whose address the host code later exchanges for its
    device copy (`device_memory`, after the lowering to LLVM)."""
    constants = {}
    for op in walk(module.operation):
        name = ir.StringAttr(op.attributes["sym_name"]).value if op.name == "memref.global" else ""
        if name.endswith(DEVICE_COPY):
            mt = ir.MemRefType(ir.TypeAttr(op.attributes["type"]).value)
            constants[name] = element_bytes(mt.element_type) * math.prod(mt.shape)
    device_side = set(_device_side(module, host_only))
    for op in walk(module.operation):  # the guard's own memory is the host's: its arguments' data is the device's
        memref = op.operands[1 if op.name == "memref.store" else 0] if op.name in ("memref.load", "memref.store") else None
        if memref is not None and op not in device_side and isinstance(_buffer(memref), ir.BlockArgument):
            raise CompileError(f"the guard would read a tensor's data in device memory (a compiler bug): {describe(op)}")
    accesses = [op for op in device_side if op.name in ("memref.load", "memref.store")
                and not _host_memory(op.operands[1 if op.name == "memref.store" else 0])]
    for op in accesses:
        _through_the_ral(op)
    left = [op for op in walk(module.operation) if op.name in ("memref.copy", "memref.atomic_rmw", "memref.generic_atomic_rmw", "memref.reshape")
            or op.name.startswith(("linalg.", "vector."))]
    if left:
        raise UnsupportedOpError(f"the host code would access device memory: {describe(left[0])}")
    if accesses:
        with ir.Location.unknown():
            for fn in ("disc_ral_gpu_read", "disc_ral_gpu_write"):
                ir.InsertionPoint.at_block_begin(module.body).insert(ir.Operation.parse(f"func.func private @{fn}(!llvm.ptr, !llvm.ptr, i64)"))
    return constants


def _host_memory(v: ir.Value) -> bool:
    """Whether `v` is a stack buffer or a constant global the host keeps."""
    if isinstance(v.owner, ir.Block):
        return False
    op = operation(v.owner)
    return op.name == "memref.alloca" or (op.name == "memref.get_global" and not ir.FlatSymbolRefAttr(op.attributes["name"]).value.endswith(DEVICE_COPY))


def _through_the_ral(op: ir.Operation) -> None:
    """A load or store of one element in host code: through a stack slot and a RAL copy."""
    store = op.name == "memref.store"
    memref = op.operands[1 if store else 0]
    indices = list(op.operands)[2 if store else 1:]
    mt = ir.MemRefType(memref.type)
    size = element_bytes(mt.element_type)
    index, i64, ptr = ir.IndexType.get(), ir.IntegerType.get_signless(64), ir.Type.parse("!llvm.ptr")
    with ir.InsertionPoint(op), op.location:
        base_type = ir.MemRefType.get([], mt.element_type)
        meta = ir.Operation.create("memref.extract_strided_metadata", operands=[memref],
                                   results=[base_type, index] + [index] * (2 * mt.rank))
        offset = meta.results[1]
        for i, idx in enumerate(indices):
            offset = create_value("arith.addi", [offset, create_value("arith.muli", [idx, meta.results[2 + mt.rank + i]], index)], index)
        base = create_value("memref.extract_aligned_pointer_as_index", [meta.results[0]], index)
        bytes_ = create_value("arith.constant", [], index, value=ir.IntegerAttr.get(index, size))
        address = create_value("arith.addi", [base, create_value("arith.muli", [offset, bytes_], index)], index)
        device = create_value("llvm.inttoptr", [create_value("arith.index_cast", [address], i64)], ptr)
        slot_type = _register_type(mt.element_type)
        func = op.parent
        while func.name != "func.func":
            func = func.parent
        with ir.InsertionPoint.at_block_begin(func.regions[0].blocks[0]):  # once per call, not per loop iteration
            one = create_value("llvm.mlir.constant", [], i64, value=ir.IntegerAttr.get(i64, 1))
            slot = create_value("llvm.alloca", [one], ptr, elem_type=ir.TypeAttr.get(slot_type))
        n = create_value("llvm.mlir.constant", [], i64, value=ir.IntegerAttr.get(i64, size))
        if store:
            ir.Operation.create("llvm.store", operands=[_cast(op.operands[0], slot_type), slot])
            ir.Operation.create("func.call", operands=[device, slot, n], attributes={"callee": ir.FlatSymbolRefAttr.get("disc_ral_gpu_write")})
        else:
            ir.Operation.create("func.call", operands=[slot, device, n], attributes={"callee": ir.FlatSymbolRefAttr.get("disc_ral_gpu_read")})
            value = create_value("llvm.load", [slot], slot_type)
            op.results[0].replace_all_uses_with(_cast(value, mt.element_type))
    op.erase()


def _register_type(t: ir.Type) -> ir.Type:
    """The LLVM type an element of type `t` is loaded and stored as (an index as i64, a complex
    number as a struct of its parts)."""
    if isinstance(t, ir.IndexType):
        return ir.IntegerType.get_signless(64)
    if isinstance(t, ir.ComplexType):
        part = ir.ComplexType(t).element_type
        return ir.Type.parse(f"!llvm.struct<({part}, {part})>")
    return t


def _cast(v: ir.Value, to: ir.Type) -> ir.Value:
    """`v` as type `to` (between an element type and its `_register_type`)."""
    if v.type == to:
        return v
    if isinstance(v.type, ir.IndexType) or isinstance(to, ir.IndexType):
        return create_value("arith.index_cast", [v], to)
    return create_value("builtin.unrealized_conversion_cast", [v], to)


# the RAL entries the host code calls (the allocation hooks of MLIR's finalize-memref-to-llvm
# among them) and their device versions
_DEVICE_ENTRIES = {"_mlir_memref_to_llvm_alloc": "disc_ral_gpu_alloc", "_mlir_memref_to_llvm_free": "disc_ral_gpu_free",
                   "disc_ral_gemm_f32": "disc_ral_gpu_gemm_f32", "disc_ral_gemm_f64": "disc_ral_gpu_gemm_f64",
                   "disc_ral_grouped_gemm_f32": "disc_ral_gpu_grouped_gemm_f32", "disc_ral_grouped_gemm_f64": "disc_ral_gpu_grouped_gemm_f64"}
_HOST_ONLY = ("_mlir_memref_to_llvm_aligned_alloc", "disc_ral_conv_f32", "disc_ral_conv_f64", "memrefCopy")


def device_memory(module: ir.Module, constants: dict[str, int], host_only: tuple[str, ...]) -> None:
    """After the lowering to LLVM: the host code allocates device memory and calls the device
    versions of library entries, and its address of a constant global becomes the address of the
    constant's device copy."""
    renamed = set()
    for op in _device_side(module, host_only):
        name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value if op.name == "llvm.call" and "callee" in op.attributes else ""
        if name in _DEVICE_ENTRIES:
            op.attributes["callee"] = ir.FlatSymbolRefAttr.get(_DEVICE_ENTRIES[name])
            renamed.add(name)
        elif name in _HOST_ONLY:
            what = "convolution" if "conv" in name else "copy of a strided view" if name == "memrefCopy" else "over-aligned allocation"
            raise UnsupportedOpError(f"no GPU version yet of the host code's {what} ({name}): {describe(op)}")
    for op in list(module.body.operations):  # the device entries are declared as the host ones are
        if op.operation.name == "llvm.func" and ir.StringAttr(op.attributes["sym_name"]).value in renamed:
            clone = op.operation.clone(ip=ir.InsertionPoint(op))
            clone.attributes["sym_name"] = ir.StringAttr.get(_DEVICE_ENTRIES[ir.StringAttr(op.attributes["sym_name"]).value])
    ptr, i64 = ir.Type.parse("!llvm.ptr"), ir.IntegerType.get_signless(64)
    uses = [op for op in walk(module.operation) if op.name == "llvm.mlir.addressof"
            and ir.FlatSymbolRefAttr(op.attributes["global_name"]).value in constants]
    for op in uses:
        with ir.InsertionPoint(op), op.location:
            host = op.clone()
            size = create_value("llvm.mlir.constant", [], i64, value=ir.IntegerAttr.get(
                i64, constants[ir.FlatSymbolRefAttr(op.attributes["global_name"]).value]))
            call = ir.Operation.create("llvm.call", results=[ptr], operands=[host.result, size],
                                       attributes={"callee": ir.FlatSymbolRefAttr.get("disc_ral_gpu_constant"),
                                                   "operandSegmentSizes": ir.DenseI32ArrayAttr.get([2, 0]),
                                                   "op_bundle_sizes": ir.DenseI32ArrayAttr.get([])})
        op.result.replace_all_uses_with(call.result)
        op.erase()
    if uses:
        with ir.Location.unknown():
            ir.InsertionPoint.at_block_begin(module.body).insert(ir.Operation.parse("llvm.func @disc_ral_gpu_constant(!llvm.ptr, i64) -> !llvm.ptr"))


def _to_device(target) -> str:
    """The passes from the device module's functions to NVVM (CUDA: libdevice's math, linked by
    `targets/cuda.py`) or ROCDL (ROCm: every math op a call into ROCm's device library where
    there is one, `Target.math_library`; without it, math expanded or approximated by polynomials
    where MLIR can, the rest a CompileError in `targets/rocm.py`)."""
    if target.kind == "cuda":
        return "gpu.module(convert-gpu-to-nvvm{index-bitwidth=64})"
    rocdl = f"convert-gpu-to-rocdl{{chipset={target.cpu} index-bitwidth=64}}"
    if target.math_library:  # bf16 math in f32 (the library has f16, f32 and f64 functions)
        return f"gpu.module(math-extend-to-supported-types{{extra-types=f16}}), convert-math-to-rocdl{{chipset={target.cpu}}}, gpu.module({rocdl})"
    return f"gpu.module(math-extend-to-supported-types, math-expand-ops, {rocdl})"


def _bit_counts_as_intrinsics(device: ir.Module) -> None:
    """`math.ctpop` / `math.ctlz`, which the GPU lowerings leave as they are, as LLVM's
    intrinsics; 8- and 16-bit integers counted zero-extended to 32 bits (less the added leading
    zeros)."""
    i32 = ir.IntegerType.get_signless(32)
    for op in [op for op in walk(device.operation) if op.name in ("math.ctpop", "math.ctlz")]:
        t = op.result.type
        narrow = isinstance(t, ir.IntegerType) and ir.IntegerType(t).width < 32
        with ir.InsertionPoint(op), op.location:
            x, wide = (create_value("arith.extui", [op.operands[0]], i32), i32) if narrow else (op.operands[0], t)
            if op.name == "math.ctpop":
                count = create_value("llvm.intr.ctpop", [x], wide)
            else:
                count = create_value("llvm.intr.ctlz", [x], wide, is_zero_poison=ir.BoolAttr.get(False))
                if narrow:
                    extra = create_value("arith.constant", [], i32, value=ir.IntegerAttr.get(i32, 32 - ir.IntegerType(t).width))
                    count = create_value("arith.subi", [count, extra], i32)
            op.result.replace_all_uses_with(create_value("arith.trunci", [count], t) if narrow else count)
        op.erase()


def device_llvm_ir(device: ir.Module, target) -> str:
    """The LLVM IR of the device module's kernels (for `targets/cuda.py` or `targets/rocm.py`)."""
    _bit_counts_as_intrinsics(device)
    run_pipeline(device, f"builtin.module(gpu.module(inline, convert-scf-to-cf, expand-strided-metadata, lower-affine, arith-expand, "
                                f"memref-expand, convert-complex-to-standard), {_to_device(target)}, reconcile-unrealized-casts)",
                 "lowering the kernels to LLVM")
    gpu_module = device.body.operations[0]  # its functions move out: LLVM IR is translated from a builtin module
    internal = ir.Attribute.parse("#llvm.linkage<internal>")
    for op in list(gpu_module.regions[0].blocks[0].operations):
        if op.name == "llvm.func" and len(op.regions[0].blocks) and "gpu.kernel" not in op.attributes:
            op.attributes["linkage"] = internal  # a function kernels call goes with each into its part (`targets/codegen.py`)
        op.move_before(gpu_module)
    gpu_module.erase()
    contract_float_arithmetic(device)
    verify(device, "translation of the kernels to LLVM IR")
    return str(translate_module_to_llvmir(device.operation))
