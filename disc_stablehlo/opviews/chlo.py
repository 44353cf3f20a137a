"""No op classes: chlo ops are generic operations (see the package's docstring)."""
