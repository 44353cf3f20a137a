"""The pass pipeline: every named piece parses (a wrongly nested pass aborts the process, so this
runs in a subprocess), and failures produce actionable errors and reproducers."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import disc_stablehlo as disc


def test_every_pipeline_piece_parses():
    names = ["FLATTEN", "SHAPE_TO_STD", "LEGALIZE_CHLO", "SIMPLIFY", "TO_LINALG", "BUFFERIZE", "FREE_AFTER_LAST_USE", "TO_LOOPS", "TO_LLVM"]
    code = ("import disc_stablehlo.mlir_support as m\nfrom disc_stablehlo.passes import pipeline as p\n"
            "from torch_mlir import passmanager\nwith m.new_context():\n"
            + "".join(f"    passmanager.PassManager.parse('builtin.module(' + p.{n} + ')')\n" for n in names))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_failing_pipeline_saves_a_reproducer(tmp_path, monkeypatch):
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context, run_pipeline

    monkeypatch.setenv("DISC_SAVE_TEMPS", str(tmp_path))
    with new_context():
        module = ir.Module.parse("func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }")
        with pytest.raises(disc.CompileError, match="(?s)reproducer: .*replay: mlir-opt --pass-pipeline=") as err:
            run_pipeline(module, "builtin.module(no-such-pass)", "bogus stage")
    path = str(err.value).split("reproducer: ")[1].split("\n")[0]
    assert os.path.exists(path) and "func.func @main" in open(path).read()


def test_save_temps_keeps_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("DISC_SAVE_TEMPS", str(tmp_path))
    f = disc.compile("func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> { %0 = stablehlo.abs %x : tensor<?xf32>  return %0 : tensor<?xf32> }")
    np.testing.assert_array_equal(f(np.array([-1.0, 2.0], np.float32)), [1.0, 2.0])
    saved = sorted(os.listdir(tmp_path))
    assert any(n.startswith("after_bufferization") for n in saved)
    assert any(n.startswith("after_lowering_to_LLVM") for n in saved)


def test_generated_code_calls_the_runtime():
    """GEMMs go to the BLAS and loops to the thread pool through the RAL, not inline loops."""
    f = disc.compile("""func.func @main(%a: tensor<?x64xf32>, %b: tensor<64x32xf32>) -> tensor<?x32xf32> {
      %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<?x64xf32>, tensor<64x32xf32>) -> tensor<?x32xf32>
      %1 = stablehlo.tanh %0 : tensor<?x32xf32>
      return %1 : tensor<?x32xf32>
    }""")
    assert "call void @disc_ral_gemm_f32" in f.llvm_ir
    assert "call void @disc_ral_parallel_for" in f.llvm_ir
    a = np.random.default_rng(0).standard_normal((700, 64)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    np.testing.assert_allclose(f(a, b), np.tanh(a @ b), rtol=1e-4, atol=1e-5)


def test_kernels_describe_what_they_compute():
    import jax
    import jax.numpy as jnp
    from jax import export

    b, s = export.symbolic_shape("b, s")
    f = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), jax.ShapeDtypeStruct((b, s, 8), jnp.float32))
    [kernel] = f.kernels  # max, exp, sum and divide over each row: one stitch kernel
    assert kernel.kind == "stitch fusion" and kernel.parallel_dims == 1  # (b, s) collapsed into one
    assert {"arith.maximumf", "math.exp", "arith.addf", "arith.divf"} <= set(kernel.ops)
    assert str(kernel).startswith("__disc_par_")
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(f(x), jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-6)


def test_vector_math_maps_to_libmvec_within_the_target_width():
    from disc_stablehlo.targets.x86 import _libmvec, _vector_math_calls

    if _libmvec() is None:
        pytest.skip("this system's C library has no libmvec")
    call = "call <16 x float> @llvm.exp.v16f32(<16 x float> %x)"
    assert _vector_math_calls(call, 512) == ("call <16 x float> @_ZGVeN16v_expf(<16 x float> %x)", True)
    assert _vector_math_calls(call, 256) == (call, False)  # no AVX-512: stays an intrinsic
    atan2 = "call <8 x float> @llvm.atan2.v8f32(<8 x float> %x, <8 x float> %y)"
    assert _vector_math_calls(atan2, 512) == (atan2, False)  # too inaccurate in libmvec


def test_stats_count_kernel_versions_and_library_calls():
    """Per kernel: calls, which version ran (thread pool or inline, chosen from the real sizes)
    and time; GEMM calls are counted too."""
    import jax
    import jax.numpy as jnp
    from jax import export

    n, = export.symbolic_shape("n")
    f = disc.compile(lambda x, w: jnp.tanh(x @ w), jax.ShapeDtypeStruct((n, 64), jnp.float32),
                     jax.ShapeDtypeStruct((64, 64), jnp.float32))
    [kernel] = f.kernels
    w = np.ones((64, 64), np.float32)
    before = f.stats()
    f(np.ones((2, 64), np.float32), w)      # 128 elements: inline
    f(np.ones((4096, 64), np.float32), w)   # 262144 elements: on the pool
    after = f.stats()
    delta = {k: after[kernel.name][k] - before[kernel.name][k] for k in ("calls", "pool", "inline")}
    assert delta == {"calls": 2, "pool": 1, "inline": 1}
    assert after[kernel.name]["seconds"] > before[kernel.name]["seconds"]
    assert after["disc_ral_gemm_f32"]["calls"] - before["disc_ral_gemm_f32"]["calls"] == 2
