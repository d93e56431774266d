"""``efficientnetv2``: EfficientNetV2 family (Tan & Le 2021, torchvision layout): FusedMBConv and MBConv stages.

Layout (torchvision's ``EfficientNet`` class with a V2 ``inverted_residual_setting``; every BatchNorm has
eps 1e-3, every activation is SiLU):

- stem: 3x3 conv stride 2 ``3 -> stem_width``, BN, SiLU;
- stages: stage ``i`` repeats ``layers`` blocks of one type; only a stage's first block takes the stage's
  stride and the previous width, the others have stride 1 and ``out -> out``:

  - ``fused`` (FusedMBConv): if ``expand > 1``, a ``kernel x kernel`` conv with the stride ``cin -> cin*expand``
    (BN, SiLU) then a 1x1 project ``-> out`` (BN); if ``expand == 1``, one ``kernel x kernel`` conv
    ``cin -> out`` with the stride (BN, SiLU). No squeeze-excitation.
  - ``mbconv`` (MBConv): 1x1 expand ``cin -> cin*expand`` (BN, SiLU; left out when ``expand == 1``),
    depthwise ``kernel x kernel`` with the stride (BN, SiLU), squeeze-excitation if ``se`` (avg-pool, 1x1
    conv with bias to ``max(1, cin // 4)`` — from the block's *input* channels —, SiLU, 1x1 conv with bias,
    Sigmoid, multiply), 1x1 project ``-> out`` (BN, no activation).

  Both add the input (residual) when ``stride == 1`` and the block's input and output widths are equal;
- head: 1x1 conv ``-> head_width``, BN, SiLU; global average pool; flatten; Linear ``-> num_classes``.

Widths are multiples of 8, so ``cin * expand`` equals torchvision's ``_make_divisible(cin * expand, 8)``.
Stochastic depth and dropout are identities in eval mode and are left out (they hold no parameters).
The ``efficientnet_v2_s`` preset has exactly the 21,458,488 parameters of torchvision's
``efficientnet_v2_s(weights=None)``.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import ConvBNAct, SqueezeExcite, conv_out
from search_spaces._params import Choice, IntRange, ListOf, Struct
from search_spaces._registry import make_divisible, register_space, weighted_choice

__all__ = ["EfficientNetV2Space", "EfficientNetV2"]

_BN_EPS = 1e-3  # torchvision's EfficientNetV2 BatchNorm eps
_ACT = "silu"


class FusedMBConv(nn.Module):
    """FusedMBConv block (see the module docstring).

    Shapes:
        ``(N, cin, H, W) -> (N, cout, ceil(H / stride), ceil(W / stride))``
    """

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int) -> None:
        super().__init__()
        exp = cin * expand
        if exp != cin:
            self.block = nn.Sequential(
                ConvBNAct(cin, exp, kernel, stride=stride, act=_ACT, bn_eps=_BN_EPS),
                ConvBNAct(exp, cout, 1, act=None, bn_eps=_BN_EPS),
            )
        else:
            self.block = nn.Sequential(ConvBNAct(cin, cout, kernel, stride=stride, act=_ACT, bn_eps=_BN_EPS))
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class MBConv(nn.Module):
    """MBConv block with optional squeeze-excitation (see the module docstring).

    Shapes:
        ``(N, cin, H, W) -> (N, cout, ceil(H / stride), ceil(W / stride))``
    """

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int, se: bool) -> None:
        super().__init__()
        exp = cin * expand
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=_ACT, bn_eps=_BN_EPS))
        layers.append(ConvBNAct(exp, exp, kernel, stride=stride, groups=exp, act=_ACT, bn_eps=_BN_EPS))
        if se:
            layers.append(SqueezeExcite(exp, max(1, cin // 4), act=_ACT, gate="sigmoid"))
        layers.append(ConvBNAct(exp, cout, 1, act=None, bn_eps=_BN_EPS))
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class EfficientNetV2Head(nn.Module):
    """The head alone (a block of the plan): 1x1 conv (SiLU), pool, classifier, as in :class:`EfficientNetV2`.

    Shapes:
        ``(N, cin, H, W) -> (N, num_classes)``
    """

    def __init__(self, cin: int, head_width: int, num_classes: int) -> None:
        super().__init__()
        self.head = ConvBNAct(cin, head_width, 1, act=_ACT, bn_eps=_BN_EPS)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(head_width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.head(x)), 1))


class EfficientNetV2(nn.Module):
    """An EfficientNetV2 from a validated ``efficientnetv2`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        cin = cfg["stem_width"]
        self.stem = ConvBNAct(3, cin, 3, stride=2, act=_ACT, bn_eps=_BN_EPS)
        stages: list[nn.Module] = []
        for st in cfg["stages"]:
            blocks: list[nn.Module] = []
            for j in range(st["layers"]):
                c, s = (cin, st["stride"]) if j == 0 else (st["out"], 1)
                if st["type"] == "fused":
                    blocks.append(FusedMBConv(c, st["out"], st["expand"], st["kernel"], s))
                else:
                    blocks.append(MBConv(c, st["out"], st["expand"], st["kernel"], s, st["se"]))
            stages.append(nn.Sequential(*blocks))
            cin = st["out"]
        self.stages = nn.Sequential(*stages)
        self.head = ConvBNAct(cin, cfg["head_width"], 1, act=_ACT, bn_eps=_BN_EPS)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cfg["head_width"], cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.stages(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


_STAGE = Struct({
    "type": Choice("fused", "mbconv"),
    "expand": Choice(1, 2, 3, 4, 6),
    "kernel": Choice(3, 5, 7),
    "stride": Choice(1, 2),
    "out": IntRange(8, 2048, multiple_of=8),
    "layers": IntRange(1, 32),
    "se": Choice(True, False),
})


def _stages(rows: list[tuple[str, int, int, int, int, int, bool]]) -> list[dict[str, Any]]:
    return [{"type": t, "expand": e, "kernel": k, "stride": s, "out": o, "layers": n, "se": se}
            for t, e, k, s, o, n, se in rows]


# torchvision's efficientnet_v2_s inverted_residual_setting (type, expand, kernel, stride, out, layers, SE).
_V2_S = _stages([
    ("fused", 1, 3, 1, 24, 2, False), ("fused", 4, 3, 2, 48, 4, False), ("fused", 4, 3, 2, 64, 4, False),
    ("mbconv", 4, 3, 2, 128, 6, True), ("mbconv", 6, 3, 1, 160, 9, True), ("mbconv", 6, 3, 2, 256, 15, True),
])

# Sampler skeleton, EfficientNetV2-S/M-like: (base out channels, stride, expand choices) per stage position.
_SKELETON = ((24, 1, (1, 2)), (48, 2, (2, 3, 4)), (64, 2, (2, 3, 4)), (128, 2, (2, 3, 4, 6)),
             (160, 1, (3, 4, 6)), (256, 2, (3, 4, 6)), (384, 1, (4, 6)))
# Probability that stage position i is fused (early stages mostly fused, late ones mostly MBConv).
_P_FUSED = (0.9, 0.8, 0.6, 0.25, 0.15, 0.1, 0.1)


@register_space("efficientnetv2")
class EfficientNetV2Space(BlockSearchSpace):
    """EfficientNetV2-like family. Config keys:

    - ``stem_width``: channels of the 3x3/2 stem, a multiple of 8 in 8..256
    - ``stages``: 1..10 stages, each ``{"type": "fused"|"mbconv", "expand": 1|2|3|4|6, "kernel": 3|5|7,
      "stride": 1|2, "out": output channels (multiple of 8, 8..2048), "layers": blocks 1..32, "se": bool}``
      (torchvision's ``inverted_residual_setting`` rows); ``se`` must be False for ``fused`` stages
    - ``head_width``: channels of the last 1x1 conv (1280 in V2-S), 8..8192
    - ``resolution``: input side, 16..1024
    - ``num_classes``: classifier outputs

    The sampler draws a width multiplier, 4..7 stages over an EfficientNetV2-S/M skeleton (each stage
    fused or MBConv, early stages mostly fused), 1..3 layers per stage, expansion, kernel, SE and the
    resolution.
    """

    params = {
        "stem_width": IntRange(8, 256, multiple_of=8),
        "stages": ListOf(_STAGE, 1, 10),
        "head_width": IntRange(8, 8192),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "efficientnet_v2_s": {"stem_width": 24, "stages": _V2_S, "head_width": 1280, "resolution": 384},
    }

    def default_config(self) -> dict[str, Any]:
        return {"stem_width": 24, "stages": copy.deepcopy(_V2_S), "head_width": 1280, "resolution": 224,
                "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        for i, st in enumerate(cfg["stages"]):
            if st["type"] == "fused" and st["se"]:
                raise SearchSpaceError(
                    f"efficientnetv2 config 'stages'[{i}]['se'] must be False for a 'fused' stage "
                    f"(FusedMBConv has no squeeze-excitation), got True"
                )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return EfficientNetV2(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Stem, every FusedMBConv / MBConv block ``(cin, cout, expand, kernel, stride[, se])``, head."""
        side, cin = config["resolution"], config["stem_width"]
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [("stem", {"width": cin}, (3, side, side))]
        side = conv_out(side, 3, 2, 1)
        for st in config["stages"]:
            for j in range(st["layers"]):
                c, s = (cin, st["stride"]) if j == 0 else (st["out"], 1)
                p: dict[str, Any] = {"cin": c, "cout": st["out"], "expand": st["expand"], "kernel": st["kernel"],
                                     "stride": s}
                if st["type"] != "fused":
                    p["se"] = st["se"]
                parts.append((st["type"], p, (c, side, side)))
                side = conv_out(side, st["kernel"], s, (st["kernel"] - 1) // 2)
            cin = st["out"]
        parts.append(("head", {"cin": cin, "head_width": config["head_width"], "num_classes": config["num_classes"]},
                      (cin, side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "stem":
            return ConvBNAct(3, p["width"], 3, stride=2, act=_ACT, bn_eps=_BN_EPS)
        if kind == "fused":
            return FusedMBConv(p["cin"], p["cout"], p["expand"], p["kernel"], p["stride"])
        if kind == "mbconv":
            return MBConv(p["cin"], p["cout"], p["expand"], p["kernel"], p["stride"], p["se"])
        if kind == "head":
            return EfficientNetV2Head(p["cin"], p["head_width"], p["num_classes"])
        raise SearchSpaceError(f"efficientnetv2 has no block kind {kind!r}; kinds: ['stem', 'fused', 'mbconv', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        mult = weighted_choice(rng, (0.25, 0.35, 0.5, 0.75, 1.0), (2, 2, 2, 1, 1))
        n_stages = weighted_choice(rng, (4, 5, 6, 7), (1, 2, 3, 2))
        stem = make_divisible(24 * mult, 8)
        stages = []
        fused = True  # once a stage is MBConv, the later ones are too (as in the paper's nets)
        for i, (base, stride, expands) in enumerate(_SKELETON[:n_stages]):
            fused = fused and rng.random() < _P_FUSED[i]
            se = False if fused else rng.random() < 0.75
            stages.append({
                "type": "fused" if fused else "mbconv", "expand": rng.choice(expands),
                "kernel": weighted_choice(rng, (3, 5, 7), (3, 1, 1)), "stride": stride,
                "out": make_divisible(base * mult, 8), "layers": rng.randint(1, 2 if i < 2 else 3), "se": se,
            })
        head = rng.choice((make_divisible(4 * stages[-1]["out"], 8), make_divisible(1280 * mult, 8)))
        return {
            "stem_width": stem, "stages": stages, "head_width": max(head, stages[-1]["out"]),
            "resolution": weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (2, 2, 2, 2, 1, 1, 1)),
            "num_classes": rng.choice((10, 100, 1000)),
        }
