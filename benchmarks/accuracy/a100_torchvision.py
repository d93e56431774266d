#!/usr/bin/env python
"""A100 predictions for well-known torchvision models (random weights): a sanity table, not an accuracy figure.

Usage (needs torchvision: the ``torch==2.14.1 torchvision==0.29.1`` pair, e.g. ``.venv-vision``)::

    PYTHONPATH=. .venv-vision/bin/python benchmarks/accuracy/a100_torchvision.py [--checkpoint OTHER.pt ...]

Prints, per model and checkpoint, the predicted latency ± σ, the analytic prior pinned in the checkpoint,
and whether the graph is outside the training range / novel. No A100 label of these models exists in this
repository and none may be used to tune anything: the table shows what a user gets, and how wide σ is.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CASES = [("resnet50", 8, "float32"), ("resnet50", 256, "float16"), ("efficientnet_b0", 32, "float32"),
         ("efficientnet_b0", 256, "float16"), ("vit_b_16", 8, "float32"), ("densenet121", 8, "float32"),
         ("mobilenet_v3_large", 64, "float16")]
DEVICE = "a100-sxm4-40gb"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", action="append", default=[],
                    help="checkpoint(s) to compare (default: the shipped one)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch

    import dippm_nas as dn
    from dippm_nas.predictor import GnnPredictor, find_checkpoint, set_predictor

    torch.set_num_threads(1)
    ckpts = args.checkpoint or [str(find_checkpoint(DEVICE))]
    print("| checkpoint | model | batch | dtype | predicted ms ± σ | pinned prior ms | outside range | novel |")
    print("|---|---|---|---|---|---|---|---|")
    for ck in ckpts:
        set_predictor(DEVICE, GnnPredictor.load(ck, device=DEVICE, load_calibration=False))
        try:
            for m, bs, dt in CASES:
                t = time.perf_counter()
                pr = dn.predict(f"torchvision:{m}", dn.InputSpec(shape=(3, 224, 224), batch_size=bs, dtype=dt),
                                device=DEVICE, mig=False)
                d = pr.details
                print(f"| {Path(ck).name} | {m} | {bs} | {dt} | {pr.latency_ms:.2f} ± {pr.latency_ms_std:.2f} | "
                      f"{d['prior_latency_ms']:.2f} | {d['outside_training_range']:.0f} | {d.get('novel', 'n/a')} |"
                      f"  <!-- {time.perf_counter() - t:.1f} s -->", flush=True)
        finally:
            set_predictor(DEVICE, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
