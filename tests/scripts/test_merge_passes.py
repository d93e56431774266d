"""scripts/merge_measurement_passes.py: per job the pass with the lower median, kept whole, every pass recorded."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _scripts import load_script

from dippm_nas.dataset import build_dataset
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.spec import InputSpec


def _script() -> Any:
    return load_script("merge_measurement_passes")


class PassMeasurer:
    """Call ``i`` of this pass reads median ``medians[i]`` (mean 10 % above it)."""

    def __init__(self, medians: list[float]) -> None:
        self.medians, self.i = medians, 0

    def __call__(self, model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
        med = self.medians[self.i]
        self.i += 1
        return Measurement(latency_ms=1.1 * med, latency_ms_std=0.1, latency_ms_median=med, energy_j=None,
                           memory_mib=None, memory_source=None, n_repeats=5, device=device,
                           environment={"pass_call": self.i}, memory_reason="fake measurer",
                           batch_size=spec.batch_size, dtype=spec.dtype, energy_reason="fake")


def _build(db: Path, medians: list[float]) -> None:
    build_dataset(db, spaces=["mlp"], n=4, batch_sizes=[1, 2], workers=1, progress=False,
                  measure_fn=PassMeasurer(medians), mac_budget=50_000_000, seed=0)


def _rows(db: Path) -> dict[str, dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    out = {r["candidate_key"]: dict(r) for r in con.execute(
        "SELECT j.candidate_key, m.* FROM measurements m JOIN jobs j ON j.id = m.job_id")}
    con.close()
    return out


def test_merge_keeps_the_lower_median_pass_whole_and_records_every_pass(tmp_path: Path, capsys: Any) -> None:
    a, b, out = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "merged.sqlite"
    _build(a, [1.0, 5.0, 3.0, 2.0])
    _build(b, [2.0, 4.0, 3.5, 1.0])
    assert _script().main([str(a), str(b), "--out", str(out)]) == 0
    ra, rb, rm = _rows(a), _rows(b), _rows(out)
    assert set(rm) == set(ra) == set(rb) and len(rm) == 4
    for key, row in rm.items():
        best = min((ra[key], rb[key]), key=lambda r: r["latency_ms_median"])
        other = rb[key] if best is ra[key] else ra[key]
        assert row["latency_ms_median"] == best["latency_ms_median"] != other["latency_ms_median"]
        assert row["latency_ms"] == best["latency_ms"]  # kept whole: mean and median of one pass, never mixed
        assert json.loads(row["environment"]) == json.loads(best["environment"])
        extra = json.loads(row["extra"])
        assert extra["kept_pass"] == ("a.sqlite" if best is ra[key] else "b.sqlite")
        assert sorted(p["latency_ms_median"] for p in extra["passes"]) == sorted(
            [ra[key]["latency_ms_median"], rb[key]["latency_ms_median"]])
    assert "a.sqlite: kept for 2 of 4 jobs" in capsys.readouterr().out


def test_merge_refuses_passes_of_different_plans(tmp_path: Path) -> None:
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _build(a, [1.0] * 4)
    build_dataset(b, spaces=["mlp"], n=4, batch_sizes=[1, 2], workers=1, progress=False,
                  measure_fn=PassMeasurer([1.0] * 4), mac_budget=50_000_000, seed=1)
    with pytest.raises(SystemExit):
        _script().main([str(a), str(b), "--out", str(tmp_path / "m.sqlite")])
