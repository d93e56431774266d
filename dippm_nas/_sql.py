"""SQLAlchemy engine set-up shared by every dippm-nas SQL store.

The conversion cache, the validation queue, the dataset store and the Optuna storage of
:func:`dippm_nas.optuna.rdb_storage` open their databases the same way:

- SQLite: a busy timeout (so a writer waits for another process's lock instead of failing with
  "database is locked"), the WAL journal (readers never block the writer), ``synchronous=NORMAL``
  (no sync per commit; a power cut may lose the last commits, never corrupt the file) and, where a
  store asks for it, ``foreign_keys=ON``; an in-memory database shares one connection;
- anything else (PostgreSQL, MySQL...): ``pool_pre_ping``, so a connection the server dropped is
  replaced instead of failing the next statement.

Errors name the store (``what``) and are raised as the caller's :class:`~dippm_nas.errors.DippmNasError`
subclass, so each store keeps its own exception type and its messages. :func:`transaction` is the one
transaction helper of the stores, :func:`create_tables` their one table creation (safe when two processes
create the same tables at once).

:class:`SqlStore` is the base of the stores (the conversion cache, the dataset file, the validation queue):
it parses the URL, makes the engine as above, runs every statement in :meth:`SqlStore._tx` (SQLAlchemy errors
become the store's exception, naming the store, its URL and the operation), creates the tables, checks a
stored schema version and releases the connections. The adaptation store is one too (a prediction that reads an
adaptation from a SQLite file reads it with ``sqlite3``, without this module).

No message names a URL with its password: :attr:`SqlStore.url` and every error, warning and ``repr`` use
:func:`redact` (:mod:`dippm_nas._redact`), and an error of SQLAlchemy or of a driver quoted in a message is
scrubbed of the URL's secrets first.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects import postgresql as _postgresql
from sqlalchemy.dialects import sqlite as _sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from dippm_nas._json import loads_json
from dippm_nas._redact import redact_url, scrub
from dippm_nas.errors import DippmNasError, MissingDependencyError

__all__ = ["SQLITE_BUSY_TIMEOUT_S", "SqlStore", "create_tables", "make_engine", "parse_url", "redact",
           "sqlite_connect_listener", "storage_url_of", "transaction"]

logger = logging.getLogger(__name__)

#: Default SQLite busy timeout: how long a writer waits for another process's write lock, seconds.
SQLITE_BUSY_TIMEOUT_S = 30.0

#: A pool "connect" event listener: ``(dbapi_connection, connection_record) -> None``.
ConnectListener = Callable[[Any, Any], None]

#: The stores (``what``) already warned in this process that SQLite refused WAL.
_refused_wal: set[str] = set()
_refused_wal_lock = threading.Lock()


def storage_url_of(study: Any) -> str | None:
    """The SQLAlchemy URL of an Optuna study's RDB storage (also through Optuna's cached storage), ``None`` for
    other storages (in memory, journal)."""
    storage = getattr(study, "_storage", None)
    for obj in (storage, getattr(storage, "_backend", None)):
        url = getattr(obj, "url", None)
        if isinstance(url, str) and url:
            return url
    return None


def redact(url: URL | str) -> str:
    """``url`` as a string with any password (and secret query value) masked (``***``), safe for logs and error
    messages (:func:`dippm_nas._redact.redact_url`)."""
    return redact_url(url)


def _switch_to_wal(cur: Any, busy_timeout_s: float) -> str:
    """``PRAGMA journal_mode = WAL``, retried while another process holds the database.

    The switch needs an exclusive lock, and SQLite answers "database is locked" at once, without its
    busy handler, when two fresh connections deadlock on it (both read, both want to write); so
    back off and retry here, up to the busy timeout.
    """
    deadline = time.monotonic() + busy_timeout_s
    delay = 0.001
    while True:
        try:
            return str(cur.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as e:
            locked = "locked" in str(e) or "busy" in str(e)
            if not locked or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def sqlite_connect_listener(
    *,
    what: str,
    local_hint: str,
    busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S,
    foreign_keys: bool = False,
) -> ConnectListener:
    """The pool ``"connect"`` listener that sets up each new SQLite connection of one store.

    Per connection: the busy timeout first (so the WAL switch waits for other processes), the WAL
    journal, ``synchronous=NORMAL``, then ``foreign_keys=ON`` when asked. When SQLite refuses WAL (a
    network file system?) a warning naming ``what`` and ``local_hint`` is logged once per store.

    Args:
        what: the store, for the warning (``"conversion cache"``, ``"validation queue"``...).
        local_hint: a sentence telling the user how to move the file to a local disk.
        busy_timeout_s: the SQLite busy timeout, seconds.
        foreign_keys: also run ``PRAGMA foreign_keys = ON``.

    Returns:
        A function to pass to ``sqlalchemy.event.listen(engine, "connect", ...)``.
    """
    busy_ms = int(busy_timeout_s * 1000)

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            mode = str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode != "wal":
                mode = _switch_to_wal(cur, busy_timeout_s)
            if mode not in ("wal", "memory"):
                with _refused_wal_lock:
                    first = what not in _refused_wal
                    _refused_wal.add(what)
                if first:
                    logger.warning(
                        "%s: SQLite refused WAL journal mode (got %r; a network file system?); "
                        "concurrent processes will wait on each other more. %s",
                        what, mode, local_hint,
                    )
            # In WAL mode NORMAL cannot corrupt the database; a power cut may lose the last commits.
            cur.execute("PRAGMA synchronous = NORMAL")
            if foreign_keys:
                cur.execute("PRAGMA foreign_keys = ON")
        finally:
            cur.close()

    return on_connect


def make_engine(
    url: URL,
    *,
    what: str,
    error: type[DippmNasError],
    dir_hint: str,
    local_hint: str,
    busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S,
    foreign_keys: bool = False,
) -> Engine:
    """A SQLAlchemy engine for one dippm-nas store, set up as the module docstring describes.

    For a SQLite file the parent directory is created when missing.

    Args:
        url: the database URL.
        what: the store, named in every message (``"conversion cache"``, ``"validation queue"``...).
        error: the exception class for an invalid URL or a directory that cannot be created.
        dir_hint: what to do when the SQLite file's directory cannot be created (``"set X to a
            writable directory"``).
        local_hint: a sentence for the warning when SQLite refuses WAL (see :func:`sqlite_connect_listener`).
        busy_timeout_s: the SQLite busy timeout, seconds.
        foreign_keys: SQLite only: enforce foreign keys on every connection.

    Raises:
        error: an invalid URL, or a SQLite directory that cannot be created.
        MissingDependencyError: the URL's database driver is not installed.
    """
    backend = url.get_backend_name()
    try:
        if backend == "sqlite":
            database = url.database or ""
            in_memory = database in ("", ":memory:") or "mode=memory" in database
            if not in_memory and not database.startswith("file:"):
                parent = Path(database).expanduser().absolute().parent
                try:
                    parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise error(
                        f"cannot create the directory {str(parent)!r} of the {what} ({e}); {dir_hint}"
                    ) from e
            kwargs: dict[str, Any] = {
                "connect_args": {"check_same_thread": False, "timeout": busy_timeout_s},
            }
            if in_memory:  # one shared connection, else every connection sees its own empty database
                kwargs["poolclass"] = StaticPool
            engine = sa.create_engine(url, **kwargs)
            event.listen(engine, "connect", sqlite_connect_listener(
                what=what, local_hint=local_hint, busy_timeout_s=busy_timeout_s, foreign_keys=foreign_keys,
            ))
            return engine
        return sa.create_engine(url, pool_pre_ping=True)
    except DippmNasError:
        raise
    except ImportError as e:
        raise MissingDependencyError(
            f"the {what} URL {redact(url)!r} needs a database driver that is not installed "
            f"({scrub(str(e), url)}); for PostgreSQL install it with: pip install 'dippm-nas[postgres]'"
        ) from e
    except (exc.ArgumentError, ValueError, TypeError) as e:
        raise error(f"invalid {what} URL {redact(url)!r}: {scrub(str(e), url)}") from e


@contextmanager
def transaction(engine: Engine, *, write: bool = True, error: type[DippmNasError] | None = None,
                what: str = "", url: URL | str | None = None) -> Iterator[Connection]:
    """A connection of ``engine``: in a transaction committed on exit when ``write``, else a plain one.

    Args:
        engine: the store's engine.
        write: begin a transaction (commit on success, roll back on an exception).
        error: raise SQLAlchemy errors as this class, ``f"{what} failed: {e}"``, chained; ``None`` lets them
            through unchanged.
        what: the store and the operation, for the message (``"conversion cache 'sqlite:///x': get"``).
        url: the store's URL, whose secrets are masked in the message (:func:`~dippm_nas._redact.scrub`).
    """
    try:
        if write:
            with engine.begin() as conn:
                yield conn
        else:
            with engine.connect() as conn:
                yield conn
    except exc.SQLAlchemyError as e:
        if error is None:
            raise
        raise error(scrub(f"{what} failed: {e}", url)) from e


def create_tables(engine: Engine, metadata: sa.MetaData, tables: Sequence[str], *, error: type[DippmNasError],
                  what: str, url: URL | str | None = None) -> None:
    """``metadata.create_all`` in a transaction, safe when another process creates the same tables at once.

    The loser of such a race gets "already exists" (or a unique violation in PostgreSQL's catalogue); that
    is fine when every table of ``tables`` exists afterwards. SQLite commits each ``CREATE TABLE`` on its own
    (the driver opens no transaction around DDL), so the loser may see the winner's first table before its
    last: it then creates the missing ones itself, up to :data:`_CREATE_ATTEMPTS` times.

    Raises:
        error: ``f"cannot open the {what}: ..."`` (the secrets of ``url`` masked).
    """
    for attempt in range(1, _CREATE_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                metadata.create_all(conn, checkfirst=True)
            return
        except exc.DBAPIError as e:
            try:
                insp = sa.inspect(engine)
                ok = all(insp.has_table(t) for t in tables)
            except exc.SQLAlchemyError:
                ok = False
            if ok:
                logger.debug("%s: tables created concurrently by another process (%s)", what, e)
                return
            if attempt == _CREATE_ATTEMPTS:
                raise error(scrub(f"cannot open the {what}: {e}", url)) from e
            time.sleep(_CREATE_RETRY_S * attempt)
        except exc.SQLAlchemyError as e:
            raise error(scrub(f"cannot open the {what}: {e}", url)) from e


#: How often :func:`create_tables` tries when another process creates the same tables at the same moment, and
#: the pause before the second try, seconds (doubled before the third): a race lasts the few milliseconds
#: another process takes to create its tables.
_CREATE_ATTEMPTS = 3
_CREATE_RETRY_S = 0.05


def parse_url(url: object, *, what: str, error: type[DippmNasError], example: str, none_ok: bool = False) -> URL:
    """``url`` as a SQLAlchemy :class:`~sqlalchemy.engine.URL`, or the store's error.

    Args:
        url: a URL string or :class:`~sqlalchemy.engine.URL`.
        what: the store, for the message (``"conversion cache"``).
        error: the exception class of the store.
        example: URLs the store takes, for the message (``"'sqlite:////path/x.db' or 'postgresql+psycopg2://...'"``).
        none_ok: the store also takes ``None`` (its default URL), said in the message.

    Raises:
        error: ``url`` is not a non-empty string or URL, or it does not parse (a port that is not a number
            included); the message names the URL with its password masked.
    """
    if not isinstance(url, (str, URL)) or not str(url):
        shown = repr(redact(url)) if isinstance(url, (str, URL)) else f"{url!r:.200}"
        raise error(f"url must be a SQLAlchemy URL string{' or None' if none_ok else ''}, got {shown}")
    try:
        return make_url(url)
    except exc.ArgumentError as e:
        raise error(f"invalid {what} URL {redact(url)!r} ({scrub(str(e), url)}); expected e.g. {example}") from e
    except ValueError as e:  # make_url's int() of the port
        raise error(f"invalid {what} URL {redact(url)!r}: its port must be a number "
                    f"({scrub(str(e), url)}); expected e.g. {example}") from e


class SqlStore:
    """Base of the dippm-nas SQL stores: one engine, its transactions, its tables and its errors.

    A subclass sets :attr:`what` and :attr:`error`, calls :meth:`_open` in its ``__init__`` and then
    :meth:`_create_tables` (or its own schema check); every statement runs in :meth:`_tx`. Use it as a context
    manager or call :meth:`close`.
    """

    #: The store's name in messages (``"conversion cache"``).
    what: ClassVar[str] = "SQL store"
    #: The exception class every error of the store is raised as.
    error: ClassVar[type[DippmNasError]] = DippmNasError

    #: The URL with any password masked (``***``), safe for logs; see :meth:`url_with_credentials`.
    url: str
    _url: URL
    _engine: Engine

    def _open(self, url: URL, *, dir_hint: str, local_hint: str, busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S,
              foreign_keys: bool = False) -> None:
        """Keep ``url`` and make the store's engine (:func:`make_engine` with these arguments).

        Called when the store is being opened, before any table is touched.
        """
        self._url = url
        self.url = redact(url)
        self._engine_options: dict[str, Any] = {"dir_hint": dir_hint, "local_hint": local_hint,
                                                "busy_timeout_s": busy_timeout_s, "foreign_keys": foreign_keys}
        self._engine = self._make_engine()

    def _make_engine(self) -> Engine:
        """A new engine of the store's URL, set up as :meth:`_open` was asked to."""
        return make_engine(self._url, what=self.what, error=self.error, **self._engine_options)

    def _label(self) -> str:
        """The store as messages name it: ``"conversion cache 'sqlite:///x'"``."""
        return f"{self.what} {self.url!r}"

    @contextmanager
    def _tx(self, doing: str, *, write: bool = True) -> Iterator[Connection]:
        """A connection: in a transaction committed on exit when ``write``, else a plain one.

        Raises:
            error: a SQLAlchemy error, as ``"<what> '<url>': <doing> failed: <error>"``, chained.
        """
        with transaction(self._engine, write=write, error=self.error, what=f"{self._label()}: {doing}",
                         url=self._url) as conn:
            yield conn

    @staticmethod
    def _insert_on_conflict(table: sa.Table, dialect: str) -> Any | None:
        """``INSERT`` into ``table`` with ``ON CONFLICT`` clauses (``on_conflict_do_nothing``/``_do_update``) on
        SQLite and PostgreSQL (``dialect``, the engine's dialect name); ``None`` on other databases, whose callers
        insert, then update or skip."""
        if dialect == "sqlite":
            return _sqlite.insert(table)
        if dialect == "postgresql":
            return _postgresql.insert(table)
        return None

    def _create_tables(self, metadata: sa.MetaData, tables: Sequence[str]) -> None:
        """Create the store's missing tables (:func:`create_tables`; safe when processes race)."""
        create_tables(self._engine, metadata, tables, error=self.error, what=self._label(), url=self._url)

    def _check_schema_version(self, conn: Connection, meta: sa.Table, version: int,
                              created: dict[str, Any]) -> None:
        """Stamp a new store's key/value table ``meta`` with ``schema_version`` (and ``created``), or refuse a
        store of another version. Values are JSON text; ``conn`` is the transaction that created the tables.

        Raises:
            error: the store holds another ``schema_version`` (or one that is not JSON).
        """
        row = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
        if row is None:
            conn.execute(sa.insert(meta), [{"key": k, "value": json.dumps(v)}
                                           for k, v in {"schema_version": version, **created}.items()])
            return
        stored = loads_json(row.value, f"{self._label()}: schema_version", self.error)
        if stored != version:
            raise self.error(f"{self._label()} has schema_version {stored!r}; this dippm-nas reads "
                             f"schema_version {version} only")

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine of the store's database."""
        return self._engine

    def url_with_credentials(self) -> str:
        """The full URL, password included, for handing to worker processes; never log it (:attr:`url` is safe)."""
        return self._url.render_as_string(hide_password=False)

    def close(self) -> None:
        """Release the connections."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
