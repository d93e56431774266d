"""Bad arguments, inputs and command lines on purpose: the cases of ``docs/reliability.md``, section
"Arguments, inputs and the command line".

The rule each test checks: a bad value is a :class:`DippmNasError` that names the rule, the value and the
choices (never a bare ``KeyError`` / ``TypeError`` / ``ValueError``, never a silently truncated or accepted
value); a NumPy scalar is the number it holds; a command line with a bad number is a usage error (exit 2)
before any work; an output path that cannot be written fails before the work that fills it (exit 2); a file
given as a model is read only when it is a regular file within a stated size.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import torch
from torch import nn

import dippm_nas
from dippm_nas import InputSpec, capture
from dippm_nas.budgets import Budgets
from dippm_nas.cache import set_default_cache
from dippm_nas.cli import main
from dippm_nas.errors import (
    BudgetError,
    CheckpointError,
    DeviceError,
    ExecutionRuntimeError,
    GraphCaptureError,
    InputSpecError,
    InvalidTypeError,
    InvalidValueError,
    ModelSpecError,
)
from dippm_nas.measure import Measurement, MeasureSettings
from dippm_nas.predictor import AnalyticPredictor, get_predictor, set_predictor
from dippm_nas.capture import MAX_ONNX_BYTES, load_model
from dippm_nas.validation import JOBS_TABLE, JobQueue, ParetoValidator, ValidationWorker

SPEC4 = InputSpec(shape=(4,), batch_size=2)
MLP = {"in_features": 4, "hidden": [8], "out_features": 2}
FAST = MeasureSettings(warmup=1, min_repeats=2, max_repeats=2, time_cap_s=10.0)


def Small() -> nn.Module:  # noqa: N802 - a model constructor, named as one
    """A 4 -> 4 linear layer and a ReLU."""
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


@pytest.fixture(scope="module")
def graph() -> Any:
    return capture(Small(), SPEC4, cache=False)


# ============================================================================ A: InputSpec and numbers
def test_a1_a_non_integral_batch_size_is_refused_never_truncated() -> None:
    with pytest.raises(InputSpecError, match=r"batch_size must be an int >= 1, got 2\.9 \(not a whole number\)"):
        InputSpec.from_dict({"shape": [4], "batch_size": 2.9, "dtype": "float32"})
    from dippm_nas.nni import spec_from_parameters  # NNI trial parameters carry a batch size too

    params = {"dippm": {"search_space": "mlp", "config": MLP, "batch_size": 2.9}}
    with pytest.raises(InputSpecError, match=r"batch_size.*2\.9"):
        spec_from_parameters(params)
    # an integral float (NNI's quniform gives 64.0) is the count it holds
    assert InputSpec.from_dict({"shape": [4], "batch_size": 8.0, "dtype": "float32"}).batch_size == 8


@pytest.mark.parametrize("d,needle", [
    ({"shape": [4], "dtype": "float32"}, "lacks the key 'batch_size'"),
    ({"shape": [4], "batch_size": 2}, "lacks the key 'dtype'"),
    ({"batch_size": 2, "dtype": "float32"}, "must have the key 'shape'"),
    ({"shape": [4], "batch_size": 2, "dtype": "float32", "batch": 3}, r"unknown keys \['batch'\]"),
    ({"inputs": [{"shape": [3]}], "batch_size": 2, "dtype": "float32"}, r"inputs\[0\].*lacks the key 'name'"),
    ({"inputs": "x", "batch_size": 2, "dtype": "float32"}, "'inputs' of an InputSpec dict must be a list"),
    ([1, 2], "must be a mapping"),
    ({"shape": [4], "batch_size": "abc", "dtype": "float32"}, r"batch_size must be an int >= 1, got 'abc' \(str\)"),
    ({"shape": [4], "batch_size": True, "dtype": "float32"}, r"got True \(bool\)"),
    ({"shape": [4], "batch_size": math.nan, "dtype": "float32"}, "batch_size must be an int >= 1, got nan"),
    ({"shape": 5, "batch_size": 2, "dtype": "float32"}, "shape must be a sequence"),
    ({"shape": [4], "batch_size": 2, "dtype": 5}, "dtype must be one of"),
])
def test_a2_a_malformed_spec_dict_is_an_input_spec_error_naming_the_key(d: Any, needle: str) -> None:
    with pytest.raises(InputSpecError, match=needle):
        InputSpec.from_dict(d)


def test_a3_a_named_input_with_an_unknown_key_lists_the_keys() -> None:
    with pytest.raises(InputSpecError,
                       match=r"inputs\['x'\] has unknown keys \['foo'\]; the keys are shape, dtype, high"):
        InputSpec(inputs={"x": {"shape": (3,), "foo": 1}})
    with pytest.raises(InputSpecError, match=r"inputs\['x'\] lacks the key 'shape'"):
        InputSpec(inputs={"x": {"dtype": "int64"}})


def test_a4_numpy_scalars_are_the_numbers_they_hold() -> None:
    spec = InputSpec(shape=(np.int64(3), np.int32(8)), batch_size=np.int64(8))
    assert spec.batch_size == 8 and type(spec.batch_size) is int and spec.shape == (3, 8)
    assert type(spec.shape[0]) is int and spec.to_dict()["batch_size"] == 8
    assert InputSpec.from_dict({"shape": [4], "batch_size": np.int64(8), "dtype": "float32"}).batch_size == 8
    b = Budgets(latency_ms=np.float32(5.0), memory_mib=np.int64(500), k_sigma=np.float32(1.0),
                k_sigmas={"memory_mib": np.float64(2.0)})
    assert (b.latency_ms, b.memory_mib, b.k_sigma, b.k_for("memory_mib")) == (5.0, 500.0, 1.0, 2.0)
    assert Budgets.from_mapping({"energy_j": np.float32(0.5)}).energy_j == 0.5
    # the queue path: a validator's batch size is stored as a plain int (JSON), its spec rebuilds
    v = ParetoValidator("host-cpu", every_n_trials=np.int64(2), batch_size=np.int64(8), measure_fn=_fake_measure)
    assert v.batch_size == 8 and type(v.batch_size) is int and type(v.every_n_trials) is int


@pytest.mark.parametrize("make,needle", [
    (lambda: Budgets(latency_ms=np.float32("nan")), "budget latency_ms must be a finite number > 0"),
    (lambda: Budgets(latency_ms=np.True_), r"got np.True_ \(bool\)|got True \(bool"),
    (lambda: Budgets(latency_ms=True), r"got True \(bool\)"),
    (lambda: Budgets(k_sigma=np.float32(-1.0)), "k_sigma must be a finite number >= 0"),
    (lambda: InputSpec(shape=(4,), batch_size=np.float64(2.5)), r"got np.float64\(2.5\) \(not a whole number\)"),
    (lambda: InputSpec(shape=(4,), batch_size=True), r"got True \(bool\)"),
    (lambda: InputSpec(shape=(4,), batch_size=np.int64(0)), "batch_size must be an int >= 1"),
])
def test_a5_numpy_scalars_still_refuse_bools_nan_and_fractions(make: Any, needle: str) -> None:
    with pytest.raises((InputSpecError, BudgetError), match=needle):
        make()


def _fake_measure(model: Any, spec: InputSpec, device: str, settings: Any) -> Measurement:
    return Measurement(latency_ms=1.0, latency_ms_std=0.01, energy_j=None, memory_mib=1.0, memory_source="rss_delta",
                       n_repeats=2, device="cpu", environment={"fake": True}, energy_reason="faked in this test")


def test_a6_a_queue_job_without_a_batch_size_is_failed_with_a_reason_naming_the_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    q = JobQueue(url)
    ids = [q.enqueue(study="s", trial_number=i, space="mlp", config=MLP, spec=SPEC4.to_dict(), device="host-cpu",
                     predicted={"latency_ms": 1.0}) for i in range(2)]
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # a row written by hand (or by another tool) without a batch size
        conn.execute(sa.text(f"UPDATE {JOBS_TABLE} SET spec_json = :s WHERE id = :id"),
                     {"s": '{"dtype": "float32", "shape": [4]}', "id": ids[0]})
    engine.dispose()
    ValidationWorker(q, "host-cpu", measure_fn=_fake_measure, settings=FAST).run(idle_timeout_s=0, poll_s=0.01)
    by_id = {j.id: j for j in q.jobs()}
    assert by_id[ids[1]].status == "done"
    bad = q.get(ids[0])
    assert bad.status == "failed" and "unexpected" not in bad.error
    assert "InputSpecError" in bad.error and "lacks the key 'batch_size'" in bad.error and "spec_json" in bad.error
    q.close()


def test_a7_a_queue_job_spec_with_numpy_scalars_is_stored_as_plain_json(tmp_path: Path) -> None:
    q = JobQueue(f"sqlite:///{tmp_path / 'q.sqlite'}")
    spec = {**SPEC4.to_dict(), "batch_size": np.int64(SPEC4.batch_size)}
    jid = q.enqueue(study="s", trial_number=0, space="mlp", config=MLP, spec=spec, device="host-cpu",
                    predicted={"latency_ms": 1.0})
    stored = q.get(jid).spec
    assert stored == SPEC4.to_dict() and type(stored["batch_size"]) is int
    with pytest.raises(InputSpecError, match="batch_size"):
        q.enqueue(study="s", trial_number=1, space="mlp", config=MLP, spec={**spec, "batch_size": 2.5},
                  device="host-cpu", predicted={})
    q.close()


# ============================================================================ B: argument checks
def test_b1_capture_decompose_and_cache_name_their_choices() -> None:
    with pytest.raises(InvalidValueError, match=r"decompose must be 'auto'.*True or False, got 'yes'") as e:
        capture(Small(), SPEC4, decompose="yes")  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError)
    with pytest.raises(InvalidTypeError,
                       match=r"cache must be True .*False or None .*ConversionCache; got str 'maybe'"):
        capture(Small(), SPEC4, cache="maybe")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="cache must be True"):
        dippm_nas.predict(Small(), SPEC4, cache="maybe")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="decompose must be"):
        dippm_nas.capture_many([(Small(), SPEC4)], decompose="yes", progress=False)  # type: ignore[arg-type]


def test_b2_predict_many_workers_and_flags_are_checked_before_any_conversion() -> None:
    with pytest.raises(InvalidValueError, match=r"workers must be an int >= 1, got 0") as e:
        dippm_nas.predict_many([(Small(), SPEC4)], workers=0)
    assert isinstance(e.value, ValueError)
    with pytest.raises(InvalidValueError, match=r"workers must be an int >= 1, got '2' \(str\)"):
        dippm_nas.predict_many([(Small(), SPEC4)], workers="2")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="items must be a list"):
        dippm_nas.predict_many(None)  # type: ignore[arg-type]


def test_b3_predict_options_are_checked(graph: Any) -> None:
    with pytest.raises(InvalidTypeError, match=r"mig must be True or False, got str 'no'"):
        dippm_nas.predict(graph, mig="no")  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match=r"k_sigma must be a finite number >= 0.*got 'x' \(str\)"):
        dippm_nas.predict(graph, k_sigma="x")  # type: ignore[arg-type]
    assert dippm_nas.predict(graph, k_sigma=np.float32(2.0), mig=np.True_).latency_ms > 0
    with pytest.raises(ExecutionRuntimeError, match=r"runtime must be one of \('eager'.*got ndarray"):
        dippm_nas.predict(graph, runtime=np.array(["eager", "compiled"]))  # type: ignore[arg-type]
    with pytest.raises(ExecutionRuntimeError, match="runtime must be one of"):
        dippm_nas.predict_many([graph], runtime=["eager"])  # type: ignore[arg-type]


def test_b4_an_empty_host_is_not_a_host_profile(graph: Any) -> None:
    with pytest.raises(DeviceError) as e:
        dippm_nas.predict(graph, host="")
    text = str(e.value)
    assert "an empty string is not a host profile" in text and "Is a directory" not in text
    assert "None" in text and "HostProfile" in text and "dippm-nas host-profile" in text
    with pytest.raises(DeviceError, match=r"host must be None .*HostProfile.*host-profile.*got int 5"):
        dippm_nas.predict(graph, host=5)  # type: ignore[arg-type]


def test_b5_calibrate_without_measurements_is_a_type_error_naming_the_form() -> None:
    with pytest.raises(InvalidTypeError, match=r"measurements must be a list of \(graph, Measurement\)"):
        analytic = AnalyticPredictor("a100-sxm4-40gb", load_calibration=False)
        analytic.calibrate(None, persist=False)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="got NoneType"):
        get_predictor("host-cpu").calibrate(None, persist=False)  # type: ignore[arg-type]


def test_b6_set_predictor_refuses_another_type() -> None:
    with pytest.raises(InvalidTypeError, match="predictor must be a BasePredictor"):
        set_predictor("host-cpu", object())  # type: ignore[arg-type]


# ============================================================================ C: the command line
@pytest.mark.parametrize("argv,flag", [
    (["gpu-campaign", "--out", "{tmp}/c", "--minutes", "-5"], "--minutes"),
    (["gpu-campaign", "--out", "{tmp}/c", "--minutes", "nan"], "--minutes"),
    (["gpu-campaign", "--out", "{tmp}/c", "--minutes", "0"], "--minutes"),
    (["gpu-campaign", "--out", "{tmp}/c", "--time-cap", "-1"], "--time-cap"),
    (["gpu-campaign", "--out", "{tmp}/c", "--threads", "0"], "--threads"),
    (["gpu-campaign", "--out", "{tmp}/c", "--max-file-mib", "inf"], "--max-file-mib"),
    (["validate-worker", "--storage", "sqlite:///{tmp}/q.db", "--device", "host-cpu", "--idle-exit", "0",
      "--poll", "-1"], "--poll"),
    (["validate-worker", "--storage", "sqlite:///{tmp}/q.db", "--device", "host-cpu", "--idle-exit", "-1"],
     "--idle-exit"),
    (["validate-worker", "--storage", "sqlite:///{tmp}/q.db", "--device", "host-cpu", "--idle-exit", "0",
      "--max-jobs", "0"], "--max-jobs"),
    (["validate-worker", "--storage", "sqlite:///{tmp}/q.db", "--device", "host-cpu", "--idle-exit", "0",
      "--rounds", "-1"], "--rounds"),
    (["validate-worker", "--storage", "sqlite:///{tmp}/q.db", "--device", "host-cpu", "--idle-exit", "0",
      "--lease", "nan"], "--lease"),
    (["validate-worker", "--storage", "sqlite:///{tmp}/q.db", "--device", "host-cpu", "--idle-exit", "0",
      "--max-attempts", "0"], "--max-attempts"),
    (["dataset", "build", "--space", "mlp", "--n", "0", "--out", "{tmp}/d.sqlite"], "--n"),
    (["dataset", "build", "--space", "mlp", "--n", "2", "--workers", "0", "--out", "{tmp}/d.sqlite"], "--workers"),
    (["dataset", "build", "--space", "mlp", "--n", "2", "--mac-budget", "nan", "--out", "{tmp}/d.sqlite"],
     "--mac-budget"),
    (["dataset", "build", "--space", "mlp", "--n", "2", "--rounds", "-1", "--out", "{tmp}/d.sqlite"], "--rounds"),
    (["dataset", "import", "timm", "{tmp}/none.csv", "--out", "{tmp}/d.sqlite", "--limit", "0"], "--limit"),
    (["train", "--data", "{tmp}/none.sqlite", "--out", "{tmp}/x.pt", "--members", "0"], "--members"),
    (["train", "--data", "{tmp}/none.sqlite", "--out", "{tmp}/x.pt", "--lr", "nan"], "--lr"),
    (["train", "--data", "{tmp}/none.sqlite", "--out", "{tmp}/x.pt", "--holdout-frac", "1.5"], "--holdout-frac"),
    (["demo", "--trials", "0"], "--trials"),
])
def test_c1_a_bad_number_on_the_command_line_is_a_usage_error(argv: list[str], flag: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"argument {flag}: expects " in err and "got" in err


def test_c2_host_profile_to_an_unwritable_path_fails_before_the_benchmark(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import dippm_nas.devices as devices

    def benchmark(**_kw: Any) -> Any:
        raise AssertionError("the benchmark ran before the output path was checked")

    monkeypatch.setattr(devices, "measure_host_profile", benchmark)
    assert main(["host-profile", "--out", str(tmp_path / "missing" / "host.json")]) == 2
    err = capsys.readouterr().err
    assert "the directory" in err and "does not exist" in err
    assert main(["host-profile", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["host-profile", "--out", str(blocker / "host.json"), "--json"]) == 2
    assert "--out" in capsys.readouterr().out


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_c3_host_profile_to_a_read_only_directory_fails_before_the_benchmark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import dippm_nas.devices as devices

    monkeypatch.setattr(devices, "measure_host_profile", lambda **_kw: (_ for _ in ()).throw(AssertionError("ran")))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert main(["host-profile", "--out", str(ro / "host.json")]) == 2
        assert "cannot be written" in capsys.readouterr().err
    finally:
        ro.chmod(0o755)


def test_c4_gpu_campaign_and_train_check_their_output_paths_before_the_work(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import dippm_nas.cli._gpu_campaign as cli_campaign
    import dippm_nas.training as training

    def work(*_a: Any, **_kw: Any) -> Any:
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr(cli_campaign, "run_campaign", work)
    monkeypatch.setattr(training, "train_predictor", work)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["gpu-campaign", "--out", str(blocker / "campaign"), "--torch-device", "cpu"]) == 2
    assert "cannot be created" in capsys.readouterr().err
    assert main(["gpu-campaign", "--out", str(blocker), "--torch-device", "cpu"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path / "d.sqlite"), "--out", str(tmp_path / "no" / "x.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_c5_cache_unavailable_is_said_once_on_one_channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.delenv("DIPPM_NAS_CACHE_URL", raising=False)
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(blocker / "cache"))
    set_default_cache(None)
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="dippm_nas"):
            warnings.simplefilter("always")
            capture(Small(), InputSpec(shape=(4,), batch_size=3))
    finally:
        set_default_cache(None)
    said = [w for w in caught if "capturing without it" in str(w.message)]
    logged = [r for r in caplog.records if "capturing without it" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(said) == 1 and logged == []  # the CLI prints warnings through its log: one line, not two


# ============================================================================ D: files read as models
def _expect_model_spec_error(path: Path, *needles: str) -> None:
    """``capture`` and ``load_model`` each refuse ``path`` with a ModelSpecError holding ``needles``, within
    20 s (a FIFO must not block the read)."""
    calls = {"capture": lambda: capture(str(path), SPEC4, cache=False), "load_model": lambda: load_model(str(path))}
    raised: dict[str, BaseException] = {}

    def run() -> None:
        for name, fn in calls.items():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - collected for the assertions below
                raised[name] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), f"reading {path} blocked"
    assert set(raised) == set(calls), f"accepted by {set(calls) - set(raised)}"
    for e in raised.values():
        assert isinstance(e, ModelSpecError), repr(e)
        for n in needles:
            assert n in str(e), str(e)


def test_d1_a_fifo_named_onnx_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    _expect_model_spec_error(fifo, "a FIFO", "not a regular file")


def test_d2_a_symlink_to_dev_zero_is_named_for_what_it_is(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    link = tmp_path / "zero.onnx"
    link.symlink_to("/dev/zero")
    _expect_model_spec_error(link, "a character device", "a symlink to /dev/zero")
    d = tmp_path / "dir.onnx"
    d.mkdir()
    _expect_model_spec_error(d, "is a directory")


def test_d3_an_onnx_file_past_protobufs_limit_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.onnx"
    with open(big, "wb") as f:
        f.truncate(MAX_ONNX_BYTES + 1)  # sparse: no disk and, unread, no memory
    if os.stat(big).st_blocks * 512 > 2**20:
        pytest.skip("the file system here does not make sparse files")
    _expect_model_spec_error(big, f"{MAX_ONNX_BYTES + 1:,} bytes", "2 GiB", "external data")
    assert MAX_ONNX_BYTES == 2**31


# ============================================================================ E: messages that teach
class ReturnsNone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> None:
        self.fc(x)


def test_e1_a_forward_returning_none_says_so() -> None:
    with pytest.raises(GraphCaptureError, match=r"the forward of ReturnsNone returned no tensor \(it returned None\)"):
        capture(ReturnsNone(), SPEC4, cache=False)


def test_e2_a_checkpoint_holding_an_object_never_suggests_weights_only_false(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from dippm_nas.predictor import GnnPredictor

    bad = tmp_path / "a100-sxm4-40gb.pt"
    torch.save({"meta": "{}", "state": {}, "extra": argparse.Namespace(a=1)}, bad)
    with pytest.raises(CheckpointError) as e:
        GnnPredictor.load(bad, engine="torch")
    text = str(e.value)
    assert "argparse.Namespace" in text and "weights_only=True" in text
    assert "weights_only` set to `False" not in text and "will likely succeed" not in text
    assert "safe_globals" not in text
    monkeypatch.setenv("DIPPM_NAS_CHECKPOINT_DIR", str(tmp_path))  # the fallback warning says the same
    set_predictor("a100-sxm4-40gb", None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            get_predictor("a100-sxm4-40gb")
        (w,) = [w for w in caught if "falling back" in str(w.message)]
        assert "argparse.Namespace" in str(w.message) and "likely succeed" not in str(w.message)
    finally:
        set_predictor("a100-sxm4-40gb", None)

