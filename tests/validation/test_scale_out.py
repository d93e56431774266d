"""Scale-out: several processes optimise one study on one Optuna RDB storage, sharing the conversion cache
and the validation queue; nothing is lost or duplicated.

Runs on SQLite (always) and on PostgreSQL (marked ``postgres``; needs ``DIPPM_NAS_TEST_PG_URL``, which
``.ci/run`` exports after starting Debian's postgresql on 127.0.0.1). Each PostgreSQL run works in a fresh
schema that is dropped afterwards. Measurements are faked in the workers (the point is the
bookkeeping); models are tiny MLPs from a space of 6 architectures, so the processes meet the same
architectures and race on the same cache keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest

from dippm_nas.cache import ConversionCache
from dippm_nas.capture import assemble
from dippm_nas.measure import Measurement
from dippm_nas.spec import InputSpec
from dippm_nas.validation import JobQueue, ParetoValidator

REPO = Path(__file__).resolve().parents[2]
WORKERS = 2
TRIALS_PER_WORKER = 6
SPEC = InputSpec(shape=(4,), batch_size=2)

optuna.logging.set_verbosity(optuna.logging.WARNING)

_WORKER = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import optuna
    import search_spaces as ss
    from dippm_nas.cache import ConversionCache
    from dippm_nas.measure import Measurement
    from dippm_nas.optuna import Budgets, HardwareCostModel, rdb_storage
    from dippm_nas.spec import InputSpec
    from dippm_nas.validation import ParetoValidator

    storage, cache_url, study_name, n_trials, seed = sys.argv[1:6]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cache = ConversionCache(cache_url)
    cost = HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb"), cache=cache)
    study = optuna.load_study(study_name=study_name, storage=rdb_storage(storage),
                              sampler=optuna.samplers.RandomSampler(seed=int(seed)))

    def fake_measure(model, spec, device, settings):
        return Measurement(latency_ms=1.0, latency_ms_std=0.1, energy_j=None, memory_mib=None, memory_source=None,
                           n_repeats=3, device="cpu", environment={}, energy_reason="faked in this test")

    validator = ParetoValidator("host-cpu", every_n_trials=2, max_per_round=2, measure_fn=fake_measure)

    def objective(trial):
        depth = trial.suggest_int("depth", 1, 2)
        hidden = [trial.suggest_categorical(f"w{i}", [8, 16]) for i in range(depth)]
        model = ss.build_model("mlp", {"in_features": 4, "hidden": hidden, "out_features": 2})
        return (float(sum(hidden)), *cost.evaluate(trial, model, InputSpec(shape=(4,), batch_size=2)))

    study.optimize(objective, n_trials=int(n_trials), callbacks=[validator])
    validator.finish(study)
    print(json.dumps({"stats": cache.stats(), "rounds": len(validator.rounds)}))
""")


def _fake_measure(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
    return Measurement(latency_ms=1.0, latency_ms_std=0.1, energy_j=None, memory_mib=None, memory_source=None,
                       n_repeats=3, device="cpu", environment={}, energy_reason="faked in this test")


def _run_workers(storage: str, cache_url: str) -> optuna.Study:
    from dippm_nas.optuna import Budgets, HardwareCostModel

    name = f"scale-out-{uuid.uuid4().hex[:8]}"
    HardwareCostModel(budgets=Budgets(mig_profile="1g.5gb")).create_study(study_name=name, storage=storage)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, storage, cache_url, name, str(TRIALS_PER_WORKER),
                               str(seed)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in range(WORKERS)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["rounds"] >= 1 for r in reports)
    return optuna.load_study(study_name=name, storage=storage)


def _check(study: optuna.Study, storage: str, cache_url: str) -> None:
    n = WORKERS * TRIALS_PER_WORKER
    trials = study.trials
    # trials: none lost, none duplicated
    assert sorted(t.number for t in trials) == list(range(n))
    assert len({t._trial_id for t in trials}) == n
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all("predicted_latency_ms" in t.user_attrs for t in trials)

    # cache: the blocks of every architecture the study met, none lost: each assembles again from the shared
    # cache without a new row (search-space candidates are assembled from cached blocks)
    configs = {json.dumps(t.user_attrs["search_space_config"], sort_keys=True) for t in trials}
    cache = ConversionCache(cache_url)
    try:
        rows = cache.stats()["rows"]
        assert rows > 0
        for c in configs:
            assemble("mlp", json.loads(c), SPEC, cache=cache)
        assert cache.stats()["rows"] == rows
    finally:
        cache.close()

    # validation queue: one job per (trial, device), each done once, one result per job
    # the last round may meet more unvalidated front trials than the default max_per_round (3): how many the
    # workers' own rounds left depends on their interleaving, so let this round take the whole front
    ParetoValidator("host-cpu", storage=storage, measure_fn=_fake_measure,
                    max_per_round=WORKERS * TRIALS_PER_WORKER).finish(study)
    q = JobQueue(storage)
    try:
        jobs = q.jobs(study=study.study_name)
        numbers = [j.trial_number for j in jobs]
        assert len(numbers) == len(set(numbers)) and jobs
        assert all(j.status == "done" and j.attempts == 1 for j in jobs)
        results = q.results(study=study.study_name)
        assert sorted(r.job_id for r in results) == sorted(j.id for j in jobs)
        front = {t.number for t in study.best_trials}
        assert front <= set(numbers)
    finally:
        q.close()


def test_workers_share_sqlite_storage_cache_and_queue(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    cache_url = f"sqlite:///{tmp_path / 'cache.sqlite'}"
    study = _run_workers(storage, cache_url)
    _check(study, storage, cache_url)


@pytest.mark.postgres
def test_workers_share_postgresql_storage_cache_and_queue(pg_url: str) -> None:
    study = _run_workers(pg_url, pg_url)
    _check(study, pg_url, pg_url)


def _hammer_claims(url: str, n_jobs: int = 40, n_threads: int = 4) -> None:
    """Threads with their own connections claim until the queue is empty: each job goes to exactly one."""
    import threading

    study = f"claims-{uuid.uuid4().hex[:8]}"
    q = JobQueue(url)
    for i in range(n_jobs):
        q.enqueue(study=study, trial_number=i, space="mlp", config={"hidden": [4]}, spec=SPEC.to_dict(),
                  device="host-cpu", predicted={"latency_ms": 1.0})
    claimed: list[list[int]] = [[] for _ in range(n_threads)]
    barrier = threading.Barrier(n_threads)

    def work(k: int) -> None:
        mine = JobQueue(url)
        barrier.wait()
        while (job := mine.claim("host-cpu", f"t{k}", study=study)) is not None:
            claimed[k].append(job.id)
        mine.close()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    every = [i for c in claimed for i in c]
    jobs = q.jobs(study=study)
    assert sorted(every) == sorted(j.id for j in jobs)  # none lost, none handed out twice
    assert all(j.attempts == 1 and j.status == "leased" for j in jobs)
    assert {j.lease_owner for j in jobs} == {f"t{k}" for k, c in enumerate(claimed) if c}
    q.close()


def test_concurrent_claims_on_sqlite(tmp_path: Path) -> None:
    _hammer_claims(f"sqlite:///{tmp_path / 'q.db'}")


@pytest.mark.postgres
def test_concurrent_claims_on_postgresql(pg_url: str) -> None:
    _hammer_claims(pg_url)
