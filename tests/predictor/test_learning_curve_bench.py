"""benchmarks/accuracy/learning_curve.py's per-row deployment and host-bound split (no GPU, no data files):
the eager CNN timings' deployment as accuracy_deployment.py reads it, one deployment per group, and rows measured
under a described deployment calibrated and scored for it."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dippm_nas import Deployment
from dippm_nas.dataset import MeasuredGraph
from dippm_nas.features import FEATURE_SCHEMA_VERSION, device_dim, node_dim, static_dim
from dippm_nas.graph import synthetic_resnet_graph
from dippm_nas.predictor import CheckpointMeta, GnnPredictor, SageEnsemble

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"
GPU = "titan-xp"


@pytest.fixture()
def lc(monkeypatch: pytest.MonkeyPatch):  # the benchmark script as a module (its sibling imports on the path)
    monkeypatch.syspath_prepend(str(BENCH))
    import learning_curve

    return learning_curve


def _eager_row(clock: float, graph=None) -> MeasuredGraph:
    """A row shaped like `dippm-nas dataset import ryujaehun` writes one (the fields described() reads)."""
    m = {"source": "ryujaehun", "device": GPU, "latency_ms": 10.0,
         "environment": {"cuda": "10.2", "host_clock_ghz": clock},
         "conditions": {"framework": "torch-1", "input_copy": True, "cudnn_benchmark": True, "runtime": "eager"}}
    return MeasuredGraph(graph=graph, spec=None, measurement=m)


def test_score_splits_host_bound_rows(lc) -> None:
    pred, y = np.array([1.1, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 5.0])
    s = lc.score(pred, np.full(4, 0.01), y, np.array([True, True, False, False]))
    assert s["mape_pct"] == pytest.approx((10 + 0 + 0 + 20) / 4)
    assert s["mape_host_bound_pct"] == pytest.approx(5.0) and s["mape_gpu_bound_pct"] == pytest.approx(10.0)
    assert s["host_bound_share"] == 0.5 and s["coverage_2sigma"] == 0.5
    none = lc.score(pred, np.full(4, 0.01), y, np.zeros(4, dtype=bool))
    assert math.isnan(none["mape_host_bound_pct"]) and lc._median([math.nan, none["mape_host_bound_pct"]]) != 0.0


def test_a_group_gets_the_deployment_its_rows_record(lc) -> None:
    dep = lc.group_deployment([_eager_row(2.2), _eager_row(2.2)], "described")
    assert isinstance(dep, Deployment) and dep.runtime == "eager" and dep.input_copy == "pageable"
    assert dep.framework == "torch-1" and dep.cudnn_benchmark and dep.host.clock_ghz == pytest.approx(2.2)
    assert lc.group_deployment([_eager_row(2.2)], "none") is None
    with pytest.raises(SystemExit, match="2 deployments"):
        lc.group_deployment([_eager_row(2.2), _eager_row(3.7)], "described")


def _gpu_predictor() -> GnnPredictor:
    torch.manual_seed(0)
    meta = CheckpointMeta(device=GPU, targets={"latency_ms": "ms"}, feature_schema_version=FEATURE_SCHEMA_VERSION,
                          feature_style="ours", data_sources=["synthetic test data"], heldout_metrics={},
                          date="2026-01-01", trained_on=[GPU], hidden=16, layers=3, members=3, residual_on_prior=True,
                          std_floor_log={"latency_ms": 0.05}, prior_params=None, node_dim=node_dim(),
                          static_dim=static_dim(), device_dim=device_dim())
    model = SageEnsemble(meta.node_dim, meta.static_dim, meta.device_dim, meta.hidden, meta.layers, meta.members)
    with torch.no_grad():
        for prm in model.parameters():
            prm.mul_(0.3)
    return GnnPredictor(model, meta, GPU, load_calibration=False)


def test_rows_of_a_described_deployment_are_calibrated_and_scored_for_it(lc) -> None:
    """Latencies 1.3x the uncalibrated prediction for the slow eager host: the factors fitted on 5 measured rows under
    that deployment take the rest from ~23 % to near 0, and the host-bound split covers every scored row."""
    graphs = [synthetic_resnet_graph(nb, channels=ch, batch=b, size=s)
              for nb in (1, 3) for ch in (8, 32) for b in (1, 12) for s in (8, 16)]
    dep = lc.group_deployment([_eager_row(2.2)], "described")
    p = _gpu_predictor()
    y = 1.3 * np.array([x.latency_ms for x in p.predict_graphs(graphs, mig=False, deployment=dep)])
    args = argparse.Namespace(draws=1, pool=len(graphs), order="pareto")
    with p.one_network_pass(graphs):
        res = lc.run_group(p, graphs, y, [0, 5], args, dep)
    zero, factor = res["none"][0][0], res["factor"][5][0]
    assert zero["mape_pct"] == pytest.approx(100 * (1 - 1 / 1.3), rel=1e-3)
    assert factor["mape_pct"] < 2.0 and res["adapt"][5][0]["mape_pct"] == pytest.approx(factor["mape_pct"])
    assert 0.0 <= factor["host_bound_share"] <= 1.0
    assert not (math.isnan(factor["mape_host_bound_pct"]) and math.isnan(factor["mape_gpu_bound_pct"]))
    floor = lc.in_sample(p, graphs, y, dep)
    assert floor["factor_mape_pct"] < 2.0 and floor["adapt_mape_pct"] < 2.0
    assert p.calibration is None and p.adaptation is None  # the predictor is left as it was


def test_family_groups_are_a_gpu_and_a_timm_family(lc) -> None:
    """--group family: one group per measured GPU (catalogue id) and timm family of the row's model name."""
    def row(device: str, model: str | None, space: str = "timm") -> MeasuredGraph:
        return MeasuredGraph(graph=None, spec=None, measurement={"source": "timm", "device": device, "space": space,
                                                                 "config": {"model": model} if model else {}})

    assert lc.group_name(row("rtx-3090", "tf_efficientnet_b0"), "family") == "rtx-3090/efficientnet"
    assert lc.group_name(row("a100-40gb", "efficientnet_b3"), "family") == "a100-sxm4-40gb/efficientnet"
    assert lc.group_name(row("rtx-5090", "mobilenetv4_conv_small"), "family") == "rtx-5090/mobilenetv"
    assert lc.group_name(row("rtx-5090", "mobilenetv4_conv_small"), "device") == "rtx-5090"
    assert lc.group_name(row("rtx-5090", None), "space") == "timm"
    assert lc.group_name(row("rtx-5090", None), "none") == "all"
    assert "family" in lc.PER_GPU_GROUPS and "device" in lc.PER_GPU_GROUPS
    with pytest.raises(SystemExit, match="config\\['model'\\]"):
        lc.group_name(row("rtx-3090", None), "family")


def test_the_shipped_prediction_is_scored_on_each_rest(lc) -> None:
    """``none`` at n > 0 is the uncalibrated prediction scored on the same rows as the methods at that n."""
    graphs = [synthetic_resnet_graph(nb, channels=ch, batch=b, size=s)
              for nb in (1, 3) for ch in (8, 32) for b in (1, 12) for s in (8, 16)]
    p = _gpu_predictor()
    y = 1.3 * np.array([x.latency_ms for x in p.predict_graphs(graphs, mig=False)])
    with p.one_network_pass(graphs):
        res = lc.run_group(p, graphs, y, [0, 5], argparse.Namespace(draws=2, pool=len(graphs), order="pareto"))
    assert len(res["none"][5]) == 2 and len(res["factor"][5]) == 2
    for s in (*res["none"][0], *res["none"][5]):
        assert s["mape_pct"] == pytest.approx(100 * (1 - 1 / 1.3), rel=1e-3)


def test_random_order_measures_the_seeded_draw_not_the_pareto_front(lc, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs = [synthetic_resnet_graph(nb, channels=ch, batch=1, size=8) for nb in (1, 2, 3) for ch in (8, 16, 32)]
    p = _gpu_predictor()
    y = np.array([x.latency_ms for x in p.predict_graphs(graphs, mig=False)])

    def no_pareto(*_a: object) -> None:
        raise AssertionError("pareto_order called")

    monkeypatch.setattr(lc, "pareto_order", no_pareto)
    with p.one_network_pass(graphs):
        res = lc.run_group(p, graphs, y, [0, 3], argparse.Namespace(draws=1, pool=len(graphs), order="random"))
        assert len(res["factor"][3]) == 1
        with pytest.raises(AssertionError, match="pareto_order"):
            lc.run_group(p, graphs, y, [0, 3], argparse.Namespace(draws=1, pool=len(graphs), order="pareto"))
