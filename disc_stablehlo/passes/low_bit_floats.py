"""Floats of 8, 6 and 4 bits (f8E4M3FN, f8E5M2, the FNUZ variants, f8E3M4, f8E4M3, f8E8M0FNU,
f6E2M3FN, f6E3M2FN, f4E2M1FN): stored as their bits (a byte per element, the value in its low
bits: ml_dtypes' layout), computed in f32.

LLVM has none of these types: upstream passes compute every arith and math op on them in f32
(`arith-emulate-unsupported-floats`, `math-extend-to-supported-types`: the operands extended, the
result truncated), which leaves the conversions. Those become integer code here, per format:
decoding (exact: every value of these formats is an f32) and encoding from f32, with each
format's rules as ml_dtypes has them: rounding to nearest even (f8E8M0FNU: halves up; below
2^-126, anything above 2^-127 up), infinities and NaNs where the format has them, NaN for what
overflows a format with NaN and no infinity, the largest finite value for one with neither (whose
NaN becomes a zero of the opposite sign), no negative zero in the FNUZ formats, and NaN for zero
and negative values in f8E8M0FNU (powers of two only). Wider sources are rounded to f32 first, as
ml_dtypes converts them (numpy's casts from float64 go through float32)."""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from ..errors import UnsupportedOpError
from ..mlir_support import walk
from .lower import Text


@dataclasses.dataclass(frozen=True)
class Format:
    exponent: int
    mantissa: int
    bias: int
    kind: str  # "ieee" (infinities, NaNs), "fn" (NaN: all ones), "fnuz" (NaN: -0's bits), "finite", "e8m0"

    @property
    def width(self) -> int:
        return (0 if self.kind == "e8m0" else 1) + self.exponent + self.mantissa

    @property
    def max_code(self) -> int:
        """The largest finite value's bits, sign excluded."""
        e, m = self.exponent, self.mantissa
        return {"ieee": ((2 ** e - 2) << m) | (2 ** m - 1), "fn": ((2 ** e - 1) << m) | (2 ** m - 2), "fnuz": 2 ** (e + m) - 1,
                "finite": 2 ** (e + m) - 1, "e8m0": 0xFE}[self.kind]


FORMATS = {
    "f8E4M3FN": Format(4, 3, 7, "fn"), "f8E5M2": Format(5, 2, 15, "ieee"), "f8E4M3FNUZ": Format(4, 3, 8, "fnuz"),
    "f8E5M2FNUZ": Format(5, 2, 16, "fnuz"), "f8E4M3B11FNUZ": Format(4, 3, 11, "fnuz"), "f8E3M4": Format(3, 4, 3, "ieee"),
    "f8E4M3": Format(4, 3, 7, "ieee"), "f8E8M0FNU": Format(8, 0, 127, "e8m0"), "f6E2M3FN": Format(2, 3, 1, "finite"),
    "f6E3M2FN": Format(3, 2, 3, "finite"), "f4E2M1FN": Format(2, 1, 1, "finite"),
}


def _encode(name: str, fmt: Format) -> str:
    """func @name(f32) -> iW: the format's bits of an f32 value."""
    src, bits_, sm, sbias = "f32", 32, 23, 127
    it, width, m = "i32", fmt.width, fmt.mantissa
    t = Text()

    def c(v: int) -> str:
        return t.const(v, it)
    bits = t(f"arith.bitcast %a0 : {src} to {it}")
    sign = t(f"arith.shrui {bits}, {c(bits_ - 1)} : {it}")
    mag = t(f"arith.andi {bits}, {c(2 ** (bits_ - 1) - 1)} : {it}")
    inf_bits = (2 ** (bits_ - 1 - sm) - 1) << sm
    is_nan = t(f"arith.cmpi ugt, {mag}, {c(inf_bits)} : {it}")
    shift = sm - m
    if fmt.kind == "e8m0":  # halves round up
        rounded = t(f"arith.addi {mag}, {c(1 << (shift - 1))} : {it}")
    else:  # to nearest even: half less one, plus the kept part's lowest bit
        lsb = t(f"arith.andi {t(f'arith.shrui {mag}, {c(shift)} : {it}')}, {c(1)} : {it}")
        rounded = t(f"arith.addi {t(f'arith.addi {mag}, {c((1 << (shift - 1)) - 1)} : {it}')}, {lsb} : {it}")
    # a normal source value's bits, rounded, less the difference of the biases: the format's bits
    code = t(f"arith.subi {t(f'arith.shrui {rounded}, {c(shift)} : {it}')}, {c((sbias - fmt.bias) << m)} : {it}")
    if fmt.kind == "e8m0":
        # f32's subnormals (below 2^-126): 2^-127 up to 2^-127 itself, 2^-126 above
        tiny = t(f"arith.cmpi ult, {mag}, {c(1 << 23)} : {it}")
        up = t(f"arith.extui {t(f'arith.cmpi ugt, {mag}, {c(0x400000)} : {it}')} : i1 to {it}")
        code = t(f"arith.select {tiny}, {up}, {code} : {it}")
    else:  # below the format's smallest normal value: a multiple of its smallest subnormal, rounded to even
        scaled = t(f"arith.mulf {t(f'arith.bitcast {mag} : {it} to {src}')}, {t.const(float(2.0 ** (fmt.bias - 1 + m)), src)} : {src}")
        sub = t(f"arith.fptosi {t(f'math.roundeven {scaled} : {src}')} : {src} to {it}")
        is_sub = t(f"arith.cmpi ult, {mag}, {c((1 - fmt.bias + sbias) << sm)} : {it}")
        code = t(f"arith.select {is_sub}, {sub}, {code} : {it}")
    over = t(f"arith.cmpi sgt, {code}, {c(fmt.max_code)} : {it}")
    top = 1 << (width - 1)
    inf = (2 ** fmt.exponent - 1) << m
    overflow, nan = {  # (what overflows becomes, what NaN becomes), sign excluded
        "ieee": (inf, inf | (1 << max(m - 1, 0))), "fn": (top - 1, top - 1), "fnuz": (top, top), "finite": (fmt.max_code, 0),
        "e8m0": (0xFF, 0xFF),
    }[fmt.kind]
    code = t(f"arith.select {is_nan}, {c(nan)}, {t(f'arith.select {over}, {c(overflow)}, {code} : {it}')} : {it}")
    if fmt.kind == "e8m0":  # zero, negative values and NaN: NaN
        bad = t(f"arith.ori {t(f'arith.cmpi ne, {sign}, {c(0)} : {it}')}, {t(f'arith.cmpi eq, {mag}, {c(0)} : {it}')} : i1")
        code = t(f"arith.select {bad}, {c(0xFF)}, {code} : {it}")
    else:
        signed = sign
        if fmt.kind == "fnuz":  # no negative zero
            nonzero = t(f"arith.cmpi ne, {code}, {c(0)} : {it}")
            signed = t(f"arith.andi {sign}, {t(f'arith.extui {nonzero} : i1 to {it}')} : {it}")
        if fmt.kind == "finite":  # no NaN: a zero of the other sign, as ml_dtypes converts it
            signed = t(f"arith.xori {sign}, {t(f'arith.extui {is_nan} : i1 to {it}')} : {it}")
        code = t(f"arith.ori {code}, {t(f'arith.shli {signed}, {c(width - 1)} : {it}')} : {it}")
    t.emit(f"return {t(f'arith.trunci {code} : {it} to i{width}')} : i{width}")
    return t.function_of(name, f"%a0: {src}", f"i{width}")


def _decode(name: str, fmt: Format) -> str:
    """func @name(iW) -> f32: the value of the format's bits."""
    width, m, e = fmt.width, fmt.mantissa, fmt.exponent
    t = Text()

    def c(v: int) -> str:
        return t.const(v, "i32")
    code = t(f"arith.extui %a0 : i{width} to i32")
    nan = c(0x7FC00000)
    if fmt.kind == "e8m0":  # 2^(code - 127); 2^-127 is an f32 subnormal
        bits = t(f"arith.select {t(f'arith.cmpi eq, {code}, {c(0)} : i32')}, {c(0x400000)}, "
                 f"{t(f'arith.shli {code}, {c(23)} : i32')} : i32")
        bits = t(f"arith.select {t(f'arith.cmpi eq, {code}, {c(0xFF)} : i32')}, {nan}, {bits} : i32")
    else:
        sign = t(f"arith.shli {t(f'arith.shrui {code}, {c(width - 1)} : i32')}, {c(31)} : i32")
        exp = t(f"arith.andi {t(f'arith.shrui {code}, {c(m)} : i32')}, {c(2 ** e - 1)} : i32")
        mant = t(f"arith.andi {code}, {c(2 ** m - 1)} : i32")
        rebiased = t(f"arith.addi {exp}, {c(127 - fmt.bias)} : i32")
        normal = t(f"arith.ori {t(f'arith.shli {rebiased}, {c(23)} : i32')}, {t(f'arith.shli {mant}, {c(23 - m)} : i32')} : i32")
        sub = t(f"arith.mulf {t(f'arith.uitofp {mant} : i32 to f32')}, {t.const(float(2.0 ** (1 - fmt.bias - m)), 'f32')} : f32")
        is_sub = t(f"arith.cmpi eq, {exp}, {c(0)} : i32")
        bits = t(f"arith.select {is_sub}, {t(f'arith.bitcast {sub} : f32 to i32')}, {normal} : i32")
        bits = t(f"arith.ori {bits}, {sign} : i32")
        magnitude = t(f"arith.andi {code}, {c(2 ** (width - 1) - 1)} : i32")
        if fmt.kind == "ieee":
            special = t(f"arith.cmpi eq, {exp}, {c(2 ** e - 1)} : i32")
            inf_or_nan = t(f"arith.select {t(f'arith.cmpi eq, {mant}, {c(0)} : i32')}, "
                           f"{t(f'arith.ori {sign}, {c(0x7F800000)} : i32')}, {t(f'arith.ori {sign}, {nan} : i32')} : i32")
            bits = t(f"arith.select {special}, {inf_or_nan}, {bits} : i32")
        elif fmt.kind == "fn":
            bits = t(f"arith.select {t(f'arith.cmpi eq, {magnitude}, {c(2 ** (width - 1) - 1)} : i32')}, "
                     f"{t(f'arith.ori {sign}, {nan} : i32')}, {bits} : i32")
        elif fmt.kind == "fnuz":
            bits = t(f"arith.select {t(f'arith.cmpi eq, {code}, {c(1 << (width - 1))} : i32')}, {nan}, {bits} : i32")
    t.emit(f"return {t(f'arith.bitcast {bits} : i32 to f32')} : f32")
    return t.function_of(name, f"%a0: i{width}", "f32")


def low_bit_types(module: ir.Module) -> set[str]:
    """The formats of the module's values (op results and block arguments)."""
    found = set()

    def note(t: ir.Type) -> None:
        if isinstance(t, ir.ShapedType):
            t = ir.ShapedType(t).element_type
        if isinstance(t, ir.FloatType) and ir.FloatType(t).width < 16:
            found.add(str(t))
    for op in walk(module.operation):
        for r in op.results:
            note(r.type)
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    note(arg.type)
    return found


def emulation_pipeline(formats: set[str]) -> str:
    """The upstream passes that compute arith and math ops on these formats in f32."""
    types = ",".join(sorted(formats))
    return (f"func.func(arith-emulate-unsupported-floats{{source-types={types} target-type=f32}}), "
            "func.func(math-extend-to-supported-types{extra-types=f16,bf16 target-type=f32}), canonicalize")


def expand_conversions(module: ir.Module) -> None:
    """Each extf / truncf from or to one of the formats becomes calls of its decoding and encoding
    functions (added to the module; inlined later)."""
    added: set[str] = set()

    def function(name: str, text: str) -> str:
        if name not in added:
            added.add(name)
            parsed = ir.Module.parse(text)
            for f in list(parsed.body.operations):
                f.operation.move_before(module.body.operations[0])
        return name

    def create(name: str, result: ir.Type, operands: list[ir.Value], **attrs) -> ir.Value:
        return ir.Operation.create(name, results=[result], operands=operands, attributes=attrs).result

    def call(name: str, result: ir.Type, x: ir.Value) -> ir.Value:
        return create("func.call", result, [x], callee=ir.FlatSymbolRefAttr.get(name))

    f32, f64 = ir.F32Type.get(), ir.F64Type.get()
    for op in walk(module.operation):
        if op.name not in ("arith.extf", "arith.truncf"):
            continue
        src, dst = op.operands[0].type, op.results[0].type
        src_fmt, dst_fmt = FORMATS.get(str(src)), FORMATS.get(str(dst))
        if src_fmt is None and dst_fmt is None:
            continue
        if not isinstance(src, ir.FloatType) or not isinstance(dst, ir.FloatType):
            raise UnsupportedOpError(f"{op.name} of {src} to {dst}: only scalars of 8-, 6- and 4-bit floats are converted")
        with ir.InsertionPoint(op), op.location:
            x = op.operands[0]
            if src_fmt is not None:  # its value in f32
                name = function(f"__disc_decode_{src}", _decode(f"__disc_decode_{src}", src_fmt))
                x = call(name, f32, create("arith.bitcast", ir.IntegerType.get_signless(src_fmt.width), [x]))
            if dst_fmt is not None:
                if x.type != f32:  # f16, bf16 exactly; f64 rounded (as ml_dtypes does)
                    x = create("arith.truncf" if x.type == f64 else "arith.extf", f32, [x])
                name = f"__disc_encode_{dst}"
                out = create("arith.bitcast", dst, [call(function(name, _encode(name, dst_fmt)),
                                                         ir.IntegerType.get_signless(dst_fmt.width), x)])
            elif dst == f32:
                out = x
            else:  # f64 exactly; f16, bf16 rounded once
                out = create("arith.extf" if dst == f64 else "arith.truncf", dst, [x])
        op.results[0].replace_all_uses_with(out)
        op.erase()
