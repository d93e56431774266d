"""Building blocks shared by the families. Plain ``torch.nn``; no data-dependent control flow, so
``torch.export`` traces every block with static shapes."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ACTIVATIONS", "make_activation", "ConvBNAct", "SqueezeExcite", "LayerNorm2d", "SelfAttention",
           "TransformerBlock", "PoolLinear", "conv_out"]

#: Activation names a config may use, and their modules.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "hardswish": nn.Hardswish,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
}


def make_activation(name: str) -> nn.Module:
    """A fresh activation module for a name of :data:`ACTIVATIONS`."""
    return ACTIVATIONS[name]()


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias) -> BatchNorm2d -> optional activation; padding ``(k - 1) // 2``.

    Args:
        cin: input channels.
        cout: output channels.
        kernel: square kernel side.
        stride: stride.
        groups: conv groups (``cin`` for depthwise).
        act: activation name of :data:`ACTIVATIONS`, or ``None``.
        bn_eps: BatchNorm epsilon.

    Shapes:
        ``(N, cin, H, W) -> (N, cout, ceil(H / stride), ceil(W / stride))`` for odd kernels.
    """

    def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1,
                 act: str | None = "relu", bn_eps: float = 1e-5) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=bn_eps),
        ]
        if act is not None:
            layers.append(make_activation(act))
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: avg-pool -> 1x1 conv (bias) -> act -> 1x1 conv (bias) -> gate -> scale.

    Args:
        channels: channels of the input (and of the gate).
        squeeze: hidden channels.
        act: hidden activation name.
        gate: ``"hardsigmoid"`` or ``"sigmoid"``.

    Shapes:
        ``(N, C, H, W) -> (N, C, H, W)``
    """

    def __init__(self, channels: int, squeeze: int, act: str = "relu", gate: str = "hardsigmoid") -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1, bias=True)
        self.act = make_activation(act)
        self.fc2 = nn.Conv2d(squeeze, channels, 1, bias=True)
        self.gate = nn.Hardsigmoid() if gate == "hardsigmoid" else nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))
        return x * s


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (permute to NHWC, normalise, permute back).

    Shapes:
        ``(N, C, H, W) -> (N, C, H, W)``
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection.

    Args:
        dim: model width; a multiple of ``num_heads``.
        num_heads: attention heads.
        qkv_bias: bias on the QKV projection (the output projection always has one).
        impl: ``"sdpa"`` (``F.scaled_dot_product_attention``, one fused op) or ``"explicit"``
            (matmul -> scale -> (+ mask) -> softmax -> matmul, as eager BERT code does). Same maths,
            different operator graphs.

    Shapes:
        - x: ``(N, L, dim) -> (N, L, dim)``
        - additive mask (optional): broadcastable to ``(N, heads, L, L)``, 0 to keep, a large negative
          number to drop.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, impl: str = "sdpa") -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.impl = impl
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        n, length, dim = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            if mask is not None:
                scores = scores + mask
            out = torch.matmul(torch.softmax(scores, dim=-1), v)
        out = out.transpose(1, 2).reshape(n, length, dim)
        return self.proj(out)


class TransformerBlock(nn.Module):
    """A transformer encoder layer, pre-norm (ViT) or post-norm (BERT).

    Args:
        dim: model width.
        num_heads: attention heads.
        mlp_dim: hidden width of the feed-forward part.
        qkv_bias: bias on the QKV projection.
        impl: attention implementation, see :class:`SelfAttention`.
        norm_first: pre-norm (``x + attn(ln(x))``) if True, post-norm (``ln(x + attn(x))``) if False.
        eps: LayerNorm epsilon.

    Shapes:
        ``(N, L, dim) -> (N, L, dim)``
    """

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool = True, impl: str = "sdpa",
                 norm_first: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(dim, num_heads, qkv_bias=qkv_bias, impl=impl)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.norm_first:
            x = x + self.attn(self.ln1(x), mask)
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.mlp(x))


class PoolLinear(nn.Module):
    """Global average pool -> flatten -> Linear: the head of several families (a block of their plans).

    Shapes:
        ``(N, cin, H, W) -> (N, num_classes)``
    """

    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(x), 1))


def conv_out(side: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Output side of a conv or pool: ``floor((side + 2 * padding - kernel) / stride) + 1``."""
    return (side + 2 * padding - kernel) // stride + 1
