#!/usr/bin/env python3
"""Set-up and entry points on a fresh machine with only python3.

    python3 dev.py demo     # compile an encoder layer once, run it at many shapes
    python3 dev.py test     # the RAL's C tests, then the Python test suite
    python3 dev.py bench    # benchmarks/: the trace against every peer, fusion microbenchmarks, peak memory

The first call makes .venv and installs the package (building ral_runtime) with its pinned
dependencies; later calls reuse it and reinstall only when pyproject.toml or ral_runtime change."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def run(*cmd: str | Path, **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def install_stamp(extras: str) -> str:
    h = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode())
    for p in sorted((ROOT / "ral_runtime").rglob("*")):
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def ensure_env(extras: str) -> None:
    stamp_file = VENV / ".disc-stamp"
    if not PY.exists():
        run(sys.executable, "-m", "venv", VENV)
    stamp = install_stamp(extras)
    if not stamp_file.exists() or stamp_file.read_text() != stamp:
        run(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
        run(PY, "-m", "pip", "install", "-q", "-e", f"{ROOT}[{extras}]")
        stamp_file.write_text(stamp)


def c_tests() -> None:
    """The RAL's own tests (runtime, artifact reader, GPU device), built twice: under
    AddressSanitizer + UBSan, and ThreadSanitizer."""
    blas = subprocess.run([str(PY), "-c", "from disc_stablehlo.runtime import openblas_library; print(openblas_library())"],
                          check=True, capture_output=True, text=True).stdout.strip()
    for name, flags in [("asan", "-fsanitize=address,undefined"), ("tsan", "-fsanitize=thread")]:
        build = ROOT / "build" / f"ral-{name}"
        run("cmake", "-S", ROOT / "ral_runtime", "-B", build, "-DCMAKE_BUILD_TYPE=Debug", "-DDISC_WERROR=ON", f"-DCMAKE_C_FLAGS={flags} -fno-omit-frame-pointer")
        run("cmake", "--build", build, "-j2")
        run(build / "test_ral", blas)
        run(build / "test_ral", blas, env=dict(os.environ, DISC_GEMM="blas"))  # single precision on the BLAS too
        run(build / "test_ral")  # no BLAS: single precision on the RAL's kernel where the CPU has one, double reports UNAVAILABLE
        run(build / "test_artifact")  # SHA-256, the header's JSON reader, loading and calling artifacts
        run(build / "test_gpu")  # the GPU device through fake_cuda (CUDA's driver and cuBLAS on host memory)
        run(build / "test_gpu_hip")  # the same through fake_hip (ROCm's HIP runtime and hipBLAS on host memory)


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else "help"
    if cmd not in ("demo", "test", "bench"):
        print(__doc__)
        return 0 if cmd == "help" else 2
    ensure_env("test,bench" if cmd == "bench" else "test")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if cmd in ("demo", "bench"):
        # the package's bytecode, as a wheel's installation writes it (this editable install with
        # PYTHONDONTWRITEBYTECODE would compile each changed module again in every compiler
        # worker: 60 ms of its start-up)
        run(PY, "-m", "compileall", "-q", ROOT / "disc_stablehlo")
    if cmd == "demo":
        run(PY, ROOT / "benchmarks" / "demo.py", env=env)
    elif cmd == "test":
        run(PY, "-m", "ruff", "check", "disc_stablehlo", "tests", "benchmarks", "dev.py", cwd=ROOT)
        c_tests()
        # ROCm's device math library for the ROCm kernels the tests compile (no ROCm on this machine)
        libs = ROOT / "build" / "rocm-device-libs"
        run(PY, "-c", f"from disc_stablehlo.targets import rocm; rocm.fetch_device_library({str(libs)!r})")
        env["DISC_ROCM_DEVICE_LIBS"] = str(libs)
        # tests/tensorflow (they import TensorFlow) run as a session of their own: TensorFlow and
        # triton (in CUDA builds of torch) crash in one process. Arguments: one session with them.
        sessions = [sys.argv[2:]] if sys.argv[2:] else [["--ignore", "tests/tensorflow"], ["tests/tensorflow"]]
        for args in sessions:
            run(PY, "-m", "pytest", "-q", "-n", "2", *args, cwd=ROOT, env=env)
    else:
        run(PY, ROOT / "benchmarks" / "encoder_trace.py", *sys.argv[2:], env=env)
        run(PY, ROOT / "benchmarks" / "fusion_micro.py", env=env)
        run(PY, ROOT / "benchmarks" / "encoder_memory.py", env=env)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as e:
        sys.exit(e.returncode or 1)
