"""ROCm back end: the kernels' LLVM IR (ROCDL) -> an AMDGPU object (llvmlite, code object v5) ->
a loadable HSACO (`ld.lld -shared`: LLD from the `ziglang` package, or one on PATH), embedded in
the host object as data the launch code passes to the RAL (`passes/gpu.py`).

No package here provides ROCm's device library (ockl, ocml): the few functions of it the ROCDL
lowering still calls are defined here, from the dispatch packet (block and grid sizes) or as
LLVM intrinsics the AMDGPU back end expands; a kernel that needs any other is a CompileError."""

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
from .cuda import embed_image
from .x86 import _classic_float_literals

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


def _device_library(device_ir: str) -> str:
    """Definitions of the device-library functions the module declares."""
    declared = set(re.findall(r"^declare [^@]*@([\w.]+)\(", device_ir, re.M))
    out = [_OCKL] if declared & {"__ockl_get_local_size", "__ockl_get_num_groups"} else []
    for name in sorted(declared):
        if name in _OCML:
            intrinsic, t = _OCML[name]
            out.append(f"define internal {t} @{name}({t} %x) {{\n  %r = call {t} @{intrinsic}({t} %x)\n  ret {t} %r\n}}")
    missing = sorted(n for n in declared if not n.startswith("llvm.") and n not in _OCML and not n.startswith("__ockl_get_"))
    if missing:
        raise CompileError(f"the kernels need ROCm device-library functions no package here provides: {', '.join(missing)}")
    return "\n".join(out)


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
    text = _classic_float_literals(device_ir)
    text = re.sub(r"^declare [^@]*@(__ockl_get_\w+|__ocml_\w+)\(.*\n", "", text, flags=re.M) + _device_library(text)
    if "amdhsa_code_object_version" not in text:
        text += '\n!llvm.module.flags = !{!9999}\n!9999 = !{i32 1, !"amdhsa_code_object_version", i32 500}\n'
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected the generated kernels: {e}") from None
    for fn in mod.functions:
        if not fn.is_declaration and fn.name not in kernels:
            fn.linkage = llvm.Linkage.internal
    tm = llvm.Target.from_triple(target.triple).create_target_machine(cpu=target.cpu, features=target.features, opt=3, reloc="pic")
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
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


def with_device_image(host_ir: str, device_ir: str, target: Target, kernels: list[str]) -> tuple[str, bytes]:
    """The kernels compiled, and the host code's LLVM IR with the accessors its launch code
    declares defined (the code object and its size; no PTX); returns that IR and the code object."""
    hsaco = emit_hsaco(device_ir, target, kernels)
    return embed_image(host_ir, hsaco, None), hsaco
