"""Cross-framework parity: the same four models in JAX, PyTorch and TensorFlow over the same
weights, each compiled once by disc_stablehlo with dynamic dims. At every shape, each compiled
model matches its own framework's eager output, the three compiled outputs match each other, and
they match the StableHLO reference interpreter run on the shape-specialised JAX module."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity needs torch (pip install disc_stablehlo[test])")
tf = pytest.importorskip("tensorflow", reason="parity needs tensorflow-cpu (pip install disc_stablehlo[test])")
import jax  # noqa: E402
from jax import export  # noqa: E402

import disc_stablehlo as disc  # noqa: E402

from parity_models import SHAPES, jax_models, tf_models, torch_models  # noqa: E402
from parity_reference import interpret  # noqa: E402

TOL = dict(rtol=2e-4, atol=2e-5)
NAMES = ["b", "s", "w"]


def _jax_specs(shape):
    names = [NAMES[i] for i, d in enumerate(shape) if d is None]
    syms = dict(zip(names, export.symbolic_shape(", ".join(names))))
    return jax.ShapeDtypeStruct(tuple(syms[NAMES[i]] if d is None else d for i, d in enumerate(shape)), np.float32)


def _torch_dims(name, shape):
    dims = {i: torch.export.Dim(f"{name}_{i}", min=1, max=256) for i, d in enumerate(shape) if d is None}
    if name == "cnn":  # NCHW: the spatial dims move to positions 2 and 3
        dims = {0: dims[0], 2: dims[1], 3: dims[2]}
    return {"x": dims}


def _nchw(name, x):
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if name == "cnn" else x


@pytest.mark.parametrize("name", list(SHAPES))
def test_parity(name):
    shape, concrete = SHAPES[name]
    jax_fn, torch_module, tf_fn = jax_models()[name], torch_models()[name], tf_models()[name]
    exported = export.export(jax.jit(jax_fn))(_jax_specs(shape))
    compiled = {
        "jax": disc.compile(exported),
        "torch": disc.compile(torch_module, (torch.from_numpy(_nchw(name, np.ones([d or 2 for d in shape], np.float32))),),
                              dynamic_shapes=_torch_dims(name, shape)),
        "tf": disc.compile(tf.function(tf_fn), tf.TensorSpec(shape, tf.float32)),
    }
    rng = np.random.default_rng(0)
    for dims in concrete:
        x = rng.standard_normal(dims).astype(np.float32)
        got = {"jax": np.asarray(compiled["jax"](x)), "torch": compiled["torch"](_nchw(name, x)),
               "tf": np.asarray(compiled["tf"](x))}
        with torch.no_grad():
            eager = {"jax": np.asarray(jax_fn(x)), "torch": torch_module(torch.from_numpy(_nchw(name, x))).numpy(),
                     "tf": tf_fn(tf.constant(x)).numpy()}
        for fw in got:  # each compiled model matches its own framework
            np.testing.assert_allclose(got[fw], eager[fw], **TOL, err_msg=f"{name} {fw} at {dims}")
        np.testing.assert_allclose(got["torch"], got["jax"], **TOL, err_msg=f"{name} torch vs jax at {dims}")
        np.testing.assert_allclose(got["tf"], got["jax"], **TOL, err_msg=f"{name} tf vs jax at {dims}")
        reference = interpret(exported.mlir_module(), [x])
        np.testing.assert_allclose(got["jax"], reference, **TOL, err_msg=f"{name} vs the reference interpreter at {dims}")
    assert all(c.compile_count == 1 for c in compiled.values())
