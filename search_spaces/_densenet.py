"""``densenet``: DenseNet-BC family (torchvision layout: pre-activation dense layers, concat growth)."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import Block, BlockInput, BlockPlan, BlockSearchSpace
from search_spaces._layers import conv_out
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import register_space, weighted_choice

__all__ = ["DenseNetSpace", "DenseNet", "DenseNetHead"]


class DenseLayer(nn.Module):
    """BN -> ReLU -> 1x1 conv (``bn_size * growth``) -> BN -> ReLU -> 3x3 conv (``growth``).

    Takes the list of all earlier feature maps of the block and concatenates them first.

    Shapes:
        ``[(N, c_i, H, W), ...] -> (N, growth, H, W)``
    """

    def __init__(self, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        mid = bn_size * growth
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, growth, 3, padding=1, bias=False)
        self.relu = nn.ReLU()

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        x = self.conv1(self.relu(self.norm1(x)))
        return self.conv2(self.relu(self.norm2(x)))


class DenseBlock(nn.ModuleList):
    """``n`` dense layers; the output concatenates the input and every layer's output.

    Shapes:
        ``(N, cin, H, W) -> (N, cin + n * growth, H, W)``
    """

    def __init__(self, n: int, cin: int, growth: int, bn_size: int) -> None:
        super().__init__([DenseLayer(cin + i * growth, growth, bn_size) for i in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self:
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    """BN -> ReLU -> 1x1 conv -> 2x2/2 average pool.

    Shapes:
        ``(N, cin, H, W) -> (N, cout, H // 2, W // 2)``
    """

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2, 2))


class _DenseLayerBlock(DenseLayer):
    """A dense layer as a block of the plan: its feature maps come as separate inputs (one positional when
    there is only one, keywords ``f0, f1, ...`` otherwise) instead of one list."""

    def forward(self, *features: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward([*features, *named.values()])


class _Concat(nn.Module):
    """The end of a dense block as a block of the plan: its input and every layer's output, concatenated."""

    def forward(self, *features: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        return torch.cat([*features, *named.values()], 1)


def _stem(kind: str, width: int) -> nn.Module:
    if kind == "imagenet":
        return nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    return nn.Conv2d(3, width, 3, padding=1, bias=False)


class DenseNetHead(nn.Module):
    """The head alone (a block of the plan): BN, ReLU, pool, classifier, as in :class:`DenseNet`.

    Shapes:
        ``(N, cin, H, W) -> (N, num_classes)``
    """

    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.relu(self.norm(x))), 1))


class DenseNet(nn.Module):
    """A DenseNet from a validated ``densenet`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        c = cfg["init_width"]
        self.stem = _stem(cfg["stem"], c)
        parts: list[nn.Module] = []
        n_blocks = len(cfg["block_layers"])
        for i, n in enumerate(cfg["block_layers"]):
            parts.append(DenseBlock(n, c, cfg["growth_rate"], cfg["bn_size"]))
            c += n * cfg["growth_rate"]
            if i != n_blocks - 1:
                cout = int(c * cfg["compression"])
                parts.append(Transition(c, cout))
                c = cout
        self.features = nn.Sequential(*parts)
        self.norm = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.norm(self.features(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


@register_space("densenet")
class DenseNetSpace(BlockSearchSpace):
    """DenseNet-like family. Config keys:

    - ``growth_rate``: channels each dense layer adds, 4..64
    - ``block_layers``: dense layers per block, 1..5 blocks of 1..64 layers
    - ``init_width``: stem channels, 8..256
    - ``bn_size``: bottleneck multiplier (1x1 conv width = bn_size x growth_rate), 1..8
    - ``compression``: transition channel factor (output = int(channels x compression)), one of
      0.25, 0.5, 0.75, 1.0
    - ``stem``: ``"imagenet"`` (7x7/2 conv, BN, ReLU, max-pool; /4) or ``"cifar"`` (3x3/1 conv)
    - ``resolution``: input side, 16..1024
    - ``num_classes``: classifier outputs

    Each transition halves the resolution (``resolution`` must survive them: at least 1 pixel left).
    """

    params = {
        "growth_rate": IntRange(4, 64),
        "block_layers": ListOf(IntRange(1, 64), 1, 5),
        "init_width": IntRange(8, 256),
        "bn_size": IntRange(1, 8),
        "compression": Choice(0.25, 0.5, 0.75, 1.0),
        "stem": Choice("imagenet", "cifar"),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "densenet121": {"block_layers": [6, 12, 24, 16]},
        "densenet169": {"block_layers": [6, 12, 32, 32]},
        "densenet_bc_100_k12_cifar": {"growth_rate": 12, "block_layers": [16, 16, 16], "init_width": 24,
                                      "stem": "cifar", "resolution": 32, "num_classes": 10},
    }

    def default_config(self) -> dict[str, Any]:
        return {"growth_rate": 32, "block_layers": [6, 12, 24, 16], "init_width": 64, "bn_size": 4,
                "compression": 0.5, "stem": "imagenet", "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        side = cfg["resolution"]
        if cfg["stem"] == "imagenet":
            side = (side + 1) // 2
            side = (side + 1) // 2
        for _ in range(len(cfg["block_layers"]) - 1):
            side //= 2
        if side < 1:
            raise SearchSpaceError(
                f"densenet config 'resolution' {cfg['resolution']} is too small for stem {cfg['stem']!r} and "
                f"{len(cfg['block_layers']) - 1} transitions (each halves it); use a larger resolution or fewer blocks"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return DenseNet(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Stem; for each dense block every dense layer (reading the block's input and each earlier layer's
        output) and their concatenation; transitions; head."""
        side, c, growth = config["resolution"], config["init_width"], config["growth_rate"]
        blocks = [Block("stem", {"stem": config["stem"], "width": c}, (BlockInput("x", (3, side, side)),))]
        if config["stem"] == "imagenet":
            side = conv_out(conv_out(side, 7, 2, 3), 3, 2, 1)
        n_blocks = len(config["block_layers"])
        for i, n in enumerate(config["block_layers"]):
            feats: list[tuple[Any, int]] = [((len(blocks) - 1, 0), c)]

            def inputs() -> tuple[BlockInput, ...]:
                return tuple(BlockInput(src, (ch, side, side), f"f{k}") for k, (src, ch) in enumerate(feats))

            for j in range(n):
                blocks.append(Block("dense_layer", {"cin": c + j * growth, "growth": growth,
                                                    "bn_size": config["bn_size"]}, inputs()))
                feats.append(((len(blocks) - 1, 0), growth))
            blocks.append(Block("concat", {}, inputs()))
            c += n * growth
            if i != n_blocks - 1:
                cout = int(c * config["compression"])
                blocks.append(Block("transition", {"cin": c, "cout": cout},
                                    (BlockInput((len(blocks) - 1, 0), (c, side, side)),)))
                c, side = cout, side // 2
        blocks.append(Block("head", {"cin": c, "num_classes": config["num_classes"]},
                            (BlockInput((len(blocks) - 1, 0), (c, side, side)),)))
        return BlockPlan(tuple(blocks), ((len(blocks) - 1, 0),))

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "stem":
            return _stem(p["stem"], p["width"])
        if kind == "dense_layer":
            return _DenseLayerBlock(p["cin"], p["growth"], p["bn_size"])
        if kind == "concat":
            return _Concat()
        if kind == "transition":
            return Transition(p["cin"], p["cout"])
        if kind == "head":
            return DenseNetHead(p["cin"], p["num_classes"])
        raise SearchSpaceError(f"densenet has no block kind {kind!r}; kinds: ['stem', 'dense_layer', 'concat', "
                               "'transition', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (3, 2, 2, 2, 1, 1, 1))
        stem = "cifar" if resolution <= 64 and rng.random() < 0.8 else "imagenet"
        growth = rng.choice((8, 12, 16, 24, 32))
        n_blocks = rng.choice((3, 4))
        return {
            "growth_rate": growth,
            "block_layers": [rng.randint(2, 8) for _ in range(n_blocks)],
            "init_width": 2 * growth,
            "bn_size": rng.choice((2, 4)),
            "compression": weighted_choice(rng, (0.5, 0.75, 1.0), (4, 1, 1)),
            "stem": stem,
            "resolution": resolution,
            "num_classes": rng.choice((10, 100, 1000)),
        }
