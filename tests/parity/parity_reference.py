"""The StableHLO reference interpreter (torch-mlir's `eval_module`) as an oracle: the JAX
module is specialised to the concrete input shapes and interpreted in a subprocess (misuse of
the interpreter can abort a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

_SCRIPT = r"""
import json, sys
import numpy as np
from torch_mlir import ir, passmanager
import torch_mlir.dialects.torch  # noqa: F401  (registers the StableHLO passes)
from torch_mlir._mlir_libs import _stablehlo

folder = sys.argv[1]
spec = json.load(open(folder + "/spec.json"))
inputs = [np.load(folder + "/in%d.npy" % i) for i in range(spec["n"])]
_stablehlo.register_stablehlo_passes()
ctx = ir.Context()
_stablehlo.register_dialect(ctx)
with ctx, ir.Location.unknown():
    m = ir.Module.parse(open(folder + "/module.mlir").read())
    types = ",".join("tensor<%sf32>" % "".join("%dx" % d for d in a.shape) for a in inputs)
    passmanager.PassManager.parse(
        "builtin.module(stablehlo-refine-arguments{types=%s}, inline, stablehlo-refine-shapes, "
        "func.func(stablehlo-canonicalize-dynamism), stablehlo-refine-shapes, symbol-dce)" % types).run(m.operation)
    asserts = []  # JAX's shape assertions hold at these shapes (disc checked them); the interpreter has none

    def visit(op):
        if op.name == "stablehlo.custom_call" and ir.StringAttr(op.attributes["call_target_name"]).value == "shape_assertion":
            asserts.append(op)
        return ir.WalkResult.ADVANCE

    m.operation.walk(visit)
    for op in asserts:
        op.erase()
    attrs = [ir.Attribute.parse('dense<"0x%s"> : tensor<%sf32>' % (a.tobytes().hex().upper(), "".join("%dx" % d for d in a.shape)))
             for a in inputs]
    for i, r in enumerate(_stablehlo.eval_module(m, attrs)):
        shape = list(ir.ShapedType(r.type).shape)
        np.save(folder + "/out%d.npy" % i, np.array(r).reshape(shape))
"""


def interpret(module_text: str, inputs: list[np.ndarray]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "module.mlir"), "w") as f:
            f.write(module_text)
        for i, a in enumerate(inputs):
            np.save(os.path.join(folder, f"in{i}.npy"), np.ascontiguousarray(a, np.float32))
        with open(os.path.join(folder, "spec.json"), "w") as f:
            json.dump({"n": len(inputs)}, f)
        out = subprocess.run([sys.executable, "-c", _SCRIPT, folder], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"the reference interpreter failed: {out.stderr[-3000:]}")
        return np.load(os.path.join(folder, "out0.npy"))
