"""Tests of dippm_nas.cache: round trips, corrupt rows, eviction, concurrency, location, no pickle."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
import zlib
from pathlib import Path

import pytest
import sqlalchemy as sa

from dippm_nas.cache import (
    CACHE_DIR_ENV,
    CACHE_URL_ENV,
    ConversionCache,
    cache_dir,
    default_cache,
    default_cache_url,
    set_default_cache,
)
from dippm_nas.cache import _rows, _store
from dippm_nas.errors import CacheError, GraphValidationError
from dippm_nas.graph import GRAPH_FORMAT_VERSION, OperatorGraph, synthetic_resnet_graph

PG_URL = os.environ.get("DIPPM_NAS_TEST_PG_URL", "")
needs_pg = pytest.mark.skipif(not PG_URL, reason="set DIPPM_NAS_TEST_PG_URL to a PostgreSQL URL to run this test")


def make_graph(num_blocks: int = 4, channels: int = 16, batch: int = 2) -> OperatorGraph:
    """A ResNet-like chain: per block conv -> batch_norm -> relu -> add(residual); 4 nodes per block."""
    return synthetic_resnet_graph(num_blocks, channels=channels, batch=batch, size=8,
                                  source=f"synthetic{num_blocks}", model_key=f"mk{num_blocks}", convert_seconds=1.25)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'c.sqlite'}"


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """No test touches the user's real cache; the default singleton is reset around each test."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "default-cache"))
    monkeypatch.delenv(CACHE_URL_ENV, raising=False)
    set_default_cache(None)
    _store._warn_once.reset()
    yield
    set_default_cache(None)


def _raw(url: str, sql: str, **params):
    eng = sa.create_engine(url)
    try:
        with eng.begin() as conn:
            res = conn.execute(sa.text(sql), params)
            return res.fetchall() if res.returns_rows else None
    finally:
        eng.dispose()


# --------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("memory_bytes", [64 * 1024**2, 0], ids=["memory-lru", "database-only"])
def test_round_trip_identical(db_url: str, memory_bytes: int) -> None:
    g = make_graph(5)
    with ConversionCache(db_url, memory_bytes=memory_bytes) as cache:
        assert cache.get("k1") is None
        cache.put("k1", g)
        for _ in range(2):  # first from the writer's memory (or the DB), then again
            h = cache.get("k1")
            assert h is not None and h is not g
            assert h.to_dict() == g.to_dict()
            assert h.structural_hash() == g.structural_hash()
            # the carried hash is the stored graph's: recomputing it from the hit's content agrees
            assert OperatorGraph.from_dict(h.to_dict()).structural_hash() == h.structural_hash()
            assert h == g
        st = cache.stats()
        assert (st["rows"], st["hits"], st["misses"], st["puts"]) == (1, 2, 1, 1)
        assert st["memory_hits"] == (2 if memory_bytes else 0)
    # A new instance reads the database (another process would).
    with ConversionCache(db_url) as other:
        h = other.get("k1")
        assert h is not None and h.to_dict() == g.to_dict()
        assert other.stats()["memory_hits"] == 0


def test_hits_are_independent(db_url: str) -> None:
    g = make_graph(3)
    with ConversionCache(db_url) as cache:
        cache.put("k", g)
        a = cache.get("k")
        a.nodes.pop()
        a.edges.clear()
        a.input_consumers["x"].append(99)
        a.outputs[0] = 0
        a.source = "changed"
        g.nodes.pop()  # changing the stored-from graph after put() does not reach the cache either
        b = cache.get("k")
        assert b.to_dict() == make_graph(3).to_dict()


def test_put_is_idempotent_and_updates(db_url: str) -> None:
    with ConversionCache(db_url, memory_bytes=0) as cache:
        cache.put("k", make_graph(2))
        cache.put("k", make_graph(2))
        cache.put("k", make_graph(3))  # last write wins
        assert cache.stats()["rows"] == 1
        assert cache.get("k").to_dict() == make_graph(3).to_dict()


def test_generic_upsert_fallback(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The insert-then-update path other dialects use (IntegrityError on an existing key)."""
    with ConversionCache(db_url, memory_bytes=0) as cache:
        monkeypatch.setattr(cache, "_dialect", "someotherdb")
        cache.put("k", make_graph(2))
        cache.put("k", make_graph(4))
        assert cache.stats()["rows"] == 1
        assert cache.get("k").to_dict() == make_graph(4).to_dict()


def test_columns_and_no_pickle(db_url: str) -> None:
    g = make_graph(3)
    with ConversionCache(db_url) as cache:
        cache.put("k", g)
    (row,) = _raw(db_url, f"SELECT payload, structural_hash, size_bytes, created_at, last_used_at, format_version, "
                          f"dippm_nas_version FROM {_store.TABLE_NAME}")
    payload, shash, size, created, used, fmt, version = row
    # the key envelope (magic, version 2, unsigned, key length, key), then a zlib stream: no pickle anywhere
    head = b"DPMC\x02\x00\x00\x01k"
    assert payload[:len(head)] == head
    assert payload[len(head):len(head) + 1] == b"\x78"  # zlib header, not a pickle protocol marker (b"\x80")
    binding, text = zlib.decompress(payload[len(head):]).split(b"\n", 1)  # the key and hash binding line, the graph
    assert json.loads(binding) == {"key": "k", "structural_hash": g.structural_hash()}
    assert json.loads(text) == g.to_dict()
    assert (shash, size, fmt) == (g.structural_hash(), len(payload), GRAPH_FORMAT_VERSION)
    assert abs(created - time.time()) < 60 and used >= created
    assert version and version != "unknown"
    src = Path(_store.__file__).parent
    for f in src.glob("*.py"):
        assert not re.search(r"\b(import|from)\s+(c?pickle|dill|joblib)\b", f.read_text()), f


# ------------------------------------------------------------------------------------------ corrupt rows
def _graph_json_with_backward_edge() -> bytes:
    d = make_graph(2).to_dict()
    d["edges"].append([3, 1])
    return json.dumps(d).encode()


@pytest.mark.parametrize(
    "column,value,why",
    [
        ("stream", b"not zlib at all", "zlib"),
        ("payload", b"{not json", "JSON"),
        ("payload", b'{"format_version": 1, "nodes": 3}', "graph JSON"),
        ("payload", _graph_json_with_backward_edge(), "validation"),
        ("format_version", GRAPH_FORMAT_VERSION + 1, "format version"),
    ],
    ids=["bad-zlib", "bad-json", "bad-layout", "invalid-graph", "format-version"],
)
def test_corrupt_row_is_deleted_with_one_warning(
    db_url: str, caplog: pytest.LogCaptureFixture, column: str, value: object, why: str
) -> None:
    with ConversionCache(db_url) as cache:
        cache.put("bad", make_graph(2))
        cache.put("good", make_graph(3))
    if column in ("stream", "payload"):  # bound to its key, so only the stream (or the JSON in it) is bad
        shash = make_graph(2).structural_hash()
        body = value if column == "stream" else _rows._body("bad", shash, value)
        column, value = "payload", _rows._envelope("bad", shash, GRAPH_FORMAT_VERSION, body, None)
    _raw(db_url, f"UPDATE {_store.TABLE_NAME} SET {column} = :v WHERE key = 'bad'", v=value)
    with ConversionCache(db_url) as cache, caplog.at_level(logging.WARNING, logger="dippm_nas.cache"):
        assert cache.get("bad") is None
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "'bad'" in warnings[0].getMessage()
        assert why in warnings[0].getMessage()
        assert _raw(db_url, f"SELECT key FROM {_store.TABLE_NAME}") == [("good",)]
        assert cache.stats()["corrupt"] == 1
        # Recomputed and stored again: a hit. Corrupt again: deleted again, but no second warning.
        cache.put("bad", make_graph(2))
        _raw(db_url, f"UPDATE {_store.TABLE_NAME} SET {column} = :v WHERE key = 'bad'", v=value)
        cache._memory.clear()
        assert cache.get("bad") is None
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
        assert cache.get("good").to_dict() == make_graph(3).to_dict()


def test_put_rejects_invalid_graph_and_bad_key(db_url: str) -> None:
    g = make_graph(2)
    g.edges.append((3, 1))
    with ConversionCache(db_url) as cache:
        with pytest.raises(GraphValidationError, match="backwards"):
            cache.put("k", g)
        with pytest.raises(CacheError, match="non-empty str"):
            cache.get("")
        with pytest.raises(CacheError, match="at most 255"):
            cache.put("x" * 256, make_graph(1))
        with pytest.raises(CacheError, match="OperatorGraph"):
            cache.put("k", {"nodes": []})  # type: ignore[arg-type]
        assert cache.stats()["rows"] == 0


def test_bad_arguments_and_closed_cache(db_url: str) -> None:
    with pytest.raises(CacheError, match="max_bytes must be an int >= 1, got 0"):
        ConversionCache(db_url, max_bytes=0)
    with pytest.raises(CacheError, match="invalid conversion cache URL"):
        ConversionCache("not a url")
    cache = ConversionCache(db_url)
    cache.close()
    cache.close()
    with pytest.raises(CacheError, match="closed"):
        cache.get("k")


# ------------------------------------------------------------------------------------------------ eviction
def test_eviction_drops_least_recently_used(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(1_000_000, 2_000_000))
    monkeypatch.setattr(_store, "_now", lambda: float(next(clock)))
    graphs = {k: make_graph(3, channels=16 + i) for i, k in enumerate("abcd")}  # distinct, similar sizes
    sizes = {k: len(_rows._pack(k, g.structural_hash(), GRAPH_FORMAT_VERSION, g.to_json().encode(), None))
             for k, g in graphs.items()}
    bound = int(3.5 * max(sizes.values()))
    with ConversionCache(db_url, max_bytes=bound, touch_interval_s=0) as cache:
        for k in "abc":
            cache.put(k, graphs[k])
        assert cache.stats()["rows"] == 3
        assert cache.get("a") is not None  # a is now more recent than b
        cache.put("d", graphs["d"])
        st = cache.stats()
        assert st["bytes"] <= bound and st["evicted"] == 1
        keys = {k for (k,) in _raw(db_url, f"SELECT key FROM {_store.TABLE_NAME}")}
        assert keys == {"a", "c", "d"}
        assert cache.get("b") is None  # gone from this process's memory too


def test_eviction_reaches_ninety_percent(db_url: str) -> None:
    g = make_graph(2)
    size = len(zlib.compress(g.to_json().encode(), 6))
    bound = 10 * size
    with ConversionCache(db_url, max_bytes=bound, memory_bytes=0) as cache:
        evictions = 0
        for i in range(25):
            cache.put(f"k{i}", g)
            st = cache.stats()
            assert st["bytes"] <= bound
            if st["evicted"] > evictions:  # an eviction goes down to 90 % of the bound, not just under it
                assert st["bytes"] <= 0.9 * bound
                evictions = st["evicted"]
        assert evictions > 0
        assert cache.get("k24") is not None  # the newest always survives
        assert cache.get("k0") is None


def test_graph_larger_than_bound_is_not_stored(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with ConversionCache(db_url, max_bytes=100) as cache, caplog.at_level(logging.WARNING):
        cache.put("big", make_graph(3))
        assert cache.stats()["rows"] == 0
        assert "more than max_bytes=100" in caplog.text
        assert cache.get("big") is not None  # still served from this process's memory


def test_hits_update_last_used_in_batches(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(_store, "_now", lambda: now[0])
    with ConversionCache(db_url, touch_interval_s=60) as cache:
        cache.put("k", make_graph(1))
        now[0] = 1010.0
        cache.get("k")  # within the interval: nothing written yet
        assert _raw(db_url, f"SELECT last_used_at FROM {_store.TABLE_NAME}") == [(1000.0,)]
        now[0] = 1070.0
        cache.get("k")  # interval passed: the batch is written
        assert _raw(db_url, f"SELECT last_used_at FROM {_store.TABLE_NAME}") == [(1070.0,)]
        now[0] = 1080.0
        cache.get("k")
    # close() writes what is pending
    assert _raw(db_url, f"SELECT last_used_at FROM {_store.TABLE_NAME}") == [(1080.0,)]


# --------------------------------------------------------------------------------------------- concurrency
_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from dippm_nas.cache import ConversionCache
    from dippm_nas.graph import OperatorGraph
    url, graph_file, go_file = sys.argv[1:4]
    graph = OperatorGraph.from_json(Path(graph_file).read_text())
    deadline = time.time() + 60
    while not Path(go_file).exists():
        if time.time() > deadline:
            sys.exit("no go signal")
        time.sleep(0.001)
    with ConversionCache(url, memory_bytes=0) as cache:  # both processes race to create the table too
        for _ in range(50):
            cache.put("same-key", graph)
            got = cache.get("same-key")
            assert got is not None and got.to_dict() == graph.to_dict(), "read back a different graph"
    print("ok")
    """
)


def _two_writers(url: str, tmp_path: Path) -> None:
    g = make_graph(6)
    graph_file = tmp_path / "g.json"
    graph_file.write_text(g.to_json())
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, url, str(graph_file), str(go)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    time.sleep(0.2)
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err
    with ConversionCache(url, memory_bytes=0) as cache:
        got = cache.get("same-key")
        assert got is not None and got.to_dict() == g.to_dict()
        rows = _raw(url, f"SELECT count(*) FROM {_store.TABLE_NAME} WHERE key = 'same-key'")
        assert rows == [(1,)]


def test_two_processes_write_the_same_key(tmp_path: Path) -> None:
    _two_writers(f"sqlite:///{tmp_path / 'fresh' / 'shared.sqlite'}", tmp_path)
    journal = _raw(f"sqlite:///{tmp_path / 'fresh' / 'shared.sqlite'}", "PRAGMA journal_mode")
    assert journal == [("wal",)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_forked_worker_opens_its_own_connections(db_url: str) -> None:
    cache = ConversionCache(db_url, memory_bytes=0)
    set_default_cache(cache)
    cache.put("parent", make_graph(2))
    assert cache.get("parent") is not None
    parent_pool = id(cache._engine.pool)
    pid = os.fork()
    if pid == 0:  # child: must not use the parent's pooled connection
        code = 1
        try:
            c = default_cache()
            ok = c is cache and c.get("parent") is not None and c.stats()["hits"] == 1
            ok = ok and id(c._engine.pool) != parent_pool  # dispose(close=False) made a new pool
            c.put("child", make_graph(3))
            code = 0 if ok and c._pid == os.getpid() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.get("child") is not None
    assert cache.stats()["hits"] == 2  # the child's counters are its own
    cache.close()


# ---------------------------------------------------------------------------------------- location/default
def test_env_var_moves_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "moved" / "here"
    monkeypatch.setenv(CACHE_DIR_ENV, str(where))
    assert cache_dir() == where
    with ConversionCache() as cache:
        cache.put("k", make_graph(1))
        assert cache.url == f"sqlite:///{where / 'conversion.sqlite'}"
    assert (where / "conversion.sqlite").is_file()


def test_xdg_and_home_fallbacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "dippm-nas"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "dippm-nas"
    assert not cache_dir().exists()
    assert cache_dir(create=True).is_dir()


def test_url_env_var_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.sqlite'}"
    monkeypatch.setenv(CACHE_URL_ENV, url)
    assert default_cache_url() == url
    with ConversionCache() as cache:
        assert cache.url == url
        cache.put("k", make_graph(1))
    assert (tmp_path / "elsewhere.sqlite").is_file()
    assert not (tmp_path / "default-cache").exists()


def test_default_cache_singleton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = default_cache()
    assert default_cache() is a
    assert a.url.endswith(str(tmp_path / "default-cache" / "conversion.sqlite"))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "other"))
    b = default_cache()
    assert b is not a and b.url.endswith(str(tmp_path / "other" / "conversion.sqlite"))
    mine = ConversionCache(f"sqlite:///{tmp_path / 'mine.sqlite'}")
    set_default_cache(mine)
    assert default_cache() is mine
    set_default_cache(None)  # back to the environment's cache
    c = default_cache()
    assert c is not mine and c.url == b.url
    with pytest.raises(CacheError, match="ConversionCache or None"):
        set_default_cache("sqlite://")  # type: ignore[arg-type]
    for x in (a, b, c, mine):
        x.close()
    assert default_cache() is not c and not default_cache().closed  # a closed default is reopened


def test_url_is_redacted_but_recoverable(tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    from dippm_nas._sql import redact

    url = "postgresql+psycopg2://user:s3cret@db.example:5432/cache"
    assert redact(make_url(url)) == "postgresql+psycopg2://user:***@db.example:5432/cache"
    with ConversionCache(f"sqlite:///{tmp_path / 'c.sqlite'}") as cache:
        assert cache.url_with_credentials() == cache.url == f"sqlite:///{tmp_path / 'c.sqlite'}"


def test_clear(db_url: str) -> None:
    with ConversionCache(db_url) as cache:
        cache.put("a", make_graph(1))
        cache.put("b", make_graph(2))
        cache.clear()
        assert cache.stats()["rows"] == 0
        assert cache.get("a") is None


# ----------------------------------------------------------------------------------------------- postgres
@pytest.mark.postgres
@needs_pg
def test_postgres_round_trip_corrupt_and_concurrency(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = f"pytest-{uuid.uuid4().hex}"
    g = make_graph(4)
    with ConversionCache(PG_URL, memory_bytes=0) as cache:
        assert cache.url_with_credentials() == PG_URL
        password = sa.engine.make_url(PG_URL).password
        if password:
            assert f":{password}@" not in cache.url and f":{password}@" not in repr(cache)
            assert ":***@" in cache.url
        cache.put(key, g)
        cache.put(key, g)
        assert cache.get(key).to_dict() == g.to_dict()
        _raw(PG_URL, f"UPDATE {_store.TABLE_NAME} SET payload = :v WHERE key = :k", v=b"junk", k=key)
        with caplog.at_level(logging.WARNING):
            assert cache.get(key) is None
        assert "has no key envelope" in caplog.text
        assert _raw(PG_URL, f"SELECT count(*) FROM {_store.TABLE_NAME} WHERE key = :k", k=key) == [(0,)]
    _raw(PG_URL, f"DELETE FROM {_store.TABLE_NAME} WHERE key = 'same-key'")
    try:
        _two_writers(PG_URL, tmp_path)
    finally:
        _raw(PG_URL, f"DELETE FROM {_store.TABLE_NAME} WHERE key = 'same-key'")


# ------------------------------------------------------------------------------- the sqlite3 reader of a hit
def test_the_default_file_is_read_with_sqlite3_as_the_store_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.cache import CACHE_SECRET_ENV, TABLE_NAME, read_default_sqlite

    url = default_cache_url()
    g = make_graph(3)
    with ConversionCache() as cache:
        cache.put("k", g)
        cache.put("bad", make_graph(2))
    bad = _rows._envelope("bad", make_graph(2).structural_hash(), GRAPH_FORMAT_VERSION, b"not zlib", None)
    _raw(url, f"UPDATE {TABLE_NAME} SET payload = :v WHERE key = 'bad'", v=bad)
    _raw(url, f"UPDATE {TABLE_NAME} SET last_used_at = 1.0 WHERE key = 'k'")
    # while the SQLAlchemy store is loaded (set_default_cache may have named another cache) it reads nothing
    assert read_default_sqlite("k") is None
    monkeypatch.delitem(sys.modules, "dippm_nas.cache._store")
    hit = read_default_sqlite("k")
    assert hit is not None and hit.to_dict() == g.to_dict() and hit.structural_hash() == g.structural_hash()
    assert _raw(url, f"SELECT last_used_at FROM {TABLE_NAME} WHERE key = 'k'")[0][0] > 1.0  # stamped as a hit
    assert read_default_sqlite("missing") is None
    assert read_default_sqlite("bad") is None  # left to the store, which deletes it and says why
    monkeypatch.setenv(CACHE_SECRET_ENV, "s3cret")
    assert read_default_sqlite("k") is None  # an unsigned row is not trusted under a secret, as by the store
    monkeypatch.delenv(CACHE_SECRET_ENV)
    monkeypatch.setenv(CACHE_URL_ENV, url)
    assert read_default_sqlite("k") is None  # another URL (even this file's) is the store's
    monkeypatch.delenv(CACHE_URL_ENV)
    monkeypatch.setenv(CACHE_DIR_ENV, str(Path(cache_dir()).parent / "empty"))
    assert read_default_sqlite("k") is None and not (cache_dir() / "conversion.sqlite").exists()  # never creates


def test_the_reader_and_the_store_share_one_table_definition() -> None:
    from dippm_nas.cache import CACHE_TABLE, COLUMNS, TABLE_NAME

    assert CACHE_TABLE.name == TABLE_NAME and tuple(c.name for c in CACHE_TABLE.columns) == COLUMNS
