"""A host-CPU operator table: per-operator times learnt from operators timed *in place*, as the host prior.

The analytic prior turns each node's FLOPs and bytes into time with a handful of fitted constants; on a
CPU the achieved efficiency of a convolution or GEMM depends on its shapes in ways a few constants cannot
follow, and a GNN trained on whole-model latencies learns that only for families it has seen. An
:class:`OpTable` is learnt from ``torch.profiler`` timings of every top-level ``aten::`` call inside real
forward passes (``benchmarks/accuracy/host_op_table.py`` records them), so it sees tens of thousands of operator
timings instead of one label per model, and predicts unseen families much better
(docs/predictor_report.md, "Operators timed in place").

Calls and graph nodes meet as *canonical op records* ``(kind, x, w, p)``: the main input's shape, a second
shape (weight, other operand, keys; ``[]`` when none) and 8 numeric parameters (conv strides, padding,
dilation, groups; pool window; attention mask flag). The same records come from a profiled call
(:func:`aten_op_record`) and from a captured graph's nodes (:func:`graph_op_records`); views, scalar
arithmetic and bias adds (inside ``aten::conv2d`` / ``aten::linear``) are not records. A graph's latency
is ``scale · Σ table(record) + per_op_us · (number of records)``.

A table may also model **cache residency** (:attr:`OpTable.cache_bytes`): a timing loop runs the forward
pass again and again, and when everything one pass touches fits in the cache, the weights are still
cached at the next pass. A weight-bound GEMM (a small MLP at small batch) then runs about twice as fast
as the same shapes read from DRAM, which no other family teaches the forest. The table cannot learn it
either, so it is modelled: the capacity and the speed-up are measured on the machine
(:func:`dippm_nas.devices.measure_weight_cache`) and enter each record's reference time.

The table is a gradient-boosted forest (scikit-learn's ``HistGradientBoostingRegressor`` at fit time, an
optional dependency) stored as plain arrays in JSON and evaluated here with numpy: nothing is pickled.
It is carried by :class:`~dippm_nas.prior.PriorParams` (``op_tables``, per device id) and so pinned in a
checkpoint's ``prior_params``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas.errors import DippmNasError, InvalidValueError

__all__ = ["KINDS", "OpRecord", "OpTable", "aten_op_record", "graph_op_records", "record_features", "reference_us",
           "working_set_bytes", "fit_op_table", "OP_TABLE_FORMAT"]

#: records whose table time :meth:`OpTable.record_us` keeps (cleared when full)
_MEMO_RECORDS = 200_000

#: Version of the serialised table layout.
OP_TABLE_FORMAT = 1

#: (kind, main input shape, second shape, 8 parameters)
OpRecord = tuple[str, list[int], list[int], list[float]]

_ATEN_KIND = {
    "aten::conv1d": "conv", "aten::conv2d": "conv", "aten::convolution": "conv", "aten::linear": "linear",
    "aten::matmul": "matmul", "aten::bmm": "matmul", "aten::mm": "matmul",
    "aten::scaled_dot_product_attention": "sdpa", "aten::batch_norm": "bn", "aten::layer_norm": "ln",
    "aten::relu": "relu", "aten::gelu": "gelu", "aten::silu": "silu", "aten::sigmoid": "sigmoid",
    "aten::tanh": "tanh", "aten::hardswish": "hard", "aten::hardsigmoid": "hard", "aten::hardtanh": "hard",
    "aten::relu6": "hard", "aten::add": "add", "aten::sub": "add", "aten::mul": "mul", "aten::div": "mul",
    "aten::max_pool2d": "maxpool", "aten::avg_pool2d": "avgpool", "aten::adaptive_avg_pool2d": "gap",
    "aten::softmax": "softmax", "aten::cat": "cat", "aten::embedding": "embedding", "aten::mean": "mean",
}
_RELAX_KIND = {
    "nn.conv2d": "conv", "nn.conv1d": "conv", "nn.attention": "sdpa", "nn.attention_bias": "sdpa",
    "nn.batch_norm": "bn", "nn.layer_norm": "ln", "nn.relu": "relu", "nn.gelu": "gelu",
    "nn.gelu_tanh": "gelu", "nn.silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh", "clip": "hard",
    "add": "add", "subtract": "add", "multiply": "mul", "divide": "mul", "nn.max_pool2d": "maxpool",
    "nn.avg_pool2d": "avgpool", "nn.adaptive_avg_pool2d": "gap", "nn.softmax": "softmax", "concat": "cat",
    "mean": "mean",
}
#: Record kinds, in feature (one-hot) order.
KINDS: tuple[str, ...] = tuple(sorted(set(_ATEN_KIND.values()) | {"linear", "embedding"}))
_KIND_INDEX = {k: i for i, k in enumerate(KINDS)}
#: Number of features of a record (:func:`record_features`).
N_FEATURES = len(KINDS) + 3 + 8 + 8 + 1


def _p8(*vals: Any) -> list[float]:
    flat: list[float] = []
    for v in vals:
        flat += [float(t) for t in (v if isinstance(v, (list, tuple)) else [v])]
    return (flat + [0.0] * 8)[:8]


def _two(v: Any, default: int) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) and v else [default]
    return [int(v[0]), int(v[-1])]


def aten_op_record(name: str, input_shapes: Sequence[Any], concrete_inputs: Sequence[Any] = ()) -> OpRecord | None:
    """The record of one profiled top-level call (``FunctionEvent.name``, ``.input_shapes``,
    ``.concrete_inputs``), or ``None`` for calls that are not records (views, scalar arithmetic...)."""
    kind = _ATEN_KIND.get(name)
    if kind is None:
        return None
    shp = [[int(v) for v in s] if isinstance(s, (list, tuple)) else [] for s in input_shapes]
    ci = list(concrete_inputs)
    x = shp[0] if shp else []
    y = shp[1] if len(shp) > 1 else []

    def arg(i: int) -> Any:
        return ci[i] if len(ci) > i else None

    if kind in ("add", "mul"):
        if not x or not y:
            return None
        x, y = (x, y) if math.prod(x) >= math.prod(y) else (y, x)
        return kind, x, y, _p8()
    if kind == "conv":
        if len(x) == 3:  # conv1d as a 2-D conv of height 1
            return (kind, [x[0], x[1], 1, x[2]], [y[0], y[1], 1, y[2]],
                    _p8([1, _two(arg(3), 1)[0]], [0, _two(arg(4), 0)[0]], [1, _two(arg(5), 1)[0]], arg(6) or 1))
        return kind, x, y, _p8(_two(arg(3), 1), _two(arg(4), 0), _two(arg(5), 1), arg(6) or 1)
    if kind == "sdpa":
        return kind, x, y, _p8(1 if len(shp) > 3 and shp[3] else 0)
    if kind in ("maxpool", "avgpool"):
        k = _two(arg(1), 1)
        return kind, x, [], _p8(k, _two(arg(2), k[0]) if arg(2) else k, _two(arg(3), 0))
    if kind == "gap":
        return kind, x, [], _p8(_two(arg(1), 1))
    if kind == "embedding":
        return kind, x, [math.prod(y)] if y else [], _p8()
    if kind == "cat":
        return kind, [], [], _p8()  # the profiler does not record a tensor list's shapes
    if kind in ("linear", "matmul"):
        return kind, x, y, _p8()
    return kind, x, [], _p8()


#: Relax ops without a record whose eager counterpart the table leaves out on purpose: views and casts
#: (``aten::view``, ``aten::expand``, ``aten::slice``, ``aten::to``...), whose time the fitted map absorbs.
_ABSORBED_RELAX_OPS = frozenset({"astype", "zeros_like", "ones_like", "broadcast_to", "strided_slice"})


def graph_op_records(graph: Any) -> list[tuple[int, OpRecord]]:
    """``(node index, record)`` for the nodes of an :class:`~dippm_nas.graph.OperatorGraph` that run as an
    operator of their own in eager PyTorch (the same records :func:`aten_op_record` gives for its calls)."""
    return _walk(graph)[0]


def _walk(graph: Any) -> tuple[list[tuple[int, OpRecord]], list[int]]:
    """The records of a graph, and the indices of the nodes the table does not cover: ops with no record
    kind that are not views, constants or absorbed casts (e.g. a padding, a resize, a transposed conv).
    Those keep the analytic prior's time; they are never counted as free."""
    preds = graph.predecessors()
    nodes = graph.nodes
    out: list[tuple[int, OpRecord]] = []
    uncovered: list[int] = []
    for n in nodes:
        ins = [list(s) for s in n.input_shapes]
        if n.op == "take":
            if n.input_is_param and n.input_is_param[0] and len(ins) > 1:  # an embedding (also of a buffer)
                out.append((n.index, ("embedding", ins[0], [math.prod(ins[1])], _p8())))
            continue  # else a select of an activation: a view
        if n.is_constant:
            continue
        x = ins[0] if ins else []
        if n.op == "matmul":
            if len(ins) > 1 and len(n.input_is_param) > 1 and n.input_is_param[1] and len(ins[1]) == 2:
                out.append((n.index, ("linear", x, [ins[1][1], ins[1][0]], _p8())))
            elif len(ins) > 1:
                out.append((n.index, ("matmul", x, ins[1], _p8())))
            continue
        kind = _RELAX_KIND.get(n.op)
        if kind is None:
            if n.op_class != "view" and n.op not in _ABSORBED_RELAX_OPS:
                uncovered.append(n.index)
            continue
        a = n.attrs
        if kind in ("add", "mul"):
            if len(ins) < 2 or not ins[0] or not ins[1]:
                continue  # scalar arithmetic
            src = [nodes[i] for i in preds[n.index] if not nodes[i].is_constant]
            if kind == "add" and any(n.input_is_param) and src and src[0].op in ("nn.conv2d", "nn.conv1d", "matmul"):
                continue  # bias add: inside aten::conv2d / aten::linear
            if n.op == "multiply" and ins[0] == ins[1] and any(
                    s.op == "divide" and any(nodes[j].op == "clip" for j in preds[s.index]) for s in src):
                continue  # x * hardsigmoid(x): inside aten::hardswish
            y = ins[1]
            x, y = (x, y) if math.prod(x) >= math.prod(y) else (y, x)
            out.append((n.index, (kind, x, y, _p8())))
        elif kind == "conv":
            pad = list(a.get("padding") or [0, 0])
            w = ins[1]
            if len(x) == 3:
                out.append((n.index, (kind, [x[0], x[1], 1, x[2]], [w[0], w[1], 1, w[2]],
                                      _p8([1, _two(a.get("strides"), 1)[0]], [0, int(pad[0])],
                                          [1, _two(a.get("dilation"), 1)[0]], a.get("groups", 1)))))
            else:
                out.append((n.index, (kind, x, w, _p8(_two(a.get("strides"), 1),
                                                      [int(pad[0]), int(pad[1 if len(pad) > 1 else 0])],
                                                      _two(a.get("dilation"), 1), a.get("groups", 1)))))
        elif kind == "sdpa":
            q, k = ins[0], ins[1]  # Relax: (batch, seq, heads, dim); aten: (batch, heads, seq, dim)
            out.append((n.index, (kind, [q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]],
                                  _p8(1 if n.op == "nn.attention_bias" else 0))))
        elif kind in ("maxpool", "avgpool"):
            pad = list(a.get("padding") or [0, 0])
            out.append((n.index, (kind, x, [], _p8(_two(a.get("pool_size"), 1), _two(a.get("strides"), 1),
                                                   [int(pad[0]), int(pad[1 if len(pad) > 1 else 0])]))))
        elif kind == "gap":
            out.append((n.index, (kind, x, [], _p8(_two(a.get("output_size"), 1)))))
        elif kind == "cat":
            out.append((n.index, (kind, [], [], _p8())))
        else:
            act = [s for s, par in zip(ins, n.input_is_param) if not par]
            out.append((n.index, (kind, act[0] if act else x, [], _p8())))
    return out, uncovered


def _flops(kind: str, x: list[int], w: list[int], p: list[float]) -> float:
    """Multiply-add FLOPs of the dense kinds (2 per MAC); 0 for the rest."""
    if not x or not w:
        return 0.0
    if kind == "conv" and len(x) == 4 and len(w) == 4:
        sp = 1
        for j in range(2):
            o = (x[2 + j] + 2 * int(p[2 + j]) - int(p[4 + j]) * (w[2 + j] - 1) - 1) // max(int(p[j]), 1) + 1
            sp *= max(o, 1)
        return 2.0 * x[0] * w[0] * sp * math.prod(w[1:])
    if kind == "linear":
        return 2.0 * math.prod(x) * w[0]
    if kind == "matmul":
        return 2.0 * math.prod(x) * w[-1]
    if kind == "sdpa":
        return 4.0 * math.prod(x) * w[-2]
    return 0.0


#: A record's reference time: ``_BASE_US + FLOPs / _BASE_FLOPS_PER_US + elements / _BASE_ELEMS_PER_US``
#: (about 50 GFLOP/s and 8 GB/s of fp32). The forest learns the log ratio of the measured time to it, so
#: an operator larger than any profiled one scales with its work instead of stopping at the largest
#: leaf (trees do not extrapolate).
_BASE_US = 2.0
_BASE_FLOPS_PER_US = 5e4
_BASE_ELEMS_PER_US = 2e3


#: Kinds whose second shape is a weight (read from memory once per call).
_WEIGHT_KINDS = frozenset({"conv", "linear"})
#: Bytes per element the working set is counted in (the host tables are fitted on fp32 models).
_WORKING_SET_ELEM_BYTES = 4


def reference_us(r: OpRecord, *, weight_speedup: float = 1.0) -> float:
    """The record's reference time, µs (see ``_BASE_US``). ``weight_speedup`` > 1 divides the weight
    elements' share of the memory term: the weights of a conv or linear are read from cache, not from
    DRAM (see :attr:`OpTable.cache_bytes`)."""
    kind, x, w, p = r
    if kind == "embedding":  # rows looked up, not the whole table
        elems = (math.prod(w) if w else 0) * ((x[-1] if x else 0) + 1)
    else:
        wel = math.prod(w) if w else 0
        elems = (math.prod(x) if x else 0) + (wel / weight_speedup if kind in _WEIGHT_KINDS else wel)
    return _BASE_US + _flops(kind, list(x), list(w), list(p)) / _BASE_FLOPS_PER_US + elems / _BASE_ELEMS_PER_US


def _weight_speedup(working_set: float, cache_bytes: float, speedup: float) -> float:
    return float(speedup) if 0 < cache_bytes and working_set <= cache_bytes else 1.0


def working_set_bytes(records: Iterable[tuple[OpRecord, float]]) -> float:
    """Bytes one forward pass touches, as the table counts them: the weights of every conv and linear
    plus the main input of every record, each ``calls`` times, at 4 bytes per element (fp32).

    Args:
        records: ``(record, calls per forward)`` pairs (a graph's records each with 1).

    A timing loop runs the forward pass again and again; when this many bytes fit in the cache
    (:attr:`OpTable.cache_bytes`, measured: on a shared machine less than the last-level cache), the
    weights are still there at the next pass. Activations are not told apart: a record's input was just
    written by the record before it, so it is read from cache either way."""
    elems = 0.0
    for (kind, x, w, _), calls in records:
        elems += calls * ((math.prod(x) if x else 0) + (math.prod(w) if kind in _WEIGHT_KINDS and w else 0))
    return elems * _WORKING_SET_ELEM_BYTES


def record_features(r: OpRecord) -> list[float]:
    """The table's inputs for one record: kind one-hot, log sizes, trailing dims, parameters, log FLOPs."""
    kind, x, w, p = r
    one_hot = [0.0] * len(KINDS)
    one_hot[_KIND_INDEX[kind]] = 1.0
    d0 = ([0] * 4 + list(x))[-4:]
    d1 = ([0] * 4 + list(w))[-4:]
    return [*one_hot, math.log1p(math.prod(x) if x else 0), math.log1p(math.prod(w) if w else 0), float(len(x)),
            *[math.log1p(v) for v in d0], *[math.log1p(v) for v in d1], *[float(v) for v in p],
            math.log1p(_flops(kind, list(x), list(w), list(p)))]


@dataclass(frozen=True)
class OpTable:
    """A learnt per-operator time table of one machine (a forest over :func:`record_features`).

    Attributes:
        feature, threshold, left, right, value: the forest's nodes, concatenated over trees; a node
            goes left when ``features[feature] <= threshold``; ``left == -1`` marks a leaf, whose
            ``value`` adds to the log ratio of the record's time to its :func:`reference_us`.
        roots: index of each tree's root node.
        baseline_log: the forest's constant term (log ratio).
        scale: multiplies the summed table times (in-place profiling against labelled latency).
        per_op_us: time added per record (framework work between calls), µs.
        source: what the table was fitted on (profiles, labels, held-out families).
        metrics: the fit's figures, for the record.
        cache_bytes: how many bytes a forward pass may touch on the machine the table describes and
            still find its weights in cache at the next pass; 0 turns the residency model off (tables
            fitted before it existed). When a model's :func:`working_set_bytes` fit, every conv and linear
            record of the model reads its weights ``weight_cache_speedup`` times faster (its
            :func:`reference_us` says so), at fit time and at prediction time alike. Small MLPs at small
            batch are the case: their GEMMs read little but weights, which stay cached between passes.
        weight_cache_speedup: cold over hot time of a weight-bound GEMM on that machine (>= 1). Both are
            measured by :func:`dippm_nas.devices.measure_weight_cache` when the table is fitted.
    """

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    baseline_log: float
    scale: float = 1.0
    per_op_us: float = 0.0
    source: str = ""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    cache_bytes: float = 0.0
    weight_cache_speedup: float = 1.0
    _memo: dict[tuple[Any, ...], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.feature)
        if not (len(self.threshold) == len(self.left) == len(self.right) == len(self.value) == n) or n == 0:
            sizes = [len(a) for a in (self.feature, self.threshold, self.left, self.right, self.value)]
            raise InvalidValueError(f"OpTable node arrays must be non-empty and of one length, got {sizes}")
        inner = self.left >= 0
        if (np.any(self.feature[inner] < 0) or np.any(self.feature[inner] >= N_FEATURES)
                or np.any(self.left[inner] >= n) or np.any(self.right[inner] < 0) or np.any(self.right[inner] >= n)
                or np.any(self.roots < 0) or np.any(self.roots >= n)):
            raise InvalidValueError(f"OpTable: a node index or feature index is out of range (nodes {n}, "
                                    f"features {N_FEATURES})")
        for name in ("scale", "per_op_us", "baseline_log", "cache_bytes", "weight_cache_speedup"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidValueError(f"OpTable.{name} must be a finite number, got {v!r}")
        if self.scale <= 0 or self.per_op_us < 0:
            raise InvalidValueError(f"OpTable.scale must be > 0 and per_op_us >= 0, got {self.scale!r}, "
                                    f"{self.per_op_us!r}")
        if self.cache_bytes < 0 or self.weight_cache_speedup < 1:
            raise InvalidValueError(f"OpTable.cache_bytes must be >= 0 (0 = no residency model) and "
                                    f"weight_cache_speedup >= 1, got {self.cache_bytes!r}, "
                                    f"{self.weight_cache_speedup!r}")

    def clear_memo(self) -> None:
        """Forget the memoised record times (:meth:`record_us` then runs the forest on every record again:
        a cold start, e.g. for a speed figure)."""
        self._memo.clear()

    def weight_speedup(self, working_set: float) -> float:
        """The :func:`reference_us` weight speed-up of a model touching ``working_set`` bytes per pass:
        :attr:`weight_cache_speedup` when they fit in :attr:`cache_bytes`, else 1."""
        return _weight_speedup(working_set, self.cache_bytes, self.weight_cache_speedup)

    def record_us(self, records: Sequence[OpRecord], *, weight_speedup: float = 1.0) -> np.ndarray:
        """Table time of each record, µs (before :attr:`scale`); ``weight_speedup`` as in
        :func:`reference_us` (one model's records share it: :meth:`weight_speedup`). Records are memoised:
        a model repeats its blocks and the candidates of a search share most operators, so the forest
        runs on new ones only."""
        if not records:
            return np.zeros(0)
        keys = [(k, tuple(x), tuple(w), tuple(p), weight_speedup) for k, x, w, p in records]
        memo = self._memo
        vals: dict[tuple[Any, ...], float] = {}
        new = []
        for k in dict.fromkeys(keys):
            v = memo.get(k)
            if v is None:
                new.append(k)
            else:
                vals[k] = v
        if new:
            recs = [(k, list(x), list(w), list(p)) for k, x, w, p, _ in new]
            ref = np.array([reference_us(r, weight_speedup=weight_speedup) for r in recs])
            us = ref * np.exp(self.predict_log_ratio(np.asarray([record_features(r) for r in recs], dtype=np.float64)))
            vals.update(zip(new, us.tolist()))
            if len(memo) + len(new) > _MEMO_RECORDS:
                memo.clear()
            memo.update(zip(new, us.tolist()))
        return np.array([vals[k] for k in keys])

    def predict_log_ratio(self, x: np.ndarray) -> np.ndarray:
        """The forest on a feature matrix ``[records, N_FEATURES]``: log of time over reference time."""
        n_rec = len(x)
        flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
        idx = np.repeat(self.roots, n_rec)  # one walker per (tree, record), tree-major
        row = np.tile(np.arange(n_rec) * x.shape[1], len(self.roots))  # offset of its record in ``flat``
        inner = self.left >= 0
        active = np.flatnonzero(inner[idx])
        for _ in range(len(self.feature) + 1):  # a path is shorter than the node count unless a tree has a cycle
            if not active.size:
                break
            node = idx[active]
            go_left = flat[row[active] + self.feature[node]] <= self.threshold[node]
            nxt = np.where(go_left, self.left[node], self.right[node])
            idx[active] = nxt
            active = active[inner[nxt]]
        else:
            raise DippmNasError("OpTable: a tree's child links form a cycle; refit the table")
        return self.baseline_log + self.value[idx].reshape(len(self.roots), n_rec).sum(axis=0)

    def node_us(self, graph: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(compute µs, overhead µs, uncovered)`` per node of a graph: scaled table time and
        :attr:`per_op_us` at the nodes that are records, 0 at the nodes that run inside another call or
        not at all (views, bias adds, constants, casts), and ``uncovered`` (bool) at the nodes the table
        has no kind for, whose time the caller must take from elsewhere (the analytic prior does)."""
        recs, uncovered = _walk(graph)
        comp = np.zeros(len(graph.nodes))
        over = np.zeros(len(graph.nodes))
        if recs:
            idx = np.array([i for i, _ in recs])
            speedup = (self.weight_speedup(working_set_bytes((r, 1.0) for _, r in recs))
                       if self.cache_bytes > 0 else 1.0)  # no residency model: no working set to count
            comp[idx] = self.scale * self.record_us([r for _, r in recs], weight_speedup=speedup)
            over[idx] = self.per_op_us
        mask = np.zeros(len(graph.nodes), dtype=bool)
        mask[uncovered] = True
        return comp, over, mask

    # ------------------------------------------------------------ serialise
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": OP_TABLE_FORMAT, "kinds": list(KINDS), "n_features": N_FEATURES,
            "source": self.source, "metrics": dict(self.metrics),
            "baseline_log": self.baseline_log, "scale": self.scale, "per_op_us": self.per_op_us,
            "cache_bytes": self.cache_bytes, "weight_cache_speedup": self.weight_cache_speedup,
            "roots": self.roots.tolist(), "feature": self.feature.tolist(),
            "threshold": [float(f"{v:.9g}") for v in self.threshold.tolist()],
            "left": self.left.tolist(), "right": self.right.tolist(),
            "value": [float(f"{v:.7g}") for v in self.value.tolist()],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "<dict>") -> "OpTable":
        """Inverse of :meth:`to_dict`.

        Raises:
            DippmNasError: another format version or record schema, missing keys, or bad arrays.
        """
        if d.get("format") != OP_TABLE_FORMAT:
            raise InvalidValueError(f"{origin}: op table format must be {OP_TABLE_FORMAT}, got {d.get('format')!r}")
        if list(d.get("kinds") or []) != list(KINDS) or d.get("n_features") != N_FEATURES:
            raise InvalidValueError(f"{origin}: op table was fitted on another record schema (kinds "
                                    f"{d.get('kinds')!r}, {d.get('n_features')!r} features); this version has "
                                    f"{list(KINDS)}, {N_FEATURES}: refit it")
        need = ("roots", "feature", "threshold", "left", "right", "value", "baseline_log")
        missing = [k for k in need if k not in d]
        if missing:
            raise InvalidValueError(f"{origin}: op table lacks {missing}")
        try:
            arrays = {k: np.asarray(d[k], dtype=np.float64 if k in ("threshold", "value") else np.int64)
                      for k in ("feature", "threshold", "left", "right", "value", "roots")}
            numbers = {k: float(d.get(k, default)) for k, default in (
                ("baseline_log", None), ("scale", 1.0), ("per_op_us", 0.0), ("cache_bytes", 0.0),
                ("weight_cache_speedup", 1.0))}
        except (TypeError, ValueError) as e:
            raise InvalidValueError(f"{origin}: op table has a non-numeric array or number: {e}") from e
        return cls(**arrays, **numbers, source=str(d.get("source", "")), metrics=dict(d.get("metrics") or {}))


# ---------------------------------------------------------------- fitting (scikit-learn, optional)
def _profile_records(profile: Mapping[str, Any]) -> list[tuple[OpRecord, float, float]]:
    """``(record, µs per forward, calls per forward)`` of one profile line (``ops``: name, input shapes,
    concrete inputs, µs, calls)."""
    out = []
    for op in profile["ops"]:
        r = aten_op_record(op[0], op[1], op[2])
        if r is not None:
            out.append((r, float(op[3]), float(op[4])))
    return out


def _profile_speedups(recs: Sequence[Sequence[tuple[OpRecord, float, float]]], cache_bytes: float,
                      weight_cache_speedup: float) -> list[float]:
    """The :func:`reference_us` weight speed-up of each profiled model (see :attr:`OpTable.cache_bytes`)."""
    return [_weight_speedup(working_set_bytes((r, c) for r, _, c in rs), cache_bytes, weight_cache_speedup)
            for rs in recs]


def _forest(profiles: Sequence[Mapping[str, Any]], speedups: Sequence[float], *, max_iter: int,
            max_leaf_nodes: int, learning_rate: float, seed: int) -> OpTable:
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DippmNasError("fitting an op table needs scikit-learn: pip install 'dippm-nas[fit]' "
                            "(or pip install scikit-learn)") from e
    x, y, w = [], [], []
    for p, speedup in zip(profiles, speedups, strict=True):
        for r, us, calls in _profile_records(p):
            if calls > 0:
                x.append(record_features(r))
                y.append(math.log(max(us / calls, 0.05) / reference_us(r, weight_speedup=speedup)))
                w.append(calls)
    if len(x) < 50:
        raise InvalidValueError(f"fitting an op table needs at least 50 profiled calls, got {len(x)}")
    reg = HistGradientBoostingRegressor(max_iter=max_iter, learning_rate=learning_rate, max_leaf_nodes=max_leaf_nodes,
                                        min_samples_leaf=5, random_state=seed)
    reg.fit(np.asarray(x), np.asarray(y), sample_weight=np.asarray(w))
    return _from_sklearn(reg)


def _from_sklearn(reg: Any) -> OpTable:
    """The arrays of a fitted single-output ``HistGradientBoostingRegressor`` without categorical features."""
    feat, thr, left, right, val, roots = [], [], [], [], [], []
    for trees in reg._predictors:  # one list per iteration, one tree per output
        nodes = trees[0].nodes
        base = len(feat)
        roots.append(base)
        leaf = nodes["is_leaf"].astype(bool)
        feat += np.where(leaf, -1, nodes["feature_idx"]).astype(int).tolist()
        thr += nodes["num_threshold"].astype(float).tolist()
        left += np.where(leaf, -1, nodes["left"].astype(int) + base).tolist()
        right += np.where(leaf, -1, nodes["right"].astype(int) + base).tolist()
        val += np.where(leaf, nodes["value"], 0.0).astype(float).tolist()
    baseline = float(np.ravel(reg._baseline_prediction)[0])
    return OpTable(feature=np.asarray(feat), threshold=np.asarray(thr), left=np.asarray(left),
                   right=np.asarray(right), value=np.asarray(val), roots=np.asarray(roots), baseline_log=baseline)


def _fit_map(sums_us: np.ndarray, counts: np.ndarray, labels_us: np.ndarray) -> tuple[float, float]:
    """``(scale, per_op_us)`` minimising the squared relative error of ``scale·sum + per_op·count``;
    ``per_op_us`` is kept >= 0."""
    a = np.stack([sums_us, counts], 1) / labels_us[:, None]
    c = np.linalg.lstsq(a, np.ones(len(labels_us)), rcond=None)[0]
    if c[1] < 0:
        c = np.array([float(np.sum(a[:, 0]) / np.sum(a[:, 0] ** 2)), 0.0])
    return float(c[0]), float(c[1])


def fit_op_table(profiles: Iterable[Mapping[str, Any]], *, exclude_families: Sequence[str] = (),
                 folds: int = 4, max_iter: int = 400, max_leaf_nodes: int = 31, learning_rate: float = 0.08,
                 seed: int = 0, source: str = "", cache_bytes: float = 0.0,
                 weight_cache_speedup: float = 1.0) -> OpTable:
    """Fit a table on profiled models (lines written by ``benchmarks/accuracy/host_op_table.py``: ``family``,
    ``latency_ms`` label, ``ops``), leaving out ``exclude_families``.

    The forest learns log time per call from every profiled call; the map from summed table time to the
    labelled latency (:attr:`OpTable.scale`, :attr:`OpTable.per_op_us`) is fitted on sums *cross-fitted*
    by family (each family's sums come from a forest fitted without it, ``folds`` folds), so it is the map
    an unseen family gets.

    ``cache_bytes`` and ``weight_cache_speedup`` (the capacity and weight speed-up measured by
    :func:`dippm_nas.devices.measure_weight_cache`, not the last-level cache sysfs reports;
    :attr:`OpTable.cache_bytes`) turn the cache-residency model on; the defaults leave it off.

    Raises:
        DippmNasError: scikit-learn is missing, or fewer than two families / 50 calls remain.
    """
    if isinstance(profiles, (str, bytes, Mapping)) or not hasattr(profiles, "__iter__") \
            or isinstance(exclude_families, (str, bytes)) or not hasattr(exclude_families, "__iter__"):
        raise InvalidValueError(f"fit_op_table() takes an iterable of profile mappings and a list of families, got "
                                f"{type(profiles).__name__} and {type(exclude_families).__name__}")
    ex = set(exclude_families)
    prof = [p for p in profiles if isinstance(p, Mapping) and p.get("family") not in ex and p.get("latency_ms")]
    fams = sorted({p["family"] for p in prof})
    if len(fams) < 2:
        raise InvalidValueError(f"fitting an op table needs profiles of at least two families, got {fams}")
    kw = dict(max_iter=max_iter, max_leaf_nodes=max_leaf_nodes, learning_rate=learning_rate, seed=seed)
    recs = [_profile_records(p) for p in prof]
    speed = _profile_speedups(recs, cache_bytes, weight_cache_speedup)
    sums = np.zeros(len(prof))
    for k in range(min(folds, len(fams))):
        fold = set(fams[k::min(folds, len(fams))])
        keep = [i for i, p in enumerate(prof) if p["family"] not in fold]
        part = _forest([prof[i] for i in keep], [speed[i] for i in keep], **kw)
        for i, p in enumerate(prof):
            if p["family"] in fold:
                sums[i] = float(part.record_us([r for r, _, _ in recs[i]], weight_speedup=speed[i])
                                .dot([c for _, _, c in recs[i]]))
    counts = np.array([sum(c for _, _, c in rs) for rs in recs])
    labels = np.array([float(p["latency_ms"]) * 1e3 for p in prof])
    scale, per_op = _fit_map(sums, counts, labels)
    pred = scale * sums + per_op * counts
    mape = float(100 * np.mean(np.abs(pred / labels - 1)))
    table = _forest(prof, speed, **kw)
    return OpTable(feature=table.feature, threshold=table.threshold, left=table.left, right=table.right,
                   value=table.value, roots=table.roots, baseline_log=table.baseline_log, scale=scale,
                   per_op_us=per_op, source=source, cache_bytes=float(cache_bytes),
                   weight_cache_speedup=float(weight_cache_speedup),
                   metrics={"models": len(prof), "families": fams, "excluded_families": sorted(ex),
                            "cross_fitted_mape_pct": mape, "trees": int(len(table.roots)),
                            "nodes": int(len(table.feature)),
                            "cache_resident_models": int(sum(v > 1 for v in speed))})
