"""The ``dippm-nas`` command line. Each verb lives in its own ``_<verb>.py`` module with a
``register(subparsers)`` function; :data:`_main._VERBS` lists them, and ``_grammar`` holds the rules they share
(list flags, ``--json``, exit status, suggestions). Only this package prints.

Also public, for scripts and benchmarks that reuse a verb's pieces: :func:`add_split_args` and
:func:`parse_devices` (the ``train`` / ``evaluate`` split and device flags). The ``demo`` search's task (the
digits data, its training loop and suggestions) is public in :mod:`search_spaces`.
"""

from __future__ import annotations

from dippm_nas.cli._grammar import UsageError
from dippm_nas.cli._main import main
from dippm_nas.cli._train import add_split_args, parse_devices

__all__ = ["main", "UsageError", "add_split_args", "parse_devices"]
