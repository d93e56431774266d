#!/usr/bin/env python
"""The analytic prior on real A100 and H100 timings of LLM layer GEMMs (Vidur), a spec-sheet device check.

Usage::

    python benchmarks/accuracy/prior_vidur_gemms.py --data ../shared/data [--tokens 1,16,128,512,2048,8192,32768] [--json]

Vidur (``vidur_a100_h100_llm_layer_op_profiling.csv``, MIT) profiled the operators of one transformer layer
of seven LLMs (Llama-2 7B/70B, Llama-3 8B/70B, CodeLlama-34B, Qwen-72B, InternLM-20B, phi-2) at
1-32,768 tokens and 1, 2, 4, 8 tensor-parallel workers on an A100 and an H100 (fp16). This script takes
the four projections (QKV, attention output, MLP up, MLP down: GEMMs of ``num_tokens`` rows over the
layer's widths divided by the tensor-parallel degree; the MLP up projection is two-wide when the MLP is
gated), captures each as one ``nn.Linear`` in float16 and compares the median time with the analytic
prior's GPU timeline (``gpu_busy_ms`` of the estimate, ``gpu_ms`` of what ``dippm_nas.predict`` answers for a
device without a checkpoint). Vidur's figures are the operator's CUDA time, with no host dispatch, input copy or
call overhead in them, so the end-to-end ``latency_ms`` (which adds the eager host timeline of the undescribed
deployment) is not the figure they check.

Vidur does not record the board variant. The A100 rows are compared with ``a100-sxm4-80gb`` and the H100
rows with both ``h100-sxm5-80gb`` and ``h100-pcie-80gb`` (114 vs 132 SMs, 2.0 vs 3.35 TB/s): the variant
whose error is lower is a hint, not a fact. The A100 rows are also compared with ``a100-sxm4-40gb``, the
product's A100: its constants were fitted on Accel-NASBench (MnasNet nets) and the shipped checkpoint pins
them, so ``predict`` is shown too. The H100 and A100-80GB constants are the geometric mean of the fitted GPUs
(``fitted.json``, ``"*"``).

``--fit-class matmul`` fits the matmul compute multiplier of ``--fit-device`` on the rows of its GPU (the
other constants as shipped), checks it on held-out LLMs, and with ``--write`` stores it in a constants file.
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


_GPU_OF = {"a100-sxm4-40gb": "a100", "a100-pcie-40gb": "a100", "a100-sxm4-80gb": "a100", "a100-pcie-80gb": "a100",
           "h100-sxm5-80gb": "h100", "h100-pcie-80gb": "h100"}


def fit_class_multiplier(cases: list[dict], graphs: dict, op_class: str, device: str) -> dict:
    """The compute multiplier of ``op_class`` on ``device`` that minimises the mean absolute log error of
    the prior on that GPU's rows (every other constant as shipped): fitted on every other model in sorted
    order and checked on the rest, then fitted on all models."""
    import dataclasses

    from scipy.optimize import minimize_scalar

    from dippm_nas.devices import get_device
    from dippm_nas.prior import default_params, estimate

    dev = get_device(device)
    rows = [c for c in cases if c["gpu"] == _GPU_OF.get(dev.id)]
    if not rows:
        raise SystemExit(f"no Vidur rows for {device} (known boards: {sorted(_GPU_OF)})")
    base = default_params()
    scale = base.scale_for(dev.id, dev.kind, geforce=dev.geforce)

    def params(x: float):
        classes = {**scale.classes, op_class: x}
        scales = {**base.device_scales, dev.id: dataclasses.replace(scale, classes=classes)}
        return dataclasses.replace(base, device_scales=scales)

    def err(sel: list[dict], x: float) -> np.ndarray:
        p = params(x)
        return np.array([math.log(estimate(graphs[(c["in"], c["out"], c["tokens"])], dev, params=p).gpu_busy_ms
                                  / c["label_ms"]) for c in sel])

    def best(sel: list[dict]) -> float:
        r = minimize_scalar(lambda lx: float(np.mean(np.abs(err(sel, math.exp(lx))))), bounds=(-3.0, 3.0),
                            method="bounded", options={"xatol": 1e-3})
        return math.exp(r.x)

    mape = lambda e: float(np.mean(np.abs(np.exp(e) - 1.0)) * 100)  # noqa: E731
    models = sorted({c["model"] for c in rows})
    fit_m, check_m = models[0::2], models[1::2]
    x_half = best([c for c in rows if c["model"] in fit_m])
    check = [c for c in rows if c["model"] in check_m]
    x0 = scale.class_multiplier(op_class)
    x_all = best(rows)
    return {"op_class": op_class, "device": dev.id, "gpu": _GPU_OF[dev.id], "fit_models": fit_m,
            "check_models": check_m, "start_multiplier": x0,
            "half": {"multiplier": x_half, "check_before_pct": mape(err(check, x0)),
                     "check_after_pct": mape(err(check, x_half))},
            "all": {"multiplier": x_all, "before_pct": mape(err(rows, x0)), "after_pct": mape(err(rows, x_all))}}


def write_class_multiplier(path: Path, fit: dict, devices: list[str], command: str) -> None:
    """Set ``fit``'s multiplier (fitted on all models) in a constants file for ``devices`` and say where it
    came from in each device's ``source``; the file must load afterwards."""
    from dippm_nas.prior import PriorParams

    blob = json.loads(Path(path).read_text())
    for dev in devices:
        entry = blob["devices"].get(dev)
        if entry is None:
            raise SystemExit(f"{path} has no device entry {dev!r} to add a class multiplier to")
        entry.setdefault("classes", {})[fit["op_class"]] = fit["all"]["multiplier"]
        note = (f"; {fit['op_class']} compute x{fit['all']['multiplier']:.3f} from Vidur {fit['gpu']} fp16 GEMMs "
                f"(microsoft/vidur, 1-32768 tokens; checked on held-out models: {fit['half']['check_before_pct']:.1f} "
                f"-> {fit['half']['check_after_pct']:.1f} % MAPE): {command}")
        entry["source"] = entry.get("source", "").split("; " + fit["op_class"] + " compute x")[0] + note
    PriorParams.from_dict(blob, origin=str(path))  # still a valid constants file
    from dippm_nas.errors import InvalidValueError
    from dippm_nas.files import write_output

    write_output(path, json.dumps(blob, indent=1) + "\n", "output file",
                 error=InvalidValueError)  # key order kept, as PriorParams.save writes


def _score(rows: list[dict], lab: np.ndarray, pred: np.ndarray) -> dict:
    """MAPE, median APE, median ratio, Kendall τ, and MAPE / median ratio per token count."""
    from scipy.stats import kendalltau

    ape = 100 * np.abs(pred - lab) / lab
    logr = np.log(pred / lab)
    by_tok = {}
    for t in sorted({c["tokens"] for c in rows}):
        m = np.array([c["tokens"] == t for c in rows])
        by_tok[t] = {"n": int(m.sum()), "mape_pct": float(ape[m].mean()),
                     "median_ratio": float(math.exp(np.median(logr[m])))}
    return {"n": len(rows), "mape_pct": float(ape.mean()), "median_ape_pct": float(np.median(ape)),
            "median_ratio": float(math.exp(np.median(logr))), "kendall_tau": float(kendalltau(lab, pred).statistic),
            "by_tokens": by_tok}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help=f"folder holding {_FILE} (or the file)")
    ap.add_argument("--tokens", default="1,16,128,512,2048,8192,32768", help="token counts to compare")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--fit-class", choices=("matmul",), help="fit this op class's compute multiplier of "
                    "--fit-device on the rows of its GPU: fitted on half of the models, checked on the others, "
                    "then fitted on all")
    ap.add_argument("--fit-device", default="a100-sxm4-40gb", help="device whose multiplier is fitted")
    ap.add_argument("--write", type=Path, help="with --fit-class: write the multiplier fitted on every model into "
                    "this constants file (fitted.json format), for --fit-device and the devices in --also")
    ap.add_argument("--also", default="", help="comma-separated devices that take the same multiplier")
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
    from dippm_nas import predict

    def prior_on(dev: str):
        return lambda g: estimate(g, dev).gpu_busy_ms

    answerers = [(gpu, f"prior {dev}", prior_on(dev)) for gpu, devs in _DEVICES.items() for dev in devs]
    # the product's A100: the shipped checkpoint (and the Accel-fitted constants it pins) on the 40 GB board
    answerers.insert(1, ("a100", "prior a100-sxm4-40gb", prior_on("a100-sxm4-40gb")))
    answerers.insert(2, ("a100", "predict a100-sxm4-40gb", lambda g: predict(g, device="a100-sxm4-40gb").gpu_ms))
    res: dict[str, dict] = {}
    for gpu, name, answer in answerers:
        rows = [c for c in cases if c["gpu"] == gpu]
        if not rows:
            continue
        lab = np.array([c["label_ms"] for c in rows])
        pred = np.array([answer(graphs[(c["in"], c["out"], c["tokens"])]) for c in rows])
        res[name] = {"gpu": gpu, **_score(rows, lab, pred)}
    fit = None
    if args.fit_class:
        fit = fit_class_multiplier(cases, graphs, args.fit_class, args.fit_device)
        if args.write:
            write_class_multiplier(args.write, fit, [args.fit_device, *[d for d in args.also.split(",") if d]],
                                   " ".join(["python benchmarks/accuracy/prior_vidur_gemms.py", *sys.argv[1:]]))
    if args.json:
        print(json.dumps({"cases": len(cases), "graphs": len(graphs), "devices": res, "fit": fit}))
        return 0
    print(f"{len(cases)} (gpu, model, tp, tokens, projection) medians; {len(graphs)} distinct GEMMs captured")
    for name, r in res.items():
        print(f"{r['gpu']} rows vs {name:24s} n={r['n']:4d}  MAPE {r['mape_pct']:6.1f} %  median APE "
              f"{r['median_ape_pct']:5.1f} %  median pred/label {r['median_ratio']:.3f}  Kendall tau "
              f"{r['kendall_tau']:.3f}")
        print("    by tokens: " + ", ".join(f"{t}: {v['mape_pct']:.0f} % (x{v['median_ratio']:.2f})"
                                           for t, v in r["by_tokens"].items()))
    if fit is not None:
        print(f"{fit['op_class']} compute multiplier of {fit['device']} on the {fit['gpu']} rows: fitted on "
              f"{fit['fit_models']} -> x{fit['half']['multiplier']:.3f}; on {fit['check_models']} MAPE "
              f"{fit['half']['check_before_pct']:.1f} % -> {fit['half']['check_after_pct']:.1f} %; fitted on all "
              f"models x{fit['all']['multiplier']:.3f} (MAPE {fit['all']['before_pct']:.1f} % -> "
              f"{fit['all']['after_pct']:.1f} %)" + (f"; written to {args.write}" if args.write else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
