#!/usr/bin/env python
"""Fit a checkpoint's novel-graph correction shrink and std floor on several family-split twins.

Usage (from the repository root)::

    python scripts/fit/fit_novelty_twins.py --data DATA [--data DATA2] --device host-cpu \\
        --twin fam_resnet_vit.pt:resnet,vit --twin fam_densenet_bert.pt:densenet,bert [--twin ...] \\
        --checkpoint SHIP.pt --out SHIP_novel.pt [--json figures.json] [--seed 0]

A *twin* is a checkpoint trained like the shipped one but with some families held out
(``dippm-nas train --split family --holdout A,B --seed S``, its prior fitted without them too). Each
twin is evaluated on the test rows of its held-out families with its own novelty score and ``d0``, with
no shrink and no novel floor. Then, per target (see :mod:`dippm_nas.predictor._novelty`):

- the **shrink width** ``c`` is the grid value whose shrunk predictions have the smallest mean absolute
  log error over all twins' rows (rows at or below their twin's ``d0`` are never shrunk);
- **leave one twin out**: each twin's rows are also scored with the ``c`` fitted on the other twins only,
  which is the figure to quote (no row judges the width it was fitted on);
- the **novel floor** is fitted on the novel rows of all twins, after the shrink, for 95 % within ±2σ.

``--checkpoint`` gets the width and floors (with its own ``d0`` and reference set) and is written to
``--out``. A target whose best width is "no shrink" keeps its whole correction.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dippm_nas.training import SHRINK_GRID, fit_novel_floor, fit_shrink_width  # noqa: E402
from dippm_nas.predictor import NoveltyFloor, correction_weight  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402

#: novel rows needed to fit a floor on them only (else all rows)
MIN_NOVEL_ROWS = 20


def parse_twin(text: str) -> tuple[str, list[str]]:
    """``"fam.pt:resnet,vit"`` -> ``("fam.pt", ["resnet", "vit"])``."""
    path, sep, fams = text.rpartition(":")
    holdout = [f for f in fams.split(",") if f]
    if not sep or not path or not holdout:
        raise argparse.ArgumentTypeError(f"--twin must be CHECKPOINT:FAMILY[,FAMILY...], got {text!r}")
    return path, holdout


def _arrays(rows: Sequence[Mapping[str, Any]], target: str, d0: float) -> dict[str, np.ndarray]:
    rs = [r for r in rows if target in r and r.get(f"{target}_prior") and math.isfinite(r.get("novelty", math.nan))]
    pred = np.array([r[f"{target}_pred"] for r in rs], dtype=np.float64)
    return {
        "y": np.log([r[target] for r in rs]), "p": np.log(pred), "q": np.log([r[f"{target}_prior"] for r in rs]),
        "nov": np.array([r["novelty"] for r in rs]), "sig": np.array([r[f"{target}_std"] for r in rs]) / pred,
        "fam": np.array([r["family"] for r in rs]), "d0": np.full(len(rs), d0),
    }


def _shrunk(a: Mapping[str, np.ndarray], width: float) -> np.ndarray:
    return a["q"] + correction_weight(a["nov"], a["d0"], width) * (a["p"] - a["q"])


def _mape(y_log: np.ndarray, p_log: np.ndarray) -> float:
    return float(100.0 * np.mean(np.abs(np.exp(p_log - y_log) - 1.0))) if y_log.size else math.nan


def _figures(a: Mapping[str, np.ndarray], shrunk: np.ndarray, m: np.ndarray) -> dict[str, Any]:
    """MAPE % of the network, the shrunk figure and the prior, and the share of novel rows, on rows ``m``."""
    return {"n": int(m.sum()), "mape_network_pct": _mape(a["y"][m], a["p"][m]),
            "mape_shrunk_pct": _mape(a["y"][m], shrunk[m]), "mape_prior_pct": _mape(a["y"][m], a["q"][m]),
            "novel_share": float(np.mean(a["nov"][m] > a["d0"][m]))}


def _cat(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def fit_from_rows(twins: Mapping[str, tuple[Sequence[Mapping[str, Any]], float]], targets: Sequence[str],
                  grid: Sequence[float] = SHRINK_GRID) -> dict[str, Any]:
    """Widths, leave-one-twin-out figures and novel floors from the twins' evaluation rows.

    Args:
        twins: ``{name: (rows, d0)}``; rows as :func:`~dippm_nas.training.evaluate_examples`
            gives them (label, ``_pred``, ``_std``, ``_prior``, ``novelty``, ``family``), made without a
            shrink or a novel floor.
        targets: the targets to fit.

    Returns:
        ``{target: {"width": c, "floor_log": f, "novel_rows": n, "rows": n, "twins": {name: {...}},
        "families": {family: {...}}}}``; per twin and family the MAPE % of the network, the shrunk figure
        with the width fitted without that twin, and the prior, plus the share of novel rows.
    """
    out: dict[str, Any] = {}
    for t in targets:
        arrs = {name: _arrays(rows, t, d0) for name, (rows, d0) in twins.items()}
        arrs = {k: a for k, a in arrs.items() if a["y"].size}
        if not arrs:
            continue
        every = _cat(list(arrs.values()))
        width = fit_shrink_width(lambda c: np.mean(np.abs(_shrunk(every, c) - every["y"])), grid)
        res: dict[str, Any] = {"width": width, "rows": int(every["y"].size), "twins": {}, "families": {}}
        for name, a in arrs.items():
            others = [b for k, b in arrs.items() if k != name]
            if others:
                rest = _cat(others)
                w_out = fit_shrink_width(lambda c: np.mean(np.abs(_shrunk(rest, c) - rest["y"])), grid)
            else:
                w_out = math.inf
            s = _shrunk(a, w_out)
            res["twins"][name] = {"width_without": w_out, **_figures(a, s, np.ones(a["y"].size, dtype=bool))}
            for fam in np.unique(a["fam"]):
                res["families"][str(fam)] = {"twin": name, **_figures(a, s, a["fam"] == fam)}
        n = every["y"].size
        for k in ("network", "shrunk", "prior"):
            res[f"mape_{k}_pct"] = sum(v[f"mape_{k}_pct"] * v["n"] for v in res["twins"].values()) / n
        err = np.abs(_shrunk(every, width) - every["y"])
        novel = every["nov"] > every["d0"]
        use = novel if novel.sum() >= MIN_NOVEL_ROWS else np.ones_like(novel)
        res["floor_log"] = fit_novel_floor(err[use], every["sig"][use])
        res["floor_rows"] = int(use.sum())
        res["floor_on"] = "novel rows" if use is novel else "all rows (too few novel ones)"
        # σ as predict() gives it with that floor (novel rows only); in-sample for the rows it was fitted on
        sig = np.where(novel, np.hypot(every["sig"], res["floor_log"]), every["sig"])
        res["coverage_2sigma"] = float(np.mean(err <= 2.0 * sig))
        res["coverage_2sigma_novel"] = float(np.mean((err <= 2.0 * sig)[novel])) if novel.any() else math.nan
        # rows of unseen families that look in-family keep the in-family σ: their coverage is the gap left
        res["coverage_2sigma_not_novel"] = float(np.mean((err <= 2.0 * sig)[~novel])) if (~novel).any() else math.nan
        out[t] = res
    return out


def _print(fit: Mapping[str, Any]) -> None:
    for t, r in fit.items():
        wt = "none" if not math.isfinite(r["width"]) else f"{r['width']:g}"
        print(f"{t}: width {wt} (fitted on {r['rows']} rows of {len(r['twins'])} twins); novel floor "
              f"{r['floor_log']:.4f} on {r['floor_rows']} {r['floor_on']}")
        print(f"  {'twin / family':28s} {'n':>5s} {'novel':>6s} {'network %':>10s} {'shrunk %':>9s} {'prior %':>8s}"
              "  (shrunk: width fitted without that twin)")
        for name, v in r["twins"].items():
            print(f"  {name:28s} {v['n']:5d} {v['novel_share']:6.2f} {v['mape_network_pct']:10.2f} "
                  f"{v['mape_shrunk_pct']:9.2f} {v['mape_prior_pct']:8.2f}   width without it: {v['width_without']:g}")
            for fam, f in r["families"].items():
                if f["twin"] == name:
                    print(f"    {fam:26s} {f['n']:5d} {f['novel_share']:6.2f} {f['mape_network_pct']:10.2f} "
                          f"{f['mape_shrunk_pct']:9.2f} {f['mape_prior_pct']:8.2f}")
        print(f"  {'all':28s} {r['rows']:5d} {'':6s} {r['mape_network_pct']:10.2f} {r['mape_shrunk_pct']:9.2f} "
              f"{r['mape_prior_pct']:8.2f}   within ±2σ (width and floor fitted on all): {r['coverage_2sigma']:.3f}; "
              f"novel rows {r['coverage_2sigma_novel']:.3f}, the others {r['coverage_2sigma_not_novel']:.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", action="append", required=True, help="dataset file (repeatable)")
    ap.add_argument("--device", required=True, help="the device the checkpoints answer for")
    ap.add_argument("--twin", action="append", type=parse_twin, required=True, metavar="CKPT:FAM[,FAM]",
                    help="a family-split twin and the families it held out (repeatable)")
    ap.add_argument("--seed", type=int, default=0, help="the twins' --seed (rebuilds their split)")
    ap.add_argument("--checkpoint", required=True, help="checkpoint to give the width and floors")
    ap.add_argument("--out", required=True, help="checkpoint to write (.pt, with its .json)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    if args.json and Path(args.json).resolve() == Path(args.out).with_suffix(".json").resolve():
        raise SystemExit(f"--json {args.json} is the checkpoint's metadata sidecar; choose another path")

    import dataclasses

    from tqdm.auto import tqdm

    from dippm_nas.training import evaluate_examples
    from dippm_nas.predictor import GnnPredictor
    from dippm_nas.training import featurize_examples, load_examples, split_examples

    ship = GnnPredictor.load(args.checkpoint, device=args.device, load_calibration=False)
    if ship.meta.novelty is None or ship.novelty_ref is None:
        raise SystemExit(f"{args.checkpoint} has no novelty reference set; train it with this code first")
    targets = list(ship.meta.targets)
    ex = load_examples(args.data)
    twins: dict[str, tuple[list[dict[str, Any]], float]] = {}
    for path, holdout in tqdm(args.twin, desc="twins", unit="twin"):
        tw = GnnPredictor.load(path, device=args.device, load_calibration=False)
        if tw.meta.novelty is None or tw.novelty_ref is None:
            raise SystemExit(f"twin {path} has no novelty reference set")
        d0 = float(tw.meta.novelty["d0"])
        # the twin's own figures: no shrink, no novel floor (both are what is being fitted)
        tw.meta = dataclasses.replace(tw.meta, novelty=NoveltyFloor(d0, {}, "none").to_dict())
        _, _, te = split_examples(ex, mode="family", heldout_families=holdout, seed=args.seed)
        te = [e for e in te if e.device == tw.device]
        if not te:
            raise SystemExit(f"twin {path}: no {tw.device} test rows of families {holdout}")
        feats = featurize_examples(te, style=tw.meta.feature_style, prior_params=tw.prior_params,
                                   host_threads=tw.host_threads)
        _, rows = evaluate_examples(tw, feats, te)
        twins[f"{Path(path).stem} ({','.join(holdout)})"] = (rows, d0)
    fit = fit_from_rows(twins, targets)
    _print(fit)
    note = (f"{len(twins)} family-split twins (seed {args.seed}), each evaluated on the families it held out: "
            + "; ".join(twins) + ". Shrink width: smallest mean |log error| over all their rows; floor: 95 % of "
            "their novel rows within ±2σ after the shrink (scripts/fit/fit_novelty_twins.py)")
    nf = ship.meta.novelty
    held = dict(ship.meta.heldout_metrics)
    held[f"family twins, leave one twin out: {', '.join(twins)} (scripts/fit/fit_novelty_twins.py)"] = {
        t: {"n": r["rows"], "mape_pct": r["mape_shrunk_pct"], "mape_pct_without_shrink": r["mape_network_pct"],
            "mape_pct_prior": r["mape_prior_pct"], "coverage_2sigma": r["coverage_2sigma"],
            "per_family_mape_pct": {f: v["mape_shrunk_pct"] for f, v in sorted(r["families"].items())}}
        for t, r in fit.items()}
    ship.meta = dataclasses.replace(ship.meta, heldout_metrics=held, novelty=NoveltyFloor(
        d0=float(nf["d0"]), floor_log={t: r["floor_log"] for t, r in fit.items()}, calibrated_on=note,
        shrink={t: r["width"] for t, r in fit.items() if math.isfinite(r["width"])}).to_dict())
    ship.save(args.out)
    print(f"wrote {args.out}: novelty {json.dumps(ship.meta.novelty)[:300]}")
    if args.json:
        write_output(args.json, json.dumps({"fit": fit, "novelty": ship.meta.novelty}, indent=1, default=float), "--json",
                     error=InvalidValueError)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
