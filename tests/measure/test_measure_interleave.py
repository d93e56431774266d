"""Interleaved-round CPU timing (``time_interleaved``) and ``build_dataset(rounds=...)``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import search_spaces as ss
from dippm_nas.cli import main as cli_main
from dippm_nas.dataset import DatasetError, DatasetStore, build_dataset
from dippm_nas.errors import MeasurementError
from dippm_nas.measure import Measurement, MeasureSettings, RoundTiming, time_interleaved
from dippm_nas.spec import InputSpec
from search_spaces import IntRange, SearchSpace, register_space

SETTINGS = MeasureSettings(warmup=1, min_repeats=2, max_repeats=2, threads=1)


#: forwards of every ``_Counting`` model in order (module level: the measured copy is a deepcopy)
LOG: list[str] = []


class _Counting(nn.Module):
    """Records its forwards in ``LOG``; raises from forward number ``fail_at`` (0-based) on."""

    def __init__(self, name: str, fail_at: int | None = None) -> None:
        super().__init__()
        self.name, self.fail_at = name, fail_at
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail_at is not None and LOG.count(self.name) >= self.fail_at:
            raise RuntimeError(f"{self.name} broke on purpose")
        LOG.append(self.name)
        return self.lin(x)


@pytest.fixture(autouse=True)
def _clear_log() -> None:
    LOG.clear()


class _StepClock:
    """perf_counter stand-in: each call advances by the next step (seconds)."""

    def __init__(self, step_s: float) -> None:
        self.t, self.step = 0.0, step_s

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_rounds_interleave_models_and_time_each_per_round() -> None:
    spec = InputSpec(shape=(4,), batch_size=2)
    items = [(_Counting("a"), spec), (_Counting("b"), spec)]
    out = time_interleaved(items, SETTINGS, rounds=3, per_round=2, clock=_StepClock(0.001))
    assert [t.status for t in out] == ["ok", "ok"] and [t.rounds for t in out] == [3, 3]
    assert all(len(t.samples_ms) == 6 for t in out)
    assert all(s == pytest.approx(1.0) for t in out for s in t.samples_ms)  # one clock step = 1 ms
    # per round: one untimed + two timed forwards of a, then of b; three rounds
    assert LOG == (["a"] * 3 + ["b"] * 3) * 3
    f = out[0].latency_fields()
    assert f["latency_ms"] == pytest.approx(1.0) and f["n_repeats"] == 6 and f["latency_ms_median"] == pytest.approx(1.0)


def test_a_model_that_fails_in_a_round_leaves_and_the_others_go_on() -> None:
    spec = InputSpec(shape=(4,), batch_size=1)
    items = [(_Counting("bad", fail_at=4), spec), (_Counting("good"), spec)]
    out = time_interleaved(items, SETTINGS, rounds=3, per_round=2)
    bad, good = out
    assert bad.status == "error" and "broke on purpose" in (bad.reason or "") and "forward" in (bad.reason or "")
    assert bad.rounds == 1 and len(bad.samples_ms) == 2  # round 1 done, round 2 failed on its first timed forward
    assert good.ok and good.rounds == 3 and len(good.samples_ms) == 6
    assert bad.latency_fields()["latency_ms"] is None  # no figure from a model that failed


@pytest.mark.parametrize("kw", [{"rounds": 0, "per_round": 2}, {"rounds": 2, "per_round": 0},
                                {"rounds": True, "per_round": 2}])
def test_bad_round_counts_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(MeasurementError, match="must be an int >= 1"):
        time_interleaved([(nn.Linear(2, 2), InputSpec(shape=(2,)))], SETTINGS, **kw)


def test_items_are_checked_like_measure() -> None:
    with pytest.raises(MeasurementError, match="nn.Module"):
        time_interleaved([(lambda x: x, InputSpec(shape=(2,)))], SETTINGS, rounds=1, per_round=1)


# ------------------------------------------------------------------------------------------ build_dataset
class _ForwardRaisesSpace(SearchSpace):
    """Builds and captures fine, raises in every eager forward (measured ok by a fake measurer, fails in the
    rounds)."""

    params = {"width": IntRange(1, 8)}

    def default_config(self) -> dict[str, Any]:
        return {"width": 4}

    def _build(self, config: dict[str, Any]) -> nn.Module:
        class Boom(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if torch.compiler.is_exporting() or x.device.type == "meta":
                    return x * 2  # the capture sees a graph
                raise RuntimeError("forward exploded on purpose")

        return Boom()

    def _sample(self, rng: Any) -> dict[str, Any]:
        return {"width": rng.randint(1, 8)}

    def input_spec(self, config: dict[str, Any], batch_size: int = 1, dtype: str = "float32") -> InputSpec:
        return InputSpec(shape=(self.validate(config)["width"],), batch_size=batch_size, dtype=dtype)


if "interleave_test_forward_raises" not in ss.list_spaces():
    register_space("interleave_test_forward_raises")(_ForwardRaisesSpace)


def _fake(model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
    return Measurement(latency_ms=1.5, latency_ms_std=0.1, energy_j=None, memory_mib=12.0, memory_source="rss_delta",
                       n_repeats=5, device=device, environment={"fake_measurer": True}, status="ok",
                       energy_reason="fake measurer: no energy", batch_size=spec.batch_size, dtype=spec.dtype,
                       stop_reason="converged")


def test_build_with_rounds_takes_latency_from_the_rounds_and_keeps_the_own_block(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite"
    mlp = [{"space": "mlp", "config": {"in_features": 8, "hidden": [16 * (i + 1)]}, "batch_size": 2} for i in range(3)]
    boom = {"space": "interleave_test_forward_raises", "config": {"width": 4}, "batch_size": 1}
    r = build_dataset(db, candidates=[*mlp, boom], workers=1, progress=False, measure_fn=_fake, settings=SETTINGS,
                      rounds=3, chunk_size=16)
    assert (r.done, r.failed, r.measured_now, r.failed_now) == (3, 1, 3, 1)
    rows = list(DatasetStore(db).iter_measurements())
    ok = [x for x in rows if x["status"] == "ok"]
    assert len(ok) == 3
    for row in ok:
        assert row["stop_reason"] == "rounds" and row["n_repeats"] == 3 * SETTINGS.min_repeats
        assert row["latency_ms"] != 1.5 and row["latency_ms"] > 0  # timed for real, not the fake's figure
        assert row["extra"]["own_block"]["latency_ms"] == 1.5 and row["extra"]["own_block"]["stop_reason"] == "converged"
        assert 0 < row["extra"]["latency_ms_min"] <= row["latency_ms"]
        assert row["memory_mib"] == 12.0  # memory stays the one-by-one measurement's
        assert row["environment"]["latency_schedule"] == {"kind": "interleaved", "rounds": 3, "per_round": 2,
                                                          "untimed_per_round": 1}
        assert row["environment"]["chunk_models_in_rounds"] == 4
    (bad,) = [x for x in rows if x["status"] != "ok"]
    assert bad["status"] == "error" and "interleaved round 1" in bad["reason"] and "on purpose" in bad["reason"]
    assert bad["latency_ms"] is None and bad["memory_mib"] is None
    assert bad["extra"]["own_block"]["latency_ms"] == 1.5  # what the one-by-one measurement said is kept


def test_rounds_keep_no_model_alive_while_the_next_ones_memory_is_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a peak-RSS delta measured while earlier models are held reads low (their freed heap blocks are reused):
    # each one-by-one measurement must see no earlier model alive; the rounds build the models again
    import gc
    import weakref

    seen: list[weakref.ref[Any]] = []

    def alone(model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
        gc.collect()
        assert all(r() is None for r in seen), "an earlier model is still alive during this measurement"
        seen.append(weakref.ref(model))
        return _fake(model, spec, device, settings)

    db = tmp_path / "d.sqlite"
    mlp = [{"space": "mlp", "config": {"in_features": 8, "hidden": [16 * (i + 1)]}, "batch_size": 2} for i in range(3)]
    r = build_dataset(db, candidates=mlp, workers=1, progress=False, measure_fn=alone, settings=SETTINGS, rounds=2,
                      chunk_size=16)
    assert (r.done, r.failed) == (3, 0) and len(seen) == 3
    assert all(row["stop_reason"] == "rounds" for row in DatasetStore(db).iter_measurements())

    # a model that no longer builds for the rounds is a failed row that says so; the others are timed
    real_build = ss.build_model
    measured: list[int] = []

    def flaky(space: str, config: dict[str, Any]) -> Any:
        if len(measured) == len(mlp) and config["hidden"] == [32]:  # every model measured: the rounds' build
            raise RuntimeError("build for the rounds refused on purpose")
        return real_build(space, config)

    def counting(model: Any, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
        measured.append(1)
        return _fake(model, spec, device, settings)

    monkeypatch.setattr(ss, "build_model", flaky)
    db2 = tmp_path / "d2.sqlite"
    r2 = build_dataset(db2, candidates=mlp, workers=1, progress=False, measure_fn=counting, settings=SETTINGS,
                       rounds=2, chunk_size=16)
    assert (r2.done, r2.failed, r2.measured_now, r2.failed_now) == (2, 1, 2, 1)
    rows = list(DatasetStore(db2).iter_measurements())
    (bad,) = [x for x in rows if x["status"] != "ok"]
    assert "building it again for the interleaved rounds failed" in bad["reason"] and "on purpose" in bad["reason"]
    assert bad["latency_ms"] is None and bad["memory_mib"] is None and bad["n_repeats"] == 0
    assert bad["extra"]["own_block"]["latency_ms"] == 1.5
    assert all(x["environment"]["chunk_models_in_rounds"] == 2 for x in rows)


@pytest.mark.parametrize("kw, match", [({"torch_device": "cuda"}, "torch_device='cpu'"), ({"isolate": True}, "isolate=False"),
                                       ({"rounds": -1}, "rounds must be an int >= 0")])
def test_rounds_refuse_what_they_cannot_do(tmp_path: Path, kw: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"rounds": 2, **kw}
    with pytest.raises(DatasetError, match=match):
        build_dataset(tmp_path / "d.sqlite", spaces=["mlp"], n=1, workers=1, progress=False, measure_fn=_fake, **args)


def test_cli_rounds_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "d.sqlite"
    rc = cli_main(["dataset", "build", "--space", "mlp", "--n", "2", "--batch", "1", "--out", str(db), "--workers", "1",
                   "--min-repeats", "2", "--max-repeats", "2", "--rounds", "2", "--no-progress", "--no-cache"])
    assert rc == 0
    rows = list(DatasetStore(db).iter_measurements())
    assert len(rows) == 2 and {x["stop_reason"] for x in rows} == {"rounds"} and {x["n_repeats"] for x in rows} == {4}
    assert json.loads(json.dumps(rows[0]["environment"]))["latency_schedule"]["rounds"] == 2
