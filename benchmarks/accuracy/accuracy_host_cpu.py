"""Host-CPU accuracy on held-out families, and the few-shot calibration curve.

Usage::

    python benchmarks/accuracy/accuracy_host_cpu.py --data HOST_CPU_DATASET --checkpoint CKPT.pt --holdout FAM[,FAM...]
        [--calibrate 5,10,20] [--seed 0]

The checkpoint must have been trained with ``dippm-nas train --split family --holdout FAM[,...]`` on the
same data and seed: whole families in --holdout were never seen in training, and the printed metrics
are on their rows only. Target (issue 7): MAPE <= 5 % on held-out families. The calibration curve
fits the per-device correction on k random rows of the held-out family and reports the error on the
others (mean over 5 draws).
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, action="append")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--holdout", required=True)
    ap.add_argument("--calibrate", default="5,10,20")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from dippm_nas.training import evaluate_checkpoint

    hold = [h for h in args.holdout.split(",") if h]
    ks = [int(k) for k in args.calibrate.split(",") if k]
    res = evaluate_checkpoint(args.checkpoint, args.data, device="host-cpu", split="family", heldout_families=hold,
                              seed=args.seed, calibrate_ks=ks)
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
        return 0
    print(f"checkpoint {args.checkpoint}; held-out families {hold}: {res['n_test']} rows")
    for t, m in res["metrics"].items():
        cov = f", within ±2σ {m['coverage_2sigma']:.3f}" if "coverage_2sigma" in m else ""
        print(f"{t:20s} MAPE {m['mape_pct']:.2f} % (target <= 5), median APE {m['median_ape_pct']:.2f} %, "
              f"Kendall tau {m['kendall_tau']:.3f}{cov}")
    for k, tab in res.get("calibration", {}).items():
        m = tab.get("latency_ms")
        if m:
            print(f"calibration {k:8s} latency MAPE {m['mape_pct']:.2f} %, median APE {m['median_ape_pct']:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
