"""The package's exception classes: every error a user can cause is one of these."""


class DiscError(Exception):
    """Base class of every error raised by disc_stablehlo."""


class CompileError(DiscError):
    """Compilation failed; the message names the op and its source location."""


class UnsupportedOpError(CompileError):
    """The module uses an op (or an op form) that disc_stablehlo cannot lower."""


class ShapeError(DiscError):
    """Call arguments do not match the compiled signature or its shape constraints.

    Raised before any kernel runs."""


class RuntimeFailure(DiscError):
    """The runtime (RAL) reported an error while a compiled function ran."""


class ArtifactError(DiscError):
    """A file is not a loadable artifact: truncated, corrupted, of another format or RAL version,
    or compiled for another target. The message says which; nothing of it was loaded."""
