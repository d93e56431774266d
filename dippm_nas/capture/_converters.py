"""Extra PyTorch->Relax converters for ops the TVM frontend rejects in its fast (non-decomposing) mode.

Without them such models fall back to the decomposing mode, which costs seconds (swin_t ~10 s).
Each converter reproduces what PyTorch computes, expressed with existing Relax ops:

- ``scaled_dot_product_attention`` with a **boolean** ``attn_mask`` (BERT-style padding masks): the
  frontend accepts only float masks. PyTorch turns a boolean mask into an additive float mask inside
  SDPA; we emit the same ``where(mask, 0, -large)`` and hand over to the stock converter.
- ``fill_.Tensor`` (in-place fill with a 0-d tensor, used by swin's shifted-window masks): the frontend
  has only ``fill_.Scalar``; we emit ``full(shape, value)`` and rebind the filled tensor.
- ``scaled_dot_product_attention`` on tensors that are not 4-D (3-D: samvit's heads folded into the batch;
  5-D: hiera's mask units, Twins-SVT's windows): PyTorch's fused kernels (flash, memory-efficient, cuDNN)
  take only 4-D query, key and value, so eager PyTorch runs its math path, and so does the graph: ``q *
  sqrt(scale)``, ``k^T * sqrt(scale)``, ``matmul``, the additive mask, ``softmax``, ``matmul`` with ``v``
  (``_scaled_dot_product_attention_math``), which the prior prices as those kernels, at the inputs' dtype as
  PyTorch up to 2.4 runs them (2.5 and later cast q, k, v to float32 inside, which the graph does not show:
  docs/transformer_kernels.md, "Twins-SVT"). A causal one (or one with ``enable_gqa``) keeps the stock node,
  its leading dimensions merged into one batch dimension and split again on the output (a mask first
  broadcast to the full score shape, so its leading axes merge as q's do; a 3-D one runs as one batch of that
  many heads). A 4-D attention with a mask of lower rank, which the frontend rejects, gets the mask with
  leading axes of 1.
- ``layer_norm.default`` / ``group_norm.default`` with a weight but ``bias=None`` (poolformerv2): the
  frontend looks the ``None`` up as a tensor. Layer norm gets no bias, as a norm without either does;
  group norm, whose Relax op needs both, gets a zero bias (a constant of C elements, so the graph's
  ``param_count`` holds C more elements than the model).
- ``amax.default`` (hiera's mask-unit pooling): ``max`` over the same axes.
- ``div.Tensor_mode`` with a Python number (``x // 2`` on a float tensor, in xcit's and edgenext's position
  encodings): the frontend makes the number an ``int32`` constant, which Relax will not divide a float
  tensor by; we give the constant the tensor's dtype, as PyTorch's type promotion does.
- ``feature_dropout.default`` and ``to.device`` (channel dropout, a device move): the identity at inference
  on one device.
- ops the frontend has no fast-mode converter for, which sent whole timm families through the decomposing
  mode (0.2-2.5 s instead of 10-180 ms per model): ``addcmul`` (convnextv2's GRN), ``conv2d.padding``
  (``padding="same"/"valid"``, convmixer), ``repeat_interleave.self_int`` (convit, gcvit), ``div_.Tensor``
  (in place, convit), ``rms_norm`` (vit ``_xp``), ``var.dim`` (resnetv2 EvoNorm), ``swapaxes`` (torchvision's
  maxvit_t). Each is the Relax op PyTorch's definition names; ``div_`` also rebinds the divided tensor, as
  ``fill_`` does.
- ``cat.default`` with an empty 1-D tensor among 4-D ones (a ``transformers`` ``DynamicCache`` starts each
  layer's keys and values as ``torch.tensor([])``): PyTorch skips such inputs, the frontend's concat refuses
  them; we drop them and concatenate the rest (a single remaining tensor is passed through).

:func:`opaque_convert_map` is the last resort for an op no converter knows (``unfold``, ``im2col``...): an
*opaque* call that keeps the op's name, its tensor inputs and its output shapes and dtypes (from the
exported node), so the rest of the model is converted exactly and the op is counted as unknown.
"""

from __future__ import annotations

import math
import re
from typing import Any

from dippm_nas.graph import OPAQUE_PREFIX, SDPA_MATH_NAME

__all__ = ["custom_convert_map", "opaque_convert_map", "unsupported_ops"]

_UNSUPPORTED = re.compile(r"Unsupported function types \[([^\]]*)\]")


def unsupported_ops(message: str) -> list[str]:
    """The op names (``"unfold.default"``) of the frontend's "Unsupported function types [...]" error."""
    m = _UNSUPPORTED.search(message)
    return re.findall(r"'([^']+)'", m.group(1)) if m else []


def _dims(expr: Any) -> list[int]:
    """The static shape of a Relax tensor expression."""
    return [int(d) for d in expr.ty.shape]


def _sdpa_bool_mask(node: Any, importer: Any) -> Any:
    from tvm import relax

    mask_node = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if mask_node is None:
        return importer._scaled_dot_product_attention(node)
    mask = importer.env[mask_node]
    if str(mask.ty.dtype) != "bool":
        return importer._scaled_dot_product_attention(node)
    q = importer.env[node.args[0]]
    dt = str(q.ty.dtype)
    neg = -3.0e38 if dt == "float32" else -6.0e4
    additive = importer.block_builder.emit(
        relax.op.where(mask, relax.const(0.0, dt), relax.const(neg, dt))
    )
    importer.env[mask_node] = additive
    try:
        return importer._scaled_dot_product_attention(node)
    finally:
        importer.env[mask_node] = mask


def _fill_tensor(node: Any, importer: Any) -> Any:
    from tvm import relax

    x = importer.env[node.args[0]]
    value = importer.env[node.args[1]]
    dt = str(x.ty.dtype)
    if str(value.ty.dtype) != dt:
        value = importer.block_builder.emit(relax.op.astype(value, dt))
    filled = importer.block_builder.emit(relax.op.full(x.ty.shape, value, dt))
    importer.env[node.args[0]] = filled
    return filled


def _amax(node: Any, importer: Any) -> Any:
    from tvm import relax

    x = importer.env[node.args[0]]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", [])
    keep = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    axis = None if dims in (None, [], ()) else [int(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
    return importer.block_builder.emit(relax.op.max(x, axis=axis, keepdims=keep))


def _div_mode(node: Any, importer: Any) -> Any:
    from tvm import relax

    def value(arg: Any) -> Any:
        return importer.env[arg] if hasattr(arg, "op") and arg in importer.env else arg

    a, b = value(node.args[0]), value(node.args[1])

    def is_tensor(v: Any) -> bool:
        return isinstance(getattr(v, "ty", None), relax.TensorType)

    def is_number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def promote(tensor: Any, num: Any) -> tuple[Any, Any]:
        """PyTorch's promotion of ``tensor op number``: the tensor's dtype, or float32 for an int tensor
        and a float number."""
        dt = str(tensor.ty.dtype)
        if isinstance(num, float) and not dt.startswith(("float", "bfloat")):
            return importer.block_builder.emit(relax.op.astype(tensor, "float32")), relax.const(num, "float32")
        return tensor, relax.const(num, dt)

    if is_tensor(a) and is_number(b):
        a, b = promote(a, b)
    elif is_number(a) and is_tensor(b):
        b, a = promote(b, a)
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("rounding_mode")
    bb = importer.block_builder
    if mode is None:
        return bb.emit(relax.op.divide(a, b))
    if mode == "floor":
        return bb.emit(relax.op.floor_divide(a, b))
    if mode == "trunc":
        return bb.emit(relax.op.trunc(bb.emit(relax.op.divide(a, b))))
    raise ValueError(f"div: rounding_mode must be None, 'floor' or 'trunc', got {mode!r}")


def _layer_norm(node: Any, importer: Any) -> Any:
    args = node.args

    def optional(i: int) -> Any:
        return importer.env[args[i]] if len(args) > i and args[i] is not None else None

    eps = args[4] if len(args) > 4 else 1e-05
    return importer._layer_norm_impl(importer.env[args[0]], optional(2), optional(3), eps, args[1])


def _group_norm(node: Any, importer: Any) -> Any:
    import numpy as np
    from tvm import relax

    args = node.args
    x = importer.env[args[0]]
    shape = _dims(x)
    dt = str(x.ty.dtype)

    def optional(i: int, fill: float) -> Any:
        if len(args) > i and args[i] is not None:
            return importer.env[args[i]]
        return relax.const(np.full((shape[1],), fill, dtype=dt), dt)

    eps = args[4] if len(args) > 4 else 1e-05
    return importer.block_builder.emit(relax.op.nn.group_norm(
        x, optional(2, 1.0), optional(3, 0.0), num_groups=args[1], channel_axis=1,
        axes=list(range(2, len(shape))), epsilon=eps))


def _identity(node: Any, importer: Any) -> Any:
    return importer.env[node.args[0]]


def _addcmul(node: Any, importer: Any) -> Any:
    from tvm import relax

    x, t1, t2 = (importer.env[a] for a in node.args[:3])
    bb = importer.block_builder
    prod = bb.emit(relax.op.multiply(t1, t2))
    value = node.kwargs.get("value", 1)
    if value != 1:
        prod = bb.emit(relax.op.multiply(prod, relax.const(value, str(prod.ty.dtype))))
    return bb.emit(relax.op.add(x, prod))


def _conv2d_padding(node: Any, importer: Any) -> Any:
    args = list(node.args) + [None] * (7 - len(node.args))
    x, weight = importer.env[args[0]], importer.env[args[1]]
    bias = importer.env[args[2]] if args[2] is not None else None
    stride = list(args[3] or [1, 1])
    padding = args[4] or "valid"
    dilation = list(args[5] or [1, 1])
    groups = args[6] or 1
    if padding == "valid":
        pad = [0, 0, 0, 0]
    elif padding == "same":  # PyTorch: total dilation*(k-1) per axis, the odd one on the far side
        total = [d * (k - 1) for d, k in zip(dilation, _dims(weight)[2:])]
        pad = [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]
    else:
        raise ValueError(f"conv2d padding must be 'same' or 'valid', got {padding!r}")
    return importer._conv2d_impl(x, weight, bias=bias, strides=stride, padding=pad, dilation=dilation, groups=groups)


def _repeat_interleave(node: Any, importer: Any) -> Any:
    from tvm import relax

    x = importer.env[node.args[0]]
    repeats = node.args[1]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    if dim is None:  # PyTorch flattens first
        x, dim = importer.block_builder.emit(relax.op.reshape(x, [math.prod(_dims(x))])), 0
    return importer.block_builder.emit(relax.op.repeat(x, int(repeats), axis=int(dim)))


def _div_inplace(node: Any, importer: Any) -> Any:
    import operator

    from tvm import relax

    out = importer._binary_op(relax.op.divide, operator.truediv)(node)
    importer.env[node.args[0]] = out  # later readers of the tensor see it divided
    return out


def _rms_norm(node: Any, importer: Any) -> Any:
    import numpy as np
    import torch
    from tvm import relax

    args = list(node.args) + [None] * (4 - len(node.args))
    x = importer.env[args[0]]
    shape = [int(d) for d in args[1]]
    dt = str(x.ty.dtype)
    weight = importer.env[args[2]] if args[2] is not None else relax.const(np.ones(shape, dt), dt)
    eps = args[3] if args[3] is not None else torch.finfo(getattr(torch, dt)).eps
    axes = list(range(len(_dims(x)) - len(shape), len(_dims(x))))
    return importer.block_builder.emit(relax.op.nn.rms_norm(x, weight, axes=axes, epsilon=float(eps)))


def _var_dim(node: Any, importer: Any) -> Any:
    from tvm import relax

    x = importer.env[node.args[0]]
    dims = _dims(x)
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    unbiased = node.args[2] if len(node.args) > 2 else node.kwargs.get("unbiased", True)
    keepdim = node.args[3] if len(node.args) > 3 else node.kwargs.get("keepdim", False)
    dim = [dim] if isinstance(dim, int) else dim
    axes = list(range(len(dims))) if dim is None else [int(d) % len(dims) for d in dim]
    bb = importer.block_builder
    var = bb.emit(relax.op.variance(x, axes, keepdims=bool(keepdim)))
    if not unbiased:
        return var
    n = math.prod(dims[a] for a in axes)  # PyTorch gives NaN for a single element
    scale = float(n) / (n - 1) if n > 1 else float("nan")
    return bb.emit(relax.op.multiply(var, relax.const(scale, str(x.ty.dtype))))


def _swapaxes(node: Any, importer: Any) -> Any:
    from tvm import relax

    x = importer.env[node.args[0]]
    n = len(_dims(x))
    a, b = int(node.args[1]) % n, int(node.args[2]) % n
    perm = list(range(n))
    perm[a], perm[b] = perm[b], perm[a]
    return importer.block_builder.emit(relax.op.permute_dims(x, perm))


def _cat(node: Any, importer: Any) -> Any:
    from tvm import relax

    parts = [importer.env[n] for n in node.args[0]]
    if len({len(_dims(p)) for p in parts}) == 1:
        return importer._cat(node)  # the stock converter
    # PyTorch skips empty 1-D tensors in cat (a transformers DynamicCache starts as one)
    dim = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0))
    parts = [p for p in parts if _dims(p) != [0]]
    if len(parts) == 1:
        return parts[0]
    n = len(_dims(parts[0]))
    return importer.block_builder.emit(relax.op.concat(parts, axis=dim % n))


def _sdpa(node: Any, importer: Any) -> Any:
    from tvm import relax

    q_shape = _dims(importer.env[node.args[0]])
    mask_node = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    mask = importer.env.get(mask_node) if mask_node is not None else None
    if not isinstance(getattr(mask, "ty", None), relax.TensorType) or mask_node in node.args[:3]:
        mask_node = None
    if len(q_shape) < 3:
        return _sdpa_bool_mask(node, importer)
    fused_only = _sdpa_arg(node, 5, "is_causal", False) or _sdpa_arg(node, 7, "enable_gqa", False)
    if len(q_shape) != 4 and not fused_only:
        return _sdpa_math(node, importer, mask_node)
    bb = importer.block_builder
    saved = {}
    try:
        if len(q_shape) == 3:
            # (N, L, E) (samvit's heads folded into N): the frontend takes 2-D or 4-D, so it runs as one
            # batch of N heads, (1, N, L, E), with the mask given leading axes of 1
            for n in dict.fromkeys([*node.args[:3], mask_node]):
                if n is None:
                    continue
                v = importer.env[n]
                saved[n] = v
                importer.env[n] = bb.emit(relax.op.reshape(v, [1] * (4 - len(_dims(v))) + _dims(v)))
            v_dim = _dims(saved[node.args[2]])[-1]
            out = _sdpa_bool_mask(node, importer)
            return bb.emit(relax.op.reshape(out, [*q_shape[:-1], v_dim]))
        if len(q_shape) == 4:
            # the frontend wants a 4-D mask: a lower-rank one gets leading axes of 1 (how it broadcasts)
            if mask_node is not None and len(_dims(mask)) < 4:
                saved[mask_node] = mask
                importer.env[mask_node] = bb.emit(relax.op.reshape(mask, [1] * (4 - len(_dims(mask))) + _dims(mask)))
            return _sdpa_bool_mask(node, importer)
        # 5-D and more: leading axes merged into one batch axis. The mask broadcasts against
        # (*q_shape[:-1], Sk), so it is broadcast to that full shape first; merging its leading axes then
        # matches q's
        scores = [*q_shape[:-1], _dims(importer.env[node.args[1]])[-2]]
        for n in dict.fromkeys([*node.args[:3], mask_node]):  # distinct nodes, in order
            if n is None:
                continue
            v = importer.env[n]
            saved[n] = v
            if n is mask_node and _dims(v) != scores:
                v = bb.emit(relax.op.broadcast_to(v, scores))
            shape = _dims(v)
            importer.env[n] = bb.emit(relax.op.reshape(v, [math.prod(shape[:-3]), *shape[-3:]]))
        v_dim = _dims(saved[node.args[2]])[-1]
        out = _sdpa_bool_mask(node, importer)
    finally:
        importer.env.update(saved)
    return bb.emit(relax.op.reshape(out, [*q_shape[:-1], v_dim]))


def _sdpa_arg(node: Any, index: int, name: str, default: Any) -> Any:
    """Argument ``name`` (position ``index``) of an exported ``scaled_dot_product_attention`` call."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _sdpa_math(node: Any, importer: Any, mask_node: Any) -> Any:
    """PyTorch's math path of ``scaled_dot_product_attention`` (``_scaled_dot_product_attention_math``), the
    kernels eager runs for query, key and value that are not 4-D: ``q * sqrt(scale)`` and ``k^T * sqrt(scale)``,
    their ``matmul``, the additive mask (a boolean one as ``0`` / ``-large``), ``softmax`` over the keys and the
    ``matmul`` with ``v``; the nodes record the inputs' rank (``SDPA_RANK_ATTR``: PyTorch 2.14 on runs 3-D ones on
    the fused kernels, a prior rule keyed on the deployment's version)."""
    from tvm import relax

    bb = importer.block_builder
    q, k, v = (importer.env[a] for a in node.args[:3])
    hint = f"{SDPA_MATH_NAME}_rank{max(len(_dims(t)) for t in (q, k, v))}_"

    def emit(expr: Any) -> Any:  # each binding named so that the graph marks its node and the inputs' rank
        return bb.emit(expr, name_hint=hint)

    dt = str(q.ty.dtype)
    scale = _sdpa_arg(node, 6, "scale", None)
    root = math.sqrt(float(scale) if scale is not None else 1.0 / math.sqrt(_dims(q)[-1]))
    rank = len(_dims(k))
    kt = emit(relax.op.permute_dims(k, [*range(rank - 2), rank - 1, rank - 2]))
    attn = emit(relax.op.matmul(emit(relax.op.multiply(q, relax.const(root, dt))),
                                emit(relax.op.multiply(kt, relax.const(root, dt)))))
    if mask_node is not None:
        mask = importer.env[mask_node]
        if str(mask.ty.dtype) == "bool":
            neg = -3.0e38 if dt == "float32" else -6.0e4
            mask = emit(relax.op.where(mask, relax.const(0.0, dt), relax.const(neg, dt)))
        attn = emit(relax.op.add(attn, mask))
    return emit(relax.op.matmul(emit(relax.op.nn.softmax(attn, axis=-1)), v))


def custom_convert_map() -> dict[str, Any]:
    """The converters, keyed as the frontend's ``convert_map`` (``"<aten op>.<overload>"``)."""
    return {
        "scaled_dot_product_attention.default": _sdpa,
        "fill_.Tensor": _fill_tensor,
        "amax.default": _amax,
        "div.Tensor_mode": _div_mode,
        "layer_norm.default": _layer_norm,
        "group_norm.default": _group_norm,
        "feature_dropout.default": _identity,
        "to.device": _identity,
        "addcmul.default": _addcmul,
        "conv2d.padding": _conv2d_padding,
        "repeat_interleave.self_int": _repeat_interleave,
        "div_.Tensor": _div_inplace,
        "rms_norm.default": _rms_norm,
        "var.dim": _var_dim,
        "swapaxes.default": _swapaxes,
        "cat.default": _cat,
    }


def _tensor_type(val: Any) -> Any:
    from tvm import relax

    dtype = str(val.dtype).removeprefix("torch.")
    return relax.TensorType([int(d) for d in val.shape], dtype)


def _opaque(name: str) -> Any:
    def convert(node: Any, importer: Any) -> Any:
        import torch.fx
        from tvm import relax

        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        if not vals or not all(hasattr(v, "shape") and hasattr(v, "dtype") for v in vals):
            raise TypeError(f"opaque op {name}: the exported node has no tensor output metadata ({val!r})")
        inputs: list[Any] = []
        torch.fx.node.map_arg((node.args, node.kwargs), lambda n: inputs.append(importer.env.get(n)) or n)
        # tensors, and tuples of them (an op fed a whole multi-output value): the graph reads a tuple's
        # fields as inputs, so its producers keep their dataflow edges into the opaque node
        tensors = [e for e in inputs if isinstance(getattr(e, "ty", None), (relax.TensorType, relax.TupleType))]
        types = [_tensor_type(v) for v in vals]
        call = relax.call_dps_packed(relax.ExternFunc(OPAQUE_PREFIX + name), relax.Tuple(tensors),
                                     types if isinstance(val, (list, tuple)) else types[0])
        return importer.block_builder.emit(call)

    return convert


def opaque_convert_map(names: list[str]) -> dict[str, Any]:
    """Opaque converters for the frontend op names ``names`` (``"unfold.default"``), on top of
    :func:`custom_convert_map`. The node is named after the op without its overload (``unfold``)."""
    return {**custom_convert_map(), **{n: _opaque(n.split(".")[0]) for n in names}}
