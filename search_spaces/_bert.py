"""``bert``: BERT-like token encoder (HF BertModel layout: post-norm layers, pooler) over named inputs."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from dippm_nas.spec import InputSpec, TensorSpec
from search_spaces._blocks import Block, BlockInput, BlockPlan, BlockSearchSpace
from search_spaces._layers import TransformerBlock
from search_spaces._params import Choice, IntRange
from search_spaces._registry import register_space, weighted_choice

__all__ = ["BertSpace", "BertEncoder", "BertEmbeddings", "BertHead"]

_EPS = 1e-12  # BERT's LayerNorm eps
_MASK_VALUE = -10000.0  # additive mask of dropped keys (finite: no NaN for an all-masked row; fits float16)


class BertEncoder(nn.Module):
    """A BERT-like encoder from a validated ``bert`` config.

    Inputs are keywords ``input_ids`` (int64 token ids in ``[0, vocab_size)``) and ``attention_mask``
    (int64 or bool, 1 = attend, 0 = padding). Token-type ids are all zero (a single segment).

    Shapes:
        - input_ids: ``(N, L)``, attention_mask: ``(N, L)`` with ``L = seq_len``
        - output: ``(N, num_classes)``, or the pooled ``(N, hidden)`` when ``num_classes == 0``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h = cfg["hidden"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], h)
        self.position_embeddings = nn.Embedding(cfg["max_position"], h)
        self.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], h)
        self.emb_norm = nn.LayerNorm(h, eps=_EPS)
        self.register_buffer("position_ids", torch.arange(cfg["max_position"]).unsqueeze(0), persistent=False)
        self.layers = nn.ModuleList([
            TransformerBlock(h, cfg["num_heads"], cfg["intermediate"], qkv_bias=True, impl=cfg["attention"],
                             norm_first=False, eps=_EPS)
            for _ in range(cfg["depth"])
        ])
        self.pooler = nn.Linear(h, h)
        self.pooler_act = nn.Tanh()
        self.classifier = nn.Linear(h, cfg["num_classes"]) if cfg["num_classes"] > 0 else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings(self.position_ids[:, :seq_len]) \
            + self.token_type_embeddings(torch.zeros_like(input_ids))
        x = self.emb_norm(x)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * _MASK_VALUE
        for layer in self.layers:
            x = layer(x, mask)
        pooled = self.pooler_act(self.pooler(x[:, 0]))
        return pooled if self.classifier is None else self.classifier(pooled)


class BertEmbeddings(nn.Module):
    """Embeddings and the additive attention mask alone (a block of the plan), as in :class:`BertEncoder`.

    Shapes:
        - input_ids, attention_mask: ``(N, L)``
        - outputs: hidden ``(N, L, hidden)`` and mask ``(N, 1, 1, L)``
    """

    def __init__(self, vocab_size: int, max_position: int, type_vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_position, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=_EPS)
        self.register_buffer("position_ids", torch.arange(max_position).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq_len = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings(self.position_ids[:, :seq_len]) \
            + self.token_type_embeddings(torch.zeros_like(input_ids))
        x = self.emb_norm(x)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * _MASK_VALUE
        return x, mask


class BertHead(nn.Module):
    """Pooler (first token, Linear, Tanh) and the optional classifier alone (a block of the plan).

    Shapes:
        ``(N, L, hidden) -> (N, num_classes)``, or ``(N, hidden)`` when ``num_classes == 0``
    """

    def __init__(self, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.pooler_act = nn.Tanh()
        self.classifier = nn.Linear(hidden, num_classes) if num_classes > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.pooler_act(self.pooler(x[:, 0]))
        return pooled if self.classifier is None else self.classifier(pooled)


@register_space("bert")
class BertSpace(BlockSearchSpace):
    """BERT-like token-encoder family. Config keys:

    - ``vocab_size``: token vocabulary, 2..262144
    - ``seq_len``: tokens per sample (the input length), 1..``max_position``
    - ``max_position``: position-embedding table size, 1..8192
    - ``type_vocab_size``: token-type table size, 1..16
    - ``hidden``: model width, 16..4096, a multiple of ``num_heads``
    - ``depth``: encoder layers, 1..48
    - ``num_heads``: attention heads, one of 1, 2, 4, 8, 12, 16, 32
    - ``intermediate``: feed-forward hidden width, 16..16384
    - ``attention``: ``"sdpa"`` or ``"explicit"`` (see ``vit``)
    - ``num_classes``: classifier outputs on the pooled [CLS] token; 0 returns the pooled vector

    Inputs: named, ``input_ids`` and ``attention_mask``, both int64 of shape ``(batch, seq_len)``
    (:meth:`input_spec` gives them; ``input_ids`` values are drawn below ``vocab_size``).
    """

    params = {
        "vocab_size": IntRange(2, 262_144),
        "seq_len": IntRange(1, 8192),
        "max_position": IntRange(1, 8192),
        "type_vocab_size": IntRange(1, 16),
        "hidden": IntRange(16, 4096),
        "depth": IntRange(1, 48),
        "num_heads": Choice(1, 2, 4, 8, 12, 16, 32),
        "intermediate": IntRange(16, 16384),
        "attention": Choice("sdpa", "explicit"),
        "num_classes": IntRange(0, 100_000),
    }
    presets = {
        "bert_base": {},  # = HF bert-base-uncased BertModel (pooler, no classifier): 109,482,240 parameters
        "bert_mini": {"hidden": 256, "depth": 4, "num_heads": 4, "intermediate": 1024},
        "bert_tiny": {"hidden": 128, "depth": 2, "num_heads": 2, "intermediate": 512},
    }

    def default_config(self) -> dict[str, Any]:
        return {"vocab_size": 30522, "seq_len": 128, "max_position": 512, "type_vocab_size": 2, "hidden": 768,
                "depth": 12, "num_heads": 12, "intermediate": 3072, "attention": "sdpa", "num_classes": 0}

    def _check(self, cfg: dict[str, Any]) -> None:
        if cfg["hidden"] % cfg["num_heads"]:
            raise SearchSpaceError(
                f"bert config 'hidden' must be a multiple of 'num_heads' ({cfg['num_heads']}), got {cfg['hidden']}"
            )
        if cfg["seq_len"] > cfg["max_position"]:
            raise SearchSpaceError(
                f"bert config 'seq_len' must be <= 'max_position' ({cfg['max_position']}), got {cfg['seq_len']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return BertEncoder(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Embeddings (which also make the attention mask), ``depth`` identical layers reading the hidden
        state and that mask, head."""
        n, h = config["seq_len"], config["hidden"]
        embed = Block("embed", {"vocab_size": config["vocab_size"], "max_position": config["max_position"],
                                "type_vocab_size": config["type_vocab_size"], "hidden": h},
                      (BlockInput("input_ids", (n,), "input_ids", "int64"),
                       BlockInput("attention_mask", (n,), "attention_mask", "int64")), num_outputs=2)
        layer = {"hidden": h, "num_heads": config["num_heads"], "intermediate": config["intermediate"],
                 "attention": config["attention"]}
        blocks = [embed]
        for i in range(config["depth"]):
            blocks.append(Block("layer", layer, (BlockInput((i, 0), (n, h), "x"),
                                                 BlockInput((0, 1), (1, 1, n), "mask"))))
        blocks.append(Block("head", {"hidden": h, "num_classes": config["num_classes"]},
                            (BlockInput((len(blocks) - 1, 0), (n, h)),)))
        return BlockPlan(tuple(blocks), ((len(blocks) - 1, 0),))

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "embed":
            return BertEmbeddings(p["vocab_size"], p["max_position"], p["type_vocab_size"], p["hidden"])
        if kind == "layer":
            return TransformerBlock(p["hidden"], p["num_heads"], p["intermediate"], qkv_bias=True, impl=p["attention"],
                                    norm_first=False, eps=_EPS)
        if kind == "head":
            return BertHead(p["hidden"], p["num_classes"])
        raise SearchSpaceError(f"bert has no block kind {kind!r}; kinds: ['embed', 'layer', 'head']")

    def input_spec(self, config: dict[str, Any], batch_size: int = 1, dtype: str = "float32") -> InputSpec:
        """Named int64 inputs ``input_ids`` (values < vocab_size) and ``attention_mask`` (0/1).

        Shapes:
            - input_ids: ``(batch_size, seq_len)``
            - attention_mask: ``(batch_size, seq_len)``
        """
        cfg = self.validate(config)
        n = cfg["seq_len"]
        return InputSpec(
            inputs=(TensorSpec("input_ids", (n,), "int64", high=cfg["vocab_size"]),
                    TensorSpec("attention_mask", (n,), "int64", high=2)),
            batch_size=batch_size, dtype=dtype,
        )

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        heads = rng.choice((1, 2, 4, 8))
        hidden = heads * rng.choice((16, 32, 64))
        seq_len = weighted_choice(rng, (16, 32, 64, 128, 256, 512), (1, 2, 2, 2, 1, 1))
        return {
            "vocab_size": rng.choice((1000, 8192, 30522)), "seq_len": seq_len, "max_position": 512,
            "type_vocab_size": 2, "hidden": hidden, "depth": rng.randint(1, 6), "num_heads": heads,
            "intermediate": hidden * rng.choice((2, 4)), "attention": rng.choice(("sdpa", "explicit")),
            "num_classes": rng.choice((0, 2, 10)),
        }
