"""In-place operator profiles: ``profile_ops`` and ``build_dataset(op_profiles=...)`` (the host prior's
operator table is fitted on these lines)."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import search_spaces as ss
from dippm_nas.cli import main as cli_main
from dippm_nas.dataset import DatasetError, DatasetStore, build_dataset, open_text
from dippm_nas.errors import MeasurementError
from dippm_nas.measure import Measurement, MeasureSettings, OpProfileWriter, profile_ops
from dippm_nas.prior import aten_op_record, graph_op_records
from dippm_nas.spec import InputSpec

SETTINGS = MeasureSettings(warmup=1, min_repeats=2, max_repeats=2, threads=1)
MLP = [{"space": "mlp", "config": {"in_features": 8, "hidden": [16 * (i + 1)]}, "batch_size": 2} for i in range(2)]


def _fake(model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
    return Measurement(latency_ms=1.5, latency_ms_std=0.1, energy_j=None, memory_mib=12.0, memory_source="rss_delta",
                       n_repeats=5, device=device, environment={"fake_measurer": True}, status="ok",
                       energy_reason="fake measurer: no energy", batch_size=spec.batch_size, dtype=spec.dtype,
                       stop_reason="converged")


def _records(ops: list[list[Any]]) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for op in ops:
        if (r := aten_op_record(op[0], op[1], op[2])) is not None:
            out[repr(r)] += round(op[4])
    return out


def test_profile_ops_sums_identical_calls_per_forward() -> None:
    cfg = {"in_features": 8, "hidden": [16, 16]}
    model = ss.build_model("mlp", cfg)
    spec = ss.get_space("mlp").input_spec(cfg, batch_size=2)
    ops = profile_ops(model, spec, passes=2, warmup=1)
    linear = [op for op in ops if op[0] == "aten::linear"]
    assert linear and all(op[3] > 0 for op in ops)
    # calls are per forward (2 recorded forwards: not 2x), and the linears' shapes are the model's
    assert sum(op[4] for op in linear) == pytest.approx(sum(isinstance(m, torch.nn.Linear) for m in model.modules()))
    assert {tuple(op[1][0]) for op in linear} >= {(2, 8)}
    json.dumps(ops)  # JSON-able as written to the profile file
    for bad in ({"passes": 0}, {"warmup": -1}):
        with pytest.raises(MeasurementError):
            profile_ops(model, spec, **bad)


@pytest.mark.parametrize("rounds", [0, 2])
def test_build_appends_one_profile_per_ok_model_with_its_row_latency(tmp_path: Path, rounds: int) -> None:
    db, prof = tmp_path / "d.sqlite", tmp_path / "p.jsonl.xz"
    r = build_dataset(db, candidates=MLP, workers=1, progress=False, measure_fn=_fake, settings=SETTINGS,
                      rounds=rounds, chunk_size=16, op_profiles=prof, cache=False)
    assert (r.done, r.failed, r.profiled_now) == (2, 0, 2)
    store = DatasetStore(db)
    rows = {row["graph_hash"]: row for row in store.iter_measurements()}
    lines = [json.loads(x) for x in open_text(prof)]
    assert len(lines) == 2
    for line in lines:
        row = rows[line["graph_hash"]]
        assert line["family"] == "mlp" and line["latency_ms"] == row["latency_ms"]
        assert line["latency_schedule"] == ("rounds" if rounds else "own block")
        if not rounds:
            assert line["latency_ms"] == 1.5  # the measurer's figure; with rounds the rounds' one
        # the profiled calls give the records the stored graph gives (what the operator table needs)
        graph = store.get_graph(line["graph_hash"])
        assert _records(line["ops"]) == collections.Counter(repr(rec) for _, rec in graph_op_records(graph))
    store.close()
    # a second build appends (an xz file of two streams reads as one)
    build_dataset(tmp_path / "d2.sqlite", candidates=MLP[:1], workers=1, progress=False, measure_fn=_fake,
                  settings=SETTINGS, op_profiles=prof, cache=False)
    assert len(list(open_text(prof))) == 3


def test_a_model_whose_profiling_fails_keeps_its_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    import dippm_nas.dataset._builder as builder

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("profiler refused on purpose")

    monkeypatch.setattr(builder, "profile_ops", boom)
    r = build_dataset(tmp_path / "d.sqlite", candidates=MLP, workers=1, progress=False, measure_fn=_fake,
                      settings=SETTINGS, op_profiles=tmp_path / "p.jsonl", cache=False)
    assert (r.done, r.profiled_now) == (2, 0)
    assert "profiler refused on purpose" in caplog.text and (tmp_path / "p.jsonl").read_text() == ""


@pytest.mark.parametrize("kw, match", [({"torch_device": "cuda"}, "torch_device='cpu'"), ({"isolate": True}, "isolate=False")])
def test_op_profiles_refuse_what_they_cannot_do(tmp_path: Path, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        build_dataset(tmp_path / "d.sqlite", spaces=["mlp"], n=1, workers=1, progress=False, measure_fn=_fake,
                      op_profiles=tmp_path / "p.jsonl", **kw)


def test_writer_appends_flushed_lines(tmp_path: Path) -> None:
    with OpProfileWriter(tmp_path / "sub" / "p.jsonl") as w:
        w.write(family="f", latency_ms=2, ops=[["aten::relu", [[1, 2]], [], 1.0, 1.0]], graph_hash="h")
        assert json.loads((tmp_path / "sub" / "p.jsonl").read_text())["graph_hash"] == "h"  # flushed already
    assert w.lines == 1


def test_cli_op_profiles_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, prof = tmp_path / "d.sqlite", tmp_path / "p.jsonl"
    rc = cli_main(["dataset", "build", "--space", "mlp", "--n", "2", "--batch", "1", "--out", str(db), "--workers", "1",
                   "--min-repeats", "2", "--max-repeats", "2", "--no-progress", "--no-cache", "--op-profiles", str(prof)])
    assert rc == 0 and "2 operator profiles appended" in capsys.readouterr().out
    assert len(prof.read_text().splitlines()) == 2
