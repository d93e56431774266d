"""The adaptation store in any SQLAlchemy database: a :class:`~dippm_nas._sql.SqlStore` of two tables.

``dippm_adaptation_rows`` keeps every measured row fed to ``adapt`` (one row per call per graph, never
updated: two processes adapting one key at once each insert their own rows, so none is lost), and
``dippm_adaptation_versions`` every fitted :class:`~dippm_nas.predictor.Adaptation` of a key, numbered
1, 2, ... (the pair ``(key_digest, version)`` is unique: two processes saving at once get different numbers,
the second retries). Columns hold data only: JSON text, zlib-compressed graph JSON (read back to at most
:data:`~dippm_nas.cache.MAX_GRAPH_JSON_BYTES`) and the heads' arrays as an ``.npz``; every row and every version
carries its keyed checksum (:mod:`~dippm_nas.predictor._adapt_rows`). ``dippm_adaptation_meta`` holds the store's
``schema_version``: a store of another version is refused with an :class:`~dippm_nas.errors.AdaptationError`.

As every :class:`~dippm_nas._sql.SqlStore`, the store names its URL with the password masked in its ``repr``, its
warnings and its errors, and each error names the operation that failed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from dippm_nas._version import __version__
from dippm_nas._compress import deflate, inflate
from dippm_nas._json import loads_json
from dippm_nas._logging import WarnOnce
from dippm_nas._sql import SqlStore, parse_url
from dippm_nas.cache import MAX_GRAPH_JSON_BYTES
from dippm_nas.errors import AdaptationError, DippmNasError
from dippm_nas.graph import OperatorGraph
from dippm_nas.predictor._adapt_rows import (META_TABLE, ROWS_TABLE, SCHEMA_VERSION, VERSION_COLUMNS, VERSIONS_TABLE,
                                             StoredAdaptation, default_adapt_url, row_checksum, stored_adaptation,
                                             version_checksum)

__all__ = ["AdaptationStore", "graph_digest"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger)

#: Tries of a version insert that lost the race for its number.
_SAVE_TRIES = 20

_md = sa.MetaData()
_rows = sa.Table(
    ROWS_TABLE, _md,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key_digest", sa.String(64), nullable=False, index=True),
    sa.Column("key_json", sa.Text, nullable=False),
    sa.Column("graph_digest", sa.String(64), nullable=False),
    sa.Column("graph_json_z", sa.LargeBinary, nullable=False),
    sa.Column("labels_json", sa.Text, nullable=False),
    sa.Column("checksum", sa.String(64), nullable=False),
    sa.Column("writer", sa.String(255), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)
_versions = sa.Table(
    VERSIONS_TABLE, _md,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key_digest", sa.String(64), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("key_json", sa.Text, nullable=False),
    sa.Column("checkpoint_sha256", sa.String(64), nullable=False),
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("meta_json", sa.Text, nullable=False),
    sa.Column("arrays", sa.LargeBinary, nullable=False),
    sa.Column("checksum", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.UniqueConstraint("key_digest", "version", name=f"uq_{VERSIONS_TABLE}_key_version"),
)
_meta = sa.Table(
    META_TABLE, _md,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)


def graph_digest(graph_key: str) -> str:
    """SHA-256 of a row's graph key (what makes two rows one graph)."""
    return hashlib.sha256(graph_key.encode()).hexdigest()


def _labels(text: Any) -> dict[str, float]:
    """A row's labels: a JSON object of finite figures > 0."""
    d = loads_json(text, "labels_json", AdaptationError)
    if not isinstance(d, dict):
        raise AdaptationError(f"labels_json is a JSON {type(d).__name__}, not an object")
    out = {}
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise AdaptationError(f"labels_json[{k!r}] = {v!r} is not a finite number > 0")
        out[str(k)] = float(v)
    return out


class AdaptationStore(SqlStore):
    """The adaptation tables in one SQLAlchemy database (a :class:`~dippm_nas._sql.SqlStore`).

    Args:
        url: SQLAlchemy URL (a study's storage, ``sqlite:///file.db``, ``postgresql+psycopg2://...``); ``None``:
            :func:`~dippm_nas.predictor.default_adapt_url`.

    Raises:
        AdaptationError: an invalid URL (a port that is not a number included), a database that cannot be
            opened, or a store of another ``schema_version``.
        MissingDependencyError: the URL's database driver is not installed.
    """

    what = "adaptation store"
    error = AdaptationError

    def __init__(self, url: str | sa.engine.URL | None = None) -> None:
        self._open(parse_url(url or default_adapt_url(), what=self.what, error=AdaptationError, none_ok=True,
                             example="'sqlite:////path/adaptations.sqlite' or 'postgresql+psycopg2://user@host/db'"),
                   dir_hint="set DIPPM_NAS_CACHE_DIR to a writable directory",
                   local_hint="Keep the adaptation store's SQLite file on a local disk.")
        try:
            self._refuse_an_older_layout()
            self._create_tables(_md, [ROWS_TABLE, VERSIONS_TABLE, META_TABLE])
            self._stamp_schema_version()
        except BaseException:
            self._engine.dispose()
            raise

    def _refuse_an_older_layout(self) -> None:
        """Tables of a layout before ``schema_version`` existed (rows without checksums) are refused."""
        try:
            insp = sa.inspect(self._engine)
            old = insp.has_table(ROWS_TABLE) and "checksum" not in {c["name"] for c in insp.get_columns(ROWS_TABLE)}
        except sa.exc.SQLAlchemyError:
            return  # the table creation that follows reports what is wrong with the database
        if old:
            raise AdaptationError(
                f"{self._label()} holds tables {ROWS_TABLE!r} and {VERSIONS_TABLE!r} of an older layout (rows without "
                f"checksums); this dippm-nas reads schema_version {SCHEMA_VERSION} only: drop the two tables to "
                "start the store afresh, or pass another storage=")

    def _stamp_schema_version(self) -> None:
        """Stamp a new store with :data:`SCHEMA_VERSION`, or refuse another; two processes stamping at once
        both succeed."""
        for attempt in range(2):
            try:
                with self._tx("checking the schema version") as conn:
                    self._check_schema_version(conn, _meta, SCHEMA_VERSION, {"created_by": f"dippm-nas {__version__}"})
                return
            except AdaptationError as e:
                if attempt or not isinstance(e.__cause__, sa.exc.IntegrityError):
                    raise

    def __repr__(self) -> str:
        return f"AdaptationStore({self.url!r})"

    # ------------------------------------------------------------------ rows
    def add_rows(self, key_digest: str, key_json: str, rows: Sequence[tuple[OperatorGraph, str, Mapping[str, float]]]
                 ) -> int:
        """Insert measured rows ``(graph, graph key, {target: value})``, each with its checksum; returns how many."""
        if not rows:
            return 0
        writer = f"{socket.gethostname()}:{os.getpid()}"
        now = time.time()
        values = []
        for g, gk, y in rows:
            gd, blob, labels = graph_digest(gk), deflate(g.to_json().encode()), json.dumps(dict(y), sort_keys=True)
            values.append({"key_digest": key_digest, "key_json": key_json, "graph_digest": gd, "graph_json_z": blob,
                           "labels_json": labels, "checksum": row_checksum(key_digest, gd, blob, labels),
                           "writer": writer, "created_at": now})
        with self._tx("adding measured rows") as conn:
            conn.execute(_rows.insert(), values)
        return len(values)

    def rows(self, key_digest: str) -> list[tuple[OperatorGraph, dict[str, float]]]:
        """Every sound stored row of a key, oldest first (:meth:`rows_checked` without the count left out)."""
        return self.rows_checked(key_digest)[0]

    def rows_checked(self, key_digest: str) -> tuple[list[tuple[OperatorGraph, dict[str, float]]], int]:
        """Every stored row of a key, oldest first, and how many were left out: a row whose checksum is not the
        one of its contents under this key (edited, copied from another key, damaged), or that does not decode,
        is left out with a warning (once per row and process)."""
        q = sa.select(_rows.c.id, _rows.c.graph_digest, _rows.c.graph_json_z, _rows.c.labels_json,
                      _rows.c.checksum).where(_rows.c.key_digest == key_digest).order_by(_rows.c.id)
        with self._tx("reading measured rows", write=False) as conn:
            got = conn.execute(q).fetchall()
        out, bad = [], 0
        for rid, gd, blob, labels, checksum in got:
            try:
                if not (isinstance(gd, str) and isinstance(blob, (bytes, memoryview)) and isinstance(labels, str)):
                    raise AdaptationError("a column holds a value of another type")
                if checksum != row_checksum(key_digest, gd, bytes(blob), labels):
                    raise AdaptationError("its checksum is not the one of its contents under this key (edited, "
                                          "copied from another key, or damaged)")
                out.append((OperatorGraph.from_json(inflate(bytes(blob), MAX_GRAPH_JSON_BYTES)), _labels(labels)))
            except (DippmNasError, ValueError, TypeError, KeyError, RecursionError) as e:
                bad += 1
                _warn_once(f"{self.url}:{key_digest}:{rid}", "%s: measured row %s of adaptation %s... left out: %s",
                           self._label(), rid, key_digest[:12], e)
        return out, bad

    def row_count(self, key_digest: str) -> int:
        """How many rows a key holds (sound or not)."""
        q = sa.select(sa.func.count()).select_from(_rows).where(_rows.c.key_digest == key_digest)
        with self._tx("counting measured rows", write=False) as conn:
            return int(conn.execute(q).scalar_one())

    # ------------------------------------------------------------------ versions
    def newest(self, key_digest: str) -> StoredAdaptation | None:
        """The newest version of a key, or ``None``.

        Raises:
            AdaptationError: the row holds a column of another type.
        """
        q = (sa.select(*[_versions.c[c] for c in VERSION_COLUMNS]).where(_versions.c.key_digest == key_digest)
             .order_by(_versions.c.version.desc()).limit(1))
        with self._tx("reading the newest version", write=False) as conn:
            row = conn.execute(q).fetchone()
        return None if row is None else stored_adaptation(tuple(row))

    def save(self, key_digest: str, key_json: str, checkpoint_sha256: str, rows: int,
             meta: Mapping[str, Any], arrays: bytes) -> int:
        """Insert a new version (the next number; retried when another process took it) with its
        :func:`~dippm_nas.predictor._adapt_rows.version_checksum`; returns the number. ``meta`` gets its
        ``version`` set before it is serialised."""
        last_error: Exception | None = None
        for _ in range(_SAVE_TRIES):
            with self._tx("reading the last version number", write=False) as conn:
                cur = conn.execute(sa.select(sa.func.max(_versions.c.version)).where(
                    _versions.c.key_digest == key_digest)).scalar_one_or_none()
            if cur is not None and (isinstance(cur, bool) or not isinstance(cur, int)):
                raise AdaptationError(f"{self._label()}: the newest version number of adaptation {key_digest[:12]}... "
                                      f"is {cur!r:.40}, not an integer: the versions table is damaged")
            version = int(cur or 0) + 1
            meta_json = json.dumps({**meta, "version": version}, sort_keys=True)
            try:
                with self._tx("saving a version") as conn:
                    conn.execute(_versions.insert(), {
                        "key_digest": key_digest, "version": version, "key_json": key_json,
                        "checkpoint_sha256": checkpoint_sha256, "rows": int(rows), "meta_json": meta_json,
                        "arrays": arrays, "created_at": time.time(),
                        "checksum": version_checksum(key_digest, checkpoint_sha256, rows, meta_json, arrays)})
                return version
            except AdaptationError as e:  # the unique (key, version) pair: another process saved first
                if not isinstance(e.__cause__, sa.exc.IntegrityError):
                    raise
                last_error = e
        raise AdaptationError(f"{self._label()}: could not save a version of adaptation {key_digest[:12]}... after "
                              f"{_SAVE_TRIES} tries: {last_error}")
