"""``load_measurements``: measured graphs ready for training, from a dataset file or its export."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

from dippm_nas.errors import DatasetError
from dippm_nas.dataset._export import iter_jsonl
from dippm_nas.dataset._store import DatasetStore, decode_graph
from dippm_nas.graph import OperatorGraph
from dippm_nas.spec import InputSpec

__all__ = ["MeasuredGraph", "load_measurements"]

logger = logging.getLogger(__name__)


class MeasuredGraph(NamedTuple):
    """One training example: a graph, the input spec it was captured with, and the measurement row.

    Attributes:
        graph: the captured operator graph.
        spec: its :class:`~dippm_nas.spec.InputSpec` (``graph.spec``).
        measurement: the ``measurements`` row as a dict: ``latency_ms``, ``latency_ms_std``, ``energy_j``,
            ``memory_mib``, ``memory_source``, ``device``, ``batch_size``, ``dtype``, ``source``, ``space``,
            ``config``, ``status``, ``environment``, ``conditions``, ``extra``...
    """

    graph: OperatorGraph
    spec: InputSpec
    measurement: dict[str, Any]


def _keep(row: dict[str, Any], device: str | None, source: str | None, status: str | None, space: str | None) -> bool:
    return ((device is None or row.get("device") == device) and (source is None or row.get("source") == source)
            and (status is None or row.get("status") == status) and (space is None or row.get("space") == space))


def load_measurements(
    path: str | Path,
    *,
    device: str | None = None,
    source: str | None = None,
    status: str | None = "ok",
    space: str | None = None,
) -> list[MeasuredGraph]:
    """Measured graphs of a dataset, for training a predictor.

    Args:
        path: a dataset SQLite file, or an export (``.jsonl``, ``.jsonl.gz``, ``.jsonl.xz``).
        device: only rows of this device (``"cpu"``, ``"a100-40gb"``, ``"rtx-3090"``...); ``None``: all.
        source: only rows of this source (``"measured-here"``, ``"accel-nasbench"``, ``"timm"``); ``None``: all.
        status: only rows with this status; default ``"ok"`` (failed rows have no latency). ``None``: all.
        space: only rows of this search space.

    Returns:
        One :class:`MeasuredGraph` per matching row that has a graph, in row order. Rows without a
        graph (e.g. timm rows imported without timm) are left out and counted in a log message.

    Raises:
        DatasetError: the file cannot be read, or a row names a graph the file does not hold.
    """
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"dataset file {str(p)!r} does not exist")
    graphs: dict[str, OperatorGraph] = {}
    rows: list[dict[str, Any]] = []
    if ".jsonl" in p.name.lower():
        payloads: dict[str, dict[str, Any]] = {}
        for rec in iter_jsonl(p):
            kind = rec.get("type")
            if kind == "graph":
                payloads[rec["structural_hash"]] = rec["graph"]
            elif kind == "measurement" and _keep(rec, device, source, status, space):
                rows.append({k: v for k, v in rec.items() if k != "type"})

        def get(h: str) -> OperatorGraph:
            if h not in graphs:
                if h not in payloads:
                    raise DatasetError(f"{p}: a measurement names graph {h!r}, which the file does not hold")
                graphs[h] = OperatorGraph.from_dict(payloads.pop(h))
            return graphs[h]
    else:
        store = DatasetStore(p, create=False)
        try:
            rows = list(store.iter_measurements(device=device, source=source, status=status, space=space))
            wanted = {r["graph_hash"] for r in rows if r["graph_hash"]}
            for g in store.iter_graph_rows(wanted):
                graphs[g.structural_hash] = decode_graph(g.graph_zlib, g.structural_hash)
        finally:
            store.close()

        def get(h: str) -> OperatorGraph:
            if h not in graphs:
                raise DatasetError(f"{p}: a measurement names graph {h!r}, which the file does not hold")
            return graphs[h]

    out: list[MeasuredGraph] = []
    no_graph = 0
    for r in rows:
        h = r.get("graph_hash")
        if not h:
            no_graph += 1
            continue
        g = get(h)
        out.append(MeasuredGraph(g, g.spec, r))
    if no_graph:
        logger.info("load_measurements(%s): %d matching rows have no graph and were left out", p.name, no_graph)
    return out
