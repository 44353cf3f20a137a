"""TensorFlow frontend (the `[tf]` extra): a `tf.function` (or a plain function) with
`tf.TensorSpec` specs whose `None` dims stay dynamic.

The function is traced, its variables frozen into constants (control flow kept as
`tf.While`/`tf.If`, which TF's exporter turns into StableHLO control flow) and converted by TF's
own StableHLO exporter. The exporter leaves a `tf.Reshape` whose result has an unknown dim as a
TF op; it is rewritten here into `stablehlo.dynamic_reshape` with the `-1` resolved at run time,
and a `tf.Cumsum` on a dynamic dim into a product with a triangular matrix. Any other TF op left
behind is reported as unsupported, by name."""

from __future__ import annotations

import re
import sys
from typing import Any

from typing import TYPE_CHECKING

from ..errors import CompileError, UnsupportedOpError
from ..runtime import Binding
from . import Imported, Source, entry_name, find_entry, register_frontend

if TYPE_CHECKING:
    from torch_mlir import ir


def _is_tf(obj: Any, specs: tuple) -> bool:
    tf = sys.modules.get("tensorflow")  # never import TensorFlow for another frontend's input
    if tf is None:
        return False
    return (type(obj).__module__ or "").startswith("tensorflow") or (
        callable(obj) and bool(specs) and all(isinstance(s, tf.TensorSpec) for s in specs))


def _shape_text(spec: Any) -> str:
    return ",".join("?" if d is None else str(d) for d in spec.shape.as_list())


def _export_tf(fn: Any, *specs: Any) -> tuple[Source, Binding]:
    import tensorflow as tf
    from tensorflow.compiler.mlir.tensorflow_to_stablehlo.python import pywrap_tensorflow_to_stablehlo as to_stablehlo
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    if not all(isinstance(s, tf.TensorSpec) for s in specs):
        raise CompileError("a TensorFlow function needs one tf.TensorSpec per argument (None for a dynamic dim)")
    traced = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
    concrete = traced.get_concrete_function(*specs)
    frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=False)
    tf_text = tf.mlir.experimental.convert_function(frozen)
    try:
        bytecode = to_stablehlo.tensorflow_module_to_stablehlo(tf_text, ":".join(_shape_text(s) for s in specs))
    except Exception as e:
        raise CompileError(f"TensorFlow's StableHLO exporter failed: {e}") from None
    ops = tuple(sorted(set(re.findall(r'"(tf\.\w+)"', tf_text)) - {"tf.Const", "tf.Identity", "tf.NoOp"}))
    names = tuple(s.name or f"arg{i}" for i, s in enumerate(specs))
    structure = concrete.structured_outputs
    return (Source("tf", bytecode, arg_names=names, ops=ops),
            Binding(pack_results=lambda outs: tf.nest.pack_sequence_as(structure, outs)))


def import_tf(source: Source) -> Imported:
    """In the worker: the exporter's module, with the TF ops it left converted here."""
    from torch_mlir import ir

    from ..bounded_dynamism.signature import signature_from_function
    from ..mlir_support import new_context

    ctx = new_context()
    ctx.allow_unregistered_dialects = True  # the TF ops the exporter leaves behind
    with ctx, ir.Location.unknown():
        try:
            module = ir.Module.parse(source.payload)
        except Exception:  # TF ops left with TF-specific attributes, which only TF can read
            raise UnsupportedOpError("TensorFlow's StableHLO exporter left TF ops unconverted (one of "
                                     f"{', '.join(source.ops)}); they are not supported") from None
        _convert_leftovers(module)
        ctx.allow_unregistered_dialects = False
        entry = find_entry(module)
        return Imported(module, entry_name(entry), signature_from_function(entry, None, source.arg_names))


def _convert_leftovers(module: ir.Module) -> None:
    from ..mlir_support import describe, walk
    from ..passes.lower import LoweringState

    state = LoweringState(module)
    for op in walk(module.operation):
        if op.name == "tf.Reshape":
            name = state.fresh_symbol("tf_reshape")
            state.replace_with_call(op, _reshape_function(name, op), name)
        elif op.name == "tf.Cumsum" and (text := _cumsum_function(name := state.fresh_symbol("tf_cumsum"), op)):
            state.replace_with_call(op, text, name)
        elif op.name.startswith("tf."):
            raise UnsupportedOpError(f"TensorFlow's StableHLO exporter left {describe(op)} unconverted")


def _cumsum_function(name: str, op: ir.Operation) -> str | None:
    """tf.Cumsum (inclusive, forward, float) along a constant axis as a product with an
    upper-triangular matrix of ones built from iotas; None when it cannot be expressed so."""
    from torch_mlir import ir

    x_type, r_type = ir.RankedTensorType(op.operands[0].type), op.result.type
    axis_owner = op.operands[1].owner
    flags = [a for a in ("exclusive", "reverse") if a in op.attributes and ir.BoolAttr(op.attributes[a]).value]
    if (flags or not isinstance(x_type.element_type, ir.FloatType) or isinstance(axis_owner, ir.Block)
            or axis_owner.name != "stablehlo.constant"):
        return None
    axis = int(ir.DenseIntElementsAttr(axis_owner.attributes["value"])[0]) % x_type.rank
    elem, rank = str(x_type.element_type), x_type.rank
    n = "?" if x_type.is_dynamic_dim(axis) else str(x_type.shape[axis])
    tri, idx, mask = f"tensor<{n}x{n}x{elem}>", f"tensor<{n}x{n}xi64>", f"tensor<{n}x{n}xi1>"
    others = [d for d in range(rank) if d != axis]
    prod_type = f"tensor<{''.join(('?' if x_type.is_dynamic_dim(d) else str(x_type.shape[d])) + 'x' for d in others)}{n}x{elem}>"
    lines = [
        f"%d = stablehlo.get_dimension_size %a0, dim = {axis} : ({x_type}) -> tensor<i32>",
        "%d1 = stablehlo.reshape %d : (tensor<i32>) -> tensor<1xi32>",
        "%shape = stablehlo.concatenate %d1, %d1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>",
        f"%rows = stablehlo.dynamic_iota %shape, dim = 0 : (tensor<2xi32>) -> {idx}",
        f"%cols = stablehlo.dynamic_iota %shape, dim = 1 : (tensor<2xi32>) -> {idx}",
        f"%upper = stablehlo.compare LE, %rows, %cols : ({idx}, {idx}) -> {mask}",
        f"%ones = stablehlo.convert %upper : ({mask}) -> {tri}",
        f"%p = stablehlo.dot_general %a0, %ones, contracting_dims = [{axis}] x [0] : ({x_type}, {tri}) -> {prod_type}",
    ]
    # the product puts the summed axis last; move it back
    perm = list(range(rank - 1))
    perm.insert(axis, rank - 1)
    lines += [f"%r = stablehlo.transpose %p, dims = {perm} : ({prod_type}) -> {r_type}", f"return %r : {r_type}"]
    return _function(name, op, lines)


def _reshape_function(name: str, op: ir.Operation) -> str:
    """tf.Reshape(x, shape) with at most one -1 in `shape`: the missing size is the element count
    divided by the product of the others (at least 1, so an empty tensor divides by nothing)."""
    from torch_mlir import ir

    x_type, s_type, r_type = op.operands[0].type, op.operands[1].type, op.result.type
    elem = str(ir.RankedTensorType(s_type).element_type)
    k = ir.RankedTensorType(s_type).shape[0]
    scalar, mask = f"tensor<{elem}>", f"tensor<{k}xi1>"
    lines = [f"%one = stablehlo.constant dense<1> : {scalar}", "%n0 = stablehlo.constant dense<1> : " + scalar]
    for i in range(ir.RankedTensorType(x_type).rank):
        lines += [f"%d{i} = stablehlo.get_dimension_size %a0, dim = {i} : ({x_type}) -> tensor<i32>",
                  f"%e{i} = stablehlo.convert %d{i} : (tensor<i32>) -> {scalar}",
                  f"%n{i + 1} = stablehlo.multiply %n{i}, %e{i} : {scalar}"]
    n = f"%n{ir.RankedTensorType(x_type).rank}"
    lines += [
        f"%p = stablehlo.reduce(%a1 init: %one) applies stablehlo.multiply across dimensions = [0] : ({s_type}, {scalar}) -> {scalar}",
        f"%q = stablehlo.negate %p : {scalar}",
        f"%known = stablehlo.maximum %q, %one : {scalar}",
        f"%missing = stablehlo.divide {n}, %known : {scalar}",
        f"%fill = stablehlo.broadcast_in_dim %missing, dims = [] : ({scalar}) -> {s_type}",
        f"%minus = stablehlo.constant dense<-1> : {s_type}",
        f"%is = stablehlo.compare EQ, %a1, %minus : ({s_type}, {s_type}) -> {mask}",
        f"%shape = stablehlo.select %is, %fill, %a1 : {mask}, {s_type}",
        f"%r = stablehlo.dynamic_reshape %a0, %shape : ({x_type}, {s_type}) -> {r_type}",
        f"return %r : {r_type}",
    ]
    return _function(name, op, lines)


def _function(name: str, op: ir.Operation, lines: list[str]) -> str:
    """A private function of the op's signature (operands %a0, %a1, ...) with `lines` as body."""
    from ..passes.lower import Text

    text = Text()
    for line in lines:
        text.emit(line)
    return text.function(name, op)


register_frontend(_is_tf, _export_tf, "tf", import_tf)
