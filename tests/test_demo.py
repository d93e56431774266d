"""Test of ``dippm-nas demo`` with tiny bounds: a real (two-trial) NAS, validation, table and plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import pytest

from dippm_nas.cli import main


def test_demo_runs_with_tiny_bounds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("sklearn", reason="the demo needs scikit-learn (pip install 'dippm-nas[demo]')")
    pytest.importorskip("matplotlib", reason="the demo needs matplotlib (pip install 'dippm-nas[demo]')")
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "demo"
    code = main(["demo", "--trials", "2", "--train-seconds", "0.2", "--epochs", "1", "--batch", "64",
                 "--validate-every", "1", "--validate-max", "1", "--validate-batch", "4", "--out", str(out),
                 "--study-name", "tiny"])
    text = capsys.readouterr().out
    assert code == 0
    assert torch.get_num_threads() == threads  # the verb restores what it changed
    assert "Pareto front" in text and "cannot be validated here" in text and "PREDICTED" in text
    for name in ("pareto.png", "predicted_vs_measured.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with (out / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"] == 2 and summary["device"] == "a100-sxm4-40gb"
    assert summary["validation"]["device"] == "host-cpu" and summary["validation"]["measured"] >= 1
    assert summary["cost_model_s"] > 0
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'demo.sqlite3'}")
    assert study.metric_names == ["accuracy", "latency_ms", "energy_j"]
    assert len(study.trials) == 2 and "dippm_validation" in study.user_attrs
    for t in study.trials:
        assert t.user_attrs["search_space"] == "demo_cnn" and "constraint_memory_mib" in t.user_attrs


def test_demo_rejects_bad_bounds(capsys: pytest.CaptureFixture) -> None:
    assert main(["demo", "--trials", "0"]) == 2
    assert "--trials must be >= 1, got 0" in capsys.readouterr().err
