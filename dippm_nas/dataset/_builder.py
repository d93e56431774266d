"""``build_dataset``: plan candidates, convert them in parallel, measure them one at a time, resumably.

Order of work (each step is stored before the next starts):

1. **Plan**: :func:`~dippm_nas.dataset._plan.plan_candidates` draws the candidates from the seed (or
   takes an explicit list) and the plan is written to the dataset file in one transaction, every
   candidate a ``pending`` job. A rerun with the same arguments finds the stored plan and reuses it.
2. **Convert** (chunk by chunk): :func:`~dippm_nas.capture.assemble_many` with ``workers`` processes and the
   conversion cache: each distinct block of the chunk's candidates is captured once and every candidate's
   graph assembled from its blocks (a space that does not opt in is captured whole); a job's graph and its
   ``converted`` status are written together. A candidate whose builder raises or whose capture (or a
   block's) fails becomes ``failed`` with the reason (and a failed measurement row).
3. **Measure** (serially, one model at a time): build the model, ``measure(model, spec, device,
   settings)``, write the row and the job's ``done``/``failed`` status in one transaction. Faults of the
   model (out of memory, the time cap, an exception) come back from the measurer as rows with
   ``status != "ok"`` and are stored as failed with their reason.

With ``rounds >= 1`` (CPU only) step 3 keeps the chunk's ``ok`` rows and, once they are all measured and
the next chunk's conversion has finished, builds their models again and times their latency in ``rounds``
interleaved rounds (:func:`dippm_nas.measure.time_interleaved`); the row's latency fields are then those of
the rounds (``stop_reason="rounds"``; the model's own block is kept in ``extra.own_block``) and memory is
the one-by-one measurement's. The models are not kept alive between their one-by-one measurement and the
rounds: a peak-RSS delta measured while earlier models are held reads low (their freed heap blocks are
reused; a scratch check read a median 0.87× the figure with nothing held). Rows of a chunk are written
after its rounds, so a kill loses that chunk's measurements (its jobs are measured again on resume, as a
new attempt).

With ``op_profiles`` (CPU, not ``isolate``) each ``ok`` model is also run under ``torch.profiler`` once
its latency is final (after its one-by-one measurement, or after the chunk's rounds), and one line per
model (:func:`dippm_nas.measure.profile_ops`: every top-level ``aten::`` call with its in-place time) is
appended to that file with the row's latency: what the host prior's operator table is fitted on
(``scripts/fit/calibrate_host_prior.py --op-profiles``). The profile is an extra 2 × 3 forwards per model,
taken with the measurement's thread count; a model whose profiling fails keeps its row and is logged. A
kill between a row and its profile line loses that line (one by one, the row is stored first); with
rounds the line comes first, so a kill before the chunk's rows are stored repeats its lines on resume.

With ``workers >= 2`` and ``overlap=True`` the next chunk is converted (in processes) while the
current one is measured. ``pin_cpu`` pins the measuring thread to one core and the conversion
processes to the others (``os.sched_setaffinity``); both are recorded in each row's environment, with
the load average before and after the measurement.

Killing the process at any moment loses at most the work in flight: a rerun skips ``done`` and
``failed`` jobs, converts ``pending`` ones and measures ``converted`` ones. A job found ``running`` (the
process died while measuring it) is measured again, unless it already had ``max_attempts`` attempts:
then it is stored as failed with that reason, so a model that kills the process cannot stall the build.
Measurement rows are unique per job, so nothing is ever duplicated.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dippm_nas._deprecation import MISSING, renamed_keyword
from dippm_nas._json import canonical_json
from dippm_nas._numbers import as_int
from dippm_nas._version import __version__
from dippm_nas.capture import assemble_many
from dippm_nas.errors import DatasetError, DeviceError, MeasurementError, SearchSpaceError
from dippm_nas.dataset._plan import Candidate, Plan, plan_candidates, plan_key
from dippm_nas.dataset._store import DatasetStore, Job
from dippm_nas.measure import (
    Measurement, MeasureSettings, OpProfileWriter, RoundTiming, measure, profile_ops, time_interleaved,
)
from dippm_nas.measure import measure_isolated, release_free_memory
from dippm_nas.spec import COMPUTE_DTYPES, InputSpec
import search_spaces as ss

__all__ = ["build_dataset", "BuildReport", "DEFAULT_BUILD_SETTINGS", "MeasureFn", "measurement_row"]

logger = logging.getLogger(__name__)

#: ``measure_fn(model, spec, device, settings) -> Measurement``; the default calls :func:`dippm_nas.measure.measure`.
MeasureFn = Callable[[Any, InputSpec, str, MeasureSettings], Measurement]

#: Settings for thousands of small models on a shared CPU: 1 thread, few repeats, 5 % CI, 2 s cap.
DEFAULT_BUILD_SETTINGS = MeasureSettings(warmup=2, min_repeats=5, max_repeats=30, rel_ci_target=0.05,
                                         time_cap_s=2.0, threads=1)

_OPEN = ("pending", "converted", "running")


@dataclass
class BuildReport:
    """What :func:`build_dataset` did.

    Attributes:
        path: the dataset file.
        plan_key: the plan's identity.
        planned: candidates in the plan.
        done / failed: jobs of the plan in each final state after this run (all runs together).
        measured_now / failed_now: jobs finished by this run.
        profiled_now: ``ok`` jobs of this run whose operator profile was written (with ``op_profiles``).
        open: jobs of the plan still unfinished (0 unless the run was stopped).
        resumed: whether the plan was found stored (a rerun).
        seconds: wall time of this run.
        plan_stats: rejected-over-budget, duplicate and shortfall counts of the planning.
    """

    path: str
    plan_key: str
    planned: int
    done: int = 0
    failed: int = 0
    measured_now: int = 0
    failed_now: int = 0
    profiled_now: int = 0
    open: int = 0
    resumed: bool = False
    seconds: float = 0.0
    plan_stats: dict[str, Any] = field(default_factory=dict)


def _default_measure(model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
    return measure(model, spec, torch_device=device, settings=settings)


def measurement_row(m: Measurement, environment: Mapping[str, Any]) -> dict[str, Any]:
    """The ``measurements`` columns of a :class:`~dippm_nas.measure.Measurement` (figures as measured)."""
    return {
        "latency_ms": m.latency_ms, "latency_ms_std": m.latency_ms_std, "latency_ms_median": m.latency_ms_median,
        "latency_ms_ci95": m.latency_ms_ci95, "energy_j": m.energy_j, "energy_source": m.energy_source,
        "energy_reason": m.energy_reason, "memory_mib": m.memory_mib, "memory_source": m.memory_source,
        "n_repeats": m.n_repeats, "stop_reason": m.stop_reason, "status": m.status, "reason": m.reason,
        "environment": dict(environment), "measured_at": m.timestamp,
        "extra": {"memory_parts_mib": m.memory_parts_mib, "memory_reason": m.memory_reason, "details": m.details,
                  "measured_device": m.device},
    }


def _failed_row(reason: str, environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"status": "error", "reason": reason, "environment": dict(environment or {})}


def _affinity() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def _set_affinity(cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(0, cpus)  # pid 0: the calling thread on Linux
    except (AttributeError, OSError) as e:
        raise DatasetError(f"cannot pin to CPUs {sorted(cpus)}: {e}") from e


def _normalise_explicit(candidates: Sequence[Mapping[str, Any]], batch_sizes: Sequence[int]) -> list[Candidate]:
    """Explicit candidates -> :class:`Candidate`; a config outside its space is kept as ``failed``."""
    out: list[Candidate] = []
    for i, c in enumerate(candidates):
        if not isinstance(c, Mapping) or "space" not in c or "config" not in c:
            raise DatasetError(f"candidate {i} must be a mapping with 'space' and 'config' (and 'batch_size'), "
                               f"got {c!r}")
        try:
            canonical_json(c["config"])
        except (TypeError, ValueError) as e:
            raise DatasetError(f"candidate {i}: config must be JSON-able, got {c['config']!r}: {e}") from e
        sizes = [c["batch_size"]] if "batch_size" in c else list(batch_sizes)
        for b in sizes:
            b = as_int(b, f"candidate {i}: batch_size", low=1, error=DatasetError)
            try:
                cfg = ss.get_space(c["space"]).validate(c["config"])
                out.append(Candidate(space=c["space"], config=cfg, batch_size=b))
            except SearchSpaceError as e:
                out.append(Candidate(space=str(c["space"]), config=dict(c["config"]), batch_size=b,
                                     status="failed", reason=f"config rejected at planning: {e}"))
    return out


def _chunked(seq: Sequence[Job], size: int) -> Iterator[list[Job]]:
    """Chunks of ``size`` jobs; the first one smaller (an eighth, at least 8) so measuring starts early."""
    first = min(size, max(8, size // 8))
    yield list(seq[:first])
    for i in range(first, len(seq), size):
        yield list(seq[i:i + size])


def build_dataset(
    out: str | Path, *, spaces: Sequence[str] = (), n: int = 0, torch_device: str = "cpu",
    batch_sizes: Sequence[int] = (1, 8, 32), dtype: str = "float32", seed: int = 0,
    settings: MeasureSettings | None = None, mac_budget: int | None = 300_000_000,
    candidates: Sequence[Mapping[str, Any]] | None = None, workers: int = 2, chunk_size: int = 256,
    overlap: bool = True, pin_cpu: int | None = None, max_attempts: int = 2, cache: Any = True,
    measure_fn: MeasureFn | None = None, progress: bool = True, stop_after: int | None = None,
    retry_failed: Sequence[str] = (), isolate: bool = False, rounds: int = 0, op_profiles: str | Path | None = None,
    device: Any = MISSING,
) -> BuildReport:
    """Build (or resume building) a measured dataset in the SQLite file ``out``.

    Args:
        out: the dataset file (created when missing; see :class:`~dippm_nas.dataset.DatasetStore`).
        spaces: search spaces to sample from (``search_spaces.list_spaces()``); ignored with ``candidates``.
        n: candidates to sample (split evenly over ``spaces``).
        torch_device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``, passed to the measurer.
        batch_sizes: batch sizes to draw from (each candidate gets one; see the planning rule in
            :mod:`dippm_nas.dataset._plan`).
        dtype: compute dtype of the input spec, one of ``float32``, ``float16``, ``bfloat16``.
        seed: the plan's seed.
        settings: measurement settings; ``None`` means :data:`DEFAULT_BUILD_SETTINGS` (1 thread).
        mac_budget: largest MACs per batch (``macs_per_sample * batch_size``) planned; ``None``: no limit.
        candidates: explicit ``{"space", "config", "batch_size"?}`` mappings instead of sampling (without
            ``batch_size`` every size of ``batch_sizes`` is planned). A config outside its space is stored
            as a failed job with the reason.
        workers: conversion processes (``assemble_many``: blocks, or whole models of spaces that do not opt in);
            1 converts in this process.
        chunk_size: jobs converted per ``assemble_many`` call (and measured per round); the first round
            takes an eighth of it (at least 8) so measuring starts early.
        overlap: convert the next chunk while measuring this one (needs ``workers >= 2``).
        pin_cpu: pin the measuring thread to this CPU (conversion processes to the others); ``None``: no pinning.
        max_attempts: measurement attempts of a job before a process that keeps dying on it marks it failed.
        cache: conversion cache for ``assemble_many`` (``True``: the default cache).
        measure_fn: the measurer (tests pass a fake); default :func:`dippm_nas.measure.measure`.
        progress: show a progress bar.
        stop_after: stop after measuring this many jobs in this run (``None``: all); the rest stays open.
        isolate: measure each job in a fresh subprocess (:func:`dippm_nas.measure.measure_isolated`: a
            hard time limit, crash isolation, an exact RSS delta; costs a Python + torch start-up per job).
            The worker builds ``search_spaces.build_model(space, config)`` itself; ``measure_fn`` is not used.
        rounds: 0 (default): each model's latency is its own block of timed forwards. ``>= 1``
            (``torch_device="cpu"``, not ``isolate``): the chunk's latencies are timed again in this many
            interleaved rounds of one untimed and ``settings.min_repeats`` timed forwards per model (see
            above); far less sensitive to the machine's slow spells than one block per model.
        op_profiles: a ``.jsonl`` / ``.jsonl.xz`` file to append each ``ok`` model's operator profile to
            (``torch_device="cpu"``, not ``isolate``; see above); ``None`` (default): no profiling.
        retry_failed: measurement statuses (``"timeout"``, ``"oom"``, ``"error"``) whose failed jobs are
            reopened and measured again (e.g. after raising the time cap); their old rows are replaced.
        device: deprecated name of ``torch_device`` (a :class:`DeprecationWarning`; removed in 0.2).

    Returns:
        A :class:`BuildReport`.

    Raises:
        DatasetError: invalid arguments; SearchSpaceError: unknown space; MeasurementError /
            DeviceError: the measurer refused the device or settings (the job is left open).
    """
    t_start = time.perf_counter()
    device = renamed_keyword("build_dataset", "device", "torch_device", device, torch_device, "cpu", removed_in="0.2")
    opts = _Options.checked(
        device=device, dtype=dtype, workers=workers, chunk_size=chunk_size, max_attempts=max_attempts,
        pin_cpu=pin_cpu, rounds=rounds, isolate=isolate, op_profiles=op_profiles, retry_failed=retry_failed,
        settings=settings, measure_fn=measure_fn, cache=cache, progress=progress, stop_after=stop_after,
        overlap=overlap)
    _check_plan_args(candidates, spaces, n)
    store = DatasetStore(out)
    profiler = _Profiler(OpProfileWriter(op_profiles), opts.settings) if op_profiles is not None else None
    try:
        plan = _plan(store, opts, candidates=candidates, spaces=spaces, n=n, batch_sizes=batch_sizes, seed=seed,
                     mac_budget=mac_budget)
        report = BuildReport(path=str(store.path), plan_key=plan.key, planned=len(plan.job_ids),
                             resumed=plan.resumed, plan_stats=plan.stats)
        open_jobs = _open_jobs(store, plan, opts, report)
        _Measurer(store, opts, plan, report, profiler).run(open_jobs)
        return _stored_report(store, opts, plan, report, profiler, t_start)
    finally:
        store.close()
        if profiler is not None:
            profiler.writer.close()


@dataclass(frozen=True)
class _Options:
    """The checked options of :func:`build_dataset` (its arguments, less the plan's)."""

    device: str
    dtype: str
    workers: int
    chunk_size: int
    max_attempts: int
    pin_cpu: int | None
    rounds: int
    isolate: bool
    op_profiles: str | Path | None
    retry_failed: Sequence[str]
    settings: MeasureSettings
    measure_fn: MeasureFn
    cache: Any
    progress: bool
    stop_after: int | None
    overlap: bool

    @property
    def use_overlap(self) -> bool:
        """Whether the next chunk is converted while this one is measured."""
        return self.overlap and self.workers >= 2

    @classmethod
    def checked(cls, **kw: Any) -> "_Options":
        """The options, each checked (an invalid one is a :class:`DatasetError` naming it, the value and the rule);
        ``settings`` and ``measure_fn`` of ``None`` are the defaults."""
        device, isolate = kw["device"], kw["isolate"]
        if kw["dtype"] not in COMPUTE_DTYPES:
            raise DatasetError(f"dtype must be one of {COMPUTE_DTYPES}, got {kw['dtype']!r}")
        if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
            raise DatasetError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        for name, low in (("workers", 1), ("chunk_size", 1), ("max_attempts", 1), ("rounds", 0)):
            kw[name] = as_int(kw[name], name, low=low, error=DatasetError)
        if kw["pin_cpu"] is not None:
            allowed = _affinity() or []
            if kw["pin_cpu"] not in allowed:
                raise DatasetError(f"pin_cpu must be one of the CPUs this process may use {allowed}, got "
                                   f"{kw['pin_cpu']!r}")
        if kw["rounds"] and (device != "cpu" or isolate):
            raise DatasetError(f"rounds (interleaved latency timing) needs torch_device='cpu' and isolate=False, got "
                               f"torch_device={device!r}, isolate={isolate!r}")
        if kw["op_profiles"] is not None and (device != "cpu" or isolate):
            raise DatasetError(f"op_profiles (in-place operator times) needs torch_device='cpu' and isolate=False, "
                               f"got torch_device={device!r}, isolate={isolate!r}")
        bad = sorted(set(kw["retry_failed"]) - {"timeout", "oom", "error"})
        if bad:
            raise DatasetError(f"retry_failed takes the statuses 'timeout', 'oom', 'error', got {bad}")
        kw["settings"] = kw["settings"] if kw["settings"] is not None else DEFAULT_BUILD_SETTINGS
        kw["measure_fn"] = kw["measure_fn"] if kw["measure_fn"] is not None else _default_measure
        return cls(**kw)


# ---------------------------------------------------------------------------- 1. plan
def _check_plan_args(candidates: Sequence[Mapping[str, Any]] | None, spaces: Sequence[str], n: int) -> None:
    """:class:`DatasetError` unless there are explicit candidates, or spaces and ``n >= 1`` to sample."""
    if candidates is None and (not spaces or n < 1):
        raise DatasetError(f"give spaces and n >= 1 (or explicit candidates); got spaces={list(spaces)!r}, n={n!r}")


@dataclass(frozen=True)
class _StoredPlan:
    """The plan of a build as stored: its key, the parameters it is keyed by, its jobs."""

    key: str
    params: dict[str, Any]
    job_ids: list[int]
    resumed: bool
    stats: dict[str, Any]


def _plan(store: DatasetStore, opts: _Options, *, candidates: Sequence[Mapping[str, Any]] | None,
          spaces: Sequence[str], n: int, batch_sizes: Sequence[int], seed: int,
          mac_budget: int | None) -> _StoredPlan:
    """The stored plan of these arguments: found (a rerun) or drawn and stored in one transaction."""
    plan: Plan | None = None
    if candidates is not None:
        explicit = _normalise_explicit(candidates, batch_sizes)
        params: dict[str, Any] = {
            "kind": "explicit", "dtype": opts.dtype, "device": opts.device,
            "candidates": [[c.space, c.config, c.batch_size] for c in explicit],
        }
        plan = Plan(candidates=explicit, params=params)
    else:
        params = {"kind": "sampled", "spaces": list(spaces), "n": n, "batch_sizes": list(batch_sizes),
                  "seed": seed, "mac_budget": mac_budget, "dtype": opts.dtype, "device": opts.device}
    key = plan_key(params)
    job_ids = store.plan_job_ids(key)
    if job_ids is not None:
        logger.info("resuming plan %s: %d jobs", key[:12], len(job_ids))
        return _StoredPlan(key, params, job_ids, True, {})
    stats: dict[str, Any] = {}
    if plan is None:
        logger.info("planning %d candidates over %s (seed %d, MAC budget %s)", n, list(spaces), seed, mac_budget)
        t0 = time.perf_counter()
        plan = plan_candidates(spaces, n, batch_sizes=batch_sizes, seed=seed, mac_budget=mac_budget,
                               workers=opts.workers, extra={"dtype": opts.dtype, "device": opts.device},
                               progress=opts.progress)
        stats = {"rejected_over_budget": plan.rejected_over_budget, "duplicates": plan.duplicates,
                 "shortfall": plan.shortfall, "planning_s": time.perf_counter() - t0}
    job_ids = store.save_plan(key, {**plan.params, **({"stats": stats} if stats else {})}, [
        {"space": c.space, "config": c.config, "batch_size": c.batch_size, "dtype": opts.dtype,
         "device": opts.device, "status": c.status, "reason": c.reason, "macs_per_sample": c.macs_per_sample}
        for c in plan.candidates
    ])
    logger.info("plan %s stored: %d jobs", key[:12], len(job_ids))
    return _StoredPlan(key, params, job_ids, False, stats)


def _open_jobs(store: DatasetStore, plan: _StoredPlan, opts: _Options, report: BuildReport) -> list[Job]:
    """The plan's unfinished jobs, once ``retry_failed`` ones are reopened and the jobs a process kept dying on
    (``max_attempts`` attempts left ``running``) are stored as failed."""
    reopened = store.reopen_failed(plan.job_ids, list(opts.retry_failed))
    if reopened:
        logger.info("reopened %d failed jobs (%s) to measure again", reopened, ", ".join(opts.retry_failed))
    for job in store.jobs(plan.job_ids, status=_OPEN):
        if job.status == "running" and job.attempts >= opts.max_attempts:
            store.finish_job(job, _failed_row(
                f"the build process died while measuring this job in each of its {job.attempts} attempts "
                "(a crash, the kernel's OOM killer, or a kill); not retried"))
            report.failed_now += 1
    return store.jobs(plan.job_ids, status=_OPEN)


# ---------------------------------------------------------------------------- 2 + 3. convert and measure
class _Measurer:
    """Converts the open jobs chunk by chunk (the next chunk in a thread while this one is measured, with
    ``overlap``) and measures each converted job, storing its row with the job's final status."""

    def __init__(self, store: DatasetStore, opts: _Options, plan: _StoredPlan, report: BuildReport,
                 profiler: _Profiler | None) -> None:
        self.store, self.opts, self.report, self.profiler = store, opts, report, profiler
        self.base_affinity = _affinity()
        pin = opts.pin_cpu
        self.measure_cpus = {pin} if pin is not None else None
        self.convert_cpus = (set(self.base_affinity or []) - {pin}) or None if pin is not None else None
        self.env: dict[str, Any] = {
            "builder": f"dippm_nas.dataset.build_dataset (dippm-nas {__version__})",
            "plan_key": plan.key, "pinned_cpu": pin, "cpu_count": os.cpu_count(),
            "conversion_overlapped": opts.use_overlap, "conversion_workers": opts.workers,
            "isolated_worker": opts.isolate,
        }
        if opts.rounds:
            self.env["latency_schedule"] = {"kind": "interleaved", "rounds": opts.rounds,
                                            "per_round": opts.settings.min_repeats, "untimed_per_round": 1}
        self.measured_here = 0
        self.bar: Any = None  # the progress bar of a run

    def convert(self, chunk: list[Job]) -> tuple[int, int]:
        """Convert the chunk's ``pending`` jobs (``assemble_many``); returns (converted, failed)."""
        todo = [j for j in chunk if j.status == "pending"]
        if not todo:
            return 0, 0
        if self.convert_cpus:
            _set_affinity(self.convert_cpus)  # this thread; the spawned workers inherit it
        items, ready = [], []
        failed = 0
        for j in todo:
            try:
                spec = ss.get_space(j.space).input_spec(j.config, batch_size=j.batch_size, dtype=j.dtype)
            except SearchSpaceError as e:
                self.store.finish_job(j, _failed_row(f"config rejected: {e}"))
                failed += 1
                continue
            items.append((j.space, j.config, spec))
            ready.append(j)
        results = assemble_many(items, workers=self.opts.workers, cache=self.opts.cache,
                                progress=self.opts.progress and not self.opts.use_overlap)
        converted = []
        for j, r in zip(ready, results):
            if r.graph is not None:
                converted.append((j, r.graph))
            else:
                self.store.finish_job(j, _failed_row(f"capture failed: {r.error}"))
                failed += 1
        self.store.mark_converted(converted)
        return len(converted), failed

    def run(self, open_jobs: list[Job]) -> None:
        """Convert and measure ``open_jobs`` (up to ``stop_after`` measurements), chunk by chunk."""
        from tqdm.auto import tqdm

        stop_after = self.opts.stop_after
        to_measure = len(open_jobs) if stop_after is None else min(stop_after, len(open_jobs))
        self.bar = tqdm(total=to_measure, desc="measuring", unit="model", disable=not self.opts.progress,
                        mininterval=2.0)
        chunks = list(_chunked(open_jobs, self.opts.chunk_size)) if open_jobs else []
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dippm-convert") if self.opts.use_overlap \
            else None
        try:
            if self.measure_cpus:
                _set_affinity(self.measure_cpus)
            pending: Future | None = pool.submit(self.convert, chunks[0]) if chunks and pool is not None else None
            for ci, chunk in enumerate(chunks):
                if stop_after is not None and self.measured_here >= stop_after and ci > 0:
                    break
                if pool is not None:
                    assert pending is not None
                    _, conv_failed = pending.result()
                    pending = pool.submit(self.convert, chunks[ci + 1]) if ci + 1 < len(chunks) else None
                else:
                    _, conv_failed = self.convert(chunk)
                self.report.failed_now += conv_failed
                self._measure_chunk(chunk, pending)
            if pending is not None:
                pending.result()
        finally:
            self.bar.close()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            if self.measure_cpus and self.base_affinity:
                _set_affinity(set(self.base_affinity))

    def _measure_chunk(self, chunk: list[Job], pending: Future | None) -> None:
        """Measure the chunk's converted jobs one by one, then (with ``rounds``) time the ``ok`` ones again in
        interleaved rounds once the conversion beside them (``pending``) has finished."""
        opts, report, bar = self.opts, self.report, self.bar
        held: list[_Held] = []
        for job in self.store.jobs([j.id for j in chunk], status=("converted", "running")):
            if opts.stop_after is not None and self.measured_here >= opts.stop_after:
                break
            result = _measure_job(self.store, job, opts.device, opts.settings, opts.measure_fn, self.env,
                                  opts.isolate, hold=opts.rounds > 0, profiler=self.profiler)
            self.measured_here += 1
            if isinstance(result, _Held):
                held.append(result)
            elif result:
                report.measured_now += 1
            else:
                report.failed_now += 1
            bar.update(1)
            bar.set_postfix(ok=report.measured_now, failed=report.failed_now, refresh=False)
        if held:
            if pending is not None:
                pending.result()  # the rounds run with no conversion beside them
            bar.set_description(f"interleaved rounds ({len(held)} models)")
            ok_n = _finish_rounds(self.store, held, opts.settings, opts.rounds, self.profiler)
            report.measured_now += ok_n
            report.failed_now += len(held) - ok_n
            bar.set_description("measuring")
            bar.set_postfix(ok=report.measured_now, failed=report.failed_now, refresh=False)
        del held
        gc.collect()


# ---------------------------------------------------------------------------- 4. store the outcome
def _stored_report(store: DatasetStore, opts: _Options, plan: _StoredPlan, report: BuildReport,
                   profiler: _Profiler | None, t_start: float) -> BuildReport:
    """``report`` with the plan's final job counts, logged and stored in the dataset's metadata."""
    if profiler is not None:
        report.profiled_now = profiler.written
    final = store.jobs(plan.job_ids)
    report.done = sum(j.status == "done" for j in final)
    report.failed = sum(j.status == "failed" for j in final)
    report.open = sum(j.status in _OPEN for j in final)
    report.seconds = time.perf_counter() - t_start
    logger.info("build %s: %d done, %d failed, %d open (this run: %d measured, %d failed, %.0f s)",
                plan.key[:12], report.done, report.failed, report.open, report.measured_now, report.failed_now,
                report.seconds)
    store.set_meta(f"build:{plan.key}", {"params": plan.params, "last_run": {
        "done": report.done, "failed": report.failed, "open": report.open, "seconds": report.seconds,
        "settings": opts.settings.to_dict()}})
    return report


class _Profiler:
    """Writes an ``ok`` model's operator profile with its row's final latency (see the module docstring)."""

    def __init__(self, writer: OpProfileWriter, settings: MeasureSettings) -> None:
        self.writer = writer
        self.settings = settings
        self.written = 0

    def __call__(self, job: Job, model: Any, spec: InputSpec, row: Mapping[str, Any]) -> None:
        try:
            ops = profile_ops(model, spec, threads=self.settings.threads)
        except Exception as e:  # noqa: BLE001 - the row is measured and kept; only its profile is missing
            logger.warning("job %d (%s): profiling its operators failed, no profile line: %s: %s", job.id,
                           job.space, type(e).__name__, e)
            return
        finally:
            release_free_memory()
        self.writer.write(family=job.space, latency_ms=float(row["latency_ms"]), ops=ops, graph_hash=job.graph_hash,
                          config=job.config, batch_size=job.batch_size, dtype=job.dtype, job_id=job.id,
                          latency_schedule="rounds" if row.get("stop_reason") == "rounds" else "own block")
        self.written += 1


#: The builder an isolated measurement worker calls with ``{"name": space, "config": config}``.
ISOLATED_BUILDER = "search_spaces:build_model"


@dataclass
class _Held:
    """A measured ``ok`` job whose row waits for the chunk's interleaved rounds (its model is not kept:
    :func:`_finish_rounds` builds it again)."""

    job: Job
    spec: InputSpec
    row: dict[str, Any]


def _finish_rounds(store: DatasetStore, held: list[_Held], settings: MeasureSettings, rounds: int,
                   profiler: _Profiler | None = None) -> int:
    """Build ``held``'s models again, time them in interleaved rounds, put the rounds' latency in each row,
    (with ``profiler``) profile the ones timed ``ok``, store; returns the ok count."""
    built: list[tuple[_Held, Any]] = []
    rebuild_failed: dict[int, RoundTiming] = {}
    for i, h in enumerate(held):
        try:
            built.append((h, ss.build_model(h.job.space, h.job.config)))
        except Exception as e:  # noqa: BLE001 - it built a moment ago; if it no longer does, that is its row
            rebuild_failed[i] = RoundTiming(samples_ms=(), status="error", reason=(
                f"building it again for the interleaved rounds failed: {type(e).__name__}: {e}"))
    timings = time_interleaved([(m, h.spec) for h, m in built], settings, rounds=rounds,
                               per_round=settings.min_repeats)
    models = {id(h): m for h, m in built} if profiler is not None else {}  # kept only to be profiled
    del built
    timed = iter(timings)
    ok_n = 0
    for i, h in enumerate(held):
        t = rebuild_failed[i] if i in rebuild_failed else next(timed)
        row = h.row
        own = {k: row[k] for k in ("latency_ms", "latency_ms_std", "latency_ms_median", "latency_ms_ci95",
                                   "n_repeats", "stop_reason")}
        row["extra"] = {**row["extra"], "own_block": own}
        row["environment"] = {**row["environment"], "chunk_models_in_rounds": len(held) - len(rebuild_failed)}
        row.update(t.latency_fields())
        if t.ok:
            row["stop_reason"] = "rounds"
            row["extra"]["latency_ms_min"] = min(t.samples_ms)
            ok_n += 1
            if profiler is not None:
                profiler(h.job, models[id(h)], h.spec, row)
        else:  # no rounds for it (it failed in one, or to build again): a failed row, its one-by-one figures in extra
            reason = t.reason if i in rebuild_failed else f"in interleaved round {t.rounds + 1}: {t.reason}"
            row.update({"status": t.status, "reason": reason, "stop_reason": None, "memory_mib": None,
                        "memory_source": None})
        store.finish_job(h.job, row)
        models.pop(id(h), None)
    return ok_n


def _measure_job(store: DatasetStore, job: Job, device: str, settings: MeasureSettings, measure_fn: MeasureFn,
                 static_env: Mapping[str, Any], isolate: bool = False, hold: bool = False,
                 profiler: _Profiler | None = None) -> bool | _Held:
    """Build, measure and store one job; returns whether it ended ``done``. With ``profiler`` (and no
    ``hold``) an ``ok`` model's operator profile is written after its row is stored.

    With ``hold``, an ``ok`` job is not stored: its row comes back as a :class:`_Held` for the interleaved
    rounds (the model is dropped here, so the next model's memory is measured with nothing held).
    """
    attempt = store.start_attempt(job)
    env: dict[str, Any] = {**static_env, "attempt": attempt}
    model: Any = None
    try:
        spec = ss.get_space(job.space).input_spec(job.config, batch_size=job.batch_size, dtype=job.dtype)
        if not isolate:
            model = ss.build_model(job.space, job.config)
    except Exception as e:  # noqa: BLE001 - the candidate's builder failing is a row, not a crash
        store.finish_job(job, _failed_row(f"build failed: {type(e).__name__}: {e}", env))
        return False
    env["loadavg_before"] = list(os.getloadavg())
    env["cpu_affinity"] = _affinity()
    try:
        if isolate:
            try:
                m = measure_isolated(ISOLATED_BUILDER, spec, device, settings,
                                     model_kwargs={"name": job.space, "config": job.config})
            except SearchSpaceError as e:  # the worker's build_model failed: the candidate's fault
                store.finish_job(job, _failed_row(f"build failed (in the isolated worker): {e}", env))
                return False
        else:
            m = measure_fn(model, spec, device, settings)
    except (MeasurementError, DeviceError):
        store.undo_attempt(job)  # a usage error (device, settings): the job is not at fault
        raise
    env["loadavg_after"] = list(os.getloadavg())
    if not isinstance(m, Measurement):
        raise DatasetError(f"measure_fn must return a Measurement, got {type(m).__name__}")
    environment = {**m.environment, **env}
    json.dumps(environment)  # fail here, not in the store, if a measurer put something odd in it
    if hold and m.ok:
        del model
        return _Held(job=job, spec=spec, row=measurement_row(m, environment))
    row = measurement_row(m, environment)
    store.finish_job(job, row)
    if profiler is not None and m.ok and model is not None:
        profiler(job, model, spec, row)
    del model
    return m.ok
