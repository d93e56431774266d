"""The ``host-cpu`` device: peaks measured on this machine at first use, then cached.

The microbenchmark takes a few hundred milliseconds: the best of a few fp32 ``torch.mm`` calls (GFLOP/s),
the best of a few triad passes ``a = b + s * c`` over arrays much larger than the last-level cache
(GB/s, counting 3 arrays moved), and the median time of a tiny torch op (the per-op dispatch time).
Each timed call also reads the process's CPU time: a call that got less than ``MIN_CPU_SHARE`` of its threads'
wall time ran on a busy machine, and its peak reads low. Such a measurement is marked ``"contended": true``
(with its ``"cpu_share"``), reported once, and measured again at the next use; while every measurement is
contended, each figure keeps the best value seen (a busy machine only ever makes a peak read lower).
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

from dippm_nas._json import read_json_file
from dippm_nas._lock import file_lock
from dippm_nas._logging import WarnOnce
from dippm_nas._paths import CACHE_DIR_ENV, cache_dir
from dippm_nas._platform import cpu_model_name, fixed_threads
from dippm_nas.errors import DeviceError

__all__ = ["CACHE_DIR_ENV", "cache_dir", "host_key", "measure_host", "host_facts", "measure_weight_cache",
           "MIN_CPU_SHARE"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger)

_CACHE_FILE = "host_cpu_benchmark.json"
_FORMAT = 1
#: The largest cache file read, bytes (an entry is under 1 KB).
_MAX_CACHE_BYTES = 4 << 20
#: The longest wait for another process measuring this host, seconds (a measurement takes about a second;
#: a hung holder is waited for this long, then this process measures unlocked).
_LOCK_TIMEOUT_S = 120.0

# Benchmark sizes (the whole run stays within a few hundred ms on a 2-core machine): a 640^3 matmul is
# ~0.5 GFLOP; triad arrays of 4 Mi float32 (16 MiB each, 48 MiB per pass) exceed the caches of
# ordinary CPUs (the result is a DRAM figure only where the last-level cache is smaller than that).
_MM_N = 640
_MM_REPEATS = 5
_TRIAD_ELEMS = 4 * 1024 * 1024
_TRIAD_REPEATS = 5
_DISPATCH_REPEATS = 200
#: The least share of its threads' wall time a timed call must get as CPU time for the measurement to count as
#: uncontended (an idle machine gives 0.95-1.0; a second busy process on the same core gives about 0.5).
MIN_CPU_SHARE = 0.8


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
        best_mm, share_mm = min(_timed(lambda: torch.mm(a, b), threads) for _ in range(_MM_REPEATS))
        flops = 2.0 * _MM_N**3

        x = torch.empty(_TRIAD_ELEMS)
        y = torch.full((_TRIAD_ELEMS,), 1.0)
        z = torch.full((_TRIAD_ELEMS,), 2.0)
        torch.add(y, z, alpha=1.5, out=x)  # warm-up (page faults)
        best_triad, share_triad = min(_timed(lambda: torch.add(y, z, alpha=1.5, out=x), threads)
                                      for _ in range(_TRIAD_REPEATS))
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
        "cpu_share": round(min(share_mm, share_triad), 3),
        "contended": min(share_mm, share_triad) < MIN_CPU_SHARE,
    }


def _timed(fn: Any, threads: int) -> tuple[float, float]:
    """``(wall seconds, CPU share)`` of one call: the process's CPU time over ``threads`` x the wall time."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    wall = max(time.perf_counter() - t0, 1e-9)
    return wall, (time.process_time() - c0) / (wall * max(threads, 1))


def _best_of(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Two contended measurements of one key: each peak at its best (highest rate, lowest dispatch time)."""
    out = dict(new)
    for name in ("fp32_tflops", "bandwidth_gbps"):
        out[name] = max(old[name], new[name])
    out["host_dispatch_us"] = min(old["host_dispatch_us"], new["host_dispatch_us"])
    out["cpu_share"] = max(old.get("cpu_share", 0.0), new.get("cpu_share", 0.0))
    return out


def host_facts(*, refresh: bool = False, threads: int | None = None) -> dict[str, Any]:
    """This host's measured facts, from the cache when its key matches, else measured and cached.

    Args:
        refresh: measure again even when a cached entry exists.
        threads: the torch thread count the facts are for (default: this process's current count); a
            host-cpu checkpoint asks for the count its labels were measured with.

    The cache file is read, measured into and replaced under a file lock (``host_cpu_benchmark.json.lock``),
    so processes starting together measure one at a time (never competing for the CPU, which would cache
    a low figure) and the others read the result; each writer merges its entry into the file as it is then,
    keeping other thread counts' entries. A cache file that cannot be read, or an entry whose facts have the
    wrong keys or types, is reported (one warning) and measured again; a file that cannot be written is
    reported once and the measurement is still returned.
    """
    key = host_key(threads)
    path = cache_dir() / _CACHE_FILE
    with file_lock(path.with_name(path.name + ".lock"), timeout_s=_LOCK_TIMEOUT_S):
        entries = _read_entries(path)
        cached = entries.get(key)
        problem = _facts_problem(cached, key) if key in entries else "absent"
        if not refresh and problem is None and not cached.get("contended"):
            return dict(cached)
        if problem not in (None, "absent"):
            _warn_once(f"{path}:{key}:{problem}", "ignoring the host benchmark cache entry %r of %s: %s; measured "
                       "again", key, path, problem)
        logger.info("measuring host-cpu peaks (cached in %s)", path)
        facts = measure_host(threads)
        if facts.get("contended"):
            if problem is None and cached.get("contended") and not refresh:
                facts = _best_of(cached, facts)
            _warn_once(f"contended:{path}:{key}", "the host-cpu microbenchmark ran on a busy machine (the process "
                       "got %.0f %% of its threads' time, under %.0f %%): host-cpu peaks may read low; they are "
                       "measured again at the next use", 100 * facts["cpu_share"], 100 * MIN_CPU_SHARE)
        _write_entries(path, {**entries, key: facts})
    return facts


def _read_entries(path: Path) -> dict[str, Any]:
    """The entries of the cache file (``{}``, with a warning, when it is missing or unreadable)."""
    if not path.exists():
        return {}
    try:
        blob = read_json_file(path, f"unreadable host benchmark cache {path}", DeviceError, max_bytes=_MAX_CACHE_BYTES)
    except DeviceError as e:
        _warn_once(f"{path}:{e}", "ignoring %s; measured again", e)
        return {}
    if not isinstance(blob, dict) or blob.get("format") != _FORMAT or not isinstance(blob.get("entries"), dict):
        fmt = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        _warn_once(f"{path}:format:{fmt!r}", "ignoring host benchmark cache %s: not a format-%d file of "
                   "entries (format %r); measured again", path, _FORMAT, fmt)
        return {}
    return dict(blob["entries"])


def _write_entries(path: Path, entries: dict[str, Any]) -> None:
    """Replace the cache file atomically; a failure is reported once (the measurement is used anyway)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".host_cpu_", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": _FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        _warn_once(f"write:{path}", "could not write the host benchmark cache %s: %s (the measurement is used "
                   "anyway)", path, e)


def _facts_problem(facts: Any, key: str) -> str | None:
    """Why a cached entry cannot be used as :func:`measure_host`'s facts of ``key`` (``None``: it can)."""
    if not isinstance(facts, dict):
        return f"an entry must be an object of facts, got {type(facts).__name__}"
    missing = sorted(set(_FACT_RULES) - set(facts))
    if missing:
        return f"missing facts {missing}"
    for name, (rule, ok) in _FACT_RULES.items():
        if not ok(facts[name]):
            return f"{name} must be {rule}, got {facts[name]!r}"
    if facts["key"] != key:
        return f"its key {facts['key']!r} is not the entry's {key!r}"
    return None


def _positive_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


#: What each fact of :func:`measure_host` must be, in words and as a test.
_FACT_RULES: dict[str, tuple[str, Any]] = {
    "fp32_tflops": ("a finite number > 0", _positive_number),
    "bandwidth_gbps": ("a finite number > 0", _positive_number),
    "host_dispatch_us": ("a finite number > 0", _positive_number),
    "memory_gib": ("a finite number > 0", _positive_number),
    "l2_mib": ("a finite number > 0 or null", lambda v: v is None or _positive_number(v)),
    "sms": ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "name": ("a string", lambda v: isinstance(v, str)),
    "architecture": ("a string", lambda v: isinstance(v, str)),
    "key": ("a string", lambda v: isinstance(v, str)),
    "measured_at": ("a string", lambda v: isinstance(v, str)),
}
