#!/usr/bin/env python
"""A host-cpu checkpoint on another CPU: its error on measurements of this machine, the σ floor that
covers it, and the few-shot calibration curve.

Usage::

    python benchmarks/accuracy/accuracy_other_host.py --data HOST_CPU_DATASET_OF_THIS_MACHINE --checkpoint CKPT.pt \
        [--calibrate 5,10,20] [--seed 0] [--same-cpu-model] [--json]

Run it on the machine the dataset was measured on (the device features and the prior come from this
machine's microbenchmark, as they do for a user), with a checkpoint whose ``host.cpu_model`` is another
CPU. Every row of the dataset is a test row: the checkpoint never saw this machine. Printed per target:
MAPE, median APE, Kendall τ and the share within ±2σ of the σ the checkpoint gives without the
cross-host floor; then the floor (:func:`~dippm_nas.training.fit_novel_floor`, 95 % within ±2σ)
fitted on half of the families and the coverage it gives on the other half (families alternate in
sorted order), and the floor fitted on all rows (the figure ``OTHER_HOST_FLOOR_LOG`` holds, or
``OTHER_MACHINE_FLOOR_LOG`` with ``--same-cpu-model``). The
calibration curve fits the per-device correction on k random rows of one family and reports the error
on the rest of that family (mean over 5 draws per family), as ``benchmarks/accuracy/accuracy_host_cpu.py`` does.
Also printed: the median measured/predicted factor and the MAPE left once that one factor is removed (how
much of the error a single scale would fix).

``--same-cpu-model`` accepts a checkpoint whose CPU model string is the data's and this machine's: for
data from *another machine of the same model* (another VM, another day), which you vouch for, since the
string cannot tell the two apart. The σ is then the checkpoint's without the other-machine floor
(:data:`~dippm_nas.predictor.OTHER_MACHINE_FLOOR_LOG`, the figure this measures).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, action="append", help="host-CPU dataset measured on this machine")
    ap.add_argument("--checkpoint", required=True, help="a host-cpu checkpoint measured on another CPU model")
    ap.add_argument("--calibrate", default="5,10,20", help="calibration sizes k (default 5,10,20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--same-cpu-model", action="store_true",
                    help="the data is from another machine with the checkpoint's CPU model string (another VM)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    from dippm_nas.devices import cpu_model_name
    from dippm_nas.predictor import HOST_DEVICE, GnnPredictor
    from dippm_nas.training import evaluate_examples, featurize_examples, few_shot_curve, fit_novel_floor, load_examples

    pred = GnnPredictor.load(args.checkpoint, device=HOST_DEVICE, load_calibration=False)
    trained_on = (pred.meta.host or {}).get("cpu_model")
    ex = load_examples(args.data, devices=[HOST_DEVICE])
    rows_cpu = Counter(e.cpu_model for e in ex)
    here = cpu_model_name()
    if trained_on is None:
        print(f"the checkpoint must record the CPU model it was measured on (host.cpu_model); "
              f"{args.checkpoint} has none", file=sys.stderr)
        return 2
    if not args.same_cpu_model and (trained_on in rows_cpu or trained_on == here):
        print(f"the checkpoint must be measured on another CPU model than the data and this machine "
              f"(or pass --same-cpu-model for another machine of the same model): checkpoint "
              f"{trained_on!r}, rows {dict(rows_cpu)}, this machine {here!r}", file=sys.stderr)
        return 2
    # the σ without the cross-host (other-machine) floor: the floor is what this script measures
    pred.other_host_floor_log, pred.other_machine_floor_log = {}, {}
    feats = featurize_examples(ex, style=pred.meta.feature_style, prior_params=pred.prior_params,
                               host_threads=pred.host_threads)
    tab, rows = evaluate_examples(pred, feats, ex)
    fams = sorted({e.family for e in ex})
    fit_fams, check_fams = set(fams[0::2]), set(fams[1::2])
    floors: dict[str, dict[str, float]] = {}
    for t in pred.meta.targets:
        rs = [r for r in rows if t in r]
        if not rs:
            continue
        err = np.array([abs(math.log(r[t]) - math.log(r[f"{t}_pred"])) for r in rs])
        sig = np.array([r[f"{t}_std"] / r[f"{t}_pred"] for r in rs])
        fam = np.array([r["family"] for r in rs])
        fit = np.isin(fam, list(fit_fams))
        f_half = fit_novel_floor(err[fit], sig[fit])
        check_cov = float(np.mean(err[~fit] <= 2 * np.hypot(sig[~fit], f_half)))
        floors[t] = {"floor_fit_half": f_half, "coverage_other_half": check_cov,
                     "floor_all": fit_novel_floor(err, sig)}
    scale: dict[str, dict[str, float]] = {}
    for t in pred.meta.targets:
        lr = np.array([math.log(r[t]) - math.log(r[f"{t}_pred"]) for r in rows if t in r])
        if lr.size:
            g = float(np.median(lr))
            # |prediction x factor - measured| / measured, as regression_metrics' MAPE (not relative to the prediction)
            scale[t] = {"factor": math.exp(g), "mape_pct_after": float(np.mean(np.abs(np.exp(g - lr) - 1)) * 100)}
    ks = [int(k) for k in args.calibrate.split(",") if k]
    curve = few_shot_curve(pred, feats, ex, ks, seed=args.seed) if ks else {}
    res = {"checkpoint": args.checkpoint, "checkpoint_cpu": trained_on, "rows_cpu": dict(rows_cpu),
           "this_machine": here, "n": len(ex), "metrics": tab, "floors": floors, "scale": scale,
           "fit_families": sorted(fit_fams), "check_families": sorted(check_fams), "calibration": curve}
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"checkpoint {args.checkpoint} measured on {trained_on!r}; {len(ex)} rows measured on {dict(rows_cpu)}; "
          f"this machine {here!r}")
    for t, m in tab.items():
        cov = f", within ±2σ {m['coverage_2sigma']:.3f} (no cross-host floor)" if "coverage_2sigma" in m else ""
        print(f"{t:20s} MAPE {m['mape_pct']:.2f} %, median APE {m['median_ape_pct']:.2f} %, "
              f"Kendall tau {m['kendall_tau']:.3f}{cov}")
    for t, sc in scale.items():
        print(f"{t:20s} measured/predicted median factor {sc['factor']:.3f}; MAPE {sc['mape_pct_after']:.2f} % "
              f"once it is removed")
    for t, f in floors.items():
        print(f"{t:20s} cross-host floor {f['floor_fit_half']:.4f} fitted on {sorted(fit_fams)} -> within ±2σ "
              f"{f['coverage_other_half']:.3f} on {sorted(check_fams)}; fitted on all rows {f['floor_all']:.4f}")
    for k, t_tab in curve.items():
        for t in pred.meta.targets:
            m = t_tab.get(t)
            if m:
                print(f"calibration {k:8s} {t:12s} MAPE {m['mape_pct']:.2f} %, median APE {m['median_ape_pct']:.2f} %, "
                      f"tau {m['kendall_tau']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
