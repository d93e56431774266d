"""What a search sees through the cost model's chance constraints, on measured latencies.

For latency budgets at the 25th, 50th and 75th percentile of the measured latencies, a model is *admitted*
when ``mean + k * std <= budget`` (:class:`dippm_nas.budgets.Budgets`, ``k`` = 0, 1, 2) and *really within*
when its measured latency is. The script prints, per budget and ``k``:

- ``over %``: the share of admitted models that are really over the budget (what a search wastes);
- ``rejected %``: the share of really-within models that are not admitted (what a search never sees);
- the counts behind them, and the share of measurements inside ``mean +- 2 std`` (coverage).

With ``--confidence 0.9 --conformal FILE`` (a checkpoint's :mod:`dippm_nas.conformal` calibration), also the rule
``Budgets(confidence=0.9)``; ``benchmarks/accuracy/conformal_budgets.py`` fits that file and scores it per cell on
rows the calibration did not see.

Input, either:

- ``--rows FILE``: a CSV or JSON Lines file with one row per model: the predicted mean, its std and the
  measured latency (column names ``--mean-col``, ``--std-col``, ``--measured-col``; defaults
  ``latency_ms``, ``latency_ms_std``, ``measured_latency_ms``); or
- ``--dataset EXPORT --device ID``: a dataset export with graphs (``.jsonl[.gz|.xz]``) or dataset file; each
  ``ok`` row's graph is predicted with ``dippm_nas.get_predictor(ID)`` (a checkpoint of your own:
  ``$DIPPM_NAS_CHECKPOINT_DIR``) and compared with its measured latency.

Example on the host-CPU data (the AMD EPYC checkpoint on the newer VM's 14-family measurements)::

    .venv/bin/python benchmarks/accuracy/search_view.py \\
        --dataset data/host_cpu/host_cpu_amd_epyc_f25m17_14fam.jsonl.xz --device host-cpu [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from benchmarks._common import machine  # noqa: E402
from dippm_nas.budgets import Budgets  # noqa: E402
from dippm_nas.prediction import Prediction  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402

PERCENTILES: tuple[int, ...] = (25, 50, 75)
KS: tuple[float, ...] = (0.0, 1.0, 2.0)


def rows_from_file(path: Path, mean_col: str, std_col: str, measured_col: str) -> list[tuple[float, float | None, float]]:
    """``(mean, std or None, measured)`` per row of a CSV or JSON Lines file."""
    if path.suffix.lower() == ".csv":
        with open(path, newline="") as f:
            recs: list[dict[str, Any]] = list(csv.DictReader(f))
    else:
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    out = []
    for i, r in enumerate(recs):
        try:
            mean, measured = float(r[mean_col]), float(r[measured_col])
        except (KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"{path}: row {i + 1} lacks a number in {mean_col!r} / {measured_col!r} ({e})") from e
        std_v = r.get(std_col)
        std = float(std_v) if std_v not in (None, "") else None
        out.append((mean, std, measured))
    return out


def rows_from_dataset(path: Path, device: str, *, limit: int | None = None,
                      space: str | None = None) -> tuple[list[tuple[float, float | None, float]], dict[str, Any]]:
    """``(mean, std, measured)`` of every ``ok`` row with a graph, predicted on ``device``."""
    import dippm_nas
    from dippm_nas.dataset import load_measurements

    examples = load_measurements(path, status="ok", space=space)
    if limit is not None:
        examples = examples[:limit]
    predictor = dippm_nas.get_predictor(device)
    out: list[tuple[float, float | None, float]] = []
    flags = {"novel": 0, "other_machine": 0, "other_host": 0, "outside_training_range": 0}
    for i in range(0, len(examples), 256):
        part = examples[i:i + 256]
        preds = predictor.predict_graphs([e.graph for e in part], mig=False)
        for e, p in zip(part, preds):
            out.append((p.latency_ms, p.latency_ms_std, float(e.measurement["latency_ms"])))
            for k in flags:
                flags[k] += int(p.details.get(k, 0.0) >= 1.0)
    info = {"predictor": repr(predictor), "rows": len(out), "flagged": flags}
    return out, info


def search_view(rows: Sequence[tuple[float, float | None, float]], *, percentiles: Sequence[int] = PERCENTILES,
                ks: Sequence[float] = KS, confidences: Sequence[float] = (), conformal: Any = None,
                predictions: Sequence[Prediction] | None = None) -> dict[str, Any]:
    """The table of the module docstring as a dict: ``{"p25": {"budget_ms": ..., "k=1": {...}}, ...}``; with
    ``confidences``, also ``"c=0.9"`` entries: admitted by ``Budgets(confidence=c, conformal=conformal)`` (the
    predictions' own regimes read from ``predictions``, one per row, where given)."""
    mean = np.array([r[0] for r in rows], dtype=float)
    std = np.array([r[1] if r[1] is not None else 0.0 for r in rows], dtype=float)
    missing = sum(r[1] is None for r in rows)
    measured = np.array([r[2] for r in rows], dtype=float)
    out: dict[str, Any] = {"n": len(rows), "std_missing": missing,
                           "coverage_2sigma": float(np.mean(np.abs(measured - mean) <= 2 * std)) if len(rows) else math.nan,
                           "mape_pct": float(100 * np.mean(np.abs(mean - measured) / measured)) if len(rows) else math.nan}
    for pct in percentiles:
        budget = float(np.percentile(measured, pct))
        within = measured <= budget
        entry: dict[str, Any] = {"budget_ms": budget, "within": int(within.sum())}
        rules = [(f"k={k:g}", Budgets(latency_ms=budget, k_sigma=k)) for k in ks]
        rules += [(f"c={c:g}", Budgets(latency_ms=budget, confidence=c, conformal=conformal)) for c in confidences]
        for key, b in rules:
            preds = predictions if predictions is not None else [_pred(m, s) for m, s in zip(mean, std)]
            admitted = np.array([b.feasible(p) for p in preds], dtype=bool)
            n_adm = int(admitted.sum())
            over = int((admitted & ~within).sum())
            rejected = int((~admitted & within).sum())
            entry[key] = {
                "admitted": n_adm, "admitted_over": over, "within_rejected": rejected,
                "over_pct": 100.0 * over / n_adm if n_adm else math.nan,
                "rejected_pct": 100.0 * rejected / int(within.sum()) if within.any() else math.nan,
            }
        out[f"p{pct}"] = entry
    return out


def _pred(mean: float, std: float) -> Prediction:
    """A latency-only prediction the budgets can check (the other figures play no part)."""
    return Prediction(latency_ms=float(mean), energy_j=None, memory_mib=0.0, latency_source="predicted",
                      energy_source="unavailable", memory_source="analytic", device="host-cpu", batch_size=1,
                      dtype="float32", latency_ms_std=float(std))


def print_table(view: dict[str, Any], percentiles: Sequence[int] = PERCENTILES, ks: Sequence[float] = KS,
                confidences: Sequence[float] = ()) -> None:
    print(f"{view['n']} models; latency MAPE {view['mape_pct']:.1f} %; measured within mean +- 2 std: "
          f"{100 * view['coverage_2sigma']:.1f} %" + (f"; {view['std_missing']} rows without a std (taken as 0)"
                                                       if view["std_missing"] else ""))
    print(f"{'budget':>16}{'rule':>7}{'admitted':>10}{'over %':>9}{'within':>8}{'rejected %':>12}")
    keys = [f"k={k:g}" for k in ks] + [f"c={c:g}" for c in confidences]
    for pct in percentiles:
        e = view[f"p{pct}"]
        for i, key in enumerate(keys):
            c = e[key]
            label = f"p{pct} {e['budget_ms']:.3g} ms" if i == 0 else ""
            print(f"{label:>16}{key:>7}{c['admitted']:>10}{c['over_pct']:>9.1f}{e['within']:>8}{c['rejected_pct']:>12.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--rows", type=Path, help="CSV / JSON Lines of (mean, std, measured) rows")
    src.add_argument("--dataset", type=Path, help="dataset export with graphs (or a dataset SQLite file)")
    ap.add_argument("--device", default="host-cpu", help="catalogue id whose predictor predicts --dataset rows")
    ap.add_argument("--space", default=None, help="only rows of this search space")
    ap.add_argument("--limit", type=int, default=None, help="only the first N rows")
    ap.add_argument("--mean-col", default="latency_ms")
    ap.add_argument("--std-col", default="latency_ms_std")
    ap.add_argument("--measured-col", default="measured_latency_ms")
    ap.add_argument("--confidence", type=float, action="append", default=[],
                    help="also the rule Budgets(confidence=C) (repeatable)")
    ap.add_argument("--conformal", type=Path, default=None, help="the conformal calibration file those bounds read")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    info: dict[str, Any] = {}
    if args.rows is not None:
        rows = rows_from_file(args.rows, args.mean_col, args.std_col, args.measured_col)
        info["source"] = str(args.rows)
    else:
        rows, info = rows_from_dataset(args.dataset, args.device, limit=args.limit, space=args.space)
        info["source"] = str(args.dataset)
        print(f"{info['predictor']}: {info['rows']} rows; flagged {info['flagged']}")
    if not rows:
        raise SystemExit("no rows to compare")
    view = search_view(rows, confidences=args.confidence, conformal=args.conformal)
    print_table(view, confidences=args.confidence)
    if args.json is not None:
        write_output(args.json, json.dumps({**info, **view}, indent=1), "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
