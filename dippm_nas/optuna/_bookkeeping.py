"""The trial bookkeeping of :class:`~dippm_nas.optuna.HardwareCostModel`: what it writes on a trial and what it
returns to Optuna.

:class:`TrialBookkeeping` owns everything about a trial that does not depend on when or where its prediction
ran: the chance checks and the :class:`~dippm_nas.trial.TrialRecord` written as user attributes, the constraints
registered with the sampler, the values of a candidate that could not be evaluated (``on_error``), the shape of
the returned objectives, the seconds the caller waited, and which trials it has seen (a trial run twice by two
threads is reported). The cost model schedules predictions (at once, in its background thread, or after a
conversion in a process) and hands each result here; :mod:`dippm_nas.optuna._background` uses only the methods
below, so neither module reaches into the other.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from dippm_nas._logging import WarnOnce
from dippm_nas.budgets import Budgets
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.llm import GenerationPrediction
from dippm_nas.optuna._compat import (CONSTRAINT_API, constraints_from_attrs, optuna_has_set_constraint,
                                      uses_set_constraint, warn_without_constraints_func)
from dippm_nas.optuna._objectives import LLM_OBJECTIVES, MAXIMIZED, OBJECTIVES, ON_ERROR
from dippm_nas.prediction import Prediction
from dippm_nas.spec import InputSpec
from dippm_nas.trial import TrialRecord

__all__ = ["TrialBookkeeping"]

logger = logging.getLogger(__name__)

_warn_once = WarnOnce(logger, python_warning=True)


class TrialBookkeeping:
    """Records of the trials of one cost model (see the module docstring).

    Args:
        device: catalogue id every prediction must be for.
        deployment: the deployment recorded on every trial (:meth:`dippm_nas.Deployment.to_dict`).
        budgets: the chance constraints.
        objectives: the figures returned, in order (distinct names of :data:`~dippm_nas.optuna.OBJECTIVES`).
        on_error: ``"fail"``, ``"raise"`` or ``"infeasible"`` (:data:`~dippm_nas.optuna.ON_ERROR`).
        constraint_api: one of :data:`~dippm_nas.optuna.CONSTRAINT_API` (``"set_constraint"`` needs Optuna >= 5).

    Raises:
        InvalidValueError: an objective that is not one of those names (or twice), an unknown ``on_error`` or
            ``constraint_api``, or ``"set_constraint"`` on Optuna 4.
    """

    def __init__(self, device: str, deployment: Mapping[str, Any], budgets: Budgets, objectives: Sequence[str],
                 on_error: str, constraint_api: str) -> None:
        if isinstance(objectives, str):
            raise InvalidValueError(f"objectives must be a sequence of names, got the string {objectives!r}")
        objectives = tuple(objectives)
        bad = [o for o in objectives if o not in OBJECTIVES]
        if bad or len(set(objectives)) != len(objectives):
            raise InvalidValueError(f"objectives must be distinct names from {list(OBJECTIVES)}, got "
                                    f"{list(objectives)}")
        if constraint_api not in CONSTRAINT_API:
            raise InvalidValueError(f"constraint_api must be one of {CONSTRAINT_API}, got {constraint_api!r}")
        if constraint_api == "set_constraint" and not optuna_has_set_constraint():
            raise InvalidValueError(
                f"constraint_api='set_constraint' needs Optuna >= 5 (installed: {optuna.__version__}); use "
                "'constraints_func' and pass constraints_func=cost.constraints_func to the sampler")
        if on_error not in ON_ERROR:
            raise InvalidValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.device = device
        self.deployment = dict(deployment)
        self.budgets = budgets
        self.objectives: tuple[str, ...] = objectives
        self.on_error = on_error
        self.constraint_api = constraint_api
        #: Names of the constraints, in the order :meth:`constraints_func` returns them.
        self.constraint_names: tuple[str, ...] = tuple(budgets.names)
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._evaluations = 0
        self._seen: set[tuple[str, int]] = set()

    # ------------------------------------------------------------------ accounting
    def count_wait(self, seconds: float, evaluations: int = 0) -> None:
        """Add the caller's wait (and finished evaluations) to :attr:`seconds` (and :attr:`evaluations`)."""
        with self._lock:
            self._seconds += seconds
            self._evaluations += evaluations

    @property
    def seconds(self) -> float:
        """Seconds callers spent waiting (see :attr:`HardwareCostModel.seconds`)."""
        return self._seconds

    @property
    def evaluations(self) -> int:
        """Candidates evaluated."""
        return self._evaluations

    def first_time(self, trial: Any) -> bool:
        """Whether this is the first evaluation of ``trial`` here; a second one (the storage handed one trial to
        two threads: a SQLite study not made with :func:`~dippm_nas.optuna.rdb_storage`) is warned about once."""
        study = getattr(trial, "study", None)
        number = getattr(trial, "number", None)
        if study is None or not isinstance(number, int):
            return True
        key = (str(getattr(study, "study_name", "")), number)
        with self._lock:
            new = key not in self._seen
            self._seen.add(key)
        if not new:
            _warn_once("trial-twice", "trial %s of study %r is evaluated a second time: if two threads of "
                       "study.optimize(n_jobs=...) run the same trial (a SQLite storage given as a URL pops a trial "
                       "queued by study.enqueue_trial twice), Optuna stops the study when the second one finishes; "
                       "make the study with cost.create_study(storage=url) or storage=dippm_nas.optuna.rdb_storage"
                       "(url)", number, key[0])
        return new

    # ------------------------------------------------------------------ objectives and constraints
    @property
    def directions(self) -> list[str]:
        """Optuna directions of :attr:`objectives`."""
        return ["maximize" if o in MAXIMIZED else "minimize" for o in self.objectives]

    def leading_objectives(self, leading: Mapping[str, str] | None,
                           directions: Sequence[str] | None) -> dict[str, str]:
        """The objectives a study puts before these (:meth:`HardwareCostModel.create_study`'s ``leading`` and
        ``directions``), ``{name: direction}``; default ``{"accuracy": "maximize"}``.

        Raises:
            InvalidValueError: a direction that is not ``"maximize"``/``"minimize"``, ``directions`` that do not end
                with these objectives' directions, or ``leading`` and ``directions`` that disagree.
        """
        if directions is not None:
            directions = [str(d) for d in directions]
            bad_d = [d for d in directions if d not in ("maximize", "minimize")]
            n_lead = len(directions) - len(self.directions)
            if bad_d or n_lead < 0 or directions[n_lead:] != self.directions:
                raise InvalidValueError(
                    f"directions must be yours followed by the cost model's {self.directions} (objectives "
                    f"{list(self.objectives)}), each 'maximize' or 'minimize'; got {directions}")
            if leading is not None and list(dict(leading).values()) != directions[:n_lead]:
                raise InvalidValueError(f"leading={dict(leading)} disagrees with directions={directions}")
            leading = dict(leading) if leading is not None else {f"objective_{i}": d
                                                                  for i, d in enumerate(directions[:n_lead])}
        leading = {"accuracy": "maximize"} if leading is None else dict(leading)
        bad = {k: v for k, v in leading.items() if v not in ("maximize", "minimize")}
        if bad:
            raise InvalidValueError(f"leading directions must be 'maximize' or 'minimize', got {bad}")
        return leading

    def shape(self, values: Any) -> Any:
        """What an Optuna objective returns: the float of a single objective, else the tuple (values already
        shaped pass through)."""
        if not isinstance(values, tuple):
            return values
        return values[0] if len(self.objectives) == 1 else values

    def checks(self, prediction: Prediction | GenerationPrediction) -> dict[str, Any]:
        """The chance checks of the budgets on one prediction.

        Raises:
            InvalidValueError: the prediction is for another device, or an energy budget has no energy figure.
        """
        if prediction.device != self.device:
            raise InvalidValueError(f"the prediction is for {prediction.device!r}, this cost model for {self.device!r}")
        if isinstance(prediction, Prediction) and self.budgets.energy_j is not None and prediction.energy_j is None:
            raise InvalidValueError(f"an energy budget needs an energy prediction; {self.device!r} gave none "
                                    f"(energy_source={prediction.energy_source!r})")
        return self.budgets.check(prediction)

    def constraints_func(self, trial: optuna.trial.FrozenTrial) -> list[float]:
        """The ``constraint_*`` user attributes of a finished trial (``+inf`` each when it lacks them)."""
        return constraints_from_attrs(trial, self.constraint_names)

    def register_constraints(self, trial: Any, constraints: Mapping[str, float], constraints_func: Any) -> None:
        """Register the constraint values with the sampler (``set_constraint`` or the ``constraints_func`` path;
        ``constraints_func`` is the callable a sampler may have been given)."""
        if not constraints:
            return
        if uses_set_constraint(trial, self.constraint_api, constraints_func):
            for name, v in constraints.items():
                trial.set_constraint(name, v)
        else:
            warn_without_constraints_func(trial, self.constraint_names)

    # ------------------------------------------------------------------ records
    def unevaluated(self, trial: Any, error: BaseException, constraints_func: Any) -> tuple[float, ...]:
        """Record that a candidate could not be evaluated; raise (``on_error="raise"``) or return the objective
        values that fail the trial (NaN) or make it infeasible (+inf).

        Any error is accepted (a :class:`DippmNasError`, or another one from a damaged adaptation, a storage...):
        the trial fails or is infeasible, it never stays running. A record that cannot be written (the trial
        finished already, the storage refused it) is logged and the values are still returned.
        """
        if self.on_error == "raise":
            self._try_write(trial, {"cost_model_error": f"{type(error).__name__}: {error}"})
            raise error
        number = getattr(trial, "number", "?")
        if self.on_error == "fail" and self.objectives:
            logger.info("trial %s: the cost model could not evaluate the candidate (%s); the trial fails", number, error)
            self._try_write(trial, {"cost_model_error": f"{type(error).__name__}: {error}"})
            return tuple(math.nan for _ in self.objectives)
        logger.info("trial %s: the cost model could not evaluate the candidate (%s); recorded as infeasible",
                    number, error)
        attrs: dict[str, Any] = {"cost_model_error": f"{type(error).__name__}: {error}", "feasible": False}
        attrs.update({f"constraint_{n}": math.inf for n in self.constraint_names})
        if self._try_write(trial, attrs):
            try:
                self.register_constraints(trial, dict.fromkeys(self.constraint_names, math.inf), constraints_func)
            except Exception as e:  # noqa: BLE001 - the values below still mark the trial infeasible
                _warn_once("unevaluated-constraints", "trial %s: its infeasible constraints were not registered "
                           "(%s: %s)", number, type(e).__name__, e)
        return tuple(-math.inf if d == "maximize" else math.inf for d in self.directions)

    @staticmethod
    def _try_write(trial: Any, attrs: Mapping[str, Any]) -> bool:
        try:
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
        except Exception as e:  # noqa: BLE001 - a finished trial or a storage error: say so, go on
            _warn_once("unevaluated-write", "the cost model could not record the error of trial %s (%s: %s)",
                       getattr(trial, "number", "?"), type(e).__name__, e)
            return False
        return True

    def record(self, trial: Any, pred: Prediction, spec: InputSpec, space: str | None, config: Any,
               seconds: float, constraints_func: Any) -> tuple[float, ...]:
        """Write the :class:`~dippm_nas.trial.TrialRecord` of a forward-pass prediction on the trial, register its
        constraints; return the objective values."""
        checks = self.checks(pred)
        llm = [o for o in self.objectives if o in LLM_OBJECTIVES]
        if llm:
            raise InvalidValueError(f"objectives {llm} are figures of an LLM generation: evaluate the candidate with "
                                    "an LLMWorkload (dippm_nas.llm) instead of an InputSpec")
        values = []
        for o in self.objectives:
            v = getattr(pred, o)
            if v is None:
                raise DippmNasError(f"objective {o!r} has no prediction on {self.device!r} "
                                    f"(source {getattr(pred, o.split('_')[0] + '_source')!r})")
            values.append(float(v))
        record = TrialRecord.of(pred, checks, deployment=self.deployment, input_spec=spec,
                                search_space=space, search_space_config=config, cost_model_s=seconds)
        for k, v in record.to_attrs().items():
            trial.set_user_attr(k, v)
        self.register_constraints(trial, record.constraints, constraints_func)
        return tuple(values)

    def record_generation(self, trial: Any, pred: GenerationPrediction, seconds: float,
                          constraints_func: Any) -> tuple[float, ...]:
        """Write the :class:`~dippm_nas.trial.TrialRecord` of an LLM generation (the figures of one instance of the
        budgets' MIG profile when set) on the trial, register its constraints; return the objective values."""
        checks = self.checks(pred)
        profile = self.budgets.mig_profile
        values = []
        for o in self.objectives:
            if o not in LLM_OBJECTIVES:
                raise InvalidValueError(f"objective {o!r} is a figure of a forward pass; an LLM generation has "
                                        f"{list(LLM_OBJECTIVES)}")
            v = pred.figure(o, profile).value
            if v is None:
                raise DippmNasError(f"objective {o!r} has no prediction on {self.device!r} "
                                    f"(source {pred.sources.get(o)!r})")
            values.append(float(v))
        record = TrialRecord.of_generation(pred, checks, deployment=self.deployment, mig_profile=profile,
                                           cost_model_s=seconds)
        for k, v in record.to_attrs().items():
            trial.set_user_attr(k, v)
        self.register_constraints(trial, record.constraints, constraints_func)
        return tuple(values)
