"""`chlo.scan` given as CHLO: jaxlib's serializer, which turns the other CHLO ops into StableHLO
for us (`_without_chlo`), cannot take it. In jaxlib's own MLIR context (where CHLO is registered)
each scan becomes a call of a function holding a `stablehlo.while` over the scanned dim: per step
the inputs' slices at the position (real_dynamic_slice, the dim dropped), the scan's region (moved
into a function of its own) on them and the carries, and its outputs written at the position
(dynamic_update_slice); `is_reverse` walks from the end. Any dims, dynamic ones too; an output's
dims other than the scanned one are the first input's (a step whose result has another size is a
ShapeError)."""

from __future__ import annotations

from ..errors import CompileError
from .stablehlo_text import Body, is_float, tensor_type

Value = tuple[list[int | None], str]  # a tensor's shape (None: dynamic) and element type


def _sizes(b: Body, x: str, value: Value, dims: list[int | str]) -> str:
    """A tensor<Nxi32> of sizes: ints, dims of `x` ("d<k>") or tensor<i32> values."""
    parts = [b.i32(d, 1) if isinstance(d, int) else b.size(x, *value, int(d[1:])) if d.startswith("d")
             else b(f"stablehlo.reshape {d} : (tensor<i32>) -> tensor<1xi32>") for d in dims]
    return b.vector(parts)


def _loop_text(name: str, body: str, dim: int, reverse: bool, inputs: list[Value], inits: list[Value], outputs: list[Value],
               slices: list[Value], updates: list[Value]) -> str:
    """The function of the scan's operands returning its results."""
    ty = [tensor_type(*v) for v in inputs + inits]
    out_types, init_types = [tensor_type(*v) for v in outputs], [tensor_type(*v) for v in inits]
    b = Body()
    xs, cs = [f"%x{k}" for k in range(len(inputs))], [f"%c{k}" for k in range(len(inits))]
    n = b(f"stablehlo.get_dimension_size %x0, dim = {dim} : ({ty[0]}) -> tensor<i32>")
    zero, one = b.i32(0), b.i32(1)
    starts = []
    for shape, elem in outputs:
        if len(shape) != len(inputs[0][0]):
            raise CompileError(f"chlo.scan: an output of rank {len(shape)}, the first input's is {len(inputs[0][0])}")
        fill = "false" if elem == "i1" else "(0.0, 0.0)" if elem.startswith("complex") else "0.0" if is_float(elem) else "0"
        scalar = b(f"stablehlo.constant dense<{fill}> : tensor<{elem}>")
        size = _sizes(b, "%x0", inputs[0], [n if i == dim else f"d{i}" if d is None else d for i, d in enumerate(shape)])
        starts.append(b(f"stablehlo.dynamic_broadcast_in_dim {scalar}, {size}, dims = [] "
                        f": (tensor<{elem}>, tensor<{len(shape)}xi32>) -> {tensor_type(shape, elem)}"))
    loop_types = ["tensor<i32>", *init_types, *out_types]
    carries, outs = [f"%carry{k}" for k in range(len(inits))], [f"%out{k}" for k in range(len(outputs))]
    head = ", ".join(f"{a} = {v}" for a, v in zip(["%i", *carries, *outs], [zero, *cs, *starts]))
    prologue, b.lines = b.lines, []
    less = b(f"stablehlo.compare LT, %i, {n}, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>")
    cond, b.lines = b.lines + [f"stablehlo.return {less} : tensor<i1>"], []
    pos = b(f"stablehlo.subtract {b(f'stablehlo.subtract {n}, {one} : tensor<i32>')}, %i : tensor<i32>") if reverse else "%i"
    args = []
    for x, (shape, elem), piece_v in zip(xs, inputs, slices):
        rank = len(shape)
        start = _sizes(b, x, (shape, elem), [pos if d == dim else 0 for d in range(rank)])
        end = _sizes(b, x, (shape, elem), [b(f"stablehlo.add {pos}, {one} : tensor<i32>") if d == dim else f"d{d}" for d in range(rank)])
        one_t = ([1 if d == dim else shape[d] for d in range(rank)], elem)
        piece = b(f"stablehlo.real_dynamic_slice {x}, {start}, {end}, {b.i32(1, rank)} : ({tensor_type(shape, elem)}, "
                  f"{', '.join([f'tensor<{rank}xi32>'] * 3)}) -> {tensor_type(*one_t)}")
        keep = _sizes(b, piece, one_t, [f"d{d}" for d in range(rank) if d != dim])
        args.append(b(f"stablehlo.dynamic_reshape {piece}, {keep} : ({tensor_type(*one_t)}, tensor<{rank - 1}xi32>) "
                      f"-> {tensor_type(*piece_v)}"))
    res_types = [tensor_type(*v) for v in updates] + init_types
    called = b(f"func.call @{body}({', '.join(args + carries)}) : ({', '.join(tensor_type(*v) for v in slices + inits)}) "
               f"-> ({', '.join(res_types)})", len(res_types))
    results = [f"{called}#{k}" for k in range(len(res_types))] if len(res_types) > 1 else [called]
    new_outs = []
    for k, ((shape, elem), update) in enumerate(zip(outputs, updates)):
        rank = len(shape)
        grown_t = tensor_type([1 if d == dim else None for d in range(rank)], elem)
        # to the output's dims, not the step's own: a step result of another size is then an error
        # of the reshape at run time, not a part of the output left unwritten
        size = _sizes(b, outs[k], (shape, elem), [1 if d == dim else f"d{d}" for d in range(rank)])
        grown = b(f"stablehlo.dynamic_reshape {results[k]}, {size} : ({tensor_type(*update)}, tensor<{rank}xi32>) -> {grown_t}")
        at = ", ".join(pos if d == dim else zero for d in range(rank))
        new_outs.append(b(f"stablehlo.dynamic_update_slice {outs[k]}, {grown}, {at} : ({out_types[k]}, {grown_t}, "
                          f"{', '.join(['tensor<i32>'] * rank)}) -> {out_types[k]}"))
    step = b(f"stablehlo.add %i, {one} : tensor<i32>")
    body_lines = b.lines + [f"stablehlo.return {', '.join([step] + results[len(outputs):] + new_outs)} : {', '.join(loop_types)}"]
    loop = "%loop"
    returned = [f"{loop}#{1 + len(inits) + k}" for k in range(len(outputs))] + [f"{loop}#{1 + k}" for k in range(len(inits))]
    text = "\n  ".join(prologue + [f"{loop}:{len(loop_types)} = stablehlo.while({head}) : {', '.join(loop_types)}",
                                   "cond {", *cond, "} do {", *body_lines, "}",
                                   f"return {', '.join(returned)} : {', '.join(out_types + init_types)}"])
    params = ", ".join(f"{a}: {t}" for a, t in zip(xs + cs, ty))
    return f"func.func private @{name}({params}) -> ({', '.join(out_types + init_types)}) {{\n  {text}\n}}"


def scans_as_loops(text: str) -> str:
    """The module text with every chlo.scan a call of a while loop (other CHLO ops kept)."""
    try:
        return _scans_as_loops(text)
    except CompileError:
        raise
    except Exception as e:  # jaxlib's parser and verifier, a scan of a form not taken
        raise CompileError(f"chlo.scan: {e}") from None


def _scans_as_loops(text: str) -> str:
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib.mlir import ir

    def value(t) -> Value:
        rt = ir.RankedTensorType(t)
        return [None if rt.is_dynamic_dim(i) else rt.shape[i] for i in range(rt.rank)], str(rt.element_type)

    with jmlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        scans = []
        module.operation.walk(lambda op: (scans.append(op.operation) if op.operation.name == "chlo.scan" else None)
                              or ir.WalkResult.ADVANCE)
        for k, op in enumerate(scans):
            n_in, n_init = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
            n_out = list(ir.DenseI32ArrayAttr(op.attributes["resultSegmentSizes"]))[0]
            if n_in == 0:
                raise CompileError("chlo.scan without inputs (its length from scan_dim_size) is not taken")
            dim = ir.IntegerAttr(op.attributes["dimension"]).value
            reverse = "is_reverse" in op.attributes and ir.BoolAttr(op.attributes["is_reverse"]).value
            block = op.regions[0].blocks[0]
            ret = block.operations[len(block.operations) - 1]
            arg_types, region_results = [a.type for a in block.arguments], [v.type for v in ret.operands]
            body_name, loop_name = f"__disc_scan_body_{k}", f"__disc_scan_{k}"
            # the region as a function of its own
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
            loop_text = _loop_text(loop_name, body_name, dim, reverse, [value(v.type) for v in op.operands[:n_in]],
                                   [value(v.type) for v in op.operands[n_in:n_in + n_init]],
                                   [value(r.type) for r in op.results[:n_out]], [value(t) for t in arg_types[:n_in]],
                                   [value(t) for t in region_results[:n_out]])
            declaration = f"func.func private @{body_name}({', '.join(map(str, arg_types))}) -> ({', '.join(map(str, region_results))})"
            parsed = ir.Module.parse(declaration + "\n" + loop_text)
            loop = next(f for f in parsed.body.operations if ir.StringAttr(f.attributes["sym_name"]).value == loop_name)
            loop.operation.move_before(module.body.operations[0])
            with ir.InsertionPoint(op):
                call = ir.Operation.create("func.call", results=[r.type for r in op.results], operands=list(op.operands),
                                           attributes={"callee": ir.FlatSymbolRefAttr.get(loop_name)})
            for old, new in zip(op.results, call.results):
                old.replace_all_uses_with(new)
            op.erase()
        module.operation.verify()  # raises where the loop is not a valid program
        return str(module)
