"""Weights as binary parameters: large constants never become IR text, and what the compiler
works on does not grow with the parameter count."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import export

import disc_stablehlo as disc
from disc_stablehlo.artifact import PARAM_MIN_BYTES


def test_a_million_element_constant_is_a_parameter():
    w = np.random.default_rng(0).standard_normal((1000, 1000)).astype(np.float32)
    b, = export.symbolic_shape("b")
    f = disc.compile(lambda x: jnp.tanh(x @ w), jax.ShapeDtypeStruct((b, 1000), jnp.float32))
    assert [p.shape for p in f._exe.params] == [(1000, 1000)]
    assert len(f.llvm_ir) < 200_000  # the weights are not in the code
    for n in (1, 7):
        x = np.random.default_rng(n).standard_normal((n, 1000)).astype(np.float32)
        # sums of 1000 products of size ~1: float32 rounding of a few 1e-5, whatever the BLAS's order
        np.testing.assert_allclose(f(x), np.tanh(x @ w), rtol=1e-4, atol=1e-4)


def test_small_constants_stay_in_the_ir():
    c = np.arange(8, dtype=np.float32)  # under PARAM_MIN_BYTES
    assert c.nbytes < PARAM_MIN_BYTES
    b, = export.symbolic_shape("b")
    f = disc.compile(lambda x: x * c, jax.ShapeDtypeStruct((b, 8), jnp.float32))
    assert f._exe.params == []
    x = np.ones((3, 8), np.float32)
    np.testing.assert_allclose(f(x), x * c)


def test_complex_constants_stay_in_the_ir():
    """The bindings cannot hand over complex elements (they fail even casting the attribute): such
    constants, small or large, stay IR text."""
    small = (np.arange(8) * (1 + 2j)).astype(np.complex64)
    large = (np.arange(200) * (1 - 1j)).astype(np.complex64)
    assert small.nbytes < PARAM_MIN_BYTES <= large.nbytes
    b, = export.symbolic_shape("b")
    f = disc.compile(lambda x, y: (x * small, y + large), jax.ShapeDtypeStruct((b, 8), jnp.complex64),
                     jax.ShapeDtypeStruct((b, 200), jnp.complex64))
    assert f._exe.params == []
    x, y = np.ones((3, 8), np.complex64), np.ones((3, 200), np.complex64)
    got = f(x, y)
    np.testing.assert_allclose(got[0], x * small)
    np.testing.assert_allclose(got[1], y + large)


def _mlp(width: int):
    """A compiled three-layer MLP (dynamic batch) whose middle layer is width x width, checked
    against eager at two batch sizes: with 256 or more, every weight and bias is a parameter."""
    from torch.export import Dim

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                torch.nn.GELU(), torch.nn.Linear(width, 256))
    f = disc.compile(model, (torch.randn(4, 256),), dynamic_shapes={"input": {0: Dim("batch")}})
    for n in (1, 9):
        x = torch.randn(n, 256)
        with torch.no_grad():
            np.testing.assert_allclose(f(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-4)
    assert sorted(p.shape for p in f._exe.params) == sorted(tuple(p.shape) for p in model.parameters())
    return f


def test_a_16x_wider_model_gives_the_compiler_the_same_work():
    """What the compiler sees does not grow with the parameters: a model with 256x the weights in
    its middle layer gives the same kernels and code of about the same size (the shapes differ, and
    so do the buffers the host code reuses: 9 % more text; 64 MB of weights as text would be
    hundreds of MB). (Compile time itself is measured in benchmarks/, not in a timed test.)"""
    narrow, wide = _mlp(256), _mlp(4096)
    assert len(wide.llvm_ir) < 1.25 * len(narrow.llvm_ir)
    assert [(k.kind, k.ops) for k in wide._exe.artifact.kernels] == [(k.kind, k.ops) for k in narrow._exe.artifact.kernels]


class _Tied(torch.nn.Module):
    """Two layers that share one weight matrix (as language models tie their embedding and output
    layers), a buffer and a small bias."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.first = torch.nn.Linear(256, 256)
        self.second = torch.nn.Linear(256, 256)
        self.second.weight = self.first.weight
        self.register_buffer("scale", torch.rand(64, 256) + 0.5)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x))) * self.scale[: x.shape[0]]


def _check(f, model, sizes=(1, 5)):
    for n in sizes:
        x = torch.randn(n, 256)
        with torch.no_grad():
            np.testing.assert_allclose(f(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_torch_weights_stay_with_the_caller(tmp_path):
    """The program handed to the compiler holds stand-ins, not weights: the caller keeps each
    distinct tensor (tied weights share one parameter), copied once into the function's
    parameters, and writes them into the artifact only when it is saved: the saved file has the
    weights of compile time, checksummed."""
    import copy
    import importlib
    import pickle

    from torch.export import Dim

    model = _Tied(0).eval()
    x = torch.randn(3, 256)
    spec = {"x": {0: Dim("b", max=64)}}
    source, _ = importlib.import_module("disc_stablehlo.import").export(model, (x,), dynamic_shapes=spec)
    try:
        # the two biases, the buffer, the tied matrix once
        assert sorted(w.nbytes for w in source.weights) == [256 * 4, 256 * 4, 64 * 256 * 4, 256 * 256 * 4]
        assert os.path.getsize(source.payload) < 100_000  # the saved program: 2 * 256 kB of weights left out
        assert len(pickle.dumps(source)) < 10_000         # what the worker is sent
    finally:
        os.unlink(source.payload)
    f = disc.compile(model, (x,), dynamic_shapes=spec)
    assert sorted(p.nbytes for p in f._exe.params) == [256 * 4, 256 * 4, 64 * 256 * 4, 256 * 256 * 4]
    # not written to the compiler's file: kept as the parameters' own copies, for `save`
    pending = f._exe.artifact.pending
    assert len(pending) == 4 and all(any(a is p for p in f._exe.params) for a in pending.values())
    _check(f, model)
    original = copy.deepcopy(model)
    with torch.no_grad():
        model.first.weight.mul_(2)  # the function holds a copy: later changes to the model do not reach it
    with pytest.raises(AssertionError):
        _check(f, model)
    _check(f, original)
    f.save(tmp_path / "tied.disc")
    _check(disc.load(tmp_path / "tied.disc"), original)  # load verifies the checksum


def test_torch_compile_cache_keys_on_the_weights(tmp_path, monkeypatch):
    """Two models of one structure with different weights are two cache entries; the same model
    again is found."""
    from torch.export import Dim

    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    spec = {"x": {0: Dim("b", max=64)}}
    x = torch.randn(3, 256)
    a, b = _Tied(1).eval(), _Tied(2).eval()
    fa, fa_again, fb = (disc.compile(m, (x,), dynamic_shapes=spec) for m in (a, a, b))
    assert (fa.compile_count, fa_again.compile_count, fb.compile_count) == (1, 0, 1)
    _check(fa_again, a)
    _check(fb, b)
    entries = os.listdir(tmp_path)
    artifacts = {e for e in entries if e.endswith(".disc")}
    assert len(artifacts) == 2 and all(e.endswith((".disc", ".source")) for e in entries)  # no partial file left
    assert {(tmp_path / e).read_text() for e in entries if e.endswith(".source")} == artifacts
