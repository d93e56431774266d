"""The conversion cache: captured operator graphs kept in SQL so a model is converted once.

A SQLite file in :func:`cache_dir` by default (``$DIPPM_NAS_CACHE_DIR`` moves it); any SQLAlchemy URL
(``$DIPPM_NAS_CACHE_URL``, e.g. PostgreSQL) when many machines share one cache; ``$DIPPM_NAS_CACHE_SECRET``
signs its rows so that only writers who know the secret are trusted.
"""

from dippm_nas._paths import CACHE_DIR_ENV, CACHE_URL_ENV, cache_dir, default_cache_url
from dippm_nas.cache._store import (CACHE_SECRET_ENV, CACHE_TABLE, TABLE_NAME, ConversionCache, default_cache,
                                    fresh_copy, set_default_cache)

__all__ = [
    "ConversionCache",
    "default_cache",
    "set_default_cache",
    "cache_dir",
    "default_cache_url",
    "CACHE_DIR_ENV",
    "CACHE_URL_ENV",
    "CACHE_SECRET_ENV",
    "CACHE_TABLE",
    "TABLE_NAME",
    "fresh_copy",
]
