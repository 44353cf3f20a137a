"""Symbolic shape analysis: every dim of every value of the entry function gets a symbolic `Dim`
over the dimension variables, and the facts that op semantics imply are collected in a
`ShapeFacts` manager: equalities (union-find with substitution), product equalities (reshapes),
bounds and divisibility (from frontends and user constraints).

Integer scalars and shape vectors that hold sizes (`get_dimension_size`, the shape operands of
`dynamic_broadcast_in_dim` / `dynamic_reshape` / `dynamic_iota`, and the arithmetic between
them) are tracked by *content*, so the dims they build are known symbolically.

The analysis annotates the IR where a fact changes the code: `dynamic_broadcast_in_dim` gets
`known_nonexpanding_dimensions` / `known_expanding_dimensions` (no run-time broadcast check is
then generated), and records every decision for `shape_report()`."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

from torch_mlir import ir

from ..mlir_support import location_text
from ..ops import ELEMENTWISE
from .signature import Signature
from .symbolic import Dim


@dataclasses.dataclass
class Fact:
    text: str          # e.g. "s >= 8", "mod(s, 8) == 0"
    source: str        # "jax export", "user", "#stablehlo.bounds", "op semantics"


class ShapeFacts:
    """Equalities between dims (a variable is replaced by its class representative), bounds,
    divisibility and product equalities."""

    def __init__(self):
        self.subst: dict[str, Dim] = {}
        self.lower: dict[str, int] = {}
        self.upper: dict[str, int] = {}
        self.divisor: dict[str, int] = {}
        self.products: list[tuple[list[Dim], list[Dim]]] = []
        self.facts: list[Fact] = []

    def canon(self, d: Dim) -> Dim:
        for _ in range(16):  # substitutions are acyclic; the bound only guards against mistakes
            nxt = d.substitute({v: self.subst[v] for v in d.variables if v in self.subst})
            if nxt == d:
                return d
            d = nxt
        return d

    def equal(self, a: Dim, b: Dim) -> bool:
        return self.canon(a) == self.canon(b)

    def union(self, a: Dim, b: Dim, why: str) -> None:
        a, b = self.canon(a), self.canon(b)
        if a == b:
            return
        # replace a variable by the other side: constants and older names win
        for var_side, other in ((a, b), (b, a)):
            if len(var_side.terms) == 1 and list(var_side.terms.values()) == [1] and len(next(iter(var_side.terms))) == 1:
                name = next(iter(var_side.terms))[0]
                if name not in other.variables and (other.constant is not None or not _is_var(other) or name > str(other)):
                    self.subst[name] = other
                    self.facts.append(Fact(f"{name} == {other}", why))
                    return
        self.facts.append(Fact(f"{a} == {b}", why))

    def add_bound(self, var: str, lower: int | None = None, upper: int | None = None) -> None:
        if lower is not None:
            self.lower[var] = max(self.lower.get(var, lower), lower)
        if upper is not None:
            self.upper[var] = min(self.upper.get(var, upper), upper)

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


@dataclasses.dataclass
class ShapeAnalysis:
    facts: ShapeFacts
    args: list[tuple[str, list[Dim]]]
    results: list[list[Dim]]
    values: list[tuple[str, str, list[Dim]]]   # (op, location, dims) of every intermediate
    broadcasts: list[BroadcastDecision]
    variables: dict[str, list[str]]           # variable -> where it is read ("x dim 0")

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
          "stablehlo.multiply": lambda a, b: a * b}


@_rule(*(f"stablehlo.{n}" for n in ELEMENTWISE - {"select"}))  # select: its own rule (scalar predicate)
def _elementwise(w: _Walker, op: ir.Operation):
    dims = _same_shape(w, list(op.operands), f"{op.name} operands")
    contents = [w.content.get(v) for v in op.operands]
    if op.name in ("stablehlo.convert",) and contents[0] is not None:
        w.content[op.result] = contents[0]
    elif op.name in _ARITH and all(c is not None for c in contents) and len({len(c) for c in contents}) == 1:
        w.content[op.result] = [_ARITH[op.name](a, b) for a, b in zip(*contents)]
    elif op.name == "stablehlo.divide" and all(c is not None for c in contents):
        if all(b.constant for b in contents[1]):
            w.content[op.result] = [a.floordiv(b.constant) for a, b in zip(*contents)]
    return [dims] if dims or not op.results[0].type.rank else None


@_rule("stablehlo.constant")
def _constant(w: _Walker, op: ir.Operation):
    t = op.result.type
    if isinstance(t.element_type, ir.IntegerType) and t.rank <= 1 and t.has_static_shape and (t.rank == 0 or t.shape[0] <= 16):
        attr = ir.DenseIntElementsAttr(op.attributes["value"])
        n = 1 if t.rank == 0 else t.shape[0]
        w.content[op.result] = [Dim.const(int(attr[0] if attr.is_splat else attr[i])) for i in range(n)]
    return None


@_rule("stablehlo.get_dimension_size")
def _get_dimension_size(w: _Walker, op: ir.Operation):
    w.content[op.result] = [w.of(op.operands[0])[ir.IntegerAttr(op.attributes["dimension"]).value]]
    return [[]]


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
                reasons.append(f"dim {i}: {in_dims[i]} == {out[od]}")
        elif w.facts.is_one(in_dims[i]) and w.facts.is_one(out[od]) is False:
            exp.append(i)
        elif w.facts.is_one(in_dims[i]):
            exp.append(i)
        else:
            checked.append(i)
    op.attributes["known_nonexpanding_dimensions"] = ir.DenseI64ArrayAttr.get(nonexp)
    op.attributes["known_expanding_dimensions"] = ir.DenseI64ArrayAttr.get(exp)
    w.broadcasts.append(BroadcastDecision(location_text(op), nonexp, exp, checked, reasons))
    return [out]


@_rule("stablehlo.broadcast_in_dim")
def _broadcast(w: _Walker, op: ir.Operation):
    out = w.result_dims(op)[0]
    for i, od in enumerate(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"])):
        d = w.of(op.operands[0])[i]
        if d.constant != 1:
            w.facts.union(d, out[od], "broadcast_in_dim")
    return [out]


@_rule("stablehlo.dynamic_reshape", "stablehlo.dynamic_iota")
def _dims_from_shape_operand(w: _Walker, op: ir.Operation):
    shape = op.operands[1] if op.name == "stablehlo.dynamic_reshape" else op.operands[0]
    out = _shape_from_content(w, op, shape)
    if out is not None and op.name == "stablehlo.dynamic_reshape":
        w.facts.products.append((w.of(op.operands[0]), out))
    return [out] if out is not None else None


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


FACTS_ATTR = "disc.shape_facts"      # module: ["s >= 8 [user]", "arg0.0 == arg1.0 [op semantics]", ...]
DIMS_ATTR = "disc.symbolic_dims"     # entry argument: ["b", "s", "8"]


def save_to_ir(module: ir.Module, entry: ir.Operation, analysis: ShapeAnalysis) -> None:
    """Writes the facts (module attribute) and the arguments' symbolic dims (argument
    attributes) into the IR: attributes survive every pass and travel with a saved module."""
    module.operation.attributes[FACTS_ATTR] = ir.ArrayAttr.get(
        [ir.StringAttr.get(f"{f.text} [{f.source}]") for f in analysis.facts.facts])
    attrs = [ir.DictAttr.get({DIMS_ATTR: ir.ArrayAttr.get([ir.StringAttr.get(str(analysis.facts.canon(d))) for d in dims])})
             for _, dims in analysis.args]
    entry.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)


def load_from_ir(module: ir.Module, facts: ShapeFacts) -> None:
    """Reads back facts a module carries (a module compiled before and saved)."""
    from .constraints import Constraint, record_fact

    if FACTS_ATTR not in module.operation.attributes:
        return
    for item in ir.ArrayAttr(module.operation.attributes[FACTS_ATTR]):
        text, _, source = ir.StringAttr(item).value.rpartition(" [")
        record_fact(facts, Constraint(text, source.rstrip("]")))


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
    ret = block.operations[len(block.operations) - 1]
    results = [w.of(v) for v in ret.operands]
    return ShapeAnalysis(facts, args, results, w.values, w.broadcasts, variables)
