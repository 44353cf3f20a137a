"""JAX's LAPACK custom calls on the CPU (`jnp.linalg.solve`, `inv`, `det`, `cholesky`, `qr`,
`eigh`, `svd`, `eig`, `jax.scipy.linalg.lu`, `solve_triangular`: `lapack_<t><routine>_ffi`) as
calls of the RAL's `disc_ral_lapack`, which runs the LAPACK of the BLAS the runtime loaded.

JAX states the calls' matrices column-major (`operand_layouts` / `result_layouts`, as LAPACK
reads them), their results' dims in shape operands (`indices_of_shape_operands`) where they are
dynamic, and the routine's character arguments in `mhlo.backend_config`. The RAL takes row-major
buffers and transposes each matrix itself; the results' dims are computed from the operands'
(ops.lapack_result_dims, which the shape analysis uses too), and what the routine assumes of its
operands (square matrices, equal batch dims) is checked at run time."""

from __future__ import annotations

from torch_mlir import ir

from ..errors import UnsupportedOpError
from ..mlir_support import call_target, describe, int_list
from ..ops import LAPACK_ROUTINES, lapack_result_dims, lapack_routine
from .library_calls import _memref_type, _product, contiguous_buffer, pointer
from .lower import GPU_ATTR, LoweringState, Text, register_template

# the backend_config attributes of each routine, in the order disc_ral_lapack's `flags` takes them,
# with the characters each may be
_UPLO, _EIG_MODE = ("uplo", "LU"), ("mode", "VN")
FLAGS = {"potrf": (_UPLO,), "trsm": (("side", "LR"), _UPLO, ("trans_x", "NTC"), ("diag", "UN")), "syevd": (_EIG_MODE, _UPLO),
         "heevd": (_EIG_MODE, _UPLO), "gesdd": (("mode", "ASN"),), "gesvd": (("mode", "ASN"),),
         "geev": (("compute_left", "VN"), ("compute_right", "VN"))}


def _is_lapack(op: ir.Operation) -> bool:
    return lapack_routine(call_target(op)) is not None


def lapack_characters(op: ir.Operation, routine: str) -> str:
    """The routine's character arguments: ui8 attributes of the typed-FFI call's backend_config
    (`mhlo.backend_config` as JAX emits it, `backend_config` once serialized)."""
    config = next((op.attributes[a] for a in ("backend_config", "mhlo.backend_config")
                   if a in op.attributes and isinstance(op.attributes[a], ir.DictAttr)), None)
    chars = []
    for name, allowed in FLAGS.get(routine, ()):
        if config is None or name not in config:
            raise UnsupportedOpError(f"{call_target(op)} without its `{name}` in backend_config: {describe(op)}")
        chars.append(chr(ir.IntegerAttr(config[name]).value))
        if chars[-1] not in allowed:
            raise UnsupportedOpError(f"{call_target(op)}: `{name}` is {chars[-1]!r}, expected one of {', '.join(allowed)}: {describe(op)}")
    return "".join(chars)


def _shape_operands(op: ir.Operation) -> list[int]:
    return int_list(op, "indices_of_shape_operands")


def _check_layouts(op: ir.Operation, values: list[ir.Value], attr: str) -> None:
    """Matrices (the first operand's rank) column-major, batch dims outermost; other values
    row-major: the layouts JAX states. Any other layout means other semantics."""
    rank = ir.RankedTensorType(op.operands[0].type).rank
    layouts = list(ir.ArrayAttr(op.attributes[attr])) if attr in op.attributes else None
    for i, v in enumerate(values):
        r = ir.RankedTensorType(v.type).rank
        want = [rank - 2, rank - 1, *range(rank - 3, -1, -1)] if r == rank else list(range(r - 1, -1, -1))
        got = [int(x) for x in ir.DenseIntElementsAttr(layouts[i])] if layouts is not None else None
        if got != want:
            raise UnsupportedOpError(f"{call_target(op)}: {attr}[{i}] is {got}, expected {want} (JAX's column-major matrices): "
                                     f"{describe(op)}")


@register_template("stablehlo.custom_call", when=_is_lapack)
def _lapack(op, t: Text, state: LoweringState):
    target = call_target(op)
    if GPU_ATTR in state.module.operation.attributes:
        raise UnsupportedOpError(f"{target} is a CPU LAPACK call (JAX exports cuSOLVER calls for GPUs): {describe(op)}")
    routine, type_code = lapack_routine(target)
    shape_indices = _shape_operands(op)
    positions = [i for i in range(len(op.operands)) if i not in shape_indices]
    data = [op.operands[i] for i in positions]
    if len(data) != (2 if routine in ("trsm", "orgqr", "ungqr") else 1):
        raise UnsupportedOpError(f"{target}: unexpected operands: {describe(op)}")
    _check_layouts(op, data, "operand_layouts")
    _check_layouts(op, list(op.results), "result_layouts")
    chars = lapack_characters(op, routine)
    a_t = ir.RankedTensorType(data[0].type)
    if a_t.rank < 2:
        raise UnsupportedOpError(f"{target} takes matrices: {describe(op)}")
    a_dims = t.dims(f"%a{positions[0]}", a_t)
    *batch, m, n = a_dims
    k = t(f"arith.minsi {m}, {n} : index")
    b_name = f"%a{positions[1]}" if len(data) == 2 else None
    b_dims = t.dims(b_name, data[1].type) if b_name else []

    def contract(a: str, b: str, what: str) -> None:
        t.check(state, op, t(f"arith.cmpi ne, {a}, {b} : index"), f"{target}: {what}", a, b)

    def given(i: int) -> list[str]:
        """Result i's dims: static ones from its type, dynamic ones from its shape operand."""
        rt = ir.RankedTensorType(op.results[i].type)
        if rt.has_static_shape:
            return [t.const(d) for d in rt.shape]
        if i >= len(shape_indices):
            raise UnsupportedOpError(f"{target}: result {i} has dynamic dims and no shape operand: {describe(op)}")
        shape = op.operands[shape_indices[i]]
        return [t.const(rt.shape[j]) if not rt.is_dynamic_dim(j)
                else t.extract_index(f"%a{shape_indices[i]}", shape.type, [t.const(j)]) for j in range(rt.rank)]

    if routine in ("potrf", "syevd", "heevd", "geev"):
        contract(m, n, "the matrix is {0} x {1}, the routine takes square ones")
    if b_name:
        for i, d in enumerate(batch):
            contract(d, b_dims[i], f"batch dim {i} of the operands: {{0}} and {{1}}")
    if routine == "trsm":
        order = b_dims[-2] if chars[0] == "L" else b_dims[-1]
        contract(m, n, "the triangular matrix is {0} x {1}, it must be square")
        contract(m, order, "the triangular matrix's order is {0}, the right-hand sides' matching dim {1}")
    p = q = t.const(0)
    if routine in ("orgqr", "ungqr"):
        p = b_dims[-1]
        contract(t(f"arith.minsi {n}, {m} : index"), n, "Q of {1} columns from {0} rows: LAPACK needs rows >= columns")
        contract(t(f"arith.minsi {p}, {n} : index"), p, "{1} reflectors for {0} columns: at most one per column")
    dims = lapack_result_dims(routine, type_code >= 2, chars[:1], a_dims, b_dims, k, given)
    if routine in ("gesdd", "gesvd"):  # u is m x p, vt q x n (as given when no vectors are computed: checked)
        p, q = dims[2][-1], dims[3][-2]
        contract(dims[2][-2], m, "u has {0} rows, the matrix {1}")
        contract(dims[3][-1], n, "vt has {0} columns, the matrix {1}")
    results = []
    for i, r in enumerate(op.results):
        rt = ir.RankedTensorType(r.type)
        for j, d in enumerate(dims[i]):
            if not rt.is_dynamic_dim(j):
                contract(d, t.const(rt.shape[j]), f"result {i}'s dim {j} is {{0}}, its type says {{1}}")
        elem = str(rt.element_type)
        mtype = _memref_type(rt, elem)
        buf = t(f"memref.alloc({', '.join(d for j, d in enumerate(dims[i]) if rt.is_dynamic_dim(j))}) : {mtype}")
        results.append((buf, mtype, elem, rt))
    pointers = []
    for i, v in zip(positions, data):
        elem = str(ir.RankedTensorType(v.type).element_type)
        buffer, btype = contiguous_buffer(t, f"%a{i}", v.type, elem)
        pointers.append(pointer(t, buffer, btype, elem)[0])
    null = t("llvm.mlir.zero : !llvm.ptr")
    pointers += [null] * (2 - len(pointers))
    pointers += [pointer(t, buf, mtype, elem)[0] for buf, mtype, elem, _ in results]
    pointers += [null] * (7 - len(pointers))
    flags = sum(ord(c) << (8 * i) for i, c in enumerate(chars))
    sizes = [t(f"arith.constant {v} : i64") for v in (LAPACK_ROUTINES[routine], type_code, flags)]
    rows, cols = b_dims[-2:] if routine == "trsm" else (m, n)  # the matrix the routine overwrites
    sizes += [t(f"arith.index_cast {d} : index to i64") for d in (_product(t, batch), rows, cols, p, q)]
    sig = "(i64, i64, i64, i64, i64, i64, i64, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()"
    t.emit(f"func.call @disc_ral_lapack({', '.join(sizes + pointers)}) : {sig}")
    t.declarations.append(f"func.func private @disc_ral_lapack{sig.replace(' -> ()', '')}")
    return [t(f"bufferization.to_tensor {buf} restrict writable : {mtype} to {rt}") for buf, mtype, _, rt in results]

