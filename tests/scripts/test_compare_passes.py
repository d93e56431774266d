"""scripts/compare_passes.py: test-retest MAPE after the global factor, on stored columns and on extra figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _scripts import load_script

from dippm_nas.dataset import build_dataset
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.spec import InputSpec


class _Pass:
    """Call ``i`` reads ``means[i]`` ms (median 0.9 of it)."""

    def __init__(self, means: list[float]) -> None:
        self.means, self.i = means, 0

    def __call__(self, model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
        v = self.means[self.i]
        self.i += 1
        return Measurement(latency_ms=v, latency_ms_std=0.1, latency_ms_median=0.9 * v, energy_j=None,
                           memory_mib=None, memory_source=None, n_repeats=2, device=device, environment={},
                           memory_reason="fake", batch_size=spec.batch_size, dtype=spec.dtype, energy_reason="fake")


def _build(db: Path, means: list[float], rounds: int = 0) -> None:
    build_dataset(db, spaces=["mlp"], n=4, batch_sizes=[1, 2], workers=1, progress=False, measure_fn=_Pass(means),
                  mac_budget=50_000_000, seed=0, rounds=rounds,
                  settings=MeasureSettings(warmup=0, min_repeats=2, max_repeats=2, threads=1))


def test_mape_after_the_global_factor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _build(a, [1.0, 2.0, 3.0, 4.0])
    _build(b, [2.0, 4.0, 6.0, 8.8])  # a global factor of 2, and one row 10 % off it
    cp = load_script("compare_passes")
    assert cp.main([str(a), str(b), "--column", "latency_ms"]) == 0
    out = capsys.readouterr().out
    assert "4 rows in common" in out and "global factor 2.000" in out
    assert "MAPE 2.50 %" in out  # (0 + 0 + 0 + 10 %) / 4
    assert cp.main([str(a), str(b)]) == 0 and "MAPE 2.50 %" in capsys.readouterr().out  # the median: same ratios


def test_rounds_passes_compare_on_the_own_block_and_the_min(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _build(a, [1.0, 2.0, 3.0, 4.0], rounds=1)
    _build(b, [3.0, 6.0, 9.0, 12.0], rounds=1)
    cp = load_script("compare_passes")
    assert cp.main([str(a), str(b), "--column", "own_block.latency_ms"]) == 0
    out = capsys.readouterr().out
    assert "4 rows in common" in out and "global factor 3.000" in out and "MAPE 0.00 %" in out
    assert cp.main([str(a), str(b), "--column", "latency_ms_min"]) == 0  # timed for real: some figure
    assert "4 rows in common" in capsys.readouterr().out


def test_exports_read_like_their_databases_and_each_family_gets_its_factor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.dataset import export_jsonl

    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _build(a, [1.0, 2.0, 3.0, 4.0])
    _build(b, [2.0, 4.0, 6.0, 8.8])
    xa, xb = tmp_path / "a.jsonl.xz", tmp_path / "b.jsonl"
    export_jsonl(a, xa)
    export_jsonl(b, xb)
    cp = load_script("compare_passes")
    outs = []
    for pair in ((a, b), (xa, xb), (a, xb)):  # compressed or not, and mixed with a database
        assert cp.main([str(pair[0]), str(pair[1]), "--column", "latency_ms"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2]
    # one family: its factor relative to the global one is 1, and the rows keep their 10 % outlier
    assert "mlp" in outs[0] and "family factor 1.000, MAPE after it   2.50 %" in outs[0]
    assert "after each family's own factor: MAPE 2.50 %" in outs[0]
