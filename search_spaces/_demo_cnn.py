"""``demo_cnn``: small plain CNNs for tiny grey-scale images (the ``dippm-nas demo`` space).

Built for scikit-learn's 8x8 digits, optionally up-sampled to 16x16 or 32x32, so a candidate trains in a
few seconds on a CPU while the family still spans two orders of magnitude of FLOPs and activation memory.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from dippm_nas.spec import InputSpec
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import PoolLinear, make_activation
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import log_uniform_int, register_space

__all__ = ["DemoCNNSpace", "DemoCNN"]


def _conv_layer(cin: int, cout: int, kernel: int, batchnorm: bool, activation: str, pool: bool) -> list[nn.Module]:
    """One conv -> (BatchNorm) -> activation layer, with the stage's 2x2 max-pool after it when ``pool``."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, padding=(kernel - 1) // 2, bias=not batchnorm)]
    if batchnorm:
        layers.append(nn.BatchNorm2d(cout))
    layers.append(make_activation(activation))
    if pool:
        layers.append(nn.MaxPool2d(2))
    return layers


class DemoCNN(nn.Module):
    """Stages of ``blocks[i]`` conv -> (BatchNorm) -> activation layers of width ``widths[i]``, a 2x2
    max-pool between stages, then global average pooling and a linear classifier.

    Shapes:
        ``(N, in_channels, resolution, resolution) -> (N, num_classes)``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = cfg["in_channels"]
        k = cfg["kernel_size"]
        n_stages = len(cfg["widths"])
        for i, (w, b) in enumerate(zip(cfg["widths"], cfg["blocks"])):
            for j in range(b):
                layers += _conv_layer(c, w, k, cfg["batchnorm"], cfg["activation"],
                                      pool=j == b - 1 and i < n_stages - 1)
                c = w
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c, cfg["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


@register_space("demo_cnn")
class DemoCNNSpace(BlockSearchSpace):
    """Plain-CNN family of the demo. Config keys:

    - ``resolution``: input side, ``8``, ``16`` or ``32`` (digits are 8x8; larger sides are up-sampled)
    - ``widths``: output channels of each stage, 1..3 stages of 4..256
    - ``blocks``: conv layers of each stage, 1..3 (same length as ``widths``)
    - ``kernel_size``: ``3`` or ``5``
    - ``batchnorm``: BatchNorm after each conv (the conv then has no bias)
    - ``activation``: ``"relu"``, ``"gelu"`` or ``"silu"``
    - ``in_channels``: input channels, 1..4 (1 for grey-scale digits)
    - ``num_classes``: 2..1000 (10 for digits)

    Input: one float tensor ``(batch, in_channels, resolution, resolution)``.
    """

    params = {
        "resolution": Choice(8, 16, 32),
        "widths": ListOf(IntRange(4, 256), 1, 3),
        "blocks": ListOf(IntRange(1, 3), 1, 3),
        "kernel_size": Choice(3, 5),
        "batchnorm": Choice(True, False),
        "activation": Choice("relu", "gelu", "silu"),
        "in_channels": IntRange(1, 4),
        "num_classes": IntRange(2, 1000),
    }
    presets = {
        "tiny": {"resolution": 8, "widths": [8], "blocks": [1]},
        "wide": {"resolution": 32, "widths": [64, 128, 256], "blocks": [2, 2, 2]},
    }

    def default_config(self) -> dict[str, Any]:
        return {"resolution": 8, "widths": [16, 32], "blocks": [1, 1], "kernel_size": 3, "batchnorm": True,
                "activation": "relu", "in_channels": 1, "num_classes": 10}

    def _check(self, config: dict[str, Any]) -> None:
        if len(config["widths"]) != len(config["blocks"]):
            raise SearchSpaceError(
                f"demo_cnn config 'widths' and 'blocks' must have the same length (one entry per stage), got "
                f"{len(config['widths'])} widths {config['widths']} and {len(config['blocks'])} blocks {config['blocks']}"
            )

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return DemoCNN(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Every conv layer (with the stage's max-pool after its last one), pool + classifier."""
        side, c, k = config["resolution"], config["in_channels"], config["kernel_size"]
        n_stages = len(config["widths"])
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = []
        for i, (w, b) in enumerate(zip(config["widths"], config["blocks"])):
            for j in range(b):
                pool = j == b - 1 and i < n_stages - 1
                parts.append(("conv", {"cin": c, "cout": w, "kernel": k, "batchnorm": config["batchnorm"],
                                       "activation": config["activation"], "pool": pool}, (c, side, side)))
                c = w
                side = side // 2 if pool else side
        parts.append(("head", {"cin": c, "num_classes": config["num_classes"]}, (c, side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "conv":
            return nn.Sequential(*_conv_layer(params["cin"], params["cout"], params["kernel"], params["batchnorm"],
                                              params["activation"], params["pool"]))
        if kind == "head":
            return PoolLinear(params["cin"], params["num_classes"])
        raise SearchSpaceError(f"demo_cnn has no block kind {kind!r}; kinds: ['conv', 'head']")

    def input_spec(self, config: dict[str, Any], batch_size: int = 1, dtype: str = "float32") -> InputSpec:
        """A grey-scale (or few-channel) square image.

        Shapes:
            ``x``: ``(batch_size, in_channels, resolution, resolution)``
        """
        cfg = self.validate(config)
        return InputSpec(shape=(cfg["in_channels"], cfg["resolution"], cfg["resolution"]),
                         batch_size=batch_size, dtype=dtype)

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        n = rng.randint(1, 3)
        return {
            "resolution": rng.choice((8, 16, 32)),
            "widths": [log_uniform_int(rng, 4, 256) for _ in range(n)],
            "blocks": [rng.randint(1, 3) for _ in range(n)],
            "kernel_size": rng.choice((3, 5)),
            "batchnorm": rng.random() < 0.5,
            "activation": rng.choice(("relu", "gelu", "silu")),
            "in_channels": 1,
            "num_classes": 10,
        }
