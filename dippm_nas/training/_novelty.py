"""Fitting the novelty reference set, threshold, novel-graph floor and correction shrink of a checkpoint.

What these numbers mean at prediction time is :mod:`dippm_nas.predictor._novelty` (the module docstring);
``scripts/fit_novelty_floor.py`` and ``scripts/fit_novelty_twins.py`` fit the floor and the shrink on rows of
families a checkpoint never saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

__all__ = ["MAX_REFERENCE", "NOVELTY_QUANTILE", "COVERAGE", "SHRINK_GRID", "reference_set", "fit_novel_floor",
           "split_d0", "fit_shrink_width"]

#: training graphs kept as the reference set (a seeded subsample when there are more)
MAX_REFERENCE = 2048
#: validation novelty quantile that separates in-family from novel graphs
NOVELTY_QUANTILE = 0.95
#: share of calibration rows within ±2σ the novel floor is fitted for
COVERAGE = 0.95


def reference_set(static_z: torch.Tensor, *, max_rows: int = MAX_REFERENCE, seed: int = 0) -> torch.Tensor:
    """Up to ``max_rows`` distinct rows of ``static_z`` (``[N, dim]``, standardised training features), a
    seeded subsample when there are more, as float32 ``[R, dim]``.

    Repeated rows (one graph measured on several devices or runs) are kept once before subsampling, so a
    small source of distinct graphs is not crowded out of the set by a large source's repetitions."""
    static_z = torch.unique(static_z.detach().to(torch.float32), dim=0)
    n = static_z.shape[0]
    if n > max_rows:
        idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_rows].sort().values
        static_z = static_z[idx]
    return static_z.detach().to(torch.float32).contiguous()


def fit_novel_floor(err_log: np.ndarray, sigma_log: np.ndarray, *, coverage: float = COVERAGE) -> float:
    """Smallest floor ``f`` with ``coverage`` of ``err <= 2 sqrt(sigma² + f²)`` (also the in-family floor of
    :func:`~dippm_nas.training.fit_std_floor`).

    Args:
        err_log: ``|log label - log prediction|`` of the calibration rows, ``[N]``.
        sigma_log: the σ the checkpoint already gives them (in-family floor and range widening
            included), ``[N]``.
    """
    ok = np.isfinite(err_log) & np.isfinite(sigma_log)
    err, s = np.asarray(err_log)[ok], np.asarray(sigma_log)[ok]
    if err.size == 0:
        raise ValueError("fit_novel_floor needs at least one finite calibration row")
    # err <= 2 sqrt(s² + f²)  <=>  f >= need = sqrt(max(0, (err/2)² - s²)); the smallest f that covers
    # ceil(coverage * n) rows is that order statistic of need
    need = np.sort(np.sqrt(np.clip((err / 2.0) ** 2 - s ** 2, 0.0, None)))
    k = min(max(math.ceil(coverage * need.size) - 1, 0), need.size - 1)
    return float(need[k]) * (1.0 + 1e-9)  # so that row still counts as covered after float rounding


def split_d0(val_novelty: Sequence[float], *, quantile: float = NOVELTY_QUANTILE) -> float:
    """The novelty threshold: the ``quantile`` of the validation graphs' novelty."""
    v = np.asarray(val_novelty, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        raise ValueError("split_d0 needs at least one finite validation novelty")
    return float(np.quantile(v, quantile))


#: shrink widths :func:`fit_shrink_width` tries (``inf``: no shrink)
SHRINK_GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, math.inf)



def fit_shrink_width(err_of: Callable[[float], float], grid: Sequence[float] = SHRINK_GRID) -> float:
    """The width of ``grid`` whose shrunk predictions have the smallest mean absolute log error.

    Args:
        err_of: ``width -> mean |log label - log prediction|`` over the calibration rows (the caller
            rebuilds the predictions with :func:`correction_weight`); ties go to the wider width (less
            shrink).
    """
    errs = [(float(err_of(c)), -c if math.isfinite(c) else -math.inf, c) for c in grid]
    return min(errs)[2]
