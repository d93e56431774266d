"""Calibration from validation measurements.

On a GPU whose predictor can calibrate itself (a trained :class:`~dippm_nas.predictor.GnnPredictor`, or the
:class:`~dippm_nas.predictor.AnalyticPredictor` where no checkpoint exists), the measured trials feed that
predictor's few-shot fit (:func:`calibrate_predictor`: host, GPU and op-class GPU factors on the trials'
own timelines, :mod:`dippm_nas.predictor._calibrate`), always from the uncalibrated network and prior, so
refitting never compounds; :attr:`Calibration.method` is then ``"timeline_factors"`` and
:attr:`Calibration.timeline` holds the factors. Elsewhere (a CPU device, a predictor of another kind) one
latency factor per device:

The factor is the geometric mean of ``measured / predicted`` latency over the ``"ok"`` measurements of
the device (the least-squares fit in log space), always against the *uncalibrated* predictions, so
refitting never compounds. :func:`apply_calibration` wraps the device's predictor so later predictions
of that device come out multiplied by it, with ``latency_source="calibrated"`` and the uncalibrated
figure kept in ``details["uncalibrated_latency_ms"]``. Energy and memory are left as they are (a CPU
has no energy counter here, and a process's RSS delta is not the predicted peak memory); MIG slice
latencies in ``Prediction.mig`` stay uncalibrated.

Only the measured device is calibrated: host-CPU measurements say nothing about an A100.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from dippm_nas.capture import assemble
from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError, ValidationError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import BasePredictor, get_predictor, set_predictor
from dippm_nas.spec import InputSpec
from dippm_nas.validation._queue import Job

__all__ = ["Calibration", "CalibratedPredictor", "CalibrationCheck", "fit_calibration", "apply_calibration",
           "calibrate_predictor", "check_calibration", "uncalibrated_latency_ms", "CALIBRATION_METHODS"]

logger = logging.getLogger(__name__)

#: How a validation :class:`Calibration` corrects the device: one latency factor, or the predictor's own
#: host, GPU and op-class GPU factors.
CALIBRATION_METHODS: tuple[str, ...] = ("scale", "timeline_factors")


def uncalibrated_latency_ms(predicted: dict[str, Any]) -> float | None:
    """The uncalibrated predicted latency of a job's ``predicted`` dict, ms."""
    v = predicted.get("latency_ms_uncalibrated", predicted.get("latency_ms"))
    return None if v is None else float(v)


@dataclass(frozen=True)
class Calibration:
    """A fitted latency correction of one device.

    Attributes:
        device: catalogue id it applies to.
        latency_scale: multiply predicted latency by this (geometric mean of measured / predicted).
        n_rows: measurements it was fitted on.
        latency_mape_before_pct: mean absolute percentage error of the uncalibrated predictions on
            those rows, percent.
        latency_mape_after_pct: the same after scaling (in-sample: the rows it was fitted on), percent.
        fitted_at: Unix seconds.
        method: what corrects the device's predictions (:data:`CALIBRATION_METHODS`): ``"scale"`` (the
            factor above, through a :class:`CalibratedPredictor`) or ``"timeline_factors"`` (the device's
            predictor calibrated itself, :func:`calibrate_predictor`; ``latency_scale`` is then for the record).
        timeline: with ``"timeline_factors"``, the predictor's fitted factors (the fields of
            :class:`~dippm_nas.predictor.TimelineFactors`: ``host_log``, ``gpu_log``, ``class_log``,
            ``class_kept``...), else ``None``.
    """

    device: str
    latency_scale: float
    n_rows: int
    latency_mape_before_pct: float
    latency_mape_after_pct: float
    fitted_at: float
    method: str = "scale"
    timeline: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.latency_scale) or self.latency_scale <= 0:
            raise ValidationError(f"latency_scale must be a finite number > 0, got {self.latency_scale!r}")
        if self.method not in CALIBRATION_METHODS:
            raise ValidationError(f"method must be one of {CALIBRATION_METHODS}, got {self.method!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pairs(jobs: Sequence[Job], device: str) -> list[tuple[float, float]]:
    out = []
    for j in jobs:
        if j.device != device or j.status != "done" or not j.result or j.result.get("status") != "ok":
            continue
        pred = uncalibrated_latency_ms(j.predicted)
        meas = j.result.get("latency_ms")
        if pred is not None and meas is not None and pred > 0 and meas > 0:
            out.append((pred, float(meas)))
    return out


def fit_calibration(jobs: Sequence[Job], device: str, *, min_rows: int = 3) -> Calibration:
    """Fit the latency factor of ``device`` from finished validation jobs.

    Args:
        jobs: jobs of the queue (others than ``device``'s, unfinished or not ``"ok"`` are ignored).
        device: catalogue id.
        min_rows: fewest usable measurements; fewer is an error.

    Raises:
        ValidationError: fewer than ``min_rows`` usable measurements.
    """
    pairs = _pairs(jobs, device)
    if len(pairs) < min_rows:
        raise ValidationError(f"calibrating {device!r} needs at least {min_rows} 'ok' measurements, got {len(pairs)}")
    logs = [math.log(m / p) for p, m in pairs]
    scale = math.exp(statistics.fmean(logs))
    before = statistics.fmean(abs(p - m) / m for p, m in pairs) * 100.0
    after = statistics.fmean(abs(p * scale - m) / m for p, m in pairs) * 100.0
    return Calibration(device=device, latency_scale=scale, n_rows=len(pairs), latency_mape_before_pct=before,
                       latency_mape_after_pct=after, fitted_at=time.time())


def calibrate_predictor(jobs: Sequence[Job], device: str, *, apply: bool = True,
                        deployment: Any = None) -> Any | None:
    """Feed the ``"ok"`` measurements of ``device`` to its predictor's own few-shot fit (GPU only).

    The trials' graphs are rebuilt from their search space, config and measured input spec
    (:func:`dippm_nas.capture.assemble`, from the conversion cache) and paired with the measured latency;
    :meth:`GnnPredictor.calibrate` / :meth:`AnalyticPredictor.calibrate` fit host, GPU and op-class GPU
    factors (not persisted). With ``apply`` the calibrated predictor answers :func:`dippm_nas.predict` for
    the device from now on (replacing a :class:`CalibratedPredictor`); without it the predictor keeps its
    earlier calibration. ``deployment`` (a :class:`~dippm_nas.Deployment`): how the measured passes ran.

    Returns:
        The predictor's :class:`~dippm_nas.predictor.Calibration`, or ``None`` where this path does not apply
        (a CPU device, a predictor that cannot calibrate itself, fewer than two usable measurements, or trials
        whose graphs cannot be rebuilt), with the reason logged.
    """
    if resolve_device(device).kind != "gpu":
        return None
    current = get_predictor(device)
    base = current.base if isinstance(current, CalibratedPredictor) else current
    if not callable(getattr(base, "calibrate", None)):
        logger.info("the predictor of %s (%s) cannot calibrate itself: one latency factor instead",
                    device, type(base).__name__)
        return None
    pairs: list[tuple[OperatorGraph, dict[str, float]]] = []
    for j in jobs:
        if j.device != device or j.status != "done" or not j.result or j.result.get("status") != "ok":
            continue
        meas = j.result.get("latency_ms")
        if meas is None or not float(meas) > 0:
            continue
        try:
            graph = assemble(j.space, j.config, InputSpec.from_dict(j.spec))
        except DippmNasError as e:
            logger.info("cannot rebuild trial %d of %s for calibration (%s): one latency factor instead",
                        j.trial_number, j.study, e)
            return None
        pairs.append((graph, {"latency_ms": float(meas)}))
    if len(pairs) < 2:
        return None
    before = getattr(base, "calibration", None)
    cal = base.calibrate(pairs, persist=False, **({} if deployment is None else {"deployment": deployment}))
    if cal is None:
        return None
    if apply:
        set_predictor(device, base)
    else:
        base.calibration = before
        cache = getattr(base, "_pred_cache", None)
        if cache is not None:
            cache.clear()
    return cal


@dataclass(frozen=True)
class CalibrationCheck:
    """How much a calibration helped, measured on jobs it was not fitted on.

    A job predicted while a calibration was applied (``predicted["latency_source"] == "calibrated"``) was
    predicted before it was measured, so comparing its calibrated and its uncalibrated prediction
    (``predicted["latency_ms_uncalibrated"]``) with its measurement is an out-of-sample check of the
    calibration. Jobs predicted before any calibration are summarised apart.

    Attributes:
        held_out: ``"ok"`` jobs predicted with a calibration applied.
        latency_mape_before_pct, latency_mape_after_pct: their mean absolute percentage error of latency
            with the uncalibrated and with the calibrated prediction, percent (``None`` without such jobs).
        latency_median_ape_before_pct, latency_median_ape_after_pct: the same, median.
        uncalibrated: ``"ok"`` jobs predicted without a calibration.
        uncalibrated_latency_mape_pct: their latency MAPE, percent.
    """

    held_out: int
    latency_mape_before_pct: float | None
    latency_mape_after_pct: float | None
    latency_median_ape_before_pct: float | None
    latency_median_ape_after_pct: float | None
    uncalibrated: int
    uncalibrated_latency_mape_pct: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ape(pairs: Sequence[tuple[float, float]]) -> list[float]:
    return [100.0 * abs(p - m) / m for p, m in pairs]


def check_calibration(jobs: Sequence[Job]) -> CalibrationCheck:
    """The :class:`CalibrationCheck` of finished validation jobs (of one study and device, usually
    ``queue.jobs(study=..., device=..., status="done")``); jobs not measured ``"ok"`` are ignored."""
    held: list[tuple[float, float, float]] = []
    first: list[tuple[float, float]] = []
    for j in jobs:
        r = j.result or {}
        m, p = r.get("latency_ms"), j.predicted.get("latency_ms")
        raw = uncalibrated_latency_ms(j.predicted)
        if r.get("status") != "ok" or not m or not p or not raw or m <= 0:
            continue
        if j.predicted.get("latency_source") == "calibrated":
            held.append((float(raw), float(p), float(m)))
        else:
            first.append((float(raw), float(m)))
    before = _ape([(raw, m) for raw, _, m in held])
    after = _ape([(p, m) for _, p, m in held])
    unc = _ape(first)
    return CalibrationCheck(
        held_out=len(held),
        latency_mape_before_pct=statistics.fmean(before) if before else None,
        latency_mape_after_pct=statistics.fmean(after) if after else None,
        latency_median_ape_before_pct=statistics.median(before) if before else None,
        latency_median_ape_after_pct=statistics.median(after) if after else None,
        uncalibrated=len(first),
        uncalibrated_latency_mape_pct=statistics.fmean(unc) if unc else None,
    )


class CalibratedPredictor(BasePredictor):
    """Another predictor's answers with the latency multiplied by a :class:`Calibration`'s factor.

    Args:
        base: the uncalibrated predictor of the device.
        calibration: the fitted factor (its device must be ``base.device``).
    """

    def __init__(self, base: BasePredictor, calibration: Calibration) -> None:
        if isinstance(base, CalibratedPredictor):
            base = base.base
        if calibration.device != base.device:
            raise ValidationError(f"a calibration of {calibration.device!r} cannot correct the predictor of "
                                  f"{base.device!r}")
        self.base = base
        self.calibration = calibration
        self.device = base.device

    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str | None = None, host: Any = None, deployment: Any = None) -> list[Prediction]:
        s = self.calibration.latency_scale
        out = []
        # a predictor written before deployments takes no deployment keyword: pass it only when given
        extra = {} if deployment is None else {"deployment": deployment}
        for p in self.base.predict_graphs(graphs, mig=mig, k_sigma=k_sigma, runtime=runtime, host=host, **extra):
            details = dict(p.details)
            details["uncalibrated_latency_ms"] = p.latency_ms
            details["latency_calibration_scale"] = s
            out.append(replace(
                p, latency_ms=p.latency_ms * s,
                latency_ms_std=None if p.latency_ms_std is None else p.latency_ms_std * s,
                latency_source="calibrated", details=details,
            ))
        return out

    def calibrate(self, measurements: Sequence[Any], **kwargs: Any) -> Any:
        """The base predictor's :meth:`~dippm_nas.predictor.BasePredictor.calibrate` (this latency scale stays on
        top of it)."""
        return self.base.calibrate(measurements, **kwargs)

    def adapt(self, measurements: Sequence[Any], **kwargs: Any) -> Any:
        """The base predictor's :meth:`~dippm_nas.predictor.BasePredictor.adapt` (this latency scale stays on top
        of it)."""
        return self.base.adapt(measurements, **kwargs)

    def __repr__(self) -> str:
        return f"CalibratedPredictor({self.base!r}, latency_scale={self.calibration.latency_scale:.4g})"


def apply_calibration(calibration: Calibration) -> CalibratedPredictor:
    """Make :func:`dippm_nas.predict` answer ``calibration.device`` through a :class:`CalibratedPredictor`.

    Replaces an earlier calibration of the device (never stacks). ``set_predictor(device, None)``
    undoes it.
    """
    current = get_predictor(calibration.device)
    wrapped = CalibratedPredictor(current, calibration)
    set_predictor(calibration.device, wrapped)
    return wrapped
