"""CUDA back end: the kernels' LLVM IR (NVVM) -> PTX (llvmlite, libdevice linked for the
`__nv_*` math functions) -> cubin (`ptxas`, where installed; the PTX is kept too, for the
driver to compile when the cubin does not fit the GPU), embedded in the host object as data the
launch code passes to the RAL (`passes/gpu.py`)."""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile

import llvmlite.binding as llvm

from ..errors import CompileError
from ..passes.gpu import IMAGE, IMAGE_SIZE, PTX
from . import Target
from .x86 import _classic_float_literals


@functools.cache
def libdevice_path() -> str:
    """CUDA's libdevice bitcode: $DISC_LIBDEVICE, else the CUDA toolkit's (CUDA_HOME, /usr/local/cuda)
    or the `nvidia-cuda-nvcc` wheel's."""
    candidates = [os.environ.get("DISC_LIBDEVICE", "")]
    for root in [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]:
        candidates += sorted(glob.glob(os.path.join(root, "nvvm", "libdevice", "libdevice*.bc"))) if root else []
    try:
        import nvidia.cuda_nvcc  # the pip wheel's toolkit

        candidates += sorted(glob.glob(os.path.join(os.path.dirname(nvidia.cuda_nvcc.__file__), "nvvm", "libdevice", "*.bc")))
    except ImportError:
        pass
    for path in candidates:
        if path and os.path.exists(path):
            return path
    raise CompileError("CUDA's libdevice.10.bc was not found: install the CUDA toolkit, or the nvidia-cuda-nvcc-cu12 "
                       "package, or point DISC_LIBDEVICE at it")


def ptxas_path() -> str | None:
    return os.environ.get("DISC_PTXAS") or shutil.which("ptxas") or next(
        (p for p in ("/usr/local/cuda/bin/ptxas",) if os.path.exists(p)), None)


def emit_ptx(device_ir: str, target: Target, kernels: list[str]) -> str:
    """PTX of the kernels: libdevice linked, everything but the kernels internal, optimised at O3."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        mod = llvm.parse_assembly(_classic_float_literals(device_ir))
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected the generated kernels: {e}") from None
    with open(libdevice_path(), "rb") as f:
        mod.link_in(llvm.parse_bitcode(f.read()))
    for fn in mod.functions:
        if not fn.is_declaration and fn.name not in kernels:
            fn.linkage = llvm.Linkage.internal
    tm = llvm.Target.from_triple(target.triple).create_target_machine(cpu=target.cpu, features=target.features, opt=3)
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


def assemble(ptx: str, target: Target) -> bytes | None:
    """The cubin for the target's GPU (`ptxas`), or None where ptxas is not installed."""
    ptxas = ptxas_path()
    if ptxas is None:
        return None
    with tempfile.TemporaryDirectory(prefix="disc-ptx-") as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, f"-arch={target.cpu}", "-O3", src, "-o", out], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"ptxas rejected the generated PTX:\n{proc.stderr}")
        with open(out, "rb") as f:
            return f.read()


def _bytes_constant(name: str, data: bytes) -> str:
    body = "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02X}" for b in data)
    return f'@{name} = private unnamed_addr constant [{len(data)} x i8] c"{body}", align 16'


def embed_image(host_ir: str, image: bytes | None, ptx: str | None) -> str:
    """The host code's LLVM IR with the accessors its launch code declares defined: the device
    code object (a cubin or HSACO; None: none), its size, and the PTX (None: none)."""
    definitions = [
        _bytes_constant("__disc_gpu_image_data", image or b"\0"), _bytes_constant("__disc_gpu_ptx_data", (ptx or "").encode() + b"\0"),
        f"define ptr @{IMAGE}() {{\n  ret ptr {'@__disc_gpu_image_data' if image else 'null'}\n}}",
        f"define i64 @{IMAGE_SIZE}() {{\n  ret i64 {len(image or b'')}\n}}",
        f"define ptr @{PTX}() {{\n  ret ptr {'@__disc_gpu_ptx_data' if ptx else 'null'}\n}}"]
    host_ir = re.sub(rf"^declare \w+ @({IMAGE}|{IMAGE_SIZE}|{PTX})\(\)\n", "", host_ir, flags=re.M)
    return host_ir + "\n" + "\n".join(definitions) + "\n"


def with_device_image(host_ir: str, device_ir: str, target: Target, kernels: list[str]) -> tuple[str, str, bytes | None]:
    """The kernels compiled, and the host code's LLVM IR with the accessors its launch code
    declares defined (the cubin, its size, the PTX); returns that IR, the PTX and the cubin."""
    ptx = emit_ptx(device_ir, target, kernels)
    cubin = assemble(ptx, target)
    return embed_image(host_ir, cubin, ptx), ptx, cubin
