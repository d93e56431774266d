"""Where adaptations live: two SQL tables, in the study's storage or in ``<cache dir>/adaptations.sqlite``.

``dippm_adaptation_rows`` keeps every measured row fed to ``adapt`` (one row per call per graph, never
updated: two processes adapting one key at once each insert their own rows, so none is lost), and
``dippm_adaptation_versions`` every fitted :class:`~dippm_nas.predictor.Adaptation` of a key, numbered
1, 2, ... (the pair ``(key_digest, version)`` is unique: two processes saving at once get different numbers,
the second retries). Columns hold data only: JSON text, zlib-compressed graph JSON (read back to at most
:data:`~dippm_nas.cache.MAX_GRAPH_JSON_BYTES`), and the heads' arrays as an
``.npz`` read with ``np.load(allow_pickle=False)``; each version carries a SHA-256 checksum of its meta JSON and
arrays, the checkpoint hash it was fitted on and its row count.

A refit reads every row of the key (:meth:`AdaptationStore.rows`), so the newest version is fitted on all
rows: ``adapt`` saves, then checks that no row arrived meanwhile, and refits when one did.

SQLite files are read with the standard library's ``sqlite3`` (:func:`read_newest`): a prediction that loads
an adaptation does not load SQLAlchemy. Writes and other databases (PostgreSQL) go through SQLAlchemy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dippm_nas._compress import deflate, inflate
from dippm_nas._paths import cache_dir
from dippm_nas.cache import MAX_GRAPH_JSON_BYTES
from dippm_nas.errors import AdaptationError
from dippm_nas.graph import OperatorGraph

__all__ = ["AdaptationStore", "StoredAdaptation", "ROWS_TABLE", "VERSIONS_TABLE", "ADAPT_FILE_NAME",
           "default_adapt_url", "read_newest"]

logger = logging.getLogger(__name__)

#: Table of the measured rows.
ROWS_TABLE = "dippm_adaptation_rows"
#: Table of the fitted versions.
VERSIONS_TABLE = "dippm_adaptation_versions"
#: The SQLite file of the default store, in :func:`dippm_nas._paths.cache_dir`.
ADAPT_FILE_NAME = "adaptations.sqlite"
#: Seconds a ``sqlite3`` read waits on a locked database.
_BUSY_TIMEOUT_S = 5.0
#: Tries of a version insert that lost the race for its number.
_SAVE_TRIES = 20

_NEWEST = (f"SELECT version, meta_json, arrays, checksum FROM {VERSIONS_TABLE} WHERE key_digest = :k "
           "ORDER BY version DESC LIMIT 1")


def default_adapt_url() -> str:
    """``sqlite:///<cache_dir()>/adaptations.sqlite``."""
    return f"sqlite:///{cache_dir() / ADAPT_FILE_NAME}"


@dataclass(frozen=True)
class StoredAdaptation:
    """One stored version: its number and its stored form (decoded by ``Adaptation.from_stored``)."""

    version: int
    meta_json: str
    arrays: bytes
    checksum: str


def _sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///FILE`` URL (``None`` for other URLs and in-memory databases)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or "?" in url:
        return None
    rest = url[len(prefix):]
    if rest in ("", ":memory:") or rest.startswith("file:"):
        return None
    return Path(rest)


def read_newest(url: str | None, key_digest: str) -> StoredAdaptation | None:
    """The newest stored version of a key, read with ``sqlite3`` for a SQLite file (no SQLAlchemy); other URLs
    through :class:`AdaptationStore`. ``None`` when there is none, no file, or the table does not exist yet."""
    url = url or default_adapt_url()
    path = _sqlite_path(url)
    if path is None:
        store = AdaptationStore(url)
        try:
            return store.newest(key_digest)
        finally:
            store.close()
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_S)
    except sqlite3.Error as e:
        logger.debug("adaptations: %s not read: %s", path, e)
        return None
    try:
        row = conn.execute(_NEWEST.replace(":k", "?"), (key_digest,)).fetchone()
    except sqlite3.OperationalError as e:  # no table yet
        logger.debug("adaptations: %s has no versions table: %s", path, e)
        return None
    finally:
        conn.close()
    return None if row is None else StoredAdaptation(int(row[0]), str(row[1]), bytes(row[2]), str(row[3]))


def graph_digest(graph_key: str) -> str:
    return hashlib.sha256(graph_key.encode()).hexdigest()


class AdaptationStore:
    """The adaptation tables in one SQLAlchemy database.

    Args:
        url: SQLAlchemy URL (a study's storage, ``sqlite:///file.db``, ``postgresql+psycopg2://...``); ``None``:
            :func:`default_adapt_url`.

    Raises:
        AdaptationError: an invalid URL or a database that cannot be opened.
    """

    def __init__(self, url: str | None = None) -> None:
        import sqlalchemy as sa

        from dippm_nas._sql import create_tables, make_engine, parse_url

        self.url = url or default_adapt_url()
        parsed = parse_url(self.url, what="adaptation store", error=AdaptationError, none_ok=True,
                           example="'sqlite:////path/adaptations.sqlite' or 'postgresql+psycopg2://user@host/db'")
        self._sa = sa
        self._md = sa.MetaData()
        self._rows = sa.Table(
            ROWS_TABLE, self._md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("key_digest", sa.String(64), nullable=False, index=True),
            sa.Column("key_json", sa.Text, nullable=False),
            sa.Column("graph_digest", sa.String(64), nullable=False),
            sa.Column("graph_json_z", sa.LargeBinary, nullable=False),
            sa.Column("labels_json", sa.Text, nullable=False),
            sa.Column("writer", sa.String(255), nullable=False),
            sa.Column("created_at", sa.Double, nullable=False),
        )
        self._versions = sa.Table(
            VERSIONS_TABLE, self._md,
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
        self.engine = make_engine(parsed, what="adaptation store", error=AdaptationError,
                                  dir_hint="set DIPPM_NAS_CACHE_DIR to a writable directory",
                                  local_hint="Keep the adaptation store's SQLite file on a local disk.")
        create_tables(self.engine, self._md, [ROWS_TABLE, VERSIONS_TABLE], error=AdaptationError,
                      what="adaptation store")

    def _tx(self, write: bool = True) -> Any:
        from dippm_nas._sql import transaction

        return transaction(self.engine, write=write, error=AdaptationError, what=f"adaptation store {self.url!r}")

    def add_rows(self, key_digest: str, key_json: str, rows: Sequence[tuple[OperatorGraph, str, Mapping[str, float]]]
                 ) -> int:
        """Insert measured rows ``(graph, graph key, {target: value})``; returns how many."""
        if not rows:
            return 0
        writer = f"{socket.gethostname()}:{os.getpid()}"
        now = time.time()
        values = [{"key_digest": key_digest, "key_json": key_json, "graph_digest": graph_digest(gk),
                   "graph_json_z": deflate(g.to_json().encode()),
                   "labels_json": json.dumps(dict(y), sort_keys=True), "writer": writer, "created_at": now}
                  for g, gk, y in rows]
        with self._tx() as conn:
            conn.execute(self._rows.insert(), values)
        return len(values)

    def rows(self, key_digest: str) -> list[tuple[OperatorGraph, dict[str, float]]]:
        """Every stored row of a key, oldest first; a row that does not decode is skipped with a warning."""
        sa = self._sa
        q = sa.select(self._rows.c.id, self._rows.c.graph_json_z, self._rows.c.labels_json).where(
            self._rows.c.key_digest == key_digest).order_by(self._rows.c.id)
        with self._tx(write=False) as conn:
            got = conn.execute(q).fetchall()
        out = []
        for rid, blob, labels in got:
            try:
                out.append((OperatorGraph.from_json(inflate(bytes(blob), MAX_GRAPH_JSON_BYTES)),
                            {str(k): float(v) for k, v in json.loads(labels).items()}))
            except Exception as e:  # noqa: BLE001 - one damaged row never stops a refit
                logger.warning("adaptation store %s: row %s does not decode (%s: %s); left out", self.url, rid,
                               type(e).__name__, e)
        return out

    def row_count(self, key_digest: str) -> int:
        sa = self._sa
        q = sa.select(sa.func.count()).select_from(self._rows).where(self._rows.c.key_digest == key_digest)
        with self._tx(write=False) as conn:
            return int(conn.execute(q).scalar_one())

    def newest(self, key_digest: str) -> StoredAdaptation | None:
        """The newest version of a key, or ``None``."""
        with self._tx(write=False) as conn:
            row = conn.execute(self._sa.text(_NEWEST), {"k": key_digest}).fetchone()
        return None if row is None else StoredAdaptation(int(row[0]), str(row[1]), bytes(row[2]), str(row[3]))

    def save(self, key_digest: str, key_json: str, checkpoint_sha256: str, rows: int,
             meta: Mapping[str, Any], arrays: bytes, checksum_of: Any) -> int:
        """Insert a new version (the next number; retried when another process took it); returns the number.

        ``meta`` gets its ``version`` set before it is serialised and ``checksum_of(meta_json, arrays)`` is
        stored beside it."""
        sa = self._sa
        last_error: Exception | None = None
        for _ in range(_SAVE_TRIES):
            with self._tx(write=False) as conn:
                cur = conn.execute(sa.select(sa.func.max(self._versions.c.version)).where(
                    self._versions.c.key_digest == key_digest)).scalar_one_or_none()
            version = int(cur or 0) + 1
            meta_json = json.dumps({**meta, "version": version}, sort_keys=True)
            try:
                with self._tx() as conn:
                    conn.execute(self._versions.insert(), {
                        "key_digest": key_digest, "version": version, "key_json": key_json,
                        "checkpoint_sha256": checkpoint_sha256, "rows": int(rows), "meta_json": meta_json,
                        "arrays": arrays, "checksum": checksum_of(meta_json, arrays), "created_at": time.time()})
                return version
            except AdaptationError as e:  # the unique (key, version) pair: another process saved first
                if not isinstance(e.__cause__, sa.exc.IntegrityError):
                    raise
                last_error = e
        raise AdaptationError(f"could not save a version of adaptation {key_digest[:12]}... after {_SAVE_TRIES} "
                              f"tries: {last_error}")

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"AdaptationStore({self.url!r})"
