"""StableHLO ops classified once; passes and checks query these sets."""

ELEMENTWISE = frozenset({
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "complex", "convert", "cosine", "count_leading_zeros",
    "divide", "exponential", "exponential_minus_one", "floor", "imag", "is_finite", "log", "log_plus_one", "logistic",
    "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt", "power", "real", "remainder", "round_nearest_afz",
    "round_nearest_even", "rsqrt", "select", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sine",
    "sqrt", "subtract", "tan", "tanh", "xor", "bitcast_convert",
})

DIALECTS_LEFT_TO_UPSTREAM = ("stablehlo.", "chlo.")

# our own custom call for chlo.top_k (passes/top_k.py), `k` in this attribute
TOP_K_TARGET, TOP_K_ATTR = "disc.top_k", "disc.k"
# the grouped GEMM of mixture-of-experts layers (PyTorch's, import/torch_ops.py): (input [S, K],
# weights [G, K, N], i64 offsets [G]) -> [S, N]; passes/library_calls.py calls the RAL's
GROUPED_GEMM_TARGET = "disc.grouped_gemm"

# an assertion over values computed in the call (PyTorch's over sizes read from the data,
# import/torch_ops.py): (tensor<i1>) -> (), `error_message` its text; passes/dynamic_ops.py ends
# the call with a ShapeError where the condition is false
ASSERT_TARGET = "disc.assert"

# a Fourier transform along the last signal dim of PyTorch's (import/torch_ops.py), complex values
# as (real, imaginary) pairs in a trailing dim of 2: (x, i64 n) -> y, its kind (0 FFT, 1 IFFT,
# 2 RFFT, 3 IRFFT: stablehlo.fft's) in the attribute; passes/fft.py calls the RAL's FFT
FFT_TARGET, FFT_KIND_ATTR = "disc.fft", "disc.fft_kind"
FFT_KINDS = {"FFT": 0, "IFFT": 1, "RFFT": 2, "IRFFT": 3}  # also the RAL's disc_ral_fft's `kind`

# JAX's LAPACK custom calls on the CPU (`lapack_<s|d|c|z><routine>_ffi`): passes/lapack.py lowers
# them to the RAL's disc_ral_lapack; the routine's code there, by its real and complex names
LAPACK_ROUTINES = {"getrf": 0, "potrf": 1, "geqrf": 2, "orgqr": 3, "ungqr": 3, "trsm": 4, "syevd": 5, "heevd": 5,
                   "gesdd": 6, "gesvd": 7, "geev": 8}
LAPACK_TYPES = "sdcz"  # disc_ral_lapack's `type`: f32, f64, complex<f32>, complex<f64>


def lapack_routine(target: str) -> tuple[str, int] | None:
    """The routine and type code of a LAPACK custom call's target name (None: not one)."""
    if not (target.startswith("lapack_") and target.endswith("_ffi")) or len(target) < 12:
        return None
    letter, routine = target[7], target[8:-4]
    if letter not in LAPACK_TYPES or routine not in LAPACK_ROUTINES:
        return None
    return routine, LAPACK_TYPES.index(letter)


def lapack_result_dims(routine: str, complex_: bool, mode: str, a: list, b: list, k, given) -> list[list]:
    """The dims of each result of a LAPACK call, from those of its first operand `a` (batch dims,
    then the matrix's m x n), its second `b` (trsm's right-hand sides), k = min(m, n) and
    `given(i)`: result i's dims as the call states them (used only where the routine leaves them
    open: the vectors an SVD does not compute). Works on any dim values (symbolic or SSA)."""
    *batch, m, n = a
    vectors = batch + [n]
    if routine == "getrf":
        return [a, batch + [k], batch]
    if routine == "potrf":
        return [a, batch]
    if routine == "geqrf":
        return [a, batch + [k]]
    if routine in ("orgqr", "ungqr"):
        return [a]
    if routine == "trsm":
        return [b]
    if routine in ("syevd", "heevd"):
        return [a, vectors, batch]
    if routine in ("gesdd", "gesvd"):
        u = {"A": [m, m], "S": [m, k]}.get(mode) or given(2)[-2:]
        vt = {"A": [n, n], "S": [k, n]}.get(mode) or given(3)[-2:]
        return [a, batch + [k], batch + u, batch + vt, batch]
    # geev: values (real: real and imaginary parts), left and right vectors, info
    return [vectors, a, a, batch] if complex_ else [vectors, vectors, a, a, batch]
