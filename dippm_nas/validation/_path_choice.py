"""Which path answers a device's predictions: the adapted network, or the analytic prior with its calibrated factors.

After each validation round the two paths are scored **prequentially** on the round's newly measured candidates:
each path's prediction of a candidate is the one it made before the candidate's measurement was revealed (the
validator records both when it enqueues the job), judged by what the search uses of it:

- ``"order"`` (a study without budgets): a search compares candidates, so what counts is the order of their
  latencies; the pairwise order agreement over the round's new rows (concordant pairs, a tie of the prediction
  counting half, over the pairs whose measurements differ; :func:`order_agreement`);
- ``"feasibility"`` (a study with budgets): what decides is the budget check; the share of the new rows whose check
  classed them as the measurement does (admitted and within every budget, or rejected and over one;
  :func:`feasibility_agreement`).

The counts add up over the rounds; the path with the higher share answers from then on (ties: the prior, the
simpler path), and before any round scored both paths, the network answers (the predictor's default).
:class:`PathChoice` holds that state as JSON (:meth:`PathChoice.to_dict`), no pickle.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dippm_nas.errors import ValidationError

__all__ = ["PathChoice", "PREDICTION_PATHS", "PATH_YARDSTICKS", "PATH_LABEL", "order_agreement",
           "feasibility_agreement"]

logger = logging.getLogger(__name__)

#: The two paths a device's predictions can take: the (adapted) network, or the analytic prior with its factors.
PREDICTION_PATHS: tuple[str, ...] = ("network", "prior")
#: How a round scores the paths: the order of the latencies (no budget), or the budget check's classification.
PATH_YARDSTICKS: tuple[str, ...] = ("order", "feasibility")
#: The ``Prediction.labels`` key (and trial user attribute) naming the path that answered.
PATH_LABEL = "prediction_path"


def _numbers(values: Any, what: str) -> list[float]:
    """``values`` as a list of finite numbers, or a :class:`ValidationError` naming ``what``."""
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        raise ValidationError(f"{what} must be a sequence of finite numbers, got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise ValidationError(f"{what} must hold finite numbers, got {v!r}")
        f = float(v)
        if not math.isfinite(f):
            raise ValidationError(f"{what} must hold finite numbers, got {v!r}")
        out.append(f)
    return out


def _flags(values: Any, what: str) -> list[bool]:
    """``values`` as a list of booleans, or a :class:`ValidationError` naming ``what``."""
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        raise ValidationError(f"{what} must be a sequence of booleans, got {type(values).__name__}")
    out = list(values)
    if not all(isinstance(v, bool) or type(v).__name__ == "bool_" for v in out):
        raise ValidationError(f"{what} must hold booleans (True / False), got {out!r}")
    return [bool(v) for v in out]


def order_agreement(predicted: Sequence[float], measured: Sequence[float]) -> tuple[float, int]:
    """Pairwise order agreement of ``predicted`` with ``measured``: (concordant pairs, a tie of the prediction
    counting half; the pairs whose measurements differ).

    Raises:
        ValidationError: not sequences of finite numbers of one length.
    """
    predicted, measured = _numbers(predicted, "predicted"), _numbers(measured, "measured")
    if len(predicted) != len(measured):
        raise ValidationError(f"order_agreement needs one prediction per measurement, got {len(predicted)} "
                              f"predictions and {len(measured)} measurements")
    good, pairs = 0.0, 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            dm = measured[i] - measured[j]
            if dm == 0:
                continue
            pairs += 1
            dp = predicted[i] - predicted[j]
            good += 0.5 if dp == 0 else float((dp > 0) == (dm > 0))
    return good, pairs


def feasibility_agreement(admitted: Sequence[bool], fits: Sequence[bool]) -> tuple[float, int]:
    """(rows whose check ``admitted`` them exactly when they really ``fits``, rows).

    Raises:
        ValidationError: not sequences of booleans of one length.
    """
    admitted, fits = _flags(admitted, "admitted"), _flags(fits, "fits")
    if len(admitted) != len(fits):
        raise ValidationError(f"feasibility_agreement needs one check per measurement, got {len(admitted)} checks "
                              f"and {len(fits)} measurements")
    return float(sum(bool(a) == bool(f) for a, f in zip(admitted, fits))), len(fits)


def _counts(value: Any, what: str) -> dict[str, list[float]]:
    if not isinstance(value, Mapping) or set(value) != set(PREDICTION_PATHS):
        raise ValidationError(f"{what} must map each of {PREDICTION_PATHS} to [right, counted], got {value!r}")
    out = {}
    for k, v in value.items():
        if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in v)):
            raise ValidationError(f"{what}[{k!r}] must be [right, counted] with both >= 0, got {v!r}")
        out[k] = [float(v[0]), int(v[1])]
    return out


@dataclass
class PathChoice:
    """The running choice between the network and the prior (see the module docstring).

    Attributes:
        yardstick: one of :data:`PATH_YARDSTICKS`.
        path: the path answering now, one of :data:`PREDICTION_PATHS`.
        score: ``{path: [right, counted]}`` summed over the scored rounds.
        rounds: rounds recorded (:meth:`score_round` calls).
        rounds_network: of those, the rounds after which the network answered.
        seen: keys (e.g. trial numbers, as text) of the rows already scored; a row is scored once.
    """

    yardstick: str = "order"
    path: str = "network"
    score: dict[str, list[float]] = field(default_factory=lambda: {p: [0.0, 0] for p in PREDICTION_PATHS})
    rounds: int = 0
    rounds_network: int = 0
    seen: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.yardstick not in PATH_YARDSTICKS:
            raise ValidationError(f"yardstick must be one of {PATH_YARDSTICKS}, got {self.yardstick!r}")
        if self.path not in PREDICTION_PATHS:
            raise ValidationError(f"path must be one of {PREDICTION_PATHS}, got {self.path!r}")
        self.score = _counts(self.score, "score")
        if not (type(self.rounds) is int and type(self.rounds_network) is int  # noqa: E721 - not a bool
                and 0 <= self.rounds_network <= self.rounds):
            raise ValidationError(f"rounds and rounds_network must be integers with 0 <= rounds_network <= rounds, "
                                  f"got {self.rounds!r} and {self.rounds_network!r}")
        if isinstance(self.seen, (str, bytes, Mapping)) or not hasattr(self.seen, "__iter__"):
            raise ValidationError(f"seen must be a set of keys, got {type(self.seen).__name__}")
        self.seen = {str(k) for k in self.seen}

    def share(self, path: str) -> float | None:
        """What ``path`` got right of what was counted so far (``None`` before anything was counted)."""
        right, n = self.score[path]
        return right / n if n else None

    @property
    def network_share(self) -> float | None:
        """The share of the recorded rounds after which the network answered (``None`` before any round)."""
        return self.rounds_network / self.rounds if self.rounds else None

    def score_round(self, keys: Sequence[Any], truth: Sequence[Any],
                    predicted: Mapping[str, Sequence[Any]]) -> str:
        """Record one round and answer the path that answers from now on.

        Args:
            keys: each row's key (rows already :attr:`seen` are left out).
            truth: each row's measured latency (``"order"``) or whether it really meets every budget
                (``"feasibility"``).
            predicted: ``{path: each row's prediction}`` for both paths, made **before** the rows were measured:
                the predicted latency (``"order"``) or whether the path's budget check admitted it.
        """
        if not isinstance(predicted, Mapping) or isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__") \
                or not hasattr(truth, "__len__"):
            raise ValidationError(f"score_round needs keys and truths as sequences and predicted as {{path: "
                                  f"sequence}}, got {type(keys).__name__}, {type(truth).__name__} and "
                                  f"{type(predicted).__name__}")
        if set(predicted) != set(PREDICTION_PATHS) or any(not hasattr(v, "__len__") or len(v) != len(keys)
                                                          for v in predicted.values()) or len(truth) != len(keys):
            raise ValidationError(f"score_round needs, for each of {PREDICTION_PATHS}, one prediction per key "
                                  f"({len(keys)} keys, {len(truth)} truths, predictions "
                                  f"{ {k: len(v) for k, v in predicted.items()} })")
        new = [i for i, k in enumerate(keys) if str(k) not in self.seen]
        if new:
            for p in PREDICTION_PATHS:
                if self.yardstick == "order":
                    right, n = order_agreement([predicted[p][i] for i in new], [truth[i] for i in new])
                else:
                    right, n = feasibility_agreement([predicted[p][i] for i in new], [truth[i] for i in new])
                self.score[p][0] += right
                self.score[p][1] += n
            self.seen.update(str(keys[i]) for i in new)
        net, pri = self.share("network"), self.share("prior")
        if net is not None and pri is not None:
            self.path = "network" if net > pri else "prior"
        self.rounds += 1
        self.rounds_network += self.path == "network"
        return self.path

    def describe(self) -> str:
        """One line: the path and each path's score."""
        cells = [f"{p} {self.score[p][0]:g}/{self.score[p][1]:d}" for p in PREDICTION_PATHS]
        return f"{self.path} answers (by {self.yardstick}: {', '.join(cells)}; {self.rounds} rounds)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (``seen`` sorted)."""
        return {"yardstick": self.yardstick, "path": self.path,
                "score": {p: [self.score[p][0], self.score[p][1]] for p in PREDICTION_PATHS},
                "rounds": self.rounds, "rounds_network": self.rounds_network, "seen": sorted(self.seen),
                "network_share": self.network_share}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PathChoice":
        """Read :meth:`to_dict`'s state back.

        Raises:
            ValidationError: not a mapping, a missing or bad field (named, with the rule).
        """
        if not isinstance(d, Mapping):
            raise ValidationError(f"a path choice is a JSON object, got {type(d).__name__}")
        missing = [k for k in ("yardstick", "path", "score", "rounds", "rounds_network", "seen") if k not in d]
        if missing:
            raise ValidationError(f"a path choice needs the fields {missing}; got {sorted(d)}")
        if not isinstance(d["seen"], (list, tuple)):
            raise ValidationError(f"seen must be a list of keys, got {d['seen']!r}")
        return cls(yardstick=d["yardstick"], path=d["path"], score=d["score"], rounds=d["rounds"],
                   rounds_network=d["rounds_network"], seen=set(map(str, d["seen"])))
