"""Models shared by the demo and the benchmarks: a BERT-like encoder layer in JAX
(hidden 256, 4 heads, FFN 1024 unless given: BERT-base's is 768, 12, 3072; layer norm, GELU,
softmax attention with an additive mask)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

HIDDEN, HEADS, FFN = 256, 4, 1024


def encoder_params(seed: int = 0, hidden: int = HIDDEN, ffn: int = FFN) -> dict[str, np.ndarray]:
    HIDDEN, FFN = hidden, ffn  # noqa: N806
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    def b(n):
        return (0.02 * rng.standard_normal(n)).astype(np.float32)

    return {"wq": w(HIDDEN, HIDDEN), "bq": b(HIDDEN), "wk": w(HIDDEN, HIDDEN), "bk": b(HIDDEN),
            "wv": w(HIDDEN, HIDDEN), "bv": b(HIDDEN), "wo": w(HIDDEN, HIDDEN), "bo": b(HIDDEN),
            "ln1_g": np.ones(HIDDEN, np.float32), "ln1_b": np.zeros(HIDDEN, np.float32),
            "w1": w(HIDDEN, FFN), "b1": b(FFN), "w2": w(FFN, HIDDEN), "b2": b(HIDDEN),
            "ln2_g": np.ones(HIDDEN, np.float32), "ln2_b": np.zeros(HIDDEN, np.float32)}


def _layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * g + b


def encoder_layer(x, mask, p, heads_: int = HEADS):
    """x: [batch, seq, hidden]; mask: [batch, seq] additive (0 keep, -1e9 drop)."""
    bsz, seq = x.shape[0], x.shape[1]
    HIDDEN, HEADS = p["wq"].shape[0], heads_  # noqa: N806
    dh = HIDDEN // HEADS

    def heads(t):
        return t.reshape(bsz, seq, HEADS, dh).transpose(0, 2, 1, 3)

    q, k, v = (heads(x @ p[f"w{n}"] + p[f"b{n}"]) for n in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(dh)) + mask[:, None, None, :]
    ctx = jax.nn.softmax(scores, axis=-1) @ v
    attn = ctx.transpose(0, 2, 1, 3).reshape(bsz, seq, HIDDEN) @ p["wo"] + p["bo"]
    h = _layer_norm(x + attn, p["ln1_g"], p["ln1_b"])
    ff = jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=False) @ p["w2"] + p["b2"]
    return _layer_norm(h + ff, p["ln2_g"], p["ln2_b"])


def encoder_specs(params):
    """Argument specs with symbolic batch and sequence (weights static)."""
    from jax import export

    b, s = export.symbolic_shape("batch, seq")
    return (jax.ShapeDtypeStruct((b, s, params["wq"].shape[0]), jnp.float32), jax.ShapeDtypeStruct((b, s), jnp.float32),
            {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in params.items()})


def encoder_inputs(batch: int, seq: int, seed: int = 1, hidden: int = HIDDEN):
    rng = np.random.default_rng(seed + 7919 * batch + seq)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    mask = np.where(rng.random((batch, seq)) < 0.1, -1e9, 0.0).astype(np.float32)
    return x, mask


def torch_encoder(params, heads_: int = HEADS, device: str = "cpu"):
    """The same layer in PyTorch over the same weights (for the torch eager / torch.compile peers)."""
    import torch

    t = {k: torch.from_numpy(v).to(device) for k, v in params.items()}
    HIDDEN, HEADS = params["wq"].shape[0], heads_  # noqa: N806
    dh = HIDDEN // HEADS

    class Encoder(torch.nn.Module):
        def forward(self, x, mask):
            b, s, _ = x.shape

            def heads(u):
                return u.reshape(b, s, HEADS, dh).transpose(1, 2)

            q, k, v = (heads(x @ t[f"w{n}"] + t[f"b{n}"]) for n in "qkv")
            scores = q @ k.transpose(-1, -2) / float(np.sqrt(dh)) + mask[:, None, None, :]
            ctx = torch.softmax(scores, dim=-1) @ v
            attn = ctx.transpose(1, 2).reshape(b, s, HIDDEN) @ t["wo"] + t["bo"]
            h = torch.nn.functional.layer_norm(x + attn, (HIDDEN,), t["ln1_g"], t["ln1_b"], eps=1e-5)
            ff = torch.nn.functional.gelu(h @ t["w1"] + t["b1"]) @ t["w2"] + t["b2"]
            return torch.nn.functional.layer_norm(h + ff, (HIDDEN,), t["ln2_g"], t["ln2_b"], eps=1e-5)

    return Encoder().eval()
