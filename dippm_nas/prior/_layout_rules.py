"""Eager copies that memory layout decides, for graphs captured from a PyTorch module (graph format 2).

A graph's ``reshape`` is eager PyTorch's ``Tensor.reshape``: a view where the input's strides allow one, else
a copy (``clone`` then ``_unsafe_view``): Swin's ``window_partition`` (``x.view(..).permute(..).reshape(..)``)
and the ``x.transpose(1, 2).reshape(B, N, C)`` after an attention copy. A batched ``matmul`` folds its
operands' batch dimensions with ``reshape`` too, so an operand whose layout cannot be folded (a permuted key,
a query scaled elementwise in its permuted layout) is copied while the matmul runs.

The strides are followed through the graph as eager would lay tensors out: a computing node writes a dense
tensor, in the memory order of its one same-shaped activation input for an elementwise node (TensorIterator
keeps it), row-major otherwise; ``permute_dims`` permutes strides, ``expand_dims`` / ``squeeze`` / ``split``
keep the others, ``reshape`` follows PyTorch's ``computeStride``. Another view operator leaves the layout
unknown, and an unknown layout makes no copy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dippm_nas.graph import OpNode

__all__ = ["layout_copies"]

Strides = tuple[int, ...]


def _contiguous(shape: Sequence[int]) -> Strides:
    out, run = [], 1
    for d in reversed(shape):
        out.append(run)
        run *= max(int(d), 1)
    return tuple(reversed(out))


def _dense_like(shape: Sequence[int], strides: Strides) -> Strides:
    """Dense strides of ``shape`` in the memory order of ``strides`` (outermost = largest stride)."""
    order = sorted(range(len(shape)), key=lambda d: (strides[d], d), reverse=True)
    out = [0] * len(shape)
    run = 1
    for d in reversed(order):
        out[d] = run
        run *= max(int(shape[d]), 1)
    return tuple(out)


def view_strides(old: Sequence[int], stride: Strides, new: Sequence[int]) -> Strides | None:
    """PyTorch's ``computeStride``: the strides of ``new`` as a view of a tensor of shape ``old`` and strides
    ``stride``, or ``None`` where no view exists (``reshape`` then copies)."""
    if not old or math.prod(old) == 0:
        return _contiguous(new)
    out = [0] * len(new)
    view_d = len(new) - 1
    base = stride[-1]
    t_numel = v_numel = 1
    for d in range(len(old) - 1, -1, -1):
        t_numel *= old[d]
        if d == 0 or (old[d - 1] != 1 and stride[d - 1] != t_numel * base):
            while view_d >= 0 and (v_numel < t_numel or new[view_d] == 1):
                out[view_d] = v_numel * base
                v_numel *= new[view_d]
                view_d -= 1
            if v_numel != t_numel:
                return None
            if d > 0:
                base = stride[d - 1]
                t_numel = v_numel = 1
    return tuple(out) if view_d == -1 else None


def _axes(attr: object, ndim: int) -> list[int]:
    if attr is None:
        return list(range(ndim))
    items = attr if isinstance(attr, (list, tuple)) else [attr]
    return sorted(int(a) % ndim for a in items)  # type: ignore[call-overload]


def _view_layout(nd: OpNode, src: Strides) -> tuple[Strides | None, bool]:
    """The strides of view node ``nd`` over an input of strides ``src``, and whether eager copies instead."""
    shape = nd.input_shapes[0]
    out = nd.output_shape
    if len(src) != len(shape):
        return None, False
    if nd.op == "permute_dims":
        axes = nd.attrs.get("axes")
        perm = list(reversed(range(len(shape)))) if axes is None else [int(a) % len(shape) for a in axes]
        return tuple(src[a] for a in perm), False
    if nd.op == "reshape":
        v = view_strides(shape, src, out)
        return (_contiguous(out), True) if v is None else (v, False)
    if nd.op == "split":
        return src, False
    if nd.op == "squeeze":
        drop = set(_axes(nd.attrs.get("axis"), len(shape))) if nd.attrs.get("axis") is not None \
            else {d for d, s in enumerate(shape) if s == 1}
        return tuple(s for d, s in enumerate(src) if d not in drop), False
    if nd.op == "expand_dims" and len(out) > len(shape):
        res, shp = list(src), list(shape)
        for a in _axes(nd.attrs.get("axis"), len(out)):  # one ``unsqueeze`` at a time, in order
            res.insert(a, res[a] * shp[a] if a < len(res) else 1)
            shp.insert(a, 1)
        return tuple(res), False
    return None, False


def _folds(shape: Sequence[int], strides: Strides, to_2d: bool) -> bool:
    """Whether a batched matmul operand of ``shape`` / ``strides`` folds as a view: to 3-D, or to 2-D where the
    other operand is a matrix (``x @ W``)."""
    if len(shape) <= 2:
        return True
    new = (math.prod(shape[:-1]), shape[-1]) if to_2d else (math.prod(shape[:-2]), shape[-2], shape[-1])
    return view_strides(shape, strides, new) is not None


def layout_copies(nodes: "Sequence[OpNode]", preds: list[list[int]]
                  ) -> tuple[list[int], list[tuple[int, int]]]:
    """The ``reshape`` nodes eager runs as copies, and the ``(matmul, operand)`` pairs whose operand a batched
    matmul copies while it runs (the module docstring's rules)."""
    lay: dict[int, Strides | None] = {}
    reshapes: list[int] = []
    operands: list[tuple[int, int]] = []
    for i, nd in enumerate(nodes):
        if nd.is_constant:
            continue
        live = [p for p in preds[i] if not nodes[p].is_constant]
        if nd.op_class == "view":
            src = lay.get(live[0]) if live else (_contiguous(nd.input_shapes[0]) if nd.input_shapes else None)
            if src is None:
                lay[i] = None
                continue
            lay[i], copy = _view_layout(nd, src)
            if copy:
                reshapes.append(i)
            continue
        if nd.op_class == "matmul" and len(nd.output_shape) >= 3:
            to_2d = len(nd.input_shapes) == 2 and len(nd.input_shapes[1]) == 2
            for p in live:
                s = lay.get(p)
                if s is not None and not _folds(nodes[p].output_shape, s, to_2d and p == preds[i][0]):
                    operands.append((i, p))
        same = [p for p in live if nodes[p].output_shape == nd.output_shape and lay.get(p) is not None]
        if nd.op_class == "elementwise" and len(same) == 1 and len(nd.output_shapes) == 1:
            lay[i] = _dense_like(nd.output_shape, lay[same[0]])  # type: ignore[arg-type]
        else:
            lay[i] = _contiguous(nd.output_shape)
    return reshapes, operands

