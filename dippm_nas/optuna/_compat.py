"""How constraints reach Optuna's samplers on Optuna 4 and 5.

Optuna >= 5 has ``Trial.set_constraint``; on Optuna 4.x a constrained sampler reads the constraints through the
``constraints_func`` it was created with, which reads them from the trial's user attributes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from dippm_nas._logging import WarnOnce

__all__ = ["CONSTRAINT_API", "optuna_has_set_constraint", "uses_set_constraint", "warn_without_constraints_func",
           "constraints_from_attrs"]

logger = logging.getLogger(__name__)

#: How constraints reach the sampler: ``"auto"`` (``trial.set_constraint`` when the trial has it),
#: ``"set_constraint"`` (Optuna >= 5), ``"constraints_func"`` (Optuna 4.x: the sampler's argument).
CONSTRAINT_API: tuple[str, ...] = ("auto", "set_constraint", "constraints_func")

_warn_once = WarnOnce(logger, python_warning=True)


def optuna_has_set_constraint() -> bool:
    """Whether the installed Optuna has ``Trial.set_constraint`` (Optuna >= 5)."""
    return hasattr(optuna.trial.Trial, "set_constraint")


def _sampler_of(trial: Any) -> Any:
    return getattr(getattr(trial, "study", None), "sampler", None)


def uses_set_constraint(trial: Any, api: str, constraints_func: Callable[..., Any]) -> bool:
    """Whether to register constraints with ``trial.set_constraint`` under ``api`` (one of :data:`CONSTRAINT_API`).

    ``"auto"`` uses it when the trial has it, unless the study's sampler was created with ``constraints_func``
    (Optuna's samplers keep it as ``_constraints_func``): it records them itself, and ``set_constraint`` would
    record them twice.
    """
    if api == "constraints_func":
        return False
    if api == "set_constraint":
        return True
    if getattr(_sampler_of(trial), "_constraints_func", None) == constraints_func:
        return False
    return hasattr(trial, "set_constraint")


def warn_without_constraints_func(trial: Any, names: Sequence[str]) -> None:
    """On the ``constraints_func`` path, warn once when the study's sampler was not given it."""
    if not names:
        return
    sampler = _sampler_of(trial)
    if sampler is None:
        return
    if getattr(sampler, "_constraints_func", None) is None and hasattr(sampler, "_constraints_func"):
        _warn_once(
            "no-constraints-func",
            "the cost model's constraints (%s) reach %s only through constraints_func on Optuna %s: create "
            "it with constraints_func=cost.constraints_func", ", ".join(names), type(sampler).__name__,
            optuna.__version__,
        )


def constraints_from_attrs(trial: optuna.trial.FrozenTrial, names: Sequence[str]) -> list[float]:
    """The ``constraint_<name>`` user attributes of a finished trial, in ``names`` order; ``+inf`` for each (with
    a warning once) when the trial lacks them (its objective never evaluated the candidate: its cost is unknown)."""
    attrs = trial.user_attrs
    keys = [f"constraint_{n}" for n in names]
    if not all(k in attrs for k in keys):
        _warn_once(
            "constraints-missing",
            "trial %d finished without the cost model's constraint attributes (did the objective call "
            "HardwareCostModel.evaluate?); reporting it infeasible (+inf) to the sampler", trial.number,
        )
        return [math.inf] * len(keys)
    return [float(attrs[k]) for k in keys]

