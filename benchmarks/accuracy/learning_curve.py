"""Learning curve of online adaptation: error on the rest of a space after n measured candidates of it.

Usage (from the repository root; data paths are arguments, nothing is downloaded)::

    python benchmarks/accuracy/learning_curve.py --data data/host_cpu/host_cpu_amd_epyc_vm3_new_families.jsonl.xz \\
        --device host-cpu --checkpoint dippm_nas/predictor/checkpoints/host-cpu.intel-xeon.pt --group space \\
        [--ns 0,5,10,20,50,100] [--draws 10] [--pool 170] [--out report.json]
    python benchmarks/accuracy/learning_curve.py --data accel_stitched.jsonl --device a100-sxm4-40gb --row-device a100-40gb
    python benchmarks/accuracy/learning_curve.py --data accel_stitched.jsonl --device rtx-3090 --row-device rtx-3090 \\
        --checkpoint dippm_nas/predictor/checkpoints/a100-sxm4-40gb.accel-timm-tv.pt

Each group of rows (``--group space``: one search space, e.g. each host-CPU family; ``none``: the whole file) is
a space a search explores. Per draw, ``--pool`` candidates of the group are taken (seeded) and ordered as a
search would measure them: by Pareto rank of (MACs per batch, the capacity a search trades for speed: higher
is better; the uncalibrated predicted latency: lower is better), non-dominated sorting, ties in a seeded
order; the first ``n`` are measured, the rest of the pool is scored. Methods at each ``n``:

- ``factor``: the factor calibration alone (``GnnPredictor.fit_factor_calibration``: what ``calibrate()``
  fits below its hand-over);
- ``adapt``: ``predictor.adapt(rows, persist=False)`` (factors + residual heads, amount chosen by CV);
- ``scratch``: a model fitted on the n rows alone, without the pretrained network: a ridge regression of
  ``log(measured / prior)`` on the graph-level features (the checkpoint's standardised static features), the
  penalty chosen by leave-one-out as the adaptation's (``fit_residual_head`` with one member), σ its LOO
  residuals.

Metrics on the scored rows: latency MAPE (%), Kendall τ, share within ±2σ; medians over draws.
A checkpoint may answer for another catalogue device through its device features (``--device`` differs
from the checkpoint's): it is then built as ``GnnPredictor(base.model, base.meta, device)``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from dippm_nas.dataset import load_measurements
from dippm_nas.devices import default_host_profile
from dippm_nas.predictor import GnnPredictor, find_checkpoint, fit_residual_head, global_arrays

METHODS = ("factor", "adapt", "scratch")


def pareto_order(macs: np.ndarray, lat: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices by non-dominated rank of (macs max, lat min); within a rank, a seeded order."""
    left = np.arange(len(macs))
    out: list[int] = []
    while left.size:
        m, t = macs[left], lat[left]
        dom = np.array([np.any((m >= m[i]) & (t <= t[i]) & ((m > m[i]) | (t < t[i]))) for i in range(left.size)])
        front = left[~dom]
        out += rng.permutation(front).tolist()
        left = left[dom]
    return np.array(out)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(a, b).statistic) if len(a) > 1 else math.nan


def score(pred: np.ndarray, std: np.ndarray, y: np.ndarray) -> dict[str, float]:
    ok = np.isfinite(std) & (std > 0)
    cover = float(np.mean(np.abs(pred[ok] - y[ok]) <= 2 * std[ok])) if ok.any() else math.nan
    return {"mape_pct": float(np.mean(np.abs(pred / y - 1)) * 100), "tau": kendall_tau(pred, y),
            "coverage_2sigma": cover}


def predict(p: GnnPredictor, graphs: list) -> tuple[np.ndarray, np.ndarray]:
    preds = p.predict_graphs(graphs, mig=False)
    return (np.array([x.latency_ms for x in preds]),
            np.array([x.latency_ms_std if x.latency_ms_std is not None else math.nan for x in preds]))


def scratch(p: GnnPredictor, train: list, y_train: np.ndarray, test: list) -> tuple[np.ndarray, np.ndarray]:
    """The from-scratch baseline: ridge of log(y / prior) on standardised static features (LOO penalty)."""
    def parts(graphs: list) -> tuple[np.ndarray, np.ndarray]:
        feats = [p.features(g) for g in graphs]
        b = global_arrays(feats)
        return np.asarray(b["static"], dtype=np.float64)[None], np.asarray(b["log_prior"][:, 0], dtype=np.float64)

    xs, lp = parts(train)
    head = fit_residual_head("latency_ms", xs, np.log(y_train) - lp)
    xt, lpt = parts(test)
    mean = lpt + head.members(xt)[0]
    return np.exp(mean), np.exp(mean) * head.loo_rmse_log


def run_group(p: GnnPredictor, graphs_all: list, y_all: np.ndarray, ns: list[int], args: argparse.Namespace
              ) -> dict[str, dict[int, list[dict[str, float]]]]:
    """Every draw and n of one group: the scores of each method (``none``: n = 0, the predictor as shipped)."""
    host = default_host_profile()
    raw_all, _ = predict(p, graphs_all)
    macs_all = np.array([float(g.total_macs) for g in graphs_all])
    res: dict[str, dict[int, list[dict[str, float]]]] = {m: defaultdict(list) for m in ("none", *METHODS)}
    for d in range(args.draws):
        rng = np.random.default_rng(1000 * d + 7)
        pool = rng.choice(len(graphs_all), size=min(args.pool, len(graphs_all)), replace=False)
        order = pool[pareto_order(macs_all[pool], raw_all[pool], rng)]
        for n in ns:
            if n >= len(order) - 5:
                continue
            tr, te = order[:n], order[n:]
            g_tr, g_te, y_tr, y_te = ([graphs_all[i] for i in tr], [graphs_all[i] for i in te], y_all[tr],
                                      y_all[te])
            rows_tr = [(g, {"latency_ms": float(v)}) for g, v in zip(g_tr, y_tr)]
            if n == 0:
                p.reset_adaptation()
                p.calibration = None
                p.clear_prediction_cache()
                res["none"][n].append(score(*predict(p, g_te), y_te))
                continue
            p.reset_adaptation()
            p.calibration = p.fit_factor_calibration(rows_tr, "eager", host)
            p.clear_prediction_cache()
            res["factor"][n].append(score(*predict(p, g_te), y_te))
            p.adapt(rows_tr, persist=False)
            res["adapt"][n].append(score(*predict(p, g_te), y_te))
            if n >= 2:
                res["scratch"][n].append(score(*scratch(p, g_tr, y_tr, g_te), y_te))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--device", default="host-cpu", help="catalogue id predicted for (default host-cpu)")
    ap.add_argument("--row-device", default=None, help="the rows' device field to keep (default: all rows)")
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: the device's own checkpoint")
    ap.add_argument("--group", choices=("space", "none"), default="none")
    ap.add_argument("--ns", default="0,5,10,20,50,100")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--pool", type=int, default=170, help="candidates of a group per draw (default 170)")
    ap.add_argument("--max-rows", type=int, default=None,
                    help="keep this many rows of each group (seeded sample; default all): featurising every row of a "
                         "5,000-row file costs minutes")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.ns.split(",")]

    ck = args.checkpoint or find_checkpoint(args.device)
    base = GnnPredictor.load(ck, load_calibration=False)
    rows = [mg for mg in load_measurements(args.data, device=args.row_device) if mg.measurement.get("latency_ms")]
    groups: dict[str, list] = defaultdict(list)
    for mg in rows:
        groups[mg.measurement.get("space") or "all" if args.group == "space" else "all"].append(mg)
    report: dict[str, dict] = {}
    t0 = time.perf_counter()
    print(f"checkpoint {ck} answering for {args.device}; {len(rows)} rows in {len(groups)} group(s)")
    for name, mgs in sorted(groups.items()):
        if args.max_rows is not None and len(mgs) > args.max_rows:
            keep = np.random.default_rng(0).choice(len(mgs), size=args.max_rows, replace=False)
            mgs = [mgs[i] for i in sorted(keep)]
        p = GnnPredictor(base.model, base.meta, args.device, load_calibration=False)
        graphs_all = [mg.graph for mg in mgs]
        y_all = np.array([float(mg.measurement["latency_ms"]) for mg in mgs])
        with p.one_network_pass(graphs_all):  # the members' outputs of every row, reused by every fit and score
            res = run_group(p, graphs_all, y_all, ns, args)
        med = {m: {n: {k: float(np.nanmedian([r[k] for r in v])) for k in ("mape_pct", "tau", "coverage_2sigma")}
                   for n, v in sorted(per.items()) if v} for m, per in res.items()}
        report[name] = {"rows": len(mgs), "draws": args.draws, "pool": args.pool, "median": med}
        print(f"\n== {name}: {len(mgs)} rows; medians over {args.draws} draws (MAPE % / tau / within ±2σ)")
        print(f"{'n':>4} " + " ".join(f"{m:>24}" for m in ("none", *METHODS)))
        for n in ns:
            cells = []
            for m in ("none", *METHODS):
                v = med[m].get(n)
                cells.append(f"{v['mape_pct']:7.1f} {v['tau']:6.3f} {v['coverage_2sigma']:5.2f}   " if v else f"{'-':>24}")
            print(f"{n:>4} " + " ".join(f"{c:>24}" for c in cells))
        sys.stdout.flush()
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
