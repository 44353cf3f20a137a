"""Sub-byte integers (i2, i4, ui2, ui4) and 8-, 6- and 4-bit floats: in storage a byte per
element with the value's bits in its low bits (ml_dtypes' layout, which numpy and JAX use);
integers wrap at their width, floats are computed in f32 and converted by each format's rules.
Checked with a dynamic batch against jax.jit and ml_dtypes."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc

TYPES = [ml_dtypes.int2, ml_dtypes.int4, ml_dtypes.uint2, ml_dtypes.uint4]


def _program(dt):
    def fn(x, y):
        as_float = x.astype(np.float32)
        return (x + y, x - y, x * y, x >> 1, x << 1, jax.lax.max(x, y), jax.lax.min(x, y), x < y, as_float,
                (as_float * 0.5).astype(dt), jax.lax.reduce(x, np.zeros((), dt), jax.lax.add, (1,)),
                jax.lax.clz(x), x.astype(np.int32), (x.astype(np.int32) * 3).astype(dt), jax.numpy.where(x < y, x, y))
    return fn


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: np.dtype(d).name)
def test_sub_byte_integers_match_xla(dt):
    fn = _program(dt)
    b = export.symbolic_shape("b")[0]
    f = disc.compile(fn, jax.ShapeDtypeStruct((b, 9), dt), jax.ShapeDtypeStruct((b, 9), dt))
    info = ml_dtypes.iinfo(dt)
    rng = np.random.default_rng(0)
    for batch in (1, 4, 7):
        x, y = (rng.integers(int(info.min), int(info.max) + 1, (batch, 9)).astype(dt) for _ in range(2))
        got, want = f(x, y), jax.jit(fn)(x, y)
        for i, (g, w) in enumerate(zip(got, want)):
            w = np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype)
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64), err_msg=f"result {i}")
            if g.dtype == np.dtype(dt):
                assert not np.any(g.view(np.uint8) >> info.bits), "bits past the type's width are zero in storage"


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: np.dtype(d).name)
def test_popcnt_counts_the_types_bits(dt):
    """popcnt counts the bits of the value in its type, as a value of the type (StableHLO's
    definition: int4 -1 has 4; XLA on the CPU counts those of the value widened to a byte)."""
    f = disc.compile(jax.lax.population_count, jax.ShapeDtypeStruct((export.symbolic_shape("b")[0],), dt))
    info = ml_dtypes.iinfo(dt)
    x = np.arange(int(info.min), int(info.max) + 1).astype(dt)
    count = np.array([bin(int(v) & ((1 << info.bits) - 1)).count("1") for v in x.astype(np.int64)])
    want = (count - int(info.min)) % (1 << info.bits) + int(info.min)  # the count in the type (int2: 2 is -2)
    np.testing.assert_array_equal(f(x).astype(np.int64), want)


def test_sub_byte_integers_in_stablehlo_text():
    """A module taking and returning i4 / ui2 directly: bitcasts between the signed and unsigned
    forms, and a conversion that wraps."""
    f = disc.compile("""func.func @main(%x: tensor<?xi4>, %y: tensor<?xui2>) -> (tensor<?xui4>, tensor<?xi2>, tensor<?xi4>) {
      %0 = stablehlo.bitcast_convert %x : (tensor<?xi4>) -> tensor<?xui4>
      %1 = stablehlo.bitcast_convert %y : (tensor<?xui2>) -> tensor<?xi2>
      %2 = stablehlo.convert %y : (tensor<?xui2>) -> tensor<?xi4>
      %3 = stablehlo.add %2, %2 : tensor<?xi4>
      %4 = stablehlo.multiply %3, %3 : tensor<?xi4>
      return %0, %1, %4 : tensor<?xui4>, tensor<?xi2>, tensor<?xi4>
    }""")
    x = np.arange(-8, 8).astype(ml_dtypes.int4)
    y = np.array([0, 1, 2, 3] * 4).astype(ml_dtypes.uint2)
    u4, i2, sq = f(x, y)
    np.testing.assert_array_equal(u4.astype(np.int64), np.arange(-8, 8) % 16)
    np.testing.assert_array_equal(i2.astype(np.int64), (np.array([0, 1, 2, 3] * 4) + 2) % 4 - 2)
    wrapped = (4 * np.array([0, 1, 2, 3] * 4) ** 2 + 8) % 16 - 8
    np.testing.assert_array_equal(sq.astype(np.int64), wrapped)


FLOATS = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz,
          ml_dtypes.float8_e4m3b11fnuz, ml_dtypes.float8_e3m4, ml_dtypes.float8_e4m3, ml_dtypes.float8_e8m0fnu,
          ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn, ml_dtypes.float4_e2m1fn]


def _mlir_name(dt) -> str:
    from disc_stablehlo.bounded_dynamism.signature import dtype_name

    return dtype_name(np.dtype(dt))


def _same(got, want):
    """Equal bits, or both NaN."""
    g, w = np.asarray(got), np.asarray(want)
    assert g.dtype == w.dtype and g.shape == w.shape
    gf, wf = g.astype(np.float64), w.astype(np.float64)
    bits = g.view(np.uint8) == w.view(np.uint8) if g.itemsize == 1 else g.view(f"u{g.itemsize}") == w.view(f"u{w.itemsize}")
    ok = bits | (np.isnan(gf) & np.isnan(wf))
    assert ok.all(), (np.flatnonzero(~ok)[:5], g.reshape(-1)[~ok.reshape(-1)][:5], w.reshape(-1)[~ok.reshape(-1)][:5])


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: np.dtype(d).name)
def test_float_conversions_match_ml_dtypes(dt):
    """f32 and f64 to the format and back, bit for bit as ml_dtypes converts: every code; every
    tie between neighbouring values and the f32 values next to it; overflow, underflow, infinities,
    NaNs and signed zeros; values spread over the whole f32 range."""
    name = _mlir_name(dt)
    f = disc.compile(f"""func.func @main(%x: tensor<?xf32>, %y: tensor<?xf64>, %c: tensor<?x{name}>)
        -> (tensor<?x{name}>, tensor<?x{name}>, tensor<?xf32>, tensor<?xf64>) {{
      %0 = stablehlo.convert %x : (tensor<?xf32>) -> tensor<?x{name}>
      %1 = stablehlo.convert %y : (tensor<?xf64>) -> tensor<?x{name}>
      %2 = stablehlo.convert %c : (tensor<?x{name}>) -> tensor<?xf32>
      %3 = stablehlo.convert %c : (tensor<?x{name}>) -> tensor<?xf64>
      return %0, %1, %2, %3 : tensor<?x{name}>, tensor<?x{name}>, tensor<?xf32>, tensor<?xf64>
    }}""")
    bits = ml_dtypes.finfo(dt).bits
    codes = np.arange(2 ** bits, dtype=np.uint8).view(dt)
    values = codes.astype(np.float32)
    finite = np.unique(np.abs(values[np.isfinite(values)]))
    ties = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf))])
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 2.0 ** -127, 3e-39, 1e30, 3.4e38], np.float32)
    rng = np.random.default_rng(1)
    spread = (rng.standard_normal(4000) * 10.0 ** rng.integers(-44, 38, 4000)).astype(np.float32)
    x = np.concatenate([values, near, -near, special, -special, spread])
    with np.errstate(over="ignore"):
        a, b, back32, back64 = f(x, x.astype(np.float64), codes)
        _same(a, x.astype(dt))
        _same(b, x.astype(np.float64).astype(dt))
    _same(back32, codes.astype(np.float32))
    _same(back64, codes.astype(np.float64))


def _arithmetic(x, y):
    import jax.numpy as jnp

    return (x + y, x - y, x * y, x / y, jnp.maximum(x, y), jnp.minimum(x, y), x < y, x == y, -x, jnp.abs(x),
            jnp.exp(x), jnp.tanh(x), jnp.sqrt(jnp.abs(x)), jnp.floor(x), jnp.where(x < y, x, y),
            x.astype(np.float16), x.astype(ml_dtypes.bfloat16), x.astype(ml_dtypes.float8_e5m2))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: np.dtype(d).name)
def test_float_arithmetic_rounds_once_from_f32(dt):
    """Each op computed in f32 and rounded to the format: the same as numpy in f32 (f64 for the
    transcendentals) on the values, converted by ml_dtypes. (XLA computes some of these in f16, a
    second rounding: sqrt of f8E3M4's 0.96875 is 0.984252..., below the tie 0.984375 that f16
    rounds it to, so XLA gets 1; it cannot compile exp on the 6-bit formats at all.)"""
    b = export.symbolic_shape("b")[0]
    f = disc.compile(_arithmetic, jax.ShapeDtypeStruct((b, 16), dt), jax.ShapeDtypeStruct((b, 16), dt))
    rng = np.random.default_rng(2)
    for batch in (1, 5):
        x = (rng.standard_normal((batch, 16)) * 2).astype(np.float32).astype(dt)
        y = (rng.standard_normal((batch, 16)) * 2 + 0.25).astype(np.float32).astype(dt)
        xf, yf = x.astype(np.float32), y.astype(np.float32)
        with np.errstate(all="ignore"):
            want = (xf + yf, xf - yf, xf * yf, xf / yf, np.maximum(xf, yf), np.minimum(xf, yf), xf < yf, xf == yf, -xf,
                    np.abs(xf), np.exp(xf.astype(np.float64)), np.tanh(xf.astype(np.float64)),
                    np.sqrt(np.abs(xf.astype(np.float64))), np.floor(xf), np.where(xf < yf, xf, yf), xf, xf, xf)
            for g, w in zip(f(x, y), want):
                _same(g, w if w.dtype == np.bool_ else w.astype(np.float32).astype(g.dtype))


@pytest.mark.parametrize("dt", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=lambda d: np.dtype(d).name)
def test_fp8_matmul_with_f32_accumulation_matches_xla(dt):
    """An FP8 inference layer: scaled FP8 operands, a product accumulated in f32, a bias, back to FP8."""
    import jax.numpy as jnp

    def layer(x, w, scale):
        acc = jnp.dot(x, w, preferred_element_type=jnp.float32) * scale
        return jax.nn.relu(acc + 1.0).astype(dt), acc

    b = export.symbolic_shape("b")[0]
    f = disc.compile(layer, jax.ShapeDtypeStruct((b, 32), dt), jax.ShapeDtypeStruct((32, 8), dt),
                     jax.ShapeDtypeStruct((), np.float32))
    rng = np.random.default_rng(3)
    for batch in (1, 6):
        x, w = rng.standard_normal((batch, 32)).astype(dt), rng.standard_normal((32, 8)).astype(dt)
        got, want = f(x, w, np.float32(0.5)), jax.jit(layer)(x, w, np.float32(0.5))
        np.testing.assert_allclose(got[1], np.asarray(want[1]), rtol=1e-6, atol=1e-6)
        _same(got[0], np.asarray(want[0]))


def test_bitcasts():
    """bitcast_convert between the formats and integers of their width, and across widths (an f32
    is four f8E4M3FN, two f8E5M2 an i16): the bits as they are."""
    f = disc.compile("""func.func @main(%a: tensor<?xf8E4M3FN>, %b: tensor<?xui4>, %c: tensor<?xf32>, %d: tensor<?x2xf8E5M2>)
        -> (tensor<?xui8>, tensor<?xf4E2M1FN>, tensor<?x4xf8E4M3FN>, tensor<?xi16>, tensor<?xf8E5M2>) {
      %0 = stablehlo.bitcast_convert %a : (tensor<?xf8E4M3FN>) -> tensor<?xui8>
      %1 = stablehlo.bitcast_convert %b : (tensor<?xui4>) -> tensor<?xf4E2M1FN>
      %2 = stablehlo.bitcast_convert %c : (tensor<?xf32>) -> tensor<?x4xf8E4M3FN>
      %3 = stablehlo.bitcast_convert %d : (tensor<?x2xf8E5M2>) -> tensor<?xi16>
      %4 = stablehlo.bitcast_convert %0 : (tensor<?xui8>) -> tensor<?xf8E5M2>
      return %0, %1, %2, %3, %4 : tensor<?xui8>, tensor<?xf4E2M1FN>, tensor<?x4xf8E4M3FN>, tensor<?xi16>, tensor<?xf8E5M2>
    }""")
    codes = np.arange(256, dtype=np.uint8)
    c = np.array([1.5, -2.0, 3e-3], np.float32)
    d = codes[:12].reshape(6, 2).view(ml_dtypes.float8_e5m2)
    as_u8, f4, f8s, i16, e5m2 = f(codes.view(ml_dtypes.float8_e4m3fn), np.arange(16).astype(ml_dtypes.uint4), c, d)
    np.testing.assert_array_equal(as_u8, codes)
    np.testing.assert_array_equal(f4.view(np.uint8), codes[:16])
    np.testing.assert_array_equal(f8s.view(np.uint8).reshape(-1), c.view(np.uint8))
    np.testing.assert_array_equal(i16, codes[:12].view(np.int16))
    np.testing.assert_array_equal(e5m2.view(np.uint8), codes)
