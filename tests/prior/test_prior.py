"""Analytic prior on hand-built graphs: roofline, peaks, quantisation, timelines, energy, liveness memory."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np
import pytest

from dippm_nas.devices import Device, get_device
from dippm_nas.errors import DeviceError, GraphValidationError, UnsupportedDtypeError
from dippm_nas.graph import OperatorGraph, OpNode
from dippm_nas.prediction import Prediction
from dippm_nas.prior import (PARAM_CLASSES, PowerParams, PowerTable, PriorParams, activation_liveness, default_params,
                             estimate, predict, round_block)
from dippm_nas.spec import InputSpec, dtype_bytes

MIB = 2**20


# ------------------------------------------------------------------------------------ graph builders

def op(i: int, name: str, cls: str, out: Sequence[tuple[int, ...]], ins: Sequence[tuple[int, ...]],
       par: Sequence[bool] | None = None, *, dtype: str = "float32", flops: int | None = None, macs: int = 0,
       attrs: dict | None = None, const: bool = False) -> OpNode:
    par = tuple(par) if par is not None else (False,) * len(ins)
    eb = dtype_bytes(dtype)
    view = cls == "view"
    br = 0 if view else sum(math.prod(s) for s in ins) * eb
    bw = 0 if view else sum(math.prod(s) for s in out) * eb
    pb = sum(math.prod(s) for s, p in zip(ins, par) if p) * eb
    if flops is None:
        flops = 0 if view else sum(math.prod(s) for s in out)
    return OpNode(index=i, op=name, op_class=cls, output_shapes=tuple(tuple(s) for s in out), output_dtype=dtype,
                  input_shapes=tuple(tuple(s) for s in ins), input_is_param=par, attrs=attrs or {}, flops=flops,
                  macs=macs, bytes_read=br, bytes_written=bw, param_bytes=pb, is_constant=const)


def graph(nodes: list[OpNode], edges: list[tuple[int, int]], *, inputs: dict[str, list[int]],
          outputs: list[int], shape: tuple[int, ...], batch: int = 1, dtype: str = "float32") -> OperatorGraph:
    pbytes = sum(n.param_bytes for n in nodes if not n.is_constant)
    return OperatorGraph(nodes=nodes, edges=sorted(edges), input_consumers=inputs, outputs=outputs,
                         spec=InputSpec(shape=shape, batch_size=batch, dtype=dtype),
                         param_count=pbytes // dtype_bytes(dtype), param_bytes=pbytes, mode="export").validate()


def matmul_graph(m: int, n: int, k: int, dtype: str = "float16") -> OperatorGraph:
    node = op(0, "matmul", "matmul", [(m, n)], [(m, k), (k, n)], [False, True], dtype=dtype,
              flops=2 * m * n * k, macs=m * n * k, attrs={"m": m, "n": n, "k": k, "batch": 1})
    return graph([node], [], inputs={"x": [0]}, outputs=[0], shape=(k,), batch=m, dtype=dtype)


def conv_graph(dtype: str = "float32", *, groups: int = 1, c: int = 64) -> OperatorGraph:
    # (8, c, 32, 32) -> (8, c, 32, 32), 3x3
    cin_g = c // groups
    macs = 8 * c * 32 * 32 * cin_g * 9
    node = op(0, "nn.conv2d", "conv", [(8, c, 32, 32)], [(8, c, 32, 32), (c, cin_g, 3, 3)], [False, True],
              dtype=dtype, flops=2 * macs, macs=macs,
              attrs={"groups": groups, "out_channels": c, "in_channels_per_group": cin_g,
                     "depthwise": groups > 1 and cin_g == 1, "data_layout": "NCHW", "kernel": [3, 3]})
    return graph([node], [], inputs={"x": [0]}, outputs=[0], shape=(c, 32, 32), batch=8, dtype=dtype)


def ideal_params(**glob) -> PriorParams:
    """Pure roofline: efficiency 1, no quantisation, no fixed costs, no host overheads (unless given)."""
    p = PriorParams.uncalibrated()
    for c in PARAM_CLASSES:
        p = p.with_class(c, kernel_us=0.0, wave_exponent=0.0, tile_exponent=0.0)
    overheads = {"host_dispatch_us": 0.0, "host_launch_us": 0.0, "host_view_us": 0.0}
    overheads.update(glob)
    return dataclasses.replace(p, **overheads)


def toy_gpu(**changes) -> Device:
    base = dict(id="toy-gpu", name="Toy", kind="gpu", architecture="toy", sms=10, fp32_tflops=1.0,
                fp16_tflops=2.0, tf32_tensor_tflops=4.0, fp16_tensor_tflops=8.0, bf16_tensor_tflops=8.0,
                memory_gib=16.0, bandwidth_gbps=1000.0, l2_mib=1.0, board_power_w=250.0, idle_power_w=50.0,
                runtime_baseline_mib=100.0, cublas_workspace_mib=8.125)
    base.update(changes)
    return Device(**base)


def relu_chain(elems: Sequence[int], dtype: str = "float32") -> OperatorGraph:
    """x -> relu -> relu -> ... with element counts per tensor (elems[0] is the input)."""
    nodes = [op(i, "nn.relu", "activation", [(elems[i + 1],)], [(elems[i],)], dtype=dtype) for i in range(len(elems) - 1)]
    edges = [(i, i + 1) for i in range(len(nodes) - 1)]
    return graph(nodes, edges, inputs={"x": [0]}, outputs=[len(nodes) - 1], shape=(elems[0],), dtype=dtype)


# ------------------------------------------------------------------------------------ roofline and peaks

def test_matmul_fp16_is_compute_bound_at_the_tensor_peak() -> None:
    g = matmul_graph(4096, 4096, 4096)
    e = estimate(g, "a100-sxm4-40gb", params=ideal_params())
    assert e.latency_ms == pytest.approx(2 * 4096**3 / 312e12 * 1e3, rel=1e-9)
    assert e.node_time_ms.shape == (1,) and e.tensor_core_fraction == 1.0


def test_elementwise_is_memory_bound_at_the_bandwidth() -> None:
    n = 1 << 20
    node = op(0, "add", "elementwise", [(n,)], [(n,), (n,)], dtype="float32")
    g = graph([node], [], inputs={"x": [0]}, outputs=[0], shape=(n,))
    e = estimate(g, "a100-sxm4-40gb", params=ideal_params())
    assert e.latency_ms == pytest.approx(12 * n / 1555e9 * 1e3, rel=1e-9)
    assert e.tensor_core_fraction == 0.0


def test_fp32_peaks_follow_pytorch_defaults() -> None:
    p = ideal_params()
    conv = conv_graph("float32")
    flops = conv.nodes[0].flops
    # cuDNN convolutions may use TF32 by default; matmuls may not
    assert estimate(conv, "a100-sxm4-40gb", params=p).latency_ms == pytest.approx(flops / 156e12 * 1e3)
    assert estimate(conv, "a100-sxm4-40gb", params=p, tf32_conv=False).latency_ms == pytest.approx(flops / 19.5e12 * 1e3)
    mm = matmul_graph(2048, 2048, 2048, dtype="float32")
    f = mm.nodes[0].flops
    assert estimate(mm, "a100-sxm4-40gb", params=p).latency_ms == pytest.approx(f / 19.5e12 * 1e3)
    assert estimate(mm, "a100-sxm4-40gb", params=p, tf32_matmul=True).latency_ms == pytest.approx(f / 156e12 * 1e3)
    # bf16 on tensor cores
    bf = matmul_graph(2048, 2048, 2048, dtype="bfloat16")
    assert estimate(bf, "a100-sxm4-40gb", params=p).latency_ms == pytest.approx(f / 312e12 * 1e3)


def test_depthwise_conv_runs_on_cuda_cores() -> None:
    g = conv_graph("float16", groups=64, c=64)
    e = estimate(g, "a100-sxm4-40gb", params=ideal_params())
    node = g.nodes[0]
    expected = max(node.flops / 78e12, (node.bytes_read + node.bytes_written) / 1555e9) * 1e3
    assert e.latency_ms == pytest.approx(expected) and e.tensor_core_fraction == 0.0


def test_wave_and_tile_quantisation() -> None:
    dev = toy_gpu(sms=10)
    base = ideal_params()
    # 11 tiles of 128x128 on 10 SMs: two waves, the second nearly empty -> efficiency 11/20
    g = matmul_graph(128 * 11, 128, 4096)
    t0 = estimate(g, dev, params=base).latency_ms
    t1 = estimate(g, dev, params=base.with_class("matmul", wave_exponent=1.0)).latency_ms
    assert t1 / t0 == pytest.approx(20 / 11)
    # m = 129 pads to 256: half the tile rows are empty
    g2 = matmul_graph(129, 128, 4096)
    u0 = estimate(g2, dev, params=base).latency_ms
    u1 = estimate(g2, dev, params=base.with_class("matmul", tile_exponent=1.0)).latency_ms
    assert u1 / u0 == pytest.approx(256 / 129)


def test_a_batched_activation_times_a_weight_matrix_is_one_gemm() -> None:
    """(197, 8, 768) @ (768, 2304) -- a linear layer on a (tokens, batch, features) activation -- is one
    1576 x 2304 GEMM for cuBLAS, not 197 GEMMs of 8 rows each padded to 128-row tiles; a true batched
    matmul (both operands 3-D) keeps its batch."""
    from dippm_nas.prior._nodes import contraction_tiles

    def mm(a: tuple[int, ...], b: tuple[int, ...]) -> OpNode:
        out = (*a[:-1], b[-1])
        m, n, k = a[-2], b[-1], a[-1]
        batch = math.prod(out) // (m * n)
        return op(0, "matmul", "matmul", [out], [a, b], flops=2 * math.prod(out) * k, macs=math.prod(out) * k,
                  attrs={"m": m, "n": n, "k": k, "batch": batch})

    tiles, eff = contraction_tiles(mm((197, 8, 768), (768, 2304)), 128, 128)
    assert tiles == math.ceil(1576 / 128) * 18 and eff == pytest.approx(1576 / (13 * 128))
    tiles, eff = contraction_tiles(mm((197, 8, 768), (197, 768, 2304)), 128, 128)
    assert tiles == 197 * 18 and eff == pytest.approx(8 / 128)


def test_short_reductions_lose_efficiency() -> None:
    base = ideal_params()
    g = matmul_graph(4096, 4096, 16)  # K = 16
    t0 = estimate(g, "a100-sxm4-40gb", params=base).latency_ms
    t1 = estimate(g, "a100-sxm4-40gb", params=base.with_class("matmul", k_half=16.0)).latency_ms
    # memory-bound before, compute-bound after: compute time doubles at K == k_half
    flops = g.nodes[0].flops
    assert t1 == pytest.approx(max(2 * flops / 312e12, (g.nodes[0].bytes_read + g.nodes[0].bytes_written) / 1555e9) * 1e3)
    assert t1 >= t0
    long = matmul_graph(4096, 4096, 4096)
    u0 = estimate(long, "a100-sxm4-40gb", params=base).latency_ms
    u1 = estimate(long, "a100-sxm4-40gb", params=base.with_class("matmul", k_half=16.0)).latency_ms
    assert u1 / u0 == pytest.approx((4096 + 16) / 4096)


def test_constant_nodes_cost_nothing_and_views_launch_no_kernel() -> None:
    n = 1 << 16
    nodes = [
        op(0, "permute_dims", "view", [(n,)], [(n,)], [True], const=True),
        op(1, "add", "elementwise", [(n,)], [(n,), (n,)], [False, True]),
        op(2, "reshape", "view", [(1, n)], [(n,)]),
        op(3, "nn.relu", "activation", [(1, n)], [(1, n)]),
    ]
    g = graph(nodes, [(0, 1), (1, 2), (2, 3)], inputs={"x": [1]}, outputs=[3], shape=(n,))
    p = ideal_params(host_dispatch_us=10.0, host_view_us=2.0)
    e = estimate(g, "a100-sxm4-40gb", params=p)
    assert e.node_time_ms[0] == 0.0 and e.node_host_ms[0] == 0.0
    assert e.node_time_ms[2] == 0.0 and e.node_host_ms[2] == pytest.approx(0.002)
    assert e.node_time_ms[1] > 0 and e.node_time_ms[3] > 0
    assert e.host_ms == pytest.approx(0.010 + 0.002 + 0.010)


# ------------------------------------------------------------------------------------ timelines

def _two_adds(nbytes_each: int) -> OperatorGraph:
    n = nbytes_each // 12  # float32 add reads 2 and writes 1 tensor of n elements
    nodes = [op(0, "add", "elementwise", [(n,)], [(n,), (n,)], [False, True]),
             op(1, "add", "elementwise", [(n,)], [(n,), (n,)], [False, True])]
    return graph(nodes, [(0, 1)], inputs={"x": [0]}, outputs=[1], shape=(n,))


def test_small_batches_are_launch_bound() -> None:
    dev = toy_gpu(bandwidth_gbps=1000.0)           # 1 µs per 1e6 bytes
    p = ideal_params(host_dispatch_us=10.0)
    e = estimate(_two_adds(1_200_000), dev, params=p)  # 1.2 µs per kernel
    # host: 10, 20; gpu: [10, 11.2], [20, 21.2]
    assert e.latency_ms == pytest.approx(0.0212)
    assert e.launch_bound and e.gpu_busy_ms == pytest.approx(0.0024) and e.gpu_idle_ms == pytest.approx(0.0188)


def test_large_kernels_hide_the_host() -> None:
    dev = toy_gpu(bandwidth_gbps=1000.0)
    p = ideal_params(host_dispatch_us=10.0)
    e = estimate(_two_adds(120_000_000), dev, params=p)  # 120 µs per kernel
    assert e.latency_ms == pytest.approx((10 + 120 + 120) / 1e3)
    assert not e.launch_bound


def test_cpu_device_adds_host_and_compute() -> None:
    cpu = toy_gpu(id="toy-cpu", kind="cpu", fp16_tflops=None, tf32_tensor_tflops=None, fp16_tensor_tflops=None,
                  bf16_tensor_tflops=None, host_dispatch_us=10.0)
    e = estimate(_two_adds(1_200_000), cpu, params=ideal_params())
    assert e.latency_ms == pytest.approx((10 + 1.2 + 10 + 1.2) / 1e3)


def test_device_scales_apply_per_device_and_default_to_gpus_only() -> None:
    from dippm_nas.prior import DeviceScale

    g = _two_adds(120_000_000)
    base = ideal_params()
    scaled = dataclasses.replace(base, device_scales={"*": DeviceScale(memory=0.5),
                                                       "a100-sxm4-40gb": DeviceScale(memory=0.25)})
    gpu = toy_gpu(bandwidth_gbps=1000.0)
    assert estimate(g, gpu, params=scaled).gpu_busy_ms == pytest.approx(2 * estimate(g, gpu, params=base).gpu_busy_ms)
    a100 = get_device("a100-sxm4-40gb")
    assert estimate(g, a100, params=scaled).gpu_busy_ms == pytest.approx(4 * estimate(g, a100, params=base).gpu_busy_ms)
    # a MIG slice uses its parent's entry
    s = a100.mig_slice("3g.20gb")
    assert estimate(g, s, params=scaled).gpu_busy_ms == pytest.approx(4 * estimate(g, s, params=base).gpu_busy_ms)
    cpu = toy_gpu(id="toy-cpu", kind="cpu", fp16_tflops=None, tf32_tensor_tflops=None, fp16_tensor_tflops=None,
                  bf16_tensor_tflops=None, host_dispatch_us=1.0)
    assert estimate(g, cpu, params=scaled).latency_ms == pytest.approx(estimate(g, cpu, params=base).latency_ms)


def test_an_unfitted_geforce_gpu_gets_the_geforce_default_entry() -> None:
    """``Device.geforce`` picks ``"*geforce"`` where the constants have it; a GeForce GPU with its own entry, a
    non-GeForce GPU and constants without the entry are priced as before."""
    from dippm_nas.prior import DEFAULT_SCALE_KEY, GEFORCE_SCALE_KEY, DeviceScale

    g = matmul_graph(4096, 4096, 4096)
    base = ideal_params()
    star = DeviceScale(compute=0.5)
    geforce = DeviceScale(compute=0.5, classes={"matmul": 2.0})
    scaled = dataclasses.replace(base, device_scales={DEFAULT_SCALE_KEY: star, GEFORCE_SCALE_KEY: geforce})
    t = lambda d, p: estimate(g, d, params=p).gpu_busy_ms  # noqa: E731
    gf, pro = toy_gpu(id="toy-geforce", geforce=True), toy_gpu(id="toy-pro")
    assert t(gf, scaled) == pytest.approx(t(gf, base))  # 0.5 x 2.0
    assert t(pro, scaled) == pytest.approx(2 * t(pro, base))  # the default entry
    only_star = dataclasses.replace(base, device_scales={DEFAULT_SCALE_KEY: star})
    assert t(gf, only_star) == pytest.approx(2 * t(gf, base))  # no GeForce entry: the default one
    own = dataclasses.replace(scaled, device_scales={**scaled.device_scales, "toy-geforce": DeviceScale(compute=0.25)})
    assert t(gf, own) == pytest.approx(4 * t(gf, base))  # its own entry first
    assert not scaled.device_fitted(GEFORCE_SCALE_KEY) and own.device_fitted("toy-geforce")
    assert scaled.scale_for("rtx-3080", geforce=True) is geforce and scaled.scale_for("rtx-3080") is star
    assert scaled.scale_for("toy-cpu", "cpu", geforce=True) == DeviceScale()


def test_default_scale_entries_are_the_geometric_means_of_the_fitted_gpus() -> None:
    from dippm_nas.errors import InvalidValueError
    from dippm_nas.prior import GEFORCE_SCALE_KEY, DeviceScale, default_scale_entries

    scales = {"a100-sxm4-40gb": DeviceScale(compute=0.25, memory=1.0), "rtx-3090": DeviceScale(compute=1.0, memory=0.5),
              "rtx-4090": DeviceScale(compute=4.0, memory=2.0)}
    e = default_scale_entries(scales, ["a100-sxm4-40gb", "rtx-3090", "rtx-4090"], note="x")
    assert e["*"].compute == pytest.approx(1.0) and e["*"].memory == pytest.approx(1.0) and "(x)" in e["*"].source
    gf = e[GEFORCE_SCALE_KEY]  # the default's compute and memory, GEMMs at the GeForce GPUs' rate (gmean 2.0)
    assert (gf.compute, gf.memory) == (e["*"].compute, e["*"].memory)
    assert gf.classes == pytest.approx({"matmul": 2.0})
    assert GEFORCE_SCALE_KEY not in default_scale_entries(scales, ["a100-sxm4-40gb"])
    for among in ([], ["rtx-5090"], ["*"]):
        with pytest.raises(InvalidValueError, match="fitted entry"):
            default_scale_entries(scales, among)


def test_the_shipped_geforce_entry_is_the_one_of_the_shipped_fitted_gpus() -> None:
    from dippm_nas.prior import DEFAULT_SCALE_KEY, GEFORCE_SCALE_KEY, default_scale_entries

    p = default_params()
    among = [d for d in ("a100-sxm4-40gb", "rtx-3090", "rtx-4090", "rtx-5090")]
    e = default_scale_entries(p.device_scales, among)
    for key in (DEFAULT_SCALE_KEY, GEFORCE_SCALE_KEY):
        s = p.device_scales[key]
        assert (s.compute, s.memory) == pytest.approx((e[key].compute, e[key].memory), rel=1e-9)
        assert s.classes == pytest.approx(e[key].classes, rel=1e-9)
    assert p.scale_for("rtx-3080", geforce=get_device("rtx-3080").geforce) is p.device_scales[GEFORCE_SCALE_KEY]
    assert p.scale_for("a40", geforce=get_device("a40").geforce) is p.device_scales[DEFAULT_SCALE_KEY]


def test_a_gpu_compute_scale_fitted_on_half_precision_leaves_fp32_cuda_core_kernels_alone() -> None:
    # GPU scales are fitted on fp16 whole models; FP32 CUDA-core kernels keep the op-level constants
    # (fitted on FP32 A100 operators): before, the A100's 0.42 made a large FP32 SGEMM 2.4x too slow
    from dippm_nas.prior import DeviceScale

    base = ideal_params()
    scaled = dataclasses.replace(base, device_scales={"a100-sxm4-40gb": DeviceScale(compute=0.5)})
    a100 = get_device("a100-sxm4-40gb")
    mm32, mm16 = matmul_graph(4096, 4096, 4096, dtype="float32"), matmul_graph(4096, 4096, 4096)
    t = lambda g, p, **kw: estimate(g, a100, params=p, **kw).gpu_busy_ms  # noqa: E731
    assert t(mm32, scaled) == pytest.approx(t(mm32, base))  # CUDA cores, fp32: op-level constants only
    assert t(mm16, scaled) == pytest.approx(2 * t(mm16, base))  # tensor cores, fp16: the fitted scale
    assert t(mm32, scaled, tf32_matmul=True) == pytest.approx(2 * t(mm32, base, tf32_matmul=True))  # TF32
    # a per-class multiplier (fitted on fp16 GEMMs) follows the same rule
    cls = dataclasses.replace(base, device_scales={"a100-sxm4-40gb": DeviceScale(compute=0.5, classes={"matmul": 4.0})})
    assert t(mm32, cls) == pytest.approx(t(mm32, base))
    assert t(mm16, cls) == pytest.approx(0.5 * t(mm16, base))
    # a CPU's scale was fitted on its own fp32 models: it applies
    cpu = toy_gpu(id="toy-cpu", kind="cpu", fp16_tflops=None, tf32_tensor_tflops=None, fp16_tensor_tflops=None,
                  bf16_tensor_tflops=None, host_dispatch_us=1.0)
    on_cpu = dataclasses.replace(base, device_scales={"toy-cpu": DeviceScale(compute=0.5)})
    assert estimate(mm32, cpu, params=on_cpu).gpu_busy_ms == pytest.approx(2 * estimate(mm32, cpu, params=base).gpu_busy_ms,
                                                                          rel=1e-4)  # + one 1 µs dispatch


def test_a_device_scale_can_scale_op_classes_and_replace_the_dispatch_time() -> None:
    from dippm_nas.errors import DippmNasError
    from dippm_nas.prior import DeviceScale

    cpu = toy_gpu(id="toy-cpu", kind="cpu", fp16_tflops=None, tf32_tensor_tflops=None, fp16_tensor_tflops=None,
                  bf16_tensor_tflops=None, host_dispatch_us=10.0)
    mm, adds = matmul_graph(512, 512, 512, dtype="float32"), _two_adds(1_200_000)
    base = ideal_params()
    scaled = dataclasses.replace(base, device_scales={"toy-cpu": DeviceScale(classes={"matmul": 0.5}, dispatch_us=3.0)})
    b, s = estimate(mm, cpu, params=base), estimate(mm, cpu, params=scaled)
    assert s.latency_ms - 3e-3 == pytest.approx(2 * (b.latency_ms - 10e-3))  # half the efficiency, new dispatch
    # classes not named keep their efficiency: the adds only see the new dispatch time
    assert estimate(adds, cpu, params=scaled).latency_ms == pytest.approx((3 + 1.2 + 3 + 1.2) / 1e3)
    # round trip through the calibration JSON, and the rules
    again = PriorParams.from_dict(json.loads(json.dumps(scaled.to_dict())))
    assert again.device_scales["toy-cpu"] == scaled.device_scales["toy-cpu"]
    with pytest.raises(DippmNasError, match="unknown op classes"):
        DeviceScale(classes={"gemm": 2.0})
    with pytest.raises(DippmNasError, match=r"classes\['conv'\] must be in \[0.05, 20\]"):
        DeviceScale(classes={"conv": 0.0})
    with pytest.raises(DippmNasError, match="dispatch_us must be None or in"):
        DeviceScale(dispatch_us=-1.0)


# ------------------------------------------------------------------------------------ energy

def test_energy_is_power_integrated_over_the_pass() -> None:
    dev = toy_gpu(bandwidth_gbps=1000.0, idle_power_w=50.0, board_power_w=250.0)
    # power from DRAM traffic only (the full range at full bandwidth), idle power while waiting
    dram_only = PowerTable(default=PowerParams(busy=0.0, tensor=1.0, fp=0.0, dram=1.0, wait=0.0))
    # memory-bound at full bandwidth: board power while kernels run, idle while waiting
    e = estimate(_two_adds(1_200_000), dev, params=ideal_params(host_dispatch_us=10.0), power=dram_only)
    busy_s, idle_s = 2.4e-6, 18.8e-6
    assert e.energy_j == pytest.approx(250 * busy_s + 50 * idle_s)
    # half the bandwidth used: half the dynamic power
    half = ideal_params(host_dispatch_us=10.0).with_class("elementwise", eta_memory=0.5)
    e2 = estimate(_two_adds(120_000_000), dev, params=half, power=dram_only)
    t_kernel = 240e-6
    assert e2.energy_j == pytest.approx(150 * 2 * t_kernel + 50 * 10e-6)
    assert estimate(_two_adds(1_200_000), toy_gpu(board_power_w=None, idle_power_w=None)).energy_j is None


# ------------------------------------------------------------------------------------ memory

def test_allocator_rounds_to_512_bytes() -> None:
    assert [round_block(b) for b in (0, 1, 512, 513, 1 << 20)] == [0, 512, 512, 1024, 1 << 20]


def test_liveness_chain_peak_by_hand() -> None:
    # x 1 MiB -> a 2 MiB -> b 3 MiB -> c 1 MiB (float32 elements)
    q = MIB // 4
    g = relu_chain([q, 2 * q, 3 * q, q])
    m = activation_liveness(g)
    # node 0: x + a = 3; node 1: a + b = 5 (x freed after node 0); node 2: b + c = 4
    assert list(m.live_bytes / MIB) == [3, 5, 4]
    assert m.peak_allocated_bytes == 5 * MIB and m.peak_node == 1


def test_liveness_residual_keeps_the_input_alive() -> None:
    q = MIB // 4
    nodes = [op(0, "nn.relu", "activation", [(q,)], [(q,)]),
             op(1, "nn.relu", "activation", [(q,)], [(q,)]),
             op(2, "add", "elementwise", [(q,)], [(q,), (q,)])]
    g = graph(nodes, [(0, 1), (1, 2)], inputs={"x": [0, 2]}, outputs=[2], shape=(q,))
    m = activation_liveness(g)
    # x lives until node 2: node 0: x+a = 2; node 1: x+a+b = 3; node 2: x+b+c = 3
    assert list(m.live_bytes / MIB) == [2, 3, 3]


def test_liveness_views_alias_and_outputs_live_to_the_end() -> None:
    q = MIB // 4
    nodes = [op(0, "nn.relu", "activation", [(q,)], [(q,)]),          # a (model output)
             op(1, "reshape", "view", [(1, q)], [(q,)]),               # view of a
             op(2, "nn.relu", "activation", [(1, q)], [(1, q)]),       # b
             op(3, "nn.relu", "activation", [(1, q)], [(1, q)])]       # c (output)
    g = graph(nodes, [(0, 1), (1, 2), (2, 3)], inputs={"x": [0]}, outputs=[0, 3], shape=(q,))
    m = activation_liveness(g)
    # node 0: x + a = 2; view: no new memory = 1 (a); node 2: a + b = 2; node 3: a (output) + b + c = 3
    assert list(m.live_bytes / MIB) == [2, 1, 2, 3]
    # without a being an output it would die after node 2 (its view's last consumer)
    g2 = graph(nodes, [(0, 1), (1, 2), (2, 3)], inputs={"x": [0]}, outputs=[3], shape=(q,))
    assert list(activation_liveness(g2).live_bytes / MIB) == [2, 1, 2, 2]


def test_memory_parts_add_up_and_workspace_only_with_cublas() -> None:
    dev = toy_gpu(runtime_baseline_mib=500.0, cublas_workspace_mib=8.125)
    conv = estimate(conv_graph("float16"), dev)
    assert conv.workspace_mib == 0.0
    mm = estimate(matmul_graph(256, 256, 256), dev)
    assert mm.workspace_mib == pytest.approx(8.125)
    for e in (conv, mm):
        parts = (e.baseline_mib + e.weights_mib + e.input_mib + e.activations_peak_mib + e.workspace_mib
                 + e.allocator_overhead_mib)
        assert e.memory_mib == pytest.approx(parts) and e.baseline_mib == 500.0 and e.allocator_overhead_mib >= 0
    # 8.125 MiB workspace sits in a 20 MiB segment; the weights (128 KiB), the input and the activations
    # (small blocks) share one 2 MiB segment of the small pool
    small = mm.weights_mib + mm.input_mib + mm.activations_peak_mib
    assert small < 2 and mm.allocator_overhead_mib == pytest.approx((20 - 8.125) + (2 - small))


# ------------------------------------------------------------------------------------ entry checks

def test_bad_input_errors() -> None:
    g = matmul_graph(64, 64, 64)
    with pytest.raises(DeviceError, match="choices"):
        estimate(g, "gtx-1080")
    cpu_only = toy_gpu(id="fp32-only", fp16_tflops=None, fp16_tensor_tflops=None, bf16_tensor_tflops=None)
    with pytest.raises(UnsupportedDtypeError, match="float16"):
        estimate(g, cpu_only)
    with pytest.raises(GraphValidationError):
        estimate("not a graph", "a100-sxm4-40gb")  # type: ignore[arg-type]


def test_predict_gives_an_analytic_prediction_with_mig_advice() -> None:
    g = conv_graph("float16")
    p = predict(g, "a100-sxm4-40gb")
    assert isinstance(p, Prediction)
    assert (p.latency_source, p.energy_source, p.memory_source) == ("analytic",) * 3
    assert p.device == "a100-sxm4-40gb" and p.batch_size == 8 and p.dtype == "float16"
    assert p.mig is not None and p.mig.smallest_fit == "1g.5gb"
    assert p.details["activations_peak_mib"] > 0
    json.dumps(p.to_dict())
    assert predict(g, "rtx-4090").mig is None
    with pytest.raises(DeviceError, match="power"):
        predict(g, toy_gpu(board_power_w=None, idle_power_w=None))


def test_shipped_constants_load_and_round_trip(tmp_path) -> None:
    p = default_params()
    assert set(p.op_classes) == set(PARAM_CLASSES)
    path = tmp_path / "c.json"
    p.save(path)
    assert PriorParams.load(path) == p
    bad = p.to_dict()
    bad["op_classes"]["conv"]["eta_compute"] = -1
    with pytest.raises(Exception, match="eta_compute"):
        PriorParams.from_dict(bad)


def test_shipped_constants_are_fitted_and_name_their_data() -> None:
    p = default_params()
    if p.source == "uncalibrated":
        pytest.skip("no fitted constants shipped yet (scripts/fit/calibrate_prior.py writes them)")
    assert "NeuSight" in p.source and p.command.startswith("python scripts/fit/calibrate_prior.py")
    assert p.metrics


def test_per_node_times_are_a_feature_vector() -> None:
    g = relu_chain([1000, 1000, 1000])
    e = estimate(g, "rtx-3090")
    assert isinstance(e.node_time_ms, np.ndarray) and e.node_time_ms.shape == (g.num_nodes,)
    assert np.all(np.isfinite(e.node_time_ms)) and np.all(e.node_time_ms >= 0)
    assert e.latency_ms >= e.node_time_ms.sum() and e.to_dict()["node_time_ms"] == list(e.node_time_ms)


def test_mig_slice_is_slower_than_the_full_gpu() -> None:
    g = conv_graph("float16")
    full = estimate(g, get_device("a100-sxm4-40gb")).latency_ms
    small = estimate(g, get_device("a100-sxm4-40gb").mig_slice("1g.5gb")).latency_ms
    assert small > full


# ------------------------------------------------------------------------------------ hard activations

def _hard_graph(n: int, *, swish: bool, scalar: bool = True) -> OperatorGraph:
    """The Relax frontend's hardsigmoid(x) = clip(x + 3, 0, 6) / 6 (and hardswish = x * that) on a graph
    input of n float32 elements; ``scalar=False`` divides by a full tensor instead (not the pattern)."""
    k = () if scalar else (n,)
    nodes = [op(0, "add", "elementwise", [(n,)], [(n,), ()], [False, True]),
             op(1, "clip", "elementwise", [(n,)], [(n,)]),
             op(2, "divide", "elementwise", [(n,)], [(n,), k], [False, True])]
    edges = [(0, 1), (1, 2)]
    inputs = {"x": [0]}
    if swish:
        nodes.append(op(3, "multiply", "elementwise", [(n,)], [(n,), (n,)]))
        edges.append((2, 3))
        inputs = {"x": [0, 3]}
    return graph(nodes, edges, inputs=inputs, outputs=[len(nodes) - 1], shape=(n,))


@pytest.mark.parametrize("swish", [True, False])
def test_a_decomposed_hard_activation_is_one_kernel_when_the_option_is_on(swish: bool) -> None:
    n = 1 << 20
    g = _hard_graph(n, swish=swish)
    one_pass = estimate(relu_chain([n, n]), "a100-sxm4-40gb", params=ideal_params(host_dispatch_us=10.0))
    on = estimate(g, "a100-sxm4-40gb", params=ideal_params(host_dispatch_us=10.0, fuse_hard_activations=True))
    off = estimate(g, "a100-sxm4-40gb", params=ideal_params(host_dispatch_us=10.0, fuse_hard_activations=False))
    # PyTorch runs F.hardswish / F.hardsigmoid as one kernel: read x once, write once, one dispatch
    assert on.latency_ms == pytest.approx(one_pass.latency_ms, rel=1e-6)   # (+ the 4-byte scalar)
    assert on.host_ms == pytest.approx(0.010)
    inner = [0, 1, 2] if swish else [0, 1]
    assert all(on.node_time_ms[i] == 0.0 and on.node_host_ms[i] == 0.0 for i in inner)
    # with the option off: four / three dispatches and passes over the tensor (the multiply reads two)
    assert off.host_ms == pytest.approx(0.010 * len(g.nodes))
    assert sum(off.node_time_ms) > (4.4 if swish else 2.9) * sum(one_pass.node_time_ms)


def test_the_hard_activation_pattern_needs_scalar_constants() -> None:
    n = 1 << 16
    g = _hard_graph(n, swish=True, scalar=False)
    on = estimate(g, "a100-sxm4-40gb", params=ideal_params(fuse_hard_activations=True))
    off = estimate(g, "a100-sxm4-40gb", params=ideal_params(fuse_hard_activations=False))
    assert on.latency_ms == off.latency_ms and min(on.node_time_ms) > 0


def test_fuse_hard_activations_round_trips_and_defaults_off_for_older_files() -> None:
    assert PriorParams.uncalibrated().fuse_hard_activations is True     # new fits start from it
    p = dataclasses.replace(default_params(), fuse_hard_activations=True)
    d = p.to_dict()
    assert d["global"]["fuse_hard_activations"] is True and PriorParams.from_dict(d) == p
    del d["global"]["fuse_hard_activations"]       # a file written before the option existed
    assert PriorParams.from_dict(d).fuse_hard_activations is False
    d["global"]["fuse_hard_activations"] = "yes"
    with pytest.raises(Exception, match="fuse_hard_activations = 'yes': expected true or false"):
        PriorParams.from_dict(d)
    with pytest.raises(Exception, match="fuse_hard_activations must be true or false"):  # the dataclass's own check
        PriorParams.from_dict(d, trusted=True)


def test_host_checkpoints_keep_the_prior_they_were_trained_with() -> None:
    """The Xeon checkpoint's constants file lacks the option's key (off); the AMD one's prior was fitted
    from the package constants, which have it on (its operator table prices the chain as one ``hard``
    record either way)."""
    from importlib import resources

    for name, fused in (("host-cpu.intel-xeon.json", False), ("host-cpu.amd-epyc.json", True)):
        meta = json.loads((resources.files("dippm_nas.predictor") / "checkpoints" / name).read_text())
        assert ("fuse_hard_activations" in meta["prior_params"]["global"]) is fused
        assert PriorParams.from_dict(meta["prior_params"]).fuse_hard_activations is fused
