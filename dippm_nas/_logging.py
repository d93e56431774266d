"""``WarnOnce``: a warning said at most once per tag in a process, on one channel.

A search runs thousands of trials; a fault that repeats on each (a cache that cannot be written, NVML missing,
a trial without a prediction) is worth one line, not thousands.

One channel per message, as the standard library advises: a message the caller can act on (a device without a
checkpoint, a cache that cannot be written) is a ``RuntimeWarning`` (``python_warning=True``), shown once by
Python's warning machinery and filterable with ``warnings.filterwarnings``; it is also logged, at DEBUG, so a
log file keeps it. Anything else is a logger WARNING. The CLI routes warnings into its log
(``logging.captureWarnings``), so each message prints once there too.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

__all__ = ["WarnOnce"]


class WarnOnce:
    """``warn(tag, msg, *args)`` says ``msg % args`` the first time ``tag`` is seen (thread-safe).

    Args:
        logger: the module's logger.
        python_warning: say it as a ``RuntimeWarning`` (logged at DEBUG as well) instead of a logger WARNING:
            for messages the caller can act on, which a notebook user must see.
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
        if self._python_warning:
            self._logger.debug(msg, *args)
            warnings.warn(msg % args if args else msg, RuntimeWarning, stacklevel=3)  # the caller of the warning site
        else:
            self._logger.warning(msg, *args)

    def reset(self) -> None:
        """Forget the tags seen (tests)."""
        with self._lock:
            self._seen.clear()
