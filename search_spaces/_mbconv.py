"""``mbconv``: the MnasNet/EfficientNet-B0 space of Accel-NASBench, built exactly.

Seven stages on the EfficientNet-B0 skeleton (width and depth multiplier 1.0); stage ``i`` repeats
``l[i]`` MBConv layers that share expansion ``e[i]``, kernel ``k[i]`` and squeeze-excitation ``se[i]``.

==========  =====  ======  ====================  ===========================================
stage       in ch  out ch  stride (first layer)  choices
==========  =====  ======  ====================  ===========================================
stem        3      32      2                     3x3 conv, BN, ReLU (fixed)
0           32     16      1                     e {1,4,6}, k {3,5}, l {1,2,3}, se {T,F}
1           16     24      2                     same
2           24     40      2                     same
3           40     80      2                     same
4           80     112     1                     same
5           112    192     2                     same, and l = 4
6           192    320     1                     same
head        320    1280    1                     1x1 conv, BN, ReLU, avg-pool, dropout, FC
==========  =====  ======  ====================  ===========================================

One MBConv layer ``(cin, cout, e, k, s, se)``: expand 1x1 ``cin -> cin*e`` (BN, ReLU; only if e > 1),
depthwise ``k x k`` stride ``s`` (BN, ReLU), SE (avg-pool, 1x1 conv with bias to ``max(1, cin // 4)``
— from the layer's *input* channels —, ReLU, 1x1 conv with bias, Hardsigmoid, multiply), project 1x1
(BN, no activation), residual iff ``s == 1 and cin == cout``. Only a stage's first layer takes its
input channels and stride. This is the builder's "relu" variant that trained and timed the dataset's
models (source: ``/work/shared/docs/accel_nasbench_space.md``, derived from afzalxo/ANB-DatasetCollection).

Published figures: ``mmacs`` / ``mparams`` of a row are thop counts at 1x3x224x224 (eval mode); a model
built here matches both exactly (``tests/search_spaces/test_search_spaces.py``). GPU throughput was measured at
**256x256** (FP16 autocast, channels_last): pass ``resolution=256`` to
:func:`config_from_accel_nasbench_row` when pairing a config with the throughput columns.

CSV encoding: columns ``arch_block{i}_e``, ``arch_block{i}_k``, ``arch_block{i}_l`` (ints) and
``arch_block{i}_se`` (``"True"``/``"False"``) for ``i`` in 0..6 map to ``config["e"][i]`` etc.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import ConvBNAct, SqueezeExcite
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import get_space, make_divisible, register_space, weighted_choice

__all__ = [
    "MBCONV_STAGES",
    "ACCEL_NASBENCH_COLUMNS",
    "MBConvSpace",
    "MBConvNet",
    "MBConvHead",
    "config_from_accel_nasbench_row",
    "accel_nasbench_row_from_config",
]

#: (in channels, out channels, first-layer stride) of the seven stages.
MBCONV_STAGES: tuple[tuple[int, int, int], ...] = (
    (32, 16, 1), (16, 24, 2), (24, 40, 2), (40, 80, 2), (80, 112, 1), (112, 192, 2), (192, 320, 1),
)
_STEM_CH, _HEAD_CH, _DROPOUT = 32, 1280, 0.2
_N = len(MBCONV_STAGES)

#: The architecture columns of the Accel-NASBench CSV, in stage order.
ACCEL_NASBENCH_COLUMNS: tuple[str, ...] = tuple(
    f"arch_block{i}_{f}" for i in range(_N) for f in ("e", "k", "l", "se")
)


class MBConv(nn.Module):
    """One MBConv layer of the Accel-NASBench space (see the module docstring).

    Shapes:
        ``(N, cin, H, W) -> (N, cout, ceil(H / stride), ceil(W / stride))``
    """

    def __init__(self, cin: int, cout: int, expansion: int, kernel: int, stride: int, se: bool) -> None:
        super().__init__()
        exp = make_divisible(cin * expansion, 8)
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act="relu"))
        layers.append(ConvBNAct(exp, exp, kernel, stride=stride, groups=exp, act="relu"))
        if se:
            layers.append(SqueezeExcite(exp, max(1, cin // 4), act="relu", gate="hardsigmoid"))
        layers.append(ConvBNAct(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class MBConvHead(nn.Module):
    """The network's head alone (a block of the plan): 1x1 conv, pool, dropout, classifier, as in
    :class:`MBConvNet`.

    Shapes:
        ``(N, 320, H, W) -> (N, num_classes)``
    """

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.head = ConvBNAct(MBCONV_STAGES[-1][1], _HEAD_CH, 1, act="relu")
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(_DROPOUT)
        self.fc = nn.Linear(_HEAD_CH, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(torch.flatten(self.pool(self.head(x)), 1)))


class MBConvNet(nn.Module):
    """The Accel-NASBench network for per-stage lists ``e``, ``k``, ``l``, ``se``.

    Shapes:
        ``(N, 3, R, R) -> (N, num_classes)``
    """

    def __init__(self, e: list[int], k: list[int], l: list[int], se: list[bool], num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = ConvBNAct(3, _STEM_CH, 3, stride=2, act="relu")
        stages = []
        for (cin, cout, stride), ei, ki, li, sei in zip(MBCONV_STAGES, e, k, l, se):
            stages.append(nn.Sequential(*[
                MBConv(cin if j == 0 else cout, cout, ei, ki, stride if j == 0 else 1, sei) for j in range(li)
            ]))
        self.stages = nn.Sequential(*stages)
        self.head = ConvBNAct(MBCONV_STAGES[-1][1], _HEAD_CH, 1, act="relu")
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(_DROPOUT)
        self.fc = nn.Linear(_HEAD_CH, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.stages(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(self.pool(x), 1)))


def _down(side: int, stride: int) -> int:
    """Side after a conv of odd kernel, padding ``(k - 1) // 2`` and ``stride``."""
    return (side + stride - 1) // stride


@register_space("mbconv")
class MBConvSpace(BlockSearchSpace):
    """Accel-NASBench MBConv space (exact). Config keys:

    - ``e``: 7 ints, expansion per stage, each in {1, 4, 6}
    - ``k``: 7 ints, depthwise kernel per stage, each in {3, 5}
    - ``l``: 7 ints, layers per stage, each in {1, 2, 3} (stage 5: {1, 2, 3, 4})
    - ``se``: 7 bools, squeeze-excitation per stage
    - ``resolution``: input side in pixels, 32..1024 (published MACs at 224, throughput at 256)
    - ``num_classes``: classifier outputs (1000 in the dataset)

    The sampler draws each stage's e, k, l, se uniformly (as the Accel-NASBench sampler does) and
    the resolution from 96..256.
    """

    params = {
        "e": ListOf(Choice(1, 4, 6), _N, _N),
        "k": ListOf(Choice(3, 5), _N, _N),
        "l": ListOf(Choice(1, 2, 3), _N, _N, overrides={5: Choice(1, 2, 3, 4)}),
        "se": ListOf(Choice(True, False), _N, _N),
        "resolution": IntRange(32, 1024),
        "num_classes": IntRange(1, 100_000),
    }
    presets = {
        # EfficientNet-B0 settings with ReLU/Hardsigmoid: 5,288,548 parameters (= torchvision efficientnet_b0).
        "efficientnet_b0_relu": {
            "e": [1, 6, 6, 6, 6, 6, 6], "k": [3, 3, 5, 3, 5, 5, 3], "l": [1, 2, 2, 3, 3, 4, 1],
            "se": [True] * _N, "resolution": 224, "num_classes": 1000,
        },
    }

    def default_config(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.presets["efficientnet_b0_relu"]))

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return MBConvNet(config["e"], config["k"], config["l"], config["se"], config["num_classes"])

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Stem, every MBConv layer ``(cin, cout, e, k, stride, se)`` at its input side, head."""
        side = config["resolution"]
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [("stem", {}, (3, side, side))]
        side = _down(side, 2)
        for (c_in, c_out, stride), e, k, n, se in zip(MBCONV_STAGES, config["e"], config["k"], config["l"],
                                                      config["se"]):
            for j in range(n):
                ci, st = (c_in, stride) if j == 0 else (c_out, 1)
                parts.append(("layer", {"cin": ci, "cout": c_out, "e": e, "k": k, "stride": st, "se": se},
                              (ci, side, side)))
                side = _down(side, st)
        parts.append(("head", {"num_classes": config["num_classes"]}, (MBCONV_STAGES[-1][1], side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "stem":
            return ConvBNAct(3, _STEM_CH, 3, stride=2, act="relu")
        if kind == "layer":
            return MBConv(params["cin"], params["cout"], params["e"], params["k"], params["stride"], params["se"])
        if kind == "head":
            return MBConvHead(params["num_classes"])
        raise SearchSpaceError(f"mbconv has no block kind {kind!r}; kinds: ['stem', 'layer', 'head']")

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        return {
            "e": [rng.choice((1, 4, 6)) for _ in range(_N)],
            "k": [rng.choice((3, 5)) for _ in range(_N)],
            "l": [rng.choice((1, 2, 3, 4) if i == 5 else (1, 2, 3)) for i in range(_N)],
            "se": [rng.choice((True, False)) for _ in range(_N)],
            "resolution": weighted_choice(rng, (96, 128, 160, 192, 224, 256), (1, 1, 1, 1, 2, 2)),
            "num_classes": 1000,
        }


def _as_bool(value: Any, column: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise SearchSpaceError(f"Accel-NASBench column {column!r} must be True/False, got {value!r}")


def _as_int(value: Any, column: str) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise SearchSpaceError(f"Accel-NASBench column {column!r} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not f.is_integer():
        raise SearchSpaceError(f"Accel-NASBench column {column!r} must be an integer, got {value!r}")
    return int(f)


def config_from_accel_nasbench_row(row: Mapping[str, Any], *, resolution: int = 224,
                                   num_classes: int = 1000) -> dict[str, Any]:
    """The ``mbconv`` config of one Accel-NASBench CSV row (or JSON record flattened the same way).

    Args:
        row: a mapping holding the columns :data:`ACCEL_NASBENCH_COLUMNS` (strings as read by
            ``csv.DictReader``, or ints/bools); other columns are ignored.
        resolution: input side for the config: 224 for the ``mmacs``/``mparams`` columns, **256** for
            the GPU throughput columns (the published throughput was measured at 256x256).
        num_classes: classifier outputs (1000, ImageNet-1k, for every published row).

    Returns:
        A validated ``mbconv`` config.

    Raises:
        SearchSpaceError: a column is missing or holds a value outside the space.
    """
    missing = [c for c in ACCEL_NASBENCH_COLUMNS if c not in row]
    if missing:
        raise SearchSpaceError(
            f"an Accel-NASBench row needs the columns {list(ACCEL_NASBENCH_COLUMNS)}; missing {missing}"
        )
    config = {
        "e": [_as_int(row[f"arch_block{i}_e"], f"arch_block{i}_e") for i in range(_N)],
        "k": [_as_int(row[f"arch_block{i}_k"], f"arch_block{i}_k") for i in range(_N)],
        "l": [_as_int(row[f"arch_block{i}_l"], f"arch_block{i}_l") for i in range(_N)],
        "se": [_as_bool(row[f"arch_block{i}_se"], f"arch_block{i}_se") for i in range(_N)],
        "resolution": resolution,
        "num_classes": num_classes,
    }
    return get_space("mbconv").validate(config)


def accel_nasbench_row_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture columns (:data:`ACCEL_NASBENCH_COLUMNS`) of an ``mbconv`` config.

    Values are ints and bools (``se``); the inverse of :func:`config_from_accel_nasbench_row` on those
    columns. Resolution and class count are not columns of the dataset and are dropped.
    """
    cfg = get_space("mbconv").validate(config)
    out: dict[str, Any] = {}
    for i in range(_N):
        out[f"arch_block{i}_e"] = cfg["e"][i]
        out[f"arch_block{i}_k"] = cfg["k"][i]
        out[f"arch_block{i}_l"] = cfg["l"][i]
        out[f"arch_block{i}_se"] = cfg["se"][i]
    return out
