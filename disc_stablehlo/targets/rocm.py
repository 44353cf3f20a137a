"""ROCm back end: the kernels' LLVM IR (ROCDL) -> an AMDGPU object (llvmlite, code object v5) ->
a loadable HSACO (`ld.lld -shared`: LLD from the `ziglang` package, or one on PATH), embedded in
the host object as data the launch code passes to the RAL (`passes/gpu.py`).

Math functions come from ROCm's device library (ocml.bc: a ROCm installation's, or
$DISC_ROCM_DEVICE_LIBS; `Target.math_library`), linked into the kernels with its control
constants set here (IEEE results: no finite-only or unsafe math, denormals kept, a correctly
rounded sqrt). Without it, the few device-library functions the ROCDL lowering still calls are
defined here, from the dispatch packet (block and grid sizes) or as LLVM intrinsics the AMDGPU
back end expands, and a kernel that needs any other is a CompileError saying where to get the
library. The work-group size and count functions (ockl) are always the ones defined here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import llvmlite.binding as llvm

from ..errors import CompileError
from . import Target
from .codegen import classic_float_literals, optimise_device_module
from .cuda import image_module

# ockl's work-group size and count of a dim, read from the HSA dispatch packet (work-group sizes:
# 16-bit at offset 4; grid sizes in work-items: 32-bit at offset 12)
_OCKL = """
declare ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
define internal i64 @__disc_dispatch_field(i32 %at, i64 %mask) {
  %p = call ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
  %q = getelementptr i8, ptr addrspace(4) %p, i32 %at
  %v = load i32, ptr addrspace(4) %q, align 2
  %w = zext i32 %v to i64
  %r = and i64 %w, %mask
  ret i64 %r
}
define internal i64 @__ockl_get_local_size(i32 %dim) {
  %o = mul i32 %dim, 2
  %at = add i32 %o, 4
  %r = call i64 @__disc_dispatch_field(i32 %at, i64 65535)
  ret i64 %r
}
define internal i64 @__ockl_get_num_groups(i32 %dim) {
  %o = mul i32 %dim, 4
  %at = add i32 %o, 12
  %grid = call i64 @__disc_dispatch_field(i32 %at, i64 4294967295)
  %wg = call i64 @__ockl_get_local_size(i32 %dim)
  %up = add i64 %grid, %wg
  %up1 = sub i64 %up, 1
  %n = udiv i64 %up1, %wg
  ret i64 %n
}
"""
# ocml functions the AMDGPU back end computes itself as intrinsics (f32 sin and cos natively;
# rounding, sqrt and fabs in both widths)
_OCML = {f"__ocml_{fn}_{t}": (f"llvm.{fn}.{ll}", ll)
         for fn in ("floor", "ceil", "trunc", "rint", "round", "sqrt", "fabs") for t, ll in (("f32", "float"), ("f64", "double"))}
_OCML.update({f"__ocml_{fn}_f32": (f"llvm.{fn}.f32", "float") for fn in ("sin", "cos", "exp2", "log2")})


def _device_library(device_ir: str, target: Target) -> str:
    """Definitions of the device-library functions the module declares that this module defines
    itself (with ocml.bc: its control constants instead of its functions)."""
    declared = set(re.findall(r"^declare [^@]*@([\w.]+)\(", device_ir, re.M))
    out = [_OCKL] if declared & {"__ockl_get_local_size", "__ockl_get_num_groups"} else []
    if target.math_library:
        return "\n".join(out + [_oclc_constants(target.cpu)])
    for name in sorted(declared):
        if name in _OCML:
            intrinsic, t = _OCML[name]
            out.append(f"define internal {t} @{name}({t} %x) {{\n  %r = call {t} @{intrinsic}({t} %x)\n  ret {t} %r\n}}")
    missing = sorted(n for n in declared if not n.startswith("llvm.") and n not in _OCML and not n.startswith("__ockl_get_"))
    if missing:
        raise CompileError(f"the kernels need ROCm device-library functions: {', '.join(missing)}; none was found (a ROCm "
                           "installation's amdgcn/bitcode/ocml.bc, under $ROCM_PATH or /opt/rocm, or a folder with ocml.bc "
                           "named by $DISC_ROCM_DEVICE_LIBS)")
    return "\n".join(out)


def _oclc_constants(chip: str) -> str:
    """The control constants ocml reads (IEEE behaviour; the ISA version of `chip`:
    gfx90a -> 9010, gfx942 -> 9402: major, then minor and stepping as hex digits)."""
    digits = chip.removeprefix("gfx")
    isa = int(digits[:-2]) * 1000 + int(digits[-2], 16) * 100 + int(digits[-1], 16)
    values = {"finite_only_opt": 0, "unsafe_math_opt": 0, "daz_opt": 0, "correctly_rounded_sqrt32": 1}
    lines = [f"@__oclc_{name} = linkonce_odr hidden addrspace(4) constant i8 {v}, align 1" for name, v in values.items()]
    return "\n".join(lines + [f"@__oclc_ISA_version = linkonce_odr hidden addrspace(4) constant i32 {isa}, align 4"])


# a package on PyPI that carries ROCm's device libraries (Triton's ROCm build: ocml.bc, NCSA licence)
DEVICE_LIBRARY_WHEEL = "pytorch-triton-rocm==2.1.0"
_WHEEL_OCML = "triton/third_party/rocm/lib/bitcode/ocml.bc"


def fetch_device_library(folder: str | os.PathLike) -> str:
    """ROCm's ocml.bc for a machine without ROCm, taken from DEVICE_LIBRARY_WHEEL (downloaded
    with pip, not installed) into `folder` (for $DISC_ROCM_DEVICE_LIBS); returns its path."""
    import zipfile
    from pathlib import Path

    out = Path(folder) / "ocml.bc"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="disc-rocm-") as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
                            "--platform", "manylinux2014_x86_64", "-d", tmp, DEVICE_LIBRARY_WHEEL], check=True)
            with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as wheel:
                out.with_suffix(".tmp").write_bytes(wheel.read(_WHEEL_OCML))
        out.with_suffix(".tmp").replace(out)
    return str(out)


def _linker() -> list[str]:
    """ld.lld: from the ziglang package (LLD 22), else one on PATH."""
    try:
        import ziglang  # noqa: F401

        return [sys.executable, "-m", "ziglang", "ld.lld"]
    except ImportError:
        found = next(filter(None, map(shutil.which, ["ld.lld", *(f"ld.lld-{v}" for v in range(22, 14, -1))])), None)
        if found is None:
            raise CompileError("ld.lld is needed to link ROCm code objects: pip install ziglang, or install LLD") from None
        return [found]


def emit_hsaco(device_ir: str, target: Target, kernels: list[str]) -> bytes:
    """The kernels as a loadable code object for the target's GPU."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    text = classic_float_literals(device_ir)
    defined_here = r"__ockl_get_\w+" if target.math_library else r"__ockl_get_\w+|__ocml_\w+"
    text = re.sub(rf"^declare [^@]*@({defined_here})\(.*\n", "", text, flags=re.M) + _device_library(text, target)
    if "amdhsa_code_object_version" not in text:
        text += '\n!llvm.module.flags = !{!9999}\n!9999 = !{i32 1, !"amdhsa_code_object_version", i32 500}\n'
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected the generated kernels: {e}") from None
    if target.math_library:
        with open(target.math_library, "rb") as f:
            try:
                mod.link_in(llvm.parse_bitcode(f.read()))
            except RuntimeError as e:
                raise CompileError(f"cannot link ROCm's device library {target.math_library}: {e}") from None
        missing = sorted(fn.name for fn in mod.functions if fn.is_declaration and not fn.name.startswith("llvm."))
        if missing:
            raise CompileError(f"{target.math_library} does not define {', '.join(missing)}")
    tm = llvm.Target.from_triple(target.triple).create_target_machine(cpu=target.cpu, features=target.features, opt=3, reloc="pic")
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    optimise_device_module(mod, tm, kernels)
    obj = tm.emit_object(mod)
    with tempfile.TemporaryDirectory(prefix="disc-hsaco-") as tmp:
        src, out = os.path.join(tmp, "k.o"), os.path.join(tmp, "k.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        proc = subprocess.run([*_linker(), "-shared", "--no-undefined", src, "-o", out], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"ld.lld could not link the ROCm code object:\n{proc.stderr}")
        with open(out, "rb") as f:
            return f.read()


def device_image(device_ir: str, target: Target, kernels: list[str]) -> tuple[str, bytes]:
    """The kernels compiled: the image module (`cuda.image_module`: the code object, no PTX) and
    the code object."""
    hsaco = emit_hsaco(device_ir, target, kernels)
    return image_module(hsaco, None), hsaco
