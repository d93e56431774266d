"""``mixer``: MLP-Mixer family (Tolstikhin et al. 2021, "MLP-Mixer: An all-MLP Architecture for Vision"; timm layout).

- patch embedding: conv ``3 -> hidden`` with kernel = stride = ``patch_size`` (bias), flattened to tokens
  ``(N, T, hidden)`` with ``T = (resolution / patch_size)^2``;
- ``depth`` blocks, each:

  - token mixing: ``x + transpose(fc2(GELU(fc1(transpose(LayerNorm(x))))))`` — the MLP runs over the token
    axis, ``Linear(T -> tokens_mlp_dim)``, GELU, ``Linear(tokens_mlp_dim -> T)``;
  - channel mixing: ``x + fc2(GELU(fc1(LayerNorm(x))))`` with ``Linear(hidden -> channels_mlp_dim)``, GELU,
    ``Linear(channels_mlp_dim -> hidden)``;

- final LayerNorm, mean over the tokens, Linear ``hidden -> num_classes``.

Every LayerNorm has eps 1e-6 and every Linear a bias, as in timm's ``MlpMixer``. Dropout and stochastic depth
are identities in eval mode and are left out (they hold no parameters). The presets have exactly the
parameter counts of timm's models of those names built with ``pretrained=False`` (timm's MLP dims are
0.5x / 4x ``hidden``): ``mixer_s16_224`` 18,528,264 and ``mixer_b16_224`` 59,880,472.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._params import IntRange
from search_spaces._registry import log_uniform_int, register_space, weighted_choice

__all__ = ["MixerSpace", "MlpMixer"]

_EPS = 1e-6  # timm's MlpMixer LayerNorm eps


class MixerMlp(nn.Sequential):
    """``Linear(dim -> hidden)`` -> GELU -> ``Linear(hidden -> dim)`` over the last axis.

    Shapes:
        ``(..., dim) -> (..., dim)``
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class MixerBlock(nn.Module):
    """One Mixer layer: token-mixing MLP then channel-mixing MLP, each pre-norm with a residual.

    Args:
        tokens: number of tokens ``T``.
        dim: channels ``C``.
        tokens_mlp_dim: hidden width of the token-mixing MLP.
        channels_mlp_dim: hidden width of the channel-mixing MLP.

    Shapes:
        ``(N, T, C) -> (N, T, C)``
    """

    def __init__(self, tokens: int, dim: int, tokens_mlp_dim: int, channels_mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=_EPS)
        self.mlp_tokens = MixerMlp(tokens, tokens_mlp_dim)
        self.norm2 = nn.LayerNorm(dim, eps=_EPS)
        self.mlp_channels = MixerMlp(dim, channels_mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp_channels(self.norm2(x))


class MixerStem(nn.Module):
    """Patch embedding alone (a block of the plan): conv (kernel = stride = patch), flattened to tokens.

    Shapes:
        ``(N, 3, R, R) -> (N, T, hidden)``
    """

    def __init__(self, hidden: int, patch_size: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, hidden, patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x).flatten(2).transpose(1, 2)


class MixerHead(nn.Module):
    """The head alone (a block of the plan): final LayerNorm, mean over the tokens, classifier.

    Shapes:
        ``(N, T, hidden) -> (N, num_classes)``
    """

    def __init__(self, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=_EPS)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x).mean(dim=1))


class MlpMixer(nn.Module):
    """An MLP-Mixer from a validated ``mixer`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``; inside, ``(N, T, hidden)`` with ``T = (R / patch_size)^2``.
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        c, p = cfg["hidden"], cfg["patch_size"]
        tokens = (cfg["resolution"] // p) ** 2
        self.stem = nn.Conv2d(3, c, p, stride=p)
        self.blocks = nn.Sequential(*[
            MixerBlock(tokens, c, cfg["tokens_mlp_dim"], cfg["channels_mlp_dim"]) for _ in range(cfg["depth"])
        ])
        self.norm = nn.LayerNorm(c, eps=_EPS)
        self.head = nn.Linear(c, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


@register_space("mixer")
class MixerSpace(BlockSearchSpace):
    """MLP-Mixer family. Config keys:

    - ``patch_size``: patch-embedding kernel and stride, 1..64
    - ``hidden``: channels ``C`` of every token, 8..4096
    - ``depth``: Mixer blocks, 1..64
    - ``tokens_mlp_dim``: hidden width of the token-mixing MLP (timm: ``hidden / 2``), 4..16384
    - ``channels_mlp_dim``: hidden width of the channel-mixing MLP (timm: ``4 * hidden``), 4..16384
    - ``resolution``: input side, 16..1024, a multiple of ``patch_size``
    - ``num_classes``: classifier outputs

    The sampler draws resolution, a patch size giving a 4..14 patch grid (16..196 tokens), hidden
    (log-uniform 32..384), depth 1..10, a token-MLP width of 1/4..1x hidden and a channel-MLP width of
    2..4x hidden, so most draws stay under ~300 M MACs.
    """

    params = {
        "patch_size": IntRange(1, 64),
        "hidden": IntRange(8, 4096),
        "depth": IntRange(1, 64),
        "tokens_mlp_dim": IntRange(4, 16384),
        "channels_mlp_dim": IntRange(4, 16384),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "mixer_s16_224": {"patch_size": 16, "hidden": 512, "depth": 8, "tokens_mlp_dim": 256,
                          "channels_mlp_dim": 2048},
        "mixer_b16_224": {"patch_size": 16, "hidden": 768, "depth": 12, "tokens_mlp_dim": 384,
                          "channels_mlp_dim": 3072},
    }

    def default_config(self) -> dict[str, Any]:
        return {"patch_size": 16, "hidden": 512, "depth": 8, "tokens_mlp_dim": 256, "channels_mlp_dim": 2048,
                "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        if cfg["resolution"] % cfg["patch_size"]:
            raise SearchSpaceError(
                f"mixer config 'resolution' must be a multiple of 'patch_size' ({cfg['patch_size']}), "
                f"got {cfg['resolution']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return MlpMixer(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Patch embedding, ``depth`` identical Mixer blocks, head."""
        c, p, side = config["hidden"], config["patch_size"], config["resolution"]
        tokens = (side // p) ** 2
        return BlockPlan.chain([
            ("stem", {"hidden": c, "patch_size": p}, (3, side, side)),
            *[("block", {"tokens": tokens, "hidden": c, "tokens_mlp_dim": config["tokens_mlp_dim"],
                         "channels_mlp_dim": config["channels_mlp_dim"]}, (tokens, c))] * config["depth"],
            ("head", {"hidden": c, "num_classes": config["num_classes"]}, (tokens, c)),
        ])

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "stem":
            return MixerStem(p["hidden"], p["patch_size"])
        if kind == "block":
            return MixerBlock(p["tokens"], p["hidden"], p["tokens_mlp_dim"], p["channels_mlp_dim"])
        if kind == "head":
            return MixerHead(p["hidden"], p["num_classes"])
        raise SearchSpaceError(f"mixer has no block kind {kind!r}; kinds: ['stem', 'block', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 224), (3, 2, 2, 2, 1, 1))
        # at most 14 x 14 tokens, hidden <= 384 and 10 blocks, so most draws stay small enough to measure on a CPU
        patch = rng.choice([p for p in (4, 8, 16, 32) if resolution % p == 0 and 4 <= resolution // p <= 14])
        hidden = log_uniform_int(rng, 32, 384, multiple_of=16)
        return {
            "patch_size": patch, "hidden": hidden, "depth": rng.randint(1, 10),
            "tokens_mlp_dim": max(8, int(hidden * rng.choice((0.25, 0.5, 1.0))) // 8 * 8),
            "channels_mlp_dim": hidden * rng.choice((2, 3, 4)),
            "resolution": resolution, "num_classes": rng.choice((10, 100, 1000)),
        }
