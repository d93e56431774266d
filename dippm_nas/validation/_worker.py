"""The validation worker: claim a job, rebuild the model from its JSON config, measure it, record it.

``dippm-nas validate-worker --storage URL --device D`` runs :meth:`ValidationWorker.run` on the machine
that has device ``D``. A job carries a search-space name, a JSON config and an input spec; the model is
rebuilt with the registered builder (:func:`search_spaces.build_model`), so no code or pickle crosses
the queue. While measuring, a heartbeat thread extends the lease every ``lease_s / 3`` seconds, so a
measurement may take as long as it needs, and a worker that is killed gives its job back ``lease_s``
(default 60 s) after its last heartbeat.

Outcomes:

- the harness returns a :class:`~dippm_nas.measure.Measurement` of any status (``"ok"``; ``"oom"``:
  the model does not fit the device, a result, not a failure; ``"timeout"``; ``"error"``: the model's
  forward raised) -> the job is ``done`` and one results row is written;
- the job cannot be run (unknown space, config outside the space, bad spec, a usage error of the
  harness) -> the job is ``failed`` with the reason, not retried;
- the worker dies -> its heartbeat stops, its lease expires and the job is claimed again (up to
  ``max_attempts``);
- the worker stops (``stop`` set by SIGTERM or Ctrl-C in ``validate-worker``, ``KeyboardInterrupt``, an
  error) -> every job it claimed and has not recorded is released (:meth:`JobQueue.release`: back to
  ``queued``, the attempt not counted); the outcome is ``"released"``.

**LLM generations** (jobs of space :data:`~dippm_nas.validation.GENERATION_SPACE`): the worker rebuilds the decoder
with random weights and times its time to first token and decode ms per token
(:func:`~dippm_nas.validation.measure_generation`; vLLM where importable on CUDA, else transformers' ``generate``);
the results row's latency is the time to first token, ``details`` holds the decode figures and their error.

**Interleaved rounds** (``rounds > 0``, CPU devices): the worker claims up to ``rounds_batch`` jobs, measures
each one by one as above (memory, energy, its own block of timed forwards), then times the ``ok`` ones again
in ``rounds`` interleaved rounds (:func:`dippm_nas.measure.time_interleaved`) and records the rounds'
latency (``stop_reason="rounds"``; the own block stays in ``details``). On a shared VM a block of timed
forwards measures the machine's state of that second as much as the model: two passes over 3,300 models
agreed to 15.8 % MAPE one block per model and to 6.4 % in rounds (``data/host_cpu/README.md``). The
host-CPU checkpoints' labels are rounds, so validating with rounds compares the same quantity.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from dippm_nas._deprecation import MISSING, renamed_keyword
from dippm_nas._numbers import as_int, as_real
from dippm_nas.devices import resolve_device
from dippm_nas.errors import DeviceError, DippmNasError, InputSpecError, ValidationError
from dippm_nas.measure import MeasureSettings, measure, time_interleaved
from dippm_nas.spec import InputSpec
from dippm_nas.validation._adapt import adapt_storage_of, feed_adaptation
from dippm_nas.validation._generation import (GENERATION_SPACE, measure_generation_job, predicted_for_engine,
                                              read_generation_job)
from dippm_nas.validation._queue import Job, JobQueue, worker_id
import search_spaces

__all__ = ["ValidationWorker", "device_is_here", "torch_device_for", "MeasureFn", "local_gpu_count"]

logger = logging.getLogger(__name__)

#: ``measure_fn(model, spec, torch_device, settings) -> Measurement``; the default is
#: :func:`dippm_nas.measure.measure`. Tests pass fakes.
MeasureFn = Callable[[Any, Any, str, Any], Any]


def _local_gpu_names() -> list[str]:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def local_gpu_count() -> int:
    """CUDA devices on this machine (0 without CUDA)."""
    return len(_local_gpu_names())


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _matching_gpu(device: str) -> int | None:
    dev = resolve_device(device)
    want = _norm(dev.name)
    for i, name in enumerate(_local_gpu_names()):
        if _norm(name) == want:
            return i
    return None


def device_is_here(device: str) -> bool:
    """Whether this machine can measure catalogue device ``device``.

    ``host-cpu`` (and any ``kind="cpu"`` device) always is; a GPU is when a local CUDA device reports
    the catalogue's name (``torch.cuda.get_device_name``, compared ignoring case and punctuation).
    """
    dev = resolve_device(device)
    if dev.kind == "cpu":
        return True
    return _matching_gpu(dev.id) is not None


def torch_device_for(device: str, torch_device: str | None = None, *, cuda_device: Any = MISSING) -> str:
    """The torch device string that measures catalogue device ``device`` here.

    Args:
        device: catalogue id.
        torch_device: force a CUDA device (``"cuda:1"``) instead of the first one matching the name.
        cuda_device: deprecated name of ``torch_device`` (a :class:`DeprecationWarning`; removed in 0.2).

    Raises:
        DeviceError: a GPU that is not on this machine (the local GPUs are listed).
    """
    torch_device = renamed_keyword("torch_device_for", "cuda_device", "torch_device", cuda_device, torch_device, None,
                                   removed_in="0.2")
    dev = resolve_device(device)
    if dev.kind == "cpu":
        return "cpu"
    if torch_device is not None:
        return torch_device
    idx = _matching_gpu(dev.id)
    if idx is None:
        raise DeviceError(
            f"device {dev.id!r} ({dev.name}) is not on this machine; local CUDA devices: {_local_gpu_names() or 'none'}. "
            "Run the worker where it is, or pass --torch-device cuda:N to measure another GPU under this id."
        )
    return f"cuda:{idx}"


def check_rounds(device: Any, rounds: Any, batch: Any,
                 names: tuple[str, str] = ("rounds", "rounds_batch")) -> tuple[int, int]:
    """``(rounds, batch)`` as ints; :class:`ValidationError` unless ``rounds`` is an int >= 0 and ``batch`` an
    int >= 1, and ``rounds`` is 0 for a device (a catalogue :class:`~dippm_nas.devices.Device`) that is not a
    CPU."""
    rounds = as_int(rounds, names[0], low=0, error=ValidationError)
    batch = as_int(batch, names[1], low=1, error=ValidationError)
    if rounds and device.kind != "cpu":
        raise ValidationError(
            f"{names[0]}={rounds}: interleaved rounds time CPU devices only, and {device.id!r} is a {device.kind}; "
            f"use {names[0]}=0 (a GPU is timed with CUDA events, one model at a time)")
    return rounds, batch


class _Heartbeat:
    """Extends the leases of ``jobs`` every ``period_s`` seconds in a daemon thread until stopped; a job
    handed to :meth:`drop` (completed or failed) is no longer extended."""

    def __init__(self, queue: JobQueue, jobs: Sequence[Job], owner: str, period_s: float) -> None:
        self._queue, self._owner, self._period = queue, owner, period_s
        self._jobs = {job.id: job for job in jobs}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self.lost: set[int] = set()
        self._thread = threading.Thread(target=self._run, name=f"dippm-lease-{'-'.join(map(str, self._jobs))}",
                                        daemon=True)

    def drop(self, job: Job) -> None:
        with self._mutex:
            self._jobs.pop(job.id, None)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            with self._mutex:
                active = [j for j in self._jobs.values() if j.id not in self.lost]
            for job in active:
                try:
                    if not self._queue.heartbeat(job.id, self._owner):
                        self.lost.add(job.id)
                        logger.warning("validation worker %s lost the lease of job %d", self._owner, job.id)
                except DippmNasError as e:  # a database hiccup: try again next period
                    logger.warning("validation worker %s could not extend the lease of job %d: %s", self._owner,
                                   job.id, e)

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()


class ValidationWorker:
    """Drains the validation queue of one device.

    Args:
        queue: the :class:`JobQueue`.
        device: catalogue id this worker measures (``"host-cpu"``, ``"a100-sxm4-40gb"``...).
        settings: :class:`~dippm_nas.measure.MeasureSettings` of every measurement (``None``: defaults).
        torch_device: measure on this CUDA device (``"cuda:1"``) instead of the first one whose name matches
            ``device``.
        owner: lease owner name (default :func:`worker_id`).
        isolate: measure each job in a fresh subprocess (``measure(..., isolate=True)``: hard time limit,
            exact host-memory delta, a crash becomes an ``"error"`` row); the model is rebuilt there
            from ``search_spaces:build_model`` and the job's JSON config.
        heartbeat_s: lease extension period, seconds (default ``queue.lease_s / 3``).
        measure_fn: replaces :func:`dippm_nas.measure.measure` (tests); called as
            ``measure_fn(model, spec, torch_device, settings)``.
        rounds: time the ``ok`` jobs of each claimed batch again in this many interleaved rounds of
            ``settings.min_repeats`` timed forwards each (CPU devices only; ``0``, the default: the
            one-by-one measurement is the result).
        rounds_batch: with ``rounds``, jobs claimed and timed together (at least 1; default 8).
        adapt: feed every ``"ok"`` measurement to ``adapt()`` of the device's predictor (when it has a network),
            stored in the queue's database under (device, deployment, the job's search space): the search's
            predictions of that key follow the measurements (see :mod:`dippm_nas.validation._adapt`).
        cuda_device: deprecated name of ``torch_device`` (a :class:`DeprecationWarning`; removed in 0.2).

    Raises:
        DeviceError: ``device`` is a GPU this machine does not have (and no ``torch_device`` given).
        ValidationError: bad ``heartbeat_s``, ``rounds`` or ``rounds_batch``; ``rounds`` on a GPU.
    """

    def __init__(self, queue: JobQueue, device: str, *, settings: Any = None, torch_device: str | None = None,
                 owner: str | None = None, isolate: bool = False, heartbeat_s: float | None = None,
                 measure_fn: MeasureFn | None = None, rounds: int = 0, rounds_batch: int = 8,
                 adapt: bool = False, cuda_device: Any = MISSING) -> None:
        torch_device = renamed_keyword("ValidationWorker", "cuda_device", "torch_device", cuda_device, torch_device,
                                       None, removed_in="0.2")
        dev = resolve_device(device)
        self.queue = queue
        self.device = dev.id
        self.settings = settings if settings is not None else MeasureSettings()
        if not isinstance(self.settings, MeasureSettings):
            raise ValidationError(f"settings must be a MeasureSettings, got {type(self.settings).__name__}")
        if measure_fn is None:
            self.torch_device = torch_device_for(self.device, torch_device)
        else:  # a fake harness: no hardware check
            self.torch_device = torch_device or ("cpu" if dev.kind == "cpu" else "cuda")
        self.owner = owner or worker_id()
        self.isolate = bool(isolate)
        self.heartbeat_s = float(heartbeat_s) if heartbeat_s is not None else queue.lease_s / 3.0
        if self.heartbeat_s <= 0:
            raise ValidationError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
        self.rounds, self.rounds_batch = check_rounds(dev, rounds, rounds_batch)
        self._measure_fn = measure_fn
        self.adapt = bool(adapt)
        self.processed = 0
        #: the newest adaptation this worker fitted (``None`` before the first) and the job that fitted it
        self.adaptation: Any = None
        self.adaptation_job: int | None = None

    def __repr__(self) -> str:
        return f"ValidationWorker(device={self.device!r}, owner={self.owner!r}, torch_device={self.torch_device!r})"

    def settings_for(self, job: Job) -> Any:
        """The measurement settings of a job: the worker's, with the torch thread count of a host-cpu
        prediction (``predicted["host_threads"]``: the count its checkpoint's labels were measured with)
        when the worker's settings leave it unset, so measured and predicted are the same quantity."""
        n = job.predicted.get("host_threads")
        if self.settings.threads is None and isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            return dataclasses.replace(self.settings, threads=n)
        return self.settings

    def _measure(self, job: Job) -> Any:
        """The measurement of a job, or raise DippmNasError when the job cannot be run."""
        if job.space == GENERATION_SPACE:
            return self._measure_generation(job)
        try:
            spec = InputSpec.from_dict(job.spec)
        except InputSpecError as e:
            raise InputSpecError(f"job {job.id}'s spec_json {job.spec!r:.200} is not an InputSpec: {e}") from e
        settings = self.settings_for(job)
        if self.isolate and self._measure_fn is None:
            return measure("search_spaces:build_model", spec, self.torch_device, settings, isolate=True,
                           model_kwargs={"name": job.space, "config": job.config})
        model = search_spaces.build_model(job.space, job.config)
        if self._measure_fn is not None:
            return self._measure_fn(model, spec, self.torch_device, settings)
        return measure(model, spec, self.torch_device, settings)

    def _measure_generation(self, job: Job) -> Any:
        """An LLM-generation job, timed in this process (never isolated, never by ``measure_fn``) with
        :func:`~dippm_nas.validation.measure_generation`: at most 1 warm-up call and ``min_repeats`` timed repeats
        clamped to 2..5 (a generation is many forwards)."""
        _decoder, _wl, tp = read_generation_job(job.config)
        if self.torch_device.startswith("cuda") and tp > 1:
            import torch

            if tp > torch.cuda.device_count():
                raise ValidationError(f"job {job.id} is split over {tp} GPUs and this machine has "
                                      f"{torch.cuda.device_count()}")
        warmup = min(self.settings.warmup, 1)
        repeats = max(2, min(self.settings.min_repeats, 5))
        return measure_generation_job(job.config, self.torch_device, job.predicted, warmup=warmup, repeats=repeats)

    def _measure_or_fail(self, job: Job) -> Any:
        """The measurement of a claimed job; when it cannot be run, the job is failed here and its outcome
        (``"failed"``, or ``"lost"`` without the lease) comes back instead."""
        try:
            return self._measure(job)
        except DippmNasError as e:
            reason = f"{type(e).__name__}: {e}"
            logger.warning("validation job %d (study %s, trial %d) cannot be run: %s", job.id, job.study,
                           job.trial_number, reason)
        except Exception as e:  # noqa: BLE001 - an unexpected fault is recorded on the job, never dropped
            reason = f"unexpected {type(e).__name__} in the worker: {e}"
            logger.exception("validation job %d failed unexpectedly", job.id)
        return "failed" if self.queue.fail(job, self.owner, reason) else "lost"

    def _complete(self, job: Job, measurement: Any) -> str:
        self.processed += 1
        if job.space == GENERATION_SPACE:  # compare with the prediction for the engine that measured it
            engine = measurement.environment.get("generation", {}).get("engine")
            job = dataclasses.replace(job, predicted=predicted_for_engine(job.predicted, str(engine)))
        if not self.queue.complete(job, self.owner, measurement):
            return "lost"
        if self.adapt and job.space != GENERATION_SPACE:
            try:
                ad = feed_adaptation(job, measurement, adapt_storage_of(self.queue.url_with_credentials()))
            except DippmNasError as e:  # the measurement is recorded; adapting it is a bonus, never a failure
                logger.warning("validation job %d: adapt() failed (%s); the measurement is recorded", job.id, e)
            else:
                if ad is not None:
                    self.adaptation, self.adaptation_job = ad, job.id
                    logger.info("validation job %d adapted %s (%s): version %d on %d rows", job.id, job.device,
                                job.space, ad.version, ad.rows)
        return "done"

    def _release(self, jobs: Sequence[Job]) -> None:
        """Hand back claimed jobs that have no recorded outcome (never raises: the leases expire anyway)."""
        for job in jobs:
            try:
                if self.queue.release(job, self.owner):
                    logger.info("validation worker %s released job %d unmeasured", self.owner, job.id)
            except DippmNasError as e:
                logger.warning("validation worker %s could not release job %d (%s); it goes back to the queue "
                               "when its lease expires", self.owner, job.id, e)

    def process(self, job: Job) -> str:
        """Measure a claimed job and record the outcome; returns ``"done"``, ``"failed"`` or ``"lost"``.

        An exception that stops the worker (``KeyboardInterrupt``, ...) releases the job first.
        """
        recorded = False
        try:
            with _Heartbeat(self.queue, [job], self.owner, self.heartbeat_s):
                measurement = self._measure_or_fail(job)
            if isinstance(measurement, str):
                recorded = True
                return measurement
            outcome = self._complete(job, measurement)
            recorded = True
            return outcome
        finally:
            if not recorded:
                self._release([job])

    def run_one(self, *, study: str | None = None) -> tuple[Job, str] | None:
        """Claim and process one job; ``None`` when the queue has nothing for this device (and study)."""
        job = self.queue.claim(self.device, self.owner, study=study)
        if job is None:
            return None
        return job, self.process(job)

    def run_batch(self, *, study: str | None = None, limit: int | None = None,
                  stop: threading.Event | None = None) -> list[tuple[Job, str]]:
        """Claim up to ``rounds_batch`` (and ``limit``) jobs, measure each, time the ``ok`` ones again in
        interleaved rounds (with ``rounds``), record them; returns each job with its outcome, in claim order
        (empty when the queue has nothing for this device and study).

        When ``stop`` is set during the batch, or an exception (``KeyboardInterrupt``...) ends it, every
        claimed job not yet recorded is released unmeasured (outcome ``"released"``; the exception is
        re-raised).
        """
        want = self.rounds_batch if limit is None else max(0, min(self.rounds_batch, limit))
        claimed: list[Job] = []
        outcomes: dict[int, str] = {}
        try:
            while len(claimed) < want and not (stop is not None and stop.is_set()):
                job = self.queue.claim(self.device, self.owner, study=study)
                if job is None:
                    break
                claimed.append(job)
            with _Heartbeat(self.queue, claimed, self.owner, self.heartbeat_s) as beat:
                held: list[tuple[Job, Any]] = []
                for job in claimed:
                    if stop is not None and stop.is_set():
                        break
                    m = self._measure_or_fail(job)
                    if isinstance(m, str) or not self.rounds or not m.ok or job.space == GENERATION_SPACE:
                        outcomes[job.id] = m if isinstance(m, str) else self._complete(job, m)
                        beat.drop(job)
                    else:
                        held.append((job, m))
                if held and not (stop is not None and stop.is_set()):
                    for (job, m), final in zip(held, self._rounds(held)):
                        outcomes[job.id] = self._complete(job, final)
        finally:
            unrecorded = [job for job in claimed if job.id not in outcomes]
            self._release(unrecorded)
            for job in unrecorded:
                outcomes[job.id] = "released"
        return [(job, outcomes[job.id]) for job in claimed]

    def _rounds(self, held: list[tuple[Job, Any]]) -> list[Any]:
        """``held``'s one-by-one measurements with their latency from interleaved rounds of the rebuilt
        models (jobs grouped by their settings); a job whose rounds fail keeps its own block, and says so."""
        groups: dict[str, list[int]] = {}
        for i, (job, _m) in enumerate(held):
            groups.setdefault(repr(self.settings_for(job)), []).append(i)
        out: list[Any] = [m for _job, m in held]
        for idx in groups.values():
            settings = self.settings_for(held[idx[0]][0])
            items, faults = [], {}
            for i in idx:
                job = held[i][0]
                try:
                    items.append((i, search_spaces.build_model(job.space, job.config), InputSpec.from_dict(job.spec)))
                except Exception as e:  # noqa: BLE001 - it built a moment ago; if not now, it keeps its block
                    faults[i] = f"building it again failed: {type(e).__name__}: {e}"
            timings = time_interleaved([(model, spec) for _i, model, spec in items], settings, rounds=self.rounds,
                                       per_round=settings.min_repeats)
            for (i, _model, _spec), t in zip(items, timings):
                if t.ok:
                    out[i] = _with_rounds(out[i], t, settings.min_repeats, len(items))
                else:
                    faults[i] = f"in interleaved round {t.rounds + 1}: {t.status}: {t.reason}"
            for i, why in faults.items():
                logger.warning("validation job %d: no interleaved rounds (%s); its own block of timed forwards "
                               "is the result", held[i][0].id, why)
                out[i] = dataclasses.replace(out[i], environment={
                    **out[i].environment, "latency_schedule": {"kind": "own block", "rounds_failed": why}})
        return out

    def run(self, *, max_jobs: int | None = None, idle_timeout_s: float | None = None, poll_s: float = 2.0,
            study: str | None = None, stop: threading.Event | None = None,
            on_job: Callable[[Job, str], None] | None = None) -> int:
        """Process jobs until ``max_jobs`` were handled, the queue stayed empty ``idle_timeout_s``, or ``stop`` is set.

        Args:
            max_jobs: stop after this many claimed jobs (``None``: no limit).
            idle_timeout_s: stop when nothing was claimable for this long, seconds (``None``: wait
                forever; ``0``: stop as soon as the queue is empty).
            poll_s: wait between polls of an empty queue, seconds.
            study: only jobs of this study.
            stop: an event that ends the loop between jobs (with ``rounds``, also between the jobs of a
                batch: the claimed jobs not yet recorded are released).
            on_job: called with each job and its outcome (``"done"``, ``"failed"``, ``"lost"``,
                ``"released"``).

        Returns:
            The number of jobs claimed and not released.

        Raises:
            ValidationError: ``max_jobs`` not an int >= 0, ``idle_timeout_s`` not a finite number >= 0, or
                ``poll_s`` not a finite number >= 0 (``None`` is allowed where documented).
        """
        if max_jobs is not None:
            max_jobs = as_int(max_jobs, "max_jobs", low=0, error=ValidationError, or_none=True)
        if idle_timeout_s is not None:
            idle_timeout_s = as_real(idle_timeout_s, "idle_timeout_s", low=0, error=ValidationError, or_none=True)
        poll_s = as_real(poll_s, "poll_s", low=0, error=ValidationError)
        handled = 0
        idle_since = time.monotonic()
        while not (stop is not None and stop.is_set()):
            if max_jobs is not None and handled >= max_jobs:
                break
            if self.rounds:
                left = None if max_jobs is None else max_jobs - handled
                batch = self.run_batch(study=study, limit=left, stop=stop)
            else:
                one = self.run_one(study=study)
                batch = [] if one is None else [one]
            if not batch:
                if idle_timeout_s is not None and time.monotonic() - idle_since >= idle_timeout_s:
                    break
                if stop is not None:
                    stop.wait(poll_s)
                else:
                    time.sleep(poll_s)
                continue
            handled += sum(outcome != "released" for _job, outcome in batch)
            idle_since = time.monotonic()
            if on_job is not None:
                for job, outcome in batch:
                    on_job(job, outcome)
        return handled


def _with_rounds(m: Any, timing: Any, per_round: int, models: int) -> Any:
    """Measurement ``m`` with the latency of its interleaved rounds (an ``ok``
    :class:`~dippm_nas.measure.RoundTiming`); its own block moves to ``details``."""
    own = {"own_block_latency_ms": m.latency_ms, "own_block_latency_ms_std": m.latency_ms_std,
           "own_block_latency_ms_median": m.latency_ms_median, "own_block_n_repeats": float(m.n_repeats)}
    return dataclasses.replace(
        m, **timing.latency_fields(), stop_reason="rounds",
        details={**m.details, **{k: v for k, v in own.items() if v is not None},
                 "latency_ms_min": min(timing.samples_ms)},
        environment={**m.environment, "latency_schedule": {"kind": "interleaved", "rounds": timing.rounds,
                                                           "per_round": per_round, "models_in_rounds": models}},
    )
