"""PyTorch frontend: `torch.export` (with `torch.export.Dim`, derived dims such as `2 * h`) in the
caller's process, saved to a file; in the compiler worker, torch-mlir's FX importer with StableHLO
output. The ExportedProgram's range constraints (which torch-mlir's StableHLO drops) become
checked constraints, and its symbols name the dims."""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import logging
import math
import os
import re
import sys
import threading
import warnings
from typing import Any, Callable

import ml_dtypes
import numpy as np

from ..artifact import Deferred
from ..errors import CompileError, UnsupportedOpError
from ..ops import FFT_KINDS
from ..runtime import Binding
from . import Imported, Source, entry_name, find_entry, parse_stablehlo, register_frontend


def _is_torch(obj: Any, specs: tuple) -> bool:
    """A module, an exported program, or a function whose example inputs hold torch tensors."""
    torch = sys.modules.get("torch")  # never import torch for another frontend's input
    if torch is None:
        return False
    return isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram)) or (
        callable(obj) and any(isinstance(x, torch.Tensor) for x in torch.utils._pytree.tree_leaves(specs)))


def _as_module(fn: Callable) -> Any:
    """A function of torch tensors as a module whose `forward` has the function's signature (the
    names dynamic_shapes may use)."""
    import inspect

    import torch

    class Function(torch.nn.Module):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    Function.forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()])
    return Function()


def _sort_stable(x: Any, *, stable: bool | None = None, dim: int = -1, descending: bool = False) -> Any:
    """`sort(stable=...)` as plain `sort`, which torch-mlir knows and we sort stably (torch_ops.py)."""
    import torch

    return torch.ops.aten.sort.default(x, dim, descending)


def _group_norm(x: Any, weight: Any, bias: Any, n: Any, c: Any, hw: Any, group: int, eps: float) -> Any:
    """native_group_norm over [N, group, C/group * spatial] (torch's own decomposition goes
    through as_strided, which torch-mlir needs static sizes for)."""
    import torch

    grouped = x.reshape(x.shape[0], group, -1)
    mean = grouped.mean(-1, keepdim=True)
    rstd = torch.rsqrt(((grouped - mean) ** 2).mean(-1, keepdim=True) + eps)
    out = ((grouped - mean) * rstd).reshape(x.shape)
    channel = [1, x.shape[1]] + [1] * (x.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(channel)
    if bias is not None:
        out = out + bias.reshape(channel)
    return out, mean.reshape(x.shape[0], group), rstd.reshape(x.shape[0], group)


def _batch_norm_inference(x: Any, weight: Any, bias: Any, mean: Any, var: Any, momentum: float, eps: float) -> Any:
    """Batch norm in inference (`_native_batch_norm_legit_no_training`) as PyTorch computes it,
    (x - mean) * (1 / sqrt(var + eps)) * weight + bias along the channel dim, in float32 for
    half-precision inputs, with empty saved statistics. torch's own decomposition goes through its
    general helper (training statistics, type promotion, unsqueezes at symbolic ranks): 30 % of
    DenseNet-121's decomposition with symbolic image sizes."""
    import torch

    channel = [1, -1] + [1] * (x.dim() - 2)
    acc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    out = (acc - mean.reshape(channel)) * (1 / torch.sqrt(var + eps)).reshape(channel)
    if weight is not None:
        out = out * weight.reshape(channel)
    if bias is not None:
        out = out + bias.reshape(channel)
    empty = x.new_zeros((0,))
    return out.to(x.dtype), empty, empty


def _upsample_nearest(x: Any, output_size: Any, scale_factors: Any = None) -> Any:
    """Nearest upsampling of the trailing dims as gathers with PyTorch's source index,
    floor(i * in / out) (floor(i / scale) for a scale factor), in integer arithmetic so it holds
    for symbolic sizes (torch-mlir cannot lower the op with dynamic sizes)."""
    import torch

    for d in range(x.dim() - 2):
        axis = 2 + d
        size = x.shape[axis]
        positions = None
        if output_size is not None:  # the division by a tensor: one by a symbolic size does not import
            out = output_size[d]
            positions = torch.div(torch.arange(out, device=x.device) * size, torch.full((), out, device=x.device), rounding_mode="floor")
        elif float(scale_factors[d]).is_integer():
            k = int(scale_factors[d])
            positions = torch.arange(size * k, device=x.device) // k
        elif isinstance(size, int):
            out = int(size * scale_factors[d])
            positions = (torch.arange(out, device=x.device, dtype=torch.float64) / scale_factors[d]).floor().to(torch.int64)
        if positions is None:
            raise UnsupportedOpError(f"nearest upsampling of a dynamic dim by the non-integral factor {scale_factors[d]}")
        x = x.index_select(axis, positions.clamp(max=size - 1))
    return x


def _windows(n: int, *params: Any) -> list[list[int]]:
    """A pooling's kernel, stride, padding (and dilation) as n values each (an empty stride is the
    kernel's)."""
    lists = [list(v) * (n if len(v) == 1 else 1) if isinstance(v, (list, tuple)) else [v] * n for v in params]
    if not lists[1]:
        lists[1] = lists[0]
    return lists


def _ceil_padding(kernel: list, stride: list, padding: list, dilation: list) -> list[int]:
    """The padding past each end that gives floor mode PyTorch's ceil-mode windows: those that fit
    when the end is padded by stride - 1 more, but none starting past the input and its leading
    padding, so at most floor((size + p - 1) / s) + 1, which an end padding of d*(k-1) - p gives
    (a constant: no slice of the result, which would be a guard on symbolic sizes)."""
    return [p + min(s - 1, d * (k - 1) - p) for k, s, p, d in zip(kernel, stride, padding, dilation)]


def _max_pool(n: int, floor_mode: Callable | None) -> Callable:
    """max_pool{n}d in ceil mode as floor mode over the input padded with the lowest value: torch-mlir
    pads both ends in ceil mode (windows shifted: wrong values) and ignores it for dynamic sizes
    (too few windows). Floor mode goes to `floor_mode` (torch-mlir's decomposition) if any."""
    def pool(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Any:
        import torch

        if not ceil_mode:
            return NotImplemented if floor_mode is None else floor_mode(x, kernel_size, stride, padding, dilation, False)
        kernel, stride, padding, dilation = _windows(n, kernel_size, stride, padding, dilation)
        lowest = float("-inf") if x.is_floating_point() else torch.iinfo(x.dtype).min
        end = _ceil_padding(kernel, stride, padding, dilation)
        pads = [v for i in reversed(range(n)) for v in (padding[i], end[i])]
        op = getattr(torch.ops.aten, f"max_pool{n}d").default  # floor mode: back through this table
        return op(torch.nn.functional.pad(x, pads, value=lowest), kernel, stride, [0] * n, dilation, False)
    return pool


def _max_pool_with_indices(n: int) -> Callable:
    """max_pool{n}d_with_indices without strides (`F.max_pool2d(x, 2, return_indices=True)`) with its
    windows' sizes as strides, as torch takes them: torch-mlir took none as 1 (windows overlapping:
    wrong values and indices)."""
    def pool(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Any:
        import torch

        if stride:
            return NotImplemented  # the op itself
        op = getattr(torch.ops.aten, f"max_pool{n}d_with_indices").default
        return op(x, kernel_size, _windows(n, kernel_size, stride, padding)[1], padding, dilation, ceil_mode)
    return pool


def _avg_pool(n: int) -> Callable:
    """avg_pool{n}d in ceil mode, or with a divisor given, as floor mode over the input padded with
    zeros, divided by the share of each window PyTorch counts (inside the padded input with
    `count_include_pad`, inside the input without) or scaled to the divisor (torch-mlir converts
    neither)."""
    def pool(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
             count_include_pad: bool = True, divisor_override: Any = None) -> Any:
        import torch

        if not ceil_mode and not divisor_override:
            return NotImplemented  # the op itself
        kernel, stride, padding = _windows(n, kernel_size, stride, padding)
        op = getattr(torch.ops.aten, f"avg_pool{n}d").default
        pad = torch.nn.functional.pad

        def mean(t: Any, before: list, after: list) -> Any:  # window sums / kernel size, floor mode
            return op(pad(t, [v for i in reversed(range(n)) for v in (before[i], after[i])]), kernel, stride, [0] * n)

        end = _ceil_padding(kernel, stride, padding, [1] * n) if ceil_mode else padding
        y = mean(x, padding, end)
        if divisor_override:
            return y * (math.prod(kernel) / divisor_override)
        spatial = [x.shape[x.dim() - n + i] for i in range(n)]
        if count_include_pad:
            ones = x.new_ones([1] * (x.dim() - n) + [size + 2 * p for size, p in zip(spatial, padding)])
            return y / mean(ones, [0] * n, [e - p for e, p in zip(end, padding)])
        return y / mean(x.new_ones([1] * (x.dim() - n) + spatial), padding, end)
    return pool


def _adaptive_windows(size: Any, o: int, device: Any) -> tuple[Any, Any]:
    """The start and end of each of an adaptive pooling's `o` windows over `size` positions (as
    PyTorch's): floor(i*size/o) up to ceil((i+1)*size/o)."""
    import torch

    rows = torch.arange(o, device=device)
    return (rows * size) // o, ((rows + 1) * size + o - 1) // o


def _adaptive_avg_pool(n: int, original: Callable) -> Callable:
    """adaptive_avg_pool{n}d of dims with symbolic sizes to outputs larger than 1 (VGG's 7x7) as
    one product per dim with its averaging matrix, row i weighing positions floor(i*L/o) up to
    ceil((i+1)*L/o) alike: torch's decomposition branches on L % o, so its trace held for some
    sizes only. Static sizes and outputs of 1 (a mean) take torch-mlir's table's form."""
    def pool(x: Any, output_size: Any) -> Any:
        import torch

        spatial = [x.shape[x.dim() - n + i] for i in range(n)]
        if all(isinstance(size, int) for size in spatial) or all(o == 1 for o in output_size):
            return original(x, output_size)
        for i, (size, o) in enumerate(zip(spatial, output_size)):
            start, end = _adaptive_windows(size, o, x.device)
            positions = torch.arange(size, device=x.device)
            inside = (positions[None, :] >= start[:, None]) & (positions[None, :] < end[:, None])
            weights = inside.to(x.dtype) / (end - start)[:, None].to(x.dtype)
            dim = x.dim() - n + i
            x = torch.matmul(x.movedim(dim, -1), weights.t()).movedim(-1, dim)
        return x
    return pool


def _adaptive_max_pool(n: int, original: Callable | None) -> Callable:
    """adaptive_max_pool{n}d of dims with symbolic sizes (a global max pool too: channel
    attention), which torch-mlir cannot convert: dim by dim from the last, the positions of each
    output's window, floor(i*L/o) up to ceil((i+1)*L/o), gathered (as many as the longest window
    holds, those past the window's end masked) and their maximum taken with its position; the
    flat position in the input's pooled dims is carried along (PyTorch's indices: the first
    maximum in row-major order). Static sizes take torch-mlir's table's form."""
    def pool(x: Any, output_size: Any) -> Any:
        import torch

        first = x.dim() - n
        spatial = [x.shape[first + i] for i in range(n)]
        if original is not None and all(isinstance(size, int) for size in spatial):
            return original(x, output_size)
        flat, trailing = None, 1
        for i in reversed(range(n)):
            size, o, dim = spatial[i], output_size[i], first + i
            start, end = _adaptive_windows(size, o, x.device)
            positions = start[:, None] + torch.arange((size + o - 1) // o + 1, device=x.device)[None, :]
            inside = positions < end[:, None]
            gathered = x.index_select(dim, positions.clamp_max(size - 1).flatten())
            gathered = gathered.unflatten(dim, positions.shape)
            shape = [1] * x.dim()
            shape[dim:dim + 1] = positions.shape
            x, arg = torch.where(inside.reshape(shape), gathered, gathered.new_full((), float("-inf"))).max(dim + 1)
            source = arg + start.reshape([-1 if d == dim else 1 for d in range(x.dim())])
            flat = source if flat is None else source * trailing + flat.gather(dim, source)
            trailing = trailing * size
        return x, flat
    return pool


def _constant_pad(x: Any, pad: Any, value: float = 0) -> Any:
    """constant_pad_nd by amounts that are sizes (Swin pads to whole windows: (w - n % w) % w),
    which torch-mlir cannot convert, as a gather of each padded dim's positions (clamped into the
    input) with the value where a position falls outside: no block of a size that may be 0, on
    which torch's trace would put a guard."""
    import torch

    if all(isinstance(p, int) for p in pad):
        return NotImplemented  # the op itself
    for i in range(len(pad) // 2):
        dim, before, after = x.dim() - 1 - i, pad[2 * i], pad[2 * i + 1]
        size = x.shape[dim]
        positions = torch.arange(size + before + after, device=x.device) - before
        inside = ((positions >= 0) & (positions < size)).reshape([-1 if d == dim else 1 for d in range(x.dim())])
        x = torch.where(inside, x.index_select(dim, positions.clamp(0, size - 1)), x.new_full((), value))  # x's dtype
    return x


def _histc(x: Any, bins: int = 100, min: float = 0, max: float = 0) -> Any:  # noqa: A002 (torch's names)
    """`torch.histc` (mixture-of-experts layers count the tokens per expert with it), which
    torch-mlir cannot convert: PyTorch's bin of each element in [min, max] (the data's extremes
    when both are 0, widened by 1 each way when they are equal), `(x - min) * bins / (max - min)`
    truncated, `max` itself in the last bin, added into the counts as ones."""
    import torch

    flat = x.reshape(-1)
    lo, hi = (flat.min(), flat.max()) if min == 0 and max == 0 else (flat.new_full((), min), flat.new_full((), max))
    same = lo == hi
    lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    inside = (flat >= lo) & (flat <= hi)
    at = ((flat - lo) * bins / (hi - lo)).to(torch.long).clamp(0, bins - 1)
    return flat.new_zeros(bins).index_add(0, at, inside.to(flat.dtype))


def _clamp_tensor(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 (torch's names)
    """`torch.clamp` with tensor bounds as a maximum and a minimum, which broadcast: torch-mlir's
    own lowering gives `stablehlo.clamp` bounds of another shape than the operand, which it refuses
    (PhiMoE's router clamps its scores by a per-row bound)."""
    import torch

    if min is not None:
        x = torch.maximum(x, min)
    return x if max is None else torch.minimum(x, max)


def _remainder(x: Any, y: Any) -> Any:
    """`torch.remainder` (Python's `%`: the result takes the divisor's sign) as C's remainder
    (`fmod`, the dividend's sign) moved by the divisor where the two signs differ: torch-mlir
    lowers it to `stablehlo.remainder`, which is C's (-7 % 3 came out -1, not 2)."""
    import torch

    if not isinstance(y, torch.Tensor):  # a number: as a 0-d tensor (torch-mlir cannot take fmod by a float constant)
        y = torch.full((), y, dtype=torch.result_type(x, y), device=x.device)
    r = torch.fmod(x, y)
    return torch.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


def _roll(x: Any, shifts: Any, dims: Any = ()) -> Any:
    """`torch.roll` as a gather per dim from positions taken modulo the dim's size (torch-mlir's
    lowering slices at the shift as it is: rolling a dim of 2 by 3 came out wrong); without dims,
    over the flattened tensor."""
    import torch

    shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if not dims:
        return _roll(x.flatten(), shifts, [0]).view(x.shape)
    for shift, dim in zip(shifts, dims):
        n = x.shape[dim]
        positions = torch.remainder(torch.arange(n, device=x.device) - shift, n)  # (slices of a start computed from n: guards)
        x = x.index_select(dim, positions)
    return x


def _with_a_tensor_of_the_number(op: Any) -> Callable:
    """An op of a tensor and a number that torch-mlir does not convert (a shift `a << 2`, a
    bitwise `mask | True`, `fmod` by a float) as the tensor form `op` with a tensor of that number
    shaped like the tensor (a 0-d one torch-mlir broadcasts with a static op to the dynamic shape)."""
    def decomposition(x: Any, y: Any) -> Any:
        import torch

        return op(x, torch.full_like(x, y))
    return decomposition


def _kthvalue(x: Any, k: int, dim: int = -1, keepdim: bool = False) -> Any:
    """`torch.kthvalue` (which torch-mlir does not convert): the k-th of a stable sort, the first
    position among equal values."""
    import torch

    values, indices = torch.sort(x, dim=dim, stable=True)
    values, indices = values.narrow(dim, k - 1, 1), indices.narrow(dim, k - 1, 1)
    return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))


def _isclose(x: Any, y: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Any:
    """`torch.isclose` (which torch-mlir does not convert, nor torch's reference): equal, or a
    finite difference within atol + rtol * |y|; NaNs equal when asked; integers compared as f64."""
    import torch

    if not x.is_floating_point():
        x, y = x.to(torch.float64), y.to(torch.float64)
    error = (x - y).abs()
    close = (x == y) | (torch.isfinite(error) & (error <= atol + rtol * y.abs()))
    return close | (x.isnan() & y.isnan()) if equal_nan else close


def _median(x: Any, dim: int | None = None, keepdim: bool = False) -> Any:
    """`torch.median` (which torch-mlir does not convert): the lower middle of a stable sort along
    `dim` (over all elements without one); a row holding NaN gives NaN and its first NaN's index,
    as torch."""
    import torch

    if dim is None:
        return _median(x.flatten(), 0)[0]
    values, indices = torch.sort(x, dim=dim, stable=True)
    middle = (x.shape[dim] - 1) // 2
    values, indices = values.narrow(dim, middle, 1), indices.narrow(dim, middle, 1)
    if x.is_floating_point():  # a row with NaN: NaN, at its first
        nan = x.isnan()
        held = nan.any(dim, keepdim=True)
        values = torch.where(held, torch.full_like(values, float("nan")), values)
        indices = torch.where(held, nan.to(torch.int8).argmax(dim, keepdim=True), indices)
    return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))


def _searchsorted(sorted_sequence: Any, values: Any, *, out_int32: bool = False, right: bool = False, side: str | None = None,
                  sorter: Any = None) -> Any:
    """`torch.searchsorted` (and `bucketize`, its arguments swapped; torch-mlir converts neither):
    how many of the sorted row's elements are below each value (at most it, `right`), by
    comparing each value with the whole row: boundaries are few where these are used."""
    import torch

    if sorter is not None:
        raise UnsupportedOpError("torch.searchsorted with a sorter is not compiled: sort the sequence first")
    if not isinstance(values, torch.Tensor):
        values = torch.full((), values, dtype=sorted_sequence.dtype, device=sorted_sequence.device)
    # torch's binary search moves on where not s >= v (not s > v): NaN values count past every element
    above = torch.gt if right or side == "right" else torch.ge
    row = sorted_sequence if sorted_sequence.dim() == 1 else sorted_sequence.unsqueeze(-2)
    counts = above(row, values.unsqueeze(-1)).logical_not().sum(-1)
    return counts.to(torch.int32 if out_int32 else torch.int64)


def _bucketize(x: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False) -> Any:
    return _searchsorted(boundaries, x, out_int32=out_int32, right=right)


def _addmv(x: Any, matrix: Any, vector: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """`torch.addmv` (which torch-mlir does not convert): beta x + alpha (matrix @ vector)."""
    import torch

    product = torch.mv(matrix, vector)
    product = product if alpha == 1 else product * alpha
    return product if beta == 0 else (x if beta == 1 else x * beta) + product


def _rrelu(x: Any, lower: float = 0.125, upper: float = 1 / 3, training: bool = False, generator: Any = None) -> Any:
    """`nn.RReLU` in inference: a leaky ReLU of the bounds' mean slope (its noise is drawn in
    training only, which stays refused as random sampling)."""
    import torch

    return NotImplemented if training else torch.nn.functional.leaky_relu(x, (lower + upper) / 2)


def _diagonal(x: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """`Tensor.diagonal` (torch-mlir's lowering refuses it over dynamic dims) as a gather from the
    two dims moved last and flattened: element i of the diagonal is at (i + r) * columns + i + c."""
    import torch

    first, second = dim1 % x.dim(), dim2 % x.dim()
    rows, columns = x.shape[first], x.shape[second]
    r, c = max(0, -offset), max(0, offset)
    count = torch.sym_max(0, torch.sym_min(rows - r, columns - c))
    moved = x.movedim((first, second), (-2, -1)).flatten(-2)
    positions = torch.arange(count, device=x.device) * (columns + 1) + (r * columns + c)
    return moved.index_select(-1, positions)


def _copysign(x: Any, y: Any) -> Any:
    """`torch.copysign` (torch's decomposition reads the sign bit through a dtype view, which
    torch-mlir cannot convert): |x| negated where y is negative or -0.0."""
    import torch

    if not isinstance(y, torch.Tensor):
        y = torch.full_like(x, y)
    negative = (y < 0) | ((y == 0) & (1 / y < 0))
    return torch.where(negative, -x.abs(), x.abs())


def _bilinear(x1: Any, x2: Any, weight: Any, bias: Any = None) -> Any:
    """`nn.Bilinear` (torch-mlir's lowering asserts its operands broadcast, which it cannot check for
    dynamic dims): x1 times the weight's [in1, out * in2] view as one product, then each output's
    row of in2 multiplied by x2 and summed."""
    out, in1, in2 = weight.shape
    lead = x1.shape[:-1]
    y = (x1.reshape(-1, in1) @ weight.permute(1, 0, 2).reshape(in1, out * in2)).reshape(-1, out, in2)
    y = (y * x2.reshape(-1, 1, in2)).sum(-1).reshape(*lead, out)
    return y if bias is None else y + bias


def _hypot(x: Any, y: Any) -> Any:
    """`torch.hypot` (which torch-mlir does not convert)."""
    return (x * x + y * y).sqrt()


def _reduced_dims(x: Any, dim: Any) -> list[int]:
    """The dims a reduction's `dim` argument names (none or empty: all)."""
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return list(range(x.dim()))
    return [dim] if isinstance(dim, int) else list(dim)


def _var(x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    """`torch.var` (and `std`, `var_mean`, which call it) as its sum of squared deviations over
    max(0, n - correction) (1 by default): torch-mlir's lowering asserts that the correction fits
    the dims' product, which it cannot check for dynamic dims."""
    import torch

    dims = _reduced_dims(x, dim)
    deviations = x - x.mean(dims, keepdim=True)
    total = (deviations.abs() if x.is_complex() else deviations).square().sum(dims, keepdim=keepdim)
    count = torch.full((), math.prod(x.shape[d] for d in dims), dtype=total.dtype, device=x.device)
    return total / (count - (1 if correction is None else correction)).clamp(min=0)


def _var_mean(x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return _var(x, dim, correction=correction, keepdim=keepdim), x.mean(_reduced_dims(x, dim), keepdim=keepdim)


def _masked_scatter(x: Any, mask: Any, source: Any) -> Any:
    """`Tensor.masked_scatter` (which torch-mlir does not convert): the positions the mask selects,
    in row-major order, take the source's elements in order, through a prefix sum of the mask."""
    import torch

    mask = mask.expand_as(x)
    taken = torch.cumsum(mask.flatten().to(torch.int64), 0) - 1
    values = source.flatten().index_select(0, taken.clamp(0, source.numel() - 1)).view_as(x)
    return torch.where(mask, values, x)


def _bilinear_filter(t: Any) -> Any:
    import torch

    return torch.clamp(1 - t.abs(), min=0)


def _bicubic_filter(t: Any) -> Any:
    """Keys' cubic with a = -0.5 (PIL's, which antialiased resizing follows; plain bicubic takes -0.75)."""
    import torch

    a, t = -0.5, t.abs()
    return torch.where(t < 1, ((a + 2) * t - (a + 3)) * t * t + 1, torch.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def _upsample_antialiased(filter_: Callable) -> tuple[Callable, Callable]:
    """`interpolate(..., antialias=True)` (timm's position tables resized to the image, torchvision's
    resizing) as two products with weight matrices computed from the sizes: output pixel i of a
    dim averages the inputs j around its centre (i + 1/2) * scale, weighted by the filter at
    (j + 1/2 - centre) * min(1, 1 / scale) (widened when shrinking, so every input counts), the
    weights of each output normalised to sum 1 (over the inputs that exist, at the borders)."""
    def decomposition(x: Any, output_size: Any, align_corners: bool, scales_h: Any = None, scales_w: Any = None) -> Any:
        import torch

        compute = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        y = x.to(compute)
        for dim, n_out, factor in ((-2, output_size[0], scales_h), (-1, output_size[1], scales_w)):
            n_in = x.shape[dim]
            if align_corners:
                scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
            else:
                scale = 1.0 / factor if factor else n_in / n_out
            centre = (torch.arange(n_out, dtype=compute) + 0.5) * scale
            shrink = torch.clamp(torch.ones((), dtype=compute) / scale, max=1.0) if not align_corners or n_out > 1 else 1.0
            weights = filter_((torch.arange(n_in, dtype=compute)[None, :] + 0.5 - centre[:, None]) * shrink)
            weights = weights / weights.sum(-1, keepdim=True)
            y = torch.matmul(weights, y) if dim == -2 else torch.matmul(y, weights.transpose(0, 1))
        return y.to(x.dtype)

    def by_factors(x: Any, output_size: Any, align_corners: bool, scale_factors: Any) -> Any:
        """The `.vec` form: the output size from the scale factors as torch computes it (a whole
        factor times a dynamic size; any factor of a static one), the factors passed on."""
        if output_size is not None:
            return decomposition(x, output_size, align_corners)
        sizes = []
        for n, factor in zip(x.shape[2:], scale_factors):
            if not float(factor).is_integer() and not isinstance(n, int):
                raise UnsupportedOpError(f"antialiased upsampling of a dynamic dim by the non-integral factor {factor}")
            sizes.append(n * int(factor) if float(factor).is_integer() else int(n * factor))
        return decomposition(x, sizes, align_corners, *scale_factors)
    return decomposition, by_factors


@functools.cache
def fft_op() -> Any:
    """`disc::fft(x, kind, n) -> y`: a Fourier transform along the last signal dim, on the RAL's
    FFT (passes/fft.py), complex values as (real, imaginary) pairs in a trailing dim of 2. Kinds as
    `stablehlo.fft`'s (the inverses divide by n): FFT and IFFT [..., n, 2] -> [..., n, 2]; RFFT
    [..., n] -> [..., n // 2 + 1, 2]; IRFFT [..., n // 2 + 1, 2] -> [..., n]. Declared like
    `grouped_mm_op`, with a PyTorch kernel for the same use."""
    import torch

    torch.library.define("disc::fft", "(Tensor x, int kind, SymInt n) -> Tensor")

    @torch.library.register_fake("disc::fft")
    def _(x: Any, kind: int, n: Any) -> Any:
        if kind == FFT_KINDS["RFFT"]:
            return x.new_empty(*x.shape[:-1], n // 2 + 1, 2)
        return x.new_empty(*x.shape[:-2], n) if kind == FFT_KINDS["IRFFT"] else x.new_empty(x.shape)

    @torch.library.impl("disc::fft", "CompositeExplicitAutograd")
    def _(x: Any, kind: int, n: Any) -> Any:
        if kind == FFT_KINDS["RFFT"]:
            return torch.view_as_real(torch.fft.rfft(x))
        spectrum = torch.view_as_complex(x.contiguous())
        if kind == FFT_KINDS["IRFFT"]:
            return torch.fft.irfft(spectrum, n=n)
        return torch.view_as_real(torch.fft.fft(spectrum) if kind == FFT_KINDS["FFT"] else torch.fft.ifft(spectrum))
    return torch.ops.disc.fft.default


def _transformed(pairs: Any, dim: int, kind: str) -> Any:
    """`disc::fft` of kind FFT or IFFT along signal dim `dim` of (real, imaginary) pairs."""
    n = pairs.shape[dim]
    return fft_op()(pairs.movedim(dim, -2), FFT_KINDS[kind], n).movedim(-2, dim)


def _normalized(pairs: Any, normalization: int, sizes: list, inverted: list) -> Any:
    """torch's fft normalization codes (0 none, 1 by the square root of the transformed size, 2
    by it), the RAL's inverse transforms' division by their sizes (`inverted`) undone."""
    import torch

    def size(dims: list) -> Any:
        return torch.full((), math.prod(dims), dtype=pairs.dtype, device=pairs.device)
    if inverted:
        pairs = pairs * size(inverted)
    if normalization == 0:
        return pairs
    return pairs / (size(sizes).sqrt() if normalization == 1 else size(sizes))


def _fft_r2c(x: Any, dim: Any, normalization: int = 0, onesided: bool = True) -> Any:
    """The Fourier transform of a real tensor over `dim` (`torch.fft.rfft`, `fft` and `fftn` of real
    tensors: FNet's token mixing), the last of them to its n // 2 + 1 first frequencies where
    `onesided`: the RAL's FFT one dim at a time, a complex result made of its two parts."""
    import torch

    dims = [d % x.dim() for d in dim]
    last = dims[-1]
    if onesided:
        pairs = fft_op()(x.movedim(last, -1), FFT_KINDS["RFFT"], x.shape[last]).movedim(-2, last)
    else:
        pairs = _transformed(torch.stack([x, torch.zeros_like(x)], -1), last, "FFT")
    for d in dims[:-1]:
        pairs = _transformed(pairs, d, "FFT")
    return torch.view_as_complex(_normalized(pairs, normalization, [x.shape[d] for d in dims], []))


def _fft_c2c(x: Any, dim: Any, normalization: int = 0, forward: bool = True) -> Any:
    """`torch.fft.fft` / `ifft` (and n-d) of a complex tensor, as `_fft_r2c`."""
    import torch

    pairs = torch.view_as_real(x)
    dims = [d % x.dim() for d in dim]
    for d in dims:
        pairs = _transformed(pairs, d, "FFT" if forward else "IFFT")
    sizes = [x.shape[d] for d in dims]
    return torch.view_as_complex(_normalized(pairs, normalization, sizes, [] if forward else sizes))


def _fft_c2r(x: Any, dim: Any, normalization: int = 0, last_dim_size: Any = None) -> Any:
    """`torch.fft.irfft` (and n-d): the inverse transforms over `dim`, the last from the n // 2 + 1
    first frequencies of a Hermitian spectrum (torch resizes the input to those) to
    `last_dim_size` = n real values."""
    import torch

    pairs = torch.view_as_real(x)
    dims = [d % x.dim() for d in dim]
    for d in dims[:-1]:
        pairs = _transformed(pairs, d, "IFFT")
    last, n = dims[-1], last_dim_size
    out = fft_op()(pairs.movedim(last, -2), FFT_KINDS["IRFFT"], n).movedim(-1, last)
    sizes = [n] + [x.shape[d] for d in dims[:-1]]
    return _normalized(out, normalization, sizes, sizes)


@contextlib.contextmanager
def _fft_norms_of_sizes() -> Any:
    """torch's FFT references (which `_decompositions` takes for `torch.fft.*`) scale by
    `1 / math.sqrt(n)` for norm="ortho": of a symbolic size, the float of its example value (a
    silent wrong answer at every other size). While decomposing, that scale is computed from the
    size as a tensor."""
    import torch
    import torch._refs.fft as references

    apply_norm = references._apply_norm

    def of_sizes(x: Any, norm: Any, signal_numel: Any, forward: bool) -> Any:
        if norm != "ortho":
            return apply_norm(x, norm, signal_numel, forward)
        return x * torch.full((), signal_numel, dtype=x.dtype.to_real(), device=x.device).rsqrt()

    references._apply_norm = of_sizes
    try:
        yield
    finally:
        references._apply_norm = apply_norm


def _parts(x: Any) -> tuple[Any, Any]:
    """A complex tensor's real and imaginary parts (through `view_as_real`: `_complex_as_pairs`
    carries complex values as such pairs)."""
    import torch

    pair = torch.view_as_real(x)
    return pair[..., 0], pair[..., 1]


def _complex(real: Any, imag: Any) -> Any:
    import torch

    return torch.view_as_complex(torch.stack([real, imag], -1))


def _conj(x: Any) -> Any:
    """The conjugate of a complex tensor (`conj()`, a view torch resolves later), in its parts; of
    others NotImplemented."""
    if not x.is_complex():
        return NotImplemented
    real, imag = _parts(x)
    return _complex(real, -imag)


def _complex_abs(x: Any) -> Any:
    """|x| of a complex tensor (a spectrum's magnitudes) from its parts; of others NotImplemented."""
    import torch

    if not x.is_complex():
        return NotImplemented
    real, imag = _parts(x)
    return torch.sqrt(real * real + imag * imag)


def _complex_div(x: Any, other: Any) -> Any:
    """A complex tensor divided by a real one or a number (a spectrum scaled); others NotImplemented."""
    import torch

    if not isinstance(x, torch.Tensor) or not x.is_complex() or (isinstance(other, torch.Tensor) and other.is_complex()) or isinstance(other, complex):
        return NotImplemented
    real, imag = _parts(x)
    return _complex(real / other, imag / other)


def _complex_mul(x: Any, other: Any) -> Any:
    """A product with a complex tensor (Llama 4's rotary positions: `torch.polar`'s result scaled,
    then multiplied into the queries and keys seen as complex pairs), which torch-mlir's StableHLO
    lowering refuses, in real arithmetic over `view_as_real`'s parts: (a + bi)(c + di) =
    (ac - bd) + (ad + bc)i. Any other product (NotImplemented) as it is."""
    import torch

    def parts(v: Any) -> tuple[Any, Any]:
        if isinstance(v, torch.Tensor) and v.is_complex():
            return _parts(v)
        return (v.real, v.imag) if isinstance(v, complex) else (v, 0.0)  # (a size's float stays symbolic)

    if not any(isinstance(v, torch.Tensor) and v.is_complex() for v in (x, other)):
        return NotImplemented
    (a, b), (c, d) = parts(x), parts(other)
    return _complex(a * c - b * d, a * d + b * c)


@functools.cache
def grouped_mm_op() -> Any:
    """`disc::grouped_mm(input (S, K), weight (G, K, N), offs (G,)) -> (S, N)`: the grouped GEMM of
    mixture-of-experts layers, rows [offs[g - 1], offs[g]) of `input` times `weight[g]` (from row 0
    for g = 0), the rows from offs[G - 1] on zeros. transformers' `grouped_mm_fallback` and ATen's
    `_grouped_mm` with offsets are decomposed into it, and the compiler gives it to the RAL
    (torch_ops.py). Declared in the caller by the first decomposition into it and in the compiler
    worker before it loads the program; its PyTorch kernel runs only where a graph dynamo captured
    runs in PyTorch (one the compiler could not take, `dynamo_backend`)."""
    import torch

    torch.library.define("disc::grouped_mm", "(Tensor input, Tensor weight, Tensor offs) -> Tensor")

    @torch.library.register_fake("disc::grouped_mm")
    def _(x: Any, weight: Any, offs: Any) -> Any:
        return x.new_empty(x.shape[0], weight.shape[2])

    @torch.library.impl("disc::grouped_mm", "CompositeExplicitAutograd")
    def _(x: Any, weight: Any, offs: Any) -> Any:
        out, start = x.new_zeros(x.shape[0], weight.shape[2]), 0
        for g, end in enumerate(offs.tolist()):
            out[start:end] = x[start:end] @ weight[g]
            start = end
        return out
    return torch.ops.disc.grouped_mm.default


@functools.cache
def check_op() -> Any:
    """`disc::check(condition (a bool tensor of one element), message) -> ()`: an assertion over
    sizes the data decides, which the compiler checks where it is computed (torch_ops.py). A side
    effect for FX (no dead-code elimination takes it out); declared like `grouped_mm_op`, with a
    PyTorch kernel for the same use."""
    import torch

    torch.library.define("disc::check", "(Tensor condition, str message) -> ()")

    @torch.library.register_fake("disc::check")
    def _(condition: Any, message: str) -> None:
        return None

    @torch.library.impl("disc::check", "CompositeExplicitAutograd")
    def _(condition: Any, message: str) -> None:
        if not bool(condition):
            raise RuntimeError(message)
    torch.fx.node.has_side_effect(torch.ops.disc.check.default)
    return torch.ops.disc.check.default


# ATen's recurrent layers (`_VF` functions: nn.LSTM, nn.GRU and nn.RNN call them), which torch.export
# unrolls over the sequence (so its length would be fixed): ours while a program is exported
RECURRENT_MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@functools.cache
def recurrent_ops() -> tuple[Any, Any]:
    """`disc::lstm(input, hx [h, c], params, has_biases, num_layers, bidirectional, batch_first)
    -> (output, h_n, c_n)` and `disc::rnn(input, hx, params, ..., batch_first, mode) -> (output,
    h_n)` (mode "gru", "rnn_tanh" or "rnn_relu"): ATen's recurrent layers in inference (no dropout)
    with their arguments, over a sequence of any length. The compiler writes them as a loop over
    the sequence (torch_ops.py); declared like `grouped_mm_op`, with ATen's kernels for the same use."""
    import torch

    aten = torch._C._VariableFunctions
    torch.library.define("disc::lstm", "(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, "
                         "bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)")
    torch.library.define("disc::rnn", "(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, "
                         "bool bidirectional, bool batch_first, str mode) -> (Tensor, Tensor)")

    def output(x: Any, h: Any, bidirectional: bool) -> Any:  # (sequence, batch) or (batch, sequence) as the input
        return x.new_empty(*x.shape[:2], (2 if bidirectional else 1) * h.shape[-1])

    @torch.library.register_fake("disc::lstm")
    def _(x: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool) -> Any:
        return output(x, hx[0], bidirectional), hx[0].new_empty(hx[0].shape), hx[1].new_empty(hx[1].shape)

    @torch.library.impl("disc::lstm", "CompositeExplicitAutograd")
    def _(x: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool) -> Any:
        return aten.lstm(x, hx, params, has_biases, num_layers, 0.0, False, bidirectional, batch_first)

    @torch.library.register_fake("disc::rnn")
    def _(x: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool, mode: str) -> Any:
        return output(x, hx, bidirectional), hx.new_empty(hx.shape)

    @torch.library.impl("disc::rnn", "CompositeExplicitAutograd")
    def _(x: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool, mode: str) -> Any:
        return getattr(aten, mode)(x, hx, params, has_biases, num_layers, 0.0, False, bidirectional, batch_first)
    return torch.ops.disc.lstm.default, torch.ops.disc.rnn.default


_exporting = threading.local()  # `on` in a thread while torch.export traces there (`_recurrent_layers_as_ops`)
_patch_lock = threading.Lock()
_patch_users = [0]


def _recurrent_call(mode: str) -> Callable:
    """`_VF.<mode>` for the exporting thread: the layer over a padded sequence (not a packed one)
    in inference as `disc::lstm` or `disc::rnn`; every other call, and every other thread's, as ATen's."""
    import torch

    original = getattr(torch._C._VariableFunctions, mode)

    def call(*args: Any) -> Any:
        # (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first); a
        # packed sequence's form has its batch sizes second, and its params fourth
        if not getattr(_exporting, "on", False) or len(args) != 9 or not isinstance(args[3], bool) or (args[6] and args[5] > 0):
            return original(*args)
        x, hx, params, has_biases, num_layers, _, _, bidirectional, batch_first = args
        lstm, rnn = recurrent_ops()
        if mode == "lstm":
            return lstm(x, list(hx), list(params), has_biases, num_layers, bidirectional, batch_first)
        return rnn(x, hx, list(params), has_biases, num_layers, bidirectional, batch_first, mode)
    return call


@contextlib.contextmanager
def _recurrent_layers_as_ops() -> Any:
    """While torch.export traces in this thread: `_VF.lstm`, `gru`, `rnn_tanh` and `rnn_relu` (what
    nn.LSTM, nn.GRU and nn.RNN call once their initial states are made) become our operators, so
    that the sequence's length stays a dim (`recurrent_ops`). Other threads' calls meanwhile go to ATen."""
    from torch import _VF

    with _patch_lock:
        if _patch_users[0] == 0:
            for mode in RECURRENT_MODES:
                setattr(_VF, mode, _recurrent_call(mode))
        _patch_users[0] += 1
    _exporting.on = True
    try:
        with warnings.catch_warnings():  # torch.export sees the layers' lists of their weights (`_flat_weights`) refreshed
            warnings.filterwarnings("ignore", r"The tensor attributes .*_flat_weights", UserWarning)
            yield
    finally:
        _exporting.on = False
        with _patch_lock:
            _patch_users[0] -= 1
            if _patch_users[0] == 0:
                for mode in RECURRENT_MODES:
                    delattr(_VF, mode)


def _grouped_mm_fallback(x: Any, weight: Any, offs: Any) -> Any:
    """transformers' `grouped_mm_fallback` (its mixture-of-experts layers, float32 weights)."""
    return grouped_mm_op()(x, weight, offs)


def _aten_grouped_mm(x: Any, weight: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
    """ATen's `_grouped_mm` (`torch.nn.functional.grouped_mm`) in its mixture-of-experts form: a
    2-d input, 3-d weights and offsets, without bias, in the operands' dtype."""
    if offs is None or x.dim() != 2 or weight.dim() != 3 or bias is not None or out_dtype not in (None, x.dtype):
        raise UnsupportedOpError(f"aten._grouped_mm is compiled for a 2-d input, 3-d weights and offsets, without bias or "
                                 f"another output dtype (got input {x.dim()}-d, weight {weight.dim()}-d, "
                                 f"offs {'none' if offs is None else 'given'}, bias {'given' if bias is not None else 'none'})")
    return grouped_mm_op()(x, weight, offs)


def _embedding_bag(weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False, mode: int = 0,
                   sparse: bool = False, per_sample_weights: Any = None, include_last_offset: bool = False,
                   padding_idx: int | None = None) -> Any:
    """`nn.EmbeddingBag` (a recommendation model's lists of varying length), which torch-mlir
    cannot convert: each index's bag is the count of bags starting at or before it, less one
    (ones added at the bags' starts, summed cumulatively), its weight row is gathered (times its
    per-sample weight; zero at `padding_idx`) and added into its bag; the mean divides by the
    bag's count, max keeps the largest (an empty bag gives zeros, as PyTorch's). Returns
    PyTorch's four results (the bags' sums or means or maxima, each index's bag, each bag's count,
    and zeros for the maxima's positions)."""
    import torch

    n = indices.shape[0]
    starts = offsets[:-1] if include_last_offset else offsets
    bags = starts.shape[0]
    first = torch.zeros(n + 1, dtype=torch.long, device=indices.device)  # a bag starting at n is empty
    bag = first.index_add(0, starts[1:], torch.ones_like(starts[1:])).cumsum(0)[:n]
    rows = weight.index_select(0, indices)
    keep = torch.ones_like(indices, dtype=torch.bool) if padding_idx is None else indices != padding_idx
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(rows.dtype)[:, None]
    rows = torch.where(keep[:, None], rows, rows.new_zeros(()))
    count = torch.zeros(bags, dtype=torch.long, device=indices.device).index_add(0, bag, keep.long())
    out = torch.zeros(bags, weight.shape[1], dtype=rows.dtype, device=rows.device)
    if mode == 2:  # padding entries at the lowest value; a bag of none (or only those) is zeros
        lowest = rows.new_full((), torch.finfo(rows.dtype).min)
        out = out.scatter_reduce(0, bag[:, None].expand(n, weight.shape[1]), torch.where(keep[:, None], rows, lowest), "amax",
                                 include_self=False)
        out = torch.where(count[:, None] > 0, out, out.new_zeros(()))
    else:
        out = out.index_add(0, bag, rows)
        if mode == 1:
            out = out / count.clamp_min(1).to(out.dtype)[:, None]
    return out, bag, count, torch.zeros_like(count)


def _masked_select(x: Any, mask: Any) -> Any:
    """The elements of x (broadcast with mask) where mask is true, in row-major order: a gather at
    the flat positions of the true elements (`nonzero`: a size read from the data)."""
    import torch

    shape = torch.broadcast_shapes(x.shape, mask.shape)
    positions = torch.nonzero(mask.expand(shape).reshape(-1)).select(1, 0)
    return x.expand(shape).reshape(-1).index_select(0, positions)


def _runs(values: Any, order: Any, shape: Any, return_inverse: bool, return_counts: bool) -> tuple:
    """The first value of each run of equal values in the vector `values` (its positions:
    `nonzero`, as many as the data has), each element's run (put back in place through `order`,
    the sort's permutation, where there is one) and each run's length."""
    import torch

    previous = torch.cat([values[:1], values[:-1]])
    starts = (values != previous) | (torch.arange(values.shape[0]) == 0)
    positions = torch.nonzero(starts).select(1, 0)
    none = torch.zeros(0, dtype=torch.long)
    inverse = none
    if return_inverse:
        inverse = torch.cumsum(starts.long(), 0) - 1
        inverse = (inverse if order is None else torch.zeros_like(inverse).scatter(0, order, inverse)).reshape(shape)
    counts = none
    if return_counts:
        total = torch.ones_like(values, dtype=torch.long).sum().reshape(1)
        counts = torch.cat([positions[1:], total]) - positions
    return values.index_select(0, positions), inverse, counts


def _unique(x: Any, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False) -> tuple:  # noqa: A002 (torch's names)
    """`torch.unique` (sorted whatever `sorted` says: its order is unspecified otherwise)."""
    import torch

    values, order = torch.sort(x.reshape(-1), stable=True)
    return _runs(values, order, x.shape, return_inverse, return_counts)


def _unique_consecutive(x: Any, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None) -> tuple:
    if dim is not None:
        raise UnsupportedOpError("torch.unique_consecutive along a dim (only of the flattened tensor)")
    return _runs(x.reshape(-1), None, x.shape, return_inverse, return_counts)


def _bincount(x: Any, weights: Any = None, minlength: int = 0) -> Any:
    """`torch.bincount`: max(x) + 1 bins (read from the data), at least `minlength`; a negative
    value is refused where the data is (torch raises; the scatter would skip it)."""
    import torch

    check_op()(x.min() >= 0, "bincount: a value is negative")
    bins = torch.clamp(x.max() + 1, min=minlength).item()
    torch._check(bins >= 0)
    ones = torch.ones_like(x, dtype=torch.long) if weights is None else weights
    return torch.zeros(bins, dtype=ones.dtype).index_add(0, x, ones)


def _split_with_sizes(x: Any, split_sizes: Any, dim: int = 0) -> Any:
    """A split into parts of symbolic sizes (a class token split from the patches, `[1, h * w]`;
    `chunk` of a concatenation), which torch-mlir does not convert: slices at the running sums.
    Parts of constant sizes keep torch's form (NotImplemented)."""
    import torch

    if all(isinstance(size, int) for size in split_sizes):
        return NotImplemented
    parts, start = [], 0
    for size in split_sizes:
        parts.append(torch.ops.aten.slice.Tensor(x, dim, start, start + size))
        start = start + size
    return parts


def _upsample_bilinear(original: Callable | None) -> Callable:
    """upsample_bilinear2d with `align_corners=True` (sizes that may be symbolic): torch's
    decomposition computes the scale (in - 1) / (out - 1) as a float of sizes, a `sym_float` the
    FX importer cannot take; here in tensors, as torch's kernel rounds it: each output position's
    source is scale * i, its two neighbours are gathered and mixed, along the width and then the
    height. Other cases (and scale factors that are not whole) take torch-mlir's table's."""
    def upsample(x: Any, output_size: Any, align_corners: bool, scale_factors: Any = None) -> Any:
        import torch

        if not align_corners or (output_size is None and any(float(s) != int(s) for s in scale_factors)):
            return NotImplemented if original is None else original(x, output_size, align_corners, scale_factors)
        sizes = list(x.shape[2:])
        out = list(output_size) if output_size is not None else [n * int(s) for n, s in zip(sizes, scale_factors)]
        for dim, n, size in ((3, sizes[1], out[1]), (2, sizes[0], out[0])):
            last = torch.full((), n - 1, dtype=torch.long, device=x.device)
            scale = last.to(torch.float32) / torch.full((), size - 1, dtype=torch.long, device=x.device).clamp_min(1).to(torch.float32)
            source = scale * torch.arange(size, device=x.device, dtype=torch.float32)
            low = source.to(torch.long)
            high = torch.minimum(low + 1, last)
            weight = (source - low.to(torch.float32)).to(x.dtype).reshape([-1 if d == dim else 1 for d in range(x.dim())])
            x = x.index_select(dim, low) * (1 - weight) + x.index_select(dim, high) * weight
        return x
    return upsample


def _empty_strided(size: Any, stride: Any, *, dtype: Any = None, device: Any = None, **_: Any) -> Any:
    """Strides mean nothing to a value-semantics compiler; torch-mlir guards non-default ones with
    a run-time assert StableHLO cannot express (RNNs allocate their state this way)."""
    import torch

    return torch.empty(size, dtype=dtype, device=device)


def _as_strided(x: Any, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    """`as_strided` of a tensor laid out row-major from the start of its storage, reading it in
    that same order (dims of size 1 have any stride), is the tensor: decompositions that restore a
    memory format write it (adaptive average pooling to 1x1 of a channels-last input:
    torchvision's Swin), and torch-mlir takes as_strided with static sizes only. Other uses,
    a view of another layout among them (as_strided reads its storage, not its elements in
    order), are left to torch-mlir (NotImplemented keeps the op)."""
    import torch
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not (storage_offset in (None, 0) and len(size) == x.dim() and statically_known_true(x.storage_offset() == 0)):
        return NotImplemented
    expected: Any = 1
    for n, have, step, own in reversed(list(zip(size, x.shape, stride, x.stride()))):
        if not statically_known_true(n == have):
            return NotImplemented
        if statically_known_true(n == 1):
            continue
        if not (statically_known_true(step == expected) and statically_known_true(own == expected)):
            return NotImplemented
        expected = expected * n
    return torch.ops.aten.alias.default(x)


def _slice_scatter(x: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    """`slice_scatter` (what `x[a:b] = v` becomes) of unit step as the concatenation of what
    stays before the slice, `src` and what stays after it: torch-mlir's own lowering needs
    constant bounds (a dynamic dim fails) and takes an open end (`x[-3:]`, end 2^63 - 1) as the
    size it is, running out of memory (torchvision's Swin builds its attention mask so). Other
    steps, and bounds not known to be in order, are left to torch-mlir (NotImplemented keeps
    the op)."""
    import torch
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    size = x.shape[dim]

    def bound(v: Any, default: Any) -> Any:
        if v is None:
            return default
        if statically_known_true(v < 0):
            v = v + size
        return 0 if statically_known_true(v < 0) else size if statically_known_true(v > size) else v

    lo, hi = bound(start, 0), bound(end, size)
    if step != 1 or not statically_known_true(lo <= hi):
        return NotImplemented
    aten = torch.ops.aten
    return aten.cat.default([aten.slice.Tensor(x, dim, 0, lo), src, aten.slice.Tensor(x, dim, hi, size)], dim)


def _native_multi_head_attention(query: Any, key: Any, value: Any, embed_dim: int, num_head: int, qkv_weight: Any, qkv_bias: Any,
                                 proj_weight: Any, proj_bias: Any, mask: Any = None, need_weights: bool = True,
                                 average_attn_weights: bool = True, mask_type: int | None = None) -> Any:
    """`nn.MultiheadAttention`'s inference fast path as plain ops: one packed input projection
    split in three, queries scaled before the product, a boolean mask (True: masked out; type 1:
    key padding (B, L), else broadcast to (B, H, L, L)) or an additive one, and rows with every
    key masked giving zeros, as the fused kernel's masked softmax does."""
    import torch

    b, head_dim = query.shape[0], embed_dim // num_head
    wq, wk, wv = qkv_weight.chunk(3)
    bq, bk, bv = qkv_bias.chunk(3)

    def heads(x: Any, w: Any, bias: Any) -> Any:
        return torch.nn.functional.linear(x, w, bias).reshape(b, -1, num_head, head_dim).transpose(1, 2)

    q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
    scores = (q / head_dim ** 0.5) @ k.transpose(-2, -1)
    masked = None
    if mask is not None:
        m = mask.reshape(b, 1, 1, -1) if mask_type == 1 else mask
        if m.dtype == torch.bool:
            scores, masked = scores.masked_fill(m, float("-inf")), m
        else:
            scores = scores + m
    weights = torch.softmax(scores, -1)
    if masked is not None:
        weights = weights.masked_fill(masked.all(-1, keepdim=True), 0.0)
    out = torch.nn.functional.linear((weights @ v).transpose(1, 2).reshape(b, -1, embed_dim), proj_weight, proj_bias)
    if not need_weights:
        return out, out.new_empty(0)
    return out, weights.mean(1) if average_attn_weights else weights


def _transformer_encoder_layer(src: Any, embed_dim: int, num_heads: int, qkv_weight: Any, qkv_bias: Any, proj_weight: Any,
                               proj_bias: Any, use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: Any, norm_bias_1: Any,
                               norm_weight_2: Any, norm_bias_2: Any, ffn_weight_1: Any, ffn_bias_1: Any, ffn_weight_2: Any,
                               ffn_bias_2: Any, mask: Any = None, mask_type: int | None = None) -> Any:
    """`nn.TransformerEncoderLayer`'s inference fast path (what dynamo captures in eval mode
    without grad) as plain ops: attention and feed-forward blocks with residuals, layer norms
    before (norm_first) or after each."""
    import torch.nn.functional as F

    def norm(x: Any, w: Any, b: Any) -> Any:
        return F.layer_norm(x, (embed_dim,), w, b, eps)

    h = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = src + _native_multi_head_attention(h, h, h, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                                           False, True, mask_type)[0]
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)
    x = x + h
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


# ATen ops torch-mlir's own (C++) decompositions and conversions take: kept whole, since
# decomposing them here re-traces each with symbolic sizes (linear, layer_norm and matmul were 2.5 s
# of BERT-base's 5.9 s of decomposition)
_KEPT_WHOLE = ("linear", "matmul", "layer_norm", "conv2d", "hardswish", "hardsigmoid")


def _scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                  is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    """Attention as its math: scores scaled (through the queries), a boolean mask (True: attend)
    or an additive one, causal masking, key/value heads repeated for grouped queries, and a softmax
    that gives rows with every key masked zeros (as PyTorch's). torch's own decomposition goes
    through its CPU flash-attention op and takes seconds to trace with symbolic sizes."""
    import torch

    if dropout_p:
        raise UnsupportedOpError(f"aten.scaled_dot_product_attention with dropout_p={dropout_p} (training): export the model in eval mode")
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        def repeated(x: Any) -> Any:
            groups = query.shape[-3] // x.shape[-3]
            grown = x.unsqueeze(-3).expand(*x.shape[:-2], groups, *x.shape[-2:])
            return grown.reshape(*x.shape[:-3], x.shape[-3] * groups, *x.shape[-2:])
        key, value = repeated(key), repeated(value)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query * scale, key.transpose(-2, -1))
    if is_causal:
        rows, cols = query.shape[-2], key.shape[-2]
        attn_mask = torch.ones(rows, cols, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        scores = torch.where(attn_mask, scores, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return torch.matmul(_softmax_masked_rows_zero(scores), value)


def _softmax_masked_rows_zero(scores: Any) -> Any:
    """Softmax over the last dim, zeros where every score of a row is -inf (aten._safe_softmax),
    with no pass of its own over the scores: such a row's max is -inf, clamped to the lowest
    float its exponentials are all 0, and its sum, otherwise at least 1 (the max's own term),
    is 0, clamped to 1. Half-precision scores are computed in float32, as PyTorch does."""
    import torch

    x = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    e = torch.exp(x - x.amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).min))
    return (e / e.sum(-1, keepdim=True).clamp_min(1)).to(scores.dtype)


def _decompositions() -> dict:
    """torch-mlir's table less the ops torch-mlir converts itself (`_KEPT_WHOLE`), plus ours
    (stable sort, group norm, batch norm in inference, nearest upsampling, empty_strided, as_strided in row-major order,
    slice_scatter as a concatenation, scaled dot-product attention, the fused inference paths of
    `nn.MultiheadAttention` and `nn.TransformerEncoderLayer`, poolings (adaptive max among them), padding by
    sizes, embedding bags, bilinear upsampling with aligned corners, antialiased upsampling, Fourier transforms
    (real to complex, complex, complex to real), histograms, clamps by tensors, remainders with the divisor's
    sign, rolls, shifts and bitwise ops with numbers, isclose, k-th values, medians, searchsorted and bucketize,
    addmv, hypot, copysign, bilinear layers, diagonals, RReLU in inference, variances over dynamic dims, max
    pooling with indices, masked scatters, products, quotients, conjugates and magnitudes of complex tensors, the grouped GEMMs of mixture-of-experts layers as `disc::grouped_mm`)."""
    import torch
    import torch._refs.fft
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table  # pure Python: no MLIR loaded

    kept = {getattr(torch.ops.aten, name).default for name in _KEPT_WHOLE}
    table = {op: fn for op, fn in get_decomposition_table().items() if op not in kept}
    table[torch.ops.aten.empty_strided.default] = _empty_strided
    table[torch.ops.aten.as_strided.default] = _as_strided
    table[torch.ops.aten.slice_scatter.default] = _slice_scatter
    table[torch.ops.aten.scaled_dot_product_attention.default] = _scaled_dot_product_attention
    table[torch.ops.aten.sort.stable] = _sort_stable
    table[torch.ops.aten.native_group_norm.default] = _group_norm
    table[torch.ops.aten._native_batch_norm_legit_no_training.default] = _batch_norm_inference
    table[torch.ops.aten._native_multi_head_attention.default] = _native_multi_head_attention
    table[torch.ops.aten._transformer_encoder_layer_fwd.default] = _transformer_encoder_layer
    for op in (torch.ops.aten.upsample_nearest1d, torch.ops.aten.upsample_nearest2d, torch.ops.aten.upsample_nearest3d):
        table[op.vec] = _upsample_nearest
    table[torch.ops.aten.constant_pad_nd.default] = _constant_pad
    table[torch.ops.aten.histc.default] = _histc
    table[torch.ops.aten._grouped_mm.default] = _aten_grouped_mm
    table[torch.ops.aten.clamp.Tensor] = _clamp_tensor
    table[torch.ops.aten.remainder.Tensor] = table[torch.ops.aten.remainder.Scalar] = _remainder
    table[torch.ops.aten.roll.default] = _roll
    aten = torch.ops.aten
    for scalar, tensor in ((aten.__lshift__.Scalar, aten.bitwise_left_shift.Tensor), (aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Tensor),
                           (aten.__rshift__.Scalar, aten.bitwise_right_shift.Tensor), (aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Tensor),
                           (aten.bitwise_and.Scalar, aten.bitwise_and.Tensor), (aten.bitwise_or.Scalar, aten.bitwise_or.Tensor),
                           (aten.bitwise_xor.Scalar, aten.bitwise_xor.Tensor), (aten.fmod.Scalar, aten.fmod.Tensor)):
        table[scalar] = _with_a_tensor_of_the_number(tensor)
    table[aten.isclose.default] = _isclose
    table[aten.kthvalue.default] = _kthvalue
    table[aten.masked_scatter.default] = _masked_scatter
    table[aten.median.default] = table[aten.median.dim] = _median
    table[aten.searchsorted.Tensor] = table[aten.searchsorted.Scalar] = _searchsorted
    table[aten.bucketize.Tensor] = table[aten.bucketize.Scalar] = _bucketize
    table[aten.addmv.default] = _addmv
    table[aten.hypot.default] = _hypot
    table[aten.diagonal.default] = _diagonal
    table[aten.copysign.Tensor] = table[aten.copysign.Scalar] = _copysign
    table[aten.bilinear.default] = _bilinear
    table[aten.rrelu.default] = _rrelu
    table[aten.var.correction] = _var
    table[aten.var_mean.correction] = _var_mean
    table[torch.ops.aten.masked_select.default] = _masked_select
    table[torch.ops.aten.split_with_sizes.default] = _split_with_sizes
    table[torch.ops.aten._unique2.default] = _unique
    table[torch.ops.aten.unique_consecutive.default] = _unique_consecutive
    table[torch.ops.aten.bincount.default] = _bincount
    for name in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"):  # torch's references write them with the three below
        for form in ("", "2", "n"):
            table[getattr(torch.ops.aten, f"fft_{name}{form}").default] = getattr(torch._refs.fft, f"{name}{form}")
    for kind, fn in (("r2c", _fft_r2c), ("c2c", _fft_c2c), ("c2r", _fft_c2r)):  # ATen's, and the references' prims (unnormalized)
        table[getattr(torch.ops.aten, f"_fft_{kind}").default] = table[getattr(torch.ops.prims, f"fft_{kind}").default] = fn
    for op in (torch.ops.aten._conj.default, torch.ops.aten.conj_physical.default):
        table[op] = _conj
    table[torch.ops.aten.abs.default] = _complex_abs
    table[torch.ops.aten.div.Tensor] = _complex_div
    for op, filter_ in ((torch.ops.aten._upsample_bilinear2d_aa, _bilinear_filter), (torch.ops.aten._upsample_bicubic2d_aa, _bicubic_filter)):
        table[op.default], table[op.vec] = _upsample_antialiased(filter_)
    table[torch.ops.aten.mul.Tensor] = _complex_mul
    if hasattr(torch.ops.transformers, "grouped_mm_fallback"):  # registered once transformers' MoE layers are imported
        table[torch.ops.transformers.grouped_mm_fallback.default] = _grouped_mm_fallback
    for op in (torch.ops.aten.embedding_bag.default, torch.ops.aten.embedding_bag.padding_idx, torch.ops.aten._embedding_bag.default):
        table[op] = _embedding_bag
    table[torch.ops.aten.upsample_bilinear2d.vec] = _upsample_bilinear(table.get(torch.ops.aten.upsample_bilinear2d.vec))
    for n in (1, 2, 3):
        adaptive, pool = getattr(torch.ops.aten, f"adaptive_avg_pool{n}d").default, getattr(torch.ops.aten, f"max_pool{n}d").default
        table[adaptive] = _adaptive_avg_pool(n, table[adaptive])
        table[pool] = _max_pool(n, table.get(pool))
        if n > 1:  # adaptive_max_pool1d becomes 2-d
            adaptive_max = getattr(torch.ops.aten, f"adaptive_max_pool{n}d").default
            table[adaptive_max] = _adaptive_max_pool(n, table.get(adaptive_max))
    for n in (2, 3):  # avg_pool1d becomes avg_pool2d, max_pool1d with indices max_pool2d's
        table[getattr(torch.ops.aten, f"avg_pool{n}d").default] = _avg_pool(n)
        table[getattr(torch.ops.aten, f"max_pool{n}d_with_indices").default] = _max_pool_with_indices(n)
    return table


_SYMBOL = re.compile(r"\bs\d+\b")  # torch.export's symbols of input dims (s77)


def _range_constraints(ep: Any) -> tuple[str, ...]:
    """'s0 >= 2', 's0 <= 512' for each symbol of the tensors' dims with finite bounds (not those of
    the inputs torch fixed, an int's)."""
    dims = _dim_symbols(ep)
    texts = []
    for sym, vr in ep.range_constraints.items():
        if not {str(s) for s in sym.free_symbols} <= dims:  # not an int's, nor a size read from the data
            continue
        lo, hi = _finite(vr.lower), _finite(vr.upper)
        if lo is not None and lo > 0:
            texts.append(f"{sym} >= {lo}")
        if hi is not None and hi < 2**62:
            texts.append(f"{sym} <= {hi}")
    return tuple(texts)


def _dim_symbols(ep: Any) -> set[str]:
    """torch.export's symbols in the dims of the tensors the user passes."""
    return {s for shape in _input_dims(ep) for d in shape if isinstance(d, str) for s in _SYMBOL.findall(d)}


def _finite(bound: Any) -> int | None:
    """A range bound as an int; None when unbounded (sympy's `oo` and torch's `int_oo`, which
    calls itself finite but has no integer value)."""
    try:
        return int(bound) if bound is not None and bound.is_finite else None
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def _tensor_specs(model: Any, args: tuple, kwargs: dict, dynamic_shapes: Any) -> list[Any]:
    """Each tensor argument's entry of the user's dynamic_shapes (a dict or a sequence of dims, or
    None), in the order torch.export makes the tensors inputs (the positional arguments, then the
    keyword ones as given): the spec walked beside the arguments, through *args and nested lists,
    tuples and dicts (a KV cache's tensors)."""
    import inspect

    import torch

    if dynamic_shapes is None:
        return []
    signature = inspect.signature(model.forward)
    by_name = dynamic_shapes if isinstance(dynamic_shapes, dict) else dict(
        zip(signature.bind(*args, **kwargs).arguments, dynamic_shapes))  # torch's order: the parameters' (*args one of them)
    extra = next((by_name.get(p.name) for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    pairs = [(value, by_name[name] if name in by_name else extra.get(name) if isinstance(extra, dict) else None)
             for name, value in [*signature.bind_partial(*args).arguments.items(), *kwargs.items()]]
    specs: list[Any] = []

    def walk(value: Any, spec: Any) -> None:
        if isinstance(value, torch.Tensor):
            specs.append(spec)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, spec[i] if isinstance(spec, (list, tuple)) and i < len(spec) else None)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, spec.get(k) if isinstance(spec, dict) else None)
    for value, spec in pairs:
        walk(value, spec)
    return specs


def _dim_names(specs: list[Any], dims: list[tuple[int | str, ...]]) -> dict[str, str]:
    """torch.export's symbol (s77) -> the name of the user's `Dim` for it (batch); `specs`: each
    tensor input's entry of the dynamic_shapes (`_tensor_specs`)."""
    import torch

    names: dict[str, str] = {}
    for spec, shape in zip(specs, dims):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for axis, dim in items:
            expr = shape[axis] if axis < len(shape) else None
            symbols = set(_SYMBOL.findall(expr)) if isinstance(expr, str) else set()
            root = getattr(dim, "root", dim)  # 2 * Dim("h") names its root h
            if len(symbols) == 1 and isinstance(root, torch.export.Dim):
                names.setdefault(symbols.pop(), root.__name__)
    return names


def _rename(text: str, names: dict[str, str]) -> str:
    return _SYMBOL.sub(lambda m: names.get(m.group(0), m.group(0)), text)


def _input_dims(ep: Any) -> list[tuple[int | str, ...]]:
    """Per tensor the user passes, its dims: ints, or the symbolic expression torch.export gave them."""
    tensors = {s.arg.name for s in _user_input_specs(ep) if not _is_constant(s)}
    dims = []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in tensors:
            val = node.meta["val"]
            dims.append(tuple(int(d) if isinstance(d, int) or getattr(d.node, "is_constant", lambda: False)() else
                              str(d.node.expr).replace(" ", "") for d in val.shape))
    return dims


def _numpy(t: Any) -> np.ndarray:
    """A tensor's elements as a contiguous array (a view where the tensor is contiguous on the CPU)."""
    import torch

    t = t.detach().cpu().contiguous()
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


def _hold_back_weights(ep: Any) -> tuple[Any, tuple[str, ...], tuple[np.ndarray, ...]]:
    """A copy of the program with its tensors of PARAM_MIN_BYTES or more (the ones that become
    parameters) replaced by stand-ins of their shape and type (one element, broadcast), so saving
    it for the compiler copies no weights; the names of the replaced tensors (one per distinct tensor: tied
    weights share a stand-in) and their data, which the caller writes into the artifact itself.
    Bool tensors stay: the importer converts them, which a stand-in could not survive."""
    import torch

    from ..artifact import PARAM_MIN_BYTES

    names: list[str] = []
    arrays: list[np.ndarray] = []
    stand_ins: dict[tuple, Any] = {}

    def replaced(table: dict) -> dict:
        out = dict(table)
        for name, t in table.items():
            if not isinstance(t, torch.Tensor) or t.dtype == torch.bool or t.numel() * t.element_size() < PARAM_MIN_BYTES:
                continue
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape), t.stride())
            if key not in stand_ins:
                stand_in = torch.zeros(1, dtype=t.dtype).expand(t.shape)  # (its byte is saved: the same in every process)
                stand_ins[key] = torch.nn.Parameter(stand_in, requires_grad=False) if isinstance(t, torch.nn.Parameter) else stand_in
                names.append(name)
                arrays.append(_numpy(t))
            out[name] = stand_ins[key]
        return out

    state_dict, constants = replaced(ep.state_dict), replaced(ep.constants)
    return _rebuilt(ep, state_dict=state_dict, constants=constants), tuple(names), tuple(arrays)


def _rebuilt(ep: Any, **parts: Any) -> Any:
    """A new ExportedProgram of `ep`'s graph with the given parts (`state_dict=`, ...) replaced."""
    import torch

    return torch.export.ExportedProgram(**{
        "root": ep.graph_module, "graph": ep.graph, "graph_signature": ep.graph_signature, "state_dict": ep.state_dict,
        "range_constraints": ep.range_constraints, "module_call_graph": ep.module_call_graph, "example_inputs": ep.example_inputs,
        "constants": ep.constants, "verifiers": ep.verifiers, **parts})


class _ParameterHooks:
    """Makes the program's tensors (parameters, buffers, lifted constants) of PARAM_MIN_BYTES or
    more trailing arguments of `main` instead of IR literals (torch-mlir would print them into
    the module through Python lists). `held_back`: the data pointer of each stand-in for a tensor
    the caller holds back (`_hold_back_weights`) -> its index there."""

    def __init__(self, held_back: dict[int, int]) -> None:
        from torch_mlir.extras.fx_importer import FxImporterHooks

        self.base = FxImporterHooks()
        self.held_back = held_back
        self.tensors: list[Any] = []
        self.args: dict[tuple, Any] = {}

    def __getattr__(self, name: str) -> Any:  # the importer's other hooks keep their defaults
        return getattr(self.base, name)

    def resolve_literal(self, gni: Any, literal: Any, info: Any) -> Any:
        import torch
        from torch_mlir import ir

        from ..artifact import PARAM_MIN_BYTES
        from ..passes.parameters import add_parameter

        if not isinstance(literal, torch.Tensor) or literal.numel() * literal.element_size() < PARAM_MIN_BYTES:
            return None
        func = gni._b.owner
        if ir.StringAttr(func.attributes["sym_name"]).value != "main":
            if literal.data_ptr() in self.held_back:
                raise CompileError("internal compiler error: a held-back weight is used as a literal inside a nested function")
            return None  # a higher-order op's body: a literal there
        # the tensor is kept alive below, so its address cannot be reused by another while importing
        key = (literal.data_ptr(), literal.dtype, tuple(literal.shape), tuple(literal.stride()))
        if key not in self.args:
            self.args[key] = add_parameter(func, gni._cc.tensor_to_vtensor_type(literal), ir.Location.unknown())
            self.tensors.append(literal)
        return self.args[key]

    def params(self) -> tuple[np.ndarray | Deferred, ...]:
        """Per parameter in argument order: its data, or `Deferred` where the caller holds it."""
        import torch

        return tuple(_numpy(t) if t.data_ptr() not in self.held_back else
                     Deferred(self.held_back[t.data_ptr()], _numpy(torch.empty(0, dtype=t.dtype)).dtype, tuple(t.shape))
                     for t in self.tensors)


def _export(model: Any, args: tuple, kwargs: dict, dynamic_shapes: Any) -> Any:
    """torch.export, with the guards torch's tracing puts on dynamic dims (a pooling's window in
    ceil mode, a view's divisibility) kept in the program as assertions, which become run-time
    checks (`_runtime_assertions`), instead of failing the export because torch cannot prove them
    over the dims' ranges. Where torch's solver for named dims fails on such a guard itself, the
    export is tried again with named dims as `Dim.DYNAMIC` (`_as_hints`; their names come back from
    their positions, `_dim_names`, and their ranges are checked as declared, `_declared_ranges`)."""
    import traceback

    import torch

    def export(spec: Any) -> Any:
        with _recurrent_layers_as_ops():
            return torch.export.export(model, args, kwargs, dynamic_shapes=spec, prefer_deferred_runtime_asserts_over_guards=True)

    if "transformers.modeling_utils" in sys.modules:  # a transformers model: it may return (or take) its KV caches
        _register_transformers_caches()

    try:
        return export(dynamic_shapes)
    except Exception as e:
        error = e
    chain, cause = [], error
    while cause is not None and len(chain) < 8:  # torch re-raises the solver's error as another (a UserError)
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    solving = any(f.name == "produce_guards_and_solve_constraints" for c in chain for f in traceback.extract_tb(c.__traceback__))
    tried: list[str] = []
    for everything in (False, True):  # the dims of at least 2 first (the others keep sizes 0 and 1), then all
        hinted = _as_hints(dynamic_shapes, everything)
        if hinted is None or not solving or str(hinted) in tried:
            continue
        tried.append(str(hinted))
        try:
            return export(hinted)
        except Exception:
            pass  # the first error says more (its suggested fixes name the user's dims)
    moduli = re.findall(r"x/(\d+)", str(error)) if solving and isinstance(error, NotImplementedError) else []
    hint = (f" (torch's solver cannot handle a guard that a dim is divisible, here by {max(map(int, moduli))}: declare such dims "
            f"as multiples of what the model needs, e.g. {max(map(int, moduli))} * Dim(...))") if moduli else ""
    raise CompileError(f"torch.export failed: {' '.join(str(error).split()) or type(error).__name__}{hint}") from None


@functools.cache
def _register_transformers_caches() -> None:
    """transformers' KV caches as torch pytree nodes, so that torch.export takes a model that
    returns (or takes) them: `DynamicCache` as transformers' own export registers it, and
    `EncoderDecoderCache` (T5's, BART's, Whisper's) as its self- and cross-attention caches."""
    import torch
    from transformers.cache_utils import EncoderDecoderCache
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    register_dynamic_cache_export_support()
    try:
        torch.utils._pytree.register_pytree_node(
            EncoderDecoderCache, lambda c: ([c.self_attention_cache, c.cross_attention_cache], None),
            lambda caches, _: EncoderDecoderCache(*caches), serialized_type_name=f"{EncoderDecoderCache.__module__}.EncoderDecoderCache")
    except ValueError as e:  # registered already (by transformers itself, in a later version)
        if "already registered" not in str(e):
            raise


def _as_hints(spec: Any, everything: bool) -> Any:
    """The dynamic_shapes with each plain `Dim` of at least 2 (with `everything`, each plain `Dim`:
    a hint's range starts at 2, so torch's trace then assumes sizes of at least 2) replaced by
    `Dim.DYNAMIC` (the ranges are checked from the user's Dims, `_declared_ranges`); None when
    there is no such Dim, or a derived one (`2 * h`), whose relation a hint cannot say."""
    import torch

    derived, replaced = [], []

    def hint(d: Any) -> Any:
        if hasattr(d, "root"):
            derived.append(d)
        elif d.min >= 2 or everything:
            replaced.append(d)
            return torch.export.Dim.DYNAMIC(min=d.min) if d.min >= 2 else torch.export.Dim.DYNAMIC
        return d

    hinted = _map_dims(spec, hint)
    return hinted if replaced and not derived else None


def _declared_ranges(spec: Any) -> list[str]:
    """'h >= 64', 'h <= 512' for each plain `Dim` of the user's dynamic_shapes with such bounds."""
    texts: list[str] = []

    def note(d: Any) -> Any:
        if not hasattr(d, "root"):
            texts.extend([f"{d.__name__} >= {d.min}"] * (d.min > 0) + [f"{d.__name__} <= {d.max}"] * isinstance(d.max, int))
        return d

    _map_dims(spec, note)
    return texts


def _map_dims(spec: Any, fn: Callable) -> Any:
    """The dynamic_shapes with `fn` applied to each `Dim` in it."""
    import torch

    if isinstance(spec, torch.export.Dim):
        return fn(spec)
    if isinstance(spec, dict):
        return {k: _map_dims(v, fn) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(_map_dims(v, fn) for v in spec)
    return spec


def _runtime_assertions(ep: Any, names: dict[str, str]) -> tuple[str, ...]:
    """Takes torch's `_assert_scalar`s out of the program (torch-mlir cannot convert them). Those
    over the inputs' dims become constraint texts, checked before any kernel runs; those over
    what the data decides (`nonzero`'s rows, `.item()`: `_read_from_data`) become `disc::check`s of the
    condition computed on tensors, checked where those sizes are computed. Both are read from the
    graph (`_size_expression`), and those that hold by what is checked before the call and by
    sizes from the data not being negative are dropped. `names`: the user's names of the inputs'
    dims, for the messages."""
    import sympy
    import torch
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    graph, texts = ep.graph, []
    inputs, (sources, sizes) = _dim_symbols(ep), _read_from_data(ep)
    ranges = {sym: vr for sym, vr in ep.range_constraints.items() if str(sym) in inputs}
    ranges.update({sympy.Symbol(u, integer=True): ValueRanges(0, int_oo) for u in sizes})
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten._assert_scalar.default or not isinstance(node.args[0], torch.fx.Node):
            continue
        expr = _size_expression(node.args[0])
        if expr is None:
            continue
        read = sorted({str(s) for s in expr.free_symbols} - inputs)
        if bound_sympy(expr, ranges).lower is not sympy.true:
            if read:
                message = (f"the data breaks an assumption of the traced program, {_rename(str(expr), names)}: "
                           + "; ".join(sources.get(u, u) for u in read))
                with graph.inserting_before(node):
                    graph.call_function(check_op(), (_size_expression(node.args[0], graph), message))
            else:
                texts.extend(_constraint_texts(expr))
        graph.erase_node(node)
    graph.eliminate_dead_code()
    ep.graph_module.recompile()
    return tuple(texts)


@functools.cache
def _size_ops() -> dict:
    """The operators of size arithmetic in a graph -> (the ATen op computing it on tensors, sympy's)."""
    import operator

    import sympy
    import torch
    from torch.utils._sympy.functions import FloorDiv, PythonMod

    aten, no = torch.ops.aten, {}
    return {operator.add: ((aten.add.Tensor, no), sympy.Add), operator.sub: ((aten.sub.Tensor, no), lambda a, b: a - b),
            operator.mul: ((aten.mul.Tensor, no), sympy.Mul), operator.floordiv: ((aten.div.Tensor_mode, {"rounding_mode": "floor"}), FloorDiv),
            operator.mod: ((aten.remainder.Tensor, no), PythonMod), operator.ge: ((aten.ge.Tensor, no), sympy.Ge),
            operator.gt: ((aten.gt.Tensor, no), sympy.Gt), operator.le: ((aten.le.Tensor, no), sympy.Le), operator.lt: ((aten.lt.Tensor, no), sympy.Lt),
            operator.eq: ((aten.eq.Tensor, no), sympy.Eq), operator.ne: ((aten.ne.Tensor, no), sympy.Ne),
            operator.and_: ((aten.logical_and.default, no), sympy.And), operator.or_: ((aten.logical_or.default, no), sympy.Or),
            torch.sym_not: ((aten.logical_not.default, no), sympy.Not), torch.sym_max: ((aten.maximum.default, no), sympy.Max),
            torch.sym_min: ((aten.minimum.default, no), sympy.Min)}


def _size_expression(node: Any, graph: Any = None) -> Any:
    """What a graph's size arithmetic computes, read from the graph itself: as a sympy expression
    over the symbols of the sizes it reads (their values as first traced: once torch has equated
    a size from the data with another size, it writes one for the other everywhere, and the
    nodes' values no longer say what they compare), or with `graph`, as tensor ops inserted
    there (a 0-d tensor). None where it computes what this does not know."""
    import sympy
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    ops = _size_ops()
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in ops:
        parts = [_size_expression(a, graph) for a in node.args]
        if any(p is None for p in parts):
            return None
        (tensor_op, kwargs), sympy_op = ops[node.target]
        return _traced_call(graph, tensor_op, tuple(parts), kwargs) if graph is not None else sympy_op(*parts)
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
    if not isinstance(value, (torch.SymInt, int)):  # (a bool is an int)
        return None
    if graph is not None:
        return _traced_call(graph, torch.ops.aten.scalar_tensor.default, (node,), {"dtype": torch.bool if isinstance(value, bool) else torch.int64})
    if isinstance(value, int):
        return sympy.sympify(value)
    return value.node._expr if free_unbacked_symbols(value.node._expr) else value.node.expr


def _traced_call(graph: Any, op: Any, args: tuple, kwargs: dict) -> Any:
    """A new node calling `op`, with its value traced as export traces (exported programs need one)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    node = graph.call_function(op, args, kwargs)
    with mode:
        node.meta["val"] = op(*(_traced(a) for a in args), **kwargs)
    return node


def _read_from_data(ep: Any) -> tuple[dict[str, str], set[str]]:
    """torch.export's symbols for what the data decides -> the op that computed each first and
    the user's line, and those of them that are sizes, at least 0 (u0: the rows of a `nonzero`, the
    elements a boolean mask selects, a storage offset; the others are values `.item()` read)."""
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    found: dict[str, str] = {}
    sizes: set[str] = set()
    for node in ep.graph.nodes:
        value = node.meta.get("val")
        dims = value.shape if isinstance(value, torch.Tensor) else ()
        symbols = {str(u) for d in dims if isinstance(d, torch.SymInt) for u in free_unbacked_symbols(d.node._expr)}
        sizes |= symbols
        if isinstance(value, torch.SymInt):
            read = {str(u) for u in free_unbacked_symbols(value.node._expr)}
            symbols |= read
            if node.target is torch.ops.aten.sym_storage_offset.default:  # (of a slice at bounds read from the data)
                sizes |= read
        for symbol in sorted(symbols - set(found)):
            at = _user_line(node)
            found[symbol] = f"{symbol} is a {'size' if symbol in sizes else 'value'} that {node.target} computed from the data" + (
                f" ({at})" if at else "")
    return found, sizes


_RELATIONS = {"StrictLessThan": "<", "LessThan": "<=", "StrictGreaterThan": ">", "GreaterThan": ">=", "Equality": "==",
              "Unequality": "!="}
_FUNCTIONS = {"FloorDiv": "floordiv", "CleanDiv": "floordiv", "Mod": "mod", "PythonMod": "mod", "Max": "max", "Min": "min"}


def _constraint_texts(expr: Any) -> list[str]:
    """A sympy condition over dims as constraint texts: a conjunction one per part, a disjunction
    one `max(...) > 0` of its parts each as an integer positive just where it holds."""
    kind = type(expr).__name__
    if kind == "And":
        return [t for arg in expr.args for t in _constraint_texts(arg)]
    if kind == "Not":
        return _constraint_texts(expr.args[0].negated)
    if kind == "BooleanTrue":
        return []
    if kind == "Or":
        first, *rest = [_positive_where(arg) for arg in expr.args]
        for part in rest:
            first = f"max({first}, {part})"
        return [f"{first} > 0"]
    _relation(expr)
    return [f"{_dim_text(expr.lhs)} {_RELATIONS[kind]} {_dim_text(expr.rhs)}"]


def _relation(expr: Any) -> None:
    if type(expr).__name__ not in _RELATIONS:
        raise CompileError(f"torch.export's run-time assertion over {expr} cannot be checked here: "
                           f"{type(expr).__name__} is not a comparison")


def _positive_where(expr: Any) -> str:
    """A comparison of integers as an integer that is positive exactly where it holds."""
    _relation(expr)
    a, b, kind = _dim_text(expr.lhs), _dim_text(expr.rhs), _RELATIONS[type(expr).__name__]
    gap = f"({a} - {b})"
    return {"<": f"-{gap}", "<=": f"1 - {gap}", ">": gap, ">=": f"{gap} + 1", "==": f"1 - {gap}*{gap}", "!=": f"{gap}*{gap}"}[kind]


def _dim_text(expr: Any) -> str:
    """A sympy integer expression over dims in the constraints' syntax (`floordiv(s0 - 3, 2)`)."""
    kind = type(expr).__name__
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if kind == "Add":
        return "(" + " + ".join(_dim_text(a) for a in expr.args) + ")"
    if kind == "Mul":
        return "*".join(_dim_text(a) for a in expr.args)
    if kind == "Pow" and expr.exp.is_Integer and expr.exp > 0:
        return "*".join([_dim_text(expr.base)] * int(expr.exp))
    if kind in _FUNCTIONS:
        first, *rest = expr.args
        text = _dim_text(first)
        for arg in rest:  # Max(a, b, c): max(max(a, b), c)
            text = f"{_FUNCTIONS[kind]}({text}, {_dim_text(arg)})"
        return text
    raise CompileError(f"torch.export's run-time assertion over {expr} cannot be checked here: {kind} is not supported")


def _export_torch(model: Any, *example_inputs: Any, dynamic_shapes: Any = None) -> tuple[Source, Binding]:
    """`example_inputs`: one tuple (or list) of positional arguments, a dict of keyword arguments
    or a single tensor, or several positional arguments as they are."""
    import tempfile

    import torch

    if isinstance(model, torch.export.ExportedProgram):
        ep, specs = model, []
    else:
        if not isinstance(model, torch.nn.Module):
            model = _as_module(model)
        first = example_inputs[0] if len(example_inputs) == 1 else example_inputs
        if isinstance(first, collections.abc.Mapping):  # keyword arguments (a tokenizer's output)
            args, kwargs = (), dict(first)
        else:
            args, kwargs = tuple(first) if isinstance(first, (tuple, list)) else (first,), {}
        args, kwargs = _unaliased((args, kwargs))
        ep, specs = _export(model.eval(), args, kwargs, dynamic_shapes), _tensor_specs(model, args, kwargs, dynamic_shapes)
    dims = _input_dims(ep)
    names = _dim_names(specs, dims)
    binding = _binding(ep)
    ep = _plain_structure(ep, arguments=False)
    dims = [tuple(_rename(d, names) if isinstance(d, str) else d for d in shape) for shape in dims]
    _decomposable_forms(ep)
    try:
        with _fft_norms_of_sizes():
            ep = ep.run_decompositions(_decompositions())  # here: a saved and loaded program loses derived dims' forms
    except UnsupportedOpError:
        raise  # a form of an op our decompositions do not take
    except Exception as e:
        raise CompileError(f"decomposing the exported program failed: {e}") from None
    _refuse_ops_not_compiled(ep)
    constraints = tuple(dict.fromkeys([_rename(c, names) for c in _range_constraints(ep)] + _declared_ranges(dynamic_shapes)
                                      + [_rename(c, names) for c in _runtime_assertions(ep, names)]))  # (tracing again adds the last)
    _size_arithmetic(ep)
    _float_comparisons(ep)
    _tensors_first(ep)
    _complex_as_pairs(ep)
    _weights_in_lists(ep)
    for node in ep.graph.nodes:  # provenance the compiler does not read, with ids of this process's objects
        node.meta.pop("from_node", None)
    ep, held_back, weights = _hold_back_weights(_plain_structure(ep, arguments=True))
    fd, path = tempfile.mkstemp(prefix="disc-", suffix=".pt2")  # removed once compiled (kept as the reproducer of a crash)
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its note that the stand-ins (zero strides) are incomplete tensors
            torch.export.save(ep, path)
    except Exception as e:
        os.unlink(path)
        raise CompileError(f"torch.export could not save the exported program for the compiler: {e}") from None
    return Source("torch", path, tuple(dims), tuple(ep.graph_signature.user_inputs), checked=constraints, held_back=held_back,
                  weights=weights), binding


def _plain_structure(ep: Any, arguments: bool) -> Any:
    """The program with its results (and with `arguments`, its arguments too) structured as a plain
    tuple of its outputs (inputs). Results before anything retraces the program: rebuilding a
    model's output classes inside the trace runs their code (a transformers `DynamicCache` creates
    tensors, which torch's decomposition then fails to find). Both for the compiler worker, which
    does not import the model's library and could not load its classes. The caller keeps the
    structure (`_binding`)."""
    import dataclasses

    from torch.utils._pytree import tree_structure

    root = ep.module_call_graph[0]  # the root module's entry
    signature = dataclasses.replace(root.signature, out_spec=tree_structure(tuple(range(len(ep.graph_signature.user_outputs)))))
    parts: dict[str, Any] = {}
    if arguments:  # the tensors alone: the inputs torch fixed (no node reads them) go
        constants = [s for s in _user_input_specs(ep) if _is_constant(s)]
        for node in [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in {s.arg.name for s in constants}]:
            ep.graph.erase_node(node)
        ep.graph_module.recompile()
        tensors = [s for s in _user_input_specs(ep) if not _is_constant(s)]
        parts = {"graph_signature": dataclasses.replace(ep.graph_signature, input_specs=[s for s in ep.graph_signature.input_specs
                                                                                         if s not in constants]),
                 "example_inputs": None}
        signature = dataclasses.replace(signature, in_spec=tree_structure((tuple(s.arg.name for s in tensors), {})))
    return _rebuilt(ep, module_call_graph=[dataclasses.replace(root, signature=signature), *ep.module_call_graph[1:]], **parts)


def _binding(ep: Any) -> Binding:
    """Arguments taken as the model takes them (tensors in nested lists, tuples and dicts, flattened
    in torch's order; the keyword arguments it was exported with), results given back in the
    model's output structure (a transformers `ModelOutput`, a dict, a tuple) where each of its
    leaves is a result, by a loaded artifact too where torch can write the structure down.
    Arguments that are not tensors (a flag, a scale) torch.export fixed at their example values:
    the call checks them and passes them on to nothing."""
    from torch.utils._pytree import tree_unflatten, treespec_dumps

    keywords = tuple(ep.call_spec.in_spec.child(1).context) if ep.call_spec.in_spec is not None else ()
    fixed = tuple((i, s.arg.name, s.arg.value) for i, s in enumerate(_user_input_specs(ep)) if _is_constant(s))
    spec = ep.call_spec.out_spec
    if spec is None or spec.num_leaves != len(ep.graph_signature.user_outputs):
        return Binding(pytree="torch", keywords=keywords, fixed=fixed)
    try:  # for a loaded artifact: torch's own text of the structure (a type it cannot name: results as a tuple)
        saved = treespec_dumps(spec)
    except NotImplementedError:
        saved = None
    return Binding(pytree="torch", keywords=keywords, fixed=fixed, pack_results=functools.partial(tree_unflatten, treespec=spec),
                   result_tree=saved)


def _user_input_specs(ep: Any) -> list[Any]:
    from torch.export.graph_signature import InputKind

    return [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def _is_constant(spec: Any) -> bool:
    """An input torch.export fixed at its example value (not a tensor: a bool, a number, a string, None)."""
    from torch.export.graph_signature import ConstantArgument

    return isinstance(spec.arg, ConstantArgument)


def _refuse_ops_not_compiled(ep: Any) -> None:
    """Operators a library defines for itself (`torch.library`: torchvision's detection ops) have
    no conversion to StableHLO, and the compiler's process, which does not import the library,
    could not even load the program. Ours (`disc::`) are known to it; transformers' grouped GEMM
    was decomposed into ours. Random sampling (`torch.randn`, `rand`, dropout in training mode:
    ops torch tags as seeded) is not compiled either: the model should take its noise as an
    argument. Each is refused by name, with the user's line."""
    import torch

    foreign: dict[str, str] = {}
    random: dict[str, str] = {}
    for node in ep.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        at = _user_line(node)
        if node.target.namespace not in ("aten", "prims", "disc"):
            foreign.setdefault(node.target._schema.name, at)
        elif torch.Tag.nondeterministic_seeded in node.target.tags:
            random.setdefault(node.target._schema.name, at)

    def named(ops: dict[str, str]) -> str:
        return "; ".join(f"{name} ({at})" if at else name for name, at in ops.items())
    if foreign:
        raise UnsupportedOpError(f"the exported program calls operators defined outside PyTorch's ATen, which disc_stablehlo "
                                 f"cannot compile: {named(foreign)}")
    if random:
        raise UnsupportedOpError(f"the exported program samples random numbers, which disc_stablehlo does not compile (pass the "
                                 f"noise in as an argument instead): {named(random)}")


def _user_line(node: Any) -> str:
    """Where the user's code made a graph node: 'File "...", line N, in f: code' ('' if unknown)."""
    lines = [line.strip() for line in (node.meta.get("stack_trace") or "").splitlines() if line.strip()]
    return f"{lines[-2]}: {lines[-1]}" if len(lines) >= 2 else ""


def _traced(v: Any) -> Any:
    """A graph argument's value as traced (a node's fake tensor or symbolic size; a constant as it is)."""
    import torch

    return v.meta.get("val") if isinstance(v, torch.fx.Node) else v


def _tensors_first(ep: Any) -> None:
    """`sub`, `add` and `mul` of a number (a size) and a tensor in that order, which torch's
    decompositions write (reflection padding's `n - 1 - |i|`) and torch-mlir refuses (its
    operand 0 must be a tensor): `rsub` of the tensor, or the operands swapped."""
    import torch

    aten = torch.ops.aten
    changed = False
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.sub.Tensor, aten.add.Tensor, aten.mul.Tensor) or node.kwargs:
            continue
        first, second = node.args[:2]
        if isinstance(_traced(first), torch.Tensor) or not isinstance(_traced(second), torch.Tensor):
            continue
        node.args = (second, first)
        if node.target is aten.sub.Tensor:
            node.target = aten.rsub.Scalar
        changed = True
    if changed:
        ep.graph_module.recompile()


def _float_comparisons(ep: Any) -> None:
    """A float tensor compared with an integer number (`x > 0`) compares with that number as a
    float, as torch does: torch-mlir's folder gets such a comparison of a constant tensor wrong
    (`torch.full((), 2.5) < 0` folded to true, `> 2` to false)."""
    import torch

    aten = torch.ops.aten
    comparisons = {aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar, aten.eq.Scalar, aten.ne.Scalar}
    changed = False
    for node in ep.graph.nodes:
        if node.op == "call_function" and node.target in comparisons and type(node.args[1]) is int:
            value = getattr(node.args[0], "meta", {}).get("val")
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                node.update_arg(1, float(node.args[1]))
                changed = True
    if changed:
        ep.graph_module.recompile()


def _size_arithmetic(ep: Any) -> None:
    """Size arithmetic that torch.export cannot save or torch-mlir cannot import, as chains of the
    operators both take: `torch.sym_sum` (a sum of sizes, which tracing under dynamo writes:
    Swin's and DINOv2's patch grids) as additions, a size to a whole constant power as
    multiplications, a size modulo another (Swin's padding to whole windows; torch-mlir
    imports `%` as `fmod`, which it cannot convert) as a - (a // b) * b, and the larger or
    smaller of two sizes (`torch.sym_max`: MPT's position bias cut to the sequence) as TorchScript's
    `prim::max.int` / `prim::min.int`, which torch-mlir converts."""
    import operator

    import torch

    graph = ep.graph

    def chain(node: Any, op: Any, terms: list) -> None:
        total = terms[0]
        with graph.inserting_before(node):
            for term in terms[1:]:
                before = _traced(total)
                total = graph.call_function(op, (total, term))
                total.meta["val"] = op(before, _traced(term))
        node.replace_all_uses_with(total)
        graph.erase_node(node)

    for node in [n for n in graph.nodes if n.op == "call_function"]:
        if node.target is torch.sym_sum:
            chain(node, operator.add, list(node.args[0]))
        elif node.target is operator.pow and isinstance(node.args[1], int) and 1 <= node.args[1] <= 8:
            chain(node, operator.mul, [node.args[0]] * node.args[1])
        elif node.target in (torch.sym_max, torch.sym_min) and isinstance(_traced(node), torch.SymInt):
            node.target = torch.ops.prim.max.int if node.target is torch.sym_max else torch.ops.prim.min.int
        elif node.target is operator.mod and isinstance(_traced(node), torch.SymInt):
            a, b = node.args
            with graph.inserting_before(node):
                quotient = graph.call_function(operator.floordiv, (a, b))
                quotient.meta["val"] = _traced(a) // _traced(b)
                whole = graph.call_function(operator.mul, (quotient, b))
                whole.meta["val"] = quotient.meta["val"] * _traced(b)
            chain(node, operator.sub, [a, whole])
    ep.graph_module.recompile()


def _weights_in_lists(ep: Any) -> None:
    """A weight in a list argument (WavLM's `torch.cat` of its query, key and value biases) read
    through `aten.alias`: torch-mlir's importer puts the weights of the program in place of their
    inputs, and takes a weight alone as an argument, but not inside a list."""
    import torch

    graph = ep.graph
    weights = {n for n in graph.nodes if n.op == "placeholder" and n.name not in ep.graph_signature.user_inputs}
    changed = False
    for node in [n for n in graph.nodes if n.op == "call_function"]:
        for i, arg in enumerate(node.args):
            if not isinstance(arg, (list, tuple)) or not any(a in weights for a in arg):
                continue
            changed, read = True, []
            for a in arg:
                if a in weights:
                    with graph.inserting_before(node):
                        alias = graph.call_function(torch.ops.aten.alias.default, (a,))
                    alias.meta["val"] = a.meta["val"]
                    a = alias
                read.append(a)
            node.update_arg(i, type(arg)(read))
    if changed:
        ep.graph_module.recompile()


def _complex_as_pairs(ep: Any) -> None:
    """Complex tensors, for which torch-mlir's StableHLO lowering has no conversion, as real
    tensors of (real, imaginary) pairs in a trailing dim of 2 (`view_as_real`'s form): Llama 4's
    rotary positions (`torch.polar`, the queries and keys seen as complex pairs, their products:
    `_complex_mul` writes those in pairs already), Fourier transforms (`_fft_r2c` and the others). Done where every complex value is made by
    `view_as_complex`, `polar` or a view and used by `view_as_real` or a view; otherwise nothing
    changes (and torch-mlir names the op it cannot convert)."""
    import torch

    aten = torch.ops.aten
    graph = ep.graph

    def complex_(v: Any) -> bool:
        return isinstance(_traced(v), torch.Tensor) and _traced(v).is_complex()

    views = {aten.unsqueeze.default, aten.slice.Tensor, aten.select.int, aten.clone.default, aten.alias.default,
             aten.expand.default, aten.view.default, aten.permute.default, torch.ops.prims.convert_element_type.default}
    made = [n for n in graph.nodes if complex_(n)]
    if not made or not all(n.op == "call_function" and n.target in views | {aten.view_as_complex.default, aten.polar.default}
                           and all(u.op == "call_function" and (u.target in views | {aten.view_as_real.default} or
                                                                u.target is aten._assert_tensor_metadata.default) for u in n.users)
                           for n in made):
        return

    def call(op: Any, *args: Any) -> Any:
        node = graph.call_function(op, args)
        node.meta["val"] = op(*[[_traced(a) for a in v] if isinstance(v, (list, tuple)) else _traced(v) for v in args])
        return node

    pairs: dict[Any, Any] = {}
    for n in made:
        rank = _traced(n.args[0]).dim() if n.target in views else 0
        with graph.inserting_before(n):
            if n.target is aten.view_as_complex.default:
                pairs[n] = n.args[0]
            elif n.target is aten.polar.default:
                size, angle = n.args
                pairs[n] = call(aten.stack.default, [call(aten.mul.Tensor, size, call(aten.cos.default, angle)),
                                                     call(aten.mul.Tensor, size, call(aten.sin.default, angle))], -1)
            elif n.target is aten.unsqueeze.default:
                pairs[n] = call(n.target, pairs[n.args[0]], n.args[1] % (rank + 1))
            elif n.target in (aten.slice.Tensor, aten.select.int):
                pairs[n] = call(n.target, pairs[n.args[0]], n.args[1] % rank, *n.args[2:])
            elif n.target in (aten.expand.default, aten.view.default):
                pairs[n] = call(n.target, pairs[n.args[0]], [*n.args[1], 2])
            elif n.target is aten.permute.default:
                pairs[n] = call(n.target, pairs[n.args[0]], [d % rank for d in n.args[1]] + [rank])
            elif n.target is torch.ops.prims.convert_element_type.default:  # the FFT references': real -> complex, complex64 <-> 128
                x = n.args[0]
                if not complex_(x):
                    x = call(n.target, x, n.args[1].to_real())
                    pairs[n] = call(aten.stack.default, [x, call(aten.zeros_like.default, x)], -1)
                else:
                    pairs[n] = call(n.target, pairs[x], n.args[1].to_real())
            else:  # clone, alias
                pairs[n] = pairs[n.args[0]]
    for n in made:
        for u in list(n.users):
            if u.target is aten._assert_tensor_metadata.default:
                graph.erase_node(u)
            elif u.target is aten.view_as_real.default:
                u.replace_all_uses_with(pairs[n])
                graph.erase_node(u)
    for n in reversed(made):
        graph.erase_node(n)
    ep.graph_module.recompile()


def _unaliased(args: Any) -> Any:
    """The example inputs as the compiled function reads its arguments, row-major: a tensor that
    is not contiguous copied (an expanded one's zero strides became symbols of their own, which
    torch.export then constrains), and each tensor that shares memory with an earlier one copied:
    torch.export takes inputs that alias for one input and binds every use to the last of them
    (`f(x, x, x)` would compile a function reading its third argument only)."""
    import torch
    from torch.utils._pytree import tree_map

    seen: set[int] = set()

    def own(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        x = x.contiguous()
        address = x.untyped_storage().data_ptr()
        if address in seen:
            return x.clone()
        seen.add(address)
        return x
    return tree_map(own, args)


def _decomposable_forms(ep: Any) -> None:
    """Ops whose exported form decomposition cannot take, or takes slowly, replaced by ATen ops
    computing the same (the exported program is functional: a view and a copy mean the same).
    `view` becomes `reshape`: re-tracing with symbolic sizes can give a tensor strides that `view`
    rejects where the first trace saw a contiguous one (GPT-2's attention output: its
    `.contiguous()` was a no-op then and is gone), while `reshape` copies where it must. prims'
    views (which AOTAutograd's decompositions leave in dynamo's graphs: squeeze.dim ->
    prims.squeeze) become their ATen forms: functionalization takes no aliasing op outside ATen.
    An in-place op (`relu_`, `hardswish_`, `add_`) on a fresh tensor nothing else reads becomes
    its functional form: functionalizing it goes through torch's reference decomposition of the
    op, which costs a model like MobileNetV3 seconds with symbolic sizes. Indexing ops get their
    negative indices wrapped (`_indexing`)."""
    import torch

    forms = {torch.ops.aten.view.default: torch.ops.aten.reshape.default,
             torch.ops.prims.squeeze.default: torch.ops.aten.squeeze.dims,
             torch.ops.prims.view_of.default: torch.ops.aten.alias.default,
             torch.ops.prims.transpose.default: torch.ops.aten.permute.default}
    changed = False
    for node in list(ep.graph.nodes):
        if node.op != "call_function":
            continue
        target = forms.get(node.target) or _functional_form(node)
        if target is not None:
            node.target = target
            changed = True
        if node.target in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default):
            _indexing(ep.graph, node)
            changed = True
    if changed:
        ep.graph_module.recompile()


def _indexing(graph: Any, node: Any) -> None:
    """An `x[indices]` (aten.index) or `x[indices] = v` (aten.index_put) node with each integer
    index i made `where(i < 0, i + size, i)`, as PyTorch reads negative indices: the gather or
    scatter it becomes clamps them to 0 instead (a silent wrong answer: Falcon's
    `fused_qkv[..., [-2], :]`). The wrapped indices are computed, so no tensor literal is left in
    the index list, which the FX importer cannot take (a buffer as the index: Swin's relative
    position index). Indices seen to be an `arange` from 0 up keep their form (the shape analysis
    proves such a gather reads in place: transformers' padding masks). An aten.index whose one
    index is a vector becomes `index_select` along its dim: torch-mlir's gather for aten.index
    needs every other dim static. Boolean masks are `_boolean_index`'s."""
    import torch

    aten = torch.ops.aten
    if _boolean_index(graph, node):
        return
    x, indices = node.args[0], node.args[1]
    shape = x.meta["val"].shape
    wrapped, dim, selected = [], 0, []
    for i in indices:
        val = i.meta.get("val") if isinstance(i, torch.fx.Node) else None
        if val is None:
            wrapped.append(i)
            dim += 1
            continue
        if val.dtype == torch.bool:  # with other indices: its positions, one index per dim it covers
            with graph.inserting_before(node):
                positions = graph.call_function(aten.nonzero.default, (i,))
                positions.meta["stack_trace"] = node.meta.get("stack_trace")  # names the user's line in a failed assertion
                wrapped += [graph.call_function(aten.select.int, (positions, 1, k)) for k in range(val.dim())]
            dim += val.dim()
            continue
        if not _counts_up(i):
            with graph.inserting_before(node):
                size = shape[dim] if isinstance(shape[dim], int) else graph.call_function(aten.sym_size.int, (x, dim))
                negative = graph.call_function(aten.lt.Scalar, (i, 0))
                i = graph.call_function(aten.where.self, (negative, graph.call_function(aten.add.Tensor, (i, size)), i))
        wrapped.append(i)
        selected.append((dim, val.dim()))
        dim += 1
    if node.target == aten.index.Tensor and len(selected) == 1 == selected[0][1] and sum(i is not None for i in indices) == 1:
        node.target, node.args = aten.index_select.default, (x, selected[0][0], wrapped[selected[0][0]])
    else:
        node.args = (x, wrapped, *node.args[2:])


def _boolean_index(graph: Any, node: Any) -> bool:
    """`x[mask]` and `x[mask] = v` with one boolean mask (over dims p to p + m - 1) and no other
    index, rewritten without the op's boolean form (torch-mlir's gather takes a mask for indices):
    - `x[mask]`: x with those dims flattened into one, `index_select`ed at the flat positions of
      the mask's true elements (`nonzero`: as many as the data has, a size known at run time);
    - `x[mask] = v` where v holds no value per selected element (it broadcasts over the dims
      after the mask's): `where(mask, v, x)` (with `accumulate`, `x + where(mask, v, 0)`), no
      data-dependent size at all.
    Other forms (a mask beside integer indices, one value per selected element) index with the
    mask's positions (`_indexing`). Returns whether the node was rewritten."""
    import torch

    aten = torch.ops.aten
    x, indices = node.args[0], list(node.args[1])
    masks = [k for k, i in enumerate(indices) if isinstance(i, torch.fx.Node) and i.meta.get("val") is not None
             and i.meta["val"].dtype == torch.bool]
    if len(masks) != 1 or any(i is not None for k, i in enumerate(indices) if k != masks[0]):
        return False
    p, mask = masks[0], indices[masks[0]]
    m, rank = mask.meta["val"].dim(), x.meta["val"].dim()
    with graph.inserting_before(node):
        if node.target == aten.index.Tensor:
            flat = graph.call_function(aten.flatten.using_ints, (x, p, p + m - 1)) if m != 1 else x
            where = graph.call_function(aten.nonzero.default, (graph.call_function(aten.reshape.default, (mask, [-1])),))
            where.meta["stack_trace"] = node.meta.get("stack_trace")  # names the user's line in a failed assertion
            positions = graph.call_function(aten.select.int, (where, 1, 0))
            node.target, node.args = aten.index_select.default, (flat, p, positions)
            return True
        v, accumulate = node.args[2], node.args[3] if len(node.args) > 3 else False
        value = v.meta.get("val") if isinstance(v, torch.fx.Node) else None
        if value is None or value.dim() > rank - p - m:
            return False
        for _ in range(rank - p - m):
            mask = graph.call_function(aten.unsqueeze.default, (mask, -1))
        v = graph.call_function(aten._to_copy.default, (v,), {"dtype": x.meta["val"].dtype})
        if accumulate:
            zero = graph.call_function(aten.zeros_like.default, (v,))
            node.target, node.args, node.kwargs = aten.add.Tensor, (x, graph.call_function(aten.where.self, (mask, v, zero))), {}
        else:
            node.target, node.args, node.kwargs = aten.where.self, (mask, v, x), {}
    return True


def _counts_up(node: Any) -> bool:
    """Whether the FX node's values are an `arange` from 0 or more up, seen through ops that
    move or copy values without changing them."""
    import torch

    aten = torch.ops.aten
    moves = {aten.unsqueeze.default, aten.reshape.default, aten.view.default, aten.expand.default, aten.slice.Tensor,
             aten.select.int, aten.permute.default, aten.transpose.int, aten.squeeze.dim, aten.squeeze.dims,
             aten.flatten.using_ints, aten.clone.default, aten.alias.default}
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in moves:
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if node.target == aten.arange.default:
        return True
    start = node.args[0] if node.target in (aten.arange.start, aten.arange.start_step) else None
    step = node.args[2] if node.target == aten.arange.start_step and len(node.args) > 2 else 1
    return isinstance(start, int) and start >= 0 and isinstance(step, int) and step > 0


def _functional_form(node: Any) -> Any:
    """The functional overload of an in-place ATen op whose `self` is a fresh tensor (the result
    of an op that returns no alias) read by nothing else; None otherwise."""
    import torch

    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.name.startswith("aten::") or not schema.name.endswith("_") or not node.args:
        return None
    packet = getattr(torch.ops.aten, schema.name[len("aten::"):-1], None)
    functional = getattr(packet, node.target._overloadname, None) if packet is not None else None
    self = node.args[0]
    producer = getattr(getattr(self, "target", None), "_schema", None)
    if (functional is None or len(self.users) != 1 or self.op != "call_function" or producer is None
            or any(r.alias_info is not None for r in producer.returns)):
        return None
    return functional


def _unconverted_op(text: str) -> str | None:
    """What torch-mlir's error says it could not convert, in the user's terms, or None."""
    m = re.search(r'failed to legalize operation \'torch\.operator\'.*?name = "torch\.([\w.]+)"', text) or \
        re.search(r"failed to legalize operation 'torch\.((?:aten|prims)\.[\w.]+)'", text)
    if m:
        return f"torch-mlir cannot convert {m.group(1)} (for these sizes and arguments)"
    if re.search(r"failed to legalize operation 'torch\.constant\.(int|float|bool|str|none)'", text):
        return "torch-mlir cannot convert an op with a constant argument it does not take (its error names the constant, not the op)"
    if "Unimplemented call_function: target=<function sym_float" in text:
        return ("torch-mlir cannot import a size converted to a float (sym_float: a fractional scale of interpolation, "
                "quantile, a size times a float)")
    return None


def _restore_list_values(graph: Any) -> None:
    """A saved program comes back with the values of ops returning a tensor list (`split`, GRU's
    gates) as tuples, which torch-mlir takes for several results: made lists again; and without
    the tensor metadata torch-mlir's importer reads for `.item()` (`_local_scalar_dense`)."""
    import torch
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    for node in graph.nodes:
        val = node.meta.get("val")
        returns = getattr(getattr(node.target, "_schema", None), "returns", ())
        if isinstance(val, tuple) and len(returns) == 1 and isinstance(returns[0].type, torch.ListType):
            node.meta["val"] = list(val)
        if node.target is torch.ops.aten._local_scalar_dense.default and "tensor_meta" not in node.args[0].meta:
            node.args[0].meta["tensor_meta"] = _extract_tensor_metadata(node.args[0].meta["val"])


@contextlib.contextmanager
def _quick_load() -> Any:
    """torch.export's loader, without two costs that grow with the program:
    - it parses each symbolic size and stride of every node from its text, and each
      sub-expression again for every expression holding it (sympy, quadratic in the nesting): a
      DenseNet's sizes, floor divisions nested through its poolings and concatenations, took 26 s
      to load. While loading, each expression is parsed once (a later request for it, with no
      new hint, gets the first result).
    - it resolves the type hints of a schema class again for every object it reads (16 000 times
      for BERT-base: 1 s of the 1.6 s its loading took). While loading, once per class."""
    import types
    import typing

    from torch._export.serde import serialize
    from torch._export.serde.serialize import GraphModuleDeserializer

    parse = GraphModuleDeserializer._parse_sym_expr

    def once(self: Any, expr: Any, hint: Any = None) -> Any:
        seen = self.__dict__.setdefault("_disc_parsed", {})
        sym = seen.get(expr)
        if sym is None or (hint is not None and sym not in self.shape_env.backed_var_to_val):
            sym = seen[expr] = parse(self, expr, hint)
        return sym

    hints: dict[tuple, Any] = {}

    def get_type_hints(cls: Any, globalns: Any = None) -> Any:
        key = (cls, id(globalns))
        if key not in hints:
            hints[key] = typing.get_type_hints(cls, globalns=globalns)
        return hints[key]

    GraphModuleDeserializer._parse_sym_expr = once
    serialize.typing = types.SimpleNamespace(**{**vars(typing), "get_type_hints": get_type_hints})  # the loader's `typing`
    try:
        yield
    finally:
        GraphModuleDeserializer._parse_sym_expr = parse
        serialize.typing = typing


def import_torch(source: Source) -> Imported:
    """In the worker: the saved program through torch-mlir's FX importer (tensors of the program
    become parameters, `_ParameterHooks`) to StableHLO."""
    import torch
    import torch_mlir.fx as fx
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_dialect
    from torch_mlir.extras.fx_importer import FxImporter

    from ..bounded_dynamism.signature import signature_from_function
    from .torch_ops import define_functions, lower_to_stablehlo

    grouped_mm_op(), check_op(), fft_op(), recurrent_ops()  # the program may call them
    serde_log = logging.getLogger("torch._export.serde.serialize")
    level = serde_log.level
    serde_log.setLevel(logging.ERROR)  # its warning that a size read from the data (u0) has no node that makes it: none need
    try:
        with _quick_load():
            ep = torch.export.load(source.payload)
    finally:
        serde_log.setLevel(level)
    _restore_list_values(ep.graph)
    # non-persistent buffers (e.g. position ids) live with the constants, where the importer does not look
    ep.state_dict.update({name: ep.constants[name] for name in ep.graph_signature.non_persistent_buffers if name in ep.constants})
    context = ir.Context()
    torch_dialect.register_dialect(context)
    diagnostics: list[str] = []  # torch-mlir's conversion errors name the op: kept for our error, not printed
    context.attach_diagnostic_handler(lambda d: diagnostics.append(d.message) or True)
    hooks = _ParameterHooks({(ep.state_dict[name] if name in ep.state_dict else ep.constants[name]).data_ptr(): i
                              for i, name in enumerate(source.held_back)})
    try:
        mlir = fx.export_and_import(ep, output_type="raw", decomposition_table={},  # decomposed by the caller
                                    fx_importer=FxImporter(context=context, hooks=hooks))
        definitions = lower_to_stablehlo(mlir)
    except Exception as e:
        details = "".join(f"\n  {m}" for m in dict.fromkeys(diagnostics))
        message = f"torch-mlir could not convert the exported program to StableHLO: {str(e).strip()}{details}"
        named = _unconverted_op(f"{e}{details}")
        raise (UnsupportedOpError(f"{named}: {message}") if named else CompileError(message)) from None
    module = parse_stablehlo(str(mlir))
    with module.context:
        define_functions(module, definitions)
        entry = find_entry(module)
        params = hooks.params()
        sig = signature_from_function(entry, source.arg_dims, source.arg_names, len(params))
        return Imported(module, entry_name(entry), sig, checked=source.checked, params=params)


# what `import_torch` loads: 1.8 s, spent in the worker while the caller exports
_IMPORTER_MODULES = ("torch", "torch.export", "torch._export.serde.serialize", "torch_mlir.fx", "torch_mlir.extras.fx_importer",
                     "torch_mlir.dialects.torch")
register_frontend(_is_torch, _export_torch, "torch", import_torch, _IMPORTER_MODULES)


def _from_fx_graph(gm: Any, example_inputs: list) -> tuple[Source, Callable[[tuple], list], Callable[[list, list], tuple]]:
    """An ATen-level FX graph (AOTAutograd's, under dynamo) as an exported program for the
    compiler worker, the compiled function's arguments from the graph's, and how to assemble the
    graph's outputs from the compiled results and those arguments. Dynamic sizes arrive as
    separate integer inputs; the exported function takes the tensors only and reads each size
    from the tensor dim that carries the same symbol, or, for a size no input tensor has (a
    sequence length the graph slices to), from an empty tensor of that many rows passed beside
    them. It returns the tensor outputs only: sizes the graph returns are computed from the inputs' dims.
    Its example tensors have the fake ones' sizes (their hints) and every dim dynamo made symbolic
    is `Dim.AUTO`: torch.export finds their relations and ranges (the guards dynamo holds) again."""
    import torch

    tensors = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
    where: dict[str, tuple[int, int]] = {}  # symbol -> (tensor argument, dim)
    for k, i in enumerate(tensors):
        for d, size in enumerate(example_inputs[i].shape):
            if isinstance(size, torch.SymInt):
                where.setdefault(str(size.node.expr), (k, d))
    layout: list[int | tuple[int, int]] = []  # per graph input: its tensor's index, or (tensor, dim) of its size
    carried: list[int] = []  # the graph inputs of sizes no tensor has, each carried by an empty tensor (rows: the size)
    for i, x in enumerate(example_inputs):
        expr = getattr(getattr(x, "node", None), "expr", None)
        if isinstance(x, torch.Tensor):
            layout.append(sum(1 for entry in layout if isinstance(entry, int)))
        elif str(expr) not in where and isinstance(x, torch.SymInt) and expr.is_Symbol:
            carried.append(i)
            where[str(expr)] = (len(tensors) + len(carried) - 1, 0)
            layout.append(where[str(expr)])
        elif str(expr) in where:
            layout.append(where[str(expr)])
        else:
            raise CompileError(f"disc_stablehlo backend: graph input {x!r} is neither a tensor nor a size")
    outputs = [_traced(out) for out in next(iter(gm.graph.find_nodes(op="output"))).args[0]]
    keep = [isinstance(v, torch.Tensor) for v in outputs]
    for v in outputs:
        missing = {str(sym) for sym in v.node.expr.free_symbols} - set(where) if isinstance(v, torch.SymInt) else set()
        if missing or not isinstance(v, (torch.Tensor, torch.SymInt, int, float, bool, type(None))):
            raise CompileError(f"disc_stablehlo backend: graph output {v!r} is neither a tensor nor a size of the inputs")

    def assemble(results: list, inputs: list) -> tuple:
        results_iter = iter(results)
        out = []
        for v, is_tensor in zip(outputs, keep):
            if is_tensor:
                out.append(next(results_iter))
            elif isinstance(v, torch.SymInt):
                env = {sym: inputs[where[str(sym)][0]].shape[where[str(sym)][1]] for sym in v.node.expr.free_symbols}
                out.append(int(v.node.expr.xreplace(env)))
            else:
                out.append(v)
        return tuple(out)

    class SizesFromTensors(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph_module = gm

        def forward(self, *xs: Any) -> Any:
            outs = self.graph_module(*[xs[e] if isinstance(e, int) else xs[e[0]].shape[e[1]] for e in layout])
            return tuple(o for o, is_tensor in zip(outs, keep) if is_tensor)

    def arguments(args: tuple) -> list:
        return [args[i] for i in tensors] + [torch.empty(int(args[i]), 0) for i in carried]

    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), tracing(None):  # a fresh export with real example tensors, outside dynamo's tracing
        shapes = [example_inputs[i].shape for i in tensors] + [(example_inputs[i], 0) for i in carried]
        examples = [torch.zeros([int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in shape],
                                dtype=example_inputs[i].dtype if k < len(tensors) else torch.float32)
                    for k, (i, shape) in enumerate(zip(tensors + carried, shapes))]
        dynamic = [{d: torch.export.Dim.AUTO for d, size in enumerate(shape) if isinstance(size, torch.SymInt)} or None for shape in shapes]
        return _export_torch(SizesFromTensors(), tuple(examples), dynamic_shapes=(tuple(dynamic),))[0], arguments, assemble


def _failing_op(error: Exception) -> str:
    """The op an error names: torch-mlir's unconverted `torch.aten.*` operator, or the op our own
    error messages start with."""
    text = str(error)
    found = re.search(r'name = "torch\.(aten\.[\w.]+)"', text) or re.search(r"\b((?:aten|stablehlo|chlo)\.[A-Za-z_][\w.]*)", text)
    return f"'{found.group(1)}'" if found else "an op"


def dynamo_backend(gm: Any, example_inputs: list) -> Any:
    """`torch.compile(model, backend="disc_stablehlo", dynamic=True)`: AOTAutograd lowers each
    captured graph to ATen with torch's core decompositions plus ours (the fused inference paths
    of `nn` modules among them), and each is compiled once for its symbolic sizes (graph breaks
    run in PyTorch, as with every backend). A graph that still holds an op the compiler cannot
    take runs in PyTorch, with one warning naming the op. Registered through the
    `torch_dynamo_backends` entry point."""
    from torch._dynamo.backends.common import aot_autograd

    from .. import worker
    from ..compiler import compile_source
    from ..errors import DiscError

    def forward_compiler(graph: Any, inputs: list) -> Any:
        started = worker.prepare(_IMPORTER_MODULES)
        try:
            source, arguments, assemble = _from_fx_graph(graph, inputs)
            compiled = compile_source(source, Binding(), prepared=started)
        except DiscError as e:
            warnings.warn(f"disc_stablehlo: a captured graph runs in PyTorch: it holds {_failing_op(e)}, which could not be "
                          f"compiled ({type(e).__name__}: {str(e).splitlines()[0][:300]})", stacklevel=2)
            return graph

        def run(*args):
            inputs = arguments(args)
            out = compiled(*inputs)
            return assemble(list(out) if isinstance(out, tuple) else [out], inputs)
        run.disc_compiled = compiled
        return run
    return aot_autograd(fw_compiler=forward_compiler, decompositions=_decompositions())(gm, example_inputs)
