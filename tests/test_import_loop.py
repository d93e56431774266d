"""The import loop every importer runs: a user's own Source, graphs captured once per key, resumable rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from torch import nn

from dippm_nas import InputSpec
from dippm_nas.dataset import DatasetError, DatasetStore, ImportReport, Source, run_import
from dippm_nas.dataset.importers import GraphRequest


def _linear(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(8, width), nn.ReLU())


def _broken() -> nn.Module:
    raise RuntimeError("no such layer")


@dataclass
class _Widths(Source):
    """Rows ``(width, device)``; every device's row of one width shares a graph; width 0 has no figure."""

    path: str = "widths"
    name: str = "widths"
    table: ClassVar[str] = "measurements"

    def read(self) -> list[int]:
        return [16, 0, 32, -1]

    def rows(self, records: list[int], report: ImportReport) -> list[dict[str, Any]]:
        out = []
        for w in records:
            for dev in ("a", "b"):
                row: dict[str, Any] = {"source": self.name, "row_key": f"{w}#{dev}", "space": "widths",
                                       "config": {"width": w}, "batch_size": 2, "dtype": "float32", "device": dev,
                                       "extra": {"note": "x"}}
                row.update(status="ok", latency_ms=float(abs(w))) if w else row.update(status="error", reason="none")
                out.append(row)
        return out

    def graph_request(self, row: dict[str, Any]) -> GraphRequest | None:
        w = row["config"]["width"]
        if w == 0:
            return None
        model = _broken if w < 0 else (lambda: _linear(w))
        return GraphRequest(w, model, InputSpec(shape=(8,), batch_size=2))

    def notes(self, report: ImportReport) -> list[str]:
        return [f"{report.inserted} rows"]


def test_a_users_source_runs_through_the_loop_once_per_graph(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    rep = run_import(_Widths(), db, capture=True, workers=1, cache=False, chunk_size=5, progress=False)
    # 3 distinct graphs requested in chunks of 5 rows: the rows of width 32 straddle two chunks, captured once
    assert (rep.rows_read, rep.inserted, rep.failed_rows) == (4, 8, 2)
    assert (rep.graphs_captured, rep.graphs_failed, rep.graphs_skipped) == (2, 1, 0)
    assert rep.notes == ["8 rows"]
    rows = {r["row_key"]: r for r in DatasetStore(db).iter_measurements(source="widths")}
    assert rows["32#a"]["graph_hash"] == rows["32#b"]["graph_hash"] != rows["16#a"]["graph_hash"]
    assert rows["0#a"]["graph_hash"] is None and "graph_error" not in rows["0#a"]["extra"]
    assert rows["-1#b"]["graph_hash"] is None and "no such layer" in rows["-1#b"]["extra"]["graph_error"]
    assert rows["-1#b"]["extra"]["note"] == "x"
    assert DatasetStore(db).stats()["graphs"] == 2
    again = run_import(_Widths(), db, capture=True, workers=1, cache=False, progress=False)
    assert (again.inserted, again.already_present, again.graphs_captured) == (0, 8, 0)


def test_capture_off_counts_the_rows_left_without_a_graph(tmp_path: Path) -> None:
    rep = run_import(_Widths(), tmp_path / "d.sqlite", capture=False, progress=False)
    assert (rep.inserted, rep.graphs_skipped, rep.graphs_captured) == (8, 6, 0)


def test_a_source_of_an_unknown_table_is_refused(tmp_path: Path) -> None:
    class _Bad(_Widths):
        table: ClassVar[str] = "nope"

    with pytest.raises(DatasetError, match=r"table must be one of \('measurements', 'op_measurements'\), got 'nope'"):
        run_import(_Bad(), tmp_path / "d.sqlite", capture=False)
