"""Targets as data: what a target name resolves to, and the vector width the loops are
specialised for coming from the target. The GPU targets: tests/test_gpu.py."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from conftest import specs_for

import disc_stablehlo as disc
from disc_stablehlo import targets
from disc_stablehlo.errors import CompileError


def test_target_names_resolve_to_their_description():
    host = targets.get_target("x86")
    assert (host.kind, host.warp_size) == ("cpu", 0) and host.vector_bits in (128, 256, 512)
    assert host.vector_elements() == host.vector_bits // 32 and host.vector_elements(64) == host.vector_bits // 64
    cuda = targets.get_target("cuda")
    assert (cuda.name, cuda.triple, cuda.cpu, cuda.warp_size, cuda.vector_bits) == (
        "cuda:sm_90", "nvptx64-nvidia-cuda", "sm_90", 32, 0)
    assert targets.get_target("cuda:sm_80").cpu == "sm_80" and cuda.vector_elements() == 1
    rocm = targets.get_target("rocm:gfx90a")
    assert (rocm.kind, rocm.triple, rocm.cpu, rocm.warp_size) == ("rocm", "amdgcn-amd-amdhsa", "gfx90a", 64)
    assert targets.get_target("rocm").cpu == "gfx942"
    for name, message in [("tpu", "unknown target 'tpu'"), ("cuda:sm_12", "unknown cuda chip 'sm_12'"),
                          ("rocm:gfx1100", "unknown rocm chip"), ("x86:skylake", "takes no ':<chip>'"),
                          ("cuda:SM 90", "unknown target")]:
        with pytest.raises(CompileError, match=message):
            targets.get_target(name)


def test_vector_tails_follow_the_targets_vector_width(monkeypatch):
    """A host whose loops use 256-bit vectors (8 f32) runs a softmax's "no tail" version at row
    lengths that divide by 8 but not by 16."""
    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # the patched target applies in this process
    narrow = dataclasses.replace(targets.host_target(), vector_bits=256)
    monkeypatch.setitem(targets.TARGETS, "x86", (lambda: narrow, None, ()))

    def fn(x):
        return jax.nn.softmax(x, axis=-1)

    f = disc.compile(fn, *specs_for([(("b", "s"), np.float32)], "b, s"))
    assert "and i64" in f.llvm_ir and ", -8" in f.llvm_ir
    version = {k.version: k.name for k in f.kernels}
    for shape, ran in [((3, 24), "no tail"), ((2, 20), "tail")]:
        before = f.stats()
        x = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(f(x), fn(x), rtol=1e-5, atol=1e-7)
        after = f.stats()
        assert after[version[ran]]["calls"] - before[version[ran]]["calls"] == 1
