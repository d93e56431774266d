"""Many operator graphs as one node table: the columns the batched passes (features, liveness) read.

:func:`stack_graphs` reads every node's fields once (one pass over all nodes of all graphs) into numpy
columns indexed by a *global* node id: the nodes of graph ``g`` are ``offsets[g]:offsets[g + 1]``, in their
graph's order. Edges are global ids too, ordered by consumer and, for one consumer, in the order of the graph's
:attr:`~dippm_nas.graph.OperatorGraph.edges` (the order :meth:`~dippm_nas.graph.OperatorGraph.predecessors`
lists a node's producers in), so a pass over the stack visits a node's producers as a per-graph pass does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from dippm_nas.graph._formulas import OP_CLASSES
from dippm_nas.errors import GraphValidationError
from dippm_nas.graph._graph import OperatorGraph, OpNode

__all__ = ["GraphStack", "stack_graphs", "node_columns", "adopt_node_columns"]

_NODE_COLUMNS = ("op_class", "is_constant", "known", "flops", "macs", "bytes_read", "bytes_written", "param_bytes",
                 "num_outputs", "op")
_EMPTY = {"is_constant": bool, "known": bool, "op": str}
_CLASS_CODE = {c: j for j, c in enumerate(OP_CLASSES)}


@dataclass(frozen=True)
class GraphStack:
    """The node table of several graphs (see the module docstring).

    Attributes:
        graphs: the graphs, in order.
        nodes: every node of every graph, graph after graph.
        offsets: ``[G + 1]`` int64, graph ``g``'s nodes are ``offsets[g]:offsets[g + 1]``.
        graph_of: ``[N]`` int64, the graph of each node.
        local: ``[N]`` int64, each node's index in its graph.
        src, dst: ``[E]`` int64, producer and consumer of each edge (global ids), ordered by consumer.
        op_class: ``[N]`` int64, index into :data:`~dippm_nas.graph.OP_CLASSES` (``len(OP_CLASSES)`` for a class
            outside it).
        is_constant, known: ``[N]`` bool.
        flops, macs, bytes_read, bytes_written, param_bytes: ``[N]`` int64.
        num_outputs: ``[N]`` int64, outputs of each node (``len(output_shapes)``).
        op: ``[N]`` str, each node's op.
    """

    graphs: tuple[OperatorGraph, ...]
    nodes: list[OpNode]
    offsets: np.ndarray
    graph_of: np.ndarray
    local: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    op_class: np.ndarray
    is_constant: np.ndarray
    known: np.ndarray
    flops: np.ndarray
    macs: np.ndarray
    bytes_read: np.ndarray
    bytes_written: np.ndarray
    param_bytes: np.ndarray
    num_outputs: np.ndarray
    op: np.ndarray

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def sizes(self) -> np.ndarray:
        """``[G]`` int64 node count of each graph."""
        return np.diff(self.offsets)

    def is_class(self, op_class: str) -> np.ndarray:
        """``[N]`` bool: nodes of ``op_class``."""
        return self.op_class == _CLASS_CODE.get(op_class, len(OP_CLASSES))


def node_columns(graph: OperatorGraph) -> dict[str, np.ndarray]:
    """The node columns (the :class:`GraphStack` fields of one graph, keyed by field name) and the
    consumer-ordered edges (``src``, ``dst``) of ``graph``, computed once per graph object and cached on it, as
    its structural hash is (a graph's nodes and edges are not changed after it is built)."""
    cols = graph._columns
    if cols is not None:
        return cols
    if graph._column_parts is not None:  # adopted: the parts' columns, concatenated
        cols = [node_columns(p) for p in graph._column_parts]
        merged = {k: np.concatenate([c[k] for c in cols]) if cols else np.zeros(0, dtype=_EMPTY.get(k, np.int64))
                  for k in _NODE_COLUMNS}
        graph._columns = {**merged, **_edge_columns(graph)}
        graph._column_parts = None
        return graph._columns
    nodes = graph.nodes
    n = len(nodes)
    code, other = _CLASS_CODE.get, len(OP_CLASSES)
    cols = {
        "op_class": np.fromiter([code(nd.op_class, other) for nd in nodes], dtype=np.int64, count=n),
        "is_constant": np.fromiter([nd.is_constant for nd in nodes], dtype=bool, count=n),
        "known": np.fromiter([nd.known for nd in nodes], dtype=bool, count=n),
        "flops": np.fromiter([nd.flops for nd in nodes], dtype=np.int64, count=n),
        "macs": np.fromiter([nd.macs for nd in nodes], dtype=np.int64, count=n),
        "bytes_read": np.fromiter([nd.bytes_read for nd in nodes], dtype=np.int64, count=n),
        "bytes_written": np.fromiter([nd.bytes_written for nd in nodes], dtype=np.int64, count=n),
        "param_bytes": np.fromiter([nd.param_bytes for nd in nodes], dtype=np.int64, count=n),
        "num_outputs": np.fromiter([len(nd.output_shapes) for nd in nodes], dtype=np.int64, count=n),
        "op": np.array([nd.op for nd in nodes], dtype=str).reshape(n),
        **_edge_columns(graph),
    }
    graph._columns = cols
    return cols


def _edge_columns(graph: OperatorGraph) -> dict[str, np.ndarray]:
    ei = np.fromiter(chain.from_iterable(graph.edges), dtype=np.int64, count=2 * len(graph.edges)).reshape(-1, 2)
    order = np.argsort(ei[:, 1], kind="stable")
    return {"src": np.ascontiguousarray(ei[order, 0]), "dst": np.ascontiguousarray(ei[order, 1])}


def adopt_node_columns(graph: OperatorGraph, parts: Sequence[OperatorGraph]) -> None:
    """Give ``graph`` the node columns of ``parts``, graphs whose nodes it holds in order with equal fields (a
    search-space candidate assembled from its blocks' graphs): :func:`node_columns` of ``graph`` is then their
    cached columns concatenated (when first asked for) instead of ``graph``'s nodes read one by one; the edge
    columns are ``graph``'s own.

    Raises:
        GraphValidationError: the parts hold another number of nodes than ``graph``.
    """
    n = sum(len(p.nodes) for p in parts)
    if n != len(graph.nodes):
        raise GraphValidationError(f"the parts hold {n} nodes, the graph {len(graph.nodes)}: the parts' columns "
                                   "cannot be the graph's")
    graph._columns = None
    graph._column_parts = tuple(parts)


def stack_graphs(graphs: Sequence[OperatorGraph]) -> GraphStack:
    """The node table of ``graphs`` (validated graphs; see the module docstring)."""
    gs = tuple(graphs)
    per = [node_columns(g) for g in gs]
    sizes = np.fromiter((len(g.nodes) for g in gs), dtype=np.int64, count=len(gs))
    offsets = np.zeros(len(gs) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    num = int(offsets[-1])
    graph_of = np.repeat(np.arange(len(gs), dtype=np.int64), sizes)
    local = np.arange(num, dtype=np.int64) - offsets[graph_of]
    ne = np.fromiter((c["src"].size for c in per), dtype=np.int64, count=len(gs))
    shift = np.repeat(offsets[:-1], ne)
    cat = np.concatenate
    return GraphStack(
        graphs=gs, nodes=[nd for g in gs for nd in g.nodes], offsets=offsets, graph_of=graph_of, local=local,
        src=cat([c["src"] for c in per]) + shift if per else np.zeros(0, dtype=np.int64),
        dst=cat([c["dst"] for c in per]) + shift if per else np.zeros(0, dtype=np.int64),
        **{k: cat([c[k] for c in per]) if per else np.zeros(0, dtype=_EMPTY.get(k, np.int64)) for k in _NODE_COLUMNS},
    )
