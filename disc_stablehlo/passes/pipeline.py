"""The compilation pipeline, read top to bottom: StableHLO in, LLVM IR text out.

Each step is one line; MLIR pass pipelines are built from the named pieces below."""

from __future__ import annotations

import dataclasses

import numpy as np
from torch_mlir import ir
from torch_mlir._mlir_libs._mlirDialectsLLVM import translate_module_to_llvmir

from ..artifact import ENTRY, GUARD, Deferred
from ..bounded_dynamism import Signature
from ..bounded_dynamism.analysis import ShapeAnalysis, ShapeFacts, analyze
from ..bounded_dynamism.constraints import (Constraint, add_constraint_guards, bounds_constraints, constraint_function,
                                            load_from_ir, record_fact, save_to_ir)
from ..bounded_dynamism.guards import GUARD_FUNCTION, emit_contract_checks, extract_guard
from ..bounded_dynamism.signature import Assertion
from ..errors import CompileError, UnsupportedOpError
from ..mlir_support import describe, find_function, function_type, run_pipeline, verify, walk
from . import control_flow, convolution, dynamic_ops, fft, lapack, library_calls, region_ops  # noqa: F401  (register their rewrites)
from .convolution import reverse_kernels
from .top_k import protect_top_k
from .constants import fold_constant_converts
from .buffers import check_allocation_sizes, free_after_last_use, plan_arena, reuse_equal_buffers
from .dims import argument_dim_sources, unify_argument_dims
from .epilogues import fuse_epilogues
from .fusion import duplicate_broadcasts, forward_uniform_operands, scalarize_rank0_generics
from .loops import (accumulate_in_registers, collapse_rows, copies_to_linalg, flatten_contiguous_loops, fuse_loops,
                    blocked_float_sums, hoist_invariant_loads, interleave_long_loops, prefetch_next_rows, schedule_column_reductions, version_broadcasts)
from .library_calls import keep_reads_at_their_calls, transposes_below_scalar_ops
from .views import transposes_below_slices
from .lower import GPU_ATTR, lower_module
from .low_bit_floats import emulation_pipeline, expand_conversions, low_bit_types
from .control_flow import remove_optimization_barriers
from .math_ops import (boolean_sums_as_or, complex_cbrt_polar, contract, CONTRACTED, complex_extrema_lexicographic, integer_powers_as_products, exp_inline,
                       reciprocals_of_row_divisors, saturating_float_to_int)
from .shape_dialect import resolve_ranked_shapes
from .signless import boolean_access_as_bytes, make_signless
from .parallel import Kernel, outline_parallel_loops, resolve_function_pointers
from .gpu import (device_llvm_ir, device_memory, host_buffers, host_memory_through_the_ral, mark_serial_loops, outline_gpu_kernels,
                  reshapes_with_host_sizes)
from .parameters import hoist_parameters
from ..ops import DIALECTS_LEFT_TO_UPSTREAM
from ..targets import Target

FLATTEN = "inline{default-pipeline=}, symbol-dce"
# torch-mlir's StableHLO computes shapes with the shape dialect; its broadcast constraints were
# proven by torch.export, so they are dropped and the shape arithmetic becomes tensor/arith
SHAPE_TO_STD = ("func.func(shape-to-shape-lowering), func.func(remove-shape-constraints), canonicalize, "
                "convert-shape-to-std, canonicalize, cse")
LEGALIZE_CHLO = "func.func(chlo-legalize-to-stablehlo)"
QUANT_TO_MATH = "func.func(stablehlo-legalize-quant-to-math)"
SIMPLIFY = "func.func(stablehlo-aggressive-simplification), canonicalize, cse"
# dims of op results are rewritten in terms of the operands' dims, so equal dims end up as one SSA value
FUSE = ("canonicalize, cse, linalg-fold-unit-extent-dims, linalg-fuse-elementwise-ops, resolve-ranked-shaped-type-result-dims, canonicalize, cse")
# arith on whole tensors (shape vectors cast to i32) becomes linalg: bufferized as is, an index_cast of a
# tensor would reinterpret the buffer instead of converting each element
TO_LINALG = f"stablehlo-legalize-to-linalg, func.func(convert-elementwise-to-linalg), {FUSE}"
BUFFERIZE = ("eliminate-empty-tensors, one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map "
             "allow-return-allocs-from-loops}, canonicalize")
# buffers are freed after their last use, so the RAL's cache hands their memory to later buffers
FREE_AFTER_LAST_USE = "buffer-deallocation-pipeline, convert-bufferization-to-memref, canonicalize"
TO_LOOPS = "func.func(convert-linalg-to-parallel-loops), resolve-ranked-shaped-type-result-dims"
TO_LLVM = ", ".join([
    "convert-scf-to-cf", "expand-strided-metadata", "lower-affine", "arith-expand", "memref-expand",
    "finalize-memref-to-llvm{use-generic-functions}", "convert-complex-to-standard", "convert-math-to-llvm",
    "convert-math-to-libm", "convert-complex-to-llvm", "convert-arith-to-llvm", "convert-cf-to-llvm",
    "convert-func-to-llvm", "convert-ub-to-llvm", "reconcile-unrealized-casts",
])


@dataclasses.dataclass
class LoweredModule:
    llvm_ir: str
    entry: str
    assertions: list[Assertion]  # empty: no guard function
    shapes: ShapeAnalysis
    kernels: list[Kernel]        # the parallel loop nests, outlined for the RAL thread pool
    params: list[np.ndarray | Deferred]  # the entry's trailing arguments after the signature's (weights)
    device_llvm_ir: str = ""     # GPU targets: the kernels' LLVM IR (NVVM or ROCDL)

    @property
    def guard(self) -> str | None:
        return GUARD_FUNCTION if self.assertions else None


def compile_to_llvm(module: ir.Module, entry_name: str, signature: Signature, target: Target, frontend_facts: tuple[str, ...] = (),
                    frontend_unchecked: tuple[str, ...] = (), constraints: tuple[str, ...] = (),
                    buffer_reuse: bool = True, params: tuple[np.ndarray | Deferred, ...] = ()) -> LoweredModule:
    """`target`: a CPU target, whose vector width the loops are specialised for, or a GPU target
    (the loops become kernels, `LoweredModule.device_llvm_ir`; the rest is host code). `frontend_facts`
    the frontend checks itself (JAX's); `frontend_unchecked` it knows but does not check
    (torch.export's dim ranges); `constraints` the user's. The last two get guards. `params`: the
    entry's arguments after the signature's (the frontend's weights: their data, or `Deferred`
    for those the caller writes into the artifact itself)."""
    with module.context, ir.Location.unknown():
        # 0. user constraints, #stablehlo.bounds and the constraints a saved module carries become shape
        #    assertions (checked by the guard)
        entry = _function(module, entry_name)
        arg_types = list(function_type(entry).inputs)
        saved, saved_facts = load_from_ir(module, signature)  # from a module compiled before
        checked = (saved + [Constraint(c, "torch.export") for c in frontend_unchecked]
                   + [Constraint(c, "user") for c in constraints] + bounds_constraints(signature, arg_types))
        add_constraint_guards(module, entry, signature, checked)
        # 1. flatten: frontends wrap the body in private functions (JAX's _wrapped_jax_export_main)
        run_pipeline(module, f"builtin.module({FLATTEN})", "inlining")
        low_bit = low_bit_types(module)  # 8-, 6- and 4-bit floats: computed in f32 (step 12)
        if low_bit and target.kind != "cpu":
            raise UnsupportedOpError(f"{', '.join(sorted(low_bit))}: 8-, 6- and 4-bit floats are computed on CPUs only")
        # 2. quantized ops become integer and float arithmetic (upstream), and CHLO (erf, erf_inv,
        #    acosh, the broadcasting ops that pass emits, ...) StableHLO; top_k stays a selection (not
        #    a sort)
        protect_top_k(module)
        run_pipeline(module, f"builtin.module({QUANT_TO_MATH}, {LEGALIZE_CHLO})", "CHLO legalization")
        params = [*params, *hoist_parameters(_function(module, entry_name))]  # large constants leave the IR
        # shape-dialect computations (torch-mlir's, and CHLO's broadcasts) become tensor/arith
        resolve_ranked_shapes(module)
        run_pipeline(module, f"builtin.module({SHAPE_TO_STD})", "shape dialect lowering")
        # 3. fold constants and shape computations the frontends leave behind (booleans' sums are
        #    `or` first: folding them as integers would wrap)
        boolean_sums_as_or(module)
        complex_extrema_lexicographic(module)
        complex_cbrt_polar(module)
        reverse_kernels(module)
        remove_optimization_barriers(module)
        fold_constant_converts(module)
        run_pipeline(module, f"builtin.module({SIMPLIFY})", "simplification")
        entry = _function(module, entry_name)
        # 4. symbolic shapes and facts; annotates the ops whose lowering a fact simplifies
        facts = ShapeFacts()
        for c in [Constraint(text, "jax export") for text in frontend_facts] + checked + saved_facts:
            record_fact(facts, c)
        shapes = analyze(entry, signature, facts)
        save_to_ir(module, entry, signature, shapes)
        # 5. shape assertions move into a guard function the host calls before any kernel
        assertions = extract_guard(module, entry)
        run_pipeline(module, "builtin.module(canonicalize)", "guard clean-up")  # the guard keeps only shape math
        _mark_entry_points(module, [entry_name] + ([GUARD_FUNCTION] if assertions else []))
        # 6. our own lowerings: dynamic ops, gather/scatter/sort, control flow, library calls; the facts
        #    are with the analysis (and in the saved module) and the code is not run
        constraint_function(module).erase()
        if target.kind != "cpu":
            module.operation.attributes[GPU_ATTR] = ir.UnitAttr.get()
        transposes_below_slices(module)
        transposes_below_scalar_ops(module)
        lower_module(module)
        run_pipeline(module, f"builtin.module({FLATTEN}, canonicalize)", "inlining lowered ops")
        keep_reads_at_their_calls(module)
        # 7. the rest of StableHLO to linalg (upstream), then nothing of StableHLO may be left
        run_pipeline(module, f"builtin.module({TO_LINALG})", "StableHLO to linalg")
        _check_nothing_left(module, DIALECTS_LEFT_TO_UPSTREAM, "after the StableHLO to linalg conversion")
        scalarize_rank0_generics(module)
        saturating_float_to_int(module)
        forward_uniform_operands(module)
        duplicate_broadcasts(module)
        run_pipeline(module, f"builtin.module(linalg-fuse-elementwise-ops, {FUSE})", "fusion")  # before CSE merges the copies
        make_signless(module)
        # 8. tensors to buffers (the RAL allocates), loops; dims proven equal become one value
        run_pipeline(module, f"builtin.module({BUFFERIZE})", "bufferization")
        copies_to_linalg(module)
        run_pipeline(module, f"builtin.module({TO_LOOPS})", "linalg to loops")
        unify_argument_dims(_function(module, entry_name), shapes)
        emit_contract_checks(module, _function(module, entry_name), shapes)  # reads the dims unify_argument_dims merged
        run_pipeline(module, "builtin.module(canonicalize, cse)", "dims clean-up")
        # 9. loops over the same rows fuse, and run behind the library call (GEMM, convolution)
        #    whose rows they consume; rows are what the thread pool splits (CPU: GPU kernels map
        #    every dim of a loop to threads)
        fuse_loops(module)  # GPUs: a fused row (softmax, layer norm) is one block's work
        if target.kind == "cpu":
            fuse_epilogues(module)
            schedule_column_reductions(module, target.vector_elements())
            flatten_contiguous_loops(module, _function(module, entry_name), argument_dim_sources(shapes))
            collapse_rows(module)
        accumulate_in_registers(module)  # GPUs: the form cooperative reductions are recognised in
        if target.kind == "cpu":
            hoist_invariant_loads(module)
        integer_powers_as_products(module)
        reciprocals_of_row_divisors(module)
        if target.kind == "cpu":
            version_broadcasts(module)
        run_pipeline(module, "builtin.module(loop-invariant-code-motion, canonicalize, cse)", "loop clean-up")
        if target.kind == "cpu":
            prefetch_next_rows(module)
        else:
            reshapes_with_host_sizes(module)
            mark_serial_loops(module, (GUARD_FUNCTION,))
            host_buffers(module)
        # 10. buffers freed after their last use, shared when of equal size, placed in an arena when bounded
        if buffer_reuse:
            run_pipeline(module, f"builtin.module({FREE_AFTER_LAST_USE})", "buffer deallocation")
            free_after_last_use(module)
            shared = reuse_equal_buffers(module)
            shapes.uses.append(f"{shared} dynamically sized buffer(s) take the storage of a freed buffer of provably equal size")
            for name in [entry_name] + ([GUARD_FUNCTION] if assertions else []):  # both take the entry's arguments
                plan_arena(_function(module, name), shapes)
        # 11. outermost parallel loops run on the RAL thread pool, or become GPU kernels the host
        #     launches (its own reads of tensors then go through the RAL)
        device, constants = None, {}
        if target.kind == "cpu":
            kernels = outline_parallel_loops(module)
        else:  # copies buffer deallocation added become loops too
            copies_to_linalg(module)
            run_pipeline(module, f"builtin.module({TO_LOOPS})", "copies to loops")
            kernels, device = outline_gpu_kernels(module, warps=target.kind == "cuda")
            constants = host_memory_through_the_ral(module, (GUARD_FUNCTION,))
        shapes.uses += [f"{k.name} ({k.kind}) relies on {', '.join(k.relies_on)}" for k in kernels if k.relies_on]
        run_pipeline(module, f"builtin.module({FLATTEN}, canonicalize)", "inlining parallel loop bodies")
        # 12. sizes computed at run time are checked before the host code allocates them
        check_allocation_sizes(module, [entry_name] + ([GUARD_FUNCTION] if assertions else []))
        if low_bit:
            run_pipeline(module, f"builtin.module({emulation_pipeline(low_bit)})", "8-, 6- and 4-bit floats in f32")
            expand_conversions(module)
            run_pipeline(module, f"builtin.module({FLATTEN}, canonicalize)", "inlining their conversions")
        if target.kind == "cpu":  # after the kernels' descriptions (they name exp, not its arithmetic)
            exp_inline(module)
            interleave_long_loops(module, [k.name for k in kernels])  # counts exp's arithmetic
            blocked_float_sums(module)
        run_pipeline(module, f"builtin.module({TO_LLVM})", "lowering to LLVM")
        resolve_function_pointers(module)
        if device is not None:
            device_memory(module, constants, (GUARD_FUNCTION,))
        _finish_llvm_dialect(module)
        _leave_straight_line_host_code(module, [entry_name] + ([GUARD_FUNCTION] if assertions else []))
        verify(module, "translation to LLVM IR")
        llvm_ir = str(translate_module_to_llvmir(module.operation))
        # the packed entry points artifacts are called through (docs/artifact.md)
        num_args = len(signature.args) + len(params)
        llvm_ir += _packed_entry(ENTRY, entry_name, num_args, len(signature.results))
        if assertions:
            llvm_ir += _packed_entry(GUARD, GUARD_FUNCTION, num_args, 1)
        device_ir = device_llvm_ir(device, target) if device is not None else ""
        return LoweredModule(llvm_ir, entry_name, assertions, shapes, kernels, params, device_ir)


def _packed_entry(name: str, function: str, num_args: int, num_results: int) -> str:
    """LLVM IR of `void name(ptr args, ptr results)`, which calls the C interface of `function`
    with `args[0..num_args)` (pointers to memref descriptors) after the results' pointer. Left
    unoptimised as the rest of the straight-line host code (`_leave_straight_line_host_code`):
    the host code's part then gets the quick code generator (`codegen.codegen_level`)."""
    lines = [f"define void @{name}(ptr %args, ptr %results) noinline optnone {{"]
    for i in range(num_args):
        lines += [f"  %p{i} = getelementptr inbounds ptr, ptr %args, i64 {i}", f"  %a{i} = load ptr, ptr %p{i}"]
    operands = (["ptr %results"] if num_results else []) + [f"ptr %a{i}" for i in range(num_args)]
    lines += [f"  call void @_mlir_ciface_{function}({', '.join(operands)})", "  ret void", "}"]
    return "\n" + "\n".join(lines) + "\n"


def _function(module: ir.Module, name: str) -> ir.Operation:
    func = find_function(module, name)
    if func is None:
        raise CompileError(f"function @{name} not found")
    return func


def _mark_entry_points(module: ir.Module, names: list[str]) -> None:
    """Entry points get a C interface, and their arguments are never written (the caller's)."""
    for name in names:
        func = _function(module, name)
        func.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        n = len(function_type(func).inputs)
        read_only = ir.DictAttr.get({"bufferization.writable": ir.BoolAttr.get(False)})
        func.attributes["arg_attrs"] = ir.ArrayAttr.get([read_only] * n)
        if "res_attrs" in func.attributes:
            del func.attributes["res_attrs"]


def _check_nothing_left(module: ir.Module, prefixes: tuple[str, ...], when: str) -> None:
    left = [op for op in walk(module.operation) if op.name.startswith(prefixes)]
    if left:
        kinds = sorted({op.name for op in left})
        raise UnsupportedOpError(f"unsupported op{'s' if len(kinds) > 1 else ''} {', '.join(kinds)} {when}; first: {describe(left[0])}")


def _leave_straight_line_host_code(module: ir.Module, entries: list[str]) -> None:
    """Host functions without loops (shape arithmetic, allocations, descriptor packing and calls:
    half the encoder's LLVM IR) are not optimised: LLVM then takes 0.1 s less on the encoder and
    its calls are as fast (the kernels they launch are what takes time). Loops stay optimised.
    Their blocks are cut into blocks of at most HOST_BLOCK_OPS ops (`_cut_long_blocks`)."""
    names = set(entries) | {f"_mlir_ciface_{e}" for e in entries}
    for op in module.body.operations:
        op = op.operation
        if op.name != "llvm.func" or ir.StringAttr(op.attributes["sym_name"]).value not in names:
            continue
        position = {b: i for i, b in enumerate(op.regions[0].blocks)}
        if any(position[succ] <= i for b, i in position.items() for o in b.operations for succ in o.operation.successors):
            continue  # a back edge: a loop
        op.attributes["no_inline"] = ir.UnitAttr.get()
        op.attributes["optimize_none"] = ir.UnitAttr.get()
        _cut_long_blocks(op)


HOST_BLOCK_OPS = 256


def _cut_long_blocks(func: ir.Operation) -> None:
    """LLVM's instruction selection takes time quadratic in a block's length: the entry block of
    EfficientNetV2-S's host code (7500 instructions, most of them packing the descriptors of 500
    weights) took 43 s, cut into blocks of 256 ops (each branching to the next) 0.7 s."""
    for block in list(func.regions[0].blocks):
        ops = list(block.operations)
        chunks = [ops[i:i + HOST_BLOCK_OPS] for i in range(0, len(ops), HOST_BLOCK_OPS)]
        blocks = [block]
        for chunk in chunks[1:]:
            blocks.append(blocks[-1].create_after())
            for op in chunk:  # each op moved once
                blocks[-1].append(op.operation)
        for before, after in zip(blocks, blocks[1:]):
            with ir.InsertionPoint(before), func.location:
                ir.Operation.create("llvm.br", successors=[after], operands=[])


def _finish_llvm_dialect(module: ir.Module) -> None:
    """In one walk over the module in the LLVM dialect (its largest form: four walks of it were
    3 % of the compile): booleans in memory accessed as bytes, `contract` on float arithmetic,
    and the check that nothing but LLVM is left."""
    parsed: dict[str, ir.Attribute] = {}
    left = []
    for op in walk(module.operation):
        if op.name in ("llvm.load", "llvm.store"):
            boolean_access_as_bytes(op)
        elif op.name in CONTRACTED:
            contract(op, parsed)
        elif not op.name.startswith(("llvm.", "builtin.module")):
            left.append(op)
    if left:
        raise CompileError(f"lowering to LLVM left {sorted({op.name for op in left})}; first: {describe(left[0])}")
