"""disc_stablehlo: a dynamic-shape compiler for StableHLO. Compile once, run at every shape.

Importing the package, `load` and calling a loaded function need neither MLIR nor LLVM nor any
framework: the compiler is imported when `compile` is first called."""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it here)

from .compiler import compile
from .errors import ArtifactError, CompileError, DiscError, RuntimeFailure, ShapeError, UnsupportedOpError
from .runtime import CompiledFunction, collect_stats, load

__all__ = ["ArtifactError", "CompileError", "CompiledFunction", "DiscError", "RuntimeFailure", "ShapeError", "UnsupportedOpError",
           "collect_stats", "compile", "load"]
