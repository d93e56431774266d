#!/usr/bin/env python
"""How many well-known models a checkpoint calls ``novel`` or outside its training range, by batch and dtype.

Usage (needs torchvision: the ``torch==2.14.1 torchvision==0.29.1`` pair, e.g. ``.venv-vision``)::

    PYTHONPATH=. .venv-vision/bin/python benchmarks/coverage/novelty_share.py [--checkpoint CKPT.pt] \\
        [--batches 1,8,32,128,256] [--dtypes float16,float32] [--json out.json]

Every torchvision classification model of :data:`MODELS` (random weights, 224x224) is captured at each batch
and dtype and predicted for the checkpoint's device. The script prints one line per (batch, dtype): the share
of models with ``details["novel"] = 1`` (far from every training graph: σ gets the novel floor) and with
``details["outside_training_range"] = 1`` (batch, size or dtype beyond the training rows), and the median
relative σ. It measures what the flags do, not accuracy: no label of these models is read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._common import write_text  # noqa: E402

#: torchvision classification models, one or two per family
MODELS = ("alexnet", "vgg16", "resnet18", "resnet50", "resnet101", "wide_resnet50_2", "resnext50_32x4d",
          "densenet121", "googlenet", "inception_v3", "squeezenet1_1", "shufflenet_v2_x1_0", "mobilenet_v2",
          "mobilenet_v3_large", "mnasnet1_0", "efficientnet_b0", "efficientnet_v2_s", "regnet_y_800mf",
          "convnext_tiny", "vit_b_16", "swin_t", "maxvit_t")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="checkpoint to score (default: the shipped one of --device)")
    ap.add_argument("--device", default="a100-sxm4-40gb", help="catalogue id (default a100-sxm4-40gb)")
    ap.add_argument("--batches", default="1,8,32,128,256", help="comma-separated batch sizes")
    ap.add_argument("--dtypes", default="float16,float32", help="comma-separated compute dtypes")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated torchvision model names")
    ap.add_argument("--json", type=Path, default=None, help="write the per-model flags here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch

    import dippm_nas as dn
    from dippm_nas.predictor import GnnPredictor, set_predictor

    torch.set_num_threads(1)
    if args.checkpoint:
        set_predictor(args.device, GnnPredictor.load(args.checkpoint, device=args.device, load_calibration=False))
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    models = args.models.split(",")
    rows: list[dict[str, object]] = []
    print("| batch | dtype | models | novel | outside range | median σ / mean |")
    print("|---|---|---|---|---|---|")
    for bs in batches:
        for dt in dtypes:
            group = []
            for m in models:
                spec = dn.InputSpec(shape=(3, 299, 299) if m == "inception_v3" else (3, 224, 224),
                                    batch_size=bs, dtype=dt)
                pr = dn.predict(f"torchvision:{m}", spec, device=args.device, mig=False)
                d = pr.details
                group.append({"model": m, "batch": bs, "dtype": dt, "latency_ms": pr.latency_ms,
                              "latency_ms_std": pr.latency_ms_std, "novel": int(d.get("novel", 0)),
                              "outside_training_range": int(d.get("outside_training_range", 0)),
                              "novelty": d.get("novelty")})
            rows += group
            n = len(group)
            novel = sum(r["novel"] for r in group) / n
            outside = sum(r["outside_training_range"] for r in group) / n
            rel = statistics.median(r["latency_ms_std"] / r["latency_ms"] for r in group)
            print(f"| {bs} | {dt} | {n} | {100 * novel:.0f} % | {100 * outside:.0f} % | {100 * rel:.1f} % |",
                  flush=True)
    n = len(rows)
    print(f"all: {n} predictions, novel {100 * sum(r['novel'] for r in rows) / n:.0f} %, outside range "
          f"{100 * sum(r['outside_training_range'] for r in rows) / n:.0f} %")
    if args.json:
        write_text(args.json, json.dumps(rows, indent=1), "--json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
