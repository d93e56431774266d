"""Serving engines corrected from a few measured runs: :class:`MeasuredServingRun`, :func:`adapt_engine`,
:func:`adapted_engine`.

A serving engine's step costs (host time per step and per sequence, the decode kernel-time multiplier:
:class:`~dippm_nas.llm.ServingEngine`) move with its version and the host that drives the GPU. A handful of measured
runs of one (device, engine, version) refit those three constants, starting from the shipped engine: every constant
enters a prediction linearly (host time adds to each step, the multiplier scales the step's kernel time), so each
run's prediction at the shipped constants and its change per unit of each constant (four predictions per run) give
the bounded least-squares fit of the relative errors of the measured end-to-end times (time per output token and
time to first token, when given, enter as ``e2e``-like rows of their own). With fewer runs than constants the fit
moves only what the runs determine (bounded, minimum-norm change from the shipped constants).

A guard keeps only the part of the change the runs confirm: the fitted change is shrunk towards the starting
constants by a factor of ``_SHRINK_GRID`` (0 is no correction), the one whose held-out error is least, a factor
above 0 only when it beats no correction. The held-out error is the worse of leave-one-run-out and, with two prompt
lengths or more, leave-one-prompt-length-out (each held-out part's prediction from the fit on the rest). σ is that
RMS held-out log error at the chosen factor (the starting engine's σ when there is one run, whose fit is kept). The
factor is then shrunk by the evidence against the starting engine (James-Stein): by ``1 - σ0² / MS``, ``σ0`` the
starting engine's ``sigma_log`` (the error it expects of any one model) and ``MS`` the runs' mean squared log error
at the starting constants, 0 when the runs are off by no more than σ0 (one model's own error, which moving the
engine would spread to every other model). Runs
held out at a σ over ``_MISREAD_SIGMAS`` times the starting engine's are ones the step model misreads (a workload or
model quirk no step constant describes, e.g. vLLM's Mistral-7B rows on an H100 at 1024-2048 tokens): they correct
nothing, with a warning.

Adaptations are JSON files, one per ``(device, engine, version)``, under ``<cache dir>/engine_adaptations``
(``storage=`` another directory; :mod:`dippm_nas.llm._engine_store`): the constants, σ and the runs they were fitted
on. :func:`~dippm_nas.llm.adapted_engine` reads one back as a :class:`~dippm_nas.llm.ServingEngine`, and
:func:`~dippm_nas.llm.predict_generation` uses it by itself when its deployment names that engine's version
(``Deployment(versions={"vllm": "0.6.3"})``) on that device.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dippm_nas.errors import InvalidValueError
from dippm_nas.llm._architectures import decoder_config
from dippm_nas.llm._engine_store import ADAPTED_CONSTANTS, EngineAdaptation, check_adaptation_key, save_adaptation
from dippm_nas.llm._engines import ServingEngine, serving_engine
from dippm_nas.llm._predict import predict_generation
from dippm_nas.llm._workload import LLMWorkload

__all__ = ["MeasuredServingRun", "adapt_engine"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasuredServingRun:
    """One measured serving run.

    Attributes:
        model: what :func:`~dippm_nas.llm.decoder_config` reads (a name of ``ARCHITECTURES``, a config dict...).
        prompt_len, output_len, batch_size: the workload.
        e2e_ms: measured time to generate the whole batch, ms.
        ttft_ms, tpot_ms: measured time to first token and per output token, ms (optional).
        tensor_parallel: GPUs of the node.
        dtype: the weights' dtype (``None``: the config's).
        identical_sequences: every sequence of the batch is the same prompt (:class:`~dippm_nas.llm.LLMWorkload`).
    """

    model: Any
    prompt_len: int
    output_len: int
    batch_size: int
    e2e_ms: float
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tensor_parallel: int = 1
    dtype: str | None = None
    identical_sequences: bool = False

    def __post_init__(self) -> None:
        LLMWorkload(self.prompt_len, self.output_len, self.batch_size)  # the workload's own checks
        for name in ("e2e_ms", "ttft_ms", "tpot_ms"):
            v = getattr(self, name)
            if v is None and name != "e2e_ms":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidValueError(f"MeasuredServingRun.{name} must be a finite number > 0 (ms), got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model"] = self.model if isinstance(self.model, str) else decoder_config(self.model).to_dict()
        return d


def _rows(run: MeasuredServingRun, device: str, eng: ServingEngine) -> list[tuple[float, float]]:
    """(measured, predicted) of each figure a run measured."""
    wl = LLMWorkload(run.prompt_len, run.output_len, run.batch_size, identical_sequences=run.identical_sequences)
    p = predict_generation(run.model, wl, device, runtime="serving", engine=eng, mig=False, dtype=run.dtype,
                           tensor_parallel=run.tensor_parallel)
    out = [(run.e2e_ms, p.e2e_ms)]
    if run.tpot_ms is not None:
        out.append((run.tpot_ms, p.decode_ms_per_token))
    if run.ttft_ms is not None:
        out.append((run.ttft_ms, p.prefill_ms))
    return out


def _design(runs: Sequence[MeasuredServingRun], device: str, base: ServingEngine) -> tuple[np.ndarray, ...]:
    """Measured figures, predictions at ``base``, their change per unit of each constant, and the run of each row."""
    y, p0, sens, owner = [], [], [], []
    for i, r in enumerate(runs):
        at_base = _rows(r, device, base)
        probes = [_rows(r, device, dataclasses.replace(base, **{n: getattr(base, n) + step}))
                  for n, step, _, _ in ADAPTED_CONSTANTS]
        for j, (meas, pred) in enumerate(at_base):
            y.append(meas)
            p0.append(pred)
            sens.append([(probes[k][j][1] - pred) / ADAPTED_CONSTANTS[k][1] for k in range(len(ADAPTED_CONSTANTS))])
            owner.append(i)
    return np.array(y), np.array(p0), np.array(sens), np.array(owner)


def _fit(y: np.ndarray, p0: np.ndarray, sens: np.ndarray, base: ServingEngine,
         free: tuple[int, ...]) -> np.ndarray:
    """The bounded least-squares change of the constants numbered ``free`` (the others stay at ``base``)."""
    from scipy.optimize import lsq_linear

    d = np.zeros(len(ADAPTED_CONSTANTS))
    if not free:
        return d
    idx = list(free)
    x0 = np.array([getattr(base, n) for n, _, _, _ in ADAPTED_CONSTANTS])[idx]
    lo = np.array([ADAPTED_CONSTANTS[k][2] for k in idx]) - x0
    hi = np.array([ADAPTED_CONSTANTS[k][3] for k in idx]) - x0
    scale = np.array([ADAPTED_CONSTANTS[k][1] for k in idx])  # fit in probe units: comparable columns
    a = sens[:, idx] * scale / y[:, None]
    b = (y - p0) / y
    res = lsq_linear(a, b, bounds=(lo / scale, np.maximum(hi, lo + 1e-12) / scale), lsmr_tol="auto")
    d[idx] = res.x * scale
    return d


#: Fractions of the fitted change of the constants the guard tries (0: the starting engine, no correction).
_SHRINK_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The sets of constants (numbers in :data:`ADAPTED_CONSTANTS`) the guard lets the runs move, fewest first.
_FREE_SETS: tuple[tuple[int, ...], ...] = tuple(
    c for n in range(1, len(ADAPTED_CONSTANTS) + 1) for c in itertools.combinations(range(len(ADAPTED_CONSTANTS)), n))


def _folds(runs: Sequence[MeasuredServingRun]) -> list[list[np.ndarray]]:
    """The held-out schemes: each run alone and, with two prompt lengths or more, each prompt length's runs."""
    schemes = [[np.array([i]) for i in range(len(runs))]]
    lengths = sorted({r.prompt_len for r in runs})
    if len(lengths) >= 2:
        schemes.append([np.array([i for i, r in enumerate(runs) if r.prompt_len == n]) for n in lengths])
    return schemes


def _heldout(y: np.ndarray, p0: np.ndarray, preds: list[np.ndarray]) -> tuple[float, float]:
    """The worse held-out RMS log error and MAPE over the schemes' predictions."""
    preds = [np.maximum(p, 1e-9 * y) for p in preds]
    return (max(float(np.sqrt(np.mean(np.log(p / y) ** 2))) for p in preds),
            max(float(np.mean(np.abs(p / y - 1)) * 100) for p in preds))


def _guarded(y: np.ndarray, p0: np.ndarray, sens: np.ndarray, owner: np.ndarray, base: ServingEngine,
             runs: Sequence[MeasuredServingRun]) -> tuple[tuple[int, ...], float, float, float]:
    """The constants to move and the shrink of their fitted change (``_SHRINK_GRID``) whose held-out error
    (:func:`_heldout` over :func:`_folds`) is least; a correction is kept only when it beats no correction.
    Returns the constants' numbers, the shrink, the held-out RMS log error and MAPE."""
    schemes = _folds(runs)
    sig0, mape0 = _heldout(y, p0, [p0 for _ in schemes])
    best: tuple[tuple[int, ...], float, float, float] = ((), 0.0, sig0, mape0)
    for free in _FREE_SETS:
        held_change = []  # per scheme: each row's held-out change of its prediction at the full fitted change
        for scheme in schemes:
            change = np.zeros(len(y))
            for runs_out in scheme:
                test = np.isin(owner, runs_out)
                change[test] = sens[test] @ _fit(y[~test], p0[~test], sens[~test], base, free)
            held_change.append(change)
        for s in _SHRINK_GRID[1:]:
            sig, mape = _heldout(y, p0, [p0 + s * c for c in held_change])
            if sig < best[2] - 1e-12:
                best = (free, s, sig, mape)
    return best


#: A correction whose held-out σ is over this many times the starting engine's σ is not applied.
_MISREAD_SIGMAS = 3.0


def adapt_engine(runs: Sequence[MeasuredServingRun], *, device: str, engine: str, version: str,
                 persist: bool = True, storage: str | Path | None = None,
                 base: ServingEngine | None = None) -> EngineAdaptation:
    """Refit ``engine``'s step costs on measured ``runs`` of ``device`` (module docstring) and store them for
    ``(device, engine, version)``.

    ``base`` is the engine the fit starts from (default the shipped one); its memory rules are kept. The fitted
    change is shrunk towards ``base`` by the held-out evidence (``_SHRINK_GRID``, module docstring): a
    correction the held-out runs do not confirm is not applied, nor one whose held-out σ is over
    ``_MISREAD_SIGMAS`` times ``base.sigma_log`` (runs the step model misreads; a warning says so).

    Raises:
        InvalidValueError: no runs, an unknown engine, an empty device or version, a run breaking its rules.
        AdaptationError: the adaptation cannot be written.
    """
    check_adaptation_key(device, engine, version)
    runs = list(runs)
    if not runs or not all(isinstance(r, MeasuredServingRun) for r in runs):
        raise InvalidValueError("runs must be a non-empty sequence of MeasuredServingRun")
    if base is None:
        base = serving_engine(engine)
    elif not isinstance(base, ServingEngine) or base.name != engine:
        raise InvalidValueError(f"base must be a ServingEngine named {engine!r}, got {base!r}")
    y, p0, sens, owner = _design(runs, device, base)
    if len(runs) > 1:
        free, shrink, sigma, mape = _guarded(y, p0, sens, owner, base, runs)
    else:
        free, shrink = tuple(range(len(ADAPTED_CONSTANTS))), 1.0
        sigma, mape = (base.sigma_log if base.sigma_log is not None else 0.0), math.nan
    if shrink > 0 and base.sigma_log is not None and sigma > _MISREAD_SIGMAS * base.sigma_log:
        logger.warning("adapt_engine: %d runs of %s, %s %s held out at σ %.3f (log), over %g× the starting engine's "
                       "σ %.3f: the step model misreads these runs, so they correct no constant", len(runs), device,
                       engine, version, sigma, _MISREAD_SIGMAS, base.sigma_log)
        shrink, (sigma, mape) = 0.0, _heldout(y, p0, [p0])
    if shrink > 0 and base.sigma_log is not None:
        # the evidence against the starting engine beyond the error its σ expects of any one model (James-Stein)
        ms = float(np.mean(np.log(p0 / y) ** 2))
        shrink *= max(0.0, 1.0 - base.sigma_log ** 2 / ms) if ms > 0 else 0.0
    d = shrink * _fit(y, p0, sens, base, free)
    x = {n: getattr(base, n) + float(d[k]) for k, (n, _, _, _) in enumerate(ADAPTED_CONSTANTS)}
    ad = EngineAdaptation(device=device, engine=engine, version=version, constants=x, sigma_log=sigma,
                          runs=len(runs), heldout_mape_pct=mape, shrink=shrink)
    if persist:
        ad = dataclasses.replace(ad, path=str(save_adaptation(ad, runs, storage)))
    return ad
