"""Few-shot calibration's fit: a robust line in log space, kept only as far as the measurements' own
scatter supports it (dippm_nas/predictor/_calibrate.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dippm_nas.predictor import Calibration, calibration_path, fit_calibration, load_calibration, save_calibration
# the fields of a checkpoint's metadata a calibration is tied to (checkpoint_identity)
META: Any = SimpleNamespace(device="host-cpu", date="2026-11-25", feature_schema_version=1, feature_style="ours",
                            host={"cpu_model": "Test CPU"})


def _fit(pred: np.ndarray, lat: np.ndarray | None = None, mem: np.ndarray | None = None) -> Calibration:
    """Calibration from log predictions of latency and memory and the measured figures (ms, MiB)."""
    pred_log = np.zeros((len(pred), 3))
    pred_log[:, 0] = pred_log[:, 2] = np.log(pred)
    labels = [{**({"latency_ms": float(lat[i])} if lat is not None else {}),
               **({"memory_mib": float(mem[i])} if mem is not None else {})} for i in range(len(pred))]
    return fit_calibration("host-cpu", META, pred_log, labels, targets=["latency_ms", "memory_mib"])


def test_a_clear_offset_is_kept_whole() -> None:
    """A machine 1.4x slower than predicted, with a few per cent of label noise: the whole correction."""
    rng = np.random.default_rng(0)
    pred = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    cal = _fit(pred, lat=1.4 * pred * np.exp(rng.normal(0, 0.05, 5)))
    assert cal.kept["latency_ms"] > 0.95
    a, b, _ = cal.coef["latency_ms"]
    assert math.exp(a + b * math.log(4.0)) == pytest.approx(1.4 * 4.0, rel=0.08)


def test_noise_around_a_right_prediction_is_mostly_dropped() -> None:
    """Labels scattered by 15 % around predictions that are right on average: the shrunk correction moves
    a prediction far less than the raw fit does, on most draws."""
    rng = np.random.default_rng(1)
    pred = np.exp(rng.uniform(0, 3, 5))
    moved_raw, moved_kept, kept = [], [], []
    for _ in range(200):
        y = pred * np.exp(rng.normal(0, 0.15, 5))
        cal = _fit(pred, mem=y)
        a, b, _ = cal.coef["memory_mib"]
        w = cal.kept["memory_mib"]
        kept.append(w)
        x = math.log(pred.mean())
        moved_kept.append(abs(a + (b - 1) * x))
        # the raw correction is the kept one scaled back up (w > 0), or at least as large (w = 0)
        moved_raw.append(abs(a + (b - 1) * x) / w if w > 0 else math.inf)
    assert np.median(kept) < 0.5
    assert np.mean(moved_kept) < 0.08  # a 15 % scatter, averaged over 5 rows, without a shrink: ~0.07-0.2
    assert sum(k < r for k, r in zip(moved_kept, moved_raw)) > 150


def test_one_odd_label_does_not_move_the_line() -> None:
    """Four labels 1.3x the prediction and one caught 5x (a peak RSS that met another allocation)."""
    pred = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    y = 1.3 * pred * np.array([1.0, 1.01, 0.99, 1.0, 5.0, 1.02])
    cal = _fit(pred, mem=y)
    a, b, _ = cal.coef["memory_mib"]
    for p in (15.0, 45.0):
        assert math.exp(a + b * math.log(p)) == pytest.approx(1.3 * p, rel=0.05)


def test_two_measurements_have_no_scatter_to_judge_by() -> None:
    cal = _fit(np.array([2.0, 8.0]), lat=np.array([3.0, 12.0]))
    assert cal.kept["latency_ms"] == 1.0
    a, b, _ = cal.coef["latency_ms"]
    assert math.exp(a + b * math.log(4.0)) == pytest.approx(6.0, rel=1e-6)


def test_kept_round_trips_and_old_files_still_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    cal = _fit(np.array([1.0, 2.0, 4.0]), lat=np.array([1.5, 3.1, 5.9]))
    save_calibration(cal)
    back = load_calibration("host-cpu", META)
    assert back is not None and back.kept == cal.kept and back.coef == cal.coef
    # a file written before `kept` was recorded: its correction is read as it was (kept whole)
    blob = json.loads(calibration_path("host-cpu").read_text())
    del blob["kept"]
    calibration_path("host-cpu").write_text(json.dumps(blob))
    old = load_calibration("host-cpu", META)
    assert old is not None and old.kept == {} and old.coef == cal.coef


def test_a_file_with_a_bad_kept_share_is_ignored_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    save_calibration(_fit(np.array([1.0, 2.0, 4.0]), lat=np.array([1.5, 3.1, 5.9])))
    blob = json.loads(calibration_path("host-cpu").read_text())
    for bad in ({"latency_ms": "x"}, {"latency_ms": 1.5}, ["latency_ms"]):
        calibration_path("host-cpu").write_text(json.dumps({**blob, "kept": bad}))
        caplog.clear()
        assert load_calibration("host-cpu", META) is None
        assert any(r.getMessage().startswith(("ignoring unreadable calibration file",
                                              "ignoring implausible calibration file")) for r in caplog.records)
