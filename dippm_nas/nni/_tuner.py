"""A multi-objective, hardware-aware NNI tuner: Optuna's samplers with ask/tell and the cost model inside.

NNI 3.0's tuners optimise one number, ``metric['default']``. :class:`HardwareAwareTuner` optimises
several at once (accuracy from the trial, latency / energy / memory predicted by dippm-nas) with Optuna's
multi-objective samplers, and never spends a trial on a configuration the cost model predicts to break
a bound.

How a trial's parameters are made (``generate_parameters``, called by NNI's dispatcher once per trial):

1. ``study.ask()`` and ``trial.suggest_*`` sample the NNI search space (every NNI type, nested choices
   included: :mod:`dippm_nas.nni._space`).
2. The model keys of the sample overlay ``base_config`` and describe the model: with ``builder`` (a
   registered search space of :mod:`search_spaces`) the keys that are config keys of it, its graph
   assembled from cached blocks (:func:`dippm_nas.capture.assemble`); with ``model_factory``
   (``package.module:callable``) the keys named by ``model_keys`` (default: all), the factory called with
   them and the ``nn.Module`` it returns captured. The other keys are hyper-parameters passed to the trial
   untouched. The model is predicted on ``device`` at ``batch_size`` in ``dtype`` once per distinct
   config (predictions are cached for the tuner's life).
3. The chance constraints of the budgets (:class:`~dippm_nas.budgets.Budgets`, the convention of
   :class:`dippm_nas.optuna.HardwareCostModel`: ``mean + k_sigma * std - budget`` in ms, J or MiB, ``<= 0``
   feasible) are set on the Optuna trial (``set_constraint`` on Optuna >= 5, the sampler's
   ``constraints_func`` on Optuna 4), so the constrained samplers learn where the feasible region is; the
   trial also records the :class:`~dippm_nas.trial.TrialRecord` that :class:`dippm_nas.optuna.HardwareCostModel`
   writes: ``predicted_<figure>``, ``predicted_<figure>_std``, ``<figure>_source``, ``predicted_device``,
   ``deployment`` (:meth:`~dippm_nas.Deployment.to_dict`), ``constraint_<figure>``, ``margin_<figure>``,
   ``k_sigma_<figure>``, ``budget_<figure>``, ``std_missing_<figure>``, ``feasible``, ``input_spec``,
   ``cost_model_s`` and, with ``builder``, ``search_space`` and ``search_space_config``, so
   :class:`~dippm_nas.validation.ParetoValidator` validates the tuner's study as it does a ``HardwareCostModel``
   one. The ``dippm_predicted`` dict (the figures sent to the trial) is written too, for one release.
4. A configuration over a bound is **skipped**: the first time, it is told to Optuna as complete and
   infeasible, with its predicted objectives and the worst value (``-inf`` for maximise, ``+inf`` for
   minimise) for the objectives only a trial can measure (it was never trained); a later sample of the same
   config is told as failed (no second copy in the sampler's population); the tuner then asks again. A
   parameter set already sent to NNI is never sent again (a repeat is told as failed and skipped); a config
   the model source rejects is skipped the same way. After ``max_skips`` skips in a row the tuner raises
   ``NoMoreTrialError`` (NNI then stops asking).
5. The parameters sent to the trial are the sampled keys plus ``"dippm"``: how to build the model
   (``{"search_space", "config"}`` or ``{"model_factory", "model_params", "input"}``), ``"batch_size"``,
   ``"dtype"``, ``"device"``, ``"runtime"``, ``"deployment"`` (:meth:`Deployment.to_dict`), ``"budgets"``
   (:meth:`Budgets.to_dict`) and ``"predicted"``; :func:`dippm_nas.nni.model_from_parameters` builds the same
   model in the trial and :func:`dippm_nas.nni.report` scores it with the same budgets, device and deployment.

When a trial reports (``receive_trial_result``), its objectives are read from the final-result dict (what
:func:`dippm_nas.nni.report` sends; a plain number counts for the single trial-side objective) and the
predicted ones from step 2, and Optuna is told.

The study lives in ``storage`` (an Optuna storage URL; by default, when NNI's dispatcher runs the tuner, a
SQLite file in the experiment's checkpoint directory), so ``nnictl resume`` continues it: the restarted
tuner loads its trials (never re-sending a parameter set, never re-telling an infeasible config) and NNI's
``import_data`` (finished trials, and the results of trials that were running) tells Optuna what it does
not know yet. :meth:`HardwareAwareTuner.import_data` also adds results from elsewhere (``nnictl experiment
import``) as completed Optuna trials. The counts (proposed, skipped for each reason, predictions, results,
failures, imported, loaded) are logged, available as :attr:`HardwareAwareTuner.stats`, and written as JSON
to ``stats_file`` (default: ``dippm_tuner_stats.json`` in the experiment's log directory when NNI runs the
tuner).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dippm_nas._files import write_output
from dippm_nas._json import loads_json
from dippm_nas._numbers import as_int
from dippm_nas._optional import require
from dippm_nas.budgets import Budgets
from dippm_nas.deployment import Deployment
from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError, InvalidTypeError, InvalidValueError, SearchSpaceError
from dippm_nas.nni._candidates import DEFAULT_GPU_DTYPE, CandidateEvaluator
from dippm_nas.nni._scalarize import budgets_from_limits
from dippm_nas.nni._space import (
    PARAMETERS_KEY, Dimension, canonical_json, parse_search_space,
)
from dippm_nas.nni._tuner_study import (PREDICTED_OBJECTIVES, STUDY_FILE_NAME, completed_trial, encode_parameters,
                                        load_trials, objective_values, open_study, record_cost, tell_result,
                                        under_dispatcher)
from dippm_nas.optuna import optuna_has_set_constraint
from dippm_nas.predictor import DEFAULT_DEVICE
from dippm_nas.trial import TrialRecord

_nni = require("nni", "nni", "dippm_nas.nni.HardwareAwareTuner")
import optuna  # noqa: E402
from nni.tuner import Tuner  # noqa: E402

__all__ = ["HardwareAwareTuner", "TunerStats", "PREDICTED_OBJECTIVES", "SAMPLERS", "STATS_FILE_NAME",
           "STUDY_FILE_NAME", "DEFAULT_GPU_DTYPE"]

logger = logging.getLogger(__name__)

#: Optuna samplers the tuner wraps, by name.
SAMPLERS: tuple[str, ...] = ("nsga2", "nsga3", "tpe", "random")
#: Name of the counts file written to the experiment's log directory.
STATS_FILE_NAME = "dippm_tuner_stats.json"
_DIRECTIONS = ("maximize", "minimize")


@dataclass
class TunerStats:
    """What the tuner did so far (for a resumed study: what its trials record, plus this process's work).

    Attributes:
        proposed: parameter sets handed to NNI (NNI runs one trial for each, up to its trial budget; it
            may ask for a set more than it then runs).
        skipped_infeasible: sampled configs predicted to break a bound, not sent.
        skipped_duplicate: sampled parameter sets identical to one already sent, not sent again.
        skipped_invalid: sampled configs the model source rejected or the cost model could not predict,
            not sent.
        predictions: distinct model configs predicted by this process (each once).
        results: trial results told to Optuna.
        failed: trials that ended without a usable result.
        imported: results added by :meth:`HardwareAwareTuner.import_data` as new Optuna trials.
        import_rejected: import records that could not be added (outside the search space, no usable value,
            a model the cost model cannot evaluate); each is logged with its reason.
        loaded: trials found in the storage when the tuner started (a resumed study).
        infeasible_configs: canonical JSON of each distinct config skipped as infeasible.
    """

    proposed: int = 0
    skipped_infeasible: int = 0
    skipped_duplicate: int = 0
    skipped_invalid: int = 0
    predictions: int = 0
    results: int = 0
    failed: int = 0
    imported: int = 0
    import_rejected: int = 0
    loaded: int = 0
    infeasible_configs: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """All skips together."""
        return self.skipped_infeasible + self.skipped_duplicate + self.skipped_invalid

    def counts(self) -> dict[str, int]:
        """The counters (``skipped`` included, the infeasible configs left out)."""
        d = asdict(self)
        d.pop("infeasible_configs")
        d["skipped"] = self.skipped
        return d

    def write(self, path: Path | None, warned: set[str]) -> None:
        """Write the stats to ``path`` as JSON (nothing when ``None``); a failed write is logged once (``warned``
        holds ``"stats"`` from then on)."""
        if path is None:
            return
        d: dict[str, Any] = dict(self.counts())
        d["infeasible_configs"] = [json.loads(c) for c in self.infeasible_configs]
        try:
            write_output(path, json.dumps(d, indent=1), "tuner stats file", error=InvalidValueError)
        except InvalidValueError as e:
            if "stats" not in warned:
                warned.add("stats")
                logger.warning("could not write tuner stats to %s: %s", path, e)


def _make_sampler(name: str, seed: int | None, population_size: int | None, names: Sequence[str],
                  set_constraint: bool) -> Any:
    """The Optuna sampler ``name``; with budgets (``names``) and an Optuna without ``trial.set_constraint``
    (Optuna 4), it reads each trial's constraints through ``constraints_func``."""
    def constraints_from_attrs(ft: optuna.trial.FrozenTrial) -> list[float]:
        v = ft.user_attrs.get("dippm_constraints")
        return [float(x) for x in v] if v is not None else [math.inf] * len(names)

    constraints_func = constraints_from_attrs if names and not set_constraint else None
    if name not in SAMPLERS:
        raise InvalidValueError(f"sampler must be one of {SAMPLERS}, got {name!r}")
    if population_size is not None and name not in ("nsga2", "nsga3"):
        raise InvalidValueError(f"population_size applies to the nsga2/nsga3 samplers only, got sampler={name!r}")
    kw = {"constraints_func": constraints_func} if constraints_func is not None else {}
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=population_size or 50, seed=seed, **kw)
    if name == "nsga3":
        return optuna.samplers.NSGAIIISampler(population_size=population_size or 50, seed=seed, **kw)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **kw)
    return optuna.samplers.RandomSampler(seed=seed)


class HardwareAwareTuner(Tuner):
    """Multi-objective NNI tuner that predicts each candidate's cost and skips infeasible ones.

    Use it through ``CustomAlgorithmConfig(class_name="dippm_nas.nni.HardwareAwareTuner",
    class_args={...})`` (YAML: ``tuner: {className: dippm_nas.nni.HardwareAwareTuner, classArgs: ...}``);
    the arguments below are the class args. See the module docstring for the protocol.

    Args:
        builder: name of a registered search space of :mod:`search_spaces` (``search_spaces.list_spaces()``);
            search-space keys that are config keys of it build the model. Give this or ``model_factory``.
        model_factory: ``"package.module:callable"``: a function (or class) taking the dict of model keys
            (``base_config`` overlaid with the sampled ``model_keys``) and returning an ``nn.Module``; the
            module is imported from the tuner's ``codeDirectory`` (or the working directory) and again in
            the trial. Needs ``input_shape`` or ``inputs``.
        model_keys: with ``model_factory``: the search-space keys that change the model (default: all of
            them); the others go to the trial only and do not trigger a new prediction.
        input_shape: with ``model_factory``: per-sample input shape without the batch dimension, e.g.
            ``[3, 32, 32]``.
        inputs: with ``model_factory``: named inputs instead, ``{name: [shape, dtype]}`` as in
            :class:`~dippm_nas.InputSpec`.
        objectives: objective names; ``"latency_ms"``, ``"energy_j"``, ``"memory_mib"`` are predicted, any
            other (e.g. ``"accuracy"``) is read from the trial's final result dict.
        directions: ``"maximize"`` or ``"minimize"`` per objective.
        base_config: model keys fixed for every model (with ``builder``, keys neither here nor in the search
            space take the builder's defaults; with ``model_factory``, they are passed to the factory too).
        batch_size: batch size the cost is predicted at (``>= 1``).
        dtype: compute dtype the cost is predicted in. Default ``None``: ``"float16"`` on a GPU device (half
            precision, the dtype most of the A100 checkpoint's rows have; a dtype the checkpoint never saw
            falls back to the analytic prior, with a warning), ``"float32"`` on a CPU device. The dtype used
            is logged.
        device: catalogue device id; default ``"a100-sxm4-40gb"``.
        budgets: the chance constraints, a :class:`~dippm_nas.budgets.Budgets` or (class args) a mapping of
            its keys, e.g. ``{"latency_ms": 1.0, "k_sigma": 1.0}``; a config whose ``mean + k_sigma * std``
            breaks one is skipped. They are passed to the trial, so :func:`~dippm_nas.nni.report` uses them.
        k_sigma: when given, replaces ``budgets.k_sigma`` (default of the budgets: 1.0).
        max_latency_ms, max_energy_j, max_memory_mib, mig_profile: deprecated (``DeprecationWarning``):
            the same as ``budgets={"latency_ms": ..., "energy_j": ..., "memory_mib": ..., "mig_profile": ...}``.
        sampler: one of :data:`SAMPLERS` (``"nsga2"`` default).
        seed: sampler seed (``None``: random).
        population_size: generation size of ``nsga2`` / ``nsga3`` (default 50).
        max_skips: skips in a row after which the tuner gives up with ``NoMoreTrialError``.
        storage: Optuna storage URL of the study, e.g. ``"sqlite:///nni_study.db"`` or a PostgreSQL URL
            (SQLite gets :func:`dippm_nas.optuna.rdb_storage`'s settings). An existing study of that name
            is loaded and continued. Default ``None``: when NNI's dispatcher runs the tuner,
            ``sqlite:///<experiment dir>/checkpoint/dippm_tuner_study.db`` (so ``nnictl resume`` continues
            it); otherwise in memory.
        study_name: name of the study in ``storage``. Default ``None``: ``"dippm-nni-<experiment id>"``
            when NNI runs the tuner, else ``"dippm-nni"``.
        stats_file: where to write :attr:`stats` as JSON after every change (default: ``<NNI log
            dir>/dippm_tuner_stats.json`` when NNI's dispatcher runs the tuner, else nowhere).
        cache: conversion cache, as in :func:`dippm_nas.predict`.
        deployment: how the models will run on the GPU (as in :func:`dippm_nas.predict`): a
            :class:`~dippm_nas.Deployment`, or (class args) a mapping of its fields or the path of a JSON/TOML
            deployment file (``dippm-nas deployment --out FILE``; an absolute path, the tuner's working directory
            is NNI's); ``None``: nothing described but ``runtime``. Sent to the trial (``params["dippm"]``) and
            recorded on every Optuna trial (the ``deployment`` user attribute).
        runtime: shorthand for ``Deployment(runtime=...)``: ``"eager"`` (default), ``"cuda-graphs"`` or
            ``"compiled"``.

    Raises:
        DeploymentError: a bad deployment (the field, the value and the choices are named), or a ``runtime``
            that conflicts with it.
        ExecutionRuntimeError: an unknown runtime (the choices are listed).
        SearchSpaceError: unknown builder (the registered ones are listed) or a bad ``base_config``.
        ModelSpecError: a ``model_factory`` that is not ``package.module:callable`` or cannot be loaded (the
            rule, the value and the module's callables are stated).
        InputSpecError: a dtype or input shape the spec rejects.
        InvalidValueError: both or neither of ``builder`` and ``model_factory``; mismatched or unknown
            objectives / directions, bad sampler, bounds or batch size. A stored study whose objectives or
            directions differ is refused when the study opens: at the first NNI call
            (``update_search_space``) or the first access of :attr:`study`.
        InvalidTypeError: a ``storage``, ``inputs`` or ``model_keys`` of the wrong type.
    """

    def __init__(self, builder: str | None = None, objectives: Sequence[str] = ("accuracy", "latency_ms"),
                 directions: Sequence[str] = ("maximize", "minimize"), base_config: Mapping[str, Any] | None = None,
                 batch_size: int = 1, dtype: str | None = None, device: str = DEFAULT_DEVICE,
                 budgets: Budgets | Mapping[str, Any] | None = None, k_sigma: float | None = None,
                 sampler: str = "nsga2", seed: int | None = None, population_size: int | None = None,
                 max_skips: int = 100, stats_file: str | None = None, cache: bool = True,
                 max_latency_ms: float | None = None, max_energy_j: float | None = None,
                 max_memory_mib: float | None = None, mig_profile: str | None = None,
                 runtime: str | None = None, model_factory: str | None = None,
                 model_keys: Sequence[str] | None = None, input_shape: Sequence[int] | None = None,
                 inputs: Mapping[str, Any] | None = None, storage: str | None = None,
                 study_name: str | None = None, deployment: Any = None) -> None:
        super().__init__()
        objectives, directions = list(objectives), list(directions)
        if not objectives or len(objectives) != len(directions):
            raise InvalidValueError(f"objectives and directions must be non-empty and of equal length, got "
                                    f"objectives={objectives}, directions={directions}")
        if len(set(objectives)) != len(objectives) or not all(isinstance(o, str) and o for o in objectives):
            raise InvalidValueError(f"objectives must be distinct non-empty names, got {objectives}")
        bad = [d for d in directions if d not in _DIRECTIONS]
        if bad:
            raise InvalidValueError(f"each direction must be one of {_DIRECTIONS}, got {bad}")
        if "default" in objectives:
            logger.warning("objective 'default' is the scalarised score, which already folds in the cost; "
                           "a multi-objective search usually wants 'accuracy' and the cost figures instead")
        self.objectives, self.directions = objectives, directions
        batch_size = as_int(batch_size, "batch_size", low=1)
        max_skips = as_int(max_skips, "max_skips", low=0)
        self.device = (dev := resolve_device(device)).id  # looked up once: the candidates' predictions take it as is
        if dtype is None:
            dtype = DEFAULT_GPU_DTYPE if dev.kind == "gpu" else "float32"
            how = "default for a GPU device: the dtype the A100 checkpoint was trained on" \
                if dtype == DEFAULT_GPU_DTYPE else "default for a CPU device"
        else:
            how = "given"
        self.budgets: Budgets = budgets_from_limits(
            budgets, max_latency_ms=max_latency_ms, max_energy_j=max_energy_j, max_memory_mib=max_memory_mib,
            mig_profile=mig_profile, k_sigma=k_sigma, where="HardwareAwareTuner")
        self.batch_size, self.dtype, self.max_skips, self.cache = batch_size, dtype, max_skips, cache
        #: standard deviations of memory the MIG advice of each prediction adds (the memory budget's ``k``)
        self.k_sigma = self.budgets.k_for("memory_mib")
        #: how the models run (every prediction is for it)
        self.deployment: Deployment = Deployment.coerce(deployment, runtime=runtime)
        self.base_config = dict(base_config or {})
        self.stats = TunerStats()
        self._warned: set[str] = set()
        #: builds and predicts the candidates (each distinct config once)
        self.candidates = CandidateEvaluator(
            builder, model_factory, model_keys, input_shape, inputs, base_config=self.base_config,
            batch_size=batch_size, dtype=dtype, device=dev, cache=cache, budgets=self.budgets,
            k_sigma=self.k_sigma, deployment=self.deployment, objectives=objectives, stats=self.stats,
            warned=self._warned)
        c = self.candidates
        self.builder, self.model_factory, self.space = c.builder, c.model_factory, c.space
        self.input_spec, self.model_source, self.model_keys_arg = c.input_spec, c.model_source, c.model_keys_arg
        self.budgets.memory_limit(dev)  # a MIG profile the device lacks fails now
        self.sampler_name = sampler
        self._set_constraint = optuna_has_set_constraint()
        self._sampler = _make_sampler(sampler, seed, population_size, self.budgets.names, self._set_constraint)
        if storage is not None and not (isinstance(storage, str) and storage) and not hasattr(storage,
                                                                                              "get_all_studies"):
            raise InvalidTypeError(f"storage must be an Optuna storage URL like 'sqlite:///study.db', a storage object "
                                   f"or None, got {storage!r}")
        self._storage_arg, self._study_name_arg = storage, study_name
        self._study: Any = None  # opened on first use: NNI gives the dispatcher 10 s to connect after it starts
        self.storage_url: str | None = None
        if stats_file is None:
            log_dir = os.environ.get("NNI_LOG_DIRECTORY") if under_dispatcher() else None
            stats_file = str(Path(log_dir) / STATS_FILE_NAME) if log_dir else None
        self.stats_file = Path(stats_file) if stats_file else None
        self._dims: dict[str, Dimension] | None = None
        self._model_keys: list[str] = []
        self._proposed: dict[str, int] = {}              # canonical parameters -> Optuna trial number
        self._resumed: dict[str, int] = {}               # ... of trials sent by an earlier run, still running
        self._infeasible_told: set[str] = set()          # canonical configs told to Optuna as infeasible
        self._running: dict[int, tuple[Any, dict[str, Any]]] = {}  # parameter id -> (optuna trial, predicted)
        self._failed_ids: set[int] = set()
        logger.info("HardwareAwareTuner: model=%s objectives=%s directions=%s device=%s batch_size=%d dtype=%s "
                    "(%s) budgets=%s sampler=%s deployment=%s", self.model_source, objectives, directions, self.device,
                    batch_size, dtype, how, self.budgets.to_dict(), sampler, self.candidates.deployment_label)

    @property
    def study(self) -> Any:
        """The Optuna study, opened (or loaded from ``storage`` and its trials reloaded) on first use.

        Raises:
            DippmNasError: a stored study with other objectives or directions.
        """
        if self._study is None:
            setup = {"model": self.model_source, "base_config": self.base_config, "batch_size": self.batch_size,
                     "dtype": self.dtype, "device": self.device, "runtime": self.deployment.runtime,
                     "deployment": self.deployment.to_dict(),
                     "input": self.input_spec.to_dict() if self.input_spec is not None else None,
                     "budgets": self.budgets.to_dict()}
            self._study, self.storage_url = open_study(self._storage_arg, self._study_name_arg, self._sampler,
                                                       self.objectives, self.directions, setup)
            load_trials(self._study, self.stats, self._proposed, self._resumed, self._infeasible_told)
            logger.info("study %r in %s: %d trials loaded", self._study.study_name, self.storage_url or "memory",
                        self.stats.loaded)
        return self._study



    # ------------------------------------------------------------------ NNI Tuner interface
    def update_search_space(self, search_space: dict[str, Any]) -> None:
        """Called by NNI with the experiment's search space (at start and on every update); opens the study."""
        dims = parse_search_space(search_space)
        self.study  # noqa: B018 - open (or reload) the study now, before NNI asks for parameters
        if self.space is not None:
            model_keys = [k for k in dims if k in self.space.params]
            if not model_keys:
                raise SearchSpaceError(
                    f"no key of the NNI search space {sorted(dims)} is a config key of search space "
                    f"{self.builder!r} ({sorted(self.space.params)}), so every trial would build the same model"
                )
        elif self.model_keys_arg is not None:
            missing = [k for k in self.model_keys_arg if k not in dims]
            if missing:
                raise SearchSpaceError(f"model_keys {missing} are not keys of the NNI search space; its keys: "
                                       f"{sorted(dims)}")
            model_keys = list(self.model_keys_arg)
        else:
            model_keys = list(dims)
        self._dims, self._model_keys = dims, model_keys
        logger.info("search space: keys %s build the model (%s); keys %s go to the trial only",
                    model_keys, self.model_source, [k for k in dims if k not in model_keys])

    def generate_parameters(self, parameter_id: int, **kwargs: Any) -> dict[str, Any]:
        """Called by NNI once per new trial: the next feasible, never-sent parameter set.

        Raises:
            nni.NoMoreTrialError: ``max_skips`` skips in a row (the feasible space looks exhausted).
        """
        dims = self._require_space("generate_parameters")
        for _ in range(self.max_skips + 1):
            trial = self.study.ask()
            flat = {k: d.sample(trial) for k, d in dims.items()}
            key = canonical_json(flat)
            if key in self._proposed:
                trial.set_user_attr("dippm_status", "skipped_duplicate")
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.stats.skipped_duplicate += 1
                logger.debug("skipped a repeat of the parameter set of trial %d: %s", self._proposed[key], key)
                continue
            ev = self.candidates.evaluate(self._model_part(flat))
            ckey = canonical_json(ev.config)
            if ev.error is None and not ev.feasible and ckey in self._infeasible_told:
                # told once as infeasible already: a second copy would only crowd the sampler's population
                trial.set_user_attr("dippm_status", "skipped_infeasible_repeat")
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.stats.skipped_infeasible += 1
                logger.debug("skipped a repeat of infeasible config %s", ckey)
                continue
            if ev.error is not None:
                trial.set_user_attr("dippm_status", "skipped_invalid")
                trial.set_user_attr("dippm_error", ev.error)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.stats.skipped_invalid += 1
                logger.info("skipped %s: %s", key, ev.error)
                continue
            record_cost(trial, self.candidates.cost_attrs(ev), ev.violations, self._set_constraint)
            if not ev.feasible:
                trial.set_user_attr("dippm_status", "skipped_infeasible")
                trial.set_user_attr("dippm_config", ckey)
                self.study.tell(trial, objective_values(self.objectives, self.directions, ev.predicted(), None,
                                                        self._warned))
                self._infeasible_told.add(ckey)
                self.stats.infeasible_configs.append(ckey)
                self.stats.skipped_infeasible += 1
                over = {k: round(v, 4) for k, v in ev.violations.items() if v > 0}
                logger.info("skipped infeasible config %s (mean + k_sigma * std over budget by %s); skipped so "
                            "far: %d", ckey, over, self.stats.skipped_infeasible)
                self.stats.write(self.stats_file, self._warned)
                continue
            predicted = ev.predicted()
            trial.set_user_attr("dippm_status", "sent")
            trial.set_user_attr("dippm_parameters", key)
            trial.set_user_attr("dippm_predicted", predicted)
            trial.set_user_attr("nni_parameter_id", parameter_id)
            self._proposed[key] = trial.number
            self._running[parameter_id] = (trial, predicted)
            self.stats.proposed += 1
            self.stats.write(self.stats_file, self._warned)
            params = dict(flat)
            params[PARAMETERS_KEY] = {**self.candidates.describe(ev), "batch_size": self.batch_size,
                                      "dtype": self.dtype, "device": self.device, "runtime": self.deployment.runtime,
                                      "deployment": self.deployment.to_dict(), "budgets": self.budgets.to_dict(),
                                      "predicted": predicted}
            logger.info("parameter set %d: %s (predicted %.4g ms, %.4g MiB); stats %s", parameter_id, key,
                        predicted["latency_ms"], predicted["memory_mib"], self.stats.counts())
            return params
        self.stats.write(self.stats_file, self._warned)
        logger.warning("giving up after %d skips in a row (the feasible, unexplored part of the space looks "
                       "exhausted); stats %s", self.max_skips + 1, self.stats.counts())
        raise _nni.NoMoreTrialError(
            f"dippm_nas HardwareAwareTuner: {self.max_skips + 1} sampled configurations in a row were infeasible, "
            f"repeats or invalid ({self.stats.counts()})"
        )

    def receive_trial_result(self, parameter_id: int, parameters: Any, value: Any, **kwargs: Any) -> None:
        """Called by NNI with a trial's final result: tell Optuna the trial's objective values."""
        entry = self._running.pop(parameter_id, None)
        if entry is None:
            why = ("a customized trial" if kwargs.get("customized") else
                   "an earlier failed trial" if parameter_id in self._failed_ids else "an unknown parameter id")
            logger.warning("ignored the result of parameter set %s (%s)", parameter_id, why)
            return
        trial, predicted = entry
        if self._tell_result(trial, predicted, value, f"parameter set {parameter_id}") is False:
            self._failed_ids.add(parameter_id)
        self.stats.write(self.stats_file, self._warned)

    def trial_end(self, parameter_id: int, success: bool, **kwargs: Any) -> None:
        """Called by NNI when a trial ends; a failed trial without a result is told to Optuna as failed."""
        if success or parameter_id not in self._running:
            return  # a successful trial's result may still be on its way
        trial, _ = self._running.pop(parameter_id)
        trial.set_user_attr("dippm_status", "failed")
        trial.set_user_attr("dippm_error", "the trial ended without success")
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.stats.failed += 1
        self._failed_ids.add(parameter_id)
        logger.info("trial of parameter set %d failed without a result", parameter_id)
        self.stats.write(self.stats_file, self._warned)

    def import_data(self, data: list[Any]) -> None:
        """Called by NNI with finished trials' results: ``[{"parameter": {...}, "value": ...}, ...]``.

        NNI sends them on ``nnictl resume`` (every finished trial of the experiment, then the result of each
        trial that was running when it stopped) and on ``nnictl experiment import``. For each record:

        - a parameter set this study sent and still waits for (a trial that was running): its Optuna trial
          is told the result, as :meth:`receive_trial_result` would;
        - a parameter set the study already has: nothing to do;
        - any other: a new completed Optuna trial with the record's trial-side objectives and the predicted
          ones (its model is predicted like a sampled one, and its constraints set), and its parameter set is
          never proposed again.

        A record outside the search space, without the trial-side objectives, or whose model cannot be
        predicted is rejected with a warning that says why (counted as ``import_rejected``).

        Raises:
            DippmNasError: called before :meth:`update_search_space`, or ``data`` is not a list.
        """
        self._require_space("import_data")
        if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
            raise InvalidTypeError(f"import_data needs a list of {{'parameter': ..., 'value': ...}}, got "
                                   f"{type(data).__name__}")
        outcome = {"told": 0, "known": 0, "added": 0, "rejected": 0}
        for i, rec in enumerate(data):
            try:
                outcome[self._import_one(rec)] += 1
            except DippmNasError as e:
                outcome["rejected"] += 1
                self.stats.import_rejected += 1
                logger.warning("import_data: record %d rejected: %s", i, e)
        logger.info("import_data: %d records: %d results of running trials told, %d already in the study, %d "
                    "added, %d rejected", len(data), outcome["told"], outcome["known"], outcome["added"],
                    outcome["rejected"])
        self.stats.write(self.stats_file, self._warned)

    # ------------------------------------------------------------------ internals
    def _require_space(self, what: str) -> dict[str, Dimension]:
        if self._dims is None:
            raise DippmNasError(f"{what} was called before update_search_space")
        return self._dims

    def _import_one(self, rec: Any) -> str:
        dims = self._require_space("import_data")
        if not isinstance(rec, Mapping) or "parameter" not in rec or "value" not in rec:
            raise InvalidValueError(f"a record must be {{'parameter': {{...}}, 'value': ...}}, got {rec!r}")
        params, value = rec["parameter"], rec["value"]
        if isinstance(value, str):
            try:
                value = loads_json(value, "the record's value")
            except InvalidValueError as e:
                raise InvalidValueError(f"value {value[:80]!r} is not a number, a dict or their JSON ({e})") from e
        if not isinstance(params, Mapping):
            raise InvalidTypeError(f"parameter must be a dict of the search space's keys, got {params!r}")
        missing = [k for k in dims if k not in params]
        if missing:
            raise InvalidValueError(f"parameter {canonical_json(params)} lacks search-space keys {missing}")
        flat = {k: params[k] for k in dims}
        key = canonical_json(flat)
        if key in self._resumed:
            number = self._resumed.pop(key)
            ft = self.study.get_trials(deepcopy=False)[number]
            trial = optuna.trial.Trial(self.study, ft._trial_id)
            rec = TrialRecord.from_attrs(ft.user_attrs)
            predicted = {f: getattr(rec, f) for f in PREDICTED_OBJECTIVES}
            told = self._tell_result(trial, predicted, value, f"trial {number}")
            if told is False:
                raise DippmNasError(f"the result of trial {number} ({key}) was not usable; told Optuna it failed")
            return "told"
        if key in self._proposed:
            return "known"
        encoded = encode_parameters(dims, flat, key)  # outside the space: an error before any prediction
        ev = self.candidates.evaluate(self._model_part(flat))
        if ev.error is not None:
            raise DippmNasError(f"the cost of parameter {key} cannot be predicted: {ev.error}")
        predicted = ev.predicted()
        values = objective_values(self.objectives, self.directions, predicted, value, self._warned)
        attrs = {"dippm_status": "imported", "dippm_parameters": key, "dippm_predicted": predicted,
                 **self.candidates.cost_attrs(ev)}
        ft = completed_trial(encoded, values, attrs, ev.violations)
        self.study.add_trial(ft)
        self._proposed[key] = -1
        self.stats.imported += 1
        return "added"

    def _tell_result(self, trial: Any, predicted: Mapping[str, Any], value: Any, what: str) -> bool:
        """Tell Optuna a trial's result; ``False`` when it was unusable (the trial is then told failed)."""
        return tell_result(self.study, self.stats, trial, lambda: objective_values(
            self.objectives, self.directions, predicted, value, self._warned), what)

    def _model_part(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        return {k: flat[k] for k in self._model_keys}
