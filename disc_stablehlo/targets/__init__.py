"""Code generation targets. Targets differ by data (a capability table), not by copies of the
emission path: the host x86 target is the one implemented so far."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cpu: str
    features: str
    vector_bits: int


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
    return Target("x86", llvm.get_process_triple(), llvm.get_host_cpu_name(), flat, vector_bits)


TARGETS = {"x86": host_target}


def get_target(name: str) -> Target:
    if name not in TARGETS:
        from ..errors import CompileError

        raise CompileError(f"unknown target '{name}'; known targets: {', '.join(sorted(TARGETS))}")
    return TARGETS[name]()
