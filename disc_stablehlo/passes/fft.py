"""`stablehlo.fft` (FFT, IFFT, RFFT, IRFFT over the last 1-3 dims) as a call of the RAL's
`disc_ral_fft` on contiguous buffers: the leading dims are the batch (any sizes, dynamic too), the
transform's lengths are the op's `fft_length`. An operand whose transformed dims are dynamic is
checked at run time to have the lengths the transform reads (IRFFT: n/2+1 in the last). The RAL's
FFT runs on the host: GPU targets have none yet."""

from __future__ import annotations

from torch_mlir import ir

from ..errors import UnsupportedOpError
from ..mlir_support import describe, int_list
from .library_calls import _memref_type, _product, contiguous_buffer, pointer
from .lower import GPU_ATTR, LoweringState, Text, register_template

FFT_KINDS = {"FFT": 0, "IFFT": 1, "RFFT": 2, "IRFFT": 3}  # disc_ral_fft's `kind`


@register_template("stablehlo.fft")
def _fft(op, t: Text, state: LoweringState):
    if GPU_ATTR in state.module.operation.attributes:
        raise UnsupportedOpError(f"stablehlo.fft has no GPU lowering yet (the RAL's FFT runs on the host): {describe(op)}")
    kind = next(k for name, k in FFT_KINDS.items() if f"fft_type {name}>" in str(op.attributes["fft_type"]))
    lengths = int_list(op, "fft_length")
    in_t, out_t = ir.RankedTensorType(op.operands[0].type), ir.RankedTensorType(op.result.type)
    in_elem, out_elem = str(in_t.element_type), str(out_t.element_type)
    rank, batch_rank = len(lengths), in_t.rank - len(lengths)
    dims = t.dims("%a0", in_t)
    for i, n in enumerate(lengths):
        want = n // 2 + 1 if kind == FFT_KINDS["IRFFT"] and i == rank - 1 else n
        if in_t.is_dynamic_dim(batch_rank + i):
            got = dims[batch_rank + i]
            t.check(state, op, t(f"arith.cmpi ne, {got}, {t.const(want)} : index"),
                    f"operand dim {batch_rank + i} is {{0}}, the transform of fft_length {lengths} reads {{1}}", got, t.const(want))
    out_lengths = [n // 2 + 1 if kind == FFT_KINDS["RFFT"] and i == rank - 1 else n for i, n in enumerate(lengths)]
    out_dims = dims[:batch_rank] + [t.const(n) for n in out_lengths]
    buffer, btype = contiguous_buffer(t, "%a0", in_t, in_elem)
    mtype = _memref_type(out_t, out_elem)
    out = t(f"memref.alloc({', '.join(d for i, d in enumerate(out_dims) if out_t.is_dynamic_dim(i))}) : {mtype}")
    sizes = [t(f"arith.index_cast {d} : index to i64") for d in [_product(t, dims[:batch_rank]), t.const(rank)]
             + [t.const(n) for n in (lengths + [0, 0])[:3]]]
    args = [t(f"arith.constant {kind} : i64"), t(f"arith.constant {int('f64' in in_elem)} : i64"), *sizes,
            pointer(t, buffer, btype, in_elem)[0], pointer(t, out, mtype, out_elem)[0]]
    sig = "(i64, i64, i64, i64, i64, i64, i64, !llvm.ptr, !llvm.ptr) -> ()"
    t.emit(f"func.call @disc_ral_fft({', '.join(args)}) : {sig}")
    t.declarations.append(f"func.func private @disc_ral_fft{sig.replace(' -> ()', '')}")
    return [t(f"bufferization.to_tensor {out} restrict writable : {mtype} to {out_t}")]
