"""Fit the SDPA kernel efficiencies of the analytic prior on HW-GPT-Bench's released GPUs (A100 never read).

Usage::

    nice -n 10 python scripts/fit/fit_transformer_kernels.py --data ../shared/data [--per-space 10] [--seed 0]
        [--write dippm_nas/prior/calibration/fitted.json | --diagnose | --device-rules | --vidur-bandwidth]

``PriorParams.sdpa_eta_flash`` and ``sdpa_eta_efficient`` (:mod:`dippm_nas.prior._sdpa`) are fitted on the
profiler kernel time of HW-GPT-Bench's GPT spaces (``hwgpt_bench_gpu_latency_energy.csv``: H100, A40, RTX A6000,
RTX 3080 run the flash kernel in bf16 / fp16 autocast; V100 and RTX 2080 the memory-efficient one on tensor cores
in fp16 autocast; the P100's memory-efficient kernel runs on CUDA cores, which the efficiencies do not price, so its
rows fit nothing): for ``--per-space`` architectures per space (``accuracy_hwgpt.sample_archs``) each row's described
``gpu_ms`` is computed once with both efficiencies at 1 and its attention nodes' compute and memory terms kept, so a
candidate efficiency re-prices only those nodes: ``gpu_ms(eta) = gpu_ms(1) + sum(max(c / eta, m) - max(c, m))``.
The efficiency minimises the mean absolute log error of the rows over a log grid (0.05 .. 2), one value for both
kernels (``--separate``: each on its own kernel's rows; :func:`fit_etas` says why the shipped fit pools them); H100
rows are scored on both catalogued H100 boards (the board is not recorded). ``--write`` sets the two global keys of the calibration
file and records the fit under ``metrics["sdpa_fit"]``; nothing else in the file changes.
:func:`fit_etas` with ``exclude`` is the leave-one-GPU-out fit ``benchmarks/accuracy/accuracy_hwgpt.py`` uses.
``--diagnose``, ``--device-rules`` and ``--vidur-bandwidth`` fit nothing: per GPU the compute / memory / fixed
multipliers the rows ask for (:func:`diagnose`), a leave-one-GPU-out test of device-level rules keyed on device-file
facts (:func:`device_rules`), and the bandwidth Vidur's streaming operators reach on an A100 and an H100
(:func:`vidur_bandwidth`, ``vidur_a100_h100_llm_layer_op_profiling.csv``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"))

import accuracy_hwgpt as hw  # noqa: E402

#: Candidate efficiencies (log grid).
GRID = np.exp(np.linspace(np.log(0.05), np.log(2.0), 121))


def fit_etas(recs: list[dict[str, Any]], exclude: str | None = None, *, pooled: bool = True
             ) -> dict[str, float | None]:
    """``{"flash": eta, "efficient": eta}`` minimising the mean |log(pred / label)| of the records, the records of
    the released GPU ``exclude`` left out. ``pooled`` (the shipped fit): one efficiency for both kernels, fitted on
    the records of both; otherwise each on its own backend's records (``None``: a backend with no record left).

    The released rows cannot separate the two: the memory-efficient kernel runs on two tensor-core GPUs only
    (V100, RTX 2080), which pull opposite ways, so a leave-one-GPU-out fit of its own efficiency rests on one GPU
    (RTX 2080 at 58-82 % MAPE against 20-33 % pooled, docs/transformer_kernels.md)."""
    out: dict[str, float | None] = {}
    groups = ((("flash", "efficient"), ("flash", "efficient")),) if pooled else \
        ((("flash",), ("flash",)), (("efficient",), ("efficient",)))
    for keys, backends in groups:
        rs = [r for r in recs if r["released"] != exclude and r["attn_backend"] in backends]
        if not rs:
            out.update(dict.fromkeys(keys))
            continue
        errs = [float(np.mean([abs(np.log(repriced_ms(r, eta, eta) / r["label_ms"])) for r in rs])) for eta in GRID]
        out.update(dict.fromkeys(keys, float(GRID[int(np.argmin(errs))])))
    return out


def repriced_ms(rec: dict[str, Any], eta_flash: float, eta_efficient: float) -> float:
    """The record's described ``gpu_ms`` with its attention nodes at the given efficiencies (a record whose
    attention runs on CUDA cores, or has none, unchanged)."""
    if rec["attn_backend"] not in ("flash", "efficient"):
        return rec["unit_ms"]
    eta = eta_flash if rec["attn_backend"] == "flash" else eta_efficient
    c, m = np.asarray(rec["attn_compute_us"]), np.asarray(rec["attn_memory_us"])
    return rec["unit_ms"] + float(np.sum(np.maximum(c / eta, m) - np.maximum(c, m))) / 1e3


def sampled_rows(data: Path, per_space: int, seed: int) -> tuple[dict[str, list[str]], list[Any], set[Any]]:
    """The released GPUs' catalogue ids, their rows (the A100's are never read: ``hw.read_hwgpt_rows``) and the
    architectures sampled per space."""
    from dippm_nas.devices import list_devices

    catalogue = set(list_devices())
    gpus = {rel: [d for d in ids if d in catalogue] for rel, ids in hw.RELEASED_GPUS.items()}
    rows = [r for r in hw.read_hwgpt_rows(data / hw.HWGPT_FILE) if gpus.get(r.device)]
    chosen = {a for ids in hw.sample_archs(rows, per_space, seed).values() for a in ids}
    return gpus, rows, chosen


def row_graphs(rows: list[Any], chosen: set[Any], cache: str) -> Iterator[tuple[Any, Any]]:
    """Each sampled row with its model's graph (assembled once per architecture and batch size, through the
    conversion cache at ``cache``)."""
    import search_spaces as ss
    from dippm_nas.cache import ConversionCache
    from dippm_nas.capture import assemble

    conv = ConversionCache(f"sqlite:///{cache}")
    graphs: dict[tuple[str, int], Any] = {}
    try:
        for r in (x for x in rows if x.arch_id in chosen):
            key = (r.arch_id, r.batch_size)
            if key not in graphs:
                spec = ss.get_space("hwgpt").input_spec(r.config, batch_size=r.batch_size)
                graphs[key] = assemble("hwgpt", r.config, spec, cache=conv)
            yield r, graphs[key]
    finally:
        conv.close()


def unit_records(data: Path, per_space: int, seed: int, cache: str) -> list[dict[str, Any]]:
    """One record per (sampled row, catalogue GPU): label, described ``gpu_ms`` with both SDPA efficiencies at 1,
    the backend its attention runs and its attention nodes' compute and memory terms at efficiency 1 (µs)."""
    from dippm_nas import Deployment
    from dippm_nas.devices import get_device
    from dippm_nas.prior import (SDPA_BACKENDS, default_params, graph_facts, node_costs, predict,
                                 sdpa_backend_codes)

    unit = dataclasses.replace(default_params(), sdpa_eta_flash=1.0, sdpa_eta_efficient=1.0)
    gpus, rows, chosen = sampled_rows(data, per_space, seed)
    out: list[dict[str, Any]] = []
    for r, g in row_graphs(rows, chosen, cache):
        dep = Deployment(runtime="eager", framework="torch-2", autocast=r.autocast, input_copy="none")
        shape = graph_facts(g).attention_shape()
        att = np.flatnonzero(shape.attention)
        for dev in gpus[r.device]:
            d = get_device(dev)
            code = sdpa_backend_codes(shape, d.architecture, np.full(len(g.nodes), 1 if r.autocast == "float16"
                                                                      else 2))
            nc = node_costs(g, d, unit, autocast=r.autocast)
            backend = SDPA_BACKENDS[int(code[att[0]])] if len(att) else "none"
            if d.fp16_tensor_tflops is None:  # CUDA cores: the class constants price it, no efficiency to fit
                backend += "-cuda-cores"
            out.append({"space": r.space, "arch_id": r.arch_id, "released": r.device, "device": dev,
                        "label_ms": r.median_ms, "attn_backend": backend,
                        "unit_ms": predict(g, device=dev, deployment=dep, mig=False, params=unit).gpu_ms,
                        "attn_compute_us": nc.compute_us[att].tolist(),
                        "attn_memory_us": nc.memory_us[att].tolist()})
    return out


#: A memory-bound node whose predicted memory term is below this is "small" in :func:`diagnose`, µs.
SMALL_MEMORY_US = 5.0


def diagnose(data: Path, per_space: int, seed: int, cache: str) -> dict[str, dict[str, float]]:
    """Per catalogue GPU, the multipliers of the shipped prior's compute-bound, memory-bound and fixed per-kernel
    time (each node's time split by its larger roofline term) that best fit the released kernel times (non-negative
    least squares on relative errors): a diagnostic of which part misses on which GPU, fitted on the scored rows
    themselves and with collinear parts, so not a constant to ship. Two more fits test a bandwidth ramp (small
    kernels short of the full bandwidth): the memory-bound time split at :data:`SMALL_MEMORY_US` per node
    (``memory_small_x`` / ``memory_large_x``), and compute, memory, fixed plus a latency per memory-bound kernel
    (``latency_us``, Little's law: ``bytes / bandwidth + latency``)."""
    from dippm_nas.devices import get_device
    from dippm_nas.prior import default_params, node_costs

    params = default_params()
    gpus, rows, chosen = sampled_rows(data, per_space, seed)
    parts: dict[str, list[tuple[float, ...]]] = defaultdict(list)
    for r, g in row_graphs(rows, chosen, cache):
        for dev in gpus[r.device]:
            nc = node_costs(g, get_device(dev), params, autocast=r.autocast)
            comp = nc.compute_us >= nc.memory_us
            mem = ~comp & (nc.gpu_us > 0)
            small = mem & (nc.memory_us < SMALL_MEMORY_US)
            fixed = nc.gpu_us - np.maximum(nc.compute_us, nc.memory_us)
            parts[dev].append((float(np.sum(np.where(comp, nc.compute_us, 0.0))) / 1e3,
                               float(np.sum(np.where(mem & ~small, nc.memory_us, 0.0))) / 1e3,
                               float(np.sum(np.where(small, nc.memory_us, 0.0))) / 1e3,
                               float(np.sum(fixed)) / 1e3, float(np.sum(nc.kernels[mem])) / 1e3, r.median_ms))
    return {dev: diagnosis(np.array(ps)) for dev, ps in sorted(parts.items())}


def diagnosis(p: np.ndarray) -> dict[str, float]:
    """The fits of :func:`diagnose` on one GPU's rows ``p``: columns compute, large memory, small memory, fixed (ms),
    memory-bound kernels (thousands), label (ms)."""
    from scipy.optimize import nnls

    y = p[:, 5]

    def fit(x: np.ndarray) -> tuple[np.ndarray, float]:
        coef, _ = nnls(x / y[:, None], np.ones(len(y)))
        return coef, float(np.mean(np.abs(x @ coef / y - 1)) * 100)

    x3 = np.column_stack([p[:, 0], p[:, 1] + p[:, 2], p[:, 3]])
    c3, m3 = fit(x3)
    c4, _ = fit(p[:, :4])
    cl, ml = fit(np.column_stack([x3, p[:, 4]]))
    share = x3.sum(0) / x3.sum()
    return {"compute_x": float(c3[0]), "memory_x": float(c3[1]), "fixed_x": float(c3[2]),
            "compute_share": float(share[0]), "memory_share": float(share[1]), "fixed_share": float(share[2]),
            "mape_pct_as_is": float(np.mean(np.abs(x3.sum(1) / y - 1)) * 100), "mape_pct_refitted": m3,
            "memory_large_x": float(c4[1]), "memory_small_x": float(c4[2]), "latency_us": float(cl[3]),
            "latency_memory_x": float(cl[1]), "mape_pct_latency": ml}


#: Device-level groupings a rule may key on (device-file facts and the row's autocast dtype): each maps a catalogue
#: GPU and the row's autocast dtype to its group.
RULE_KEYS: dict[str, Any] = {
    "architecture": lambda d, ac: "pre-ampere" if d.architecture in ("pascal", "volta", "turing") else "ampere+",
    "memory": lambda d, ac: "hbm" if "HBM" in d.sources.get("memory_gib", "") else "gddr",
    "autocast": lambda d, ac: ac,
    "geforce": lambda d, ac: "geforce" if d.geforce else "other",
}
#: Multipliers a device-level rule may set per group (time of memory-bound nodes, fixed per-kernel time).
RULE_GRID = np.exp(np.linspace(np.log(0.3), np.log(4.0), 41))


def part_records(data: Path, per_space: int, seed: int, cache: str) -> list[dict[str, Any]]:
    """Per (sampled row, catalogue GPU) of the shipped prior's described ``gpu_ms``: the label, the groups of
    :data:`RULE_KEYS` and each node's compute term, memory term and time (µs), so a rule re-prices the nodes:
    ``fixed x kf + max(compute, memory x km)``."""
    from dippm_nas.devices import get_device
    from dippm_nas.prior import default_params, node_costs

    params = default_params()
    gpus, rows, chosen = sampled_rows(data, per_space, seed)
    out: list[dict[str, Any]] = []
    for r, g in row_graphs(rows, chosen, cache):
        for dev in gpus[r.device]:
            d = get_device(dev)
            nc = node_costs(g, d, params, autocast=r.autocast)
            keep = nc.gpu_us > 0
            out.append({"space": r.space, "released": r.device, "device": dev, "label_ms": r.median_ms,
                        "groups": {k: f(d, r.autocast) for k, f in RULE_KEYS.items()},
                        "c": nc.compute_us[keep], "m": nc.memory_us[keep], "t": nc.gpu_us[keep]})
    return out


def _ruled_ms(rec: dict[str, Any], kf: float, km: float) -> float:
    top = np.maximum(rec["c"], rec["m"])
    return float(np.sum(kf * (rec["t"] - top) + np.maximum(rec["c"], rec["m"] * km))) / 1e3


def _fit_rule(recs: list[dict[str, Any]]) -> tuple[float, float]:
    """(fixed x, memory x) minimising the mean |log(pred / label)| of ``recs`` over :data:`RULE_GRID`."""
    best, arg = np.inf, (1.0, 1.0)
    for kf in RULE_GRID:
        for km in RULE_GRID:
            e = float(np.mean([abs(np.log(_ruled_ms(r, kf, km) / r["label_ms"])) for r in recs]))
            if e < best:
                best, arg = e, (float(kf), float(km))
    return arg


def device_rules(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Leave-one-GPU-out test of a device-level rule per key of :data:`RULE_KEYS`: for each released GPU, the
    (fixed x, memory x) of its group fitted on the other released GPUs' records of that group (1, 1 where no other
    GPU shares it), then MAPE and Kendall τ per (catalogue GPU, space) cell. The SDPA efficiencies stay the shipped
    (in-sample) ones. Returns per key: the cells meeting ≤ 10 % and τ ≥ 0.9, the mean cell MAPE, per-GPU MAPE and the
    multipliers used; key ``"none"``: the shipped prior."""
    from scipy.stats import kendalltau

    out: dict[str, dict[str, Any]] = {}
    for key in ("none", *RULE_KEYS):
        used: dict[str, tuple[float, float]] = {}
        for held in sorted({r["released"] for r in recs}):
            mine = next(r for r in recs if r["released"] == held)
            same = [r for r in recs if r["released"] != held and key != "none"
                    and r["groups"][key] == mine["groups"][key]]
            used[held] = _fit_rule(same) if same else (1.0, 1.0)
        cells: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for r in recs:
            cells[(r["device"], r["space"])].append((_ruled_ms(r, *used[r["released"]]), r["label_ms"]))
        mape = {c: float(np.mean([abs(p / y - 1) for p, y in v]) * 100) for c, v in cells.items()}
        tau = {c: float(kendalltau(*zip(*v)).statistic) for c, v in cells.items()}
        per_gpu: dict[str, list[float]] = defaultdict(list)
        for (dev, _), v in mape.items():
            per_gpu[dev].append(v)
        out[key] = {"met": sum(mape[c] <= 10 and tau[c] >= 0.9 for c in cells), "cells": len(cells),
                    "mean_mape_pct": float(np.mean(list(mape.values()))),
                    "gpu_mape_pct": {d: float(np.mean(v)) for d, v in sorted(per_gpu.items())},
                    "fixed_memory_x": used}
    return out


#: Vidur's operator file (microsoft/vidur profiling, MIT; A100 and H100 rows, fp16).
VIDUR_FILE = "vidur_a100_h100_llm_layer_op_profiling.csv"
#: Bytes a Vidur operator moves per token and hidden unit, fp16: the residual ``add`` reads two tensors and writes
#: one; ``input_layernorm`` (RMSNorm) reads one and writes one.
VIDUR_PASSES = {"add": 3, "input_layernorm": 2}


def vidur_bandwidth(data: Path, min_mib: float = 128.0) -> dict[str, dict[str, float]]:
    """Median achieved bandwidth (GB/s) of Vidur's memory-bound operators per GPU, over the single-GPU rows that
    move at least ``min_mib`` MiB (beyond any catalogued L2): what the DRAM of an HBM board gives a plain streaming
    kernel, measured on other rows than HW-GPT-Bench's."""
    rates: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with open(data / VIDUR_FILE, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("num_tensor_parallel_workers") not in ("1", "1.0"):
                continue
            tokens, hidden = float(row["num_tokens"]), float(row["n_embd"])
            for op, passes in VIDUR_PASSES.items():
                nbytes, ms = passes * tokens * hidden * 2, float(row[f"time_stats.{op}.median"] or "nan")
                if nbytes >= min_mib * 2**20 and ms > 0:
                    rates[row["gpu"]][op].append(nbytes / (ms * 1e-3) / 1e9)
    return {g: {op: float(np.median(v)) for op, v in ops.items()} for g, ops in sorted(rates.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--data", type=Path, required=True, help="folder holding " + hw.HWGPT_FILE)
    ap.add_argument("--per-space", type=int, default=10, help="architectures per space (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the architecture sample (default 0)")
    ap.add_argument("--cache", default="/tmp/dippm_hwgpt_blocks.sqlite", help="block conversion cache (SQLite)")
    ap.add_argument("--write", type=Path, help="calibration file whose sdpa_eta_* keys to set")
    ap.add_argument("--separate", action="store_true", help="fit each kernel's efficiency on its own rows")
    ap.add_argument("--vidur-bandwidth", action="store_true",
                    help="print the bandwidth Vidur's add / RMSNorm operators reach on the A100 and H100 (fits nothing)")
    ap.add_argument("--device-rules", action="store_true",
                    help="test device-level (fixed, memory) rules keyed on device facts, leave one GPU out (fits nothing)")
    ap.add_argument("--diagnose", action="store_true",
                    help="print per GPU the compute / memory / fixed multipliers the rows ask for (fits nothing)")
    a = ap.parse_args(argv)
    if a.diagnose:
        for dev, d in diagnose(a.data, a.per_space, a.seed, a.cache).items():
            print(f"{dev:16} compute x{d['compute_x']:.2f} memory x{d['memory_x']:.2f} fixed x{d['fixed_x']:.2f} | "
                  f"shares {d['compute_share']:.2f}/{d['memory_share']:.2f}/{d['fixed_share']:.2f} | MAPE as is "
                  f"{d['mape_pct_as_is']:.1f} %, refitted {d['mape_pct_refitted']:.1f} % | memory small "
                  f"x{d['memory_small_x']:.2f} large x{d['memory_large_x']:.2f} | with a latency per memory-bound "
                  f"kernel: {d['latency_us']:.2f} µs, memory x{d['latency_memory_x']:.2f}, MAPE "
                  f"{d['mape_pct_latency']:.1f} %")
        return 0
    if a.vidur_bandwidth:
        for gpu, ops in vidur_bandwidth(a.data).items():
            print(f"{gpu}: " + ", ".join(f"{op} {gbps:.0f} GB/s" for op, gbps in ops.items()))
        return 0
    if a.device_rules:
        for key, d in device_rules(part_records(a.data, a.per_space, a.seed, a.cache)).items():
            gpus = ", ".join(f"{g} {v:.1f}" for g, v in d["gpu_mape_pct"].items())
            mult = ", ".join(f"{g} {f:.2f}/{m:.2f}" for g, (f, m) in d["fixed_memory_x"].items())
            print(f"{key:12} met {d['met']:2d} of {d['cells']}, mean {d['mean_mape_pct']:.1f} % | {gpus} | "
                  f"fixed/memory x {mult}")
        return 0
    recs = unit_records(a.data, a.per_space, a.seed, a.cache)
    etas = fit_etas(recs, pooled=not a.separate)
    counts: dict[str, int] = defaultdict(int)
    for r in recs:
        counts[r["attn_backend"]] += 1
    print(f"fitted on {len(recs)} rows ({dict(counts)}): sdpa_eta_flash {etas['flash']:.4f}, "
          f"sdpa_eta_efficient {etas['efficient']:.4f}")
    if a.write:
        d = json.loads(a.write.read_text())
        d["global"]["sdpa_eta_flash"], d["global"]["sdpa_eta_efficient"] = etas["flash"], etas["efficient"]
        gpus = sorted({r["released"] for r in recs})
        d["metrics"]["sdpa_fit"] = {
            "source": ("HW-GPT-Bench (automl/HW-GPT-Bench, Apache-2.0) profiler kernel time of one forward, GPT spaces "
                       f"s/m/l, {a.per_space} architectures per space (seed {a.seed}), released GPUs {gpus} "
                       "(A100 rows never read); described deployment eager, torch-2, the row's autocast"),
            "command": ("python scripts/fit/fit_transformer_kernels.py --data /work/shared/data "
                        f"--per-space {a.per_space} --seed {a.seed} --write {a.write}"
                        + (" --separate" if a.separate else "")),
            "rows": dict(counts)}
        from dippm_nas.errors import InvalidValueError
        from dippm_nas.files import write_output

        write_output(a.write, json.dumps(d, indent=1) + "\n", "--write", error=InvalidValueError)
        print(f"wrote {a.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
