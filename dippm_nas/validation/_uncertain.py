"""Candidates whose feasibility is uncertain: what a validation round measures besides the believed front.

A round that measures only the front a method believes feasible never learns about the candidates its budget check
rejects. With a wide margin (a calibrated bound at ``confidence=0.9`` far wider than the errors in the space) that is
most of those that really fit, and a search that measures only what it already admits never gathers the in-space
rows (:attr:`~dippm_nas.predictor.Adaptation.conformal_scores`) that would narrow the margin. So a round also
measures some candidates whose check rejects them but whose budget lies within the margin's band around the mean
(:func:`~dippm_nas.budgets.band_distance` below 1, :attr:`~dippm_nas.budgets.ChanceCheck.uncertain`):

- :func:`uncertain_order`: which of them first: those no other uncertain candidate dominates (by the search's
  objectives), then the rest; within each, the nearest the budget (smallest band distance) first;
- :func:`round_split`: how a round's ``max_per_round`` rows are shared: up to ``uncertain_per_round`` uncertain
  candidates, the front the rest; a share the one kind cannot fill goes to the other (with ``uncertain_per_round``
  0, the front only), so a round never measures more than ``max_per_round`` rows.

:class:`~dippm_nas.validation.ParetoValidator` (``uncertain_per_round``) and
``benchmarks/search/search_regret.py`` (``--validate-uncertain``) choose their rounds with these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dippm_nas._numbers import as_int, as_reals
from dippm_nas.errors import ValidationError

__all__ = ["DIRECTIONS", "default_uncertain_per_round", "round_split", "uncertain_order"]
#: Objective directions :func:`uncertain_order` takes (Optuna's names).
DIRECTIONS: tuple[str, ...] = ("minimize", "maximize")


def default_uncertain_per_round(max_per_round: Any) -> int:
    """The rows of a round :class:`~dippm_nas.validation.ParetoValidator` keeps for uncertain candidates unless
    told: a third of ``max_per_round``, rounded down (1 of the default 3; 0 below 3, so a round of one or two rows
    stays the front's).

    Raises:
        ValidationError: ``max_per_round`` is not an integer >= 1.
    """
    return as_int(max_per_round, "max_per_round", low=1, error=ValidationError) // 3


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` (minimised coordinates) is no worse than ``b`` everywhere and better somewhere."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def uncertain_order(values: Sequence[Sequence[float]], directions: Sequence[str],
                    distances: Sequence[float]) -> list[int]:
    """The indices of the uncertain candidates (``distances[i] < 1``) in the order a round measures them.

    Those that no other uncertain candidate dominates come first (by ``values`` under ``directions``: a candidate is
    better where it is lower on a ``"minimize"`` objective, higher on a ``"maximize"`` one), then the rest; within
    each, the smallest band distance (the budget nearest the mean) first, then the lowest index.

    Args:
        values: each candidate's objective values (one per direction).
        directions: ``"minimize"`` or ``"maximize"`` per objective (:data:`DIRECTIONS`).
        distances: each candidate's :func:`~dippm_nas.budgets.band_distance` (``inf``: not uncertain).

    Raises:
        ValidationError: lengths that disagree, an unknown direction, a value that is not a finite number, or a
            distance that is negative or NaN.
    """
    if isinstance(directions, (str, bytes)) or not hasattr(directions, "__iter__"):
        raise ValidationError(f"directions must be a sequence of {DIRECTIONS}, got {directions!r:.120}")
    dirs = [d.lower() if isinstance(d, str) else d for d in directions]
    bad = [d for d in dirs if d not in DIRECTIONS]
    if not dirs or bad:
        raise ValidationError(f"directions must be a non-empty sequence of {DIRECTIONS}, got {list(directions)!r:.120}")
    dist = as_reals(distances, "distances", finite=False, error=ValidationError)
    if any(math.isnan(d) or d < 0 for d in dist):
        raise ValidationError(f"distances must be numbers >= 0 (inf: not uncertain), got {dist!r:.120}")
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != len(dist):
        raise ValidationError(f"values must hold one row per distance ({len(dist)}), got {values!r:.120}")
    sign = [1.0 if d == "minimize" else -1.0 for d in dirs]
    points: list[list[float]] = []
    for i, row in enumerate(values):
        v = as_reals(row, f"values[{i}]", error=ValidationError)
        if len(v) != len(sign):
            raise ValidationError(f"values[{i}] must hold one value per direction ({len(sign)}), got {v!r:.120}")
        points.append([s * x for s, x in zip(sign, v)])
    cands = [i for i, d in enumerate(dist) if d < 1]
    top = [i for i in cands if not any(_dominates(points[j], points[i]) for j in cands if j != i)]
    rest = [i for i in cands if i not in set(top)]

    def key(i: int) -> tuple[float, int]:
        return dist[i], i

    return sorted(top, key=key) + sorted(rest, key=key)


def round_split(front: int, uncertain: int, max_per_round: Any, uncertain_per_round: Any) -> tuple[int, int]:
    """How many front and uncertain candidates a round measures: ``(from the front, uncertain)``.

    Up to ``uncertain_per_round`` of the round's ``max_per_round`` rows go to uncertain candidates (as many as there
    are), the rest to the front; where the front has fewer, the uncertain candidates fill the round. The two add up
    to at most ``max_per_round``. ``uncertain_per_round=0``: the front only.

    Args:
        front, uncertain: how many candidates of each kind are waiting (``>= 0``).
        max_per_round: the most rows a round measures (``>= 1``).
        uncertain_per_round: the rows kept for uncertain candidates (``0 <= n <= max_per_round``).

    Raises:
        ValidationError: a count that is not an integer in its range.
    """
    f = as_int(front, "front", low=0, error=ValidationError)
    u = as_int(uncertain, "uncertain", low=0, error=ValidationError)
    m = as_int(max_per_round, "max_per_round", low=1, error=ValidationError)
    q = as_int(uncertain_per_round, "uncertain_per_round", low=0, error=ValidationError)
    if q > m:
        raise ValidationError(f"uncertain_per_round must be at most max_per_round ({m}): the rows kept for uncertain "
                              f"candidates are part of a round's; got {q}")
    if q == 0:
        return min(f, m), 0
    n_unc = min(q, u)
    n_front = min(f, m - n_unc)
    return n_front, min(u, m - n_front)
