"""The batched passes equal the per-graph ones: ``featurize_many`` against ``featurize``,
``activation_liveness_many`` against ``activation_liveness`` and ``gpu_memory_parts_many`` against
``gpu_memory_parts``, graph by graph.

Both batched passes compute the same numbers in another order of operations only where the result cannot
change (integer sums, maxima) or is rounded back to the per-graph value (``log1p``, see
:mod:`dippm_nas.features._many`), so every array is compared to a 1e-9 relative tolerance: for the float32
feature arrays that is equality.

Graphs: the assembled ``mbconv`` and host-CPU sample of ``tests/data/inference_graphs.json.xz``, graphs of four
other registered spaces assembled from blocks (small configurations of ``tests/test_assembly.py``), synthetic
ResNet chains, and hand-made graphs for the corner cases of coarsening (views of model inputs, a graph of views
only, constant consumers, unknown ops).
"""

from __future__ import annotations

import json
import lzma
import warnings
from pathlib import Path

import numpy as np
import pytest

from dippm_nas.devices import resolve_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.features import (
    GraphFeatures, coarsen, featurize, featurize_many, get_op_encoder, register_op_encoder,
)
from dippm_nas.errors import GraphValidationError
from dippm_nas.graph import (OperatorGraph, OpNode, adopt_node_columns, node_columns, stack_graphs,
                             synthetic_resnet_graph)
from dippm_nas.prior import (activation_liveness, activation_liveness_many, estimate, gpu_memory_parts,
                             gpu_memory_parts_many)
from dippm_nas.spec import InputSpec

DATA = Path(__file__).resolve().parent / "data"
REL = 1e-9
#: Spaces assembled for the sample (their configs in tests/test_assembly.py capture in about a second each).
SPACES = ("resnet", "vit", "bert", "mlp")


def _sample_graphs() -> tuple[list[OperatorGraph], list[OperatorGraph]]:
    with lzma.open(DATA / "inference_graphs.json.xz", "rt") as f:
        d = json.load(f)
    return [OperatorGraph.from_dict(x) for x in d["gpu"]], [OperatorGraph.from_dict(x) for x in d["host"]]


@pytest.fixture(scope="module")
def space_graphs(tmp_path_factory: pytest.TempPathFactory) -> list[OperatorGraph]:
    import search_spaces as ss
    from test_assembly import TINY

    from dippm_nas.cache import ConversionCache
    from dippm_nas.capture import assemble_many

    store = ConversionCache(f"sqlite:///{tmp_path_factory.mktemp('many') / 'cache.sqlite'}")
    items = []
    for name in SPACES:
        space = ss.get_space(name)
        cfg = space.validate(TINY[name])
        items += [(name, cfg, space.input_spec(cfg, batch_size=b, dtype=dt)) for b, dt in ((2, "float32"),
                                                                                         (8, "float16"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = assemble_many(items, workers=1, cache=store)
    store.close()
    assert all(r.ok for r in res)
    return [r.graph for r in res]


def _node(i: int, op: str, cls: str, shape: tuple, ins: tuple, par: tuple | None = None, *, const: bool = False,
          known: bool = True, attrs: dict | None = None) -> OpNode:
    n = int(np.prod(shape)) * 4
    view = cls == "view"
    return OpNode(index=i, op=op, op_class=cls, output_shapes=(shape,), output_dtype="float32", input_shapes=ins,
                  input_is_param=par or (False,) * len(ins), attrs=attrs or {}, flops=0 if view else n // 4,
                  macs=0, bytes_read=0 if view else n, bytes_written=0 if view else n, param_bytes=0,
                  is_constant=const, known=known)


def _corner_graphs() -> list[OperatorGraph]:
    """Views of a model input (consumed by a kernel, by a view with a kernel source, never consumed), a
    constant chain, an unknown op fused into a kernel, an op without an encoder as a head, two inputs."""
    s = (2, 4)
    spec = InputSpec(inputs={"a": (4,), "b": (4,)}, batch_size=2)
    nodes = [
        _node(0, "reshape", "view", s, (s,)),                         # view of input a
        _node(1, "permute_dims", "view", s, (s,)),                    # view of view 0 (still no kernel)
        _node(2, "nn.relu", "activation", s, (s,)),                   # reads view 1 only: starts a kernel
        _node(3, "reshape", "view", s, (s,)),                         # view of input b, first read by node 5
        _node(4, "permute_dims", "view", (4, 4), ((4, 4),), (True,), const=True),
        _node(5, "add", "elementwise", s, (s, s)),                    # fused into node 2's kernel
        _node(6, "my.op", "unknown", s, (s,), known=False),           # fusable? no: unknown starts a kernel
        _node(7, "exp", "elementwise", s, (s,), known=False),         # an unknown member of node 6's kernel
        _node(8, "matmul", "matmul", (2, 4), (s, (4, 4)), (False, True), attrs={"m": 2, "n": 4, "k": 4}),
        _node(9, "reshape", "view", s, (s,)),                         # view of input b never consumed
        _node(10, "add", "elementwise", s, (s, s)),                   # fused into node 8's kernel (the latest)
        _node(11, "reshape", "view", s, (s,)),                        # view of input a, first read by view 12
        _node(12, "reshape", "view", s, (s, s)),                      # a view with a kernel source: drops 11
    ]
    edges = [(0, 1), (1, 2), (2, 5), (3, 5), (5, 6), (6, 7), (7, 8), (4, 8), (8, 10), (2, 10), (10, 12), (11, 12)]
    g1 = OperatorGraph(nodes=nodes, edges=edges, input_consumers={"a": [0, 11], "b": [3, 9]}, outputs=[12],
                       spec=spec, param_count=16, param_bytes=64, mode="export").validate()
    views_only = OperatorGraph(
        nodes=[_node(0, "reshape", "view", s, (s,)), _node(1, "permute_dims", "view", s, (s,))],
        edges=[(0, 1)], input_consumers={"x": [0]}, outputs=[1], spec=InputSpec(shape=(4,), batch_size=2),
        param_count=0, param_bytes=0, mode="export").validate()
    return [g1, views_only]


def _assert_features_equal(a: GraphFeatures, b: GraphFeatures, what: str) -> None:
    for name in ("x", "edge_index", "static", "device"):
        u, v = getattr(a, name), getattr(b, name)
        assert u.dtype == v.dtype and u.shape == v.shape, f"{what}: {name} {u.dtype}{u.shape} vs {v.dtype}{v.shape}"
        np.testing.assert_allclose(u, v, rtol=REL, atol=0, err_msg=f"{what}: {name}")
    assert (a.prior_latency_ms, a.prior_memory_mib, a.prior_energy_j, a.style, a.unknown_ops) == \
        (b.prior_latency_ms, b.prior_memory_mib, b.prior_energy_j, b.style, b.unknown_ops), what


def _check_features(graphs: list[OperatorGraph], device: str, *, fuse: bool = True) -> None:
    dev = resolve_device(device)
    ests = [estimate(g, dev) for g in graphs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown ops warn once per process
        many = featurize_many(graphs, dev, estimates=ests, fuse=fuse)
        again = featurize_many(graphs, dev, fuse=fuse)  # estimates computed inside; the head memo now warm
        for i, (g, e) in enumerate(zip(graphs, ests)):
            ref = featurize(g, dev, estimate=e, fuse=fuse)
            _assert_features_equal(many[i], ref, f"{g.source or i} fuse={fuse}")
            _assert_features_equal(again[i], ref, f"{g.source or i} fuse={fuse}, second pass")


def _check_liveness(graphs: list[OperatorGraph]) -> None:
    for kw in ({"retention": True, "include_inputs": False}, {}, {"retention": True}):
        many = activation_liveness_many(graphs, **kw)
        for g, m in zip(graphs, many):
            r = activation_liveness(g, **kw)
            assert (m.peak_allocated_bytes, m.peak_reserved_bytes, m.peak_node) == \
                (r.peak_allocated_bytes, r.peak_reserved_bytes, r.peak_node), (g.source, kw)
            np.testing.assert_allclose(m.live_bytes, r.live_bytes, rtol=REL, atol=0)
            np.testing.assert_allclose(m.pool_live_bytes, r.pool_live_bytes, rtol=REL, atol=0)


def _check_parts(graphs: list[OperatorGraph]) -> None:
    lv = activation_liveness_many(graphs, retention=True, include_inputs=False)
    cublas = [i % 2 == 0 for i in range(len(graphs))]
    cudnn = [i % 3 == 0 for i in range(len(graphs))]
    for ctx, ws in ((700.0, 8.0), (512.0, 0.0)):
        many = gpu_memory_parts_many(graphs, lv, context_mib=ctx, cublas_workspace_mib=ws, uses_cublas=cublas,
                                     uses_cudnn=cudnn)
        for g, m, a, b in zip(graphs, many, cublas, cudnn):
            r = gpu_memory_parts(g, activation_liveness(g, retention=True, include_inputs=False), context_mib=ctx,
                                 cublas_workspace_mib=ws, uses_cublas=a, uses_cudnn=b)
            assert m.std_parts_mib.keys() == r.std_parts_mib.keys()
            np.testing.assert_allclose([*m.details().values()], [*r.details().values()], rtol=REL, atol=0)
            assert m.peak_node == r.peak_node


@pytest.mark.parametrize("fuse", [True, False])
def test_featurize_many_equals_featurize_on_the_sample(fuse: bool) -> None:
    gpu, host = _sample_graphs()
    mixed = gpu + [synthetic_resnet_graph(k) for k in (1, 3, 6)] + _corner_graphs()
    _check_features(mixed * 3, "a100-sxm4-40gb", fuse=fuse)  # enough graphs for the per-position depth pass
    _check_features(host, "host-cpu", fuse=fuse)


def test_featurize_many_equals_featurize_on_other_spaces(space_graphs: list[OperatorGraph]) -> None:
    _check_features(space_graphs * 4, "a100-sxm4-40gb")
    _check_features(space_graphs[:1], "h100-sxm5-80gb")  # below MANY_MIN_GRAPHS: the per-graph pass
    _check_features(space_graphs[:2], "h100-sxm5-80gb")


def test_liveness_and_memory_parts_many_equal_the_per_graph_ones(space_graphs: list[OperatorGraph]) -> None:
    gpu, host = _sample_graphs()
    graphs = gpu + host + space_graphs + [synthetic_resnet_graph(4)] + _corner_graphs()
    _check_liveness(graphs)
    _check_parts(graphs)
    with pytest.raises(InvalidValueError, match="one liveness and flag per graph"):
        gpu_memory_parts_many(graphs, [], context_mib=1.0, cublas_workspace_mib=0.0, uses_cublas=[], uses_cudnn=[])


def test_corner_cases_of_coarsening_are_those_of_coarsen() -> None:
    g1, views_only = _corner_graphs()
    kg = coarsen(g1)
    # input views 0, 1 join the kernel of their first consumer (node 2); view 3 joins node 5's kernel (node 2's),
    # view 9 (never read) the first kernel, view 11 none (its reader, view 12, has a kernel source: node 10's);
    # the unknown member 7 is in node 6's kernel; constant 4 is dropped
    assert kg.groups == [[2, 0, 1, 3, 5, 9], [6, 7], [8, 10, 12]] and kg.dropped == [4]
    assert stack_graphs([views_only]).num_nodes == 2
    many = featurize_many([g1, views_only] * 3, "a100-sxm4-40gb")
    for f, g in zip(many, [g1, views_only] * 3):
        _assert_features_equal(f, featurize(g, "a100-sxm4-40gb"), g.source)
    assert many[0].unknown_ops == {"my.op": 1, "exp": 1}


def test_memo_follows_the_registry_and_the_node_values() -> None:
    g = synthetic_resnet_graph(2)
    graphs = [g] * 4
    before = featurize_many(graphs, "a100-sxm4-40gb")
    # a node sharing a head's attributes object but with other input shapes is encoded on its own
    conv = g.nodes[0]
    wide = OpNode(**{**conv.__dict__, "input_shapes": ((2, 16, 4, 4), (16, 16, 3, 3))})
    g2 = OperatorGraph(nodes=[wide, *g.nodes[1:]], edges=g.edges, input_consumers=g.input_consumers,
                       outputs=g.outputs, spec=g.spec, param_count=g.param_count, param_bytes=g.param_bytes,
                       mode=g.mode).validate()
    assert wide.attrs is conv.attrs
    for f in featurize_many([g2] * 4, "a100-sxm4-40gb"):
        _assert_features_equal(f, featurize(g2, "a100-sxm4-40gb"), "shared attributes, other shapes")
        assert not np.array_equal(f.x, before[0].x)
    old = get_op_encoder("nn.conv2d").fn
    register_op_encoder("nn.conv2d", lambda node: ("conv_other", [7.0]), replace=True)
    try:
        after = featurize_many(graphs, "a100-sxm4-40gb")
        assert not np.array_equal(after[0].x, before[0].x)
        _assert_features_equal(after[0], featurize(g, "a100-sxm4-40gb"), "re-registered encoder")
    finally:
        register_op_encoder("nn.conv2d", old, replace=True)
    _assert_features_equal(featurize_many(graphs, "a100-sxm4-40gb")[0], before[0], "encoder restored")


def test_featurize_many_checks_its_arguments() -> None:
    g = synthetic_resnet_graph(1)
    with pytest.raises(InvalidValueError, match="one estimate per graph"):
        featurize_many([g, g], "a100-sxm4-40gb", estimates=[estimate(g, "a100-sxm4-40gb")])
    with pytest.raises(InvalidValueError, match="style must be one of"):
        featurize_many([g], "a100-sxm4-40gb", style="nope")
    assert featurize_many([], "a100-sxm4-40gb") == []
    assert activation_liveness_many([]) == []
    dippm = featurize_many([g] * 5, "a100-sxm4-40gb", style="dippm")
    _assert_features_equal(dippm[4], featurize(g, "a100-sxm4-40gb", style="dippm"), "dippm style")


def test_adopted_node_columns_are_the_graphs_own() -> None:
    def fresh() -> OperatorGraph:
        return OperatorGraph.from_dict(synthetic_resnet_graph(3).to_dict())

    g, ref = fresh(), node_columns(fresh())
    parts = [OperatorGraph(nodes=g.nodes[a:b], edges=[], input_consumers={}, outputs=[], spec=g.spec, param_count=0,
                           param_bytes=0, mode=g.mode) for a, b in ((0, 5), (5, 5), (5, g.num_nodes))]
    adopt_node_columns(g, parts)
    got = node_columns(g)
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k].dtype == ref[k].dtype and np.array_equal(got[k], ref[k]), k
    with pytest.raises(GraphValidationError, match="the parts hold 5 nodes"):
        adopt_node_columns(fresh(), parts[:1])
