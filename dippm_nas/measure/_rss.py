"""Host peak resident memory over a window, for CPU measurements.

Method, best first:

- ``"vmhwm_reset"`` (Linux >= 4.0): write ``5`` to ``/proc/self/clear_refs``, which resets the
  kernel's resident high-water mark ``VmHWM`` to the current RSS, run, then read ``VmHWM`` from
  ``/proc/self/status``. Exact for the process, including spikes between samples. Side effect: the
  process's ``VmHWM`` (and what ``ru_maxrss`` reports afterwards) is reset.
- ``"psutil_sampling"``: a thread polls ``psutil.Process().memory_info().rss`` every 2 ms and keeps
  the maximum; short-lived spikes (a large temporary freed within 2 ms) can be missed. psutil is
  optional (``pip install 'dippm-nas[cpu-memory]'``): only systems without ``/proc/self/clear_refs``
  (macOS, Windows, kernels before 4.0) need it, and without either the memory figure is flagged, not
  the measurement.

Limits of any in-process RSS figure: it is process-wide (other threads' allocations count), and the
allocator reuses memory the process freed earlier without growing RSS, so in a long-lived process
the delta can understate what the model needs. For an exact figure measure in a fresh process.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from dippm_nas.errors import MeasurementError
from dippm_nas.units import BYTES_PER_KIB

__all__ = ["PeakRss"]

logger = logging.getLogger(__name__)

_PROC_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_HWM = "5"  # clear_refs code that resets the peak RSS (see proc(5))


def _status_kib(field: str) -> int:
    for line in _PROC_STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise MeasurementError(f"{_PROC_STATUS} has no {field} line")


class PeakRss:
    """Peak RSS of this process between :meth:`start` and :meth:`stop`, bytes.

    Args:
        sample_interval_s: polling period of the ``psutil_sampling`` fallback, seconds.
    """

    def __init__(self, sample_interval_s: float = 0.002) -> None:
        self.method: str | None = None
        self.before_bytes: int | None = None
        self.peak_bytes: int | None = None
        self._interval = sample_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = None

    def start(self) -> None:
        """Record RSS now and start tracking the peak.

        Raises:
            MeasurementError: when neither method is available (no /proc and no psutil).
        """
        try:
            _CLEAR_REFS.write_text(_RESET_HWM)
            self.before_bytes = _status_kib("VmRSS") * BYTES_PER_KIB
            self.method = "vmhwm_reset"
            return
        except (OSError, ValueError, MeasurementError) as e:
            logger.debug("VmHWM reset unavailable (%s); falling back to psutil sampling", e)
        try:
            import psutil
        except ImportError as e:
            raise MeasurementError(
                "host peak memory needs /proc/self/clear_refs (Linux) or the psutil package "
                f"(pip install 'dippm-nas[cpu-memory]'); neither is available: {e}"
            ) from e
        self._proc = psutil.Process()
        self.before_bytes = self._proc.memory_info().rss
        self.peak_bytes = self.before_bytes
        self.method = "psutil_sampling"
        self._thread = threading.Thread(target=self._poll, name="dippm-nas-rss-sampler", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        assert self._proc is not None
        while not self._stop.wait(self._interval):
            rss = self._proc.memory_info().rss
            if self.peak_bytes is None or rss > self.peak_bytes:
                self.peak_bytes = rss

    def stop(self) -> tuple[int, int]:
        """Stop tracking; returns ``(rss_before_bytes, rss_peak_bytes)``."""
        if self.method is None or self.before_bytes is None:
            raise MeasurementError("PeakRss.start() must be called before stop()")
        if self.method == "vmhwm_reset":
            self.peak_bytes = _status_kib("VmHWM") * BYTES_PER_KIB
        else:
            self._stop.set()
            assert self._thread is not None and self._proc is not None
            self._thread.join()
            rss = self._proc.memory_info().rss
            self.peak_bytes = max(self.peak_bytes or 0, rss)
        assert self.peak_bytes is not None
        return self.before_bytes, self.peak_bytes
