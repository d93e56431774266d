"""Hardware constraints and the scalarisation NNI's tuners optimise (``metric['default']``).

NNI 3.0 tuners read one number per trial, ``metric['default']``. dippm-nas folds the predicted cost into
it with the soft-constraint reward of MnasNet (Tan et al., "MnasNet: Platform-Aware Neural Architecture
Search for Mobile", CVPR 2019, Eq. 2), one factor per active constraint:

    default = accuracy * prod_k  r_k ** w_k,    r_k = value_k / limit_k,
    w_k = reward_exponent   if r_k <= 1   (within the limit)
    w_k = penalty_exponent  if r_k >  1   (over the limit)

with ``value_k`` the predicted figure (``latency_ms``, ``energy_j``, ``memory_mib``) and ``limit_k`` the
caller's bound. For a MIG constraint the figure is the memory the MIG advisor checks the fit with
(prediction plus ``k_sigma`` standard deviations) and the limit is the profile's usable memory.

The defaults, ``reward_exponent=0`` and ``penalty_exponent=-1``, are MnasNet's hard-constraint setting:
a model within every limit scores exactly its accuracy; one over a limit is scaled by
``limit / value`` (twice the latency limit halves the score). MnasNet's soft setting is
``reward_exponent = penalty_exponent = -0.07``. With no constraint, ``default == accuracy``.
Accuracy must be ``>= 0`` with higher better (use ``optimize_mode: maximize``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dippm_nas.errors import DippmNasError
from dippm_nas.prediction import Prediction

__all__ = ["Constraints", "scalarize", "CONSTRAINT_METRICS"]

#: Prediction fields a ``max_*`` constraint can bound, with the Constraints field of each.
CONSTRAINT_METRICS: dict[str, str] = {
    "latency_ms": "max_latency_ms",
    "energy_j": "max_energy_j",
    "memory_mib": "max_memory_mib",
}


def _check_limit(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise DippmNasError(f"{name} must be a finite number > 0 or None, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Constraints:
    """Upper bounds on the predicted cost of a model; ``None`` leaves a figure free.

    Attributes:
        max_latency_ms: latency of one batch, milliseconds.
        max_energy_j: energy of one batch, joules (the device must have power figures).
        max_memory_mib: peak device memory, MiB.
        mig_profile: a MIG profile of the device the model must fit, e.g. ``"1g.10gb"`` (the fit rule of
            :func:`dippm_nas.mig.advise`, with the prediction's ``k_sigma``).
    """

    max_latency_ms: float | None = None
    max_energy_j: float | None = None
    max_memory_mib: float | None = None
    mig_profile: str | None = None

    def __post_init__(self) -> None:
        for f in CONSTRAINT_METRICS.values():
            object.__setattr__(self, f, _check_limit(f, getattr(self, f)))
        if self.mig_profile is not None and (not isinstance(self.mig_profile, str) or not self.mig_profile):
            raise DippmNasError(f"mig_profile must be a MIG profile name such as '1g.10gb' or None, "
                                f"got {self.mig_profile!r}")

    @property
    def active(self) -> bool:
        """True when at least one bound is set."""
        return any(getattr(self, f) is not None for f in CONSTRAINT_METRICS.values()) or self.mig_profile is not None

    def ratios(self, prediction: Prediction) -> dict[str, float]:
        """``value / limit`` of every active constraint (``<= 1`` is within the limit).

        Keys are ``"latency_ms"``, ``"energy_j"``, ``"memory_mib"`` and ``"mig:<profile>"``.

        Raises:
            DippmNasError: ``max_energy_j`` is set but the prediction has no energy figure (device without
                power figures), or ``mig_profile`` is set but the prediction carries no MIG advice (device
                without MIG, or predicted with ``mig=False``); an unknown profile name lists the device's.
        """
        if not isinstance(prediction, Prediction):
            raise DippmNasError(f"prediction must be a dippm_nas.Prediction, got {type(prediction).__name__}")
        out: dict[str, float] = {}
        for metric, field_name in CONSTRAINT_METRICS.items():
            limit = getattr(self, field_name)
            if limit is None:
                continue
            value = getattr(prediction, metric)
            if value is None:
                raise DippmNasError(
                    f"{field_name}={limit:g} cannot be checked: the prediction for device {prediction.device!r} "
                    f"has no {metric} (the device gives no way to know it); drop the bound or choose a device "
                    "with power figures"
                )
            out[metric] = float(value) / limit
        if self.mig_profile is not None:
            advice = prediction.mig
            if advice is None or not getattr(advice, "supported", False):
                why = getattr(advice, "reason", "") or "the prediction carries no MIG advice (predicted with mig=False?)"
                raise DippmNasError(f"mig_profile={self.mig_profile!r} cannot be checked: {why}")
            p = advice.profile(self.mig_profile)  # lists the device's profiles when unknown
            out[f"mig:{self.mig_profile}"] = float(advice.memory_needed_mib) / float(p.memory_limit_mib)
        return out

    def violations(self, prediction: Prediction) -> dict[str, float]:
        """Relative violation of every active constraint, ``value / limit - 1`` (``<= 0`` is satisfied).

        This is the form Optuna's constrained samplers read (``trial.set_constraint``).
        """
        return {k: r - 1.0 for k, r in self.ratios(prediction).items()}

    def feasible(self, prediction: Prediction) -> bool:
        """True when the prediction is within every bound."""
        return all(r <= 1.0 for r in self.ratios(prediction).values())

    def to_dict(self) -> dict[str, Any]:
        """The set bounds only, JSON-able."""
        d = {f: getattr(self, f) for f in (*CONSTRAINT_METRICS.values(), "mig_profile")}
        return {k: v for k, v in d.items() if v is not None}


def _check_exponent(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v > 0:
        raise DippmNasError(f"{name} must be a finite number <= 0 (a positive one would reward cost), got {v!r}")
    return float(v)


def scalarize(accuracy: float, prediction: Prediction, constraints: Constraints | None = None, *,
              reward_exponent: float = 0.0, penalty_exponent: float = -1.0) -> float:
    """The single number NNI tuners optimise: accuracy scaled by the MnasNet constraint factors.

    See the module docstring for the formula and the meaning of the exponents.

    Args:
        accuracy: the trial's accuracy (or any quality score), ``>= 0``, higher is better.
        prediction: the predicted cost of the trial's model.
        constraints: the bounds; ``None`` or no active bound returns ``accuracy`` unchanged.
        reward_exponent: exponent applied within a limit (``<= 0``; ``0`` gives no bonus for slack).
        penalty_exponent: exponent applied over a limit (``<= 0``; ``-1`` scales by ``limit / value``).

    Returns:
        The scalarised score, ``>= 0``.

    Raises:
        DippmNasError: accuracy not finite or negative, an exponent positive, or a bound that cannot be
            checked (see :meth:`Constraints.ratios`).
    """
    if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) or not math.isfinite(accuracy) \
            or accuracy < 0:
        raise DippmNasError(f"accuracy must be a finite number >= 0 (higher is better), got {accuracy!r}")
    alpha = _check_exponent("reward_exponent", reward_exponent)
    beta = _check_exponent("penalty_exponent", penalty_exponent)
    score = float(accuracy)
    if constraints is None:
        return score
    for r in constraints.ratios(prediction).values():
        if r <= 0:  # a zero figure is within any positive limit; r ** alpha with alpha < 0 would blow up
            continue
        score *= r ** (alpha if r <= 1.0 else beta)
    return score
