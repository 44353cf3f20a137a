"""x86 back end: LLVM IR -> optimised objects (llvmlite, host CPU; `codegen`) -> shared object
linked against the RAL."""

from __future__ import annotations

import os
import re
import struct
import subprocess

from ..errors import CompileError
from . import Target, codegen


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


def emit_objects(llvm_ir: str, target: Target, kernels: list[str]) -> tuple[list[bytes], bool]:
    """The object files (the kernels may be split over two processes, see `codegen`), and whether
    they call libmvec."""
    try:
        return codegen.emit_objects(_classic_float_literals(llvm_ir), (target.triple, target.cpu, target.features,
                                                                       target.vector_bits), kernels)
    except codegen.LLVMRejected as e:
        raise CompileError(f"LLVM rejected the generated IR: {e}") from None


def link_shared_object(objects: list[bytes], out_path: str, ral_dir: str, libmvec: bool) -> None:
    paths = [f"{out_path}.{i}.o" for i in range(len(objects))]
    for path, obj in zip(paths, objects):
        with open(path, "wb") as f:
            f.write(obj)
    cmd = [os.environ.get("CC", "cc"), "-shared", "-o", out_path, *paths, f"-L{ral_dir}", "-ldisc_ral",
           f"-Wl,-rpath,{ral_dir}", "-lm"] + (["-l:libmvec.so.1"] if libmvec else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for path in paths:
        os.unlink(path)
    if proc.returncode != 0:
        raise CompileError(f"linking the shared object failed ({' '.join(cmd)}):\n{proc.stderr}")
