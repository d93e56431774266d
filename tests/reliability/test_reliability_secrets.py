"""Credentials and stored adaptations (``docs/reliability.md``, "Credentials and stored adaptations"): no password
of a storage URL in any message, no stored adaptation answering for another key or after an edit, no damaged
adaptation crashing a prediction, no raw ``ValueError``/``ImportError``/``TypeError`` for a bad URL or ``adapt(None)``.
Each test here failed before its fix."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import sqlite3
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dippm_nas.errors import AdaptationError, DippmNasError, InvalidTypeError, MissingDependencyError
from dippm_nas.predictor import AdaptationKey, AdaptationStore, deployment_key
from dippm_nas.predictor import _adapt_sql, _gnn_adapt
from test_adapt import DEV, _graphs, _predictor, _rows, _truth

#: The password of every URL below; it must appear in no message.
PW = "S3cretPW"
#: A PostgreSQL URL nothing answers at (port 1 refuses at once).
PG_DOWN = f"postgresql+psycopg2://u:{PW}@127.0.0.1:1/db"
#: A URL whose port is not a number.
PG_BAD_PORT = f"postgresql+psycopg2://u:{PW}@127.0.0.1:abc/db"


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DIPPM_NAS_CACHE_URL", raising=False)
    _gnn_adapt._warn_once.reset()
    _adapt_sql._warn_once.reset()
    yield
    _gnn_adapt._warn_once.reset()


class Said:
    """Everything said while a block ran: log records (any logger, any level), warnings, and the texts of the
    exceptions :meth:`raised` caught."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.texts: list[str] = []

    def raised(self, fn: Any, *args: Any, **kwargs: Any) -> BaseException | None:
        try:
            fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - the text of whatever it raises is checked
            self.texts += [f"{type(e).__name__}: {e}", repr(e)]
            return e
        return None

    def all(self, recwarn: Any) -> str:
        return "\n".join([*self.texts, *(r.getMessage() for r in self.caplog.records),
                          *(str(w.message) for w in recwarn)])


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Said:
    caplog.set_level(logging.DEBUG)
    return Said(caplog)


def _no_password(text: str) -> None:
    assert text, "nothing was said: the test would pass without checking anything"
    assert PW not in text, f"the password reached a message:\n{text}"


# ======================================================================== credentials
def test_secret_sqlite_store_with_a_password_masks_it_in_repr_errors_warnings_and_the_worker(
        tmp_path: Path, said: Said, recwarn: Any) -> None:
    # SQLite takes a URL with a password query parameter (ignored by the driver): the store opens, so its repr,
    # its warnings about a damaged row, its transaction errors and a predictor reading it are all exercised
    db = tmp_path / "a.db"
    url = f"sqlite:///{db}?password={PW}"
    store = AdaptationStore(url)
    said.texts += [repr(store), str(store.url)]
    store.close()
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    p.adapt(_rows(gs[:12], y[:12]), storage=url)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE dippm_adaptation_rows SET labels_json = 'not json' WHERE id = 1")
    p.adapt(_rows(gs[12:14], y[12:14]), storage=url)  # the refit reads the damaged row: a warning
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE dippm_adaptation_versions SET arrays = 'text' WHERE version = 2")
    q = _predictor(load=True)
    q.use_adaptation(storage=url)
    q.predict_graphs(gs[:1], mig=False)  # the damaged version: set aside with a warning naming the store
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE dippm_adaptation_versions")
        conn.execute("CREATE TABLE dippm_adaptation_versions (x INTEGER)")
    assert isinstance(said.raised(p.adapt, _rows(gs[14:16], y[14:16]), storage=url), AdaptationError)
    text = said.all(recwarn)
    _no_password(text)
    assert "password=***" in text  # the store was named, masked


def test_secret_the_validation_worker_never_shows_the_queues_password(tmp_path: Path, said: Said,
                                                                      recwarn: Any) -> None:
    # the worker hands the queue's URL, password included, to the adaptation store: the store's warnings and
    # errors name it masked
    from dippm_nas.measure import Measurement
    from dippm_nas.predictor import set_predictor
    from dippm_nas.spec import InputSpec
    from dippm_nas.validation import JobQueue, ValidationWorker

    db = tmp_path / "study.db"
    url = f"sqlite:///{db}?password={PW}"
    spec = InputSpec(shape=(4,), batch_size=2)

    from dippm_nas.capture import assemble

    p = _predictor(load=True)
    widths = (8, 16, 32, 48)
    cfgs = {w: {"in_features": 4, "hidden": [w], "out_features": 2} for w in widths}
    base = {w: p.predict_graphs([assemble("mlp", cfgs[w], spec)], mig=False)[0] for w in widths}

    def fake(model: Any, spec_: Any, device: Any, settings: Any) -> Measurement:
        w = model.search_space_config["hidden"][0]  # figures near the predictions: a plausible calibration
        return Measurement(latency_ms=base[w].latency_ms * (1 + w / 16), latency_ms_std=0.001, energy_j=None,
                           memory_mib=base[w].memory_mib * (1 + w / 32), memory_source="rss_delta", n_repeats=5,
                           device="cpu", environment={"fake": True}, energy_reason="none in this test",
                           batch_size=2, dtype="float32")

    set_predictor(DEV, p)
    queue = JobQueue(url)
    try:
        said.texts.append(repr(queue))
        for i, w in enumerate(widths):
            queue.enqueue(study="s", trial_number=i, space="mlp", config=cfgs[w], spec=spec.to_dict(), device=DEV,
                          predicted={"latency_ms": 1.0}, priority=0.0)
        worker = ValidationWorker(queue, DEV, measure_fn=fake, adapt=True)
        assert worker.run(idle_timeout_s=0, poll_s=0, max_jobs=2) == 2
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE dippm_adaptation_rows SET labels_json = 'not json' WHERE id = 1")
        assert worker.run(idle_timeout_s=0, poll_s=0) == 2  # each refit reads the damaged row: a warning
        assert worker.adaptation is not None
    finally:
        queue.close()
        set_predictor(DEV, None)
    text = said.all(recwarn)
    _no_password(text)
    assert "left out" in text and "password=***" in text


def test_secret_an_unreachable_postgresql_url_never_shows_its_password(said: Said, recwarn: Any) -> None:
    pytest.importorskip("psycopg2", reason="needs psycopg2 (pip install 'dippm-nas[postgres]')")
    from dippm_nas.cache import ConversionCache
    from dippm_nas.optuna import rdb_storage
    from dippm_nas.validation import JobQueue

    for url in (PG_DOWN, PG_BAD_PORT):
        for fn in (AdaptationStore, JobQueue, ConversionCache, rdb_storage):
            assert isinstance(said.raised(fn, url), DippmNasError), (fn, url)
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    assert isinstance(said.raised(p.adapt, _rows(gs[:4], y[:4]), storage=PG_DOWN), AdaptationError)
    q = _predictor(load=True)
    q.use_adaptation(storage=PG_DOWN)
    pred = q.predict_graphs(gs[:1], mig=False)[0]  # the store cannot be read: flagged, not raised
    said.texts.append(repr(q))
    assert pred.details["adaptation_ignored"] == 1.0 and PW not in q.adaptation_flag
    text = said.all(recwarn)
    _no_password(text)
    assert "u:***@127.0.0.1" in text


@pytest.mark.postgres
def test_secret_postgresql_store_masks_its_password(pg_url: str, said: Said, recwarn: Any) -> None:
    import sqlalchemy as sa

    password = sa.engine.make_url(pg_url).password
    assert password, f"{pg_url.split('@')[-1]}: the test needs a URL with a password"
    assert password not in "dippm_adaptation_versions dippm_adaptation_rows", (
        f"the server's password {password!r} is part of the store's table names: a message naming a table would "
        "read as a leak; give the test server another password (.ci/run sets one)")
    store = AdaptationStore(pg_url)
    said.texts += [repr(store), str(store.url)]
    store.close()
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    p.adapt(_rows(gs[:12], y[:12]), storage=pg_url)
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE dippm_adaptation_rows SET labels_json = 'not json' WHERE id = 1"))
        conn.execute(sa.text("UPDATE dippm_adaptation_versions SET meta_json = 'null'"))
    q = _predictor(load=True)
    q.use_adaptation(storage=pg_url)
    q.predict_graphs(gs[:1], mig=False)  # set aside (a warning naming the store), refitted (a row left out)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE dippm_adaptation_versions"))
        conn.execute(sa.text("CREATE TABLE dippm_adaptation_versions (x INTEGER)"))
    engine.dispose()
    assert isinstance(said.raised(p.adapt, _rows(gs[12:14], y[12:14]), storage=pg_url), AdaptationError)
    text = said.all(recwarn)
    assert text and password not in text, f"the password reached a message:\n{text}"


# ======================================================================== stored adaptations: wrong values
def _sqlite(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def _key(space: str = "any") -> AdaptationKey:
    return AdaptationKey(DEV, deployment_key(DEV), space)


def _version_row(db: Path, key: AdaptationKey) -> dict[str, Any]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return dict(conn.execute("SELECT * FROM dippm_adaptation_versions WHERE key_digest = ? ORDER BY version "
                                 "DESC LIMIT 1", (key.digest,)).fetchone())


def test_a_version_copied_from_another_key_is_set_aside_not_served(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    db = _sqlite(url)
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    p.adapt(_rows(gs[:20], y[:20]), storage=url, space="small")
    want = [x.latency_ms for x in p.predict_graphs(gs[30:33], mig=False)]
    p.adapt(_rows(gs[:20], 3.1 * y[:20]), storage=url, space="big")
    big = _version_row(db, _key("big"))
    with sqlite3.connect(db) as conn:  # the other key's whole version, copied into this key's row
        conn.execute("UPDATE dippm_adaptation_versions SET meta_json = ?, arrays = ?, checksum = ?, rows = ?, "
                     "checkpoint_sha256 = ?, key_json = ? WHERE key_digest = ?",
                     (big["meta_json"], big["arrays"], big["checksum"], big["rows"], big["checkpoint_sha256"],
                      big["key_json"], _key("small").digest))
    q = _predictor(load=True)
    q.use_adaptation(storage=url, space="small")
    with pytest.warns(RuntimeWarning, match="set aside"):
        got = q.predict_graphs(gs[30:33], mig=False)
    assert "checksum" in q.adaptation_flag and got[0].details["adaptation_flagged"] == 1.0
    assert q.adaptation.key == _key("small")  # refitted from this key's own rows: this key's answer
    np.testing.assert_allclose([x.latency_ms for x in got], want, rtol=1e-6)


def _old_checksum(meta_json: str, arrays: bytes) -> str:
    """A plain SHA-256 of the meta JSON and arrays: what someone editing the row by hand recomputes."""
    return hashlib.sha256(meta_json.encode() + b"\0" + arrays).hexdigest()


def test_meta_edited_with_a_recomputed_plain_sha256_is_set_aside(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    db = _sqlite(url)
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    p.adapt(_rows(gs[:20], y[:20]), storage=url)
    want = [x.latency_ms for x in p.predict_graphs(gs[30:33], mig=False)]
    row = _version_row(db, _key())
    d = json.loads(row["meta_json"])
    if d["calibration"] is not None:  # the calibrated latency x3
        d["calibration"]["coef"]["latency_ms"][0] += 1.1
    else:  # the guard kept no factor calibration: the heads' outputs shifted instead
        d["heads"][0]["bound"] *= 3.0
    meta = json.dumps(d, sort_keys=True)
    assert meta != row["meta_json"]
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE dippm_adaptation_versions SET meta_json = ?, checksum = ? WHERE id = ?",
                     (meta, _old_checksum(meta, row["arrays"]), row["id"]))
    q = _predictor(load=True)
    q.use_adaptation(storage=url)
    with pytest.warns(RuntimeWarning, match="set aside"):
        got = q.predict_graphs(gs[30:33], mig=False)
    assert "checksum" in q.adaptation_flag and got[0].details["adaptation_flagged"] == 1.0
    np.testing.assert_allclose([x.latency_ms for x in got], want, rtol=1e-6)


def test_edited_measurement_rows_are_detected_flagged_and_left_out(tmp_path: Path, caplog: Any) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    db = _sqlite(url)
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    p.adapt(_rows(gs[:16], y[:16]), storage=url)
    with sqlite3.connect(db) as conn:  # the latencies of 6 rows x1.5, checksums left as they were
        conn.execute("UPDATE dippm_adaptation_rows SET labels_json = json_set(labels_json, '$.latency_ms', "
                     "json_extract(labels_json, '$.latency_ms') * 1.5) WHERE id <= 6")
    with caplog.at_level(logging.WARNING):
        ad = p.adapt(_rows(gs[16:18], y[16:18]), storage=url)  # one honest adapt(): the refit reads every row
    assert ad.rows_ignored == 6 and ad.rows == 12
    assert sum("left out" in r.getMessage() for r in caplog.records) == 6
    pred = p.predict_graphs(gs[30:31], mig=False)[0]
    assert pred.details["adaptation_rows_ignored"] == 6.0
    # the answer is the adaptation of the sound rows alone, not moved by the edited ones
    ref = _predictor()
    ref.adapt(_rows(gs[6:18], y[6:18]), persist=False)
    np.testing.assert_allclose(pred.latency_ms, ref.predict_graphs(gs[30:31], mig=False)[0].latency_ms, rtol=1e-6)


# ======================================================================== damaged adaptations never crash predict
def _npz_declaring(n: int) -> bytes:
    """An .npz whose one array's header declares ``n`` float64 elements and holds 8 bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (n,)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("latency_ms.mean.npy", b"\x93NUMPY\x01\x00" + header.getvalue()[8:] + b"\0" * 8)
    return buf.getvalue()


def _reseal(db: Path, key: AdaptationKey) -> None:
    """Recompute the newest version's checksum after an edit, as the code that wrote it would, so the damage
    reaches the decoder."""
    row = _version_row(db, key)
    try:
        from dippm_nas.predictor._adapt_rows import version_checksum
    except ImportError:  # a tree without keyed checksums
        checksum = _old_checksum(str(row["meta_json"]), bytes(row["arrays"]))
    else:
        checksum = version_checksum(key.digest, row["checkpoint_sha256"], row["rows"], row["meta_json"],
                                    row["arrays"])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE dippm_adaptation_versions SET checksum = ? WHERE id = ?", (checksum, row["id"]))


DAMAGE = {
    "text in arrays": ("UPDATE dippm_adaptation_versions SET arrays = 'not an npz'", False),
    "text in version": ("UPDATE dippm_adaptation_versions SET version = 'two'", False),
    "deeply nested meta": ("UPDATE dippm_adaptation_versions SET meta_json = ?", True),
    "meta null": ("UPDATE dippm_adaptation_versions SET meta_json = 'null'", True),
    "npz declaring 1e13 elements": ("UPDATE dippm_adaptation_versions SET arrays = ?", True),
    "calibration of another type": ("UPDATE dippm_adaptation_versions SET meta_json = json_set(meta_json, "
                                    "'$.calibration', 'abc')", True),
}


@pytest.mark.parametrize("damage", [*DAMAGE, "garbage file"])
def test_a_damaged_adaptation_is_flagged_and_ignored_never_raised(tmp_path: Path, damage: str) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    db = _sqlite(url)
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    if damage == "garbage file":
        db.write_bytes(b"this is not a SQLite database " * 200)
    else:
        p.adapt(_rows(gs[:12], y[:12]), storage=url)
        sql, reseal = DAMAGE[damage]
        args: tuple[Any, ...] = ()
        if damage == "deeply nested meta":
            args = ("[" * 100_000 + "]" * 100_000,)
        elif damage.startswith("npz"):
            args = (_npz_declaring(10**13),)
        with sqlite3.connect(db) as conn:
            conn.execute(sql, args)
        if reseal:
            _reseal(db, _key())
    q = _predictor(load=True)
    q.use_adaptation(storage=url)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        pred = q.predict_graphs(gs[:2], mig=False)[0]
    flags = {k: pred.details.get(k) for k in ("adaptation_ignored", "adaptation_flagged")}
    assert 1.0 in flags.values(), flags
    assert q.adaptation_flag and any("set aside" in str(w.message) or "not read" in str(w.message) for w in said)


def test_a_store_of_another_layout_or_schema_version_is_refused_and_predictions_flagged(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:  # rows without checksums
        conn.execute("CREATE TABLE dippm_adaptation_rows (id INTEGER PRIMARY KEY, key_digest TEXT, key_json TEXT, "
                     "graph_digest TEXT, graph_json_z BLOB, labels_json TEXT, writer TEXT, created_at REAL)")
    with pytest.raises(AdaptationError, match="older layout"):
        AdaptationStore(f"sqlite:///{old}")
    url = f"sqlite:///{tmp_path / 'a.db'}"
    AdaptationStore(url).close()
    with sqlite3.connect(_sqlite(url)) as conn:
        conn.execute("UPDATE dippm_adaptation_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(AdaptationError, match="schema_version 99"):
        AdaptationStore(url)
    with sqlite3.connect(old) as conn:  # a version of the older layout, with its plain SHA-256
        conn.execute("CREATE TABLE dippm_adaptation_versions (id INTEGER PRIMARY KEY, key_digest TEXT, "
                     "version INTEGER, key_json TEXT, checkpoint_sha256 TEXT, rows INTEGER, meta_json TEXT, "
                     "arrays BLOB, checksum TEXT, created_at REAL)")
        conn.execute("INSERT INTO dippm_adaptation_versions VALUES (1, ?, 1, ?, 'c', 2, '{}', x'00', ?, 0)",
                     (_key().digest, _key().to_json(), _old_checksum("{}", b"\0")))
    q = _predictor(load=True)
    q.use_adaptation(storage=f"sqlite:///{old}")
    with pytest.warns(RuntimeWarning, match="older layout"):  # set aside; its refit opens the store: refused
        assert q.predict_graphs(_graphs()[:1], mig=False)[0].details["adaptation_ignored"] == 1.0


def test_a_damaged_version_number_makes_adapt_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    p.adapt(_rows(gs[:12], y[:12]), storage=url)
    with sqlite3.connect(_sqlite(url)) as conn:
        conn.execute("UPDATE dippm_adaptation_versions SET version = 'two'")
    with pytest.raises(AdaptationError, match="not an integer"):
        p.adapt(_rows(gs[12:14], y[12:14]), storage=url)


# ======================================================================== storage URLs and arguments
def test_a_port_that_is_not_a_number_is_a_clear_error_everywhere(tmp_path: Path, said: Said, recwarn: Any) -> None:
    from dippm_nas.cli import main
    from dippm_nas.optuna import rdb_storage
    from dippm_nas.validation import JobQueue

    for fn in (AdaptationStore, JobQueue, rdb_storage):
        e = said.raised(fn, PG_BAD_PORT)
        assert isinstance(e, DippmNasError) and "port" in str(e), (fn, e)
    p = _predictor()
    gs = _graphs()
    y = _truth(p, gs)
    e = said.raised(p.adapt, _rows(gs[:4], y[:4]), storage=PG_BAD_PORT)
    assert isinstance(e, AdaptationError) and "port" in str(e)
    q = _predictor(load=True)
    q.use_adaptation(storage=PG_BAD_PORT)
    pred = q.predict_graphs(gs[:1], mig=False)[0]  # flagged, not raised
    assert pred.details["adaptation_ignored"] == 1.0
    code = main(["validate-worker", "--storage", PG_BAD_PORT, "--device", "host-cpu", "--idle-exit", "0"])
    assert code == 1
    _no_password(said.all(recwarn))


def test_rdb_storage_wraps_a_missing_driver_with_the_install_hint() -> None:
    import importlib.util

    from dippm_nas.optuna import rdb_storage

    if importlib.util.find_spec("pymysql") is not None:
        pytest.skip("needs a driver that is not installed: pymysql is")
    with pytest.raises(MissingDependencyError, match="pip install") as e:
        rdb_storage(f"mysql+pymysql://u:{PW}@127.0.0.1/db")
    assert PW not in str(e.value)


@pytest.mark.parametrize("bad", [None, 3, "rows", {"latency_ms": 1.0}])
def test_adapt_of_something_that_is_not_a_list_of_pairs_is_a_clear_error(bad: Any) -> None:
    with pytest.raises(InvalidTypeError, match="list of"):
        _predictor().adapt(bad, persist=False)


@pytest.mark.parametrize("kwargs", [{"storage": 3}, {"storage": ""}, {"space": 3}, {"space": ""}])
def test_adapt_and_use_adaptation_refuse_a_storage_or_space_of_another_type(kwargs: dict[str, Any]) -> None:
    p = _predictor()
    gs = _graphs()
    with pytest.raises(InvalidTypeError, match=next(iter(kwargs))):
        p.adapt([(gs[0], {"latency_ms": 1.0}), (gs[1], {"latency_ms": 2.0})], persist=False, **kwargs)
    with pytest.raises(InvalidTypeError, match=next(iter(kwargs))):
        p.use_adaptation(**kwargs)



@pytest.mark.parametrize("url, shown", [
    (f"postgresql+psycopg2://u:{PW}@h:5432/db", "postgresql+psycopg2://u:***@h:5432/db"),
    (f"postgresql://u:{PW}%40x@h/db", "postgresql://u:***@h/db"),
    (f"postgresql://u:{PW}@x/y@h/db", "postgresql://u:***@h/db"),  # an unescaped '@' and '/': all masked
    (f"postgresql://u@h/db?sslmode=require&password={PW}", "postgresql://u@h/db?sslmode=require&password=***"),
    ("sqlite:////tmp/a@b/c.db", "sqlite:////tmp/a@b/c.db"),
    ("postgresql://h:5432/db", "postgresql://h:5432/db"),
])
def test_redact_url_masks_every_form_of_a_password(url: str, shown: str) -> None:
    import sqlalchemy as sa

    from urllib.parse import unquote

    from dippm_nas._redact import redact_url, scrub

    assert redact_url(url) == shown
    assert PW not in redact_url(sa.engine.make_url(url))
    assert PW not in scrub(f"driver said: {url} (decoded: {unquote(url)})", url)
