"""A conversion cache's SQLite file that is not a database (truncated, overwritten): recognised when opening fails,
and moved aside so a new cache starts in its place."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy.engine import URL

from dippm_nas._logging import WarnOnce

__all__ = ["sqlite_file", "move_aside_if_not_a_database"]

logger = logging.getLogger(__name__)

#: for what a notebook user must see too (a cache file moved aside)
_warn_user_once = WarnOnce(logger, python_warning=True)


def _not_a_database(e: BaseException) -> bool:
    """Whether an error raised while opening a SQLite file says the file is not a (sound) database."""
    cause: BaseException | None = e
    while cause is not None:
        if type(cause) is sqlite3.DatabaseError:  # the subclasses are locks, constraints, misuse
            return True
        text = str(cause)
        if "file is not a database" in text or "database disk image is malformed" in text:
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _is_sound_sqlite(path: str) -> bool:
    """Whether ``path`` opens as a SQLite database and passes a quick check (read only)."""
    try:
        conn = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True, timeout=1.0)
        try:
            return conn.execute("PRAGMA quick_check(1)").fetchone()[0] == "ok"
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def sqlite_file(url: URL) -> str | None:
    """The path of the SQLite file of ``url``, or ``None`` (another database, in memory, a URI)."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or "mode=memory" in database:
        return None
    return str(Path(database).expanduser().absolute())


def move_aside_if_not_a_database(url: URL, e: BaseException) -> bool:
    """When opening failed because the SQLite file of ``url`` is not a database: rename it (and its WAL and
    shared-memory files) to ``<file>.corrupt-<unix time>-<pid>``, warn once, and return ``True``."""
    path = sqlite_file(url)
    if path is None or not _not_a_database(e) or not os.path.isfile(path) or _is_sound_sqlite(path):
        return False
    aside = f"{path}.corrupt-{int(time.time())}-{os.getpid()}"
    try:
        os.replace(path, aside)
    except FileNotFoundError:  # another process moved it first
        return True
    except OSError as err:
        logger.debug("conversion cache: cannot move %s aside: %s", path, err)
        return False
    for suffix in ("-wal", "-shm"):
        try:
            os.replace(path + suffix, aside + suffix)
        except OSError:
            pass
    _warn_user_once(
        f"moved:{path}",
        "conversion cache: %s is not a SQLite database (%s); moved aside to %s and started a new cache",
        path, e.__cause__ or e, aside,
    )
    return True
