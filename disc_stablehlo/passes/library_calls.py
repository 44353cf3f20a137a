"""Compute-intensive ops go to vendor libraries through the RAL (as in BladeDISC): f32/f64
`dot_general` becomes a batched GEMM call on [batch, m, k] x [batch, k, n] strided views."""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from .lower import LoweringState, Text, register_rewrite

GEMM_ELEMENT_TYPES = {"f32": 4, "f64": 8}


def _pointer(t: Text, buffer: str, btype: str, elem: str) -> tuple[str, list[str]]:
    """The address of a buffer's first element and its strides."""
    rank = 3
    meta = t.fresh("meta")
    sizes = ", ".join(["index"] * (1 + 2 * rank))
    t.emit(f"{meta}:{2 + 2 * rank} = memref.extract_strided_metadata {buffer} : {btype} -> memref<{elem}>, {sizes}")
    base = t(f"memref.extract_aligned_pointer_as_index {meta}#0 : memref<{elem}> -> index")
    off = t(f"arith.muli {meta}#1, {t.const(GEMM_ELEMENT_TYPES[elem])} : index")
    addr = t(f"arith.index_cast {t(f'arith.addi {base}, {off} : index')} : index to i64")
    return t(f"llvm.inttoptr {addr} : i64 to !llvm.ptr"), [
        t(f"arith.index_cast {meta}#{2 + rank + i} : index to i64") for i in range(rank)]


def _product(t: Text, dims: list[str]) -> str:
    acc = t.const(1)
    for d in dims:
        acc = t(f"arith.muli {acc}, {d} : index")
    return acc


def _as_3d(t: Text, value: str, vtype: ir.Type, perm: list[int], groups: list[list[int]], elem: str) -> tuple[str, list[str]]:
    """Transposes `value` so the groups are contiguous and reshapes it to 3-D [g0, g1, g2]."""
    rt = ir.RankedTensorType(vtype)
    dims = t.dims(value, vtype)
    ttype = str(vtype)
    if perm != list(range(rt.rank)):
        ttype = f"tensor<{''.join(f'{rt.shape[p] if not rt.is_dynamic_dim(p) else chr(63)}x' for p in perm)}{elem}>"
        value = t(f"stablehlo.transpose {value}, dims = {perm} : ({vtype}) -> {ttype}")
    sizes = [_product(t, [dims[d] for d in g]) for g in groups]
    shape = t(f"tensor.from_elements {', '.join(sizes)} : tensor<3xindex>")
    return t(f"tensor.reshape {value}({shape}) : ({ttype}, tensor<3xindex>) -> tensor<?x?x?x{elem}>"), sizes


def _unflatten(t: Text, c: str, elem: str, out_t: ir.RankedTensorType, group_sizes: list[int], out_dims: list[str]) -> str:
    """The [batch, m, n] product as the result's dims: size-1 dims of empty groups collapse away,
    the rest expand into their groups (reshapes whose result dims fold to `out_dims`, so loops
    over the result get the same bounds as loops over its operands)."""
    starts = [sum(group_sizes[:i]) for i in range(3)]
    kept = [i for i in range(3) if group_sizes[i]]
    collapse, current = [], []
    for i in range(3):  # every empty group joins the next kept dim (the last kept one, at the end)
        current.append(i)
        if group_sizes[i]:
            collapse.append(current)
            current = []
    if current and collapse:
        collapse[-1] += current
    sizes = []
    for g in kept:
        dims = [out_t.shape[d] for d in range(starts[g], starts[g] + group_sizes[g])]
        sizes.append("?" if any(out_t.is_dynamic_dim(d) for d in range(starts[g], starts[g] + group_sizes[g]))
                     else str(_static_product(dims)))
    collapsed_dyn = f"tensor<{'?x' * len(kept)}{elem}>"
    flat = t(f"tensor.collapse_shape {c} {collapse} : tensor<?x?x?x{elem}> into {collapsed_dyn}")
    if not kept:
        return flat
    collapsed = f"tensor<{''.join(x + 'x' for x in sizes)}{elem}>"
    if collapsed != collapsed_dyn:
        flat = t(f"tensor.cast {flat} : {collapsed_dyn} to {collapsed}")
    expand = [list(range(starts[g], starts[g] + group_sizes[g])) for g in kept]
    shape = ", ".join(str(out_t.shape[d]) if not out_t.is_dynamic_dim(d) else out_dims[d] for d in range(out_t.rank))
    return t(f"tensor.expand_shape {flat} {expand} output_shape [{shape}] : {collapsed} into {out_t}")


def _static_product(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _is_blas_dot(op: ir.Operation) -> bool:
    """f32/f64 dots go to the BLAS; other element types to the upstream conversion's loops."""
    types = {str(ir.RankedTensorType(v.type).element_type) for v in [*op.operands, op.result]}
    return len(types) == 1 and types <= GEMM_ELEMENT_TYPES.keys()


@register_rewrite("stablehlo.dot_general", when=_is_blas_dot)
def _dot_general(op: ir.Operation, state: LoweringState) -> None:
    elem = str(ir.RankedTensorType(op.result.type).element_type)
    lhs_t, rhs_t = (ir.RankedTensorType(v.type) for v in op.operands)
    dn = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, lc = list(dn.lhs_batching_dimensions), list(dn.lhs_contracting_dimensions)
    rb, rc = list(dn.rhs_batching_dimensions), list(dn.rhs_contracting_dimensions)
    lf = [d for d in range(lhs_t.rank) if d not in lb and d not in lc]
    rf = [d for d in range(rhs_t.rank) if d not in rb and d not in rc]
    t = Text()
    a, (b, m, k) = _as_3d(t, "%a0", lhs_t, lb + lf + lc, [lb, lf, lc], elem)
    bb, (_, _, n) = _as_3d(t, "%a1", rhs_t, rb + rc + rf, [rb, rc, rf], elem)
    dyn3 = f"tensor<?x?x?x{elem}>"
    strided = f"memref<?x?x?x{elem}, strided<[?, ?, ?], offset: ?>>"
    ma = t(f"bufferization.to_buffer {a} read_only : {dyn3} to {strided}")
    mb = t(f"bufferization.to_buffer {bb} read_only : {dyn3} to {strided}")
    mc = t(f"memref.alloc({b}, {m}, {n}) : memref<?x?x?x{elem}>")
    pa, sa = _pointer(t, ma, strided, elem)
    pb, sb = _pointer(t, mb, strided, elem)
    pc, _ = _pointer(t, mc, f"memref<?x?x?x{elem}>", elem)
    b64, m64, n64, k64 = (t(f"arith.index_cast {d} : index to i64") for d in (b, m, n, k))
    fn = f"disc_ral_gemm_{elem}"
    sig = "(i64, i64, i64, i64, !llvm.ptr, i64, i64, i64, !llvm.ptr, i64, i64, i64, !llvm.ptr) -> ()"
    t.emit(f"func.call @{fn}({b64}, {m64}, {n64}, {k64}, {pa}, {', '.join(sa)}, {pb}, {', '.join(sb)}, {pc}) : {sig}")
    c = t(f"bufferization.to_tensor {mc} restrict writable : memref<?x?x?x{elem}> to {dyn3}")
    out_dims = [t.dim("%a0", lhs_t, d) for d in lb + lf] + [t.dim("%a1", rhs_t, d) for d in rf]
    result = _unflatten(t, c, elem, ir.RankedTensorType(op.result.type), [len(lb), len(lf), len(rf)], out_dims)
    t.emit(f"return {result} : {op.result.type}")
    t.declarations.append(f"func.func private @{fn}{sig.replace(' -> ()', '')}")
    name = state.fresh_symbol("gemm")
    state.replace_with_call(op, t.function(name, op), name)
