"""Features: op-encoder registry, graph coarsening, node/static/device feature tensors for the GNN."""

from dippm_nas.features._coarsen import FUSABLE_CLASSES, KernelGraph, coarsen
from dippm_nas.features._features import (
    FEATURE_SCHEMA_VERSION,
    STYLES,
    GraphFeatures,
    device_dim,
    device_features,
    featurize,
    node_dim,
    static_dim,
    static_dtype_columns,
)
from dippm_nas.features._many import MANY_MIN_GRAPHS, featurize_many
from dippm_nas.features._registry import (
    ATTR_WIDTH,
    TOKENS,
    OpEncoder,
    _register_builtins,
    encode_op,
    get_op_encoder,
    register_op_encoder,
    registered_ops,
    reset_unknown_op_counts,
    unknown_op_counts,
    unregister_op_encoder,
)

_register_builtins()

__all__ = [
    "FEATURE_SCHEMA_VERSION", "STYLES", "GraphFeatures", "featurize", "featurize_many", "MANY_MIN_GRAPHS",
    "node_dim", "static_dim", "static_dtype_columns", "device_dim", "device_features", "coarsen", "KernelGraph", "FUSABLE_CLASSES",
    "TOKENS", "ATTR_WIDTH", "OpEncoder", "register_op_encoder", "unregister_op_encoder", "get_op_encoder",
    "registered_ops", "encode_op", "unknown_op_counts", "reset_unknown_op_counts",
]
