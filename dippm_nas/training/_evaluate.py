"""Evaluation: MAPE, median APE, Kendall τ and ±2σ coverage per target; markdown report and PNG.

``coverage_2sigma`` is the share of measurements within ±2 standard deviations of the prediction
(log-space σ, as the predictor computes it): ≈ 0.95 means the std is honest, far below means
over-confident.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from dippm_nas._files import write_output
from dippm_nas._optional import require
from dippm_nas.deployment import Deployment
from dippm_nas.errors import DatasetError, InvalidValueError
from dippm_nas.devices import resolve_device
from dippm_nas.features import GraphFeatures
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import TARGETS, GnnPredictor, fit_calibration
from dippm_nas.training._examples import Example, featurize_examples, load_examples, split_examples

__all__ = ["regression_metrics", "metrics_table", "evaluate_examples", "evaluate_predictions", "write_report",
           "scatter_png", "few_shot_curve", "evaluate_checkpoint"]


def regression_metrics(y: np.ndarray, yhat: np.ndarray, std: np.ndarray | None = None) -> dict[str, float]:
    """``{"n", "mape_pct", "median_ape_pct", "kendall_tau", "coverage_2sigma"}`` (values in units, std in units)."""

    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    ape = np.abs(yhat - y) / np.abs(y) * 100.0
    out = {"n": int(len(y)), "mape_pct": float(ape.mean()) if len(y) else math.nan,
           "median_ape_pct": float(np.median(ape)) if len(y) else math.nan,
           "kendall_tau": float(kendalltau(y, yhat).statistic) if len(y) > 1 else math.nan}
    if std is not None:
        std = np.asarray(std, float)
        # log-space interval, as the predictor's std is a log-space std turned into units
        s_log = std / np.maximum(yhat, 1e-12)
        out["coverage_2sigma"] = float(np.mean(np.abs(np.log(y) - np.log(yhat)) <= 2 * s_log)) if len(y) else math.nan
    return out


def evaluate_examples(pred: GnnPredictor, feats: Sequence[GraphFeatures], examples: Sequence[Example]
                      ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Metrics per target of ``pred`` on ``examples`` (features precomputed), plus the analytic prior's.

    Returns:
        ``(table, rows)``: ``table[target]`` = metrics of the predictor and ``table[target + "_prior"]`` of
        the analytic prior alone; ``rows`` one dict per example (label, prediction, std, prior, family).
    """
    mean, std, ood, nov, other_machine = pred.predict_log_full(feats)
    table: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for i, (f, e) in enumerate(zip(feats, examples)):
        r: dict[str, Any] = {"family": e.family, "device": e.device, "key": e.key[:12]}
        if getattr(e, "name", ""):
            r["name"] = e.name
        r["outside_training_range"] = bool(ood[i])
        if other_machine[i]:
            r["other_machine"] = True
        if math.isfinite(nov[i]):
            r["novelty"] = float(nov[i])
        for j, t in enumerate(TARGETS):
            if t not in e.y or t not in pred.meta.targets:
                continue
            m = float(mean[i, j])
            s = pred.sigma_log(t, float(std[i, j]), ood=bool(ood[i]), novelty=float(nov[i]),
                               other_machine=bool(other_machine[i]))  # the σ predict() returns
            if pred.calibration is not None and pred.calibration.has(t):
                m, s = pred.calibration.apply(t, m, s)
            v = math.exp(m)
            prior = {"latency_ms": f.prior_latency_ms, "energy_j": f.prior_energy_j, "memory_mib": f.prior_memory_mib}[t]
            r.update({t: e.y[t], f"{t}_pred": v, f"{t}_std": v * s, f"{t}_prior": prior})
        rows.append(r)
    own = _target_metrics(rows)
    for t in TARGETS:
        if t in own:
            table[t] = own[t]
        pr = [r for r in rows if t in r and r[f"{t}_prior"] is not None]
        if pr:
            table[t + "_prior"] = regression_metrics(np.array([r[t] for r in pr]), np.array([r[f"{t}_prior"] for r in pr]))
    return table, rows


def _target_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{target: regression_metrics}`` of the rows holding ``target``, ``target_pred`` and ``target_std`` (the
    coverage left out where a row has no std)."""
    table: dict[str, Any] = {}
    for t in TARGETS:
        rs = [r for r in rows if t in r]
        if not rs:
            continue
        std = [r[f"{t}_std"] for r in rs]
        table[t] = regression_metrics(np.array([r[t] for r in rs]), np.array([r[f"{t}_pred"] for r in rs]),
                                      None if any(s is None for s in std) else np.array(std, float))
    return table


def evaluate_predictions(predictions: Sequence[Prediction], examples: Sequence[Example]
                         ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Metrics per target of one :class:`~dippm_nas.Prediction` per example (e.g. a predictor's
    ``predict_graphs`` for a deployment) against the examples' labels.

    Returns:
        ``(table, rows)`` as :func:`evaluate_examples` (without the prior's metrics); each row also holds the
        sources and ``deployment_assumed`` of its prediction.
    """
    if len(predictions) != len(examples):
        raise InvalidValueError(f"one prediction per example: got {len(predictions)} predictions for "
                                f"{len(examples)} examples")
    rows: list[dict[str, Any]] = []
    for p, e in zip(predictions, examples):
        r: dict[str, Any] = {"family": e.family, "device": e.device, "key": e.key[:12]}
        if e.name:
            r["name"] = e.name
        for t in TARGETS:
            v = getattr(p, t)
            if t in e.y and v is not None:
                r.update({t: e.y[t], f"{t}_pred": float(v), f"{t}_std": getattr(p, f"{t}_std"),
                          f"{t}_source": getattr(p, f"{t.split('_')[0]}_source")})
        r["deployment_assumed"] = p.labels.get("deployment_assumed", "")
        rows.append(r)
    return _target_metrics(rows), rows


def metrics_table(pred: GnnPredictor, feats: Sequence[GraphFeatures], examples: Sequence[Example]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Alias of :func:`evaluate_examples` (kept for the training loop)."""
    return evaluate_examples(pred, feats, examples)


def scatter_png(rows: Sequence[Mapping[str, Any]], target: str, path: str | Path, title: str = "") -> Path:
    """Predicted-vs-measured log-log scatter (with the analytic prior in grey) written to ``path``."""

    require("matplotlib", "plot", "the predicted-vs-measured PNG")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in rows if target in r]
    y = np.array([r[target] for r in rs])
    yh = np.array([r[f"{target}_pred"] for r in rs])
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=110)
    pr = [r for r in rs if r.get(f"{target}_prior") is not None]
    if pr:
        ax.scatter([r[target] for r in pr], [r[f"{target}_prior"] for r in pr], s=6, c="0.7", label="analytic prior")
    fams = sorted({r.get("family", "") for r in rs})
    for fam in fams:
        idx = [i for i, r in enumerate(rs) if r.get("family", "") == fam]
        ax.scatter(y[idx], yh[idx], s=6, label=f"GNN ({fam})" if len(fams) > 1 else "GNN")
    lo, hi = float(min(y.min(), yh.min())), float(max(y.max(), yh.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"measured {target}")
    ax.set_ylabel(f"predicted {target}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def write_report(sections: Sequence[tuple[str, Mapping[str, Any]]], path: str | Path, *, intro: str = "") -> Path:
    """A markdown report: one table per ``(title, metrics table)`` section."""
    lines = [intro.rstrip(), ""] if intro else []
    cols = ("n", "mape_pct", "median_ape_pct", "kendall_tau", "coverage_2sigma")
    for title, tab in sections:
        lines += [f"### {title}", "", "| target | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for t, m in tab.items():
            lines.append(f"| {t} | " + " | ".join(_fmt(m.get(c, "")) for c in cols) + " |")
        lines.append("")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, "\n".join(lines) + "\n", "evaluation report", error=InvalidValueError)
    return path


def few_shot_curve(pred: GnnPredictor, feats: Sequence[GraphFeatures], examples: Sequence[Example],
                   ks: Sequence[int], *, repeats: int = 5, seed: int = 0) -> dict[str, Any]:
    """Error before and after calibrating on ``k`` of ``examples`` (evaluated on the others).

    Draws are made within one family at a time (calibrate on ``k`` rows of a held-out family, evaluate on
    the other rows of that family); for each ``k``, ``repeats`` draws per family, metrics averaged over
    all draws. The predictor's own calibration is restored afterwards; nothing is persisted.

    Returns:
        ``{"before": table, "k=5": table, ...}`` (tables as :func:`evaluate_examples`, means over draws).
    """

    saved = pred.calibration
    pred.calibration = None
    out: dict[str, Any] = {"before": evaluate_examples(pred, feats, examples)[0]}
    mean_all, _ = pred.predict_log(feats)
    rng = random.Random(seed)
    fams: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        fams.setdefault(e.family, []).append(i)
    try:
        for k in ks:
            draws = [(idx, rep) for idx in fams.values() if len(idx) > k for rep in range(repeats)]
            if not draws:
                continue
            acc: dict[str, dict[str, list[float]]] = {}
            for idx, _ in draws:
                pick = rng.sample(idx, k)
                rest = [i for i in idx if i not in set(pick)]
                pred.calibration = fit_calibration(pred.device, pred.meta, mean_all[pick],
                                                   [examples[i].y for i in pick], targets=list(pred.meta.targets))
                tab, _ = evaluate_examples(pred, [feats[i] for i in rest], [examples[i] for i in rest])
                for t, m in tab.items():
                    if t.endswith("_prior"):
                        continue
                    for name, v in m.items():
                        acc.setdefault(t, {}).setdefault(name, []).append(float(v))
                pred.calibration = None
            out[f"k={k}"] = {t: {name: float(np.mean(v)) for name, v in ms.items()} for t, ms in acc.items()}
    finally:
        pred.calibration = saved
    return out


def evaluate_checkpoint(checkpoint: str | Path, data: Sequence[str | Path], *, device: str, split: str = "random",
                        heldout_families: Sequence[str] = (), devices: Sequence[str] | None = None, seed: int = 0,
                        calibrate_ks: Sequence[int] = (), eval_device: str | None = None,
                        holdout_frac: float = 0.25, deployment: Any = None) -> dict[str, Any]:
    """Load a checkpoint (without any persisted calibration), rebuild the split and evaluate on its test rows.

    Args:
        device: the device the checkpoint answers for (checked against its metadata).
        eval_device: evaluate on the test rows of this device instead (default ``device``), e.g. an A100
            checkpoint on RTX 3090 rows through the device features.
        holdout_frac: for ``split="timm-family"`` (see :func:`~dippm_nas.training.split_examples`).
        deployment: ``None`` (default): each row is featurised with the execution it records. Otherwise how
            every test row ran (a :class:`~dippm_nas.Deployment`, a mapping of its fields or a JSON/TOML file;
            ``Deployment()``: nothing described): the rows are predicted as :func:`dippm_nas.predict` predicts
            them for it (``predict_graphs``, σ included) and scored by :func:`evaluate_predictions`; the result
            holds ``"deployment"``. Only for the checkpoint's own device, without ``calibrate_ks``.

    Raises:
        DeploymentError: a bad deployment.
        InvalidValueError: a deployment with another ``eval_device`` or with ``calibrate_ks``.
    """

    dev = resolve_device(device).id
    dep = None if deployment is None else Deployment.coerce(deployment)
    pred = GnnPredictor.load(checkpoint, device=dev, load_calibration=False)
    if eval_device is not None:
        dev = resolve_device(eval_device).id
    if dep is not None and (dev != pred.device or calibrate_ks):
        raise InvalidValueError(f"a deployment is evaluated through the checkpoint's predictions on its own device "
                                f"({pred.device!r}), without few-shot calibration; got eval_device={dev!r}, "
                                f"calibrate_ks={list(calibrate_ks)}")
    ex = load_examples(data, devices=devices)
    _, _, te = split_examples(ex, mode=split, heldout_families=heldout_families, seed=seed, holdout_frac=holdout_frac)
    test_devices = sorted({e.device for e in te})
    te = [e for e in te if e.device == dev]
    if not te:
        raise DatasetError(
            f"evaluation needs test rows of the evaluated device: the {split!r} split of {len(ex)} examples has no "
            f"test row of {dev!r}; devices with test rows: {', '.join(test_devices) or 'none'} (pick one with "
            f"eval_device / --eval-device, or add data of {dev!r})")
    if dep is not None:
        tab, rows = evaluate_predictions(pred.predict_graphs([e.graph for e in te], mig=False, deployment=dep), te)
        return {"device": dev, "n_test": len(te), "metrics": tab, "rows": rows, "deployment": dep.to_dict()}
    feats = featurize_examples(te, style=pred.meta.feature_style, prior_params=pred.prior_params,
                               host_threads=pred.host_threads)
    tab, rows = evaluate_examples(pred, feats, te)
    res: dict[str, Any] = {"device": dev, "n_test": len(te), "metrics": tab, "rows": rows}
    if calibrate_ks:
        res["calibration"] = few_shot_curve(pred, feats, te, calibrate_ks, seed=seed)
    return res
