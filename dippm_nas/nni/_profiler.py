"""NAS side: :class:`DippmProfiler`, an ``nni.nas.profiler.Profiler`` answering with dippm-nas predictions.

NNI's own hardware profiler (``NnMeterProfiler``) needs nn-Meter and edge-device predictors downloaded at
run time. This one predicts datacenter-GPU latency, energy and memory of a sample of a ``ModelSpace``
with :func:`dippm_nas.predict`, so it plugs into ``Chain(strategy, Filter(...))`` offline::

    profiler = DippmProfiler(space, InputSpec(shape=(3, 32, 32), batch_size=8), metric="latency_ms")
    strategy = Chain(RegularizedEvolution(), Filter(profiler.as_filter(2.0)))
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dippm_nas._numbers import as_real
from dippm_nas._optional import require
from dippm_nas.deployment import Deployment
from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError, InputSpecError, InvalidValueError
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import DEFAULT_DEVICE, predict
from dippm_nas.spec import InputSpec

require("nni.nas.profiler", "nas", "dippm_nas.nni.DippmProfiler")
from nni.nas.profiler import Profiler  # noqa: E402

__all__ = ["DippmProfiler", "PROFILE_METRICS"]

logger = logging.getLogger(__name__)

#: Prediction figures a :class:`DippmProfiler` can return.
PROFILE_METRICS: tuple[str, ...] = ("latency_ms", "energy_j", "memory_mib")


def _sample_key(sample: Mapping[str, Any]) -> str:
    return json.dumps(sample, sort_keys=True, separators=(",", ":"), default=repr)


class DippmProfiler(Profiler):
    """Predicted latency, energy or memory of a sample of an NNI model space.

    ``profile(sample)`` freezes the space with the sample (``model_space.freeze(sample)``), predicts the
    frozen model with :func:`dippm_nas.predict` and returns one figure; :meth:`prediction` returns the
    whole :class:`~dippm_nas.Prediction`. Each distinct sample is predicted once (cached for the profiler's
    life), so several filters and metrics share the work.

    Args:
        model_space: the ``nni.nas.nn.pytorch.ModelSpace`` the samples come from.
        spec: the input the cost is predicted for (batch size included).
        metric: the figure :meth:`profile` returns, one of :data:`PROFILE_METRICS`.
        device: catalogue device id; default ``"a100-sxm4-40gb"``.
        k_sigma: memory standard deviations for the MIG advice of the prediction.
        cache: conversion cache, as in :func:`dippm_nas.predict`.
        deployment: how the models run, as in :func:`dippm_nas.predict` (a :class:`~dippm_nas.Deployment`, a
            mapping of its fields or a JSON/TOML file); ``None``: not described.

    Raises:
        DeploymentError: a bad deployment (the field, the value and the choices are named).
        DippmNasError: ``metric`` is not one of :data:`PROFILE_METRICS`; ``model_space`` has no ``freeze``.
        InputSpecError: ``spec`` is not an InputSpec.
    """

    def __init__(self, model_space: Any, spec: InputSpec, *, metric: str = "latency_ms",
                 device: str = DEFAULT_DEVICE, k_sigma: float = 2.0, cache: Any = True,
                 deployment: Any = None) -> None:
        super().__init__(model_space)
        if metric not in PROFILE_METRICS:
            raise InvalidValueError(f"metric must be one of {PROFILE_METRICS}, got {metric!r}")
        if not isinstance(spec, InputSpec):
            raise InputSpecError(f"spec must be a dippm_nas.InputSpec, got {spec!r}")
        if not callable(getattr(model_space, "freeze", None)):
            raise InvalidValueError(f"model_space must be an NNI model space (with freeze(sample)), "
                                    f"got {type(model_space).__name__}")
        self.model_space = model_space
        self.spec = spec
        self.metric = metric
        self.device = resolve_device(device).id
        self.k_sigma = float(k_sigma)
        self.cache = cache
        self.deployment = Deployment.coerce(deployment)
        self._predictions: dict[str, Prediction] = {}

    def prediction(self, sample: Mapping[str, Any]) -> Prediction:
        """The full prediction of the model ``sample`` selects (cached per distinct sample).

        Args:
            sample: ``{label: value}`` of every mutable of the space (``ExecutableModelSpace.sample``).

        Raises:
            DippmNasError: the sample is not a mapping or the space cannot be frozen with it (NNI's error
                is chained); capture/prediction errors as in :func:`dippm_nas.predict`.
        """
        if not isinstance(sample, Mapping):
            raise InvalidValueError(f"sample must be a mapping {{label: value}}, got {type(sample).__name__}")
        key = _sample_key(sample)
        pred = self._predictions.get(key)
        if pred is None:
            try:
                model = self.model_space.freeze(dict(sample))
            except Exception as e:  # NNI's SampleValidationError and friends: say which sample
                raise DippmNasError(f"cannot freeze {type(self.model_space).__name__} with sample {key}: "
                                    f"{type(e).__name__}: {e}") from e
            pred = predict(model, self.spec, self.device, cache=self.cache, k_sigma=self.k_sigma,
                           deployment=self.deployment)
            self._predictions[key] = pred
            logger.debug("sample %s: %.4g ms, %.4g MiB", key, pred.latency_ms, pred.memory_mib)
        return pred

    def profile(self, sample: Mapping[str, Any]) -> float:
        """The predicted :attr:`metric` of the model ``sample`` selects (ms, J or MiB).

        Raises:
            DippmNasError: as :meth:`prediction`; or ``metric="energy_j"`` on a device without power figures.
        """
        pred = self.prediction(sample)
        v = getattr(pred, self.metric)
        if v is None:
            raise InvalidValueError(f"device {self.device!r} gives no {self.metric} (source "
                                    f"{pred.energy_source!r}); profile latency_ms or memory_mib instead")
        return float(v)

    def as_filter(self, max_value: float) -> Callable[[Any], bool]:
        """A ``filter_fn`` for ``nni.nas.strategy.middleware.Filter``: True when the predicted metric of the
        submitted model is ``<= max_value``.

        Args:
            max_value: the bound, in the metric's unit (ms, J or MiB), ``> 0``.

        Shapes:
            The returned function takes an ``ExecutableModelSpace`` (what ``Filter`` passes) and reads its
            ``sample``.
        """
        limit = as_real(max_value, "max_value", low=0, low_inclusive=False)

        def within(model: Any) -> bool:
            sample = getattr(model, "sample", None)
            if sample is None:
                raise InvalidValueError(f"the filtered model has no sample (got {type(model).__name__}); "
                                        "Filter passes an ExecutableModelSpace with .sample")
            ok = self.profile(sample) <= limit
            if not ok:
                logger.info("filtered out %s: predicted %s %.4g > %.4g", _sample_key(sample), self.metric,
                            self.profile(sample), limit)
            return ok

        within.__name__ = f"dippm_{self.metric}_at_most_{limit:g}"
        return within

    def __repr__(self) -> str:
        return f"DippmProfiler(metric={self.metric!r}, device={self.device!r}, spec={self.spec})"
