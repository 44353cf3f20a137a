"""JAX's linear algebra on the CPU: the LAPACK custom calls it exports (LU, triangular solves,
Cholesky, QR, symmetric / Hermitian and general eigendecompositions, SVD) run on the LAPACK of
the runtime's BLAS, with a dynamic batch (and dynamic matrix sizes where JAX can export them),
in every LAPACK type, against jax.jit."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc
from disc_stablehlo.runtime import openblas_library

jax.config.update("jax_enable_x64", True)

B, N = export.symbolic_shape("b, n")
F32, F64, C64, C128 = np.float32, np.float64, np.complex64, np.complex128


def _random(shape, dtype, rng):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _hermitian_pd(shape, dtype, rng):
    x = _random(shape, dtype, rng)
    return (x @ np.conj(np.swapaxes(x, -1, -2)) + shape[-1] * np.eye(shape[-1])).astype(dtype)


def _tol(dtype):
    return 2e-4 if np.dtype(dtype) in (np.dtype(F32), np.dtype(C64)) else 1e-10


def _close(got, want, dtype):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=_tol(dtype), atol=_tol(dtype) * max(1.0, float(np.abs(want).max(initial=0))))


def _matrix(shape, dtype, rng):
    return _random(shape, dtype, rng) + 3 * np.eye(shape[-2], shape[-1], dtype=dtype)


# name: (function, argument makers (shape, dtype, rng), argument shapes with b and n, dtypes);
# each is checked against jax.jit at three (batch, n)
SOLVERS = {
    "solve (getrf + trsm)": (jnp.linalg.solve, [_matrix, _random], [(B, N, N), (B, N, 3)], [F32, C128]),
    "inv": (jnp.linalg.inv, [_matrix], [(B, N, N)], [F64, C64]),
    "det": (jnp.linalg.det, [_matrix], [(B, N, N)], [F32, C128]),
    "slogdet": (lambda a: jnp.linalg.slogdet(a)[1], [_matrix], [(B, N, N)], [F64]),
    "lu (factors, pivots, permutation)": (jax.lax.linalg.lu, [_random], [(B, N, N)], [F32, C128]),
    "cholesky (potrf)": (jnp.linalg.cholesky, [_hermitian_pd], [(B, N, N)], [F64, C64]),
    "cho_solve": (lambda a, y: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), y), [_hermitian_pd, _random],
                  [(B, N, N), (B, N, 2)], [F32]),
    "solve_triangular lower": (lambda a, y: jax.scipy.linalg.solve_triangular(a, y, lower=True), [_matrix, _random],
                               [(B, N, N), (B, N, 4)], [F32, C128]),
    "solve_triangular upper, transposed, unit": (
        lambda a, y: jax.scipy.linalg.solve_triangular(a, y, trans=1, unit_diagonal=True), [_matrix, _random],
        [(B, N, N), (B, N, 2)], [F64]),
    "solve_triangular conjugate-transposed, right side": (
        lambda a, y: jax.lax.linalg.triangular_solve(a, y, left_side=False, lower=True, conjugate_a=True,
                                                     transpose_a=True), [_matrix, _random], [(B, N, N), (B, 3, N)], [C64]),
    "eigvalsh (syevd / heevd)": (jnp.linalg.eigvalsh, [_hermitian_pd], [(B, N, N)], [F32, C128]),
    "svdvals (gesdd, no vectors)": (lambda a: jnp.linalg.svd(a, compute_uv=False), [_random], [(B, N, N)], [F64, C64]),
    "qr's |R| (geqrf)": (lambda a: jnp.abs(jnp.linalg.qr(a)[1]), [_random], [(B, N, N)], [F32, C128]),
    "pinv (svd)": (jnp.linalg.pinv, [_random], [(B, 5, 3)], [F64]),
}


def _sizes(shapes):
    return [(1, 3), (4, 5), (2, 1)] if any(N in s for s in shapes) else [(1, 0), (3, 0), (5, 0)]


@pytest.mark.parametrize("name,dtype", [(name, dtype) for name, case in SOLVERS.items() for dtype in case[3]],
                         ids=lambda v: np.dtype(v).name if isinstance(v, type) else v)
def test_linalg_matches_xla(name, dtype):
    fn, makers, shapes, _ = SOLVERS[name]
    f = disc.compile(fn, *[jax.ShapeDtypeStruct(s, dtype) for s in shapes])
    rng = np.random.default_rng(0)
    for batch, n in _sizes(shapes):
        args = [make(tuple(batch if d is B else n if d is N else d for d in s), dtype, rng) for make, s in zip(makers, shapes)]
        got, want = f(*args), jax.jit(fn)(*args)
        for g, w in zip(*(x if isinstance(x, (tuple, list)) else (x,) for x in (got, want))):
            _close(g, w, dtype)


def _unitary(q, dtype):
    eye = np.eye(q.shape[-1])
    np.testing.assert_allclose(np.conj(np.swapaxes(q, -1, -2)) @ q, np.broadcast_to(eye, q.shape[:-2] + eye.shape),
                               atol=_tol(dtype) * 10)


@pytest.mark.parametrize("dtype", [F32, C128], ids=lambda d: np.dtype(d).name)
def test_eigh_vectors_diagonalise(dtype):
    f = disc.compile(jnp.linalg.eigh, jax.ShapeDtypeStruct((B, N, N), dtype))
    rng = np.random.default_rng(1)
    for batch, n in [(1, 4), (3, 6)]:
        a = _hermitian_pd((batch, n, n), dtype, rng)
        w, v = f(a)
        _close(w, jax.jit(jnp.linalg.eigh)(a)[0], dtype)
        _unitary(v, dtype)
        _close(v @ (w[..., None] * np.conj(np.swapaxes(v, -1, -2))), a, dtype)


@pytest.mark.parametrize("full", [True, False], ids=["full", "thin"])
@pytest.mark.parametrize("shape,dtype", [((5, 3), F32), ((3, 5), C128)], ids=["5x3 f32", "3x5 c128"])
def test_svd_reconstructs(shape, dtype, full):
    fn = lambda a: jnp.linalg.svd(a, full_matrices=full)  # noqa: E731
    f = disc.compile(fn, jax.ShapeDtypeStruct((B, *shape), dtype))
    rng = np.random.default_rng(2)
    for batch in (1, 4):
        a = _random((batch, *shape), dtype, rng)
        u, s, vt = f(a)
        wu, ws, wvt = jax.jit(fn)(a)
        assert u.shape == wu.shape and vt.shape == wvt.shape
        _close(s, ws, dtype)
        _unitary(u, dtype)
        _unitary(np.conj(np.swapaxes(vt, -1, -2)), dtype)
        k = min(shape)
        _close(u[..., :k] * s[..., None, :].astype(dtype) @ vt[..., :k, :], a, dtype)


@pytest.mark.parametrize("mode,shape", [("reduced", (6, 4)), ("complete", (4, 6)), ("complete", (6, 4))])
@pytest.mark.parametrize("dtype", [F64, C64], ids=lambda d: np.dtype(d).name)
def test_qr_reconstructs(mode, shape, dtype):
    """geqrf then orgqr / ungqr: Q unitary, R upper triangular, Q R the matrix, R as XLA's (up to
    signs, which LAPACK fixes the same way)."""
    fn = lambda a: jnp.linalg.qr(a, mode=mode)  # noqa: E731
    f = disc.compile(fn, jax.ShapeDtypeStruct((B, *shape), dtype))
    rng = np.random.default_rng(3)
    for batch in (1, 3):
        a = _random((batch, *shape), dtype, rng)
        q, r = f(a)
        wq, wr = jax.jit(fn)(a)
        assert q.shape == wq.shape and r.shape == wr.shape
        _unitary(q, dtype)
        assert np.all(np.tril(r, -1) == 0)
        _close(q @ r, a, dtype)
        _close(np.abs(r), np.abs(np.asarray(wr)), dtype)


@pytest.mark.parametrize("dtype", [F32, C128], ids=lambda d: np.dtype(d).name)
def test_eig_general_matrices(dtype):
    """geev: eigenvalues as XLA's (complex pairs of real matrices included) and A V = V diag(w)."""
    f = disc.compile(jnp.linalg.eig, jax.ShapeDtypeStruct((B, N, N), dtype))
    rng = np.random.default_rng(4)
    for batch, n in [(1, 3), (3, 6)]:
        a = _random((batch, n, n), dtype, rng)
        w, v = f(a)
        ww, _ = jax.jit(jnp.linalg.eig)(a)
        _close(np.sort_complex(w), np.sort_complex(np.asarray(ww)), dtype)
        _close(a.astype(v.dtype) @ v, v * w[..., None, :], dtype)
    rotation = np.array([[[0.0, -1.0], [1.0, 0.0]]], dtype)  # eigenvalues +-i: a conjugate pair in real LAPACK
    w, v = f(rotation)
    np.testing.assert_allclose(np.sort(w.imag), [[-1, 1]], atol=1e-12)
    np.testing.assert_allclose(w.real, 0, atol=1e-12)
    _close(rotation.astype(v.dtype) @ v, v * w[..., None, :], dtype)


@pytest.mark.parametrize("dtype", [F32, C128], ids=lambda d: np.dtype(d).name)
def test_large_lu_on_every_thread(dtype):
    """One matrix of order >= 256 (fewer matrices than threads) is factored by the blocked
    algorithm with its trailing updates split over the pool: the same pivots as XLA's LAPACK, the
    factors equal up to rounding, solves with residuals at rounding level; a batch of such
    matrices (one per thread) is the plain call per matrix."""
    lu = disc.compile(jax.lax.linalg.lu, jax.ShapeDtypeStruct((B, N, N), dtype))
    solve = disc.compile(jnp.linalg.solve, jax.ShapeDtypeStruct((B, N, N), dtype), jax.ShapeDtypeStruct((B, N, 2), dtype))
    rng = np.random.default_rng(6)
    for batch, n in [(1, 300), (1, 257), (3, 260)]:
        a, y = _random((batch, n, n), dtype, rng), _random((batch, n, 2), dtype, rng)
        factors, pivots, perm = lu(a)
        want = jax.jit(jax.lax.linalg.lu)(a)
        np.testing.assert_array_equal(pivots, np.asarray(want[1]))
        np.testing.assert_array_equal(perm, np.asarray(want[2]))
        scale = float(np.abs(np.asarray(want[0])).max())
        np.testing.assert_allclose(factors, np.asarray(want[0]), rtol=0, atol=_tol(dtype) * 20 * scale)
        x = solve(a, y)
        residual = np.abs(a @ x - y).max() / (np.abs(a).max() * np.abs(x).max() * n)
        assert residual < (1e-6 if dtype == F32 else 1e-14), residual


def test_numerical_failures_are_nans_as_in_jax():
    """A matrix that is not positive definite: potrf's info > 0 is a result, which JAX's program
    turns into NaNs (the call does not fail)."""
    f = disc.compile(jnp.linalg.cholesky, jax.ShapeDtypeStruct((B, 3, 3), F64))
    a = np.stack([np.eye(3), -np.eye(3)])
    got, want = f(a), np.asarray(jax.jit(jnp.linalg.cholesky)(a))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1][np.tril_indices(3)]).all() and not np.isnan(got[0]).any()


TRSM = """func.func @main(%a: tensor<?x?x?xf32>, %b: tensor<?x?x2xf32>) -> tensor<?x?x2xf32> {
  %0 = stablehlo.custom_call @lapack_strsm_ffi(%a, %b) {api_version = 4 : i32,
      backend_config = {diag = 78 : ui8, side = 76 : ui8, trans_x = 78 : ui8, uplo = 76 : ui8},
      operand_layouts = [dense<[1, 2, 0]> : tensor<3xindex>, dense<[1, 2, 0]> : tensor<3xindex>],
      result_layouts = [dense<LAYOUT> : tensor<3xindex>]} : (tensor<?x?x?xf32>, tensor<?x?x2xf32>) -> tensor<?x?x2xf32>
  return %0 : tensor<?x?x2xf32>
}"""


def test_operands_the_routine_cannot_take_are_shape_errors():
    """What LAPACK assumes of its operands is checked before it runs: a square triangular matrix
    of the right-hand sides' order, and equal batch dims."""
    f = disc.compile(TRSM.replace("LAYOUT", "[1, 2, 0]"))
    rng = np.random.default_rng(5)
    a, y = np.tril(_matrix((2, 3, 3), F32, rng)), _random((2, 3, 2), F32, rng)
    np.testing.assert_allclose(f(a, y), np.linalg.solve(a, y), rtol=1e-4, atol=1e-5)
    with pytest.raises(disc.ShapeError, match=r"custom_call at .*: lapack_strsm_ffi: the triangular matrix is 3 x 4"):
        f(_random((2, 3, 4), F32, rng), y)
    with pytest.raises(disc.ShapeError, match=r"lapack_strsm_ffi: batch dim 0 of the operands: 2 and 3"):
        f(a, _random((3, 3, 2), F32, rng))
    with pytest.raises(disc.ShapeError, match=r"order is 3, the right-hand sides' matching dim 4"):
        f(a, _random((2, 4, 2), F32, rng))


def test_other_layouts_and_characters_are_rejected():
    """A row-major result would be another computation, and LAPACK takes upper-case characters of
    its own sets only: refused at compile time, naming the layout or the attribute."""
    with pytest.raises(disc.UnsupportedOpError, match=r"lapack_strsm_ffi: result_layouts\[0\] is \[2, 1, 0\]"):
        disc.compile(TRSM.replace("LAYOUT", "[2, 1, 0]"))
    with pytest.raises(disc.UnsupportedOpError, match=r"lapack_strsm_ffi: `side` is 'l', expected one of L, R"):
        disc.compile(TRSM.replace("LAYOUT", "[1, 2, 0]").replace("side = 76", "side = 108"))


def test_openblas_lapack(tmp_path):
    """The same calls on scipy-openblas32's LAPACK (its entries carry a prefix), in a fresh
    process (the runtime, and so the BLAS, is per process)."""
    script = tmp_path / "lapack.py"
    script.write_text("""
import jax, jax.numpy as jnp, numpy as np
from jax import export
import disc_stablehlo as disc
from disc_stablehlo.runtime import default_runtime
jax.config.update("jax_enable_x64", True)
b, n = export.symbolic_shape("b, n")
fn = lambda a, y: (jnp.linalg.solve(a, y), jnp.linalg.eigvalsh(a @ a.mT), jnp.linalg.svd(a, compute_uv=False),
                   jnp.abs(jnp.linalg.qr(a)[1]), jnp.linalg.cholesky(a @ a.mT + jnp.eye(a.shape[-1])))
f = disc.compile(fn, jax.ShapeDtypeStruct((b, n, n), np.float64), jax.ShapeDtypeStruct((b, n, 2), np.float64))
rng = np.random.default_rng(0)
for shape in [(1, 3), (3, 7)]:
    a, y = rng.standard_normal((*shape, shape[1])), rng.standard_normal((*shape, 2))
    for got, want in zip(f(a, y), jax.jit(fn)(a, y)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
print(default_runtime().blas)
""")
    env = dict(os.environ, DISC_BLAS=openblas_library())
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == env["DISC_BLAS"]


def test_concurrent_calls_and_no_growth():
    """Calls from 4 threads at once (each a batch split over the pool, and one large LU on every
    thread) give the serial results, and the runtime holds no more memory after 100 more calls
    than before them."""
    import threading

    from disc_stablehlo.runtime import default_runtime

    f = disc.compile(lambda a, y: (jnp.linalg.solve(a, y), jnp.linalg.eigvalsh(a + jnp.swapaxes(a, -1, -2))),
                     jax.ShapeDtypeStruct((B, N, N), F64), jax.ShapeDtypeStruct((B, N, 1), F64))
    rng = np.random.default_rng(7)
    cases = [(_matrix((8, 40, 40), F64, rng), _random((8, 40, 1), F64, rng)),
             (_matrix((1, 300, 300), F64, rng), _random((1, 300, 1), F64, rng))]
    serial = [f(*c) for c in cases]
    for c in cases * 3:
        f(*c)
    base = default_runtime().memory_stats()["bytes_in_use"]
    errors = []

    def work(k: int) -> None:
        for i in range(25):
            c = (k + i) % 2
            for got, want in zip(f(*cases[c]), serial[c]):
                if not np.allclose(got, want, rtol=1e-12, atol=1e-12):  # the pool's split may differ
                    errors.append((k, i))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert default_runtime().memory_stats()["bytes_in_use"] == base
