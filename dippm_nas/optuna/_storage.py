"""An Optuna RDB storage set up for the cost model's many small writes, and the URL of a study's storage."""

from __future__ import annotations

from typing import Any

import optuna

from dippm_nas._redact import scrub
from dippm_nas._sql import parse_url, redact, sqlite_connect_listener, storage_url_of
from dippm_nas.errors import DippmNasError, InvalidValueError, MissingDependencyError

__all__ = ["rdb_storage", "storage_url_of", "threads_share_storage", "is_sqlite_file"]


def rdb_storage(url: str, *, heartbeat_interval: int | None = None, grace_period: int | None = None,
                **engine_kwargs: Any) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage; for SQLite, set up for many writes from several processes.

    Every user attribute and constraint the cost model records is a database write. Optuna's default
    SQLite set-up (rollback journal, a sync to disk per commit, 5 s lock timeout) makes each one cost
    5-30 ms and lets concurrent processes fail with "database is locked". For a SQLite URL each
    connection here gets the settings of the conversion cache and the validation queue instead
    (:mod:`dippm_nas._sql`): a 30 s busy timeout, the WAL journal (readers never block the writer)
    and ``synchronous=NORMAL`` (no sync per commit; a power cut may lose the last commits, never
    corrupt the file). Every transaction also begins ``IMMEDIATE`` (takes the write lock at its start): Optuna
    reads a trial's state and then writes it (``SELECT ... FOR UPDATE``, which SQLite ignores), so without it two
    threads of ``study.optimize(n_jobs=...)`` can both take the same trial queued by ``study.enqueue_trial``, run
    it twice and stop the study with ``UpdateFinishedTrialError`` while another queued trial stays ``WAITING``.
    Measured on a loaded 2-core machine: 17.7 ms per user attribute with Optuna's
    default, 1.7 ms with these. WAL needs a local file system. Other URLs (PostgreSQL...) get
    ``pool_pre_ping``.

    Args:
        url: a SQLAlchemy URL, e.g. ``sqlite:///study.db`` or ``postgresql+psycopg2://user:pw@host/db``.
        heartbeat_interval: Optuna's trial heartbeat, seconds (``RDBStorage(heartbeat_interval=...)``): a
            running trial's heartbeat is stamped with the database's clock this often, and a trial whose
            heartbeat is older than ``grace_period`` is failed by the next trial started (a worker that
            died). ``None`` (default): no heartbeat.
        grace_period: seconds without a heartbeat before a trial counts as dead (Optuna's default: twice
            ``heartbeat_interval``).
        **engine_kwargs: passed to ``sqlalchemy.create_engine`` through ``RDBStorage(engine_kwargs=...)``.

    Returns:
        An ``optuna.storages.RDBStorage`` to pass as ``storage=``.

    Raises:
        InvalidValueError: ``heartbeat_interval`` or ``grace_period`` is not a positive int or None, or ``url`` is
            not a valid URL (a port that is not a number included) or names an unknown database dialect; the
            message names the URL with its password masked.
        MissingDependencyError: the URL's database driver is not installed (with the install hint).
        DippmNasError: the database cannot be opened (the server does not answer, the login is refused).
    """
    from sqlalchemy import event, exc

    for name, v in (("heartbeat_interval", heartbeat_interval), ("grace_period", grace_period)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidValueError(f"{name} must be a positive int (seconds) or None, got {v!r}")
    parsed = parse_url(url, what="Optuna storage", error=InvalidValueError,
                       example="'sqlite:////path/study.db' or 'postgresql+psycopg2://user@host/db'")
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if not is_sqlite:
        engine_kwargs.setdefault("pool_pre_ping", True)
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs or None,
                                             heartbeat_interval=heartbeat_interval, grace_period=grace_period)
    except ImportError as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        raise MissingDependencyError(
            f"the Optuna storage {redact(parsed)!r} needs a database driver that is not installed "
            f"({scrub(str(cause), url)}); for PostgreSQL install it with: pip install 'dippm-nas[postgres]'") from e
    except (exc.ArgumentError, ValueError, TypeError) as e:
        raise InvalidValueError(f"invalid Optuna storage URL {redact(parsed)!r}: {scrub(str(e), url)}") from e
    except exc.SQLAlchemyError as e:  # the server does not answer, refuses the login...
        raise DippmNasError(f"cannot open the Optuna storage {redact(parsed)!r}: {scrub(str(e), url)}") from e
    if is_sqlite:
        listener = sqlite_connect_listener(
            what="Optuna storage", local_hint="Keep the study's SQLite file on a local disk."
        )
        event.listen(storage.engine, "connect", listener)
        event.listen(storage.engine, "connect", _driver_leaves_transactions_to_us)
        event.listen(storage.engine, "begin", _begin_immediate)
        storage.engine.dispose()  # connections opened while Optuna created its tables get the settings too
    return storage


def _driver_leaves_transactions_to_us(dbapi_conn: Any, _record: Any) -> None:
    """The ``sqlite3`` driver begins no transaction of its own (it would begin one ``DEFERRED`` at the first
    write, after the reads it must protect); :func:`_begin_immediate` begins each."""
    dbapi_conn.isolation_level = None


def _begin_immediate(conn: Any) -> None:
    """Begin every transaction with the write lock, so that a read-then-write of Optuna is atomic."""
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def is_sqlite_file(url: str) -> bool:
    """Whether ``url`` is a SQLAlchemy URL of a SQLite file (not an in-memory database; ``False`` for a URL that
    does not parse: Optuna reports it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return False
    return u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:") \
        and u.query.get("mode") != "memory"


def threads_share_storage(study: Any) -> bool:
    """Whether another thread of this process sees the study's storage: ``False`` for an in-memory SQLite
    database (``sqlite://``), which SQLAlchemy gives each thread afresh; ``True`` for every other storage (a
    SQLite file, a database server, Optuna's in-memory and journal storages)."""
    url = storage_url_of(study)
    if url is None:
        return True
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return not (u.get_backend_name() == "sqlite" and (u.database in (None, "", ":memory:")
                                                      or u.query.get("mode") == "memory"))
