"""The eager host model's module-call extra and its fit on measured per-kind framework times
(``benchmarks/measurement/host_dispatch_kinds.py``, ``scripts/fit/calibrate_host_model.py --dispatch-kinds``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from dippm_nas.devices import HostProfile
from dippm_nas.errors import DippmNasError
from dippm_nas.prior import (HOST_KINDS, MEASURED_FIT_PARAMETERS, DeploymentSettings, HostModel, HostRow,
                             default_params, estimate, estimate_many, fit_host_model, graph_facts)
from dippm_nas.prior._host import module_call

from _scripts import load_script
from test_runtime import conv_chain

ROOT = Path(__file__).resolve().parents[2]
KINDS_FILE = ROOT / "data" / "host_dispatch" / "dispatch_kinds.json"
EAGER = DeploymentSettings(runtime="eager", host=HostProfile.from_clock(3.0), input_copy="none")


def test_module_calls_are_the_layers_eager_calls_through_nn_module() -> None:
    for cls in ("conv", "normalization", "activation", "pool"):
        assert module_call(cls, False)
    assert module_call("matmul", True)          # nn.Linear: a matmul by a weight
    assert not module_call("matmul", False)     # q @ k: functional
    for cls in ("elementwise", "softmax", "reduction", "view", "memory", "attention"):
        assert not module_call(cls, False)


def test_graph_facts_mark_a_conv_chains_layers_as_module_calls() -> None:
    f = graph_facts(conv_chain(1, 8, 8, layers=3))
    assert f.module_call.tolist() == [True] * 9


def test_the_module_extra_is_charged_once_per_module_call() -> None:
    g = conv_chain(1, 8, 8, layers=4, dtype="float32")
    base = default_params()
    hm = base.host_model
    without = estimate(g, "rtx-3090", params=base, deployment=EAGER).host_ms
    with_conv = dataclasses.replace(base, host_model=dataclasses.replace(hm, module_us={"conv": 10.0}))
    more = estimate(g, "rtx-3090", params=with_conv, deployment=EAGER).host_ms
    # four convolutions, each 10 µs more on the reference host, scaled to a 3.0 GHz host
    assert more - without == pytest.approx(4 * 10.0 * hm.scale(EAGER.host) / 1e3, rel=1e-9)
    # the batched path charges it the same
    many = estimate_many([g, conv_chain(1, 16, 8, layers=2, dtype="float32")], "rtx-3090", params=with_conv,
                         deployment=EAGER)
    assert many[0].host_ms == pytest.approx(more, rel=1e-12)


def test_host_model_kind_maps_name_the_bad_kind_or_value() -> None:
    op = {k: 10.0 for k in HOST_KINDS}
    with pytest.raises(DippmNasError, match="unknown kinds"):
        HostModel(op_us=op, module_us={"lstm": 1.0})
    with pytest.raises(DippmNasError, match=r"measured_op_us\['conv'\] must be in \[0, 10000\]"):
        HostModel(op_us=op, measured_op_us={"conv": -1.0})
    m = HostModel(op_us=op, module_us={"conv": 2.0})
    assert HostModel.from_dict(m.to_dict()) == m
    assert HostModel.from_dict({"op_us": op}).module_us == {}   # a calibration file without the new keys


def _rows() -> list[HostRow]:
    return [HostRow(conv_chain(1, c, s, layers=n, dtype="float32"), "titan-xp", EAGER, 0.4 + 0.02 * n + 0.002 * c)
            for c in (8, 32) for s in (8, 16) for n in (4, 12)]


def test_the_measured_fit_scales_the_measured_kinds_and_adds_the_launch() -> None:
    op = {k: 10.0 for k in HOST_KINDS}
    measured = {k: 1.0 + i for i, k in enumerate(HOST_KINDS)}
    base = HostModel(op_us=op, measured_op_us=measured, measured_module_us={"conv": 3.0})
    m = fit_host_model(_rows(), base=base)
    assert tuple(m.metrics["fitted"]) == MEASURED_FIT_PARAMETERS
    s, lib = (m.metrics["fitted"][k] for k in MEASURED_FIT_PARAMETERS)
    assert m.op_us["elementwise"] == pytest.approx(s * measured["elementwise"] + base.launch_us)
    assert m.op_us["conv"] == pytest.approx(s * measured["conv"] + base.launch_us + lib)
    assert m.op_us["view"] == pytest.approx(s * measured["view"])          # a view launches no kernel
    assert m.module_us == pytest.approx({"conv": 3.0 * s})
    plain = fit_host_model(_rows(), base=HostModel(op_us=op))          # no measured kinds: the one-time fit
    assert set(plain.metrics["fitted"]) == {"base_us", "library_us", "view_us"} and plain.module_us == {}
    with pytest.raises(DippmNasError, match="must have every kind"):
        fit_host_model(_rows(), base=HostModel(op_us=op, measured_op_us={"conv": 1.0}))


def test_calibrate_reads_every_kind_from_the_committed_measurement(tmp_path: Path) -> None:
    s = load_script("calibrate_host_model")
    got = s.measured_kinds(KINDS_FILE)
    assert set(got["measured_op_us"]) == set(HOST_KINDS)
    assert got["measured_op_us"]["view"] < got["measured_op_us"]["conv"]
    assert all(v >= 0 for v in got["measured_module_us"].values()) and "conv" in got["measured_module_us"]
    bad = tmp_path / "k.json"
    bad.write_text(json.dumps({"devices": {}}), encoding="utf-8")
    with pytest.raises(DippmNasError, match="not a host_dispatch_kinds.py JSON"):
        s.measured_kinds(bad)


def _bench() -> object:
    path = ROOT / "benchmarks" / "measurement" / "host_dispatch_kinds.py"
    spec = importlib.util.spec_from_file_location("host_dispatch_kinds", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_times_every_operator_and_module_form() -> None:
    pytest.importorskip("torch")
    b = _bench()
    ops = b.measure_ops("cpu", rounds=1, calls=2)
    assert {r["kind"] for r in ops} >= set(HOST_KINDS) - {"other"}
    assert all(np.isfinite(r["us"]) and r["us"] > 0 for r in ops)
    extra = b.module_extra(ops)
    assert set(extra) == {r["op"] for r in ops if r["call"] == "module"}
    kinds = b.kind_figures(ops)
    assert set(kinds["measured_op_us"]) == set(HOST_KINDS)
    assert all(v >= 0 for v in kinds["measured_module_us"].values())
    # the single-operator sum of a conv chain: per layer a conv, a batch norm and a relu, each a module call
    k = {"measured_op_us": {h: 1.0 for h in HOST_KINDS}, "measured_module_us": {"conv": 2.0}}
    assert b.single_op_ms(conv_chain(1, 8, 8, layers=3), k) == pytest.approx((9 * 1.0 + 3 * 2.0) / 1e3)
    with pytest.raises(DippmNasError, match="must be >= 1"):
        b.main(["--rounds", "0"])
