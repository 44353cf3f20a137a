"""Sub-byte integers (i2, i4, ui2, ui4): in storage a byte per element with the value's bits in
its low bits (ml_dtypes' layout, which numpy and JAX use), in arithmetic wrapping at their
width, with a dynamic batch, against jax.jit."""

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
