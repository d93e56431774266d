"""The conversion cache: captured :class:`OperatorGraph` objects stored in SQL, keyed by the caller's key.

One table, ``dippm_conversion_cache``, one row per key. A row holds the graph as zlib-compressed JSON
(:meth:`OperatorGraph.to_json`; never pickle) plus ``structural_hash``, ``size_bytes`` (of the compressed
payload), ``created_at`` / ``last_used_at`` (Unix seconds), ``format_version`` (the graph JSON layout)
and ``dippm_nas_version`` (the writer).

Backends: a SQLite file by default (WAL journal, 30 s busy timeout, so several processes on one
machine share it), or any SQLAlchemy URL, e.g. ``postgresql+psycopg2://user@host/db`` when many
machines share one cache. Writes are idempotent upserts (``INSERT ... ON CONFLICT DO UPDATE`` on SQLite
and PostgreSQL, ``ON DUPLICATE KEY UPDATE`` on MySQL, insert-then-update on anything else), so
processes racing on one key all succeed and leave one valid row.

Reads that hit are fast: a decoded graph is kept in an in-process LRU (bounded by an estimate of its
memory), and each hit returns a fresh :class:`OperatorGraph` whose lists and dicts are new but whose
:class:`OpNode` records are shared between the graphs returned for one key. ``OpNode`` is a frozen
dataclass and its ``attrs`` is typed ``Mapping`` (read-only): do not mutate ``node.attrs`` in place,
replace the node instead. The ``last_used_at`` stamps that drive eviction are written in batches (at
most once per ``touch_interval_s``), never on every hit.

Every payload is bound to its key. It starts with a small envelope, ``DPMC`` + envelope version + flags +
the key it was written under (+ an HMAC-SHA256 signature when a secret is set), then the zlib stream, whose
first line binds the graph to its key and structural hash again, inside the compressed data. On read the
envelope's key and the binding line's must be the row's key, and the binding line's hash and the graph's own
structural hash the row's ``structural_hash``, so a row holding another model's graph (copied by hand, by a
bug, or by another writer of a shared database) is never served as this model's; serving one takes a new
zlib stream, not a row edit. A stream is inflated to at most ``MAX_GRAPH_JSON_BYTES`` (64 MiB): one that
inflates further is a corrupt row, and :meth:`ConversionCache.put` keeps a larger graph in its process only.

For shared databases, ``$DIPPM_NAS_CACHE_SECRET`` (or ``ConversionCache(secret=...)``) signs every row
written and rejects, on read, rows without a signature and rows signed with another secret: only writers
that know the secret can put a graph another process will trust. Without a secret, rows are not signed
and signatures are not checked (the key binding still is).

A row that cannot be read back (a payload that is not a BLOB, no envelope or another key in it, a bad or
missing signature, a bad or oversized zlib stream, a binding line of another key or graph, bad JSON, another
graph format version, a graph that fails :meth:`OperatorGraph.validate` or whose structural hash is not the
row's) is logged once per key, deleted, and reported as a miss so the caller recomputes it.

A SQLite file that is not a database (truncated, overwritten) is moved aside to
``<file>.corrupt-<unix time>-<pid>`` with a warning, and a new one is started; a cache that cannot be
opened at all (a read-only or missing directory, a server that does not answer) raises
:class:`CacheError`, which :func:`dippm_nas.capture` turns into one warning and an uncached capture.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects import mysql as _mysql
from sqlalchemy.engine import URL, Connection

from dippm_nas._logging import WarnOnce
from dippm_nas._paths import CACHE_DIR_ENV, CACHE_URL_ENV, SQLITE_FILE_NAME, cache_dir, default_cache_url
from dippm_nas._sql import SqlStore, parse_url
from dippm_nas.cache._damaged import move_aside_if_not_a_database
from dippm_nas.cache._lru import GraphLru
from dippm_nas.cache._rows import (_MAX_KEY_CHARS, CACHE_SECRET_ENV, COLUMNS, MAX_GRAPH_JSON_BYTES, TABLE_NAME,
                                   _CorruptRow, _decode, _pack, _secret_bytes)
from dippm_nas.errors import CacheError
from dippm_nas.graph import GRAPH_FORMAT_VERSION, OperatorGraph

__all__ = ["ConversionCache", "default_cache", "set_default_cache", "TABLE_NAME", "CACHE_TABLE", "CACHE_SECRET_ENV",
           "fresh_copy"]

logger = logging.getLogger(__name__)

#: Eviction deletes least-recently-used rows until the total is at most this fraction of ``max_bytes``.
_EVICT_TO_FRACTION = 0.9
#: Rows deleted per DELETE ... WHERE key IN (...) statement (keeps under bound-parameter limits).
_DELETE_CHUNK = 500

_metadata = sa.MetaData()
_KEY, _PAYLOAD, _HASH, _SIZE, _CREATED, _USED, _FORMAT, _WRITER = COLUMNS
_table = sa.Table(
    TABLE_NAME,
    _metadata,
    sa.Column(_KEY, sa.String(_MAX_KEY_CHARS), primary_key=True),
    sa.Column(_PAYLOAD, sa.LargeBinary().with_variant(_mysql.LONGBLOB(), "mysql"), nullable=False),
    sa.Column(_HASH, sa.String(64), nullable=False),
    sa.Column(_SIZE, sa.BigInteger, nullable=False),
    sa.Column(_CREATED, sa.Double, nullable=False),
    sa.Column(_USED, sa.Double, nullable=False),
    sa.Column(_FORMAT, sa.Integer, nullable=False),
    sa.Column(_WRITER, sa.String(64), nullable=False),
    # Covers both the eviction order and SUM(size_bytes), so neither reads the payloads.
    sa.Index(f"ix_{TABLE_NAME}_lru", _USED, _SIZE),
)
#: The conversion cache's table (one row per key).
CACHE_TABLE = _table
_UPDATABLE = tuple(c.name for c in _table.columns if c.name != "key")

_warn_once = WarnOnce(logger)

#: Seconds :func:`default_cache` waits before trying again to open a default cache that failed to open.
_REOPEN_AFTER_S = 60.0


def _now() -> float:
    """Unix time in seconds (a function so tests can step the clock)."""
    return time.time()


_version: str | None = None


def _dippm_nas_version() -> str:
    global _version
    if _version is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            _version = version("dippm-nas")
        except PackageNotFoundError:
            _version = "unknown"
    return _version


def fresh_copy(template: OperatorGraph) -> OperatorGraph:
    """A new graph equal to ``template``: new containers, shared frozen :class:`OpNode` records, and the
    template's structural hash (the template is never handed out, so its hash stays true; a hit is
    otherwise re-hashed on every ``predict``)."""
    g = OperatorGraph(
        nodes=list(template.nodes),
        edges=list(template.edges),
        input_consumers={k: list(v) for k, v in template.input_consumers.items()},
        outputs=list(template.outputs),
        spec=template.spec,
        param_count=template.param_count,
        param_bytes=template.param_bytes,
        mode=template.mode,
        source=template.source,
        convert_seconds=template.convert_seconds,
        model_key=template.model_key,
    )
    g._hash = template.structural_hash()
    return g


_live_caches: "weakref.WeakSet[ConversionCache]" = weakref.WeakSet()


@atexit.register
def _flush_all_at_exit() -> None:
    for cache in list(_live_caches):
        try:
            cache._flush_touches()
        except Exception as e:  # noqa: BLE001 -- interpreter shutdown: report, never raise
            logger.debug("conversion cache: could not write last-used stamps at exit: %s", e)


class ConversionCache(SqlStore):
    """A SQL store of captured operator graphs, shared by processes (and machines, with a server URL); a
    :class:`~dippm_nas._sql.SqlStore`.

    Args:
        url: a SQLAlchemy URL. ``None`` (default) uses ``$DIPPM_NAS_CACHE_URL`` when set, else the SQLite
            file ``<cache_dir>/conversion.sqlite`` (see :func:`dippm_nas.cache.cache_dir`).
        max_bytes: bound on the summed compressed payloads, in bytes; after a :meth:`put` that
            exceeds it, least-recently-used rows are deleted until the total is at most 90 % of it.
            Default 2 GiB.
        memory_bytes: bound on the in-process LRU of decoded graphs, in (estimated) bytes of Python
            objects; ``0`` turns it off so every :meth:`get` reads the database. Default 64 MiB.
        touch_interval_s: ``last_used_at`` stamps of hits are written in one batch at most this often,
            in seconds (and at :meth:`put`, :meth:`close` and interpreter exit). Default 60.
        secret: signs every row written (HMAC-SHA256) and rejects, on read, rows that are unsigned or
            signed with another secret (see the module docstring). ``None`` (default) reads
            ``$DIPPM_NAS_CACHE_SECRET``; ``""`` turns signing off.

    Raises:
        CacheError: an invalid URL or bound, or a database that cannot be opened (a SQLite file that is
            not a database is moved aside and replaced, with a warning, instead).
        MissingDependencyError: the URL's database driver is not installed.

    Example::

        with ConversionCache() as cache:
            graph = cache.get(key)
            if graph is None:
                graph = convert(model)
                cache.put(key, graph)
    """

    what = "conversion cache"
    error = CacheError

    def __init__(
        self,
        url: str | None = None,
        *,
        max_bytes: int = 2 * 1024**3,
        memory_bytes: int = 64 * 1024**2,
        touch_interval_s: float = 60.0,
        secret: str | bytes | None = None,
    ) -> None:
        for name, value, least in (("max_bytes", max_bytes, 1), ("memory_bytes", memory_bytes, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise CacheError(f"{name} must be an int >= {least}, got {value!r}")
        t = touch_interval_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise CacheError(f"touch_interval_s must be a number >= 0, got {t!r}")
        self.max_bytes = max_bytes
        self.touch_interval_s = float(touch_interval_s)
        self._secret = _secret_bytes(secret)

        if url is None:
            url = os.environ.get(CACHE_URL_ENV, "") or None
        if url is None:
            # Built from parts: a directory name with '?' or '#' must not be parsed as a URL query.
            parsed = URL.create("sqlite", database=str(cache_dir() / SQLITE_FILE_NAME))
        else:
            parsed = parse_url(url, what=self.what, error=CacheError, none_ok=True,
                               example="'sqlite:////path/cache.sqlite' or 'postgresql+psycopg2://user@host/dbname'")
        self._open(parsed, dir_hint=f"set {CACHE_DIR_ENV} to a writable directory",
                   local_hint=f"Set {CACHE_DIR_ENV} to a local directory.")
        self._dialect = self._engine.dialect.name
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        #: the graphs decoded or stored in this process (:mod:`dippm_nas.cache._lru`)
        self._memory = GraphLru(memory_bytes)
        self._pending_touch: dict[str, float] = {}
        self._last_flush = _now()
        self._counts = {"hits": 0, "memory_hits": 0, "misses": 0, "puts": 0, "corrupt": 0, "evicted": 0}
        try:
            try:
                self._create_tables(_metadata, [TABLE_NAME])
            except CacheError as e:
                if not move_aside_if_not_a_database(self._url, e):
                    raise
                self._engine.dispose()
                self._engine = self._make_engine()
                self._create_tables(_metadata, [TABLE_NAME])
        except BaseException:
            self._engine.dispose()
            raise
        _live_caches.add(self)

    # ------------------------------------------------------------------ plumbing
    def __repr__(self) -> str:
        return f"ConversionCache(url={self.url!r}, max_bytes={self.max_bytes})"

    def _ensure_process(self) -> None:
        """After a fork, drop the parent's connections (without closing them) and start fresh counters."""
        pid = os.getpid()
        if pid != self._pid:
            self._engine.dispose(close=False)
            self._lock = threading.Lock()
            self._pid = pid
            self._pending_touch = {}
            self._counts = dict.fromkeys(self._counts, 0)

    @contextmanager
    def _tx(self, doing: str, *, write: bool = True) -> Iterator[Connection]:
        """:meth:`SqlStore._tx` of an open cache, with this process's own connections (after a fork)."""
        if self._closed:
            raise CacheError(f"the conversion cache {self.url!r} is closed; open a new ConversionCache")
        self._ensure_process()
        with super()._tx(doing, write=write) as conn:
            yield conn

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key or len(key) > _MAX_KEY_CHARS:
            raise CacheError(f"key must be a non-empty str of at most {_MAX_KEY_CHARS} characters, got {key!r}")

    def _flush_touches(self) -> None:
        """Write the pending ``last_used_at`` stamps in one transaction."""
        if self._closed or not self._pending_touch:
            return
        self._ensure_process()
        with self._lock:
            pending, self._pending_touch = self._pending_touch, {}
            self._last_flush = _now()
        if not pending:
            return
        stmt = (
            sa.update(_table)
            .where(_table.c.key == sa.bindparam("k"), _table.c.last_used_at < sa.bindparam("t"))
            .values(last_used_at=sa.bindparam("t"))
        )
        with self._tx("writing last-used stamps") as conn:
            conn.execute(stmt, [{"k": k, "t": t} for k, t in pending.items()])

    def _touch(self, key: str, now: float) -> None:
        with self._lock:
            self._pending_touch[key] = now
            due = now - self._last_flush >= self.touch_interval_s
        if due:
            try:
                self._flush_touches()
            except CacheError as e:  # a stamp is advisory; the hit itself is good
                _warn_once("touch", "conversion cache: could not write last-used stamps (%s); LRU order may lag", e)

    # ------------------------------------------------------------------ public
    def get(self, key: str) -> OperatorGraph | None:
        """The graph stored under ``key``, or ``None`` on a miss.

        Each hit returns a new :class:`OperatorGraph` equal to the one stored (same ``to_dict()``);
        changing its lists does not change the cache. The hit carries the stored graph's
        :meth:`~OperatorGraph.structural_hash` (computed once per stored graph, not per hit), so, as with
        any graph whose hash was read, edit a ``from_dict(to_dict())`` copy rather than the hit itself.
        A row that cannot be read back, or that is not bound to ``key`` (another key in its envelope, a
        structural hash that is not the row's, a missing or foreign signature when a secret is set), is
        logged once, deleted, and reported as ``None`` so the caller recomputes it.

        Args:
            key: the caller's key (at most 255 characters).

        Raises:
            CacheError: an invalid key, a closed cache, or a database error.
        """
        self._check_key(key)
        if self._closed:
            raise CacheError(f"the conversion cache {self.url!r} is closed; open a new ConversionCache")
        self._ensure_process()
        now = _now()
        with self._lock:
            kept = self._memory.get(key)
            if kept is not None:
                self._counts["hits"] += 1
                self._counts["memory_hits"] += 1
        if kept is not None:
            self._touch(key, now)
            return fresh_copy(kept)

        stmt = (sa.select(_table.c.payload, _table.c.structural_hash, _table.c.format_version, _table.c.created_at)
                .where(_table.c.key == key))
        with self._tx("reading a graph", write=False) as conn:
            row = conn.execute(stmt).first()
        if row is None:
            with self._lock:
                self._counts["misses"] += 1
            return None
        try:
            graph, json_chars = _decode(key, row.payload, row.structural_hash, row.format_version, self._secret)
        except _CorruptRow as e:
            _warn_once(
                f"corrupt:{key}",
                "conversion cache %s: the row for key %r is unusable because %s; deleting it so the graph "
                "is captured again",
                self.url, key, e,
            )
            with self._tx("deleting a corrupt row") as conn:
                conn.execute(sa.delete(_table).where(_table.c.key == key, _table.c.created_at == row.created_at))
            with self._lock:
                self._counts["misses"] += 1
                self._counts["corrupt"] += 1
            return None
        with self._lock:
            self._memory.remember(key, graph, json_chars)
            self._counts["hits"] += 1
        self._touch(key, now)
        return fresh_copy(graph)

    def put(self, key: str, graph: OperatorGraph) -> None:
        """Store ``graph`` under ``key`` (an idempotent upsert), then evict if over ``max_bytes``.

        Several processes may put the same key at once; all succeed and one valid row remains.
        The graph is validated first; later changes to ``graph`` do not reach the cache. The row is
        bound to ``key`` (and signed, with a secret).

        Args:
            key: the caller's key (at most 255 characters).
            graph: the graph to store.

        Raises:
            CacheError: an invalid key or graph type, a closed cache, or a database error.
            GraphValidationError: ``graph`` breaks an :class:`OperatorGraph` invariant.
        """
        self._check_key(key)
        if self._closed:
            raise CacheError(f"the conversion cache {self.url!r} is closed; open a new ConversionCache")
        self._ensure_process()
        if not isinstance(graph, OperatorGraph):
            raise CacheError(f"put() stores an OperatorGraph, got {type(graph).__name__}")
        graph.validate()
        text = graph.to_json().encode()
        # What get() would return: the JSON round trip (tuples in attrs become lists, and so on).
        template = OperatorGraph.from_json(text)
        # From the private copy: caching the hash on the caller's graph would go stale if they mutate it.
        shash = template.structural_hash()
        with self._lock:
            self._memory.remember(key, template, len(text))
        if len(text) > MAX_GRAPH_JSON_BYTES:
            _warn_once(
                f"too-big-json:{key}",
                "conversion cache %s: graph %r is %d bytes of JSON, more than MAX_GRAPH_JSON_BYTES=%d (the most a "
                "read inflates); kept in this process only, not stored",
                self.url, key, len(text), MAX_GRAPH_JSON_BYTES,
            )
            return
        payload = _pack(key, shash, GRAPH_FORMAT_VERSION, text, self._secret)
        if len(payload) > self.max_bytes:
            _warn_once(
                f"too-big:{key}",
                "conversion cache %s: graph %r is %d bytes compressed, more than max_bytes=%d; kept in "
                "this process only, not stored",
                self.url, key, len(payload), self.max_bytes,
            )
            return
        now = _now()
        values = {
            "key": key,
            "payload": payload,
            "structural_hash": shash,
            "size_bytes": len(payload),
            "created_at": now,
            "last_used_at": now,
            "format_version": GRAPH_FORMAT_VERSION,
            "dippm_nas_version": _dippm_nas_version(),
        }
        self._upsert(values)
        with self._lock:
            self._pending_touch.pop(key, None)
            self._counts["puts"] += 1
        self._flush_touches()  # so eviction sees this process's recent hits
        self._evict(keep=key)

    def _upsert(self, values: dict[str, Any]) -> None:
        dialect = self._dialect
        insert = self._insert_on_conflict(_table, dialect)
        if insert is not None:
            stmt = insert.values(values)
            stmt = stmt.on_conflict_do_update(
                index_elements=[_table.c.key], set_={c: stmt.excluded[c] for c in _UPDATABLE}
            )
            with self._tx("writing a graph") as conn:
                conn.execute(stmt)
            return
        if dialect in ("mysql", "mariadb"):
            stmt = _mysql.insert(_table).values(values)
            stmt = stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in _UPDATABLE})
            with self._tx("writing a graph") as conn:
                conn.execute(stmt)
            return
        self._upsert_generic(values)

    def _upsert_generic(self, values: dict[str, Any]) -> None:
        """Insert, or update when the key exists; retried when a racing process deletes the row in between."""
        insert = sa.insert(_table).values(values)
        update = sa.update(_table).where(_table.c.key == values["key"]).values({c: values[c] for c in _UPDATABLE})
        for _ in range(3):
            try:
                with self._tx("inserting a graph") as conn:
                    conn.execute(insert)
                return
            except CacheError as e:
                if not isinstance(e.__cause__, exc.IntegrityError):
                    raise
            # The key exists: another writer (or an earlier put) was first.
            with self._tx("updating a graph") as conn:
                if conn.execute(update).rowcount:
                    return
        raise CacheError(
            f"conversion cache {self.url!r}: could not write key {values['key']!r}: the row kept "
            "disappearing between insert and update (3 attempts)"
        )

    def _evict(self, keep: str) -> None:
        """Delete least-recently-used rows (never ``keep``) until the total is <= 90 % of ``max_bytes``."""
        total_stmt = sa.select(sa.func.coalesce(sa.func.sum(_table.c.size_bytes), 0))
        with self._tx("measuring the cache size", write=False) as conn:
            total = int(conn.execute(total_stmt).scalar_one())
        if total <= self.max_bytes:
            return
        target = int(self.max_bytes * _EVICT_TO_FRACTION)
        order = sa.select(_table.c.key, _table.c.size_bytes).order_by(_table.c.last_used_at, _table.c.key)
        victims: list[str] = []
        with self._tx("choosing rows to evict", write=False) as conn:
            for k, size in conn.execution_options(yield_per=1000).execute(order):
                if total <= target:
                    break
                if k == keep:
                    continue
                victims.append(k)
                total -= int(size)
        with self._tx("evicting rows") as conn:
            for i in range(0, len(victims), _DELETE_CHUNK):
                conn.execute(sa.delete(_table).where(_table.c.key.in_(victims[i : i + _DELETE_CHUNK])))
        with self._lock:
            for k in victims:
                self._memory.forget(k)
                self._pending_touch.pop(k, None)
            self._counts["evicted"] += len(victims)
        logger.debug("conversion cache %s: evicted %d least-recently-used rows", self.url, len(victims))

    def stats(self) -> dict[str, Any]:
        """Rows and bytes in the database, and this process's counters.

        Returns:
            ``{"url", "rows", "bytes", "max_bytes", "hits", "memory_hits", "misses", "puts",
            "corrupt", "evicted"}``; ``bytes`` sums the compressed payloads, ``hits`` includes
            ``memory_hits`` (served from the in-process LRU); the counters start at zero in each process.
        """
        stmt = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(_table.c.size_bytes), 0)).select_from(_table)
        with self._tx("counting rows", write=False) as conn:
            rows, size = conn.execute(stmt).one()
        with self._lock:
            counts = dict(self._counts)
        return {"url": self.url, "rows": int(rows), "bytes": int(size), "max_bytes": self.max_bytes, **counts}

    def clear(self) -> None:
        """Delete every row (for every process sharing the database) and this process's memory."""
        with self._tx("clearing") as conn:
            conn.execute(sa.delete(_table))
        with self._lock:
            self._memory.clear()
            self._pending_touch.clear()

    def close(self) -> None:
        """Write pending last-used stamps and release the connections; idempotent."""
        if self._closed:
            return
        try:
            self._flush_touches()
        except CacheError as e:  # stamps are advisory; closing must still release the connections
            _warn_once("close", "conversion cache: could not write last-used stamps on close (%s)", e)
        finally:
            self._closed = True
            _live_caches.discard(self)
            if os.getpid() == self._pid:
                self._engine.dispose()
            else:
                self._engine.dispose(close=False)
            self._memory.clear()

    @property
    def memory_bytes(self) -> int:
        """The bound on the in-process LRU of decoded graphs, estimated bytes (``0``: none kept)."""
        return self._memory.memory_bytes

    @property
    def closed(self) -> bool:
        return self._closed


# ---------------------------------------------------------------------- default
_default_lock = threading.Lock()
_default: ConversionCache | None = None
_default_explicit = False
_default_url = ""
#: (url, time.monotonic() of the failure, the error) of the last default cache that could not be opened
_default_failed: tuple[str, float, CacheError] | None = None


def default_cache() -> ConversionCache:
    """The process-wide cache ``capture()`` uses.

    The one set with :func:`set_default_cache`, else a :class:`ConversionCache` at
    :func:`dippm_nas.cache.default_cache_url` (``$DIPPM_NAS_CACHE_URL`` or the SQLite file in
    :func:`dippm_nas.cache.cache_dir`). It is reopened when those environment variables change; a
    forked worker gets fresh connections of its own (the cache drops inherited ones on first use).

    Raises:
        CacheError: the database cannot be opened (the same error again, without a new attempt, for
            60 s after a failure, so a search does not wait on a dead server at every trial).
    """
    global _default, _default_url, _default_failed
    cache = _default
    if cache is not None and _default_explicit:
        return cache
    url = default_cache_url()
    if cache is not None and url == _default_url and not cache.closed:
        return cache
    with _default_lock:
        if _default is not None and _default_explicit:
            return _default
        if _default is None or url != _default_url or _default.closed:
            failed = _default_failed
            if failed is not None and failed[0] == url and time.monotonic() - failed[1] < _REOPEN_AFTER_S:
                raise failed[2]
            old = _default
            try:
                _default = ConversionCache(None)
            except CacheError as e:
                _default_failed = (url, time.monotonic(), e)
                _default = None
                raise
            _default_failed = None
            _default_url = url
            if old is not None and not old.closed:
                try:  # others may still hold ``old``: write its stamps, do not close it under them
                    old._flush_touches()
                except CacheError as e:
                    logger.debug("conversion cache: could not flush the previous default cache: %s", e)
        return _default


def set_default_cache(cache: ConversionCache | None) -> None:
    """Make ``cache`` the one :func:`default_cache` returns; ``None`` goes back to the environment's.

    Raises:
        CacheError: ``cache`` is neither a :class:`ConversionCache` nor ``None``.
    """
    global _default, _default_explicit, _default_url, _default_failed
    if cache is not None and not isinstance(cache, ConversionCache):
        raise CacheError(f"set_default_cache() takes a ConversionCache or None, got {type(cache).__name__}")
    with _default_lock:
        _default_failed = None
        _default = cache
        _default_explicit = cache is not None
        _default_url = ""
