"""Budgets as calibrated probabilities (dippm_nas/conformal.py, Budgets(confidence=...)): the conformal bound holds
at its confidence on rows it did not see, regimes fall back to wider ones (flagged), and bad input is refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dippm_nas.budgets import Budgets, trial_attrs
from dippm_nas.conformal import (MIN_REGIME_ROWS, WIDEST_REGIME, ConformalCalibration, conformal_path, fit_conformal,
                                 regime_of, wider_regimes)
from dippm_nas.errors import BudgetError, CheckpointError, DippmNasError
from dippm_nas.prediction import Prediction

SHA = "a" * 64


def _pred(mean: float, std: float, *, host_bound: bool = False, assumed: str = "") -> Prediction:
    return Prediction(latency_ms=mean, energy_j=None, memory_mib=1.0, latency_source="predicted",
                      energy_source="unavailable", memory_source="analytic", device="rtx-3090", batch_size=1,
                      dtype="float32", latency_ms_std=std, details={"host_bound": float(host_bound)},
                      labels={"deployment_assumed": assumed})


def _rows(n: int, seed: int, *, host_bound: bool = False, scale: float = 0.3) -> list[tuple[Prediction, float]]:
    """Predictions with σ_log 0.3 whose truth scatters by ``scale`` in log space (σ twice too wide at 0.15)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mean = float(rng.uniform(1, 100))
        out.append((_pred(mean, 0.3 * mean, host_bound=host_bound), mean * math.exp(rng.normal(0, scale))))
    return out


def test_the_bound_holds_at_its_confidence_on_unseen_rows_and_is_tighter_than_k_sigma_when_sigma_is_wide() -> None:
    cal = fit_conformal(_rows(400, 0, scale=0.15), _rows(400, 1, scale=0.15), checkpoint_sha256=SHA)
    test = _rows(2000, 2, scale=0.15)
    for c in (0.8, 0.9, 0.95):
        b = Budgets(latency_ms=1e9, confidence=c, conformal=cal)
        bounds = np.array([b.check(p)["latency_ms"].bound for p, _ in test])
        truth = np.array([y for _, y in test])
        assert np.mean(truth <= bounds) >= c - 0.03
        assert cal.coverage["latency_ms"][WIDEST_REGIME][f"{c:g}"] >= c - 0.05
    # σ twice too wide: the 0.9 bound is about mean * exp(1.28 * 0.15), well inside mean + 1σ
    p = _pred(10.0, 3.0)
    assert Budgets(latency_ms=1e9, confidence=0.9, conformal=cal).check(p)["latency_ms"].bound < 10.0 + 3.0


def test_a_thin_regime_falls_back_to_the_wider_one_and_says_so() -> None:
    rows = _rows(200, 0) + _rows(MIN_REGIME_ROWS - 5, 3, host_bound=True)
    cal = fit_conformal(rows, _rows(100, 4), checkpoint_sha256=SHA)
    chk = Budgets(latency_ms=5.0, confidence=0.9, conformal=cal).check(_pred(4.0, 1.0, host_bound=True))["latency_ms"]
    assert chk.labels["conformal_regime_latency_ms"] == WIDEST_REGIME  # every host-bound regime: too few rows
    assert "too few calibration rows" in chk.labels["conformal_fallback_latency_ms"]
    wide = Budgets(latency_ms=5.0, confidence=0.9, conformal=cal).check(_pred(4.0, 1.0))["latency_ms"]
    assert wide.labels["conformal_regime_latency_ms"] == "gpu-bound|described|not-adapted"
    assert "conformal_fallback_latency_ms" not in wide.labels
    attrs = trial_attrs({"latency_ms": chk})
    assert attrs["confidence_latency_ms"] == 0.9 and "conformal_fallback_latency_ms" in attrs
    assert wider_regimes("host-bound|undescribed|adapted")[-1] == WIDEST_REGIME
    assert regime_of(_pred(1.0, 0.1, host_bound=True, assumed="host")) == "host-bound|undescribed|not-adapted"


def test_an_undescribed_autocast_opens_the_regime_of_a_half_precision_graph_only() -> None:
    """``deployment_assumed`` names ``autocast`` whenever ``Deployment.autocast`` is None; for a float32 graph that
    autocast is none (centre and σ as described), so its prediction stays in the described regime, while a float16
    graph's is a mixture (undescribed). Checked on the labels and on the analytic prior's own predictions."""
    import dataclasses

    from dippm_nas import Deployment, predict
    from dippm_nas.devices import DEFAULT_HOST_PROFILE
    from test_runtime import conv_chain

    from dippm_nas import conformal
    from dippm_nas.deployment import AUTOCAST_DTYPES

    assert conformal._HALF_DTYPES == AUTOCAST_DTYPES  # the regime's copy of the later layer's constant
    p32 = _pred(1.0, 0.1, assumed="autocast")
    assert regime_of(p32) == "gpu-bound|described|not-adapted"
    assert regime_of(dataclasses.replace(p32, dtype="float16")) == "gpu-bound|undescribed|not-adapted"
    assert regime_of(dataclasses.replace(p32, dtype="bfloat16")) == "gpu-bound|undescribed|not-adapted"
    assert regime_of(_pred(1.0, 0.1, assumed="host,autocast")) == "gpu-bound|undescribed|not-adapted"
    open_ = Deployment(host=DEFAULT_HOST_PROFILE, framework="torch-2", input_copy="none")
    said = dataclasses.replace(open_, autocast="none")
    for dtype, regime in (("float32", "described"), ("float16", "undescribed")):
        g = conv_chain(64, 64, 28, layers=4, dtype=dtype)
        q_open, q_said = (predict(g, device="rtx-4090", mig=False, deployment=d) for d in (open_, said))
        assert q_open.labels["deployment_assumed"] == "autocast" and q_said.labels["deployment_assumed"] == ""
        assert regime_of(q_open).split("|")[1] == regime, dtype
        assert regime_of(q_said).split("|")[1] == "described"
        if dtype == "float32":  # nothing open: the same centre and σ as the described autocast
            assert (q_open.latency_ms, q_open.latency_ms_std) == pytest.approx((q_said.latency_ms, q_said.latency_ms_std))


def test_without_a_calibration_the_gaussian_quantile_is_used_and_flagged() -> None:
    chk = Budgets(latency_ms=12.0, confidence=0.9).check(_pred(10.0, 1.0))["latency_ms"]
    assert chk.k_sigma == pytest.approx(1.2816, abs=1e-3)
    assert "Gaussian" in chk.labels["conformal_fallback_latency_ms"]
    # the constraint value is the calibrated margin: bound - budget
    assert Budgets(latency_ms=12.0, confidence=0.9).constraint_values(_pred(10.0, 1.0))["latency_ms"] == \
        pytest.approx(chk.bound - 12.0)
    # k_sigma stays where confidence is not set
    assert Budgets(latency_ms=12.0, k_sigma=1.0).check(_pred(10.0, 1.0))["latency_ms"].bound == pytest.approx(11.0)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan"), "0.9x", True])
def test_a_confidence_outside_zero_one_is_refused(bad: object) -> None:
    with pytest.raises(BudgetError, match="confidence"):
        Budgets(latency_ms=1.0, confidence=bad)  # type: ignore[arg-type]


def test_a_calibration_of_another_checkpoint_or_without_coverage_is_refused(tmp_path: Path) -> None:
    cal = fit_conformal(_rows(100, 0), _rows(100, 1), checkpoint_sha256=SHA)
    path = tmp_path / "x.conformal.json"
    cal.save(path)
    assert ConformalCalibration.load(path, checkpoint_sha256=SHA).checkpoint_sha256 == SHA
    with pytest.raises(CheckpointError, match="not of this one"):
        ConformalCalibration.load(path, checkpoint_sha256="b" * 64)
    d = json.loads(path.read_text())
    del d["coverage"]
    path.write_text(json.dumps(d))
    with pytest.raises(DippmNasError, match="coverage"):
        Budgets(latency_ms=1.0, confidence=0.9, conformal=path)
    d["coverage"] = {"latency_ms": {}}
    path.write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="no coverage"):
        ConformalCalibration.load(path)
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        ConformalCalibration.load(path)

    class Other:
        checkpoint_path = None

        @staticmethod
        def checkpoint_hash() -> str:
            return "c" * 64

    with pytest.raises(CheckpointError, match="another checkpoint|refit"):
        Budgets(latency_ms=1.0, confidence=0.9, conformal=cal).for_predictor(Other())
    assert conformal_path("ck/a100.accel.pt") == Path("ck/a100.accel.conformal.json")


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(scores={"latency_ms": 5}),
    lambda d: d.update(scores={"latency_ms": {"*|*|*": ["x"]}}),
    lambda d: d.update(scores={"latency_ms": {"*|*|*": [float("inf")]}}),
    lambda d: d.update(scores={"latency_ms": {"bad-regime": [0.1]}}),
    lambda d: d.update(scores={"latency_ms": {"gpu-bound|*|*": [0.1]}}),
    lambda d: d.update(min_rows="many"),
    lambda d: d.update(coverage=[1, 2]),
    lambda d: d.update(checkpoint_sha256="short"),
    lambda d: d.update(format=2),
])
def test_a_malformed_calibration_is_a_checkpoint_error(mutate: object) -> None:
    d = fit_conformal(_rows(60, 0), _rows(60, 1), checkpoint_sha256=SHA).to_dict()
    mutate(d)  # type: ignore[operator]
    with pytest.raises(CheckpointError):
        ConformalCalibration.from_dict(d)


def test_the_shipped_a100_checkpoint_has_its_calibration_and_the_cost_model_attaches_it() -> None:
    from dippm_nas.optuna import HardwareCostModel
    from dippm_nas.predictor import find_checkpoint

    ck = find_checkpoint("a100-sxm4-40gb")
    if ck is None or not conformal_path(ck).exists():
        pytest.skip("no conformal calibration beside the A100 checkpoint")
    cost = HardwareCostModel("a100-sxm4-40gb", Budgets(latency_ms=20.0, confidence=0.9), objectives=("latency_ms",))
    cal = cost.budgets.conformal
    assert isinstance(cal, ConformalCalibration) and cal.figures == ("latency_ms",)
    cov = cal.coverage["latency_ms"][WIDEST_REGIME]
    assert cov["rows"] > 100 and 0.85 <= cov["0.9"] <= 1.0  # measured on rows the scores did not see
    chk = cost.budgets.check(_pred(10.0, 2.0))["latency_ms"]
    assert chk.confidence == 0.9 and chk.labels["conformal_regime_latency_ms"]


def test_the_constraint_values_optuna_and_nni_receive_are_the_calibrated_margins() -> None:
    """HardwareCostModel and dippm_nas.nni.final_metrics both bound a confidence budget by the checkpoint's conformal
    calibration (not the Gaussian quantile): the value is ``mean * exp(q * sigma_log) - budget`` with the regime's
    conformal ``q``."""
    import search_spaces as ss
    from dippm_nas.nni import final_metrics
    from dippm_nas.optuna import HardwareCostModel
    from dippm_nas.predictor import find_checkpoint

    ck = find_checkpoint("a100-sxm4-40gb")
    if ck is None or not conformal_path(ck).exists():
        pytest.skip("no conformal calibration beside the A100 checkpoint")
    cal = ConformalCalibration.load(conformal_path(ck))
    budgets = Budgets(latency_ms=5.0, confidence=0.9)
    cost = HardwareCostModel("a100-sxm4-40gb", budgets, objectives=("latency_ms",))
    p = _pred(4.0, 1.0)
    p = Prediction(**{**p.__dict__, "device": "a100-sxm4-40gb"})
    k = cal.margin("latency_ms", 0.9, regime_of(p)).k
    chk = cost._book.checks(p)["latency_ms"]
    assert chk.value == pytest.approx(4.0 * math.exp(k * 0.25) - 5.0)
    assert chk.k_sigma == pytest.approx(k) and "conformal_fallback_latency_ms" not in chk.labels

    cfg = ss.get_space("mlp").validate({"in_features": 32, "out_features": 4, "hidden": [64]})
    model, spec = ss.build_model("mlp", cfg), ss.get_space("mlp").input_spec(cfg, batch_size=8)
    m = final_metrics(0.5, model, spec, device="a100-sxm4-40gb", budgets=budgets)
    c = m["constraints"]["latency_ms"]
    assert "conformal_fallback_latency_ms" not in c.get("labels", {}), c
    mean, std = m["latency_ms"], m["latency_ms_std"]
    regime_k = c["k_sigma"]
    assert c["bound"] == pytest.approx(mean * math.exp(regime_k * std / mean))
    assert regime_k in {cal.margin("latency_ms", 0.9, r).k for r in cal.scores["latency_ms"]}
