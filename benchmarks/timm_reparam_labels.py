#!/usr/bin/env python
"""Which form of a reparameterisable timm model did each GPU's benchmark time: multi-branch or fused?

Usage (needs timm: ``.venv-vision``)::

    PYTHONPATH=. .venv-vision/bin/python benchmarks/timm_reparam_labels.py --data timm.sqlite \\
        [--models mobileone_s0,mobileone_s1,repvgg_a2,repvit_m1]

DATA is a dataset file made by ``dippm-nas dataset import timm`` (its timm rows: model, image size, batch,
GPU, measured ``latency_ms``). For each model the script captures the model as timm builds it (the
multi-branch training form, which the importer captures) and after ``timm.utils.model.reparameterize_model``
(the fused inference form), and prints each GPU's measured latency beside the analytic prior of both graphs.
The prior is off by ~15 % on a typical model, while fusing the branches changes it by 1.2-5.5x on these
models, so whichever of the two priors lies near the label tells which form was timed. No label is changed
or fitted here.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dippm_nas import InputSpec, capture  # noqa: E402
from dippm_nas.prior import estimate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="a timm dataset file (SQLite)")
    ap.add_argument("--models", default="mobileone_s0,mobileone_s1,repvgg_a2,repvit_m1")
    args = ap.parse_args()
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


if __name__ == "__main__":
    raise SystemExit(main())
