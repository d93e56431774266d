"""One trial record (``dippm_nas.trial.TrialRecord``) written by ``HardwareCostModel`` and ``HardwareAwareTuner`` and
read by ``ParetoValidator``: the round trip through user attributes, the names read for one release, and an NNI
tuner's study validated as an Optuna one is (validator, queue and local worker; measurements faked)."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pytest

from dippm_nas.budgets import Budgets
from dippm_nas.errors import InvalidValueError
from dippm_nas.measure import Measurement
from dippm_nas.prediction import Prediction
from dippm_nas.spec import InputSpec
from dippm_nas.trial import REBUILD_ATTRS, TrialRecord

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # "no trained checkpoint" / "uncalibrated"

SPEC = InputSpec(shape=(32,), batch_size=8)
CONFIG = {"in_features": 32, "out_features": 4, "hidden": [16], "activation": "relu", "norm": "none"}


def _prediction(**kw: Any) -> Prediction:
    args = dict(latency_ms=2.0, energy_j=0.5, memory_mib=300.0, latency_source="predicted", energy_source="analytic",
                memory_source="analytic", device="a100-sxm4-40gb", batch_size=8, dtype="float32",
                latency_ms_std=0.4, energy_j_std=None, memory_mib_std=30.0, host_ms=1.5, gpu_ms=1.9,
                details={"adaptation_version": 3, "adaptation_rows": 12})
    args.update(kw)
    return Prediction(**args)


def _record() -> TrialRecord:
    p = _prediction()
    checks = Budgets(latency_ms=2.5, energy_j=1.0, k_sigma=1.0).check(p)
    return TrialRecord.of(p, checks, deployment={"runtime": "eager"}, input_spec=SPEC, search_space="mlp",
                          search_space_config=CONFIG, cost_model_s=0.01)


def test_the_record_round_trips_through_user_attributes() -> None:
    rec = _record()
    attrs = rec.to_attrs()
    assert TrialRecord.from_attrs(attrs) == rec
    # the names users read, units in the keys
    assert attrs["predicted_latency_ms"] == 2.0 and attrs["predicted_latency_ms_std"] == 0.4
    assert attrs["latency_source"] == "predicted" and attrs["predicted_energy_j_std"] is None
    assert attrs["constraint_latency_ms"] == pytest.approx(2.0 + 0.4 - 2.5)
    assert attrs["margin_latency_ms"] == pytest.approx(-attrs["constraint_latency_ms"]) == rec.margins["latency_ms"]
    assert attrs["std_missing_energy_j"] is True and attrs["budget_energy_j"] == 1.0
    assert attrs["feasible"] is True and rec.feasible and attrs["runtime"] == "eager"
    assert attrs["adaptation_version"] == 3 and attrs["adaptation_rows"] == 12
    assert all(k in attrs for k in REBUILD_ATTRS) and rec.rebuildable
    assert rec.relative_std() == pytest.approx(0.2)  # latency: 0.4 / 2.0
    over = dataclasses.replace(rec, constraints={"latency_ms": 0.3})
    assert not over.feasible and TrialRecord.from_attrs(over.to_attrs()).constraints == {"latency_ms": 0.3}


def test_a_trial_without_a_prediction_has_no_record() -> None:
    with pytest.raises(InvalidValueError, match="hold no prediction"):
        TrialRecord.from_attrs({"cost_model_error": "GraphCaptureError: no export"})
    with pytest.raises(InvalidValueError, match="search_space and search_space_config"):
        TrialRecord.of(_prediction(), {}, deployment={}, search_space="mlp")


def test_the_names_of_the_earlier_nni_attributes_are_read_with_a_deprecation_warning() -> None:
    legacy = {"dippm_predicted": {"latency_ms": 2.0, "energy_j": None, "memory_mib": 300.0, "latency_ms_std": 0.4,
                                  "energy_j_std": None, "memory_mib_std": None, "mig": "1g.5gb", "source": "predicted"},
              "margin_latency_ms": 0.1, "search_space": "mlp", "config": CONFIG, "input_spec": SPEC.to_dict()}
    with pytest.warns(DeprecationWarning, match="'dippm_predicted' is deprecated.*removed in dippm-nas 0.2"):
        with pytest.warns(DeprecationWarning, match="'config'.*search_space_config"):
            rec = TrialRecord.from_attrs(legacy)
    assert (rec.latency_ms, rec.latency_ms_std, rec.latency_source) == (2.0, 0.4, "predicted")
    assert rec.mig_smallest_fit == "1g.5gb" and rec.constraints == {"latency_ms": -0.1}
    assert rec.search_space_config == CONFIG and rec.rebuildable


def test_the_cost_model_writes_the_record() -> None:
    from dippm_nas.optuna import HardwareCostModel

    import search_spaces as ss

    cost = HardwareCostModel("host-cpu", budgets={"latency_ms": 1e3}, objectives=("latency_ms",))
    study = cost.create_study()
    trial = study.ask()
    model = ss.build_model("mlp", CONFIG)
    latency = cost.evaluate(trial, model, SPEC)
    study.tell(trial, (0.5, latency))  # Optuna reads the figures: the record is written by then
    (ft,) = study.trials
    rec = TrialRecord.from_attrs(ft.user_attrs)
    assert rec.latency_ms == pytest.approx(ft.values[1]) and rec.device == "host-cpu"
    assert (rec.search_space, rec.search_space_config, rec.input_spec) == ("mlp", CONFIG, SPEC)
    assert set(rec.to_attrs()) <= set(ft.user_attrs)


class _FakeMeasure:
    """A measurement per job (no timing): latency 1 ms, memory 10 MiB."""

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []

    def __call__(self, model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
        self.configs.append(dict(model.search_space_config))
        return Measurement(latency_ms=1.0, latency_ms_std=0.01, energy_j=None, memory_mib=10.0,
                           memory_source="rss_delta", n_repeats=5, device="cpu", environment={"fake": True},
                           energy_reason="no energy counter in this test", batch_size=spec.batch_size,
                           dtype=spec.dtype)


def _validate(study: optuna.Study) -> tuple[Any, _FakeMeasure]:
    from dippm_nas.validation import ParetoValidator

    fake = _FakeMeasure()
    v = ParetoValidator("host-cpu", mode="local", max_per_round=5, measure_fn=fake)
    return v.run_round(study), fake


def test_the_validator_and_its_worker_validate_an_nni_tuner_study_as_an_optuna_one() -> None:
    pytest.importorskip("nni", reason="needs NNI (pip install -e '.[nni]'; the dev extra includes it)")
    from dippm_nas.nni import HardwareAwareTuner
    from dippm_nas.optuna import HardwareCostModel

    import search_spaces as ss

    base = {"in_features": 32, "out_features": 4}
    tuner = HardwareAwareTuner(builder="mlp", base_config=base, batch_size=8, device="host-cpu", seed=0,
                               sampler="random")
    tuner.update_search_space({"hidden": {"_type": "choice", "_value": [[8], [16], [32]]}})
    for pid in range(3):
        params = tuner.generate_parameters(pid)
        tuner.receive_trial_result(pid, params, {"default": 0.5, "accuracy": 0.5 + 0.1 * pid})
    nni_report, nni_fake = _validate(tuner.study)

    cost = HardwareCostModel("host-cpu", objectives=("latency_ms",))
    study = cost.create_study()
    for hidden in ([8], [16], [32]):
        cfg = ss.get_space("mlp").validate({**base, "hidden": hidden})
        trial = study.ask()
        latency = cost.evaluate(trial, ss.build_model("mlp", cfg), ss.get_space("mlp").input_spec(cfg, batch_size=8))
        study.tell(trial, (0.5 + len(hidden) * hidden[0] / 100, latency))
    optuna_report, optuna_fake = _validate(study)

    for report, fake, s in ((nni_report, nni_fake, tuner.study), (optuna_report, optuna_fake, study)):
        front = {t.number for t in s.best_trials}
        assert report.enqueued and set(report.enqueued) == front and report.skipped == []
        assert report.measured == len(report.enqueued) == len(fake.configs)  # the local worker measured them
        for n in report.enqueued:
            rec = TrialRecord.from_attrs(s.trials[n].user_attrs)
            assert rec.search_space == "mlp" and rec.search_space_config in fake.configs
            assert rec.input_spec == InputSpec(shape=(32,), batch_size=8, dtype="float32")
        assert s.user_attrs["dippm_validation"]["measured"] == report.measured
    # both integrations write the same record schema
    nni_attrs = next(t.user_attrs for t in tuner.study.trials if t.number in nni_report.enqueued)
    optuna_attrs = next(t.user_attrs for t in study.trials if t.number in optuna_report.enqueued)
    assert set(TrialRecord.from_attrs(nni_attrs).to_attrs()) == set(TrialRecord.from_attrs(optuna_attrs).to_attrs())


# ------------------------------------------------------------------------------------------- hostile attributes
_GOOD = {"predicted_latency_ms": 2.0, "predicted_latency_ms_std": 0.5, "predicted_memory_mib": 100.0}


@pytest.mark.parametrize("attrs, match", [
    (None, "must be a mapping"),
    ("predicted_latency_ms", "must be a mapping"),
    ([("predicted_latency_ms", 1.0)], "must be a mapping"),
    ({**_GOOD, "predicted_latency_ms": "fast"}, "predicted_latency_ms must be a number, got str 'fast'"),
    ({**_GOOD, "predicted_latency_ms": [1.0]}, "predicted_latency_ms must be a number, got list"),
    ({**_GOOD, "predicted_latency_ms_std": "0.5"}, "predicted_latency_ms_std must be a number"),
    ({**_GOOD, "predicted_memory_mib": True}, "predicted_memory_mib must be a number, got bool"),
    ({**_GOOD, "predicted_memory_mib": 10**400}, "float range"),
    ({**_GOOD, "latency_source": 3}, "latency_source must be a string"),
    ({**_GOOD, "unknown_ops": "conv"}, "unknown_ops must map operator names to counts"),
    ({**_GOOD, "unknown_ops": ["conv"]}, "unknown_ops must map operator names to counts"),
    ({**_GOOD, "constraint_latency_ms": "x"}, "constraint_latency_ms must be a number"),
    ({**_GOOD, "margin_latency_ms": None}, "margin_latency_ms must be a number"),
    ({**_GOOD, "budget_latency_ms": [1], "constraint_latency_ms": 1.0}, "budget_latency_ms must be a number"),
    ({**_GOOD, "input_spec": "1x3x224x224"}, "input_spec must be an InputSpec dict"),
    ({**_GOOD, "input_spec": {"shape": "abc", "batch_size": 1, "dtype": "float32"}}, "input_spec"),
    ({**_GOOD, "search_space": "mlp", "search_space_config": [1, 2]}, "search_space_config must be a JSON object"),
    ({**_GOOD, "adaptation_version": "3"}, "adaptation_version must be an int"),
    ({"dippm_predicted": {"latency_ms": "1", "memory_mib": 2.0}}, "dippm_predicted.latency_ms must be a number"),
])
def test_from_attrs_names_the_odd_attribute_instead_of_crashing(attrs: Any, match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        TrialRecord.from_attrs(attrs)


def test_relative_std_skips_figures_that_are_not_numbers() -> None:
    rec = TrialRecord.from_attrs(_GOOD)
    assert rec.relative_std() == pytest.approx(0.25)
    odd = dataclasses.replace(rec, latency_ms_std="0.5", memory_mib_std=[1.0], energy_j="x")  # type: ignore[arg-type]
    assert odd.relative_std() is None
    assert dataclasses.replace(rec, latency_ms=float("nan")).relative_std() is None


def _generation_record() -> TrialRecord:
    from dippm_nas.llm import DecoderConfig, LLMWorkload, predict_generation

    cfg = DecoderConfig(name="tiny", model_type="llama", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=4,
                        head_dim=64, intermediate_size=512, vocab_size=1000, max_positions=1024, rotary_dim=64)
    p = predict_generation(cfg, LLMWorkload(64, 16, 2), "a100-sxm4-80gb")
    checks = Budgets(decode_ms_per_token=1e6, mig_profile="1g.10gb").check(p)
    return TrialRecord.of_generation(p, checks, deployment={"runtime": "eager"}, mig_profile="1g.10gb",
                                     cost_model_s=0.02)


def test_a_generation_record_round_trips_and_is_the_same_record_type() -> None:
    rec = _generation_record()
    attrs = rec.to_attrs()
    assert TrialRecord.from_attrs(attrs) == rec
    g = rec.generation
    assert g is not None and g.model == "tiny" and g.workload["prompt_len"] == 64 and g.tensor_parallel == 1
    assert g.mig_profile == "1g.10gb" and attrs["generation"]["sources"] == g.sources
    assert attrs["predicted_decode_ms_per_token"] == g.figures["decode_ms_per_token"]
    assert "predicted_latency_ms" not in attrs and rec.latency_ms is None and attrs["deployment"]["runtime"] == "eager"
    assert rec.constraints and rec.feasible == attrs["feasible"]
    rel = rec.relative_std()
    assert rel is not None and rel > 0
    assert not rec.rebuildable and "LLM generation" in (rec.not_rebuildable_reason or "")


def test_the_earlier_generation_attributes_are_read_with_a_deprecation_warning() -> None:
    rec = _generation_record()
    g = rec.generation
    assert g is not None
    old: dict[str, Any] = {k: v for k, v in rec.to_attrs().items() if k not in ("generation", "deployment")}
    old.update({f"source_{n}": s for n, s in g.sources.items()})
    old.update({"llm_model": g.model, "workload": g.workload, "engine": g.engine, "mig_profile": g.mig_profile,
                "fits": g.fits, "fit_reason": g.fit_reason})
    with pytest.warns(DeprecationWarning, match="'source_<figure>' is deprecated.*generation\\['sources'\\]"):
        back = TrialRecord.from_attrs(old)
    assert back.generation == g and back.constraints == rec.constraints and back.runtime == "eager"
