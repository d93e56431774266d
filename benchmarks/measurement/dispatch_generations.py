#!/usr/bin/env python
"""Per-operator host (dispatch) overhead of PyTorch eager, for comparing torch generations.

Self-contained: needs only torch (no torchvision), runs on torch 1.7+ and 2.x, Python 3.8+.

Two sub-commands:

  measure  Build tiny models with the op mix of torchvision CNNs (ResNet-18/50, MobileNetV2,
           DenseNet-121, ShuffleNetV2, SqueezeNet 1.1, VGG-11) and of ViT / BERT encoders,
           at spatial sizes and widths so small that the arithmetic is negligible: each forward
           is framework overhead (Python + nn.Module + dispatcher + CPU kernel launch).
           CPU tensors, eval mode, torch.no_grad(), one thread.
           Also times single-op loops per op kind. Interleaved repeats; reports min and median.
           Writes one JSON file per run.

  combine  Read the run files of an "old" and a "new" torch environment and write the
           old/new ratios per model and per op kind, with the spread over measurement rounds,
           and geometric-mean summary factors (CNNs; transformer blocks).

Examples:
  python dispatch_generations.py measure --out runs/r1_t2.13.0-py3.11.json --label t2.13.0-py3.11
  python dispatch_generations.py combine --runs runs/*.json --pair t1.8.1-py3.8:t2.13.0-py3.11 --out result.json
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------------------
# helpers usable without torch (combine runs without importing torch)
# --------------------------------------------------------------------------------------


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v > 0]
    if not vals:
        return float("nan")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# --------------------------------------------------------------------------------------
# models (built lazily so that `combine` does not need torch)
# --------------------------------------------------------------------------------------


def build_models(torch, nn, F):  # noqa: C901  (one place for all model definitions)
    """Return {name: (module, example_input, family)} with family 'cnn' or 'transformer'."""

    def conv_bn(cin: int, cout: int, k: int, s: int = 1, groups: int = 1, relu: bool = True,
                relu6: bool = False) -> nn.Sequential:
        layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if relu6:
            layers.append(nn.ReLU6(inplace=True))
        elif relu:
            layers.append(nn.ReLU(inplace=True))
        return nn.Sequential(*layers)

    # ---------------- ResNet (torchvision.models.resnet structure) ----------------
    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin: int, planes: int, stride: int = 1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return self.relu(out)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, planes: int, stride: int = 1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return self.relu(out)

    class ResNet(nn.Module):
        def __init__(self, block, layers: Sequence[int], widths: Sequence[int], num_classes: int = 10):
            super().__init__()
            self.inplanes = widths[0]
            self.conv1 = nn.Conv2d(3, self.inplanes, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(self.inplanes)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            stages = []
            for i, (n, w) in enumerate(zip(layers, widths)):
                stages.append(self._make_layer(block, w, n, 1 if i == 0 else 2))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)

        def _make_layer(self, block, planes: int, blocks: int, stride: int) -> nn.Sequential:
            downsample = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                    nn.BatchNorm2d(planes * block.expansion))
            layers = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * block.expansion
            for _ in range(1, blocks):
                layers.append(block(self.inplanes, planes))
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            x = torch.flatten(self.avgpool(x), 1)
            return self.fc(x)

    # ---------------- MobileNetV2 ----------------
    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
            super().__init__()
            hidden = int(round(inp * expand_ratio))
            self.use_res_connect = stride == 1 and inp == oup
            layers: List[nn.Module] = []
            if expand_ratio != 1:
                layers.append(conv_bn(inp, hidden, 1, relu6=True))
            layers.extend([conv_bn(hidden, hidden, 3, stride, groups=hidden, relu6=True),
                           nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)])
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            if self.use_res_connect:
                return x + self.conv(x)
            return self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self, width_mult: float = 0.25, num_classes: int = 10):
            super().__init__()
            cfg = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                   [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]
            inp = 8
            feats: List[nn.Module] = [conv_bn(3, inp, 3, 2, relu6=True)]
            for t, c, n, s in cfg:
                oup = max(4, int(c * width_mult))
                for i in range(n):
                    feats.append(InvertedResidual(inp, oup, s if i == 0 else 1, t))
                    inp = oup
            last = 64
            feats.append(conv_bn(inp, last, 1, relu6=True))
            self.features = nn.Sequential(*feats)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

        def forward(self, x):
            x = self.features(x)
            x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
            x = torch.flatten(x, 1)
            return self.classifier(x)

    # ---------------- DenseNet-121 ----------------
    class DenseLayer(nn.Module):
        def __init__(self, cin: int, growth: int, bn_size: int):
            super().__init__()
            self.norm1 = nn.BatchNorm2d(cin)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, 1, bias=False)
            self.norm2 = nn.BatchNorm2d(bn_size * growth)
            self.relu2 = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

        def forward(self, inputs: List):
            concated = torch.cat(inputs, 1)
            out = self.conv1(self.relu1(self.norm1(concated)))
            return self.conv2(self.relu2(self.norm2(out)))

    class DenseBlock(nn.ModuleDict):
        def __init__(self, n: int, cin: int, growth: int, bn_size: int):
            super().__init__()
            for i in range(n):
                self.add_module("denselayer%d" % (i + 1), DenseLayer(cin + i * growth, growth, bn_size))

        def forward(self, x):
            features = [x]
            for _name, layer in self.items():
                features.append(layer(features))
            return torch.cat(features, 1)

    class DenseNet(nn.Module):
        def __init__(self, growth: int = 4, block_config=(6, 12, 24, 16), init: int = 8, bn_size: int = 2,
                     num_classes: int = 10):
            super().__init__()
            feats: List[Tuple[str, nn.Module]] = [
                ("conv0", nn.Conv2d(3, init, 7, 2, 3, bias=False)), ("norm0", nn.BatchNorm2d(init)),
                ("relu0", nn.ReLU(inplace=True)), ("pool0", nn.MaxPool2d(3, 2, 1))]
            c = init
            for i, n in enumerate(block_config):
                feats.append(("denseblock%d" % (i + 1), DenseBlock(n, c, growth, bn_size)))
                c = c + n * growth
                if i != len(block_config) - 1:
                    feats.append(("transition%d" % (i + 1), nn.Sequential(
                        nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, 1, bias=False),
                        nn.AvgPool2d(2, 2))))
                    c = c // 2
            feats.append(("norm5", nn.BatchNorm2d(c)))
            self.features = nn.Sequential()
            for name, mod in feats:
                self.features.add_module(name, mod)
            self.classifier = nn.Linear(c, num_classes)

        def forward(self, x):
            out = F.relu(self.features(x), inplace=True)
            out = F.adaptive_avg_pool2d(out, (1, 1))
            out = torch.flatten(out, 1)
            return self.classifier(out)

    # ---------------- ShuffleNetV2 ----------------
    def channel_shuffle(x, groups: int):
        b, c, h, w = x.size()
        x = x.view(b, groups, c // groups, h, w)
        x = torch.transpose(x, 1, 2).contiguous()
        return x.view(b, -1, h, w)

    class ShuffleBlock(nn.Module):
        def __init__(self, inp: int, oup: int, stride: int):
            super().__init__()
            self.stride = stride
            bf = oup // 2
            if stride > 1:
                self.branch1 = nn.Sequential(
                    nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False), nn.BatchNorm2d(inp),
                    nn.Conv2d(inp, bf, 1, 1, 0, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))
            else:
                self.branch1 = nn.Sequential()
            self.branch2 = nn.Sequential(
                nn.Conv2d(inp if stride > 1 else bf, bf, 1, 1, 0, bias=False), nn.BatchNorm2d(bf),
                nn.ReLU(inplace=True),
                nn.Conv2d(bf, bf, 3, stride, 1, groups=bf, bias=False), nn.BatchNorm2d(bf),
                nn.Conv2d(bf, bf, 1, 1, 0, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))

        def forward(self, x):
            if self.stride == 1:
                x1, x2 = x.chunk(2, dim=1)
                out = torch.cat((x1, self.branch2(x2)), dim=1)
            else:
                out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
            return channel_shuffle(out, 2)

    class ShuffleNetV2(nn.Module):
        def __init__(self, repeats=(4, 8, 4), channels=(8, 16, 32, 64, 64), num_classes: int = 10):
            super().__init__()
            self.conv1 = conv_bn(3, channels[0], 3, 2)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inp = channels[0]
            stages = []
            for n, oup in zip(repeats, channels[1:4]):
                seq = [ShuffleBlock(inp, oup, 2)] + [ShuffleBlock(oup, oup, 1) for _ in range(n - 1)]
                stages.append(nn.Sequential(*seq))
                inp = oup
            self.stage2, self.stage3, self.stage4 = stages
            self.conv5 = conv_bn(inp, channels[-1], 1)
            self.fc = nn.Linear(channels[-1], num_classes)

        def forward(self, x):
            x = self.maxpool(self.conv1(x))
            x = self.stage4(self.stage3(self.stage2(x)))
            x = self.conv5(x)
            x = x.mean([2, 3])
            return self.fc(x)

    # ---------------- SqueezeNet 1.1 ----------------
    class Fire(nn.Module):
        def __init__(self, cin: int, sq: int, e1: int, e3: int):
            super().__init__()
            self.squeeze = nn.Conv2d(cin, sq, 1)
            self.squeeze_activation = nn.ReLU(inplace=True)
            self.expand1x1 = nn.Conv2d(sq, e1, 1)
            self.expand1x1_activation = nn.ReLU(inplace=True)
            self.expand3x3 = nn.Conv2d(sq, e3, 3, padding=1)
            self.expand3x3_activation = nn.ReLU(inplace=True)

        def forward(self, x):
            x = self.squeeze_activation(self.squeeze(x))
            return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                              self.expand3x3_activation(self.expand3x3(x))], 1)

    class SqueezeNet(nn.Module):
        def __init__(self, num_classes: int = 10):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
                Fire(8, 2, 8, 8), Fire(16, 2, 8, 8), nn.MaxPool2d(3, 2, ceil_mode=True),
                Fire(16, 4, 16, 16), Fire(32, 4, 16, 16), nn.MaxPool2d(3, 2, ceil_mode=True),
                Fire(32, 6, 24, 24), Fire(48, 6, 24, 24), Fire(48, 8, 32, 32), Fire(64, 8, 32, 32))
            self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(64, num_classes, 1),
                                            nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)))

        def forward(self, x):
            return torch.flatten(self.classifier(self.features(x)), 1)

    # ---------------- VGG-11 ----------------
    class VGG(nn.Module):
        def __init__(self, cfg=(8, "M", 16, "M", 32, 32, "M", 64, 64, "M", 64, 64, "M"), num_classes: int = 10):
            super().__init__()
            layers: List[nn.Module] = []
            c = 3
            for v in cfg:
                if v == "M":
                    layers.append(nn.MaxPool2d(2, 2))
                else:
                    layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                    c = int(v)
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
            self.classifier = nn.Sequential(
                nn.Linear(c * 49, 64), nn.ReLU(True), nn.Dropout(), nn.Linear(64, 64), nn.ReLU(True),
                nn.Dropout(), nn.Linear(64, num_classes))

        def forward(self, x):
            x = self.avgpool(self.features(x))
            return self.classifier(torch.flatten(x, 1))

    # ---------------- Transformer encoder (ViT / BERT) ----------------
    class Attention(nn.Module):
        def __init__(self, dim: int, heads: int):
            super().__init__()
            self.heads = heads
            self.scale = (dim // heads) ** -0.5
            self.qkv = nn.Linear(dim, dim * 3)
            self.proj = nn.Linear(dim, dim)
            self.attn_drop = nn.Dropout(0.1)

        def forward(self, x, mask=None):
            b, n, c = x.shape
            qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            attn = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            if mask is not None:
                attn = attn + mask
            attn = self.attn_drop(attn.softmax(dim=-1))
            out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, c)
            return self.proj(out)

    class Mlp(nn.Module):
        def __init__(self, dim: int, hidden: int):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(hidden, dim)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(self.fc2(self.act(self.fc1(x))))

    class PreLNBlock(nn.Module):  # ViT
        def __init__(self, dim: int, heads: int):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim)
            self.attn = Attention(dim, heads)
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, dim * 4)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class PostLNBlock(nn.Module):  # BERT
        def __init__(self, dim: int, heads: int):
            super().__init__()
            self.attn = Attention(dim, heads)
            self.norm1 = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, dim * 4)
            self.norm2 = nn.LayerNorm(dim)

        def forward(self, x, mask):
            x = self.norm1(x + self.attn(x, mask))
            return self.norm2(x + self.mlp(x))

    class ViT(nn.Module):
        def __init__(self, dim: int = 32, depth: int = 4, heads: int = 4, patch: int = 4, num_classes: int = 10):
            super().__init__()
            self.patch_embed = nn.Conv2d(3, dim, patch, patch)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.pos_embed = nn.Parameter(torch.zeros(1, 1 + 4, dim))
            self.blocks = nn.Sequential(*[PreLNBlock(dim, heads) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            x = self.patch_embed(x).flatten(2).transpose(1, 2)
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
            x = x + self.pos_embed
            x = self.norm(self.blocks(x))
            return self.head(x[:, 0])

    class Bert(nn.Module):
        def __init__(self, vocab: int = 100, dim: int = 32, depth: int = 4, heads: int = 4, seq: int = 8):
            super().__init__()
            self.word = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(seq, dim)
            self.norm = nn.LayerNorm(dim)
            self.drop = nn.Dropout(0.1)
            self.blocks = nn.ModuleList([PostLNBlock(dim, heads) for _ in range(depth)])
            self.pooler = nn.Linear(dim, dim)
            self.register_buffer("position_ids", torch.arange(seq).unsqueeze(0))

        def forward(self, ids, attention_mask):
            mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
            x = self.drop(self.norm(self.word(ids) + self.pos(self.position_ids)))
            for blk in self.blocks:
                x = blk(x, mask)
            return torch.tanh(self.pooler(x[:, 0]))

    img16 = torch.randn(1, 3, 16, 16)
    img32 = torch.randn(1, 3, 32, 32)
    ids = torch.randint(0, 100, (1, 8))
    am = torch.ones(1, 8, dtype=torch.long)
    return {
        "resnet18": (ResNet(BasicBlock, (2, 2, 2, 2), (8, 8, 16, 16)), (img16,), "cnn"),
        "resnet50": (ResNet(Bottleneck, (3, 4, 6, 3), (4, 4, 4, 4)), (img16,), "cnn"),
        "mobilenet_v2": (MobileNetV2(), (img16,), "cnn"),
        "densenet121": (DenseNet(), (img32,), "cnn"),
        "shufflenet_v2": (ShuffleNetV2(), (img16,), "cnn"),
        "squeezenet1_1": (SqueezeNet(), (img32,), "cnn"),
        "vgg11": (VGG(), (img32,), "cnn"),
        "vit_tiny": (ViT(), (img16[:, :, :8, :8].contiguous(),), "transformer"),
        "bert_tiny": (Bert(), (ids, am), "transformer"),
    }


def build_kinds(torch, nn, F) -> Dict[str, Tuple[Callable[[], object], str]]:
    """Single-op closures: {name: (fn, kind_group)}. Tiny tensors; each call is one torch-level op."""
    x = torch.randn(1, 8, 8, 8)
    y = torch.randn(1, 8, 8, 8)
    conv3 = nn.Conv2d(8, 8, 3, 1, 1, bias=False).eval()
    conv1 = nn.Conv2d(8, 8, 1, bias=False).eval()
    dw = nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False).eval()
    bn = nn.BatchNorm2d(8).eval()
    relu = nn.ReLU(inplace=True)
    relu6 = nn.ReLU6(inplace=True)
    mp = nn.MaxPool2d(3, 2, 1)
    gap = nn.AdaptiveAvgPool2d((1, 1))
    ident = nn.Identity()
    t = torch.randn(1, 8, 32)
    lin = nn.Linear(32, 32).eval()
    ln = nn.LayerNorm(32).eval()
    gelu = nn.GELU()
    a4 = torch.randn(1, 4, 8, 8)
    b4 = torch.randn(1, 4, 8, 8)
    xr = torch.randn(1, 8, 8, 8)
    return {
        "conv2d_3x3_module": (lambda: conv3(x), "conv"),
        "conv2d_1x1_module": (lambda: conv1(x), "conv"),
        "conv2d_dw3x3_module": (lambda: dw(x), "conv"),
        "conv2d_3x3_functional": (lambda: F.conv2d(x, conv3.weight, None, 1, 1), "conv"),
        "batchnorm2d_module": (lambda: bn(x), "batchnorm"),
        "relu_inplace_module": (lambda: relu(xr), "elementwise"),
        "relu6_inplace_module": (lambda: relu6(xr), "elementwise"),
        "add_tensor": (lambda: x + y, "elementwise"),
        "add_inplace": (lambda: xr.add_(y), "elementwise"),
        "mul_scalar": (lambda: x * 0.5, "elementwise"),
        "gelu_module": (lambda: gelu(t), "elementwise"),
        "maxpool2d_module": (lambda: mp(x), "pool"),
        "adaptive_avgpool_module": (lambda: gap(x), "pool"),
        "linear_module": (lambda: lin(t), "linear"),
        "matmul": (lambda: torch.matmul(a4, b4), "linear"),
        "layernorm_module": (lambda: ln(t), "layernorm"),
        "softmax": (lambda: a4.softmax(dim=-1), "softmax"),
        "view": (lambda: x.view(1, -1), "view_reshape"),
        "reshape": (lambda: x.reshape(1, 2, 4, 64), "view_reshape"),
        "flatten": (lambda: torch.flatten(x, 1), "view_reshape"),
        "transpose_contiguous": (lambda: x.transpose(1, 2).contiguous(), "view_reshape"),
        "chunk2": (lambda: x.chunk(2, dim=1), "view_reshape"),
        "cat2": (lambda: torch.cat((x, y), 1), "cat"),
        "module_call_identity": (lambda: ident(x), "python_module_call"),
    }


# --------------------------------------------------------------------------------------
# op counting
# --------------------------------------------------------------------------------------


def count_ops(torch, fn: Callable[[], object]) -> Dict[str, object]:
    """Top-level ATen ops of one call (torch autograd profiler; events with no CPU parent)."""
    with torch.autograd.profiler.profile() as prof:
        fn()
    events = list(prof.function_events)
    names: Dict[str, int] = {}
    total = 0
    for ev in events:
        if not ev.name.startswith("aten::"):
            continue
        parent = getattr(ev, "cpu_parent", None)
        if parent is not None and parent.name.startswith("aten::"):
            continue
        total += 1
        names[ev.name] = names.get(ev.name, 0) + 1
    return {"top_level_aten_ops": total, "by_name": dict(sorted(names.items()))}


def count_leaf_module_calls(model) -> Tuple[List[int], list]:
    counter = [0]
    handles = []
    for m in model.modules():
        if len(list(m.children())) == 0:
            handles.append(m.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1)))
    return counter, handles


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------


def _time_block(fn: Callable[[], object], n: int) -> Tuple[float, float]:
    """(thread CPU seconds, wall seconds) per call, averaged over n calls (gc disabled during the block).

    Thread CPU time (CLOCK_THREAD_CPUTIME_ID) leaves out the time this thread sat preempted while
    other processes ran on the shared cores; wall time is kept for comparison.
    """
    gc.collect()
    gc.disable()
    try:
        c0 = time.thread_time()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        c1 = time.thread_time()
    finally:
        gc.enable()
    return (c1 - c0) / n, (t1 - t0) / n


def _calibrate(fn: Callable[[], object], target_s: float) -> int:
    for _ in range(20):  # warm-up
        fn()
    n = 10
    while True:
        t = _time_block(fn, n)[0] * n
        if t >= 0.02 or n >= 1_000_000:
            break
        n *= 4
    per = t / n
    return max(5, int(target_s / per))


def measure(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(0)

    models = build_models(torch, nn, F)
    kinds = build_kinds(torch, nn, F)

    items: Dict[str, Callable[[], object]] = {}
    info: Dict[str, Dict[str, object]] = {}
    with torch.no_grad():
        for name, (model, inputs, family) in models.items():
            model.eval()
            counter, handles = count_leaf_module_calls(model)
            model(*inputs)
            leaf_calls = counter[0]
            for h in handles:
                h.remove()
            ops = count_ops(torch, lambda m=model, i=inputs: m(*i))
            info[name] = {"family": family, "leaf_module_calls": leaf_calls,
                          "n_params": sum(p.numel() for p in model.parameters()), **ops}
            items["model:" + name] = (lambda m=model, i=inputs: m(*i))
        for name, (fn, group) in kinds.items():
            ops = count_ops(torch, fn)
            info[name] = {"group": group, **ops}
            items["kind:" + name] = fn

        ns = {k: _calibrate(fn, args.block_s) for k, fn in items.items()}
        samples: Dict[str, List[float]] = {k: [] for k in items}
        wall_samples: Dict[str, List[float]] = {k: [] for k in items}
        order = list(items)
        t_start = time.time()
        for r in range(args.repeats):
            seq = order if r % 2 == 0 else list(reversed(order))  # interleaved, alternating order
            for k in seq:
                cpu_s, wall_s = _time_block(items[k], ns[k])
                samples[k].append(cpu_s * 1e6)
                wall_samples[k].append(wall_s * 1e6)
        wall = time.time() - t_start

    out_models: Dict[str, object] = {}
    out_kinds: Dict[str, object] = {}
    for key, vals in samples.items():
        kind, name = key.split(":", 1)
        rec = dict(info[name])
        rec.update({"n_calls_per_block": ns[key], "us_per_call_samples": [round(v, 4) for v in vals],
                    "us_per_call_min": min(vals), "us_per_call_median": statistics.median(vals),
                    "wall_us_per_call_samples": [round(v, 4) for v in wall_samples[key]],
                    "wall_us_per_call_min": min(wall_samples[key]),
                    "wall_us_per_call_median": statistics.median(wall_samples[key])})
        if kind == "model":
            nops = rec["top_level_aten_ops"]
            rec["us_per_op_min"] = rec["us_per_call_min"] / nops
            rec["us_per_op_median"] = rec["us_per_call_median"] / nops
            out_models[name] = rec
        else:
            out_kinds[name] = rec

    result = {
        "label": args.label,
        "torch_version": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "cpu_model": cpu_model_name(),
        "machine": platform.machine(),
        "date_utc": _dt.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loadavg_1min_at_end": os.getloadavg()[0],
        "num_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "block_s": args.block_s,
        "timing_wall_s": wall,
        "mode": "CPU tensors, eval(), torch.no_grad(), torch.set_num_threads(1), gc disabled per block",
        "clock": "us_per_call_* = thread CPU time (time.thread_time); wall_us_per_call_* = time.perf_counter",
        "models": out_models,
        "kinds": out_kinds,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)

    print("torch %s  python %s  cpu %s  label %s" % (torch.__version__, platform.python_version(),
                                                     result["cpu_model"], args.label))
    print("%-16s %8s %8s %12s %12s %10s %10s" % ("model", "aten_ops", "modules", "fwd_min_us", "fwd_med_us",
                                                 "us/op_min", "us/op_med"))
    for name, rec in out_models.items():
        print("%-16s %8d %8d %12.1f %12.1f %10.3f %10.3f" % (
            name, rec["top_level_aten_ops"], rec["leaf_module_calls"], rec["us_per_call_min"],
            rec["us_per_call_median"], rec["us_per_op_min"], rec["us_per_op_median"]))
    print("%-26s %-18s %8s %10s %10s" % ("kind", "group", "aten_ops", "us_min", "us_med"))
    for name, rec in out_kinds.items():
        print("%-26s %-18s %8d %10.3f %10.3f" % (name, rec["group"], rec["top_level_aten_ops"],
                                                  rec["us_per_call_min"], rec["us_per_call_median"]))
    print("wrote %s (timing %.1f s)" % (args.out, wall))


# --------------------------------------------------------------------------------------
# combine
# --------------------------------------------------------------------------------------


def _load(paths: Sequence[str]) -> List[dict]:
    runs = []
    for p in sorted(paths):
        with open(p) as fh:
            d = json.load(fh)
        d["_path"] = p
        runs.append(d)
    runs.sort(key=lambda r: r["date_utc"])
    return runs


def _env(runs: List[dict]) -> Dict[str, object]:
    tv = sorted({r["torch_version"] for r in runs})
    pv = sorted({r["python_version"] for r in runs})
    if len(tv) != 1 or len(pv) != 1:
        raise SystemExit("runs with one label mix environments: torch %s python %s" % (tv, pv))
    return {"torch_version": tv[0], "python_version": pv[0], "torch_cuda_build": runs[0].get("torch_cuda_build"),
            "cpu_model": runs[0]["cpu_model"], "runs": [r["_path"] for r in runs],
            "dates_utc": [r["date_utc"] for r in runs]}


def _ratio_stats(old_runs: List[dict], new_runs: List[dict], section: str, name: str,
                 metric: str = "us_per_call") -> Dict[str, object]:
    """old/new ratio of the per-call minimum: overall (min over all runs) and per round (paired by date order)."""
    o = [r[section][name][metric + "_min"] for r in old_runs]
    n = [r[section][name][metric + "_min"] for r in new_runs]
    om = [r[section][name][metric + "_median"] for r in old_runs]
    nm = [r[section][name][metric + "_median"] for r in new_runs]
    per_round = [a / b for a, b in zip(o, n)]
    return {
        "old_us_min": min(o), "new_us_min": min(n),
        "old_us_median_of_run_medians": statistics.median(om), "new_us_median_of_run_medians": statistics.median(nm),
        "ratio_of_mins": min(o) / min(n),
        "ratio_of_medians": statistics.median(om) / statistics.median(nm),
        "ratio_per_round_of_mins": [round(x, 4) for x in per_round],
        "ratio_round_spread": [min(per_round), max(per_round)] if per_round else None,
    }


# Models left out of the "cnn_without_depthwise" summary: their CPU time is dominated by the CPU
# implementation of depthwise (grouped) convolution, which changed between releases (torch 1.8 on CPU
# runs a grouped convolution as one thnn_conv2d call per group, seen with the profiler; torch 2.x runs
# one oneDNN convolution). That is CPU kernel work, not the framework dispatch path this script targets.
_DEPTHWISE_MODELS = ("mobilenet_v2", "shufflenet_v2")
# Op-kind groups whose single-op time is mostly CPU kernel work rather than dispatch.
_KERNEL_GROUPS = ("conv",)


def compare(old_runs: List[dict], new_runs: List[dict], count_runs: List[dict]) -> Dict[str, object]:
    out: Dict[str, object] = {"old": _env(old_runs), "new": _env(new_runs), "models": {}, "kinds": {},
                              "kind_groups": {}}
    for name in old_runs[0]["models"]:
        if name not in new_runs[0]["models"]:
            continue
        rec = _ratio_stats(old_runs, new_runs, "models", name)
        wall = _ratio_stats(old_runs, new_runs, "models", name, "wall_us_per_call")
        mo, mn = old_runs[0]["models"][name], new_runs[0]["models"][name]
        # one op count for both versions: the profiler count of the --count-label environment
        ref_ops = count_runs[0]["models"][name]["top_level_aten_ops"]
        rec.update({"family": mo["family"], "op_count_used_for_both": ref_ops,
                    "aten_ops_old_profiler": mo["top_level_aten_ops"], "aten_ops_new_profiler": mn["top_level_aten_ops"],
                    "leaf_module_calls": mn["leaf_module_calls"],
                    "old_us_per_op_min": rec["old_us_min"] / ref_ops, "new_us_per_op_min": rec["new_us_min"] / ref_ops,
                    "wall_clock_ratio_of_mins": wall["ratio_of_mins"]})
        out["models"][name] = rec
    for name in old_runs[0]["kinds"]:
        if name not in new_runs[0]["kinds"]:
            continue
        rec = _ratio_stats(old_runs, new_runs, "kinds", name)
        rec["group"] = old_runs[0]["kinds"][name]["group"]
        out["kinds"][name] = rec
    groups: Dict[str, List[str]] = {}
    for name, rec in out["kinds"].items():
        groups.setdefault(rec["group"], []).append(name)
    nrounds = min(len(old_runs), len(new_runs))
    for g, names in groups.items():
        per_round = [geomean([out["kinds"][k]["ratio_per_round_of_mins"][i] for k in names]) for i in range(nrounds)]
        out["kind_groups"][g] = {"members": names,
                                 "geomean_ratio_of_mins": geomean([out["kinds"][k]["ratio_of_mins"] for k in names]),
                                 "geomean_ratio_of_medians": geomean([out["kinds"][k]["ratio_of_medians"]
                                                                      for k in names]),
                                 "round_spread": [min(per_round), max(per_round)] if per_round else None}
    summary = {}
    fams = {"cnn": [k for k, v in out["models"].items() if v["family"] == "cnn"],
            "cnn_without_depthwise": [k for k, v in out["models"].items()
                                      if v["family"] == "cnn" and k not in _DEPTHWISE_MODELS],
            "transformer": [k for k, v in out["models"].items() if v["family"] == "transformer"]}
    for fam, names in fams.items():
        per_round = [geomean([out["models"][k]["ratio_per_round_of_mins"][i] for k in names]) for i in range(nrounds)]
        summary[fam] = {
            "models": names,
            "geomean_ratio_of_mins": geomean([out["models"][k]["ratio_of_mins"] for k in names]),
            "geomean_ratio_of_medians": geomean([out["models"][k]["ratio_of_medians"] for k in names]),
            "geomean_wall_clock_ratio_of_mins": geomean([out["models"][k]["wall_clock_ratio_of_mins"] for k in names]),
            "old_us_per_op_min_geomean": geomean([out["models"][k]["old_us_per_op_min"] for k in names]),
            "new_us_per_op_min_geomean": geomean([out["models"][k]["new_us_per_op_min"] for k in names]),
            "geomean_per_round": [round(x, 4) for x in per_round],
            "round_spread": [min(per_round), max(per_round)] if per_round else None,
        }
    nonconv = [k for k, v in out["kinds"].items() if v["group"] not in _KERNEL_GROUPS]
    per_round = [geomean([out["kinds"][k]["ratio_per_round_of_mins"][i] for k in nonconv]) for i in range(nrounds)]
    summary["single_op_kinds_without_conv"] = {
        "kinds": nonconv,
        "geomean_ratio_of_mins": geomean([out["kinds"][k]["ratio_of_mins"] for k in nonconv]),
        "geomean_ratio_of_medians": geomean([out["kinds"][k]["ratio_of_medians"] for k in nonconv]),
        "geomean_per_round": [round(x, 4) for x in per_round],
        "round_spread": [min(per_round), max(per_round)] if per_round else None,
    }
    out["summary"] = summary
    return out


def _print_comparison(key: str, out: Dict[str, object]) -> None:
    print("== %s   old: torch %s py %s   new: torch %s py %s" % (
        key, out["old"]["torch_version"], out["old"]["python_version"],
        out["new"]["torch_version"], out["new"]["python_version"]))
    for fam, s in out["summary"].items():
        print("  %-30s geomean old/new (mins) %.3f  (medians) %.3f  per-round %s" % (
            fam, s["geomean_ratio_of_mins"], s["geomean_ratio_of_medians"], s["geomean_per_round"]))
    for name, rec in out["models"].items():
        print("    %-16s %.3f  rounds %s  us/op old %.2f new %.2f" % (
            name, rec["ratio_of_mins"], rec["ratio_per_round_of_mins"], rec["old_us_per_op_min"],
            rec["new_us_per_op_min"]))
    for g, rec in out["kind_groups"].items():
        print("    kind %-20s %.3f  rounds [%.3f, %.3f]" % (g, rec["geomean_ratio_of_mins"], rec["round_spread"][0],
                                                          rec["round_spread"][1]))


def combine(args: argparse.Namespace) -> None:
    runs = _load(args.runs)
    by_label: Dict[str, List[dict]] = {}
    for r in runs:
        by_label.setdefault(r["label"], []).append(r)
    count_label = args.count_label or args.pair[0].split(":")[1]
    if count_label not in by_label:
        raise SystemExit("--count-label %s: labels present are %s" % (count_label, sorted(by_label)))
    comparisons: Dict[str, object] = {}
    for pair in args.pair:
        old, new = pair.split(":")
        if old not in by_label or new not in by_label:
            raise SystemExit("pair %s: labels present are %s" % (pair, sorted(by_label)))
        comparisons["%s/%s" % (old, new)] = compare(by_label[old], by_label[new], by_label[count_label])
        _print_comparison("%s/%s" % (old, new), comparisons["%s/%s" % (old, new)])
    primary = args.pair[0].replace(":", "/")
    for key in list(comparisons):
        if key == primary:
            continue
        full = comparisons[key]  # secondary comparisons: summaries and per-model / per-group ratios only
        comparisons[key] = {
            "old": {k: full["old"][k] for k in ("torch_version", "python_version", "torch_cuda_build")},
            "new": {k: full["new"][k] for k in ("torch_version", "python_version", "torch_cuda_build")},
            "summary": full["summary"],
            "models": {k: {"ratio_of_mins": v["ratio_of_mins"], "ratio_round_spread": v["ratio_round_spread"],
                           "old_us_per_op_min": v["old_us_per_op_min"], "new_us_per_op_min": v["new_us_per_op_min"]}
                       for k, v in full["models"].items()},
            "kind_groups": {k: {"geomean_ratio_of_mins": v["geomean_ratio_of_mins"], "round_spread": v["round_spread"]}
                            for k, v in full["kind_groups"].items()},
            "kinds": {k: round(v["ratio_of_mins"], 4) for k, v in full["kinds"].items()},
        }
    result = {
        "what": ("framework generation factor of PyTorch eager per-operator host (CPU-side) overhead: "
                 "old/new ratio of forward time per model and of single-op time per op kind, CPU tensors"),
        "definition": ("ratio = old / new per-call host time; per-call time is thread CPU time "
                       "(time.thread_time) of a block of calls / calls; 'mins' = fastest block over the "
                       "interleaved repeats of a run, then the fastest over runs; per-round ratios pair the "
                       "i-th run (by date) of old with the i-th of new; summaries are geometric means over models"),
        "op_count_label": count_label,
        "op_counts": {k: v["top_level_aten_ops"] for k, v in by_label[count_label][0]["models"].items()},
        "op_counts_by_label": {lab: {k: v["top_level_aten_ops"] for k, v in rs[0]["models"].items()}
                               for lab, rs in sorted(by_label.items())},
        "us_min_by_label": {
            lab: {"models_us_per_op": {k: round(min(r["models"][k]["us_per_call_min"] for r in rs)
                                              / by_label[count_label][0]["models"][k]["top_level_aten_ops"], 3)
                                       for k in rs[0]["models"]},
                  "kinds_us_per_call": {k: round(min(r["kinds"][k]["us_per_call_min"] for r in rs), 3)
                                        for k in rs[0]["kinds"]}}
            for lab, rs in sorted(by_label.items())},
        "primary": primary,
        "primary_summary": {k: {"factor": v["geomean_ratio_of_mins"], "round_spread": v["round_spread"],
                                "median_based": v["geomean_ratio_of_medians"]}
                            for k, v in comparisons[primary]["summary"].items()},
        "primary_kind_groups": {k: {"factor": v["geomean_ratio_of_mins"], "round_spread": v["round_spread"]}
                                for k, v in comparisons[primary]["kind_groups"].items()},
        "environments": {lab: _env(rs) for lab, rs in sorted(by_label.items())},
        "comparisons": comparisons,
        "commands": args.command or [],
    }
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print("wrote", args.out)


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    m = sub.add_parser("measure", help="time this torch environment")
    m.add_argument("--out", required=True)
    m.add_argument("--label", default="")
    m.add_argument("--repeats", type=int, default=9, help="interleaved repeats per run")
    m.add_argument("--block-s", type=float, default=0.04, help="target seconds per timed block")
    c = sub.add_parser("combine", help="old/new ratios from run files")
    c.add_argument("--runs", nargs="+", required=True, help="run JSON files (grouped by their --label)")
    c.add_argument("--pair", action="append", required=True,
                   help="OLD_LABEL:NEW_LABEL; the first --pair is the primary comparison")
    c.add_argument("--count-label", default=None,
                   help="label whose profiler op counts are used for every comparison (default: new of first pair)")
    c.add_argument("--command", action="append", help="command line to record in the result")
    c.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        measure(args)
    elif args.cmd == "combine":
        combine(args)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
