"""The storages eager PyTorch's SDPA math path holds, by PyTorch version: :func:`math_path_calls`,
:func:`math_path_storage_rules`.

``F.scaled_dot_product_attention`` on query, key and value that are not 4-D runs the composite
``_scaled_dot_product_attention_math`` (``aten/src/ATen/native/transformers/attention.cpp``); the capture emits
its kernels as nodes marked ``attrs["sdpa_math"]`` (:data:`~dippm_nas.graph.SDPA_MATH_ATTR`; the latency prior's
rule for the same nodes is :mod:`dippm_nas.prior._math_path`). What that C++ function keeps alive, beyond a graph
liveness of those nodes:

- every version: q, k, v and the mask, the arguments of the call, live until it returns (the caller holds them; a
  pooled query the graph frees after its scaling), so do a boolean mask's additive copy (SDPA's entry makes it, in
  the inputs' dtype) and ``query = query_acc * scaling_factor``, a local of the
  function (the graph frees it after ``q @ k^T``); ``k^T * sqrt(scale)`` is a temporary, freed after
  ``q @ k^T``; an additive mask is added in place (``attn.add_(mask)``);
- from PyTorch 2.5 (pytorch/pytorch#128922), half-precision inputs: ``query_acc``, ``key_acc``, ``value_acc``
  (``.to(at::kFloat)`` of q, k and v) are locals alive for the whole call; the scalings, both matmuls, the
  operand copies a batched matmul takes and the softmax are float32; the output is cast back
  (``at::matmul(attn, value_acc).to(origin_dtype)``: the float32 product alive while the cast runs) and so are
  the attention weights (``attn.to(origin_dtype)``, the second value of the returned tuple: the whole score
  matrix in the inputs' dtype, from the softmax to the return);
- from PyTorch 2.5 (pytorch/pytorch#133882), any dtype: the softmax is ``at::_safe_softmax``, which holds, while
  its ``where`` runs, the softmax result, the ``eq(-inf)`` boolean matrix over the scores, the ``all`` row flags
  and two scalar tensors (512 B blocks), besides its input and output;
- up to 2.4: everything in the inputs' dtype (under autocast SDPA's wrapper casts q, k and v to the autocast
  dtype and runs the composite below the autocast key: its softmax is not cast to float32).

Under autocast, SDPA's wrapper casts float32 q, k, v and a float mask to the autocast dtype first (casts alive for
the call).
A graph whose nodes are not marked, or a deployment whose PyTorch version is unknown, gets none of this: the
caller keeps the graph's dtypes and autocast's plan, as before. From PyTorch 2.14 a call on 3-D inputs is a fused
kernel, not this function (:mod:`dippm_nas.prior._sdpa_rank3`: the liveness pass prices the graph it rewrites).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dippm_nas.graph import SDPA_MATH_ATTR, OperatorGraph

__all__ = ["MathPathCall", "MathPathStorageRules", "math_path_calls", "math_path_storage_rules"]

_WIDTH = {0: 4, 1: 2, 2: 2, 3: 8}
_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
_BLOCK = 512


@dataclass(frozen=True)
class MathPathCall:
    """The marked nodes of one SDPA math-path call, by role (node indices; ``-1``: the call has none).

    Attributes:
        nodes: every marked node of the call, in order.
        q_mul, k_mul: ``q * sqrt(scale)`` and ``k^T * sqrt(scale)``.
        scores: ``q @ k^T``.
        mask_add: the additive mask's ``add`` on the scores.
        mask_where: a boolean mask made additive (``where``): in the inputs' dtype.
        softmax: the softmax over the keys.
        out: ``softmax @ v``, the call's output.
        q_src, k_src, v_src: the producers of q, k and v outside the call (``-1``: a model input).
        mask_src: the producer of the mask outside the call (``-1``: none, or a constant).
    """

    nodes: tuple[int, ...]
    q_mul: int
    k_mul: int
    scores: int
    mask_add: int
    mask_where: int
    softmax: int
    out: int
    q_src: int
    k_src: int
    v_src: int
    mask_src: int = -1

    @property
    def first(self) -> int:
        return self.nodes[0]

    @property
    def last(self) -> int:
        return self.nodes[-1]


def math_path_calls(graph: OperatorGraph, preds: Sequence[Sequence[int]]) -> list[MathPathCall]:
    """The math-path calls of ``graph`` (connected runs of marked nodes that hold a softmax and two matmuls);
    empty when no node is marked."""
    nodes = graph.nodes
    marked = [bool(nd.attrs.get(SDPA_MATH_ATTR)) for nd in nodes]
    if not any(marked):
        return []
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, m in enumerate(marked):
        if m:
            for p in preds[i]:
                if marked[p]:
                    parent[root(p)] = root(i)
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(marked):
        if m:
            groups.setdefault(root(i), []).append(i)
    calls = [_call(graph, preds, marked, sorted(g)) for g in groups.values()]
    return sorted((c for c in calls if c is not None), key=lambda c: c.first)


def _call(graph: OperatorGraph, preds: Sequence[Sequence[int]], marked: list[bool], g: list[int]
          ) -> MathPathCall | None:
    nodes = graph.nodes

    def first(cond: object) -> int:
        return next((i for i in g if cond(i)), -1)  # type: ignore[operator]

    def outside(i: int) -> int:
        return next((p for p in preds[i] if not marked[p] and not nodes[p].is_constant), -1)

    softmax = first(lambda i: nodes[i].op == "nn.softmax")
    mats = [i for i in g if nodes[i].op == "matmul"]
    if softmax < 0 or len(mats) != 2:
        return None
    scores, out = mats
    kt = first(lambda i: nodes[i].op_class == "view" and nodes[i].op == "permute_dims")
    k_mul = first(lambda i: nodes[i].op == "multiply" and kt in preds[i])
    q_mul = first(lambda i: nodes[i].op == "multiply" and i != k_mul)
    if q_mul < 0 or k_mul < 0:
        return None
    mask_add = first(lambda i: nodes[i].op == "add" and scores in preds[i])
    mask_where = first(lambda i: nodes[i].op == "where")
    mask_src = outside(mask_where) if mask_where >= 0 else outside(mask_add) if mask_add >= 0 else -1
    return MathPathCall(
        nodes=tuple(g), q_mul=q_mul, k_mul=k_mul, scores=scores, mask_add=mask_add, mask_where=mask_where,
        softmax=softmax, out=out, q_src=outside(q_mul), k_src=outside(kt), v_src=outside(out), mask_src=mask_src)


@dataclass(frozen=True)
class MathPathStorageRules:
    """What the math-path calls of one graph do to its liveness (node indices; blocks in bytes, 512 B rounded).

    Attributes:
        inplace: ``add -> scores``: each mask add reuses the scores' storage.
        extend: ``(producer, until)``: the producer's output lives at least until node ``until``.
        resize: ``node -> blocks``: the storage a node makes, at the dtype the math path runs it in.
        copy_width: ``matmul -> element bytes`` of the operand copies the layout rules give that matmul.
        extra: ``(blocks, first node, last node)`` of each storage the graph has no node for.
        marked: every node of a call (autocast's own casts do not reach them).
        temporaries: ``k^T * sqrt(scale)`` of each call, a temporary freed after ``q @ k^T`` (no frame holds it).
        mode: ``"float32"`` (half-precision inputs run in float32), ``"inputs"`` (the inputs' dtype).
    """

    inplace: dict[int, int]
    extend: tuple[tuple[int, int], ...]
    resize: dict[int, list[int]]
    copy_width: dict[int, int]
    extra: tuple[tuple[tuple[int, ...], int, int], ...]
    marked: frozenset[int]
    temporaries: frozenset[int]
    mode: str


def math_path_storage_rules(graph: OperatorGraph, preds: Sequence[Sequence[int]], calls: Sequence[MathPathCall],
                            run_dtype: np.ndarray, low: str | None, float32: bool) -> MathPathStorageRules:
    """The :class:`MathPathStorageRules` of ``calls`` (module docstring).

    Args:
        graph: the captured graph.
        preds: its predecessor lists.
        calls: :func:`math_path_calls` of the graph.
        run_dtype: each node's run-time dtype code outside the math path (autocast's plan, or as captured).
        low: the autocast dtype, ``None`` without autocast.
        float32: the PyTorch version's math path runs half-precision inputs in float32 (2.5 on,
            :func:`~dippm_nas.prior.math_path_float32`).
    """
    nodes = graph.nodes
    inplace: dict[int, int] = {}
    extend: list[tuple[int, int]] = []
    resize: dict[int, list[int]] = {}
    copy_width: dict[int, int] = {}
    extra: list[tuple[tuple[int, ...], int, int]] = []
    spec_code = _CODE.get(graph.spec.dtype, 0)
    for c in calls:
        origin = _CODE[low] if low is not None else int(run_dtype[c.q_mul])
        if origin not in _WIDTH:
            continue
        up = float32 and origin in (1, 2)
        run = 0 if up else origin
        w_run, w_org = _WIDTH[run], _WIDTH[origin]
        extend.append((c.q_mul, c.last))  # ``query``, a local of the C++ function
        # the call's arguments, and a boolean mask made additive (a local of SDPA's entry)
        extend += [(src, c.last) for src in (c.q_src, c.k_src, c.v_src, c.mask_src, c.mask_where) if src >= 0]
        mask_code = int(run_dtype[c.mask_src]) if c.mask_src >= 0 else -1
        if low is not None and c.mask_where < 0 and mask_code in _WIDTH and mask_code != origin:
            extra.append(((_block(_elems(nodes[c.mask_src]) * w_org),), c.first, c.last))  # the wrapper's cast
        if c.mask_add >= 0:
            inplace[c.mask_add] = c.scores
        for i in c.nodes:
            nd = nodes[i]
            if nd.op_class == "view" or nd.is_constant:
                continue
            w = w_org if i in (c.mask_where, c.out) else w_run
            resize[i] = [_block(nd.output_elements * w)]
        copy_width[c.scores] = copy_width[c.out] = w_run
        for src, elems in ((c.q_src, _elems(nodes[c.q_mul])), (c.k_src, _elems(nodes[c.k_mul])),
                           (c.v_src, _v_elems(nodes[c.out]))):
            src_code = int(run_dtype[src]) if src >= 0 else spec_code
            if low is not None and src_code != origin and src_code in _WIDTH:  # SDPA's autocast wrapper
                extra.append(((_block(elems * w_org),), c.first, c.last))
            if up:  # ``query_acc`` / ``key_acc`` / ``value_acc``
                extra.append(((_block(elems * 4),), c.first, c.last))
        scores = _elems(nodes[c.softmax])
        if float32:  # ``_safe_softmax``: its softmax, ``eq(-inf)``, ``all`` and two scalar tensors
            rows = scores // max(1, int(nodes[c.softmax].output_shape[-1]))
            extra.append(((_block(scores * w_run), _block(scores), _block(rows), _BLOCK, _BLOCK), c.softmax,
                          c.softmax))
        if up:
            extra.append(((_block(scores * w_org),), c.out, c.last))  # ``attn.to(origin_dtype)``, after the softmax
            extra.append(((_block(_elems(nodes[c.out]) * 4),), c.out, c.out))  # the product before its cast
    return MathPathStorageRules(inplace, tuple(extend), resize, copy_width, tuple(extra),
                                frozenset(i for c in calls for i in c.nodes), frozenset(c.k_mul for c in calls),
                                "float32" if float32 else "inputs")


def _elems(nd: object) -> int:
    return int(nd.output_elements)  # type: ignore[attr-defined]


def _v_elems(out: object) -> int:
    """Elements of ``softmax @ v``'s ``v`` operand."""
    shapes = [s for s, par in zip(out.input_shapes, out.input_is_param) if not par]  # type: ignore[attr-defined]
    return math.prod(shapes[-1]) if shapes else 0


def _block(nbytes: int) -> int:
    return _BLOCK * math.ceil(nbytes / _BLOCK) if nbytes > 0 else 0
