"""Compiling an imported module into an artifact: pipeline -> LLVM IR -> objects -> shared
object -> `.disc` file. MLIR and LLVM are loaded here, never on the run-time side."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import sys
import tempfile
import time
from typing import Any, Sequence

from . import mlir_support  # noqa: F401  (first: loads torch-mlir's native modules, see _load_mlir)
from . import artifact, cache
from .passes.pipeline import compile_to_llvm
from .runtime import ral_library_dir
from .targets import Target, cuda, host_code_target, rocm
from .targets.codegen import start_helper
from .targets.x86 import emit_objects, image_object, link_shared_object


def build_artifact(imported: Any, constraints: Sequence[str], tgt: Target, buffer_reuse: bool, path: str,
                   binding: dict[str, Any]) -> list[tuple[int, int, int]]:
    """Compiles the imported module and writes its artifact to `path`, for the caller to complete
    (`artifact.write`; returns what that returns). `binding`: how the caller's flat arguments map
    to the inputs, kept for `disc.load`."""
    if _op_count(imported.module) >= HELPER_MIN_OPS:
        start_helper()  # code generation's helper process starts up while the MLIR passes run
    start, upstream = time.perf_counter(), _upstream_seconds()
    lowered = compile_to_llvm(imported.module, imported.entry, imported.signature, tgt, imported.facts, imported.checked,
                              tuple(constraints), buffer_reuse, imported.params)
    start = mlir_support.add_seconds(PASSES_STAGE, start + _upstream_seconds() - upstream)  # less what upstream MLIR took
    shapes = lowered.shapes
    if "shapes" in os.environ.get("DISC_LOG", "").split(","):
        print(shapes.report(), file=sys.stderr)
    mlir_support.stage_listener("LLVM code generation")
    image_ir, device = None, {}
    kernel_names = [k.name for k in lowered.kernels]
    host = host_code_target(tgt)
    if tgt.kind == "rocm":  # the kernels' code object (or PTX and cubin) become data of an object of their own
        image_ir, hsaco = rocm.device_image(lowered.device_llvm_ir, tgt, kernel_names)
        device = {"hsaco_bytes": len(hsaco)}
    with concurrent.futures.ThreadPoolExecutor(1) as background:
        if tgt.kind == "cuda":  # ptxas makes the cubin while the host code is generated
            ptx = cuda.emit_ptx(lowered.device_llvm_ir, tgt, kernel_names)
            cubin = background.submit(cuda.assemble, ptx, tgt) if ptx else None
        objects, libmvec, aliases = emit_objects(lowered.llvm_ir, host, kernel_names if tgt.kind == "cpu" else [])
        if tgt.kind == "cuda":
            cubin = cubin.result() if cubin else None
            image_ir, device = cuda.image_module(cubin, ptx or None), {"ptx_bytes": len(ptx), "cubin_bytes": len(cubin or b"")}
    if image_ir is not None:
        objects.append(image_object(image_ir, host))
    start = mlir_support.add_seconds("LLVM code generation", start)  # (GPU targets: the device code's too)
    with tempfile.TemporaryDirectory(prefix="disc-") as tmp:
        so_path = os.path.join(tmp, "compiled.so")
        link_shared_object(objects, so_path, ral_library_dir(), libmvec, aliases)
        with open(so_path, "rb") as f:
            shared_object = f.read()
    start = mlir_support.add_seconds("linking", start)
    info = {
        "kernels": [dataclasses.asdict(k) for k in lowered.kernels],
        "shape_report": shapes.report(),
        "symbolic_result_shapes": [[str(shapes.facts.canon(d)) for d in dims] for dims in shapes.results],
        "library_calls": [name for name in LIBRARY_ENTRIES if f"@{name}" in lowered.llvm_ir],
        "constraints": list(constraints),
    }
    if device:
        info["device_code"] = device
    target = {"name": tgt.name, "triple": host.triple, "cpu": host.cpu, "cpu_flags": artifact.cpu_flags_needed(host.features)}
    if tgt.kind != "cpu":
        target.update(device_triple=tgt.triple, chip=tgt.cpu)
    fills = artifact.write(path, artifact.Contents(imported.signature, lowered.assertions, target, shared_object, lowered.llvm_ir,
                                                lowered.params, info, binding))
    mlir_support.add_seconds("writing the artifact", start)
    return fills


PASSES_STAGE = "our passes, shape analysis, LLVM IR translation"


def _upstream_seconds() -> float:
    return sum(mlir_support.stage_seconds.get(s, 0.0) for s in (mlir_support.PIPELINES_STAGE, mlir_support.VERIFY_STAGE))


# the RAL's library entries whose calls `CompiledFunction.stats` counts (the plain entry or the one with an epilogue)
LIBRARY_ENTRIES = ("disc_ral_gemm_f32", "disc_ral_gemm_f64", "disc_ral_conv_f32", "disc_ral_conv_f64", "disc_ral_gpu_gemm_f32",
                   "disc_ral_gpu_gemm_f64")


# modules with fewer ops (in their functions' bodies, not counting nested regions) rarely have
# two kernels worth compiling apart: they leave the helper process unstarted
HELPER_MIN_OPS = 64


def _op_count(module: Any) -> int:
    return sum(len(f.regions[0].blocks[0].operations) for f in module.body.operations
               if len(f.regions) and len(f.regions[0].blocks))


def cache_key(imported: Any, constraints: Sequence[str], tgt: Any, buffer_reuse: bool, weights_digest: str) -> str:
    """`weights_digest`: the caller's digest of the `Deferred` parameters' bytes."""
    h = hashlib.sha256()
    # without locations: JAX's record the caller's whole stack, so the same function compiled
    # from another call site (a later process, another test) would miss its entry
    for part in (imported.module.operation.get_asm(enable_debug_info=False), imported.entry, repr(imported.signature),
                 repr(imported.facts), repr(imported.checked), repr(tuple(constraints)), repr(buffer_reuse),
                 repr(tgt), weights_digest):
        h.update(part.encode())
        h.update(b"\0")
    for p in imported.params:  # weights the frontend keeps out of the module (torch's)
        h.update(repr(p).encode() if isinstance(p, artifact.Deferred) else p.reshape(-1).view("u1"))
    h.update(cache.build_digest())
    return h.hexdigest()[:32]
