"""Features: op-encoder registry, unknown ops, coarsening totals, feature tensor shapes."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from dippm_nas.errors import DippmNasError, UnsupportedOpError
from dippm_nas.features import (
    FEATURE_SCHEMA_VERSION,
    TOKENS,
    coarsen,
    device_dim,
    encode_op,
    featurize,
    get_op_encoder,
    node_dim,
    register_op_encoder,
    reset_unknown_op_counts,
    static_dim,
    unknown_op_counts,
    unregister_op_encoder,
)
from dippm_nas.graph import OperatorGraph, OpNode
from dippm_nas.spec import InputSpec

B, C, H = 2, 8, 16


def _node(i: int, op: str, cls: str, out: tuple, ins: tuple, par: tuple, flops: int = 0, macs: int = 0,
          attrs: dict | None = None, const: bool = False, known: bool = True, dtype: str = "float32") -> OpNode:
    nb = 4
    br = sum(math.prod(s) for s in ins) * nb
    bw = 0 if cls == "view" else math.prod(out) * nb
    pb = sum(math.prod(s) for s, p in zip(ins, par) if p) * nb
    if cls == "view":
        br = 0
    return OpNode(index=i, op=op, op_class=cls, output_shapes=(out,), output_dtype=dtype, input_shapes=ins,
                  input_is_param=par, attrs=attrs or {}, flops=flops, macs=macs, bytes_read=br, bytes_written=bw,
                  param_bytes=pb, is_constant=const, known=known)


def tiny_graph(extra_op: str | None = None) -> OperatorGraph:
    """conv -> bn -> relu -> reshape(view) -> conv -> add(residual) -> pool -> [const transpose] -> matmul."""
    x = (B, C, H, H)
    conv_attrs = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilation": [1, 1], "groups": 1, "kernel": [3, 3],
                  "in_channels_per_group": C, "out_channels": C, "depthwise": False}
    macs = B * C * H * H * C * 9
    nodes = [
        _node(0, "nn.conv2d", "conv", x, (x, (C, C, 3, 3)), (False, True), 2 * macs, macs, conv_attrs),
        _node(1, "nn.batch_norm", "normalization", x, (x, (C,), (C,), (C,), (C,)), (False, True, True, True, True),
              2 * B * C * H * H),
        _node(2, "nn.relu", "activation", x, (x,), (False,), B * C * H * H),
        _node(3, "reshape", "view", x, (x,), (False,)),
        _node(4, "nn.conv2d", "conv", x, (x, (C, C, 3, 3)), (False, True), 2 * macs, macs, conv_attrs),
        _node(5, "add", "elementwise", x, (x, x), (False, False), B * C * H * H),
        _node(6, "nn.adaptive_avg_pool2d", "pool", (B, C, 1, 1), (x,), (False,), B * C * H * H,
              attrs={"output_size": [1, 1]}),
        _node(7, "permute_dims", "view", (C, 10), ((10, C),), (True,), const=True),
        _node(8, "matmul", "matmul", (B, 10), ((B, C), (C, 10)), (False, True), 2 * B * C * 10, B * C * 10,
              attrs={"m": B, "n": 10, "k": C, "batch": 1}),
    ]
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (2, 5), (5, 6), (6, 8), (7, 8)]
    if extra_op is not None:
        nodes.append(_node(9, extra_op, "unknown", (B, 10), ((B, 10),), (False,), B * 10, known=False))
        edges.append((8, 9))
    return OperatorGraph(nodes=nodes, edges=sorted(edges), input_consumers={"x": [0]}, outputs=[len(nodes) - 1],
                         spec=InputSpec(shape=(C, H, H), batch_size=B), param_count=0, param_bytes=0,
                         mode="export").validate()


# ------------------------------------------------------------------ registry
def test_registry_rejects_duplicate_registration() -> None:
    register_op_encoder("test.my_op", lambda n: ("ewise_other", [1.0]))
    try:
        with pytest.raises(DippmNasError, match="already has an encoder"):
            register_op_encoder("test.my_op", lambda n: ("ewise_other", [2.0]))
        register_op_encoder("test.my_op", lambda n: ("relu", []), replace=True)
        assert get_op_encoder("test.my_op").fn(None)[0] == "relu"  # type: ignore[arg-type]
    finally:
        unregister_op_encoder("test.my_op")
    with pytest.raises(UnsupportedOpError, match="no op encoder"):
        get_op_encoder("test.my_op")


def test_builtin_ops_have_encoders() -> None:
    g = tiny_graph()
    for n in g.nodes:
        token, attrs, known = encode_op(n)
        assert known and token in TOKENS and len(attrs) == 8
    tok, attrs, _ = encode_op(g.nodes[0])
    assert tok == "conv2d" and attrs[0] == 3.0  # kernel height


def test_bad_encoder_output_is_rejected() -> None:
    register_op_encoder("test.bad", lambda n: ("not-a-token", []))
    try:
        with pytest.raises(ValueError, match="valid tokens"):  # a DippmNasError that is also a ValueError
            encode_op(_node(0, "test.bad", "elementwise", (1,), ((1,),), (False,)))
    finally:
        unregister_op_encoder("test.bad")


def test_unknown_op_is_counted_warned_once_and_never_zeros() -> None:
    reset_unknown_op_counts()
    g = tiny_graph(extra_op="my.weird_op")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        f1 = featurize(g, "a100-sxm4-40gb")
        f2 = featurize(g, "a100-sxm4-40gb")
    ours = [w for w in rec if "my.weird_op" in str(w.message) and "feature encoder" in str(w.message)]
    assert len(ours) == 1
    assert unknown_op_counts()["my.weird_op"] == 2
    assert f1.unknown_ops == {"my.weird_op": 1} and f2.unknown_ops == {"my.weird_op": 1}
    kg = coarsen(g)
    k = next(i for i, grp in enumerate(kg.groups) if g.nodes[grp[0]].op == "my.weird_op")
    row = f1.x[k]
    assert row[TOKENS.index("unknown")] == 1.0
    assert np.count_nonzero(row[len(TOKENS):]) > 5  # class, flops, bytes, shapes: not zeros


# ------------------------------------------------------------------ coarsening
def test_coarsen_fuses_epilogues_and_bypasses_views() -> None:
    g = tiny_graph()
    kg = coarsen(g)
    ops = [[g.nodes[i].op for i in grp] for grp in kg.groups]
    assert ops[0] == ["nn.conv2d", "nn.batch_norm", "nn.relu", "reshape"]
    assert ops[1] == ["nn.conv2d", "add"]
    assert kg.dropped == [7]  # the constant weight transpose
    # the residual add keeps an edge from the first kernel; the reshape is bypassed
    assert (0, 1) in kg.edges
    assert all(s < d for s, d in kg.edges)
    unfused = coarsen(g, fuse=False)
    assert unfused.num_kernels == 7  # 9 nodes - 1 view - 1 constant


@pytest.mark.parametrize("fuse", [True, False])
def test_coarsening_preserves_totals(fuse: bool) -> None:
    g = tiny_graph()
    f = featurize(g, "a100-sxm4-40gb", fuse=fuse)
    kg = coarsen(g, fuse=fuse)
    live = [n for n in g.nodes if not n.is_constant]
    members = [i for grp in kg.groups for i in grp]
    assert sorted(members + kg.dropped) == list(range(g.num_nodes))  # every node accounted for once
    for name in ("flops", "macs", "bytes_read", "bytes_written", "param_bytes"):
        assert sum(getattr(g.nodes[i], name) for i in members) == sum(getattr(n, name) for n in live)
    assert sum(g.nodes[i].flops for i in members) == g.total_flops
    est = f.estimate
    kernel_ms = [sum(est.node_time_ms[i] for i in grp) for grp in kg.groups]
    assert math.isclose(sum(kernel_ms), float(est.node_time_ms.sum()), rel_tol=1e-9)


def test_coarsen_on_a_captured_model() -> None:
    from _models import TinyMobileNet

    from dippm_nas import capture

    g = capture(TinyMobileNet(), InputSpec(shape=(3, 32, 32), batch_size=2))
    kg = coarsen(g)
    assert kg.num_kernels < g.num_nodes
    members = [i for grp in kg.groups for i in grp]
    assert sum(g.nodes[i].flops for i in members) == g.total_flops
    f = featurize(g, "rtx-3090")
    assert f.x.shape == (kg.num_kernels, node_dim())
    assert np.isfinite(f.x).all() and np.isfinite(f.static).all()


# ------------------------------------------------------------------ tensors
@pytest.mark.parametrize("style", ["ours", "dippm"])
def test_feature_shapes(style: str) -> None:
    g = tiny_graph()
    f = featurize(g, "a100-sxm4-40gb", style=style)
    assert f.x.shape[1] == node_dim(style) and f.x.dtype == np.float32
    assert f.static.shape == (static_dim(style),)
    assert f.device.shape == (device_dim(),)
    assert f.edge_index.shape[0] == 2 and f.edge_index.max() < f.x.shape[0]
    if style == "dippm":
        assert f.x.shape[0] == g.num_nodes  # one node per operator, chain edges
        assert f.edge_index.shape[1] == g.num_nodes - 1
    assert f.prior_latency_ms > 0 and f.prior_memory_mib > 0
    assert isinstance(FEATURE_SCHEMA_VERSION, int)


def test_device_features_differ_between_devices() -> None:
    g = tiny_graph()
    a, b = featurize(g, "a100-sxm4-40gb"), featurize(g, "rtx-3090")
    assert not np.allclose(a.device, b.device)
    assert not np.allclose(a.x, b.x)  # the prior's per-node time is device-specific


def test_unknown_style_is_rejected() -> None:
    with pytest.raises(DippmNasError, match="style must be one of"):
        featurize(tiny_graph(), "a100-sxm4-40gb", style="nope")


def test_attention_with_an_additive_mask_is_encoded_as_attention() -> None:
    """A float attention mask makes Relax emit ``nn.attention_bias``: same work as ``nn.attention``."""
    import torch

    from dippm_nas import InputSpec, capture

    class MaskedAttention(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            bias = torch.zeros(q.shape[0], 2, q.shape[2], q.shape[2])
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=bias)

    g = capture(MaskedAttention(), InputSpec(shape=(2, 16, 8), batch_size=1), cache=False)
    nodes = [n for n in g.nodes if n.op == "nn.attention_bias"]
    assert len(nodes) == 1, [n.op for n in g.nodes]
    token, attrs, known = encode_op(nodes[0])
    assert known and token == "attention"
    # batch, seq_q, seq_k, heads, head_dim on the registry's log2(1 + x) scale
    assert attrs[:5] == pytest.approx([math.log2(1 + v) for v in (1, 16, 16, 2, 8)])
