"""The predictor contract (:class:`dippm_nas.predictor.BasePredictor`), run against every predictor dippm-nas ships:
the analytic prior, the trained GNN checkpoints, their few-shot calibrations (the predictor's own factors and the
validation loop's latency scale) and an online adaptation, on a GPU and on the host CPU.

Each case answers small synthetic graphs (no capture, no torch model); a new predictor joins the suite by adding
a case to ``CASES``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import dippm_nas
from dippm_nas import Deployment
from dippm_nas.devices import default_host_profile, resolve_device
from dippm_nas.graph import OperatorGraph, synthetic_resnet_graph
from dippm_nas.prediction import SOURCES, Prediction
from dippm_nas.predictor import (AnalyticPredictor, BasePredictor, GnnPredictor, find_checkpoint, set_predictor)
from dippm_nas.validation import CalibratedPredictor, Calibration

GPU = "a100-sxm4-40gb"
CPU = "host-cpu"
FIGURES = ("latency_ms", "energy_j", "memory_mib")
#: The labels every prediction of a predictor carries (``dippm_nas.predict`` adds ``deployment``).
LABELS = ("runtime", "deployment_assumed")
#: Batched and one-graph answers of one predictor agree to this relative tolerance. Measured: identical on the
#: development VM for every case (``python`` over ``CASES``, batch vs one graph); the margin leaves room for a BLAS
#: that sums a batch's rows in another order on another CPU.
BATCH_RTOL = 1e-5


def _graphs() -> list[OperatorGraph]:
    """Four graphs of distinct size and batch (so an answer out of order shows)."""
    return [synthetic_resnet_graph(nb, channels=ch, batch=b, size=s)
            for nb, ch, b, s in ((1, 8, 1, 8), (2, 16, 2, 8), (3, 24, 4, 12), (5, 32, 8, 16))]


def _fit_graphs() -> list[OperatorGraph]:
    """Twelve graphs for calibration and adaptation, none of them in :func:`_graphs`."""
    return [synthetic_resnet_graph(nb, channels=ch, batch=b, size=10)
            for nb in (1, 2, 4) for ch in (8, 20) for b in (2, 6)]


def _measured(p: BasePredictor, graphs: list[OperatorGraph]) -> list[tuple[OperatorGraph, dict[str, float]]]:
    """Stand-in measurements: each graph's predicted latency times 1.3, bent by ±10 % with its size (so a fit has
    something to find, within the plausibility bounds)."""
    preds = p.predict_graphs(graphs, mig=False)
    return [(g, {"latency_ms": x.latency_ms * 1.3 * (1.0 + 0.1 * math.sin(i))}) for i, (g, x) in
            enumerate(zip(graphs, preds))]


def _gnn(device: str) -> GnnPredictor:
    path = find_checkpoint(device)
    assert path is not None, f"a checkpoint for {device!r} is shipped"
    return GnnPredictor.load(path, device, load_calibration=False)


def _analytic_calibrated() -> BasePredictor:
    p = AnalyticPredictor(GPU, load_calibration=False)
    assert p.calibrate(_measured(p, _fit_graphs()[:6]), persist=False) is not None
    return p


def _gnn_calibrated(device: str) -> BasePredictor:
    p = _gnn(device)
    assert p.calibrate(_measured(p, _fit_graphs()[:6]), persist=False) is not None
    return p


def _scale_calibrated() -> BasePredictor:
    base = _gnn(CPU)
    cal = Calibration(device=base.device, latency_scale=1.3, n_rows=6, latency_mape_before_pct=23.0,
                      latency_mape_after_pct=4.0, fitted_at=0.0)
    return CalibratedPredictor(base, cal)


def _adapted(device: str) -> BasePredictor:
    p = _gnn(device)
    assert p.adapt(_measured(p, _fit_graphs()), persist=False) is not None
    return p


def _analytic_adapted() -> BasePredictor:
    p = AnalyticPredictor(GPU, load_calibration=False)
    ad = p.adapt(_measured(p, _fit_graphs()), persist=False)
    assert ad is not None and ad.heads == {} and ad.calibration is p.calibration and ad.rows == 12
    return p


#: name -> (factory, whether the predictor answers with a fitted correction: some latency is "calibrated")
CASES: dict[str, tuple[Callable[[], BasePredictor], bool]] = {
    "analytic-gpu": (lambda: AnalyticPredictor(GPU, load_calibration=False), False),
    "analytic-cpu": (lambda: AnalyticPredictor(CPU, load_calibration=False), False),
    "gnn-gpu": (lambda: _gnn(GPU), False),
    "gnn-cpu": (lambda: _gnn(CPU), False),
    "calibrated-analytic-gpu": (_analytic_calibrated, True),
    "calibrated-gnn-gpu": (lambda: _gnn_calibrated(GPU), True),
    "calibrated-gnn-cpu": (lambda: _gnn_calibrated(CPU), True),
    "calibrated-scale-cpu": (_scale_calibrated, True),
    "adapted-gnn-cpu": (lambda: _adapted(CPU), True),
    "adapted-gnn-gpu": (lambda: _adapted(GPU), True),
    "adapted-analytic-gpu": (_analytic_adapted, True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, BasePredictor, bool]:
    make, corrected = CASES[request.param]
    return request.param, make(), corrected


@pytest.fixture(scope="module")
def graphs() -> list[OperatorGraph]:
    return _graphs()


def _answers(case: tuple[str, BasePredictor, bool], graphs: list[OperatorGraph], **kw: Any) -> list[Prediction]:
    _, p, _ = case
    return p.predict_graphs(graphs, **kw)


def test_one_prediction_per_graph_for_its_device_batch_and_dtype(case, graphs) -> None:
    _, p, _ = case
    preds = _answers(case, graphs)
    assert len(preds) == len(graphs) and all(isinstance(x, Prediction) for x in preds)
    for g, x in zip(graphs, preds):
        assert (x.device, x.batch_size, x.dtype) == (p.device, g.spec.batch_size, g.spec.dtype)
    json.dumps([x.to_dict() for x in preds])  # JSON-able, as the CLI prints it


def test_figures_are_finite_and_positive_with_sigma_and_source(case, graphs) -> None:
    _, p, corrected = case
    preds = _answers(case, graphs)
    for x in preds:
        for name in FIGURES:
            f = x.figure(name)
            assert f.source in SOURCES
            if f.source == "unavailable":
                assert name == "energy_j" and f.value is None and f.std is None
                continue
            assert f.value is not None and math.isfinite(f.value) and f.value > 0, (name, f)
            assert f.std is None or (math.isfinite(f.std) and f.std >= 0), (name, f)
        if x.latency_source != "analytic":  # a trained or fitted latency comes with its σ
            assert x.latency_ms_std is not None and x.latency_ms_std > 0
        if resolve_device(p.device).kind == "gpu":
            assert x.energy_source != "unavailable"
            assert x.host_ms is not None and x.gpu_ms is not None and x.host_ms >= 0 and x.gpu_ms >= 0
            assert x.latency_ms >= max(x.host_ms, x.gpu_ms) * (1 - 1e-6) or x.latency_source == "calibrated"
        else:
            assert x.host_ms is None and x.gpu_ms is None
    assert any(x.latency_source == "calibrated" for x in preds) == corrected


def test_details_hold_numbers_and_labels_texts(case, graphs) -> None:
    for x in _answers(case, graphs):
        assert all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in x.details.items()), x.details
        assert all(isinstance(v, str) for v in x.labels.values()), x.labels
        assert set(LABELS) <= set(x.labels), x.labels
        assert x.labels["runtime"] == "eager"
        if x.latency_source == "calibrated" and "uncalibrated_latency_ms" in x.details:
            assert x.details["uncalibrated_latency_ms"] > 0


def test_empty_input_is_an_empty_answer(case) -> None:
    assert _answers(case, []) == []


def test_a_batch_answers_as_each_graph_alone_and_in_order(case, graphs) -> None:
    batch = _answers(case, graphs)
    alone = [_answers(case, [g])[0] for g in graphs]
    backwards = _answers(case, graphs[::-1])[::-1]
    for b, a, r in zip(batch, alone, backwards):
        for name in FIGURES:
            fb, fa, fr = b.figure(name), a.figure(name), r.figure(name)
            assert fb.source == fa.source == fr.source
            for got, want in ((fb.value, fa.value), (fb.value, fr.value), (fb.std, fa.std)):
                assert (got is None) == (want is None) and (got is None or got == pytest.approx(want, rel=BATCH_RTOL))
        assert b.labels == a.labels and sorted(b.details) == sorted(a.details)
    # graphs of growing size and batch: latency and memory grow with them (an answer out of order breaks this)
    assert [x.memory_mib for x in batch] == sorted(x.memory_mib for x in batch)


def test_mig_fits_are_monotone_in_memory(case, graphs) -> None:
    _, p, _ = case
    preds = _answers(case, graphs)
    if not resolve_device(p.device).has_mig:
        assert all(x.mig is None for x in preds)
        assert all(x.mig is None for x in _answers(case, graphs, mig=False))
        return
    assert all(x.mig is None for x in _answers(case, graphs, mig=False))
    fitting = []
    for x in preds:
        a = x.mig
        assert a is not None and a.supported and a.memory_needed_mib >= x.memory_mib
        for pr in a.profiles:  # the rule: needed <= the profile's limit
            assert pr.fits == (a.memory_needed_mib <= pr.memory_limit_mib), pr
        fits = {pr.profile for pr in a.profiles if pr.fits}
        roomier = {pr.profile for pr in a.profiles
                   if any(pr.memory_limit_mib >= q.memory_limit_mib for q in a.profiles if q.fits)}
        assert fits == roomier  # every profile with at least a fitting one's memory fits too
        if a.smallest_fit is not None:
            smallest = next(q for q in a.profiles if q.profile == a.smallest_fit)
            assert smallest.fits and smallest.memory_limit_mib == min(q.memory_limit_mib for q in a.profiles if q.fits)
        fitting.append((a.memory_needed_mib, fits))
    fitting.sort(key=lambda t: t[0])
    for (_, small), (_, large) in zip(fitting, fitting[1:]):
        assert large <= small  # more memory needed, never more profiles


def test_the_deployment_is_recorded(case, graphs) -> None:
    name, p, _ = case
    gpu = resolve_device(p.device).kind == "gpu"
    described = Deployment(runtime="cuda-graphs" if gpu else "eager", host=default_host_profile(), framework="torch-2",
                           tf32_matmul=False, tf32_conv=True, input_copy="none", autocast="none")
    undescribed = _answers(case, graphs[:1])[0]
    full = _answers(case, graphs[:1], deployment=described)[0]
    assert full.labels["runtime"] == ("cuda-graphs" if gpu else "eager")
    assert full.labels["deployment_assumed"] == ""
    if gpu:
        assert undescribed.labels["deployment_assumed"] != ""
    set_predictor(p.device, p)
    try:
        via_api = dippm_nas.predict(graphs[0], device=p.device, deployment=described)
    finally:
        set_predictor(p.device, None)
    assert via_api.labels["deployment"] == described.label
    assert via_api.latency_ms == pytest.approx(full.latency_ms, rel=BATCH_RTOL)


# ------------------------------------------------------------------------------------ Prediction.details/labels
def _prediction(**kw: Any) -> Prediction:
    return Prediction(latency_ms=1.0, energy_j=0.5, memory_mib=10.0, latency_source="analytic",
                      energy_source="analytic", memory_source="analytic", device=GPU, batch_size=1, dtype="float32",
                      **kw)


def test_a_label_read_from_details_answers_with_a_deprecation_warning() -> None:
    p = _prediction(details={"host_ms": 0.2}, labels={"runtime": "eager"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert p.details["host_ms"] == 0.2 and p.labels["runtime"] == "eager"
        assert dict(p.details) == {"host_ms": 0.2} and "runtime" not in list(p.details)
    with pytest.warns(DeprecationWarning, match=r"labels\['runtime'\]"):
        assert p.details["runtime"] == "eager"
    with pytest.warns(DeprecationWarning):
        assert p.details.get("runtime") == "eager"
    with pytest.warns(DeprecationWarning):
        assert "runtime" in p.details
    assert p.details.get("deployment", "none") == "none"
    with pytest.raises(KeyError):
        p.details["deployment"]


def test_texts_passed_in_details_move_to_labels_and_json_keeps_the_old_shape() -> None:
    with pytest.warns(DeprecationWarning, match="moved"):
        p = _prediction(details={"host_ms": 0.2, "runtime": "eager"})
    assert dict(p.details) == {"host_ms": 0.2} and p.labels == {"runtime": "eager"}
    d = json.loads(json.dumps(p.to_dict()))
    assert d["labels"] == {"runtime": "eager"}
    assert d["details"] == {"host_ms": 0.2, "runtime": "eager"}  # read by scripts of the mixed shape until 0.2


def test_details_refuse_what_is_neither_number_nor_text() -> None:
    with pytest.raises(dippm_nas.errors.InvalidValueError, match="numbers"):
        _prediction(details={"host_ms": None})
    with pytest.raises(dippm_nas.errors.InvalidValueError, match="texts"):
        _prediction(labels={"runtime": 1})


def test_adapt_and_calibrate_are_part_of_every_predictor(case) -> None:
    """Every predictor takes ``adapt()`` and ``calibrate()`` (the contract of BasePredictor): few rows leave it
    unchanged (``None``, with a warning once per device), and a CPU's analytic prior says why it has nothing to correct."""
    name, p, _ = case
    for method in (p.adapt, p.calibrate):
        if name == "analytic-cpu":
            with pytest.raises(dippm_nas.errors.DeviceError, match="no host and GPU timelines"):
                method(_measured(p, _fit_graphs()[:1]), persist=False)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "needs at least 2 measurements", warned once per device
            assert method(_measured(p, _fit_graphs()[:1]), persist=False) is None, name


def test_a_gpu_without_a_checkpoint_adapts_its_analytic_prior(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """README's ``get_predictor(device).adapt(...)`` on a GPU that ships no checkpoint (H100): the analytic prior's
    adaptation is the factor calibration, active at once and persisted as the device's calibration."""
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    from dippm_nas.predictor import get_predictor

    dippm_nas.predictor.set_predictor("h100-sxm5-80gb", None)
    p = get_predictor("h100-sxm5-80gb")
    assert isinstance(p, AnalyticPredictor) and find_checkpoint("h100-sxm5-80gb") is None
    before = p.predict_graphs(_graphs(), mig=False)
    ad = p.adapt(_measured(p, _fit_graphs()))
    assert ad is not None and ad.key.device == "h100-sxm5-80gb" and ad.key.space == "any"
    after = p.predict_graphs(_graphs(), mig=False)
    assert all(a.latency_source == "calibrated" and a.latency_ms > b.latency_ms for a, b in zip(after, before))
    again = AnalyticPredictor("h100-sxm5-80gb")  # persisted: a new predictor of the device re-applies it
    assert again.calibration is not None and again.predict_graphs(_graphs()[:1], mig=False)[0].latency_ms == \
        pytest.approx(after[0].latency_ms)
    with pytest.raises(dippm_nas.errors.InvalidValueError, match="keeps no adaptation store"):
        p.adapt(_measured(p, _fit_graphs()), storage="sqlite:///x.db")
    dippm_nas.predictor.set_predictor("h100-sxm5-80gb", None)
