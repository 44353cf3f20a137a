"""`stablehlo.fft` through the RAL's FFT: every kind over 1-3 dims, f32 and f64, lengths with
small and large prime factors, a dynamic batch, against jax.jit (XLA's FFT)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc

jax.config.update("jax_enable_x64", True)

CASES = {
    "fft c64, 12": (jnp.fft.fft, (12,), np.complex64),
    "ifft c128, 10": (jnp.fft.ifft, (10,), np.complex128),
    "rfft f32, 37 (a prime past the direct limit)": (jnp.fft.rfft, (37,), np.float32),
    "irfft c64, 9 -> 16": (lambda x: jnp.fft.irfft(x, n=16), (9,), np.complex64),
    "irfft c128, 8 -> 15 (odd)": (lambda x: jnp.fft.irfft(x, n=15), (8,), np.complex128),
    "fft2 c128, 6 x 5": (jnp.fft.fft2, (6, 5), np.complex128),
    "rfftn f64, 4 x 3 x 8": (lambda x: jnp.fft.rfftn(x, axes=(-3, -2, -1)), (4, 3, 8), np.float64),
    "irfft2 c128, 4 x 4 -> 4 x 6": (lambda x: jnp.fft.irfft2(x, s=(4, 6)), (4, 4), np.complex128),
    "ifftn c64, 7 x 11 x 2": (lambda x: jnp.fft.ifftn(x, axes=(-3, -2, -1)), (7, 11, 2), np.complex64),
}


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


@pytest.mark.parametrize("name", CASES)
def test_fft_matches_xla_at_every_batch(name):
    fn, dims, dtype = CASES[name]
    b = export.symbolic_shape("b")[0]
    f = disc.compile(fn, jax.ShapeDtypeStruct((b, *dims), dtype))
    tol = 1e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12
    for batch in (1, 3, 5):  # JAX's dimension variables are at least 1
        x = _random((batch, *dims), dtype, batch)
        got, want = f(x), np.asarray(jax.jit(fn)(x))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))))


def test_a_transformed_dim_of_the_wrong_length_is_a_shape_error():
    """The transform's lengths are the op's; an operand whose transformed dim is dynamic is checked
    at run time (an IRFFT of length 16 reads 9 points of the last dim)."""
    f = disc.compile("""func.func @main(%x: tensor<?x?xcomplex<f32>>) -> tensor<?x16xf32> {
      %0 = stablehlo.fft %x, type = IRFFT, length = [16] : (tensor<?x?xcomplex<f32>>) -> tensor<?x16xf32>
      return %0 : tensor<?x16xf32>
    }""")
    x = _random((2, 9), np.complex64, 0)
    np.testing.assert_allclose(f(x), np.fft.irfft(x, n=16), rtol=1e-5, atol=1e-5)
    with pytest.raises(disc.ShapeError, match=r"stablehlo.fft at .*: operand dim 1 is 5, the transform of fft_length \[16\] reads 9"):
        f(_random((2, 5), np.complex64, 0))


def test_gpu_targets_name_the_fft_as_unsupported():
    with pytest.raises(disc.UnsupportedOpError, match="Fourier transforms have no GPU lowering.*stablehlo.fft"):
        disc.compile(jnp.fft.fft, jax.ShapeDtypeStruct((4, 8), np.complex64), target="cuda:sm_90")
