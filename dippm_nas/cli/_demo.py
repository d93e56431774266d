"""``dippm-nas demo``: a real multi-objective NAS on this CPU, with predicted A100 costs and live validation.

The search space is ``demo_cnn`` (small plain CNNs); each candidate is trained for a few seconds on
scikit-learn's 8x8 digits (:func:`search_spaces.load_digits`, no download) and scored on a held-out fifth.
Objectives: accuracy (maximise), A100 latency and energy per batch (minimise), predicted in the dtype the
candidates would be deployed in (float16 by default, the dtype the A100 checkpoint is trained on);
constraints (mean + 1 sigma): predicted memory within the usable memory of the MIG profile ``1g.5gb`` and
predicted latency within a budget (5 ms per batch of 16384 by default).

An A100 prediction cannot be checked on a machine without an A100. What is checked here is the same
pipeline on the host CPU: Pareto candidates are measured on this CPU in float32 and compared with host-cpu
predictions. Every measurement adapts the host-cpu predictor (``predictor.adapt``: the factor calibration and
the residual heads, stored in the study's database for ``demo_cnn``); each round's candidates are predicted
with the adaptation of the rounds before, and also without it, so the error before and after adaptation is
measured on candidates the adaptation had not seen. ``learning_curve.png`` plots it against the rows the
adaptation had.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

from dippm_nas._redact import redact_url
from dippm_nas.cli._deployment_flags import add_deployment_args, deployment_from_args
from dippm_nas._files import write_output
from dippm_nas.cli._grammar import UsageError, float_flag, int_flag
from dippm_nas.errors import DippmNasError
from dippm_nas.spec import COMPUTE_DTYPES

__all__ = ["register"]

#: Host device every validation measurement runs on.
_HOST = "host-cpu"
#: Fewest measured graphs an adaptation is fitted on (``predictor.adapt`` leaves fewer unadapted).
_MIN_ADAPT_ROWS = 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a real multi-objective NAS on this CPU: digits CNNs, predicted A100 latency/energy (float16), "
             "MIG memory constraint, host-CPU validation with online adaptation; writes a Pareto table and plots",
        description="Multi-objective NAS on scikit-learn's digits: accuracy up, predicted A100 latency and "
                    "energy down (in the deployed dtype, float16), predicted memory within a MIG profile. "
                    "Candidates train a few seconds each on this CPU; Pareto candidates are measured on this "
                    "CPU in float32 and compared with host-cpu predictions, which every measurement adapts "
                    "(predictor.adapt). Bounded by --trials and --seconds.",
    )
    p.add_argument("--trials", type=int_flag("--trials", low=1), default=None, help="trials to run (default 30)")
    p.add_argument("--seconds", type=float_flag("--seconds", low=0, low_inclusive=False), default=None,
                   help="stop starting new trials after this many seconds")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run of about 20 s: 3 trials, 0.3 s of training each, batch 256, a validation "
                        "round after each trial measuring up to two candidates at batch 8 (explicit flags still win)")
    p.add_argument("--out", default="dippm-demo", help="output directory for plots, CSV and summary (default ./dippm-demo)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage (any SQLAlchemy RDB URL); default sqlite:///OUT/demo.sqlite3")
    p.add_argument("--study-name", default=None, help="study name (default: dippm-demo-<date-time>); "
                   "an existing study of that name is continued")
    p.add_argument("--seed", type=int_flag("--seed"), default=0, help="sampler and training seed (default 0)")
    p.add_argument("--sampler", choices=("tpe", "nsga2"), default="tpe", help="Optuna sampler (default tpe)")
    p.add_argument("--train-seconds", type=float_flag("--train-seconds", low=0, low_inclusive=False), default=None,
                   help="training budget per candidate, seconds (default 3)")
    p.add_argument("--epochs", type=int_flag("--epochs", low=1), default=None,
                   help="most training epochs per candidate (default 10)")
    p.add_argument("--device", default="a100-sxm4-40gb", help="device the costs are predicted for (default a100-sxm4-40gb)")
    p.add_argument("--dtype", default="float16", choices=COMPUTE_DTYPES,
                   help="dtype the candidates are deployed (and predicted) in on --device (default float16, the "
                        "A100 checkpoint's training dtype)")
    p.add_argument("--batch", type=int_flag("--batch", low=1), default=None,
                   help="serving batch the device costs are predicted for (default 16384 images: large enough that "
                        "wide 32x32 candidates outgrow 1g.5gb in float16)")
    add_deployment_args(p)
    p.add_argument("--mig-profile", default="1g.5gb", help="MIG profile the memory must fit (default 1g.5gb)")
    p.add_argument("--latency-budget-ms", type=float_flag("--latency-budget-ms", low=0, note="0: no latency budget"),
                   default=5.0,
                   help="constrain predicted latency (mean + 1 sigma), ms per batch (default 5.0; 0: no latency "
                        "budget)")
    p.add_argument("--validate-every", type=int_flag("--validate-every", low=1), default=None,
                   help="validation round every N trials (default 10)")
    p.add_argument("--validate-max", type=int_flag("--validate-max", low=1), default=None,
                   help="most Pareto candidates measured per round (default 3)")
    p.add_argument("--validate-batch", type=int_flag("--validate-batch", low=1), default=None,
                   help="batch size of the host-CPU validation measurements (default 64)")
    p.add_argument("--no-validate", action="store_true", help="skip validation")
    p.add_argument("--no-adapt", "--no-calibrate", dest="no_adapt", action="store_true",
                   help="keep the host-cpu predictions unadapted (default: every measurement adapts the host-cpu "
                        "predictor once two are in; each round is predicted with the rounds before)")
    p.add_argument("--no-plot", action="store_true", help="skip the plots")
    p.add_argument("--background", type=int_flag("--background", low=0), default=1, metavar="N",
                   help="conversion processes working while candidates train (default 1; 0: convert before training)")
    p.add_argument("--threads", type=int_flag("--threads", low=1), default=1,
                   help="torch CPU threads for training (default 1); validation measures at the thread count of "
                        "the host-cpu prediction")
    p.set_defaults(func=run)


#: Defaults of the flags ``--quick`` changes: (normal, quick).
_BUDGET_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "trials": (30, 3), "train_seconds": (3.0, 0.3), "epochs": (10, 1), "batch": (16384, 256),
    "validate_every": (10, 1), "validate_max": (3, 2), "validate_batch": (64, 8),
}


def _apply_budget_defaults(args: argparse.Namespace) -> None:
    """Fill the flags left unset with the normal or ``--quick`` defaults."""
    for name, (normal, quick) in _BUDGET_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else normal)


# ---------------------------------------------------------------------------------------------- output
def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _pm(v: Any, s: Any, spec: str) -> str:
    """``v ± s`` (``v`` alone without a σ)."""
    return _fmt(v, spec) if s is None else f"{_fmt(v, spec)} ± {_fmt(s, spec)}"


def _short(cfg: dict[str, Any] | None) -> str:
    if not cfg:
        return "-"
    return (f"r{cfg.get('resolution')} w{cfg.get('widths')} b{cfg.get('blocks')} k{cfg.get('kernel_size')}"
            f"{' bn' if cfg.get('batchnorm') else ''} {cfg.get('activation')}")


def _rows(study: Any, jobs: dict[int, Any]) -> list[dict[str, Any]]:
    import optuna

    front = {t.number for t in study.best_trials}
    rows = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        a = t.user_attrs
        j = jobs.get(t.number)
        meas = j.result if j is not None and j.result else {}
        pred = j.predicted if j is not None else {}
        m_ms = meas.get("latency_ms") if meas.get("status") == "ok" else None
        p_ms = pred.get("latency_ms")
        raw_ms = pred.get("latency_ms_unadapted", pred.get("latency_ms_uncalibrated", p_ms))
        rows.append({
            "trial": t.number, "pareto": t.number in front, "feasible": bool(a.get("feasible")),
            "accuracy": t.values[0], "latency_ms": a.get("predicted_latency_ms"),
            "latency_ms_std": a.get("predicted_latency_ms_std"), "latency_source": a.get("latency_source"),
            "energy_j": a.get("predicted_energy_j"), "energy_j_std": a.get("predicted_energy_j_std"),
            "energy_source": a.get("energy_source"), "memory_mib": a.get("predicted_memory_mib"),
            "memory_mib_std": a.get("predicted_memory_mib_std"), "memory_source": a.get("memory_source"),
            "mig_smallest_fit": a.get("mig_smallest_fit"), "train_epochs": a.get("train_epochs"),
            "violates_memory": (a.get("constraint_memory_mib") or 0.0) > 0,
            "violates_latency": (a.get("constraint_latency_ms") or 0.0) > 0,
            "config": json.dumps(a.get("search_space_config")),
            "host_cpu_predicted_ms": p_ms, "host_cpu_predicted_unadapted_ms": raw_ms,
            "host_cpu_adaptation_rows": pred.get("adaptation_rows"),
            "host_cpu_latency_source": pred.get("latency_source"), "host_cpu_measured_ms": m_ms,
            "host_cpu_error_pct": None if m_ms is None or p_ms is None else 100.0 * (p_ms - m_ms) / m_ms,
            "host_cpu_status": None if j is None else (meas.get("status") or j.status),
        })
    return rows


def _print_table(rows: list[dict[str, Any]], args: argparse.Namespace, device: str) -> None:
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: -r["accuracy"])
    print(f"\nPareto front (feasible trials). {device} figures PREDICTED for {args.dtype}, batch {args.batch}, "
          "as mean ± 1σ; host-cpu columns: float32, batch "
          f"{args.validate_batch}, 'ad' = predicted by the adapted host-cpu predictor:")
    head = (f"{'trial':>5} {'accuracy':>8} {'latency ms':>17} {'energy J':>15} {'memory MiB':>10} {'MIG fit':>7}"
            f" | {'host-cpu pred ms':>16} {'measured ms':>11} {'error %':>7}  config")
    print(head)
    print("-" * len(head))
    for r in front:
        meas = _fmt(r["host_cpu_measured_ms"], ".3f")
        if r["host_cpu_status"] not in (None, "ok", "done"):
            meas = "no fit" if r["host_cpu_status"] == "oom" else str(r["host_cpu_status"])
        pred = _fmt(r["host_cpu_predicted_ms"], ".3f")
        if r["host_cpu_adaptation_rows"] is not None:
            pred = f"{pred} ad"
        print(f"{r['trial']:>5} {r['accuracy']:>8.3f} {_pm(r['latency_ms'], r['latency_ms_std'], '.3g'):>17} "
              f"{_pm(r['energy_j'], r['energy_j_std'], '.3g'):>15} {_fmt(r['memory_mib'], '.0f'):>10} "
              f"{str(r['mig_smallest_fit']):>7} | {pred:>16} {meas:>11} {_fmt(r['host_cpu_error_pct'], '+.0f'):>7}  "
              f"{_short(json.loads(r['config']) if r['config'] else None)}")
    if not front:
        print("  (no feasible trial yet: every candidate broke a constraint)")
    infeasible = [r for r in rows if not r["feasible"]]
    broke = [f"{sum(r['violates_memory'] for r in rows)} memory beyond {args.mig_profile}'s usable memory"]
    if args.latency_budget_ms:
        broke += [f"{sum(r['violates_latency'] for r in rows)} latency beyond {args.latency_budget_ms:g} ms"]
    print(f"{len(infeasible)} of {len(rows)} completed trials broke a constraint (mean + 1σ; {', '.join(broke)}); "
          "they were reported to the sampler as constraint violations, not pruned.")


def _error_bars(ax: Any, rows: list[dict[str, Any]], key: str, **kw: Any) -> None:
    """Horizontal ±1σ bars of ``key`` (rows without a σ get none)."""
    with_s = [r for r in rows if r[key + "_std"] is not None]
    if with_s:
        xs = [r[key] for r in with_s]
        lo = [min(r[key + "_std"], 0.95 * r[key]) for r in with_s]  # log axis: keep the bar above zero
        hi = [r[key + "_std"] for r in with_s]
        ax.errorbar(xs, [r["accuracy"] for r in with_s], xerr=[lo, hi], fmt="none", lw=0.9, capsize=2, **kw)


def _plots(out: Path, rows: list[dict[str, Any]], jobs: list[Any], args: argparse.Namespace, device: str,
           mig_limit_mib: float | None) -> list[Path]:
    """The Pareto plot (σ bars) and the host-CPU predicted-vs-measured plot; matplotlib imported here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = [_pareto_plot(out, rows, args, device, mig_limit_mib, plt)]
    ok = [j for j in jobs if (j.result or {}).get("status") == "ok" and j.result.get("latency_ms")
          and j.predicted.get("latency_ms")]
    if ok:
        written.append(_measured_plot(out, ok, args, plt))
        written.append(_learning_curve_plot(out, ok, args, plt))
    return written


def _plain_log(ax: Any, which: str = "xy") -> None:
    """Plain numbers (``0.5``, ``20``) on the log axes ``which`` (``"x"`` or ``"xy"``), no minor labels."""
    import matplotlib.ticker

    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for axis in ((ax.xaxis,) if which == "x" else (ax.xaxis, ax.yaxis)):
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _pareto_plot(out: Path, rows: list[dict[str, Any]], args: argparse.Namespace, device: str,
                 mig_limit_mib: float | None, plt: Any) -> Path:
    """``pareto.png``: accuracy against predicted latency and energy, feasible, infeasible and the front."""
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 5.6), constrained_layout=True)
    feas = [r for r in rows if r["feasible"] and r["latency_ms"] is not None]
    infe = [r for r in rows if not r["feasible"] and r["latency_ms"] is not None and math.isfinite(r["latency_ms"])]
    front = [r for r in feas if r["pareto"]]
    sources = {k: sorted({str(r[k.split('_')[0] + '_source']) for r in feas + infe}) for k in ("latency_ms", "energy_j")}
    for ax, key, unit in ((axes[0], "latency_ms", "ms"), (axes[1], "energy_j", "J")):
        if any(r[key] is None for r in feas + infe):
            ax.text(0.5, 0.5, f"no {key} prediction", ha="center", va="center", transform=ax.transAxes)
            continue
        _error_bars(ax, [r for r in feas if not r["pareto"]], key, color="tab:blue", alpha=0.35)
        _error_bars(ax, front, key, color="black", alpha=0.8)
        ax.scatter([r[key] for r in feas], [r["accuracy"] for r in feas], c="tab:blue", s=34, alpha=0.85,
                   label="feasible", zorder=3)
        if infe:
            ax.scatter([r[key] for r in infe], [r["accuracy"] for r in infe], marker="x", c="tab:red", s=40,
                       label="infeasible (breaks a constraint)", zorder=3)
        if front:
            ax.scatter([r[key] for r in front], [r["accuracy"] for r in front], facecolors="none",
                       edgecolors="black", s=140, linewidths=1.4, label="Pareto front (of all objectives)", zorder=4)
            for r in front:
                ax.annotate(f"#{r['trial']}", (r[key], r["accuracy"]), textcoords="offset points", xytext=(7, -11),
                            fontsize=8)
        if key == "latency_ms" and args.latency_budget_ms:
            ax.axvline(args.latency_budget_ms, color="tab:red", ls="--", lw=1,
                       label=f"latency budget ({args.latency_budget_ms:g} ms, mean + 1σ)")
        ax.set_xscale("log")
        _plain_log(ax, "x")
        ax.set_xlabel(f"{device} {key.split('_')[0]} per batch of {args.batch}, {args.dtype} ({unit}, log scale); "
                      f"{'/'.join(sources[key])}, bars ±1σ", fontsize=9)
        ax.set_ylabel("held-out accuracy on digits")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=9, frameon=False)
    limit = f" ({mig_limit_mib:.0f} MiB usable)" if mig_limit_mib else ""
    fig.suptitle(f"dippm-nas demo: accuracy vs PREDICTED {device} cost; memory (mean + 1σ) within MIG "
                 f"{args.mig_profile}{limit}", fontsize=11)
    p = out / "pareto.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def _measured_plot(out: Path, ok: list[Any], args: argparse.Namespace, plt: Any) -> Path:
    """``predicted_vs_measured.png``: the host-cpu latency of the measured candidates, unadapted and adapted."""
    fig, ax = plt.subplots(figsize=(6.8, 6.4), constrained_layout=True)
    meas = [float(j.result["latency_ms"]) for j in ok]
    raw = [float(j.predicted.get("latency_ms_unadapted", j.predicted["latency_ms"])) for j in ok]
    cal = [(float(j.predicted["latency_ms"]), m) for j, m in zip(ok, meas) if "latency_ms_unadapted" in j.predicted]
    lo, hi = min(meas + raw) / 1.6, max(meas + raw) * 1.6
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="measured = predicted")
    ax.fill_between([lo, hi], [lo / 1.5, hi / 1.5], [lo * 1.5, hi * 1.5], color="gray", alpha=0.15,
                    label="within a factor 1.5")
    ax.scatter(raw, meas, facecolors="none", edgecolors="tab:orange", s=55, zorder=3,
               label="unadapted prediction")
    if cal:
        ax.scatter([c[0] for c in cal], [c[1] for c in cal], c="tab:green", s=40, zorder=4,
                   label="adapted (on earlier rounds' measurements)")
        for (x0, m), (x1, _) in zip([(r, m) for j, r, m in zip(ok, raw, meas)
                                     if "latency_ms_unadapted" in j.predicted], cal):
            ax.annotate("", (x1, m), (x0, m), arrowprops={"arrowstyle": "->", "color": "gray", "lw": 0.8})
    for j, r, m in zip(ok, raw, meas):
        ax.annotate(f"#{j.trial_number}", (r, m), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log(ax)
    ax.set_title(f"host CPU, float32, batch {args.validate_batch}: predicted vs measured latency\n"
                 f"{len(ok)} Pareto candidates measured on this CPU", fontsize=11)
    ax.set_xlabel("predicted host-cpu latency per batch (ms, log scale)")
    ax.set_ylabel("measured host-cpu latency per batch (ms, log scale)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    p = out / "predicted_vs_measured.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def _adaptation_rounds(jobs: list[Any]) -> list[dict[str, Any]]:
    """Per adaptation version the candidates were predicted with (before being measured): how many, the rows it
    was fitted on, and the latency MAPE of their predictions without and with it (percent)."""
    groups: dict[int, list[Any]] = {}
    for j in jobs:
        r, pr = j.result or {}, j.predicted
        if r.get("status") == "ok" and r.get("latency_ms") and "latency_ms_unadapted" in pr:
            groups.setdefault(int(pr["adaptation_version"]), []).append(j)
    out = []
    for v, js in sorted(groups.items()):
        m = [float(j.result["latency_ms"]) for j in js]
        before = [abs(float(j.predicted["latency_ms_unadapted"]) / x - 1) * 100 for j, x in zip(js, m)]
        after = [abs(float(j.predicted["latency_ms"]) / x - 1) * 100 for j, x in zip(js, m)]
        out.append({"version": v, "rows": int(js[0].predicted["adaptation_rows"]), "candidates": len(js),
                    "latency_mape_unadapted_pct": sum(before) / len(before),
                    "latency_mape_adapted_pct": sum(after) / len(after)})
    return out


def _learning_curve_plot(out: Path, ok: list[Any], args: argparse.Namespace, plt: Any) -> Path:
    """Latency error of each measured candidate before and after adaptation against the rows the adaptation it
    was predicted with had been fitted on (0: predicted before any adaptation)."""
    fig, ax = plt.subplots(figsize=(6.8, 4.6), constrained_layout=True)
    xs = [int(j.predicted.get("adaptation_rows") or 0) for j in ok]
    meas = [float(j.result["latency_ms"]) for j in ok]
    before = [abs(float(j.predicted.get("latency_ms_unadapted", j.predicted["latency_ms"])) / m - 1) * 100
              for j, m in zip(ok, meas)]
    after = [abs(float(j.predicted["latency_ms"]) / m - 1) * 100 for j, m in zip(ok, meas)]
    ax.scatter(xs, before, facecolors="none", edgecolors="tab:orange", s=50, label="unadapted prediction", zorder=3)
    ax.scatter(xs, after, c="tab:green", s=30, label="adapted prediction (same candidate)", zorder=4)
    rounds = _adaptation_rounds(ok)
    if rounds:
        ax.plot([r["rows"] for r in rounds], [r["latency_mape_adapted_pct"] for r in rounds], color="tab:green",
                lw=1.2, label="MAPE adapted, per version")
        ax.plot([r["rows"] for r in rounds], [r["latency_mape_unadapted_pct"] for r in rounds], color="tab:orange",
                lw=1.2, ls="--", label="MAPE unadapted, per version")
    ax.set_xlabel("measured candidates the adaptation was fitted on, when predicted")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("latency error on this CPU (%, |predicted / measured - 1|)")
    ax.set_title(f"host CPU, float32, batch {args.validate_batch}: online adaptation, predicted before measured",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    p = out / "learning_curve.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


# ---------------------------------------------------------------------------------------------- main
def _check_args(args: argparse.Namespace) -> None:
    """Fill the budget defaults and check the bounds (before anything is loaded)."""
    _apply_budget_defaults(args)
    for name, v, least in (("--trials", args.trials, 1), ("--epochs", args.epochs, 1), ("--batch", args.batch, 1),
                           ("--threads", args.threads, 1), ("--validate-every", args.validate_every, 1),
                           ("--validate-max", args.validate_max, 1), ("--validate-batch", args.validate_batch, 1),
                           ("--background", args.background, 0)):
        if v < least:
            raise UsageError(f"{name} must be >= {least}, got {v}")
    if args.train_seconds <= 0 or (args.seconds is not None and args.seconds <= 0):
        raise UsageError("--train-seconds and --seconds must be > 0")
    if args.latency_budget_ms is not None and args.latency_budget_ms < 0:
        raise UsageError(f"--latency-budget-ms must be >= 0 (0: no latency budget), got {args.latency_budget_ms}")
    args.latency_budget_ms = args.latency_budget_ms or None


def run(args: argparse.Namespace) -> int:
    """The verb: :func:`_run` with the process-wide settings it changes (threads, warning filters, the
    host-cpu predictor it adapts) restored."""
    import torch

    from dippm_nas.predictor import get_predictor, set_predictor

    _check_args(args)
    threads = torch.get_num_threads()
    host_predictor = None if args.no_validate else get_predictor(_HOST)
    try:
        with warnings.catch_warnings():
            return _run(args)
    finally:
        torch.set_num_threads(threads)
        if host_predictor is not None:
            if callable(getattr(host_predictor, "use_adaptation", None)):
                host_predictor.use_adaptation()  # back to the cache directory's store, every space
            set_predictor(_HOST, host_predictor)


def _run(args: argparse.Namespace) -> int:
    import torch

    import search_spaces

    deployment = deployment_from_args(args)
    data = search_spaces.load_digits(args.seed)  # scikit-learn missing fails here, with the install hint

    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out).expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    storage = args.storage or f"sqlite:///{out / 'demo.sqlite3'}"
    study_name = args.study_name or time.strftime("dippm-demo-%Y%m%d-%H%M%S")
    _quiet()

    from dippm_nas.optuna import Budgets, HardwareCostModel

    cost = HardwareCostModel(device=args.device, budgets=Budgets(mig_profile=args.mig_profile,
                                                                 latency_ms=args.latency_budget_ms),
                             background_workers=args.background, deployment=deployment)
    _print_plan(args, cost, storage, study_name, out)
    study = _create_study(args, cost, storage, study_name)
    validator = None if args.no_validate else _validator(args)
    summary = _search(args, study, cost, validator, _objective(args, cost, data))

    jobs = ([] if validator is None else
            validator.queue_for(study).jobs(study=study_name, device=_HOST, status="done"))
    rows = _rows(study, {j.trial_number: j for j in jobs})
    _print_table(rows, args, cost.device)
    _print_validation(args, cost.device, rows, jobs, summary)
    _write_outputs(args, out, rows, jobs, cost, validator, summary,
                   {"study": study_name, "storage": redact_url(storage), "trials": len(rows)}, t_start)
    wall = time.perf_counter() - t_start
    print(f"done in {wall:.0f} s; the search waited {cost.seconds:.1f} s ({100 * cost.seconds / wall:.1f}%) on the cost "
          f"model and {(validator.seconds if validator is not None else 0.0):.1f} s on validation measurements")
    return 0


def _quiet() -> None:
    """Optuna's INFO lines and the library's duplicate warnings off: the progress bar is the output."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # The library logs its one-time notes (uncalibrated constants...) through logging; the duplicate
    # warnings.warn copies would print source lines in the middle of the progress bar.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"(dippm_nas|optuna|torch).*")
    warnings.filterwarnings("ignore", category=UserWarning, message=r".*[Ss]parse CSR.*")


def _print_plan(args: argparse.Namespace, cost: Any, storage: str, study_name: str, out: Path) -> None:
    """What the demo searches, predicts, constrains and validates, and where it writes."""
    usable = f" ({cost.mig_limit_mib:.0f} MiB usable)" if cost.mig_limit_mib else ""
    print(f"dippm-nas demo: NAS of small CNNs on scikit-learn's digits ({args.trials} trials"
          f"{'' if args.seconds is None else f' or {args.seconds:g} s'}, {args.train_seconds:g} s of training each)")
    print(f"  objectives: accuracy (max); {cost.device} latency_ms and energy_j per batch of {args.batch} in "
          f"{args.dtype} (min), PREDICTED with σ; deployment: {cost.deployment.label}")
    print(f"  constraint: predicted memory + 1σ within MIG {args.mig_profile}{usable}"
          + (f"; latency + 1σ <= {args.latency_budget_ms:g} ms" if args.latency_budget_ms else ""))
    if not args.no_validate:
        print(f"  validation: Pareto candidates measured on this CPU ({_HOST}) in float32 at batch "
              f"{args.validate_batch}, against host-cpu predictions"
              + ("" if args.no_adapt else "; each measurement adapts the host-cpu predictor (predictor.adapt, "
                 "stored in the study's database), each round is predicted with the rounds before")
              + f". This CPU cannot run {args.dtype} at its deployed speed and has no {cost.device}: what is "
              f"measured and calibrated is the host-cpu prediction of the same architectures, not the "
              f"{cost.device} figures.")
    print(f"  storage: {redact_url(storage)}  study: {study_name}  output: {out}")


def _create_study(args: argparse.Namespace, cost: Any, storage: str, study_name: str) -> Any:
    """The multi-objective study (accuracy first, then the cost model's objectives) with the chosen sampler."""
    import optuna

    from dippm_nas.optuna import optuna_has_set_constraint, rdb_storage

    # Optuna >= 5 takes the constraints from trial.set_constraint; 4.x samplers need constraints_func.
    extra: dict[str, Any] = {} if optuna_has_set_constraint() else {"constraints_func": cost.constraints_func}
    if args.sampler == "tpe":
        sampler: Any = optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=max(3, min(10, args.trials // 3)),
                                                  **extra)
    else:
        sampler = optuna.samplers.NSGAIISampler(seed=args.seed, population_size=max(4, min(20, args.trials // 3)),
                                                **extra)
    return cost.create_study(leading={"accuracy": "maximize"}, storage=rdb_storage(storage), study_name=study_name,
                             sampler=sampler, load_if_exists=True)


def _validator(args: argparse.Namespace) -> Any:
    """The Pareto validator measuring on this CPU (and adapting the host-cpu predictor unless ``--no-adapt``)."""
    from dippm_nas.measure import MeasureSettings
    from dippm_nas.validation import ParetoValidator

    # threads=None: each candidate is measured at the torch thread count its host-cpu prediction is for
    return ParetoValidator(
        _HOST, every_n_trials=args.validate_every, max_per_round=args.validate_max,
        batch_size=args.validate_batch, dtype="float32",
        settings=MeasureSettings(warmup=3, min_repeats=5, max_repeats=50, time_cap_s=3.0),
        adapt=not args.no_adapt,
    )


def _objective(args: argparse.Namespace, cost: Any, data: Any) -> Any:
    """The trial objective: a ``demo_cnn`` candidate trained on the digits while its costs are predicted."""
    import search_spaces

    space = search_spaces.get_space("demo_cnn")

    def objective(trial: Any) -> tuple[float, ...]:
        cfg = space.validate(search_spaces.suggest_demo_cnn(trial))
        model = search_spaces.build_model("demo_cnn", cfg, seed=args.seed + trial.number)
        # predicted while it trains: conversion in a background process, records in a background thread
        pending = cost.submit(trial, model, space.input_spec(cfg, batch_size=args.batch, dtype=args.dtype))
        try:
            res = search_spaces.train_digits(model, data, cfg["resolution"], seconds=args.train_seconds,
                                             epochs=args.epochs, seed=args.seed + trial.number)
        finally:
            hw = pending.result()  # recorded before the trial ends, even when training failed
        for k in ("train_s", "train_steps", "train_epochs"):
            trial.set_user_attr(k, getattr(res, k))
        return (res.accuracy, *hw)

    return objective


class _Progress:
    """The trial callback drawing the progress bar, and each validation round's report above it."""

    def __init__(self, args: argparse.Namespace, bar: Any, validator: Any) -> None:
        self.args, self.bar, self.validator = args, bar, validator
        self.rounds = 0

    def report_round(self, study: Any, r: Any) -> None:
        """What the round measured, how far the adaptation got, and the error of this round's candidates (predicted
        before they were measured) without and with the adaptation of the rounds before."""
        bar, validator = self.bar, self.validator
        bar.write(f"  validation round {len(validator.rounds)}: measured trials {r.enqueued} on this CPU "
                  f"({r.seconds:.1f} s)")
        if self.args.no_adapt or not r.enqueued:
            return
        if r.adaptation_version is None:
            bar.write(f"    host-cpu not adapted yet: adapt() needs {_MIN_ADAPT_ROWS} measured candidates")
        else:
            bar.write(f"    host-cpu predictor adapted on {r.adaptation_rows} measured candidates (version "
                      f"{r.adaptation_version}); the next round is predicted with it")
        jobs = validator.queue_for(study).jobs(study=study.study_name, device=_HOST, status="done")
        mine = [j for j in jobs if j.trial_number in set(r.enqueued)]
        for a in _adaptation_rounds(mine):
            bar.write(f"    this round's {a['candidates']} candidate(s), predicted with the adaptation on {a['rows']} "
                      f"rows: latency MAPE {a['latency_mape_unadapted_pct']:.0f}% unadapted -> "
                      f"{a['latency_mape_adapted_pct']:.0f}% adapted")

    def __call__(self, study: Any, trial: Any) -> None:
        import optuna

        self.bar.update(1)
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        feas = [t for t in done if t.user_attrs.get("feasible")]
        best = max((t.values[0] for t in feas), default=float("nan"))
        post = {"best_acc": f"{best:.3f}", "feasible": f"{len(feas)}/{len(done)}"}
        if self.validator is not None:
            if len(self.validator.rounds) > self.rounds:
                self.rounds = len(self.validator.rounds)
                self.report_round(study, self.validator.rounds[-1])
            post["validated"] = str(sum(len(r.enqueued) for r in self.validator.rounds))
        self.bar.set_postfix(post)


def _search(args: argparse.Namespace, study: Any, cost: Any, validator: Any, objective: Any) -> Any:
    """Run the trials under a progress bar (the validator measuring between them), then the final validation
    round; closes the cost model. Returns the validation summary (``None`` without a validator)."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=args.trials, desc="trials", unit="trial", dynamic_ncols=True)
    progress = _Progress(args, bar, validator)
    callbacks = [validator, progress] if validator is not None else [progress]
    with logging_redirect_tqdm():  # the root handler the CLI configured, written above the bar
        try:
            study.optimize(objective, n_trials=args.trials, timeout=args.seconds, callbacks=callbacks,
                           catch=(DippmNasError,))
        finally:
            bar.close()
            cost.close()
        if validator is None:
            return None
        print("final validation round ...", flush=True)
        return validator.finish(study)


def _print_validation(args: argparse.Namespace, device: str, rows: list[dict[str, Any]], jobs: list[Any],
                      summary: Any) -> None:
    """What was predicted (and cannot be checked here), and the host-cpu error before and after adaptation."""
    srcs = {k: sorted({str(r[k]) for r in rows if r[k]}) or ["-"]
            for k in ("latency_source", "energy_source", "memory_source")}
    print("\nValidation:")
    print(f"  {device} figures are PREDICTED (latency {'/'.join(srcs['latency_source'])}, energy "
          f"{'/'.join(srcs['energy_source'])}, memory {'/'.join(srcs['memory_source'])}) and cannot be validated "
          f"here: this machine has no such GPU. On one that has, run "
          f"`dippm-nas validate-worker --storage URL --device {device}`.")
    if "analytic" in srcs["latency_source"]:
        print("  latency 'analytic': these CNNs lie beyond the novelty the checkpoint's correction was validated to "
              "on unseen families, so its analytic prior answers, with the σ of the correction's bound.")
    if summary is None:
        print("  skipped (--no-validate)")
        return
    print(f"  {_HOST} (float32, batch {args.validate_batch}): {summary.measured} Pareto candidate(s) measured "
          f"({summary.ok} ok, {summary.does_not_fit} did not fit, {summary.timeouts} timed out, "
          f"{summary.errors} errors)")
    first = [j for j in jobs if (j.result or {}).get("status") == "ok" and "latency_ms_unadapted" not in j.predicted]
    if first:
        ape = [abs(float(j.predicted["latency_ms"]) / float(j.result["latency_ms"]) - 1) * 100 for j in first]
        print(f"    predicted before any adaptation: latency MAPE {sum(ape) / len(ape):.0f}% on {len(first)} "
              "candidate(s)")
    adapted = _adaptation_rounds(jobs)
    for a in adapted:
        print(f"    predicted with the adaptation on {a['rows']} measured candidates (version {a['version']}), "
              f"{a['candidates']} candidate(s) measured later: latency MAPE {a['latency_mape_unadapted_pct']:.0f}% "
              f"unadapted -> {a['latency_mape_adapted_pct']:.0f}% adapted")
    if not adapted and not args.no_adapt:
        print("    no candidate was predicted with an adaptation before being measured in this run (it needs "
              f"{_MIN_ADAPT_ROWS} measured candidates first; more trials or a smaller --validate-every give later "
              "rounds)")


def _write_outputs(args: argparse.Namespace, out: Path, rows: list[dict[str, Any]], jobs: list[Any], cost: Any,
                   validator: Any, summary: Any, head: dict[str, Any], t_start: float) -> None:
    """``trials.csv``, the plots (unless ``--no-plot`` or without matplotlib) and ``summary.json`` (``head`` first:
    study, storage, trials; then the seconds since ``t_start``, a ``time.perf_counter()``)."""
    from dippm_nas.validation import check_calibration

    check = check_calibration(jobs)
    csv_path = out / "trials.csv"
    if rows:
        text = io.StringIO(newline="")
        w = csv.DictWriter(text, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        write_output(csv_path, text.getvalue(), "demo output", error=UsageError)
    written: list[Path] = []
    plot_note = ""
    if args.no_plot:
        plot_note = "plots skipped (--no-plot)"
    elif rows:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            plot_note = "plots skipped: matplotlib is not installed (pip install 'dippm-nas[plot]')"
        else:
            written = _plots(out, rows, jobs, args, cost.device, cost.mig_limit_mib)
    summary_path = out / "summary.json"
    write_output(summary_path, json.dumps({
        **head, "seconds": time.perf_counter() - t_start, "cost_model_s": cost.seconds, "validation_s": validator.seconds if validator is not None else 0.0,
        "device": cost.device, "dtype": args.dtype, "batch": args.batch, "mig_profile": args.mig_profile,
        "latency_budget_ms": args.latency_budget_ms,
        "validation": summary.to_dict() if summary is not None else None,
        "calibration_check": check.to_dict() if validator is not None else None,
        "adaptation": _adaptation_rounds(jobs),
        "pareto": [r for r in rows if r["pareto"]],
    }, indent=1), "demo output", error=UsageError)
    if plot_note:
        print(f"\n{plot_note}")
    print(f"\nwrote {', '.join(str(p) for p in [*written, csv_path, summary_path])}")
