"""``dippm-nas gpu-campaign``: end to end on the CPU measurer, resume without duplicates, the time budget, the
order of the grid, the output format, no TVM / Optuna / SQLAlchemy on the GPU machine, and the import that
captures the graphs later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dippm_nas.errors import MeasurementError
from dippm_nas.measure import (
    VALIDATION_SETS,
    CampaignModel,
    CudaMeasurer,
    Measurement,
    campaign_settings,
    plan_campaign,
    read_campaign_rows,
    run_campaign,
)
from dippm_nas.measure._campaign import JSONL_FORMAT, JSONL_SCHEMA_VERSION
from measure.test_measure import MIB, CpuTwinOps, fake_nvml

ROOT = Path(__file__).resolve().parents[2]
FAST = campaign_settings(warmup=1, min_repeats=2, max_repeats=2, time_cap_s=10.0, energy_window_s=0.01, threads=1)
SMOKE = dict(torch_device="cpu", set_name="smoke", runtimes=("eager",), dtypes=("float32",), settings=FAST)


class FakeMeasurer:
    """Returns an 'ok' row per call and counts the calls (no model is run)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def measure(self, model: Any, spec: Any) -> Measurement:
        self.calls.append((type(model).__name__, spec.batch_size))
        return Measurement(latency_ms=1.0, latency_ms_std=0.1, energy_j=None, memory_mib=10.0,
                           memory_source="torch_max_reserved", n_repeats=2, device="cuda:0",
                           environment={"gpu_name": "Fake GPU"}, energy_reason="fake",
                           batch_size=spec.batch_size, dtype=spec.dtype)


def test_campaign_runs_end_to_end_on_the_cpu_and_resumes_without_duplicates(tmp_path: Path) -> None:
    out = tmp_path / "c"
    r1 = run_campaign(out, batches=(1, 2), minutes=5, **SMOKE)
    assert (r1.planned, r1.measured, r1.already, r1.left) == (4, 4, 0, 0)
    assert r1.skipped == {} and r1.by_status == {"ok": 4}
    rows = list(read_campaign_rows(out))
    assert len(rows) == 4 and {r["config"]["name"] for r in rows} == {"tiny_cnn", "tiny_mlp"}
    r = rows[0]
    assert r["status"] == "ok" and r["latency_ms"] > 0 and r["n_repeats"] == 2
    assert r["config"]["spec"].startswith("dippm_nas.measure.campaign_models:") and r["graph_hash"] is None
    assert r["environment"]["cpu_model"] and r["environment"]["torch"]
    r2 = run_campaign(out, batches=(1, 2), minutes=5, resume=True, **SMOKE)
    assert (r2.measured, r2.already) == (0, 4)
    r3 = run_campaign(out, batches=(1, 2, 4), minutes=5, resume=True, **SMOKE)
    assert (r3.planned, r3.measured, r3.already) == (6, 2, 4)
    keys = [r["row_key"] for r in read_campaign_rows(out)]
    assert len(keys) == 6 and len(set(keys)) == 6
    manifest = json.loads((out / "campaign.json").read_text())
    assert manifest["set"] == "smoke" and manifest["measured_rows"] == 6 and len(manifest["runs"]) == 3
    assert manifest["machine"]["cpu_model"]


def test_an_existing_campaign_needs_resume(tmp_path: Path) -> None:
    fake = FakeMeasurer()
    run_campaign(tmp_path, batches=(1,), measurer=fake, **{**SMOKE, "torch_device": "cuda"})
    with pytest.raises(MeasurementError, match="resume"):
        run_campaign(tmp_path, batches=(1,), measurer=fake, **{**SMOKE, "torch_device": "cuda"})
    with pytest.raises(MeasurementError, match="set 'smoke'"):
        run_campaign(tmp_path, resume=True, measurer=fake, torch_device="cuda", set_name="v1", batches=(1,))


def test_the_time_budget_stops_the_run_and_resume_finishes_it(tmp_path: Path) -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 25.0  # each look at the clock: 25 s later
        return now[0]

    fake = FakeMeasurer()
    kw = dict(measurer=fake, torch_device="cuda", set_name="smoke", runtimes=("eager",), dtypes=("float32",),
              batches=(1, 2, 4), settings=FAST)
    r = run_campaign(tmp_path, minutes=1.0, clock=clock, **kw)
    assert 0 < r.measured < r.planned and r.left == r.planned - r.measured
    r2 = run_campaign(tmp_path, minutes=60.0, resume=True, **kw)
    assert r2.measured == r.left and r2.already == r.measured
    assert Counter(x["row_key"] for x in read_campaign_rows(tmp_path)).most_common(1)[0][1] == 1


def test_the_grid_is_ordered_most_informative_first() -> None:
    _, models = VALIDATION_SETS["v1"]
    items = plan_campaign(models)
    n = len(models)
    first = items[:n]
    assert all((i.runtime, i.dtype, i.batch_size) == ("eager", "float16", 32) for i in first)
    assert [i.model.family for i in first[:5]] == ["cnn", "vit", "swin", "bert", "gpt2"]  # families alternate
    assert all(i.batch_size == 1 and i.runtime == "eager" for i in items[n:2 * n])
    keys = {(i.model.name, i.batch_size, i.dtype, i.runtime) for i in items}
    assert len(keys) == len(items) == n * 3 * 3 * 6   # the whole grid, once
    assert {m.family for m in models} >= {"cnn", "vit", "swin", "bert", "gpt2"}
    with pytest.raises(MeasurementError, match="unknown runtimes"):
        plan_campaign(models, runtimes=("jit",))


def test_cpu_leaves_cuda_graphs_out_and_says_why(tmp_path: Path) -> None:
    r = run_campaign(tmp_path, batches=(1,), measurer=FakeMeasurer(), torch_device="cpu", set_name="smoke",
                     dtypes=("float32",), runtimes=("eager", "cuda-graphs"), settings=FAST)
    assert "cuda-graphs" in r.skipped and r.planned == 2


def test_rows_are_the_dataset_jsonl_format_and_files_stay_under_the_limit(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy")
    from dippm_nas.dataset import iter_jsonl
    from dippm_nas.dataset._export import JSONL_FORMAT as DATASET_FORMAT
    from dippm_nas.dataset._store import MEASUREMENT_COLUMNS, SCHEMA_VERSION

    assert (JSONL_FORMAT, JSONL_SCHEMA_VERSION) == (DATASET_FORMAT, SCHEMA_VERSION)
    limit_mib = 4096 / 2**20  # 4 KiB: a row or two per file
    run_campaign(tmp_path, batches=(1, 2, 4), measurer=FakeMeasurer(), torch_device="cuda", set_name="smoke",
                 dtypes=("float32",), runtimes=("eager",), settings=FAST, max_file_mib=limit_mib)
    files = sorted(tmp_path.glob("measurements-*.jsonl"))
    assert len(files) > 1 and all(f.stat().st_size <= 4096 for f in files)
    recs = [r for f in files for r in iter_jsonl(f)]
    assert len(recs) == 6
    key = json.loads((tmp_path / "campaign.json").read_text())["device_key"]
    for r in recs:
        assert set(r) <= {"type", "created_at", *MEASUREMENT_COLUMNS}
        assert r["type"] == "measurement" and r["source"] == "gpu-campaign" and r["device"] == key


_BLOCKER = """
import sys, importlib.abc, runpy
attempts = []
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tvm", "optuna", "sqlalchemy"):
            attempts.append(name)
            raise ImportError(name + " is blocked")
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = ["dippm_nas", *sys.argv[1:]]
try:
    runpy.run_module("dippm_nas", run_name="__main__", alter_sys=True)
finally:
    print("BLOCKED", sorted(set(attempts)), file=sys.stderr)
"""


def test_the_campaign_runs_without_tvm_optuna_and_sqlalchemy(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", _BLOCKER, "gpu-campaign", "--out", str(tmp_path / "c"), "--device", "cpu",
           "--set", "smoke", "--runtimes", "eager", "--dtypes", "float32", "--batches", "1", "--minutes", "2",
           "--time-cap", "10"]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "BLOCKED []" in p.stderr, p.stderr[-3000:]
    assert "2 rows measured" in p.stdout
    assert len(list(read_campaign_rows(tmp_path / "c"))) == 2


def test_import_captures_the_graphs_later(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy")
    from dippm_nas.dataset import import_campaign, load_measurements

    out = tmp_path / "c"
    run_campaign(out, batches=(1,), measurer=FakeMeasurer(), torch_device="cuda", set_name="smoke",
                 dtypes=("float32",), runtimes=("eager", "compiled"), settings=FAST)
    db = tmp_path / "d.sqlite"
    rep = import_campaign(out, db, workers=1, progress=False, cache=False)
    assert (rep.rows_read, rep.inserted, rep.graphs_captured, rep.graphs_failed) == (4, 4, 2, 0)  # 2 graphs, 4 rows
    got = load_measurements(db, source="gpu-campaign")
    assert len(got) == 4 and {g.measurement["config"]["runtime"] for g in got} == {"eager", "compiled"}
    assert all(g.spec.batch_size == 1 and g.graph.num_nodes > 0 for g in got)
    assert import_campaign(out, db, workers=1, progress=False, cache=False).inserted == 0   # nothing twice


def test_validation_set_models_name_real_builders() -> None:
    _, models = VALIDATION_SETS["v1"]
    assert len({m.name for m in models}) == len(models)
    for m in models:
        prefix = m.spec.split(":")[0]
        assert prefix in ("torchvision", "timm", "dippm_nas.measure.campaign_models")
        spec = m.input_spec(8, "float16")
        assert spec.batch_size == 8 and spec.dtype == "float16"
    assert isinstance(models[0], CampaignModel)


def test_a_gpu_row_records_max_memory_allocated_and_reserved(tmp_path: Path) -> None:
    """On a GPU every row keeps ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` (the figures the
    prior's ``allocated_mib`` / ``reserved_mib`` predict), here through the CPU twin of the CUDA measurer."""
    nv = fake_nvml(energy_mj=[1_000_000 + 1000 * i for i in range(400)], used=[700 * MIB, 3_272 * MIB] * 200)
    with CudaMeasurer(FAST, torch_device="cuda:0", nvml=nv, ops=CpuTwinOps()) as m:
        run_campaign(tmp_path / "g", batches=(1,), minutes=5, measurer=m,
                     **{**SMOKE, "torch_device": "cuda:0"})
    rows = list(read_campaign_rows(tmp_path / "g"))
    assert rows and all(r["status"] == "ok" for r in rows)
    for r in rows:
        parts = r["extra"]["memory_parts_mib"]
        assert parts["torch_max_allocated_mib"] == 200.0 and parts["torch_max_reserved_mib"] == 300.0
