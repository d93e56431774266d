"""Fit a checkpoint's conformal calibration on released rows, and score ``Budgets(confidence=c)`` per cell.

Usage (from the repository root; the data are arguments, built outside the repository)::

    python benchmarks/accuracy/conformal_budgets.py --checkpoint dippm_nas/predictor/checkpoints/a100-sxm4-40gb.accel-timm-tv.pt \\
        --data accel_stitched.jsonl --data ryujaehun.sqlite --data timm_heldout.sqlite \\
        [--max-rows 300] [--adapt-rows 20] [--write] [--json report.json]

Cells: each data file's rows per measured GPU (``source/device``), predicted for that GPU by the checkpoint (through
its device features where it was not trained for it). Each cell's rows are split in two halves by a hash of the
graph (the same split every run): the **calibration** half gives the scores, the **held-out** half the coverage and
the search view. Each row is predicted three ways, so that every regime of :mod:`dippm_nas.conformal` has rows:

- for the deployment the rows record (``accuracy_deployment.described``: ``described`` where it leaves nothing assumed);
- for the default deployment (eager on the default host: ``undescribed``);
- adapted (``adapted``): ``predictor.adapt`` on ``--adapt-rows`` rows of the same half and precision (seeded; an
  adaptation is of one dtype, as a search's is), the rest of those rows predicted for the described deployment (the
  adapting rows are not scored). A prediction the adaptation does not apply to
  (``details["adaptation_other_dtype"]``) keeps its described prediction and is not an adapted row.

``--outside-training SEED`` keeps only the architectures a checkpoint trained on these same files never trained on:
those that ``dippm-nas train``'s default ``"random"`` split with seed ``SEED`` (70 / 15 / 15 by a hash of the graph,
:func:`dippm_nas.training.split_fraction`) put in its validation or test set. The validation rows chose each
member's epoch and the σ floor; the test rows were never used. Without it every row is used, which is honest only
for a checkpoint that never saw the files.

``--write`` saves the calibration next to the checkpoint (``<checkpoint>.conformal.json``). Then, per cell and
held-out half, :func:`search_view.search_view` at budgets at the 25th / 50th / 75th percentile of the measured
latencies, with ``k_sigma`` 0 / 1 and ``confidence`` 0.9: the share of admitted models really over budget and of
fitting models rejected, for the described predictions and for the adapted ones; where a cell misses the target
(> 10 % of admitted over budget or > 30 % of fitting rejected), :func:`separation`: the largest ``k`` that rejects
<= 30 % of its fitting models and the confidence that ``k`` has on its regime's calibration scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from dippm_nas.conformal import ConformalCalibration, conformal_path, fit_conformal  # noqa: E402
from dippm_nas.dataset import load_measurements  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.predictor import GnnPredictor, checkpoint_digest  # noqa: E402
from dippm_nas.training import DEVICE_ALIASES, split_fraction  # noqa: E402

import search_view as sv  # noqa: E402


def held_out(graph_key: str) -> bool:
    """The half a graph falls in (the same every run): ``True`` for the held-out half."""
    return hashlib.sha256(graph_key.encode()).digest()[0] % 2 == 1


#: the training share of ``dippm-nas train``'s default ``"random"`` split (70 / 15 / 15)
TRAIN_FRACTION = 0.7


def outside_training(graph: Any, seed: int) -> bool:
    """Whether the default ``"random"`` split with ``seed`` puts ``graph``'s architecture outside training."""
    return split_fraction(graph.structural_hash(), seed) >= TRAIN_FRACTION


def _described(mgs: list) -> Any:
    from accuracy_deployment import described  # sibling script

    deps = {d.key: d for d in (described(mg.measurement["source"], mg.measurement) for mg in mgs)}
    if len(deps) != 1:
        raise SystemExit(f"a cell's rows record {len(deps)} deployments, one is needed")
    return next(iter(deps.values()))


def adapt_plan(idx: np.ndarray, adapt_rows: int, chunk: int | None,
               rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(rows adapted on, rows predicted)`` of one half (``idx``, shuffled). Without ``chunk``: one pair, the first
    ``adapt_rows`` rows and the rest (none where the half has ``<= adapt_rows + 5`` rows). With ``chunk``: every row
    predicted once, ``chunk`` rows at a time, each chunk after adapting on ``adapt_rows`` rows of the half outside it
    (drawn with ``rng``; fewer where the half has fewer; none where it has fewer than 2)."""
    if chunk is None:
        return [] if len(idx) <= adapt_rows + 5 else [(idx[:adapt_rows], idx[adapt_rows:])]
    out = []
    for start in range(0, len(idx), chunk):
        pred = idx[start:start + chunk]
        others = np.setdiff1d(idx, pred)
        if len(others) >= 2:
            out.append((rng.choice(others, size=min(adapt_rows, len(others)), replace=False), pred))
    return out


def cell_rows(p: GnnPredictor, mgs: list, adapt_rows: int, seed: int,
              adapt_chunk: int | None = None) -> dict[str, list[tuple[Any, float, bool]]]:
    """``{"described" | "undescribed" | "adapted": [(prediction, measured, held_out), ...]}`` of one cell
    (``adapt_chunk``: see :func:`adapt_plan`)."""
    dep = _described(mgs)
    graphs = [mg.graph for mg in mgs]
    y = np.array([float(mg.measurement["latency_ms"]) for mg in mgs])
    half = np.array([held_out(p.graph_key(g)) for g in graphs])
    out: dict[str, list[tuple[Any, float, bool]]] = {}
    with p.one_network_pass(graphs):
        p.reset_adaptation()
        p.calibration = None
        p.clear_prediction_cache()
        out["described"] = list(zip(p.predict_graphs(graphs, mig=False, deployment=dep), y, half))
        out["undescribed"] = list(zip(p.predict_graphs(graphs, mig=False), y, half))
        out["adapted"] = []
        rng = np.random.default_rng(seed)
        dtypes = np.array([str(getattr(getattr(g, "spec", None), "dtype", "")) for g in graphs])
        groups = [(h, d) for h in (False, True) for d in sorted(set(dtypes))]  # an adaptation is of one precision
        for h, d in groups:
            for fit, rest in adapt_plan(rng.permutation(np.flatnonzero((half == h) & (dtypes == d))), adapt_rows,
                                        adapt_chunk, rng):
                p.adapt([(graphs[i], {"latency_ms": float(y[i])}) for i in fit], persist=False, deployment=dep)
                preds = p.predict_graphs([graphs[i] for i in rest], mig=False, deployment=dep)
                # a graph of a precision the adapting rows did not run in keeps its described prediction: not an
                # adapted one (and already a "described" row)
                out["adapted"] += [(q, float(y[i]), h) for q, i in zip(preds, rest)
                                   if not q.details.get("adaptation_other_dtype")]
                p.reset_adaptation()
                p.calibration = None
                p.clear_prediction_cache()
    return out


def from_dump(paths: list[Path]) -> dict[str, dict[str, list[tuple[Any, float, bool]]]]:
    """The cells of ``--dump`` files, each row a latency-only prediction of its recorded regime (nothing predicted)."""
    from dippm_nas.prediction import Prediction

    cells: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            bound, described, adapted = r["regime"].split("|")
            details = {"host_bound": float(bound == "host-bound")}
            if adapted == "adapted":
                details["adaptation_version"] = 0.0
            q = Prediction(latency_ms=r["mean"], energy_j=None, memory_mib=0.0, latency_source="predicted",
                           energy_source="unavailable", memory_source="analytic", device=r["cell"].split("/")[1],
                           batch_size=1, dtype="float32", latency_ms_std=r["std"], details=details,
                           labels={"deployment_assumed": "" if described == "described" else "assumed"})
            cells[r["cell"]][r["kind"]].append((q, float(r["measured"]), bool(r["held_out"])))
    return cells


def separation(rows: list[tuple[Any, float]], cal: ConformalCalibration, pct: int, confidence: float,
               max_rejected: float = 0.3) -> dict[str, Any]:
    """What a cell's budget at percentile ``pct`` asks of the bound: the largest ``k`` (in σ_log of each prediction)
    that rejects at most ``max_rejected`` of the fitting models, and the share of calibration scores of the regime
    most of them are read from that lie at or below it (the confidence such a bound would state)."""
    from dippm_nas.conformal import regime_of

    y = np.array([v for _, v in rows])
    budget = float(np.percentile(y, pct))
    fit = [(q, v) for q, v in rows if v <= budget]
    need = sorted(float(np.log(budget / q.latency_ms) / (q.latency_ms_std / q.latency_ms)) for q, _ in fit)
    k_max = need[int(np.floor(max_rejected * len(fit)))]
    regimes = [cal.margin("latency_ms", confidence, regime_of(q)).regime for q, _ in fit]
    regime = max(set(regimes), key=regimes.count)
    scores = np.asarray(cal.scores["latency_ms"][regime], dtype=float)
    return {"fitting": len(fit), "k_max": k_max, "regime": regime, "confidence_at_k_max": float(np.mean(scores <= k_max)),
            "sigma_log_median": float(np.median([q.latency_ms_std / q.latency_ms for q, _ in fit]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--data", type=Path, action="append", default=[])
    ap.add_argument("--from-dump", type=Path, action="append", default=[],
                    help="rows of earlier --dump files instead of predicting (repeatable)")
    ap.add_argument("--max-rows", type=int, default=300, help="rows per cell (seeded sample; default 300)")
    ap.add_argument("--adapt-rows", type=int, default=20, help="rows each adapted prediction is adapted on")
    ap.add_argument("--adapt-chunk", type=int, default=None, metavar="N",
                    help="every row of a half gets an adapted prediction, N rows at a time, each chunk adapted on "
                         "--adapt-rows other rows of its half and precision (default: one split of each)")
    ap.add_argument("--confidence", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--outside-training", type=int, default=None, metavar="SEED",
                    help="only the architectures outside the training set of the default random split with SEED "
                         "(a checkpoint trained on these files: its validation and test rows)")
    ap.add_argument("--write", action="store_true", help="save the calibration next to the checkpoint")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dump", type=Path, default=None,
                    help="write every predicted row (cell, kind, half, mean, std, measured, regime) as JSON Lines")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if not args.data and not args.from_dump:
        ap.error("give --data or --from-dump")
    if args.adapt_chunk is not None and args.adapt_chunk < 1:
        ap.error(f"--adapt-chunk must be >= 1, got {args.adapt_chunk}")
    cells: dict[str, dict[str, list]] = dict(from_dump(args.from_dump))
    base = GnnPredictor.load(args.checkpoint, load_calibration=False) if args.data else None
    per: dict[str, list] = defaultdict(list)  # a cell's rows from every file (two timm subsets: one cell each GPU)
    for path in args.data:
        for mg in load_measurements(path, status="ok"):
            if mg.measurement.get("latency_ms") and (args.outside_training is None
                                                     or outside_training(mg.graph, args.outside_training)):
                dev = DEVICE_ALIASES.get(mg.measurement["device"], mg.measurement["device"])
                per[f"{mg.measurement['source']}/{dev}"].append(mg)
    for name, mgs in sorted(per.items()):
        if len(mgs) > args.max_rows:
            keep = np.random.default_rng(args.seed).choice(len(mgs), size=args.max_rows, replace=False)
            mgs = [mgs[i] for i in sorted(keep)]
        p = GnnPredictor(base.model, base.meta, name.split("/")[1], load_calibration=False)
        cells[name] = cell_rows(p, mgs, args.adapt_rows, args.seed, args.adapt_chunk)
        print(f"{name}: {len(mgs)} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
    every = [r for c in cells.values() for rows in c.values() for r in rows]
    if args.dump is not None:
        from dippm_nas.conformal import regime_of

        with open(args.dump, "w") as f:
            for name, c in cells.items():
                for kind, rows in c.items():
                    for q, y, h in rows:
                        f.write(json.dumps({"cell": name, "kind": kind, "held_out": bool(h), "mean": q.latency_ms,
                                            "std": q.latency_ms_std, "measured": float(y),
                                            "regime": regime_of(q)}) + "\n")
    sha = checkpoint_digest(args.checkpoint)
    cal = fit_conformal([(q, y) for q, y, h in every if not h], [(q, y) for q, y, h in every if h],
                        checkpoint_sha256=sha, source=(
                            f"benchmarks/accuracy/conformal_budgets.py on {', '.join(p.name for p in args.data + args.from_dump)}: "
                            f"calibration half of {len(cells)} cells (<= {args.max_rows} rows each"
                            + ("" if args.outside_training is None else
                               f"; only architectures outside the training set of the random split with seed "
                               f"{args.outside_training}") + "), described / "
                            f"undescribed / adapted on {args.adapt_rows} rows"
                            + ("" if args.adapt_chunk is None else f" (every row, {args.adapt_chunk} at a time)")))
    if args.write:
        out = conformal_path(args.checkpoint)
        cal.save(out)
        ConformalCalibration.load(out, checkpoint_sha256=sha)
        print(f"wrote {out}")
    report: dict[str, Any] = {"coverage": cal.coverage, "cells": {}}
    print("\ncoverage on the held-out half (share within the bound):")
    for r, c in sorted(cal.coverage["latency_ms"].items()):
        if isinstance(c, dict):
            print(f"  {r:<36} rows {c['rows']:>5}  " + "  ".join(f"c={k}: {v:.3f}" for k, v in c.items() if k != "rows"))
    for name, c in sorted(cells.items()):
        for kind in ("described", "adapted"):
            rows = [(q, y) for q, y, h in c[kind] if h]
            if len(rows) < 8:
                continue
            view = sv.search_view([(q.latency_ms, q.latency_ms_std, y) for q, y in rows], ks=(0.0, 1.0),
                                  confidences=(args.confidence,), conformal=cal, predictions=[q for q, _ in rows])
            report["cells"][f"{name}/{kind}"] = view
            print(f"\n== {name} ({kind}, held-out half)")
            sv.print_table(view, ks=(0.0, 1.0), confidences=(args.confidence,))
            for pct in sv.PERCENTILES:
                e = view[f"p{pct}"][f"c={args.confidence:g}"]
                if e["admitted_over"] > 0.1 * max(e["admitted"], 1) or e["within_rejected"] > 0.3 * view[f"p{pct}"]["within"]:
                    sep = separation(rows, cal, pct, args.confidence)
                    view[f"p{pct}"]["separation"] = sep
                    print(f"   p{pct} misses the target: <= 30 % of its {sep['fitting']} fitting models rejected needs "
                          f"k <= {sep['k_max']:+.2f}, a confidence of {sep['confidence_at_k_max']:.2f} on regime "
                          f"{sep['regime']} (σ_log median {sep['sigma_log_median']:.3f})")
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.json is not None:
        write_output(args.json, json.dumps(report, indent=1) + "\n", "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
