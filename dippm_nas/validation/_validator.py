"""``ParetoValidator``: an Optuna study callback that measures the Pareto front as the search runs.

Every ``every_n_trials`` finished trials or ``every_seconds`` seconds (whichever comes first), a round:

1. takes ``study.best_trials`` (the feasible Pareto front when the study has constraints) that have no
   validation job on the device yet and can be rebuilt: their :class:`~dippm_nas.trial.TrialRecord` (the
   user attributes :class:`~dippm_nas.optuna.HardwareCostModel` and :class:`~dippm_nas.nni.HardwareAwareTuner`
   write alike) has the ``search_space``, ``search_space_config`` and ``input_spec`` of a model of
   :mod:`search_spaces`;
2. orders them by uncertainty, highest first: the largest relative standard deviation
   (``std / value``) of the trial's predicted latency, energy and memory; a trial whose predictions carry
   no standard deviation (the analytic prior) has unknown uncertainty and ranks before every known one,
   oldest trial first among equals;
3. enqueues at most ``max_per_round`` trials in the SQL job table with the prediction for the validation device
   they will be compared with: up to ``uncertain_per_round`` of them (default a third of ``max_per_round``,
   rounded down) trials whose feasibility is uncertain (a budget check rejects them but the budget lies within the
   margin's band around the predicted mean, :attr:`~dippm_nas.trial.TrialRecord.band_distance` below 1; in
   :func:`~dippm_nas.validation.uncertain_order`), the front the rest; a share one kind cannot fill goes to the
   other (:func:`~dippm_nas.validation.round_split`), so a round never measures more than ``max_per_round``. A
   search that measured only its believed-feasible front would never learn about what a wide margin rejects, nor
   gather the in-space rows (``Adaptation.conformal_scores``) that narrow the margin;
4. measures them here when the device is here (``mode="auto"`` or ``"local"``: it drains the queued
   jobs of this study and device in-process, through the same claim and lease as a remote worker), or
   leaves them to ``dippm-nas validate-worker`` on the machine that has the device (``mode="queue"``);
5. writes a :class:`~dippm_nas.validation.ValidationSummary` to the study's user attribute
   ``"dippm_validation"`` and, with ``auto_calibrate``, fits and applies a latency calibration of the
   validation device once ``min_calibration_rows`` measurements are in: on a GPU the measured trials feed
   the device predictor's host, GPU and op-class GPU factors (:meth:`ParetoValidator.calibrate`), refitted
   online after every round from all measurements so far;
6. with ``adapt`` (the default where the validation device's predictor has a network), every measurement is fed
   to that predictor's ``adapt()`` as it is recorded (by the local worker here, by ``dippm-nas validate-worker``
   elsewhere), stored in the queue's database per (device, deployment, search space); each round's predictions
   are made with the newest version stored (:mod:`dippm_nas.validation._adapt`).
7. with ``choose_path`` (the default with ``adapt``), both paths, the adapted network and the analytic prior with its
   calibrated factors, predict each job before it is measured; after the round the newly measured jobs score them by
   the study's yardstick and the winner answers the device's predictions from then on
   (:class:`~dippm_nas.validation.PathChoice`, :mod:`dippm_nas.validation._path_rounds`).

An LLM-generation trial (its record has a ``generation`` section) is enqueued as a job of
:data:`~dippm_nas.validation.GENERATION_SPACE` when the validation device can hold it, with the prediction for that
device (:func:`~dippm_nas.validation.predicted_generation`); the worker times its first token and decode per token
(:mod:`dippm_nas.validation._generation`). Its jobs are left out of the latency calibration and adaptation.

Which trials a round takes is :mod:`dippm_nas.validation._selection`; the job and the prediction it enqueues for each,
:mod:`dippm_nas.validation._round_jobs`; the checks of the validator's arguments,
:mod:`dippm_nas.validation._validator_options`; the path choice's bookkeeping, :class:`PathRounds
<dippm_nas.validation._path_rounds.PathRounds>`.

Several processes optimising one study may each run a validator: the queue's unique
``(study, trial, device)`` row and its leases make every trial measured once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from dippm_nas._logging import WarnOnce
from dippm_nas._sql import storage_url_of
from dippm_nas.deployment import Deployment
from dippm_nas.errors import DippmNasError, ValidationError
from dippm_nas.spec import InputSpec
from dippm_nas.trial import TrialRecord
from dippm_nas.validation._calibrate import Calibration, apply_calibration, calibrate_predictor, fit_calibration
from dippm_nas.validation._path_rounds import PathRounds
from dippm_nas.validation._generation import GENERATION_SPACE
from dippm_nas.validation._queue import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS, JobQueue, ValidationRecord
from dippm_nas.validation._round_jobs import enqueue_generation, job_spec, predicted_for, use_adaptation
from dippm_nas.validation._selection import UNKNOWN_UNCERTAINTY, front_candidates, uncertain_trials, uncertainty_of
from dippm_nas.validation._summary import ValidationSummary, summarize
from dippm_nas.validation._uncertain import round_split
from dippm_nas.validation._validator_options import MODES, validator_options
from dippm_nas.validation._worker import MeasureFn, ValidationWorker

__all__ = ["ParetoValidator", "RoundReport", "MODES", "SUMMARY_ATTR", "UNKNOWN_UNCERTAINTY", "uncertainty_of"]

logger = logging.getLogger(__name__)

#: The study user attribute holding the summary.
SUMMARY_ATTR = "dippm_validation"

_warn_once = WarnOnce(logger)


def _monotonic() -> float:
    """Seconds of a monotonic clock (a function so tests can step it)."""
    return time.monotonic()


@dataclass
class RoundReport:
    """What one validation round did.

    Attributes:
        enqueued: trial numbers enqueued this round (in priority order: the front's, then the uncertain ones).
        uncertain: those of ``enqueued`` taken because their feasibility is uncertain (not on the feasible front).
        skipped: trial numbers of the front that cannot be validated (see ``skip_reasons``).
        skip_reasons: ``{trial number: why it cannot be validated}``: no prediction in its attributes (or attributes
            that cannot be read), no
            search-space attributes, an LLM generation that cannot be measured on the device (its decoder cannot be
            rebuilt, its weights exceed the device's memory, tensor parallelism beyond the GPUs here), or a
            prediction for the validation device that failed.
        measured: jobs measured here this round (local mode).
        seconds: wall time of the round, seconds.
        adaptation_version, adaptation_rows: the validation device's newest stored adaptation after the round
            (``None`` without one).
        prediction_path: with ``choose_path``, the path answering the device's predictions after the round
            (``"network"`` or ``"prior"``; ``None`` without the choice).
        path_scores: with ``choose_path``, the choice's state after the round (:meth:`PathChoice.to_dict` without
            ``seen``: the yardstick, each path's ``[right, counted]``, the rounds; ``None`` before any measured job).
    """

    enqueued: list[int] = field(default_factory=list)
    uncertain: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    skip_reasons: dict[int, str] = field(default_factory=dict)
    measured: int = 0
    seconds: float = 0.0
    adaptation_version: int | None = None
    adaptation_rows: int | None = None
    prediction_path: str | None = None
    path_scores: dict[str, Any] | None = None


class ParetoValidator:
    """Measure the Pareto front of an Optuna study while it runs (a study callback).

    Args:
        device: catalogue id of the device to measure on and compare predictions for (``"host-cpu"``,
            ``"a100-sxm4-40gb"``...). Predictions for this device are made when the job is enqueued,
            whatever device the search optimises for.
        storage: SQLAlchemy URL of the job and results tables; default the study's RDB storage URL
            (a private in-memory SQLite database for in-memory studies, which only ``mode="local"``
            can use).
        every_n_trials: run a round after this many trials finished in this process (``None``: never by count).
        every_seconds: run a round when this many seconds passed since the last (``None``: never by time).
        max_per_round: most trials enqueued per round (the front's and the uncertain ones together).
        uncertain_per_round: of those, how many go to trials whose feasibility is uncertain (module docstring, step
            3), from ``0`` (the front only) to ``max_per_round``; ``None`` (default): a third of ``max_per_round``,
            rounded down (:func:`~dippm_nas.validation.default_uncertain_per_round`). Only a study whose trials
            record budget checks (``Budgets`` of ``HardwareCostModel`` or ``HardwareAwareTuner``) has any.
        mode: one of :data:`MODES`.
        batch_size: measure (and predict) with this batch size instead of the trial's (e.g. a serving
            batch too large to time on a CPU); ``None`` keeps the trial's.
        dtype: measure (and predict) in this compute dtype instead of the trial's (e.g. ``"float32"`` on a
            CPU for a search whose candidates are float16 on the GPU); ``None`` keeps the trial's.
        deployment: how the measured passes run on the validation device, as in :func:`dippm_nas.predict` (a
            :class:`~dippm_nas.Deployment`, a mapping of its fields or a JSON/TOML file; ``None``: not
            described); the prediction each job is compared with is for it, and the job records it
            (``predicted["deployment"]``).
        settings: :class:`~dippm_nas.measure.MeasureSettings` of local measurements.
        lease_s, max_attempts: of the :class:`JobQueue`.
        auto_calibrate: fit and apply :meth:`calibrate` after each round once ``min_calibration_rows``
            ``"ok"`` measurements exist.
        min_calibration_rows: see ``auto_calibrate``.
        isolate: measure local jobs in a fresh subprocess each.
        measure_fn: replaces the harness for local jobs (tests).
        interleave_rounds, interleave_batch: local jobs on a CPU device are timed again in
            ``interleave_rounds`` interleaved rounds, ``interleave_batch`` jobs at a time (a
            :class:`~dippm_nas.validation.ValidationWorker`'s ``rounds`` and ``rounds_batch``; ``0``, the
            default: one block of timed forwards per job). A remote worker takes them as
            ``dippm-nas validate-worker --rounds N --rounds-batch K``.
        adapt: feed every measurement to the validation device's predictor's ``adapt()`` (stored in the queue's
            database, per device, deployment and search space) and predict each round with the newest version;
            ``None`` (default): on when that predictor has a network (a trained checkpoint), off for the
            analytic prior and for a fake harness (``measure_fn``). With it, ``auto_calibrate`` leaves the predictor alone (the adaptation holds the
            factor calibration) and only records the latency factor in the summary.
        choose_path: after each round, score the adapted network and the analytic prior with its calibrated
            factors on the round's newly measured trials (each by its prediction made before the measurement; the
            order of the latencies without budgets, the budget check's feasibility classification where the trials
            record budgets and no ``batch_size`` / ``dtype`` override changes what is measured) and let the winner
            answer the device's predictions from then on (ties: the prior; before a scored round: the network),
            named in ``labels["prediction_path"]`` and the trial attribute ``prediction_path``
            (:class:`~dippm_nas.validation.PathChoice`, stored as JSON in the queue's database). ``None``
            (default): on with ``adapt``; ``True`` needs ``adapt``.

    Raises:
        ValidationError: invalid schedule, mode or counts; ``mode="local"`` for a device not on this machine.
        DeploymentError: a bad deployment (the field, the value and the choices are named).
    """

    def __init__(
        self,
        device: str = "host-cpu",
        *,
        storage: str | None = None,
        every_n_trials: int | None = 10,
        every_seconds: float | None = None,
        max_per_round: int = 3,
        uncertain_per_round: int | None = None,
        mode: Literal["auto", "local", "queue"] = "auto",
        batch_size: int | None = None,
        dtype: str | None = None,
        deployment: Any = None,
        settings: Any = None,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        auto_calibrate: bool = False,
        min_calibration_rows: int = 5,
        isolate: bool = False,
        measure_fn: MeasureFn | None = None,
        interleave_rounds: int = 0,
        interleave_batch: int = 8,
        adapt: bool | None = None,
        choose_path: bool | None = None,
    ) -> None:
        o = validator_options(
            device, deployment=deployment, every_n_trials=every_n_trials, every_seconds=every_seconds,
            max_per_round=max_per_round, uncertain_per_round=uncertain_per_round, mode=mode, batch_size=batch_size,
            dtype=dtype, min_calibration_rows=min_calibration_rows, interleave_rounds=interleave_rounds,
            interleave_batch=interleave_batch, fake_harness=measure_fn is not None, adapt=adapt,
            choose_path=choose_path)
        self.device: str = o.device
        self.deployment: Deployment = o.deployment
        self.local, self.mode, self.storage = o.local, mode, storage
        self.every_n_trials, self.every_seconds = o.every_n_trials, o.every_seconds
        self.max_per_round, self.uncertain_per_round = o.max_per_round, o.uncertain_per_round
        self.batch_size, self.dtype, self.settings = o.batch_size, o.dtype, settings
        self.lease_s, self.max_attempts = lease_s, max_attempts
        self.auto_calibrate, self.min_calibration_rows = bool(auto_calibrate), o.min_calibration_rows
        self.isolate = bool(isolate)
        self.interleave_rounds, self.interleave_batch = o.interleave_rounds, o.interleave_batch
        self._measure_fn = measure_fn
        self.adapt, self.choose_path = o.adapt, o.choose_path
        #: the path choice's state and the prior path (``None`` without ``choose_path``)
        self.paths: PathRounds | None = (PathRounds(self.device, self.deployment,
                                                    budgets_apply=o.batch_size is None and o.dtype is None)
                                         if self.choose_path else None)
        self._queue: JobQueue | None = None
        self._queue_url: str | None = None
        self._worker: ValidationWorker | None = None
        self._since = 0
        self._last_round = _monotonic()
        self._lock = threading.Lock()
        self.calibration: Calibration | None = None
        self.rounds: list[RoundReport] = []
        #: ``{trial number: why it cannot be validated}`` for every Pareto trial skipped so far
        self.skip_reasons: dict[int, str] = {}
        self.seconds = 0.0

    def __repr__(self) -> str:
        return (f"ParetoValidator(device={self.device!r}, {'local' if self.local else 'queue'}, every_n_trials="
                f"{self.every_n_trials}, every_seconds={self.every_seconds}, max_per_round={self.max_per_round}, "
                f"uncertain_per_round={self.uncertain_per_round}, choose_path={self.choose_path})")

    # ------------------------------------------------------------------ plumbing
    def queue_for(self, study: Any) -> JobQueue:
        """The :class:`JobQueue` of this validator (opened on first use)."""
        url = self.storage or storage_url_of(study)
        if url is None:
            if not self.local:
                raise ValidationError(
                    "the study's storage is not an RDB (in-memory?), so a remote worker could not see its queue; "
                    "pass storage='sqlite:///file.db' or a PostgreSQL URL to ParetoValidator"
                )
            url = "sqlite://"  # private in-memory database: this process measures its own jobs
        if self._queue is None or url != self._queue_url:
            self._queue = JobQueue(url, lease_s=self.lease_s, max_attempts=self.max_attempts)
            self._queue_url = url
            self._worker = None
        return self._queue

    def _local_worker(self, queue: JobQueue) -> ValidationWorker:
        if self._worker is None:
            self._worker = ValidationWorker(queue, self.device, settings=self.settings, isolate=self.isolate,
                                            measure_fn=self._measure_fn, rounds=self.interleave_rounds,
                                            rounds_batch=self.interleave_batch, adapt=self.adapt)
        return self._worker

    # ------------------------------------------------------------------ callback
    def __call__(self, study: Any, trial: Any) -> None:
        """Optuna callback: count the finished trial and run a round when one is due."""
        import optuna

        if trial.state == optuna.trial.TrialState.COMPLETE:
            self._since += 1
        if self.due():
            self.run_round(study)

    def due(self) -> bool:
        """Whether the schedule asks for a round now."""
        if self.every_n_trials is not None and self._since >= self.every_n_trials:
            return True
        if self.every_seconds is not None and self._since > 0 \
                and _monotonic() - self._last_round >= self.every_seconds:
            return True
        return False

    def select(self, study: Any) -> tuple[list[Any], list[int]]:
        """The trials the next round would enqueue (at most ``max_per_round``: the front's in priority order, then
        the uncertain ones, :meth:`uncertain_trials`, shared by :func:`~dippm_nas.validation.round_split`) and the
        Pareto trials skipped because they cannot be validated (why: :attr:`skip_reasons`)."""
        queue = self.queue_for(study)
        known = queue.trial_numbers(study.study_name, self.device)
        front = list(study.best_trials)  # feasible trials only when the study has constraints
        cands, skipped = front_candidates(front, known, self.device, self.local)
        for number, reason in skipped.items():
            self.skip_reasons[number] = reason
            _warn_once(f"norebuild:{study.study_name}:{number}",
                       "Pareto trial %d of study %s cannot be validated: %s", number, study.study_name, reason)
        unsure = self.uncertain_trials(study, skip={t.number for t in front} | set(known)) \
            if self.uncertain_per_round and self.batch_size is None and self.dtype is None else []
        n_front, n_unsure = round_split(len(cands), len(unsure), self.max_per_round, self.uncertain_per_round)
        return cands[:n_front] + unsure[:n_unsure], list(skipped)

    def uncertain_trials(self, study: Any, *, skip: set[int] | frozenset[int] = frozenset()) -> list[Any]:
        """The finished trials (not in ``skip``) whose feasibility is uncertain, in the order a round takes them
        (:func:`~dippm_nas.validation.uncertain_order` by the study's objectives): a budget check rejects them but
        every rejected budget lies within its margin's band around the predicted mean
        (:attr:`~dippm_nas.trial.TrialRecord.band_distance` below 1), they can be rebuilt (forward passes of a
        registered search space; LLM generations are left to the front) and their check was made for this
        validator's device (on a stand-in device, or with a ``batch_size`` / ``dtype`` override, which :meth:`select`
        leaves to the front alone, a measurement does not settle the budget)."""
        return uncertain_trials(study, skip, self.device)

    def _use_adaptation(self, queue: JobQueue, space: str) -> Any:
        """The validation device's adaptable predictor, set to the newest stored adaptation of ``space`` (``None``
        without adaptation)."""
        return use_adaptation(self.device, self.adapt, queue, space, self.deployment)

    def _predicted_for(self, space: str, config: dict[str, Any], spec_dict: dict[str, Any]) -> dict[str, Any]:
        """The prediction for the validation device the measurement is compared with."""
        return predicted_for(self.device, self.deployment, self.adapt, space, config, spec_dict)

    def _enqueue(self, queue: JobQueue, study: str, t: Any) -> tuple[bool, str | None]:
        """Enqueue a chosen trial with the prediction for the validation device it will be compared with (and, with
        ``choose_path``, both paths' predictions): ``(enqueued, why it is skipped)``; not enqueued and no reason when
        another process was first."""
        record = TrialRecord.from_attrs(t.user_attrs)
        if record.generation is not None:
            return enqueue_generation(queue, study, t, record, self.device, self.local)
        assert record.search_space is not None
        spec = job_spec(record, self.batch_size, self.dtype)
        space, config = record.search_space, record.search_space_config
        try:
            network = self._use_adaptation(queue, space)
            predicted = self._predicted_for(space, config, spec)
            if self.paths is not None and network is not None:  # both paths, before the measurement
                predicted["paths"] = self.paths.paths_of(network, space, config, InputSpec.from_dict(spec), record)
        except Exception as e:  # noqa: BLE001 - one odd trial is skipped with its reason, the round goes on
            why = str(e) if isinstance(e, DippmNasError) else f"{type(e).__name__}: {e}"
            _warn_once(f"predict:{study}:{t.number}", "cannot predict trial %d of study %s on %s for validation "
                       "(%s); not enqueued", t.number, study, self.device, why)
            return False, f"its prediction on {self.device} failed ({why})"
        job_id = queue.enqueue(study=study, trial_number=t.number, space=space, config=config, spec=spec,
                               device=self.device, predicted=predicted, priority=uncertainty_of(record))
        return job_id is not None, None

    def run_round(self, study: Any) -> RoundReport:
        """One validation round now, whatever the schedule (see the module docstring)."""
        t0 = time.perf_counter()
        with self._lock:
            self._since = 0
            self._last_round = _monotonic()
            report = RoundReport()
            queue = self.queue_for(study)
            if self.paths is not None:
                self.paths.load(queue, study.study_name)
            chosen, report.skipped = self.select(study)
            front = {t.number for t in study.best_trials}
            for t in chosen:
                enqueued, why = self._enqueue(queue, study.study_name, t)
                if why is not None:
                    report.skipped.append(t.number)
                    self.skip_reasons[t.number] = why
                elif enqueued:
                    report.enqueued.append(t.number)
                    if t.number not in front:  # an uncertain trial (generation trials are the front's)
                        report.uncertain.append(t.number)
            if self.local:
                report.measured = self._local_worker(queue).run(study=study.study_name, idle_timeout_s=0, poll_s=0)
            spaces = [TrialRecord.from_attrs(t.user_attrs).search_space for t in chosen]
            spaces = [sp for sp in spaces if sp is not None]  # generation trials have none
            if spaces:
                ad = getattr(self._use_adaptation(queue, spaces[0]), "adaptation", None)
                if ad is not None:
                    report.adaptation_version, report.adaptation_rows = ad.version, ad.rows
            if self.paths is not None:
                self.paths.after_round(queue, study.study_name)
                report.prediction_path, report.path_scores = self.paths.path, self.paths.state()
            self._update_summary(study, queue)
            report.skip_reasons = {n: self.skip_reasons[n] for n in report.skipped if n in self.skip_reasons}
            report.seconds = time.perf_counter() - t0
            self.rounds.append(report)
            self.seconds += report.seconds
        logger.info("validation round on %s: enqueued trials %s, measured %d here, %.2f s%s", self.device,
                    report.enqueued, report.measured, report.seconds,
                    "" if report.prediction_path is None else f"; prediction path {report.prediction_path}")
        return report

    def _update_summary(self, study: Any, queue: JobQueue) -> ValidationSummary:
        if self.auto_calibrate:
            try:
                self.calibrate(study, apply=True)
            except DippmNasError as e:
                logger.debug("no calibration yet: %s", e)
        s = summarize(queue, study.study_name, self.device,
                      calibration=None if self.calibration is None else self.calibration.to_dict(),
                      prediction_path=self._path_state())
        study.set_user_attr(SUMMARY_ATTR, s.to_dict())
        return s

    # ------------------------------------------------------------------ results
    def finish(self, study: Any, *, timeout_s: float | None = None, poll_s: float = 2.0) -> ValidationSummary:
        """A last round (whatever the schedule), then the summary.

        Args:
            study: the study.
            timeout_s: queue mode only: wait up to this long for remote workers to finish this study's
                jobs (``None``: do not wait).
            poll_s: queue mode: seconds between checks while waiting.
        """
        self.run_round(study)
        queue = self.queue_for(study)
        if not self.local and timeout_s is not None:
            deadline = _monotonic() + timeout_s
            while _monotonic() < deadline:
                c = queue.counts(study=study.study_name, device=self.device)
                if c["queued"] == 0 and c["leased"] == 0:
                    break
                time.sleep(poll_s)
        return self._update_summary(study, queue)

    def records(self, study: Any) -> list[ValidationRecord]:
        """Validation results of ``study`` on the device, oldest first."""
        return self.queue_for(study).results(study=study.study_name, device=self.device)

    def summary(self, study: Any) -> ValidationSummary:
        """The current :class:`ValidationSummary` of ``study`` (not written to the study)."""
        return summarize(self.queue_for(study), study.study_name, self.device,
                         calibration=None if self.calibration is None else self.calibration.to_dict(),
                         prediction_path=self._path_state())

    def _path_state(self) -> dict[str, Any] | None:
        """The path choice for the summary (``None`` without ``choose_path`` or before a scored job)."""
        return None if self.paths is None else self.paths.state()

    def calibrate(self, study: Any, *, apply: bool = True) -> Calibration:
        """Fit the validation device's latency correction from every finished job of the device in the queue.

        On a GPU whose predictor calibrates itself (a checkpoint's, or the analytic prior's), the measurements
        feed its host, GPU and op-class GPU factors (:func:`~dippm_nas.validation.calibrate_predictor`; the
        returned calibration's ``method`` is ``"timeline_factors"``); elsewhere one latency factor.

        Args:
            study: any study of the queue (used to find the queue).
            apply: make :func:`dippm_nas.predict` use it for the device from now on (this process).

        Raises:
            ValidationError: fewer than ``min_calibration_rows`` ``"ok"`` measurements.
        """
        queue = self.queue_for(study)
        jobs = [j for j in queue.jobs(device=self.device, status="done") if j.space != GENERATION_SPACE]
        cal = fit_calibration(jobs, self.device, min_rows=self.min_calibration_rows)
        own = None if self.adapt else calibrate_predictor(jobs, self.device, apply=apply, deployment=self.deployment)
        tf = None if own is None else own.timeline_factors
        if tf is not None:
            cal = replace(cal, method="timeline_factors", timeline=dataclasses.asdict(tf))
            if apply:
                logger.info("calibrated %s latency on %d measurements: host x%.4g, GPU x%.4g, op classes %s",
                            cal.device, tf.n, math.exp(tf.host_log), math.exp(tf.gpu_log),
                            {c: round(f, 4) for c, f in tf.class_factors.items()})
        elif apply and not self.adapt:
            apply_calibration(cal)
            logger.info("calibrated %s latency by x%.4g on %d measurements (MAPE %.1f%% -> %.1f%%, in-sample)",
                        cal.device, cal.latency_scale, cal.n_rows, cal.latency_mape_before_pct,
                        cal.latency_mape_after_pct)
        self.calibration = cal
        return cal
