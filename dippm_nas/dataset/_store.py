"""The dataset file: a SQLite database of operator graphs, build jobs and measurement rows.

Tables (every structured value is JSON text, graphs are zlib-compressed JSON; nothing is pickled):

``meta``
    ``key -> value`` (JSON): ``schema_version`` and what wrote the file.
``graphs``
    one row per captured graph, primary key ``structural_hash``
    (:meth:`~dippm_nas.graph.OperatorGraph.structural_hash`): ``graph_zlib`` (the graph's
    :meth:`~dippm_nas.graph.OperatorGraph.to_json`, zlib level 6, :data:`~dippm_nas._compress.ZLIB_LEVEL`), ``format_version``, ``space`` and
    ``config`` of the first candidate that produced it, ``spec`` (InputSpec JSON), ``num_nodes``,
    ``num_edges``, ``total_macs``, ``total_flops``, ``gflops``, ``param_count``, ``mode``.
``jobs``
    one row per build candidate ``(space, config, batch_size, dtype, device)``, unique on
    ``candidate_key`` (SHA-256 of those five): ``status`` is ``pending`` (planned) -> ``converted``
    (graph stored) -> ``running`` (a measurement attempt started; ``attempts`` counts them) -> ``done`` or
    ``failed`` (with ``reason``).
``plans`` / ``plan_items``
    a build's plan, stored before any work: ``plan_key`` (hash of the build arguments), its
    parameters and the ordered job ids. A rerun with the same arguments reuses it.
``measurements``
    one row per measured (or imported) model cost, unique on ``(source, row_key)`` so a resumed build
    or a re-import never duplicates: ``graph_hash`` (nullable: imported rows without a graph),
    ``space``, ``config``, ``batch_size``, ``dtype``, ``device``, ``latency_ms``, ``latency_ms_std``,
    ``latency_ms_median``, ``latency_ms_ci95``, ``energy_j``, ``energy_source``, ``energy_reason``,
    ``memory_mib``, ``memory_source``, ``n_repeats``, ``stop_reason``, ``status`` (``ok``, ``oom``,
    ``timeout``, ``error``; as :data:`dippm_nas.measure.STATUSES`), ``reason``, ``environment`` (where and
    how it was taken: torch, threads, CPU affinity, load average, settings...), ``conditions`` (what
    an imported figure means: precision, layout, how a throughput became a latency...), ``extra``
    (other figures, units in the keys), ``source`` (``measured-here``, ``accel-nasbench``, ``timm``),
    ``measured_at`` and ``created_at`` (ISO 8601 UTC).
``op_measurements``
    operator-level rows (NeuSight microbenchmarks and FX-graph nodes, Vidur LLM-layer ops), unique on
    ``(source, row_key)``: ``device``, ``op``, ``dims`` (JSON), ``dtype``, ``latency_ms``,
    ``latency_ms_std``, ``extra`` (JSON).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection

from dippm_nas._json import canonical_json, loads_json
from dippm_nas._compress import InflateRefused, deflate, inflate
from dippm_nas._sql import SqlStore
from dippm_nas._version import __version__
from dippm_nas.errors import DatasetError, DippmNasError
from dippm_nas.cache import MAX_GRAPH_JSON_BYTES
from dippm_nas.graph import GRAPH_FORMAT_VERSION, OperatorGraph

__all__ = [
    "SCHEMA_VERSION",
    "JOB_STATUSES",
    "MEASURED_HERE",
    "DatasetStore",
    "Job",
    "canonical_json",
    "candidate_key",
    "utc_now",
]

logger = logging.getLogger(__name__)

#: Bumped when a table or the meaning of a column changes; a file of another version is refused.
SCHEMA_VERSION = 1
#: Life of a build job: planned, graph stored, measurement attempt under way, finished.
JOB_STATUSES: tuple[str, ...] = ("pending", "converted", "running", "done", "failed")
#: ``source`` of the rows a build on this machine measured.
MEASURED_HERE = "measured-here"

_SQLITE_BUSY_TIMEOUT_S = 60.0
_IN_CHUNK = 500  # ids per "IN (...)" (stays under SQLite's bound-parameter limit)

_md = sa.MetaData()
_meta = sa.Table(
    "meta", _md,
    sa.Column("key", sa.String(128), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
_graphs = sa.Table(
    "graphs", _md,
    sa.Column("structural_hash", sa.String(64), primary_key=True),
    sa.Column("graph_zlib", sa.LargeBinary, nullable=False),
    sa.Column("format_version", sa.Integer, nullable=False),
    sa.Column("space", sa.String(64)),
    sa.Column("config", sa.Text),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("num_nodes", sa.Integer, nullable=False),
    sa.Column("num_edges", sa.Integer, nullable=False),
    sa.Column("total_macs", sa.BigInteger, nullable=False),
    sa.Column("total_flops", sa.BigInteger, nullable=False),
    sa.Column("gflops", sa.Float, nullable=False),
    sa.Column("param_count", sa.BigInteger, nullable=False),
    sa.Column("mode", sa.String(32), nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
)
_jobs = sa.Table(
    "jobs", _md,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("candidate_key", sa.String(64), nullable=False, unique=True),
    sa.Column("space", sa.String(64), nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("dtype", sa.String(16), nullable=False),
    sa.Column("device", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("graph_hash", sa.String(64)),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("macs_per_sample", sa.BigInteger),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("updated_at", sa.String(32), nullable=False),
    sa.Index("ix_jobs_status", "status"),
)
_plans = sa.Table(
    "plans", _md,
    sa.Column("plan_key", sa.String(64), primary_key=True),
    sa.Column("params", sa.Text, nullable=False),
    sa.Column("n_planned", sa.Integer, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
)
_plan_items = sa.Table(
    "plan_items", _md,
    sa.Column("plan_key", sa.String(64), primary_key=True),
    sa.Column("plan_index", sa.Integer, primary_key=True),
    sa.Column("job_id", sa.Integer, nullable=False),
)
_measurements = sa.Table(
    "measurements", _md,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("source", sa.String(64), nullable=False),
    sa.Column("row_key", sa.String(512), nullable=False),
    sa.Column("job_id", sa.Integer),
    sa.Column("graph_hash", sa.String(64)),
    sa.Column("space", sa.String(64)),
    sa.Column("config", sa.Text),
    sa.Column("batch_size", sa.Integer),
    sa.Column("dtype", sa.String(16)),
    sa.Column("device", sa.String(64), nullable=False),
    sa.Column("latency_ms", sa.Float),
    sa.Column("latency_ms_std", sa.Float),
    sa.Column("latency_ms_median", sa.Float),
    sa.Column("latency_ms_ci95", sa.Float),
    sa.Column("energy_j", sa.Float),
    sa.Column("energy_source", sa.String(32)),
    sa.Column("energy_reason", sa.Text),
    sa.Column("memory_mib", sa.Float),
    sa.Column("memory_source", sa.String(32)),
    sa.Column("n_repeats", sa.Integer),
    sa.Column("stop_reason", sa.String(32)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("environment", sa.Text, nullable=False),
    sa.Column("conditions", sa.Text, nullable=False),
    sa.Column("extra", sa.Text, nullable=False),
    sa.Column("measured_at", sa.String(32)),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.UniqueConstraint("source", "row_key", name="uq_measurements_source_row"),
    sa.Index("ix_measurements_device_source", "device", "source"),
)
_op_measurements = sa.Table(
    "op_measurements", _md,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("source", sa.String(64), nullable=False),
    sa.Column("row_key", sa.String(512), nullable=False),
    sa.Column("device", sa.String(64), nullable=False),
    sa.Column("op", sa.String(128), nullable=False),
    sa.Column("dims", sa.Text, nullable=False),
    sa.Column("dtype", sa.String(16)),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("latency_ms_std", sa.Float),
    sa.Column("extra", sa.Text, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.UniqueConstraint("source", "row_key", name="uq_op_measurements_source_row"),
    sa.Index("ix_op_measurements_source_op", "source", "op"),
)

#: Columns of ``measurements`` a caller may set (``id`` and ``created_at`` are the store's).
MEASUREMENT_COLUMNS: tuple[str, ...] = tuple(c.name for c in _measurements.columns if c.name not in ("id", "created_at"))
_JSON_MEASUREMENT_COLUMNS = ("config", "environment", "conditions", "extra")
OP_COLUMNS: tuple[str, ...] = tuple(c.name for c in _op_measurements.columns if c.name not in ("id", "created_at"))


def utc_now() -> str:
    """ISO 8601 UTC time, seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def candidate_key(space: str, config: Mapping[str, Any], batch_size: int, dtype: str, device: str) -> str:
    """SHA-256 (hex) identifying one build candidate; the unique key of ``jobs``."""
    blob = canonical_json([space, config, batch_size, dtype, device]).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class Job:
    """One row of ``jobs`` (see the module docstring)."""

    id: int
    candidate_key: str
    space: str
    config: dict[str, Any]
    batch_size: int
    dtype: str
    device: str
    status: str
    reason: str | None
    graph_hash: str | None
    attempts: int
    macs_per_sample: int | None


def _loads(text: str | bytes, what: str) -> Any:
    """A JSON column of the dataset file (bounded as :func:`~dippm_nas._json.loads_json` reads).

    Raises:
        DatasetError: the column is not JSON or nests too deep.
    """
    return loads_json(text, f"dataset file: {what}", DatasetError)


def _job(row: Any) -> Job:
    return Job(id=row.id, candidate_key=row.candidate_key, space=row.space, config=_loads(row.config, "a job's config"),
               batch_size=row.batch_size, dtype=row.dtype, device=row.device, status=row.status,
               reason=row.reason, graph_hash=row.graph_hash, attempts=row.attempts,
               macs_per_sample=row.macs_per_sample)


def _chunks(seq: Sequence[Any], n: int = _IN_CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


class DatasetStore(SqlStore):
    """A dataset SQLite file: graphs, build jobs, measurement and operator rows (a
    :class:`~dippm_nas._sql.SqlStore`).

    Safe to use from several threads of one process (each takes its own connection) and from
    several processes (WAL journal, busy timeout). Every write is one transaction, so a process
    killed at any point leaves the file consistent: a measurement row and its job's ``done`` status are
    written together or not at all.

    Args:
        path: the SQLite file; created with its directory when missing (``create=True``).
        create: create a missing file; ``False`` raises :class:`DatasetError` instead.

    Raises:
        DatasetError: the file is not a dataset of this :data:`SCHEMA_VERSION`, or cannot be opened; later, a
            database error of any call.
    """

    what = "dataset file"
    error = DatasetError

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not self.path.exists():
            if not create:
                raise DatasetError(f"dataset file {str(self.path)!r} does not exist")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # WAL journal, busy timeout, synchronous=NORMAL and enforced foreign keys on every connection.
        self._open(URL.create("sqlite", database=str(self.path)), dir_hint="pass a path in a writable directory",
                   local_hint="Keep the dataset file on a local disk.", busy_timeout_s=_SQLITE_BUSY_TIMEOUT_S,
                   foreign_keys=True)
        try:
            with self._engine.begin() as conn:
                _md.create_all(conn, checkfirst=True)
                self._check_schema_version(conn, _meta, SCHEMA_VERSION, {
                    "created_by": f"dippm-nas {__version__}", "created_at": utc_now()})
        except exc.DatabaseError as e:
            self._engine.dispose()
            raise DatasetError(f"cannot open dataset file {str(self.path)!r} as SQLite: {e}") from e
        except BaseException:
            self._engine.dispose()
            raise

    # ------------------------------------------------------------------ plumbing
    def __repr__(self) -> str:
        return f"DatasetStore({str(self.path)!r})"

    def _label(self) -> str:
        return f"dataset file {str(self.path)!r}"

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str, default: Any = None) -> Any:
        """The JSON value stored under ``key`` in ``meta`` (``default`` when absent)."""
        with self._tx("reading meta", write=False) as conn:
            row = conn.execute(sa.select(_meta.c.value).where(_meta.c.key == key)).first()
        return default if row is None else _loads(row.value, f"the dataset's meta value {key!r}")

    def set_meta(self, key: str, value: Any) -> None:
        """Store a JSON-able value under ``key`` (replacing it)."""
        stmt = sqlite_insert(_meta).values(key=key, value=canonical_json(value))
        with self._tx("writing meta") as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": stmt.excluded.value}))

    # ------------------------------------------------------------------ graphs
    @staticmethod
    def _graph_row(graph: OperatorGraph, space: str | None, config: Mapping[str, Any] | None) -> dict[str, Any]:
        return {
            "structural_hash": graph.structural_hash(),
            "graph_zlib": deflate(graph.to_json().encode()),
            "format_version": GRAPH_FORMAT_VERSION,
            "space": space,
            "config": canonical_json(config) if config is not None else None,
            "spec": canonical_json(graph.spec.to_dict()),
            "num_nodes": graph.num_nodes,
            "num_edges": graph.num_edges,
            "total_macs": graph.total_macs,
            "total_flops": graph.total_flops,
            "gflops": graph.total_flops / 1e9,
            "param_count": graph.param_count,
            "mode": graph.mode,
            "created_at": utc_now(),
        }

    def add_graphs(self, items: Iterable[tuple[OperatorGraph, str | None, Mapping[str, Any] | None]],
                   conn: Connection | None = None) -> list[str]:
        """Store graphs (``(graph, space, config)``); a graph already stored is kept. Returns the hashes."""
        rows = [self._graph_row(g, s, c) for g, s, c in items]
        if rows:
            stmt = sqlite_insert(_graphs).on_conflict_do_nothing(index_elements=["structural_hash"])
            if conn is None:
                with self._tx("storing graphs") as c:
                    c.execute(stmt, rows)
            else:
                conn.execute(stmt, rows)
        return [r["structural_hash"] for r in rows]

    def get_graph(self, structural_hash: str) -> OperatorGraph:
        """The stored graph with this hash.

        Raises:
            DatasetError: no such graph, or its JSON cannot be read back.
        """
        with self._tx("reading a graph", write=False) as conn:
            row = conn.execute(
                sa.select(_graphs.c.graph_zlib).where(_graphs.c.structural_hash == structural_hash)
            ).first()
        if row is None:
            raise DatasetError(f"dataset {str(self.path)!r} has no graph {structural_hash!r}")
        return decode_graph(row.graph_zlib, structural_hash)

    def iter_graph_rows(self, hashes: Iterable[str] | None = None) -> Iterator[Any]:
        """Rows of ``graphs`` (all, or those with the given hashes), with the compressed payload."""
        with self._tx("reading graphs", write=False) as conn:
            if hashes is None:
                yield from conn.execute(sa.select(_graphs))
                return
            hs = list(dict.fromkeys(hashes))
            for part in _chunks(hs):
                yield from conn.execute(sa.select(_graphs).where(_graphs.c.structural_hash.in_(part)))

    # ------------------------------------------------------------------ plans and jobs
    def plan_job_ids(self, plan_key: str) -> list[int] | None:
        """Job ids of a stored plan, in plan order; ``None`` when the plan is not stored."""
        with self._tx("reading a plan", write=False) as conn:
            if conn.execute(sa.select(_plans.c.plan_key).where(_plans.c.plan_key == plan_key)).first() is None:
                return None
            rows = conn.execute(
                sa.select(_plan_items.c.job_id).where(_plan_items.c.plan_key == plan_key)
                .order_by(_plan_items.c.plan_index)
            )
            return [r.job_id for r in rows]

    def save_plan(self, plan_key: str, params: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]]) -> list[int]:
        """Store a plan and its jobs in one transaction; returns the job ids in plan order.

        Args:
            plan_key: the plan's identity (a hash of the build arguments).
            params: JSON-able build arguments (recorded).
            jobs: per candidate ``space, config, batch_size, dtype, device`` and optional
                ``status``/``reason`` (a candidate rejected while planning is stored ``failed``),
                ``macs_per_sample``. A candidate already in ``jobs`` (another plan) is reused.
        """
        now = utc_now()
        rows = []
        for j in jobs:
            rows.append({
                "candidate_key": candidate_key(j["space"], j["config"], j["batch_size"], j["dtype"], j["device"]),
                "space": j["space"], "config": canonical_json(j["config"]), "batch_size": j["batch_size"],
                "dtype": j["dtype"], "device": j["device"], "status": j.get("status", "pending"),
                "reason": j.get("reason"), "graph_hash": None, "attempts": 0,
                "macs_per_sample": j.get("macs_per_sample"), "created_at": now, "updated_at": now,
            })
        with self._tx("saving a plan") as conn:
            if conn.execute(sa.select(_plans.c.plan_key).where(_plans.c.plan_key == plan_key)).first() is not None:
                raise DatasetError(f"plan {plan_key} is already stored in {str(self.path)!r}")
            if rows:
                conn.execute(sqlite_insert(_jobs).on_conflict_do_nothing(index_elements=["candidate_key"]), rows)
            keys = [r["candidate_key"] for r in rows]
            id_of: dict[str, int] = {}
            for part in _chunks(keys):
                for r in conn.execute(sa.select(_jobs.c.id, _jobs.c.candidate_key)
                                      .where(_jobs.c.candidate_key.in_(part))):
                    id_of[r.candidate_key] = r.id
            ids = [id_of[k] for k in keys]
            # A candidate failed at planning gets its failed measurement row now (same transaction).
            for r, jid in zip(rows, ids):
                if r["status"] == "failed":
                    self._insert_measurement(conn, {
                        "source": MEASURED_HERE, "row_key": r["candidate_key"], "job_id": jid,
                        "space": r["space"], "config": _loads(r["config"], "a job's config"),
                        "batch_size": r["batch_size"],
                        "dtype": r["dtype"], "device": r["device"], "status": "error", "reason": r["reason"],
                    })
            conn.execute(sa.insert(_plans).values(plan_key=plan_key, params=canonical_json(params),
                                                  n_planned=len(ids), created_at=now))
            if ids:
                conn.execute(sa.insert(_plan_items),
                             [{"plan_key": plan_key, "plan_index": i, "job_id": jid} for i, jid in enumerate(ids)])
        return ids

    def jobs(self, ids: Sequence[int] | None = None, *, status: Sequence[str] | None = None) -> list[Job]:
        """Jobs by id (in the given order) or all jobs, optionally only those with a status in ``status``."""
        out: dict[int, Job] = {}
        with self._tx("reading jobs", write=False) as conn:
            base = sa.select(_jobs)
            if status is not None:
                base = base.where(_jobs.c.status.in_(list(status)))
            if ids is None:
                return [_job(r) for r in conn.execute(base.order_by(_jobs.c.id))]
            for part in _chunks(list(ids)):
                for r in conn.execute(base.where(_jobs.c.id.in_(part))):
                    out[r.id] = _job(r)
        return [out[i] for i in ids if i in out]

    def _update_job(self, conn: Connection, job_id: int, **values: Any) -> None:
        values["updated_at"] = utc_now()
        conn.execute(sa.update(_jobs).where(_jobs.c.id == job_id).values(**values))

    def mark_converted(self, converted: Sequence[tuple[Job, OperatorGraph]]) -> None:
        """Store the graphs and move the jobs to ``converted``, in one transaction."""
        if not converted:
            return
        with self._tx("marking jobs converted") as conn:
            hashes = self.add_graphs(((g, j.space, j.config) for j, g in converted), conn=conn)
            for (job, _g), h in zip(converted, hashes):
                self._update_job(conn, job.id, status="converted", graph_hash=h)

    def start_attempt(self, job: Job) -> int:
        """Mark a job ``running`` and count the attempt; returns the attempt number (1 for the first)."""
        with self._tx("starting an attempt") as conn:
            row = conn.execute(sa.select(_jobs.c.attempts).where(_jobs.c.id == job.id)).one()
            attempts = int(row.attempts) + 1
            self._update_job(conn, job.id, status="running", attempts=attempts)
        return attempts

    def undo_attempt(self, job: Job) -> None:
        """Put a ``running`` job back to ``converted`` without counting the attempt (a usage error, not the model)."""
        with self._tx("undoing an attempt") as conn:
            self._update_job(conn, job.id, status="converted", attempts=max(0, job.attempts))

    def finish_job(self, job: Job, row: Mapping[str, Any]) -> bool:
        """Write the job's measurement row and set the job ``done`` (row ``ok``) or ``failed``, atomically.

        Args:
            job: the job.
            row: measurement columns (see :data:`MEASUREMENT_COLUMNS`); ``source``/``row_key``/``job_id``
                and the job's identity columns are filled in.

        Returns:
            ``False`` when the job already had its row (nothing written), else ``True``.
        """
        full = {
            "source": MEASURED_HERE, "row_key": job.candidate_key, "job_id": job.id, "space": job.space,
            "config": job.config, "batch_size": job.batch_size, "dtype": job.dtype, "device": job.device,
            "graph_hash": job.graph_hash, **row,
        }
        ok = full.get("status") == "ok"
        with self._tx("finishing a job") as conn:
            inserted = self._insert_measurement(conn, full)
            self._update_job(conn, job.id, status="done" if ok else "failed",
                             reason=None if ok else full.get("reason"))
        return inserted

    def reopen_failed(self, job_ids: Sequence[int], statuses: Sequence[str]) -> int:
        """Reopen failed jobs whose measurement row has a status in ``statuses`` (e.g. ``("timeout",)``
        after raising the time cap): their row is deleted and the job goes back to ``converted`` (or
        ``pending`` without a graph) with no attempts, in one transaction. Returns the jobs reopened."""
        if not statuses:
            return 0
        m = _measurements
        n = 0
        with self._tx("reopening failed jobs") as conn:
            for part in _chunks(list(job_ids)):
                rows = conn.execute(
                    sa.select(_jobs.c.id, _jobs.c.graph_hash).join(m, m.c.job_id == _jobs.c.id)
                    .where(_jobs.c.id.in_(part), _jobs.c.status == "failed", m.c.source == MEASURED_HERE,
                           m.c.status.in_(list(statuses)))
                ).all()
                for r in rows:
                    conn.execute(sa.delete(m).where(m.c.job_id == r.id, m.c.source == MEASURED_HERE))
                    self._update_job(conn, r.id, status="converted" if r.graph_hash else "pending", reason=None,
                                     attempts=0)
                n += len(rows)
        return n

    # ------------------------------------------------------------------ measurement rows
    @staticmethod
    def _measurement_values(row: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(row) - set(MEASUREMENT_COLUMNS))
        if unknown:
            raise DatasetError(f"unknown measurement columns {unknown}; valid columns are {list(MEASUREMENT_COLUMNS)}")
        for need in ("source", "row_key", "device", "status"):
            if not row.get(need):
                raise DatasetError(f"a measurement row needs {need!r}, got {row.get(need)!r}")
        if row["status"] != "ok" and not row.get("reason"):
            raise DatasetError(f"a measurement row with status {row['status']!r} needs a reason")
        values = {c: row.get(c) for c in MEASUREMENT_COLUMNS}
        for c in _JSON_MEASUREMENT_COLUMNS:
            v = values[c]
            if c == "config":
                values[c] = canonical_json(v) if v is not None else None
            else:
                values[c] = canonical_json(v if v is not None else {})
        values["created_at"] = utc_now()
        return values

    def _insert_measurement(self, conn: Connection, row: Mapping[str, Any]) -> bool:
        stmt = sqlite_insert(_measurements).on_conflict_do_nothing(index_elements=["source", "row_key"])
        return conn.execute(stmt, [self._measurement_values(row)]).rowcount > 0

    def add_measurements(self, rows: Iterable[Mapping[str, Any]],
                         graphs: Iterable[tuple[OperatorGraph, str | None, Mapping[str, Any] | None]] = ()) -> int:
        """Insert measurement rows (and their graphs) in one transaction; rows whose
        ``(source, row_key)`` exists are skipped. Returns the rows inserted."""
        values = [self._measurement_values(r) for r in rows]
        with self._tx("adding measurements") as conn:
            self.add_graphs(graphs, conn=conn)
            if not values:
                return 0
            stmt = sqlite_insert(_measurements).on_conflict_do_nothing(index_elements=["source", "row_key"])
            n = 0
            for part in _chunks(values):
                n += conn.execute(stmt, list(part)).rowcount
        return n

    def row_keys(self, source: str, table: str = "measurements") -> set[str]:
        """``row_key`` of every row of ``source`` in ``measurements`` or ``op_measurements``."""
        t = {"measurements": _measurements, "op_measurements": _op_measurements}.get(table)
        if t is None:
            raise DatasetError(f"table must be 'measurements' or 'op_measurements', got {table!r}")
        with self._tx("reading row keys", write=False) as conn:
            return {r.row_key for r in conn.execute(sa.select(t.c.row_key).where(t.c.source == source))}

    def iter_measurements(self, *, device: str | None = None, source: str | None = None,
                          status: str | None = None, space: str | None = None) -> Iterator[dict[str, Any]]:
        """Measurement rows as dicts (JSON columns decoded), filtered by the given columns, by id."""
        q = sa.select(_measurements).order_by(_measurements.c.id)
        for col, v in (("device", device), ("source", source), ("status", status), ("space", space)):
            if v is not None:
                q = q.where(_measurements.c[col] == v)
        with self._tx("reading measurements", write=False) as conn:
            for r in conn.execute(q).mappings():
                d = dict(r)
                for c in _JSON_MEASUREMENT_COLUMNS:
                    d[c] = _loads(d[c], f"a measurement's {c}") if d[c] is not None else None
                yield d

    # ------------------------------------------------------------------ operator rows
    def add_op_rows(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert operator-level rows (columns :data:`OP_COLUMNS`; ``dims``/``extra`` JSON-able) in one
        transaction; rows whose ``(source, row_key)`` exists are skipped. Returns the rows inserted."""
        now = utc_now()
        values = []
        for r in rows:
            unknown = sorted(set(r) - set(OP_COLUMNS))
            if unknown:
                raise DatasetError(f"unknown op_measurements columns {unknown}; valid columns are {list(OP_COLUMNS)}")
            v = {c: r.get(c) for c in OP_COLUMNS}
            v["dims"] = canonical_json(v["dims"] or {})
            v["extra"] = canonical_json(v["extra"] or {})
            v["created_at"] = now
            values.append(v)
        if not values:
            return 0
        n = 0
        stmt = sqlite_insert(_op_measurements).on_conflict_do_nothing(index_elements=["source", "row_key"])
        with self._tx("adding operator rows") as conn:
            for part in _chunks(values):
                n += conn.execute(stmt, list(part)).rowcount
        return n

    def iter_op_rows(self, *, source: str | None = None, op: str | None = None) -> Iterator[dict[str, Any]]:
        """Operator rows as dicts (``dims``/``extra`` decoded)."""
        q = sa.select(_op_measurements).order_by(_op_measurements.c.id)
        if source is not None:
            q = q.where(_op_measurements.c.source == source)
        if op is not None:
            q = q.where(_op_measurements.c.op == op)
        with self._tx("reading operator rows", write=False) as conn:
            for r in conn.execute(q).mappings():
                d = dict(r)
                d["dims"] = _loads(d["dims"], "an op measurement's dims")
                d["extra"] = _loads(d["extra"], "an op measurement's extra")
                yield d

    # ------------------------------------------------------------------ summary
    def stats(self) -> dict[str, Any]:
        """Counts: graphs; jobs by status; measurement rows by source/device/status; ``ok`` rows by
        space, by batch size and by both; failed rows by status and space; operator rows by source/device."""
        m = _measurements
        with self._tx("counting rows", write=False) as conn:
            def grouped(*cols: Any, where: Any = None) -> list[dict[str, Any]]:
                q = sa.select(*cols, sa.func.count().label("count")).group_by(*cols).order_by(*cols)
                if where is not None:
                    q = q.where(where)
                return [dict(r) for r in conn.execute(q).mappings()]

            return {
                "path": str(self.path),
                "schema_version": SCHEMA_VERSION,
                "graphs": conn.execute(sa.select(sa.func.count()).select_from(_graphs)).scalar_one(),
                "jobs": {r["status"]: r["count"] for r in grouped(_jobs.c.status)},
                "measurements": grouped(m.c.source, m.c.device, m.c.status),
                "ok_by_space": grouped(m.c.source, m.c.device, m.c.space, where=m.c.status == "ok"),
                "ok_by_batch": grouped(m.c.source, m.c.device, m.c.batch_size, where=m.c.status == "ok"),
                "ok_by_space_batch": grouped(m.c.source, m.c.device, m.c.space, m.c.batch_size,
                                             where=m.c.status == "ok"),
                "failed_by_reason": grouped(m.c.source, m.c.status, m.c.space, where=m.c.status != "ok"),
                "ok_with_graph": conn.execute(
                    sa.select(sa.func.count()).select_from(m).where(m.c.status == "ok", m.c.graph_hash.is_not(None))
                ).scalar_one(),
                "op_measurements": grouped(_op_measurements.c.source, _op_measurements.c.device),
            }


#: The most bytes of JSON a stored graph is inflated to: the conversion cache's cap (64 MiB, about 150 times
#: the JSON of a 7-billion-parameter decoder's graph).
MAX_STORED_GRAPH_BYTES = MAX_GRAPH_JSON_BYTES


def decode_graph(payload: bytes, expected_hash: str | None = None) -> OperatorGraph:
    """A graph from its zlib-compressed JSON; checks the structural hash when given.

    Raises:
        DatasetError: the payload cannot be decompressed or parsed, or its hash differs.
    """
    try:
        text = inflate(payload, MAX_STORED_GRAPH_BYTES)
    except InflateRefused as e:
        if e.too_big:
            raise DatasetError(f"stored graph {expected_hash!r} inflates beyond MAX_STORED_GRAPH_BYTES = "
                               f"{MAX_STORED_GRAPH_BYTES:,} bytes of JSON; a stored graph is never inflated "
                               "further") from e
        raise DatasetError(f"stored graph {expected_hash!r} cannot be read back: {e.reason}") from e
    try:
        graph = OperatorGraph.from_json(text)
    except (DippmNasError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"stored graph {expected_hash!r} cannot be read back: {type(e).__name__}: {e}") from e
    if expected_hash is not None and graph.structural_hash() != expected_hash:
        raise DatasetError(
            f"stored graph {expected_hash!r} decodes to a graph with hash {graph.structural_hash()!r}"
        )
    return graph
