"""The rows of a ``dippm-nas gpu-campaign`` directory (measured on a GPU machine without TVM), their graphs
captured here from the SPEC string and input spec each row records (source ``gpu-campaign``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dippm_nas.dataset.importers._source import GraphRequest, ImportReport, Source, run_import
from dippm_nas.errors import DatasetError
from dippm_nas.measure import CAMPAIGN_SOURCE, read_campaign_rows
from dippm_nas.spec import InputSpec

__all__ = ["CampaignSource", "import_campaign"]


@dataclass
class CampaignSource(Source):
    """A campaign directory (or one of its ``measurements-*.jsonl`` files) as a :class:`Source`: its rows are
    dataset rows already; one graph per distinct (SPEC string, input spec), shared by every runtime's row."""

    path: str
    limit: int | None = None
    name: str = CAMPAIGN_SOURCE
    table: ClassVar[str] = "measurements"

    def read(self) -> list[dict[str, Any]]:
        p = Path(self.path)
        if not p.exists():
            raise DatasetError(f"campaign path {str(p)!r} does not exist")
        rows = [{k: v for k, v in r.items() if k not in ("type", "created_at")} for r in read_campaign_rows(p)]
        return rows[:self.limit] if self.limit is not None else rows

    def rows(self, records: list[dict[str, Any]], report: ImportReport) -> list[dict[str, Any]]:
        return list(records)

    def graph_request(self, row: dict[str, Any]) -> GraphRequest:
        spec, input_spec = row["config"]["spec"], row["config"]["input_spec"]
        return GraphRequest((spec, json.dumps(input_spec, sort_keys=True)), spec, InputSpec.from_dict(input_spec))


def import_campaign(path: str | Path, out: str | Path, *, capture_graphs: bool = True, workers: int = 2,
                    cache: Any = True, limit: int | None = None, progress: bool = True) -> ImportReport:
    """Import the rows of a ``dippm-nas gpu-campaign`` directory (or one of its ``measurements-*.jsonl``
    files) and capture their graphs here (source ``gpu-campaign``).

    Each row's ``config`` names the model SPEC string (``spec``) and the input spec (``input_spec``); one
    graph is captured per distinct pair (every runtime of a model shares it). A graph that cannot be captured
    leaves its rows without a graph and the error in ``extra["graph_error"]``. Rows already in ``out`` (by
    ``row_key``) are skipped, so importing a resumed campaign again adds only its new rows.

    Args:
        path: the campaign directory or a measurement file of it.
        out: dataset SQLite file.
        capture_graphs: capture the graphs (``False``: store the rows without).
        workers, cache, limit, progress: as in :func:`import_accel_nasbench`.

    Raises:
        DatasetError: ``path`` does not exist. MeasurementError: a file not in the campaign's format.
    """
    return run_import(CampaignSource(str(Path(path)), limit=limit), out, capture=capture_graphs, workers=workers,
                      cache=cache, progress=progress)
