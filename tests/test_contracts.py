"""Run-time shape contracts: what an op assumes of its operands' dims and the analysis cannot
prove is checked in the host code before the kernels that rely on it, and a violation is a
ShapeError naming the op, its location and the values seen, never a read or write past a
buffer. The same programs with valid shapes give numpy's results."""

from __future__ import annotations

import numpy as np
import pytest

import disc_stablehlo as disc

CASES = {
    "elementwise operands": ("""
      func.func @main(%x: tensor<?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
        %0 = stablehlo.add %x, %y : tensor<?xf32>
        return %0 : tensor<?xf32>
      }""", [np.ones(3, np.float32), np.arange(3, dtype=np.float32)], lambda x, y: x + y,
        [np.ones(2, np.float32), np.ones(100000, np.float32)],
        r"stablehlo.add at .*: arg0 dim 0 is 2, but arg1 dim 0 is 100000 \(stablehlo.add operands"),
    "dot contracting dims": ("""
      func.func @main(%x: tensor<?x?xf32>, %y: tensor<?x?xf32>) -> tensor<?x?xf32> {
        %0 = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0] : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
        return %0 : tensor<?x?xf32>
      }""", [np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)], lambda x, y: x @ y,
        [np.ones((2, 3), np.float32), np.ones((5000, 4), np.float32)], r"stablehlo.dot_general at .*is 3, but .*is 5000"),
    "dynamic_slice larger than its operand": ("""
      func.func @main(%x: tensor<?xf32>, %i: tensor<i32>) -> tensor<4xf32> {
        %0 = stablehlo.dynamic_slice %x, %i, sizes = [4] : (tensor<?xf32>, tensor<i32>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }""", [np.arange(6, dtype=np.float32), np.array(5, np.int32)], lambda x, i: x[2:6],  # the start is clamped
        [np.arange(2, dtype=np.float32), np.array(0, np.int32)], r"stablehlo.dynamic_slice at .*: slice size 4 of dim 0 exceeds the operand's size 2"),
    "dynamic_update_slice larger than its operand": ("""
      func.func @main(%x: tensor<?xf32>, %u: tensor<?xf32>, %i: tensor<i32>) -> tensor<?xf32> {
        %0 = stablehlo.dynamic_update_slice %x, %u, %i : (tensor<?xf32>, tensor<?xf32>, tensor<i32>) -> tensor<?xf32>
        return %0 : tensor<?xf32>
      }""", [np.zeros(5, np.float32), np.ones(2, np.float32), np.array(1, np.int32)], lambda x, u, i: np.array([0, 1, 1, 0, 0], np.float32),
        [np.zeros(2, np.float32), np.ones(100000, np.float32), np.array(0, np.int32)],
        r"stablehlo.dynamic_update_slice at .*: the update's dim 0 \(100000\) exceeds the operand's \(2\)"),
    "dynamic_reshape to another element count": ("""
      func.func @main(%x: tensor<?xf32>, %s: tensor<2xi32>) -> tensor<?x?xf32> {
        %0 = stablehlo.dynamic_reshape %x, %s : (tensor<?xf32>, tensor<2xi32>) -> tensor<?x?xf32>
        return %0 : tensor<?x?xf32>
      }""", [np.arange(6, dtype=np.float32), np.array([2, 3], np.int32)], lambda x, s: x.reshape(2, 3),
        [np.arange(6, dtype=np.float32), np.array([4, 4], np.int32)], r"stablehlo.dynamic_reshape at .*: the operand has 6 elements, the result shape 16"),
    "dynamic_reshape to a negative dim": ("""
      func.func @main(%x: tensor<?xf32>, %s: tensor<2xi32>) -> tensor<?x?xf32> {
        %0 = stablehlo.dynamic_reshape %x, %s : (tensor<?xf32>, tensor<2xi32>) -> tensor<?x?xf32>
        return %0 : tensor<?x?xf32>
      }""", [np.arange(6, dtype=np.float32), np.array([3, 2], np.int32)], lambda x, s: x.reshape(3, 2),
        [np.arange(6, dtype=np.float32), np.array([-2, -3], np.int32)], r"result dim 0 is -2, negative"),
    "dynamic_broadcast_in_dim of incompatible dims": ("""
      func.func @main(%x: tensor<?x4xf32>, %y: tensor<?x4xf32>) -> tensor<?x4xf32> {
        %s = stablehlo.get_dimension_size %y, dim = 0 : (tensor<?x4xf32>) -> tensor<i32>
        %r = stablehlo.reshape %s : (tensor<i32>) -> tensor<1xi32>
        %c = stablehlo.constant dense<4> : tensor<1xi32>
        %shape = stablehlo.concatenate %r, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
        %b = stablehlo.dynamic_broadcast_in_dim %x, %shape, dims = [0, 1] : (tensor<?x4xf32>, tensor<2xi32>) -> tensor<?x4xf32>
        %0 = stablehlo.add %b, %y : tensor<?x4xf32>
        return %0 : tensor<?x4xf32>
      }""", [np.ones((1, 4), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)], lambda x, y: x + y,
        [np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)],
        r"stablehlo.dynamic_broadcast_in_dim at .*: operand dim 0 is 2, result dim 0 is 3 \(the operand's must be 1 or the same\)"),
    "broadcast_in_dim of a dynamic dim": ("""
      func.func @main(%x: tensor<?xf32>) -> tensor<2x3xf32> {
        %0 = stablehlo.broadcast_in_dim %x, dims = [1] : (tensor<?xf32>) -> tensor<2x3xf32>
        return %0 : tensor<2x3xf32>
      }""", [np.array([5], np.float32)], lambda x: np.broadcast_to(x, (2, 3)),  # 1 at run time: it expands
        [np.arange(2, dtype=np.float32)], r"stablehlo.broadcast_in_dim at .*: operand dim 0 is 2, result dim 1 is 3"),
    "checks at the entry and at an op in one program": ("""
      func.func @main(%x: tensor<?xf32>, %y: tensor<?xf32>, %i: tensor<i32>) -> tensor<2xf32> {
        %0 = stablehlo.add %x, %y : tensor<?xf32>
        %1 = stablehlo.dynamic_slice %0, %i, sizes = [2] : (tensor<?xf32>, tensor<i32>) -> tensor<2xf32>
        return %1 : tensor<2xf32>
      }""", [np.arange(3, dtype=np.float32), np.ones(3, np.float32), np.array(1, np.int32)], lambda x, y, i: (x + y)[1:3],
        [np.ones(1, np.float32), np.ones(1, np.float32), np.array(0, np.int32)], r"stablehlo.dynamic_slice at .*: slice size 2 of dim 0"),
    "several checks of both kinds": ("""
      func.func @main(%x: tensor<?xf32>, %y: tensor<?xf32>, %z: tensor<?xf32>, %i: tensor<i32>) -> tensor<2xf32> {
        %0 = stablehlo.add %x, %y : tensor<?xf32>
        %1 = stablehlo.multiply %0, %z : tensor<?xf32>
        %2 = stablehlo.dynamic_slice %1, %i, sizes = [2] : (tensor<?xf32>, tensor<i32>) -> tensor<2xf32>
        %3 = stablehlo.dynamic_slice %0, %i, sizes = [2] : (tensor<?xf32>, tensor<i32>) -> tensor<2xf32>
        %4 = stablehlo.add %2, %3 : tensor<2xf32>
        return %4 : tensor<2xf32>
      }""", [np.arange(3, dtype=np.float32), np.ones(3, np.float32), np.full(3, 2, np.float32), np.array(0, np.int32)],
        lambda x, y, z, i: ((x + y) * z + (x + y))[:2],
        [np.ones(3, np.float32), np.ones(3, np.float32), np.ones(4, np.float32), np.array(0, np.int32)],
        r"stablehlo.multiply at .*is 3, but .*is 4"),
    "real_dynamic_slice past its operand": ("""
      func.func @main(%x: tensor<?xf32>, %a: tensor<1xi64>, %b: tensor<1xi64>, %c: tensor<1xi64>) -> tensor<?xf32> {
        %0 = stablehlo.real_dynamic_slice %x, %a, %b, %c : (tensor<?xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<?xf32>
        return %0 : tensor<?xf32>
      }""", [np.arange(8, dtype=np.float32), np.array([1], np.int64), np.array([7], np.int64), np.array([2], np.int64)],
        lambda x, a, b, c: x[1:7:2],
        [np.arange(4, dtype=np.float32), np.array([2], np.int64), np.array([100], np.int64), np.array([1], np.int64)],
        r"stablehlo.real_dynamic_slice at .*: limit 100 of dim 0 exceeds the operand's size 4"),
}


@pytest.mark.parametrize("name", CASES)
def test_a_violated_contract_is_a_shape_error_before_any_kernel(name):
    text, good, reference, bad, message = CASES[name]
    f = disc.compile(text)
    np.testing.assert_allclose(np.asarray(f(*good)), reference(*good))
    with pytest.raises(disc.ShapeError, match=message):
        f(*bad)
    np.testing.assert_allclose(np.asarray(f(*good)), reference(*good))  # the next call works


def test_the_shape_report_lists_what_is_checked_and_what_is_proved():
    """An equality the ops assume of the arguments' dims is checked; one the frontend's symbolic
    dims already state (JAX: the same name) is proved, and no check is emitted."""
    import jax
    import jax.numpy as jnp

    f = disc.compile(CASES["elementwise operands"][0])
    assert "stablehlo.add at" in f.shape_report().split("checked at run time")[1].splitlines()[1]
    b = jax.export.symbolic_shape("b")[0]
    g = disc.compile(lambda x, y: x + y, *[jax.ShapeDtypeStruct((b,), jnp.float32)] * 2)
    report = g.shape_report()
    assert "(nothing: the facts prove every op's contract)" in report.split("checked at run time")[1]
    assert "disc_ral_check_shape" not in g.llvm_ir
