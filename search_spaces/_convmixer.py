"""``convmixer``: ConvMixer family (Trockman & Kolter 2022, "Patches Are All You Need?"; timm layout).

- patch embedding: conv ``3 -> dim`` with kernel = stride = ``patch_size`` (bias), activation, BN;
- ``depth`` blocks, each: Residual(depthwise ``kernel_size x kernel_size`` conv (bias, "same" padding),
  activation, BN) then 1x1 conv ``dim -> dim`` (bias), activation, BN;
- global average pool, flatten, Linear ``dim -> num_classes``.

The activation is GELU or ReLU for the whole net (timm's ``convmixer_768_32`` uses ReLU, the others GELU).
Kernel sizes are odd, so "same" padding is the explicit padding ``(kernel_size - 1) // 2`` (identical to
timm's ``padding="same"``, with a static shape ``torch.export`` handles). The presets have exactly the
parameter counts of timm's models of those names built with ``pretrained=False``: ``convmixer_768_32``
21,110,248 and ``convmixer_1536_20`` 51,625,960.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import PoolLinear, make_activation
from search_spaces._params import Choice, IntRange
from search_spaces._registry import log_uniform_int, register_space, weighted_choice

__all__ = ["ConvMixerSpace", "ConvMixer"]

_SAMPLE_MACS = 250e6  # the sampler's cap on the blocks' batch-1 multiply-accumulates


class ConvMixerBlock(nn.Module):
    """``x + BN(act(dwconv(x)))`` then ``BN(act(pwconv(.)))``.

    Shapes:
        ``(N, dim, H, W) -> (N, dim, H, W)``
    """

    def __init__(self, dim: int, kernel_size: int, activation: str) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size, padding=(kernel_size - 1) // 2, groups=dim, bias=True)
        self.act1 = make_activation(activation)
        self.bn1 = nn.BatchNorm2d(dim)
        self.pwconv = nn.Conv2d(dim, dim, 1, bias=True)
        self.act2 = make_activation(activation)
        self.bn2 = nn.BatchNorm2d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.bn1(self.act1(self.dwconv(x)))
        return self.bn2(self.act2(self.pwconv(x)))


def _stem(dim: int, patch_size: int, activation: str) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, dim, patch_size, stride=patch_size, bias=True), make_activation(activation),
                         nn.BatchNorm2d(dim))


class ConvMixer(nn.Module):
    """A ConvMixer from a validated ``convmixer`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``; the blocks run at ``(N, dim, R // p, R // p)``.
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        dim, p, act = cfg["dim"], cfg["patch_size"], cfg["activation"]
        self.stem = _stem(dim, p, act)
        self.blocks = nn.Sequential(*[ConvMixerBlock(dim, cfg["kernel_size"], act) for _ in range(cfg["depth"])])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(dim, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


@register_space("convmixer")
class ConvMixerSpace(BlockSearchSpace):
    """ConvMixer family. Config keys:

    - ``dim``: channels of every layer, 8..4096
    - ``depth``: ConvMixer blocks, 1..64
    - ``kernel_size``: depthwise kernel, odd, 3..15
    - ``patch_size``: patch-embedding kernel and stride, 1..32
    - ``activation``: ``"gelu"`` or ``"relu"``
    - ``resolution``: input side, 16..1024; must be >= ``patch_size``
    - ``num_classes``: classifier outputs

    The sampler draws resolution, a patch size giving a 4..32 patch grid, depth 2..16, kernel 3..9, the
    activation and then dim log-uniformly from 16 up to the widest (<= 512) whose blocks stay within
    ~250 M batch-1 MACs.
    """

    params = {
        "dim": IntRange(8, 4096),
        "depth": IntRange(1, 64),
        "kernel_size": Choice(3, 5, 7, 9, 11, 13, 15),
        "patch_size": IntRange(1, 32),
        "activation": Choice("gelu", "relu"),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "convmixer_768_32": {"dim": 768, "depth": 32, "kernel_size": 7, "patch_size": 7, "activation": "relu"},
        "convmixer_1536_20": {"dim": 1536, "depth": 20, "kernel_size": 9, "patch_size": 7, "activation": "gelu"},
    }

    def default_config(self) -> dict[str, Any]:
        return {"dim": 768, "depth": 32, "kernel_size": 7, "patch_size": 7, "activation": "relu",
                "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        if cfg["resolution"] < cfg["patch_size"]:
            raise SearchSpaceError(
                f"convmixer config 'resolution' must be >= 'patch_size' ({cfg['patch_size']}), "
                f"got {cfg['resolution']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return ConvMixer(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Patch embedding, ``depth`` identical blocks, pool + classifier."""
        dim, p, side = config["dim"], config["patch_size"], config["resolution"]
        inner = side // p
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
            ("stem", {"dim": dim, "patch_size": p, "activation": config["activation"]}, (3, side, side))]
        parts += [("block", {"dim": dim, "kernel_size": config["kernel_size"], "activation": config["activation"]},
                   (dim, inner, inner))] * config["depth"]
        parts.append(("head", {"cin": dim, "num_classes": config["num_classes"]}, (dim, inner, inner)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "stem":
            return _stem(params["dim"], params["patch_size"], params["activation"])
        if kind == "block":
            return ConvMixerBlock(params["dim"], params["kernel_size"], params["activation"])
        if kind == "head":
            return PoolLinear(params["cin"], params["num_classes"])
        raise SearchSpaceError(f"convmixer has no block kind {kind!r}; kinds: ['stem', 'block', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (2, 2, 2, 2, 1, 1, 1))
        patch = rng.choice([p for p in (1, 2, 4, 7, 8, 14, 16) if resolution % p == 0 and 4 <= resolution // p <= 32]
                           or [resolution // 8])
        depth = rng.randint(2, 16)
        kernel = weighted_choice(rng, (3, 5, 7, 9), (1, 1, 2, 2))
        # widest dim whose blocks stay within the MAC budget: grid^2 * depth * (dim^2 + dim * k^2) <= budget
        tokens = (resolution // patch) ** 2 * depth
        hi = (-kernel ** 2 + math.sqrt(kernel ** 4 + 4 * _SAMPLE_MACS / tokens)) / 2
        hi = max(32, min(512, int(hi) // 16 * 16))
        return {
            "dim": log_uniform_int(rng, 16, hi, multiple_of=16), "depth": depth,
            "kernel_size": kernel, "patch_size": patch,
            "activation": rng.choice(("gelu", "relu")), "resolution": resolution,
            "num_classes": rng.choice((10, 100, 1000)),
        }
