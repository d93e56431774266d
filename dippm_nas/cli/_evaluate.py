"""``dippm-nas evaluate --checkpoint CKPT --data DB``: held-out metrics, markdown report and PNG."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from dippm_nas.cli._deployment_flags import add_deployment_args, deployment_flags_given, deployment_from_args
from dippm_nas.cli._grammar import UsageError, argtype, device_ids, json_text, writable_output
from dippm_nas.cli._train import add_split_args, checked_devices
from dippm_nas._files import write_output

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="evaluate a predictor checkpoint on the test split of a dataset",
                       description="Recompute the split (same --split/--holdout/--seed as training) and report "
                                   "MAPE, median APE, Kendall tau and ±2σ coverage per target, with a "
                                   "predicted-vs-measured PNG. Each row is featurised with the execution it "
                                   "records; with the deployment flags, every row is predicted for that "
                                   "deployment as `dippm-nas predict` would (σ included).")
    add_split_args(p)
    p.add_argument("--checkpoint", required=True, help="checkpoint .pt")
    p.add_argument("--out", default="predictor_report.md", help="markdown report path (default predictor_report.md)")
    p.add_argument("--png", default=None, help="predicted-vs-measured PNG path (default: next to --out, when "
                   "matplotlib is installed: the plot extra)")
    p.add_argument("--eval-device", default=None, type=argtype(lambda t: device_ids([t])[0]),
                   help="report on the test rows of this device (default: --device), e.g. an A100 checkpoint "
                        "on RTX 3090 rows through the device features")
    p.add_argument("--json-out", default=None, metavar="PATH", help="also write the metrics and test rows as JSON here")
    p.add_argument("--json", nargs="?", const=True, default=False, action=_JsonFlag,
                   help="print the metrics as one JSON object on stdout (and nothing else)")
    p.add_argument("--calibrate", default="", help="comma-separated k values: also report error after few-shot "
                   "calibration with k measurements of the test set (evaluated on the rest)")
    add_deployment_args(p)
    p.set_defaults(func=run)


class _JsonFlag(argparse.Action):
    """``--json`` is a flag; ``--json PATH`` (the file form of earlier releases) still writes PATH, with a
    deprecation message: it is ``--json-out PATH`` now."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is True:
            namespace.json = True
            return
        print(f"{parser.prog}: warning: --json PATH is deprecated and goes in the next release; use --json-out "
              "PATH (--json is a flag that prints JSON)", file=sys.stderr)
        namespace.json_out = values


def run(args: argparse.Namespace) -> int:
    from dippm_nas.training import scatter_png, write_report
    from dippm_nas.training import evaluate_checkpoint

    try:
        ks = [int(k) for k in args.calibrate.split(",") if k]
    except ValueError:
        raise UsageError(f"--calibrate takes comma-separated ints like 5,20, got {args.calibrate!r}") from None
    holdout = [h for h in args.holdout.split(",") if h]
    deployment = deployment_from_args(args) if deployment_flags_given(args) else None
    if deployment is not None and (ks or (args.eval_device or args.device) != args.device):
        raise UsageError("the deployment flags evaluate the checkpoint's predictions on its own --device, without "
                         "--calibrate or another --eval-device")
    for flag, path in (("--out", args.out), ("--png", args.png), ("--json-out", args.json_out)):
        if path:
            writable_output(path, flag, inputs=[args.checkpoint, args.data])  # before the evaluation
    res = evaluate_checkpoint(args.checkpoint, args.data, device=args.device, split=args.split,
                              heldout_families=holdout, devices=checked_devices(args.train_devices), seed=args.seed,
                              calibrate_ks=ks, eval_device=args.eval_device, holdout_frac=args.holdout_frac,
                              deployment=deployment)
    if not res["n_test"]:
        print(f"no test rows of device {res['device']!r} in this split", file=sys.stderr)
        return 1
    png: Path | None = Path(args.png) if args.png else Path(args.out).with_suffix(".png")
    if args.png is None and importlib.util.find_spec("matplotlib") is None:
        print("no predicted-vs-measured PNG: it needs matplotlib (pip install 'dippm-nas[plot]')", file=sys.stderr)
        png = None
    else:
        scatter_png(res["rows"], "latency_ms", png, title=f"{res['device']} test split ({args.split})")
    under = f", predicted for the deployment: {deployment.label}" if deployment is not None else ""
    sections = [(f"{res['device']}, {args.split} split, test ({res['n_test']} rows){under}", res["metrics"])]
    for k, tab in res.get("calibration", {}).items():
        sections.append((f"after few-shot calibration, {k}", tab))
    intro = f"# Predictor evaluation\n\ncheckpoint `{args.checkpoint}`, data {args.data}"
    write_report(sections, args.out, intro=intro + (f"\n\n![scatter]({png.name})" if png else ""))
    if args.json_out:
        write_output(args.json_out, json.dumps(res, indent=1, default=str), "--json-out", error=UsageError,
                     inputs=[args.checkpoint, args.data])
    summary = {"metrics": res["metrics"], "calibration": res.get("calibration", {})}
    if args.json:
        files = {"report": str(args.out), "png": str(png) if png else None, "json_out": args.json_out}
        print(json_text({**summary, **files}))
        return 0
    print(json_text(summary, indent=1))
    print(f"wrote {', '.join(str(f) for f in (args.out, png, args.json_out) if f)}")
    return 0
