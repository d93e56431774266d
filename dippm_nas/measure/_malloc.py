"""A steady CPU allocator for timing: stop glibc ``malloc`` from handing large blocks back to the OS.

glibc serves a large request (above ``M_MMAP_THRESHOLD``, 128 KiB at start) with a fresh ``mmap`` and
unmaps it on ``free``; it also trims the top of the heap above ``M_TRIM_THRESHOLD``. Both thresholds
move at run time (each freed mmapped block raises them), so whether an activation tensor lands on
already-mapped memory or on fresh pages that fault in on first touch depends on *which models the
process ran before*. Measured on the development machine (1 thread, CPU 0 reserved,
``benchmarks/measurement/cpu_allocator.py``, 3 fresh processes per mode): one MBConv net read 22.9 ms with the
thresholds as they were and 17.0 ms with them fixed; a small ResNet showed no difference (3.86 vs 3.95 ms):
how much it matters depends on the sizes of a model's activations. Label noise no predictor can learn.

:func:`steady_allocator` fixes both thresholds (``mallopt``; fixing them also turns glibc's dynamic
adjustment off), so freed blocks are reused and a forward pass touches no fresh pages once warm — the
state of a serving process, and the analogue of PyTorch's caching allocator on a GPU. The process keeps
its peak heap afterwards (RSS does not shrink back), which is why it is a measurement setting
(``MeasureSettings.cpu_allocator``) and applied only when a CPU measurement runs.

A heap that is never trimmed would also hide a model's memory from the RSS-delta reading (its tensors
would reuse pages an earlier model left behind), so :func:`release_free_memory` (``malloc_trim(0)``)
hands the free pages back right before each measurement starts: the model's warm-up faults in what it
needs (that is the peak RSS reading), the timed loop then reuses it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import threading
from typing import Any

__all__ = ["steady_allocator", "release_free_memory", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES"]

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: requests up to this size come from the heap (an older glibc refuses more than 32 MiB on 64-bit: then 32 MiB)
MMAP_THRESHOLD_BYTES = 2**30
_MMAP_THRESHOLD_FALLBACK_BYTES = 32 * 2**20
#: the heap top is never trimmed below this much free memory
TRIM_THRESHOLD_BYTES = 2**31 - 1

_LOCK = threading.Lock()
_STATE: str | None = None


def steady_allocator() -> str:
    """Fix glibc's mmap and trim thresholds for this process (once; later calls return the first answer).

    Returns:
        What the allocator is now, recorded in ``Measurement.environment["allocator"]``:
        ``"glibc steady (mmap_threshold=..., trim_threshold=...)"``, or ``"as-is: <reason>"`` when the
        C library is not glibc (musl, macOS, Windows) or ``mallopt`` refused; the measurement then goes on
        with the allocator as it is, and says so.
    """
    global _STATE
    with _LOCK:
        if _STATE is None:
            _STATE = _apply()
            logger.debug("CPU allocator for timing: %s", _STATE)
        return _STATE


@functools.lru_cache(maxsize=1)
def _glibc() -> tuple[Any, str]:
    """``(the C library, "")`` on Linux glibc, else ``(None, why not)``; looked up once per process."""
    lib, _ = platform.libc_ver()
    if platform.system() != "Linux" or lib != "glibc":
        return None, f"mallopt thresholds need Linux glibc (this is {platform.system()} {lib or 'unknown libc'})"
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError) as e:
        return None, f"mallopt/malloc_trim not found ({e})"
    return libc, ""


def _apply() -> str:
    libc, why = _glibc()
    if libc is None:
        return f"as-is: {why}"
    mmap_bytes = MMAP_THRESHOLD_BYTES
    ok_mmap = libc.mallopt(_M_MMAP_THRESHOLD, mmap_bytes)
    if ok_mmap != 1:
        mmap_bytes = _MMAP_THRESHOLD_FALLBACK_BYTES
        ok_mmap = libc.mallopt(_M_MMAP_THRESHOLD, mmap_bytes)
    ok_trim = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    if ok_mmap != 1 or ok_trim != 1:
        return f"as-is: mallopt refused (mmap_threshold -> {ok_mmap}, trim_threshold -> {ok_trim})"
    return f"glibc steady (mmap_threshold={mmap_bytes}, trim_threshold={TRIM_THRESHOLD_BYTES})"


def release_free_memory() -> bool:
    """Return the heap's free pages to the OS (glibc ``malloc_trim(0)``); ``False`` where that is not
    available (the CPU measurer records it as ``environment["heap_trimmed"]``: an RSS delta may then
    under-read a model's memory)."""
    libc, _ = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
