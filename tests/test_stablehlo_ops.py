"""StableHLO ops given as text (forms JAX's CPU export does not produce), compiled once with
dynamic dims and checked against numpy at several sizes."""

from __future__ import annotations

import numpy as np
import pytest

import disc_stablehlo as disc


@pytest.mark.parametrize("left, lower, transpose, unit", [
    (left, lower, transpose, unit) for left in (True, False) for lower in (True, False) for transpose in (False, True) for unit in (False, True)])
def test_triangular_solve(left, lower, transpose, unit):
    b_type = "tensor<?x3xf32>" if left else "tensor<3x?xf32>"
    f = disc.compile(f"""func.func @main(%a: tensor<?x?xf32>, %b: {b_type}) -> {b_type} {{
      %0 = "stablehlo.triangular_solve"(%a, %b) {{left_side = {str(left).lower()}, lower = {str(lower).lower()},
          unit_diagonal = {str(unit).lower()}, transpose_a = #stablehlo<transpose {'TRANSPOSE' if transpose else 'NO_TRANSPOSE'}>}}
          : (tensor<?x?xf32>, {b_type}) -> {b_type}
      return %0 : {b_type}
    }}""")
    rng = np.random.default_rng(0)
    for m in (1, 4, 9):
        a = (rng.standard_normal((m, m)) + 4 * np.eye(m)).astype(np.float32)
        b = rng.standard_normal((m, 3) if left else (3, m)).astype(np.float32)
        tri = np.tril(a) if lower else np.triu(a)
        if unit:
            np.fill_diagonal(tri, 1.0)
        op_a = tri.T if transpose else tri
        want = np.linalg.solve(op_a, b) if left else np.linalg.solve(op_a.T, b.T).T
        np.testing.assert_allclose(f(a, b), want, rtol=1e-4, atol=1e-4)


def test_identity_bitcast_of_complex():
    f = disc.compile("""func.func @main(%x: tensor<?xcomplex<f32>>) -> tensor<?xcomplex<f32>> {
      %0 = stablehlo.bitcast_convert %x : (tensor<?xcomplex<f32>>) -> tensor<?xcomplex<f32>>
      return %0 : tensor<?xcomplex<f32>>
    }""")
    x = (np.arange(5) + 2j).astype(np.complex64)
    np.testing.assert_array_equal(f(x), x)

