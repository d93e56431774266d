"""Hardware budgets as chance constraints: ``mean + k_sigma * std <= budget``.

One type, :class:`Budgets`, carries the budgets of every integration (:class:`dippm_nas.optuna.HardwareCostModel`,
:func:`dippm_nas.nni.report`, :class:`dippm_nas.nni.HardwareAwareTuner`). A candidate meets a budget when its
predicted figure plus ``k_sigma`` of its standard deviations is within it:

    latency_ms + k * latency_ms_std  <=  budgets.latency_ms
    energy_j   + k * energy_j_std    <=  budgets.energy_j
    memory_mib + k * memory_mib_std  <=  min(budgets.memory_mib, usable memory of budgets.mig_profile)

and, for an LLM generation (:class:`dippm_nas.llm.GenerationPrediction`), the time, energy and throughput figures
of :data:`LLM_BUDGET_FIGURES`: ``prefill_ms``, ``decode_ms_per_token`` and ``energy_j_per_token`` bound from above
like ``latency_ms``; ``tokens_per_s`` and ``max_batch`` are minimums, met when

    tokens_per_s - k * tokens_per_s_std  >=  budgets.tokens_per_s
    max_batch    - k * max_batch_std     >=  budgets.max_batch

With a ``mig_profile`` a generation's figures are those of one instance of the profile (the memory of a
forward pass's :class:`~dippm_nas.prediction.Prediction` is checked against the profile, its other figures stay
the whole GPU's, as the MIG advisor's rule has it).

``k`` is :attr:`Budgets.k_sigma` (default :data:`DEFAULT_K_SIGMA` = 1.0), or the figure's entry of
:attr:`Budgets.k_sigmas`. ``k = 0`` compares the mean alone; with a Gaussian error of the predicted σ,
``k = 1`` admits a model over budget with probability at most about 16 %, ``k = 2`` about 2.3 % (the σ is
only as good as its calibration: see ``benchmarks/accuracy/search_view.py`` for what a search sees on measured data).

A figure whose prediction has no σ (``None``: the source gives none) is checked with σ = 0, and this is
never silent: the :class:`ChanceCheck` says ``std_missing=True``, the integrations record it on the trial
(``std_missing_<figure>``) and a warning is logged once per figure and source.

**Calibrated probabilities.** ``Budgets(..., confidence=0.9)`` replaces the Gaussian reading of ``k_sigma``: a
figure is bounded by ``mean * exp(q * std / mean)`` with ``q`` the conformal quantile of its checkpoint's
calibration (:mod:`dippm_nas.conformal`; the file ``<checkpoint>.conformal.json`` next to the checkpoint, loaded by
:meth:`Budgets.for_predictor`) for the prediction's regime, so that ``P(true <= budget) >= confidence`` on the rows
the calibration measured. Without a calibration (or one without the figure) the Gaussian quantile of
``confidence`` is used, and the check's ``labels`` say so (``conformal_fallback_<figure>``), as they do when a
regime had too few calibration rows and a wider one answered. An **adapted** prediction (``details`` carry
``adaptation_version``) is bounded instead with the in-space scores of its adaptation
(:attr:`~dippm_nas.predictor.Adaptation.conformal_scores`: its own measured rows, each predicted out of sample),
read from :attr:`Budgets.in_space` (the predictor, attached by :meth:`Budgets.for_predictor`), when there are enough
of them for the confidence (``ceil((n + 1) c) <= n``: 9 at 0.9); the check's ``labels`` then say
``conformal_regime_<figure> = "in-space"`` (and ``conformal_in_space_rows_<figure>``). Fewer scores, or an
adaptation other than the prediction's, fall back to the checkpoint's calibration, labelled
``conformal_in_space_fallback_<figure>``. ``k_sigma`` still applies where ``confidence`` is
``None`` (the default).

The constraint value handed to a sampler keeps Optuna's convention: ``mean + k * std - budget`` in the
figure's own unit (ms, J, MiB), ``<= 0`` feasible; for a minimum, ``budget - (mean - k * std)``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from dippm_nas._logging import WarnOnce
from dippm_nas._numbers import as_real, is_real
from dippm_nas.conformal import (IN_SPACE_REGIME, ConformalCalibration, ConformalMargin, check_confidence,
                                 conformal_for, in_space_margin, regime_of)
from dippm_nas.devices import resolve_device
from dippm_nas.errors import BudgetError, CheckpointError, DippmNasError

__all__ = ["Budgets", "ChanceCheck", "DEFAULT_K_SIGMA", "BUDGET_FIGURES", "BUDGET_KEYS", "LLM_BUDGET_FIGURES",
           "MINIMUM_FIGURES", "band_distance", "check_k_sigma", "trial_attrs"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger)

#: ``k_sigma`` of every budget unless set: a budget holds for ``mean + 1 * std``.
DEFAULT_K_SIGMA: float = 1.0
#: Figures of an LLM generation a budget can bound, with their units (:class:`dippm_nas.llm.GenerationPrediction`).
LLM_BUDGET_FIGURES: dict[str, str] = {
    "prefill_ms": "ms to the first token", "decode_ms_per_token": "ms per decode step",
    "energy_j_per_token": "J per generated token", "tokens_per_s": "tokens per second (a minimum)",
    "max_batch": "sequences held at once (a minimum)",
}
#: Figures whose budget is a minimum (``mean - k * std >= budget``).
MINIMUM_FIGURES: frozenset[str] = frozenset({"tokens_per_s", "max_batch"})
#: Predicted figures a budget can bound, with their units, in constraint order.
BUDGET_FIGURES: dict[str, str] = {"latency_ms": "ms per batch", "energy_j": "J per batch", "memory_mib": "MiB",
                                  **LLM_BUDGET_FIGURES}
#: Keys :meth:`Budgets.from_mapping` accepts.
BUDGET_KEYS: tuple[str, ...] = (*BUDGET_FIGURES, "mig_profile", "k_sigma", "k_sigmas", "confidence", "conformal")


def check_k_sigma(value: Any, what: str = "k_sigma") -> float:
    """``float(value)`` when it is a finite number ``>= 0``.

    Raises:
        BudgetError: anything else (a ``DippmNasError`` and a ``ValueError``), naming the value.
    """
    return as_real(value, what, low=0, error=BudgetError,
                   rule=f"{what} must be a finite number >= 0 (standard deviations added to the mean)")


def band_distance(mean: Any, bound: Any, budget: Any) -> float:
    """How far a budget lies from the predicted mean, in units of the check's margin: ``|mean - budget| / |bound -
    mean|`` (``bound``: what the check compares with the budget, :attr:`ChanceCheck.bound`).

    Below 1, the budget lies within the margin's band around the mean (``mean - m < budget < mean + m`` for a
    margin ``m = bound - mean``): a check that rejects such a candidate is unsure of it (its mean may fit), and
    measuring it settles it (:attr:`ChanceCheck.uncertain`; the validation rounds of
    :class:`~dippm_nas.validation.ParetoValidator` measure such candidates, ``uncertain_per_round``). 0: the mean
    is the budget; ``inf``: a check without a margin (no σ, or ``k = 0``) is never unsure; a bound of ``inf`` (a
    calibration that cannot bound) puts every finite budget at 0.

    Raises:
        BudgetError: a value that is not a number, or a mean or budget that is not finite.
    """
    m = as_real(mean, "mean", error=BudgetError, rule="the predicted mean must be a finite number")
    b = as_real(budget, "budget", error=BudgetError, rule="the budget must be a finite number")
    if not is_real(bound) or math.isnan(float(bound)):
        raise BudgetError(f"the bound must be a number (an infinity allowed), not NaN; got {bound!r:.80}")
    bound_f = float(bound)
    if math.isinf(bound_f):
        return 0.0
    width = abs(bound_f - m)
    gap = abs(m - b)
    if width == 0:
        return 0.0 if gap == 0 else math.inf
    return gap / width


def _finite_budget(name: str, value: Any) -> float | None:
    if value is None:
        return None
    return as_real(value, name, low=0, low_inclusive=False, error=BudgetError,
                   rule=f"budget {name} must be a finite number > 0 or None")


@dataclass(frozen=True)
class ChanceCheck:
    """One budget checked against one prediction.

    Attributes:
        name: the figure, one of :data:`BUDGET_FIGURES`.
        mean: the predicted figure (in its unit: ms, J, MiB, tokens/s, sequences).
        std: its standard deviation, same unit; ``None`` when the prediction gives none.
        std_missing: ``std`` is ``None`` and was taken as 0.
        k_sigma: standard deviations added.
        bound: ``mean + k_sigma * std`` (``mean`` when ``std_missing``); for a minimum ``mean - k_sigma * std``.
        budget: the limit the bound is compared with (for memory: the smaller of ``memory_mib`` and the
            MIG profile's usable memory).
        limit_source: where ``budget`` comes from: the figure's name, or ``"mig:<profile>"``.
        value: ``bound - budget`` (a minimum: ``budget - bound``), Optuna's constraint value (``<= 0`` feasible).
        margin: ``-value`` (``>= 0`` feasible): room left within the budget.
        feasible: ``value <= 0``.
        minimum: the budget is a minimum (:data:`MINIMUM_FIGURES`).
        confidence: the probability the bound holds with (``Budgets.confidence``), or ``None`` (``k_sigma`` rule).
        labels: how a ``confidence`` bound was made: ``conformal_regime_<figure>`` (the calibration regime used),
            ``conformal_fallback_<figure>`` (why a wider regime or the Gaussian quantile answered).
    """

    name: str
    mean: float
    std: float | None
    std_missing: bool
    k_sigma: float
    bound: float
    budget: float
    limit_source: str
    value: float
    margin: float
    feasible: bool
    minimum: bool = False
    confidence: float | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """``bound / budget`` (``<= 1`` within it; a minimum: ``budget / bound``); the ratio MnasNet's reward
        scales by."""
        if self.minimum:
            return self.budget / self.bound if self.bound > 0 else math.inf
        return self.bound / self.budget

    @property
    def band_distance(self) -> float:
        """:func:`band_distance` of this check: ``|mean - budget| / |bound - mean|``."""
        return band_distance(self.mean, self.bound, self.budget)

    @property
    def uncertain(self) -> bool:
        """The check rejects the candidate, but the budget lies within the margin's band around the mean
        (:func:`band_distance` below 1): e.g. a mean within the budget that the bound puts over it. Measuring the
        candidate settles it."""
        return not self.feasible and self.band_distance < 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Budgets:
    """Hardware budgets a candidate must meet, as chance constraints; ``None`` leaves a figure free.

    Attributes:
        latency_ms: most latency of one batch, ms.
        energy_j: most energy of one batch, J (the device must have power figures).
        memory_mib: most peak device memory, MiB.
        mig_profile: a MIG profile of the device, e.g. ``"1g.5gb"``: the memory must also fit its usable
            memory (``nvidia-smi mig -lgip``; see :mod:`dippm_nas.mig`).
        k_sigma: standard deviations added to every predicted figure before it is compared with its
            budget (default :data:`DEFAULT_K_SIGMA`, 1.0; 0 compares the mean alone).
        k_sigmas: per-figure overrides of ``k_sigma``, e.g. ``{"memory_mib": 2.0}`` (keys from
            :data:`BUDGET_FIGURES`).
        prefill_ms, decode_ms_per_token, energy_j_per_token: most time to the first token, time per decode step
            and energy per generated token of an LLM generation (ms, ms, J).
        tokens_per_s, max_batch: least tokens per second and sequences held at once of an LLM generation.
        confidence: when set (strictly between 0 and 1), every figure is bounded so that the true value meets
            its budget with this probability by the conformal calibration (module docstring); ``k_sigma`` is then
            unused. ``None`` (default): the ``k_sigma`` rule.
        conformal: the :class:`~dippm_nas.conformal.ConformalCalibration` (or the path of its JSON file) the
            ``confidence`` bounds read; ``None``: the checkpoint's own, attached by :meth:`for_predictor`.
        in_space: where the in-space scores of an adapted prediction are read at each check (module docstring): an
            :class:`~dippm_nas.predictor.Adaptation`, or a predictor whose ``adaptation`` attribute is the active
            one (attached by :meth:`for_predictor`); ``None``: the checkpoint's calibration for every prediction.

    Raises:
        BudgetError: a budget that is not a finite number > 0, a ``k_sigma`` that is negative or not
            finite, an unknown key of ``k_sigmas``, or a bad ``mig_profile`` (a ``DippmNasError`` and a
            ``ValueError``; the message names the value).

    Example::

        Budgets(latency_ms=15.0, memory_mib=4000, k_sigma=1.0, k_sigmas={"memory_mib": 2.0})
    """

    latency_ms: float | None = None
    energy_j: float | None = None
    memory_mib: float | None = None
    mig_profile: str | None = None
    k_sigma: float = DEFAULT_K_SIGMA
    k_sigmas: Mapping[str, float] = field(default_factory=dict)
    prefill_ms: float | None = None
    decode_ms_per_token: float | None = None
    energy_j_per_token: float | None = None
    tokens_per_s: float | None = None
    max_batch: float | None = None
    confidence: float | None = None
    conformal: Any = None
    in_space: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in BUDGET_FIGURES:
            object.__setattr__(self, name, _finite_budget(name, getattr(self, name)))
        if self.mig_profile is not None and (not isinstance(self.mig_profile, str) or not self.mig_profile):
            raise BudgetError(f"budget mig_profile must be a profile name like '1g.5gb' or None, "
                              f"got {self.mig_profile!r}")
        object.__setattr__(self, "k_sigma", check_k_sigma(self.k_sigma))
        if not isinstance(self.k_sigmas, Mapping):
            raise BudgetError(f"k_sigmas must be a mapping {{figure: k}}, got {type(self.k_sigmas).__name__}")
        unknown = sorted(str(k) for k in self.k_sigmas if k not in BUDGET_FIGURES)
        if unknown:
            raise BudgetError(f"unknown budget keys {unknown} in k_sigmas; valid keys are {list(BUDGET_FIGURES)}")
        ks = {k: check_k_sigma(v, f"k_sigmas[{k!r}]") for k, v in self.k_sigmas.items()}
        object.__setattr__(self, "k_sigmas", ks)
        if self.confidence is not None or self.conformal is not None:
            if self.confidence is not None:
                object.__setattr__(self, "confidence", check_confidence(self.confidence))
            if self.conformal is not None and not isinstance(self.conformal, ConformalCalibration):
                if not isinstance(self.conformal, (str, bytes)) and not hasattr(self.conformal, "__fspath__"):
                    raise BudgetError(f"conformal must be a ConformalCalibration, the path of its JSON file or None, "
                                      f"got {type(self.conformal).__name__}")
                object.__setattr__(self, "conformal", ConformalCalibration.load(self.conformal))
        if self.in_space is not None and not hasattr(self.in_space, "conformal_scores") \
                and not hasattr(self.in_space, "adaptation"):
            raise BudgetError(f"in_space must be an Adaptation (with conformal_scores), a predictor with an "
                              f"'adaptation' attribute, or None, got {type(self.in_space).__name__}")

    def __hash__(self) -> int:
        return hash((*(getattr(self, n) for n in BUDGET_FIGURES), self.mig_profile, self.k_sigma,
                     tuple(sorted(self.k_sigmas.items())), self.confidence,
                     None if self.conformal is None else self.conformal.checkpoint_sha256))

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> "Budgets":
        """``Budgets(**d)`` with a clear error for unknown keys (JSON / YAML class args use this).

        Raises:
            BudgetError: an unknown key (the valid ones are listed) or a bad value.
        """
        if not isinstance(d, Mapping):
            raise BudgetError(f"budgets must be a mapping with keys from {list(BUDGET_KEYS)}, got {d!r}")
        unknown = sorted(str(k) for k in d if k not in BUDGET_KEYS)
        if unknown:
            raise BudgetError(f"unknown budget keys {unknown}; valid keys are {list(BUDGET_KEYS)}")
        return cls(**dict(d))

    @classmethod
    def coerce(cls, budgets: "Budgets | Mapping[str, Any] | None") -> "Budgets":
        """A :class:`Budgets` from a Budgets, a mapping of its keys, or ``None`` (no budget)."""
        if budgets is None:
            return cls()
        if isinstance(budgets, Budgets):
            return budgets
        if isinstance(budgets, Mapping):
            return cls.from_mapping(budgets)
        raise BudgetError(f"budgets must be a Budgets, a mapping or None, got {type(budgets).__name__}")

    def for_predictor(self, predictor: Any) -> "Budgets":
        """These budgets with the conformal calibration of ``predictor``'s checkpoint attached where
        ``confidence`` is set and none is (``<checkpoint>.conformal.json``, when it exists; else unchanged and
        each check flags the Gaussian fallback), and ``predictor`` as :attr:`in_space` (where none is set and it
        has an ``adaptation`` attribute): its adapted predictions are bounded with its active adaptation's
        in-space scores.

        Raises:
            CheckpointError: the calibration given, or the file next to the checkpoint, is of another checkpoint,
                has no coverage or does not parse.
        """
        if self.confidence is None:
            return self
        if self.in_space is None and hasattr(predictor, "adaptation"):
            return dataclasses.replace(self, in_space=predictor).for_predictor(predictor)
        sha = predictor.checkpoint_hash() if callable(getattr(predictor, "checkpoint_hash", None)) else None
        if self.conformal is not None:
            if sha is not None and self.conformal.checkpoint_sha256 != sha:
                raise CheckpointError(f"the conformal calibration is of checkpoint "
                                      f"{self.conformal.checkpoint_sha256[:12]}..., the predictor's is {sha[:12]}...: "
                                      "refit it for this checkpoint (scripts/fit/fit_conformal.py)")
            return self
        cal = conformal_for(predictor)
        return self if cal is None else dataclasses.replace(self, conformal=cal)

    # ------------------------------------------------------------------ reading
    def k_for(self, name: str) -> float:
        """The ``k_sigma`` of figure ``name`` (its override, else :attr:`k_sigma`)."""
        if name not in BUDGET_FIGURES:
            raise BudgetError(f"unknown budget figure {name!r}; valid figures are {list(BUDGET_FIGURES)}")
        return float(self.k_sigmas.get(name, self.k_sigma))

    @property
    def names(self) -> tuple[str, ...]:
        """The figures with a budget (memory when ``memory_mib`` or ``mig_profile`` is set), in the order
        of :data:`BUDGET_FIGURES`: the constraint names."""
        out = [n for n in ("latency_ms", "energy_j") if getattr(self, n) is not None]
        if self.memory_mib is not None or self.mig_profile is not None:
            out.append("memory_mib")
        out += [n for n in LLM_BUDGET_FIGURES if getattr(self, n) is not None]
        return tuple(out)

    @property
    def active(self) -> bool:
        """True when at least one budget is set."""
        return bool(self.names)

    def to_dict(self, *, all_keys: bool = False) -> dict[str, Any]:
        """JSON-able dict: the budgets set, ``k_sigma`` and the overrides (``all_keys``: every key)."""
        d: dict[str, Any] = {n: getattr(self, n) for n in (*BUDGET_FIGURES, "mig_profile")}
        if not all_keys:
            d = {k: v for k, v in d.items() if v is not None}
        d["k_sigma"] = self.k_sigma
        if self.k_sigmas or all_keys:
            d["k_sigmas"] = dict(self.k_sigmas)
        if self.confidence is not None or all_keys:
            d["confidence"] = self.confidence  # the calibration itself is the checkpoint's (for_predictor)
        return d

    def memory_limit(self, device: Any) -> tuple[float, str] | None:
        """``(limit MiB, source)`` of the memory budget on ``device`` (``None`` without one).

        Raises:
            BudgetError: ``mig_profile`` on a device without MIG, or a profile the device lacks (its
                profiles are listed).
            DeviceError: an unknown device id.
        """
        limits: list[tuple[float, str]] = []
        if self.memory_mib is not None:
            limits.append((self.memory_mib, "memory_mib"))
        if self.mig_profile is not None:
            dev = resolve_device(device)
            if not dev.has_mig:
                raise BudgetError(f"budget mig_profile={self.mig_profile!r} needs a device with MIG; "
                                  f"{dev.id!r} has none")
            names = [p.name for p in dev.mig_profiles]
            if self.mig_profile not in names:
                raise BudgetError(f"unknown MIG profile {self.mig_profile!r} of {dev.id!r}; choices: {names}")
            usable = next(p for p in dev.mig_profiles if p.name == self.mig_profile).usable_memory_mib
            limits.append((float(usable), f"mig:{self.mig_profile}"))
        return min(limits) if limits else None

    # ------------------------------------------------------------------ checking
    def check(self, prediction: Any) -> dict[str, ChanceCheck]:
        """Every budget set, checked against ``prediction``: ``{figure: ChanceCheck}`` in :attr:`names` order.

        Args:
            prediction: a :class:`~dippm_nas.prediction.Prediction` or a
                :class:`~dippm_nas.llm.GenerationPrediction` (anything with ``device`` and ``figure(name,
                mig_profile)``).

        Raises:
            BudgetError: ``prediction`` is not a prediction; a budget of a figure the prediction does not have
                (an LLM figure of a forward pass), or has no value for (energy of a device without power figures);
                a MIG budget the device cannot take (see :meth:`memory_limit`).
        """
        if not callable(getattr(prediction, "figure", None)) or not hasattr(prediction, "device"):
            raise BudgetError(f"prediction must be a dippm_nas.Prediction or a dippm_nas.llm.GenerationPrediction, "
                              f"got {type(prediction).__name__}")
        out: dict[str, ChanceCheck] = {}
        for name in self.names:
            if name == "memory_mib":
                lim = self.memory_limit(prediction.device)
                assert lim is not None
                budget, limit_source = lim
            else:
                budget, limit_source = float(getattr(self, name)), name
            try:
                mean, std, source = prediction.figure(name, self.mig_profile)
            except DippmNasError as e:
                raise BudgetError(f"the {name} budget ({budget:g}) cannot be checked: {e}") from e
            if mean is None:
                raise BudgetError(
                    f"the {name} budget ({budget:g}) cannot be checked: the prediction for device "
                    f"{prediction.device!r} has no {name} (source {source!r}); drop that budget or choose a "
                    "device with power figures"
                )
            out[name] = self._check_one(name, mean, std, source, budget, limit_source, prediction)
        return out

    def _check_one(self, name: str, mean: float, std: float | None, source: str, budget: float, limit_source: str,
                   prediction: Any) -> ChanceCheck:
        """One figure's :class:`ChanceCheck` (the ``k_sigma`` rule, or the ``confidence`` bound)."""
        minimum = name in MINIMUM_FIGURES
        missing = std is None
        labels: dict[str, str] = {}
        if self.confidence is None:
            k = self.k_for(name)
        else:
            k, labels = self._conformal_k(name, prediction, minimum)
        if missing and k > 0:
            _warn_once(f"std-missing:{name}:{source}",
                       "the %s prediction (source %r) has no standard deviation; its budget is checked as "
                       "mean + k_sigma * 0 (std_missing_%s is recorded)", name, source, name)
        if self.confidence is None or missing or float(mean) <= 0:
            spread = k * float(std) if std is not None else 0.0
            bound = float(mean) - spread if minimum else float(mean) + spread
        else:
            s_log = float(std) / float(mean)
            bound = float(mean) * math.exp((-k if minimum else k) * s_log) if math.isfinite(k) else (
                0.0 if minimum else math.inf)
        value = budget - bound if minimum else bound - budget
        return ChanceCheck(name=name, mean=float(mean), std=None if std is None else float(std),
                           std_missing=missing, k_sigma=k, bound=bound, budget=budget, limit_source=limit_source,
                           value=value, margin=-value, feasible=value <= 0, minimum=minimum,
                           confidence=self.confidence, labels=labels)

    def _conformal_k(self, name: str, prediction: Any, minimum: bool) -> tuple[float, dict[str, str]]:
        """The conformal ``k`` of figure ``name`` at :attr:`confidence` for ``prediction``'s regime, with its
        labels; the Gaussian quantile, flagged, without a calibration of the figure."""
        assert self.confidence is not None
        m, labels = self._in_space_margin(name, prediction, minimum)
        if m is not None:
            return m.k, {**m.labels(name), f"conformal_in_space_rows_{name}": str(m.rows)}
        cal = self.conformal
        if cal is None or name not in cal.figures:
            why = "no conformal calibration" if cal is None else f"the conformal calibration has no {name}"
            return NormalDist().inv_cdf(self.confidence), {
                **labels, f"conformal_fallback_{name}": f"{why}: the Gaussian quantile of confidence "
                                                         f"{self.confidence:g}"}
        m = cal.margin(name, self.confidence, regime_of(prediction), minimum=minimum)
        return m.k, {**labels, **m.labels(name)}

    def _in_space_margin(self, name: str, prediction: Any, minimum: bool
                         ) -> tuple[ConformalMargin | None, dict[str, str]]:
        """The in-space margin of an adapted ``prediction`` (module docstring), or ``None`` with the label saying
        why not (no label for an unadapted prediction or without :attr:`in_space`)."""
        details = getattr(prediction, "details", {}) or {}
        if self.in_space is None or "adaptation_version" not in details:
            return None, {}
        src = self.in_space
        ad = src if hasattr(src, "conformal_scores") else getattr(src, "adaptation", None)
        key = f"conformal_in_space_fallback_{name}"
        if ad is None or (float(details["adaptation_version"]), float(details.get("adaptation_rows", -1))) \
                != (float(ad.version), float(ad.rows)):
            return None, {key: "the prediction's adaptation is not the one in_space holds: the checkpoint's "
                               "calibration answers"}
        scores = ad.conformal_scores.get(name, [])
        m = in_space_margin(scores, self.confidence, minimum=minimum)
        if m is None:
            return None, {key: f"{len(scores)} in-space scores are too few for confidence {self.confidence:g} "
                               f"(ceil((n + 1) c) <= n needs more): the checkpoint's calibration answers"}
        assert m.regime == IN_SPACE_REGIME
        return m, {}

    def constraint_values(self, prediction: Any) -> dict[str, float]:
        """``{figure: mean + k * std - budget}`` (Optuna's convention: ``<= 0`` feasible; ms, J, MiB)."""
        return {n: c.value for n, c in self.check(prediction).items()}

    def ratios(self, prediction: Any) -> dict[str, float]:
        """``{figure: (mean + k * std) / budget}`` (``<= 1`` within budget), for :func:`dippm_nas.nni.scalarize`."""
        return {n: c.ratio for n, c in self.check(prediction).items()}

    def feasible(self, prediction: Any) -> bool:
        """True when the prediction meets every budget set."""
        return all(c.feasible for c in self.check(prediction).values())


def trial_attrs(checks: Mapping[str, ChanceCheck]) -> dict[str, Any]:
    """User attributes recording each chance check (units in the keys): ``budget_<f>``, ``k_sigma_<f>``,
    ``margin_<f>`` (``budget - mean - k * std``), ``std_missing_<f>``."""
    out: dict[str, Any] = {}
    for n, c in checks.items():
        out[f"budget_{n}"] = c.budget
        out[f"k_sigma_{n}"] = c.k_sigma
        out[f"margin_{n}"] = c.margin
        out[f"std_missing_{n}"] = c.std_missing
        if c.confidence is not None:
            out[f"confidence_{n}"] = c.confidence
        out.update(c.labels)
    return out
