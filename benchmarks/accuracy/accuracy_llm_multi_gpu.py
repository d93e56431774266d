"""Tensor-parallel serving predictions against LLM-Inference-Bench's runs on 2 and 4 H100s of one node.

Usage::

    python benchmarks/accuracy/accuracy_llm_multi_gpu.py --data ../shared/data [--write] [--json OUT] [--no-single]

``llm_inference_bench_h100_multi_gpu.csv`` (argonne-lcf, BSD-3-Clause): end-to-end latency of generating a batch
(``input_len = output_len`` 128-2048, batch 1-64) with vLLM and TensorRT-LLM at tensor parallelism 2 and 4 on H100s
of one node (Llama-2-7B/70B, Llama-3-8B/70B, Mistral-7B, Mixtral-8x7B, Qwen2-7B/72B). The file records neither
the board nor the link; the benchmark documents only "H100 GPU systems at JLSE testbeds at ALCF" (its
``vLLM/H100/README.MD``): ``--h100`` (default ``h100-sxm5-80gb``, NVLink 4 through NVSwitch, as the single-GPU fit
assumes) names the board, ``--interconnect`` the link.

``predict_generation(..., runtime="serving", engine=..., tensor_parallel=N)`` gives ``e2e_ms``. Per engine four
tensor-parallel constants are fitted (:class:`dippm_nas.llm.ServingEngine`: host time per step per extra worker,
fixed time of a custom and of an NCCL all-reduce, a multiplier of the ideal transfer time), **leave-one-model-out**:
each model's rows are predicted with constants fitted on the other models' multi-GPU rows, and with the single-GPU
constants (host time per step and per sequence, decode multiplier) of the single-GPU fit's fold that left the same
model out (``accuracy_llm.py``'s ``bench`` part, rerun here unless ``--no-single``; the 70 B models and Mixtral have
no single-GPU rows, so theirs are the constants fitted on every single-GPU model). Every constant enters a
prediction linearly (host and all-reduce time add to each step; the decode multiplier scales the step's kernel
time), so each row's prediction at unit constants and its change per unit of each of the seven constants give any
fold's prediction; every held-out figure is then recomputed with the fold's engine. Rows faster than reading one
GPU's share of the weights (the active ones, for a mixture) once per generated token at peak bandwidth are left
out (TensorRT-LLM's Qwen2 2048 + 2048 rows and one Qwen2-72B row: 0.05-2.6 s for 2048 tokens), and so are rows
faster than the same model's shorter generation at the same engine, GPUs and batch (they stopped early). DeciLM-7B (per-layer
KV heads) is not read. The benchmark's TensorRT-LLM script (``TensorRT-LLM/H100/run_precision_bench.py``,
``generate_input``) repeats one prompt ("France" ``input_len`` times) for every sequence of the batch, so its rows are predicted with ``LLMWorkload(identical_sequences=True)``: Mixtral's sequences route to the
same experts. llama.cpp is not a batch of concurrent sequences (``accuracy_llm.py``) and is not scored.
``--write`` stores the tensor-parallel constants fitted on every row, with ``tp_sigma_log`` the RMS held-out log
error, in ``dippm_nas/llm/calibration/engines.json``. LLM-Inference-Bench's A100 rows are not in this file and are
not read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_llm import BENCH_ENGINES, BENCH_MODELS, _csv, _engine, _metrics, bench  # noqa: E402

from dippm_nas.devices import get_device  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.llm import ENGINES_FILE, EngineTable, LLMWorkload, architecture, engine_table, predict_generation  # noqa: E402

MULTI_FILE = "llm_inference_bench_h100_multi_gpu.csv"
MULTI_MODELS = {**BENCH_MODELS, "meta-llama/Llama-2-70b-hf": "llama-2-70b", "meta-llama/Meta-Llama-3-70B": "llama-3-70b",
                "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b", "Qwen/Qwen2-72B": "qwen2-72b"}
LARGE = ("llama-2-70b", "llama-3-70b", "qwen2-72b", "mixtral-8x7b")
#: (name, unit value, probe value, lower bound, upper bound); the single-GPU constants first
_SINGLE = (("decode_gpu_scale", 1.0, 2.0), ("step_us", 0.0, 1000.0), ("seq_us", 0.0, 100.0))
_TP = (("tp_step_us", 0.0, 1000.0, 0.0, 20000.0), ("allreduce_us", 0.0, 10.0, 0.0, 200.0),
       ("nccl_us", 0.0, 10.0, 0.0, 500.0), ("allreduce_bw_scale", 1.0, 2.0, 0.5, 20.0))
_NAMES = [c[0] for c in _SINGLE] + [c[0] for c in _TP]
_UNIT = {**{c[0]: c[1] for c in _SINGLE}, **{c[0]: c[1] for c in _TP}}
_PROBE = {**{c[0]: c[2] for c in _SINGLE}, **{c[0]: c[2] for c in _TP}}


def load_multi(data: Path, h100: str) -> tuple[list[dict], dict[str, int]]:
    """The vLLM and TensorRT-LLM rows of the models read here, without those faster than reading one GPU's share of
    the (active) weights once per generated token at peak bandwidth."""
    rows, skipped = [], defaultdict(int)
    bw = get_device(h100).bandwidth_gbps * 1e9
    for r in _csv(data, MULTI_FILE):
        engine = BENCH_ENGINES.get(r["framework"])
        arch = MULTI_MODELS.get(r["model"])
        if engine is None or arch is None:
            skipped[f"{r['framework']} {r['model']}"] += 1
            continue
        tp = int(r["num_gpus"])
        cfg = architecture(arch)
        floor_s = int(r["output_len"]) * cfg.active_params_per_token * 2 / tp / bw
        if float(r["latency_s"]) < floor_s:
            skipped[f"{r['model']} faster than reading its weights per token"] += 1
            continue
        rows.append({"engine": engine, "model": r["model"], "arch": arch, "tp": tp, "device": h100,
                     "input_len": int(r["input_len"]), "output_len": int(r["output_len"]),
                     "batch_size": int(r["batch_size"]), "latency_ms": float(r["latency_s"]) * 1e3})
    return _monotone(rows, skipped)


def _monotone(rows: list[dict], skipped: dict[str, int]) -> tuple[list[dict], dict[str, int]]:
    """Without the rows faster than the same model's shorter generation (same engine, GPUs and batch): a longer
    prompt and output cannot take less time, so such a run stopped early."""
    best: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        best[(r["engine"], r["model"], r["tp"], r["batch_size"])].append(r)
    keep = []
    for group in best.values():
        group.sort(key=lambda r: r["input_len"] + r["output_len"])
        longest_ms = 0.0
        for r in group:
            if r["latency_ms"] < longest_ms:
                skipped[f"{r['model']} faster than its shorter generation"] = \
                    skipped.get(f"{r['model']} faster than its shorter generation", 0) + 1
                continue
            longest_ms = r["latency_ms"]
            keep.append(r)
    return keep, dict(skipped)


def _predict(row: dict, eng: object, interconnect: str | None) -> object:
    wl = LLMWorkload(row["input_len"], row["output_len"], row["batch_size"],
                     identical_sequences=row["engine"] == "tensorrt-llm")
    return predict_generation(row["arch"], wl, row["device"], runtime="serving", engine=eng, dtype="float16",
                              mig=False, tensor_parallel=row["tp"], interconnect=interconnect)


def sensitivities(rows: list[dict], engine: str, interconnect: str | None) -> np.ndarray:
    """Per row: the prediction at unit constants and its change per unit of each constant, ``[n, 1 + 7]`` (ms)."""
    out = np.zeros((len(rows), 1 + len(_NAMES)))
    for i, r in enumerate(rows):
        base = _predict(r, _engine(engine, **_UNIT), interconnect).e2e_ms
        out[i, 0] = base
        for j, name in enumerate(_NAMES):
            p = _predict(r, _engine(engine, **{**_UNIT, name: _PROBE[name]}), interconnect).e2e_ms
            out[i, 1 + j] = (p - base) / (_PROBE[name] - _UNIT[name])
    return out


def linear(sens: np.ndarray, x: dict[str, float]) -> np.ndarray:
    d = np.array([x[n] - _UNIT[n] for n in _NAMES])
    return sens[:, 0] + sens[:, 1:] @ d


def fit_tp(sens: np.ndarray, y: np.ndarray, single: dict[str, float]) -> dict[str, float]:
    """The tensor-parallel constants minimising the relative residuals, the single-GPU ones held at ``single``."""
    from scipy.optimize import lsq_linear

    k = len(_SINGLE)
    fixed = linear(sens, {**_UNIT, **single})  # the prediction with the single-GPU constants, TP ones at unit
    a = sens[:, 1 + k:] / y[:, None]
    unit = np.array([c[1] for c in _TP])
    b = (y - fixed) / y + a @ unit
    res = lsq_linear(a, b, bounds=(np.array([c[3] for c in _TP]), np.array([c[4] for c in _TP])))
    return {c[0]: float(v) for c, v in zip(_TP, res.x)}


def _single_constants(single_report: dict | None, engine: str, model: str) -> dict[str, float]:
    """The single-GPU constants of the fold that left ``model`` out (else those fitted on every model)."""
    if single_report is not None:
        e = single_report["engines"][engine]
        if model in e["folds"]:
            return dict(e["folds"][model])
        return {k: v for k, v in single_report["fitted"][engine].items() if k in _UNIT}
    shipped = engine_table().engines.get(engine, {})
    return {n: float(shipped[n]) for n, _, _ in _SINGLE}


def _groups(rows: list[dict], y: np.ndarray, held: np.ndarray, std: np.ndarray) -> dict:
    out: dict = {}
    keys = {"tp2": lambda r: r["tp"] == 2, "tp4": lambda r: r["tp"] == 4,
            "7-8B": lambda r: r["arch"] not in LARGE, "70B": lambda r: r["arch"] in LARGE[:3],
            "mixtral": lambda r: r["arch"] == "mixtral-8x7b",
            "tp2 7-8B": lambda r: r["tp"] == 2 and r["arch"] not in LARGE,
            "tp4 7-8B": lambda r: r["tp"] == 4 and r["arch"] not in LARGE}
    for name, f in keys.items():
        m = np.array([f(r) for r in rows])
        if m.any():
            out[name] = _metrics(y[m], held[m], std[m])
    return out


def multi(data: Path, h100: str, interconnect: str | None, single_report: dict | None, log: list[str]) -> dict:
    rows, skipped = load_multi(data, h100)
    out: dict = {"skipped_rows": skipped, "engines": {}, "fitted": {}, "h100": h100, "interconnect": interconnect}
    for engine in ("vllm", "tensorrt-llm"):
        er = [r for r in rows if r["engine"] == engine]
        t0 = time.perf_counter()
        sens = sensitivities(er, engine, interconnect)
        y = np.array([r["latency_ms"] for r in er])
        models = sorted({r["model"] for r in er})
        held, held_std = np.zeros(len(er)), np.zeros(len(er))
        folds = {}
        for m in models:
            test = np.array([r["model"] == m for r in er])
            single = _single_constants(single_report, engine, m)
            x = fit_tp(sens[~test], y[~test], single)
            sigma = float(np.sqrt(np.mean(np.log(linear(sens[~test], {**single, **x}) / y[~test]) ** 2)))
            eng = _engine(engine, **single, **x)
            for i in np.flatnonzero(test):
                held[i] = _predict(er[i], eng, interconnect).e2e_ms
            held_std[test] = held[test] * sigma
            folds[m] = {k: round(v, 3) for k, v in {**single, **x}.items()}
        unfitted = linear(sens, {**_UNIT, **_single_constants(None, engine, "")})
        out["engines"][engine] = {
            "rows": len(er), "models": len(models), "latency": _metrics(y, held, held_std),
            "groups": _groups(er, y, held, held_std),
            "by_model": {f"{m} tp{t}": _metrics(y[[r["model"] == m and r["tp"] == t for r in er]],
                                                 held[[r["model"] == m and r["tp"] == t for r in er]])
                         for m in models for t in (2, 4) if any(r["model"] == m and r["tp"] == t for r in er)},
            "without_tp_constants": _metrics(y, unfitted), "folds": folds}
        x_all = fit_tp(sens, y, _single_constants(None, engine, ""))
        x_all["tp_sigma_log"] = float(np.sqrt(np.mean(np.log(held / y) ** 2)))
        out["fitted"][engine] = {k: round(v, 4) for k, v in x_all.items()}
        log.append(f"multi {engine}: {len(er)} rows, {len(models)} models, {time.perf_counter() - t0:.0f} s")
    return out


def _write(report: dict, command: str) -> None:
    old = engine_table()
    engines = {e: {**dict(old.engines.get(e, {})), **report["fitted"].get(e, {})} for e in old.engines}
    metrics = {**old.metrics, "tensor-parallel": {
        e: {"rows": v["rows"], "models": v["models"], "heldout_latency_mape_pct": v["latency"]["mape_pct"],
            "kendall_tau": v["latency"]["kendall_tau"], "coverage_2sigma": v["latency"]["coverage_2sigma"]}
        for e, v in report["engines"].items()}}
    metrics["tensor-parallel"]["command"] = command
    metrics["tensor-parallel"]["source"] = ("LLM-Inference-Bench (argonne-lcf, commit 4211f5d) vLLM and TensorRT-LLM "
                                            f"rows on 2 and 4 H100s of one node, taken as {report['h100']}; "
                                            "leave-one-model-out")
    table = EngineTable(engines=engines, source=old.source, command=old.command, metrics=metrics)
    path = Path(__file__).resolve().parents[2] / "dippm_nas" / "llm" / "calibration" / ENGINES_FILE
    table.save(path)
    engine_table.cache_clear()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="directory of the public CSV files (../shared/data)")
    ap.add_argument("--h100", default="h100-sxm5-80gb", help="catalogue id for the bench's H100 rows")
    ap.add_argument("--interconnect", default=None, choices=("nvlink", "pcie"),
                    help="the link of the multi-GPU rows (default: the board's NVLink)")
    ap.add_argument("--no-single", action="store_true",
                    help="skip the single-GPU fit (folds then use the shipped single-GPU constants)")
    ap.add_argument("--write", action="store_true",
                    help=f"write the fitted tensor-parallel constants to dippm_nas/llm/calibration/{ENGINES_FILE}")
    ap.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)
    log: list[str] = []
    report: dict = {"command": "python benchmarks/accuracy/accuracy_llm_multi_gpu.py " +
                    " ".join(argv if argv is not None else sys.argv[1:])}
    single = None
    if not args.no_single:
        single = bench(args.data, args.h100, log)
        report["single_gpu"] = {e: {k: v[k] for k in ("rows", "models", "latency", "throughput", "by_gpu")}
                                for e, v in single["engines"].items()}
    report["multi_gpu"] = multi(args.data, args.h100, args.interconnect, single, log)
    if args.write:
        _write(report["multi_gpu"], report["command"])
    report["log"] = log
    text = json.dumps(report, indent=1)
    if args.json:
        write_output(args.json, text + "\n", "--json", error=InvalidValueError)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
