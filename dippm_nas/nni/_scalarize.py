"""Hardware budgets and the scalarisation NNI's tuners optimise (``metric['default']``).

NNI 3.0 tuners read one number per trial, ``metric['default']``. dippm-nas folds the predicted cost into
it with the soft-constraint reward of MnasNet (Tan et al., "MnasNet: Platform-Aware Neural Architecture
Search for Mobile", CVPR 2019, Eq. 2), one factor per budget set:

    default = accuracy * prod_k  r_k ** w_k,    r_k = (mean_k + k_sigma * std_k) / budget_k,
    w_k = reward_exponent   if r_k <= 1   (within the budget)
    w_k = penalty_exponent  if r_k >  1   (over the budget)

with ``mean_k`` and ``std_k`` the predicted figure (``latency_ms``, ``energy_j``, ``memory_mib``) and its
standard deviation, and ``budget_k`` the caller's bound: the chance constraint of
:class:`~dippm_nas.budgets.Budgets` (for memory, the smaller of ``memory_mib`` and the MIG profile's
usable memory). A std the prediction lacks counts as 0 (see :mod:`dippm_nas.budgets`).

The defaults, ``reward_exponent=0`` and ``penalty_exponent=-1``, are MnasNet's hard-constraint setting:
a model within every budget scores exactly its accuracy; one over a budget is scaled by
``budget / (mean + k_sigma * std)`` (twice the latency budget halves the score). MnasNet's soft setting is
``reward_exponent = penalty_exponent = -0.07``. With no budget, ``default == accuracy``.
Accuracy must be ``>= 0`` with higher better (use ``optimize_mode: maximize``).

:class:`Constraints` is the former name of the budgets (``max_latency_ms``...); it is deprecated and makes
a :class:`~dippm_nas.budgets.Budgets`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from dippm_nas._numbers import as_real
from dippm_nas.budgets import DEFAULT_K_SIGMA, Budgets
from dippm_nas.errors import InvalidValueError
from dippm_nas.prediction import Prediction

__all__ = ["Constraints", "scalarize", "CONSTRAINT_METRICS", "budgets_from_limits"]

#: Prediction figures a deprecated ``max_*`` bound names, with the :class:`Constraints` argument of each.
CONSTRAINT_METRICS: dict[str, str] = {
    "latency_ms": "max_latency_ms",
    "energy_j": "max_energy_j",
    "memory_mib": "max_memory_mib",
}


def budgets_from_limits(budgets: "Budgets | Any", *, max_latency_ms: float | None = None,
                        max_energy_j: float | None = None, max_memory_mib: float | None = None,
                        mig_profile: str | None = None, k_sigma: float | None = None,
                        where: str = "this call", stacklevel: int = 3) -> Budgets:
    """The :class:`Budgets` of a call that takes ``budgets=`` and, deprecated, the ``max_*`` keywords.

    ``max_latency_ms`` and friends (and ``mig_profile`` given apart) warn with a ``DeprecationWarning`` and
    become the matching budget; giving one together with ``budgets`` is an error. ``k_sigma``, when not
    ``None``, replaces ``budgets.k_sigma``.
    """
    old = {"latency_ms": max_latency_ms, "energy_j": max_energy_j, "memory_mib": max_memory_mib,
           "mig_profile": mig_profile}
    old = {k: v for k, v in old.items() if v is not None}
    if old:
        names = [CONSTRAINT_METRICS.get(k, k) for k in old]
        if budgets is not None:
            raise InvalidValueError(f"{where}: give the budgets once, as budgets=Budgets(...), not also as {names}")
        warnings.warn(f"{where}: {', '.join(names)} are deprecated; pass budgets=Budgets("
                      + ", ".join(f"{k}={v!r}" for k, v in old.items()) + ") (dippm_nas.budgets)",
                      DeprecationWarning, stacklevel=stacklevel)
        b = Budgets(**old)
    else:
        b = Budgets.coerce(budgets)
    if k_sigma is not None:
        b = dataclasses.replace(b, k_sigma=k_sigma)
    return b


class Constraints:
    """Deprecated: the budgets as ``max_*`` bounds. ``Constraints(max_latency_ms=2.0)`` warns and returns
    ``Budgets(latency_ms=2.0)`` (:class:`~dippm_nas.budgets.Budgets`, the one budget type of every
    integration).

    Args:
        max_latency_ms, max_energy_j, max_memory_mib: the ``latency_ms``, ``energy_j``, ``memory_mib``
            budgets.
        mig_profile: as ``Budgets.mig_profile``.
        k_sigma: as ``Budgets.k_sigma`` (default 1.0).
    """

    def __new__(cls, max_latency_ms: float | None = None, max_energy_j: float | None = None,  # type: ignore[misc]
                max_memory_mib: float | None = None, mig_profile: str | None = None,
                k_sigma: float = DEFAULT_K_SIGMA) -> Budgets:
        warnings.warn("dippm_nas.nni.Constraints is deprecated; use dippm_nas.budgets.Budgets(latency_ms=..., "
                      "energy_j=..., memory_mib=..., mig_profile=..., k_sigma=...)", DeprecationWarning, stacklevel=2)
        return Budgets(latency_ms=max_latency_ms, energy_j=max_energy_j, memory_mib=max_memory_mib,
                       mig_profile=mig_profile, k_sigma=k_sigma)


def _check_exponent(name: str, v: Any) -> float:
    return as_real(v, name, high=0, rule=f"{name} must be a finite number <= 0 (a positive one would reward cost)")


def scalarize(accuracy: float, prediction: Prediction, constraints: Budgets | None = None, *,
              reward_exponent: float = 0.0, penalty_exponent: float = -1.0) -> float:
    """The single number NNI tuners optimise: accuracy scaled by the MnasNet constraint factors.

    See the module docstring for the formula and the meaning of the exponents.

    Args:
        accuracy: the trial's accuracy (or any quality score), ``>= 0``, higher is better.
        prediction: the predicted cost of the trial's model.
        constraints: the :class:`~dippm_nas.budgets.Budgets`; ``None`` or no budget set returns ``accuracy``
            unchanged.
        reward_exponent: exponent applied within a limit (``<= 0``; ``0`` gives no bonus for slack).
        penalty_exponent: exponent applied over a limit (``<= 0``; ``-1`` scales by ``limit / value``).

    Returns:
        The scalarised score, ``>= 0``.

    Raises:
        DippmNasError: accuracy not finite or negative, an exponent positive, or a bound that cannot be
            checked (see :meth:`Budgets.check <dippm_nas.budgets.Budgets.check>`).
    """
    accuracy = as_real(accuracy, "accuracy", low=0, rule="accuracy must be a finite number >= 0 (higher is better)")
    alpha = _check_exponent("reward_exponent", reward_exponent)
    beta = _check_exponent("penalty_exponent", penalty_exponent)
    score = float(accuracy)
    if constraints is None:
        return score
    if not isinstance(constraints, Budgets):
        raise InvalidValueError("constraints must be a dippm_nas.budgets.Budgets or None, got "
                                f"{type(constraints).__name__}")
    for r in constraints.ratios(prediction).values():
        if r <= 0:  # a zero figure is within any positive limit; r ** alpha with alpha < 0 would blow up
            continue
        score *= r ** (alpha if r <= 1.0 else beta)
    return score
