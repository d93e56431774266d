"""``regnet``: RegNetX / RegNetY family (Radosavovic et al. 2020, "Designing Network Design Spaces";
torchvision layout).

- stem: 3x3 conv ``3 -> stem_width`` stride 2 (no bias), BN, ReLU;
- 1..4 stages; stage ``i`` has ``depths[i]`` X blocks of output width ``widths[i]``, the first of them with
  stride 2 (every stage halves the side, as in torchvision);
- X block (torchvision ``ResBottleneckBlock``), input width ``w_in``, output width ``w``, bottleneck width
  ``w_b = round(w * bottleneck_ratio)``: 1x1 conv ``w_in -> w_b``, BN, ReLU; 3x3 conv ``w_b -> w_b`` with
  stride ``s`` and ``w_b // g`` groups, where ``g = min(group_width, w_b)`` (torchvision's compatibility
  rule), BN, ReLU; for RegNetY (``se``) squeeze-excitation with ``round(0.25 * w_in)`` hidden channels
  (a ratio of the block's *input* width, as torchvision does), ReLU and a sigmoid gate; 1x1 conv
  ``w_b -> w``, BN; the residual is the input, or a 1x1 conv (stride ``s``) + BN projection when the width
  or side changes; ReLU after the sum;
- global average pool, flatten, Linear ``widths[-1] -> num_classes``.

The presets have exactly the parameter counts of torchvision's models of those names built with
``weights=None``: ``regnet_x_400mf`` 5,495,976, ``regnet_y_400mf`` 4,344,144, ``regnet_x_800mf``
7,259,656, ``regnet_y_800mf`` 6,432,512, ``regnet_x_1_6gf`` 9,190,136, ``regnet_y_1_6gf`` 11,202,430
(depths and widths are the per-stage values torchvision derives from its ``BlockParams``).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import ConvBNAct, PoolLinear, SqueezeExcite, conv_out
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import log_uniform_int, register_space, weighted_choice

__all__ = ["RegNetSpace", "RegNet", "XBlock", "regnet_macs"]

_SE_RATIO = 0.25  # of the block's input width, as in torchvision's RegNetY
_SAMPLE_MACS = 250e6  # the sampler's cap on batch-1 multiply-accumulates
_SAMPLE_MAX_WIDTH = 1024  # ... and on the last stage's width (low-resolution draws stay under ~10 M parameters)


def _bottleneck(width: int, ratio: float) -> int:
    """The bottleneck width ``round(width * ratio)`` (torchvision's ``w_b``)."""
    return int(round(width * ratio))


def _group_width(w_b: int, group_width: int) -> int:
    """The 3x3 conv's channels per group: ``min(group_width, w_b)`` (torchvision's compatibility rule)."""
    return min(group_width, w_b)


class XBlock(nn.Module):
    """RegNet X block (Y block with ``se``): 1x1 -> 3x3 grouped (stride) [-> SE] -> 1x1, residual, ReLU.

    Args:
        cin: input channels.
        cout: output channels.
        stride: stride of the 3x3 conv and of the projection.
        group_width: channels per group of the 3x3 conv (capped at the bottleneck width).
        bottleneck_ratio: bottleneck width / ``cout``.
        se: squeeze-excitation with ``round(0.25 * cin)`` hidden channels.

    Shapes:
        ``(N, cin, H, W) -> (N, cout, ceil(H / stride), ceil(W / stride))``
    """

    def __init__(self, cin: int, cout: int, stride: int, group_width: int, bottleneck_ratio: float,
                 se: bool) -> None:
        super().__init__()
        w_b = _bottleneck(cout, bottleneck_ratio)
        groups = w_b // _group_width(w_b, group_width)
        layers: list[nn.Module] = [
            ConvBNAct(cin, w_b, 1, act="relu"),
            ConvBNAct(w_b, w_b, 3, stride=stride, groups=groups, act="relu"),
        ]
        if se:
            layers.append(SqueezeExcite(w_b, int(round(_SE_RATIO * cin)), act="relu", gate="sigmoid"))
        layers.append(ConvBNAct(w_b, cout, 1, act=None))
        self.f = nn.Sequential(*layers)
        self.proj = ConvBNAct(cin, cout, 1, stride=stride, act=None) if (cin != cout or stride != 1) else None
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.proj is None else self.proj(x)
        return self.relu(identity + self.f(x))


class RegNet(nn.Module):
    """A RegNet from a validated ``regnet`` config.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``; stage ``i`` outputs ``(N, widths[i], R / 2^(i+2), ...)``
        (sides rounded up).
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        cin = cfg["stem_width"]
        self.stem = ConvBNAct(3, cin, 3, stride=2, act="relu")
        stages = []
        for depth, width in zip(cfg["depths"], cfg["widths"]):
            blocks = []
            for j in range(depth):
                blocks.append(XBlock(cin, width, 2 if j == 0 else 1, cfg["group_width"], cfg["bottleneck_ratio"],
                                     cfg["se"]))
                cin = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def regnet_macs(cfg: dict[str, Any]) -> int:
    """Batch-1 multiply-accumulates of conv and linear layers of a complete ``regnet`` config (analytic).

    Equals what ``torch.utils.flop_counter`` counts for the built model; the sampler uses it to keep its
    draws inside a budget without building anything.
    """
    side = (cfg["resolution"] + 1) // 2
    cin = cfg["stem_width"]
    macs = side * side * 27 * cin
    for depth, width in zip(cfg["depths"], cfg["widths"]):
        for j in range(depth):
            out = (side + 1) // 2 if j == 0 else side
            w_b = _bottleneck(width, cfg["bottleneck_ratio"])
            macs += side * side * cin * w_b + out * out * 9 * w_b * _group_width(w_b, cfg["group_width"])
            if cfg["se"]:
                macs += 2 * w_b * int(round(_SE_RATIO * cin))
            macs += out * out * w_b * width
            if cin != width or j == 0:
                macs += out * out * cin * width
            side, cin = out, width
    return macs + cin * cfg["num_classes"]


@register_space("regnet")
class RegNetSpace(BlockSearchSpace):
    """RegNetX / RegNetY family. Config keys:

    - ``depths``: X blocks per stage, 1..4 stages of 1..64 blocks
    - ``widths``: output width per stage (same length as ``depths``), multiples of 8 in 8..8192
    - ``group_width``: channels per group of the 3x3 convs, 1..1024 (capped at the bottleneck width, as
      torchvision does); every stage's bottleneck width must be a multiple of it when larger
    - ``bottleneck_ratio``: bottleneck width / block width, one of 0.25, 0.5, 1.0 (torchvision's presets: 1.0)
    - ``se``: squeeze-excitation in every block (RegNetY) or not (RegNetX); SE width 0.25 x block input width
    - ``stem_width``: stem channels, multiple of 8 in 8..256 (torchvision: 32)
    - ``resolution``: input side, 16..1024; must be >= 2^(stages + 1) (the stem and every stage halve it)
    - ``num_classes``: classifier outputs

    The sampler draws a resolution, 3 or 4 stages with small depths, a group width, bottleneck ratio, SE,
    a per-stage width growth of 1.5..2.5x and then the stage-0 bottleneck width log-uniformly from 8 up to
    the widest (<= 256) whose model stays within ~250 M batch-1 MACs and a last-stage width of 1024.
    """

    params = {
        "depths": ListOf(IntRange(1, 64), 1, 4),
        "widths": ListOf(IntRange(8, 8192, multiple_of=8), 1, 4),
        "group_width": IntRange(1, 1024),
        "bottleneck_ratio": Choice(0.25, 0.5, 1.0),
        "se": Choice(True, False),
        "stem_width": IntRange(8, 256, multiple_of=8),
        "resolution": IntRange(16, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        "regnet_x_400mf": {"depths": [1, 2, 7, 12], "widths": [32, 64, 160, 400], "group_width": 16, "se": False},
        "regnet_y_400mf": {"depths": [1, 3, 6, 6], "widths": [48, 104, 208, 440], "group_width": 8, "se": True},
        "regnet_x_800mf": {"depths": [1, 3, 7, 5], "widths": [64, 128, 288, 672], "group_width": 16, "se": False},
        "regnet_y_800mf": {"depths": [1, 3, 8, 2], "widths": [64, 144, 320, 784], "group_width": 16, "se": True},
        "regnet_x_1_6gf": {"depths": [2, 4, 10, 2], "widths": [72, 168, 408, 912], "group_width": 24, "se": False},
        "regnet_y_1_6gf": {"depths": [2, 6, 17, 2], "widths": [48, 120, 336, 888], "group_width": 24, "se": True},
    }

    def default_config(self) -> dict[str, Any]:
        return {"depths": [1, 2, 7, 12], "widths": [32, 64, 160, 400], "group_width": 16, "bottleneck_ratio": 1.0,
                "se": False, "stem_width": 32, "resolution": 224, "num_classes": 1000}

    def _check(self, cfg: dict[str, Any]) -> None:
        if len(cfg["depths"]) != len(cfg["widths"]):
            raise SearchSpaceError(
                f"regnet config 'depths' and 'widths' must have the same length (one entry per stage), got "
                f"{len(cfg['depths'])} and {len(cfg['widths'])}"
            )
        for i, width in enumerate(cfg["widths"]):
            w_b = _bottleneck(width, cfg["bottleneck_ratio"])
            if w_b < 1 or w_b % _group_width(w_b, cfg["group_width"]):
                raise SearchSpaceError(
                    f"regnet config 'widths'[{i}] = {width}: its bottleneck width round({width} x "
                    f"bottleneck_ratio {cfg['bottleneck_ratio']}) = {w_b} must be a multiple of 'group_width' "
                    f"({cfg['group_width']}) when larger than it"
                )
        least = 2 ** (len(cfg["depths"]) + 1)
        if cfg["resolution"] < least:
            raise SearchSpaceError(
                f"regnet config 'resolution' must be >= 2^(stages+1) = {least} (the stem and each of the "
                f"{len(cfg['depths'])} stages halve it), got {cfg['resolution']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return RegNet(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Stem, every X block ``(cin, cout, stride, group_width, bottleneck_ratio, se)``, pool + classifier."""
        side = config["resolution"]
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
            ("stem", {"width": config["stem_width"]}, (3, side, side))]
        side = conv_out(side, 3, 2, 1)
        cin = config["stem_width"]
        for depth, width in zip(config["depths"], config["widths"]):
            for j in range(depth):
                stride = 2 if j == 0 else 1
                parts.append(("xblock", {"cin": cin, "cout": width, "stride": stride,
                                         "group_width": config["group_width"],
                                         "bottleneck_ratio": config["bottleneck_ratio"], "se": config["se"]},
                              (cin, side, side)))
                side = conv_out(side, 3, stride, 1)
                cin = width
        parts.append(("head", {"cin": cin, "num_classes": config["num_classes"]}, (cin, side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "stem":
            return ConvBNAct(3, params["width"], 3, stride=2, act="relu")
        if kind == "xblock":
            return XBlock(params["cin"], params["cout"], params["stride"], params["group_width"],
                          params["bottleneck_ratio"], params["se"])
        if kind == "head":
            return PoolLinear(params["cin"], params["num_classes"])
        raise SearchSpaceError(f"regnet has no block kind {kind!r}; kinds: ['stem', 'xblock', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        resolution = weighted_choice(rng, (32, 64, 96, 128, 160, 192, 224), (2, 2, 2, 2, 1, 1, 1))
        n_stages = weighted_choice(rng, (3, 4), (1, 3))
        depths = [rng.randint(1, d) for d in (2, 3, 5, 3)[4 - n_stages:]]
        group_width = weighted_choice(rng, (1, 4, 8, 16, 24, 32, 48), (1, 1, 3, 3, 2, 2, 1))
        ratio = weighted_choice(rng, (0.25, 0.5, 1.0), (1, 1, 3))
        se = rng.random() < 0.5
        growth = rng.uniform(1.5, 2.5)
        stem_width = rng.choice((16, 24, 32))
        cfg = {"depths": depths, "group_width": group_width, "bottleneck_ratio": ratio, "se": se,
               "stem_width": stem_width, "resolution": resolution, "num_classes": rng.choice((10, 100, 1000))}

        def widths(w0: int) -> list[int]:
            # bottleneck widths grow by `growth` per stage, rounded to a multiple of lcm(8 x ratio, group
            # width) so that block widths are multiples of 8 and groups divide the bottleneck
            step = 8 * ratio
            q = int(step) if group_width == 1 else group_width
            while q % step:
                q += group_width
            out = []
            for i in range(n_stages):
                w_b = max(q, int(round(w0 * growth ** i / q)) * q)
                out.append(int(round(w_b / ratio)))
            return out

        hi = 256
        while hi > 8 and (regnet_macs({**cfg, "widths": widths(hi)}) > _SAMPLE_MACS
                          or widths(hi)[-1] > _SAMPLE_MAX_WIDTH):
            hi = int(hi * 0.85)
        w0 = log_uniform_int(rng, 8, max(8, hi))
        return {**cfg, "widths": widths(w0)}
