"""Learning curve of online adaptation: error on the rest of a space after n measured candidates of it.

Usage (from the repository root; data paths are arguments, nothing is downloaded)::

    python benchmarks/accuracy/learning_curve.py --data data/host_cpu/host_cpu_amd_epyc_vm3_new_families.jsonl.xz \\
        --device host-cpu --checkpoint dippm_nas/predictor/checkpoints/host-cpu.intel-xeon.pt --group space \\
        [--ns 0,5,10,20,50,100] [--draws 10] [--pool 170] [--out report.json]
    python benchmarks/accuracy/learning_curve.py --data accel_stitched.jsonl --device a100-sxm4-40gb --row-device a100-40gb
    python benchmarks/accuracy/learning_curve.py --data accel_stitched.jsonl --device rtx-3090 --row-device rtx-3090 \\
        --checkpoint dippm_nas/predictor/checkpoints/a100-sxm4-40gb.accel-timm-tv.pt
    python benchmarks/accuracy/learning_curve.py --data ryujaehun.sqlite --source ryujaehun --group device \\
        --dtypes float16,float32 --deployment described --prior held-out --checkpoint no_eager.pt --pool 64

Each group of rows (``--group space``: one search space, e.g. each host-CPU family; ``none``: the whole file) is
a space a search explores. Per draw, ``--pool`` candidates of the group are taken (seeded) and ordered as a
search would measure them: by Pareto rank of (MACs per batch, the capacity a search trades for speed: higher
is better; the uncalibrated predicted latency: lower is better), non-dominated sorting, ties in a seeded
order (``--order random``: in the pool's seeded random order instead); the first ``n`` are measured, the rest of
the pool is scored. Methods at each ``n``:

- ``none``: the predictor as shipped (no row used), scored on the same rest: the reference of every ``n`` (the rest
  a Pareto order leaves is not a random part of the group);
- ``factor``: the factor calibration alone (``GnnPredictor.fit_factor_calibration``: what ``calibrate()``
  fits below its hand-over);
- ``adapt``: ``predictor.adapt(rows, persist=False)`` (factors + residual heads, each kept only where it wins out of
  group: ``dippm_nas/predictor/_guard.py``);
- ``scratch``: a model fitted on the n rows alone, without the pretrained network: a ridge regression of
  ``log(measured / prior)`` on the graph-level features (the checkpoint's standardised static features), the
  penalty and shrink chosen by leave-one-row-out (``fit_residual_head`` with one member and no groups), σ its
  leave-one-out residuals.

Metrics on the scored rows: latency MAPE (%), Kendall τ, share within ±2σ; medians over draws; and the MAPE of
the scored rows the uncalibrated prediction calls host-bound (``details["host_bound"]``: its host timeline longer
than its kernels) and of the others, to tell a miss of the host model from one of the kernels.
A checkpoint may answer for another catalogue device through its device features (``--device`` differs
from the checkpoint's): it is then built as ``GnnPredictor(base.model, base.meta, device)``.

``--group device``: one group per measured GPU (the rows' ``device``, a dataset name mapped to its catalogue id),
each predicted for its own GPU; ``--group family``: one group per measured GPU and timm family
(``rtx-3090/efficientnet``: ``timm_family`` of the row's model name), e.g. the families a ``timm-family``
checkpoint held out, one at a time. ``--deployment described``: every prediction, calibration and adaptation of a group
is for the deployment its rows record (``accuracy_deployment.described``: for the eager CNN timings the host's
clock, PyTorch 1.x, the pageable input copy, cudnn.benchmark); a group whose rows record more than one deployment
is refused. ``--prior held-out``: the checkpoint's pinned prior constants with what the source's rows fitted in
them refitted without the group's GPU (``accuracy_deployment``'s per-cell constants: for the eager CNN timings the
host model and the FP64 efficiency), so that no constant has seen the GPU predicted.
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

from dippm_nas import Deployment
from dippm_nas.dataset import MeasuredGraph, load_measurements
from dippm_nas.devices import default_host_profile
from dippm_nas.predictor import GnnPredictor, find_checkpoint, fit_residual_head, global_arrays
from dippm_nas.prior import default_params
from dippm_nas.prior import predict as prior_predict
from dippm_nas.training import DEVICE_ALIASES, timm_family
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import write_output

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


SCORES = ("mape_pct", "tau", "coverage_2sigma", "mape_host_bound_pct", "mape_gpu_bound_pct", "host_bound_share")


def score(pred: np.ndarray, std: np.ndarray, y: np.ndarray, host_bound: np.ndarray) -> dict[str, float]:
    """MAPE, τ, ±2σ coverage; the MAPE of the ``host_bound`` rows and of the others, and their share."""
    ok = np.isfinite(std) & (std > 0)
    cover = float(np.mean(np.abs(pred[ok] - y[ok]) <= 2 * std[ok])) if ok.any() else math.nan
    ape = np.abs(pred / y - 1) * 100
    return {"mape_pct": float(np.mean(ape)), "tau": kendall_tau(pred, y), "coverage_2sigma": cover,
            "mape_host_bound_pct": float(np.mean(ape[host_bound])) if host_bound.any() else math.nan,
            "mape_gpu_bound_pct": float(np.mean(ape[~host_bound])) if (~host_bound).any() else math.nan,
            "host_bound_share": float(np.mean(host_bound))}


def predict(p: GnnPredictor, graphs: list, dep: Deployment | None) -> tuple[np.ndarray, np.ndarray]:
    preds = p.predict_graphs(graphs, mig=False, deployment=dep)
    return (np.array([x.latency_ms for x in preds]),
            np.array([x.latency_ms_std if x.latency_ms_std is not None else math.nan for x in preds]))


def host_bound(p: GnnPredictor, graphs: list, dep: Deployment | None) -> np.ndarray:
    """Per graph: does the uncalibrated prediction's host timeline outlast its kernels (``details["host_bound"]``)?"""
    return np.array([bool(x.details.get("host_bound", 0.0)) for x in p.predict_graphs(graphs, mig=False,
                                                                                       deployment=dep)])


def scratch(p: GnnPredictor, train: list, y_train: np.ndarray, test: list, dep: Deployment | None
            ) -> tuple[np.ndarray, np.ndarray]:
    """The from-scratch baseline: ridge of log(y / prior) on standardised static features (LOO penalty); the prior
    of the deployment ``dep`` where one is described, else the features' own (eager, the default host)."""
    def parts(graphs: list) -> tuple[np.ndarray, np.ndarray]:
        feats = [p.features(g) for g in graphs]
        b = global_arrays(feats)
        if dep is None:
            lp = np.asarray(b["log_prior"][:, 0], dtype=np.float64)
        else:
            params = p.prior_params if p.prior_params is not None else default_params()
            lp = np.log([prior_predict(g, p.device, params=params, deployment=dep, mig=False).latency_ms
                         for g in graphs])
        return np.asarray(b["static"], dtype=np.float64)[None], lp

    xs, lp = parts(train)
    head = fit_residual_head("latency_ms", xs, np.log(y_train) - lp)
    xt, lpt = parts(test)
    mean = lpt + head.members(xt)[0]
    return np.exp(mean), np.exp(mean) * head.loo_rmse_log


def run_group(p: GnnPredictor, graphs_all: list, y_all: np.ndarray, ns: list[int], args: argparse.Namespace,
              dep: Deployment | None = None) -> dict[str, dict[int, list[dict[str, float]]]]:
    """Every draw and n of one group: the scores of each method (``none``: the predictor as shipped, scored on the
    same rows as the methods at each n), each prediction, calibration and adaptation for ``dep`` (``None``: eager on
    the default host)."""
    host = default_host_profile()
    raw_all, raw_std = predict(p, graphs_all, dep)  # as shipped: also scored on the rest at every n
    hb_all = host_bound(p, graphs_all, dep)
    macs_all = np.array([float(g.total_macs) for g in graphs_all])
    res: dict[str, dict[int, list[dict[str, float]]]] = {m: defaultdict(list) for m in ("none", *METHODS)}
    for d in range(args.draws):
        rng = np.random.default_rng(1000 * d + 7)
        pool = rng.choice(len(graphs_all), size=min(args.pool, len(graphs_all)), replace=False)
        order = pool[pareto_order(macs_all[pool], raw_all[pool], rng)] if args.order == "pareto" else pool
        for n in ns:
            if n >= len(order) - 5:
                continue
            tr, te = order[:n], order[n:]
            g_tr, g_te, y_tr, y_te = ([graphs_all[i] for i in tr], [graphs_all[i] for i in te], y_all[tr],
                                      y_all[te])
            rows_tr = [(g, {"latency_ms": float(v)}) for g, v in zip(g_tr, y_tr)]
            hb = hb_all[te]
            if n > 0:
                res["none"][n].append(score(raw_all[te], raw_std[te], y_te, hb))
            if n == 0:
                p.reset_adaptation()
                p.calibration = None
                p.clear_prediction_cache()
                res["none"][n].append(score(*predict(p, g_te, dep), y_te, hb))
                continue
            p.reset_adaptation()
            p.calibration = (p.fit_factor_calibration(rows_tr, "eager", host) if dep is None
                             else p.fit_factor_calibration(rows_tr, deployment=dep))
            p.clear_prediction_cache()
            res["factor"][n].append(score(*predict(p, g_te, dep), y_te, hb))
            p.adapt(rows_tr, persist=False, deployment=dep)
            res["adapt"][n].append(score(*predict(p, g_te, dep), y_te, hb))
            if n >= 2:
                res["scratch"][n].append(score(*scratch(p, g_tr, y_tr, g_te, dep), y_te, hb))
    return res


def in_sample(p: GnnPredictor, graphs: list, y: np.ndarray, dep: Deployment | None) -> dict[str, float]:
    """MAPE (%) of the factor calibration and of ``adapt()`` fitted on every row of a group and scored on the same
    rows: the floor of each method on the group, before any extrapolation to rows it has not measured."""
    rows = [(g, {"latency_ms": float(v)}) for g, v in zip(graphs, y)]
    p.reset_adaptation()
    p.calibration = (p.fit_factor_calibration(rows, "eager", default_host_profile()) if dep is None
                     else p.fit_factor_calibration(rows, deployment=dep))
    p.clear_prediction_cache()
    out = {"factor_mape_pct": float(np.mean(np.abs(predict(p, graphs, dep)[0] / y - 1)) * 100)}
    ad = p.adapt(rows, persist=False, deployment=dep)
    out["adapt_mape_pct"] = float(np.mean(np.abs(predict(p, graphs, dep)[0] / y - 1)) * 100)
    out["adapt_ridge"] = ad.heads["latency_ms"].ridge if ad is not None and "latency_ms" in ad.heads else None
    p.reset_adaptation()
    p.calibration = None
    p.clear_prediction_cache()
    return out


def _median(values: list[float]) -> float:
    """The median of the finite values (NaN where there is none: e.g. no host-bound row was scored)."""
    v = [x for x in values if math.isfinite(x)]
    return float(np.median(v)) if v else math.nan


def group_deployment(mgs: list, mode: str) -> Deployment | None:
    """The deployment a group's rows record (``mode`` ``"described"``), or ``None`` (``"none"``: eager on the
    default host). Uses ``accuracy_deployment.described``, the rule the deployment benchmark reads rows with."""
    if mode == "none":
        return None
    from accuracy_deployment import described  # sibling script, imported only where a deployment is described

    deps = {d.key: d for d in (described(mg.measurement["source"], mg.measurement) for mg in mgs)}
    if len(deps) != 1:
        raise SystemExit(f"--deployment described: the group's rows record {len(deps)} deployments, one is needed "
                         "(group them with --group device, or filter with --row-device)")
    return next(iter(deps.values()))


def held_out_prior(p: GnnPredictor, source: str, device: str, source_rows: list) -> None:
    """Give ``p`` the checkpoint's pinned prior constants with what ``source``'s rows fitted in them refitted without
    ``device`` (``accuracy_deployment``'s per-cell constants; ``source_rows``: every row of the source, all GPUs)."""
    from accuracy_deployment import _cell_params  # sibling script, as accuracy_deployment imports accuracy_eager's

    base = p.prior_params if p.prior_params is not None else default_params()
    p.prior_params = _cell_params(source, device, source_rows, base)
    p.clear_prediction_cache()


#: ``--group`` modes whose groups are each predicted for their own measured GPU (the group name starts with it).
PER_GPU_GROUPS = ("device", "family")


def group_name(mg: MeasuredGraph, mode: str) -> str:
    """The group a row belongs to under ``--group mode``: its search space (``space``), its GPU's catalogue id
    (``device``), ``GPU/family`` with the timm family of the row's model name (``family``, :func:`timm_family`), or
    ``all``."""
    m = mg.measurement
    if mode == "space":
        return m.get("space") or "all"
    if mode == "none":
        return "all"
    device = DEVICE_ALIASES.get(m["device"], m["device"])
    if mode == "device":
        return device
    model = (m.get("config") or {}).get("model") if isinstance(m.get("config"), dict) else None
    if not model:
        raise SystemExit(f"--group family needs rows naming their model (config['model'], as timm rows do); a row of "
                         f"source {m.get('source')!r} does not")
    return f"{device}/{timm_family(str(model))}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--device", default="host-cpu", help="catalogue id predicted for (default host-cpu)")
    ap.add_argument("--row-device", default=None, help="the rows' device field to keep (default: all rows)")
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: the device's own checkpoint")
    ap.add_argument("--source", default=None, help="only rows of this dataset source (e.g. ryujaehun; default all)")
    ap.add_argument("--dtypes", default=None, help="comma-separated graph dtypes to keep (default all)")
    ap.add_argument("--group", choices=("space", "device", "family", "none"), default="none",
                    help="space: one group per search space; device: one per measured GPU, each predicted for it; "
                         "family: one per measured GPU and timm family")
    ap.add_argument("--deployment", choices=("none", "described"), default="none",
                    help="described: predict, calibrate and adapt for the deployment the rows record")
    ap.add_argument("--prior", choices=("checkpoint", "held-out"), default="checkpoint",
                    help="held-out: the prior constants fitted on the source's rows refitted without the group's GPU "
                         "(needs --source and --group device)")
    ap.add_argument("--ns", default="0,5,10,20,50,100")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--order", choices=("pareto", "random"), default="pareto",
                    help="pareto: measured in Pareto-rank order, as a search would (default); random: in the seeded "
                         "pool order, to tell the order's share of a miss from the model's")
    ap.add_argument("--pool", type=int, default=170, help="candidates of a group per draw (default 170)")
    ap.add_argument("--max-rows", type=int, default=None,
                    help="keep this many rows of each group (seeded sample; default all): featurising every row of a "
                         "5,000-row file costs minutes")
    ap.add_argument("--in-sample", action="store_true",
                    help="also fit the factor calibration and adapt() on every row of each group and score them on the "
                         "same rows (each method's floor on the group)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.ns.split(",")]
    if args.prior == "held-out" and (args.source is None or args.group != "device"):
        ap.error("--prior held-out needs --source and --group device")

    ck = args.checkpoint or find_checkpoint(args.device)
    base = GnnPredictor.load(ck, load_calibration=False)
    source_rows = [mg for mg in load_measurements(args.data, source=args.source) if mg.measurement.get("latency_ms")]
    dtypes = set(args.dtypes.split(",")) if args.dtypes else None
    rows = [mg for mg in source_rows if (args.row_device is None or mg.measurement["device"] == args.row_device)
            and (dtypes is None or mg.graph.spec.dtype in dtypes)]
    groups: dict[str, list] = defaultdict(list)
    for mg in rows:
        groups[group_name(mg, args.group)].append(mg)
    report: dict[str, dict] = {}
    t0 = time.perf_counter()
    answering = "each group's GPU" if args.group in PER_GPU_GROUPS else args.device
    print(f"checkpoint {ck} answering for {answering}; "
          f"{len(rows)} rows in {len(groups)} group(s)")
    for name, mgs in sorted(groups.items()):
        if args.max_rows is not None and len(mgs) > args.max_rows:
            keep = np.random.default_rng(0).choice(len(mgs), size=args.max_rows, replace=False)
            mgs = [mgs[i] for i in sorted(keep)]
        device = name.split("/")[0] if args.group in PER_GPU_GROUPS else args.device
        p = GnnPredictor(base.model, base.meta, device, load_calibration=False)
        if args.prior == "held-out":
            held_out_prior(p, args.source, device, source_rows)
        dep = group_deployment(mgs, args.deployment)
        graphs_all = [mg.graph for mg in mgs]
        y_all = np.array([float(mg.measurement["latency_ms"]) for mg in mgs])
        with p.one_network_pass(graphs_all):  # the members' outputs of every row, reused by every fit and score
            res = run_group(p, graphs_all, y_all, ns, args, dep)
            floor = in_sample(p, graphs_all, y_all, dep) if args.in_sample else None
        med = {m: {n: {k: _median([r[k] for r in v]) for k in SCORES}
                   for n, v in sorted(per.items()) if v} for m, per in res.items()}
        report[name] = {"rows": len(mgs), "draws": args.draws, "pool": args.pool, "order": args.order, "device": device,
                        "deployment": dep.key if dep is not None else None, "prior": args.prior, "median": med}
        if floor is not None:
            report[name]["in_sample"] = floor
        print(f"\n== {name}: {len(mgs)} rows; medians over {args.draws} draws (MAPE % / tau / within ±2σ)")
        print(f"{'n':>4} " + " ".join(f"{m:>24}" for m in ("none", *METHODS)))
        for n in ns:
            cells = []
            for m in ("none", *METHODS):
                v = med[m].get(n)
                cells.append(f"{v['mape_pct']:7.1f} {v['tau']:6.3f} {v['coverage_2sigma']:5.2f}   " if v else f"{'-':>24}")
            print(f"{n:>4} " + " ".join(f"{c:>24}" for c in cells))
        if floor is not None:
            print(f"in sample (all {len(mgs)} rows fitted and scored): factor {floor['factor_mape_pct']:.1f} %, adapt "
                  f"{floor['adapt_mape_pct']:.1f} % (ridge {floor['adapt_ridge']})")
        sys.stdout.flush()
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.out is not None:
        write_output(args.out, json.dumps(report, indent=1) + "\n", "--out", error=InvalidValueError)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
