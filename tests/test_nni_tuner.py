"""HardwareAwareTuner beyond registered search spaces: any model factory, the budgets and input passed down
to the trial (``report`` repeats nothing), one constraint convention with Optuna, the default dtype, the
study in a storage URL (a restarted tuner resumes it) and ``import_data``, all by calling the tuner's methods
as NNI's dispatcher does, without an NNI manager.

The trial-side pieces (``final_metrics`` with the tuner's parameters, ``model_from_parameters`` of a
factory, factory errors) need no NNI; the tuner needs it and skips with the reason when it is missing.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest

import dippm_nas
from dippm_nas.budgets import Budgets
from dippm_nas.errors import DippmNasError, ModelSpecError, SearchSpaceError
from dippm_nas.nni import PARAMETERS_KEY, final_metrics, model_from_parameters, tuner_settings
from dippm_nas.capture import load_callable
from dippm_nas.spec import InputSpec

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # "no trained checkpoint" / "uncalibrated"

FACTORY = textwrap.dedent('''
    from torch import nn

    def build(params):
        """An MLP on 8 features; "width" and "depth" shape it."""
        layers, d = [], 8
        for _ in range(int(params.get("depth", 1))):
            layers += [nn.Linear(d, int(params["width"])), nn.ReLU()]
            d = int(params["width"])
        return nn.Sequential(*layers, nn.Linear(d, 2))

    def build_nested(params):
        """The same MLP from a nested choice: params["arch"] is {"_name": ..., "width": ...}."""
        return build({"width": params["arch"]["width"]})

    def not_a_model(params):
        return "model"

    def broken(params):
        raise RuntimeError("no such width")

    VALUE = 3
''')


def needs_nni():
    return pytest.importorskip("nni", reason="needs NNI (pip install -e '.[nni]'; the dev extra includes it)")


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``module:callable`` factory in a fresh module (unique name per test)."""
    name = f"nni_factory_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:build"
    sys.modules.pop(name, None)


def latency_constraint(ft) -> float:
    """The latency constraint the sampler sees: ``ft.constraints`` on Optuna >= 5; on Optuna 4 what the sampler's
    constraints_func recorded (``system_attrs["constraints"]``), else the tuner's ``dippm_constraints``."""
    if hasattr(ft, "constraints"):
        return ft.constraints["latency_ms"]
    return (ft.system_attrs.get("constraints") or ft.user_attrs["dippm_constraints"])[0]


def make_tuner(**kw):
    needs_nni()
    from dippm_nas.nni import HardwareAwareTuner

    args = dict(batch_size=4, seed=0, sampler="random")
    args.update(kw)
    return HardwareAwareTuner(**args)


SPACE = {"width": {"_type": "choice", "_value": [16, 32]}, "lr": {"_type": "loguniform", "_value": [1e-3, 1e-1]}}


# ------------------------------------------------------------------------------ factories (no NNI)

def test_bad_factory_strings_state_the_rule_the_value_and_the_choices(factory: str) -> None:
    module = factory.split(":")[0]
    with pytest.raises(ModelSpecError, match=r"model_factory must be 'package.module:callable'.*got 'build'"):
        load_callable("build", what="model_factory")
    with pytest.raises(ModelSpecError, match="got 'a b:c'"):
        load_callable("a b:c", what="model_factory")
    with pytest.raises(ModelSpecError, match="cannot import module 'no_such_module_xyz' of model_factory"):
        load_callable("no_such_module_xyz:build", what="model_factory")
    with pytest.raises(ModelSpecError, match=r"has no attribute 'buld'.*callables defined there: "
                                             r"\['broken', 'build', 'build_nested', 'not_a_model'\]"):
        load_callable(f"{module}:buld", what="model_factory")
    with pytest.raises(ModelSpecError, match="must name a callable"):
        load_callable(f"{module}:VALUE", what="model_factory")
    with pytest.raises(ModelSpecError, match="standard library"):
        load_callable("os:getcwd", what="model_factory")
    assert load_callable(factory).__name__ == "build"


def test_model_from_parameters_calls_the_factory_with_its_params(factory: str) -> None:
    module = factory.split(":")[0]
    d = {"model_factory": factory, "model_params": {"width": 16, "depth": 2},
         "input": InputSpec(shape=(8,), batch_size=4, dtype="float16").to_dict()}
    model, spec = model_from_parameters({"lr": 0.1, PARAMETERS_KEY: d})
    assert spec == InputSpec(shape=(8,), batch_size=4, dtype="float16")
    assert [m.out_features for m in model if hasattr(m, "out_features")] == [16, 16, 2] and not model.training
    with pytest.raises(ModelSpecError, match="returned str, expected a torch.nn.Module"):
        model_from_parameters({PARAMETERS_KEY: {**d, "model_factory": f"{module}:not_a_model"}})
    with pytest.raises(ModelSpecError, match="raised RuntimeError: no such width"):
        model_from_parameters({PARAMETERS_KEY: {**d, "model_factory": f"{module}:broken"}})
    with pytest.raises(SearchSpaceError, match=r"lacks \['input'\]"):
        model_from_parameters({PARAMETERS_KEY: {"model_factory": factory, "model_params": {}}})


def test_final_metrics_takes_budgets_device_and_spec_from_the_trials_parameters() -> None:
    import search_spaces as ss

    cfg = ss.get_space("mlp").validate({"in_features": 32, "out_features": 4, "hidden": [64]})
    model = ss.build_model("mlp", cfg)
    spec = ss.get_space("mlp").input_spec(cfg, batch_size=8, dtype="float16")
    p = dippm_nas.predict(model, spec, "a100-sxm4-40gb")
    budget = p.latency_ms / 2
    params = {"lr": 0.1, PARAMETERS_KEY: {"search_space": "mlp", "config": cfg, "batch_size": 8, "dtype": "float16",
                                          "device": "a100-sxm4-40gb", "runtime": "eager",
                                          "budgets": {"latency_ms": budget, "k_sigma": 0.0}}}
    s = tuner_settings(params)
    assert s["budgets"] == Budgets(latency_ms=budget, k_sigma=0.0) and s["spec"] == spec
    d = final_metrics(0.8, model, parameters=params)  # no spec, no budgets: the tuner's
    assert d["latency_ms"] == p.latency_ms and d["feasible"] is False
    assert d["default"] == pytest.approx(0.8 / 2)  # twice the budget halves the score
    # one constraint convention: absolute units, value = mean + k * std - budget <= 0 feasible, margin = -value
    c = d["constraints"]["latency_ms"]
    assert c["value"] == pytest.approx(p.latency_ms - budget) and c["margin"] == -c["value"]
    assert (c["mean"], c["std"], c["k_sigma"], c["budget"]) == (p.latency_ms, p.latency_ms_std, 0.0, budget)
    assert d["margins"]["latency_ms"] == c["margin"] and json.dumps(d)
    # budgets given win over the tuner's
    ok = final_metrics(0.8, model, parameters=params, budgets={"latency_ms": p.latency_ms * 4})
    assert ok["default"] == 0.8 and ok["constraints"]["latency_ms"]["value"] < 0
    assert tuner_settings({"lr": 0.1}) == {} and tuner_settings(None) == {}


# ------------------------------------------------------------------------------ the tuner with a factory

def test_tuner_with_a_model_factory_passes_model_budgets_and_input_to_the_trial(factory: str) -> None:
    t = make_tuner(model_factory=factory, model_keys=["width"], base_config={"depth": 2}, input_shape=[8],
                   budgets={"latency_ms": 50.0})
    assert t.dtype == "float16" and t.input_spec == InputSpec(shape=(8,), batch_size=4, dtype="float16")
    t.update_search_space(SPACE)
    p = t.generate_parameters(0)
    d = p[PARAMETERS_KEY]
    assert d["model_factory"] == factory and d["model_params"] == {"depth": 2, "width": p["width"]}
    assert "lr" in p and "lr" not in d["model_params"]  # not a model key: goes to the trial only
    assert d["budgets"] == {"latency_ms": 50.0, "k_sigma": 1.0} and d["device"] == "a100-sxm4-40gb"
    assert (d["dtype"], d["batch_size"], d["runtime"]) == ("float16", 4, "eager")
    model, spec = model_from_parameters(p)
    assert spec == t.input_spec
    metrics = final_metrics(0.7, model, parameters=p)  # the trial repeats nothing
    assert metrics["latency_ms"] == pytest.approx(d["predicted"]["latency_ms"])
    assert metrics["constraints"]["latency_ms"]["budget"] == 50.0 and metrics["default"] == 0.7
    t.receive_trial_result(0, p, metrics)
    (tr,) = [x for x in t.study.trials if x.state.name == "COMPLETE"]
    assert tr.values == [0.7, d["predicted"]["latency_ms"]]
    assert latency_constraint(tr) == pytest.approx(-tr.user_attrs["margin_latency_ms"])
    assert tr.user_attrs["predicted_latency_ms"] == d["predicted"]["latency_ms"]


def test_tuner_factory_arguments_are_checked(factory: str) -> None:
    with pytest.raises(DippmNasError, match="exactly one of builder= .* and model_factory="):
        make_tuner()
    with pytest.raises(DippmNasError, match="exactly one of builder="):
        make_tuner(builder="mlp", model_factory=factory)
    with pytest.raises(ModelSpecError, match="model_factory must be 'package.module:callable'"):
        make_tuner(model_factory="build", input_shape=[8])
    with pytest.raises(DippmNasError, match="input_shape= .* and inputs="):
        make_tuner(model_factory=factory)
    with pytest.raises(DippmNasError, match="model_keys applies to model_factory only"):
        make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, model_keys=["hidden"])
    t = make_tuner(model_factory=factory, model_keys=["width", "depth"], input_shape=[8])
    with pytest.raises(SearchSpaceError, match=r"model_keys \['depth'\] are not keys of the NNI search space"):
        t.update_search_space(SPACE)


def test_a_factory_that_fails_is_skipped_as_invalid(factory: str) -> None:
    nni = needs_nni()
    t = make_tuner(model_factory=factory.replace(":build", ":broken"), input_shape=[8], max_skips=3)
    t.update_search_space(SPACE)
    with pytest.raises(nni.NoMoreTrialError):
        t.generate_parameters(0)
    assert t.stats.skipped_invalid == 4 and t.stats.proposed == 0
    failed = [x for x in t.study.trials if x.user_attrs.get("dippm_status") == "skipped_invalid"]
    assert "no such width" in failed[0].user_attrs["dippm_error"]


def test_default_dtype_is_half_precision_on_a_gpu_and_float32_on_a_cpu(caplog: pytest.LogCaptureFixture) -> None:
    base = {"in_features": 32, "out_features": 4}
    with caplog.at_level("INFO", logger="dippm_nas.nni._tuner"):
        gpu = make_tuner(builder="mlp", base_config=base)
    assert gpu.dtype == "float16" and "dtype=float16 (default for a GPU device" in caplog.text
    assert make_tuner(builder="mlp", base_config=base, device="host-cpu").dtype == "float32"
    assert make_tuner(builder="mlp", base_config=base, dtype="float32").dtype == "float32"


def test_a_dtype_the_a100_checkpoint_never_saw_warns_that_the_prior_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    t = make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, dtype="bfloat16")
    t.update_search_space({"hidden": {"_type": "choice", "_value": [[64]]}})
    with caplog.at_level("WARNING", logger="dippm_nas.nni._tuner"):
        p = t.generate_parameters(0)
    assert p[PARAMETERS_KEY]["predicted"]["source"] == "analytic"
    assert "has not seen dtype bfloat16" in caplog.text


def test_float32_on_the_a100_is_predicted_by_the_checkpoint(caplog: pytest.LogCaptureFixture) -> None:
    t = make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, dtype="float32")
    t.update_search_space({"hidden": {"_type": "choice", "_value": [[64]]}})
    with caplog.at_level("WARNING", logger="dippm_nas.nni._tuner"):
        p = t.generate_parameters(0)
    assert p[PARAMETERS_KEY]["predicted"]["source"] in ("predicted", "analytic")  # analytic: beyond validated_max
    assert "has not seen dtype" not in caplog.text
    import dippm_nas
    import search_spaces

    cfg = {"in_features": 32, "out_features": 4, "hidden": [64]}
    spec = search_spaces.get_space("mlp").input_spec(search_spaces.get_space("mlp").validate(cfg), batch_size=8)
    pred = dippm_nas.predict(search_spaces.build_model("mlp", cfg), spec, device="a100-sxm4-40gb", mig=False)
    assert pred.details["dtype_unseen"] == 0.0  # fp32 is a dtype the A100 checkpoint trained on


@pytest.mark.filterwarnings("ignore:`constraints_func` has been deprecated:FutureWarning")
def test_optuna_4_gets_the_constraints_through_constraints_func(monkeypatch: pytest.MonkeyPatch) -> None:
    nni = needs_nni()
    import dippm_nas.nni._tuner as tuner_mod

    monkeypatch.setattr(tuner_mod, "optuna_has_set_constraint", lambda: False)
    t = make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, sampler="tpe",
                   budgets={"latency_ms": 1e-6, "k_sigma": 0})
    t.update_search_space({"hidden": {"_type": "choice", "_value": [[64], [128]]}})
    with pytest.raises(nni.NoMoreTrialError):
        t.generate_parameters(0)  # everything is over a 1 ns budget
    told = [x for x in t.study.trials if x.user_attrs.get("dippm_status") == "skipped_infeasible"]
    assert len(told) == 2 and "latency_ms" not in getattr(told[0], "constraints", {})  # no set_constraint
    func = t.study.sampler._constraints_func
    assert func(told[0]) == told[0].user_attrs["dippm_constraints"] and func(told[0])[0] > 0
    # what the sampler recorded from constraints_func (Optuna 5 keeps it under the index '0', Optuna 4 in
    # system_attrs["constraints"])
    recorded = list(told[0].constraints.values()) if hasattr(told[0], "constraints") else \
        list(told[0].system_attrs["constraints"])
    assert recorded == told[0].user_attrs["dippm_constraints"]


# ------------------------------------------------------------------------------ storage, resume, import_data

def _builder_tuner(tmp_path: Path, **kw):
    return make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, sampler="nsga2",
                      population_size=4, storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="resume-test",
                      budgets={"latency_ms": 50.0}, **kw)


MLP_SPACE = {"hidden": {"_type": "choice", "_value": [[64], [128], [256]]},
             "lr": {"_type": "choice", "_value": [0.1]}}


def test_a_restarted_tuner_counts_each_status_of_the_stored_trials(tmp_path: Path) -> None:
    needs_nni()
    import optuna

    first = _builder_tuner(tmp_path)
    first.update_search_space(MLP_SPACE)
    statuses = ["trained", "failed", "imported", "skipped_infeasible", "skipped_infeasible_repeat",
                "skipped_duplicate", "skipped_invalid", "skipped_invalid", ["not", "a", "status"]]
    for i, st in enumerate(statuses):
        trial = first.study.ask()
        trial.set_user_attr("dippm_status", st)
        trial.set_user_attr("dippm_config", f"cfg{i}")
        first.study.tell(trial, state=optuna.trial.TrialState.FAIL)
    del first

    again = _builder_tuner(tmp_path)
    again.update_search_space(MLP_SPACE)
    s = again.stats
    assert s.loaded == len(statuses) and s.proposed == 2  # "trained" and "failed" went to NNI
    assert (s.results, s.failed, s.imported) == (1, 1, 1)
    assert (s.skipped_infeasible, s.skipped_duplicate, s.skipped_invalid) == (2, 1, 2)
    assert s.infeasible_configs == ["cfg3"]


def test_a_restarted_tuner_resumes_its_study_and_import_data_tells_the_running_trial(tmp_path: Path) -> None:
    nni = needs_nni()
    first = _builder_tuner(tmp_path)
    first.update_search_space(MLP_SPACE)
    p0, p1 = first.generate_parameters(0), first.generate_parameters(1)
    first.receive_trial_result(0, p0, {"default": 0.5, "accuracy": 0.5})  # p1 still running when NNI stops
    del first

    again = _builder_tuner(tmp_path)  # what `nnictl resume` starts: a new process, the same class args
    again.update_search_space(MLP_SPACE)  # NNI's first call opens the study and reloads its trials
    assert again.stats.loaded == 2 and again.stats.proposed == 2 and again.stats.results == 1
    # on resume NNI sends every finished trial, then the result of the one that was running
    again.import_data([{"parameter": p0, "value": {"default": 0.5, "accuracy": 0.5}}])
    again.import_data([{"parameter": p1, "value": {"default": 0.6, "accuracy": 0.6}}])
    states = {tr.number: tr.state.name for tr in again.study.trials}
    assert states == {0: "COMPLETE", 1: "COMPLETE"} and again.study.trials[1].values[0] == 0.6
    assert again.stats.results == 2 and again.stats.imported == 0  # nothing added twice
    # the third config is the only one left; then nothing is proposed twice
    p2 = again.generate_parameters(0)  # NNI may restart parameter ids at 0
    assert sorted(json.dumps(p["hidden"]) for p in (p0, p1, p2)) == ["[128]", "[256]", "[64]"]
    with pytest.raises(nni.NoMoreTrialError):
        again.generate_parameters(1)
    stats = json.loads(json.dumps(again.stats.__dict__))
    assert stats["proposed"] == 3


def test_a_stored_study_with_other_objectives_is_refused(tmp_path: Path) -> None:
    _builder_tuner(tmp_path).update_search_space(MLP_SPACE)
    with pytest.raises(DippmNasError, match="has objectives \\['accuracy', 'latency_ms'\\]"):
        _builder_tuner(tmp_path, objectives=["accuracy", "memory_mib"]).update_search_space(MLP_SPACE)
    with pytest.raises(DippmNasError, match="has directions \\['maximize', 'minimize'\\]"):
        _builder_tuner(tmp_path, directions=["minimize", "minimize"]).study
    with pytest.raises(DippmNasError, match="storage must be an Optuna storage URL"):
        make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, storage="")


def test_import_data_adds_foreign_results_as_completed_trials(caplog: pytest.LogCaptureFixture) -> None:
    nni = needs_nni()
    t = make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, budgets={"latency_ms": 50.0})
    t.update_search_space({"hidden": {"_type": "choice", "_value": [[64], [128]]},
                           "lr": {"_type": "quniform", "_value": [0.1, 1.0, 0.1]}})
    records = [
        {"parameter": {"hidden": [64], "lr": 0.5}, "value": {"default": 0.7, "accuracy": 0.7}},
        {"parameter": {"hidden": [128], "lr": 0.2}, "value": 0.4},                       # a plain number
        {"parameter": {"hidden": [64], "lr": 0.55}, "value": 0.1},                       # not a q value
        {"parameter": {"hidden": [999], "lr": 0.5}, "value": 0.1},                       # not a choice
        {"parameter": {"hidden": [64]}, "value": 0.1},                                   # lacks lr
        {"parameter": {"hidden": [128], "lr": 0.3}, "value": {"default": 0.3}},          # no accuracy
        "garbage",
    ]
    with caplog.at_level("WARNING", logger="dippm_nas.nni._tuner"):
        t.import_data(records)
    assert t.stats.imported == 2 and t.stats.import_rejected == 5
    for why in ("not a value it takes", "not one of the choices", "lacks search-space keys ['lr']",
                "has no 'accuracy'", "must be {'parameter'"):
        assert why in caplog.text
    done = [tr for tr in t.study.trials if tr.state.name == "COMPLETE"]
    assert [tr.values[0] for tr in done] == [0.7, 0.4]
    assert done[0].params == {"hidden": 0, "lr": 0.5} and done[0].user_attrs["dippm_status"] == "imported"
    assert done[0].values[1] == done[0].user_attrs["predicted_latency_ms"]
    assert latency_constraint(done[0]) == pytest.approx(-done[0].user_attrs["margin_latency_ms"])
    # the imported parameter sets are never proposed
    proposed = []
    with pytest.raises(nni.NoMoreTrialError):
        for pid in range(30):
            proposed.append(t.generate_parameters(pid))
    assert {"hidden": [64], "lr": 0.5} not in [{k: p[k] for k in ("hidden", "lr")} for p in proposed]
    with pytest.raises(DippmNasError, match="list of"):
        t.import_data({"parameter": {}})


def test_import_data_before_the_search_space_is_an_error() -> None:
    t = make_tuner(builder="mlp", base_config={"in_features": 32, "out_features": 4})
    with pytest.raises(DippmNasError, match="before update_search_space"):
        t.import_data([])


def test_nested_and_q_types_drive_the_tuner(factory: str) -> None:
    t = make_tuner(model_factory=factory.replace(":build", ":build_nested"), input_shape=[8])
    t.update_search_space({"arch": {"_type": "choice", "_value": [
        {"_name": "narrow", "width": {"_type": "quniform", "_value": [8, 24, 8]}},
        {"_name": "wide", "width": {"_type": "qloguniform", "_value": [32, 64, 32]}}]}})
    seen = []
    for pid in range(3):
        p = t.generate_parameters(pid)
        arch = p["arch"]
        assert {"narrow": (8.0, 16.0, 24.0), "wide": (32.0, 64.0)}[arch["_name"]].count(arch["width"]) == 1
        assert p[PARAMETERS_KEY]["model_params"] == {"arch": arch}
        assert math.isfinite(p[PARAMETERS_KEY]["predicted"]["latency_ms"])
        seen.append(json.dumps(arch, sort_keys=True))
    assert len(set(seen)) == 3  # never the same parameter set twice
