"""The ``dippm-nas`` command line. Each verb lives in its own ``_<verb>.py`` module with a
``register(subparsers)`` function; :data:`_main._VERBS` lists them, and ``_grammar`` holds the rules they share
(list flags, ``--json``, exit status, suggestions). Only this package prints.

Also public, for scripts and benchmarks that reuse a verb's pieces: :func:`add_split_args` and
:func:`parse_devices` (the ``train`` / ``evaluate`` split and device flags), and the ``demo`` search's task:
:func:`digits_data` (scikit-learn's digits, split and seeded), :func:`suggest_demo_config` (a ``demo_cnn``
config from an Optuna trial) and :func:`train_demo_model` (train a candidate, held-out accuracy).
"""

from __future__ import annotations

from dippm_nas.cli._demo import digits_data, suggest_demo_config, train_demo_model
from dippm_nas.cli._grammar import UsageError
from dippm_nas.cli._main import main
from dippm_nas.cli._train import add_split_args, parse_devices

__all__ = ["main", "UsageError", "add_split_args", "parse_devices", "digits_data", "suggest_demo_config",
           "train_demo_model"]
