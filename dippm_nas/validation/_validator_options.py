"""The checked arguments of :class:`~dippm_nas.validation.ParetoValidator`: schedule, round size, where it measures,
what it measures, and whether it adapts and chooses the prediction path.

:func:`validator_options` checks them in the order the validator's docstring lists its errors and returns a
:class:`ValidatorOptions`; the validator keeps each as the attribute of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dippm_nas._numbers import as_int, as_real
from dippm_nas.deployment import Deployment
from dippm_nas.devices import resolve_device
from dippm_nas.errors import ValidationError
from dippm_nas.spec import COMPUTE_DTYPES
from dippm_nas.validation._adapt import adaptable_predictor
from dippm_nas.validation._uncertain import default_uncertain_per_round, round_split
from dippm_nas.validation._worker import check_rounds, device_is_here

__all__ = ["MODES", "ValidatorOptions", "validator_options"]

#: Where validation runs: ``"auto"`` (here when the device is here, else the queue), ``"local"``, ``"queue"``.
MODES: tuple[str, ...] = ("auto", "local", "queue")


@dataclass(frozen=True)
class ValidatorOptions:
    """A validator's checked arguments (those that need a check; see :class:`~dippm_nas.validation.ParetoValidator`).

    Attributes:
        device: the validation device's catalogue id.
        deployment: the validation deployment.
        local: whether this process measures the jobs (``mode="local"``, or ``"auto"`` with the device here).
    """

    device: str
    deployment: Deployment
    every_n_trials: int | None
    every_seconds: float | None
    max_per_round: int
    uncertain_per_round: int
    local: bool
    batch_size: int | None
    dtype: str | None
    min_calibration_rows: int
    interleave_rounds: int
    interleave_batch: int
    adapt: bool
    choose_path: bool


def _schedule(every_n_trials: Any, every_seconds: Any, max_per_round: Any,
              uncertain_per_round: Any) -> tuple[int | None, float | None, int, int]:
    """When rounds run and how many trials each takes: ``(every_n_trials, every_seconds, max_per_round,
    uncertain_per_round)``, checked."""
    if every_n_trials is None and every_seconds is None:
        raise ValidationError("give every_n_trials or every_seconds (or both): otherwise no round would ever run")
    if every_n_trials is not None:
        every_n_trials = as_int(every_n_trials, "every_n_trials", low=1, error=ValidationError, or_none=True)
    if every_seconds is not None:
        every_seconds = as_real(every_seconds, "every_seconds", low=0, low_inclusive=False,
                                error=ValidationError, or_none=True)
    max_per_round = as_int(max_per_round, "max_per_round", low=1, error=ValidationError)
    if uncertain_per_round is None:
        uncertain_per_round = default_uncertain_per_round(max_per_round)
    uncertain_per_round = as_int(uncertain_per_round, "uncertain_per_round", low=0, error=ValidationError)
    round_split(0, 0, max_per_round, uncertain_per_round)  # refuses more than max_per_round, naming both
    return every_n_trials, None if every_seconds is None else float(every_seconds), max_per_round, uncertain_per_round


def _adapt_and_path(device: str, adapt: Any, choose_path: Any, fake_harness: bool) -> tuple[bool, bool]:
    """``(adapt, choose_path)``: ``None`` resolved (adapt: on for real measurements of a device whose predictor has a
    network; choose_path: as adapt), ``choose_path=True`` without adaptation refused."""
    if adapt is None:  # real measurements of a device whose predictor has a network teach it
        adapt = not fake_harness and adaptable_predictor(device) is not None
    adapt = bool(adapt)
    if choose_path is not None and not isinstance(choose_path, bool):
        raise ValidationError(f"choose_path must be True, False or None, got {choose_path!r}")
    if choose_path and not adapt:
        raise ValidationError("choose_path=True needs adapt=True: the choice is between the adapted network and "
                              "the prior, and without adaptation (the device's predictor has no network, or "
                              "adapt=False) there is no network path to choose; pass choose_path=None or False")
    return adapt, adapt if choose_path is None else choose_path


def validator_options(device: str, *, deployment: Any, every_n_trials: Any, every_seconds: Any, max_per_round: Any,
                      uncertain_per_round: Any, mode: Any, batch_size: Any, dtype: Any, min_calibration_rows: Any,
                      interleave_rounds: Any, interleave_batch: Any, fake_harness: bool, adapt: Any,
                      choose_path: Any) -> ValidatorOptions:
    """The checked arguments of a :class:`~dippm_nas.validation.ParetoValidator` (``fake_harness``: a
    ``measure_fn`` replaces the harness, so the device counts as here and ``adapt=None`` is off).

    Raises:
        ValidationError: invalid schedule, mode or counts; ``mode="local"`` for a device not on this machine.
        DeploymentError: a bad deployment.
    """
    dev = resolve_device(device).id
    dep = Deployment.coerce(deployment)
    every_n_trials, every_seconds, max_per_round, uncertain_per_round = _schedule(
        every_n_trials, every_seconds, max_per_round, uncertain_per_round)
    if mode not in MODES:
        raise ValidationError(f"mode must be one of {MODES}, got {mode!r}")
    if batch_size is not None:
        batch_size = as_int(batch_size, "batch_size", low=1, error=ValidationError, or_none=True)
    if dtype is not None and dtype not in COMPUTE_DTYPES:
        raise ValidationError(f"dtype must be one of {COMPUTE_DTYPES} or None, got {dtype!r}")
    min_calibration_rows = as_int(min_calibration_rows, "min_calibration_rows", low=1, error=ValidationError)
    interleave_rounds, interleave_batch = check_rounds(resolve_device(dev), interleave_rounds, interleave_batch,
                                                       names=("interleave_rounds", "interleave_batch"))
    here = fake_harness or device_is_here(dev)
    if mode == "local" and not here:
        raise ValidationError(f"mode='local' needs device {dev!r} on this machine; use mode='queue' "
                              f"and run `dippm-nas validate-worker --device {dev}` where it is")
    adapt, choose_path = _adapt_and_path(dev, adapt, choose_path, fake_harness)
    return ValidatorOptions(
        device=dev, deployment=dep, every_n_trials=every_n_trials, every_seconds=every_seconds,
        max_per_round=max_per_round, uncertain_per_round=uncertain_per_round,
        local=mode == "local" or (mode == "auto" and here), batch_size=batch_size, dtype=dtype,
        min_calibration_rows=min_calibration_rows, interleave_rounds=interleave_rounds,
        interleave_batch=interleave_batch, adapt=adapt, choose_path=choose_path)
