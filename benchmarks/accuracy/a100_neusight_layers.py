#!/usr/bin/env python
"""The A100 checkpoint on real A100 measurements of well-known transformer layers it never saw.

Usage::

    python benchmarks/accuracy/a100_neusight_layers.py --data ../shared/data [--device a100-sxm4-40gb] \
        [--models bert_large,gpt2_large,opt_13] [--json]

Each trace is predicted by the analytic prior (:func:`dippm_nas.prior.predict`: the deployment's centre and σ;
the default predictor's answer is reported beside it) three ways, side by side: **described** (:data:`DESCRIBED`: PyTorch 2.1, no input
copy, the host not recorded), **unknown** (``Deployment()``: the framework and TF32 flags are the running
process's) and **unknown_no_torch** (``Deployment()`` in a process without torch: both PyTorch generations and
their TF32 defaults in the mixture).

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


#: How NeuSight timed its nodes (PyTorch 2.1, float32 without TF32 by default, each node's GPU time: no input
#: copy, no host in the sums); the host is not recorded.
DESCRIBED = {"framework": "torch-2", "versions": {"torch": "2.1.0"}, "input_copy": "none", "autocast": "none"}
#: The columns: the recorded deployment, nothing described (the framework and TF32 flags the running process's),
#: nothing described in a process without torch (both generations in the mixture: a prediction from a saved graph).
MODES = ("described", "unknown", "unknown_no_torch")
#: The models of the deployment target (issue: BERT-large, GPT-2 large, OPT-1.3B).
TARGET_MODELS = ("bert_large", "gpt2_large", "opt_13")


def _predict_modes(g, device: str) -> dict[str, tuple[float, float, float | None]]:
    """``{mode: (predicted ms, σ ms, checkpoint ms)}`` of a graph for each of :data:`MODES`: the analytic prior
    (:func:`dippm_nas.prior.predict`, the deployment's centre and σ) and the default predictor's answer."""
    from unittest import mock

    import dippm_nas.deployment as deployment
    from dippm_nas import Deployment, predict
    from dippm_nas.prior import predict as prior_predict

    out = {}
    for mode in MODES:
        dep = Deployment(**DESCRIBED) if mode == "described" else Deployment()
        with mock.patch.object(deployment, "running_torch", (lambda: None) if mode == "unknown_no_torch"
                               else deployment.running_torch):
            p = prior_predict(g, device, deployment=dep, mig=False)
        # the default predictor caches by the deployment's key within a process, whose torch it takes as given
        c = predict(g, device=device, deployment=dep).latency_ms if mode != "unknown_no_torch" else math.nan
        out[mode] = (p.latency_ms, p.latency_ms_std or 0.0, c)
    return out


def _summary(rows: list[dict], mode: str) -> dict:
    from scipy.stats import kendalltau

    lab = np.array([r["label_ms"] for r in rows])
    pr = np.array([r[mode]["pred_ms"] for r in rows])
    ckpt = np.array([r[mode]["checkpoint_ms"] for r in rows], dtype=float)
    sig = np.array([r[mode]["std_ms"] for r in rows]) / pr
    ratio = pr / lab
    return {"n": len(rows), "mape_pct": float(np.mean(np.abs(ratio - 1)) * 100),
            "checkpoint_mape_pct": float(np.mean(np.abs(ckpt / lab - 1)) * 100),
            "kendall_tau": float(kendalltau(lab, pr).statistic) if len(rows) > 2 else math.nan,
            "within_2sigma": float(np.mean(np.abs(np.log(ratio)) <= 2 * sig)),
            "median_sigma_pct": float(np.median(sig) * 100),
            "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help=f"folder holding {_FILE} (or the file)")
    ap.add_argument("--device", default="a100-sxm4-40gb", help="catalogue device to predict on")
    ap.add_argument("--models", default=",".join(_MODELS),
                    help=f"comma-separated NeuSight models (default all; the deployment target: "
                         f"{','.join(TARGET_MODELS)})")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    import torch

    from dippm_nas.capture import capture
    from dippm_nas.spec import InputSpec

    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = sorted(set(wanted) - set(_MODELS))
    if bad:
        ap.error(f"--models: unknown {bad}; choices {sorted(_MODELS)}")
    traces = [t for t in load_traces(args.data) if t["model"] in wanted]
    if not traces:
        print(f"no {_DEVICE} inference traces of {wanted} in {args.data}", file=sys.stderr)
        return 2
    rows = []
    for t in traces:
        torch.manual_seed(0)
        model, inputs = build(t["model"], t["seq"])
        spec = InputSpec(inputs=inputs, batch_size=t["batch"], dtype="float32")
        t0 = time.perf_counter()
        g = capture(model.eval(), spec)
        cap_s = time.perf_counter() - t0
        del model
        row = {**t, "gflop": g.total_flops / 1e9, "capture_s": cap_s}
        for mode, (yh, s, ckpt) in _predict_modes(g, args.device).items():
            row[mode] = {"pred_ms": yh, "std_ms": s, "checkpoint_ms": ckpt, "ratio": yh / t["label_ms"]}
        rows.append(row)
    summary = {mode: _summary(rows, mode) for mode in MODES}
    if args.json:
        print(json.dumps({"device": args.device, "measured_on": _DEVICE, "described": DESCRIBED, "rows": rows,
                          "summary": summary}))
        return 0
    print(f"{args.device} analytic-prior predictions vs NeuSight {_DEVICE} sums of per-node latency (fp32, one layer); "
          f"described = {DESCRIBED}")
    print(f"{'trace':26s} {'label ms':>9s} " + " ".join(f"{m + ' ms ± σ':>24s}" for m in MODES))
    for r in rows:
        print(f"{r['trace']:26s} {r['label_ms']:9.2f} "
              + " ".join(f"{r[m]['pred_ms']:9.2f} ± {r[m]['std_ms']:6.2f} ({r[m]['ratio']:.2f}x)" for m in MODES))
    for mode in MODES:
        m = summary[mode]
        print(f"{mode:17s} MAPE {m['mape_pct']:5.1f} % (default predictor {m['checkpoint_mape_pct']:5.1f} %), predicted / "
              f"label {m['ratio_min']:.2f}-{m['ratio_max']:.2f}x, Kendall tau {m['kendall_tau']:.3f}, within ±2σ "
              f"{m['within_2sigma']:.2f}, median σ {m['median_sigma_pct']:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
