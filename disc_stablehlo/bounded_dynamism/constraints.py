"""Shape constraints: facts for the analysis, and run-time guards.

A constraint is text over dimension variables (`s >= 8`, `mod(s, 8) == 0`, `b <= 64`,
`s == 2*t`). Constraints the frontend checks itself (JAX's) only become facts. User constraints
(`disc.compile(..., constraints=[...])`) and `#stablehlo.bounds` on argument types also become
`shape_assertion` ops at the top of the entry function, which `extract_guard` moves into the
guard the host runs before any kernel: a violation raises ShapeError naming the argument, the
dim, the constraint and the value seen."""

from __future__ import annotations

import dataclasses
import re

from torch_mlir import ir

from ..errors import CompileError
from .analysis import Fact, ShapeFacts
from .signature import Signature
from .symbolic import Dim, parse_constraint, split_atom

_CMP = {"==": "EQ", "!=": "NE", ">=": "GE", "<=": "LE", ">": "GT", "<": "LT"}


@dataclasses.dataclass(frozen=True)
class Constraint:
    text: str
    source: str  # "user", "#stablehlo.bounds", "jax export"


def record_fact(facts: ShapeFacts, c: Constraint) -> None:
    """Adds what the constraint says about single variables (bounds, divisibility, equality)."""
    lhs, op, rhs = parse_constraint(c.text)
    if op in ("<=", "<") and lhs.constant is not None:  # "64 >= b" style, normalised
        lhs, rhs, op = rhs, lhs, {"<=": ">=", "<": ">"}[op]
    var = next(iter(lhs.variables)) if len(lhs.variables) == 1 and lhs == Dim.var(next(iter(lhs.variables))) else None
    k = rhs.constant
    if var and k is not None and op in (">=", ">"):
        facts.add_bound(var, lower=k + (op == ">"))
    elif var and k is not None and op in ("<=", "<"):
        facts.add_bound(var, upper=k - (op == "<"))
    elif op == "==" and k == 0 and (m := re.fullmatch(r"mod\((\w[\w.]*), (\d+)\)", str(lhs))):
        facts.divisor[m.group(1)] = int(m.group(2))
    elif op == "==":
        facts.union(lhs, rhs, c.source)
        return
    else:
        return
    facts.facts.append(Fact(c.text, c.source))


def bounds_constraints(signature: Signature, arg_types: list[ir.Type]) -> list[Constraint]:
    """`tensor<?x4xf32, #stablehlo.bounds<16, ?>>`: the dim is at most 16."""
    found = []
    for spec, t in zip(signature.args, arg_types):
        enc = t.encoding if isinstance(t, ir.RankedTensorType) else None
        if enc is None or "stablehlo.bounds" not in str(enc):
            continue
        bounds = re.search(r"bounds<(.*)>", str(enc)).group(1).split(",")
        for dim, b in zip(spec.shape, bounds):
            if b.strip() != "?" and isinstance(dim, str):
                found.append(Constraint(f"{dim} <= {int(b)}", "#stablehlo.bounds"))
    return found


class _Emitter:
    """Builds i64 scalar StableHLO for dim expressions from argument dims."""

    def __init__(self, signature: Signature):
        self.lines: list[str] = []
        self.n = 0
        # variable -> (argument, dim, k, c) where that dim's size is k*variable + c
        self.sources: dict[str, tuple[int, int, int, int]] = {}
        for k, spec in enumerate(signature.args):
            for j, d in enumerate(spec.shape):
                if isinstance(d, str):
                    expr = Dim.of(d)
                    linear = [m for m in expr.terms if m]
                    if len(linear) == 1 and len(linear[0]) == 1:
                        self.sources.setdefault(linear[0][0], (k, j, expr.terms[linear[0]], expr.terms.get((), 0)))
        self.cache: dict[str, str] = {}

    def value(self, rhs: str) -> str:
        self.n += 1
        self.lines.append(f"%e{self.n} = {rhs}")
        return f"%e{self.n}"

    def const(self, k: int) -> str:
        return self.value(f"stablehlo.constant dense<{k}> : tensor<i64>")

    def var(self, name: str, arg_types: list[ir.Type]) -> str:
        if name in self.cache:
            return self.cache[name]
        atom = split_atom(name)
        if atom is not None:
            fn, a, b = atom[0], self.dim(atom[1], arg_types), self.dim(atom[2], arg_types)
            op = {"mod": "remainder", "floordiv": "divide", "max": "maximum", "min": "minimum"}[fn]
            v = self.value(f"stablehlo.{op} {a}, {b} : tensor<i64>")
        elif name in self.sources:
            k, j, coeff, const = self.sources[name]
            size = self.value(f"stablehlo.get_dimension_size %a{k}, dim = {j} : ({arg_types[k]}) -> tensor<i32>")
            v = self.value(f"stablehlo.convert {size} : (tensor<i32>) -> tensor<i64>")
            if const:
                v = self.value(f"stablehlo.subtract {v}, {self.const(const)} : tensor<i64>")
            if coeff != 1:
                v = self.value(f"stablehlo.divide {v}, {self.const(coeff)} : tensor<i64>")
        else:
            raise CompileError(f"constraint uses '{name}', which is not a dimension variable of the arguments "
                               f"(known: {', '.join(sorted(self.sources)) or 'none'})")
        self.cache[name] = v
        return v

    def dim(self, d: Dim, arg_types: list[ir.Type]) -> str:
        total = None
        for mono, coeff in d.terms.items():
            term = self.const(coeff)
            for v in mono:
                term = self.value(f"stablehlo.multiply {term}, {self.var(v, arg_types)} : tensor<i64>")
            total = term if total is None else self.value(f"stablehlo.add {total}, {term} : tensor<i64>")
        return total if total is not None else self.const(0)


def add_constraint_guards(module: ir.Module, entry: ir.Operation, signature: Signature, constraints: list[Constraint]) -> None:
    """Adds a shape assertion per constraint at the top of the entry function."""
    if not constraints:
        return
    arg_types = list(ir.FunctionType(ir.TypeAttr(entry.attributes["function_type"]).value).inputs)
    em = _Emitter(signature)
    for c in constraints:
        lhs, op, rhs = parse_constraint(c.text)
        names = sorted({n for n in re.findall(r"[A-Za-z_][\w.]*", c.text) if n in em.sources}
                       or (lhs.variables | rhs.variables))  # the dims read, also inside mod(...) and the like
        operands = [em.var(n, arg_types) for n in names]
        cond = em.value(f"stablehlo.compare {_CMP[op]}, {em.dim(lhs, arg_types)}, {em.dim(rhs, arg_types)}, SIGNED "
                        ": (tensor<i64>, tensor<i64>) -> tensor<i1>")
        where = "; ".join(f"{n} is argument '{signature.args[em.sources[n][0]].name}' dim {em.sources[n][1]}"
                          for n in names if n in em.sources)
        seen = ", ".join(f"{n} = {{{i}}}" for i, n in enumerate(names))
        message = f"shape constraint '{c.text}' ({c.source}) violated: {seen} ({where})".replace('"', "'")
        em.lines.append(f'stablehlo.custom_call @shape_assertion({", ".join([cond] + operands)}) '
                        f'{{error_message = "{message}", has_side_effect = true}} : '
                        f'({", ".join(["tensor<i1>"] + ["tensor<i64>"] * len(operands))}) -> ()')
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(arg_types))
    text = f"func.func private @__disc_constraints({params}) {{\n  " + "\n  ".join(em.lines + ["return"]) + "\n}"
    parsed = ir.Module.parse(text)  # must outlive the move
    parsed.body.operations[0].operation.move_before(entry)
    block = entry.regions[0].blocks[0]
    with ir.InsertionPoint.at_block_begin(block), entry.location:
        ir.Operation.create("func.call", operands=list(block.arguments),
                            attributes={"callee": ir.FlatSymbolRefAttr.get("__disc_constraints")})
