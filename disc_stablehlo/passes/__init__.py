"""The compiler passes (MLIR). torch-mlir is loaded through mlir_support first (see _load_mlir)."""

from .. import mlir_support  # noqa: F401
