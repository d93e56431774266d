"""``vitc``: Vision Transformer with a convolutional stem (Xiao et al. 2021, "Early Convolutions Help
Transformers See Better").

- stem: ``log2(patch_size)`` layers of 3x3 conv stride 2 (padding 1, no bias), BatchNorm, ReLU, with
  ``stem_widths[i]`` output channels, then a 1x1 conv (bias) ``stem_widths[-1] -> embed_dim``; it
  downsamples by ``patch_size`` like ViT's patchify conv, so the token grid is ``resolution / patch_size``;
- tokens ``(N, T, embed_dim)``, an optional class token, learned position embeddings;
- the pre-norm transformer encoder of the ``vit`` family (:class:`~search_spaces._layers.TransformerBlock`,
  LayerNorm eps 1e-6), final LayerNorm, class-token or mean pooling, Linear head.

The paper's ViT_C models drop one transformer block to pay for the stem. Its stems are plain stride-2
stacks for the 1GF and 4GF models (the two presets, described here without a parameter-count claim); the
larger ones mix in stride-1 convs, which this family does not express.
"""

from __future__ import annotations

import random
from typing import Any

from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import ConvBNAct, conv_out
from search_spaces._vit import VisionTransformer, build_vit_block, vit_encoder_parts
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import log_uniform_int, register_space, weighted_choice

__all__ = ["ViTCSpace", "ConvStemViT"]

#: effective patch size -> number of stride-2 stem convs
_STEM_LAYERS = {4: 2, 8: 3, 16: 4, 32: 5}


def ConvStemViT(cfg: dict[str, Any]) -> VisionTransformer:  # noqa: N802 (a model constructor)
    """A ViT with a convolutional stem, from a validated ``vitc`` config: ``vit``'s encoder with the stem as
    its patch embedding.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``; the stem gives ``(N, embed_dim, R / p, R / p)``; the encoder
        runs on ``(N, T, embed_dim)`` with ``T = (R / p)^2 (+ 1 class token)``.
    """
    widths = [3, *cfg["stem_widths"]]
    stem = nn.Sequential(
        *[ConvBNAct(cin, cout, 3, stride=2, act="relu") for cin, cout in zip(widths[:-1], widths[1:])],
        nn.Conv2d(widths[-1], cfg["embed_dim"], 1),
    )
    return VisionTransformer(cfg, patch_embed=stem)


@register_space("vitc")
class ViTCSpace(BlockSearchSpace):
    """ViT with a convolutional stem (ViT_C). Config keys:

    - ``patch_size``: effective patch side (the stem's total stride), one of 4, 8, 16, 32
    - ``stem_widths``: output channels of the stride-2 3x3 convs, 2..5 ints in 8..1024, exactly
      ``log2(patch_size)`` of them (2, 3, 4, 5)
    - ``embed_dim``: token width, 16..2048, a multiple of ``num_heads``
    - ``depth``: encoder layers, 1..48
    - ``num_heads``: attention heads, one of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32
    - ``mlp_ratio``: feed-forward hidden width / embed_dim, 1..8
    - ``qkv_bias``: bias on the QKV projection
    - ``pool``: ``"cls"`` (class token) or ``"mean"`` (no class token, mean of the patch tokens)
    - ``attention``: ``"sdpa"`` or ``"explicit"``, as in ``vit``
    - ``resolution``: input side, 16..1024, a multiple of ``patch_size``
    - ``num_classes``: classifier outputs

    The sampler draws resolution, a patch size giving a 4..14 patch grid, a stem that doubles its width
    from a first width of 8..48 (capped at 512), and a small encoder like ``vit``'s sampler.
    """

    params = {
        "patch_size": Choice(4, 8, 16, 32),
        "stem_widths": ListOf(IntRange(8, 1024), 2, 5),
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
    # The paper's ViT_C-1GF and -4GF (stem widths, 11 = 12 - 1 blocks, MLP ratio 3); no count claim.
    presets = {
        "vitc_1gf": {"patch_size": 16, "stem_widths": [24, 48, 96, 192], "embed_dim": 192, "depth": 11,
                     "num_heads": 3, "mlp_ratio": 3},
        "vitc_4gf": {"patch_size": 16, "stem_widths": [48, 96, 192, 384], "embed_dim": 384, "depth": 11,
                     "num_heads": 6, "mlp_ratio": 3},
    }

    def default_config(self) -> dict[str, Any]:
        return {"patch_size": 16, "stem_widths": [48, 96, 192, 384], "embed_dim": 384, "depth": 11, "num_heads": 6,
                "mlp_ratio": 3, "qkv_bias": True, "pool": "cls", "attention": "sdpa", "resolution": 224,
                "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        p, n = cfg["patch_size"], len(cfg["stem_widths"])
        if n != _STEM_LAYERS[p]:
            raise SearchSpaceError(
                f"vitc config 'stem_widths' must have log2('patch_size') = {_STEM_LAYERS[p]} items for "
                f"patch_size {p}, got {n}: {cfg['stem_widths']}"
            )
        if cfg["embed_dim"] % cfg["num_heads"]:
            raise SearchSpaceError(
                f"vitc config 'embed_dim' must be a multiple of 'num_heads' ({cfg['num_heads']}), "
                f"got {cfg['embed_dim']}"
            )
        if cfg["resolution"] % p:
            raise SearchSpaceError(
                f"vitc config 'resolution' must be a multiple of 'patch_size' ({p}), got {cfg['resolution']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return ConvStemViT(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Every stride-2 stem conv, the token embedding (the stem's 1x1 conv), the encoder layers, head."""
        side, cin = config["resolution"], 3
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = []
        for w in config["stem_widths"]:
            parts.append(("stem_conv", {"cin": cin, "cout": w}, (cin, side, side)))
            cin, side = w, conv_out(side, 3, 2, 1)
        return BlockPlan.chain(parts + vit_encoder_parts(config, cin, 1, side))

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "stem_conv":
            return ConvBNAct(params["cin"], params["cout"], 3, stride=2, act="relu")
        block = build_vit_block(kind, params)
        if block is None:
            raise SearchSpaceError(f"vitc has no block kind {kind!r}; kinds: ['stem_conv', 'embed', 'layer', 'head']")
        return block

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 224), (3, 2, 2, 2, 1, 1))
        patch = rng.choice([p for p in (4, 8, 16, 32) if resolution % p == 0 and 4 <= resolution // p <= 14])
        first = log_uniform_int(rng, 8, 48, multiple_of=8)
        head_dim = rng.choice((16, 32, 64))
        heads = rng.choice((1, 2, 3, 4, 6))
        return {
            "patch_size": patch, "stem_widths": [min(512, first * 2 ** i) for i in range(_STEM_LAYERS[patch])],
            "embed_dim": head_dim * heads, "depth": rng.randint(1, 8), "num_heads": heads,
            "mlp_ratio": rng.choice((2, 3, 4)), "qkv_bias": rng.random() < 0.8,
            "pool": rng.choice(("cls", "mean")), "attention": rng.choice(("sdpa", "explicit")),
            "resolution": resolution, "num_classes": rng.choice((10, 100, 1000)),
        }
