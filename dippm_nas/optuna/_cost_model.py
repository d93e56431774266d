"""``HardwareCostModel``: predicted hardware objectives and constraints inside an Optuna objective function
(the package docstring of :mod:`dippm_nas.optuna` describes the objectives, constraints and trial records)."""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import optuna

from dippm_nas._numbers import as_int
from dippm_nas.budgets import Budgets, check_k_sigma
from dippm_nas.deployment import DEPLOYMENT_RUNTIMES, GRAPH_RUNTIMES, Deployment
from dippm_nas.devices import Device, resolve_device
from dippm_nas.errors import DippmNasError, InvalidValueError, SearchSpaceError
from dippm_nas.graph import OperatorGraph
from dippm_nas.llm import LLMWorkload
from dippm_nas.optuna._background import BackgroundWork, PendingEvaluation, PendingValue
from dippm_nas.optuna._bookkeeping import TrialBookkeeping
from dippm_nas.optuna._scheduling import PredictionScheduler, Request, model_source
from dippm_nas.optuna._storage import is_sqlite_file, rdb_storage
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import DEFAULT_DEVICE, get_predictor, resolve_deployment
from dippm_nas.spec import InputSpec
import search_spaces

__all__ = ["HardwareCostModel"]

logger = logging.getLogger(__name__)


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
        overlap: let :meth:`evaluate` predict in a background thread while the objective goes on (trains the
            model), returning :class:`PendingValue` figures that wait for it when read (Optuna reads them when
            the objective returns). Default ``True``; it applies to ``optuna.trial.Trial`` objects when there
            are cost objectives, ``on_error`` is not ``"raise"`` and the study's storage is seen by other
            threads (not an in-memory SQLite URL ``sqlite://``); otherwise :meth:`evaluate` predicts at once.
            ``False``: always at once.

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
        overlap: bool = True,
    ) -> None:
        dev = resolve_device(device)
        self.device: str = dev.id
        #: how the candidates run (every prediction is for it)
        self.deployment: Deployment = Deployment.coerce(deployment, runtime=runtime, host=host,
                                                        runtimes=DEPLOYMENT_RUNTIMES)
        #: the device and the deployment resolved once (:func:`~dippm_nas.predictor.resolve_deployment`; a serving
        #: deployment is predict_generation's, and one the device refuses stays as given, each trial failing per
        #: ``on_error``): every prediction passes them inward as they are
        self.resolved_device, self.resolved_deployment = dev, _resolved(dev, self.deployment)
        self.engine = engine
        if engine is not None and self.deployment.runtime != "serving":
            raise InvalidValueError(f"engine={engine!r} needs runtime='serving', got {self.deployment.runtime!r}")
        budgets = Budgets.coerce(budgets)
        if k_sigma is not None:
            budgets = dataclasses.replace(budgets, k_sigma=check_k_sigma(k_sigma))
        if budgets.confidence is not None:  # the checkpoint's conformal calibration (dippm_nas.conformal)
            budgets = budgets.for_predictor(get_predictor(self.device))
        self.budgets: Budgets = budgets
        #: what is recorded on each trial and returned to Optuna (:mod:`dippm_nas.optuna._bookkeeping`); it checks
        #: the objectives, ``on_error`` and ``constraint_api``
        self._book = TrialBookkeeping(dev.id, self.deployment.to_dict(), budgets, objectives, on_error,
                                      constraint_api)
        self.objectives: tuple[str, ...] = self._book.objectives
        self.constraint_api, self.on_error = constraint_api, on_error
        #: standard deviations of memory the MIG advice of each prediction adds (the memory budget's ``k``)
        self.k_sigma = budgets.k_for("memory_mib")
        self.cache = cache
        self.background_workers = as_int(background_workers, "background_workers", low=0)
        self.overlap = bool(overlap)
        wants_energy = bool({"energy_j", "energy_j_per_token"} & set(self.objectives)) or budgets.energy_j is not None \
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
        #: Names of the constraints, in the order :meth:`constraints_func` returns them.
        self.constraint_names: tuple[str, ...] = self._book.constraint_names
        #: the background thread and conversion processes, stopped by :meth:`close` or when this object is
        #: collected (they hold no reference to it)
        self._work = BackgroundWork(self.background_workers)
        self._finalizer = weakref.finalize(self, self._work.stop_soon)
        #: when and how each candidate is predicted (:mod:`dippm_nas.optuna._scheduling`)
        self._scheduler = PredictionScheduler(self.device, self.deployment, self.engine, self.cache, self.k_sigma,
                                              self.overlap, self._book, self._work, resolved_device=dev,
                                              resolved_deployment=self.resolved_deployment)

    # ------------------------------------------------------------------ study set-up
    @property
    def directions(self) -> list[str]:
        """Optuna directions of :attr:`objectives` (``"maximize"`` for :data:`MAXIMIZED`, else ``"minimize"``)."""
        return self._book.directions

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
                ``load_if_exists``...). A ``storage`` given as the URL of a SQLite file is opened with
                :func:`~dippm_nas.optuna.rdb_storage` (whose transactions keep ``study.optimize(n_jobs=...)`` from
                running a trial queued by ``study.enqueue_trial`` twice).

        Raises:
            InvalidValueError: a direction that is not ``"maximize"``/``"minimize"``, ``directions`` that do not end
                with the cost model's, ``leading`` and ``directions`` that disagree, or ``direction`` given.
        """
        if "direction" in kwargs:
            raise InvalidValueError("create_study() takes directions=[...] (every objective) or "
                                    "leading={name: direction}, not direction=")
        leading = self._book.leading_objectives(leading, directions)
        all_directions = [*leading.values(), *self.directions]
        if not all_directions:
            raise InvalidValueError("a study needs at least one objective: give leading objectives or cost objectives")
        storage = kwargs.get("storage")
        if isinstance(storage, str) and is_sqlite_file(storage):
            kwargs["storage"] = rdb_storage(storage)
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
        return {n: c.value for n, c in self._book.checks(prediction).items()}

    def constraints_func(self, trial: optuna.trial.FrozenTrial) -> list[float]:
        """For Optuna 4.x samplers (``TPESampler(constraints_func=cost.constraints_func)``).

        Reads the ``constraint_*`` user attributes :meth:`evaluate` wrote. A trial that finished
        without them (its objective never called :meth:`evaluate`) is reported infeasible
        (``+inf`` for every constraint), with a warning once: its hardware cost is unknown.
        """
        return self._book.constraints_func(trial)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, trial: Any, model: Any = None, spec: InputSpec | None = None, *, space: str | None = None,
                 config: Mapping[str, Any] | None = None) -> Any:
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

        With ``overlap`` (the default) and an ``optuna.trial.Trial``, the prediction and the records run in a
        background thread while the objective goes on; the returned figures are :class:`PendingValue` objects
        that wait for it when read (``float()``, a comparison, Optuna's ``tell`` of the returned values), so
        return them (or read them) before the objective returns: the trial's records are written by then.
        Candidates of concurrent trials (``study.optimize(n_jobs=...)``) are predicted together in one
        :func:`dippm_nas.predict_many`. A graph assembled from a search space's blocks is assembled here first, so
        a config outside its space still raises at once.

        Returns:
            The predicted figures named by :attr:`objectives`: a float (or a :class:`PendingValue`) for one
            objective, a tuple of them in that order for several (``()`` for none), as Optuna objectives return
            them; when the candidate cannot be captured or predicted, NaN (``on_error="fail"``) or ``+inf``
            (``"infeasible"``) for each, with the reason in the ``cost_model_error`` user attribute.

        Raises:
            DippmNasError: ``on_error="raise"`` and the model could not be captured or a figure asked for
                has no prediction (the text is also the ``cost_model_error`` user attribute); or ``spec``,
                ``space`` or ``config`` are not valid arguments (whatever ``on_error`` says). A config outside
                its space is a ``SearchSpaceError`` naming the key and its allowed values.
        """
        if isinstance(spec, LLMWorkload):
            return self._book.shape(self._scheduler.evaluate_generation(trial, model, spec, self.constraints_func))
        if self.deployment.runtime not in GRAPH_RUNTIMES:
            raise InvalidValueError(f"runtime={self.deployment.runtime!r} runs LLM generations only: evaluate with an "
                                    f"LLMWorkload, or make the cost model with one of {GRAPH_RUNTIMES} for a forward pass")
        t0 = time.perf_counter()
        try:
            source, space_name, cfg = model_source(model, spec, space, config)
            if space_name is not None:
                search_spaces.get_space(space_name).validate(cfg)
        except SearchSpaceError as e:  # a config outside its space is a bad argument, whatever on_error says
            trial.set_user_attr("cost_model_error", f"{type(e).__name__}: {e}")
            raise
        request = Request(trial, source, space_name, cfg, time.perf_counter() - t0)
        if self._scheduler.overlaps(trial):
            future = self._work.predictor(self._predict_in_background).submit(request)
            pending = PendingEvaluation(self._book, future, None, None, trial, self.constraints_func)
            self._book.count_wait(time.perf_counter() - t0)
            return self._book.shape(tuple(PendingValue(pending, i) for i in range(len(self.objectives))))
        try:
            values = self._scheduler.predict_and_record([request], self.constraints_func)[0]
        finally:
            self._book.count_wait(time.perf_counter() - t0, 1)
        return self._book.shape(values)

    def _predict_in_background(self, requests: list[Request]) -> list[Any]:
        """The background thread's batch: every request's objective values (NaN / +inf for one that failed)."""
        out = self._scheduler.predict_and_record(requests, self.constraints_func, isolate=True)
        self._book.count_wait(0.0, len(requests))
        return out

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
        requests = []
        for trial, (model, spec) in zip(trials, candidates):
            source, space_name, cfg = model_source(model, spec, None, None)
            requests.append(Request(trial, source, space_name, cfg, 0.0))
        out = self._scheduler.predict_and_record(requests, self.constraints_func, workers=workers, progress=progress,
                                                 errors="return")
        self._book.count_wait(time.perf_counter() - t0, len(trials))
        return [o if isinstance(o, DippmNasError) else self._book.shape(o) for o in out]

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
        if self.background_workers == 0 or isinstance(model, OperatorGraph):
            try:
                values = self.evaluate(trial, model, spec, space=space, config=config)
            except DippmNasError as e:
                return PendingEvaluation(self._book, None, None, e, None, self.constraints_func)
            values = values if isinstance(values, tuple) else (values,)
            if values and isinstance(values[0], PendingValue):
                return values[0].pending  # evaluate overlaps already
            return PendingEvaluation(self._book, None, values, None, None, self.constraints_func)
        return self._scheduler.convert_in_background(trial, model, spec, space, config, self.constraints_func)

    def close(self) -> None:
        """Finish the candidates being predicted in the background, stop the background thread and the conversion
        processes (if any); idempotent. ``with HardwareCostModel(...) as cost:`` closes it at the end of the block;
        a cost model that is collected without :meth:`close` stops them too (without waiting)."""
        self._work.close()

    def __enter__(self) -> "HardwareCostModel":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ accounting
    @property
    def seconds(self) -> float:
        """Seconds the caller spent waiting on this object: in :meth:`evaluate`, :meth:`evaluate_many`,
        :meth:`submit` and :meth:`PendingEvaluation.result` (background work that overlaps the caller is not counted)."""
        return self._book.seconds

    @property
    def evaluations(self) -> int:
        """Candidates evaluated by this object."""
        return self._book.evaluations

    @property
    def batch_sizes(self) -> list[int]:
        """Sizes of the batches the background thread predicted so far (``[]`` before its first)."""
        return self._work.batch_sizes

    def __repr__(self) -> str:
        return (f"HardwareCostModel(device={self.device!r}, objectives={self.objectives}, budgets={self.budgets}, "
                f"k_sigma={self.budgets.k_sigma:g})")


def _resolved(dev: Device, deployment: Deployment) -> Any:
    """``deployment`` resolved for ``dev`` once (:func:`~dippm_nas.predictor.resolve_deployment`), or as it is where
    it is a serving deployment or one the device refuses (each prediction then raises, failing its trial)."""
    if deployment.runtime not in GRAPH_RUNTIMES:
        return deployment
    try:
        return resolve_deployment(dev, deployment)
    except DippmNasError:
        return deployment
