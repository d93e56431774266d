"""Tests of ``dippm_nas.validation``: the SQL job queue (claims, leases, data-only rows), the worker
(rebuild from JSON, out-of-memory as a result, a worker killed mid-job), ParetoValidator scheduling and
priorities, summary, calibration, and the ``validate-worker`` verb.

Measurements are faked (``measure_fn``) except in the two end-to-end tests, which time a tiny MLP on the
CPU with a handful of forwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa

import dippm_nas.validation._queue as queue_mod
import dippm_nas.validation._validator as validator_mod
from dippm_nas.errors import DippmNasError, InputSpecError, SearchSpaceError, ValidationError
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import BasePredictor, get_predictor, set_predictor
from dippm_nas.spec import InputSpec
from dippm_nas.validation import (
    CalibratedPredictor,
    Job,
    JobQueue,
    ParetoValidator,
    ValidationWorker,
    apply_calibration,
    check_calibration,
    device_is_here,
    fit_calibration,
    torch_device_for,
    uncertainty_of,
)
from dippm_nas.validation._tables import jobs as jobs_table
from dippm_nas.validation._tables import results as results_table

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPEC = InputSpec(shape=(4,), batch_size=2)
PRED = {"latency_ms": 1.0, "latency_ms_std": None, "latency_source": "analytic", "energy_j": None,
        "memory_mib": 1.0, "memory_mib_std": None, "memory_source": "analytic", "latency_ms_uncalibrated": 1.0}
REPO = Path(__file__).resolve().parents[2]


def _cfg(width: int = 8) -> dict[str, Any]:
    return {"in_features": 4, "hidden": [width], "out_features": 2}


def _ok(latency_ms: float = 2.0) -> Measurement:
    return Measurement(latency_ms=latency_ms, latency_ms_std=0.01 * latency_ms, energy_j=None, memory_mib=1.5,
                       memory_source="rss_delta", n_repeats=5, device="cpu", environment={"fake": True},
                       energy_reason="no energy counter in this test", batch_size=2, dtype="float32")


def _oom() -> Measurement:
    return Measurement(latency_ms=None, latency_ms_std=None, energy_j=None, memory_mib=None, memory_source=None,
                       n_repeats=0, device="cuda:0", environment={"fake": True}, status="oom",
                       reason="out of memory during forward: OutOfMemoryError: CUDA out of memory",
                       energy_reason="not measured: oom", batch_size=2, dtype="float32")


class FakeMeasure:
    """``measure_fn`` that records the widths it was asked to measure; width 99 runs out of memory."""

    def __init__(self, latency: dict[int, float] | None = None) -> None:
        self.widths: list[int] = []
        self.latency = latency or {}

    def __call__(self, model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
        w = model.search_space_config["hidden"][0]
        self.widths.append(w)
        return _oom() if w == 99 else _ok(self.latency.get(w, 2.0))


@pytest.fixture
def queue(tmp_path: Path) -> JobQueue:
    q = JobQueue(f"sqlite:///{tmp_path / 'q.db'}", lease_s=60.0)
    yield q
    q.close()


def _enqueue(q: JobQueue, trial: int, *, width: int = 8, priority: float = 0.0, device: str = "host-cpu",
             study: str = "s") -> int | None:
    return q.enqueue(study=study, trial_number=trial, space="mlp", config=_cfg(width), spec=SPEC.to_dict(),
                     device=device, predicted=PRED, priority=priority)


# ------------------------------------------------------------------------------------------- queue
def test_enqueue_is_unique_per_trial_and_device(queue: JobQueue) -> None:
    assert _enqueue(queue, 0) is not None
    assert _enqueue(queue, 0) is None  # a second validator (or process) enqueueing the same trial
    assert _enqueue(queue, 0, device="a100-sxm4-40gb") is not None
    assert _enqueue(queue, 0, study="other") is not None
    assert len(queue.jobs()) == 3 and queue.trial_numbers("s", "host-cpu") == {0}


def test_claim_order_is_priority_then_age(queue: JobQueue) -> None:
    for trial, prio in [(0, 0.1), (1, 0.5), (2, 0.5), (3, 0.2)]:
        _enqueue(queue, trial, priority=prio)
    _enqueue(queue, 9, priority=100.0, device="a100-sxm4-40gb")  # another device: never claimed here
    order = []
    while (job := queue.claim("host-cpu", "w")) is not None:
        assert job.status == "leased" and job.attempts == 1 and job.lease_owner == "w"
        order.append(job.trial_number)
    assert order == [1, 2, 3, 0]
    assert queue.counts(device="host-cpu") == {"queued": 0, "leased": 4, "done": 0, "failed": 0}


def test_lease_expiry_requeues_then_fails(queue: JobQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(queue_mod, "_now", lambda _conn: now[0])
    q = JobQueue(queue.url_with_credentials(), lease_s=10.0, max_attempts=2)
    _enqueue(q, 0)
    first = q.claim("host-cpu", "w1")
    now[0] += 5
    assert q.requeue_expired() == 0 and q.heartbeat(first.id, "w1")  # lease now ends at 1015
    now[0] += 9
    assert q.claim("host-cpu", "w2") is None  # still leased by w1
    now[0] += 2
    second = q.claim("host-cpu", "w2")  # expired: re-queued and claimed again
    assert second.id == first.id and second.attempts == 2 and "lease expired" in second.error
    assert not q.heartbeat(first.id, "w1")  # w1 lost it
    assert not q.complete(first, "w1", _ok())  # and cannot record a result
    now[0] += 11
    assert q.requeue_expired() == 1
    job = q.get(first.id)
    assert job.status == "failed" and "on each of 2 attempts" in job.error
    assert q.results() == []


def test_complete_writes_one_result_and_needs_the_lease(queue: JobQueue) -> None:
    _enqueue(queue, 4, width=8)
    job = queue.claim("host-cpu", "w")
    assert queue.complete(job, "w", _ok(4.0))
    assert not queue.complete(job, "w", _ok(4.0))  # not leased any more
    (rec,) = queue.results()
    assert rec.trial_number == 4 and rec.status == "ok" and rec.fits is True and rec.worker == "w"
    assert rec.predicted_latency_ms == 1.0 and rec.measured_latency_ms == 4.0
    assert rec.latency_error_pct == pytest.approx(-75.0)
    assert rec.memory_error_pct == pytest.approx(100 * (1.0 - 1.5) / 1.5)
    assert rec.energy_error_pct is None  # nothing to compare, not zero
    assert queue.get(job.id).status == "done" and queue.get(job.id).result["latency_ms"] == 4.0


def test_queue_rows_are_data_only(queue: JobQueue) -> None:
    for table in (jobs_table, results_table):
        for col in table.columns:
            assert not isinstance(col.type, (sa.LargeBinary, sa.PickleType)), col
    _enqueue(queue, 0, width=8)
    job = queue.claim("host-cpu", "w")
    queue.complete(job, "w", _ok())
    engine = sa.create_engine(queue.url_with_credentials())
    with engine.connect() as conn:
        for table in (jobs_table, results_table):
            for row in conn.execute(sa.select(table)).mappings():
                for key, value in row.items():
                    assert value is None or isinstance(value, (str, int, float)), (key, type(value))
                    if key.endswith("_json") and value is not None:
                        json.loads(value)
        raw = conn.execute(sa.select(jobs_table.c.config_json, jobs_table.c.spec_json)).one()
    engine.dispose()
    import search_spaces

    cfg = json.loads(raw.config_json)
    assert search_spaces.get_space("mlp").validate(cfg) == cfg  # the space's complete, normalised config
    assert InputSpec.from_dict(json.loads(raw.spec_json)) == SPEC


def test_enqueue_checks_rows_before_they_enter(queue: JobQueue) -> None:
    with pytest.raises(DippmNasError, match="plain JSON data"):
        queue.enqueue(study="s", trial_number=0, space="mlp", config={"hidden": [4], "blob": b"\x80\x04"},
                      spec=SPEC.to_dict(), device="host-cpu", predicted=PRED)
    with pytest.raises(SearchSpaceError, match=r"unknown search space 'nope'; choices: \['bert'"):
        queue.enqueue(study="s", trial_number=0, space="nope", config={}, spec=SPEC.to_dict(), device="host-cpu",
                      predicted=PRED)
    with pytest.raises(SearchSpaceError, match="hidden"):
        queue.enqueue(study="s", trial_number=0, space="mlp", config={"hidden": "wide"}, spec=SPEC.to_dict(),
                      device="host-cpu", predicted=PRED)
    with pytest.raises(InputSpecError):
        queue.enqueue(study="s", trial_number=0, space="mlp", config=_cfg(), spec={"shape": [4], "batch_size": 0,
                      "dtype": "float32"}, device="host-cpu", predicted=PRED)
    with pytest.raises(DippmNasError, match="trial_number must be an int >= 0"):
        queue.enqueue(study="s", trial_number=-1, space="mlp", config=_cfg(), spec=SPEC.to_dict(),
                      device="host-cpu", predicted=PRED)
    assert queue.jobs() == []


def test_bad_queue_arguments_raise_validation_error_with_the_rule(tmp_path: Path, queue: JobQueue) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with pytest.raises(ValidationError, match=r"lease_s must be a finite number > 0, got -1\.0"):
        JobQueue(url, lease_s=-1.0)
    with pytest.raises(ValidationError, match=r"max_attempts must be an int >= 1, got 0"):
        JobQueue(url, max_attempts=0)
    with pytest.raises(ValidationError, match=r"invalid validation queue URL 'not a url'.*expected e\.g\."):
        JobQueue("not a url")
    with pytest.raises(ValidationError, match=r"invalid validation queue URL 'nosuchdb://host/db'"):
        JobQueue("nosuchdb://host/db")  # parses, but no such dialect: the engine set-up names the queue
    with pytest.raises(ValidationError, match=r"status must be one of .* got 'lost'"):
        queue.jobs(status="lost")
    with pytest.raises(ValidationError, match=r"trial_number must be an int >= 0, got -1"):
        queue.enqueue(study="s", trial_number=-1, space="mlp", config=_cfg(), spec=SPEC.to_dict(),
                      device="host-cpu", predicted=PRED)
    assert issubclass(ValidationError, DippmNasError)  # callers catching the root still catch it
    import dippm_nas
    import dippm_nas.validation

    assert dippm_nas.ValidationError is dippm_nas.validation.ValidationError is ValidationError


# ------------------------------------------------------------------------------------------- worker
def test_the_torch_device_keyword_and_its_deprecated_name(queue: JobQueue) -> None:
    fake = FakeMeasure()
    assert ValidationWorker(queue, "a100-sxm4-40gb", measure_fn=fake, torch_device="cuda:1").torch_device == "cuda:1"
    assert torch_device_for("a100-sxm4-40gb", "cuda:1") == "cuda:1"
    with pytest.warns(DeprecationWarning, match=r"ValidationWorker\(cuda_device=\.\.\.\) is deprecated"):
        w = ValidationWorker(queue, "a100-sxm4-40gb", measure_fn=fake, cuda_device="cuda:2")
    assert w.torch_device == "cuda:2"
    with pytest.warns(DeprecationWarning, match="torch_device="):
        assert torch_device_for("a100-sxm4-40gb", cuda_device="cuda:3") == "cuda:3"


def test_worker_rebuilds_from_json_and_records_oom_as_does_not_fit(queue: JobQueue) -> None:
    _enqueue(queue, 0, width=8)
    _enqueue(queue, 1, width=99)
    fake = FakeMeasure()
    worker = ValidationWorker(queue, "a100-sxm4-40gb", measure_fn=fake, owner="gpu-box")
    assert worker.run(idle_timeout_s=0, poll_s=0) == 0  # nothing for the A100
    cpu = ValidationWorker(queue, "host-cpu", measure_fn=fake, owner="cpu-box")
    assert cpu.run(idle_timeout_s=0, poll_s=0) == 2
    assert sorted(fake.widths) == [8, 99]
    recs = {r.trial_number: r for r in queue.results()}
    assert recs[1].status == "oom" and recs[1].fits is False and recs[1].measured_latency_ms is None
    assert recs[0].status == "ok" and recs[0].fits is True
    assert queue.counts() == {"queued": 0, "leased": 0, "done": 2, "failed": 0}


def test_a_host_cpu_job_is_measured_at_the_thread_count_it_was_predicted_for(queue: JobQueue) -> None:
    # the host checkpoints predict 1-thread latency (host_threads): measuring at the process's count would
    # compare another quantity, and auto-calibration would learn the thread count as an error
    seen: list[int | None] = []

    def fake(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
        seen.append(settings.threads)
        return _ok(2.0)

    for trial, pred in ((0, {**PRED, "host_threads": 1}), (1, PRED)):
        queue.enqueue(study="s", trial_number=trial, space="mlp", config=_cfg(8), spec=SPEC.to_dict(),
                      device="host-cpu", predicted=pred, priority=-trial)
    assert ValidationWorker(queue, "host-cpu", measure_fn=fake).run(idle_timeout_s=0, poll_s=0) == 2
    assert seen == [1, None]  # no thread count recorded: the worker's settings as they are
    queue.enqueue(study="s", trial_number=2, space="mlp", config=_cfg(8), spec=SPEC.to_dict(), device="host-cpu",
                  predicted={**PRED, "host_threads": 1})
    mine = ValidationWorker(queue, "host-cpu", measure_fn=fake, settings=MeasureSettings(threads=2))
    assert mine.run(idle_timeout_s=0, poll_s=0) == 1 and seen[-1] == 2  # an explicit setting wins


def test_job_that_cannot_be_built_fails_without_retry(queue: JobQueue) -> None:
    _enqueue(queue, 0)
    engine = sa.create_engine(queue.url_with_credentials())
    with engine.begin() as conn:  # a row written by something else, outside the space
        conn.execute(sa.update(jobs_table).values(config_json=json.dumps({"hidden": [0]})))
    engine.dispose()
    outcomes: list[str] = []
    ValidationWorker(queue, "host-cpu", measure_fn=FakeMeasure()).run(
        idle_timeout_s=0, poll_s=0, on_job=lambda job, outcome: outcomes.append(outcome))
    (job,) = queue.jobs()
    assert outcomes == ["failed"] and job.status == "failed" and job.attempts == 1
    assert "SearchSpaceError" in job.error and "'hidden'[0]" in job.error
    assert queue.results() == []


def test_worker_in_rounds_times_a_claimed_batch_together(queue: JobQueue) -> None:
    # one-by-one measurements are faked (2 ms, memory 1.5 MiB), the rounds time the real tiny MLPs
    for trial, width in enumerate((8, 99, 16, 32)):
        _enqueue(queue, trial, width=width, priority=-trial)
    fake = FakeMeasure()
    worker = ValidationWorker(queue, "host-cpu", measure_fn=fake, rounds=3, rounds_batch=8,
                              settings=MeasureSettings(warmup=1, min_repeats=2, max_repeats=3))
    outcomes: list[tuple[int, str]] = []
    assert worker.run(max_jobs=3, idle_timeout_s=0, poll_s=0,
                      on_job=lambda job, outcome: outcomes.append((job.trial_number, outcome))) == 3
    assert outcomes == [(0, "done"), (1, "done"), (2, "done")]  # max_jobs caps the batch it claims
    assert queue.counts()["queued"] == 1
    by_trial = {job.trial_number: job for job in queue.jobs()}
    oom = by_trial[1].result
    assert oom["status"] == "oom" and oom["stop_reason"] is None  # not ok: recorded as measured, no rounds
    for t in (0, 2):
        r = by_trial[t].result
        assert r["status"] == "ok" and r["stop_reason"] == "rounds" and r["n_repeats"] == 3 * 2
        assert r["details"]["own_block_latency_ms"] == 2.0 and 0 < r["details"]["latency_ms_min"] <= r["latency_ms"]
        assert r["environment"]["latency_schedule"] == {"kind": "interleaved", "rounds": 3, "per_round": 2,
                                                        "models_in_rounds": 2}
        assert r["memory_mib"] == 1.5  # memory stays the one-by-one figure
    assert worker.run(idle_timeout_s=0, poll_s=0) == 1 and queue.counts()["done"] == 4


def test_rounds_keep_leases_and_a_job_whose_rounds_fail_keeps_its_own_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = JobQueue(f"sqlite:///{tmp_path / 'q.db'}", lease_s=1.0)
    for trial, width in enumerate((8, 16, 32)):
        _enqueue(q, trial, width=width, priority=-trial)

    def slow(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
        time.sleep(0.6)          # three of them outlast the 1 s lease: only the heartbeat keeps the batch
        q.requeue_expired()      # what any other queue user does
        return _ok(2.0)

    import search_spaces

    built: dict[int, int] = {}
    real_build = search_spaces.build_model

    def build(space: str, config: dict[str, Any]) -> Any:
        w = config["hidden"][0]
        built[w] = built.get(w, 0) + 1
        if w == 16 and built[w] > 1:
            raise RuntimeError("no longer builds")
        return real_build(space, config)

    monkeypatch.setattr(search_spaces, "build_model", build)
    worker = ValidationWorker(q, "host-cpu", measure_fn=slow, rounds=2, heartbeat_s=0.2,
                              settings=MeasureSettings(warmup=1, min_repeats=2, max_repeats=3))
    batch = worker.run_batch()
    assert [outcome for _job, outcome in batch] == ["done"] * 3
    assert all(job.attempts == 1 for job in q.jobs())  # never re-queued
    by_trial = {job.trial_number: job.result for job in q.jobs()}
    assert by_trial[0]["stop_reason"] == by_trial[2]["stop_reason"] == "rounds"
    assert by_trial[0]["environment"]["latency_schedule"]["models_in_rounds"] == 2
    kept = by_trial[1]
    assert kept["stop_reason"] is None and kept["latency_ms"] == 2.0
    assert "no longer builds" in kept["environment"]["latency_schedule"]["rounds_failed"]
    q.close()


def test_rounds_arguments_are_checked() -> None:
    q = JobQueue("sqlite://")
    for kwargs in ({"rounds": -1}, {"rounds": 1.5}, {"rounds": True}, {"rounds": 2, "rounds_batch": 0}):
        with pytest.raises(ValidationError, match="must be an int"):
            ValidationWorker(q, "host-cpu", measure_fn=FakeMeasure(), **kwargs)
    with pytest.raises(ValidationError, match="CPU devices only"):
        ValidationWorker(q, "a100-sxm4-40gb", measure_fn=FakeMeasure(), rounds=3)
    with pytest.raises(ValidationError, match="CPU devices only"):
        ParetoValidator("a100-sxm4-40gb", mode="queue", interleave_rounds=3)
    with pytest.raises(ValidationError, match="interleave_batch must be an int"):
        ParetoValidator("host-cpu", measure_fn=FakeMeasure(), interleave_rounds=3, interleave_batch=0)
    v = ParetoValidator("host-cpu", measure_fn=FakeMeasure(), interleave_rounds=3, interleave_batch=4)
    w = v._local_worker(v.queue_for(optuna.create_study()))
    assert (w.rounds, w.rounds_batch) == (3, 4)
    q.close()


_DOOMED_WORKER = textwrap.dedent("""
    import sys, time
    from dippm_nas.validation import JobQueue, ValidationWorker

    def hang(model, spec, device, settings):
        print("measuring", flush=True)
        time.sleep(600)

    queue = JobQueue(sys.argv[1], lease_s=1.0)
    ValidationWorker(queue, "host-cpu", heartbeat_s=0.2, measure_fn=hang, owner="doomed").run_one()
""")


def test_worker_killed_mid_job_is_requeued_after_the_lease(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = JobQueue(url, lease_s=1.0)
    _enqueue(q, 7)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _DOOMED_WORKER, url], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while q.get(1).status != "leased":
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the worker never claimed the job"
            time.sleep(0.1)
        seen_by_doomed = q.get(1)
        assert seen_by_doomed.lease_owner == "doomed"
        time.sleep(2.5)  # 2.5 leases: alive, its heartbeat keeps the job
        assert q.requeue_expired() == 0 and q.get(1).status == "leased"
    finally:
        proc.kill()  # SIGKILL mid-measurement: no clean-up runs
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    fake = FakeMeasure()
    survivor = ValidationWorker(q, "host-cpu", measure_fn=fake, owner="survivor")
    while not q.results():
        survivor.run(idle_timeout_s=0, poll_s=0)
        assert time.monotonic() < deadline, "the dead worker's job was never re-queued"
        time.sleep(0.2)
    job = q.get(1)
    assert job.status == "done" and job.attempts == 2 and job.lease_owner == "survivor"
    assert not q.complete(seen_by_doomed, "doomed", _ok())  # a zombie cannot add a second result
    (rec,) = q.results()
    assert rec.worker == "survivor" and fake.widths == [8]


def test_device_is_here_and_torch_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.errors import DeviceError
    from dippm_nas.validation import _worker

    assert device_is_here("host-cpu") and torch_device_for("host-cpu") == "cpu"
    monkeypatch.setattr(_worker, "_local_gpu_names", lambda: [])
    assert not device_is_here("a100-sxm4-40gb")
    with pytest.raises(DeviceError, match="not on this machine; local CUDA devices: none"):
        torch_device_for("a100-sxm4-40gb")
    monkeypatch.setattr(_worker, "_local_gpu_names", lambda: ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-40GB"])
    assert device_is_here("a100-sxm4-40gb") and torch_device_for("a100-sxm4-40gb") == "cuda:1"
    assert not device_is_here("a100-sxm4-80gb")
    assert torch_device_for("a100-sxm4-80gb", "cuda:0") == "cuda:0"


# ------------------------------------------------------------------------------------------- validator
def _fake_predicted(self: ParetoValidator, space: str, config: dict[str, Any], spec: dict[str, Any]) -> dict:
    return dict(PRED, device=self.device, latency_ms=float(config["hidden"][0]) / 10,
                latency_ms_uncalibrated=float(config["hidden"][0]) / 10)


@pytest.fixture
def fake_predicted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ParetoValidator, "_predicted_for", _fake_predicted)


def _attrs(width: int, std: float | None = None) -> dict[str, Any]:
    return {"search_space": "mlp", "search_space_config": _cfg(width), "input_spec": SPEC.to_dict(),
            "predicted_latency_ms": 1.0, "predicted_latency_ms_std": std, "predicted_memory_mib": 100.0,
            "predicted_memory_mib_std": None, "predicted_energy_j": None}


def _add(study: optuna.Study, values: list[float], attrs: dict[str, Any], *,
         constraint: float | None = None) -> optuna.trial.FrozenTrial:
    system = {} if constraint is None else {"constraints": [constraint]}  # read by Optuna 4.x and 5.x
    study.add_trial(optuna.trial.create_trial(values=values, user_attrs=attrs, system_attrs=system))
    return study.trials[-1]


def test_uncertainty_priority() -> None:
    assert uncertainty_of({"predicted_latency_ms": 2.0, "predicted_latency_ms_std": 0.5,
                           "predicted_memory_mib": 100.0, "predicted_memory_mib_std": 30.0}) == pytest.approx(0.3)
    assert uncertainty_of({"predicted_latency_ms": 2.0, "predicted_latency_ms_std": None}) == 1e9


def test_validator_schedule_by_trials_and_by_time(fake_predicted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    v = ParetoValidator("host-cpu", every_n_trials=3, max_per_round=10, measure_fn=FakeMeasure())
    for i in range(7):
        t = _add(study, [i, i], _attrs(4 + i))  # all on the front
        v(study, t)
    assert len(v.rounds) == 2
    assert v.rounds[0].enqueued == [0, 1, 2] and v.rounds[1].enqueued == [3, 4, 5]
    assert v.rounds[0].measured == 3
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    v(study, study.trials[-1])  # failed trials do not count
    assert len(v.rounds) == 2

    clock = [100.0]
    monkeypatch.setattr(validator_mod, "_monotonic", lambda: clock[0])
    s2 = optuna.create_study(directions=["maximize", "minimize"])
    tv = ParetoValidator("host-cpu", every_n_trials=None, every_seconds=60, measure_fn=FakeMeasure())
    t = _add(s2, [1, 1], _attrs(4))
    clock[0] += 30
    tv(s2, t)
    assert tv.rounds == []
    clock[0] += 31
    tv(s2, t)
    assert len(tv.rounds) == 1 and tv.rounds[0].enqueued == [0]
    with pytest.raises(DippmNasError, match="every_n_trials or every_seconds"):
        ParetoValidator("host-cpu", every_n_trials=None)


def test_validator_takes_feasible_front_by_uncertainty(fake_predicted: None) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    stds = [0.1, None, 0.5, 0.3, None]
    for i, s in enumerate(stds):
        _add(study, [i, i], _attrs(10 + i, s), constraint=-1.0)
    _add(study, [0, 9], _attrs(20), constraint=-1.0)  # dominated by trial 0
    _add(study, [9, 0], _attrs(21), constraint=+5.0)  # would dominate all, but infeasible
    _add(study, [10, 10], {"predicted_latency_ms": 1.0}, constraint=-1.0)  # on the front, no search-space attrs
    fake = FakeMeasure()
    v = ParetoValidator("host-cpu", max_per_round=3, measure_fn=fake)
    r1 = v.run_round(study)
    assert r1.enqueued == [1, 4, 2]  # unknown uncertainty first (oldest first), then 0.5
    assert r1.skipped == [7]
    r2 = v.run_round(study)
    assert r2.enqueued == [3, 0]
    assert v.run_round(study).enqueued == []  # nothing new on the front
    assert fake.widths == [11, 14, 12, 13, 10]  # measured in priority order
    summary = study.user_attrs["dippm_validation"]
    assert summary["measured"] == 5 and summary["ok"] == 5 and summary["device"] == "host-cpu"
    assert summary["jobs"]["done"] == 5


def _budget_attrs(width: int, mean: float, bound: float, budget: float = 10.0) -> dict[str, Any]:
    """A trial's attributes with a latency budget checked: predicted ``mean``, the check's ``bound``."""
    return {**_attrs(width, 0.1 * mean), "predicted_latency_ms": mean, "constraint_latency_ms": bound - budget,
            "budget_latency_ms": budget, "k_sigma_latency_ms": 1.0, "margin_latency_ms": budget - bound}


def test_a_round_also_measures_trials_whose_feasibility_is_uncertain(fake_predicted: None) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    rows = [([1, 5], 5.0, 8.0), ([2, 6], 6.0, 9.0),  # 0, 1: feasible, the front
            ([5, 9], 9.0, 12.0),  # 2: mean within, bound over: band distance 1/3
            ([4, 9.5], 9.5, 10.5),  # 3: band distance 1/2, dominated by 2
            ([6, 11], 11.0, 13.0),  # 4: mean over by half its margin: band distance 1/2
            ([9, 20], 20.0, 22.0)]  # 5: over by 5 margins: firmly rejected
    for i, (values, mean, bound) in enumerate(rows):
        _add(study, values, _budget_attrs(20 + i, mean, bound), constraint=bound - 10.0)
    fake = FakeMeasure()
    v = ParetoValidator("host-cpu", max_per_round=3, measure_fn=fake)
    assert v.uncertain_per_round == 1  # a third of max_per_round
    assert [t.number for t in v.uncertain_trials(study)] == [2, 4, 3]  # undominated first, nearest the budget first
    r1 = v.run_round(study)
    assert sorted(r1.enqueued[:2]) == [0, 1] and r1.enqueued[2:] == [2] and r1.uncertain == [2]
    r2 = v.run_round(study)  # the front is measured: the uncertain ones fill the round (equal distances: oldest)
    assert r2.enqueued == [3, 4] and r2.uncertain == [3, 4]
    assert v.run_round(study).enqueued == []  # trial 5 is firmly over its budget: never taken
    assert fake.widths[2:] == [22, 23, 24]

    # a measurement settles a budget only on the budget's own device and setting: a stand-in device, or a
    # batch / dtype override, measures the front alone
    s3 = optuna.create_study(directions=["maximize", "minimize"])
    for i, (values, mean, bound) in enumerate(rows):
        _add(s3, values, {**_budget_attrs(20 + i, mean, bound), "predicted_device": "a100-sxm4-40gb"}, constraint=bound - 10.0)
    assert [t.number for t in ParetoValidator("a100-sxm4-40gb", mode="queue").uncertain_trials(s3)] == [2, 4, 3]
    stand_in = ParetoValidator("host-cpu", max_per_round=3, measure_fn=FakeMeasure())
    assert stand_in.uncertain_trials(s3) == [] and sorted(stand_in.run_round(s3).enqueued) == [0, 1]
    s4 = optuna.create_study(directions=["maximize", "minimize"])
    for i, (values, mean, bound) in enumerate(rows):
        _add(s4, values, _budget_attrs(20 + i, mean, bound), constraint=bound - 10.0)
    other_batch = ParetoValidator("host-cpu", max_per_round=3, batch_size=4, measure_fn=FakeMeasure())
    assert sorted(other_batch.run_round(s4).enqueued) == [0, 1]

    front_only = ParetoValidator("host-cpu", max_per_round=3, uncertain_per_round=0, measure_fn=FakeMeasure())
    s2 = optuna.create_study(directions=["maximize", "minimize"])
    for i, (values, mean, bound) in enumerate(rows):
        _add(s2, values, _budget_attrs(20 + i, mean, bound), constraint=bound - 10.0)
    assert sorted(front_only.run_round(s2).enqueued) == [0, 1] and front_only.run_round(s2).enqueued == []
    assert ParetoValidator("host-cpu", max_per_round=2, measure_fn=FakeMeasure()).uncertain_per_round == 0
    with pytest.raises(ValidationError, match="uncertain_per_round must be at most max_per_round"):
        ParetoValidator("host-cpu", max_per_round=3, uncertain_per_round=4, measure_fn=FakeMeasure())
    with pytest.raises(ValidationError, match="uncertain_per_round"):
        ParetoValidator("host-cpu", uncertain_per_round=-1, measure_fn=FakeMeasure())


def test_the_validator_reads_generation_trials_and_says_why_it_cannot_rebuild_them(fake_predicted: None) -> None:
    """A generation trial's record is read (its uncertainty ranks it) and skipped with the true reason, not as a trial
    lacking search-space attributes; a forward trial without them, and one without a prediction, say so."""
    from dippm_nas.llm import DecoderConfig, LLMWorkload
    from dippm_nas.optuna import HardwareCostModel

    cost = HardwareCostModel("a100-sxm4-80gb", objectives=("tokens_per_s",), overlap=False)
    llm_study = cost.create_study(leading={})
    trial = llm_study.ask()
    cfg = DecoderConfig(name="tiny", model_type="llama", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=4,
                        head_dim=64, intermediate_size=512, vocab_size=1000, max_positions=1024, rotary_dim=64)
    llm_study.tell(trial, cost.evaluate(trial, cfg, LLMWorkload(64, 16, 2)))
    gen_attrs = dict(llm_study.trials[0].user_attrs)
    assert uncertainty_of(gen_attrs) < 1e9  # the generation figures' σ
    assert DecoderConfig.from_dict(gen_attrs.pop("decoder_config")) == cfg  # without it, 'tiny' cannot be rebuilt

    study = optuna.create_study(directions=["maximize", "minimize"])
    _add(study, [0, -2], gen_attrs)
    _add(study, [1, -1], {"predicted_latency_ms": 1.0, "predicted_memory_mib": 1.0})
    _add(study, [2, 0], {"cost_model_error": "GraphCaptureError: no export"})
    v = ParetoValidator("host-cpu", measure_fn=FakeMeasure())
    report = v.run_round(study)
    assert report.skipped == [0, 1, 2] and report.enqueued == []
    assert "LLM generation" in report.skip_reasons[0] and "'tiny'" in report.skip_reasons[0]
    assert "not an architecture" in report.skip_reasons[0] and "decoder_config" in report.skip_reasons[0]
    assert "lacks the user attributes ['search_space', 'search_space_config', 'input_spec']" in report.skip_reasons[1]
    assert "GraphCaptureError: no export" in report.skip_reasons[2]


def test_validator_records_oom_and_batch_override(fake_predicted: None) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    _add(study, [1, 1], _attrs(99))
    _add(study, [2, 2], _attrs(8))
    v = ParetoValidator("host-cpu", batch_size=64, measure_fn=FakeMeasure())
    summary = v.finish(study)
    assert summary.does_not_fit == 1 and summary.ok == 1 and summary.measured == 2
    jobs = v.queue_for(study).jobs()
    assert {j.spec["batch_size"] for j in jobs} == {64}


def test_validator_dtype_override(fake_predicted: None) -> None:
    """A float16 GPU search validated on a CPU in float32: the jobs carry the override."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    _add(study, [1, 1], _attrs(8))
    v = ParetoValidator("host-cpu", dtype="float32", measure_fn=FakeMeasure())
    v.finish(study)
    assert {j.spec["dtype"] for j in v.queue_for(study).jobs()} == {"float32"}
    with pytest.raises(DippmNasError, match="dtype must be one of"):
        ParetoValidator("host-cpu", dtype="int8")


def test_queue_mode_leaves_jobs_to_the_device_worker(fake_predicted: None, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from dippm_nas.validation import _worker

    monkeypatch.setattr(_worker, "_local_gpu_names", lambda: [])
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(directions=["maximize", "minimize"], storage=url)
    _add(study, [1, 1], _attrs(8))
    _add(study, [2, 2], _attrs(16))
    with pytest.raises(DippmNasError, match="mode='local' needs device 'a100-sxm4-40gb' on this machine"):
        ParetoValidator("a100-sxm4-40gb", mode="local")
    v = ParetoValidator("a100-sxm4-40gb")  # auto: no A100 here -> queue; storage = the study's
    assert not v.local
    r = v.run_round(study)
    assert r.enqueued == [0, 1] and r.measured == 0
    q = JobQueue(url)
    assert q.counts(device="a100-sxm4-40gb")["queued"] == 2
    # ... on the GPU machine: `dippm-nas validate-worker --storage URL --device a100-sxm4-40gb`
    ValidationWorker(q, "a100-sxm4-40gb", measure_fn=FakeMeasure()).run(idle_timeout_s=0, poll_s=0)
    summary = v.finish(study, timeout_s=5, poll_s=0.1)
    assert summary.measured == 2 and summary.jobs["done"] == 2
    assert optuna.load_study(study_name=study.study_name, storage=url).user_attrs["dippm_validation"]["ok"] == 2
    mem = optuna.create_study(directions=["maximize", "minimize"])
    _add(mem, [1, 1], _attrs(8))
    with pytest.raises(DippmNasError, match="in-memory"):
        ParetoValidator("a100-sxm4-40gb").run_round(mem)


# ------------------------------------------------------------------------------------------- calibration
class _Fixed(BasePredictor):
    def __init__(self, device: str) -> None:
        self.device = device

    def predict_graphs(self, graphs: Any, *, mig: bool = True, k_sigma: float = 2.0, runtime: str = "eager",
                       host: Any = None) -> list[Prediction]:
        self.last_execution = (runtime, host)
        return [Prediction(latency_ms=2.0, energy_j=None, memory_mib=3.0, latency_source="analytic",
                           energy_source="unavailable", memory_source="analytic", device=self.device,
                           batch_size=1, dtype="float32", latency_ms_std=0.5) for _ in graphs]


def _done_job(i: int, predicted: float, measured: float, status: str = "ok") -> Job:
    return Job(id=i, study="s", trial_number=i, space="mlp", config=_cfg(), spec=SPEC.to_dict(), device="host-cpu",
               priority=0.0, predicted=dict(PRED, latency_ms=predicted * 3, latency_ms_uncalibrated=predicted),
               status="done", lease_owner="w", lease_expires_at=None, attempts=1,
               result=(_ok(measured) if status == "ok" else _oom()).to_dict(), error=None, created_at=0.0,
               updated_at=0.0)


def test_fit_calibration_uses_uncalibrated_predictions() -> None:
    jobs = [_done_job(0, 1.0, 2.0), _done_job(1, 2.0, 4.0), _done_job(2, 4.0, 8.0), _done_job(3, 1.0, 0.0, "oom")]
    cal = fit_calibration(jobs, "host-cpu", min_rows=3)
    assert cal.latency_scale == pytest.approx(2.0) and cal.n_rows == 3
    assert cal.latency_mape_before_pct == pytest.approx(50.0) and cal.latency_mape_after_pct == pytest.approx(0.0)
    with pytest.raises(DippmNasError, match="at least 4 'ok' measurements, got 3"):
        fit_calibration(jobs, "host-cpu", min_rows=4)
    with pytest.raises(DippmNasError, match="at least 1 'ok' measurements, got 0"):
        fit_calibration(jobs, "a100-sxm4-40gb", min_rows=1)


def test_check_calibration_uses_only_jobs_predicted_after_it() -> None:
    def job(i: int, pred: float, raw: float, meas: float, source: str) -> Job:
        j = _done_job(i, raw, meas)
        return dataclasses.replace(j, predicted=dict(j.predicted, latency_ms=pred, latency_source=source))

    jobs = [job(0, 4.0, 4.0, 2.0, "predicted"),        # before any calibration: never held out
            job(1, 1.1, 2.2, 1.0, "calibrated"), job(2, 2.0, 4.0, 2.5, "calibrated"),
            _done_job(3, 1.0, 0.0, "oom")]
    c = check_calibration(jobs)
    assert c.uncalibrated == 1 and c.uncalibrated_latency_mape_pct == pytest.approx(100.0)
    assert c.held_out == 2
    assert c.latency_mape_before_pct == pytest.approx((120.0 + 60.0) / 2)
    assert c.latency_mape_after_pct == pytest.approx((10.0 + 20.0) / 2)
    assert c.latency_median_ape_before_pct == pytest.approx(90.0)
    assert c.to_dict()["held_out"] == 2
    empty = check_calibration([])
    assert empty.held_out == 0 and empty.latency_mape_after_pct is None


def test_calibrated_predictor_is_applied_once_per_device() -> None:
    cal = fit_calibration([_done_job(0, 1.0, 3.0), _done_job(1, 2.0, 6.0), _done_job(2, 1.5, 4.5)], "host-cpu")
    set_predictor("host-cpu", _Fixed("host-cpu"))
    try:
        apply_calibration(cal)
        apply_calibration(cal)  # replaces, never stacks
        p = get_predictor("host-cpu")
        assert isinstance(p, CalibratedPredictor) and isinstance(p.base, _Fixed)
        (pred,) = p.predict_graphs([object()])  # type: ignore[list-item]
        assert pred.latency_ms == pytest.approx(6.0) and pred.latency_ms_std == pytest.approx(1.5)
        assert pred.latency_source == "calibrated" and pred.memory_source == "analytic"
        assert pred.details["uncalibrated_latency_ms"] == 2.0
        p.predict_graphs([object()], runtime="cuda-graphs", host="h.json")  # type: ignore[list-item]
        assert p.base.last_execution == ("cuda-graphs", "h.json")  # the execution reaches the base predictor
        with pytest.raises(DippmNasError, match="cannot correct the predictor of 'a100-sxm4-40gb'"):
            CalibratedPredictor(_Fixed("a100-sxm4-40gb"), cal)
    finally:
        set_predictor("host-cpu", None)


def test_auto_calibrate_after_enough_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ParetoValidator, "_predicted_for", _fake_predicted)  # predicted = width / 10 ms
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, w in enumerate([10, 20, 40]):
        _add(study, [i, i], _attrs(w))
    fake = FakeMeasure(latency={10: 3.0, 20: 6.0, 40: 12.0})  # measured = 3 x predicted
    v = ParetoValidator("host-cpu", max_per_round=2, auto_calibrate=True, min_calibration_rows=3, measure_fn=fake)
    set_predictor("host-cpu", _Fixed("host-cpu"))
    try:
        v.run_round(study)
        assert v.calibration is None  # 2 rows < 3
        v.run_round(study)
        assert v.calibration is not None and v.calibration.latency_scale == pytest.approx(3.0)
        assert isinstance(get_predictor("host-cpu"), CalibratedPredictor)
        assert study.user_attrs["dippm_validation"]["calibration"]["latency_scale"] == pytest.approx(3.0)
    finally:
        set_predictor("host-cpu", None)


def test_predict_through_a_calibrated_predictor() -> None:
    """dippm_nas.predict answers a calibrated device (it passes runtime and host to every predictor)."""
    import search_spaces

    from dippm_nas.predictor import predict

    model = search_spaces.build_model("mlp", _cfg())
    raw = predict(model, SPEC, "host-cpu", mig=False)
    cal = fit_calibration([_done_job(0, 1.0, 2.0)], "host-cpu", min_rows=1)
    before = get_predictor("host-cpu")
    try:
        apply_calibration(cal)
        pred = predict(model, SPEC, "host-cpu", mig=False)
    finally:
        set_predictor("host-cpu", before)
    assert pred.latency_source == "calibrated" and pred.latency_ms == pytest.approx(2.0 * raw.latency_ms)
    assert pred.details["uncalibrated_latency_ms"] == pytest.approx(raw.latency_ms)


# ------------------------------------------------------------------------------------------- end to end
def test_real_round_and_validate_worker_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A real host-cpu prediction and CPU measurement of tiny MLPs: in the study process, then by the verb."""
    from dippm_nas.cli import main

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(directions=["maximize", "minimize"], storage=url)
    _add(study, [1, 1], _attrs(8))
    settings = MeasureSettings(warmup=1, min_repeats=2, max_repeats=3, time_cap_s=2.0)
    v = ParetoValidator("host-cpu", settings=settings)
    try:
        v.run_round(study)
    finally:  # the round may install the chosen path's predictor for host-cpu: later tests get the loaded one
        set_predictor("host-cpu", None)
    (rec,) = v.records(study)
    assert rec.status == "ok" and rec.measured_latency_ms > 0 and rec.predicted_latency_ms > 0
    from dippm_nas.predictor import find_checkpoint

    assert rec.latency_source == ("predicted" if find_checkpoint("host-cpu") else "analytic")
    if find_checkpoint("host-cpu"):  # a network to adapt: both paths predicted the job before its measurement
        (job,) = v.queue_for(study).jobs(study=study.study_name)
        assert set(job.predicted["paths"]) == {"network", "prior"}
        assert v.rounds[-1].prediction_path == "network"  # one row: no pair scored yet, the network answers

    q = JobQueue(url)
    q.enqueue(study=study.study_name, trial_number=5, space="mlp", config=_cfg(16), spec=SPEC.to_dict(),
              device="host-cpu", predicted=PRED)
    code = main(["validate-worker", "--storage", url, "--device", "host-cpu", "--idle-exit", "0", "--poll", "0",
                 "--warmup", "1", "--min-repeats", "2", "--max-repeats", "3", "--time-cap", "2", "--rounds", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "trial=5 attempt=1: done status=ok" in out and "1 job(s) handled" in out
    (job5,) = [j for j in q.jobs() if j.trial_number == 5]
    assert job5.result["stop_reason"] == "rounds" and job5.result["n_repeats"] == 4
    assert {r.trial_number for r in q.results(study=study.study_name)} == {0, 5}


def test_an_odd_trial_is_skipped_with_its_reason_and_the_round_goes_on(fake_predicted: None) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    _add(study, [0, 0], {**_attrs(8), "predicted_latency_ms": "fast"})  # a string figure
    _add(study, [1, 1], {**_attrs(9), "unknown_ops": ["conv"]})  # a list where counts belong
    _add(study, [2, 2], {**_attrs(10), "search_space_config": {"width": 3}})  # _predicted_for: KeyError
    _add(study, [3, 3], _attrs(11))
    v = ParetoValidator("host-cpu", max_per_round=10, measure_fn=FakeMeasure())
    report = v.run_round(study)
    assert report.enqueued == [3] and sorted(report.skipped) == [0, 1, 2]
    assert "predicted_latency_ms must be a number, got str 'fast'" in report.skip_reasons[0]
    assert "unknown_ops must map operator names to counts" in report.skip_reasons[1]
    assert "KeyError" in report.skip_reasons[2] and "its prediction on host-cpu failed" in report.skip_reasons[2]
    assert report.measured == 1
