"""Leave-group-out guards of an adaptation: a correction is kept only where it beats none on rows it did not see.

A search's measured rows come in groups: models of one family (``ResNet``, ``VGG``, ...) or, inside one search
space, neighbourhoods of the space. A correction chosen by leave-one-*row*-out learns a group's own bias from its
other rows and applies it to the next group, where it does not hold. Here every choice is scored out of group:

- :func:`row_groups`: the group of each measured row: the family its graph names (the leading letters of the
  model's name in ``graph.source``, after any ``library:`` prefix: ``torchvision:densenet121`` -> ``densenet``, a
  class name ``ResNet`` -> ``resnet``) where the rows name at least two; otherwise (one
  search space) clusters of the rows' embeddings (the ensemble's mean last hidden layer, k-means with a
  deterministic farthest-point start, ``k = clip(n // 4, 2, MAX_CLUSTERS)``).
- :func:`group_cv_head`: the residual head's ridge penalty and its **shrink** towards no head, chosen by the error
  of heads fitted without each group on that group: per penalty, the out-of-group shifts ``f`` are scaled by
  ``w = clip(<r, f> / <f, f>, 0, 1)`` (the evidence for the head: ``w = 0`` when the out-of-group shifts do not
  point the way the residuals do), and the penalty of the smallest out-of-group error wins. The head is kept only
  when its paired out-of-group gain over no head exceeds ``SE_FACTOR`` standard errors; its σ is the root mean
  square of those out-of-group residuals.
- :func:`keep_targets`: the same rule for the factor calibration: per target, the factors fitted without each
  group are scored on it against the unadapted prediction; a target whose factors do not win is left uncalibrated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["RowGroups", "row_groups", "group_cv_head", "keep_targets", "MAX_CLUSTERS", "SE_FACTOR"]

#: Most embedding clusters a space's rows are split into.
MAX_CLUSTERS = 5
#: How many standard errors of its paired out-of-group gain a correction must win by over none (the usual
#: one-standard-error rule of model selection; not tuned on benchmark rows).
SE_FACTOR = 1.0
_FAMILY = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class RowGroups:
    """The groups of the measured rows.

    Attributes:
        index: ``[n]`` group index of each row (0..count-1).
        count: number of groups.
        by: ``"family"`` (the graphs' model class), ``"clusters"`` (embedding clusters) or ``"rows"`` (each row its
            own group: fewer than two rows to cluster, or no embedding).
    """

    index: np.ndarray
    count: int
    by: str


def _family(source: str) -> str:
    """The family a graph's ``source`` names: the leading letters of the model's name, after any ``library:``
    prefix (``torchvision:densenet121`` -> ``densenet``, ``timm:convnextv2_femto`` -> ``convnextv``, ``RegNet`` ->
    ``regnet``)."""
    name = str(source or "").rsplit(":", 1)[-1].rsplit("/", 1)[-1].strip().lower()
    m = _FAMILY.match(name)
    return m.group(0) if m else name


def _kmeans(x: np.ndarray, k: int, iters: int = 30) -> np.ndarray:
    """Deterministic k-means: farthest-point start from the row nearest the mean, then Lloyd's steps."""
    centres = [int(np.argmin(((x - x.mean(0)) ** 2).sum(1)))]
    d = ((x - x[centres[0]]) ** 2).sum(1)
    while len(centres) < k:
        centres.append(int(np.argmax(d)))
        d = np.minimum(d, ((x - x[centres[-1]]) ** 2).sum(1))
    c = x[centres].copy()
    lab = np.zeros(len(x), dtype=int)
    for it in range(iters):
        new = np.argmin(((x[:, None, :] - c[None]) ** 2).sum(2), 1)
        if it > 0 and np.array_equal(new, lab):
            break
        lab = new
        for j in range(k):
            if np.any(lab == j):
                c[j] = x[lab == j].mean(0)
    _, lab = np.unique(lab, return_inverse=True)
    return lab


def row_groups(sources: Sequence[str], embedding: np.ndarray | None) -> RowGroups:
    """The groups of ``n`` measured rows (module docstring).

    Args:
        sources: each row's ``graph.source``.
        embedding: ``[n, d]`` each row's embedding (the ensemble's mean last hidden layer), or ``None``.
    """
    n = len(sources)
    fams = [_family(s) for s in sources]
    if len(set(fams)) >= 2:
        _, idx = np.unique(np.array(fams), return_inverse=True)
        return RowGroups(idx, int(idx.max()) + 1, "family")
    if embedding is None or n < 4:
        return RowGroups(np.arange(n), n, "rows")
    e = np.asarray(embedding, dtype=np.float64)
    sd = e.std(0)
    e = np.where(sd > 1e-9, (e - e.mean(0)) / np.where(sd > 1e-9, sd, 1.0), 0.0)
    k = int(np.clip(n // 4, 2, MAX_CLUSTERS))
    lab = _kmeans(e, k)
    return RowGroups(lab, int(lab.max()) + 1, "clusters")


def _wins(gain: np.ndarray) -> bool:
    """The paired gain's mean exceeds ``SE_FACTOR`` standard errors (and is > 0)."""
    n = gain.size
    if n < 2:
        return False
    return bool(gain.mean() > max(0.0, SE_FACTOR * gain.std(ddof=1) / math.sqrt(n)))


@dataclass(frozen=True)
class HeadChoice:
    """What :func:`group_cv_head` chose: ``ridge`` (``None``: no head), the ``shrink`` ``w`` in (0, 1] the fitted
    head is scaled by, and the out-of-group root mean square residual with it (``rmse_log``) and without a head;
    ``oog_shift``: ``[n]`` each row's shift by the chosen head fitted without its group (shrunk; ``None``: no head)."""

    ridge: float | None
    shrink: float
    rmse_log: float
    rmse_none_log: float
    oog_shift: np.ndarray | None = None


def group_cv_head(x: np.ndarray, r: np.ndarray, groups: np.ndarray, grid: Sequence[float],
                  margin: float) -> HeadChoice:
    """Choose a residual head's penalty and shrink by leave-group-out error (module docstring).

    Args:
        x: ``[K, n, p]`` each member's standardised inputs with the (penalised) column of ones last.
        r: ``[n]`` the residuals the head fits.
        groups: ``[n]`` group index per row.
        grid: ridge penalties to try.
        margin: a head's shift is bounded by ``margin`` times the largest |residual| of the rows it was fitted on.
    """
    k, n, p = x.shape
    none_rmse = float(np.sqrt(np.mean(r ** 2))) if n else 0.0
    f = np.zeros((len(grid), n))  # per penalty, the ensemble's out-of-group shift of each row
    for gi in np.unique(groups):
        te, tr = groups == gi, groups != gi
        if tr.sum() < 2:
            continue  # no rows to fit on without this group: no shift, no evidence
        bound = margin * float(np.max(np.abs(r[tr])))
        lo, hi = x[:, tr].min(1), x[:, tr].max(1)  # [K, p]
        for m in range(k):
            u, s, vt = np.linalg.svd(x[m, tr], full_matrices=False)
            ur = u.T @ r[tr]
            xt = np.clip(x[m, te], lo[m], hi[m])
            for j, lam in enumerate(grid):
                coef = vt.T @ ((s / (s ** 2 + lam)) * ur)
                f[j, te] += np.clip(xt @ coef, -bound, bound) / k
    best: tuple[float, int, float] | None = None
    for j in range(len(grid)):
        ff = float(f[j] @ f[j])
        w = float(np.clip(r @ f[j] / ff, 0.0, 1.0)) if ff > 0 else 0.0
        err = float(np.mean((r - w * f[j]) ** 2))
        if w > 0 and (best is None or err < best[0]):
            best = (err, j, w)
    if best is None:
        return HeadChoice(None, 0.0, none_rmse, none_rmse)
    err, j, w = best
    if not _wins(r ** 2 - (r - w * f[j]) ** 2):
        return HeadChoice(None, 0.0, none_rmse, none_rmse)
    return HeadChoice(float(grid[j]), w, math.sqrt(err), none_rmse, w * f[j])


def keep_targets(raw_resid: dict[str, np.ndarray], oog_resid: dict[str, np.ndarray]) -> dict[str, bool]:
    """Per target: do the factors fitted without each group beat the unadapted prediction on it
    (``raw_resid`` and ``oog_resid``: log residuals of the same rows, NaN where a row has no label)?"""
    out = {}
    for t, raw in raw_resid.items():
        oog = oog_resid.get(t)
        if oog is None:
            out[t] = False
            continue
        ok = np.isfinite(raw) & np.isfinite(oog)
        out[t] = _wins(raw[ok] ** 2 - oog[ok] ** 2)
    return out
