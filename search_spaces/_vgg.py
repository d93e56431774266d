"""``vgg``: VGG family (Simonyan & Zisserman 2014, "Very Deep Convolutional Networks for Large-Scale Image
Recognition"; torchvision layout).

- features: stage ``i`` has ``stage_depths[i]`` 3x3 convs (padding 1, with bias, as torchvision) of
  ``widths[i]`` channels, each followed by BN (if ``batch_norm``) and ReLU; every stage ends with a 2x2
  max-pool of stride 2 (the side is halved, rounded down);
- adaptive average pool to ``pool_size x pool_size`` (torchvision: 7; a feature map smaller than that is
  replicated, as in torchvision), flatten;
- classifier: for each width of ``classifier_widths`` a Linear, ReLU and Dropout(0.5) (an identity in eval
  mode, kept for torchvision's module layout), then Linear ``-> num_classes``.

The presets have exactly the parameter counts of torchvision's models of those names built with
``weights=None``: ``vgg11`` 132,863,336, ``vgg11_bn`` 132,868,840, ``vgg13`` 133,047,848, ``vgg16``
138,357,544, ``vgg16_bn`` 138,365,992, ``vgg19`` 143,667,240.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import log_uniform_int, register_space, weighted_choice

__all__ = ["VGGSpace", "VGG", "vgg_macs"]

_DROPOUT = 0.5
_SAMPLE_MACS = 250e6  # the sampler's cap on batch-1 multiply-accumulates
_VGG_WIDTHS = [64, 128, 256, 512, 512]
_TV_CLASSIFIER = [4096, 4096]


def _conv_layer(cin: int, cout: int, batch_norm: bool, pool: bool) -> list[nn.Module]:
    """One 3x3 conv (bias) -> (BN) -> ReLU, with the stage's 2x2/2 max-pool after it when ``pool``."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(cout))
    layers.append(nn.ReLU())
    if pool:
        layers.append(nn.MaxPool2d(2, stride=2))
    return layers


def _classifier(fin: int, widths: list[int], num_classes: int) -> nn.Sequential:
    head: list[nn.Module] = []
    for hidden in widths:
        head += [nn.Linear(fin, hidden), nn.ReLU(), nn.Dropout(_DROPOUT)]
        fin = hidden
    head.append(nn.Linear(fin, num_classes))
    return nn.Sequential(*head)


class VGGHead(nn.Module):
    """The head alone (a block of the plan): adaptive average pool, flatten, classifier, as in :class:`VGG`.

    Shapes:
        ``(N, cin, H, W) -> (N, num_classes)``
    """

    def __init__(self, cin: int, pool_size: int, classifier_widths: list[int], num_classes: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d((pool_size, pool_size))
        self.classifier = _classifier(cin * pool_size * pool_size, classifier_widths, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(x), 1))


class VGG(nn.Module):
    """A VGG from a validated ``vgg`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``; stage ``i`` outputs ``(N, widths[i], R // 2^(i+1), ...)`` and
        the classifier takes ``(N, widths[-1] * pool_size^2)``.
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for depth, width in zip(cfg["stage_depths"], cfg["widths"]):
            for j in range(depth):
                layers += _conv_layer(cin, width, cfg["batch_norm"], pool=j == depth - 1)
                cin = width
        self.features = nn.Sequential(*layers)
        p = cfg["pool_size"]
        self.avgpool = nn.AdaptiveAvgPool2d((p, p))
        self.classifier = _classifier(cin * p * p, cfg["classifier_widths"], cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg_macs(cfg: dict[str, Any]) -> int:
    """Batch-1 multiply-accumulates of the conv and linear layers of a complete ``vgg`` config (analytic).

    Equals what ``torch.utils.flop_counter`` counts for the built model; the sampler uses it to keep its
    draws inside a budget without building anything.
    """
    side, cin, macs = cfg["resolution"], 3, 0
    for depth, width in zip(cfg["stage_depths"], cfg["widths"]):
        for _ in range(depth):
            macs += side * side * 9 * cin * width
            cin = width
        side //= 2
    fin = cin * cfg["pool_size"] ** 2
    for hidden in cfg["classifier_widths"]:
        macs += fin * hidden
        fin = hidden
    return macs + fin * cfg["num_classes"]


@register_space("vgg")
class VGGSpace(BlockSearchSpace):
    """VGG family. Config keys:

    - ``stage_depths``: 3x3 convs per stage, 1..6 stages of 1..8 convs (VGG-11: ``[1, 1, 2, 2, 2]``,
      VGG-16: ``[2, 2, 3, 3, 3]``)
    - ``widths``: channels per stage (same length as ``stage_depths``), multiples of 8 in 8..2048
    - ``batch_norm``: BN after every conv (torchvision's ``vggNN_bn``) or not
    - ``pool_size``: side of the adaptive average pool before the classifier, 1..14 (torchvision: 7)
    - ``classifier_widths``: hidden widths of the classifier, 0..4 layers of 8..16384 (torchvision:
      ``[4096, 4096]``)
    - ``resolution``: input side, 16..1024; must be >= 2^stages (every stage halves it)
    - ``num_classes``: classifier outputs

    The sampler draws a resolution, 3..5 stages of 1..3 convs, BN, a small pool side (mostly 1..4), 0..2
    hidden classifier layers of 64..1024 and then the stage-0 width log-uniformly from 8 up to the widest
    (<= 64, doubling per stage up to 8x) whose model stays within ~250 M batch-1 MACs.
    """

    params = {
        "stage_depths": ListOf(IntRange(1, 8), 1, 6),
        "widths": ListOf(IntRange(8, 2048, multiple_of=8), 1, 6),
        "batch_norm": Choice(True, False),
        "pool_size": IntRange(1, 14),
        "classifier_widths": ListOf(IntRange(8, 16384), 0, 4),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "vgg11": {"stage_depths": [1, 1, 2, 2, 2], "batch_norm": False},
        "vgg11_bn": {"stage_depths": [1, 1, 2, 2, 2], "batch_norm": True},
        "vgg13": {"stage_depths": [2, 2, 2, 2, 2], "batch_norm": False},
        "vgg16": {"stage_depths": [2, 2, 3, 3, 3], "batch_norm": False},
        "vgg16_bn": {"stage_depths": [2, 2, 3, 3, 3], "batch_norm": True},
        "vgg19": {"stage_depths": [2, 2, 4, 4, 4], "batch_norm": False},
    }

    def default_config(self) -> dict[str, Any]:
        return {"stage_depths": [1, 1, 2, 2, 2], "widths": list(_VGG_WIDTHS), "batch_norm": False, "pool_size": 7,
                "classifier_widths": list(_TV_CLASSIFIER), "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        if len(cfg["stage_depths"]) != len(cfg["widths"]):
            raise SearchSpaceError(
                f"vgg config 'stage_depths' and 'widths' must have the same length (one entry per stage), got "
                f"{len(cfg['stage_depths'])} and {len(cfg['widths'])}"
            )
        least = 2 ** len(cfg["stage_depths"])
        if cfg["resolution"] < least:
            raise SearchSpaceError(
                f"vgg config 'resolution' must be >= 2^stages = {least} (each of the {len(cfg['stage_depths'])} "
                f"stages halves it), got {cfg['resolution']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return VGG(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Every conv layer (the stage's max-pool with its last one), head."""
        side, cin = config["resolution"], 3
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = []
        for depth, width in zip(config["stage_depths"], config["widths"]):
            for j in range(depth):
                pool = j == depth - 1
                parts.append(("conv", {"cin": cin, "cout": width, "batch_norm": config["batch_norm"], "pool": pool},
                              (cin, side, side)))
                cin = width
                side = side // 2 if pool else side
        parts.append(("head", {"cin": cin, "pool_size": config["pool_size"],
                               "classifier_widths": config["classifier_widths"],
                               "num_classes": config["num_classes"]}, (cin, side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "conv":
            return nn.Sequential(*_conv_layer(p["cin"], p["cout"], p["batch_norm"], p["pool"]))
        if kind == "head":
            return VGGHead(p["cin"], p["pool_size"], p["classifier_widths"], p["num_classes"])
        raise SearchSpaceError(f"vgg has no block kind {kind!r}; kinds: ['conv', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (3, 3, 2, 2, 1, 1, 1))
        n_stages = weighted_choice(rng, (3, 4, 5), (1, 2, 3))
        depths = [rng.randint(1, 2 if i < 2 else 3) for i in range(n_stages)]
        n_hidden = weighted_choice(rng, (0, 1, 2), (1, 2, 3))
        hidden = weighted_choice(rng, (64, 128, 256, 512, 1024), (2, 2, 2, 1, 1))
        cfg = {"stage_depths": depths, "batch_norm": rng.random() < 0.5,
               "pool_size": weighted_choice(rng, (1, 2, 3, 4, 7), (3, 3, 2, 2, 1)),
               "classifier_widths": [hidden] * n_hidden, "resolution": resolution,
               "num_classes": rng.choice((10, 100, 1000))}

        def widths(w0: int) -> list[int]:
            return [w0 * 2 ** min(i, 3) for i in range(n_stages)]

        hi = 64
        while hi > 8 and vgg_macs({**cfg, "widths": widths(hi)}) > _SAMPLE_MACS:
            hi -= 8
        return {**cfg, "widths": widths(log_uniform_int(rng, 8, hi, multiple_of=8))}
