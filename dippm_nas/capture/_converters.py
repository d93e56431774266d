"""Extra PyTorch->Relax converters for ops the TVM frontend rejects in its fast (non-decomposing) mode.

Without them such models fall back to the decomposing mode, which costs seconds (swin_t ~10 s).
Each converter reproduces what PyTorch computes, expressed with existing Relax ops:

- ``scaled_dot_product_attention`` with a **boolean** ``attn_mask`` (BERT-style padding masks): the
  frontend accepts only float masks. PyTorch turns a boolean mask into an additive float mask inside
  SDPA; we emit the same ``where(mask, 0, -large)`` and hand over to the stock converter.
- ``fill_.Tensor`` (in-place fill with a 0-d tensor, used by swin's shifted-window masks): the frontend
  has only ``fill_.Scalar``; we emit ``full(shape, value)`` and rebind the filled tensor.
- ``amax.default`` (hiera's mask-unit pooling): ``max`` over the same axes.
- ``feature_dropout.default`` and ``to.device`` (channel dropout, a device move): the identity at inference
  on one device.

:func:`opaque_convert_map` is the last resort for an op no converter knows (``unfold``, ``im2col``...): an
*opaque* call that keeps the op's name, its tensor inputs and its output shapes and dtypes (from the
exported node), so the rest of the model is converted exactly and the op is counted as unknown.
"""

from __future__ import annotations

import re
from typing import Any

from dippm_nas.graph._relax import OPAQUE_PREFIX

__all__ = ["custom_convert_map", "opaque_convert_map", "OPAQUE_PREFIX", "unsupported_ops"]

_UNSUPPORTED = re.compile(r"Unsupported function types \[([^\]]*)\]")


def unsupported_ops(message: str) -> list[str]:
    """The op names (``"unfold.default"``) of the frontend's "Unsupported function types [...]" error."""
    m = _UNSUPPORTED.search(message)
    return re.findall(r"'([^']+)'", m.group(1)) if m else []


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


def _identity(node: Any, importer: Any) -> Any:
    return importer.env[node.args[0]]


def custom_convert_map() -> dict[str, Any]:
    """The converters, keyed as the frontend's ``convert_map`` (``"<aten op>.<overload>"``)."""
    return {
        "scaled_dot_product_attention.default": _sdpa_bool_mask,
        "fill_.Tensor": _fill_tensor,
        "amax.default": _amax,
        "feature_dropout.default": _identity,
        "to.device": _identity,
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
        tensors = [e for e in inputs if isinstance(getattr(e, "ty", None), relax.TensorType)]
        types = [_tensor_type(v) for v in vals]
        call = relax.call_dps_packed(relax.ExternFunc(OPAQUE_PREFIX + name), relax.Tuple(tensors),
                                     types if isinstance(val, (list, tuple)) else types[0])
        return importer.block_builder.emit(call)

    return convert


def opaque_convert_map(names: list[str]) -> dict[str, Any]:
    """Opaque converters for the frontend op names ``names`` (``"unfold.default"``), on top of
    :func:`custom_convert_map`. The node is named after the op without its overload (``unfold``)."""
    return {**custom_convert_map(), **{n: _opaque(n.split(".")[0]) for n in names}}
