"""The conversion cache: captured operator graphs kept in SQL so a model is converted once.

A SQLite file in :func:`cache_dir` by default (``$DIPPM_NAS_CACHE_DIR`` moves it); any SQLAlchemy URL
(``$DIPPM_NAS_CACHE_URL``, e.g. PostgreSQL) when many machines share one cache; ``$DIPPM_NAS_CACHE_SECRET``
signs its rows so that only writers who know the secret are trusted.

The SQLAlchemy store (``ConversionCache``, ``default_cache``, ``set_default_cache``, ``CACHE_TABLE``,
``fresh_copy``) is imported on first access (PEP 562): :func:`read_default_sqlite` reads a hit of the default
SQLite file with the standard library alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dippm_nas._lazy import lazy_face
from dippm_nas._paths import CACHE_DIR_ENV, CACHE_URL_ENV, cache_dir, default_cache_url
from dippm_nas.cache._read import read_default_sqlite
from dippm_nas.cache._rows import CACHE_SECRET_ENV, COLUMNS, MAX_GRAPH_JSON_BYTES, TABLE_NAME

if TYPE_CHECKING:  # pragma: no cover - what __getattr__ returns, for type checkers
    from dippm_nas.cache._store import CACHE_TABLE, ConversionCache, default_cache, fresh_copy, set_default_cache

__all__ = [
    "ConversionCache",
    "default_cache",
    "set_default_cache",
    "read_default_sqlite",
    "cache_dir",
    "default_cache_url",
    "CACHE_DIR_ENV",
    "CACHE_URL_ENV",
    "CACHE_SECRET_ENV",
    "CACHE_TABLE",
    "TABLE_NAME",
    "COLUMNS",
    "MAX_GRAPH_JSON_BYTES",
    "fresh_copy",
]

#: The names of the SQLAlchemy store, imported on first access.
__getattr__, __dir__ = lazy_face(__name__, {
    "dippm_nas.cache._store": ("ConversionCache", "default_cache", "set_default_cache", "CACHE_TABLE", "fresh_copy"),
})
