"""Symbolic shapes of a compiled function: its signature (dims as ints or dimension variables),
the shape analysis and constraints (`analysis`, `constraints`, `symbolic`) and the run-time guards
generated from them (`guards`). Only the signature is imported here: the run-time side needs it
without MLIR."""

from .signature import ArgSpec, Assertion, Signature

__all__ = ["ArgSpec", "Assertion", "Signature"]
