"""The C side of the artifact format: `disc_run` (ral_runtime/tools/disc_run.c) loads a saved
artifact and runs it on .npy cases in a process with no Python, and its results match jax.jit;
shape constraints, damaged files and wrong results are reported."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc
from conftest import own_gemm_kernel
from disc_stablehlo.runtime import openblas_library

ROOT = Path(__file__).resolve().parents[1]
W = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)


def _model(x, y):
    h = jnp.tanh(x @ W) * 2.0 + 1.0  # a GEMM (BLAS), then an elementwise chain
    return jax.nn.softmax(h, axis=-1) + y.sum(axis=0), jnp.max(h, axis=1)  # reductions


@pytest.fixture(scope="module")
def disc_run(tmp_path_factory) -> str:
    """The runner: $DISC_RUN, or built from ral_runtime/ into a temporary directory."""
    if os.environ.get("DISC_RUN"):
        return os.environ["DISC_RUN"]
    if shutil.which("cmake") is None:
        pytest.skip("cmake is needed to build disc_run")
    build = tmp_path_factory.mktemp("ral-build")
    for cmd in (["cmake", "-S", ROOT / "ral_runtime", "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", build, "-j2", "--target", "disc_run"]):
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
    return str(build / "disc_run")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    b, s = export.symbolic_shape("b, s", constraints=["s >= 2"])
    f = disc.compile(_model, jax.ShapeDtypeStruct((b, 32), jnp.float32), jax.ShapeDtypeStruct((s, 16), jnp.float32))
    path = tmp_path_factory.mktemp("artifact") / "model.disc"
    f.save(path)
    return path


def _case(root: Path, b: int, s: int) -> str:
    """A case directory: the inputs at (b, s) and what jax.jit computes from them."""
    d = root / f"case_b{b}_s{s}"
    d.mkdir()
    rng = np.random.default_rng(b * 100 + s)
    inputs = [rng.standard_normal((b, 32)).astype(np.float32), rng.standard_normal((s, 16)).astype(np.float32)]
    for i, x in enumerate(inputs):
        np.save(d / f"input{i}.npy", x)
    for i, r in enumerate(jax.jit(_model)(*inputs)):
        np.save(d / f"expected{i}.npy", np.asarray(r))
    return str(d)


def _run(disc_run: str, artifact: Path, *cases: str, blas: bool = True, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DISC_BLAS", "DISC_GEMM")} | env_vars
    cmd = [disc_run, str(artifact), *(["--blas", openblas_library()] if blas else []), *cases]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_disc_run_matches_jax_at_every_shape(disc_run, saved, tmp_path):
    cases = [_case(tmp_path, b, s) for b, s in [(1, 2), (5, 3), (17, 9)]]
    p = _run(disc_run, saved, *cases)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("PASS") == 3 and "3 of 3 cases passed" in p.stdout
    assert "f32[17, 16], f32[17]" in p.stdout


def test_without_a_blas_the_gemm_runs_on_the_runtimes_kernel_or_fails_clearly(disc_run, saved, tmp_path):
    """Single precision runs on the RAL's own kernel where the CPU has one, BLAS or not; DISC_GEMM=blas gives it to the BLAS, and without one the call fails with the
    GEMM's name; another DISC_GEMM value is refused when the runtime starts."""
    case = _case(tmp_path, 4, 2)
    p = _run(disc_run, saved, case, blas=False)
    if own_gemm_kernel():
        assert p.returncode == 0 and "1 of 1 cases passed" in p.stdout, p.stdout + p.stderr
    else:
        assert p.returncode == 1 and "disc_ral_gemm_f32: no BLAS loaded" in p.stdout, p.stdout + p.stderr
    p = _run(disc_run, saved, case, blas=False, DISC_GEMM="blas")
    assert p.returncode == 1 and "disc_ral_gemm_f32: no BLAS loaded" in p.stdout, p.stdout + p.stderr
    p = _run(disc_run, saved, case, DISC_GEMM="mkl")  # a value the runtime does not know
    assert p.returncode == 2 and "DISC_GEMM is 'mkl'" in p.stderr, p.stdout + p.stderr


def test_a_violated_constraint_fails_with_its_message(disc_run, saved, tmp_path):
    good, bad = _case(tmp_path, 3, 4), _case(tmp_path, 3, 1)
    p = _run(disc_run, saved, good, bad)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"PASS {good}" in p.stdout
    line = next(ln for ln in p.stdout.splitlines() if bad in ln)
    assert line.startswith("ERROR") and "constraint s >= 2" in line and "found -1" in line, line


def test_a_wrong_expected_value_is_a_mismatch(disc_run, saved, tmp_path):
    case = _case(tmp_path, 2, 3)
    expected = np.load(os.path.join(case, "expected1.npy"))
    expected[1] += 1e-3
    np.save(os.path.join(case, "expected1.npy"), expected)
    p = _run(disc_run, saved, case)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL" in p.stdout and "output 1 ('result1'): 1 of 2 elements differ" in p.stdout and "first at [1]" in p.stdout


def test_a_corrupted_artifact_is_rejected(disc_run, saved, tmp_path):
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0x40
    damaged = tmp_path / "damaged.disc"
    damaged.write_bytes(bytes(data))
    p = _run(disc_run, damaged, _case(tmp_path, 2, 2))
    assert p.returncode == 2 and "corrupted" in p.stderr and str(damaged) in p.stderr, p.stdout + p.stderr


def _typed(x, m, i, d):
    return x * 2 + 1, jnp.where(m, i, -i), m & (i > 0), jnp.sum(d * d), jnp.cumsum(i.astype(jnp.int64))


def test_element_types_and_npy_versions(disc_run, tmp_path):
    b, = export.symbolic_shape("b")
    specs = [jax.ShapeDtypeStruct((b,), t) for t in (jnp.float16, jnp.bool_, jnp.int32, jnp.float64)]
    path = tmp_path / "typed.disc"
    disc.compile(_typed, *specs).save(path)
    rng = np.random.default_rng(0)
    cases = []
    for n, version in [(5, (1, 0)), (1, (2, 0)), (8, (3, 0))]:
        d = tmp_path / f"typed_{n}"
        d.mkdir()
        inputs = [rng.standard_normal(n).astype(np.float16), rng.random(n) < 0.5,
                  rng.integers(-9, 9, n).astype(np.int32), rng.standard_normal(n)]
        for k, a in enumerate(inputs + [np.asarray(r) for r in jax.jit(_typed)(*inputs)]):
            name = f"input{k}.npy" if k < len(inputs) else f"expected{k - len(inputs)}.npy"
            with open(d / name, "wb") as f:
                np.lib.format.write_array(f, a, version=version)
        cases.append(str(d))
    p = _run(disc_run, path, *cases)
    assert p.returncode == 0 and p.stdout.count("PASS") == 3, p.stdout + p.stderr
    assert "f16[5], i32[5], i1[5], f64[], i64[5]" in p.stdout
    # a Fortran-ordered array is refused, not misread
    with open(os.path.join(cases[0], "input3.npy"), "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": True, "shape": (5,)})
        f.write(np.zeros(5).tobytes())
    p = _run(disc_run, path, cases[0])
    assert p.returncode == 1 and "fortran_order is True" in p.stdout, p.stdout + p.stderr
