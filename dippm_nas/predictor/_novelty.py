"""How far a graph lies from the training graphs, and the std floor that goes with being far.

The ensemble's spread says little about a family it never saw: on held-out families its members agree
with each other while all being off by a family-wide offset (host CPU, resnet + vit held out: ±2σ held
only 74-84 % of the rows with the in-family floor). A novelty score and a second floor fix that:

- the **reference set** is up to :data:`MAX_REFERENCE` training graphs' graph-level features (static
  features, standardised and clipped as the network sees them), stored in the checkpoint;
- a graph's **novelty** is its distance to the nearest reference graph, divided by ``sqrt(dim)`` (an RMS
  of per-feature z-score differences);
- ``d0`` is the :data:`NOVELTY_QUANTILE` quantile of the validation graphs' novelty (in-family graphs the
  network was selected on), and a graph with novelty above ``d0`` is **novel**;
- the **novel floor** is fitted on calibration rows of families the checkpoint never saw (never its test
  rows) so that ±2σ covers :data:`COVERAGE` of them; a novel graph's σ is
  ``sqrt(σ_members² + max(floor, novel_floor)²)``.

The checkpoint's ``meta.novelty`` says where the calibration rows came from. Without one (no unseen
family available when it was trained) graphs are still scored, and σ is the in-family one.

Far from its training graphs the network's correction of the prior is itself a guess: on a held-out
modality (host CPU, bert never seen) the operator-table prior alone read 9.6 % and the corrected figure
15.8-20.6 %. So a checkpoint may also carry a **correction shrink** per target: with the relative excess
``u = (novelty - d0) / d0``, a novel graph keeps the share ``w = clip(1 - u / c, 0, 1)`` of the correction
(``log prediction = log prior + w * correction``); ``c`` is fitted on rows of families unseen by
family-split twins (``scripts/fit_novelty_twins.py``), ``c = 0`` answers with the prior as soon as a graph is
novel, a target without a ``c`` is not shrunk. Graphs at or below ``d0`` are never shrunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["MAX_REFERENCE", "NOVELTY_QUANTILE", "COVERAGE", "NoveltyFloor", "reference_set", "novelty_scores",
           "fit_novel_floor", "split_d0", "correction_weight", "fit_shrink_width", "SHRINK_GRID"]

#: training graphs kept as the reference set (a seeded subsample when there are more)
MAX_REFERENCE = 2048
#: validation novelty quantile that separates in-family from novel graphs
NOVELTY_QUANTILE = 0.95
#: share of calibration rows within ±2σ the novel floor is fitted for
COVERAGE = 0.95


@dataclass(frozen=True)
class NoveltyFloor:
    """The novel-graph std floor of a checkpoint (``CheckpointMeta.novelty`` as a dict).

    Attributes:
        d0: novelty above which a graph is novel (validation quantile).
        floor_log: per target, the log-space std floor of novel graphs.
        calibrated_on: the rows the floor (and the shrink) were fitted on (families, count, where from).
        shrink: per target, the width ``c`` of the correction shrink (see the module docstring); a
            target absent here keeps its whole correction. Absent from older metadata.
    """

    d0: float
    floor_log: dict[str, float]
    calibrated_on: str
    shrink: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {t: c for t, c in self.shrink.items() if not (math.isfinite(c) and c >= 0.0)}
        if bad:
            raise ValueError(f"shrink widths must be finite and >= 0 (0: the prior answers for novel graphs), "
                             f"got {bad}")

    def to_dict(self) -> dict[str, Any]:
        d = {"d0": self.d0, "floor_log": dict(self.floor_log), "calibrated_on": self.calibrated_on}
        if self.shrink:
            d["shrink"] = dict(self.shrink)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NoveltyFloor":
        return cls(d0=float(d["d0"]), floor_log={k: float(v) for k, v in d["floor_log"].items()},
                   calibrated_on=str(d["calibrated_on"]),
                   shrink={k: float(v) for k, v in d.get("shrink", {}).items()})


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


def novelty_scores(static_z: torch.Tensor, ref: torch.Tensor, *, block: int = 1024) -> np.ndarray:
    """Distance of each row of ``static_z`` (``[B, dim]``) to its nearest row of ``ref`` (``[R, dim]``),
    divided by ``sqrt(dim)``; ``[B]`` float64. Blocks of ``block`` rows bound the memory."""
    if ref.numel() == 0:
        return np.full(static_z.shape[0], math.inf)
    dim = static_z.shape[1]
    out = np.empty(static_z.shape[0], dtype=np.float64)
    # |q|² - 2 q·r + |r|² in float64: one GEMM per block; float32 would cancel to ~1e-3 for a graph in the set
    r = ref.to(torch.float64)
    r2 = (r * r).sum(1)
    for a in range(0, static_z.shape[0], block):
        q = static_z[a:a + block].to(torch.float64)
        d2 = (q * q).sum(1, keepdim=True) - 2.0 * (q @ r.T) + r2
        out[a:a + block] = d2.amin(1).clamp_min_(0.0).sqrt_().numpy()
    return out / math.sqrt(dim)


def fit_novel_floor(err_log: np.ndarray, sigma_log: np.ndarray, *, coverage: float = COVERAGE) -> float:
    """Smallest floor ``f`` with ``coverage`` of ``err <= 2 sqrt(sigma² + f²)`` (also the in-family floor of
    :func:`~dippm_nas.predictor._train.fit_std_floor`).

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


def correction_weight(novelty: np.ndarray, d0: float | np.ndarray, width: float) -> np.ndarray:
    """Share of the network's correction a graph keeps: 1 up to ``d0``, then ``1 - u / width`` with
    ``u = (novelty - d0) / d0``, clipped to [0, 1] (``width = 0``: 0 past ``d0``; ``inf``: always 1). A
    graph whose novelty is unknown (``nan``) keeps its correction. ``d0`` is one threshold or one per
    graph (rows of several checkpoints). ``[B]`` float64."""
    nov = np.asarray(novelty, dtype=np.float64)
    w = np.ones_like(nov)
    if not math.isfinite(width):
        return w
    u = (nov - d0) / np.asarray(d0, dtype=np.float64)
    past = np.isfinite(u) & (u > 0)
    w[past] = 0.0 if width <= 0.0 else np.clip(1.0 - u[past] / width, 0.0, 1.0)
    return w


def fit_shrink_width(err_of: Callable[[float], float], grid: Sequence[float] = SHRINK_GRID) -> float:
    """The width of ``grid`` whose shrunk predictions have the smallest mean absolute log error.

    Args:
        err_of: ``width -> mean |log label - log prediction|`` over the calibration rows (the caller
            rebuilds the predictions with :func:`correction_weight`); ties go to the wider width (less
            shrink).
    """
    errs = [(float(err_of(c)), -c if math.isfinite(c) else -math.inf, c) for c in grid]
    return min(errs)[2]
