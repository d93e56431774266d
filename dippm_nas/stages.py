"""Multi-stage pipelines: one latency, energy and σ for a sequence of models run one after another.

A text-to-image diffusion pipeline is a text encoder, ``n`` UNet calls (at twice the batch with classifier-free
guidance) and a VAE decode; an LLM request is a prefill and ``n`` decode steps. Each stage is a model with its
input spec and how many times it runs:

>>> from dippm_nas import InputSpec
>>> from dippm_nas.stages import Stage, predict_stages
>>> pipe = predict_stages([Stage(text_encoder, te_spec, 1), Stage(unet, unet_spec, 25), Stage(vae, vae_spec, 1)],
...                       device="h100-sxm5-80gb")                                      # doctest: +SKIP
>>> pipe.latency_ms, pipe.energy_j, pipe.energy_j_std                                   # doctest: +SKIP

Totals are sums over stages of ``calls x`` the stage's figure. σ: the calls of one stage repeat the same
prediction, so its error repeats too (``calls x σ``); different stages are taken as independent, so their σ
add in quadrature. A total's source is the weakest of its stages' (``"analytic"`` if any stage is analytic).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dippm_nas._numbers import as_int
from dippm_nas.devices import resolve_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import DEFAULT_DEVICE, predict
from dippm_nas.spec import InputSpec

__all__ = ["Stage", "StagesPrediction", "predict_stages", "sum_stages"]

#: Sources from the most to the least trusted; a total takes the least trusted of its stages'.
_SOURCE_ORDER = ("calibrated", "predicted", "analytic", "unavailable")


@dataclass(frozen=True)
class Stage:
    """One stage of a pipeline.

    Attributes:
        model: an ``nn.Module``, ONNX path, model SPEC string or :class:`~dippm_nas.OperatorGraph`.
        spec: its input spec (``None`` for a graph, which carries its own).
        calls: how many times the stage runs per pipeline call (an int >= 1).
        device: catalogue id the stage runs on; ``None`` takes the pipeline's device.
        name: a label for reports.
    """

    model: Any
    spec: InputSpec | None = None
    calls: int = 1
    device: str | None = None
    name: str = ""


@dataclass(frozen=True)
class StagesPrediction:
    """Predicted cost of one call of a multi-stage pipeline on one device.

    Attributes:
        latency_ms: sum over stages of ``calls x`` the stage's latency, ms.
        energy_j: the same for energy, J; ``None`` when a stage has no energy figure (a device without power figures).
        latency_ms_std, energy_j_std: one σ of the totals (``None`` when a stage gives none).
        latency_source, energy_source: the least trusted source among the stages.
        peak_stage_memory_mib: the largest peak memory of one stage, MiB (not the pipeline's: models that stay
            resident between stages add their weights).
        device: the device id.
        stages: each stage's :class:`~dippm_nas.Prediction`, in order.
        calls: each stage's call count, in order.
        names: each stage's label.
    """

    latency_ms: float
    energy_j: float | None
    latency_ms_std: float | None
    energy_j_std: float | None
    latency_source: str
    energy_source: str
    peak_stage_memory_mib: float
    device: str
    stages: tuple[Prediction, ...]
    calls: tuple[int, ...]
    names: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (stage predictions as dicts)."""
        return {"latency_ms": self.latency_ms, "energy_j": self.energy_j, "latency_ms_std": self.latency_ms_std,
                "energy_j_std": self.energy_j_std, "latency_source": self.latency_source,
                "energy_source": self.energy_source, "peak_stage_memory_mib": self.peak_stage_memory_mib,
                "device": self.device, "calls": list(self.calls), "names": list(self.names),
                "stages": [p.to_dict() for p in self.stages]}


def _check_calls(calls: Any, where: str) -> int:
    return as_int(calls, f"{where}: calls", low=1, hint=" (how many times the stage runs per pipeline call)")


def _weakest(sources: Sequence[str]) -> str:
    return max(sources, key=lambda s: _SOURCE_ORDER.index(s) if s in _SOURCE_ORDER else len(_SOURCE_ORDER))


def sum_stages(items: Sequence[tuple[Prediction, int]], *, names: Sequence[str] = ()) -> StagesPrediction:
    """Sum per-stage predictions into one pipeline figure.

    Args:
        items: ``(prediction, calls)`` per stage, in order; every prediction for the same device.
        names: optional labels, one per stage.

    Raises:
        DippmNasError: no stage, a call count that is not an int >= 1, an item that is not a
            ``(Prediction, calls)`` pair, or stages on different devices.
    """
    items = list(items)
    if not items:
        raise InvalidValueError("a pipeline needs at least one stage; got an empty stage list")
    preds: list[Prediction] = []
    calls: list[int] = []
    for i, item in enumerate(items):
        try:
            p, n = item
        except (TypeError, ValueError):
            raise InvalidValueError(f"stage {i} must be a (Prediction, calls) pair, got {item!r}") from None
        if not isinstance(p, Prediction):
            raise InvalidValueError(f"stage {i} must hold a Prediction, got {type(p).__name__}")
        preds.append(p)
        calls.append(_check_calls(n, f"stage {i}"))
    devices = sorted({p.device for p in preds})
    if len(devices) > 1:
        raise InvalidValueError(f"all stages of a pipeline must run on one device, got stages on {devices}; "
                                "predict each device's pipeline separately")
    if names and len(names) != len(preds):
        raise InvalidValueError(f"names must give one label per stage ({len(preds)}), got {len(names)}")

    def total(attr: str) -> float | None:
        vals = [getattr(p, attr) for p in preds]
        return None if any(v is None for v in vals) else float(sum(n * v for n, v in zip(calls, vals)))

    def sigma(attr: str) -> float | None:
        vals = [getattr(p, attr + "_std") for p in preds]
        return None if any(v is None for v in vals) else math.sqrt(sum((n * v) ** 2 for n, v in zip(calls, vals)))

    energy = total("energy_j")
    return StagesPrediction(
        latency_ms=float(total("latency_ms") or 0.0), energy_j=energy, latency_ms_std=sigma("latency_ms"),
        energy_j_std=sigma("energy_j") if energy is not None else None,
        latency_source=_weakest([p.latency_source for p in preds]),
        energy_source=_weakest([p.energy_source for p in preds]),
        peak_stage_memory_mib=max(p.memory_mib for p in preds), device=devices[0], stages=tuple(preds),
        calls=tuple(calls), names=tuple(names) if names else tuple(f"stage{i}" for i in range(len(preds))),
    )


def predict_stages(stages: Sequence[Stage | tuple[Any, ...]], device: str | None = None, *,
                   cache: Any = True, mig: bool = False) -> StagesPrediction:
    """Predict every stage with :func:`dippm_nas.predict` and sum them (see :func:`sum_stages`).

    Args:
        stages: :class:`Stage` objects or ``(model, spec, calls)`` / ``(model, spec, calls, device)`` tuples.
        device: the pipeline's device; stages that name one must agree with it and with each other.
            Default: the stages' device, else ``dippm_nas.predict``'s default (``"a100-sxm4-40gb"``).
        cache: conversion cache, as in :func:`dippm_nas.capture`.
        mig: attach the MIG advice to each stage's prediction.

    Raises:
        DippmNasError: an empty stage list, a call count that is not an int >= 1, a malformed stage, or stages
            on different devices; any error of :func:`dippm_nas.predict` for a stage.
    """
    stages = list(stages)
    if not stages:
        raise InvalidValueError("a pipeline needs at least one stage; got an empty stage list")
    norm: list[Stage] = []
    for i, s in enumerate(stages):
        if isinstance(s, Stage):
            st = s
        elif isinstance(s, tuple) and len(s) in (3, 4):
            st = Stage(*s)
        else:
            raise InvalidValueError(f"stage {i} must be a Stage or a (model, spec, calls[, device]) tuple, got {s!r}")
        _check_calls(st.calls, f"stage {i}")
        norm.append(st)
    named = {resolve_device(s.device).id for s in norm if s.device is not None}
    if device is not None:
        named.add(resolve_device(device).id)
    if len(named) > 1:
        raise InvalidValueError(f"all stages of a pipeline must run on one device, got {sorted(named)}; "
                                "predict each device's pipeline separately")
    dev = named.pop() if named else DEFAULT_DEVICE
    preds = [(predict(s.model, s.spec, device=dev, cache=cache, mig=mig), s.calls) for s in norm]
    return sum_stages(preds, names=[s.name or f"stage{i}" for i, s in enumerate(norm)])
