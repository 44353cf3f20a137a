"""Compilation outside the caller's process: the compiler worker, its crashes, and a caller
process without MLIR or LLVM."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import disc_stablehlo as disc
from disc_stablehlo import worker

TANH = """func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %0 = stablehlo.tanh %x : tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}"""

def test_an_abort_in_the_compiler_is_a_compile_error_and_the_caller_lives_on(monkeypatch):
    """The worker aborts at a stage (DISC_FAULT_STAGE injects what an LLVM fatal error does): the
    caller gets a CompileError naming the signal and the stage, with the worker's last words and
    a reproducer, and a new worker takes the next compilation."""
    monkeypatch.setenv("DISC_FAULT_STAGE", "StableHLO to linalg")
    with pytest.raises(disc.CompileError, match=r"(?s)the compiler crashed \(killed by signal SIGABRT\) during StableHLO to linalg.*"
                                                r"reproducer: (\S+module\.mlir)") as info:
        disc.compile(TANH)
    assert "DISC_FAULT_STAGE: aborting at StableHLO to linalg" in str(info.value)
    reproducer = str(info.value).split("reproducer: ")[1].split()[0]
    assert "stablehlo.tanh" in open(reproducer).read()
    monkeypatch.delenv("DISC_FAULT_STAGE")
    f = disc.compile(TANH)
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_allclose(f(x), np.tanh(x), rtol=1e-6)


def test_the_worker_is_kept_for_later_compilations():
    disc.compile(TANH)
    first = worker.worker().proc.pid
    disc.compile(TANH.replace("tanh", "exponential"))
    assert worker.worker().proc.pid == first


def test_compile_seconds_cover_every_stage_and_add_up(tmp_path, monkeypatch, capfd):
    """`compile_seconds`: the frontend's export, the wait for the worker, the worker's stages
    (MLIR pipelines, verification, our passes, LLVM, link), the caller's loading; they add up to
    the total (less the messages' transfer), `DISC_LOG=compile` prints them, and a function
    loaded from a file or the cache was not compiled here: none."""
    import jax
    import jax.numpy as jnp
    from jax import export

    monkeypatch.setenv("DISC_LOG", "compile")
    n = export.symbolic_shape("n")[0]
    f = disc.compile(lambda x: jnp.tanh(x) * 2, jax.ShapeDtypeStruct((n, 8), jnp.float32))
    seconds = f.compile_seconds
    for stage in ("export", "waiting for the compiler worker", "importing the module", "MLIR pass pipelines", "IR verification",
                  "our passes, shape analysis, LLVM IR translation", "LLVM code generation", "linking", "loading", "total"):
        assert seconds[stage] >= 0, stage
    assert seconds["MLIR pass pipelines"] > 0 and seconds["LLVM code generation"] > 0
    parts = sum(v for k, v in seconds.items() if k != "total")
    # the wait ends when this process reads the worker's first report, which the worker's first
    # stage may overlap by the message's delivery (under load, a fraction of a millisecond)
    assert parts <= seconds["total"] + 0.005 and parts > 0.8 * seconds["total"], seconds
    assert "compile time:" in capfd.readouterr().err
    f.save(tmp_path / "f.disc")
    assert disc.load(tmp_path / "f.disc").compile_seconds == {}
    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path / "cache"))
    disc.compile(TANH)
    assert disc.compile(TANH).compile_seconds == {}


def test_the_worker_loads_the_importers_modules_before_the_request(capfd):
    """`prepare` has the worker import modules (the torch importer's) while the caller exports;
    one that fails to import changes nothing. (`this` prints when imported: the worker's output
    reaches the caller's stderr with the next request.)"""
    worker.prepare(("no_such_module_for_disc", "this"))
    f = disc.compile(TANH)
    assert "Beautiful is better than ugly" in capfd.readouterr().err
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(f(x), np.tanh(x), rtol=1e-6)



def test_native_writes_to_standard_output_do_not_corrupt_the_workers_replies(tmp_path, monkeypatch):
    """What the compiler's native code writes to descriptor 1 (MLIR and LLVM print there) goes to
    stderr: the replies travel on a descriptor of their own, which nothing else writes."""
    (tmp_path / "disc_noisy_native_output.py").write_text("import os\nos.write(1, b'native output' * 64)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(worker, "_worker", None)  # a fresh worker, which sees the module's folder
    worker.prepare(("disc_noisy_native_output",))
    f = disc.compile(TANH)
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(f(x), np.tanh(x), rtol=1e-6)

def test_errors_in_the_worker_keep_their_class_and_message():
    with pytest.raises(disc.UnsupportedOpError, match="stablehlo.custom_call"):
        disc.compile("""func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
          %0 = stablehlo.custom_call @my_vendor_kernel(%x) : (tensor<8xf32>) -> tensor<8xf32>
          return %0 : tensor<8xf32>
        }""")


CALLER = """\
import sys
import numpy as np
import jax, jax.numpy as jnp
from jax import export
import disc_stablehlo as disc
b, = export.symbolic_shape("b")
f = disc.compile(lambda x: jnp.tanh(x) @ jnp.ones((8, 4), jnp.float32), jax.ShapeDtypeStruct((b, 8), jnp.float32))
x = np.ones((3, 8), np.float32)
np.testing.assert_allclose(f(x), np.tanh(x) @ np.ones((8, 4), np.float32), rtol=1e-5)
import torch
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
g = disc.compile(m, (torch.randn(2, 8),), dynamic_shapes=({0: torch.export.Dim("b")},))
d = torch.compile(m, backend="disc_stablehlo", dynamic=True)
with torch.no_grad():
    for n in (3, 5):
        t = torch.randn(n, 8)
        torch.testing.assert_close(g(t), m(t), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(d(t), m(t), rtol=1e-5, atol=1e-5)
# torch-mlir's decomposition table (pure Python) is used in the caller; its native MLIR is not
loaded = sorted(m for m in sys.modules if m.startswith(("torch_mlir._mlir_libs", "torch_mlir.ir", "llvmlite")))
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "torch_mlir/_mlir_libs" in line or "llvmlite" in line})  # jax brings its own
print("loaded:", loaded + mapped)
"""


def test_the_callers_process_loads_neither_mlir_nor_llvm():
    out = subprocess.run([sys.executable, "-c", CALLER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "loaded: []"


def test_compile_and_call_in_a_process_that_imported_triton_first():
    pytest.importorskip("triton", reason="triton comes with CUDA builds of torch only")
    code = "import triton, torch\n" + CALLER
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


COMPILING = """
import sys
import jax, jax.numpy as jnp
import disc_stablehlo as disc
from jax import export
(n,) = export.symbolic_shape("n")
f = disc.compile(lambda x: jax.nn.softmax(x @ x.T), jax.ShapeDtypeStruct((n, 8), jnp.float32))
print("generated:", sorted(m for m in sys.modules if m.startswith("torch_mlir.dialects.")))
"""


def test_compiling_loads_none_of_torch_mlirs_generated_op_classes():
    """A compilation (here in the calling process: DISC_COMPILE_WORKER=0) reads ops through the
    generic API: torch-mlir's op-class modules (0.35 s of a worker's start) stay unloaded."""
    env = {**os.environ, "DISC_COMPILE_WORKER": "0"}
    out = subprocess.run([sys.executable, "-c", COMPILING], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "generated: []"
