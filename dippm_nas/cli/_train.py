"""``dippm-nas train --data DB --device D --out CKPT.pt``: train the GraphSAGE ensemble."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from dippm_nas.cli._grammar import (
    ListAction,
    UsageError,
    add_json_flag,
    argtype,
    device_ids,
    float_flag,
    int_flag,
    json_text,
    writable_output,
)
from dippm_nas._files import write_output

__all__ = ["register", "add_split_args", "parse_devices", "checked_devices"]


def add_split_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", action="append", required=True, metavar="PATH",
                   help="dataset file (SQLite or .jsonl[.gz|.xz] export); repeat for several")
    p.add_argument("--device", default="a100-sxm4-40gb", type=argtype(lambda t: device_ids([t])[0]),
                   help="device the checkpoint answers for (catalogue id; default a100-sxm4-40gb)")
    p.add_argument("--train-devices", action=ListAction, default=None, metavar="D",
                   help="catalogue ids whose rows train the model, e.g. a100-sxm4-40gb rtx-3090 (a list; default: "
                        "all in the data)")
    p.add_argument("--split", choices=("random", "family", "timm-family"), default="random",
                   help="random 70/15/15 by architecture, held-out families (--holdout), or timm-family: "
                        "timm model families (name prefix) held out by a hash (--holdout-frac), other rows "
                        "random (default random)")
    p.add_argument("--holdout", default="", help="comma-separated families held out with --split family")
    p.add_argument("--holdout-frac", type=float_flag("--holdout-frac", low=0, low_inclusive=False, high=1,
                                                     high_inclusive=False), default=0.25,
                   help="share of timm families held out with --split timm-family (default 0.25)")
    p.add_argument("--seed", type=int_flag("--seed"), default=0, help="split and training seed (default 0)")


def parse_devices(text: str | None) -> list[str] | None:
    """``a,b`` -> ``["a", "b"]``; ``None`` for none."""
    return [d.strip() for d in text.split(",") if d.strip()] if text else None


def checked_devices(values: list[str] | None) -> list[str] | None:
    """Catalogue ids of a list flag, checked (an unknown id is a usage error with the closest ids)."""
    return device_ids(values) if values else None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the GraphSAGE predictor on a dataset and write a checkpoint",
                       description="Train a K-member GraphSAGE ensemble; the test split is only used to "
                                   "report held-out metrics, which go into the checkpoint's metadata.")
    add_split_args(p)
    p.add_argument("--out", required=True, help="checkpoint path (.pt); a .json metadata sidecar is written next to it")
    p.add_argument("--hidden", type=int_flag("--hidden", low=1), default=64, help="hidden width (default 64)")
    p.add_argument("--layers", type=int_flag("--layers", low=1), default=3, help="GraphSAGE blocks (default 3)")
    p.add_argument("--members", type=int_flag("--members", low=1), default=5, help="ensemble members K (default 5)")
    p.add_argument("--epochs", type=int_flag("--epochs", low=1), default=200, help="maximum epochs (default 200)")
    p.add_argument("--patience", type=int_flag("--patience", low=1), default=30,
                   help="early-stopping patience in epochs (default 30)")
    p.add_argument("--batch-size", type=int_flag("--batch-size", low=1), default=64,
                   help="graphs per step (default 64)")
    p.add_argument("--lr", type=float_flag("--lr", low=0, low_inclusive=False), default=3e-3,
                   help="learning rate (default 3e-3)")
    p.add_argument("--correction-penalty", default="0", metavar="[TARGET=]W[,...]",
                   help="add W x the mean squared log-correction of the prior to the loss: one W for every target, "
                        "or per target, e.g. latency_ms=1 (default 0: off)")
    p.add_argument("--style", choices=("ours", "dippm"), default="ours", help="feature style (dippm = ablation)")
    p.add_argument("--no-prior-residual", action="store_true", help="predict log targets directly, not prior corrections")
    p.add_argument("--time-budget", type=float_flag("--time-budget", low=0, low_inclusive=False), default=840.0,
                   help="training wall-clock budget, seconds (default 840)")
    p.add_argument("--targets", default=None,
                   help="comma-separated targets to learn (latency_ms,energy_j,memory_mib; default: all with labels)")
    p.add_argument("--threads", type=int_flag("--threads", low=1), default=2,
                   help="torch intra-op threads while training (default 2)")
    p.add_argument("--source-note", action="append", default=[], help="data-source description for the metadata")
    p.add_argument("--report", default=None, help="write the held-out metrics and test rows as JSON here")
    p.add_argument("--dtypes", default=None,
                   help="comma-separated compute dtypes whose rows train the model (default: all in the data)")
    p.add_argument("--prior-params", default=None, metavar="JSON",
                   help="analytic-prior constants to train on and pin in the checkpoint (a calibration file written "
                        "by scripts/fit/calibrate_prior.py or calibrate_host_prior.py; default: the shipped ones)")
    add_json_flag(p, "the split sizes, timings and held-out metrics as one object")
    p.set_defaults(func=run)


def _penalty(text: str) -> float | dict[str, float]:
    """``"1"`` -> 1.0; ``"latency_ms=1,memory_mib=0.1"`` -> ``{"latency_ms": 1.0, "memory_mib": 0.1}``."""
    try:
        if "=" not in text:
            return float(text)
        return {t.strip(): float(v) for t, _, v in (item.partition("=") for item in text.split(",") if item.strip())}
    except ValueError as e:
        raise UsageError(f"--correction-penalty takes W or TARGET=W[,TARGET=W], got {text!r}") from e


def run(args: argparse.Namespace) -> int:
    from dippm_nas.training import TrainConfig, train_predictor
    from dippm_nas.prior import PriorParams

    inputs = [p for p in (args.data, args.prior_params) if p]
    writable_output(args.out, "--out", inputs=inputs)  # before the training, not after it
    if args.report:
        writable_output(args.report, "--report", inputs=inputs)

    cfg = TrainConfig(hidden=args.hidden, layers=args.layers, members=args.members, epochs=args.epochs,
                      patience=args.patience, batch_size=args.batch_size, lr=args.lr, style=args.style,
                      residual_on_prior=not args.no_prior_residual, time_budget_s=args.time_budget, seed=args.seed,
                      threads=args.threads, correction_penalty=_penalty(args.correction_penalty))
    holdout = [h for h in args.holdout.split(",") if h]
    command = "dippm-nas " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    pred, report = train_predictor(args.data, args.device, split=args.split, heldout_families=holdout,
                                   devices=checked_devices(args.train_devices), cfg=cfg,
                                   data_sources=args.source_note or args.data, command=command,
                                   targets=parse_devices(args.targets), holdout_frac=args.holdout_frac,
                                   dtypes=parse_devices(args.dtypes),
                                   prior_params=PriorParams.load(args.prior_params) if args.prior_params else None)
    pred.save(args.out)
    if args.report:
        report["history"] = cfg.history
        write_output(args.report, json.dumps(report, indent=1, default=str), "--report", error=UsageError,
                     inputs=inputs)
    if args.json:
        keep = ("sizes", "featurize_s", "train_s", "metrics", "timm_heldout_metrics")
        print(json_text({"checkpoint": str(args.out), **{k: report[k] for k in keep if k in report}}))
        return 0
    print(f"wrote {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB) and {Path(args.out).with_suffix('.json')}")
    print(f"split sizes {report['sizes']}; featurise {report['featurize_s']:.0f} s, train {report['train_s']:.0f} s")
    for t, m in report.get("metrics", {}).items():
        print(f"  {t:18s} " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()))
    for dev, tab in report.get("timm_heldout_metrics", {}).items():
        print(f"held-out timm families on {dev}:")
        for t, m in tab.items():
            print(f"  {t:18s} " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()))
    return 0
