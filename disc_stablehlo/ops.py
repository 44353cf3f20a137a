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
