"""Weights as binary parameters: large constants never become IR text, and compile time does not
grow with the parameter count."""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

import disc_stablehlo as disc
from disc_stablehlo.passes.parameters import PARAM_MIN_BYTES


def test_a_million_element_constant_is_a_parameter():
    w = np.random.default_rng(0).standard_normal((1000, 1000)).astype(np.float32)
    b, = export.symbolic_shape("b")
    f = disc.compile(lambda x: jnp.tanh(x @ w), jax.ShapeDtypeStruct((b, 1000), jnp.float32))
    assert [p.shape for p in f._exe.params] == [(1000, 1000)]
    assert len(f.llvm_ir) < 200_000  # the weights are not in the code
    for n in (1, 7):
        x = np.random.default_rng(n).standard_normal((n, 1000)).astype(np.float32)
        np.testing.assert_allclose(f(x), np.tanh(x @ w), rtol=1e-4, atol=1e-5)


def test_small_constants_stay_in_the_ir():
    c = np.arange(8, dtype=np.float32)  # under PARAM_MIN_BYTES
    assert c.nbytes < PARAM_MIN_BYTES
    b, = export.symbolic_shape("b")
    f = disc.compile(lambda x: x * c, jax.ShapeDtypeStruct((b, 8), jnp.float32))
    assert f._exe.params == []
    x = np.ones((3, 8), np.float32)
    np.testing.assert_allclose(f(x), x * c)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mlp_compile_seconds(width: int) -> float:
    """CPU seconds the compilation takes, in this process (the export) and in the compiler worker
    (everything else: DISC_COMPILE_HELPER=0 keeps code generation there): unlike wall time, what
    other processes do to the machine (the other test workers) hardly moves it."""
    import torch
    from torch.export import Dim

    from disc_stablehlo import worker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                torch.nn.GELU(), torch.nn.Linear(width, 64))
    x = torch.randn(4, 64)
    pid = worker.worker().proc.pid
    start, start_worker = time.process_time(), _cpu_seconds(pid)
    f = disc.compile(model, (x,), dynamic_shapes={"input": {0: Dim("batch")}})
    seconds = time.process_time() - start + _cpu_seconds(pid) - start_worker
    for n in (1, 9):
        x = torch.randn(n, 64)
        with torch.no_grad():
            np.testing.assert_allclose(f(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-4)
    return seconds


def test_a_16x_wider_model_compiles_about_as_fast(monkeypatch):
    monkeypatch.setenv("DISC_COMPILE_HELPER", "0")
    monkeypatch.delenv("DISC_COMPILE_WORKER", raising=False)
    _mlp_compile_seconds(32)  # warms torch.export and the compiler up
    pairs = [(_mlp_compile_seconds(64), _mlp_compile_seconds(1024)) for _ in range(3)]  # interleaved
    narrow, wide = min(p[0] for p in pairs), min(p[1] for p in pairs)  # wide: 256x the weights of the middle layer
    assert wide <= 1.3 * narrow, pairs
