"""Accuracy and σ of GPU latency with the deployment described and unknown, on the released timings.

Usage (from the repository root; the data paths are arguments, nothing is downloaded)::

    dippm-nas dataset import ryujaehun ../shared/data/ryujaehun_torchvision_eager_bs12_turing_pascal.csv \\
        --out ryujaehun.sqlite
    dippm-nas dataset import timm TIMM_CSV --out timm.sqlite            # the amp / NCHW / eager rows
    dippm-nas dataset import accel-nasbench ../shared/data/accel_nasbench_mnasnet_space_throughput.csv \\
        --out accel.sqlite
    python benchmarks/accuracy/accuracy_deployment.py --ryujaehun ryujaehun.sqlite --timm timm.sqlite \\
        --accel accel.sqlite [--mlenergy ../shared/data/mlenergy_v2_h100_energy_latency.csv] [--json out.json]

``--mlenergy`` rebuilds ML.ENERGY's text-to-image pipelines from their configs (``accuracy_energy.py``; no
weights, nothing downloaded) and needs diffusers and transformers: ``pip install -e ".[bench-t2i]"``.

Every row is predicted by the analytic prior (:func:`dippm_nas.prior.predict`) twice:

- **described**: the :class:`~dippm_nas.Deployment` the row records (eager; the host's clock and PyTorch 1.x and
  the pageable input copy of the eager CNN timings; autocast, channels-last layout and the torch version of the
  timm and Accel-NASBench rows, whose hosts are not recorded and stay undescribed; for ML.ENERGY's diffusers
  pipelines, PyTorch 2.x and no input copy, the host not recorded: :func:`described`);
- **unknown**: ``Deployment()`` (eager, nothing else said): the σ spans the hosts, framework generations, TF32
  defaults and input copies of real servers (:func:`dippm_nas.prior.deployment_spread`).

The prior of each cell is what an unseen GPU gets: for the eager CNN timings (RTX 2080 Ti, TITAN RTX, TITAN Xp)
the host model, the FP64 efficiency and the first touch of a freshly mapped batch (``scripts/fit/fit_input_copy.py``,
the loop's float32 batches mapped fresh, its float16 ones not) refitted without the held-out GPU, with the σ of the
host model measured between the other two (``benchmarks/accuracy/accuracy_eager.py``'s folds; its kernel σ by precision,
``sigma_log_gpu_unseen_float16`` / ``_float32``, too) and at least the shipped unseen-GPU kernel σ
(``metrics["sigma_log_gpu_unseen"]``, derived from the fitted GPUs' Accel-NASBench and timm rows, none of these);
for the timm GPUs the held-out GPU's fitted efficiency multipliers replaced by the geometric mean of the other GPUs
the default entry averages and the unseen-GPU σ measured without it (``benchmarks/accuracy/unseen_gpu_sigma.py``'s
``unseen_params`` and ``nested_sigma``); the Accel-NASBench rows (A100, RTX 3090) with the shipped constants, which
were fitted on them (in-sample on the kernels; their own multipliers, their σ); for ML.ENERGY's H100 rows the
H100's entry (fitted on these rows) removed, so the H100 gets the default entry and the shipped unseen-GPU kernel σ,
neither measured on an H100 (``unseen_params``; ``--shipped``: the H100 entry, in-sample). An ML.ENERGY row is one
batch of a pipeline (text encoders, one guided denoiser call per step, the VAE decode): its components are
predicted one by one and summed with :func:`dippm_nas.sum_stages` (``accuracy_energy.predict_row``), so its σ is
the stages' σ summed as that function does, and it counts as GPU-bound when the stages the prior calls
launch-bound take under half of its time. Latency only: the deployment σ is a latency σ; the pipelines' energy is
scored by ``accuracy_energy.py``.

The script exits 1, naming each cell on stderr (``DESCRIBED WORSE THAN UNDESCRIBED: <cell>: ...``), where the
described MAPE is above the unknown one: describing a deployment truthfully must never give a worse answer.

Per cell (source x GPU x dtype; ML.ENERGY: one cell of all its pipelines and batches) and mode: MAPE, Kendall τ,
the share of measurements within ±1σ and ±2σ (log space), the median σ as a share of the value; and what a search
sees (``benchmarks/accuracy/search_view.py``): for latency budgets at the 25th, 50th and 75th percentile of the
cell's measured latencies, the share of admitted models (``mean + 1σ <= budget``) really over budget and the share
of really-within models rejected. Per cell also the kernel σ the cell's GPU gets (``kernel_sigma_log``) and, apart for the rows the prior calls
GPU-bound and the others (host-bound), their count and the mean and RMS of their log error (``gpu_bound_rows``,
``gpu_bound_mean_log``, ``gpu_bound_rms_log``, ``host_bound_*``: where a cell's error sits), and for the eager CNN hosts a check of the
undescribed host mixture (not a fit): the recorded clock and the clock the host-bound rows of a cell (at least
:data:`HOST_CHECK_MIN_ROWS`) say the host runs at, each as a z-score in the mixture's log-normal host speed
(:data:`~dippm_nas.prior.UNKNOWN_HOST_CLOCK_GHZ`, :data:`~dippm_nas.prior.UNKNOWN_HOST_SIGMA_LOG`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_eager import _nested_sigma, _without_fp64_rows_of, fold_host_model  # noqa: E402  (sibling scripts)
import accuracy_energy  # noqa: E402
from search_view import search_view  # noqa: E402
from unseen_gpu_sigma import fitted_cells, nested_sigma, source_rows, unseen_params  # noqa: E402

from benchmarks._common import machine  # noqa: E402
from dippm_nas import Deployment  # noqa: E402
from dippm_nas.deployment import row_deployment  # noqa: E402
from dippm_nas.prior import (UNKNOWN_HOST_CLOCK_GHZ, UNKNOWN_HOST_SIGMA_LOG, HostRow,  # noqa: E402
                             default_params, predict, row_settings)
from dippm_nas.training import DEVICE_ALIASES  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402

MODES = ("described", "unknown")
#: Fewest host-bound rows of a cell whose host is checked against the undescribed host mixture.
HOST_CHECK_MIN_ROWS = 5


def described(source: str, m: dict[str, Any]) -> Deployment:
    """The deployment a dataset row records (:func:`dippm_nas.deployment.row_deployment`, the mapping training and the
    fits use; an ML.ENERGY row is a CSV row, :func:`_mlenergy_described`)."""
    if source == "mlenergy":
        return _mlenergy_described(m)
    if source not in ("ryujaehun", "timm", "accel-nasbench"):
        raise SystemExit(f"unknown source {source!r}")
    return row_deployment(m.get("conditions"), m.get("environment"), dtype=m.get("dtype"))


#: The ML.ENERGY benchmark commit whose text-to-image rows the shared file holds (PROVENANCE.md) and what its
#: ``benchmark/diffusion/text-to-image`` records: diffusers 0.29.2 pipelines loaded in float16, PyTorch 2.x
#: (``requirements.txt``: ``torch==2.2.1`` with diffusers 0.26.3, then unpinned with 0.29.2 in mid-2024), each batch
#: timed from the pipeline call on prompt strings (no input tensor is copied), no TF32, autocast or cuDNN flag set.
MLENERGY_COMMIT = "c3af7f31e231a2a7021c5f8e2a54dd712d02e6e2"


def _mlenergy_described(row: dict[str, Any]) -> Deployment:
    """The deployment of one ML.ENERGY row (the CSV's columns): the diffusers text-to-image benchmark of the
    recorded commit on an H100; the host is not recorded and stays undescribed, TF32 takes PyTorch 2's defaults."""
    if row.get("task") != "diffusion/text-to-image":
        raise SystemExit(f"ML.ENERGY row of task {row.get('task')!r}: only diffusion/text-to-image rows (diffusers "
                         "pipelines) have a described deployment here")
    if row.get("GPU") != accuracy_energy.GPU:
        raise SystemExit(f"ML.ENERGY row on {row.get('GPU')!r}: only {accuracy_energy.GPU!r} rows are scored")
    if row.get("commit") != MLENERGY_COMMIT:
        raise SystemExit(f"ML.ENERGY row of commit {row.get('commit')!r}: the recorded deployment is that of "
                         f"{MLENERGY_COMMIT} (diffusers 0.29.2)")
    return Deployment(runtime="eager", framework="torch-2", input_copy="none", autocast="none")


def _predict(graph: Any, device: str, params: Any, deployment: Deployment) -> tuple[float, float, bool]:
    """(latency ms, log σ, GPU-bound) of the analytic prior for one deployment."""
    p = predict(graph, device, params=params, deployment=deployment, mig=False)
    return (p.latency_ms, (p.latency_ms_std / p.latency_ms if p.latency_ms_std else 0.0),
            not p.details.get("launch_bound", 0.0))


#: Host model metrics of the shipped calibration a fold keeps (what its own fit does not measure).
_UNSEEN_KEYS = ("sigma_log_gpu_unseen", "fit_gpu_unseen")


def _cell_params(source: str, device: str, rows: list, base: Any, cells: dict) -> Any:
    """The prior's constants an unseen ``device`` of ``source`` gets (see the module docstring); ``cells``: the
    fitted GPUs' rows (:func:`unseen_gpu_sigma.fitted_cells`)."""
    if source == "ryujaehun":
        host_rows = [(HostRow(mg.graph, mg.measurement["device"],
                              row_settings(mg.measurement.get("conditions"), mg.measurement.get("environment")),
                              float(mg.measurement["latency_ms"]), fresh_pages=mg.graph.spec.dtype == "float32"),
                      mg.measurement["config"]["model"])
                     for mg in rows]
        fold = _without_fp64_rows_of(base, host_rows, [device])
        hm = fold_host_model(host_rows, device, fold, base)  # the first touch measured on the other hosts
        kept = {k: base.host_model.metrics[k] for k in _UNSEEN_KEYS if k in base.host_model.metrics}
        hm = dataclasses.replace(hm, metrics={**hm.metrics, **_nested_sigma(
            host_rows, device, dataclasses.replace(base, host_model=hm)), **kept})
        return dataclasses.replace(fold, host_model=hm)
    if source == "timm":
        p = unseen_params(base, device)
        hm = p.host_model
        metrics = {**hm.metrics, "sigma_log_gpu_unseen": nested_sigma(cells, base, device)}
        return dataclasses.replace(p, host_model=dataclasses.replace(hm, metrics=metrics))
    return base


def mlenergy_cell(path: Path, *, shipped: bool, base: Any) -> dict[str, Any]:
    """Both modes of the ML.ENERGY H100 cell: every pipeline and batch of ``path`` (the CSV), captured through
    ``accuracy_energy`` (needs diffusers and transformers), predicted with the prior of the module docstring."""
    raw = accuracy_energy.read_rows(path)
    if not raw:
        raise SystemExit(f"no H100 text-to-image rows of the rebuilt pipelines in {path}")
    by_key = {(r["pipeline"], int(float(r["Batch size"]))): r for r in raw}
    rows = accuracy_energy.capture_rows(accuracy_energy.load_rows(path))
    device = accuracy_energy.DEVICE
    params = base if shipped else unseen_params(base, device)
    y = np.array([r.batch_latency_s * 1e3 for r in rows])
    entry: dict[str, Any] = {"kernel_sigma_log": params.host_model.sigma_log_gpu(
        "float16", device_fitted=params.device_fitted(device))}
    for mode in MODES:
        got = [accuracy_energy.predict_row(r, params, deployment=described("mlenergy", by_key[(r.name, r.batch)])
                                           if mode == "described" else Deployment()) for r in rows]
        pred = np.array([g.latency_ms for g in got])
        # GPU-bound: the stages the prior calls launch-bound take under half of the row's time
        gpu_bound = np.array([sum(n * s.latency_ms for s, n in zip(g.stages, g.calls)
                                  if s.details.get("launch_bound", 0.0)) < 0.5 * g.latency_ms for g in got])
        entry[mode] = metrics(pred, np.array([(g.latency_ms_std or 0.0) / g.latency_ms for g in got]), y, gpu_bound)
        # where the error sits: the median predicted / measured latency of each pipeline
        entry[mode]["median_ratio_by_pipeline"] = {
            name: float(np.median([p / t for p, t, r in zip(pred, y, rows) if r.name == name]))
            for name in sorted({r.name for r in rows})}
    return entry


def metrics(pred: np.ndarray, sig: np.ndarray, y: np.ndarray, gpu_bound: np.ndarray | None = None) -> dict[str, float]:
    """MAPE, τ, ±1σ / ±2σ coverage in log space, median σ (share of the value), the RMS log error of the
    ``gpu_bound`` rows and the search view at k = 1."""
    r = np.abs(np.log(pred / y))
    out = {"n": int(len(y)), "mape_pct": float(np.mean(np.abs(pred / y - 1)) * 100),
           "kendall_tau": float(kendalltau(pred, y)[0]) if len(y) > 2 else math.nan,
           "within_1sigma": float(np.mean(r <= sig)), "within_2sigma": float(np.mean(r <= 2 * sig)),
           "median_sigma_pct": float(np.median(sig) * 100)}
    if gpu_bound is not None:
        out.update(_bound_errors(np.log(pred / y), np.asarray(gpu_bound, dtype=bool)))
    view = search_view([(float(p), float(p * s), float(m)) for p, s, m in zip(pred, sig, y)], ks=(1.0,))
    for pct in ("p25", "p50", "p75"):
        k1 = view[pct]["k=1"]
        out[f"{pct}_over_pct"] = k1["over_pct"]
        out[f"{pct}_rejected_pct"] = k1["rejected_pct"]
        out[f"{pct}_counts"] = [k1["admitted_over"], k1["admitted"], k1["within_rejected"], view[pct]["within"]]
    return out


def _bound_errors(err: np.ndarray, gpu_bound: np.ndarray) -> dict[str, float]:
    """Where a cell's error sits: the count, mean and RMS of ``err`` (log predicted / measured) over the rows the
    prior calls GPU-bound and over the others (host-bound); NaN for an empty side. A mean near the RMS is a
    bias of that timeline (the kernels' or the host's), not scatter."""
    out: dict[str, float] = {}
    for side, rows in (("gpu_bound", gpu_bound), ("host_bound", ~gpu_bound)):
        out[f"{side}_rows"] = int(rows.sum())
        out[f"{side}_mean_log"] = float(np.mean(err[rows])) if rows.any() else math.nan
        out[f"{side}_rms_log"] = float(np.sqrt(np.mean(err[rows] ** 2))) if rows.any() else math.nan
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ryujaehun", type=Path, help="dataset with the eager CNN timings (graphs captured)")
    ap.add_argument("--timm", type=Path, help="dataset with timm benchmark rows (graphs captured)")
    ap.add_argument("--accel", type=Path, help="dataset with Accel-NASBench rows (graphs captured)")
    ap.add_argument("--mlenergy", type=Path, help="ML.ENERGY's CSV (mlenergy_v2_h100_energy_latency.csv): its H100 "
                    "text-to-image rows, pipelines rebuilt and captured (needs diffusers and transformers)")
    ap.add_argument("--shipped", action="store_true",
                    help="predict every cell with the shipped constants (in-sample where they were fitted on the "
                         "cell's rows) instead of what an unseen GPU gets")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    args = ap.parse_args(argv)
    sources = [(s, p) for s, p in (("ryujaehun", args.ryujaehun), ("timm", args.timm),
                                   ("accel-nasbench", args.accel)) if p is not None]
    if not sources and args.mlenergy is None:
        ap.error("give at least one of --ryujaehun, --timm, --accel, --mlenergy")
    base = default_params()
    report: dict[str, Any] = {"machine": machine(), "cells": {}, "host_check": {}}
    loaded = {source: source_rows(path, source) for source, path in sources}
    cells = fitted_cells(loaded)
    for source, rows in loaded.items():
        for row_device in sorted({mg.measurement["device"] for mg in rows}):
            device = DEVICE_ALIASES.get(row_device, row_device)  # a dataset's device name -> a catalogue id
            params = base if args.shipped else _cell_params(source, device, rows, base, cells)
            mine = [mg for mg in rows if mg.measurement["device"] == row_device]
            for dtype in sorted({mg.graph.spec.dtype for mg in mine}):
                cell = [mg for mg in mine if mg.graph.spec.dtype == dtype]
                y = np.array([float(mg.measurement["latency_ms"]) for mg in cell])
                entry: dict[str, Any] = {"kernel_sigma_log": params.host_model.sigma_log_gpu(
                    dtype, device_fitted=params.device_fitted(device))}
                for mode in MODES:
                    got = [_predict(mg.graph, device, params,
                                    described(source, mg.measurement) if mode == "described" else Deployment())
                           for mg in cell]
                    pred = np.array([g[0] for g in got])
                    entry[mode] = metrics(pred, np.array([g[1] for g in got]), y, np.array([g[2] for g in got]))
                    if mode == "described":  # (recorded clock, log predicted / measured) of host-bound rows
                        host_bound = [(_clock(mg), math.log(p / t)) for mg, p, t, g in zip(cell, pred, y, got)
                                      if not g[2] and _clock(mg)]
                        if len(host_bound) >= HOST_CHECK_MIN_ROWS:
                            report["host_check"][f"{device} {dtype}"] = _host_check(host_bound)
                key = f"{source} {device} {dtype}"
                report["cells"][key] = entry
                print(_line(key, entry), flush=True)
                if f"{device} {dtype}" in report["host_check"]:
                    print(f"  host check: {report['host_check'][f'{device} {dtype}']}", flush=True)
    if args.mlenergy is not None:
        key = f"mlenergy {accuracy_energy.DEVICE} float16"
        report["cells"][key] = mlenergy_cell(args.mlenergy, shipped=args.shipped, base=base)
        print(_line(key, report["cells"][key]), flush=True)
    report["summary"] = _summary(report["cells"])
    report["described_worse"] = described_worse(report["cells"])
    print(json.dumps(report["summary"], indent=1))
    print(_side_by_side(report["cells"]))
    if args.json is not None:
        write_output(args.json, json.dumps(report, indent=1) + "\n", "--json", error=InvalidValueError)
        print(f"wrote {args.json}")
    for key, d, u in report["described_worse"]:
        print(f"DESCRIBED WORSE THAN UNDESCRIBED: {key}: described MAPE {d:.1f} % > unknown {u:.1f} %", file=sys.stderr)
    return 1 if report["described_worse"] else 0


def described_worse(cells: dict[str, Any]) -> list[tuple[str, float, float]]:
    """``(cell, described MAPE %, unknown MAPE %)`` of every cell where describing the deployment truthfully gives
    a worse answer than leaving it undescribed (the rule: never; the script exits non-zero when any is listed)."""
    return [(key, c["described"]["mape_pct"], c["unknown"]["mape_pct"]) for key, c in cells.items()
            if c["described"]["mape_pct"] > c["unknown"]["mape_pct"]]


def _side_by_side(cells: dict[str, Any]) -> str:
    """A table of every cell: MAPE, ±2σ and median σ described and unknown side by side."""
    lines = [f"{'cell':40s} {'described MAPE ±2σ σ':>24s} | {'unknown MAPE ±2σ σ':>22s}"]
    for key, c in cells.items():
        d, u = c["described"], c["unknown"]
        flag = "  <- described worse" if d["mape_pct"] > u["mape_pct"] else ""
        lines.append(f"{key:40s} {d['mape_pct']:8.1f} % {d['within_2sigma']:5.2f} {d['median_sigma_pct']:4.0f} % | "
                     f"{u['mape_pct']:7.1f} % {u['within_2sigma']:5.2f} {u['median_sigma_pct']:4.0f} %{flag}")
    return "\n".join(lines)


def _clock(mg: Any) -> float | None:
    """The recorded host clock of a row, GHz (``None`` when not recorded)."""
    clock = (mg.measurement.get("environment") or {}).get("host_clock_ghz")
    return float(clock) if clock else None


def _host_check(host_bound: list[tuple[float, float]]) -> dict[str, float]:
    """The recorded host against the undescribed host mixture (a check, not a fit): the recorded clock and the
    clock the host-bound rows imply (host time scales with 1 / clock, so a row predicted at ``r = log(predicted
    / measured)`` ran as a host of ``exp(r)`` times its clock; the median over the rows), each as a z-score of
    the mixture's log-normal speed."""
    clock = float(np.median([c for c, _ in host_bound]))
    effective = clock * math.exp(float(np.median([r for _, r in host_bound])))
    z = (lambda ghz: (math.log(ghz) - math.log(UNKNOWN_HOST_CLOCK_GHZ)) / UNKNOWN_HOST_SIGMA_LOG)
    return {"host_bound_rows": len(host_bound), "clock_ghz": clock, "z_clock": z(clock),
            "effective_clock_ghz": effective, "z_effective": z(effective)}


def _line(key: str, entry: dict[str, Any]) -> str:
    parts = [f"{key:38s} kernel σ {entry['kernel_sigma_log']:.3f}"]
    for mode in MODES:
        m = entry[mode]
        parts.append(f"{mode}: n={m['n']:3d} MAPE {m['mape_pct']:5.1f} % tau {m['kendall_tau']:.2f} "
                     f"±1σ {m['within_1sigma']:.2f} ±2σ {m['within_2sigma']:.2f} σ {m['median_sigma_pct']:4.0f} % "
                     f"over/rej p25 {_pct(m['p25_over_pct'])}/{_pct(m['p25_rejected_pct'])} "
                     f"p50 {_pct(m['p50_over_pct'])}/{_pct(m['p50_rejected_pct'])} "
                     f"p75 {_pct(m['p75_over_pct'])}/{_pct(m['p75_rejected_pct'])} "
                     f"GPU-bound {m['gpu_bound_rows']} mean {m['gpu_bound_mean_log']:+.3f} RMS "
                     f"{m['gpu_bound_rms_log']:.3f} host-bound {m['host_bound_rows']} mean "
                     f"{m['host_bound_mean_log']:+.3f} RMS {m['host_bound_rms_log']:.3f}")
    return "\n  ".join(parts)


def _pct(v: float) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.0f}"


def _summary(cells: dict[str, Any]) -> dict[str, Any]:
    """Pooled search-view shares (admitted and rejected counts summed over cells) and the coverage extremes."""
    out: dict[str, Any] = {}
    for mode in MODES:
        cov = [c[mode]["within_2sigma"] for c in cells.values()]
        sig = [c[mode]["median_sigma_pct"] for c in cells.values()]
        out[mode] = {"cells": len(cov), "min_within_2sigma": min(cov), "cells_below_0.90": sum(v < 0.9 for v in cov),
                     "cells_below_0.80": sum(v < 0.8 for v in cov),
                     "median_of_median_sigma_pct": float(np.median(sig)), "max_median_sigma_pct": max(sig)}
        for pct in ("p25", "p50", "p75"):
            over, adm, rej, within = (sum(c[mode][f"{pct}_counts"][i] for c in cells.values()) for i in range(4))
            out[mode][f"{pct}_pooled_over_pct"] = 100.0 * over / adm if adm else math.nan
            out[mode][f"{pct}_pooled_rejected_pct"] = 100.0 * rej / within if within else math.nan
    return out


if __name__ == "__main__":
    raise SystemExit(main())
