"""Canonical JSON: the one text of a JSON value that hashes, keys and identities are computed from."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical_json"]


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces, so equal values give equal text (hash input, identity of a config).

    Raises:
        ValueError: ``obj`` holds a NaN or an infinity (not JSON).
        TypeError: ``obj`` holds a value JSON cannot represent.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
