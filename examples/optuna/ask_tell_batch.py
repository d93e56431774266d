"""An Optuna ask/tell loop that predicts a whole batch of trials at once.

Each round asks ``--batch-size`` trials, builds their models, and hands them to
``HardwareCostModel.evaluate_many``: one ``dippm_nas.predict_many`` call converts the batch (``--workers``
processes sharing the conversion cache; search-space models are assembled from cached blocks) and the
predictor answers it in one pass; every trial then gets the same user attributes and constraints as
``evaluate`` records. The trials are trained and told.

Objectives: held-out accuracy on the digits after a short training (maximise), predicted A100 latency and
energy per batch (minimise; float16). Constraints: memory within MIG ``1g.5gb`` and a latency budget
(mean + 1 sigma). NSGA-II suits batches: it proposes a generation at a time.

    python examples/optuna/ask_tell_batch.py --trials 32 --batch-size 8 --storage sqlite:///nas.db
    python examples/optuna/ask_tell_batch.py --trials 4 --batch-size 2 --train-seconds 0.2      # a smoke run
"""

from __future__ import annotations

import argparse
import time
import warnings

import optuna

import search_spaces as ss
from dippm_nas.optuna import Budgets, HardwareCostModel, optuna_has_set_constraint, rdb_storage


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8, help="trials asked and predicted together")
    ap.add_argument("--workers", type=int, default=1, help="conversion processes of predict_many")
    ap.add_argument("--storage", default="sqlite:///nas.db", help="SQLAlchemy URL of the study")
    ap.add_argument("--study-name", default="digits-a100-batch")
    ap.add_argument("--device", default="a100-sxm4-40gb", help="catalogue id the costs are predicted for")
    ap.add_argument("--batch", type=int, default=8192, help="serving batch the costs are predicted for")
    ap.add_argument("--latency-budget-ms", type=float, default=20.0, help="latency budget per batch, ms")
    ap.add_argument("--mig-profile", default="1g.5gb", help="MIG profile the memory must fit")
    ap.add_argument("--train-seconds", type=float, default=2.0, help="training budget per candidate, s")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.trials < 1 or args.batch_size < 1:
        ap.error("--trials and --batch-size must be >= 1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    cost = HardwareCostModel(args.device, Budgets(latency_ms=args.latency_budget_ms, mig_profile=args.mig_profile))
    extra = {} if optuna_has_set_constraint() else {"constraints_func": cost.constraints_func}
    sampler = optuna.samplers.NSGAIISampler(population_size=max(2, args.batch_size), seed=args.seed, **extra)
    study = cost.create_study(leading={"accuracy": "maximize"}, storage=rdb_storage(args.storage),
                              study_name=args.study_name, load_if_exists=True, sampler=sampler)
    data = ss.load_digits(args.seed)
    space = ss.get_space("demo_cnn")

    told = 0
    while told < args.trials:
        trials = [study.ask() for _ in range(min(args.batch_size, args.trials - told))]
        cfgs = [space.validate(ss.suggest_demo_cnn(t)) for t in trials]
        models = [ss.build_model("demo_cnn", c, seed=t.number) for t, c in zip(trials, cfgs)]
        specs = [space.input_spec(c, batch_size=args.batch, dtype="float16") for c in cfgs]
        t0 = time.perf_counter()
        results = cost.evaluate_many(trials, list(zip(models, specs)), workers=args.workers)
        predict_s = time.perf_counter() - t0
        for t, m, c, r in zip(trials, models, cfgs, results):
            if isinstance(r, Exception):  # the cost model could not evaluate it: recorded as cost_model_error
                study.tell(t, state=optuna.trial.TrialState.FAIL)
                continue
            acc = ss.train_digits(m, data, c["resolution"], seconds=args.train_seconds, epochs=10,
                                  seed=t.number).accuracy
            study.tell(t, (acc, *r))  # r = (latency_ms, energy_j)
        told += len(trials)
        feasible = sum(bool(t.user_attrs.get("feasible")) for t in trials)
        print(f"batch of {len(trials)}: predicted in {predict_s:.2f} s, {feasible} feasible; {told}/{args.trials} told")

    print(f"Pareto front of {study.study_name} (accuracy, latency ms, energy J; feasible trials only):")
    for t in sorted(study.best_trials, key=lambda t: -t.values[0]):
        print(f"  trial {t.number:>3}: accuracy {t.values[0]:.3f}, latency {t.values[1]:.3f} ms, "
              f"energy {t.values[2]:.3f} J, memory {t.user_attrs['predicted_memory_mib']:.0f} MiB")
    print(f"look at it: optuna-dashboard {args.storage}")


if __name__ == "__main__":  # predict_many's workers start with spawn, which re-imports this file
    main()
