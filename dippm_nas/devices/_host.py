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
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dippm_nas._paths import CACHE_DIR_ENV, cache_dir
from dippm_nas._platform import cpu_model_name, fixed_threads
from dippm_nas.errors import DeviceError

__all__ = ["CACHE_DIR_ENV", "cache_dir", "host_key", "measure_host", "host_facts", "measure_weight_cache"]

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


#: Weight-bound GEMM of :func:`measure_weight_cache`: 8 rows times a 2 MiB fp32 weight (1024 x 512), the
#: shape of a small MLP's layer at small batch; cycled over this many MiB of distinct weights.
_WC_ROWS, _WC_OUT, _WC_IN = 8, 1024, 512
_WC_TOTALS_MIB = (2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64, 96)
_WC_CALLS = 240


def measure_weight_cache(threads: int | None = None, *, repeats: int = 3) -> tuple[float, float]:
    """How much weight a forward pass can re-read from cache, and how much faster that is than DRAM.

    A weight-bound linear (``_WC_ROWS`` rows, 2 MiB of fp32 weights) is called over a cycle of distinct
    weight tensors totalling 2 to 96 MiB. Small cycles stay in the cache, large ones stream from DRAM;
    this is what a timing loop over a model does to its weights. Each cycle's time per call is the
    median over ``repeats`` sweeps; ``hot`` is that of the smallest cycle, ``cold`` the median of those
    of 48 MiB and more. Another process using the cache at the same time shrinks both figures: run it
    on an otherwise idle machine.

    Returns:
        ``(cache_bytes, speedup)``: the largest cycle whose time per call is still below the geometric
        mean of hot and cold (the cache a model's working set must fit in, which on a shared or virtual
        machine is less than the last-level cache sysfs reports), and ``cold / hot`` (>= 1). When the two
        do not differ by 10 %, ``(0.0, 1.0)``: no cache effect to model.

    Takes about three seconds per sweep. Used when fitting a host operator table
    (:attr:`dippm_nas.prior.OpTable.cache_bytes`).
    """
    import torch

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise DeviceError(f"measure_weight_cache: repeats must be an int >= 1, got {repeats!r}")
    runs: list[list[float]] = []
    with fixed_threads(threads), torch.inference_mode():
        x = torch.randn(_WC_ROWS, _WC_IN)
        for _ in range(repeats):  # whole sweeps, so a busy spell of the machine spoils one sweep, not a size
            per_total = []
            for total in _WC_TOTALS_MIB:
                ws = [torch.randn(_WC_OUT, _WC_IN) for _ in range(max(1, total // 2))]
                for w in ws * 2:  # warm: the cycle's steady state
                    torch.nn.functional.linear(x, w)
                samples = []
                for _ in range(max(3, _WC_CALLS // len(ws))):
                    t0 = time.perf_counter()
                    for w in ws:
                        torch.nn.functional.linear(x, w)
                    samples.append((time.perf_counter() - t0) / len(ws))
                per_total.append(statistics.median(samples))
            runs.append(per_total)
    return _cache_knee(_WC_TOTALS_MIB, [statistics.median(ts) for ts in zip(*runs)])


def _cache_knee(totals_mib: Sequence[float], per_call: Sequence[float]) -> tuple[float, float]:
    """``(cache_bytes, speedup)`` of :func:`measure_weight_cache` from its sweep: time per call against
    the MiB cycled (ascending; the cold figure is the median of the cycles of 48 MiB and more)."""
    hot = per_call[0]
    cold = statistics.median([t for m, t in zip(totals_mib, per_call) if m >= 48])
    if cold < 1.1 * hot:
        return 0.0, 1.0
    mid = math.sqrt(hot * cold)
    fits = 0.0
    for m, t in zip(totals_mib, per_call):
        if t > mid:
            break
        fits = float(m)
    return fits * 2**20, cold / hot


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
