"""StableHLO written as text by the frontends' own rewrites (PyTorch's sort / topk / cumsum,
chlo.scan): fresh names and a few idioms."""

from __future__ import annotations


def is_float(elem: str) -> bool:
    return elem.startswith(("f", "bf"))


def tensor_type(shape: list[int | None], elem: str) -> str:
    return f"tensor<{''.join(('?' if d is None else str(d)) + 'x' for d in shape)}{elem}>"


class Body:
    """The text of one function: fresh names and a few StableHLO idioms."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0

    def __call__(self, rhs: str, results: int = 1) -> str:
        self.n += 1
        self.lines.append(f"%v{self.n}{'' if results == 1 else f':{results}'} = {rhs}")
        return f"%v{self.n}"

    def i32(self, value: int, size: int | None = None) -> str:
        return self(f"stablehlo.constant dense<{value}> : tensor<{'' if size is None else f'{size}x'}i32>")

    def size(self, x: str, shape: list[int | None], elem: str, dim: int) -> str:
        """Dim `dim` of `x` as a tensor<1xi32>."""
        n = self(f"stablehlo.get_dimension_size {x}, dim = {dim} : ({tensor_type(shape, elem)}) -> tensor<i32>")
        return self(f"stablehlo.reshape {n} : (tensor<i32>) -> tensor<1xi32>")

    def vector(self, parts: list[str]) -> str:
        """tensor<1xi32> parts concatenated."""
        if not parts:
            return self("stablehlo.constant dense<> : tensor<0xi32>")
        if len(parts) == 1:
            return parts[0]
        types = ", ".join(["tensor<1xi32>"] * len(parts))
        return self(f"stablehlo.concatenate {', '.join(parts)}, dim = 0 : ({types}) -> tensor<{len(parts)}xi32>")

    def shape(self, x: str, shape: list[int | None], elem: str) -> str:
        return self.vector([self.size(x, shape, elem, d) for d in range(len(shape))])

    def filled(self, value: str, elem: str, extent: str, shape: list[int | None]) -> str:
        """A tensor of `shape` (its sizes: the tensor<Nxi32> `extent`) of `value`."""
        c = self(f"stablehlo.constant dense<{value}> : tensor<{elem}>")
        return self(f"stablehlo.dynamic_broadcast_in_dim {c}, {extent}, dims = [] : (tensor<{elem}>, tensor<{len(shape)}xi32>) -> "
                    f"{tensor_type(shape, elem)}")

    def total(self, v: str) -> str:
        """The sum of a tensor<?xi64> as a tensor<1xi32> (a size)."""
        s = self(f"stablehlo.reduce({v} init: {self('stablehlo.constant dense<0> : tensor<i64>')}) applies stablehlo.add across "
                 "dimensions = [0] : (tensor<?xi64>, tensor<i64>) -> tensor<i64>")
        return self(f"stablehlo.convert {self(f'stablehlo.reshape {s} : (tensor<i64>) -> tensor<1xi64>')} : (tensor<1xi64>) -> tensor<1xi32>")
