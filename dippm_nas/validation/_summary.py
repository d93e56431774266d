"""Summary of a study's validation: job counts and prediction errors, as a JSON-able dataclass."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dippm_nas.validation._queue import JobQueue, ValidationRecord

__all__ = ["ValidationSummary", "summarize"]


def _mape(values: Sequence[float | None]) -> float | None:
    vals = [abs(v) for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


@dataclass(frozen=True)
class ValidationSummary:
    """How well the predictions of one device held up on the measured Pareto candidates of a study.

    Attributes:
        study: study name.
        device: catalogue id of the measured device.
        jobs: ``{status: count}`` of the study's jobs on the device.
        measured: measurements recorded.
        ok, does_not_fit, timeouts, errors: measurements by status (``"oom"`` counts as "does not fit").
        latency_mape_pct: mean absolute percentage error of predicted latency over ``"ok"`` rows, percent
            (``None`` without such rows); the same for energy and memory where both sides exist.
        latency_median_ape_pct: median absolute percentage error of latency, percent.
        latency_measured_over_predicted: geometric mean of measured / predicted latency (1 is unbiased).
        calibration: the last :class:`~dippm_nas.validation.Calibration` applied, as a dict, or ``None``.
        updated_at: Unix seconds.
        prediction_path: with ``ParetoValidator(choose_path=...)``, the path choice (``path``: ``"network"`` or
            ``"prior"``, the ``yardstick``, each path's ``score`` ``[right, counted]``, ``rounds``,
            ``rounds_network``, ``network_share``), else ``None``.
    """

    study: str
    device: str
    jobs: dict[str, int]
    measured: int
    ok: int
    does_not_fit: int
    timeouts: int
    errors: int
    latency_mape_pct: float | None
    latency_median_ape_pct: float | None
    latency_measured_over_predicted: float | None
    energy_mape_pct: float | None
    memory_mape_pct: float | None
    calibration: dict[str, Any] | None
    updated_at: float
    prediction_path: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(queue: JobQueue, study: str, device: str, *, calibration: dict[str, Any] | None = None,
              records: Sequence[ValidationRecord] | None = None,
              prediction_path: dict[str, Any] | None = None) -> ValidationSummary:
    """The :class:`ValidationSummary` of ``study`` on ``device`` from the queue's tables."""
    recs = list(records) if records is not None else queue.results(study=study, device=device)
    ok = [r for r in recs if r.status == "ok"]
    lat = [r.latency_error_pct for r in ok if r.latency_error_pct is not None]
    ratios = [r.measured_latency_ms / r.predicted_latency_ms for r in ok
              if r.measured_latency_ms and r.predicted_latency_ms]
    return ValidationSummary(
        study=study, device=device, jobs=queue.counts(study=study, device=device), measured=len(recs),
        ok=len(ok), does_not_fit=sum(r.status == "oom" for r in recs),
        timeouts=sum(r.status == "timeout" for r in recs), errors=sum(r.status == "error" for r in recs),
        latency_mape_pct=_mape(lat),
        latency_median_ape_pct=statistics.median(abs(v) for v in lat) if lat else None,
        latency_measured_over_predicted=math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None,
        energy_mape_pct=_mape([r.energy_error_pct for r in ok]),
        memory_mape_pct=_mape([r.memory_error_pct for r in ok]),
        calibration=calibration, updated_at=time.time(), prediction_path=prediction_path,
    )
