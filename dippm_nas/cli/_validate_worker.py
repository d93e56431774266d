"""``dippm-nas validate-worker``: drain the validation queue of one device on the machine that has it."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from dippm_nas.cli._grammar import (
    MAX_THREADS,
    DeprecatedFlag,
    UsageError,
    add_json_flag,
    argtype,
    device_ids,
    float_flag,
    int_flag,
    json_text,
    torch_device,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate-worker",
        help="measure queued Pareto candidates of a device (run it on the machine that has the device)",
        description="Claim validation jobs of DEVICE from the SQL job table in STORAGE (the Optuna storage URL "
                    "the study uses), rebuild each model from its search-space name and JSON config, measure it "
                    "and record predicted vs measured. A heartbeat extends the lease while a job is measured; a job "
                    "whose worker dies is re-queued when its lease expires (--lease seconds after the last "
                    "heartbeat); out-of-memory is recorded as 'does not fit'. Every 'ok' measurement adapts the "
                    "device's predictor (when it has a network; stored in STORAGE per device, deployment and search "
                    "space, where the search picks it up). Ctrl-C or SIGTERM stops after the "
                    "current job and releases the jobs claimed but not yet measured.",
    )
    p.add_argument("--storage", required=True, metavar="URL",
                   help="SQLAlchemy URL of the queue, e.g. sqlite:///study.db or postgresql+psycopg2://user:pw@host/db")
    p.add_argument("--device", required=True, metavar="D",
                   help="catalogue id to measure (dippm-nas devices), e.g. host-cpu or a100-sxm4-40gb")
    p.add_argument("--torch-device", dest="torch_device", default=None, type=argtype(torch_device), metavar="cuda:N",
                   help="measure on this torch device instead of the first CUDA device whose name matches D")
    p.add_argument("--cuda-device", dest="torch_device", action=DeprecatedFlag, new="--torch-device",
                   convert=torch_device)
    p.add_argument("--study", default=None, help="only jobs of this study")
    p.add_argument("--max-jobs", type=int_flag("--max-jobs", low=1), default=None, help="stop after this many jobs")
    p.add_argument("--idle-exit", type=float_flag("--idle-exit", low=0, note="0: as soon as the queue is empty"),
                   default=None, metavar="S",
                   help="stop when the queue stayed empty this many seconds (default: wait forever)")
    p.add_argument("--poll", type=float_flag("--poll", low=0), default=5.0, metavar="S",
                   help="seconds between polls of an empty queue")
    p.add_argument("--lease", type=float_flag("--lease", low=0, low_inclusive=False), default=None, metavar="S",
                   help="lease of a claimed job, seconds: a heartbeat extends it every S/3 while measuring, and a "
                        "killed worker's job is claimable again S after its last heartbeat; default "
                        "dippm_nas.validation.DEFAULT_LEASE_S (60)")
    p.add_argument("--max-attempts", type=int_flag("--max-attempts", low=1), default=3,
                   help="claims of a job before it is marked failed")
    p.add_argument("--isolate", action="store_true",
                   help="measure each job in a fresh subprocess (hard time limit, crash isolation)")
    p.add_argument("--warmup", type=int_flag("--warmup", low=0), default=10,
                   help="untimed forwards before timing (default 10)")
    p.add_argument("--min-repeats", type=int_flag("--min-repeats", low=2), default=10,
                   help="timed forwards at least (default 10)")
    p.add_argument("--max-repeats", type=int_flag("--max-repeats", low=2), default=1000,
                   help="timed forwards at most (default 1000)")
    p.add_argument("--time-cap", type=float_flag("--time-cap", low=0, low_inclusive=False), default=30.0, metavar="S",
                   help="time budget of one measurement, seconds (default 30)")
    p.add_argument("--threads", type=int_flag("--threads", low=1, high=MAX_THREADS), default=None,
                   help="CPU threads during measurement (default: torch's)")
    p.add_argument("--rounds", type=int_flag("--rounds", low=0, note="0: off"), default=0, metavar="N",
                   help="CPU devices: time each batch of claimed jobs again in N interleaved rounds of --min-repeats "
                        "forwards (steadier on a shared machine; the host-CPU checkpoints' labels are timed so); "
                        "default 0: one block of timed forwards per job")
    p.add_argument("--rounds-batch", type=int_flag("--rounds-batch", low=1), default=8, metavar="K",
                   help="with --rounds, jobs claimed and timed together (default 8)")
    p.add_argument("--no-adapt", action="store_true",
                   help="do not feed the measurements to the predictor's adapt() (default: each 'ok' measurement "
                        "adapts the device's predictor, stored in STORAGE)")
    add_json_flag(p, "one object per line: the start, each job, the end")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dippm_nas.errors import MeasurementError
    from dippm_nas.measure import MeasureSettings
    from dippm_nas.validation import DEFAULT_LEASE_S, JobQueue, ValidationWorker

    (device,) = device_ids([args.device])
    try:
        settings = MeasureSettings(warmup=args.warmup, min_repeats=args.min_repeats, max_repeats=args.max_repeats,
                                   time_cap_s=args.time_cap, threads=args.threads)
    except MeasurementError as e:
        raise UsageError(str(e)) from e
    queue = JobQueue(args.storage, lease_s=DEFAULT_LEASE_S if args.lease is None else args.lease,
                     max_attempts=args.max_attempts)
    worker = ValidationWorker(queue, device, settings=settings, torch_device=args.torch_device,
                              isolate=args.isolate, rounds=args.rounds, rounds_batch=args.rounds_batch,
                              adapt=not args.no_adapt)
    stop = threading.Event()

    def say(text: str, **fields: Any) -> None:
        print(json_text(fields) if args.json else text, flush=True)

    def on_signal(signum: int, _frame: Any) -> None:
        say(f"validate-worker: signal {signum}: stopping after the current job (claimed jobs not yet measured "
            "are released)", event="signal", signal=signum)
        stop.set()

    old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    say(f"validate-worker {worker.owner}: device {worker.device} on {worker.torch_device}, queue {queue.url}",
        event="start", owner=worker.owner, device=worker.device, torch_device=worker.torch_device, queue=queue.url)

    def on_job(job: Any, outcome: str) -> None:
        row = queue.get(job.id)
        detail = ""
        if row.result is not None:
            m = row.result
            lat = m.get("latency_ms")
            pred = job.predicted.get("latency_ms")
            detail = (f" status={m.get('status')} measured={lat if lat is None else f'{lat:.3f}'} ms "
                      f"predicted={pred if pred is None else f'{pred:.3f}'} ms")
            if m.get("status") == "oom":
                detail += " (does not fit)"
            ad = worker.adaptation if worker.adaptation_job == job.id else None
            if ad is not None:
                detail += f" adapted: version {ad.version} on {ad.rows} rows"
        elif row.error:
            detail = f" error: {row.error}"
        say(f"job {job.id} study={job.study} trial={job.trial_number} attempt={job.attempts}: {outcome}{detail}",
            event="job", id=job.id, study=job.study, trial=job.trial_number, attempt=job.attempts, outcome=outcome,
            result=row.result, error=row.error, predicted=job.predicted,
            adaptation=None if worker.adaptation_job != job.id else {"version": worker.adaptation.version,
                                                                     "rows": worker.adaptation.rows})

    try:
        n = worker.run(max_jobs=args.max_jobs, idle_timeout_s=args.idle_exit, poll_s=args.poll, study=args.study,
                       stop=stop, on_job=on_job)
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        queue.close()
    say(f"validate-worker: {n} job(s) handled", event="end", handled=n)
    return 0
