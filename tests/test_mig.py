"""MIG advisor: fit boundaries (exactly 5 GiB, exactly 40 GiB, larger than the device), DIPPM's rule,
slice latency monotone in slice size, devices without MIG, bad input."""

from __future__ import annotations

import json
import math

import pytest

from dippm_nas.devices import get_device
from dippm_nas.errors import DeviceError, DippmNasError
from dippm_nas.graph import OperatorGraph, OpNode
from dippm_nas.mig import DIPPM_LADDER, MigAdvice, advise
from dippm_nas.prediction import Prediction
from dippm_nas.spec import InputSpec

GIB = 1024.0  # MiB


def pred(memory_mib: float, *, std: float | None = None, device: str = "a100-sxm4-40gb",
         latency_ms: float = 10.0, batch: int = 32, details: dict | None = None) -> Prediction:
    return Prediction(latency_ms=latency_ms, energy_j=1.0, memory_mib=memory_mib, latency_source="predicted",
                      energy_source="predicted", memory_source="predicted", device=device, batch_size=batch,
                      dtype="float16", memory_mib_std=std, details=details or {})


def small_cnn() -> OperatorGraph:
    """conv (tensor cores) -> relu (memory-bound) -> depthwise conv: a mix of compute and memory work."""
    b, c, h = 32, 64, 56
    act = (b, c, h, h)
    n_act = math.prod(act)
    macs = n_act * c * 9
    dw_macs = n_act * 9
    nodes = [
        OpNode(0, "nn.conv2d", "conv", (act,), "float16", (act, (c, c, 3, 3)), (False, True),
               {"groups": 1, "out_channels": c, "in_channels_per_group": c, "depthwise": False, "data_layout": "NCHW"},
               2 * macs, macs, 2 * (n_act + c * c * 9), 2 * n_act, 2 * c * c * 9),
        OpNode(1, "nn.relu", "activation", (act,), "float16", (act,), (False,), {}, n_act, 0, 2 * n_act, 2 * n_act, 0),
        OpNode(2, "nn.conv2d", "conv", (act,), "float16", (act, (c, 1, 3, 3)), (False, True),
               {"groups": c, "out_channels": c, "in_channels_per_group": 1, "depthwise": True, "data_layout": "NCHW"},
               2 * dw_macs, dw_macs, 2 * (n_act + c * 9), 2 * n_act, 2 * c * 9),
    ]
    return OperatorGraph(nodes=nodes, edges=[(0, 1), (1, 2)], input_consumers={"x": [0]}, outputs=[2],
                         spec=InputSpec(shape=act[1:], batch_size=b, dtype="float16"),
                         param_count=c * c * 9 + c * 9, param_bytes=2 * (c * c * 9 + c * 9), mode="export").validate()


# ------------------------------------------------------------------------------------ boundaries

def test_exactly_5_gib_does_not_fit_1g5gb_whose_usable_memory_is_lower() -> None:
    a = advise(pred(5 * GIB), "a100-sxm4-40gb")
    assert not a.profile("1g.5gb").fits and a.profile("1g.5gb").memory_headroom_mib == pytest.approx(-0.25 * GIB)
    assert a.smallest_fit == "1g.10gb"
    assert a.profile("1g.10gb").fits and a.profile("2g.10gb").fits


def test_usable_memory_bound_is_inclusive() -> None:
    usable = 4.75 * GIB
    on = advise(pred(usable), "a100-sxm4-40gb")
    assert on.profile("1g.5gb").fits and on.smallest_fit == "1g.5gb"
    assert on.profile("1g.5gb").memory_headroom_mib == 0.0
    above = advise(pred(usable + 0.01), "a100-sxm4-40gb")
    assert not above.profile("1g.5gb").fits and above.smallest_fit == "1g.10gb"


def test_exactly_40_gib_fits_no_profile_and_says_why() -> None:
    a = advise(pred(40 * GIB), "a100-sxm4-40gb")
    assert a.smallest_fit is None and a.fitting == []
    assert "none fits" in a.reason and "7g.40gb" in a.reason
    # just under the largest usable memory fits 7g.40gb only
    b = advise(pred(39.38 * GIB), "a100-sxm4-40gb")
    assert b.smallest_fit == "7g.40gb" and b.fitting == ["7g.40gb"]


def test_larger_than_the_device_is_an_answer_not_an_error() -> None:
    for dev in ("a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"):
        a = advise(pred(1e6), dev)  # ~977 GiB
        assert a.supported and a.smallest_fit is None and "none fits" in a.reason
        assert all(not p.fits and p.reason for p in a.profiles)


def test_uncertainty_moves_the_choice_up() -> None:
    p = pred(4000.0, std=500.0)  # 4000 + 2 * 500 = 5000 > 4864
    assert advise(p, "a100-sxm4-40gb", k_sigma=2.0).smallest_fit == "1g.10gb"
    assert advise(p, "a100-sxm4-40gb", k_sigma=0.0).smallest_fit == "1g.5gb"
    a = advise(p, "a100-sxm4-40gb")  # the default k_sigma is the budgets' 1.0
    assert a.k_sigma == 1.0 and a.memory_needed_mib == 4500.0 and a.smallest_fit == "1g.5gb"


def test_smallest_fit_prefers_fewer_compute_slices_and_no_media_engines() -> None:
    a = advise(pred(9 * GIB), "a100-sxm4-40gb")
    assert a.smallest_fit == "1g.10gb"  # not 2g.10gb (same memory, more slices)
    b = advise(pred(3 * GIB), "a100-sxm4-40gb")
    assert b.smallest_fit == "1g.5gb" and b.profile("1g.5gb+me").fits
    assert b.profile("7g.40gb").instances_per_gpu == 1 and b.profile("1g.5gb").instances_per_gpu == 7


# ------------------------------------------------------------------------------------ DIPPM's rule

def test_dippm_rule_with_its_boundary_gap_closed() -> None:
    # DIPPM: < 5 -> 1g.5gb, < 10 -> 2g.10gb, < 20 -> 3g.20gb, < 40 -> 7g.40gb; a value on a bound had no answer.
    cases = {4 * GIB: "1g.5gb", 5 * GIB: "1g.5gb", 5 * GIB + 1: "2g.10gb", 10 * GIB: "2g.10gb",
             10 * GIB + 1: "3g.20gb", 20 * GIB: "3g.20gb", 20 * GIB + 1: "7g.40gb", 40 * GIB: "7g.40gb"}
    for mem, expected in cases.items():
        a = advise(pred(mem, std=1000.0), "a100-sxm4-40gb", rule="dippm")
        assert a.smallest_fit == expected, (mem, a.smallest_fit)
        assert a.smallest_fit not in ("1g.10gb", "4g.20gb")
        assert a.memory_needed_mib == mem  # memory-only: the uncertainty is ignored
    over = advise(pred(40 * GIB + 1), "a100-sxm4-40gb", rule="dippm")
    assert over.smallest_fit is None and "none fits" in over.reason
    ladder = advise(pred(GIB), "a100-sxm4-80gb", rule="dippm")
    eligible = [p.profile for p in ladder.profiles if p.fits and not p.reason]
    assert eligible == ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"] and len(DIPPM_LADDER) == 4


# ------------------------------------------------------------------------------------ latency on slices

@pytest.mark.parametrize("dev", ["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h100-pcie-80gb",
                                 "h200-sxm-141gb"])
def test_slice_latency_is_monotone_in_slice_size(dev: str) -> None:
    from dippm_nas.prior import predict

    g = small_cnn()
    p = predict(g, dev, mig=False)
    a = advise(p, dev, graph=g)
    profiles = {q.name: q for q in get_device(dev).mig_profiles}
    rows = [(profiles[x.profile], x) for x in a.profiles]
    assert all(x.latency_basis == "corrected" and x.latency_ms > 0 for _, x in rows)
    for pa, xa in rows:
        for pb, xb in rows:
            if pa.compute_slices <= pb.compute_slices and pa.memory_slices <= pb.memory_slices:
                assert xa.latency_ms >= xb.latency_ms - 1e-12, (pa.name, pb.name)
    full = next(x for _, x in rows if x.profile.startswith("7g"))
    smallest = next(x for _, x in rows if x.profile.startswith("1g"))
    assert smallest.latency_ms > full.latency_ms
    assert full.latency_ms >= p.latency_ms  # 7g has at most the full GPU's SMs


def test_throughput_counts_every_instance() -> None:
    g = small_cnn()
    from dippm_nas.prior import predict

    p = predict(g, "a100-sxm4-40gb", mig=False)
    a = advise(p, "a100-sxm4-40gb", graph=g)
    one = a.profile("1g.5gb")
    assert one.throughput_samples_per_s == pytest.approx(7 * 32 / (one.latency_ms / 1e3))


def test_without_the_graph_latency_is_scaled_from_the_prediction() -> None:
    p = pred(1000.0, latency_ms=10.0, details={"host_ms": 1.0, "gpu_busy_ms": 9.0})
    a = advise(p, "a100-sxm4-40gb")
    one = a.profile("1g.5gb")
    assert one.latency_basis == "scaled"
    assert one.latency_ms == pytest.approx(9.0 * max(108 / 14, 8))
    other = advise(pred(1000.0, device="a100-sxm4-80gb"), "a100-sxm4-40gb")
    assert other.profile("1g.5gb").latency_ms is None and other.profile("1g.5gb").latency_basis == "unknown"


# ------------------------------------------------------------------------------------ no MIG, bad input

def test_devices_without_mig_say_so() -> None:
    a = advise(pred(1000.0, device="rtx-4090"), "rtx-4090")
    assert isinstance(a, MigAdvice) and not a.supported and a.profiles == () and a.smallest_fit is None
    assert "does not support MIG" in a.reason
    json.dumps(a.to_dict())


def test_bad_input() -> None:
    with pytest.raises(DeviceError, match="choices"):
        advise(pred(1000.0), "a100-sxm9")
    with pytest.raises(DippmNasError, match="k_sigma"):
        advise(pred(1000.0), "a100-sxm4-40gb", k_sigma=-1)
    with pytest.raises(DippmNasError, match="rule"):
        advise(pred(1000.0), "a100-sxm4-40gb", rule="closest")  # type: ignore[arg-type]
    with pytest.raises(DippmNasError, match="Prediction"):
        advise({"memory_mib": 1000.0}, "a100-sxm4-40gb")  # type: ignore[arg-type]
    with pytest.raises(DippmNasError, match="no MIG profile"):
        advise(pred(1000.0), "a100-sxm4-40gb").profile("9g.90gb")


def test_advice_serialises_to_json() -> None:
    d = advise(pred(6000.0, std=100.0), "h100-sxm5-80gb").to_dict()
    s = json.loads(json.dumps(d))
    assert s["smallest_fit"] == "1g.10gb" and len(s["profiles"]) == 7 and s["rule"] == "dippm-nas"


def test_fit_violations_name_recommended_slices_below_the_memory_a_model_needs() -> None:
    from dippm_nas.errors import InvalidValueError
    from dippm_nas.mig import mig_fit_violations

    # 4600 MiB + 1 sigma of 100 MiB = 4700 MiB needed: fits 1g.5gb (4864 MiB usable) and everything larger
    adv = advise(pred(memory_mib=4600.0, std=100.0), "a100-sxm4-40gb")
    assert adv.smallest_fit == "1g.5gb"
    assert mig_fit_violations(adv, 4800.0) == []                  # the reference's need fits every recommendation
    assert mig_fit_violations(adv, 4900.0) == ["1g.5gb", "1g.5gb+me"]  # 36 MiB over their 4864 MiB usable
    big = mig_fit_violations(adv, 10_000.0)
    assert "1g.5gb" in big and all(p.memory_limit_mib < 10_000.0 for p in adv.profiles if p.profile in big)
    for bad in (-1.0, float("nan"), "5000", True):
        with pytest.raises(InvalidValueError):
            mig_fit_violations(adv, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError):
        mig_fit_violations("advice", 1.0)  # type: ignore[arg-type]
