"""Tests of ``dippm_nas.optuna``: objectives, user attributes, constraints seen by TPE and NSGA-II,
the Optuna 4.x ``constraints_func`` path, and the ask/tell batch path.

Most tests replace the predictor with a closed-form fake (memory = 50 MiB x total hidden width), so a
study of 60 trials runs in about a second and the feasible region is known exactly; one test runs the
real capture + analytic prior. Run against Optuna 4.x with ``PYTHONPATH=<dir with optuna 4> pytest``:
the tests that need ``Trial.set_constraint`` skip there, the ``constraints_func`` ones run.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import optuna
import pytest

import dippm_nas.optuna as dop
import dippm_nas.optuna._bookkeeping as bk
import dippm_nas.optuna._compat as compat
import dippm_nas.optuna._scheduling as cm
from dippm_nas.capture import ModelSource
import search_spaces as ss
from dippm_nas.errors import DeviceError, DippmNasError, GraphCaptureError
from dippm_nas.optuna import Budgets, HardwareCostModel
from dippm_nas.prediction import Prediction
from dippm_nas.spec import InputSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPEC = InputSpec(shape=(4,), batch_size=2)
#: Usable memory of A100-40GB's 1g.5gb (4.75 GiB per nvidia-smi -lgip), MiB.
LIMIT_1G5GB = 4864.0
MIB_PER_WIDTH = 50.0

needs_set_constraint = pytest.mark.skipif(
    not dop.optuna_has_set_constraint(), reason=f"Optuna {optuna.__version__} has no Trial.set_constraint (5.0+)")


def _mlp(*widths: int) -> Any:
    return ss.build_model("mlp", {"in_features": 4, "hidden": list(widths), "out_features": 2})


def _fake_prediction(model: Any, spec: InputSpec, device: str, *, std: float | None = None) -> Prediction:
    w = sum(model.search_space_config["hidden"])
    return Prediction(latency_ms=0.01 * w, energy_j=0.001 * w, memory_mib=MIB_PER_WIDTH * w,
                      latency_source="analytic", energy_source="analytic", memory_source="analytic",
                      device=device, batch_size=spec.batch_size, dtype=spec.dtype, memory_mib_std=std)


@pytest.fixture
def fake_predict(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replace the predictor seen by dippm_nas.optuna with :func:`_fake_prediction`; returns the call log."""
    calls: list[Any] = []

    def predict(model: Any, spec: InputSpec | None, device: str, **kw: Any) -> Prediction:
        src = ModelSource.parse(model, spec)  # the fake reads the built model's config
        calls.append((src.model, src.spec, device, kw))
        return _fake_prediction(src.model, src.spec, device)

    def predict_many(items: Any, device: str, **kw: Any) -> list[Any]:
        out: list[Any] = []
        for item in items:
            src = item if isinstance(item, ModelSource) else ModelSource.parse(*item)
            calls.append((src.model, src.spec, device, kw))
            if src.model.search_space_config["hidden"] == [13]:
                out.append(GraphCaptureError("cannot export this one"))
            else:
                out.append(_fake_prediction(src.model, src.spec, device))
        return out

    monkeypatch.setattr(cm, "predict", predict)
    monkeypatch.setattr(cm, "predict_many", predict_many)
    return calls


# ----------------------------------------------------------------------------------------- module
def test_module_name_does_not_shadow_optuna() -> None:
    import dippm_nas

    assert cm.optuna is optuna
    assert "dippm_nas" not in (optuna.__file__ or "")
    assert dop.__name__ == "dippm_nas.optuna" and dippm_nas.__name__ == "dippm_nas"


# ----------------------------------------------------------------------------------------- set-up
def test_study_directions_and_metric_names() -> None:
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"))
    assert cost.objectives == ("latency_ms", "energy_j")
    assert cost.directions == ["minimize", "minimize"]
    study = cost.create_study()
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE", "MINIMIZE"]
    assert study.metric_names == ["accuracy", "latency_ms", "energy_j"]
    s2 = cost.create_study(leading={"top1_error": "minimize", "params_m": "minimize"})
    assert s2.metric_names == ["top1_error", "params_m", "latency_ms", "energy_j"]
    with pytest.raises(DippmNasError, match="3 objectives but the names are"):
        cost.set_metric_names(study, leading=())
    # Optuna's own directions=: yours first, then the cost model's
    s3 = cost.create_study(directions=["maximize", "minimize", "minimize"])
    assert [d.name for d in s3.directions] == ["MAXIMIZE", "MINIMIZE", "MINIMIZE"]
    assert s3.metric_names == ["objective_0", "latency_ms", "energy_j"]
    s4 = cost.create_study(leading={"acc": "maximize"}, directions=["maximize", "minimize", "minimize"])
    assert s4.metric_names == ["acc", "latency_ms", "energy_j"]
    with pytest.raises(DippmNasError, match="followed by the cost model's"):
        cost.create_study(directions=["minimize"])
    with pytest.raises(DippmNasError, match="disagrees"):
        cost.create_study(leading={"acc": "minimize"}, directions=["maximize", "minimize", "minimize"])
    with pytest.raises(DippmNasError, match="not direction="):
        cost.create_study(direction="minimize")
    with pytest.raises(DippmNasError, match="'maximize' or 'minimize'"):
        cost.create_study(leading={"accuracy": "up"})


def test_invalid_arguments_are_explained() -> None:
    with pytest.raises(DippmNasError, match=r"objectives must be distinct names from \['latency_ms'"):
        HardwareCostModel(objectives=("latency",))
    with pytest.raises(DippmNasError, match="got the string"):
        HardwareCostModel(objectives="latency_ms")
    with pytest.raises(DippmNasError, match=r"unknown MIG profile '1g\.6gb'.*choices: \['1g\.5gb'"):
        HardwareCostModel(budgets=Budgets(mig_profile="1g.6gb"))
    with pytest.raises(DippmNasError, match="needs a device with MIG"):
        HardwareCostModel(device="rtx-4090", budgets={"mig_profile": "1g.5gb"})
    with pytest.raises(DippmNasError, match=r"unknown budget keys \['memory'\]"):
        HardwareCostModel(budgets={"memory": 1})
    with pytest.raises(DippmNasError, match="latency_ms must be a finite number > 0"):
        Budgets(latency_ms=0)
    with pytest.raises(DeviceError, match="unknown device"):
        HardwareCostModel(device="a100")
    with pytest.raises(DippmNasError, match="k_sigma"):
        HardwareCostModel(k_sigma=-1)
    with pytest.raises(DippmNasError, match="constraint_api must be one of"):
        HardwareCostModel(constraint_api="magic")  # type: ignore[arg-type]


def test_energy_on_a_device_without_power_figures_is_refused() -> None:
    with pytest.raises(DippmNasError, match="'host-cpu' has no power figures"):
        HardwareCostModel(device="host-cpu")
    cost = HardwareCostModel(device="host-cpu", objectives=("latency_ms",))
    assert cost.directions == ["minimize"]


# ----------------------------------------------------------------------------------------- evaluate
@needs_set_constraint
def test_evaluate_records_attrs_and_constraints(fake_predict: list[Any]) -> None:
    cost = HardwareCostModel(budgets=Budgets(latency_ms=1.0, energy_j=0.05, mig_profile="1g.5gb"))
    study = cost.create_study()
    trial = study.ask()
    values = cost.evaluate(trial, _mlp(60, 40), SPEC)
    assert values == pytest.approx((1.0, 0.1))  # (latency_ms, energy_j) for total width 100
    study.tell(trial, (0.5, *values))
    t = study.trials[0]
    a = t.user_attrs
    assert a["predicted_latency_ms"] == pytest.approx(1.0) and a["predicted_latency_ms_std"] is None
    assert a["latency_source"] == a["energy_source"] == a["memory_source"] == "analytic"
    assert a["predicted_energy_j"] == pytest.approx(0.1) and a["predicted_memory_mib"] == pytest.approx(5000.0)
    assert a["predicted_device"] == "a100-sxm4-40gb"
    assert a["input_spec"] == SPEC.to_dict()
    assert a["search_space"] == "mlp" and a["search_space_config"]["hidden"] == [60, 40]
    assert a["cost_model_s"] >= 0
    # Optuna's convention: <= 0 feasible. latency 1.0 - 1.0 = 0 is feasible (inclusive bound).
    assert a["constraint_latency_ms"] == pytest.approx(0.0)
    assert a["constraint_energy_j"] == pytest.approx(0.05)
    assert a["constraint_memory_mib"] == pytest.approx(5000.0 - LIMIT_1G5GB)
    assert a["feasible"] is False
    assert t.constraints == pytest.approx({"latency_ms": 0.0, "energy_j": 0.05, "memory_mib": 5000.0 - LIMIT_1G5GB})
    assert cost.constraint_names == ("latency_ms", "energy_j", "memory_mib")
    assert cost.evaluations == 1 and cost.seconds > 0
    assert fake_predict[0][3]["k_sigma"] == 1.0 and fake_predict[0][3]["mig"] is True  # DEFAULT_K_SIGMA
    # the chance-constraint record: no std here, so it is taken as 0 and said so
    assert a["budget_latency_ms"] == 1.0 and a["k_sigma_latency_ms"] == 1.0 and a["std_missing_latency_ms"] is True
    assert a["margin_memory_mib"] == pytest.approx(LIMIT_1G5GB - 5000.0)


def test_memory_constraint_adds_k_sigma_std_like_the_mig_advisor() -> None:
    from dippm_nas.mig import advise

    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), k_sigma=2.0)
    pred = Prediction(latency_ms=1.0, energy_j=0.1, memory_mib=4000.0, latency_source="predicted",
                      energy_source="predicted", memory_source="predicted", device="a100-sxm4-40gb",
                      batch_size=1, dtype="float32", memory_mib_std=500.0)
    cons = cost.constraints(pred)
    assert cons == {"memory_mib": pytest.approx(4000.0 + 2 * 500.0 - LIMIT_1G5GB)}
    advice = advise(pred, "a100-sxm4-40gb", k_sigma=2.0)
    assert cons["memory_mib"] == pytest.approx(-advice.profile("1g.5gb").memory_headroom_mib)
    assert not advice.profile("1g.5gb").fits and cons["memory_mib"] > 0
    with pytest.raises(DippmNasError, match="for 'host-cpu'"):
        cost.constraints(Prediction(latency_ms=1.0, energy_j=None, memory_mib=1.0, latency_source="analytic",
                                    energy_source="unavailable", memory_source="analytic", device="host-cpu",
                                    batch_size=1, dtype="float32"))


def test_space_and_config_must_be_json_and_paired(fake_predict: list[Any]) -> None:
    cost = HardwareCostModel()
    trial = optuna.trial.FixedTrial({})
    with pytest.raises(DippmNasError, match="give both space= and config="):
        cost.evaluate(trial, _mlp(4), SPEC, space="mlp")
    with pytest.raises(DippmNasError, match="plain JSON data"):
        cost.evaluate(trial, _mlp(4), SPEC, space="mlp", config={"hidden": object()})
    with pytest.raises(DippmNasError, match="spec must be a dippm_nas.InputSpec"):
        cost.evaluate(trial, _mlp(4), (4,))  # type: ignore[arg-type]


def test_capture_failure_fails_the_trial_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: Any, **k: Any) -> Prediction:
        raise GraphCaptureError("torch.export failed: data-dependent control flow")

    monkeypatch.setattr(cm, "predict", broken)
    cost = HardwareCostModel()
    study = cost.create_study()

    def objective(trial: optuna.Trial) -> tuple[float, ...]:
        return (1.0, *cost.evaluate(trial, _mlp(4), SPEC))

    study.optimize(objective, n_trials=1, catch=(DippmNasError,))
    t = study.trials[0]
    assert t.state == optuna.trial.TrialState.FAIL
    assert "data-dependent control flow" in t.user_attrs["cost_model_error"]


# ----------------------------------------------------------------------------------------- samplers
def _search(sampler_name: str, constrained: bool, api: str = "auto", n: int = 60) -> optuna.Study:
    """A 2-parameter search: accuracy grows with width, memory = 50 MiB x width; 1g.5gb allows width <= 97."""
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb") if constrained else None,
                             objectives=("latency_ms",), constraint_api=api)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    if constrained and api == "constraints_func":
        kwargs["constraints_func"] = cost.constraints_func
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # constraints_func is deprecated on Optuna 5
        sampler = (optuna.samplers.TPESampler(seed=0, n_startup_trials=10, **kwargs) if sampler_name == "tpe"
                   else optuna.samplers.NSGAIISampler(seed=0, population_size=10, **kwargs))
    study = cost.create_study(sampler=sampler)

    def objective(trial: optuna.Trial) -> tuple[float, ...]:
        hidden = [trial.suggest_int("w1", 1, 128), trial.suggest_int("w2", 1, 128)]
        latency = cost.evaluate(trial, _mlp(*hidden), SPEC)  # one objective: a float, as Optuna expects
        return 1.0 - 1.0 / sum(hidden) + 0.001 * hidden[0], latency

    study.optimize(objective, n_trials=n)
    return study


def _infeasible(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(MIB_PER_WIDTH * (t.params["w1"] + t.params["w2"]) > LIMIT_1G5GB for t in trials)


def _check_constrained_study(study: optuna.Study) -> None:
    trials = study.trials
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)  # violations are never pruned
    assert _infeasible(trials) > 0  # the constraint was active
    front = study.best_trials
    assert front
    for t in front:  # the feasible Pareto set respects the MIG limit
        assert t.user_attrs["predicted_memory_mib"] <= LIMIT_1G5GB
        assert t.user_attrs["constraint_memory_mib"] <= 0 and t.user_attrs["feasible"] is True
    assert sum(not t.user_attrs["feasible"] for t in trials) == _infeasible(trials)


@needs_set_constraint
@pytest.mark.parametrize("sampler_name", ["tpe", "nsga2"])
def test_constraints_are_seen_by_the_sampler(fake_predict: list[Any], sampler_name: str) -> None:
    constrained = _search(sampler_name, True)
    _check_constrained_study(constrained)
    assert all(t.constraints for t in constrained.trials)
    # The sampler used them: with the same seed, fewer of the later proposals break the limit than in the
    # unconstrained search (which drifts to wide nets, since accuracy grows with width).
    free = _search(sampler_name, False)
    assert max(t.params["w1"] + t.params["w2"] for t in free.best_trials) * MIB_PER_WIDTH > LIMIT_1G5GB
    assert _infeasible(constrained.trials[30:]) < _infeasible(free.trials[30:])


@pytest.mark.parametrize("sampler_name", ["tpe", "nsga2"])
def test_optuna_4x_constraints_func_path(fake_predict: list[Any], sampler_name: str) -> None:
    constrained = _search(sampler_name, True, api="constraints_func")
    _check_constrained_study(constrained)
    for t in constrained.trials:
        # written by the sampler's after_trial from cost.constraints_func (the 4.x list format)
        assert list(t.system_attrs["constraints"]) == [t.user_attrs["constraint_memory_mib"]]
        assert not any(k.startswith("constraints:") for k in t.system_attrs)  # set_constraint not used
    free = _search(sampler_name, False)
    assert _infeasible(constrained.trials[30:]) < _infeasible(free.trials[30:])


class _TrialWithoutSetConstraint:
    """An Optuna 4.x-like trial: user attributes, no ``set_constraint``."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self.user_attrs: dict[str, Any] = {}
        self.number = 0

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value


def test_auto_api_falls_back_to_constraints_func_without_set_constraint(
        fake_predict: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"))
    study = cost.create_study(sampler=optuna.samplers.TPESampler(seed=0))  # no constraints_func given
    trial = _TrialWithoutSetConstraint(study)
    compat._warn_once.reset()
    with pytest.warns(RuntimeWarning, match="constraints_func=cost.constraints_func"):
        cost.evaluate(trial, _mlp(120), SPEC)
    assert trial.user_attrs["constraint_memory_mib"] == pytest.approx(120 * MIB_PER_WIDTH - LIMIT_1G5GB)
    frozen = optuna.trial.create_trial(values=[0.9, 1.2, 0.1], user_attrs=trial.user_attrs)
    assert cost.constraints_func(frozen) == [pytest.approx(120 * MIB_PER_WIDTH - LIMIT_1G5GB)]


def test_constraints_func_reports_missing_attrs_as_infeasible() -> None:
    cost = HardwareCostModel(budgets=Budgets(latency_ms=2.0, mig_profile="1g.5gb"))
    compat._warn_once.reset()
    with pytest.warns(RuntimeWarning, match="reporting it infeasible"):
        assert cost.constraints_func(optuna.trial.create_trial(values=[1.0, 1.0, 1.0])) == [math.inf, math.inf]


def test_set_constraint_api_needs_optuna_5() -> None:
    if dop.optuna_has_set_constraint():
        assert HardwareCostModel(constraint_api="set_constraint").constraint_api == "set_constraint"
    else:
        with pytest.raises(DippmNasError, match="needs Optuna >= 5"):
            HardwareCostModel(constraint_api="set_constraint")


# ----------------------------------------------------------------------------------------- batch path
def test_ask_tell_batch_path(fake_predict: list[Any]) -> None:
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"))
    study = cost.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trials = [study.ask() for _ in range(4)]
    models = [_mlp(10), _mlp(13), _mlp(200), _mlp(20, 20)]
    results = cost.evaluate_many(trials, [(m, SPEC) for m in models])
    assert len(fake_predict) == 4  # one batched call for all four
    assert isinstance(results[1], GraphCaptureError)
    assert results[0] == pytest.approx((0.1, 0.01)) and results[3] == pytest.approx((0.4, 0.04))
    for t, r in zip(trials, results):
        if isinstance(r, Exception):
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(t, (0.5, *r))
    frozen = study.trials
    assert frozen[1].state == optuna.trial.TrialState.FAIL
    assert "cannot export this one" in frozen[1].user_attrs["cost_model_error"]
    assert frozen[2].user_attrs["feasible"] is False  # 200 x 50 MiB > 1g.5gb: a violation, still COMPLETE
    assert frozen[2].state == optuna.trial.TrialState.COMPLETE
    assert [t.number for t in study.best_trials] in ([0], [0, 3], [3], [3, 0])
    with pytest.raises(DippmNasError, match="must pair up"):
        cost.evaluate_many(trials[:1], [])


# ----------------------------------------------------------------------------------------- real predictor
def test_real_prediction_end_to_end() -> None:
    """Capture + analytic prior of a tiny MLP; evaluate and evaluate_many agree with predict()."""
    import dippm_nas

    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb", latency_ms=1000.0))
    study = cost.create_study()
    model = _mlp(16)
    expected = dippm_nas.predict(model, SPEC)
    t0 = study.ask()
    values = cost.evaluate(t0, model, SPEC)
    assert values == pytest.approx((expected.latency_ms, expected.energy_j))
    t1 = study.ask()
    (batch_values,) = cost.evaluate_many([t1], [(_mlp(16), SPEC)])
    assert batch_values == pytest.approx(values)
    study.tell(t0, (0.5, *values))
    study.tell(t1, (0.5, *batch_values))
    a = study.trials[0].user_attrs
    assert a["mig_smallest_fit"] == expected.mig.smallest_fit == "1g.5gb"
    assert a["feasible"] is True and a["latency_source"] in ("analytic", "predicted", "calibrated")


# ----------------------------------------------------------------------------------------- background path
class _DataDependent(__import__("torch").nn.Module):
    """torch.export cannot trace a branch on tensor values: conversion fails."""

    def forward(self, x: Any) -> Any:
        return x if x.sum() > 0 else -x


def test_submit_without_workers_is_evaluate(fake_predict: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"))
    study = cost.create_study()
    t = study.ask()
    pending = cost.submit(t, _mlp(30), SPEC)  # predicted in the cost model's background thread
    assert pending.result() == pytest.approx((0.3, 0.03)) and pending.done()
    assert study.trials[0].user_attrs["predicted_memory_mib"] == pytest.approx(1500.0)
    at_once = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), overlap=False).submit(study.ask(), _mlp(30), SPEC)
    assert at_once.done() and at_once.result() == pytest.approx((0.3, 0.03))

    def broken(*a: Any, **k: Any) -> Prediction:
        raise GraphCaptureError("no export")

    monkeypatch.setattr(cm, "predict", broken)
    failed = cost.submit(study.ask(), _mlp(30), SPEC)  # default on_error="fail": NaN objectives
    assert all(math.isnan(v) for v in failed.result())
    raising = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), on_error="raise")
    failing = raising.submit(study.ask(), _mlp(30), SPEC)  # the error waits for result()
    with pytest.raises(GraphCaptureError, match="no export"):
        failing.result()


def test_background_conversion_matches_evaluate() -> None:
    """A worker process converts while the caller goes on: JSON config for search-space models, pickle otherwise."""
    import torch

    import dippm_nas

    with HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), background_workers=1, on_error="raise") as cost:
        study = cost.create_study()
        trials = [study.ask() for _ in range(3)]
        plain = torch.nn.Sequential(torch.nn.Linear(4, 12), torch.nn.ReLU(), torch.nn.Linear(12, 2))
        pending = [cost.submit(trials[0], _mlp(12), SPEC), cost.submit(trials[1], plain, SPEC),
                   cost.submit(trials[2], _DataDependent(), SPEC)]
        v0 = pending[0].result(timeout=600)
        v1 = pending[1].result(timeout=600)
        with pytest.raises(GraphCaptureError, match="in the background conversion process"):
            pending[2].result(timeout=600)
        assert cost.evaluations == 2
    for v, model in ((v0, _mlp(12)), (v1, plain)):
        expected = dippm_nas.predict(model, SPEC)
        assert v == pytest.approx((expected.latency_ms, expected.energy_j))
    study.tell(trials[0], (0.5, *v0))
    a = study.trials[0].user_attrs
    assert a["search_space_config"]["hidden"] == [12] and a["feasible"] is True and a["cost_model_s"] > 0
    assert "GraphCaptureError" in study.trials[2].user_attrs["cost_model_error"]
    with pytest.raises(DippmNasError, match="background_workers must be an int >= 0"):
        HardwareCostModel(background_workers=-1)


def test_rdb_storage_sets_sqlite_up_for_many_writers(tmp_path: Any) -> None:
    import sqlalchemy as sa

    storage = dop.rdb_storage(f"sqlite:///{tmp_path / 'study.db'}")
    with storage.engine.connect() as conn:
        assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(sa.text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        assert conn.execute(sa.text("PRAGMA busy_timeout")).scalar() == 30000
    study = HardwareCostModel().create_study(storage=storage, study_name="s")
    t = study.ask()
    t.set_user_attr("x", 1)
    study.tell(t, (1.0, 1.0, 1.0))
    assert optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}").trials[0].user_attrs == {"x": 1}



@needs_set_constraint
def test_constraints_func_given_on_optuna5_records_each_constraint_once(fake_predict: list[Any]) -> None:
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), objectives=("latency_ms", "energy_j"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # constraints_func is deprecated on Optuna 5
        sampler = optuna.samplers.TPESampler(seed=0, constraints_func=cost.constraints_func)
    study = cost.create_study(sampler=sampler)

    def objective(trial: optuna.Trial) -> tuple[float, ...]:
        return (1.0, *cost.evaluate(trial, _mlp(trial.suggest_int("w", 1, 128)), SPEC))

    study.optimize(objective, n_trials=4)
    for t in study.trials:
        assert list(t.system_attrs["constraints"]) == [t.user_attrs["constraint_memory_mib"]]
        assert not any(k.startswith("constraints:") for k in t.system_attrs)  # not also through set_constraint


def test_evaluate_returns_a_float_for_one_objective_and_a_tuple_for_several(fake_predict: list[Any]) -> None:
    one = HardwareCostModel(objectives=("latency_ms",))
    study = one.create_study(leading={})
    value = one.evaluate(study.ask(), _mlp(8), SPEC)  # predicted in the background: read when Optuna takes it
    assert isinstance(value, dop.PendingValue) and float(value) == pytest.approx(0.08) and value.done()
    assert value < 1.0 and f"{value:.2f}" == "0.08" and value * 2 == pytest.approx(0.16)
    at_once = HardwareCostModel(objectives=("latency_ms",), overlap=False)
    assert isinstance(at_once.evaluate(at_once.create_study(leading={}).ask(), _mlp(8), SPEC), float)
    study.optimize(lambda t: one.evaluate(t, _mlp(t.suggest_int("w", 1, 64)), SPEC), n_trials=2)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials[1:])
    two = HardwareCostModel(objectives=("latency_ms", "energy_j"))
    values = two.evaluate(two.create_study().ask(), _mlp(8), SPEC)
    assert isinstance(values, tuple) and len(values) == 2
    pending = one.submit(study.ask(), _mlp(8), SPEC)
    assert isinstance(pending.result(), float)


def test_evaluate_overlaps_and_batches_the_candidates_it_sees(fake_predict: list[Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The background thread predicts the candidates queued while it was busy in one predict_many, and each
    trial's record is written before its figures are read."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def slow_predict(model: Any, spec: InputSpec | None, device: str, **kw: Any) -> Prediction:
        entered.set()
        assert release.wait(30)
        src = ModelSource.parse(model, spec)
        fake_predict.append((src.model, src.spec, device, kw))
        return _fake_prediction(src.model, src.spec, device)

    monkeypatch.setattr(cm, "predict", slow_predict)
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"))
    study = cost.create_study()
    trials = [study.ask() for _ in range(4)]
    first = cost.evaluate(trials[0], _mlp(10), SPEC)
    assert entered.wait(30) and not first[0].done()  # the caller goes on while the thread predicts
    rest = [cost.evaluate(t, _mlp(20 + i), SPEC) for i, t in enumerate(trials[1:])]
    release.set()
    for t, values, w in zip(trials, [first, *rest], [10, 20, 21, 22]):
        study.tell(t, (0.5, *values))  # Optuna reads the figures: waits for them
        assert study.trials[t.number].user_attrs["predicted_memory_mib"] == pytest.approx(MIB_PER_WIDTH * w)
        assert study.trials[t.number].values[1] == pytest.approx(0.01 * w)
    assert cost.batch_sizes == [1, 3]
    assert cost.evaluations == 4
    cost.close()


def test_a_trial_finished_before_its_record_does_not_stop_the_others(fake_predict: list[Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    entered, release = threading.Event(), threading.Event()
    real = cm.predict

    def slow_predict(*a: Any, **kw: Any) -> Prediction:
        entered.set()
        assert release.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(cm, "predict", slow_predict)
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"))
    study = cost.create_study()
    t0, t1, t2 = (study.ask() for _ in range(3))
    first = cost.evaluate(t0, _mlp(10), SPEC)
    assert entered.wait(30)
    late, ok = cost.evaluate(t1, _mlp(11), SPEC), cost.evaluate(t2, _mlp(12), SPEC)
    study.tell(t1, (0.5, 1.0, 1.0))  # the objective returned other values: t1 finished before its record
    compat._warn_once.reset()
    bk._warn_once.reset()
    with pytest.warns(RuntimeWarning, match="could not record the error of trial 1"):
        release.set()
        study.tell(t0, (0.5, *first))
        study.tell(t2, (0.5, *ok))
        assert math.isnan(float(late[0]))  # reading it never raises: the trial's values say it failed
    assert study.trials[2].user_attrs["predicted_memory_mib"] == pytest.approx(MIB_PER_WIDTH * 12)
    assert "predicted_memory_mib" not in study.trials[1].user_attrs
    cost.close()


def test_any_error_of_an_overlapped_prediction_fails_its_trial_and_the_study_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error that is not a DippmNasError (a damaged adaptation: sqlite3.DatabaseError, an AssertionError...)
    fails the trial (on_error="fail") or makes it infeasible, never leaves it RUNNING or stops the study."""
    import sqlite3

    def broken(model: Any, spec: InputSpec | None, device: str, **kw: Any) -> Prediction:
        src = ModelSource.parse(model, spec)
        if src.model.search_space_config["hidden"] == [11]:
            raise AssertionError("a damaged adaptation")
        if src.model.search_space_config["hidden"] == [12]:
            raise sqlite3.DatabaseError("file is not a database")
        return _fake_prediction(src.model, src.spec, device)

    monkeypatch.setattr(cm, "predict", broken)
    for on_error, state in (("fail", "FAIL"), ("infeasible", "COMPLETE")):
        with HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), on_error=on_error) as cost:
            study = cost.create_study()
            study.optimize(lambda t: (0.5, *cost.evaluate(t, _mlp(10 + t.number), SPEC)), n_trials=3)
        states = [t.state.name for t in study.trials]
        assert states == ["COMPLETE", state, state], (on_error, states)
        assert "AssertionError: a damaged adaptation" in study.trials[1].user_attrs["cost_model_error"]
        assert "DatabaseError" in study.trials[2].user_attrs["cost_model_error"]
        if on_error == "infeasible":
            assert study.trials[1].values[1] == math.inf and study.trials[1].user_attrs["feasible"] is False


def test_enqueued_trials_run_once_each_with_overlap_and_n_jobs_on_sqlite(fake_predict: list[Any],
                                                                         tmp_path: Any) -> None:
    """With overlap the objectives return at once, so the threads of n_jobs=4 take queued trials together; the
    study's SQLite storage must give each queued trial to one thread (it ran twice and stopped the study with
    UpdateFinishedTrialError, leaving trials WAITING, before rdb_storage began its transactions IMMEDIATE)."""
    import collections
    import threading

    runs: list[int] = []
    lock = threading.Lock()
    for attempt in range(2):
        runs.clear()
        with HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb")) as cost:
            study = cost.create_study(storage=f"sqlite:///{tmp_path}/study{attempt}.db")
            for w in range(14, 30):
                study.enqueue_trial({"w": w})

            def objective(trial: optuna.Trial) -> Any:
                with lock:
                    runs.append(trial.number)
                return (0.5, *cost.evaluate(trial, _mlp(trial.suggest_int("w", 14, 40)), SPEC))

            study.optimize(objective, n_trials=16, n_jobs=4)
        states = collections.Counter(t.state.name for t in study.trials)
        assert states == {"COMPLETE": 16}, states
        assert sorted(runs) == list(range(16))  # no trial run twice


def test_cost_models_dropped_without_close_leave_no_thread(fake_predict: list[Any]) -> None:
    import gc
    import threading
    import time

    def live() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("dippm-cost-model")]

    before = len(live())
    for i in range(15):
        cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"))
        study = cost.create_study()
        trial = study.ask()
        study.tell(trial, (0.5, *cost.evaluate(trial, _mlp(10 + i), SPEC)))
        assert cost.batch_sizes == [1]  # the background thread ran
        del cost, study, trial
    gc.collect()
    deadline = time.monotonic() + 10
    while len(live()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(live()) == before


def test_the_cost_model_is_a_context_manager(fake_predict: list[Any]) -> None:
    import threading

    before = set(threading.enumerate())
    with HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb")) as cost:
        study = cost.create_study()
        trial = study.ask()
        study.tell(trial, (0.5, *cost.evaluate(trial, _mlp(10), SPEC)))
        started = [t for t in set(threading.enumerate()) - before if t.name == "dippm-cost-model"]
        assert len(started) == 1
    assert not started[0].is_alive()  # the block's end closed it and waited for its thread
