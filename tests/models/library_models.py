"""What the model tests and `benchmarks/models.py` share to build models from `transformers` and
`torchvision`."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def declare_torchvision_ops() -> list:
    """torchvision's PyPI wheels are built against CUDA torch: with the CPU build (what this
    machine's pip gives) its native library does not load, and `import torchvision` (which
    `transformers` does too) fails registering fake kernels for `nms`/`qnms`. Declaring those two
    schemas, with no kernel, lets its pure-Python models import; they use no native op. Call it
    before importing either; the returned list keeps the declarations alive."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return []
    try:
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
        return []
    except (OSError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return [lib]


class LastHiddenState(torch.nn.Module):
    """A text model called with ids and a padding mask, returning its last hidden state."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class PixelFeatures(torch.nn.Module):
    """A transformers vision model called with pixel values, returning its last hidden state."""

    argument = "pixel_values"  # the model's keyword for its input

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.argument: x}).last_hidden_state


class WaveformFeatures(PixelFeatures):
    """A transformers speech model called with raw waveforms, returning its last hidden state."""

    argument = "input_values"


class DecoderStep(torch.nn.Module):
    """One step of a causal LM with a KV cache, as a generation loop calls it: new ids, the mask of
    past and new positions, and the cache as a list of (keys, values) per layer (any past length);
    returns the logits and the cache grown by the new positions."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, mask, cache):
        from transformers import DynamicCache

        past = DynamicCache()
        for i, (k, v) in enumerate(cache):
            past.update(k, v, i)
        n = cache[0][0].shape[2]
        positions = torch.arange(n, n + ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
        out = self.model(input_ids=ids, attention_mask=mask, past_key_values=past, position_ids=positions, use_cache=True)
        return out.logits, [(layer.keys, layer.values) for layer in out.past_key_values.layers]
