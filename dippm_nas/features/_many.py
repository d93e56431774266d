"""Feature tensors of many graphs at once: :func:`featurize_many`.

The same features as :func:`~dippm_nas.features.featurize` (style ``"ours"``), computed over one node table of
all graphs (:func:`~dippm_nas.graph.stack_graphs`) with whole-stack array operations: coarsening
(:func:`~dippm_nas.features._coarsen.coarsen_stack`), per-kernel sums, the head nodes' encodings, the static
features. Each graph's arrays equal the per-graph ones (``tests/features/test_features_many.py``):

- per-kernel sums add the members in the order the per-graph pass does (integers exactly);
- ``log1p`` runs in numpy; where numpy's and ``math.log1p``'s answers could round to different float32 values
  (within 2**-40 relative of a float32 rounding boundary) the value is taken from ``math.log1p``, which the
  per-graph pass uses;
- a head node's encoding (:func:`~dippm_nas.features.encode_op`, shapes, dtype) is memoised by the node's op,
  dtype and class and the identity of its attributes, shapes and parameter flags (objects a node never changes;
  the memo holds them): search-space candidates assembled from blocks share their blocks' objects, so a block's
  encodings are computed once per process. An op without an encoder is encoded (counted and warned about) every
  time, as by the per-graph pass.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from dippm_nas.devices import Device, resolve_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.features._coarsen import StackKernels, coarsen_stack, needs_graph_pass
from dippm_nas.features._features import (
    _COST_W, _DTYPES, _PRIOR_W, _SHAPE_W, STYLES, GraphFeatures, _shape_feats, device_features, featurize, node_dim,
)
from dippm_nas.features._registry import ATTR_WIDTH, TOKENS, encode_op, encoders_version
from dippm_nas.graph import OP_CLASSES, GraphStack, OperatorGraph, stack_graphs
from dippm_nas.prior import estimate as prior_estimate, execution_settings, utilisation_energy_j

if TYPE_CHECKING:  # pragma: no cover
    from dippm_nas.prior import DeploymentSettings, PriorEstimate, PriorParams

__all__ = ["featurize_many", "MANY_MIN_GRAPHS"]

#: Below this many graphs :func:`featurize_many` runs :func:`featurize` per graph (one model keeps the single-graph
#: path); from two graphs on the batched pass is the faster one: on ``mbconv`` graphs of ~210 nodes whose columns
#: are cached, 1.3 ms against 3.5 ms for two graphs, 1.8 ms against 6.4 ms for four (CPU time, load average ~8).
MANY_MIN_GRAPHS = 2
#: Graphs from which the depth (longest path) runs one array step per node position over all graphs instead
#: of a Python pass per graph.
_LEVEL_STEP_MIN_GRAPHS = 24
_MEMO_MAX = 1 << 16
_HEAD_W = ATTR_WIDTH + _SHAPE_W + len(_DTYPES)
_TOKEN_INDEX = {t: j for j, t in enumerate(TOKENS)}


def featurize_many(graphs: Sequence[OperatorGraph], device: Device | str, *, style: str = "ours", fuse: bool = True,
                   prior_params: "PriorParams | None" = None, estimates: "Sequence[PriorEstimate] | None" = None,
                   execution: "DeploymentSettings | None" = None, stack: GraphStack | None = None) -> list[GraphFeatures]:
    """:func:`~dippm_nas.features.featurize` of every graph, computed over all of them at once.

    Args:
        graphs: captured graphs (validated by the prior).
        device: a catalogue id or :class:`Device`.
        style: ``"ours"`` or ``"dippm"`` (the ablation, featurised graph by graph).
        fuse: coarsen element-wise chains into kernels (``"ours"`` only).
        prior_params: constants of the analytic prior.
        estimates: the prior's estimate of each graph on ``device`` when the caller has them (not recomputed).
        execution: how the pass is executed and timed (as for :func:`featurize`).
        stack: :func:`~dippm_nas.graph.stack_graphs` of ``graphs`` when the caller has it.

    Returns:
        one :class:`GraphFeatures` per graph, in order, equal to :func:`featurize`'s.

    Raises:
        InvalidValueError: unknown style, or ``estimates`` of another length than ``graphs``; errors of the prior.
    """
    if style not in STYLES:
        raise InvalidValueError(f"style must be one of {STYLES}, got {style!r}")
    gs = list(graphs)
    if estimates is not None and len(estimates) != len(gs):
        raise InvalidValueError(f"estimates must hold one estimate per graph: {len(gs)} graphs, "
                                f"{len(estimates)} estimates")
    dev = resolve_device(device)
    ests = list(estimates) if estimates is not None else [
        prior_estimate(g, dev, params=prior_params, deployment=execution_settings(execution)) for g in gs]
    if style == "dippm" or len(gs) < MANY_MIN_GRAPHS:
        return [featurize(g, dev, style=style, fuse=fuse, estimate=e) for g, e in zip(gs, ests)]
    st = stack if stack is not None else stack_graphs(gs)
    alone = needs_graph_pass(st)
    if alone.any():  # graphs of views and constants only: their own pass
        out: list[GraphFeatures | None] = [featurize(g, dev, fuse=fuse, estimate=e) if a else None
                                           for g, e, a in zip(gs, ests, alone.tolist())]
        rest = [i for i, a in enumerate(alone.tolist()) if not a]
        for i, f in zip(rest, featurize_many([gs[i] for i in rest], dev, fuse=fuse,
                                             estimates=[ests[i] for i in rest])):
            out[i] = f
        return out  # type: ignore[return-value]
    return _ours_many(st, ests, dev, fuse)


def _ours_many(st: GraphStack, ests: Sequence["PriorEstimate"], dev: Device, fuse: bool) -> list[GraphFeatures]:
    sk = coarsen_stack(st, fuse=fuse)
    unknown: list[dict[str, int]] = [{} for _ in st.graphs]
    x = _kernel_rows(st, sk, ests, unknown)
    static = _static_rows(st, sk, ests, dev)
    dvf = device_features(dev)
    ko, eo = sk.kernel_offsets.tolist(), sk.edge_offsets.tolist()
    ei = np.stack([sk.edge_src, sk.edge_dst])
    out = []
    for g, est in enumerate(ests):  # each graph's own arrays: a cached feature set does not hold the batch's
        out.append(GraphFeatures(
            x=x[ko[g]:ko[g + 1]].copy(), edge_index=ei[:, eo[g]:eo[g + 1]].copy(), static=static[g].copy(),
            device=dvf.copy(), prior_latency_ms=float(est.latency_ms), prior_memory_mib=float(est.memory_mib),
            prior_energy_j=None if est.energy_j is None else float(est.energy_j), style="ours",
            unknown_ops=unknown[g], estimate=est,
        ))
    return out


def _lg(a: np.ndarray) -> np.ndarray:
    """``log1p(max(a, 0))`` (nan stays nan) in float64, rounding to the float32 values ``math.log1p`` gives."""
    x = np.maximum(np.asarray(a, dtype=np.float64), 0.0)
    y = np.log1p(x)
    eps = 2.0 ** -40
    with np.errstate(invalid="ignore", over="ignore"):
        near = (y * (1.0 - eps)).astype(np.float32) != (y * (1.0 + eps)).astype(np.float32)
    if near.any():
        y[near] = [math.log1p(v) for v in x[near].tolist()]
    return y


def _head_rows(st: GraphStack, heads: np.ndarray, unknown_head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token index ``[K]`` and attributes + shapes + dtype one-hot ``[K, _HEAD_W]`` of each head node; sets
    ``unknown_head[k]`` where the head's op has no encoder."""
    nodes = st.nodes
    at = np.empty(heads.size, dtype=np.int64)
    extra: list[tuple[int, tuple[int, tuple[float, ...]]]] = []
    with _HEADS_LOCK:  # one caller at a time extends the memo's table
        memo = _HEADS
        version = encoders_version()
        if memo.version != version or len(memo.index) > _MEMO_MAX:
            memo.clear(version)
        index, get = memo.index, memo.index.get
        for k, i in enumerate(heads.tolist()):
            nd = nodes[i]
            key = (nd.op, id(nd.attrs), id(nd.input_shapes), id(nd.output_shapes), id(nd.input_is_param),
                   nd.output_dtype, nd.op_class)
            j = get(key)
            if j is None:
                token, attrs, known = encode_op(nd)
                row = (_TOKEN_INDEX[token],
                       (*attrs, *_shape_feats(nd), *(float(nd.output_dtype == d) for d in _DTYPES)))
                if not known:  # no encoder: counted and warned about at every use, never memoised
                    unknown_head[k] = True
                    extra.append((k, row))
                    j = -1
                else:
                    j = index[key] = memo.add(row, (nd.attrs, nd.input_shapes, nd.output_shapes, nd.input_is_param))
            at[k] = j
        toks, rows = memo.table(at)
    for k, (tok, row) in extra:
        toks[k] = tok
        rows[k] = row
    return toks, rows


class _HeadMemo:
    """Encoded head rows by node value (op, dtype, class and, by identity, attributes, shapes and parameter
    flags: the memo holds those objects, so no other object takes their ids while it lives)."""

    def __init__(self) -> None:
        self.version = -1
        self.index: dict[tuple[object, ...], int] = {}
        self._keep: list[tuple[object, ...]] = []
        self._new: list[tuple[int, tuple[float, ...]]] = []
        self._toks = np.zeros(0, dtype=np.int64)
        self._rows = np.zeros((0, _HEAD_W), dtype=np.float64)

    def clear(self, version: int) -> None:
        self.__init__()  # type: ignore[misc]
        self.version = version

    def add(self, row: tuple[int, tuple[float, ...]], keep: tuple[object, ...]) -> int:
        self._new.append(row)
        self._keep.append(keep)
        return self._toks.size + len(self._new) - 1

    def table(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token indices and rows of the entries ``at`` (``-1``: zeros, filled in by the caller)."""
        if self._new:
            self._toks = np.r_[self._toks, [t for t, _ in self._new]].astype(np.int64)
            self._rows = np.concatenate([self._rows, np.asarray([r for _, r in self._new], dtype=np.float64)])
            self._new = []
        ok = at >= 0
        toks = np.where(ok, self._toks[np.where(ok, at, 0)] if self._toks.size else 0, 0)
        rows = np.where(ok[:, None], self._rows[np.where(ok, at, 0)] if self._toks.size else 0.0, 0.0)
        return toks, rows


_HEADS = _HeadMemo()
_HEADS_LOCK = threading.Lock()


def _kernel_rows(st: GraphStack, sk: StackKernels, ests: Sequence["PriorEstimate"],
                 unknown: list[dict[str, int]]) -> np.ndarray:
    """The node feature rows of every kernel of the stack, ``[K, node_dim("ours")]`` float32 (the rows of
    ``_ours``, kernel after kernel)."""
    ntok, ncls = len(TOKENS), len(OP_CLASSES)
    nk = sk.heads.size
    rows = np.zeros((nk, node_dim("ours")), dtype=np.float32)
    o_attr = ntok
    o_cost = o_attr + ATTR_WIDTH + _SHAPE_W
    o_prior = o_cost + _COST_W
    o_misc = o_prior + _PRIOR_W
    o_cls = o_misc + 2
    o_dt = o_cls + ncls
    m = sk.members
    kid = np.repeat(np.arange(nk), sk.lengths)
    starts = np.cumsum(sk.lengths) - sk.lengths
    ints = [np.add.reduceat(getattr(st, c)[m], starts) for c in
            ("flops", "macs", "bytes_read", "bytes_written", "param_bytes")]
    t_ms = np.concatenate([np.asarray(e.node_time_ms, dtype=np.float64) for e in ests])
    h_ms = np.concatenate([np.asarray(e.node_host_ms, dtype=np.float64) for e in ests])
    util = np.concatenate([np.asarray(e.node_utilisation, dtype=np.float64) for e in ests])
    tt = np.bincount(kid, weights=t_ms[m], minlength=nk)  # sequential sums, in member order, as np.add.at
    ht = np.bincount(kid, weights=h_ms[m], minlength=nk)
    ut = np.maximum(np.maximum.reduceat(util[m], starts), 0.0)
    cls = st.op_class[m]
    counts = np.bincount(kid * (ncls + 1) + cls, minlength=nk * (ncls + 1)).reshape(nk, ncls + 1)[:, :ncls]
    member_unknown = ~st.known[m]
    member_unknown[starts] = False  # the head's own status is its encoder's
    any_unknown = np.logical_or.reduceat(member_unknown, starts)
    unknown_head = np.zeros(nk, dtype=bool)
    toks, head = _head_rows(st, sk.heads, unknown_head)
    any_unknown |= unknown_head
    if any_unknown.any():
        _count_unknown(st, sk, starts, unknown_head, any_unknown, unknown)
    rows[np.arange(nk), toks] = 1.0
    rows[:, o_attr:o_cost] = head[:, :ATTR_WIDTH + _SHAPE_W]
    rows[:, o_dt:o_dt + len(_DTYPES)] = head[:, ATTR_WIDTH + _SHAPE_W:]
    fl, mc, br, bw, pb = (v.astype(np.float64) for v in ints)
    ratio = fl / ((ints[2] + ints[3]).astype(np.float64) + 1.0)
    rows[:, o_cost:o_prior] = _lg(np.stack([fl, mc, br, bw, pb, ratio], 1))
    rows[:, o_prior] = _lg(tt * 1e3)
    rows[:, o_prior + 1] = _lg(ht * 1e3)
    rows[:, o_prior + 2] = ut
    rows[:, o_misc] = any_unknown
    rows[:, o_misc + 1] = _lg(sk.lengths.astype(np.float64))
    rows[:, o_cls:o_cls + ncls] = _lg(counts.astype(np.float64))
    rows[:, o_dt + len(_DTYPES)] = 1.0
    return rows


def _count_unknown(st: GraphStack, sk: StackKernels, starts: np.ndarray, unknown_head: np.ndarray,
                   any_unknown: np.ndarray, unknown: list[dict[str, int]]) -> None:
    """Count, per graph, the unknown ops of each kernel that has one: the head's without an encoder, the other
    members' without a formula (in kernel order, as the per-graph pass does)."""
    nodes = st.nodes
    for k in np.flatnonzero(any_unknown).tolist():
        g = int(st.graph_of[sk.heads[k]])
        d = unknown[g]
        a = int(starts[k])
        if unknown_head[k]:
            op = nodes[int(sk.heads[k])].op
            d[op] = d.get(op, 0) + 1
        for i in sk.members[a + 1:a + int(sk.lengths[k])].tolist():
            if not nodes[i].known:
                d[nodes[i].op] = d.get(nodes[i].op, 0) + 1


def _depths(st: GraphStack) -> np.ndarray:
    """``[G]`` int64: :meth:`OperatorGraph.depth` of each graph; over many graphs, one array step per node
    position (a node's producers come before it in its graph)."""
    if st.num_graphs < _LEVEL_STEP_MIN_GRAPHS:
        return np.fromiter((g.depth() for g in st.graphs), dtype=np.int64, count=st.num_graphs)
    w = (~st.is_constant).astype(np.int64)
    level = w.copy()
    pos = st.local[st.dst]
    order = np.argsort(pos, kind="stable")
    src, dst = st.src[order], st.dst[order]
    bounds = np.searchsorted(pos[order], np.arange(int(st.sizes.max()) + 1))
    for j in range(1, bounds.size - 1):
        a, b = bounds[j], bounds[j + 1]
        if a < b:
            d = dst[a:b]
            np.maximum.at(level, d, level[src[a:b]] + w[d])
    return np.maximum.reduceat(level, st.offsets[:-1])


_SPEC_FACTS: dict[object, tuple[int, int]] = {}


def _spec_facts(g: OperatorGraph) -> tuple[int, int]:
    """``(batch size, input elements)`` of a graph's spec (memoised by the spec's value)."""
    out = _SPEC_FACTS.get(g.spec)
    if out is None:
        if len(_SPEC_FACTS) >= _MEMO_MAX:
            _SPEC_FACTS.clear()
        out = _SPEC_FACTS[g.spec] = (g.spec.batch_size, sum(math.prod(s) for s in g.spec.batched_shapes().values()))
    return out


def _static_rows(st: GraphStack, sk: StackKernels, ests: Sequence["PriorEstimate"], dev: Device) -> np.ndarray:
    """The static feature vector of every graph, ``[G, static_dim("ours")]`` float32."""
    g_n = st.num_graphs
    starts = st.offsets[:-1]
    run = ~st.is_constant
    sums = [np.add.reduceat(np.where(run, getattr(st, c), 0), starts) for c in ("macs", "flops", "bytes_written")]
    count = [np.add.reduceat(v.astype(np.int64), starts) for v in
             (st.is_class("conv"), st.is_class("matmul"), st.op == "nn.relu")]
    facts = [_spec_facts(g) for g in st.graphs]
    e_feat = [utilisation_energy_j(e.node_time_ms, e.node_utilisation, e.latency_ms,
                                   dev if e.device == dev.id else resolve_device(e.device)) for e in ests]
    cols = np.array([
        sums[0], sums[1], [f[0] for f in facts], count[0], count[1], count[2],
        [g.param_count for g in st.graphs], [g.param_bytes for g in st.graphs], sums[2], _depths(st),
        st.sizes, np.diff(sk.kernel_offsets), [f[1] for f in facts],
        [e.latency_ms * 1e3 for e in ests], [e.host_ms * 1e3 for e in ests], [e.gpu_busy_ms * 1e3 for e in ests],
        [e.memory_mib for e in ests], [v * 1e3 if v is not None else 0.0 for v in e_feat],
    ], dtype=np.float64).T.reshape(g_n, 18)
    out = np.zeros((g_n, 19 + len(_DTYPES)), dtype=np.float32)
    out[:, :18] = _lg(cols)
    out[:, 18] = [float(v is not None) for v in e_feat]
    out[:, 19:] = [[float(g.spec.dtype == d) for d in _DTYPES] for g in st.graphs]
    return out
