"""Empty op-class modules for the dialects torch-mlir's wheel registers without Python op
classes (StableHLO, CHLO). The MLIR bindings look a dialect's module up each time they wrap
one of its ops and, not finding one, search again on every op: a search that found this
package's module is remembered, so wrapping ops costs a dictionary lookup instead of an import
attempt (about 5 % of the encoder layer's compilation)."""
