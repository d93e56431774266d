"""The kernel σ of a GPU without efficiency multipliers of its own: an unseen GPU's measured error."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from dippm_nas.predictor import AnalyticPredictor
from dippm_nas.prior import HOST_KINDS, HostModel, default_params, latency_sigma_log, predict

from _models import features_deployment
from conftest import shared_data_or_skip
from test_runtime import GPU_BOUND, HOST_BOUND

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_unseen_gpu_sigma_has_a_source_and_exceeds_the_fitted_gpus_own() -> None:
    hm = default_params().host_model
    unseen = hm.metrics["sigma_log_gpu_unseen"]
    assert isinstance(unseen, float) and 0 < unseen < 1
    record = hm.metrics["fit_gpu_unseen"]
    script = record.split()[1]
    assert record.startswith("python ") and (ROOT / script).is_file()  # the command that measured it
    for gpu in ("a100-sxm4-40gb", "rtx-3090", "rtx-4090", "rtx-5090"):
        assert gpu in record  # the rows it was derived from
    for dtype in ("float16", "float32"):  # the host fit's held-out GPU-bound rows of that precision, at least unseen
        held_out = hm.metrics[f"sigma_log_gpu_unseen_{dtype}"]
        assert hm.sigma_log_gpu(dtype, device_fitted=False) == pytest.approx(max(unseen, held_out))
    # float64 has no such key: its own held-out σ, at least the unseen one
    assert hm.sigma_log_gpu("float64", device_fitted=False) == pytest.approx(max(unseen, hm.sigma_log_gpu("float64")))
    # half-precision kernels of an unseen GPU miss further than the fitted GPUs' pooled σ says
    assert hm.sigma_log_gpu("float16", device_fitted=False) >= hm.sigma_log_gpu("float16")


def test_the_shipped_per_precision_sigma_is_the_host_fits_held_out_gpu_bound_rows() -> None:
    """``sigma_log_gpu_unseen_float16`` / ``_float32`` come from scripts/fit/calibrate_host_model.py's
    leave-one-GPU-out (recorded in the host model's command and ``heldout``), the half-precision one the wider;
    the pooled GPU-bound σ of the same rows lies between them."""
    hm = default_params().host_model
    assert "calibrate_host_model.py" in hm.command and hm.metrics["heldout"].startswith("leave-one-GPU-out")
    f16, f32 = hm.metrics["sigma_log_gpu_unseen_float16"], hm.metrics["sigma_log_gpu_unseen_float32"]
    assert 0 < f32 < hm.metrics["sigma_log_gpu_bound"] < f16 < 1


def test_gpu_bound_sigma_by_dtype_takes_each_precisions_gpu_bound_rows() -> None:
    sys.path.insert(0, str(ROOT / "scripts" / "fit"))
    try:
        from calibrate_host_model import gpu_bound_sigma_by_dtype
    finally:
        sys.path.remove(str(ROOT / "scripts" / "fit"))
    err = np.array([0.3, -0.4, 2.0, 0.1, -0.1, 5.0])
    host = np.array([False, False, True, False, False, True])
    dtypes = np.array(["float16", "float16", "float16", "float32", "float32", "bfloat16"])
    got = gpu_bound_sigma_by_dtype(err, host, dtypes)
    assert got == pytest.approx({"sigma_log_gpu_unseen_float16": math.sqrt(0.125),
                                 "sigma_log_gpu_unseen_float32": 0.1})  # host-bound rows and bfloat16 left out


def _recorded_cells(record: str) -> dict[tuple[str, str], tuple[int, float, float]]:
    """``(GPU, source) -> (GPU-bound rows, RMS log error, mean log error)`` as ``fit_gpu_unseen`` records them."""
    cells = {(d, s): (int(n), float(rms), float(mean)) for d, s, n, rms, mean in re.findall(
        r"([\w.-]+) ([\w-]+): (\d+) GPU-bound rows, RMS ([\d.]+), mean ([+-][\d.]+)", record)}
    assert cells, f"no per-cell figures in the record: {record}"
    return cells


def test_the_shipped_unseen_gpu_sigma_is_the_rms_of_its_recorded_cells() -> None:
    """The stored σ is what its record's cells give (each cell's mean square weighing equally)."""
    hm = default_params().host_model
    cells = _recorded_cells(hm.metrics["fit_gpu_unseen"])
    rms = [v[1] for v in cells.values()]
    assert hm.metrics["sigma_log_gpu_unseen"] == pytest.approx(math.sqrt(float(np.mean(np.square(rms)))), abs=2e-3)


def test_a_small_recompute_of_the_unseen_gpu_sigma_matches_the_shipped_figure(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The leave-one-GPU-out of benchmarks/accuracy/unseen_gpu_sigma.py on the first 12 Accel-NASBench rows (A100
    and RTX 3090, graphs assembled here): each cell's RMS and bias within 0.05 of the recorded 400-row figures, and
    the σ with these two cells in place of the recorded ones within 0.02 of the shipped σ. The cells' errors are
    mostly a bias (the recorded RMS and |mean| differ by < 0.01), so 12 rows pin them."""
    csv_path = shared_data_or_skip("accel_nasbench_mnasnet_space_throughput.csv")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "accuracy"))
    from unseen_gpu_sigma import DEFAULT_ENTRY_GPUS, fitted_cells, sigma_of, source_rows, unseen_errors

    from dippm_nas.dataset import import_accel_nasbench

    out = tmp_path / "accel.sqlite"
    report = import_accel_nasbench(csv_path, out, limit=12, workers=1, progress=False)
    assert report.graphs_captured == 12 and report.failed_rows == 0, report
    base = default_params()
    errors = unseen_errors(fitted_cells({"accel-nasbench": source_rows(out, "accel-nasbench")}), base,
                           DEFAULT_ENTRY_GPUS)
    recorded = _recorded_cells(base.host_model.metrics["fit_gpu_unseen"])
    assert set(errors) == {("a100-sxm4-40gb", "accel-nasbench"), ("rtx-3090", "accel-nasbench")}
    for cell, e in errors.items():
        assert len(e) == 12  # every MBConv row at batch 256 is GPU-bound
        _, rms, mean = recorded[cell]
        assert float(np.sqrt(np.mean(np.square(e)))) == pytest.approx(rms, abs=0.05), cell
        assert float(np.mean(e)) == pytest.approx(mean, abs=0.05), cell
    # the recorded timm cells (their graphs need timm) with the two recomputed ones
    mixed = {**{c: np.array([v[1]]) for c, v in recorded.items()}, **errors}
    assert sigma_of(mixed) == pytest.approx(base.host_model.metrics["sigma_log_gpu_unseen"], abs=0.02)


def test_device_fitted_means_an_own_entry_of_the_device_scales() -> None:
    p = default_params()
    assert p.device_fitted("rtx-3090") and p.device_fitted("a100-sxm4-40gb")
    assert p.device_fitted("a100-sxm4-40gb.mig-1g.5gb")  # a MIG slice view: its parent's entry
    assert not p.device_fitted("rtx-2080-ti") and not p.device_fitted("titan-xp") and not p.device_fitted("l4")
    assert not p.device_fitted("*")


def test_sigma_log_gpu_takes_the_unseen_figure_only_for_an_unfitted_device() -> None:
    hm = HostModel(op_us={k: 10.0 for k in HOST_KINDS},
                   metrics={"sigma_log_gpu_bound": 0.19, "sigma_log_gpu_bound_float64": 0.30,
                            "sigma_log_gpu_unseen": 0.25})
    assert hm.sigma_log_gpu("float16") == 0.19 and hm.sigma_log_gpu("float16", device_fitted=False) == 0.25
    # a dtype whose own measured error is wider keeps it
    assert hm.sigma_log_gpu("float64", device_fitted=False) == 0.30
    # not recorded: the GPU-bound σ as before
    bare = HostModel(op_us={k: 10.0 for k in HOST_KINDS}, metrics={"sigma_log_gpu_bound": 0.19})
    assert bare.sigma_log_gpu("float16", device_fitted=False) == 0.19


def test_an_unfitted_gpu_gets_its_precisions_held_out_sigma_at_least_the_unseen_one() -> None:
    hm = HostModel(op_us={k: 10.0 for k in HOST_KINDS},
                   metrics={"sigma_log_gpu_bound": 0.25, "sigma_log_gpu_bound_float64": 0.30,
                            "sigma_log_gpu_unseen": 0.22, "sigma_log_gpu_unseen_float16": 0.33,
                            "sigma_log_gpu_unseen_float32": 0.16})
    assert hm.sigma_log_gpu("float16", device_fitted=False) == 0.33
    assert hm.sigma_log_gpu("float32", device_fitted=False) == 0.22  # below the unseen σ: that one
    assert hm.sigma_log_gpu("float64", device_fitted=False) == 0.30  # no per-precision key: its own
    assert hm.sigma_log_gpu("bfloat16", device_fitted=False) == 0.25  # none: the pooled one, at least unseen
    # a GPU with its own multipliers keeps the pooled σ
    assert hm.sigma_log_gpu("float16") == 0.25 and hm.sigma_log_gpu("float32") == 0.25


def test_an_autocast_pass_gets_the_kernel_sigma_of_the_dtype_it_runs_in() -> None:
    """A float32 graph under autocast float16 runs half-precision kernels: on an unseen GPU its kernel σ is the
    float16 one (PriorEstimate.compute_dtype), not the float32 one."""
    from dippm_nas import Deployment
    from dippm_nas.devices import DEFAULT_HOST_PROFILE
    from dippm_nas.prior import estimate
    from test_runtime import conv_chain

    g = conv_chain(256, 256, 56, layers=6, dtype="float32")
    hm = default_params().host_model
    plain = Deployment(host=DEFAULT_HOST_PROFILE, framework="torch-2", input_copy="none")
    amp = Deployment(host=DEFAULT_HOST_PROFILE, framework="torch-2", input_copy="none", autocast="float16")
    e32, e16 = estimate(g, "titan-rtx", deployment=plain), estimate(g, "titan-rtx", deployment=amp)
    assert (e32.autocast, e32.compute_dtype) == (None, "float32") and e16.compute_dtype == "float16"
    assert not e16.launch_bound and not e32.launch_bound
    assert latency_sigma_log(e16) == pytest.approx(hm.sigma_log_gpu("float16", device_fitted=False), rel=0.05)
    assert latency_sigma_log(e32) == pytest.approx(hm.sigma_log_gpu("float32", device_fitted=False), rel=0.05)


def _with_own_entry(device: str, base=None):
    """The shipped constants (or ``base``) with ``device`` given its own entry equal to the default one: the same
    prediction, the device counted as fitted."""
    p = base if base is not None else default_params()
    return dataclasses.replace(p, device_scales={**p.device_scales, device: p.device_scales["*"]})


def _unseen_above_fitted():
    """The shipped constants with the unseen-GPU σ set above the fitted GPUs' GPU-bound σ (the shipped figures may
    read either way round: both are measured), so the two cases differ."""
    p = default_params()
    hm = p.host_model
    metrics = {**hm.metrics, "sigma_log_gpu_unseen": hm.sigma_log_gpu("float16") + 0.1}
    return dataclasses.replace(p, host_model=dataclasses.replace(hm, metrics=metrics))


@pytest.mark.parametrize("device", ["rtx-2080-ti", "l4"])
def test_an_unfitted_gpu_gets_the_unseen_gpu_sigma_on_its_kernels_and_a_fitted_one_does_not(device: str) -> None:
    g = GPU_BOUND[0]
    p = _unseen_above_fitted()
    hm = p.host_model
    unfitted = predict(g, device, params=p, deployment=features_deployment(), mig=False)
    fitted = predict(g, device, params=_with_own_entry(device, p), deployment=features_deployment(), mig=False)
    assert unfitted.latency_ms == pytest.approx(fitted.latency_ms, rel=1e-12)  # the same kernels and host
    s_un, s_fit = unfitted.latency_ms_std / unfitted.latency_ms, fitted.latency_ms_std / fitted.latency_ms
    assert s_un > s_fit
    # GPU-bound: the kernel σ dominates, each the host model's figure for the case
    assert s_un == pytest.approx(hm.sigma_log_gpu("float16", device_fitted=False), rel=0.1)
    assert s_fit == pytest.approx(hm.sigma_log_gpu("float16"), rel=0.1)


def test_a_host_bound_graph_moves_little_with_the_kernel_sigma() -> None:
    g = HOST_BOUND[1]
    from dippm_nas.prior import estimate

    est = estimate(g, "rtx-2080-ti", deployment=features_deployment())
    assert est.launch_bound
    s_un = latency_sigma_log(est, default_params())
    s_fit = latency_sigma_log(est, _with_own_entry("rtx-2080-ti"))
    assert s_fit <= s_un <= s_fit + 0.5 * (default_params().host_model.metrics["sigma_log_gpu_unseen"])


def test_the_analytic_predictor_of_an_unfitted_gpu_reads_the_same_sigma_as_the_prior() -> None:
    g = GPU_BOUND[1]
    a = AnalyticPredictor("titan-rtx").predict_graphs([g], mig=False, deployment=features_deployment())[0]
    b = predict(g, "titan-rtx", deployment=features_deployment(), mig=False)
    assert a.latency_ms_std / a.latency_ms == pytest.approx(b.latency_ms_std / b.latency_ms, rel=1e-9)
    hm = default_params().host_model
    # the kernel σ of an unseen GPU on the GPU-bound part (the host's moves it little)
    assert a.latency_ms_std / a.latency_ms == pytest.approx(hm.sigma_log_gpu("float16", device_fitted=False), rel=0.1)


def test_the_leave_one_gpu_out_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/accuracy/unseen_gpu_sigma.py: the held-out GPU gets the geometric mean of the other GPUs the
    default entry averages (not the Hopper entries), and σ weighs each cell equally."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "accuracy"))
    from unseen_gpu_sigma import DEFAULT_ENTRY_GPUS, sigma_of, unseen_params

    base = default_params()
    star = base.device_scales["*"]
    gm = math.exp(np.mean([math.log(base.device_scales[d].compute) for d in DEFAULT_ENTRY_GPUS]))
    assert star.compute == pytest.approx(gm, rel=1e-9)  # the shipped default entry is their mean
    p = unseen_params(base, "rtx-3090")
    others = [d for d in DEFAULT_ENTRY_GPUS if d != "rtx-3090"]
    assert "rtx-3090" not in p.device_scales and not p.device_fitted("rtx-3090")
    assert p.device_scales["*"].compute == pytest.approx(
        math.exp(np.mean([math.log(base.device_scales[d].compute) for d in others])), rel=1e-9)
    with pytest.raises(SystemExit, match="not the geometric mean"):
        unseen_params(dataclasses.replace(base, device_scales={**base.device_scales, "*": base.device_scales["rtx-3090"]}),
                      "rtx-4090")
    # two cells: one of 100 rows at 0.1, one of 1 row at 0.5 -> sqrt((0.01 + 0.25) / 2), not row-weighted
    s = sigma_of({("a", "x"): np.full(100, 0.1), ("b", "y"): np.array([-0.5])})
    assert s == pytest.approx(math.sqrt((0.01 + 0.25) / 2))
    assert "unseen_gpu_sigma" in sys.modules


def test_sigma_by_geforce_splits_the_cells_by_board_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``unseen_gpu_sigma.sigma_by_geforce``: the RMS over the cells of GeForce GPUs and of the others apart, each
    cell weighing equally; a line without GPU-bound rows gets no key."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "accuracy"))
    from unseen_gpu_sigma import sigma_by_geforce

    errors = {("rtx-3090", "timm"): np.array([0.3, -0.3]), ("rtx-4090", "timm"): np.array([0.4]),
              ("a100-sxm4-40gb", "accel-nasbench"): np.array([-0.25, -0.25]),
              ("rtx-5090", "timm"): np.array([])}
    got = sigma_by_geforce(errors)
    assert got == pytest.approx({"geforce": math.sqrt((0.09 + 0.16) / 2), "other": 0.25})
    assert sigma_by_geforce({("a100-sxm4-40gb", "accel-nasbench"): np.array([0.1])}) == pytest.approx({"other": 0.1})
