"""TensorFlow functions through TF's StableHLO exporter, compiled once with `None` dims and
checked against TF eager at >= 3 shapes each."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="the TensorFlow frontend needs tensorflow-cpu (pip install disc_stablehlo[tf])")
import disc_stablehlo as disc  # noqa: E402

RNG = np.random.default_rng(0)
H, HEADS = 16, 4


def _weights(*shape):
    return tf.constant((RNG.standard_normal(shape) * 0.3).astype(np.float32))


W_DENSE, W_Q, W_K, W_V, W_O, KERNEL, TABLE = (_weights(*s) for s in [(H, 8), (H, H), (H, H), (H, H), (H, H), (3, 3, 3, 8), (10, 4)])


def dense_gelu(x):
    return tf.nn.gelu(x @ W_DENSE + 0.1, approximate=False)


def attention(x):
    b, s = tf.shape(x)[0], tf.shape(x)[1]

    def heads(t):
        return tf.transpose(tf.reshape(t, [b, s, HEADS, H // HEADS]), [0, 2, 1, 3])

    q, k, v = heads(x @ W_Q), heads(x @ W_K), heads(x @ W_V)
    weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / 2.0, axis=-1)
    return tf.reshape(tf.transpose(weights @ v, [0, 2, 1, 3]), [b, s, H]) @ W_O


def conv_pool(x):
    y = tf.nn.relu(tf.nn.conv2d(x, KERNEL, strides=1, padding="SAME"))
    return tf.reduce_mean(tf.nn.max_pool2d(y, 2, 2, "VALID"), axis=[1, 2])


def layer_norm(x):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5)


def while_loop(x):
    _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.tanh(y) * 1.5), [tf.constant(0), x])
    return y


def gather(ids):
    return tf.gather(TABLE, ids)


def flatten(x):
    return tf.reshape(x, [tf.shape(x)[0], -1])


def masked_cumsum(x):
    return tf.cumsum(tf.where(x > 0, x, tf.zeros_like(x)), axis=1)


def _floats(*shapes):
    return [RNG.standard_normal(s).astype(np.float32) for s in shapes]


CASES = [
    ("dense_gelu", dense_gelu, [None, H], _floats((1, H), (5, H), (33, H))),
    ("attention", attention, [None, None, H], _floats((1, 5, H), (3, 7, H), (2, 16, H))),
    ("conv_pool", conv_pool, [None, None, None, 3], _floats((1, 8, 8, 3), (2, 12, 10, 3), (3, 5, 7, 3))),
    ("layer_norm", layer_norm, [None, None, H], _floats((1, 3, H), (2, 9, H), (4, 1, H))),
    ("while_loop", while_loop, [None, 4], _floats((1, 4), (5, 4), (9, 4))),
    ("flatten", flatten, [None, None, 3], _floats((1, 2, 3), (4, 5, 3), (2, 1, 3))),
    ("masked_cumsum", masked_cumsum, [None, None], _floats((1, 1), (3, 7), (4, 20))),
]


@pytest.mark.parametrize("name, fn, shape, inputs", CASES, ids=[c[0] for c in CASES])
def test_tf_function_matches_eager(name, fn, shape, inputs):
    f = disc.compile(tf.function(fn), tf.TensorSpec(shape, tf.float32))
    for x in inputs:
        np.testing.assert_allclose(f(x), fn(tf.constant(x)).numpy(), rtol=1e-5, atol=1e-5)
    assert f.compile_count == 1


def test_gather_with_dynamic_ids():
    f = disc.compile(gather, tf.TensorSpec([None], tf.int32))  # a plain function with TensorSpecs
    for ids in (np.array([1, 2, 9], np.int32), np.array([0], np.int32), np.arange(10, dtype=np.int32)):
        np.testing.assert_array_equal(f(ids), tf.gather(TABLE, ids).numpy())


def test_tf_tensors_in_give_tf_tensors_out_and_structure_is_kept():
    f = disc.compile(tf.function(lambda x: {"y": x * 2.0, "z": (x + 1.0, tf.reduce_sum(x))}),
                     tf.TensorSpec([None, 2], tf.float32, name="x"))
    out = f(tf.ones([3, 2]))
    assert isinstance(out["y"], tf.Tensor) and out["y"].shape == (3, 2)
    np.testing.assert_allclose(out["z"][1].numpy(), 6.0)
    assert isinstance(f(np.ones((1, 2), np.float32))["y"], np.ndarray)
    with pytest.raises(disc.ShapeError, match="'x' dim 1: expected size 2, got 3"):
        f(np.ones((1, 3), np.float32))


def test_specs_must_be_tensor_specs():
    with pytest.raises(disc.CompileError, match="tf.TensorSpec"):
        disc.compile(tf.function(lambda x: x), tf.TensorSpec([None], tf.float32), (3,))


def test_works_in_a_process_that_imported_tensorflow_first():
    code = ("import tensorflow as tf, numpy as np\n"
            "import disc_stablehlo as disc\n"
            "f = disc.compile(tf.function(lambda x: tf.nn.relu(x) * 2.0), tf.TensorSpec([None], tf.float32))\n"
            "print(f(np.array([-1.0, 2.0], np.float32)).tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[0.0, 4.0]"


def test_keras_layers():
    dense, norm = tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.LayerNormalization()
    attention = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)

    def block(x):
        h = norm(x + attention(x, x))
        return dense(h)

    block(tf.zeros((1, 3, 16)))  # builds the layers
    f = disc.compile(tf.function(block), tf.TensorSpec([None, None, 16], tf.float32))
    for shape in [(1, 2, 16), (3, 5, 16), (2, 9, 16)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(f(x), block(tf.constant(x)).numpy(), rtol=1e-4, atol=1e-5)


def test_tf_ops_the_exporter_leaves_are_named():
    with pytest.raises(disc.UnsupportedOpError, match="tf.TopKV2"):
        disc.compile(tf.function(lambda x: tf.math.top_k(x, k=2).values), tf.TensorSpec([None, None], tf.float32))
