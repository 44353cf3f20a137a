"""JAX frontend: `jax.export` with symbolic shapes gives StableHLO whose `?` dims are named by
dimension variables and whose constraints arrive as shape assertions in `main`."""

from __future__ import annotations

import functools
from typing import Any

from torch_mlir import ir

from ..bounded_dynamism.signature import signature_from_function
from ..runtime import Binding
from . import Imported, find_entry, parse_stablehlo, register_frontend


def _is_jax(obj: Any, specs: tuple) -> bool:
    mod = type(obj).__module__ or ""
    if mod.startswith("jax"):
        return True
    return callable(obj) and not isinstance(obj, type) and not mod.startswith(("torch", "tensorflow"))


def _from_jax(fn: Any, *specs: Any) -> Imported:
    import jax
    from jax import export

    if isinstance(fn, export.Exported):
        exported = fn
    else:
        jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
        exported = export.export(jitted)(*specs)
    module = parse_stablehlo(exported.mlir_module())
    kept = tuple(sorted(exported.module_kept_var_idx))
    # (args, kwargs) paths: positional leaves read `args[0]`, keyword leaves `['x']`
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(exported.in_tree, [0] * len(exported.in_avals)))[0]]
    names = [("args" if p[0].idx == 0 else "") + jax.tree_util.keystr(p[1:]) for p in paths]
    dims = [tuple(d if isinstance(d, int) else str(d) for d in exported.in_avals[i].shape) for i in kept]
    with module.context:
        entry = find_entry(module)
        sig = signature_from_function(entry, dims, [names[i] for i in kept])
        binding = Binding(kept, len(exported.in_avals), True, functools.partial(jax.tree_util.tree_unflatten, exported.out_tree))
        return Imported(module, ir.StringAttr(entry.attributes["sym_name"]).value, sig, binding, _explicit_constraints(exported))


def _explicit_constraints(exported: Any) -> tuple[str, ...]:
    """The `constraints=` of `jax.export.symbolic_shape` (JAX asserts them in the module too)."""
    for aval in exported.in_avals:
        for d in aval.shape:
            scope = getattr(d, "scope", None)
            if scope is not None:
                return tuple(c.debug_str for c in getattr(scope, "_explicit_constraints", ()))
    return ()


register_frontend(_is_jax, _from_jax)
