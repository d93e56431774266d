"""A synthetic operator graph of known size, for tests and benchmarks of what stores or moves graphs."""

from __future__ import annotations

from dippm_nas.graph._graph import OperatorGraph, OpNode
from dippm_nas.spec import InputSpec

__all__ = ["synthetic_resnet_graph"]


def synthetic_resnet_graph(num_blocks: int, *, channels: int = 16, batch: int = 2, size: int = 8,
                           source: str = "synthetic", model_key: str = "synthetic",
                           convert_seconds: float = 1.0) -> OperatorGraph:
    """A ResNet-like chain of ``num_blocks`` x (conv2d 3x3, batch_norm, relu, residual add): 4 nodes per block,
    float32 activations of ``batch`` x ``channels`` x ``size`` x ``size``, with the FLOPs and bytes of each
    node counted as the real operators would be. The graph is validated."""
    nodes: list[OpNode] = []
    edges: list[tuple[int, int]] = []
    shape = (batch, channels, size, size)
    act = 4 * batch * channels * size * size
    w = (channels, channels, 3, 3)
    c = (channels,)
    macs = batch * channels * size * size * channels * 9
    prev = -1
    for _ in range(num_blocks):
        i = len(nodes)
        nodes += [
            OpNode(i, "nn.conv2d", "conv", (shape,), "float32", (shape, w), (False, True),
                   {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilation": [1, 1], "groups": 1,
                    "kernel": [3, 3], "data_layout": "NCHW"},
                   2 * macs, macs, act + 4 * channels * channels * 9, act, 4 * channels * channels * 9),
            OpNode(i + 1, "nn.batch_norm", "normalization", (shape, c, c), "float32", (shape, c, c, c, c),
                   (False, True, True, True, True), {"axis": 1, "epsilon": 1e-5}, act, 0, act + 16 * channels,
                   act, 16 * channels),
            OpNode(i + 2, "nn.relu", "activation", (shape,), "float32", (shape,), (False,), {}, act // 4, 0,
                   act, act, 0),
            OpNode(i + 3, "add", "elementwise", (shape,), "float32", (shape, shape), (False, False), {},
                   act // 4, 0, 2 * act, act, 0),
        ]
        edges += [(i, i + 1), (i + 1, i + 2), (i + 2, i + 3)]
        if prev >= 0:
            edges += [(prev, i), (prev, i + 3)]
        prev = i + 3
    params = num_blocks * (channels * channels * 9 + 4 * channels)
    return OperatorGraph(
        nodes=nodes, edges=sorted(edges), input_consumers={"x": [0, 3]}, outputs=[len(nodes) - 1],
        spec=InputSpec(shape=(channels, size, size), batch_size=batch), param_count=params,
        param_bytes=4 * params, mode="export", source=source, convert_seconds=convert_seconds, model_key=model_key,
    ).validate()
