"""Serving engines corrected from a few measured runs: :class:`MeasuredServingRun`, :func:`adapt_engine`,
:func:`adapted_engine`.

A serving engine's step costs (host time per step and per sequence, the decode kernel-time multiplier:
:class:`~dippm_nas.llm.ServingEngine`) move with its version and the host that drives the GPU. A handful of measured
runs of one (device, engine, version) refit those three constants, starting from the shipped engine: every constant
enters a prediction linearly (host time adds to each step, the multiplier scales the step's kernel time), so each
run's prediction at the shipped constants and its change per unit of each constant (four predictions per run) give
the bounded least-squares fit of the relative errors of the measured end-to-end times (time per output token and
time to first token, when given, enter as ``e2e``-like rows of their own). With fewer runs than constants the fit
moves only what the runs determine (bounded, minimum-norm change from the shipped constants). σ is the RMS
leave-one-run-out log error (the shipped engine's σ when there is one run).

Adaptations are JSON files, one per ``(device, engine, version)``, under ``<cache dir>/engine_adaptations``
(``storage=`` another directory; :mod:`dippm_nas.llm._engine_store`): the constants, σ and the runs they were fitted
on. :func:`~dippm_nas.llm.adapted_engine` reads one back as a :class:`~dippm_nas.llm.ServingEngine`, and
:func:`~dippm_nas.llm.predict_generation` uses it by itself when its deployment names that engine's version
(``Deployment(versions={"vllm": "0.6.3"})``) on that device.
"""

from __future__ import annotations

import dataclasses
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


def _fit(y: np.ndarray, p0: np.ndarray, sens: np.ndarray, base: ServingEngine) -> dict[str, float]:
    from scipy.optimize import lsq_linear

    x0 = np.array([getattr(base, n) for n, _, _, _ in ADAPTED_CONSTANTS])
    lo = np.array([c[2] for c in ADAPTED_CONSTANTS]) - x0
    hi = np.array([c[3] for c in ADAPTED_CONSTANTS]) - x0
    scale = np.array([c[1] for c in ADAPTED_CONSTANTS])  # fit in probe units: comparable columns
    a = sens * scale / y[:, None]
    b = (y - p0) / y
    res = lsq_linear(a, b, bounds=(lo / scale, hi / scale), lsmr_tol="auto")
    return {n: float(v) for (n, _, _, _), v in zip(ADAPTED_CONSTANTS, x0 + res.x * scale)}


def adapt_engine(runs: Sequence[MeasuredServingRun], *, device: str, engine: str, version: str,
                 persist: bool = True, storage: str | Path | None = None,
                 base: ServingEngine | None = None) -> EngineAdaptation:
    """Refit ``engine``'s step costs on measured ``runs`` of ``device`` (module docstring) and store them for
    ``(device, engine, version)``.

    ``base`` is the engine the fit starts from (default the shipped one); its memory rules are kept.

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
    x = _fit(y, p0, sens, base)
    x0 = np.array([getattr(base, n) for n, _, _, _ in ADAPTED_CONSTANTS])
    held = np.zeros(len(y))
    if len(runs) > 1:
        for i in range(len(runs)):
            test = owner == i
            xi = _fit(y[~test], p0[~test], sens[~test], base)
            d = np.array([xi[n] for n, _, _, _ in ADAPTED_CONSTANTS]) - x0
            held[test] = p0[test] + sens[test] @ d
        sigma = float(np.sqrt(np.mean(np.log(held / y) ** 2)))
        mape = float(np.mean(np.abs(held / y - 1)) * 100)
    else:
        sigma = base.sigma_log if base.sigma_log is not None else 0.0
        mape = math.nan
    ad = EngineAdaptation(device=device, engine=engine, version=version, constants=x, sigma_log=sigma,
                          runs=len(runs), heldout_mape_pct=mape)
    if persist:
        ad = dataclasses.replace(ad, path=str(save_adaptation(ad, runs, storage)))
    return ad
