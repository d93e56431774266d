"""Canonical JSON (the one text of a JSON value that hashes, keys and identities are computed from) and
the reading of a JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dippm_nas.errors import DippmNasError

__all__ = ["canonical_json", "read_json_file"]


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
