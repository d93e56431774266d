#!/usr/bin/env python
"""Give a checkpoint its novelty-graded std floor, fitted on families it never saw; report before/after.

Usage (from the repository root)::

    python scripts/fit/fit_novelty_floor.py --checkpoint CKPT.pt --data DATA [--data DATA2] --device D \\
        --split family --holdout resnet,vit --calibrate-families resnet --out CKPT_novel.pt
    python scripts/fit/fit_novelty_floor.py ... --split timm-family --holdout-frac 0.25 \\
        --calibrate-frac 0.5 --out CKPT_novel.pt          # half of the held-out timm families calibrate

The split is rebuilt exactly as ``dippm-nas train`` made it (same ``--split/--holdout/--holdout-frac/--seed``):
the reference set is the training rows' graphs. ``d0`` (which graphs ``details["novel"]`` calls novel) comes
from the validation rows of every device: the largest of each data source's 95th percentile (``--d0-rows
source``, the default), or the pooled quantile (``all``), or the validation rows of ``--device`` only
(``device``). The largest novelty among the **test rows of the calibration families** (all devices, or
``--calibrate-devices``) is the checkpoint's ``validated_max``: beyond it the network's correction has never
been checked, and the prior answers (``--no-validated-max`` leaves the correction unlimited).

The floor (``--floor-kind graded``, the default) grows with novelty: it is fitted on the validation rows of
every device and source plus the calibration families' test rows, in bins of novelty of at least
``--min-rows`` rows, each bin holding 95 % within ±2σ, made non-decreasing
(:func:`dippm_nas.training.fit_graded_floor`). ``--floor-kind scalar`` fits one novel floor on the
calibration families' novel rows instead (a step at ``d0``). The other held-out families and the in-family
test rows are the report: their MAPE does not change (the floor only widens σ), their ±2σ coverage is
printed before and after. Fit rows never come from the rows reported on. See
:mod:`dippm_nas.predictor._novelty` and :mod:`dippm_nas.training`.

Every target the checkpoint was trained on gets its own floor. ``--floor-log [TARGET=]X --calibrated-on TEXT``
(repeatable; a bare number is ``latency_ms``) sets the floors instead of fitting them, e.g. to give a checkpoint
trained on every family (no unseen family left to calibrate on) the floor fitted with its family-split
twin; ``d0`` is still computed from its own validation rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dippm_nas.cli import add_split_args, parse_devices  # noqa: E402
from dippm_nas.predictor import GnnPredictor, NoveltyFloor, collate_globals, novelty_scores  # noqa: E402
from dippm_nas.training import (  # noqa: E402
    GRADED_MIN_ROWS, Example, attach_novelty_reference, evaluate_examples, featurize_examples, fit_graded_floor,
    fit_novel_floor, is_timm, load_examples, split_d0, split_examples, split_fraction, timm_family,
)
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import output_path, write_output

DEFAULT_TARGET = "latency_ms"


def _slug(group: str) -> str:
    """A file-name form of a report group's label."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in group).strip("_")


def _write_rows(path: Path, group: str, rows: Sequence[dict]) -> None:
    """One JSON line per evaluated row of ``group``."""
    with output_path(path, "output file", error=InvalidValueError) as tmp, tmp.open("w") as f:
        for r in rows:
            f.write(json.dumps({"group": group, **{k: v for k, v in r.items() if isinstance(v, (int, float, str))}})
                    + "\n")


def parse_floors(items: Sequence[str]) -> dict[str, float]:
    """``["0.11", "memory_mib=0.05"]`` -> ``{"latency_ms": 0.11, "memory_mib": 0.05}``."""
    out = {}
    for it in items:
        t, _, v = it.rpartition("=")
        out[t or DEFAULT_TARGET] = float(v)
    return out


def row_family(e: Example) -> str:
    """The family a row is held out by: the timm family for timm rows, else the search space."""
    return timm_family(e.name) if is_timm(e) and e.name else e.family


def _summary(table: dict, rows: Sequence[dict], label: str, target: str) -> dict:
    """The evaluation metrics of ``target`` (``evaluate_examples``' table) plus the share of novel graphs."""
    if target not in table:
        return {"n": 0}
    out = {**table[target], "novel_share": float(np.mean([r["novel"] for r in rows if target in r]))}
    print(f"  {label + ', ' + target:64s} n {out['n']:5d}  MAPE {out['mape_pct']:6.2f} %  tau {out['kendall_tau']:.3f}"
          f"  within ±2σ {out['coverage_2sigma']:.3f}  novel {out['novel_share']:.2f}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_split_args(ap)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True, help="checkpoint to write (.pt, with its .json)")
    ap.add_argument("--calibrate-families", default="", help="comma-separated held-out families to fit on")
    ap.add_argument("--calibrate-frac", type=float, default=None,
                    help="instead: this share of the held-out families (by a seeded hash) calibrates")
    ap.add_argument("--calibrate-other", action="store_true",
                    help="with --calibrate-frac: calibrate on the held-out families it does NOT pick (the other fold; "
                         "the families it picks then report)")
    ap.add_argument("--calibrate-devices", default=None, help="comma-separated devices of calibration rows (default all)")
    ap.add_argument("--floor-log", action="append", default=[], metavar="[TARGET=]X",
                    help="set this floor instead of fitting one (repeatable; bare number: latency_ms)")
    ap.add_argument("--calibrated-on", default=None, help="with --floor-log: where the floor came from")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--no-validated-max", action="store_true",
                    help="do not limit the correction to the novelty of the calibration rows (by default a graph "
                         "farther from the training graphs than every calibration row gets the prior)")
    ap.add_argument("--d0-rows", choices=("source", "all", "device"), default="source",
                    help="d0: the largest of each data source's validation quantile over every device's rows "
                         "(source, default), the quantile of every device's validation rows pooled (all), or of "
                         "--device's only (device)")
    ap.add_argument("--floor-kind", choices=("graded", "scalar"), default="graded",
                    help="graded (default): a floor growing with novelty, fitted on the validation rows of every "
                         "source and the calibration families' rows; scalar: one novel floor above d0, fitted on "
                         "the calibration families' novel rows")
    ap.add_argument("--min-rows", type=int, default=GRADED_MIN_ROWS,
                    help=f"fewest fit rows per novelty bin of a graded floor (default {GRADED_MIN_ROWS})")
    ap.add_argument("--rows-out", default=None, metavar="PREFIX",
                    help="write each report group's rows (measured, predicted, std, novel; with the floor) as "
                         "PREFIX<group>.jsonl, e.g. for benchmarks/accuracy/search_view.py --rows")
    args = ap.parse_args(argv)
    if args.calibrate_other and args.calibrate_frac is None:
        raise SystemExit("--calibrate-other picks the families --calibrate-frac leaves out: give --calibrate-frac")
    if args.json and Path(args.json).resolve() == Path(args.out).with_suffix(".json").resolve():
        raise SystemExit(f"--json {args.json} is the checkpoint's metadata sidecar; choose another path")

    pred = GnnPredictor.load(args.checkpoint, device=args.device, load_calibration=False)
    dev = pred.device
    ex = load_examples(args.data, devices=parse_devices(args.train_devices))
    holdout = [h for h in args.holdout.split(",") if h]
    tr, va, te = split_examples(ex, mode=args.split, heldout_families=holdout, seed=args.seed,
                                holdout_frac=args.holdout_frac)
    pp, style = pred.prior_params, pred.meta.feature_style
    print(f"split {args.split}: train {len(tr)}, val {len(va)}, test {len(te)}; featurising ...", flush=True)
    ftr = featurize_examples(tr, style=style, prior_params=pp, host_threads=pred.host_threads)
    fva = featurize_examples(va, style=style, prior_params=pp, host_threads=pred.host_threads)
    attach_novelty_reference(pred, ftr, fva)  # reference set (and a pooled d0); no floor yet
    with torch.no_grad():
        nov_va = novelty_scores(pred.model.static_z(collate_globals(fva)), pred.novelty_ref)
    if args.d0_rows == "device":
        d0 = split_d0(nov_va[[e.device == dev for e in va]])
    else:
        d0 = split_d0(nov_va, groups=[e.source for e in va] if args.d0_rows == "source" else None)
    pred.meta = dataclasses.replace(pred.meta, novelty={**pred.meta.novelty, "d0": d0})
    print(f"reference set {tuple(pred.novelty_ref.shape)}, d0 = {d0:.4f} (validation quantile, --d0-rows "
          f"{args.d0_rows})")

    # families that can calibrate: held-out ones (the timm split's test also holds random in-family rows)
    test_fams = sorted({row_family(e) for e in te if args.split != "timm-family" or is_timm(e)})
    if args.floor_log:
        cal_fams: list[str] = []
    elif args.calibrate_frac is not None:
        picked = {f for f in test_fams if split_fraction(f"novelty-calibration:{f}", args.seed) < args.calibrate_frac}
        cal_fams = [f for f in test_fams if (f in picked) != args.calibrate_other]
    else:
        cal_fams = [f for f in args.calibrate_families.split(",") if f]
    unknown = sorted(set(cal_fams) - set(test_fams))
    if unknown:
        raise SystemExit(f"calibration families {unknown} have no test rows; held-out families: {test_fams}")
    cal_devs = parse_devices(args.calibrate_devices)
    cal = [e for e in te if row_family(e) in cal_fams and (cal_devs is None or e.device in cal_devs)]
    rep = [e for e in te if row_family(e) not in cal_fams]
    print(f"calibration: {len(cal)} rows of {len(cal_fams)} families; report: {len(rep)} rows")

    res: dict = {"d0": d0, "calibration_families": cal_fams, "before": {}, "after": {}}
    fcal = featurize_examples(cal, style=style, prior_params=pp, host_threads=pred.host_threads) if cal else []
    frep = featurize_examples(rep, style=style, prior_params=pp, host_threads=pred.host_threads)
    targets = list(pred.meta.targets)
    vmax: float | None = None
    graded: dict[str, tuple[tuple[float, float], ...]] = {}
    if args.floor_log:
        floors = parse_floors(args.floor_log)
        bad = sorted(set(floors) - set(targets))
        if bad:
            raise SystemExit(f"--floor-log targets {bad} are not trained by this checkpoint: {targets}")
        note = args.calibrated_on or "set by hand (--floor-log)"
    else:
        if not cal:
            raise SystemExit("no calibration rows: give --calibrate-families or --calibrate-frac (or --floor-log)")
        _, rows = evaluate_examples(pred, fcal, cal)  # σ with the in-family floor (novel floor still empty)
        vmax = max((float(r["novelty"]) for r in rows if math.isfinite(r.get("novelty", math.nan))), default=None)
        if args.no_validated_max:
            vmax = None
        res["validated_max"] = vmax
        floors, used = {}, {}
        if args.floor_kind == "graded":
            # the fit rows as the checkpoint will answer them: the prior beyond validated_max (every target
            # with a floor entry is limited), σ with the in-family floor only (the floors are 0 here)
            pred.meta = dataclasses.replace(pred.meta, novelty=NoveltyFloor(
                d0, {t: 0.0 for t in targets}, "fitting", validated_max=vmax).to_dict())
            _, vrows = evaluate_examples(pred, fva, va)
            _, rows = evaluate_examples(pred, fcal, cal)
            rows = vrows + rows
            res["fit_rows"] = {"validation": len(vrows), "calibration families": len(cal)}
        for t in targets:
            rs = [r for r in rows if t in r]
            err = np.array([abs(math.log(r[t] / r[f"{t}_pred"])) for r in rs])
            sig = np.array([r[f"{t}_std"] / r[f"{t}_pred"] for r in rs])
            nov = np.array([r.get("novelty", math.nan) for r in rs])
            novel = nov > d0
            if args.floor_kind == "graded":
                graded[t] = fit_graded_floor(nov, err, sig, min_rows=args.min_rows)
                floors[t] = float(np.interp(d0, [k[0] for k in graded[t]], [k[1] for k in graded[t]]))
                used[t] = (int(np.isfinite(nov).sum()), "graded")
                res.setdefault("calibration_rows", {})[t] = int(np.isfinite(nov).sum())
            else:
                use = novel if novel.sum() >= 20 else np.ones_like(novel)
                floors[t] = fit_novel_floor(err[use], sig[use])
                used[t] = (int(use.sum()), "novel ones" if use is novel else "all")
                res.setdefault("calibration_rows", {})[t] = int(use.sum())
            res.setdefault("novel_share_calibration", {})[t] = float(novel.mean())
        if args.floor_kind == "graded":
            note = (", ".join(f"{t}: {n} rows" for t, (n, _) in used.items())
                    + f" (the validation rows of every device and source, {res['fit_rows']['validation']}, and the "
                    f"test rows of held-out families {','.join(cal_fams)}; {args.split} split, seed {args.seed}); "
                    f"graded by novelty in bins of at least {args.min_rows} rows, each fitted for 95 % within ±2σ")
        else:
            note = (", ".join(f"{t}: {n} test rows ({kind})" for t, (n, kind) in used.items())
                    + f" of held-out families {','.join(cal_fams)} ({args.split} split, seed {args.seed});"
                    " fitted for 95 % within ±2σ")
    res["floor_log"] = floors
    if graded:
        res["graded_floor_log"] = {t: [list(k) for k in g] for t, g in graded.items()}
        for t, g in graded.items():
            print(f"graded floor (log) of {t}: " + ", ".join(f"{n:.3f}: {f:.4f}" for n, f in g))
    print("novel floors (log): " + ", ".join(f"{t} {f:.4f}" for t, f in floors.items()) + f": {note}")
    by_dev_rep: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(rep):  # per device, held-out timm rows apart from the in-family test rows
        by_dev_rep[f"{e.device}, " + ("held-out timm families" if is_timm(e) else f"{e.family} test rows")].append(i)
    after = NoveltyFloor(d0, floors, note, validated_max=vmax, graded_floor_log=graded).to_dict()
    for stage in ("before", "after"):
        # before: the in-family floor only (and no validated-novelty limit)
        pred.meta = dataclasses.replace(pred.meta, novelty=after if stage == "after" else NoveltyFloor(
            d0, {}, "no novelty floor").to_dict())
        print(stage)
        for d, idx in sorted(by_dev_rep.items()):
            table, rows = evaluate_examples(pred, [frep[i] for i in idx], [rep[i] for i in idx])
            for r in rows:
                r["novel"] = float(r.get("novelty", 0.0) > d0)
            res[stage][d] = {t: _summary(table, rows, d, t) for t in targets}
            if stage == "after" and args.rows_out:
                _write_rows(Path(f"{args.rows_out}{_slug(d)}.jsonl"), d, rows)
    pred.save(args.out)
    print(f"wrote {args.out}")
    if args.json:
        write_output(args.json, json.dumps(res, indent=1), "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
