"""top_k as a selection, not a sort of the whole row: `chlo.top_k` (JAX's `lax.top_k`, exported as
a `stablehlo.composite` of it, and PyTorch's `topk`) would become a full sort (the CHLO
legalization's, the composite's decomposition), so it is turned into a
`custom_call @disc.top_k` before, and lowered here: per row, a heap of the k best seen so far
(its root the worst of them) takes each further element that beats the root, then is sorted in
place. O(n + m log k) comparisons for m replacements, no allocation per element.

Order as the legalization's sort: values descending in total order (NaN above +inf, -0 below
+0), ties by lower index first."""

from __future__ import annotations

from torch_mlir import ir

from ..mlir_support import call_target, create_value, location_text, walk
from ..ops import TOP_K_ATTR, TOP_K_TARGET
from .dynamic_ops import _elem
from .lower import LoweringState, Text, register_template
from .region_ops import Loops, _all

def _selectable(x: ir.Value) -> bool:
    elem = ir.RankedTensorType(x.type).element_type
    return isinstance(elem, ir.FloatType) or (isinstance(elem, ir.IntegerType) and elem.is_signless and elem.width > 1)


def _k(op: ir.Operation) -> int | None:
    """k of a chlo.top_k, or of the `stablehlo.composite` JAX exports it as; None for other ops."""
    if op.name == "chlo.top_k":
        return ir.IntegerAttr(op.attributes["k"]).value
    if op.name == "stablehlo.composite" and ir.StringAttr(op.attributes["name"]).value == "chlo.top_k":
        return ir.IntegerAttr(ir.DictAttr(op.attributes["composite_attributes"])["k"]).value
    return None


def protect_top_k(module: ir.Module) -> None:
    """Every chlo.top_k (or JAX's composite of it) over floats or signless integers becomes `custom_call @disc.top_k` (the
    same operand and results, `k` an attribute); where the operand's last dim is dynamic, a
    shape assertion that it is at least k goes first (the guard checks it before any kernel)."""
    for op in [op for op in walk(module.operation) if _k(op) is not None]:
        x, k = op.operands[0], _k(op)
        if not _selectable(x):
            continue
        ty = ir.RankedTensorType(x.type)
        with ir.InsertionPoint(op), op.location:
            if ty.is_dynamic_dim(ty.rank - 1):
                i32 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))
                size = create_value("stablehlo.get_dimension_size", [x], i32,
                                    dimension=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), ty.rank - 1))
                bound = create_value("stablehlo.constant", [], i32, value=ir.DenseElementsAttr.get_splat(
                    i32, ir.IntegerAttr.get(ir.IntegerType.get_signless(32), k)))
                ok = create_value("stablehlo.compare", [size, bound], ir.RankedTensorType.get([], ir.IntegerType.get_signless(1)),
                                  comparison_direction=ir.Attribute.parse("#stablehlo<comparison_direction GE>"),
                                  compare_type=ir.Attribute.parse("#stablehlo<comparison_type SIGNED>"))
                message = f"top_k at {location_text(op)}: k = {k} exceeds the operand's last dim, {{0}}".replace('"', "'")
                ir.Operation.create("stablehlo.custom_call", operands=[ok, size], attributes={
                    "call_target_name": ir.StringAttr.get("shape_assertion"), "error_message": ir.StringAttr.get(message),
                    "has_side_effect": ir.BoolAttr.get(True)})
            new = ir.Operation.create("stablehlo.custom_call", results=[r.type for r in op.results], operands=[x], attributes={
                "call_target_name": ir.StringAttr.get(TOP_K_TARGET), TOP_K_ATTR: ir.IntegerAttr.get(ir.IntegerType.get_signless(64), k)})
        for old, res in zip(op.results, new.results):
            old.replace_all_uses_with(res)
        op.erase()


def _is_top_k(op: ir.Operation) -> bool:
    return call_target(op) == TOP_K_TARGET


@register_template("stablehlo.custom_call", when=_is_top_k)
def _top_k(op, t: Text, state: LoweringState):
    x, k = op.operands[0], ir.IntegerAttr(op.attributes[TOP_K_ATTR]).value
    elem, ielem = _elem(x), _elem(op.results[1])
    types = [str(r.type) for r in op.results]
    dims = t.dims("%a0", x.type)
    out_dims = dims[:-1] + [t.const(k)]
    rows = Loops(t, dims[:-1], [(t.buffer(r.type, out_dims), ty) for r, ty in zip(op.results, types)])
    if k == 0:
        return rows.close(rows.inner)
    one, kk = t.const(1), t.const(k)

    is_float = elem.startswith(("f", "bf"))
    key_type = f"i{ir.FloatType(ir.RankedTensorType(x.type).element_type).width}" if is_float else elem

    def key(v: str) -> str:
        """An integer whose signed order is the values' total order."""
        if not is_float:
            return v
        bits = t(f"arith.bitcast {v} : {elem} to {key_type}")
        sign = t(f"arith.shrsi {bits}, {t.const(int(key_type[1:]) - 1, key_type)} : {key_type}")
        magnitude = t.const(2 ** (int(key_type[1:]) - 1) - 1, key_type)
        return t(f"arith.xori {bits}, {t(f'arith.andi {sign}, {magnitude} : {key_type}')} : {key_type}")

    def better(a: tuple[str, str], b: tuple[str, str]) -> str:
        ka, kb = key(a[0]), key(b[0])
        above = t(f"arith.cmpi sgt, {ka}, {kb} : {key_type}")
        tie = _all(t, [t(f"arith.cmpi eq, {ka}, {kb} : {key_type}"), t(f"arith.cmpi slt, {a[1]}, {b[1]} : {ielem}")])
        return t(f"arith.ori {above}, {tie} : i1")

    def at(pos: str) -> str:
        return ", ".join(rows.ivs + [pos])

    def get(heap: list[str], pos: str) -> tuple[str, str]:
        return tuple(t(f"tensor.extract {h}[{at(pos)}] : {ty}") for h, ty in zip(heap, types))

    def put(heap: list[str], pos: str, item: tuple[str, str]) -> list[str]:
        return [t(f"tensor.insert {v} into {h}[{at(pos)}] : {ty}") for v, h, ty in zip(item, heap, types)]

    def sift(heap: list[str], start: str, size: str, item: tuple[str, str]) -> list[str]:
        """Places `item` at `start` of the heap [0, size), moving it down past every child it
        beats. The heap stays first among the loop's values (bufferization keeps a while loop's
        tensors in place only where each goes through at the position it came in)."""
        res, h, p = t.fresh("sift"), [t.fresh("h"), t.fresh("h")], t.fresh("p")
        before = f"{', '.join(types)}, index"
        after = f"{before}, index, {elem}, {ielem}"
        t.emit(f"{res}:6 = scf.while ({h[0]} = {heap[0]}, {h[1]} = {heap[1]}, {p} = {start}) : ({before}) -> ({after}) {{")
        left = t(f"arith.addi {t(f'arith.muli {p}, {t.const(2)} : index')}, {one} : index")
        last = t(f"arith.subi {size}, {one} : index")
        lc = t(f"arith.minsi {left}, {last} : index")  # read in bounds; used only below `size`
        rc = t(f"arith.minsi {t(f'arith.addi {left}, {one} : index')}, {last} : index")
        lv, rv = get(h, lc), get(h, rc)
        has_right = t(f"arith.cmpi slt, {t(f'arith.addi {left}, {one} : index')}, {size} : index")
        right = _all(t, [has_right, better(lv, rv)])  # the worse child goes up
        child = t(f"arith.select {right}, {rc}, {lc} : index")
        cv = [t(f"arith.select {right}, {r}, {l_} : {e}") for r, l_, e in zip(rv, lv, (elem, ielem))]
        move = _all(t, [t(f"arith.cmpi slt, {left}, {size} : index"), better(item, tuple(cv))])
        t.emit(f"scf.condition({move}) {h[0]}, {h[1]}, {p}, {child}, {cv[0]}, {cv[1]} : {after}")
        t.emit("} do {")
        h2, p2, c2, v2 = [t.fresh("h"), t.fresh("h")], t.fresh("p"), t.fresh("child"), [t.fresh("v"), t.fresh("v")]
        t.emit(f"^bb0({h2[0]}: {types[0]}, {h2[1]}: {types[1]}, {p2}: index, {c2}: index, {v2[0]}: {elem}, {v2[1]}: {ielem}):")
        t.emit(f"scf.yield {', '.join(put(h2, p2, tuple(v2)))}, {c2} : {before}")
        t.emit("}")
        return put([f"{res}#0", f"{res}#1"], f"{res}#2", item)

    def element(i: str) -> tuple[str, str]:
        return (t(f"tensor.extract %a0[{at(i)}] : {x.type}"), t(f"arith.index_cast {i} : index to {ielem}"))

    # the first k elements, made a heap bottom-up
    fill = Loops(t, [kk], list(zip(rows.inner, types)))
    heap = fill.close(put(fill.inner, fill.ivs[0], element(fill.ivs[0])))
    build = Loops(t, [t.const(k // 2)], list(zip(heap, types)))
    p = t(f"arith.subi {t.const(k // 2 - 1)}, {build.ivs[0]} : index")
    heap = build.close(sift(build.inner, p, kk, get(build.inner, p)))
    # every further element that beats the root replaces it
    rest, acc = t.fresh("i"), [t.fresh("h"), t.fresh("h")]
    res = t.fresh("scan")
    t.emit(f"{res}:2 = scf.for {rest} = {kk} to {dims[-1]} step {one} iter_args({acc[0]} = {heap[0]}, {acc[1]} = {heap[1]}) "
           f"-> ({', '.join(types)}) {{")
    item = element(rest)
    res_if = t.fresh("take")
    t.emit(f"{res_if}:2 = scf.if {better(item, get(acc, t.const(0)))} -> ({', '.join(types)}) {{")
    t.emit(f"scf.yield {', '.join(sift(acc, t.const(0), kk, item))} : {', '.join(types)}")
    t.emit("} else {")
    t.emit(f"scf.yield {', '.join(acc)} : {', '.join(types)}")
    t.emit("}")
    t.emit(f"scf.yield {res_if}#0, {res_if}#1 : {', '.join(types)}")
    t.emit("}")
    heap = [f"{res}#0", f"{res}#1"]
    # sorted in place: the root (the worst left) goes to the end of the shrinking heap
    order = Loops(t, [t.const(k - 1)], list(zip(heap, types)))
    end = t(f"arith.subi {t.const(k - 1)}, {order.ivs[0]} : index")
    worst, moved = get(order.inner, t.const(0)), get(order.inner, end)
    heap = order.close(sift(put(order.inner, end, worst), t.const(0), end, moved))
    return rows.close(heap)
