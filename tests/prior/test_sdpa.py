"""SDPA kernel choice and pricing of half-precision attention in the analytic prior (no GPU, no ../shared)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dippm_nas.capture import capture
from dippm_nas.devices import get_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prior import (MMA_SYNC_SHARE, SDPA_BACKENDS, PriorParams, default_params, graph_facts, node_costs,
                             sdpa_backend_codes)
from dippm_nas.spec import InputSpec


class _Attn(nn.Module):
    def __init__(self, causal: bool, head_dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.causal, self.heads, self.head_dim = causal, heads, head_dim
        self.qkv = nn.Linear(heads * head_dim, 3 * heads * head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, s, -1)


def _graph(causal: bool, seq: int = 512, head_dim: int = 64):
    return capture(_Attn(causal, head_dim).eval(), InputSpec(shape=(seq, 4 * head_dim), batch_size=2), cache=False)


def _attention_us(graph, device: str, params: PriorParams, autocast: str | None = "float16") -> float:
    nc = node_costs(graph, get_device(device), params, autocast=autocast)
    att = graph_facts(graph).attention_shape().attention
    assert att.sum() == 1
    return float(nc.gpu_us[att].sum())


def test_backend_follows_pytorch_2_dispatch_by_architecture_dtype_and_head_dim() -> None:
    g = _graph(causal=True)
    shape = graph_facts(g).attention_shape()
    i = int(np.flatnonzero(shape.attention)[0])
    n = len(g.nodes)

    def backend(arch: str, code: int) -> str:
        return SDPA_BACKENDS[int(sdpa_backend_codes(shape, arch, np.full(n, code))[i])]

    assert backend("ampere", 1) == backend("hopper", 2) == "flash"
    assert backend("volta", 1) == backend("turing", 1) == backend("pascal", 1) == "efficient"
    assert backend("ampere", 0) == "efficient"  # flash takes no float32
    assert backend("ampere", 3) == "math"       # nor does memory-efficient take float64
    assert shape.head_dim[i] == 64 and 0.5 < shape.work_fraction[i] < 0.7  # causal: about half the scores
    odd = graph_facts(_graph(causal=False, head_dim=60)).attention_shape()
    j = int(np.flatnonzero(odd.attention)[0])
    assert odd.work_fraction[j] == 1.0
    assert SDPA_BACKENDS[int(sdpa_backend_codes(odd, "ampere", np.full(len(odd.head_dim), 1))[j])] == "math"


def test_causal_fused_attention_costs_less_than_the_full_score_matrix_and_eta_scales_it() -> None:
    p = dataclasses.replace(default_params(), sdpa_eta_flash=0.5, sdpa_eta_efficient=0.5)
    causal, full = _graph(causal=True, seq=2048), _graph(causal=False, seq=2048)
    for dev in ("a40", "v100-sxm2-32gb"):
        t_c, t_f = _attention_us(causal, dev, p), _attention_us(full, dev, p)
        assert 0.45 < t_c / t_f < 0.7, (dev, t_c, t_f)
    slow = dataclasses.replace(p, sdpa_eta_flash=0.25)
    assert _attention_us(full, "a40", slow) > 1.5 * _attention_us(full, "a40", p)
    # the memory-efficient efficiency does not touch an Ampere fp16 node
    assert _attention_us(full, "a40", dataclasses.replace(p, sdpa_eta_efficient=0.1)) == _attention_us(full, "a40", p)


def test_flash_on_hopper_reaches_the_mma_sync_share_of_its_peak() -> None:
    p = dataclasses.replace(default_params(), sdpa_eta_flash=0.5, sdpa_eta_efficient=0.5)
    g = _graph(causal=False, seq=4096)
    h100, h200 = get_device("h100-sxm5-80gb"), get_device("h200-sxm-141gb")
    assert h100.architecture == "hopper" and MMA_SYNC_SHARE < 1
    nc = node_costs(g, h100, p, autocast="bfloat16")
    att = graph_facts(g).attention_shape().attention
    eff = g.nodes[int(np.flatnonzero(att)[0])].flops / (nc.compute_us[att][0] * 1e-6) / 1e12
    # achieved TFLOP/s at most the flash efficiency x the mma.sync share of the dense peak
    assert eff <= 0.5 * MMA_SYNC_SHARE * h100.bf16_tensor_tflops * 1.0001
    assert h200.bf16_tensor_tflops == h100.bf16_tensor_tflops


def test_without_the_keys_attention_is_priced_as_before() -> None:
    old = dataclasses.replace(default_params(), sdpa_eta_flash=None, sdpa_eta_efficient=None)
    causal, full = _graph(causal=True, seq=2048), _graph(causal=False, seq=2048)
    # the whole score matrix either way (no causal skip), at the class constants
    assert _attention_us(causal, "a40", old) == pytest.approx(_attention_us(full, "a40", old))
    new = dataclasses.replace(old, sdpa_eta_flash=0.5, sdpa_eta_efficient=0.5)
    assert _attention_us(causal, "a40", new) < 0.7 * _attention_us(full, "a40", new)
    d = old.to_dict()
    assert d["global"]["sdpa_eta_flash"] is None
    assert PriorParams.from_dict(d).sdpa_eta_flash is None


def test_math_path_moves_the_score_matrix_in_float32_under_autocast() -> None:
    p = dataclasses.replace(default_params(), sdpa_eta_flash=0.5, sdpa_eta_efficient=0.5)
    g = _graph(causal=False, seq=1024, head_dim=60)  # head dim not a multiple of 8: the math path in half
    att = graph_facts(g).attention_shape().attention
    dev = get_device("a40")
    auto = node_costs(g, dev, p, autocast="float16")
    scores = 2 * 4 * 1024 * 1024
    assert auto.memory_us[att][0] * 1e-6 * dev.bandwidth_gbps * 1e9 > 12 * scores  # >= 24 B/score at ~eta
    assert auto.kernels[att][0] >= 6


def test_half_gemm_without_tensor_cores_runs_at_the_fp32_rate() -> None:
    p100 = get_device("p100-pcie-16gb")
    assert p100.fp16_tensor_tflops is None and p100.fp16_tflops == pytest.approx(2 * p100.fp32_tflops, rel=0.01)
    g = _graph(causal=False)
    nc = node_costs(g, p100, default_params(), autocast="float16")
    mm = np.array([c == "matmul" for c in graph_facts(g).classes]) & (nc.compute_us > 0)
    flops = np.array([n.flops for n in g.nodes])[mm]
    achieved = flops / (nc.compute_us[mm] * 1e-6) / 1e12
    assert (achieved <= p100.fp32_tflops * 1.0001).all()


@pytest.mark.parametrize(("flash", "eff"), [(0.0, 0.5), (0.5, None), (5.0, 0.5), (float("nan"), 0.5)])
def test_bad_sdpa_efficiencies_are_refused(flash, eff) -> None:
    with pytest.raises(InvalidValueError, match="sdpa_eta"):
        dataclasses.replace(default_params(), sdpa_eta_flash=flash, sdpa_eta_efficient=eff)


def test_stacked_estimates_price_attention_as_single_ones() -> None:
    from dippm_nas.prior import estimate, estimate_many

    graphs = [_graph(causal=True, seq=1024), _graph(causal=False, seq=512)]
    for dev in ("a40", "v100-sxm2-32gb", "p100-pcie-16gb"):
        one = [estimate(g, dev, autocast="float16").latency_ms for g in graphs]
        many = [e.latency_ms for e in estimate_many(graphs, dev, autocast="float16")]
        assert many == pytest.approx(one, rel=1e-12)


class _WindowAttn(nn.Module):
    """Twins-SVT-like window attention: SDPA on 5-D (B, windows, heads, L, D) tensors, PyTorch's math path."""

    def __init__(self, heads: int = 4, head_dim: int = 32) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = nn.Linear(heads * head_dim, 3 * heads * head_dim)
        self.proj = nn.Linear(heads * head_dim, heads * head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, windows, L, C)
        b, w, s, c = x.shape
        q, k, v = self.qkv(x).reshape(b, w, s, 3, self.heads, self.head_dim).permute(3, 0, 1, 4, 2, 5).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(b, w, s, c))


def _window_graph(dtype: str = "float32"):
    return capture(_WindowAttn().eval(), InputSpec(shape=(64, 49, 128), batch_size=8, dtype=dtype), cache=False)


def test_math_path_math_float32_follows_the_torch_version() -> None:
    from dippm_nas import Deployment
    from dippm_nas.prior import estimate, estimate_many, math_path_float32

    assert math_path_float32("2.4.1") is False and math_path_float32("2.5.0") is True
    assert math_path_float32("2.13.0+cu126") is True and math_path_float32(None) is None
    assert math_path_float32("2") is None and math_path_float32("1.13.1") is False
    g = _window_graph()
    marked = [i for i, nd in enumerate(g.nodes) if nd.attrs.get("sdpa_math")]
    assert len(marked) == 6
    for dev in ("rtx-4090", "rtx-3090"):
        def ms(version: str | None, autocast: str | None = "float16", graph=g) -> float:
            dep = Deployment(framework="torch-2", autocast=autocast, input_copy="none",
                             versions={"torch": version} if version else None)
            return estimate(graph, dev, deployment=dep).latency_ms

        old, new, unknown = ms("2.4.0"), ms("2.9.1"), ms(None)
        # 2.9: the score matrix and both matmuls in float32 (CUDA cores), casts of q, k, v up and of the output
        # and the weights down; 2.4: all in float16 (no float32 softmax, unlike autocast's plan for other nodes)
        assert new > unknown > old
        # the 2.9 kernels: float32 on the math path's matmuls and softmax, five casts more than 2.4's
        nc = {v: node_costs(g, get_device(dev), default_params(), autocast="float16", math_float32=v)
              for v in (None, False, True)}
        # (q, k, v up; output and weights down) and three of the safe softmax (eq, all, where)
        assert nc[True].kernels.sum() - nc[False].kernels.sum() == pytest.approx(8.0)
        assert not nc[True].tensor_core[[i for i in marked if g.nodes[i].op == "matmul"]].any()
        assert nc[False].tensor_core[[i for i in marked if g.nodes[i].op == "matmul"]].all()
        # a model cast to float16 (no autocast): the same version rule
        h = _window_graph("float16")
        assert ms("2.9.1", None, h) > ms("2.4.0", None, h) == pytest.approx(ms(None, None, h))
        # a float32 model without autocast runs its math path in float32 in every version; from 2.5 with the safe
        # softmax's three kernels more
        assert ms("2.9.1", None) > ms("2.4.0", None) == pytest.approx(ms(None, None))
        f32 = {v: node_costs(g, get_device(dev), default_params(), math_float32=v) for v in (False, True)}
        assert f32[True].kernels.sum() - f32[False].kernels.sum() == pytest.approx(3.0)
        # a graph captured before the marking (no attrs["sdpa_math"]) is priced as before in every version
        d = g.to_dict()
        for nd in d["nodes"]:
            nd["attrs"].pop("sdpa_math", None)
        unmarked = OperatorGraph.from_dict(d)
        assert ms("2.9.1", graph=unmarked) == pytest.approx(ms("2.4.0", graph=unmarked)) == pytest.approx(unknown)
        # stacked estimates price it as single ones
        dep = Deployment(framework="torch-2", autocast="float16", versions={"torch": "2.9.1"})
        many = [e.latency_ms for e in estimate_many([g, _graph(causal=False)], dev, deployment=dep)]
        assert many[0] == pytest.approx(estimate(g, dev, deployment=dep).latency_ms, rel=1e-12)


def test_undescribed_deployment_prices_the_math_path_in_the_running_torch_version() -> None:
    from dippm_nas import Deployment
    from dippm_nas.deployment import running_torch
    from dippm_nas.prior import estimate

    g = _window_graph("float16")
    proc = running_torch()
    assert proc is not None and Deployment().resolve().torch_version == proc.version
    described = Deployment(framework="torch-2", versions={"torch": proc.version}, tf32_matmul=proc.tf32_matmul,
                           tf32_conv=proc.tf32_conv)
    assert estimate(g, "rtx-4090", deployment=Deployment()).gpu_busy_ms == pytest.approx(
        estimate(g, "rtx-4090", deployment=described).gpu_busy_ms)
    # a framework named without a version leaves the math path as the graph holds it
    assert Deployment(framework="torch-2").resolve().torch_version is None
