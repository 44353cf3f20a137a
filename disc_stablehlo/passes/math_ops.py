"""Scalar math the vector libraries handle slowly.

`exp` of f32 below about -87 (results that are denormal or zero, e.g. softmax over masked
scores at -1e9) sends a whole vector of glibc's libmvec `expf` to its scalar fallback. Such
inputs are shifted up by 64 and the result scaled by exp(-64) instead (IEEE multiplication
rounds into the denormal range as exp would), so every lane stays on the vector path.

`powf` by a constant small whole exponent (GELU-tanh's `x ** 3`) is a call of libm's scalar
`powf` per element: it becomes multiplications.

A division by a value the innermost loop does not change (softmax's and layer norm's division
of a row by its sum or deviation) is a vector division per element, among the slowest vector
instructions: it becomes a multiplication by the reciprocal, computed once per row (`arcp`,
which LLVM's loop-invariant code motion hoists). The result may differ from the division by one
unit in the last place, as PyTorch's own softmax and layer norm do (they multiply by the
reciprocal too).

`maximum` / `minimum` of complex numbers compare (real, imaginary) pairs lexicographically, with
the imaginary parts deciding when the real parts are equal (0.0 and -0.0 included): upstream's
lowering lets a real part that is merely not smaller win.

`cbrt` of complex numbers (which upstream's lowering lacks) is the principal cube root, in polar
form: cbrt(|z|) * (cos(arg z / 3) + i sin(arg z / 3)), as the reference interpreter's
pow(z, 1/3) (0 stays 0; a negative real part with a -0.0 imaginary part takes the root below the
axis).

`add` of booleans is logical or in StableHLO (true + true = true), where the integer addition it
would otherwise become wraps (true + true = false): it becomes `or`, in reduction bodies too
(`any` over booleans is a reduce with `add`)."""

from __future__ import annotations

import math

from torch_mlir import ir

from ..mlir_support import broadcast_like, create_value, defined_outside, walk

_LOW = -80.0       # below this, the shifted path
_SHIFT = 64.0
_FLOOR = -87.0     # shifted inputs stay above libmvec's range limit (results there are 0 anyway)


def _const(value: float, t: ir.Type) -> ir.Value:
    return ir.Operation.create("arith.constant", results=[t], attributes={"value": ir.FloatAttr.get(t, value)}).result


def keep_exp_vectorised(module: ir.Module) -> int:
    """Rewrites every scalar f32 `math.exp`; returns how many."""
    f32 = ir.F32Type.get()
    count = 0
    for op in walk(module.operation):
        if op.name != "math.exp" or op.result.type != f32:
            continue
        x = op.operands[0]
        with ir.InsertionPoint(op), op.location:
            low = create_value("arith.cmpf", [x, _const(_LOW, f32)], ir.IntegerType.get_signless(1),
                      predicate=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 4))  # olt
            shifted = create_value("arith.maximumf", [create_value("arith.addf", [x, _const(_SHIFT, f32)], f32), _const(_FLOOR, f32)], f32)
            y = create_value("arith.select", [low, shifted, x], f32)
            e = create_value("math.exp", [y], f32)
            scaled = create_value("arith.mulf", [e, _const(math.exp(-_SHIFT), f32)], f32)
            result = create_value("arith.select", [low, scaled, e], f32)
        op.result.replace_all_uses_with(result)
        op.erase()
        count += 1
    return count


def integer_powers_as_products(module: ir.Module) -> int:
    """Rewrites `math.powf(x, n)` with n a constant 1, 2, 3 or 4 into products of x; returns how many."""
    count = 0
    for op in walk(module.operation):
        if op.name != "math.powf" or isinstance(op.operands[1].owner, ir.Block):
            continue
        exponent = op.operands[1].owner
        if exponent.name != "arith.constant" or not isinstance(exponent.attributes["value"], ir.FloatAttr):
            continue
        n = ir.FloatAttr(exponent.attributes["value"]).value
        if n not in (1.0, 2.0, 3.0, 4.0):
            continue
        x, t = op.operands[0], op.result.type
        with ir.InsertionPoint(op), op.location:
            result = x if n == 1 else create_value("arith.mulf", [x, x], t)
            if n > 2:
                result = create_value("arith.mulf", [result, x if n == 3 else result], t)
        op.result.replace_all_uses_with(result)
        op.erase()
        count += 1
    return count


def _innermost_loop(op: ir.Operation) -> ir.Operation | None:
    parent = op.parent
    while parent is not None and parent.name not in ("scf.for", "scf.parallel"):
        parent = parent.parent
    return parent


def reciprocals_of_row_divisors(module: ir.Module) -> int:
    """Marks every float division whose divisor is defined outside its innermost loop `arcp`;
    returns how many."""
    count = 0
    for op in walk(module.operation):
        if op.name == "arith.divf" and (loop := _innermost_loop(op)) is not None and defined_outside(op.operands[1], loop):
            op.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<arcp>")
            count += 1
    return count


def boolean_sums_as_or(module: ir.Module) -> int:
    """Rewrites every `stablehlo.add` of i1 tensors into `stablehlo.or`; returns how many."""
    count = 0
    for op in walk(module.operation):
        t = op.result.type if op.name == "stablehlo.add" else None
        if t is None or ir.RankedTensorType(t).element_type != ir.IntegerType.get_signless(1):
            continue
        with ir.InsertionPoint(op), op.location:
            result = create_value("stablehlo.or", list(op.operands), t)
        op.result.replace_all_uses_with(result)
        op.erase()
        count += 1
    return count


def _compare(direction: str, a: ir.Value, b: ir.Value) -> ir.Value:
    t = ir.RankedTensorType(a.type)
    return create_value("stablehlo.compare", [a, b], ir.RankedTensorType.get(t.shape, ir.IntegerType.get_signless(1)),
                        comparison_direction=ir.Attribute.parse(f"#stablehlo<comparison_direction {direction}>"),
                        compare_type=ir.Attribute.parse("#stablehlo<comparison_type FLOAT>"))


def complex_extrema_lexicographic(module: ir.Module) -> int:
    """Rewrites complex `maximum` / `minimum` into comparisons of the parts and selects; returns
    how many."""
    count = 0
    for op in walk(module.operation):
        if op.name not in ("stablehlo.maximum", "stablehlo.minimum"):
            continue
        t = ir.RankedTensorType(op.result.type)
        if not isinstance(t.element_type, ir.ComplexType):
            continue
        direction = "GT" if op.name == "stablehlo.maximum" else "LT"
        part_t = ir.RankedTensorType.get(t.shape, ir.ComplexType(t.element_type).element_type)
        a, b = op.operands
        with ir.InsertionPoint(op), op.location:
            (ra, ia), (rb, ib) = ((create_value("stablehlo.real", [v], part_t), create_value("stablehlo.imag", [v], part_t)) for v in (a, b))
            first = create_value("stablehlo.select", [_compare("EQ", ra, rb), _compare(direction, ia, ib), _compare(direction, ra, rb)],
                                 ir.RankedTensorType.get(t.shape, ir.IntegerType.get_signless(1)))
            result = create_value("stablehlo.select", [first, a, b], t)
        op.result.replace_all_uses_with(result)
        op.erase()
        count += 1
    return count


def complex_cbrt_polar(module: ir.Module) -> int:
    """Rewrites `cbrt` of complex numbers in polar form; returns how many."""
    count = 0
    for op in walk(module.operation):
        t = ir.RankedTensorType(op.result.type) if op.name == "stablehlo.cbrt" else None
        if t is None or not isinstance(t.element_type, ir.ComplexType):
            continue
        part = ir.ComplexType(t.element_type).element_type
        part_t = ir.RankedTensorType.get(t.shape, part)
        z = op.operands[0]
        with ir.InsertionPoint(op), op.location:
            def unary(name: str, x: ir.Value) -> ir.Value:
                return create_value(f"stablehlo.{name}", [x], part_t)

            def binary(name: str, x: ir.Value, y: ir.Value) -> ir.Value:
                return create_value(f"stablehlo.{name}", [x, y], part_t)
            scalar_t = ir.RankedTensorType.get([], part)
            third = broadcast_like(create_value("stablehlo.constant", [], scalar_t,
                                                value=ir.DenseElementsAttr.get_splat(scalar_t, ir.FloatAttr.get(part, 1 / 3))), z)
            angle = binary("multiply", binary("atan2", unary("imag", z), unary("real", z)), third)
            radius = unary("cbrt", unary("abs", z))
            result = create_value("stablehlo.complex", [binary("multiply", radius, unary("cosine", angle)),
                                                        binary("multiply", radius, unary("sine", angle))], t)
        op.result.replace_all_uses_with(result)
        op.erase()
        count += 1
    return count
