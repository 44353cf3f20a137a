"""Quantized programs (`!quant.uniform`): uniform_quantize / uniform_dequantize and ordinary ops on
quantized types, per tensor and per axis, with dynamic dims, lowered to integer and float
arithmetic (upstream's stablehlo-legalize-quant-to-math); quantized arguments and results are
their storage integers. Checked against numpy's rounding of the same scales and zero points."""

from __future__ import annotations

import numpy as np
import pytest

import disc_stablehlo as disc


def _quantize(x, scale, zero_point, lo=-128, hi=127):
    return np.clip(np.round(x / scale) + zero_point, lo, hi)  # numpy rounds halves to even, as the spec


def test_per_tensor_and_per_axis_round_trips():
    f = disc.compile("""func.func @main(%x: tensor<?x3xf32>) -> (tensor<?x3xf32>, tensor<?x3xf32>) {
      %q = stablehlo.uniform_quantize %x : (tensor<?x3xf32>) -> tensor<?x3x!quant.uniform<i8:f32, 0.25:-4>>
      %a = stablehlo.uniform_dequantize %q : (tensor<?x3x!quant.uniform<i8:f32, 0.25:-4>>) -> tensor<?x3xf32>
      %p = stablehlo.uniform_quantize %x : (tensor<?x3xf32>) -> tensor<?x3x!quant.uniform<i8:f32:1, {0.1:1, 0.2:0, 0.5:-3}>>
      %b = stablehlo.uniform_dequantize %p : (tensor<?x3x!quant.uniform<i8:f32:1, {0.1:1, 0.2:0, 0.5:-3}>>) -> tensor<?x3xf32>
      return %a, %b : tensor<?x3xf32>, tensor<?x3xf32>
    }""")
    scales, zeros = np.array([0.1, 0.2, 0.5], np.float32), np.array([1, 0, -3])
    for rows in (1, 7):
        x = np.random.default_rng(rows).standard_normal((rows, 3)).astype(np.float32) * 20
        a, b = f(x)
        np.testing.assert_allclose(a, (_quantize(x, 0.25, -4) + 4) * 0.25, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(b, (_quantize(x, scales, zeros) - zeros) * scales, rtol=1e-6, atol=1e-6)


def test_ops_on_quantized_types_and_storage_integers_at_the_boundary():
    """An add of two quantized tensors requantizes the sum; a dot of int8 tensors accumulates in
    int32 at the product of the scales. Arguments and results of quantized types are int8."""
    f = disc.compile("""func.func @main(%x: tensor<?x4x!quant.uniform<i8:f32, 0.05:-2>>, %w: tensor<4x3xf32>)
        -> (tensor<?x4x!quant.uniform<i8:f32, 0.05:-2>>, tensor<?x3xf32>) {
      %s = stablehlo.add %x, %x : tensor<?x4x!quant.uniform<i8:f32, 0.05:-2>>
      %qw = stablehlo.uniform_quantize %w : (tensor<4x3xf32>) -> tensor<4x3x!quant.uniform<i8:f32, 0.02>>
      %d = stablehlo.dot_general %x, %qw, contracting_dims = [1] x [0]
          : (tensor<?x4x!quant.uniform<i8:f32, 0.05:-2>>, tensor<4x3x!quant.uniform<i8:f32, 0.02>>) -> tensor<?x3x!quant.uniform<i32:f32, 0.001>>
      %r = stablehlo.uniform_dequantize %d : (tensor<?x3x!quant.uniform<i32:f32, 0.001>>) -> tensor<?x3xf32>
      return %s, %r : tensor<?x4x!quant.uniform<i8:f32, 0.05:-2>>, tensor<?x3xf32>
    }""")
    assert [a.dtype for a in f.signature.args] == [np.int8, np.float32] and f.signature.results[0].dtype == np.int8
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    for rows in (1, 5):
        q = rng.integers(-60, 60, (rows, 4)).astype(np.int8)
        s, r = f(q, w)
        real = (q.astype(np.float64) + 2) * 0.05
        np.testing.assert_array_equal(s, _quantize(2 * real, 0.05, -2).astype(np.int8))
        np.testing.assert_allclose(r, real @ (_quantize(w, 0.02, 0) * 0.02), rtol=1e-5, atol=1e-5)


def test_a_quantized_argument_of_the_wrong_storage_type_is_a_shape_error():
    f = disc.compile("""func.func @main(%q: tensor<?x!quant.uniform<i8:f32, 0.5:3>>) -> tensor<?xf32> {
      %r = stablehlo.uniform_dequantize %q : (tensor<?x!quant.uniform<i8:f32, 0.5:3>>) -> tensor<?xf32>
      return %r : tensor<?xf32>
    }""")
    np.testing.assert_array_equal(f(np.array([3, 5, -1], np.int8)), [0, 1, -2])
    with pytest.raises(disc.ShapeError, match="expected dtype int8, got float32"):
        f(np.array([3.0], np.float32))


def test_a_quantized_convolution_with_a_dynamic_batch():
    f = disc.compile("""func.func @main(%x: tensor<?x2x5x5x!quant.uniform<i8:f32, 0.1:2>>, %w: tensor<3x2x3x3x!quant.uniform<i8:f32, 0.05>>)
        -> tensor<?x3x3x3xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {}
          {batch_group_count = 1 : i64, feature_group_count = 1 : i64}
          : (tensor<?x2x5x5x!quant.uniform<i8:f32, 0.1:2>>, tensor<3x2x3x3x!quant.uniform<i8:f32, 0.05>>) -> tensor<?x3x3x3x!quant.uniform<i32:f32, 0.005>>
      %1 = stablehlo.uniform_dequantize %0 : (tensor<?x3x3x3x!quant.uniform<i32:f32, 0.005>>) -> tensor<?x3x3x3xf32>
      return %1 : tensor<?x3x3x3xf32>
    }""")
    rng = np.random.default_rng(0)
    w = rng.integers(-50, 50, (3, 2, 3, 3)).astype(np.int8)
    for batch in (1, 3):
        x = rng.integers(-50, 50, (batch, 2, 5, 5)).astype(np.int8)
        real_x, real_w = (x.astype(np.float64) - 2) * 0.1, w.astype(np.float64) * 0.05
        want = np.stack([np.stack([np.stack([(real_x[:, :, i:i + 3, j:j + 3] * real_w[o]).sum(axis=(1, 2, 3))
                                             for j in range(3)], -1) for i in range(3)], -2) for o in range(3)], 1)
        np.testing.assert_allclose(f(x, w), want, rtol=1e-5, atol=1e-5)


def test_int4_storage():
    """4-bit quantization (weights of low-bit inference): storage i4, a byte per element at the
    boundary (ml_dtypes.int4)."""
    import ml_dtypes

    f = disc.compile("""func.func @main(%x: tensor<?x!quant.uniform<i4:f32, 0.5:1>>, %y: tensor<?xf32>)
        -> (tensor<?xf32>, tensor<?x!quant.uniform<i4:f32, 0.5:1>>) {
      %r = stablehlo.uniform_dequantize %x : (tensor<?x!quant.uniform<i4:f32, 0.5:1>>) -> tensor<?xf32>
      %q = stablehlo.uniform_quantize %y : (tensor<?xf32>) -> tensor<?x!quant.uniform<i4:f32, 0.5:1>>
      return %r, %q : tensor<?xf32>, tensor<?x!quant.uniform<i4:f32, 0.5:1>>
    }""")
    assert f.signature.args[0].dtype == np.dtype(ml_dtypes.int4)
    x = np.arange(-8, 8).astype(ml_dtypes.int4)
    y = np.linspace(-6, 6, 25).astype(np.float32)
    r, q = f(x, y)
    np.testing.assert_allclose(r, (np.arange(-8, 8) - 1) * 0.5)
    np.testing.assert_array_equal(q.astype(np.int64), _quantize(y, 0.5, 1, -8, 7))
