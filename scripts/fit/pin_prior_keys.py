"""Copy named constants of a calibration file into a checkpoint's pinned prior constants.

A checkpoint pins the prior constants it was trained with (``CheckpointMeta.prior_params``), so a later
calibration of the package changes none of its answers. A constant the checkpoint never used for its training
graphs can be pinned afterwards without retraining: the FP64 efficiency, for instance, changes only float64
graphs' priors. A correction the network learnt against the old constants does not apply to the new ones, so
``--prior-only-dtype`` names the dtypes whose graphs the checkpoint then answers with its (new) prior, the
correction withheld (``CheckpointMeta.prior_only_dtypes``, ``details["prior_only_dtype"] = 1``).

Usage::

    python scripts/fit/pin_prior_keys.py --checkpoint dippm_nas/predictor/checkpoints/a100-sxm4-40gb.accel-timm-tv.pt \\
        --calibration dippm_nas/prior/calibration/fitted.json \\
        --key op_classes.conv.eta_compute_fp64 --key op_classes.matmul.eta_compute_fp64 \\
        --key host_model.metrics.sigma_log_gpu_bound_float64 --prior-only-dtype float64 --out NEW.pt

Each ``--key`` is a dotted path into the calibration JSON; it is created in the pinned constants when missing
there. The checkpoint's notes record what was copied, from where, and the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from dippm_nas.predictor import GnnPredictor
from dippm_nas.prior import PriorParams


def _get(d: dict[str, Any], path: str) -> Any:
    cur: Any = d
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise SystemExit(f"--key {path!r}: {part!r} is not in the calibration file")
        cur = cur[part]
    return cur


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    cur = d
    for part in head:
        if not isinstance(cur.get(part), dict):
            raise SystemExit(f"--key {path!r}: the checkpoint's pinned constants have no {part!r} to hold it")
        cur = cur[part]
    cur[last] = value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, type=Path, help="checkpoint .pt whose pinned constants change")
    ap.add_argument("--calibration", required=True, type=Path, help="calibration JSON the values come from")
    ap.add_argument("--key", action="append", required=True, help="dotted path of a value to copy (repeatable)")
    ap.add_argument("--prior-only-dtype", action="append", default=[], metavar="DTYPE",
                    help="a dtype the changed constants price: its graphs get the prior, the correction withheld")
    ap.add_argument("--out", required=True, type=Path, help="checkpoint .pt to write (and its .json sidecar)")
    args = ap.parse_args(argv)

    pred = GnnPredictor.load(args.checkpoint, load_calibration=False, engine="torch")
    if pred.meta.prior_params is None:
        raise SystemExit(f"{args.checkpoint} pins no prior constants: it answers with the package's")
    src = json.loads(args.calibration.read_text(encoding="utf-8"))
    pinned = json.loads(json.dumps(pred.meta.prior_params))
    copied = []
    for key in args.key:
        value = _get(src, key)
        _set(pinned, key, value)
        copied.append(f"{key} = {value!r}")
    PriorParams.from_dict(pinned, origin="the new pinned constants")  # refuse what the prior would refuse
    cmd = "python " + shlex.join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])])
    only = sorted(set(pred.meta.prior_only_dtypes) | set(args.prior_only_dtype))
    note = (f" Pinned constants copied after training from {args.calibration.name} ({'; '.join(copied)})"
            + (f"; {', '.join(only)} graphs get the prior (prior_only_dtypes)" if only else "") + f": {cmd}.")
    pred.meta = dataclasses.replace(pred.meta, prior_params=pinned, prior_only_dtypes=only,
                                    notes=(pred.meta.notes or "") + note)
    pred.meta.check()
    pred.save(args.out)
    print(f"wrote {args.out}: {'; '.join(copied)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
