"""Bad input on purpose: every case of ``docs/reliability.md``, one or more tests each.

The rule each test checks: no crash (every failure is a :class:`DippmNasError` the caller can catch, or a
result that says why), no silent wrong value (a stale or foreign graph is never served as the model's), and
nothing lost (a claimed validation job is measured, released or failed with its reason, never dropped).

Queue and cache tests run on SQLite and, marked ``postgres``, on PostgreSQL (``DIPPM_NAS_TEST_PG_URL``,
which ``.ci/run`` exports after starting a server; each run works in a fresh schema dropped afterwards).
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
import torch
from torch import nn

import dippm_nas.cache._store as cache_store
import dippm_nas.validation._queue as queue_mod
from dippm_nas import capture, capture_many
from dippm_nas.cache import ConversionCache, set_default_cache
from dippm_nas.devices import get_device, list_devices
from dippm_nas.errors import (
    DeviceError,
    DippmNasError,
    GraphCaptureError,
    InputSpecError,
    ModelSpecError,
    ValidationError,
)
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.optuna import optuna_has_set_constraint
from dippm_nas.capture import load_model
from dippm_nas.spec import InputSpec
from dippm_nas.validation import JOBS_TABLE, JobQueue, ValidationWorker

from _models import DataDependent, TinyBert, TinyResNet, TinyViT

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[1]
SPEC4 = InputSpec(shape=(4,), batch_size=2)
IMG = InputSpec(shape=(3, 32, 32), batch_size=2)
BERT = InputSpec(inputs={"input_ids": ((16,), "int64"), "attention_mask": ((16,), "int64")}, batch_size=2)
MLP = {"in_features": 4, "hidden": [8], "out_features": 2}
FAST = MeasureSettings(warmup=1, min_repeats=2, max_repeats=2, time_cap_s=10.0)


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database: a SQLite file, or a fresh PostgreSQL schema (``postgres`` tests)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    return request.getfixturevalue("pg_url")


def _sql(url: str, statement: str, **params: Any) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            res = conn.execute(sa.text(statement), params)
            return list(res) if res.returns_rows else []
    finally:
        engine.dispose()


def _fake_measure(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
    return Measurement(latency_ms=1.0, latency_ms_std=0.01, energy_j=None, memory_mib=1.0, memory_source="rss_delta",
                       n_repeats=2, device="cpu", environment={"fake": True},
                       energy_reason="faked in this test")


# =========================================================================== case 1: the validation queue
def _enqueue(q: JobQueue, n: int, study: str = "s") -> list[int]:
    return [q.enqueue(study=study, trial_number=i, space="mlp", config=MLP, spec=SPEC4.to_dict(), device="host-cpu",
                      predicted={"latency_ms": 1.0}) for i in range(n)]


def _poison(url: str, job_id: int) -> None:
    _sql(url, f"UPDATE {JOBS_TABLE} SET config_json = :bad WHERE id = :id", bad="{not json", id=job_id)


def test_case1_poison_row_is_failed_with_its_reason_and_claims_go_on(db_url: str) -> None:
    q = JobQueue(db_url)
    ids = _enqueue(q, 3)
    _poison(db_url, ids[0])  # the first the queue would hand out
    claimed = []
    while (job := q.claim("host-cpu", "w1")) is not None:  # never raises
        claimed.append(job.id)
    assert claimed == ids[1:]
    ((status, error, owner),) = _sql(db_url, f"SELECT status, error, lease_owner FROM {JOBS_TABLE} WHERE id = :id",
                                     id=ids[0])
    assert status == "failed" and "config_json" in error and owner is None
    listed = q.jobs()  # one bad row never makes the listing raise
    assert [j.id for j in listed] == ids[1:]
    assert q.counts()["failed"] == 1
    with pytest.raises(ValidationError, match="cannot be decoded"):
        q.get(ids[0])
    q.close()


def test_case1_batch_worker_measures_every_valid_job_beside_a_poison_row(db_url: str) -> None:
    q = JobQueue(db_url)
    ids = _enqueue(q, 4)
    _poison(db_url, ids[1])
    worker = ValidationWorker(q, "host-cpu", measure_fn=_fake_measure, settings=FAST, rounds=1, rounds_batch=4)
    worker.run(idle_timeout_s=0, poll_s=0)
    by_id = {j.id: j for j in q.jobs()}
    for i in (ids[0], ids[2], ids[3]):
        assert by_id[i].status == "done" and by_id[i].attempts == 1
    assert q.counts() == {"queued": 0, "leased": 0, "done": 3, "failed": 1}
    assert len(q.results()) == 3
    q.close()


def test_case1_stop_releases_claimed_jobs_without_spending_an_attempt(db_url: str) -> None:
    q = JobQueue(db_url)
    ids = _enqueue(q, 3)
    stop = threading.Event()

    def measure_then_stop(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
        stop.set()  # SIGTERM arrives while the first job of the batch is measured
        return _fake_measure(model, spec, device, settings)

    worker = ValidationWorker(q, "host-cpu", measure_fn=measure_then_stop, settings=FAST, rounds=1, rounds_batch=3)
    worker.run(stop=stop, idle_timeout_s=0, poll_s=0)
    jobs = q.jobs()
    assert [(j.status, j.attempts, j.lease_owner) for j in jobs] == [("queued", 0, None)] * 3
    # the next worker measures all three, each on its first attempt
    ValidationWorker(q, "host-cpu", measure_fn=_fake_measure, settings=FAST).run(idle_timeout_s=0, poll_s=0)
    assert [(j.id, j.status, j.attempts) for j in q.jobs()] == [(i, "done", 1) for i in ids]
    q.close()


def test_case1_keyboard_interrupt_releases_claimed_jobs(db_url: str) -> None:
    q = JobQueue(db_url)
    _enqueue(q, 3)

    def interrupted(*_a: Any) -> Measurement:
        raise KeyboardInterrupt

    worker = ValidationWorker(q, "host-cpu", measure_fn=interrupted, settings=FAST, rounds=1, rounds_batch=3)
    with pytest.raises(KeyboardInterrupt):
        worker.run(idle_timeout_s=0, poll_s=0)
    assert [(j.status, j.attempts) for j in q.jobs()] == [("queued", 0)] * 3
    one = ValidationWorker(q, "host-cpu", measure_fn=interrupted, settings=FAST)  # one job at a time
    with pytest.raises(KeyboardInterrupt):
        one.run(idle_timeout_s=0, poll_s=0)
    assert [(j.status, j.attempts) for j in q.jobs()] == [("queued", 0)] * 3
    q.close()


def test_case1_dead_worker_job_is_requeued_within_the_default_heartbeat_bound(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(queue_mod, "_now", lambda _conn: clock[0])
    q = JobQueue(db_url)  # defaults: the bound a user gets
    assert q.lease_s <= 60.0
    (job_id,) = _enqueue(q, 1)
    assert q.claim("host-cpu", "dies-now") is not None  # then SIGKILL: no heartbeat ever again
    clock[0] += q.lease_s / 2
    assert q.claim("host-cpu", "survivor") is None  # still leased
    clock[0] += q.lease_s / 2 + 1.0
    job = q.claim("host-cpu", "survivor")
    assert job is not None and job.id == job_id and job.attempts == 2
    q.close()


def test_case1_heartbeat_keeps_a_live_worker_lease(db_url: str) -> None:
    q = JobQueue(db_url, lease_s=0.6)  # heartbeat every 0.2 s
    _enqueue(q, 1)
    other = JobQueue(db_url, lease_s=0.6)
    seen: list[Any] = []

    def slow(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
        import time

        time.sleep(1.5)  # 2.5 leases
        seen.append(other.claim("host-cpu", "thief"))
        return _fake_measure(model, spec, device, settings)

    ValidationWorker(q, "host-cpu", measure_fn=slow, settings=FAST).run(idle_timeout_s=0, poll_s=0)
    assert seen == [None]
    (job,) = q.jobs()
    assert job.status == "done" and job.attempts == 1
    other.close()
    q.close()


# ================================================================ case 2: cache payloads bound to their key
class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Bigger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x))))).softmax(-1)


def test_case2_row_holding_another_models_graph_is_a_corrupt_miss(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    cache = ConversionCache(db_url)
    small = capture(Small(), SPEC4, cache=cache)
    big = capture(Bigger(), SPEC4, cache=cache)
    assert big.num_nodes != small.num_nodes
    cache.close()
    # someone writes the other model's (valid) row under this key: payload and hash
    _sql(db_url, "UPDATE dippm_conversion_cache SET payload = (SELECT payload FROM dippm_conversion_cache WHERE key = :b), "
         "structural_hash = (SELECT structural_hash FROM dippm_conversion_cache WHERE key = :b) WHERE key = :s",
         b=big.model_key, s=small.model_key)
    cache = ConversionCache(db_url)
    cache_store._warn_once.reset()  # warned once per key and process: the other database's run was first
    with caplog.at_level(logging.WARNING, logger="dippm_nas.cache._store"):
        again = capture(Small(), SPEC4, cache=cache)
    assert not again.cache_hit and again.num_nodes == small.num_nodes
    assert again.structural_hash() == small.structural_hash()
    assert any("another key" in r.getMessage() for r in caplog.records)
    assert cache.stats()["corrupt"] == 1
    assert capture(Small(), SPEC4, cache=cache).cache_hit  # recaptured and stored again
    cache.close()


def test_case2_structural_hash_column_must_match_the_payload(db_url: str) -> None:
    cache = ConversionCache(db_url)
    g = capture(Small(), SPEC4, cache=cache)
    cache.close()
    _sql(db_url, "UPDATE dippm_conversion_cache SET structural_hash = :h WHERE key = :k", h="0" * 64, k=g.model_key)
    cache = ConversionCache(db_url)
    assert cache.get(g.model_key) is None and cache.stats()["corrupt"] == 1
    cache.close()


def test_case2_hmac_secret_rejects_unsigned_and_foreign_rows(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.cache import CACHE_SECRET_ENV

    monkeypatch.delenv(CACHE_SECRET_ENV, raising=False)
    g = capture(Small(), SPEC4, cache=False)
    key = g.model_key

    def put_with(secret: str | None) -> None:
        c = ConversionCache(db_url, secret=secret)
        c.put(key, g)
        c.close()

    def get_with(secret: str | None) -> Any:
        c = ConversionCache(db_url, secret=secret)
        try:
            return c.get(key), c.stats()["corrupt"]
        finally:
            c.close()

    put_with(None)  # unsigned row
    assert get_with(None)[0] is not None  # no secret: binding to the key is checked, no signature needed
    assert get_with("s1") == (None, 1)  # a secret is set: unsigned rows are rejected (and dropped)
    put_with("s2")
    assert get_with("s1") == (None, 1)  # signed with another secret
    put_with("s1")
    hit, corrupt = get_with("s1")
    assert hit is not None and corrupt == 0 and hit.structural_hash() == g.structural_hash()
    monkeypatch.setenv(CACHE_SECRET_ENV, "s1")  # the environment variable sets it too
    assert get_with(None)[0] is not None
    assert get_with("s3") == (None, 1)


# =============================================================== case 3: a broken cache file or directory
@pytest.fixture
def fresh_default_cache(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("DIPPM_NAS_CACHE_URL", raising=False)
    set_default_cache(None)
    yield
    set_default_cache(None)


def test_case3_malformed_sqlite_file_is_moved_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    fresh_default_cache: Any) -> None:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    (tmp_path / "conversion.sqlite").write_bytes(b"this is not a SQLite database\n" * 200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture(Small(), SPEC4)  # the default cache
    assert not g.cache_hit and g.num_nodes > 0
    aside = list(tmp_path.glob("conversion.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    assert sum("moved aside" in str(w.message) for w in caught) == 1
    assert capture(Small(), SPEC4).cache_hit  # the new file works


def test_case3_unusable_cache_directory_captures_uncached_and_warns_once(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         fresh_default_cache: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(blocker / "cache"))  # cannot be created, even by root
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = capture(Small(), SPEC4)
        second = capture(Bigger(), SPEC4)
    assert not first.cache_hit and not second.cache_hit and second.num_nodes > first.num_nodes
    assert sum("capturing without it" in str(w.message) for w in caught) == 1


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_case3_read_only_cache_directory_captures_uncached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           fresh_default_cache: Any) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(ro))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = capture(Small(), SPEC4)
        assert not g.cache_hit and g.num_nodes > 0
    finally:
        ro.chmod(0o755)


@pytest.mark.postgres
def test_case3_unreachable_postgresql_cache_captures_uncached(pg_url: str, monkeypatch: pytest.MonkeyPatch,
                                                              fresh_default_cache: Any) -> None:
    missing_db = sa.engine.make_url(pg_url).set(database=f"no_such_db_{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("DIPPM_NAS_CACHE_URL", missing_db.render_as_string(hide_password=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture(Small(), SPEC4)
        capture(Small(), SPEC4)
    assert not g.cache_hit and g.num_nodes > 0
    assert sum("capturing without it" in str(w.message) for w in caught) == 1


@pytest.mark.postgres
def test_case3_postgresql_cache_table_of_another_shape_captures_uncached(pg_url: str) -> None:
    _sql(pg_url, "CREATE TABLE dippm_conversion_cache (key VARCHAR(255) PRIMARY KEY)")
    cache = ConversionCache(pg_url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(Small(), SPEC4, cache=cache)
    assert not g.cache_hit and g.num_nodes > 0
    cache.close()


# ==================================================================== case 4: SPEC strings and user code
def test_case4_standard_library_callables_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    monkeypatch.setattr(os, "abort", lambda *a: called.append("abort"))
    monkeypatch.setattr(os, "system", lambda *a: called.append("system"))
    for spec in ("os:abort", "os:system", "subprocess:run", "shutil:rmtree", "builtins:exit"):
        with pytest.raises(ModelSpecError, match="standard library"):
            load_model(spec)
    assert called == []


def test_case4_whatever_the_callable_raises_or_returns_is_a_model_spec_error(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    mod = f"advmods_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(
        "import sys\n"
        "from torch import nn\n"
        "def boom():\n    return 1 / 0\n"
        "def exits():\n    sys.exit(3)\n"
        "def number():\n    return 42\n"
        "def good():\n    return nn.Linear(4, 4)\n"
        "alias = print\n"
    )
    (tmp_path / f"{mod}_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, pattern in (("boom", "ZeroDivisionError"), ("exits", "SystemExit"), ("number", "returned int"),
                          ("alias", "defined in")):
        with pytest.raises(ModelSpecError, match=pattern):
            load_model(f"{mod}:{name}")
    with pytest.raises(ModelSpecError, match="broken at import"):
        load_model(f"{mod}_broken:anything")
    assert isinstance(load_model(f"{mod}:good"), nn.Linear)


def test_case4_working_directory_never_shadows_an_installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.cli import main

    marker = tmp_path / "shadow-imported"
    for name in ("torchvision", "timm"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name}\\n')\n")
    mod = f"mymodel_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text("from torch import nn\ndef build():\n    return nn.Linear(4, 4)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # where `python -m dippm_nas` puts the working directory
    for name in ("torchvision", "timm"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for spec in ("torchvision:resnet18", "timm:resnet18"):
        main(["inspect", spec, "--no-cache"])
        assert not marker.exists(), marker.read_text()
    # the package.module:callable form still finds a module of the working directory (appended, not prepended)
    assert main(["inspect", f"{mod}:build", "--shape", "4", "--no-cache", "--json"]) == 0
    assert '"num_nodes"' in capsys.readouterr().out
    assert not marker.exists()


@pytest.mark.slow
def test_case4_python_dash_m_does_not_shadow_installed_packages(tmp_path: Path) -> None:
    marker = tmp_path / "shadow-imported"
    (tmp_path / "torchvision.py").write_text(f"open({str(marker)!r}, 'a').write('torchvision')\n")
    (tmp_path / "mymodel.py").write_text("from torch import nn\ndef build():\n    return nn.Linear(4, 4)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "dippm_nas", "inspect", "torchvision:resnet18", "--no-cache"], cwd=tmp_path,
                   env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists()
    ok = subprocess.run([sys.executable, "-m", "dippm_nas", "inspect", "mymodel:build", "--shape", "4", "--no-cache"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]


# ============================================================= case 5: no real allocation of big inputs
def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_case5_spec_beyond_the_limit_is_an_input_spec_error() -> None:
    from dippm_nas.spec import MAX_INPUT_ELEMENTS

    with pytest.raises(InputSpecError, match="MAX_INPUT_ELEMENTS"):
        capture(TinyResNet(), InputSpec(shape=(3, 224, 224), batch_size=100_000_000), cache=False)
    with pytest.raises(InputSpecError, match="at most"):
        InputSpec(inputs={"ids": ((MAX_INPUT_ELEMENTS + 1,), "int64")})
    assert InputSpec(shape=(MAX_INPUT_ELEMENTS,)).batch_size == 1


def test_case5_huge_batch_is_captured_without_allocating_it() -> None:
    before = _maxrss_mib()
    spec = InputSpec(shape=(3, 32, 32), batch_size=100_000_000)  # 1.2 TB of float32 input
    g = capture(TinyResNet(), spec, cache=False)
    assert g.spec.batch_size == 100_000_000 and g.total_flops > 1e14
    assert _maxrss_mib() - before < 1024


class LinearModel(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_case5_model_built_on_meta_is_captured() -> None:
    before = _maxrss_mib()
    with torch.device("meta"):
        model = LinearModel(200_000)  # 160 GB of float32 weights, never allocated
    g = capture(model, InputSpec(shape=(200_000,), batch_size=8), cache=False)
    assert g.param_count == 200_000 * 200_000 + 200_000
    assert _maxrss_mib() - before < 1024


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("build,spec", [(TinyResNet, IMG), (TinyViT, IMG), (TinyBert, BERT)])
def test_case5_meta_model_gives_the_real_models_graph_and_key(build: Any, spec: InputSpec, dtype: str) -> None:
    torch.manual_seed(0)
    real = build()
    with torch.device("meta"):
        meta = build()
    if dtype == "float16":
        real, meta = real.half(), meta.half()
    s = InputSpec(shape=spec.shape, inputs=spec.inputs, batch_size=spec.batch_size, dtype=dtype)
    g_real = capture(real, s, cache=False)
    g_meta = capture(meta, s, cache=False)
    assert g_meta.model_key == g_real.model_key
    assert g_meta.structural_hash() == g_real.structural_hash()
    assert g_meta.param_count == g_real.param_count
    assert all(p.device.type == "meta" for p in meta.parameters())  # the user's model is untouched


def test_case5_fake_and_meta_models_give_the_real_graph_in_every_mode() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = TinyResNet()
    with torch.device("meta"):
        meta = TinyResNet()
    real = capture(TinyResNet(), IMG, cache=False)
    assert capture(fake, IMG, cache=False).structural_hash() == real.structural_hash()
    decomposed = capture(TinyResNet(), IMG, cache=False, decompose=True)
    assert capture(meta, IMG, cache=False, decompose=True).structural_hash() == decomposed.structural_hash()


class TiedLM(nn.Module):
    """Token embedding and output head share one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.head = nn.Linear(16, 64, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(input_ids)))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_case5_tied_weights_count_once_real_or_meta(dtype: str) -> None:
    spec = InputSpec(inputs={"input_ids": ((8,), "int64")}, batch_size=2, dtype=dtype)
    real = TiedLM()
    with torch.device("meta"):
        meta = TiedLM()
    if dtype == "float16":
        real, meta = real.half(), meta.half()
    g_real, g_meta = capture(real, spec, cache=False), capture(meta, spec, cache=False)
    assert g_real.param_count == g_meta.param_count == 64 * 16
    assert g_real.structural_hash() == g_meta.structural_hash()


def test_case5_meta_model_hits_the_conversion_cache(tmp_path: Path) -> None:
    cache = ConversionCache(f"sqlite:///{tmp_path / 'c.sqlite'}")
    with torch.device("meta"):
        meta = TinyResNet()
    first = capture(meta, IMG, cache=cache)
    assert not first.cache_hit
    assert capture(meta, IMG, cache=cache).cache_hit
    hit = capture(TinyResNet(), IMG, cache=cache)  # the real model has the same definition, so the same key
    assert hit.cache_hit and hit.structural_hash() == first.structural_hash()
    cache.close()


class RaisesPlainError(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1228800000000 bytes")


class NumpyInForward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() * 2)


@pytest.mark.parametrize("model", [RaisesPlainError(), NumpyInForward()])
def test_case5_every_capture_failure_is_a_dippm_error(model: nn.Module) -> None:
    with pytest.raises(DippmNasError):
        capture(model, SPEC4, cache=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class DecoderLayer(nn.Module):
    """A LLaMA-style layer from plain torch modules: RMSNorm, causal SDPA, SiLU-gated MLP."""

    def __init__(self, dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(b, s, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, hidden, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


@pytest.mark.slow
def test_case5_a_7b_parameter_decoder_captures_on_this_machine() -> None:
    before = _maxrss_mib()
    with torch.device("meta"):
        model = Decoder(vocab=32_000, dim=4096, hidden=11_008, heads=32, layers=32).half()
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params > 6.7e9
    g = capture(model, InputSpec(inputs={"input_ids": ((128,), "int64")}, batch_size=1, dtype="float16"),
                cache=False)
    assert g.param_count == n_params
    assert _maxrss_mib() - before < 2048


def test_case5_a_small_decoder_gives_the_same_graph_real_and_meta() -> None:
    real = Decoder(vocab=64, dim=32, hidden=64, heads=4, layers=2)
    with torch.device("meta"):
        meta = Decoder(vocab=64, dim=32, hidden=64, heads=4, layers=2)
    spec = InputSpec(inputs={"input_ids": ((8,), "int64")}, batch_size=1)
    assert capture(meta, spec, cache=False).structural_hash() == capture(real, spec, cache=False).structural_hash()


# ======================================================================= case 6: on_error in Optuna
def _study_with(on_error: str | None) -> tuple[optuna.Study, Any]:
    from dippm_nas.optuna import Budgets, HardwareCostModel

    kwargs = {} if on_error is None else {"on_error": on_error}
    cost = HardwareCostModel(device="rtx-4090", budgets=Budgets(latency_ms=1e3), cache=False, **kwargs)
    study = cost.create_study(leading={})

    def objective(trial: optuna.Trial) -> Any:
        model = DataDependent() if trial.number == 1 else Small()
        return cost.evaluate(trial, model, SPEC4)

    return study, objective


@pytest.fixture
def quiet_analytic() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_case6_default_on_error_fails_the_trial_and_the_study_goes_on(quiet_analytic: Any) -> None:
    study, objective = _study_with(None)
    study.optimize(objective, n_trials=3)  # no catch=
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]
    assert "data-dependent" in study.trials[1].user_attrs["cost_model_error"]
    assert "predicted_latency_ms" not in study.trials[1].user_attrs


def test_case6_infeasible_completes_the_trial_with_its_constraints_violated(quiet_analytic: Any) -> None:
    study, objective = _study_with("infeasible")
    study.optimize(objective, n_trials=3)
    bad = study.trials[1]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert bad.values == [float("inf"), float("inf")]
    assert bad.user_attrs["feasible"] is False and bad.user_attrs["constraint_latency_ms"] == float("inf")
    assert "data-dependent" in bad.user_attrs["cost_model_error"]
    if optuna_has_set_constraint():  # Optuna 5: registered with trial.set_constraint
        assert bad.constraints["latency_ms"] > 0
    assert bad.number not in {t.number for t in study.best_trials}


def test_case6_raise_stops_the_study(quiet_analytic: Any) -> None:
    study, objective = _study_with("raise")
    with pytest.raises(GraphCaptureError):
        study.optimize(objective, n_trials=3)


def test_case6_unknown_on_error_lists_the_choices() -> None:
    from dippm_nas.optuna import HardwareCostModel

    with pytest.raises(DippmNasError, match=r"on_error must be one of \('fail', 'raise', 'infeasible'\)"):
        HardwareCostModel(on_error="ignore")  # type: ignore[arg-type]


# =============================================================== case 7: attributes that change forward
class Repeat(nn.Module):
    def __init__(self, reps: int, cfg: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self._reps = reps
        self.cfg = cfg or {"act": "relu"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self._reps):
            x = self.fc(x)
        return torch.relu(x) if self.cfg["act"] == "relu" else torch.tanh(x)


def test_case7_a_private_attribute_read_by_forward_changes_the_key(tmp_path: Path) -> None:
    cache = ConversionCache(f"sqlite:///{tmp_path / 'c.sqlite'}")
    one = capture(Repeat(1), SPEC4, cache=cache)
    four = capture(Repeat(4), SPEC4, cache=cache)
    assert not four.cache_hit and four.num_nodes > one.num_nodes
    tanh = capture(Repeat(1, {"act": "tanh"}), SPEC4, cache=cache)  # a dict attribute
    assert not tanh.cache_hit and "tanh" in tanh.summary()["ops"]
    assert capture(Repeat(4), SPEC4, cache=cache).cache_hit  # same definition, same key
    cache.close()


# ========================================================================= case 8: the smaller ones
def _device_file(dev_id: str) -> str:
    import importlib.resources

    text = (importlib.resources.files("dippm_nas.devices") / "data" / "rtx-4090.toml").read_text()
    return text.replace('id = "rtx-4090"', f'id = "{dev_id}"')


def test_case8_broken_user_device_file_affects_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "broken.toml").write_text('id = "broken-gpu"\nsms = [unclosed\n')
    (tmp_path / "lab.toml").write_text(_device_file("lab-gpu"))
    monkeypatch.setenv("DIPPM_NAS_DEVICE_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="dippm_nas.devices._registry"):
        assert get_device("a100-sxm4-40gb").id == "a100-sxm4-40gb"
        assert get_device("lab-gpu").id == "lab-gpu"
        assert "lab-gpu" in list_devices()
        with pytest.raises(DeviceError, match="broken.toml"):
            get_device("broken-gpu")  # the unknown-device message names the skipped file
    assert sum("broken.toml" in r.getMessage() for r in caplog.records) == 1


def test_case8_device_ids_are_case_normalised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.toml").write_text(_device_file("MyGPU"))
    monkeypatch.setenv("DIPPM_NAS_DEVICE_DIR", str(tmp_path))
    assert "mygpu" in list_devices() and "MyGPU" not in list_devices()
    assert get_device("MyGPU").id == "mygpu" and get_device("mygpu") is get_device("MYGPU")


def test_case8_corrupt_user_checkpoint_falls_back_to_the_shipped_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.predictor import get_predictor, set_predictor

    (tmp_path / "a100-sxm4-40gb.pt").write_bytes(b"\x00garbage, not a checkpoint" * 10)
    monkeypatch.setenv("DIPPM_NAS_CHECKPOINT_DIR", str(tmp_path))
    set_predictor("a100-sxm4-40gb", None)
    try:
        with pytest.warns(RuntimeWarning, match="falling back"):
            p = get_predictor("a100-sxm4-40gb")
        assert type(p).__name__ == "GnnPredictor"
    finally:
        set_predictor("a100-sxm4-40gb", None)


def _raise_zero_division() -> nn.Module:
    raise ZeroDivisionError("a builder that fails")


def test_case8_capture_many_returns_a_result_per_item(fresh_default_cache: Any) -> None:
    items: list[Any] = [(Small(), SPEC4), "not an item", (_raise_zero_division, SPEC4), (Small(), "not a spec"),
                        (DataDependent(), SPEC4), (Small(),)]
    results = capture_many(items, cache=False, progress=False)
    assert [r.index for r in results] == list(range(len(items)))
    assert [r.ok for r in results] == [True, False, False, False, False, False]
    assert [r.error_type for r in results[1:]] == ["InputSpecError", "ModelSpecError", "InputSpecError",
                                                   "GraphCaptureError", "InputSpecError"]
    assert "ZeroDivisionError: a builder that fails" in results[2].error


@pytest.mark.slow
def test_case8_capture_many_in_worker_processes_returns_a_result_per_item() -> None:
    items: list[Any] = [(Small(), SPEC4), "not an item", (DataDependent(), SPEC4), (Bigger(), SPEC4)]
    results = capture_many(items, workers=2, cache=False, progress=False)
    assert [r.ok for r in results] == [True, False, False, True]


def test_case8_data_dependent_control_flow_prints_no_fx_graph(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(GraphCaptureError, match="data-dependent"):
        capture(DataDependent(), SPEC4, cache=False)
    err = capfd.readouterr().err
    assert "def forward" not in err and "torch.ops.aten" not in err
