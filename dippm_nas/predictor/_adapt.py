"""Online adaptation: the trained ensemble fine-tuned to the candidates measured on the real device.

``predictor.adapt(measurements)`` fits, for one device, one deployment and one search space (or ``"any"``),
two corrections on the measured rows:

1. the **factor calibration** (:mod:`~dippm_nas.predictor._calibrate`: host, GPU and op-class GPU factors of a
   GPU's latency, a shrunk line in log space elsewhere), and on top of it
2. a **residual head per ensemble member**: a ridge regression of what the calibrated prediction still misses
   (``log measured - log calibrated``) on that member's last hidden layer (the 64 values ``fc3`` reads) and
   the graph-level features the network reads (its standardised static features), each standardised on the
   rows (:func:`head_inputs`): warm-started from the checkpoint in the sense that the network's own features
   are kept and only a new last layer is learnt on top of its answer.

Every choice is scored out of group (:mod:`~dippm_nas.predictor._guard`): the rows are grouped by the family their
graphs name, else by clusters of their embeddings. The factor calibration of a target is kept only where the
factors fitted without each group beat the unadapted prediction on it (by ``SE_FACTOR`` standard errors of the paired
gain). The head's ridge penalty (:data:`RIDGE_GRID`) and its shrink towards no head (``w`` in [0, 1], the evidence
of the out-of-group shifts) are chosen by the error of heads fitted without each group on that group, and the head is
kept only when its paired out-of-group gain over no head exceeds ``SE_FACTOR`` standard errors. Its inputs are
clipped to the range of its rows and its shift to :data:`SHIFT_MARGIN` times their largest residual (no
extrapolation beyond the measured part of the space). A target gets a head only with at least
:data:`HEAD_MIN_ROWS` labelled rows.

An adaptation is of one precision: rows of several graph dtypes are fitted on those of the dtype most rows ran in
(:func:`_one_precision`), and a candidate of another dtype keeps its unadapted prediction, flagged
``details["adaptation_other_dtype"]`` (:meth:`Adaptation.applies_to`): another dtype runs other kernels and another
host path, which no out-of-group score over one precision's rows can see.

σ of an adapted figure: the spread of the adapted members (each member's answer plus its own head) and the
root mean square of the chosen head's out-of-group residuals (after its shrink), in quadrature:
``sigma_log = sqrt(std_k(m_k + head_k)^2 + rmse_oog^2)``. Without a head the calibration's σ stays.

Adaptations are stored per :class:`AdaptationKey` (device, :attr:`dippm_nas.Deployment.key`, space) with their
rows (:mod:`~dippm_nas.predictor._adapt_store`); :meth:`Adaptation.apply` is numpy only, so the numpy engine
serves adapted predictions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import io
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas._json import canonical_json, loads_json
from dippm_nas.conformal import check_in_space_scores
from dippm_nas.deployment import Deployment
from dippm_nas.devices import HostProfile, default_host_profile, resolve_device
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.predictor._adapt_rows import StoredAdaptation, read_arrays, version_checksum
from dippm_nas.predictor._calibrate import Calibration, calibration_from_data, calibration_problems
from dippm_nas.predictor._guard import group_cv_head, keep_targets, row_groups
from dippm_nas.predictor._meta import TARGETS

__all__ = ["Adaptation", "AdaptationKey", "ResidualHead", "fit_residual_head", "deployment_key", "merge_rows",
           "head_inputs",
           "HEAD_MIN_ROWS", "RIDGE_GRID", "ADAPT_FORMAT", "ANY_SPACE", "HANDOVER_ROWS"]

logger = logging.getLogger(__name__)

#: The search-space part of a key that matches every space.
ANY_SPACE = "any"
#: Fewest labelled rows of a target before a residual head is considered (below: the factor calibration alone).
#: With 5 rows, heads chosen by leave-one-out made the rest of a host-CPU space worse than the factors on 5 of 6
#: spaces (median MAPE up to +6 points, benchmarks/accuracy/learning_curve.py; docs/adaptation.md).
HEAD_MIN_ROWS = 10
#: The largest head shift, as a multiple of the largest |residual| of its rows: like the network's own bound on its
#: correction (``DELTA_MARGIN``), a head does not correct more than it has seen corrected.
SHIFT_MARGIN = 1.5
#: Ridge penalties tried by leave-one-out cross-validation, on standardised features (the sum of squared
#: log residuals plus ``lambda * |w|^2``): from a head that moves little to one that follows the rows.
RIDGE_GRID: tuple[float, ...] = tuple(float(10.0 ** e) for e in np.arange(-1.0, 4.01, 0.5))
#: Rows from which ``calibrate()`` hands over to ``adapt()`` (benchmarks/accuracy/learning_curve.py; docs/adaptation.md).
HANDOVER_ROWS = 10
#: Version of the stored form (JSON meta + npz arrays).
ADAPT_FORMAT = 2
#: A standardised feature whose spread over the rows is below this is constant there and left out (zeroed).
_CONSTANT_STD = 1e-6


def _one_blas_thread() -> Any:
    """BLAS on one thread (``threadpoolctl``; without it, as configured): the heads' matrices are small."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency; the fit is the same, only slower on a busy machine
        return contextlib.nullcontext()
    return threadpool_limits(1)


def head_inputs(hidden: np.ndarray, static_z: np.ndarray) -> np.ndarray:
    """What a residual head reads: each member's last hidden layer ``[K, G, hidden]`` beside the graphs'
    standardised static features ``[G, static]`` (the same for every member): ``[K, G, hidden + static]``."""
    k = hidden.shape[0]
    return np.concatenate([np.asarray(hidden, dtype=np.float64),
                           np.broadcast_to(np.asarray(static_z, dtype=np.float64), (k, *static_z.shape))], 2)


def deployment_key(device: str, runtime: str = "eager", host: HostProfile | None = None,
                   deployment: Deployment | None = None) -> str:
    """The deployment part of an adaptation's key: :attr:`Deployment.key` of ``deployment`` (a CPU device's:
    of its runtime alone, none of the GPU settings applies), or of the legacy ``runtime`` and ``host`` (the
    default host profile counts as not described)."""
    if deployment is None:
        described = host is not None and host != default_host_profile()
        deployment = Deployment(runtime=runtime, host=host if described else None,
                                framework=host.framework if described and host is not None else None)
    if resolve_device(device).kind != "gpu":
        return Deployment(runtime=deployment.runtime).key
    return deployment.key


@dataclass(frozen=True)
class AdaptationKey:
    """What an adaptation is for: a catalogue device, a deployment (:attr:`Deployment.key`) and a search space
    (a registered name, or :data:`ANY_SPACE`)."""

    device: str
    deployment: str
    space: str = ANY_SPACE

    def __post_init__(self) -> None:
        for name in ("device", "deployment", "space"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise InvalidValueError(f"AdaptationKey.{name} must be a non-empty string, got {v!r}")

    @property
    def digest(self) -> str:
        """SHA-256 of the key's canonical JSON (what the store indexes)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_json(self) -> str:
        return canonical_json(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "AdaptationKey":
        """The key of its :meth:`to_json` text.

        Raises:
            InvalidValueError: text that is not such a JSON object.
        """
        d = loads_json(text, "an adaptation key")
        if not isinstance(d, dict) or set(d) != {"device", "deployment", "space"}:
            raise InvalidValueError(f"an adaptation key is a JSON object of device, deployment and space, got {d!r:.200}")
        return cls(device=d["device"], deployment=d["deployment"], space=d["space"])


@dataclass(frozen=True)
class ResidualHead:
    """One target's residual head: per member ``k``, ``head_k(h) = bias_k + ((h - mean_k) / std_k) . weight_k``.

    Inputs are clipped to the range the rows spanned (``lo``, ``hi``, standardised) and the shift to ``±bound``: a
    linear head is not extrapolated beyond its rows (a Pareto front measured first is the space's edge, and the
    rest of the space lies beyond it).

    Attributes:
        target: the target it corrects (a name of :data:`~dippm_nas.predictor.TARGETS`).
        ridge: the penalty chosen by cross-validation, or ``None``: no head won (the factor calibration alone).
        loo_rmse_log: root mean square of the ensemble's out-of-group residuals with the chosen head, shrunk (log):
            its σ.
        loo_rmse_none_log: the same without a head (the calibrated prediction's residuals).
        n: labelled rows it was fitted on.
        mean, std: ``[K, hidden]`` standardisation of each member's hidden layer on the rows.
        weight: ``[K, hidden]``; ``bias``: ``[K]``.
        lo, hi: ``[K, hidden]``, the standardised inputs' range on the rows; ``bound``: the largest |shift|.
        shrink: the share ``w`` of the fitted head kept (``weight`` and ``bias`` are already scaled by it): the
            out-of-group evidence for it (0 without a head).
        oog_shift: ``[n]`` each row's log shift by the head fitted without its group (``None``: no head); the
            in-space conformal scores read it (not stored).
    """

    target: str
    ridge: float | None
    loo_rmse_log: float
    loo_rmse_none_log: float
    n: int
    mean: np.ndarray
    std: np.ndarray
    weight: np.ndarray
    bias: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    bound: float
    shrink: float = 1.0
    oog_shift: np.ndarray | None = field(default=None, repr=False, compare=False)

    def members(self, hidden: np.ndarray) -> np.ndarray:
        """Each member's head on its hidden layer ``[K, G, hidden]``: ``[K, G]`` log shifts (zeros without a head)."""
        if self.ridge is None:
            return np.zeros(hidden.shape[:2])
        z = (hidden.astype(np.float64) - self.mean[:, None, :]) / self.std[:, None, :]
        z = np.clip(z, self.lo[:, None, :], self.hi[:, None, :])
        return np.clip(np.einsum("kgh,kh->kg", z, self.weight) + self.bias[:, None], -self.bound, self.bound)

    def scalars(self) -> dict[str, Any]:
        return {"target": self.target, "ridge": self.ridge, "loo_rmse_log": self.loo_rmse_log,
                "loo_rmse_none_log": self.loo_rmse_none_log, "n": self.n, "bound": self.bound,
                "shrink": self.shrink}


def fit_residual_head(target: str, hidden: np.ndarray, resid: np.ndarray, *,
                      grid: Sequence[float] = RIDGE_GRID, groups: np.ndarray | None = None) -> ResidualHead:
    """Fit one target's head: its ridge penalty and shrink chosen by leave-group-out error
    (:func:`~dippm_nas.predictor._guard.group_cv_head`; module docstring).

    Args:
        target: the target's name.
        hidden: each member's hidden layer on the rows, ``[K, n, hidden]``.
        resid: ``log measured - log calibrated prediction`` per row, ``[n]``.
        grid: ridge penalties to try.
        groups: ``[n]`` group index per row (:func:`~dippm_nas.predictor._guard.row_groups`); ``None``: each row
            its own group (leave-one-out).

    Raises:
        InvalidValueError: shapes that do not pair up, or residuals that are not finite.
    """
    hidden = np.asarray(hidden, dtype=np.float64)
    r = np.asarray(resid, dtype=np.float64)
    if hidden.ndim != 3 or hidden.shape[1] != r.shape[0]:
        raise InvalidValueError(f"hidden must be [members, rows, hidden] with rows = len(resid) = {r.shape[0]}, "
                                f"got {hidden.shape}")
    if not np.all(np.isfinite(r)):
        raise InvalidValueError(f"residuals of {target} must be finite, got {r.tolist()}")
    k, n, h = hidden.shape
    none_rmse = float(np.sqrt(np.mean(r ** 2))) if n else 0.0
    empty = ResidualHead(target, None, none_rmse, none_rmse, n, np.zeros((k, h)), np.ones((k, h)),
                         np.zeros((k, h)), np.zeros(k), np.zeros((k, h)), np.zeros((k, h)), 0.0, 0.0)
    if n < HEAD_MIN_ROWS:
        return empty
    g = np.arange(n) if groups is None else np.asarray(groups)
    if g.shape != (n,):
        raise InvalidValueError(f"groups must hold one group per row ({n}), got shape {g.shape}")
    mean = hidden.mean(1)
    std = hidden.std(1)
    live = std > _CONSTANT_STD
    std = np.where(live, std, 1.0)
    z = np.where(live[:, None, :], (hidden - mean[:, None, :]) / std[:, None, :], 0.0)  # [K, n, h]
    # the intercept is a penalised column of ones like the others: a large penalty is no head at all (the
    # calibrated prediction as it is), not a shift by the rows' mean residual
    x = np.concatenate([z, np.ones((k, n, 1))], 2)
    with _one_blas_thread():
        choice = group_cv_head(x, r, g, grid, SHIFT_MARGIN)
        if choice.ridge is None:
            return empty
        lam = choice.ridge
        coef = np.zeros((k, h + 1))
        for m in range(k):
            u, s, vt = np.linalg.svd(x[m], full_matrices=False)
            coef[m] = choice.shrink * (vt.T @ ((s / (s ** 2 + lam)) * (u.T @ r)))
    weight, bias = coef[:, :h], coef[:, h]
    bound = SHIFT_MARGIN * float(np.max(np.abs(r)))
    return ResidualHead(target, lam, choice.rmse_log, none_rmse, n, mean, std, weight, bias,
                        z.min(1), z.max(1), bound, choice.shrink, choice.oog_shift)


@dataclass(frozen=True)
class Adaptation:
    """A fitted adaptation of one predictor to one :class:`AdaptationKey` (see the module docstring).

    Attributes:
        key: what it is for.
        checkpoint_sha256: the SHA-256 of the checkpoint (or of its weights) it was fitted on; another checkpoint
            ignores it.
        rows: distinct measured graphs it was fitted on (duplicates averaged).
        calibration: the factor calibration fitted on the same rows (``None`` when no target had two labels).
        heads: ``{target: ResidualHead}``.
        version: its number in the store (0: not stored).
        created_at: Unix seconds.
        rows_ignored: stored rows of its key left out of the fit (a checksum that did not match, a row that did
            not decode); its predictions say so (``details["adaptation_rows_ignored"]``).
        guard: what the leave-group-out guard saw: ``groups_by`` (``"family"``, ``"clusters"`` or ``"rows"``),
            ``groups`` (how many), ``factor_groups_by`` (the grouping the factors were scored with: ``"rows"`` where
            embedding clusters left fewer than half the rows with a fit of the others), ``factors_kept`` (per target: did
            the factor calibration win out of group), ``dtypes`` (the precision it was fitted on and applies to,
            :meth:`applies_to`) and ``rows_other_dtypes`` (measured rows of other precisions left out of the fit).
        conformal_scores: ``{target: [s, ...]}``, the in-space conformal scores of its rows (:mod:`dippm_nas.conformal`):
            ``s = log(measured / predicted) / sigma_log`` with the prediction of each row made by the factors fitted
            without its group (where the factors are kept; else the unadapted prediction) plus the head fitted
            without its group (where a head is kept), and ``sigma_log`` the adapted prediction's own σ of that row.
            ``Budgets(..., confidence=c)`` reads them for its adapted predictions when there are enough for ``c``.
            Empty for a version stored without them.
    """

    key: AdaptationKey
    checkpoint_sha256: str
    rows: int
    calibration: Calibration | None
    heads: dict[str, ResidualHead] = field(default_factory=dict)
    version: int = 0
    created_at: float = field(default_factory=time.time)
    rows_ignored: int = 0
    guard: dict[str, Any] = field(default_factory=dict)
    conformal_scores: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "conformal_scores", check_in_space_scores(self.conformal_scores,
                                                                           "Adaptation.conformal_scores"))

    @property
    def has_heads(self) -> bool:
        return any(h.ridge is not None for h in self.heads.values())

    @property
    def dtypes(self) -> frozenset[str] | None:
        """The precisions (graph dtypes) its rows ran in (``guard["dtypes"]``); ``None``: not recorded (a version
        fitted before it was), applied to every dtype."""
        d = self.guard.get("dtypes")
        return frozenset(str(x) for x in d) if isinstance(d, list) and d else None

    def applies_to(self, graph: OperatorGraph) -> bool:
        """Whether its factors and heads apply to ``graph``: its dtype is one the rows ran in. An adaptation is not
        extrapolated to a precision none of its rows measured (another dtype runs other kernels and another host
        path: fitted on float16 rows, the TITAN RTX's host factor made the float32 models 20 % off)."""
        d = self.dtypes
        return d is None or graph.spec.dtype in d

    def shifts(self, member_out: np.ndarray, hidden: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per target with a head: ``(mean log shift [G], adapted members' log spread [G])``.

        Args:
            member_out: the members' log answers ``[K, G, 3]`` (``infer_hidden``'s first array).
            hidden: their last hidden layers ``[K, G, hidden]``.
        """
        out = {}
        for t, head in self.heads.items():
            if head.ridge is None:
                continue
            hm = head.members(hidden)  # [K, G]
            adapted = member_out[:, :, TARGETS.index(t)].astype(np.float64) + hm
            spread = adapted.std(0) if adapted.shape[0] > 1 else np.zeros(adapted.shape[1])
            out[t] = (hm.mean(0), spread)
        return out

    # ------------------------------------------------------------------ stored form
    def meta(self) -> dict[str, Any]:
        """The JSON part of the stored form (the arrays are :meth:`arrays`)."""
        return {"format": ADAPT_FORMAT, "key": dataclasses.asdict(self.key),
                "checkpoint_sha256": self.checkpoint_sha256, "rows": self.rows, "version": self.version,
                "created_at": self.created_at,
                "calibration": None if self.calibration is None else dataclasses.asdict(self.calibration),
                "heads": [h.scalars() for h in self.heads.values()], "rows_ignored": self.rows_ignored,
                "guard": self.guard, "conformal_scores": self.conformal_scores}

    def arrays_npz(self) -> bytes:
        """The heads' arrays as an ``.npz`` (plain float64 arrays; read with ``allow_pickle=False``)."""
        arrays = {}
        for t, hd in self.heads.items():
            for name in ("mean", "std", "weight", "bias", "lo", "hi"):
                arrays[f"{t}.{name}"] = np.asarray(getattr(hd, name), dtype=np.float64)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    def checksum(self, meta_json: str, npz: bytes) -> str:
        """The keyed checksum of its stored form (:func:`~dippm_nas.predictor._adapt_rows.version_checksum`: bound
        to its key, checkpoint hash and row count)."""
        return version_checksum(self.key.digest, self.checkpoint_sha256, self.rows, meta_json, npz)

    @classmethod
    def from_stored(cls, stored: StoredAdaptation, key: AdaptationKey) -> "Adaptation":
        """The adaptation of a stored version of ``key`` (inverse of :meth:`meta` / :meth:`arrays_npz`).

        The checksum is recomputed with ``key`` (the key asked for), the columns' checkpoint hash and row count,
        and the meta JSON and arrays; the key, checkpoint hash, row count and version the meta JSON states must be
        the columns' and ``key``. The meta JSON is read bounded (depth and length) and the arrays from their headers
        (:func:`~dippm_nas.predictor._adapt_rows.read_arrays`).

        Raises:
            InvalidValueError: a checksum that does not match, another key, another format, or contents that do
                not decode (null or nested meta, arrays beyond their bounds or of other shapes).
        """
        want = version_checksum(key.digest, stored.checkpoint_sha256, stored.rows, stored.meta_json, stored.arrays)
        if not hmac.compare_digest(want, stored.checksum):
            raise InvalidValueError("the stored adaptation's checksum is not the one of its contents under this key "
                                    "(edited, copied from another key, or damaged)")
        d = loads_json(stored.meta_json, "the stored adaptation's meta JSON")
        if not isinstance(d, dict):
            raise InvalidValueError(f"the stored adaptation's meta JSON is a JSON {type(d).__name__}, not an object")
        try:
            ad = cls._decode(d, stored.arrays)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
            raise InvalidValueError(f"the stored adaptation does not decode: {type(e).__name__}: {e}") from e
        stated = (ad.key, ad.checkpoint_sha256, ad.rows, ad.version)
        if stated != (key, stored.checkpoint_sha256, stored.rows, stored.version):
            raise InvalidValueError(f"the stored adaptation states key {ad.key}, checkpoint {ad.checkpoint_sha256[:12]}"
                                    f"..., {ad.rows} rows, version {ad.version}; its row is of key {key}, checkpoint "
                                    f"{stored.checkpoint_sha256[:12]}..., {stored.rows} rows, version {stored.version}")
        return ad

    @classmethod
    def _decode(cls, d: dict[str, Any], npz: bytes) -> "Adaptation":
        """The adaptation of a meta dict and its arrays (raises what a malformed one gives)."""
        if d.get("format") != ADAPT_FORMAT:
            raise ValueError(f"format {d.get('format')!r} is not {ADAPT_FORMAT}")
        arrays = read_arrays(npz)
        heads = {}
        for s in d["heads"]:
            t = s["target"]
            if t not in TARGETS:
                raise ValueError(f"head target {t!r} is not one of {TARGETS}")
            heads[t] = ResidualHead(t, None if s["ridge"] is None else float(s["ridge"]),
                                    float(s["loo_rmse_log"]), float(s["loo_rmse_none_log"]), int(s["n"]),
                                    *_head_arrays(arrays, t), float(s["bound"]), _shrink(s.get("shrink", 1.0)))
        cal = None if d["calibration"] is None else calibration_from_data(d["calibration"], "its calibration")
        problems = [] if cal is None else calibration_problems(cal)
        if problems:
            raise ValueError(f"its calibration is implausible: {'; '.join(problems)}")
        key = d["key"]
        return cls(key=AdaptationKey(**key),
                   checkpoint_sha256=str(d["checkpoint_sha256"]), rows=_int(d["rows"]), calibration=cal, heads=heads,
                   version=_int(d["version"]), created_at=float(d["created_at"]),
                   rows_ignored=_int(d.get("rows_ignored", 0)), guard=_guard(d.get("guard")),
                   conformal_scores=check_in_space_scores(d.get("conformal_scores", {})))


def _shrink(v: Any) -> float:
    """A head's shrink of the meta JSON: a number in [0, 1]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
        raise ValueError(f"shrink {v!r} is not a number in [0, 1]")
    return float(v)


def _guard(v: Any) -> dict[str, Any]:
    """The guard record of the meta JSON (an object, or absent)."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"guard {v!r} is not an object")
    return dict(v)


def _int(v: Any) -> int:
    """An integer of the meta JSON (not a bool, a float or text)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{v!r} is not an integer")
    return v


def _head_arrays(arrays: Mapping[str, np.ndarray], t: str) -> tuple[np.ndarray, ...]:
    """``mean, std, weight, bias, lo, hi`` of target ``t``'s head: ``[K, h]`` each but ``bias`` ``[K]``, finite,
    ``std > 0``."""
    mean, std, weight, bias, lo, hi = (arrays[f"{t}.{n}"] for n in ("mean", "std", "weight", "bias", "lo", "hi"))
    if mean.ndim != 2 or any(a.shape != mean.shape for a in (std, weight, lo, hi)) or bias.shape != mean.shape[:1]:
        shapes = [a.shape for a in (mean, std, weight, bias, lo, hi)]
        raise ValueError(f"the arrays of the {t} head have shapes {shapes}, expected [K, h] five times and [K]")
    if not all(np.all(np.isfinite(a)) for a in (mean, std, weight, bias, lo, hi)) or not np.all(std > 0):
        raise ValueError(f"the arrays of the {t} head are not finite (or a std is not > 0)")
    return mean, std, weight, bias, lo, hi


def merge_rows(pairs: Sequence[tuple[OperatorGraph, Mapping[str, float]]], key_of: Any
               ) -> list[tuple[OperatorGraph, dict[str, float]]]:
    """Rows of one graph (``key_of(graph)`` equal) merged: each target's geometric mean of its labels."""
    groups: dict[str, tuple[OperatorGraph, dict[str, list[float]]]] = {}
    for g, y in pairs:
        gk = key_of(g)
        entry = groups.setdefault(gk, (g, {}))
        for t, v in y.items():
            entry[1].setdefault(t, []).append(math.log(float(v)))
    return [(g, {t: math.exp(sum(v) / len(v)) for t, v in ys.items()}) for g, ys in groups.values()]


# ---------------------------------------------------------------------------------------------- applying
def apply_adaptation(adaptation: Adaptation, preds: Sequence[Any], member_out: np.ndarray | None,
                     hidden: np.ndarray | None) -> list[Any]:
    """``preds`` (the calibrated predictions of the adaptation's key) with each head's shift applied, σ from the
    adapted members' spread and the head's leave-one-out residuals, and ``details`` saying so
    (``adaptation_version``, ``adaptation_rows``, ``adaptation_rows_ignored`` when stored rows were left out of
    its fit, per adapted target ``adaptation_factor_<target>`` and ``adaptation_ridge_<target>``)."""
    shifts = adaptation.shifts(member_out, hidden) if adaptation.has_heads and hidden is not None else {}
    out = []
    for j, p in enumerate(preds):
        details = {**p.details, "adaptation_version": float(adaptation.version),
                   "adaptation_rows": float(adaptation.rows)}
        if adaptation.rows_ignored:
            details["adaptation_rows_ignored"] = float(adaptation.rows_ignored)
        changes: dict[str, Any] = {}
        for t, (shift, spread) in shifts.items():
            v = getattr(p, t)
            if v is None:
                continue
            f = math.exp(float(shift[j]))
            s_log = math.hypot(float(spread[j]), adaptation.heads[t].loo_rmse_log)
            changes[t] = v * f
            changes[f"{t}_std"] = v * f * s_log
            changes[f"{t.split('_')[0]}_source"] = "calibrated"
            details[f"adaptation_factor_{t}"] = f
            details[f"adaptation_ridge_{t}"] = float(adaptation.heads[t].ridge or 0.0)
        out.append(dataclasses.replace(p, **changes, details=details))
    return out


# ---------------------------------------------------------------------------------------------- fitting
def _predict_with(predictor: Any, graphs: Sequence[OperatorGraph], cal: Calibration | None,
                  deployment: Deployment) -> list[Any]:
    """``graphs`` predicted with the factor calibration ``cal`` alone (no adaptation); the caller restores."""
    predictor.calibration, predictor.adaptation = cal, None
    predictor.clear_prediction_cache()
    return predictor.predict_graphs(graphs, mig=False, deployment=deployment)


def _log_resid(rows: Sequence[tuple[OperatorGraph, Mapping[str, float]]], preds: Sequence[Any | None],
               targets: Sequence[str]) -> dict[str, np.ndarray]:
    """``{target: [n] log measured - log predicted}``, NaN where a row has no label or no prediction."""
    out = {}
    for t in targets:
        v = np.full(len(rows), np.nan)
        for i, (_, y) in enumerate(rows):
            p = preds[i]
            pv = None if p is None else getattr(p, t)
            if t in y and pv is not None and pv > 0:
                v[i] = math.log(y[t]) - math.log(pv)
        out[t] = v
    return out


def _out_of_group_factors(predictor: Any, rows: Sequence[tuple[OperatorGraph, Mapping[str, float]]],
                          groups: np.ndarray, deployment: Deployment) -> list[Any | None]:
    """Each row predicted with the factor calibration fitted without its group (``None``: no fit possible)."""
    out: list[Any | None] = [None] * len(rows)
    for gi in np.unique(groups):
        te = np.flatnonzero(groups == gi)
        tr = [rows[i] for i in np.flatnonzero(groups != gi)]
        if len(tr) < 2:
            continue
        try:
            cal = predictor.fit_factor_calibration(tr, deployment=deployment)
        except DippmNasError as e:
            logger.debug("no factor calibration without group %d: %s", gi, e)
            continue
        preds = _predict_with(predictor, [rows[i][0] for i in te], cal, deployment)
        for i, p in zip(te, preds):
            out[i] = p
    return out


def _without(cal: Calibration, drop: Sequence[str]) -> Calibration | None:
    """``cal`` without the targets ``drop`` (``None`` when none is left)."""
    if not drop:
        return cal
    keep = lambda d: {k: v for k, v in d.items() if k not in drop}  # noqa: E731
    out = dataclasses.replace(cal, coef=keep(cal.coef), n=keep(cal.n), kept=keep(cal.kept), span=keep(cal.span),
                              timeline=None if "latency_ms" in drop else cal.timeline)
    return out if out.coef or out.timeline is not None else None


def _one_precision(rows: list[tuple[OperatorGraph, Mapping[str, float]]]
                   ) -> tuple[list[tuple[OperatorGraph, Mapping[str, float]]], int]:
    """The rows of the precision (graph dtype) most rows ran in (ties: the first in name order), and how many rows
    of other precisions were left out. A factor fitted on one precision's rows does not carry to another's (other
    kernels, another host path), and the guard cannot tell from rows of one precision; the adaptation is of one."""
    counts: dict[str, int] = {}
    for g, _ in rows:
        counts[g.spec.dtype] = counts.get(g.spec.dtype, 0) + 1
    if len(counts) <= 1:
        return rows, 0
    keep = min(counts, key=lambda d: (-counts[d], d))
    kept = [r for r in rows if r[0].spec.dtype == keep]
    return kept, len(rows) - len(kept)


def fit_adaptation(predictor: Any, rows: Sequence[tuple[OperatorGraph, Mapping[str, float]]], key: AdaptationKey,
                   deployment: Deployment) -> Adaptation | None:
    """Fit an :class:`Adaptation` of a :class:`~dippm_nas.predictor.GnnPredictor` on rows measured under
    ``deployment`` (module docstring); ``None`` when fewer than two distinct graphs are measured. The predictor
    is left as it was. The factor calibration of a target is kept only where the factors fitted without each
    group of rows beat the unadapted prediction on that group, and each head is chosen out of group
    (:mod:`~dippm_nas.predictor._guard`).

    Raises:
        DippmNasError: no row holds a label of the checkpoint's targets.
    """
    rows = merge_rows(rows, key_of=predictor.graph_key)
    rows, other_dtypes = _one_precision(rows)
    if len(rows) < 2:
        return None
    graphs = [g for g, _ in rows]
    targets = list(predictor.meta.targets)
    saved = (predictor.calibration, predictor.adaptation)
    with predictor.one_network_pass(graphs):
        member_out, hidden = predictor.member_outputs(graphs)
        groups = row_groups([g.source for g in graphs], np.asarray(hidden, dtype=np.float64).mean(0))
        try:
            raw = _predict_with(predictor, graphs, None, deployment)
            cal: Calibration | None = predictor.fit_factor_calibration(rows, deployment=deployment)
            oog = _out_of_group_factors(predictor, rows, groups.index, deployment)
            factor_groups = groups.by
            if groups.by == "clusters" and 2 * sum(p is not None for p in oog) < len(rows):
                # clusters of one space that leave most rows without a fit of the others (4 + 1 rows): each row its
                # own group for the factors, a fit of one to three numbers (families stay the groups: a family's
                # factors are what does not carry to the next family)
                oog = _out_of_group_factors(predictor, rows, np.arange(len(rows)), deployment)
                factor_groups = "rows"
            kept = keep_targets(_log_resid(rows, raw, targets), _log_resid(rows, oog, targets))
            cal = _without(cal, [t for t in targets if not kept.get(t, False)])
            preds = raw if cal is None else _predict_with(predictor, graphs, cal, deployment)
        finally:
            predictor.calibration, predictor.adaptation = saved
            predictor.clear_prediction_cache()
    heads = {}
    for t in targets:
        idx = [i for i, (_, y) in enumerate(rows) if t in y and getattr(preds[i], t) is not None]
        if len(idx) < 2:
            continue
        r = np.array([math.log(rows[i][1][t]) - math.log(getattr(preds[i], t)) for i in idx])
        heads[t] = fit_residual_head(t, hidden[:, idx], r, groups=groups.index[idx])
    guard = {"groups_by": groups.by, "groups": groups.count, "factor_groups_by": factor_groups,
             "factors_kept": {t: bool(v) for t, v in sorted(kept.items())},
             "dtypes": [graphs[0].spec.dtype], "rows_other_dtypes": other_dtypes}
    logger.debug("adaptation of %s on %d rows: %s", key, len(rows), guard)
    ad = Adaptation(key=key, checkpoint_sha256=predictor.checkpoint_hash(), rows=len(rows), calibration=cal,
                    heads=heads, guard=guard)
    adapted = apply_adaptation(ad, preds, member_out, hidden)
    # out of sample: the factors fitted without the row's group where they are kept (else the unadapted network)
    scores = {t: in_space_scores(rows, t, preds, oog if kept.get(t, False) and cal is not None else raw,
                                 heads.get(t), adapted) for t in targets}
    return dataclasses.replace(ad, conformal_scores={t: v for t, v in scores.items() if v})


def in_space_scores(rows: Sequence[tuple[OperatorGraph, Mapping[str, float]]], target: str,
                    preds: Sequence[Any], base: Sequence[Any | None], head: ResidualHead | None,
                    adapted: Sequence[Any]) -> list[float]:
    """The in-space conformal scores of ``target`` (:attr:`Adaptation.conformal_scores`): per labelled row,
    ``log(measured / out-of-sample prediction) / sigma_log`` with the out-of-sample prediction ``base[i]`` (the
    factors fitted without the row's group, or the unadapted prediction where the factors are not kept) shifted by
    the head fitted without its group (``head.oog_shift``, in the order of the head's labelled rows), and
    ``sigma_log`` the adapted prediction's own ``std / mean`` of the row (``preds``: the calibrated predictions the
    head was fitted on, which tell the head's rows). Rows without a label, an out-of-sample
    prediction or a σ give no score."""
    shift = head.oog_shift if head is not None and head.ridge is not None else None
    out: list[float] = []
    j = -1  # position among the rows the head was fitted on (labelled, with a calibrated prediction)
    for i, (_, y) in enumerate(rows):
        labelled = target in y and getattr(preds[i], target) is not None
        j += labelled
        b = base[i]
        bv = None if b is None else getattr(b, target)
        a, sd = getattr(adapted[i], target), getattr(adapted[i], f"{target}_std")
        if not labelled or bv is None or bv <= 0 or a is None or sd is None or a <= 0 or sd <= 0:
            continue
        log_pred = math.log(bv) + (float(shift[j]) if shift is not None and j < len(shift) else 0.0)
        s = (math.log(y[target]) - log_pred) / (float(sd) / float(a))
        if math.isfinite(s):
            out.append(s)
    return out


def check_rows_key(measurements: Sequence[Any], key: AdaptationKey) -> None:
    """Refuse rows that say they belong to another key: a ``(graph, dict)`` row whose ``"device"`` (a catalogue
    id) is not the key's device, or whose ``"deployment"`` (a :class:`Deployment` or its key) is not the key's.

    Raises:
        InvalidValueError: naming the row, what it says and the key.
    """
    for i, item in enumerate(measurements):
        m = item[1] if isinstance(item, (tuple, list)) and len(item) == 2 else None
        if not isinstance(m, Mapping):
            continue
        dev = m.get("device")
        if dev is not None and resolve_device(str(dev)).id != key.device:
            raise InvalidValueError(f"measurements[{i}] is of device {dev!r}, this adaptation is of {key.device!r}: "
                                    "rows of another device adapt that device's predictor")
        dep = m.get("deployment")
        if dep is not None:
            dep_key = dep.key if isinstance(dep, Deployment) else str(dep)
            if dep_key != key.deployment:
                raise InvalidValueError(f"measurements[{i}] is of deployment {dep_key}, this adaptation is of "
                                        f"{key.deployment}: adapt each deployment with its own rows")
