"""LLM generation predictions against released measurements: serving runs, operator profiles, energy.

Usage::

    python benchmarks/accuracy/accuracy_llm.py --data ../shared/data [--parts bench,vidur,energy] [--write] [--json OUT]

``bench`` -- LLM-Inference-Bench (``llm_inference_bench_h100_gh200_1gpu.csv``, argonne-lcf, BSD-3-Clause): the
end-to-end latency of generating a batch (``input_len = output_len`` 128-2048, batch 1-64) with vLLM, TensorRT-LLM
and llama.cpp on one H100 and one GH200, and the throughput the source derives from it (input + output tokens of the
batch over the latency). ``predict_generation(..., runtime="serving", engine=...)`` gives ``e2e_ms`` and
``tokens_per_s``. Per engine three constants are fitted (:class:`dippm_nas.llm.ServingEngine`: host time per
scheduler step and per sequence per step, a multiplier of the prior's decode kernel time; the prefill keeps the
prior's time, which end-to-end latencies cannot tell apart), **leave-one-model-out**: each model's rows are
predicted with constants fitted on the other models' rows of the same engine (both GPUs). Rows whose prompt + output
exceed the model's positions are left out (vLLM stops those requests early: OPT-6.7B's 2048 + 2048 rows take 46 ms
to 3 s), and so are rows faster than reading the weights once per generated token at peak bandwidth (BLOOM's and one
Qwen2 engine's 2048 + 2048 rows: 0.05-3 s for 2048 tokens). The fit is linear: a row's latency is the prediction
with unit constants plus its sensitivities to each constant (three more predictions), and the relative residuals are
minimised with bounds (``scipy.optimize.lsq_linear``); every figure reported is then recomputed with the fitted
engine. σ of a fold is the RMS log residual of its training rows; ``--write`` stores the constants fitted on every
model with ``sigma_log`` the RMS held-out log residual (``dippm_nas/llm/calibration/engines.json``). The H100 board
variant is not recorded: SXM5 is assumed (``--h100 h100-pcie-80gb`` for the other). DeciLM-7B (per-layer KV heads)
is not read and its rows are left out. llama.cpp is reported apart with the unfitted serving model (its rows'
latency falls from batch 1 to 16 while tokens/s barely grows: not a batch of concurrent sequences).

``vidur`` -- Vidur's H100 operator profiles (``vidur_a100_h100_llm_layer_op_profiling.csv``, MIT), one
tensor-parallel worker: median time of each operator of a transformer layer at 1-32k tokens against the node of the
``"fused"`` prefill graph of one layer (the kernels a serving engine runs). Nothing is fitted on them here. The A100
rows of the file are not read here; they are not held out from the package (the A100-40GB's matmul multiplier in
``fitted.json`` was fitted on them by ``prior_vidur_gemms.py --fit-class matmul``).

``energy`` -- ML.ENERGY leaderboard v2 (``mlenergy_v2_h100_energy_latency.csv``, Apache-2.0), LLM chat/code rows on
one H100 80GB HBM3 (TP = PP = 1, vLLM's OpenAI-compatible server, every request sent at once, steady-state energy):
energy per generated token (energy per request / mean output tokens), output tokens/s and time per output token at
the run's mean batch against ``energy_j_per_token``, ``output_tokens_per_s`` and ``e2e_ms / output_len``, the
engine's ``max_num_seqs`` the run's configured batch. Reported twice: the offline vLLM engine as fitted on
LLM-Inference-Bench (nothing fitted here), and the ``"api-server"`` frontend with ``server_seq_us`` (fitted on the
output tokens/s) and ``wait_activity`` (then on the energy per token) fitted leave-one-model-out; both enter a
prediction linearly through the host time per step, so three predictions per row give any pair, and every held-out
figure is recomputed with the fold's engine. The rows do not record prompt lengths: ``--energy-prompts`` (default
256, 512, 1024) shows how much the answer moves with that assumption; ``--write`` stores the constants fitted on
every row at ``--server-prompt`` (default 256) next to the offline ones.

``--decode-kv-partition ENGINE=TOKENS|none`` (repeatable) is a what-if of the decode attention's tiling: the engine's
``ServingEngine.decode_kv_partition`` replaced in every fit and prediction (``none``: the attention's output tiled,
a few thread blocks for the whole batch); it cannot be combined with ``--write``."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from dippm_nas.llm import (
    ENGINES_FILE,
    DecoderConfig,
    EngineTable,
    LLMWorkload,
    ServingEngine,
    architecture,
    engine_table,
    predict_generation,
    prefill_graph,
    serving_engine,
)
from dippm_nas.devices import get_device
from dippm_nas.prior import DeploymentSettings, estimate
from dippm_nas.training import regression_metrics
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import write_output

BENCH_FILE = "llm_inference_bench_h100_gh200_1gpu.csv"
VIDUR_FILE = "vidur_a100_h100_llm_layer_op_profiling.csv"
ENERGY_FILE = "mlenergy_v2_h100_energy_latency.csv"

#: LLM-Inference-Bench model -> architecture name (DeciLM-7B: per-layer KV heads, not read)
BENCH_MODELS = {
    "mistralai/Mistral-7B-v0.1": "mistral-7b", "meta-llama/Meta-Llama-3-8B": "llama-3-8b",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b", "Qwen/Qwen2-7B": "qwen2-7b", "BAAI/Aquila-7B": "aquila-7b",
    "bigscience/bloom-7b1": "bloom-7b1", "EleutherAI/gpt-j-6b": "gpt-j-6b", "huggyllama/llama-7b": "llama-7b",
    "facebook/opt-6.7b": "opt-6.7b", "Qwen/Qwen1.5-7B": "qwen1.5-7b",
}
BENCH_ENGINES = {"vLLM": "vllm", "TensorRT-LLM": "tensorrt-llm"}
ENERGY_MODELS = {
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b", "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b-v0.3",
    "google/gemma-2-2b-it": "gemma-2-2b", "google/gemma-2-9b-it": "gemma-2-9b",
    "microsoft/Phi-3-mini-4k-instruct": "phi-3-mini-4k", "microsoft/Phi-3-medium-4k-instruct": "phi-3-medium-4k",
    "mistralai/Mistral-Nemo-Instruct-2407": "mistral-nemo-12b", "codellama/CodeLlama-7b-hf": "codellama-7b",
    "codellama/CodeLlama-13b-hf": "codellama-13b",
}
#: (name, lower bound, upper bound) of the fitted constants, in the units of the linear model's columns
_CONSTANTS = (("decode_gpu_scale", 0.5, 3.0), ("step_us", 0.0, 20000.0), ("seq_us", 0.0, 2000.0))
_PROBE = {"decode_gpu_scale": 2.0, "step_us": 1000.0, "seq_us": 100.0}
_UNIT = {"decode_gpu_scale": 1.0, "step_us": 0.0, "seq_us": 0.0}


def _csv(data: Path, name: str) -> list[dict[str, str]]:
    path = data / name if data.is_dir() else data
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------ bench
#: ``--decode-kv-partition`` what-ifs: engine -> cache tokens per decode-attention thread block (``None``: the
#: attention's output tiled instead), replacing the engine's ``decode_kv_partition``
_DECODE_KV_PARTITION: dict[str, int | None] = {}


def _engine(name: str, **constants: float) -> ServingEngine:
    base = serving_engine(name, EngineTable())  # the documented defaults, no fitted step costs
    what_if = {"decode_kv_partition": _DECODE_KV_PARTITION[name]} if name in _DECODE_KV_PARTITION else {}
    return ServingEngine(**{**base.to_dict(), **constants, **what_if, "fitted": bool(constants),
                            "source": "benchmark fit"})


def parse_kv_partitions(items: list[str]) -> dict[str, int | None]:
    """``ENGINE=TOKENS`` or ``ENGINE=none`` items of ``--decode-kv-partition`` as a mapping.

    Raises:
        InvalidValueError: an item without ``=``, an engine other than ``vllm`` / ``tensorrt-llm``, or tokens that
            are not an int >= 1 or ``none``.
    """
    out: dict[str, int | None] = {}
    for item in items:
        engine, sep, value = item.partition("=")
        if not sep or engine not in BENCH_ENGINES.values():
            raise InvalidValueError(f"--decode-kv-partition must be ENGINE=TOKENS or ENGINE=none with ENGINE one of "
                                    f"{sorted(set(BENCH_ENGINES.values()))}, got {item!r}")
        if value.lower() == "none":
            out[engine] = None
        elif value.isdigit() and int(value) >= 1:
            out[engine] = int(value)
        else:
            raise InvalidValueError(f"--decode-kv-partition tokens must be an int >= 1 or 'none', got {item!r}")
    return out


def _predict(row: dict, eng: ServingEngine) -> object:
    wl = LLMWorkload(row["input_len"], row["output_len"], row["batch_size"])
    return predict_generation(row["arch"], wl, row["device"], runtime="serving", engine=eng, dtype="float16",
                              mig=False)


def load_bench(data: Path, h100: str) -> tuple[list[dict], dict[str, int]]:
    """The rows of the models read here; ``skipped`` counts the others, the rows whose prompt + output exceed the
    model's positions (vLLM stops such requests early: OPT-6.7B's 2048 + 2048 rows take 46-3000 ms) and the rows
    faster than physics allows (every generated token reads the weights once: ``latency < output_len * weight
    bytes / peak bandwidth`` means the generation stopped early)."""
    rows, skipped = [], defaultdict(int)
    for r in _csv(data, BENCH_FILE):
        arch = BENCH_MODELS.get(r["model"])
        if arch is None:
            skipped[r["model"]] += 1
            continue
        limit = architecture(arch).max_positions
        if limit is not None and int(r["input_len"]) + int(r["output_len"]) > limit:
            skipped[f"{r['model']} beyond its {limit} positions"] += 1
            continue
        dev = h100 if "H100" in r["hardware"] else "gh200-96gb"
        floor_s = int(r["output_len"]) * architecture(arch).param_count * 2 / (get_device(dev).bandwidth_gbps * 1e9)
        if float(r["latency_s"]) < floor_s:
            skipped[f"{r['model']} faster than reading its weights per token"] += 1
            continue
        rows.append({"engine": BENCH_ENGINES.get(r["framework"], r["framework"]), "model": r["model"], "arch": arch,
                     "device": dev, "input_len": int(r["input_len"]), "output_len": int(r["output_len"]),
                     "batch_size": int(r["batch_size"]), "latency_ms": float(r["latency_s"]) * 1e3,
                     "tokens_per_s": float(r["throughput_tokens_per_s"])})
    return rows, dict(skipped)


def sensitivities(rows: list[dict], engine: str) -> np.ndarray:
    """Per row: the unit prediction and its change per unit of each constant, ``[n, 1 + 3]`` (ms)."""
    out = np.zeros((len(rows), 1 + len(_CONSTANTS)))
    unit = _UNIT
    for i, r in enumerate(rows):
        base = _predict(r, _engine(engine, **unit)).e2e_ms
        out[i, 0] = base
        for j, (name, _, _) in enumerate(_CONSTANTS):
            probe = {**unit, name: _PROBE[name]}
            out[i, 1 + j] = (_predict(r, _engine(engine, **probe)).e2e_ms - base) / (_PROBE[name] - unit[name])
    return out


def fit_constants(sens: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Constants minimising the relative residuals of the linear model, within their bounds."""
    from scipy.optimize import lsq_linear

    unit = np.array([_UNIT[c[0]] for c in _CONSTANTS])
    a = sens[:, 1:] / y[:, None]
    b = (y - sens[:, 0]) / y + a @ unit  # y = base + S (x - unit)  ->  S x = y - base + S unit
    lo = np.array([c[1] for c in _CONSTANTS])
    hi = np.array([c[2] for c in _CONSTANTS])
    res = lsq_linear(a, b, bounds=(lo, hi))
    return {c[0]: float(v) for c, v in zip(_CONSTANTS, res.x)}


def linear_prediction(sens: np.ndarray, x: dict[str, float]) -> np.ndarray:
    unit = np.array([_UNIT[c[0]] for c in _CONSTANTS])
    v = np.array([x[c[0]] for c in _CONSTANTS])
    return sens[:, 0] + sens[:, 1:] @ (v - unit)


def _metrics(y: np.ndarray, p: np.ndarray, std: np.ndarray | None = None) -> dict[str, float]:
    m = regression_metrics(y, p, std)
    m["median_ratio"] = float(np.median(p / y)) if len(y) else float("nan")
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}


def bench(data: Path, h100: str, log: list[str]) -> dict:
    rows, skipped = load_bench(data, h100)
    out: dict = {"skipped_rows": skipped, "engines": {}, "fitted": {}}
    rows_by_engine: dict[str, tuple[list[dict], np.ndarray]] = {}
    for engine in ("vllm", "tensorrt-llm"):
        er = [r for r in rows if r["engine"] == engine]
        t0 = time.perf_counter()
        sens = sensitivities(er, engine)
        y = np.array([r["latency_ms"] for r in er])
        models = sorted({r["model"] for r in er})
        held = np.zeros(len(er))
        held_std = np.zeros(len(er))
        folds = {}
        for m in models:
            test = np.array([r["model"] == m for r in er])
            x = fit_constants(sens[~test], y[~test])
            train_log = np.log(linear_prediction(sens[~test], x) / y[~test])
            sigma = float(np.sqrt(np.mean(train_log ** 2)))
            eng = _engine(engine, **x)
            for i in np.flatnonzero(test):
                held[i] = _predict(er[i], eng).e2e_ms
            held_std[test] = held[test] * sigma
            folds[m] = {k: round(v, 3) for k, v in x.items()}
        tps_y = np.array([r["tokens_per_s"] for r in er])
        tps_p = np.array([(r["input_len"] + r["output_len"]) * r["batch_size"] for r in er]) / (held / 1e3)
        raw = sens[:, 0]
        res = {"rows": len(er), "models": len(models),
               "latency": _metrics(y, held, held_std), "throughput": _metrics(tps_y, tps_p, tps_p * held_std / held),
               "latency_unfitted": _metrics(y, raw),
               "by_gpu": {d: _metrics(y[[r["device"] == d for r in er]], held[[r["device"] == d for r in er]])
                          for d in sorted({r["device"] for r in er})},
               "by_model": {m: _metrics(y[[r["model"] == m for r in er]], held[[r["model"] == m for r in er]])
                            for m in models},
               "folds": folds}
        x_all = fit_constants(sens, y)
        x_all["sigma_log"] = float(np.sqrt(np.mean(np.log(held / y) ** 2)))
        out["engines"][engine] = res
        rows_by_engine[engine] = (er, held)
        out["fitted"][engine] = {k: round(v, 4) for k, v in x_all.items()}
        log.append(f"{engine}: {len(er)} rows, {len(models)} models, {time.perf_counter() - t0:.0f} s")
    # llama.cpp apart: the unfitted serving model (vLLM's memory rules, no host time per step)
    cpp = [r for r in rows if r["engine"] == "llama.cpp"]
    if cpp:
        y = np.array([r["latency_ms"] for r in cpp])
        p = np.array([_predict(r, _engine("vllm")).e2e_ms for r in cpp])
        out["llama.cpp"] = {"rows": len(cpp), "latency_unfitted": _metrics(y, p)}
    out["residuals"] = _residual_table(rows_by_engine)
    return out


def _residual_table(rows_by_engine: dict[str, tuple[list[dict], np.ndarray]]) -> dict:
    """Median held-out ratio (predicted / measured) per engine, GPU, prompt length and batch."""
    out: dict = {}
    for engine, (er, held) in rows_by_engine.items():
        cells: dict[str, list[float]] = defaultdict(list)
        for r, p in zip(er, held):
            cells[f"{r['device']} {r['input_len']} x{r['batch_size']}"].append(p / r["latency_ms"])
        out[engine] = {k: round(float(np.median(v)), 3) for k, v in sorted(cells.items())}
    return out


# ------------------------------------------------------------------------------------------------ vidur
_VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
              "mlp_up_proj", "mlp_act", "mlp_down_proj")


def _layer_nodes(cfg: DecoderConfig, tokens: int) -> dict[str, float]:
    """Device time of each Vidur operator in the fused prefill graph of one layer over ``tokens`` tokens, ms."""
    g = prefill_graph(cfg, 1, tokens, style="fused")
    est = estimate(g, "h100-sxm5-80gb", deployment=DeploymentSettings(runtime="cuda-graphs"))
    nodes = g.nodes
    norms = [n.index for n in nodes if n.op == "nn.rms_norm" or n.op == "nn.layer_norm"]
    mm = [n.index for n in nodes if n.op == "matmul"]
    rope = [n.index for n in nodes if n.op == "ewise_fma"]
    act = [n.index for n in nodes if n.op_class == "activation"]
    t = est.node_time_ms
    out = {"input_layernorm": t[norms[0]], "post_attention_layernorm": t[norms[1]], "attn_pre_proj": t[mm[0]],
           "attn_post_proj": t[mm[1]], "mlp_up_proj": t[mm[2]], "mlp_act": t[act[0]],
           "mlp_down_proj": t[mm[-2]]}
    if rope:
        out["attn_rope"] = t[rope[0]]
    return {k: float(v) for k, v in out.items()}


def vidur(data: Path, log: list[str]) -> dict:
    acc: dict[tuple, list[float]] = defaultdict(list)
    shapes: dict[tuple, dict] = {}
    for r in _csv(data, VIDUR_FILE):
        if r["gpu"] != "h100" or r["num_tensor_parallel_workers"] != "1":
            continue
        for op in _VIDUR_OPS:
            v = r.get(f"time_stats.{op}.median")
            if v:
                key = (r["model"], int(r["num_tokens"]), op)
                acc[key].append(float(v))
                shapes[key] = r
    per_op: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    cache: dict[tuple, dict[str, float]] = {}
    for (model, tokens, op), vals in sorted(acc.items()):
        r = shapes[(model, tokens, op)]
        h, heads, kv = int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"])
        gated = r["use_gated_mlp"].strip().lower() == "true"
        cfg = DecoderConfig(name=model, model_type="llama", num_layers=1, hidden_size=h, num_heads=heads,
                            num_kv_heads=kv, head_dim=h // heads, intermediate_size=int(r["n_expanded_embd"]),
                            vocab_size=int(r["vocab_size"]), max_positions=max(tokens, 4096),
                            mlp="gated" if gated else "plain", activation="silu" if gated else "gelu_tanh",
                            rotary_dim=h // heads)
        k = (model, tokens)
        if k not in cache:
            cache[k] = _layer_nodes(cfg, tokens)
        if op in cache[k]:
            per_op[op][0].append(float(np.mean(vals)))
            per_op[op][1].append(cache[k][op])
    out = {op: _metrics(np.array(y), np.array(p)) for op, (y, p) in per_op.items()}
    ally = np.concatenate([np.array(v[0]) for v in per_op.values()])
    allp = np.concatenate([np.array(v[1]) for v in per_op.values()])
    out["all"] = _metrics(ally, allp)
    log.append(f"vidur: {len(cache)} (model, tokens) layers on h100")
    return out


# ------------------------------------------------------------------------------------------------ energy
_SERVER_PROBE_US = 100.0
_SERVER_BOUNDS_US = (0.0, 2000.0)


def load_energy(data: Path) -> list[dict]:
    """ML.ENERGY's LLM rows on one GPU (TP = PP = 1) of the architectures read here."""
    rows = []
    for r in _csv(data, ENERGY_FILE):
        arch = ENERGY_MODELS.get(r["model_path"])
        if not r["task"].startswith("llm") or arch is None or r["TP"] != "1" or r["PP"] != "1":
            continue
        out_tokens = float(r["Avg Output Tokens"])
        rows.append({"arch": arch, "batch": max(1, round(float(r["Avg BS (reqs)"]))),
                     "output": max(2, round(out_tokens)), "max_seqs": int(float(r["Max BS (reqs)"])),
                     "j_per_token": float(r["Energy/req (J)"]) / out_tokens, "tpot_ms": float(r["Avg TPOT (s)"]) * 1e3,
                     "tokens_per_s": float(r["Token tput (tok/s)"])})
    return rows


def _energy_predict(r: dict, prompt: int, eng: ServingEngine) -> object:
    eng = dataclasses.replace(eng, max_num_seqs=max(r["max_seqs"], r["batch"]))  # bs128 -> max_num_seqs 128
    return predict_generation(r["arch"], LLMWorkload(prompt, r["output"], r["batch"]), "h100-sxm5-80gb",
                              runtime="serving", engine=eng, dtype="bfloat16", mig=False)


def _energy_terms(rows: list[dict], prompt: int, base: ServingEngine) -> np.ndarray:
    """Per row ``[e2e_ms, d e2e / d server_seq_us (ms/µs), energy_j, d energy / d server_seq_us at idle waiting
    power, host seconds at server_seq_us = 0]``: the API server's host time adds linearly to every step, and its
    energy is the waiting power over that time, so the prediction at any (``server_seq_us``, ``wait_activity``) is
    exact from three predictions."""
    out = np.zeros((len(rows), 5))
    dev = get_device("h100-sxm5-80gb")
    span = float(dev.board_power_w) - float(dev.idle_power_w)
    for i, r in enumerate(rows):
        p0 = _energy_predict(r, prompt, dataclasses.replace(base, server_seq_us=0.0, wait_activity=0.0))
        p1 = _energy_predict(r, prompt, dataclasses.replace(base, server_seq_us=_SERVER_PROBE_US, wait_activity=0.0))
        p2 = _energy_predict(r, prompt, dataclasses.replace(base, server_seq_us=0.0, wait_activity=1.0))
        tokens = r["batch"] * r["output"]
        e0, e1, e2 = (p.energy_j_per_token * tokens for p in (p0, p1, p2))
        out[i] = [p0.e2e_ms, (p1.e2e_ms - p0.e2e_ms) / _SERVER_PROBE_US, e0, (e1 - e0) / _SERVER_PROBE_US,
                  (e2 - e0) / span]
    return out


def _energy_linear(terms: np.ndarray, s_us: float, w: float, idle_w: float, span_w: float) -> tuple[np.ndarray, np.ndarray]:
    """(e2e ms, energy J) of each row at ``server_seq_us = s_us`` and ``wait_activity = w``."""
    e2e = terms[:, 0] + terms[:, 1] * s_us
    host_s = terms[:, 4] + terms[:, 1] * s_us / 1e3
    energy = terms[:, 2] + terms[:, 3] * s_us + span_w * w * host_s
    return e2e, energy


def fit_server(terms: np.ndarray, tokens: np.ndarray, tput: np.ndarray, jpt: np.ndarray, idle_w: float,
               span_w: float) -> tuple[float, float]:
    """``server_seq_us`` minimising the log error of the output throughput, then ``wait_activity`` minimising the
    log error of the energy per token at that host time (both bounded 1-D searches)."""
    from scipy.optimize import minimize_scalar

    def tput_loss(s: float) -> float:
        e2e, _ = _energy_linear(terms, s, 0.0, idle_w, span_w)
        return float(np.sum(np.log(tokens / (e2e / 1e3) / tput) ** 2))

    s = float(minimize_scalar(tput_loss, bounds=_SERVER_BOUNDS_US, method="bounded").x)

    def energy_loss(w: float) -> float:
        _, e = _energy_linear(terms, s, w, idle_w, span_w)
        return float(np.sum(np.log(e / tokens / jpt) ** 2))

    w = float(minimize_scalar(energy_loss, bounds=(0.0, 1.0), method="bounded").x)
    return s, w


def energy(data: Path, prompts: list[int], log: list[str]) -> dict:
    rows = load_energy(data)
    dev = get_device("h100-sxm5-80gb")
    idle_w, span_w = float(dev.idle_power_w), float(dev.board_power_w) - float(dev.idle_power_w)
    res: dict = {"rows": len(rows), "models": len({r["arch"] for r in rows})}
    y_e = np.array([r["j_per_token"] for r in rows])
    y_t = np.array([r["tpot_ms"] for r in rows])
    y_tp = np.array([r["tokens_per_s"] for r in rows])
    tokens = np.array([r["batch"] * r["output"] for r in rows], dtype=float)
    models = sorted({r["arch"] for r in rows})
    offline = serving_engine("vllm")
    server = serving_engine("vllm", frontend="api-server")
    for prompt in prompts:
        t0 = time.perf_counter()
        # the offline engine as fitted on LLM-Inference-Bench, nothing fitted on these rows
        po = [_energy_predict(r, prompt, offline) for r in rows]
        out: dict = {"offline_engine": {
            "energy_per_token": _metrics(y_e, np.array([p.energy_j_per_token for p in po]),
                                         np.array([p.energy_j_per_token_std for p in po])),
            "output_tokens_per_s": _metrics(y_tp, np.array([p.output_tokens_per_s for p in po]))}}
        # the API server: server_seq_us and wait_activity fitted leave-one-model-out
        terms = _energy_terms(rows, prompt, server)
        held_e, held_t, held_tpot, held_std = (np.zeros(len(rows)) for _ in range(4))
        folds = {}
        for m in models:
            test = np.array([r["arch"] == m for r in rows])
            s, w = fit_server(terms[~test], tokens[~test], y_tp[~test], y_e[~test], idle_w, span_w)
            folds[m] = {"server_seq_us": round(s, 1), "wait_activity": round(w, 4)}
            e2e_tr, e_tr = _energy_linear(terms[~test], s, w, idle_w, span_w)
            sigma = float(np.sqrt(np.mean(np.log(e_tr / tokens[~test] / y_e[~test]) ** 2)))
            eng = dataclasses.replace(server, server_seq_us=s, wait_activity=w)
            for i in np.flatnonzero(test):  # recomputed with the fold's engine, not the linear model
                p = _energy_predict(rows[i], prompt, eng)
                held_e[i], held_t[i] = p.energy_j_per_token, p.output_tokens_per_s
                held_tpot[i] = p.e2e_ms / rows[i]["output"]
                held_std[i] = held_e[i] * sigma
        s_all, w_all = fit_server(terms, tokens, y_tp, y_e, idle_w, span_w)
        e2e_all, e_all = _energy_linear(terms, s_all, w_all, idle_w, span_w)
        out["api_server"] = {
            "energy_per_token": _metrics(y_e, held_e, held_std),
            "output_tokens_per_s": _metrics(y_tp, held_t),
            "time_per_output_token": _metrics(y_t, held_tpot),
            "power_w": _metrics(y_e * y_tp, held_e * held_t),
            "by_model": {m: _metrics(y_e[[r["arch"] == m for r in rows]], held_e[[r["arch"] == m for r in rows]])
                         for m in models},
            "folds": folds,
            "fitted": {"server_seq_us": round(s_all, 1), "wait_activity": round(w_all, 4),
                       "sigma_log": round(float(np.sqrt(np.mean(np.log(held_e / y_e) ** 2))), 4)}}
        res[f"prompt_{prompt}"] = out
        log.append(f"energy prompt {prompt}: {len(rows)} rows, {time.perf_counter() - t0:.0f} s")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="directory of the public CSV files (../shared/data)")
    ap.add_argument("--parts", default="bench,vidur,energy", help="comma-separated: bench, vidur, energy")
    ap.add_argument("--h100", default="h100-sxm5-80gb", help="catalogue id for the bench's H100 rows")
    ap.add_argument("--energy-prompts", default="256,512,1024", help="prompt lengths assumed for the energy rows")
    ap.add_argument("--server-prompt", type=int, default=256,
                    help="prompt length assumed for the ML.ENERGY rows whose API-server constants --write stores")
    ap.add_argument("--write", action="store_true",
                    help=f"write the fitted engines to dippm_nas/llm/calibration/{ENGINES_FILE}")
    ap.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    ap.add_argument("--decode-kv-partition", action="append", default=[], metavar="ENGINE=TOKENS|none",
                    help="what-if: the engine's decode attention with this KV partition (none: output tiling); "
                         "repeatable, not with --write")
    args = ap.parse_args(argv)
    _DECODE_KV_PARTITION.clear()
    _DECODE_KV_PARTITION.update(parse_kv_partitions(args.decode_kv_partition))
    if args.write and _DECODE_KV_PARTITION:
        raise InvalidValueError("--decode-kv-partition is a what-if: it cannot be combined with --write")
    warnings.simplefilter("ignore", RuntimeWarning)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    log: list[str] = []
    report: dict = {"command": "python benchmarks/accuracy/accuracy_llm.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if "bench" in parts:
        report["bench"] = bench(args.data, args.h100, log)
    if "vidur" in parts:
        report["vidur"] = vidur(args.data, log)
    if args.write and "bench" in report:  # before the energy part, which uses the shipped engines
        _write(report["bench"], report["command"])
    if "energy" in parts:
        prompts = sorted({int(x) for x in args.energy_prompts.split(",")} | {args.server_prompt})
        report["energy"] = energy(args.data, prompts, log)
        if args.write:
            _write_server(report["energy"][f"prompt_{args.server_prompt}"]["api_server"], args.server_prompt,
                          report["command"])
    report["log"] = log
    text = json.dumps(report, indent=1)
    if args.json:
        write_output(args.json, text + "\n", "--json", error=InvalidValueError)
    print(text)
    return 0


def _write(bench_report: dict, command: str) -> None:
    
    metrics = {e: {"rows": v["rows"], "models": v["models"], "heldout_latency_mape_pct": v["latency"]["mape_pct"],
                   "heldout_throughput_mape_pct": v["throughput"]["mape_pct"], "kendall_tau": v["latency"]["kendall_tau"],
                   "coverage_2sigma": v["latency"]["coverage_2sigma"]} for e, v in bench_report["engines"].items()}
    old = engine_table()  # keep the API-server constants fitted on ML.ENERGY
    fitted = {e: {**{k: v for k, v in old.engines.get(e, {}).items() if k in _SERVER_KEYS}, **c}
              for e, c in bench_report["fitted"].items()}
    table = EngineTable(engines=fitted, command=command, metrics={**old.metrics, **metrics},
                        source="LLM-Inference-Bench (argonne-lcf, commit 4211f5d) vLLM and TensorRT-LLM rows on one H100 "
                               "and one GH200; sigma_log: RMS leave-one-model-out log error")
    path = Path(__file__).resolve().parents[2] / "dippm_nas" / "llm" / "calibration" / ENGINES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    table.save(path)
    engine_table.cache_clear()  # the energy part reads the engines just written


_SERVER_KEYS = ("server_seq_us", "wait_activity")


def _write_server(api: dict, prompt: int, command: str) -> None:
    """Store vLLM's API-server constants fitted on every ML.ENERGY row (at the assumed ``prompt``) in the shipped
    engines file, next to the offline constants."""
    old = engine_table()
    engines = {e: dict(v) for e, v in old.engines.items()}
    engines.setdefault("vllm", {}).update({k: api["fitted"][k] for k in _SERVER_KEYS})
    metrics = {**old.metrics, "vllm-api-server": {
        "rows": api["energy_per_token"]["n"], "assumed_prompt": prompt,
        "heldout_energy_per_token_mape_pct": api["energy_per_token"]["mape_pct"],
        "heldout_output_tokens_per_s_mape_pct": api["output_tokens_per_s"]["mape_pct"],
        "energy_sigma_log": api["fitted"]["sigma_log"], "command": command,
        "source": "ML.ENERGY leaderboard v2 (Apache-2.0) vLLM chat/code rows on one H100 80GB HBM3, "
                  "leave-one-model-out"}}
    table = EngineTable(engines=engines, source=old.source, command=old.command, metrics=metrics)
    path = Path(__file__).resolve().parents[2] / "dippm_nas" / "llm" / "calibration" / ENGINES_FILE
    table.save(path)
    engine_table.cache_clear()


if __name__ == "__main__":
    sys.exit(main())

