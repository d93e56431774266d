"""Export a dataset file to compressed JSON Lines (for committing) and read it back.

One JSON object per line, ``"type"`` first:

- ``{"type": "header", "format": "dippm-nas-dataset-jsonl", "schema_version": 1, "meta": {...}}`` (first line);
- ``{"type": "graph", "structural_hash": ..., "space": ..., "config": {...}, "graph": {...}}`` with the
  graph as :meth:`~dippm_nas.graph.OperatorGraph.to_dict`;
- ``{"type": "measurement", ...}`` with every column of the ``measurements`` table (JSON decoded);
- ``{"type": "op_measurement", ...}`` likewise for ``op_measurements``.

Graphs come before the measurements that name them. The compression follows the file name:
``.jsonl.xz`` (LZMA; graphs of one family compress far better across lines), ``.jsonl.gz`` or ``.jsonl``.
Build-job bookkeeping (``jobs``, ``plans``) is not exported: an export is data, not a resumable build.
"""

from __future__ import annotations

import gzip
import json
import logging
import lzma
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from dippm_nas._compress import InflateRefused, inflate
from dippm_nas._files import check_output, output_path
from dippm_nas._json import loads_json
from dippm_nas.errors import DatasetError
from dippm_nas.dataset import _store
from dippm_nas.dataset._store import SCHEMA_VERSION, DatasetStore

__all__ = ["export_jsonl", "iter_jsonl", "JSONL_FORMAT", "open_text"]

logger = logging.getLogger(__name__)

JSONL_FORMAT = "dippm-nas-dataset-jsonl"


def open_text(path: str | Path, mode: str = "rt", *, name: str | None = None) -> IO[str]:
    """Open a ``.jsonl``, ``.jsonl.gz`` or ``.jsonl.xz`` file as text; ``name`` (default the path's) decides
    the compression."""
    p = Path(path)
    name = (name or p.name).lower()
    if name.endswith(".xz"):
        return lzma.open(p, mode, encoding="utf-8", preset=9 if "w" in mode else None)  # type: ignore[call-overload]
    if name.endswith(".gz"):
        return gzip.open(p, mode, encoding="utf-8", compresslevel=9)  # type: ignore[call-overload]
    if name.endswith(".jsonl"):
        return open(p, mode, encoding="utf-8")  # noqa: SIM115
    raise DatasetError(f"a JSON Lines dataset file must end in .jsonl, .jsonl.gz or .jsonl.xz, got {name!r}")


def export_jsonl(db: str | Path, out: str | Path, *, source: str | None = None,
                 include_ops: bool = True) -> dict[str, int]:
    """Write the graphs and measurement rows of the dataset file ``db`` to ``out``.

    Args:
        db: a dataset SQLite file.
        out: ``*.jsonl``, ``*.jsonl.gz`` or ``*.jsonl.xz``.
        source: only rows of this source (and the graphs they name); ``None``: all.
        include_ops: also write the ``op_measurements`` rows.

    ``out`` is written to a temporary file renamed into place when complete (:func:`dippm_nas._files.output_path`):
    an ``out`` that is ``db`` itself (a symbolic or hard link to it), a directory, a FIFO or a device is refused
    before anything is opened, and a failed export leaves no partial file.

    Returns:
        Counts written: ``{"graphs": ..., "measurements": ..., "op_measurements": ...}``.

    Raises:
        DatasetError: ``db`` is not a dataset file, ``out`` is refused (above) or has another ending, or the
            write fails.
    """
    counts = {"graphs": 0, "measurements": 0, "op_measurements": 0}
    name = Path(out).name
    if not name.lower().endswith((".jsonl", ".jsonl.gz", ".jsonl.xz")):
        raise DatasetError(f"a JSON Lines dataset file must end in .jsonl, .jsonl.gz or .jsonl.xz, got {name!r}")
    check_output(out, "dataset export", error=DatasetError, inputs=[db])  # before the dataset is opened
    with DatasetStore(db, create=False) as store, \
            output_path(out, "dataset export", error=DatasetError, inputs=[db]) as tmp:
        rows = list(store.iter_measurements(source=source))
        hashes = [r["graph_hash"] for r in rows if r["graph_hash"]]
        meta = {k: store.get_meta(k) for k in ("schema_version", "created_by", "created_at")}
        with open_text(tmp, "wt", name=name) as f:
            f.write(json.dumps({"type": "header", "format": JSONL_FORMAT, "schema_version": SCHEMA_VERSION,
                                "meta": meta}) + "\n")
            for g in store.iter_graph_rows(hashes):
                f.write(json.dumps({
                    "type": "graph", "structural_hash": g.structural_hash, "space": g.space,
                    "config": json.loads(g.config) if g.config else None,
                    "graph": json.loads(_stored_graph_text(g.graph_zlib, g.structural_hash)),
                }, separators=(",", ":")) + "\n")
                counts["graphs"] += 1
            for r in rows:
                r = {k: v for k, v in r.items() if k != "id"}
                f.write(json.dumps({"type": "measurement", **r}, separators=(",", ":")) + "\n")
                counts["measurements"] += 1
            if include_ops:
                for r in store.iter_op_rows(source=source):
                    r = {k: v for k, v in r.items() if k != "id"}
                    f.write(json.dumps({"type": "op_measurement", **r}, separators=(",", ":")) + "\n")
                    counts["op_measurements"] += 1
    logger.info("exported %s to %s: %s", db, out, counts)
    return counts


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of an exported file, header checked.

    Raises:
        DatasetError: not an export of this schema version, or a malformed line.
    """
    with open_text(path, "rt") as f:
        first = f.readline()
        header = loads_json(first, f"{path}: the first line", DatasetError)
        if header.get("type") != "header" or header.get("format") != JSONL_FORMAT:
            raise DatasetError(f"{path}: not a {JSONL_FORMAT} file (first line {first[:80]!r})")
        if header.get("schema_version") != SCHEMA_VERSION:
            raise DatasetError(
                f"{path}: schema_version {header.get('schema_version')!r}; this dippm-nas reads {SCHEMA_VERSION}"
            )
        for lineno, line in enumerate(f, start=2):
            if not line.strip():
                continue
            yield loads_json(line, f"{path}:{lineno}", DatasetError)


def _stored_graph_text(payload: bytes, structural_hash: str) -> bytes:
    """The JSON of a stored graph, inflated to at most ``MAX_STORED_GRAPH_BYTES`` (as the store reads it)."""
    cap = _store.MAX_STORED_GRAPH_BYTES
    try:
        return inflate(payload, cap)
    except InflateRefused as e:
        raise DatasetError(f"stored graph {structural_hash!r} cannot be exported: {e.reason} "
                           f"(a stored graph is inflated to at most MAX_STORED_GRAPH_BYTES = "
                           f"{cap:,} bytes)") from e
