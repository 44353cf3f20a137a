"""The parity models, written once per framework over the same numpy weights: an MLP, an
attention block, a small CNN (NHWC in JAX and TF; NCHW in PyTorch, as its convolutions expect)
and a layer norm."""

from __future__ import annotations

import numpy as np

D, HEADS, FFN, CLASSES = 16, 2, 32, 4
_rng = np.random.default_rng(7)


def _w(*shape):
    return (_rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


W = {
    "w1": _w(D, FFN), "b1": _w(FFN), "w2": _w(FFN, CLASSES), "b2": _w(CLASSES),
    "wq": _w(D, D), "wk": _w(D, D), "wv": _w(D, D), "wo": _w(D, D),
    "conv": _w(3, 3, 3, 8), "conv_b": _w(8), "head": _w(8, CLASSES),
    "gamma": (1 + 0.1 * _rng.standard_normal(D)).astype(np.float32), "beta": _w(D),
}
SCALE = np.float32(1 / np.sqrt(D // HEADS))

# name -> (input shape with None for dynamic dims, concrete shapes to run at)
SHAPES = {
    "mlp": ([None, D], [(1, D), (3, D), (6, D)]),
    "attention": ([None, None, D], [(1, 2, D), (2, 5, D), (3, 4, D)]),
    "cnn": ([None, None, None, 3], [(1, 4, 4, 3), (2, 6, 5, 3), (1, 3, 7, 3)]),
    "layer_norm": ([None, None, D], [(1, 1, D), (2, 3, D), (4, 5, D)]),
}


def inputs(concrete):
    """The test inputs at each concrete shape (the same in every process)."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal(dims).astype(np.float32) for dims in concrete]


def jax_models():
    import jax
    import jax.numpy as jnp

    def mlp(x):
        return jax.nn.gelu(x @ W["w1"] + W["b1"], approximate=False) @ W["w2"] + W["b2"]

    def attention(x):
        b, s = x.shape[0], x.shape[1]

        def heads(t):
            return t.reshape(b, s, HEADS, D // HEADS).transpose(0, 2, 1, 3)

        q, k, v = heads(x @ W["wq"]), heads(x @ W["wk"]), heads(x @ W["wv"])
        p = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) * SCALE, axis=-1)
        return (p @ v).transpose(0, 2, 1, 3).reshape(b, s, D) @ W["wo"]

    def cnn(x):
        y = jax.lax.conv_general_dilated(x, W["conv"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean(jax.nn.relu(y + W["conv_b"]), axis=(1, 2)) @ W["head"]

    def layer_norm(x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * W["gamma"] + W["beta"]

    return {"mlp": mlp, "attention": attention, "cnn": cnn, "layer_norm": layer_norm}


def torch_models():
    import torch

    t = {k: torch.from_numpy(v) for k, v in W.items()}

    class MLP(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x @ t["w1"] + t["b1"]) @ t["w2"] + t["b2"]

    class Attention(torch.nn.Module):
        def forward(self, x):
            b, s, _ = x.shape

            def heads(u):
                return u.reshape(b, s, HEADS, D // HEADS).transpose(1, 2)

            q, k, v = heads(x @ t["wq"]), heads(x @ t["wk"]), heads(x @ t["wv"])
            p = torch.softmax(q @ k.transpose(-1, -2) * float(SCALE), dim=-1)
            return (p @ v).transpose(1, 2).reshape(b, s, D) @ t["wo"]

    class CNN(torch.nn.Module):  # NCHW in
        def forward(self, x):
            y = torch.nn.functional.conv2d(x, t["conv"].permute(3, 2, 0, 1), t["conv_b"], padding=1)
            return torch.relu(y).mean(dim=(2, 3)) @ t["head"]

    class LayerNorm(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.layer_norm(x, (D,), t["gamma"], t["beta"], eps=1e-5)

    return {"mlp": MLP(), "attention": Attention(), "cnn": CNN(), "layer_norm": LayerNorm()}


def tf_models():
    import tensorflow as tf

    t = {k: tf.constant(v) for k, v in W.items()}

    def mlp(x):
        return tf.nn.gelu(x @ t["w1"] + t["b1"], approximate=False) @ t["w2"] + t["b2"]

    def attention(x):
        b, s = tf.shape(x)[0], tf.shape(x)[1]

        def heads(u):
            return tf.transpose(tf.reshape(u, [b, s, HEADS, D // HEADS]), [0, 2, 1, 3])

        q, k, v = heads(x @ t["wq"]), heads(x @ t["wk"]), heads(x @ t["wv"])
        p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * SCALE, axis=-1)
        return tf.reshape(tf.transpose(p @ v, [0, 2, 1, 3]), [b, s, D]) @ t["wo"]

    def cnn(x):
        y = tf.nn.conv2d(x, t["conv"], strides=1, padding="SAME") + t["conv_b"]
        return tf.reduce_mean(tf.nn.relu(y), axis=[1, 2]) @ t["head"]

    def layer_norm(x):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * t["gamma"] + t["beta"]

    return {"mlp": mlp, "attention": attention, "cnn": cnn, "layer_norm": layer_norm}
