"""The real-measurement check scripts in benchmarks/: their parsing and model/GEMM rebuilding (the checks
themselves need ../shared/data and run as scripts)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from _scripts import load_script


def _load(name: str):
    return load_script(name)


def test_traces_are_summed_per_a100_inference_trace(tmp_path: Path) -> None:
    b = _load("a100_neusight_layers")
    head = "source_repo,device,trace,node_index,latency\n"
    rows = ["x,NVIDIA_A100-PCIE-40GB,bert_large-inf-512-16,0,1.5",
            "x,NVIDIA_A100-PCIE-40GB,bert_large-inf-512-16,1,2.25",
            "x,NVIDIA_A100-PCIE-40GB,bert_large-train-512-16,0,9.0",   # training: not an inference label
            "x,NVIDIA_L4,gpt2_large-inf-1024-4,0,7.0",                 # another GPU
            "x,NVIDIA_A100-PCIE-40GB,t5_small-inf-512-4,0,3.0",        # a model the script does not rebuild
            "x,NVIDIA_A100-PCIE-40GB,opt_13-inf-2048-2,0,"]            # an empty latency counts 0
    (tmp_path / b._FILE).write_text(head + "\n".join(rows) + "\n")
    got = b.load_traces(tmp_path)
    assert [(t["trace"], t["seq"], t["batch"], t["nodes"]) for t in got] == [
        ("bert_large-inf-512-16", 512, 16, 2), ("opt_13-inf-2048-2", 2048, 2, 1)]
    assert got[0]["label_ms"] == pytest.approx(3.75) and got[1]["label_ms"] == 0.0


@pytest.mark.parametrize("name,out_last", [("bert_large", 2), ("gpt2_large", 50257)])
def test_models_are_rebuilt_with_the_traces_widths(name: str, out_last: int) -> None:
    b = _load("a100_neusight_layers")
    model, inputs = b.build(name, 8)
    ids = torch.zeros(1, 8, dtype=torch.int64)
    kwargs = {k: (ids if k == "input_ids" else torch.ones_like(ids)) for k in inputs}
    with torch.inference_mode():
        out = model.eval()(**kwargs)
    assert out.shape[-1] == out_last and out.shape[0] == 1
    assert set(inputs) <= {"input_ids", "attention_mask"} and all(v == ((8,), "int64") for v in inputs.values())


# Llama-2-70B: 64 heads of 128, 8 KV heads, gated MLP 28,672 wide
_ROW = {"n_embd": "8192", "n_expanded_embd": "28672", "n_head": "64", "n_kv_head": "8", "use_gated_mlp": "True",
        "num_tensor_parallel_workers": "4"}


def test_projection_shapes_of_a_tensor_parallel_shard() -> None:
    b = _load("prior_vidur_gemms")
    assert b.gemm_shape(_ROW, "attn_pre_proj") == (8192, (64 + 16) * 128 // 4)  # Q plus K, V of 8 KV heads
    assert b.gemm_shape(_ROW, "attn_post_proj") == (64 * 128 // 4, 8192)
    assert b.gemm_shape(_ROW, "mlp_up_proj") == (8192, 2 * 28672 // 4)  # gate and up
    assert b.gemm_shape(_ROW, "mlp_down_proj") == (28672 // 4, 8192)
    assert b.gemm_shape({**_ROW, "use_gated_mlp": "False"}, "mlp_up_proj") == (8192, 28672 // 4)
    with pytest.raises(ValueError, match="op must be one of"):
        b.gemm_shape(_ROW, "attn_rope")


def test_cases_average_the_medians_of_a_key_at_the_chosen_token_counts(tmp_path: Path) -> None:
    b = _load("prior_vidur_gemms")
    cols = ["gpu", "model", "num_tokens", *_ROW] + [f"time_stats.{op}.median" for op in b._OPS]
    row = lambda gpu, n, t: [gpu, "m", str(n), *_ROW.values()] + [str(t)] * 4  # noqa: E731
    lines = [cols, row("a100", 16, 1.0), row("a100", 16, 3.0), row("a100", 17, 9.0), row("h100", 16, 0.5)]
    (tmp_path / b._FILE).write_text("\n".join(",".join(x) for x in lines) + "\n")
    cases = b.load_cases(tmp_path, {16})
    assert len(cases) == 8 and {c["tokens"] for c in cases} == {16}
    a100 = [c for c in cases if c["gpu"] == "a100"]
    assert all(c["label_ms"] == pytest.approx(2.0) and c["tp"] == 4 for c in a100)


def test_accuracy_llm_fit_recovers_the_engine_constants_of_a_linear_model() -> None:
    import numpy as np

    bench = _load("accuracy_llm")
    rng = np.random.default_rng(0)
    n = 40
    sens = np.column_stack([rng.uniform(500, 5000, n), rng.uniform(200, 3000, n), rng.uniform(0.1, 2.0, n),
                            rng.uniform(0.5, 60.0, n)])  # unit prediction; per decode scale, per ms/step, per ms/seq
    truth = {"decode_gpu_scale": 1.2, "step_us": 1500.0, "seq_us": 80.0}
    # the columns are per unit of each constant's probe: ms per (scale - 1), per µs of step and of sequence time
    y = bench.linear_prediction(sens, truth)
    fit = bench.fit_constants(sens, y)
    assert fit == pytest.approx(truth, rel=1e-6)
    assert bench.fit_constants(sens, y * 10)["decode_gpu_scale"] == pytest.approx(3.0)  # at its bound


def test_accuracy_llm_decode_kv_partition_what_if_reaches_the_engines() -> None:
    from dippm_nas.errors import InvalidValueError

    bench = _load("accuracy_llm")
    got = bench.parse_kv_partitions(["vllm=none", "tensorrt-llm=512"])
    assert got == {"vllm": None, "tensorrt-llm": 512}
    for bad in (["vllm"], ["llama.cpp=512"], ["vllm=0"], ["vllm=-3"], ["tensorrt-llm=many"]):
        with pytest.raises(InvalidValueError, match="decode-kv-partition"):
            bench.parse_kv_partitions(bad)
    assert bench._engine("vllm").decode_kv_partition == 512  # vLLM's own (its paged attention's partitions)
    bench._DECODE_KV_PARTITION.update(got)
    try:
        assert bench._engine("vllm", step_us=1.0).decode_kv_partition is None
        assert bench._engine("tensorrt-llm").decode_kv_partition == 512
    finally:
        bench._DECODE_KV_PARTITION.clear()
    with pytest.raises(InvalidValueError, match="--write"):
        bench.main(["--data", "/nonexistent", "--write", "--decode-kv-partition", "vllm=none"])


def test_accuracy_llm_reads_the_bench_rows_and_leaves_out_impossible_ones() -> None:
    from conftest import shared_data_or_skip

    path = shared_data_or_skip("llm_inference_bench_h100_gh200_1gpu.csv")
    bench = _load("accuracy_llm")
    rows, skipped = bench.load_bench(path.parent, "h100-sxm5-80gb")
    assert skipped["Deci/DeciLM-7B"] == 41
    assert any("beyond its 2048 positions" in k for k in skipped) and any("faster than" in k for k in skipped)
    assert {r["device"] for r in rows} == {"h100-sxm5-80gb", "gh200-96gb"}
    assert not any(r["device"].startswith("a100") for r in rows)


def test_timm_torch_version_tags_read_as_torch_versions() -> None:
    from dippm_nas.deployment import row_deployment

    def torch_of(tag: str) -> object:
        return (row_deployment({"torch_version_tag": tag}).versions or {}).get("torch")

    assert [torch_of(t) for t in ("pt113", "pt210", "pt240", "pt291")] == ["1.13", "2.1.0", "2.4.0", "2.9.1"]
    assert torch_of("") is None and torch_of("ptx") is None
    assert row_deployment({"torch_version_tag": "pt113"}).framework == "torch-1"


_MLE_HEAD = "source_repo,commit,task,Model,GPU,Batch size,Denoising steps,Energy/image (J),Batch latency (s)\n"
_MLE_COMMIT = "c3af7f31e231a2a7021c5f8e2a54dd712d02e6e2"


def _mlenergy_csv(tmp_path: Path) -> Path:
    """A tiny ML.ENERGY-like file: two scored H100 text-to-image rows and rows the loader must skip unread."""
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
    rows = [f"x,{_MLE_COMMIT},diffusion/text-to-image,stabilityai/stable-diffusion-2-1,{h100},4,25,300.0,6.5",
            f"x,{_MLE_COMMIT},diffusion/text-to-image,prompthero/openjourney-v4,{h100},1,25,200.0,1.25",
            f"x,{_MLE_COMMIT},diffusion/text-to-image,stabilityai/stable-diffusion-2-1,{a100},4,25,1.0,1.0",  # A100
            f"x,{_MLE_COMMIT},diffusion/text-to-image,stabilityai/stable-diffusion-2-1,{h100},4,50,1.0,1.0",  # steps
            f"x,{_MLE_COMMIT},diffusion/text-to-image,kandinsky-community/kandinsky-3,{h100},4,25,1.0,1.0",   # no config
            f"x,{_MLE_COMMIT},llm_text_generation/chat,meta-llama/Llama-2-7b-chat-hf,{h100},,,,"]            # an LLM
    path = tmp_path / "mlenergy.csv"
    path.write_text(_MLE_HEAD + "\n".join(rows) + "\n")
    return path


def test_mlenergy_rows_map_to_the_diffusers_deployment(tmp_path: Path) -> None:
    """accuracy_deployment's ML.ENERGY cell: only the H100 text-to-image rows at 25 steps of rebuilt pipelines are
    read; each maps to the deployment the benchmark ran (eager PyTorch 2, no input copy, host undescribed)."""
    from dippm_nas import Deployment

    dep = _load("accuracy_deployment")
    energy = _load("accuracy_energy")
    path = _mlenergy_csv(tmp_path)
    raw = energy.read_rows(path)
    assert [(r["pipeline"], r["Batch size"]) for r in raw] == [("stable-diffusion-2-1", "4"), ("openjourney-v4", "1")]
    assert energy.load_rows(path) == [("openjourney-v4", 1, 200.0, 1.25), ("stable-diffusion-2-1", 4, 300.0, 6.5)]
    assert energy.load_rows(path, ["openjourney-v4"]) == [("openjourney-v4", 1, 200.0, 1.25)]
    d = dep.described("mlenergy", raw[0])
    assert d == Deployment(runtime="eager", framework="torch-2", input_copy="none", autocast="none")
    assert d.host is None and d.tf32_matmul is None and d.autocast == "none"  # pipelines loaded in float16
    assert d.resolve().assumed == ("host",)  # TF32 takes PyTorch 2's defaults; only the host is not recorded
    for bad in ({"task": "llm_text_generation/chat"}, {"GPU": "NVIDIA A100-SXM4-40GB"}, {"commit": "0" * 40}):
        with pytest.raises(SystemExit, match="ML.ENERGY row"):
            dep.described("mlenergy", {**raw[0], **bad})


def test_mlenergy_cell_scores_both_modes_as_an_unseen_gpu(tmp_path: Path, monkeypatch) -> None:
    """The cell predicts every row's components through accuracy_energy.predict_row with the H100's own entry
    removed (the default entry and the unseen-GPU kernel σ) and scores both modes; an undescribed host widens σ.
    The pipelines are replaced by a small graph, so diffusers is not needed."""
    from test_features import tiny_graph

    from dippm_nas.prior import default_params

    dep = _load("accuracy_deployment")
    energy = dep.accuracy_energy
    base = default_params()
    unseen = dep.unseen_params(base, energy.DEVICE)
    assert base.device_fitted(energy.DEVICE) and not unseen.device_fitted(energy.DEVICE)

    g = tiny_graph()
    seen: list[tuple[str, int]] = []

    def capture(raw):
        seen.extend((n, b) for n, b, *_ in raw)
        return [energy.Row(n, b, e, lat, [g, g], [1, 25]) for n, b, e, lat in raw]

    monkeypatch.setattr(energy, "capture_rows", capture)
    cell = dep.mlenergy_cell(_mlenergy_csv(tmp_path), shipped=False, base=base)
    assert seen == [("openjourney-v4", 1), ("stable-diffusion-2-1", 4)]
    assert cell["kernel_sigma_log"] == unseen.host_model.sigma_log_gpu("float16", device_fitted=False)
    # an unseen GPU's kernel σ is at least a fitted one's (both measured: the unseen-GPU σ and the host fit's)
    assert cell["kernel_sigma_log"] >= base.host_model.sigma_log_gpu("float16", device_fitted=True)
    one = energy.predict_row(energy.Row("x", 1, 0.0, 0.0, [g, g], [1, 25]), unseen)
    assert one.latency_ms == pytest.approx(26 * energy.predict_row(energy.Row("x", 1, 0.0, 0.0, [g], [1]),
                                                                   unseen).latency_ms, rel=1e-9)
    for mode in dep.MODES:
        assert cell[mode]["n"] == 2 and math.isfinite(cell[mode]["mape_pct"]) and cell[mode]["median_sigma_pct"] > 0
        assert set(cell[mode]["median_ratio_by_pipeline"]) == {"openjourney-v4", "stable-diffusion-2-1"}
    assert cell["unknown"]["median_sigma_pct"] > cell["described"]["median_sigma_pct"]


def test_mlenergy_rows_get_one_graph_per_pipeline_component(monkeypatch) -> None:
    """accuracy_energy.capture_rows: each (pipeline, batch) gets its config's components, captured at that batch,
    with their calls per batch (the capture itself is replaced: diffusers is not needed)."""
    energy = _load("accuracy_energy")
    monkeypatch.setattr(energy.t2i, "capture_component", lambda cfg, comp, batch: (cfg["model"], comp.name, batch))
    raw = [("stable-diffusion-2-1", 4, 300.0, 6.5), ("openjourney-v4", 1, 200.0, 1.25)]
    rows = energy.capture_rows(raw)
    assert [(r.name, r.batch, r.batch_latency_s) for r in rows] == [("openjourney-v4", 1, 1.25),
                                                                     ("stable-diffusion-2-1", 4, 6.5)]
    comps = energy.t2i.components(energy.t2i.load_config("stable-diffusion-2-1"))
    assert rows[1].graphs == [("stabilityai/stable-diffusion-2-1", c.name, 4) for c in comps]
    assert rows[1].calls == [c.calls for c in comps]


def test_deployment_metrics_split_the_error_by_timeline() -> None:
    """accuracy_deployment.metrics: the GPU-bound and host-bound rows' count, mean and RMS log error apart (a
    bias of one timeline reads as a mean near its RMS; scatter as a mean near 0)."""
    import numpy as np

    dep = _load("accuracy_deployment")
    y = np.array([10.0, 10.0, 4.0, 4.0, 8.0])
    pred = np.array([20.0, 5.0, 2.0, 2.0, 8.0])  # GPU-bound: x2 and x0.5 (scatter); host-bound: x0.5, x0.5, x1
    m = dep.metrics(pred, np.full(5, 0.5), y, np.array([True, True, False, False, False]))
    assert (m["gpu_bound_rows"], m["host_bound_rows"]) == (2, 3)
    assert m["gpu_bound_mean_log"] == pytest.approx(0.0, abs=1e-12)
    assert m["gpu_bound_rms_log"] == pytest.approx(math.log(2))
    assert m["host_bound_mean_log"] == pytest.approx(-2 * math.log(2) / 3)
    assert m["host_bound_rms_log"] == pytest.approx(math.sqrt(2 / 3) * math.log(2))
    none = dep.metrics(pred, np.full(5, 0.5), y, np.zeros(5, dtype=bool))
    assert none["gpu_bound_rows"] == 0 and math.isnan(none["gpu_bound_mean_log"]) and none["host_bound_rows"] == 5
