"""Node, static and device feature tensors of one graph on one device.

Two styles:

- ``"ours"`` (default): the kernel graph of :func:`~dippm_nas.features.coarsen` with dataflow edges;
  per kernel the token one-hot (:data:`TOKENS`), ATTR_WIDTH attributes, shapes, summed FLOPs / MACs /
  bytes / weight bytes, the analytic prior's per-node device and host time on the target device,
  member counts per op class, dtype; graph-level static features (DIPPM's five and ours, prior
  totals); device features from the catalogue.
- ``"dippm"`` (the ablation): one node per operator (views and constants kept), **chain edges**
  ``i -> i+1`` as DIPPM built them, a 32-wide hashed op one-hot, 32 attribute and 32 shape slots, and
  DIPPM's five static features; no prior, no device features beyond the shared block.

Everything numeric is log-scaled (``log1p``) here; the model standardises with training statistics.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dippm_nas.devices import Device, resolve_device
from dippm_nas.features._coarsen import coarsen
from dippm_nas.features._registry import ATTR_WIDTH, TOKENS, encode_op
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OP_CLASSES, OperatorGraph, OpNode
from dippm_nas.prior import estimate as prior_estimate, execution_settings, utilisation_energy_j

if TYPE_CHECKING:  # pragma: no cover
    from dippm_nas.prior import DeploymentSettings, PriorEstimate, PriorParams

__all__ = [
    "FEATURE_SCHEMA_VERSION", "STYLES", "GraphFeatures", "featurize", "node_dim", "static_dim", "device_dim",
    "device_features",
]

#: Bumped whenever the meaning or width of any feature changes; checkpoints record it.
FEATURE_SCHEMA_VERSION = 1
#: Feature styles: ours and the DIPPM-style ablation.
STYLES: tuple[str, ...] = ("ours", "dippm")

_DTYPES = ("float32", "float16", "bfloat16")
_SHAPE_W = 6
_COST_W = 6
_PRIOR_W = 3
_DIPPM_W = 32


def node_dim(style: str = "ours") -> int:
    """Width of a node feature row."""
    if style == "dippm":
        return 3 * _DIPPM_W
    return len(TOKENS) + ATTR_WIDTH + _SHAPE_W + _COST_W + _PRIOR_W + 2 + len(OP_CLASSES) + len(_DTYPES) + 1


_STATIC_NAMES = (
    "total_macs", "total_flops", "batch_size", "num_conv", "num_dense", "num_relu", "param_count", "param_bytes",
    "activation_bytes", "depth", "num_nodes", "num_kernels", "input_elements",
    "prior_latency_ms", "prior_host_ms", "prior_gpu_busy_ms", "prior_memory_mib", "prior_energy_j", "has_energy",
)


def static_dim(style: str = "ours") -> int:
    """Width of the static (graph-level) feature vector."""
    return 5 if style == "dippm" else len(_STATIC_NAMES) + len(_DTYPES)


def static_dtype_columns(style: str = "ours") -> tuple[slice, tuple[str, ...]] | None:
    """Where the compute dtype's one-hot sits in the static vector, and the dtypes in column order;
    ``None`` for a style without it (``"dippm"``)."""
    if style == "dippm":
        return None
    return slice(len(_STATIC_NAMES), len(_STATIC_NAMES) + len(_DTYPES)), _DTYPES


_DEVICE_NAMES = ("is_gpu", "fp32_tflops", "half_tensor_tflops", "tf32_tflops", "bandwidth_gbps", "l2_mib", "sms",
                 "memory_gib", "host_dispatch_us", "board_power_w", "has_power")


def device_dim() -> int:
    """Width of the device feature vector."""
    return len(_DEVICE_NAMES)


def _lg(x: float | int | None) -> float:
    return math.log1p(max(float(x or 0.0), 0.0))


def device_features(device: Device) -> np.ndarray:
    """Log-scaled spec-sheet facts of ``device``. Shapes: ``[device_dim()]`` float32."""
    half = device.fp16_tensor_tflops or device.fp16_tflops or device.fp32_tflops
    return np.asarray([
        float(device.kind == "gpu"), _lg(device.fp32_tflops), _lg(half), _lg(device.tf32_tensor_tflops or device.fp32_tflops),
        _lg(device.bandwidth_gbps), _lg(device.l2_mib), _lg(device.sms), _lg(device.memory_gib),
        _lg(device.host_dispatch_us), _lg(device.board_power_w), float(device.board_power_w is not None),
    ], dtype=np.float32)


@dataclass
class GraphFeatures:
    """Feature tensors of one graph on one device.

    Shapes:
        - ``x``: ``[num_kernels, node_dim(style)]`` float32
        - ``edge_index``: ``[2, num_edges]`` int64 (dataflow direction; the model adds reverse edges)
        - ``static``: ``[static_dim(style)]`` float32
        - ``device``: ``[device_dim()]`` float32

    Attributes:
        prior_latency_ms, prior_memory_mib: the analytic prior's totals on the device.
        prior_energy_j: the prior's energy, ``None`` for devices without power figures.
        unknown_ops: ``{op: count}`` of nodes encoded without an encoder.
        style: ``"ours"`` or ``"dippm"``.
    """

    x: np.ndarray
    edge_index: np.ndarray
    static: np.ndarray
    device: np.ndarray
    prior_latency_ms: float
    prior_memory_mib: float
    prior_energy_j: float | None
    style: str = "ours"
    unknown_ops: dict[str, int] = field(default_factory=dict)
    estimate: Any = field(default=None, repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])


def featurize(graph: OperatorGraph, device: Device | str, *, style: str = "ours", fuse: bool = True,
              prior_params: "PriorParams | None" = None,
              estimate: "PriorEstimate | None" = None, execution: "DeploymentSettings | None" = None) -> GraphFeatures:
    """Feature tensors of ``graph`` on ``device``.

    Args:
        graph: a captured graph (validated by the prior).
        device: a catalogue id or :class:`Device`.
        style: ``"ours"`` or ``"dippm"`` (the ablation); see the module docstring.
        fuse: coarsen element-wise chains into kernels (``"ours"`` only).
        prior_params: constants of the analytic prior (a checkpoint pins the ones it was trained with).
        estimate: a prior estimate already computed for this graph and device (skips recomputing it).
        execution: how the pass is executed and timed (:class:`~dippm_nas.prior.DeploymentSettings`, a measured
            row's :func:`~dippm_nas.prior.row_settings`; a deprecated :class:`~dippm_nas.prior.Execution` is
            converted); default: eager on the default host profile, no input copy.

    Raises:
        InvalidValueError: unknown style; errors of the prior (unknown device, bad dtype, malformed graph).
    """
    if style not in STYLES:
        raise InvalidValueError(f"style must be one of {STYLES}, got {style!r}")
    dev = resolve_device(device)
    est = estimate if estimate is not None else prior_estimate(graph, dev, params=prior_params,
                                                                deployment=execution_settings(execution))
    unknown: dict[str, int] = {}
    if style == "dippm":
        x, ei, st = _dippm(graph, unknown)
    else:
        x, ei, st = _ours(graph, est, fuse, unknown, dev)
    return GraphFeatures(
        x=x, edge_index=ei, static=st, device=device_features(dev),
        prior_latency_ms=float(est.latency_ms), prior_memory_mib=float(est.memory_mib),
        prior_energy_j=None if est.energy_j is None else float(est.energy_j), style=style,
        unknown_ops=unknown, estimate=est,
    )


def _shape_feats(node: OpNode) -> list[float]:
    out = node.output_shape
    first_in = node.input_shapes[0] if node.input_shapes else ()
    return [
        _lg(node.output_elements), _lg(out[0] if len(out) > 0 else 1), _lg(out[1] if len(out) > 1 else 1),
        _lg(math.prod(out[2:]) if len(out) > 2 else 1), float(len(out)), _lg(math.prod(first_in) if first_in else 1),
    ]


def _lg_many(values: list[float]) -> list[float]:
    """:func:`_lg` of each value (``math.log1p``, as :func:`_lg`: numpy's ``log1p`` rounds differently)."""
    log1p = math.log1p
    return [log1p(v) if v > 0.0 else (v if v != v else 0.0) for v in values]  # nan stays nan, <= 0 gives 0


def _ours(graph: OperatorGraph, est: "PriorEstimate", fuse: bool, unknown: dict[str, int], dev: Device
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    kg = coarsen(graph, fuse=fuse)
    ntok, ncls = len(TOKENS), len(OP_CLASSES)
    nk = kg.num_kernels
    rows = np.zeros((nk, node_dim("ours")), dtype=np.float32)
    ks = _kernel_sums(graph, est, kg.groups)
    o_attr = ntok  # the head's token one-hot comes first (offset 0)
    o_shape = o_attr + ATTR_WIDTH
    o_cost = o_shape + _SHAPE_W
    o_prior = o_cost + _COST_W
    o_misc = o_prior + _PRIOR_W
    o_cls = o_misc + 2
    o_dt = o_cls + ncls
    hr = _head_rows(graph, kg.groups, ks.any_unknown, unknown, rows)
    rows[:, o_attr:o_cost] = hr[:, :ATTR_WIDTH + _SHAPE_W]
    rows[:, o_dt:o_dt + len(_DTYPES)] = hr[:, ATTR_WIDTH + _SHAPE_W:]
    fl, mc, br, bw, pb = (ks.ints[:, j].tolist() for j in range(5))
    ratio = [f / (r + w + 1.0) for f, r, w in zip(fl, br, bw)]
    cost = [_lg_many([float(v) for v in col]) for col in (fl, mc, br, bw, pb)] + [_lg_many(ratio)]
    rows[:, o_cost:o_prior] = np.asarray(cost, dtype=np.float64).T
    rows[:, o_prior] = _lg_many((ks.time_ms * 1e3).tolist())
    rows[:, o_prior + 1] = _lg_many((ks.host_ms * 1e3).tolist())
    rows[:, o_prior + 2] = ks.util
    rows[:, o_misc] = ks.any_unknown
    rows[:, o_misc + 1] = _lg_many(ks.lens.astype(np.float64).tolist())
    rows[:, o_cls:o_cls + ncls] = np.asarray(_lg_many(ks.counts[:, :ncls].ravel().tolist()),
                                             dtype=np.float64).reshape(nk, ncls)
    rows[:, o_dt + len(_DTYPES)] = 1.0
    return rows, kg.edge_index(), _ours_graph_row(graph, est, dev, nk)


@dataclass
class _KernelSums:
    """Per-kernel sums over each kernel's member nodes (one row per kernel)."""

    lens: np.ndarray         # members per kernel
    ints: np.ndarray         # flops, macs, bytes read, bytes written, param bytes (int64, exact)
    time_ms: np.ndarray      # prior node times, summed in member order
    host_ms: np.ndarray      # prior host times, summed in member order
    util: np.ndarray         # the members' largest utilisation
    counts: np.ndarray       # members per op class (last column: classes outside OP_CLASSES)
    any_unknown: np.ndarray  # a member other than the head is an unknown op


def _kernel_sums(graph: OperatorGraph, est: "PriorEstimate", groups: list[list[int]]) -> _KernelSums:
    """The sums over every kernel's members, each kernel's head first (the order the sums run in)."""
    nodes = graph.nodes
    nk = len(groups)
    lens = np.fromiter((len(m) for m in groups), dtype=np.int64, count=nk)
    flat = np.fromiter((i for m in groups for i in m), dtype=np.int64, count=int(lens.sum()))
    gid = np.repeat(np.arange(nk), lens)
    # integers exactly (int64), times in member order (np.add.at is sequential)
    ints = np.zeros((nk, 5), dtype=np.int64)
    np.add.at(ints, gid, np.array([(nodes[m].flops, nodes[m].macs, nodes[m].bytes_read, nodes[m].bytes_written,
                                    nodes[m].param_bytes) for m in flat.tolist()], dtype=np.int64).reshape(-1, 5))
    tt = np.zeros(nk)
    ht = np.zeros(nk)
    ut = np.zeros(nk)
    np.add.at(tt, gid, np.asarray(est.node_time_ms, dtype=np.float64)[flat])
    np.add.at(ht, gid, np.asarray(est.node_host_ms, dtype=np.float64)[flat])
    np.maximum.at(ut, gid, np.asarray(est.node_utilisation, dtype=np.float64)[flat])
    cls_index = {c: j for j, c in enumerate(OP_CLASSES)}
    cls_of = np.fromiter((cls_index.get(nodes[m].op_class, -1) for m in flat.tolist()), dtype=np.int64,
                         count=len(flat))
    counts = np.zeros((nk, len(OP_CLASSES) + 1))
    np.add.at(counts, (gid, cls_of), 1.0)  # column -1: classes outside OP_CLASSES (not a feature)
    head_pos = np.cumsum(lens) - lens
    member_unknown = np.fromiter((not nodes[m].known for m in flat.tolist()), dtype=bool, count=len(flat))
    member_unknown[head_pos] = False  # the head's own status is its encoder's (_head_rows)
    any_unknown = np.zeros(nk, dtype=bool)
    np.logical_or.at(any_unknown, gid, member_unknown)
    return _KernelSums(lens, ints, tt, ht, ut, counts, any_unknown)


def _head_rows(graph: OperatorGraph, groups: list[list[int]], any_unknown: np.ndarray,
               unknown: dict[str, int], rows: np.ndarray) -> np.ndarray:
    """Each kernel head's token one-hot (written into ``rows``), and its attributes, shapes and dtype
    one-hot (returned, one row per kernel); counts the unknown ops into ``unknown`` and marks
    ``any_unknown`` where the head is one."""
    nodes = graph.nodes
    tok_index = {t: j for j, t in enumerate(TOKENS)}
    head_rows = []
    for k, members in enumerate(groups):
        head = nodes[members[0]]
        token, attrs, known = encode_op(head)
        if not known:
            unknown[head.op] = unknown.get(head.op, 0) + 1
            any_unknown[k] = True
        if any_unknown[k]:  # the members' unknown ops, in the order the kernels list them
            for m in members[1:]:
                if not nodes[m].known:
                    unknown[nodes[m].op] = unknown.get(nodes[m].op, 0) + 1
        rows[k, tok_index[token]] = 1.0
        head_rows.append(list(attrs) + _shape_feats(head) + [float(head.output_dtype == d) for d in _DTYPES])
    return np.asarray(head_rows, dtype=np.float64).reshape(len(groups), ATTR_WIDTH + _SHAPE_W + len(_DTYPES))


def _ours_graph_row(graph: OperatorGraph, est: "PriorEstimate", dev: Device, nk: int) -> np.ndarray:
    """The graph-level features of the ``ours`` schema (static counts, the prior's totals, the dtype)."""
    sf = graph.static_features()
    input_elems = sum(math.prod(s) for s in graph.spec.batched_shapes().values())
    # the energy feature keeps the single-share formula the checkpoints were trained with (FEATURE_SCHEMA_VERSION 1)
    e_feat = utilisation_energy_j(est.node_time_ms, est.node_utilisation, est.latency_ms,
                                  dev if est.device == dev.id else resolve_device(est.device))
    st = [
        _lg(sf.total_macs), _lg(sf.total_flops), _lg(sf.batch_size), _lg(sf.num_conv), _lg(sf.num_dense),
        _lg(sf.num_relu), _lg(sf.param_count), _lg(sf.param_bytes), _lg(sf.activation_bytes), _lg(sf.depth),
        _lg(graph.num_nodes), _lg(nk), _lg(input_elems),
        _lg(est.latency_ms * 1e3), _lg(est.host_ms * 1e3), _lg(est.gpu_busy_ms * 1e3), _lg(est.memory_mib),
        _lg(e_feat * 1e3 if e_feat is not None else 0.0), float(e_feat is not None),
    ] + [float(graph.spec.dtype == d) for d in _DTYPES]
    return np.asarray(st, dtype=np.float32)


def _slot(op: str) -> int:
    return int(hashlib.md5(op.encode()).hexdigest(), 16) % _DIPPM_W


def _dippm(graph: OperatorGraph, unknown: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DIPPM-style: 32 op one-hot + 32 attributes + 32 shape values per operator; chain edges."""
    n = graph.num_nodes
    rows = np.zeros((n, 3 * _DIPPM_W), dtype=np.float32)
    for node in graph.nodes:
        i = node.index
        rows[i, _slot(node.op)] = 1.0
        if not node.known:
            unknown[node.op] = unknown.get(node.op, 0) + 1
        vals: list[float] = []
        for v in node.attrs.values():
            if isinstance(v, bool):
                vals.append(float(v))
            elif isinstance(v, (int, float)):
                vals.append(_lg(v))
            elif isinstance(v, (list, tuple)):
                vals.extend(_lg(a) for a in v if isinstance(a, (int, float)))
        vals = vals[:_DIPPM_W]
        rows[i, _DIPPM_W:_DIPPM_W + len(vals)] = vals
        shp = [_lg(d) for s in (*node.input_shapes, *node.output_shapes) for d in s][:_DIPPM_W]
        rows[i, 2 * _DIPPM_W:2 * _DIPPM_W + len(shp)] = shp
    ei = np.asarray([list(range(n - 1)), list(range(1, n))], dtype=np.int64).reshape(2, -1)
    sf = graph.static_features()
    st = np.asarray([_lg(sf.total_macs), _lg(sf.batch_size), _lg(sf.num_conv), _lg(sf.num_dense), _lg(sf.num_relu)],
                    dtype=np.float32)
    return rows, ei, st
