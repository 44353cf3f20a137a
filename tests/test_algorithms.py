"""Ops with a computation region run as real algorithms: the region's scalar code is inlined
into the loops that walk the elements (no allocation per element), cumulative ops are one-pass
scans, sorts merge runs in O(n log n) comparisons, top-k is a heap selection, and the results
match numpy / JAX / PyTorch at sizes where per-element costs would show. The same for PyTorch's
cumsum, sort and topk, which torch-mlir cannot lower with dynamic sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc
from disc_stablehlo.runtime import default_runtime


def _allocations() -> int:
    return default_runtime().memory_stats()["allocations"]


def _run_counting(f, *args):
    f(*args)  # the first call may size the RAL's caches
    before = _allocations()
    out = f(*args)
    return out, _allocations() - before


b, n = export.symbolic_shape("b, n", constraints=["n >= 8"])
SPEC = jax.ShapeDtypeStruct((b, n), jnp.float32)
X = np.random.default_rng(0).standard_normal((3, 2048)).astype(np.float32)


@pytest.mark.parametrize("name, fn, ref", [
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), lambda x: np.cumsum(x, axis=1)),
    ("cumprod", lambda x: jnp.cumprod(1 + x / 1000, axis=1), lambda x: np.cumprod(1 + x / 1000, axis=1)),
    ("cummax", lambda x: jax.lax.cummax(x, axis=1), lambda x: np.maximum.accumulate(x, axis=1)),
    ("reverse cumsum", lambda x: jax.lax.cumsum(x, axis=1, reverse=True), lambda x: np.cumsum(x[:, ::-1], axis=1)[:, ::-1]),
    ("cumsum along dim 0", lambda x: jnp.cumsum(x, axis=0), lambda x: np.cumsum(x, axis=0)),
    ("cumlogsumexp (a general body)", lambda x: jax.lax.cumlogsumexp(x, axis=1), lambda x: np.logaddexp.accumulate(x, axis=1)),
])
def test_cumulative_ops_allocate_nothing_per_element(name, fn, ref):
    f = disc.compile(fn, SPEC)
    out, allocations = _run_counting(f, X)
    np.testing.assert_allclose(out, ref(X.astype(np.float64)), rtol=1e-4, atol=2e-3)
    assert allocations < 16, f"{name}: {allocations} allocations in one call"


def test_sort_is_stable_and_allocates_nothing_per_element():
    keys = np.random.default_rng(1).integers(0, 50, (3, 2048)).astype(np.float32)  # many ties
    keys[0, :7] = [np.nan, -0.0, 0.0, np.inf, -np.inf, np.nan, 3.0]
    f = disc.compile(lambda x: (jnp.sort(x, axis=1), jnp.argsort(x, axis=1, stable=True)), SPEC)
    (values, order), allocations = _run_counting(f, keys)
    np.testing.assert_array_equal(values, np.sort(keys, axis=1))
    np.testing.assert_array_equal(order, np.argsort(keys, axis=1, kind="stable"))
    assert allocations < 16, allocations


@pytest.mark.parametrize("length", [1, 2, 3, 5, 8, 63, 64, 65, 1000])
def test_sort_any_length_descending_and_several_operands(length):
    k, = export.symbolic_shape("k")
    rng = np.random.default_rng(length)
    keys = rng.integers(-5, 5, (2, length)).astype(np.int32)
    vals = rng.standard_normal((2, length)).astype(np.float32)

    def fn(a, v):
        return jax.lax.sort((-a, v), dimension=1, num_keys=1, is_stable=True)
    f = disc.compile(fn, jax.ShapeDtypeStruct((2, k), jnp.int32), jax.ShapeDtypeStruct((2, k), jnp.float32))
    got = f(keys, vals)
    want = jax.jit(fn)(keys, vals)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_sort_along_a_leading_axis():
    x = np.random.default_rng(3).standard_normal((257, 3)).astype(np.float32)
    f = disc.compile(lambda x: jnp.sort(x, axis=0), jax.ShapeDtypeStruct((n, 3), jnp.float32))
    np.testing.assert_array_equal(f(x), np.sort(x, axis=0))


@pytest.mark.parametrize("num_keys", [1, 2, 3])
def test_sort_of_three_vectors(num_keys):
    """A rank-1 sort of several operands: each operand's scratch buffer is its own."""
    k, = export.symbolic_shape("k")
    rng = np.random.default_rng(num_keys)
    args = (rng.integers(-3, 3, 100).astype(np.int32), rng.integers(-3, 3, 100).astype(np.int32),
            rng.standard_normal(100).astype(np.float32))

    def fn(a, b, c):
        return jax.lax.sort((a, b, c), dimension=0, num_keys=num_keys, is_stable=True)
    f = disc.compile(fn, *(jax.ShapeDtypeStruct((k,), a.dtype) for a in args))
    for g, w in zip(f(*args), jax.jit(fn)(*args)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_cumulative_ops_with_static_sizes_and_other_windows():
    """A static cumsum (one reduce_window with constant window and padding) is a scan too; a
    sliding window sum with the same padding form but a window shorter than the dim is not."""
    x = np.random.default_rng(4).standard_normal((3, 300)).astype(np.float32)
    f = disc.compile(lambda x: jnp.cumsum(x, axis=1), jax.ShapeDtypeStruct(x.shape, jnp.float32))
    np.testing.assert_allclose(f(x), np.cumsum(x, axis=1), rtol=1e-4, atol=1e-4)

    def moving_sum(x):
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 4), (1, 1), ((0, 0), (3, 0)))
    g = disc.compile(moving_sum, SPEC)
    np.testing.assert_allclose(g(x), jax.jit(moving_sum)(x), rtol=1e-5, atol=1e-5)


def test_cumulative_sums_of_16_bit_floats_run_in_f32():
    """bf16 and f16 cumulative sums and products keep their running values in f32, each result
    rounded once, as XLA computes 16-bit floats (rounded at every step, bf16's sum of 1e5 normal
    values drifted 64 from the exact one; now within a rounding of it), along either dim, both
    directions, JAX's static and dynamic forms and PyTorch's."""
    import ml_dtypes

    n, = export.symbolic_shape("n")
    rng = np.random.default_rng(6)
    for dtype, tol in ((ml_dtypes.bfloat16, 2 ** -8), (np.float16, 2 ** -11)):
        x = rng.standard_normal((3, 20000)).astype(dtype)
        exact = np.cumsum(x.astype(np.float64), axis=1)
        for spec in (jax.ShapeDtypeStruct((3, n), dtype), jax.ShapeDtypeStruct(x.shape, dtype)):
            got = disc.compile(lambda v: jnp.cumsum(v, axis=1), spec)(x).astype(np.float64)
            assert np.all(np.abs(got - exact) <= tol * np.abs(exact) + 1e-3), np.abs(got - exact).max()
        got = disc.compile(lambda v: jax.lax.cumsum(v, axis=0, reverse=True), jax.ShapeDtypeStruct((n, 3), dtype))(x.T).astype(np.float64)
        np.testing.assert_allclose(got, np.cumsum(x.T[::-1].astype(np.float64), axis=0)[::-1], rtol=tol, atol=1e-3)
        small = (1 + rng.standard_normal((2, 50)) * 0.01).astype(dtype)
        got = disc.compile(lambda v: jnp.cumprod(v, axis=1), jax.ShapeDtypeStruct((2, n), dtype))(small).astype(np.float64)
        np.testing.assert_allclose(got, np.cumprod(small.astype(np.float64), axis=1), rtol=2 * tol)


def test_cumulative_op_with_an_init_that_is_no_identity_is_not_a_scan():
    """The StableHLO spec pads with the init value and starts each window from it: with init 1
    a "cumsum" adds 1 per padded position plus 1, which a prefix sum would not (XLA's CPU
    backend skips the padding instead), so the scan must not be taken."""
    def fn(x):
        n = x.shape[1]
        return jax.lax.reduce_window(x, np.float32(1), jax.lax.add, (1, n), (1, 1), ((0, 0), (n - 1, 0)))
    x = np.random.default_rng(5).standard_normal((2, 50)).astype(np.float32)
    padded = np.arange(50)[::-1]  # padding positions in element j's window: n - 1 - j
    for spec in (SPEC, jax.ShapeDtypeStruct(x.shape, jnp.float32)):
        np.testing.assert_allclose(disc.compile(fn, spec)(x), np.cumsum(x, axis=1) + padded + 1, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype, k", [(np.float32, 1), (np.float32, 8), (np.float32, 64), (np.int32, 5)])
def test_top_k_is_a_selection_in_jax_order(dtype, k):
    """Values descending in total order (NaN first, +0 before -0), ties by lower index; the
    same as jax.lax.top_k, with no allocation per element."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((3, 3000)) * 3).round().astype(dtype)  # many ties
    if dtype == np.float32:
        x[0, :6] = [np.nan, 0.0, -0.0, np.inf, -np.inf, np.nan]
    lo, = export.symbolic_shape("n", constraints=[f"n >= {k}"])
    f = disc.compile(lambda x: jax.lax.top_k(x, k), jax.ShapeDtypeStruct((3, lo), x.dtype))
    (values, indices), allocations = _run_counting(f, x)
    want = jax.jit(lambda x: jax.lax.top_k(x, k))(x)
    np.testing.assert_array_equal(values, np.asarray(want[0]))
    np.testing.assert_array_equal(indices, np.asarray(want[1]))
    assert allocations < 16, allocations
    short = x[:, :k]  # k == n: everything, sorted
    np.testing.assert_array_equal(f(short)[1], np.asarray(jax.jit(lambda x: jax.lax.top_k(x, k))(short)[1]))


def test_buffers_of_transposed_dims_are_not_confused():
    """A buffer of dims (n, m) may take the storage of a freed one of dims (m, n), not its shape."""
    def fn(x):
        return jnp.argsort(x, axis=0), jnp.argsort(x.T, axis=1)
    f = disc.compile(fn, SPEC)
    x = np.random.default_rng(6).standard_normal((3, 200)).astype(np.float32)
    for g, w in zip(f(x), jax.jit(fn)(x)):
        np.testing.assert_array_equal(g, np.asarray(w))


@pytest.mark.parametrize("name, fn, lhs, rhs", [
    ("int32 matmul", lambda a, b: a @ b, ("m", 70, np.int32), (70, 33, np.int32)),
    ("int8 to int32", lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.int32), ("m", 64, np.int8), (64, 40, np.int8)),
    ("uint8 to int32", lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.int32), ("m", 64, np.uint8), (64, 17, np.uint8)),
    ("int16 transposed rhs", lambda a, b: a @ b.T, ("m", 50, np.int16), (23, 50, np.int16)),
    ("int64 batched", lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), (3, "m", 20, np.int64), (3, 20, 9, np.int64)),
    ("int32 matrix-vector", lambda a, b: a @ b, ("m", 31, np.int32), (31, np.int32)),
    ("uint32 contracting two dims", lambda a, b: jnp.tensordot(a, b, axes=([1, 2], [0, 1])), ("m", 4, 6, np.uint32), (4, 6, 5, np.uint32)),
])
def test_integer_dot_general(name, fn, lhs, rhs):
    """Integer products (no BLAS has them) as a loop nest ordered for vectorisation, with
    StableHLO's conversions (sign- or zero-extension) and wrapping arithmetic."""
    m, = export.symbolic_shape("m")
    rng = np.random.default_rng(len(name))

    def spec(s):
        return jax.ShapeDtypeStruct(tuple(m if d == "m" else d for d in s[:-1]), s[-1])

    def value(s, rows):
        info = np.iinfo(s[-1])
        return rng.integers(max(info.min, -100), min(info.max, 100), tuple(rows if d == "m" else d for d in s[:-1])).astype(s[-1])
    f = disc.compile(fn, spec(lhs), spec(rhs))
    for rows in (1, 5, 130):
        a, b = value(lhs, rows), value(rhs, rows)
        np.testing.assert_array_equal(f(a, b), np.asarray(jax.jit(fn)(a, b)), err_msg=f"{name}, {rows} rows")


TOP_K_COMPOSITE = """
func.func @main(%x: tensor<2x?xf32>) -> (tensor<2x3xf32>, tensor<2x3xi32>) {
  %0:2 = stablehlo.composite "chlo.top_k" %x {composite_attributes = {k = 3 : i64}, decomposition = @never_called}
    : (tensor<2x?xf32>) -> (tensor<2x3xf32>, tensor<2x3xi32>)
  return %0#0, %0#1 : tensor<2x3xf32>, tensor<2x3xi32>
}
func.func private @never_called(%x: tensor<2x?xf32>) -> (tensor<2x3xf32>, tensor<2x3xi32>) {
  %v = stablehlo.constant dense<0.0> : tensor<2x3xf32>
  %i = stablehlo.constant dense<0> : tensor<2x3xi32>
  return %v, %i : tensor<2x3xf32>, tensor<2x3xi32>
}
"""


def test_top_k_checks_k_against_the_dim_where_nothing_else_does():
    """A top_k composite (JAX's form) is selected by our kernel, not its decomposition (here a
    wrong one), and a row shorter than k is a ShapeError before any kernel runs."""
    f = disc.compile(TOP_K_COMPOSITE)
    x = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.float32)
    values, indices = f(x)
    np.testing.assert_array_equal(values, [[5, 4, 3], [9, 6, 5]])
    np.testing.assert_array_equal(indices, [[4, 2, 0], [0, 2, 3]])
    with pytest.raises(disc.ShapeError, match="k = 3 exceeds the operand's last dim, 2"):
        f(x[:, :2].copy())


torch = pytest.importorskip("torch")


class _TorchOps(torch.nn.Module):
    def forward(self, x, i):
        return (torch.cumsum(x, 1), torch.cumsum(i, 0), x.cumsum(-1, dtype=torch.float64), *torch.sort(x, 1, descending=True),
                torch.argsort(x, 0), torch.msort(x), torch.sort(i, dim=1, stable=True)[1], *torch.topk(x, 3, 1),
                *torch.topk(x, 2, 0, largest=False))


def test_torch_cumsum_sort_and_topk_with_dynamic_sizes():
    """Each compiled once with both dims dynamic (torch-mlir alone fails on all three) and
    checked against eager at three shapes, batch 2 and NaNs included (no ties where torch's
    order of equal elements is unspecified)."""
    b, n = torch.export.Dim("b", min=2), torch.export.Dim("n", min=4, max=4096)

    def inputs(rows, cols, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randperm(rows * cols, generator=g).reshape(rows, cols).float() / 7 - 3
        x[0, 2] = float("nan")
        return x, torch.randint(-5, 5, (rows, cols), generator=g, dtype=torch.int32)
    f = disc.compile(_TorchOps(), inputs(4, 16, 0), dynamic_shapes=({0: b, 1: n}, {0: b, 1: n}))
    for seed, shape in enumerate([(5, 40), (3, 1000), (2, 7)]):
        x, i = inputs(*shape, seed)
        for k, (got, want) in enumerate(zip(f(x, i), _TorchOps()(x, i))):
            assert np.asarray(got).dtype == want.numpy().dtype, k
            np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-4, equal_nan=True, err_msg=f"output {k}")
