"""Float math in the generated CPU code: f32 `exp` computed inline (passes/math_ops.py) to within
one unit in the last place over its whole range, denormal results, overflow, infinities and NaN
included; multiplications fused with the additions they feed, as XLA does; floats converted to
integers that cannot hold them saturating as XLA's conversions do."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

import disc_stablehlo as disc


def _ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in units of the f32 spacing at the correctly rounded result (finite results)."""
    rounded = exact.astype(np.float32)
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(rounded)).astype(np.float64)


def test_exp_f32_is_within_one_ulp_everywhere():
    (n,) = export.symbolic_shape("n")
    f = disc.compile(jnp.exp, jax.ShapeDtypeStruct((n,), jnp.float32))
    assert "@llvm.exp" not in f.llvm_ir and "expf" not in f.llvm_ir  # arithmetic, no call of libm or libmvec
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-110, 95, 1_000_000), np.linspace(-104, 89, 400_001), rng.standard_normal(100_000) * 3,
                        [0.0, -0.0, 1e-30, -1e-30, 88.72283, -87.33654, -103.97207]]).astype(np.float32)
    with np.errstate(over="ignore"):
        exact = np.exp(x.astype(np.float64))
        finite = np.isfinite(exact.astype(np.float32))
    y = f(x)
    assert _ulps(y[finite], exact[finite]).max() <= 1.01
    np.testing.assert_array_equal(y[~finite], np.inf)
    # denormal results round as IEEE multiplication does; below exp(-103.97) they are 0
    tiny = (x > -104) & (x < -87.4)
    assert tiny.sum() > 10_000 and np.all(y[tiny] > 0) == np.all(exact[tiny].astype(np.float32) > 0)
    specials = np.array([np.nan, np.inf, -np.inf, 89.0, -104.5, -1e9, 1e9, 0.0], np.float32)
    np.testing.assert_array_equal(f(specials), np.array([np.nan, np.inf, 0, np.inf, 0, 0, np.inf, 1], np.float32))


def test_softmax_over_masked_scores_is_exact_at_the_mask():
    """Scores masked at -1e9 (exp far below the denormals) give zeros; a fully masked row gives
    the uniform distribution, as jax.jit does."""
    b, s = export.symbolic_shape("b, s")
    f = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), jax.ShapeDtypeStruct((b, s), jnp.float32))
    x = np.random.default_rng(1).standard_normal((5, 77)).astype(np.float32)
    x[:, 40:] = -1e9
    x[4] = -1e9
    y = f(x)
    assert np.all(y[:4, 40:] == 0)
    np.testing.assert_allclose(y, jax.jit(lambda x: jax.nn.softmax(x, axis=-1))(x), rtol=2e-6, atol=1e-7)


def test_multiplications_fuse_with_the_additions_they_feed_as_xla_does():
    """GELU's erfc is polynomials: with one rounding per multiply-add, as XLA's CPU back end
    computes them, every result is within 1e-5 of jax.jit's relative to itself (rounded twice,
    results near zero were 3e-3 apart)."""
    (n,) = export.symbolic_shape("n")
    gelu = lambda x: jax.nn.gelu(x, approximate=False)  # noqa: E731
    f = disc.compile(gelu, jax.ShapeDtypeStruct((n,), jnp.float32))
    assert "fmul contract" in f.llvm_ir and "fadd contract" in f.llvm_ir
    x = np.random.default_rng(2).uniform(-9, 9, 200_000).astype(np.float32)
    ref = np.asarray(jax.jit(gelu)(x))
    y = f(x)
    big = np.abs(ref) > 1e-30
    assert np.max(np.abs(y[big] - ref[big]) / np.abs(ref[big])) < 1e-5


def test_floats_beyond_an_integer_type_saturate_as_xla_converts_them():
    """Out of range, infinite and NaN values converted to every integer width, signed and
    unsigned, from f16, f32 and f64: the type's extremes, NaN 0 (LLVM's conversion is poison there:
    x86 gave 0x80...0 for all of them), the same as jax.jit; values in range truncate."""
    (n,) = export.symbolic_shape("n")
    values = [0.0, -0.0, 0.9, -0.9, 1.5, -1.5, 127.0, 128.0, -128.0, -129.0, 255.0, 256.0, -1.0, 300.0, 65504.0, -65504.0,
              2.0 ** 31, -(2.0 ** 31), 3e9, -3e9, 2.0 ** 32, 2.0 ** 63, -(2.0 ** 63), 1e19, 2.0 ** 64, 1e30, -1e30, np.inf, -np.inf, np.nan]
    for source in (np.float16, np.float32, np.float64):
        with np.errstate(over="ignore"):
            x = np.array(values, source)
        for target in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64):
            fn = lambda v, target=target: v.astype(target)  # noqa: E731
            with jax.enable_x64(source == np.float64 or target in (np.int64, np.uint64)):
                got, want = disc.compile(fn, jax.ShapeDtypeStruct((n,), source))(x), jax.jit(fn)(x)
            np.testing.assert_array_equal(got, np.asarray(want), err_msg=f"{np.dtype(source).name} -> {np.dtype(target).name}")


def test_sums_of_millions_of_floats_keep_their_digits():
    """Float sums over long runs (a whole array, rows, a mean) in blocks whose partial
    sums are added with Kahan's compensation (passes/loops.py, `blocked_float_sums`): 0.1 summed
    2^24 times was 0.25 % low with one accumulator; now within a few units in the last place of
    the exact sum, as jax.jit and numpy's pairwise sums are."""
    b, s = export.symbolic_shape("b, s")
    cases = [(lambda x: x.sum(), (b,), (1 << 24,)), (lambda x: x.mean(), (b,), (3 << 22,)), (lambda x: x.sum(-1), (b, s), (3, 1 << 22)),
             (lambda x: (x * x).sum(-1), (b, s), (2, 3_000_001))]
    for fn, symbolic, shape in cases:
        f = disc.compile(fn, jax.ShapeDtypeStruct(symbolic, jnp.float32))
        for x in (np.full(shape, 0.1, np.float32), np.random.default_rng(0).standard_normal(shape).astype(np.float32) + 1):
            exact = np.asarray(fn(x.astype(np.float64)))
            np.testing.assert_allclose(f(x), exact, rtol=2e-7)
