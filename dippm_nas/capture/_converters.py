"""Extra PyTorch->Relax converters for ops the TVM frontend rejects in its fast (non-decomposing) mode.

Without them such models fall back to the decomposing mode, which costs seconds (swin_t ~10 s).
Each converter reproduces what PyTorch computes, expressed with existing Relax ops:

- ``scaled_dot_product_attention`` with a **boolean** ``attn_mask`` (BERT-style padding masks): the
  frontend accepts only float masks. PyTorch turns a boolean mask into an additive float mask inside
  SDPA; we emit the same ``where(mask, 0, -large)`` and hand over to the stock converter.
- ``fill_.Tensor`` (in-place fill with a 0-d tensor, used by swin's shifted-window masks): the frontend
  has only ``fill_.Scalar``; we emit ``full(shape, value)`` and rebind the filled tensor.
"""

from __future__ import annotations

from typing import Any

__all__ = ["custom_convert_map"]


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


def custom_convert_map() -> dict[str, Any]:
    """The converters, keyed as the frontend's ``convert_map`` (``"<aten op>.<overload>"``)."""
    return {
        "scaled_dot_product_attention.default": _sdpa_bool_mask,
        "fill_.Tensor": _fill_tensor,
    }
