#!/usr/bin/env python
"""The A100 checkpoint on real A100 measurements of well-known transformer layers it never saw.

Usage::

    python benchmarks/accuracy/a100_neusight_layers.py --data ../shared/data [--device a100-sxm4-40gb] [--json]

NeuSight (``neusight_nvidia_fxgraph_node_latency.csv``, MIT) timed every FX node of one-layer versions of
BERT-large, GPT-2 large, GPT-3 2.7B / XL and OPT-1.3B (embeddings, one transformer layer, and the
pooler + classifier or the LM head) at inference on an ``NVIDIA_A100-PCIE-40GB`` (PyTorch 2.1, fp32;
fp32 matmuls are not TF32 there by default). The label of a trace is the **sum of its per-node
latencies** (GPU time of each node timed alone; no launch gaps between nodes): close to the forward
pass of a large batch, which is what these are (14-576 ms).

This script rebuilds each model with the same widths, heads, sequence length, vocabulary and batch
(BERT with ``search_spaces``' ``BertEncoder``, post-norm; the decoders as embeddings + one pre-norm
causal :class:`~search_spaces._layers.TransformerBlock` + final norm + LM head; explicit attention as
in the traces; OPT's ReLU is a GELU here, an element-wise op of < 0.3 % of the time), captures it at
float32 and predicts it on ``--device`` (default the product's ``a100-sxm4-40gb``: same chip, SM count,
clocks, peaks and 40 GB HBM2 bandwidth as the PCIe board; see ``../shared/docs/devices.md``).

Nothing here was used to train, select or calibrate a checkpoint: the printed error is generalisation
(the A100 checkpoint learnt A100 latency from MnasNet-space nets only, and transformers from RTX GPUs).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

_FILE = "neusight_nvidia_fxgraph_node_latency.csv"
_DEVICE = "NVIDIA_A100-PCIE-40GB"

# per NeuSight model name: widths read from the traces' tensor shapes
_MODELS = {
    "bert_large": dict(kind="bert", hidden=1024, heads=16, ffn=4096, vocab=30522),
    "gpt2_large": dict(kind="decoder", hidden=1280, heads=20, ffn=5120, vocab=50257),
    "gpt3_27": dict(kind="decoder", hidden=2560, heads=32, ffn=10240, vocab=50257),
    "gpt3_xl": dict(kind="decoder", hidden=3072, heads=24, ffn=12288, vocab=50257),
    "opt_13": dict(kind="decoder", hidden=2048, heads=32, ffn=8192, vocab=50272),
}


def load_traces(data: Path) -> list[dict]:
    """Inference traces of the A100 in the NeuSight file: ``{trace, model, seq, batch, label_ms, nodes}``."""
    path = data / _FILE if data.is_dir() else data
    sums: dict[str, float] = defaultdict(float)
    nodes: dict[str, int] = defaultdict(int)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["device"] != _DEVICE or "-inf-" not in r["trace"]:
                continue
            sums[r["trace"]] += float(r["latency"] or 0.0)
            nodes[r["trace"]] += 1
    out = []
    for trace in sorted(sums):
        model, _, seq, batch = trace.split("-")
        if model in _MODELS:
            out.append({"trace": trace, "model": model, "seq": int(seq), "batch": int(batch),
                        "label_ms": sums[trace], "nodes": nodes[trace]})
    return out


def build(model: str, seq: int):
    """The one-layer model of a NeuSight trace and its named int64 inputs."""
    import torch
    from torch import nn

    from search_spaces import BertEncoder, TransformerBlock

    c = _MODELS[model]
    if c["kind"] == "bert":
        cfg = {"hidden": c["hidden"], "num_heads": c["heads"], "intermediate": c["ffn"], "vocab_size": c["vocab"],
               "max_position": seq, "type_vocab_size": 2, "depth": 1, "attention": "explicit", "num_classes": 2}
        return BertEncoder(cfg), {"input_ids": ((seq,), "int64"), "attention_mask": ((seq,), "int64")}

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h = c["hidden"]
            self.wte = nn.Embedding(c["vocab"], h)
            self.wpe = nn.Embedding(seq, h)
            self.block = TransformerBlock(h, c["heads"], c["ffn"], impl="explicit", norm_first=True, eps=1e-5)
            self.ln_f = nn.LayerNorm(h, eps=1e-5)
            self.lm_head = nn.Linear(h, c["vocab"], bias=False)
            causal = torch.full((seq, seq), -10000.0).triu(1)
            self.register_buffer("causal", causal[None, None], persistent=False)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = self.wte(input_ids) + self.wpe(pos)[None]
            return self.lm_head(self.ln_f(self.block(x, self.causal)))

    return Decoder(), {"input_ids": ((seq,), "int64")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help=f"folder holding {_FILE} (or the file)")
    ap.add_argument("--device", default="a100-sxm4-40gb", help="catalogue device to predict on")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    import torch

    from dippm_nas import predict
    from dippm_nas.capture import capture
    from dippm_nas.spec import InputSpec

    traces = load_traces(args.data)
    if not traces:
        print(f"no {_DEVICE} inference traces of {sorted(_MODELS)} in {args.data}", file=sys.stderr)
        return 2
    rows = []
    for t in traces:
        torch.manual_seed(0)
        model, inputs = build(t["model"], t["seq"])
        spec = InputSpec(inputs=inputs, batch_size=t["batch"], dtype="float32")
        t0 = time.perf_counter()
        g = capture(model.eval(), spec, cache=False)
        cap_s = time.perf_counter() - t0
        p = predict(g, device=args.device)
        del model
        y, yh, s = t["label_ms"], p.latency_ms, p.latency_ms_std or 0.0
        rows.append({**t, "pred_ms": yh, "std_ms": s, "source": p.latency_source,
                     "prior_ms": p.details.get("prior_latency_ms"), "ape_pct": 100 * abs(yh - y) / y,
                     "within_2sigma": abs(math.log(yh) - math.log(y)) <= 2 * s / yh,
                     "gflop": g.total_flops / 1e9,
                     "outside_training_range": p.details.get("outside_training_range"),
                     "dtype_unseen": p.details.get("dtype_unseen"), "novel": p.details.get("novel"),
                     "novelty": p.details.get("novelty"),
                     "capture_s": cap_s})
    ape = np.array([r["ape_pct"] for r in rows])
    prior_ape = np.array([100 * abs(r["prior_ms"] - r["label_ms"]) / r["label_ms"] for r in rows if r["prior_ms"]])
    lab, pr = np.array([r["label_ms"] for r in rows]), np.array([r["pred_ms"] for r in rows])
    from scipy.stats import kendalltau

    summary = {"n": len(rows), "mape_pct": float(ape.mean()), "median_ape_pct": float(np.median(ape)),
               "prior_mape_pct": float(prior_ape.mean()) if len(prior_ape) else None,
               "kendall_tau": float(kendalltau(lab, pr).statistic),
               "within_2sigma": float(np.mean([r["within_2sigma"] for r in rows])),
               "median_ratio_pred_over_label": float(np.median(pr / lab))}
    if args.json:
        print(json.dumps({"device": args.device, "measured_on": _DEVICE, "rows": rows, "summary": summary}))
        return 0
    print(f"{args.device} predictions vs NeuSight {_DEVICE} sums of per-node latency (fp32, one layer)")
    print(f"{'trace':26s} {'label ms':>9s} {'predicted ms ± σ':>18s} {'source':>10s} {'prior ms':>9s} {'APE %':>7s}  "
          f"±2σ  flags")
    for r in rows:
        flags = ",".join(k for k in ("outside_training_range", "dtype_unseen", "novel") if r.get(k))
        print(f"{r['trace']:26s} {r['label_ms']:9.2f} {r['pred_ms']:9.2f} ± {r['std_ms']:6.2f} {r['source']:>10s} "
              f"{r['prior_ms']:9.2f} {r['ape_pct']:7.1f}  {'yes' if r['within_2sigma'] else 'no ':3s}  {flags}")
    print(f"predicted: MAPE {summary['mape_pct']:.1f} % (median APE {summary['median_ape_pct']:.1f} %), analytic prior "
          f"{summary['prior_mape_pct']:.1f} %, Kendall tau {summary['kendall_tau']:.3f}, within ±2σ "
          f"{summary['within_2sigma']:.2f}, median predicted/label {summary['median_ratio_pred_over_label']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
