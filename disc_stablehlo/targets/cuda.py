"""CUDA back end: the kernels' LLVM IR (NVVM) -> PTX (llvmlite, each kernel alone and cached by
structure: `codegen.ptx_part`, libdevice linked for the `__nv_*` math functions; then joined) -> cubin (`ptxas`, where installed; the PTX is kept too, for the
driver to compile when the cubin does not fit the GPU), embedded in the host object as data the
launch code passes to the RAL (`passes/gpu.py`)."""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import llvmlite.binding as llvm

from ..errors import CompileError
from ..passes.gpu import IMAGE, IMAGE_SIZE, PTX
from . import Target, codegen


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


# the libdevice functions a kernel's LLVM IR declares
_LIBDEVICE_CALL = re.compile(r"^declare [^@]*@(__nv_\w+)\(", re.M)


def emit_ptx(device_ir: str, target: Target, kernels: list[str]) -> str:
    """PTX of the kernels: each kernel compiled alone (`codegen.ptx_part`: libdevice linked for
    the `__nv_*` math functions, optimised at O3) in this process and the code generation helper,
    or taken from `codegen.kernel_cache` (kernels of the same structure, in any function, have the
    same PTX), then concatenated under one header with each kernel's symbol replaced by its name;
    empty without kernels."""
    spec = (target.triple, target.cpu, target.features, 0)
    parts = codegen.KernelParts(codegen.Functions(device_ir), kernels, spec, _salt())
    needed = sorted({f for s in parts.missing for f in _LIBDEVICE_CALL.findall(parts.texts[s])})
    library = _libdevice_subset(tuple(needed)) if needed else b""
    try:
        parts.store(codegen.compile_parts([("ptx", (parts.texts[s], spec, library)) for s in parts.missing]))
    except codegen.LLVMRejected as e:
        raise CompileError(f"LLVM rejected the generated kernels: {e}") from None
    texts = [parts.code[symbol][0].decode().replace(symbol, name) for name, (symbol, _) in parts.symbols.items()]
    return "".join(t if i == 0 else t[_HEADER.search(t).end():] for i, t in enumerate(texts))


# the end of a PTX module's header (`.version`, `.target`, `.address_size`), the same in every part
_HEADER = re.compile(r"^\.address_size \d+\n", re.M)


@functools.cache
def _salt() -> bytes:
    """What decides a kernel's PTX besides its text and the target: the compiler's build and libdevice."""
    from ..cache import build_digest

    with open(libdevice_path(), "rb") as f:
        return build_digest() + hashlib.sha256(f.read()).digest()


@functools.cache
def _libdevice_subset(functions: tuple[str, ...]) -> bytes:
    """Bitcode of libdevice's `functions` and what they call, the rest dropped: linked into each
    kernel's part, it costs little, where the whole library (464 kB) took 50-60 ms a kernel."""
    llvm.initialize_all_targets()
    with open(libdevice_path(), "rb") as f:
        lib = llvm.parse_bitcode(f.read())
    missing = sorted(set(functions) - {fn.name for fn in lib.functions if not fn.is_declaration})
    if missing:
        raise CompileError(f"{libdevice_path()} does not define {', '.join(missing)}")
    codegen.keep_only(lib, llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(), functions)
    return lib.as_bitcode()


@functools.cache
def _parallel_option(ptxas: str) -> list[str]:
    """ptxas's option to compile the kernels on every CPU (newer toolkits; code of the same size:
    the encoder layer's kernels 0.65 -> 0.40 s on 2 cores), where it has it."""
    proc = subprocess.run([ptxas, "--help"], capture_output=True, text=True)
    return ["-split-compile=0"] if "split-compile" in proc.stdout else []


@functools.cache
def _ptxas_version(ptxas: str) -> str:
    return subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout


def assemble(ptx: str, target: Target) -> bytes | None:
    """The cubin for the target's GPU (`ptxas`, or `codegen.kernel_cache` when it has the cubin
    of the same PTX), or None where ptxas is not installed."""
    ptxas = ptxas_path()
    if ptxas is None:
        return None
    key = codegen.KernelCache.key(_salt(), ("ptxas", target.cpu, _ptxas_version(ptxas)), ptx)
    cached = codegen.kernel_cache.get(key)
    if cached is None:
        cached = (_run_ptxas(ptxas, ptx, target), False)
        codegen.kernel_cache.put(key, cached)
    return cached[0]


def _run_ptxas(ptxas: str, ptx: str, target: Target) -> bytes:
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
