"""Fitting the novelty reference set, threshold, novel-graph and graded floors and correction shrink of a checkpoint.

What these numbers mean at prediction time is :mod:`dippm_nas.predictor._novelty` (the module docstring);
``scripts/fit/fit_novelty_floor.py`` and ``scripts/fit/fit_novelty_twins.py`` fit the floor and the shrink on rows of
families a checkpoint never saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from dippm_nas._numbers import as_reals
from dippm_nas.errors import InvalidValueError

__all__ = ["MAX_REFERENCE", "NOVELTY_QUANTILE", "COVERAGE", "SHRINK_GRID", "reference_set", "fit_novel_floor",
           "split_d0", "fit_shrink_width", "GRADED_MIN_ROWS", "fit_graded_floor"]

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


def split_d0(val_novelty: Sequence[float], *, quantile: float = NOVELTY_QUANTILE,
             groups: Sequence[str] | None = None) -> float:
    """The novelty threshold: the ``quantile`` of the validation graphs' novelty.

    With ``groups`` (one label per graph, e.g. its data source), the largest of the groups' own quantiles:
    a graph is then novel only when it lies beyond that share of the validation graphs of every source, so a
    large source of look-alike graphs does not make every graph of a smaller, more varied source novel."""
    v = np.asarray(as_reals(val_novelty, "split_d0(): val_novelty", finite=False), dtype=np.float64)
    g = np.asarray(groups if groups is not None else [""] * v.size, dtype=object)
    if g.size != v.size:
        raise InvalidValueError(f"split_d0 needs one group per validation novelty, got {g.size} for {v.size}")
    ok = np.isfinite(v)
    v, g = v[ok], g[ok]
    if v.size == 0:
        raise InvalidValueError("split_d0 needs at least one finite validation novelty")
    return max(float(np.quantile(v[g == k], quantile)) for k in sorted(set(g.tolist())))


#: shrink widths :func:`fit_shrink_width` tries (``inf``: no shrink)
SHRINK_GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, math.inf)



def fit_shrink_width(err_of: Callable[[float], float], grid: Sequence[float] = SHRINK_GRID) -> float:
    """The width of ``grid`` whose shrunk predictions have the smallest mean absolute log error.

    Args:
        err_of: ``width -> mean |log label - log prediction|`` over the calibration rows (the caller
            rebuilds the predictions with :func:`correction_weight`); ties go to the wider width (less
            shrink).
    """
    grid = as_reals(grid, "fit_shrink_width(): grid", finite=False)
    errs = [(float(err_of(c)), -c if math.isfinite(c) else -math.inf, c) for c in grid]
    return min(errs)[2]


#: fewest calibration rows per bin of a graded floor
GRADED_MIN_ROWS = 50


def fit_graded_floor(novelty: np.ndarray, err_log: np.ndarray, sigma_log: np.ndarray, *,
                     min_rows: int = GRADED_MIN_ROWS, coverage: float = COVERAGE) -> tuple[tuple[float, float], ...]:
    """A σ floor that grows with novelty: knots ``((novelty, floor), ...)`` for
    ``NoveltyFloor.graded_floor_log`` (linear in between, constant beyond the ends).

    The calibration rows, sorted by novelty, are cut into bins of equal count (at least ``min_rows`` each);
    each bin's floor is :func:`fit_novel_floor` of its rows (``coverage`` of them within ±2σ). Where a bin
    needs a smaller floor than the bin below it, the two merge and the floor is refitted on their rows
    together (pool-adjacent-violators with the coverage quantile), until the floors do not decrease. Each
    knot is the median novelty of its bin with that bin's floor.

    Args:
        novelty: the rows' novelty, ``[N]`` (rows with ``nan`` are left out).
        err_log: ``|log label - log prediction|``, ``[N]``.
        sigma_log: the σ the checkpoint already gives them (members' spread and in-family floor), ``[N]``.
        min_rows: fewest rows in a bin (fewer rows in all: one bin, one knot).

    Raises:
        InvalidValueError: ``min_rows`` < 1 or no finite row.
    """
    if min_rows < 1:
        raise InvalidValueError(f"min_rows must be >= 1, got {min_rows!r}")
    nov, err, sig = (np.asarray(a, dtype=np.float64) for a in (novelty, err_log, sigma_log))
    ok = np.isfinite(nov) & np.isfinite(err) & np.isfinite(sig)
    if not ok.any():
        raise InvalidValueError("fit_graded_floor needs at least one row with a finite novelty, error and σ")
    order = np.argsort(nov[ok], kind="stable")
    nov, err, sig = nov[ok][order], err[ok][order], sig[ok][order]
    n = nov.size
    n_bins = max(n // min_rows, 1)
    cuts = [round(i * n / n_bins) for i in range(n_bins + 1)]
    blocks = [(cuts[i], cuts[i + 1]) for i in range(n_bins)]
    floors = [fit_novel_floor(err[a:b], sig[a:b], coverage=coverage) for a, b in blocks]
    i = 0
    while i < len(blocks) - 1:
        if floors[i] > floors[i + 1]:  # merge the violating pair, refit, and look back one step
            a, b = blocks[i][0], blocks[i + 1][1]
            blocks[i:i + 2] = [(a, b)]
            floors[i:i + 2] = [fit_novel_floor(err[a:b], sig[a:b], coverage=coverage)]
            i = max(i - 1, 0)
        else:
            i += 1
    knots: list[tuple[float, float]] = []
    for (a, b), f in zip(blocks, floors):
        x = float(np.median(nov[a:b]))
        if knots and x <= knots[-1][0]:  # bins of equal novelty: keep the larger floor at one knot
            knots[-1] = (knots[-1][0], max(knots[-1][1], f))
        else:
            knots.append((x, f))
    return tuple(knots)
