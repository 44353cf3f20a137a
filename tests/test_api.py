"""The user-facing contract beyond numerics: StableHLO inputs, pytrees, JAX in/out, guards and
errors, thread safety, and no memory growth across calls."""

from __future__ import annotations

import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import specs_for
from jax import export

import disc_stablehlo as disc
from disc_stablehlo.runtime import openblas_library

DYNAMIC_TEXT = """
func.func @main(%x: tensor<?x4xf32>, %y: tensor<4xf32>) -> (tensor<?x4xf32>, tensor<?xf32>) {
  %0 = stablehlo.get_dimension_size %x, dim = 0 : (tensor<?x4xf32>) -> tensor<i32>
  %1 = stablehlo.reshape %0 : (tensor<i32>) -> tensor<1xi32>
  %c4 = stablehlo.constant dense<4> : tensor<1xi32>
  %2 = stablehlo.concatenate %1, %c4, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
  %3 = stablehlo.dynamic_broadcast_in_dim %y, %2, dims = [1] : (tensor<4xf32>, tensor<2xi32>) -> tensor<?x4xf32>
  %4 = stablehlo.multiply %x, %3 : tensor<?x4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %5 = stablehlo.reduce(%4 init: %z) applies stablehlo.add across dimensions = [1] : (tensor<?x4xf32>, tensor<f32>) -> tensor<?xf32>
  return %4, %5 : tensor<?x4xf32>, tensor<?xf32>
}
"""


def test_stablehlo_text_with_dynamic_dims():
    g = disc.compile(DYNAMIC_TEXT)
    y = np.arange(4, dtype=np.float32)
    for n in (1, 3, 10):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        prod, total = g(x, y)
        np.testing.assert_allclose(prod, x * y, rtol=1e-6)
        np.testing.assert_allclose(total, (x * y).sum(1), rtol=1e-5)
    assert g.compile_count == 1


def test_stablehlo_bytecode_and_portable_artifact():
    from torch_mlir import ir
    from torch_mlir._mlir_libs import _stablehlo

    from disc_stablehlo.mlir_support import new_context

    text = "func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> { %0 = stablehlo.negate %x : tensor<?xf32>  return %0 : tensor<?xf32> }"
    with new_context():
        module = ir.Module.parse(text)
        artifact = _stablehlo.serialize_portable_artifact_str(str(module), _stablehlo.get_current_version())
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(disc.compile(artifact)(x), -x)


def test_mlir_bytecode():
    import io

    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context

    with new_context():
        module = ir.Module.parse("func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> { %0 = stablehlo.sine %x : tensor<?xf32>  return %0 : tensor<?xf32> }")
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    x = np.linspace(0, 1, 7, dtype=np.float32)
    np.testing.assert_allclose(disc.compile(buf.getvalue())(x), np.sin(x), rtol=1e-6)


def test_exported_object_and_pytree_outputs():
    b, = export.symbolic_shape("b")
    exp = export.export(jax.jit(lambda d: {"sum": d["x"] + d["y"], "neg": -d["x"]}))(
        {"x": jax.ShapeDtypeStruct((b, 2), jnp.float32), "y": jax.ShapeDtypeStruct((b, 2), jnp.float32)})
    f = disc.compile(exp)
    x = np.ones((3, 2), np.float32)
    out = f({"x": x, "y": 2 * x})
    assert set(out) == {"sum", "neg"}
    np.testing.assert_array_equal(out["sum"], 3 * x)
    np.testing.assert_array_equal(out["neg"], -x)


def test_jax_arrays_in_give_jax_arrays_out():
    f = disc.compile(lambda x: x * 2, *specs_for([(("n",), np.float32)], "n"))
    out = f(jnp.ones(5, jnp.float32))
    assert isinstance(out, jax.Array)
    assert isinstance(f(np.ones(5, np.float32)), np.ndarray)


@pytest.fixture(scope="module")
def guarded():
    b, s = export.symbolic_shape("b, s", constraints=["s >= 2", "mod(s, 2) == 0"])
    return disc.compile(lambda x, y: x + y.sum(), jax.ShapeDtypeStruct((b, s, 3), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.float32))


@pytest.mark.parametrize("x_shape, y_shape, dtype, match", [
    ((2, 4, 3), (3,), np.float32, "dimension variable 'b' is 2 from argument 'args\\[0\\]' dim 0, but 3"),
    ((2, 4, 5), (2,), np.float32, "argument 'args\\[0\\]' dim 2: expected size 3, got 5"),
    ((2, 4), (2,), np.float32, "argument 'args\\[0\\]': expected rank 3"),
    ((2, 4, 3), (2,), np.float64, "argument 'args\\[1\\]': expected dtype float32, got float64"),
    ((2, 3, 3), (2,), np.float32, "mod\\(s, 2\\) == 0|divisible|'s'"),
    ((1, 0, 3), (1,), np.float32, "s >= 2|'s'"),
])
def test_guards_reject_before_running(guarded, x_shape, y_shape, dtype, match):
    x = np.ones(x_shape, np.float32)
    y = np.ones(y_shape, dtype)
    with pytest.raises(disc.ShapeError, match=match):
        guarded(x, y)
    ok = guarded(np.ones((2, 4, 3), np.float32), np.ones(2, np.float32))  # still works afterwards
    np.testing.assert_array_equal(ok, np.full((2, 4, 3), 3.0, np.float32))


def test_wrong_argument_count(guarded):
    with pytest.raises(disc.ShapeError, match="expected 2 array arguments, got 1"):
        guarded(np.ones((2, 4, 3), np.float32))


def test_unsupported_op_names_op_and_location():
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.custom_call @my_kernel(%x) : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }"""
    with pytest.raises(disc.UnsupportedOpError, match="stablehlo.custom_call @my_kernel \\(tensor<4xf32>\\)"):
        disc.compile(text)


def test_bad_text_is_a_compile_error():
    with pytest.raises(disc.CompileError, match="cannot parse"):
        disc.compile("func.func @main(")


def test_what_jax_export_refuses_is_a_compile_error():
    """JAX's export errors (a comparison of symbolic dims it cannot decide, a negative static dim)
    come out as the package's CompileError, JAX's own as the cause."""
    b, = export.symbolic_shape("b")
    with pytest.raises(disc.CompileError, match="jax.export failed: InconclusiveDimensionOperation") as e:
        disc.compile(lambda x: x[:2] if x.shape[0] > 3 else x, jax.ShapeDtypeStruct((b,), np.float32))
    assert e.value.__cause__ is not None
    with pytest.raises(disc.CompileError, match="jax.export failed"):
        disc.compile(lambda x: x + 1, jax.ShapeDtypeStruct((-1,), np.float32))


def test_concurrent_calls_from_threads():
    """Calls from 4 threads at once, including softmax run behind the row blocks of batched
    scores on the shared pool (the GEMM epilogue path)."""
    f = disc.compile(lambda x, w: jnp.tanh(x @ w).sum(-1), *specs_for([(("b", 16), np.float32), ((16, 16), np.float32)], "b"))
    scores = disc.compile(lambda q: jax.nn.softmax(q @ jnp.swapaxes(q, 1, 2), axis=-1),
                          *specs_for([(("b", "s", 32), np.float32)], "b, s"))
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            x = rng.standard_normal((int(rng.integers(1, 40)), 16)).astype(np.float32)
            if not np.allclose(f(x, w), np.tanh(x @ w).sum(-1), rtol=1e-4, atol=1e-4):
                errors.append(seed)
            q = rng.standard_normal((16, int(rng.integers(60, 70)), 32)).astype(np.float32)
            if not np.allclose(scores(q), jax.nn.softmax(q @ np.swapaxes(q, 1, 2), axis=-1), rtol=1e-4, atol=1e-6):
                errors.append(seed)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    [kernel] = scores.kernels
    assert kernel.epilogue_of and scores.stats()[kernel.name]["fused"] > 0


def test_no_memory_growth_across_calls():
    f = disc.compile(lambda x: jnp.exp(x) * 2 + x.sum(), *specs_for([(("n", 64), np.float32)], "n"))
    x = np.ones((100, 64), np.float32)
    for _ in range(5):
        f(x)
    before = f.memory_stats()
    for _ in range(50):
        del_me = f(x)
        del del_me
    after = f.memory_stats()
    assert after["bytes_in_use"] == before["bytes_in_use"]
    assert after["bytes_cached"] == before["bytes_cached"]


def test_cached_memory_goes_back_on_trim_and_past_the_limit():
    """The runtime keeps the memory calls give back for the next calls, up to a limit, and gives
    it all back on trim()."""
    from disc_stablehlo.runtime import Runtime

    f = disc.compile(lambda x: jnp.exp(x) * 2 + 1, *specs_for([(("n", 64), np.float32)], "n"))
    rt = Runtime(1)
    exe = type(f._exe)(f._exe.artifact, rt)
    x = np.ones((1000, 64), np.float32)
    exe.run([x])
    assert rt.memory_stats()["bytes_cached"] > 0  # the result's buffer went back with the array, cached
    rt.trim()
    assert rt.memory_stats()["bytes_cached"] == 0
    rt.set_cache_limits(max_cached_bytes=1000)
    exe.run([x])
    assert rt.memory_stats()["bytes_cached"] <= 1000  # the 256 KB blocks: past the limit, freed at once
    rt.set_cache_limits()
    exe.run([x])
    assert rt.memory_stats()["bytes_cached"] >= x.nbytes


@pytest.mark.parametrize("buffer_reuse", [True, False])
def test_loop_temporaries_are_freed_inside_the_call(buffer_reuse):
    """A 500-iteration loop over a 64 KiB state must not keep every iteration's buffers."""
    f = disc.compile(lambda x: jax.lax.fori_loop(0, 500, lambda i, c: jnp.tanh(c) * 0.5 + x, x),
                     *specs_for([(("n", 128), np.float32)], "n"), buffer_reuse=buffer_reuse)
    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    runtime = f._exe.runtime
    f(x)
    runtime.reset_peak()
    base = runtime.memory_stats()["bytes_in_use"]
    y = f(x)
    peak = runtime.memory_stats()["peak_bytes"] - base
    assert (peak < 20 * x.nbytes) if buffer_reuse else (peak > 400 * x.nbytes)
    ref = x
    for _ in range(500):
        ref = np.tanh(ref) * 0.5 + x
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_results_are_handed_over_without_a_copy():
    """A result stays in its RAL buffer, owned by the array, and goes back when the array dies."""
    f = disc.compile(lambda x: x * 2, *specs_for([(("n", 256), np.float32)], "n"))
    runtime = f._exe.runtime
    x = np.ones((64, 256), np.float32)
    f(x)
    base = runtime.memory_stats()["bytes_in_use"]
    y = f(x)
    assert y.nbytes <= runtime.memory_stats()["bytes_in_use"] - base <= y.nbytes + 64  # + alignment padding
    assert not y.flags.owndata
    del y
    assert runtime.memory_stats()["bytes_in_use"] == base


def test_jax_and_torch_results_share_the_runtimes_buffer():
    """JAX arrays and torch tensors out are the result's RAL buffer itself (DLPack for JAX; a
    bfloat16 result, which numpy cannot export, is copied), given back when the array dies."""
    import torch

    f = disc.compile(lambda x: (x * 2, (x * 3).astype(jnp.bfloat16)), *specs_for([(("n", 256), np.float32)], "n"))
    runtime = f._exe.runtime
    x = np.ones((64, 256), np.float32)
    f(x)
    base = runtime.memory_stats()["bytes_in_use"]
    for arg in (jnp.asarray(x), torch.from_numpy(x)):
        y, z = f(arg)
        assert runtime.memory_stats()["bytes_in_use"] - base >= 4 * x.size  # y's buffer, held by y
        address = y.unsafe_buffer_pointer() if isinstance(y, jax.Array) else y.data_ptr()
        assert address % 64 == 0 and float(y[3, 7]) == 2.0 and float(z[3, 7]) == 3.0
        del y, z
        assert runtime.memory_stats()["bytes_in_use"] == base


@pytest.mark.parametrize("blas", ["default", "openblas"])
def test_gemms_run_on_the_blas_the_runtime_loads(blas, tmp_path):
    """The runtime loads MKL where the `mkl` package is installed (its sequential layer: the
    RAL's pool splits the GEMMs), else scipy-openblas32; $DISC_BLAS names another. Run in a
    fresh process (the runtime is per process): a batched product and a skinny one match numpy."""
    import subprocess
    import sys

    script = tmp_path / "gemm.py"
    script.write_text("""
import jax, jax.numpy as jnp, numpy as np
from jax import export
import disc_stablehlo as disc
from disc_stablehlo.runtime import default_runtime
b, s = export.symbolic_shape("b, s")
f = disc.compile(lambda x, w: jnp.einsum("bsk,kn->bsn", x, w), jax.ShapeDtypeStruct((b, s, 96), np.float32),
                 jax.ShapeDtypeStruct((96, 300), np.float32))
rng = np.random.default_rng(0)
for shape in [(1, 1, 96), (1, 32, 96), (4, 70, 96)]:
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((96, 300)).astype(np.float32)
    np.testing.assert_allclose(f(x, w), np.einsum("bsk,kn->bsn", x, w), rtol=1e-4, atol=1e-4)
print(default_runtime().blas)
""")
    env = dict(os.environ)
    env.pop("DISC_BLAS", None)
    if blas == "openblas":
        env["DISC_BLAS"] = openblas_library()
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = out.stdout.strip().splitlines()[-1]
    if blas == "openblas":
        assert loaded == env["DISC_BLAS"]
    else:
        import importlib.metadata

        try:
            has_mkl = importlib.metadata.files("mkl") is not None
        except importlib.metadata.PackageNotFoundError:
            has_mkl = False
        assert ("libmkl_rt" in loaded) == has_mkl, loaded


def test_arrays_in_the_other_byte_order_are_converted():
    """A big-endian float32 array is the float32 argument it holds (numpy reads such files)."""
    f = disc.compile("""func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {
      %0 = stablehlo.add %a, %a : tensor<?xf32>
      return %0 : tensor<?xf32>
    }""")
    x = np.arange(5, dtype=">f4")
    np.testing.assert_array_equal(f(x), 2 * x.astype(np.float32))


def test_the_call_path_takes_arrays_in_any_layout_and_times_the_compiled_code():
    """Arrays exactly as compiled go straight to the compiled code (native.c); others (strided and
    stride-0 views, subclasses, a dtype equal to the argument's but another object) are made so
    first, with the same results; a result that is an argument comes back as a copy."""
    f = disc.compile(lambda x, w: (jnp.tanh(x @ w) + 1, w), *specs_for([(("b", 8), np.float32), ((8, 8), np.float32)], "b"))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    want = np.tanh(x @ w) + 1
    before = f.entry_time()
    variants = [x, np.asfortranarray(x), rng.standard_normal((6, 16)).astype(np.float32)[:, ::2], np.broadcast_to(x[:1], (6, 8)),
                x.view(type("Sub", (np.ndarray,), {})), x.astype(np.dtype(np.float32, metadata={"unit": "m"}))]
    for v in variants:
        y, w_back = f(v, w)
        np.testing.assert_allclose(y, np.tanh(np.asarray(v) @ w) + 1, rtol=1e-5, atol=1e-6)
        assert type(y) is np.ndarray and y.flags.c_contiguous and y.flags.writeable
        np.testing.assert_array_equal(w_back, w)
        assert w_back.ctypes.data != w.ctypes.data  # a copy: the argument stays the caller's
    np.testing.assert_allclose(f(x, w)[0], want, rtol=1e-5, atol=1e-6)
    after = f.entry_time()
    assert after["calls"] - before["calls"] == len(variants) + 1 and after["seconds"] > before["seconds"]


def test_a_view_too_large_to_copy_is_a_runtime_failure():
    """A broadcast view (stride 0) is copied row-major for the call: one of 4 PiB cannot be, and
    says so in the package's error, naming the argument."""
    b, s = export.symbolic_shape("b, s")
    f = disc.compile(lambda x: x.sum(), jax.ShapeDtypeStruct((b, s), np.float32))
    with pytest.raises(disc.RuntimeFailure, match=r"argument 'args\[0\]': out of memory copying the float32\[67108864, 16777216\] view"):
        f(np.broadcast_to(np.float32(1), (1 << 26, 1 << 24)))


def test_python_lists_are_arrays_of_the_arguments_dtype():
    """A list has no dtype of its own: it is taken as the argument's (not numpy's float64)."""
    f = disc.compile("""func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {
      %0 = stablehlo.add %a, %a : tensor<?xf32>
      return %0 : tensor<?xf32>
    }""")
    np.testing.assert_array_equal(f([1, 2.5]), np.array([2, 5], np.float32))


def test_python_lists_are_arrays_for_jax_functions_too():
    """A JAX function's arguments are pytrees, whose lists would be lists of scalars: a nested
    list of numbers is an array there too, unless the function takes a list of scalars."""
    b, s = export.symbolic_shape("b, s")
    f = disc.compile(lambda x, a: x * a, jax.ShapeDtypeStruct((b, s), np.float32), jax.ShapeDtypeStruct((), np.float32))
    np.testing.assert_array_equal(f([[1, 2, 3], [4, 5, 6]], 2.0), np.array([[2, 4, 6], [8, 10, 12]], np.float32))
    np.testing.assert_array_equal(f([[1.5]], 2), np.array([[3]], np.float32))
    g = disc.compile(lambda xs: xs[0] - xs[1], [jax.ShapeDtypeStruct((), np.float32)] * 2)  # a list of two scalars
    assert g([3.0, 1.0]) == 2.0


def test_scalars_are_rank_0_arguments():
    """numpy scalars and Python numbers for a rank-0 argument (they are converted: they used to
    become arrays of one element, which the call refused)."""
    b = export.symbolic_shape("b")[0]
    f = disc.compile(lambda x, s: x * s, jax.ShapeDtypeStruct((b,), np.float32), jax.ShapeDtypeStruct((), np.float32))
    x = np.arange(3, dtype=np.float32)
    for s in (np.float32(0.5), 0.5, np.array(0.5, np.float32), np.float64(0.5)):
        np.testing.assert_array_equal(f(x, s), x * 0.5)
