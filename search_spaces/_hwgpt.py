"""``hwgpt``: the GPT decoder of HW-GPT-Bench (lit-gpt layout) with per-layer heads and MLP ratios.

The recipe (automl/HW-GPT-Bench; lit-gpt ``GPT``): token embedding (no position table), ``depth``
blocks with a **parallel residual** ``x + attn(norm_1(x)) + mlp(norm_2(x))`` (two LayerNorms, always with a bias),
multi-head causal attention through ``F.scaled_dot_product_attention`` with head size 64 and rotary embeddings on the
first 16 dims of each head (lit-gpt ``apply_rope``: float32 cos/sin tables, the rotated half cast back with
``type_as``), a SwiGLU MLP (``fc_1``, ``fc_2`` to ``mlp_ratio * embed_dim``, ``silu(fc_1) * fc_2``, ``proj``), a final
LayerNorm and an untied vocabulary head without a bias. ``bias`` switches the biases of the attention and MLP
linears. The parameter count is :func:`hwgpt_param_count`; the released rows' ``params`` column matches it exactly.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dippm_nas.errors import SearchSpaceError
from dippm_nas.spec import InputSpec, TensorSpec
from search_spaces._blocks import Block, BlockInput, BlockPlan, BlockSearchSpace
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import get_space, register_space

__all__ = ["HwGptSpace", "HwGptModel", "HwGptBlock", "hwgpt_param_count", "HWGPT_CHOICES"]

_ROPE_BASE = 10000
_NORM_EPS = 1e-5

#: HW-GPT-Bench's three spaces: embed dims, depths, per-layer heads and per-layer MLP ratios.
HWGPT_CHOICES: dict[str, dict[str, tuple[int, ...]]] = {
    "s": {"embed_dim": (192, 384, 768), "depth": (10, 11, 12), "num_heads": (4, 8, 12), "mlp_ratio": (2, 3, 4)},
    "m": {"embed_dim": (256, 512, 1024), "depth": (22, 23, 24), "num_heads": (8, 12, 16), "mlp_ratio": (2, 3, 4)},
    "l": {"embed_dim": (320, 640, 1280), "depth": (34, 35, 36), "num_heads": (8, 16, 20), "mlp_ratio": (2, 3, 4)},
}


def _rope_tables(seq_len: int, rotary_dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lit-gpt ``build_rope_cache``: float32 ``cos``/``sin`` of shape ``(seq_len, rotary_dims)``."""
    theta = 1.0 / (_ROPE_BASE ** (torch.arange(0, rotary_dims, 2, dtype=torch.float32) / rotary_dims))
    idx_theta = torch.outer(torch.arange(seq_len, dtype=torch.float32), theta).repeat(1, 2)
    return torch.cos(idx_theta), torch.sin(idx_theta)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """lit-gpt ``apply_rope`` on ``(N, heads, T, rotary_dims)``."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return ((x * cos) + (rotated * sin)).type_as(x)


class HwGptBlock(nn.Module):
    """One parallel-residual decoder block (its own rotary tables, so a block stands alone).

    Shapes:
        ``(N, T, embed_dim) -> (N, T, embed_dim)``, ``T <= seq_len``
    """

    def __init__(self, embed_dim: int, num_heads: int, mlp_ratio: int, bias: bool, head_size: int,
                 rotary_dims: int, seq_len: int) -> None:
        super().__init__()
        self.num_heads, self.head_size, self.rotary_dims = num_heads, head_size, rotary_dims
        self.norm_1 = nn.LayerNorm(embed_dim, eps=_NORM_EPS)
        self.norm_2 = nn.LayerNorm(embed_dim, eps=_NORM_EPS)
        self.attn = nn.Linear(embed_dim, 3 * num_heads * head_size, bias=bias)
        self.proj = nn.Linear(num_heads * head_size, embed_dim, bias=bias)
        hidden = mlp_ratio * embed_dim
        self.fc_1 = nn.Linear(embed_dim, hidden, bias=bias)
        self.fc_2 = nn.Linear(embed_dim, hidden, bias=bias)
        self.mlp_proj = nn.Linear(hidden, embed_dim, bias=bias)
        cos, sin = _rope_tables(seq_len, rotary_dims)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        h, hs, r = self.num_heads, self.head_size, self.rotary_dims
        qkv = self.attn(x).view(n, t, h, 3, hs).permute(0, 2, 3, 1, 4)  # lit-gpt: (N, groups, q_per_kv + 2, T, hs)
        q, k, v = qkv.split((1, 1, 1), dim=2)
        q, k, v = q.reshape(n, h, t, hs), k.reshape(n, h, t, hs), v.reshape(n, h, t, hs)
        cos, sin = self.cos[:t], self.sin[:t]
        q = torch.cat((_apply_rope(q[..., :r], cos, sin), q[..., r:]), dim=-1)
        k = torch.cat((_apply_rope(k[..., :r], cos, sin), k[..., r:]), dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=1.0 / math.sqrt(hs), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(n, t, h * hs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self._attention(self.norm_1(x))
        m = self.norm_2(x)
        m = self.mlp_proj(F.silu(self.fc_1(m)) * self.fc_2(m))
        return m + a + x


class _Embed(nn.Module):
    """Token embedding alone: ``(N, T)`` int64 ids -> ``(N, T, embed_dim)``."""

    def __init__(self, vocab_size: int, embed_dim: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, embed_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.wte(input_ids)


class _Head(nn.Module):
    """Final LayerNorm and the untied vocabulary head: ``(N, T, embed_dim) -> (N, T, vocab_size)``."""

    def __init__(self, embed_dim: int, vocab_size: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(embed_dim, eps=_NORM_EPS)
        self.lm_head = nn.Linear(embed_dim, vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class HwGptModel(nn.Module):
    """The HW-GPT-Bench GPT from a validated ``hwgpt`` config.

    Shapes:
        ``input_ids (N, T)`` int64 -> logits ``(N, T, vocab_size)``, ``T <= seq_len``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        e = cfg["embed_dim"]
        self.embed = _Embed(cfg["vocab_size"], e)
        self.blocks = nn.ModuleList([
            HwGptBlock(e, h, r, cfg["bias"], cfg["head_size"], cfg["rotary_dims"], cfg["seq_len"])
            for h, r in zip(cfg["num_heads"], cfg["mlp_ratio"])
        ])
        self.head = _Head(e, cfg["vocab_size"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def hwgpt_param_count(config: dict[str, Any]) -> int:
    """Parameters of an ``hwgpt`` config: two embedding-sized tables (untied), per layer the qkv and output
    projections (``4 * heads * head_size * embed_dim``), the SwiGLU MLP (``3 * ratio * embed_dim**2``), two
    LayerNorms (``4 * embed_dim``) and, with ``bias``, the linears' biases; the final LayerNorm."""
    cfg = get_space("hwgpt").validate(config)
    e, hs, b = cfg["embed_dim"], cfg["head_size"], int(cfg["bias"])
    total = 2 * cfg["vocab_size"] * e + 2 * e
    for h, r in zip(cfg["num_heads"], cfg["mlp_ratio"]):
        total += 4 * h * hs * e + 3 * r * e * e + 4 * e
        total += b * (3 * h * hs + e + 2 * r * e + e)
    return total


@register_space("hwgpt")
class HwGptSpace(BlockSearchSpace):
    """HW-GPT-Bench's GPT family. Config keys:

    - ``embed_dim``: model width, 16..4096, a multiple of 16
    - ``depth``: decoder blocks, 1..64
    - ``num_heads``: heads of each block (a list of ``depth`` items, 1..64)
    - ``mlp_ratio``: SwiGLU hidden width over ``embed_dim`` of each block (a list of ``depth`` items, 1..8)
    - ``bias``: biases on the attention and MLP linears (LayerNorms always have one, the vocab head never)
    - ``seq_len``: tokens per sample, 1..8192 (HW-GPT-Bench: 1024)
    - ``vocab_size``: vocabulary (padded), 2..262144 (HW-GPT-Bench: 50254)
    - ``head_size``: 8..256 (HW-GPT-Bench: 64); ``rotary_dims``: rotary dims per head, even, <= head_size (16)

    Input: ``input_ids``, int64 ``(batch, seq_len)``; output: logits ``(batch, seq_len, vocab_size)``.
    """

    params = {
        "embed_dim": IntRange(16, 4096, multiple_of=16),
        "depth": IntRange(1, 64),
        "num_heads": ListOf(IntRange(1, 64), 1, 64),
        "mlp_ratio": ListOf(IntRange(1, 8), 1, 64),
        "bias": Choice(False, True),
        "seq_len": IntRange(1, 8192),
        "vocab_size": IntRange(2, 262_144),
        "head_size": IntRange(8, 256),
        "rotary_dims": IntRange(2, 256, multiple_of=2),
    }
    presets = {
        "hwgpt_s_max": {"embed_dim": 768, "depth": 12, "num_heads": [12] * 12, "mlp_ratio": [4] * 12},
        "hwgpt_m_max": {"embed_dim": 1024, "depth": 24, "num_heads": [16] * 24, "mlp_ratio": [4] * 24},
        "hwgpt_l_max": {"embed_dim": 1280, "depth": 36, "num_heads": [20] * 36, "mlp_ratio": [4] * 36},
    }
    def default_config(self) -> dict[str, Any]:
        return {"embed_dim": 768, "depth": 12, "num_heads": [12] * 12, "mlp_ratio": [4] * 12, "bias": False,
                "seq_len": 1024, "vocab_size": 50254, "head_size": 64, "rotary_dims": 16}

    def _check(self, cfg: dict[str, Any]) -> None:
        for key in ("num_heads", "mlp_ratio"):
            if len(cfg[key]) != cfg["depth"]:
                raise SearchSpaceError(f"hwgpt config {key!r} must have 'depth' ({cfg['depth']}) items, "
                                       f"got {len(cfg[key])}: {cfg[key]}")
        if cfg["rotary_dims"] > cfg["head_size"]:
            raise SearchSpaceError(f"hwgpt config 'rotary_dims' must be <= 'head_size' ({cfg['head_size']}), "
                                   f"got {cfg['rotary_dims']}")

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return HwGptModel(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Embedding, one block per layer (its heads and MLP ratio), final norm and vocab head."""
        n, e = config["seq_len"], config["embed_dim"]
        common = {"embed_dim": e, "bias": config["bias"], "head_size": config["head_size"],
                  "rotary_dims": config["rotary_dims"], "seq_len": n}
        blocks = [Block("embed", {"vocab_size": config["vocab_size"], "embed_dim": e},
                        (BlockInput("input_ids", (n,), "input_ids", "int64"),))]
        for i, (h, r) in enumerate(zip(config["num_heads"], config["mlp_ratio"])):
            blocks.append(Block("layer", {**common, "num_heads": h, "mlp_ratio": r}, (BlockInput((i, 0), (n, e)),)))
        blocks.append(Block("head", {"embed_dim": e, "vocab_size": config["vocab_size"]},
                            (BlockInput((len(blocks) - 1, 0), (n, e)),)))
        return BlockPlan(tuple(blocks), ((len(blocks) - 1, 0),))

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "embed":
            return _Embed(p["vocab_size"], p["embed_dim"])
        if kind == "layer":
            return HwGptBlock(p["embed_dim"], p["num_heads"], p["mlp_ratio"], p["bias"], p["head_size"],
                              p["rotary_dims"], p["seq_len"])
        if kind == "head":
            return _Head(p["embed_dim"], p["vocab_size"])
        raise SearchSpaceError(f"hwgpt has no block kind {kind!r}; kinds: ['embed', 'layer', 'head']")

    def input_spec(self, config: dict[str, Any], batch_size: int = 1, dtype: str = "float32") -> InputSpec:
        """Named int64 ``input_ids`` of shape ``(batch_size, seq_len)``, values below ``vocab_size``."""
        cfg = self.validate(config)
        return InputSpec(inputs=(TensorSpec("input_ids", (cfg["seq_len"],), "int64", high=cfg["vocab_size"]),),
                         batch_size=batch_size, dtype=dtype)

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        """HW-GPT-Bench space ``s`` choices at a drawn sequence length (64..1024)."""
        c = HWGPT_CHOICES["s"]
        depth = rng.choice(c["depth"])
        return {"embed_dim": rng.choice(c["embed_dim"]), "depth": depth,
                "num_heads": [rng.choice(c["num_heads"]) for _ in range(depth)],
                "mlp_ratio": [rng.choice(c["mlp_ratio"]) for _ in range(depth)], "bias": rng.random() < 0.5,
                "seq_len": rng.choice((64, 128, 256, 512, 1024)), "vocab_size": 50254, "head_size": 64,
                "rotary_dims": 16}
