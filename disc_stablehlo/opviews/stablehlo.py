"""No op classes: stablehlo ops are generic operations (see the package's docstring)."""
