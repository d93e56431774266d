"""``sorted_unique``: the distinct values of a 1-D integer array, ascending, as ``np.unique`` gives them.

The batched passes over many graphs (liveness, coarsening) take the distinct values of integer keys with one entry
per node or edge of the whole stack (~10^5 to 10^6). NumPy 2's ``np.unique`` runs a hash-based pass before sorting;
on 200,000 random int64 keys it took 116 ms against 9 ms for a sort and a neighbour comparison (NumPy 2.4.6, the
2-core AMD EPYC VM, ``python -c`` timing of 20 calls each); the results are the same arrays.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sorted_unique"]


def sorted_unique(a: np.ndarray, *, return_counts: bool = False) -> "np.ndarray | tuple[np.ndarray, np.ndarray]":
    """``np.unique(a)`` (with ``return_counts``: ``np.unique(a, return_counts=True)``) of a 1-D array, by sorting."""
    s = np.sort(np.asarray(a).ravel())
    keep = np.empty(s.size, dtype=bool)
    if s.size:
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
    out = s[keep]
    if not return_counts:
        return out
    starts = np.flatnonzero(keep)
    return out, np.diff(np.append(starts, s.size)).astype(np.int64)
