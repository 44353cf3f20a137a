"""Shape-dialect computations over ranked values become scalar index arithmetic.

Frontends describe broadcasting with the shape dialect (TF's exporter: `shape.split_at`,
`shape.broadcast`, `shape.concat` on `!shape.shape` values for batched matmuls). Upstream's
shape-to-std conversion covers only part of it; when every shape involved has a known rank, each
shape is a list of index values, and every extent tensor or extent read built from one is
replaced by those values. The shape ops left without users are erased by canonicalization."""

from __future__ import annotations

from torch_mlir import ir

from ..mlir_support import create_value, index_compare, index_constant, int_constant, operation, walk

Extents = list[ir.Value]
_EXTENT_OPS = ("shape.broadcast", "shape.concat")


class _Resolver:
    def __init__(self):
        self.memo: dict[ir.Value, Extents | None] = {}

    def extents(self, v: ir.Value, at: ir.Operation) -> Extents | None:
        """The extents of shape `v` as index values computed before `at`; None when unknown."""
        if v not in self.memo:
            self.memo[v] = self._compute(v, at)
        return self.memo[v]

    def _compute(self, v: ir.Value, at: ir.Operation) -> Extents | None:
        if isinstance(v.owner, ir.Block):
            return None
        op = operation(v.owner)
        with ir.InsertionPoint(op), op.location:
            if op.name == "shape.shape_of" and isinstance(op.operands[0].type, ir.RankedTensorType):
                t = ir.RankedTensorType(op.operands[0].type)
                return [index_constant(t.shape[i]) if not t.is_dynamic_dim(i)
                        else create_value("tensor.dim", [op.operands[0], index_constant(i)], ir.IndexType.get()) for i in range(t.rank)]
            if op.name in ("shape.const_shape", "arith.constant"):
                attr = op.attributes["shape" if op.name == "shape.const_shape" else "value"]
                if isinstance(attr, ir.DenseIntElementsAttr):
                    return [index_constant(int(x)) for x in attr]
            if op.name == "shape.split_at":
                whole, split = self.extents(op.operands[0], op), int_constant(op.operands[1])
                if whole is None or split is None:
                    return None
                split = split + len(whole) if split < 0 else split
                return whole[:split] if v == op.results[0] else whole[split:]
            if op.name == "shape.concat":
                parts = [self.extents(x, op) for x in op.operands]
                return None if any(p is None for p in parts) else [e for p in parts for e in p]
            if op.name == "shape.broadcast":
                parts = [self.extents(x, op) for x in op.operands]
                if any(p is None for p in parts):
                    return None
                result = parts[0]
                for p in parts[1:]:
                    result = _broadcast(result, p)
                return result
            if op.name in ("tensor.cast", "shape.from_extent_tensor") or (
                    op.name == "shape.to_extent_tensor" and isinstance(op.operands[0].type, ir.RankedTensorType)):
                return self.extents(op.operands[0], op)
        if isinstance(v.type, ir.RankedTensorType) and v.type.has_static_shape and v.type.rank == 1:
            # any other extent tensor of known length, read where it is defined (the extents then
            # serve every later use, in nested regions too)
            with ir.InsertionPoint.after(op), at.location:
                return [create_value("tensor.extract", [v, index_constant(i)], ir.RankedTensorType(v.type).element_type)
                        for i in range(v.type.shape[0])]
        return None


def _broadcast(a: Extents, b: Extents) -> Extents:
    """NumPy broadcasting of two extent lists (right-aligned; a size-1 extent takes the other)."""
    n = max(len(a), len(b))
    a, b = [None] * (n - len(a)) + a, [None] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x is None or y is None or x == y:
            out.append(y if x is None else x)
            continue
        cx, cy = int_constant(x), int_constant(y)
        if cx is not None and cx == cy:
            out.append(x)
        elif cx == 1 or cy == 1:
            out.append(y if cx == 1 else x)
        else:
            is_one = index_compare("eq", x, index_constant(1))
            out.append(create_value("arith.select", [is_one, y, x], ir.IndexType.get()))
    return out


def resolve_ranked_shapes(module: ir.Module) -> None:
    """Replaces extent tensors (`shape.to_extent_tensor`, or a shape op computing one: torch-mlir
    broadcasts extent tensors with `shape.broadcast`) and extent reads (`shape.get_extent`) built
    by shape computations over ranked values with scalar index values."""
    resolver = _Resolver()
    for op in walk(module.operation):
        if op.name not in ("shape.to_extent_tensor", "shape.get_extent") and not (
                op.name in _EXTENT_OPS and isinstance(op.results[0].type, ir.RankedTensorType)):
            continue
        extents = resolver.extents(op.result if op.name in _EXTENT_OPS else op.operands[0], op)
        if extents is None:
            continue
        with ir.InsertionPoint(op), op.location:
            if op.name == "shape.get_extent":
                i = int_constant(op.operands[1])
                if i is None or not isinstance(op.result.type, ir.IndexType):
                    continue
                new = extents[i]
            else:
                new = create_value("tensor.from_elements", extents, ir.RankedTensorType.get([len(extents)], ir.IndexType.get()))
                if new.type != op.result.type:
                    new = create_value("tensor.cast", [new], op.result.type)
        op.result.replace_all_uses_with(new)
        op.erase()
