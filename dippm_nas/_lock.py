"""An advisory lock on a file shared by processes: ``fcntl.flock`` where the platform has it (Linux, macOS).

The lock lives in its own file beside the data (``<data>.lock``), so the data file can be replaced
atomically (``os.replace``) while the lock is held. The kernel releases it when the holder exits, however it
exits; a holder that hangs is waited for at most ``timeout_s``, after which the caller goes on unlocked
(:func:`file_lock` yields ``False`` and says why in the log).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["file_lock"]

logger = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock
    fcntl = None  # type: ignore[assignment]

#: How often a waiting process tries the lock again, seconds.
_POLL_S = 0.05


@contextmanager
def file_lock(path: str | Path, *, timeout_s: float) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created when missing) for the ``with`` block.

    Args:
        path: the lock file.
        timeout_s: the longest wait for another holder, seconds.

    Yields:
        ``True`` while the lock is held; ``False`` when it could not be had (no ``fcntl`` on this platform,
        the lock file cannot be created, or another process held it for ``timeout_s``): the block runs
        unlocked, and the log says why.
    """
    if fcntl is None:
        yield False
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        logger.info("cannot create the lock file %s (%s); going on without it", path, e)
        yield False
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    logger.warning("the lock %s was held by another process for %.0f s; going on without it",
                                   path, timeout_s)
                    yield False
                    return
                time.sleep(_POLL_S)
            except OSError as e:  # a file system without locks
                logger.info("cannot lock %s (%s); going on without it", path, e)
                yield False
                return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
