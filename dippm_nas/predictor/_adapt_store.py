"""Where adaptations live and how a prediction reads one: in the study's storage or in
``<cache dir>/adaptations.sqlite``.

The tables and their checksums are :mod:`~dippm_nas.predictor._adapt_rows`; the store that writes them (and reads
any database) is :class:`~dippm_nas.predictor.AdaptationStore` (:mod:`~dippm_nas.predictor._adapt_sql`), opened by
:func:`open_adaptation_store`. A refit reads every row of the key (:meth:`AdaptationStore.rows_checked`), so the
newest version is fitted on all rows: ``adapt`` saves, then checks that no row arrived meanwhile, and refits when
one did.

SQLite files are read with the standard library's ``sqlite3`` (:func:`read_newest`): a prediction that loads
an adaptation does not load SQLAlchemy. Writes and other databases (PostgreSQL) go through SQLAlchemy. Whatever
the database holds, :func:`read_newest` returns a typed :class:`StoredAdaptation`, ``None``, or raises an
:class:`~dippm_nas.errors.AdaptationError` naming the store with its password masked (a file that is not a
database, a table of another layout, a column of another type); the predictor flags and ignores it.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

from dippm_nas._redact import redact_url, scrub
from dippm_nas.errors import AdaptationError
from dippm_nas.predictor._adapt_rows import (ADAPT_FILE_NAME, ROWS_TABLE, VERSION_COLUMNS, VERSIONS_TABLE,
                                             StoredAdaptation, default_adapt_url, stored_adaptation)

__all__ = ["StoredAdaptation", "ROWS_TABLE", "VERSIONS_TABLE", "ADAPT_FILE_NAME", "default_adapt_url",
           "open_adaptation_store", "read_newest"]

logger = logging.getLogger(__name__)

#: Seconds a ``sqlite3`` read waits on a locked database.
_BUSY_TIMEOUT_S = 5.0

_NEWEST = (f"SELECT {', '.join(VERSION_COLUMNS)} FROM {VERSIONS_TABLE} WHERE key_digest = ? "
           "ORDER BY version DESC LIMIT 1")


def _sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///FILE`` URL (``None`` for other URLs and in-memory databases)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or "?" in url:
        return None
    rest = url[len(prefix):]
    if rest in ("", ":memory:") or rest.startswith("file:"):
        return None
    return Path(rest)


def open_adaptation_store(url: Any = None) -> Any:
    """An :class:`~dippm_nas.predictor.AdaptationStore` of ``url`` (``None``: :func:`default_adapt_url`); SQLAlchemy
    is loaded here, with the first adaptation written or read from a database that is not a SQLite file.

    Raises:
        AdaptationError: an invalid URL or a store that cannot be opened (the URL's password masked).
        MissingDependencyError: the URL's database driver is not installed.
    """
    from dippm_nas.predictor._adapt_sql import AdaptationStore

    return AdaptationStore(url)


def read_newest(url: Any, key_digest: str) -> StoredAdaptation | None:
    """The newest stored version of a key, read with ``sqlite3`` for a SQLite file (no SQLAlchemy); other URLs
    through :class:`~dippm_nas.predictor.AdaptationStore`. ``None`` when there is none, no file, or no table yet.

    Raises:
        AdaptationError: the store cannot be opened or read (a file that is not a database, tables of another
            layout, a versions row holding a column of another type); the message names the store with its
            password masked.
    """
    url = url or default_adapt_url()
    path = _sqlite_path(url) if isinstance(url, str) else None
    if path is None:
        store = open_adaptation_store(url)
        try:
            return store.newest(key_digest)
        finally:
            store.close()
    if not path.is_file():
        return None
    label = f"adaptation store {redact_url(url)!r}"
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_S)
    except sqlite3.Error as e:
        raise AdaptationError(f"{label}: cannot be opened ({scrub(str(e), url)})") from e
    try:
        try:
            row = conn.execute(_NEWEST, (key_digest,)).fetchone()
        except sqlite3.OperationalError as e:
            if f"no such table: {VERSIONS_TABLE}" in str(e):
                logger.debug("%s has no versions table yet", label)
                return None
            raise AdaptationError(f"{label}: reading the newest version failed ({e}); a table of another "
                                  "layout?") from e
        except sqlite3.Error as e:  # DatabaseError: not a database; others: damaged
            raise AdaptationError(f"{label}: reading the newest version failed: {type(e).__name__}: {e}") from e
    finally:
        conn.close()
    return None if row is None else stored_adaptation(tuple(row))
