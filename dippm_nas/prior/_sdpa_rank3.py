"""Rank-3 SDPA by PyTorch version: :func:`sdpa_rank3_fused`, :func:`fused_rank3_graph`.

``F.scaled_dot_product_attention`` on 3-D query, key and value (``(N, L, E)``: timm's SAM-ViT folds its heads
into the batch) ran PyTorch's math path (``_scaled_dot_product_attention_math``) while the fused CUDA kernels took
4-D tensors only. A later PyTorch unsqueezes 3-D q, k and v (and a 3-D mask) to 4-D before its backend choice, so a
GPU runs them on the flash / memory-efficient kernels (upstream's ``test_invalid_fused_inputs_dim_3`` became
``test_fused_inputs_dim_3``). Inputs of rank 5 and more stay on the math path in every version.

:data:`SDPA_RANK3_FUSED_SINCE` is 2.14, read from the installed builds (docs/transformer_kernels.md gives the
commands): PyTorch 2.13.0 dispatches 3-D SDPA straight to the math path's ``mul`` / ``transpose`` (no
``unsqueeze``), PyTorch 2.14.1 starts it with three ``aten.unsqueeze`` calls, on CPU and fake CUDA tensors alike.
Upstream's change (pytorch/pytorch#192271, "[SDPA] Enable fused CUDA backends for rank-3 inputs", 2026; a 2023
attempt, #110180, was closed unmerged) is dated between the two releases; no release note was read, so the cut
rests on those two builds.

The capture emits the math path for every non-4-D call and records the rank of its inputs on each of its nodes
(:data:`~dippm_nas.graph.SDPA_RANK_ATTR`); for a deployment on PyTorch >= 2.14, :func:`fused_rank3_graph` turns
each rank-3 call into one ``nn.attention`` (``nn.attention_bias`` with a mask) node over q, k and v seen as
``(1, L, N, E)``, at the call's output node, whose kernel the SDPA rules (:mod:`~dippm_nas.prior._sdpa`) choose;
the call's other nodes become constant-folded (no kernel, no storage), so node indices stay. A boolean mask's
additive copy stays a kernel (SDPA's entry makes it on every path). A graph without the rank (captured before it
was recorded), and a deployment whose PyTorch version is unknown, keep the math path as captured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from dippm_nas.graph import SDPA_MATH_ATTR, SDPA_RANK_ATTR, OperatorGraph, OpNode, cost_of
from dippm_nas.prior._allocator import torch_at_least
from dippm_nas.prior._math_path_memory import MathPathCall, math_path_calls
from dippm_nas.spec import dtype_bytes

__all__ = ["SDPA_RANK3_FUSED_SINCE", "sdpa_rank3_fused", "has_rank3_math_path", "fused_rank3_graph"]

#: The first PyTorch ``(major, minor)`` that runs 3-D SDPA inputs on the fused kernels (unsqueezed to 4-D).
SDPA_RANK3_FUSED_SINCE: tuple[int, int] = (2, 14)


def sdpa_rank3_fused(torch_version: str | None) -> bool | None:
    """Whether ``torch_version`` runs 3-D SDPA inputs on the fused kernels (PyTorch >=
    :data:`SDPA_RANK3_FUSED_SINCE`); ``None`` when the version is ``None`` or has no ``MAJOR.MINOR``."""
    return torch_at_least(torch_version, SDPA_RANK3_FUSED_SINCE)


def has_rank3_math_path(graph: OperatorGraph) -> bool:
    """``graph`` holds a math-path node captured from a call on 3-D inputs (``attrs["sdpa_rank"] == 3``)."""
    return any(nd.attrs.get(SDPA_RANK_ATTR) == 3 and nd.attrs.get(SDPA_MATH_ATTR) for nd in graph.nodes)


def fused_rank3_graph(graph: OperatorGraph) -> OperatorGraph:
    """``graph`` as PyTorch >= :data:`SDPA_RANK3_FUSED_SINCE` runs it: each math-path call on 3-D inputs one
    fused attention node (module docstring); ``graph`` itself when it has none. The result has the same nodes,
    in the same order, and the same outputs.

    Raises:
        GraphValidationError: a malformed graph.
    """
    if not has_rank3_math_path(graph.validate()):
        return graph
    preds = graph.predecessors()
    calls = [c for c in math_path_calls(graph, preds)
             if all(graph.nodes[i].attrs.get(SDPA_RANK_ATTR) == 3 for i in c.nodes)]
    if not calls:
        return graph
    nodes = list(graph.nodes)
    edges = set(graph.edges)
    for c in calls:
        _fuse_call(graph, c, nodes, edges)
    return dataclasses.replace(graph, nodes=nodes, edges=sorted(edges), _hash=None, _provenance_hash=None).validate()


def _fuse_call(graph: OperatorGraph, c: MathPathCall, nodes: list[OpNode], edges: set[tuple[int, int]]) -> None:
    """Rewrite one call in ``nodes`` / ``edges``: its output node the fused kernel, its other nodes folded."""
    old = graph.nodes
    mask_in = c.mask_where if c.mask_where >= 0 else c.mask_src
    folded = [i for i in c.nodes if i not in (c.out, c.mask_where)]
    for i in folded:
        edges.difference_update({(p, i) for p, _ in _into(edges, i) if p not in folded})
        nd = old[i]
        attrs = {k: v for k, v in nd.attrs.items() if k != SDPA_MATH_ATTR}
        nodes[i] = dataclasses.replace(nd, attrs=attrs, input_is_param=tuple(True for _ in nd.input_shapes),
                                       flops=0, macs=0, bytes_read=0, bytes_written=0, is_constant=True)
    if c.mask_where >= 0:
        w = old[c.mask_where]
        nodes[c.mask_where] = dataclasses.replace(w, attrs={k: v for k, v in w.attrs.items() if k != SDPA_MATH_ATTR})
    edges.difference_update(set(_into(edges, c.out)))
    edges.update((s, c.out) for s in dict.fromkeys((c.q_src, c.k_src, c.v_src, mask_in)) if s >= 0)
    nodes[c.out] = _attention_node(old, c)


def _into(edges: set[tuple[int, int]], i: int) -> list[tuple[int, int]]:
    return [e for e in edges if e[1] == i]


def _attention_node(old: Sequence[OpNode], c: MathPathCall) -> OpNode:
    """The fused kernel of call ``c``: q, k, v (and the mask) as the 4-D ``(1, L, N, E)`` the kernel sees."""
    out = old[c.out]
    q = old[c.q_mul].input_shapes[0]
    k = old[c.scores].input_shapes[1]  # k^T * sqrt(scale): (N, E, S)
    v = out.input_shapes[1]
    shapes = [(1, q[-2], q[-3], q[-1]), (1, k[-1], k[-3], k[-2]), (1, v[-2], v[-3], v[-1])]
    is_param = [False, False, False]
    if c.mask_add >= 0:
        add = old[c.mask_add]
        m = add.input_shapes[1]
        shapes.append((1,) * (4 - len(m)) + tuple(m))
        is_param.append(bool(add.input_is_param[1]) if c.mask_where < 0 else False)
    op = "nn.attention_bias" if c.mask_add >= 0 else "nn.attention"
    cost = cost_of(op, shapes, out.output_shapes, {})
    width = dtype_bytes(out.output_dtype)
    read = sum(math.prod(s) for s in shapes[:3]) * width
    if len(shapes) > 3:
        read += math.prod(shapes[3]) * dtype_bytes(old[c.mask_add].output_dtype)
    attrs = {**cost.derived_attrs, SDPA_RANK_ATTR: 3}
    return dataclasses.replace(out, op=op, op_class=cost.op_class, input_shapes=tuple(shapes),
                               input_is_param=tuple(is_param), attrs=attrs, flops=int(cost.flops),
                               macs=int(cost.macs), bytes_read=int(read),
                               bytes_written=int(out.output_elements * width), param_bytes=0, is_constant=False)
