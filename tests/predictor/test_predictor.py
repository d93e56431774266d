"""The GraphSAGE predictor: model shapes, ensemble std, checkpoints, fallback, calibration, CLI keys."""

from __future__ import annotations

import dataclasses
import fractions
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from dippm_nas.errors import CheckpointError
from dippm_nas.features import FEATURE_SCHEMA_VERSION, device_dim, featurize, node_dim, static_dim
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import get_predictor, predict, predict_many, set_predictor
from dippm_nas.predictor import TARGETS, CheckpointMeta, GnnPredictor, SageEnsemble, collate
from test_features import tiny_graph

from _models import features_deployment

FEATURES = features_deployment()  # the network's own answer, with no deployment spread

DEV = "a100-sxm4-40gb"


def _meta(**kw) -> CheckpointMeta:
    base = dict(device=DEV, targets={"latency_ms": "ms"}, feature_schema_version=FEATURE_SCHEMA_VERSION,
                feature_style="ours", data_sources=["synthetic test data"], heldout_metrics={}, date="2026-01-01",
                trained_on=[DEV], hidden=16, layers=3, members=3, residual_on_prior=True,
                std_floor_log={"latency_ms": 0.01}, prior_params=None, node_dim=node_dim(), static_dim=static_dim(),
                device_dim=device_dim())
    base.update(kw)
    return CheckpointMeta(**base)


def _predictor(scale: float = 0.1, **kw) -> GnnPredictor:
    torch.manual_seed(0)
    meta = _meta(**kw)
    model = SageEnsemble(meta.node_dim, meta.static_dim, meta.device_dim, meta.hidden, meta.layers, meta.members)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return GnnPredictor(model, meta, DEV, load_calibration=False)


def _graphs(n: int = 4):
    from dippm_nas.graph import OperatorGraph

    out = []
    for b in range(1, n + 1):
        d = tiny_graph().to_dict()
        d["spec"]["batch_size"] = b  # a different spec -> a different graph and prior
        out.append(OperatorGraph.from_dict(d))
    return out


def test_forward_shapes_and_ensemble_std() -> None:
    p = _predictor()
    feats = [featurize(g, DEV) for g in _graphs(3)]
    b = collate(feats)
    assert b["x"].shape == (sum(f.num_nodes for f in feats), node_dim())
    out = p.model(b)
    assert out.shape == (3, 3, len(TARGETS))  # [members, graphs, targets]
    mean, std = p.predict_log(feats)
    assert mean.shape == (3, 3) and std.shape == (3, 3)
    assert (std >= 0).all() and (std[:, 0] > 0).all()


def test_predictions_are_finite_positive_and_sourced() -> None:
    for scale in (0.1, 50.0):  # wild weights still give finite, positive numbers
        p = _predictor(scale=scale)
        for pr in p.predict_graphs(_graphs(3), mig=False, deployment=FEATURES):
            for name in ("latency_ms", "energy_j", "memory_mib"):
                v = getattr(pr, name)
                assert v is not None and math.isfinite(v) and v >= 0
            assert pr.latency_source == "predicted"
            assert pr.energy_source == "analytic" and pr.memory_source == "analytic"  # no label: the prior answers
            assert pr.latency_ms_std is not None and pr.latency_ms_std >= 0


def test_graph_outside_training_range_gets_wider_std() -> None:
    p = _predictor()
    feats = [featurize(g, DEV) for g in _graphs(3)]
    b = collate(feats[:2])
    p.model.set_stats(b["x"], b["static"], b["dev"], torch.zeros(3), torch.full((3,), 0.4))
    (inside, outside) = p.predict_graphs([_graphs(3)[0], _graphs(3)[2]], mig=False, deployment=FEATURES)
    assert inside.details["outside_training_range"] == 0.0 and outside.details["outside_training_range"] == 1.0
    assert outside.latency_ms_std / outside.latency_ms >= 0.2 > inside.latency_ms_std / inside.latency_ms


def test_unknown_op_still_predicts_and_is_flagged() -> None:
    p = _predictor()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (pr,) = p.predict_graphs([tiny_graph(extra_op="my.other_op")], mig=False, deployment=FEATURES)
    assert pr.flagged and "my.other_op" in pr.unknown_ops
    assert math.isfinite(pr.latency_ms) and pr.latency_ms > 0


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    p = _predictor()
    path = tmp_path / f"{DEV}.pt"
    p.save(path)
    assert path.with_suffix(".json").is_file()
    assert json.loads(path.with_suffix(".json").read_text())["device"] == DEV
    q = GnnPredictor.load(path, device=DEV, load_calibration=False)
    assert q.meta == p.meta
    g = _graphs(2)
    a = [x.latency_ms for x in p.predict_graphs(g, mig=False, deployment=FEATURES)]
    b = [x.latency_ms for x in q.predict_graphs(g, mig=False, deployment=FEATURES)]
    assert np.allclose(a, b)


def test_schema_mismatch_and_bad_files_raise_checkpoint_error(tmp_path: Path) -> None:
    p = _predictor()
    path = tmp_path / "x.pt"
    p.save(path)
    blob = torch.load(path, weights_only=True)
    meta = json.loads(blob["meta"])
    meta["feature_schema_version"] = FEATURE_SCHEMA_VERSION + 1
    torch.save({"meta": json.dumps(meta), "state": blob["state"]}, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="feature_schema_version"):
        GnnPredictor.load(tmp_path / "old.pt")
    meta["feature_schema_version"] = FEATURE_SCHEMA_VERSION
    meta["node_dim"] += 1
    torch.save({"meta": json.dumps(meta), "state": blob["state"]}, tmp_path / "wide.pt")
    with pytest.raises(CheckpointError, match="widths"):
        GnnPredictor.load(tmp_path / "wide.pt")
    with pytest.raises(CheckpointError, match="is for device"):
        GnnPredictor.load(path, device="rtx-3090")
    # a pickled object is refused by weights_only=True
    torch.save({"meta": blob["meta"], "state": blob["state"], "evil": fractions.Fraction(1, 3)},
               tmp_path / "pickle.pt")
    with pytest.raises(CheckpointError, match="cannot read"):
        GnnPredictor.load(tmp_path / "pickle.pt")


def test_device_without_checkpoint_falls_back_to_analytic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIPPM_NAS_CHECKPOINT_DIR", str(tmp_path))
    dev = "h100-sxm5-80gb"
    set_predictor(dev, None)
    try:
        with pytest.warns(RuntimeWarning, match="no trained predictor checkpoint"):
            pr = predict(tiny_graph(), device=dev)
        # the power model is fitted on measured H100 energy: that figure is a prediction
        assert (pr.latency_source, pr.energy_source, pr.memory_source) == ("analytic", "predicted", "analytic")
        assert math.isfinite(pr.latency_ms) and pr.latency_ms > 0
    finally:
        set_predictor(dev, None)


def test_checkpoint_dir_is_used_and_loaded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIPPM_NAS_CHECKPOINT_DIR", str(tmp_path))
    _predictor().save(tmp_path / f"{DEV}.pt")
    set_predictor(DEV, None)
    try:
        p1 = get_predictor(DEV)
        assert isinstance(p1, GnnPredictor)
        assert get_predictor(DEV) is p1
        pr = predict(tiny_graph(), device=DEV)
        assert pr.latency_source == "predicted"
    finally:
        set_predictor(DEV, None)


def test_predict_many_is_one_batched_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _predictor()
    calls = []
    orig = p.predict_log_full
    monkeypatch.setattr(p, "predict_log_full", lambda feats: (calls.append(len(feats)), orig(feats))[1])
    set_predictor(DEV, p)
    try:
        out = predict_many(_graphs(4), device=DEV, mig=False)
    finally:
        set_predictor(DEV, None)
    assert calls == [4]
    assert all(isinstance(o, Prediction) for o in out)


def test_calibration_reduces_error_and_persists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    p = _predictor()
    gs = _graphs(6)
    raw = [x.latency_ms for x in p.predict_graphs(gs, mig=False, deployment=FEATURES)]
    truth = [1.7 * v for v in raw]  # a device that is 70% slower than the model thinks
    cal = p.calibrate([(g, {"latency_ms": y}) for g, y in zip(gs[:3], truth[:3])])
    assert cal.timeline is not None and cal.timeline["n"] == 3  # a GPU's latency: host and GPU factors
    after = p.predict_graphs(gs[3:], mig=False, deployment=FEATURES)
    err_before = np.mean([abs(r - t) / t for r, t in zip(raw[3:], truth[3:])])
    err_after = np.mean([abs(a.latency_ms - t) / t for a, t in zip(after, truth[3:])])
    assert err_after < 0.5 * err_before
    assert all(a.latency_source == "calibrated" for a in after)
    # an exact 1.7x with no scatter: the whole correction is kept, and the prediction says so
    assert cal.timeline["kept"] == pytest.approx(1.0, abs=0.02)
    assert all(a.details["calibration_kept_latency_ms"] == pytest.approx(1.0, abs=0.02) for a in after)
    assert "calibration_kept_memory_mib" not in after[0].details  # no memory label: memory is not calibrated
    # persisted per device and re-applied when the same checkpoint is loaded
    ck = tmp_path / "ck.pt"
    p.save(ck)
    q = GnnPredictor.load(ck)
    assert q.calibration is not None and q.predict_graphs(gs[3:4], mig=False, deployment=FEATURES)[0].latency_source == "calibrated"
    # a calibration fitted for another checkpoint is ignored
    other = GnnPredictor.load(ck)
    other.meta = dataclasses.replace(other.meta, date="1999-01-01")
    other.save(tmp_path / "other.pt")
    assert GnnPredictor.load(tmp_path / "other.pt").calibration is None
    q.reset_calibration()
    assert GnnPredictor.load(ck).calibration is None


def test_cli_predict_json_keys_equal_prediction_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.cli import main

    monkeypatch.setenv("DIPPM_NAS_CHECKPOINT_DIR", str(tmp_path))
    _predictor().save(tmp_path / f"{DEV}.pt")
    set_predictor(DEV, None)
    try:
        rc = main(["predict", "_models:TinyMobileNet", "--device", DEV, "--batch", "2", "--shape", "3,32,32",
                   "--dtype", "float32", "--json"])
    finally:
        set_predictor(DEV, None)
    assert rc == 0
    (d,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # a list: one object per grid row
    assert set(d) == {f.name for f in dataclasses.fields(Prediction)} | {"model", "input"}
    assert d["latency_source"] == "predicted" and d["memory_source"] == "analytic"
    assert d["mig"] is not None


# ----------------------------------------------------------------------------- novelty floor
def test_novelty_scores_are_nearest_reference_distances() -> None:
    from dippm_nas.predictor import novelty_scores
    from dippm_nas.training import reference_set

    ref = reference_set(torch.tensor([[0.0, 0.0], [3.0, 4.0]]))
    d = novelty_scores(torch.tensor([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [1.0, 0.0]]), ref, block=2)
    assert np.allclose(d, np.array([0.0, 0.0, 5.0, 1.0]) / math.sqrt(2))
    rows = torch.randn(5000, 3)
    sub = reference_set(rows, max_rows=100, seed=1)
    assert sub.shape == (100, 3) and torch.equal(sub, reference_set(rows, max_rows=100, seed=1))  # seeded
    assert novelty_scores(sub, rows).max() == 0.0  # a subset of the training rows


def test_novelty_reference_keeps_repeated_graphs_once() -> None:
    from dippm_nas.training import reference_set

    big = torch.zeros(3000, 2)  # one graph measured 3000 times
    small = torch.tensor([[float(i), 1.0] for i in range(1, 51)])  # 50 distinct graphs of a small source
    ref = reference_set(torch.cat([big, small]), max_rows=100)
    assert ref.shape == (51, 2)  # every distinct row fits: the repetitions do not crowd the small source out


def test_fit_novel_floor_covers_the_requested_share() -> None:
    from dippm_nas.training import fit_novel_floor

    rng = np.random.default_rng(0)
    err = np.abs(rng.normal(0.0, 0.15, 2000))
    sigma = np.full(2000, 0.01)
    f = fit_novel_floor(err, sigma, coverage=0.95)
    cov = np.mean(err <= 2 * np.sqrt(sigma ** 2 + f ** 2))
    assert 0.95 <= cov <= 0.951 and 0.13 < f < 0.17  # 1.96 sigma of N(0, 0.15) is 0.294 = 2 x 0.147
    assert fit_novel_floor(np.array([0.01]), np.array([0.1])) == 0.0  # already covered: no floor
    with pytest.raises(ValueError, match="at least one finite"):
        fit_novel_floor(np.array([np.nan]), np.array([0.1]))


def test_novel_graph_gets_the_novel_floor_and_round_trips(tmp_path: Path) -> None:
    from dippm_nas.training import attach_novelty_reference

    p = _predictor()
    graphs = _graphs(4)
    feats = [featurize(g, DEV) for g in graphs]
    b = collate(feats[:2])
    p.model.set_stats(b["x"], b["static"], b["dev"], torch.zeros(3), torch.full((3,), 0.4))
    # reference = graphs 0 and 1, "validation" = the same two: d0 = 0, every other graph is novel
    attach_novelty_reference(p, feats[:2], feats[:2], floor_log={"latency_ms": 0.3}, calibrated_on="synthetic")
    assert p.meta.novelty["d0"] == pytest.approx(0.0, abs=1e-3) and p.novelty_ref.shape == (2, static_dim())
    near, far = p.predict_graphs([graphs[0], graphs[3]], mig=False, deployment=FEATURES)
    assert near.details["novel"] == 0.0 and far.details["novel"] == 1.0 and far.details["novelty"] > 0
    assert far.latency_ms_std / far.latency_ms >= 0.3 > near.latency_ms_std / near.latency_ms
    path = tmp_path / f"{DEV}.pt"
    p.save(path)
    q = GnnPredictor.load(path, device=DEV, load_calibration=False)
    assert q.meta.novelty == p.meta.novelty and torch.equal(q.novelty_ref, p.novelty_ref)
    assert [x.latency_ms_std for x in q.predict_graphs([graphs[0], graphs[3]], mig=False, deployment=FEATURES)] == pytest.approx(
        [near.latency_ms_std, far.latency_ms_std])
    blob = torch.load(path, weights_only=True)
    torch.save({**blob, "novelty_ref": torch.zeros(2, 3)}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=r"novelty_ref must be a \[R, \d+\] tensor"):
        GnnPredictor.load(tmp_path / "bad.pt")
    meta = json.loads(blob["meta"])
    for novelty, match in (({"d0": 0.1}, "must hold d0, floor_log and calibrated_on"),
                           ({"d0": 0.1, "floor_log": {"energy_j": 0.2}, "calibrated_on": "x"}, "trained targets")):
        torch.save({**blob, "meta": json.dumps({**meta, "novelty": novelty})}, tmp_path / "bad_meta.pt")
        with pytest.raises(CheckpointError, match=match):
            GnnPredictor.load(tmp_path / "bad_meta.pt")


def test_correction_weight_ramp() -> None:
    from dippm_nas.predictor import correction_weight
    from dippm_nas.training import fit_shrink_width

    nov = np.array([0.05, 0.1, 0.15, 0.2, 0.4, np.nan])
    np.testing.assert_allclose(correction_weight(nov, 0.1, 1.0), [1, 1, 0.5, 0, 0, 1])
    np.testing.assert_allclose(correction_weight(nov, 0.1, 0.0), [1, 1, 0, 0, 0, 1])
    np.testing.assert_allclose(correction_weight(nov, 0.1, math.inf), 1.0)
    assert fit_shrink_width(lambda c: abs(c - 0.5) if math.isfinite(c) else 9.0) == 0.5
    assert fit_shrink_width(lambda c: 1.0) == math.inf  # a tie keeps the whole correction


def _corrected_with_reference() -> tuple[GnnPredictor, list, list]:
    """A predictor whose network visibly corrects the prior, with a novelty reference set of 2 of 4 graphs."""
    from dippm_nas.training import attach_novelty_reference

    p = _predictor()
    graphs = _graphs(4)
    feats = [featurize(g, DEV) for g in graphs]
    b = collate(feats[:2])
    p.model.set_stats(b["x"], b["static"], b["dev"], torch.zeros(3), torch.full((3,), 0.4))
    with torch.no_grad():
        p.model.fc3.bias.fill_(0.3)  # a visible correction of the prior (log 1.3)
    attach_novelty_reference(p, feats[:2], feats[2:3], calibrated_on="synthetic")
    return p, graphs, feats


def test_novel_graph_correction_shrinks_towards_the_prior(tmp_path: Path) -> None:
    """With a shrink, a graph past d0 answers between the network and the prior (all the way at width 0),
    graphs at or below d0 are untouched, and predict_log (calibration's view) agrees with predict."""
    from dippm_nas.predictor import correction_weight

    p, graphs, feats = _corrected_with_reference()
    d0 = p.meta.novelty["d0"]
    assert d0 > 0
    full = p.predict_graphs(graphs, mig=False, deployment=FEATURES)
    nov = np.array([x.details["novelty"] for x in full])
    assert (nov[:2] <= d0).all() and (nov[3] > d0)
    prior = np.array([f.prior_latency_ms for f in feats])
    assert not np.allclose([x.latency_ms for x in full], prior, rtol=1e-3)  # the network does correct
    for width in (0.0, 0.5):
        p.meta = dataclasses.replace(p.meta, novelty={**p.meta.novelty, "shrink": {"latency_ms": width}})
        p.clear_prediction_cache()
        got = p.predict_graphs(graphs, mig=False, deployment=FEATURES)
        w = correction_weight(nov, d0, width)
        want = np.exp(np.log(prior) + w * (np.log([x.latency_ms for x in full]) - np.log(prior)))
        np.testing.assert_allclose([x.latency_ms for x in got], want, rtol=1e-5)
        assert [x.details["correction_weight_latency_ms"] for x in got] == pytest.approx(w)
        assert [x.memory_mib for x in got] == pytest.approx([x.memory_mib for x in full])  # not shrunk
        mean, _ = p.predict_log(feats)
        np.testing.assert_allclose(np.exp(mean[:, 0]), [x.latency_ms for x in got], rtol=1e-5)
    assert got[0].latency_ms == pytest.approx(full[0].latency_ms)
    path = tmp_path / f"{DEV}.pt"
    p.save(path)
    q = GnnPredictor.load(path, device=DEV, load_calibration=False)
    assert q.meta.novelty["shrink"] == {"latency_ms": 0.5}
    blob = torch.load(path, weights_only=True)
    meta = json.loads(blob["meta"])
    for shrink, match in (({"energy_j": 0.5}, "trained targets"), ({"latency_ms": -1.0}, "must hold")):
        torch.save({**blob, "meta": json.dumps({**meta, "novelty": {**meta["novelty"], "shrink": shrink}})},
                   tmp_path / "bad_shrink.pt")
        with pytest.raises(CheckpointError, match=match):
            GnnPredictor.load(tmp_path / "bad_shrink.pt")


def test_train_predictor_end_to_end_stores_floors_and_novelty_reference(tmp_path: Path) -> None:
    """A tiny training run: the checkpoint it returns has its validation floor, the novelty reference set and
    threshold, test metrics, and survives a save/load round trip; its predictions track a labelled 2x slowdown."""
    from dippm_nas.graph import OperatorGraph
    from dippm_nas.training import Example, TrainConfig, train_predictor

    examples = []
    for b in range(1, 61):
        d = tiny_graph().to_dict()
        d["spec"]["batch_size"] = b
        g = OperatorGraph.from_dict(d)
        prior_ms = featurize(g, DEV).prior_latency_ms
        examples.append(Example(g, DEV, {"latency_ms": 2.0 * prior_ms}, "tiny", f"tiny-bs{b}"))
    cfg = TrainConfig(hidden=8, members=2, epochs=40, patience=40, batch_size=16, time_budget_s=60.0, threads=1)
    pred, report = train_predictor([], DEV, split="random", cfg=cfg, examples=examples, progress=False,
                                   targets=["latency_ms"])
    assert report["sizes"]["test"] > 0 and "latency_ms" in report["metrics"]
    assert report["metrics"]["latency_ms"]["mape_pct"] < report["metrics"]["latency_ms_prior"]["mape_pct"]
    assert set(pred.meta.std_floor_log) == {"latency_ms"} and pred.meta.targets == {"latency_ms": "ms"}
    nov = pred.meta.novelty
    assert nov is not None and math.isfinite(nov["d0"]) and nov["floor_log"] == {}
    assert pred.novelty_ref is not None and pred.novelty_ref.shape[1] == static_dim()
    pred.save(tmp_path / "t.pt")
    back = GnnPredictor.load(tmp_path / "t.pt", load_calibration=False)
    assert back.meta.novelty == nov and torch.equal(back.novelty_ref, pred.novelty_ref)


def test_correction_penalty_keeps_the_network_nearer_the_prior() -> None:
    """The same tiny training with a large correction penalty learns a smaller correction of the prior."""
    from dippm_nas.graph import OperatorGraph
    from dippm_nas.training import Example, TrainConfig, train_predictor

    examples = []
    for b in range(1, 41):
        d = tiny_graph().to_dict()
        d["spec"]["batch_size"] = b
        g = OperatorGraph.from_dict(d)
        examples.append(Example(g, DEV, {"latency_ms": 2.0 * featurize(g, DEV).prior_latency_ms}, "tiny", f"t{b}"))
    gaps = []
    for penalty in (0.0, 30.0):
        cfg = TrainConfig(hidden=8, members=2, epochs=30, patience=30, batch_size=16, time_budget_s=60.0, threads=1,
                          correction_penalty=penalty)
        pred, _ = train_predictor([], DEV, split="random", cfg=cfg, examples=examples, progress=False,
                                  targets=["latency_ms"])
        out = pred.predict_graphs([e.graph for e in examples], mig=False, deployment=FEATURES)
        gaps.append(float(np.mean([abs(math.log(o.latency_ms / o.details["prior_latency_ms"])) for o in out])))
    assert gaps[0] > 0.3  # without a penalty it learns most of the 2x (log 0.69)
    assert gaps[1] < 0.5 * gaps[0]
    # per target: a weight on another target leaves latency's correction alone; bad weights are refused
    from dippm_nas.cli._train import _penalty
    from dippm_nas.errors import DippmNasError
    from dippm_nas.training._train import _penalty_weights

    assert _penalty("latency_ms=1,memory_mib=0.1") == {"latency_ms": 1.0, "memory_mib": 0.1} and _penalty("2") == 2.0
    w = _penalty_weights(TrainConfig(correction_penalty={"memory_mib": 30.0}))
    assert w is not None and w.tolist() == [0.0, 0.0, 30.0]
    assert _penalty_weights(TrainConfig(correction_penalty=0.0)) is None
    for bad in ({"latency": 1.0}, {"latency_ms": -1.0}):
        with pytest.raises(DippmNasError, match="correction_penalty"):
            _penalty_weights(TrainConfig(correction_penalty=bad))
    with pytest.raises(DippmNasError, match="--correction-penalty"):
        _penalty("latency_ms=high")


def test_a_dtype_never_trained_on_gets_the_prior_flagged() -> None:
    from dippm_nas.features import static_dtype_columns
    from dippm_nas.predictor import collate_globals

    p = _predictor(scale=1.0)  # a network whose correction is far from zero
    gs = _graphs(3)
    feats = [p.features(g) for g in gs]
    prior = np.array([f.prior_latency_ms for f in feats])
    b = collate_globals(feats)
    glob = torch.cat([b["static"], b["dev"]], 1)
    sl, names = static_dtype_columns()
    f32, f16 = sl.start + names.index("float32"), sl.start + names.index("float16")

    def trained_on(dtype_col: int) -> None:
        lo, hi = glob.amin(0).clone(), glob.amax(0).clone()  # these graphs' own ranges ...
        lo[sl], hi[sl] = 0.0, 0.0
        lo[dtype_col] = hi[dtype_col] = 1.0  # ... but one training dtype
        p.model.global_lo.copy_(lo)
        p.model.global_hi.copy_(hi)
        p.clear_prediction_cache()

    trained_on(f16)  # these graphs are float32: never seen
    out = p.predict_graphs(gs, mig=False, deployment=FEATURES)
    for q, y0 in zip(out, prior):
        assert q.latency_source == "analytic" and q.details["dtype_unseen"] == 1.0
        assert q.details["outside_training_range"] == 1.0 and q.latency_ms_std > 0.3 * q.latency_ms
        assert q.latency_ms == pytest.approx(y0, rel=1e-5)
    mean, _ = p.predict_log(feats)  # evaluation and calibration see the same figure
    np.testing.assert_allclose(np.exp(mean[:, 0]), prior, rtol=1e-5)
    # calibrating on measurements of such graphs corrects the prior's figure
    p.calibrate([(g, {"latency_ms": 1.5 * y0}) for g, y0 in zip(gs, prior)], persist=False, deployment=FEATURES)
    for q, y0 in zip(p.predict_graphs(gs, mig=False, deployment=FEATURES), prior):
        assert q.latency_source == "calibrated" and q.latency_ms == pytest.approx(1.5 * y0, rel=0.05)
    p.reset_calibration(persist=False)

    trained_on(f32)  # the same network with float32 in its training range: its own figure
    seen = p.predict_graphs(gs, mig=False, deployment=FEATURES)
    assert all(q.latency_source == "predicted" and q.details["dtype_unseen"] == 0.0 for q in seen)
    assert max(abs(math.log(q.latency_ms / y0)) for q, y0 in zip(seen, prior)) > 1e-3  # not the prior


def test_a_graph_beyond_the_validated_novelty_gets_the_prior() -> None:
    """Past ``validated_max`` (the farthest held-out row the correction was checked on) the prior answers,
    labelled analytic with a correction weight of 0; graphs within it keep the network's figure."""
    from dippm_nas.predictor import NoveltyFloor

    p, graphs, feats = _corrected_with_reference()
    full = p.predict_graphs(graphs, mig=False, deployment=FEATURES)
    nov = np.array([x.details["novelty"] for x in full])
    order = np.argsort(nov)
    vmax = float((nov[order[-1]] + nov[order[-2]]) / 2)  # only the farthest graph lies beyond it
    assert nov[order[-1]] > vmax > nov[order[-2]]
    p.meta = dataclasses.replace(p.meta, novelty=NoveltyFloor(
        p.meta.novelty["d0"], {"latency_ms": 0.1}, "synthetic", validated_max=vmax).to_dict())
    p.clear_prediction_cache()
    got = p.predict_graphs(graphs, mig=False, deployment=FEATURES)
    far = int(order[-1])
    assert got[far].latency_ms == pytest.approx(feats[far].prior_latency_ms, rel=1e-5)
    assert got[far].latency_source == "analytic" and got[far].details["correction_weight_latency_ms"] == 0.0
    for i in order[:-1]:
        assert got[i].latency_ms == pytest.approx(full[i].latency_ms, rel=1e-6)
        assert got[i].latency_source == "predicted" and got[i].details["correction_weight_latency_ms"] == 1.0
    assert NoveltyFloor.from_dict(p.meta.novelty).validated_max == pytest.approx(vmax)
    with pytest.raises(ValueError, match="validated_max"):
        NoveltyFloor(0.1, {}, "x", validated_max=-1.0)


def test_sigma_grows_with_novelty_under_a_graded_floor() -> None:
    """With a graded floor every graph's σ floor follows its novelty (novel or not); without one (older
    metadata) the scalar novel floor applies above d0 only."""
    from dippm_nas.predictor import NoveltyFloor

    p, graphs, feats = _corrected_with_reference()
    nov = np.array([x.details["novelty"] for x in p.predict_graphs(graphs, mig=False, deployment=FEATURES)])
    lo, hi = float(nov.min()), float(nov.max())
    knots = ((lo, 0.05), (hi, 0.5))
    p.meta = dataclasses.replace(p.meta, novelty=NoveltyFloor(
        hi + 1.0, {"latency_ms": 0.05}, "synthetic", graded_floor_log={"latency_ms": knots}).to_dict())
    p.clear_prediction_cache()
    got = p.predict_graphs(graphs, mig=False, deployment=FEATURES)
    _, std, ood, nov_full, _ = p.predict_log_full(feats)
    assert nov_full == pytest.approx(nov)
    in_family = p.meta.std_floor_log["latency_ms"]
    for i, (x, n) in enumerate(zip(got, nov)):
        assert x.details["novel"] == 0.0  # all below d0, yet the floor grows
        floor = float(np.interp(n, [lo, hi], [0.05, 0.5]))
        s = x.latency_ms_std / x.latency_ms
        assert s >= floor * (1 - 1e-6)
        want = math.hypot(std[i, 0], max(in_family, floor))
        if ood[i]:
            want = math.hypot(want, 0.5 * float(p.model.delta_max[0]))
        assert s == pytest.approx(want, rel=1e-5)
    order = np.argsort(nov)
    assert got[order[-1]].latency_ms_std / got[order[-1]].latency_ms > got[order[0]].latency_ms_std / got[
        order[0]].latency_ms
    # the same metadata without its graded floor: below d0 only the in-family floor
    p.meta = dataclasses.replace(p.meta, novelty=NoveltyFloor(hi + 1.0, {"latency_ms": 0.05}, "synthetic").to_dict())
    p.clear_prediction_cache()
    for i, x in enumerate(p.predict_graphs(graphs, mig=False, deployment=FEATURES)):
        assert x.latency_ms_std / x.latency_ms == pytest.approx(
            p.sigma_log("latency_ms", float(std[i, 0]), ood=bool(ood[i])), rel=1e-5)  # no novelty part


def test_prior_only_dtypes_answer_with_the_pinned_prior_and_at_least_its_measured_sigma() -> None:
    """The shipped A100 checkpoint pins its FP64 constants after training (`prior_only_dtypes`): a float64 graph
    gets the pinned prior itself, labelled analytic and flagged, with at least the prior's measured float64 σ;
    a float16 graph is not flagged; an unknown dtype in the metadata is refused."""
    from dippm_nas.predictor import find_checkpoint
    from test_runtime import conv_chain

    p = GnnPredictor.load(find_checkpoint(DEV), load_calibration=False)
    assert p.meta.prior_only_dtypes == ["float64"]
    s64 = p.meta.prior_params["host_model"]["metrics"]["sigma_log_gpu_bound_float64"]
    a, b = p.predict_graphs([conv_chain(64, 256, 56, layers=4, dtype="float64"),
                             conv_chain(64, 256, 56, layers=4, dtype="float16")], mig=False, deployment=FEATURES)
    assert a.latency_source == "analytic" and a.details["prior_only_dtype"] == 1.0
    assert a.details["correction_weight_latency_ms"] == 0.0
    assert a.latency_ms == pytest.approx(a.details["prior_latency_ms"], rel=1e-6)
    assert a.latency_ms_std / a.latency_ms >= 0.99 * s64 > 0.2
    assert b.details["prior_only_dtype"] == 0.0
    with pytest.raises(CheckpointError, match="prior_only_dtypes"):
        dataclasses.replace(p.meta, prior_only_dtypes=["float8"]).check()
