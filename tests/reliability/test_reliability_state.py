"""Stored state never answers with a wrong value: the derived weights file, persisted calibrations and conversion
cache rows (``docs/reliability.md``, "Stored state and numbers"). Each test here failed before its fix."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _compare import KERNEL_PATH_REL, assert_close
from dippm_nas import InputSpec, capture
from dippm_nas.cache import (TABLE_NAME, ConversionCache, cache_dir, default_cache, read_default_sqlite,
                             set_default_cache)
from dippm_nas.cache import _rows, _store
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import GRAPH_FORMAT_VERSION, OperatorGraph, synthetic_resnet_graph
from dippm_nas.predictor import (AnalyticPredictor, GnnPredictor, calibration_path, checkpoint_digest,
                                 derived_weights_path, find_checkpoint, set_predictor)
from dippm_nas.predictor._numpy_ensemble import read_derived_weights, write_derived_weights
from test_adversarial import _sql
from test_inference_equality import _graphs

DEV = "a100-sxm4-40gb"


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DIPPM_NAS_CACHE_URL", raising=False)
    monkeypatch.delenv("DIPPM_NAS_CACHE_SECRET", raising=False)
    set_default_cache(None)
    _store._warn_once.reset()
    yield
    set_default_cache(None)


def _dicts(preds: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(p.to_dict())) for p in preds]


def _close(a: Any, b: Any) -> None:
    assert_close(a, b, rel=KERNEL_PATH_REL, abs_tol=1e-9)


# ======================================================================== the derived weights file
def _tamper(path: Path, how: str) -> None:
    """Re-save a derived weights file with the same keys and shapes: weights x1.5, or NaN in one bias."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for k in arrays:
        if how == "scale" and k.startswith("state.") and k.endswith(".weight"):
            arrays[k] = arrays[k] * np.float32(1.5)
    if how == "nan":
        arrays["state.fc3.bias"] = np.full_like(arrays["state.fc3.bias"], np.nan)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_derived_weights_edited_after_writing_are_a_miss_and_rewritten(caplog: pytest.LogCaptureFixture) -> None:
    path = find_checkpoint(DEV)
    ref = GnnPredictor.load(path, engine="torch", load_calibration=False)  # writes the derived file
    derived = derived_weights_path(checkpoint_digest(path))
    want = _dicts(ref.predict_graphs(_graphs()[:6], mig=False))
    _tamper(derived, "scale")
    with caplog.at_level(logging.INFO, logger="dippm_nas.predictor"):
        fast = GnnPredictor.load(path, engine="numpy", load_calibration=False)
    assert fast.engine == "numpy"
    _close(_dicts(fast.predict_graphs(_graphs()[:6], mig=False)), want)
    assert any(str(derived) in r.getMessage() and "do not match their arrays_sha256" in r.getMessage()
               for r in caplog.records)
    state, _, _ = read_derived_weights(checkpoint_digest(path))  # written again from the checkpoint
    np.testing.assert_array_equal(state["fc1.weight"], ref.model.fc1.weight.detach().numpy())


def test_derived_weights_that_are_not_finite_are_a_miss_naming_the_file(caplog: pytest.LogCaptureFixture) -> None:
    path = find_checkpoint(DEV)
    ref = GnnPredictor.load(path, engine="torch", load_calibration=False)
    digest = checkpoint_digest(path)
    state, meta_json, novelty_ref = read_derived_weights(digest)
    state["fc3.bias"] = np.full_like(state["fc3.bias"], np.nan)
    write_derived_weights(digest, state, meta_json, novelty_ref)  # a consistent file (digest and all) with NaN
    with caplog.at_level(logging.INFO, logger="dippm_nas.predictor"):
        fast = GnnPredictor.load(path, engine="numpy", load_calibration=False)
    msgs = [r.getMessage() for r in caplog.records]
    assert any(str(derived_weights_path(digest)) in m and "['fc3.bias'] hold NaN" in m for m in msgs), msgs
    _close(_dicts(fast.predict_graphs(_graphs()[:2], mig=False)), _dicts(ref.predict_graphs(_graphs()[:2], mig=False)))


_CLI = """
import json, runpy, sys
from dippm_nas.capture import _key
_key._dist_version = lambda *names: "9.9"
sys.argv = ["dippm-nas", *sys.argv[1:]]
try:
    runpy.run_module("dippm_nas", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
"""


def test_the_cli_and_the_api_agree_on_a_tampered_derived_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # the CLI answers a cached graph with the numpy engine on the derived file; the API here with torch
    from dippm_nas.capture import _key
    from dippm_nas.cli import main

    monkeypatch.setattr(_key, "_dist_version", lambda *names: "9.9")
    spec = InputSpec(shape=(3, 16, 16), batch_size=8)
    default_cache().put(_key.named_model_key("torchvision:tiny_net", spec), capture("_models:TinyResNet", spec,
                                                                                    cache=False))
    default_cache().close()
    argv = ["predict", "torchvision:tiny_net", "--shape", "3,16,16", "--batch", "8", "--device", DEV, "--json"]
    set_predictor(DEV, None)
    try:
        assert main(argv) == 0  # through torch: writes the derived file
    finally:
        set_predictor(DEV, None)
    want = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    _tamper(derived_weights_path(checkpoint_digest(find_checkpoint(DEV))), "scale")
    script = tmp_path / "cli.py"
    script.write_text(_CLI)
    out = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ})
    assert out.returncode == 0, out.stderr
    _close(json.loads(out.stdout), want)
    assert read_derived_weights(checkpoint_digest(find_checkpoint(DEV))) is not None  # rewritten


# ======================================================================== persisted calibrations
def _host() -> GnnPredictor:
    path = find_checkpoint("host-cpu")
    assert path is not None
    return GnnPredictor.load(path, engine="torch")


def test_calibrate_refuses_an_implausible_fit_and_writes_nothing() -> None:
    pred = _host()
    graphs = _graphs()[6:9]
    base = [p.latency_ms for p in pred.predict_graphs(graphs)]
    for measured in ([1e-300, 1e-300, 1e-300],                       # a latency of 1e-300 ms
                     [base[0] * 1000, base[1] * 1000, base[2] * 1000],  # seconds given as ms... x1000
                     [base[0], base[1], 1e-300]):                     # one absurd figure among good ones
        with pytest.raises(InvalidValueError, match=r"calibration of host-cpu is implausible.*MAX_CORRECTION_LOG"):
            pred.calibrate([(g, {"latency_ms": m}) for g, m in zip(graphs, measured)])
        assert pred.calibration is None and not calibration_path("host-cpu").exists()
    # a machine 1.4x slower is a calibration, written and applied
    cal = pred.calibrate([(g, {"latency_ms": 1.4 * b}) for g, b in zip(graphs, base)])
    assert cal is not None and calibration_path("host-cpu").is_file()
    got = pred.predict_graphs(graphs)
    assert got[0].latency_source == "calibrated" and got[0].latency_ms == pytest.approx(1.4 * base[0], rel=0.05)


@pytest.mark.parametrize("coef", [[50.0, 1.0, 0.0], [0.0, 1e-6, 0.0], [0.0, 1.0, 1e6], [math.nan, 1.0, 0.0]],
                         ids=["offset-e50", "slope-0", "scatter", "nan"])
def test_a_hand_edited_calibration_is_ignored_and_flagged(coef: list[float],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    pred = _host()
    graphs = _graphs()[6:9]
    plain = pred.predict_graphs(graphs)
    pred.calibrate([(g, {"latency_ms": 1.2 * p.latency_ms}) for g, p in zip(graphs, plain)])
    blob = json.loads(calibration_path("host-cpu").read_text())
    calibration_path("host-cpu").write_text(json.dumps({**blob, "coef": {**blob["coef"], "latency_ms": coef}}))
    with caplog.at_level(logging.WARNING, logger="dippm_nas.predictor"):
        again = _host()
    assert again.calibration is None and again.calibration_ignored.startswith("implausible")
    assert any("ignoring implausible calibration file" in r.getMessage() and "host-cpu.json" in r.getMessage()
               for r in caplog.records)
    got = again.predict_graphs(graphs)
    for p, q in zip(got, plain):
        assert p.latency_source == "predicted" and p.details["calibration_ignored"] == 1.0
        assert p.latency_ms == pytest.approx(q.latency_ms, rel=1e-6)
    assert "calibration_ignored" not in plain[0].details


def test_gpu_calibration_bounds_on_write_and_on_read(caplog: pytest.LogCaptureFixture) -> None:
    dev = "h100-sxm5-80gb"  # no checkpoint: the analytic prior calibrates its timeline factors
    pred = AnalyticPredictor(dev)
    graphs = _graphs()[:3]
    with pytest.raises(InvalidValueError, match="residual scatter"):
        pred.calibrate([(g, {"latency_ms": m}) for g, m in zip(graphs, (1e-300, 1.0, 1.0))])
    assert pred.calibration is None and not calibration_path(dev).exists()
    base = [p.latency_ms for p in pred.predict_graphs(graphs, mig=False)]
    pred.calibrate([(g, {"latency_ms": 1.3 * b}) for g, b in zip(graphs, base)])
    blob = json.loads(calibration_path(dev).read_text())
    blob["timeline"]["host_log"] = 50.0
    calibration_path(dev).write_text(json.dumps(blob))
    with caplog.at_level(logging.WARNING, logger="dippm_nas.predictor"):
        again = AnalyticPredictor(dev)
    assert again.calibration is None and "host_log = 50" in again.calibration_ignored
    p = again.predict_graphs(graphs[:1], mig=False)[0]
    assert p.latency_source == "analytic" and p.details["calibration_ignored"] == 1.0
    assert p.latency_ms == pytest.approx(base[0], rel=1e-9)


# ======================================================================== conversion cache rows
def _graph(blocks: int) -> OperatorGraph:
    return synthetic_resnet_graph(blocks, channels=16, batch=2, size=8, source=f"s{blocks}", model_key=f"m{blocks}")


def _exec(statement: str, **params: Any) -> list[Any]:
    """``statement`` on the default SQLite cache file."""
    return _sql(f"sqlite:///{cache_dir() / 'conversion.sqlite'}", statement, **params)


def _both_readers_miss(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read ``key`` with the sqlite3 reader (no SQLAlchemy store loaded) and with the store: both must miss; the
    store deletes the row."""
    with monkeypatch.context() as m:
        m.delitem(sys.modules, "dippm_nas.cache._store")
        assert read_default_sqlite(key) is None
    cache = ConversionCache()
    try:
        assert cache.get(key) is None and cache.stats()["corrupt"] == 1
        assert _exec(f"SELECT key FROM {TABLE_NAME} WHERE key = :k", k=key) == []  # deleted: the next put stores
    finally:
        cache.close()


def _store_two() -> tuple[OperatorGraph, OperatorGraph]:
    small, big = _graph(2), _graph(5)
    with ConversionCache() as cache:
        cache.put("small", small)
        cache.put("big", big)
    return small, big


def test_a_row_rewrapped_around_another_models_stream_is_a_miss(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """An unsigned row's envelope rewritten under this key around the other model's stream, with the other graph's
    hash in the hash column: a row edit, no decompression. Both readers refuse it."""
    _, big = _store_two()
    payload = bytes(_exec(f"SELECT payload FROM {TABLE_NAME} WHERE key = 'big'")[0][0])
    body = payload[_rows._HEADER.size + len(b"big"):]  # the envelope of 'big' (unsigned), then its zlib stream
    forged = _rows._envelope("small", big.structural_hash(), GRAPH_FORMAT_VERSION, body, None)
    _exec(f"UPDATE {TABLE_NAME} SET payload = :p, structural_hash = :h WHERE key = 'small'", p=forged,
          h=big.structural_hash())
    with caplog.at_level(logging.WARNING, logger="dippm_nas.cache"):
        _both_readers_miss("small", monkeypatch)
    assert any("written under another key ('big'" in r.getMessage() for r in caplog.records)


def test_a_text_payload_is_a_miss_that_deletes_the_row(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    _store_two()
    _exec(f"UPDATE {TABLE_NAME} SET payload = :p WHERE key = 'small'", p="some text, not a BLOB")
    assert _exec(f"SELECT typeof(payload) FROM {TABLE_NAME} WHERE key = 'small'") == [("text",)]
    with caplog.at_level(logging.WARNING, logger="dippm_nas.cache"):
        _both_readers_miss("small", monkeypatch)
    assert any("its payload is TEXT, not a BLOB" in r.getMessage() for r in caplog.records)
    with ConversionCache() as cache:  # stored again, then a hit
        cache.put("small", _graph(2))
        assert cache.get("small") is not None


def test_a_stream_inflating_beyond_the_cap_is_a_miss(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_rows, "MAX_GRAPH_JSON_BYTES", 1 << 20)  # 1 MiB here, so the test inflates little
    small, _ = _store_two()
    bomb = zlib.compress(b"0" * (8 << 20), 9)  # 8 KB that inflate to 8 MiB
    assert len(bomb) < 16_000
    payload = _rows._envelope("small", small.structural_hash(), GRAPH_FORMAT_VERSION, bomb, None)
    _exec(f"UPDATE {TABLE_NAME} SET payload = :p WHERE key = 'small'", p=payload)
    with caplog.at_level(logging.WARNING, logger="dippm_nas.cache"):
        _both_readers_miss("small", monkeypatch)
    assert any("inflates beyond 1,052,672 bytes" in r.getMessage() and "MAX_GRAPH_JSON_BYTES = 1,048,576" in
               r.getMessage() for r in caplog.records)


def test_a_graph_beyond_the_cap_is_kept_in_the_process_only(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    g = _graph(5)
    monkeypatch.setattr(_store, "MAX_GRAPH_JSON_BYTES", len(g.to_json()) - 1)
    with ConversionCache() as cache, caplog.at_level(logging.WARNING, logger="dippm_nas.cache"):
        cache.put("big", g)
        assert cache.stats()["rows"] == 0 and cache.get("big") is not None  # this process's memory
    assert any("more than MAX_GRAPH_JSON_BYTES" in r.getMessage() for r in caplog.records)


def test_the_cap_is_far_above_real_graphs() -> None:
    per_node = max(len(g.to_json()) / g.num_nodes for g in _graphs())
    assert 200 < per_node < 400 and _rows.MAX_GRAPH_JSON_BYTES / per_node > 100 * 1_388
    assert math.isclose(_rows.MAX_GRAPH_JSON_BYTES, 64 * 2**20)


def test_a_dataset_graph_is_inflated_only_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    import zlib

    from dippm_nas.dataset import _store as dataset_store
    from dippm_nas.errors import DatasetError

    monkeypatch.setattr(dataset_store, "MAX_STORED_GRAPH_BYTES", 1000)
    bomb = zlib.compress(b" " * 100_000)  # a few hundred bytes that inflate to 100 kB
    with pytest.raises(DatasetError, match="inflates beyond MAX_STORED_GRAPH_BYTES = 1,000 bytes"):
        dataset_store.decode_graph(bomb, "h")
    with pytest.raises(DatasetError, match="cannot be read back"):
        dataset_store.decode_graph(b"not zlib", "h")
