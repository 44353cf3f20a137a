"""x86 back end: LLVM IR -> optimised objects (llvmlite, host CPU; `codegen`) -> shared object
linked against the RAL."""

from __future__ import annotations

import os
import subprocess

from ..errors import CompileError
from . import Target, codegen


def emit_objects(llvm_ir: str, target: Target, kernels: list[str]) -> tuple[list[bytes], bool, dict[str, str]]:
    """The object files (see `codegen.emit_objects`: kernels cached by structure, the parts split
    over two processes), whether they call libmvec, and the symbol each kernel is defined as."""
    from ..cache import build_digest

    spec = (target.triple, target.cpu, target.features, target.vector_bits)
    try:
        return codegen.emit_objects(llvm_ir, spec, kernels, build_digest())
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
