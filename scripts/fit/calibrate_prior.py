#!/usr/bin/env python
"""Calibrate the analytic prior against public measurements and print the figures before and after.

Sections (``--sections``, default all that can run):

``neusight``  NeuSight A100 operator microbenchmarks (PyTorch 2.1, fp32, isolated ops): per op class,
              fit the CUDA-core efficiency, the memory efficiency, the wave-quantisation weight and the
              isolated-op floor. Reported per op class on a held-out split.
``anb``       Accel-NASBench MnasNet-space nets on A100-40GB and RTX 3090: every row's net is rebuilt with
              ``search_spaces`` (``mbconv``), captured at 256x256, batch 256, float16 (the model is cast:
              the closest InputSpec to FP16 autocast) and predicted with channels_last=True, as measured.
              Measured per-batch latency = 256 / throughput (the rows' batch is 256 or 128, not recorded:
              at these batch sizes the per-image time changes little, and the 256 assumption is stated in
              the output). Fits the tensor-core efficiencies and depthwise constants on a training split.
``memory``    a check (not a fit) of the memory prior against the three NVML figures DIPPM reports.
``timm``      timm ``benchmark-infer`` rows (AMP, eager) on RTX 3090/4090/5090: per-batch step time at the
              row's image size and batch, NCHW or NHWC as recorded. Needs timm (run in a venv with
              timm installed, e.g. /work/venv-vision with PYTHONPATH=/work/main).

Whole-model splits are deterministic (a hash of the architecture), fitting is on the training split and
every figure printed "after" is on the held-out split. Nothing of the data is written; ``--out`` writes the
fitted constants (JSON) naming the data sources and the command line.

``--base FILE`` refits only the per-GPU (compute, memory) multipliers of an existing calibration file on the same
whole-model rows (:func:`fit_device_scales`), every other constant of the file kept (shared knobs, class
multipliers, the SDPA / resize / host constants and the entries of GPUs without rows), the default entries ``"*"``
and ``"*geforce"`` derived again from the refitted GPUs; "before" is then the file as given. It is how the shipped
multipliers are brought up to a changed kernel rule without refitting what other scripts wrote into the file.

Machine: whatever runs it; capture dominates the time (about 1-10 s per net on 2 CPU cores), so whole-model
sections use a deterministic subsample (``--anb-nets``, ``--timm-models``) and say so.

Usage::

    python scripts/fit/calibrate_prior.py --data ../shared/data --sections neusight
    PYTHONPATH=. /work/venv-vision/bin/python scripts/fit/calibrate_prior.py --data ../shared/data \
        --anb-nets 120 --timm-models 60 --out dippm_nas/prior/calibration/fitted.json
    PYTHONPATH=. /work/venv-vision/bin/python scripts/fit/calibrate_prior.py --data ../shared/data \
        --sections anb,timm --anb-nets 160 --timm-models 60 --base dippm_nas/prior/calibration/fitted.json \
        --out refit.json
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import math
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from dippm_nas.devices import get_device
from dippm_nas.prior import DeploymentSettings, PriorParams, estimate, kernel_time_us
from dippm_nas.prior import OpClassParams, default_scale_entries
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import write_output

# ----------------------------------------------------------------------------------------- metrics


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean absolute percentage error, %."""
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(pred - true) / true) * 100.0)


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b (:func:`scipy.stats.kendalltau`); NaN below two points."""
    if len(x) < 2:
        return float("nan")
    return float(kendalltau(np.asarray(x, float), np.asarray(y, float)).statistic)


def held_out(key: str, fraction: float = 0.25) -> bool:
    """Deterministic split: True for the held-out part (hash of the key)."""
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return (h % 10_000) < fraction * 10_000


# ----------------------------------------------------------------------------------------- NeuSight

#: NeuSight op name -> (prior op class, kind)
NEUSIGHT_OPS: dict[str, tuple[str, str]] = {
    "bmm": ("matmul", "bmm"), "linear": ("matmul", "linear"), "conv": ("conv", "conv"),
    "add": ("elementwise", "binary"), "mul": ("elementwise", "binary"), "div": ("elementwise", "binary"),
    "pow": ("elementwise", "binary"),
    "addu": ("elementwise", "unary"), "mulu": ("elementwise", "unary"), "divu": ("elementwise", "unary"),
    "powu": ("elementwise", "unary"),
    "relu": ("activation", "unary"), "gelu": ("activation", "unary"), "tanh": ("activation", "unary"),
    "softmax": ("softmax", "unary"), "ln": ("normalization", "ln"),
}
_FLOPS_PER_ELEM = {"add": 1, "mul": 1, "div": 1, "pow": 4, "addu": 1, "mulu": 1, "divu": 1, "powu": 4,
                   "relu": 1, "gelu": 8, "tanh": 4, "softmax": 5, "ln": 8}
_NEUSIGHT_DEVICES = {"NVIDIA A100-PCIE-40GB": "a100-pcie-40gb", "NVIDIA A100 80GB PCIe": "a100-pcie-80gb"}


@dataclasses.dataclass
class OpRows:
    """Work figures of microbenchmark rows of one op class (arrays aligned)."""

    cls: str
    flops: np.ndarray
    bytes: np.ndarray
    tiles: np.ndarray
    tile_eff: np.ndarray
    red_k: np.ndarray
    sms: np.ndarray
    peak_tflops: np.ndarray
    bandwidth_gbps: np.ndarray
    latency_us: np.ndarray
    test: np.ndarray
    op: list[str]


def load_neusight(path: Path) -> dict[str, OpRows]:
    """Rows of ``neusight_a100_op_microbench.csv`` as work figures per prior op class (fp32, 4-byte elements)."""
    acc: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    skipped: dict[str, int] = defaultdict(int)
    devices = {k: get_device(v) for k, v in _NEUSIGHT_DEVICES.items()}
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            name = row["OPName"]
            if name not in NEUSIGHT_OPS or row["Device"] not in devices:
                skipped[f"{name}@{row['Device']}"] += 1
                continue
            cls, kind = NEUSIGHT_OPS[name]
            dev = devices[row["Device"]]
            g = lambda k: float(row[k]) if row[k] not in ("", None) else 0.0  # noqa: E731
            if kind in ("bmm", "linear"):
                b = g("B") or 1.0
                m, n, k = g("M"), g("N"), g("K")
                flops = 2 * b * m * n * k
                nbytes = 4 * b * (m * k + k * n + m * n) if kind == "bmm" else 4 * (m * k + k * n + m * n)
                tiles = math.ceil(m / 128) * math.ceil(n / 128) * b
                tile_eff = (m / (128 * math.ceil(m / 128))) * (n / (128 * math.ceil(n / 128)))
                red_k = k
            elif kind == "conv":
                b, cin, cout = g("B"), g("Input_Channel"), g("Output_Channel")
                ks, hw, s, pad = g("Kernel_Szie"), g("Input_Size"), g("Stride") or 1, g("Padding")
                ho = math.floor((hw + 2 * pad - ks) / s) + 1
                flops = 2 * b * cout * ho * ho * cin * ks * ks
                nbytes = 4 * (b * cin * hw * hw + cout * cin * ks * ks + b * cout * ho * ho)
                gm = b * ho * ho
                tiles = math.ceil(gm / 128) * math.ceil(cout / 128)
                tile_eff = (gm / (128 * math.ceil(gm / 128))) * (cout / (128 * math.ceil(cout / 128)))
                red_k = cin * ks * ks
            else:
                b, h = g("B"), g("H")
                elems = b * h
                flops = _FLOPS_PER_ELEM[name] * elems
                if kind == "binary":
                    nbytes = 12 * elems
                elif kind == "ln":
                    nbytes = 8 * elems + 8 * h
                else:
                    nbytes = 8 * elems
                tiles = 1
                tile_eff = 1.0
                red_k = 1.0
            d = acc[cls]
            d["flops"].append(flops)
            d["bytes"].append(nbytes)
            d["tiles"].append(tiles)
            d["tile_eff"].append(tile_eff)
            d["red_k"].append(red_k)
            d["sms"].append(dev.sms)
            d["peak"].append(dev.fp32_tflops)  # fp32 CUDA cores: NeuSight's kernels are sgemm/scudnn (no TF32)
            d["bw"].append(dev.bandwidth_gbps)
            d["lat"].append(float(row["Latency"]) * 1e3)
            d["test"].append(held_out(f"neusight:{i}"))
            d["op"].append(name)
    if skipped:
        print(f"  neusight: rows not used (op or device outside the map): {dict(skipped)}")
    return {
        cls: OpRows(cls, np.array(d["flops"]), np.array(d["bytes"]), np.array(d["tiles"]), np.array(d["tile_eff"]),
                    np.array(d["red_k"]), np.array(d["sms"]),
                    np.array(d["peak"]), np.array(d["bw"]), np.array(d["lat"]), np.array(d["test"], bool), d["op"])
        for cls, d in acc.items()
    }


def isolated_op_us(rows: OpRows, p: OpClassParams, floor_us: float, sel: np.ndarray | None = None) -> np.ndarray:
    """Prior time of isolated ops: a floor (host dispatch + launch + event overhead) plus the kernel."""
    s = slice(None) if sel is None else sel
    wave = rows.tiles[s] / (np.ceil(rows.tiles[s] / rows.sms[s]) * rows.sms[s])
    t, _, _ = kernel_time_us(rows.flops[s], rows.bytes[s], peak_tflops=rows.peak_tflops[s],
                             bandwidth_gbps=rows.bandwidth_gbps[s], eta_compute=p.eta_compute, eta_memory=p.eta_memory,
                             kernel_us=p.kernel_us, kernels=p.kernels, wave_eff=wave, wave_exponent=p.wave_exponent,
                             tile_eff=rows.tile_eff[s], tile_exponent=p.tile_exponent, reduction_k=rows.red_k[s],
                             k_half=p.k_half)
    return floor_us + t


def fit_isolated(rows: OpRows, start: OpClassParams, floor0: float, *, contraction: bool,
                 steps: int = 800) -> tuple[OpClassParams, float]:
    """Fit eta_compute, eta_memory, the wave and tile exponents and the isolated floor on the training
    rows: least squares in log time (Adam, torch), exponents kept in [0, 1] by a sigmoid."""
    import torch

    tr = ~rows.test
    t = lambda a: torch.tensor(a[tr], dtype=torch.float64)  # noqa: E731
    f, b, tiles, sms, teff = t(rows.flops), t(rows.bytes), t(rows.tiles), t(rows.sms), t(rows.tile_eff)
    rk = t(rows.red_k)
    peak, bw = t(rows.peak_tflops) * 1e12, t(rows.bandwidth_gbps) * 1e9
    wave = tiles / (torch.ceil(tiles / sms) * sms)
    y = torch.log(t(rows.latency_us))
    var = lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True)  # noqa: E731
    best: tuple[float, OpClassParams, float] | None = None
    # a few starting points for the two exponents (the loss is not convex in them); keep the best fit
    for w0, t0 in ([(0.0, 0.0), (-3.0, -3.0), (3.0, 3.0)] if contraction else [(0.0, 0.0)]):
        torch.manual_seed(0)
        # eta_memory = sigmoid(z) stays in (0, 1) with a gradient everywhere (a clamp at 1 has none at the bound)
        le_c, le_m = var(math.log(start.eta_compute)), var(math.log(0.9 / 0.1))
        lfloor = var(math.log(floor0 + start.kernel_us * start.kernels))
        wx, tx, lk = var(w0), var(t0), var(math.log(8.0))
        # contraction classes keep eta_memory: in isolated-op data it only trades off against the floor
        opt = torch.optim.Adam([le_c, lfloor] + ([wx, tx, lk] if contraction else [le_m]), lr=0.05)

        def model() -> tuple[torch.Tensor, ...]:
            eta_c = torch.exp(le_c).clamp(max=4.0)
            eta_m = torch.sigmoid(le_m) if not contraction else torch.tensor(start.eta_memory, dtype=torch.float64)
            w = torch.sigmoid(wx) if contraction else torch.zeros((), dtype=torch.float64)
            te = torch.sigmoid(tx) if contraction else torch.zeros((), dtype=torch.float64)
            kh = torch.exp(lk) if contraction else torch.zeros((), dtype=torch.float64)
            comp = f / (peak * eta_c * wave ** w * teff ** te * rk / (rk + kh)) * 1e6
            mem = b / (bw * eta_m) * 1e6
            return torch.exp(lfloor) + torch.maximum(comp, mem), eta_c, eta_m, w, te, kh

        for _ in range(steps):
            opt.zero_grad()
            loss = torch.mean((torch.log(model()[0]) - y) ** 2)
            loss.backward()
            opt.step()
        with torch.no_grad():
            pred, eta_c, eta_m, w, te, kh = model()
            final = float(torch.mean((torch.log(pred) - y) ** 2))
        fitted = dataclasses.replace(start, eta_compute=float(eta_c), eta_memory=float(eta_m), wave_exponent=float(w),
                                     tile_exponent=float(te), k_half=float(kh), kernel_us=0.0)
        if best is None or final < best[0]:
            best = (final, fitted, float(torch.exp(lfloor).detach()))
    assert best is not None
    return best[1], best[2]


def run_neusight(data: Path, base: PriorParams) -> tuple[PriorParams, dict[str, Any]]:
    path = data / "neusight_a100_op_microbench.csv"
    print(f"\n== NeuSight A100 operator microbenchmarks ({path.name}; PyTorch 2.1, fp32, isolated ops)")
    by_cls = load_neusight(path)
    floor_before = base.host_dispatch_us + base.host_launch_us  # what the prior adds to a lone op
    print(f"  before = uncalibrated prior for a one-op graph: {floor_before:.0f} us host floor + kernel "
          f"({base.op_classes['elementwise'].kernel_us:.0f} us) + roofline at efficiency 1")
    print(f"  {'op class':<14}{'rows':>7}{'test':>6}{'MAPE before':>13}{'MAPE after':>12}{'tau before':>12}{'tau after':>11}"
          f"   fitted (eta_c, eta_m, wave_exp, tile_exp, k_half, floor_us)")
    params = base
    metrics: dict[str, Any] = {}
    for cls in ("matmul", "conv", "elementwise", "activation", "softmax", "normalization"):
        rows = by_cls.get(cls)
        if rows is None:
            continue
        start = base.op_classes[cls]
        te = rows.test
        before = isolated_op_us(rows, start, floor_before, te)
        fitted, floor = fit_isolated(rows, start, floor_before, contraction=cls in ("matmul", "conv"))
        after = isolated_op_us(rows, fitted, floor, te)
        y = rows.latency_us[te]
        m = {"rows": int(len(rows.latency_us)), "test_rows": int(te.sum()),
             "mape_before": mape(before, y), "mape_after": mape(after, y),
             "tau_before": kendall_tau(before, y), "tau_after": kendall_tau(after, y),
             "eta_compute": fitted.eta_compute, "eta_memory": fitted.eta_memory,
             "wave_exponent": fitted.wave_exponent, "tile_exponent": fitted.tile_exponent, "k_half": fitted.k_half,
             "isolated_floor_us": floor}
        metrics[cls] = m
        print(f"  {cls:<14}{m['rows']:>7}{m['test_rows']:>6}{m['mape_before']:>12.1f}%{m['mape_after']:>11.1f}%"
              f"{m['tau_before']:>12.3f}{m['tau_after']:>11.3f}   ({fitted.eta_compute:.3f}, {fitted.eta_memory:.3f}, "
              f"{fitted.wave_exponent:.2f}, {fitted.tile_exponent:.2f}, {fitted.k_half:.1f}, {floor:.1f})")
        # keep the fitted efficiencies; the in-graph kernel cost stays the prior's (the isolated floor
        # includes host dispatch and event overhead, which the graph timelines model separately)
        params = params.with_class(cls, eta_compute=fitted.eta_compute, eta_memory=fitted.eta_memory,
                                   wave_exponent=fitted.wave_exponent, tile_exponent=fitted.tile_exponent,
                                   k_half=fitted.k_half)
    # classes NeuSight does not cover share the memory efficiency of the element-wise ops
    em = params.op_classes["elementwise"].eta_memory
    for cls in ("pool", "reduction", "memory", "gather", "cast", "unknown", "conv_depthwise"):
        params = params.with_class(cls, eta_memory=em)
    return params, metrics


# ----------------------------------------------------------------------------------------- graphs


def graph_cache_dir() -> Path:
    from dippm_nas.cache import cache_dir

    return cache_dir() / "calibration-graphs"


def cached_capture(key: str, build: Callable[[], Any], spec: Any) -> Any:
    """Capture once per (key, spec) and keep the graph as JSON under the user cache dir."""
    from dippm_nas import capture
    from dippm_nas.graph import OperatorGraph

    d = graph_cache_dir()
    h = hashlib.sha256(json.dumps([key, spec.to_dict()], sort_keys=True).encode()).hexdigest()[:24]
    path = d / f"{h}.json"
    if path.is_file():
        return OperatorGraph.from_json(path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(build(), spec, cache=False)
    d.mkdir(parents=True, exist_ok=True)
    write_output(path, g.to_json(), "output file", error=InvalidValueError)
    return g


@dataclasses.dataclass
class WholeModel:
    """One measured whole-model latency and its graph."""

    key: str
    source: str
    device: str
    graph: Any
    measured_ms: float
    channels_last: bool
    test: bool


def nelder_mead(fn: Callable[[np.ndarray], float], x0: np.ndarray, *, step: float = 0.3, iters: int = 160) -> np.ndarray:
    """Minimise ``fn`` (derivative-free, the simplex method)."""
    n = len(x0)
    pts = [x0.astype(float)] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [fn(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = fn(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - pts[-1])
            fe = fn(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid)
            fc = fn(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [fn(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


#: Shared whole-model constants fitted on the training split: (class or "*all*", field, lower, upper).
SHARED_KNOBS: tuple[tuple[str, str, float, float], ...] = (
    ("conv", "eta_compute_tensor", 0.05, 1.0),
    ("conv", "k_half", 0.5, 4096.0),
    ("matmul", "eta_compute_tensor", 0.05, 1.0),
    ("conv_depthwise", "eta_compute", 0.05, 4.0),
    ("conv_depthwise", "eta_memory", 0.05, 1.0),
    ("*all*", "kernel_us", 0.2, 50.0),
    ("*global*", "nchw_transpose_passes", 0.01, 6.0),
    ("*global*", "l2_speedup", 1.0, 10.0),
)
#: Per-device multipliers fitted for every device with measurements: (field, lower, upper).
DEVICE_KNOBS: tuple[tuple[str, float, float], ...] = (("compute", 0.05, 20.0), ("memory", 0.05, 20.0))


#: Catalogue devices a fitted device's scale also applies to (same chip, peaks and bandwidth): the
#: Accel-NASBench "A100 40GB" is SXM4 or PCIe, unrecorded.
SCALE_SIBLINGS = {"a100-sxm4-40gb": ("a100-pcie-40gb",)}


def apply_knobs(base: PriorParams, x: np.ndarray, devices: Sequence[str],
                sources: dict[str, str] | None = None) -> PriorParams:
    """Constants from a knob vector: shared knobs first, then (compute, memory) log-multipliers per device.
    Devices without measurements get the geometric mean of the fitted ones (entry ``"*"``), GeForce GPUs that of
    the fitted GeForce ones (``"*geforce"``, :func:`dippm_nas.prior.default_scale_entries`)."""
    from dippm_nas.prior import DeviceScale

    p = base
    k = len(SHARED_KNOBS)
    for (cls, name, lo, hi), v in zip(SHARED_KNOBS, x[:k]):
        value = float(np.clip(math.exp(v), lo, hi))
        if cls == "*all*":
            for c in p.op_classes:
                p = p.with_class(c, **{name: value})
        elif cls == "*global*":
            p = dataclasses.replace(p, **{name: value})
        else:
            p = p.with_class(cls, **{name: value})
    scales = {}
    logs = np.asarray(x[k:]).reshape(len(devices), len(DEVICE_KNOBS)) if devices else np.zeros((0, 2))
    for dev, row in zip(devices, logs):
        vals = [float(np.clip(math.exp(v), lo, hi)) for (_, lo, hi), v in zip(DEVICE_KNOBS, row)]
        src = (sources or {}).get(dev, "")
        scales[dev] = DeviceScale(compute=vals[0], memory=vals[1], source=src)
        for sib in SCALE_SIBLINGS.get(dev, ()):
            scales[sib] = DeviceScale(compute=vals[0], memory=vals[1], source=f"{src} (as {dev}: variant unrecorded)")
    if devices:
        scales.update(default_scale_entries(scales, devices))
    return dataclasses.replace(p, device_scales=scales)


def knobs_start(base: PriorParams, devices: Sequence[str]) -> np.ndarray:
    out = []
    for cls, name, _, _ in SHARED_KNOBS:
        if cls == "*global*":
            out.append(math.log(max(getattr(base, name), 0.01)) + (0.5 if name == "l2_speedup" else 0.0))
        elif name == "k_half":
            out.append(math.log(max(getattr(base.op_classes[cls], name), 1.0)))
        else:
            out.append(math.log(getattr(base.op_classes["conv" if cls == "*all*" else cls], name)))
    return np.array(out + [0.0] * (len(DEVICE_KNOBS) * len(devices)))


def predict_all(items: Sequence[WholeModel], params: PriorParams) -> np.ndarray:
    return np.array([estimate(w.graph, w.device, deployment=DeploymentSettings(channels_last=w.channels_last),
                              params=params).latency_ms
                     for w in items])


def report(items: Sequence[WholeModel], before: PriorParams, after: PriorParams, title: str) -> dict[str, Any]:
    """Print MAPE and Kendall tau per (source, device) on the held-out items, before and after."""
    groups: dict[tuple[str, str], list[WholeModel]] = defaultdict(list)
    for w in items:
        if w.test:
            groups[(w.source, w.device)].append(w)
    print(f"  {title}: held-out figures")
    print(f"  {'source':<26}{'device':<16}{'nets':>5}{'MAPE before':>13}{'MAPE after':>12}{'tau before':>12}{'tau after':>11}")
    out: dict[str, Any] = {}
    for (src, dev), ws in sorted(groups.items()):
        y = np.array([w.measured_ms for w in ws])
        pb, pa = predict_all(ws, before), predict_all(ws, after)
        m = {"nets": len(ws), "mape_before": mape(pb, y), "mape_after": mape(pa, y),
             "tau_before": kendall_tau(pb, y), "tau_after": kendall_tau(pa, y),
             "median_ratio_before": float(np.median(pb / y)), "median_ratio_after": float(np.median(pa / y))}
        out[f"{src}/{dev}"] = m
        print(f"  {src:<26}{dev:<16}{m['nets']:>5}{m['mape_before']:>12.1f}%{m['mape_after']:>11.1f}%"
              f"{m['tau_before']:>12.3f}{m['tau_after']:>11.3f}")
    return out


def fit_whole_models(items: Sequence[WholeModel], base: PriorParams) -> PriorParams:
    """Fit the shared and per-device knobs on the training split: mean absolute log error (robust to the
    few models the prior misses by several times), each (source, device) group weighted equally (so the
    2-GPU Accel-NASBench set does not outweigh timm), simplex method."""
    train = [w for w in items if not w.test]
    devices = sorted({w.device for w in items})
    y = np.log(np.array([w.measured_ms for w in train]))
    groups = [f"{w.source}/{w.device}" for w in train]
    counts = {g: groups.count(g) for g in set(groups)}
    weight = np.array([1.0 / (len(counts) * counts[g]) for g in groups])

    def loss(x: np.ndarray) -> float:
        pred = predict_all(train, apply_knobs(base, x, devices))
        return float(np.sum(weight * np.abs(np.log(pred) - y)))

    x = knobs_start(base, devices)
    for _ in range(2):  # a restart from the best point (the simplex shrinks early in 12 dimensions)
        x = nelder_mead(loss, x, iters=40 * len(x))
    names = {"accel-nasbench": "Accel-NASBench throughput (afzalxo/Accel-NASBench @42603572)",
             "timm": "timm benchmark-infer (huggingface/pytorch-image-models @aa4b5850)"}
    per_dev = {d: "; ".join(sorted({names.get(w.source, w.source) for w in items if w.device == d})) for d in devices}
    fitted = apply_knobs(base, x, devices, per_dev)
    shared = ", ".join(f"{c}.{n}={float(np.clip(math.exp(v), lo, hi)):.3g}"
                       for (c, n, lo, hi), v in zip(SHARED_KNOBS, x[:len(SHARED_KNOBS)]))
    print(f"  fitted on the training split ({len(train)} measurements, loss {loss(x):.4f}): {shared}")
    for dev, sc in fitted.device_scales.items():
        print(f"    device {dev:<16} compute x{sc.compute:.3f}  memory x{sc.memory:.3f}")
    return fitted


def fit_device_scales(items: Sequence[WholeModel], base: PriorParams) -> PriorParams:
    """Refit only the per-GPU (compute, memory) multipliers of ``base`` on the training split, every other
    constant kept (the shared knobs, the class multipliers of a fitted GPU, the entries of devices without rows):
    the loss of :func:`fit_whole_models` with the shared knobs fixed, which splits by device (a row depends on
    its own GPU's multipliers only), so each GPU is a 2-D simplex fit from its multipliers in ``base``. The
    default entries (``"*"``, ``"*geforce"``) are derived again from the refitted GPUs."""
    from dippm_nas.prior import DeviceScale

    train = [w for w in items if not w.test]
    devices = sorted({w.device for w in items})
    scales = dict(base.device_scales)
    for dev in devices:
        rows = [w for w in train if w.device == dev]
        y = np.log(np.array([w.measured_ms for w in rows]))
        counts = defaultdict(int)
        for w in rows:
            counts[w.source] += 1
        weight = np.array([1.0 / (len(counts) * counts[w.source]) for w in rows])
        old = base.device_scales.get(dev, DeviceScale())

        def with_dev(x: np.ndarray, old: DeviceScale = old, dev: str = dev) -> PriorParams:
            vals = [float(np.clip(math.exp(v), lo, hi)) for (_, lo, hi), v in zip(DEVICE_KNOBS, x)]
            entry = dataclasses.replace(old, compute=vals[0], memory=vals[1])
            return dataclasses.replace(base, device_scales={**scales, dev: entry})

        def loss(x: np.ndarray, rows: list[WholeModel] = rows, y: np.ndarray = y, weight: np.ndarray = weight,
                 with_dev: Callable[[np.ndarray], PriorParams] = with_dev) -> float:
            return float(np.sum(weight * np.abs(np.log(predict_all(rows, with_dev(x))) - y)))

        x = np.log(np.array([old.compute, old.memory]))
        start = loss(x)
        for _ in range(2):  # a restart from the best point, as fit_whole_models
            x = nelder_mead(loss, x, step=0.2, iters=30)
        scales[dev] = with_dev(x).device_scales[dev]
        for sib in SCALE_SIBLINGS.get(dev, ()):
            if sib in scales:
                scales[sib] = dataclasses.replace(scales[sib], compute=scales[dev].compute, memory=scales[dev].memory)
        print(f"    device {dev:<16} {len(rows)} training rows, loss {start:.4f} -> {loss(x):.4f}: compute "
              f"x{old.compute:.3f} -> x{scales[dev].compute:.3f}, memory x{old.memory:.3f} -> x{scales[dev].memory:.3f}")
    scales.update(default_scale_entries(scales, devices))
    for key in ("*", "*geforce"):
        if key in scales:
            print(f"    default {key:<15} compute x{scales[key].compute:.3f}  memory x{scales[key].memory:.3f}  "
                  f"classes {dict(scales[key].classes)}")
    return dataclasses.replace(base, device_scales=scales)


# ----------------------------------------------------------------------------------------- Accel-NASBench

ANB_BATCH = 256
ANB_DEVICES = {"throughput_a100__throughput_mean": "a100-sxm4-40gb", "throughput_3090__throughput_mean": "rtx-3090"}


def load_anb(data: Path, n_nets: int) -> list[WholeModel]:
    import search_spaces as ss
    from search_spaces import ACCEL_NASBENCH_COLUMNS, config_from_accel_nasbench_row

    from dippm_nas import InputSpec

    path = data / "accel_nasbench_mnasnet_space_throughput.csv"
    rows = list(csv.DictReader(open(path, newline="")))
    keyed = sorted(rows, key=lambda r: hashlib.sha256("|".join(r[c] for c in ACCEL_NASBENCH_COLUMNS).encode()).hexdigest())
    chosen = keyed[:n_nets]
    print(f"  {len(rows)} rows; deterministic subsample of {len(chosen)} nets (first by SHA-256 of the architecture); "
          f"captured at 3x256x256, batch {ANB_BATCH}, float16, predicted with channels_last=True")
    spec = InputSpec(shape=(3, 256, 256), batch_size=ANB_BATCH, dtype="float16")
    out: list[WholeModel] = []
    t0 = time.time()
    failed = 0
    for i, r in enumerate(chosen):
        arch = "|".join(r[c] for c in ACCEL_NASBENCH_COLUMNS)
        cfg = config_from_accel_nasbench_row(r, resolution=256)
        try:
            g = cached_capture(f"anb:{arch}", lambda: ss.build_model("mbconv", cfg), spec)
        except Exception as e:  # noqa: BLE001 - counted and reported, never dropped silently
            failed += 1
            print(f"  capture failed for row {arch}: {type(e).__name__}: {e}")
            continue
        test = held_out(f"anb:{arch}")
        for col, dev in ANB_DEVICES.items():
            thr = float(r[col]) if r[col] else float("nan")
            if not math.isfinite(thr) or thr <= 0:
                continue
            out.append(WholeModel(arch, "accel-nasbench", dev, g, ANB_BATCH / thr * 1e3, True, test))
        if (i + 1) % 20 == 0:
            print(f"    captured {i + 1}/{len(chosen)} ({time.time() - t0:.0f} s)")
    if failed:
        print(f"  {failed} nets failed to capture and are not in the figures")
    return out


def run_anb(data: Path, n_nets: int) -> list[WholeModel]:
    print("\n== Accel-NASBench (accel_nasbench_mnasnet_space_throughput.csv): A100-40GB (variant unrecorded; "
          "a100-sxm4-40gb used, same peaks and bandwidth as PCIe) and RTX 3090")
    print("  measured per-batch latency = 256 / throughput (rows used batch 256 or 128, unrecorded; 256 assumed)")
    return load_anb(data, n_nets)


# ----------------------------------------------------------------------------------------- timm


def run_timm(data: Path, n_models: int) -> list[WholeModel]:
    print("\n== timm benchmark-infer (timm_benchmark_infer_gpu.csv): RTX 3090/4090/5090, AMP, eager")
    import importlib.util

    if importlib.util.find_spec("timm") is None:
        print("  skipped: timm is not installed in this interpreter (run with a venv that has timm + torchvision)")
        return []
    return load_timm(data, n_models)


TIMM_GPUS = {"NVIDIA GeForce RTX 3090": "rtx-3090", "NVIDIA GeForce RTX 4090": "rtx-4090",
             "NVIDIA GeForce RTX 5090": "rtx-5090"}
#: (gpu, layout) -> torch version tag used: the newest eager AMP run of each.
TIMM_RUNS = {("rtx-3090", "nchw"): "pt240", ("rtx-3090", "nhwc"): "pt240", ("rtx-4090", "nchw"): "pt291",
             ("rtx-4090", "nhwc"): "pt240", ("rtx-5090", "nchw"): "pt291"}
TIMM_MAX_MPARAMS = 100.0


def load_timm(data: Path, n_models: int) -> list[WholeModel]:
    import timm

    from dippm_nas import InputSpec

    rows = [r for r in csv.DictReader(open(data / "timm_benchmark_infer_gpu.csv", newline=""))
            if r["gpu"] in TIMM_GPUS and r["precision"] == "amp" and r["torch_compile"] == "eager"]
    runs: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        dev = TIMM_GPUS[r["gpu"]]
        if TIMM_RUNS.get((dev, r["memory_layout"])) == r["torch_version_tag"]:
            runs[r["model"]].append(r)
    # models measured on all three GPUs, small enough to capture on 2 cores
    full = [m for m, rs in runs.items()
            if {TIMM_GPUS[r["gpu"]] for r in rs} == set(TIMM_GPUS.values())
            and all(float(r["param_count"] or 0) <= TIMM_MAX_MPARAMS for r in rs) and timm.is_model(m)]
    chosen = sorted(full, key=lambda m: hashlib.sha256(m.encode()).hexdigest())[:n_models]
    print(f"  {len(runs)} models with eager AMP rows; {len(full)} measured on all three GPUs with <= "
          f"{TIMM_MAX_MPARAMS:.0f} M params; deterministic subsample of {len(chosen)} (first by SHA-256 of the name)")
    print(f"  runs used (gpu, layout -> torch): {TIMM_RUNS}; AMP approximated by casting the model to float16")
    out: list[WholeModel] = []
    failed: dict[str, str] = {}
    t0 = time.time()
    for i, name in enumerate(chosen):
        for r in runs[name]:
            img, bs = int(float(r["infer_img_size"])), int(float(r["infer_batch_size"]))
            spec = InputSpec(shape=(3, img, img), batch_size=bs, dtype="float16")
            try:
                g = cached_capture(f"timm:{name}", lambda: timm.create_model(name, pretrained=False).eval(), spec)
            except Exception as e:  # noqa: BLE001 - counted and reported, never dropped silently
                failed[name] = f"{type(e).__name__}: {str(e)[:120]}"
                break
            step_ms = float(r["infer_step_time"])
            if not math.isfinite(step_ms) or step_ms <= 0:
                continue
            out.append(WholeModel(name, "timm", TIMM_GPUS[r["gpu"]], g, step_ms, r["memory_layout"] == "nhwc",
                                  held_out(f"timm:{name}")))
        if (i + 1) % 10 == 0:
            print(f"    captured {i + 1}/{len(chosen)} models ({time.time() - t0:.0f} s)")
    if failed:
        print(f"  {len(failed)} models failed to capture and are not in the figures: {sorted(failed)}")
        for k, v in sorted(failed.items()):
            print(f"    {k}: {v}")
    return out


# ----------------------------------------------------------------------------------------- DIPPM memory check

#: DIPPM's own reported A100-40GB examples (NVML memory, ../shared/docs/devices.md): model, batch, measured MB.
DIPPM_MEMORY_POINTS = (("densenet121", 8, "7g.40gb", 3272.0), ("densenet121", 8, "1g.5gb", 2918.0),
                       ("efficientnet_b0", 32, None, 4772.0))


def run_dippm_memory() -> dict[str, Any]:
    """Compare the memory prior with the three NVML figures DIPPM reports (a check, not a fit: 3 points)."""
    import importlib.util

    print("\n== memory check against DIPPM's reported NVML figures (A100-40GB, fp32, 224x224; MB read as MiB)")
    if importlib.util.find_spec("torchvision") is None:
        print("  skipped: torchvision is not installed in this interpreter")
        return {}
    import torchvision

    from dippm_nas import InputSpec

    dev = get_device("a100-sxm4-40gb")
    out: dict[str, Any] = {}
    print(f"  {'model':<16}{'batch':>6}{'where':>9}{'measured':>10}{'predicted':>11}   parts (baseline + weights + "
          f"activations + workspace + allocator) MiB; implied baseline")
    for name, bs, where, measured in DIPPM_MEMORY_POINTS:
        spec = InputSpec(shape=(3, 224, 224), batch_size=bs, dtype="float32")
        g = cached_capture(f"torchvision:{name}", lambda: torchvision.models.get_model(name, weights=None).eval(), spec)
        target = dev.mig_slice(where) if where else dev
        e = estimate(g, target, params=PriorParams.uncalibrated())  # memory does not depend on the constants
        rest = e.memory_mib - e.baseline_mib
        out[f"{name}/bs{bs}/{where or 'full'}"] = {"measured_mib": measured, "predicted_mib": e.memory_mib,
                                                    "implied_baseline_mib": measured - rest}
        print(f"  {name:<16}{bs:>6}{(where or 'full'):>9}{measured:>10.0f}{e.memory_mib:>11.0f}   ({e.baseline_mib:.0f} + "
              f"{e.weights_mib:.0f} + {e.activations_peak_mib:.0f} + {e.workspace_mib:.0f} + "
              f"{e.allocator_overhead_mib:.0f}); {measured - rest:.0f}")
    print("  the measured figures include the CUDA context and cuDNN state of DIPPM's software stack; the implied "
          "baseline is what runtime_baseline_mib would have to be to match them")
    return out


# ----------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="directory of the public CSVs (../shared/data)")
    ap.add_argument("--sections", default="neusight,anb,timm,memory",
                    help="comma list of neusight, anb, timm, memory (the DIPPM memory check)")
    ap.add_argument("--out", type=Path, default=None, help="write the fitted constants (JSON) here")
    ap.add_argument("--anb-nets", type=int, default=120, help="Accel-NASBench nets to capture (deterministic subsample)")
    ap.add_argument("--timm-models", type=int, default=60, help="timm models to capture (deterministic subsample)")
    ap.add_argument("--base", type=Path, default=None,
                    help="refit only the per-GPU multipliers of this calibration file (and the default entries derived "
                         "from them), every other constant kept; the neusight section is not run")
    args = ap.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - {"neusight", "anb", "timm", "memory"})
    if unknown:
        ap.error(f"unknown sections {unknown}; choices: neusight, anb, timm, memory")
    if not args.data.is_dir():
        ap.error(f"--data {args.data} is not a directory")
    if args.base is not None and not args.base.is_file():
        ap.error(f"--base {args.base} is not a file")
    t0 = time.time()
    params = PriorParams.uncalibrated() if args.base is None else PriorParams.load(args.base)
    metrics: dict[str, Any] = {} if args.base is None else dict(params.metrics)
    sources = []
    if "neusight" in sections and args.base is None:
        params, metrics["neusight"] = run_neusight(args.data, params)
        sources.append("NeuSight A100 operator microbenchmarks (sitar-lab/NeuSight @6945927d, MIT)")
    whole: list[WholeModel] = []
    if "anb" in sections:
        whole += run_anb(args.data, args.anb_nets)
        sources.append("Accel-NASBench A100/RTX 3090 throughput (afzalxo/Accel-NASBench @42603572, Apache-2.0)")
    if "timm" in sections:
        items = run_timm(args.data, args.timm_models)
        if items:
            whole += items
            sources.append("timm benchmark-infer RTX 3090/4090/5090 (huggingface/pytorch-image-models @aa4b5850, Apache-2.0)")
    if "memory" in sections:
        metrics["dippm_memory_check"] = run_dippm_memory()
    if whole and args.base is not None:
        print(f"\n== whole models: refit of the per-GPU multipliers of {args.base}, every other constant kept")
        after = fit_device_scales(whole, params)
        metrics["whole_models_device_refit"] = report(whole, params, after, f"{args.base} (before) vs refitted (after)")
        params = after
    elif whole:
        print("\n== whole models: fit of the tensor-core, reduction, depthwise, kernel, NCHW and L2 constants and per-device scales")
        before_whole = params
        after = fit_whole_models(whole, params)
        metrics["whole_models"] = report(whole, PriorParams.uncalibrated(), after,
                                         "uncalibrated prior (before) vs fitted prior (after)")
        print("  (op-level fit only, for reference)")
        metrics["whole_models_oplevel_only"] = report(whole, PriorParams.uncalibrated(), before_whole,
                                                      "uncalibrated vs NeuSight-only")
        params = after
    print(f"\ndone in {time.time() - t0:.0f} s")
    import platform

    import torch

    metrics["environment"] = {"python": platform.python_version(), "torch": torch.__version__,
                              "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs"}
    if args.out:
        command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])])
        params = dataclasses.replace(
            params, source=params.source if args.base is not None else "; ".join(sources) or "uncalibrated",
            command=command if args.base is None else f"{params.command}; per-GPU multipliers then refitted by: {command}",
            metrics=metrics)
        params.save(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
