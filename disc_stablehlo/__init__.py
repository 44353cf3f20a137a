"""disc_stablehlo: a dynamic-shape compiler for StableHLO. Compile once, run at every shape."""

from .compiler import CompiledFunction, compile
from .errors import CompileError, DiscError, RuntimeFailure, ShapeError, UnsupportedOpError

__all__ = ["CompileError", "CompiledFunction", "DiscError", "RuntimeFailure", "ShapeError", "UnsupportedOpError", "compile"]
