"""``dippm_nas._unique.sorted_unique`` gives ``np.unique``'s arrays."""

from __future__ import annotations

import numpy as np
import pytest

from dippm_nas._unique import sorted_unique


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_sorted_unique_is_np_unique(n: int) -> None:
    a = np.random.default_rng(n).integers(-5, 40, n)
    want, counts = np.unique(a, return_counts=True)
    got, got_counts = sorted_unique(a, return_counts=True)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert got_counts.dtype == counts.dtype and np.array_equal(got_counts, counts)
    assert np.array_equal(sorted_unique(a), want)
