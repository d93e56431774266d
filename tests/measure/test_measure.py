"""Tests of dippm_nas.measure: stopping rule (fake clock), NVML faked with autospec, the CUDA path run
on a CPU twin of its torch.cuda calls, the CPU measurer for real, faults recorded as rows."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

from dippm_nas.errors import DeviceError, MeasurementError, ModelSpecError
from dippm_nas.measure import (
    MIG_ENERGY_REASON,
    CpuMeasurer,
    CudaMeasurer,
    CudaOps,
    Measurement,
    MeasureSettings,
    NvmlAdapter,
    PowerSampler,
    RaplCounter,
    StoppingRule,
    measure,
    run_until_stopped,
    summarize,
    t_quantile_975,
    trapezoid_energy_j,
)
from dippm_nas.measure._nvml import locate_device
from dippm_nas.measure._rapl import probe_rapl
from dippm_nas.measure._rss import PeakRss
from dippm_nas.spec import InputSpec

MIB = 2**20


# --------------------------------------------------------------------------- helpers
class FakeClock:
    """A seconds clock that only moves when told to."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def tiny_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


TINY_SPEC = InputSpec(shape=(3, 16, 16), batch_size=2)
FAST = MeasureSettings(warmup=2, min_repeats=5, max_repeats=50, rel_ci_target=0.5, time_cap_s=5.0,
                       energy_window_s=0.05, power_sample_interval_s=0.005, threads=1)


class Raises(nn.Module):
    """Raises ``exc`` from the ``fail_at``-th forward on (1-based); earlier forwards work."""

    def __init__(self, exc: Exception, fail_at: int = 1) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.exc = exc
        self.fail_at = fail_at
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # counts the forwards of the copy the measurer runs
        if self.calls >= self.fail_at:
            raise self.exc
        return self.lin(x)


class Slow(nn.Module):
    """Each forward advances a fake clock by ``seconds``."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.clock = clock
        self.seconds = seconds

    def __deepcopy__(self, memo: dict) -> "Slow":  # share the clock with the copy the measurer makes
        new = Slow(self.clock, self.seconds)
        new.lin.load_state_dict(self.lin.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(self.seconds)
        return self.lin(x)


class Recorder(nn.Module):
    """Records dtype and memory format of its input (shared list survives the deepcopy)."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.log = log

    def __deepcopy__(self, memo: dict) -> "Recorder":
        new = Recorder(self.log)
        new.conv.load_state_dict(self.conv.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        self.log.append((x.dtype, x.is_contiguous(memory_format=torch.channels_last), self.conv.weight.dtype,
                         y.dtype, torch.is_inference_mode_enabled()))
        return y


class CpuTwinOps(CudaOps):
    """The torch.cuda calls of CudaMeasurer answered on the CPU (the CUDA path's CPU twin)."""

    autocast_device_type = "cpu"

    def __init__(self, uuid: str | None = "GPU-aaaa-0000", reserved: int = 300 * MIB,
                 allocated: int = 200 * MIB) -> None:
        self.uuid = uuid
        self.reserved = reserved
        self.allocated = allocated
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def torch_device(self, index: int) -> torch.device:
        return torch.device("cpu")

    def device_context(self, index: int) -> Any:
        return contextlib.nullcontext()

    def synchronize(self, index: int) -> None:
        self.calls.append("synchronize")

    def time_ms(self, fn: Any, index: int) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000.0

    def reset_peak_memory_stats(self, index: int) -> None:
        self.calls.append("reset_peak")

    def max_memory_reserved(self, index: int) -> int:
        return self.reserved

    def max_memory_allocated(self, index: int) -> int:
        return self.allocated

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def device_name(self, index: int) -> str:
        return "Twin A100"

    def device_uuid(self, index: int) -> str | None:
        return self.uuid

    def capability(self, index: int) -> tuple[int, int]:
        return (8, 0)

    def versions(self) -> dict[str, Any]:
        return {"cuda": "12.4", "cudnn": 90100}


def fake_nvml(*, counter: bool = True, mig: bool = False, energy_mj: list[int] | None = None,
              power_mw: int = 250_000, used: list[int] | None = None) -> Any:
    """An autospec NvmlAdapter for one A100 (optionally in MIG mode with two instances)."""
    nv = mock.create_autospec(NvmlAdapter, instance=True)
    nv.driver_version.return_value = "550.54.15"
    nv.device_count.return_value = 1
    nv.handle_by_index.return_value = "gpu0"
    nv.mig_enabled.return_value = mig
    nv.mig_device_handles.return_value = ["mig0", "mig1"]
    nv.uuid.side_effect = {"gpu0": "GPU-aaaa-0000", "mig0": "MIG-bbbb-0000", "mig1": "MIG-cccc-0000"}.__getitem__
    nv.name.side_effect = {"gpu0": "NVIDIA A100-SXM4-40GB", "mig0": "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                           "mig1": "NVIDIA A100-SXM4-40GB MIG 3g.20gb"}.__getitem__
    nv.energy_counter_supported.return_value = counter
    nv.total_energy_mj.side_effect = energy_mj if energy_mj is not None else [1_000_000, 1_050_000]
    nv.power_mw.return_value = power_mw
    nv.memory_used_bytes.side_effect = used if used is not None else [700 * MIB, 3_272 * MIB]
    return nv


# --------------------------------------------------------------------------- Student t, summary
@pytest.mark.parametrize("df, exact", [
    (1, 12.706204736), (9, 2.262157163), (30, 2.042272456),
    (31, 2.039513446), (40, 2.021075390), (60, 2.000297822), (120, 1.979930405), (1000, 1.962339081),
])
def test_t_quantile_matches_tables(df: int, exact: float) -> None:
    assert t_quantile_975(df) == pytest.approx(exact, abs=1e-7)


def test_t_quantile_rejects_bad_df() -> None:
    with pytest.raises(MeasurementError, match="degrees of freedom"):
        t_quantile_975(0)


def test_summarize_known_values() -> None:
    st = summarize([9.0, 10.0, 11.0, 10.0])
    assert st.mean_ms == 10.0 and st.median_ms == 10.0
    assert st.std_ms == pytest.approx(math.sqrt(2 / 3))
    assert st.ci95_ms == pytest.approx(3.182446305 * math.sqrt(2 / 3) / 2)
    assert st.rel_ci95 == pytest.approx(st.ci95_ms / 10.0)
    one = summarize([5.0])
    assert one.std_ms is None and one.ci95_ms is None


# --------------------------------------------------------------------------- stopping rule, fake clock
def _rule(clock: FakeClock, **kw: Any) -> StoppingRule:
    args = dict(rel_ci_target=0.02, min_repeats=10, max_repeats=1000, time_cap_s=60.0, clock=clock)
    args.update(kw)
    rule = StoppingRule(**args)
    rule.start()
    return rule


def _alternating(mean: float, dev: float, n: int) -> list[float]:
    return [mean + dev if i % 2 == 0 else mean - dev for i in range(n)]


def test_rule_stops_exactly_when_ci_within_target() -> None:
    # n=10 alternating mean±d: s = d*sqrt(10/9), half = t9*s/sqrt(10) = t9*d/3; rel = 2% at d = 0.06*100/t9
    d_edge = 0.06 * 100 / 2.262157163
    for d, expect_stop in ((d_edge * 0.99, True), (d_edge * 1.01, False)):
        clock = FakeClock()
        rule = _rule(clock)
        for i, x in enumerate(_alternating(100.0, d, 10)):
            rule.add(x)
            clock.advance(0.1)
            if i < 9:
                assert not rule.should_stop(), "must not stop before min_repeats"
        assert rule.should_stop() is expect_stop
        if expect_stop:
            assert rule.stop_reason == "converged"


def test_rule_keeps_going_when_noisy_until_max_repeats() -> None:
    clock = FakeClock()
    rule = _rule(clock, max_repeats=200)
    for i, x in enumerate(_alternating(10.0, 5.0, 200)):  # rel CI ~7% even at n=200
        rule.add(x)
        clock.advance(0.01)
        stop = rule.should_stop()
        assert stop is (i == 199)
    assert rule.stop_reason == "max_repeats" and rule.n == 200


def test_rule_stops_at_time_cap() -> None:
    clock = FakeClock()
    rule = _rule(clock, time_cap_s=5.0)
    n = 0
    for x in _alternating(10.0, 5.0, 100):
        clock.advance(1.0)
        rule.add(x)
        n += 1
        if rule.should_stop():
            break
    assert rule.stop_reason == "time_cap" and n == 5 and not rule.enough


def test_rule_waits_for_min_repeats_even_with_zero_spread() -> None:
    clock = FakeClock()
    rule = _rule(clock, min_repeats=7)
    stops = []
    for _ in range(7):
        rule.add(3.0)
        stops.append(rule.should_stop())
    assert stops == [False] * 6 + [True] and rule.stop_reason == "converged"


def test_rule_rejects_bad_samples_and_settings() -> None:
    rule = _rule(FakeClock())
    with pytest.raises(MeasurementError, match="finite number >= 0"):
        rule.add(float("nan"))
    with pytest.raises(MeasurementError, match="min_repeats"):
        StoppingRule(min_repeats=1)
    with pytest.raises(MeasurementError, match="max_repeats"):
        StoppingRule(min_repeats=10, max_repeats=5)


def test_run_until_stopped_with_fake_clock() -> None:
    clock = FakeClock()
    times = iter([50.0] * 3 + _alternating(20.0, 0.1, 100))  # 3 warm-up values are discarded

    def step() -> float:
        ms = next(times)
        clock.advance(ms / 1000)
        return ms

    rule = StoppingRule(rel_ci_target=0.02, min_repeats=6, max_repeats=100, time_cap_s=10.0, clock=clock)
    res = run_until_stopped(step, rule, warmup=3)
    assert res.warmup_done == 3 and res.complete and res.stop_reason == "converged"
    assert len(res.samples_ms) == 6 and 50.0 not in res.samples_ms
    assert res.elapsed_s == pytest.approx(0.15 + 0.12)


def test_run_until_stopped_time_cap_in_warmup() -> None:
    clock = FakeClock()

    def step() -> float:
        clock.advance(2.0)
        return 2000.0

    rule = StoppingRule(min_repeats=3, max_repeats=10, time_cap_s=3.0, clock=clock)
    res = run_until_stopped(step, rule, warmup=5)
    assert res.samples_ms == () and res.warmup_done == 2 and not res.complete and res.stop_reason == "time_cap"


# --------------------------------------------------------------------------- Measurement / settings
def _ok_row(**kw: Any) -> Measurement:
    args: dict[str, Any] = dict(latency_ms=12.5, latency_ms_std=0.3, energy_j=None, memory_mib=3272.0,
                                memory_source="nvml_used", n_repeats=40, device="cuda:0",
                                environment={"torch": "2.13", "settings": MeasureSettings().to_dict()},
                                energy_reason=MIG_ENERGY_REASON, memory_parts_mib={"nvml_used_mib": 3272.0},
                                batch_size=8, dtype="float32", stop_reason="converged")
    args.update(kw)
    return Measurement(**args)


def test_measurement_json_round_trip() -> None:
    rows = [
        _ok_row(),
        _ok_row(energy_j=0.42, energy_source="nvml_energy_counter", energy_reason=None, details={"x_s": 1.0}),
        Measurement(None, None, None, None, None, 0, "cuda:0", {}, status="oom",
                    reason="out of memory during forward: OutOfMemoryError: CUDA out of memory"),
        Measurement(1000.0, None, None, 12.0, "rss_delta", 1, "cpu", {}, status="timeout",
                    reason="time cap", stop_reason="time_cap"),
    ]
    for row in rows:
        back = Measurement.from_dict(json.loads(json.dumps(row.to_dict())))
        assert back == row
    settings = MeasureSettings(threads=3, tf32=True, autocast="bfloat16")
    assert MeasureSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings


@pytest.mark.parametrize("kw, match", [
    (dict(latency_ms=float("nan")), "never NaN"),
    (dict(latency_ms=None), "'ok' Measurement needs"),
    (dict(status="fine"), "status must be one of"),
    (dict(energy_j=1.0), "energy_j and energy_source"),
    (dict(energy_reason=None), "energy_reason"),
    (dict(memory_source="magic"), "memory_source must be"),
    (dict(status="error"), "needs a reason"),
])
def test_measurement_rejects_bad_rows(kw: dict, match: str) -> None:
    with pytest.raises(MeasurementError, match=match):
        _ok_row(**kw)


def test_from_dict_lists_unknown_and_missing_keys() -> None:
    d = _ok_row().to_dict()
    with pytest.raises(MeasurementError, match="unknown keys \\['bogus'\\]"):
        Measurement.from_dict({**d, "bogus": 1})
    del d["latency_ms"]
    with pytest.raises(MeasurementError, match="missing required keys \\['latency_ms'\\]"):
        Measurement.from_dict(d)


@pytest.mark.parametrize("kw, match", [
    (dict(min_repeats=1), "min_repeats must be an int >= 2"),
    (dict(min_repeats=10, max_repeats=3), "max_repeats must be an int >= min_repeats"),
    (dict(rel_ci_target=0.0), "rel_ci_target must be a finite number > 0"),
    (dict(autocast="float64"), "autocast must be None or one of"),
    (dict(threads=0), "threads must be None or an int >= 1"),
])
def test_settings_validate(kw: dict, match: str) -> None:
    with pytest.raises(MeasurementError, match=match):
        MeasureSettings(**kw)


# --------------------------------------------------------------------------- NVML adapter and location
def test_real_adapter_wraps_missing_library() -> None:
    nv = NvmlAdapter()
    try:
        nv.init()
    except MeasurementError as e:
        assert e.__cause__ is not None and "NVML could not be initialised" in str(e)
    else:  # pragma: no cover - a machine with a driver
        nv.shutdown()
        pytest.skip("an NVIDIA driver is present")
    with pytest.raises(MeasurementError, match="init\\(\\) must be called"):
        nv.power_mw("gpu0")


def test_adapter_maps_not_supported_and_wraps_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    nv = NvmlAdapter()
    nv._nvml = pynvml  # as if init() had succeeded

    def not_supported(*a: Any) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def lost(*a: Any) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", not_supported)
    assert nv.energy_counter_supported("gpu0") is False
    assert nv.mig_enabled("gpu0") is False
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lost)
    with pytest.raises(MeasurementError, match="NVML power query failed") as info:
        nv.power_mw("gpu0")
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", lambda h: 123_456)
    assert nv.energy_counter_supported("gpu0") is True and nv.total_energy_mj("gpu0") == 123_456


def test_locate_device_by_uuid_gpu_and_mig_and_index_fallback() -> None:
    nv = fake_nvml()
    d = locate_device(nv, 0, "GPU-AAAA-0000")
    assert (d.gpu, d.memory, d.is_mig, d.located_by) == ("gpu0", "gpu0", False, "uuid")
    nv = fake_nvml(mig=True)
    d = locate_device(nv, 0, "MIG-cccc-0000")
    assert (d.gpu, d.memory, d.is_mig, d.name) == ("gpu0", "mig1", True, "NVIDIA A100-SXM4-40GB MIG 3g.20gb")
    d = locate_device(nv, 0, None)  # no UUID: index 0, MIG mode, instance unknown
    assert d.is_mig and d.memory is None and d.located_by == "index" and "cannot be attributed" in d.note


# --------------------------------------------------------------------------- power sampling
def test_trapezoid_energy() -> None:
    assert trapezoid_energy_j([0.0, 1.0, 3.0], [100.0, 200.0, 100.0]) == pytest.approx(150.0 + 300.0)
    with pytest.raises(MeasurementError, match="at least 2"):
        trapezoid_energy_j([0.0], [1.0])
    with pytest.raises(MeasurementError, match="must not decrease"):
        trapezoid_energy_j([1.0, 0.0], [1.0, 1.0])


def test_power_sampler_constant_power_and_thread_failure() -> None:
    nv = fake_nvml(power_mw=120_000)
    sampler = PowerSampler(nv, "gpu0", interval_s=0.002)
    with sampler:
        time.sleep(0.05)
    assert sampler.n_samples >= 3
    assert sampler.energy_j() == pytest.approx(120.0 * sampler.span_s)
    assert sampler.mean_power_w() == pytest.approx(120.0)

    nv.power_mw.side_effect = [100_000, MeasurementError("NVML power query failed: GPU is lost")]
    broken = PowerSampler(nv, "gpu0", interval_s=0.001)
    broken.start()
    time.sleep(0.02)
    with pytest.raises(MeasurementError, match="power sampling failed"):
        broken.stop()


# --------------------------------------------------------------------------- CUDA path on the CPU twin
def test_cuda_energy_counter_and_nvml_memory() -> None:
    nv = fake_nvml(energy_mj=[1_000_000, 1_050_000], used=[700 * MIB, 3_272 * MIB])
    ops = CpuTwinOps()
    with CudaMeasurer(FAST, torch_device="cuda:0", nvml=nv, ops=ops) as m:
        row = m.measure(tiny_model(), TINY_SPEC)
    assert row.ok and row.device == "cuda:0" and row.n_repeats >= FAST.min_repeats
    assert row.latency_ms > 0 and row.latency_ms_std is not None
    k = row.details["energy_window_forwards"]
    assert k >= 1 and row.energy_source == "nvml_energy_counter"
    assert row.energy_j == pytest.approx(50.0 / k)  # 50,000 mJ over the window, per forward
    assert row.memory_source == "nvml_used" and row.memory_mib == 3_272.0
    assert row.memory_parts_mib == {"nvml_used_before_mib": 700.0, "nvml_used_mib": 3_272.0,
                                    "torch_max_reserved_mib": 300.0, "torch_max_allocated_mib": 200.0}
    env = row.environment
    assert env["mig"] is False and env["driver"] == "550.54.15" and env["gpu_name"] == "Twin A100"
    assert env["settings"] == FAST.to_dict() and set(env["flags"]) >= {"cudnn_allow_tf32", "cudnn_benchmark"}
    nv.power_mw.assert_not_called()
    nv.init.assert_called_once_with()
    nv.shutdown.assert_called_once_with()
    assert "reset_peak" in ops.calls and "empty_cache" in ops.calls
    json.dumps(row.to_dict())


def test_cuda_counter_unsupported_falls_back_to_power_sampling() -> None:
    nv = fake_nvml(counter=False, power_mw=250_000)
    settings = MeasureSettings(warmup=1, min_repeats=3, max_repeats=10, rel_ci_target=0.9, time_cap_s=5.0,
                               energy_window_s=0.03, power_sample_interval_s=0.002)
    row = CudaMeasurer(settings, nvml=nv, ops=CpuTwinOps()).measure(tiny_model(), TINY_SPEC)
    assert row.ok and row.energy_source == "nvml_power_sampling" and row.energy_reason is None
    nv.total_energy_mj.assert_not_called()
    assert nv.power_mw.call_count >= 2
    assert row.details["mean_power_w"] == pytest.approx(250.0, rel=0.05)
    k = row.details["energy_window_forwards"]
    assert row.energy_j * k == pytest.approx(250.0 * row.details["energy_window_s"])


def test_cuda_mig_refuses_energy_but_measures_latency_and_memory() -> None:
    nv = fake_nvml(mig=True, used=[100 * MIB, 2_918 * MIB])
    row = CudaMeasurer(FAST, nvml=nv, ops=CpuTwinOps(uuid="MIG-cccc-0000")).measure(tiny_model(), TINY_SPEC)
    assert row.ok and row.latency_ms > 0
    assert row.energy_j is None and row.energy_source is None and row.energy_reason == MIG_ENERGY_REASON
    assert "MIG" in row.energy_reason and "NVML cannot measure" in row.energy_reason
    assert row.environment["mig"] is True and row.environment["nvml_name"].endswith("MIG 3g.20gb")
    assert row.memory_source == "nvml_used" and row.memory_mib == 2_918.0
    for call in nv.memory_used_bytes.call_args_list:
        assert call.args == ("mig1",)  # the instance's own memory, not the whole GPU's
    nv.total_energy_mj.assert_not_called()
    nv.power_mw.assert_not_called()
    nv.energy_counter_supported.assert_not_called()


def test_cuda_without_nvml_uses_torch_memory_and_says_why() -> None:
    nv = fake_nvml()
    nv.init.side_effect = MeasurementError("NVML could not be initialised: NVML Shared Library Not Found")
    row = CudaMeasurer(FAST, nvml=nv, ops=CpuTwinOps()).measure(tiny_model(), TINY_SPEC)
    assert row.ok and row.energy_j is None and "NVML unavailable" in row.energy_reason
    assert row.memory_source == "torch_max_reserved" and row.memory_mib == 300.0
    assert row.environment["nvml"].startswith("unavailable")
    nv.shutdown.assert_not_called()


def test_cuda_counter_that_does_not_advance_is_not_a_zero() -> None:
    nv = fake_nvml(energy_mj=[5_000, 5_000])
    row = CudaMeasurer(FAST, nvml=nv, ops=CpuTwinOps()).measure(tiny_model(), TINY_SPEC)
    assert row.ok and row.energy_j is None and "did not advance" in row.energy_reason


def test_cuda_oom_is_a_row() -> None:
    model = Raises(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    row = CudaMeasurer(FAST, nvml=fake_nvml(), ops=CpuTwinOps()).measure(model, InputSpec(shape=(4,)))
    assert row.status == "oom" and "out of memory" in row.reason and "OutOfMemoryError" in row.reason
    assert row.latency_ms is None and row.n_repeats == 0 and row.memory_mib is None
    assert row.memory_parts_mib["torch_max_reserved_mib"] == 300.0  # the peak before the fault is kept
    assert row.energy_j is None


def test_cuda_flags_are_set_recorded_and_restored() -> None:
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)
    settings = MeasureSettings(warmup=1, min_repeats=3, max_repeats=5, rel_ci_target=0.9, time_cap_s=5.0,
                               energy_window_s=0.01, tf32=not before[1], cudnn_benchmark=True)
    row = CudaMeasurer(settings, nvml=fake_nvml(), ops=CpuTwinOps()).measure(tiny_model(), TINY_SPEC)
    assert row.environment["flags"]["matmul_allow_tf32"] is (not before[1])
    assert row.environment["flags"]["cudnn_allow_tf32"] is (not before[1])
    assert row.environment["flags"]["cudnn_benchmark"] is True
    after = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)
    assert after == before


def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():  # pragma: no cover
        pytest.skip("this host has CUDA")
    with pytest.raises(MeasurementError, match="CUDA is not available"):
        measure(tiny_model(), TINY_SPEC, torch_device="cuda:0", settings=FAST, nvml=fake_nvml())


# --------------------------------------------------------------------------- CPU measurer
def test_cpu_rss_delta_below_the_weights_is_withheld_with_the_reason() -> None:
    from dippm_nas.measure._cpu import _checked_delta_mib

    from dippm_nas.measure._cpu import _tensor_bytes

    weights = _tensor_bytes(torch.nn.Linear(1024, 1024))  # 4 MiB of float32 weights (+ 4 KiB bias)
    assert weights == (1024 * 1024 + 1024) * 4
    mib, reason = _checked_delta_mib(0, weights)
    assert mib is None and "0.0 MiB is below the model's own weights 4.0 MiB" in reason and "isolate=True" in reason
    mib, reason = _checked_delta_mib(8 * 2**20, weights)
    assert mib == 8.0 and reason is None
    assert _tensor_bytes(torch.nn.Linear(1024, 1024).half()) == weights // 2  # the measured copy's dtype counts


def test_cpu_measures_a_tiny_model_for_real() -> None:
    threads_before = torch.get_num_threads()
    model = tiny_model()
    row = measure(model, TINY_SPEC, torch_device="cpu", settings=FAST)
    assert row.ok and row.device == "cpu" and row.n_repeats >= FAST.min_repeats
    assert 0 < row.latency_ms < 1000 and row.latency_ms_median > 0 and row.latency_ms_ci95 is not None
    assert row.stop_reason in ("converged", "max_repeats", "time_cap")
    # a long-lived test process may reuse freed memory: then the figure is withheld with the reason, never 0
    if row.memory_mib is not None:
        assert row.memory_source == "rss_delta" and row.memory_mib >= row.memory_parts_mib["weights_mib"]
        assert row.memory_reason is None
    else:
        assert row.memory_source is None and "below the model's own weights" in row.memory_reason
    assert set(row.memory_parts_mib) == {"rss_before_mib", "rss_peak_mib", "rss_delta_mib", "weights_mib"}
    assert row.energy_j is None and "RAPL" in row.energy_reason  # this host has no RAPL counter
    assert row.environment["threads"] == 1 and row.environment["settings"]["threads"] == 1
    sig = row.environment["cpu_signature"]  # tells VMs sold under one CPU name apart afterwards
    if Path("/proc/cpuinfo").exists():
        assert {"vendor", "family", "model", "flags_sha1"} <= set(sig) and len(sig["flags_sha1"]) == 12
    assert row.batch_size == 2 and row.dtype == "float32"
    assert torch.get_num_threads() == threads_before
    assert model.training  # the caller's model was not touched (the measurer ran an eval copy)


def test_cpu_rapl_energy_with_faked_counter() -> None:
    rapl = mock.create_autospec(RaplCounter, instance=True)
    rapl.read_uj.side_effect = [10_000_000, 12_000_000]
    rapl.delta_j.side_effect = lambda a, b: (b - a) / 1e6
    row = CpuMeasurer(FAST, rapl=rapl).measure(tiny_model(), TINY_SPEC)
    k = row.details["energy_window_forwards"]
    assert row.ok and row.energy_source == "rapl_package" and row.energy_j == pytest.approx(2.0 / k)


def test_rapl_probe_and_wraparound(tmp_path: Any) -> None:
    counter, reason = probe_rapl(tmp_path / "nope")
    assert counter is None and "does not exist" in reason
    (tmp_path / "energy_uj").write_text("123\n")
    (tmp_path / "max_energy_range_uj").write_text("1000\n")
    counter, reason = probe_rapl(tmp_path)
    assert reason is None and counter.read_uj() == (123,)
    assert counter.delta_j(900, 100) == pytest.approx(200 / 1e6)


def test_peak_rss_sees_an_allocation() -> None:
    import mmap

    rss = PeakRss()
    rss.start()
    # fresh anonymous pages, written so they become resident: malloc could instead reuse pages a
    # long test session already holds, and the resident size would not grow
    blob = mmap.mmap(-1, 64 * MIB)
    blob.write(b"\x01" * (64 * MIB))
    blob.close()
    before, peak = rss.stop()
    assert peak - before >= 60 * MIB, rss.method


def test_half_precision_casts_a_copy_and_autocast_keeps_float32() -> None:
    log: list = []
    model = Recorder(log)
    spec = InputSpec(shape=(3, 8, 8), batch_size=1, dtype="bfloat16")
    settings = MeasureSettings(warmup=1, min_repeats=2, max_repeats=2, time_cap_s=5.0, channels_last=True)
    row = measure(model, spec, settings=settings)
    assert row.ok and row.dtype == "bfloat16"
    assert log[-1] == (torch.bfloat16, True, torch.bfloat16, torch.bfloat16, True)
    assert model.conv.weight.dtype == torch.float32  # the caller's model is untouched
    log.clear()
    row = measure(model, spec, settings=MeasureSettings(warmup=1, min_repeats=2, max_repeats=2, autocast="bfloat16"))
    assert row.ok and log[-1][:3] == (torch.float32, False, torch.float32) and log[-1][3] == torch.bfloat16
    assert row.environment["settings"]["autocast"] == "bfloat16"
    with pytest.raises(MeasurementError, match="with autocast='float16' the spec dtype"):
        measure(model, spec, settings=MeasureSettings(autocast="float16"))


# --------------------------------------------------------------------------- faults are rows
def test_raising_model_is_an_error_row() -> None:
    row = measure(Raises(ValueError("shapes (2x5) and (4x4) cannot be multiplied")), InputSpec(shape=(4,)),
                  settings=FAST)
    assert row.status == "error" and "ValueError" in row.reason and "cannot be multiplied" in row.reason
    assert row.latency_ms is None and row.n_repeats == 0 and row.memory_mib is None
    json.dumps(row.to_dict())


def test_model_failing_mid_run_keeps_what_was_measured() -> None:
    # warm-up 2 forwards, then 3 timed forwards succeed, the 6th call raises
    row = measure(Raises(RuntimeError("boom"), fail_at=6), InputSpec(shape=(4,)),
                  settings=MeasureSettings(warmup=2, min_repeats=10, max_repeats=20, time_cap_s=5.0))
    assert row.status == "error" and row.n_repeats == 3 and row.latency_ms is not None and row.latency_ms > 0


def test_cpu_out_of_memory_is_an_oom_row() -> None:
    class Huge(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.empty(10**13) + x.sum()  # 40 TB: the CPU allocator refuses at once

    row = measure(Huge(), InputSpec(shape=(4,)), settings=FAST)
    assert row.status == "oom" and "out of memory" in row.reason and row.latency_ms is None


def test_time_cap_gives_timeout_row_with_partial_latency() -> None:
    clock = FakeClock()
    settings = MeasureSettings(warmup=1, min_repeats=5, max_repeats=10, time_cap_s=3.0)
    row = CpuMeasurer(settings, clock=clock).measure(Slow(clock, 1.0), InputSpec(shape=(4,)))
    assert row.status == "timeout" and row.stop_reason == "time_cap"
    assert "time cap of 3 s" in row.reason and "2 of the minimum 5" in row.reason
    assert row.n_repeats == 2 and row.latency_ms == pytest.approx(1000.0)
    assert row.energy_j is None and "timed out" in row.energy_reason
    # memory of what ran is still recorded (or withheld with the reason when the process reused memory)
    assert "rss_peak_mib" in row.memory_parts_mib
    assert row.memory_source == "rss_delta" or "below the model's own weights" in row.memory_reason


def test_time_cap_after_min_repeats_is_ok_with_stop_reason() -> None:
    clock = FakeClock()
    settings = MeasureSettings(warmup=0, min_repeats=2, max_repeats=100, time_cap_s=3.0, rel_ci_target=1e-9)
    slow = Slow(clock, 1.0)
    row = CudaMeasurer(settings, nvml=fake_nvml(), ops=CpuTwinOps(), clock=clock).measure(slow, InputSpec(shape=(4,)))
    assert row.ok and row.stop_reason == "time_cap" and row.n_repeats == 3


def test_usage_errors_raise() -> None:
    with pytest.raises(MeasurementError, match="takes a torch.nn.Module"):
        measure("torchvision:resnet18", TINY_SPEC)
    with pytest.raises(DeviceError, match="'cpu', 'cuda' or 'cuda:N'"):
        measure(tiny_model(), TINY_SPEC, torch_device="tpu")
    with pytest.raises(DeviceError, match="CUDA device index must be < 1"):
        CudaMeasurer(FAST, torch_device="cuda:3", nvml=fake_nvml(), ops=CpuTwinOps()).measure(tiny_model(), TINY_SPEC)


# --------------------------------------------------------------------------- isolated worker
ISO = MeasureSettings(warmup=1, min_repeats=3, max_repeats=5, rel_ci_target=0.5, time_cap_s=10.0,
                      energy_window_s=0.05)


def test_isolated_measurement_builds_with_kwargs_in_a_fresh_process() -> None:
    row = measure("torch.nn:Linear", InputSpec(shape=(16,), batch_size=4), settings=ISO, isolate=True,
                  model_kwargs={"in_features": 16, "out_features": 8})
    assert row.ok and row.environment["isolated"] is True and row.n_repeats >= 3
    assert row.memory_source == "rss_delta" and row.latency_ms > 0
    with pytest.raises(MeasurementError, match="isolate=True only"):
        measure(tiny_model(), TINY_SPEC, settings=ISO, model_kwargs={"a": 1})
    with pytest.raises(MeasurementError, match="SPEC string"):
        measure(tiny_model(), TINY_SPEC, settings=ISO, isolate=True)


@pytest.mark.slow
def test_isolated_worker_faults_are_rows(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sleepy_models.py").write_text(
        "import time, torch\n"
        "class Sleepy(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        time.sleep(600)\n"
        "        return x\n"
        "def build():\n"
        "    return Sleepy()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    row = measure("sleepy_models:build", InputSpec(shape=(4,)), settings=ISO, isolate=True, timeout_s=15)
    assert row.status == "timeout" and "hard timeout of 15 s" in row.reason and row.latency_ms is None
    row = measure("torch.nn:Linear", InputSpec(shape=(4,)), settings=ISO, isolate=True, model_kwargs={"bogus": 1})
    assert row.status == "error" and "unexpected keyword argument 'bogus'" in row.reason
    with pytest.raises(ModelSpecError, match="in the measurement worker"):
        measure("no_such_module_xyz:build", InputSpec(shape=(4,)), settings=ISO, isolate=True)


# ---------------------------------------------------------------------------------------------- torch_device
def test_the_old_device_keyword_still_measures_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"measure\(device=\.\.\.\) is deprecated.*torch_device="):
        row = measure(tiny_model(), TINY_SPEC, device="cpu", settings=FAST)
    assert row.ok and row.device == "cpu"
    with pytest.warns(DeprecationWarning, match=r"CudaMeasurer\(device="), pytest.raises(DeviceError, match="cuda:3"):
        CudaMeasurer(FAST, device="cuda:3", nvml=fake_nvml(), ops=CpuTwinOps()).measure(tiny_model(), TINY_SPEC)
    with pytest.raises(TypeError, match="both device= and torch_device="):
        measure(tiny_model(), TINY_SPEC, "cuda", device="cpu")


def test_the_old_device_keyword_of_run_campaign_and_build_dataset_warns(tmp_path: Path) -> None:
    from dippm_nas.dataset import DatasetError, build_dataset
    from dippm_nas.measure import run_campaign

    with pytest.warns(DeprecationWarning, match=r"build_dataset\(device="), \
            pytest.raises(DatasetError, match="torch_device='cpu'.*torch_device='cuda'"):
        build_dataset(tmp_path / "d.sqlite", spaces=["mlp"], n=1, workers=1, progress=False, rounds=1, device="cuda")
    with pytest.warns(DeprecationWarning, match=r"run_campaign\(device="), pytest.raises(MeasurementError):
        run_campaign(tmp_path / "c", minutes=0.0, device="cpu")
