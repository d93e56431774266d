"""Per-operator formulas: op class, FLOPs, MACs, bytes moved and derived attributes.

Conventions (documented so every consumer reads the numbers the same way):

- A multiply-add counts as 2 FLOPs; ``macs`` is non-zero only for contraction ops (convolutions, matmul,
  attention), so ``2 * macs`` is what :mod:`torch.utils.flop_counter` reports for CNNs, and
  ``flops`` additionally counts the arithmetic of element-wise, normalisation, pooling and reduction ops.
- Element-wise FLOPs are per output element: 1 for add/sub/mul/div/relu/compare, a documented small
  constant for transcendental activations (see ``_ELEMENTWISE``).
- Bytes: every tensor argument is read once and every output written once (``bytes_read``,
  ``bytes_written``). View-class ops (reshape, squeeze, expand_dims, flatten, permute_dims,
  broadcast_to, strided_slice, split, dropout at inference) are views or strided accesses in PyTorch
  eager: they move no data and launch no kernel, so they count 0 bytes and 0 FLOPs.
- Ops without a formula get op_class ``unknown``, 1 FLOP per output element and their bytes, are
  flagged ``known=False`` and warned about once per process.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["NodeCost", "OP_CLASSES", "op_class_of", "cost_of", "known_ops"]

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]

OP_CLASSES: tuple[str, ...] = (
    "conv", "matmul", "attention", "elementwise", "activation", "normalization", "pool", "reduction",
    "softmax", "view", "memory", "gather", "cast", "unknown",
)


@dataclass(frozen=True)
class NodeCost:
    """What a formula returns for one node."""

    op_class: str
    flops: int
    macs: int
    view: bool
    derived_attrs: dict[str, Any]
    known: bool = True


def _numel(s: Sequence[int]) -> int:
    return math.prod(s) if s else 1


# Element-wise ops: FLOPs per output element. Transcendentals count a small constant (a
# polynomial/exp evaluation); they are memory-bound on GPUs, so the constant matters little.
_ELEMENTWISE: dict[str, tuple[str, int]] = {
    **{op: ("elementwise", 1) for op in (
        "add", "subtract", "multiply", "divide", "floor_divide", "floor_mod", "mod", "maximum", "minimum",
        "negative", "abs", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
        "logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_and", "bitwise_or",
        "bitwise_xor", "bitwise_not", "left_shift", "right_shift", "where", "clip", "sign", "round",
        "floor", "ceil", "trunc", "square", "isfinite", "isinf", "isnan",
    )},
    "power": ("elementwise", 4), "sqrt": ("elementwise", 2), "rsqrt": ("elementwise", 2),
    "exp": ("elementwise", 4), "log": ("elementwise", 4), "log_add_exp": ("elementwise", 8),
    "sin": ("elementwise", 4), "cos": ("elementwise", 4), "tan": ("elementwise", 4),
    "asin": ("elementwise", 4), "acos": ("elementwise", 4), "atan": ("elementwise", 4),
    "atan2": ("elementwise", 4), "sinh": ("elementwise", 4), "cosh": ("elementwise", 4),
    "asinh": ("elementwise", 4), "acosh": ("elementwise", 4), "atanh": ("elementwise", 4),
    "erf": ("elementwise", 4), "ewise_fma": ("elementwise", 2),
    "nn.relu": ("activation", 1), "nn.leakyrelu": ("activation", 2), "nn.prelu": ("activation", 2),
    "sigmoid": ("activation", 4), "tanh": ("activation", 4), "nn.silu": ("activation", 5),
    "nn.gelu": ("activation", 8), "nn.gelu_tanh": ("activation", 8), "nn.selu": ("activation", 5),
    "nn.softplus": ("activation", 5),
    "image.resize2d": ("elementwise", 4), "image.resize3d": ("elementwise", 8),
}

_VIEW_OPS = frozenset({
    "reshape", "squeeze", "expand_dims", "flatten", "nn.batch_flatten", "permute_dims", "broadcast_to",
    "strided_slice", "dynamic_strided_slice", "split", "nn.dropout", "memory.view",
})
_MEMORY_OPS = frozenset({
    "concat", "stack", "tile", "repeat", "nn.pad", "flip", "layout_transform", "nn.pixel_shuffle",
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "eye", "eye_like",
    "tril", "triu", "slice_scatter", "index_put", "scatter_elements", "scatter_nd", "meshgrid",
})
_GATHER_OPS = frozenset({"take", "gather_elements", "gather_nd", "index_tensor", "one_hot"})
_REDUCTIONS = frozenset({
    "sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin", "median", "cumsum",
    "cumprod", "collapse_sum_like", "collapse_sum_to",
})
_CAST_OPS = frozenset({"astype", "wrap_param", "quantize", "dequantize"})


def _conv(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape], attrs: dict[str, Any], transpose: bool) -> NodeCost:
    data, weight = in_shapes[0], in_shapes[1]
    klayout = str(attrs.get("kernel_layout") or ("IOHW" if transpose else "OIHW"))
    # kernel spatial dims: the layout letters other than O and I, in order
    spatial = [weight[i] for i, c in enumerate(klayout[: len(weight)]) if c not in "OI"]
    groups = int(attrs.get("groups", 1) or 1)
    out_elems = _numel(out_shapes[0])
    if transpose:
        # each input element scatters into (O / groups) * prod(kernel) outputs
        o_idx = klayout.index("O")
        out_per_group = weight[o_idx]  # weight is (I, O/groups, k...)
        macs = _numel(data) * out_per_group * _numel(spatial)
        in_per_group = weight[klayout.index("I")] // max(groups, 1)
    else:
        in_per_group = weight[klayout.index("I")]
        macs = out_elems * in_per_group * _numel(spatial)
    out_channels = weight[klayout.index("O")] * (groups if transpose else 1)
    derived = {
        "kernel": list(spatial),
        "in_channels_per_group": int(in_per_group),
        "out_channels": int(out_channels),
        "depthwise": bool(groups > 1 and in_per_group == 1),
    }
    return NodeCost("conv", 2 * macs, macs, False, derived)


def _matmul(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape], attrs: dict[str, Any]) -> NodeCost:
    a, b = in_shapes[0], in_shapes[1]
    k = a[-1] if a else 1
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1] if len(b) >= 2 else 1
    out_elems = _numel(out_shapes[0])
    batch = out_elems // max(m * n, 1)
    macs = out_elems * k
    return NodeCost("matmul", 2 * macs, macs, False, {"m": int(m), "n": int(n), "k": int(k), "batch": int(batch)})


def _einsum(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape], attrs: dict[str, Any]) -> NodeCost:
    # MACs = product of the sizes of every distinct index letter in the equation.
    eq = str(attrs.get("subscripts", ""))
    lhs = eq.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs, in_shapes):
        for c, d in zip(term.strip(), shape):
            sizes[c] = max(sizes.get(c, 1), d)
    macs = _numel(list(sizes.values())) if sizes else _numel(out_shapes[0])
    return NodeCost("matmul", 2 * macs, macs, False, {"subscripts": eq})


def _attention(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape], attrs: dict[str, Any]) -> NodeCost:
    # Relax nn.attention: q (B, Sq, N, H), k (B, Sk, N, H), v (B, Sk, N, Hv); out (B, Sq, N, Hv).
    q, k, v = in_shapes[0], in_shapes[1], in_shapes[2]
    b, sq, heads, h = q
    sk, hv = k[1], v[-1]
    scores = b * heads * sq * sk
    macs = scores * h + scores * hv
    causal = attrs.get("causal_mask") not in (None, "")
    flops = 2 * macs + 5 * scores  # + softmax over the score matrix (max, sub, exp, sum, div)
    derived = {"batch": int(b), "seq_q": int(sq), "seq_k": int(sk), "heads": int(heads), "head_dim": int(h),
               "head_dim_v": int(hv), "causal": bool(causal)}
    return NodeCost("attention", flops, macs, False, derived)


def _pool(op: str, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape], attrs: dict[str, Any]) -> NodeCost:
    if "adaptive" in op:
        flops = _numel(in_shapes[0])
        window: list[int] = []
    else:
        window = [int(p) for p in attrs.get("pool_size", [])]
        flops = _numel(out_shapes[0]) * _numel(window)
    return NodeCost("pool", flops, 0, False, {"window": window})


_NORM_FLOPS_PER_ELEM = {"nn.batch_norm": 2, "nn.layer_norm": 8, "nn.group_norm": 8, "nn.instance_norm": 8,
                        "nn.rms_norm": 6}


def known_ops() -> frozenset[str]:
    """Every Relax op (without ``relax.``) that has a formula."""
    return frozenset(
        set(_ELEMENTWISE) | _VIEW_OPS | _MEMORY_OPS | _GATHER_OPS | _REDUCTIONS | _CAST_OPS
        | set(_NORM_FLOPS_PER_ELEM)
        | {"nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose",
           "nn.conv3d_transpose", "matmul", "einsum", "outer", "nn.attention", "nn.attention_bias",
           "nn.softmax", "nn.log_softmax", "nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d",
           "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d", "nn.adaptive_avg_pool1d",
           "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d", "topk", "sort", "argsort"}
    )


def op_class_of(op: str) -> str:
    """The op class of a Relax op name (``"unknown"`` when dippm-nas has no formula)."""
    if op in _ELEMENTWISE:
        return _ELEMENTWISE[op][0]
    if op.startswith("nn.conv"):
        return "conv"
    if op in ("matmul", "einsum", "outer"):
        return "matmul"
    if op.startswith("nn.attention"):
        return "attention"
    if op in _NORM_FLOPS_PER_ELEM:
        return "normalization"
    if "pool" in op and op.startswith("nn."):
        return "pool"
    if op in ("nn.softmax", "nn.log_softmax"):
        return "softmax"
    if op in _VIEW_OPS:
        return "view"
    if op in _MEMORY_OPS:
        return "memory"
    if op in _GATHER_OPS:
        return "gather"
    if op in _REDUCTIONS or op in ("topk", "sort", "argsort"):
        return "reduction"
    if op in _CAST_OPS:
        return "cast"
    return "unknown"


_warned_unknown: set[str] = set()


def _warn_unknown(op: str) -> None:
    if op not in _warned_unknown:
        _warned_unknown.add(op)
        msg = (f"operator {op!r} has no FLOP formula in dippm-nas: it stays in the graph as a generic node "
               f"(1 FLOP per output element, its bytes) and is flagged known=False")
        logger.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def cost_of(op: str, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape], attrs: dict[str, Any]) -> NodeCost:
    """FLOPs, MACs, class and derived attributes of one op call.

    Args:
        op: Relax op name without ``relax.``.
        in_shapes: shapes of the tensor arguments, in order.
        out_shapes: shapes of the outputs.
        attrs: the op's attributes as JSON values.
    """
    out0 = _numel(out_shapes[0]) if out_shapes else 0
    cls = op_class_of(op)
    if cls == "conv" and len(in_shapes) >= 2:
        return _conv(in_shapes, out_shapes, attrs, transpose=op.endswith("_transpose"))
    if op == "matmul" and len(in_shapes) >= 2:
        return _matmul(in_shapes, out_shapes, attrs)
    if op == "outer":
        return NodeCost("matmul", 2 * out0, out0, False, {"m": out0, "n": 1, "k": 1, "batch": 1})
    if op == "einsum":
        return _einsum(in_shapes, out_shapes, attrs)
    if cls == "attention" and len(in_shapes) >= 3 and len(in_shapes[0]) == 4:
        return _attention(in_shapes, out_shapes, attrs)
    if cls == "pool":
        return _pool(op, in_shapes, out_shapes, attrs)
    if cls == "normalization":
        return NodeCost(cls, _NORM_FLOPS_PER_ELEM[op] * out0, 0, False, {})
    if cls == "softmax":
        return NodeCost(cls, 5 * out0, 0, False, {})
    if cls in ("elementwise", "activation"):
        return NodeCost(cls, _ELEMENTWISE[op][1] * out0, 0, False, {})
    if cls == "view":
        return NodeCost(cls, 0, 0, True, {})
    if cls in ("memory", "gather", "cast"):
        return NodeCost(cls, 0, 0, False, {})
    if cls == "reduction":
        return NodeCost(cls, _numel(in_shapes[0]) if in_shapes else out0, 0, False, {})
    _warn_unknown(op)
    return NodeCost("unknown", out0, 0, False, {}, known=False)
