"""Overhead of the cost model in a real search: its share of a 200-trial study's wall time (target <= 1 %).

The study is shaped like the demo's (``dippm-nas demo``): ``demo_cnn`` candidates trained ``--train-seconds`` each
on scikit-learn's digits, objectives accuracy / predicted A100 latency / energy (float32, serving batch 16384), memory
within MIG 1g.5gb, TPE, SQLite storage in a fresh temporary directory opened with
:func:`dippm_nas.optuna.rdb_storage` (``--optuna-default-sqlite``: Optuna's own set-up), and (unless ``--no-validate``) a ParetoValidator
measuring up to 3 Pareto candidates on this CPU every 20 trials.

Reported, all measured with ``time.perf_counter`` on this machine:

- wall time of ``study.optimize`` (or of the ask/tell loop with ``--ask-tell K``);
- cost-model time: the time the search waits on the cost model (``HardwareCostModel.seconds``, per trial):
  inside ``HardwareCostModel.evaluate`` / ``evaluate_many`` / ``submit`` and in reading their figures. By
  default ``evaluate`` hands the candidate to the cost model's background thread (prediction, MIG advice,
  user attributes and constraints written to the storage) and the objective trains meanwhile; Optuna reads
  the figures when the objective returns, and the search waits only for what is left then. ``--no-overlap``
  predicts inside ``evaluate``; ``--background N`` converts in N processes (``submit``). In total, for the
  first trial (process warm-up: TVM import, first ``torch.export``) and as the median of the other trials;
- the share of the wall time, with and without the first trial's warm-up;
- validation time (measurements of Pareto candidates; optional, reported apart);
- the cost model's work (the ``cost_model_s`` user attributes: conversion and prediction; the attribute
  writes that follow are not in it),
  which with ``--background`` runs beside training instead of before it, and the rows of the conversion
  cache (one per distinct architecture at the serving batch, plus the validator's host-CPU specs; a search
  meets some architectures twice and the cache answers those).

Caveat: on a machine without a free core, background work still competes with training for the CPU; the
wait share then understates the cost, and the wall time (and the process CPU time, also printed) against the
``--no-cost-model`` baseline is the figure to compare across modes.

Usage::

    python benchmarks/speed/bench_optuna_overhead.py [--trials 200] [--train-seconds 3] [--ask-tell K]
        [--background N] [--no-overlap] [--no-validate] [--sampler tpe|random] [--no-cost-model] [--json OUT.json]

Wall-time overhead, same architectures in each run (RandomSampler), no validation::

    python benchmarks/speed/bench_optuna_overhead.py --sampler random --no-validate --no-cost-model --json base.json
    python benchmarks/speed/bench_optuna_overhead.py --sampler random --no-validate --json sync.json
    python benchmarks/speed/bench_optuna_overhead.py --sampler random --no-validate --no-overlap --json at_once.json
    python benchmarks/speed/bench_optuna_overhead.py --sampler random --no-validate --background 1 --json bg.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from benchmarks._common import machine, write_text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--train-seconds", type=float, default=3.0, help="training budget per candidate, s (demo default 3)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--ask-tell", type=int, default=0, metavar="K",
                    help="use the ask/tell batch path with K trials per batch (0: study.optimize + evaluate)")
    ap.add_argument("--background", type=int, default=0, metavar="N",
                    help="convert in N background processes while training (HardwareCostModel.submit)")
    ap.add_argument("--no-overlap", action="store_true",
                    help="HardwareCostModel(overlap=False): predict inside evaluate, before the model trains")
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--sampler", choices=("tpe", "random"), default="tpe",
                    help="random: the same architectures in every run (for comparing wall times across modes)")
    ap.add_argument("--optuna-default-sqlite", action="store_true",
                    help="open the SQLite storage with Optuna's defaults instead of dippm_nas.optuna.rdb_storage "
                         "(WAL, synchronous=NORMAL)")
    ap.add_argument("--no-cost-model", action="store_true",
                    help="baseline: hardware objectives are constants, nothing is converted or predicted")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    import optuna
    import torch

    import search_spaces
    from dippm_nas.measure import MeasureSettings
    from dippm_nas.optuna import Budgets, HardwareCostModel, rdb_storage
    from dippm_nas.validation import ParetoValidator

    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="dippm-bench-optuna-"))
    os.environ["DIPPM_NAS_CACHE_URL"] = f"sqlite:///{tmp / 'cache.sqlite'}"  # a cold conversion cache
    storage = f"sqlite:///{tmp / 'study.db'}"
    load_before = os.getloadavg()

    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), background_workers=args.background,
                             overlap=not args.no_overlap)
    sampler = (optuna.samplers.RandomSampler(seed=args.seed) if args.sampler == "random"
               else optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=10))
    study = cost.create_study(storage=storage if args.optuna_default_sqlite else rdb_storage(storage),
                              study_name="bench", sampler=sampler)
    if args.no_cost_model and (args.ask_tell or args.background or not args.no_validate):
        ap.error("--no-cost-model runs study.optimize without validation: drop --ask-tell/--background, add --no-validate")
    validator = None if args.no_validate else ParetoValidator(
        "host-cpu", every_n_trials=20, max_per_round=3, batch_size=64,
        settings=MeasureSettings(warmup=3, min_repeats=5, max_repeats=50, time_cap_s=3.0))
    data = search_spaces.load_digits(args.seed)
    space = search_spaces.get_space("demo_cnn")
    train_s: list[float] = []
    blocked: dict[int, float] = {}  # trial number -> seconds the search waited on the cost model
    marks: list[tuple[int, float]] = []  # (trial number, cost.seconds when its objective started)

    def build(trial: Any) -> tuple[Any, Any, dict[str, Any]]:
        cfg = space.validate(search_spaces.suggest_demo_cnn(trial))
        return search_spaces.build_model("demo_cnn", cfg, seed=trial.number), space.input_spec(cfg, 16384), cfg

    def fit(trial: Any, model: Any, cfg: dict[str, Any]) -> float:
        res = search_spaces.train_digits(model, data, cfg["resolution"], seconds=args.train_seconds,
                                         epochs=args.epochs, seed=trial.number)
        train_s.append(res.train_s)
        return res.accuracy

    t0, cpu0 = time.perf_counter(), time.process_time()
    if args.ask_tell:
        done = 0
        while done < args.trials:
            k = min(args.ask_tell, args.trials - done)
            trials = [study.ask() for _ in range(k)]
            built = [build(t) for t in trials]
            tb = time.perf_counter()
            results = cost.evaluate_many(trials, [(m, s) for m, s, _ in built])
            for t in trials:
                blocked[t.number] = (time.perf_counter() - tb) / k
            for t, (m, _, cfg), r in zip(trials, built, results):
                if isinstance(r, Exception):
                    frozen = study.tell(t, state=optuna.trial.TrialState.FAIL)
                else:
                    frozen = study.tell(t, (fit(t, m, cfg), *r))
                if validator is not None:
                    validator(study, frozen)
            done += k
    else:
        def objective(trial: optuna.Trial) -> tuple[Any, ...]:
            marks.append((trial.number, cost.seconds))  # the previous trial's figures were read before this
            model, spec, cfg = build(trial)
            if args.no_cost_model:
                return (fit(trial, model, cfg), 0.0, 0.0)
            if args.background:
                pending = cost.submit(trial, model, spec)
                accuracy = fit(trial, model, cfg)
                return (accuracy, *pending.result())
            hw = cost.evaluate(trial, model, spec)  # figures read by Optuna after the objective returns
            return (fit(trial, model, cfg), *hw)

        study.optimize(objective, n_trials=args.trials, callbacks=[validator] if validator is not None else [])
        marks.append((-1, cost.seconds))
        for (number, start), (_, end) in zip(marks, marks[1:]):
            blocked[number] = end - start
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    load_after = os.getloadavg()
    cost.close()

    waits = [blocked[n] for n in sorted(blocked)]
    work = sum(t.user_attrs.get("cost_model_s", 0.0) for t in study.trials)
    from dippm_nas.cache import default_cache

    rows = default_cache().stats()["rows"]
    # the first trial (first batch with --ask-tell) carries the process warm-up: TVM import, first torch.export
    n_first = max(1, args.ask_tell)
    first, rest = sum(waits[:n_first]), waits[n_first:]
    val_s = validator.seconds if validator is not None else 0.0
    fig = {
        "machine": machine(),
        "load_average_before_after": [round(x, 2) for x in (*load_before, *load_after)],
        "trials": len(study.trials),
        "cost_model_errors": sum("cost_model_error" in t.user_attrs for t in study.trials),
        "mode": (f"ask/tell k={args.ask_tell}" if args.ask_tell else "optimize")
        + (f", {args.background} background conversion process(es)" if args.background else "")
        + (", NO cost model (baseline)" if args.no_cost_model else "") + f", {args.sampler} sampler"
        + (", Optuna's default SQLite set-up" if args.optuna_default_sqlite else ", rdb_storage (SQLite WAL)"),
        "architectures": [json.dumps(t.params, sort_keys=True) for t in sorted(study.trials, key=lambda t: t.number)],
        "train_seconds_budget": args.train_seconds, "train_s_median": statistics.median(train_s),
        "train_s_total": sum(train_s), "other_s": wall - sum(train_s) - sum(waits),
        "wall_s": wall, "process_cpu_s": cpu, "cost_model_wait_s": sum(waits), "cost_model_wait_share_pct": 100 * sum(waits) / wall,
        "cost_model_wait_first_s": first, "cost_model_wait_median_s": statistics.median(rest) if rest else None,
        "cost_model_wait_share_after_warmup_pct": 100 * (sum(waits) - first) / (wall - first) if rest else None,
        "cost_model_work_s": work,
        "validation_s": val_s, "validation_share_pct": 100 * val_s / wall,
        "validated_trials": sum(len(r.enqueued) for r in validator.rounds) if validator is not None else 0,
        "conversion_cache_rows": rows,
    }
    assert abs(sum(waits) - cost.seconds) < 0.05 * max(cost.seconds, 1.0), (sum(waits), cost.seconds)
    print(f"machine: {fig['machine']}; load average (1, 5, 15 min) before {load_before}, after {load_after}")
    print(f"{fig['trials']} trials ({fig['mode']}), training budget {args.train_seconds:g} s / {args.epochs} epochs "
          f"(median {fig['train_s_median']:.2f} s): wall {wall:.1f} s, process CPU time {cpu:.1f} s; "
          f"{fig['cost_model_errors']} trials the cost model could not evaluate")
    print(f"search waited on the cost model {sum(waits):.1f} s = {fig['cost_model_wait_share_pct']:.2f} % of the wall "
          f"time; first trial{' batch' if args.ask_tell else ''} {first:.2f} s (warm-up), median of the others "
          f"{fig['cost_model_wait_median_s']:.3f} s; share without the warm-up "
          f"{fig['cost_model_wait_share_after_warmup_pct']:.2f} %")
    print(f"cost model's share of the wall time: {fig['cost_model_wait_share_pct']:.2f} % (target <= 1 %); "
          f"training {fig['train_s_total']:.1f} s, the rest (building, sampling, storage, validation) "
          f"{fig['other_s']:.1f} s")
    print(f"cost-model work (conversion and prediction, without attribute writes; beside training with --background): "
          f"{work:.1f} s; {rows} graphs in the conversion cache (one per distinct architecture, plus the validation "
          "specs)")
    print(f"validation (apart): {val_s:.1f} s = {fig['validation_share_pct']:.2f} % ({fig['validated_trials']} trials "
          "measured on this CPU)")
    if args.json:
        write_text(args.json, json.dumps(fig, indent=1), "--json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
