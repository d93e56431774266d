"""``mlp``: multi-layer perceptrons over a flat feature vector."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from dippm_nas.spec import InputSpec
from search_spaces._blocks import BlockPlan, BlockSearchSpace
from search_spaces._layers import make_activation
from search_spaces._params import Choice, IntRange, ListOf
from search_spaces._registry import log_uniform_int, register_space

__all__ = ["MLPSpace", "MLP"]


def _hidden_layer(cin: int, cout: int, norm: str, activation: str) -> list[nn.Module]:
    """Linear -> (LayerNorm | BatchNorm1d) -> activation."""
    layers: list[nn.Module] = [nn.Linear(cin, cout)]
    if norm == "layernorm":
        layers.append(nn.LayerNorm(cout))
    elif norm == "batchnorm":
        layers.append(nn.BatchNorm1d(cout))
    layers.append(make_activation(activation))
    return layers


class MLP(nn.Module):
    """Linear -> (norm) -> activation, repeated, then a Linear to ``out_features``.

    Shapes:
        ``(N, in_features) -> (N, out_features)``
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = cfg["in_features"]
        for w in cfg["hidden"]:
            layers += _hidden_layer(c, w, cfg["norm"], cfg["activation"])
            c = w
        layers.append(nn.Linear(c, cfg["out_features"]))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register_space("mlp")
class MLPSpace(BlockSearchSpace):
    """MLP family. Config keys:

    - ``in_features``: input width, 1..65536
    - ``hidden``: hidden-layer widths, 0..16 layers of 1..16384
    - ``activation``: ``"relu"``, ``"gelu"``, ``"silu"`` or ``"tanh"``
    - ``norm``: ``"none"``, ``"layernorm"`` or ``"batchnorm"`` after each hidden Linear
    - ``out_features``: output width, 1..100000

    Input: one tensor of shape ``(batch, in_features)``.
    """

    params = {
        "in_features": IntRange(1, 65_536),
        "hidden": ListOf(IntRange(1, 16_384), 0, 16),
        "activation": Choice("relu", "gelu", "silu", "tanh"),
        "norm": Choice("none", "layernorm", "batchnorm"),
        "out_features": IntRange(1, 100_000),
    }
    presets = {
        "mnist_mlp": {"in_features": 784, "hidden": [256, 256], "out_features": 10},
    }

    def default_config(self) -> dict[str, Any]:
        return {"in_features": 784, "hidden": [512, 512], "activation": "relu", "norm": "none", "out_features": 10}

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return MLP(config)

    def _blocks(self, config: dict[str, Any]) -> BlockPlan:
        """Every hidden layer (Linear, norm, activation), then the output Linear."""
        c = config["in_features"]
        parts: list[tuple[str, dict[str, Any], tuple[int, ...]]] = []
        for w in config["hidden"]:
            parts.append(("hidden", {"cin": c, "cout": w, "norm": config["norm"], "activation": config["activation"]},
                          (c,)))
            c = w
        parts.append(("out", {"cin": c, "cout": config["out_features"]}, (c,)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        p = params
        if kind == "hidden":
            return nn.Sequential(*_hidden_layer(p["cin"], p["cout"], p["norm"], p["activation"]))
        if kind == "out":
            return nn.Linear(p["cin"], p["cout"])
        raise SearchSpaceError(f"mlp has no block kind {kind!r}; kinds: ['hidden', 'out']")

    def input_spec(self, config: dict[str, Any], batch_size: int = 1, dtype: str = "float32") -> InputSpec:
        """A flat float vector.

        Shapes:
            ``x``: ``(batch_size, in_features)``
        """
        cfg = self.validate(config)
        return InputSpec(shape=(cfg["in_features"],), batch_size=batch_size, dtype=dtype)

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        depth = rng.randint(1, 6)
        return {
            "in_features": rng.choice((16, 32, 64, 128, 256, 512, 784, 1024, 2048, 3072)),
            "hidden": [log_uniform_int(rng, 32, 4096, multiple_of=16) for _ in range(depth)],
            "activation": rng.choice(("relu", "gelu", "silu", "tanh")),
            "norm": rng.choice(("none", "layernorm", "batchnorm")),
            "out_features": rng.choice((1, 10, 100, 1000)),
        }
