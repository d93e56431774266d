"""``dippm-nas demo``: a real multi-objective NAS on this CPU, with predicted A100 costs and live validation.

The search space is ``demo_cnn`` (small plain CNNs, :mod:`search_spaces._demo_cnn`); each candidate is
trained for a few seconds on scikit-learn's 8x8 digits (shipped inside scikit-learn, no download) and
scored on a held-out fifth. Objectives: accuracy (maximise), predicted A100 latency and energy per batch
(minimise); constraint: predicted memory within the usable memory of the MIG profile ``1g.5gb``.
Pareto candidates are measured on this CPU as the search runs and compared with host-CPU predictions:
an A100 prediction cannot be checked on a machine without an A100, and the demo says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["register", "digits_data", "suggest_demo_config", "train_demo_model"]

#: Optimiser settings of the demo's training loop (Adam, mini-batches); chosen to learn digits in a few epochs.
_LEARNING_RATE = 3e-3
_TRAIN_BATCH = 64
_HOLDOUT_FRACTION = 0.2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a real multi-objective NAS on this CPU: digits CNNs, predicted A100 latency/energy, "
             "MIG memory constraint, live validation; writes a Pareto table and plots",
        description="Multi-objective NAS on scikit-learn's digits: accuracy up, predicted A100 latency and "
                    "energy down, predicted memory within a MIG profile. Candidates train a few seconds each on "
                    "this CPU; Pareto candidates are measured on this CPU (host-cpu) and compared with host-cpu "
                    "predictions. Bounded by --trials and --seconds.",
    )
    p.add_argument("--trials", type=int, default=30, help="trials to run (default 30)")
    p.add_argument("--seconds", type=float, default=None, help="stop starting new trials after this many seconds")
    p.add_argument("--out", default="dippm-demo", help="output directory for plots, CSV and summary (default ./dippm-demo)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage (any SQLAlchemy RDB URL); default sqlite:///OUT/demo.sqlite3")
    p.add_argument("--study-name", default=None, help="study name (default: dippm-demo-<date-time>); "
                   "an existing study of that name is continued")
    p.add_argument("--seed", type=int, default=0, help="sampler and training seed (default 0)")
    p.add_argument("--sampler", choices=("tpe", "nsga2"), default="tpe", help="Optuna sampler (default tpe)")
    p.add_argument("--train-seconds", type=float, default=3.0,
                   help="training budget per candidate, seconds (default 3)")
    p.add_argument("--epochs", type=int, default=10, help="most training epochs per candidate (default 10)")
    p.add_argument("--device", default="a100-sxm4-40gb", help="device the costs are predicted for (default a100-sxm4-40gb)")
    p.add_argument("--batch", type=int, default=16384,
                   help="serving batch the device costs are predicted for (default 16384 images: large enough that "
                        "wide, high-resolution candidates outgrow 1g.5gb)")
    p.add_argument("--mig-profile", default="1g.5gb", help="MIG profile the memory must fit (default 1g.5gb)")
    p.add_argument("--latency-budget-ms", type=float, default=None, help="also constrain predicted latency, ms")
    p.add_argument("--validate-every", type=int, default=10, help="validation round every N trials (default 10)")
    p.add_argument("--validate-max", type=int, default=3, help="most Pareto candidates measured per round (default 3)")
    p.add_argument("--validate-batch", type=int, default=64,
                   help="batch size of the host-CPU validation measurements (default 64)")
    p.add_argument("--no-validate", action="store_true", help="skip validation")
    p.add_argument("--auto-calibrate", action="store_true",
                   help="apply a host-cpu latency calibration once 5 measurements exist (affects later host-cpu "
                        "predictions only)")
    p.add_argument("--background", type=int, default=1, metavar="N",
                   help="conversion processes working while candidates train (default 1; 0: convert before training)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads for training, measuring and the host-cpu benchmark (default 1)")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------- data
def digits_data(seed: int) -> dict[str, Any]:
    """Digits as float tensors in [0, 1], split into train and held-out parts (stratified, seeded)."""
    from dippm_nas._optional import require

    datasets = require("sklearn.datasets", "demo", "the demo's digits dataset")
    model_selection = require("sklearn.model_selection", "demo", "the demo's train/test split")
    import torch

    x, y = datasets.load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = model_selection.train_test_split(
        x, y, test_size=_HOLDOUT_FRACTION, random_state=seed, stratify=y)

    def t(a: Any) -> Any:
        return torch.tensor(a, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0  # pixel values are 0..16

    return {"x_train": t(x_tr), "y_train": torch.tensor(y_tr), "x_test": t(x_te), "y_test": torch.tensor(y_te),
            "resized": {}}


def _at_resolution(data: dict[str, Any], resolution: int) -> tuple[Any, Any]:
    import torch.nn.functional as F

    if resolution not in data["resized"]:
        if resolution == 8:
            data["resized"][resolution] = (data["x_train"], data["x_test"])
        else:
            data["resized"][resolution] = tuple(
                F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False)
                for x in (data["x_train"], data["x_test"]))
    return data["resized"][resolution]


def train_demo_model(model: Any, data: dict[str, Any], resolution: int, *, seconds: float, epochs: int, seed: int
           ) -> dict[str, float]:
    """Train with Adam for at most ``epochs`` epochs and ``seconds`` seconds; held-out accuracy and effort."""
    import torch
    import torch.nn.functional as F

    x_tr, x_te = _at_resolution(data, resolution)
    y_tr, y_te = data["y_train"], data["y_test"]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=_LEARNING_RATE)
    model.train()
    t0 = time.perf_counter()
    steps, done_epochs, out_of_time = 0, 0.0, False
    n = len(y_tr)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, _TRAIN_BATCH):
            idx = perm[i:i + _TRAIN_BATCH]
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if time.perf_counter() - t0 >= seconds:
                out_of_time = True
                done_epochs += min(i + _TRAIN_BATCH, n) / n
                break
        if out_of_time:
            break
        done_epochs += 1
    model.eval()
    with torch.inference_mode():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item()
    return {"accuracy": acc, "train_s": time.perf_counter() - t0, "train_steps": steps, "train_epochs": done_epochs}


def suggest_demo_config(trial: Any) -> dict[str, Any]:
    """A ``demo_cnn`` config from the trial's suggestions."""
    stages = trial.suggest_int("stages", 1, 3)
    return {
        "resolution": trial.suggest_categorical("resolution", [8, 16, 32]),
        "widths": [trial.suggest_int(f"width_{i}", 4, 256, log=True) for i in range(stages)],
        "blocks": [trial.suggest_int(f"blocks_{i}", 1, 3) for i in range(stages)],
        "kernel_size": trial.suggest_categorical("kernel_size", [3, 5]),
        "batchnorm": trial.suggest_categorical("batchnorm", [True, False]),
        "activation": trial.suggest_categorical("activation", ["relu", "gelu", "silu"]),
        "in_channels": 1,
        "num_classes": 10,
    }


# ---------------------------------------------------------------------------------------------- output
def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _rows(study: Any, records: dict[int, Any]) -> list[dict[str, Any]]:
    import optuna

    front = {t.number for t in study.best_trials}
    rows = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        a = t.user_attrs
        r = records.get(t.number)
        rows.append({
            "trial": t.number, "pareto": t.number in front, "feasible": bool(a.get("feasible")),
            "accuracy": t.values[0], "latency_ms": a.get("predicted_latency_ms"),
            "energy_j": a.get("predicted_energy_j"), "memory_mib": a.get("predicted_memory_mib"),
            "mig_smallest_fit": a.get("mig_smallest_fit"), "latency_source": a.get("latency_source"),
            "train_epochs": a.get("train_epochs"), "config": json.dumps(a.get("search_space_config")),
            "host_cpu_predicted_ms": None if r is None else r.predicted_latency_ms,
            "host_cpu_measured_ms": None if r is None else r.measured_latency_ms,
            "host_cpu_error_pct": None if r is None else r.latency_error_pct,
            "host_cpu_status": None if r is None else r.status,
        })
    return rows


def _print_table(rows: list[dict[str, Any]], device: str, batch: int, profile: str) -> None:
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: -r["accuracy"])
    print(f"\nPareto front (feasible trials; {device} figures predicted for a batch of {batch}):")
    head = (f"{'trial':>5} {'accuracy':>8} {'latency ms':>11} {'energy J':>9} {'memory MiB':>11} {'MIG fit':>8}"
            f" | {'host-cpu pred ms':>16} {'measured ms':>11} {'error %':>8}  config")
    print(head)
    print("-" * len(head))
    for r in front:
        cfg = json.loads(r["config"]) if r["config"] else {}
        short = (f"r{cfg.get('resolution')} w{cfg.get('widths')} b{cfg.get('blocks')} k{cfg.get('kernel_size')}"
                 f"{' bn' if cfg.get('batchnorm') else ''} {cfg.get('activation')}") if cfg else "-"
        meas = _fmt(r["host_cpu_measured_ms"], ".3f")
        if r["host_cpu_status"] not in (None, "ok"):
            meas = r["host_cpu_status"] if r["host_cpu_status"] != "oom" else "no fit"
        print(f"{r['trial']:>5} {r['accuracy']:>8.3f} {_fmt(r['latency_ms'], '.4f'):>11} {_fmt(r['energy_j'], '.4f'):>9} "
              f"{_fmt(r['memory_mib'], '.0f'):>11} {str(r['mig_smallest_fit']):>8} | "
              f"{_fmt(r['host_cpu_predicted_ms'], '.3f'):>16} {meas:>11} {_fmt(r['host_cpu_error_pct'], '+.0f'):>8}  {short}")
    if not front:
        print("  (no feasible trial yet: every candidate broke a constraint)")
    infeasible = [r for r in rows if not r["feasible"]]
    print(f"{len(infeasible)} of {len(rows)} completed trials broke a constraint (memory beyond {profile}'s usable "
          "memory, or the latency budget); they were reported to the sampler as constraint violations, not pruned.")


def _plain_log_ticks(ax: Any, matplotlib: Any, which: str = "xy") -> None:
    """Log axes labelled 0.5, 1, 2 ... instead of 5x10^-1."""
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for axis in ((ax.xaxis,) if which == "x" else (ax.xaxis, ax.yaxis)):
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _plots(out: Path, rows: list[dict[str, Any]], records: list[Any], device: str, batch: int, profile: str,
           mig_limit_mib: float | None, validate_batch: int) -> list[Path]:
    from dippm_nas._optional import require

    matplotlib = require("matplotlib", "demo", "the demo's plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 5.4), constrained_layout=True)
    feas = [r for r in rows if r["feasible"]]
    infe = [r for r in rows if not r["feasible"]]
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["latency_ms"])
    mems = [r["memory_mib"] for r in rows if r["memory_mib"] is not None]
    vmax = max([*mems, mig_limit_mib or 0.0]) if mems else 1.0
    norm = matplotlib.colors.Normalize(vmin=min(mems) if mems else 0.0, vmax=vmax)
    sc = None
    for ax, key, label in ((axes[0], "latency_ms", f"predicted {device} latency per batch of {batch} (ms)"),
                           (axes[1], "energy_j", f"predicted {device} energy per batch of {batch} (J)")):
        sc = ax.scatter([r[key] for r in feas], [r["accuracy"] for r in feas], c=[r["memory_mib"] for r in feas],
                        norm=norm, cmap="viridis", s=38, alpha=0.9, label="feasible (colour: predicted memory)",
                        zorder=2)
        if infe:
            ax.scatter([r[key] for r in infe], [r["accuracy"] for r in infe], marker="x", c="tab:red", s=44,
                       label=f"infeasible: memory beyond {profile}", zorder=2)
        if front:
            ax.scatter([r[key] for r in front], [r["accuracy"] for r in front], facecolors="none",
                       edgecolors="black", s=150, linewidths=1.4, label="Pareto front (of 3 objectives)", zorder=3)
            for r in front:
                ax.annotate(f"#{r['trial']}", (r[key], r["accuracy"]), textcoords="offset points", xytext=(7, -11),
                            fontsize=8)
        ax.set_xscale("log")
        _plain_log_ticks(ax, matplotlib, "x")
        ax.set_xlabel(label + ", log scale")
        ax.set_ylabel("held-out accuracy on digits")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=9, frameon=False)
    if sc is not None:
        cb = fig.colorbar(sc, ax=axes, label="predicted memory (MiB)", shrink=0.9)
        if mig_limit_mib:
            cb.ax.axhline(mig_limit_mib, color="tab:red", lw=2)
            cb.ax.text(-0.15, mig_limit_mib, profile, color="tab:red", fontsize=8, ha="right", va="center",
                       transform=cb.ax.get_yaxis_transform())
    limit = f" ({mig_limit_mib:.0f} MiB usable)" if mig_limit_mib else ""
    fig.suptitle(f"dippm-nas demo: accuracy vs PREDICTED {device} cost, memory constraint {profile}{limit}",
                 fontsize=11)
    p = out / "pareto.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    written.append(p)

    ok = [r for r in records if r.status == "ok" and r.predicted_latency_ms and r.measured_latency_ms]
    fig, ax = plt.subplots(figsize=(6.6, 6.2), constrained_layout=True)
    if ok:
        xs = [r.predicted_latency_ms for r in ok]
        ys = [r.measured_latency_ms for r in ok]
        lo, hi = min(xs + ys) / 1.6, max(xs + ys) * 1.6
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="measured = predicted")
        ax.fill_between([lo, hi], [lo / 1.5, hi / 1.5], [lo * 1.5, hi * 1.5], color="gray", alpha=0.15,
                        label="within a factor 1.5")
        src = sorted({r.latency_source or "?" for r in ok})
        for s, marker in zip(src, "osD^"):
            sel = [r for r in ok if (r.latency_source or "?") == s]
            ax.scatter([r.predicted_latency_ms for r in sel], [r.measured_latency_ms for r in sel], marker=marker,
                       s=50, zorder=3, label=f"prediction source: {s}")
        for r in ok:
            ax.annotate(f"#{r.trial_number}", (r.predicted_latency_ms, r.measured_latency_ms),
                        textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        mape = sum(abs(r.latency_error_pct) for r in ok) / len(ok)
        ax.set_title(f"host CPU, batch {validate_batch}: predicted vs measured latency\n"
                     f"{len(ok)} Pareto candidates, mean abs. error {mape:.0f}%", fontsize=11)
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no validation measurement", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("host CPU: predicted vs measured latency", fontsize=11)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax, matplotlib)
    ax.set_xlabel("predicted host-cpu latency per batch (ms, log scale)")
    ax.set_ylabel("measured host-cpu latency per batch (ms, log scale)")
    ax.grid(True, which="both", alpha=0.3)
    p = out / "predicted_vs_measured.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    written.append(p)
    return written


# ---------------------------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> int:
    """The verb: :func:`_run` with the process-wide settings it changes (threads, warning filters) restored."""
    import torch

    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    import optuna
    import torch
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    import search_spaces
    from dippm_nas._optional import require
    from dippm_nas.errors import DippmNasError
    from dippm_nas.measure import MeasureSettings
    from dippm_nas.optuna import Budgets, HardwareCostModel, optuna_has_set_constraint, rdb_storage
    from dippm_nas.validation import ParetoValidator

    for name, v, least in (("--trials", args.trials, 1), ("--epochs", args.epochs, 1), ("--batch", args.batch, 1),
                           ("--threads", args.threads, 1), ("--validate-every", args.validate_every, 1),
                           ("--validate-max", args.validate_max, 1), ("--validate-batch", args.validate_batch, 1)):
        if v < least:
            raise DippmNasError(f"{name} must be >= {least}, got {v}")
    if args.train_seconds <= 0 or (args.seconds is not None and args.seconds <= 0):
        raise DippmNasError("--train-seconds and --seconds must be > 0")
    require("sklearn", "demo", "the demo's digits dataset")
    require("matplotlib", "demo", "the demo's plots")

    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out).expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    storage = args.storage or f"sqlite:///{out / 'demo.sqlite3'}"
    study_name = args.study_name or time.strftime("dippm-demo-%Y%m%d-%H%M%S")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # The library logs its one-time notes (analytic prior, uncalibrated constants) through logging; the
    # duplicate warnings.warn copies would print source lines in the middle of the progress bar.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"(dippm_nas|optuna|torch).*")

    print(f"dippm-nas demo: NAS of small CNNs on scikit-learn's digits ({args.trials} trials"
          f"{'' if args.seconds is None else f' or {args.seconds:g} s'}, {args.train_seconds:g} s of training each)")
    print(f"  objectives: accuracy (max), predicted {args.device} latency_ms and energy_j per batch of {args.batch} (min)")
    print(f"  constraint: predicted memory within MIG {args.mig_profile}"
          + (f", latency <= {args.latency_budget_ms:g} ms" if args.latency_budget_ms else ""))
    print(f"  storage: {storage}  study: {study_name}  output: {out}")

    if args.background < 0:
        raise DippmNasError(f"--background must be >= 0, got {args.background}")
    cost = HardwareCostModel(device=args.device, budgets=Budgets(mig_profile=args.mig_profile,
                                                                 latency_ms=args.latency_budget_ms),
                             background_workers=args.background)
    # Optuna >= 5 takes the constraints from trial.set_constraint; 4.x samplers need constraints_func.
    extra: dict[str, Any] = {} if optuna_has_set_constraint() else {"constraints_func": cost.constraints_func}
    if args.sampler == "tpe":
        sampler: Any = optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=max(3, min(10, args.trials // 3)),
                                                  **extra)
    else:
        sampler = optuna.samplers.NSGAIISampler(seed=args.seed, population_size=max(4, min(20, args.trials // 3)),
                                                **extra)
    study = cost.create_study(leading={"accuracy": "maximize"}, storage=rdb_storage(storage), study_name=study_name,
                              sampler=sampler, load_if_exists=True)
    validator = None
    if not args.no_validate:
        validator = ParetoValidator(
            "host-cpu", every_n_trials=args.validate_every, max_per_round=args.validate_max,
            batch_size=args.validate_batch, auto_calibrate=args.auto_calibrate,
            settings=MeasureSettings(warmup=3, min_repeats=5, max_repeats=50, time_cap_s=3.0, threads=args.threads),
        )
    data = digits_data(args.seed)
    space = search_spaces.get_space("demo_cnn")

    def objective(trial: optuna.Trial) -> tuple[float, ...]:
        cfg = space.validate(suggest_demo_config(trial))
        model = search_spaces.build_model("demo_cnn", cfg, seed=args.seed + trial.number)
        # predicted while it trains: conversion in a background process, records in a background thread
        pending = cost.submit(trial, model, space.input_spec(cfg, batch_size=args.batch))
        try:
            res = train_demo_model(model, data, cfg["resolution"], seconds=args.train_seconds, epochs=args.epochs,
                         seed=args.seed + trial.number)
        finally:
            hw = pending.result()  # recorded before the trial ends, even when training failed
        for k in ("train_s", "train_steps", "train_epochs"):
            trial.set_user_attr(k, res[k])
        return (res["accuracy"], *hw)

    bar = tqdm(total=args.trials, desc="trials", unit="trial", dynamic_ncols=True)
    n_rounds = [0]

    def progress(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        bar.update(1)
        done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
        feas = [t for t in done if t.user_attrs.get("feasible")]
        best = max((t.values[0] for t in feas), default=float("nan"))
        post = {"best_acc": f"{best:.3f}", "feasible": f"{len(feas)}/{len(done)}"}
        if validator is not None:
            if len(validator.rounds) > n_rounds[0]:
                n_rounds[0] = len(validator.rounds)
                r = validator.rounds[-1]
                bar.write(f"  validation round {n_rounds[0]}: measured trials {r.enqueued} on this CPU "
                          f"({r.seconds:.1f} s)")
            post["validated"] = str(sum(len(r.enqueued) for r in validator.rounds))
        bar.set_postfix(post)

    callbacks = [validator, progress] if validator is not None else [progress]
    with logging_redirect_tqdm():  # the root handler the CLI configured, written above the bar
        try:
            study.optimize(objective, n_trials=args.trials, timeout=args.seconds, callbacks=callbacks,
                           catch=(DippmNasError,))
        finally:
            bar.close()
            cost.close()
        summary = None
        if validator is not None:
            print("final validation round ...", flush=True)
            summary = validator.finish(study)

    records = validator.records(study) if validator is not None else []
    rows = _rows(study, {r.trial_number: r for r in records})
    _print_table(rows, cost.device, args.batch, args.mig_profile)

    print("\nValidation:")
    print(f"  {cost.device} figures are PREDICTED (sources: "
          f"{sorted({r['latency_source'] for r in rows if r['latency_source']}) or '-'}) and cannot be validated here: "
          "this machine has no such GPU. On a machine that has one, run "
          f"`dippm-nas validate-worker --storage URL --device {cost.device}`.")
    if summary is not None:
        ratio = summary.latency_measured_over_predicted
        print(f"  host-cpu: {summary.measured} Pareto candidate(s) measured at batch {args.validate_batch} "
              f"({summary.ok} ok, {summary.does_not_fit} did not fit, {summary.timeouts} timed out, "
              f"{summary.errors} errors); latency MAPE {_fmt(summary.latency_mape_pct, '.0f')}%, "
              f"measured/predicted (geometric mean) {_fmt(ratio, '.2f')}")
        if summary.calibration:
            c = summary.calibration
            print(f"  calibration applied to host-cpu: latency x{c['latency_scale']:.3g} "
                  f"(MAPE {c['latency_mape_before_pct']:.0f}% -> {c['latency_mape_after_pct']:.0f}% in-sample)")
    else:
        print("  skipped (--no-validate)")

    csv_path = out / "trials.csv"
    if rows:
        with csv_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    written = (_plots(out, rows, records, cost.device, args.batch, args.mig_profile, cost.mig_limit_mib,
                      args.validate_batch) if rows else [])
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps({
        "study": study_name, "storage": storage, "trials": len(rows), "seconds": time.perf_counter() - t_start,
        "cost_model_s": cost.seconds, "validation_s": validator.seconds if validator is not None else 0.0,
        "device": cost.device, "batch": args.batch, "mig_profile": args.mig_profile,
        "validation": summary.to_dict() if summary is not None else None,
        "pareto": [r for r in rows if r["pareto"]],
    }, indent=1))
    wall = time.perf_counter() - t_start
    print(f"\nwrote {', '.join(str(p) for p in [*written, csv_path, summary_path])}")
    print(f"done in {wall:.0f} s; the search waited {cost.seconds:.1f} s ({100 * cost.seconds / wall:.1f}%) on the cost "
          f"model and {(validator.seconds if validator is not None else 0.0):.1f} s on validation measurements")
    return 0
