"""CUDA back end: the kernels' LLVM IR (NVVM) -> PTX (llvmlite, libdevice linked for the
`__nv_*` math functions) -> cubin (`ptxas`, where installed; the PTX is kept too, for the
driver to compile when the cubin does not fit the GPU), embedded in the host object as data the
launch code passes to the RAL (`passes/gpu.py`)."""

from __future__ import annotations

import functools
import glob
import os
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
    optimise_device_module(mod, tm)
    return tm.emit_assembly(mod)


def optimise_device_module(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """O3 on kernels linked with a device math library whose other functions are internal: the
    library's functions no kernel calls go first, before O3 looks at them (libdevice: O3 on the
    encoder layer's kernels 0.41 -> 0.28 s, the same PTX)."""
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    unused = llvm.create_new_module_pass_manager()
    unused.add_global_dead_code_eliminate_pass()
    unused.run(mod, pb)
    pb.getModulePassManager().run(mod, pb)


@functools.cache
def _parallel_option(ptxas: str) -> list[str]:
    """ptxas's option to compile the kernels on every CPU (newer toolkits; code of the same size:
    the encoder layer's kernels 0.65 -> 0.40 s on 2 cores), where it has it."""
    proc = subprocess.run([ptxas, "--help"], capture_output=True, text=True)
    return ["-split-compile=0"] if "split-compile" in proc.stdout else []


def assemble(ptx: str, target: Target) -> bytes | None:
    """The cubin for the target's GPU (`ptxas`), or None where ptxas is not installed."""
    ptxas = ptxas_path()
    if ptxas is None:
        return None
    with tempfile.TemporaryDirectory(prefix="disc-ptx-") as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, f"-arch={target.cpu}", "-O3", *_parallel_option(ptxas), src, "-o", out],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"ptxas rejected the generated PTX:\n{proc.stderr}")
        with open(out, "rb") as f:
            return f.read()


# each byte as LLVM writes it in a c"..." string: printable characters as they are, the rest escaped
_BYTE_TEXT = [chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02X}" for b in range(256)]


def _bytes_constant(name: str, data: bytes) -> str:
    body = "".join(map(_BYTE_TEXT.__getitem__, data))
    return f'@{name} = private unnamed_addr constant [{len(data)} x i8] c"{body}", align 16'


def image_module(image: bytes | None, ptx: str | None) -> str:
    """LLVM IR of a module of its own defining the accessors the host code's launch code
    declares: the device code object (a cubin or HSACO; None: none), its size, and the PTX (None:
    none). Compiled apart from the host code, it is linked with it into the shared object."""
    return "\n".join([
        _bytes_constant("__disc_gpu_image_data", image or b"\0"), _bytes_constant("__disc_gpu_ptx_data", (ptx or "").encode() + b"\0"),
        f"define ptr @{IMAGE}() {{\n  ret ptr {'@__disc_gpu_image_data' if image else 'null'}\n}}",
        f"define i64 @{IMAGE_SIZE}() {{\n  ret i64 {len(image or b'')}\n}}",
        f"define ptr @{PTX}() {{\n  ret ptr {'@__disc_gpu_ptx_data' if ptx else 'null'}\n}}"]) + "\n"


def device_image(device_ir: str, target: Target, kernels: list[str]) -> tuple[str, str, bytes | None]:
    """The kernels compiled: the image module (`image_module`: the cubin and the PTX), the PTX
    and the cubin."""
    ptx = emit_ptx(device_ir, target, kernels)
    cubin = assemble(ptx, target)
    return image_module(cubin, ptx), ptx, cubin
