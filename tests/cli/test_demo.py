"""Test of ``dippm-nas demo --quick``: a real (three-trial) NAS, validation with online adaptation, table, plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import pytest

from dippm_nas.cli import main


def test_demo_quick(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("sklearn", reason="the demo needs scikit-learn (pip install 'dippm-nas[demo]')")
    pytest.importorskip("matplotlib", reason="the demo's plots need matplotlib (pip install 'dippm-nas[plot]')")
    import torch

    from dippm_nas.predictor import get_predictor
    from dippm_nas.validation import CalibratedPredictor

    threads = torch.get_num_threads()
    out = tmp_path / "demo"
    code = main(["demo", "--quick", "--background", "0", "--out", str(out), "--study-name", "tiny"])
    text = capsys.readouterr().out
    assert code == 0
    assert torch.get_num_threads() == threads  # the verb restores what it changed
    host = get_predictor("host-cpu")
    assert not isinstance(host, CalibratedPredictor)  # ... the host-cpu predictor too
    assert host.adaptation is None and host.adaptation_storage is None  # adapted in the study's storage only
    assert "Pareto front" in text and "cannot be validated here" in text and "PREDICTED" in text
    assert "in float32" in text and "not the a100-sxm4-40gb figures" in text  # what the host CPU checks
    assert "validation round 1" in text
    for name in ("pareto.png", "predicted_vs_measured.png", "learning_curve.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert str(out / name) in text  # the paths are printed
    with (out / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)
    # the A100 figures come from the trained checkpoint (its prior beyond the novelty its correction was
    # validated to), in the deployed dtype, with a σ
    srcs = {r["latency_source"] for r in rows}
    assert srcs <= {"predicted", "analytic"} and all(float(r["latency_ms_std"]) > 0 for r in rows)
    assert ("beyond the novelty" in text) == ("analytic" in srcs)  # a candidate answered by the prior says why
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"] == 3 and summary["device"] == "a100-sxm4-40gb" and summary["dtype"] == "float16"
    assert summary["validation"]["device"] == "host-cpu" and summary["validation"]["measured"] >= 1
    assert "predicted before any adaptation" in text  # the first round
    # two candidates measured, so the host-cpu predictor was adapted, and a later round predicted with it
    assert summary["validation"]["ok"] >= 2, summary["validation"]
    assert "host-cpu predictor adapted on" in text
    assert summary["adaptation"], f"no candidate was predicted with an adaptation: {summary['validation']}"
    for a in summary["adaptation"]:  # later rounds: predicted with the adaptation of the rounds before, and without
        assert a["rows"] >= 2 and a["candidates"] >= 1 and a["latency_mape_unadapted_pct"] >= 0
        assert "unadapted ->" in text and f"adaptation on {a['rows']} measured candidates" in text
    assert summary["cost_model_s"] > 0
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'demo.sqlite3'}")
    assert study.metric_names == ["accuracy", "latency_ms", "energy_j"]
    assert len(study.trials) == 3 and "dippm_validation" in study.user_attrs
    for t in study.trials:
        assert t.user_attrs["search_space"] == "demo_cnn" and "constraint_memory_mib" in t.user_attrs
        assert t.user_attrs["input_spec"]["dtype"] == "float16"


def test_demo_without_matplotlib_skips_the_plots(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sklearn", reason="the demo needs scikit-learn (pip install 'dippm-nas[demo]')")
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--trials", "1", "--no-validate", "--background", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "plots skipped: matplotlib is not installed (pip install 'dippm-nas[plot]')" in text
    assert (out / "trials.csv").is_file() and not (out / "pareto.png").exists()


def test_demo_rejects_bad_bounds(capsys: pytest.CaptureFixture) -> None:
    assert main(["demo", "--trials", "0"]) == 2
    assert "argument --trials: expects an integer >= 1, got 0" in capsys.readouterr().err
