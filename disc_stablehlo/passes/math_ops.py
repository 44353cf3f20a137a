"""Scalar math the vector libraries handle slowly.

`exp` of f32 (softmax, GELU's erfc, sigmoid) is computed inline, where it was a call of glibc's
libmvec `expf`: a call clobbers every vector register (the loop reloads its constants after each
one), and inputs below about -87 (softmax over scores masked at -1e9) sent the call's whole
vector to a scalar fallback. exp(x) = 2^n exp(r) with n = round(x / ln 2) and r = x - n ln 2
(ln 2 in two parts, the first with few enough bits that n times it is exact), exp(r) a polynomial
of degree 6 on |r| <= ln(2) / 2 (fitted here for relative error: 3e-9, about 0.05 units in the
last place) and 2^n applied as two powers of two, so that results in the denormal range round
once, as IEEE multiplication does. Inputs below -150 ln 2 give 0 (exp rounds to 0 there) without
being computed: their product would be denormal or zero, and each such vector costs the CPU a
microcode assist (softmax over scores masked at -1e9: 40 % of its time). Inputs above 89 are
clamped (inf after rounding); NaN stays NaN through the arithmetic itself: n is rounded by adding
and subtracting 1.5 * 2^23 and its integer read from the sum's bits, with no float-to-integer
conversion (whose result for NaN is undefined in LLVM), so NaN needs no compare and select of
its own (exp over a (1024, 1024) array 24-33 -> 36-37 GB/s).

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

A float multiplication feeding an addition or subtraction may become one fused multiply-add
(`contract` on LLVM's `fmul`, `fadd` and `fsub`): polynomials (erf, erfc, exp's reductions) take
half the instructions and round once per step instead of twice, as XLA's CPU and GPU back ends and
C compilers' default contraction do (GELU's erfc: 1.4x faster, and its results within 4e-7 of
XLA's relative to each value, where separate roundings were 3e-3 apart).

A float converted to an integer type that cannot hold it (out of range, infinite, NaN) saturates
to the type's extremes, NaN to 0, as XLA's back ends convert: LLVM's conversion gives poison there
(on x86 the "integer indefinite", 0x80...0, whatever the sign).

`add` of booleans is logical or in StableHLO (true + true = true), where the integer addition it
would otherwise become wraps (true + true = false): it becomes `or`, in reduction bodies too
(`any` over booleans is a reduce with `add`)."""

from __future__ import annotations

import math

from torch_mlir import ir

from ..mlir_support import broadcast_like, create_value, defined_outside, walk

_EXP_RANGE = (-103.97208404541016, 89.0)  # the largest f32 below -150 ln 2; exp is inf above 89
_ROUNDING, _ROUNDING_BITS = 12582912.0, 0x4B400000  # 1.5 * 2^23 and its bits
_LN2_HI, _LN2_LO = 0.693145751953125, 1.4286068202862268e-06  # 16 significant bits, and the rest of ln 2
# exp(r) = 1 + r + r^2 (c2 + c3 r + ... + c6 r^4), a weighted least-squares fit (nearly minimax in
# relative error) on |r| <= ln(2) / 2
_EXP_POLY = (0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368710055947304, 0.001381461275741458)


def _const(value: float, t: ir.Type) -> ir.Value:
    attr = ir.IntegerAttr.get(t, int(value)) if isinstance(t, ir.IntegerType) else ir.FloatAttr.get(t, value)
    return ir.Operation.create("arith.constant", results=[t], attributes={"value": attr}).result


def _exp_f32(x: ir.Value) -> ir.Value:
    """exp(x) of a scalar f32 as arithmetic (see the module's docstring)."""
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)

    def f(name: str, *operands: ir.Value) -> ir.Value:
        return create_value(name, list(operands), f32)

    def i(name: str, *operands: ir.Value) -> ir.Value:
        return create_value(name, list(operands), i32)

    lo, hi = _EXP_RANGE
    i1 = ir.IntegerType.get_signless(1)
    below = create_value("arith.cmpf", [x, _const(lo, f32)], i1, predicate=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 4))  # olt
    clamped = f("arith.select", below, _const(0.0, f32), f("arith.minimumf", x, _const(hi, f32)))
    # n = x / ln 2 rounded to the nearest integer by adding and subtracting 1.5 * 2^23 (whose ulp is
    # 1), and k, its integer, from the sum's bits: no float-to-integer conversion, whose result for
    # a NaN is undefined (poison) in LLVM, so a NaN needs no select of its own: it stays NaN through
    # the polynomial
    shifted = f("arith.addf", f("arith.mulf", clamped, _const(1 / math.log(2), f32)), _const(_ROUNDING, f32))
    n = f("arith.subf", shifted, _const(_ROUNDING, f32))
    r = f("arith.subf", f("arith.subf", clamped, f("arith.mulf", n, _const(_LN2_HI, f32))), f("arith.mulf", n, _const(_LN2_LO, f32)))
    poly = _const(_EXP_POLY[-1], f32)
    for c in reversed(_EXP_POLY[:-1]):
        poly = f("arith.addf", f("arith.mulf", poly, r), _const(c, f32))
    e_r = f("arith.addf", f("arith.addf", f("arith.mulf", f("arith.mulf", r, r), poly), r), _const(1.0, f32))
    k = i("arith.subi", i("arith.bitcast", shifted), _const(_ROUNDING_BITS, i32))
    half = i("arith.shrsi", k, _const(1, i32))
    for part in (half, i("arith.subi", k, half)):  # 2^half * 2^(k - half): both normal for k in [-150, 128]
        power = f("arith.bitcast", i("arith.shli", i("arith.addi", part, _const(127, i32)), _const(23, i32)))
        e_r = f("arith.mulf", e_r, power)
    return f("arith.select", below, _const(0.0, f32), e_r)


def exp_inline(module: ir.Module) -> int:
    """Rewrites every scalar f32 `math.exp` into arithmetic; returns how many."""
    f32 = ir.F32Type.get()
    count = 0
    for op in walk(module.operation):
        if op.name != "math.exp" or op.result.type != f32:
            continue
        with ir.InsertionPoint(op), op.location:
            result = _exp_f32(op.operands[0])
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


CONTRACTED = ("llvm.fmul", "llvm.fadd", "llvm.fsub")


def contract(op: ir.Operation, parsed: dict[str, ir.Attribute]) -> None:
    """Adds `contract` to the fast-math flags of an LLVM float multiplication, addition or
    subtraction, keeping the flags it has (`parsed`: flags -> the same with contract, shared by
    the calls of one walk)."""
    flags = str(op.attributes["fastmathFlags"]) if "fastmathFlags" in op.attributes else "#llvm.fastmath<none>"
    if flags not in parsed:
        kept = [f for f in flags[flags.index("<") + 1:-1].replace(" ", "").split(",") if f not in ("none", "contract", "")]
        parsed[flags] = ir.Attribute.parse(f"#llvm.fastmath<{', '.join(kept + ['contract'])}>")
    op.attributes["fastmathFlags"] = parsed[flags]


def contract_float_arithmetic(module: ir.Module) -> None:
    """`contract` on every LLVM float multiplication, addition and subtraction of `module`."""
    parsed: dict[str, ir.Attribute] = {}
    for op in walk(module.operation):
        if op.name in CONTRACTED:
            contract(op, parsed)


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


_OGE, _OLT, _UNO = 3, 4, 14  # arith.cmpf predicates


def saturating_float_to_int(module: ir.Module) -> int:
    """Each scalar `arith.fptosi` / `fptoui` from a float of 16 bits or more followed by the
    selects that saturate it (see the module's docstring); returns how many."""
    count = 0
    i1, i64 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(64)
    for op in walk(module.operation):
        if op.name not in ("arith.fptosi", "arith.fptoui") or not isinstance(op.result.type, ir.IntegerType):
            continue
        x, t = op.operands[0], op.result.type
        width = ir.IntegerType(t).width
        if width == 1 or not isinstance(x.type, ir.FloatType) or ir.FloatType(x.type).width < 16:
            continue
        signed = op.name == "arith.fptosi"
        low, high = (-(1 << (width - 1)), 1 << (width - 1)) if signed else (0, 1 << width)
        largest = 65504.0 if str(x.type) == "f16" else math.inf  # the bounds (powers of two up to 2^64) fit the others

        def compare(predicate: int, bound: float) -> ir.Value:
            bound = math.copysign(math.inf, bound) if abs(bound) > largest else bound
            return create_value("arith.cmpf", [x, _const(bound, x.type)], i1, predicate=ir.IntegerAttr.get(i64, predicate))
        with ir.InsertionPoint.after(op), op.location:
            above, below = compare(_OGE, high), compare(_OLT, low)
            nan = create_value("arith.cmpf", [x, x], i1, predicate=ir.IntegerAttr.get(i64, _UNO))
            most = high - 1 if signed else -1  # (written signed: the unsigned maximum's bits)
            first = create_value("arith.select", [above, _const(most, t), op.result], t)
            result = create_value("arith.select", [nan, _const(0, t), create_value("arith.select", [below, _const(low, t), first], t)], t)
        op.result.replace_all_uses_with(result)
        first.owner.operands[2] = op.result
        count += 1
    return count
