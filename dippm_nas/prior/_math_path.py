"""The dtype PyTorch's SDPA math path runs in, by PyTorch version: :func:`math_path_float32`, :func:`math_path_plan`.

``F.scaled_dot_product_attention`` on query, key and value that are not 4-D runs PyTorch's math path
(``_scaled_dot_product_attention_math`` in ``aten/src/ATen/native/transformers/attention.cpp``); the capture emits
its kernels as graph nodes marked ``attrs["sdpa_math"]`` (:data:`~dippm_nas.graph.SDPA_MATH_ATTR`). What they
compute in depends on the PyTorch version, not on autocast (under autocast SDPA casts its inputs to the low dtype
and runs the composite below the autocast dispatch key, so the float32 list does not reach its softmax):

- up to 2.4: in the inputs' dtype (half-precision q, k, v: the scalings, both matmuls and the softmax in half
  precision);
- from 2.5 (pytorch/pytorch#128922, "Always use high precision for SDPA math backend"): half-precision q, k and v
  are cast to float32 (``query_.to(at::kFloat)``, one kernel each), the scalings, both matmuls (on CUDA cores
  unless TF32 is allowed) and the softmax run in float32, and the output and the attention weights are cast back
  (``at::matmul(attn, value_acc).to(origin_dtype), attn.to(origin_dtype)``: two kernels, the second over the whole
  score matrix). Its softmax is ``at::_safe_softmax`` (pytorch/pytorch#133882, also in 2.5: fully masked rows
  give zeros), the softmax and three more kernels over the score matrix: ``-inf`` tested (``eq`` / ``isneginf``:
  the scores read, a boolean matrix written), ``all`` along the keys (that matrix read), ``where`` (the
  probabilities read and written); float32 inputs pay these too.

A deployment whose torch version is unknown keeps the graph's dtypes and autocast's plan (:func:`math_path_float32`
is ``None``). From PyTorch 2.14 a call on 3-D inputs runs the fused kernels instead: the estimate prices the graph
:func:`~dippm_nas.prior._sdpa_rank3.fused_rank3_graph` gives, whose calls of rank 3 are no longer marked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dippm_nas.graph import SDPA_MATH_ATTR, OperatorGraph
from dippm_nas.prior._allocator import torch_at_least
from dippm_nas.prior._autocast import AutocastPlan

__all__ = ["MATH_PATH_FLOAT32_SINCE", "math_path_float32", "math_path_plan"]

#: The first PyTorch ``(major, minor)`` whose SDPA math path runs half-precision inputs in float32.
MATH_PATH_FLOAT32_SINCE: tuple[int, int] = (2, 5)
_SIZE = {0: 4.0, 1: 2.0, 2: 2.0, 3: 8.0}
_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
#: Math-path ops whose other input is the mask (its dtype follows the scores', no cast of its own is priced).
_MASK_OPS = frozenset({"add", "where"})


def math_path_float32(torch_version: str | None) -> bool | None:
    """Whether the SDPA math path of ``torch_version`` runs half-precision inputs in float32 (PyTorch >=
    :data:`MATH_PATH_FLOAT32_SINCE`); ``None`` when the version is ``None`` or has no ``MAJOR.MINOR``."""
    return torch_at_least(torch_version, MATH_PATH_FLOAT32_SINCE)


def math_path_plan(graph: OperatorGraph, captured: np.ndarray, active: np.ndarray, base: AutocastPlan | None,
                   low: str | None, float32: bool) -> AutocastPlan | None:
    """The run-time dtypes, byte scales and casts of ``graph``'s nodes with its SDPA math path priced as the
    PyTorch version runs it (module docstring); ``None`` when the graph has no math-path node.

    Args:
        graph: the captured graph.
        captured: each node's dtype code as captured (``GraphFacts.dtype``).
        active: each node launches kernels (casts of a view go to the next math-path node that does).
        base: autocast's plan (``None``: no autocast); its other nodes are kept.
        low: the autocast dtype, ``None`` without autocast.
        float32: the version's math path runs in float32 (:func:`math_path_float32`).

    The math path's casts and its safe softmax's extra kernels are in the plan's ``casts`` / ``cast_bytes`` (kernels
    launched inside the operator's dispatch, memory-bound, as autocast's casts are).
    """
    nodes = graph.nodes
    marked = np.array([bool(nd.attrs.get(SDPA_MATH_ATTR)) for nd in nodes], dtype=bool)
    if not marked.any():
        return None
    n = len(nodes)
    dtype = np.array(base.dtype if base is not None else captured, dtype=np.int64)
    scale = np.array(base.bytes_scale, dtype=np.float64) if base is not None else np.ones(n)
    casts = np.array(base.casts, dtype=np.float64) if base is not None else np.zeros(n)
    cast_bytes = np.array(base.cast_bytes, dtype=np.float64) if base is not None else np.zeros(n)
    preds, succs = graph.predecessors(), graph.successors()
    outputs = set(graph.outputs)
    spec = graph.spec
    input_codes = [_CODE.get(spec.tensor_dtype(t), -1) for t in spec.tensors]
    low_code = _CODE[low] if low is not None else None
    origin = np.full(n, -1, dtype=np.int64)
    pending = np.zeros(n, dtype=bool)  # casts of a view's input, moved to the next active math-path node
    add_k = np.zeros(n)
    add_b = np.zeros(n)
    for i in np.flatnonzero(marked).tolist():
        nd = nodes[i]
        inner = [p for p in preds[i] if marked[p]]
        ext = [p for p in preds[i] if not marked[p] and not nodes[p].is_constant]
        ext_codes = [int(dtype[p]) for p in ext] or [c for c in input_codes if c >= 0][:1]
        if low_code is not None:
            origin[i] = low_code  # SDPA's autocast wrapper casts q, k and v to the low dtype
        elif inner:
            origin[i] = origin[inner[0]]
        else:
            origin[i] = ext_codes[0] if ext_codes else int(captured[i])
        o = int(origin[i])
        up = float32 and o in (1, 2)
        run = 0 if up else o
        k, b = _input_casts(nd, [nodes[p] for p in inner], ext_codes, o, up)
        out_elems = float(nd.output_elements)
        if float32 and nd.op == "nn.softmax" and run in _SIZE:  # _safe_softmax: eq, all, where over the scores
            w = _SIZE[run]
            k, b = k + 3, b + out_elems * ((w + 1.0) + 1.0 + 2.0 * w)
        if up and nd.op == "nn.softmax":  # attn.to(origin_dtype): the score matrix cast back
            k, b = k + 1, b + out_elems * (4.0 + _SIZE[o])
        if up and (i in outputs or any(not marked[s] for s in succs[i])):  # the output cast back
            k, b = k + 1, b + out_elems * (4.0 + _SIZE[o])
        dtype[i] = run if int(captured[i]) in _SIZE else dtype[i]
        if int(captured[i]) in _SIZE:
            scale[i] = _SIZE[run] / _SIZE[int(captured[i])]
        casts[i] = cast_bytes[i] = 0.0  # autocast does not reach inside SDPA
        add_k[i], add_b[i] = k, b
        pending[i] = not active[i]
    for i in np.flatnonzero(marked & pending).tolist():  # a view's casts on its first active math-path consumer
        j = next((s for s in sorted(succs[i]) if marked[s] and active[s]), None)
        if j is not None:
            add_k[j] += add_k[i]
            add_b[j] += add_b[i]
            add_k[i] = add_b[i] = 0.0
    return AutocastPlan(dtype=dtype, bytes_scale=scale, casts=casts + add_k, cast_bytes=cast_bytes + add_b)


def _input_casts(nd: Any, inner: list[Any], ext_codes: list[int], origin: int, up: bool) -> tuple[float, float]:
    """``(kernels, bytes)`` of the casts of one math-path node's activation inputs from outside the math path (q,
    k or v; not a mask's): autocast's cast to the ``origin`` dtype where they are of another, then the math path's
    cast up to float32 (``up``). ``inner``: the node's producers on the math path; ``ext_codes``: the dtype codes
    of the others, in order."""
    if nd.op in _MASK_OPS:
        return 0.0, 0.0
    ext_elems = [math.prod(s) for s, par in zip(nd.input_shapes, nd.input_is_param) if not par and len(s) > 0]
    for p in inner:
        e = math.prod(p.output_shapes[0]) if p.output_shapes else 0
        if e in ext_elems:
            ext_elems.remove(e)
    k = b = 0.0
    for j, elems in enumerate(ext_elems):
        c = ext_codes[j] if j < len(ext_codes) else origin
        if c in _SIZE and c != origin:
            k, b = k + 1, b + elems * (_SIZE[c] + _SIZE[origin])
        if up:
            k, b = k + 1, b + elems * (_SIZE[origin] + 4.0)
    return k, b
