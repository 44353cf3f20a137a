"""disc_stablehlo: a dynamic-shape compiler for StableHLO. Compile once, run at every shape."""

from . import mlir_support  # noqa: F401  (first: loads torch-mlir's native modules, see _load_mlir)
from .compiler import CompiledFunction, compile
from .errors import CompileError, DiscError, RuntimeFailure, ShapeError, UnsupportedOpError

__all__ = ["CompileError", "CompiledFunction", "DiscError", "RuntimeFailure", "ShapeError", "UnsupportedOpError", "compile"]
