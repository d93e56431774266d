"""Which machine this is and how this process uses it: the CPU model string shared by measurements, the
host device and checkpoints, and the torch thread count held for a block of work."""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cpu_model_name", "fixed_threads"]


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
