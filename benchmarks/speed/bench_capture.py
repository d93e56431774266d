"""Capture speed per model: export, convert, graph build, cache hit, and uncached capture / bare torch.export.

Targets (issue 2): ratio <= 1.5 and cache hit <= 2 ms. Figures are medians of --repeats runs in one process
on this machine; the ratio compares uncached capture with a bare ``torch.export.export`` of the same model
measured in the same run (both warm: TVM and torch imported, one capture done before timing).

    .venv-vision/bin/python benchmarks/speed/bench_capture.py [--models resnet18,vit_b_16] [--batches 1,8] [--repeats 3]

Needs torchvision (scripts/demo.sh makes .venv-vision with it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks._common import machine, median_seconds  # noqa: E402

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "densenet121",
          "vgg16", "vit_b_16", "convnext_tiny", "swin_t", "bert_base_like"]


class _BertLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class BertBaseLike(nn.Module):
    """BERT-base shape: 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, seq 128."""

    def __init__(self, layers: int = 12, d: int = 768, heads: int = 12, ff: int = 3072, vocab: int = 30522,
                 seq: int = 128) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(_BertLayer(d, heads, ff) for _ in range(layers))
        self.pool = nn.Linear(d, d)
        self.seq = seq

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(self.seq, device=input_ids.device)
        x = self.ln(self.tok(input_ids) + self.pos(pos))
        mask = attention_mask[:, None, None, :].to(torch.bool)
        for layer in self.layers:
            x = layer(x, mask)
        return torch.tanh(self.pool(x[:, 0]))


def build(name: str, batch: int):
    from dippm_nas import InputSpec

    if name == "bert_base_like":
        spec = InputSpec(inputs={"input_ids": ((128,), "int64"), "attention_mask": ((128,), "int64")},
                         batch_size=batch)
        return BertBaseLike().eval(), spec
    import torchvision

    return torchvision.models.get_model(name, weights=None).eval(), InputSpec(shape=(3, 224, 224), batch_size=batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from dippm_nas import capture
    from dippm_nas.cache import ConversionCache

    tmp = tempfile.mkdtemp(prefix="dippm-bench-")
    cache = ConversionCache(f"sqlite:///{tmp}/bench.sqlite")
    print(f"# capture benchmark — {machine()}")
    print(f"# medians of {args.repeats} runs; ratio = uncached capture / bare torch.export, same run")
    warm, wspec = build("resnet18", 1)
    capture(warm, wspec, cache=False)  # import TVM, warm caches
    head = (f"{'model':<20}{'batch':>5}{'nodes':>6}{'mode':>18}{'export s':>10}{'convert s':>10}"
            f"{'build ms':>9}{'capture s':>10}{'bare s':>8}{'ratio':>7}{'hit ms':>8}")
    print(head)
    ratios, hits = [], []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            model, spec = build(name, batch)
            args_, kwargs = spec.example_inputs()

            def bare() -> None:
                with torch.no_grad():
                    torch.export.export(model, args_, kwargs)

            graphs = []

            def uncached() -> None:
                graphs.append(capture(model, spec, cache=False))

            t_bare = median_seconds(bare, args.repeats, warmup=0)
            t_cap = median_seconds(uncached, args.repeats, warmup=0)
            g = graphs[-1]
            ex = statistics.median(x.timings["export_s"] for x in graphs)
            cv = statistics.median(x.timings["convert_s"] for x in graphs)
            bd = statistics.median(x.timings["build_s"] for x in graphs)
            capture(model, spec, cache=cache)  # fill the cache
            t_hit = median_seconds(lambda: capture(model, spec, cache=cache), max(20, args.repeats), warmup=2)
            ratio = t_cap / t_bare
            ratios.append(ratio)
            hits.append(t_hit * 1e3)
            print(f"{name:<20}{batch:>5}{g.num_nodes:>6}{g.mode:>18}{ex:>10.3f}{cv:>10.3f}{bd * 1e3:>9.1f}"
                  f"{t_cap:>10.3f}{t_bare:>8.3f}{ratio:>7.2f}{t_hit * 1e3:>8.2f}", flush=True)
    print(f"# ratio: median {statistics.median(ratios):.2f}, max {max(ratios):.2f} (target <= 1.5)")
    print(f"# cache hit: median {statistics.median(hits):.2f} ms, max {max(hits):.2f} ms (target <= 2 ms)")
    cache.close()


if __name__ == "__main__":
    main()
