"""Tensor parallelism of a serving engine: shards, all-reduces on the node's link, bad input, the CLI's --tp."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dippm_nas.cli import main
from dippm_nas.devices import get_device, list_devices
from dippm_nas.errors import DeviceError, DippmNasError, InvalidValueError
from dippm_nas.llm import (DecoderConfig, LLMWorkload, TensorParallel, architecture, predict_generation,
                           resolve_tensor_parallel, serving_engine, shard_config)
from dippm_nas.llm._parallel import allreduce_ms

WL = LLMWorkload(prompt_len=256, output_len=64, batch_size=8)


def tiny(**kw: object) -> DecoderConfig:
    base = dict(name="tiny", model_type="llama", num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=2,
                head_dim=32, intermediate_size=512, vocab_size=1000, max_positions=4096, rotary_dim=32)
    base.update(kw)
    return DecoderConfig(**base)  # type: ignore[arg-type]


def serve(model: object, tp: int, device: str = "h100-sxm5-80gb", wl: LLMWorkload = WL, **kw: object):
    return predict_generation(model, wl, device, runtime="serving", engine="vllm", mig=False, tensor_parallel=tp,
                              **kw)


def test_shard_divides_heads_mlp_and_vocabulary_and_replicates_kv_heads() -> None:
    cfg = architecture("llama-3-8b")  # 32 heads, 8 KV heads
    s4 = shard_config(cfg, 4)
    assert (s4.num_heads, s4.num_kv_heads, s4.intermediate_size, s4.vocab_size) == (8, 2, 3584, 32064)
    assert s4.hidden_size == cfg.hidden_size and s4.num_layers == cfg.num_layers
    q = shard_config(tiny(), 4)  # 2 KV heads over 4 GPUs: one replicated head each
    assert (q.num_heads, q.num_kv_heads) == (2, 1)
    mix = shard_config(architecture("mixtral-8x7b"), 2)  # every expert's FFN is sharded, not the experts
    assert mix.num_experts == 8 and mix.intermediate_size == 14336 // 2
    assert shard_config(cfg, 1) is cfg


def test_tp_weights_kv_per_gpu_and_faster_decode() -> None:
    one, two = serve("llama-2-7b", 1), serve("llama-2-7b", 2)
    d = two.details
    assert d["tensor_parallel"] == 2 and d["interconnect"] == "nvlink" and d["link_gbps"] == 450.0
    assert d["weights_mib_per_gpu"] == pytest.approx(shard_config(architecture("llama-2-7b"), 2).weight_bytes / 2**20)
    assert d["weights_mib_per_gpu"] < 0.51 * one.weights_mib
    assert d["kv_cache_mib_per_gpu"] == pytest.approx(one.kv_cache_mib / 2)
    assert two.weights_mib == one.weights_mib  # the model's, not one GPU's
    assert two.max_batch > 2 * one.max_batch  # half the weights per GPU and half the KV per sequence
    assert two.peak_memory_mib < one.peak_memory_mib
    assert two.decode_ms_per_token < one.decode_ms_per_token
    assert two.energy_j_per_token is not None and two.energy_j_per_token > 0
    assert two.mig is None


def test_allreduce_custom_below_the_buffer_nccl_above_and_on_pcie() -> None:
    cfg = architecture("llama-2-7b")
    eng = dataclasses.replace(serving_engine("vllm"), allreduce_us=5.0, nccl_us=20.0, allreduce_bw_scale=1.0)
    nv = TensorParallel(4, "nvlink", 450.0)
    small, custom = allreduce_ms(cfg, 8, nv, eng)
    assert custom and small == pytest.approx(65 * (5e-3 + 2 * 3 / 4 * 8 * 4096 * 2 / 450e9 * 1e3))
    _, big_custom = allreduce_ms(cfg, 4096, nv, eng)  # 32 MiB > the 8 MiB custom buffer
    assert not big_custom
    pcie = TensorParallel(4, "pcie", get_device("h100-pcie-80gb").pcie_gbps)
    t_pcie, c_pcie = allreduce_ms(cfg, 8, pcie, eng)
    assert not c_pcie and t_pcie > small


def test_allreduce_and_worker_constants_add_to_every_step() -> None:
    base = dataclasses.replace(serving_engine("vllm"), tp_step_us=0.0, allreduce_us=0.0, nccl_us=0.0)
    slow = dataclasses.replace(base, tp_step_us=500.0, allreduce_us=10.0)
    kw = dict(runtime="serving", mig=False, tensor_parallel=4)
    a = predict_generation("llama-2-7b", WL, "h100-sxm5-80gb", engine=base, **kw)
    b = predict_generation("llama-2-7b", WL, "h100-sxm5-80gb", engine=slow, **kw)
    extra = 3 * 0.5 + 65 * 0.010  # three extra workers' host time and 65 custom all-reduces per step, ms
    assert b.decode_ms_per_token - a.decode_ms_per_token == pytest.approx(extra, rel=1e-6)


def test_identical_sequences_read_one_sequences_experts() -> None:
    wl = LLMWorkload(256, 32, 16)
    mixed = serve("mixtral-8x7b", 4, wl=wl)
    same = serve("mixtral-8x7b", 4, wl=dataclasses.replace(wl, identical_sequences=True))
    assert same.decode_ms_per_token < 0.7 * mixed.decode_ms_per_token  # 2 experts per layer instead of ~8
    dense = serve("llama-2-7b", 2, wl=wl)
    dense_same = serve("llama-2-7b", 2, wl=dataclasses.replace(wl, identical_sequences=True))
    assert dense_same.e2e_ms == pytest.approx(dense.e2e_ms)
    with pytest.raises(InvalidValueError, match="identical_sequences"):
        LLMWorkload(1, 1, 1, identical_sequences="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("model, tp, device, kw, err, words", [
    ("llama-2-7b", 3, "h100-sxm5-80gb", {}, InvalidValueError, ["tensor_parallel=3", "num_heads=32"]),
    (None, 2, "h100-sxm5-80gb", {}, InvalidValueError, ["tensor_parallel=2", "num_kv_heads=3"]),
    ("llama-2-7b", 16, "h100-sxm5-80gb", {}, DeviceError, ["tensor_parallel=16", "gpus_per_node=8"]),
    ("llama-2-7b", 2, "rtx-4090", {}, DeviceError, ["gpus_per_node=None"]),
    ("llama-2-7b", 2, "l4", {"interconnect": "nvlink"}, DeviceError, ["interconnect='nvlink'", "l4"]),
    ("llama-2-7b", 4, "a100-pcie-80gb", {"interconnect": "nvlink"}, DeviceError, ["bridge", "tensor_parallel=4"]),
    ("llama-2-7b", 2, "h100-sxm5-80gb", {"interconnect": "infiniband"}, InvalidValueError, ["interconnect"]),
    ("llama-2-7b", 0, "h100-sxm5-80gb", {}, InvalidValueError, ["tensor_parallel must be an int >= 1"]),
    ("llama-2-7b", True, "h100-sxm5-80gb", {}, InvalidValueError, ["tensor_parallel must be an int >= 1"]),
])
def test_bad_tensor_parallel_names_field_and_value(model, tp, device, kw, err, words) -> None:
    model = model or tiny(num_heads=12, num_kv_heads=3, head_dim=32)
    with pytest.raises(err) as e:
        serve(model, tp, device, **kw)
    for w in words:
        assert w in str(e.value)


def test_shard_and_tensor_parallel_check_their_input() -> None:
    cfg = architecture("llama-2-7b")
    for bad in (0, -2, True, 2.0):
        with pytest.raises(InvalidValueError, match="tensor_parallel must be an int"):
            shard_config(cfg, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="num_heads=32"):
        shard_config(cfg, 3)
    with pytest.raises(InvalidValueError, match="TensorParallel.interconnect"):
        TensorParallel(2, None, 450.0)
    with pytest.raises(InvalidValueError, match="TensorParallel.link_gbps"):
        TensorParallel(2, "nvlink", 0.0)
    with pytest.raises(InvalidValueError, match="TensorParallel.size"):
        TensorParallel(0)


def test_tensor_parallel_needs_a_serving_engine() -> None:
    with pytest.raises(InvalidValueError, match="runtime='serving'"):
        predict_generation("llama-2-7b", WL, "h100-sxm5-80gb", runtime="eager", mig=False, tensor_parallel=2)


def test_pcie_default_without_nvlink_and_for_a_bridge_beyond_two() -> None:
    cfg = architecture("llama-2-7b")
    assert resolve_tensor_parallel(cfg, get_device("l40s"), 4, None, "serving").interconnect == "pcie"
    assert resolve_tensor_parallel(cfg, get_device("a100-pcie-80gb"), 2, None, "serving").interconnect == "nvlink"
    assert resolve_tensor_parallel(cfg, get_device("a100-pcie-80gb"), 4, None, "serving").interconnect == "pcie"
    assert resolve_tensor_parallel(cfg, get_device("a100-sxm4-80gb"), 8, None, "serving").link_gbps == 300.0


def test_device_files_node_fields_are_consistent() -> None:
    for d in list_devices():
        dev = get_device(d)
        if dev.nvswitch:
            assert dev.nvlink_gbps and dev.gpus_per_node and dev.gpus_per_node >= 4, d
        if dev.nvlink_gbps is not None:
            assert "nvlink_gbps" in dev.sources, d
    with pytest.raises(DeviceError, match="nvswitch"):
        dataclasses.replace(get_device("l4"), nvswitch=True)
    with pytest.raises(DeviceError, match="gpus_per_node"):
        dataclasses.replace(get_device("l4"), gpus_per_node=0)


def test_cli_tp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict-llm", "llama-2-7b", "--runtime", "serving", "--tp", "2", "--device", "h100-sxm5-80gb",
                 "--prompt", "128", "--output", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["details"]["tensor_parallel"] == 2 and rows[0]["details"]["interconnect"] == "nvlink"
    assert main(["predict-llm", "llama-2-7b", "--runtime", "serving", "--tp", "3", "--device", "h100-sxm5-80gb",
                 "--prompt", "128", "--output", "16"]) != 0
    assert "num_heads=32" in capsys.readouterr().err
    with pytest.raises(DippmNasError):
        serve("llama-2-7b", 2, interconnect="pcie", device="rtx-4090")
