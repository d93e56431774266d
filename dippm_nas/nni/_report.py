"""Trial side of NNI HPO: :func:`report` sends accuracy and the predicted cost as one final result.

NNI's tuners read ``metric['default']`` only; its web portal shows every key of the dict. So the dict
carries the scalarised score (see :mod:`dippm_nas.nni._scalarize`) as ``default`` and the raw figures
beside it.
"""

from __future__ import annotations

import logging
from typing import Any

from dippm_nas._optional import require
from dippm_nas.errors import DippmNasError
from dippm_nas.nni._scalarize import Constraints, scalarize
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import DEFAULT_DEVICE, predict
from dippm_nas.spec import InputSpec

__all__ = ["report", "final_metrics", "METRIC_KEYS", "mig_label"]

logger = logging.getLogger(__name__)

#: Keys of the dict :func:`report` sends, in order.
METRIC_KEYS: tuple[str, ...] = (
    "default", "accuracy", "latency_ms", "energy_j", "memory_mib", "mig", "feasible", "source",
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
                  device: str = DEFAULT_DEVICE, max_latency_ms: float | None = None,
                  max_energy_j: float | None = None, max_memory_mib: float | None = None,
                  mig_profile: str | None = None, reward_exponent: float = 0.0, penalty_exponent: float = -1.0,
                  k_sigma: float = 2.0, cache: Any = True) -> dict[str, Any]:
    """The dict :func:`report` sends, without sending it (no NNI needed).

    Args: as for :func:`report`.

    Returns:
        ``{'default', 'accuracy', 'latency_ms', 'energy_j', 'memory_mib', 'mig', 'feasible', 'source'}``
        (see :func:`report`).
    """
    constraints = Constraints(max_latency_ms=max_latency_ms, max_energy_j=max_energy_j,
                              max_memory_mib=max_memory_mib, mig_profile=mig_profile)
    pred = predict(model, spec, device, cache=cache, k_sigma=k_sigma)
    score = scalarize(accuracy, pred, constraints, reward_exponent=reward_exponent,
                      penalty_exponent=penalty_exponent)
    return {
        "default": score,
        "accuracy": float(accuracy),
        "latency_ms": float(pred.latency_ms),
        "energy_j": None if pred.energy_j is None else float(pred.energy_j),
        "memory_mib": float(pred.memory_mib),
        "mig": mig_label(pred),
        "feasible": constraints.feasible(pred),
        "source": _source_label(pred),
    }


def report(accuracy: float, model: Any, spec: InputSpec | None = None, *, device: str = DEFAULT_DEVICE,
           max_latency_ms: float | None = None, max_energy_j: float | None = None,
           max_memory_mib: float | None = None, mig_profile: str | None = None, reward_exponent: float = 0.0,
           penalty_exponent: float = -1.0, k_sigma: float = 2.0, cache: Any = True) -> dict[str, Any]:
    """Report a trial's accuracy and its model's predicted cost to NNI (``nni.report_final_result``).

    Call it once at the end of an NNI trial, instead of ``nni.report_final_result(accuracy)``.

    Args:
        accuracy: the trial's measured accuracy (or any quality score), ``>= 0``, higher is better.
        model: the trained model (``nn.Module``, ONNX path, SPEC string or :class:`OperatorGraph`).
        spec: the input the cost is predicted for (batch size included); not needed with a graph.
        device: catalogue device id the cost is predicted for; default ``"a100-sxm4-40gb"``.
        max_latency_ms, max_energy_j, max_memory_mib, mig_profile: the constraints (see
            :class:`Constraints`); each one over its limit lowers ``default``.
        reward_exponent, penalty_exponent: the scalarisation's exponents (see :func:`scalarize`).
        k_sigma: memory standard deviations added for the MIG fit.
        cache: conversion cache, as in :func:`dippm_nas.predict`.

    Returns:
        The dict sent to NNI:

        - ``default``: ``accuracy`` times the constraint factors (:func:`scalarize`); what NNI tuners optimise
        - ``accuracy``: as given
        - ``latency_ms``, ``energy_j``, ``memory_mib``: the prediction (``energy_j`` is ``None`` for devices
          without power figures)
        - ``mig``: smallest fitting MIG profile (see :func:`mig_label`)
        - ``feasible``: whether every constraint holds
        - ``source``: where the figures come from (``"predicted"``, ``"analytic"``...; one per figure when
          they differ). Figures are never measured here.

    Raises:
        MissingDependencyError: NNI is not installed (``pip install 'dippm-nas[nni]'``).
        DippmNasError: bad accuracy, exponent or bound, or the model cannot be predicted.
    """
    nni = require("nni", "nni", "dippm_nas.nni.report")
    metrics = final_metrics(accuracy, model, spec, device=device, max_latency_ms=max_latency_ms,
                            max_energy_j=max_energy_j, max_memory_mib=max_memory_mib, mig_profile=mig_profile,
                            reward_exponent=reward_exponent, penalty_exponent=penalty_exponent,
                            k_sigma=k_sigma, cache=cache)
    try:
        nni.report_final_result(metrics)
    except Exception as e:  # NNI's own failure (no trial environment, closed channel): keep its traceback
        raise DippmNasError(f"nni.report_final_result failed: {type(e).__name__}: {e}") from e
    logger.debug("reported final result %s", metrics)
    return metrics
