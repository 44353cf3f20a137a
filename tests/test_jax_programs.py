"""JAX programs compiled ONCE with symbolic dims and compared with jax.jit at >= 3 shapes each
(size-1 dims included)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import check_against_jax

F32, F64, I32, I64, BOOL, BF16 = np.float32, np.float64, np.int32, np.int64, np.bool_, ml_dtypes.bfloat16
B3 = [{"b": 1}, {"b": 3}, {"b": 8}]
BS = [{"b": 1, "s": 1}, {"b": 2, "s": 5}, {"b": 4, "s": 17}]
N = [{"n": 1}, {"n": 6}, {"n": 33}]


def _positive(x):
    return jnp.abs(x) + 0.5


CASES = [
    # name, fn, args [(shape, dtype)], dims, envs, tolerance
    ("add_mul_sub_div", lambda x, y: (x + y) * x - y / (jnp.abs(x) + 1), [(("b", "s"), F32)] * 2, "b, s", BS, 1e-5),
    ("transcendental", lambda x: jnp.exp(x) + jnp.log(_positive(x)) + jnp.tanh(x) + jnp.sin(x) * jnp.cos(x), [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("sqrt_rsqrt_pow", lambda x: jnp.sqrt(_positive(x)) + jax.lax.rsqrt(_positive(x)) + _positive(x) ** 1.7, [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("rounding_sign", lambda x: jnp.floor(x * 3) + jnp.ceil(x) + jnp.round(x * 2) + jnp.sign(x) - jnp.abs(x), [(("n",), F32)], "n", N, 1e-6),
    ("min_max_clip", lambda x, y: jnp.clip(jnp.maximum(x, y), -0.5, 0.5) + jnp.minimum(x, y), [(("n",), F32)] * 2, "n", N, 1e-6),
    ("logistic_expm1_log1p", lambda x: jax.nn.sigmoid(x) + jnp.expm1(x) + jnp.log1p(_positive(x)), [(("n", 4), F32)], "n", N, 1e-5),
    ("broadcast_row", lambda x, y: x + y, [(("b", "s"), F32), (("s",), F32)], "b, s", BS, 1e-6),
    ("broadcast_scalar_and_col", lambda x, c: x * 2.5 + c[:, None], [(("b", "s"), F32), (("b",), F32)], "b, s", BS, 1e-6),
    ("broadcast_outer", lambda x, y: x[:, None] * y[None, :], [(("b",), F32), (("s",), F32)], "b, s", BS, 1e-6),
    ("sum_last_axis", lambda x: x.sum(-1), [(("b", "s", 3), F32)], "b, s", BS, 1e-5),
    ("max_first_axis", lambda x: x.max(0), [(("b", "s"), F32)], "b, s", BS, 1e-6),
    ("mean_all", lambda x: x.mean(), [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("argmax", lambda x: jnp.argmax(x, axis=-1), [(("b", "s"), F32)], "b, s", BS, 0),
    ("softmax", lambda x: jax.nn.softmax(x, axis=-1), [(("b", "s", 8), F32)], "b, s", BS, 1e-5),
    ("layer_norm", lambda x, g: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5) * g,
     [(("b", "s", 16), F32), ((16,), F32)], "b, s", BS, 1e-4),
    ("gelu_erf", lambda x: jax.nn.gelu(x, approximate=False), [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("gelu_tanh", lambda x: jax.nn.gelu(x, approximate=True), [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("matmul", lambda x, w: x @ w, [(("b", 16), F32), ((16, 8), F32)], "b", B3, 1e-4),
    ("matmul_dynamic_k", lambda x, w: x @ w, [(("b", "s"), F32), (("s", 5), F32)], "b, s", BS, 1e-4),
    ("batched_matmul", lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y), [(("b", "s", 8), F32), (("b", 8, "s"), F32)], "b, s", BS, 1e-4),
    ("attention_scores", lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k), [(("b", 2, "s", 4), F32)] * 2, "b, s", BS, 1e-4),
    ("matmul_f64", lambda x, w: x @ w, [(("b", 7), F64), ((7, 3), F64)], "b", B3, 1e-10),
    ("matmul_i32", lambda x, w: x @ w, [(("b", 5), I32), ((5, 3), I32)], "b", B3, 0),
    ("reshape_merge", lambda x: x.reshape(x.shape[0], -1), [(("b", "s", 4), F32)], "b, s", BS, 0),
    ("reshape_flatten_rows", lambda x: x.reshape(-1, 4) * 2, [(("b", "s", 4), F32)], "b, s", BS, 0),
    ("transpose", lambda x: x.transpose(2, 0, 1) + 1, [(("b", "s", 3), F32)], "b, s", BS, 0),
    ("concatenate", lambda x, y: jnp.concatenate([x, y, x], axis=1), [(("b", "s"), F32), (("b", 2), F32)], "b, s", BS, 0),
    ("slice_and_stride", lambda x: x[:, 1:] + x[:, :-1] * 2 + x[:, ::2].sum(), [(("b", 9), F32)], "b", B3, 1e-5),
    ("take_rows", lambda x, i: jnp.take(x, i, axis=0, mode="clip"), [(("b", 4), F32), (("s",), I32)], "b, s", BS, 0),
    ("take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1, mode="clip"), [(("b", 6), F32), (("b", 3), I32)], "b", B3, 0),
    ("scatter_add", lambda x, i, u: x.at[i].add(u, mode="drop"), [(("b", 3), F32), (("s",), I32), (("s", 3), F32)], "b, s", BS, 1e-5),
    ("scatter_set", lambda x, i: x.at[i].set(7.0, mode="drop"), [(("b",), F32), (("s",), I32)], "b, s", BS, 0),
    ("iota", lambda x: x + jnp.arange(x.shape[0], dtype=np.float32)[:, None], [(("b", "s"), F32)], "b, s", BS, 0),
    ("iota_unsigned", lambda x: x * 3 + jnp.arange(x.shape[0], dtype=np.uint32), [(("n",), np.uint32)], "n", N, 0),
    ("select_where", lambda x, y: jnp.where(x > y, x, y * 2) + (x > 0), [(("b", "s"), F32)] * 2, "b, s", BS, 0),
    ("convert_f32_i32_f64", lambda x: (x * 10).astype(I32).astype(F64) + x.astype(F64), [(("n",), F32)], "n", N, 1e-6),
    ("convert_bool_i64", lambda x, y: (x > 0).astype(I64) + y, [(("n",), F32), (("n",), I64)], "n", N, 0),
    ("bf16_math", lambda x: (x.astype(BF16) * 2 + 1).astype(F32), [(("n",), F32)], "n", N, 1e-2),
    ("convert_f64_bf16", lambda x: x.astype(BF16), [(("n",), F64)], "n", N, 0),
    ("integer_bitwise", lambda x, y: (x & y) | (x ^ 3) + (x >> 1) - (y << 2) + x % 7, [(("n",), I32)] * 2, "n", N, 0),
    ("compare_logic", lambda x, y: jnp.logical_and(x > 0, jnp.logical_or(y < 0, x == y)), [(("n",), F32)] * 2, "n", N, 0),
    ("while_fori", lambda x: jax.lax.fori_loop(0, 5, lambda i, c: c * 0.5 + i, x), [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("while_dynamic_count", lambda x: jax.lax.while_loop(lambda c: c[0] < c[1].shape[0], lambda c: (c[0] + 1, c[1] * 1.1), (0, x))[1],
     [(("b",), F32)], "b", B3, 1e-5),
    ("cond", lambda p, x: jax.lax.cond(p.sum() > 0, lambda v: v * 2, lambda v: v - 1, x), [(("b",), F32), (("b", "s"), F32)], "b, s", BS, 0),
    ("switch", lambda i, x: jax.lax.switch(i, [lambda v: v + 1, lambda v: v * 3, lambda v: -v], x), [((), I32), (("n",), F32)], "n",
     N, 0),
    ("scan_cumulative", lambda x: jax.lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(x.shape[1:], x.dtype), x)[1],
     [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), [(("b", "s"), F32)], "b, s", BS, 1e-5),
    ("dynamic_slice", lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, 2, axis=1), [(("b", 6), F32), ((), I32)], "b", B3, 0),
    ("dynamic_update_slice", lambda x, u, i: jax.lax.dynamic_update_slice_in_dim(x, u, i, axis=1), [(("b", 5), F32), (("b", 2), F32), ((), I32)],
     "b", B3, 0),
    ("sort", lambda x: jnp.sort(x, axis=-1), [(("b", "s"), F32)], "b, s", BS, 0),
    ("argsort_stable", lambda x: jnp.argsort(x, axis=0, stable=True), [(("b", "s"), I32)], "b, s", BS, 0),
    ("pad", lambda x: jnp.pad(x, ((1, 2), (0, 3))) + 1, [(("b", "s"), F32)], "b, s", BS, 0),
    ("reverse", lambda x: jnp.flip(x, axis=1) - x, [(("b", "s"), F32)], "b, s", BS, 0),
    ("conv1d", lambda x, w: jax.lax.conv_general_dilated(x, w, (1,), "SAME"), [(("b", 3, 12), F32), ((4, 3, 3), F32)], "b", B3, 1e-4),
    ("conv2d_nhwc", lambda x, w: jax.lax.conv_general_dilated(x, w, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),
     [(("b", 9, 9, 2), F32), ((3, 3, 2, 4), F32)], "b", B3, 1e-4),
    ("conv2d_nchw_dynamic_spatial", lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 2), ((1, 1), (0, 2)), rhs_dilation=(2, 1)),
     [(("b", 4, "h", "w"), F32), ((6, 4, 3, 3), F32)], "b, h, w", [{"b": 1, "h": 5, "w": 7}, {"b": 2, "h": 8, "w": 6}, {"b": 3, "h": 6, "w": 11}], 1e-4),
    ("conv1d_grouped_lhs_dilated", lambda x, w: jax.lax.conv_general_dilated(x, w, (1,), ((1, 2),), lhs_dilation=(2,), feature_group_count=2),
     [(("b", 4, "s"), F32), ((6, 2, 3), F32)], "b, s", BS, 1e-4),
    ("max_pool", lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
     [(("b", 6, 6, 3), F32)], "b", B3, 0),
    ("avg_pool_padded", lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3), (1, 1), "SAME") / 3, [(("b", 7), F32)], "b", B3, 1e-5),
]


@pytest.mark.parametrize("name, fn, args, dims, envs, tol", CASES, ids=[c[0] for c in CASES])
def test_program_matches_jax(name, fn, args, dims, envs, tol):
    check_against_jax(fn, args, dims, envs, rtol=tol, atol=tol)


def test_case_count():
    assert len(CASES) >= 40

