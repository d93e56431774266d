#!/usr/bin/env python
"""Which form of a reparameterisable timm model did each GPU's benchmark time: multi-branch or fused?

Usage (needs timm: ``.venv-vision``)::

    PYTHONPATH=. .venv-vision/bin/python benchmarks/measurement/timm_reparam_labels.py --data timm.sqlite \\
        [--models mobileone_s0,mobileone_s1,repvgg_a2,repvit_m1]

DATA is a dataset file made by ``dippm-nas dataset import timm`` (its timm rows: model, image size, batch,
GPU, measured ``latency_ms``). For each model the script captures the model as timm builds it (the
multi-branch training form, which the importer captures) and after ``timm.utils.model.reparameterize_model``
(the fused inference form), and prints each GPU's measured latency beside the analytic prior of both graphs.
The prior is off by ~15 % on a typical model, while fusing the branches changes it by 1.2-5.5x on these
models, so whichever of the two priors lies near the label tells which form was timed. No label is changed
or fitted here.

With ``--csv timm_benchmark_infer_gpu.csv`` it also prints, per model family, the RTX 4090's published
throughput in the pt291 run over the pt240 run (same GPU, both amp / NCHW / eager): a family timed fused in
one run and multi-branch in the other stands out from the ~1.0 of the rest. This is the evidence behind the
importer's ``_TIMM_REPARAM_TAGS``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dippm_nas import InputSpec, capture  # noqa: E402
from dippm_nas.prior import estimate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="a timm dataset file (SQLite)")
    ap.add_argument("--models", default="mobileone_s0,mobileone_s1,repvgg_a2,repvit_m1")
    ap.add_argument("--csv", type=Path, help="timm_benchmark_infer_gpu.csv: also print the pt291/pt240 ratios")
    ap.add_argument("--top", type=int, default=12, help="families printed at each end of the ratio table")
    args = ap.parse_args()
    if args.csv is not None:
        _print_run_ratios(args.csv, args.top)
    warnings.filterwarnings("ignore")
    import timm
    from timm.utils.model import reparameterize_model

    con = sqlite3.connect(f"file:{args.data}?mode=ro", uri=True)
    print("| model | GPU | batch | measured ms | prior, multi-branch graph | prior, reparameterised graph | closer |")
    print("|---|---|---|---|---|---|---|")
    for name in [m for m in args.models.split(",") if m]:
        rows = con.execute(
            "SELECT device, latency_ms, batch_size, config FROM measurements WHERE status = 'ok' AND source = 'timm' "
            "AND json_extract(config, '$.model') = ? ORDER BY device", (name,)).fetchall()
        if not rows:
            print(f"| {name} | no row in {args.data} | | | | | |")
            continue
        model = timm.create_model(name, pretrained=False).eval()
        graphs = {}
        for device, measured, batch, config in rows:
            img = int(json.loads(config)["img_size"])
            spec = InputSpec(shape=(3, img, img), batch_size=int(batch), dtype="float16")
            if (img, batch) not in graphs:
                graphs[(img, batch)] = (capture(model, spec, cache=False),
                                        capture(reparameterize_model(model), spec, cache=False))
            multi, fused = (estimate(g, device).latency_ms for g in graphs[(img, batch)])
            closer = "reparameterised" if abs(fused / measured - 1) < abs(multi / measured - 1) else "multi-branch"
            print(f"| {name} | {device} | {batch} | {measured:.1f} | {multi:.1f} | {fused:.1f} | {closer} |")
    con.close()
    return 0


_RUNS = {"pt240": "results/benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv",
         "pt291": "results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv"}


def _print_run_ratios(csv_path: Path, top: int) -> None:
    import csv
    import statistics

    from dippm_nas.training import timm_family

    runs: dict[str, dict[tuple[str, str], float]] = {k: {} for k in _RUNS}
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            for tag, src in _RUNS.items():
                if r["source_file"] == src and r["infer_samples_per_sec"] and float(r["infer_samples_per_sec"]) > 0:
                    runs[tag][(r["model"], r["infer_img_size"])] = float(r["infer_samples_per_sec"])
    ratios = {k: runs["pt291"][k] / runs["pt240"][k] for k in runs["pt240"] if k in runs["pt291"]}
    if not ratios:
        print(f"no model in both RTX 4090 runs of {csv_path}")
        return
    fams: dict[str, list[float]] = {}
    for (model, _img), r in ratios.items():
        fams.setdefault(timm_family(model), []).append(r)
    rows = sorted(((statistics.median(v), f, len(v)) for f, v in fams.items()), reverse=True)
    print(f"RTX 4090 throughput, pt291 run / pt240 run: median {statistics.median(ratios.values()):.3f} over "
          f"{len(ratios)} models, {len(fams)} families\n")
    print("| family | models | median ratio |")
    print("|---|---|---|")
    shown = rows if len(rows) <= 2 * top else rows[:top] + [(float("nan"), "...", 0)] + rows[-top:]
    for med, fam, n in shown:
        print(f"| {fam} | {n or ''} | {med:.2f} |" if n else "| ... | | |")
    print()


if __name__ == "__main__":
    raise SystemExit(main())
