"""The ``dippm-nas`` command line. Each verb lives in its own ``_<verb>.py`` module with a
``register(subparsers)`` function; :data:`_main._VERBS` lists them, and ``_grammar`` holds the rules they share
(list flags, ``--json``, exit status, suggestions). Only this package prints."""

from __future__ import annotations

from dippm_nas.cli._grammar import UsageError
from dippm_nas.cli._main import main

__all__ = ["main", "UsageError"]
