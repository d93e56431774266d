"""LLM-generation trials validated end to end on host-cpu: enqueued, timed (transformers' ``generate`` of a tiny
decoder with random weights), recorded; a trial the device cannot hold is skipped with its reason."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pytest

from dippm_nas.errors import ValidationError
from dippm_nas.llm import DecoderConfig, LLMWorkload
from dippm_nas.validation import (GENERATION_SPACE, JobQueue, ParetoValidator, generation_job_config,
                                  generation_skip_reason, measure_generation, predicted_generation)

pytest.importorskip("transformers", reason="measuring a generation needs transformers")

TINY = DecoderConfig(name="tiny", model_type="llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                     head_dim=16, intermediate_size=128, vocab_size=256, max_positions=256, rotary_dim=16)
#: A 70 B-class decoder: its float16 weights (~130 GiB) exceed any one catalogue GPU and this test's host-cpu budget.
HUGE = dataclasses.replace(TINY, name="huge", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                           head_dim=128, intermediate_size=28672, vocab_size=32000, max_positions=4096, rotary_dim=128)
WORKLOAD = LLMWorkload(prompt_len=8, output_len=4, batch_size=1)


def _generation_attrs(cfg: DecoderConfig, tensor_parallel: int = 1) -> dict[str, Any]:
    """The user attributes HardwareCostModel writes for a generation trial (predicted on an H100)."""
    from dippm_nas.optuna import HardwareCostModel

    cost = HardwareCostModel("h100-sxm5-80gb", objectives=("tokens_per_s",), overlap=False)
    study = cost.create_study(leading={})
    trial = study.ask()
    study.tell(trial, cost.evaluate(trial, cfg, WORKLOAD))
    attrs = dict(study.trials[0].user_attrs)
    assert attrs["decoder_config"] == cfg.to_dict()
    if tensor_parallel != 1:
        attrs["generation"] = {**attrs["generation"], "tensor_parallel": tensor_parallel}
    return attrs


def _add(study: optuna.Study, values: list[float], attrs: dict[str, Any]) -> None:
    study.add_trial(optuna.trial.create_trial(values=values, user_attrs=attrs))


def test_measure_generation_times_first_token_and_decode_on_the_cpu() -> None:
    m = measure_generation(TINY, WORKLOAD, "cpu", warmup=1, repeats=3)
    assert m.engine == "transformers" and m.device == "cpu" and m.n_repeats == 3
    assert (m.prompt_len, m.output_len, m.batch_size) == (8, 4, 1)
    assert m.ttft_ms > 0 and m.total_ms > m.ttft_ms * 0.5 and m.ttft_ms_std is not None
    row = m.to_measurement({"decode_ms_per_token": 1.0})
    assert row.latency_ms in (m.ttft_ms, None) and row.details["decode_ms_per_token"] == m.decode_ms_per_token
    assert row.environment["generation"]["engine"] == "transformers"
    with pytest.raises(ValidationError, match="repeats"):
        measure_generation(TINY, WORKLOAD, "cpu", repeats=1)
    with pytest.raises(ValidationError, match="engine"):
        measure_generation(TINY, WORKLOAD, "cpu", engine="tgi")
    with pytest.raises(ValidationError, match="tensor_parallel=2 needs engine 'vllm'"):
        measure_generation(TINY, WORKLOAD, "cpu", tensor_parallel=2)


def test_a_generation_trial_is_enqueued_measured_and_recorded_on_host_cpu() -> None:
    study = optuna.create_study(directions=["maximize"])
    _add(study, [1.0], _generation_attrs(TINY))
    v = ParetoValidator("host-cpu", every_n_trials=1)
    report = v.run_round(study)
    assert report.enqueued == [0] and report.skipped == [] and report.measured == 1
    (job,) = v.queue_for(study).jobs(study=study.study_name)
    assert job.space == GENERATION_SPACE and job.status == "done"
    assert job.config["generation_job_version"] == 1 and job.config["workload"]["prompt_len"] == 8
    assert job.predicted["latency_ms"] is None and "models GPUs" in job.predicted["prediction_reason"]
    (rec,) = v.records(study)
    assert rec.trial_number == 0 and rec.device == "host-cpu" and rec.status in ("ok", "error")
    gen = rec.measurement["environment"]["generation"]
    assert gen["engine"] == "transformers" and gen["model"] == "tiny" and gen["ttft_ms"] > 0
    assert rec.measurement["details"]["ttft_ms"] == gen["ttft_ms"]
    if rec.status == "ok":
        assert rec.measured_latency_ms == gen["ttft_ms"] and rec.predicted_latency_ms is None
    assert v.run_round(study).enqueued == []  # measured once
    with pytest.raises(ValidationError, match="at least"):  # generation jobs are not latency-calibration rows
        v.calibrate(study, apply=False)


def test_a_generation_the_device_cannot_hold_is_skipped_with_its_reason() -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    _add(study, [1.0, 0.0], _generation_attrs(HUGE))
    _add(study, [0.0, 1.0], _generation_attrs(TINY, tensor_parallel=2))
    v = ParetoValidator("host-cpu", every_n_trials=1)
    report = v.run_round(study)
    assert report.enqueued == [] and sorted(report.skipped) == [0, 1]
    assert "cannot be measured on host-cpu" in report.skip_reasons[0]
    assert "exceed the memory of host-cpu" in report.skip_reasons[0] and "MiB" in report.skip_reasons[0]
    assert "split over 2 GPUs and host-cpu is a CPU" in report.skip_reasons[1]


def test_generation_skip_reasons_and_job_configs_refuse_bad_values() -> None:
    assert generation_skip_reason(TINY, 1, "h100-sxm5-80gb") is None
    assert "exceed the memory of h100-sxm5-80gb" in generation_skip_reason(HUGE, 1, "h100-sxm5-80gb")
    assert generation_skip_reason(HUGE, 4, "h100-sxm5-80gb") is None
    assert "this machine has 1" in generation_skip_reason(HUGE, 4, "h100-sxm5-80gb", gpus_here=1)
    with pytest.raises(ValidationError, match="tensor_parallel"):
        generation_job_config(TINY, {"prompt_len": 8, "output_len": 4}, tensor_parallel=0)
    with pytest.raises(ValidationError, match="workload"):
        generation_job_config(TINY, {"prompt_len": -1, "output_len": 4})
    queue = JobQueue("sqlite://")
    with pytest.raises(ValidationError, match="generation_job_version"):
        queue.enqueue(study="s", trial_number=0, space=GENERATION_SPACE, config={"decoder_config": {}}, spec={},
                      device="host-cpu", predicted={})


def test_a_gpu_generation_prediction_is_given_per_engine() -> None:
    p = predicted_generation(TINY, WORKLOAD, 1, "h100-sxm5-80gb")
    assert set(p["by_engine"]) == {"transformers", "vllm"}
    assert p["latency_ms"] == p["by_engine"]["transformers"]["ttft_ms"] > 0
    assert p["decode_ms_per_token"] > 0
