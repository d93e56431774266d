"""SDPA on 3-D query, key and value by PyTorch version (``dippm_nas/prior/_sdpa_rank3.py``): the math path up to
2.13, the fused kernels (unsqueezed to 4-D) from 2.14, for latency and memory alike; inputs of rank 5 on the math
path in every version; a graph captured without the rank, or an unknown version, priced as the math path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812

from _models import WindowAttention  # noqa: E402
from dippm_nas import InputSpec, capture  # noqa: E402
from dippm_nas.deployment import Deployment  # noqa: E402
from dippm_nas.graph import SDPA_MATH_ATTR, SDPA_RANK_ATTR, OperatorGraph  # noqa: E402
from dippm_nas.prior import (DeploymentSettings, SDPA_RANK3_FUSED_SINCE, activation_liveness, estimate,  # noqa: E402
                             estimate_many, fused_rank3_graph, sdpa_rank3_fused)

B, N, C, HEADS, HD = 2, 64, 64, 2, 32
SPEC = InputSpec(shape=(N, C), batch_size=B)
GPU = "a100-sxm4-40gb"


class _FoldedHeads(nn.Module):
    """SAM-ViT's attention: heads folded into the batch, SDPA on 3-D ``(B * heads, tokens, head_dim)``;
    ``four``: the same call on those tensors unsqueezed to 4-D (what PyTorch 2.14 runs); ``mask``: an additive
    mask computed from the input (a relative-position bias)."""

    def __init__(self, four: bool = False, mask: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C)
        self.four, self.mask = four, mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, HD).permute(2, 0, 3, 1, 4).reshape(3, b * HEADS, n, HD).unbind(0)
        m = (x.mean(-1)[:, None, :] * x.amax(-1)[:, :, None]).repeat_interleave(HEADS, 0) if self.mask else None
        if self.four:
            q, k, v = q[None], k[None], v[None]
            m = m[None] if m is not None else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).reshape(b, HEADS, n, HD).transpose(1, 2).reshape(
            b, n, c)


@pytest.fixture(scope="module")
def graphs() -> dict[str, OperatorGraph]:
    return {"3d": capture(_FoldedHeads(), SPEC), "3d_mask": capture(_FoldedHeads(mask=True), SPEC),
            "4d": capture(_FoldedHeads(four=True), SPEC), "4d_mask": capture(_FoldedHeads(four=True, mask=True), SPEC),
            "5d": capture(WindowAttention(C, HEADS), InputSpec(shape=(4, N, C), batch_size=B))}


def _peak(g: OperatorGraph, **kw: object) -> int:
    return activation_liveness(g, retention=True, include_inputs=False, **kw).peak_allocated_bytes


def _without_rank(g: OperatorGraph) -> OperatorGraph:
    d = g.to_dict()
    for nd in d["nodes"]:
        nd["attrs"].pop(SDPA_RANK_ATTR, None)
    return OperatorGraph.from_dict(d)


def test_the_version_rule() -> None:
    assert SDPA_RANK3_FUSED_SINCE == (2, 14)
    assert sdpa_rank3_fused("2.13.0+cpu") is False and sdpa_rank3_fused("2.14.1+cu130") is True
    assert sdpa_rank3_fused("2.9.1") is False and sdpa_rank3_fused("3.0.0") is True
    assert sdpa_rank3_fused(None) is None and sdpa_rank3_fused("nightly") is None


def test_the_capture_records_the_rank(graphs) -> None:  # noqa: ANN001
    for key, rank in (("3d", 3), ("3d_mask", 3), ("5d", 5)):
        marked = [nd for nd in graphs[key].nodes if nd.attrs.get(SDPA_MATH_ATTR)]
        assert marked and {nd.attrs.get(SDPA_RANK_ATTR) for nd in marked} == {rank}
    assert not any(nd.attrs.get(SDPA_RANK_ATTR) for nd in graphs["4d"].nodes)
    # the rank survives the graph's JSON form
    again = OperatorGraph.from_dict(graphs["3d"].to_dict())
    assert [nd.attrs.get(SDPA_RANK_ATTR) for nd in again.nodes] == [nd.attrs.get(SDPA_RANK_ATTR)
                                                                   for nd in graphs["3d"].nodes]


@pytest.mark.parametrize("mask", [False, True])
def test_from_2_14_a_3d_call_is_priced_as_the_same_call_on_4d_inputs(graphs, mask: bool) -> None:  # noqa: ANN001
    g3, g4 = graphs["3d_mask" if mask else "3d"], graphs["4d_mask" if mask else "4d"]
    fused = fused_rank3_graph(g3)
    assert fused.num_nodes == g3.num_nodes and fused.outputs == g3.outputs
    att = [nd for nd in fused.nodes if nd.op_class == "attention"]
    assert len(att) == 1 and att[0].op == ("nn.attention_bias" if mask else "nn.attention")
    assert not any(nd.attrs.get(SDPA_MATH_ATTR) for nd in fused.nodes)
    att4 = next(nd for nd in g4.nodes if nd.op_class == "attention")
    assert att[0].input_shapes == att4.input_shapes and att[0].flops == att4.flops
    for ac in (None, "float16"):
        assert _peak(g3, autocast=ac, torch_version="2.14.0") == _peak(g4, autocast=ac, torch_version="2.14.0")
        # below the cut the math path: its score matrix and the safe softmax's buffers
        assert _peak(g3, autocast=ac, torch_version="2.13.0") > _peak(g3, autocast=ac, torch_version="2.14.0")
    dep = Deployment(autocast="float16", versions={"torch": "2.14.1"})
    e3, e4 = estimate(g3, GPU, deployment=dep), estimate(g4, GPU, deployment=dep)
    i3 = next(nd.index for nd in fused.nodes if nd.op_class == "attention")
    i4 = att4.index
    assert e3.node_time_ms[i3] == pytest.approx(e4.node_time_ms[i4], rel=1e-12)
    assert e3.memory_details["sdpa_rank3_fused"] == 1.0 and "sdpa_math_version_known" not in e3.memory_details


def test_the_estimate_follows_the_deployment_version(graphs) -> None:  # noqa: ANN001
    g = graphs["3d_mask"]

    def est(version: str | None) -> object:
        if version is None:
            return estimate(g, GPU, deployment=DeploymentSettings(autocast="float16"))
        return estimate(g, GPU, deployment=Deployment(autocast="float16", versions={"torch": version}))

    old, new, unknown = est("2.9.1"), est("2.14.1"), est(None)
    assert new.activations_peak_mib < old.activations_peak_mib and new.latency_ms < old.latency_ms
    assert old.memory_details["sdpa_rank3_fused"] == 0.0 and old.memory_details["sdpa_math_float32"] == 1.0
    # an unknown version: the math path at the graph's dtypes, labelled as such
    assert unknown.memory_details["sdpa_math_version_known"] == 0.0 and "sdpa_rank3_fused" not in unknown.memory_details
    assert unknown.activations_peak_mib == pytest.approx(_peak(g, autocast="float16") / 2**20)
    # stacked estimates as single ones, and the node arrays stay the graph's
    many = estimate_many([g, graphs["5d"]], GPU, deployment=Deployment(autocast="float16", versions={"torch": "2.14.1"}))
    assert many[0].latency_ms == pytest.approx(new.latency_ms, rel=1e-12)
    assert many[0].activations_peak_mib == pytest.approx(new.activations_peak_mib, rel=1e-12)
    assert len(many[0].node_time_ms) == g.num_nodes


def test_rank_5_and_graphs_without_the_rank_stay_on_the_math_path(graphs) -> None:  # noqa: ANN001
    g5 = graphs["5d"]
    assert fused_rank3_graph(g5) is g5
    for ac in (None, "float16"):
        assert _peak(g5, autocast=ac, torch_version="2.14.0") == _peak(g5, autocast=ac, torch_version="2.13.0")
    old = _without_rank(graphs["3d"])
    assert fused_rank3_graph(old) is old
    for ac in (None, "float16"):
        assert _peak(old, autocast=ac, torch_version="2.14.0") == _peak(graphs["3d"], autocast=ac,
                                                                        torch_version="2.13.0")
    dep = {v: Deployment(autocast="float16", versions={"torch": v}) for v in ("2.13.0", "2.14.0")}
    assert estimate(old, GPU, deployment=dep["2.14.0"]).latency_ms == pytest.approx(
        estimate(old, GPU, deployment=dep["2.13.0"]).latency_ms, rel=1e-12)
    assert "sdpa_rank3_fused" not in estimate(old, GPU, deployment=dep["2.14.0"]).memory_details


@pytest.mark.skipif(sdpa_rank3_fused(torch.__version__) is not True, reason="the tracker's PyTorch runs 3-D SDPA on "
                    "the math path (before 2.14)")
def test_the_tracker_runs_3d_as_4d_from_2_14() -> None:
    """The eager tracker on this PyTorch (>= 2.14): the 3-D call holds what the 4-D call holds (no score matrix)."""
    from dippm_nas.measure import reference_activation_peak

    for dev, ac in (("cpu", None), ("cuda", "float16")):
        for mask in (False, True):
            three = reference_activation_peak(_FoldedHeads(mask=mask), SPEC, device=dev, autocast=ac)
            four = reference_activation_peak(_FoldedHeads(four=True, mask=mask), SPEC, device=dev, autocast=ac)
            assert three.peak_block_bytes == four.peak_block_bytes


class _BoolMask(_FoldedHeads):
    """3-D SDPA with a boolean mask, made additive by SDPA's entry on every path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, HD).permute(2, 0, 3, 1, 4).reshape(3, b * HEADS, n, HD).unbind(0)
        m = (x.mean(-1) > 0)[:, None, :].repeat_interleave(HEADS, 0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).reshape(b, HEADS, n, HD).transpose(1, 2).reshape(
            b, n, c)


def test_a_boolean_mask_keeps_its_additive_copy_as_a_kernel() -> None:
    g = capture(_BoolMask(), SPEC)
    fused = fused_rank3_graph(g)
    where = [nd for nd in fused.nodes if nd.op == "where" and nd.attrs.get(SDPA_RANK_ATTR) == 3]
    att = next(nd for nd in fused.nodes if nd.op_class == "attention")
    assert len(where) == 1 and not where[0].is_constant and not where[0].attrs.get(SDPA_MATH_ATTR)
    assert att.op == "nn.attention_bias" and (where[0].index, att.index) in set(fused.edges)
    assert _peak(g, torch_version="2.14.0") < _peak(g, torch_version="2.13.0")
