"""Argument parsing and dispatch of the ``dippm-nas`` verbs."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from dippm_nas._version import __version__
from dippm_nas.errors import DippmNasError

# Modules under dippm_nas.cli that define ``register(subparsers)``; each adds one verb.
_VERBS: tuple[str, ...] = (
    "_inspect",
    "_devices",
    "_dataset",
    "_train",
    "_evaluate",
    "_predict",
    "_host_profile",
    "_demo",
    "_validate_worker",
    "_gpu_campaign",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dippm-nas",
        description="Hardware-aware cost model for NAS: predicted latency, energy, memory and MIG fit.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"dippm-nas {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for name in _VERBS:
        importlib.import_module(f"dippm_nas.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dippm-nas`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # `python -m` puts the working directory first on sys.path, where a torchvision.py there would shadow
    # the real package: take it out; load_model() appends it for `package.module:callable` SPECs only
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except DippmNasError as e:
        print(f"dippm-nas {args.verb}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
