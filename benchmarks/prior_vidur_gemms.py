#!/usr/bin/env python
"""The analytic prior on real A100 and H100 timings of LLM layer GEMMs (Vidur), a spec-sheet device check.

Usage::

    python benchmarks/prior_vidur_gemms.py --data ../shared/data [--tokens 1,16,128,512,2048,8192,32768] [--json]

Vidur (``vidur_a100_h100_llm_layer_op_profiling.csv``, MIT) profiled the operators of one transformer layer
of seven LLMs (Llama-2 7B/70B, Llama-3 8B/70B, CodeLlama-34B, Qwen-72B, InternLM-20B, phi-2) at
1-32,768 tokens and 1, 2, 4, 8 tensor-parallel workers on an A100 and an H100 (fp16). This script takes
the four projections (QKV, attention output, MLP up, MLP down: GEMMs of ``num_tokens`` rows over the
layer's widths divided by the tensor-parallel degree; the MLP up projection is two-wide when the MLP is
gated), captures each as one ``nn.Linear`` in float16 and compares the median time with the analytic
prior's figure (what ``dippm_nas.predict`` answers for a device without a checkpoint).

Vidur does not record the board variant. The A100 rows are compared with ``a100-sxm4-80gb`` and the H100
rows with both ``h100-sxm5-80gb`` and ``h100-pcie-80gb`` (114 vs 132 SMs, 2.0 vs 3.35 TB/s): the variant
whose error is lower is a hint, not a fact. Nothing here trains or fits anything: the H100 constants are the
geometric mean of the fitted GPUs (``fitted.json``, ``"*"``), and the A100-80GB ones the A100-40GB fit.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

_FILE = "vidur_a100_h100_llm_layer_op_profiling.csv"
_DEVICES = {"a100": ("a100-sxm4-80gb",), "h100": ("h100-sxm5-80gb", "h100-pcie-80gb")}
_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def gemm_shape(row: dict, op: str) -> tuple[int, int]:
    """``(in_features, out_features)`` of a projection of one tensor-parallel shard."""
    h, ff = int(row["n_embd"]), int(row["n_expanded_embd"])
    nh, nkv, tp = int(row["n_head"]), int(row["n_kv_head"]), int(row["num_tensor_parallel_workers"])
    hd = h // nh
    gated = row["use_gated_mlp"].strip().lower() == "true"
    if op == "attn_pre_proj":
        return h, (nh + 2 * nkv) * hd // tp
    if op == "attn_post_proj":
        return nh * hd // tp, h
    if op == "mlp_up_proj":
        return h, (2 if gated else 1) * ff // tp
    if op == "mlp_down_proj":
        return ff // tp, h
    raise ValueError(f"op must be one of {_OPS}, got {op!r}")


def load_cases(data: Path, tokens: set[int]) -> list[dict]:
    """Median times of the four projections per (gpu, model, tp, tokens), the rows of one key averaged."""
    path = data / _FILE if data.is_dir() else data
    acc: dict[tuple, list[float]] = defaultdict(list)
    shapes: dict[tuple, tuple[int, int]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            n = int(r["num_tokens"])
            if n not in tokens:
                continue
            for op in _OPS:
                v = r.get(f"time_stats.{op}.median")
                if not v:
                    continue
                key = (r["gpu"], r["model"], int(r["num_tensor_parallel_workers"]), n, op)
                acc[key].append(float(v))
                shapes[key] = gemm_shape(r, op)
    return [{"gpu": k[0], "model": k[1], "tp": k[2], "tokens": k[3], "op": k[4], "in": shapes[k][0],
             "out": shapes[k][1], "label_ms": float(np.mean(v))} for k, v in sorted(acc.items())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help=f"folder holding {_FILE} (or the file)")
    ap.add_argument("--tokens", default="1,16,128,512,2048,8192,32768", help="token counts to compare")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    from torch import nn
    from tqdm.auto import tqdm

    from dippm_nas.capture import capture
    from dippm_nas.prior import estimate
    from dippm_nas.spec import InputSpec

    cases = load_cases(args.data, {int(t) for t in args.tokens.split(",") if t})
    if not cases:
        print(f"no rows at tokens {args.tokens} in {args.data}", file=sys.stderr)
        return 2
    graphs: dict[tuple[int, int, int], object] = {}
    for c in tqdm(cases, desc="capture", unit="gemm"):
        k = (c["in"], c["out"], c["tokens"])
        if k not in graphs:
            spec = InputSpec(shape=(c["in"],), batch_size=c["tokens"], dtype="float16")
            # uninitialised weights: only shapes matter, and random init of 470 M parameters takes seconds
            lin = nn.Linear(c["in"], c["out"], bias=False, device="meta").to_empty(device="cpu")
            graphs[k] = capture(lin, spec, cache=False)
            del lin
    res: dict[str, dict] = {}
    for gpu, devs in _DEVICES.items():
        for dev in devs:
            rows = [c for c in cases if c["gpu"] == gpu]
            if not rows:
                continue
            lab = np.array([c["label_ms"] for c in rows])
            pred = np.array([estimate(graphs[(c["in"], c["out"], c["tokens"])], dev).latency_ms for c in rows])
            ape = 100 * np.abs(pred - lab) / lab
            logr = np.log(pred / lab)
            by_tok = {}
            for t in sorted({c["tokens"] for c in rows}):
                m = np.array([c["tokens"] == t for c in rows])
                by_tok[t] = {"n": int(m.sum()), "mape_pct": float(ape[m].mean()),
                             "median_ratio": float(math.exp(np.median(logr[m])))}
            from scipy.stats import kendalltau

            res[dev] = {"gpu": gpu, "n": len(rows), "mape_pct": float(ape.mean()),
                        "median_ape_pct": float(np.median(ape)), "median_ratio": float(math.exp(np.median(logr))),
                        "kendall_tau": float(kendalltau(lab, pred).statistic), "by_tokens": by_tok}
    if args.json:
        print(json.dumps({"cases": len(cases), "graphs": len(graphs), "devices": res}))
        return 0
    print(f"{len(cases)} (gpu, model, tp, tokens, projection) medians; {len(graphs)} distinct GEMMs captured")
    for dev, r in res.items():
        print(f"{r['gpu']} rows vs {dev:16s} n={r['n']:4d}  prior MAPE {r['mape_pct']:6.1f} %  median APE "
              f"{r['median_ape_pct']:5.1f} %  median pred/label {r['median_ratio']:.3f}  Kendall tau "
              f"{r['kendall_tau']:.3f}")
        print("    by tokens: " + ", ".join(f"{t}: {v['mape_pct']:.0f} % (x{v['median_ratio']:.2f})"
                                           for t, v in r["by_tokens"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
