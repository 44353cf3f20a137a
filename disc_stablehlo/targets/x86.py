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
# rejects: words (`-inf`, `+qnan`, NaNs with a payload: `+nan(0x123)` quiet, `-snan(0x1)`
# signalling), raw bits (`f0x3727C5AC`), and shortest decimals that are not exact doubles
# (`2.326820e-02` for a float). Each is rewritten to the classic hexadecimal form
# of its type, found as the nearest type word before it on the line (`phi float [ -inf, ...]`).
# One scan over a line: type words and the line start are matched with the literals, in order.
_TOKEN_RE = re.compile(r"(?P<nl>\n[ \t]*(?P<skip>;|!|source_filename|target)?)|\b(?P<type>half|bfloat|float|double)\b"
                       r"|(?<![\w.%@])(?:f0x(?P<bits>[0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}|[0-9A-Fa-f]{16})"
                       r"|(?P<word>(?P<sign>[+-]?)(?:inf|(?P<nan>q?nan|snan)(?:\((?P<payload>0x[0-9A-Fa-f]+)\))?))"
                       r"|(?P<dec>[+-]?\d+\.\d+(?:e[+-]?\d+)?))(?![\w.])")


def _hex_literal(value: float, type_name: str) -> str:
    if type_name == "half":
        return f"0xH{struct.unpack('<H', struct.pack('<e', value))[0]:04X}"
    if type_name == "bfloat":
        return f"0xR{struct.unpack('<I', struct.pack('<f', value))[0] >> 16:04X}"
    if type_name == "float":  # written as the double it widens to
        value = struct.unpack("<f", struct.pack("<f", value))[0]
    return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"


# per type: exponent bits all set, the quiet bit, and the sign bit (where the bits of a NaN go)
_NAN_BITS = {"half": (0x7C00, 0x200, 0x8000), "bfloat": (0x7F80, 0x40, 0x8000), "float": (0x7F800000, 0x400000, 1 << 31),
             "double": (0x7FF << 52, 1 << 51, 1 << 63)}


def _nan_literal(kind: str, sign: str, payload: int, type_name: str) -> str:
    """A NaN of `type_name` with its sign, quiet or signalling kind and payload, in the classic
    form (a float as the double it widens to: its 23 mantissa bits on top of the double's 52)."""
    exponent, quiet, sign_bit = _NAN_BITS[type_name]
    bits = exponent | (0 if kind == "snan" else quiet) | payload | (sign_bit if sign == "-" else 0)
    if type_name == "half":
        return f"0xH{bits:04X}"
    if type_name == "bfloat":
        return f"0xR{bits:04X}"
    if type_name == "float":
        bits = ((bits >> 31) << 63) | (0x7FF << 52) | ((bits & 0x7FFFFF) << 29)
    return f"0x{bits:016X}"


# where a literal the rewrite may change can start (a superset of _TOKEN_RE's literals): most lines
# of a module have none, and only the lines that have one are scanned token by token
_CANDIDATE_RE = re.compile(r"(?<![\w.%@])(?:f0x|[+-]?(?:inf|q?nan|snan)|[+-]?\d+\.\d)")


def _classic_float_literals(llvm_ir: str) -> str:
    """Linear in the text: the lines with a candidate literal are rewritten, each token looked at
    once with the line's last type word so far."""
    parts, done = [], 0
    for m in _CANDIDATE_RE.finditer(llvm_ir):
        if m.start() < done:
            continue  # on a line already rewritten
        start = llvm_ir.rfind("\n", 0, m.start()) + 1
        end = llvm_ir.find("\n", m.end())
        end = len(llvm_ir) if end < 0 else end
        parts += [llvm_ir[done:start], _classic_line(llvm_ir[start:end])]
        done = end
    parts.append(llvm_ir[done:])
    return "".join(parts)


def _classic_line(line: str) -> str:
    line_type: list[str | None] = [None]
    skip_line = [False]

    def sub(m: re.Match) -> str:
        if m.group("nl") is not None:
            line_type[0], skip_line[0] = None, m.group("skip") is not None
            return m.group(0)
        if m.group("type"):
            line_type[0] = m.group("type")
            return m.group(0)
        last = line_type[0]
        if skip_line[0]:
            return m.group(0)
        if m.group("bits"):  # raw bits: 4 hex digits half or bfloat, 8 float, 16 double
            bits = m.group("bits")
            if len(bits) == 4:
                return ("0xR" if last == "bfloat" else "0xH") + bits.upper()
            if len(bits) == 16:
                return "0x" + bits.upper()
            return _hex_literal(struct.unpack("<f", struct.pack("<I", int(bits, 16)))[0], "double")
        if last is None or (m.group("dec") and last == "double"):
            return m.group(0)
        if m.group("nan"):
            return _nan_literal(m.group("nan"), m.group("sign"), int(m.group("payload") or "0", 16), last)
        word = m.group("word") or m.group("dec")
        return _hex_literal(float(word.replace("q", "")), last)
    return _TOKEN_RE.sub(sub, "\n" + line)[1:]


def emit_objects(llvm_ir: str, target: Target, kernels: list[str]) -> tuple[list[bytes], bool, dict[str, str]]:
    """The object files (see `codegen.emit_objects`: kernels cached by structure, the parts split
    over two processes), whether they call libmvec, and the symbol each kernel is defined as."""
    from ..cache import build_digest

    spec = (target.triple, target.cpu, target.features, target.vector_bits)
    try:
        return codegen.emit_objects(_classic_float_literals(llvm_ir), spec, kernels, build_digest())
    except codegen.LLVMRejected as e:
        raise CompileError(f"LLVM rejected the generated IR: {e}") from None


def image_object(image_ir: str, target: Target) -> bytes:
    """The object of a GPU target's image module (`cuda.image_module`: data, no float literals)."""
    return codegen.compile_part(image_ir, (target.triple, target.cpu, target.features, target.vector_bits))[0]


def link_shared_object(objects: list[bytes], out_path: str, ral_dir: str, libmvec: bool, aliases: dict[str, str]) -> None:
    """`aliases`: names the shared object defines as another symbol's (a kernel's name, as the
    symbol its structure named it in its object)."""
    paths = [f"{out_path}.{i}.o" for i in range(len(objects))]
    for path, obj in zip(paths, objects):
        with open(path, "wb") as f:
            f.write(obj)
    cmd = [os.environ.get("CC", "cc"), "-shared", "-o", out_path, *paths, f"-L{ral_dir}", "-ldisc_ral",
           f"-Wl,-rpath,{ral_dir}", "-lm"] + (["-l:libmvec.so.1"] if libmvec else [])
    cmd += [f"-Wl,--defsym={name}={symbol}" for name, symbol in aliases.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for path in paths:
        os.unlink(path)
    if proc.returncode != 0:
        raise CompileError(f"linking the shared object failed ({' '.join(cmd)}):\n{proc.stderr}")
