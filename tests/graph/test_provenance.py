"""Graph format 2's per-node provenance (module stack, in-place flag): captured from the exported program,
kept through save and load, absent from format-1 graphs (which load and predict as before), and what the
memory prior's eager liveness reads: a module's argument lives until the module returns, an activation is in
place only where the exported operator was."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dippm_nas import GraphValidationError, InputSpec, OperatorGraph, capture  # noqa: E402
from dippm_nas.graph import GRAPH_FORMAT_VERSION, READABLE_GRAPH_FORMATS  # noqa: E402
from dippm_nas.measure import reference_activation_peak  # noqa: E402
from dippm_nas.prior import activation_liveness  # noqa: E402

SPEC = InputSpec(shape=(3, 16, 16), batch_size=1)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x)) + x


class _StemBody(nn.Module):
    """``x = self.stem(x); x = self.body(x)`` (timm's ``forward_features``): the stem's output is the body's
    argument, alive until the body returns; the body's activations are ``nn.ReLU()``, not in place."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=1)  # the blocks at a quarter of the size
        self.blocks = nn.Sequential(_Block(), _Block())
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.body(x)
        x = self.blocks(self.down(x))
        return self.act(self.act(x)).mean((2, 3))


def _format_1(g: OperatorGraph) -> dict:
    """``g`` as a format-1 graph was written: no provenance fields."""
    d = json.loads(g.to_json())
    d["format_version"] = 1
    for nd in d["nodes"]:
        nd.pop("ms", None)
        nd.pop("ip", None)
    return d


def test_capture_records_each_nodes_module_stack_and_in_place_flag() -> None:
    g = capture(_StemBody(), SPEC)
    assert g.has_provenance and GRAPH_FORMAT_VERSION == 2 and READABLE_GRAPH_FORMATS == (1, 2)
    convs = [nd for nd in g.nodes if nd.op == "nn.conv2d"]
    assert convs[0].module_stack == ("stem",)
    assert convs[1].module_stack == ("body", "body.0")
    assert convs[4].module_stack == ("down",)
    assert convs[5].module_stack == ("blocks", "blocks.0", "blocks.0.conv")
    relus = [nd for nd in g.nodes if nd.op == "nn.relu"]
    assert [nd.inplace for nd in relus] == [False, False, False, True, True, False, False]
    assert relus[3].module_stack == ("blocks", "blocks.0", "blocks.0.act")
    assert [nd.module_stack for nd in relus[-2:]] == [("act",), ("act@1",)]  # a module called twice
    joins = [nd for nd in g.nodes if nd.op == "add" and sum(not p for p in nd.input_is_param) == 2]
    assert [nd.module_stack for nd in joins] == [("blocks", "blocks.0"), ("blocks", "blocks.1")]


def test_provenance_survives_save_and_load_and_leaves_the_hash_alone() -> None:
    g = capture(_StemBody(), SPEC)
    back = OperatorGraph.from_json(g.to_json())
    assert back.nodes == g.nodes and back.has_provenance
    assert [nd.module_stack for nd in back.nodes] == [nd.module_stack for nd in g.nodes]
    assert [nd.inplace for nd in back.nodes] == [nd.inplace for nd in g.nodes]
    assert back.structural_hash() == g.structural_hash()
    assert OperatorGraph.from_dict(_format_1(g)).structural_hash() == g.structural_hash()


def test_a_format_1_graph_loads_without_provenance() -> None:
    """(That it predicts as before is ``tests/predictor/test_inference_equality.py``'s check on stored graphs.)"""
    g = capture(_StemBody(), SPEC)
    old = OperatorGraph.from_dict(_format_1(g))
    assert not old.has_provenance and old.nodes != g.nodes
    assert all(nd.module_stack is None and nd.inplace is None for nd in old.nodes)
    assert "ms" not in old.to_dict()["nodes"][0] and "ip" not in old.to_dict()["nodes"][0]
    assert old.to_dict()["format_version"] == GRAPH_FORMAT_VERSION


def test_module_argument_and_in_place_rules_match_eager() -> None:
    model = _StemBody()
    ref = reference_activation_peak(model, SPEC)
    g = capture(model, SPEC)
    with_prov = activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
    without = activation_liveness(OperatorGraph.from_dict(_format_1(g)), retention=True,
                                  include_inputs=False).peak_allocated_bytes
    t = 8 * 16 * 16 * 4  # one activation, bytes (a multiple of 512)
    # eager, at the body's ReLUs: the stem's output (the body's argument, held until the body returns), the
    # convolution's output (the ReLU's argument) and the ReLU's own output (``nn.ReLU()``: not in place)
    assert ref.peak_block_bytes == 3 * t and ref.peak_op_name == "aten.relu.default"
    assert with_prov == ref.peak_block_bytes
    assert without < ref.peak_block_bytes  # the structural rules take nn.ReLU() in place, the stem freed


@pytest.mark.parametrize("bad", [1, "stem", [1, 2], {"a": 1}])
def test_a_bad_module_stack_is_refused(bad: object) -> None:
    d = json.loads(capture(_StemBody(), SPEC).to_json())
    d["nodes"][0]["ms"] = bad
    with pytest.raises(GraphValidationError, match="module stack"):
        OperatorGraph.from_dict(d)


def test_an_unknown_format_version_is_refused() -> None:
    d = json.loads(capture(_StemBody(), SPEC).to_json())
    d["format_version"] = 3
    with pytest.raises(GraphValidationError, match="format_version"):
        OperatorGraph.from_dict(d)


def test_liveness_many_equals_one_at_a_time_with_and_without_provenance() -> None:
    from dippm_nas.prior import activation_liveness_many

    g = capture(_StemBody(), SPEC)
    old = OperatorGraph.from_dict(_format_1(g))
    many = activation_liveness_many([g, old, g], retention=True, include_inputs=False)
    one = [activation_liveness(x, retention=True, include_inputs=False) for x in (g, old, g)]
    assert [m.peak_allocated_bytes for m in many] == [m.peak_allocated_bytes for m in one]
    assert many[0].peak_allocated_bytes != many[1].peak_allocated_bytes


def test_module_names_leave_out_the_wrapper_capture_puts_around_a_transformers_model() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                                  vocab_size=100)
    spec = InputSpec.from_dict({"inputs": [{"name": "input_ids", "shape": [8], "dtype": "int64", "high": 100}],
                                "batch_size": 1, "dtype": "float32"})
    g = capture(transformers.BertModel(cfg).eval(), spec, cache=False)
    stacks = {nd.module_stack for nd in g.nodes}
    assert ("embeddings", "embeddings.word_embeddings") in stacks
    assert ("encoder", "encoder.layer.0", "encoder.layer.0.intermediate") in {st[:3] for st in stacks}
    assert not any(m.startswith("inner") for st in stacks for m in st)
