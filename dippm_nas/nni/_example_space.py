"""An example NNI ``ModelSpace``: a small CNN for 32x32 images with a searchable width, depth and block type.

Used by ``examples/nni/nas_example.py`` and the tests; small enough to train a few steps on a CPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dippm_nas._optional import require

require("nni.nas.nn.pytorch", "nas", "dippm_nas.nni.TinyConvSpace")
import nni  # noqa: E402
from nni.nas.nn.pytorch import LayerChoice, ModelSpace, MutableBatchNorm2d, MutableConv2d, MutableLinear, Repeat  # noqa: E402

__all__ = ["TinyConvSpace"]

#: Widths, depths and block types the space chooses from.
WIDTHS: tuple[int, ...] = (16, 32, 64)
DEPTHS: tuple[int, ...] = (1, 2, 3)
BLOCKS: tuple[str, ...] = ("conv3x3", "conv5x5", "dwsep3x3")


def _block(width: Any, label: str) -> nn.Module:
    """One residual-free block: a LayerChoice between a 3x3 conv, a 5x5 conv and a depthwise-separable 3x3."""
    return LayerChoice({
        "conv3x3": nn.Sequential(MutableConv2d(width, width, 3, padding=1, bias=False),
                                 MutableBatchNorm2d(width), nn.ReLU()),
        "conv5x5": nn.Sequential(MutableConv2d(width, width, 5, padding=2, bias=False),
                                 MutableBatchNorm2d(width), nn.ReLU()),
        "dwsep3x3": nn.Sequential(MutableConv2d(width, width, 3, padding=1, groups=width, bias=False),
                                  MutableConv2d(width, width, 1, bias=False), MutableBatchNorm2d(width), nn.ReLU()),
    }, label=label)


class TinyConvSpace(ModelSpace):
    """Stem conv -> ``depth`` blocks (each a choice of :data:`BLOCKS`) -> global pool -> linear.

    Mutables (labels): ``width`` in :data:`WIDTHS`, ``depth`` in :data:`DEPTHS`, ``block_0``..``block_2``
    in :data:`BLOCKS` (only the first ``depth`` are used): 3 * (3 + 9 + 27) = 117 distinct models.

    Args:
        num_classes: outputs of the classifier.

    Shapes:
        ``(N, 3, H, W) -> (N, num_classes)`` (any ``H, W >= 4``; the examples use 32x32).
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        width = nni.choice("width", list(WIDTHS))
        self.stem = nn.Sequential(MutableConv2d(3, width, 3, stride=2, padding=1, bias=False),
                                  MutableBatchNorm2d(width), nn.ReLU())
        self.blocks = Repeat(lambda i: _block(width, f"block_{i}"), nni.choice("depth", list(DEPTHS)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = MutableLinear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(self.pool(x), 1))
