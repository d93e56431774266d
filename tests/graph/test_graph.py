"""OperatorGraph: dataflow edges, node records, static features, JSON, validation, PyG."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from _models import TinyResNet, TinyViT
from torch import nn

from dippm_nas import GraphValidationError, InputSpec, MissingDependencyError, OperatorGraph, capture
from dippm_nas.graph import OpNode


def _capture(model: nn.Module, shape=(3, 16, 16), batch=2) -> OperatorGraph:
    return capture(model.eval(), InputSpec(shape=shape, batch_size=batch), cache=False)


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.a(x)) + self.b(x)


def test_residual_add_has_two_in_edges_from_real_producers() -> None:
    g = _capture(Residual(), shape=(4, 8, 8))
    ops = [n.op for n in g.nodes]
    add_final = max(i for i, op in enumerate(ops) if op == "add")
    preds = g.predecessors()[add_final]
    assert len(preds) == 2
    producer_ops = sorted(g.nodes[p].op for p in preds)
    # one branch ends in relu, the other in the 1x1 conv's bias add
    assert "nn.relu" in producer_ops
    # both convs read the model input directly: not a chain in visit order
    convs = [i for i, op in enumerate(ops) if op == "nn.conv2d"]
    assert sorted(g.input_consumers["x"]) == convs
    assert (convs[0], convs[1]) not in g.edges


def test_every_relax_call_is_a_node_none_dropped() -> None:
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    m = TinyResNet().eval()
    spec = InputSpec(shape=(3, 16, 16), batch_size=2)
    ep = torch.export.export(m, spec.example_inputs()[0])
    mod = from_exported_program(ep, run_ep_decomposition=False)
    calls = [b for blk in mod["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, tvm.relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    g = _capture(m)
    assert g.num_nodes == len(calls)
    assert [n.op for n in g.nodes] == [str(c.value.op.name)[len("relax."):] for c in calls]


def test_conv_node_attributes_and_costs() -> None:
    m = nn.Sequential(nn.Conv2d(3, 6, (3, 5), stride=2, padding=(1, 2), dilation=1, groups=3, bias=False))
    g = _capture(m, shape=(3, 10, 12), batch=4)
    (conv,) = [n for n in g.nodes if n.op == "nn.conv2d"]
    assert conv.attrs["strides"] == [2, 2]
    assert conv.attrs["padding"] == [1, 2, 1, 2]
    assert conv.attrs["groups"] == 3
    assert conv.attrs["kernel"] == [3, 5]
    assert conv.output_shape == (4, 6, 5, 6)
    assert conv.input_shapes == ((4, 3, 10, 12), (6, 1, 3, 5))
    assert conv.input_is_param == (False, True)
    assert conv.macs == 4 * 6 * 5 * 6 * (1 * 3 * 5)
    assert conv.flops == 2 * conv.macs
    assert conv.param_bytes == 6 * 1 * 3 * 5 * 4
    assert conv.bytes_read == (4 * 3 * 10 * 12 + 6 * 15) * 4
    assert conv.bytes_written == 4 * 6 * 5 * 6 * 4


def test_matmul_attrs_and_constant_weight_transpose() -> None:
    g = _capture(nn.Sequential(nn.Flatten(), nn.Linear(12, 7)), shape=(3, 4), batch=5)
    (mm,) = [n for n in g.nodes if n.op == "matmul"]
    assert (mm.attrs["m"], mm.attrs["n"], mm.attrs["k"]) == (5, 7, 12)
    assert mm.macs == 5 * 7 * 12
    transposes = [n for n in g.nodes if n.op == "permute_dims"]
    assert transposes and all(t.is_constant for t in transposes)  # weight transpose folds away
    assert mm.input_is_param == (False, True)


def test_static_features_dippm_five_plus_ours() -> None:
    m = TinyResNet()
    g = _capture(m)
    sf = g.static_features()
    assert sf.batch_size == 2
    assert sf.num_conv == 6
    assert sf.num_dense == 1
    assert sf.num_relu == 5
    assert sf.total_macs == g.total_macs > 0
    n_params = sum(p.numel() for p in m.parameters())
    n_bn_stats = sum(b.numel() for name, b in m.named_buffers() if "running" in name)
    assert sf.param_count == n_params + n_bn_stats
    assert sf.param_bytes == 4 * sf.param_count
    assert sf.depth >= 10
    assert sf.activation_bytes > 0


def test_json_round_trip_and_structural_hash() -> None:
    g = _capture(TinyViT(), shape=(3, 32, 32))
    text = g.to_json()
    json.loads(text)  # plain JSON
    g2 = OperatorGraph.from_json(text)
    assert g2.to_dict() == g.to_dict()
    assert g2.structural_hash() == g.structural_hash()


def test_two_instances_share_structural_hash_and_differ_by_shape() -> None:
    a = _capture(TinyResNet())
    b = _capture(TinyResNet())
    c = _capture(TinyResNet(), batch=3)
    assert a.structural_hash() == b.structural_hash()
    assert a.structural_hash() != c.structural_hash()


def test_validate_rejects_backward_edges_and_bad_indices() -> None:
    g = _capture(Residual(), shape=(4, 8, 8))
    bad = OperatorGraph.from_dict(g.to_dict())
    bad.edges = [*bad.edges, (3, 1)]
    with pytest.raises(GraphValidationError, match="backwards"):
        bad.validate()
    bad = OperatorGraph.from_dict(g.to_dict())
    bad.edges = [(0, 99)]
    with pytest.raises(GraphValidationError, match="outside"):
        bad.validate()
    bad = OperatorGraph.from_dict(g.to_dict())
    n0 = bad.nodes[0]
    bad.nodes[0] = OpNode(**{**n0.__dict__, "flops": -1})
    with pytest.raises(GraphValidationError, match="flops"):
        bad.validate()


def test_to_pyg_carries_edges_and_node_fields() -> None:
    g = _capture(Residual(), shape=(4, 8, 8))
    data = g.to_pyg()
    assert data.num_nodes == g.num_nodes
    assert data.edge_index.shape == (2, g.num_edges)
    assert {tuple(e) for e in data.edge_index.t().tolist()} == set(g.edges)
    assert data.flops.shape == (g.num_nodes,)
    assert float(data.macs.sum()) == g.total_macs


def test_to_pyg_without_torch_geometric_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_geometric", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "torch_geometric.data", None)
    with pytest.raises(MissingDependencyError, match=r"dippm-nas\[pyg\]"):
        _capture(Residual(), shape=(4, 8, 8)).to_pyg()
