"""``mobilenetv3``: MobileNetV3-like family (torchvision layout), one entry per inverted-residual block."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import ConvBNAct, SqueezeExcite, conv_out, make_activation
from search_spaces._params import Choice, IntRange, ListOf, Struct
from search_spaces._registry import make_divisible, register_space, weighted_choice

__all__ = ["MobileNetV3Space", "MobileNetV3"]

_BN_EPS = 1e-3  # torchvision's MobileNetV3 BatchNorm eps
_DROPOUT = 0.2


class InvertedResidual(nn.Module):
    """Expand 1x1 (if ``exp != cin``) -> depthwise kxk -> SE (optional) -> project 1x1 (+ residual).

    SE squeezes to ``make_divisible(exp // 4, 8)`` channels with ReLU and a Hardsigmoid gate.

    Shapes:
        ``(N, cin, H, W) -> (N, cout, ceil(H / s), ceil(W / s))``
    """

    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act: str, s: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=act, bn_eps=_BN_EPS))
        layers.append(ConvBNAct(exp, exp, k, stride=s, groups=exp, act=act, bn_eps=_BN_EPS))
        if se:
            layers.append(SqueezeExcite(exp, make_divisible(exp // 4, 8), act="relu", gate="hardsigmoid"))
        layers.append(ConvBNAct(exp, cout, 1, act=None, bn_eps=_BN_EPS))
        self.block = nn.Sequential(*layers)
        self.use_residual = s == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class MobileNetV3(nn.Module):
    """A MobileNetV3 from a validated ``mobilenetv3`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        cin = cfg["stem_width"]
        self.stem = ConvBNAct(3, cin, 3, stride=2, act="hardswish", bn_eps=_BN_EPS)
        blocks = []
        for b in cfg["blocks"]:
            blocks.append(InvertedResidual(cin, b["k"], b["exp"], b["out"], b["se"], b["act"], b["s"]))
            cin = b["out"]
        self.blocks = nn.Sequential(*blocks)
        self.head = ConvBNAct(cin, cfg["head_width"], 1, act="hardswish", bn_eps=_BN_EPS)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(cfg["head_width"], cfg["classifier_width"]), make_activation("hardswish"),
            nn.Dropout(_DROPOUT), nn.Linear(cfg["classifier_width"], cfg["num_classes"]),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))
        return self.classifier(torch.flatten(self.pool(x), 1))


class MobileNetV3Head(nn.Module):
    """The head alone (a block of the plan): 1x1 conv (Hardswish), pool, classifier, as in :class:`MobileNetV3`.

    Shapes:
        ``(N, cin, H, W) -> (N, num_classes)``
    """

    def __init__(self, cin: int, head_width: int, classifier_width: int, num_classes: int) -> None:
        super().__init__()
        self.head = ConvBNAct(cin, head_width, 1, act="hardswish", bn_eps=_BN_EPS)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(head_width, classifier_width), make_activation("hardswish"),
            nn.Dropout(_DROPOUT), nn.Linear(classifier_width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.head(x)), 1))


_BLOCK = Struct({
    "k": Choice(3, 5, 7),
    "exp": IntRange(8, 4096),
    "out": IntRange(8, 2048),
    "se": Choice(True, False),
    "act": Choice("relu", "hardswish"),
    "s": Choice(1, 2),
})


def _blocks(rows: list[tuple[int, int, int, bool, str, int]]) -> list[dict[str, Any]]:
    return [{"k": k, "exp": e, "out": o, "se": se, "act": a, "s": s} for k, e, o, se, a, s in rows]


# torchvision's inverted_residual_setting tables (kernel, expanded, out, SE, activation, stride).
_LARGE = _blocks([
    (3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2), (3, 72, 24, False, "relu", 1),
    (5, 72, 40, True, "relu", 2), (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hardswish", 2), (3, 200, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1), (3, 184, 80, False, "hardswish", 1),
    (3, 480, 112, True, "hardswish", 1), (3, 672, 112, True, "hardswish", 1),
    (5, 672, 160, True, "hardswish", 2), (5, 960, 160, True, "hardswish", 1), (5, 960, 160, True, "hardswish", 1),
])
_SMALL = _blocks([
    (3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2), (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hardswish", 2), (5, 240, 40, True, "hardswish", 1), (5, 240, 40, True, "hardswish", 1),
    (5, 120, 48, True, "hardswish", 1), (5, 144, 48, True, "hardswish", 1),
    (5, 288, 96, True, "hardswish", 2), (5, 576, 96, True, "hardswish", 1), (5, 576, 96, True, "hardswish", 1),
])

# Sampler skeleton: (base out channels, first stride, activation) per stage, MobileNetV3-Large-like.
_SKELETON = ((16, 1, "relu"), (24, 2, "relu"), (40, 2, "relu"), (80, 2, "hardswish"), (112, 1, "hardswish"),
             (160, 2, "hardswish"))


@register_space("mobilenetv3")
class MobileNetV3Space(BlockSearchSpace):
    """MobileNetV3-like family. Config keys:

    - ``stem_width``: channels of the 3x3/2 stem (Hardswish), 8..256
    - ``blocks``: 1..64 inverted-residual blocks, each ``{"k": 3|5|7, "exp": expanded channels 8..4096,
      "out": output channels 8..2048, "se": bool, "act": "relu"|"hardswish", "s": 1|2}``
      (torchvision's ``inverted_residual_setting`` rows; ``exp == in`` skips the expand conv)
    - ``head_width``: channels of the last 1x1 conv (960 in Large), 8..8192
    - ``classifier_width``: hidden width of the classifier (1280 in Large), 8..8192
    - ``resolution``: input side, 16..1024
    - ``num_classes``: classifier outputs

    The sampler draws a width multiplier, per-stage depth 1..4, kernel, expansion and SE over a
    MobileNetV3-Large skeleton of six stages.
    """

    params = {
        "stem_width": IntRange(8, 256),
        "blocks": ListOf(_BLOCK, 1, 64),
        "head_width": IntRange(8, 8192),
        "classifier_width": IntRange(8, 8192),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "mobilenet_v3_large": {"stem_width": 16, "blocks": _LARGE, "head_width": 960, "classifier_width": 1280},
        "mobilenet_v3_small": {"stem_width": 16, "blocks": _SMALL, "head_width": 576, "classifier_width": 1024},
    }

    def default_config(self) -> dict[str, Any]:
        return {"stem_width": 16, "blocks": [dict(b) for b in _LARGE], "head_width": 960, "classifier_width": 1280,
                "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        if cfg["head_width"] < cfg["blocks"][-1]["out"]:
            raise SearchSpaceError(
                f"mobilenetv3 config 'head_width' must be >= the last block's 'out' "
                f"({cfg['blocks'][-1]['out']}), got {cfg['head_width']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return MobileNetV3(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Stem, every inverted-residual block (its row of ``blocks`` and input width), head."""
        side, cin = config["resolution"], config["stem_width"]
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [("stem", {"width": cin}, (3, side, side))]
        side = conv_out(side, 3, 2, 1)
        for b in config["blocks"]:
            parts.append(("block", {"cin": cin, **b}, (cin, side, side)))
            side = conv_out(side, b["k"], b["s"], (b["k"] - 1) // 2)
            cin = b["out"]
        parts.append(("head", {"cin": cin, "head_width": config["head_width"],
                               "classifier_width": config["classifier_width"],
                               "num_classes": config["num_classes"]}, (cin, side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "stem":
            return ConvBNAct(3, params["width"], 3, stride=2, act="hardswish", bn_eps=_BN_EPS)
        if kind == "block":
            p = params
            return InvertedResidual(p["cin"], p["k"], p["exp"], p["out"], p["se"], p["act"], p["s"])
        if kind == "head":
            return MobileNetV3Head(params["cin"], params["head_width"], params["classifier_width"],
                                   params["num_classes"])
        raise SearchSpaceError(f"mobilenetv3 has no block kind {kind!r}; kinds: ['stem', 'block', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        mult = rng.choice((0.35, 0.5, 0.75, 1.0, 1.25))
        blocks = []
        cin = make_divisible(16 * mult, 8)
        stem = cin
        for i, (base, stride, act) in enumerate(_SKELETON):
            out = make_divisible(base * mult, 8)
            depth = 1 if i == 0 else rng.randint(1, 4)
            k = rng.choice((3, 5, 7))
            e = 1 if i == 0 else rng.choice((2, 3, 4, 6))
            se = rng.random() < 0.5
            for j in range(depth):
                c = cin if j == 0 else out
                blocks.append({"k": k, "exp": make_divisible(c * e, 8), "out": out, "se": se, "act": act,
                               "s": stride if j == 0 else 1})
            cin = out
        head = make_divisible(6 * cin, 8)
        return {
            "stem_width": stem, "blocks": blocks, "head_width": head,
            "classifier_width": rng.choice((256, 512, 1024, 1280)),
            "resolution": weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (1, 1, 2, 2, 2, 2, 2)),
            "num_classes": rng.choice((10, 100, 1000)),
        }
