"""Serving engines corrected from five measured runs of one model: the other models' runs on that GPU.

Usage::

    python benchmarks/accuracy/accuracy_llm_adapt.py --data ../shared/data [--runs 5] [--json OUT]

LLM-Inference-Bench's single-GPU rows (``llm_inference_bench_h100_gh200_1gpu.csv``, the rows ``accuracy_llm.py``
reads; H100 taken as ``h100-sxm5-80gb``). For each engine (vLLM, TensorRT-LLM) and GPU (H100, GH200):

1. the starting engine is fitted on the *other* GPU's rows only (``accuracy_llm.fit_constants``), so no row of the
   GPU being corrected is in it; its ``sigma_log`` is the RMS log residual of those rows;
2. for each model with at least ``--runs`` rows on the GPU in turn (the anchor), ``--runs`` of its rows on the GPU (spread over its latencies: the 0, 25,
   50, 75 and 100 % quantiles) are given to :func:`dippm_nas.llm.adapt_engine`;
3. the other models' rows on that GPU are predicted with the adapted engine (and with the starting engine, for
   contrast). Each row's prediction is linear in the three constants (``accuracy_llm.sensitivities``: the
   prediction at unit constants and its change per unit of each), which gives it at any constants.

Reported per (engine, GPU): the MAPE of the other models' rows, median and worst over the anchors, against the
starting engine's, and the starting engine's median predicted / measured latency per model and prompt length
(``start_ratio_by_model_prompt``: the per-model error that no engine constant removes). LLM-Inference-Bench's A100 rows are not in this file and are not read.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_llm import _engine, fit_constants, linear_prediction, load_bench, sensitivities  # noqa: E402

from dippm_nas.llm import MeasuredServingRun, adapt_engine  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402


def _anchor_runs(rows: list[dict], k: int) -> list[dict]:
    by_lat = sorted(rows, key=lambda r: r["latency_ms"])
    idx = sorted({round(q * (len(by_lat) - 1)) for q in np.linspace(0, 1, k)})
    return [by_lat[i] for i in idx]


def _ratios(rows: list[dict], pred: np.ndarray) -> dict[str, dict[int, float]]:
    """Median predicted / measured latency of the starting engine per model and prompt length."""
    out: dict[str, dict[int, float]] = {}
    for m in sorted({r["model"] for r in rows}):
        for n in sorted({r["input_len"] for r in rows if r["model"] == m}):
            v = [p / r["latency_ms"] for r, p in zip(rows, pred) if r["model"] == m and r["input_len"] == n]
            out.setdefault(m, {})[n] = round(float(np.median(v)), 3)
    return out


def run(data: Path, h100: str, k: int, log: list[str]) -> dict:
    rows, _ = load_bench(data, h100)
    out: dict = {}
    for engine in ("vllm", "tensorrt-llm"):
        er = [r for r in rows if r["engine"] == engine]
        sens = {d: sensitivities([r for r in er if r["device"] == d], engine) for d in sorted({r["device"] for r in er})}
        for gpu in sens:
            t0 = time.perf_counter()
            here = [r for r in er if r["device"] == gpu]
            other = [d for d in sens if d != gpu]
            y_other = np.concatenate([[r["latency_ms"] for r in er if r["device"] == d] for d in other])
            s_other = np.concatenate([sens[d] for d in other])
            start = fit_constants(s_other, y_other)
            start_sigma = float(np.sqrt(np.mean(np.log(linear_prediction(s_other, start) / y_other) ** 2)))
            base = _engine(engine, **start, sigma_log=start_sigma)
            y = np.array([r["latency_ms"] for r in here])
            res: dict = {"start_constants": {k_: round(v, 3) for k_, v in start.items()},
                         "start_sigma_log": round(start_sigma, 4),
                         "start_ratio_by_model_prompt": _ratios(here, linear_prediction(sens[gpu], start)),
                         "anchors": {}}
            for anchor in sorted({r["model"] for r in here}):
                mine = [r for r in here if r["model"] == anchor]
                if len(mine) < k:  # fewer measured runs of this model on this GPU than asked for
                    res.setdefault("anchors_with_too_few_rows", {})[anchor] = len(mine)
                    continue
                test = np.array([r["model"] != anchor for r in here])
                runs = [MeasuredServingRun(r["arch"], r["input_len"], r["output_len"], r["batch_size"],
                                           e2e_ms=r["latency_ms"], dtype="float16") for r in _anchor_runs(mine, k)]
                with tempfile.TemporaryDirectory() as tmp:
                    ad = adapt_engine(runs, device=gpu, engine=engine, version="bench", base=base, storage=tmp)
                p_ad = linear_prediction(sens[gpu], ad.constants)[test]
                p_start = linear_prediction(sens[gpu], start)[test]
                res["anchors"][anchor] = {
                    "runs": len(runs), "others_rows": int(test.sum()),
                    "adapted_mape_pct": round(float(np.mean(np.abs(p_ad / y[test] - 1)) * 100), 2),
                    "start_mape_pct": round(float(np.mean(np.abs(p_start / y[test] - 1)) * 100), 2),
                    "loo_sigma_log": round(ad.sigma_log, 4), "shrink": ad.shrink,
                    "constants": {k_: round(v, 3) for k_, v in ad.constants.items()}}
            if not res["anchors"]:
                out[f"{engine} {gpu}"] = res
                continue
            a = [v["adapted_mape_pct"] for v in res["anchors"].values()]
            s = [v["start_mape_pct"] for v in res["anchors"].values()]
            res["summary"] = {"adapted_median_pct": float(np.median(a)), "adapted_worst_pct": float(np.max(a)),
                              "adapted_best_pct": float(np.min(a)), "start_median_pct": float(np.median(s))}
            out[f"{engine} {gpu}"] = res
            log.append(f"{engine} {gpu}: {len(here)} rows, {time.perf_counter() - t0:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="directory of the public CSV files (../shared/data)")
    ap.add_argument("--h100", default="h100-sxm5-80gb")
    ap.add_argument("--runs", type=int, default=5, help="measured runs of the anchor model (default 5)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)
    log: list[str] = []
    report = {"command": "python benchmarks/accuracy/accuracy_llm_adapt.py " +
              " ".join(argv if argv is not None else sys.argv[1:]), "adapt": run(args.data, args.h100, args.runs, log),
              "log": log}
    text = json.dumps(report, indent=1)
    if args.json:
        write_output(args.json, text + "\n", "--json", error=InvalidValueError)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
