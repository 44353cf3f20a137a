"""Symbolic dimensions: a dim is a polynomial with integer coefficients over dimension variables
(as in JAX's shape polymorphism). Terms that are not polynomial (`mod(s, 8)`, `floordiv(s, 3)`,
a size read from data) are opaque atoms: variables whose name is their text.

`parse` reads JAX's printed dims (`2*b + 1`, `mod(s, 8)`) and user constraints; `Dim` values
support + - * and floor division by a constant, compare structurally and evaluate at concrete
values of the variables."""

from __future__ import annotations

import re
from typing import Mapping

from ..errors import CompileError

Monomial = tuple[str, ...]  # sorted variable names, repeated for powers; () is the constant term


class Dim:
    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[Monomial, int]):
        self.terms = {m: c for m, c in terms.items() if c != 0}

    @staticmethod
    def const(value: int) -> Dim:
        return Dim({(): value})

    @staticmethod
    def var(name: str) -> Dim:
        return Dim({(name,): 1})

    @staticmethod
    def of(value: int | str | Dim) -> Dim:
        if isinstance(value, Dim):
            return value
        return Dim.const(value) if isinstance(value, int) else parse(value)

    @property
    def constant(self) -> int | None:
        """The value when the dim has no variable."""
        if not self.terms:
            return 0
        return self.terms.get(()) if list(self.terms) == [()] else None

    @property
    def variables(self) -> set[str]:
        return {v for m in self.terms for v in m}

    def __add__(self, other: int | Dim) -> Dim:
        other = Dim.of(other)
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Dim(terms)

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return Dim({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: int | Dim) -> Dim:
        return self + (-Dim.of(other))

    def __rsub__(self, other: int | Dim) -> Dim:
        return Dim.of(other) - self

    def __mul__(self, other: int | Dim) -> Dim:
        other = Dim.of(other)
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Dim(terms)

    __rmul__ = __mul__

    def floordiv(self, k: int) -> Dim:
        if k == 1:
            return self
        if all(c % k == 0 for c in self.terms.values()):
            return Dim({m: c // k for m, c in self.terms.items()})
        if (c := self.constant) is not None:
            return Dim.const(c // k)
        return Dim.var(f"floordiv({self}, {k})")

    def mod(self, k: int) -> Dim:
        if (c := self.constant) is not None:
            return Dim.const(c % k)
        if all(c % k == 0 for c in self.terms.values()):
            return Dim.const(0)
        return Dim.var(f"mod({self}, {k})")

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value at concrete variable values; opaque atoms are evaluated from their text."""
        total = 0
        for m, c in self.terms.items():
            term = c
            for v in m:
                term *= env[v] if v in env else _evaluate_atom(v, env)
            total += term
        return total

    def substitute(self, env: Mapping[str, Dim]) -> Dim:
        total = Dim.const(0)
        for m, c in self.terms.items():
            term = Dim.const(c)
            for v in m:
                term = term * env.get(v, Dim.var(v))
            total = total + term
        return total

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            other = Dim.const(other)
        return isinstance(other, Dim) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.terms.items())))

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda mc: (-len(mc[0]), mc[0])):
            body = "*".join(m)
            if not body:
                parts.append(str(c))
            elif c == 1:
                parts.append(body)
            elif c == -1:
                parts.append(f"-{body}")
            else:
                parts.append(f"{c}*{body}")
        return " + ".join(parts).replace("+ -", "- ")

    __repr__ = __str__


def split_atom(name: str) -> tuple[str, Dim, Dim] | None:
    """`mod(s, 8)` -> ("mod", s, 8): an opaque atom's function and arguments; None for a variable."""
    m = re.fullmatch(r"(mod|floordiv|max|min)\((.*)\)", name)
    if not m:
        return None
    depth, split = 0, None
    for i, ch in enumerate(m.group(2)):  # the top-level comma
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            split = i
    return m.group(1), parse(m.group(2)[:split]), parse(m.group(2)[split + 1:])


def _evaluate_atom(name: str, env: Mapping[str, int]) -> int:
    atom = split_atom(name)
    if atom is None:
        raise KeyError(name)
    fn, a, b = atom[0], atom[1].evaluate(env), atom[2].evaluate(env)
    return {"mod": a % max(b, 1), "floordiv": a // max(b, 1), "max": max(a, b), "min": min(a, b)}[fn]


# names: dimension variables, and the fresh symbols of intermediates (`dynamic_broadcast_in_dim#12`)
_NAME = re.compile(r"[A-Za-z_][\w.]*(?:#\d*)?")
_TOKEN = re.compile(rf"\s*(?:(\d+)|({_NAME.pattern})|(//|>=|<=|==|!=|[-+*(),<>%]))")


class _Parser:
    def __init__(self, text: str):
        self.text, self.tokens, pos = text, [], 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise CompileError(f"cannot parse dimension expression {text!r} at {text[pos:]!r}")
            self.tokens.append(m.group(1) or m.group(2) or m.group(3))
            pos = m.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise CompileError(f"cannot parse dimension expression {self.text!r}: expected {expected or 'more'}, got {tok!r}")
        self.i += 1
        return tok

    def expr(self) -> Dim:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Dim:
        value = self.factor()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            rhs = self.factor()
            if op == "*":
                value = value * rhs
            else:
                value = _divided(self.text, "floordiv" if op == "//" else "mod", value, rhs)
        return value

    def factor(self) -> Dim:
        tok = self.take()
        if tok == "-":
            return -self.factor()
        if tok == "(":
            value = self.expr()
            self.take(")")
            return value
        if tok.isdigit():
            return Dim.const(int(tok))
        if tok in ("mod", "floordiv") and self.peek() == "(":
            self.take("(")
            arg = self.expr()
            self.take(",")
            divisor = self.expr()
            self.take(")")
            return _divided(self.text, tok, arg, divisor)
        if tok in ("max", "min", "non_negative") and self.peek() == "(":  # opaque: a variable named by its text
            depth, start = 0, self.i - 1
            while True:
                t = self.take()
                depth += t == "("
                depth -= t == ")"
                if depth == 0:
                    break
            return Dim.var("".join(self.tokens[start:self.i]))
        if _NAME.fullmatch(tok):
            return Dim.var(tok)
        raise CompileError(f"cannot parse dimension expression {self.text!r}: unexpected {tok!r}")


def _divided(text: str, fn: str, value: Dim, divisor: Dim) -> Dim:
    """floordiv / mod: by a constant, simplified where it can be; by an expression of dims, an
    opaque atom (the checks compute it, counting a divisor below 1 as 1)."""
    k = divisor.constant
    if k is None:
        return Dim.var(f"{fn}({value}, {divisor})")
    if k <= 0:
        raise CompileError(f"{text!r}: {fn} needs a positive divisor")
    return value.floordiv(k) if fn == "floordiv" else value.mod(k)


def parse(text: str) -> Dim:
    p = _Parser(text)
    value = p.expr()
    if p.peek() is not None:
        raise CompileError(f"cannot parse dimension expression {text!r}: trailing {p.peek()!r}")
    return value


COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


def parse_constraint(text: str) -> tuple[Dim, str, Dim]:
    """'s >= 8', 'mod(s, 8) == 0', 'b <= 64', 's == 2*t' -> (lhs, op, rhs)."""
    p = _Parser(text)
    lhs = p.expr()
    op = p.take()
    if op not in COMPARISONS:
        raise CompileError(f"constraint {text!r}: expected one of {', '.join(COMPARISONS)}, got {op!r}")
    rhs = p.expr()
    if p.peek() is not None:
        raise CompileError(f"constraint {text!r}: trailing {p.peek()!r}")
    return lhs, op, rhs
