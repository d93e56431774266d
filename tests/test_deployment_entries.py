"""The Deployment at every entry that predicts: ``predict``, ``predict_many``, ``HardwareCostModel``, the NNI
tuner and ``report``, ``ParetoValidator``, the CLI; the ``runtime=`` / ``host=`` keywords that build it; what
is recorded (``details``, trial attributes, the tuner's parameters, validation jobs, ``gpu-campaign`` rows); bad
input named with its field, value and choices; and the ``deployment`` verb with its ``host-profile`` alias."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest

import dippm_nas
import search_spaces as ss
from dippm_nas import Deployment, DeploymentError, InputSpec
from dippm_nas.cli import main
from dippm_nas.devices import HostProfile, load_host_profile
from dippm_nas.errors import DeviceError, DippmNasError, ExecutionRuntimeError
from dippm_nas.optuna import Budgets, HardwareCostModel

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # "no trained checkpoint" / "uncalibrated"
optuna.logging.set_verbosity(optuna.logging.WARNING)

DEV = "a100-sxm4-40gb"
MLP = {"in_features": 32, "hidden": [64], "out_features": 4}
SPEC = ss.get_space("mlp").input_spec(MLP, batch_size=8, dtype="float16")
HOST = HostProfile.from_clock(2.25, framework="torch-1", name="epyc-7742")
DESCRIBED = Deployment(runtime="cuda-graphs", host=HOST, framework="torch-1", tf32_matmul=True, tf32_conv=True,
                       autocast="float16", input_copy="pinned", versions={"torch": "1.10.0"})

#: bad deployments, as a mapping of fields, and the field the error must name
BAD = [
    ({"autocast": "fp16"}, "autocast", "'fp16'", "float16"),
    ({"input_copy": True}, "input_copy", "True", "pageable"),
    ({"runtime": "tensorrt"}, "runtime", "'tensorrt'", "cuda-graphs"),
    ({"framework": "jax"}, "framework", "'jax'", "torch-2"),
    ({"tf32_matmul": "yes"}, "tf32_matmul", "'yes'", "true, false or None"),
    ({"channels_last": math.nan}, "channels_last", "nan", "finite"),
    ({"runtme": "eager"}, "runtme", "runtme", "runtime"),
]


@pytest.fixture(scope="module")
def graph() -> Any:
    return dippm_nas.capture(ss.build_model("mlp", MLP), SPEC)


def _raises_named(fn: Any, fields: dict[str, Any], field: str, value: str, choice: str) -> None:
    with pytest.raises(DeploymentError) as e:
        fn(fields)
    text = str(e.value)
    assert field in text and value in text and choice in text, text


# ------------------------------------------------------------------------------------------------ predict
def test_predict_takes_a_deployment_as_an_object_a_mapping_or_a_file(graph: Any, tmp_path: Path) -> None:
    p = dippm_nas.predict(graph, device=DEV, deployment=DESCRIBED)
    assert p.labels["deployment"] == DESCRIBED.label and p.labels["runtime"] == "cuda-graphs"
    for form in (DESCRIBED.to_dict(), DESCRIBED.save(tmp_path / "d.toml"), str(DESCRIBED.save(tmp_path / "d.json"))):
        q = dippm_nas.predict(graph, device=DEV, deployment=form)
        assert q == p


def test_runtime_and_host_keywords_build_the_deployment(graph: Any, tmp_path: Path) -> None:
    HOST.save(tmp_path / "host.json")
    legacy = dippm_nas.predict(graph, device=DEV, runtime="compiled", host=str(tmp_path / "host.json"))
    same = dippm_nas.predict(graph, device=DEV, deployment=Deployment(runtime="compiled", host=HOST,
                                                                      framework="torch-1"))
    assert legacy == same and legacy.labels["deployment"].startswith("compiled, host epyc-7742")
    # a keyword may fill what the deployment leaves undescribed, never contradict it
    filled = dippm_nas.predict(graph, device=DEV, deployment=Deployment(runtime="compiled"), host=HOST)
    assert filled == same
    with pytest.raises(DeploymentError, match=r"runtime='eager' conflicts with the deployment's runtime 'compiled'"):
        dippm_nas.predict(graph, device=DEV, deployment=Deployment(runtime="compiled"), runtime="eager")
    other = HostProfile.from_clock(3.5, name="fast")
    with pytest.raises(DeploymentError, match="host='fast' conflicts with the deployment's host 'epyc-7742'"):
        dippm_nas.predict(graph, device=DEV, deployment=DESCRIBED, host=other)
    with pytest.raises(ExecutionRuntimeError, match="eager.*cuda-graphs.*compiled"):
        dippm_nas.predict(graph, device=DEV, runtime="tensorrt")
    with pytest.raises(DeviceError, match="cannot read host profile"):
        dippm_nas.predict(graph, device=DEV, host=str(tmp_path / "missing.json"))


@pytest.mark.parametrize("fields, field, value, choice", BAD)
def test_a_bad_deployment_names_its_field_value_and_choices_at_predict(graph: Any, fields: dict[str, Any],
                                                                       field: str, value: str, choice: str) -> None:
    _raises_named(lambda d: dippm_nas.predict(graph, device=DEV, deployment=d), fields, field, value, choice)


def test_bad_forms_of_a_deployment(graph: Any, tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match=r"deployment must be a Deployment.*got int: 3"):
        dippm_nas.predict(graph, device=DEV, deployment=3)
    with pytest.raises(DeploymentError, match="Deployment.runtime must be one of .* here, got 'serving'.*llm"):
        dippm_nas.predict(graph, device=DEV, deployment=Deployment(runtime="serving"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"autocast": "int8"}))
    with pytest.raises(DeploymentError, match=r"bad\.json.*autocast.*'int8'"):
        dippm_nas.predict(graph, device=DEV, deployment=bad)


def test_predict_many_checks_the_deployment_before_converting_and_records_it(graph: Any) -> None:
    with pytest.raises(DeploymentError, match="autocast"):
        dippm_nas.predict_many([(ss.build_model("mlp", MLP), SPEC)], DEV, deployment={"autocast": "fp8"})
    (p,) = dippm_nas.predict_many([graph], DEV, deployment=DESCRIBED)
    assert p == dippm_nas.predict(graph, device=DEV, deployment=DESCRIBED)


def test_cached_predictions_are_per_deployment(graph: Any) -> None:
    """The same graph on the same predictor under several deployments: each answer is its own deployment's,
    and asking again returns the same answer (a prediction cache keyed without the deployment would hand
    the first one's to the others)."""
    deps = [Deployment(), DESCRIBED, dataclasses.replace(DESCRIBED, tf32_matmul=False),
            dataclasses.replace(DESCRIBED, input_copy="none")]
    first = [dippm_nas.predict(graph, device=DEV, deployment=d) for d in deps]
    assert [p.labels["deployment"] for p in first] == [d.label for d in deps]
    assert [p.labels["deployment_assumed"] for p in first] == [",".join(d.resolve().assumed) for d in deps]
    assert first[3].latency_ms < first[1].latency_ms  # no input copy in the timed region: less time
    assert len({d.key for d in deps}) == len(deps)
    again = [dippm_nas.predict(graph, device=DEV, deployment=d) for d in reversed(deps)]
    assert list(reversed(again)) == first


# ------------------------------------------------------------------------------------------------ Optuna
def test_the_cost_model_predicts_for_its_deployment_and_records_it_on_every_trial(graph: Any) -> None:
    cost = HardwareCostModel(DEV, Budgets(latency_ms=1e3), deployment=DESCRIBED.to_dict())
    assert cost.deployment == DESCRIBED
    study = cost.create_study()
    t = study.ask()
    values = cost.evaluate(t, graph)
    expected = dippm_nas.predict(graph, device=DEV, deployment=DESCRIBED)
    assert values == pytest.approx((expected.latency_ms, expected.energy_j))
    (t2,) = [study.ask()]
    (v2,) = cost.evaluate_many([t2], [(graph, None)])
    assert v2 == pytest.approx(values)
    for tr in (t, t2):
        study.tell(tr, (0.5, *values))
    for ft in study.trials:
        assert Deployment.from_dict(ft.user_attrs["deployment"]) == DESCRIBED
        assert ft.user_attrs["runtime"] == "cuda-graphs"
    legacy = HardwareCostModel(DEV, runtime="compiled", host=HOST)
    assert legacy.deployment == Deployment(runtime="compiled", host=HOST, framework=HOST.framework)


@pytest.mark.parametrize("fields, field, value, choice", BAD)
def test_a_bad_deployment_is_refused_by_the_cost_model(fields: dict[str, Any], field: str, value: str,
                                                       choice: str) -> None:
    _raises_named(lambda d: HardwareCostModel(DEV, deployment=d), fields, field, value, choice)


# ------------------------------------------------------------------------------------------------ NNI
def _tuner(**kw: Any) -> Any:
    pytest.importorskip("nni", reason="needs NNI (pip install -e '.[nni]')")
    from dippm_nas.nni import HardwareAwareTuner

    return HardwareAwareTuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, batch_size=8,
                              seed=0, sampler="random", budgets={"latency_ms": 1e3}, **kw)


@pytest.mark.parametrize("form", ["dict", "file"])
def test_the_tuner_takes_the_deployment_as_class_args_and_passes_it_to_the_trial(tmp_path: Path, form: str) -> None:
    from dippm_nas.nni import PARAMETERS_KEY, final_metrics, model_from_parameters, tuner_settings

    arg = DESCRIBED.to_dict() if form == "dict" else str(DESCRIBED.save(tmp_path / "dep.toml"))
    t = _tuner(deployment=json.loads(json.dumps(arg)))  # what NNI hands over: plain JSON
    assert t.deployment == DESCRIBED
    t.update_search_space({"hidden": {"_type": "choice", "_value": [[64]]}})
    p = t.generate_parameters(0)
    d = p[PARAMETERS_KEY]
    assert Deployment.from_dict(d["deployment"]) == DESCRIBED and d["runtime"] == "cuda-graphs"
    assert tuner_settings(p)["deployment"] == DESCRIBED
    (ft,) = t.study.trials
    assert Deployment.from_dict(ft.user_attrs["deployment"]) == DESCRIBED
    assert Deployment.from_dict(t.study.user_attrs["dippm_tuner"]["deployment"]) == DESCRIBED
    model, spec = model_from_parameters(p)
    metrics = final_metrics(0.9, model, parameters=p)  # the trial repeats nothing: the tuner's deployment
    assert metrics["latency_ms"] == pytest.approx(d["predicted"]["latency_ms"])
    # a runtime given in the trial replaces the tuner's; a deployment given replaces it whole
    eager = dippm_nas.predict(model, spec, DEV, deployment=dataclasses.replace(DESCRIBED, runtime="eager"))
    assert final_metrics(0.9, model, parameters=p, runtime="eager")["latency_ms"] == pytest.approx(eager.latency_ms)
    plain = dippm_nas.predict(model, spec, DEV, deployment=Deployment())
    assert final_metrics(0.9, model, parameters=p, deployment=Deployment())["latency_ms"] == \
        pytest.approx(plain.latency_ms)


def test_parameters_of_a_tuner_without_a_deployment_still_score() -> None:
    from dippm_nas.nni import PARAMETERS_KEY, tuner_settings

    assert tuner_settings({PARAMETERS_KEY: {"runtime": "compiled"}})["deployment"] == Deployment(runtime="compiled")
    with pytest.raises(DeploymentError, match="autocast"):
        tuner_settings({PARAMETERS_KEY: {"deployment": {"autocast": "fp16"}}})


@pytest.mark.parametrize("fields, field, value, choice", BAD)
def test_a_bad_deployment_is_refused_in_the_tuners_class_args(fields: dict[str, Any], field: str, value: str,
                                                              choice: str) -> None:
    _raises_named(lambda d: _tuner(deployment=d), fields, field, value, choice)


def test_a_tuner_class_arg_of_another_type_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match=r"got list"):
        _tuner(deployment=["eager"])
    with pytest.raises(DeploymentError, match="cannot read deployment"):
        _tuner(deployment=str(tmp_path / "missing.json"))


# ------------------------------------------------------------------------------------------------ validation
def test_the_validator_predicts_for_its_deployment_and_the_job_records_it() -> None:
    from dippm_nas.validation import ParetoValidator

    cost = HardwareCostModel(DEV, objectives=("latency_ms",))
    study = cost.create_study(leading={}, storage="sqlite://")
    t = study.ask()
    study.tell(t, cost.evaluate(t, ss.build_model("mlp", MLP), SPEC))
    dep = Deployment(framework="torch-2")
    v = ParetoValidator(DEV, mode="queue", every_n_trials=1, deployment=dep)
    assert v.deployment == dep
    assert v.run_round(study).enqueued == [0]
    (job,) = v.queue_for(study).jobs(study=study.study_name)
    assert Deployment.from_dict(job.predicted["deployment"]) == dep
    with pytest.raises(DeploymentError, match="input_copy"):
        ParetoValidator(DEV, mode="queue", deployment={"input_copy": "dma"})


# ------------------------------------------------------------------------------------------------ CLI
def _json_rows(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cli_flags_override_the_deployment_file(graph: Any, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    f = DESCRIBED.save(tmp_path / "dep.toml")
    argv = ["predict", "mlp_cli:build", "--shape", "32", "--batch", "8", "--dtype", "float16", "--json"]
    (tmp_path / "mlp_cli.py").write_text("import search_spaces as ss\n\ndef build():\n"
                                         f"    return ss.build_model('mlp', {MLP!r})\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        assert main([*argv, "--deployment", str(f)]) == 0
        (row,) = _json_rows(capsys)
        assert row["details"]["deployment"] == DESCRIBED.label
        changed = dataclasses.replace(DESCRIBED, runtime="eager", tf32_matmul=False, tf32_conv=False, autocast="none",
                                      input_copy="none", framework="torch-2")
        assert main([*argv, "--deployment", str(f), "--runtime", "eager", "--tf32", "off", "--autocast", "none",
                     "--input-copy", "none", "--framework", "torch-2"]) == 0
        (row,) = _json_rows(capsys)
        assert row["details"]["deployment"] == changed.label
        assert row["latency_ms"] == pytest.approx(dippm_nas.predict(graph, device=DEV, deployment=changed).latency_ms)
        # the flags alone, and the legacy --runtime/--host
        HOST.save(tmp_path / "host.json")
        assert main([*argv, "--tf32", "--runtime", "compiled", "--host", str(tmp_path / "host.json")]) == 0
        (row,) = _json_rows(capsys)
        assert row["details"]["deployment"] == Deployment(runtime="compiled", host=HOST, framework="torch-1",
                                                          tf32_matmul=True, tf32_conv=True).label
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("flags, needle", [
    (["--tf32", "maybe"], "argument --tf32: invalid choice: 'maybe' (choose from 'on', 'off')"),
    (["--autocast", "fp16"], "argument --autocast: invalid choice: 'fp16'"),
    (["--input-copy", "dma"], "argument --input-copy: invalid choice: 'dma'"),
    (["--runtime", "eagr"], "unknown runtime 'eagr'; did you mean: eager?"),
    (["--framework", "torch-3"], "argument --framework: invalid choice: 'torch-3'"),
    (["--deployment", "FILE:bad"], "--deployment: "),
    (["--deployment", "FILE:missing"], "cannot read deployment"),
    (["--host", "FILE:missing"], "cannot read host profile"),
])
def test_cli_bad_deployment_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   flags: list[str], needle: str) -> None:
    (tmp_path / "bad.toml").write_text('runtime = "eager"\nautocast = "int8"\n')
    files = {"FILE:bad": str(tmp_path / "bad.toml"), "FILE:missing": str(tmp_path / "missing.json")}
    flags = [files.get(f, f) for f in flags]
    assert main(["predict", "x", *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    if flags[-1] == files["FILE:bad"]:
        assert "autocast" in err and "'int8'" in err and "float16" in err


def test_cli_usage_error_under_json_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.json").write_text(json.dumps({"input_copy": "dma"}))
    assert main(["predict", "x", "--deployment", str(tmp_path / "d.json"), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit_status"] == 2 and "input_copy" in out["error"] and "'dma'" in out["error"]


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_the_deployment_verb_writes_this_machines_deployment(tmp_path: Path, suffix: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"dep{suffix}"
    assert main(["deployment", "--out", str(out), "--input-copy", "pinned", "--name", "this-host"]) == 0
    d = Deployment.load(out)
    assert d.input_copy == "pinned" and d.host is not None and d.host.name == "this-host"
    assert d.versions is not None and "torch" in d.versions and d.tf32_conv is not None
    assert f"wrote     {out}" in capsys.readouterr().out
    assert main(["predict", "x", "--deployment", "/"]) == 2  # a directory is not a deployment file


def test_host_profile_is_the_alias_writing_the_host_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "host.json"
    assert main(["host-profile", "--out", str(out), "--json"]) == 0
    prof = load_host_profile(out)
    assert json.loads(capsys.readouterr().out) == prof.to_dict()
    assert Deployment(host=str(out)).host == prof  # what --host FILE and Deployment(host=FILE) read


@pytest.mark.parametrize("verb", ["deployment", "host-profile"])
def test_an_unwritable_out_fails_before_the_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch, verb: str) -> None:
    def never(*a: Any, **k: Any) -> Any:
        raise AssertionError("the benchmark ran before --out was checked")

    monkeypatch.setattr(Deployment, "detect", classmethod(never))
    assert main([verb, "--out", str(tmp_path / "no" / "dir" / "d.json")]) == 2  # a usage error, naming --out
    err = capsys.readouterr().err
    assert "--out" in err and "does not exist" in err
    assert main([verb, "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ gpu-campaign
def test_campaign_rows_record_the_deployment_they_ran_under(tmp_path: Path) -> None:
    from dippm_nas.measure import Measurement, campaign_settings, read_campaign_rows, run_campaign

    class Fake:
        def measure(self, model: Any, spec: Any) -> Measurement:
            flags = {"cudnn_allow_tf32": True, "matmul_allow_tf32": False, "cudnn_benchmark": False}
            return Measurement(latency_ms=1.0, latency_ms_std=0.1, energy_j=None, memory_mib=10.0,
                               memory_source="torch_max_reserved", n_repeats=2, device="cuda:0",
                               environment={"flags": flags}, energy_reason="fake", batch_size=spec.batch_size,
                               dtype=spec.dtype)

    machine = Deployment(host=HOST, framework="torch-2", tf32_matmul=True, tf32_conv=True,
                         versions={"torch": "2.3.1"})
    settings = campaign_settings(warmup=1, min_repeats=2, max_repeats=2, channels_last=True)
    run_campaign(tmp_path, minutes=5, torch_device="cuda", measurer=Fake(), set_name="smoke",
                 runtimes=("eager", "compiled"), dtypes=("float32",), batches=(1,), settings=settings,
                 deployment=machine)
    rows = list(read_campaign_rows(tmp_path))
    assert {r["config"]["runtime"] for r in rows} == {"eager", "compiled"}
    for r in rows:
        d = Deployment.from_dict(r["conditions"]["deployment"])
        assert d == dataclasses.replace(machine, runtime=r["config"]["runtime"], tf32_matmul=False,
                                        cudnn_benchmark=False, channels_last=True, input_copy="none",
                                        autocast="none")  # the settings set no autocast: described as none
    assert Deployment.from_dict(json.loads((tmp_path / "campaign.json").read_text())["deployment"]) == machine


# ------------------------------------------------------------------------------------------------ evaluate
def test_evaluate_predicts_every_row_for_a_deployment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``evaluate_checkpoint(deployment=...)`` scores the predictions ``predict`` makes for that deployment; the CLI's
    deployment flags reach it, and the combinations it cannot answer are refused."""
    from dippm_nas.dataset import build_dataset
    from dippm_nas.measure import Measurement
    from dippm_nas.predictor import GnnPredictor, find_checkpoint
    from dippm_nas.training import evaluate_checkpoint, load_examples, split_examples

    def fake(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
        return Measurement(latency_ms=1.5 * spec.batch_size, latency_ms_std=0.1, energy_j=None, memory_mib=12.0,
                           memory_source="rss_delta", n_repeats=5, device=device, environment={"fake": True},
                           energy_reason="fake", batch_size=spec.batch_size, dtype=spec.dtype)

    db = tmp_path / "d.sqlite"
    build_dataset(db, spaces=["mlp"], n=12, batch_sizes=[1, 2, 4], workers=1, progress=False, measure_fn=fake,
                  mac_budget=50_000_000)
    ckpt = find_checkpoint("host-cpu")
    assert ckpt is not None
    res = evaluate_checkpoint(ckpt, [db], device="host-cpu", deployment={})
    assert Deployment.from_dict(res["deployment"]) == Deployment()
    _, _, te = split_examples(load_examples([db]))
    preds = GnnPredictor.load(ckpt, device="host-cpu", load_calibration=False).predict_graphs(
        [e.graph for e in te], mig=False, deployment=Deployment())
    assert res["n_test"] == len(te) == res["metrics"]["latency_ms"]["n"] > 0
    assert [r["latency_ms_pred"] for r in res["rows"]] == [p.latency_ms for p in preds]
    assert [r["latency_ms"] for r in res["rows"]] == [e.y["latency_ms"] for e in te]
    with pytest.raises(DippmNasError, match="own device"):
        evaluate_checkpoint(ckpt, [db], device="host-cpu", deployment={}, calibrate_ks=[2])
    with pytest.raises(DeploymentError, match="autocast"):
        evaluate_checkpoint(ckpt, [db], device="host-cpu", deployment={"autocast": "fp16"})
    out = tmp_path / "report.md"
    argv = ["evaluate", "--checkpoint", str(ckpt), "--data", str(db), "--device", "host-cpu", "--out", str(out),
            "--png", str(tmp_path / "p.png"), "--json"]
    if __import__("importlib.util").util.find_spec("matplotlib") is None:
        pytest.skip("the evaluate verb's PNG needs matplotlib")
    assert main([*argv, "--runtime", "eager"]) == 0
    printed, direct = json.loads(capsys.readouterr().out)["metrics"]["latency_ms"], res["metrics"]["latency_ms"]
    assert (printed["n"], printed["mape_pct"]) == (direct["n"], direct["mape_pct"])
    assert "predicted for the deployment: eager, host unknown" in out.read_text()
    assert main([*argv, "--runtime", "eager", "--calibrate", "2"]) == 2
    assert "own --device" in capsys.readouterr().out
