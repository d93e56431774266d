"""The operator graph: nodes, dataflow edges, per-node FLOPs/bytes, fingerprints, PyG conversion."""

from dippm_nas.graph._formulas import OP_CLASSES, NodeCost, cost_of, known_ops, op_class_of
from dippm_nas.graph._graph import (GRAPH_FORMAT_VERSION, READABLE_GRAPH_FORMATS, STRUCTURAL_HASH_VERSION, OperatorGraph,
                                    OpNode, StaticFeatures)
from dippm_nas.graph._stack import GraphStack, adopt_node_columns, node_columns, stack_graphs
from dippm_nas.graph._relax import OPAQUE_PREFIX, SDPA_MATH_ATTR, SDPA_MATH_NAME, SDPA_RANK_ATTR, graph_from_relax
from dippm_nas.graph._synthetic import synthetic_resnet_graph

__all__ = [
    "OperatorGraph", "OpNode", "StaticFeatures", "GRAPH_FORMAT_VERSION", "READABLE_GRAPH_FORMATS",
    "STRUCTURAL_HASH_VERSION", "OP_CLASSES", "op_class_of",
    "known_ops", "cost_of", "NodeCost", "graph_from_relax", "OPAQUE_PREFIX", "SDPA_MATH_ATTR", "SDPA_MATH_NAME", "SDPA_RANK_ATTR", "synthetic_resnet_graph",
    "GraphStack", "stack_graphs", "node_columns", "adopt_node_columns",
]
