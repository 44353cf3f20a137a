"""`chlo.scan` given as CHLO: jaxlib's serializer, which turns the other CHLO ops into StableHLO
for us (`_without_chlo`), cannot take it. In jaxlib's own MLIR context (where CHLO is registered)
each scan becomes a call of a function holding a `stablehlo.while` over the scanned dim: per step
the inputs' slices at the position (real_dynamic_slice, the dim dropped), the scan's region (moved
into a function of its own) on them and the carries, and its outputs written at the position
(dynamic_update_slice); `is_reverse` walks from the end. Any dims, dynamic ones too; an output's
dims other than the scanned one are the first input's."""

from __future__ import annotations

from ..errors import CompileError


def _type(shape: list[int | None], elem) -> str:
    return f"tensor<{''.join(('?' if d is None else str(d)) + 'x' for d in shape)}{elem}>"


def _shape(t) -> list[int | None]:
    from jax._src.lib.mlir import ir

    rt = ir.RankedTensorType(t)
    return [None if rt.is_dynamic_dim(i) else rt.shape[i] for i in range(rt.rank)]


class _Lines:
    def __init__(self):
        self.lines: list[str] = []
        self.n = 0

    def __call__(self, rhs: str, count: int = 1) -> str:
        self.n += 1
        self.lines.append(f"%v{self.n}{f':{count}' if count > 1 else ''} = {rhs}")
        return f"%v{self.n}"


def _dims_vector(b: _Lines, value: str, type_: str, dims: list[str | int]) -> str:
    """A tensor<Nxi32> of sizes: ints, or dims (by index, "d<k>") of `value`, or tensor<i32> names."""
    parts = []
    for d in dims:
        if isinstance(d, int):
            parts.append(b(f"stablehlo.constant dense<{d}> : tensor<1xi32>"))
            continue
        scalar = b(f"stablehlo.get_dimension_size {value}, dim = {d[1:]} : ({type_}) -> tensor<i32>") if d.startswith("d") else d
        parts.append(b(f"stablehlo.reshape {scalar} : (tensor<i32>) -> tensor<1xi32>"))
    if not parts:
        return b("stablehlo.constant dense<> : tensor<0xi32>")
    return b(f"stablehlo.concatenate {', '.join(parts)}, dim = 0 : ({', '.join(['tensor<1xi32>'] * len(parts))}) -> tensor<{len(parts)}xi32>")


def _loop_text(name: str, body: str, dim: int, reverse: bool, inputs: list, inits: list, outputs: list, slices: list,
               updates: list) -> str:
    """The function of the scan's operands and results: types as strings and shapes."""
    b = _Lines()
    x_args = [f"%x{k}" for k in range(len(inputs))]
    c_args = [f"%c{k}" for k in range(len(inits))]
    params = [f"{a}: {t}" for a, (t, _) in zip(x_args + c_args, inputs + inits)]
    first, first_t = x_args[0], inputs[0][0]
    n = b(f"stablehlo.get_dimension_size {first}, dim = {dim} : ({first_t}) -> tensor<i32>")
    zero, one = b("stablehlo.constant dense<0> : tensor<i32>"), b("stablehlo.constant dense<1> : tensor<i32>")
    starts = []
    for out_t, shape in outputs:
        if len(shape) != len(inputs[0][1]):
            raise CompileError(f"chlo.scan: an output of rank {len(shape)}, the first input's is {len(inputs[0][1])}")
        dims = [n if i == dim else (d if d is not None else f"d{i}") for i, d in enumerate(shape)]
        elem = out_t[out_t.rindex("x") + 1:-1]
        fill = "false" if elem == "i1" else "(0.0, 0.0)" if elem.startswith("complex") else "0.0" if elem[0] in "fb" else "0"
        scalar = b(f"stablehlo.constant dense<{fill}> : tensor<{elem}>")
        starts.append(b(f"stablehlo.dynamic_broadcast_in_dim {scalar}, {_dims_vector(b, first, first_t, dims)}, dims = [] "
                        f": (tensor<{elem}>, tensor<{len(shape)}xi32>) -> {out_t}"))
    loop_types = ["tensor<i32>"] + [t for t, _ in inits] + [t for t, _ in outputs]
    i, carries, outs = "%i", [f"%carry{k}" for k in range(len(inits))], [f"%out{k}" for k in range(len(outputs))]
    head = ", ".join(f"{a} = {v}" for a, v in zip([i] + carries + outs, [zero] + c_args + starts))
    result = f"%loop{len(b.lines)}"
    lines_before = b.lines
    b.lines = []
    less = b(f"stablehlo.compare LT, {i}, {n}, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>")
    cond = b.lines + [f"stablehlo.return {less} : tensor<i1>"]
    b.lines = []
    pos = b(f"stablehlo.subtract {b(f'stablehlo.subtract {n}, {one} : tensor<i32>')}, {i} : tensor<i32>") if reverse else i
    args = []
    for x, (t, shape), s_t in zip(x_args, inputs, slices):
        rank = len(shape)
        start = _dims_vector(b, x, t, [pos if d == dim else 0 for d in range(rank)])
        end = _dims_vector(b, x, t, [b(f"stablehlo.add {pos}, {one} : tensor<i32>") if d == dim else f"d{d}" for d in range(rank)])
        ones = b(f"stablehlo.constant dense<1> : tensor<{rank}xi32>")
        one_t = _type([1 if d == dim else shape[d] for d in range(rank)], t[t.rindex("x") + 1:-1])
        piece = b(f"stablehlo.real_dynamic_slice {x}, {start}, {end}, {ones} : ({t}, {', '.join([f'tensor<{rank}xi32>'] * 3)}) -> {one_t}")
        keep = _dims_vector(b, piece, one_t, [f"d{d}" for d in range(rank) if d != dim])
        args.append(b(f"stablehlo.dynamic_reshape {piece}, {keep} : ({one_t}, tensor<{rank - 1}xi32>) -> {s_t}"))
    arg_types = slices + [t for t, _ in inits]
    res_types = updates + [t for t, _ in inits]
    called = b(f"func.call @{body}({', '.join(args + carries)}) : ({', '.join(arg_types)}) -> ({', '.join(res_types)})", len(res_types))
    results = [f"{called}#{k}" for k in range(len(res_types))] if len(res_types) > 1 else [called]
    new_outs = []
    for k, ((o_t, shape), u_t) in enumerate(zip(outputs, updates)):
        rank = len(shape)
        grown_t = _type([1 if d == dim else None for d in range(rank)], o_t[o_t.rindex("x") + 1:-1])
        size = [1 if d == dim else f"d{d - (d > dim)}" for d in range(rank)]
        grown = b(f"stablehlo.dynamic_reshape {results[k]}, {_dims_vector(b, results[k], u_t, size)} "
                  f": ({u_t}, tensor<{rank}xi32>) -> {grown_t}")
        at = ", ".join(pos if d == dim else zero for d in range(rank))
        new_outs.append(b(f"stablehlo.dynamic_update_slice {outs[k]}, {grown}, {at} "
                          f": ({o_t}, {grown_t}, {', '.join(['tensor<i32>'] * rank)}) -> {o_t}"))
    step = b(f"stablehlo.add {i}, {one} : tensor<i32>")
    body_lines = b.lines + [f"stablehlo.return {', '.join([step] + results[len(outputs):] + new_outs)} : {', '.join(loop_types)}"]
    n_carries = len(inits)
    returned = [f"{result}#{1 + n_carries + k}" for k in range(len(outputs))] + [f"{result}#{1 + k}" for k in range(n_carries)]
    out_types = [t for t, _ in outputs] + [t for t, _ in inits]
    text = "\n  ".join(lines_before + [
        f"{result}:{len(loop_types)} = stablehlo.while({head}) : {', '.join(loop_types)}",
        "cond {", *cond, "} do {", *body_lines, "}",
        f"return {', '.join(returned)} : {', '.join(out_types)}"])
    return f"func.func private @{name}({', '.join(params)}) -> ({', '.join(out_types)}) {{\n  {text}\n}}"


def scans_as_loops(text: str) -> str:
    """The module text with every chlo.scan a call of a while loop (other CHLO ops kept)."""
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib.mlir import ir

    with jmlir.make_ir_context(), ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except Exception as e:
            raise CompileError(f"cannot parse the CHLO module: {e}") from None
        scans = []
        module.operation.walk(lambda op: (scans.append(op.operation) if op.operation.name == "chlo.scan" else None)
                              or ir.WalkResult.ADVANCE)
        for k, op in enumerate(scans):
            n_in, n_init = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
            n_out = list(ir.DenseI32ArrayAttr(op.attributes["resultSegmentSizes"]))[0]
            dim = ir.IntegerAttr(op.attributes["dimension"]).value
            reverse = "is_reverse" in op.attributes and ir.BoolAttr(op.attributes["is_reverse"]).value
            block = op.regions[0].blocks[0]
            ret = block.operations[len(block.operations) - 1]
            slices = [str(a.type) for a in block.arguments][:n_in]
            region_results = [v.type for v in ret.operands]
            updates = [str(t) for t in region_results][:n_out]
            body_name, loop_name = f"__disc_scan_body_{k}", f"__disc_scan_{k}"
            # the region as a function of its own
            arg_types = [a.type for a in block.arguments]
            with ir.InsertionPoint.at_block_begin(module.body):
                func = ir.Operation.create("func.func", regions=1, attributes={
                    "sym_name": ir.StringAttr.get(body_name), "sym_visibility": ir.StringAttr.get("private"),
                    "function_type": ir.TypeAttr.get(ir.FunctionType.get(arg_types, region_results))})
            new_block = func.regions[0].blocks.append(*arg_types)
            for old, new in zip(block.arguments, new_block.arguments):
                old.replace_all_uses_with(new)
            for inner in list(block.operations):
                new_block.append(inner.operation)
            last = new_block.operations[len(new_block.operations) - 1]
            with ir.InsertionPoint(last):
                ir.Operation.create("func.return", operands=list(last.operands))
            last.erase()
            # the loop around it
            inputs = [(str(v.type), _shape(v.type)) for v in op.operands[:n_in]]
            inits = [(str(v.type), _shape(v.type)) for v in op.operands[n_in:n_in + n_init]]
            outputs = [(str(r.type), _shape(r.type)) for r in op.results[:n_out]]
            loop_text = _loop_text(loop_name, body_name, dim, reverse, inputs, inits, outputs, slices, updates)
            declaration = f"func.func private @{body_name}({', '.join(map(str, arg_types))}) -> ({', '.join(map(str, region_results))})"
            parsed = ir.Module.parse(declaration + "\n" + loop_text)
            loop = [f for f in parsed.body.operations if ir.StringAttr(f.attributes["sym_name"]).value == loop_name][0]
            loop.operation.move_before(module.body.operations[0])
            with ir.InsertionPoint(op):
                call = ir.Operation.create("func.call", results=[r.type for r in op.results], operands=list(op.operands),
                                           attributes={"callee": ir.FlatSymbolRefAttr.get(loop_name)})
            for old, new in zip(op.results, call.results):
                old.replace_all_uses_with(new)
            op.erase()
        if not module.operation.verify():
            raise CompileError("chlo.scan: the loop made of it does not verify")
        return str(module)
