"""How far a graph lies from the training graphs, and the std floor that goes with being far.

The ensemble's spread says little about a family it never saw: on held-out families its members agree
with each other while all being off by a family-wide offset (host CPU, resnet + vit held out: ±2σ held
only 74-84 % of the rows with the in-family floor). A novelty score and a second floor fix that:

- the **reference set** is up to :data:`~dippm_nas.training.MAX_REFERENCE` training graphs' graph-level features (static
  features, standardised and clipped as the network sees them), stored in the checkpoint;
- a graph's **novelty** is its distance to the nearest reference graph, divided by ``sqrt(dim)`` (an RMS
  of per-feature z-score differences);
- ``d0`` is the :data:`~dippm_nas.training.NOVELTY_QUANTILE` quantile of the validation graphs' novelty
  (in-family graphs the network was selected on), and a graph with novelty above ``d0`` is **novel**;
- the **novel floor** is fitted on calibration rows of families the checkpoint never saw (never its test
  rows) so that ±2σ covers :data:`~dippm_nas.training.COVERAGE` of them; a novel graph's σ is
  ``sqrt(σ_members² + max(floor, novel_floor)²)``;
- a **graded floor** (``graded_floor_log``) replaces that one step by a floor that grows with novelty: knots
  ``(novelty, floor)``, non-decreasing, linear in between and constant beyond the first and last knot, each
  knot fitted on a bin of calibration rows (validation rows of every source plus rows of families the
  checkpoint never saw) so that ±2σ covers :data:`~dippm_nas.training.COVERAGE` of the bin. It applies to
  every graph with a novelty score, novel or not: σ is ``sqrt(σ_members² + max(floor, graded(novelty))²)``.
  ``d0`` then only says which graphs are novel (``details["novel"]``) and where a correction shrink starts.

The checkpoint's ``meta.novelty`` says where the calibration rows came from. Without one (no unseen
family available when it was trained) graphs are still scored, and σ is the in-family one.

Far from its training graphs the network's correction of the prior is itself a guess: on a held-out
modality (host CPU, bert never seen) the operator-table prior alone read 9.6 % and the corrected figure
15.8-20.6 %. So a checkpoint may also carry a **correction shrink** per target: with the relative excess
``u = (novelty - d0) / d0``, a novel graph keeps the share ``w = clip(1 - u / c, 0, 1)`` of the correction
(``log prediction = log prior + w * correction``); ``c`` is fitted on rows of families unseen by
family-split twins (``scripts/fit/fit_novelty_twins.py``), ``c = 0`` answers with the prior as soon as a graph is
novel, a target without a ``c`` is not shrunk. Graphs at or below ``d0`` are never shrunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas.errors import InvalidValueError

__all__ = ["NoveltyFloor", "novelty_scores", "correction_weight", "novelty_floor_log"]

@dataclass(frozen=True)
class NoveltyFloor:
    """The novel-graph std floor of a checkpoint (``CheckpointMeta.novelty`` as a dict).

    Attributes:
        d0: novelty above which a graph is novel (validation quantile).
        floor_log: per target, the log-space std floor of novel graphs (novelty above ``d0``); with a
            graded floor for the target, its value at ``d0`` (what a reader without graded floors applies).
        calibrated_on: the rows the floor (and the shrink) were fitted on (families, count, where from).
        shrink: per target, the width ``c`` of the correction shrink (see the module docstring); a
            target absent here keeps its whole correction. Absent from older metadata.
        validated_max: the largest novelty among the held-out rows the floor was fitted on: the network's
            correction has been checked on unseen families up to this distance and no further, so a graph
            beyond it gets the prior (its correction weight is 0). ``None``: no such limit (older metadata).
        graded_floor_log: per target, the log-space std floor as a function of novelty: knots
            ``((novelty, floor), ...)`` with increasing novelty and non-decreasing floor, linear in between,
            constant beyond the ends (see :meth:`floor_at`); it replaces ``floor_log`` for that target and
            applies to every graph, novel or not. Absent from older metadata (a step at ``d0`` then).
    """

    d0: float
    floor_log: dict[str, float]
    calibrated_on: str
    shrink: dict[str, float] = field(default_factory=dict)
    validated_max: float | None = None
    graded_floor_log: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for t, knots in self.graded_floor_log.items():
            _check_knots(t, knots)
        if self.validated_max is not None and not (math.isfinite(self.validated_max) and self.validated_max > 0):
            raise InvalidValueError(f"validated_max must be a finite novelty > 0 or None, got {self.validated_max!r}")
        bad = {t: c for t, c in self.shrink.items() if not (math.isfinite(c) and c >= 0.0)}
        if bad:
            raise InvalidValueError(f"shrink widths must be finite and >= 0 (0: the prior answers for novel graphs), "
                             f"got {bad}")

    def to_dict(self) -> dict[str, Any]:
        d = {"d0": self.d0, "floor_log": dict(self.floor_log), "calibrated_on": self.calibrated_on}
        if self.shrink:
            d["shrink"] = dict(self.shrink)
        if self.validated_max is not None:
            d["validated_max"] = self.validated_max
        if self.graded_floor_log:
            d["graded_floor_log"] = {t: [[float(n), float(f)] for n, f in k] for t, k in self.graded_floor_log.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NoveltyFloor":
        return cls(d0=float(d["d0"]), floor_log={k: float(v) for k, v in d["floor_log"].items()},
                   calibrated_on=str(d["calibrated_on"]),
                   shrink={k: float(v) for k, v in d.get("shrink", {}).items()},
                   validated_max=None if d.get("validated_max") is None else float(d["validated_max"]),
                   graded_floor_log={t: tuple((float(n), float(f)) for n, f in k)
                                     for t, k in d.get("graded_floor_log", {}).items()})

    def floor_at(self, target: str, novelty: float) -> float:
        """The log-space σ floor a graph of this novelty gets for ``target`` from novelty (0 where none
        applies; the in-family floor is the checkpoint's ``std_floor_log``): the graded floor where the
        target has one, else ``floor_log`` above ``d0``. An unknown novelty (``nan``) gets 0."""
        return novelty_floor_log(self.to_dict(), target, novelty)


def _check_knots(target: str, knots: Any) -> None:
    """Raise :class:`InvalidValueError` unless ``knots`` are finite ``(novelty, floor)`` pairs, novelty
    increasing and >= 0, floor >= 0 and non-decreasing."""
    try:
        pts = [(float(n), float(f)) for n, f in knots]
    except (TypeError, ValueError) as e:
        raise InvalidValueError(f"graded_floor_log[{target!r}] must be (novelty, floor) pairs, got {knots!r}") from e
    ok = (len(pts) > 0 and all(math.isfinite(n) and math.isfinite(f) and n >= 0.0 and f >= 0.0 for n, f in pts)
          and all(b[0] > a[0] and b[1] >= a[1] for a, b in zip(pts, pts[1:])))
    if not ok:
        raise InvalidValueError(f"graded_floor_log[{target!r}] must be at least one finite (novelty, floor) knot "
                                f"with novelty >= 0 increasing and floor >= 0 non-decreasing, got {pts}")


def novelty_floor_log(novelty_meta: dict[str, Any] | None, target: str, novelty: float) -> float:
    """The novelty part of a graph's log-space σ floor for ``target``, read from a checkpoint's
    ``meta.novelty`` dict (:meth:`NoveltyFloor.to_dict`): the graded floor interpolated at ``novelty``
    where the target has one, else the novel floor ``floor_log`` when ``novelty > d0``, else 0. ``None``
    metadata or an unknown novelty (``nan``) give 0."""
    if novelty_meta is None or not math.isfinite(novelty):
        return 0.0
    knots = novelty_meta.get("graded_floor_log", {}).get(target)
    if knots:
        xs = [float(k[0]) for k in knots]
        ys = [float(k[1]) for k in knots]
        return float(np.interp(novelty, xs, ys))
    fl = novelty_meta.get("floor_log", {})
    if target in fl and novelty > float(novelty_meta["d0"]):
        return float(fl[target])
    return 0.0


def novelty_scores(static_z: Any, ref: Any, *, block: int = 1024) -> np.ndarray:
    """Distance of each row of ``static_z`` (``[B, dim]``) to its nearest row of ``ref`` (``[R, dim]``),
    divided by ``sqrt(dim)``; ``[B]`` float64. Blocks of ``block`` rows bound the memory.

    Either argument is a numpy array or a CPU tensor. With a tensor (the torch ensemble's reference set) the
    product runs in torch: numpy's BLAS threads, once started in a process that runs torch, keep spinning beside
    torch's; on 2 cores they made the torch ensemble's pass on 300 graphs take 145 ms of CPU time instead of 90.
    """
    if _is_tensor(static_z) or _is_tensor(ref):
        import torch

        def to64(x: Any) -> Any:
            return torch.as_tensor(x).to(torch.float64)

        def gemm(q: Any, r_t: Any) -> np.ndarray:
            return (q @ r_t).numpy()
    else:
        def to64(x: Any) -> Any:
            return np.asarray(x, dtype=np.float64)

        def gemm(q: Any, r_t: Any) -> np.ndarray:
            return q @ r_t
    r = to64(ref)
    n = static_z.shape[0]
    if r.shape[0] == 0:
        return np.full(n, math.inf)
    dim = static_z.shape[1]
    out = np.empty(n, dtype=np.float64)
    # |q|² - 2 q·r + |r|² in float64: one GEMM per block, the rest in place (the [block, R] temporaries cost more
    # than the GEMM); float32 would cancel to ~1e-3 for a graph in the set
    r2 = np.asarray((r * r).sum(1))
    r_t = r.T.contiguous() if hasattr(r, "contiguous") else np.ascontiguousarray(r.T)
    for a in range(0, n, block):
        q = to64(static_z[a:a + block])
        d2 = gemm(q, r_t)
        d2 *= -2.0
        d2 += np.asarray((q * q).sum(1)).reshape(-1, 1)
        d2 += r2
        out[a:a + block] = np.sqrt(np.maximum(d2.min(1), 0.0))
    return out / math.sqrt(dim)


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")


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
