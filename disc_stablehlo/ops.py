"""StableHLO ops classified once; passes and checks query these sets."""

ELEMENTWISE = frozenset({
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "complex", "convert", "cosine", "count_leading_zeros",
    "divide", "exponential", "exponential_minus_one", "floor", "imag", "is_finite", "log", "log_plus_one", "logistic",
    "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt", "power", "real", "remainder", "round_nearest_afz",
    "round_nearest_even", "rsqrt", "select", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sine",
    "sqrt", "subtract", "tan", "tanh", "xor", "bitcast_convert",
})
BROADCAST = frozenset({"broadcast_in_dim", "dynamic_broadcast_in_dim", "broadcast"})
MOVEMENT = frozenset({"reshape", "dynamic_reshape", "transpose", "concatenate", "slice", "dynamic_slice", "real_dynamic_slice",
                      "pad", "dynamic_pad", "reverse", "gather", "dynamic_gather", "dynamic_update_slice", "scatter", "iota", "dynamic_iota"})
REDUCTION = frozenset({"reduce", "reduce_window", "sort", "select_and_scatter"})
COMPUTE_INTENSIVE = frozenset({"dot_general", "dot", "convolution"})
SHAPE_COMPUTATION = frozenset({"get_dimension_size", "custom_call"})
CONTROL_FLOW = frozenset({"while", "if", "case"})

DIALECTS_LEFT_TO_UPSTREAM = ("stablehlo.", "chlo.")
