"""Which machine this is: the CPU model string shared by measurements, the host device and checkpoints."""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_model_name"]


def cpu_model_name() -> str:
    """The CPU model from /proc/cpuinfo, else :func:`platform.processor`, else ``"unknown"``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
