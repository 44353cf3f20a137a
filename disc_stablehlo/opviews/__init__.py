"""Placeholder op-class modules, searched before torch-mlir's dialect modules.

The MLIR bindings wrap an op in its dialect's Python op class, importing the dialect's module
(`<prefix>.<dialect>`, the first prefix that has one) the first time they meet one of its ops.
torch-mlir's generated modules take 0.35 s to import for the dialects a compilation meets (torch
0.14 s: only its native library registers the StableHLO passes; linalg 0.10 s; llvm 0.05 s), and
for StableHLO and CHLO there are none, so the search failed again on every op (about 5 % of the
encoder layer's compilation). The compiler reads ops through the generic `Operation` API only, so
each dialect it meets gets an empty module here: the search ends at once and generic op views
are used. Where a dialect's real module was imported anyway (torch-mlir's FX importer builds with
its classes), its classes are registered and still wrap its ops."""

import sys
import types

DIALECTS = ("affine", "arith", "bufferization", "builtin", "cf", "chlo", "complex", "func", "gpu", "index", "linalg", "llvm",
            "math", "memref", "nvvm", "quant", "rocdl", "scf", "shape", "stablehlo", "tensor", "torch", "ub", "vector")

for _name in DIALECTS:
    sys.modules[f"{__name__}.{_name}"] = types.ModuleType(f"{__name__}.{_name}", "No op classes: generic operations (see the package's docstring).")
