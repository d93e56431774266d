"""The analytic prior as a :class:`~dippm_nas.prediction.Prediction`, with the MIG advice."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dippm_nas._deprecation import MISSING
from dippm_nas.deployment import Deployment, ResolvedDeployment
from dippm_nas.devices import Device, resolve_device
from dippm_nas.errors import DeviceError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.prior._deploy import DeploymentSettings, deployment_settings
from dippm_nas.prior._estimate import PriorEstimate, estimate_with, latency_sigma_log, legacy_keywords, timeline_fields
from dippm_nas.prior._mig import advise
from dippm_nas.prior._params import PriorParams
from dippm_nas.prior._power import PowerTable
from dippm_nas.prior._spread import DeploymentSpread, deployment_spread

__all__ = ["predict", "prediction_of"]


def predict(
    graph: OperatorGraph, device: Device | str, *, mig: bool = True, k_sigma: float = 2.0,
    params: PriorParams | None = None, power: PowerTable | None = None,
    deployment: "Deployment | ResolvedDeployment | DeploymentSettings | None" = None,
    tf32_conv: Any = MISSING, tf32_matmul: Any = MISSING, channels_last: Any = MISSING, runtime: Any = MISSING,
    host: Any = MISSING, input_copy: Any = MISSING, autocast: Any = MISSING,
) -> Prediction:
    """The analytic prior as a :class:`~dippm_nas.prediction.Prediction` (sources ``"analytic"``; energy
    ``"predicted"`` where the power model is fitted for the device's architecture).

    Args:
        graph, device, params, power, deployment: as for :func:`estimate`.
        mig: attach the MIG advisor's answer (devices with MIG only; see :func:`dippm_nas.mig.advise`).
        k_sigma: passed to the advisor.
        tf32_conv, tf32_matmul, channels_last, runtime, host, input_copy, autocast: deprecated, as for
            :func:`estimate` (removed in dippm-nas 0.2).

    Raises:
        DeviceError: the device has no power figures, so no energy can be given (e.g. ``host-cpu``;
            use :func:`estimate`, whose ``energy_j`` is then ``None``), or an unknown device id.
        UnsupportedDtypeError, GraphValidationError: as for :func:`estimate`.
    """
    legacy = legacy_keywords("predict", dict(tf32_conv=tf32_conv, tf32_matmul=tf32_matmul, channels_last=channels_last,
                                             runtime=runtime, host=host, input_copy=input_copy, autocast=autocast))
    dev = resolve_device(device)
    if deployment is not None:
        deployment = deployment_settings(deployment)  # resolved once: the estimate, the spread and the advice read it
    est = estimate_with(graph, dev, params=params, power=power, deployment=deployment, **legacy)
    sp = (deployment_spread(graph, dev, deployment, params=params)
          if deployment is not None and dev.kind == "gpu" and est.energy_j is not None else None)
    pred = prediction_of(est, dev, params=params, spread=sp)
    if mig and dev.has_mig:
        legacy.pop("execution")
        advice = advise(pred, dev, graph=graph, k_sigma=k_sigma, params=params, deployment=deployment, **legacy)
        pred = dataclasses.replace(pred, mig=advice)
    return pred


def prediction_of(est: PriorEstimate, device: Device, *, params: PriorParams | None = None,
                  spread: DeploymentSpread | None = None) -> Prediction:
    """The :class:`~dippm_nas.prediction.Prediction` of an estimate on the resolved ``device`` (no MIG advice),
    with the deployment's ``spread`` (:func:`~dippm_nas.prior.deployment_spread`) on its latency when given.

    Raises:
        DeviceError: the estimate has no energy (the device has no power figures).
    """
    if est.energy_j is None:
        raise DeviceError(
            f"device {device.id!r} has no power figures (board_power_w, idle_power_w), so the prior gives no "
            "energy and cannot fill a Prediction; use dippm_nas.prior.estimate() for latency and memory, or "
            "register a device file with power figures under $DIPPM_NAS_DEVICE_DIR"
        )
    details = est.details()
    details["params_fitted"] = float(est.params_source != "uncalibrated")
    s_lat = latency_sigma_log(est, params, device=device)
    latency = est.latency_ms
    timeline = timeline_fields(est, device)
    if spread is not None:
        # what the deployment leaves undescribed: the mixture's centre and spread (0 when all is described)
        latency *= math.exp(spread.offset_log)
        s_lat = None if s_lat is None else math.hypot(s_lat, spread.sigma_log)
        details["deployment_sigma_log"] = spread.sigma_log
        details["deployment_offset_log"] = spread.offset_log
        if timeline["gpu_ms"] is not None:  # the GPU timeline's centre: the mixture's (an undescribed autocast)
            timeline["gpu_ms"] *= math.exp(spread.gpu_offset_log)
    return Prediction(
        latency_ms=latency, energy_j=est.energy_j, memory_mib=est.memory_mib,
        latency_source="analytic", energy_source=est.energy_source, memory_source="analytic",  # type: ignore[arg-type]
        energy_j_std=est.energy_j_std,
        device=device.id, batch_size=est.batch_size, dtype=est.dtype, unknown_ops=dict(est.unknown_ops),
        details=details, latency_ms_std=None if s_lat is None else latency * s_lat,
        memory_mib_std=est.memory_mib_std, **timeline,
    )
