"""Execution runtimes, host profiles and the fitted host model (no GPU, no network, no ../shared)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

import dippm_nas
from dippm_nas.devices import (DEFAULT_HOST_PROFILE, HostProfile, get_device, load_host_profile, measure_host_profile,
                               resolve_host_profile)
from dippm_nas.errors import DeviceError, DippmNasError, ExecutionRuntimeError
from dippm_nas.graph import OperatorGraph, OpNode
from dippm_nas.predictor import AnalyticPredictor, get_predictor
from dippm_nas.prior import (RUNTIMES, DeploymentSettings, Execution, HostModel, default_params, estimate,
                             execution_settings, row_settings)
from dippm_nas.spec import InputSpec, dtype_bytes

from _models import features_deployment
from conftest import shared_data_or_skip



def _node(i: int, name: str, cls: str, shape: tuple[int, ...], ins: list[tuple[int, ...]], par: list[bool], *,
          dtype: str, flops: int, macs: int = 0, attrs: dict | None = None) -> OpNode:
    eb = dtype_bytes(dtype)
    br = sum(math.prod(s) for s in ins) * eb
    pb = sum(math.prod(s) for s, p in zip(ins, par) if p) * eb
    return OpNode(index=i, op=name, op_class=cls, output_shapes=(shape,), output_dtype=dtype, input_shapes=tuple(ins),
                  input_is_param=tuple(par), attrs=attrs or {}, flops=flops, macs=macs, bytes_read=br,
                  bytes_written=math.prod(shape) * eb, param_bytes=pb, is_constant=False)


def conv_chain(batch: int, channels: int, size: int, layers: int = 12, dtype: str = "float16") -> OperatorGraph:
    """``layers`` x (3x3 conv -> batch norm -> relu) at (batch, channels, size, size)."""
    s = (batch, channels, size, size)
    nodes, edges = [], []
    for layer in range(layers):
        macs = batch * channels * size * size * channels * 9
        i = len(nodes)
        nodes.append(_node(i, "nn.conv2d", "conv", s, [s, (channels, channels, 3, 3)], [False, True], dtype=dtype,
                           flops=2 * macs, macs=macs, attrs={"groups": 1, "out_channels": channels,
                                                             "in_channels_per_group": channels, "depthwise": False,
                                                             "data_layout": "NCHW", "kernel": [3, 3]}))
        nodes.append(_node(i + 1, "nn.batch_norm", "normalization", s, [s, (channels,), (channels,)], [False, True, True],
                           dtype=dtype, flops=4 * math.prod(s)))
        nodes.append(_node(i + 2, "nn.relu", "activation", s, [s], [False], dtype=dtype, flops=math.prod(s)))
        edges += [(i, i + 1), (i + 1, i + 2)] + ([(i - 1, i)] if layer else [])
    pbytes = sum(n.param_bytes for n in nodes)
    return OperatorGraph(nodes=nodes, edges=sorted(edges), input_consumers={"x": [0]}, outputs=[len(nodes) - 1],
                         spec=InputSpec(shape=(channels, size, size), batch_size=batch, dtype=dtype),
                         param_count=pbytes // dtype_bytes(dtype), param_bytes=pbytes, mode="export").validate()


HOST_BOUND = [conv_chain(1, 16, 8), conv_chain(1, 32, 16, layers=30), conv_chain(2, 8, 4, layers=50)]
GPU_BOUND = [conv_chain(256, 256, 56, layers=6), conv_chain(512, 128, 56, layers=8)]


@pytest.mark.parametrize("predictor", ["analytic", "checkpoint"])
def test_cuda_graphs_faster_when_host_bound_and_equal_when_gpu_bound(predictor: str) -> None:
    p = AnalyticPredictor("a100-sxm4-40gb") if predictor == "analytic" else get_predictor("a100-sxm4-40gb")
    for g in HOST_BOUND:
        (eager,) = p.predict_graphs([g], mig=False)
        (graphs,) = p.predict_graphs([g], mig=False, runtime="cuda-graphs")
        assert eager.details["host_bound"] == 1.0, "the fixture must be host-bound in eager mode"
        assert graphs.latency_ms < eager.latency_ms
        assert graphs.labels["runtime"] == "cuda-graphs" and eager.labels["runtime"] == "eager"
        assert graphs.host_ms < eager.host_ms
    for g in GPU_BOUND:
        (eager,) = p.predict_graphs([g], mig=False)
        (graphs,) = p.predict_graphs([g], mig=False, runtime="cuda-graphs")
        assert eager.details["host_bound"] == 0.0, "the fixture must be GPU-bound in eager mode"
        assert graphs.latency_ms == pytest.approx(eager.latency_ms, rel=0.05)


def test_timelines_and_critical_path() -> None:
    g = HOST_BOUND[0]
    for rt in RUNTIMES:
        e = estimate(g, "a100-sxm4-40gb", deployment=DeploymentSettings(runtime=rt))
        assert e.runtime == rt
        assert e.latency_ms >= max(e.host_ms, e.gpu_busy_ms) - 1e-9
        assert e.latency_ms <= e.host_ms + e.gpu_busy_ms + 1e-9
    p = dippm_nas.prior.predict(g, "a100-sxm4-40gb", mig=False, deployment=DeploymentSettings(runtime="compiled"))
    assert p.host_ms is not None and p.gpu_ms is not None and p.details["host_bound"] in (0.0, 1.0)
    # compiled: conv, then one generated kernel for batch norm + relu -> fewer kernels, less host time
    eager = estimate(g, "a100-sxm4-40gb")
    compiled = estimate(g, "a100-sxm4-40gb", deployment=DeploymentSettings(runtime="compiled"))
    assert compiled.host_ms < eager.host_ms and compiled.gpu_busy_ms < eager.gpu_busy_ms


def test_input_copy_and_slower_host_cost_more() -> None:
    g = HOST_BOUND[1]
    base = estimate(g, "a100-sxm4-40gb")
    copy = estimate(g, "a100-sxm4-40gb", deployment=DeploymentSettings(input_copy="pageable"))
    assert copy.input_copy_ms > 0 and copy.latency_ms > base.latency_ms
    slow = estimate(g, "a100-sxm4-40gb", deployment=DeploymentSettings(host=HostProfile.from_clock(1.5)))
    assert slow.host_ms == pytest.approx(base.host_ms * DEFAULT_HOST_PROFILE.speed / (1.5 / 3.0), rel=1e-6)
    old = estimate(g, "a100-sxm4-40gb", deployment=DeploymentSettings(host=HostProfile(
        name="old", framework="torch-1", speed=DEFAULT_HOST_PROFILE.speed)))
    gens = default_params().host_model.generations
    assert old.host_ms == pytest.approx(base.host_ms * gens["torch-1"] / gens["torch-2"], rel=1e-6)


def test_unknown_runtime_and_bad_host_are_clear_errors(tmp_path: Path) -> None:
    g = HOST_BOUND[0]
    with pytest.raises(ExecutionRuntimeError, match="eager.*cuda-graphs.*compiled") as e:
        dippm_nas.predict(g, device="a100-sxm4-40gb", runtime="tensorrt")
    assert isinstance(e.value, ValueError) and isinstance(e.value, DippmNasError)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "name": "x", "speed": 1.0, "framework": "jax-1"}))
    with pytest.raises(DeviceError, match="torch-2"):
        dippm_nas.predict(g, device="a100-sxm4-40gb", host=str(bad))
    bad.write_text(json.dumps({"format": 1, "name": "x", "speed": 1.0, "cores": 8}))
    with pytest.raises(DeviceError, match=r"host profile .*bad.json.*unknown keys \[.cores.\]"):
        load_host_profile(bad)
    bad.write_text("{not json")
    with pytest.raises(DeviceError, match="cannot read host profile"):
        load_host_profile(bad)
    with pytest.raises(ExecutionRuntimeError, match="GPUs"):
        AnalyticPredictor("host-cpu").predict_graphs([g], runtime="compiled")


def test_another_framework_generation_is_flagged() -> None:
    from dippm_nas.predictor import _base

    _base._warn_once.reset()  # said once per process: another test may have predicted for torch-1 already
    g = HOST_BOUND[0]
    old = HostProfile(name="legacy server", framework="torch-1")
    with pytest.warns(RuntimeWarning, match="torch-1"):
        p = dippm_nas.predict(g, device="a100-sxm4-40gb", host=old, mig=False)
    assert p.details["host_profile_mismatch"] == 1.0
    q = dippm_nas.predict(g, device="a100-sxm4-40gb", mig=False)
    assert q.details["host_profile_mismatch"] == 0.0 and p.latency_ms != q.latency_ms


def test_host_profile_round_trip_and_measurement(tmp_path: Path) -> None:
    prof = measure_host_profile(repeats=2, iterations=5)
    assert 0.05 <= prof.speed <= 20 and prof.microbench_us > 0 and prof.framework == "torch-2"
    path = tmp_path / "host.json"
    prof.save(path)
    assert load_host_profile(path) == prof
    assert resolve_host_profile(str(path)) == prof and resolve_host_profile(None) is DEFAULT_HOST_PROFILE
    assert HostProfile.from_clock(3.0).speed == pytest.approx(1.0)
    with pytest.raises(DeviceError, match="speed"):
        HostProfile(name="x", speed=0.0)


def test_host_profile_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.cli import main

    out = tmp_path / "h.json"
    assert main(["host-profile", "--out", str(out)]) == 0
    assert load_host_profile(out).microbench_us > 0
    assert "speed" in capsys.readouterr().out


def test_fitted_host_model_loads() -> None:
    hm = default_params().host_model
    assert isinstance(hm, HostModel)
    assert hm.source and hm.command and hm.metrics["rows"] > 0 and hm.sigma_log() > 0
    assert set(hm.generations) == {"torch-1", "torch-2"} and hm.generations["torch-2"] == 1.0
    assert HostModel.from_dict(hm.to_dict()) == hm


def test_row_settings_from_dataset_conditions() -> None:
    ex = row_settings({"runtime": "eager", "input_copy": True, "framework": "torch-1"}, {"host_clock_ghz": 2.2})
    assert ex.input_copy == "pageable" and ex.host.framework == "torch-1" and ex.host.speed == pytest.approx(2.2 / 3.0)
    timm = row_settings({"torch_compile": "dynamo", "torch_version_tag": "pt240"})
    assert timm.runtime == "compiled" and timm.host.framework == "torch-2" and timm.input_copy == "none"
    assert timm.torch_version == "2.4.0"  # the row's torch version (the SDPA math path's dtype follows it)
    assert row_settings({"torch_version_tag": "pt113"}).host.framework == "torch-1"
    assert row_settings({"framework": "torch-2"}).torch_version is None
    with pytest.warns(DeprecationWarning, match=r"Execution\.from_conditions is deprecated"):
        old = Execution.from_conditions({"torch_compile": "dynamo", "torch_version_tag": "pt240"})
    # the deprecated Execution carries no torch version
    assert execution_settings(old) == dataclasses.replace(timm, torch_version=None)


def _depthwise_chain(batch: int, channels: int, size: int, dtype: str, layers: int = 8,
                     per_group: int = 1) -> OperatorGraph:
    """``layers`` grouped 3x3 convolutions at (batch, channels, size, size), ``per_group`` channels per group
    (1: depthwise)."""
    s = (batch, channels, size, size)
    macs = batch * channels * size * size * 9 * per_group
    nodes = [_node(i, "nn.conv2d", "conv", s, [s, (channels, per_group, 3, 3)], [False, True], dtype=dtype,
                   flops=2 * macs, macs=macs, attrs={"groups": channels // per_group, "out_channels": channels,
                                                     "in_channels_per_group": per_group, "depthwise": per_group == 1,
                                                     "data_layout": "NCHW", "kernel": [3, 3]})
             for i in range(layers)]
    pbytes = sum(n.param_bytes for n in nodes)
    return OperatorGraph(nodes=nodes, edges=[(i, i + 1) for i in range(layers - 1)], input_consumers={"x": [0]},
                         outputs=[layers - 1], spec=InputSpec(shape=(channels, size, size), batch_size=batch,
                                                               dtype=dtype),
                         param_count=pbytes // dtype_bytes(dtype), param_bytes=pbytes, mode="export").validate()


def test_half_depthwise_convolutions_run_at_the_native_fp16_rate_on_pascal() -> None:
    # PyTorch gives cuDNN half depthwise convolutions only from compute capability 7.0; on Pascal its own kernel
    # runs them in native half arithmetic (GP102: 1/64 of FP32); on Turing half runs at twice the FP32 rate
    busy = {(dev, dt): estimate(_depthwise_chain(64, 256, 56, dt), dev, runtime="cuda-graphs").gpu_busy_ms
            for dev in ("titan-xp", "titan-rtx") for dt in ("float16", "float32")}
    assert busy[("titan-xp", "float16")] > 20 * busy[("titan-xp", "float32")]
    assert busy[("titan-rtx", "float16")] <= busy[("titan-rtx", "float32")]
    # the stacked path (many graphs at once) prices them the same; a grouped convolution with 4 channels per group
    # (ResNeXt) stays cuDNN's
    from dippm_nas.prior import estimate_many

    graphs = [_depthwise_chain(64, 256, 56, "float16"), conv_chain(8, 64, 32, dtype="float16")]
    many = estimate_many(graphs, "titan-xp", runtime="cuda-graphs")
    for g, e in zip(graphs, many):
        assert e.gpu_busy_ms == pytest.approx(estimate(g, "titan-xp", runtime="cuda-graphs").gpu_busy_ms, rel=1e-9)
    grouped = _depthwise_chain(64, 256, 56, "float16", per_group=4)
    assert estimate(grouped, "titan-xp", runtime="cuda-graphs").gpu_busy_ms < busy[("titan-xp", "float16")] / 5


def test_turing_and_pascal_catalogue_entries() -> None:
    for dev_id, arch in (("rtx-2080-ti", "turing"), ("titan-rtx", "turing"), ("titan-xp", "pascal")):
        d = get_device(dev_id)
        assert d.architecture == arch and "float64" in d.dtypes and d.fp64_tflops < d.fp32_tflops / 16
        assert d.bf16_tensor_tflops is None and d.tf32_tensor_tflops is None
    assert get_device("titan-xp").fp16_tensor_tflops is None
    # Pascal: PyTorch's half-precision kernels compute in FP32 math, not at GP102's 1/64 FP16 rate
    g16, g32 = conv_chain(64, 64, 32, dtype="float16"), conv_chain(64, 64, 32, dtype="float32")
    graphs_rt = DeploymentSettings(runtime="cuda-graphs")
    e16, e32 = estimate(g16, "titan-xp", deployment=graphs_rt), estimate(g32, "titan-xp", deployment=graphs_rt)
    assert e16.gpu_busy_ms < 2 * e32.gpu_busy_ms
    e64 = estimate(conv_chain(64, 64, 32, dtype="float64"), "titan-xp", deployment=graphs_rt)
    assert e64.gpu_busy_ms > 10 * e32.gpu_busy_ms


def test_ryujaehun_import_without_graphs(tmp_path: Path) -> None:
    from dippm_nas.dataset import DatasetStore, import_ryujaehun

    csv = shared_data_or_skip("ryujaehun_torchvision_eager_bs12_turing_pascal.csv")
    out = tmp_path / "r.sqlite"
    rep = import_ryujaehun(csv, out, capture_graphs=False, progress=False)
    assert rep.inserted == 288 and rep.failed_rows == 0
    again = import_ryujaehun(csv, out, capture_graphs=False, progress=False)
    assert again.inserted == 0 and again.already_present == 288
    rows = list(DatasetStore(out).iter_measurements())
    assert {r["device"] for r in rows} == {"rtx-2080-ti", "titan-rtx", "titan-xp"}
    assert all(r["conditions"]["input_copy"] and r["conditions"]["runtime"] == "eager" for r in rows)


def _parts(g: OperatorGraph) -> tuple:
    e = estimate(g, "a100-sxm4-40gb")
    return e.node_time_ms * 1e3, e.node_host_ms * 1e3, e.pass_host_ms * 1e3


def test_calibration_separates_a_host_factor_from_a_gpu_factor() -> None:
    from dippm_nas.predictor import fit_timeline_factors
    from dippm_nas.prior import latency_us

    graphs = HOST_BOUND + GPU_BOUND + [conv_chain(8, 64, 32), conv_chain(32, 64, 32, layers=20)]
    parts = [_parts(g) for g in graphs]
    truth = [latency_us(gu * 0.8, hu * 1.6, pre * 1.6) / 1e3 for gu, hu, pre in parts]
    tf = fit_timeline_factors(parts, truth)
    assert math.exp(tf.host_log) == pytest.approx(1.6, rel=0.05)
    assert math.exp(tf.gpu_log) == pytest.approx(0.8, rel=0.05)
    assert tf.split_kept == pytest.approx(1.0, abs=0.02) and 0.0 <= tf.kept <= 1.0 and tf.n == len(graphs)
    # only GPU-bound measurements: the host factor is not identified and stays near 1
    gpu_only = fit_timeline_factors(parts[3:5], truth[3:5])
    assert abs(gpu_only.host_log) < 0.1 and math.exp(gpu_only.gpu_log) == pytest.approx(0.8, rel=0.1)
    with pytest.raises(DippmNasError, match="at least 2"):
        fit_timeline_factors(parts[:1], truth[:1])
    with pytest.raises(DippmNasError, match="> 0"):
        fit_timeline_factors(parts[:2], [1.0, -2.0])


def test_calibrate_with_one_measurement_keeps_predictions_and_says_so(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.predictor import _gnn_adapt

    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    p = get_predictor("a100-sxm4-40gb")
    g = HOST_BOUND[0]
    before = p.predict_graphs([g], mig=False)[0]
    _gnn_adapt._warn_once.reset()  # said once per process: an earlier test may have said it already
    with pytest.warns(RuntimeWarning, match="at least 2 measurements"):
        assert p.calibrate([(g, {"latency_ms": 1.0})], persist=False) is None
    assert p.predict_graphs([g], mig=False)[0] == before
    with pytest.raises(DippmNasError, match="not finite numbers > 0"):
        p.calibrate([(g, {"latency_ms": 0.0}), (HOST_BOUND[1], {"latency_ms": 1.0})], persist=False)


def test_analytic_gpu_latency_has_a_sigma_from_the_host_models_heldout_error() -> None:
    for g in (HOST_BOUND[1], GPU_BOUND[0]):
        p = AnalyticPredictor("h100-sxm5-80gb").predict_graphs([g], mig=False, deployment=features_deployment())[0]
        assert p.latency_source == "analytic" and p.latency_ms_std is not None
        hm = default_params().host_model
        s = p.latency_ms_std / p.latency_ms
        assert 0.5 * min(hm.sigma_log(), hm.sigma_log_gpu()) < s <= math.hypot(hm.sigma_log(), hm.sigma_log_gpu()) + 1e-9


@pytest.mark.parametrize("device", ["a100-sxm4-40gb", "h100-sxm5-80gb"])
def test_float64_runs_on_datacenter_gpus_with_the_measured_float64_sigma(device: str) -> None:
    """A100 and H100 have an FP64 peak, so float64 graphs are predicted there; a GPU-bound float64 graph's σ is
    the float64 rows' measured error (`sigma_log_gpu_bound_float64`), not float32's."""
    from dippm_nas.devices import get_device

    assert "float64" in get_device(device).dtypes
    hm = default_params().host_model
    assert hm.sigma_log_gpu("float64") == hm.metrics["sigma_log_gpu_bound_float64"]
    assert hm.sigma_log_gpu("float64") != hm.sigma_log_gpu("float32") == hm.sigma_log_gpu()
    g64, g32 = conv_chain(256, 256, 56, layers=6, dtype="float64"), conv_chain(256, 256, 56, layers=6, dtype="float32")
    p64, p32 = AnalyticPredictor(device).predict_graphs([g64, g32], mig=False, deployment=features_deployment())
    assert p64.latency_ms > 2 * p32.latency_ms  # the FP64 peak is half the FP32 one or less (TF32 convs: more)
    s64, s32 = p64.latency_ms_std / p64.latency_ms, p32.latency_ms_std / p32.latency_ms
    assert s64 == pytest.approx(hm.sigma_log_gpu("float64"), rel=0.15)
    assert s32 == pytest.approx(hm.sigma_log_gpu("float32"), rel=0.15)


def test_float64_gemms_use_fp64_tensor_cores_and_convolutions_do_not() -> None:
    """On a GPU with FP64 tensor cores (A100: 19.5 TFLOPS against 9.7 on CUDA cores) a float64 matmul is
    priced at the tensor-core peak; without the field (the same entry without it) at the CUDA-core one."""
    import dataclasses

    from dippm_nas.devices import get_device
    from dippm_nas.prior import estimate

    a100 = get_device("a100-sxm4-40gb")
    assert (a100.fp64_tflops, a100.fp64_tensor_tflops) == (9.7, 19.5)
    no_dmma = dataclasses.replace(a100, fp64_tensor_tflops=None)  # same id: the same fitted scales
    n, s = 4096, (4096, 4096)
    mm = OperatorGraph(nodes=[_node(0, "matmul", "matmul", s, [s, s], [False, True], dtype="float64",
                                    flops=2 * n ** 3, macs=n ** 3)],
                       edges=[], input_consumers={"x": [0]}, outputs=[0],
                       spec=InputSpec(shape=(n,), batch_size=n, dtype="float64"),
                       param_count=n * n, param_bytes=8 * n * n, mode="export").validate()
    t_dmma = estimate(mm, a100).gpu_busy_ms
    t_cuda = estimate(mm, no_dmma).gpu_busy_ms
    assert t_cuda > 1.6 * t_dmma
    conv = conv_chain(64, 256, 56, layers=2, dtype="float64")
    assert estimate(conv, a100).gpu_busy_ms == pytest.approx(estimate(conv, no_dmma).gpu_busy_ms)


def test_fp64_efficiency_replaces_the_fp32_constants_of_its_classes_only_where_set() -> None:
    """``eta_compute_fp64`` prices a class's FP64 CUDA-core kernels at that share of the FP64 peak without the
    wave, tile and reduction-length terms; ``None`` (a calibration file without the key) keeps the FP32
    constants; other dtypes never change; a bad value is refused."""
    import dataclasses

    from dippm_nas.errors import InvalidValueError
    from dippm_nas.prior import OpClassParams, PriorParams, estimate

    base = default_params()
    oc = dict(base.op_classes)
    oc["conv"] = dataclasses.replace(oc["conv"], eta_compute_fp64=None)
    off = dataclasses.replace(base, op_classes=oc)
    slow = dataclasses.replace(off, op_classes={**oc, "conv": dataclasses.replace(oc["conv"], eta_compute_fp64=0.25)})
    fast = dataclasses.replace(off, op_classes={**oc, "conv": dataclasses.replace(oc["conv"], eta_compute_fp64=1.0)})
    g64 = conv_chain(64, 256, 56, layers=4, dtype="float64")
    t = {name: estimate(g64, "titan-rtx", params=p).gpu_busy_ms for name, p in
         (("off", off), ("slow", slow), ("fast", fast))}
    assert t["slow"] > t["fast"] and t["slow"] / t["fast"] == pytest.approx(4.0, rel=0.05)  # compute-bound at 1/32
    assert t["off"] != pytest.approx(t["fast"], rel=0.01)  # the FP32 constants (eta 1.41 with penalties) differ
    g32 = conv_chain(64, 256, 56, layers=4, dtype="float32")
    assert estimate(g32, "titan-rtx", params=slow).gpu_busy_ms == estimate(g32, "titan-rtx", params=off).gpu_busy_ms
    d = off.to_dict()
    for c in d["op_classes"].values():
        c.pop("eta_compute_fp64")
    assert PriorParams.from_dict(d).op_classes["conv"].eta_compute_fp64 is None
    with pytest.raises(InvalidValueError, match="eta_compute_fp64"):
        OpClassParams(eta_compute_fp64=0.0)
    assert base.op_classes["conv"].eta_compute_fp64 is not None  # the shipped constants carry the fitted one
