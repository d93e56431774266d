"""Model builders of the GPU campaign's validation sets that are not ``torchvision:`` / ``timm:`` SPECs.

Each is a ``package.module:callable`` model SPEC (:func:`dippm_nas.capture.load_model`), so a row records a
string from which the same architecture is built again on another machine (random weights, nothing
downloaded):

- ``dippm_nas.measure.campaign_models:bert_base``: a BERT-base encoder (12 layers, hidden 768, 12 heads,
  ``transformers.BertConfig()`` defaults), inputs ``input_ids`` and ``attention_mask``; returns the last
  hidden state.
- ``dippm_nas.measure.campaign_models:gpt2_small``: a GPT-2-size decoder (12 layers, hidden 768, 12 heads,
  ``transformers.GPT2Config()`` defaults, no KV cache), input ``input_ids``; returns the last hidden state.
- ``dippm_nas.measure.campaign_models:tiny_cnn`` and ``:tiny_mlp``: two tiny models (the ``smoke`` set:
  a dry run of the campaign in seconds, on a CPU too).

The transformer builders need ``transformers`` (``pip install 'dippm-nas[campaign]'``); the models come
from configs, never from the hub.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dippm_nas._optional import require

__all__ = ["LastHidden", "bert_base", "gpt2_small", "tiny_cnn", "tiny_mlp"]


class LastHidden(nn.Module):
    """Calls a ``transformers`` model with keyword inputs and returns ``last_hidden_state`` (a tensor)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        out: Any = self.model(**{k: inputs[k] for k in self.keys if k in inputs}, return_dict=True)
        return out.last_hidden_state


def bert_base() -> nn.Module:
    """BERT-base encoder from ``transformers.BertConfig()`` (random weights, eval mode).

    Shapes:
        ``input_ids``, ``attention_mask``: ``(batch, seq)`` int64 -> ``(batch, seq, 768)``.
    """
    transformers = require("transformers", "campaign", "building the campaign's BERT-base encoder")
    cfg = transformers.BertConfig(attn_implementation="sdpa")
    model = transformers.BertModel(cfg, add_pooling_layer=False)
    return LastHidden(model, ("input_ids", "attention_mask")).eval()


def gpt2_small() -> nn.Module:
    """GPT-2-size decoder (124M) from ``transformers.GPT2Config()``, without a KV cache (eval mode).

    Shapes:
        ``input_ids``: ``(batch, seq)`` int64 -> ``(batch, seq, 768)``.
    """
    transformers = require("transformers", "campaign", "building the campaign's GPT-2 decoder")
    cfg = transformers.GPT2Config(use_cache=False, attn_implementation="sdpa")
    return LastHidden(transformers.GPT2Model(cfg), ("input_ids",)).eval()


def tiny_cnn() -> nn.Module:
    """Two 3x3 convolutions with a residual, pooled into 10 classes. Shapes: ``(N, 3, H, W) -> (N, 10)``."""
    class TinyCnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.head = nn.Linear(8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.stem(x))
            x = x + torch.relu(self.conv(x))
            return self.head(x.mean(dim=(2, 3)))

    return TinyCnn().eval()


def tiny_mlp() -> nn.Module:
    """A 2-layer MLP. Shapes: ``(N, 32) -> (N, 4)``."""
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 4)).eval()
