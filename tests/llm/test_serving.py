"""Serving configurations under traffic: figures with σ, SLO chance constraints, infeasible configurations with a
reason, bad input, and a small Optuna search over them."""

from __future__ import annotations

import math

import pytest

from dippm_nas.errors import InvalidValueError
from dippm_nas.llm import DecoderConfig, ServingConfig, ServingSLO, ServingTraffic, evaluate_serving


def tiny() -> DecoderConfig:
    return DecoderConfig(name="tiny", model_type="llama", num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=4,
                         head_dim=32, intermediate_size=512, vocab_size=1000, max_positions=4096, rotary_dim=32)


BATCH = ServingTraffic(prompt_lens=(128, 256, 512), output_lens=64, batch_size=16)
RATE = ServingTraffic(prompt_lens=256, output_lens=(32, 64), request_rate_per_s=20.0)


def test_batch_traffic_figures_cost_and_sigma() -> None:
    e = evaluate_serving(tiny(), BATCH, ServingConfig("h100-sxm5-80gb"), price_per_gpu_hour=2.0)
    assert e.feasible and e.reason == "" and e.replicas == 1 and e.concurrency == 16
    for name in ("ttft_ms", "tpot_ms", "cost_usd_per_million_tokens", "energy_j_per_token", "output_tokens_per_s"):
        v, s = getattr(e, name), getattr(e, name + "_std")
        assert v is not None and math.isfinite(v) and v > 0, name
        assert s is not None and s > 0, name
    assert e.cost_usd_per_million_tokens == pytest.approx(2.0 / (e.output_tokens_per_s * 3600) * 1e6)
    two = evaluate_serving(tiny(), BATCH, ServingConfig("h100-sxm5-80gb", tensor_parallel=2), price_per_gpu_hour=2.0)
    assert two.gpus == 2.0


def test_rate_traffic_replicas_and_concurrency() -> None:
    e = evaluate_serving(tiny(), RATE, ServingConfig("h100-sxm5-80gb", max_num_seqs=16), price_per_gpu_hour=2.0)
    assert e.feasible and e.replicas >= 1 and 1 <= e.concurrency <= 16
    assert e.output_tokens_per_s == pytest.approx(20.0 * 48)
    heavy = ServingTraffic(prompt_lens=256, output_lens=(32, 64), request_rate_per_s=20000.0)
    h = evaluate_serving(tiny(), heavy, ServingConfig("h100-sxm5-80gb", max_num_seqs=16), price_per_gpu_hour=2.0)
    assert h.replicas > e.replicas and e.concurrency <= h.concurrency <= 16
    assert h.cost_usd_per_million_tokens <= e.cost_usd_per_million_tokens * 1.001  # fuller replicas: cheaper tokens


def test_slo_chance_constraint_uses_k_sigma() -> None:
    e = evaluate_serving(tiny(), BATCH, ServingConfig("h100-sxm5-80gb"), price_per_gpu_hour=1.0)
    just = e.tpot_ms + 0.5 * e.tpot_ms_std
    ok = evaluate_serving(tiny(), BATCH, ServingConfig("h100-sxm5-80gb"), price_per_gpu_hour=1.0,
                          slo=ServingSLO(tpot_ms=just, k_sigma=0.0))
    miss = evaluate_serving(tiny(), BATCH, ServingConfig("h100-sxm5-80gb"), price_per_gpu_hour=1.0,
                            slo=ServingSLO(tpot_ms=just, k_sigma=1.0))
    assert ok.feasible and ok.violations["tpot_ms"] < 0
    assert not miss.feasible and miss.violations["tpot_ms"] == pytest.approx(0.5 * e.tpot_ms_std)
    assert "tpot_ms" in miss.reason


@pytest.mark.parametrize("config, words", [
    (ServingConfig("l4", engine="vllm"), "exceed"),  # 70 B weights on one 24 GB board
    (ServingConfig("l4", mig_profile="1g.10gb"), "does not support MIG"),
    (ServingConfig("h100-sxm5-80gb", tensor_parallel=3), "num_heads"),
    (ServingConfig("h100-sxm5-80gb", tensor_parallel=16), "gpus_per_node"),
    (ServingConfig("a100-sxm4-80gb", tensor_parallel=4, kv_dtype="float8_e4m3fn"), "FP8"),
])
def test_configuration_that_cannot_serve_is_infeasible_with_reason(config: ServingConfig, words: str) -> None:
    e = evaluate_serving("llama-2-70b", BATCH, config, price_per_gpu_hour=2.0)
    assert not e.feasible and words in e.reason and e.cost_usd_per_million_tokens == math.inf


@pytest.mark.parametrize("make, words", [
    (lambda: evaluate_serving(tiny(), BATCH, ServingConfig("h100-sxm5-80gb"), price_per_gpu_hour=0.0),
     "price_per_gpu_hour"),
    (lambda: evaluate_serving(tiny(), BATCH, ServingConfig("h100-sxm5-80gb"), price_per_gpu_hour=-1.0),
     "price_per_gpu_hour"),
    (lambda: ServingSLO(ttft_ms=0.0), "ServingSLO.ttft_ms"),
    (lambda: ServingSLO(tpot_ms=-5), "ServingSLO.tpot_ms"),
    (lambda: ServingSLO(tpot_ms=float("nan")), "ServingSLO.tpot_ms"),
    (lambda: ServingTraffic(128, 64), "exactly one of batch_size"),
    (lambda: ServingTraffic(128, 64, batch_size=4, request_rate_per_s=1.0), "exactly one of batch_size"),
    (lambda: ServingTraffic(128, 64, request_rate_per_s=0.0), "request_rate_per_s"),
    (lambda: ServingTraffic([], 64, batch_size=1), "prompt_lens"),
    (lambda: ServingTraffic(128, [0], batch_size=1), "output_lens"),
    (lambda: ServingConfig("l4", tensor_parallel=0), "ServingConfig.tensor_parallel"),
    (lambda: ServingConfig("l4", max_num_seqs=True), "ServingConfig.max_num_seqs"),
    (lambda: ServingConfig("l4", engine="sglang"), "ServingConfig.engine"),
])
def test_bad_serving_input_names_field_and_value(make, words: str) -> None:
    with pytest.raises(InvalidValueError, match=words):
        make()


def test_small_search_returns_pareto_with_sigma_and_infeasible_reasons() -> None:
    pytest.importorskip("optuna")
    from dippm_nas.optuna import serving_config_search

    res = serving_config_search(tiny(), BATCH, devices=["h100-sxm5-80gb", "l4"],
                                price_per_gpu_hour={"h100-sxm5-80gb": 3.0, "l4": 0.8},
                                slo=ServingSLO(ttft_ms=10_000.0, tpot_ms=1_000.0), tensor_parallel=(1, 2, 3),
                                max_num_seqs=(8, 16), n_trials=16, seed=1, population_size=8)
    assert res.trials == 16 and res.pareto
    assert all(e.feasible and e.cost_usd_per_million_tokens_std is not None for e in res.pareto)
    costs = [e.cost_usd_per_million_tokens for e in res.pareto]
    assert costs == sorted(costs)
    energies = [e.energy_j_per_token for e in res.pareto]
    assert all(a >= b for a, b in zip(energies, energies[1:]))  # cheaper costs more energy along the front
    if any(not e.feasible for e in res.evaluated):
        assert res.infeasible
    with pytest.raises(InvalidValueError, match="price_per_gpu_hour"):
        serving_config_search(tiny(), BATCH, devices=["l4"], price_per_gpu_hour=0.0, n_trials=1)
    with pytest.raises(InvalidValueError, match="price_per_gpu_hour"):
        serving_config_search(tiny(), BATCH, devices=["l4", "a30"], price_per_gpu_hour={"l4": 1.0}, n_trials=1)
