"""JAX frontend: `jax.export` with symbolic shapes gives StableHLO whose `?` dims are named by
dimension variables and whose constraints arrive as shape assertions in `main`. Runs in the
caller's process; the module is imported by the worker as any StableHLO module."""

from __future__ import annotations

import functools
from typing import Any

from ..errors import CompileError
from ..runtime import Binding, result_tree
from . import Source, register_frontend


def _is_jax(obj: Any, specs: tuple) -> bool:
    mod = type(obj).__module__ or ""
    if mod.startswith("jax"):
        return True
    return callable(obj) and not isinstance(obj, type) and not mod.startswith(("torch", "tensorflow"))


def _export_jax(fn: Any, *specs: Any) -> tuple[Source, Binding]:
    import jax
    from jax import export

    if isinstance(fn, export.Exported):
        exported = fn
    else:
        jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
        try:
            exported = export.export(jitted)(*specs)
        except Exception as e:  # JAX's own classes (a dim it cannot decide, an op it cannot export), or the function's
            raise CompileError(f"jax.export failed: {type(e).__name__}: {e}") from e
    kept = tuple(sorted(exported.module_kept_var_idx))
    # (args, kwargs) paths: positional leaves read `args[0]`, keyword leaves `['x']`
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(exported.in_tree, [0] * len(exported.in_avals)))[0]]
    names = [("args" if p[0].idx == 0 else "") + jax.tree_util.keystr(p[1:]) for p in paths]
    dims = tuple(tuple(d if isinstance(d, int) else str(d) for d in exported.in_avals[i].shape) for i in kept)
    # the portable artifact JAX serialized (its `mlir_module()` text took 15-20 ms to print and the
    # worker's parse the same again; a CHLO composite in the text, top_k's, made the worker import jax)
    source = Source("stablehlo", exported.mlir_module_serialized, dims, tuple(names[i] for i in kept), _explicit_constraints(exported))
    binding = Binding(kept, len(exported.in_avals), "jax", pack_results=functools.partial(jax.tree_util.tree_unflatten, exported.out_tree),
                      result_tree=result_tree(jax.tree_util.tree_unflatten(exported.out_tree, ["*"] * exported.out_tree.num_leaves)))
    return source, binding


def _explicit_constraints(exported: Any) -> tuple[str, ...]:
    """The `constraints=` of `jax.export.symbolic_shape` (JAX asserts them in the module too)."""
    for aval in exported.in_avals:
        for d in aval.shape:
            scope = getattr(d, "scope", None)
            if scope is not None:
                return tuple(c.debug_str for c in getattr(scope, "_explicit_constraints", ()))
    return ()


register_frontend(_is_jax, _export_jax)
