"""The validation worker on a study's storage: measure the queued Pareto candidates, compare with predictions.

``multi_objective.py --validate-on host-cpu`` queues its Pareto front in job tables of the study's own
storage; this script claims those jobs, rebuilds each model from its search-space name and JSON config (no
code or pickle crosses the queue), measures it on ``--device`` and records predicted vs measured. It is
what ``dippm-nas validate-worker --storage URL --device D`` runs; on a GPU machine the device is a GPU
catalogue id, here it is the host CPU (candidates queued for the host CPU are measured in float32, the
dtype this CPU runs at speed, and compared with host-cpu predictions of the same architectures).

    python examples/optuna/multi_objective.py --trials 30 --storage sqlite:///nas.db --validate-on host-cpu
    python examples/optuna/validation_worker.py --storage sqlite:///nas.db --study digits-a100
"""

from __future__ import annotations

import argparse

from dippm_nas.measure import MeasureSettings
from dippm_nas.validation import JobQueue, ValidationWorker, summarize


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", default="sqlite:///nas.db", help="SQLAlchemy URL of the study")
    ap.add_argument("--study", default=None, help="only jobs of this study (default: every study)")
    ap.add_argument("--device", default="host-cpu", help="catalogue id of the device on this machine")
    ap.add_argument("--idle-exit", type=float, default=0.0, metavar="S",
                    help="stop after the queue stayed empty this long, s (default 0: when it is empty)")
    ap.add_argument("--max-jobs", type=int, default=None)
    ap.add_argument("--time-cap", type=float, default=5.0, metavar="S", help="most seconds of timing per job")
    args = ap.parse_args(argv)

    queue = JobQueue(args.storage)
    settings = MeasureSettings(warmup=3, min_repeats=5, max_repeats=200, time_cap_s=args.time_cap)
    worker = ValidationWorker(queue, args.device, settings=settings)
    print(f"{worker!r}: {queue.counts(study=args.study, device=args.device)['queued']} job(s) queued")
    n = worker.run(study=args.study, idle_timeout_s=args.idle_exit, poll_s=1.0, max_jobs=args.max_jobs,
                   on_job=lambda job, outcome: print(f"  {job.study} trial {job.trial_number}: {outcome}"))

    records = queue.results(study=args.study, device=args.device)
    print(f"measured {n} job(s) now; {len(records)} result(s) on {args.device}:")
    print(f"{'study':>20} {'trial':>5} {'status':>6} {'predicted ms':>12} {'measured ms':>11} {'error %':>7} source")
    for r in records:
        pred = "-" if r.predicted_latency_ms is None else f"{r.predicted_latency_ms:.3f}"
        meas = "-" if r.measured_latency_ms is None else f"{r.measured_latency_ms:.3f}"
        err = "-" if r.latency_error_pct is None else f"{r.latency_error_pct:+.0f}"
        print(f"{r.study:>20} {r.trial_number:>5} {r.status:>6} {pred:>12} {meas:>11} {err:>7} {r.latency_source}")
    for study in sorted({r.study for r in records}):
        s = summarize(queue, study, args.device)
        mape = "-" if s.latency_mape_pct is None else f"{s.latency_mape_pct:.0f}%"
        ratio = "-" if s.latency_measured_over_predicted is None else f"{s.latency_measured_over_predicted:.2f}"
        print(f"{study}: {s.ok} ok of {s.measured}; latency MAPE {mape}, measured/predicted {ratio} "
              "(ParetoValidator.calibrate or fit_calibration turns that ratio into a calibration)")


if __name__ == "__main__":
    main()
