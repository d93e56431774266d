"""``WarnOnce``: a logger warning said at most once per tag in a process.

A search runs thousands of trials; a fault that repeats on each (a cache that cannot be written, NVML missing,
a trial without a prediction) is worth one line, not thousands.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

__all__ = ["WarnOnce"]


class WarnOnce:
    """``warn(tag, msg, *args)`` logs ``msg % args`` at WARNING the first time ``tag`` is seen (thread-safe).

    Args:
        logger: the module's logger.
        python_warning: also raise a ``RuntimeWarning`` (for messages a notebook user must see).
    """

    def __init__(self, logger: logging.Logger, *, python_warning: bool = False) -> None:
        self._logger = logger
        self._python_warning = python_warning
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, tag: str, msg: str, *args: Any) -> None:
        with self._lock:
            if tag in self._seen:
                return
            self._seen.add(tag)
        self._logger.warning(msg, *args)
        if self._python_warning:
            warnings.warn(msg % args if args else msg, RuntimeWarning, stacklevel=3)  # the caller of the warning site

    def reset(self) -> None:
        """Forget the tags seen (tests)."""
        with self._lock:
            self._seen.clear()
