"""ATen ops torch-mlir cannot lower to StableHLO for dynamic shapes, or lowers to slower forms,
and our own operators, rewritten in its torch-dialect module (between the FX import and the
StableHLO conversion) into calls of functions written here in StableHLO between `torch_c` casts:

- `aten.cumsum` and `aten.cumprod`: a `dynamic_reduce_window` over the whole dim (torch-mlir's own
  lowering of cumsum needs the dim static, and it has none of cumprod); compiled as a one-pass
  scan (passes/region_ops.py);
- `aten.sort`: a `stablehlo.sort` with an index operand from `dynamic_iota` (torch-mlir's builds
  a `stablehlo.iota` of dynamic shape, which StableHLO forbids), NaN above everything as in torch;
- `aten.topk`: the k largest as JAX's `stablehlo.composite "chlo.top_k"` (a selection,
  passes/top_k.py), along the last dim (others transposed there); the k smallest a sort and a slice;
- `aten.scatter_reduce` (sum, prod, amax, amin; which torch-mlir cannot convert): a
  `stablehlo.scatter` with the reduction as its combiner;
- `aten.nonzero` and `aten.repeat_interleave.Tensor` (sizes the data decides), which torch-mlir
  cannot convert: prefix sums, a scatter and a slice to a count read from the data;
- `disc::grouped_mm` (torch_frontend.grouped_mm_op: the grouped GEMM of mixture-of-experts
  layers), a `torch.operator` torch-mlir's backend pipeline refuses, so rewritten before it: our
  custom call for the RAL's grouped GEMM (ops.GROUPED_GEMM_TARGET); `disc::check` (an assertion
  over sizes the data decides) and `disc::fft` (torch.fft's transforms) likewise become our custom
  calls `ops.ASSERT_TARGET` and `ops.FFT_TARGET`;
- `aten.cummax` and `aten.cummin` (operators torch-mlir has no conversion for): a running maximum
  (minimum) as a scan, and each position's index as a running maximum of the positions holding it;
- `disc::lstm` and `disc::rnn` (torch_frontend.recurrent_ops: nn.LSTM, nn.GRU and nn.RNN, which
  torch.export would unroll over a sequence of fixed length): per layer and direction, one
  product for every step's input, then a `stablehlo.while` over the sequence (`_Recurrence`).
"""

from __future__ import annotations

import re
from typing import Any

from .stablehlo_text import Body, is_float, tensor_type

_DTYPES = {"si64": "i64", "si32": "i32", "si16": "i16", "si8": "i8"}  # the rest are spelled alike


def _builtin(torch_type: Any) -> tuple[list[int | None], str]:
    """The shape (None for a dynamic dim) and builtin element type of a `!torch.vtensor`."""
    m = re.fullmatch(r"!torch\.vtensor<\[([^\]]*)\],(\w+)>", str(torch_type))
    if m is None:
        raise ValueError(f"not a ranked value tensor: {torch_type}")
    shape = [None if d == "?" else int(d) for d in m.group(1).split(",")] if m.group(1) else []
    return shape, _DTYPES.get(m.group(2), m.group(2))


def _constant_operand(value: Any) -> Any:
    """The Python value of a `torch.constant.*` operand (None for `torch.constant.none`)."""
    from torch_mlir import ir

    op = value.owner
    if op.name == "torch.constant.none":
        return None
    if op.name not in ("torch.constant.int", "torch.constant.bool", "torch.constant.str"):
        raise ValueError(f"expected a constant, got {op.name}")
    attr = op.attributes["value"]
    if op.name == "torch.constant.str":
        return ir.StringAttr(attr).value
    return ir.BoolAttr(attr).value if op.name == "torch.constant.bool" else ir.IntegerAttr(attr).value


_INFINITIES = {"f16": (0xFC00, 0x7C00), "bf16": (0xFF80, 0x7F80), "f32": (0xFF800000, 0x7F800000),
               "f64": (0xFFF0000000000000, 0x7FF0000000000000)}  # (-inf, inf) as bits


def _extreme(elem: str, low: bool) -> str:
    """The lowest or highest value of an element type, as a StableHLO literal: -inf or inf, or
    the integers' extremes."""
    if elem in _INFINITIES:
        return hex(_INFINITIES[elem][0 if low else 1])
    if elem == "i1":
        return "false" if low else "true"
    bits = int(elem.lstrip("ui"))
    if elem.startswith("ui"):
        return "0" if low else str((1 << bits) - 1)
    return str(-(1 << (bits - 1)) if low else (1 << (bits - 1)) - 1)


def _comparator(elem: str, descending: bool) -> str:
    """The region of a stable sort of (values, i64 indices): ascending or descending, NaN above
    every number and NaNs alike, as torch orders them."""
    s = f"tensor<{elem}>"
    lines = [f"^bb0(%a: {s}, %b: {s}, %i: tensor<i64>, %j: tensor<i64>):"]
    if is_float(elem):
        lines += [f"%before = stablehlo.compare {'GT' if descending else 'LT'}, %a, %b, FLOAT : ({s}, {s}) -> tensor<i1>",
                  f"%nan_a = stablehlo.compare NE, %a, %a, FLOAT : ({s}, {s}) -> tensor<i1>",
                  f"%nan_b = stablehlo.compare NE, %b, %b, FLOAT : ({s}, {s}) -> tensor<i1>",
                  f"%number = stablehlo.not {'%nan_b' if descending else '%nan_a'} : tensor<i1>",
                  f"%nan_first = stablehlo.and {'%nan_a' if descending else '%nan_b'}, %number : tensor<i1>",
                  "%r = stablehlo.or %before, %nan_first : tensor<i1>"]
    else:
        kind = "UNSIGNED" if elem.startswith("ui") or elem == "i1" else "SIGNED"
        lines.append(f"%r = stablehlo.compare {'GT' if descending else 'LT'}, %a, %b, {kind} : ({s}, {s}) -> tensor<i1>")
    return "\n    ".join(lines + ["stablehlo.return %r : tensor<i1>"])


def _sort(b: Body, x: str, shape: list[int | None], elem: str, dim: int, descending: bool) -> tuple[str, str]:
    """Values and i64 positions of `x` sorted along `dim`, stably."""
    index_type = tensor_type(shape, "i64")
    iota = b(f"stablehlo.dynamic_iota {b.shape(x, shape, elem)}, dim = {dim} : (tensor<{len(shape)}xi32>) -> {index_type}")
    ty = tensor_type(shape, elem)
    name = b(f'"stablehlo.sort"({x}, {iota}) <{{dimension = {dim} : i64, is_stable = true}}> ({{\n    '
             f"{_comparator(elem, descending)}\n  }}) : ({ty}, {index_type}) -> ({ty}, {index_type})", results=2)
    return f"{name}#0", f"{name}#1"


def _function(name: str, params: list[str], results: list[str], body: Body, returned: list[str]) -> str:
    args = ", ".join(f"%p{i}: {t}" for i, t in enumerate(params))
    text = "\n  ".join(body.lines + [f"return {', '.join(returned)} : {', '.join(results)}" if returned else "return"])
    return f"func.func private @{name}({args}) -> ({', '.join(results)}) {{\n  {text}\n}}"


def _comparison_type(elem: str) -> str:
    """`stablehlo.compare`'s comparison type for an element type."""
    return "FLOAT" if is_float(elem) else ("UNSIGNED" if elem == "i1" or elem.startswith("ui") else "SIGNED")


def _operator_name(op: Any) -> str:
    """A `torch.operator`'s operator name (`torch.aten.cummax`)."""
    from torch_mlir import ir

    return ir.StringAttr(op.attributes["name"]).value


def _list_items(value: Any) -> list[Any]:
    """The values of a `torch.prim.ListConstruct` (a Tensor[] operand)."""
    owner = value.owner
    if owner.name != "torch.prim.ListConstruct":
        raise ValueError(f"expected a list of tensors, got {owner.name}")
    return list(owner.operands)


Value = tuple[str, list[int | None]]  # a name in the function's text and its shape


class _Recurrence:
    """The text of ATen's recurrent layers (`disc::lstm`, `disc::rnn`): per layer and direction, the
    input's projection for every step as one product (its biases added: both of them, but for a
    GRU, whose new gate scales the state's by the reset gate), then a `stablehlo.while` over the
    sequence (backwards for the reverse direction) that multiplies the state by its weights,
    applies the gates and writes the step's state to its place in the output."""

    GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}

    def __init__(self, b: Body, mode: str, elem: str, has_biases: bool, layers: int, dirs: int) -> None:
        self.b, self.mode, self.elem, self.has_biases, self.layers, self.dirs = b, mode, elem, has_biases, layers, dirs

    def ty(self, shape: list[int | None]) -> str:
        return tensor_type(shape, self.elem)

    def op(self, name: str, shape: list[int | None], *operands: str) -> str:
        return self.b(f"stablehlo.{name} {', '.join(operands)} : {self.ty(shape)}")

    def reshaped(self, v: Value, shape: list[int | None], extent: list[str]) -> str:
        """`v` as `shape` (sizes: the tensor<1xi32> `extent`)."""
        if v[1] == shape:
            return v[0]
        return self.b(f"stablehlo.dynamic_reshape {v[0]}, {self.b.vector(extent)} : ({self.ty(v[1])}, tensor<{len(extent)}xi32>) -> "
                      f"{self.ty(shape)}")

    def times_transposed(self, v: Value, w: Value) -> str:
        """v (..., k) times w (n, k) transposed: (..., n)."""
        rank = len(v[1])
        return self.b(f"stablehlo.dot_general {v[0]}, {w[0]}, contracting_dims = [{rank - 1}] x [1] : ({self.ty(v[1])}, {self.ty(w[1])}) -> "
                      f"{self.ty(v[1][:-1] + [w[1][0]])}")

    def broadcast(self, v: Value, shape: list[int | None], extent: list[str]) -> str:
        """A vector along the last dim of `shape`."""
        return self.b(f"stablehlo.dynamic_broadcast_in_dim {v[0]}, {self.b.vector(extent)}, dims = [{len(shape) - 1}] : "
                      f"({self.ty(v[1])}, tensor<{len(shape)}xi32>) -> {self.ty(shape)}")

    def swapped(self, x: Value) -> Value:
        """`x` (a, b, c) as (b, a, c): batch first <-> sequence first."""
        shape = [x[1][1], x[1][0], x[1][2]]
        return self.b(f"stablehlo.transpose {x[0]}, dims = [1, 0, 2] : ({self.ty(x[1])}) -> {self.ty(shape)}"), shape

    def run(self, x: Value, states: list[Value], params: list[Value], batch_first: bool, declared: list[list[int | None]]) -> list[str]:
        b = self.b
        if batch_first:
            x = self.swapped(x)
        seq, batch = x[1][0], x[1][1]
        if any(s[1][1] != batch for s in states):  # a batch size known in one of them only: not known
            batch = None
        self.n_seq, self.n_batch = b.size(x[0], x[1], self.elem, 0), b.size(x[0], x[1], self.elem, 1)
        self.seq, self.batch = seq, batch
        steps = b(f"stablehlo.convert {b(f'stablehlo.reshape {self.n_seq} : (tensor<1xi32>) -> tensor<i32>')} : (tensor<i32>) -> tensor<i64>")
        per = len(params) // (self.layers * self.dirs)
        finals: list[list[Value]] = [[] for _ in states]
        for layer in range(self.layers):
            outputs = []
            for d in range(self.dirs):
                j = layer * self.dirs + d
                initial = [self.initial(s, j) for s in states]
                out, last = self.direction(x, params[j * per:(j + 1) * per], initial, d == 1, steps)
                outputs.append(out)
                for f, v in zip(finals, last):
                    f.append(v)
            width = sum(o[1][2] for o in outputs)
            shape = [seq, batch, width]
            x = outputs[0] if len(outputs) == 1 else (b(f"stablehlo.concatenate {', '.join(o[0] for o in outputs)}, dim = 2 : "
                                                        f"({', '.join(self.ty(o[1]) for o in outputs)}) -> {self.ty(shape)}"), shape)
        if batch_first:
            x = self.swapped(x)
        results = [x]
        for f in finals:  # (layers * directions, batch, size)
            size = f[0][1][1]
            parts = [self.reshaped(v, [1, batch, size], [b.i32(1, 1), self.n_batch, b.i32(size, 1)]) for v in f]
            shape = [len(parts), batch, size]
            results.append((parts[0] if len(parts) == 1 else b(f"stablehlo.concatenate {', '.join(parts)}, dim = 0 : "
                                                               f"({', '.join([self.ty([1, batch, size])] * len(parts))}) -> {self.ty(shape)}"), shape))
        extents = [[self.n_batch if batch_first else self.n_seq, self.n_seq if batch_first else self.n_batch, b.i32(x[1][2], 1)]] + \
            [[b.i32(r[1][0], 1), self.n_batch, b.i32(r[1][2], 1)] for r in results[1:]]
        return [self.reshaped(r, shape, extent) for r, shape, extent in zip(results, declared, extents)]

    def initial(self, state: Value, j: int) -> Value:
        """Layer and direction j's initial state: (batch, size) of the (layers * directions, batch, size) `state`."""
        b = self.b
        size = state[1][2]
        starts = b.vector([b.i32(j, 1), b.i32(0, 1), b.i32(0, 1)])
        limits = b.vector([b.i32(j + 1, 1), self.n_batch, b.i32(size, 1)])
        one = [1, state[1][1], size]
        v = b(f"stablehlo.real_dynamic_slice {state[0]}, {starts}, {limits}, {b.i32(1, 3)} : ({self.ty(state[1])}, tensor<3xi32>, "
              f"tensor<3xi32>, tensor<3xi32>) -> {self.ty(one)}")
        shape = [self.batch, size]
        return self.reshaped((v, one), shape, [self.n_batch, b.i32(size, 1)]), shape

    def direction(self, x: Value, weights: list[Value], initial: list[Value], reverse: bool, steps: str) -> tuple[Value, list[Value]]:
        """One layer's direction over the sequence x (seq, batch, in): its output (seq, batch,
        size) and final states."""
        b, gates = self.b, self.GATES[self.mode]
        w_ih, w_hh = weights[:2]
        biases = weights[2:4] if self.has_biases else []
        projection = weights[-1] if len(weights) == 2 + len(biases) + 1 else None  # an LSTM's proj_size
        width = w_ih[1][0]
        hidden, size = width // gates, w_hh[1][1]
        seq, batch = self.seq, self.batch
        n_width = b.i32(width, 1)
        projected = (self.times_transposed(x, w_ih), [seq, x[1][1], width])
        projected = (self.reshaped(projected, [seq, batch, width], [self.n_seq, self.n_batch, n_width]), [seq, batch, width])
        state_bias = None
        if biases:
            bias = biases[0] if self.mode == "gru" else (self.op("add", [width], biases[0][0], biases[1][0]), [width])
            projected = (self.op("add", projected[1], projected[0], self.broadcast(bias, projected[1], [self.n_seq, self.n_batch, n_width])),
                         projected[1])
            if self.mode == "gru":
                state_bias = self.broadcast(biases[1], [batch, width], [self.n_batch, n_width])
        out_shape = [seq, batch, size]
        out = b.filled("0.0" if is_float(self.elem) else "0", self.elem, b.vector([self.n_seq, self.n_batch, b.i32(size, 1)]), out_shape)
        start = b("stablehlo.constant dense<0> : tensor<i64>")
        carried = [(start, "tensor<i64>"), *[(v, self.ty(shape)) for v, shape in initial], (out, self.ty(out_shape))]
        n = b.n
        args = [f"%s{n}_{i}" for i in range(len(carried))]
        outer, b.lines = b.lines, []
        more = b(f"stablehlo.compare LT, {args[0]}, {steps}, SIGNED : (tensor<i64>, tensor<i64>) -> tensor<i1>")
        condition, b.lines = b.lines, []
        t, states, written = args[0], [(a, shape) for a, (_, shape) in zip(args[1:-1], initial)], args[-1]
        one = b("stablehlo.constant dense<1> : tensor<i64>")
        at = b(f"stablehlo.subtract {b(f'stablehlo.subtract {steps}, {one} : tensor<i64>')}, {t} : tensor<i64>") if reverse else t
        at32 = b(f"stablehlo.reshape {b(f'stablehlo.convert {at} : (tensor<i64>) -> tensor<i32>')} : (tensor<i32>) -> tensor<1xi32>")
        nothing = b.i32(0, 1)
        step_in = b(f"stablehlo.real_dynamic_slice {projected[0]}, {b.vector([at32, nothing, nothing])}, "
                    f"{b.vector([b(f'stablehlo.add {at32}, {b.i32(1, 1)} : tensor<1xi32>'), self.n_batch, n_width])}, {b.i32(1, 3)} : "
                    f"({self.ty(projected[1])}, tensor<3xi32>, tensor<3xi32>, tensor<3xi32>) -> {self.ty([1, batch, width])}")
        step_in = self.reshaped((step_in, [1, batch, width]), [batch, width], [self.n_batch, n_width])
        from_state = self.times_transposed(states[0], w_hh)
        if state_bias is not None:
            from_state = self.op("add", [batch, width], from_state, state_bias)
        new = self.cell(step_in, from_state, states, hidden, projection)
        update = self.reshaped((new[0], [batch, size]), [1, batch, size], [b.i32(1, 1), self.n_batch, b.i32(size, 1)])
        origin = b("stablehlo.constant dense<0> : tensor<i64>")
        written = b(f"stablehlo.dynamic_update_slice {written}, {update}, {at}, {origin}, {origin} : ({self.ty(out_shape)}, "
                    f"{self.ty([1, batch, size])}, tensor<i64>, tensor<i64>, tensor<i64>) -> {self.ty(out_shape)}")
        returned = [b(f"stablehlo.add {t}, {one} : tensor<i64>"), *new, written]
        body, b.lines = b.lines, outer
        types = ", ".join(ty for _, ty in carried)
        block = ", ".join(f"{a}: {ty}" for a, (_, ty) in zip(args, carried))

        def region(lines: list[str], returned: str) -> str:
            return f"^bb0({block}):\n    " + "\n    ".join(lines + [f"stablehlo.return {returned}"])
        loop = b(f'"stablehlo.while"({", ".join(v for v, _ in carried)}) ({{\n  {region(condition, f"{more} : tensor<i1>")}\n  }}, {{\n  '
                 f'{region(body, ", ".join(returned) + " : " + types)}\n  }}) : ({types}) -> ({types})', len(carried))
        finals = [(f"{loop}#{1 + i}", shape) for i, (_, shape) in enumerate(initial)]
        return (f"{loop}#{len(carried) - 1}", out_shape), finals

    def cell(self, step_in: str, from_state: str, states: list[Value], hidden: int, projection: Value | None) -> list[str]:
        """One step's new states from its input's and its state's products (batch, gates * hidden)."""
        b = self.b
        batch = self.batch
        shape = [batch, hidden]
        gates = [batch, hidden * self.GATES[self.mode]]

        def gate(v: str, g: int) -> str:
            starts = b.vector([b.i32(0, 1), b.i32(g * hidden, 1)])
            limits = b.vector([self.n_batch, b.i32((g + 1) * hidden, 1)])
            return b(f"stablehlo.real_dynamic_slice {v}, {starts}, {limits}, {b.i32(1, 2)} : ({self.ty(gates)}, tensor<2xi32>, "
                     f"tensor<2xi32>, tensor<2xi32>) -> {self.ty(shape)}")
        if self.mode == "lstm":
            both = self.op("add", gates, step_in, from_state)
            i, f, g, o = (self.op("tanh" if k == 2 else "logistic", shape, gate(both, k)) for k in range(4))
            c = self.op("add", shape, self.op("multiply", shape, f, states[1][0]), self.op("multiply", shape, i, g))
            h = self.op("multiply", shape, o, self.op("tanh", shape, c))
            if projection is not None:
                h = self.times_transposed((h, shape), projection)
            return [h, c]
        if self.mode == "gru":
            r, z = (self.op("logistic", shape, self.op("add", shape, gate(step_in, k), gate(from_state, k))) for k in range(2))
            n = self.op("tanh", shape, self.op("add", shape, gate(step_in, 2), self.op("multiply", shape, r, gate(from_state, 2))))
            return [self.op("add", shape, n, self.op("multiply", shape, z, self.op("subtract", shape, states[0][0], n)))]
        both = self.op("add", shape, step_in, from_state)
        if self.mode == "rnn_tanh":
            return [self.op("tanh", shape, both)]
        return [self.op("maximum", shape, both, b.filled("0.0", self.elem, b.vector([self.n_batch, b.i32(hidden, 1)]), shape))]


class _Rewriter:
    """Replaces ops of the torch-dialect module by calls of new function declarations, and keeps
    the functions' StableHLO text to define them once the module is StableHLO (the conversion
    turns the declarations' torch types into builtin tensor types; torch-mlir's Python bindings
    parse neither StableHLO nor `torch_c`)."""

    def __init__(self, module: Any) -> None:
        self.module, self.count = module, 0
        self.definitions: list[str] = []

    def name(self, stem: str) -> str:
        self.count += 1
        return f"__disc_torch_{stem}_{self.count}"

    def replace(self, op: Any, stem: str, tensor_operands: list[Any], build) -> None:
        """`build(body, operand names) -> (result names, extra functions)` writes the function body."""

        name = self.name(stem)
        body = Body()
        params = [tensor_type(*_builtin(v.type)) for v in tensor_operands]
        values, extra = build(body, [f"%p{i}" for i in range(len(params))])
        results = [tensor_type(*_builtin(r.type)) for r in op.results]
        self.definitions += [_function(name, params, results, body, values)] + extra
        self.call(op, name, tensor_operands)

    def call(self, op: Any, name: str, operands: list[Any]) -> None:
        """Replaces `op` by a call of the function `name` (declared here, defined by its text in
        `definitions`) with these operands."""
        from torch_mlir import ir

        types = ir.FunctionType.get([v.type for v in operands], [r.type for r in op.results])
        with ir.InsertionPoint.at_block_begin(self.module.body), op.location:
            ir.Operation.create("func.func", attributes={"sym_name": ir.StringAttr.get(name), "function_type": ir.TypeAttr.get(types),
                                                         "sym_visibility": ir.StringAttr.get("private")}, regions=1)
        with ir.InsertionPoint(op), op.location:
            call = ir.Operation.create("func.call", results=[r.type for r in op.results], operands=operands,
                                       attributes={"callee": ir.FlatSymbolRefAttr.get(name)})
        for old, new in zip(op.results, call.results):
            old.replace_all_uses_with(new)
        op.erase()

    def prefix_sum(self, b: Body, v: str, shape: list[int | None], elem: str, dim: int, combiner: str = "add") -> tuple[str, str]:
        """The inclusive sum (or `combiner`: "multiply", "maximum", "minimum") of `v` along `dim` (a
        `dynamic_reduce_window` over the whole dim, which the compiler runs as a one-pass scan) and
        the text of its combiner."""
        rank = len(shape)
        add = self.name(combiner)
        if combiner in ("maximum", "minimum"):
            identity = _extreme(elem, low=combiner == "maximum")
        else:
            identity = ("0" if combiner == "add" else "1") + (".0" if is_float(elem) else "")
        zero = b(f"stablehlo.constant dense<{identity}> : tensor<{elem}>")
        n = b.size(v, shape, elem, dim)
        one, nothing = b.i32(1, 1), b.i32(0, 1)
        window = b.vector([n if d == dim else one for d in range(rank)])
        before = b(f"stablehlo.add {n}, {b.i32(-1, 1)} : tensor<1xi32>")
        pads = b.vector([p for d in range(rank) for p in ((before, nothing) if d == dim else (nothing, nothing))])
        padding = b(f"stablehlo.reshape {pads} : (tensor<{2 * rank}xi32>) -> tensor<{rank}x2xi32>")
        ones = b.i32(1, rank)
        ty = tensor_type(shape, elem)
        vec = f"tensor<{rank}xi32>"
        y = b(f"stablehlo.custom_call @stablehlo.dynamic_reduce_window({v}, {zero}, {window}, {ones}, {ones}, {ones}, {padding}) "
              f"{{api_version = 2 : i32, called_computations = [@{add}]}} : "
              f"({ty}, tensor<{elem}>, {vec}, {vec}, {vec}, {vec}, tensor<{rank}x2xi32>) -> {ty}")
        s = f"tensor<{elem}>"
        return y, f"func.func private @{add}(%a: {s}, %b: {s}) -> {s} {{\n  %r = stablehlo.{combiner} %a, %b : {s}\n  return %r : {s}\n}}"

    def cumsum(self, op: Any) -> None:
        """`aten.cumsum` and `aten.cumprod` (which torch-mlir does not convert at all)."""
        x, dim = op.operands[0], _constant_operand(op.operands[1])
        shape, elem = _builtin(x.type)
        out_elem = _builtin(op.results[0].type)[1]
        combiner = "multiply" if op.name == "torch.aten.cumprod" else "add"

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            v = args[0]
            if out_elem != elem:
                v = b(f"stablehlo.convert {v} : ({tensor_type(shape, elem)}) -> {tensor_type(shape, out_elem)}")
            y, add = self.prefix_sum(b, v, shape, out_elem, dim % len(shape), combiner)
            return [y], [add]
        self.replace(op, combiner, [x], build)

    def cumulative_extreme(self, op: Any) -> None:
        """`aten.cummax` / `aten.cummin` (a `torch.operator` torch-mlir has no conversion for): the
        running maximum (minimum) as a scan, NaN carried on as torch's; each position's index the
        latest that holds it (or a NaN): a running maximum of the positions where the element equals
        the running value, -1 elsewhere."""
        x, dim = op.operands[0], _constant_operand(op.operands[1])
        shape, elem = _builtin(x.type)
        dim %= len(shape)
        combiner = "maximum" if _operator_name(op).endswith("cummax") else "minimum"

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            ty, positions = tensor_type(shape, elem), tensor_type(shape, "i64")
            values, fn = self.prefix_sum(b, args[0], shape, elem, dim, combiner)
            kind = _comparison_type(elem)
            flags = tensor_type(shape, "i1")
            held = b(f"stablehlo.compare EQ, {args[0]}, {values}, {kind} : ({ty}, {ty}) -> {flags}")
            if is_float(elem):
                nan = b(f"stablehlo.compare NE, {args[0]}, {args[0]}, FLOAT : ({ty}, {ty}) -> {flags}")
                held = b(f"stablehlo.or {held}, {nan} : {flags}")
            extent = b.shape(args[0], shape, elem)
            iota = b(f"stablehlo.dynamic_iota {extent}, dim = {dim} : (tensor<{len(shape)}xi32>) -> {positions}")
            marks = b(f"stablehlo.select {held}, {iota}, {b.filled('-1', 'i64', extent, shape)} : {flags}, {positions}")
            indices, fn2 = self.prefix_sum(b, marks, shape, "i64", dim, "maximum")
            return [values, indices], [fn, fn2]
        self.replace(op, combiner, [x], build)

    def check(self, op: Any) -> None:
        """`disc::check` (torch_frontend.check_op: torch.export's assertions over sizes the data
        decides, which no guard can check before the call): our custom call `ASSERT_TARGET` on
        the condition, which ends the call with a ShapeError where it is false (passes/dynamic_ops.py)."""
        from ..ops import ASSERT_TARGET

        condition = op.operands[0]
        message = re.sub(r'["{}\\]', "'", _constant_operand(op.operands[1]))

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            b.lines.append(f'stablehlo.custom_call @{ASSERT_TARGET}({args[0]}) {{error_message = "{message}", has_side_effect = true}} : '
                           "(tensor<i1>) -> ()")
            return [], []
        self.replace(op, "check", [condition], build)

    def nonzero(self, op: Any) -> None:
        """`torch.nonzero(x)`: the (count, rank) i64 positions of x's nonzero elements in row-major
        order, count read from the data. Each nonzero element's row is its place in a prefix sum
        of the nonzero flags; a scatter writes the positions to their rows (the other elements to
        one row past them) and a slice keeps the count first rows."""
        x = op.operands[0]
        shape, elem = _builtin(x.type)
        rank = len(shape)

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            dims = [b.size(args[0], shape, elem, d) for d in range(rank)]
            n = dims[0] if rank else b.i32(1, 1)
            for d in dims[1:]:
                n = b(f"stablehlo.multiply {n}, {d} : tensor<1xi32>")
            flat = b(f"stablehlo.dynamic_reshape {args[0]}, {n} : ({tensor_type(shape, elem)}, tensor<1xi32>) -> {tensor_type([None], elem)}")
            zeros = b.filled('0.0' if is_float(elem) else ('false' if elem == 'i1' else '0'), elem, n, [None])
            kind = _comparison_type(elem)
            flags = b(f"stablehlo.compare NE, {flat}, {zeros}, {kind} : ({tensor_type([None], elem)}, {tensor_type([None], elem)}) -> tensor<?xi1>")
            counts = b(f"stablehlo.convert {flags} : (tensor<?xi1>) -> tensor<?xi64>")
            rows, add = self.prefix_sum(b, counts, [None], "i64", 0)
            past = b(f"stablehlo.convert {n} : (tensor<1xi32>) -> tensor<1xi64>")
            past = b(f"stablehlo.dynamic_broadcast_in_dim {past}, {n}, dims = [0] : (tensor<1xi64>, tensor<1xi32>) -> tensor<?xi64>")
            row = b(f"stablehlo.subtract {rows}, {b.filled('1', 'i64', n, [None])} : tensor<?xi64>")
            row = b(f"stablehlo.select {flags}, {row}, {past} : tensor<?xi1>, tensor<?xi64>")
            column = b.vector([n, b.i32(1, 1)])
            row = b(f"stablehlo.dynamic_reshape {row}, {column} : (tensor<?xi64>, tensor<2xi32>) -> tensor<?x1xi64>")
            full = b.vector(dims) if rank else b.i32(1, 1)
            positions = []
            for d in range(rank):
                p = b(f"stablehlo.dynamic_iota {full}, dim = {d} : (tensor<{rank}xi32>) -> {tensor_type(shape, 'i64')}")
                positions.append(b(f"stablehlo.dynamic_reshape {p}, {column} : ({tensor_type(shape, 'i64')}, tensor<2xi32>) -> tensor<?x1xi64>"))
            table = f"tensor<?x{rank}xi64>"
            updates = (positions[0] if rank == 1 else b(
                f"stablehlo.concatenate {', '.join(positions)}, dim = 1 : ({', '.join(['tensor<?x1xi64>'] * rank)}) -> {table}")
                if rank else b.filled("0", "i64", b.vector([n, b.i32(0, 1)]), [None, 0]))
            base = b.filled("0", "i64", b.vector([b(f"stablehlo.add {n}, {b.i32(1, 1)} : tensor<1xi32>"), b.i32(rank, 1)]), [None, rank])
            t = "tensor<i64>"
            region = f"({{\n  ^bb0(%a: {t}, %b: {t}):\n    stablehlo.return %b : {t}\n  }})"
            written = b(f'"stablehlo.scatter"({base}, {row}, {updates}) {region} {{scatter_dimension_numbers = #stablehlo.scatter<'
                        "update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
                        f"indices_are_sorted = false, unique_indices = false}} : ({table}, tensor<?x1xi64>, {table}) -> {table}")
            limits = b.vector([b.total(counts), b.i32(rank, 1)])
            v2 = "tensor<2xi32>"
            y = b(f"stablehlo.real_dynamic_slice {written}, {b.i32(0, 2)}, {limits}, {b.i32(1, 2)} : ({table}, {v2}, {v2}, {v2}) -> {table}")
            return [y], [add]
        self.replace(op, "nonzero", [x], build)

    def repeat_interleave(self, op: Any) -> None:
        """`torch.repeat_interleave(repeats)`: i repeated repeats[i] times, as many as the repeats
        sum to (read from the data; a negative count is a ShapeError, as torch refuses it). Each
        segment adds 1 at its start (a scatter into sum + 1 zeros); the prefix sum of those marks,
        less 1, is each position's segment."""
        r = op.operands[0]
        shape, elem = _builtin(r.type)
        out_elem = _builtin(op.results[0].type)[1]

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            from ..ops import ASSERT_TARGET

            v = args[0] if elem == "i64" else b(f"stablehlo.convert {args[0]} : ({tensor_type(shape, elem)}) -> tensor<?xi64>")
            n = b.size(v, [None], "i64", 0)
            highest = b(f"stablehlo.constant dense<{_extreme('i64', low=False)}> : tensor<i64>")
            least = b(f"stablehlo.reduce({v} init: {highest}) applies stablehlo.minimum across dimensions = [0] : "
                      "(tensor<?xi64>, tensor<i64>) -> tensor<i64>")
            counted = b(f"stablehlo.compare GE, {least}, {b('stablehlo.constant dense<0> : tensor<i64>')}, SIGNED : "
                        "(tensor<i64>, tensor<i64>) -> tensor<i1>")
            b.lines.append(f'stablehlo.custom_call @{ASSERT_TARGET}({counted}) {{error_message = "repeat_interleave: a count of '
                           'repeats is negative", has_side_effect = true} : (tensor<i1>) -> ()')
            ends, add = self.prefix_sum(b, v, [None], "i64", 0)
            starts = b(f"stablehlo.subtract {ends}, {v} : tensor<?xi64>")
            total = b.total(v)
            extent = b(f"stablehlo.add {total}, {b.i32(1, 1)} : tensor<1xi32>")
            base, ones = b.filled("0", "i64", extent, [None]), b.filled("1", "i64", n, [None])
            at = b(f"stablehlo.dynamic_reshape {starts}, {b.vector([n, b.i32(1, 1)])} : (tensor<?xi64>, tensor<2xi32>) -> tensor<?x1xi64>")
            t = "tensor<i64>"
            region = f"({{\n  ^bb0(%a: {t}, %b: {t}):\n    %r = stablehlo.add %a, %b : {t}\n    stablehlo.return %r : {t}\n  }})"
            marks = b(f'"stablehlo.scatter"({base}, {at}, {ones}) {region} {{scatter_dimension_numbers = #stablehlo.scatter<'
                      "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
                      "indices_are_sorted = true, unique_indices = false} : (tensor<?xi64>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?xi64>")
            counts, add2 = self.prefix_sum(b, marks, [None], "i64", 0)
            segments = b(f"stablehlo.subtract {counts}, {b.filled('1', 'i64', extent, [None])} : tensor<?xi64>")
            y = b(f"stablehlo.real_dynamic_slice {segments}, {b.i32(0, 1)}, {total}, {b.i32(1, 1)} : "
                  "(tensor<?xi64>, tensor<1xi32>, tensor<1xi32>, tensor<1xi32>) -> tensor<?xi64>")
            if out_elem != "i64":
                y = b(f"stablehlo.convert {y} : (tensor<?xi64>) -> tensor<?x{out_elem}>")
            return [y], [add, add2]
        self.replace(op, "repeat_interleave", [r], build)

    def sort(self, op: Any) -> None:
        x, dim, descending = op.operands[0], _constant_operand(op.operands[1]), _constant_operand(op.operands[2])
        shape, elem = _builtin(x.type)

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            return list(_sort(b, args[0], shape, elem, dim % len(shape), descending)), []
        self.replace(op, "sort", [x], build)

    def topk(self, op: Any) -> None:
        x = op.operands[0]
        k, dim, largest = (_constant_operand(v) for v in op.operands[1:4])
        shape, elem = _builtin(x.type)
        rank = len(shape)
        dim %= rank
        perm = [d for d in range(rank) if d != dim] + [dim]  # the selected dim last
        moved = [shape[d] for d in perm]
        kept = moved[:-1] + [k]
        select = self.name("top_k")

        def transpose(b: Body, v: str, src: list[int | None], e: str, order: list[int]) -> str:
            if order == list(range(rank)):
                return v
            dst = [src[d] for d in order]
            return b(f"stablehlo.transpose {v}, dims = [{', '.join(map(str, order))}] : ({tensor_type(src, e)}) -> {tensor_type(dst, e)}")

        def selection() -> str:
            """The k first of the sorted row: the composite's decomposition, or the op itself."""
            b = Body()
            values, order = _sort(b, "%p0", moved, elem, rank - 1, largest)
            limits = b.vector([b.size("%p0", moved, elem, d) for d in range(rank - 1)] + [b.i32(k, 1)])
            zeros, ones = b.i32(0, rank), b.i32(1, rank)
            vec = f"tensor<{rank}xi32>"
            outs = [b(f"stablehlo.real_dynamic_slice {v}, {zeros}, {limits}, {ones} : ({tensor_type(moved, e)}, {vec}, {vec}, {vec}) -> {tensor_type(kept, e)}")
                    for v, e in ((values, elem), (order, "i64"))]
            return _function(select, [tensor_type(moved, elem)], [tensor_type(kept, elem), tensor_type(kept, "i64")], b, outs)

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            v = transpose(b, args[0], shape, elem, perm)
            types = f"({tensor_type(moved, elem)}) -> ({tensor_type(kept, elem)}, {tensor_type(kept, 'i64')})"
            if largest:
                res = b(f'stablehlo.composite "chlo.top_k" {v} {{composite_attributes = {{k = {k} : i64}}, '
                        f"decomposition = @{select}}} : {types}", results=2)
            else:
                res = b(f"func.call @{select}({v}) : {types}", results=2)
            back = [perm.index(d) for d in range(rank)]
            return [transpose(b, f"{res}#0", kept, elem, back), transpose(b, f"{res}#1", kept, "i64", back)], [selection()]
        self.replace(op, "topk", [x], build)


    def scatter_reduce(self, op: Any) -> None:
        """`x.scatter_reduce(dim, index, src, reduce, include_self)` (sum, prod, amax, amin): a
        `stablehlo.scatter` of src's elements at index's positions into x, with the reduction as
        its combiner; without `include_self`, into the reduction's identity, the positions no
        element reaches keeping x's value (a second scatter counts the elements each receives)."""
        from ..errors import UnsupportedOpError

        x, index, src = op.operands[0], op.operands[2], op.operands[3]
        dim, reduce, include_self = (_constant_operand(op.operands[k]) for k in (1, 4, 5))
        shape, elem = _builtin(x.type)
        ishape, ielem = _builtin(index.type)
        sshape = _builtin(src.type)[0]
        combiners = {"sum": ("add", 0), "prod": ("multiply", 1), "amax": ("maximum", "lowest"), "amin": ("minimum", "highest")}
        if reduce not in combiners:
            raise UnsupportedOpError(f"aten.scatter_reduce with reduce='{reduce}' (sum, prod, amax and amin are supported)")
        combine, identity = combiners[reduce]
        rank = len(shape)
        dim = dim % rank if rank else 0
        identity = _extreme(elem, identity == "lowest") if identity in ("lowest", "highest") else (
            f"{float(identity)}" if is_float(elem) else str(identity))

        def scatter(b: Body, base: str, indices: str, updates: str, e: str, operation: str) -> str:
            t = f"tensor<{e}>"
            dims = ", ".join(map(str, range(rank)))
            region = f"({{\n  ^bb0(%a: {t}, %b: {t}):\n    %r = stablehlo.{operation} %a, %b : {t}\n    stablehlo.return %r : {t}\n  }})"
            return b(f'"stablehlo.scatter"({base}, {indices}, {updates}) {region} {{scatter_dimension_numbers = #stablehlo.scatter<'
                     f"inserted_window_dims = [{dims}], scatter_dims_to_operand_dims = [{dims}], index_vector_dim = {rank}>, "
                     f"indices_are_sorted = false, unique_indices = false}} : ({tensor_type(shape, e)}, "
                     f"{tensor_type(ishape + [rank], 'i64')}, {tensor_type(ishape, e)}) -> {tensor_type(shape, e)}")

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            xv, iv, sv = args
            if rank == 0:  # one element: the index can only be 0
                return [b(f"stablehlo.{combine} {xv}, {sv} : tensor<{elem}>") if include_self else sv], []
            at = b.shape(iv, ishape, ielem)
            vec = f"tensor<{rank}xi32>"
            updates = b(f"stablehlo.real_dynamic_slice {sv}, {b.i32(0, rank)}, {at}, {b.i32(1, rank)} : "
                        f"({tensor_type(sshape, elem)}, {vec}, {vec}, {vec}) -> {tensor_type(ishape, elem)}")
            if ielem != "i64":
                iv = b(f"stablehlo.convert {iv} : ({tensor_type(ishape, ielem)}) -> {tensor_type(ishape, 'i64')}")
            column = b.vector([*(b.size(iv, ishape, "i64", d) for d in range(rank)), b.i32(1, 1)])
            positions, columns = tensor_type(ishape, "i64"), []
            for d in range(rank):  # each element's position: index's value along dim, its own along the others
                c = iv if d == dim else b(f"stablehlo.dynamic_iota {at}, dim = {d} : ({vec}) -> {positions}")
                columns.append(b(f"stablehlo.dynamic_reshape {c}, {column} : ({positions}, tensor<{rank + 1}xi32>) -> "
                                 f"{tensor_type(ishape + [1], 'i64')}"))
            indices = columns[0] if rank == 1 else b(
                f"stablehlo.concatenate {', '.join(columns)}, dim = {rank} : ({', '.join([tensor_type(ishape + [1], 'i64')] * rank)}) -> "
                f"{tensor_type(ishape + [rank], 'i64')}")
            if include_self:
                return [scatter(b, xv, indices, updates, elem, combine)], []
            full = b.shape(xv, shape, elem)
            reduced = scatter(b, b.filled(str(identity), elem, full, shape), indices, updates, elem, combine)
            counts = scatter(b, b.filled("0", "i32", full, shape), indices, b.filled("1", "i32", at, ishape), "i32", "add")
            zero = b.filled("0", "i32", full, shape)
            reached = b(f"stablehlo.compare GT, {counts}, {zero}, SIGNED : ({tensor_type(shape, 'i32')}, {tensor_type(shape, 'i32')}) -> "
                        f"{tensor_type(shape, 'i1')}")
            ty = tensor_type(shape, elem)
            return [b(f"stablehlo.select {reached}, {reduced}, {xv} : {tensor_type(shape, 'i1')}, {ty}")], []
        self.replace(op, "scatter_reduce", [x, index, src], build)

    def fft(self, op: Any) -> None:
        """`disc::fft` (torch_frontend.fft_op): our custom call `FFT_TARGET` on the operand and the
        transform's length as a tensor (passes/fft.py: the RAL's FFT)."""
        from torch_mlir import ir

        from ..ops import FFT_KIND_ATTR, FFT_TARGET

        x, kind, n = op.operands
        kind = _constant_operand(kind)
        with ir.InsertionPoint(op), op.location:
            length = ir.Operation.create("torch.prim.NumToTensor.Scalar", results=[ir.Type.parse("!torch.vtensor<[],si64>")],
                                         operands=[n]).result
        shape, elem = _builtin(x.type)
        result = tensor_type(_builtin(op.results[0].type)[0], elem)

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            return [b(f"stablehlo.custom_call @{FFT_TARGET}({args[0]}, {args[1]}) {{{FFT_KIND_ATTR} = {kind} : i64}} : "
                      f"({tensor_type(shape, elem)}, tensor<i64>) -> {result}")], []
        self.replace(op, "fft", [x, length], build)

    def grouped_mm(self, op: Any) -> None:
        """`disc::grouped_mm` (torch_frontend.grouped_mm_op): the custom call the compiler gives
        the RAL's grouped GEMM (GROUPED_GEMM_TARGET), in f32 or f64 (other floats converted to
        f32 and the result back), the offsets as i64."""
        from ..ops import GROUPED_GEMM_TARGET

        x, weight, offs = op.operands
        (xshape, elem), (wshape, _), (oshape, oelem) = (_builtin(v.type) for v in (x, weight, offs))
        rshape = _builtin(op.results[0].type)[0]
        wide = elem if elem in ("f32", "f64") else "f32"

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            xv, wv, ov = (b(f"stablehlo.convert {v} : ({tensor_type(shape, e)}) -> {tensor_type(shape, to)}") if e != to else v
                          for v, shape, e, to in ((args[0], xshape, elem, wide), (args[1], wshape, elem, wide), (args[2], oshape, oelem, "i64")))
            y = b(f"stablehlo.custom_call @{GROUPED_GEMM_TARGET}({xv}, {wv}, {ov}) : ({tensor_type(xshape, wide)}, "
                  f"{tensor_type(wshape, wide)}, {tensor_type(oshape, 'i64')}) -> {tensor_type(rshape, wide)}")
            if wide != elem:
                y = b(f"stablehlo.convert {y} : ({tensor_type(rshape, wide)}) -> {tensor_type(rshape, elem)}")
            return [y], []
        self.replace(op, "grouped_mm", [x, weight, offs], build)

    def recurrent(self, op: Any) -> None:
        """`disc::lstm` and `disc::rnn` (torch_frontend.recurrent_ops: nn.LSTM, nn.GRU and nn.RNN)
        as a `stablehlo.while` over the sequence per layer and direction (`_Recurrence`)."""
        lstm = _operator_name(op).endswith(".lstm")
        x, hx, params = op.operands[0], _list_items(op.operands[1]) if lstm else [op.operands[1]], _list_items(op.operands[2])
        has_biases, layers, bidirectional, batch_first = (_constant_operand(v) for v in op.operands[3:7])
        mode = "lstm" if lstm else _constant_operand(op.operands[7])
        operands = [x, *hx, *params]
        typed = [_builtin(v.type) for v in operands]
        declared = [_builtin(r.type)[0] for r in op.results]

        def build(b: Body, args: list[str]) -> tuple[list[str], list[str]]:
            values = [(name, shape) for name, (shape, _) in zip(args, typed)]
            rnn = _Recurrence(b, mode, typed[0][1], has_biases, layers, 2 if bidirectional else 1)
            return rnn.run(values[0], values[1:1 + len(hx)], values[1 + len(hx):], batch_first, declared), []
        self.replace(op, mode, operands, build)


# operators of other libraries (`torch.operator`, by name) -> rewrite, before torch-mlir's backend
# pipeline, which refuses them; torch-dialect op -> rewrite, after it (aten.topk must be kept from its
# decomposition, a sort)
OPERATORS = {"torch.disc.grouped_mm": _Rewriter.grouped_mm, "torch.disc.check": _Rewriter.check, "torch.disc.fft": _Rewriter.fft,
             "torch.disc.lstm": _Rewriter.recurrent, "torch.disc.rnn": _Rewriter.recurrent,
             "torch.aten.cummax": _Rewriter.cumulative_extreme, "torch.aten.cummin": _Rewriter.cumulative_extreme}
REWRITES = {"torch.aten.cumsum": _Rewriter.cumsum, "torch.aten.cumprod": _Rewriter.cumsum, "torch.aten.nonzero": _Rewriter.nonzero,
            "torch.aten.repeat_interleave.Tensor": _Rewriter.repeat_interleave, "torch.aten.sort": _Rewriter.sort, "torch.aten.topk": _Rewriter.topk,
            "torch.aten.scatter_reduce.two": _Rewriter.scatter_reduce}
LEGAL_OPS = ["aten.topk", "aten.nonzero", "aten.repeat_interleave.Tensor"]


def lower_to_stablehlo(module: Any) -> list[str]:
    """The FX importer's raw torch-dialect module to StableHLO: `OPERATORS` rewritten, torch-mlir's
    backend pipeline, `REWRITES`, then the StableHLO conversion (`to_stablehlo`). Returns the text of
    the functions the new calls need (`define_functions`)."""
    from torch_mlir.compiler_utils import run_pipeline_with_repro_report

    from ..mlir_support import walk

    rewriter = _Rewriter(module)
    with module.context:
        for op in [op for op in walk(module.operation) if op.name == "torch.operator"]:
            if _operator_name(op) in OPERATORS:
                OPERATORS[_operator_name(op)](rewriter, op)
    run_pipeline_with_repro_report(module, "builtin.module(func.func(torch-match-quantized-custom-ops), torchdynamo-export-to-torch-backend-"
                                   f"pipeline{{backend-legal-ops={','.join(LEGAL_OPS)} extra-library=}})", "Lowering TorchFX IR -> Torch Backend IR")
    with module.context:
        for op in [op for op in walk(module.operation) if op.name in REWRITES]:
            REWRITES[op.name](rewriter, op)
    to_stablehlo(module)
    return rewriter.definitions


def define_functions(module: Any, definitions: list[str]) -> None:
    """Replaces the StableHLO module's declarations by these definitions (the helpers they call
    are added)."""
    from torch_mlir import ir

    from ..mlir_support import find_function, operation

    if not definitions:
        return
    parsed = ir.Module.parse("\n".join(definitions), module.context)  # must outlive the moves
    for f in list(parsed.body.operations):
        f = operation(f)
        declared = find_function(module, ir.StringAttr(f.attributes["sym_name"]).value)
        f.move_before(module.body.operations[0])
        if declared is not None:
            declared.erase()


def _empty_slices_stay_empty(module: Any) -> None:
    """torch-mlir's slice lowering reads an end that is 0 at run time as the dim's size (`x[:k]`
    with k read from the data by `.item()` comes out whole for k = 0; torch's own sizes are never
    0 there, so nothing else meets it): each `select(end == 0, size, end)` that feeds a
    `real_dynamic_slice`'s limits gives way to the end itself."""
    from torch_mlir import ir

    from ..mlir_support import walk

    def producer(value: Any, name: str) -> Any:
        op = getattr(value.owner, "operation", None)
        return op if op is not None and op.name == name else None

    for op in [op for op in walk(module.operation) if op.name == "stablehlo.real_dynamic_slice"]:
        limits = producer(op.operands[2], "tensor.from_elements")
        for i, end in enumerate(limits.operands if limits is not None else ()):
            select = producer(end, "arith.select")
            test = select and producer(select.operands[0], "arith.cmpi")
            zero = test and producer(test.operands[1], "arith.constant")
            if (zero and ir.IntegerAttr(test.attributes["predicate"]).value == 0 and test.operands[0] == select.operands[2]
                    and isinstance(zero.attributes["value"], ir.IntegerAttr) and ir.IntegerAttr(zero.attributes["value"]).value == 0):
                limits.operands[i] = select.operands[2]


def to_stablehlo(module: Any) -> None:
    """torch-mlir's torch-to-StableHLO pipeline without its final check that only StableHLO is
    left (the calls of the functions `define_functions` adds are left too) and without
    `stablehlo-refine-shapes`, which follows calls into their callees and crashes on a declaration
    (RoBERTa's and OPT's position ids, a cumsum times the mask it sums). Nothing relies on it: the
    importer's types are torch.export's, refined already."""
    from torch_mlir.passmanager import PassManager

    with module.context:
        full = str(PassManager.parse("builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=True})"))
        for dropped in ("torch-verify-stablehlo-backend-contract,", "stablehlo-refine-shapes,"):
            assert dropped in full, f"torch-mlir's pipeline changed: {full}"
            full = full.replace(dropped, "")
        PassManager.parse(full).run(module.operation)
        _empty_slices_stay_empty(module)
