#!/usr/bin/env python
"""Pick the timm benchmark rows the A100 checkpoint trains on (up to N models per timm family, three GPUs).

Usage (from the repository root)::

    python scripts/make_timm_subset.py --data ../shared/data --out timm_all.csv --per-family 1000
    PYTHONPATH=. .venv-vision/bin/dippm-nas dataset import timm timm_all.csv --out timm.sqlite --workers 2

Rule: rows of
``timm_benchmark_infer_gpu.csv`` from the amp / NCHW / eager runs on RTX 3090 (pt240-cu124), RTX 4090
(pt291-cu128) and RTX 5090 (pt291-cu130) with a positive ``infer_step_time``; only models measured on all
three, with at most 120 M parameters and images of at most 384 px; families are the model name without a
``tf_``/``gluon_``/``legacy_`` prefix up to the first non-letter; up to ``--per-family`` models per family
(seeded shuffle), written in a seeded mixed-family order so that an import stopped early still covers
many families. The shipped checkpoint trains on every model this picks with ``--per-family 1000``: 901
models of 140 families (``docs/predictor_report.md``, "A100 training data"). Needs timm for the graphs
(``.venv-vision``).
"""

from __future__ import annotations

import argparse
import collections
import csv
import random
import re
from collections.abc import Sequence
from pathlib import Path

FILES = ("results/benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv",
         "results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
         "results/benchmark-infer-amp-nchw-pt291-cu130-5090.csv")
MAX_MPARAMS = 120.0
MAX_IMAGE = 384


def family(model: str) -> str:
    """``tf_efficientnet_b0`` -> ``efficientnet``: the name without a framework prefix, letters only."""
    m = re.sub(r"^(tf|gluon|legacy)_", "", model)
    return re.match(r"[a-z]*", m).group(0) or m  # type: ignore[union-attr]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="folder holding timm_benchmark_infer_gpu.csv")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--per-family", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", action="append", default=None,
                    help="keep only this family (as family() names it, e.g. efficientformerv); repeatable")
    args = ap.parse_args(argv)
    with open(args.data / "timm_benchmark_infer_gpu.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["source_file"] in FILES]
    by: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for r in rows:
        try:
            if float(r["infer_step_time"]) <= 0:
                continue
        except ValueError:
            continue
        by[r["model"]][r["source_file"]] = r
    on_all = {m: d for m, d in by.items() if len(d) == len(FILES)}

    def small(d: dict[str, dict]) -> bool:
        r = next(iter(d.values()))
        return float(r["param_count"] or 0) <= MAX_MPARAMS and int(float(r["infer_img_size"])) <= MAX_IMAGE

    cand = {m: d for m, d in on_all.items() if small(d)}
    fams: dict[str, list[str]] = collections.defaultdict(list)
    for m in sorted(cand):
        if args.family is None or family(m) in args.family:
            fams[family(m)].append(m)
    rng = random.Random(args.seed)
    pick: list[str] = []
    for _, ms in sorted(fams.items()):
        rng.shuffle(ms)
        pick += ms[:args.per_family]
    rng.shuffle(pick)
    with open(args.out, "w", newline="") as fo:
        w = csv.DictWriter(fo, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for m in pick:
            for f in sorted(cand[m]):
                w.writerow(cand[m][f])
    print(f"models on all 3 GPUs: {len(on_all)}, within the size limits: {len(cand)}, families: {len(fams)}, "
          f"picked: {len(pick)} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
