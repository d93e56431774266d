"""The :class:`Source` protocol of a public data source and the one import loop every importer runs.

An importer is a :class:`Source` (what to read, how a record becomes dataset rows, which graph a row's label
belongs to) handed to :func:`run_import`, which does the rest the same way for every source: rows whose
``row_key`` the dataset already has are skipped (an import run twice, or resumed after a kill, adds nothing
twice), the graphs are captured once per distinct request (:func:`~dippm_nas.capture.capture_many`), each row
gets its ``graph_hash`` or ``extra["graph_error"]``, and the rows are stored one chunk per transaction.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol

from dippm_nas._optional import require
from dippm_nas.capture import capture_many
from dippm_nas.dataset._store import DatasetStore
from dippm_nas.dataset.importers._csv import chunks
from dippm_nas.errors import DatasetError
from dippm_nas.spec import InputSpec

__all__ = ["ImportReport", "Source", "GraphRequest", "run_import", "should_capture", "rows_without_graphs_note",
           "TABLES"]

logger = logging.getLogger(__name__)

#: The tables an importer writes: model-level rows (with graphs) and operator-level rows (without).
TABLES = ("measurements", "op_measurements")


@dataclass
class ImportReport:
    """What an importer did.

    Attributes:
        source: the ``source`` column value of the rows (``accel-nasbench``, ``timm``...).
        csv: the file read.
        out: the dataset file written.
        rows_read: CSV rows read (after ``limit``).
        inserted: measurement (or operator) rows written by this run.
        already_present: rows skipped because an earlier import stored them.
        failed_rows: rows stored with ``status != "ok"`` (the source has no figure; reason stored).
        graphs_captured / graphs_failed: graph captures of this run that succeeded / failed (the
            row is stored without a graph, the error in ``extra["graph_error"]``).
        graphs_skipped: rows stored without a graph because capture was off or timm is missing.
        cells_missing: operator cells the source never profiled (not rows; counted only).
        seconds: wall time.
        notes: what the caller should know (assumptions, skips).
    """

    source: str
    csv: str
    out: str
    rows_read: int = 0
    inserted: int = 0
    already_present: int = 0
    failed_rows: int = 0
    graphs_captured: int = 0
    graphs_failed: int = 0
    graphs_skipped: int = 0
    cells_missing: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class GraphRequest(NamedTuple):
    """The graph a row's label belongs to: rows with the same ``key`` share one capture of ``model`` at ``spec``."""

    key: Hashable
    model: Any
    spec: InputSpec


class Source(Protocol):
    """One public data source, as :func:`run_import` reads it.

    :func:`run_import` calls :meth:`read` once, :meth:`rows` once with what it returned, :meth:`graph_request`
    for each row not yet in the dataset (``"measurements"`` sources only), and :meth:`notes` once at the end.

    Attributes:
        name: the ``source`` column of the rows (``"timm"``); rows are unique per ``(name, row_key)``.
        table: ``"measurements"`` (model-level rows, with graphs) or ``"op_measurements"`` (operator rows).
        path: the file or directory read (the report's ``csv``).
    """

    name: str
    table: ClassVar[str]
    path: str

    def read(self) -> Sequence[Any]:
        """The source's records (CSV rows, campaign rows); their number is the report's ``rows_read``.

        Raises:
            DatasetError: a missing file, or one without the source's columns.
        """
        ...

    def rows(self, records: Sequence[Any], report: ImportReport) -> list[dict[str, Any]]:
        """The dataset rows of ``records`` (each with its ``row_key``), in the order they are stored; a record
        without a figure is a row with ``status="error"`` and the reason, or counted in ``report.cells_missing``."""
        ...

    def graph_request(self, row: dict[str, Any]) -> GraphRequest | None:
        """The graph ``row``'s label belongs to, or ``None`` for a row that has none (no model to build)."""
        return None

    def notes(self, report: ImportReport) -> list[str]:
        """What the caller should know once the rows are stored (assumptions, skips), for ``report.notes``."""
        return []


@dataclass
class _Captured:
    """One capture of a :class:`GraphRequest`: the graph until it is stored with its first row, then its hash."""

    graph_hash: str | None
    error: str | None
    graph: Any = None


def run_import(source: Source, out: str | Path, *, capture: bool, workers: int = 2, cache: Any = True,
               chunk_size: int | None = None, progress: bool = True) -> ImportReport:
    """Import ``source`` into the dataset file ``out``: read, skip what is there, capture, store.

    Args:
        source: what to read (:class:`Source`).
        out: dataset SQLite file (created or extended).
        capture: capture the rows' graphs (``False``: rows with a :meth:`~Source.graph_request` are stored
            without a graph and counted in ``graphs_skipped``).
        workers: conversion processes.
        cache: conversion cache for capture (``True``: the default cache).
        chunk_size: rows per transaction (a killed import resumes at the first unfinished chunk); ``None``: one.
        progress: progress bars.

    Raises:
        DatasetError: the source cannot be read, or names a table other than :data:`TABLES`.
    """
    if source.table not in TABLES:
        raise DatasetError(f"a Source's table must be one of {TABLES}, got {source.table!r}")
    t0 = time.perf_counter()
    records = source.read()
    report = ImportReport(source=source.name, csv=source.path, out=str(out), rows_read=len(records))
    with DatasetStore(out) as store:
        present = store.row_keys(source.name, source.table)
        todo = []
        for row in source.rows(records, report):
            if row["row_key"] in present:
                report.already_present += 1
            else:
                todo.append(row)
        if source.table == "op_measurements":
            for part in chunks(todo, chunk_size or 5000):
                report.inserted += store.add_op_rows(part)
        else:
            _store_measurements(store, source, todo, report, capture=capture, workers=workers, cache=cache,
                                chunk_size=chunk_size, progress=progress)
    report.notes.extend(source.notes(report))
    report.seconds = time.perf_counter() - t0
    logger.info("%s import: %s", source.name, report.as_dict())
    return report


def _store_measurements(store: DatasetStore, source: Source, todo: list[dict[str, Any]], report: ImportReport, *,
                        capture: bool, workers: int, cache: Any, chunk_size: int | None, progress: bool) -> None:
    """Capture, attach and store ``todo`` one chunk (one transaction) at a time."""
    from tqdm.auto import tqdm

    captured: dict[Hashable, _Captured] = {}
    bar = tqdm(total=len(todo), desc=source.name, unit="row", disable=not progress or chunk_size is None)
    for part in chunks(todo, chunk_size or max(len(todo), 1)):
        requests = [source.graph_request(row) for row in part]
        if capture:
            _capture_new([r for r in requests if r is not None], captured, report, workers=workers, cache=cache,
                         progress=progress and chunk_size is None)
        graphs = _attach(part, requests, captured if capture else None, report)
        report.failed_rows += sum(row["status"] != "ok" for row in part)
        report.inserted += store.add_measurements(part, graphs=graphs)
        bar.update(len(part))
    bar.close()


def _capture_new(requests: list[GraphRequest], captured: dict[Hashable, _Captured], report: ImportReport, *,
                 workers: int, cache: Any, progress: bool) -> None:
    """Capture each request whose key is not in ``captured`` yet (once per key), counting successes and failures."""
    new: dict[Hashable, GraphRequest] = {}
    for r in requests:
        if r.key not in captured and r.key not in new:
            new[r.key] = r
    if not new:
        return
    results = capture_many([(r.model, r.spec) for r in new.values()], workers=workers, cache=cache,
                           progress=progress)
    for key, res in zip(new, results):
        if res.graph is not None:
            captured[key] = _Captured(res.graph.structural_hash(), None, res.graph)
            report.graphs_captured += 1
        else:
            captured[key] = _Captured(None, res.error)
            report.graphs_failed += 1


def _attach(rows: Sequence[dict[str, Any]], requests: list[GraphRequest | None],
            captured: dict[Hashable, _Captured] | None, report: ImportReport) -> list[tuple[Any, str, Any]]:
    """Give each row with a request its ``graph_hash`` (or ``extra["graph_error"]``); rows left without a graph
    because capture is off (``captured`` is ``None``) are counted. The ``(graph, space, config)`` triples of the
    graphs first captured for these rows, to store with them."""
    graphs: list[tuple[Any, str, Any]] = []
    for row, req in zip(rows, requests):
        if req is None:
            continue
        if captured is None:
            report.graphs_skipped += 1
            continue
        got = captured[req.key]
        if got.graph_hash is None:
            row["extra"] = {**(row.get("extra") or {}), "graph_error": got.error}
            continue
        row["graph_hash"] = got.graph_hash
        if got.graph is not None:  # stored with its first row; later rows need its hash only
            graphs.append((got.graph, row["space"], row["config"]))
            got.graph = None
    return graphs


def should_capture(capture_graphs: bool | None, module: str, what: str) -> bool:
    """Whether an importer captures graphs: ``None`` when ``module`` is importable, ``True`` always (raising
    without it), ``False`` never.

    Raises:
        MissingDependencyError: ``capture_graphs=True`` and ``module`` is not installed.
    """
    if capture_graphs is True:
        require(module, "vision", what)
        return True
    return _module_available(module) if capture_graphs is None else False


def _module_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def rows_without_graphs_note(report: ImportReport, capture_graphs: bool | None, module: str) -> list[str]:
    """The note (also logged as a warning) on the rows stored without graphs, and why; none when every row got one."""
    if not report.graphs_skipped:
        return []
    msg = (f"{report.graphs_skipped} {report.source} rows stored without graphs: "
           + (f"{module} is not installed (pip install 'dippm-nas[vision]')" if capture_graphs is None
              else "graph capture was turned off"))
    logger.warning(msg)
    return [msg]
