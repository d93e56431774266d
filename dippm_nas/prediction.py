"""The result type every predictor returns: :class:`Prediction` (units in the field names)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

from dippm_nas.errors import InvalidValueError

__all__ = ["Prediction", "Source", "SOURCES", "Figure"]

#: Where a figure came from. ``"predicted"``: a trained model; ``"analytic"``: the physics-based prior;
#: ``"calibrated"``: a trained or analytic figure corrected with real measurements of the device;
#: ``"unavailable"``: the device gives no way to know it (energy of a CPU without power figures) and the
#: figure is ``None``.
Source = Literal["predicted", "analytic", "calibrated", "unavailable"]
SOURCES: tuple[str, ...] = ("predicted", "analytic", "calibrated", "unavailable")


class Figure(NamedTuple):
    """One predicted figure: its value (``None`` when unavailable), one σ (``None``: the source gives none) and
    its source (one of :data:`SOURCES`)."""

    value: float | None
    std: float | None
    source: str


#: The figures of a :class:`Prediction` by name, with the field holding each one's source.
_FIGURE_SOURCE = {"latency_ms": "latency_source", "energy_j": "energy_source", "memory_mib": "memory_source"}


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one model at one input spec on one device.

    Attributes:
        latency_ms: time of one forward pass of a batch, milliseconds.
        energy_j: energy of one forward pass of a batch, joules; ``None`` (source ``"unavailable"``) only
            for devices without power figures, such as a host CPU without a RAPL counter.
        memory_mib: peak device memory while running it, MiB (2**20 bytes).
        latency_ms_std, energy_j_std, memory_mib_std: one standard deviation of each figure
            (``None`` when the source gives no uncertainty).
        latency_source, energy_source, memory_source: one of :data:`SOURCES`.
        device: device id of the catalogue, e.g. ``"a100-sxm4-40gb"``.
        batch_size: batch size the figures are for.
        dtype: compute dtype.
        mig: the MIG advisor's answer (``None`` for devices without MIG or when not asked).
        unknown_ops: ``{op: count}`` of operators without a formula/encoder (the answer is flagged).
        details: extra named figures (memory parts, host/GPU time split...), units in the keys.
        host_ms: the host timeline of one pass on a GPU (host time issuing the operators for the
            prediction's execution runtime, ``details["runtime"]``), ms; ``None`` for a CPU device.
        gpu_ms: the GPU timeline: the kernels' busy time, ms; ``latency_ms`` is the critical path through
            both (``details["host_bound"] = 1`` when the host sets the pace); ``None`` for a CPU device.
    """

    latency_ms: float
    energy_j: float | None
    memory_mib: float
    latency_source: Source
    energy_source: Source
    memory_source: Source
    device: str
    batch_size: int
    dtype: str
    latency_ms_std: float | None = None
    energy_j_std: float | None = None
    memory_mib_std: float | None = None
    mig: Any = None
    unknown_ops: dict[str, int] = field(default_factory=dict)
    details: dict[str, float] = field(default_factory=dict)
    host_ms: float | None = None
    gpu_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("latency_ms", "energy_j", "memory_mib"):
            v = getattr(self, name)
            if v is None and name == "energy_j" and self.energy_source == "unavailable":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidValueError(f"Prediction.{name} must be a finite number >= 0, got {v!r}")
            std = getattr(self, name + "_std")
            if std is not None and (not math.isfinite(std) or std < 0):
                raise InvalidValueError(f"Prediction.{name}_std must be finite and >= 0 or None, got {std!r}")
        for name in ("host_ms", "gpu_ms"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
                raise InvalidValueError(f"Prediction.{name} must be a finite number >= 0 or None, got {v!r}")
        for name in ("latency_source", "energy_source", "memory_source"):
            if getattr(self, name) not in SOURCES:
                raise InvalidValueError(f"Prediction.{name} must be one of {SOURCES}, got {getattr(self, name)!r}")
        if (self.energy_j is None) != (self.energy_source == "unavailable"):
            raise InvalidValueError(
                f"Prediction.energy_j is None exactly when energy_source is 'unavailable', got "
                f"energy_j={self.energy_j!r}, energy_source={self.energy_source!r}"
            )

    def figure(self, name: str, mig_profile: str | None = None) -> Figure:
        """The figure ``name`` (``"latency_ms"``, ``"energy_j"`` or ``"memory_mib"``) with its σ and source.

        ``mig_profile`` is accepted for the budgets' sake and changes nothing: the figures of a forward pass are
        those of the whole GPU, and a MIG profile bounds memory only (:mod:`dippm_nas.mig`).

        Raises:
            InvalidValueError: another name (the figures are listed).
        """
        src = _FIGURE_SOURCE.get(name)
        if src is None:
            raise InvalidValueError(f"a Prediction has no figure {name!r}; figures: {list(_FIGURE_SOURCE)}")
        return Figure(getattr(self, name), getattr(self, name + "_std"), getattr(self, src))

    @property
    def flagged(self) -> bool:
        """True when some operators had no formula, so the figures rest on generic estimates."""
        return bool(self.unknown_ops)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with the same keys as the dataclass fields."""
        d = asdict(self)
        mig = self.mig
        d["mig"] = mig.to_dict() if hasattr(mig, "to_dict") else mig
        return d
