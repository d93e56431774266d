"""``convnext``: ConvNeXt family (torchvision layout: patchify stem, depthwise-conv + inverted-MLP blocks)."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import LayerNorm2d
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import register_space, weighted_choice

__all__ = ["ConvNeXtSpace", "ConvNeXt"]

_EPS = 1e-6
_LAYER_SCALE_INIT = 1e-6


class ConvNeXtBlock(nn.Module):
    """dwconv kxk -> (NHWC) LayerNorm -> Linear (ratio x) -> GELU -> Linear -> layer scale -> + input.

    Shapes:
        ``(N, C, H, W) -> (N, C, H, W)``
    """

    def __init__(self, dim: int, kernel: int, mlp_ratio: int, layer_scale: bool) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel, padding=(kernel - 1) // 2, groups=dim, bias=True)
        self.norm = nn.LayerNorm(dim, eps=_EPS)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), _LAYER_SCALE_INIT)) if layer_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.fc2(self.act(self.fc1(self.norm(y))))
        if self.gamma is not None:
            y = y * self.gamma
        return x + y.permute(0, 3, 1, 2)


def _stem(width: int, patch_size: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, patch_size, stride=patch_size), LayerNorm2d(width, eps=_EPS))


def _downsample(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(LayerNorm2d(cin, eps=_EPS), nn.Conv2d(cin, cout, 2, stride=2))


class ConvNeXtHead(nn.Module):
    """The head alone (a block of the plan): pool, LayerNorm, classifier, as in :class:`ConvNeXt`.

    Shapes:
        ``(N, cin, H, W) -> (N, num_classes)``
    """

    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm = LayerNorm2d(cin, eps=_EPS)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.norm(self.pool(x)), 1))


class ConvNeXt(nn.Module):
    """A ConvNeXt from a validated ``convnext`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        widths, p = cfg["widths"], cfg["patch_size"]
        self.stem = _stem(widths[0], p)
        stages: list[nn.Module] = []
        for i, (depth, dim) in enumerate(zip(cfg["depths"], widths)):
            if i > 0:
                stages.append(_downsample(widths[i - 1], dim))
            stages.append(nn.Sequential(*[
                ConvNeXtBlock(dim, cfg["kernel_size"], cfg["mlp_ratio"], cfg["layer_scale"]) for _ in range(depth)
            ]))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm = LayerNorm2d(widths[-1], eps=_EPS)
        self.fc = nn.Linear(widths[-1], cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.pool(self.stages(self.stem(x))))
        return self.fc(torch.flatten(x, 1))


@register_space("convnext")
class ConvNeXtSpace(BlockSearchSpace):
    """ConvNeXt-like family. Config keys:

    - ``depths``: blocks per stage, 1..5 stages of 1..64 blocks
    - ``widths``: channels per stage (same length), multiples of 8 in 8..2048
    - ``kernel_size``: depthwise kernel, 3, 5 or 7
    - ``mlp_ratio``: hidden width of the block MLP / width, 1..4
    - ``patch_size``: stem patchify stride, 2 or 4
    - ``layer_scale``: learnable per-channel scale on each block's branch
    - ``resolution``: input side, 16..1024; must be >= patch_size x 2^(stages - 1)
    - ``num_classes``: classifier outputs
    """

    params = {
        "depths": ListOf(IntRange(1, 64), 1, 5),
        "widths": ListOf(IntRange(8, 2048, multiple_of=8), 1, 5),
        "kernel_size": Choice(3, 5, 7),
        "mlp_ratio": IntRange(1, 4),
        "patch_size": Choice(2, 4),
        "layer_scale": Choice(True, False),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "convnext_tiny": {"depths": [3, 3, 9, 3], "widths": [96, 192, 384, 768]},
        "convnext_small": {"depths": [3, 3, 27, 3], "widths": [96, 192, 384, 768]},
    }

    def default_config(self) -> dict[str, Any]:
        return {"depths": [3, 3, 9, 3], "widths": [96, 192, 384, 768], "kernel_size": 7, "mlp_ratio": 4,
                "patch_size": 4, "layer_scale": True, "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        if len(cfg["depths"]) != len(cfg["widths"]):
            raise SearchSpaceError(
                f"convnext config 'depths' and 'widths' must have the same length (one entry per stage), got "
                f"{len(cfg['depths'])} and {len(cfg['widths'])}"
            )
        need = cfg["patch_size"] * 2 ** (len(cfg["depths"]) - 1)
        if cfg["resolution"] < need:
            raise SearchSpaceError(
                f"convnext config 'resolution' must be >= patch_size x 2^(stages-1) = {need}, got {cfg['resolution']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return ConvNeXt(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Stem, each stage's downsampling layer and blocks, head."""
        widths, p, side = config["widths"], config["patch_size"], config["resolution"]
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
            ("stem", {"width": widths[0], "patch_size": p}, (3, side, side))]
        side //= p
        for i, (depth, dim) in enumerate(zip(config["depths"], widths)):
            if i > 0:
                parts.append(("downsample", {"cin": widths[i - 1], "cout": dim}, (widths[i - 1], side, side)))
                side //= 2
            parts += [("block", {"dim": dim, "kernel": config["kernel_size"], "mlp_ratio": config["mlp_ratio"],
                                 "layer_scale": config["layer_scale"]}, (dim, side, side))] * depth
        parts.append(("head", {"cin": widths[-1], "num_classes": config["num_classes"]}, (widths[-1], side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "stem":
            return _stem(p["width"], p["patch_size"])
        if kind == "downsample":
            return _downsample(p["cin"], p["cout"])
        if kind == "block":
            return ConvNeXtBlock(p["dim"], p["kernel"], p["mlp_ratio"], p["layer_scale"])
        if kind == "head":
            return ConvNeXtHead(p["cin"], p["num_classes"])
        raise SearchSpaceError(f"convnext has no block kind {kind!r}; kinds: ['stem', 'downsample', 'block', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (2, 2, 2, 2, 1, 1, 1))
        patch = 2 if resolution <= 64 and rng.random() < 0.5 else 4
        n_stages = 4 if resolution >= 32 * patch // 2 else 3
        base = rng.choice((16, 24, 32, 48, 64, 96))
        depths = [rng.randint(1, 3) for _ in range(n_stages)]
        depths[min(2, n_stages - 1)] = rng.randint(1, 6)
        return {
            "depths": depths, "widths": [base * 2 ** i for i in range(n_stages)],
            "kernel_size": weighted_choice(rng, (3, 5, 7), (1, 1, 2)), "mlp_ratio": rng.choice((2, 3, 4)),
            "patch_size": patch, "layer_scale": rng.random() < 0.8, "resolution": resolution,
            "num_classes": rng.choice((10, 100, 1000)),
        }
