"""Tests of ``dippm_nas._sql``: the engine set-up shared by the conversion cache, the validation queue,
the dataset store and the Optuna storage, and the messages each store keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from dippm_nas.cache import CACHE_DIR_ENV
from dippm_nas._sql import SQLITE_BUSY_TIMEOUT_S, make_engine, redact
from dippm_nas.cache import ConversionCache
from dippm_nas.dataset import DatasetError, DatasetStore
from dippm_nas.errors import CacheError, DippmNasError, ValidationError
from dippm_nas.validation import JobQueue


def _pragmas(engine: sa.Engine) -> tuple[str, int, int, int]:
    with engine.connect() as conn:
        return tuple(conn.exec_driver_sql(f"PRAGMA {p}").scalar() for p in  # type: ignore[return-value]
                     ("journal_mode", "busy_timeout", "synchronous", "foreign_keys"))


def test_sqlite_engine_gets_wal_busy_timeout_and_normal_sync(tmp_path: Path) -> None:
    url = make_url(f"sqlite:///{tmp_path / 'new' / 'dir' / 'x.sqlite'}")
    engine = make_engine(url, what="test store", error=DippmNasError, dir_hint="-", local_hint="-")
    try:
        assert _pragmas(engine) == ("wal", int(SQLITE_BUSY_TIMEOUT_S * 1000), 1, 0)  # 1 = NORMAL
    finally:
        engine.dispose()
    assert (tmp_path / "new" / "dir" / "x.sqlite").exists()  # the directory was created


def test_dataset_store_keeps_its_longer_timeout_and_foreign_keys(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path / "d.sqlite")
    try:
        assert _pragmas(store._engine) == ("wal", 60000, 1, 1)
    finally:
        store.close()


def test_each_store_names_itself_in_engine_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match=rf"directory .* of the conversion cache .*set {CACHE_DIR_ENV} to a writable"):
        ConversionCache(f"sqlite:///{blocker / 'sub' / 'c.sqlite'}")
    with pytest.raises(ValidationError, match=r"directory .* of the validation queue .*writable"):
        JobQueue(f"sqlite:///{blocker / 'sub' / 'q.db'}")
    with pytest.raises(CacheError, match=r"invalid conversion cache URL 'nosuchdb://u:\*\*\*@host/db'"):
        ConversionCache("nosuchdb://u:secret@host/db")
    with pytest.raises(DatasetError, match="dataset file"):
        make_engine(make_url("nosuchdb://host/db"), what="dataset file", error=DatasetError, dir_hint="-",
                    local_hint="-")


def test_redact_masks_only_the_password() -> None:
    assert redact(make_url("postgresql+psycopg2://u:pw@h:5432/db")) == "postgresql+psycopg2://u:***@h:5432/db"
    assert redact(make_url("sqlite:////tmp/x.db")) == "sqlite:////tmp/x.db"


class _NoWalCursor:
    """A DB-API cursor of a SQLite file on a file system without WAL: every journal_mode answer is 'delete'."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def execute(self, sql: str) -> "_NoWalCursor":
        self.log.append(sql)
        return self

    def fetchone(self) -> tuple[str]:
        return ("delete",)

    def close(self) -> None:
        pass


class _NoWalConnection:
    def __init__(self) -> None:
        self.log: list[str] = []

    def cursor(self) -> _NoWalCursor:
        return _NoWalCursor(self.log)


def test_refused_wal_is_warned_once_per_store_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from dippm_nas import _sql

    monkeypatch.setattr(_sql, "_refused_wal", set())
    cache = _sql.sqlite_connect_listener(what="conversion cache", local_hint="Move it.", busy_timeout_s=1.0,
                                         foreign_keys=True)
    conn = _NoWalConnection()
    with caplog.at_level("WARNING", logger="dippm_nas._sql"):
        cache(conn, None)
        cache(_NoWalConnection(), None)
        _sql.sqlite_connect_listener(what="validation queue", local_hint="Elsewhere.")(_NoWalConnection(), None)
    assert conn.log == ["PRAGMA busy_timeout = 1000", "PRAGMA journal_mode", "PRAGMA journal_mode = WAL",
                        "PRAGMA synchronous = NORMAL", "PRAGMA foreign_keys = ON"]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "conversion cache: SQLite refused WAL journal mode (got 'delete'; a network file system?); concurrent "
        "processes will wait on each other more. Move it.",
        "validation queue: SQLite refused WAL journal mode (got 'delete'; a network file system?); concurrent "
        "processes will wait on each other more. Elsewhere.",
    ]


def test_the_three_stores_share_the_base_and_wrap_database_errors_naming_store_and_operation(tmp_path: Path) -> None:
    import sqlite3

    from dippm_nas._sql import SqlStore

    with DatasetStore(tmp_path / "d.sqlite") as store:
        assert isinstance(store, SqlStore) and store.url == f"sqlite:///{tmp_path / 'd.sqlite'}"
        con = sqlite3.connect(tmp_path / "d.sqlite")
        con.execute("DROP TABLE op_measurements")
        con.close()
        # a SQLAlchemy error is the store's own error, naming the file and what was being done, chained
        with pytest.raises(DatasetError, match=r"dataset file '.*d\.sqlite': reading operator rows failed") as e:
            list(store.iter_op_rows())
        assert isinstance(e.value.__cause__, sa.exc.OperationalError)
    with JobQueue(f"sqlite:///{tmp_path / 'q.db'}") as queue, ConversionCache(f"sqlite:///{tmp_path / 'c.db'}") as cache:
        assert isinstance(queue, SqlStore) and isinstance(cache, SqlStore)
        with sa.create_engine(queue.url_with_credentials()).begin() as conn:
            conn.exec_driver_sql("DROP TABLE dippm_validation_results")
        with pytest.raises(ValidationError, match=r"validation queue '.*q\.db': reading results failed"):
            queue.results()
        with sa.create_engine(cache.url_with_credentials()).begin() as conn:
            conn.exec_driver_sql("DROP TABLE dippm_conversion_cache")
        with pytest.raises(CacheError, match=r"conversion cache '.*c\.db': counting rows failed"):
            cache.stats()


def test_a_url_that_is_not_one_is_refused_with_the_stores_examples() -> None:
    from dippm_nas._sql import parse_url

    with pytest.raises(ValidationError, match=r"url must be a SQLAlchemy URL string, got 3"):
        parse_url(3, what="validation queue", error=ValidationError, example="'sqlite:///x.db'")
    with pytest.raises(CacheError, match=r"url must be a SQLAlchemy URL string or None, got ''"):
        parse_url("", what="conversion cache", error=CacheError, example="-", none_ok=True)
    with pytest.raises(CacheError, match=r"invalid conversion cache URL 'no url' \(.*\); expected e\.g\. 'sqlite"):
        parse_url("no url", what="conversion cache", error=CacheError, example="'sqlite:///x.db'")
    with pytest.raises(ValidationError, match="invalid validation queue URL .*expected e.g. 'sqlite:////path/study.db'"):
        JobQueue("::not a url::")


def test_a_store_of_another_schema_version_is_refused_naming_both(tmp_path: Path) -> None:
    from dippm_nas._sql import SqlStore

    class _Store(SqlStore):
        what = "test store"
        error = DatasetError

    md = sa.MetaData()
    meta = sa.Table("meta", md, sa.Column("key", sa.String(64), primary_key=True), sa.Column("value", sa.Text))
    url = make_url(f"sqlite:///{tmp_path / 's.db'}")
    for version, created in ((3, {"created_by": "x"}), (3, {}), (4, {})):
        store = _Store()
        store._open(url, dir_hint="-", local_hint="-")
        store._create_tables(md, ["meta"])
        try:
            with store._tx("checking") as conn:
                if version == 4:
                    with pytest.raises(DatasetError, match=r"test store '.*s\.db' has schema_version 3; this "
                                                           r"dippm-nas reads schema_version 4 only"):
                        store._check_schema_version(conn, meta, version, created)
                else:
                    store._check_schema_version(conn, meta, version, created)
        finally:
            store.close()
    with sa.create_engine(url).connect() as conn:
        assert dict(conn.execute(sa.select(meta.c.key, meta.c.value)).all()) == {"schema_version": "3",
                                                                                "created_by": '"x"'}


def test_inflate_reads_a_whole_stream_up_to_the_cap_and_says_why_it_refuses() -> None:
    import zlib

    from dippm_nas._compress import InflateRefused, deflate, inflate

    data = b"graph " * 1000
    assert inflate(deflate(data), len(data)) == data
    assert zlib.decompress(deflate(data)) == data
    with pytest.raises(InflateRefused, match="beyond 5,999 bytes") as e:
        inflate(deflate(data), len(data) - 1)
    assert e.value.too_big
    for bad, why in ((b"not zlib", "incorrect header check"), (deflate(data)[:-8], "truncated"),
                     ("text", "TypeError")):
        with pytest.raises(InflateRefused, match=why) as e:
            inflate(bad, 10**6)  # type: ignore[arg-type]
        assert not e.value.too_big


def test_create_tables_finishes_what_a_concurrent_creator_left_half_done(tmp_path: Path) -> None:
    """The loser of a creation race may see the winner's first table before its second (SQLite commits each
    CREATE TABLE alone): it creates the missing table instead of failing."""
    from dippm_nas._sql import create_tables

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'r.db'}")
    md = sa.MetaData()
    sa.Table("a", md, sa.Column("k", sa.Integer, primary_key=True))
    sa.Table("b", md, sa.Column("k", sa.Integer, primary_key=True))
    real = sa.MetaData.create_all
    calls = []

    def racing(self: sa.MetaData, bind: object, checkfirst: bool = True) -> None:
        calls.append(checkfirst)
        if len(calls) == 1:  # the winner has committed "a" only; this create fails on it
            with engine.begin() as conn:
                conn.exec_driver_sql("CREATE TABLE a (k INTEGER PRIMARY KEY)")
                conn.exec_driver_sql("CREATE TABLE a (k INTEGER PRIMARY KEY)")
        real(self, bind, checkfirst=checkfirst)

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sa.MetaData, "create_all", racing)
            create_tables(engine, md, ["a", "b"], error=DatasetError, what="test store")
        assert len(calls) == 2
        assert set(sa.inspect(engine).get_table_names()) == {"a", "b"}
    finally:
        engine.dispose()
