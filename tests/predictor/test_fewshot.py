"""Few-shot calibration with host, GPU and op-class GPU factors (no GPU, no network, no ../shared)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from dippm_nas import Deployment
import pytest

from test_runtime import _node as runtime_node
from dippm_nas.errors import DeviceError, DippmNasError
from dippm_nas.graph import OperatorGraph, OpNode
from dippm_nas.predictor import (ANALYTIC_IDENTITY, AnalyticPredictor, Calibration, TimelineFactors,
                                 calibration_classes, calibration_path, fit_timeline_factors, get_predictor,
                                 load_calibration)
from dippm_nas.prior import estimate, latency_us
from dippm_nas.spec import InputSpec

DEVICE = "h100-sxm5-80gb"  # no checkpoint: the analytic prior answers


def _node(i: int, name: str, cls: str, shape: tuple[int, ...], ins: list[tuple[int, ...]], par: list[bool], *,
          flops: int, macs: int = 0, attrs: dict | None = None, dtype: str = "float16") -> OpNode:
    return runtime_node(i, name, cls, shape, ins, par, dtype=dtype, flops=flops, macs=macs, attrs=attrs)


def chain(batch: int, channels: int, size: int, layers: int, *, depthwise: int = 0) -> OperatorGraph:
    """``layers`` x (3x3 conv -> relu) at (batch, channels, size, size); the first ``depthwise`` layers'
    convolutions are depthwise (groups = channels)."""
    s = (batch, channels, size, size)
    nodes, edges = [], []
    for layer in range(layers):
        dw = layer < depthwise
        groups = channels if dw else 1
        macs = batch * channels * size * size * (channels // groups) * 9
        i = len(nodes)
        nodes.append(_node(i, "nn.conv2d", "conv", s, [s, (channels, channels // groups, 3, 3)], [False, True],
                           flops=2 * macs, macs=macs,
                           attrs={"groups": groups, "out_channels": channels, "in_channels_per_group": channels // groups,
                                  "depthwise": dw, "data_layout": "NCHW", "kernel": [3, 3]}))
        nodes.append(_node(i + 1, "nn.relu", "activation", s, [s], [False], flops=math.prod(s)))
        edges += [(i, i + 1)] + ([(i - 1, i)] if layer else [])
    pbytes = sum(n.param_bytes for n in nodes)
    return OperatorGraph(nodes=nodes, edges=sorted(edges), input_consumers={"x": [0]}, outputs=[len(nodes) - 1],
                         spec=InputSpec(shape=(channels, size, size), batch_size=batch, dtype="float16"),
                         param_count=pbytes // 2, param_bytes=pbytes, mode="export").validate()


HOST_BOUND = [chain(1, 16, 8, 30), chain(1, 32, 16, 40), chain(2, 8, 4, 50)]
GPU_BOUND = [chain(256, 256, 56, 6), chain(512, 128, 56, 8), chain(128, 256, 28, 10), chain(256, 64, 56, 12)]
DEPTHWISE = [chain(256, 256, 56, 8, depthwise=6), chain(512, 128, 56, 10, depthwise=8),
             chain(256, 512, 28, 8, depthwise=6), chain(512, 256, 28, 10, depthwise=7)]


def _parts(g: OperatorGraph) -> tuple[np.ndarray, np.ndarray, float]:
    e = estimate(g, DEVICE, deployment=Deployment())  # the centre of an undescribed deployment, which calibrate() fits
    return e.node_time_ms * 1e3, e.node_host_ms * 1e3, e.pass_host_ms * 1e3


def _truth(g: OperatorGraph, host: float, gpu: float, classes: dict[str, float] | None = None) -> float:
    gu, hu, pre = _parts(g)
    mult = np.array([gpu * (classes or {}).get(c, 1.0) for c in calibration_classes(g)])
    return latency_us(gu * mult, hu * host, pre * host) / 1e3


def test_node_classes_tell_dense_depthwise_and_memory_bound_kernels_apart() -> None:
    c = calibration_classes(DEPTHWISE[0])
    assert list(c[:2]) == ["conv_depthwise", "memory_bound"] and c[-2] == "conv"


def test_calibration_separates_a_synthetic_host_factor_from_a_gpu_factor() -> None:
    graphs = HOST_BOUND + GPU_BOUND
    truth = [_truth(g, 1.6, 0.8) for g in graphs]
    tf = fit_timeline_factors([_parts(g) for g in graphs], truth, node_classes=[calibration_classes(g) for g in graphs])
    assert math.exp(tf.host_log) == pytest.approx(1.6, rel=0.05)
    assert math.exp(tf.gpu_log) == pytest.approx(0.8, rel=0.05)
    # no class differs from the common factor: none is moved off it
    assert all(abs(d) < 0.03 for d in tf.class_log.values()), tf.class_log
    p = AnalyticPredictor(DEVICE, load_calibration=False)
    cal = p.calibrate(list(zip(graphs, [{"latency_ms": t} for t in truth])), persist=False)
    assert cal is not None and math.exp(cal.timeline_factors.host_log) == pytest.approx(1.6, rel=0.05)
    new = chain(1, 24, 12, 35)  # host-bound, not measured: the host factor carries to it
    (pred,) = p.predict_graphs([new], mig=False)
    assert pred.latency_source == "calibrated"
    assert pred.latency_ms == pytest.approx(_truth(new, 1.6, 0.8), rel=0.05)
    (uncalibrated,) = AnalyticPredictor(DEVICE, load_calibration=False).predict_graphs([new], mig=False)
    assert pred.details["uncalibrated_latency_ms"] == pytest.approx(uncalibrated.latency_ms)
    assert pred.details["calibration_host_factor"] == pytest.approx(1.6, rel=0.05)


def test_a_depthwise_class_factor_is_recovered_only_when_the_measured_models_run_it() -> None:
    slow = {"conv_depthwise": 2.5}
    with_dw = GPU_BOUND + DEPTHWISE[:3]
    truth = [_truth(g, 1.0, 1.2, slow) for g in with_dw]
    tf = fit_timeline_factors([_parts(g) for g in with_dw], truth,
                              node_classes=[calibration_classes(g) for g in with_dw])
    assert tf.class_factors["conv_depthwise"] == pytest.approx(1.2 * 2.5, rel=0.1)
    assert tf.class_kept["conv_depthwise"] > 0.9
    assert math.exp(tf.gpu_log + tf.class_log.get("conv", 0.0)) == pytest.approx(1.2, rel=0.1)
    held = DEPTHWISE[3]
    (gu, hu, pre), cls = _parts(held), calibration_classes(held)
    assert latency_us(*tf.apply(gu, hu, pre, cls)) / 1e3 == pytest.approx(_truth(held, 1.0, 1.2, slow), rel=0.08)
    # measured models without depthwise convolutions: no class factor for them, the common factor applies
    dense = GPU_BOUND
    tf2 = fit_timeline_factors([_parts(g) for g in dense], [_truth(g, 1.0, 1.2, slow) for g in dense],
                               node_classes=[calibration_classes(g) for g in dense])
    assert "conv_depthwise" not in tf2.class_log
    assert latency_us(*tf2.apply(gu, hu, pre, cls)) / 1e3 == pytest.approx(latency_us(gu * 1.2, hu, pre) / 1e3,
                                                                            rel=0.05)


def test_a_class_only_one_noisy_label_runs_stays_at_the_common_factor() -> None:
    noise = [0.05, -0.05, 0.04, -0.04, 0.05, -0.05]
    graphs = GPU_BOUND + [chain(64, 128, 56, 10), chain(128, 96, 56, 10)]
    labels = [_truth(g, 1.0, 1.3) * math.exp(e) for g, e in zip(graphs, noise)]
    one = DEPTHWISE[0]  # the only model with depthwise convolutions; its label is off by as much as the others
    graphs, labels = graphs + [one], labels + [_truth(one, 1.0, 1.3) * math.exp(0.05)]
    tf = fit_timeline_factors([_parts(g) for g in graphs], labels, node_classes=[calibration_classes(g) for g in graphs])
    assert tf.class_factors["conv_depthwise"] == pytest.approx(math.exp(tf.gpu_log), rel=0.02)
    assert tf.class_kept["conv_depthwise"] < 0.5
    assert math.exp(tf.gpu_log) == pytest.approx(1.3, rel=0.05)


def test_analytic_calibration_persists_and_reports_class_factors() -> None:
    graphs = GPU_BOUND + DEPTHWISE[:3]
    pairs = [(g, {"latency_ms": _truth(g, 1.0, 0.9, {"conv_depthwise": 2.0})}) for g in graphs]
    p = AnalyticPredictor(DEVICE, load_calibration=False)
    cal = p.calibrate(pairs)
    assert cal is not None and calibration_path(DEVICE).is_file()
    assert cal.gpu_class_factors["conv_depthwise"] == pytest.approx(1.8, rel=0.1)
    assert set(cal.gpu_class_kept) == set(cal.gpu_class_factors)
    again = AnalyticPredictor(DEVICE)  # re-applied from the cache directory
    assert again.calibration == cal
    (pred,) = again.predict_graphs([DEPTHWISE[3]], mig=False)
    assert pred.latency_source == "calibrated"
    assert pred.details["calibration_class_factor_conv_depthwise"] == pytest.approx(1.8, rel=0.1)
    assert 0.0 <= pred.details["calibration_class_kept_conv_depthwise"] <= 1.0
    again.reset_calibration()
    assert not calibration_path(DEVICE).is_file()
    assert AnalyticPredictor(DEVICE).predict_graphs([DEPTHWISE[3]], mig=False)[0].latency_source == "analytic"


def test_a_calibration_file_without_class_factors_still_loads() -> None:
    old = {"device": DEVICE, "checkpoint": ANALYTIC_IDENTITY.format(device=DEVICE), "coef": {}, "n": {},
           "date": "2026-11-01T00:00:00+00:00", "kept": {},
           "timeline": {"host_log": math.log(1.5), "gpu_log": math.log(0.9), "residual_std_log": 0.05, "kept": 1.0,
                        "n": 5}}
    path = calibration_path(DEVICE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old))
    try:
        cal = load_calibration(DEVICE, ANALYTIC_IDENTITY.format(device=DEVICE))
        assert cal is not None and cal.gpu_class_factors == {} and cal.timeline_factors.class_log == {}
        (pred,) = AnalyticPredictor(DEVICE).predict_graphs([HOST_BOUND[0]], mig=False)
        assert pred.details["calibration_host_factor"] == pytest.approx(1.5)
        assert not any(k.startswith("calibration_class_") for k in pred.details)
        # a GnnPredictor's file of the same layout (the checkpoint's identity) loads too
        gp = get_predictor("a100-sxm4-40gb")
        from dippm_nas.predictor import checkpoint_identity
        gcal = Calibration(**{**old, "device": gp.device, "checkpoint": checkpoint_identity(gp.meta)})
        gp.calibration = gcal
        gp.clear_prediction_cache()
        try:
            (gpred,) = gp.predict_graphs([HOST_BOUND[0]], mig=False)
            assert gpred.latency_source == "calibrated" and gpred.details["calibration_gpu_factor"] == pytest.approx(0.9)
        finally:
            gp.reset_calibration(persist=False)
    finally:
        path.unlink()


def test_bad_calibration_input() -> None:
    p = AnalyticPredictor(DEVICE, load_calibration=False)
    g1, g2 = HOST_BOUND[0], HOST_BOUND[1]
    for bad in (0.0, -3.0, math.nan):
        with pytest.raises(DippmNasError, match=f"{bad}"):
            p.calibrate([(g1, {"latency_ms": bad}), (g2, {"latency_ms": 1.0})], persist=False)
        with pytest.raises(DippmNasError, match=f"{bad}"):
            get_predictor("a100-sxm4-40gb").calibrate([(g1, {"latency_ms": bad}), (g2, {"latency_ms": 1.0})],
                                                      persist=False)
        with pytest.raises(DippmNasError, match=f"{bad}"):
            fit_timeline_factors([_parts(g1), _parts(g2)], [bad, 1.0])
    before = p.predict_graphs([g1], mig=False)[0]
    with pytest.warns(RuntimeWarning, match="at least 2 measurements"):
        assert p.calibrate([(g1, {"latency_ms": 1.0})], persist=False) is None
    assert p.calibration is None and p.predict_graphs([g1], mig=False)[0] == before
    with pytest.raises(DeviceError, match="CPU"):
        AnalyticPredictor("host-cpu").calibrate([(g1, {"latency_ms": 1.0}), (g2, {"latency_ms": 2.0})])
    with pytest.raises(DippmNasError, match="one array per measurement"):
        fit_timeline_factors([_parts(g1), _parts(g2)], [1.0, 2.0], node_classes=[calibration_classes(g1)])
    with pytest.raises(DippmNasError, match="one class per node"):
        fit_timeline_factors([_parts(g1), _parts(g2)], [1.0, 2.0],
                             node_classes=[calibration_classes(g1), calibration_classes(g1)])


def test_timeline_factors_round_trip_through_json() -> None:
    tf = TimelineFactors(host_log=0.1, gpu_log=-0.2, residual_std_log=0.03, kept=0.8, n=5,
                         class_log={"conv_depthwise": 0.5}, class_kept={"conv_depthwise": 0.9})
    assert TimelineFactors.from_dict(json.loads(json.dumps(dataclasses.asdict(tf)))) == tf


def test_the_validator_feeds_measured_trials_to_the_gpu_predictors_factors(tmp_path) -> None:
    optuna = pytest.importorskip("optuna")
    pytest.importorskip("sqlalchemy")
    from dippm_nas.capture import assemble
    from dippm_nas.measure import Measurement
    from dippm_nas.predictor import predict, set_predictor
    from dippm_nas.validation import ParetoValidator
    import search_spaces

    spec = InputSpec(shape=(4,), batch_size=2)

    def cfg(width: int) -> dict:
        return {"in_features": 4, "hidden": [width], "out_features": 2}

    def truth(width: int) -> float:  # the prior's timelines with the host 2x slower
        gu, hu, pre = _parts(assemble("mlp", cfg(width), spec))
        return latency_us(gu, hu * 2.0, pre * 2.0) / 1e3

    def measure(model, spec_, device, settings) -> Measurement:
        return Measurement(latency_ms=truth(model.search_space_config["hidden"][0]), latency_ms_std=0.0,
                           energy_j=None, memory_mib=1.0, memory_source="torch_max_reserved", n_repeats=5, device="cuda:0",
                           environment={"fake": True}, energy_reason="fake", batch_size=2, dtype="float32")

    study = optuna.create_study(directions=["maximize", "minimize"], storage=f"sqlite:///{tmp_path / 's.db'}")
    for i, w in enumerate([8, 16, 32]):
        attrs = {"search_space": "mlp", "search_space_config": cfg(w), "input_spec": spec.to_dict(),
                 "predicted_latency_ms": 1.0, "predicted_latency_ms_std": None, "predicted_memory_mib": 1.0,
                 "predicted_memory_mib_std": None, "predicted_energy_j": None}
        study.add_trial(optuna.trial.create_trial(values=[i, i], user_attrs=attrs))
    set_predictor(DEVICE, AnalyticPredictor(DEVICE, load_calibration=False))
    try:
        v = ParetoValidator(DEVICE, max_per_round=3, auto_calibrate=True, min_calibration_rows=3,
                            measure_fn=measure)
        v.run_round(study)
        assert v.calibration is not None and v.calibration.method == "timeline_factors"
        assert math.exp(v.calibration.timeline["host_log"]) == pytest.approx(2.0, rel=0.05)
        summary = study.user_attrs["dippm_validation"]["calibration"]
        assert summary["method"] == "timeline_factors" and summary["timeline"]["n"] == 3
        pred = predict(search_spaces.build_model("mlp", cfg(24)), spec, DEVICE, mig=False)
        assert pred.latency_source == "calibrated" and pred.latency_ms == pytest.approx(truth(24), rel=0.05)
    finally:
        set_predictor(DEVICE, None)


def test_a_checkpoints_calibration_fits_the_timeline_and_class_factors() -> None:
    p = get_predictor("a100-sxm4-40gb")
    graphs = GPU_BOUND + DEPTHWISE[:3]
    raw = p.predict_graphs(graphs + [DEPTHWISE[3]], mig=False)
    try:
        cal = p.calibrate([(g, {"latency_ms": 1.3 * r.latency_ms}) for g, r in zip(graphs, raw)], persist=False)
        assert cal is not None and cal.timeline_factors is not None
        assert all(0.0 <= w <= 1.0 for w in cal.gpu_class_kept.values())
        (held,) = p.predict_graphs([DEPTHWISE[3]], mig=False)
        assert held.latency_source == "calibrated"
        assert held.latency_ms == pytest.approx(1.3 * raw[-1].latency_ms, rel=0.05)
        assert held.details["uncalibrated_latency_ms"] == pytest.approx(raw[-1].latency_ms)
        assert held.details["calibration_gpu_factor"] * held.details["calibration_host_factor"] > 1.0
        for c in cal.gpu_class_factors:
            assert 0.0 <= held.details[f"calibration_class_kept_{c}"] <= 1.0
    finally:
        p.reset_calibration(persist=False)


def test_the_few_shot_benchmark_scores_a_known_correction(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/accuracy/accuracy_eager.py's few_shot (also used by fewshot_timm.py) on synthetic labels: the prior's
    timelines with the host 1.5x and the kernels 0.7x, which a fit on 5 models recovers for the rest."""
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"
    monkeypatch.syspath_prepend(str(bench))
    from accuracy_eager import few_shot
    from fewshot_timm import held_out_params

    graphs = HOST_BOUND + GPU_BOUND + [chain(4, 32, 16, 20), chain(64, 64, 28, 8), chain(1, 64, 8, 60)]
    ests = [estimate(g, DEVICE, deployment=Deployment()) for g in graphs]  # what _truth scales
    y = np.array([_truth(g, 1.5, 0.7) for g in graphs])
    prior = np.array([e.latency_ms for e in ests])
    res = few_shot(ests, [calibration_classes(g) for g in graphs], prior, y, np.arange(len(graphs)), 5, 4)
    zero = float(np.mean(np.abs(prior / y - 1)) * 100)
    assert res["zero_shot_mape_pct"] == pytest.approx(zero, rel=0.5) and zero > 15
    assert res["mape_pct"] < 3.0 and res["all_rows_in_sample_mape_pct"] < 3.0
    assert res["all_rows_factors"]["host"] == pytest.approx(1.5, rel=0.03)
    from dippm_nas.prior import default_params

    base = default_params()
    if "rtx-3090" in base.device_scales:
        p = held_out_params(base, "rtx-3090")
        assert "rtx-3090" not in p.device_scales and "rtx-3090" in p.device_scales["*"].source
    assert "accuracy_eager" in sys.modules
