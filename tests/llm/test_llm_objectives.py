"""LLM generations as search objectives: budgets (minimums, MIG slices), HardwareCostModel, ``dippm-nas predict-llm``."""

from __future__ import annotations

import json
import math

import optuna
import pytest

from dippm_nas.trial import TrialRecord

from dippm_nas.budgets import Budgets
from dippm_nas.cli import main
from dippm_nas.devices import get_device
from dippm_nas.errors import BudgetError
from dippm_nas.llm import DecoderConfig, LLMWorkload, predict_generation
from dippm_nas.optuna import HardwareCostModel

optuna.logging.set_verbosity(optuna.logging.WARNING)


def small(layers: int = 4, width: int = 512, kv: int = 2) -> DecoderConfig:
    return DecoderConfig(name="small", model_type="llama", num_layers=layers, hidden_size=width, num_heads=8,
                         num_kv_heads=kv, head_dim=width // 8, intermediate_size=2 * width, vocab_size=8000,
                         max_positions=4096, rotary_dim=width // 8)


def test_minimum_budgets_subtract_k_sigma_and_maximum_budgets_add_it() -> None:
    p = predict_generation(small(), LLMWorkload(256, 64, 4), "a100-sxm4-80gb", mig=False)
    b = Budgets(tokens_per_s=p.tokens_per_s / 2, decode_ms_per_token=p.decode_ms_per_token * 2, k_sigma=1.0)
    checks = b.check(p)
    tps, dec = checks["tokens_per_s"], checks["decode_ms_per_token"]
    assert tps.minimum and tps.bound == pytest.approx(p.tokens_per_s - p.tokens_per_s_std)
    assert tps.value == pytest.approx(p.tokens_per_s / 2 - tps.bound) and tps.feasible
    assert not dec.minimum and dec.bound == pytest.approx(p.decode_ms_per_token + p.decode_ms_per_token_std)
    assert tps.ratio == pytest.approx(tps.budget / tps.bound) and tps.ratio < 1
    assert not Budgets(tokens_per_s=p.tokens_per_s * 2).feasible(p)
    with pytest.raises(BudgetError, match="latency_ms"):
        Budgets(latency_ms=5.0).check(p)  # a forward pass's figure: a generation has none


def test_a_mig_budget_checks_the_figures_of_one_instance() -> None:
    p = predict_generation(small(layers=8, width=1024), LLMWorkload(512, 64, 4), "a100-sxm4-80gb")
    slice_ = p.mig["1g.10gb"]
    checks = Budgets(decode_ms_per_token=1e6, max_batch=1, mig_profile="1g.10gb", k_sigma=0).check(p)
    assert checks["decode_ms_per_token"].mean == slice_.decode_ms_per_token > p.decode_ms_per_token
    assert checks["max_batch"].mean == slice_.max_batch < p.max_batch
    assert checks["memory_mib"].budget == get_device("a100-sxm4-80gb").mig_profile("1g.10gb").usable_memory_mib


def _cfg(trial: optuna.Trial) -> DecoderConfig:
    return small(layers=trial.suggest_int("layers", 2, 8), width=trial.suggest_categorical("width", [256, 512, 1024]),
                 kv=trial.suggest_categorical("kv", [1, 2, 8]))


def test_hardware_cost_model_optimises_generation_objectives_with_directions() -> None:
    cost = HardwareCostModel("a100-sxm4-80gb", Budgets(decode_ms_per_token=8.0, mig_profile="1g.10gb"),
                             objectives=("tokens_per_s", "energy_j_per_token"), runtime="serving")
    assert cost.directions == ["maximize", "minimize"]
    study = cost.create_study(leading={})
    study.optimize(lambda t: cost.evaluate(t, _cfg(t), LLMWorkload(128, 32, 4)), n_trials=4)
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        a = t.user_attrs
        g = a["generation"]
        assert g["mig_profile"] == "1g.10gb" and g["engine"] == "vllm" and a["runtime"] == "serving"
        assert a["deployment"]["runtime"] == "serving" and g["tensor_parallel"] == 1
        assert t.values[0] == pytest.approx(a["predicted_tokens_per_s"])
        assert g["sources"]["energy_j_per_token"] == "analytic"  # an attribution of the whole GPU's energy
        assert math.isclose(a["constraint_decode_ms_per_token"],
                            a["predicted_decode_ms_per_token"] + a["predicted_decode_ms_per_token_std"] - 8.0)
        assert "predicted_max_batch" in a and set(g) >= {"fits", "fit_reason", "workload", "model", "sources"}
        assert g["workload"] == LLMWorkload(128, 32, 4).to_dict()
        record = TrialRecord.from_attrs(a)  # the one trial record, generation section included
        assert record.generation is not None and record.generation.figure("tokens_per_s")[0] == t.values[0]
        assert record.feasible == a["feasible"] and not record.rebuildable
        assert "LLM generation" in (record.not_rebuildable_reason or "")


def test_a_generation_that_cannot_be_predicted_fails_its_trial_and_infeasible_is_the_worst_value() -> None:
    bad = {"model_type": "bert", "hidden_size": 64}
    cost = HardwareCostModel("a100-sxm4-80gb", objectives=("tokens_per_s", "decode_ms_per_token"))
    study = cost.create_study(leading={})
    study.optimize(lambda t: cost.evaluate(t, bad, LLMWorkload(16, 4, 1)), n_trials=1)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert "not a decoder-only" in study.trials[0].user_attrs["cost_model_error"]
    worst = HardwareCostModel("a100-sxm4-80gb", objectives=("tokens_per_s", "decode_ms_per_token"), on_error="infeasible")
    trial = optuna.create_study(directions=["maximize", "minimize"]).ask()
    assert worst.evaluate(trial, bad, LLMWorkload(16, 4, 1)) == (-math.inf, math.inf)


def test_generation_objectives_need_a_workload() -> None:
    import torch

    cost = HardwareCostModel("a100-sxm4-80gb", objectives=("tokens_per_s",), on_error="raise")
    from dippm_nas import InputSpec

    trial = optuna.create_study(direction="maximize").ask()
    with pytest.raises(Exception, match="LLMWorkload"):
        cost.evaluate(trial, torch.nn.Linear(4, 4), InputSpec(shape=(4,), batch_size=2))
    serving = HardwareCostModel("a100-sxm4-80gb", objectives=("latency_ms",), runtime="serving")
    with pytest.raises(Exception, match="LLM generations only"):
        serving.evaluate(optuna.create_study().ask(), torch.nn.Linear(4, 4), InputSpec(shape=(4,), batch_size=2))


# ------------------------------------------------------------------------------------------ CLI
def test_predict_llm_prints_one_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict-llm", "llama-2-7b", "--prompt", "512", "--output", "64", "--batch", "1", "16",
                 "--device", "a100-sxm4-80gb", "h100-sxm5-80gb", "--mig", "--runtime", "serving"]) == 0
    out = capsys.readouterr().out
    assert "decode_ms/token" in out and "1g.10gb" in out and "(vllm)" in out
    assert main(["predict-llm", "gpt2", "--batch", "1,8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["workload"]["batch_size"] for r in rows] == [1, 8] and rows[0]["device"] == "a100-sxm4-40gb"


def test_predict_llm_usage_errors_name_the_choices(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert main(["predict-llm", "lama-2-7b"]) == 2
    assert "did you mean: llama-2-7b" in capsys.readouterr().err
    assert main(["predict-llm", "gpt2", "--runtime", "vllm"]) == 2
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    assert main(["predict-llm", str(cfg), "--json"]) == 1
    assert "not a decoder-only" in json.loads(capsys.readouterr().out)["error"]
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128,
                              "vocab_size": 100}))
    assert main(["predict-llm", str(ok), "--prompt", "16", "--output", "4"]) == 0
