"""PyTorch models through torch.export + torch-mlir, compiled once with dynamic dims and checked
against eager PyTorch at >= 3 shapes each."""

from __future__ import annotations

import warnings

import pytest
from conftest import gemm_call_args

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch (pip install disc_stablehlo[torch])")
import disc_stablehlo as disc  # noqa: E402

Dim = torch.export.Dim
torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.l2(torch.nn.functional.gelu(self.ln(self.l1(x))))


class CausalAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.qkv, self.out = torch.nn.Embedding(50, 32), torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, tokens):
        h = self.emb(tokens)
        b, s, _ = h.shape
        q, k, v = self.qkv(h).reshape(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, 32))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.pool, self.avg, self.fc = torch.nn.MaxPool2d(2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(self.avg(h).flatten(1))


class BatchNorms(torch.nn.Module):
    """Inference batch norms with random statistics and parameters (a fresh one is an identity):
    over [N, C, L], over [N, C], and without affine parameters."""

    def __init__(self):
        super().__init__()
        self.seq, self.flat, self.plain = torch.nn.BatchNorm1d(8), torch.nn.BatchNorm1d(8), torch.nn.BatchNorm1d(8, affine=False)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for bn in (self.seq, self.flat, self.plain):
                bn.running_mean.uniform_(-1, 1, generator=g)
                bn.running_var.uniform_(0.5, 2, generator=g)
                if bn.affine:
                    bn.weight.uniform_(0.5, 1.5, generator=g)
                    bn.bias.uniform_(-1, 1, generator=g)

    def forward(self, x):
        return self.seq(x), self.flat(x.mean(-1)), self.plain(x)


class Conv1d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 6, 5, padding=2)

    def forward(self, x):
        return torch.tanh(self.conv(x))


class MaskCumsumArgmaxTopk(torch.nn.Module):
    def forward(self, x, mask):
        y = torch.where(mask, x, torch.zeros_like(x)).cumsum(dim=1)
        top, where = torch.topk(x, 2, dim=1)
        ascending, order = torch.sort(x, dim=1)
        return y, y.argmax(dim=1), mask.long().cumsum(dim=1), top, where, ascending, order


class GroupNormUpsample(torch.nn.Module):
    """A decoder block: conv, GroupNorm, SiLU, nearest upsampling by 2 and to a given size."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.GroupNorm(2, 8)

    def forward(self, x):
        y = torch.nn.functional.silu(self.norm(self.conv(x)))
        up = torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
        return up, torch.nn.functional.interpolate(y, size=(5, 7), mode="nearest")


class SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class Recurrent(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.rnn, self.out = getattr(torch.nn, kind)(8, 16, batch_first=True), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


class AttentionVariants(torch.nn.Module):
    """`scaled_dot_product_attention` with each kind of mask: boolean (one row fully masked, which
    gives zeros), additive, causal with a scale, and grouped-query heads (`enable_gqa`)."""

    def forward(self, q, k, v, keep):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        bool_mask = keep[:, None, None, :] & (torch.arange(q.shape[2]) > 0)[None, None, :, None]
        additive = (1.0 - keep.float())[:, None, None, :] * -1e4
        return (sdpa(q, k, v, attn_mask=bool_mask), sdpa(q, k, v, attn_mask=additive), sdpa(q, k, v, is_causal=True, scale=0.3),
                sdpa(q, k[:, :2], v[:, :2], enable_gqa=True))


class InPlace(torch.nn.Module):
    """In-place ops on fresh tensors (which become functional ops) and on one read again after
    the update (which stays an update)."""

    def forward(self, x):
        h = torch.nn.functional.hardswish(x * 2, inplace=True)
        h += 1
        shared = x - 1
        updated = shared.mul_(3)
        return h.relu_(), shared + updated


class ConcatIndependent(torch.nn.Module):
    def forward(self, a, b):
        return torch.cat([a * 2, b + 1], dim=1)



class NegativeIndices(torch.nn.Module):
    """Indices below zero count from the end, as PyTorch reads them: a buffer of them as the index
    (Falcon's `fused_qkv[..., [-2], :]`; a buffer in the index list, as Swin's relative position
    index), computed ones, and an update at them (index_put)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("last_two", torch.tensor([-2, -1]))

    def forward(self, x):
        updated = x.clone()
        updated[:, self.last_two] = 0.5
        return x[..., self.last_two], x[torch.arange(x.shape[0]) - x.shape[0]], updated


class PositionIdsFromMask(torch.nn.Module):
    """RoBERTa's and OPT's position ids: the integer cumulative sum of the padding mask, times the mask."""

    def __init__(self):
        super().__init__()
        self.positions = torch.nn.Embedding(200, 8)

    def forward(self, ids):
        mask = ids.ne(1).int()
        return self.positions(torch.cumsum(mask, dim=1).type_as(mask) * mask + 1)


class ChannelsLastPool(torch.nn.Module):
    """Channels-last features permuted to channels-first and pooled to 1x1 (Swin's head): torch's
    decomposition restores the channels-last strides of the result with as_strided."""

    def forward(self, x):
        return torch.nn.functional.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1)


class SliceAssignments(torch.nn.Module):
    """A mask built by assigning to slices with negative and open bounds along a dynamic dim (Swin's
    shifted-window attention mask): `slice_scatter` after functionalization."""

    def forward(self, x):
        mask = x.new_zeros((x.shape[0], 8))
        count = 0
        for rows in (slice(0, -4), slice(-4, -2), slice(-2, None)):
            for cols in (slice(0, -4), slice(-4, -2), slice(-2, None)):
                mask[rows, cols] = count
                count += 1
        return x + mask


class SplitWithTrailingUnit(torch.nn.Module):
    """[2n, 8, 1] -> [1, n, 2, 8]: the leading dim splits, but the trailing 1 has no result dim
    left, so the reshape is no pure split (ConvBERT's, under dynamo)."""

    def forward(self, x):
        return (x * 2).reshape(1, x.shape[0] // 2, 2, 8) + 1

class CeilModePools(torch.nn.Module):
    """Poolings in ceil mode (a last window may hang over the end), max and average, padding counted
    or not: torch-mlir pads both ends for them (shifted windows) and ignores ceil mode for dynamic
    sizes (too few windows). torch.export guards the last window's start, which it cannot prove.
    Average pooling with a divisor given, which torch-mlir cannot convert."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.pools = nn.ModuleList([nn.MaxPool2d(3, 2, ceil_mode=True), nn.MaxPool2d(2, 2, ceil_mode=True),
                                    nn.MaxPool2d(3, 1, padding=1, ceil_mode=True), nn.AvgPool2d(3, 2, padding=1, ceil_mode=True),
                                    nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
                                    nn.AvgPool2d(3, 2, ceil_mode=True), nn.AvgPool2d(3, 2, padding=1, divisor_override=5),
                                    nn.AvgPool2d(2, 2, ceil_mode=True, divisor_override=3)])

    def forward(self, x):
        return tuple(pool(x) for pool in self.pools)


class AdaptivePools(torch.nn.Module):
    """Adaptive average pooling of dynamic sizes to outputs larger than 1 (windows of unequal
    lengths): torch's decomposition branches on the size modulo the output's."""

    def forward(self, x):
        F = torch.nn.functional
        return F.adaptive_avg_pool2d(x, (3, 2)), F.adaptive_avg_pool1d(x.flatten(2), 5), F.adaptive_avg_pool2d(x, 1)


class AdaptiveMaxPools(torch.nn.Module):
    """Adaptive max pooling of dynamic sizes (channel attention's global max among them), with the
    maxima's positions: torch-mlir cannot convert it."""

    def forward(self, x):
        F = torch.nn.functional
        return (*F.adaptive_max_pool2d(x, (3, 2), return_indices=True), F.adaptive_max_pool2d(x, 1),
                *F.adaptive_max_pool1d(x.flatten(2), 5, return_indices=True),
                *F.adaptive_max_pool3d(x[:, None], (2, 2, 3), return_indices=True))


class PadToWindows(torch.nn.Module):
    """Padding to whole windows of 4 (Swin's): amounts that are sizes, `n % 4` among them."""

    def forward(self, x):
        pad = (3 - x.shape[1] % 4) % 4  # after one row in front
        return torch.nn.functional.pad(x, (0, 0, 1, pad), value=0.5).reshape(x.shape[0], -1, 4, x.shape[2]).sum(2)


class PadIdsToWindows(torch.nn.Module):
    """Token ids padded by a size-dependent amount with a pad id: they stay integers."""

    def forward(self, ids):
        return torch.nn.functional.pad(ids, (0, (4 - ids.shape[1] % 4) % 4), value=7)


class EmbeddingBags(torch.nn.Module):
    """nn.EmbeddingBag over lists of varying length (a recommendation model's features), which
    torch-mlir cannot convert: sums with per-sample weights, means and maxima with a padding index,
    and offsets that include the end; some bags are empty."""

    def __init__(self):
        super().__init__()
        bag = torch.nn.EmbeddingBag
        self.sum, self.mean = bag(50, 8, mode="sum"), bag(50, 8, mode="mean", padding_idx=3)
        self.max, self.ends = bag(50, 8, mode="max", padding_idx=3), bag(50, 8, mode="sum", include_last_offset=True)

    def forward(self, ids, offsets, weights):
        ends = torch.cat([offsets, offsets.new_full((1,), ids.shape[0])])
        return self.sum(ids, offsets, per_sample_weights=weights), self.mean(ids, offsets), self.max(ids, offsets), self.ends(ids, ends)


def _bags(b: int, s: int) -> tuple:
    """b + 1 bags over b * s + 3 ids (every fourth the padding id), starts drawn at random: some repeat (empty bags)."""
    g = torch.Generator().manual_seed(100 * b + s)
    n = b * s + 3
    ids = torch.randint(0, 50, (n,), generator=g)
    ids[::4] = 3
    offsets = torch.sort(torch.randint(0, n + 1, (b + 1,), generator=g)).values
    offsets[0] = 0
    return ids, offsets, torch.rand(n, generator=g)


class ScatterReductions(torch.nn.Module):
    """`scatter_reduce` (a graph network's messages gathered per node), which torch-mlir cannot
    convert: every reduction, with and without the target's own values, along either dim; some
    targets receive nothing."""

    def forward(self, x, index, src):
        rows = [x.scatter_reduce(0, index, src, reduce, include_self=own)
                for reduce in ("sum", "prod", "amax", "amin") for own in (True, False)]
        return (*rows, src[:, :3].scatter_reduce(1, index % 3, src, "amax", include_self=False),
                x.long().scatter_reduce(0, index, src.long(), "amin", include_self=False))


def _scatter(b: int, s: int) -> tuple:
    g = torch.Generator().manual_seed(10 * b + s)
    x = torch.randn(b + 2, 3, generator=g)
    return x * 4, torch.randint(0, b + 2, (s, 3), generator=g), torch.randn(s + 1, 4, generator=g) * 4


class ResizeToSymbolicSizes(torch.nn.Module):
    """Resizing to sizes that are symbolic (a segmentation head's map back to the image size, a
    feature pyramid's coarser level to the finer one's): bilinear with aligned corners, whose scale
    (in - 1) / (out - 1) torch computes as a float of sizes, which torch-mlir cannot import;
    nearest, whose source index divides by the output's size. Corners not aligned beside them."""

    def forward(self, x, like):
        F = torch.nn.functional
        return (F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
                F.interpolate(x, size=like.shape[-2:], mode="bilinear", align_corners=True),
                F.interpolate(x, size=like.shape[-2:], mode="bilinear", align_corners=False),
                F.interpolate(x, size=like.shape[-2:], mode="nearest"))


class ClampByTensors(torch.nn.Module):
    """`torch.clamp` with bounds that are tensors broadcast against the operand (PhiMoE's router
    clamps each row's scores by a bound of its own), a lower bound alone, and bounds that cross."""

    def forward(self, x, lo):
        row = x.amax(-1, keepdim=True) - 1
        return torch.clamp(x, min=row), torch.clamp(x, min=lo), torch.clamp(x, min=lo, max=row), torch.clamp(x, max=lo[:1])


class LargerAndSmallerSizes(torch.nn.Module):
    """Python's max / min of sizes (`torch.sym_max`, `torch.sym_min`): a table's last columns for
    the sequence (MPT cuts its position bias so), and a scale that stops growing at 3."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(4, 16))

    def forward(self, x):
        s = x.shape[1]
        return x + self.table[:, max(0, 16 - s):][:, :s].sum(0), x * min(s, 3)


class ComplexRotary(torch.nn.Module):
    """Rotary positions in complex numbers as Llama 4 writes them: `torch.polar` of the angles,
    scaled, the queries seen as complex pairs (`view_as_complex`), multiplied, and back
    (`view_as_real`); torch-mlir converts no complex arithmetic, so it runs as real pairs."""

    def forward(self, x):
        s = x.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
        freqs = torch.arange(s, dtype=torch.float)[None, :, None] * inv
        rotation = torch.polar(torch.ones_like(freqs), freqs) * 0.5
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * rotation[:, :, None, :]).flatten(3)


class WeightsInAList(torch.nn.Module):
    """Weights concatenated inside the model (WavLM joins its query, key and value biases so):
    `torch.cat` of a list holding parameters and a buffer."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.register_buffer("extra", torch.randn(8))

    def forward(self, x):
        weight = torch.cat((self.q.weight, self.k.weight))
        return torch.nn.functional.linear(x, weight, torch.cat([self.q.bias, self.k.bias])) + torch.cat([self.extra, x[0]]).sum()


B = Dim("batch", min=1, max=64)
S = Dim("seq", min=2, max=128)
MODELS = [
    ("mlp_layernorm_gelu", MLP, lambda b, s: (torch.randn(b, 16),), {"x": {0: B}}),
    ("transformer_encoder_layer", lambda: torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
     lambda b, s: (torch.randn(b, s, 32),), {"src": {0: B, 1: S}}),
    ("causal_attention_embedding", CausalAttention, lambda b, s: (torch.randint(0, 50, (b, s)),), {"tokens": {0: B, 1: S}}),
    ("cnn_nchw", CNN, lambda b, s: (torch.randn(b, 3, 2 * s, 2 * s),), {"x": {0: B, 2: 2 * Dim("h", min=2, max=64), 3: 2 * Dim("w", min=2, max=64)}}),
    ("batch_norms", BatchNorms, lambda b, s: (torch.randn(b, 8, s),), {"x": {0: B, 2: S}}),
    ("conv1d_dynamic_length", Conv1d, lambda b, s: (torch.randn(b, 4, s),), {"x": {0: B, 2: S}}),
    ("groupnorm_upsample", GroupNormUpsample, lambda b, s: (torch.randn(b, 4, s, s + 1),),
     {"x": {0: B, 2: Dim("h", min=2, max=64), 3: Dim("w", min=3, max=65)}}),
    ("multihead_attention", SelfAttention, lambda b, s: (torch.randn(b, s, 16),), {"x": {0: B, 1: S}}),
    ("gru", lambda: Recurrent("GRU"), lambda b, s: (torch.randn(b, 6, 8),), {"x": {0: B}}),
    ("lstm", lambda: Recurrent("LSTM"), lambda b, s: (torch.randn(b, 6, 8),), {"x": {0: B}}),
    ("mask_cumsum_argmax_topk", MaskCumsumArgmaxTopk, lambda b, s: (torch.randn(b, s), torch.rand(b, s) > 0.3),
     {"x": {0: B, 1: S}, "mask": {0: B, 1: S}}),
    ("attention_masks_causal_gqa", AttentionVariants,
     lambda b, s: (torch.randn(b, 4, s, 8), torch.randn(b, 4, s, 8), torch.randn(b, 4, s, 8), torch.arange(s)[None, :] < s - 1 - torch.arange(b)[:, None] % 2),
     {"q": {0: B, 2: S}, "k": {0: B, 2: S}, "v": {0: B, 2: S}, "keep": {0: B, 1: S}}),
    ("in_place_ops", InPlace, lambda b, s: (torch.randn(b, s),), {"x": {0: B, 1: S}}),
    ("negative_indices", NegativeIndices, lambda b, s: (torch.randn(b, s),), {"x": {0: B, 1: S}}),
    ("position_ids_from_mask", PositionIdsFromMask, lambda b, s: (torch.randint(0, 4, (b, s)),), {"ids": {0: B, 1: S}}),
    ("channels_last_pool", ChannelsLastPool, lambda b, s: (torch.randn(b, s, s + 1, 8),),
     {"x": {0: B, 1: S, 2: Dim("w", min=3, max=129)}}),
    ("slice_assignments", SliceAssignments, lambda b, s: (torch.randn(b + 5, 8),), {"x": {0: Dim("rows", min=6, max=80)}}),
    ("split_with_trailing_unit", SplitWithTrailingUnit, lambda b, s: (torch.randn(2 * (b + 1), 8, 1),),
     {"x": {0: 2 * Dim("n", min=2, max=64)}}),
    ("ceil_mode_pools", CeilModePools, lambda b, s: (torch.randn(b, 3, s + 5, s + 6),),
     {"x": {0: B, 2: Dim("h", min=5, max=128), 3: Dim("w", min=6, max=128)}}),
    ("pad_ids_to_windows", PadIdsToWindows, lambda b, s: (torch.randint(0, 50, (b, s + 5)),), {"ids": {0: B, 1: Dim("n", min=5, max=64)}}),
    ("adaptive_pools", AdaptivePools, lambda b, s: (torch.randn(b, 3, s + 5, s + 6),),
     {"x": {0: B, 2: Dim("h", min=5, max=128), 3: Dim("w", min=6, max=128)}}),
    ("adaptive_max_pools", AdaptiveMaxPools, lambda b, s: (torch.randn(b, 3, s + 5, s + 6),),
     {"x": {0: B, 2: Dim("h", min=5, max=128), 3: Dim("w", min=6, max=128)}}),
    ("pad_to_windows", PadToWindows, lambda b, s: (torch.randn(b, s + 5, 3),), {"x": {0: B, 1: Dim("n", min=5, max=64)}}),
    ("embedding_bags", EmbeddingBags, _bags, {"ids": {0: Dim("n", min=2, max=2000)}, "offsets": {0: Dim("bags", min=2, max=100)},
                                              "weights": {0: Dim("n", min=2, max=2000)}}),
    ("scatter_reductions", ScatterReductions, _scatter, {"x": {0: Dim("nodes", min=3, max=66)}, "index": {0: Dim("edges", min=2, max=128)},
                                                        "src": {0: Dim("edges", min=2, max=128) + 1}}),
    ("resize_to_symbolic_sizes", ResizeToSymbolicSizes, lambda b, s: (torch.randn(b, 3, s + 2, s + 3), torch.randn(1, 1, 2 * s + 1, s + 7)),
     {"x": {0: B, 2: Dim("h", min=3, max=64), 3: Dim("w", min=4, max=64)},
      "like": {2: Dim("H", min=3, max=128), 3: Dim("W", min=8, max=128)}}),
    ("larger_and_smaller_sizes", LargerAndSmallerSizes, lambda b, s: (torch.randn(b, s + 1),), {"x": {0: B, 1: Dim("n", min=2, max=16)}}),
    ("complex_rotary", ComplexRotary, lambda b, s: (torch.randn(b, s, 3, 8),), {"x": {0: B, 1: S}}),
    ("weights_in_a_list", WeightsInAList, lambda b, s: (torch.randn(b, 8),), {"x": {0: B}}),
    ("clamp_by_tensors", ClampByTensors, lambda b, s: (torch.randn(b, s), torch.randn(s)), {"x": {0: B, 1: S}, "lo": {0: S}}),
    ("concat_independent_dims", ConcatIndependent, lambda b, s: (torch.randn(3, b), torch.randn(3, s)),
     {"a": {1: Dim("n", min=1, max=64)}, "b": {1: Dim("m", min=1, max=64)}}),
]


@pytest.mark.parametrize("name, make, inputs, dynamic", MODELS, ids=[m[0] for m in MODELS])
def test_model_matches_eager(name, make, inputs, dynamic):
    model = make().eval()
    compiled = disc.compile(model, inputs(2, 4), dynamic_shapes=dynamic)
    for b, s in [(1, 2), (3, 5), (7, 12)]:
        args = inputs(b, s)
        with torch.no_grad():
            want = model(*args)
        got = compiled(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert isinstance(g, torch.Tensor) and g.shape == w.shape, (name, b, s)
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=f"{name} at batch={b} seq={s}")
    assert compiled.compile_count == 1


def test_dim_range_is_a_guard():
    compiled = disc.compile(MLP().eval(), (torch.randn(4, 16),), dynamic_shapes={"x": {0: Dim("b", min=2, max=8)}})
    with pytest.raises(disc.ShapeError, match=r"'b <= 8' \(torch.export\) violated: b = 9 \(b is argument 'x' dim 0\)"):
        compiled(torch.randn(9, 16))
    with pytest.raises(disc.ShapeError, match=r"'b >= 2' \(torch.export\) violated: b = 1"):
        compiled(torch.randn(1, 16))


def test_derived_dims_are_checked_on_entry():
    """`2 * Dim("h")`: a size that is no whole multiple is a ShapeError (the variable is not
    silently its floor division), as is one whose variable breaks the range."""
    compiled = disc.compile(CNN().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {2: 2 * Dim("h", min=2, max=64), 3: 2 * Dim("w", min=2, max=64)}})
    assert compiled(torch.randn(2, 3, 6, 10)).shape == (2, 4)
    with pytest.raises(disc.ShapeError, match=r"argument 'x' dim 2 is 7, which is not 2\*h for any whole h"):
        compiled(torch.randn(2, 3, 7, 8))
    with pytest.raises(disc.ShapeError, match=r"'2\*h >= 4' \(torch.export\) violated: h = 1"):
        compiled(torch.randn(2, 3, 2, 8))


class PairRows(torch.nn.Module):
    def forward(self, x):
        return x.reshape(-1, 2, x.shape[1]).sum(1)


def test_guards_torch_export_cannot_prove_are_checked_on_entry():
    """The rows pair up only for an even batch: torch.export's guard over the dim, which it cannot
    prove over the range (and the trace's others, such as the batch not being 2 or 3), is a
    run-time check, not a failed export."""
    compiled = disc.compile(PairRows(), (torch.randn(4, 8),), dynamic_shapes={"x": {0: Dim("b", min=2, max=64)}})
    for b in (4, 10, 64):
        x = torch.randn(b, 8)
        torch.testing.assert_close(compiled(x), PairRows()(x))
    with pytest.raises(disc.ShapeError, match=r"\(torch.export\) violated: b = 5 \(b is argument 'x' dim 0\)"):
        compiled(torch.randn(5, 8))


class StemAndPools(torch.nn.Module):
    """GoogLeNet's stem: torch.export's solver for named dims fails on its guards (an internal
    assertion while it words the suggested fixes)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.layers = nn.Sequential(nn.Conv2d(3, 4, 7, stride=2, padding=3), nn.MaxPool2d(3, 2, ceil_mode=True), nn.Conv2d(4, 4, 1),
                                    nn.MaxPool2d(3, 2, ceil_mode=True), nn.MaxPool2d(3, 2, ceil_mode=True), nn.MaxPool2d(2, 2, ceil_mode=True))

    def forward(self, x):
        return self.layers(x)


class PadToBlocks(torch.nn.Module):
    def forward(self, x):
        pad = (-x.shape[1]) % 4  # LongT5's padding to whole blocks
        return torch.nn.functional.pad(x, (0, pad)).reshape(x.shape[0], -1, 4).sum(-1)


def test_guards_divide_and_take_remainders_as_python_does():
    """torch's guards over the padding (-s) % 4 are checked with Python's floor division and modulo
    (truncating ones refused every length but multiples of 4, the example's 7 too)."""
    compiled = disc.compile(PadToBlocks(), (torch.randn(2, 7),), dynamic_shapes=({1: Dim.DYNAMIC},))
    for n in (7, 8, 13, 30):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x), PadToBlocks()(x))


class StreamsAndClassToken(torch.nn.Module):
    """ProphetNet's streams, a concatenation chunked back (torch's solver cannot express its guard
    over a named dim: the export is tried again with a hint), and CvT's class token split from the
    patches (`split` into parts of symbolic sizes)."""

    def forward(self, x):
        a, b, c = torch.cat([x, 2 * x, 3 * x], 1).chunk(3, dim=1)
        cls, patches = torch.split(x, [1, x.shape[1] - 1], 1)
        return a + b * c, patches * 2 + cls


class RelativeWindow(torch.nn.Module):
    """DeBERTa's relative embeddings cut to a span computed as a tensor (a slice at bounds read
    from the data, whose storage offset torch.export asserts is not negative)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Parameter(torch.randn(20, 8))

    def forward(self, x):
        span = torch.clamp(torch.tensor(x.shape[1]), max=10)
        return x + self.emb[10 - span: 10 + span].sum(0)


@pytest.mark.parametrize("model", [StreamsAndClassToken, RelativeWindow])
def test_sizes_split_and_sliced_at_run_time(model):
    m = model().eval()
    compiled = disc.compile(m, (torch.randn(2, 9, 8),), dynamic_shapes=({1: Dim("n", min=2, max=60)},))
    for n in (3, 9, 20):
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(compiled(x), m(x))


def test_an_export_torch_cannot_solve_for_named_dims_keeps_their_names_and_ranges():
    model = StemAndPools().eval()
    compiled = disc.compile(model, (torch.randn(2, 3, 96, 80),),
                            dynamic_shapes={"x": {0: Dim("n", max=8), 2: Dim("h", min=64, max=512), 3: Dim("w", min=64, max=512)}})
    for n, h, w in [(1, 64, 64), (3, 97, 130), (2, 200, 71)]:
        x = torch.randn(n, 3, h, w)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(disc.ShapeError, match=r"'w <= 512' \(torch.export\) violated: w = 513"):
        compiled(torch.randn(1, 3, 64, 513))


def test_example_inputs_that_are_one_tensor_stay_separate_arguments():
    """torch.export binds the uses of aliasing inputs to the last one; the frontend copies them first."""
    class Model(torch.nn.Module):
        def forward(self, a, b):
            return a * 2 + b.sum(dim=0)

    x = torch.randn(3, 4)
    compiled = disc.compile(Model().eval(), (x, x), dynamic_shapes={"a": {0: Dim("n")}, "b": {0: Dim("m")}})
    a, b = torch.randn(5, 4), torch.randn(2, 4)
    torch.testing.assert_close(compiled(a, b), a * 2 + b.sum(dim=0))


def test_example_inputs_may_be_given_one_by_one():
    """`disc.compile(model, x, mask)` is `disc.compile(model, (x, mask))`."""
    class Model(torch.nn.Module):
        def forward(self, x, mask):
            return x.masked_fill(mask, 0.0).sum(-1)

    n = Dim("n")
    compiled = disc.compile(Model().eval(), torch.randn(3, 4), torch.rand(3, 4) > 0.5, dynamic_shapes=({0: n}, {0: n}))
    x, mask = torch.randn(6, 4), torch.rand(6, 4) > 0.5
    torch.testing.assert_close(compiled(x, mask), Model()(x, mask))


def test_an_expanded_example_input_compiles_for_row_major_arguments():
    """Position ids made by `arange(s)[None].expand(b, s)` (zero strides): exported as a copy, or
    their strides became symbols the export constrained and the compiler could not name."""
    class Model(torch.nn.Module):
        def forward(self, x, pos):
            return x * pos[..., None].float()

    s = Dim("s")
    compiled = disc.compile(Model(), (torch.randn(2, 5, 3), torch.arange(5)[None].expand(2, 5)), dynamic_shapes={"x": {1: s}, "pos": {1: s}})
    for n in (1, 9):
        x, pos = torch.randn(2, n, 3), torch.arange(n)[None].expand(2, n)
        torch.testing.assert_close(compiled(x, pos), Model()(x, pos))


def test_arguments_that_are_not_tensors_are_fixed_and_checked_on_every_call(tmp_path):
    """torch.export fixes a flag, a number, a string or None at its example value: the compiled
    function takes them where the model does (positional or keyword, nested), and a call with
    another value is a ShapeError naming the argument, loaded from an artifact too."""
    class Model(torch.nn.Module):
        def forward(self, x, pair, scale=1.0, none=None, mode="add", flag=False):
            y = x * scale + (pair[0] if mode == "add" else -pair[0])
            return (y, y * pair[1]) if flag else y

    x, pair = torch.randn(3, 4), (torch.randn(3, 4), 7)
    compiled = disc.compile(Model(), {"x": x, "pair": pair, "scale": 3.0, "none": None, "mode": "sub", "flag": True},
                            dynamic_shapes={"x": {0: Dim("n")}, "pair": ({0: Dim("n")}, None), "scale": None, "none": None, "mode": None,
                                            "flag": None})
    assert [a.name for a in compiled.signature.args] == ["x", "pair_0"]
    call = {"x": torch.randn(5, 4), "pair": (torch.randn(5, 4), 7), "scale": 3.0, "none": None, "mode": "sub", "flag": True}
    torch.testing.assert_close(compiled(**call), Model()(**call))
    for name, other in [("scale", 2.0), ("mode", "add"), ("flag", 1), ("none", 0)]:
        with pytest.raises(disc.ShapeError, match=f"argument '{name}' is {other!r}; this function was compiled for"):
            compiled(**{**call, name: other})
    with pytest.raises(disc.ShapeError, match="argument 'pair_1' is 8"):
        compiled(**{**call, "pair": (call["pair"][0], 8)})
    compiled.save(tmp_path / "m.disc")  # loaded: the arguments as compiled, or the flat ones; the fixed ones still checked
    loaded = disc.load(tmp_path / "m.disc")
    flat = [call["x"], call["pair"][0], 7, 3.0, None, "sub", True]
    torch.testing.assert_close(loaded(*flat), tuple(Model()(**call)))
    torch.testing.assert_close(loaded(**call), compiled(**call))
    with pytest.raises(disc.ShapeError, match="argument 'mode' is 'add'"):
        loaded(*flat[:5], "add", True)


def test_a_function_of_torch_tensors_compiles_like_a_module():
    """A plain function (or lambda) with example tensors goes through torch.export as a module with
    the function's signature: dynamic_shapes by parameter name or by position."""
    def fn(x, w, *, scale=2.0):
        return torch.sin(x) @ w * scale

    x, w = torch.randn(3, 4), torch.randn(4, 2)
    by_name = disc.compile(fn, (x, w), dynamic_shapes={"x": {0: Dim("n")}, "w": None})
    by_position = disc.compile(lambda x, w: fn(x, w), (x, w), dynamic_shapes=({0: Dim("n")}, None))
    assert [a.shape for a in by_name.signature.args] == [("n", 4), (4, 2)]
    x = torch.randn(7, 4)
    torch.testing.assert_close(by_name(x, w), fn(x, w))
    torch.testing.assert_close(by_position(x, w), fn(x, w))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialiased_resizing_to_sizes_known_at_run_time(mode):
    """`interpolate(antialias=True)` (timm's position tables resized to the image, torchvision's
    resizing) to the size of another input: shrinking and growing, corners aligned or not, match
    torch; a non-integral factor of a dynamic size is refused by name."""
    import torch.nn.functional as F

    for corners in (False, True):
        class Resize(torch.nn.Module):
            def forward(self, x, like):
                return F.interpolate(x, size=like.shape[-2:], mode=mode, antialias=True, align_corners=corners)

        compiled = disc.compile(Resize(), (torch.randn(2, 3, 10, 12), torch.randn(1, 1, 16, 7)),
                                dynamic_shapes={"x": {0: Dim("b"), 2: Dim("h", min=2), 3: Dim("w", min=2)},
                                                "like": {2: Dim("oh", min=2), 3: Dim("ow", min=2)}})
        for h, w, oh, ow in [(10, 12, 16, 7), (14, 14, 5, 30), (32, 20, 3, 2)]:
            x, like = torch.randn(2, 3, h, w), torch.randn(1, 1, oh, ow)
            torch.testing.assert_close(compiled(x, like), Resize()(x, like), rtol=1e-5, atol=1e-5)

    class ByFactor(torch.nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=0.37, mode=mode, antialias=True)
    with pytest.raises(disc.UnsupportedOpError, match="non-integral factor 0.37"):
        disc.compile(ByFactor(), (torch.randn(2, 3, 40, 30),), dynamic_shapes={"x": {2: Dim("h", min=8)}})


def test_fourier_transforms_of_real_tensors_become_products():
    """`torch.fft.fftn` of a real tensor (FNet's token mixing), over some dims or all, each norm,
    its real and imaginary parts read: discrete Fourier transforms by cosine and sine matrices
    computed from the run-time sizes."""
    class Mixing(torch.nn.Module):
        def forward(self, x):
            return (torch.fft.fftn(x, dim=(1, 2)).real, torch.fft.fftn(x, dim=(-1,), norm="ortho").imag,
                    torch.fft.fftn(x, norm="forward").real + torch.fft.fftn(x, norm="forward").imag)

    compiled = disc.compile(Mixing(), (torch.randn(2, 6, 8),), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s"), 2: Dim("h")}})
    for shape in [(1, 5, 8), (3, 17, 12), (2, 64, 3)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x), Mixing()(x), rtol=1e-4, atol=1e-4)


class LongConvolution(torch.nn.Module):
    """Hyena's FFT convolution (rfft of input and filter at twice the length, their product,
    irfft, the first half), a correlation with a conjugate, complex transforms both ways (ortho),
    2-d real transforms and a spectrum's magnitudes."""

    def forward(self, u, k):
        n = u.shape[-1]
        spectrum = torch.fft.rfft(u, n=2 * n)
        filt = torch.fft.rfft(k, n=2 * n) / (2 * n)
        return (torch.fft.irfft(spectrum * filt, n=2 * n)[..., :n], torch.fft.irfft(spectrum * filt.conj(), n=2 * n),
                torch.fft.ifft(torch.fft.fft(u, norm="ortho"), norm="ortho").real, torch.fft.rfft(u).abs(),
                torch.fft.irfft2(torch.fft.rfft2(u, norm="forward"), s=u.shape[-2:], norm="forward"))


def test_fourier_transforms_both_ways_through_complex_spectra():
    """rfft / irfft / fft / ifft / rfft2 / irfft2 with every norm, products, quotients, conjugates
    and magnitudes of their spectra: the complex values carried as (real, imaginary) pairs, the
    transforms as products with cosine and sine matrices of the run-time sizes (odd, even, prime)."""
    n = Dim("n")
    compiled = disc.compile(LongConvolution(), (torch.randn(2, 3, 16), torch.randn(3, 16)), dynamic_shapes={"u": {2: n}, "k": {1: n}})
    for length in (16, 7, 33):
        u, k = torch.randn(2, 3, length), torch.randn(3, length)
        torch.testing.assert_close(compiled(u, k), LongConvolution()(u, k), rtol=1e-4, atol=1e-4)


def test_unbounded_dim_compiles():
    """`Dim("b")` without bounds: torch.export's upper bound is its `int_oo` (which says it is
    finite): no range guard, any batch runs."""
    model = MLP().eval()
    compiled = disc.compile(model, (torch.randn(4, 16),), dynamic_shapes={"x": {0: Dim("b")}})
    for b in (1, 3, 300):
        x = torch.randn(b, 16)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


class Tagger(torch.nn.Module):
    """A sequence tagger: embeddings, a recurrent layer, a classifier; `layer` given its initial
    states by the caller (`states`) or starting from zeros."""

    def __init__(self, layer: torch.nn.Module, states: bool):
        super().__init__()
        self.emb, self.layer, self.states = torch.nn.Embedding(50, 8), layer, states
        self.out = torch.nn.Linear(layer.hidden_size * (2 if layer.bidirectional else 1) if not getattr(layer, "proj_size", 0)
                                   else layer.proj_size * (2 if layer.bidirectional else 1), 5)

    def forward(self, tokens, *states):
        x = self.emb(tokens)
        if not self.layer.batch_first:
            x = x.transpose(0, 1)
        y, last = self.layer(x, (states if len(states) > 1 else states[0]) if states else None)
        if not self.layer.batch_first:
            y = y.transpose(0, 1)
        return (self.out(y).log_softmax(-1), *(last if isinstance(last, tuple) else (last,)))


RECURRENT = [
    ("lstm", lambda: torch.nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True), False),
    ("lstm_projected_given_states", lambda: torch.nn.LSTM(8, 16, num_layers=2, proj_size=6, bidirectional=True), True),
    ("gru_without_biases", lambda: torch.nn.GRU(8, 12, bias=False, bidirectional=True), False),
    ("gru_given_state", lambda: torch.nn.GRU(8, 12, num_layers=2, batch_first=True), True),
    ("rnn_relu", lambda: torch.nn.RNN(8, 12, nonlinearity="relu", batch_first=True), False),
    ("rnn_tanh", lambda: torch.nn.RNN(8, 12, num_layers=3), True),
]


@pytest.mark.parametrize("name, make, states", RECURRENT, ids=[r[0] for r in RECURRENT])
def test_recurrent_layers_run_over_sequences_of_any_length(name, make, states):
    """nn.LSTM, nn.GRU and nn.RNN, which torch.export unrolls over the sequence (a fixed length),
    compiled once for any batch and sequence length (a loop over the sequence); several layers,
    both directions, LSTM's projection, no biases, initial states from the caller or zeros; the
    output and every final state as eager's, from a sequence of 1 on. torch's own `_VF` calls
    are its own again after the export."""
    torch.manual_seed(1)
    layer = make().eval()
    model = Tagger(layer, states).eval()
    lstm = isinstance(layer, torch.nn.LSTM)
    size = layer.proj_size or layer.hidden_size if lstm else layer.hidden_size
    count = layer.num_layers * (2 if layer.bidirectional else 1)

    def inputs(b, s):
        given = [torch.randn(count, b, size)] + ([torch.randn(count, b, layer.hidden_size)] if lstm else []) if states else []
        return (torch.randint(0, 50, (b, s)), *given)
    batch = Dim("batch", max=64)
    spec = {"tokens": {0: batch, 1: Dim("seq", max=1000)}, **({"states": ({1: batch},) * (1 + lstm)} if states else {})}
    compiled = disc.compile(model, inputs(2, 7), dynamic_shapes=spec)
    assert not {"lstm", "gru", "rnn_tanh", "rnn_relu"} & set(vars(torch._VF))
    for b, s in [(1, 1), (3, 17), (5, 4)]:
        args = inputs(b, s)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-5, atol=1e-5)


class Arithmetic(torch.nn.Module):
    """Remainders with either sign (Python's `%`: the divisor's sign), by tensors and numbers,
    comparisons of constant float tensors with integer numbers, and rolls by more than a dim's size."""

    def forward(self, a, b, f, g):
        half = torch.full((), 2.5)
        flags = torch.stack([half < 0, half > 0, half >= 3, half <= 2, torch.full((2,), -2.5)[0] < -2, torch.ones(()) > 0])
        return (a % b, torch.remainder(a, -3), a % 4, f % g, torch.remainder(f, 2.5), torch.remainder(f, -1.5), flags,
                torch.where(f > 0, f, half), torch.roll(f, 3, dims=1), torch.roll(a, (-1, 5), dims=(0, 1)), torch.roll(f, -7))


def test_remainders_and_comparisons_with_numbers_as_torch_computes_them():
    """`%` takes the divisor's sign in torch (torch-mlir's lowering is C's, the dividend's: -7 % 3
    was -1, not 2); a constant float tensor compared with an integer number compares with it as a
    float (torch-mlir's folder had `torch.full((), 2.5) < 0` true); a roll takes its shift modulo
    the dim's size (torch-mlir's slices did not: a dim of 2 rolled by 3 came out wrong)."""
    torch.manual_seed(3)

    def inputs(n):
        b = torch.randint(1, 6, (2, n)) * (torch.randint(0, 2, (2, n)) * 2 - 1)
        f, g = torch.randn(2, n) * 5, torch.randn(2, n)
        f[0, 0], f[0, 1], g[0, 1] = -0.0, 5.0, -2.5  # a zero of either sign, a multiple of the divisor
        return torch.randint(-20, 20, (2, n)), b, f, g
    n = Dim("n", max=100)
    model = Arithmetic()
    compiled = disc.compile(model, inputs(6), dynamic_shapes={"a": {1: n}, "b": {1: n}, "f": {1: n}, "g": {1: n}})
    for size in (2, 3, 13):
        args = inputs(size)
        for got, want in zip(compiled(*args), model(*args)):
            torch.testing.assert_close(got, want)


class TensorOps(torch.nn.Module):
    """Ops torch-mlir does not convert, decomposed or rewritten by the frontend: shifts and bitwise
    ops with numbers, cumulative products, maxima and minima (NaN, ties), isclose (infinities and
    NaN), k-th values, medians (NaN rows), bucketize and searchsorted (values on boundaries),
    addmv, hypot, copysign (-0.0), diagonals (negative dims, offsets), bilinear layers, RReLU in
    inference, fmod by a float, variances over dynamic dims (torch-mlir asserted the correction
    against them), max pooling with indices and no stride, masked scatters, and reflection and
    replication padding (torch's decomposition subtracts a tensor from a size)."""

    def __init__(self):
        super().__init__()
        self.bilinear = torch.nn.Bilinear(2, 2, 3)

    def forward(self, x, y, i, mask):
        boundaries = torch.tensor([-1.0, -0.25, 0.0, 0.5, 2.0])
        pad = torch.nn.functional.pad
        return (torch.median(y, dim=1), torch.median(y[:, 1:]), torch.bucketize(y, boundaries), torch.bucketize(y, boundaries, right=True),
                torch.searchsorted(torch.sort(y.nan_to_num(), 1)[0], x, side="right"), torch.addmv(x[:, 0], y, x[0], beta=0.5, alpha=2),
                x.std(1), torch.var_mean(y.nan_to_num(), 0), torch.nn.functional.max_pool2d(i[None].float(), (1, 2), return_indices=True),
                torch.hypot(x, y), torch.nn.functional.rrelu(y, 0.1, 0.3), torch.fmod(y, 0.7), torch.copysign(x, y), torch.copysign(y, -0.0),
                y.diagonal(), x.diagonal(-1, dim1=-1, dim2=0), self.bilinear(x[:, :2], y[:, 1:3]), torch.fmod(i, 3),
                i << 2, i >> 1, i & 6, i ^ 5, mask | True, torch.cumprod(x, dim=1), *torch.cummax(y, 1), *torch.cummin(i, 0),
                torch.isclose(x, y, atol=0.5), torch.isclose(x, y, equal_nan=True),
                *torch.kthvalue(y, 2, dim=1), torch.kthvalue(x, 1, dim=0, keepdim=True)[0], x.masked_scatter(mask, y * 10),
                pad(y, (1, 2), mode="reflect"), pad(y[None], (2, 1, 1, 1), mode="reflect"), pad(y, (2, 3), mode="replicate"))


def test_tensor_ops_torch_mlir_does_not_convert():
    torch.manual_seed(4)

    def inputs(b, s):
        x, y = torch.rand(b, s) + 0.5, torch.randn(b, s)
        y[0, :2] = x[0, :2]  # equal, and their k-th values tie
        y[-1, 2] = 0.5  # on a boundary
        x[0, 0], y[0, 0], x[-1, -1], y[-1, -1] = float("inf"), float("inf"), float("nan"), float("nan")
        return x, y, torch.randint(-50, 50, (b, s)), torch.rand(b, s) > 0.5
    b, s = Dim("b", max=64), Dim("s", max=64)
    model = TensorOps()
    compiled = disc.compile(model, inputs(3, 6), dynamic_shapes={"x": {0: b, 1: s}, "y": {0: b, 1: s}, "i": {0: b, 1: s}, "mask": {0: b, 1: s}})
    for shape in [(2, 7), (4, 5), (5, 13)]:  # (a pooled dim of 2 or 3: torch.export's guard on its one window)
        args = inputs(*shape)
        for got, want in zip(compiled(*args), model(*args)):
            torch.testing.assert_close(got, want, equal_nan=True)
    with pytest.raises(disc.ShapeError, match="expected 4 array arguments, got 5"):  # not dropped
        compiled(*args, args[0])


class Histogram(torch.nn.Module):
    def __init__(self, bins: int, lo: float, hi: float):
        super().__init__()
        self.bins, self.lo, self.hi = bins, lo, hi

    def forward(self, x):
        return torch.histc(x * 3, bins=self.bins, min=self.lo, max=self.hi)


def test_histograms_count_like_pytorch():
    """`torch.histc` (mixture-of-experts layers count tokens per expert with it), which
    torch-mlir cannot convert: the same counts as eager, exactly, over a dynamic number of
    elements: given bounds, the data's own extremes (both 0), values on the bins' edges and at
    `max`, values outside the bounds, and data all equal (the range widened)."""
    for bins, lo, hi in [(4, 0.0, 3.0), (10, -1.0, 2.5), (7, 0.0, 0.0)]:
        model = Histogram(bins, lo, hi).eval()
        compiled = disc.compile(model, (torch.randn(40),), dynamic_shapes={"x": {0: Dim("n")}})
        for x in [torch.randn(1), torch.randn(300), torch.floor(torch.randn(1001) * 4) / 4, torch.full((6,), 0.5)]:
            torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


class GroupedLinear(torch.nn.Module):
    """The grouped GEMM of transformers' mixture-of-experts layers over offsets the caller gives:
    `transformers::grouped_mm_fallback` (float32), with the experts' weights as transformers keeps
    them ([experts, out, in], read transposed) or not; or `torch.nn.functional.grouped_mm`
    (`aten._grouped_mm`, bfloat16)."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        shape = (3, 16, 8) if form == "plain" else (3, 8, 16)
        self.w = torch.nn.Parameter(torch.randn(shape).to(torch.bfloat16 if form == "bf16" else torch.float32))

    def forward(self, x, offs):
        if self.form == "bf16":
            return torch.nn.functional.grouped_mm(x, self.w.transpose(-2, -1), offs=offs)
        w = self.w if self.form == "plain" else self.w.transpose(-2, -1)
        return torch.ops.transformers.grouped_mm_fallback(x, w, offs)


@pytest.mark.parametrize("form", ["plain", "transposed", "bf16"])
def test_the_grouped_gemm_of_mixture_of_experts_layers_runs_on_the_ral(form):
    """Each group's rows times its weights (`disc_ral_grouped_gemm_f32`, the weights read through
    their transpose, no copy), empty groups, rows past the last offset zero (transformers' own
    fallback zeroes them too; torch's bfloat16 kernel leaves them unset, so those are compared
    where it writes), over a dynamic number of rows; offsets that decrease or pass the rows fail
    the call with the offending offset named, before anything is written (on a GPU: test_gpu.py)."""
    pytest.importorskip("transformers.integrations.moe", reason="transformers registers its grouped GEMM there")
    model = GroupedLinear(form).eval()
    dtype = torch.bfloat16 if form == "bf16" else torch.float32
    rows = Dim("rows", min=1)
    compiled = disc.compile(model, (torch.randn(6, 16, dtype=dtype), torch.tensor([2, 2, 6], dtype=torch.int32)),
                            dynamic_shapes={"x": {0: rows}, "offs": None})
    text = compiled.llvm_ir
    assert "disc_ral_grouped_gemm_f32" in text and "disc_ral_gemm_f32" not in text
    if form != "bf16":  # the one loop widens the offsets to i64: the weights are not copied
        assert [k.ops for k in compiled.kernels] == [("arith.extsi",)], compiled.kernels
    g = torch.Generator().manual_seed(3)
    for n, offs in [(6, [2, 2, 6]), (1, [0, 1, 1]), (9, [0, 4, 6]), (5, [0, 0, 0]), (13, [13, 13, 13])]:
        x = torch.randn(n, 16, generator=g).to(dtype)
        offs = torch.tensor(offs, dtype=torch.int32)
        with torch.no_grad():
            got, want = compiled(x, offs), model(x, offs)
        written = int(offs[-1]) if form == "bf16" else n
        torch.testing.assert_close(got[:written], want[:written], rtol=2e-2 if form == "bf16" else 1e-5, atol=0.1 if form == "bf16" else 1e-5)
        assert not got[written:].any()
    for n, offs, message in [(6, [3, 2, 6], "offset 1 is 2, after 3"), (6, [2, 4, 7], "offset 2 is 7, after 4.*input's 6 rows"),
                             (4, [-1, 2, 4], "offset 0 is -1, after 0")]:
        with pytest.raises(disc.RuntimeFailure, match=message):
            compiled(torch.randn(n, 16).to(dtype), torch.tensor(offs, dtype=torch.int32))


class BatchedGroupedMm(torch.nn.Module):
    def forward(self, a, b):
        return torch.nn.functional.grouped_mm(a, b)


def test_a_grouped_mm_without_offsets_is_refused_naming_what_is_compiled():
    a, b = (torch.randn(3, 16, 16).bfloat16() for _ in range(2))
    with pytest.raises(disc.UnsupportedOpError, match=r"aten._grouped_mm is compiled for a 2-d input, 3-d weights and offsets.*"
                                                      r"got input 3-d, weight 3-d, offs none"):
        disc.compile(BatchedGroupedMm(), (a, b))


@torch.library.custom_op("disc_test::scaled_rows", mutates_args=())
def _scaled_rows(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale


@_scaled_rows.register_fake
def _(x, scale):
    return torch.empty_like(x)


class LibraryOp(torch.nn.Module):
    """A layer that calls an operator its library defines (as torchvision's detection models call
    `torchvision::nms`)."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(_scaled_rows(self.l(x), 2.0))


def test_an_op_torch_mlir_cannot_convert_is_refused_by_name():
    """torch-mlir's conversion failure names the op: an UnsupportedOpError saying which."""
    model = type("Mode", (torch.nn.Module,), {"forward": lambda self, x: torch.mode(x, 1)[0]})()
    with pytest.raises(disc.UnsupportedOpError, match="torch-mlir cannot convert aten.mode"):
        disc.compile(model, (torch.randn(3, 6),), dynamic_shapes={"x": {1: Dim("s", max=64)}})


def test_an_operator_a_library_defines_is_refused_by_name():
    """An operator defined outside ATen (`torch.library`) has no conversion, and the compiler's
    process could not load the program that calls it: UnsupportedOpError names it and where the
    model calls it, before anything is sent to the compiler; through torch.compile the graph runs
    in PyTorch instead, with a warning naming the op."""
    model = LibraryOp().eval()
    x = torch.randn(3, 8)
    with pytest.raises(disc.UnsupportedOpError, match=r"outside PyTorch's ATen.*disc_test::scaled_rows \(File .*, in forward: .*\)"):
        disc.compile(model, (x,), dynamic_shapes={"x": {0: Dim("b")}})
    compiled = torch.compile(model, backend="disc_stablehlo", dynamic=True)
    with pytest.warns(UserWarning, match="disc_test::scaled_rows"), torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


class NoisyLatent(torch.nn.Module):
    def forward(self, mean):
        return mean + torch.randn_like(mean) * 0.1


def test_random_sampling_is_refused_by_name():
    with pytest.raises(disc.UnsupportedOpError, match=r"samples random numbers.*randn_like \(File .*torch.randn_like\(mean\)"):
        disc.compile(NoisyLatent().eval(), (torch.randn(2, 4),), dynamic_shapes={"mean": {0: Dim("b")}})


class BlockWithBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.ln = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.LayerNorm(8)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        if h.sum().item() > 1e9:  # data-dependent Python branch: a graph break
            h = h * 0
        return self.ln(self.b(h) + x)


def test_torch_compile_backend_compiles_each_graph_once(monkeypatch):
    import disc_stablehlo.compiler as compiler

    calls = []
    real = compiler.compile_source
    monkeypatch.setattr(compiler, "compile_source", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch._dynamo.reset()
    model = BlockWithBreak().eval()
    compiled = torch.compile(model, backend="disc_stablehlo", dynamic=True)
    with torch.no_grad():
        for b, s in [(2, 3), (4, 7), (3, 11)]:
            x = torch.randn(b, s, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(calls) == 2  # the graphs on either side of the break, each compiled once for all shapes


class SliceAfterBreak(torch.nn.Module):
    def forward(self, x, n):
        y = x.relu()
        torch._dynamo.graph_break()
        return y[:, :n] * 2  # n: a size no input tensor of this graph has


def test_a_graph_given_a_size_no_tensor_has_compiles_with_the_size_carried(monkeypatch):
    """A graph input that is a size but no dim of the graph's tensors (an int argument, a length
    computed before a graph break): carried by an empty tensor of that many rows, not a fallback."""
    import disc_stablehlo.compiler as compiler

    calls = []
    real = compiler.compile_source
    monkeypatch.setattr(compiler, "compile_source", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch._dynamo.reset()
    model = SliceAfterBreak()
    compiled = torch.compile(model, backend="disc_stablehlo", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no graph may fall back to PyTorch
        for b, s, n in [(2, 9, 3), (4, 7, 5), (3, 12, 2)]:
            x = torch.randn(b, s)
            torch.testing.assert_close(compiled(x, n), model(x, n))
    assert len(calls) == 2


def test_masked_attention_softmax_is_one_kernel():
    """A boolean mask's select, the row max, the exponentials, their sum and the division read the
    scores once, in one stitch kernel, and a row with every key masked gives zeros."""
    class Masked(torch.nn.Module):
        def forward(self, q, k, v, keep):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])

    s = Dim("s", min=2, max=64)
    compiled = disc.compile(Masked().eval(), (torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8),
                                              torch.ones(2, 4, dtype=torch.bool)),
                            dynamic_shapes={"q": {2: s}, "k": {2: s}, "v": {2: s}, "keep": {1: s}})
    [softmax] = [k for k in compiled.kernels if "math.exp" in k.ops]
    assert softmax.kind == "stitch fusion" and {"arith.select", "arith.maximumf", "arith.divf"} <= set(softmax.ops), softmax
    q, k, v = (torch.randn(2, 2, 9, 8) for _ in range(3))
    keep = torch.rand(2, 9) > 0.3
    keep[1] = False  # every key masked: zeros
    got = compiled(q, k, v, keep)
    torch.testing.assert_close(got, Masked()(q, k, v, keep), rtol=1e-5, atol=1e-5)
    assert not got[1].any()


def test_python_scalars_fold_into_the_kernels():
    """A Python scalar reaches StableHLO as a one-element f64 tensor converted to f32; folded, it
    no longer keeps the row max and its consumers in separate kernels."""
    class Clamped(torch.nn.Module):
        def forward(self, x):
            return torch.exp(x - x.amax(-1, keepdim=True).clamp_min(-1.5)) / 8.0

    compiled = disc.compile(Clamped(), (torch.randn(2, 3, 8),), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s")}})
    assert [k.kind for k in compiled.kernels] == ["stitch fusion"], compiled.kernels
    x = torch.randn(3, 5, 8) - 4
    torch.testing.assert_close(compiled(x), Clamped()(x))


def test_flattened_projection_keeps_its_activation_behind_the_gemm():
    """GPT-2's Conv1D: `x.view(-1, k)`, addmm, `view(*size_out)`, then GELU-tanh. torch-mlir
    computes the flattened dim as numel / k through a loop the analysis cannot read, so the
    reshape's element count says k * flat == k * b * s; the common factor cancels, the view back
    is a proven expand, and bias and GELU are one epilogue of the GEMM."""
    class Conv1D(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = torch.nn.Parameter(torch.randn(16, 48)), torch.nn.Parameter(torch.randn(48))

        def forward(self, x):
            y = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
            return torch.nn.functional.gelu(y.view(x.size()[:-1] + (48,)), approximate="tanh")

    model = Conv1D().eval()
    compiled = disc.compile(model, (torch.randn(2, 5, 16),), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s")}})
    [kernel] = compiled.kernels
    assert kernel.epilogue_of == "disc_ral_gemm_f32" and {"arith.addf", "math.tanh"} <= set(kernel.ops), kernel
    for b, s in [(1, 1), (3, 7), (4, 33)]:
        x = torch.randn(b, s, 16)
        torch.testing.assert_close(compiled(x), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_attention_heads_need_no_transpose_copies():
    """`scaled_dot_product_attention` as torch.export decomposes it: heads transposed, the
    queries scaled, no-op broadcasts and views between the transposes and the products, the
    context viewed and transposed back. The GEMMs read every head at its strides and write the
    context into [b, s, heads, dim]; no kernel copies."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(32, 32) for _ in range(4))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (p(x).view(b, s, 4, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
            ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.o(ctx.transpose(1, 2).reshape(b, s, 32))

    model = Attention().eval()
    compiled = disc.compile(model, (torch.randn(2, 5, 32),), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s")}})
    assert not any(k.kind == "copy" for k in compiled.kernels), compiled.kernels
    # the two products per head read q, k and v at their strides in [b, s, 4, 8] (a head 8 floats
    # on, a row 32) and write the context there too
    calls = gemm_call_args(compiled)
    scores, context = (c for c in calls if c[1] == "i64 4")
    assert scores[7:11] == ["i64 8", "i64 1", "i64 32", "i64 1"] and scores[13:17] == ["i64 8", "i64 1", "i64 1", "i64 32"], scores
    assert context[13:17] == ["i64 8", "i64 1", "i64 32", "i64 1"] and context[19:] == ["i64 8", "i64 32"], context
    for b, s in [(1, 1), (3, 7), (2, 20)]:
        x = torch.randn(b, s, 32)
        torch.testing.assert_close(compiled(x), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_sequence_first_attention_takes_queries_keys_and_values_without_copying_its_projection():
    """`nn.MultiheadAttention` (sequence first) unflattens its packed projection, transposes it,
    slices queries, keys and values out of the transpose and reshapes each into heads
    (`view(s, b * heads, 8)`, a merge and a split of dims). The slices take their parts of the
    projection itself and the reshapes are views: no kernel copies; one loop writes the heads of
    all three (the queries scaled), besides the bias, the softmax and the output's bias."""
    class SequenceFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = torch.nn.MultiheadAttention(32, 4)

        def forward(self, x):
            return self.attention(x, x, x, need_weights=False)[0]

    model = SequenceFirst().eval()
    compiled = disc.compile(model, (torch.randn(5, 2, 32),), dynamic_shapes={"x": {0: Dim("s"), 1: Dim("b")}})
    assert not any(k.kind == "copy" for k in compiled.kernels) and len(compiled.kernels) == 4, compiled.kernels
    for s, b in [(1, 1), (7, 3), (20, 2)]:
        x = torch.randn(s, b, 32)
        torch.testing.assert_close(compiled(x), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_grouped_query_attention_reads_shared_keys_and_values_without_repeating_them():
    """Grouped-query attention as `transformers` writes it: 2 key/value heads expanded to the 8
    query heads (`repeat_kv`: a size-1 dim broadcast to 4, merged into the heads). Both products
    read each key/value head once per group of 4 query heads (the GEMM's B group) instead of
    from a repeated copy: no kernel copies, and the context is written into [b, s, heads, dim]."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.o = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
            self.k, self.v = torch.nn.Linear(64, 16), torch.nn.Linear(64, 16)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, 8, 8).transpose(1, 2)
            k, v = (p(x).view(b, s, 2, 8).transpose(1, 2) for p in (self.k, self.v))
            k, v = (t[:, :, None].expand(b, 2, 4, s, 8).reshape(b, 8, s, 8) for t in (k, v))
            ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(ctx.transpose(1, 2).reshape(b, s, 64))

    model = Attention().eval()
    compiled = disc.compile(model, (torch.randn(2, 5, 64),), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s")}})
    assert not any(k.kind == "copy" for k in compiled.kernels), compiled.kernels
    calls = gemm_call_args(compiled)
    scores, context = (c for c in calls if c[1] == "i64 8")
    # keys and values in [b, s, 2, 8]: a key/value head 8 floats on, serving 4 query heads
    assert scores[13:17] == ["i64 8", "i64 4", "i64 1", "i64 16"], scores
    assert context[13:17] == ["i64 8", "i64 4", "i64 16", "i64 1"] and context[19:] == ["i64 8", "i64 64"], context
    for b, s in [(1, 1), (3, 7), (2, 20)]:
        x = torch.randn(b, s, 64)
        torch.testing.assert_close(compiled(x), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_rotary_positions_from_arange_need_no_run_time_broadcast_checks():
    """torch-mlir sizes `arange(s)` as ceil(s / 1.0) in f64, slices with bounds from dense
    constants, and builds `view(b, s, -1, 8)` from a shape whose -1 it computes in a loop: the
    analysis reads all three, so rotating q by cos/sin of the positions needs no broadcast
    check (and no speculative kernel version) at run time."""
    class Rotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.proj(x).view(b, s, -1, 8).transpose(1, 2)
            angles = torch.arange(s, dtype=torch.float32)[:, None] * torch.arange(1, 9, dtype=torch.float32)
            cos, sin = angles.cos()[None, None], angles.sin()[None, None]
            rotated = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
            return q * cos + rotated * sin

    model = Rotary().eval()
    compiled = disc.compile(model, (torch.randn(2, 5, 32),), dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s")}})
    report = compiled.shape_report()
    assert "checked at run time [" in report and "checked at run time [0" not in report, report
    assert not any("general" in k.version for k in compiled.kernels), compiled.kernels
    for b, s in [(1, 1), (3, 7), (2, 20)]:
        x = torch.randn(b, s, 32)
        torch.testing.assert_close(compiled(x), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_padding_mask_read_by_aranges_stays_a_plain_read():
    """`mask[arange(b)[:, None], arange(s)]` (transformers' vmap'd padding masks) keeps its
    indices as they are (no negative-index wrap: an arange from 0 counts up), so the analysis
    proves the gather reads in place and the masked softmax stays one kernel per branch."""

    class MaskedSoftmax(torch.nn.Module):
        def forward(self, scores, mask):
            b, s = mask.shape
            m = mask[torch.arange(b)[:, None], torch.arange(s)]
            return torch.softmax(torch.where(m[:, None, None, :], scores, -1e9), -1)

    model = MaskedSoftmax()
    b, s = Dim("batch", max=64), Dim("seq", max=128)
    compiled = disc.compile(model, (torch.randn(2, 2, 5, 5), torch.rand(2, 5) > 0.3),
                            dynamic_shapes={"scores": {0: b, 2: s, 3: s}, "mask": {0: b, 1: s}})
    assert {k.kind for k in compiled.kernels} == {"stitch fusion"}, compiled.kernels
    assert not any({"arith.cmpi", "arith.addi"} & set(k.ops) for k in compiled.kernels), compiled.kernels
    for bb, ss in [(1, 1), (3, 7)]:
        x, m = torch.randn(bb, 2, ss, ss), torch.rand(bb, ss) > 0.3
        torch.testing.assert_close(compiled(x, m), model(x, m))


def test_as_strided_of_a_transposed_view_reads_its_storage():
    """`as_strided` reads a tensor's storage, not its elements in order: of a transposed view in
    row-major strides it is the untransposed data, not the view (only a tensor laid out row-major
    is itself under such an as_strided)."""

    class StorageRead(torch.nn.Module):
        def forward(self, x):
            t = x.t()
            return torch.as_strided(t, t.shape, (t.shape[1], 1)) * 2

    model = StorageRead()
    x = torch.randn(3, 4)
    torch.testing.assert_close(disc.compile(model, (x,))(x), model(x))


def test_bfloat16_tensors_go_in_and_come_out_as_torch_tensors():
    """Tensors of a dtype numpy lacks (bfloat16) are read through integers of their width as the
    ml_dtypes type of the same name, and results of that dtype come back as torch tensors of it."""
    f = disc.compile("""func.func @main(%a: tensor<?xbf16>, %b: tensor<?xbf16>) -> tensor<?xbf16> {
      %0 = stablehlo.add %a, %b : tensor<?xbf16>
      return %0 : tensor<?xbf16>
    }""")
    x, y = torch.tensor([1.5, -2.0, 3.25]).bfloat16(), torch.tensor([0.5, 1.0, 0.125]).bfloat16()
    got = f(x, y)
    assert got.dtype == torch.bfloat16 and torch.equal(got, x + y), got
