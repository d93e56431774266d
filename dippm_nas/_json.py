"""Canonical JSON (the one text of a JSON value that hashes, keys and identities are computed from) and
the reading of a JSON file."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from dippm_nas.errors import DippmNasError, InvalidValueError

__all__ = ["canonical_json", "read_json_file", "check_keys"]


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces, so equal values give equal text (hash input, identity of a config).

    Raises:
        ValueError: ``obj`` holds a NaN or an infinity (not JSON).
        TypeError: ``obj`` holds a value JSON cannot represent.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def read_json_file(path: str | Path, message: str, error: type[DippmNasError] = DippmNasError) -> Any:
    """The JSON value in the file at ``path`` (UTF-8).

    Raises:
        DippmNasError: (``error``) the file cannot be read or is not JSON; the text is ``message: <cause>``.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise error(f"{message}: {e}") from e


def check_keys(d: Mapping[str, Any], allowed: Collection[str], where: str, *, what: str = "",
               required: Collection[str] = (), error: type[DippmNasError] = InvalidValueError) -> None:
    """Check the keys of a mapping read from a file against the fields it may set.

    Raises:
        DippmNasError: (``error``) ``d`` has a key outside ``allowed`` (the message is ``<where>: unknown
            [<what> ]keys [...]; choices: [...]``) or lacks one of ``required``.
    """
    bad = sorted(set(d) - set(allowed))
    if bad:
        raise error(f"{where}: unknown {what + ' ' if what else ''}keys {bad}; choices: {sorted(allowed)}")
    missing = [k for k in required if k not in d]
    if missing:
        raise error(f"{where}: {what or 'the object'} needs {missing}")
