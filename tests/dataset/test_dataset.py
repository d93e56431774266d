"""Tests of dippm_nas.dataset: the SQLite format, the resumable builder (a real SIGKILL mid-build), failed
rows (builder raises, config outside its space, OOM, time cap), the CUDA path with a faked measurer,
the importers on tiny synthetic CSVs with the real column names, export and load_measurements."""

from __future__ import annotations

import csv
import importlib.machinery
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import search_spaces as ss
from dippm_nas.cli import main as cli_main
from dippm_nas.dataset import (
    DatasetError,
    DatasetStore,
    build_dataset,
    device_id,
    export_jsonl,
    import_accel_nasbench,
    import_neusight,
    import_timm,
    import_vidur,
    load_measurements,
    macs_per_sample,
    plan_candidates,
)
from dippm_nas.errors import MeasurementError, SearchSpaceError
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.spec import InputSpec
from search_spaces import IntRange, SearchSpace, register_space

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ helpers
class _RaisingSpace(SearchSpace):
    """A family whose builder always raises (a buggy user space)."""

    params = {"width": IntRange(1, 64)}

    def default_config(self) -> dict[str, Any]:
        return {"width": 4}

    def _build(self, config: dict[str, Any]) -> nn.Module:
        raise RuntimeError("builder exploded on purpose")

    def _sample(self, rng: Any) -> dict[str, Any]:
        return {"width": rng.randint(1, 64)}

    def input_spec(self, config: dict[str, Any], batch_size: int = 1, dtype: str = "float32") -> InputSpec:
        return InputSpec(shape=(self.validate(config)["width"],), batch_size=batch_size, dtype=dtype)


if "dataset_test_raises" not in ss.list_spaces():
    register_space("dataset_test_raises")(_RaisingSpace)


def _fake_measurement(spec: InputSpec, device: str, status: str = "ok", reason: str | None = None,
                      latency_ms: float = 1.5) -> Measurement:
    ok = status == "ok"
    return Measurement(
        latency_ms=latency_ms if ok else None, latency_ms_std=0.1 if ok else None, energy_j=None,
        memory_mib=12.0 if ok else None, memory_source="rss_delta" if ok else None, n_repeats=5 if ok else 0,
        device=device if device != "cuda" else "cuda:0", environment={"fake_measurer": True}, status=status,
        reason=reason, energy_reason="fake measurer: no energy", batch_size=spec.batch_size, dtype=spec.dtype,
    )


class FakeMeasurer:
    """Records its calls; returns ``ok`` rows unless ``plan`` maps a call index to ``(status, reason)``."""

    def __init__(self, plan: dict[int, tuple[str, str]] | None = None) -> None:
        self.calls: list[tuple[str, InputSpec, str]] = []
        self.plan = plan or {}

    def __call__(self, model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
        assert isinstance(model, nn.Module) and not model.training
        assert isinstance(settings, MeasureSettings)
        i = len(self.calls)
        self.calls.append((type(model).__name__, spec, device))
        status, reason = self.plan.get(i, ("ok", None))
        return _fake_measurement(spec, device, status, reason)


def _count(db: Path, sql: str) -> Any:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _small_build(db: Path, measurer: Any = None, **kw: Any) -> Any:
    args = dict(spaces=["mlp"], n=4, batch_sizes=[1, 2], workers=1, progress=False,
                measure_fn=measurer or FakeMeasurer(), mac_budget=50_000_000)
    args.update(kw)
    return build_dataset(db, **args)


def _write_csv(path: Path, header: list[str], rows: list[dict[str, Any]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in header})
    return path


# ------------------------------------------------------------------------------------------ format
def test_store_format_graphs_by_hash_json_columns_and_unique_rows(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    report = _small_build(db)
    assert report.planned == 4 and report.done == 4 and report.failed == 0 and report.open == 0
    with DatasetStore(db) as store:
        st = store.stats()
        rows = list(store.iter_measurements())
        assert st["graphs"] == len({r["graph_hash"] for r in rows}) and st["ok_with_graph"] == 4
        for r in rows:
            assert r["source"] == "measured-here" and r["status"] == "ok" and r["device"] == "cpu"
            g = store.get_graph(r["graph_hash"])
            assert g.structural_hash() == r["graph_hash"]
            assert g.spec.batch_size == r["batch_size"] and r["batch_size"] in (1, 2)
            assert r["config"] == ss.get_space("mlp").validate(r["config"])  # config stored as JSON, complete
            env = r["environment"]
            assert env["fake_measurer"] is True and "loadavg_before" in env and "plan_key" in env
            assert env["attempt"] == 1
    # JSON text, never pickle: every JSON column parses as JSON; graphs are zlib JSON
    import zlib

    for (blob,) in _count(db, "SELECT graph_zlib FROM graphs"):
        assert json.loads(zlib.decompress(blob))["format_version"] >= 1
    for cols in _count(db, "SELECT config, environment, conditions, extra FROM measurements"):
        assert all(isinstance(json.loads(c), dict) for c in cols)
    # the unique constraint refuses a second row for the same (source, row_key)
    key = _count(db, "SELECT row_key FROM measurements LIMIT 1")[0][0]
    with DatasetStore(db) as store:
        assert store.add_measurements([{"source": "measured-here", "row_key": key, "device": "cpu",
                                        "status": "ok", "latency_ms": 9.0}]) == 0
    assert _count(db, "SELECT COUNT(*) FROM measurements")[0][0] == 4


def test_rerun_is_idempotent_and_plan_is_deterministic(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    m1 = FakeMeasurer()
    r1 = _small_build(db, m1)
    m2 = FakeMeasurer()
    r2 = _small_build(db, m2)
    assert r2.resumed and r2.plan_key == r1.plan_key and m2.calls == [] and r2.measured_now == 0
    assert _count(db, "SELECT COUNT(*) FROM measurements")[0][0] == 4
    p1 = plan_candidates(["mlp", "vit"], 4, batch_sizes=[1, 4], seed=3, mac_budget=100_000_000)
    p2 = plan_candidates(["mlp", "vit"], 4, batch_sizes=[1, 4], seed=3, mac_budget=100_000_000)
    assert [(c.space, c.config, c.batch_size) for c in p1.candidates] == \
           [(c.space, c.config, c.batch_size) for c in p2.candidates]
    assert [c.space for c in p1.candidates] == ["mlp", "vit"] * 2  # interleaved families
    for c in p1.candidates:
        assert c.macs_per_sample * c.batch_size <= 100_000_000


def test_mac_budget_rule_matches_the_captured_graph() -> None:
    from dippm_nas.capture import capture

    cfg = ss.get_space("resnet").sample(1)
    spec = ss.get_space("resnet").input_spec(cfg, batch_size=1)
    g = capture(ss.build_model("resnet", cfg), spec, cache=False)
    assert macs_per_sample("resnet", cfg) == g.total_macs
    with pytest.raises(DatasetError, match="n must be an int >= 1"):
        plan_candidates(["mlp"], 0, batch_sizes=[1])
    with pytest.raises(SearchSpaceError, match="choices"):
        plan_candidates(["no_such_space"], 2, batch_sizes=[1])


# ------------------------------------------------------------------------------------------ failures
def test_builder_raises_and_config_outside_space_are_failed_rows_with_reasons(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    fake = FakeMeasurer()
    report = build_dataset(db, candidates=[
        {"space": "mlp", "config": {"in_features": 8, "hidden": [16]}, "batch_size": 2},
        {"space": "mlp", "config": {"in_features": -3}, "batch_size": 1},          # outside the space
        {"space": "dataset_test_raises", "config": {"width": 8}, "batch_size": 1},  # builder raises
        {"space": "no_such_space", "config": {}, "batch_size": 1},                 # unknown space
    ], workers=1, progress=False, measure_fn=fake)
    assert report.planned == 4 and report.done == 1 and report.failed == 3 and report.open == 0
    assert len(fake.calls) == 1
    with DatasetStore(db) as store:
        rows = {json.dumps(r["config"], sort_keys=True): r for r in store.iter_measurements()}
        jobs = store.jobs()
    assert len(rows) == 4 and all(j.status in ("done", "failed") for j in jobs)
    bad = rows[json.dumps({"in_features": -3}, sort_keys=True)]
    assert bad["status"] == "error" and "config rejected at planning" in bad["reason"] and "in_features" in bad["reason"]
    raised = rows[json.dumps({"width": 8}, sort_keys=True)]
    assert raised["status"] == "error" and "builder exploded on purpose" in raised["reason"]
    assert raised["graph_hash"] is None
    unknown = rows[json.dumps({}, sort_keys=True)]
    assert "unknown search space" in unknown["reason"]
    assert all(j.reason for j in jobs if j.status == "failed")


def test_oom_and_timeout_from_the_measurer_are_stored_failed(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    fake = FakeMeasurer(plan={0: ("oom", "out of memory during forward: OutOfMemoryError: fake"),
                              2: ("timeout", "time cap of 1 s reached after 1.2 s with 1 of the minimum 5")})
    report = _small_build(db, fake)
    assert report.done == 2 and report.failed == 2
    st = dict(_count(db, "SELECT status, COUNT(*) FROM measurements GROUP BY status"))
    assert st == {"ok": 2, "oom": 1, "timeout": 1}
    reasons = dict(_count(db, "SELECT status, reason FROM measurements WHERE status != 'ok'"))
    assert "out of memory" in reasons["oom"] and "time cap" in reasons["timeout"]
    failed = _count(db, "SELECT reason FROM jobs WHERE status = 'failed'")
    assert len(failed) == 2 and all(r for (r,) in failed)
    # failed rows are left out of training data by default, kept on request
    assert len(load_measurements(db)) == 2
    assert len(load_measurements(db, status=None)) == 4
    # after raising the time cap, the timed-out job (only) is measured again and its row replaced
    again = FakeMeasurer()
    report = _small_build(db, again, retry_failed=["timeout"])
    assert len(again.calls) == 1 and report.done == 3 and report.failed == 1
    st = dict(_count(db, "SELECT status, COUNT(*) FROM measurements GROUP BY status"))
    assert st == {"ok": 3, "oom": 1}
    assert _count(db, "SELECT COUNT(DISTINCT job_id), COUNT(*) FROM measurements")[0] == (4, 4)
    with pytest.raises(DatasetError, match="retry_failed"):
        _small_build(db, again, retry_failed=["bogus"])


def test_real_cpu_measurement_and_a_real_time_cap_timeout(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    fast = MeasureSettings(warmup=1, min_repeats=2, max_repeats=3, time_cap_s=5.0, threads=1)
    r = build_dataset(db, candidates=[{"space": "mlp", "config": {"in_features": 8, "hidden": [16]}, "batch_size": 4}],
                      workers=1, progress=False, settings=fast)
    assert r.done == 1
    capped = MeasureSettings(warmup=0, min_repeats=1000, max_repeats=1000, time_cap_s=1e-4, threads=1)
    r = build_dataset(db, candidates=[{"space": "mlp", "config": {"in_features": 8, "hidden": [32]}, "batch_size": 4}],
                      workers=1, progress=False, settings=capped)
    assert r.failed == 1
    rows = {r["status"]: r for r in DatasetStore(db).iter_measurements()}
    assert rows["ok"]["latency_ms"] > 0 and rows["ok"]["environment"]["threads"] == 1
    assert rows["ok"]["environment"]["torch"] == torch.__version__
    assert "time cap" in rows["timeout"]["reason"] and rows["timeout"]["n_repeats"] < 1000


def test_cuda_device_goes_to_the_measurer_and_usage_errors_leave_the_job_open(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    fake = FakeMeasurer()
    report = _small_build(db, fake, torch_device="cuda", n=2)
    assert report.done == 2 and {c[2] for c in fake.calls} == {"cuda"}
    rows = list(DatasetStore(db).iter_measurements())
    assert {r["device"] for r in rows} == {"cuda"} and {r["extra"]["measured_device"] for r in rows} == {"cuda:0"}

    def refuses(model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
        raise MeasurementError("CUDA was asked for but torch.cuda.is_available() is False")

    db2 = tmp_path / "d2.sqlite"
    with pytest.raises(MeasurementError, match="CUDA"):
        _small_build(db2, refuses, torch_device="cuda", n=2)
    jobs = DatasetStore(db2).jobs()
    assert {j.status for j in jobs} == {"converted"} and all(j.attempts == 0 for j in jobs)
    again = _small_build(db2, FakeMeasurer(), torch_device="cuda", n=2)
    assert again.resumed and again.done == 2


def test_a_job_that_kept_killing_the_process_is_failed_not_retried(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    _small_build(db, FakeMeasurer(), stop_after=0)  # plan + convert nothing measured
    with DatasetStore(db) as store:
        jobs = store.jobs()
        assert {j.status for j in jobs} == {"converted"}
        victim = jobs[0]
        store.start_attempt(victim)
        store.start_attempt(store.jobs([victim.id])[0])  # two attempts died while "running"
    fake = FakeMeasurer()
    report = _small_build(db, fake)
    assert report.failed == 1 and report.done == 3 and len(fake.calls) == 3
    reason = _count(db, f"SELECT reason FROM measurements WHERE job_id = {victim.id}")[0][0]
    assert "died while measuring" in reason


def test_isolated_measurement_builds_in_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.dataset import _builder

    seen: list[tuple[str, dict[str, Any]]] = []

    def fake_isolated(model: str, spec: InputSpec, device: str, settings: MeasureSettings, *,
                      model_kwargs: dict[str, Any] | None = None, timeout_s: float | None = None) -> Measurement:
        assert isinstance(model, str) and model_kwargs is not None
        seen.append((model, model_kwargs))
        if model_kwargs["name"] == "dataset_test_raises":
            raise SearchSpaceError("building dataset_test_raises failed: RuntimeError: builder exploded on purpose")
        return _fake_measurement(spec, device)

    monkeypatch.setattr(_builder, "measure_isolated", fake_isolated)
    db = tmp_path / "iso.sqlite"
    cfg = {"in_features": 8, "hidden": [16]}
    r = build_dataset(db, candidates=[{"space": "mlp", "config": cfg, "batch_size": 2}], workers=1, progress=False,
                      isolate=True, measure_fn=lambda *a: pytest.fail("measure_fn must not be used with isolate"))
    assert r.done == 1 and seen[0][0] == "search_spaces:build_model"
    assert seen[0][1] == {"name": "mlp", "config": ss.get_space("mlp").validate(cfg)}
    (row,) = DatasetStore(db).iter_measurements()
    assert row["environment"]["isolated_worker"] is True


@pytest.mark.slow
def test_isolated_measurement_for_real(tmp_path: Path) -> None:
    db = tmp_path / "iso.sqlite"
    fast = MeasureSettings(warmup=1, min_repeats=2, max_repeats=3, time_cap_s=5.0, threads=1)
    r = build_dataset(db, candidates=[{"space": "mlp", "config": {"in_features": 8, "hidden": [16]}, "batch_size": 2}],
                      workers=1, progress=False, isolate=True, settings=fast)
    assert r.done == 1
    (row,) = DatasetStore(db).iter_measurements()
    assert row["environment"]["isolated"] is True and row["latency_ms"] > 0


_KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    from dippm_nas.dataset import build_dataset
    from dippm_nas.measure import Measurement

    def slow_measure(model, spec, device, settings):
        time.sleep(0.4)
        return Measurement(latency_ms=1.0, latency_ms_std=0.1, energy_j=None, memory_mib=None, memory_source=None,
                           n_repeats=5, device=device, environment={}, energy_reason="fake",
                           batch_size=spec.batch_size, dtype=spec.dtype)

    build_dataset(sys.argv[1], spaces=["mlp"], n=int(sys.argv[2]), batch_sizes=[1, 2], workers=1, chunk_size=4,
                  progress=False, mac_budget=50_000_000, measure_fn=slow_measure if sys.argv[3] == "slow" else None)
""")


def test_resume_after_sigkill_has_no_duplicates_and_no_loss(tmp_path: Path) -> None:
    db = tmp_path / "killed.sqlite"
    script = tmp_path / "build.py"
    script.write_text(_KILL_SCRIPT)
    n = 12
    proc = subprocess.Popen([sys.executable, str(script), str(db), str(n), "slow"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 240
    rows = 0
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the build ended before it was killed: {proc.stderr.read().decode()[-2000:]}")
            if db.exists():
                try:
                    rows = _count(db, "SELECT COUNT(*) FROM measurements")[0][0]
                except sqlite3.OperationalError:  # tables not created yet
                    rows = 0
                if rows >= 3:
                    break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the build and anything it started
        proc.wait()
    assert 3 <= rows < n, f"expected a kill midway, got {rows} rows"
    before = _count(db, "SELECT job_id, latency_ms, created_at FROM measurements ORDER BY job_id")
    running = _count(db, "SELECT COUNT(*) FROM jobs WHERE status = 'running'")[0][0]
    assert running <= 1

    fake = FakeMeasurer()
    report = _small_build(db, fake, n=n, chunk_size=4)
    assert report.resumed and report.planned == n and report.open == 0
    assert report.done + report.failed == n and len(fake.calls) == n - len(before)
    jobs = _count(db, "SELECT status, reason FROM jobs")
    assert len(jobs) == n and all(s == "done" or (s == "failed" and r) for s, r in jobs)
    ids = [j for (j,) in _count(db, "SELECT job_id FROM measurements")]
    assert len(ids) == n and len(set(ids)) == n  # one row per job: nothing duplicated, nothing lost
    keys = _count(db, "SELECT source, row_key, COUNT(*) FROM measurements GROUP BY source, row_key HAVING COUNT(*) > 1")
    assert keys == []
    after = {j: (lat, at) for j, lat, at in _count(db, "SELECT job_id, latency_ms, created_at FROM measurements")}
    assert all(after[j] == (lat, at) for j, lat, at in before)  # rows written before the kill are kept as they were
    assert _count(db, "SELECT COUNT(*) FROM plans")[0][0] == 1


# ------------------------------------------------------------------------------------------ importers
_ARCH = [f"arch_block{i}_{p}" for i in range(7) for p in ("e", "k", "l", "se")]
_ACCEL_HEADER = ["source_repo", "commit", "source_file", *_ARCH, "mmacs", "mparams", "val_top1", "val_top5",
                 "train_time", "throughput_a100__throughput_mean", "throughput_a100__throughput_std",
                 "throughput_3090__throughput_mean", "throughput_3090__throughput_std"]


def _accel_row(i: int, e: list[int], a100: str, r3090: str) -> dict[str, Any]:
    row: dict[str, Any] = {"source_repo": "afzalxo/Accel-NASBench", "commit": "0" * 40,
                           "source_file": f"anb/result_{i}.json", "mmacs": "100.0", "mparams": "2.0",
                           "throughput_a100__throughput_mean": a100, "throughput_a100__throughput_std": "5.0",
                           "throughput_3090__throughput_mean": r3090, "throughput_3090__throughput_std": "2.0"}
    for s in range(7):
        row.update({f"arch_block{s}_e": e[s], f"arch_block{s}_k": 3, f"arch_block{s}_l": 1,
                    f"arch_block{s}_se": "False"})
    return row


def test_accel_nasbench_importer(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "anb.csv", _ACCEL_HEADER, [
        _accel_row(0, [1] * 7, "8000.0", "4000.0"),
        _accel_row(1, [1, 4, 1, 1, 1, 1, 1], "7000.0", ""),   # no RTX 3090 figure published
        _accel_row(2, [5, 1, 1, 1, 1, 1, 1], "6000.0", "3000.0"),  # e=5 is outside the space
    ])
    db = tmp_path / "a.sqlite"
    rep = import_accel_nasbench(path, db, capture_graphs=False, progress=False)
    assert rep.rows_read == 3 and rep.inserted == 6 and rep.failed_rows == 3 and rep.graphs_skipped == 4
    rows = list(DatasetStore(db).iter_measurements(source="accel-nasbench"))
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 3 and {r["device"] for r in ok} == {"a100-40gb", "rtx-3090"}
    first_a100 = next(r for r in ok if r["device"] == "a100-40gb" and r["row_key"].startswith("anb/result_0.json"))
    assert first_a100["latency_ms"] == pytest.approx(256 / 8000.0 * 1000)
    assert first_a100["latency_ms_std"] == pytest.approx(256 * 1000 * 5.0 / 8000.0**2)
    assert first_a100["batch_size"] == 256 and first_a100["config"]["resolution"] == 256
    c = first_a100["conditions"]
    assert c["autocast"] == "float16" and c["channels_last"] is True and c["batch_size_assumed"] == 256
    assert "128" in c["batch_size_note"]
    assert first_a100["environment"]["provenance"]["source_file"] == "anb/result_0.json"
    reasons = sorted(r["reason"] for r in rows if r["status"] != "ok")
    assert any("RTX 3090 throughput" in x for x in reasons) and sum("outside the mbconv space" in x for x in reasons) == 2
    again = import_accel_nasbench(path, db, capture_graphs=False, progress=False)
    assert again.inserted == 0 and again.already_present == 6
    with pytest.raises(DatasetError, match="lacks the columns"):
        import_accel_nasbench(_write_csv(tmp_path / "bad.csv", ["source_repo", "mmacs"], []), db, progress=False)


def test_accel_nasbench_importer_captures_the_graph_at_256(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "anb.csv", _ACCEL_HEADER, [_accel_row(0, [1] * 7, "8000.0", "4000.0")])
    db = tmp_path / "a.sqlite"
    rep = import_accel_nasbench(path, db, workers=1, progress=False, batch_size=128)
    assert rep.graphs_captured == 1 and rep.inserted == 2
    data = load_measurements(db, source="accel-nasbench")
    assert len(data) == 2 and data[0].graph is data[1].graph
    g, spec, m = data[0]
    assert spec.batch_size == 128 and spec.shape == (3, 256, 256) and spec.dtype == "float16"
    assert m["latency_ms"] == pytest.approx(128 / (8000.0 if m["device"] == "a100-40gb" else 4000.0) * 1000)
    cfg = ss.config_from_accel_nasbench_row(_accel_row(0, [1] * 7, "", ""), resolution=256)
    assert g.total_macs == 128 * macs_per_sample("mbconv", cfg)


_TIMM_HEADER = ["source_repo", "commit", "source_file", "gpu", "precision", "memory_layout", "torch_version_tag",
                "cuda_tag", "torch_compile", "model", "infer_img_size", "infer_batch_size", "infer_samples_per_sec",
                "infer_step_time", "infer_gmacs", "infer_macts", "param_count"]


def _timm_rows() -> list[dict[str, Any]]:
    base = {"source_repo": "huggingface/pytorch-image-models", "commit": "a" * 40,
            "source_file": "results/benchmark-infer-amp-nchw-pt113-cu117-rtx3090.csv", "gpu": "NVIDIA GeForce RTX 3090",
            "precision": "amp", "memory_layout": "nchw", "torch_version_tag": "pt113", "cuda_tag": "cu117",
            "torch_compile": "eager"}
    return [
        {**base, "model": "tiny_a", "infer_img_size": "16", "infer_batch_size": "1024.0",
         "infer_samples_per_sec": "49277.65", "infer_step_time": "20.77", "infer_gmacs": "0.03"},
        {**base, "model": "tiny_b", "infer_img_size": "16", "infer_batch_size": "", "infer_samples_per_sec": "",
         "infer_step_time": ""},  # did not run: no result published
        {**base, "gpu": "NVIDIA RTX PRO 6000 Blackwell Max-Q", "precision": "bf16", "model": "tiny_a",
         "infer_img_size": "16", "infer_batch_size": "256", "infer_samples_per_sec": "1000", "infer_step_time": "256"},
    ]


def test_timm_importer_without_timm_stores_rows_without_graphs(tmp_path: Path, caplog: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.dataset.importers import _source

    monkeypatch.setattr(_source, "_module_available", lambda module: False)
    path = _write_csv(tmp_path / "timm.csv", _TIMM_HEADER, _timm_rows())
    db = tmp_path / "t.sqlite"
    with caplog.at_level("WARNING", logger="dippm_nas.dataset.importers._source"):
        rep = import_timm(path, db, progress=False)
    assert rep.inserted == 3 and rep.failed_rows == 1 and rep.graphs_skipped == 2 and rep.graphs_captured == 0
    assert "2 timm rows stored without graphs" in caplog.text
    rows = {(r["config"]["model"], r["device"]): r for r in DatasetStore(db).iter_measurements(source="timm")}
    a = rows[("tiny_a", "rtx-3090")]
    assert a["latency_ms"] == 20.77 and a["batch_size"] == 1024 and a["dtype"] == "float16"
    assert a["conditions"]["autocast"] is True and a["conditions"]["torch_compile"] == "eager"
    assert a["conditions"]["infer_samples_per_sec"] == 49277.65 and a["graph_hash"] is None
    pro = rows[("tiny_a", "rtx-pro-6000-blackwell-max-q")]
    assert pro["dtype"] == "bfloat16" and pro["conditions"]["autocast"] is False
    b = rows[("tiny_b", "rtx-3090")]
    assert b["status"] == "error" and "no result" in b["reason"]
    assert load_measurements(db, source="timm") == []  # no graphs: nothing to train on, said in the log


def test_timm_importer_captures_graphs_when_timm_is_importable(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("timm")
    fake.__spec__ = importlib.machinery.ModuleSpec("timm", None)
    fake.is_model = lambda name: name.startswith("tiny_")
    fake.create_model = lambda name, pretrained=False: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(),
                                                                     nn.AdaptiveAvgPool2d(1), nn.Flatten())
    monkeypatch.setitem(sys.modules, "timm", fake)
    path = _write_csv(tmp_path / "timm.csv", _TIMM_HEADER, _timm_rows())
    db = tmp_path / "t.sqlite"
    rep = import_timm(path, db, workers=1, progress=False, cache=False)
    assert rep.graphs_captured == 2 and rep.graphs_skipped == 0 and rep.inserted == 3
    data = load_measurements(db, source="timm")
    assert len(data) == 2
    specs = sorted((d.spec.batch_size, d.spec.dtype) for d in data)
    assert specs == [(256, "bfloat16"), (1024, "float16")]


class _RepBlock(nn.Module):
    """Two conv branches summed; ``reparameterize()`` fuses them into one conv (RepVGG's trick)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)
        self.fused: nn.Module | None = None

    def reparameterize(self) -> None:
        self.fused = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: Any) -> Any:
        return self.fused(x) if self.fused is not None else self.a(x) + self.b(x)


def test_timm_importer_captures_the_reparameterised_form_the_pt291_runs_timed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("timm")
    fake.__spec__ = importlib.machinery.ModuleSpec("timm", None)
    fake.is_model = lambda name: name.startswith("tiny_")
    fake.create_model = lambda name, pretrained=False: nn.Sequential(_RepBlock(), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                                                     nn.Flatten())
    utils, utils_model = types.ModuleType("timm.utils"), types.ModuleType("timm.utils.model")

    def reparameterize_model(model: nn.Module, inplace: bool = False) -> nn.Module:
        for m in model.modules():
            if hasattr(m, "reparameterize"):
                m.reparameterize()
        return model

    utils_model.reparameterize_model = reparameterize_model
    fake.utils, utils.model = utils, utils_model
    for name, mod in (("timm", fake), ("timm.utils", utils), ("timm.utils.model", utils_model)):
        monkeypatch.setitem(sys.modules, name, mod)
    rows = _timm_rows()[:1]
    rows.append({**rows[0], "source_file": "results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
                 "gpu": "NVIDIA GeForce RTX 4090", "torch_version_tag": "pt291", "infer_step_time": "5.0"})
    db = tmp_path / "t.sqlite"
    rep = import_timm(_write_csv(tmp_path / "timm.csv", _TIMM_HEADER, rows), db, workers=1, progress=False,
                      cache=False)
    assert rep.inserted == 2 and rep.graphs_captured == 2
    got = {r["device"]: r for r in DatasetStore(db).iter_measurements(source="timm")}
    old, new = got["rtx-3090"], got["rtx-4090"]
    assert old["conditions"]["model_form"] == "as built" and old["conditions"]["model_spec"] == "timm:tiny_a"
    assert new["conditions"]["model_form"] == "reparameterized"
    assert new["conditions"]["model_spec"] == "timm-reparam:tiny_a"
    graphs = {d.measurement["device"]: d.graph for d in load_measurements(db, source="timm")}
    convs = {dev: sum(n.op == "nn.conv2d" for n in g.nodes) for dev, g in graphs.items()}
    assert convs == {"rtx-3090": 2, "rtx-4090": 1}


def test_timm_importer_captures_hiera_as_the_published_results_ran_it(tmp_path: Path) -> None:
    rows = [{**_timm_rows()[0], "model": "hiera_tiny_224", "source_file": source, "torch_version_tag": tag}
            for source, tag in (("results/benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv", "pt240"),
                                ("results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv", "pt291"))]
    rows[1]["gpu"] = "NVIDIA GeForce RTX 4090"
    db = tmp_path / "t.sqlite"
    rep = import_timm(_write_csv(tmp_path / "timm.csv", _TIMM_HEADER, rows), db, capture_graphs=False,
                      progress=False)
    assert rep.inserted == 2
    for r in DatasetStore(db).iter_measurements(source="timm"):  # a pt291 (reparameterised) run too: no such modules
        assert r["conditions"]["model_spec"] == "timm-results:hiera_tiny_224"
        assert r["conditions"]["model_form"] == "as the results ran it"


def test_neusight_and_vidur_importers_write_operator_tables(tmp_path: Path) -> None:
    micro_header = ["source_repo", "commit", "source_file", "OPName", "Latency", "Device", "Torch Version",
                    "CUDNN Version", "Kernel Name", "Warps per SM", "Blocks per SM", "Grid x", "Grid y", "Grid z",
                    "Block x", "Block y", "Block z", "CUDA Version", "B", "H", "Kernels", "M", "N", "K",
                    "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]
    prov = {"source_repo": "sitar-lab/NeuSight", "commit": "b" * 40, "source_file": "collect/x.csv"}
    micro = _write_csv(tmp_path / "micro.csv", micro_header, [
        {**prov, "OPName": "linear", "Latency": "0.0268", "Device": "NVIDIA A100-PCIE-40GB", "B": "1", "M": "58",
         "N": "13", "K": "141", "Kernels": ";ampere_sgemm_32x128_tn"},
        {**prov, "OPName": "conv", "Latency": "0.5", "Device": "NVIDIA A100 80GB PCIe", "B": "38",
         "Input_Channel": "893", "Output_Channel": "326", "Kernel_Szie": "3", "Input_Size": "5", "Stride": "1",
         "Padding": "1"},
        {**prov, "OPName": "relu", "Latency": "", "Device": "NVIDIA A100-PCIE-40GB", "B": "2", "H": "3"},
    ])
    db = tmp_path / "ops.sqlite"
    rep = import_neusight(micro, db, progress=False)
    assert rep.inserted == 2 and rep.cells_missing == 1
    ops = {r["op"]: r for r in DatasetStore(db).iter_op_rows(source="neusight")}
    assert ops["linear"]["dims"] == {"B": 1, "M": 58, "N": 13, "K": 141} and ops["linear"]["device"] == "a100-pcie-40gb"
    assert ops["conv"]["dims"]["kernel_size"] == 3 and ops["conv"]["device"] == "a100-pcie-80gb"
    assert ops["linear"]["latency_ms"] == 0.0268 and ops["linear"]["extra"]["kernels"] == ";ampere_sgemm_32x128_tn"
    assert import_neusight(micro, db, progress=False).inserted == 0  # idempotent

    fx_header = ["source_repo", "commit", "source_file", "device", "trace", "node_index", "op", "target", "Name",
                 "input_shapes", "output_shape", "dtype", "latency", "fw_latency", "bw_latency", "acc_latency",
                 "_prev", "_next"]
    fx = _write_csv(tmp_path / "fx.csv", fx_header, [
        {**prov, "device": "NVIDIA_H100_80GB_HBM3", "trace": "bert-inf-512-16", "node_index": "7",
         "op": "call_function", "target": "<built-in function add>", "input_shapes": "[[16, 512, 1024], [16, 512, 1024]]",
         "output_shape": "(16, 512, 1024)", "dtype": "torch.float32", "latency": "0.05"},
        {**prov, "device": "NVIDIA_L4", "trace": "bert-inf-512-16", "node_index": "8", "op": "call_module",
         "target": "bert.pooler", "input_shapes": "[[16, 512, 1024]]", "output_shape": "(16, 1024)",
         "dtype": "torch.float32", "latency": "", "fw_latency": "0.02"},  # L4 traces fill fw_latency only
    ])
    assert import_neusight(fx, db, progress=False).inserted == 2
    rows = {r["device"]: r for r in DatasetStore(db).iter_op_rows(source="neusight-fx")}
    row = rows["h100-80gb-hbm3"]
    assert row["dims"]["output_shape"] == [16, 512, 1024] and row["dtype"] == "float32"
    assert row["extra"]["latency_column"] == "latency" and row["op"] == "call_function:<built-in function add>"
    assert rows["l4"]["latency_ms"] == 0.02 and rows["l4"]["extra"]["latency_column"] == "fw_latency"

    stats = ["min", "max", "mean", "median", "std"]
    vidur_header = ["source_repo", "commit", "source_file", "gpu", "model",
                    *[f"time_stats.{op}.{s}" for op in ("emb", "mlp_up_proj") for s in stats],
                    "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
                    "num_tensor_parallel_workers"]
    vidur = _write_csv(tmp_path / "vidur.csv", vidur_header, [
        {"source_repo": "microsoft/vidur", "commit": "c" * 40, "source_file": "a100/m/mlp.csv", "gpu": "a100",
         "model": "meta-llama/Llama-2-7b-hf", "time_stats.emb.mean": "0.44", "time_stats.emb.std": "0.016",
         "time_stats.emb.min": "0.39", "n_head": "32", "n_embd": "4096", "use_gated_mlp": "True", "num_tokens": "4096",
         "num_tensor_parallel_workers": "1"},
    ])
    rep = import_vidur(vidur, db, progress=False)
    assert rep.inserted == 1 and rep.cells_missing == 1  # mlp_up_proj was not profiled in this row
    (v,) = DatasetStore(db).iter_op_rows(source="vidur")
    assert v["op"] == "emb" and v["latency_ms"] == 0.44 and v["latency_ms_std"] == 0.016
    assert v["dims"]["use_gated_mlp"] is True and v["dims"]["num_tokens"] == 4096 and v["extra"]["min_ms"] == 0.39
    with pytest.raises(DatasetError, match="neither"):
        import_neusight(_write_csv(tmp_path / "x.csv", ["a", "b"], []), db)


def test_device_ids_follow_the_registry() -> None:
    assert device_id("NVIDIA GeForce RTX 3090") == "rtx-3090"
    assert device_id("NVIDIA A100-PCIE-40GB") == "a100-pcie-40gb"
    assert device_id("NVIDIA_A100_80GB_PCIe") == "a100-pcie-80gb"


# ------------------------------------------------------------------------------------------ export, load, CLI
def test_export_roundtrip_and_load_measurements(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    _small_build(db)
    out = tmp_path / "d.jsonl.xz"
    counts = export_jsonl(db, out)
    assert counts["measurements"] == 4 and counts["graphs"] >= 1
    a = load_measurements(db)
    b = load_measurements(out)
    assert len(a) == len(b) == 4
    for x, y in zip(a, b):
        assert x.graph.to_dict() == y.graph.to_dict() and x.spec == y.spec
        assert x.measurement["latency_ms"] == y.measurement["latency_ms"]
        assert x.measurement["row_key"] == y.measurement["row_key"]
    assert load_measurements(db, device="cuda") == [] and len(load_measurements(db, source="measured-here")) == 4
    with pytest.raises(DatasetError, match="does not exist"):
        load_measurements(tmp_path / "nope.sqlite")


def test_export_inflates_a_stored_graph_only_up_to_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zlib

    from dippm_nas.dataset import _store as dataset_store

    db = tmp_path / "d.sqlite"
    _small_build(db)
    con = sqlite3.connect(db)
    con.execute("UPDATE graphs SET graph_zlib = ?", (zlib.compress(b" " * 100_000),))  # inflates to 100 kB
    con.commit()
    con.close()
    monkeypatch.setattr(dataset_store, "MAX_STORED_GRAPH_BYTES", 1000)
    with pytest.raises(DatasetError, match="cannot be exported: it inflates beyond 1,000 bytes"):
        export_jsonl(db, tmp_path / "d.jsonl")


def test_store_refuses_another_schema_version(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    DatasetStore(db).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(DatasetError, match="schema_version 99"):
        DatasetStore(db)


def test_cli_build_info_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "cli.sqlite"
    rc = cli_main(["dataset", "build", "--space", "mlp", "--n", "2", "--batch", "1,2", "--out", str(db),
                   "--workers", "1", "--no-progress", "--warmup", "1", "--min-repeats", "2", "--max-repeats", "3",
                   "--time-cap", "5", "--mac-budget", "50"])
    assert rc == 0
    assert "2 done, 0 failed, 0 open" in capsys.readouterr().out
    assert cli_main(["dataset", "info", str(db), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ok_with_graph"] == 2 and info["jobs"] == {"done": 2}
    assert cli_main(["dataset", "export", str(db), "--out", str(tmp_path / "x.jsonl.gz")]) == 0
    assert "2 measurement rows" in capsys.readouterr().out
    assert cli_main(["dataset", "build", "--space", "mlp", "--n", "2", "--out", str(db), "--dtype", "int8"]) == 2


def test_cli_build_measures_the_candidates_of_an_export_again(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    fast = ["--workers", "1", "--no-progress", "--warmup", "1", "--min-repeats", "2", "--max-repeats", "2",
            "--no-cache"]
    db = tmp_path / "a.sqlite"
    assert cli_main(["dataset", "build", "--space", "mlp", "--n", "3", "--batch", "1,2", "--out", str(db), *fast]) == 0
    exp = tmp_path / "a.jsonl.xz"
    assert cli_main(["dataset", "export", str(db), "--out", str(exp)]) == 0
    capsys.readouterr()
    # the same models, measured again into another file (twice the same export: each model once)
    db2 = tmp_path / "b.sqlite"
    assert cli_main(["dataset", "build", "--candidates", str(exp), "--candidates", str(exp), "--out", str(db2),
                     *fast]) == 0
    assert "3 done, 0 failed, 0 open" in capsys.readouterr().out
    key = lambda r: (r["space"], json.dumps(r["config"], sort_keys=True), r["batch_size"])  # noqa: E731
    first = sorted(key(r) for r in DatasetStore(db).iter_measurements())
    assert sorted(key(r) for r in DatasetStore(db2).iter_measurements()) == first
    # a JSON list works too; rows of a space that cannot be built here are left out with a note
    lst = tmp_path / "c.json"
    lst.write_text(json.dumps([{"space": "mlp", "config": json.loads(first[0][1]), "batch_size": 1},
                               {"space": "timm", "config": {"model": "x"}, "batch_size": 1}]))
    assert cli_main(["dataset", "build", "--candidates", str(lst), "--out", str(tmp_path / "c.sqlite"), *fast]) == 0
    out = capsys.readouterr()
    assert "1 done" in out.out and "'timm': 1" in out.err
    # --candidates excludes --space/--n, which go together
    assert cli_main(["dataset", "build", "--candidates", str(exp), "--n", "2", "--out", str(db2)]) == 2
    assert cli_main(["dataset", "build", "--space", "mlp", "--out", str(db2)]) == 2
    assert "--space and --n go together" in capsys.readouterr().err
    assert cli_main(["dataset", "build", "--candidates", str(exp), "--dtype", "float16", "--out", str(db2)]) == 2
    assert "rows of dtype ['float32']" in capsys.readouterr().err


def test_evaluating_a_device_without_test_rows_names_the_devices_that_have_them(tmp_path: Path) -> None:
    """`evaluate` on a split with no test row of the evaluated device is a DatasetError naming the devices
    that do have test rows (not a numpy stacking error)."""
    from dippm_nas.errors import DatasetError
    from dippm_nas.predictor import find_checkpoint
    from dippm_nas.training import evaluate_checkpoint

    db = tmp_path / "d.sqlite"
    _small_build(db, n=12, batch_sizes=[1, 2, 4])  # host rows only
    ckpt = find_checkpoint("a100-sxm4-40gb")
    assert ckpt is not None
    with pytest.raises(DatasetError, match=r"no test row of 'rtx-3090'.*devices with test rows: host-cpu"):
        evaluate_checkpoint(ckpt, [db], device="a100-sxm4-40gb", eval_device="rtx-3090")
