"""Symbolic shape analysis: every dim of every value of the entry function gets a symbolic `Dim`
over the dimension variables, and the facts that op semantics imply are collected in a
`ShapeFacts` manager: equalities (union-find with substitution), bounds and divisibility (from
frontends and user constraints); the element-count equality of a reshape is kept as a fact.

Integer scalars and shape vectors that hold sizes (`get_dimension_size`, the shape operands of
`dynamic_broadcast_in_dim` / `dynamic_reshape` / `dynamic_iota`, and the arithmetic between
them) are tracked by *content*, so the dims they build are known symbolically.

The analysis annotates the IR where a fact changes the code: `dynamic_broadcast_in_dim` gets
`known_nonexpanding_dimensions` / `known_expanding_dimensions` (no run-time broadcast check is
then generated), and records every decision for `shape_report()`."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Callable

from .. import mlir_support  # noqa: F401  (first: loads torch-mlir's native modules, see _load_mlir)
from torch_mlir import ir

from ..mlir_support import call_target, create_value, index_constant, int_list, location_text, operation, tag_facts
from ..ops import ELEMENTWISE, GROUPED_GEMM_TARGET, TOP_K_ATTR, TOP_K_TARGET, lapack_result_dims, lapack_routine
from .signature import Signature
from .symbolic import Dim


@dataclasses.dataclass
class Fact:
    text: str          # e.g. "s >= 8", "mod(s, 8) == 0"
    source: str        # "jax export", "user", "#stablehlo.bounds", "op semantics"


class ShapeFacts:
    """Equalities between dims (a variable is replaced by its class representative), bounds and
    divisibility; equalities it cannot substitute (products of a reshape) are kept as facts."""

    def __init__(self):
        self.subst: dict[str, Dim] = {}
        self.lower: dict[str, int] = {}
        self.upper: dict[str, int] = {}
        self.divisor: dict[str, int] = {}
        self.facts: list[Fact] = []
        # what the ops' semantics made equal that nothing proved: (a, b, why, where), checked at run time
        self.assumed: list[tuple[Dim, Dim, str, str]] = []
        self.site: ir.Operation | None = None  # the op the analysis is at, while it walks the program

    def canon(self, d: Dim) -> Dim:
        for _ in range(16):  # substitutions are acyclic; the bound only guards against mistakes
            env = {v: self.subst[v] for v in d.variables if v in self.subst}
            if not env:
                return d
            d = d.substitute(env)
        return d

    def equal(self, a: Dim, b: Dim) -> bool:
        return self.canon(a) == self.canon(b)

    def union(self, a: Dim, b: Dim, why: str) -> None:
        a, b = self.canon(a), self.canon(b)
        if a == b:
            return
        if self.site is not None:
            self.assumed.append((a, b, why, f"{self.site.name} at {location_text(self.site)}"))
        # a common constant factor cancels (768*x == 768*b*s: x == b*s)
        common = math.gcd(*a.terms.values(), *b.terms.values())
        if common > 1:
            a, b = a.floordiv(common), b.floordiv(common)
        # replace a variable by the other side: constants, then the arguments' dimension
        # variables (fresh symbols of intermediates have a '#'), then older names win
        for var_side, other in ((a, b), (b, a)):
            if _is_var(var_side):
                name = str(var_side)
                if name not in other.variables and (other.constant is not None or not _is_var(other)
                                                    or ("#" in name, name) > ("#" in str(other), str(other))):
                    self.subst[name] = other
                    self.facts.append(Fact(f"{name} == {other}", why))
                    return
        self.facts.append(Fact(f"{a} == {b}", why))

    def add_bound(self, var: str, lower: int | None = None, upper: int | None = None) -> None:
        if lower is not None:
            self.lower[var] = max(self.lower.get(var, lower), lower)
        if upper is not None:
            self.upper[var] = min(self.upper.get(var, upper), upper)

    def range(self, d: Dim) -> tuple[int, int] | None:
        """Lower and upper bound of a dim from the variables' bounds (sizes are >= 0); None when
        a variable it needs has no upper bound."""
        lo = hi = 0
        for mono, coeff in self.canon(d).terms.items():
            mlo, mhi = 1, 1
            for v in mono:
                if v not in self.upper:
                    return None
                mlo, mhi = mlo * max(self.lower.get(v, 0), 0), mhi * self.upper[v]
            lo, hi = (lo + coeff * mlo, hi + coeff * mhi) if coeff > 0 else (lo + coeff * mhi, hi + coeff * mlo)
        return lo, hi

    def is_one(self, d: Dim) -> bool | None:
        """True / False when known, None when the dim may or may not be 1."""
        c = self.canon(d)
        if c.constant is not None:
            return c.constant == 1
        if _is_var(c) and self.lower.get(str(c), 0) >= 2:
            return False
        return None


def _is_var(d: Dim) -> bool:
    return len(d.terms) == 1 and list(d.terms.values()) == [1] and len(next(iter(d.terms))) == 1


@dataclasses.dataclass
class BroadcastDecision:
    location: str
    nonexpanding: list[int]
    expanding: list[int]
    runtime_checked: list[int]
    reasons: list[str]
    operand: list[Dim]      # the operand's dims
    target: list[Dim]       # the result dims each operand dim maps to


@dataclasses.dataclass
class ShapeAnalysis:
    facts: ShapeFacts
    args: list[tuple[str, list[Dim]]]
    results: list[list[Dim]]
    values: list[tuple[str, str, list[Dim]]]   # (op, location, dims) of every intermediate
    broadcasts: list[BroadcastDecision]
    variables: dict[str, list[str]]           # variable -> where it is read ("x dim 0")
    uses: list[str] = dataclasses.field(default_factory=list)  # what later passes did with the facts
    checks: list[str] = dataclasses.field(default_factory=list)  # contracts checked at run time (emit_contract_checks)

    def dims_text(self, dims: list[Dim]) -> str:
        return "[" + ", ".join(str(self.facts.canon(d)) for d in dims) + "]"

    def report(self) -> str:
        f = self.facts
        lines = ["dimension variables:"]
        for var, where in sorted(self.variables.items()):
            bounds = []
            if var in f.lower:
                bounds.append(f">= {f.lower[var]}")
            if var in f.upper:
                bounds.append(f"<= {f.upper[var]}")
            if var in f.divisor:
                bounds.append(f"divisible by {f.divisor[var]}")
            extra = f" ({', '.join(bounds)})" if bounds else ""
            lines.append(f"  {var}{extra}: read from {', '.join(where)}")
        lines.append("arguments:")
        lines += [f"  {name}: {self.dims_text(dims)}" for name, dims in self.args]
        lines.append("results:")
        lines += [f"  result{i}: {self.dims_text(dims)}" for i, dims in enumerate(self.results)]
        lines.append("facts:")
        lines += [f"  {fact.text}  [{fact.source}]" for fact in f.facts] or ["  (none)"]
        lines.append("broadcasts (dynamic_broadcast_in_dim):")
        for b in self.broadcasts:
            lines.append(f"  at {b.location}: non-expanding {b.nonexpanding}, expanding {b.expanding}, "
                         f"checked at run time {b.runtime_checked}" + (f"; relies on {'; '.join(b.reasons)}" if b.reasons else ""))
        if not self.broadcasts:
            lines.append("  (none)")
        lines.append("checked at run time, before any kernel (what the ops assume of the arguments' dims):")
        lines += [f"  {c}" for c in self.checks] or ["  (nothing: the facts prove every op's contract)"]
        lines.append("used by the compiler:")
        lines += [f"  {u}" for u in self.uses] or ["  (nothing beyond the broadcasts)"]
        lines.append("intermediate values:")
        lines += [f"  {name} at {loc}: {self.dims_text(dims)}" for name, loc, dims in self.values]
        return "\n".join(lines)


Rule = Callable[["_Walker", ir.Operation], list[list[Dim]] | None]
_RULES: dict[str, Rule] = {}


def _rule(*names: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for n in names:
            if n in _RULES:
                raise ValueError(f"a shape rule for {n} is registered already")
            _RULES[n] = fn
        return fn
    return deco


class _Walker:
    def __init__(self, facts: ShapeFacts):
        self.facts = facts
        self.dims: dict[ir.Value, list[Dim]] = {}
        self.content: dict[ir.Value, list[Dim]] = {}
        self.quotients: dict[ir.Value, list[tuple[Dim, int]]] = {}  # float values a / k that are not whole
        self.fresh = itertools.count()
        self.values: list[tuple[str, str, list[Dim]]] = []
        self.broadcasts: list[BroadcastDecision] = []

    def of(self, v: ir.Value) -> list[Dim]:
        if v not in self.dims:
            self.dims[v] = self.from_type(v.type, "v")
        return self.dims[v]

    def from_type(self, t: ir.Type, stem: str) -> list[Dim]:
        if not isinstance(t, ir.RankedTensorType):
            return []
        return [Dim.var(f"{stem}{next(self.fresh)}") if t.is_dynamic_dim(i) else Dim.const(t.shape[i]) for i in range(t.rank)]

    def result_dims(self, op: ir.Operation) -> list[list[Dim]]:
        return [self.from_type(r.type, f"{op.name.split('.')[-1]}#") for r in op.results]

    def run(self, block: ir.Block) -> None:
        for op in block.operations:
            op = op.operation
            rule = _RULES.get(op.name)
            self.facts.site = op
            out = rule(self, op) if rule else None
            out = out or self.result_dims(op)
            for r, d in zip(op.results, out):
                self.dims[r] = d
            if op.results and isinstance(op.results[0].type, ir.RankedTensorType) and not op.results[0].type.has_static_shape:
                self.values.append((op.name, location_text(op), self.dims[op.results[0]]))
            for region in op.regions:
                for b in region.blocks:
                    for arg in b.arguments:  # loop-carried values may change shape between iterations
                        self.dims[arg] = self.from_type(arg.type, "loop")
                    self.run(b)


def _same_shape(w: _Walker, values: list[ir.Value], why: str) -> list[Dim]:
    ranked = [w.of(v) for v in values if isinstance(v.type, ir.RankedTensorType) and v.type.rank > 0]
    for other in ranked[1:]:
        for a, b in zip(ranked[0], other):
            w.facts.union(a, b, why)
    return ranked[0] if ranked else []


_ARITH = {"stablehlo.add": lambda a, b: a + b, "stablehlo.subtract": lambda a, b: a - b,
          "stablehlo.multiply": lambda a, b: a * b, "arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b,
          "arith.muli": lambda a, b: a * b}


@_rule(*(f"stablehlo.{n}" for n in ELEMENTWISE - {"select"}))  # select: its own rule (scalar predicate)
def _elementwise(w: _Walker, op: ir.Operation):
    dims = _same_shape(w, list(op.operands), f"{op.name} operands")
    contents = [w.content.get(v) for v in op.operands]
    if op.name in ("stablehlo.convert", "stablehlo.ceil", "stablehlo.floor") and contents[0] is not None:
        w.content[op.result] = contents[0]
    elif op.name in _ARITH and all(c is not None for c in contents) and len({len(c) for c in contents}) == 1:
        w.content[op.result] = [_ARITH[op.name](a, b) for a, b in zip(*contents)]
    elif op.name == "stablehlo.divide" and all(c is not None for c in contents) and all(b.constant for b in contents[1]):
        pairs = [(a, b.constant) for a, b in zip(*contents)]
        # integers truncate (floor, for sizes); floats divide exactly, so only whole quotients are content
        if (isinstance(ir.RankedTensorType(op.result.type).element_type, ir.IntegerType)
                or all(c % k == 0 for a, k in pairs for c in a.terms.values())):
            w.content[op.result] = [a.floordiv(k) for a, k in pairs]
        elif all(k > 0 for _, k in pairs):
            w.quotients[op.result] = pairs
    elif op.name in ("stablehlo.ceil", "stablehlo.floor") and op.operands[0] in w.quotients:
        # torch's arange(start, end, step) has ceil((end - start) / step) elements, computed in f64
        up = op.name == "stablehlo.ceil"
        w.content[op.result] = [(a + (k - 1 if up else 0)).floordiv(k) for a, k in w.quotients[op.operands[0]]]
    return [dims] if dims or not op.results[0].type.rank else None


@_rule("stablehlo.constant", "arith.constant")
def _constant(w: _Walker, op: ir.Operation):
    """Integer scalars and small integer (or whole-number float) tensors: their values."""
    t = op.result.type
    if isinstance(t, (ir.IndexType, ir.IntegerType)):
        w.content[op.result] = [Dim.const(ir.IntegerAttr(op.attributes["value"]).value)]
        return None
    if (not isinstance(t, ir.RankedTensorType) or t.rank > 2 or not t.has_static_shape or math.prod(t.shape) > 16
            or not isinstance(t.element_type, (ir.IntegerType, ir.F32Type, ir.F64Type))
            or isinstance(t.element_type, ir.IntegerType) and ir.IntegerType(t.element_type).width in (2, 4)):  # unreadable here
        return None
    n, attr = math.prod(t.shape), op.attributes["value"]
    if isinstance(attr, ir.DenseIntElementsAttr):  # contents are kept flat, row-major
        w.content[op.result] = [Dim.const(int(attr[0] if attr.is_splat else attr[i])) for i in range(n)]
    elif isinstance(attr, ir.DenseFPElementsAttr):  # whole numbers only (size arithmetic in floats)
        values = [attr[0] if attr.is_splat else attr[i] for i in range(n)]
        if all(math.isfinite(v) and v == int(v) for v in values):
            w.content[op.result] = [Dim.const(int(v)) for v in values]
    return None


@_rule("stablehlo.get_dimension_size")
def _get_dimension_size(w: _Walker, op: ir.Operation):
    w.content[op.result] = [w.of(op.operands[0])[ir.IntegerAttr(op.attributes["dimension"]).value]]
    return [[]]


@_rule("tensor.dim")
def _tensor_dim(w: _Walker, op: ir.Operation):
    index = w.content.get(op.operands[1])
    if index is not None and index[0].constant is not None and isinstance(op.operands[0].type, ir.RankedTensorType):
        w.content[op.result] = [w.of(op.operands[0])[index[0].constant]]
    return [[]]


@_rule("tensor.from_elements")
def _from_elements(w: _Walker, op: ir.Operation):
    """A shape vector; an element the analysis cannot read is a fresh symbol, so the others still
    count (torch-mlir's `view(b, s, -1, 64)` computes the -1 from a loop over the dims, and the
    result type has it static anyway)."""
    contents = [w.content.get(v) for v in op.operands]
    if any(c is not None for c in contents):
        w.content[op.result] = [d for c in contents for d in (c or [Dim.var(f"element#{next(w.fresh)}")])]
    return None


@_rule("arith.select")
def _arith_select(w: _Walker, op: ir.Operation):
    """An extent of a broadcast, `d == 1 ? other : d` (the shape dialect's lowering): `d` when
    both sides are equal or `d` is known not to be 1, `other` when it is known to be 1."""
    on_true, on_false = w.content.get(op.operands[1]), w.content.get(op.operands[2])
    if on_true is None or on_false is None or len(on_true) != 1 or len(on_false) != 1:
        return None
    if w.facts.equal(on_true[0], on_false[0]):
        w.content[op.result] = on_false
        return None
    if isinstance(op.operands[0].owner, ir.Block):
        return None
    cond = operation(op.operands[0].owner)
    if cond.name != "arith.cmpi" or ir.IntegerAttr(cond.attributes["predicate"]).value != 0:
        return None
    tested, one = (w.content.get(v) for v in cond.operands)
    if tested is not None and one is not None and one[0].constant == 1 and (known := w.facts.is_one(tested[0])) is not None:
        w.content[op.result] = on_true if known else on_false
    return None


@_rule("arith.addi", "arith.subi", "arith.muli")
def _scalar_arith(w: _Walker, op: ir.Operation):
    """Size arithmetic on scalars (torch-mlir's `view(s, b * heads, 64)` multiplies in i64)."""
    contents = [w.content.get(v) for v in op.operands]
    if not isinstance(op.result.type, ir.ShapedType) and all(c is not None and len(c) == 1 for c in contents):
        w.content[op.result] = [_ARITH[op.name](contents[0][0], contents[1][0])]
    return None


@_rule("arith.index_cast")
def _index_cast(w: _Walker, op: ir.Operation):
    if (c := w.content.get(op.operands[0])) is not None:
        w.content[op.result] = c
    return None


@_rule("stablehlo.reshape")
def _reshape(w: _Walker, op: ir.Operation):
    c = w.content.get(op.operands[0])
    if c is not None:
        w.content[op.result] = c
    return None


@_rule("stablehlo.concatenate")
def _concatenate(w: _Walker, op: ir.Operation):
    axis = ir.IntegerAttr(op.attributes["dimension"]).value
    contents = [w.content.get(v) for v in op.operands]
    if all(c is not None for c in contents):
        w.content[op.result] = [d for c in contents for d in c]
    shapes = [w.of(v) for v in op.operands]
    out = list(shapes[0])
    for other in shapes[1:]:
        for i, (a, b) in enumerate(zip(out, other)):
            if i != axis:
                w.facts.union(a, b, "concatenate operands")
    out[axis] = sum((s[axis] for s in shapes[1:]), shapes[0][axis])
    return [out]


def _shape_from_content(w: _Walker, op: ir.Operation, shape: ir.Value) -> list[Dim] | None:
    c = w.content.get(shape)
    t = op.result.type
    if c is None or len(c) != t.rank:
        return None
    return [Dim.const(t.shape[i]) if not t.is_dynamic_dim(i) else c[i] for i in range(t.rank)]


@_rule("stablehlo.dynamic_broadcast_in_dim")
def _dynamic_broadcast(w: _Walker, op: ir.Operation):
    out = _shape_from_content(w, op, op.operands[1]) or w.result_dims(op)[0]
    in_dims = w.of(op.operands[0])
    bdims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    nonexp, exp, checked, reasons = [], [], [], []
    for i, od in enumerate(bdims):
        if w.facts.equal(in_dims[i], out[od]):
            nonexp.append(i)
            if in_dims[i] != out[od]:
                reasons.append(f"{in_dims[i]} == {out[od]}")
        elif w.facts.is_one(in_dims[i]):
            exp.append(i)
        else:
            checked.append(i)
    op.attributes["known_nonexpanding_dimensions"] = ir.DenseI64ArrayAttr.get(nonexp)
    op.attributes["known_expanding_dimensions"] = ir.DenseI64ArrayAttr.get(exp)
    w.broadcasts.append(BroadcastDecision(location_text(op), nonexp, exp, checked, reasons, in_dims, [out[d] for d in bdims]))
    _relies_on(op, reasons)
    return [out]


@_rule("stablehlo.broadcast_in_dim")
def _broadcast(w: _Walker, op: ir.Operation):
    out = w.result_dims(op)[0]
    for i, od in enumerate(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"])):
        d = w.of(op.operands[0])[i]
        if w.facts.is_one(d) is False:  # a dim that may be 1 expands then (the lowering checks it is 1 or the result's)
            w.facts.union(d, out[od], "broadcast_in_dim")
    return [out]


def _product(dims: list[Dim]) -> Dim:
    total = Dim.const(1)
    for d in dims:
        total = total * d
    return total


@_rule("stablehlo.dynamic_reshape", "stablehlo.dynamic_iota")
def _dims_from_shape_operand(w: _Walker, op: ir.Operation):
    shape = op.operands[1] if op.name == "stablehlo.dynamic_reshape" else op.operands[0]
    out = _shape_from_content(w, op, shape)
    if out is not None and op.name == "stablehlo.dynamic_reshape":
        w.facts.union(_product(w.of(op.operands[0])), _product(out), "dynamic_reshape keeps the element count")
        src = w.of(op.operands[0])
        segments = find_segments(w.facts, src, out)
        if segments is not None:
            set_segments(op, segments)
            _relies_on(op, [f"{_product([src[i] for i in s])} == {_product([out[j] for j in d])}" for s, d in segments
                            if len(s) + len(d) > 2 or src[s[0]] != out[d[0]]])
    return [out] if out is not None else None


def _relies_on(op: ir.Operation, facts: list[str]) -> None:
    """The op's code and its users' (which index through it) rely on the facts."""
    tag_facts(op, facts)
    for use in op.result.uses:
        tag_facts(operation(use.owner), facts)


SEGMENTS_ATTR = "disc.segments"  # on a reshape proven to be a merge of runs of its operand's dims, each then split


def set_segments(op: ir.Operation, segments: list[tuple[list[int], list[int]]]) -> None:
    op.attributes[SEGMENTS_ATTR] = ir.ArrayAttr.get([ir.ArrayAttr.get([ir.DenseI64ArrayAttr.get(s), ir.DenseI64ArrayAttr.get(d)])
                                                     for s, d in segments])


def segments(op: ir.Operation | ir.Block) -> list[tuple[list[int], list[int]]] | None:
    """A reshape's segments (`find_segments`), when the analysis proved them."""
    if isinstance(op, ir.Block) or SEGMENTS_ATTR not in op.attributes:
        return None
    return [(list(ir.DenseI64ArrayAttr(p[0])), list(ir.DenseI64ArrayAttr(p[1]))) for p in map(ir.ArrayAttr, ir.ArrayAttr(op.attributes[SEGMENTS_ATTR]))]


def reassociation(op: ir.Operation | ir.Block) -> list[list[int]] | None:
    """For a reshape that only splits dims, or only merges them, or keeps them all: the groups
    of the longer side's dims whose products are the shorter side's dims, in order."""
    segs = segments(op)
    if segs is None:
        return None
    if all(len(s) == 1 for s, _ in segs):
        return [d for _, d in segs]
    if all(len(d) == 1 for _, d in segs):
        return [s for s, _ in segs]
    return None


def find_segments(facts: ShapeFacts, src: list[Dim], dst: list[Dim]) -> list[tuple[list[int], list[int]]] | None:
    """A reshape as consecutive runs of its operand's dims, each merged and split into a run of
    its result's dims of the same product (the shortest runs that match, in order: [1, 197, b,
    768] -> [197, 12 b, 64] is [1, 197] -> [197] and [b, 768] -> [12 b, 64]); size-1 dims at the
    end join the last run. None when the facts cannot show it, or a side has no dims."""
    if not src or not dst:
        return None
    out, i, j = [], 0, 0
    while i < len(src) and j < len(dst):
        found = None
        for total in range(2, len(src) - i + len(dst) - j + 1):  # shortest runs first
            for a in range(max(1, total - (len(dst) - j)), min(total - 1, len(src) - i) + 1):
                if facts.equal(_product(src[i:i + a]), _product(dst[j:j + total - a])):
                    found = (a, total - a)
                    break
            if found:
                break
        if found is None:
            return None
        out.append((list(range(i, i + found[0])), list(range(j, j + found[1]))))
        i, j = i + found[0], j + found[1]
    one = Dim.const(1)
    while i < len(src) and facts.equal(src[i], one):
        out[-1][0].append(i)
        i += 1
    while j < len(dst) and facts.equal(dst[j], one):
        out[-1][1].append(j)
        j += 1
    return out if i == len(src) and j == len(dst) else None


@_rule("stablehlo.transpose")
def _transpose(w: _Walker, op: ir.Operation):
    dims = w.of(op.operands[0])
    return [[dims[p] for p in ir.DenseI64ArrayAttr(op.attributes["permutation"])]]


@_rule("stablehlo.reduce")
def _reduce(w: _Walker, op: ir.Operation):
    n = len(op.results)
    dims = _same_shape(w, list(op.operands[:n]), "reduce operands")
    reduced = set(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    kept = [d for i, d in enumerate(dims) if i not in reduced]
    return [kept] * n


@_rule("stablehlo.dot_general")
def _dot_general(w: _Walker, op: ir.Operation):
    from torch_mlir._mlir_libs import _stablehlo

    dn = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs, rhs = w.of(op.operands[0]), w.of(op.operands[1])
    lb, lc, rb, rc = (list(x) for x in (dn.lhs_batching_dimensions, dn.lhs_contracting_dimensions,
                                         dn.rhs_batching_dimensions, dn.rhs_contracting_dimensions))
    for a, b in zip(lb + lc, rb + rc):
        w.facts.union(lhs[a], rhs[b], "dot_general batch/contracting dims")
    free_l = [lhs[i] for i in range(len(lhs)) if i not in lb + lc]
    free_r = [rhs[i] for i in range(len(rhs)) if i not in rb + rc]
    return [[lhs[i] for i in lb] + free_l + free_r]


@_rule("stablehlo.select")
def _select(w: _Walker, op: ir.Operation):
    return [_same_shape(w, list(op.operands[1:]) + ([op.operands[0]] if op.operands[0].type.rank else []), "select operands")]


def _ceildiv(a: Dim, k: Dim) -> Dim | None:
    return None if k.constant is None or k.constant <= 0 else (a + (k.constant - 1)).floordiv(k.constant)


def _windowed(size: Dim, lo: Dim, hi: Dim, base_dil: int | Dim, window: int | Dim, win_dil: int | Dim, stride: int) -> Dim:
    """Output size of a strided, dilated window over a padded, dilated dim (sizes >= 1)."""
    padded = (size - 1) * base_dil + 1 + lo + hi
    return (padded - ((Dim.of(window) - 1) * win_dil + 1)).floordiv(stride) + 1


def _keep_static(op: ir.Operation, dims: list[Dim]) -> list[Dim]:
    t = op.results[0].type
    return [Dim.const(t.shape[i]) if not t.is_dynamic_dim(i) else d for i, d in enumerate(dims)]


@_rule("stablehlo.pad", "stablehlo.dynamic_pad")
def _pad(w: _Walker, op: ir.Operation):
    dims = w.of(op.operands[0])
    if op.name == "stablehlo.pad":
        lo, hi, inner = ([Dim.const(v) for v in int_list(op, n, [0] * len(dims))]
                         for n in ("edge_padding_low", "edge_padding_high", "interior_padding"))
    else:
        lo, hi, inner = (w.content.get(v) for v in op.operands[2:5])
        if lo is None or hi is None or inner is None:
            return None
    return [_keep_static(op, [d + a + b + (d - 1) * i for d, a, b, i in zip(dims, lo, hi, inner)])]


@_rule("stablehlo.real_dynamic_slice")
def _real_dynamic_slice(w: _Walker, op: ir.Operation):
    start, limit, stride = (w.content.get(v) for v in op.operands[1:4])
    if start is None or limit is None or stride is None:
        return None
    out = [_ceildiv(b - a, k) for a, b, k in zip(start, limit, stride)]
    return None if any(d is None for d in out) else [_keep_static(op, out)]


@_rule("stablehlo.gather", "stablehlo.dynamic_gather")
def _gather(w: _Walker, op: ir.Operation):
    from torch_mlir._mlir_libs import _stablehlo

    dn = _stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    indices = w.of(op.operands[1])
    sizes = (w.content.get(op.operands[2]) if op.name == "stablehlo.dynamic_gather"
             else [Dim.const(v) for v in int_list(op, "slice_sizes", [])])
    if sizes is None:
        return None
    offset_dims = list(dn.offset_dims)
    skipped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = iter([sizes[i] for i in range(len(sizes)) if i not in skipped])
    batch = iter([d for i, d in enumerate(indices) if i != dn.index_vector_dim])
    rank = op.results[0].type.rank
    if op.name == "stablehlo.gather" and (at := _iota_start_indices(w, op, dn)) is not None:
        op.attributes[IOTA_INDICES_ATTR] = ir.DenseI64ArrayAttr.get(at)
    return [_keep_static(op, [next(window) if d in offset_dims else next(batch) for d in range(rank)])]


IOTA_INDICES_ATTR = "disc.iota_indices"  # on a gather: start index k is the result index along dim [k], in bounds


def _iota_start_indices(w: _Walker, op: ir.Operation, dn) -> list[int] | None:
    """For a gather whose start indices are iotas (transformers' vmap'd masks read
    `attention_mask[b, j]` this way), the result dim each start index equals; None unless every
    index is one whose extent equals the operand dim it indexes (so no clamp applies)."""
    indices, ivd = op.operands[1], dn.index_vector_dim
    start_map, sizes = list(dn.start_index_map), int_list(op, "slice_sizes")
    idx_rank = ir.RankedTensorType(indices.type).rank
    if list(dn.operand_batching_dims) or any(sizes[d] != 1 for d in start_map):
        return None
    owner = None if isinstance(indices.owner, ir.Block) else operation(indices.owner)
    if ivd == idx_rank or ir.RankedTensorType(indices.type).shape[ivd] == 1 == len(start_map):
        parts = [indices]
    elif (owner is not None and owner.name == "stablehlo.concatenate" and ir.IntegerAttr(owner.attributes["dimension"]).value == ivd
          and len(owner.operands) == len(start_map) and all(ir.RankedTensorType(v.type).shape[ivd] == 1 for v in owner.operands)):
        parts = list(owner.operands)
    else:
        return None
    offset_dims = list(dn.offset_dims)
    batch_out = [d for d in range(ir.RankedTensorType(op.result.type).rank) if d not in offset_dims]
    idx_dims = [d for d in range(idx_rank) if d != ivd]
    result_dims, reasons = [], []
    for k, part in enumerate(parts):
        e = _iota_dim(w, part)
        extent, dim = (w.of(part)[e], w.of(op.operands[0])[start_map[k]]) if e is not None else (None, None)
        if e is None or e == ivd or not w.facts.equal(extent, dim):
            return None
        result_dims.append(batch_out[idx_dims.index(e)])
        if extent != dim:
            reasons.append(f"{extent} == {dim}")
    _relies_on(op, reasons)  # the indices are read unclamped: the equalities are the gather's contract
    return result_dims


def _iota_dim(w: _Walker, v: ir.Value, depth: int = 0) -> int | None:
    """The dim d when v[i] == i[d] everywhere: an iota seen through integer converts, + 0, * 1,
    JAX's wrap of negative indices, reshapes that add or drop unit dims and broadcasts that do not
    expand it."""
    if isinstance(v.owner, ir.Block) or depth > 16:
        return None
    op = operation(v.owner)
    if op.name in ("stablehlo.iota", "stablehlo.dynamic_iota"):
        return ir.IntegerAttr(op.attributes["iota_dimension"]).value
    if op.name == "stablehlo.convert":
        ints = all(isinstance(ir.RankedTensorType(x.type).element_type, ir.IntegerType) for x in (op.operands[0], op.result))
        return _iota_dim(w, op.operands[0], depth + 1) if ints else None
    if op.name == "stablehlo.select":  # JAX wraps negative indices: i < 0 ? i + n : i, and an iota is never negative
        d = _iota_dim(w, op.operands[2], depth + 1)
        test = None if isinstance(op.operands[0].owner, ir.Block) else operation(op.operands[0].owner)
        if (d is None or test is None or test.name != "stablehlo.compare" or "LT" not in str(test.attributes["comparison_direction"])
                or _iota_dim(w, test.operands[0], depth + 1) != d or _splat(w, test.operands[1]) != 0):
            return None
        return d
    if op.name in ("stablehlo.add", "stablehlo.multiply"):
        neutral = 0 if op.name == "stablehlo.add" else 1
        for x, y in ((0, 1), (1, 0)):
            if _splat(w, op.operands[y]) == neutral:
                return _iota_dim(w, op.operands[x], depth + 1)
        return None
    reshape = op.name in ("stablehlo.reshape", "stablehlo.dynamic_reshape")
    if not reshape and op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim"):
        return None
    d = _iota_dim(w, op.operands[0], depth + 1)
    if d is None:
        return None
    src, dst = w.of(op.operands[0]), w.of(op.result)
    if reshape:
        keep_src = [i for i, x in enumerate(src) if not w.facts.equal(x, Dim.const(1))]
        keep_dst = [i for i, x in enumerate(dst) if not w.facts.equal(x, Dim.const(1))]
        if d not in keep_src or len(keep_src) != len(keep_dst) or not all(w.facts.equal(src[i], dst[j]) for i, j in zip(keep_src, keep_dst)):
            return None
        return keep_dst[keep_src.index(d)]
    bdims = int_list(op, "broadcast_dimensions")
    return bdims[d] if w.facts.equal(src[d], dst[bdims[d]]) else None


def _splat(w: _Walker, v: ir.Value) -> int | None:
    """The one value of a tensor whose content is a single known number (seen through broadcasts)."""
    while not isinstance(v.owner, ir.Block) and operation(v.owner).name in ("stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim"):
        v = operation(v.owner).operands[0]
    c = w.content.get(v)
    return c[0].constant if c and all(x == c[0] for x in c) else None


@_rule("stablehlo.reduce_window")
def _reduce_window(w: _Walker, op: ir.Operation):
    n = len(op.results)
    dims = _same_shape(w, list(op.operands[:n]), "reduce_window operands")
    rank = len(dims)
    window = int_list(op, "window_dimensions", [1] * rank)
    strides = int_list(op, "window_strides", [1] * rank)
    base, wdil = int_list(op, "base_dilations", [1] * rank), int_list(op, "window_dilations", [1] * rank)
    pad = int_list(op, "padding", [0] * (2 * rank))
    out = [_windowed(d, Dim.const(pad[2 * i]), Dim.const(pad[2 * i + 1]), base[i], window[i], wdil[i], strides[i])
           for i, d in enumerate(dims)]
    return [_keep_static(op, out)] * n


@_rule("stablehlo.custom_call")
def _custom_call(w: _Walker, op: ir.Operation):
    """JAX's stablehlo.dynamic_reduce_window (window parameters are operands), its LAPACK calls
    (the dims the routine gives its results), our top_k (the operand's dims, the last one k) and
    our grouped GEMM (the input's rows, the weights' columns)."""
    target = call_target(op)
    if target == TOP_K_TARGET:
        out = w.of(op.operands[0])[:-1] + [Dim.const(ir.IntegerAttr(op.attributes[TOP_K_ATTR]).value)]
        return [out, out]
    if target == GROUPED_GEMM_TARGET:
        return [[w.of(op.operands[0])[0], w.of(op.operands[1])[2]]]
    if (lapack := lapack_routine(target)) is not None:
        return _lapack_call(w, op, *lapack)
    if target != "stablehlo.dynamic_reduce_window":
        return None
    n = len(op.results)
    window, strides, base, wdil, pad = (w.content.get(v) for v in op.operands[2 * n:2 * n + 5])
    if any(p is None for p in (window, strides, base, wdil, pad)) or any(k.constant is None for k in strides):
        return None
    dims = w.of(op.operands[0])
    out = [_windowed(d, pad[2 * i], pad[2 * i + 1], base[i], window[i], wdil[i], strides[i].constant) for i, d in enumerate(dims)]
    return [_keep_static(op, out)] * n


def _lapack_call(w: _Walker, op: ir.Operation, routine: str, type_code: int):
    from ..passes.lapack import lapack_characters

    shape_operands = int_list(op, "indices_of_shape_operands")
    data = [v for i, v in enumerate(op.operands) if i not in shape_operands]
    a, b = w.of(data[0]), (w.of(data[1]) if len(data) > 1 else [])
    if len(a) < 2:
        return None
    m, n = a[-2:]
    k = m if m == n else Dim.const(min(m.constant, n.constant)) if m.constant is not None and n.constant is not None \
        else Dim.var(f"lapack_k{next(w.fresh)}")

    def given(i: int) -> list[Dim]:
        content = w.content.get(op.operands[shape_operands[i]]) if i < len(shape_operands) else None
        return content or w.from_type(op.results[i].type, "lapack#")
    mode = lapack_characters(op, routine)[:1]
    dims = lapack_result_dims(routine, type_code >= 2, mode, a, b, k, given)
    return [[Dim.const(r.type.shape[j]) if not r.type.is_dynamic_dim(j) else d for j, d in enumerate(ds)]
            for r, ds in zip(op.results, dims)]


@_rule("stablehlo.convolution")
def _convolution(w: _Walker, op: ir.Operation):
    from torch_mlir._mlir_libs import _stablehlo

    dn = _stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    lhs, rhs = w.of(op.operands[0]), w.of(op.operands[1])
    n = len(dn.input_spatial_dimensions)
    strides, pad = int_list(op, "window_strides", [1] * n), int_list(op, "padding", [0] * (2 * n))
    lhs_dil, rhs_dil = int_list(op, "lhs_dilation", [1] * n), int_list(op, "rhs_dilation", [1] * n)
    out = [Dim.const(0)] * op.results[0].type.rank
    out[dn.output_batch_dimension] = lhs[dn.input_batch_dimension]
    out[dn.output_feature_dimension] = rhs[dn.kernel_output_feature_dimension]
    for s in range(n):
        k = rhs[dn.kernel_spatial_dimensions[s]].constant
        if k is None:
            return None
        out[dn.output_spatial_dimensions[s]] = _windowed(lhs[dn.input_spatial_dimensions[s]], Dim.const(pad[2 * s]),
                                                         Dim.const(pad[2 * s + 1]), lhs_dil[s], k, rhs_dil[s], strides[s])
    return [_keep_static(op, out)]


def analyze(entry: ir.Operation, signature: Signature, facts: ShapeFacts) -> ShapeAnalysis:
    """Runs the analysis over the entry function (after inlining) and annotates its ops."""
    w = _Walker(facts)
    block = entry.regions[0].blocks[0]
    variables: dict[str, list[str]] = {}
    args = []
    for spec, arg in zip(signature.args, block.arguments):
        dims = [Dim.of(d) for d in spec.shape]
        for i, d in enumerate(spec.shape):
            if isinstance(d, str):
                for v in Dim.of(d).variables:
                    variables.setdefault(v, []).append(f"{spec.name} dim {i}")
        w.dims[arg] = dims
        args.append((spec.name, dims))
    w.run(block)
    facts.site = None
    _rebuild_shape_operands(w, block)
    ret = block.operations[len(block.operations) - 1]
    results = [w.of(v) for v in ret.operands]
    return ShapeAnalysis(facts, args, results, w.values, w.broadcasts, variables)


# ops whose result shape is an operand: its position
_SHAPE_OPERAND = {"stablehlo.dynamic_reshape": 1, "stablehlo.dynamic_broadcast_in_dim": 1, "stablehlo.dynamic_iota": 0}


def _argument_dims(dims: dict[ir.Value, list[Dim]], facts: ShapeFacts, block: ir.Block) -> dict[str, tuple[ir.Value, int]]:
    """The first argument dim that holds each (representative) dimension variable."""
    found: dict[str, tuple[ir.Value, int]] = {}
    for arg in block.arguments:
        for i, d in enumerate(dims.get(arg, [])):
            c = facts.canon(d)
            if _is_var(c):
                found.setdefault(str(c), (arg, i))
    return found


def dim_value(d: Dim, var_dim: dict[str, tuple[ir.Value, int]]) -> ir.Value | None:
    """`d` as an index value computed from the arguments' dims (at the current insertion point),
    or None when a variable of it is no argument's dim."""
    index = ir.IndexType.get()
    total = None
    for mono, coeff in sorted(d.terms.items()):
        if any(v not in var_dim for v in mono):
            return None
        factors = [create_value("memref.dim" if isinstance(arg.type, ir.MemRefType) else "tensor.dim", [arg, index_constant(i)], index)
                   for arg, i in (var_dim[v] for v in mono)]
        if coeff != 1 or not factors:
            factors.insert(0, index_constant(coeff))
        term = functools.reduce(lambda a, b: create_value("arith.muli", [a, b], index), factors)
        total = term if total is None else create_value("arith.addi", [total, term], index)
    return total if total is not None else index_constant(0)


def _rebuild_shape_operands(w: _Walker, block: ir.Block) -> None:
    """Shape operands whose every element the analysis knows as a polynomial in the arguments'
    dims are rebuilt from those dims (as index values): shapes computed along different routes
    (JAX computes them in i32, a cast the IR cannot see through) become the same SSA values, so
    loops over provably equal dims get identical bounds and can fuse."""
    var_dim = _argument_dims(w.dims, w.facts, block)
    index = ir.IndexType.get()
    for op in list(block.operations):
        op = op.operation
        if op.name not in _SHAPE_OPERAND:
            continue
        pos = _SHAPE_OPERAND[op.name]
        content = w.content.get(op.operands[pos])
        if content is None:
            continue
        with ir.InsertionPoint(op), op.location:
            elems = [dim_value(w.facts.canon(d), var_dim) for d in content]
            if any(e is None for e in elems):
                continue
            shape = create_value("tensor.from_elements", elems, ir.RankedTensorType.get([len(elems)], index))
        op.operands[pos] = shape
