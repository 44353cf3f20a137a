"""`stablehlo.fft` (FFT, IFFT, RFFT, IRFFT over the last 1-3 dims) as a call of the RAL's
`disc_ral_fft` on contiguous buffers: the leading dims are the batch (any sizes, dynamic too), the
transform's lengths are the op's `fft_length`. An operand whose transformed dims are dynamic is
checked at run time to have the lengths the transform reads (IRFFT: n/2+1 in the last). PyTorch's
transforms (`ops.FFT_TARGET`) take the same call along their last signal dim, lengths read at run
time. The RAL's FFT runs on the host: GPU targets have none yet."""

from __future__ import annotations

from torch_mlir import ir

from ..errors import UnsupportedOpError
from ..mlir_support import call_target, describe, int_list
from ..ops import FFT_KIND_ATTR, FFT_KINDS, FFT_TARGET
from .library_calls import _memref_type, _product, contiguous_buffer, pointer
from .lower import GPU_ATTR, LoweringState, Text, register_template



@register_template("stablehlo.fft")
def _fft(op, t: Text, state: LoweringState):
    _on_the_host(op, state)
    kind = next(k for name, k in FFT_KINDS.items() if f"fft_type {name}>" in str(op.attributes["fft_type"]))
    lengths = int_list(op, "fft_length")
    in_t, out_t = ir.RankedTensorType(op.operands[0].type), ir.RankedTensorType(op.result.type)
    rank, batch_rank = len(lengths), in_t.rank - len(lengths)
    dims = t.dims("%a0", in_t)
    for i, n in enumerate(lengths):
        want = n // 2 + 1 if kind == FFT_KINDS["IRFFT"] and i == rank - 1 else n
        if in_t.is_dynamic_dim(batch_rank + i):
            got = dims[batch_rank + i]
            t.check(state, op, t(f"arith.cmpi ne, {got}, {t.const(want)} : index"),
                    f"operand dim {batch_rank + i} is {{0}}, the transform of fft_length {lengths} reads {{1}}", got, t.const(want))
    out_lengths = [n // 2 + 1 if kind == FFT_KINDS["RFFT"] and i == rank - 1 else n for i, n in enumerate(lengths)]
    return [_ral_fft(t, kind, in_t, out_t, dims[:batch_rank], [t.const(n) for n in lengths],
                     dims[:batch_rank] + [t.const(n) for n in out_lengths])]


def _is_torch_fft(op: ir.Operation) -> bool:
    return call_target(op) == FFT_TARGET


@register_template("stablehlo.custom_call", when=_is_torch_fft)
def _torch_fft(op, t: Text, state: LoweringState):
    """PyTorch's transforms (ops.FFT_TARGET): along the last signal dim, complex values as pairs
    (the RAL's complex layout), the length from the data's dims (an inverse real transform's from
    its operand, checked against the n // 2 + 1 frequencies it reads)."""
    _on_the_host(op, state)
    kind = ir.IntegerAttr(op.attributes[FFT_KIND_ATTR]).value
    in_t, out_t = ir.RankedTensorType(op.operands[0].type), ir.RankedTensorType(op.result.type)
    dims = t.dims("%a0", in_t)
    two = t.const(2)
    if kind == FFT_KINDS["RFFT"]:
        lead, n = dims[:-1], dims[-1]
        out_dims = lead + [t(f"arith.addi {t(f'arith.divui {n}, {two} : index')}, {t.const(1)} : index"), two]
    elif kind == FFT_KINDS["IRFFT"]:
        lead, n = dims[:-2], t.extract_index("%a1", op.operands[1].type)
        half = t(f"arith.addi {t(f'arith.divui {n}, {two} : index')}, {t.const(1)} : index")
        t.check(state, op, t(f"arith.cmpi ne, {dims[-2]}, {half} : index"),
                "the spectrum has {0} frequencies, the inverse real transform reads {1}", dims[-2], half)
        out_dims = lead + [n]
    else:
        lead, n = dims[:-2], dims[-2]
        out_dims = dims
    return [_ral_fft(t, kind, in_t, out_t, lead, [n], out_dims)]


def _on_the_host(op: ir.Operation, state: LoweringState) -> None:
    if GPU_ATTR in state.module.operation.attributes:
        raise UnsupportedOpError(f"Fourier transforms have no GPU lowering yet (the RAL's FFT runs on the host): {describe(op)}")


def _ral_fft(t: Text, kind: int, in_t: ir.RankedTensorType, out_t: ir.RankedTensorType, batch: list[str], lengths: list[str],
             out_dims: list[str]) -> str:
    """A call of the RAL's `disc_ral_fft` from the contiguous operand into a new buffer of
    `out_dims`: `batch` the dims of the transforms, `lengths` (index values) the transformed ones."""
    in_elem, out_elem = str(in_t.element_type), str(out_t.element_type)
    buffer, btype = contiguous_buffer(t, "%a0", in_t, in_elem)
    mtype = _memref_type(out_t, out_elem)
    out = t(f"memref.alloc({', '.join(d for i, d in enumerate(out_dims) if out_t.is_dynamic_dim(i))}) : {mtype}")
    sizes = [t(f"arith.index_cast {d} : index to i64") for d in [_product(t, batch), t.const(len(lengths))]
             + (lengths + [t.const(0)] * 2)[:3]]
    args = [t(f"arith.constant {kind} : i64"), t(f"arith.constant {int('f64' in in_elem)} : i64"), *sizes,
            pointer(t, buffer, btype, in_elem)[0], pointer(t, out, mtype, out_elem)[0]]
    sig = "(i64, i64, i64, i64, i64, i64, i64, !llvm.ptr, !llvm.ptr) -> ()"
    t.emit(f"func.call @disc_ral_fft({', '.join(args)}) : {sig}")
    t.declarations.append(f"func.func private @disc_ral_fft{sig.replace(' -> ()', '')}")
    return t(f"bufferization.to_tensor {out} restrict writable : {mtype} to {out_t}")
