"""The `disc-stablehlo` command line: compile, inspect, run and bench round trips."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

MODULE = """func.func @main(%x: tensor<?x8xf32>, %y: tensor<8xf32>) -> tensor<?x8xf32> {
  %b = stablehlo.broadcast_in_dim %y, dims = [1] : (tensor<8xf32>) -> tensor<8x8xf32>
  %0 = stablehlo.dot_general %x, %b, contracting_dims = [1] x [0] : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  %1 = stablehlo.tanh %0 : tensor<?x8xf32>
  return %1 : tensor<?x8xf32>
}"""

JAX_MODEL = """
import jax.numpy as jnp

def model(x, w):
    return jnp.maximum(x @ w, 0.0).sum(axis=-1)
"""


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disc_stablehlo.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_compile_inspect_run_bench_a_stablehlo_file(tmp_path):
    (tmp_path / "model.mlir").write_text(MODULE)
    out = _cli("compile", str(tmp_path / "model.mlir"), "-o", str(tmp_path / "model.disc"), "--constraint", "arg0.0 >= 2")
    assert out.returncode == 0, out.stderr
    assert "StableHLO to linalg" in out.stderr and "LLVM code generation" in out.stderr  # stage timings
    info = _cli("inspect", str(tmp_path / "model.disc"))
    assert info.returncode == 0, info.stderr
    assert "arg0: float32[arg0.0, 8]" in info.stdout and "disc_ral_gemm_f32" in info.stdout and "arg0.0 >= 2" in info.stdout
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    y = np.linspace(-1, 1, 8, dtype=np.float32)
    np.savez(tmp_path / "in.npz", x=x, y=y)
    run = _cli("run", str(tmp_path / "model.disc"), str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"))
    assert run.returncode == 0, run.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["result0"], np.tanh(x @ np.broadcast_to(y, (8, 8))), rtol=1e-5)
    bench = _cli("bench", str(tmp_path / "model.disc"), "--dims", "arg0.0=4", "--dims", "arg0.0=1", "--repeat", "3")
    assert bench.returncode == 0, bench.stderr
    lines = bench.stdout.strip().splitlines()
    assert "arg0.0=4" in lines[1] and "ShapeError" in lines[2]  # 1 breaks the constraint: reported, not run


def test_compile_a_jax_function_by_name(tmp_path):
    (tmp_path / "mymodel.py").write_text(JAX_MODEL)
    out = _cli("compile", "mymodel:model", "--arg", "b,16:f32", "--arg", "16,4:f32", "-o", "m.disc", "-q", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    x, w = np.ones((3, 16), np.float32), np.full((16, 4), 0.5, np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    run = _cli("run", "m.disc", "x.npy", "w.npy", "-o", "o.npz", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["result0"], np.maximum(x @ w, 0).sum(-1))


def test_errors_are_one_line_and_a_failing_status(tmp_path):
    (tmp_path / "bad.disc").write_bytes(b"not an artifact at all, just bytes" * 4)
    out = _cli("inspect", str(tmp_path / "bad.disc"))
    assert out.returncode == 1 and "ArtifactError" in out.stderr and "wrong magic" in out.stderr


def test_help_has_examples():
    out = _cli("--help")
    assert out.returncode == 0 and "examples:" in out.stdout and "disc-stablehlo compile" in out.stdout
