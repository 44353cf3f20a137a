"""Owns the MLIR context set-up (dialects, passes) and small helpers over the MLIR Python API.

torch-mlir's wheel bundles upstream MLIR and StableHLO; loading its torch dialect's native
library is what registers `stablehlo-legalize-to-linalg` and `stablehlo-aggressive-simplification`."""

from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Callable, Iterator

import sys

from .errors import CompileError


def _load_mlir() -> None:
    """torch-mlir and TensorFlow each carry an LLVM; in one process their command-line option
    registries clash (the process aborts, whichever comes first). Loading torch-mlir's native
    modules with RTLD_DEEPBIND | RTLD_LOCAL keeps its LLVM to itself, so a user's process may
    import TensorFlow before or after this package."""
    old = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND)
    try:
        import torch_mlir.passmanager  # noqa: F401
        from torch_mlir._mlir_libs import _mlirDialectsLLVM, _stablehlo, _torchMlir  # noqa: F401  (_torchMlir: the StableHLO->linalg passes)
    finally:
        sys.setdlopenflags(old)


_load_mlir()

from torch_mlir import ir, passmanager  # noqa: E402
from torch_mlir._mlir_libs import _stablehlo  # noqa: E402
from torch_mlir._mlir_libs._mlir import globals as _mlir_globals  # noqa: E402

_stablehlo.register_stablehlo_passes()
from . import opviews  # noqa: E402

_mlir_globals.dialect_search_modules = [opviews.__name__, *_mlir_globals.dialect_search_modules]


def new_context() -> ir.Context:
    ctx = ir.Context()
    _stablehlo.register_dialect(ctx)
    ctx.allow_unregistered_dialects = False
    return ctx


def walk(op: ir.Operation) -> Iterator[ir.Operation]:
    """Pre-order walk over `op` and every op nested in it (a snapshot: safe to mutate after)."""
    found: list[ir.Operation] = []

    def visit(o):
        found.append(o.operation)
        return ir.WalkResult.ADVANCE

    op.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return iter(found)


def clone_ops(ops: list[ir.Operation], mapping: dict[ir.Value, ir.Value]) -> dict[ir.Value, ir.Value]:
    """Clones `ops` in order at the current insertion point, their operands (nested ops' too) that
    `mapping` holds replaced; the clones' results are added to `mapping`, which is returned."""
    for op in ops:
        new = op.clone()
        for inner in walk(new):
            for i, v in enumerate(inner.operands):
                if v in mapping:
                    inner.operands[i] = mapping[v]
        mapping.update(zip(op.results, new.results))
    return mapping


_FRAME_RE = re.compile(r'"([^"]+)"\("([^"]+)":(\d+)')


_FACTS_RE = re.compile(r'fused<\[((?:"[^"]*"(?:, )?)*)\]>')


def tag_facts(op: ir.Operation, facts: list[str]) -> None:
    """Records in the op's location the shape facts its code relies on: locations survive every
    rewrite (ops created from an op take its location; fusion keeps the ops of a body), so the
    kernels an op ends up in can say which facts they rely on (`facts_relied_on`)."""
    if facts:
        op.location = ir.Location.fused([op.location], ir.ArrayAttr.get([ir.StringAttr.get(f) for f in facts]))


def facts_relied_on(op: ir.Operation) -> list[str]:
    return [f for group in _FACTS_RE.findall(str(op.location)) for f in re.findall(r'"([^"]*)"', group)]


def location_text(op: ir.Operation) -> str:
    """The op's name in the source and its innermost source line (JAX records whole call
    stacks, test runners included; only the first frame helps a user)."""
    text = _FACTS_RE.sub("fused", str(op.location).removeprefix("loc(").removesuffix(")"))
    name = re.match(r'(?:fused\[)?"([^"]*)"', text)
    frame = _FRAME_RE.search(text)
    if frame is None:
        return text if len(text) < 200 else text[:200] + "..."
    where = f"{frame.group(2)}:{frame.group(3)}"
    return f"{name.group(1)} ({where})" if name and name.group(1) != frame.group(1) else f"{frame.group(1)} ({where})"


def describe(op: ir.Operation) -> str:
    """`stablehlo.foo (tensor<?x4xf32>) -> tensor<?xf32> at loc` for error messages (a custom call
    with its target: `stablehlo.custom_call @lapack_sgehrd_ffi (...)`)."""
    ins = ", ".join(str(v.type) for v in op.operands)
    outs = ", ".join(str(v.type) for v in op.results)
    name = f"{op.name} @{call_target(op)}" if op.name == "stablehlo.custom_call" else op.name
    return f"{name} ({ins}) -> ({outs}) at {location_text(op)}"


def call_target(op: ir.Operation) -> str:
    """A custom call's target name."""
    return ir.StringAttr(op.attributes["call_target_name"]).value


# seconds per stage of the compilation this process runs (one at a time: the worker's), reset by
# the worker for each request and sent back with the artifact (`CompiledFunction.compile_seconds`)
stage_seconds: dict[str, float] = {}


def add_seconds(stage: str, start: float) -> float:
    """Adds the time since `start` (a `time.perf_counter()`) to `stage`; returns now."""
    now = time.perf_counter()
    stage_seconds[stage] = stage_seconds.get(stage, 0.0) + now - start
    return now


def verify(module: ir.Module, stage: str) -> None:
    """Raises CompileError (with MLIR's diagnostics) when the module is not valid IR."""
    start = time.perf_counter()
    try:
        module.operation.verify()
    except ir.MLIRError as e:
        raise CompileError(f"invalid IR before {stage} (a compiler bug):\n{e}") from None
    finally:
        add_seconds(VERIFY_STAGE, start)


VERIFY_STAGE, PIPELINES_STAGE = "IR verification", "MLIR pass pipelines"


def ignore_stage(stage: str) -> None:
    pass


# told the name of each stage before it runs (the compiler worker reports it to its caller)
stage_listener: Callable[[str], None] = ignore_stage


def run_pipeline(module: ir.Module, pipeline: str, stage: str) -> None:
    """Runs a pass pipeline; on failure raises CompileError with the diagnostics and, when
    DISC_SAVE_TEMPS=dir is set, a reproducer file and the command that replays it.

    The module is verified before the pipeline (it may come from our own rewrites); upstream
    passes are trusted to keep valid IR valid, so the verifier runs after each of them only when
    DISC_SAVE_TEMPS is set (it took half of the pass pipelines' time)."""
    stage_listener(stage)
    debugging = bool(os.environ.get("DISC_SAVE_TEMPS"))
    saved = module.operation.get_asm(enable_debug_info=True) if debugging else None
    verify(module, stage)
    diagnostics: list[str] = []

    def on_diag(d):
        diagnostics.append(f"{d.location}: {d.message}")
        diagnostics.extend(f"  note: {n.location}: {n.message}" for n in d.notes)
        return True

    handle = module.context.attach_diagnostic_handler(on_diag)
    start = time.perf_counter()
    try:
        pm = passmanager.PassManager.parse(pipeline)
        pm.enable_verifier(debugging)
        pm.run(module.operation)
    except Exception as e:  # MLIRError: the diagnostics carry the useful part
        text = "\n".join(diagnostics) or str(e)
        msg = f"{stage} failed:\n{text}"
        if saved is not None:
            path = save_temp(f"{stage.replace(' ', '_')}.mlir", saved)
            msg += f"\nreproducer: {path}\nreplay: mlir-opt --pass-pipeline='{pipeline}' {path}"
        raise CompileError(msg) from None
    finally:
        handle.detach()
        add_seconds(PIPELINES_STAGE, start)
    if saved is not None:
        save_temp(f"after_{stage.replace(' ', '_')}.mlir", str(module))


def llvm_string(name: str, text: str) -> str:
    """An LLVM global named `name` holding `text` as a C string (an error message for the RAL)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'llvm.mlir.global internal constant @{name}("{escaped}\\00") {{addr_space = 0 : i32}}'


def save_temp(name: str, text: str) -> str:
    folder = os.environ["DISC_SAVE_TEMPS"]
    os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=name.rsplit(".", 1)[0] + "-", suffix="." + name.rsplit(".", 1)[1], dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def int_list(op: ir.Operation, name: str, default: list[int] | None = None) -> list[int]:
    """An integer-list attribute (a dense i64 array or dense integer elements); `default` (or [])
    when the op does not carry it."""
    if name not in op.attributes:
        return list(default or [])
    attr = op.attributes[name]
    if isinstance(attr, ir.DenseI64ArrayAttr):
        return list(attr)
    return [int(x) for x in ir.DenseIntElementsAttr(attr)]


def operation(x) -> ir.Operation:
    """The Operation behind an OpView (a use's owner, a module body entry)."""
    return x.operation if hasattr(x, "operation") else x


def find_function(module: ir.Module, name: str) -> ir.Operation | None:
    """The module's `func.func` named `name`, or None."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op.operation
    return None


def function_type(func: ir.Operation) -> ir.FunctionType:
    return ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)


def index_constant(value: int) -> ir.Value:
    """An `arith.constant` of index type at the current insertion point."""
    return ir.Operation.create("arith.constant", results=[ir.IndexType.get()],
                               attributes={"value": ir.IntegerAttr.get(ir.IndexType.get(), value)}).result


CMPI_PREDICATES = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]  # arith.cmpi's enum order


def index_compare(predicate: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """`arith.cmpi predicate, a, b` (an i1) at the current insertion point."""
    return create_value("arith.cmpi", [a, b], ir.IntegerType.get_signless(1),
                        predicate=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), CMPI_PREDICATES.index(predicate)))


def identity_layout(t: ir.MemRefType) -> bool:
    """Whether a memref type is row-major without an offset (its layout is printed only when not)."""
    return "affine_map" not in str(t) and "strided" not in str(t)


def create_value(name: str, operands: list[ir.Value], result: ir.Type, **attributes: ir.Attribute) -> ir.Value:
    """The result of a new single-result op at the current insertion point."""
    return ir.Operation.create(name, results=[result], operands=list(operands), attributes=attributes).result


def broadcast_like(scalar: ir.Value, like: ir.Value) -> ir.Value:
    """A rank-0 tensor broadcast to the shape of the tensor `like` (its dynamic dims read off it)."""
    like_t = ir.RankedTensorType(like.type)
    out = ir.RankedTensorType.get(like_t.shape, ir.RankedTensorType(scalar.type).element_type)
    dims = ir.DenseI64ArrayAttr.get([])
    if like_t.has_static_shape:
        return create_value("stablehlo.broadcast_in_dim", [scalar], out, broadcast_dimensions=dims)
    sizes = [create_value("tensor.dim", [like, index_constant(i)], ir.IndexType.get()) for i in range(like_t.rank)]
    shape = create_value("tensor.from_elements", sizes, ir.RankedTensorType.get([like_t.rank], ir.IndexType.get()))
    return create_value("stablehlo.dynamic_broadcast_in_dim", [scalar, shape], out, broadcast_dimensions=dims)


def int_constant(v: ir.Value) -> int | None:
    """The value of an integer constant (`arith.constant`, `shape.const_size`); None otherwise."""
    if isinstance(v.owner, ir.Block) or operation(v.owner).name not in ("arith.constant", "shape.const_size"):
        return None
    attr = operation(v.owner).attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def defined_outside(v: ir.Value, op: ir.Operation) -> bool:
    """Whether `v` is defined outside `op` (neither by an op nor a block argument inside it)."""
    owner = v.owner
    node = owner.owner if isinstance(owner, ir.Block) else owner
    return not is_inside(operation(node) if node is not None else None, op)


def nested_in(op: ir.Operation, name: str) -> bool:
    """Whether an ancestor of `op` is an op named `name`."""
    node = op.parent
    while node is not None:
        if node.name == name:
            return True
        node = node.parent
    return False


def is_inside(op: ir.Operation | None, ancestor: ir.Operation) -> bool:
    """Whether `op` is `ancestor` or nested in it."""
    while op is not None:
        if op == ancestor:
            return True
        op = op.parent
    return False


def new_private_function(module: ir.Module, name: str, arg_types: list[ir.Type],
                         result_types: list[ir.Type]) -> tuple[ir.Operation, ir.Block]:
    """An empty private func.func at the top of the module, and its entry block."""
    with ir.InsertionPoint.at_block_begin(module.body), ir.Location.unknown():
        func = ir.Operation.create("func.func", regions=1, attributes={
            "sym_name": ir.StringAttr.get(name), "sym_visibility": ir.StringAttr.get("private"),
            "function_type": ir.TypeAttr.get(ir.FunctionType.get(arg_types, result_types))})
    return func, func.regions[0].blocks.append(*arg_types)
