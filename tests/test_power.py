"""The power model: node power, caps, host gaps, energy along the timeline, power.json, energy sources."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dippm_nas.devices import Device, get_device
from dippm_nas.errors import DippmNasError
from dippm_nas.features import FEATURE_SCHEMA_VERSION, device_dim, featurize, node_dim, static_dim
from dippm_nas.predictor import AnalyticPredictor
from dippm_nas.predictor import CheckpointMeta, GnnPredictor, SageEnsemble
from dippm_nas.prior import (
    NodeActivity,
    PowerParams,
    PowerTable,
    estimate,
    node_power_w,
    pass_energy_j,
    power_params_for,
    power_table,
    predict,
    utilisation_energy_j,
    wait_power_w,
)
from test_features import tiny_graph
from test_prior import _two_adds, ideal_params, matmul_graph
from _models import features_deployment


def toy(**changes) -> Device:
    base = dict(id="toy-gpu", name="Toy", kind="gpu", architecture="toyarch", sms=10, fp32_tflops=1.0,
                fp16_tflops=2.0, tf32_tensor_tflops=4.0, fp16_tensor_tflops=8.0, bf16_tensor_tflops=8.0,
                memory_gib=16.0, bandwidth_gbps=1000.0, l2_mib=1.0, board_power_w=300.0, idle_power_w=50.0)
    base.update(changes)
    return Device(**base)


def act(tc=0.0, fp=0.0, dram=0.0, n=1) -> NodeActivity:
    return NodeActivity(tensor_rate=np.full(n, tc), fp_rate=np.full(n, fp), dram_rate=np.full(n, dram))


SHARES = PowerParams(busy=0.2, tensor=0.5, fp=0.3, dram=0.2, wait=0.1, sigma_log=0.1, fitted=True, source="test")


def test_node_power_is_idle_plus_shares_of_the_range_capped_at_board_power() -> None:
    dev = toy()  # range 250 W above 50 W idle
    assert node_power_w(SHARES, dev, act(tc=1.0))[0] == pytest.approx(50 + 250 * (0.2 + 0.5))
    assert node_power_w(SHARES, dev, act(fp=0.5, dram=1.0))[0] == pytest.approx(50 + 250 * (0.2 + 0.15 + 0.2))
    hot = dataclasses.replace(SHARES, tensor=1.5, dram=1.0)
    assert node_power_w(hot, dev, act(tc=1.0, dram=1.0))[0] == pytest.approx(300.0)  # the board limit
    assert wait_power_w(SHARES, dev) == pytest.approx(50 + 25)


def test_a_host_gap_costs_waiting_power_only() -> None:
    dev = toy()
    idle_only = dataclasses.replace(SHARES, wait=0.0)
    # no kernel runs: the GPU waits the whole pass
    assert pass_energy_j(idle_only, dev, np.zeros(3), act(n=3), 1000.0) == pytest.approx(50 * 1000e-6)
    assert pass_energy_j(SHARES, dev, np.zeros(3), act(n=3), 1000.0) == pytest.approx(75 * 1000e-6)
    # one 100 µs kernel at the tensor peak in a 1000 µs pass: its power for 100 µs, waiting power for 900 µs
    e = pass_energy_j(idle_only, dev, np.array([100.0]), act(tc=1.0), 1000.0)
    assert e == pytest.approx((225.0 * 100 + 50.0 * 900) * 1e-6)


def test_energy_grows_with_time() -> None:
    dev = toy()
    a = act(tc=0.7, dram=0.3, n=2)
    t = np.array([50.0, 80.0])
    energies = [pass_energy_j(SHARES, dev, t, a, lat) for lat in (130.0, 200.0, 400.0, 1000.0)]
    assert all(x < y for x, y in zip(energies, energies[1:]))
    longer = [pass_energy_j(SHARES, dev, t * k, a, 2000.0) for k in (1.0, 2.0, 4.0)]
    assert all(x < y for x, y in zip(longer, longer[1:]))
    # a latency shorter than the kernels (impossible on a timeline) adds no negative waiting energy
    assert pass_energy_j(SHARES, dev, t, a, 0.0) == pytest.approx(pass_energy_j(SHARES, dev, t, a, 130.0))


def test_estimate_integrates_power_over_its_timeline() -> None:
    dev = toy(bandwidth_gbps=1000.0)
    table = PowerTable(architectures={"toyarch": SHARES})
    # two memory-bound adds at full bandwidth, host-bound: 2.4 µs of kernels in a 21.2 µs pass
    e = estimate(_two_adds(1_200_000), dev, params=ideal_params(host_dispatch_us=10.0), power=table)
    busy_s, gap_s = 2.4e-6, 18.8e-6
    # each add: 1e5 FLOPs in 1.2 µs on a 1 TFLOP/s CUDA-core peak (rate 1/12), 1.2 MB at full bandwidth (rate 1)
    node_w = 50 + 250 * (0.2 + 0.3 * (1e5 / 1e12) / 1.2e-6 + 0.2 * 1.0)
    assert e.energy_j == pytest.approx(node_w * busy_s + 75 * gap_s, rel=1e-6)
    assert e.energy_source == "predicted" and e.energy_j_std == pytest.approx(0.1 * e.energy_j)
    # an architecture without a fit: the table's default, labelled analytic
    e2 = estimate(_two_adds(1_200_000), dev, params=ideal_params(host_dispatch_us=10.0),
                  power=PowerTable(default=dataclasses.replace(SHARES, fitted=False, sigma_log=0.4)))
    assert e2.energy_source == "analytic" and e2.energy_j_std == pytest.approx(0.4 * e2.energy_j)
    # no power figures: no energy
    e3 = estimate(_two_adds(1_200_000), toy(board_power_w=None, idle_power_w=None))
    assert e3.energy_j is None and e3.energy_j_std is None and e3.energy_source == "unavailable"


def test_tensor_core_work_draws_more_than_waiting() -> None:
    dev = get_device("h100-sxm5-80gb")
    big, small = matmul_graph(8192, 8192, 8192), matmul_graph(16, 64, 64)
    pb, ps = estimate(big, dev), estimate(small, dev)
    avg_big = pb.energy_j / (pb.latency_ms * 1e-3)
    avg_small = ps.energy_j / (ps.latency_ms * 1e-3)
    assert dev.idle_power_w < avg_small < avg_big <= dev.board_power_w + 1e-9


def test_shipped_power_file_loads_and_fits_hopper() -> None:
    table = power_table()
    assert "hopper" in table.architectures and table.architectures["hopper"].fitted
    assert not table.default.fitted and table.default.sigma_log > table.architectures["hopper"].sigma_log > 0
    assert table.command.startswith("python benchmarks/accuracy/accuracy_energy.py") and "ML.ENERGY" in table.source
    again = PowerTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert again == table
    assert power_params_for(get_device("h200-sxm-141gb")).fitted
    assert not power_params_for(get_device("a100-sxm4-40gb")).fitted


def test_power_file_rules(tmp_path: Path) -> None:
    with pytest.raises(DippmNasError, match="format must be 1"):
        PowerTable.from_dict({"format": 9})
    with pytest.raises(DippmNasError, match="unknown keys"):
        PowerTable.from_dict({"format": 1, "architectures": {"hopper": {"watts": 1.0}}})
    with pytest.raises(DippmNasError, match="share in"):
        PowerParams(tensor=-0.1)
    p = tmp_path / "power.json"
    PowerTable(architectures={"toyarch": SHARES}).save(p)
    assert PowerTable.load(p).for_architecture("ToyArch") == SHARES
    with pytest.raises(DippmNasError, match="cannot read"):
        PowerTable.load(tmp_path / "missing.json")


def test_fitted_architecture_gives_predicted_energy_on_both_paths() -> None:
    g = tiny_graph()
    # analytic path: prior.predict and the AnalyticPredictor
    for pr in (predict(g, "h100-sxm5-80gb", mig=False),
               AnalyticPredictor("h100-sxm5-80gb").predict_graphs([g], mig=False)[0]):
        assert pr.energy_source == "predicted" and pr.latency_source == "analytic"
        assert pr.energy_j > 0 and pr.energy_j_std == pytest.approx(
            pr.energy_j * power_table().architectures["hopper"].sigma_log)
    a100 = predict(g, "a100-sxm4-40gb", mig=False)
    assert a100.energy_source == "analytic" and a100.energy_j_std == pytest.approx(
        a100.energy_j * power_table().default.sigma_log)
    # GNN path: energy is not a target, the prior answers with the power model's source and σ
    torch.manual_seed(0)
    meta = CheckpointMeta(device="a100-sxm4-40gb", targets={"latency_ms": "ms"}, feature_schema_version=FEATURE_SCHEMA_VERSION,
                          feature_style="ours", data_sources=["synthetic"], heldout_metrics={}, date="2026-01-01",
                          trained_on=["a100-sxm4-40gb"], hidden=8, layers=2, members=2, residual_on_prior=True,
                          std_floor_log={"latency_ms": 0.01}, prior_params=None, node_dim=node_dim(),
                          static_dim=static_dim(), device_dim=device_dim())
    model = SageEnsemble(meta.node_dim, meta.static_dim, meta.device_dim, meta.hidden, meta.layers, meta.members)
    for dev, src in (("h100-sxm5-80gb", "predicted"), ("a100-sxm4-40gb", "analytic")):
        pr = GnnPredictor(model, meta, dev, load_calibration=False).predict_graphs(
            [g], mig=False, deployment=features_deployment())[0]   # the features' execution: the estimate's energy
        est = estimate(g, dev)
        assert pr.latency_source == "predicted" and pr.energy_source == src
        assert pr.energy_j == pytest.approx(est.energy_j) and pr.energy_j_std == pytest.approx(est.energy_j_std)


def test_gnn_energy_feature_keeps_the_single_share_formula() -> None:
    dev = get_device("a100-sxm4-40gb")
    g = tiny_graph()
    est = estimate(g, dev)
    legacy = utilisation_energy_j(est.node_time_ms, est.node_utilisation, est.latency_ms, dev)
    t = est.node_time_ms * 1e-3
    p = np.minimum(400.0, 55.0 + 345.0 * est.node_utilisation)
    assert legacy == pytest.approx(float((p * t).sum()) + 55.0 * max(0.0, est.latency_ms * 1e-3 - t.sum()))
    f = featurize(g, dev)
    assert f.static[17] == pytest.approx(math.log1p(legacy * 1e3), rel=1e-5)  # "prior_energy_j" column
    assert f.prior_energy_j == pytest.approx(est.energy_j)  # what the predictor answers with
    assert utilisation_energy_j(est.node_time_ms, est.node_utilisation, est.latency_ms,
                                dataclasses.replace(dev, board_power_w=None, idle_power_w=None)) is None
