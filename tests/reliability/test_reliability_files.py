"""Files, locks and clocks: the rows of docs/reliability.md's "Files, locks and clocks" section.

Each test feeds one bad file, row or clock to the reader that meets it and checks what the user gets: a
`DippmNasError` naming the file, the field, the value and what is expected; a flagged fallback; or the
right figure. The queue tests run on SQLite and, marked `postgres`, on PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import dippm_nas.validation._queue as queue_mod
from dippm_nas._json import MAX_JSON_DEPTH, json_depth, loads_json, read_json_file
from dippm_nas.devices import (DEVICE_DIR_ENV, HostProfile, get_device, list_devices, register_device,
                               resolve_host_profile)
from dippm_nas.devices import _host
from dippm_nas.errors import CheckpointError, DeviceError, DippmNasError, GraphValidationError, InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.measure._rapl import RaplCounter, probe_rapl
from dippm_nas.optuna import rdb_storage
from dippm_nas.predictor import ANALYTIC_IDENTITY, CheckpointMeta, calibration_path, load_calibration
from dippm_nas.prior import PriorParams
from dippm_nas.spec import InputSpec
from dippm_nas.validation import JOBS_TABLE, JobQueue, ValidationWorker

#: JSON nested far deeper than Python's recursion limit: ``json.loads`` raises RecursionError on it.
DEEP = "[" * 100_000 + "]" * 100_000
SPEC4 = InputSpec(shape=(4,), batch_size=2)
MLP = {"in_features": 4, "hidden": [8], "out_features": 2}
FAST = MeasureSettings(warmup=1, min_repeats=2, max_repeats=2, time_cap_s=10.0)
#: The fields a user device file must set (an RTX 4090's spec-sheet figures).
GPU_TOML = """id = "lab-gpu"
name = "Lab GPU"
kind = "gpu"
architecture = "ada"
sms = 128
fp32_tflops = 82.6
memory_gib = 24.0
bandwidth_gbps = 1008.0
l2_mib = 72.0
"""


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    return request.getfixturevalue("pg_url")


def _device_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **files: str) -> Path:
    d = tmp_path / "devices"
    d.mkdir()
    for name, text in files.items():
        (d / f"{name}.toml").write_text(text)
    monkeypatch.setenv(DEVICE_DIR_ENV, str(d))
    return d


# ====================================================================== schema-checked readers (item 6)
@pytest.mark.parametrize("line, field, expected", [
    ('checks = "fp32_tflops"', "checks = 'fp32_tflops'", "a list of strings"),
    ('sources = ["a"]', "sources = \\['a'\\]", "a table \\(object\\) of strings"),
    ("notes = 3", "notes = 3", "a string"),
    ('sms = "128"', "sms = '128'", "an integer"),
    ("sms = true", "sms = True", "an integer"),
])
def test_a_user_device_file_value_of_the_wrong_type_names_file_field_value_and_type(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, field: str, expected: str) -> None:
    key = line.split(" ", 1)[0]
    text = "\n".join(x for x in GPU_TOML.splitlines() if not x.startswith(f"{key} ")) + f"\n{line}\n"
    _device_dir(tmp_path, monkeypatch, lab=text)
    with pytest.raises(DeviceError, match=f"lab.toml: {field}: expected {expected}"):
        get_device("lab-gpu")
    assert get_device("a100-sxm4-40gb").id == "a100-sxm4-40gb"  # the other devices are not affected


def test_a_user_device_file_name_of_another_type_and_nested_keys_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _device_dir(tmp_path, monkeypatch, lab=GPU_TOML.replace('name = "Lab GPU"', "name = 5") +
                '[[mig_profiles]]\nname = "1g.5gb"\ncompute_slices = 1\nmemory_slices = 1\nmemory_gib = 5.0\n'
                'max_instances = 7\ncolour = "red"\n')
    with pytest.raises(DeviceError) as e:
        get_device("lab-gpu")
    assert "name = 5: expected a string" in str(e.value)
    assert "mig_profiles[0]: unknown keys ['colour']; choices: [" in str(e.value)


def test_register_device_refuses_a_none_architecture() -> None:
    d = {**get_device("rtx-4090").to_dict(), "id": "lab-none", "architecture": None}
    with pytest.raises(DeviceError, match="register_device\\(\\): architecture = None: expected a string"):
        register_device(d)
    assert "lab-none" not in list_devices()


def test_a_valid_user_device_file_gives_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _device_dir(tmp_path, monkeypatch, lab=GPU_TOML + 'checks = ["fp32_tflops"]\n[sources]\nfp32_tflops = "sheet"\n')
    dev = get_device("lab-gpu")
    assert dev.checks == ("fp32_tflops",) and dev.sources == {"fp32_tflops": "sheet"} and dev.sms == 128


def test_a_calibration_file_with_a_global_section_of_another_type(tmp_path: Path) -> None:
    d = PriorParams.uncalibrated().to_dict()
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({**d, "global": "oops"}))
    with pytest.raises(InvalidValueError, match="cal.json: global = 'oops': expected a table"):
        PriorParams.load(path)
    path.write_text(json.dumps({**d, "global": {**d["global"], "l2_speedup": "2"}}))
    with pytest.raises(InvalidValueError, match="global: l2_speedup = '2': expected a number"):
        PriorParams.load(path)
    path.write_text(json.dumps(d))
    assert PriorParams.load(path) == PriorParams.uncalibrated()


def test_a_power_file_field_of_another_type(tmp_path: Path) -> None:
    from dippm_nas.prior import PowerTable, power_table

    d = power_table().to_dict()
    path = tmp_path / "power.json"
    arch = next(iter(d["architectures"]))
    path.write_text(json.dumps({**d, "architectures": {arch: {**d["architectures"][arch], "sigma_log": "x"}}}))
    with pytest.raises(InvalidValueError, match=f"power.json: architectures.{arch}.sigma_log = 'x': expected a number"):
        PowerTable.load(path)
    path.write_text(json.dumps(d))
    assert PowerTable.load(path) == power_table()


def test_a_host_profile_field_of_another_type(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"format": 1, "name": 5, "speed": 1.2}))
    with pytest.raises(DeviceError, match="host profile .*host.json.*: name = 5: expected a string"):
        resolve_host_profile(str(path))
    path.write_text(json.dumps({"format": 1, "name": "lab", "speed": 1.2, "clock_ghz": None}))
    assert resolve_host_profile(str(path)) == HostProfile(name="lab", speed=1.2)


def test_checkpoint_metadata_of_a_user_checkpoint_is_checked_field_by_field() -> None:
    from dippm_nas.predictor import find_checkpoint

    side = find_checkpoint("a100-sxm4-40gb").with_suffix(".json")
    d = json.loads(side.read_text())
    with pytest.raises(CheckpointError, match="my.pt: data_sources = 'ryujaehun': expected a list of strings"):
        CheckpointMeta.from_json(json.dumps({**d, "data_sources": "ryujaehun"}), origin="my.pt")
    with pytest.raises(CheckpointError, match="my.pt: prior_params: global = 3: expected a table"):
        CheckpointMeta.from_json(json.dumps({**d, "prior_params": {**d["prior_params"], "global": 3}}), origin="my.pt")
    assert CheckpointMeta.from_json(side.read_text()) == CheckpointMeta.from_json(side.read_text(), trusted=True)


def test_every_shipped_file_passes_its_schema_and_builds_the_same_object_trusted() -> None:
    # the shipped files are built without the schema check (trusted): they must pass it, and the direct walk of
    # the type hints must give what pydantic's strict mode gives
    from importlib import resources

    import tomllib

    from dippm_nas import _schema
    from dippm_nas.devices import Device, device_from_dict
    from dippm_nas.predictor._checkpoint import SHIPPED_CHECKPOINT_DIR

    def both(cls: type, d: Any) -> Any:
        walked = _schema._exact(cls, d)
        assert walked == _schema._validate(_schema._adapter(cls), cls, d, "x", DippmNasError)
        return walked

    for entry in (resources.files("dippm_nas.devices") / "data").iterdir():
        d = tomllib.loads(entry.read_text(encoding="utf-8"))
        if d.get("measured"):  # host-cpu: the benchmark's facts filled in
            facts = {"fp32_tflops": 0.05, "bandwidth_gbps": 10.0, "host_dispatch_us": 5.0, "sms": 2,
                     "memory_gib": 8.0, "l2_mib": 32.0, "name": "Fake CPU", "architecture": "x86_64"}
            d = {**d, **{k: facts[k] for k in d["measured"]}}
        dev = device_from_dict(d, origin=entry.name, trusted=True)
        assert device_from_dict(d, origin=entry.name) == dev
        assert both(Device, {k: v for k, v in d.items() if k != "measured"}) == dev
    fitted = json.loads((resources.files("dippm_nas.prior") / "calibration" / "fitted.json").read_text())
    assert PriorParams.from_dict(fitted) == PriorParams.from_dict(fitted, trusted=True)
    from dippm_nas.prior import PowerTable

    power = json.loads((resources.files("dippm_nas.prior") / "calibration" / "power.json").read_text())
    assert PowerTable.from_dict(power) == PowerTable.from_dict(power, trusted=True)
    from dippm_nas.conformal import ConformalCalibration

    for side in sorted(SHIPPED_CHECKPOINT_DIR.glob("*.json")):
        text = side.read_text()
        if side.name.endswith(".conformal.json"):  # a checkpoint's conformal calibration, not its metadata
            cal = ConformalCalibration.load(side)
            assert ConformalCalibration.from_dict(json.loads(text)) == cal and cal.coverage
            continue
        meta = CheckpointMeta.from_json(text, trusted=True)
        assert CheckpointMeta.from_json(text, origin=side.name) == meta == both(CheckpointMeta, json.loads(text))
        assert json_depth(text) <= 6  # the figure MAX_JSON_DEPTH's comment gives


def test_valid_user_files_are_read_without_importing_pydantic(tmp_path: Path) -> None:
    # pydantic is imported only to explain (or accept) a file the direct walk does not accept
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "lab.toml").write_text(GPU_TOML + 'checks = ["fp32_tflops"]\n[sources]\nsms = "x"\n')
    (tmp_path / "host.json").write_text(json.dumps(HostProfile(name="lab", speed=1.5).to_dict()))
    code = ("import sys; from dippm_nas.devices import get_device, resolve_host_profile; "
            "from dippm_nas.predictor import CheckpointMeta, find_checkpoint; "
            "d = get_device('lab-gpu'); h = resolve_host_profile(sys.argv[1]); "
            "m = CheckpointMeta.from_json(find_checkpoint('a100-sxm4-40gb').with_suffix('.json').read_text()); "
            "print(d.sms, h.speed, m.device, 'pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "host.json")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, DEVICE_DIR_ENV: str(tmp_path / "devices")})
    assert out.stdout.split() == ["128", "1.5", "a100-sxm4-40gb", "False"], out.stderr


# =========================================================================== the bounded reader (item B)
def test_json_depth_ignores_brackets_inside_strings() -> None:
    assert json_depth('["[[[", {"a": "\\"]]]{"}]') == 2 and json_depth("1") == 0 and json_depth(b"[[1]]") == 2
    assert json_depth(DEEP) == 100_000
    with pytest.raises(InvalidValueError, match=f"100000 levels deep; at most {MAX_JSON_DEPTH}"):
        loads_json(DEEP, "x")


def test_deeply_nested_json_is_a_clear_error_in_every_reader(tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text(DEEP)
    with pytest.raises(DeviceError, match="host profile .*levels deep"):
        resolve_host_profile(str(host))
    with pytest.raises(CheckpointError, match="levels deep"):
        CheckpointMeta.from_json(DEEP)
    with pytest.raises(GraphValidationError, match="graph JSON.*levels deep"):  # cache rows, capture workers
        OperatorGraph.from_json(DEEP.encode())
    cal = tmp_path / "cal.json"
    cal.write_text('{"format": 1, "metrics": ' + DEEP + "}")
    with pytest.raises(InvalidValueError, match="levels deep"):
        PriorParams.load(cal)


def test_a_deeply_nested_checkpoint_sidecar_ranks_its_checkpoint_as_of_an_unknown_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from dippm_nas.predictor import host_checkpoints

    (tmp_path / "host-cpu--lab.pt").write_bytes(b"weights")
    (tmp_path / "host-cpu--lab.json").write_text(DEEP)
    monkeypatch.setenv("DIPPM_NAS_CHECKPOINT_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="dippm_nas.predictor._checkpoint"):
        found = dict(host_checkpoints())
    assert found[tmp_path / "host-cpu--lab.pt"] is None
    assert any("host-cpu--lab.json" in r.getMessage() and "levels deep" in r.getMessage() for r in caplog.records)


def _enqueue(q: JobQueue, n: int) -> list[int]:
    return [q.enqueue(study="s", trial_number=i, space="mlp", config=MLP, spec=SPEC4.to_dict(), device="host-cpu",
                      predicted={"latency_ms": 1.0}) for i in range(n)]


def _fake_measure(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
    return Measurement(latency_ms=1.0, latency_ms_std=0.01, energy_j=None, memory_mib=1.0, memory_source="rss_delta",
                       n_repeats=2, device="cpu", environment={"fake": True}, energy_reason="faked in this test")


def test_a_queue_row_with_deeply_nested_config_json_is_failed_and_the_worker_goes_on(db_url: str) -> None:
    q = JobQueue(db_url)
    ids = _enqueue(q, 3)
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {JOBS_TABLE} SET config_json = :bad WHERE id = :id"), {"bad": DEEP, "id": ids[0]})
    engine.dispose()
    ValidationWorker(q, "host-cpu", measure_fn=_fake_measure, settings=FAST).run(idle_timeout_s=0, poll_s=0)
    by_id = {j.id: j for j in q.jobs()}
    assert ids[0] not in by_id and all(by_id[i].status == "done" for i in ids[1:])
    assert q.counts() == {"queued": 0, "leased": 0, "done": 2, "failed": 1}
    with pytest.raises(DippmNasError, match="config_json: it nests arrays/objects 100000 levels deep"):
        q.get(ids[0])
    q.close()


# ============================================================= malformed caches and calibrations (item C)
@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, int]:
    calls = {"n": 0}

    def fake_measure(threads: int | None = None) -> dict[str, Any]:
        calls["n"] += 1
        return {"fp32_tflops": 0.05, "bandwidth_gbps": 10.0, "host_dispatch_us": 5.0, "sms": 2, "memory_gib": 8.0,
                "l2_mib": 32.0, "name": "Fake CPU", "architecture": "x86_64", "key": _host.host_key(threads),
                "measured_at": "now"}

    monkeypatch.setenv(_host.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(_host, "measure_host", fake_measure)
    return calls


@pytest.mark.parametrize("entry", ["oops", {"fp32_tflops": "fast"}, None, []])
def test_a_malformed_host_benchmark_cache_entry_is_ignored_with_a_warning_and_measured_again(
        fake_host: dict[str, int], entry: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = _host.cache_dir() / "host_cpu_benchmark.json"
    path.parent.mkdir(parents=True)
    key = _host.host_key()
    good = {"fp32_tflops": 0.05, "bandwidth_gbps": 10.0, "host_dispatch_us": 5.0, "sms": 2, "memory_gib": 8.0,
            "l2_mib": 32.0, "name": "Fake CPU", "architecture": "x86_64", "key": key, "measured_at": "now"}
    bad = {**good, **entry} if isinstance(entry, dict) else entry
    path.write_text(json.dumps({"format": 1, "entries": {key: bad, "other|threads=9": good}}))
    with caplog.at_level(logging.WARNING, logger="dippm_nas.devices._host"):
        facts = _host.host_facts()
    assert facts["fp32_tflops"] == 0.05 and fake_host["n"] == 1
    assert any("ignoring the host benchmark cache entry" in r.getMessage() for r in caplog.records)
    entries = json.loads(path.read_text())["entries"]
    assert entries[key] == facts and "other|threads=9" in entries  # rewritten, other entries kept
    assert _host.host_facts() == facts and fake_host["n"] == 1  # the next read uses it


@pytest.mark.parametrize("blob", ["[1, 2]", '{"format": 1, "entries": 3}', DEEP, "not json"])
def test_an_unreadable_host_benchmark_cache_is_measured_again(fake_host: dict[str, int], blob: str) -> None:
    path = _host.cache_dir() / "host_cpu_benchmark.json"
    path.parent.mkdir(parents=True)
    path.write_text(blob)
    assert _host.host_facts()["fp32_tflops"] == 0.05 and fake_host["n"] == 1


@pytest.mark.parametrize("change", [{"coef": {"latency_ms": "abc"}}, {"coef": {"latency_ms": [1.0, 2.0]}},
                                    {"n": {"latency_ms": "5"}}, {"timeline": {"host_log": "x"}}, {"extra": 1},
                                    {"kept": {"latency_ms": 2.0}}])
def test_a_calibration_file_of_wrong_types_is_ignored_with_a_warning(
        change: dict[str, Any], caplog: pytest.LogCaptureFixture, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    ident = ANALYTIC_IDENTITY.format(device="host-cpu")
    good = {"device": "host-cpu", "checkpoint": ident, "coef": {"latency_ms": [0.1, 1.0, 0.05]},
            "n": {"latency_ms": 5}, "date": "2026-01-01T00:00:00+00:00", "kept": {}, "timeline": None}
    path = calibration_path("host-cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(good))
    cal = load_calibration("host-cpu", ident)
    assert cal is not None and cal.apply("latency_ms", 1.0, 0.1)[0] == pytest.approx(1.1)
    path.write_text(json.dumps({**good, **change}))
    with caplog.at_level(logging.WARNING, logger="dippm_nas.predictor._calibrate"):
        assert load_calibration("host-cpu", ident) is None
    # wrong types are unreadable; values of the right types that break a rule between them are implausible
    assert any(m in r.getMessage() for r in caplog.records
               for m in ("ignoring unreadable calibration file", "ignoring implausible calibration file"))


# ==================================================================================== FIFOs (item D)
def _unblock(fifo: Path) -> None:
    """Open the FIFO for writing once, so a reader blocked on it (the code before the fix) returns."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


def _within(seconds: float, fn: Any) -> Any:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return t.is_alive(), out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_a_fifo_given_as_host_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "host.json"
    os.mkfifo(fifo)
    hung, out = _within(10.0, lambda: resolve_host_profile(str(fifo)))
    if hung:
        _unblock(fifo)
    assert not hung, "reading a FIFO as the host profile blocked"
    assert isinstance(out.get("error"), DeviceError) and "a FIFO (named pipe), not a regular file" in str(out["error"])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_a_fifo_named_toml_in_the_device_dir_is_skipped_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    d = _device_dir(tmp_path, monkeypatch, lab=GPU_TOML)
    os.mkfifo(d / "x.toml")
    with caplog.at_level(logging.WARNING, logger="dippm_nas.devices._registry"):
        hung, out = _within(10.0, list_devices)
    if hung:
        _unblock(d / "x.toml")
    assert not hung, "listing the devices blocked on a FIFO"
    assert "lab-gpu" in out["value"] and get_device("lab-gpu").sms == 128
    assert any("x.toml" in r.getMessage() and "FIFO" in r.getMessage() for r in caplog.records)


def test_read_json_file_refuses_a_directory_and_a_file_over_its_cap(tmp_path: Path) -> None:
    with pytest.raises(DippmNasError, match="a directory, not a regular file"):
        read_json_file(tmp_path, "x")
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 100 + "1]")
    with pytest.raises(DippmNasError, match="more than the 10 "):
        read_json_file(big, "x", max_bytes=10)


# ================================================================================= locks (item E)
_CHILD = """
import json, os, sys, time
from dippm_nas.devices import _host
log = sys.argv[1]
threads = int(sys.argv[2])
def fake_measure(threads=None):
    with open(log, "a") as f:
        f.write(f"{threads}\\n")
    time.sleep(0.5)  # a measurement in progress: another process starting now must wait, not measure
    return {"fp32_tflops": 0.05, "bandwidth_gbps": 10.0, "host_dispatch_us": 5.0, "sms": threads, "memory_gib": 8.0,
            "l2_mib": 32.0, "name": "Fake CPU", "architecture": "x86_64", "key": _host.host_key(threads),
            "measured_at": "now"}
_host.measure_host = fake_measure
_host.host_key = lambda threads=None: f"Fake CPU|threads={threads}|torch=x"
print(json.dumps(_host.host_facts(threads=threads)))
"""


def _children(tmp_path: Path, thread_counts: list[int]) -> tuple[list[str], dict[str, Any]]:
    log = tmp_path / "measured.log"
    env = {**os.environ, "DIPPM_NAS_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(log), str(n)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in thread_counts]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    entries = json.loads((tmp_path / "cache" / "host_cpu_benchmark.json").read_text())["entries"]
    return log.read_text().split(), entries


def test_processes_starting_together_measure_the_host_once(tmp_path: Path) -> None:
    measured, entries = _children(tmp_path, [2, 2, 2])
    assert measured == ["2"] and list(entries) == ["Fake CPU|threads=2|torch=x"]


def test_processes_measuring_other_thread_counts_keep_each_others_entries(tmp_path: Path) -> None:
    measured, entries = _children(tmp_path, [1, 2, 3])
    assert sorted(measured) == ["1", "2", "3"]
    assert sorted(entries) == [f"Fake CPU|threads={n}|torch=x" for n in (1, 2, 3)]


# ================================================================================ clocks (item E)
def test_queue_leases_use_the_database_clock_not_the_workers(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a worker whose clock runs an hour ahead (or behind) must not lease for an hour more (or less)
    q = JobQueue(db_url, lease_s=60.0)
    _enqueue(q, 2)
    real = time.time()
    for skew in (3600.0, -3600.0):
        monkeypatch.setattr(queue_mod, "time", types.SimpleNamespace(time=lambda: real + skew))
        job = q.claim("host-cpu", f"skewed{skew:+.0f}")
        assert job is not None and job.lease_expires_at == pytest.approx(real + 60.0, abs=30.0)
        assert job.created_at == pytest.approx(real, abs=30.0)
        assert q.heartbeat(job.id, job.lease_owner) and q.get(job.id).lease_expires_at == pytest.approx(
            real + 60.0, abs=30.0)
    q.close()


def test_rdb_storage_passes_optuna_heartbeat_settings_through(tmp_path: Path) -> None:
    import optuna

    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        storage = rdb_storage(f"sqlite:///{tmp_path / 's.db'}", heartbeat_interval=30, grace_period=90)
    assert (storage.heartbeat_interval, storage.grace_period) == (30, 90)
    with pytest.raises(InvalidValueError, match="heartbeat_interval must be a positive int"):
        rdb_storage(f"sqlite:///{tmp_path / 's.db'}", heartbeat_interval=0)


# ================================================================================= RAPL (item E)
def _domain(root: Path, name: str, label: str, energy: int, max_range: int = 1000) -> None:
    d = root / name
    d.mkdir()
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{energy}\n")
    (d / "max_energy_range_uj").write_text(f"{max_range}\n")


def test_rapl_sums_every_package_and_leaves_subzones_and_psys_out(tmp_path: Path) -> None:
    _domain(tmp_path, "intel-rapl:0", "package-0", 100)
    _domain(tmp_path, "intel-rapl:1", "package-1", 900)
    _domain(tmp_path, "intel-rapl:0:0", "core", 50)  # a part of package 0: not counted again
    _domain(tmp_path, "intel-rapl:2", "psys", 7)  # the whole platform: not a package
    _domain(tmp_path, "intel-rapl-mmio:0", "package-0", 5)
    counter, reason = probe_rapl(tmp_path)
    assert reason is None and [d.name for d in counter.directories] == ["intel-rapl:0", "intel-rapl:1"]
    start = counter.read_uj()
    assert start == (100, 900)
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("300\n")  # +200
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("100\n")  # wrapped at 1000: +200
    assert counter.delta_j(start, counter.read_uj()) == pytest.approx(400 / 1e6)


def test_rapl_without_packages_says_why(tmp_path: Path) -> None:
    counter, reason = probe_rapl(tmp_path)
    assert counter is None and "does not exist" in reason
    assert isinstance(RaplCounter(tmp_path).directories, list)
