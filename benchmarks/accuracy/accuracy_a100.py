"""A100 accuracy of a predictor checkpoint on Accel-NASBench (random 70/15/15 split by architecture).

Usage::

    python benchmarks/accuracy/accuracy_a100.py --data ACCEL_DATASET [--checkpoint CKPT.pt] [--seed 0]

ACCEL_DATASET: a dataset file with the Accel-NASBench rows (``dippm-nas dataset import accel-nasbench``
or its JSONL export). The split is recomputed from the seed exactly as ``dippm-nas train`` made it, so
with the shipped checkpoint the printed rows are its held-out test rows (never used for selection).
Targets (issue 7): test MAPE <= 1.5 %, Kendall tau >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, action="append")
    ap.add_argument("--checkpoint", default=None, help="default: the shipped a100-sxm4-40gb checkpoint")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from dippm_nas.predictor import find_checkpoint
    from dippm_nas.training import evaluate_checkpoint

    ck = args.checkpoint or find_checkpoint("a100-sxm4-40gb")
    if ck is None:
        print("no a100-sxm4-40gb checkpoint found", file=sys.stderr)
        return 2
    res = evaluate_checkpoint(ck, args.data, device="a100-sxm4-40gb", split="random", seed=args.seed)
    m, p = res["metrics"]["latency_ms"], res["metrics"].get("latency_ms_prior", {})
    if args.json:
        print(json.dumps({"checkpoint": str(ck), "metrics": res["metrics"]}))
        return 0
    print(f"checkpoint {ck}; A100 test rows: {res['n_test']}")
    print(f"GNN   latency MAPE {m['mape_pct']:.2f} % (target <= 1.5), median APE {m['median_ape_pct']:.2f} %, "
          f"Kendall tau {m['kendall_tau']:.3f} (target >= 0.95), within ±2σ {m['coverage_2sigma']:.3f}")
    if p:
        print(f"prior latency MAPE {p['mape_pct']:.2f} %, median APE {p['median_ape_pct']:.2f} %, Kendall tau {p['kendall_tau']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
