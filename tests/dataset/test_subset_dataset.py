"""scripts/subset_dataset.py: at most N rows per family, seeded, with the graphs they name and nothing else."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _scripts import load_script

from dippm_nas.dataset import build_dataset, export_jsonl, iter_jsonl, load_measurements
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.spec import InputSpec


def _fake(model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
    return Measurement(latency_ms=1.0, latency_ms_std=0.1, latency_ms_median=1.0, energy_j=None, memory_mib=None,
                       memory_source=None, n_repeats=2, device=device, environment={}, memory_reason="fake",
                       batch_size=spec.batch_size, dtype=spec.dtype, energy_reason="fake")


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("subset")
    build_dataset(d / "a.sqlite", spaces=["mlp", "vit"], n=10, batch_sizes=[1, 2], workers=1, progress=False,
                  measure_fn=_fake, mac_budget=50_000_000, seed=0,
                  settings=MeasureSettings(warmup=0, min_repeats=2, max_repeats=2, threads=1))
    export_jsonl(d / "a.sqlite", d / "a.jsonl.gz")
    return d / "a.jsonl.gz"


def _spaces(path: Path) -> Counter[str]:
    return Counter(str(mg.measurement["space"]) for mg in load_measurements(path))


def test_caps_each_family_and_keeps_only_the_graphs_it_needs(export: Path, tmp_path: Path) -> None:
    assert _spaces(export) == {"mlp": 5, "vit": 5}
    out = tmp_path / "s.jsonl.xz"
    assert load_script("subset_dataset").main([str(export), "--per-family", "3", "--seed", "1",
                                               "--out", str(out)]) == 0
    assert _spaces(out) == {"mlp": 3, "vit": 3}
    recs = list(iter_jsonl(out))
    graphs = {r["structural_hash"] for r in recs if r["type"] == "graph"}
    named = {r["graph_hash"] for r in recs if r["type"] == "measurement"}
    assert graphs == named
    again = tmp_path / "t.jsonl"
    load_script("subset_dataset").main([str(export), "--per-family", "3", "--seed", "1", "--out", str(again)])
    assert [r for r in iter_jsonl(again)] == recs  # the seed decides the rows
    only = tmp_path / "u.jsonl"
    load_script("subset_dataset").main([str(export), "--per-family", "9", "--spaces", "vit", "--out", str(only)])
    assert _spaces(only) == {"vit": 5}


def test_names_a_space_the_file_lacks(export: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        load_script("subset_dataset").main([str(export), "--per-family", "2", "--spaces", "bert",
                                            "--out", str(tmp_path / "x.jsonl")])
