"""How the predictors and the prior honour a Deployment (no GPU, no network, no ../shared)."""

from __future__ import annotations

import math

import pytest

from dippm_nas import Deployment
from dippm_nas.devices import HostProfile
from dippm_nas.errors import DippmNasError, ExecutionRuntimeError
from dippm_nas.predictor import AnalyticPredictor, get_predictor
from dippm_nas.prior import UNKNOWN_HOST, DeploymentSettings, deployment_settings, estimate

from test_runtime import GPU_BOUND, HOST_BOUND

A100 = "a100-sxm4-40gb"


@pytest.mark.parametrize("predictor", ["analytic", "checkpoint"])
def test_predict_graphs_takes_a_deployment_and_records_what_it_assumed(predictor: str) -> None:
    p = AnalyticPredictor(A100, load_calibration=False) if predictor == "analytic" else get_predictor(A100)
    g = HOST_BOUND[0]
    (unknown,) = p.predict_graphs([g], mig=False)
    # framework and TF32: the running process's; autocast: the float32 graph's none, labelled as assumed
    assert unknown.labels["deployment_assumed"] == "host,input_copy,autocast"
    assert unknown.labels["deployment_from_process"].startswith("framework,tf32 (torch ")
    host = HostProfile.from_clock(2.25, framework="torch-1")
    dep = Deployment(host=host, framework="torch-1", input_copy="none", tf32_matmul=False, tf32_conv=True,
                     autocast="none")
    (described,) = p.predict_graphs([g], mig=False, deployment=dep)
    assert described.labels["deployment_assumed"] == "" and described.labels["deployment_from_process"] == ""
    assert described.details["host_profile_mismatch"] == 1.0
    # the legacy keywords build the same deployment: the host profile names its framework
    (legacy,) = p.predict_graphs([g], mig=False, host=host)
    assert legacy.labels["deployment_assumed"] == "input_copy,autocast"
    (same,) = p.predict_graphs([g], mig=False, deployment=Deployment(host=host, framework="torch-1"))
    assert legacy.latency_ms == pytest.approx(same.latency_ms, rel=1e-9)
    assert legacy.latency_ms_std == pytest.approx(same.latency_ms_std, rel=1e-9)


def test_runtime_or_host_beside_a_contradicting_deployment_is_an_error() -> None:
    p = AnalyticPredictor(A100, load_calibration=False)
    with pytest.raises(DippmNasError, match="conflicts with the deployment.s runtime"):
        p.predict_graphs(HOST_BOUND[:1], runtime="compiled", deployment=Deployment(runtime="eager"))
    with pytest.raises(ExecutionRuntimeError, match="runtime must be one of"):
        p.predict_graphs(HOST_BOUND[:1], deployment=Deployment(runtime="serving"))
    with pytest.raises(DippmNasError, match="must be a dippm_nas.Deployment"):
        p.predict_graphs(HOST_BOUND[:1], deployment={"runtime": "eager"})  # type: ignore[arg-type]


def test_the_prior_takes_the_deployments_settings() -> None:
    g = GPU_BOUND[0]
    dep = Deployment(runtime="cuda-graphs", framework="torch-2", input_copy="pinned", channels_last=True)
    s = deployment_settings(dep)
    assert isinstance(s, DeploymentSettings) and s.assumed == ("host", "autocast")
    assert (s.runtime, s.input_copy, s.channels_last, s.tf32_matmul, s.tf32_conv) == ("cuda-graphs", "pinned", True,
                                                                                      False, True)
    via_dep = estimate(g, A100, deployment=dep)
    direct = estimate(g, A100, runtime="cuda-graphs", input_copy="pinned", channels_last=True, host=UNKNOWN_HOST)
    assert via_dep.latency_ms == pytest.approx(direct.latency_ms, rel=1e-12)
    assert via_dep.input_copy_ms > 0


def _attention_block(batch: int, tokens: int, dim: int, dtype: str = "float32") -> "OperatorGraph":
    """x @ Wq -> softmax -> @ Wo -> layer norm: a matmul, softmax, matmul and layer norm chain."""
    import math

    from dippm_nas.graph import OperatorGraph
    from dippm_nas.spec import InputSpec, dtype_bytes
    from test_runtime import _node

    s = (batch, tokens, dim)
    mm = batch * tokens * dim * dim
    nodes = [
        _node(0, "matmul", "matmul", s, [s, (dim, dim)], [False, True], dtype=dtype, flops=2 * mm, macs=mm,
              attrs={"m": tokens, "n": dim, "k": dim, "batch": batch}),
        _node(1, "nn.softmax", "softmax", s, [s], [False], dtype=dtype, flops=5 * math.prod(s)),
        _node(2, "matmul", "matmul", s, [s, (dim, dim)], [False, True], dtype=dtype, flops=2 * mm, macs=mm,
              attrs={"m": tokens, "n": dim, "k": dim, "batch": batch}),
        _node(3, "nn.layer_norm", "normalization", s, [s, (dim,), (dim,)], [False, True, True], dtype=dtype,
              flops=8 * math.prod(s)),
    ]
    pbytes = sum(n.param_bytes for n in nodes)
    return OperatorGraph(nodes=nodes, edges=[(0, 1), (1, 2), (2, 3)], input_consumers={"x": [0]}, outputs=[3],
                         spec=InputSpec(shape=(tokens, dim), batch_size=batch, dtype=dtype),
                         param_count=pbytes // dtype_bytes(dtype), param_bytes=pbytes, mode="export").validate()


@pytest.mark.parametrize("device, faster", [("a100-sxm4-40gb", True), ("h100-sxm5-80gb", True),
                                            ("rtx-2080-ti", False), ("titan-rtx", False)])
def test_tf32_speeds_fp32_gemms_on_ampere_and_hopper_not_on_turing(device: str, faster: bool) -> None:
    g = _attention_block(64, 512, 1024)
    off = estimate(g, device, tf32_matmul=False).gpu_busy_ms
    on = estimate(g, device, deployment=Deployment(framework="torch-2", tf32_matmul=True)).gpu_busy_ms
    if faster:
        assert on < 0.6 * off
    else:
        assert on == pytest.approx(off, rel=1e-12)


def test_tf32_asked_on_a_gpu_without_it_is_flagged_and_ignored() -> None:
    p = AnalyticPredictor("rtx-2080-ti", load_calibration=False)
    g = _attention_block(8, 128, 256)
    with pytest.warns(RuntimeWarning, match="TF32"):
        (asked,) = p.predict_graphs([g], mig=False, deployment=Deployment(framework="torch-2", tf32_matmul=True))
    (plain,) = p.predict_graphs([g], mig=False, deployment=Deployment(framework="torch-2"))
    assert asked.details["tf32_unsupported"] == 1.0 and plain.details["tf32_unsupported"] == 0.0
    assert asked.latency_ms == pytest.approx(plain.latency_ms, rel=1e-12)
    (ampere,) = AnalyticPredictor(A100, load_calibration=False).predict_graphs(
        [g], mig=False, deployment=Deployment(framework="torch-2", tf32_matmul=True))
    assert ampere.details["tf32_unsupported"] == 0.0


def test_autocast_keeps_softmax_and_layer_norm_in_fp32_and_adds_casts() -> None:
    from dippm_nas.prior import graph_facts

    g = _attention_block(16, 256, 512)
    plan = graph_facts(g).autocast(g, "float16")
    assert plan.dtype.tolist() == [1, 0, 1, 0]  # matmul fp16, softmax fp32, matmul fp16, layer norm fp32
    # casts: the input and the weight of the first matmul; the softmax's input up; the second matmul's input
    # down and its weight; the layer norm's input up
    assert plan.casts.tolist() == [2, 1, 2, 1]
    plain = estimate(g, A100)
    ac = estimate(g, A100, autocast="float16")
    half = estimate(_attention_block(16, 256, 512, "float16"), A100)
    assert ac.gpu_busy_ms < plain.gpu_busy_ms            # the GEMMs run on FP16 tensor cores
    assert ac.gpu_busy_ms > half.gpu_busy_ms             # but the casts and the fp32 softmax / layer norm cost
    assert ac.host_ms > plain.host_ms                    # each cast is a dispatch and a launch


def test_input_copy_adds_its_bytes_over_the_boards_link_pinned_faster_than_pageable() -> None:
    from dippm_nas.devices import get_device
    from dippm_nas.prior import PINNED_COPY_EFFICIENCY

    small, big = HOST_BOUND[1], GPU_BOUND[1]
    for device in ("a100-sxm4-40gb", "h100-sxm5-80gb", "rtx-2080-ti"):
        link = get_device(device).pcie_gbps
        d = {name: {k: estimate(g, device, input_copy=k).input_copy_ms for k in ("none", "pinned", "pageable")}
             for name, g in (("small", small), ("big", big))}
        assert d["small"]["none"] == d["big"]["none"] == 0.0
        extra_us = (d["big"]["pinned"] - d["small"]["pinned"]) * 1e3
        bytes_ = big.spec.input_bytes - small.spec.input_bytes
        assert extra_us == pytest.approx(bytes_ / (link * PINNED_COPY_EFFICIENCY * 1e3), rel=1e-9)
        assert d["big"]["pinned"] < d["big"]["pageable"] and d["small"]["pinned"] < d["small"]["pageable"]
    # a PCIe 5.0 board copies the same bytes faster than a PCIe 3.0 one
    assert (estimate(big, "h100-sxm5-80gb", input_copy="pinned").input_copy_ms
            < estimate(big, "rtx-2080-ti", input_copy="pinned").input_copy_ms)


def test_a_pageable_copy_is_physics_staging_bound_plus_the_first_touch_of_a_fresh_batch() -> None:
    from dippm_nas.prior import PAGE_BYTES, PAGEABLE_STAGING_GBPS, PINNED_COPY_EFFICIENCY, input_copy_us

    nbytes = 7_225_344  # a float32 batch of 12 x 3 x 224 x 224
    kw = {"pageable_fixed_us": 0.0, "pageable_gbps": PAGEABLE_STAGING_GBPS, "pinned_fixed_us": 40.0}
    pinned = input_copy_us("pinned", nbytes, 15.75, **kw)
    assert pinned == pytest.approx(40.0 + nbytes / (15.75 * PINNED_COPY_EFFICIENCY * 1e3))
    warm = input_copy_us("pageable", nbytes, 15.75, **kw)
    assert warm == pytest.approx(40.0 + nbytes / (PAGEABLE_STAGING_GBPS * 1e3))  # the staging copy is slower
    # staging-bound: a faster link does not speed a pageable copy up, it does a pinned one
    assert input_copy_us("pageable", nbytes, 63.0, **kw) == pytest.approx(warm)
    assert input_copy_us("pinned", nbytes, 63.0, **kw) < pinned
    fresh = input_copy_us("pageable", nbytes, 15.75, **kw, fresh_page_us=1.5)
    assert fresh - warm == pytest.approx(math.ceil(nbytes / PAGE_BYTES) * 1.5)
    assert input_copy_us("none", nbytes, 15.75, **kw, fresh_page_us=1.5) == 0.0


def test_a_described_pageable_copy_carries_the_spread_of_its_batchs_first_touch() -> None:
    from dippm_nas.prior import default_params, deployment_spread

    g = HOST_BOUND[1]
    host = HostProfile.from_clock(2.25, framework="torch-2")
    hm = default_params().host_model
    assert hm.h2d_fresh_page_us > 0 and hm.h2d_fresh_page_sigma_log > 0  # measured: scripts/fit/fit_input_copy.py
    for copy in ("none", "pinned"):
        sp = deployment_spread(g, A100, Deployment(host=host, framework="torch-2", input_copy=copy))
        assert sp.sigma_log == 0.0 and sp.offset_log == 0.0
    sp = deployment_spread(g, A100, Deployment(host=host, framework="torch-2", input_copy="pageable"))
    assert sp.sigma_log > 0 and sp.offset_log > 0   # half the batches are mapped fresh: slower, and spread
    # the batched predictor path gives the same spread
    p = AnalyticPredictor(A100)
    (one,) = p.predict_graphs([g], mig=False, deployment=Deployment(host=host, framework="torch-2",
                                                                    input_copy="pageable"))
    assert one.details["deployment_sigma_log"] == pytest.approx(sp.sigma_log, rel=1e-6)


def test_the_host_fit_leaves_out_half_rows_whose_kernels_the_prior_does_not_price() -> None:
    from dippm_nas.prior import DeploymentSettings, HostRow, fit_host_model

    from test_runtime import conv_chain

    ex = DeploymentSettings(runtime="eager", host=HostProfile.from_clock(3.0), input_copy="pageable")
    g16, g32 = conv_chain(1, 16, 8, dtype="float16"), conv_chain(1, 16, 8, dtype="float32")
    # Pascal (TITAN Xp): native FP16 at 1/64 of FP32; Turing (TITAN RTX) runs half at twice the FP32 rate
    assert not HostRow(g16, "titan-xp", ex, 1.0).kernels_priced
    assert HostRow(g32, "titan-xp", ex, 1.0).kernels_priced
    assert HostRow(g16, "titan-rtx", ex, 1.0).kernels_priced
    priced = [HostRow(conv_chain(1, c, 8, dtype="float32"), "titan-xp", ex, 0.5 + 0.01 * c) for c in (8, 16, 32, 64)]
    unpriced = [HostRow(conv_chain(1, c, 8, dtype="float16"), "titan-xp", ex, 50.0) for c in (8, 16, 32, 64)]
    with_both = fit_host_model(priced + unpriced)
    alone = fit_host_model(priced)
    assert with_both.metrics["rows"] == 4 and with_both.metrics["rows_left_out_unpriced_half"] == 4
    assert with_both.op_us == alone.op_us  # the 50 ms half rows teach the host model nothing
    with pytest.raises(DippmNasError, match="rows whose kernels the prior prices, got 0 of 4"):
        fit_host_model(unpriced)


def test_the_host_fit_prices_a_fresh_batchs_first_touch() -> None:
    import dataclasses

    from dippm_nas.prior import PAGE_BYTES, DeploymentSettings, HostRow, default_params, host_model_latency_ms

    g = HOST_BOUND[1]
    hm = dataclasses.replace(default_params().host_model, h2d_fresh_page_us=2.0)
    ex = DeploymentSettings(runtime="eager", host=HostProfile.from_clock(3.0), input_copy="pageable")
    warm, fresh = (HostRow(g, A100, ex, 1.0, fresh_pages=f) for f in (False, True))
    a, b = host_model_latency_ms(hm, [warm, fresh])
    pages = math.ceil(g.spec.input_bytes / PAGE_BYTES)
    assert b - a == pytest.approx(pages * 2.0 * hm.scale(ex.host) / 1e3, rel=1e-9)
    with pytest.raises(DippmNasError, match="fresh_pages must be true or false"):
        HostRow(g, A100, ex, 1.0, fresh_pages="yes")  # type: ignore[arg-type]
    for bad in (-1.0, float("nan"), True):
        with pytest.raises(DippmNasError, match="h2d_fresh_page_us must be in"):
            dataclasses.replace(hm, h2d_fresh_page_us=bad)


def test_channels_last_drops_the_nchw_transposes_and_copies_reshaped_activations() -> None:
    from test_runtime import conv_chain

    g = conv_chain(32, 64, 28, dtype="float16")
    nchw, nhwc = estimate(g, A100), estimate(g, A100, channels_last=True)
    assert nhwc.gpu_busy_ms < nchw.gpu_busy_ms


@pytest.mark.parametrize("predictor", ["analytic", "checkpoint"])
def test_an_unknown_host_widens_sigma_and_a_described_one_narrows_it(predictor: str) -> None:
    p = AnalyticPredictor(A100, load_calibration=False) if predictor == "analytic" else get_predictor(A100)
    host = HostProfile.from_clock(3.0, framework="torch-2")
    for g in (HOST_BOUND[1], HOST_BOUND[2]):
        (unknown,) = p.predict_graphs([g], mig=False)
        (no_host,) = p.predict_graphs([g], mig=False, deployment=Deployment(framework="torch-2", input_copy="none"))
        (full,) = p.predict_graphs([g], mig=False, deployment=Deployment(host=host, framework="torch-2",
                                                                          input_copy="none", autocast="none"))
        rel = [x.latency_ms_std / x.latency_ms for x in (unknown, no_host, full)]
        assert rel[0] > rel[1] > rel[2]
        assert full.details["deployment_sigma_log"] == 0.0 and full.labels["deployment_assumed"] == ""
        # a float32 graph's undescribed autocast is none: labelled as assumed, no σ, the same figure
        (open_ac,) = p.predict_graphs([g], mig=False, deployment=Deployment(host=host, framework="torch-2",
                                                                             input_copy="none"))
        assert open_ac.labels["deployment_assumed"] == "autocast" and open_ac.details["deployment_sigma_log"] == 0.0
        assert open_ac.latency_ms == pytest.approx(full.latency_ms, rel=1e-12)
        assert no_host.labels["deployment_assumed"] == "host,autocast" and no_host.details["deployment_sigma_log"] > 0.1
    # a GPU-bound graph hardly depends on the host: its spread is small
    (gpu_bound,) = p.predict_graphs([GPU_BOUND[1]], mig=False, deployment=Deployment(framework="torch-2",
                                                                                     input_copy="none"))
    assert gpu_bound.details["deployment_sigma_log"] < 0.02


@pytest.mark.parametrize("predictor", ["analytic", "checkpoint"])
def test_a_7g_slice_equals_the_whole_gpu_when_host_bound_and_stays_within_10_percent(predictor: str) -> None:
    p = AnalyticPredictor(A100, load_calibration=False) if predictor == "analytic" else get_predictor(A100)
    graphs = HOST_BOUND + GPU_BOUND + [_attention_block(64, 512, 1024), _attention_block(8, 128, 256, "float16")]
    for pred in p.predict_graphs(graphs):
        s7 = pred.mig.profile("7g.40gb")
        assert s7.latency_basis == "corrected"
        if pred.details["host_bound"]:
            assert s7.latency_ms == pytest.approx(pred.latency_ms, rel=1e-3)
        else:  # 98 of 108 SMs, the whole memory: at most the SM ratio slower (a tenth), never faster
            assert pred.latency_ms <= s7.latency_ms <= pred.latency_ms * 108 / 98 * 1.001
        assert pred.mig.profile("1g.5gb").latency_ms >= s7.latency_ms


def _select_and_roll_graph() -> "OperatorGraph":
    """``qkv[0]`` (a select), a roll over two dimensions, a reshape of a permuted view."""
    from dippm_nas.graph import OperatorGraph
    from dippm_nas.spec import InputSpec
    from test_runtime import _node

    s, half = (3, 8, 16), (3, 4, 16)
    nodes = [
        _node(0, "take", "gather", s[1:], [s, ()], [False, True], dtype="float32", flops=0, attrs={"axis": 0}),
        _node(1, "strided_slice", "view", (4, 16), [s[1:]], [False], dtype="float32", flops=0),
        _node(2, "strided_slice", "view", (4, 16), [s[1:]], [False], dtype="float32", flops=0),
        _node(3, "concat", "memory", s[1:], [(4, 16), (4, 16)], [False, False], dtype="float32", flops=0,
              attrs={"axis": 0}),
        _node(4, "strided_slice", "view", (8, 8), [s[1:]], [False], dtype="float32", flops=0),
        _node(5, "strided_slice", "view", (8, 8), [s[1:]], [False], dtype="float32", flops=0),
        _node(6, "concat", "memory", s[1:], [(8, 8), (8, 8)], [False, False], dtype="float32", flops=0,
              attrs={"axis": 1}),
        _node(7, "permute_dims", "view", (16, 8), [s[1:]], [False], dtype="float32", flops=0, attrs={"axes": [1, 0]}),
        _node(8, "reshape", "view", (128,), [(16, 8)], [False], dtype="float32", flops=0),
    ]
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5), (4, 6), (5, 6), (6, 7), (7, 8)]
    return OperatorGraph(nodes=nodes, edges=edges, input_consumers={"x": [0]}, outputs=[8],
                         spec=InputSpec(shape=s, batch_size=1, dtype="float32"), param_count=0, param_bytes=0,
                         mode="export").validate()


def test_eager_dispatch_counts_a_select_as_a_view_and_a_roll_as_one_operator() -> None:
    import math

    from dippm_nas.prior import graph_facts

    g = _select_and_roll_graph()
    f = graph_facts(g)
    assert f.view[0] and not f.active[0]                        # qkv[0]: a select view
    assert f.inner_view[[1, 2, 4, 5]].all()                     # the roll's slices: inside its dispatch
    assert not f.internal[3] and f.internal[6]                  # one dispatch for both rolled dimensions
    assert f.reshape_copies()[8] == math.prod((16, 8))          # a reshape of a permuted view copies
    e = estimate(g, A100)
    hm = e.node_host_ms * 1e3
    assert hm[1] == hm[2] == 0.0 and 0 < hm[6] < hm[3] and e.node_time_ms[8] > 0


def test_graph_facts_of_many_graphs_at_once_are_each_graphs_own() -> None:
    """The facts computed over the nodes of several graphs together (positions across graphs) equal each graph's
    computed alone: rolls, selects, fused bias adds, hard activations, tiles, producers."""
    import dataclasses
    import json
    import lzma
    from pathlib import Path

    import numpy as np

    from dippm_nas.graph import OperatorGraph
    from dippm_nas.prior import clear_graph_facts, graph_facts, graph_facts_many

    with lzma.open(Path(__file__).parent / "data" / "inference_graphs.json.xz", "rt") as f:
        sample = [OperatorGraph.from_dict(x) for x in json.load(f)["gpu"]]
    graphs = [sample[0], _select_and_roll_graph(), *sample[1:], _select_and_roll_graph()]
    clear_graph_facts()
    many = graph_facts_many(graphs)
    assert any(f.hard_inner.any() for f in many) and any(f.fused.any() for f in many)
    assert many[1].internal.any() and many[1].inner_view.any() and many[-1] is many[1]  # one graph, cached once
    for g, got in zip(graphs, many):
        clear_graph_facts()
        want = graph_facts(g)
        for fld in dataclasses.fields(want):
            if fld.name in ("_tiles", "_tile_shape", "_nodes", "_preds", "memory", "_plans"):
                continue
            a, b = getattr(got, fld.name), getattr(want, fld.name)
            assert (np.array_equal(a, b) and a.dtype == b.dtype) if isinstance(b, np.ndarray) else a == b, fld.name
        for tile in ((128, 128), (64, 256)):
            assert all(np.array_equal(x, y) for x, y in zip(got.tiles(*tile), want.tiles(*tile)))
        assert [got._preds[i] for i in range(g.num_nodes)] == g.predecessors()
        assert np.array_equal(got.reshape_copies(), want.reshape_copies())


def test_an_undescribed_autocast_of_a_half_graph_is_the_mixture_of_half_and_autocast() -> None:
    from dippm_nas.devices import resolve_device
    from dippm_nas.prior import (UNKNOWN_AUTOCAST_WEIGHTS, CostStack, deployment_spread, deployment_spread_many,
                                 predict as prior_predict)

    half, fp32 = _attention_block(16, 256, 512, "float16"), _attention_block(16, 256, 512)
    base = dict(host=HostProfile.from_clock(2.25, framework="torch-2"), framework="torch-2", input_copy="none")

    def run(g: "OperatorGraph", autocast: "str | None") -> "Prediction":
        return prior_predict(g, A100, deployment=Deployment(**base, autocast=autocast), mig=False)

    none_, ac, open_ = run(half, "none"), run(half, "float16"), run(half, None)
    assert none_.details["deployment_sigma_log"] == 0.0 and ac.details["deployment_sigma_log"] == 0.0
    assert "autocast" in Deployment(**base).resolve().assumed and not Deployment(**base, autocast="none").resolve().assumed
    step = math.log(ac.latency_ms / none_.latency_ms)
    assert abs(step) > 0.01  # the two forms price apart: the mixture is not a formality here
    w = UNKNOWN_AUTOCAST_WEIGHTS["autocast"]
    assert open_.latency_ms == pytest.approx(none_.latency_ms * math.exp(w * step), rel=1e-9)
    assert open_.gpu_ms == pytest.approx(none_.gpu_ms * (ac.gpu_ms / none_.gpu_ms) ** w, rel=1e-9)
    assert open_.details["deployment_sigma_log"] == pytest.approx(math.sqrt(w * (1 - w)) * abs(step), rel=1e-9)
    assert open_.memory_mib == pytest.approx(max(none_.memory_mib, ac.memory_mib), rel=1e-12)
    # memory: the larger of the two passes, so that a budget holds for either (autocast's float32 softmax and
    # layer norm outputs and its cached weight casts outgrow the .half() pass on a larger block)
    big = _attention_block(64, 1024, 1024, "float16")
    big_none, big_ac, big_open = run(big, "none"), run(big, "float16"), run(big, None)
    assert big_ac.memory_mib > big_none.memory_mib and big_open.memory_mib == big_ac.memory_mib
    # a float32 graph's undescribed autocast is none: labelled as assumed, priced as none, no σ
    f_none, f_open = run(fp32, "none"), run(fp32, None)
    assert f_open.details["deployment_sigma_log"] == 0.0
    assert f_open.latency_ms == pytest.approx(f_none.latency_ms, rel=1e-12)
    assert f_open.memory_mib == f_none.memory_mib
    # the stacked spread is each graph's own
    dev = resolve_device(A100)
    many = deployment_spread_many(CostStack([half, fp32], dev), dev, Deployment(**base))
    for m, g in zip(many, (half, fp32)):
        one = deployment_spread(g, dev, Deployment(**base))
        assert (m.autocast_open, m.scenarios) == (one.autocast_open, one.scenarios)
        for name in ("offset_log", "sigma_log", "gpu_offset_log"):
            assert getattr(m, name) == pytest.approx(getattr(one, name), rel=1e-9, abs=1e-12)
    assert [m.autocast_open for m in many] == [True, False]


def test_a_row_without_an_autocast_condition_is_described_as_none() -> None:
    from dippm_nas.deployment import row_deployment

    assert row_deployment({}).autocast == "none" and row_deployment({"autocast": False}).autocast == "none"
    assert row_deployment({"autocast": True}, dtype="bfloat16").autocast == "bfloat16"
    assert row_deployment({"autocast": "float16"}).autocast == "float16"
    assert "autocast" not in row_deployment({}).resolve().assumed
