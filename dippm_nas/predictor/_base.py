"""The predictor plug-in point: :class:`BasePredictor` and the analytic stand-in."""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from dippm_nas._logging import WarnOnce
from dippm_nas.devices import HostProfile, resolve_device, resolve_host_profile
from dippm_nas.errors import DeviceError, ExecutionRuntimeError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.prior import check_runtime, estimate, predict as prior_predict, timeline_fields

__all__ = ["BasePredictor", "AnalyticPredictor"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger, python_warning=True)


class BasePredictor(abc.ABC):
    """Turns operator graphs into :class:`Prediction` objects for one device.

    :func:`dippm_nas.predict` and :func:`dippm_nas.predict_many` call :meth:`predict_graphs` once per
    request with every graph of the request, so an implementation can run one batched pass.
    """

    #: The catalogue id of the device this predictor answers for.
    device: str

    @abc.abstractmethod
    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str = "eager", host: HostProfile | str | None = None) -> list[Prediction]:
        """One :class:`Prediction` per graph, in order.

        Args:
            graphs: validated graphs (the caller validated them).
            mig: attach the MIG advisor's answer for devices with MIG.
            k_sigma: how many standard deviations of memory the advisor adds before choosing a profile.
            runtime: execution runtime (``"eager"``, ``"cuda-graphs"``, ``"compiled"``), recorded in
                ``details["runtime"]``.
            host: the host that drives the GPU (a :class:`~dippm_nas.devices.HostProfile`, a profile file, or
                ``None`` for the default profile).
        """


def execution_args(device: str, runtime: str, host: Any) -> tuple[str, HostProfile]:
    """Check ``runtime`` and ``host`` for ``device``: the runtime and the resolved host profile.

    Raises:
        ExecutionRuntimeError: an unknown runtime, or one other than ``"eager"`` on a CPU device.
        DeviceError: an unreadable host profile.
    """
    rt = check_runtime(runtime)
    if rt != "eager" and resolve_device(device).kind != "gpu":
        raise ExecutionRuntimeError(f"runtime {rt!r} is modelled for GPUs; device {device!r} is a CPU, whose "
                                    "predictions are for eager PyTorch (runtime='eager')")
    prof = resolve_host_profile(host)
    if prof.framework != CURRENT_FRAMEWORK:
        _warn_once(f"framework:{prof.framework}",
                        "host profile %r describes %s, not the %s generation the host model's constants are for: "
                        "its host times are scaled by the fitted generation factor and flagged "
                        "details['host_profile_mismatch'] = 1", prof.name, prof.framework, CURRENT_FRAMEWORK)
    return rt, prof


#: The framework generation the host model's constants and the default host profile describe.
CURRENT_FRAMEWORK = "torch-2"


def execution_details(runtime: str, host: HostProfile) -> dict[str, Any]:
    """``details`` entries every prediction carries about its execution."""
    return {"runtime": runtime, "host_profile_mismatch": float(host.framework != CURRENT_FRAMEWORK)}


class AnalyticPredictor(BasePredictor):
    """The analytic prior (roofline + timelines + liveness) as a predictor; every source is ``"analytic"``."""

    def __init__(self, device: str) -> None:
        self.device = resolve_device(device).id

    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str = "eager", host: HostProfile | str | None = None) -> list[Prediction]:
        rt, prof = execution_args(self.device, runtime, host)
        out = []
        for g in graphs:
            try:
                pred = prior_predict(g, self.device, mig=mig, k_sigma=k_sigma, runtime=rt, host=prof)
            except DeviceError:  # the device has no power figures: energy is unavailable, not zero
                est = estimate(g, self.device, runtime=rt, host=prof)
                if est.energy_j is not None:
                    raise
                pred = Prediction(
                    latency_ms=est.latency_ms, energy_j=None, memory_mib=est.memory_mib,
                    latency_source="analytic", energy_source="unavailable", memory_source="analytic",
                    device=self.device, batch_size=est.batch_size, dtype=est.dtype,
                    unknown_ops=dict(est.unknown_ops), details=est.details(), **timeline_fields(est),
                )
            out.append(dataclasses.replace(pred, details={**pred.details, **execution_details(rt, prof)}))
        return out

    def __repr__(self) -> str:
        return f"AnalyticPredictor(device={self.device!r})"

