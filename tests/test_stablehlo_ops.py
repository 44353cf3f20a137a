"""StableHLO ops given as text (forms JAX's CPU export does not produce), compiled once with
dynamic dims and checked against numpy at several sizes."""

from __future__ import annotations

import numpy as np
import pytest

import disc_stablehlo as disc


@pytest.mark.parametrize("left, lower, transpose, unit, elem", [
    (left, lower, transpose, unit, "f32") for left in (True, False) for lower in (True, False) for transpose in ("NO_TRANSPOSE", "TRANSPOSE")
    for unit in (False, True)] + [
    (left, lower, transpose, False, "complex<f32>") for left in (True, False) for lower in (True, False)
    for transpose in ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT")] + [(True, True, "ADJOINT", True, "complex<f64>")])
def test_triangular_solve(left, lower, transpose, unit, elem):
    a_type, b_type = f"tensor<?x?x{elem}>", f"tensor<?x3x{elem}>" if left else f"tensor<3x?x{elem}>"
    f = disc.compile(f"""func.func @main(%a: {a_type}, %b: {b_type}) -> {b_type} {{
      %0 = "stablehlo.triangular_solve"(%a, %b) {{left_side = {str(left).lower()}, lower = {str(lower).lower()},
          unit_diagonal = {str(unit).lower()}, transpose_a = #stablehlo<transpose {transpose}>}}
          : ({a_type}, {b_type}) -> {b_type}
      return %0 : {b_type}
    }}""")
    rng = np.random.default_rng(0)
    dtype = {"f32": np.float32, "complex<f32>": np.complex64, "complex<f64>": np.complex128}[elem]
    for m in (1, 4, 9):
        a = rng.standard_normal((m, m)) + 4 * np.eye(m)
        b = rng.standard_normal((m, 3) if left else (3, m))
        if elem != "f32":
            a, b = a + 1j * rng.standard_normal(a.shape), b - 1j * rng.standard_normal(b.shape)
        a, b = a.astype(dtype), b.astype(dtype)
        tri = np.tril(a) if lower else np.triu(a)
        if unit:
            np.fill_diagonal(tri, 1.0)
        op_a = {"NO_TRANSPOSE": tri, "TRANSPOSE": tri.T, "ADJOINT": tri.conj().T}[transpose]
        want = np.linalg.solve(op_a, b) if left else np.linalg.solve(op_a.T, b.T).T
        np.testing.assert_allclose(f(a, b), want, rtol=1e-4, atol=1e-4)


def test_identity_bitcast_of_complex():
    f = disc.compile("""func.func @main(%x: tensor<?xcomplex<f32>>) -> tensor<?xcomplex<f32>> {
      %0 = stablehlo.bitcast_convert %x : (tensor<?xcomplex<f32>>) -> tensor<?xcomplex<f32>>
      return %0 : tensor<?xcomplex<f32>>
    }""")
    x = (np.arange(5) + 2j).astype(np.complex64)
    np.testing.assert_array_equal(f(x), x)


def test_shape_vector_index_cast_converts_each_element():
    """An index_cast of a whole shape vector (TF's exporter emits them) converts every element;
    bufferized as is it would reinterpret 64-bit indices as 32-bit integers."""
    f = disc.compile("""func.func @main(%x: tensor<?x?x8xf32>) -> tensor<3xi32> {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c8 = arith.constant 8 : index
      %d0 = tensor.dim %x, %c0 : tensor<?x?x8xf32>
      %d1 = tensor.dim %x, %c1 : tensor<?x?x8xf32>
      %s = tensor.from_elements %d0, %d1, %c8 : tensor<3xindex>
      %0 = arith.index_cast %s : tensor<3xindex> to tensor<3xi32>
      return %0 : tensor<3xi32>
    }""")
    np.testing.assert_array_equal(f(np.zeros((2, 3, 8), np.float32)), [2, 3, 8])


def test_shape_dialect_broadcast_of_split_shapes():
    """Batched-matmul broadcasting as TF writes it: split_at, broadcast, concat, to_extent_tensor."""
    f = disc.compile("""func.func @main(%a: tensor<?x?x4xf32>, %b: tensor<?x4x?xf32>) -> tensor<?x?x?xf32> {
      %m2 = arith.constant -2 : index
      %sa = shape.shape_of %a : tensor<?x?x4xf32> -> tensor<3xindex>
      %sb = shape.shape_of %b : tensor<?x4x?xf32> -> tensor<3xindex>
      %ha, %ta = "shape.split_at"(%sa, %m2) : (tensor<3xindex>, index) -> (!shape.shape, !shape.shape)
      %hb, %tb = "shape.split_at"(%sb, %m2) : (tensor<3xindex>, index) -> (!shape.shape, !shape.shape)
      %h = shape.broadcast %ha, %hb : !shape.shape, !shape.shape -> !shape.shape
      %fa = shape.concat %h, %ta : !shape.shape, !shape.shape -> !shape.shape
      %fb = shape.concat %h, %tb : !shape.shape, !shape.shape -> !shape.shape
      %ea = shape.to_extent_tensor %fa : !shape.shape -> tensor<3xindex>
      %eb = shape.to_extent_tensor %fb : !shape.shape -> tensor<3xindex>
      %ba = stablehlo.dynamic_broadcast_in_dim %a, %ea, dims = [0, 1, 2] : (tensor<?x?x4xf32>, tensor<3xindex>) -> tensor<?x?x4xf32>
      %bb = stablehlo.dynamic_broadcast_in_dim %b, %eb, dims = [0, 1, 2] : (tensor<?x4x?xf32>, tensor<3xindex>) -> tensor<?x4x?xf32>
      %0 = stablehlo.dot_general %ba, %bb, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<?x?x4xf32>, tensor<?x4x?xf32>) -> tensor<?x?x?xf32>
      return %0 : tensor<?x?x?xf32>
    }""")
    rng = np.random.default_rng(0)
    for (ba, bb) in ((3, 3), (1, 3), (2, 1)):
        a, b = rng.random((ba, 5, 4), np.float32), rng.random((bb, 4, 6), np.float32)
        np.testing.assert_allclose(f(a, b), np.matmul(a, b), rtol=1e-5)


ZERO_SIZE = [
    ("dot_general", """func.func @main(%a: tensor<?x?xf32>, %b: tensor<?x3xf32>) -> tensor<?x3xf32> {
       %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<?x?xf32>, tensor<?x3xf32>) -> tensor<?x3xf32>
       return %0 : tensor<?x3xf32> }""", [((0, 4), (4, 3)), ((2, 0), (0, 3)), ((0, 0), (0, 3))], lambda a, b: a @ b),
    ("reduce", """func.func @main(%a: tensor<?x?xf32>) -> tensor<?xf32> {
       %z = stablehlo.constant dense<0.0> : tensor<f32>
       %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [1] : (tensor<?x?xf32>, tensor<f32>) -> tensor<?xf32>
       return %0 : tensor<?xf32> }""", [((0, 4),), ((3, 0),)], lambda a: a.sum(1)),
    ("sort", """func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {
       %0 = "stablehlo.sort"(%a) ({ ^bb0(%x: tensor<f32>, %y: tensor<f32>):
          %c = stablehlo.compare LT, %x, %y : (tensor<f32>, tensor<f32>) -> tensor<i1>
          stablehlo.return %c : tensor<i1> }) {dimension = 0 : i64, is_stable = true} : (tensor<?xf32>) -> tensor<?xf32>
       return %0 : tensor<?xf32> }""", [((0,),), ((1,),)], np.sort),
]


@pytest.mark.parametrize("name, text, shapes, ref", ZERO_SIZE, ids=[z[0] for z in ZERO_SIZE])
def test_zero_size_dims(name, text, shapes, ref):
    f = disc.compile(text)
    for shape in shapes:
        args = [np.random.default_rng(0).random(s).astype(np.float32) for s in shape]
        np.testing.assert_allclose(f(*args), ref(*args), rtol=1e-5)


@pytest.mark.parametrize("dtype, bits", [(np.float32, [0x7FC00123, 0xFFC00001, 0x7F800001, 0xFF800000]),
                                         (np.float64, [0x7FF8000000000123, 0xFFF4000000000000, 0x7FF0000000000001, 0x7FF0000000000000])])
def test_nan_constants_keep_their_sign_kind_and_payload(dtype, bits):
    """NaN constants with a payload, quiet or signalling, of either sign (and infinities) reach
    the result bit for bit: LLVM prints them as `+nan(0x123)` / `-snan(0x1)`, which the code
    generator's parser takes in its own form."""
    t = "f32" if dtype == np.float32 else "f64"
    uint = np.uint32 if dtype == np.float32 else np.uint64
    values = ", ".join(f"0x{b:0{2 * np.dtype(uint).itemsize}X}" for b in bits)
    f = disc.compile(f"""func.func @main(%a: tensor<4x{t}>) -> tensor<4x{t}> {{
      %c = stablehlo.constant dense<[{values}]> : tensor<4x{t}>
      %z = stablehlo.constant dense<0.0> : tensor<4x{t}>
      %p = stablehlo.compare GT, %a, %z : (tensor<4x{t}>, tensor<4x{t}>) -> tensor<4xi1>
      %0 = stablehlo.select %p, %a, %c : tensor<4xi1>, tensor<4x{t}>
      return %0 : tensor<4x{t}>
    }}""")
    np.testing.assert_array_equal(f(-np.ones(4, dtype)).view(uint), np.array(bits, uint))


def test_boolean_add_is_logical_or():
    """`add` of booleans is `or` (true + true = true), elementwise, in a reduction (`any`) and
    on constants that simplification folds."""
    f = disc.compile("""func.func @main(%a: tensor<?xi1>, %b: tensor<?xi1>) -> (tensor<?xi1>, tensor<i1>, tensor<i1>) {
      %0 = stablehlo.add %a, %b : tensor<?xi1>
      %f = stablehlo.constant dense<false> : tensor<i1>
      %1 = stablehlo.reduce(%a init: %f) applies stablehlo.add across dimensions = [0] : (tensor<?xi1>, tensor<i1>) -> tensor<i1>
      %t = stablehlo.constant dense<true> : tensor<i1>
      %2 = stablehlo.add %t, %t : tensor<i1>
      return %0, %1, %2 : tensor<?xi1>, tensor<i1>, tensor<i1>
    }""")
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    s, r, c = f(a, b)
    np.testing.assert_array_equal(s, a | b)
    assert bool(r) and bool(c)
    assert not bool(f(np.zeros(3, bool), np.zeros(3, bool))[1])


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_complex_extrema_compare_real_then_imaginary_parts(op):
    """Complex maximum / minimum order (real, imaginary) pairs lexicographically: equal real
    parts (0.0 and -0.0 too) leave the choice to the imaginary parts; the operand chosen comes
    back whole (the sign of its zero included)."""
    f = disc.compile(f"""func.func @main(%a: tensor<?xcomplex<f32>>, %b: tensor<?xcomplex<f32>>) -> tensor<?xcomplex<f32>> {{
      %0 = stablehlo.{op} %a, %b : tensor<?xcomplex<f32>>
      return %0 : tensor<?xcomplex<f32>>
    }}""")
    a = np.array([complex(0.0, 1), complex(-0.0, 1), 1 + 0j, 1 + 5j, 2 + 0j], np.complex64)
    b = np.array([complex(-0.0, 2), complex(0.0, 2), 1 + 1j, 0 + 9j, 3 - 1j], np.complex64)
    first = np.where(a.real == b.real, a.imag > b.imag, a.real > b.real)
    want = np.where(first if op == "maximum" else ~first & ((a.real != b.real) | (a.imag != b.imag)), a, b)
    got = f(a, b)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got.real), np.signbit(want.real))


def test_reduce_precision_rounds_like_the_narrower_formats_at_any_dims():
    """reduce_precision to e5m10 is a round trip through float16 for values in its normal range,
    to e8m7 one through bfloat16 (NaN, infinities and denormals included): rounding to nearest
    even on the bits; a NaN becomes infinity where no mantissa bit is left to hold it; with
    dynamic dims (upstream's lowering aborts on them)."""
    import ml_dtypes

    def compile_format(fmt):
        return disc.compile(f"""func.func @main(%a: tensor<?x?xf32>) -> tensor<?x?xf32> {{
          %0 = stablehlo.reduce_precision %a, format = {fmt} : tensor<?x?xf32>
          return %0 : tensor<?x?xf32>
        }}""")

    half, bf16, none = compile_format("e5m10"), compile_format("e8m7"), compile_format("e5m0")
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (3, 17)]:
        x = (rng.choice([-1, 1], shape) * rng.uniform(1, 2, shape) * np.exp2(rng.integers(-14, 15, shape))).astype(np.float32)
        np.testing.assert_array_equal(half(x), x.astype(np.float16).astype(np.float32))
        y = x.copy()
        y.flat[: min(4, y.size)] = [np.nan, np.inf, -np.inf, 1e-40][: min(4, y.size)]
        np.testing.assert_array_equal(bf16(y), y.astype(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(none(np.array([[np.nan, 1.5, -3.0, -3.5, 1e-30]], np.float32)), [[np.inf, 2.0, -2.0, -4.0, 0.0]])  # ties to even exponents


@pytest.mark.parametrize("src, dst, value", [
    ("f64", "f32", np.array([1.5, -2.25, np.pi], np.float64)),
    ("complex<f64>", "complex<f32>", np.array([1 + 2j, 3 - 4j], np.complex128)),
    ("f32", "f64", (np.arange(6, dtype=np.float32) + 0.5).reshape(3, 2)),
    ("i8", "i32", np.arange(-8, 8, dtype=np.int8).reshape(4, 4)),
    ("complex<f32>", "complex<f64>", np.array([[1 + 2j, 3 - 4j]], np.complex64)),
    ("ui64", "ui32", np.array([2**64 - 1, 2**40 + 5], np.uint64)),  # unsigned: a random generator's state
    ("ui16", "f32", np.arange(8, dtype=np.uint16).reshape(4, 2)),
])
def test_bitcasts_that_split_or_join_elements(src, dst, value):
    """A bitcast to a narrower type splits each element into the result's last dim, lowest bits
    first (numpy's view on this little-endian machine); to a wider one it joins the operand's
    last dim. With dynamic dims and complex types (upstream's conversion aborts or crashes)."""
    split = value.ndim == 1
    src_t = f"tensor<?x{src}>" if split else f"tensor<?x{value.shape[1]}x{src}>"
    want = (value[:, None] if split else value).view({"f32": np.float32, "f64": np.float64, "complex<f32>": np.complex64, "complex<f64>": np.complex128,
                       "i32": np.int32, "ui32": np.uint32}[dst])
    dst_t = f"tensor<?x{want.shape[1]}x{dst}>" if split else f"tensor<?x{dst}>"
    f = disc.compile(f"""func.func @main(%a: {src_t}) -> {dst_t} {{
      %0 = stablehlo.bitcast_convert %a : ({src_t}) -> {dst_t}
      return %0 : {dst_t}
    }}""")
    got = f(value)
    np.testing.assert_array_equal(got.view(np.uint8), (want if split else want.reshape(-1)).view(np.uint8))


@pytest.mark.parametrize("elem, dtype", [("complex<f32>", np.complex64), ("complex<f64>", np.complex128)])
def test_cbrt_of_complex_numbers_is_the_principal_root(elem, dtype):
    f = disc.compile(f"""func.func @main(%x: tensor<?x{elem}>) -> tensor<?x{elem}> {{
      %0 = stablehlo.cbrt %x : tensor<?x{elem}>
      return %0 : tensor<?x{elem}>
    }}""")
    z = np.array([8, -8 + 1j, -27, complex(-27, -0.0), 1j, 0, 3 - 4j, 1e-30 + 1e-30j], dtype)
    want = np.cbrt(np.abs(z)) * np.exp(1j * np.angle(z) / 3)
    np.testing.assert_allclose(f(z), want, rtol=1e-6 if dtype == np.complex64 else 1e-14, atol=0)
    assert f(z)[3].imag < 0 < f(z)[2].imag  # the sign of a zero imaginary part picks the side of the cut


def test_optimization_barrier_passes_its_operands_through():
    f = disc.compile("""func.func @main(%x: tensor<?xf32>, %n: tensor<i32>) -> (tensor<?xf32>, tensor<i32>) {
      %0:2 = stablehlo.optimization_barrier %x, %n : tensor<?xf32>, tensor<i32>
      %1 = stablehlo.multiply %0#0, %0#0 : tensor<?xf32>
      return %1, %0#1 : tensor<?xf32>, tensor<i32>
    }""")
    x = np.arange(5, dtype=np.float32)
    y, n = f(x, np.array(7, np.int32))
    np.testing.assert_array_equal(y, x * x)
    assert n == 7


def test_dot_general_with_an_algorithm():
    """A dot_general naming its algorithm (f32 operands, accumulation and products) with dynamic dims."""
    f = disc.compile("""func.func @main(%a: tensor<?x?x8xf32>, %b: tensor<?x8x?xf32>) -> tensor<?x?x?xf32> {
      %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1],
          algorithm = <lhs_precision_type = f32, rhs_precision_type = f32, accumulation_type = f32, lhs_component_count = 1,
                       rhs_component_count = 1, num_primitive_operations = 1, allow_imprecise_accumulation = false>
          : (tensor<?x?x8xf32>, tensor<?x8x?xf32>) -> tensor<?x?x?xf32>
      return %0 : tensor<?x?x?xf32>
    }""")
    rng = np.random.default_rng(0)
    for b, m, n in ((1, 1, 1), (2, 5, 3)):
        x, y = rng.standard_normal((b, m, 8)).astype(np.float32), rng.standard_normal((b, 8, n)).astype(np.float32)
        np.testing.assert_allclose(f(x, y), x @ y, rtol=1e-5, atol=1e-5)


def test_chlo_ragged_dot_with_a_dynamic_ragged_dim():
    """chlo.ragged_dot given as CHLO (rows of the dynamic lhs dim grouped by group_sizes, each group
    multiplied by its own rhs matrix)."""
    f = disc.compile("""func.func @main(%lhs: tensor<?x8xf32>, %rhs: tensor<3x8x4xf32>, %gs: tensor<3xi64>) -> tensor<?x4xf32> {
      %0 = "chlo.ragged_dot"(%lhs, %rhs, %gs) {ragged_dot_dimension_numbers = #chlo.ragged_dot<lhs_batching_dimensions = [],
          rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1],
          lhs_ragged_dimensions = [0], rhs_group_dimensions = [0]>,
          precision_config = [#chlo<precision DEFAULT>, #chlo<precision DEFAULT>]}
          : (tensor<?x8xf32>, tensor<3x8x4xf32>, tensor<3xi64>) -> tensor<?x4xf32>
      return %0 : tensor<?x4xf32>
    }""")
    rng = np.random.default_rng(1)
    rhs = rng.standard_normal((3, 8, 4)).astype(np.float32)
    for sizes in ((3, 5, 2), (0, 1, 0), (4, 0, 6)):
        lhs = rng.standard_normal((sum(sizes), 8)).astype(np.float32)
        starts = np.cumsum((0,) + sizes)
        want = np.concatenate([lhs[starts[g]:starts[g + 1]] @ rhs[g] for g in range(3)])
        np.testing.assert_allclose(f(lhs, rhs, np.array(sizes, np.int64)), want, rtol=1e-5, atol=1e-5)


def test_chlo_scan():
    """chlo.scan given as CHLO, over a dynamic dim: along dim 1 of a [?, ?] input and of a second
    input of another type, from the end (is_reverse), two carries, outputs of their own type."""
    f = disc.compile("""func.func @main(%x: tensor<?x?xf32>, %m: tensor<?x?xi32>, %s: tensor<?xf32>, %k: tensor<i32>)
        -> (tensor<?x?xf32>, tensor<?x?xi1>, tensor<?xf32>, tensor<i32>) {
      %0:4 = "chlo.scan"(%x, %m, %s, %k) <{dimension = 1 : i64, is_reverse = true,
          operandSegmentSizes = array<i32: 2, 2>, resultSegmentSizes = array<i32: 2, 2>}> ({
      ^bb0(%a: tensor<?xf32>, %b: tensor<?xi32>, %acc: tensor<?xf32>, %count: tensor<i32>):
        %w = stablehlo.convert %b : (tensor<?xi32>) -> tensor<?xf32>
        %p = stablehlo.multiply %a, %w : tensor<?xf32>
        %sum = stablehlo.add %acc, %p : tensor<?xf32>
        %zero = stablehlo.constant dense<0.0> : tensor<f32>
        %big = stablehlo.compare GT, %sum, %sum : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xi1>
        %one = stablehlo.constant dense<1> : tensor<i32>
        %next = stablehlo.add %count, %one : tensor<i32>
        stablehlo.return %sum, %big, %sum, %next : tensor<?xf32>, tensor<?xi1>, tensor<?xf32>, tensor<i32>
      }) : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xf32>, tensor<i32>) -> (tensor<?x?xf32>, tensor<?x?xi1>, tensor<?xf32>, tensor<i32>)
      return %0#0, %0#1, %0#2, %0#3 : tensor<?x?xf32>, tensor<?x?xi1>, tensor<?xf32>, tensor<i32>
    }""")
    rng = np.random.default_rng(0)
    for rows, steps in ((1, 1), (3, 5), (2, 0)):
        x = rng.standard_normal((rows, steps)).astype(np.float32)
        m = rng.integers(-2, 3, (rows, steps)).astype(np.int32)
        s = rng.standard_normal(rows).astype(np.float32)
        out, flags, acc, count = f(x, m, s, np.int32(7))
        want = s[:, None] + np.cumsum((x * m)[:, ::-1], axis=1)[:, ::-1]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        assert flags.shape == (rows, steps) and not flags.any()
        np.testing.assert_allclose(acc, want[:, 0] if steps else s, rtol=1e-5, atol=1e-5)
        assert int(count) == 7 + steps
