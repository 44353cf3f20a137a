"""Models from `transformers` (BERT, GPT-2, a LLaMA-style decoder with grouped-query attention,
rotary embeddings and RMSNorm; Falcon, RoBERTa and Mixtral (mixture of experts) through `disc.compile` only, DINOv2 and ConvBERT
through the dynamo backend only) and `torchvision` (a ResNet, a ViT; a Swin through `disc.compile` only), at
small configs with random weights: each compiled once with dynamic dims through `disc.compile`
(torch.export) and through the dynamo backend, and checked against eager at three shapes
including batch 1."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="the model tests need torch (pip install disc_stablehlo[test])")
from torch.export import Dim  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import disc_stablehlo as disc  # noqa: E402
from library_models import DecoderStep, LastHiddenState, PixelFeatures, declare_torchvision_ops  # noqa: E402

declare_torchvision_ops()

transformers = pytest.importorskip("transformers", reason="the model tests need transformers (pip install disc_stablehlo[test])")
torchvision = pytest.importorskip("torchvision", reason="the model tests need torchvision (pip install disc_stablehlo[test])")

VOCAB = 512
TOL = dict(rtol=1e-4, atol=2e-5)


def _text(kind: str) -> torch.nn.Module:
    T = transformers
    common = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "bert":
        model = T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                         max_position_embeddings=128, **common))
    elif kind == "gpt2":
        model = T.GPT2Model(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, use_cache=False, **common))
    elif kind == "falcon":  # multi-query attention: the one key/value head read as fused_qkv[..., [-2], :] (a negative index)
        model = T.FalconModel(T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, use_cache=False, **common))
    elif kind == "convbert":  # span-based dynamic convolution beside attention; under dynamo its mask dims are symbols of their own
        model = T.ConvBertModel(T.ConvBertConfig(hidden_size=32, embedding_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=64, max_position_embeddings=128, **common))
    elif kind == "roberta":  # position ids: the cumulative sum of the padding mask, times the mask
        model = T.RobertaModel(T.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                               max_position_embeddings=130, **common))
    elif kind == "mixtral":  # mixture of experts: tokens sorted by expert, counted by histc, grouped GEMMs over the offsets
        model = T.MixtralModel(T.MixtralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                                               max_position_embeddings=128, use_cache=False, **common))
    else:  # LLaMA-style: GQA (4 query heads over 2 key/value heads), rotary positions, RMSNorm, SiLU-gated MLP
        model = T.LlamaModel(T.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           intermediate_size=64, max_position_embeddings=128, use_cache=False, **common))
    return LastHiddenState(model.eval()).eval()


def _text_inputs(b: int, s: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s - min(2, s - 1):] = 0  # the first row is padded at the end
    return ids, mask


def _vision(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "resnet":
        model = torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=10)
    elif kind == "dinov2":  # its position table interpolated to the patch grid: size arithmetic (a sum of sizes) under dynamo
        model = PixelFeatures(transformers.Dinov2Model(transformers.Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                                                 num_attention_heads=4, intermediate_size=64)))
    elif kind == "swin":  # shifted windows: a mask built by slice assignments, a relative position index, channels-last pooling
        model = torchvision.models.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=[4, 4],
                                                   num_classes=10)
    else:
        model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                                     mlp_dim=64, num_classes=10)
        torch.nn.init.normal_(model.heads.head.weight)  # torchvision starts the head at zero: the output would be the bias
    return model.eval()


TEXT = ("bert", "gpt2", "llama")
TEXT_SHAPES = [(1, 5), (3, 17), (2, 40)]
VISION_SHAPES = {"resnet": [(1, 64, 64), (3, 96, 80), (2, 128, 112)], "vit": [(1, 32, 32), (3, 32, 32), (4, 32, 32)],
                 "swin": [(1, 32, 32), (3, 32, 32), (4, 32, 32)], "dinov2": [(1, 32, 32), (3, 48, 40), (2, 64, 32)]}


def _check(compiled, model, inputs) -> None:
    with torch.no_grad():
        want = model(*inputs)
    torch.testing.assert_close(compiled(*inputs), want, **TOL)


@pytest.mark.parametrize("kind", TEXT + ("falcon", "roberta", "mixtral"))
def test_text_model_compiled_once(kind):
    torch.manual_seed(0)
    model = _text(kind)
    b, s = Dim("batch", max=32), Dim("seq", max=128)
    compiled = disc.compile(model, _text_inputs(2, 8, 0), dynamic_shapes={"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}})
    for i, (bb, ss) in enumerate(TEXT_SHAPES):
        _check(compiled, model, _text_inputs(bb, ss, i))
    assert compiled.compile_count == 1
    assert compiled.signature.args[0].shape == ("batch", "seq")
    assert ("disc_ral_grouped_gemm_f32" in compiled.llvm_ir) == (kind == "mixtral")
    with pytest.raises(disc.ShapeError, match="seq"):
        compiled(*_text_inputs(1, 129, 0))  # past the position table: rejected before any kernel runs


@pytest.mark.parametrize("kind", ["resnet", "vit", "swin"])
def test_vision_model_compiled_once(kind):
    model = _vision(kind)
    if kind == "resnet":  # any image of 64..512 pixels a side (smaller ones pool to 1x1 before the average pool)
        dims = {0: Dim("batch", max=32), 2: Dim("h", min=64, max=512), 3: Dim("w", min=64, max=512)}
    else:  # a ViT's position table (a Swin's windows) fixes the image size
        dims = {0: Dim("batch", max=32)}
    example = torch.randn(2, 3, *VISION_SHAPES[kind][1][1:])
    compiled = disc.compile(model, (example,), dynamic_shapes={"x": dims})
    g = torch.Generator().manual_seed(1)
    for b, h, w in VISION_SHAPES[kind]:
        _check(compiled, model, (torch.randn(b, 3, h, w, generator=g),))
    assert compiled.compile_count == 1


def test_a_detection_transformer_compiled_once_for_any_image_size():
    """DETR (a ResNet, a transformer encoder over its feature map with sine positions computed from
    the map's size, object queries decoded against it): one compilation for batch, height and
    width, matching eager on images of three sizes."""
    T = transformers
    backbone = T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], out_features=["stage4"])
    model = PixelFeatures(T.DetrModel(T.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                                                   d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                                   decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                   num_queries=10)).eval()).eval()
    dims = {0: Dim("batch", max=32), 2: Dim("h", min=64, max=512), 3: Dim("w", min=64, max=512)}
    compiled = disc.compile(model, (torch.randn(2, 3, 96, 80),), dynamic_shapes={"x": dims})
    g = torch.Generator().manual_seed(4)
    for b, h, w in [(1, 64, 64), (3, 96, 80), (2, 160, 112)]:
        _check(compiled, model, (torch.randn(b, 3, h, w, generator=g),))
    assert compiled.compile_count == 1


def test_a_decoder_step_with_a_kv_cache_of_any_length():
    """Decoding with a KV cache: compiled once for batch, new tokens and past length (the cache a
    nested list argument whose dims the user names), matching eager on a prompt and on one-token
    steps; results in the step's own structure (a tuple holding a list of pairs)."""
    T = transformers
    torch.manual_seed(0)
    model = DecoderStep(T.LlamaForCausalLM(T.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                         intermediate_size=64, max_position_embeddings=256, vocab_size=VOCAB)).eval())
    g = torch.Generator().manual_seed(5)

    def inputs(b: int, past: int, new: int) -> tuple:
        return (torch.randint(3, VOCAB, (b, new), generator=g), torch.ones(b, past + new, dtype=torch.long),
                [(torch.randn(b, 2, past, 8, generator=g), torch.randn(b, 2, past, 8, generator=g)) for _ in range(2)])
    b, new, past = Dim("batch", max=16), Dim("new", min=1, max=64), Dim("past", min=1, max=192)
    layer = ({0: b, 2: past}, {0: b, 2: past})
    compiled = disc.compile(model, inputs(2, 6, 3), dynamic_shapes={"ids": {0: b, 1: new}, "mask": {0: b, 1: Dim("total", min=4, max=256)},
                                                                    "cache": [layer, layer]})
    assert [a.shape[2] for a in compiled.signature.args[2:]] == ["past"] * 4
    for shape in [(1, 9, 1), (3, 20, 1), (2, 4, 7)]:
        _check(compiled, model, inputs(*shape))
    assert compiled.compile_count == 1
    ids, _, cache = inputs(2, 6, 3)
    with pytest.raises(disc.ShapeError, match="past"):
        compiled(ids, torch.ones(2, 7, dtype=torch.long), cache)  # a mask shorter than past + new positions


@pytest.mark.parametrize("kind", ["bert", "llama", "t5"])
def test_a_model_exported_with_keyword_arguments_takes_them_and_returns_its_output_type(kind):
    """A transformers model as it is (no wrapper), its example inputs a dict of keyword arguments
    (a tokenizer's output): called with keywords, it returns the model's own output class, KV
    caches included (LLaMA's `DynamicCache`, which torch's decomposition failed on when the traced
    program rebuilt it; T5's `EncoderDecoderCache`, which torch.export did not know)."""
    T = transformers
    torch.manual_seed(0)
    small = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)
    if kind == "bert":
        model = T.BertModel(T.BertConfig(hidden_size=32, vocab_size=VOCAB, **small))
    elif kind == "llama":
        model = T.LlamaModel(T.LlamaConfig(hidden_size=32, num_key_value_heads=2, vocab_size=VOCAB, **small))
    else:
        model = T.T5Model(T.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=VOCAB))
    model.eval()

    def encoded(b: int, s: int, seed: int) -> dict:
        ids, mask = _text_inputs(b, s, seed)
        inputs = {"attention_mask": mask, "input_ids": ids}  # not the order of forward's parameters
        return inputs | ({"decoder_input_ids": ids[:, :max(1, s // 2)]} if kind == "t5" else {})
    b, s = Dim("batch", max=32), Dim("seq", max=128)
    dynamic = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}, "decoder_input_ids": {0: b, 1: Dim("target", max=64)}}
    compiled = disc.compile(model, encoded(2, 8, 0), dynamic_shapes={k: dynamic[k] for k in encoded(2, 8, 0)})
    for i, shape in enumerate(TEXT_SHAPES):
        inputs = encoded(*shape, i)
        got = compiled(**dict(reversed(inputs.items())))
        with torch.no_grad():
            want = model(**inputs)
        assert type(got) is type(want) and list(got.keys()) == list(want.keys())
        assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
        torch.testing.assert_close(tree_leaves(got), tree_leaves(want), **TOL)
    with pytest.raises(disc.ShapeError, match="attention_mask"):
        compiled(input_ids=inputs["input_ids"])


def test_a_timm_vit_at_any_image_size():
    """timm's ViT with `dynamic_img_size`: its position table resampled to the patch grid of each
    image (antialiased bicubic interpolation to sizes known at run time), compiled once for batch,
    height and width in whole patches."""
    timm = pytest.importorskip("timm", reason="the timm model test needs timm (pip install disc_stablehlo[test])")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, dynamic_img_size=True, img_size=64, depth=2).eval()
    dims = {0: Dim("batch", max=16), 2: 16 * Dim("h", min=2, max=32), 3: 16 * Dim("w", min=2, max=32)}
    compiled = disc.compile(model, (torch.randn(2, 3, 64, 48),), dynamic_shapes={"x": dims})
    g = torch.Generator().manual_seed(6)
    for b, h, w in [(1, 32, 80), (3, 64, 64), (2, 112, 48)]:
        _check(compiled, model, (torch.randn(b, 3, h, w, generator=g),))
    assert compiled.compile_count == 1


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama", "resnet", "vit", "dinov2", "convbert"])
def test_model_through_the_dynamo_backend(kind):
    torch._dynamo.reset()
    if kind in TEXT + ("convbert",):
        model = _text(kind)
        inputs = [_text_inputs(b, s, i) for i, (b, s) in enumerate(TEXT_SHAPES)]
    else:
        model = _vision(kind)
        g = torch.Generator().manual_seed(2)
        inputs = [(torch.randn(b, 3, h, w, generator=g),) for b, h, w in VISION_SHAPES[kind]]
    fast = torch.compile(model, backend="disc_stablehlo", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no graph may fall back to PyTorch
        warnings.filterwarnings("ignore", message=".*(TypedStorage|not registered as a buffer|dynamo_pgo).*")
        for args in inputs:
            _check(fast, model, args)


def test_transformer_encoder_fast_path_under_dynamo():
    """In eval mode without grad, `nn.TransformerEncoderLayer` runs its fused kernel
    (`aten._transformer_encoder_layer_fwd`), which dynamo captures as one op: decomposed."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    for norm_first, activation in [(False, "relu"), (True, "gelu")]:
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first, activation=activation).eval()
        fast = torch.compile(layer, backend="disc_stablehlo", dynamic=True)
        for b, s in [(2, 5), (3, 9)]:
            x = torch.randn(b, s, 32)
            pad = torch.zeros(b, s, dtype=torch.bool)
            pad[0, -2:] = True
            with torch.no_grad():
                torch.testing.assert_close(fast(x, src_key_padding_mask=pad), layer(x, src_key_padding_mask=pad), **TOL)
                torch.testing.assert_close(fast(x), layer(x), **TOL)


def test_a_graph_the_compiler_cannot_take_runs_in_pytorch_with_one_warning():
    torch._dynamo.reset()

    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x.sin(), dim=-1).exp().abs() + 1  # the exponential of a complex tensor: not converted

    model = Spectrum()
    fast = torch.compile(model, backend="disc_stablehlo", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 5):
            x = torch.randn(n, 16)
            torch.testing.assert_close(fast(x), model(x))
    ours = [str(w.message) for w in caught if "disc_stablehlo" in str(w.message)]
    assert len(ours) == 1 and "aten.exp" in ours[0] and "runs in PyTorch" in ours[0], ours
