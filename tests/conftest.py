"""Shared helpers: compile a JAX function ONCE with symbolic dims and compare it with jax.jit at
several concrete shapes."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc

jax.config.update("jax_enable_x64", True)
disc.collect_stats()  # the tests count kernel calls


def random_array(shape, dtype, rng):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        lo = 0 if np.issubdtype(dtype, np.unsignedinteger) else -20
        return rng.integers(lo, 20, size=shape).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def gemm_calls(f, entry: str = "disc_ral_gemm") -> int:
    """How many calls of the RAL's GEMM (or of another library `entry`: disc_ral_conv) a compiled
    function has made so far."""
    return sum(st["calls"] for name, st in f.stats().items() if name.startswith(entry))


def gemm_call_args(f) -> list[list[str]]:
    """The arguments of each RAL GEMM call in a compiled function's LLVM IR ("i64 8", "ptr %3",
    ...), in order: see ral/ral.h for their positions."""
    return [c.split(", ") for c in re.findall(r"call void @disc_ral_gemm_f32(?:_epilogue)?\(([^)]*)\)", f.llvm_ir)]


def own_gemm_kernel() -> bool:
    """Whether this CPU runs single precision on the RAL's own kernel (packed_gemm.c picks it
    from the CPU's features and vendor)."""
    from disc_stablehlo.runtime import ral

    kernel = ral().ral_packed_sgemm_kernel
    kernel.restype = ctypes.c_void_p
    return bool(kernel())


def gemm_epilogue_behind(rows: int) -> bool:
    """Whether a single-precision product of `rows` rows (one batch entry, large enough for the
    pool) runs its epilogue behind its row blocks on this machine (the default runtime): with at
    least 4 whole-row blocks per thread. On the RAL's own kernel with 2 threads or more, a product
    of 256 rows or more packs B once and splits into blocks of about 128 rows; otherwise the
    rows split into one block per thread (of at least 32 rows). ral.c's gemm_run has the rules."""
    threads = len(os.sched_getaffinity(0))
    shared = own_gemm_kernel() and not os.environ.get("DISC_GEMM") and threads > 1 and rows >= 256
    blocks = -(-rows // 128) if shared else min(threads, -(-rows // 32))
    return blocks >= 4 * threads


def specs_for(shapes_and_dtypes, dim_names: str):
    """('b, s', [(('b', 's', 4), np.float32), ...]) -> ShapeDtypeStructs with symbolic dims."""
    syms = dict(zip([n.strip() for n in dim_names.split(",")], export.symbolic_shape(dim_names)))
    return [jax.ShapeDtypeStruct(tuple(syms[d] if isinstance(d, str) else d for d in shape), dtype)
            for shape, dtype in shapes_and_dtypes]


def concrete(shape, env):
    return tuple(env[d] if isinstance(d, str) else d for d in shape)


def check_against_jax(fn, args, dim_names: str, envs, rtol=1e-5, atol=1e-5, make_inputs=None):
    """Compiles `fn` once and checks it against jax.jit at each dim assignment in `envs`."""
    compiled = disc.compile(fn, *specs_for(args, dim_names))
    ref = jax.jit(fn)
    rng = np.random.default_rng(0)
    for env in envs:
        if make_inputs is not None:
            inputs = make_inputs(env, rng)
        else:
            inputs = [random_array(concrete(shape, env), dtype, rng) for shape, dtype in args]
        got = compiled(*inputs)
        want = ref(*inputs)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            w = np.asarray(w)
            assert g.shape == w.shape, f"shape {g.shape} != {w.shape} at {env}"
            assert g.dtype == w.dtype, f"dtype {g.dtype} != {w.dtype} at {env}"
            np.testing.assert_allclose(np.asarray(g, dtype=w.dtype), w, rtol=rtol, atol=atol, err_msg=f"at {env}")
    assert compiled.compile_count == 1
    return compiled


@pytest.fixture
def rng():
    return np.random.default_rng(0)



TENSORFLOW_TESTS = Path(__file__).parent / "tensorflow"


def pytest_ignore_collect(collection_path, config):
    """The tests that import TensorFlow live in tests/tensorflow, run as a session of their own
    (`python3 dev.py test` does): TensorFlow and triton, which CUDA builds of torch import with
    torch.export and dynamo, crash when TensorFlow comes first, with or without this package
    (their two LLVMs). With triton installed, a session that would collect both skips that folder."""
    if collection_path != TENSORFLOW_TESTS or importlib.util.find_spec("triton") is None:
        return None
    if all(Path(a.split("::")[0]).resolve().is_relative_to(TENSORFLOW_TESTS) for a in config.args):
        return None
    warnings.warn("tests/tensorflow not collected: TensorFlow and triton crash in one process; run `pytest tests/tensorflow` apart")
    return True
