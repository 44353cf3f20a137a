"""The signature of a compiled function: per argument and result a shape whose dims are ints or
dimension-variable names, and a dtype, and the messages of its run-time guard. Arguments are
checked against it before any kernel runs. The run-time side reads this module: MLIR is only
imported by the functions that read a signature off a module."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Sequence

import ml_dtypes
import numpy as np

from ..errors import CompileError, ShapeError

if TYPE_CHECKING:
    from torch_mlir import ir

# MLIR element type -> numpy dtype. One table, used both ways.
ELEMENT_TYPES: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8),
    "ui16": np.dtype(np.uint16),
    "ui32": np.dtype(np.uint32),
    "ui64": np.dtype(np.uint64),
    "complex<f32>": np.dtype(np.complex64),
    "complex<f64>": np.dtype(np.complex128),
    # sub-byte integers and 8-, 6- and 4-bit floats: a byte each, the value's bits in its low bits
    # (ml_dtypes' layout, and LLVM's for a store of such an integer)
    "i2": np.dtype(ml_dtypes.int2),
    "i4": np.dtype(ml_dtypes.int4),
    "ui2": np.dtype(ml_dtypes.uint2),
    "ui4": np.dtype(ml_dtypes.uint4),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "f8E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "f8E4M3B11FNUZ": np.dtype(ml_dtypes.float8_e4m3b11fnuz),
    "f8E3M4": np.dtype(ml_dtypes.float8_e3m4),
    "f8E4M3": np.dtype(ml_dtypes.float8_e4m3),
    "f8E8M0FNU": np.dtype(ml_dtypes.float8_e8m0fnu),
    "f6E2M3FN": np.dtype(ml_dtypes.float6_e2m3fn),
    "f6E3M2FN": np.dtype(ml_dtypes.float6_e3m2fn),
    "f4E2M1FN": np.dtype(ml_dtypes.float4_e2m1fn),
}

Dim = int | str  # a static size, or the name of a dimension variable


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    name: str
    shape: tuple[Dim, ...]
    dtype: np.dtype

    def describe(self) -> str:
        return f"{self.dtype.name}[{', '.join(str(d) for d in self.shape)}]"


@dataclasses.dataclass(frozen=True)
class Signature:
    args: tuple[ArgSpec, ...]
    results: tuple[ArgSpec, ...]

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        """Rejects a wrong argument count, rank, dtype, static size or an inconsistent
        dimension variable, naming the argument and the dim."""
        if len(arrays) != len(self.args):
            raise ShapeError(f"expected {len(self.args)} arguments ({', '.join(a.describe() for a in self.args)}), got {len(arrays)}")
        seen: dict[str, tuple[int, str, int]] = {}  # dimension variable -> its size, and the argument and dim it came from
        for spec, arr in zip(self.args, arrays):
            if arr.dtype != spec.dtype:
                raise ShapeError(f"argument '{spec.name}': expected dtype {spec.dtype.name}, got {arr.dtype.name}")
            if arr.ndim != len(spec.shape):
                raise ShapeError(f"argument '{spec.name}': expected rank {len(spec.shape)} ({spec.describe()}), got shape {tuple(arr.shape)}")
            for i, (want, got) in enumerate(zip(spec.shape, arr.shape)):
                if isinstance(want, int):
                    if want != got:
                        raise ShapeError(f"argument '{spec.name}' dim {i}: expected size {want}, got {got} (shape {tuple(arr.shape)})")
                elif want not in seen:
                    seen[want] = (got, spec.name, i)
                elif seen[want][0] != got:
                    size, name, dim = seen[want]
                    raise ShapeError(f"argument '{spec.name}' dim {i}: dimension variable '{want}' is {size} from argument '{name}' "
                                     f"dim {dim}, but {got} here (shape {tuple(arr.shape)})")


@dataclasses.dataclass(frozen=True)
class Assertion:
    """A run-time shape check of the guard function: its message, with `{k}` for its k-th value."""
    message: str
    num_values: int

    def format(self, values: list[int]) -> str:
        return re.sub(r"\{(\d+)\}", lambda m: str(values[int(m.group(1))]) if int(m.group(1)) < len(values) else m.group(0), self.message)


def dtype_name(dtype: np.dtype) -> str:
    """The element type's name in the IR (and in artifacts): `f32`, `complex<f64>`."""
    return next(k for k, v in ELEMENT_TYPES.items() if v == dtype)


_QUANT_STORAGE = re.compile(r"!quant\.uniform<([iu])(\d+)")


def element_dtype(t: ir.Type, what: str) -> np.dtype:
    """The numpy dtype of an element type; a quantized type's is its storage type's (the integers
    the caller passes and gets: the compiled code converts them by the type's scales)."""
    text = str(t)
    if m := _QUANT_STORAGE.match(text):
        text = f"{'i' if m.group(1) == 'i' else 'ui'}{m.group(2)}"
    if text not in ELEMENT_TYPES:
        raise CompileError(f"{what}: element type {text} is not supported (supported: {', '.join(ELEMENT_TYPES)})")
    return ELEMENT_TYPES[text]


def spec_from_type(name: str, t: ir.Type, dims: Sequence[Dim] | None = None) -> ArgSpec:
    from torch_mlir import ir

    if not isinstance(t, ir.RankedTensorType):
        raise CompileError(f"{name}: expected a ranked tensor, got {t}")
    rt = ir.RankedTensorType(t)
    shape = tuple(dims) if dims is not None else tuple(
        f"{name}.{i}" if rt.is_dynamic_dim(i) else rt.shape[i] for i in range(rt.rank))
    return ArgSpec(name, shape, element_dtype(rt.element_type, name))


def signature_from_function(func: ir.Operation, arg_dims: Sequence[Sequence[Dim]] | None = None,
                            arg_names: Sequence[str] | None = None, num_params: int = 0) -> Signature:
    """Reads the signature of `func`; dims the frontend named (JAX's symbolic dims) override the
    per-argument placeholders that unknown `?` dims otherwise get. The last `num_params` arguments
    are parameters (weights the compiled function carries), not the caller's."""
    from ..mlir_support import function_type

    ftype = function_type(func)
    inputs = list(ftype.inputs)[:len(ftype.inputs) - num_params]
    names = list(arg_names) if arg_names else [f"arg{i}" for i in range(len(inputs))]
    args = tuple(spec_from_type(names[i], t, arg_dims[i] if arg_dims else None) for i, t in enumerate(inputs))
    results = tuple(spec_from_type(f"result{i}", t) for i, t in enumerate(ftype.results))
    return Signature(args, results)
