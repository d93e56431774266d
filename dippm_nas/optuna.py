"""Optuna integration: predicted hardware objectives and constraints inside an objective function.

>>> import optuna
>>> from dippm_nas.optuna import Budgets, HardwareCostModel
>>> cost = HardwareCostModel(device="a100-sxm4-40gb", budgets=Budgets(latency_ms=5.0, mig_profile="1g.5gb"))
>>> study = cost.create_study(leading={"accuracy": "maximize"})        # doctest: +SKIP
>>> def objective(trial):                                               # doctest: +SKIP
...     model = build(trial)                       # any nn.Module (or an OperatorGraph)
...     latency_ms, energy_j = cost.evaluate(trial, model, spec)
...     return train(model), latency_ms, energy_j
>>> study.optimize(objective, n_trials=100)                             # doctest: +SKIP

To keep the cost model off the search's critical path, let it work while the model trains
(``background_workers`` conversion processes; see :meth:`HardwareCostModel.submit`)::

    cost = HardwareCostModel(budgets=..., background_workers=1)
    def objective(trial):
        model = build(trial)
        pending = cost.submit(trial, model, spec)
        return (train(model), *pending.result())

For batches of asked trials, :meth:`HardwareCostModel.evaluate_many` converts and predicts ``k`` at once.

Objective values
    :meth:`HardwareCostModel.evaluate` returns the predicted figures named by ``objectives``, in that
    order (default ``("latency_ms", "energy_j")``: milliseconds per batch, joules per batch), all to be
    minimised. Put them after your own objectives: the study's directions are then
    ``[*your_directions, *cost.directions]`` and its metric names ``[*your_names, *cost.objectives]``;
    :meth:`HardwareCostModel.create_study` sets both (with ``study.set_metric_names``).

Constraints (chance constraints, :mod:`dippm_nas.budgets`; Optuna's convention: a value ``<= 0`` is feasible)
    Each budget set is met when the predicted figure plus ``k`` standard deviations is within it, and the
    constraint value is ``mean + k * std - budget`` in the figure's unit:

    - ``latency_ms``: ``latency_ms + k * latency_ms_std - budgets.latency_ms`` (ms);
    - ``energy_j``: ``energy_j + k * energy_j_std - budgets.energy_j`` (J);
    - ``memory_mib``: ``memory_mib + k * memory_mib_std`` minus the smaller of ``budgets.memory_mib`` and
      the usable memory of the MIG profile ``budgets.mig_profile`` (MiB; the MIG advisor's rule,
      :mod:`dippm_nas.mig`).

    ``k`` is ``budgets.k_sigma`` (default 1.0) or the figure's entry of ``budgets.k_sigmas``. A prediction
    without a std for a budgeted figure is checked with std 0, recorded as ``std_missing_<figure>`` and
    warned about once. Only the budgets you set become constraints, always in that order
    (:attr:`constraint_names`). On Optuna >= 5 :meth:`~HardwareCostModel.evaluate` registers them with
    ``trial.set_constraint``; on Optuna 4.x pass ``constraints_func=cost.constraints_func`` to the sampler
    (TPE, NSGA-II, NSGA-III, GP). An infeasible candidate is reported as a violation and never pruned:
    pruning it would hide it from the sampler, which then drifts toward small networks.

LLM generation
    Give an :class:`~dippm_nas.llm.LLMWorkload` instead of an ``InputSpec`` and the candidate (a ``transformers``
    config or model, a :class:`~dippm_nas.llm.DecoderConfig`) is predicted with
    :func:`dippm_nas.llm.predict_generation` for the cost model's runtime (``"serving"`` too, with ``engine``).
    Its objectives are any of :data:`LLM_OBJECTIVES` (``tokens_per_s``, ``output_tokens_per_s`` and
    ``max_batch`` are maximised, the others minimised) and its budgets the generation figures of
    :class:`~dippm_nas.budgets.Budgets` (``prefill_ms``, ``decode_ms_per_token``, ``energy_j_per_token``, and the
    minimums ``tokens_per_s`` and ``max_batch``). With ``budgets.mig_profile`` every figure is that of one
    instance of the profile. The trial records ``predicted_<figure>``, ``predicted_<figure>_std`` and
    ``source_<figure>`` of every figure of :data:`dippm_nas.llm.GENERATION_FIGURES`, ``llm_model``,
    ``workload``, ``fits`` and ``fit_reason``.

A candidate the cost model cannot evaluate (``on_error``; default ``"fail"``)
    A model that cannot be captured or predicted (data-dependent control flow, an input that does not fit,
    an unsupported op...) never stops the study: with ``on_error="fail"`` :meth:`HardwareCostModel.evaluate`
    returns NaN for every objective, so Optuna marks the trial ``FAIL`` and goes on to the next one;
    ``on_error="infeasible"`` returns ``+inf`` for every objective and registers every constraint as
    ``+inf`` (``feasible=False``), so the trial completes as a violation the sampler steers away from;
    ``on_error="raise"`` raises the :class:`~dippm_nas.errors.DippmNasError` (the study stops unless
    ``study.optimize(catch=...)`` names it). In every case the reason is the ``cost_model_error`` user
    attribute. With no cost objectives (``objectives=()``) a trial cannot be failed through its values, so
    ``"fail"`` records it as ``"infeasible"`` does.

User attributes set on every evaluated trial (units in the keys)
    ``predicted_latency_ms``, ``predicted_latency_ms_std``, ``latency_source``, ``predicted_energy_j``,
    ``predicted_energy_j_std``, ``energy_source``, ``predicted_memory_mib``, ``predicted_memory_mib_std``,
    ``memory_source`` (sources: ``"predicted"``, ``"analytic"``, ``"calibrated"``, ``"unavailable"``;
    a std is ``None`` when the source gives none), ``predicted_device``, ``mig_smallest_fit`` (``None``
    when nothing fits or the device has no MIG), ``runtime`` and ``deployment`` (the cost model's
    :class:`~dippm_nas.Deployment` as :meth:`~dippm_nas.Deployment.to_dict`), ``constraint_latency_ms`` /
    ``constraint_energy_j`` / ``constraint_memory_mib`` and, per budget set, ``budget_<figure>`` (the limit), ``k_sigma_<figure>``,
    ``margin_<figure>`` (``budget - mean - k * std``, ``>= 0`` feasible) and ``std_missing_<figure>``;
    ``feasible``, ``cost_model_s`` (seconds of
    conversion and prediction for this trial, before these attributes are written; with
    :meth:`~HardwareCostModel.submit` and background workers that work overlaps the objective, and
    :attr:`~HardwareCostModel.seconds` counts only the caller's waits), ``input_spec`` (:meth:`InputSpec.to_dict`), and, for models built
    by :func:`search_spaces.build_model`, ``search_space`` and ``search_space_config`` (what
    :class:`~dippm_nas.validation.ParetoValidator` rebuilds a model from; no code or pickle is stored).
    ``unknown_ops`` is added when operators had no formula. When the prediction comes from an adapted predictor
    (``predictor.adapt``, fed by :class:`~dippm_nas.validation.ParetoValidator` and ``dippm-nas
    validate-worker``): ``adaptation_version`` and ``adaptation_rows`` (the stored version and the measured rows
    it was fitted on). Before each evaluation the device's predictor loads the newest stored version for the
    device, deployment and the candidate's search space (``"any"`` for other models) from the study's storage,
    so the search follows its validation workers without a restart.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import optuna

from dippm_nas import errors
from dippm_nas._logging import WarnOnce
from dippm_nas._numbers import as_int
from dippm_nas._sql import sqlite_connect_listener
from dippm_nas.budgets import Budgets, check_k_sigma, trial_attrs
from dippm_nas.cache import ConversionCache, default_cache, set_default_cache
from dippm_nas.capture import assemble, capture, space_config_of
from dippm_nas.deployment import DEPLOYMENT_RUNTIMES, GRAPH_RUNTIMES, Deployment
from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError, InvalidValueError, SearchSpaceError
from dippm_nas.graph import OperatorGraph
from dippm_nas.llm import GENERATION_FIGURES, GenerationPrediction, LLMWorkload, predict_generation
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import ANY_SPACE, DEFAULT_DEVICE, get_predictor, predict, predict_many
from dippm_nas.spec import InputSpec

__all__ = [
    "Budgets",
    "HardwareCostModel",
    "PendingEvaluation",
    "OBJECTIVES",
    "LLM_OBJECTIVES",
    "MAXIMIZED",
    "CONSTRAINT_API",
    "ON_ERROR",
    "optuna_has_set_constraint",
    "rdb_storage",
]

logger = logging.getLogger(__name__)

#: Figures of an LLM generation :class:`HardwareCostModel` can return as objectives (with an ``LLMWorkload``).
LLM_OBJECTIVES: dict[str, str] = {
    "tokens_per_s": "input + output tokens per second", "output_tokens_per_s": "generated tokens per second",
    "decode_ms_per_token": "ms per decode step", "prefill_ms": "ms to the first token", "e2e_ms": "ms per batch",
    "energy_j_per_token": "J per generated token", "max_batch": "sequences held at once",
    "peak_memory_mib": "MiB",
}
#: Objectives maximised (the others are minimised).
MAXIMIZED: frozenset[str] = frozenset({"tokens_per_s", "output_tokens_per_s", "max_batch"})
#: Figures :class:`HardwareCostModel` can return as objectives, with their units: those of a forward pass
#: (``latency_ms``, ``energy_j``, ``memory_mib``) and those of an LLM generation (:data:`LLM_OBJECTIVES`).
OBJECTIVES: dict[str, str] = {"latency_ms": "ms per batch", "energy_j": "J per batch", "memory_mib": "MiB",
                              **LLM_OBJECTIVES}
#: How constraints reach the sampler: ``"auto"`` (``trial.set_constraint`` when the trial has it),
#: ``"set_constraint"`` (Optuna >= 5), ``"constraints_func"`` (Optuna 4.x: the sampler's argument).
CONSTRAINT_API: tuple[str, ...] = ("auto", "set_constraint", "constraints_func")
#: What :meth:`HardwareCostModel.evaluate` does when a candidate cannot be evaluated: ``"fail"`` the trial
#: (NaN objectives; the study goes on), ``"raise"`` the error, or complete it ``"infeasible"`` (+inf
#: objectives and constraints).
ON_ERROR: tuple[str, ...] = ("fail", "raise", "infeasible")

_warn_once = WarnOnce(logger, python_warning=True)


def optuna_has_set_constraint() -> bool:
    """Whether the installed Optuna has ``Trial.set_constraint`` (Optuna >= 5)."""
    return hasattr(optuna.trial.Trial, "set_constraint")


def rdb_storage(url: str, *, heartbeat_interval: int | None = None, grace_period: int | None = None,
                **engine_kwargs: Any) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage; for SQLite, set up for many writes from several processes.

    Every user attribute and constraint the cost model records is a database write. Optuna's default
    SQLite set-up (rollback journal, a sync to disk per commit, 5 s lock timeout) makes each one cost
    5-30 ms and lets concurrent processes fail with "database is locked". For a SQLite URL each
    connection here gets the settings of the conversion cache and the validation queue instead
    (:mod:`dippm_nas._sql`): a 30 s busy timeout, the WAL journal (readers never block the writer)
    and ``synchronous=NORMAL`` (no sync per commit; a power cut may lose the last commits, never
    corrupt the file). Measured on a loaded 2-core machine: 17.7 ms per user attribute with Optuna's
    default, 1.7 ms with these. WAL needs a local file system. Other URLs (PostgreSQL...) get
    ``pool_pre_ping``.

    Args:
        url: a SQLAlchemy URL, e.g. ``sqlite:///study.db`` or ``postgresql+psycopg2://user:pw@host/db``.
        heartbeat_interval: Optuna's trial heartbeat, seconds (``RDBStorage(heartbeat_interval=...)``): a
            running trial's heartbeat is stamped with the database's clock this often, and a trial whose
            heartbeat is older than ``grace_period`` is failed by the next trial started (a worker that
            died). ``None`` (default): no heartbeat.
        grace_period: seconds without a heartbeat before a trial counts as dead (Optuna's default: twice
            ``heartbeat_interval``).
        **engine_kwargs: passed to ``sqlalchemy.create_engine`` through ``RDBStorage(engine_kwargs=...)``.

    Returns:
        An ``optuna.storages.RDBStorage`` to pass as ``storage=``.

    Raises:
        InvalidValueError: ``heartbeat_interval`` or ``grace_period`` is not a positive int or None.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    for name, v in (("heartbeat_interval", heartbeat_interval), ("grace_period", grace_period)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidValueError(f"{name} must be a positive int (seconds) or None, got {v!r}")
    is_sqlite = make_url(url).get_backend_name() == "sqlite"
    if not is_sqlite:
        engine_kwargs.setdefault("pool_pre_ping", True)
    storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs or None,
                                         heartbeat_interval=heartbeat_interval, grace_period=grace_period)
    if is_sqlite:
        listener = sqlite_connect_listener(
            what="Optuna storage", local_hint="Keep the study's SQLite file on a local disk."
        )
        event.listen(storage.engine, "connect", listener)
        storage.engine.dispose()  # connections opened while Optuna created its tables get the settings too
    return storage


def _jsonable(value: Any, what: str) -> Any:
    """``json.loads(json.dumps(value))``; a value that is not plain JSON data is an error."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidValueError(f"{what} must be plain JSON data (dicts, lists, str, numbers, bools), got {value!r}: "
                                f"{e}") from e


class HardwareCostModel:
    """Predicted latency, energy and memory of each candidate, as Optuna objectives and constraints.

    Args:
        device: catalogue id of the target device (``dippm-nas devices`` lists them); default
            ``"a100-sxm4-40gb"``.
        budgets: a :class:`~dippm_nas.budgets.Budgets` (or a mapping with its keys); each budget set
            becomes a chance constraint (see the module docstring).
        objectives: predicted figures returned by :meth:`evaluate`, in order; any of :data:`OBJECTIVES`.
            Default ``("latency_ms", "energy_j")``. ``()`` returns nothing (constraints only).
        k_sigma: when given, replaces ``budgets.k_sigma`` (standard deviations added to every budgeted
            figure; the per-figure ``budgets.k_sigmas`` still win). ``None`` (default) keeps the budgets'
            own, 1.0 unless set. The MIG advice of each prediction uses the memory figure's ``k``.
        cache: the conversion cache, as in :func:`dippm_nas.capture` (``True``: the default cache,
            shared by every process on the same cache URL).
        constraint_api: one of :data:`CONSTRAINT_API`; default ``"auto"``.
        background_workers: processes that convert candidates submitted with :meth:`submit` while the
            objective trains them (``0``: :meth:`submit` converts at once, in this process). Models of
            :mod:`search_spaces` travel as their space name and JSON config and are rebuilt in the
            worker; other models are pickled to it (a local child process, never stored).
        deployment: how candidates will run on the GPU: a :class:`~dippm_nas.Deployment`, a mapping of its
            fields or a JSON/TOML deployment file (see :func:`dippm_nas.predict`); ``None``: nothing described
            but ``runtime`` and ``host``. Recorded on every trial (the ``deployment`` user attribute).
            ``runtime="serving"`` (an LLM serving engine) is for LLM generations only.
        runtime: shorthand for ``Deployment(runtime=...)``: ``"eager"`` (default), ``"cuda-graphs"`` or
            ``"compiled"``; for LLM generations also ``"serving"``.
        host: shorthand for ``Deployment(host=...)``: a :class:`~dippm_nas.devices.HostProfile`, a profile JSON
            file or ``"default"``.
        engine: the serving engine of LLM generations with ``runtime="serving"`` (``"vllm"``, the default unless
            the deployment's ``versions`` name one, or ``"tensorrt-llm"``).
        on_error: one of :data:`ON_ERROR`, for a candidate that cannot be captured or predicted (see the
            module docstring): ``"fail"`` (default) fails the trial and the study goes on, ``"infeasible"``
            completes it with its constraints violated, ``"raise"`` raises.

    Raises:
        DeviceError: unknown device (the catalogue is listed), or an unreadable host profile.
        ExecutionRuntimeError: an unknown runtime (the choices are listed).
        DeploymentError: a bad deployment (the field, the value and the choices are named), or a ``runtime`` /
            ``host`` that conflicts with it.
        DippmNasError: an unknown objective, a MIG budget on a device without MIG or with an unknown
            profile (the profiles are listed), or energy asked of a device without power figures.
    """

    def __init__(
        self,
        device: str = DEFAULT_DEVICE,
        budgets: Budgets | Mapping[str, Any] | None = None,
        *,
        objectives: Sequence[str] = ("latency_ms", "energy_j"),
        k_sigma: float | None = None,
        cache: Any = True,
        constraint_api: Literal["auto", "set_constraint", "constraints_func"] = "auto",
        background_workers: int = 0,
        deployment: Any = None,
        runtime: str | None = None,
        host: Any = None,
        on_error: Literal["fail", "raise", "infeasible"] = "fail",
        engine: str | None = None,
    ) -> None:
        dev = resolve_device(device)
        self.device: str = dev.id
        #: how the candidates run (every prediction is for it)
        self.deployment: Deployment = Deployment.coerce(deployment, runtime=runtime, host=host,
                                                        runtimes=DEPLOYMENT_RUNTIMES)
        self.engine = engine
        if engine is not None and self.deployment.runtime != "serving":
            raise InvalidValueError(f"engine={engine!r} needs runtime='serving', got {self.deployment.runtime!r}")
        budgets = Budgets.coerce(budgets)
        if k_sigma is not None:
            budgets = dataclasses.replace(budgets, k_sigma=check_k_sigma(k_sigma))
        self.budgets: Budgets = budgets
        if isinstance(objectives, str):
            raise InvalidValueError(f"objectives must be a sequence of names, got the string {objectives!r}")
        objectives = tuple(objectives)
        bad = [o for o in objectives if o not in OBJECTIVES]
        if bad or len(set(objectives)) != len(objectives):
            raise InvalidValueError(f"objectives must be distinct names from {list(OBJECTIVES)}, got "
                                    f"{list(objectives)}")
        self.objectives: tuple[str, ...] = objectives
        #: standard deviations of memory the MIG advice of each prediction adds (the memory budget's ``k``)
        self.k_sigma = budgets.k_for("memory_mib")
        if constraint_api not in CONSTRAINT_API:
            raise InvalidValueError(f"constraint_api must be one of {CONSTRAINT_API}, got {constraint_api!r}")
        if constraint_api == "set_constraint" and not optuna_has_set_constraint():
            raise InvalidValueError(
                f"constraint_api='set_constraint' needs Optuna >= 5 (installed: {optuna.__version__}); use "
                "'constraints_func' and pass constraints_func=cost.constraints_func to the sampler"
            )
        self.constraint_api = constraint_api
        self.cache = cache
        self.background_workers = as_int(background_workers, "background_workers", low=0)
        if on_error not in ON_ERROR:
            raise InvalidValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.on_error = on_error
        self._pool: Any = None
        self._finisher: Any = None

        wants_energy = bool({"energy_j", "energy_j_per_token"} & set(objectives)) or budgets.energy_j is not None \
            or budgets.energy_j_per_token is not None
        if wants_energy and dev.board_power_w is None:
            raise InvalidValueError(
                f"device {dev.id!r} has no power figures, so its energy cannot be predicted; drop 'energy_j' "
                "from objectives and budgets, or choose a device with board_power_w (dippm-nas devices)"
            )
        self._mig_limit_mib: float | None = None
        if budgets.mig_profile is not None:
            budgets.memory_limit(dev)  # a profile the device lacks fails here, with the choices
            self._mig_limit_mib = next(p for p in dev.mig_profiles if p.name == budgets.mig_profile).usable_memory_mib
        names = list(budgets.names)
        #: Names of the constraints, in the order :meth:`constraints_func` returns them.
        self.constraint_names: tuple[str, ...] = tuple(names)
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._evaluations = 0

    # ------------------------------------------------------------------ study set-up
    @property
    def directions(self) -> list[str]:
        """Optuna directions of :attr:`objectives` (``"maximize"`` for :data:`MAXIMIZED`, else ``"minimize"``)."""
        return ["maximize" if o in MAXIMIZED else "minimize" for o in self.objectives]

    @property
    def mig_limit_mib(self) -> float | None:
        """Usable memory of the budget's MIG profile, MiB (``None`` without a MIG budget)."""
        return self._mig_limit_mib

    def metric_names(self, leading: Sequence[str] = ("accuracy",)) -> list[str]:
        """``[*leading, *objectives]``: the names of a study's objectives, yours first."""
        return [*leading, *self.objectives]

    def set_metric_names(self, study: optuna.Study, leading: Sequence[str] = ("accuracy",)) -> None:
        """Name the study's objectives ``[*leading, *objectives]`` with ``study.set_metric_names``.

        Raises:
            DippmNasError: the study does not have ``len(leading) + len(objectives)`` objectives.
        """
        names = self.metric_names(leading)
        if len(study.directions) != len(names):
            raise InvalidValueError(
                f"the study has {len(study.directions)} objectives but the names are {names} "
                f"({len(leading)} leading + {len(self.objectives)} from the cost model)"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)

    def create_study(self, leading: Mapping[str, str] | None = None, *, directions: Sequence[str] | None = None,
                     **kwargs: Any) -> optuna.Study:
        """``optuna.create_study`` with directions ``[*leading.values(), *directions]`` and metric names set.

        Args:
            leading: your objectives before the cost model's, ``{name: "maximize" | "minimize"}``;
                default ``{"accuracy": "maximize"}``. ``{}`` makes a study of the hardware objectives only.
            directions: Optuna's own argument instead of ``leading``: every objective's direction, yours first,
                then the cost model's (:attr:`directions`, which must end the list); your objectives are named
                ``objective_0``, ``objective_1``... (or by ``leading``'s keys when both are given and agree).
            **kwargs: passed to ``optuna.create_study`` (``storage``, ``sampler``, ``study_name``,
                ``load_if_exists``...).

        Raises:
            InvalidValueError: a direction that is not ``"maximize"``/``"minimize"``, ``directions`` that do not end
                with the cost model's, ``leading`` and ``directions`` that disagree, or ``direction`` given.
        """
        if "direction" in kwargs:
            raise InvalidValueError("create_study() takes directions=[...] (every objective) or "
                                    "leading={name: direction}, not direction=")
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
        all_directions = [*leading.values(), *self.directions]
        if not all_directions:
            raise InvalidValueError("a study needs at least one objective: give leading objectives or cost objectives")
        study = optuna.create_study(directions=all_directions, **kwargs)
        self.set_metric_names(study, list(leading))
        return study

    # ------------------------------------------------------------------ constraints
    def constraints(self, prediction: Prediction) -> dict[str, float]:
        """Constraint values of one prediction, ``{name: mean + k * std - budget}`` in :attr:`constraint_names`
        order (<= 0 feasible; ms, J, MiB).

        Raises:
            DippmNasError: the prediction is for another device, or a budgeted figure is missing.
        """
        return {n: c.value for n, c in self._checks(prediction).items()}

    def _checks(self, prediction: Prediction | GenerationPrediction) -> dict[str, Any]:
        if prediction.device != self.device:
            raise InvalidValueError(f"the prediction is for {prediction.device!r}, this cost model for {self.device!r}")
        if isinstance(prediction, Prediction) and self.budgets.energy_j is not None and prediction.energy_j is None:
            raise InvalidValueError(f"an energy budget needs an energy prediction; {self.device!r} gave none "
                                    f"(energy_source={prediction.energy_source!r})")
        return self.budgets.check(prediction)

    def constraints_func(self, trial: optuna.trial.FrozenTrial) -> list[float]:
        """For Optuna 4.x samplers (``TPESampler(constraints_func=cost.constraints_func)``).

        Reads the ``constraint_*`` user attributes :meth:`evaluate` wrote. A trial that finished
        without them (its objective never called :meth:`evaluate`) is reported infeasible
        (``+inf`` for every constraint), with a warning once: its hardware cost is unknown.
        """
        attrs = trial.user_attrs
        keys = [f"constraint_{n}" for n in self.constraint_names]
        if not all(k in attrs for k in keys):
            _warn_once(
                "constraints-missing",
                "trial %d finished without the cost model's constraint attributes (did the objective call "
                "HardwareCostModel.evaluate?); reporting it infeasible (+inf) to the sampler", trial.number,
            )
            return [math.inf] * len(keys)
        return [float(attrs[k]) for k in keys]

    def _use_set_constraint(self, trial: Any) -> bool:
        if self.constraint_api == "constraints_func":
            return False
        if self.constraint_api == "set_constraint":
            return True
        if self._sampler_has_our_constraints_func(trial):
            return False  # the sampler records them through constraints_func: set_constraint would record them twice
        return hasattr(trial, "set_constraint")

    def _sampler_has_our_constraints_func(self, trial: Any) -> bool:
        """The study's sampler was created with ``constraints_func=cost.constraints_func`` (Optuna's samplers
        keep it as ``_constraints_func``)."""
        sampler = getattr(getattr(trial, "study", None), "sampler", None)
        return getattr(sampler, "_constraints_func", None) == self.constraints_func

    def _check_4x_sampler(self, trial: Any) -> None:
        """On the constraints_func path, warn once when the study's sampler was not given it."""
        if not self.constraint_names:
            return
        study = getattr(trial, "study", None)
        sampler = getattr(study, "sampler", None)
        if sampler is None:
            return
        func = getattr(sampler, "_constraints_func", None)
        if func is None and hasattr(sampler, "_constraints_func"):
            _warn_once(
                "no-constraints-func",
                "the cost model's constraints (%s) reach %s only through constraints_func on Optuna %s: create "
                "it with constraints_func=cost.constraints_func", ", ".join(self.constraint_names),
                type(sampler).__name__, optuna.__version__,
            )

    def _unevaluated(self, trial: Any, error: DippmNasError) -> tuple[float, ...]:
        """Record that a candidate could not be evaluated; raise (``on_error="raise"``) or return the
        objective values that fail the trial (NaN) or make it infeasible (+inf)."""
        trial.set_user_attr("cost_model_error", f"{type(error).__name__}: {error}")
        if self.on_error == "raise":
            raise error
        if self.on_error == "fail" and self.objectives:
            logger.info("trial %s: the cost model could not evaluate the candidate (%s); the trial fails",
                        getattr(trial, "number", "?"), error)
            return tuple(math.nan for _ in self.objectives)
        worst = tuple(-math.inf if d == "maximize" else math.inf for d in self.directions)
        logger.info("trial %s: the cost model could not evaluate the candidate (%s); recorded as infeasible",
                    getattr(trial, "number", "?"), error)
        trial.set_user_attr("feasible", False)
        for name in self.constraint_names:
            trial.set_user_attr(f"constraint_{name}", math.inf)
        if self.constraint_names:
            if self._use_set_constraint(trial):
                for name in self.constraint_names:
                    trial.set_constraint(name, math.inf)
            else:
                self._check_4x_sampler(trial)
        return worst

    # ------------------------------------------------------------------ evaluation
    def _record(self, trial: Any, pred: Prediction, spec: InputSpec, space: str | None, config: Any,
                seconds: float) -> tuple[float, ...]:
        checks = self._checks(pred)
        cons = {n: c.value for n, c in checks.items()}
        values = []
        llm = [o for o in self.objectives if o in LLM_OBJECTIVES]
        if llm:
            raise InvalidValueError(f"objectives {llm} are figures of an LLM generation: evaluate the candidate with "
                                    "an LLMWorkload (dippm_nas.llm) instead of an InputSpec")
        for o in self.objectives:
            v = getattr(pred, o)
            if v is None:
                raise DippmNasError(f"objective {o!r} has no prediction on {self.device!r} "
                                    f"(source {getattr(pred, o.split('_')[0] + '_source')!r})")
            values.append(float(v))
        attrs: dict[str, Any] = {
            "predicted_latency_ms": float(pred.latency_ms),
            "predicted_latency_ms_std": pred.latency_ms_std,
            "latency_source": pred.latency_source,
            "predicted_energy_j": pred.energy_j,
            "predicted_energy_j_std": pred.energy_j_std,
            "energy_source": pred.energy_source,
            "predicted_memory_mib": float(pred.memory_mib),
            "predicted_memory_mib_std": pred.memory_mib_std,
            "memory_source": pred.memory_source,
            "predicted_device": pred.device,
            "runtime": self.deployment.runtime,
            "deployment": self.deployment.to_dict(),
            "predicted_host_ms": pred.host_ms,
            "predicted_gpu_ms": pred.gpu_ms,
            "mig_smallest_fit": getattr(pred.mig, "smallest_fit", None),
            "feasible": all(v <= 0 for v in cons.values()),
            "cost_model_s": seconds,
            "input_spec": spec.to_dict(),
        }
        if pred.unknown_ops:
            attrs["unknown_ops"] = dict(pred.unknown_ops)
        if "adaptation_version" in pred.details:
            attrs["adaptation_version"] = int(pred.details["adaptation_version"])
            attrs["adaptation_rows"] = int(pred.details["adaptation_rows"])
        if space is not None:
            attrs["search_space"] = space
            attrs["search_space_config"] = config
        self._register(trial, attrs, checks)
        return tuple(values)

    def _register(self, trial: Any, attrs: dict[str, Any], checks: Mapping[str, Any]) -> None:
        """Write the user attributes, the constraint values and the budgets' record; register the constraints."""
        cons = {n: c.value for n, c in checks.items()}
        for name, v in cons.items():
            attrs[f"constraint_{name}"] = v
        attrs.update(trial_attrs(checks))
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if cons:
            if self._use_set_constraint(trial):
                for name, v in cons.items():
                    trial.set_constraint(name, v)
            else:
                self._check_4x_sampler(trial)

    def _record_generation(self, trial: Any, pred: GenerationPrediction, seconds: float) -> tuple[float, ...]:
        """Record an LLM generation's figures (those of one instance of the budgets' MIG profile when set)."""
        checks = self._checks(pred)
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
        attrs: dict[str, Any] = {}
        for name in GENERATION_FIGURES:
            if profile is not None and name in ("weights_mib", "kv_cache_mib", "kv_cache_mib_per_sequence"):
                f = pred.figure(name)  # the same on a slice
            else:
                f = pred.figure(name, profile)
            attrs[f"predicted_{name}"] = f.value
            attrs[f"predicted_{name}_std"] = f.std
            attrs[f"source_{name}"] = f.source
        on = pred.mig[profile] if profile is not None and pred.mig else None
        attrs.update({
            "predicted_device": pred.device, "mig_profile": profile, "runtime": pred.details.get("runtime"),
            "engine": pred.details.get("engine"), "llm_model": pred.model, "workload": pred.workload.to_dict(),
            "fits": on.fits if on is not None else pred.fits, "fit_reason": on.reason if on is not None else pred.reason,
            "feasible": all(c.value <= 0 for c in checks.values()), "cost_model_s": seconds,
        })
        self._register(trial, attrs, checks)
        return tuple(values)

    def _evaluate_generation(self, trial: Any, model: Any, workload: LLMWorkload) -> tuple[float, ...]:
        t0 = time.perf_counter()
        try:
            pred = predict_generation(model, workload, self.device, deployment=self.deployment, engine=self.engine,
                                      mig=True)
            values = self._record_generation(trial, pred, time.perf_counter() - t0)
        except DippmNasError as e:
            values = self._unevaluated(trial, e)
        with self._lock:
            self._seconds += time.perf_counter() - t0
            self._evaluations += 1
        return values

    @staticmethod
    def _space_of(model: Any, space: str | None, config: Mapping[str, Any] | None) -> tuple[str | None, Any]:
        if space is None and config is None and isinstance(model, functools.partial):
            space, config = space_config_of(model) or (None, None)
            if space is None:
                return None, None
        if space is None and config is None:
            space = getattr(model, "search_space", None)
            config = getattr(model, "search_space_config", None)
            if not isinstance(space, str) or config is None:
                return None, None
        if (space is None) != (config is None):
            raise InvalidValueError(f"give both space= and config= (a registered search space and its config), "
                                    f"got space={space!r}, config={config!r}")
        return space, _jsonable(config, "config")

    def _spec_of(self, model: Any, spec: InputSpec | None) -> InputSpec:
        if isinstance(model, OperatorGraph):
            return model.spec if spec is None else spec
        if not isinstance(spec, InputSpec):
            raise InvalidValueError(f"spec must be a dippm_nas.InputSpec (required with a model), got {spec!r}")
        return spec

    def _source(self, model: Any, spec: InputSpec, space: str | None, config: Any) -> Any:
        """What to predict: a search-space candidate's graph assembled from cached blocks (no export), else
        the model itself."""
        if isinstance(model, OperatorGraph):
            return model
        if space is not None:
            if model is None:
                return assemble(space, config, spec, cache=self.cache)
            own = space_config_of(model)
            if own is not None and own[0] == space:
                return assemble(own[0], own[1], spec, cache=self.cache)
        if model is None:
            raise InvalidValueError("evaluate() needs a model, or space= and config= of a registered search space")
        return model

    def evaluate(self, trial: Any, model: Any = None, spec: InputSpec | None = None, *, space: str | None = None,
                 config: Mapping[str, Any] | None = None) -> float | tuple[float, ...]:
        """Predict one candidate, record it on the trial, register its constraints; return the objectives.

        A candidate of a registered search space -- ``space=`` and ``config=`` with no model, or a model built
        by :func:`search_spaces.build_model` -- is not exported: its graph is assembled from cached blocks
        (:func:`dippm_nas.capture.assemble`; the same graph, in milliseconds once its blocks are cached).

        Args:
            trial: the ``optuna.Trial`` being evaluated (also a ``FixedTrial`` or ``FrozenTrial``).
            model: an ``nn.Module``, ONNX path, model SPEC string, or an :class:`OperatorGraph`; ``None``
                with ``space`` and ``config``.
            spec: the input spec the figures are for (its batch size is the batch of "per batch"), e.g.
                ``search_spaces.get_space(space).input_spec(config, batch_size=8)``.
            space, config: the registered search space and JSON config the model was built from, recorded
                so a validator can rebuild it; read from ``model.search_space`` /
                ``model.search_space_config`` (set by :func:`search_spaces.build_model`) when omitted.

        Returns:
            The predicted figures named by :attr:`objectives`: a float for one objective, a tuple of floats in
            that order for several (``()`` for none), as Optuna objectives return them; when the candidate
            cannot be captured or predicted, NaN (``on_error="fail"``) or ``+inf`` (``"infeasible"``) for
            each, with the reason in the ``cost_model_error`` user attribute.

        Raises:
            DippmNasError: ``on_error="raise"`` and the model could not be captured or a figure asked for
                has no prediction (the text is also the ``cost_model_error`` user attribute); or ``spec``,
                ``space`` or ``config`` are not valid arguments (whatever ``on_error`` says). A config outside
                its space is a ``SearchSpaceError`` naming the key and its allowed values.
        """
        if isinstance(spec, LLMWorkload):
            return self._shape(self._evaluate_generation(trial, model, spec))
        if self.deployment.runtime not in GRAPH_RUNTIMES:
            raise InvalidValueError(f"runtime={self.deployment.runtime!r} runs LLM generations only: evaluate with an "
                                    f"LLMWorkload, or make the cost model with one of {GRAPH_RUNTIMES} for a forward pass")
        t0 = time.perf_counter()
        the_spec = self._spec_of(model, spec)
        space_name, cfg = self._space_of(model, space, config)
        self._refresh_adaptation(trial, space_name)
        try:
            source = self._source(model, the_spec, space_name, cfg)
            pred = predict(source, None if isinstance(source, OperatorGraph) else the_spec, self.device,
                           deployment=self.deployment, cache=self.cache, mig=True, k_sigma=self.k_sigma)
            values = self._record(trial, pred, the_spec, space_name, cfg, time.perf_counter() - t0)
        except SearchSpaceError as e:  # a config outside its space is a bad argument, whatever on_error says
            trial.set_user_attr("cost_model_error", f"{type(e).__name__}: {e}")
            raise
        except DippmNasError as e:
            values = self._unevaluated(trial, e)
        seconds = time.perf_counter() - t0
        with self._lock:
            self._seconds += seconds
            self._evaluations += 1
        return self._shape(values)

    def evaluate_many(
        self,
        trials: Sequence[Any],
        candidates: Sequence[tuple[Any, InputSpec]],
        *,
        workers: int = 1,
        progress: bool = False,
    ) -> list[tuple[float, ...] | DippmNasError]:
        """The ask/tell batch path: convert and predict ``k`` candidates in one go.

        Conversion runs through :func:`dippm_nas.predict_many` (``workers`` processes, shared cache),
        then one batched predictor pass. Each trial is recorded as :meth:`evaluate` would.

        Example::

            trials = [study.ask() for _ in range(k)]
            models = [build(t) for t in trials]
            results = cost.evaluate_many(trials, [(m, spec) for m in models])
            for t, m, r in zip(trials, models, results):
                if isinstance(r, Exception):
                    study.tell(t, state=optuna.trial.TrialState.FAIL)
                else:
                    study.tell(t, (train(m), *r))

        Args:
            trials: the asked trials, one per candidate.
            candidates: ``(model, spec)`` pairs (or ``(graph, None)``), in the order of ``trials``. A model of
                a registered search space -- built by :func:`search_spaces.build_model`, or the lazy
                ``functools.partial(search_spaces.build_model, name, config)`` -- is assembled from cached
                blocks instead of exported (see :func:`dippm_nas.predict_many`).
            workers: conversion processes (``1`` converts here; more pay a process start-up per call).
            progress: show a progress bar while converting.

        Returns:
            One entry per trial: the objectives (a float for one, a tuple for several), or the
            :class:`DippmNasError` that stopped that
            candidate (recorded as ``cost_model_error``; the batch goes on; tell the trial ``FAIL``). With
            ``on_error="infeasible"`` such a candidate's entry is the ``+inf`` tuple instead, its
            constraints registered as violated.
        """
        if len(trials) != len(candidates):
            raise InvalidValueError(f"trials and candidates must pair up, got {len(trials)} trials and "
                                    f"{len(candidates)} candidates")
        t0 = time.perf_counter()
        items: list[Any] = []
        specs: list[InputSpec] = []
        spaces: list[tuple[str | None, Any]] = []
        for model, spec in candidates:
            s = self._spec_of(model, spec)
            specs.append(s)
            spaces.append(self._space_of(model, None, None))
            items.append(model if isinstance(model, OperatorGraph) else (model, s))
        if trials:
            self._refresh_adaptation(trials[0], spaces[0][0])
        preds = predict_many(items, self.device, workers=workers, cache=self.cache, mig=True,
                             deployment=self.deployment, k_sigma=self.k_sigma, progress=progress)
        share = (time.perf_counter() - t0) / max(len(trials), 1)
        out: list[tuple[float, ...] | DippmNasError] = []
        for trial, pred, spec, (space_name, cfg) in zip(trials, preds, specs, spaces):
            try:
                if not isinstance(pred, Prediction):
                    raise pred
                out.append(self._record(trial, pred, spec, space_name, cfg, share))
            except DippmNasError as e:
                if self.on_error == "infeasible":
                    out.append(self._unevaluated(trial, e))
                else:
                    trial.set_user_attr("cost_model_error", f"{type(e).__name__}: {e}")
                    out.append(e)
        with self._lock:
            self._seconds += time.perf_counter() - t0
            self._evaluations += len(trials)
        return [o if isinstance(o, DippmNasError) else self._shape(o) for o in out]

    def _refresh_adaptation(self, trial: Any, space: str | None) -> None:
        """Make the device's predictor answer with the newest stored adaptation of (device, deployment, space) in
        the study's storage (the cache directory's store for other storages); predictors without a network have
        none."""
        predictor = get_predictor(self.device)
        if not callable(getattr(predictor, "refresh_adaptation", None)):
            return
        storage = getattr(getattr(trial, "study", None), "_storage", None)
        url = next((u for u in (getattr(storage, "url", None), getattr(getattr(storage, "_backend", None), "url", None))
                    if isinstance(u, str) and u), None)
        with self._lock:
            predictor.use_adaptation(storage=url, space=space or ANY_SPACE)
            try:
                predictor.refresh_adaptation(deployment=self.deployment)
            except DippmNasError as e:
                _warn_once(f"adapt-refresh:{url}", "the adaptations of %s in %s were not read (%s); predicting "
                           "without them", self.device, url, e)

    def _shape(self, values: float | tuple[float, ...]) -> float | tuple[float, ...]:
        """What an Optuna objective returns: the float of a single objective, else the tuple (values already
        shaped pass through)."""
        if not isinstance(values, tuple):
            return values
        return values[0] if len(self.objectives) == 1 else values

    # ------------------------------------------------------------------ background conversion
    def _worker_cache_url(self) -> str | None:
        if self.cache is True:
            return default_cache().url_with_credentials()
        if self.cache is False or self.cache is None:
            return None
        return self.cache.url_with_credentials()

    def _executors(self) -> tuple[Any, Any]:
        """(conversion processes, finisher thread), started on first use."""
        with self._lock:
            if self._pool is None:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

                self._pool = ProcessPoolExecutor(
                    max_workers=self.background_workers, mp_context=mp.get_context("spawn"),
                    initializer=_init_conversion_worker, initargs=(self._worker_cache_url(),))
                self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dippm-cost-model")
            return self._pool, self._finisher

    def submit(self, trial: Any, model: Any, spec: InputSpec | None = None, *, space: str | None = None,
               config: Mapping[str, Any] | None = None) -> "PendingEvaluation":
        """Start evaluating a candidate; :meth:`PendingEvaluation.result` finishes it (same effect as :meth:`evaluate`).

        With ``background_workers > 0`` the whole evaluation overlaps the objective's own work: the
        conversion (``torch.export`` + Relax, the bulk of the cost) runs in a worker process, then a
        thread of this process predicts and writes the user attributes and constraints to the storage
        (each write is a database round trip). :meth:`PendingEvaluation.result` waits for both::

            pending = cost.submit(trial, model, spec)
            accuracy = train(model)                      # meanwhile: conversion, prediction, records
            return (accuracy, *pending.result())

        Call ``result()`` before the objective returns, also when it fails (``try``/``finally``): Optuna
        refuses attribute writes to a finished trial.
        With ``background_workers=0`` the candidate is evaluated at once, in the caller's thread.

        Args:
            trial, model, spec, space, config: as for :meth:`evaluate`.
        """
        t0 = time.perf_counter()
        if self.background_workers == 0 or isinstance(model, OperatorGraph):
            try:
                values = self.evaluate(trial, model, spec, space=space, config=config)
                return PendingEvaluation(self, None, values, None)
            except DippmNasError as e:
                return PendingEvaluation(self, None, None, e)
        the_spec = self._spec_of(model, spec)
        space_name, cfg = self._space_of(model, space, config)
        payload = ("space", space_name, cfg) if space_name is not None else ("module", model, None)
        pool, finisher = self._executors()
        conversion = pool.submit(_convert_in_worker, payload, the_spec.to_dict(), self.cache not in (False, None))
        done = finisher.submit(self._finish_background, trial, model, the_spec, space_name, cfg, conversion)
        with self._lock:
            self._seconds += time.perf_counter() - t0
        return PendingEvaluation(self, done, None, None, trial)

    def _finish_background(self, trial: Any, model: Any, spec: InputSpec, space: str | None, config: Any,
                           conversion: Any) -> tuple[float, ...]:
        """Finisher thread: wait for the conversion, predict, record on the trial."""
        from concurrent.futures.process import BrokenProcessPool

        t0 = time.perf_counter()
        try:
            text, etype, message, convert_s = conversion.result()
        except BrokenProcessPool as e:
            with self._lock:
                self._pool = None  # the next submit starts new processes
            err = DippmNasError(f"the background conversion process died while converting this model ({e})")
            trial.set_user_attr("cost_model_error", f"{type(err).__name__}: {err}")
            raise err from e
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable model: convert here instead, same result
            _warn_once("background-fallback", "background conversion failed (%s: %s); converting in this process "
                       "instead", type(e).__name__, e)
            return self.evaluate(trial, model, spec, space=space, config=config)
        if text is None:
            cls = getattr(errors, etype or "", None)
            cls = cls if isinstance(cls, type) and issubclass(cls, DippmNasError) else DippmNasError
            err = cls(f"(in the background conversion process) {message}")
            trial.set_user_attr("cost_model_error", f"{type(err).__name__}: {err}")
            raise err
        self._refresh_adaptation(trial, space)
        pred = predict(OperatorGraph.from_json(text), None, self.device, cache=False, mig=True, k_sigma=self.k_sigma,
                       deployment=self.deployment)
        values = self._record(trial, pred, spec, space, config, convert_s + (time.perf_counter() - t0))
        with self._lock:
            self._evaluations += 1
        return values

    def close(self) -> None:
        """Stop the background conversion processes and thread (if any); idempotent."""
        with self._lock:
            pool, finisher = self._pool, getattr(self, "_finisher", None)
            self._pool = self._finisher = None
        if finisher is not None:
            finisher.shutdown(wait=True)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "HardwareCostModel":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ accounting
    @property
    def seconds(self) -> float:
        """Seconds the caller spent waiting on this object: in :meth:`evaluate`, :meth:`evaluate_many`,
        :meth:`submit` and :meth:`PendingEvaluation.result` (background work that overlaps the caller is not counted)."""
        return self._seconds

    @property
    def evaluations(self) -> int:
        """Candidates evaluated by this object."""
        return self._evaluations

    def __repr__(self) -> str:
        return (f"HardwareCostModel(device={self.device!r}, objectives={self.objectives}, budgets={self.budgets}, "
                f"k_sigma={self.budgets.k_sigma:g})")


class PendingEvaluation:
    """A candidate submitted with :meth:`HardwareCostModel.submit`; :meth:`result` finishes its evaluation."""

    def __init__(self, cost: HardwareCostModel, future: Any, values: tuple[float, ...] | None,
                 error: DippmNasError | None, trial: Any = None) -> None:
        self._cost, self._future, self._values, self._error = cost, future, values, error
        self._trial = trial

    def done(self) -> bool:
        """Whether :meth:`result` would return without waiting."""
        return self._future is None or self._future.done()

    def result(self, timeout: float | None = None) -> float | tuple[float, ...]:
        """The objective values (a float for one objective, a tuple for several), once the prediction is
        recorded on the trial and its constraints registered.

        Args:
            timeout: seconds to wait (``None``: as long as it takes).

        Raises:
            DippmNasError: as :meth:`HardwareCostModel.evaluate` (the conversion failed or its process died,
                and ``on_error="raise"``; otherwise the values say so, as there).
            TimeoutError: not finished within ``timeout``.
        """
        if self._future is not None:
            t0 = time.perf_counter()
            try:
                self._values = self._future.result(timeout=timeout)
            except DippmNasError as e:
                self._error = e
            finally:
                with self._cost._lock:
                    self._cost._seconds += time.perf_counter() - t0
            self._future = None
            if self._error is not None and self._cost.on_error != "raise" and self._trial is not None:
                self._values, self._error = self._cost._unevaluated(self._trial, self._error), None
        if self._error is not None:
            raise self._error
        assert self._values is not None
        return self._cost._shape(self._values)


def _init_conversion_worker(cache_url: str | None) -> None:
    """Background conversion process: one torch thread (the objective trains next door), the parent's cache."""
    import torch

    torch.set_num_threads(1)
    if cache_url is not None:
        set_default_cache(ConversionCache(cache_url))


def _convert_in_worker(payload: tuple[str, Any, Any], spec_dict: dict[str, Any],
                       use_cache: bool) -> tuple[str | None, str | None, str | None, float]:
    """Background conversion: ``(graph JSON, None, None, seconds)`` or ``(None, error type, message, seconds)``."""
    t0 = time.perf_counter()
    kind, obj, config = payload
    try:
        if kind == "space":  # assembled from cached blocks (a space that does not opt in is captured whole)
            graph = assemble(obj, config, InputSpec.from_dict(spec_dict), cache=use_cache)
        else:
            graph = capture(obj, InputSpec.from_dict(spec_dict), cache=use_cache)
        return graph.to_json(), None, None, time.perf_counter() - t0
    except DippmNasError as e:
        return None, type(e).__name__, str(e), time.perf_counter() - t0
