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
(``storage=`` another directory): the constants, σ, the runs they were fitted on and the command-free provenance.
:func:`adapted_engine` reads one back as a :class:`~dippm_nas.llm.ServingEngine` for ``predict_generation(...,
engine=...)``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dippm_nas._paths import cache_dir
from dippm_nas.errors import AdaptationError, InvalidValueError
from dippm_nas.llm._architectures import decoder_config
from dippm_nas.llm._engines import ENGINES, ServingEngine, serving_engine
from dippm_nas.llm._predict import predict_generation
from dippm_nas.llm._workload import LLMWorkload

__all__ = ["MeasuredServingRun", "EngineAdaptation", "adapt_engine", "adapted_engine", "ADAPTED_CONSTANTS"]

#: The constants a few runs refit: (name, probe step, lower bound, upper bound).
ADAPTED_CONSTANTS: tuple[tuple[str, float, float, float], ...] = (
    ("decode_gpu_scale", 1.0, 0.3, 5.0), ("step_us", 1000.0, 0.0, 50000.0), ("seq_us", 100.0, 0.0, 5000.0))
_FORMAT = 1
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


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


@dataclass(frozen=True)
class EngineAdaptation:
    """An engine's constants refitted on measured runs of one (device, engine, version).

    Attributes:
        device, engine, version: what the runs measured.
        constants: the refitted constants (:data:`ADAPTED_CONSTANTS`).
        sigma_log: RMS leave-one-run-out log error of the measured figures.
        runs: how many runs; ``heldout_mape_pct``: their leave-one-run-out MAPE.
        path: the JSON file it is stored in (``None``: not persisted).
    """

    device: str
    engine: str
    version: str
    constants: dict[str, float]
    sigma_log: float
    runs: int
    heldout_mape_pct: float
    path: str | None = None

    def serving_engine(self, base: ServingEngine | None = None) -> ServingEngine:
        """``base`` (default the shipped engine) with these constants and σ."""
        return dataclasses.replace(base or serving_engine(self.engine), **self.constants, sigma_log=self.sigma_log,
                                   fitted=True, source=f"adapted on {self.runs} measured runs of {self.device}, "
                                                       f"{self.engine} {self.version}")


def _check_names(device: str, engine: str, version: str) -> None:
    if engine not in ENGINES:
        raise InvalidValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    for name, v in (("device", device), ("version", version)):
        if not isinstance(v, str) or not v.strip():
            raise InvalidValueError(f"{name} must be a non-empty string, got {v!r}")


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
    _check_names(device, engine, version)
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
        ad = dataclasses.replace(ad, path=str(_save(ad, runs, storage)))
    return ad


def _file(device: str, engine: str, version: str, storage: str | Path | None) -> Path:
    root = Path(storage) if storage is not None else cache_dir() / "engine_adaptations"
    return root / f"{_SAFE.sub('_', device)}__{engine}__{_SAFE.sub('_', version)}.json"


def _save(ad: EngineAdaptation, runs: Sequence[MeasuredServingRun], storage: str | Path | None) -> Path:
    path = _file(ad.device, ad.engine, ad.version, storage)
    doc = {"format": _FORMAT, **{k: v for k, v in dataclasses.asdict(ad).items() if k != "path"},
           "heldout_mape_pct": None if math.isnan(ad.heldout_mape_pct) else ad.heldout_mape_pct,
           "measured_runs": [r.to_dict() for r in runs]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        raise AdaptationError(f"cannot write the engine adaptation {path}: {e}") from e
    return path


def adapted_engine(device: str, engine: str, version: str, *,
                   storage: str | Path | None = None) -> ServingEngine | None:
    """The engine adapted for ``(device, engine, version)`` by :func:`adapt_engine`, or ``None`` when none is stored.

    Raises:
        AdaptationError: a stored file that is not an adaptation of this format.
    """
    _check_names(device, engine, version)
    path = _file(device, engine, version, storage)
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("format") != _FORMAT:
            raise ValueError(f"format {d.get('format')!r}, expected {_FORMAT}")
        consts = {n: float(d["constants"][n]) for n, _, _, _ in ADAPTED_CONSTANTS}
        ad = EngineAdaptation(device=d["device"], engine=d["engine"], version=d["version"], constants=consts,
                              sigma_log=float(d["sigma_log"]), runs=int(d["runs"]),
                              heldout_mape_pct=math.nan if d.get("heldout_mape_pct") is None
                              else float(d["heldout_mape_pct"]), path=str(path))
        return ad.serving_engine()
    except (ValueError, KeyError, TypeError, InvalidValueError) as e:
        raise AdaptationError(f"{path}: not an engine adaptation: {e}") from e
