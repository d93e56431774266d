"""Graph coarsening: operator graph -> kernel graph (fewer, fused nodes) for a faster GNN.

Rules, applied in execution order:

1. **Constant-folded nodes are dropped** (``is_constant``: every input is a weight, e.g. a weight
   transpose). They cost nothing at run time and are excluded from the graph's totals already.
2. **View nodes are dropped with bypass edges** (``op_class == "view"``: reshape, permute_dims,
   squeeze, flatten...; 0 FLOPs, 0 bytes). Their consumers are connected to their producers. Their
   (zero) costs are still summed into a neighbouring kernel so totals are exact whatever the formulas say.
3. **Element-wise, activation, normalisation and cast nodes are fused into their producer kernel**
   (the group of their latest live producer), the epilogue fusion cuDNN/compilers do: conv → BN →
   ReLU becomes one kernel node; a residual ``add`` joins its latest producer and keeps an edge from the
   other one. A fusable node that reads only graph inputs starts its own kernel.

Every other node (conv, matmul, attention, pool, reduction, softmax, memory, gather, unknown) starts a
kernel. A kernel's features are its head node's token/attributes/shapes plus the **sums** of FLOPs,
MACs, bytes, weight bytes and prior time over its members, and the count of members per op class, so
the totals of the kernel graph equal the totals of the operator graph (tested).

On an MBConv network this turns ~130 operator nodes into ~50 kernels; on a ResNet-50 ~230 into ~75.

:func:`coarsen_stack` applies the same rules to many graphs at once (a :class:`~dippm_nas.graph.GraphStack`):
each node's kernel head is the latest head among its producers', iterated over the whole stack until no node
changes; the kernels and edges are those :func:`coarsen` gives each graph (``tests/features/test_features_many.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dippm_nas._unique import sorted_unique
from dippm_nas.graph import GraphStack, OperatorGraph

__all__ = ["KernelGraph", "coarsen", "FUSABLE_CLASSES", "StackKernels", "coarsen_stack", "needs_graph_pass"]

#: Op classes fused into their producer kernel.
FUSABLE_CLASSES = frozenset({"elementwise", "activation", "normalization", "cast"})


@dataclass(frozen=True)
class KernelGraph:
    """The result of :func:`coarsen`.

    Attributes:
        groups: per kernel, the operator-node indices it holds (head first, then in execution order).
        edges: ``(producer kernel, consumer kernel)`` pairs, sorted, no duplicates, no self loops.
        dropped: constant-folded node indices (not part of any kernel).
    """

    groups: list[list[int]]
    edges: list[tuple[int, int]]
    dropped: list[int]

    @property
    def num_kernels(self) -> int:
        return len(self.groups)

    @property
    def heads(self) -> list[int]:
        return [g[0] for g in self.groups]

    def edge_index(self) -> np.ndarray:
        """``[2, num_edges]`` int64."""
        if not self.edges:
            return np.zeros((2, 0), dtype=np.int64)
        return np.asarray(self.edges, dtype=np.int64).T.copy()


def coarsen(graph: OperatorGraph, *, fuse: bool = True) -> KernelGraph:
    """Coarsen ``graph`` into kernels (see the module docstring).

    Args:
        graph: a validated operator graph.
        fuse: apply rule 3 (fusion); ``False`` keeps one kernel per non-view, non-constant node.

    Returns:
        A :class:`KernelGraph` with at least one kernel.
    """
    n = graph.num_nodes
    preds = graph.predecessors()
    group_of = [-1] * n
    # for dropped view nodes: the kernel groups their value comes from (bypass)
    via: list[frozenset[int]] = [frozenset()] * n
    groups: list[list[int]] = []
    edges: set[tuple[int, int]] = set()
    dropped: list[int] = []
    pending: dict[int, list[int]] = {}  # view nodes reading only graph inputs -> attach to first consumer

    for node in graph.nodes:
        i = node.index
        src: set[int] = set()
        waiting: list[int] = []
        for p in preds[i]:
            if group_of[p] >= 0:
                src.add(group_of[p])
            else:
                src.update(via[p])
                waiting.extend(pending.pop(p, []))
        if node.is_constant:
            dropped.append(i)
            continue
        if node.op_class == "view":
            via[i] = frozenset(src)
            if src:
                groups[max(src)].append(i)  # zero-cost member: keeps totals exact
            else:
                pending[i] = waiting + [i]
            continue
        if fuse and node.op_class in FUSABLE_CLASSES and src:
            g = max(src)
            groups[g].append(i)
        else:
            g = len(groups)
            groups.append([i])
        group_of[i] = g
        groups[g].extend(waiting)
        for s in src:
            if s != g:
                edges.add((s, g))
    leftovers = [m for ms in pending.values() for m in ms]
    if not groups:
        # a graph of views only: one kernel holding them all
        groups.append(sorted(leftovers) if leftovers else [0])
        leftovers = []
    groups[0].extend(leftovers)
    groups = [[g[0]] + sorted(g[1:]) for g in groups]
    return KernelGraph(groups=groups, edges=sorted(edges), dropped=dropped)


@dataclass(frozen=True)
class StackKernels:
    """:func:`coarsen` of every graph of a stack, as arrays (global node ids; kernels graph after graph, in each
    graph in the order :func:`coarsen` numbers them).

    Attributes:
        heads: ``[K]`` int64, the head node of each kernel.
        members: ``[M]`` int64, every kernel's nodes, kernel after kernel, the head first, then in node order.
        lengths: ``[K]`` int64, nodes per kernel.
        kernel_offsets: ``[G + 1]`` int64, graph ``g``'s kernels are ``kernel_offsets[g]:kernel_offsets[g + 1]``.
        edge_src, edge_dst: ``[E]`` int64, kernel edges as indices within their graph, sorted graph after graph.
        edge_offsets: ``[G + 1]`` int64, graph ``g``'s edges are ``edge_offsets[g]:edge_offsets[g + 1]``.
    """

    heads: np.ndarray
    members: np.ndarray
    lengths: np.ndarray
    kernel_offsets: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_offsets: np.ndarray


def needs_graph_pass(st: GraphStack) -> np.ndarray:
    """``[G]`` bool: graphs :func:`coarsen_stack` leaves to :func:`coarsen` (no node that makes a kernel: a graph
    of views and constants only)."""
    group_node = ~st.is_constant & ~st.is_class("view")
    return np.bincount(st.graph_of[group_node], minlength=st.num_graphs) == 0


def _heads_of(st: GraphStack, fuse: bool) -> np.ndarray:
    """``[N]`` int64: the head node of the kernel each node joins by rules 2 and 3 (a view: the latest head among
    its producers', ``-1`` when none; a constant: ``-1``), iterated until no node changes (one round per node
    of the longest chain of fused nodes and views)."""
    num = st.num_nodes
    idx = np.arange(num, dtype=np.int64)
    view = st.is_class("view") & ~st.is_constant
    fusable = np.zeros(num, dtype=bool)
    if fuse:
        for c in FUSABLE_CLASSES:
            fusable |= st.is_class(c)
    fused = fusable & ~st.is_constant
    h = np.where(~st.is_constant & ~view & ~fused, idx, -1)
    follow = view | fused
    sel = follow[st.dst]
    s, d = st.src[sel], st.dst[sel]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]]) if d.size else np.zeros(0, dtype=np.int64)
    fol = np.flatnonzero(follow)
    while True:
        m = np.full(num, -1, dtype=np.int64)
        if d.size:
            m[d[starts]] = np.maximum.reduceat(h[s], starts)
        new = np.where(view[fol] | (m[fol] >= 0), m[fol], fol)
        if np.array_equal(new, h[fol]):
            return h
        h[fol] = new


def coarsen_stack(st: GraphStack, *, fuse: bool = True) -> StackKernels:
    """:func:`coarsen` of every graph of ``st`` at once; graphs :func:`needs_graph_pass` flags get no kernel
    (the caller coarsens them one by one)."""
    num = st.num_nodes
    view = st.is_class("view") & ~st.is_constant
    group_node = ~st.is_constant & ~view
    h = _heads_of(st, fuse)
    # views reading no kernel (only model inputs or constants) join the kernel of their first consumer
    member_head = np.where(view | group_node, h, -1)
    pending = view & (h < 0)
    if pending.any():
        first = np.full(num, num, dtype=np.int64)
        np.minimum.at(first, st.src, st.dst)
        tgt = np.where(pending, first, -1)
        while True:  # a chain of such views passes them on to the first consumer of the last one
            nxt = (tgt >= 0) & (tgt < num)
            chain = np.zeros(num, dtype=bool)
            chain[nxt] = pending[tgt[nxt]]
            if not chain.any():
                break
            tgt[chain] = first[tgt[chain]]
        pidx = np.flatnonzero(pending)
        t = tgt[pidx]
        ends = np.zeros(pidx.size, dtype=np.int64) - 1
        consumed = t < num
        ends[consumed] = np.where(group_node[t[consumed]], h[t[consumed]], -1)  # a view or constant drops them
        # never consumed: the graph's first kernel
        gn = np.flatnonzero(group_node)
        fk = np.full(st.num_graphs, num, dtype=np.int64)
        np.minimum.at(fk, st.graph_of[gn], gn)
        ends[~consumed] = fk[st.graph_of[pidx[~consumed]]]
        member_head[pidx] = ends
    is_member = member_head >= 0
    nodes = np.flatnonzero(is_member)
    mh = member_head[nodes]
    order = np.lexsort((nodes, nodes != mh, mh))
    members = nodes[order]
    heads, lengths = sorted_unique(mh, return_counts=True)
    kg = st.graph_of[heads]
    kernel_offsets = np.zeros(st.num_graphs + 1, dtype=np.int64)
    np.cumsum(np.bincount(kg, minlength=st.num_graphs), out=kernel_offsets[1:])
    es, ed = _kernel_edges(st, h, view, group_node)
    ks, kd = np.searchsorted(heads, es), np.searchsorted(heads, ed)
    key = sorted_unique(ks * max(heads.size, 1) + kd)
    ks, kd = key // max(heads.size, 1), key % max(heads.size, 1)
    eg = kg[ks] if ks.size else np.zeros(0, dtype=np.int64)
    edge_offsets = np.zeros(st.num_graphs + 1, dtype=np.int64)
    np.cumsum(np.bincount(eg, minlength=st.num_graphs), out=edge_offsets[1:])
    base = kernel_offsets[eg]
    return StackKernels(heads=heads, members=members, lengths=lengths, kernel_offsets=kernel_offsets,
                        edge_src=ks - base, edge_dst=kd - base, edge_offsets=edge_offsets)


def _kernel_edges(st: GraphStack, h: np.ndarray, view: np.ndarray, group_node: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(producer head, consumer head)`` of every dataflow edge into a kernel node, views bypassed (an edge
    from a view stands for the edges into it, repeatedly); self loops and constants' edges left out."""
    sel = group_node[st.dst]
    p, c = st.src[sel], st.dst[sel]
    indeg = np.bincount(st.dst, minlength=st.num_nodes)
    ptr = np.zeros(st.num_nodes + 1, dtype=np.int64)
    np.cumsum(indeg, out=ptr[1:])
    out_p, out_c = [], []
    while p.size:
        via = view[p]
        keep = group_node[p]
        out_p.append(h[p[keep]])
        out_c.append(h[c[keep]])
        p, c = p[via], c[via]
        cnt = indeg[p]
        rep = np.repeat(np.arange(p.size), cnt)
        off = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        p, c = st.src[ptr[p][rep] + off], c[rep]
    hs = np.concatenate(out_p) if out_p else np.zeros(0, dtype=np.int64)
    hd = np.concatenate(out_c) if out_c else np.zeros(0, dtype=np.int64)
    diff = hs != hd
    return hs[diff], hd[diff]
