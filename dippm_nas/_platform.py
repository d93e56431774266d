"""Which machine this is and how this process uses it: the CPU model string shared by measurements, the
host device and checkpoints, and the torch thread count held for a block of work."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import platform
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cpu_model_name", "cpu_signature", "fixed_threads"]


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[int]:
    """``torch.set_num_threads`` for the block (``None``: keep the current count); yields the count."""
    import torch

    before = torch.get_num_threads()
    n = before if threads is None else threads
    torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def cpu_model_name() -> str:
    """The CPU model from /proc/cpuinfo, else :func:`platform.processor`, else ``"unknown"``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


#: /proc/cpuinfo fields of the first processor that :func:`cpu_signature` keeps, by their key there
_SIGNATURE_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
                     "microcode": "microcode", "cache size": "cache_size"}


@functools.lru_cache(maxsize=1)
def cpu_signature() -> dict[str, str]:
    """What tells two processors with one model string apart: vendor, family, model number, stepping,
    microcode, the cache size /proc/cpuinfo reports and a short hash of the feature flags (empty where
    /proc/cpuinfo is not readable). Virtual machines sold under one name ("AMD EPYC") can sit on different
    processor generations; measurements record this so that a change of host can be seen afterwards."""
    out: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return out
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in _SIGNATURE_FIELDS:
            out[_SIGNATURE_FIELDS[key]] = value
        elif key == "flags":
            out["flags_sha1"] = hashlib.sha1(" ".join(sorted(value.split())).encode()).hexdigest()[:12]
    return out
