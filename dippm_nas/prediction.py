"""The result type every predictor returns: :class:`Prediction` (units in the field names)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from numbers import Real
from typing import Any, Literal, NamedTuple

from dippm_nas.errors import InvalidValueError

__all__ = ["Prediction", "Source", "SOURCES", "Figure", "Details"]

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


#: The release that stops answering a label's key from :attr:`Prediction.details`.
LABELS_IN_DETAILS_REMOVED_IN = "0.2"


def _warn_label_read(key: str) -> None:
    warnings.warn(f"Prediction.details[{key!r}] is a label: read Prediction.labels[{key!r}] (details holds numbers "
                  f"only; reading a label from details is removed in dippm-nas {LABELS_IN_DETAILS_REMOVED_IN})",
                  DeprecationWarning, stacklevel=3)


class Details(dict):  # type: ignore[type-arg]
    """:attr:`Prediction.details`: named numbers (``dict[str, float]``, units in the keys).

    A read of a key that is a label of the prediction (``"runtime"``, ``"deployment"``,
    ``"deployment_assumed"``: :attr:`Prediction.labels`) through ``[]``, ``get`` or ``in`` answers the label
    with a :class:`DeprecationWarning` until dippm-nas 0.2; iteration, ``len`` and ``items`` see numbers only.
    """

    def __init__(self, data: Any = (), labels: Mapping[str, str] | None = None) -> None:
        super().__init__(data)
        self._labels: Mapping[str, str] = labels if labels is not None else {}

    def __missing__(self, key: str) -> Any:
        if key in self._labels:
            _warn_label_read(key)
            return self._labels[key]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if key in self._labels:
            _warn_label_read(key)
            return self._labels[key]
        return default

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        if key in self._labels:
            _warn_label_read(str(key))
            return True
        return False

    def __reduce__(self) -> tuple[Any, ...]:
        return (Details, (dict(self), dict(self._labels)))


#: The figures of a :class:`Prediction` by name, with the field holding each one's source.
_FIGURE_SOURCE = {"latency_ms": "latency_source", "energy_j": "energy_source", "memory_mib": "memory_source"}


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one model at one input spec on one device.

    Attributes:
        latency_ms: time of one forward pass of a batch, milliseconds.
        energy_j: energy of one forward pass of a batch, joules; ``None`` (source ``"unavailable"``) only
            for devices without power figures, such as a host CPU without a RAPL counter.
        memory_mib: peak device memory while running it, MiB (2**20 bytes): on a GPU the whole process as
            ``nvidia-smi`` sees it, ``CUDA context + reserved_mib``.
        latency_ms_std, energy_j_std, memory_mib_std: one standard deviation of each figure
            (``None`` when the source gives no uncertainty).
        latency_source, energy_source, memory_source: one of :data:`SOURCES`.
        device: device id of the catalogue, e.g. ``"a100-sxm4-40gb"``.
        batch_size: batch size the figures are for.
        dtype: compute dtype.
        mig: the MIG advisor's answer (``None`` for devices without MIG or when not asked).
        unknown_ops: ``{op: count}`` of operators without a formula/encoder (the answer is flagged).
        details: extra named numbers (memory parts, host/GPU time split, flags as 0/1...), units in the keys
            (:class:`Details`, a ``dict[str, float]``).
        host_ms: the host timeline of one pass on a GPU (host time issuing the operators for the
            prediction's execution runtime, ``labels["runtime"]``), ms; ``None`` for a CPU device.
        gpu_ms: the GPU timeline: the kernels' busy time, ms; ``latency_ms`` is the critical path through
            both (``details["host_bound"] = 1`` when the host sets the pace); ``None`` for a CPU device.
        allocated_mib: what ``torch.cuda.max_memory_allocated()`` would read after the pass, MiB (weights, input,
            workspaces and activations in the caching allocator's blocks); ``None`` when the source does not
            model PyTorch's allocator (a CPU device). Taken from ``details["allocated_mib"]`` when not given.
        reserved_mib: what ``torch.cuda.max_memory_reserved()`` would read, MiB (the allocator's segments:
            ``allocated_mib`` plus fragmentation and rounding); ``None`` as for ``allocated_mib``. Taken from
            ``details["reserved_mib"]`` when not given.
        labels: named texts: ``runtime`` (the execution runtime), ``deployment`` (:attr:`Deployment.label
            <dippm_nas.Deployment.label>`), ``deployment_assumed`` (the settings the deployment left undescribed,
            comma-joined; ``""`` when none), ``deployment_from_process`` (the undescribed settings taken from the
            running process's torch and its version, e.g. ``"framework,tf32 (torch 2.13.0)"``; ``""`` when none). A text passed in ``details`` is moved here with a
            :class:`DeprecationWarning` (until dippm-nas 0.2).
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
    labels: dict[str, str] = field(default_factory=dict)
    allocated_mib: float | None = None
    reserved_mib: float | None = None

    def __post_init__(self) -> None:
        self._split_details()
        for name in ("allocated_mib", "reserved_mib"):
            v = getattr(self, name)
            if v is None and isinstance(self.details.get(name), Real):
                v = float(self.details[name])
                object.__setattr__(self, name, v)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                raise InvalidValueError(f"Prediction.{name} must be a finite number >= 0 or None, got {v!r}")
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

    def _split_details(self) -> None:
        """``details`` as :class:`Details` of numbers, ``labels`` of texts; texts found in ``details`` move over."""
        labels = dict(self.labels)
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidValueError(f"Prediction.labels maps names to texts, got {k!r}: {v!r}")
        numbers: dict[str, float] = {}
        moved = []
        for k, v in dict.items(self.details):
            if isinstance(v, str):
                labels.setdefault(k, v)
                moved.append(k)
            elif not isinstance(v, Real):
                raise InvalidValueError(f"Prediction.details holds numbers (texts go in labels), got {k!r}: {v!r}")
            else:
                numbers[k] = v
        if moved:
            warnings.warn(f"texts in Prediction.details are deprecated (removed in dippm-nas "
                          f"{LABELS_IN_DETAILS_REMOVED_IN}): pass labels={{...}}; moved {sorted(moved)} to labels",
                          DeprecationWarning, stacklevel=4)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "details", Details(numbers, labels))

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
        """JSON-able dict with the same keys as the dataclass fields. ``details`` repeats the labels beside the
        numbers, so readers of ``details["runtime"]`` keep working until dippm-nas 0.2; read ``labels``."""
        d = asdict(self)
        mig = self.mig
        d["mig"] = mig.to_dict() if hasattr(mig, "to_dict") else mig
        d["details"] = {**dict(self.details), **self.labels}
        d["labels"] = dict(self.labels)
        return d
