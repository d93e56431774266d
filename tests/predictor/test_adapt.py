"""Online adaptation (dippm_nas/predictor/_adapt.py, _adapt_store.py): the residual heads, their choice by
leave-one-out, the shrink to the factor calibration, the store and its key, two processes at once, corrupt
versions, bad input, the numpy engine, and the validation loop feeding it."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from dippm_nas.devices import default_host_profile
from dippm_nas.errors import InvalidValueError
from dippm_nas.features import FEATURE_SCHEMA_VERSION, device_dim, node_dim, static_dim
from dippm_nas.graph import synthetic_resnet_graph
from dippm_nas.predictor import _gnn_adapt
from dippm_nas.predictor import (HANDOVER_ROWS, HEAD_MIN_ROWS, AdaptationKey, AdaptationStore, CheckpointMeta,
                                 GnnPredictor, NumpyEnsemble, SageEnsemble, deployment_key, fit_residual_head)

from _host import pin_host_facts

DEV = "host-cpu"
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _pinned_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's measured peaks pinned (``_host``): the same graph's prediction, and with it the truths these tests
    derive from it, must not change between runs."""
    pin_host_facts(monkeypatch)


def _meta(device: str = DEV) -> CheckpointMeta:
    return CheckpointMeta(device=device, targets={"latency_ms": "ms", "memory_mib": "MiB"},
                          feature_schema_version=FEATURE_SCHEMA_VERSION, feature_style="ours",
                          data_sources=["synthetic test data"], heldout_metrics={}, date="2026-01-01", trained_on=[device],
                          hidden=16, layers=3, members=3, residual_on_prior=True,
                          std_floor_log={"latency_ms": 0.05, "memory_mib": 0.05}, prior_params=None,
                          node_dim=node_dim(), static_dim=static_dim(), device_dim=device_dim())


def _model(seed: int = 0) -> SageEnsemble:
    torch.manual_seed(seed)
    meta = _meta()
    model = SageEnsemble(meta.node_dim, meta.static_dim, meta.device_dim, meta.hidden, meta.layers, meta.members)
    with torch.no_grad():
        for prm in model.parameters():
            prm.mul_(0.3)
    return model


def _predictor(seed: int = 0, *, load: bool = False) -> GnnPredictor:
    return GnnPredictor(_model(seed), _meta(), DEV, load_calibration=load)


def _graphs() -> list:
    return [synthetic_resnet_graph(nb, channels=ch, batch=b, size=s)
            for nb in (1, 2, 3, 5) for ch in (8, 16, 24) for b in (1, 2, 4) for s in (8, 12)]


def _truth(p: GnnPredictor, graphs: list, *, noise: float = 0.01, seed: int = 0) -> np.ndarray:
    """Latencies 1.5x the network's times a known residual the factor line cannot see: 0.3 x the standardised
    part of one of the head's input features that the log prediction does not explain."""
    rng = np.random.default_rng(seed)
    raw = np.array([x.latency_ms for x in p.predict_graphs(graphs, mig=False)])
    _, x = p.member_outputs(graphs)
    feats = x.mean(0)
    lp = np.log(raw) - np.log(raw).mean()
    resid = feats - np.outer(lp, lp @ feats / (lp @ lp))  # each feature less its share along the log prediction
    col = resid[:, int(np.argmax(resid.std(0)))]
    bump = 0.3 * (col - col.mean()) / col.std()
    return raw * 1.5 * np.exp(bump + rng.normal(0.0, noise, len(graphs)))


def _rows(graphs: list, y: np.ndarray) -> list:
    return [(g, {"latency_ms": float(v)}) for g, v in zip(graphs, y)]


def _mape(p: GnnPredictor, graphs: list, y: np.ndarray) -> float:
    return float(np.mean([abs(x.latency_ms / t - 1) for x, t in zip(p.predict_graphs(graphs, mig=False), y)]))


def _factor_only(p: GnnPredictor, rows: list) -> None:
    p.reset_adaptation()
    p.calibration = p.fit_factor_calibration(rows, "eager", default_host_profile())
    p.clear_prediction_cache()


# ------------------------------------------------------------------------------------------- the head alone
def test_the_head_recovers_a_linear_residual_and_its_sigma_shrinks_with_rows() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, 6)
    loo = {}
    for n in (12, 40, 160):
        # members see nearly the same features (their hidden layers are correlated, as trained members' are)
        h = rng.normal(0, 1, (1, n, 6)) + rng.normal(0, 0.05, (3, n, 6))
        r = h.mean(0) @ w + rng.normal(0, 0.02, n)
        head = fit_residual_head("latency_ms", h, r)
        assert head.ridge is not None
        h_new = rng.normal(0, 1, (1, 50, 6)) + rng.normal(0, 0.05, (3, 50, 6))
        err = head.members(h_new).mean(0) - h_new.mean(0) @ w
        assert np.sqrt(np.mean(err ** 2)) < 0.5 * np.std(h_new.mean(0) @ w)
        loo[n] = head.loo_rmse_log
        # far outside its rows a head does not extrapolate: inputs clipped to their range, the shift bounded
        far = head.members(100.0 * h_new)
        assert np.all(np.abs(far) <= head.bound + 1e-12) and head.bound <= 1.5 * np.max(np.abs(r)) + 1e-12
    assert loo[160] < loo[12]
    assert loo[160] < 0.05  # close to the 0.02 noise


def test_no_head_below_the_minimum_rows_nor_for_pure_noise() -> None:
    rng = np.random.default_rng(1)
    few = fit_residual_head("latency_ms", rng.normal(0, 1, (3, HEAD_MIN_ROWS - 1, 6)),
                            rng.normal(0, 0.1, HEAD_MIN_ROWS - 1))
    assert few.ridge is None and not few.members(rng.normal(0, 1, (3, 5, 6))).any()
    # noise the features do not explain: no head, or one that moves a new graph far less than the noise
    moves = [np.sqrt(np.mean(fit_residual_head("latency_ms", rng.normal(0, 1, (3, 30, 6)), rng.normal(0, 0.1, 30))
                             .members(rng.normal(0, 1, (3, 50, 6))).mean(0) ** 2)) for _ in range(20)]
    assert np.median(moves) < 0.02 and max(moves) < 0.1


# ------------------------------------------------------------------------------------------- on a predictor
def test_adaptation_recovers_a_residual_the_factors_cannot(tmp_path: Path) -> None:
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    idx = np.random.default_rng(2).permutation(len(gs))
    tr, te = idx[:48], idx[48:]
    rows = _rows([gs[i] for i in tr], y[tr])
    g_te, y_te = [gs[i] for i in te], y[te]
    _factor_only(p, rows)
    factor = _mape(p, g_te, y_te)
    ad = p.adapt(rows, persist=False)
    assert ad is not None and ad.heads["latency_ms"].ridge is not None
    adapted = _mape(p, g_te, y_te)
    assert adapted < 0.6 * factor, (adapted, factor)
    pred = p.predict_graphs(g_te[:1], mig=False)[0]
    assert pred.latency_source == "calibrated" and pred.details["adaptation_rows"] == 48
    assert pred.details["adaptation_factor_latency_ms"] > 0
    # σ: the adapted members' spread and the head's leave-one-out residuals
    assert pred.latency_ms_std / pred.latency_ms >= ad.heads["latency_ms"].loo_rmse_log * 0.999
    # more rows, smaller held-out residuals: σ shrinks with rows
    small = p.adapt(rows[:16], persist=False)
    assert small.heads["latency_ms"].ridge is None or \
        small.heads["latency_ms"].loo_rmse_log > ad.heads["latency_ms"].loo_rmse_log


def test_with_few_rows_it_is_the_guarded_factor_calibration() -> None:
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    raw = [x.latency_ms for x in p.predict_graphs(gs[10:20], mig=False)]
    for n in (2, 3, HEAD_MIN_ROWS - 1):
        rows = _rows(gs[:n], y[:n])
        _factor_only(p, rows)
        factor = [x.latency_ms for x in p.predict_graphs(gs[10:20], mig=False)]
        ad = p.adapt(rows, persist=False)
        assert all(h.ridge is None for h in ad.heads.values())
        adapted = [x.latency_ms for x in p.predict_graphs(gs[10:20], mig=False)]
        # the factors where they beat the unadapted network out of group, else the network as it is
        kept = ad.guard["factors_kept"]["latency_ms"]
        np.testing.assert_allclose(adapted, factor if kept else raw, rtol=1e-9)
        if n == 2:  # two rows: no fit without one of them, no out-of-group evidence, no factors
            assert not kept and ad.calibration is None
        if n == HEAD_MIN_ROWS - 1:  # 1.5x off everywhere: the factors win out of group
            assert kept


def test_factors_that_do_not_carry_out_of_group_are_not_kept() -> None:
    p = _predictor()
    gs = _graphs()
    raw = np.array([x.latency_ms for x in p.predict_graphs(gs, mig=False)])
    # each row's own random factor: whatever factors the other rows give, they do not carry to the next row
    y = raw * np.exp(np.random.default_rng(3).normal(0.0, 0.4, len(gs)))
    ad = p.adapt(_rows(gs[:12], y[:12]), persist=False)
    assert ad.guard["factors_kept"]["latency_ms"] is False and ad.calibration is None
    assert all(h.ridge is None for h in ad.heads.values())
    np.testing.assert_allclose([x.latency_ms for x in p.predict_graphs(gs[20:30], mig=False)], raw[20:30], rtol=1e-9)


def test_numpy_engine_serves_the_same_adapted_figures() -> None:
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    ad = p.adapt(_rows(gs[:40], y[:40]), persist=False)
    torch_figs = [(x.latency_ms, x.latency_ms_std) for x in p.predict_graphs(gs[40:50], mig=False)]
    state = {k: v.detach().numpy() for k, v in p.model.state_dict().items()}
    q = GnnPredictor(NumpyEnsemble(state, p.meta), p.meta, DEV, load_calibration=False)
    assert q.engine == "numpy"
    q.activate_adaptation(ad)
    numpy_figs = [(x.latency_ms, x.latency_ms_std) for x in q.predict_graphs(gs[40:50], mig=False)]
    # float32 engines agree to ~1e-5 in log space; the head multiplies by its weights
    np.testing.assert_allclose(numpy_figs, torch_figs, rtol=1e-3)


def test_calibrate_hands_over_to_adapt_from_the_threshold() -> None:
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    assert p.calibrate(_rows(gs[:HANDOVER_ROWS - 1], y[:HANDOVER_ROWS - 1]), persist=False) is not None
    assert p.adaptation is None
    cal = p.calibrate(_rows(gs[:HANDOVER_ROWS], y[:HANDOVER_ROWS]), persist=False)
    assert p.adaptation is not None and cal is p.adaptation.calibration is p.calibration


# ------------------------------------------------------------------------------------------- bad input
def test_bad_rows_are_errors_or_flagged_fallbacks() -> None:
    p = _predictor()
    gs = _graphs()
    with pytest.raises(InvalidValueError, match="finite"):
        p.adapt([(gs[0], {"latency_ms": math.nan}), (gs[1], {"latency_ms": 1.0})], persist=False)
    with pytest.raises(InvalidValueError, match="finite"):
        p.adapt([(gs[0], {"latency_ms": -1.0}), (gs[1], {"latency_ms": 1.0})], persist=False)
    with pytest.raises(InvalidValueError, match="another device"):
        p.adapt([(gs[0], {"latency_ms": 1.0, "device": "a100-sxm4-40gb"}), (gs[1], {"latency_ms": 1.0})],
                persist=False)
    with pytest.raises(InvalidValueError, match="deployment"):
        p.adapt([(gs[0], {"latency_ms": 1.0, "deployment": "{}"}), (gs[1], {"latency_ms": 1.0})], persist=False)
    before = [x.latency_ms for x in p.predict_graphs(gs[:3], mig=False)]
    _gnn_adapt._warn_once.reset()  # said once per process: an earlier test may have said it already
    with pytest.warns(RuntimeWarning, match="at least 2 measured graphs"):
        # one graph measured twice is one row (averaged): too few
        assert p.adapt([(gs[0], {"latency_ms": 1.0}), (gs[0], {"latency_ms": 4.0})], persist=False) is None
    assert [x.latency_ms for x in p.predict_graphs(gs[:3], mig=False)] == before
    b0, b1 = before[0], before[1]  # figures near the predictions: within the calibration's plausibility bounds
    ad = p.adapt([(gs[0], {"latency_ms": b0}), (gs[0], {"latency_ms": 4.0 * b0}), (gs[1], {"latency_ms": 3.0 * b1})],
                 persist=False)
    assert ad.rows == 2  # the duplicate is averaged (geometric mean 2 x b0)


# ------------------------------------------------------------------------------------------- the store
def test_persisted_adaptation_round_trips_per_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    ad = p.adapt(_rows(gs[:30], y[:30]), storage=url, space="mlp")
    assert ad.version == 1 and ad.rows == 30
    want = [x.latency_ms for x in p.predict_graphs(gs[30:36], mig=False)]
    # another process's predictor of the same checkpoint, same key: the stored version
    q = _predictor(load=True)
    q.use_adaptation(storage=url, space="mlp")
    got = q.predict_graphs(gs[30:36], mig=False)
    np.testing.assert_allclose([x.latency_ms for x in got], want, rtol=1e-9)
    assert got[0].details["adaptation_version"] == 1
    # another space, or another deployment of a GPU: not this adaptation
    q.use_adaptation(storage=url, space="resnet")
    assert "adaptation_version" not in q.predict_graphs(gs[30:31], mig=False)[0].details
    assert deployment_key("a100-sxm4-40gb", "cuda-graphs") != deployment_key("a100-sxm4-40gb", "eager")
    # more rows: a new version fitted on all of them
    ad2 = p.adapt(_rows(gs[30:40], y[30:40]), storage=url, space="mlp")
    assert (ad2.version, ad2.rows) == (2, 40)
    q.use_adaptation(storage=url, space="mlp")
    assert q.refresh_adaptation().version == 2


def test_a_corrupt_or_foreign_version_is_set_aside_flagged_and_refitted(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    url = f"sqlite:///{db}"
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    p.adapt(_rows(gs[:20], y[:20]), storage=url)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE dippm_adaptation_versions SET meta_json = replace(meta_json, '\"rows\": 20', "
                     "'\"rows\": 21')")
    q = _predictor(load=True)
    q.use_adaptation(storage=url)
    with pytest.warns(RuntimeWarning, match="set aside"):
        pred = q.predict_graphs(gs[:1], mig=False)[0]
    assert "checksum" in q.adaptation_flag and pred.details["adaptation_flagged"] == 1.0
    assert q.adaptation.version == 2 and q.adaptation.rows == 20  # refitted from the stored rows
    # a version fitted on another checkpoint: set aside and refitted on this one
    other = _predictor(seed=1, load=True)
    other.use_adaptation(storage=url)
    with pytest.warns(RuntimeWarning, match="fitted on checkpoint"):
        other.predict_graphs(gs[:1], mig=False)
    assert other.adaptation.version == 3 and other.adaptation.checkpoint_sha256 == other.checkpoint_hash()


def _child(url: str, start: int) -> None:
    """One process of the concurrency test: adapt the shared key on rows start..start+7, one call per row."""
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(start, start + 8):
            p.adapt(_rows(gs[i:i + 1], y[i:i + 1]), storage=url)


def test_two_processes_adapting_one_key_keep_every_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    code = (f"import sys; sys.path[:0] = [{str(TESTS)!r}, {str(TESTS.parent)!r}]; from test_adapt import _child; "
            f"_child({url!r}, int(sys.argv[1]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(s)], stderr=subprocess.PIPE) for s in (0, 8)]
    for pr in procs:
        _, err = pr.communicate(timeout=600)
        assert pr.returncode == 0, err.decode()[-2000:]
    key = AdaptationKey(DEV, deployment_key(DEV))
    store = AdaptationStore(url)
    try:
        assert store.row_count(key.digest) == 16
        newest = store.newest(key.digest)
    finally:
        store.close()
    q = _predictor(load=True)
    q.use_adaptation(storage=url)
    q.predict_graphs(_graphs()[:1], mig=False)
    assert q.adaptation.version == newest.version and q.adaptation.rows == 16


def test_the_store_on_postgresql(pg_url: str) -> None:
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    ad = p.adapt(_rows(gs[:12], y[:12]), storage=pg_url, space="mlp")
    q = _predictor(load=True)
    q.use_adaptation(storage=pg_url, space="mlp")
    assert q.refresh_adaptation().version == ad.version == 1


# ------------------------------------------------------------------------------------------- the loop
def test_the_worker_feeds_adapt_and_the_cost_model_picks_up_each_version(tmp_path: Path) -> None:
    import optuna

    import search_spaces
    from dippm_nas.measure import Measurement
    from dippm_nas.optuna import HardwareCostModel, rdb_storage
    from dippm_nas.predictor import set_predictor
    from dippm_nas.spec import InputSpec
    from dippm_nas.validation import JobQueue, ValidationWorker

    spec = InputSpec(shape=(4,), batch_size=2)
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def cfg(width: int) -> dict:
        return {"in_features": 4, "hidden": [width], "out_features": 2}

    p = _predictor(load=True)
    from dippm_nas.capture import assemble

    # measured figures off the predictions by a factor that grows with the width (within the plausibility bounds
    # of a calibration: a correction of at most e^3 either way)
    base = {w: p.predict_graphs([assemble("mlp", cfg(w), spec)], mig=False)[0] for w in (8, 16, 32, 64)}

    def fake(model, spec_, device, settings) -> Measurement:
        w = model.search_space_config["hidden"][0]
        return Measurement(latency_ms=base[w].latency_ms * (1.0 + w / 16), latency_ms_std=0.001, energy_j=None,
                           memory_mib=base[w].memory_mib * (1.0 + w / 32), memory_source="rss_delta", n_repeats=5,
                           device="cpu", environment={"fake": True}, energy_reason="none in this test",
                           batch_size=2, dtype="float32")

    set_predictor(DEV, p)
    queue = JobQueue(url)
    try:
        for i, w in enumerate((8, 16, 32)):
            queue.enqueue(study="s", trial_number=i, space="mlp", config=cfg(w), spec=spec.to_dict(), device=DEV,
                          predicted={"latency_ms": 1.0}, priority=0.0)
        worker = ValidationWorker(queue, DEV, measure_fn=fake, adapt=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the first measurement alone is too few: a warning, no change
            assert worker.run(idle_timeout_s=0, poll_s=0) == 3
        assert (worker.adaptation.version, worker.adaptation.rows) == (2, 3)
        assert worker.adaptation.key.space == "mlp"
        # a search on the same storage: its trials are predicted with the newest version and say which
        study = optuna.create_study(storage=rdb_storage(url), study_name="search")
        cost = HardwareCostModel(DEV, objectives=("latency_ms",))
        p.reset_adaptation()
        trial = study.ask()
        float(cost.evaluate(trial, search_spaces.build_model("mlp", cfg(24)), spec))  # read: the record is written
        assert trial.user_attrs["adaptation_version"] == 2 and trial.user_attrs["adaptation_rows"] == 3
        queue.enqueue(study="s", trial_number=9, space="mlp", config=cfg(64), spec=spec.to_dict(), device=DEV,
                      predicted={"latency_ms": 1.0}, priority=0.0)
        worker.run(idle_timeout_s=0, poll_s=0)
        trial = study.ask()  # the next trial, no restart: the new version
        float(cost.evaluate(trial, search_spaces.build_model("mlp", cfg(24)), spec))  # read: the record is written
        assert trial.user_attrs["adaptation_version"] == 3 and trial.user_attrs["adaptation_rows"] == 4
    finally:
        queue.close()
        set_predictor(DEV, None)


def test_an_adaptation_is_of_one_precision_and_leaves_the_others_unadapted() -> None:
    """Rows of two precisions: the adaptation is fitted on the precision most rows ran in; a candidate of another
    precision keeps its unadapted prediction, flagged, never the factors of rows that ran other kernels."""
    import dataclasses

    from dippm_nas.predictor._adapt import _one_precision

    p = _predictor()
    gs = _graphs()
    raw_all = np.array([x.latency_ms for x in p.predict_graphs(gs, mig=False)])
    # 2x off everywhere (1 % noise): factors that carry out of group whatever the clusters, so the fit below has an
    # effect to withhold from the other precision
    y = raw_all * 2.0 * np.exp(np.random.default_rng(5).normal(0.0, 0.01, len(gs)))
    half = [dataclasses.replace(g, spec=dataclasses.replace(g.spec, dtype="float16")) for g in gs[:3]]
    kept, other = _one_precision(_rows(gs[3:12], y[3:12]) + _rows(half, y[:3]))
    assert other == 3 and [g.spec.dtype for g, _ in kept] == ["float32"] * 9
    kept, other = _one_precision(_rows(half, y[:3]) + _rows(gs[3:5], y[3:5]))
    assert other == 2 and [g.spec.dtype for g, _ in kept] == ["float16"] * 3
    raw = [x.latency_ms for x in p.predict_graphs(gs[20:30], mig=False)]
    ad = p.adapt(_rows(gs[:12], y[:12]), persist=False)
    assert ad.guard["dtypes"] == ["float32"] and ad.guard["rows_other_dtypes"] == 0
    assert ad.guard["factors_kept"]["latency_ms"]  # 2x off everywhere: the factors carry
    assert all("adaptation_other_dtype" not in x.details and x.latency_source == "calibrated"
               for x in p.predict_graphs(gs[20:30], mig=False))
    # the same fit, as if its rows had run in float16: float32 candidates keep the unadapted prediction, flagged
    p.activate_adaptation(dataclasses.replace(ad, guard={**ad.guard, "dtypes": ["float16"]}))
    preds = p.predict_graphs(gs[20:30], mig=False)
    np.testing.assert_allclose([x.latency_ms for x in preds], raw, rtol=1e-9)
    assert all(x.details["adaptation_other_dtype"] == 1.0 for x in preds)


def test_adapt_keeps_out_of_sample_scores_that_budgets_read_in_space(tmp_path: Path) -> None:
    from dippm_nas.budgets import Budgets

    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    rows = _rows(gs[:40], y[:40])
    ad = p.adapt(rows, persist=False)
    s = ad.conformal_scores["latency_ms"]
    assert 30 <= len(s) <= 40 and all(math.isfinite(v) for v in s)
    # out of sample: the scores are not the in-sample residuals over σ (those of the fitted adaptation itself)
    fitted = p.predict_graphs(gs[:40], mig=False)
    insample = [math.log(t / x.latency_ms) / (x.latency_ms_std / x.latency_ms) for x, t in zip(fitted, y[:40])]
    assert np.mean(np.abs(s)) > np.mean(np.abs(insample)) * 0.999
    b = Budgets(latency_ms=float(np.median(y)), confidence=0.9).for_predictor(p)
    chk = b.check(p.predict_graphs(gs[40:41], mig=False)[0])["latency_ms"]
    assert chk.labels["conformal_regime_latency_ms"] == "in-space"
    assert chk.k_sigma == pytest.approx(sorted(s)[math.ceil((len(s) + 1) * 0.9) - 1])
    # stored: the version read back carries them
    url = f"sqlite:///{tmp_path / 'a.db'}"
    stored = p.adapt(rows, storage=url, space="mlp")
    q = _predictor(load=True)
    q.use_adaptation(storage=url, space="mlp")
    assert q.refresh_adaptation().conformal_scores == stored.conformal_scores
