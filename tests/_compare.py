"""``assert_close``: nested JSON-like values equal, floats within a relative and an absolute tolerance."""

from __future__ import annotations

import math
from typing import Any


def assert_close(a: Any, b: Any, *, rel: float, abs_tol: float, path: str = "") -> None:
    """Assert ``a`` and ``b`` (dicts, lists, floats, anything else compared with ``==``) are equal, floats within
    ``rel`` / ``abs_tol`` (two NaNs are equal); the assertion names the path of the first difference."""
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol) or (math.isnan(a) and math.isnan(b)), (path, a, b)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), (path, sorted(set(a) ^ set(b)))
        for k in a:
            assert_close(a[k], b[k], rel=rel, abs_tol=abs_tol, path=f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, rel=rel, abs_tol=abs_tol, path=f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)
