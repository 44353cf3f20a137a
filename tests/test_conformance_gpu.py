"""The shared StableHLO conformance cases (../shared/conformance/suite) compile for the GPU
targets: each static case's computation (its inputs made arguments, the values it checks made
results, so nothing folds away) and each dynamic case as it is, compiled once for every shape.
The default run compiles each case for one of the four GPUs in turn (sm_80, sm_90, gfx90a,
gfx942: every target gets a quarter of the suite); DISC_GPU_CONFORMANCE=all compiles every case
for all four. A compilation includes ptxas (CUDA) or ld.lld (ROCm) on the device code.

What the cases compute is checked on a GPU by `benchmarks/gpu/` (the harness's inputs and
expected values); here only compilation, as CI has no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import disc_stablehlo as disc
from disc_stablehlo.targets import cuda

# the shared suite: $DISC_CONFORMANCE_SUITE, else ../shared next to the checkout, else the shared
# folder of the machines this project is developed on
SUITE = next((p for p in (Path(os.environ.get("DISC_CONFORMANCE_SUITE", "/nonexistent")),
                          Path(__file__).resolve().parents[2] / "shared" / "conformance" / "suite",
                          Path("/work/shared/conformance/suite")) if p.is_dir()), Path("/nonexistent")) / "stablehlo" / "testdata"
TARGETS = ["cuda:sm_80", "cuda:sm_90", "rocm:gfx90a", "rocm:gfx942"]
CHUNKS = 16
# cases that are an UnsupportedOpError saying this, on every target: an op no target lowers yet
# (fft: the RAL's FFT runs on the host; an fft of an empty array needs no lowering and compiles), and a module that is
# not a valid program (XLA and the harness cannot run it either)
UNSUPPORTED = {"fft_complex128_14_15_16_17.mlir": "stablehlo.fft", "fft_float64_14_15_16_17.mlir": "stablehlo.fft",
               "conv_general_dilated_1d_stride_2_even_dynamic.mlir": "window_strides has 2 entries for 1 spatial dimension"}

pytestmark = [pytest.mark.skipif(not SUITE.is_dir(), reason=f"the shared conformance suite is not at {SUITE}"),
              pytest.mark.skipif(cuda.ptxas_path() is None, reason="ptxas (CUDA toolkit) not installed")]


def _cases() -> list[Path]:
    return sorted(SUITE.glob("*.mlir")) + sorted(SUITE.glob("dynamic/*.mlir")) if SUITE.is_dir() else []


def _program(path: Path) -> str:
    """The module's computation: a static case's `@main` calls `@inputs()` and `@expected()` and
    checks values with `check.*` custom calls; the inputs become arguments and the checked values
    results. A dynamic case's `@main` is the computation already."""
    text = path.read_text()
    if path.parent.name == "dynamic":
        return text
    from jax._src.interpreters import mlir as jax_mlir  # its bindings parse CHLO
    from jax._src.lib.mlir import ir

    with jax_mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        main = next(op for op in module.body.operations
                    if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main")
        block = main.regions[0].blocks[0]
        ops = [o.operation for o in block.operations]
        calls = {ir.FlatSymbolRefAttr(o.attributes["callee"]).value: o for o in ops if o.name == "func.call"}
        checks = [o for o in ops if o.name == "stablehlo.custom_call"
                  and ir.StringAttr(o.attributes["call_target_name"]).value.startswith("check.")]
        if "inputs" in calls:
            for r in list(calls["inputs"].results):
                r.replace_all_uses_with(block.add_argument(r.type, ir.Location.unknown()))
        results = [c.operands[0] for c in checks]  # an input itself, possibly
        for o in [*checks, calls.get("inputs"), calls["expected"], ops[-1]]:
            if o is not None:
                o.erase()
        with ir.InsertionPoint(block):
            ir.Operation.create("func.return", operands=results)
        main.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], [v.type for v in results]))
        return str(module)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_conformance_cases_compile_for_the_gpus(chunk):
    every = os.environ.get("DISC_GPU_CONFORMANCE") == "all"
    failures = []
    for i, path in list(enumerate(_cases()))[chunk::CHUNKS]:
        program = _program(path)
        for target in TARGETS if every else [TARGETS[i % len(TARGETS)]]:
            unsupported = UNSUPPORTED.get(path.name)
            try:
                disc.compile(program, target=target)
                if unsupported:
                    failures.append(f"{path.name} for {target}: compiled, expected UnsupportedOpError: {unsupported}")
            except disc.UnsupportedOpError as e:
                if not unsupported or unsupported not in str(e):
                    failures.append(f"{path.name} for {target}: {str(e).splitlines()[0][:300]}")
            except disc.DiscError as e:
                failures.append(f"{path.name} for {target}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    assert not failures, "\n".join(failures)
