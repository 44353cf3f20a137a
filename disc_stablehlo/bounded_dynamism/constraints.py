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

from .. import mlir_support  # noqa: F401  (first: loads torch-mlir's native modules, see _load_mlir)
from torch_mlir import ir

from ..errors import CompileError
from ..mlir_support import CMPI_PREDICATES, find_function, function_type, int_constant, walk
from .analysis import Fact, ShapeAnalysis, ShapeFacts
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


@dataclasses.dataclass(frozen=True)
class _Form:
    """How dim values are spelled: i64 StableHLO scalars (the guard, which computes them) or
    shape-dialect extents (the constraint function: facts written for the compiler, read back by
    their ops' names). `div` is used only where it divides exactly; a form without `mod` and
    `floordiv` computes them as Python does from `rem`, which truncates."""
    scalar: str
    ops: dict[str, str]
    const: str
    extent: tuple[str, ...]  # lines reading argument k's dim j ({k}, {j}, {t}: its type, {r}: its rank); the last is the value


_HLO = _Form("tensor<i64>", {"add": "stablehlo.add", "sub": "stablehlo.subtract", "mul": "stablehlo.multiply",
                             "div": "stablehlo.divide", "rem": "stablehlo.remainder", "max": "stablehlo.maximum",
                             "min": "stablehlo.minimum"},
             "stablehlo.constant dense<{k}> : tensor<i64>",
             ("stablehlo.get_dimension_size %a{k}, dim = {j} : ({t}) -> tensor<i32>",
              "stablehlo.convert {0} : (tensor<i32>) -> tensor<i64>"))
_SHAPE = _Form("index", {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli", "div": "arith.floordivsi",
                         "floordiv": "arith.floordivsi", "mod": "arith.remsi", "max": "arith.maxsi", "min": "arith.minsi"},
               "arith.constant {k} : index",
               ("shape.shape_of %a{k} : {t} -> tensor<{r}xindex>", "arith.constant {j} : index",
                "shape.get_extent {0}, {1} : tensor<{r}xindex>, index -> index"))


class _Emitter:
    """Builds scalar values of dim expressions from argument dims, in one `_Form`."""

    def __init__(self, signature: Signature, arg_types: list[ir.Type], form: _Form):
        self.lines: list[str] = []
        self.n = 0
        self.form = form
        self.arg_types = arg_types
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
        return self.value(self.form.const.format(k=k))

    def binary(self, op: str, a: str, b: str) -> str:
        return self.value(f"{self.form.ops[op]} {a}, {b} : {self.form.scalar}")

    def expressible(self, d: Dim) -> bool:
        """Whether every variable of `d` (also inside mod(...) and the like) is an argument's dim."""
        for v in d.variables:
            atom = split_atom(v)
            if not (self.expressible(atom[1]) and self.expressible(atom[2]) if atom else v in self.sources):
                return False
        return True

    def var(self, name: str) -> str:
        if name in self.cache:
            return self.cache[name]
        atom = split_atom(name)
        if atom is not None:
            fn, arg, other = atom
            by_dims = fn in ("mod", "floordiv") and other.constant is None  # a divisor below 1 counts as 1: no trap
            a, b = self.dim(arg), self.binary("max", self.dim(other), self.const(1)) if by_dims else self.dim(other)
            if fn in ("mod", "floordiv") and fn not in self.form.ops:  # Python's (torch's guards: mod(-s, 4) pads s to a multiple of 4)
                m = self.binary("rem", self.binary("add", self.binary("rem", a, b), b), b)  # the sign of b
                v = m if fn == "mod" else self.binary("div", self.binary("sub", a, m), b)  # an exact division
            else:
                v = self.binary(fn, a, b)
        elif name in self.sources:
            k, j, coeff, const = self.sources[name]
            v = self.extent(k, j)
            if const:
                v = self.binary("sub", v, self.const(const))
            if coeff != 1:
                v = self.binary("div", v, self.const(coeff))  # (a size of another form fails the check of the derived dim)
        else:
            raise CompileError(f"constraint uses '{name}', which is not a dimension variable of the arguments "
                               f"(known: {', '.join(sorted(self.sources)) or 'none'})")
        self.cache[name] = v
        return v

    def extent(self, k: int, j: int) -> str:
        """The size of argument k's dim j."""
        t = self.arg_types[k]
        read: list[str] = []
        for line in self.form.extent:
            read.append(self.value(line.format(*read, k=k, j=j, t=t, r=ir.ShapedType(t).rank)))
        return read[-1]

    def dim(self, d: Dim) -> str:
        total = None
        for mono, coeff in d.terms.items():
            term = self.const(coeff)
            for v in mono:
                term = self.binary("mul", term, self.var(v))
            total = term if total is None else self.binary("add", total, term)
        return total if total is not None else self.const(0)


def add_constraint_guards(module: ir.Module, entry: ir.Operation, signature: Signature, constraints: list[Constraint]) -> None:
    """Adds a shape assertion per constraint at the top of the entry function, and one per
    argument dim given as an expression of dimension variables (torch.export's derived dims,
    `2 * Dim("h")`: the size must be that expression of a whole value of the variable, which is
    solved from it or from the dim that defines the variable)."""
    derived = [(k, j, Dim.of(d)) for k, spec in enumerate(signature.args) for j, d in enumerate(spec.shape)
               if isinstance(d, str) and Dim.of(d).terms != {(d,): 1}]
    if not constraints and not derived:
        return
    arg_types = list(function_type(entry).inputs)
    em = _Emitter(signature, arg_types, _HLO)
    for k, j, d in derived:
        if not em.expressible(d):  # a product of variables no dim gives alone: its factors stay unchecked here
            continue
        size = em.extent(k, j)
        cond = em.value(f"stablehlo.compare EQ, {size}, {em.dim(d)}, SIGNED : (tensor<i64>, tensor<i64>) -> tensor<i1>")
        message = (f"argument '{signature.args[k].name}' dim {j} is {{0}}, which is not {d} for any whole "
                   f"{' and '.join(sorted(d.variables))}").replace('"', "'")
        em.lines.append(f'stablehlo.custom_call @shape_assertion({cond}, {size}) {{error_message = "{message}", has_side_effect = true}} : '
                        f'(tensor<i1>, tensor<i64>) -> ()')
    for c in constraints:
        lhs, op, rhs = parse_constraint(c.text)
        names = sorted({n for n in re.findall(r"[A-Za-z_][\w.]*", c.text) if n in em.sources}
                       or (lhs.variables | rhs.variables))  # the dims read, also inside mod(...) and the like
        operands = [em.var(n) for n in names]
        cond = em.value(f"stablehlo.compare {_CMP[op]}, {em.dim(lhs)}, {em.dim(rhs)}, SIGNED "
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


# The facts live in the IR. Those over the arguments' dims are shape-dialect constraints in a
# function of their own (`shape.cstr_eq` of extents, `shape.cstr_require` of comparisons,
# `shape.cstr_broadcastable` for the broadcasts checked at run time, all combined by
# `shape.assuming_all` and guarding, through `shape.assuming`, the extents it returns); the
# others (they name intermediates' symbols) are a module attribute.
CONSTRAINT_FUNCTION = "disc_shape_constraints"
FACTS_ATTR = "disc.shape_facts"      # module: ["b*s == 4*#reshape3 [dynamic_reshape keeps the element count]", ...]
DIMS_ATTR = "disc.symbolic_dims"     # the constraint function's arguments: ["b", "s", "8"]
SOURCE_ATTR = "disc.source"          # on each shape.cstr_*: where the fact comes from
_PREDICATES = {"==": "eq", "!=": "ne", ">=": "sge", "<=": "sle", ">": "sgt", "<": "slt"}


def _quote(text: str) -> str:
    return text.replace("\\", "/").replace('"', "'")


def constraint_function(module: ir.Module) -> ir.Operation | None:
    return find_function(module, CONSTRAINT_FUNCTION)


def save_to_ir(module: ir.Module, entry: ir.Operation, signature: Signature, analysis: ShapeAnalysis) -> None:
    """Writes the facts into the IR (replacing what was there): the shape-dialect constraint
    function and the module attribute."""
    if (old := constraint_function(module)) is not None:
        old.erase()
    arg_types = list(function_type(entry).inputs)
    em = _Emitter(signature, arg_types, _SHAPE)
    witnesses, rest = [], []
    for fact in analysis.facts.facts:
        try:
            lhs, op, rhs = parse_constraint(fact.text)
        except CompileError:  # names an intermediate's symbol ('#')
            lhs = op = rhs = None
        if op is None or not (em.expressible(lhs) and em.expressible(rhs)):
            rest.append(ir.StringAttr.get(f"{fact.text} [{fact.source}]"))
            continue
        source = f'{{{SOURCE_ATTR} = "{_quote(fact.source)}"}}'
        a, b = em.dim(lhs), em.dim(rhs)
        if op == "==":
            sa, sb = (em.value(f"shape.from_extents {x} : index") for x in (a, b))
            witnesses.append(em.value(f'"shape.cstr_eq"({sa}, {sb}) {source} : (!shape.shape, !shape.shape) -> !shape.witness'))
        else:
            cond = em.value(f"arith.cmpi {_PREDICATES[op]}, {a}, {b} : index")
            witnesses.append(em.value(f'"shape.cstr_require"({cond}) {{msg = "{fact.text}", {SOURCE_ATTR} = "{_quote(fact.source)}"}} '
                                      ": (i1) -> !shape.witness"))
    for b in analysis.broadcasts:  # what the run-time check of a broadcast requires
        dims = [analysis.facts.canon(d) for d in b.operand + b.target]
        if b.runtime_checked and all(em.expressible(d) for d in dims):
            sa, sb = (em.value(f"shape.from_extents {', '.join(em.dim(d) for d in half)} : {', '.join(['index'] * len(half))}")
                      for half in (dims[:len(b.operand)], dims[len(b.operand):]))
            witnesses.append(em.value(f'"shape.cstr_broadcastable"({sa}, {sb}) {{{SOURCE_ATTR} = "broadcast at {_quote(b.location)}, '
                                      'checked at run time"} : (!shape.shape, !shape.shape) -> !shape.witness'))
    extents = [em.var(v) for v in sorted(em.sources)]
    all_ = em.value(f"shape.assuming_all {', '.join(witnesses)}") if witnesses else em.value("shape.const_witness true")
    types = ", ".join(["index"] * len(extents))
    results = f"%guarded:{len(extents)} = " if extents else ""
    em.lines.append(f"{results}shape.assuming {all_} -> ({types}) {{\n    shape.assuming_yield {', '.join(extents)}"
                    f"{' : ' + types if extents else ''}\n  }}")
    returned = ", ".join(f"%guarded#{i}" for i in range(len(extents)))
    em.lines.append(f"return {returned}{' : ' + types if extents else ''}")
    params = ", ".join(f"%a{i}: {t} {{{DIMS_ATTR} = [{', '.join(chr(34) + str(analysis.facts.canon(d)) + chr(34) for d in dims)}]}}"
                       for i, (t, (_, dims)) in enumerate(zip(arg_types, analysis.args)))
    text = (f"func.func @{CONSTRAINT_FUNCTION}({params}) -> ({types}) {{\n  " + "\n  ".join(em.lines) + "\n}")
    parsed = ir.Module.parse(text)  # must outlive the move
    parsed.body.operations[0].operation.move_before(entry)
    module.operation.attributes[FACTS_ATTR] = ir.ArrayAttr.get(rest)


_ARITH = {"arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b}
_BY_CONSTANT = {"arith.floordivsi": Dim.floordiv, "arith.remsi": Dim.mod}


def load_from_ir(module: ir.Module, signature: Signature) -> tuple[list[Constraint], list[Constraint]]:
    """Reads back the facts a module carries (one compiled before and saved) and removes them:
    the constraint function's ops, evaluated over this signature's dims (constraints on the
    arguments, guarded like the user's), and the module attribute (facts on intermediates)."""
    found: list[Constraint] = []
    if (func := constraint_function(module)) is not None:
        value: dict[ir.Value, Dim | list[Dim]] = {}
        compare: dict[ir.Value, tuple[Dim, str, Dim]] = {}
        ops = {v: k for k, v in _PREDICATES.items()}
        for op in walk(func):
            name, known = op.name, [value.get(v) for v in op.operands]
            if name == "shape.shape_of" and isinstance(op.operands[0].owner, ir.Block):
                value[op.result] = [Dim.of(d) for d in signature.args[op.operands[0].arg_number].shape]
            elif name == "arith.constant" and isinstance(op.result.type, ir.IndexType):
                value[op.result] = Dim.const(int_constant(op.result))
            elif name == "shape.get_extent" and None not in known and known[1].constant is not None:
                value[op.result] = known[0][known[1].constant]
            elif name in _ARITH and None not in known:
                value[op.result] = _ARITH[name](*known)
            elif name in _BY_CONSTANT and None not in known and known[1].constant:
                value[op.result] = _BY_CONSTANT[name](known[0], known[1].constant)
            elif name == "shape.from_extents" and None not in known:
                value[op.result] = list(known)
            elif name == "shape.const_shape":  # canonicalization folds extents that are constants
                value[op.result] = [Dim.const(int(v)) for v in ir.DenseIntElementsAttr(op.attributes["shape"])]
            elif name == "arith.cmpi" and None not in known:
                compare[op.result] = (known[0], ops[CMPI_PREDICATES[ir.IntegerAttr(op.attributes["predicate"]).value]], known[1])
            elif name in ("shape.cstr_eq", "shape.cstr_require"):
                source = ir.StringAttr(op.attributes[SOURCE_ATTR]).value if SOURCE_ATTR in op.attributes else "saved module"
                if name == "shape.cstr_eq" and None not in known:
                    found += [Constraint(f"{a} == {b}", source) for a, b in zip(known[0], known[1]) if a != b]
                elif name == "shape.cstr_require" and op.operands[0] in compare:
                    lhs, cmp, rhs = compare[op.operands[0]]
                    found.append(Constraint(f"{lhs} {cmp} {rhs}", source))
        func.erase()
    facts = []
    if FACTS_ATTR in module.operation.attributes:
        for item in ir.ArrayAttr(module.operation.attributes[FACTS_ATTR]):
            text, _, source = ir.StringAttr(item).value.rpartition(" [")
            facts.append(Constraint(text, source.rstrip("]")))
        del module.operation.attributes[FACTS_ATTR]
    return found, facts
