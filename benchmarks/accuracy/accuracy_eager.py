"""Leave-one-GPU-out accuracy on real eager GPU timings: the prior (host model + roofline) and prior + GNN.

Usage (from the repository root; the data path is an argument, nothing is downloaded)::

    PYTHONPATH=. .venv-vision/bin/dippm-nas dataset import ryujaehun \\
        ../shared/data/ryujaehun_torchvision_eager_bs12_turing_pascal.csv --out ryujaehun.sqlite
    python benchmarks/accuracy/accuracy_eager.py --data ryujaehun.sqlite [--gnn] [--out DIR]

For each of the GPUs in the data (RTX 2080 Ti, TITAN RTX, TITAN Xp), the host model is refitted without that
GPU's rows (fp16 and fp32 rows of the other two; :func:`dippm_nas.prior.fit_host_model`, GPU constants as
shipped but the FP64 efficiency, refitted on the other two GPUs' fp64 rows by ``calibrate_fp64.py``) and the held-out GPU's rows are predicted through its catalogue entry and each row's execution
(eager, the input copy inside the timed region, the host's clock from the run's system facts, PyTorch 1.x).
With ``--gnn`` a GraphSAGE ensemble is also trained on the other two GPUs' fp16/fp32 rows, on that refitted
prior (``dippm-nas train``), and scored on the held-out rows. fp16 and fp32 are reported apart, fp64 too
(prior only: no checkpoint trains on fp64), and host-bound and GPU-bound rows apart (by the prior's timelines).
Figures: MAPE, median APE, Kendall τ, share within ±2σ. The prior's σ is the one ``predict()`` gives
(:func:`dippm_nas.prior.latency_sigma_log`: host-bound, GPU-bound and float64 σ on the parts of the critical
path), its three σ measured leave-one-GPU-out between the two training GPUs only (nested: the held-out GPU's
rows never set its own σ).
Few-shot (``--shots``): k measured models of the held-out GPU (one dtype) fit its host and GPU factors
(:func:`dippm_nas.predictor.fit_timeline_factors`, what ``calibrate()`` does on a GPU), scored on the other
models of that dtype; medians over random draws.
Op classes (:func:`dippm_nas.predictor.calibration_classes`) get their own GPU factor where the k models tell
them apart; the same draws with the common factors only, and the fit on all rows of the cell scored in-sample
(the floor of a fit of this form), are printed beside them. Few-shot is scored on the prior, also with ``--gnn``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from dippm_nas.predictor import calibration_classes
from dippm_nas.dataset import load_measurements
from dippm_nas.features import featurize
from dippm_nas.predictor import GnnPredictor, fit_timeline_factors
from dippm_nas.prior import (HostRow, default_params, estimate, fit_host_model, host_model_latency_ms,
                             latency_sigma_log, latency_us, row_settings)
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import output_path, write_output

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "fit"))
from calibrate_fp64 import fit_eta, with_fp64_efficiency  # noqa: E402  (scripts/fit/calibrate_fp64.py)
from calibrate_host_model import gpu_bound_sigma_by_dtype  # noqa: E402  (scripts/fit/calibrate_host_model.py)
import fit_input_copy  # noqa: E402  (scripts/fit/fit_input_copy.py: the first touch of a fresh batch, per host)


def _metrics(pred: np.ndarray, y: np.ndarray, sigma_log: np.ndarray) -> dict[str, float]:
    if len(y) == 0:
        return {"n": 0}
    ape = np.abs(pred / y - 1.0) * 100
    r = np.abs(np.log(pred / y))
    return {"n": int(len(y)), "mape_pct": float(ape.mean()), "median_ape_pct": float(np.median(ape)),
            "kendall_tau": float(kendalltau(pred, y)[0]) if len(y) > 2 else math.nan,
            "within_2sigma": float(np.mean(r <= 2 * sigma_log))}


def _fmt(m: dict[str, float]) -> str:
    if not m.get("n"):
        return "n=0"
    return (f"n={m['n']:3d}  MAPE {m['mape_pct']:5.1f} %  median {m['median_ape_pct']:5.1f} %  "
            f"tau {m['kendall_tau']:.3f}  ±2σ {m['within_2sigma']:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="dataset file with the ryujaehun rows (graphs captured)")
    ap.add_argument("--gnn", action="store_true", help="also train and score prior + GNN per held-out GPU")
    ap.add_argument("--members", type=int, default=3, help="GNN ensemble members (default 3)")
    ap.add_argument("--time-budget", type=int, default=150, help="GNN training budget per GPU, seconds (default 150)")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON report and the GNN checkpoints")
    ap.add_argument("--shots", default="3,5,10",
                    help="few-shot: numbers k of measured models of the held-out GPU that fit its host and GPU "
                         "factors (fp16, fp32 and fp64 apart), scored on the rest (default 3,5,10; '' skips)")
    ap.add_argument("--draws", type=int, default=30, help="random draws of the k models per setting (default 30)")
    ap.add_argument("--rows-out", type=Path, default=None, metavar="DIR",
                    help="write the prior's rows per held-out GPU and dtype (model, latency_ms_pred, latency_ms_std, "
                         "latency_ms) as DIR/<gpu>__<dtype>.jsonl, for benchmarks/accuracy/search_view.py --rows")
    args = ap.parse_args(argv)

    rows = []
    for mg in load_measurements(args.data, source="ryujaehun"):
        m = mg.measurement
        ex = row_settings(m.get("conditions"), m.get("environment"))
        # the loop's float32 batch is the DataLoader workers' tensor, mapped fresh (scripts/fit/fit_input_copy.py)
        rows.append((HostRow(mg.graph, m["device"], ex, float(m["latency_ms"]), fresh_pages=mg.spec.dtype == "float32"),
                     m["config"]["model"]))
    devices = sorted({r.device for r, _ in rows})
    base = default_params()
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="accuracy_eager_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, dict[str, dict[str, float]]] = {}
    print(f"leave-one-GPU-out over {devices}; {len(rows)} rows")
    for dev in devices:
        train = [r for r, _ in rows if r.device != dev and r.graph.spec.dtype in ("float16", "float32")]
        test = [(r, name) for r, name in rows if r.device == dev]
        fold = _without_fp64_rows_of(base, rows, [dev])
        hm = fold_host_model(rows, dev, fold, base)
        hm = dataclasses.replace(hm, metrics={**hm.metrics, **_nested_sigma(
            rows, dev, dataclasses.replace(base, host_model=hm))})
        params = dataclasses.replace(fold, host_model=hm)
        ests = [estimate(r.graph, r.device, params=params, deployment=r.execution) for r, _ in test]
        sig = np.array([latency_sigma_log(e, params) or 0.0 for e in ests])
        legacy_params = dataclasses.replace(base, host_model=None)
        legacy = np.array([estimate(r.graph, r.device, params=legacy_params,
                                     deployment=r.execution).latency_ms
                           for r, _ in test])
        prior = host_model_latency_ms(hm, [r for r, _ in test], params)  # a fresh float32 batch's first touch
        classes = [calibration_classes(r.graph) for r, _ in test]
        bound = np.array([e.launch_bound for e in ests])
        y = np.array([r.latency_ms for r, _ in test])
        dt = np.array([r.graph.spec.dtype for r, _ in test])
        gnn = None
        if args.gnn:
            gnn = _gnn_predictions(args, dev, devices, params, [r for r, _ in test], out_dir)
        if args.rows_out is not None:
            _write_rows(args.rows_out, dev, test, prior, sig, y, dt)
        print(f"\n== held out: {dev} (host model refitted on {len(train)} rows of the other GPUs)")
        for dtype in ("float16", "float32", "float64"):
            for part, mask in (("all", np.ones(len(y), bool)), ("host-bound", bound), ("GPU-bound", ~bound)):
                sel = (dt == dtype) & mask
                key = f"{dev} {dtype} {part}"
                mp = _metrics(prior[sel], y[sel], sig[sel])
                report[key] = {"prior": mp}
                line = f"  {dtype:8s} {part:10s} prior       {_fmt(mp)}"
                if part == "all":
                    ml = _metrics(legacy[sel], y[sel], sig[sel])
                    report[key]["legacy_host_constants"] = ml
                    line += (f"\n  {'':8s} {'':10s} legacy      {_fmt(ml)}  (10 µs + 3 µs per operator; "
                             f"median pred/meas {np.median(legacy[sel] / y[sel]):.2f})")
                if gnn is not None and dtype != "float64":
                    mg_ = _metrics(gnn[0][sel], y[sel], gnn[1][sel])
                    report[key]["prior+gnn"] = mg_
                    line += f"\n  {'':8s} {'':10s} prior+GNN   {_fmt(mg_)}"
                print(line)
        for k in [int(x) for x in args.shots.split(",") if x.strip()]:
            for dtype in ("float16", "float32", "float64"):
                idx = np.flatnonzero(dt == dtype)
                res = few_shot(ests, classes, prior, y, idx, k, args.draws)
                report[f"{dev} {dtype} few-shot k={k}"] = {"prior": res}
                print_few_shot(f"{dtype:8s}", res)
    write_output((out_dir / "accuracy_eager.json"), json.dumps(report, indent=1) + "\n", "output file",
                 error=InvalidValueError)
    print(f"\nwrote {out_dir / 'accuracy_eager.json'}")
    return 0


def _write_rows(out: Path, dev: str, test: list, prior: np.ndarray, sig: np.ndarray, y: np.ndarray,
                dt: np.ndarray) -> None:
    """One JSON Lines file per dtype of the held-out GPU: the prior's mean and σ (ms) and the measurement."""
    out.mkdir(parents=True, exist_ok=True)
    for dtype in sorted(set(dt.tolist())):
        with output_path(out / f"{dev}__{dtype}.jsonl", "output file", error=InvalidValueError) as tmp, \
                open(tmp, "w", encoding="utf-8") as f:
            for (r, name), p, s, m in zip(test, prior, sig, y):
                if r.graph.spec.dtype == dtype:
                    f.write(json.dumps({"model": name, "latency_ms_pred": float(p), "latency_ms_std": float(p * s),
                                        "latency_ms": float(m)}) + "\n")


def _without_fp64_rows_of(base, rows: list, devices: list[str]):
    """``base`` with its FP64 efficiency refitted on the fp64 rows of the GPUs not in ``devices``."""
    fp64 = [r for r, _ in rows if r.device not in devices and r.graph.spec.dtype == "float64"]
    return with_fp64_efficiency(base, fit_eta(fp64, with_fp64_efficiency(base, None))) if fp64 else base


def fold_host_model(rows: list, held_out: str, fold, base):
    """The host model fitted without ``held_out``'s rows (``rows``: ``(HostRow, model name)``; its fp16 and fp32
    rows), with the first touch of a fresh batch measured on the other hosts
    (``scripts/fit/fit_input_copy.py``); ``fold``: the prior's constants of the fold, ``base``: the shipped ones."""
    train = [r for r, _ in rows if r.device != held_out and r.graph.spec.dtype in ("float16", "float32")]
    medians = {(r.device, name, r.graph.spec.dtype): r.latency_ms for r, name in rows}
    page = fit_input_copy.summarise(fit_input_copy.per_host(medians, base.host_model), without=held_out)
    return fit_host_model(train, params=fold, base=dataclasses.replace(
        base.host_model, h2d_fresh_page_us=page["h2d_fresh_page_us"],
        h2d_fresh_page_sigma_log=page["h2d_fresh_page_sigma_log"]))


def _nested_sigma(rows: list, held_out: str, base) -> dict[str, float]:
    """The host model's σ metrics (host-bound, GPU-bound, float64, and the GPU-bound rows of float16 and float32
    apart as ``sigma_log_gpu_unseen_<dtype>``, as ``scripts/fit/calibrate_host_model.py`` records them) measured
    leave-one-GPU-out between the GPUs other than ``held_out``: each fitted on its fp16/fp32 rows, the other's
    rows predicted."""
    others = sorted({r.device for r, _ in rows} - {held_out})
    res: dict[str, list[float]] = {"host": [], "gpu": [], "fp64": []}
    half_full: list[tuple[float, bool, str]] = []  # (log error, host-bound, dtype) of the fp16 / fp32 rows
    for a in others:
        fit = [r for r, _ in rows
               if r.device not in (held_out, a) and r.graph.spec.dtype in ("float16", "float32")]
        inner = _without_fp64_rows_of(base, rows, [held_out, a])
        m = fit_host_model(fit, params=inner, base=base.host_model)
        test = [r for r, _ in rows if r.device == a]
        err = np.log(host_model_latency_ms(m, test, inner) / np.array([r.latency_ms for r in test]))
        p = dataclasses.replace(inner, host_model=m)
        for r, e in zip(test, err):
            key = ("fp64" if r.graph.spec.dtype == "float64"
                   else "host" if estimate(r.graph, r.device, params=p, deployment=r.execution).launch_bound else "gpu")
            res[key].append(float(e))
            if key != "fp64":
                half_full.append((float(e), key == "host", r.graph.spec.dtype))
    rms = {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in res.items() if v}
    out = {"sigma_log_host": rms.get("host", rms.get("gpu", 0.0)),
           "sigma_log_gpu_bound": rms.get("gpu", rms.get("host", 0.0))}
    if "fp64" in rms:
        out["sigma_log_gpu_bound_float64"] = rms["fp64"]
    if half_full:
        err, host, dtypes = (np.array(v) for v in zip(*half_full))
        out.update(gpu_bound_sigma_by_dtype(err, host.astype(bool), dtypes))
    return out


def few_shot(ests, classes: list[np.ndarray], prior: np.ndarray, y: np.ndarray, idx: np.ndarray, k: int,
             draws: int, *, seed: int = 0) -> dict[str, float]:
    """Fit host, GPU and op-class GPU factors (:func:`fit_timeline_factors`, what ``calibrate()`` does on a
    GPU) on ``k`` random rows of ``idx`` and score the rest; medians over ``draws`` draws. The same draws
    scored with the common factors only (``node_classes=None``) give ``common_only_mape_pct``; the
    fit on every row of ``idx``, scored on those rows, gives ``all_rows_in_sample_mape_pct`` (the floor a
    few-shot fit of this form cannot beat)."""
    rng = np.random.default_rng(seed)
    mape, common, zero, tau, kept = [], [], [], [], []
    for _ in range(draws):
        pick = rng.choice(idx, size=k, replace=False)
        rest = np.setdiff1d(idx, pick)
        tf = fit_timeline_factors([_parts(ests[i]) for i in pick], [float(y[i]) for i in pick],
                                  node_classes=[classes[i] for i in pick])
        tc = fit_timeline_factors([_parts(ests[i]) for i in pick], [float(y[i]) for i in pick])
        cal = np.array([latency_us(*tf.apply(*_parts(ests[i]), classes[i])) / 1e3 for i in rest])
        com = np.array([latency_us(*tc.apply(*_parts(ests[i]))) / 1e3 for i in rest])
        mape.append(float(np.mean(np.abs(cal / y[rest] - 1)) * 100))
        common.append(float(np.mean(np.abs(com / y[rest] - 1)) * 100))
        zero.append(float(np.mean(np.abs(prior[rest] / y[rest] - 1)) * 100))
        tau.append(float(kendalltau(cal, y[rest])[0]))
        kept.append(sum(1 for w in tf.class_kept.values() if w > 0))
    full = fit_timeline_factors([_parts(ests[i]) for i in idx], [float(y[i]) for i in idx],
                                node_classes=[classes[i] for i in idx])
    ins = np.array([latency_us(*full.apply(*_parts(ests[i]), classes[i])) / 1e3 for i in idx])
    return {"k": k, "draws": draws, "mape_pct": float(np.median(mape)),
            "common_only_mape_pct": float(np.median(common)), "zero_shot_mape_pct": float(np.median(zero)),
            "kendall_tau": float(np.median(tau)), "classes_kept_median": float(np.median(kept)),
            "all_rows_in_sample_mape_pct": float(np.mean(np.abs(ins / y[idx] - 1)) * 100),
            "all_rows_factors": {"host": math.exp(full.host_log), "gpu": math.exp(full.gpu_log),
                                 **{f"class_{c}": f for c, f in full.class_factors.items()}}}


def print_few_shot(label: str, res: dict) -> None:
    print(f"  {label} k={res['k']:<2d} shots prior       MAPE {res['mape_pct']:5.1f} % (common factors only "
          f"{res['common_only_mape_pct']:5.1f} %, zero-shot {res['zero_shot_mape_pct']:5.1f} % on the same rows), "
          f"median over {res['draws']} draws; tau {res['kendall_tau']:.3f}; all rows in-sample "
          f"{res['all_rows_in_sample_mape_pct']:5.1f} %")


def _parts(e) -> tuple[np.ndarray, np.ndarray, float]:
    return e.node_time_ms * 1e3, e.node_host_ms * 1e3, e.pass_host_ms * 1e3


def _gnn_predictions(args: argparse.Namespace, dev: str, devices: list[str], params, test: list[HostRow],
                     out_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Train an ensemble on the other GPUs' fp16/fp32 rows (this prior pinned) and predict ``test``:
    (latency ms, log σ) per row; fp64 rows get the prior (no training dtype)."""
    pp = out_dir / f"prior_without_{dev}.json"
    params.save(pp)
    ckpt = out_dir / f"gnn_without_{dev}.pt"
    others = [d for d in devices if d != dev]
    # the checkpoint answers for a training GPU (its test split gives the training report); the held-out
    # GPU's rows are featurised on their own device below
    cmd = [sys.executable, "-m", "dippm_nas", "train", "--data", str(args.data), "--device", others[0],
           "--train-devices", ",".join(others), "--dtypes", "float16,float32", "--split", "random", "--seed", "0",
           "--members", str(args.members), "--time-budget", str(args.time_budget), "--targets", "latency_ms",
           "--prior-params", str(pp), "--out", str(ckpt)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    pred = GnnPredictor.load(ckpt)
    lat, sig = [], []
    for r in test:
        if r.graph.spec.dtype not in ("float16", "float32"):
            e = estimate(r.graph, r.device, params=params, deployment=r.execution)
            lat.append(e.latency_ms)
            sig.append(latency_sigma_log(e, params) or 0.0)
            continue
        f = featurize(r.graph, r.device, prior_params=pred.prior_params, execution=r.execution)
        mean, std, ood, nov, other = pred.predict_log_full([f])
        lat.append(math.exp(mean[0, 0]))
        sig.append(pred.sigma_log("latency_ms", float(std[0, 0]), ood=bool(ood[0]), novelty=float(nov[0])))
    return np.array(lat), np.array(sig)


if __name__ == "__main__":
    raise SystemExit(main())
