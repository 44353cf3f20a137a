"""Symbolic shapes of a compiled function: its signature (dims as ints or dimension variables)
and the run-time guards generated from the shape constraints."""

from .guards import extract_guard
from .signature import ArgSpec, Signature, signature_from_function

__all__ = ["ArgSpec", "Signature", "extract_guard", "signature_from_function"]
