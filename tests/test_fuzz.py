"""Fuzzing against jax.jit: programs with dynamic dims, each compiled once, run at shapes and
values hypothesis draws (dims of 0 and 1 included; NaN, infinities, denormals and extremes in
every element type the program takes), and at invalid shapes (dims that break the program's
shape contract), which must be a DiscError. No crash, no silent difference.

The CI run is bounded (DISC_FUZZ_EXAMPLES per program, default 6, with a fixed seed); a long
run: `DISC_FUZZ_EXAMPLES=300 python -m pytest tests/test_fuzz.py -p no:randomly` (the figures
of the last one are in the README)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import specs_for

import disc_stablehlo as disc

hypothesis = pytest.importorskip("hypothesis", reason="the fuzzing suite needs hypothesis (pip install disc_stablehlo[test])")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

EXAMPLES = int(os.environ.get("DISC_FUZZ_EXAMPLES", "6"))
MAX_DIM = 9

f32, f64, f16, bf16, i32, i8, u8, b1 = np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int8, np.uint8, np.bool_


def _gather_rows(x, i):
    return x[jnp.clip(i, 0, x.shape[0] - 1)]


def _scatter_add(x, i, u):
    return x.at[jnp.clip(i, 0, x.shape[0] - 1)].add(u)


def _while_halving(x):
    def body(c):
        return c[0] + 1, c[1] * 0.5

    return jax.lax.while_loop(lambda c: (c[0] < 5) & (jnp.max(jnp.abs(c[1]), initial=0.0) > 1.0), body, (0, x))[1]


_KERNEL = np.random.default_rng(0).standard_normal((3, 3, 4)).astype(np.float32)


def _conv(x):
    """A finite kernel: the spec pads with zeros that multiply the kernel (0 * inf is NaN), where
    XLA skips the padding: an infinite weight would compare the two conventions."""
    return jax.lax.conv_general_dilated(x, _KERNEL, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))


# name -> (function, [(shape, dtype)], dim names, tolerance); dims are 'a', 'b', 'c'
PROGRAMS = {
    "add": (lambda x, y: x + y, [(("a", "b"), f32), (("a", "b"), f32)], 0),
    "mixed_chain": (lambda x, y: (jnp.tanh(x) * y, jnp.exp(-jnp.abs(x)) - y), [(("a", "b"), f32), (("a", "b"), f32)], 1e-5),
    "f64_math": (lambda x: jnp.log1p(jnp.abs(x)) + jnp.sqrt(jnp.abs(x)) * jnp.sign(x), [(("a",), f64)], 1e-12),
    "f16_add_mul": (lambda x, y: x * y + x, [(("a", "b"), f16), (("a", "b"), f16)], 1e-3),
    "bf16_relu": (lambda x: jnp.maximum(x, 0) * 2, [(("a", "b"), bf16)], 1e-2),
    "int_arith": (lambda x, y: x * 3 - y // jnp.where(y == 0, 1, y) + jnp.abs(x), [(("a",), i32), (("a",), i32)], 0),
    "int8_saturating": (lambda x: (x.astype(i32) * 2).clip(-128, 127).astype(i8), [(("a", "b"), i8)], 0),
    "uint8_shift": (lambda x, y: (x >> (y % 8)) ^ y, [(("a",), u8), (("a",), u8)], 0),
    "bool_logic": (lambda p, q: (p & ~q) | (q ^ p), [(("a", "b"), b1), (("a", "b"), b1)], 0),
    "compare_select": (lambda x, y: jnp.where(x > y, x, y * 2), [(("a", "b"), f32), (("a", "b"), f32)], 0),
    "row_broadcast": (lambda x, v: (x * v[None, :], x + v), [(("a", "b"), f32), (("b",), f32)], 1e-6),
    "col_broadcast": (lambda x, v: x - v[:, None], [(("a", "b"), f32), (("a",), f32)], 0),
    "sum_rows": (lambda x: x.sum(axis=1), [(("a", "b"), f32)], 1e-4),
    "max_cols": (lambda x: x.max(axis=0, initial=-jnp.inf), [(("a", "b"), f32)], 0),
    "mean_all": (lambda x: jnp.mean(x), [(("a", "b"), f64)], 1e-10),
    "softmax": (lambda x: jax.nn.softmax(x, axis=-1), [(("a", "b"), f32)], 1e-5),
    # eps 1: with a small one, a row of equal values divides the mean's last-bit rounding (which
    # depends on the order of the sum) by sqrt(eps)
    "layer_norm": (lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1.0), [(("a", "b"), f32)], 1e-3),
    "argmax": (lambda x: jnp.argmax(x, axis=1), [(("a", "b"), f32)], 0),
    "cumsum": (lambda x: jnp.cumsum(x, axis=0), [(("a", "b"), i32)], 0),
    "reshape_flatten": (lambda x: x.reshape(-1) * 2, [(("a", "b"), f32)], 0),
    "reshape_split": (lambda x: x.reshape(x.shape[0], 2, x.shape[1] // 2).sum(1), [(("a", "b"), f32)], 1e-5),
    "transpose": (lambda x: x.T + 1, [(("a", "b"), f32)], 0),
    "concat": (lambda x, y: jnp.concatenate([x, y, x], axis=0), [(("a", "b"), f32), (("c", "b"), f32)], 0),
    "slice_pad": (lambda x: jnp.pad(x[1:, ::2], ((1, 2), (0, 1))), [(("a", "b"), f32)], 0),
    "reverse": (lambda x: jnp.flip(x, axis=(0, 1)), [(("a", "b"), i32)], 0),
    "dynamic_slice": (lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, 1, axis=0), [(("a", "b"), f32), ((), i32)], 0),
    "gather_rows": (_gather_rows, [(("a", "b"), f32), (("c",), i32)], 0),
    "scatter_add": (_scatter_add, [(("a", "b"), f32), (("c",), i32), (("c", "b"), f32)], 1e-5),
    "sort": (lambda x: jnp.sort(x, axis=-1), [(("a", "b"), f32)], 0),
    "while_loop": (_while_halving, [(("a",), f32)], 0),
    "cond": (lambda p, x: jax.lax.cond(p, lambda v: v * 2, lambda v: v - 1, x), [((), b1), (("a",), f32)], 0),
    "matmul": (lambda x, y: x @ y, [(("a", "b"), f32), (("b", "c"), f32)], 1e-4),
    "batched_matmul": (lambda x, y: jnp.einsum("abk,akc->abc", x, y), [(("a", "b", 3), f32), (("a", 3, "c"), f32)], 1e-4),
    "conv1d": (_conv, [(("a", "b", 3), f32)], 1e-4),
    "iota_mask": (lambda x: jnp.where(jnp.arange(x.shape[1])[None, :] < x.shape[0], x, 0), [(("a", "b"), f32)], 0),
}


# programs that add up products or many values: magnitudes bounded (NaN, infinities and
# denormals still drawn), as where an intermediate overflows depends on the order of the sums
# and on fused multiply-adds, which differ between correct implementations
ACCUMULATING = {"sum_rows", "mean_all", "softmax", "layer_norm", "matmul", "batched_matmul", "conv1d", "scatter_add"}


def _values(dtype, bounded: bool = False) -> st.SearchStrategy:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return st.booleans()
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return st.one_of(st.integers(-20, 20).filter(lambda v: info.min <= v <= info.max), st.sampled_from([int(info.min), int(info.max), 0]))
    width = 16 if dtype.itemsize == 2 else dtype.itemsize * 8
    if dtype == np.dtype(bf16):
        width = 32  # drawn as f32, rounded below
    tiny = float(np.finfo(np.dtype(f32) if width == 32 else dtype).smallest_subnormal)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny]
    if bounded:
        return st.one_of(st.floats(-1e3, 1e3, width=width), st.sampled_from(special))
    special.append(float(np.finfo(np.dtype(f32) if width == 32 else dtype).max))
    return st.one_of(st.floats(width=width, allow_nan=True, allow_infinity=True, allow_subnormal=True),
                     st.floats(-4, 4, width=width), st.sampled_from(special))


def _array(shape, dtype, bounded: bool = False) -> st.SearchStrategy:
    draw_dtype = np.float32 if np.dtype(dtype) == np.dtype(bf16) else dtype
    return hnp.arrays(draw_dtype, shape, elements=_values(dtype, bounded)).map(lambda a: a.astype(dtype))


def _concrete(shape, env):
    return tuple(env[d] if isinstance(d, str) else d for d in shape)


def _dims_fit(name: str, env: dict[str, int]) -> bool:
    """Shapes the program itself constrains (beyond the symbolic dims)."""
    if name == "reshape_split":
        return env["b"] % 2 == 0
    if name == "dynamic_slice":
        return env["a"] >= 1
    if name in ("gather_rows", "scatter_add"):
        return env["a"] >= 1
    return True


def _compiled(name):
    """The program compiled once, for every shape (reshape_split: for even b)."""
    fn, args, _ = PROGRAMS[name]
    used = sorted({d for shape, _ in args for d in shape if isinstance(d, str)})
    constraints = ["mod(b, 2) == 0"] if name == "reshape_split" else []
    syms = dict(zip(used, jax.export.symbolic_shape(", ".join(used), constraints=constraints)))
    return disc.compile(fn, *[jax.ShapeDtypeStruct(tuple(syms[d] if isinstance(d, str) else d for d in shape), dtype) for shape, dtype in args])


_CACHE: dict[str, disc.CompiledFunction] = {}


def _flushed(a: np.ndarray) -> np.ndarray:
    """`a` with its denormals flushed to zero: XLA on the CPU flushes them (inputs and results),
    disc_stablehlo keeps IEEE's (`test_denormals_are_kept`): compared on flushed inputs and results."""
    a = np.asarray(a)
    if not (np.issubdtype(a.dtype, np.floating) or a.dtype == np.dtype(bf16)):
        return a
    tiny = float(ml_dtypes.finfo(a.dtype).smallest_normal)
    return np.where(np.abs(a.astype(np.float64)) < tiny, np.zeros((), a.dtype) * np.sign(a.astype(np.float64)).astype(a.dtype), a).astype(a.dtype)


def _matches(got, want, tol: float, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    if np.issubdtype(want.dtype, np.floating) or want.dtype == np.dtype(bf16):
        g, w = _flushed(got).astype(np.float64), _flushed(want).astype(np.float64)
        assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what}: NaN at other places\n{g}\n{w}"
        finite = ~np.isnan(w)
        np.testing.assert_allclose(g[finite], w[finite], rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_fuzz_against_jax(name):
    fn, args, tol = PROGRAMS[name]
    if name not in _CACHE:
        _CACHE[name] = _compiled(name)
    f, ref = _CACHE[name], jax.jit(fn)
    used = sorted({d for shape, _ in args for d in shape if isinstance(d, str)})

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(st.data())
    def run(data):
        env = {d: data.draw(st.integers(0, MAX_DIM), label=d) for d in used}
        inputs = [_flushed(data.draw(_array(_concrete(shape, env), dtype, name in ACCUMULATING), label=f"arg{i}"))
                  for i, (shape, dtype) in enumerate(args)]
        if 0 in env.values() or not _dims_fit(name, env):  # JAX's dims are >= 1, and the program's own contract
            with pytest.raises(disc.ShapeError):
                f(*inputs)
            return
        want = jax.tree_util.tree_leaves(ref(*inputs))
        got = jax.tree_util.tree_leaves(f(*inputs))
        for k, (g, w) in enumerate(zip(got, want)):
            _matches(g, w, tol, f"{name} result {k} at {env}")

    run()


@pytest.mark.parametrize("name", ["add", "row_broadcast", "matmul", "concat", "scatter_add", "batched_matmul"])
def test_invalid_shapes_are_a_disc_error(name):
    """Dims that break the symbolic shapes (one dim variable, two sizes) are a ShapeError before
    anything runs; the next valid call works."""
    fn, args, tol = PROGRAMS[name]
    if name not in _CACHE:
        _CACHE[name] = _compiled(name)
    f = _CACHE[name]
    rng = np.random.default_rng(0)
    good = [rng.standard_normal(_concrete(shape, {"a": 3, "b": 4, "c": 2})).astype(dtype) if np.dtype(dtype).kind == "f"
            else rng.integers(0, 3, _concrete(shape, {"a": 3, "b": 4, "c": 2})).astype(dtype) for shape, dtype in args]
    bad = list(good)
    shape = _concrete(args[-1][0], {"a": 5, "b": 6, "c": 2})  # the last argument's 'a' / 'b' disagree with the first's
    bad[-1] = np.zeros(shape, args[-1][1])
    with pytest.raises(disc.DiscError):
        f(*bad)
    _matches(f(*good), jax.jit(fn)(*good), tol or 1e-6, name)


def test_denormals_are_kept():
    """IEEE's denormals in and out (XLA on the CPU flushes them to zero, so the fuzzing above
    compares flushed values)."""
    f = disc.compile(lambda x, y: (x + y, x * 2.0**20), *specs_for([(("a",), f32), (("a",), f32)], "a"))
    tiny = np.array([1e-45, -3e-40, 1e-39], f32)
    total, scaled = f(tiny, np.zeros(3, f32))
    np.testing.assert_array_equal(total, tiny)
    np.testing.assert_array_equal(scaled, tiny * np.float32(2.0**20))
