"""The Optuna study of :class:`~dippm_nas.nni.HardwareAwareTuner`: opened (or resumed and checked), its stored
trials read back into the tuner's memory, and the objective values told to it."""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dippm_nas._numbers import is_real
from dippm_nas._redact import redact_url
from dippm_nas.errors import DippmNasError, InvalidValueError, SearchSpaceError
from dippm_nas.optuna import rdb_storage

import optuna

__all__ = ["PREDICTED_OBJECTIVES", "STUDY_FILE_NAME", "completed_trial", "encode_parameters", "load_trials",
           "objective_values", "open_study", "record_cost", "tell_result", "under_dispatcher"]

logger = logging.getLogger("dippm_nas.nni._tuner")  # the tuner's log: one logger for all it says

#: Objectives the tuner predicts itself; any other objective name is read from the trial's final result.
PREDICTED_OBJECTIVES: tuple[str, ...] = ("latency_ms", "energy_j", "memory_mib")
#: Name of the SQLite study the tuner keeps in the experiment's checkpoint directory when NNI runs it and
#: no ``storage`` is given.
STUDY_FILE_NAME = "dippm_tuner_study.db"
_SENT = ("sent", "trained", "failed")  # statuses of the trials whose parameters went to NNI
#: The :class:`~dippm_nas.nni.TunerStats` counter each ``dippm_status`` of a stored trial adds to.
_STATUS_COUNTERS = {
    "trained": "results", "failed": "failed", "imported": "imported", "skipped_infeasible": "skipped_infeasible",
    "skipped_infeasible_repeat": "skipped_infeasible", "skipped_duplicate": "skipped_duplicate",
    "skipped_invalid": "skipped_invalid",
}


def under_dispatcher() -> bool:
    """Whether NNI's dispatcher runs this process."""
    return os.environ.get("SDK_PROCESS") == "dispatcher"


def open_study(storage: Any, study_name: str | None, sampler: Any, objectives: list[str], directions: list[str],
               setup: dict[str, Any]) -> tuple[Any, str | None]:
    """The tuner's Optuna study (created, or loaded and checked: its objectives and directions must be the
    tuner's), and its storage URL with the password masked (``None``: in memory). ``setup`` is recorded on the
    study; a stored study run with other settings is logged."""
    exp_dir = None
    if under_dispatcher() and os.environ.get("NNI_LOG_DIRECTORY"):
        exp_dir = Path(os.environ["NNI_LOG_DIRECTORY"]).parent
    if storage is None and under_dispatcher() and os.environ.get("NNI_CHECKPOINT_DIRECTORY"):
        ckpt = Path(os.environ["NNI_CHECKPOINT_DIRECTORY"])
        ckpt.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{ckpt / STUDY_FILE_NAME}"
    if study_name is None:
        study_name = f"dippm-nni-{exp_dir.name}" if exp_dir is not None else "dippm-nni"
    if isinstance(storage, str):
        storage = rdb_storage(storage) if "://" in storage else storage
    # the URL with its password masked: it is logged and named in errors
    storage_url = redact_url(getattr(getattr(storage, "engine", None), "url", storage)) if storage else None
    study = optuna.create_study(storage=storage, study_name=study_name, directions=directions,
                                sampler=sampler, load_if_exists=True)
    wanted = [optuna.study.StudyDirection.MAXIMIZE if d == "maximize" else optuna.study.StudyDirection.MINIMIZE
              for d in directions]
    have = list(study.directions)
    if have != wanted:
        raise InvalidValueError(f"study {study_name!r} in {storage_url} has directions "
                                f"{[d.name.lower() for d in have]}, the tuner's are {directions}; use "
                                "another study_name or the study's directions")
    if study.metric_names is None:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(objectives)
    elif list(study.metric_names) != objectives:
        raise InvalidValueError(f"study {study_name!r} in {storage_url} has objectives "
                                f"{list(study.metric_names)}, the tuner's are {objectives}; use another "
                                "study_name or the study's objectives")
    old = study.user_attrs.get("dippm_tuner")
    if old is not None and old != json.loads(json.dumps(setup)):
        changed = sorted(k for k in setup if json.dumps(old.get(k), sort_keys=True) !=
                         json.dumps(setup[k], sort_keys=True))
        logger.warning("study %r was run with other settings %s (%s then, %s now); its trials' predicted "
                       "objectives and constraints stay as recorded", study_name, changed,
                       {k: old.get(k) for k in changed}, {k: setup[k] for k in changed})
    study.set_user_attr("dippm_tuner", setup)
    return study, storage_url


def load_trials(study: Any, s: Any, proposed: dict[str, int], resumed: dict[str, int], infeasible_told: set[str]
                ) -> None:
    """Rebuild the tuner's memory from a stored study's trials (a resumed experiment): the parameter sets sent
    (``proposed``), those still running (``resumed``), the infeasible configs told (``infeasible_told``) and the
    counters of ``s`` (:class:`~dippm_nas.nni.TunerStats`)."""
    trials = study.get_trials(deepcopy=False)
    s.loaded = len(trials)
    for ft in trials:
        st = ft.user_attrs.get("dippm_status")
        key = ft.user_attrs.get("dippm_parameters")
        if key is not None:
            proposed[key] = ft.number
            if ft.state == optuna.trial.TrialState.RUNNING:
                resumed[key] = ft.number
        if st in _SENT:
            s.proposed += 1
        counter = _STATUS_COUNTERS.get(st) if isinstance(st, str) else None
        if counter is not None:
            setattr(s, counter, getattr(s, counter) + 1)
        if st == "skipped_infeasible":
            cfg = ft.user_attrs.get("dippm_config")
            if cfg is not None and cfg not in infeasible_told:
                infeasible_told.add(cfg)
                s.infeasible_configs.append(cfg)
    if trials:
        logger.info("loaded %d trials of study %r: %d parameter sets sent, %d still running (their results "
                    "arrive through import_data on nnictl resume)", len(trials), study.study_name,
                    len(proposed), len(resumed))


def objective_values(objectives: Sequence[str], directions: Sequence[str], predicted: Mapping[str, Any], result: Any,
                     warned: set[str]) -> list[float]:
    """Objective values in order; ``result=None`` (a skipped config) gives trial-side ones their worst."""
    trial_side = [o for o in objectives if o not in PREDICTED_OBJECTIVES]
    out: list[float] = []
    for name, direction in zip(objectives, directions):
        if name in PREDICTED_OBJECTIVES:
            v = predicted.get(name)
            if v is None:
                raise DippmNasError(f"no predicted {name} for this trial (predicted {dict(predicted)})")
            out.append(float(v))
            continue
        if result is None:
            out.append(-math.inf if direction == "maximize" else math.inf)
            continue
        if isinstance(result, Mapping):
            if name not in result:
                raise InvalidValueError(f"the final result has no {name!r} (keys {sorted(result)}); report it "
                                        "with dippm_nas.nni.report(...) or a dict holding it")
            v = result[name]
        elif len(trial_side) == 1:
            if "scalar" not in warned:
                warned.add("scalar")
                logger.warning("trials report a plain number; it is taken as objective %r", name)
            v = result
        else:
            raise InvalidValueError(f"the final result is a plain number {result!r} but objectives {trial_side} "
                                    "all come from the trial; report a dict")
        if not is_real(v) or math.isnan(v):
            raise InvalidValueError(f"objective {name!r} must be a number, the trial reported {v!r}")
        out.append(float(v))
    return out


def encode_parameters(dims: Mapping[str, Any], flat: Mapping[str, Any], key: str) -> dict[str, tuple[Any, Any]]:
    """``{Optuna parameter name: (distribution, value)}`` of the parameter set ``flat`` (canonical JSON ``key``).

    Raises:
        SearchSpaceError: a value outside its dimension (the parameter set is named).
    """
    encoded: dict[str, tuple[Any, Any]] = {}
    try:
        for k, d in dims.items():
            encoded.update(d.encode(flat[k]))
    except SearchSpaceError as e:
        raise SearchSpaceError(f"parameter {key} is outside the search space: {e}") from e
    return encoded


def completed_trial(encoded: Mapping[str, tuple[Any, Any]], values: list[float], attrs: dict[str, Any],
                    violations: Mapping[str, float]) -> Any:
    """A completed Optuna trial of an imported record: its parameters, objective values, user attributes and
    constraints (``violations``; in ``system_attrs`` where Optuna's ``create_trial`` takes no ``constraints``)."""
    kw: dict[str, Any] = {}
    listed = [float(v) for v in violations.values()]
    if listed:
        if "constraints" in inspect.signature(optuna.trial.create_trial).parameters:
            kw["constraints"] = dict(violations)
        else:  # Optuna 4: where its samplers keep constraints_func's answer
            kw["system_attrs"] = {"constraints": listed}
        attrs["dippm_constraints"] = listed
    return optuna.trial.create_trial(params={n: v for n, (_, v) in encoded.items()},
                                     distributions={n: d for n, (d, _) in encoded.items()},
                                     values=values, user_attrs=attrs, **kw)


def record_cost(trial: Any, attrs: Mapping[str, Any], violations: Mapping[str, float], set_constraint: bool) -> None:
    """Set the cost attributes (``attrs``) and the constraints on a sampled trial: ``trial.set_constraint`` where
    Optuna has it, else the ``dippm_constraints`` user attribute its sampler's ``constraints_func`` reads."""
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if not violations:
        return
    if set_constraint:
        for name, v in violations.items():
            trial.set_constraint(name, v)
    else:
        trial.set_user_attr("dippm_constraints", [float(v) for v in violations.values()])


def tell_result(study: Any, stats: Any, trial: Any, values_of: Callable[[], list[float]], what: str) -> bool:
    """Tell ``study`` a trial's result (its objective values: ``values_of()``); ``False`` when it was unusable
    (``values_of`` raised a :class:`~dippm_nas.errors.DippmNasError`): the trial is then told failed, its
    ``dippm_error`` saying why. ``stats`` (:class:`~dippm_nas.nni.TunerStats`) counts either."""
    try:
        values = values_of()
    except DippmNasError as e:
        logger.error("%s: %s; told Optuna it failed", what, e)
        trial.set_user_attr("dippm_status", "failed")
        trial.set_user_attr("dippm_error", str(e))
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        stats.failed += 1
        return False
    trial.set_user_attr("dippm_status", "trained")
    study.tell(trial, values)
    stats.results += 1
    return True
