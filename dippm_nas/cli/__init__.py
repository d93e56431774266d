"""The ``dippm-nas`` command line. Each verb lives in its own ``_<verb>.py`` module with a
``register(subparsers)`` function; :data:`_VERBS` lists them. Only this package prints."""

from __future__ import annotations

from dippm_nas.cli._main import main

__all__ = ["main"]
