"""A hit of the default conversion cache read with the standard library's ``sqlite3``, without SQLAlchemy.

``dippm-nas predict`` of a model whose graph is cached needs one row of one table: loading SQLAlchemy to read
it costs more than the rest of the lookup. :func:`read_default_sqlite` reads that row of the default SQLite file
(``<cache_dir()>/conversion.sqlite``) through the table and column names and the payload decoding of
:mod:`~dippm_nas.cache._rows` (the store's own: key envelope, signature with ``$DIPPM_NAS_CACHE_SECRET``,
graph validation, structural hash), and writes the row's ``last_used_at`` stamp as the store does for a hit,
so eviction order does not depend on which reader served it.

It answers only where the store would have read that same file: no ``$DIPPM_NAS_CACHE_URL`` and no SQLAlchemy
store opened in this process yet (which :func:`~dippm_nas.cache.set_default_cache` needs). Everything else --
no file yet, no such row, a row that does not decode (the store deletes it and says why), a locked or damaged
database -- is ``None``, and the caller goes on with :func:`~dippm_nas.cache.default_cache`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import time

from dippm_nas._paths import CACHE_URL_ENV, SQLITE_FILE_NAME, cache_dir
from dippm_nas.cache._rows import COLUMNS, TABLE_NAME, _CorruptRow, _decode, _secret_bytes
from dippm_nas.errors import CacheError
from dippm_nas.graph import OperatorGraph

__all__ = ["read_default_sqlite"]

logger = logging.getLogger(__name__)

_KEY, _PAYLOAD, _HASH, _SIZE, _CREATED, _USED, _FORMAT, _WRITER = COLUMNS
_SELECT = f"SELECT {_PAYLOAD}, {_HASH}, {_FORMAT} FROM {TABLE_NAME} WHERE {_KEY} = ?"
# the store's stamp of a hit (ConversionCache._flush_touches)
_TOUCH = f"UPDATE {TABLE_NAME} SET {_USED} = ? WHERE {_KEY} = ? AND {_USED} < ?"
#: Seconds a read waits on a locked database before leaving the lookup to the store (which waits longer).
_BUSY_TIMEOUT_S = 1.0


def read_default_sqlite(key: str) -> OperatorGraph | None:
    """The graph stored under ``key`` in the default SQLite cache file, read with ``sqlite3``; ``None`` when
    this reader cannot answer (see the module docstring): the caller then asks the SQLAlchemy store."""
    if os.environ.get(CACHE_URL_ENV, "") or "dippm_nas.cache._store" in sys.modules:
        return None
    path = cache_dir() / SQLITE_FILE_NAME
    if not path.is_file():
        return None
    try:
        secret = _secret_bytes(None)
        conn = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=_BUSY_TIMEOUT_S,
                               isolation_level=None)
    except (CacheError, sqlite3.Error) as e:
        logger.debug("conversion cache: %s not read with sqlite3: %s", path, e)
        return None
    try:
        row = conn.execute(_SELECT, (key,)).fetchone()
        if row is None:
            return None
        graph, _ = _decode(key, row[0], row[1], row[2], secret)
        now = time.time()
        try:
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(_TOUCH, (now, key, now))
        except sqlite3.Error as e:  # a stamp is advisory; the hit itself is good
            logger.debug("conversion cache: could not write the last-used stamp of %r: %s", key, e)
        return graph
    except (sqlite3.Error, _CorruptRow) as e:
        logger.debug("conversion cache: %r not read with sqlite3 (%s): the store reads it", key, e)
        return None
    finally:
        conn.close()
