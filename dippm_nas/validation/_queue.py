"""The SQL job queue of validation: enqueue, claim with a lease, heartbeat, complete or fail.

Claiming is safe with many workers on one database:

- PostgreSQL: ``SELECT id ... FOR UPDATE SKIP LOCKED LIMIT 1`` then ``UPDATE`` in one transaction, so
  concurrent workers never wait on, or take, the same row;
- SQLite: one atomic statement ``UPDATE ... SET status='leased' ... WHERE id = (SELECT id ... LIMIT 1)
  AND status='queued' RETURNING id`` (SQLite runs one writer at a time; WAL and a 30 s busy timeout
  let processes take turns);
- other databases: the candidate is read, then ``UPDATE ... WHERE id = :id AND status = 'queued'``;
  a row count of 0 means another worker was first and the next candidate is tried.

A lease lasts ``lease_s`` seconds (default 60) and the worker's heartbeat extends it every
``lease_s / 3`` while it measures, however long the measurement takes. A worker that dies (SIGKILL, a
crash, a lost machine) stops its heartbeat: its job is claimable again ``lease_s`` after the last
heartbeat, by the next claim of any queue user, which puts it back (``queued``) — or marks it
``failed`` after ``max_attempts`` claims. A worker that stops cleanly (SIGTERM, Ctrl-C, an error) hands
back the jobs it claimed but has not recorded with :meth:`JobQueue.release`, which does not count the
attempt. Completing needs the lease: a worker whose lease was taken over cannot write a second result,
and the results table's unique ``job_id`` backs that up. Every time the queue writes (leases, heartbeats,
``created_at``, ``updated_at``, ``measured_at``) is Unix seconds read from the database's clock in the same
transaction (SQLite ``julianday('now')``, PostgreSQL ``now()``, MySQL ``UNIX_TIMESTAMP(NOW(6))``), as
Optuna's RDB heartbeat does, so workers on machines whose clocks disagree still agree on when a lease
ends; other databases use each client's clock (machines sharing such a queue need synchronised clocks).

A row that cannot be decoded (a ``*_json`` column that is not JSON, written by hand or by another
program) is never handed to a worker: :meth:`JobQueue.claim` marks it ``failed`` with the reason and
claims the next one; :meth:`JobQueue.jobs` and :meth:`JobQueue.results` leave such rows out with a
warning (once per row), so one bad row never stops a worker or a listing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from dippm_nas._json import loads_json
from dippm_nas._logging import WarnOnce
from dippm_nas._sql import SqlStore, parse_url
from dippm_nas.devices import resolve_device
from dippm_nas.errors import ValidationError
from dippm_nas.measure import Measurement
from dippm_nas.spec import InputSpec
from dippm_nas.validation._generation import GENERATION_SPACE, read_generation_job
from dippm_nas.validation._tables import JOB_STATUSES, jobs, metadata, path_choices, results
import search_spaces

__all__ = ["Job", "JobQueue", "ValidationRecord", "worker_id", "DEFAULT_LEASE_S", "DEFAULT_MAX_ATTEMPTS"]

logger = logging.getLogger(__name__)

#: Default lease of a claimed job, seconds: a worker's heartbeat extends it every ``lease_s / 3`` while it
#: measures, so this is also the bound on how long a killed worker's job waits before it can be claimed again.
DEFAULT_LEASE_S = 60.0
#: Claims of one job before it is marked ``failed``.
DEFAULT_MAX_ATTEMPTS = 3
_MAX_NAME_CHARS = 512
_MAX_ERROR_CHARS = 2000
#: Attempts of the read-then-conditional-update claim on databases without SKIP LOCKED or RETURNING.
_GENERIC_CLAIM_TRIES = 8


#: The database's clock as Unix seconds, per dialect (``_now``).
_DB_CLOCK: dict[str, Any] = {
    "sqlite": sa.literal_column("(julianday('now') - 2440587.5) * 86400.0"),
    "postgresql": sa.cast(sa.extract("epoch", sa.func.now()), sa.Double),
    "mysql": sa.func.unix_timestamp(sa.func.now(6)),
    "mariadb": sa.func.unix_timestamp(sa.func.now(6)),
}


def _now(conn: Connection) -> float:
    """Unix seconds from the database's clock, read in ``conn``'s transaction; this client's clock for
    dialects without an entry in :data:`_DB_CLOCK` (a function so tests can step the clock)."""
    clock = _DB_CLOCK.get(conn.dialect.name)
    return time.time() if clock is None else float(conn.execute(sa.select(clock)).scalar_one())


def worker_id() -> str:
    """A lease owner name unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValidationError(f"{what} must be plain JSON data (dicts, lists, str, finite numbers, bools, None); "
                              f"got {value!r}: {e}") from e


_warn_once = WarnOnce(logger)


class _CorruptRow(Exception):
    """A row whose columns cannot be decoded; the message names the column and why."""

def _json_column(r: Any, column: str, *, nullable: bool = False) -> Any:
    """The decoded JSON object of ``column`` (a dict; ``None`` when ``nullable`` and NULL)."""
    text = getattr(r, column)
    if text is None and nullable:
        return None
    try:
        value = loads_json(text, column, ValidationError)
    except ValidationError as e:
        raise _CorruptRow(str(e)) from e
    if not isinstance(value, dict):
        raise _CorruptRow(f"{column} must hold a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Job:
    """One row of the job table (see :mod:`dippm_nas.validation._tables` for the columns).

    Attributes:
        config: the model's JSON config in ``space``.
        spec: the input spec as :meth:`InputSpec.to_dict` gives it.
        predicted: the prediction for ``device`` the measurement is compared with
            (``latency_ms``, ``energy_j``, ``memory_mib``, their ``*_std`` and ``*_source``).
        result: :meth:`Measurement.to_dict` once done, else ``None``.
    """

    id: int
    study: str
    trial_number: int
    space: str
    config: dict[str, Any]
    spec: dict[str, Any]
    device: str
    priority: float
    predicted: dict[str, Any]
    status: str
    lease_owner: str | None
    lease_expires_at: float | None
    attempts: int
    result: dict[str, Any] | None
    error: str | None
    created_at: float
    updated_at: float

    @classmethod
    def _from_row(cls, r: Any) -> "Job":
        """The job of a row; raises :class:`_CorruptRow` when a column cannot be decoded."""
        config = _json_column(r, "config_json")
        spec = _json_column(r, "spec_json")
        predicted = _json_column(r, "predicted_json")
        result = _json_column(r, "result_json", nullable=True)
        try:
            return cls(
                id=int(r.id), study=str(r.study), trial_number=int(r.trial_number), space=str(r.space),
                config=config, spec=spec, device=str(r.device), priority=float(r.priority), predicted=predicted,
                status=str(r.status), lease_owner=r.lease_owner,
                lease_expires_at=None if r.lease_expires_at is None else float(r.lease_expires_at),
                attempts=int(r.attempts), result=result, error=r.error, created_at=float(r.created_at),
                updated_at=float(r.updated_at),
            )
        except (TypeError, ValueError) as e:
            raise _CorruptRow(f"a column has a value of the wrong type ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class ValidationRecord:
    """One measured Pareto candidate: predicted vs measured on one device.

    Attributes:
        job_id, study, trial_number, device, worker: where it comes from.
        status: the measurement's status, ``"ok"``, ``"oom"`` (does not fit the device), ``"timeout"``
            or ``"error"``.
        fits: ``False`` on ``"oom"``, ``True`` on ``"ok"``, ``None`` otherwise.
        predicted_latency_ms, measured_latency_ms, latency_error_pct: ms, ms and
            ``100 * (predicted - measured) / measured`` (``None`` when a side is missing).
        predicted_energy_j, measured_energy_j, energy_error_pct: J, J, percent.
        predicted_memory_mib, measured_memory_mib, memory_error_pct: MiB, MiB, percent.
        latency_source: source of the predicted latency (``"analytic"``, ``"predicted"``, ``"calibrated"``).
        measured_at: Unix seconds.
        measurement: the full :meth:`Measurement.to_dict`.
    """

    job_id: int
    study: str
    trial_number: int
    device: str
    worker: str
    status: str
    fits: bool | None
    predicted_latency_ms: float | None
    measured_latency_ms: float | None
    latency_error_pct: float | None
    predicted_energy_j: float | None
    measured_energy_j: float | None
    energy_error_pct: float | None
    predicted_memory_mib: float | None
    measured_memory_mib: float | None
    memory_error_pct: float | None
    latency_source: str | None
    measured_at: float
    measurement: dict[str, Any]

    @classmethod
    def _from_row(cls, r: Any) -> "ValidationRecord":
        """The record of a row; raises :class:`_CorruptRow` when a column cannot be decoded."""
        measurement = _json_column(r, "measurement_json")
        try:
            return cls._build(r, measurement)
        except (TypeError, ValueError) as e:
            raise _CorruptRow(f"a column has a value of the wrong type ({type(e).__name__}: {e})") from e

    @classmethod
    def _build(cls, r: Any, measurement: dict[str, Any]) -> "ValidationRecord":
        return cls(
            job_id=int(r.job_id), study=r.study, trial_number=int(r.trial_number), device=r.device,
            worker=r.worker, status=r.status, fits=None if r.fits is None else bool(r.fits),
            predicted_latency_ms=r.predicted_latency_ms, measured_latency_ms=r.measured_latency_ms,
            latency_error_pct=r.latency_error_pct, predicted_energy_j=r.predicted_energy_j,
            measured_energy_j=r.measured_energy_j, energy_error_pct=r.energy_error_pct,
            predicted_memory_mib=r.predicted_memory_mib, measured_memory_mib=r.measured_memory_mib,
            memory_error_pct=r.memory_error_pct, latency_source=r.latency_source,
            measured_at=float(r.measured_at), measurement=measurement,
        )


def _error_pct(predicted: Any, measured: Any) -> float | None:
    if predicted is None or measured is None:
        return None
    p, m = float(predicted), float(measured)
    if not (math.isfinite(p) and math.isfinite(m)) or m <= 0:
        return None
    return 100.0 * (p - m) / m


def _matching(q: Any, table: sa.Table, **equal: Any) -> Any:
    """``q`` restricted to the rows of ``table`` whose columns equal the given values (``None``: any)."""
    for column, value in equal.items():
        if value is not None:
            q = q.where(table.c[column] == value)
    return q


def _job_values(*, study: Any, trial_number: Any, space: Any, config: Any, spec: Any, device: Any, predicted: Any,
                priority: Any) -> dict[str, Any]:
    """The checked, normalised columns of a new ``queued`` job row (see :meth:`JobQueue.enqueue`, whose errors these
    are); ``created_at`` and ``updated_at`` are the database's to add."""
    if not isinstance(study, str) or not study or len(study) > _MAX_NAME_CHARS:
        raise ValidationError(
            f"study must be a non-empty str of at most {_MAX_NAME_CHARS} characters, got {study!r}"
        )
    if isinstance(trial_number, bool) or not isinstance(trial_number, int) or trial_number < 0:
        raise ValidationError(f"trial_number must be an int >= 0, got {trial_number!r}")
    if isinstance(priority, bool) or not isinstance(priority, (int, float)) or math.isnan(priority):
        raise ValidationError(f"priority must be a number, got {priority!r}")
    config_json = _dumps(dict(config) if isinstance(config, Mapping) else config, "config")
    if not isinstance(spec, Mapping):
        raise ValidationError(f"spec must be a mapping (InputSpec.to_dict()), got {type(spec).__name__}")
    if space == GENERATION_SPACE:  # an LLM generation: its config is a generation job config, no input spec
        cfg = json.loads(config_json)
        read_generation_job(cfg)
        spec_json = _dumps(dict(spec), "spec")
    else:
        cfg = search_spaces.get_space(space).validate(json.loads(config_json))
        # the spec as InputSpec reads it: NumPy scalars become the numbers they hold, a bad spec is refused here
        spec_json = _dumps(InputSpec.from_dict(dict(spec)).to_dict(), "spec")
    dev = resolve_device(device).id
    predicted_json = _dumps(dict(predicted), "predicted")
    return {
        "study": study, "trial_number": trial_number, "space": space, "config_json": _dumps(cfg, "config"),
        "spec_json": spec_json, "device": dev, "priority": float(min(max(priority, -1e300), 1e300)),
        "predicted_json": predicted_json, "status": "queued", "lease_owner": None, "lease_expires_at": None,
        "attempts": 0, "result_json": None, "error": None,
    }


class JobQueue(SqlStore):
    """The validation job queue and results tables in one SQL database (a :class:`~dippm_nas._sql.SqlStore`).

    Args:
        url: a SQLAlchemy URL, usually the Optuna storage's (``sqlite:///study.db``,
            ``postgresql+psycopg2://user:pw@host/db``). The tables are created when missing.
        lease_s: how long a claim lasts without a heartbeat, seconds; a worker extends it every
            ``lease_s / 3`` while it measures, so a killed worker's job is claimable again this long after
            its last heartbeat. Default 60.
        max_attempts: claims of one job before it is marked ``failed``. Default 3.

    Raises:
        ValidationError: an invalid URL, lease or attempt count, or a database that cannot be opened.
        MissingDependencyError: the URL's driver is not installed.

    One object per process (its connection pool does not survive ``fork``).
    """

    what = "validation queue"
    error = ValidationError

    def __init__(self, url: str, *, lease_s: float = DEFAULT_LEASE_S,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not math.isfinite(lease_s) \
                or lease_s <= 0:
            raise ValidationError(f"lease_s must be a finite number > 0, got {lease_s!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValidationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        self.lease_s = float(lease_s)
        self.max_attempts = max_attempts
        # SQLite in WAL mode with a busy timeout, pre-ping elsewhere; a missing driver raises
        # MissingDependencyError with its install hint.
        self._open(parse_url(url, what=self.what, error=ValidationError,
                             example="'sqlite:////path/study.db' or 'postgresql+psycopg2://user@host/db'"),
                   dir_hint="pass a URL whose directory is writable",
                   local_hint="Keep the queue's SQLite file on a local disk.")
        self.dialect = self._engine.dialect.name
        self._create_tables(metadata, [jobs.name, results.name, path_choices.name])

    def __repr__(self) -> str:
        return f"JobQueue(url={self.url!r}, lease_s={self.lease_s:g}, max_attempts={self.max_attempts})"

    # ------------------------------------------------------------------ producer side
    def enqueue(
        self,
        *,
        study: str,
        trial_number: int,
        space: str,
        config: Mapping[str, Any],
        spec: Mapping[str, Any],
        device: str,
        predicted: Mapping[str, Any],
        priority: float = 0.0,
    ) -> int | None:
        """Add a job unless one exists for ``(study, trial_number, device)``.

        The row is checked first: ``space`` must be registered and ``config`` valid in it (the stored
        config is the space's complete, normalised one), ``spec`` must rebuild an
        :class:`~dippm_nas.InputSpec` (for ``space`` :data:`~dippm_nas.validation.GENERATION_SPACE`, an LLM
        generation: ``config`` must be a generation job config, ``spec`` any JSON mapping), ``device`` must be a catalogue id, and everything must be plain
        JSON data.

        Returns:
            The new job id, or ``None`` when the job already existed (another process was first).

        Raises:
            SearchSpaceError: unknown space or invalid config.
            InputSpecError: ``spec`` does not describe an input.
            DeviceError: unknown device.
            ValidationError: a value that is not plain JSON data, or a database error.
        """
        values = _job_values(study=study, trial_number=trial_number, space=space, config=config, spec=spec,
                             device=device, predicted=predicted, priority=priority)
        insert = self._insert_on_conflict(jobs, self.dialect)
        if insert is not None:
            with self._tx("enqueueing a job") as conn:
                now = _now(conn)
                stmt = insert.values({**values, "created_at": now, "updated_at": now}).on_conflict_do_nothing(
                    index_elements=[jobs.c.study, jobs.c.trial_number, jobs.c.device]
                ).returning(jobs.c.id)
                row = conn.execute(stmt).first()
            return None if row is None else int(row[0])
        try:
            with self._tx("enqueueing a job") as conn:
                now = _now(conn)
                res = conn.execute(sa.insert(jobs).values({**values, "created_at": now, "updated_at": now}))
                return int(res.inserted_primary_key[0])
        except ValidationError as e:
            if isinstance(e.__cause__, exc.IntegrityError):  # the job exists: another process was first
                return None
            raise

    # ------------------------------------------------------------------ worker side
    def requeue_expired(self) -> int:
        """Put jobs whose lease expired back in the queue (``failed`` after ``max_attempts`` claims).

        Returns:
            How many jobs were re-queued or failed.
        """
        with self._tx("re-queueing expired leases") as conn:
            now = _now(conn)
            expired = sa.and_(jobs.c.status == "leased", jobs.c.lease_expires_at < now)
            back = (
                sa.update(jobs)
                .where(expired, jobs.c.attempts < self.max_attempts)
                .values(status="queued", lease_owner=None, lease_expires_at=None, updated_at=now,
                        error=f"lease expired (the worker died or hung); re-queued at Unix time {now:.3f}")
            )
            dead = (
                sa.update(jobs)
                .where(expired, jobs.c.attempts >= self.max_attempts)
                .values(status="failed", updated_at=now,
                        error=f"lease expired on each of {self.max_attempts} attempts (the worker died or hung "
                              f"every time); not retried")
            )
            n = conn.execute(back).rowcount + conn.execute(dead).rowcount
        if n:
            logger.info("validation queue: %d expired lease(s) re-queued or failed", n)
        return n

    def claim(self, device: str, owner: str, *, study: str | None = None) -> Job | None:
        """Lease the queued job of ``device`` with the highest priority (oldest first among equals).

        Expired leases are put back first. A row that cannot be decoded is marked ``failed`` with the
        reason (not retried) and the next job is claimed instead, so this never raises for a bad row.

        Args:
            device: catalogue id of the device this worker measures.
            owner: the lease owner name (:func:`worker_id`).
            study: only jobs of this study (``None``: any study).

        Returns:
            The leased :class:`Job` (``status="leased"``, ``attempts`` counted), or ``None`` when the
            queue has nothing for this device.

        Raises:
            ValidationError: a bad ``owner`` or a database error.
        """
        if not isinstance(owner, str) or not owner:
            raise ValidationError(f"owner must be a non-empty str, got {owner!r}")
        self.requeue_expired()
        while True:  # each pass leases one row; a bad row is failed, so the loop ends
            job_id = self._lease_one(device, owner, study)
            if job_id is None:
                return None
            with self._tx("reading a job") as conn:
                row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).first()
            if row is None:  # deleted by someone else in between
                continue
            try:
                job = Job._from_row(row)
            except _CorruptRow as e:
                self._fail_corrupt(job_id, owner, str(e))
                continue
            logger.debug("validation queue: %s claimed job %d (study %s, trial %d, attempt %d)", owner, job.id,
                         job.study, job.trial_number, job.attempts)
            return job

    def _lease_one(self, device: str, owner: str, study: str | None) -> int | None:
        """Lease one queued row of ``device`` (and ``study``); its id, or ``None`` when none is queued."""
        cond = [jobs.c.status == "queued", jobs.c.device == device]
        if study is not None:
            cond.append(jobs.c.study == study)
        pick = sa.select(jobs.c.id).where(*cond).order_by(jobs.c.priority.desc(), jobs.c.id).limit(1)

        def lease(conn: Connection) -> dict[str, Any]:
            now = _now(conn)
            return {"status": "leased", "lease_owner": owner, "lease_expires_at": now + self.lease_s,
                    "attempts": jobs.c.attempts + 1, "updated_at": now}

        if self.dialect == "postgresql":
            with self._tx("claiming a job") as conn:
                row = conn.execute(pick.with_for_update(skip_locked=True)).first()
                if row is None:
                    return None
                conn.execute(sa.update(jobs).where(jobs.c.id == row.id).values(**lease(conn)))
                return int(row.id)
        if self.dialect == "sqlite":
            with self._tx("claiming a job") as conn:
                row = conn.execute(sa.update(jobs).where(jobs.c.id == pick.scalar_subquery(), jobs.c.status == "queued")
                                   .values(**lease(conn)).returning(jobs.c.id)).first()
            return None if row is None else int(row[0])
        for _ in range(_GENERIC_CLAIM_TRIES):
            with self._tx("claiming a job") as conn:
                row = conn.execute(pick).first()
            if row is None:
                return None
            with self._tx("claiming a job") as conn:
                won = conn.execute(sa.update(jobs).where(jobs.c.id == row.id, jobs.c.status == "queued")
                                   .values(**lease(conn))).rowcount
            if won == 1:
                return int(row.id)
        return None

    def _fail_corrupt(self, job_id: int, owner: str, reason: str) -> None:
        """Mark a leased row that cannot be decoded ``failed`` with the reason (never retried)."""
        with self._tx("failing a corrupt job") as conn:
            now = _now(conn)
            error = (f"the job row cannot be decoded: {reason}; marked failed by {owner} at Unix time {now:.3f}, "
                     "not retried (enqueue the trial again to measure it)")
            conn.execute(sa.update(jobs)
                         .where(jobs.c.id == job_id, jobs.c.lease_owner == owner, jobs.c.status == "leased")
                         .values(status="failed", error=error[:_MAX_ERROR_CHARS], lease_owner=None,
                                 lease_expires_at=None, updated_at=now))
        logger.warning("validation queue %s: job %d cannot be decoded (%s); marked failed", self.url, job_id, reason)

    def heartbeat(self, job_id: int, owner: str) -> bool:
        """Extend the lease of a job this owner holds; ``False`` when the lease was lost."""
        with self._tx("extending a lease") as conn:
            now = _now(conn)
            return conn.execute(
                sa.update(jobs).where(jobs.c.id == job_id, jobs.c.lease_owner == owner, jobs.c.status == "leased")
                .values(lease_expires_at=now + self.lease_s, updated_at=now)).rowcount == 1

    def complete(self, job: Job, owner: str, measurement: Any) -> bool:
        """Record a measurement of a leased job: job ``done`` and one results row, in one transaction.

        Args:
            job: the claimed job.
            owner: the lease owner that claimed it.
            measurement: a :class:`~dippm_nas.measure.Measurement` (any status: ``"oom"`` means the model
                does not fit the device, which is a result).

        Returns:
            ``True`` when recorded; ``False`` when this owner no longer holds the lease (the job was
            re-queued and may be measured by someone else), in which case nothing is written.
        """
        if not isinstance(measurement, Measurement):
            raise ValidationError(
                f"measurement must be a dippm_nas.measure.Measurement, got {type(measurement).__name__}"
            )
        m = measurement.to_dict()
        m_json = _dumps(m, "measurement")
        p = job.predicted
        row = {
            "job_id": job.id, "study": job.study, "trial_number": job.trial_number, "device": job.device,
            "worker": owner, "status": measurement.status,
            "fits": True if measurement.status == "ok" else (False if measurement.status == "oom" else None),
            "predicted_latency_ms": p.get("latency_ms"), "measured_latency_ms": measurement.latency_ms,
            "latency_error_pct": _error_pct(p.get("latency_ms"), measurement.latency_ms),
            "predicted_energy_j": p.get("energy_j"), "measured_energy_j": measurement.energy_j,
            "energy_error_pct": _error_pct(p.get("energy_j"), measurement.energy_j),
            "predicted_memory_mib": p.get("memory_mib"), "measured_memory_mib": measurement.memory_mib,
            "memory_error_pct": _error_pct(p.get("memory_mib"), measurement.memory_mib),
            "latency_source": p.get("latency_source"), "measurement_json": m_json,
        }
        with self._tx("recording a measurement") as conn:
            now = _now(conn)
            row["measured_at"] = now
            done = (sa.update(jobs).where(jobs.c.id == job.id, jobs.c.lease_owner == owner, jobs.c.status == "leased")
                    .values(status="done", result_json=m_json, lease_expires_at=None, updated_at=now))
            if conn.execute(done).rowcount != 1:
                logger.warning("validation queue: %s lost the lease of job %d (study %s, trial %d) before "
                               "finishing; its measurement is dropped, the job's current holder records one",
                               owner, job.id, job.study, job.trial_number)
                return False
            conn.execute(sa.insert(results).values(row))
        return True

    def fail(self, job: Job, owner: str, reason: str) -> bool:
        """Mark a leased job ``failed`` (it could not be run: unknown space, bad config...); not retried.

        Returns:
            ``False`` when this owner no longer holds the lease (nothing written).
        """
        with self._tx("failing a job") as conn:
            now = _now(conn)
            return conn.execute(
                sa.update(jobs).where(jobs.c.id == job.id, jobs.c.lease_owner == owner, jobs.c.status == "leased")
                .values(status="failed", error=str(reason)[:_MAX_ERROR_CHARS], lease_expires_at=None,
                        updated_at=now)).rowcount == 1

    def release(self, job: Job, owner: str) -> bool:
        """Hand a leased job back to the queue without counting the attempt (the worker is stopping).

        The job goes back to ``queued`` with ``attempts`` one lower, so a worker stopped by SIGTERM, Ctrl-C
        or an error between claiming and recording never uses up a job's ``max_attempts``.

        Returns:
            ``False`` when this owner no longer holds the lease (nothing written).
        """
        with self._tx("releasing a job") as conn:
            now = _now(conn)
            return conn.execute(
                sa.update(jobs).where(jobs.c.id == job.id, jobs.c.lease_owner == owner, jobs.c.status == "leased")
                .values(status="queued", lease_owner=None, lease_expires_at=None, updated_at=now,
                        attempts=sa.case((jobs.c.attempts > 0, jobs.c.attempts - 1), else_=0),
                        error=f"released unmeasured by {owner} at Unix time {now:.3f} (the worker stopped); "
                              "the attempt is not counted")).rowcount == 1

    # ------------------------------------------------------------------ reading
    def get(self, job_id: int) -> Job:
        """The job with this id.

        Raises:
            ValidationError: no such job.
        """
        with self._tx("reading a job") as conn:
            row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise ValidationError(f"validation queue {self.url!r} has no job {job_id}")
        try:
            return Job._from_row(row)
        except _CorruptRow as e:
            raise ValidationError(f"validation queue {self.url!r}: job {job_id} cannot be decoded: {e} "
                                  f"(status {row.status!r}, error {row.error!r})") from e

    def _decoded(self, rows: Any, kind: type, what: str) -> list[Any]:
        """``kind._from_row`` of each row; a row that cannot be decoded is left out with a warning (once)."""
        out = []
        for r in rows:
            try:
                out.append(kind._from_row(r))
            except _CorruptRow as e:
                _warn_once(f"{self.url}:{what}:{r.id}", "validation queue %s: %s row %d cannot be decoded (%s); "
                           "left out", self.url, what, r.id, e)
        return out

    def jobs(self, *, study: str | None = None, device: str | None = None, status: str | None = None) -> list[Job]:
        """Jobs, oldest first, optionally of one study, device and status (rows that cannot be decoded are
        left out, with a warning once per row)."""
        if status is not None and status not in JOB_STATUSES:
            raise ValidationError(f"status must be one of {JOB_STATUSES} or None, got {status!r}")
        q = _matching(sa.select(jobs).order_by(jobs.c.id), jobs, study=study, device=device, status=status)
        with self._tx("listing jobs") as conn:
            rows = conn.execute(q).all()
        return self._decoded(rows, Job, "job")

    def trial_numbers(self, study: str, device: str) -> set[int]:
        """Trial numbers of ``study`` that have a job for ``device`` (any status)."""
        q = sa.select(jobs.c.trial_number).where(jobs.c.study == study, jobs.c.device == device)
        with self._tx("listing jobs") as conn:
            return {int(r[0]) for r in conn.execute(q)}

    def counts(self, *, study: str | None = None, device: str | None = None) -> dict[str, int]:
        """``{status: number of jobs}`` for every status of :data:`JOB_STATUSES`."""
        q = _matching(sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status), jobs, study=study,
                      device=device)
        out = dict.fromkeys(JOB_STATUSES, 0)
        with self._tx("counting jobs") as conn:
            for status, n in conn.execute(q):
                out[status] = int(n)
        return out

    def results(self, *, study: str | None = None, device: str | None = None) -> list[ValidationRecord]:
        """Validation results, oldest first, optionally of one study and device (rows that cannot be
        decoded are left out, with a warning once per row)."""
        q = _matching(sa.select(results).order_by(results.c.id), results, study=study, device=device)
        with self._tx("reading results") as conn:
            rows = conn.execute(q).all()
        return self._decoded(rows, ValidationRecord, "result")

    # ------------------------------------------------------------------ path choices
    def path_choice(self, study: str, device: str) -> dict[str, Any] | None:
        """The stored path choice of ``study`` on ``device`` (:meth:`PathChoice.to_dict`'s JSON), or ``None``."""
        q = sa.select(path_choices.c.state_json).where(path_choices.c.study == study, path_choices.c.device == device)
        with self._tx("reading the path choice") as conn:
            row = conn.execute(q).first()
        state = None if row is None else loads_json(row.state_json, f"path choice of {study!r} on {device!r}",
                                                    ValidationError)
        if state is not None and not isinstance(state, dict):
            raise ValidationError(f"the stored path choice of {study!r} on {device!r} is not a JSON object")
        return state

    def save_path_choice(self, study: str, device: str, state: Mapping[str, Any]) -> None:
        """Store the path choice of ``study`` on ``device`` (JSON; replaces the previous one)."""
        text = _dumps(dict(state), "path choice")
        where = (path_choices.c.study == study, path_choices.c.device == device)
        with self._tx("writing the path choice") as conn:
            conn.execute(sa.delete(path_choices).where(*where))
            conn.execute(sa.insert(path_choices).values(study=study, device=device, state_json=text,
                                                        updated_at=_now(conn)))
