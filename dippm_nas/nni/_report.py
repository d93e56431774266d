"""Trial side of NNI HPO: :func:`report` sends accuracy and the predicted cost as one final result.

NNI's tuners read ``metric['default']`` only; its web portal shows every key of the dict. So the dict
carries the scalarised score (see :mod:`dippm_nas.nni._scalarize`) as ``default`` and the raw figures
beside it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dippm_nas._optional import require
from dippm_nas.budgets import Budgets
from dippm_nas.errors import DippmNasError
from dippm_nas.nni._scalarize import budgets_from_limits, scalarize
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import DEFAULT_DEVICE, predict
from dippm_nas.spec import InputSpec

__all__ = ["report", "final_metrics", "METRIC_KEYS", "mig_label"]

logger = logging.getLogger(__name__)

#: Keys of the dict :func:`report` sends, in order.
METRIC_KEYS: tuple[str, ...] = (
    "default", "accuracy", "latency_ms", "energy_j", "memory_mib", "latency_ms_std", "energy_j_std",
    "memory_mib_std", "margins", "mig", "feasible", "source",
)


def mig_label(prediction: Prediction) -> str:
    """The ``mig`` entry of the metric dict: the smallest fitting MIG profile's name, ``"none"`` when no
    profile fits, ``"unsupported"`` for a device without MIG, ``"not-asked"`` when predicted with ``mig=False``."""
    advice = prediction.mig
    if advice is None:
        return "not-asked"
    if not advice.supported:
        return "unsupported"
    return advice.smallest_fit or "none"


def _source_label(p: Prediction) -> str:
    srcs = {"latency": p.latency_source, "energy": p.energy_source, "memory": p.memory_source}
    if len(set(srcs.values())) == 1:
        return p.latency_source
    return ",".join(f"{k}={v}" for k, v in srcs.items())


def final_metrics(accuracy: float, model: Any, spec: InputSpec | None = None, *,
                  device: str = DEFAULT_DEVICE, budgets: Budgets | Mapping[str, Any] | None = None,
                  reward_exponent: float = 0.0, penalty_exponent: float = -1.0, k_sigma: float | None = None,
                  cache: Any = True, max_latency_ms: float | None = None, max_energy_j: float | None = None,
                  max_memory_mib: float | None = None, mig_profile: str | None = None) -> dict[str, Any]:
    """The dict :func:`report` sends, without sending it (no NNI needed).

    Args: as for :func:`report`.

    Returns:
        ``{'default', 'accuracy', 'latency_ms', 'energy_j', 'memory_mib', 'latency_ms_std', 'energy_j_std',
        'memory_mib_std', 'margins', 'mig', 'feasible', 'source'}`` (see :func:`report`).
    """
    b = budgets_from_limits(budgets, max_latency_ms=max_latency_ms, max_energy_j=max_energy_j,
                            max_memory_mib=max_memory_mib, mig_profile=mig_profile, k_sigma=k_sigma,
                            where="dippm_nas.nni.report")
    pred = predict(model, spec, device, cache=cache, k_sigma=b.k_for("memory_mib"))
    score = scalarize(accuracy, pred, b, reward_exponent=reward_exponent, penalty_exponent=penalty_exponent)
    checks = b.check(pred)
    return {
        "default": score,
        "accuracy": float(accuracy),
        "latency_ms": float(pred.latency_ms),
        "energy_j": None if pred.energy_j is None else float(pred.energy_j),
        "memory_mib": float(pred.memory_mib),
        "latency_ms_std": pred.latency_ms_std,
        "energy_j_std": pred.energy_j_std,
        "memory_mib_std": pred.memory_mib_std,
        "margins": {n: c.margin for n, c in checks.items()},
        "mig": mig_label(pred),
        "feasible": all(c.feasible for c in checks.values()),
        "source": _source_label(pred),
    }


def report(accuracy: float, model: Any, spec: InputSpec | None = None, *, device: str = DEFAULT_DEVICE,
           budgets: Budgets | Mapping[str, Any] | None = None, reward_exponent: float = 0.0,
           penalty_exponent: float = -1.0, k_sigma: float | None = None, cache: Any = True,
           max_latency_ms: float | None = None, max_energy_j: float | None = None,
           max_memory_mib: float | None = None, mig_profile: str | None = None) -> dict[str, Any]:
    """Report a trial's accuracy and its model's predicted cost to NNI (``nni.report_final_result``).

    Call it once at the end of an NNI trial, instead of ``nni.report_final_result(accuracy)``.

    Args:
        accuracy: the trial's measured accuracy (or any quality score), ``>= 0``, higher is better.
        model: the trained model (``nn.Module``, ONNX path, SPEC string or :class:`OperatorGraph`).
        spec: the input the cost is predicted for (batch size included); not needed with a graph.
        device: catalogue device id the cost is predicted for; default ``"a100-sxm4-40gb"``.
        budgets: a :class:`~dippm_nas.budgets.Budgets` (or a mapping of its keys): chance constraints
            ``mean + k_sigma * std <= budget``; each one broken lowers ``default``.
        reward_exponent, penalty_exponent: the scalarisation's exponents (see :func:`scalarize`).
        k_sigma: when given, replaces ``budgets.k_sigma`` (default of the budgets: 1.0).
        max_latency_ms, max_energy_j, max_memory_mib, mig_profile: deprecated (``DeprecationWarning``):
            the same as ``budgets=Budgets(latency_ms=..., energy_j=..., memory_mib=..., mig_profile=...)``.
        cache: conversion cache, as in :func:`dippm_nas.predict`.

    Returns:
        The dict sent to NNI:

        - ``default``: ``accuracy`` times the constraint factors (:func:`scalarize`); what NNI tuners optimise
        - ``accuracy``: as given
        - ``latency_ms``, ``energy_j``, ``memory_mib``: the prediction (``energy_j`` is ``None`` for devices
          without power figures)
        - ``latency_ms_std``, ``energy_j_std``, ``memory_mib_std``: their standard deviations (``None`` where
          the source gives none; a budget then counts that std as 0)
        - ``margins``: ``{figure: budget - mean - k_sigma * std}`` of each budget set (``>= 0`` within it)
        - ``mig``: smallest fitting MIG profile (see :func:`mig_label`)
        - ``feasible``: whether every budget holds (every margin ``>= 0``)
        - ``source``: where the figures come from (``"predicted"``, ``"analytic"``...; one per figure when
          they differ). Figures are never measured here.

    Raises:
        MissingDependencyError: NNI is not installed (``pip install 'dippm-nas[nni]'``).
        DippmNasError: bad accuracy, exponent or bound, or the model cannot be predicted.
    """
    nni = require("nni", "nni", "dippm_nas.nni.report")
    b = budgets_from_limits(budgets, max_latency_ms=max_latency_ms, max_energy_j=max_energy_j,
                            max_memory_mib=max_memory_mib, mig_profile=mig_profile, k_sigma=k_sigma,
                            where="dippm_nas.nni.report")
    metrics = final_metrics(accuracy, model, spec, device=device, budgets=b, reward_exponent=reward_exponent,
                            penalty_exponent=penalty_exponent, cache=cache)
    try:
        nni.report_final_result(metrics)
    except Exception as e:  # NNI's own failure (no trial environment, closed channel): keep its traceback
        raise DippmNasError(f"nni.report_final_result failed: {type(e).__name__}: {e}") from e
    logger.debug("reported final result %s", metrics)
    return metrics
