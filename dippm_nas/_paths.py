"""Where dippm-nas keeps files it can rebuild: the conversion cache, host-CPU microbenchmark results.

The directory is, in order of precedence:

1. ``$DIPPM_NAS_CACHE_DIR`` when set and not empty;
2. ``$XDG_CACHE_HOME/dippm-nas`` when ``XDG_CACHE_HOME`` is an absolute path (the XDG Base Directory
   rule: a relative value is ignored);
3. ``~/.cache/dippm-nas``.

The conversion cache itself may live elsewhere: ``$DIPPM_NAS_CACHE_URL`` names any SQLAlchemy URL
(``postgresql+psycopg2://user@host/db`` when many machines share one cache) and takes precedence over
the SQLite file in this directory.

This module imports nothing heavy, so any stage may call :func:`cache_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

from dippm_nas.errors import CacheError

__all__ = ["CACHE_DIR_ENV", "CACHE_URL_ENV", "SQLITE_FILE_NAME", "cache_dir", "default_cache_url"]

#: Environment variable that moves the cache directory.
CACHE_DIR_ENV = "DIPPM_NAS_CACHE_DIR"
#: Environment variable holding a SQLAlchemy URL that replaces the default SQLite file.
CACHE_URL_ENV = "DIPPM_NAS_CACHE_URL"
#: Name of the default SQLite file inside :func:`cache_dir`.
SQLITE_FILE_NAME = "conversion.sqlite"


def cache_dir(create: bool = False) -> Path:
    """The dippm-nas cache directory (see the module docstring for the precedence rules).

    Args:
        create: make the directory (and its parents) when it does not exist. Default ``False``.

    Returns:
        An absolute path (``~`` expanded).

    Raises:
        CacheError: when ``create`` is true and the directory cannot be made.
    """
    env = os.environ.get(CACHE_DIR_ENV, "")
    if env:
        path = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg).expanduser() if xdg and Path(xdg).expanduser().is_absolute() else Path.home() / ".cache"
        path = base / "dippm-nas"
    path = path.absolute()
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(
                f"cannot create the dippm-nas cache directory {str(path)!r} ({e}); "
                f"set {CACHE_DIR_ENV} to a writable directory"
            ) from e
    return path


def default_cache_url() -> str:
    """The SQLAlchemy URL of the default conversion cache.

    ``$DIPPM_NAS_CACHE_URL`` when set and not empty, else ``sqlite:///<cache_dir()>/conversion.sqlite``.
    The directory is not created here; :class:`~dippm_nas.cache.ConversionCache` does that when it
    opens a SQLite file.
    """
    env = os.environ.get(CACHE_URL_ENV, "")
    if env:
        return env
    return f"sqlite:///{cache_dir() / SQLITE_FILE_NAME}"
