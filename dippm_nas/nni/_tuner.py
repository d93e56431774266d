"""A multi-objective, hardware-aware NNI tuner: Optuna's samplers with ask/tell and the cost model inside.

NNI 3.0's tuners optimise one number, ``metric['default']``. :class:`HardwareAwareTuner` optimises
several at once (accuracy from the trial, latency / energy / memory predicted by dippm-nas) with Optuna's
multi-objective samplers, and never spends a trial on a configuration the cost model predicts to break
a bound.

How a trial's parameters are made (``generate_parameters``, called by NNI's dispatcher once per trial):

1. ``study.ask()`` samples the NNI search space (converted by :mod:`dippm_nas.nni._space`).
2. The keys that belong to the config of the registered search space ``builder`` (see
   :mod:`search_spaces`) overlay ``base_config``; the other keys are hyper-parameters passed to the
   trial untouched. The config's graph is assembled from cached blocks (:func:`dippm_nas.capture.assemble`;
   a space that does not opt in is built and captured whole) and predicted on ``device`` at ``batch_size``
   (once per distinct config: predictions are cached for the tuner's life).
3. The chance constraints of the budgets (:class:`~dippm_nas.budgets.Budgets`:
   ``mean + k_sigma * std - budget`` in ms, J or MiB, the convention of
   :class:`dippm_nas.optuna.HardwareCostModel`) are set on the Optuna trial (``set_constraint``), so the
   constrained samplers learn where the feasible region is; the trial also records ``margin_<figure>``,
   ``k_sigma_<figure>``, ``budget_<figure>`` and ``std_missing_<figure>``.
4. A configuration over a bound is **skipped**: the first time, it is told to Optuna as complete and
   infeasible, with its predicted objectives and the worst value (``-inf`` for maximise, ``+inf`` for
   minimise) for the objectives only a trial can measure (it was never trained); a later sample of the same
   config is told as failed (no second copy in the sampler's population); the tuner then asks again. A parameter set already
   sent to NNI is never sent again (a repeat is told as failed and skipped); a config the builder rejects
   is skipped the same way. After ``max_skips`` skips in a row the tuner raises ``NoMoreTrialError`` (NNI
   then stops asking).
5. The parameters sent to the trial are the sampled keys plus ``"dippm"``: ``{"search_space", "config",
   "batch_size", "dtype", "device", "predicted"}``, from which :func:`dippm_nas.nni.model_from_parameters`
   builds the same model in the trial.

When a trial reports (``receive_trial_result``), its objectives are read from the final-result dict (what
:func:`dippm_nas.nni.report` sends; a plain number counts for the single trial-side objective) and the
predicted ones from step 2, and Optuna is told. The counts (proposed, skipped for each reason,
predictions, results, failures) are logged, available as :attr:`HardwareAwareTuner.stats`, and written as
JSON to ``stats_file`` (default: ``dippm_tuner_stats.json`` in the experiment's log directory when NNI runs
the tuner).
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

from dippm_nas._optional import require
from dippm_nas.budgets import Budgets, ChanceCheck, trial_attrs
from dippm_nas.capture import assemble
from dippm_nas.errors import DippmNasError, SearchSpaceError
from dippm_nas.nni._report import mig_label
from dippm_nas.nni._scalarize import budgets_from_limits
from dippm_nas.nni._space import PARAMETERS_KEY, Dimension, canonical_json, parse_search_space
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import DEFAULT_DEVICE, predict
from dippm_nas.prior import check_runtime

_nni = require("nni", "nni", "dippm_nas.nni.HardwareAwareTuner")
from nni.tuner import Tuner  # noqa: E402

__all__ = ["HardwareAwareTuner", "TunerStats", "PREDICTED_OBJECTIVES", "SAMPLERS", "STATS_FILE_NAME"]

logger = logging.getLogger(__name__)

#: Objectives the tuner predicts itself; any other objective name is read from the trial's final result.
PREDICTED_OBJECTIVES: tuple[str, ...] = ("latency_ms", "energy_j", "memory_mib")
#: Optuna samplers the tuner wraps, by name.
SAMPLERS: tuple[str, ...] = ("nsga2", "nsga3", "tpe", "random")
#: Name of the counts file written to the experiment's log directory.
STATS_FILE_NAME = "dippm_tuner_stats.json"
_DIRECTIONS = ("maximize", "minimize")


@dataclass
class TunerStats:
    """What the tuner did so far.

    Attributes:
        proposed: parameter sets handed to NNI (NNI runs one trial for each, up to its trial budget; it
            may ask for a set more than it then runs).
        skipped_infeasible: sampled configs predicted to break a bound, not sent.
        skipped_duplicate: sampled parameter sets identical to one already sent, not sent again.
        skipped_invalid: sampled configs the search-space builder rejected or the cost model could not
            predict, not sent.
        predictions: distinct model configs predicted (each once).
        results: trial results told to Optuna.
        failed: trials that ended without a usable result.
        infeasible_configs: canonical JSON of each distinct config skipped as infeasible.
    """

    proposed: int = 0
    skipped_infeasible: int = 0
    skipped_duplicate: int = 0
    skipped_invalid: int = 0
    predictions: int = 0
    results: int = 0
    failed: int = 0
    infeasible_configs: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """All skips together."""
        return self.skipped_infeasible + self.skipped_duplicate + self.skipped_invalid


@dataclass
class _Evaluation:
    """The cost model's verdict on one config (cached per config)."""

    config: dict[str, Any]
    prediction: Prediction | None = None
    checks: dict[str, ChanceCheck] = field(default_factory=dict)
    error: str | None = None

    @property
    def violations(self) -> dict[str, float]:
        """``{figure: mean + k_sigma * std - budget}`` (``<= 0`` feasible)."""
        return {n: c.value for n, c in self.checks.items()}

    @property
    def feasible(self) -> bool:
        return self.error is None and all(v <= 0 for v in self.violations.values())


def _make_sampler(name: str, seed: int | None, population_size: int | None) -> Any:
    import optuna

    if name not in SAMPLERS:
        raise DippmNasError(f"sampler must be one of {SAMPLERS}, got {name!r}")
    if population_size is not None and name not in ("nsga2", "nsga3"):
        raise DippmNasError(f"population_size applies to the nsga2/nsga3 samplers only, got sampler={name!r}")
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=population_size or 50, seed=seed)
    if name == "nsga3":
        return optuna.samplers.NSGAIIISampler(population_size=population_size or 50, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


class HardwareAwareTuner(Tuner):
    """Multi-objective NNI tuner that predicts each candidate's cost and skips infeasible ones.

    Use it through ``CustomAlgorithmConfig(class_name="dippm_nas.nni.HardwareAwareTuner",
    class_args={...})`` (YAML: ``tuner: {className: dippm_nas.nni.HardwareAwareTuner, classArgs: ...}``);
    the arguments below are the class args. See the module docstring for the protocol.

    Args:
        builder: name of a registered search space of :mod:`search_spaces` (``search_spaces.list_spaces()``);
            search-space keys that are config keys of it build the model.
        objectives: objective names; ``"latency_ms"``, ``"energy_j"``, ``"memory_mib"`` are predicted, any
            other (e.g. ``"accuracy"``) is read from the trial's final result dict.
        directions: ``"maximize"`` or ``"minimize"`` per objective.
        base_config: config keys fixed for every model (keys neither here nor in the search space take the
            builder's defaults).
        batch_size: batch size the cost is predicted at (``>= 1``).
        dtype: compute dtype the cost is predicted in.
        device: catalogue device id; default ``"a100-sxm4-40gb"``.
        budgets: the chance constraints, a :class:`~dippm_nas.budgets.Budgets` or (class args) a mapping of
            its keys, e.g. ``{"latency_ms": 1.0, "k_sigma": 1.0}``; a config whose ``mean + k_sigma * std``
            breaks one is skipped.
        k_sigma: when given, replaces ``budgets.k_sigma`` (default of the budgets: 1.0).
        max_latency_ms, max_energy_j, max_memory_mib, mig_profile: deprecated (``DeprecationWarning``):
            the same as ``budgets={"latency_ms": ..., "energy_j": ..., "memory_mib": ..., "mig_profile": ...}``.
        sampler: one of :data:`SAMPLERS` (``"nsga2"`` default).
        seed: sampler seed (``None``: random).
        population_size: generation size of ``nsga2`` / ``nsga3`` (default 50).
        max_skips: skips in a row after which the tuner gives up with ``NoMoreTrialError``.
        stats_file: where to write :attr:`stats` as JSON after every change (default: ``<NNI log
            dir>/dippm_tuner_stats.json`` when NNI's dispatcher runs the tuner, else nowhere).
        cache: conversion cache, as in :func:`dippm_nas.predict`.
        runtime: how the models will run on the GPU: ``"eager"`` (default), ``"cuda-graphs"`` or ``"compiled"``
            (as in :func:`dippm_nas.predict`).

    Raises:
        ExecutionRuntimeError: an unknown runtime (the choices are listed).
        SearchSpaceError: unknown builder (the registered ones are listed) or a bad ``base_config``.
        InputSpecError: a dtype the builder's input spec rejects.
        DippmNasError: mismatched or unknown objectives / directions, bad sampler, bounds or batch size.
    """

    def __init__(self, builder: str, objectives: Sequence[str] = ("accuracy", "latency_ms"),
                 directions: Sequence[str] = ("maximize", "minimize"), base_config: Mapping[str, Any] | None = None,
                 batch_size: int = 1, dtype: str = "float32", device: str = DEFAULT_DEVICE,
                 budgets: Budgets | Mapping[str, Any] | None = None, k_sigma: float | None = None,
                 sampler: str = "nsga2", seed: int | None = None, population_size: int | None = None,
                 max_skips: int = 100, stats_file: str | None = None, cache: bool = True,
                 max_latency_ms: float | None = None, max_energy_j: float | None = None,
                 max_memory_mib: float | None = None, mig_profile: str | None = None,
                 runtime: str = "eager") -> None:
        super().__init__()
        import optuna
        import search_spaces

        from dippm_nas.devices import resolve_device

        self.space = search_spaces.get_space(builder)
        self.builder = builder
        objectives, directions = list(objectives), list(directions)
        if not objectives or len(objectives) != len(directions):
            raise DippmNasError(f"objectives and directions must be non-empty and of equal length, got "
                                f"objectives={objectives}, directions={directions}")
        if len(set(objectives)) != len(objectives) or not all(isinstance(o, str) and o for o in objectives):
            raise DippmNasError(f"objectives must be distinct non-empty names, got {objectives}")
        bad = [d for d in directions if d not in _DIRECTIONS]
        if bad:
            raise DippmNasError(f"each direction must be one of {_DIRECTIONS}, got {bad}")
        if "default" in objectives:
            logger.warning("objective 'default' is the scalarised score, which already folds in the cost; "
                           "a multi-objective search usually wants 'accuracy' and the cost figures instead")
        self.objectives, self.directions = objectives, directions
        self.base_config = dict(base_config or {})
        self.space.validate(self.base_config)  # a bad fixed key fails now, not at the first trial
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise DippmNasError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(max_skips, bool) or not isinstance(max_skips, int) or max_skips < 0:
            raise DippmNasError(f"max_skips must be an int >= 0, got {max_skips!r}")
        self.budgets: Budgets = budgets_from_limits(
            budgets, max_latency_ms=max_latency_ms, max_energy_j=max_energy_j, max_memory_mib=max_memory_mib,
            mig_profile=mig_profile, k_sigma=k_sigma, where="HardwareAwareTuner")
        self.batch_size, self.dtype, self.max_skips, self.cache = batch_size, dtype, max_skips, cache
        #: standard deviations of memory the MIG advice of each prediction adds (the memory budget's ``k``)
        self.k_sigma = self.budgets.k_for("memory_mib")
        self.runtime = check_runtime(runtime)
        self.space.input_spec(self.space.validate(self.base_config), batch_size=batch_size, dtype=dtype)  # bad dtype
        self.device = resolve_device(device).id
        self.budgets.memory_limit(self.device)  # a MIG profile the device lacks fails now
        self.sampler_name = sampler
        self.study = optuna.create_study(directions=directions,
                                         sampler=_make_sampler(sampler, seed, population_size))
        self.stats = TunerStats()
        if stats_file is None:
            log_dir = os.environ.get("NNI_LOG_DIRECTORY") if os.environ.get("SDK_PROCESS") == "dispatcher" else None
            stats_file = str(Path(log_dir) / STATS_FILE_NAME) if log_dir else None
        self.stats_file = Path(stats_file) if stats_file else None
        self._dims: dict[str, Dimension] | None = None
        self._model_keys: list[str] = []
        self._proposed: dict[str, int] = {}              # canonical parameters -> parameter id
        self._evaluations: dict[str, _Evaluation] = {}   # canonical config -> verdict
        self._running: dict[int, tuple[Any, _Evaluation]] = {}  # parameter id -> (optuna trial, verdict)
        self._failed_ids: set[int] = set()
        self._warned: set[str] = set()
        logger.info("HardwareAwareTuner: builder=%s objectives=%s directions=%s device=%s batch_size=%d "
                    "budgets=%s sampler=%s", builder, objectives, directions, self.device, batch_size,
                    self.budgets.to_dict(), sampler)

    # ------------------------------------------------------------------ NNI Tuner interface
    def update_search_space(self, search_space: dict[str, Any]) -> None:
        """Called by NNI with the experiment's search space (at start and on every update)."""
        dims = parse_search_space(search_space)
        model_keys = [k for k in dims if k in self.space.params]
        other = [k for k in dims if k not in self.space.params]
        if not model_keys:
            raise SearchSpaceError(
                f"no key of the NNI search space {sorted(dims)} is a config key of search space "
                f"{self.builder!r} ({sorted(self.space.params)}), so every trial would build the same model"
            )
        self._dims, self._model_keys = dims, model_keys
        logger.info("search space: keys %s build the %s model; keys %s go to the trial only",
                    model_keys, self.builder, other)

    def generate_parameters(self, parameter_id: int, **kwargs: Any) -> dict[str, Any]:
        """Called by NNI once per new trial: the next feasible, never-sent parameter set.

        Raises:
            nni.NoMoreTrialError: ``max_skips`` skips in a row (the feasible space looks exhausted).
        """
        import optuna

        if self._dims is None:
            raise DippmNasError("generate_parameters was called before update_search_space")
        distributions = {k: d.distribution for k, d in self._dims.items()}
        for _ in range(self.max_skips + 1):
            trial = self.study.ask(distributions)
            flat = {k: d.decode(trial.params[k]) for k, d in self._dims.items()}
            key = canonical_json(flat)
            if key in self._proposed:
                trial.set_user_attr("dippm_status", "skipped_duplicate")
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.stats.skipped_duplicate += 1
                logger.debug("skipped a repeat of parameter set %d: %s", self._proposed[key], key)
                continue
            ev, fresh = self._evaluate({k: flat[k] for k in self._model_keys})
            if ev.error is None and not ev.feasible and not fresh:
                # told once as infeasible already: a second copy would only crowd the sampler's population
                trial.set_user_attr("dippm_status", "skipped_infeasible_repeat")
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.stats.skipped_infeasible += 1
                logger.debug("skipped a repeat of infeasible config %s", canonical_json(ev.config))
                continue
            for name, v in ev.violations.items():
                trial.set_constraint(name, v)
            for k, v in trial_attrs(ev.checks).items():
                trial.set_user_attr(k, v)
            if ev.error is not None:
                trial.set_user_attr("dippm_status", "skipped_invalid")
                trial.set_user_attr("dippm_error", ev.error)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self.stats.skipped_invalid += 1
                logger.info("skipped %s: %s", key, ev.error)
                continue
            if not ev.feasible:
                trial.set_user_attr("dippm_status", "skipped_infeasible")
                self.study.tell(trial, self._objective_values(ev, None))
                self.stats.skipped_infeasible += 1
                over = {k: round(v, 4) for k, v in ev.violations.items() if v > 0}
                logger.info("skipped infeasible config %s (mean + k_sigma * std over budget by %s); skipped so "
                            "far: %d",
                            canonical_json(ev.config), over, self.stats.skipped_infeasible)
                self._write_stats()
                continue
            self._proposed[key] = parameter_id
            self._running[parameter_id] = (trial, ev)
            self.stats.proposed += 1
            self._write_stats()
            assert ev.prediction is not None
            p = ev.prediction
            params = dict(flat)
            params[PARAMETERS_KEY] = {
                "search_space": self.builder, "config": ev.config, "batch_size": self.batch_size,
                "dtype": self.dtype, "device": self.device,
                "predicted": {"latency_ms": p.latency_ms, "energy_j": p.energy_j, "memory_mib": p.memory_mib,
                              "mig": mig_label(p), "source": p.latency_source},
            }
            logger.info("parameter set %d: %s (predicted %.4g ms, %.4g MiB); stats %s", parameter_id, key,
                        p.latency_ms, p.memory_mib, self._counts())
            return params
        self._write_stats()
        logger.warning("giving up after %d skips in a row (the feasible, unexplored part of the space looks "
                       "exhausted); stats %s", self.max_skips + 1, self._counts())
        raise _nni.NoMoreTrialError(
            f"dippm_nas HardwareAwareTuner: {self.max_skips + 1} sampled configurations in a row were infeasible, "
            f"repeats or invalid ({self._counts()})"
        )

    def receive_trial_result(self, parameter_id: int, parameters: Any, value: Any, **kwargs: Any) -> None:
        """Called by NNI with a trial's final result: tell Optuna the trial's objective values."""
        import optuna

        entry = self._running.pop(parameter_id, None)
        if entry is None:
            why = ("a customized trial" if kwargs.get("customized") else
                   "an earlier failed trial" if parameter_id in self._failed_ids else "an unknown parameter id")
            logger.warning("ignored the result of parameter set %s (%s)", parameter_id, why)
            return
        trial, ev = entry
        try:
            values = self._objective_values(ev, value)
        except DippmNasError as e:
            logger.error("trial of parameter set %d: %s; told Optuna it failed", parameter_id, e)
            trial.set_user_attr("dippm_status", "failed")
            trial.set_user_attr("dippm_error", str(e))
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.stats.failed += 1
            self._failed_ids.add(parameter_id)
        else:
            trial.set_user_attr("dippm_status", "trained")
            self.study.tell(trial, values)
            self.stats.results += 1
        self._write_stats()

    def trial_end(self, parameter_id: int, success: bool, **kwargs: Any) -> None:
        """Called by NNI when a trial ends; a failed trial without a result is told to Optuna as failed."""
        import optuna

        if success or parameter_id not in self._running:
            return  # a successful trial's result may still be on its way
        trial, _ = self._running.pop(parameter_id)
        trial.set_user_attr("dippm_status", "failed")
        trial.set_user_attr("dippm_error", "the trial ended without success")
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.stats.failed += 1
        self._failed_ids.add(parameter_id)
        logger.info("trial of parameter set %d failed without a result", parameter_id)
        self._write_stats()

    def import_data(self, data: list[Any]) -> None:
        """Not supported: imported results are ignored, with a warning that says how many."""
        logger.warning("HardwareAwareTuner does not import earlier results; %d records ignored", len(data))

    # ------------------------------------------------------------------ internals
    def _counts(self) -> dict[str, int]:
        d = asdict(self.stats)
        d.pop("infeasible_configs")
        d["skipped"] = self.stats.skipped
        return d

    def _write_stats(self) -> None:
        if self.stats_file is None:
            return
        d = self._counts()
        d["infeasible_configs"] = [json.loads(c) for c in self.stats.infeasible_configs]
        tmp = self.stats_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(d, indent=1))
            tmp.replace(self.stats_file)
        except OSError as e:
            if "stats" not in self._warned:
                self._warned.add("stats")
                logger.warning("could not write tuner stats to %s: %s", self.stats_file, e)

    def _evaluate(self, model_part: dict[str, Any]) -> tuple[_Evaluation, bool]:
        """Build and predict a config once; later calls return the cached verdict.

        Returns:
            ``(verdict, fresh)``: ``fresh`` is False when the config had been evaluated before.
        """
        try:
            config = self.space.validate({**self.base_config, **model_part})
        except SearchSpaceError as e:
            return _Evaluation(config={**self.base_config, **model_part}, error=str(e)), True
        ckey = canonical_json(config)
        ev = self._evaluations.get(ckey)
        if ev is not None:
            return ev, False
        ev = _Evaluation(config=config)
        try:
            spec = self.space.input_spec(config, batch_size=self.batch_size, dtype=self.dtype)
            graph = assemble(self.space, config, spec, cache=self.cache)  # from cached blocks, no export
            ev.prediction = predict(graph, None, self.device, k_sigma=self.k_sigma,
                                    mig=self.budgets.mig_profile is not None, runtime=self.runtime)
            self.stats.predictions += 1
        except DippmNasError as e:  # a builder or capture failure is this config's problem, not the search's
            ev.error = f"{type(e).__name__}: {e}"
        if ev.prediction is not None:
            needs_energy = "energy_j" in self.objectives or self.budgets.energy_j is not None
            if needs_energy and ev.prediction.energy_j is None:
                raise DippmNasError(f"device {self.device!r} gives no energy figure (energy_source "
                                    f"'unavailable'); remove 'energy_j' from objectives and budgets")
            ev.checks = self.budgets.check(ev.prediction)
            if not ev.feasible:
                self.stats.infeasible_configs.append(ckey)
        self._evaluations[ckey] = ev
        return ev, True

    def _objective_values(self, ev: _Evaluation, result: Any) -> list[float]:
        """Objective values in order; ``result=None`` (a skipped config) gives trial-side ones their worst."""
        assert ev.prediction is not None
        trial_side = [o for o in self.objectives if o not in PREDICTED_OBJECTIVES]
        out: list[float] = []
        for name, direction in zip(self.objectives, self.directions):
            if name in PREDICTED_OBJECTIVES:
                out.append(float(getattr(ev.prediction, name)))
                continue
            if result is None:
                out.append(-math.inf if direction == "maximize" else math.inf)
                continue
            if isinstance(result, Mapping):
                if name not in result:
                    raise DippmNasError(f"the final result has no {name!r} (keys {sorted(result)}); report it "
                                        "with dippm_nas.nni.report(...) or a dict holding it")
                v = result[name]
            elif len(trial_side) == 1:
                if "scalar" not in self._warned:
                    self._warned.add("scalar")
                    logger.warning("trials report a plain number; it is taken as objective %r", name)
                v = result
            else:
                raise DippmNasError(f"the final result is a plain number {result!r} but objectives {trial_side} "
                                    "all come from the trial; report a dict")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise DippmNasError(f"objective {name!r} must be a number, the trial reported {v!r}")
            out.append(float(v))
        return out
