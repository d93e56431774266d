"""A multi-objective Optuna study with hardware constraints and SQLite storage.

Objectives: held-out accuracy on scikit-learn's digits after a few seconds of training (maximise; a proxy
for the accuracy of the fully trained network) and the A100 latency per batch predicted by dippm-nas
(minimise; float16, the dtype the candidates would be deployed in). Constraints (chance constraints,
mean + 1 sigma <= budget): the predicted memory fits the MIG profile ``1g.5gb`` and the predicted latency
is within ``--latency-budget-ms``. On Optuna >= 5 the cost model registers them with
``trial.set_constraint``; on Optuna 4 the sampler gets ``constraints_func=cost.constraints_func``.

The study lives in a SQLite file (``--storage``): ``optuna-dashboard sqlite:///nas.db`` shows it, a second
process can join it, and ``--validate-on host-cpu`` queues its Pareto front for
``validation_worker.py`` (or ``dippm-nas validate-worker``) on the same storage.

    python examples/optuna/multi_objective.py --trials 30 --storage sqlite:///nas.db
    python examples/optuna/multi_objective.py --trials 2 --train-seconds 0.2      # a smoke run
"""

from __future__ import annotations

import argparse
import warnings

import optuna

import search_spaces as ss
from dippm_nas.optuna import Budgets, HardwareCostModel, optuna_has_set_constraint, rdb_storage
from dippm_nas.validation import ParetoValidator


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--storage", default="sqlite:///nas.db", help="SQLAlchemy URL of the study")
    ap.add_argument("--study-name", default="digits-a100")
    ap.add_argument("--device", default="a100-sxm4-40gb", help="catalogue id the costs are predicted for")
    ap.add_argument("--batch", type=int, default=8192, help="serving batch the costs are predicted for")
    ap.add_argument("--latency-budget-ms", type=float, default=20.0, help="latency budget per batch, ms")
    ap.add_argument("--mig-profile", default="1g.5gb", help="MIG profile the memory must fit")
    ap.add_argument("--train-seconds", type=float, default=2.0, help="training budget per candidate, s")
    ap.add_argument("--validate-on", default=None, metavar="DEVICE",
                    help="queue the Pareto front for a validation worker measuring on DEVICE (e.g. host-cpu)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    cost = HardwareCostModel(args.device, Budgets(latency_ms=args.latency_budget_ms, mig_profile=args.mig_profile),
                             objectives=("latency_ms",))
    # Optuna >= 5: constraints arrive through trial.set_constraint; Optuna 4: through the sampler.
    extra = {} if optuna_has_set_constraint() else {"constraints_func": cost.constraints_func}
    study = cost.create_study(leading={"accuracy": "maximize"}, storage=rdb_storage(args.storage),
                              study_name=args.study_name, load_if_exists=True,
                              sampler=optuna.samplers.TPESampler(seed=args.seed, **extra))
    data = ss.load_digits(args.seed)
    space = ss.get_space("demo_cnn")

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        cfg = space.validate(ss.suggest_demo_cnn(trial))
        model = ss.build_model("demo_cnn", cfg, seed=trial.number)
        spec = space.input_spec(cfg, batch_size=args.batch, dtype="float16")
        latency_ms = cost.evaluate(trial, model, spec)  # one cost objective: a float; constraints registered
        accuracy = ss.train_digits(model, data, cfg["resolution"], seconds=args.train_seconds, epochs=10,
                                   seed=trial.number).accuracy
        return accuracy, latency_ms

    callbacks = []
    if args.validate_on:
        # enqueue up to 3 Pareto trials every 5 trials; float32 at batch 64 is what a CPU can measure
        cpu = args.validate_on == "host-cpu"
        callbacks.append(ParetoValidator(args.validate_on, mode="queue", every_n_trials=5, max_per_round=3,
                                         batch_size=64 if cpu else None, dtype="float32" if cpu else None))
    study.optimize(objective, n_trials=args.trials, callbacks=callbacks)
    if callbacks:
        callbacks[0].run_round(study)  # queue the final front too

    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    infeasible = [t for t in done if not t.user_attrs.get("feasible")]
    print(f"{len(done)} trials, {len(infeasible)} infeasible (constraints: {', '.join(cost.constraint_names)}); "
          f"Pareto front of {study.study_name}:")
    print(f"{'trial':>5} {'accuracy':>8} {'latency ms (mean ± σ)':>22} {'memory MiB':>10} {'MIG fit':>7} source")
    for t in sorted(study.best_trials, key=lambda t: -t.values[0]):
        a = t.user_attrs
        std = a["predicted_latency_ms_std"]
        print(f"{t.number:>5} {t.values[0]:>8.3f} {a['predicted_latency_ms']:>11.3f} ± "
              f"{'-' if std is None else format(std, '.3f'):<8} {a['predicted_memory_mib']:>10.0f} "
              f"{str(a['mig_smallest_fit']):>7} {a['latency_source']}")
    print(f"look at it: optuna-dashboard {args.storage}")
    if args.validate_on:
        print(f"measure the queued front: python examples/optuna/validation_worker.py --storage {args.storage} "
              f"--study {args.study_name} --device {args.validate_on}")


if __name__ == "__main__":
    main()
