"""The Optuna examples (``examples/optuna/``) run end to end on a tiny budget, on one SQLite storage."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from dippm_nas.optuna import optuna_has_set_constraint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "optuna"


def _main(name: str) -> Any:
    """The ``main`` of ``examples/optuna/<name>.py`` (loaded without running it)."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=f"example_{name}")["main"]


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("sklearn", reason="the examples train on scikit-learn's digits (pip install 'dippm-nas[demo]')")
    return f"sqlite:///{tmp_path_factory.mktemp('optuna-examples') / 'nas.db'}"


def test_multi_objective_study_with_constraints(storage: str, capsys: pytest.CaptureFixture) -> None:
    _main("multi_objective")(["--trials", "2", "--train-seconds", "0.1", "--storage", storage,
                              "--validate-on", "host-cpu"])
    out = capsys.readouterr().out
    assert "Pareto front of digits-a100" in out and f"optuna-dashboard {storage}" in out
    study = optuna.load_study(study_name="digits-a100", storage=storage)
    assert study.metric_names == ["accuracy", "latency_ms"] and study.directions == [
        optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == 2
    for t in trials:
        a = t.user_attrs
        # the checkpoint's figure, or its prior for a graph beyond the novelty its correction was validated to
        assert a["latency_source"] in ("predicted", "analytic") and a["input_spec"]["dtype"] == "float16"
        assert a["budget_latency_ms"] == 20.0 and a["budget_memory_mib"] > 0  # 1g.5gb's usable memory
        assert t.values[1] == pytest.approx(a["predicted_latency_ms"])
        expected = [a["constraint_latency_ms"], a["constraint_memory_mib"]]
        if optuna_has_set_constraint():  # Optuna 5: each constraint once, by name
            assert t.constraints == pytest.approx(dict(zip(("latency_ms", "memory_mib"), expected)))
            assert "constraints" not in t.system_attrs
        else:  # Optuna 4: through the sampler's constraints_func
            assert t.system_attrs["constraints"] == pytest.approx(expected)
    # the Pareto front is queued for the validation worker, in float32 at batch 64 on the host CPU
    from dippm_nas.validation import JobQueue

    jobs = JobQueue(storage).jobs(study="digits-a100", device="host-cpu")
    assert jobs and {j.status for j in jobs} == {"queued"}
    assert {(j.spec["dtype"], j.spec["batch_size"]) for j in jobs} == {("float32", 64)}


def test_validation_worker_measures_the_queued_front(storage: str, capsys: pytest.CaptureFixture) -> None:
    from dippm_nas.validation import JobQueue

    if not JobQueue(storage).jobs(study="digits-a100"):
        pytest.skip("needs the queue test_multi_objective_study_with_constraints fills")
    _main("validation_worker")(["--storage", storage, "--study", "digits-a100", "--time-cap", "0.5"])
    out = capsys.readouterr().out
    assert "latency MAPE" in out
    q = JobQueue(storage)
    assert {j.status for j in q.jobs(study="digits-a100")} == {"done"}
    recs = q.results(study="digits-a100", device="host-cpu")
    assert recs and all(r.status == "ok" and r.measured_latency_ms > 0 and r.predicted_latency_ms > 0 for r in recs)


def test_ask_tell_batch_loop(storage: str, capsys: pytest.CaptureFixture) -> None:
    _main("ask_tell_batch")(["--trials", "4", "--batch-size", "2", "--train-seconds", "0.1", "--storage", storage])
    out = capsys.readouterr().out
    assert out.count("batch of 2: predicted in") == 2 and "4/4 told" in out
    study = optuna.load_study(study_name="digits-a100-batch", storage=storage)
    assert study.metric_names == ["accuracy", "latency_ms", "energy_j"]
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 4
    for t in done:
        assert t.values[1] == pytest.approx(t.user_attrs["predicted_latency_ms"])
        assert "constraint_latency_ms" in t.user_attrs and "constraint_memory_mib" in t.user_attrs


def test_llm_architecture_search_meets_a_time_per_token_slo_on_a_mig_slice(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("transformers", reason="the example builds transformers decoders on the meta device")
    study = _main("llm_architecture")(["--trials", "3", "--slo-ms", "40", "--batch", "4", "--prompt", "128",
                                       "--output", "32"])
    out = capsys.readouterr().out
    assert "1g.10gb" in out and "tok/s/W" in out
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        a = t.user_attrs
        assert a["generation"]["mig_profile"] == "1g.10gb" and a["budget_decode_ms_per_token"] == 40.0
        assert t.values[1] == pytest.approx(a["predicted_energy_j_per_token"])
        assert a["params"] == t.values[0] > 0


def test_noise_aware_sampler_weighs_each_trial_by_its_own_sigma() -> None:
    study = _main("noise_aware_sampler")(["--trials", "6", "--startup", "4"])
    sampler = study.sampler
    assert len(study.trials) == 6 and len(sampler.noise_log_var) == 2  # the GP chose trials 4 and 5
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    for fit in sampler.noise_log_var:
        # the noise variance of trial i is its own predicted σ in log space, squared: not one value for all
        expected = [(t.user_attrs["predicted_latency_ms_std"] / t.user_attrs["predicted_latency_ms"]) ** 2
                    for t in done[:fit.size]]
        assert fit == pytest.approx(expected, rel=1e-9)
        assert np.ptp(fit) > 0
