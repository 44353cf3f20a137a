"""Cross-framework parity: the same four models in JAX, PyTorch and TensorFlow over the same
weights, each compiled once by disc_stablehlo with dynamic dims. At every shape, each compiled
model matches its own framework's eager output, the three compiled outputs match each other, and
they match the StableHLO reference interpreter run on the shape-specialised JAX module.

The TensorFlow model is compiled in a process of its own, which saves the artifact and TF's eager
outputs; this process loads the artifact (TensorFlow and triton, which CUDA builds of torch
import, crash in one process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity needs torch (pip install disc_stablehlo[test])")
import jax  # noqa: E402
from jax import export  # noqa: E402

import disc_stablehlo as disc  # noqa: E402

from parity_models import SHAPES, inputs, jax_models, torch_models  # noqa: E402
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


TF_LEG = """
import json, sys
import numpy as np
import tensorflow as tf
import disc_stablehlo as disc
sys.path.insert(0, {here!r})
from parity_models import SHAPES, inputs, tf_models
name, out = {name!r}, {out!r}
shape, concrete = SHAPES[name]
fn = tf_models()[name]
compiled = disc.compile(tf.function(fn), tf.TensorSpec(shape, tf.float32))
compiled.save(out + "/tf.disc")
np.savez(out + "/tf_eager.npz", *[fn(tf.constant(x)).numpy() for x in inputs(concrete)])
print(json.dumps(compiled.compile_count))
"""


def _tf_leg(name, tmp_path):
    """Compiles the TF model in a process of its own; returns the loaded artifact, TF's eager
    outputs and the compile count."""
    code = TF_LEG.format(here=os.path.dirname(os.path.abspath(__file__)), name=name, out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "No module named 'tensorflow'" in proc.stderr:
        pytest.skip("parity needs tensorflow-cpu (pip install disc_stablehlo[test])")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(tmp_path / "tf_eager.npz") as z:
        eager = [z[k] for k in z.files]
    return disc.load(tmp_path / "tf.disc"), eager, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(SHAPES))
def test_parity(name, tmp_path):
    shape, concrete = SHAPES[name]
    jax_fn, torch_module = jax_models()[name], torch_models()[name]
    exported = export.export(jax.jit(jax_fn))(_jax_specs(shape))
    tf_compiled, tf_eager, tf_count = _tf_leg(name, tmp_path)
    compiled = {
        "jax": disc.compile(exported),
        "torch": disc.compile(torch_module, (torch.from_numpy(_nchw(name, np.ones([d or 2 for d in shape], np.float32))),),
                              dynamic_shapes=_torch_dims(name, shape)),
    }
    for dims, x, tf_eager_out in zip(concrete, inputs(concrete), tf_eager):
        got = {"jax": np.asarray(compiled["jax"](x)), "torch": compiled["torch"](_nchw(name, x)), "tf": tf_compiled(x)}
        with torch.no_grad():
            eager = {"jax": np.asarray(jax_fn(x)), "torch": torch_module(torch.from_numpy(_nchw(name, x))).numpy(), "tf": tf_eager_out}
        for fw in got:  # each compiled model matches its own framework
            np.testing.assert_allclose(got[fw], eager[fw], **TOL, err_msg=f"{name} {fw} at {dims}")
        np.testing.assert_allclose(got["torch"], got["jax"], **TOL, err_msg=f"{name} torch vs jax at {dims}")
        np.testing.assert_allclose(got["tf"], got["jax"], **TOL, err_msg=f"{name} tf vs jax at {dims}")
        reference = interpret(exported.mlir_module(), [x])
        np.testing.assert_allclose(got["jax"], reference, **TOL, err_msg=f"{name} vs the reference interpreter at {dims}")
    assert all(c.compile_count == 1 for c in compiled.values()) and tf_count == 1
