"""Coverage of the models people bring: 81 architectures from transformers and torchvision at
small configs with random weights (batch norms get random statistics, so no layer is an
identity), each compiled once with dynamic dims (batch and sequence, batch and image size,
batch alone where the model fixes the image size, or batch and waveform length) and checked
against eager at three shapes; and 9 models called as users call them (TASKS: keyword
arguments, a decoder step with a KV cache, encoder-decoders returning their caches, a ViT at any
image size, a video network), every result leaf checked; and 34 image models from timm.
Each model runs in a process of its own with a time limit; a row records the compile time (the
export included), the largest error relative to the output's largest value, or the error.
Writes benchmarks/model_zoo.json (a run of some models replaces their rows).

    python benchmarks/model_zoo.py [--models falcon,tv_swin,...] [--dynamo] [--timeout 600]

--dynamo compiles through `torch.compile(backend="disc_stablehlo", dynamic=True)` instead of
`disc.compile`; a graph that falls back to PyTorch counts as an error there."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 512


_COMMON = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_DECODER = dict(max_position_embeddings=128, use_cache=False, **_SMALL, **_COMMON)
_STAGES = dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])

# text models: name -> builder of transformers (`T`)
TEXT = {
    "distilbert": lambda T: T.DistilBertModel(T.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=VOCAB)),
    "roberta": lambda T: T.RobertaModel(T.RobertaConfig(max_position_embeddings=130, **_SMALL, **_COMMON)),
    "albert": lambda T: T.AlbertModel(T.AlbertConfig(embedding_size=16, **_SMALL, **_COMMON)),
    "electra": lambda T: T.ElectraModel(T.ElectraConfig(embedding_size=16, **_SMALL, **_COMMON)),
    "deberta_v2": lambda T: T.DebertaV2Model(T.DebertaV2Config(**_SMALL, **_COMMON)),
    "mpnet": lambda T: T.MPNetModel(T.MPNetConfig(max_position_embeddings=130, **_SMALL, **_COMMON)),
    "convbert": lambda T: T.ConvBertModel(T.ConvBertConfig(embedding_size=32, **_SMALL, **_COMMON)),
    "t5_encoder": lambda T: T.T5EncoderModel(T.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=VOCAB)),
    "bart_encoder": lambda T: T.BartModel(T.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                     vocab_size=VOCAB)).get_encoder(),
    "gpt2": lambda T: T.GPT2Model(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, use_cache=False, **_COMMON)),
    "llama": lambda T: T.LlamaModel(T.LlamaConfig(num_key_value_heads=2, **_DECODER)),
    "mistral": lambda T: T.MistralModel(T.MistralConfig(num_key_value_heads=2, sliding_window=16, **_DECODER)),
    "qwen2": lambda T: T.Qwen2Model(T.Qwen2Config(num_key_value_heads=2, **_DECODER)),
    "gemma": lambda T: T.GemmaModel(T.GemmaConfig(num_key_value_heads=1, head_dim=8, **_DECODER)),
    "phi": lambda T: T.PhiModel(T.PhiConfig(partial_rotary_factor=0.5, **_DECODER)),
    "gpt_neox": lambda T: T.GPTNeoXModel(T.GPTNeoXConfig(rotary_pct=0.25, **_DECODER)),
    "gptj": lambda T: T.GPTJModel(T.GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=128, use_cache=False, **_COMMON)),
    "opt": lambda T: T.OPTModel(T.OPTConfig(ffn_dim=64, word_embed_proj_dim=32, **{k: v for k, v in _DECODER.items() if k != "intermediate_size"})),
    "bloom": lambda T: T.BloomModel(T.BloomConfig(hidden_size=32, n_layer=2, n_head=4, use_cache=False, **_COMMON)),
    "falcon": lambda T: T.FalconModel(T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, use_cache=False, **_COMMON)),
    "xlm_roberta": lambda T: T.XLMRobertaModel(T.XLMRobertaConfig(max_position_embeddings=130, **_SMALL, **_COMMON)),
    "modernbert": lambda T: T.ModernBertModel(T.ModernBertConfig(global_attn_every_n_layers=2, local_attention=16, **_SMALL,
                                                                 vocab_size=VOCAB, pad_token_id=0)),
    "phi3": lambda T: T.Phi3Model(T.Phi3Config(num_key_value_heads=2, **_DECODER)),
    "gemma2": lambda T: T.Gemma2Model(T.Gemma2Config(num_key_value_heads=2, head_dim=8, sliding_window=16, **_DECODER)),
    "gemma3_text": lambda T: T.Gemma3TextModel(T.Gemma3TextConfig(num_key_value_heads=2, head_dim=8, sliding_window=16, **_DECODER)),
    "qwen3": lambda T: T.Qwen3Model(T.Qwen3Config(num_key_value_heads=2, head_dim=8, **_DECODER)),
    "glm4": lambda T: T.Glm4Model(T.Glm4Config(num_key_value_heads=2, head_dim=8, **_DECODER)),
    "olmo2": lambda T: T.Olmo2Model(T.Olmo2Config(num_key_value_heads=2, **_DECODER)),
    "cohere": lambda T: T.CohereModel(T.CohereConfig(num_key_value_heads=2, **_DECODER)),
    "nemotron": lambda T: T.NemotronModel(T.NemotronConfig(num_key_value_heads=2, **_DECODER)),
    "mpt": lambda T: T.MptModel(T.MptConfig(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=128, vocab_size=VOCAB,
                                            use_cache=False)),
    "xlnet": lambda T: T.XLNetModel(T.XLNetConfig(d_model=32, n_layer=2, n_head=4, d_inner=64, vocab_size=VOCAB)),
    "bigbird": lambda T: T.BigBirdModel(T.BigBirdConfig(attention_type="original_full", max_position_embeddings=130, **_SMALL, **_COMMON)),
    # mixture of experts: tokens sorted by expert and counted by histc, grouped GEMMs over the offsets (the RAL's)
    "mixtral": lambda T: T.MixtralModel(T.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **_DECODER)),
    "qwen2_moe": lambda T: T.Qwen2MoeModel(T.Qwen2MoeConfig(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                                            shared_expert_intermediate_size=64, **_DECODER)),
    "qwen3_moe": lambda T: T.Qwen3MoeModel(T.Qwen3MoeConfig(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                                            head_dim=8, **_DECODER)),
    "olmoe": lambda T: T.OlmoeModel(T.OlmoeConfig(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, **_DECODER)),
    "phimoe": lambda T: T.PhimoeModel(T.PhimoeConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **_DECODER)),
    "granitemoe": lambda T: T.GraniteMoeModel(T.GraniteMoeConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                                                 **_DECODER)),
    "deepseek_v3": lambda T: T.DeepseekV3Model(T.DeepseekV3Config(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                                                                  moe_intermediate_size=48, first_k_dense_replace=1, n_group=1, topk_group=1,
                                                                  q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                                                  v_head_dim=8, **_DECODER)),
    "llama4_text": lambda T: T.Llama4TextModel(T.Llama4TextConfig(num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=1,
                                                                  intermediate_size_mlp=64, attention_chunk_size=16, **_DECODER)),
    "gpt_oss": lambda T: T.GptOssModel(T.GptOssConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                                                      sliding_window=16, **_DECODER)),
    "starcoder2": lambda T: T.Starcoder2Model(T.Starcoder2Config(num_key_value_heads=2, **_DECODER)),
    "olmo": lambda T: T.OlmoModel(T.OlmoConfig(num_key_value_heads=2, **_DECODER)),
    "stablelm": lambda T: T.StableLmModel(T.StableLmConfig(num_key_value_heads=2, **_DECODER)),
}

# vision models: name -> (builder of transformers (`T`, hf_) or torchvision.models (`tv`, tv_), image side or None for a dynamic
# image size)
_DETR = dict(use_timm_backbone=False, use_pretrained_backbone=False, d_model=32, encoder_layers=1, decoder_layers=1,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10)


def _detr_backbone(T):
    return T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], out_features=["stage4"])


VISION = {
    # detection at any image size: DETR and Conditional DETR (a ResNet and a transformer over its feature map, object queries), YOLOS
    "hf_detr": (lambda T: T.DetrModel(T.DetrConfig(backbone_config=_detr_backbone(T), **_DETR)), None),
    "hf_cond_detr": (lambda T: T.ConditionalDetrModel(T.ConditionalDetrConfig(backbone_config=_detr_backbone(T), **_DETR)), None),
    "hf_yolos": (lambda T: T.YolosModel(T.YolosConfig(image_size=[64, 64], patch_size=16, num_detection_tokens=5, **_SMALL)), None),
    "hf_dpt": (lambda T: T.DPTModel(T.DPTConfig(image_size=64, patch_size=16, **_SMALL)), None),  # dense prediction (depth)
    "hf_convnext": (lambda T: T.ConvNextModel(T.ConvNextConfig(**_STAGES)), None),
    "hf_resnet": (lambda T: T.ResNetModel(T.ResNetConfig(embedding_size=8, **_STAGES)), None),
    "hf_segformer": (lambda T: T.SegformerModel(T.SegformerConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                                                                 num_attention_heads=[1, 1, 2, 2])), None),
    "hf_dinov2": (lambda T: T.Dinov2Model(T.Dinov2Config(image_size=32, patch_size=8, layerscale_value=0.1, **_SMALL)), None),
    "hf_swin": (lambda T: T.SwinModel(T.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                                  window_size=4)), 64),
    "hf_deit": (lambda T: T.DeiTModel(T.DeiTConfig(image_size=32, patch_size=8, **_SMALL)), 32),
    "hf_clip_vision": (lambda T: T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, patch_size=8, **_SMALL)), 32),
    "hf_mobilevit": (lambda T: T.MobileViTModel(T.MobileViTConfig(image_size=64, hidden_sizes=[16, 24, 32],
                                                                 neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64])), 64),
    "hf_levit": (lambda T: T.LevitModel(T.LevitConfig()), 224),
    "tv_resnet18": (lambda tv: tv.resnet18(num_classes=10), None),
    "tv_resnext50": (lambda tv: tv.resnext50_32x4d(num_classes=10), None),
    "tv_mobilenet_v2": (lambda tv: tv.mobilenet_v2(num_classes=10), None),
    "tv_mobilenet_v3": (lambda tv: tv.mobilenet_v3_large(num_classes=10), None),
    "tv_efficientnet_b0": (lambda tv: tv.efficientnet_b0(num_classes=10), None),
    "tv_efficientnet_v2_s": (lambda tv: tv.efficientnet_v2_s(num_classes=10), None),
    "tv_regnet_y": (lambda tv: tv.regnet_y_400mf(num_classes=10), None),
    "tv_mnasnet": (lambda tv: tv.mnasnet0_5(num_classes=10), None),
    "tv_shufflenet_v2": (lambda tv: tv.shufflenet_v2_x0_5(num_classes=10), None),
    "tv_densenet121": (lambda tv: tv.densenet121(num_classes=10), None),
    "tv_vgg11_bn": (lambda tv: tv.vgg11_bn(num_classes=10), None),
    "tv_inception_v3": (lambda tv: tv.inception_v3(num_classes=10, aux_logits=False, init_weights=True), 299),
    "tv_vit_b_16": (lambda tv: _random_head(tv.vit_b_16(num_classes=10)), 224),
    "tv_swin_t": (lambda tv: tv.swin_t(num_classes=10), 224),
    "tv_maxvit_t": (lambda tv: tv.maxvit_t(num_classes=10), 224),
    "tv_convnext_tiny": (lambda tv: tv.convnext_tiny(num_classes=10), None),
    "tv_squeezenet": (lambda tv: tv.squeezenet1_1(num_classes=10), None),
    "tv_googlenet": (lambda tv: tv.googlenet(num_classes=10, aux_logits=False, init_weights=True), None),
    "tv_lraspp": (lambda tv: _segmentation(tv.segmentation.lraspp_mobilenet_v3_large(num_classes=5, weights=None, weights_backbone=None)), None),
    "tv_deeplabv3": (lambda tv: _segmentation(tv.segmentation.deeplabv3_mobilenet_v3_large(num_classes=5, weights=None, weights_backbone=None)),
                     None),
}


def _segmentation(model):
    """torchvision's segmentation models return a dict: its "out" (a map at the input's size)."""
    import torch

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)["out"]
    return Out()


def _random_head(vit):
    """torchvision starts a ViT's head at zero: every output would be the bias."""
    import torch

    torch.nn.init.normal_(vit.heads.head.weight)
    return vit


# speech models over raw waveforms of any length (batch from 2: WavLM's export guards batch 1 out)
_SPEECH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
               conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
AUDIO = {
    "wav2vec2": lambda T: T.Wav2Vec2Model(T.Wav2Vec2Config(**_SPEECH)),
    "hubert": lambda T: T.HubertModel(T.HubertConfig(**_SPEECH)),
    "wavlm": lambda T: T.WavLMModel(T.WavLMConfig(**_SPEECH)),
}



def _decoder_step(T):
    """A LLaMA step with a KV cache (batch, new tokens, past length)."""
    from library_models import DecoderStep

    model = DecoderStep(T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, **{**_DECODER, "use_cache": True, "max_position_embeddings": 256})))
    g = _generator()

    def inputs(b: int, past: int, new: int) -> dict:
        import torch

        return {"ids": torch.randint(3, VOCAB, (b, new), generator=g), "mask": torch.ones(b, past + new, dtype=torch.long),
                "cache": [(torch.randn(b, 2, past, 8, generator=g), torch.randn(b, 2, past, 8, generator=g)) for _ in range(2)]}
    b, past = _dim("batch", 1, 16), _dim("past", 1, 192)
    layer = ({0: b, 2: past}, {0: b, 2: past})
    return model, inputs, [(1, 9, 1), (2, 6, 3), (3, 20, 1)], {"ids": {0: b, 1: _dim("new", 1, 64)}, "mask": {0: b, 1: _dim("total", 4, 256)},
                                                               "cache": [layer, layer]}


def _keywords(build, *, decoder: bool = False):
    """A transformers model as it is, called with a tokenizer's keyword arguments (and decoder ids)."""
    def task(T):
        g = _generator()

        def inputs(b: int, s: int) -> dict:
            import torch

            ids = torch.randint(3, VOCAB, (b, s), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(b, s, dtype=torch.long)} | (
                {"decoder_input_ids": ids[:, :max(1, s // 2)]} if decoder else {})
        b, s = _dim("batch", 1, 32), _dim("seq", 1, 120)
        dynamic = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}} | ({"decoder_input_ids": {0: b, 1: _dim("target", 1, 60)}}
                                                                                   if decoder else {})
        return build(T), inputs, [(1, 5), (3, 17), (2, 40)], dynamic
    return task


def _whisper(T):
    """Whisper's encoder over fixed-length log-mel frames, its decoder over any number of tokens."""
    model = T.WhisperModel(T.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                           encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50, **_COMMON,
                                           decoder_start_token_id=1))
    g = _generator()

    def inputs(b: int, t: int) -> dict:
        import torch

        return {"input_features": torch.randn(b, 16, 100, generator=g), "decoder_input_ids": torch.randint(3, VOCAB, (b, t), generator=g)}
    b = _dim("batch", 1, 32)
    return model, inputs, [(1, 1), (3, 11), (2, 30)], {"input_features": {0: b}, "decoder_input_ids": {0: b, 1: _dim("target", 1, 60)}}


def _vit_any_size(T):
    """A ViT whose position table is interpolated to the image's patch grid (images of any size in
    multiples of the patch)."""
    model = T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, **_SMALL))
    g = _generator()

    def inputs(b: int, h: int, w: int) -> dict:
        import torch

        return {"pixel_values": torch.randn(b, 3, h, w, generator=g), "interpolate_pos_encoding": True}
    return model, inputs, [(1, 32, 48), (2, 64, 40), (3, 24, 24)], {
        "pixel_values": {0: _dim("batch", 1, 32), 2: 8 * _dim("h8", 2, 32), 3: 8 * _dim("w8", 2, 32)}, "interpolate_pos_encoding": None}


def _video(T):
    """torchvision's R3D-18 over 16-frame clips of any batch and frame size."""
    import torchvision

    model = torchvision.models.video.r3d_18(num_classes=10)
    g = _generator()

    def inputs(b: int, h: int, w: int) -> dict:
        import torch

        return {"x": torch.randn(b, 3, 16, h, w, generator=g)}
    return model, inputs, [(1, 32, 32), (2, 48, 40), (3, 40, 56)], {"x": {0: _dim("batch", 1, 16), 3: _dim("h", 32, 128),
                                                                          4: _dim("w", 32, 128)}}


def _generator():
    import torch

    return torch.Generator().manual_seed(1)


def _dim(name: str, lo: int, hi: int):
    from torch.export import Dim

    return Dim(name, min=lo, max=hi)


# models called as users call them (keyword arguments, KV caches, encoder-decoders; each result
# compared leaf by leaf): name -> builder of (model, inputs of a shape, shapes, dynamic_shapes)
TASKS = {
    "llama_decode_step": _decoder_step,
    "gpt2_lm_with_cache": _keywords(lambda T: T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **_COMMON))),
    "bert_classifier": _keywords(lambda T: T.BertForSequenceClassification(T.BertConfig(num_labels=3, **_SMALL, **_COMMON))),
    "clip_text": _keywords(lambda T: T.CLIPTextModel(T.CLIPTextConfig(max_position_embeddings=128, **_SMALL, **_COMMON))),
    "t5_seq2seq": _keywords(lambda T: T.T5Model(T.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=VOCAB)),
                            decoder=True),
    "bart_seq2seq": _keywords(lambda T: T.BartModel(T.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                                                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                                 max_position_embeddings=128, **_COMMON)), decoder=True),
    "whisper": _whisper,
    "vit_any_size": _vit_any_size,
    "tv_r3d_18": _video,
}

# timm's image models (the `bench` extra installs timm): name -> the image size their position
# tables or windows fix (None: any size from 64 to 512 pixels a side)
TIMM = {
    "resnet18": None, "efficientnet_b0": None, "mobilenetv3_small_100": None, "convnext_atto": None, "regnetx_002": None,
    "ghostnet_100": None, "rexnet_100": None, "mixnet_s": None, "hrnet_w18_small": 224, "nf_resnet26": None, "efficientvit_b0": None,
    "mobileone_s0": None, "repvit_m1": None, "poolformer_s12": None, "dpn68": 224, "res2net50_14w_8s": 224, "fastvit_t8": 256,
    "edgenext_xx_small": 256, "vit_tiny_patch16_224": 224, "deit_tiny_patch16_224": 224, "levit_128s": 224, "mobilevit_xxs": 256,
    "efficientformer_l1": 224, "coat_lite_tiny": 224, "pit_ti_224": 224, "swin_tiny_patch4_window7_224": 224, "maxvit_nano_rw_256": 256,
    "xcit_nano_12_p16_224": 224, "crossvit_tiny_240": 240, "cait_xxs24_224": 224, "volo_d1_224": 224, "tresnet_m": 224,
    "sebotnet33ts_256": 256, "convmixer_768_32": 224,
}

NAMES = [*TEXT, *VISION, *AUDIO, *TASKS, *(f"timm_{n}" for n in TIMM)]


def check_one(name: str, dynamo: bool) -> dict:
    """Builds, compiles and checks one model in this process."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
    import torch
    from library_models import LastHiddenState, PixelFeatures, WaveformFeatures, declare_torchvision_ops
    from torch.export import Dim
    from torch.utils._pytree import tree_leaves

    import disc_stablehlo as disc

    declare_torchvision_ops()
    import torchvision
    import transformers as T

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name in TASKS:
        model, inputs, shapes, dynamic = TASKS[name](T)
    elif name in TEXT:
        model = LastHiddenState(TEXT[name](T).eval())
        batch, seq = Dim("batch", max=32), Dim("seq", max=120)
        dynamic = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}

        def inputs(b: int, s: int) -> tuple:
            mask = torch.ones(b, s, dtype=torch.long)
            mask[0, s - min(2, s - 1):] = 0
            return torch.randint(3, VOCAB, (b, s), generator=g), mask
        shapes = [(1, 5), (3, 17), (2, 40)]
    elif name in AUDIO:
        model = WaveformFeatures(AUDIO[name](T).eval())
        dynamic = {"x": {0: Dim("batch", min=2, max=32), 1: Dim("samples", min=400, max=32000)}}
        shapes = [(2, 400), (3, 1601), (2, 5000)]

        def inputs(b: int, n: int) -> tuple:
            return (torch.randn(b, n, generator=g),)
    else:
        if name.startswith("timm_"):
            import timm

            build, side = (lambda _: timm.create_model(name[5:], pretrained=False, num_classes=10)), TIMM[name[5:]]
        else:
            build, side = VISION[name]
        model = PixelFeatures(build(T).eval()) if name.startswith("hf_") else build(torchvision.models).eval()
        dims = {0: Dim("batch", max=32)} if side else {0: Dim("batch", max=32), 2: Dim("h", min=64, max=512), 3: Dim("w", min=64, max=512)}
        dynamic = {"x": dims}
        shapes = [(1, side, side), (3, side, side), (2, side, side)] if side else [(1, 64, 64), (3, 96, 80), (2, 128, 112)]

        def inputs(b: int, h: int, w: int) -> tuple:
            return (torch.randn(b, 3, h, w, generator=g),)
    model.eval()
    with torch.no_grad():
        for m in model.modules():  # a fresh batch norm is an identity: random statistics make every layer count
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
                if m.weight is not None:
                    m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.5, 0.5)
    start = time.perf_counter()
    if dynamo:
        import warnings

        warnings.simplefilter("error", UserWarning)  # a graph that falls back to PyTorch is an error here
        warnings.filterwarnings("ignore", message=".*(TypedStorage|not registered as a buffer|dynamo_pgo|lru_cache).*")  # notices, not fallbacks
        compiled = torch.compile(model, backend="disc_stablehlo", dynamic=True)
    else:
        compiled = disc.compile(model, inputs(*shapes[1]), dynamic_shapes=dynamic)
        compile_s = time.perf_counter() - start

    def call(f, args):
        return f(**args) if isinstance(args, dict) else f(*args)
    errors = []
    for shape in shapes:
        args = inputs(*shape)
        with torch.no_grad():
            got = call(compiled, args)
            if dynamo and not errors:
                compile_s = time.perf_counter() - start  # its first call compiles
            want = call(model, args)
        errors.append(max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in
                          zip(tree_leaves(got), tree_leaves(want), strict=True)))
    return {"model": name, "compile_s": round(compile_s, 1), "max_rel_err": max(errors), "ok": max(errors) < 1e-4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(NAMES))
    ap.add_argument("--dynamo", action="store_true")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        try:
            row = check_one(args.one, args.dynamo)
        except Exception as e:  # the row says why: the innermost cause (dynamo wraps the backend's error)
            while e.__cause__ is not None:
                e = e.__cause__
            row = {"model": args.one, "ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        print("ROW " + json.dumps(row), flush=True)
        return
    path = os.path.join(HERE, "model_zoo.json")
    key = "dynamo" if args.dynamo else "disc.compile"
    results = json.load(open(path)) if os.path.exists(path) else {}
    rows = results.setdefault(key, {})
    for name in args.models.split(","):
        cmd = [sys.executable, __file__, "--one", name] + (["--dynamo"] if args.dynamo else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout).stdout
            row = next((json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")),
                       {"model": name, "ok": False, "error": "the process died"})
        except subprocess.TimeoutExpired:
            row = {"model": name, "ok": False, "error": f"over {args.timeout} s"}
        rows[name] = row
        print(f"{name:22} {'ok' if row['ok'] else 'FAIL':5} {row.get('compile_s', ''):>6} "
              f"{row.get('max_rel_err', '') if 'error' not in row else row['error']}", flush=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    done = [r for r in rows.values() if r["ok"]]
    print(f"{key}: {len(done)} of {len(rows)} models compile once and match eager")


if __name__ == "__main__":
    main()
