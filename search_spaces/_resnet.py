"""``resnet``: ResNet / ResNeXt / wide-ResNet family (torchvision layout, post-activation blocks)."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import PoolLinear, conv_out
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import register_space, weighted_choice

__all__ = ["ResNetSpace", "ResNet"]


class BasicBlock(nn.Module):
    """3x3 -> 3x3 residual block (ResNet-18/34).

    Shapes:
        ``(N, cin, H, W) -> (N, planes, H / stride, W / stride)``
    """

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, groups: int = 1, width_per_group: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.downsample = _downsample(cin, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + identity)


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (grouped, strided) -> 1x1 residual block (ResNet-50+, ResNeXt, wide ResNet).

    The middle width is ``int(planes * width_per_group / 64) * groups`` and the output ``4 * planes``.

    Shapes:
        ``(N, cin, H, W) -> (N, 4 * planes, H / stride, W / stride)``
    """

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, groups: int = 1, width_per_group: int = 64) -> None:
        super().__init__()
        width = int(planes * (width_per_group / 64.0)) * groups
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = _downsample(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


def _downsample(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


def _stem(kind: str, width: int) -> nn.Module:
    if kind == "imagenet":  # 7x7/2 conv + 3x3/2 max-pool
        return nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    # "cifar": 3x3/1 conv
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())


class ResNet(nn.Module):
    """A ResNet from a validated ``resnet`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        block = BasicBlock if cfg["block"] == "basic" else Bottleneck
        stem_w = cfg["stem_width"]
        self.stem = _stem(cfg["stem"], stem_w)
        stages, cin = [], stem_w
        for i, (depth, planes) in enumerate(zip(cfg["depths"], cfg["widths"])):
            blocks = []
            for j in range(depth):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(block(cin, planes, stride, cfg["groups"], cfg["width_per_group"]))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


@register_space("resnet")
class ResNetSpace(BlockSearchSpace):
    """ResNet-like family. Config keys:

    - ``block``: ``"basic"`` (two 3x3) or ``"bottleneck"`` (1x1-3x3-1x1, output 4x planes)
    - ``depths``: blocks per stage, 1..6 stages of 1..64 blocks
    - ``widths``: planes per stage (same length as ``depths``), multiples of 8 in 8..1024
    - ``stem``: ``"imagenet"`` (7x7/2 conv + max-pool, /4) or ``"cifar"`` (3x3/1 conv)
    - ``stem_width``: stem channels, multiple of 8 in 8..256
    - ``groups``: 3x3 conv groups (ResNeXt cardinality) in {1, 2, 4, 8, 16, 32, 64}; bottleneck only
    - ``width_per_group``: bottleneck width per group (64 = plain ResNet, 128 = wide, 4 with 32 groups
      = ResNeXt-32x4d); basic blocks need 64
    - ``resolution``: input side, 16..1024
    - ``num_classes``: classifier outputs

    Stage 0 keeps the resolution, every later stage halves it with its first block.
    """

    params = {
        "block": Choice("basic", "bottleneck"),
        "depths": ListOf(IntRange(1, 64), 1, 6),
        "widths": ListOf(IntRange(8, 1024, multiple_of=8), 1, 6),
        "stem": Choice("imagenet", "cifar"),
        "stem_width": IntRange(8, 256, multiple_of=8),
        "groups": Choice(1, 2, 4, 8, 16, 32, 64),
        "width_per_group": IntRange(4, 256, multiple_of=4),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "resnet18": {"block": "basic", "depths": [2, 2, 2, 2], "widths": [64, 128, 256, 512]},
        "resnet34": {"block": "basic", "depths": [3, 4, 6, 3], "widths": [64, 128, 256, 512]},
        "resnet50": {"block": "bottleneck", "depths": [3, 4, 6, 3], "widths": [64, 128, 256, 512]},
        "resnet101": {"block": "bottleneck", "depths": [3, 4, 23, 3], "widths": [64, 128, 256, 512]},
        "resnext50_32x4d": {"block": "bottleneck", "depths": [3, 4, 6, 3], "widths": [64, 128, 256, 512],
                            "groups": 32, "width_per_group": 4},
        "wide_resnet50_2": {"block": "bottleneck", "depths": [3, 4, 6, 3], "widths": [64, 128, 256, 512],
                            "width_per_group": 128},
        # CIFAR ResNet-20 shape, but with 1x1-conv projection shortcuts where the paper (option A) pads
        # with zeros: 272,474 parameters here, slightly more than the paper's model.
        "resnet20_cifar": {"block": "basic", "depths": [3, 3, 3], "widths": [16, 32, 64], "stem": "cifar",
                           "stem_width": 16, "resolution": 32, "num_classes": 10},
    }

    def default_config(self) -> dict[str, Any]:
        return {
            "block": "basic", "depths": [2, 2, 2, 2], "widths": [64, 128, 256, 512], "stem": "imagenet",
            "stem_width": 64, "groups": 1, "width_per_group": 64, "resolution": 224, "num_classes": 1000,
        }

    def _check(self, cfg: dict[str, Any]) -> None:
        if len(cfg["depths"]) != len(cfg["widths"]):
            raise SearchSpaceError(
                f"resnet config 'depths' and 'widths' must have the same length (one entry per stage), got "
                f"{len(cfg['depths'])} and {len(cfg['widths'])}"
            )
        if cfg["block"] == "basic" and (cfg["groups"] != 1 or cfg["width_per_group"] != 64):
            raise SearchSpaceError(
                "resnet config with block 'basic' needs groups=1 and width_per_group=64, got "
                f"groups={cfg['groups']}, width_per_group={cfg['width_per_group']}"
            )
        for planes in cfg["widths"]:
            if int(planes * cfg["width_per_group"] / 64.0) < 1:
                raise SearchSpaceError(
                    f"resnet config: widths entry {planes} x width_per_group {cfg['width_per_group']} / 64 "
                    "must be >= 1 (the bottleneck's per-group width)"
                )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return ResNet(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Stem, every residual block ``(cin, planes, stride, groups, width_per_group)``, pool + classifier."""
        side = config["resolution"]
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
            ("stem", {"stem": config["stem"], "width": config["stem_width"]}, (3, side, side))]
        if config["stem"] == "imagenet":
            side = conv_out(conv_out(side, 7, 2, 3), 3, 2, 1)
        kind = config["block"]
        expansion = 1 if kind == "basic" else 4
        cin = config["stem_width"]
        for i, (depth, planes) in enumerate(zip(config["depths"], config["widths"])):
            for j in range(depth):
                stride = 2 if (i > 0 and j == 0) else 1
                parts.append((kind, {"cin": cin, "planes": planes, "stride": stride, "groups": config["groups"],
                                     "width_per_group": config["width_per_group"]}, (cin, side, side)))
                side = conv_out(side, 3, stride, 1)
                cin = planes * expansion
        parts.append(("head", {"cin": cin, "num_classes": config["num_classes"]}, (cin, side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "stem":
            return _stem(params["stem"], params["width"])
        if kind in ("basic", "bottleneck"):
            block = BasicBlock if kind == "basic" else Bottleneck
            return block(params["cin"], params["planes"], params["stride"], params["groups"],
                         params["width_per_group"])
        if kind == "head":
            return PoolLinear(params["cin"], params["num_classes"])
        raise SearchSpaceError(f"resnet has no block kind {kind!r}; kinds: ['stem', 'basic', 'bottleneck', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (3, 2, 2, 2, 1, 1, 1))
        stem = "cifar" if resolution <= 64 and rng.random() < 0.8 else "imagenet"
        n_stages = rng.choice((3, 4)) if stem == "cifar" else 4
        block = rng.choice(("basic", "bottleneck"))
        base = rng.choice((16, 24, 32, 48, 64))
        widths = [min(1024, base * 2 ** i) for i in range(n_stages)]
        max_depth = 4 if block == "basic" else 3
        depths = [rng.randint(1, max_depth) for _ in range(n_stages)]
        groups, wpg = 1, 64
        if block == "bottleneck":
            groups, wpg = weighted_choice(rng, ((1, 64), (1, 128), (8, 4), (32, 4)), (6, 1, 1, 1))
            if int(base * wpg / 64) < 1:
                groups, wpg = 1, 64
        return {
            "block": block, "depths": depths, "widths": widths, "stem": stem,
            "stem_width": rng.choice((16, 32, 64)) if base < 64 else 64, "groups": groups,
            "width_per_group": wpg, "resolution": resolution, "num_classes": rng.choice((10, 100, 1000)),
        }
