"""Conformal calibration of a checkpoint's predictive distribution: budgets that hold with a stated probability.

``Budgets(latency_ms=20, confidence=0.9)`` admits a candidate when ``P(true latency <= 20 ms) >= 0.9`` by the
checkpoint's own record on measured rows it did not train on, not by a Gaussian reading of its σ. The record is a
split-conformal calibration in log space (:class:`ConformalCalibration`): for each calibration row the score

    s = log(measured / predicted mean) / sigma_log,        sigma_log = predicted std / predicted mean

and, at a confidence ``c``, the conformal quantile ``q_c`` of the scores of the prediction's **regime** (the
``ceil((n + 1) c)``-th smallest of its ``n`` scores). A figure is then bounded by

    mean * exp(q_c * sigma_log)

(for a minimum, ``mean * exp(-q_c * sigma_log)`` with the scores of ``-s``). Regimes (:func:`regime_of`):
``host-bound`` / ``gpu-bound`` (``details["host_bound"]``), ``described`` / ``undescribed`` (the deployment leaves
no setting assumed: ``labels["deployment_assumed"] == ""``, or only the autocast of a float32 graph, which is none
and moves neither centre nor σ), ``adapted`` / ``not-adapted`` (``details`` carries an
``adaptation_version``). A regime with fewer than :data:`MIN_REGIME_ROWS` calibration rows, or too few for the
confidence asked (``ceil((n + 1) c) > n``), falls back to the wider one: its adaptation state dropped first, then
the deployment, then everything (``*|*|*``); the check says so in its ``labels``.

**In-space scores.** An adapted prediction (``predictor.adapt(rows)``) is checked, where its adaptation keeps enough
out-of-sample scores of its own rows (:attr:`~dippm_nas.predictor.Adaptation.conformal_scores`: each row predicted
by factors and head fitted without its group), with the conformal quantile of those scores
(:func:`in_space_margin`; regime :data:`IN_SPACE_REGIME`): the search's own validated rows, not the checkpoint's
calibration rows of other spaces. ``n`` scores answer a confidence ``c`` when ``ceil((n + 1) c) <= n`` (9 at 0.9,
19 at 0.95); fewer fall back to the checkpoint's calibration, labelled.

The file lies next to the checkpoint (:func:`conformal_path`: ``<checkpoint>.conformal.json``) with the SHA-256 of
the checkpoint it was fitted for, the scores per regime and, per regime and confidence, the coverage measured on
rows kept out of the scores (``coverage``): what ``P(true <= bound)`` was on them. A file without coverage, of
another checkpoint, or not this format is a :class:`~dippm_nas.errors.CheckpointError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from dippm_nas._files import write_output
from dippm_nas._json import read_json_file
from dippm_nas._numbers import as_real
from dippm_nas.errors import BudgetError, CheckpointError, InvalidValueError

__all__ = ["ConformalCalibration", "ConformalMargin", "CONFORMAL_FORMAT", "MIN_REGIME_ROWS", "WIDEST_REGIME",
           "check_confidence", "conformal_path", "regime_of", "wider_regimes", "conformal_score",
           "fit_conformal", "conformal_for", "CONFIDENCES", "IN_SPACE_REGIME", "in_space_margin",
           "check_in_space_scores"]

#: Version of the JSON form.
CONFORMAL_FORMAT = 1
#: Fewest calibration rows a regime needs before its own scores are used (else the wider regime's).
MIN_REGIME_ROWS = 30
#: The regime every row belongs to.
WIDEST_REGIME = "*|*|*"
#: The regime label of a margin read from an adaptation's own out-of-sample scores (:func:`in_space_margin`).
IN_SPACE_REGIME = "in-space"
#: The dtypes whose undescribed autocast a prediction leaves open (:data:`dippm_nas.deployment.AUTOCAST_DTYPES`, a
#: later layer; ``tests/test_conformal.py`` checks they are equal).
_HALF_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
#: Confidences whose held-out coverage a fit records.
CONFIDENCES: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95)


def check_confidence(value: Any, what: str = "confidence") -> float:
    """``float(value)`` when it is a number strictly between 0 and 1.

    Raises:
        BudgetError: anything else (a ``DippmNasError`` and a ``ValueError``), naming the value.
    """
    v = as_real(value, what, low=0, low_inclusive=False, error=BudgetError,
                rule=f"{what} must be a probability strictly between 0 and 1 (e.g. 0.9)")
    if not v < 1:
        raise BudgetError(f"{what} must be a probability strictly between 0 and 1 (e.g. 0.9), got {value!r}")
    return v


def conformal_path(checkpoint: str | Path) -> Path:
    """Where a checkpoint's conformal calibration lies: ``<checkpoint without .pt>.conformal.json``.

    Raises:
        CheckpointError: ``checkpoint`` is not a path, or has no file name.
    """
    if not isinstance(checkpoint, (str, Path)):
        raise CheckpointError(f"a checkpoint path must be a str or Path, got {type(checkpoint).__name__}")
    p = Path(checkpoint)
    if not p.name or p.name in (".", ".."):
        raise CheckpointError(f"a checkpoint path must name a file, got {str(checkpoint)!r}")
    name = p.name[:-3] if p.name.endswith(".pt") else p.name
    return p.with_name(name + ".conformal.json")


def _open_settings(labels: Mapping[str, Any], dtype: Any) -> list[str]:
    """The settings of ``labels["deployment_assumed"]`` that leave a prediction open: all of them, but an undescribed
    autocast only for a half-precision graph (:data:`_HALF_DTYPES`; a float32 graph's
    undescribed autocast is none, priced and spread as described). A prediction without a ``dtype`` keeps it open."""
    assumed = str(labels.get("deployment_assumed", "") or "")
    return [a for a in assumed.split(",") if a and (a != "autocast" or dtype is None or dtype in _HALF_DTYPES)]


def regime_of(prediction: Any) -> str:
    """A prediction's regime key ``"<host-bound|gpu-bound>|<described|undescribed>|<adapted|not-adapted>"``.

    ``described``: ``labels["deployment_assumed"]`` names no open setting; an undescribed autocast of a float32
    graph (``prediction.dtype`` not a half precision) is not one (:func:`_open_settings`)."""
    details = getattr(prediction, "details", {}) or {}
    labels = getattr(prediction, "labels", {}) or {}
    bound = "host-bound" if float(details.get("host_bound", 0.0) or 0.0) >= 1.0 else "gpu-bound"
    described = "undescribed" if _open_settings(labels, getattr(prediction, "dtype", None)) else "described"
    adapted = "adapted" if "adaptation_version" in details else "not-adapted"
    return f"{bound}|{described}|{adapted}"


def wider_regimes(regime: str) -> list[str]:
    """``regime`` and the wider ones it falls back to, narrowest first, ending with :data:`WIDEST_REGIME`."""
    parts = regime.split("|")
    if len(parts) != 3:
        raise CheckpointError(f"a regime is 'bound|deployment|adaptation', got {regime!r}")
    out = [regime, f"{parts[0]}|{parts[1]}|*", f"{parts[0]}|*|*", WIDEST_REGIME]
    return list(dict.fromkeys(out))


def conformal_score(mean: float, std: float | None, measured: float) -> float | None:
    """``log(measured / mean) / (std / mean)``; ``None`` where it is undefined (no σ, or a value <= 0)."""
    if std is None or not (mean > 0 and measured > 0 and std > 0) or not math.isfinite(std):
        return None
    return math.log(measured / mean) / (std / mean)


def _quantile(scores: Sequence[float], confidence: float) -> float:
    """The conformal quantile: the ``ceil((n + 1) c)``-th smallest score; ``inf`` when that exceeds ``n``."""
    n = len(scores)
    k = math.ceil((n + 1) * confidence)
    if n == 0 or k > n:
        return math.inf
    return sorted(scores)[k - 1]


def check_in_space_scores(scores: Any, what: str = "conformal_scores") -> dict[str, list[float]]:
    """``{figure: [score, ...]}`` of an adaptation's in-space scores, checked: a mapping of figure names to lists
    of finite numbers.

    Raises:
        InvalidValueError: anything else, naming the entry.
    """
    if not isinstance(scores, Mapping):
        raise InvalidValueError(f"{what} must map figure names to lists of scores, got {type(scores).__name__}")
    out: dict[str, list[float]] = {}
    for fig, vals in scores.items():
        if not isinstance(fig, str) or isinstance(vals, (str, bytes, Mapping)) or not hasattr(vals, "__iter__"):
            raise InvalidValueError(f"{what}[{fig!r}] must be a list of finite numbers, got {type(vals).__name__}")
        vals = list(vals)
        if any(isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) for v in vals):
            raise InvalidValueError(f"{what}[{fig!r}] must hold finite numbers only, got {vals[:5]!r:.200}")
        out[fig] = [float(v) for v in vals]
    return out


def in_space_margin(scores: Sequence[float], confidence: float, *, minimum: bool = False) -> "ConformalMargin | None":
    """The margin at ``confidence`` read from in-space scores (module docstring): the ``ceil((n + 1) c)``-th
    smallest score (of their negatives for a minimum), regime :data:`IN_SPACE_REGIME`; ``None`` when ``n`` scores
    are too few for ``c`` (``ceil((n + 1) c) > n``).

    Raises:
        BudgetError: a confidence outside (0, 1).
        InvalidValueError: scores that are not finite numbers.
    """
    c = check_confidence(confidence)
    s = check_in_space_scores({"scores": scores})["scores"]
    q = _quantile(sorted(-v for v in s) if minimum else s, c)
    if not math.isfinite(q):
        return None
    return ConformalMargin(q, IN_SPACE_REGIME, IN_SPACE_REGIME, False, len(s))


@dataclass(frozen=True)
class ConformalMargin:
    """The margin of one figure at one confidence: ``k`` (the bound is ``mean * exp(k * sigma_log)``), the regime
    whose scores gave it, the prediction's own regime, and whether that is a fallback to a wider one."""

    k: float
    regime: str
    asked: str
    fallback: bool
    rows: int

    def labels(self, figure: str) -> dict[str, str]:
        out = {f"conformal_regime_{figure}": self.regime}
        if self.fallback:
            out[f"conformal_fallback_{figure}"] = (f"regime {self.asked} has too few calibration rows; "
                                                   f"used {self.regime} ({self.rows} rows)")
        return out


@dataclass(frozen=True)
class ConformalCalibration:
    """A checkpoint's conformal calibration (module docstring).

    Attributes:
        checkpoint_sha256: SHA-256 of the checkpoint file it was fitted for.
        scores: ``{figure: {regime: [score, ...]}}``, every regime key of every row (its own and the wider ones).
        coverage: ``{figure: {regime: {"0.9": share of held-out rows within the bound, ...}}}`` and
            ``{figure: {"held_out_rows": n}}``: measured on rows that are not in ``scores``.
        source: what the calibration rows are (a note: data, devices, split).
        min_rows: :data:`MIN_REGIME_ROWS` when it was fitted.
    """

    checkpoint_sha256: str
    scores: Mapping[str, Mapping[str, Sequence[float]]]
    coverage: Mapping[str, Mapping[str, Any]]
    source: str = ""
    min_rows: int = MIN_REGIME_ROWS
    _sorted: dict[str, dict[str, list[float]]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_sha256, str) or len(self.checkpoint_sha256) != 64:
            raise CheckpointError(f"checkpoint_sha256 must be a SHA-256 hex digest, got {self.checkpoint_sha256!r}")
        if not isinstance(self.scores, Mapping) or not isinstance(self.coverage, Mapping):
            raise CheckpointError("the conformal calibration's scores and coverage must be mappings")
        if not isinstance(self.min_rows, int) or isinstance(self.min_rows, bool) or self.min_rows < 1:
            raise CheckpointError(f"the conformal calibration's min_rows must be an integer >= 1, got {self.min_rows!r}")
        for fig, per in self.scores.items():
            cov = self.coverage.get(fig)
            if not isinstance(cov, Mapping) or not cov:
                raise CheckpointError(f"the conformal calibration of {fig} has no coverage: a calibration must "
                                      "record what its bounds covered on held-out rows")
            if not isinstance(per, Mapping):
                raise CheckpointError(f"the conformal scores of {fig} must map regimes to lists of numbers")
            out: dict[str, list[float]] = {}
            for r, sc in per.items():
                try:
                    wider_regimes(str(r))
                    vals = sorted(float(v) for v in sc)
                except (TypeError, ValueError) as e:
                    raise CheckpointError(f"the conformal scores of {fig}, regime {r!r}, must be a list of numbers: "
                                          f"{type(e).__name__}: {e}") from e
                if any(not math.isfinite(v) for v in vals) or any(isinstance(v, bool) for v in sc):
                    raise CheckpointError(f"the conformal scores of {fig}, regime {r!r}, must be finite numbers")
                out[str(r)] = vals
            if WIDEST_REGIME not in out:
                raise CheckpointError(f"the conformal scores of {fig} lack the widest regime {WIDEST_REGIME!r}")
            self._sorted[fig] = out

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(self._sorted)

    def margin(self, figure: str, confidence: float, regime: str, *, minimum: bool = False) -> ConformalMargin:
        """The margin of ``figure`` at ``confidence`` for a prediction of ``regime`` (falling back to a wider
        regime where it has too few rows). ``minimum``: the bound of a minimum (the scores' negatives).

        Raises:
            BudgetError: a confidence outside (0, 1), or a figure the calibration has no scores of.
        """
        c = check_confidence(confidence)
        per = self._sorted.get(figure)
        if per is None:
            raise BudgetError(f"the conformal calibration has no scores of {figure}; it has {list(self._sorted)}")
        for r in wider_regimes(regime):
            s = per.get(r, [])
            if minimum:
                s = sorted(-v for v in s)
            if len(s) >= self.min_rows or r == WIDEST_REGIME:
                q = _quantile(s, c)
                if math.isfinite(q) or r == WIDEST_REGIME:
                    return ConformalMargin(q, r, regime, r != regime, len(s))
        raise AssertionError("unreachable: the widest regime always answers")  # pragma: no cover

    # ------------------------------------------------------------------ stored form
    def to_dict(self) -> dict[str, Any]:
        return {"format": CONFORMAL_FORMAT, "checkpoint_sha256": self.checkpoint_sha256, "source": self.source,
                "min_rows": self.min_rows, "scores": {f: {r: list(s) for r, s in per.items()}
                                                      for f, per in self.scores.items()},
                "coverage": self.coverage}

    def save(self, path: str | Path) -> None:
        """Write the calibration as JSON (a temporary file renamed into place; a special file is refused).

        Raises:
            CheckpointError: the path cannot be written (a directory, a FIFO, a device, a missing folder).
        """
        write_output(path, json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n", "the conformal calibration",
                     error=CheckpointError)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, checkpoint_sha256: str | None = None) -> "ConformalCalibration":
        """Inverse of :meth:`to_dict`; with ``checkpoint_sha256``, refuses a calibration of another checkpoint.

        Raises:
            CheckpointError: another format, missing keys or coverage, or another checkpoint's calibration.
        """
        if not isinstance(d, Mapping) or d.get("format") != CONFORMAL_FORMAT:
            got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
            raise CheckpointError(f"a conformal calibration has format {CONFORMAL_FORMAT}, got {got!r}")
        missing = [k for k in ("checkpoint_sha256", "scores", "coverage") if k not in d]
        if missing:
            raise CheckpointError(f"the conformal calibration lacks {missing} (a calibration without its coverage "
                                   "is refused)")
        if checkpoint_sha256 is not None and d["checkpoint_sha256"] != checkpoint_sha256:
            raise CheckpointError(f"the conformal calibration is of checkpoint {str(d['checkpoint_sha256'])[:12]}..., "
                                   f"not of this one ({checkpoint_sha256[:12]}...): refit it for this checkpoint "
                                   "(scripts/fit/fit_conformal.py)")
        return cls(checkpoint_sha256=str(d["checkpoint_sha256"]), scores=d["scores"], coverage=d["coverage"],
                   source=str(d.get("source", "")), min_rows=d.get("min_rows", MIN_REGIME_ROWS))

    @classmethod
    def load(cls, path: str | Path, *, checkpoint_sha256: str | None = None) -> "ConformalCalibration":
        """Read a calibration file (see :meth:`from_dict`).

        Raises:
            CheckpointError: a file that cannot be read or parsed, or see :meth:`from_dict`.
        """
        d = read_json_file(path, f"cannot read the conformal calibration {path}", CheckpointError)
        return cls.from_dict(d, checkpoint_sha256=checkpoint_sha256)


def conformal_for(predictor: Any) -> ConformalCalibration | None:
    """The calibration next to ``predictor``'s checkpoint file (``predictor.checkpoint_path``), checked against its
    SHA-256; ``None`` when the predictor has no file or no calibration lies beside it.

    Raises:
        CheckpointError: the file is of another checkpoint, has no coverage or does not parse.
    """
    path = getattr(predictor, "checkpoint_path", None)
    if path is None:
        return None
    f = conformal_path(path)
    if not f.exists():
        return None
    return ConformalCalibration.load(f, checkpoint_sha256=predictor.checkpoint_hash())


def _regime_scores(rows: Sequence[tuple[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for regime, s in rows:
        for r in wider_regimes(regime):
            out.setdefault(r, []).append(s)
    return out


def fit_conformal(calibrate: Sequence[tuple[Any, float]], held_out: Sequence[tuple[Any, float]], *,
                  checkpoint_sha256: str, figure: str = "latency_ms", source: str = "",
                  confidences: Sequence[float] = CONFIDENCES) -> ConformalCalibration:
    """A :class:`ConformalCalibration` of ``figure`` from ``(prediction, measured)`` rows: the scores of
    ``calibrate``, and per regime and confidence the share of ``held_out`` rows whose measured figure lies within
    the bound they get (their coverage).

    Raises:
        CheckpointError: no row of ``calibrate`` or of ``held_out`` has a score (no σ, or values <= 0).
        InvalidValueError: ``calibrate`` or ``held_out`` is not a sequence of ``(prediction, measured)`` pairs.
    """
    for name, rows in (("calibrate", calibrate), ("held_out", held_out)):
        if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) \
                or not all(isinstance(r, tuple) and len(r) == 2 and hasattr(r[0], "figure") for r in rows):
            raise InvalidValueError(f"fit_conformal's {name} must be a sequence of (prediction, measured) pairs, "
                                    f"got {type(rows).__name__}")

    def scored(rows: Sequence[tuple[Any, float]]) -> list[tuple[str, float]]:
        out = []
        for p, y in rows:
            mean, std, _ = p.figure(figure)
            s = conformal_score(float(mean), None if std is None else float(std), float(y))
            if s is not None:
                out.append((regime_of(p), s))
        return out

    cal, held = scored(calibrate), scored(held_out)
    if not cal or not held:
        raise CheckpointError(f"fit_conformal needs rows with a {figure} σ on both sides, got {len(cal)} "
                               f"calibration and {len(held)} held-out rows")
    scores = _regime_scores(cal)
    probe = ConformalCalibration(checkpoint_sha256, {figure: scores}, {figure: {"pending": True}}, source)
    coverage: dict[str, Any] = {"held_out_rows": len(held)}
    for c in confidences:
        hits: dict[str, list[bool]] = {}
        for regime, s in held:
            m = probe.margin(figure, c, regime)
            for r in wider_regimes(regime):
                hits.setdefault(r, []).append(s <= m.k)
        for r, h in hits.items():
            coverage.setdefault(r, {})[f"{c:g}"] = sum(h) / len(h)
            coverage[r]["rows"] = len(h)
    return ConformalCalibration(checkpoint_sha256, {figure: scores}, {figure: coverage}, source)
