"""x86 back end: LLVM IR -> optimised object (llvmlite, host CPU) -> shared object linked
against the RAL."""

from __future__ import annotations

import ctypes
import functools
import os
import re
import struct
import subprocess

import llvmlite.binding as llvm

from ..errors import CompileError
from . import Target


# MLIR's LLVM (newer than llvmlite's) prints some float constants in forms llvmlite's parser
# rejects: words (`-inf`, `+qnan`), raw bits (`f0x3727C5AC`), and shortest decimals that are not
# exact doubles (`2.326820e-02` for a float). Each is rewritten to the classic hexadecimal form
# of its type, found as the nearest type word before it on the line (`phi float [ -inf, ...]`).
_LITERAL_RE = re.compile(r"(?<![\w.%@])(?:f0x([0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}|[0-9A-Fa-f]{16})|([+-]?(?:inf|q?nan))|([+-]?\d+\.\d+(?:e[+-]?\d+)?))(?![\w.])")
_TYPE_RE = re.compile(r"\b(half|bfloat|float|double)\b")


def _hex_literal(value: float, type_name: str) -> str:
    if type_name == "half":
        return f"0xH{struct.unpack('<H', struct.pack('<e', value))[0]:04X}"
    if type_name == "bfloat":
        return f"0xR{struct.unpack('<I', struct.pack('<f', value))[0] >> 16:04X}"
    if type_name == "float":  # written as the double it widens to
        value = struct.unpack("<f", struct.pack("<f", value))[0]
    return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"


def _classic_float_literals(llvm_ir: str) -> str:
    def sub(m: re.Match) -> str:
        before = llvm_ir[llvm_ir.rfind("\n", 0, m.start()) + 1:m.start()].lstrip()  # the line up to the literal
        if before.startswith((";", "!", "source_filename", "target")):
            return m.group(0)
        types = _TYPE_RE.findall(before)
        if m.group(1):  # raw bits: 4 hex digits half or bfloat, 8 float, 16 double
            bits = m.group(1)
            if len(bits) == 4:
                return ("0xR" if types and types[-1] == "bfloat" else "0xH") + bits.upper()
            if len(bits) == 16:
                return "0x" + bits.upper()
            return _hex_literal(struct.unpack("<f", struct.pack("<I", int(bits, 16)))[0], "double")
        if not types:
            return m.group(0)
        word = m.group(2) or m.group(3)
        value = float(word.replace("q", "")) if m.group(2) else float(word)
        if m.group(3) and types[-1] == "double":
            return word
        return _hex_literal(value, types[-1])
    return _LITERAL_RE.sub(sub, llvm_ir)


# Vectorised loops keep math as vector intrinsics (llvm.exp.v16f32), which code generation would
# split into one libm call per lane. glibc's libmvec has vector versions of these functions
# (x86 vector-function ABI: _ZGV<isa>N<lanes>v_<name>, isa b=SSE, d=AVX2, e=AVX-512).
# (not atan2: libmvec's atan2f lost 3 digits of a complex pow's imaginary part in the conformance suite)
_VECTOR_MATH = {"exp", "log", "sin", "cos", "tan", "tanh", "exp2", "log2", "log10", "pow", "asin", "acos", "atan",
                "sinh", "cosh"}
_VECTOR_INTRINSIC = re.compile(r"llvm\.(\w+)\.v(\d+)(f32|f64)")
_ISA = {128: "b", 256: "d", 512: "e"}


@functools.cache
def _libmvec() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libmvec.so.1")
    except OSError:
        return None


def _libmvec_name(intrinsic: str, vector_bits: int) -> str | None:
    """The libmvec function for a vector math intrinsic (`llvm.exp.v16f32` -> `_ZGVeN16v_expf`)
    no wider than the target's vectors, or None."""
    m = _VECTOR_INTRINSIC.fullmatch(intrinsic)
    if not m or m.group(1) not in _VECTOR_MATH or _libmvec() is None:
        return None
    fn, lanes, elem = m.group(1), int(m.group(2)), m.group(3)
    bits = lanes * (32 if elem == "f32" else 64)
    isa = _ISA.get(bits) if bits <= vector_bits else None
    name = f"_ZGV{isa}N{lanes}{'vv' if fn == 'pow' else 'v'}_{fn}{'f' if elem == 'f32' else ''}"
    return name if isa is not None and hasattr(_libmvec(), name) else None


def emit_object(llvm_ir: str, target: Target) -> tuple[bytes, bool]:
    """The object file, and whether it calls libmvec."""
    try:
        mod = llvm.parse_assembly(_classic_float_literals(llvm_ir))
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected the generated IR: {e}") from None
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="pic", codemodel="default")
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    # O2 with loop vectorisation (the kernels are loop nests). Unrolling multiplied compile time
    # by 4 on the encoder layer (14 s -> 3 s without it) and SLP vectorisation took 0.2-0.4 s of its
    # ~1.4 s, neither with a measured run-time gain
    pto = llvm.create_pipeline_tuning_options(speed_level=2)
    pto.loop_vectorization = True
    pto.slp_vectorization = False
    pto.loop_unrolling = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    uses_libmvec = False
    for fn in mod.functions:  # renamed declarations stop being intrinsics: their calls call libmvec
        name = _libmvec_name(fn.name, target.vector_bits) if fn.is_declaration else None
        if name is not None:
            fn.name, uses_libmvec = name, True
    return tm.emit_object(mod), uses_libmvec


def link_shared_object(obj: bytes, out_path: str, ral_dir: str, libmvec: bool) -> None:
    obj_path = out_path + ".o"
    with open(obj_path, "wb") as f:
        f.write(obj)
    cmd = [os.environ.get("CC", "cc"), "-shared", "-o", out_path, obj_path, f"-L{ral_dir}", "-ldisc_ral",
           f"-Wl,-rpath,{ral_dir}", "-lm"] + (["-l:libmvec.so.1"] if libmvec else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(obj_path)
    if proc.returncode != 0:
        raise CompileError(f"linking the shared object failed ({' '.join(cmd)}):\n{proc.stderr}")
