"""Fit the serial resize kernel's time per loop iteration (``PriorParams.resize_loop_ns``) on timm rows.

Usage (the timm rows of the models that run the kernel; graphs captured)::

    python scripts/make_timm_subset.py --data ../shared/data --out eff2.csv --per-family 1000 --family efficientformerv
    dippm-nas dataset import timm eff2.csv --out eff2.sqlite
    nice -n 10 python scripts/fit/fit_resize_loop.py --timm eff2.sqlite \
        [--write dippm_nas/prior/calibration/fitted.json]

Eager PyTorch's bilinear / bicubic resize of a contiguous NCHW tensor loops over batch and channels inside each
output-pixel thread (:mod:`dippm_nas.prior._resize`), one memory round trip an iteration. For every eager timm row
whose graph has such a resize, the iteration time that makes the prior's described prediction (the shipped
constants) equal the measured step time is found by bisection; the fitted value is the geometric mean over the
rows, and the script prints it per GPU and the leave-one-GPU-out value (the geometric mean of the other GPUs' rows),
each with the MAPE of that GPU's rows at the fitted and at the leave-one-GPU-out value. In the released timm data
only EfficientFormerV2 (4 models, its strided attention's ``nn.Upsample``) runs the kernel at a size that shows; no
other family can test the value. ``--write`` sets the global key
``resize_loop_ns`` of the calibration file and records the fit under ``metrics["resize_loop_fit"]``; nothing else
in the file changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"))

from accuracy_deployment import described  # noqa: E402  (benchmark helpers)
from unseen_gpu_sigma import source_rows  # noqa: E402

from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.prior import default_params, predict  # noqa: E402

#: Bisection bounds of the iteration time, ns.
BOUNDS_NS = (1.0, 10_000.0)


def implied_ns(graph: Any, device: str, label_ms: float, deployment: Any, params: Any, steps: int = 40) -> float:
    """The iteration time (ns) at which the prior's latency of ``graph`` equals ``label_ms`` (a bound when the
    label lies outside what the bounds give)."""
    lo, hi = BOUNDS_NS
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        p = predict(graph, device, params=dataclasses.replace(params, resize_loop_ns=mid), deployment=deployment,
                    mig=False)
        lo, hi = (mid, hi) if p.latency_ms < label_ms else (lo, mid)
    return math.sqrt(lo * hi)


def fit_rows(path: Path) -> list[dict[str, Any]]:
    """One record per eager timm row of ``path`` whose graph has a serial resize (its prediction moves with the
    iteration time): model, GPU, label, implied ns."""
    base = default_params()
    out = []
    for mg in source_rows(path, "timm"):
        m = mg.measurement
        dep = described("timm", m)
        if predict(mg.graph, m["device"], params=dataclasses.replace(base, resize_loop_ns=BOUNDS_NS[1]),
                   deployment=dep, mig=False).latency_ms == predict(
                mg.graph, m["device"], params=dataclasses.replace(base, resize_loop_ns=None), deployment=dep,
                mig=False).latency_ms:
            continue
        out.append({"model": m["config"]["model"], "device": m["device"], "label_ms": float(m["latency_ms"]),
                    "implied_ns": implied_ns(mg.graph, m["device"], float(m["latency_ms"]), dep, base),
                    "graph": mg.graph, "deployment": dep})
    return out


def mape_pct(recs: list[dict[str, Any]], loop_ns: float) -> float:
    """MAPE (%) of the described predictions of ``recs`` (shipped constants) with ``resize_loop_ns=loop_ns``."""
    p = dataclasses.replace(default_params(), resize_loop_ns=loop_ns)
    return 100.0 * sum(abs(predict(r["graph"], r["device"], params=p, deployment=r["deployment"], mig=False).latency_ms
                           / r["label_ms"] - 1.0) for r in recs) / len(recs)


def geomean(values: list[float]) -> float:
    """Geometric mean of positive values."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--timm", type=Path, required=True, help="timm dataset with captured graphs (SQLite)")
    ap.add_argument("--write", type=Path, help="calibration file whose resize_loop_ns to set")
    a = ap.parse_args(argv)
    recs = fit_rows(a.timm)
    if not recs:
        raise SystemExit(f"{a.timm}: no eager timm row whose graph has a serial (bilinear / bicubic NCHW) resize")
    by_gpu: dict[str, list[float]] = defaultdict(list)
    for r in recs:
        by_gpu[r["device"]].append(r["implied_ns"])
        print(f"{r['model']:28s} {r['device']:10s} label {r['label_ms']:8.1f} ms  implied {r['implied_ns']:6.1f} ns")
    fitted = geomean([r["implied_ns"] for r in recs])
    per_gpu = {g: geomean(v) for g, v in sorted(by_gpu.items())}
    held_out = {g: geomean([r["implied_ns"] for r in recs if r["device"] != g]) for g in per_gpu if len(per_gpu) > 1}
    for g in per_gpu:
        rows = [r for r in recs if r["device"] == g]
        line = (f"{g:10s} own rows {per_gpu[g]:6.1f} ns; described MAPE at the fitted value "
                f"{mape_pct(rows, fitted):5.1f} %")
        if g in held_out:
            line += f", fitted without it {held_out[g]:6.1f} ns: {mape_pct(rows, held_out[g]):5.1f} %"
        print(line)
    print(f"resize_loop_ns = {fitted:.1f} (geometric mean of {len(recs)} rows)")
    if a.write:
        d = json.loads(a.write.read_text())
        d["global"]["resize_loop_ns"] = fitted
        d.setdefault("metrics", {})["resize_loop_fit"] = {
            "rows": len(recs), "per_gpu_ns": per_gpu, "leave_gpu_out_ns": held_out,
            "command": "python scripts/fit/fit_resize_loop.py --timm eff2.sqlite --write " + str(a.write)}
        write_output(a.write, json.dumps(d, indent=1) + "\n", "--write", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
