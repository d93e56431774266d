"""scripts/fit/calibrate_prior.py --base: refits only the per-GPU multipliers, every other constant kept."""

from __future__ import annotations

import dataclasses
import math

import pytest
from _scripts import load_script

from dippm_nas.prior import DEFAULT_SCALE_KEY, GEFORCE_SCALE_KEY, default_params, default_scale_entries, estimate

from test_prior import matmul_graph, relu_chain


def _items(cal, params):  # noqa: ANN001, ANN202 - the script's module and constants
    """A compute-bound GEMM and a memory-bound chain per GPU, 'measured' as ``params`` predicts them."""
    graphs = {"gemm": matmul_graph(8192, 8192, 8192), "chain": relu_chain([2**27] * 4, dtype="float16")}
    out = []
    for dev in ("a100-sxm4-40gb", "rtx-3090"):
        for name, g in graphs.items():
            ms = estimate(g, dev, params=params).latency_ms
            out.append(cal.WholeModel(name, "toy", dev, g, ms, False, False))
    return out


def test_device_refit_recovers_the_multipliers_and_keeps_every_other_constant() -> None:
    cal = load_script("calibrate_prior")
    shipped = default_params()
    truth = {"a100-sxm4-40gb": (0.5, 0.7), "rtx-3090": (0.9, 0.6)}
    scales = dict(shipped.device_scales)
    for dev, (c, m) in truth.items():
        scales[dev] = dataclasses.replace(scales[dev], compute=c, memory=m)
    measured = _items(cal, dataclasses.replace(shipped, device_scales=scales))
    fitted = cal.fit_device_scales(measured, shipped)
    for dev, (c, m) in truth.items():
        got = fitted.device_scales[dev]
        assert got.compute == pytest.approx(c, rel=0.03) and got.memory == pytest.approx(m, rel=0.03)
        assert got.classes == shipped.device_scales[dev].classes and got.source == shipped.device_scales[dev].source
    # the A100's sibling follows it; devices without rows and the shared constants are untouched
    assert fitted.device_scales["a100-pcie-40gb"].compute == fitted.device_scales["a100-sxm4-40gb"].compute
    for dev in ("h100-sxm5-80gb", "host-cpu", "rtx-4090"):
        assert fitted.device_scales[dev] == shipped.device_scales[dev]
    assert fitted.op_classes == shipped.op_classes and fitted.sdpa_eta_flash == shipped.sdpa_eta_flash
    # the default entries are derived again from the refitted GPUs (the two with rows here)
    want = default_scale_entries(fitted.device_scales, ["a100-sxm4-40gb", "rtx-3090"])
    assert fitted.device_scales[DEFAULT_SCALE_KEY] == want[DEFAULT_SCALE_KEY]
    assert fitted.device_scales[GEFORCE_SCALE_KEY] == want[GEFORCE_SCALE_KEY]
    assert math.isclose(want[DEFAULT_SCALE_KEY].compute, math.sqrt(fitted.device_scales["a100-sxm4-40gb"].compute
                                                                    * fitted.device_scales["rtx-3090"].compute))


def test_base_must_be_a_file(tmp_path) -> None:  # noqa: ANN001 - pytest's fixture
    cal = load_script("calibrate_prior")
    with pytest.raises(SystemExit):
        cal.main(["--data", str(tmp_path), "--sections", "anb", "--base", str(tmp_path / "missing.json")])
