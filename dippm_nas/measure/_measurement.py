"""What a measurement returns (:class:`Measurement`) and what it is taken with (:class:`MeasureSettings`).

Failed rows
-----------
A measurement never crashes on a model fault; it returns a row whose ``status`` says what happened:

- ``"ok"``: every figure that could be measured is there; ``latency_ms`` and ``latency_ms_std`` are
  finite, ``n_repeats >= settings.min_repeats``.
- ``"oom"``: the model (or its inputs) did not fit in memory (CUDA or host). The model does not fit on
  the device at this batch size; that is a result, not an error.
- ``"timeout"``: the time cap ran out before ``min_repeats`` timed forwards were collected.
- ``"error"``: the model raised something else (wrong input shape, an op missing for the dtype...).

For a row with ``status != "ok"`` ``reason`` says why, and the figures hold what was measured before
the fault (a timeout after three forwards keeps their mean in ``latency_ms``) or ``None`` where
nothing was measured. ``memory_mib`` is set on ``"ok"`` and ``"timeout"`` rows only (on ``"oom"`` and
``"error"`` rows the figures taken up to the fault stay in ``memory_parts_mib``: they describe a run that
did not finish). A figure is never ``0`` or ``NaN`` to mean "missing". ``energy_j`` is ``None``
whenever energy was not measured, also on ``"ok"`` rows (no counter on the host, a MIG instance);
``energy_reason`` then says why.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any, Literal

from dippm_nas.errors import MeasurementError

__all__ = [
    "Measurement",
    "MeasureSettings",
    "Status",
    "STATUSES",
    "STOP_REASONS",
    "ENERGY_SOURCES",
    "MEMORY_SOURCES",
    "AUTOCAST_DTYPES",
]

Status = Literal["ok", "oom", "timeout", "error"]
#: Outcome of a measurement; see the module docstring.
STATUSES: tuple[str, ...] = ("ok", "oom", "timeout", "error")
#: Why the timed loop ended: the 95% CI reached the target, the repeat limit, or the time cap.
#: ``"rounds"``: the latency was timed in a fixed number of interleaved rounds over a group of models
#: (:func:`dippm_nas.measure.time_interleaved`, ``build_dataset(rounds=...)``), not by the stopping rule.
STOP_REASONS: tuple[str, ...] = ("converged", "max_repeats", "time_cap", "rounds")
#: ``"nvml_energy_counter"``: NVML's total-energy counter (Volta and newer), whole board;
#: ``"nvml_power_sampling"``: trapezoid integral of NVML board power sampled in a thread;
#: ``"rapl_package"``: Intel RAPL package counter (whole CPU package, every process on it).
ENERGY_SOURCES: tuple[str, ...] = ("nvml_energy_counter", "nvml_power_sampling", "rapl_package")
#: ``"nvml_used"``: NVML device memory "used" after the run (device-wide, includes the CUDA context and
#: every process on the GPU; what DIPPM measured); ``"torch_max_reserved"``: the PyTorch caching
#: allocator's peak reserved bytes (no context); ``"rss_delta"``: host peak RSS minus RSS before the run.
MEMORY_SOURCES: tuple[str, ...] = ("nvml_used", "torch_max_reserved", "rss_delta")
#: Dtypes ``MeasureSettings.autocast`` accepts.
AUTOCAST_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
#: values of ``MeasureSettings.cpu_allocator``
CPU_ALLOCATORS: tuple[str, ...] = ("steady", "as-is")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class MeasureSettings:
    """Everything that changes a timing, set explicitly and recorded in ``Measurement.environment``.

    Args:
        warmup: untimed forwards before the timed loop (cuDNN autotuning, allocator growth, lazy
            init). Default 10.
        min_repeats: timed forwards at least (>= 2, a standard deviation needs two). Default 10.
        max_repeats: timed forwards at most. Default 1000.
        rel_ci_target: stop when the half-width of the 95% Student-t confidence interval of the mean
            latency is at most this fraction of the mean. Default 0.02 (2%).
        time_cap_s: wall-clock budget of warm-up plus timed loop, seconds. Reaching it with at least
            ``min_repeats`` samples ends the loop normally (``stop_reason="time_cap"``); reaching it
            with fewer gives ``status="timeout"``. The cap is checked between forwards: one forward
            that hangs is not interrupted. Default 30.
        energy_window_s: length of the separate energy window (back-to-back forwards), seconds. NVML's
            counter and power readings update every few to ~100 ms, so short windows are meaningless.
            Default 1.0.
        power_sample_interval_s: period of the power-sampling fallback, seconds. Default 0.01.
        threads: CPU intra-op threads (``torch.set_num_threads``) during the measurement, restored
            afterwards; ``None`` keeps the current count (and records it). Also affects the host side
            of a CUDA run.
        tf32: CUDA only. ``True``/``False`` set both ``torch.backends.cudnn.allow_tf32`` and
            ``torch.backends.cuda.matmul.allow_tf32`` for the run (restored afterwards); ``None`` leaves
            PyTorch's flags as they are (default: TF32 on for cuDNN convolutions, off for matmuls).
            The flags in force are recorded either way.
        cudnn_benchmark: CUDA only. ``torch.backends.cudnn.benchmark`` during the run. Default False.
        channels_last: run the model and its 4-D floating-point inputs in ``torch.channels_last``.
        autocast: ``None`` (default) or ``"float16"``/``"bfloat16"``: keep the model in float32 and run
            it under ``torch.autocast`` with this dtype. Without it, an :class:`~dippm_nas.InputSpec`
            dtype of float16/bfloat16 casts the model (``model.half()``-style), as capture does.
        cpu_allocator: CPU only. ``"steady"`` (default) fixes glibc malloc's mmap and trim thresholds in
            the measuring process before timing, so freed activation memory is reused rather than
            returned to the OS and faulted in again: without it a timing depends on which models the
            process ran before (one MBConv net in a fresh process: 22.9 ms vs 17.0 ms steady; see
            :mod:`dippm_nas.measure._malloc`). The process keeps its peak heap afterwards. ``"as-is"``
            leaves the allocator alone. What was in force is recorded in ``environment["allocator"]``.
    """

    warmup: int = 10
    min_repeats: int = 10
    max_repeats: int = 1000
    rel_ci_target: float = 0.02
    time_cap_s: float = 30.0
    energy_window_s: float = 1.0
    power_sample_interval_s: float = 0.01
    threads: int | None = None
    tf32: bool | None = None
    cudnn_benchmark: bool = False
    channels_last: bool = False
    autocast: str | None = None
    cpu_allocator: str = "steady"

    def __post_init__(self) -> None:
        if not _is_int(self.warmup) or self.warmup < 0:
            raise MeasurementError(f"warmup must be an int >= 0, got {self.warmup!r}")
        if not _is_int(self.min_repeats) or self.min_repeats < 2:
            raise MeasurementError(
                f"min_repeats must be an int >= 2 (a standard deviation needs two samples), got {self.min_repeats!r}"
            )
        if not _is_int(self.max_repeats) or self.max_repeats < self.min_repeats:
            raise MeasurementError(
                f"max_repeats must be an int >= min_repeats ({self.min_repeats}), got {self.max_repeats!r}"
            )
        for name in ("rel_ci_target", "time_cap_s", "energy_window_s", "power_sample_interval_s"):
            v = getattr(self, name)
            if not _is_number(v) or not math.isfinite(v) or v <= 0:
                raise MeasurementError(f"{name} must be a finite number > 0, got {v!r}")
        if self.threads is not None and (not _is_int(self.threads) or self.threads < 1):
            raise MeasurementError(f"threads must be None or an int >= 1, got {self.threads!r}")
        if self.tf32 not in (None, True, False):
            raise MeasurementError(f"tf32 must be None, True or False, got {self.tf32!r}")
        for name in ("cudnn_benchmark", "channels_last"):
            if not isinstance(getattr(self, name), bool):
                raise MeasurementError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.cpu_allocator not in CPU_ALLOCATORS:
            raise MeasurementError(f"cpu_allocator must be one of {CPU_ALLOCATORS}, got {self.cpu_allocator!r}")
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES:
            raise MeasurementError(f"autocast must be None or one of {AUTOCAST_DTYPES}, got {self.autocast!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` rebuilds the settings."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MeasureSettings":
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        _check_keys("MeasureSettings", d, cls)
        return cls(**d)


def _check_keys(what: str, d: Any, cls: type) -> None:
    if not isinstance(d, dict):
        raise MeasurementError(f"{what}.from_dict needs a dict, got {type(d).__name__}")
    valid = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    unknown = sorted(set(d) - valid)
    if unknown:
        raise MeasurementError(f"{what}.from_dict got unknown keys {unknown}; valid keys are {sorted(valid)}")
    missing = sorted(required - set(d))
    if missing:
        raise MeasurementError(f"{what}.from_dict is missing required keys {missing}")


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Measurement:
    """A measured cost of one model at one input spec on one device.

    Attributes:
        latency_ms: mean time of one forward pass of a batch, milliseconds (CUDA events on a GPU,
            ``time.perf_counter`` on the CPU). ``None`` only on a failed row where nothing was timed.
        latency_ms_std: sample standard deviation (ddof=1) of the timed forwards, ms.
        energy_j: energy of one forward pass of a batch, joules; ``None`` when not measurable
            (``energy_reason`` says why). Whole-board (GPU) or whole-package (CPU) energy, including
            idle/static power during the window, divided by the forwards in the window.
        memory_mib: peak memory figure named by ``memory_source``, MiB (2**20 bytes).
        memory_source: one of :data:`MEMORY_SOURCES` or ``None`` when no memory figure exists.
        n_repeats: timed forwards behind ``latency_ms`` (warm-up and energy window not counted).
        device: the torch device measured, ``"cpu"`` or ``"cuda:N"``.
        environment: JSON-able facts of the run: versions, GPU/CPU name, driver, MIG flag, threads,
            the settings and the backend flags in force.
        status: one of :data:`STATUSES` (see the module docstring).
        reason: why the row failed; ``None`` on ``"ok"``.
        latency_ms_median: median of the timed forwards, ms.
        latency_ms_ci95: half-width of the 95% Student-t confidence interval of the mean, ms.
        stop_reason: one of :data:`STOP_REASONS`; ``None`` when the timed loop never ran.
        energy_source: one of :data:`ENERGY_SOURCES`; ``None`` exactly when ``energy_j`` is ``None``.
        energy_reason: why ``energy_j`` is ``None`` (``None`` when energy was measured).
        memory_reason: why ``memory_mib`` is ``None`` on a row that tried to measure it (e.g. an
            in-process RSS delta below the model's own weights: the allocator reused freed memory).
        memory_parts_mib: every memory figure taken, MiB, e.g. ``{"nvml_used_mib": ...,
            "nvml_used_before_mib": ..., "torch_max_reserved_mib": ..., "torch_max_allocated_mib": ...}``
            or ``{"rss_before_mib": ..., "rss_peak_mib": ..., "rss_delta_mib": ...}``.
        details: other named figures, units in the keys (``energy_window_s``,
            ``energy_window_forwards``, ``mean_power_w``, ``elapsed_s``, ``warmup_done``...).
        batch_size: batch size of the input spec.
        dtype: compute dtype of the input spec.
        timestamp: ISO 8601 UTC time the row was made.
    """

    latency_ms: float | None
    latency_ms_std: float | None
    energy_j: float | None
    memory_mib: float | None
    memory_source: str | None
    n_repeats: int
    device: str
    environment: dict[str, Any]
    status: str = "ok"
    reason: str | None = None
    latency_ms_median: float | None = None
    latency_ms_ci95: float | None = None
    stop_reason: str | None = None
    energy_source: str | None = None
    energy_reason: str | None = None
    memory_reason: str | None = None
    memory_parts_mib: dict[str, float] = field(default_factory=dict)
    details: dict[str, float] = field(default_factory=dict)
    batch_size: int | None = None
    dtype: str | None = None
    timestamp: str = field(default_factory=_utc_now)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise MeasurementError(f"Measurement.status must be one of {STATUSES}, got {self.status!r}")
        for name in ("latency_ms", "latency_ms_std", "energy_j", "memory_mib", "latency_ms_median",
                     "latency_ms_ci95"):
            v = getattr(self, name)
            if v is not None and (not _is_number(v) or not math.isfinite(v) or v < 0):
                raise MeasurementError(
                    f"Measurement.{name} must be a finite number >= 0 or None (never NaN for 'missing'), got {v!r}"
                )
        if not _is_int(self.n_repeats) or self.n_repeats < 0:
            raise MeasurementError(f"Measurement.n_repeats must be an int >= 0, got {self.n_repeats!r}")
        if self.status == "ok":
            if self.latency_ms is None or self.latency_ms_std is None or self.n_repeats < 2:
                raise MeasurementError(
                    "an 'ok' Measurement needs latency_ms, latency_ms_std and n_repeats >= 2, got "
                    f"latency_ms={self.latency_ms!r}, latency_ms_std={self.latency_ms_std!r}, "
                    f"n_repeats={self.n_repeats!r}"
                )
            if self.reason is not None:
                raise MeasurementError(f"an 'ok' Measurement has no failure reason, got reason={self.reason!r}")
        elif not self.reason:
            raise MeasurementError(f"a Measurement with status {self.status!r} needs a reason, got {self.reason!r}")
        if self.stop_reason is not None and self.stop_reason not in STOP_REASONS:
            raise MeasurementError(
                f"Measurement.stop_reason must be None or one of {STOP_REASONS}, got {self.stop_reason!r}"
            )
        if self.memory_source is not None and self.memory_source not in MEMORY_SOURCES:
            raise MeasurementError(
                f"Measurement.memory_source must be None or one of {MEMORY_SOURCES}, got {self.memory_source!r}"
            )
        if (self.memory_mib is None) != (self.memory_source is None):
            raise MeasurementError(
                "Measurement.memory_mib and memory_source are both set or both None, got "
                f"memory_mib={self.memory_mib!r}, memory_source={self.memory_source!r}"
            )
        if self.energy_source is not None and self.energy_source not in ENERGY_SOURCES:
            raise MeasurementError(
                f"Measurement.energy_source must be None or one of {ENERGY_SOURCES}, got {self.energy_source!r}"
            )
        if (self.energy_j is None) != (self.energy_source is None):
            raise MeasurementError(
                "Measurement.energy_j and energy_source are both set or both None, got "
                f"energy_j={self.energy_j!r}, energy_source={self.energy_source!r}"
            )
        if self.energy_j is None and self.status == "ok" and not self.energy_reason:
            raise MeasurementError("an 'ok' Measurement without energy_j must say why in energy_reason")

    @property
    def ok(self) -> bool:
        """True when ``status == "ok"``."""
        return self.status == "ok"

    @property
    def rel_ci95(self) -> float | None:
        """``latency_ms_ci95 / latency_ms`` (the figure the stopping rule compares with its target)."""
        if self.latency_ms_ci95 is None or not self.latency_ms:
            return None
        return self.latency_ms_ci95 / self.latency_ms

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict with the dataclass field names as keys; :meth:`from_dict` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        """Rebuild a measurement from :meth:`to_dict` output (e.g. after ``json.loads``)."""
        _check_keys("Measurement", d, cls)
        return cls(**d)
