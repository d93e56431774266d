"""Calibration from validation measurements: one latency factor per device.

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

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from dippm_nas.errors import ValidationError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import BasePredictor, get_predictor, set_predictor
from dippm_nas.validation._queue import Job

__all__ = ["Calibration", "CalibratedPredictor", "CalibrationCheck", "fit_calibration", "apply_calibration",
           "check_calibration", "uncalibrated_latency_ms"]


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
    """

    device: str
    latency_scale: float
    n_rows: int
    latency_mape_before_pct: float
    latency_mape_after_pct: float
    fitted_at: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.latency_scale) or self.latency_scale <= 0:
            raise ValidationError(f"latency_scale must be a finite number > 0, got {self.latency_scale!r}")

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
                       runtime: str = "eager", host: Any = None) -> list[Prediction]:
        s = self.calibration.latency_scale
        out = []
        for p in self.base.predict_graphs(graphs, mig=mig, k_sigma=k_sigma, runtime=runtime, host=host):
            details = dict(p.details)
            details["uncalibrated_latency_ms"] = p.latency_ms
            details["latency_calibration_scale"] = s
            out.append(replace(
                p, latency_ms=p.latency_ms * s,
                latency_ms_std=None if p.latency_ms_std is None else p.latency_ms_std * s,
                latency_source="calibrated", details=details,
            ))
        return out

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
