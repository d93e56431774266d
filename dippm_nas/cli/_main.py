"""Argument parsing and dispatch of the ``dippm-nas`` verbs; exit status and error output (see ``_grammar``)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from dippm_nas._version import __version__
from dippm_nas.cli._grammar import RUNTIME_EXIT, USAGE_EXIT, Parser, UsageError
from dippm_nas.errors import DippmNasError

# Modules under dippm_nas.cli that define ``register(subparsers)``; each adds one verb. A verb module imports
# only argparse-level names at its top; what its work needs (torch, TVM, optuna...) is imported in ``run``.
_VERBS: tuple[str, ...] = (
    "_inspect",
    "_devices",
    "_dataset",
    "_train",
    "_evaluate",
    "_checkpoints",
    "_predict",
    "_predict_llm",
    "_deployment",
    "_demo",
    "_validate_worker",
    "_gpu_campaign",
)


def build_parser() -> Parser:
    parser = Parser(
        prog="dippm-nas",
        description="Hardware-aware cost model for NAS: predicted latency, energy, memory and MIG fit. "
                    "--device is a catalogue id; list flags take 'a b c' or 'a,b,c'; --json prints JSON; "
                    "exit status 0 ok, 1 the work failed, 2 a usage error.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"dippm-nas {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for name in _VERBS:
        importlib.import_module(f"dippm_nas.cli.{name}").register(sub)
    return parser


def _print_error(e: BaseException, code: int, verb: str | None, as_json: bool) -> None:
    """Under ``--json``: one JSON object on stdout (``error``, ``type``, ``choices``, ``did_you_mean``,
    ``exit_status``); otherwise ``dippm-nas VERB: error: ...`` on stderr (after the usage line for a usage
    error)."""
    if as_json:
        print(json.dumps({
            "error": str(e),
            "type": type(e).__name__,
            "choices": getattr(e, "choices", None),
            "did_you_mean": getattr(e, "suggestions", None) or [],
            "verb": verb,
            "exit_status": code,
        }))
        return
    usage = getattr(e, "usage", None)
    if usage:
        sys.stderr.write(usage)
    prog = getattr(e, "prog", None) or ("dippm-nas" + (f" {verb}" if verb else ""))
    print(f"{prog}: error: {e}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dippm-nas`` console script; returns the exit status: 0 success, 1 the verb's work
    failed (a :class:`DippmNasError`), 2 a usage error (argparse, a bad flag value, an unknown name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        _print_error(e, USAGE_EXIT, None, as_json)
        return USAGE_EXIT
    as_json = as_json and getattr(args, "json", False) is True
    # `python -m` puts the working directory first on sys.path, where a torchvision.py there would shadow
    # the real package: take it out; load_model() appends it for `package.module:callable` SPECs only
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _log_warning  # one line per warning, in the log's format
            return int(args.func(args) or 0)
    except UsageError as e:
        _print_error(e, USAGE_EXIT, args.verb, as_json)
        return USAGE_EXIT
    except DippmNasError as e:
        _print_error(e, RUNTIME_EXIT, args.verb, as_json)
        return RUNTIME_EXIT


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """``warnings.showwarning`` for the CLI: one WARNING line of the ``py.warnings`` logger (the logger
    ``logging.captureWarnings`` uses), without the source line Python's default display adds."""
    logging.getLogger("py.warnings").warning("%s: %s", category.__name__, message)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
