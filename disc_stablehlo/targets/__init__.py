"""Code generation targets. Targets differ by data (`Target`), not by copies of the emission
path: the pipeline reads the widths it specialises loops for from the target and branches on
`Target.kind` where loops become CPU or GPU kernels, and `build.py` where the device code is
compiled. A GPU target's host code (shape arithmetic, allocations, launches) is x86 code for any
x86-64 processor (`host_code_target`): the GPU machine's processor is not this one."""

from __future__ import annotations

import dataclasses
import os
import re


@dataclasses.dataclass(frozen=True)
class Target:
    name: str          # what the user asked for, resolved: "x86", "cuda:sm_90", "rocm:gfx942"
    kind: str          # "cpu", "cuda" or "rocm"
    triple: str        # LLVM target triple of the code (the device's, for GPUs)
    cpu: str           # the processor (`llc -mcpu`): the host's CPU name, sm_XX or gfxNNN
    features: str      # LLVM target features
    vector_bits: int   # CPU: the vector width loops are specialised for; GPU: 0
    warp_size: int = 0     # GPU: threads that execute in lockstep (a warp, a wavefront)
    isa_version: int = 0   # CUDA: the PTX ISA version (80 = 8.0); ROCm: the code object version
    math_library: str = ""  # ROCm: the device library's math functions (ocml.bc) when one is found

    def vector_elements(self, element_bits: int = 32) -> int:
        """Elements of `element_bits` in one vector of the loops (1 where there are no vectors)."""
        return max(self.vector_bits // element_bits, 1)


def host_target() -> Target:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    features = llvm.get_host_cpu_features()
    vector_bits = 512 if features.get("avx512f") else 256 if features.get("avx2") else 128
    flat = features.flatten()
    if vector_bits == 512:
        # LLVM's tuning for AVX-512 cores keeps the loop vectoriser at 256 bits; 512 ran libmvec's
        # tanh twice as fast and GELU-tanh 2.3x, exp and softmax 1.3x, copies alike (6.3M f32)
        flat += ",-prefer-256-bit"
    return Target("x86", "cpu", llvm.get_process_triple(), llvm.get_host_cpu_name(), flat, vector_bits)


def host_code_target(target: Target) -> Target:
    """The target the host code is generated for: a CPU target itself; for a GPU target, a
    baseline x86-64 processor (only the shape arithmetic and the launches run there)."""
    if target.kind == "cpu":
        return target
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return Target("x86", "cpu", llvm.get_process_triple(), "x86-64-v2", "", 128)


# the GPUs a target name may choose: PTX 8.0 covers all of these (and CUDA 12 drivers and later,
# which the GPU machines have, run it); code object v5 loads on ROCm 6
_CUDA_ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
_ROCM_ARCHS = ("gfx90a", "gfx942")


def _cuda_target(arch: str) -> Target:
    return Target(f"cuda:{arch}", "cuda", "nvptx64-nvidia-cuda", arch, "+ptx80", 0, warp_size=32, isa_version=80)


def _rocm_target(arch: str) -> Target:
    return Target(f"rocm:{arch}", "rocm", "amdgcn-amd-amdhsa", arch, "", 0, warp_size=64, isa_version=5,
                  math_library=rocm_math_library())


def rocm_math_library() -> str:
    """ROCm's device math library (ocml.bc, LLVM bitcode): in $DISC_ROCM_DEVICE_LIBS, else in a
    ROCm installation ($ROCM_PATH, /opt/rocm); "" where there is none."""
    folders = [os.environ.get("DISC_ROCM_DEVICE_LIBS", "")]
    folders += [os.path.join(root, "amdgcn", "bitcode") for root in (os.environ.get("ROCM_PATH", ""), "/opt/rocm") if root]
    return next((path for path in (os.path.join(f, "ocml.bc") for f in folders if f) if os.path.isfile(path)), "")


TARGETS = {"x86": (host_target, None, ()), "cuda": (_cuda_target, "sm_90", _CUDA_ARCHS),
           "rocm": (_rocm_target, "gfx942", _ROCM_ARCHS)}


def get_target(name: str) -> Target:
    """The target a name describes: "x86" (the host), "cuda" or "cuda:<sm_XX>", "rocm" or
    "rocm:<gfxNNN>"."""
    from ..errors import CompileError

    kind, _, chip = name.partition(":")
    if kind not in TARGETS or not re.fullmatch(r"[a-z0-9_]*", chip):
        raise CompileError(f"unknown target '{name}'; known targets: x86, cuda[:<sm_XX>], rocm[:<gfxNNN>]")
    make, default, chips = TARGETS[kind]
    if default is None:
        if chip:
            raise CompileError(f"target '{name}': the x86 target is always the host's processor, it takes no ':<chip>'")
        return make()
    chip = chip or default
    if chip not in chips:
        raise CompileError(f"target '{name}': unknown {kind} chip '{chip}'; known: {', '.join(chips)}")
    return make(chip)
