"""The registry of the project's own StableHLO rewrites and the text-template machinery most of
them use.

A template lowering turns ONE op instance into a private function written as MLIR text (typed
for that instance: `%a0..%aN` are the operands) whose body uses tensor / linalg / scf / arith ops
and StableHLO ops that the upstream conversion handles. The op is replaced by a call, and the
inliner later dissolves the call. Rewrites that must move regions (control flow) are plain
Python functions registered the same way."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from torch_mlir import ir

from ..errors import UnsupportedOpError
from ..bounded_dynamism.guards import CHECK_SHAPE
from ..mlir_support import describe, find_function, function_type, is_inside, llvm_string, location_text, new_private_function, walk

Rewrite = Callable[[ir.Operation, "LoweringState"], None]
Predicate = Callable[[ir.Operation], bool]
_REWRITES: dict[str, list[tuple[Rewrite, Predicate]]] = {}


def register_rewrite(*op_names: str, when: Predicate = lambda op: True) -> Callable[[Rewrite], Rewrite]:
    """Registers a rewrite for ops of these names, for the instances `when` accepts (the
    others are left to the next rewrite registered for the name, then to the upstream
    conversion)."""
    def deco(fn: Rewrite) -> Rewrite:
        for name in op_names:
            _REWRITES.setdefault(name, []).append((fn, when))
        return fn
    return deco


def applies(op: ir.Operation) -> Rewrite | None:
    return next((rewrite for rewrite, when in _REWRITES.get(op.name, ()) if when(op)), None)


GPU_ATTR = "disc.gpu"  # on a module compiled for a GPU: lowerings that call the RAL's CPU-only entries choose others


class LoweringState:
    """Per-module state: fresh symbol names and the module new functions go into."""

    def __init__(self, module: ir.Module):
        self.module = module
        self.counter = 0
        self.declared: set[str] = set()
        self.functions: dict[str, str] = {}  # a replacing function's text, its name written @_: its name

    def fresh_symbol(self, stem: str) -> str:
        self.counter += 1
        return f"__disc_{stem}_{self.counter}"

    def add_function(self, text: str) -> None:
        """Parses functions (with the declarations they need) into the module; a declaration
        the module has already is not added twice."""
        parsed = ir.Module.parse(text)  # must outlive the moves
        for op in list(parsed.body.operations):
            name = ir.StringAttr(op.attributes["sym_name"]).value
            if name not in self.declared:
                self.declared.add(name)
                op.operation.move_before(self.module.body.operations[0])

    def region_function(self, region: ir.Region, stem: str, text: "Text") -> str:
        """Moves a StableHLO region (scalar-tensor arguments, `stablehlo.return`) into a new
        private function, declares it in `text`, and returns its name."""
        name = self.fresh_symbol(stem)
        block = region.blocks[0]
        arg_types = [a.type for a in block.arguments]
        ret = block.operations[len(block.operations) - 1]
        result_types = [v.type for v in ret.operands]
        func, new_block = new_private_function(self.module, name, arg_types, result_types)
        for old, new in zip(block.arguments, new_block.arguments):
            old.replace_all_uses_with(new)
        move_ops(block, new_block)
        clone_captured_constants(func, new_block)
        last = new_block.operations[len(new_block.operations) - 1]
        with ir.InsertionPoint(last), last.location:
            ir.Operation.create("func.return", operands=list(last.operands))
        last.erase()
        return self.declare_function(name, text)

    def declare_function(self, name: str, text: "Text") -> str:
        """Declares a function of the module in a template's text (so the template parses) and
        returns its name."""
        func = find_function(self.module, name)
        if func is None:
            raise UnsupportedOpError(f"function @{name} not found")
        ftype = function_type(func)
        self.declared.add(name)
        ins, outs = ", ".join(map(str, ftype.inputs)), ", ".join(map(str, ftype.results))
        text.declarations.append(f"func.func private @{name}({ins}) -> ({outs})")
        return name

    def replace_with_call(self, op: ir.Operation, function_text: str, name: str,
                          users: Sequence[ir.Operation] = ()) -> None:
        """`op` becomes a call of the function `name` (`function_text` defines it, or an identical
        function added before under its own name) on its operands. The call takes the place
        and results of `users[0]` (default: `op`) when the function computes that use of `op` as
        well (e.g. a transpose of its result), reached through the rest of `users` (each the only
        use of the one before, the last the only use of `op`); all are erased."""
        replaced = users[0] if users else op
        erase = [*users, op]  # a user goes first
        # ops that become the same function call one copy of it (the encoder layer's 55 broadcasts
        # are 15 functions): each is inlined where it is called, but parsed once
        key = function_text.replace(f"@{name}(", "@_(")
        if key in self.functions:
            name = self.functions[key]
        else:
            self.functions[key] = name
            self.add_function(function_text)
        with ir.InsertionPoint(replaced), replaced.location:
            call = ir.Operation.create("func.call", results=[r.type for r in replaced.results], operands=list(op.operands),
                                       attributes={"callee": ir.FlatSymbolRefAttr.get(name)})
        for old, new in zip(replaced.results, call.results):
            old.replace_all_uses_with(new)
        for dead in erase:
            dead.erase()


def clone_captured_constants(func: ir.Operation, block: ir.Block) -> None:
    """StableHLO regions may use values defined above them (CSE shares constants with the
    enclosing function); a function may not, so captured constants are cloned in (which also lets
    LLVM see them as constants)."""
    for op in walk(func):
        for i, v in enumerate(op.operands):
            owner = v.owner
            if isinstance(owner, ir.Block) or is_inside(owner, func):
                continue
            if owner.name not in ("stablehlo.constant", "arith.constant"):
                raise UnsupportedOpError(f"region of {func.attributes['sym_name']} captures {describe(owner)}")
            with ir.InsertionPoint.at_block_begin(block):
                clone = owner.clone()
            op.operands[i] = clone.result


def move_ops(src: ir.Block, dst: ir.Block) -> None:
    """Moves every op of `src` to the end of `dst`, in order."""
    for op in list(src.operations):
        dst.append(op.operation)


def _dynamic_sizes(type_: ir.Type, dims: list[str]) -> str:
    """The operands a tensor-creating op takes: the sizes of the type's dynamic dims."""
    t = ir.RankedTensorType(type_)
    return ", ".join(d for i, d in enumerate(dims) if t.is_dynamic_dim(i))


class Text:
    """Builds the body of a template function: SSA names, constants, dims."""

    def __init__(self):
        self.lines: list[str] = []
        self._constants: list[str] = []  # at the top of the function: they dominate every region
        self._n = 0
        self._consts: dict[tuple[str, str], str] = {}
        self.declarations: list[str] = []  # functions the body calls (parsed along with it)

    def fresh(self, stem: str = "v") -> str:
        self._n += 1
        return f"%{stem}{self._n}"

    def __call__(self, rhs: str, stem: str = "v") -> str:
        name = self.fresh(stem)
        self.lines.append(f"{name} = {rhs}")
        return name

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def const(self, value: int | float | str, type_: str = "index") -> str:
        key = (str(value), type_)
        if key not in self._consts:
            name = self.fresh("c")
            literal = str(value) if value in ("true", "false") else f"{value} : {type_}"
            self._constants.append(f"{name} = arith.constant {literal}")
            self._consts[key] = name
        return self._consts[key]

    def dim(self, value: str, type_: ir.Type, i: int) -> str:
        t = ir.RankedTensorType(type_)
        if not t.is_dynamic_dim(i):
            return self.const(t.shape[i])
        return self(f"tensor.dim {value}, {self.const(i)} : {type_}", "d")

    def dims(self, value: str, type_: ir.Type) -> list[str]:
        return [self.dim(value, type_, i) for i in range(ir.RankedTensorType(type_).rank)]

    def extract_index(self, tensor: str, type_: ir.Type, position: Iterable[str] = ()) -> str:
        """A scalar of an integer tensor (at `position`) as an index."""
        elem = str(ir.RankedTensorType(type_).element_type)
        v = self(f"tensor.extract {tensor}[{', '.join(position)}] : {type_}")
        if elem == "index":
            return v
        if elem.startswith("ui"):  # arith takes signless integers only; make_signless drops the cast later
            bits = self(f"builtin.unrealized_conversion_cast {v} : {elem} to {elem[1:]}")
            return self(f"arith.index_castui {bits} : {elem[1:]} to index")
        return self(f"arith.index_cast {v} : {elem} to index")

    def empty(self, type_: ir.Type, dims: list[str]) -> str:
        return self(f"tensor.empty({_dynamic_sizes(type_, dims)}) : {type_}")

    def buffer(self, type_: ir.Type, dims: list[str]) -> str:
        """A new tensor that is a buffer of its own: unlike `empty`, never merged with another
        of the same type (two `tensor.empty`s that CSE makes one would give loops that write
        both a single buffer)."""
        return self(f"bufferization.alloc_tensor({_dynamic_sizes(type_, dims)}) : {type_}")

    def check(self, state: "LoweringState", op: ir.Operation, failed: str, contract: str, a: str, b: str) -> None:
        """Ends the call with a ShapeError where `failed` (an i1) holds at run time: the op, its
        location and `contract`, in which "{0}" and "{1}" are the index values `a` and `b`."""
        name, declaration = state.fresh_symbol("contract"), f"func.func private @{CHECK_SHAPE}(i64, !llvm.ptr, i64, i64)"
        self.declarations += [llvm_string(name, f"{op.name} at {location_text(op)}: {contract}")]
        if declaration not in self.declarations:
            self.declarations.append(declaration)
        args = [self(f"arith.extui {failed} : i1 to i64"), self(f"llvm.mlir.addressof @{name} : !llvm.ptr"),
                self(f"arith.index_cast {a} : index to i64"), self(f"arith.index_cast {b} : index to i64")]
        self.emit(f"func.call @{CHECK_SHAPE}({', '.join(args)}) : (i64, !llvm.ptr, i64, i64) -> ()")

    def clamp(self, v: str, lo: str, hi: str) -> str:
        return self(f"arith.maxsi {self(f'arith.minsi {v}, {hi} : index')}, {lo} : index")

    def function(self, name: str, op: ir.Operation, result_types: list[ir.Type] | None = None) -> str:
        """The function of `op`'s operands (`%a0`..) returning `result_types` (default: op's)."""
        params = ", ".join(f"%a{i}: {v.type}" for i, v in enumerate(op.operands))
        return self.function_of(name, params, ", ".join(str(r) for r in (result_types or [r.type for r in op.results])))

    def function_of(self, name: str, params: str, results: str) -> str:
        """The private function `name` of these parameters and result types, with the body written
        (and the declarations it needs)."""
        body = "\n  ".join(self._constants + self.lines)
        return "\n".join(self.declarations + [f"func.func private @{name}({params}) -> ({results}) {{\n  {body}\n}}"])


Template = Callable[[ir.Operation, Text, "LoweringState"], list[str]]


def register_template(*op_names: str, when: Predicate = lambda op: True) -> Callable[[Template], Template]:
    """Registers a text template: `fn(op, text, state)` appends body lines to `text` and
    returns the values to return."""
    def deco(fn: Template) -> Template:
        def rewrite(op: ir.Operation, state: LoweringState) -> None:
            text = Text()
            results = fn(op, text, state)
            types = ", ".join(str(r.type) for r in op.results)
            text.emit(f"return {', '.join(results)} : {types}" if results else "return")
            name = state.fresh_symbol(op.name.split(".")[-1])
            state.replace_with_call(op, text.function(name, op), name)
        register_rewrite(*op_names, when=when)(rewrite)
        return fn
    return deco


def lower_module(module: ir.Module) -> None:
    """Applies registered rewrites until none applies (rewrites may expose new ops, e.g. the
    bodies of regions moved into functions). Consumers go first: a rewrite that reads what
    makes its operands (constant window parameters) sees the ops, not the calls they become."""
    state = LoweringState(module)
    for _ in range(8):
        pending = [op for op in walk(module.operation) if applies(op)]
        if not pending:
            return
        for op in reversed(pending):
            try:
                applies(op)(op, state)
            except UnsupportedOpError:
                raise
            except Exception as e:
                raise UnsupportedOpError(f"cannot lower {describe(op)}: {e}") from None
    raise UnsupportedOpError("lowering did not converge")
