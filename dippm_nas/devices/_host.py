"""The ``host-cpu`` device: peaks measured on this machine at first use, then cached.

The microbenchmark takes a few hundred milliseconds: the best of a few fp32 ``torch.mm`` calls (GFLOP/s),
the best of a few triad passes ``a = b + s * c`` over arrays much larger than the last-level cache
(GB/s, counting 3 arrays moved), and the median time of a tiny torch op (the per-op dispatch time).
Results are cached as JSON in ``$DIPPM_NAS_CACHE_DIR`` (default ``~/.cache/dippm-nas``) under a key made
of the CPU model, the torch thread count and the torch version, so a different machine, thread
setting or torch build measures again.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dippm_nas._paths import CACHE_DIR_ENV, cache_dir
from dippm_nas._platform import cpu_model_name, fixed_threads
from dippm_nas.errors import DeviceError

__all__ = ["CACHE_DIR_ENV", "cache_dir", "host_key", "measure_host", "host_facts"]

logger = logging.getLogger(__name__)

_CACHE_FILE = "host_cpu_benchmark.json"
_FORMAT = 1

# Benchmark sizes (the whole run stays within a few hundred ms on a 2-core machine): a 640^3 matmul is
# ~0.5 GFLOP; triad arrays of 4 Mi float32 (16 MiB each, 48 MiB per pass) exceed the caches of
# ordinary CPUs (the result is a DRAM figure only where the last-level cache is smaller than that).
_MM_N = 640
_MM_REPEATS = 5
_TRIAD_ELEMS = 4 * 1024 * 1024
_TRIAD_REPEATS = 5
_DISPATCH_REPEATS = 200


def host_key(threads: int | None = None) -> str:
    """Cache key of this host's measurement: CPU model, torch threads (default: this process's current
    count) and torch version."""
    import torch

    n = torch.get_num_threads() if threads is None else _check_threads(threads)
    return f"{cpu_model_name()}|threads={n}|torch={torch.__version__}"


def _check_threads(threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise DeviceError(f"host-cpu threads must be a positive integer (torch intra-op threads), got {threads!r}")
    return threads


def _memory_gib() -> float:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 2**30
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError) as e:
        raise DeviceError(f"cannot read the host memory size for host-cpu: {e}") from e


def _llc_mib() -> float | None:
    """Largest cache level of cpu0 from sysfs, MiB; ``None`` when unreadable."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best: float | None = None
    try:
        for idx in base.glob("index*"):
            size = (idx / "size").read_text().strip()
            mult = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}.get(size[-1:].upper())
            value = float(size[:-1]) * mult if mult else float(size) / 2**20
            best = value if best is None else max(best, value)
    except (OSError, ValueError):
        return None
    return best


def measure_host(threads: int | None = None) -> dict[str, Any]:
    """Run the microbenchmark now (no cache) and return the measured facts.

    Args:
        threads: torch intra-op threads to measure with (set for the measurement and restored after);
            default: this process's current count.

    Returns:
        ``{"fp32_tflops", "bandwidth_gbps", "host_dispatch_us", "sms", "memory_gib", "l2_mib",
        "name", "architecture", "key", "measured_at"}``; ``l2_mib`` is ``None`` when sysfs has no
        cache sizes.
    """
    import torch

    if threads is not None and _check_threads(threads) != torch.get_num_threads():
        with fixed_threads(threads):
            return measure_host()
    threads = torch.get_num_threads()
    with torch.inference_mode():
        a = torch.randn(_MM_N, _MM_N)
        b = torch.randn(_MM_N, _MM_N)
        torch.mm(a, b)  # warm-up (thread pool, packing buffers)
        best_mm = min(_timed(lambda: torch.mm(a, b)) for _ in range(_MM_REPEATS))
        flops = 2.0 * _MM_N**3

        x = torch.empty(_TRIAD_ELEMS)
        y = torch.full((_TRIAD_ELEMS,), 1.0)
        z = torch.full((_TRIAD_ELEMS,), 2.0)
        torch.add(y, z, alpha=1.5, out=x)  # warm-up (page faults)
        best_triad = min(_timed(lambda: torch.add(y, z, alpha=1.5, out=x)) for _ in range(_TRIAD_REPEATS))
        moved = 3.0 * _TRIAD_ELEMS * 4

        t = torch.ones(1)
        samples = []
        for _ in range(_DISPATCH_REPEATS):
            t0 = time.perf_counter()
            torch.add(t, t)
            samples.append(time.perf_counter() - t0)
        dispatch_us = statistics.median(samples) * 1e6
    return {
        "fp32_tflops": flops / best_mm / 1e12,
        "bandwidth_gbps": moved / best_triad / 1e9,
        "host_dispatch_us": dispatch_us,
        "sms": int(threads),
        "memory_gib": _memory_gib(),
        "l2_mib": _llc_mib(),
        "name": f"{cpu_model_name()} ({threads} threads)",
        "architecture": platform.machine() or "unknown",
        "key": host_key(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return max(time.perf_counter() - t0, 1e-9)


def host_facts(*, refresh: bool = False, threads: int | None = None) -> dict[str, Any]:
    """This host's measured facts, from the cache when its key matches, else measured and cached.

    Args:
        refresh: measure again even when a cached entry exists.
        threads: the torch thread count the facts are for (default: this process's current count); a
            host-cpu checkpoint asks for the count its labels were measured with.

    A cache file that cannot be read is reported and replaced; one that cannot be written is
    reported once and the measurement is still returned.
    """
    key = host_key(threads)
    path = cache_dir() / _CACHE_FILE
    entries: dict[str, Any] = {}
    if path.is_file():
        try:
            blob = json.loads(path.read_text(encoding="utf-8"))
            if blob.get("format") == _FORMAT and isinstance(blob.get("entries"), dict):
                entries = blob["entries"]
            else:
                logger.warning("ignoring host benchmark cache %s: unknown format %r", path, blob.get("format"))
        except (OSError, ValueError) as e:
            logger.warning("ignoring unreadable host benchmark cache %s: %s", path, e)
    if not refresh and key in entries:
        return dict(entries[key])
    logger.info("measuring host-cpu peaks (first use on this host; cached in %s)", path)
    facts = measure_host(threads)
    entries[key] = facts
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".host_cpu_", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": _FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("could not write the host benchmark cache %s: %s (the measurement is used anyway)", path, e)
    return facts
