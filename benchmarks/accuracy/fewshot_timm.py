"""Few-shot calibration on the timm benchmark-infer rows: leave-one-GPU-out on the analytic prior.

Usage (from the repository root; the data path is an argument, nothing is downloaded)::

    python benchmarks/accuracy/fewshot_timm.py --data timm.sqlite [--shots 3,5,10] [--draws 30] [--out report.json]

``--data`` is a dataset file with the timm rows and their graphs (``dippm-nas dataset import timm ...``; RTX
3090/4090/5090, amp fp16, eager, mostly batch 1024). For each GPU of the data its own fitted efficiency
multipliers (``PriorParams.device_scales``) are removed and replaced by the geometric mean of the other fitted
GPUs' (what a GPU without its own entry gets), so the zero-shot figure is the prior on an unseen GPU; the op-class
constants are the shipped ones, which were fitted on timm rows of all three GPUs (60 models each), so the zero-shot
error is if anything low. Few-shot: k measured models of the held-out GPU fit its host, GPU and op-class GPU
factors (:func:`dippm_nas.predictor.fit_timeline_factors`, what ``AnalyticPredictor.calibrate()`` does), scored
on its other models; medians over random draws, with the common factors alone and the all-rows in-sample fit
(the floor of a fit of this form) beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from dippm_nas.dataset import load_measurements
from dippm_nas.predictor import calibration_classes
from dippm_nas.prior import default_params, default_scale_entries, estimate, row_settings
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import write_output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_eager import few_shot, print_few_shot  # noqa: E402


def held_out_params(base, device: str, among: list[str] | None = None):
    """``base`` with ``device``'s own scale removed and the default entries refitted without it: the
    geometric mean of the other fitted GPUs' multipliers, and of the other fitted GeForce GPUs' for GeForce GPUs
    (:func:`dippm_nas.prior.default_scale_entries`; ``among``: of these GPUs only)."""
    if among is None:
        among = [k for k in base.device_scales if not k.startswith("*") and k != device
                 and not k.startswith("host") and not k.startswith("a100-pcie")]
    else:
        bad = [k for k in among if k == device or k not in base.device_scales]
        if bad or not among:
            raise SystemExit(f"held_out_params({device!r}): the GPUs to average must have a fitted scale and not be "
                             f"the held-out one; bad: {bad or among}; fitted: {sorted(base.device_scales)}")
    entries = default_scale_entries(base.device_scales, list(among), note=f"leave-one-GPU-out of {device}")
    scales = {k: v for k, v in base.device_scales.items() if k != device and not k.startswith("*")}
    scales.update(entries)
    return dataclasses.replace(base, device_scales=scales)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="dataset file with the timm rows (graphs captured)")
    ap.add_argument("--shots", default="3,5,10", help="numbers k of measured models (default 3,5,10)")
    ap.add_argument("--draws", type=int, default=30, help="random draws of the k models per setting (default 30)")
    ap.add_argument("--out", type=Path, default=None, help="JSON report")
    args = ap.parse_args(argv)

    rows = [mg for mg in load_measurements(args.data, source="timm")
            if mg.measurement.get("status", "ok") == "ok" and mg.measurement.get("latency_ms")]
    devices = sorted({mg.measurement["device"] for mg in rows})
    base = default_params()
    report: dict[str, dict] = {}
    print(f"leave-one-GPU-out over {devices}; {len(rows)} rows")
    for dev in devices:
        params = held_out_params(base, dev)
        test = [mg for mg in rows if mg.measurement["device"] == dev]
        ests, y, classes, names = [], [], [], []
        for mg in test:
            m = mg.measurement
            ests.append(estimate(mg.graph, dev, params=params,
                                 deployment=row_settings(m.get("conditions"), m.get("environment"))))
            y.append(float(m["latency_ms"]))
            classes.append(calibration_classes(mg.graph))
            names.append(m["config"].get("model"))
        y_ = np.array(y)
        prior = np.array([e.latency_ms for e in ests])
        shipped = np.array([estimate(mg.graph, dev, params=base, deployment=row_settings(
            mg.measurement.get("conditions"), mg.measurement.get("environment"))).latency_ms for mg in test])
        bound = np.array([e.launch_bound for e in ests])
        zero = float(np.mean(np.abs(prior / y_ - 1)) * 100)
        own = float(np.mean(np.abs(shipped / y_ - 1)) * 100)
        print(f"\n== held out: {dev}: n={len(y_)} ({int(bound.sum())} host-bound by the prior); zero-shot MAPE "
              f"{zero:.1f} % (its own fitted scale, in-sample: {own:.1f} %)")
        report[f"{dev} zero-shot"] = {"n": len(y_), "mape_pct": zero, "own_scale_mape_pct": own}
        idx = np.arange(len(y_))
        for k in [int(x) for x in args.shots.split(",") if x.strip()]:
            res = few_shot(ests, classes, prior, y_, idx, k, args.draws)
            report[f"{dev} few-shot k={k}"] = {"prior": res}
            print_few_shot("float16 ", res)
    if args.out is not None:
        write_output(args.out, json.dumps(report, indent=1) + "\n", "--out", error=InvalidValueError)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
