"""Energy from sampled power: the fallback for GPUs without NVML's total-energy counter (before Volta).

A background thread reads board power every ``interval_s`` (10 ms by default) while the forwards
run; the energy of the window is the trapezoid integral ``E = sum((P[i] + P[i+1]) / 2 * (t[i+1] - t[i]))``
in joules (watts times seconds). One sample is taken synchronously at :meth:`PowerSampler.start` and
one at :meth:`PowerSampler.stop`, so the integral spans the whole window.

Limits: NVML's power reading is itself an average over a driver-defined window (tens of ms to 1 s
depending on the GPU), so spikes shorter than that are smoothed, and windows much shorter than a
second are unreliable; the energy counter, where it exists, is preferred.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from dippm_nas._numbers import as_reals
from dippm_nas.errors import MeasurementError
from dippm_nas.measure._nvml import NvmlAdapter
from dippm_nas.measure._stopping import Clock

__all__ = ["PowerSampler", "trapezoid_energy_j"]

logger = logging.getLogger(__name__)

_MW_PER_W = 1000.0


def trapezoid_energy_j(times_s: Sequence[float], power_w: Sequence[float]) -> float:
    """Trapezoid integral of power over time: joules from seconds and watts.

    Raises:
        MeasurementError: fewer than two samples, mismatched lengths, times going backwards,
            or non-finite/negative power; either not a sequence of numbers.
    """
    times_s = as_reals(times_s, "sample times (s)", error=MeasurementError)
    power_w = as_reals(power_w, "power samples (W)", finite=False, error=MeasurementError)
    if len(times_s) != len(power_w):
        raise MeasurementError(f"times and power need equal lengths, got {len(times_s)} and {len(power_w)}")
    if len(times_s) < 2:
        raise MeasurementError(f"an energy integral needs at least 2 power samples, got {len(times_s)}")
    energy = 0.0
    for i in range(len(times_s) - 1):
        dt = times_s[i + 1] - times_s[i]
        if dt < 0:
            raise MeasurementError(f"sample times must not decrease, got {times_s[i]} then {times_s[i + 1]}")
        energy += 0.5 * (power_w[i] + power_w[i + 1]) * dt
    for p in power_w:
        if not math.isfinite(p) or p < 0:
            raise MeasurementError(f"power samples must be finite and >= 0 W, got {p!r}")
    return energy


class PowerSampler:
    """Samples NVML board power in a background thread; integrates it with :func:`trapezoid_energy_j`.

    Args:
        nvml: an initialised :class:`NvmlAdapter`.
        handle: the physical GPU's handle.
        interval_s: sampling period, seconds.
        clock: seconds clock used for the sample times.

    Use as ``start()`` ... ``stop()`` then :meth:`energy_j`; a context manager does start/stop.
    """

    def __init__(
        self, nvml: NvmlAdapter, handle: Any, interval_s: float = 0.01, clock: Clock = time.perf_counter
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise MeasurementError(f"interval_s must be a finite number > 0, got {interval_s!r}")
        self._nvml = nvml
        self._handle = handle
        self._interval_s = interval_s
        self._clock = clock
        self._times: list[float] = []
        self._power_w: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def _sample(self) -> None:
        p = self._nvml.power_mw(self._handle) / _MW_PER_W
        t = self._clock()
        with self._lock:
            self._times.append(t)
            self._power_w.append(p)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval_s):
                self._sample()
        except BaseException as e:  # kept and re-raised by stop(): never lost
            self._error = e

    def start(self) -> None:
        """Take the first sample now and start the sampling thread."""
        self._sample()
        self._thread = threading.Thread(target=self._run, name="dippm-nas-power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and take the last sample.

        Raises:
            MeasurementError: when a sample in the thread failed.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            err = self._error
            raise MeasurementError(f"power sampling failed: {err}") from err
        self._sample()

    def __enter__(self) -> "PowerSampler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def n_samples(self) -> int:
        return len(self._times)

    @property
    def span_s(self) -> float:
        """Seconds between the first and the last sample."""
        return self._times[-1] - self._times[0] if self._times else 0.0

    def energy_j(self) -> float:
        """Energy of the sampled window, joules."""
        with self._lock:
            return trapezoid_energy_j(self._times, self._power_w)

    def mean_power_w(self) -> float:
        """Time-weighted mean power of the window, watts."""
        span = self.span_s
        if span <= 0:
            raise MeasurementError("mean power needs a window longer than zero seconds")
        return self.energy_j() / span
