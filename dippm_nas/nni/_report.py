"""Trial side of NNI HPO: :func:`report` sends accuracy and the predicted cost as one final result.

NNI's tuners read ``metric['default']`` only; its web portal shows every key of the dict. So the dict
carries the scalarised score (see :mod:`dippm_nas.nni._scalarize`) as ``default`` and the raw figures
beside it, with each budget's chance check in the convention of every integration (absolute units,
``value = mean + k_sigma * std - budget``, ``<= 0`` feasible; ``margin = -value``).

In a trial of :class:`~dippm_nas.nni.HardwareAwareTuner` the parameters carry the tuner's budgets, device,
deployment and input spec (``params["dippm"]``); :func:`report` reads them, so the trial repeats none of them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from dippm_nas._optional import require
from dippm_nas.budgets import Budgets
from dippm_nas.deployment import Deployment
from dippm_nas.errors import DippmNasError
from dippm_nas.nni._scalarize import budgets_from_limits, scalarize
from dippm_nas.nni._space import PARAMETERS_KEY, spec_from_parameters
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import DEFAULT_DEVICE, get_predictor, predict
from dippm_nas.spec import InputSpec

__all__ = ["report", "final_metrics", "METRIC_KEYS", "mig_label", "tuner_settings"]

logger = logging.getLogger(__name__)

#: Keys of the dict :func:`report` sends, in order.
METRIC_KEYS: tuple[str, ...] = (
    "default", "accuracy", "latency_ms", "energy_j", "memory_mib", "latency_ms_std", "energy_j_std",
    "memory_mib_std", "margins", "constraints", "mig", "feasible", "source",
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


def tuner_settings(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a :class:`~dippm_nas.nni.HardwareAwareTuner` told its trial about scoring: ``{"budgets",
    "device", "deployment", "spec"}`` from ``parameters["dippm"]`` (a key is absent when the tuner did not
    send it; ``{}`` for parameters that did not come from the tuner). ``"deployment"`` is a
    :class:`~dippm_nas.Deployment` (from the tuner's ``"runtime"`` alone where it sent no deployment).

    Raises:
        DippmNasError: a ``"dippm"`` entry whose budgets, deployment or input spec are malformed.
    """
    if not isinstance(parameters, Mapping) or not isinstance(parameters.get(PARAMETERS_KEY), Mapping):
        return {}
    d = parameters[PARAMETERS_KEY]
    out: dict[str, Any] = {}
    if "budgets" in d:
        out["budgets"] = Budgets.coerce(d["budgets"])
    if d.get("device") is not None:
        out["device"] = d["device"]
    if d.get("deployment") is not None:
        out["deployment"] = Deployment.coerce(d["deployment"])
    elif d.get("runtime") is not None:
        out["deployment"] = Deployment.coerce(None, runtime=d["runtime"])
    spec = spec_from_parameters(parameters)
    if spec is not None:
        out["spec"] = spec
    return out


def final_metrics(accuracy: float, model: Any, spec: InputSpec | None = None, *,
                  device: str | None = None, budgets: Budgets | Mapping[str, Any] | None = None,
                  parameters: Mapping[str, Any] | None = None, deployment: Any = None, runtime: str | None = None,
                  reward_exponent: float = 0.0, penalty_exponent: float = -1.0, k_sigma: float | None = None,
                  cache: Any = True, max_latency_ms: float | None = None, max_energy_j: float | None = None,
                  max_memory_mib: float | None = None, mig_profile: str | None = None) -> dict[str, Any]:
    """The dict :func:`report` sends, without sending it (no NNI needed).

    Args: as for :func:`report`; ``parameters`` is not looked up from NNI here.

    Returns:
        ``{'default', 'accuracy', 'latency_ms', 'energy_j', 'memory_mib', 'latency_ms_std', 'energy_j_std',
        'memory_mib_std', 'margins', 'constraints', 'mig', 'feasible', 'source'}`` (see :func:`report`).
    """
    given = budgets is not None or any(v is not None for v in (max_latency_ms, max_energy_j, max_memory_mib,
                                                                mig_profile))
    settings = tuner_settings(parameters)
    if given or "budgets" not in settings:
        b = budgets_from_limits(budgets, max_latency_ms=max_latency_ms, max_energy_j=max_energy_j,
                                max_memory_mib=max_memory_mib, mig_profile=mig_profile, k_sigma=k_sigma,
                                where="dippm_nas.nni.report")
        if given and "budgets" in settings and settings["budgets"] != b:
            logger.info("scoring with the budgets given (%s), not the tuner's (%s)", b.to_dict(),
                        settings["budgets"].to_dict())
    else:
        b = budgets_from_limits(settings["budgets"], k_sigma=k_sigma)
    device = device or settings.get("device") or DEFAULT_DEVICE
    if b.confidence is not None:  # the checkpoint's conformal calibration, as HardwareCostModel attaches it
        b = b.for_predictor(get_predictor(device))
    if deployment is not None or "deployment" not in settings:
        dep = Deployment.coerce(deployment, runtime=runtime)
    else:  # the tuner's, with a runtime given here replacing its runtime
        dep = settings["deployment"]
        if runtime is not None and runtime != dep.runtime:
            dep = Deployment.coerce(dataclasses.replace(dep, runtime=runtime))
            logger.info("scoring with runtime %r, not the tuner's %r", runtime, settings["deployment"].runtime)
    if spec is None:
        spec = settings.get("spec")
    pred = predict(model, spec, device, cache=cache, k_sigma=b.k_for("memory_mib"), deployment=dep)
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
        "constraints": {n: {k: v for k, v in c.to_dict().items() if k != "name"} for n, c in checks.items()},
        "mig": mig_label(pred),
        "feasible": all(c.feasible for c in checks.values()),
        "source": _source_label(pred),
    }


def report(accuracy: float, model: Any, spec: InputSpec | None = None, *, device: str | None = None,
           budgets: Budgets | Mapping[str, Any] | None = None, parameters: Mapping[str, Any] | None = None,
           deployment: Any = None, runtime: str | None = None, reward_exponent: float = 0.0,
           penalty_exponent: float = -1.0, k_sigma: float | None = None, cache: Any = True,
           max_latency_ms: float | None = None, max_energy_j: float | None = None,
           max_memory_mib: float | None = None, mig_profile: str | None = None) -> dict[str, Any]:
    """Report a trial's accuracy and its model's predicted cost to NNI (``nni.report_final_result``).

    Call it once at the end of an NNI trial, instead of ``nni.report_final_result(accuracy)``. In a trial
    of :class:`~dippm_nas.nni.HardwareAwareTuner`, ``report(accuracy, model)`` is enough: the budgets,
    device, deployment and input spec come from the trial's parameters (``params["dippm"]``).

    Args:
        accuracy: the trial's measured accuracy (or any quality score), ``>= 0``, higher is better.
        model: the trained model (``nn.Module``, ONNX path, SPEC string or :class:`OperatorGraph`).
        spec: the input the cost is predicted for (batch size included); not needed with a graph or in a
            trial of the tuner (its parameters describe it).
        device: catalogue device id the cost is predicted for; default: the tuner's, else
            ``"a100-sxm4-40gb"``.
        budgets: a :class:`~dippm_nas.budgets.Budgets` (or a mapping of its keys): chance constraints
            ``mean + k_sigma * std <= budget``; each one broken lowers ``default``. Default: the tuner's
            (``params["dippm"]["budgets"]``), else none. Given ones win over the tuner's.
        parameters: the trial's parameters; default ``nni.get_current_parameter()``.
        deployment: as in :func:`dippm_nas.predict` (a :class:`~dippm_nas.Deployment`, a mapping of its fields or
            a JSON/TOML file); default: the tuner's, else nothing described.
        runtime: as in :func:`dippm_nas.predict`; replaces the runtime of the tuner's deployment when given.
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
        - ``constraints``: ``{figure: {"value", "mean", "std", "k_sigma", "bound", "budget", "margin",
          "limit_source", "std_missing", "feasible"}}``, each budget's chance check
          (:class:`~dippm_nas.budgets.ChanceCheck`): ``value = bound - budget = mean + k_sigma * std -
          budget`` in the figure's unit, ``<= 0`` feasible, as Optuna's constraints
        - ``mig``: smallest fitting MIG profile (see :func:`mig_label`)
        - ``feasible``: whether every budget holds (every margin ``>= 0``)
        - ``source``: where the figures come from (``"predicted"``, ``"analytic"``...; one per figure when
          they differ). Figures are never measured here.

    Raises:
        MissingDependencyError: NNI is not installed (``pip install 'dippm-nas[nni]'``).
        DippmNasError: bad accuracy, exponent, bound or deployment, or the model cannot be predicted.
    """
    nni = require("nni", "nni", "dippm_nas.nni.report")
    if parameters is None:
        parameters = nni.get_current_parameter()
    if any(v is not None for v in (max_latency_ms, max_energy_j, max_memory_mib, mig_profile)):
        budgets = budgets_from_limits(budgets, max_latency_ms=max_latency_ms, max_energy_j=max_energy_j,
                                      max_memory_mib=max_memory_mib, mig_profile=mig_profile,
                                      where="dippm_nas.nni.report")  # warns at the caller's line
    metrics = final_metrics(accuracy, model, spec, device=device, budgets=budgets, parameters=parameters,
                            deployment=deployment, runtime=runtime, reward_exponent=reward_exponent,
                            penalty_exponent=penalty_exponent,
                            k_sigma=k_sigma, cache=cache)
    try:
        nni.report_final_result(metrics)
    except Exception as e:  # NNI's own failure (no trial environment, closed channel): keep its traceback
        raise DippmNasError(f"nni.report_final_result failed: {type(e).__name__}: {e}") from e
    logger.debug("reported final result %s", metrics)
    return metrics
