"""Targets as data: what a target name resolves to. The GPU targets: tests/test_gpu.py."""

from __future__ import annotations

import pytest

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


