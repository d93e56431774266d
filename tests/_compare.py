"""``assert_close``: nested JSON-like values equal, floats within a relative and an absolute tolerance."""

from __future__ import annotations

import math
from typing import Any

#: Relative tolerance of a figure computed on another CPU kernel path, or by the other engine (numpy / torch),
#: against the same figure on this one. Measured with ``python tests/kernel_paths.py`` (the ten graphs and six
#: settings of ``test_inference_equality``, torch and numpy engines, under ATen's AVX-512 / AVX2 / generic
#: kernels, OpenBLAS SkylakeX / Haswell / Sandybridge cores, MKL's default and compatible branches, numpy's
#: AVX-512 and baseline intrinsics, one thread): the largest difference from the stored expected values is
#: 3.2e-6 (an ensemble σ, ``latency_ms_std``: the members' spread is a difference of nearby float32 numbers),
#: every mean and energy figure within 5.4e-7; an Intel Xeon differed by 2.5e-6 on the same field. 3e-5 is ten
#: times the largest measured difference; a change of the computation moves figures by far more.
KERNEL_PATH_REL = 3e-5


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
