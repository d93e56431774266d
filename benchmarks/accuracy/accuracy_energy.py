#!/usr/bin/env python
"""Energy and latency of text-to-image pipelines on an H100, against ML.ENERGY's meter, leave one model out.

Usage::

    python benchmarks/accuracy/accuracy_energy.py --data ../shared/data --matmul-abs 0.7956 [--models a,b]
        [--variants package,host-fitted,host-shipped] [--json]
        [--write-power dippm_nas/prior/calibration/power.json] [--write-fitted dippm_nas/prior/calibration/fitted.json]

ML.ENERGY leaderboard v2 (``mlenergy_v2_h100_energy_latency.csv``, Apache-2.0) measured whole-GPU NVML energy
(Zeus) and batch latency of diffusers pipelines on one H100 80GB HBM3, fp16, 25 denoising steps, at batch 1-64;
only the file's H100 rows are read. Each pipeline with a config under ``benchmarks/accuracy/configs/mlenergy_t2i``
is rebuilt from diffusers configs (no weights; ``_t2i_pipelines.py``): per batch of ``b`` images, its text encoder
calls at batch ``b``, its denoiser (UNet, or SD 3's transformer) calls at batch ``2b`` (classifier-free guidance)
and one VAE decode at batch ``b``, summed with :func:`dippm_nas.sum_stages`. The scheduler step and guidance
arithmetic between denoiser calls (a few element-wise kernels per step), tokenisation and the copy of the images to
the host are not modelled.

Leave one model out: for each model, the H100 timing constants (compute and memory efficiency of the Hopper
prior, and a multiplier of the host times: the measuring machine's eager dispatch) and the power shares are
fitted on the other models' rows, then that model's rows are predicted. The matmul efficiency is kept at
``--matmul-abs`` (0.7956: the ``"*"`` compute scale times the multiplier ``benchmarks/accuracy/prior_vidur_gemms.py
--fit-class matmul --fit-device h100-sxm5-80gb`` fits on Vidur's H100 GEMMs). Variants: ``package`` predicts
with the shipped host constants (what ``dippm_nas.predict`` answers), ``host-fitted`` with the fitted host
multiplier, ``host-shipped`` fits and predicts without it. Reported: batch-latency and per-image-energy MAPE,
±2σ coverage (σ: the RMS held-out log error), and the fall of energy per image from batch 1 to 16.

``--write-power`` fits the power shares on every row and writes ``power.json``: ``hopper`` with σ from the
held-out error of the ``package`` variant, and a ``default`` for architectures without data (the same shares,
σ widened by the error the unfitted shares made on these rows). ``--write-fitted`` writes the Hopper device
scales fitted on every row into a constants file (only the ``devices`` entries of the Hopper boards change; the
host multiplier is never written).

Needs diffusers and transformers to rebuild the pipelines: ``pip install -e ".[bench-t2i]"``.

Capture: each (model, batch) component is captured once and kept in the conversion cache (1-60 s each on 2
shared CPU cores; the first run captures the 140 graphs of the six pipelines in about 30 min, a rerun loads them
in under a minute; fitting and scoring the three variants takes about 5 min).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _t2i_pipelines as t2i  # noqa: E402

_FILE = "mlenergy_v2_h100_energy_latency.csv"
DEVICE = "h100-sxm5-80gb"
#: Hopper boards that take the H100 SXM5 fit (the same GH100 chip; efficiencies relative to each board's own peaks).
HOPPER_SIBLINGS = ("h100-pcie-80gb", "h200-sxm-141gb")
DATA_SOURCE = "ML.ENERGY leaderboard v2 text-to-image on H100 80GB HBM3 (ml-energy/leaderboard-v2 @c3af7f31, Apache-2.0)"


@dataclasses.dataclass
class Row:
    """One measured (model, batch) of the file and its rebuilt pipeline."""

    name: str            # config name
    batch: int
    energy_per_image_j: float
    batch_latency_s: float
    graphs: list[Any]    # one per component
    calls: list[int]


#: The ``GPU`` column of the rows scored: the H100 (the file's other GPUs are never read).
GPU = "NVIDIA H100 80GB HBM3"
#: The denoising steps the configs' ``unet_calls`` are written for.
STEPS = 25


def read_rows(data: Path, names: list[str] | None = None) -> list[dict[str, str]]:
    """The file's H100 text-to-image rows at 25 steps of the named pipelines (``None``: every pipeline with a
    config), as the file's columns plus ``"pipeline"`` (the config name); rows of other GPUs, tasks and step
    counts are skipped unread."""
    path = data / _FILE if data.is_dir() else data
    by_model = {v: k for k, v in t2i.MODEL_OF.items()}
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("GPU") != GPU or r["task"] != "diffusion/text-to-image" or r["Model"] not in by_model:
                continue
            name = by_model[r["Model"]]
            if (names is not None and name not in names) or int(float(r["Denoising steps"])) != STEPS:
                continue
            out.append({**r, "pipeline": name})
    return out


def load_rows(data: Path, names: list[str] | None = None) -> list[tuple[str, int, float, float]]:
    """``(pipeline, batch, energy per image J, batch latency s)`` of :func:`read_rows`, sorted."""
    return sorted((r["pipeline"], int(float(r["Batch size"])), float(r["Energy/image (J)"]),
                   float(r["Batch latency (s)"])) for r in read_rows(data, names))


def capture_rows(raw: list[tuple[str, int, float, float]]) -> list[Row]:
    """Each ``(pipeline, batch, energy, latency)`` with its rebuilt pipeline's component graphs, captured through
    the conversion cache (``_t2i_pipelines.capture_component``; needs diffusers and transformers)."""
    rows: list[Row] = []
    for name in sorted({r[0] for r in raw}):
        cfg = t2i.load_config(name)
        comps = t2i.components(cfg)
        for n, b, e, lat in (r for r in raw if r[0] == name):
            graphs = [t2i.capture_component(cfg, c, b) for c in comps]
            rows.append(Row(name, b, e, lat, graphs, [c.calls for c in comps]))
    return rows


def predict_row(row: Row, params: Any, *, power: Any = None, deployment: Any = None) -> Any:
    """One batch of ``row``'s pipeline on the H100: each component through :func:`dippm_nas.prior.predict`
    (``params``, ``power``, ``deployment`` passed on; no MIG advice), summed over its calls with
    :func:`dippm_nas.sum_stages` (a :class:`~dippm_nas.StagesPrediction`: ``latency_ms``, ``energy_j`` of the
    batch and their σ)."""
    from dippm_nas.prior import predict
    from dippm_nas.stages import sum_stages

    preds = [predict(g, DEVICE, params=params, power=power, deployment=deployment, mig=False) for g in row.graphs]
    return sum_stages(list(zip(preds, row.calls)))


# ------------------------------------------------------------------------------------------ timing

def hopper_params(base: Any, compute: float, memory: float, matmul_abs: float | None, host: float = 1.0,
                  source: str = "") -> Any:
    """``base`` with the Hopper boards' device scale set to (compute, memory); the matmul class multiplier keeps
    the matmul efficiency at ``matmul_abs`` (device compute x class multiplier; ``None``: no class multiplier).
    ``host`` multiplies the host's dispatch, launch and view times (1: the shipped host constants)."""
    from dippm_nas.prior import DeviceScale

    classes = {} if matmul_abs is None else {"matmul": float(np.clip(matmul_abs / compute, 0.05, 20.0))}
    sc = DeviceScale(compute=compute, memory=memory, source=source, classes=classes)
    scales = dict(base.device_scales)
    for d in (DEVICE, *HOPPER_SIBLINGS):
        scales[d] = sc
    changes: dict[str, Any] = {"host_dispatch_us": base.host_dispatch_us * host,
                               "host_launch_us": base.host_launch_us * host, "host_view_us": base.host_view_us * host}
    hm = getattr(base, "host_model", None)
    if hm is not None:  # constants with a fitted host model (per-operator-kind times): scaled the same way
        changes["host_model"] = dataclasses.replace(hm, op_us={k: v * host for k, v in hm.op_us.items()},
                                                    launch_us=hm.launch_us * host, iteration_us=hm.iteration_us * host)
    return dataclasses.replace(base, device_scales=scales, **changes)


def row_latency_s(row: Row, params: Any) -> float:
    from dippm_nas.prior import estimate

    return sum(n * estimate(g, DEVICE, params=params).latency_ms for g, n in zip(row.graphs, row.calls)) / 1e3


def fit_timing(rows: list[Row], base: Any, matmul_abs: float | None, start: tuple[float, float],
               fit_host: bool) -> tuple[float, float, float, float | None]:
    """(compute, memory, host, matmul) minimising the mean absolute log error of the batch latency. ``host``
    stays 1 unless ``fit_host``; ``matmul`` (the matmul efficiency, device compute x class multiplier) is fitted
    when ``matmul_abs`` is ``None``, else kept."""
    from scipy.optimize import minimize

    y = np.log([r.batch_latency_s for r in rows])
    # beyond 1 / (smallest eta_memory) the memory scale changes nothing: a GPU cannot beat its bandwidth
    m_max = 1.0 / min(p.eta_memory for p in base.op_classes.values())
    fit_mm = matmul_abs is None

    def unpack(x: np.ndarray) -> tuple[float, float, float, float | None]:
        c, m = float(np.clip(math.exp(x[0]), 0.05, 20.0)), float(np.clip(math.exp(x[1]), 0.05, m_max))
        h = float(np.clip(math.exp(x[2]), 0.1, 20.0)) if fit_host else 1.0
        mm = float(np.clip(math.exp(x[-1]), 0.05, 20.0)) if fit_mm else matmul_abs
        return c, m, h, mm

    def loss(x: np.ndarray) -> float:
        c, m, h, mm = unpack(x)
        p = hopper_params(base, c, m, mm, h)
        return float(np.mean(np.abs(np.log([row_latency_s(r, p) for r in rows]) - y)))

    best = None
    # the loss is flat in the host multiplier while no row is host-bound: start from several host speeds
    for h0 in ((1.0, 2.0, 3.0) if fit_host else (None,)):
        x0 = list(start) + ([h0] if fit_host else []) + ([start[0]] if fit_mm else [])
        res = minimize(loss, np.log(x0), method="Nelder-Mead",
                       options={"xatol": 0.005, "fatol": 1e-5, "maxiter": 600})
        if best is None or res.fun < best.fun:
            best = res
    return unpack(best.x)


# ------------------------------------------------------------------------------------------ power

@dataclasses.dataclass
class PassArrays:
    gpu_us: np.ndarray
    activity: Any
    latency_us: float


def pass_arrays(graph: Any, params: Any) -> PassArrays:
    """What the power model needs of one pass: node times, unit activity, latency (public prior API)."""
    from dippm_nas.devices import get_device
    from dippm_nas.prior import estimate, node_activity, node_costs

    dev = get_device(DEVICE)
    est = estimate(graph, dev, params=params)
    costs = node_costs(graph, dev, params)
    nodes = graph.nodes
    flops = np.array([nd.flops for nd in nodes], dtype=np.float64)
    byts = np.array([nd.bytes_read + nd.bytes_written for nd in nodes], dtype=np.float64)
    half = np.array([nd.output_dtype in ("float16", "bfloat16") for nd in nodes])
    gpu_us = np.asarray(est.node_time_ms, dtype=np.float64) * 1e3
    return PassArrays(gpu_us=gpu_us, activity=node_activity(flops, byts, gpu_us, costs.tensor_core, half, dev),
                      latency_us=est.latency_ms * 1e3)


def row_energy_j(passes: list[PassArrays], calls: list[int], pw: Any) -> float:
    from dippm_nas.devices import get_device
    from dippm_nas.prior import pass_energy_j

    dev = get_device(DEVICE)
    return sum(n * pass_energy_j(pw, dev, p.gpu_us, p.activity, p.latency_us) for p, n in zip(passes, calls))


#: Fitted shares: busy, tensor, fp, dram, wait (all in [0, 3]).
_BOUNDS = (0.0, 3.0)


def fit_power(rows: list[Row], passes: dict[int, list[PassArrays]], start: Any) -> Any:
    """Power shares minimising the squared log error of the energy per batch (bounded least squares)."""
    from scipy.optimize import least_squares

    y = np.log([r.energy_per_image_j * r.batch for r in rows])

    def resid(x: np.ndarray) -> np.ndarray:
        pw = start.with_shares(x)
        return np.log([max(row_energy_j(passes[id(r)], r.calls, pw), 1e-9) for r in rows]) - y

    res = least_squares(resid, np.clip(start.shares(), *_BOUNDS), bounds=_BOUNDS, x_scale=0.2)
    return start.with_shares(res.x)


# ------------------------------------------------------------------------------------------ main

def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(pred) / np.asarray(true) - 1.0)) * 100.0)


def evaluate(rows: list[Row], base: Any, matmul_abs: float | None, start: tuple[float, float],
             fit_host: bool, predict_host: str = "fitted") -> tuple[dict[str, Any], Any]:
    """Leave one model out: timing (and power) fitted without the held-out model's rows, its rows predicted
    through :func:`dippm_nas.prior.predict` and :func:`dippm_nas.sum_stages`. Returns the scores and a function
    fitting on a set of rows.

    ``fit_host``: fit a multiplier of the host times with the device scales (else 1). ``predict_host``:
    ``"fitted"`` predicts with that multiplier, ``"shipped"`` with the shipped host constants (what the package
    computes with constants fitted that way)."""
    from dippm_nas.prior import PowerParams, PowerTable

    models = sorted({r.name for r in rows})
    variant = VARIANTS_OF[(fit_host, predict_host)]

    def fit_all(train: list[Row]) -> tuple[tuple[float, float, float, float | None], Any,
                                           dict[int, list[PassArrays]]]:
        c, m, h, mm = fit_timing(train, base, matmul_abs, start, fit_host)
        params = hopper_params(base, c, m, mm, h)
        passes = {id(r): [pass_arrays(g, params) for g in r.graphs] for r in rows}
        pw = fit_power(train, passes, PowerParams(fitted=True, sigma_log=0.0))
        return (c, m, h, mm), pw, passes

    folds: dict[str, Any] = {}
    pred_lat: dict[int, float] = {}
    pred_e: dict[int, float] = {}
    before_e: dict[int, float] = {}
    for held in models:
        train = [r for r in rows if r.name != held]
        (c, m, h, mm), pw, passes = fit_all(train)
        folds[held] = {"compute": c, "memory": m, "host": h, "matmul": mm, "power": dataclasses.asdict(pw)}
        params = hopper_params(base, c, m, mm, h if predict_host == "fitted" else 1.0)
        table = PowerTable(architectures={"hopper": pw})
        for r in rows:
            if r.name != held:
                continue
            total = predict_row(r, params, power=table)
            pred_lat[id(r)] = total.latency_ms / 1e3
            pred_e[id(r)] = float(total.energy_j) / r.batch  # type: ignore[arg-type]
            before_e[id(r)] = row_energy_j(passes[id(r)], r.calls, PowerParams()) / r.batch
        print(f"  [{variant}] held out {held}: compute x{c:.3f} memory "
              f"x{m:.3f} host x{h:.2f} matmul x{mm or 0:.3f}; shares " + " ".join(f"{k}={getattr(pw, k):.3f}" for k in
                                                        ("busy", "tensor", "fp", "dram", "wait")),
              file=sys.stderr, flush=True)

    lat_y = np.array([r.batch_latency_s for r in rows])
    e_y = np.array([r.energy_per_image_j for r in rows])
    lat_p = np.array([pred_lat[id(r)] for r in rows])
    e_p = np.array([pred_e[id(r)] for r in rows])
    e_b = np.array([before_e[id(r)] for r in rows])
    lat_log, e_log = np.log(lat_p / lat_y), np.log(e_p / e_y)
    sig_lat, sig_e = float(np.sqrt(np.mean(lat_log ** 2))), float(np.sqrt(np.mean(e_log ** 2)))
    sig_before = float(np.sqrt(np.mean(np.log(e_b / e_y) ** 2)))
    per_model = {}
    for name in models:
        sel = np.array([r.name == name for r in rows])
        idx = {r.batch: i for i, r in enumerate(rows) if r.name == name}
        trend = None
        if 1 in idx and 16 in idx:
            trend = {"measured_fall_pct": 100 * (1 - e_y[idx[16]] / e_y[idx[1]]),
                     "predicted_fall_pct": 100 * (1 - e_p[idx[16]] / e_p[idx[1]])}
        per_model[name] = {
            "rows": int(sel.sum()), "latency_mape_pct": mape(lat_p[sel], lat_y[sel]),
            "energy_mape_pct": mape(e_p[sel], e_y[sel]), "energy_mape_unfitted_shares_pct": mape(e_b[sel], e_y[sel]),
            "latency_median_ratio": float(np.median(lat_p[sel] / lat_y[sel])),
            "energy_median_ratio": float(np.median(e_p[sel] / e_y[sel])), "trend_b1_to_b16": trend,
            "by_batch": {int(b): {"latency_s": [float(lat_y[i]), float(lat_p[i])],
                                  "energy_per_image_j": [float(e_y[i]), float(e_p[i])]} for b, i in sorted(idx.items())},
        }
    result = {
        "variant": variant, "rows": len(rows), "models": models,
        "latency_mape_pct": mape(lat_p, lat_y), "energy_mape_pct": mape(e_p, e_y),
        "energy_mape_unfitted_shares_pct": mape(e_b, e_y),
        "latency_sigma_log": sig_lat, "energy_sigma_log": sig_e, "energy_sigma_log_unfitted_shares": sig_before,
        "latency_coverage_2sigma": float(np.mean(np.abs(lat_log) <= 2 * sig_lat)),
        "energy_coverage_2sigma": float(np.mean(np.abs(e_log) <= 2 * sig_e)),
        "per_model": per_model, "folds": folds,
    }
    return result, fit_all


#: (fit the host multiplier, host used to predict) -> variant name.
VARIANTS_OF = {(True, "shipped"): "package", (True, "fitted"): "host-fitted", (False, "shipped"): "host-shipped"}
VARIANT_TEXT = {
    "package": "as the package computes: constants fitted with the host times fitted, predicted with the shipped host",
    "host-fitted": "host times x a multiplier fitted on the other models (the measuring machine's eager dispatch)",
    "host-shipped": "everything fitted and predicted with the shipped host constants",
}


def print_result(res: dict[str, Any]) -> None:
    sig_lat, sig_e = res["latency_sigma_log"], res["energy_sigma_log"]
    print(f"{res['variant']}: {VARIANT_TEXT[res['variant']]}")
    print(f"  batch latency MAPE {res['latency_mape_pct']:.1f} %  (±2σ coverage "
          f"{100 * res['latency_coverage_2sigma']:.0f} %, σ_log {sig_lat:.3f})")
    print(f"  energy/image  MAPE {res['energy_mape_pct']:.1f} %  (±2σ coverage "
          f"{100 * res['energy_coverage_2sigma']:.0f} %, σ_log {sig_e:.3f}); with the unfitted shares "
          f"{res['energy_mape_unfitted_shares_pct']:.1f} %")
    print(f"  {'model':<30}{'rows':>5}{'lat MAPE':>10}{'E MAPE':>9}{'lat ratio':>11}{'E ratio':>9}"
          f"{'E/img fall b1->b16 meas / pred':>33}")
    for name, v in res["per_model"].items():
        tr = v["trend_b1_to_b16"]
        trs = f"{tr['measured_fall_pct']:5.1f} % / {tr['predicted_fall_pct']:5.1f} %" if tr else "-"
        print(f"  {name:<30}{v['rows']:>5}{v['latency_mape_pct']:>9.1f}%{v['energy_mape_pct']:>8.1f}%"
              f"{v['latency_median_ratio']:>11.3f}{v['energy_median_ratio']:>9.3f}{trs:>33}")
    print("  per batch (measured / predicted): batch latency s, energy per image J")
    for name, v in res["per_model"].items():
        print(f"    {name}: " + "; ".join(f"b{b} {x['latency_s'][0]:.2f}/{x['latency_s'][1]:.2f} s "
                                          f"{x['energy_per_image_j'][0]:.0f}/{x['energy_per_image_j'][1]:.0f} J"
                                          for b, x in v["by_batch"].items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help=f"folder holding {_FILE} (or the file)")
    ap.add_argument("--models", default=",".join(t2i.MODEL_OF), help=f"config names; choices: {','.join(t2i.MODEL_OF)}")
    ap.add_argument("--matmul-abs", default=None,
                    help="H100 matmul efficiency (device compute x matmul class multiplier) to keep: a number (the "
                         "product fitted on Vidur's H100 GEMMs: 0.7956), or 'fit' to fit it with the other timing "
                         "constants on the pipelines' latencies (worse held out: 12.5 against 7.7 %% batch latency "
                         "MAPE with the host fitted); default: the shipped h100-sxm5-80gb entry's product")
    ap.add_argument("--variants", default="package,host-fitted,host-shipped",
                    help="comma list of package (constants fitted with a host multiplier, predicted with the shipped "
                         "host: what the package computes), host-fitted (predicted with that multiplier too: the "
                         "measuring machine's host speed, never written), host-shipped (fitted and predicted with "
                         "the shipped host)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--write-power", type=Path, help="write the power shares fitted on every row (power.json)")
    ap.add_argument("--write-fitted", type=Path, help="write the Hopper device scales fitted on every row into this "
                    "constants file (fitted.json format)")
    ap.add_argument("--write-from", choices=("host-fitted", "host-shipped"), default="host-fitted",
                    help="fit the written constants with the host multiplier fitted (default) or as shipped; the "
                         "multiplier itself is never written")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    bad = sorted(set(names) - set(t2i.MODEL_OF))
    if bad:
        ap.error(f"unknown models {bad}; choices: {sorted(t2i.MODEL_OF)}")

    from dippm_nas.devices import get_device
    from dippm_nas.prior import PowerTable, default_params

    t0 = time.time()
    raw = load_rows(args.data, names)
    if not raw:
        print(f"no text-to-image rows for {names} in {args.data}", file=sys.stderr)
        return 2
    rows = capture_rows(raw)
    t_capture = time.time() - t0
    base = default_params()
    sc0 = base.scale_for(DEVICE)
    if args.matmul_abs is None:
        if "matmul" not in sc0.classes:
            ap.error(f"the shipped {DEVICE} entry has no matmul multiplier: give --matmul-abs (a number or 'fit')")
        matmul_abs: float | None = sc0.compute * sc0.classes["matmul"]
    else:
        matmul_abs = None if args.matmul_abs == "fit" else float(args.matmul_abs)
    # every fit starts from the scale of GPUs without an entry, whatever the file says of the Hopper boards
    star = base.device_scales.get("*", sc0)
    start = (star.compute, star.memory)
    wanted = [v for v in args.variants.split(",") if v]
    by_name = {v: k for k, v in VARIANTS_OF.items()}
    bad = sorted(set(wanted) - set(by_name))
    if bad:
        ap.error(f"unknown variants {bad}; choices: {sorted(by_name)}")
    results, fitters = {}, {}
    for v in wanted:
        res, fit_all = evaluate(rows, base, matmul_abs, start, *by_name[v])
        results[v], fitters[v] = res, fit_all
    out: dict[str, Any] = {"device": DEVICE, "rows": len(rows), "matmul_abs": matmul_abs, "variants": results,
                           "capture_s": t_capture}

    if args.write_power or args.write_fitted:
        if args.write_from not in fitters:
            ap.error(f"--write-from {args.write_from} needs it among --variants")
        res = results[args.write_from]
        (c, m, h, mm), pw, passes = fitters[args.write_from](rows)
        out["all_rows"] = {"compute": c, "memory": m, "host": h, "matmul": mm, "power": dataclasses.asdict(pw)}
        cmd = " ".join(["python benchmarks/accuracy/accuracy_energy.py", *(argv if argv is not None else sys.argv[1:])])
        if args.write_power:
            # σ: the held-out error of what the package computes (the shipped host), where it was scored
            scored = results.get("package", res)
            sig_e, sig_before = scored["energy_sigma_log"], scored["energy_sigma_log_unfitted_shares"]
            src = (f"{DATA_SOURCE}: {len(rows)} rows of {len(res['models'])} pipelines, host times "
                   f"{'fitted (x' + format(h, '.2f') + ')' if h != 1.0 else 'as shipped'}")
            pw = pw.with_shares(np.round(pw.shares(), 4))  # 4 decimals: far below the fit's error
            hop = dataclasses.replace(pw, sigma_log=round(sig_e, 4), fitted=True, source=src)
            dflt = dataclasses.replace(hop, sigma_log=round(math.hypot(sig_e, sig_before), 4), fitted=False,
                                       source="the hopper shares, for architectures without energy data; σ widened "
                                              "(in quadrature) by the error the unfitted shares made on the hopper rows")
            keys = ("variant", "rows", "models", "latency_mape_pct", "energy_mape_pct", "energy_mape_unfitted_shares_pct",
                    "energy_sigma_log", "energy_sigma_log_unfitted_shares", "latency_coverage_2sigma",
                    "energy_coverage_2sigma")
            metrics = {"held_out": "leave one model out", "fitted_host_multiplier": h,
                       "variants": {v: {k: r[k] for k in keys} for v, r in results.items()}}
            PowerTable(architectures={"hopper": hop}, default=dflt, source=DATA_SOURCE, command=cmd,
                       metrics=metrics).save(args.write_power)
            print(f"wrote {args.write_power}", file=sys.stderr)
        if args.write_fitted:
            write_hopper_entries(args.write_fitted, c, m, mm, results, cmd, fitted_matmul=matmul_abs is None)
            print(f"wrote the Hopper entries of {args.write_fitted}", file=sys.stderr)
    out["seconds"] = time.time() - t0

    if args.json:
        print(json.dumps(out))
        return 0
    dev = get_device(DEVICE)
    print(f"{DEVICE} ({dev.name}), {len(rows)} rows of {len(set(r.name for r in rows))} text-to-image pipelines "
          f"(ML.ENERGY v2), leave one model out")
    for res in results.values():
        print_result(res)
    print(f"capture {t_capture:.0f} s, total {out['seconds']:.0f} s")
    return 0


def write_hopper_entries(path: Path, compute: float, memory: float, matmul_abs: float | None,
                         results: dict[str, dict], command: str, *, fitted_matmul: bool) -> None:
    """Set the Hopper boards' ``devices`` entries of a constants file; nothing else in the file changes."""
    from dippm_nas.prior import PriorParams

    blob = json.loads(Path(path).read_text())
    any_res = next(iter(results.values()))
    scores = "; ".join(f"{VARIANT_TEXT[v].split(':')[0]}: {r['latency_mape_pct']:.1f} %" for v, r in results.items())
    m_max = 1.0 / min(float(p["eta_memory"]) for p in blob["op_classes"].values())
    for dev in (DEVICE, *HOPPER_SIBLINGS):
        src = (f"{DATA_SOURCE} batch latencies of {any_res['rows']} rows ({len(any_res['models'])} pipelines), fitted "
               f"with the measuring machine's host times (a multiplier fitted alongside, not written); leave-one-model-out "
               f"batch latency MAPE by variant: {scores}")
        if memory >= m_max * 0.999:
            src += "; memory at the scale's ceiling: memory-bound kernels reach the full bandwidth"
        if dev != DEVICE:
            src += f" (as {DEVICE}: same GH100 chip, efficiencies relative to this board's own peaks)"
        classes = {}
        if matmul_abs is not None:
            classes["matmul"] = float(np.clip(matmul_abs / compute, 0.05, 20.0))
            src += (f"; matmul efficiency x{matmul_abs:.4f} overall (device compute x this class multiplier), "
                    + ("fitted with the other constants on the same latencies" if fitted_matmul else
                       "kept at the value given (--matmul-abs)"))
        blob["devices"][dev] = {"compute": compute, "memory": memory, "source": f"{src}: {command}",
                                "classes": classes, "dispatch_us": None}
    PriorParams.from_dict(blob, origin=str(path))  # still a valid constants file
    from dippm_nas.errors import InvalidValueError
    from dippm_nas.files import write_output

    write_output(path, json.dumps(blob, indent=1) + "\n", "output file", error=InvalidValueError)


if __name__ == "__main__":
    sys.exit(main())
