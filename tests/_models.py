"""Tiny models shared by the tests (no torchvision; shapes small enough for milliseconds)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x if self.down is None else self.down(x)
        return F.relu(y + skip)


class TinyResNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, stride: int, se: bool) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                                nn.BatchNorm2d(hidden), nn.Hardswish())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden, hidden // 4, 1), nn.ReLU(),
                                nn.Conv2d(hidden // 4, hidden, 1), nn.Hardsigmoid()) if se else None
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(self.expand(x))
        if self.se is not None:
            y = y * self.se(y)
        y = self.project(y)
        return x + y if self.use_res else y


class TinyMobileNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        self.blocks = nn.Sequential(InvertedResidual(8, 8, 2, 1, True), InvertedResidual(8, 16, 3, 2, False),
                                    InvertedResidual(16, 16, 3, 1, True))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 32), nn.Hardswish(),
                                  nn.Dropout(0.2), nn.Linear(32, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class TinyVGG(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Linear(16 * 4 * 4, 32), nn.ReLU(), nn.Dropout(), nn.Linear(32, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class EncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer with explicit SDPA (so attention is one op)."""

    def __init__(self, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyViT(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, depth: int = 2, patch: int = 8, image: int = 32) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.tokens = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, self.tokens + 1, dim))
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, 2 * dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


class TinyBert(nn.Module):
    """Token ids + attention mask, two named inputs."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, depth: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq, dim))
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, 4 * dim) for _ in range(depth))
        self.pool = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids) + self.pos
        mask = attention_mask[:, None, None, :].to(torch.bool)
        for layer in self.layers:
            x = layer(x, mask)
        return torch.tanh(self.pool(x[:, 0]))


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return x


class WindowAttention(nn.Module):
    """Attention over 5-D ``(B, heads, windows, tokens, head_dim)`` tensors (Hiera's mask units, Twins' windows) of
    an input ``(B, windows, tokens, channels)``: the fused kernels take 4-D tensors only, so eager runs the SDPA math
    path in every PyTorch version."""

    def __init__(self, channels: int = 64, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, channels // heads
        self.qkv = nn.Linear(channels, 3 * channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, w, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, w, n, 3, self.heads, self.head_dim).permute(3, 0, 4, 1, 2, 5).unbind(0)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 3).reshape(b, w, n, c)


def features_deployment():
    """The deployment a checkpoint's features are computed for (eager, the default host, PyTorch 2.x, no input
    copy): every setting described, so a prediction carries the model's own σ and no deployment spread."""
    from dippm_nas import Deployment
    from dippm_nas.devices import DEFAULT_HOST_PROFILE

    return Deployment(host=DEFAULT_HOST_PROFILE, framework="torch-2", input_copy="none")
