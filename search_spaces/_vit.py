"""``vit``: Vision Transformer family (torchvision layout: conv patch embedding, pre-norm encoder)."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import TransformerBlock
from search_spaces._params import Choice, IntRange
from search_spaces._registry import register_space, weighted_choice

__all__ = ["ViTSpace", "VisionTransformer", "ViTEmbed", "ViTHead", "vit_encoder_parts", "build_vit_block"]

_EPS = 1e-6


class VisionTransformer(nn.Module):
    """A ViT from a validated ``vit`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``; inside, ``(N, T, embed_dim)`` with
        ``T = (R / patch_size)^2 (+ 1 class token)``.
    """

    def __init__(self, cfg: dict[str, Any], patch_embed: nn.Module | None = None) -> None:
        """``patch_embed``: a module mapping ``(N, 3, R, R)`` to ``(N, embed_dim, R / p, R / p)`` (default:
        ViT's patchify conv; ``vitc`` passes its conv stem)."""
        super().__init__()
        d, p = cfg["embed_dim"], cfg["patch_size"]
        n_patches = (cfg["resolution"] // p) ** 2
        self.use_cls = cfg["pool"] == "cls"
        self.patch_embed = patch_embed if patch_embed is not None else nn.Conv2d(3, d, p, stride=p)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if self.use_cls else None
        self.pos_embed = nn.Parameter(torch.randn(1, n_patches + int(self.use_cls), d) * 0.02)
        self.blocks = nn.Sequential(*[
            TransformerBlock(d, cfg["num_heads"], cfg["mlp_ratio"] * d, qkv_bias=cfg["qkv_bias"],
                             impl=cfg["attention"], norm_first=True, eps=_EPS)
            for _ in range(cfg["depth"])
        ])
        self.norm = nn.LayerNorm(d, eps=_EPS)
        self.head = nn.Linear(d, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.norm(self.blocks(x + self.pos_embed))
        x = x[:, 0] if self.use_cls else x.mean(dim=1)
        return self.head(x)


class ViTEmbed(nn.Module):
    """Token embedding alone (a block of the plan): the last patch-embedding conv (kernel = stride), tokens,
    class token, position embeddings, as in :class:`VisionTransformer`.

    Shapes:
        ``(N, cin, H, W) -> (N, T, embed_dim)`` with ``T = (H / kernel) * (W / kernel) (+ 1 class token)``
    """

    def __init__(self, cin: int, embed_dim: int, kernel: int, n_patches: int, use_cls: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, embed_dim, kernel, stride=kernel)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if use_cls else None
        self.pos_embed = nn.Parameter(torch.randn(1, n_patches + int(use_cls), embed_dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.pos_embed


class ViTHead(nn.Module):
    """The head alone (a block of the plan): final LayerNorm, class-token or mean pooling, classifier.

    Shapes:
        ``(N, T, dim) -> (N, num_classes)``
    """

    def __init__(self, dim: int, use_cls: bool, num_classes: int) -> None:
        super().__init__()
        self.use_cls = use_cls
        self.norm = nn.LayerNorm(dim, eps=_EPS)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        x = x[:, 0] if self.use_cls else x.mean(dim=1)
        return self.head(x)


def vit_encoder_parts(config: dict[str, Any], cin: int, kernel: int,
                      side: int) -> list[tuple[str, dict[str, Any], tuple[int, ...]]]:
    """Blocks of a ViT-style config after its conv stem: embedding (the conv of ``kernel`` over a
    ``(cin, side, side)`` map), the encoder layers, the head (shared by ``vit`` and ``vitc``)."""
    d, use_cls = config["embed_dim"], config["pool"] == "cls"
    n_patches = (side // kernel) ** 2
    tokens = (n_patches + int(use_cls), d)
    layer = {"dim": d, "num_heads": config["num_heads"], "mlp_dim": config["mlp_ratio"] * d,
             "qkv_bias": config["qkv_bias"], "attention": config["attention"]}
    return [("embed", {"cin": cin, "embed_dim": d, "kernel": kernel, "n_patches": n_patches, "cls": use_cls},
             (cin, side, side)),
            *[("layer", layer, tokens)] * config["depth"],
            ("head", {"dim": d, "cls": use_cls, "num_classes": config["num_classes"]}, tokens)]


def build_vit_block(kind: str, params: dict[str, Any]) -> nn.Module | None:
    """The module of a block made by :func:`vit_encoder_parts` (``None`` for another kind)."""
    p = params
    if kind == "embed":
        return ViTEmbed(p["cin"], p["embed_dim"], p["kernel"], p["n_patches"], p["cls"])
    if kind == "layer":
        return TransformerBlock(p["dim"], p["num_heads"], p["mlp_dim"], qkv_bias=p["qkv_bias"], impl=p["attention"],
                                norm_first=True, eps=_EPS)
    if kind == "head":
        return ViTHead(p["dim"], p["cls"], p["num_classes"])
    return None


@register_space("vit")
class ViTSpace(BlockSearchSpace):
    """Vision-Transformer family (a transformer encoder over image patches). Config keys:

    - ``patch_size``: patch side, one of 2, 4, 8, 14, 16, 32
    - ``embed_dim``: token width, 16..2048, a multiple of ``num_heads``
    - ``depth``: encoder layers, 1..48
    - ``num_heads``: attention heads, one of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32
    - ``mlp_ratio``: feed-forward hidden width / embed_dim, 1..8
    - ``qkv_bias``: bias on the QKV projection
    - ``pool``: ``"cls"`` (class token, its output is classified) or ``"mean"`` (no class token, mean of
      the patch tokens)
    - ``attention``: ``"sdpa"`` (``F.scaled_dot_product_attention``) or ``"explicit"`` (matmul,
      softmax, matmul) — the same maths, different operator graphs
    - ``resolution``: input side, 16..1024, a multiple of ``patch_size``
    - ``num_classes``: classifier outputs
    """

    params = {
        "patch_size": Choice(2, 4, 8, 14, 16, 32),
        "embed_dim": IntRange(16, 2048),
        "depth": IntRange(1, 48),
        "num_heads": Choice(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
        "mlp_ratio": IntRange(1, 8),
        "qkv_bias": Choice(True, False),
        "pool": Choice("cls", "mean"),
        "attention": Choice("sdpa", "explicit"),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "vit_b_16": {"patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12},
        "vit_s_16": {"patch_size": 16, "embed_dim": 384, "depth": 12, "num_heads": 6},
        "vit_ti_16": {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3},
    }

    def default_config(self) -> dict[str, Any]:
        return {"patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4, "qkv_bias": True,
                "pool": "cls", "attention": "sdpa", "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        if cfg["embed_dim"] % cfg["num_heads"]:
            raise SearchSpaceError(
                f"vit config 'embed_dim' must be a multiple of 'num_heads' ({cfg['num_heads']}), got {cfg['embed_dim']}"
            )
        if cfg["resolution"] % cfg["patch_size"]:
            raise SearchSpaceError(
                f"vit config 'resolution' must be a multiple of 'patch_size' ({cfg['patch_size']}), "
                f"got {cfg['resolution']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return VisionTransformer(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Patch embedding (with class token and position embeddings), ``depth`` identical layers, head."""
        return BlockPlan.chain(vit_encoder_parts(config, 3, config["patch_size"], config["resolution"]))

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        block = build_vit_block(kind, params)
        if block is None:
            raise SearchSpaceError(f"vit has no block kind {kind!r}; kinds: ['embed', 'layer', 'head']")
        return block

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 224), (3, 2, 2, 2, 1, 1))
        # at most 14 x 14 patch tokens and width 384, so most draws stay small enough to measure on a CPU
        patch = rng.choice([p for p in (4, 8, 16, 32) if resolution % p == 0 and 4 <= resolution // p <= 14])
        head_dim = rng.choice((16, 32, 64))
        heads = rng.choice((1, 2, 3, 4, 6))
        return {
            "patch_size": patch, "embed_dim": head_dim * heads, "depth": rng.randint(1, 8), "num_heads": heads,
            "mlp_ratio": rng.choice((2, 3, 4)), "qkv_bias": rng.random() < 0.8,
            "pool": rng.choice(("cls", "mean")), "attention": rng.choice(("sdpa", "explicit")),
            "resolution": resolution, "num_classes": rng.choice((10, 100, 1000)),
        }
