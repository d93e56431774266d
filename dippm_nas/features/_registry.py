"""The op-encoder registry: how each Relax operator becomes a token and a fixed-width attribute vector.

An *encoder* maps one :class:`~dippm_nas.graph.OpNode` to ``(token, attrs)``: ``token`` is one slot of
the fixed vocabulary :data:`TOKENS` (several ops may share a slot, e.g. every binary element-wise op)
and ``attrs`` up to :data:`ATTR_WIDTH` numbers describing the call (kernel size, strides, groups,
matmul dimensions...), already on a log/unit scale.

Registration rejects duplicates (:func:`register_op_encoder` raises unless ``replace=True``). An op
without an encoder is never encoded as zeros: :func:`encode_op` gives it the ``"unknown"`` token plus
its op class (the node's FLOPs, bytes, shapes and prior time are still features), counts it in
:func:`unknown_op_counts` and warns once per op per process.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dippm_nas.errors import DippmNasError, InvalidValueError, UnsupportedOpError
from dippm_nas.graph import OP_CLASSES, OpNode, known_ops, op_class_of

__all__ = [
    "TOKENS", "ATTR_WIDTH", "OpEncoder", "EncoderFn", "register_op_encoder", "unregister_op_encoder",
    "get_op_encoder", "registered_ops", "encode_op", "unknown_op_counts", "reset_unknown_op_counts",
    "encoders_version",
]

logger = logging.getLogger(__name__)

#: The token vocabulary (one-hot slots). Changing it changes FEATURE_SCHEMA_VERSION.
TOKENS: tuple[str, ...] = (
    "conv2d", "conv2d_depthwise", "conv_other", "matmul", "attention",
    "add", "multiply", "ewise_other", "relu", "activation_other",
    "batch_norm", "layer_norm", "norm_other", "pool_max", "pool_avg", "pool_adaptive",
    "reduction", "softmax", "concat", "memory_other", "gather", "cast", "view", "unknown",
)
#: Width of the per-op attribute vector.
ATTR_WIDTH = 8

#: ``(node) -> (token, attrs)``.
EncoderFn = Callable[[OpNode], "tuple[str, Sequence[float]]"]


@dataclass(frozen=True)
class OpEncoder:
    """One registered encoder.

    Attributes:
        op: Relax op name without ``relax.``.
        fn: ``(node) -> (token, attrs)``; ``token`` in :data:`TOKENS`, ``len(attrs) <= ATTR_WIDTH``.
    """

    op: str
    fn: EncoderFn


_ENCODERS: dict[str, OpEncoder] = {}
#: Bumped on every change of the registry (memos of encoded nodes compare it).
_VERSION = [0]
_UNKNOWN: dict[str, int] = {}
_WARNED: set[str] = set()
_LOCK = threading.Lock()


def register_op_encoder(op: str, fn: EncoderFn, *, replace: bool = False) -> None:
    """Register the encoder of ``op``.

    Args:
        op: Relax op name without ``relax.``, e.g. ``"nn.conv2d"``.
        fn: ``(node) -> (token, attrs)``, a function of the node's op, attributes, shapes, dtype and parameter
            flags (the batched feature path reuses its answer for nodes that share those).
        replace: allow replacing an existing encoder (default False: duplicates are an error).

    Raises:
        DippmNasError: ``op`` already has an encoder and ``replace`` is False.
    """
    if not isinstance(op, str) or not op:
        raise InvalidValueError(f"op must be a non-empty string, got {op!r}")
    with _LOCK:
        if op in _ENCODERS and not replace:
            raise DippmNasError(
                f"op {op!r} already has an encoder; pass replace=True to override it "
                f"({len(_ENCODERS)} ops registered)"
            )
        _ENCODERS[op] = OpEncoder(op, fn)
        _VERSION[0] += 1


def unregister_op_encoder(op: str) -> None:
    """Remove the encoder of ``op`` (a ``KeyError``-free no-op when there is none)."""
    with _LOCK:
        _ENCODERS.pop(op, None)
        _VERSION[0] += 1


def encoders_version() -> int:
    """A number that changes on every registration or removal of an encoder (memos of encoded nodes compare it)."""
    return _VERSION[0]


def get_op_encoder(op: str) -> OpEncoder:
    """The encoder of ``op``.

    Raises:
        UnsupportedOpError: no encoder is registered (the message lists the registered ops).
    """
    try:
        return _ENCODERS[op]
    except KeyError:
        raise UnsupportedOpError(f"no op encoder for {op!r}; registered: {sorted(_ENCODERS)}") from None


def registered_ops() -> list[str]:
    """Ops with an encoder, sorted."""
    return sorted(_ENCODERS)


def unknown_op_counts() -> dict[str, int]:
    """``{op: nodes seen}`` of ops encoded without an encoder since the process started (or the last reset)."""
    return dict(_UNKNOWN)


def reset_unknown_op_counts() -> None:
    """Forget the unknown-op counts and warnings (tests)."""
    with _LOCK:
        _UNKNOWN.clear()
        _WARNED.clear()


def encode_op(node: OpNode) -> tuple[str, list[float], bool]:
    """``(token, attrs padded to ATTR_WIDTH, known)`` of one node.

    Unknown ops (no encoder) get the ``"unknown"`` token and attributes from their op class; they are
    counted and warned about once per op.
    """
    enc = _ENCODERS.get(node.op)
    if enc is None:
        with _LOCK:
            _UNKNOWN[node.op] = _UNKNOWN.get(node.op, 0) + 1
            first = node.op not in _WARNED
            _WARNED.add(node.op)
        if first:
            msg = (f"op {node.op!r} (class {node.op_class!r}) has no feature encoder: encoded as token "
                   "'unknown' with its class, FLOPs, bytes and shapes; the prediction is flagged")
            logger.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
        return "unknown", _pad(_generic_attrs(node)), False
    token, attrs = enc.fn(node)
    if token not in _TOKEN_SET:
        raise InvalidValueError(f"encoder of {node.op!r} returned token {token!r}; valid tokens: {list(TOKENS)}")
    if len(attrs) > ATTR_WIDTH:
        raise InvalidValueError(f"encoder of {node.op!r} returned {len(attrs)} attributes, "
                                f"at most {ATTR_WIDTH} allowed")
    return token, _pad(attrs), True


_TOKEN_SET = frozenset(TOKENS)


def _pad(attrs: Sequence[float]) -> list[float]:
    out = [float(a) for a in attrs]
    return out + [0.0] * (ATTR_WIDTH - len(out))


def _l(x: float) -> float:
    """log2(1 + x): the scale every size attribute uses."""
    return math.log2(1.0 + max(float(x), 0.0))


def _generic_attrs(node: OpNode) -> list[float]:
    """Op-class index, input count, param inputs and broadcast flag: what any node has."""
    cls = OP_CLASSES.index(node.op_class) if node.op_class in OP_CLASSES else len(OP_CLASSES)
    return [cls / len(OP_CLASSES), float(len(node.input_shapes)), float(sum(node.input_is_param)),
            float(_broadcasts(node))]


def _broadcasts(node: OpNode) -> bool:
    act = [s for s, p in zip(node.input_shapes, node.input_is_param) if len(s) > 0]
    return len({tuple(s) for s in act}) > 1


# ------------------------------------------------------------------ built-in encoders
def _conv(node: OpNode) -> tuple[str, list[float]]:
    a = node.attrs
    k = list(a.get("kernel") or [1])
    st = list(a.get("strides") or [1])
    dil = list(a.get("dilation") or [1])
    groups = int(a.get("groups", 1) or 1)
    dw = bool(a.get("depthwise", False))
    nd = len(k)
    token = ("conv2d_depthwise" if dw else "conv2d") if node.op == "nn.conv2d" else "conv_other"
    return token, [
        float(k[0]), float(k[-1]), float(st[0]), float(max(dil)), _l(groups), float(dw),
        _l(a.get("in_channels_per_group", 0)), _l(a.get("out_channels", 0)) + (0.5 if nd != 2 else 0.0),
    ]


def _matmul(node: OpNode) -> tuple[str, list[float]]:
    a = node.attrs
    return "matmul", [_l(a.get("m", 0)), _l(a.get("n", 0)), _l(a.get("k", 0)), _l(a.get("batch", 1)),
                      float(any(node.input_is_param))]


def _attention(node: OpNode) -> tuple[str, list[float]]:
    a = node.attrs
    return "attention", [_l(a.get("batch", 1)), _l(a.get("seq_q", 0)), _l(a.get("seq_k", 0)),
                         _l(a.get("heads", 1)), _l(a.get("head_dim", 0)), float(a.get("causal_mask") not in (None, ""))]


def _pool(token: str) -> EncoderFn:
    def fn(node: OpNode) -> tuple[str, list[float]]:
        a = node.attrs
        w = list(a.get("pool_size") or a.get("window") or [0])
        st = list(a.get("strides") or [1])
        out = list(a.get("output_size") or [0])
        return token, [float(w[0]) if w else 0.0, float(st[0]) if st else 1.0, _l(out[0] if out else 0)]
    return fn


def _simple(token: str) -> EncoderFn:
    def fn(node: OpNode) -> tuple[str, list[float]]:
        return token, [float(len(node.input_shapes)), float(sum(node.input_is_param)), float(_broadcasts(node))]
    return fn


def _norm(token: str) -> EncoderFn:
    def fn(node: OpNode) -> tuple[str, list[float]]:
        a = node.attrs
        axes = a.get("axes", a.get("axis", -1))
        n_axes = len(axes) if isinstance(axes, (list, tuple)) else 1
        ch = node.input_shapes[1][0] if len(node.input_shapes) > 1 and node.input_shapes[1] else 0
        return token, [float(n_axes), _l(ch)]
    return fn


def _register_builtins() -> None:
    for op in ("nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose",
               "nn.conv3d_transpose"):
        register_op_encoder(op, _conv)
    for op in ("matmul", "nn.dense", "nn.linear", "einsum"):
        register_op_encoder(op, _matmul)
    register_op_encoder("nn.attention", _attention)
    register_op_encoder("nn.attention_bias", _attention)  # same work; the additive mask is an extra input
    for op in ("nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d"):
        register_op_encoder(op, _pool("pool_max"))
    for op in ("nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d"):
        register_op_encoder(op, _pool("pool_avg"))
    for op in ("nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d",
               "nn.adaptive_max_pool2d"):
        register_op_encoder(op, _pool("pool_adaptive"))
    register_op_encoder("nn.batch_norm", _norm("batch_norm"))
    register_op_encoder("nn.layer_norm", _norm("layer_norm"))
    for op in ("nn.group_norm", "nn.instance_norm", "nn.rms_norm", "nn.l2_norm"):
        register_op_encoder(op, _norm("norm_other"))
    register_op_encoder("add", _simple("add"))
    register_op_encoder("multiply", _simple("multiply"))
    register_op_encoder("nn.relu", _simple("relu"))
    register_op_encoder("concat", _simple("concat"))
    for op in ("nn.softmax", "nn.log_softmax"):
        register_op_encoder(op, _simple("softmax"))
    by_class = {"elementwise": "ewise_other", "activation": "activation_other", "reduction": "reduction",
                "memory": "memory_other", "gather": "gather", "cast": "cast", "view": "view",
                "softmax": "softmax", "normalization": "norm_other", "pool": "pool_avg"}
    for op in known_ops():
        if op in _ENCODERS:
            continue
        cls = op_class_of(op)
        if cls in by_class:
            register_op_encoder(op, _simple(by_class[cls]))
