"""The predictor plug-in point: :class:`BasePredictor` and the analytic stand-in."""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence

from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction

__all__ = ["BasePredictor", "AnalyticPredictor"]

logger = logging.getLogger(__name__)


class BasePredictor(abc.ABC):
    """Turns operator graphs into :class:`Prediction` objects for one device.

    :func:`dippm_nas.predict` and :func:`dippm_nas.predict_many` call :meth:`predict_graphs` once per
    request with every graph of the request, so an implementation can run one batched pass.
    """

    #: The catalogue id of the device this predictor answers for.
    device: str

    @abc.abstractmethod
    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True,
                       k_sigma: float = 2.0) -> list[Prediction]:
        """One :class:`Prediction` per graph, in order.

        Args:
            graphs: validated graphs (the caller validated them).
            mig: attach the MIG advisor's answer for devices with MIG.
            k_sigma: how many standard deviations of memory the advisor adds before choosing a profile.
        """


class AnalyticPredictor(BasePredictor):
    """The analytic prior (roofline + timelines + liveness) as a predictor; every source is ``"analytic"``."""

    def __init__(self, device: str) -> None:
        from dippm_nas.devices import resolve_device

        self.device = resolve_device(device).id

    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True,
                       k_sigma: float = 2.0) -> list[Prediction]:
        from dippm_nas.prior import estimate, predict as prior_predict

        out = []
        for g in graphs:
            try:
                out.append(prior_predict(g, self.device, mig=mig, k_sigma=k_sigma))
            except Exception as e:  # the device has no power figures: energy is unavailable, not zero
                from dippm_nas.errors import DeviceError

                if not isinstance(e, DeviceError):
                    raise
                est = estimate(g, self.device)
                if est.energy_j is not None:
                    raise
                out.append(Prediction(
                    latency_ms=est.latency_ms, energy_j=None, memory_mib=est.memory_mib,
                    latency_source="analytic", energy_source="unavailable", memory_source="analytic",
                    device=self.device, batch_size=est.batch_size, dtype=est.dtype,
                    unknown_ops=dict(est.unknown_ops), details=est.details(),
                ))
        return out

    def __repr__(self) -> str:
        return f"AnalyticPredictor(device={self.device!r})"

