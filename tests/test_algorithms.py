"""Ops with a computation region run as real algorithms: the region's scalar code is inlined
into the loops that walk the elements (no allocation per element), sorts merge runs in
O(n log n) comparisons, and the results match numpy at sizes where per-element costs would show."""

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
