"""Per-node time on a device: roofline with efficiencies, wave quantisation and fixed kernel costs.

For every node of an :class:`~dippm_nas.graph.OperatorGraph` this module decides

- which peak applies: tensor cores for convolutions/matmuls/attention in FP16/BF16 (and in FP32 when
  TF32 is allowed: PyTorch allows it for cuDNN convolutions by default, not for matmuls), CUDA cores
  otherwise and for depthwise convolutions;
- the GPU time: ``kernels * kernel_us + max(compute, memory)`` with
  ``compute = flops / (peak * eta * wave_eff ** wave_exponent * tile_eff ** tile_exponent)`` and
  ``memory = bytes / (bandwidth * eta_memory)`` (part of the bytes at L2 speed when they fit in L2);
- the eager host time: with a fitted host model (:mod:`dippm_nas.prior._host`) the per-operator host time
  of the operator's kind plus a launch per further kernel, scaled to the host profile; without one the
  framework dispatch per op plus one launch per kernel (views: a small dispatch only; constant-folded
  nodes: nothing).

:func:`kernel_time_us` is the vectorised core the calibration script fits.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas.deployment import AUTOCAST_DTYPES
from dippm_nas.devices import Device, HostProfile, default_host_profile
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OP_CLASSES, OperatorGraph, OpNode, node_columns
from dippm_nas.prior._autocast import AutocastPlan, autocast_plan
from dippm_nas.prior._math_path import math_path_plan
from dippm_nas.prior._host import HOST_KINDS, host_kind, module_call
from dippm_nas.prior._params import CONTRACTION_CLASSES, PARAM_CLASSES, PriorParams
from dippm_nas.prior._resize import serial_loop_us, serial_resize_loops
from dippm_nas.prior._sdpa import AttentionShape, attention_shape, math_path_score_bytes, mma_share, sdpa_backend_codes

__all__ = ["NodeCosts", "node_costs", "facts_costs", "KernelTerms", "kernel_terms", "gemm_epilogue", "retimed", "host_times", "costs_of_terms", "check_autocast", "kernel_time_us", "wave_efficiency", "contraction_tiles", "param_class",
           "GraphFacts", "graph_facts", "graph_facts_many", "clear_graph_facts"]


def wave_efficiency(tiles: "np.ndarray | float", sms: int) -> "np.ndarray | float":
    """Fraction of SM-time doing useful work when ``tiles`` thread blocks run in waves over ``sms`` SMs.

    ``tiles / (ceil(tiles / sms) * sms)``: 1 when the tiles fill whole waves, ``tiles / sms`` for a
    single partial wave.
    """
    t = np.maximum(np.asarray(tiles, dtype=np.float64), 1.0)
    return t / (np.ceil(t / sms) * sms)


def kernel_time_us(
    flops: Any, bytes_: Any, *, peak_tflops: Any, bandwidth_gbps: float, eta_compute: Any, eta_memory: Any,
    kernel_us: Any, kernels: Any, wave_eff: Any = 1.0, wave_exponent: Any = 0.0, tile_eff: Any = 1.0,
    tile_exponent: Any = 0.0, reduction_k: Any = 1.0, k_half: Any = 0.0, l2_fraction: Any = 0.0,
    l2_speedup: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU time of kernels from their work, vectorised over nodes.

    Args:
        flops: floating-point operations per node.
        bytes_: bytes moved per node.
        peak_tflops: the peak that applies per node, TFLOP/s.
        bandwidth_gbps: DRAM bandwidth, GB/s.
        eta_compute, eta_memory: achieved fractions of peak and bandwidth.
        kernel_us: fixed time per kernel, µs; ``kernels``: kernels per node.
        wave_eff: wave efficiency per node (see :func:`wave_efficiency`); ``wave_exponent`` its weight.
        tile_eff: share of the padded output tiles holding real outputs; ``tile_exponent`` its weight.
        reduction_k: GEMM reduction length per node; efficiency is scaled by ``k / (k + k_half)``.
        l2_fraction: share of the bytes served from L2, at ``l2_speedup`` times the DRAM bandwidth.

    Returns:
        ``(time_us, compute_us, memory_us)`` arrays.

    Shapes:
        every array argument broadcasts to ``[num_nodes]``; the results are ``[num_nodes]``.
    """
    f = np.asarray(flops, dtype=np.float64)
    b = np.asarray(bytes_, dtype=np.float64)
    eff = (np.asarray(eta_compute, dtype=np.float64) * _power(wave_eff, wave_exponent)
           * _power(tile_eff, tile_exponent))
    k = np.maximum(np.asarray(reduction_k, dtype=np.float64), 1.0)
    eff = eff * k / (k + np.asarray(k_half, dtype=np.float64))
    compute_us = f / (np.asarray(peak_tflops, dtype=np.float64) * 1e12 * eff) * 1e6
    l2 = np.clip(np.asarray(l2_fraction, dtype=np.float64), 0.0, 1.0)
    per_byte = (1.0 - l2) + l2 / l2_speedup
    memory_us = b * per_byte / (bandwidth_gbps * 1e9 * np.asarray(eta_memory, dtype=np.float64)) * 1e6
    fixed = np.asarray(kernels, dtype=np.float64) * np.asarray(kernel_us, dtype=np.float64)
    return fixed + np.maximum(compute_us, memory_us), compute_us, memory_us


def _power(base: Any, exponent: Any) -> np.ndarray:
    """``base ** exponent``, evaluated only where the exponent is not 0 (``x ** 0`` is 1 exactly): most nodes
    are not contractions, whose efficiency terms have exponent 0."""
    b = np.asarray(base, dtype=np.float64)
    e = np.asarray(exponent, dtype=np.float64)
    if b.shape != e.shape or b.ndim != 1:
        return np.power(b, e)
    out = np.ones_like(b)
    m = e != 0.0
    out[m] = np.power(b[m], e[m])
    return out


def contraction_tiles(node: OpNode, tile_m: int, tile_n: int) -> tuple[int, float]:
    """Thread blocks of the implicit GEMM of a conv/matmul/attention node (tile ``tile_m x tile_n``)
    and the share of the padded tiles that holds real outputs.

    Conv: ``M = output elements / out_channels`` (batch x output pixels), ``N = out_channels / groups``,
    one GEMM per group. Matmul: ``m x n`` per batch, except that a batched left operand times a 2-D
    right operand (``(..., M, K) @ (K, N)``, e.g. a linear layer on a (tokens, batch, features)
    activation) is one ``(... x M) x N`` GEMM, as ``torch.matmul`` and cuBLAS run it, not ``batch``
    small ones. Attention: output elements over a tile, except a decode step's attention whose node says how many
    cache tokens one thread block reads (``kv_partition``, a serving engine's paged-attention kernel): one full
    block per sequence, query head and partition of the cache.
    """
    kind, m, n, batch, out_elems = _tile_shape(node)
    if kind == _BLOCKS:
        return m, 1.0
    if kind:
        return _gemm_tiles(m, n, batch, tile_m, tile_n)
    tiles = math.ceil(out_elems / (tile_m * tile_n))
    return tiles, out_elems / (tiles * tile_m * tile_n)


#: ``_tile_shape``'s first field: 0 output elements tiled, 1 a GEMM, ``_BLOCKS`` thread blocks counted (``m``).
_BLOCKS = 2


def _tile_shape(node: OpNode) -> tuple[int, int, int, int, int]:
    """``(kind, m, n, batch, output elements)`` of a contraction node for :func:`contraction_tiles`: the GEMM's
    sizes where it is one (kind 1), the thread blocks of a partitioned decode attention (kind ``_BLOCKS``, ``m``
    blocks), else the output elements tiled (kind 0)."""
    out_elems = max(1, node.output_elements if len(node.output_shapes) == 1 else math.prod(node.output_shape))
    a = node.attrs
    if node.op_class == "attention" and a.get("kv_partition") and int(a.get("seq_q", 0) or 0) == 1:
        blocks = (int(a.get("batch", 1) or 1) * int(a.get("heads", 1) or 1)
                  * math.ceil(int(a.get("seq_k", 1) or 1) / int(a["kv_partition"])))
        return _BLOCKS, max(blocks, 1), 1, 1, out_elems
    if node.op_class == "conv":
        groups = int(a.get("groups", 1) or 1)
        cout = int(a.get("out_channels") or _channels(node.output_shape, str(a.get("out_layout") or a.get("data_layout") or "NCHW")))
        return 1, max(out_elems // max(cout, 1), 1), max(cout // max(groups, 1), 1), groups, out_elems
    if node.op_class == "matmul" and "m" in a and "n" in a:
        batch, m = int(a.get("batch", 1) or 1), max(int(a["m"]), 1)
        if len(node.input_shapes) >= 2 and len(node.input_shapes[1]) == 2:  # folded into one GEMM
            batch, m = 1, m * batch
        return 1, m, max(int(a["n"]), 1), batch, out_elems
    return 0, 0, 0, 0, out_elems


def _gemm_tiles(m: int, n: int, batch: int, tile_m: int, tile_n: int) -> tuple[int, float]:
    tm, tn = math.ceil(m / tile_m), math.ceil(n / tile_n)
    return tm * tn * batch, (m / (tm * tile_m)) * (n / (tn * tile_n))


def _channels(shape: tuple[int, ...], layout: str) -> int:
    if not shape:
        return 1
    if "C" in layout and len(layout) == len(shape):
        return shape[layout.index("C")]
    return shape[1] if len(shape) > 1 else shape[0]


def param_class(node: OpNode) -> str:
    """The constants class of a node: its op class, or ``conv_depthwise`` for grouped convolutions
    with at most 4 input channels per group (CUDA-core kernels, memory-bound)."""
    if node.op_class == "conv":
        groups = int(node.attrs.get("groups", 1) or 1)
        per_group = node.attrs.get("in_channels_per_group")
        if node.attrs.get("depthwise") or (groups > 1 and per_group is not None and int(per_group) <= 4):
            return "conv_depthwise"
    return node.op_class if node.op_class in _KNOWN_CLASSES else "unknown"


_KNOWN_CLASSES = frozenset({
    "conv", "matmul", "attention", "elementwise", "activation", "normalization", "pool", "reduction",
    "softmax", "memory", "gather", "cast", "unknown",
})


@dataclass(frozen=True)
class NodeCosts:
    """Per-node figures of one graph on one device.

    Shapes:
        every array is ``[num_nodes]`` (float64 unless said otherwise).

    Attributes:
        gpu_us: device time of the node's kernels, µs (0 for views and constant-folded nodes).
        host_us: host time to dispatch the node and launch its kernels, µs.
        compute_us, memory_us: the two roofline terms, µs.
        kernels: kernels launched.
        utilisation: share of the limiting resource's peak in use while the node runs, ``[0, 1]``.
        tensor_core: bool, the node ran on tensor cores.
        classes: constants class of each node.
    """

    gpu_us: np.ndarray
    host_us: np.ndarray
    compute_us: np.ndarray
    memory_us: np.ndarray
    kernels: np.ndarray
    utilisation: np.ndarray
    tensor_core: np.ndarray
    classes: tuple[str, ...]


_DT_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
_CLASS_INDEX = {c: i for i, c in enumerate(PARAM_CLASSES)}
_HOST_KIND_INDEX = {k: i for i, k in enumerate(HOST_KINDS)}
_CONTRACTION_IDX = np.array([c in CONTRACTION_CLASSES for c in PARAM_CLASSES])


@dataclass
class GraphFacts:
    """Device-independent facts of a graph the prior needs, computed once per graph (see :func:`graph_facts`).

    Shapes:
        arrays are ``[num_nodes]``.
    """

    classes: tuple[str, ...]
    cls_idx: np.ndarray          # index into PARAM_CLASSES
    active: np.ndarray           # bool: launches kernels (not constant, not a view)
    view: np.ndarray             # bool: a view (host dispatch only)
    fused: np.ndarray            # bool: bias add run inside the preceding conv/matmul call
    gemm_bias: np.ndarray        # bool: such a bias add after a GEMM (matmul class): cuBLASLt's bias epilogue, no kernel
    inner_view: np.ndarray       # bool: a view taken inside another operator's dispatch (no host time of its own):
    #                              a roll's slices, an unbind's squeezes
    internal: np.ndarray         # bool: a kernel launched inside the preceding operator's dispatch (a roll's later dim)
    hard_inner: np.ndarray       # bool: add/clip/divide of a decomposed hardswish/hardsigmoid (one kernel), abs and
    #                              powers of a decomposed vector norm (run inside its sum's kernel)
    hard_extra_bytes: np.ndarray  # bytes the last node of such a kernel reads beyond the one input it needs
    host_kind: np.ndarray        # index into HOST_KINDS of each node's op class
    module_call: np.ndarray      # bool: eager issues the node through an nn.Module call (_host.module_call)
    conv: np.ndarray             # bool: op_class conv (not depthwise)
    contraction: np.ndarray      # bool: conv/matmul/attention constants class
    dtype: np.ndarray            # 0 fp32, 1 fp16, 2 bf16, 3 fp64, -1 other
    flops: np.ndarray
    bytes: np.ndarray            # read + written
    act_bytes: np.ndarray        # activation bytes read + written (no weights)
    reduction_k: np.ndarray      # GEMM reduction length of contraction nodes (MACs per output element)
    dtypes: frozenset[str]
    uses_cublas: bool
    _tiles: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]
    _tile_shape: np.ndarray      # [num_nodes, 5] float64: _tile_shape() of active contraction nodes, 0 elsewhere
    _nodes: list[OpNode]
    _preds: "_Adjacency"         # each node's producers (local indices, as graph.predecessors() lists them)
    memory: Any = None           # MemoryBreakdown of the liveness pass, filled by the estimator
    _plans: dict[Any, Any] = field(default_factory=dict)  # autocast plans and channels-last copies, by setting

    def native_depthwise(self) -> np.ndarray:
        """Per node: a depthwise convolution (one input channel per group, the frontend's ``depthwise`` flag),
        which eager PyTorch runs in its own kernel where cuDNN does not take it; grouped convolutions with more
        channels per group (ResNeXt) stay cuDNN's. ``[num_nodes]`` bool."""
        if "native_depthwise" not in self._plans:
            dw = self.cls_idx == _CLASS_INDEX["conv_depthwise"]
            if dw.any():
                dw = dw & np.array([bool(n.attrs.get("depthwise"))
                                    or int(n.attrs.get("in_channels_per_group") or 0) == 1 for n in self._nodes],
                                   dtype=bool)
            self._plans["native_depthwise"] = dw
        return self._plans["native_depthwise"]

    def autocast(self, graph: OperatorGraph, low: str) -> AutocastPlan:
        """The :class:`~dippm_nas.prior._autocast.AutocastPlan` of ``graph`` (whose facts these are) under
        autocast to ``low``, computed once."""
        key = ("autocast", low)
        if key not in self._plans:
            self._plans[key] = autocast_plan(graph, low, self.classes, self.dtype, self.fused)
        return self._plans[key]

    def math_path(self, graph: OperatorGraph, low: str | None, float32: bool) -> AutocastPlan | None:
        """The plan of ``graph`` with its SDPA math path priced as a PyTorch version runs it
        (:func:`~dippm_nas.prior._math_path.math_path_plan`; ``None``: no math-path node), computed once."""
        key = ("math_path", low, float32)
        if key not in self._plans:
            base = self.autocast(graph, low) if low is not None else None
            self._plans[key] = math_path_plan(graph, self.dtype, self.active, base, low, float32)
        return self._plans[key]

    def reshape_copies(self) -> np.ndarray:
        """Per node, the elements a reshape copies because its input is a permuted (non-contiguous) view:
        ``x.permute(...).reshape(...)`` / ``.transpose(1, 2).reshape(...)`` (window partitions, attention heads
        merged back) cannot be a view, so eager PyTorch copies the tensor (one kernel). ``[num_nodes]`` float64,
        0 elsewhere."""
        def copied(i: int, nd: Any) -> float:
            src = [q for q in self._preds[i] if not self._nodes[q].is_constant]
            if len(src) == 1 and self._nodes[src[0]].op == "permute_dims" and _moves_data(self._nodes[src[0]]):
                return float(math.prod(nd.output_shape))
            return 0.0
        return self._per_reshape("reshape_copies", copied)

    def channels_last_copies(self, graph: OperatorGraph) -> np.ndarray:
        """Per node, the elements a channels-last activation copies where it is reshaped to another rank
        (``x.flatten(1)``, ``x.reshape(n, c, -1)`` of an NHWC tensor with more than one pixel cannot be a
        view; PyTorch copies it to a contiguous tensor). ``[num_nodes]`` float64, 0 elsewhere."""
        def copied(i: int, nd: Any) -> float:
            shape = next((sh for sh, par in zip(nd.input_shapes, nd.input_is_param) if not par), ())
            if len(shape) == 4 and shape[2] * shape[3] > 1 and len(nd.output_shape) != 4:
                return float(math.prod(shape))
            return 0.0
        return self._per_reshape("channels_last", copied)

    def _per_reshape(self, key: str, copied: Callable[[int, Any], float]) -> np.ndarray:
        """``copied(index, node)`` of every reshape among the view nodes, 0 elsewhere; computed once per ``key``."""
        if key not in self._plans:
            out = np.zeros(len(self._nodes))
            for i in np.flatnonzero(self.view):
                nd = self._nodes[i]
                if nd.op in _RESHAPES:
                    out[i] = copied(int(i), nd)
            self._plans[key] = out
        return self._plans[key]

    def serial_resizes(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node, ``(iterations per thread, threads)`` of the bilinear / bicubic NCHW resizes eager PyTorch runs
        as a loop over batch and channels in each thread (:func:`~dippm_nas.prior._resize.serial_resize_loops`),
        computed once. ``[num_nodes]`` float64 each, 0 elsewhere."""
        if "serial_resizes" not in self._plans:
            self._plans["serial_resizes"] = serial_resize_loops(self._nodes, self._preds)
        return self._plans["serial_resizes"]

    def attention_shape(self) -> AttentionShape:
        """The :class:`~dippm_nas.prior._sdpa.AttentionShape` of the graph's nodes (SDPA calls), computed once."""
        if "attention_shape" not in self._plans:
            self._plans["attention_shape"] = attention_shape(self._nodes)
        return self._plans["attention_shape"]

    def unknown_ops(self) -> dict[str, int]:
        """``{op: count}`` of the graph's nodes without a formula (:attr:`OperatorGraph.unknown_ops`, counted
        once; a new dict on every call)."""
        if "unknown_ops" not in self._plans:
            out: dict[str, int] = {}
            for n in self._nodes:
                if not n.known:
                    out[n.op] = out.get(n.op, 0) + 1
            self._plans["unknown_ops"] = out
        return dict(self._plans["unknown_ops"])

    def tiles(self, tile_m: int, tile_n: int) -> tuple[np.ndarray, np.ndarray]:
        """(thread blocks, tile efficiency) of every contraction node for a tile size (1 elsewhere): the
        arithmetic of :func:`contraction_tiles` over the nodes' tile shapes at once (the same float64 figures)."""
        key = (tile_m, tile_n)
        if key not in self._tiles:
            n = len(self._nodes)
            t, e = np.ones(n), np.ones(n)
            sel = self.contraction & self.active
            gemm = sel & (self._tile_shape[:, 0] == 1)
            m, nn, b = (self._tile_shape[gemm, j] for j in (1, 2, 3))
            tm, tn = np.ceil(m / tile_m), np.ceil(nn / tile_n)
            t[gemm], e[gemm] = tm * tn * b, (m / (tm * tile_m)) * (nn / (tn * tile_n))
            blocks = sel & (self._tile_shape[:, 0] == _BLOCKS)
            t[blocks] = self._tile_shape[blocks, 1]
            flat = sel & ~gemm & ~blocks
            out = self._tile_shape[flat, 4]
            tiles = np.ceil(out / (tile_m * tile_n))
            t[flat], e[flat] = tiles, out / (tiles * tile_m * tile_n)
            self._tiles[key] = (t, e)
        return self._tiles[key]


def _rolls(nodes: Sequence[OpNode], preds: "_Adjacency", succ: "_Adjacency",
           concats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Find the frontend's decomposition of ``torch.roll``: per rolled dimension a ``concat`` of two
    ``strided_slice`` views of one tensor, each view read only by that concat; a roll over several dimensions
    chains them. Eager PyTorch dispatches one ``roll`` for all its dimensions (one kernel per dimension).

    ``nodes``: the nodes of one or more graphs, one after the other, found by their position in it (as
    ``preds`` and ``succ`` give them); ``concats``: the positions of the non-constant ``concat`` nodes, in order
    (the only candidates).

    Returns ``(inner, internal)``: ``inner`` marks the slices (views inside the roll, no host time of their
    own); ``internal`` the concats of the later dimensions (a kernel launched inside the first one's dispatch).
    """
    n = len(nodes)
    inner = np.zeros(n, dtype=bool)
    internal = np.zeros(n, dtype=bool)
    roll = np.zeros(n, dtype=bool)
    for i in concats.tolist():
        nd = nodes[i]
        ps = preds[i]
        if len(ps) != 2 or len(nd.input_shapes) != 2 or any(nodes[q].op != "strided_slice" for q in ps):
            continue
        src = [preds[q] for q in ps]
        if src[0] != src[1] or len(src[0]) != 1 or any(succ[q] != [i] for q in ps):
            continue
        roll[i] = True
        inner[ps] = True
        s0 = src[0][0]
        if roll[s0] and sorted(succ[s0]) == sorted(ps):  # the roll's previous dimension: one dispatch
            internal[i] = True
    return inner, internal


def _unbinds(nodes: Sequence[OpNode], preds: "_Adjacency") -> np.ndarray:
    """Find the frontend's decomposition of ``torch.unbind`` (``q, k, v = qkv.unbind(0)``): a ``split`` and one
    ``squeeze`` per piece, each reading only that split. Eager PyTorch dispatches one ``unbind`` (the split's
    view); the squeezes are taken inside it. Returns the squeezes (views without host time of their own).

    ``nodes``, ``preds`` as for :func:`_rolls`."""
    inner = np.zeros(len(nodes), dtype=bool)
    for i, nd in enumerate(nodes):
        if nd.op == "squeeze":
            ps = preds[i]
            if len(ps) == 1 and nodes[ps[0]].op == "split":
                inner[i] = True
    return inner


def _vector_norms(nodes: Sequence[OpNode], succ: "_Adjacency") -> np.ndarray:
    """Find the frontend's decomposition of ``torch.linalg.vector_norm`` (``F.normalize``, SwinV2's cosine
    attention): ``abs``, ``power`` by a scalar, ``sum``, ``power`` by a scalar, each the only consumer of the one
    before. Eager PyTorch dispatches one ``linalg_vector_norm`` (one reduction kernel). Returns the abs and the
    two powers (run inside the sum's kernel: no kernel and no host time of their own).

    ``nodes``, ``succ`` as for :func:`_rolls`."""
    inner = np.zeros(len(nodes), dtype=bool)
    for i, nd in enumerate(nodes):
        if nd.op != "abs" or nd.is_constant:
            continue
        chain = [i]
        for want in ("power", "sum", "power"):
            after = succ[chain[-1]]
            if len(after) != 1 or nodes[after[0]].op != want:
                break
            chain.append(after[0])
        if len(chain) == 4 and all(_scalar_param_input(nodes[q]) for q in (chain[1], chain[3])):
            inner[[chain[0], chain[1], chain[3]]] = True
    return inner


def _scalar_param_input(nd: OpNode) -> bool:
    """``nd`` has two inputs: one tensor and one scalar weight (``x + 3``, ``x / 6``)."""
    par, shapes = nd.input_is_param, nd.input_shapes
    return (len(par) == 2 and len(shapes) == 2 and sum(par) == 1
            and any(p and len(s) == 0 for p, s in zip(par, shapes)))


def _hard_activations(nodes: Sequence[OpNode], preds: "_Adjacency", succ: "_Adjacency",
                      adds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Find the frontend's decomposition of ``hardsigmoid(x) = clip(x + 3, 0, 6) / 6`` and
    ``hardswish(x) = x * hardsigmoid(x)``: an ``add`` of a scalar, a ``clip``, a ``divide`` by a scalar,
    each the only consumer of the one before, and for hardswish a ``multiply`` of the divide and ``x``.

    ``nodes``, ``preds``, ``succ`` as for :func:`_rolls`; ``adds``: the positions of the non-constant ``add``
    nodes of a tensor and a scalar weight, in order (the only candidates).

    Returns ``(inner, extra)``: ``inner`` marks the nodes run inside the last one's kernel (add and clip,
    plus divide for hardswish); ``extra`` is, on the last node, the bytes it reads beyond ``x`` (the
    divide's output, which the fused kernel never writes).
    """
    n = len(nodes)
    inner = np.zeros(n, dtype=bool)
    extra = np.zeros(n, dtype=np.float64)
    for ai in adds.tolist():
        a = nodes[ai]
        after = succ[ai]
        if len(after) != 1 or nodes[after[0]].op != "clip":
            continue
        ci = after[0]
        after = succ[ci]
        if len(after) != 1 or nodes[after[0]].op != "divide":
            continue
        di = after[0]
        d = nodes[di]
        if not _scalar_param_input(d):
            continue
        x_shape = next(s for p, s in zip(a.input_is_param, a.input_shapes) if not p)
        x_from = set(preds[ai])                 # empty when x is a graph input
        users = succ[di]
        m = nodes[users[0]] if len(users) == 1 else None
        if (m is not None and m.op == "multiply" and not any(m.input_is_param)
                and tuple(m.input_shapes) == (x_shape, x_shape) and set(preds[users[0]]) == x_from | {di}):
            inner[[ai, ci, di]] = True          # hardswish: one kernel, the multiply
            extra[users[0]] = float(d.bytes_written)
        else:
            inner[[ai, ci]] = True                    # hardsigmoid: one kernel, the divide
    return inner, extra


class _Adjacency:
    """Neighbours of each node in compressed rows: ``adj[i]`` is the list ``idx[ptr[i]:ptr[i + 1]]``."""

    __slots__ = ("idx", "ptr")

    def __init__(self, idx: np.ndarray, ptr: np.ndarray) -> None:
        self.idx, self.ptr = idx, ptr

    def __getitem__(self, i: int) -> list[int]:
        return self.idx[self.ptr[i]:self.ptr[i + 1]].tolist()


# Columns of a node's row in the per-node memo (:func:`_node_rows`), float64.
_R_CLASS, _R_HOST_KIND, _R_CONST, _R_VIEW, _R_DTYPE, _R_FLOPS, _R_BYTES, _R_ACT_BYTES, _R_REDUCTION_K = range(9)
_R_ADD_PARAM, _R_ADD_SCALAR, _R_CONCAT, _R_TILE = 9, 10, 11, 12  # _R_TILE: the 5 columns of _tile_shape()
_R_MODULE = _R_TILE + 5  # issued through an nn.Module call (_host.module_call)
_R_WIDTH = _R_MODULE + 1
_CUBLAS_IDX = np.array([c in ("matmul", "attention") for c in PARAM_CLASSES])


def _fill_rows(rows: np.ndarray, nodes: Sequence[OpNode]) -> None:
    """Write the per-node facts :func:`graph_facts` reads into ``rows`` (``[len(nodes), _R_WIDTH]``, see the
    ``_R_*`` columns): each node's constants class, host kind, constant and view flags, dtype code, FLOPs, bytes,
    activation bytes, GEMM reduction length, whether it is an ``add`` of a weight (fused-bias candidate), of a
    scalar weight (hard-activation candidate) or a ``concat`` (roll candidate), and its tile shape when it is an
    active contraction."""
    classes = [param_class(nd) for nd in nodes]
    const = [nd.is_constant for nd in nodes]
    # a view, or a ``take`` with a 0-d constant index: ``x[0]`` / ``qkv[0]`` in PyTorch, a ``select`` view (no
    # kernel), which the frontend writes as a gather
    view = [nd.op_class == "view" or (nd.op == "take" and len(nd.input_shapes) == 2 and len(nd.input_shapes[1]) == 0
                                      and bool(nd.input_is_param[1])) for nd in nodes]
    rows[:, _R_CLASS] = [_CLASS_INDEX[c] for c in classes]
    rows[:, _R_HOST_KIND] = [_HOST_KIND_INDEX[host_kind(nd.op_class)] for nd in nodes]
    rows[:, _R_CONST] = const
    rows[:, _R_VIEW] = view
    rows[:, _R_DTYPE] = [_DT_CODE.get(nd.output_dtype, -1) for nd in nodes]
    rows[:, _R_FLOPS] = [nd.flops for nd in nodes]
    rows[:, _R_BYTES] = [nd.bytes_read + nd.bytes_written for nd in nodes]
    rows[:, _R_ACT_BYTES] = [nd.bytes_read - nd.param_bytes + nd.bytes_written for nd in nodes]
    rows[:, _R_REDUCTION_K] = [nd.macs / max(1, math.prod(nd.output_shape)) if nd.macs else 1.0 for nd in nodes]
    rows[:, _R_ADD_PARAM] = [nd.op == "add" and not nd.is_constant and any(nd.input_is_param) for nd in nodes]
    rows[:, _R_ADD_SCALAR] = [nd.op == "add" and not nd.is_constant and _scalar_param_input(nd) for nd in nodes]
    rows[:, _R_CONCAT] = [nd.op == "concat" and not nd.is_constant for nd in nodes]
    rows[:, _R_MODULE] = [module_call(nd.op_class, any(nd.input_is_param)) for nd in nodes]
    rows[:, _R_TILE:_R_MODULE] = 0.0
    for j, (nd, c, k, v) in enumerate(zip(nodes, classes, const, view)):
        if c in CONTRACTION_CLASSES and not k and not v:
            rows[j, _R_TILE:_R_MODULE] = _tile_shape(nd)


class _RowMemo:
    """:func:`_fill_rows` of every node seen, in one float64 table, found by the node object's ``id`` and, for a
    node object not seen yet, by its value.

    An assembled search-space candidate shares most of its node objects with earlier candidates (placements of the
    same block at the same offset), so a new candidate's rows are mostly found by ``id``; a block placed at another
    offset has new node objects that share their fields' objects (attributes, shapes) with the block's other
    placements, so their rows are found by value (:func:`_value_key`). The memo holds every node object it has
    seen, so no other object takes their ids while they are in it. Past :data:`NODE_ROWS_MAX` nodes it starts
    over."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.row_of: dict[int, int] = {}
        self.row_of_value: dict[tuple[Any, ...], int] = {}
        self.held: list[OpNode] = []
        self.table = np.zeros((1024, _R_WIDTH))
        self.size = 0

    def rows(self, nodes: Sequence[OpNode]) -> np.ndarray:
        """``[len(nodes), _R_WIDTH]``: the rows of ``nodes`` (a copy), filling those not seen yet."""
        with self.lock:
            get = self.row_of.get
            idx = [get(id(nd), -1) for nd in nodes]
            if -1 in idx:
                if len(self.held) + len(nodes) > NODE_ROWS_MAX:
                    self.clear()
                    idx = [-1] * len(nodes)
                self._add(nodes, idx)
            return self.table[np.array(idx, dtype=np.int64)]

    def _add(self, nodes: Sequence[OpNode], idx: list[int]) -> None:
        by_value = self.row_of_value
        new: list[OpNode] = []
        for j, r in enumerate(idx):
            if r >= 0:
                continue
            nd = nodes[j]
            r = self.row_of.get(id(nd), -1)
            if r < 0:
                key = _value_key(nd)
                r = by_value.get(key, -1)
                if r < 0:
                    r = by_value[key] = self.size + len(new)
                    new.append(nd)
                self.row_of[id(nd)] = r
                self.held.append(nd)
            idx[j] = r
        start, end = self.size, self.size + len(new)
        if end > len(self.table):
            grown = np.zeros((max(end, 2 * len(self.table)), _R_WIDTH))
            grown[:start] = self.table[:start]
            self.table = grown
        _fill_rows(self.table[start:end], new)
        self.size = end


def _value_key(nd: OpNode) -> tuple[Any, ...]:
    """What a node's row is a function of: its scalar fields and, by identity, its attributes, shapes and weight
    flags (objects the memo holds through the node)."""
    return (nd.op, nd.op_class, nd.output_dtype, nd.is_constant, nd.flops, nd.macs, nd.bytes_read, nd.bytes_written,
            nd.param_bytes, id(nd.attrs), id(nd.input_shapes), id(nd.output_shapes), id(nd.input_is_param))


#: Bound on the node objects :func:`graph_facts` keeps rows for (a row of 17 float64 and the node object, which
#: assembled graphs share with the assembly's placed blocks): above the 102,111 distinct node objects of the
#: 10,000 assembled ``mbconv`` candidates of ``docs/search_space_assembly.md``.
NODE_ROWS_MAX = 131_072
_ROWS = _RowMemo()


def _node_rows(nodes: Sequence[OpNode]) -> np.ndarray:
    """``[len(nodes), _R_WIDTH]`` float64: :func:`_fill_rows` of each node, memoised (:class:`_RowMemo`)."""
    return _ROWS.rows(nodes)


_FACTS: "dict[str, GraphFacts]" = {}
_FACTS_MAX = 512
_FACTS_LOCK = threading.Lock()


def clear_graph_facts() -> None:
    """Forget every cached :class:`GraphFacts` and per-node row (benchmarks of new candidates; memory)."""
    with _FACTS_LOCK:
        _FACTS.clear()
    with _ROWS.lock:
        _ROWS.clear()


def graph_facts(graph: OperatorGraph) -> GraphFacts:
    """The :class:`GraphFacts` of ``graph``; validated and computed on first sight, then cached by the
    graph's structural hash (a bounded cache: a search calls the prior thousands of times)."""
    return graph_facts_many([graph])[0]


def graph_facts_many(graphs: Sequence[OperatorGraph]) -> list[GraphFacts]:
    """:func:`graph_facts` of every graph: those not cached validated and computed together, as array
    operations over all their nodes (the same facts as one at a time)."""
    keys = [f"{g.structural_hash()}:{g.param_bytes}" for g in graphs]
    with _FACTS_LOCK:
        out = [_FACTS.get(k) for k in keys]
    todo: dict[str, OperatorGraph] = {}
    for k, g, f in zip(keys, graphs, out):
        if f is None and k not in todo:
            todo[k] = g
    if not todo:
        return out  # type: ignore[return-value]
    made = dict(zip(todo, _facts_of(list(todo.values()))))
    with _FACTS_LOCK:
        for k, f in made.items():
            while len(_FACTS) >= _FACTS_MAX:
                _FACTS.pop(next(iter(_FACTS)))
            _FACTS[k] = f
    return [f if f is not None else made[k] for k, f in zip(keys, out)]


_OP_CLASS_CONTRACTION = np.array([c in CONTRACTION_CLASSES for c in OP_CLASSES] + [False])  # by node_columns code
_OP_CLASS_MATMUL = np.array([c == "matmul" for c in OP_CLASSES] + [False])
_DT_NAMES = list(_DT_CODE)


def _facts_of(graphs: list[OperatorGraph]) -> list[GraphFacts]:
    """The :class:`GraphFacts` of ``graphs`` (validated here), computed over the nodes of all of them at once."""
    for g in graphs:
        g.validate()
    cols = [node_columns(g) for g in graphs]
    sizes = np.fromiter((len(g.nodes) for g in graphs), dtype=np.int64, count=len(graphs))
    offs = np.zeros(len(graphs) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offs[1:])
    n = int(offs[-1])
    nodes = [nd for g in graphs for nd in g.nodes]
    graph_of = np.repeat(np.arange(len(graphs)), sizes)
    rows = _node_rows(nodes)
    ne = np.fromiter((c["src"].size for c in cols), dtype=np.int64, count=len(cols))
    eoffs = np.zeros(len(graphs) + 1, dtype=np.int64)
    np.cumsum(ne, out=eoffs[1:])
    shift = np.repeat(offs[:-1], ne)
    # edges by consumer (each graph's node_columns order: a node's producers as graph.predecessors() lists them)
    src = np.concatenate([c["src"] for c in cols]) + shift
    dst = np.concatenate([c["dst"] for c in cols]) + shift
    in_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=in_ptr[1:])
    out_deg = np.bincount(src, minlength=n)
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(out_deg, out=out_ptr[1:])
    preds, succ = _Adjacency(src, in_ptr), _Adjacency(dst[np.argsort(src, kind="stable")], out_ptr)

    cls_idx = rows[:, _R_CLASS].astype(np.int64)
    const = rows[:, _R_CONST] > 0
    view = (rows[:, _R_VIEW] > 0) & ~const
    active = ~const & ~view
    inner, internal = _rolls(nodes, preds, succ, np.flatnonzero(rows[:, _R_CONCAT] > 0))
    inner |= _unbinds(nodes, preds) & view
    # a bias add run inside the conv/matmul call before it: an add of a weight whose one non-constant producer
    # is a contraction op read by nothing else
    fused = np.zeros(n, dtype=bool)
    live = ~const[src]
    one = np.bincount(dst[live], minlength=n) == 1
    e = live & (rows[dst, _R_ADD_PARAM] > 0) & one[dst]
    p = src[e]
    op_class = np.concatenate([c["op_class"] for c in cols])
    fused[dst[e][_OP_CLASS_CONTRACTION[op_class[p]] & (out_deg[p] == 1)]] = True
    gemm_bias = _gemm_biases(nodes, preds, dst[e], p, _OP_CLASS_MATMUL[op_class[p]] & (out_deg[p] == 1), n)
    hard_inner, hard_extra = _hard_activations(nodes, preds, succ, np.flatnonzero(rows[:, _R_ADD_SCALAR] > 0))
    hard_inner |= _vector_norms(nodes, succ) & active
    dtype = rows[:, _R_DTYPE].astype(np.int64)
    host = np.where(view, _HOST_KIND_INDEX["view"], rows[:, _R_HOST_KIND].astype(np.int64))
    conv = cls_idx == _CLASS_INDEX["conv"]
    contraction = _CONTRACTION_IDX[cls_idx]
    flops, nbytes, act, red = (rows[:, j].copy() for j in (_R_FLOPS, _R_BYTES, _R_ACT_BYTES, _R_REDUCTION_K))
    tile = rows[:, _R_TILE:_R_MODULE]
    module = rows[:, _R_MODULE] > 0
    names = [PARAM_CLASSES[c] for c in cls_idx.tolist()]
    has = ~const & (dtype >= 0)
    dts = np.bincount(graph_of[has] * len(_DT_NAMES) + dtype[has],
                      minlength=len(graphs) * len(_DT_NAMES)).reshape(len(graphs), len(_DT_NAMES)) > 0
    cublas = np.bincount(graph_of, weights=_CUBLAS_IDX[cls_idx] & ~const, minlength=len(graphs)) > 0
    out = []
    for j, g in enumerate(graphs):
        a, b = int(offs[j]), int(offs[j + 1])
        ea, eb = int(eoffs[j]), int(eoffs[j + 1])
        out.append(GraphFacts(
            classes=tuple(names[a:b]), cls_idx=cls_idx[a:b], host_kind=host[a:b], active=active[a:b],
            view=view[a:b], fused=fused[a:b], gemm_bias=gemm_bias[a:b], inner_view=inner[a:b], internal=internal[a:b],
            hard_inner=hard_inner[a:b], hard_extra_bytes=hard_extra[a:b], module_call=module[a:b], conv=conv[a:b],
            contraction=contraction[a:b], dtype=dtype[a:b], flops=flops[a:b], bytes=nbytes[a:b],
            act_bytes=act[a:b], reduction_k=red[a:b],
            dtypes=frozenset(_DT_NAMES[c] for c in np.flatnonzero(dts[j]).tolist()), uses_cublas=bool(cublas[j]),
            _tiles={}, _tile_shape=tile[a:b], _nodes=g.nodes, _preds=_Adjacency(src[ea:eb] - a, in_ptr[a:b + 1] - ea),
        ))
    return out


_RESHAPES = frozenset({"reshape", "flatten", "nn.batch_flatten"})


def _gemm_biases(nodes: Sequence[OpNode], preds: "_Adjacency", adds: np.ndarray, producers: np.ndarray,
                 gemm: np.ndarray, n: int) -> np.ndarray:
    """Per node, whether it is a fused bias add (``adds``, each with its contraction producer in ``producers``)
    that eager runs inside its GEMM: ``F.linear`` of a contiguous input calls ``addmm`` on the flattened input,
    whose cuBLASLt call adds the bias in the GEMM's epilogue (PyTorch >= 1.12 with CUDA >= 11.4; no kernel of its
    own). A GEMM whose activation is a permuted view (non-contiguous: Twins' window partition) goes through
    ``matmul`` and a separate ``add_``, as does a convolution's bias after cuDNN's call."""
    out = np.zeros(n, dtype=bool)
    for d, q in zip(adds[gemm].tolist(), producers[gemm].tolist()):
        src = [nodes[j] for j in preds[q] if not nodes[j].is_constant]
        out[d] = not any(s.op == "permute_dims" and _moves_data(s) for s in src)
    return out


def _moves_data(permute: OpNode) -> bool:
    """A permutation that reorders dimensions longer than 1 (so its result is not contiguous)."""
    axes = permute.attrs.get("axes")
    shape = next((sh for sh, par in zip(permute.input_shapes, permute.input_is_param) if not par), ())
    if not axes or len(axes) != len(shape):
        return True
    kept = [a % len(shape) for a in axes if shape[a % len(shape)] > 1]
    return kept != sorted(kept)
_DT_SIZE = np.array([4.0, 2.0, 2.0, 8.0])


def _extra_kernels(graph: OperatorGraph, f: GraphFacts, device: Device, params: PriorParams,
                   plan: AutocastPlan | None, channels_last: bool, dt: np.ndarray,
                   active: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Kernels eager PyTorch runs beyond the graph's own, per node: ``(kernels, bytes read and written)``, or
    ``None`` when there are none. Reshapes of permuted views copy (:meth:`GraphFacts.reshape_copies`);
    autocast's casts (:mod:`~dippm_nas.prior._autocast`) and, in channels-last layout, the copies of NHWC
    activations reshaped to another rank (:meth:`GraphFacts.channels_last_copies`)."""
    if device.kind != "gpu":
        return None
    width = _DT_SIZE[np.clip(dt, 0, 3)]
    copies = f.reshape_copies()
    n_extra = (copies > 0).astype(np.float64)
    extra_bytes = 2.0 * copies * width  # read and written once
    if plan is not None:
        n_extra += np.where(active, plan.casts, 0.0)
        extra_bytes += np.where(active, plan.cast_bytes, 0.0)
    if channels_last:
        elems = f.channels_last_copies(graph)
        n_extra += elems > 0
        extra_bytes += 2.0 * elems * width
    return (n_extra, extra_bytes) if n_extra.any() else None


def _internal_dispatch_us(params: PriorParams, host: HostProfile | None) -> float:
    """Host time of a kernel an operator launches through the dispatcher without a Python call of its own (an
    autocast cast, a layout copy), µs: a view's fitted dispatch plus a kernel launch, on ``host``."""
    hm = params.host_model
    if hm is None:
        return params.host_view_us + params.host_launch_us
    return (hm.op_us["view"] + hm.launch_us) * hm.scale(host if host is not None else default_host_profile())


def check_autocast(autocast: Any) -> str | None:
    """``autocast`` if it is ``None`` or one of :data:`~dippm_nas.deployment.AUTOCAST_DTYPES`.

    Raises:
        InvalidValueError: another value (the choices are listed).
    """
    if autocast is not None and autocast not in AUTOCAST_DTYPES:
        raise InvalidValueError(f"autocast must be None or one of {AUTOCAST_DTYPES}, got {autocast!r}")
    return autocast


@dataclass(frozen=True)
class KernelTerms:
    """The device side of :func:`node_costs` before the host times: what a MIG slice or another host re-uses.

    Shapes:
        every array is ``[num_nodes]`` (of one graph, or of a stack of graphs: :func:`facts_costs`).
    """

    gpu_us: np.ndarray
    compute_us: np.ndarray
    memory_us: np.ndarray
    kernels: np.ndarray       # kernels launched, the extra ones (casts, layout copies) included
    extra: np.ndarray | None  # extra kernels per node (None: none)
    active: np.ndarray        # bool: the node launches its own kernels
    bytes: np.ndarray         # bytes read and written at run time, the extra kernels' included
    peak_tflops: np.ndarray
    tensor_core: np.ndarray
    inputs: Any = field(default=None, repr=False)  # what re-timing on a MIG slice starts from (retimed)


def node_costs(
    graph: OperatorGraph, device: Device, params: PriorParams, *, tf32_conv: bool = True,
    tf32_matmul: bool = False, channels_last: bool = False, host: HostProfile | None = None,
    autocast: str | None = None, math_float32: bool | None = None,
) -> NodeCosts:
    """Time every node of ``graph`` on ``device`` with the constants ``params``.

    Args:
        graph: the captured model.
        device: where it runs (a MIG slice view works too).
        params: the prior's constants.
        tf32_conv: FP32 convolutions may use TF32 tensor cores (PyTorch default: True,
            ``torch.backends.cudnn.allow_tf32``).
        tf32_matmul: FP32 matmuls may use TF32 (PyTorch default: False, ``torch.backends.cuda.matmul.allow_tf32``).
        channels_last: activations are NHWC in memory; when False, half-precision tensor-core
            convolutions pay ``params.nchw_transpose_passes`` extra passes over their activations
            (and two transposition kernels).
        host: the host that drives a GPU (default :func:`~dippm_nas.devices.default_host_profile`); scales
            the eager host times of a fitted host model.
        autocast: ``None``, ``"float16"`` or ``"bfloat16"``: ``torch.autocast`` around the forward of a
            float32 graph.
        math_float32: the nodes of an SDPA math path (``attrs["sdpa_math"]``) run in float32 with their casts
            (PyTorch >= 2.5), ``False``: in their inputs' dtype (PyTorch <= 2.4), both without autocast's casts;
            ``None`` (the torch version unknown): as any other node (:mod:`~dippm_nas.prior._math_path`).

    A linear layer's bias add costs no kernel on a GPU (cuBLASLt's bias epilogue in ``addmm``) unless ``host``'s
    framework is ``"torch-1"`` (PyTorch 1.x, whose CUDA 10 builds copy the bias into the output in a kernel of
    its own).
    """
    return facts_costs(graph_facts(graph), graph, device, params, tf32_conv=tf32_conv, tf32_matmul=tf32_matmul,
                       channels_last=channels_last, host=host, autocast=autocast, math_float32=math_float32)


def facts_costs(f: Any, graph: Any, device: Device, params: PriorParams, *, tf32_conv: bool = True,
                tf32_matmul: bool = False, channels_last: bool = False, host: HostProfile | None = None,
                autocast: str | None = None, math_float32: bool | None = None) -> NodeCosts:
    """:func:`node_costs` of the facts ``f``: a :class:`GraphFacts` of ``graph``, or the facts of a stack of
    graphs (:class:`~dippm_nas.prior.StackedFacts`, ``graph`` unused), whose nodes are timed in one pass of
    array operations (every term is per node)."""
    k = kernel_terms(f, graph, device, params, tf32_conv=tf32_conv, tf32_matmul=tf32_matmul,
                     channels_last=channels_last, autocast=autocast, math_float32=math_float32,
                     gemm_epilogue=gemm_epilogue(host))
    return costs_of_terms(f, k, device, params, host_times(f, k, device, params, host))


def costs_of_terms(f: Any, k: KernelTerms, device: Device, params: PriorParams, host_us: np.ndarray) -> NodeCosts:
    """The :class:`NodeCosts` of kernel terms ``k`` and host times ``host_us`` (``[num_nodes]``, µs)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        util_c = np.where(k.gpu_us > 0, f.flops / (k.peak_tflops * 1e12) * 1e6 / k.gpu_us, 0.0)
        util_m = np.where(k.gpu_us > 0, k.bytes / (device.bandwidth_gbps * 1e9) * 1e6 / k.gpu_us, 0.0)
    util = np.clip(np.maximum(util_c, util_m), 0.0, 1.0)
    return NodeCosts(gpu_us=k.gpu_us, host_us=host_us, compute_us=k.compute_us, memory_us=k.memory_us,
                     kernels=k.kernels, utilisation=util, tensor_core=k.tensor_core & k.active, classes=f.classes)


def _peaks(f: Any, device: Device, dt: np.ndarray, tf32_conv: bool, tf32_matmul: bool
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(peak TFLOP/s, ran on tensor cores, half precision) per node.

    CUDA cores by default; tensor cores for contractions in half precision, FP32 with TF32 allowed, and FP64
    GEMMs where the GPU has FP64 tensor cores. PyTorch computes half-precision element-wise ops in FP32 (opmath)
    and cuDNN/cuBLAS half convolutions and GEMMs without tensor cores with FP32 math, so a GPU whose native FP16
    rate is below its FP32 rate (Pascal GP102: 1/64) runs them at the FP32 rate; but not its half depthwise
    convolutions, which eager PyTorch gives cuDNN only from compute capability 7.0 and otherwise runs in its own
    depthwise kernel: those run at the native FP16 rate (a TITAN Xp's float16 MnasNets take 1.1-1.8x their float32
    time, the depthwise FLOPs at about 0.07 TFLOP/s: its 0.19 native FP16 TFLOP/s at the depthwise class's fitted
    efficiency)."""
    n = len(dt)
    half = (dt == 1) | (dt == 2)
    half_peak = max(device.fp16_tflops or 0.0, device.fp32_tflops)
    # half-precision GEMMs/convolutions without tensor cores accumulate in FP32 (cuBLAS CUBLAS_COMPUTE_32F,
    # cuDNN FP32 math): FP32 FMAs even where packed FP16 runs faster (Pascal GP100: 2x)
    cuda = np.where(half & (device.fp16_tflops is not None) & ~f.contraction, half_peak, device.fp32_tflops)
    if device.fp16_tflops is not None and device.fp16_tflops < device.fp32_tflops and half.any():
        cuda = np.where(half & f.native_depthwise(), device.fp16_tflops, cuda)
    if device.fp64_tflops is not None:
        cuda = np.where(dt == 3, device.fp64_tflops, cuda)
    tensor = np.zeros(n, dtype=bool)
    peak = cuda.astype(np.float64)
    if device.kind == "gpu":
        for code, tflops in ((1, device.fp16_tensor_tflops), (2, device.bf16_tensor_tflops)):
            if tflops is not None:
                m = f.contraction & (dt == code)
                peak[m], tensor[m] = tflops, True
        if device.tf32_tensor_tflops is not None:
            allow = np.where(f.conv, tf32_conv, tf32_matmul) & f.contraction & (dt == 0)
            peak[allow], tensor[allow] = device.tf32_tensor_tflops, True
        if device.fp64_tensor_tflops is not None:  # cuBLAS DGEMMs run on FP64 tensor cores; cuDNN FP64 convs do not
            dmma = f.contraction & ~f.conv & (dt == 3)
            peak[dmma], tensor[dmma] = device.fp64_tensor_tflops, True
    return peak, tensor, half


def _contraction_terms(f: Any, pc: list[Any], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tile efficiency, wave exponent, tile exponent) per node: 1, 0, 0 outside contractions."""
    tile, wave_exp, tile_exp = np.ones(n), np.zeros(n), np.zeros(n)
    for ci, p in enumerate(pc):
        m = f.contraction & (f.cls_idx == ci)
        if m.any():
            tile[m] = f.tiles(p.tile_m, p.tile_n)[1][m]
            wave_exp[m], tile_exp[m] = p.wave_exponent, p.tile_exponent
    return tile, wave_exp, tile_exp


def _waves(f: Any, pc: list[Any], sms: int) -> np.ndarray:
    """Wave efficiency per node on ``sms`` SMs (1 outside contractions)."""
    wave = np.ones(len(f.classes))
    for ci, p in enumerate(pc):
        m = f.contraction & (f.cls_idx == ci)
        if m.any():
            wave[m] = wave_efficiency(f.tiles(p.tile_m, p.tile_n)[0][m], sms)
    return wave


def _class_array(pc: list[Any], f: Any, name: str) -> np.ndarray:
    """Per node, the constant ``name`` of its constants class."""
    return np.array([getattr(p, name) for p in pc], dtype=np.float64)[f.cls_idx]


@dataclass(frozen=True)
class _KernelInputs:
    """What :func:`kernel_terms` computes before the device's peaks, SMs, bandwidth and L2 enter (the same on a
    MIG slice of the device): re-timing on a slice starts here."""

    dt: np.ndarray
    tensor: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    kernels: np.ndarray
    active: np.ndarray
    eta_compute: np.ndarray
    eta_memory: np.ndarray
    kernel_us: np.ndarray
    tile: np.ndarray
    wave_exp: np.ndarray
    tile_exp: np.ndarray
    k_half: np.ndarray
    plan: AutocastPlan | None
    channels_last: bool
    tf32: tuple[bool, bool]
    pc: list[Any]
    scale: Any


def gemm_epilogue(host: HostProfile | None) -> bool:
    """Whether eager ``F.linear`` adds its bias in the GEMM's epilogue (cuBLASLt through ``addmm``: PyTorch >=
    1.12 built with CUDA >= 11.4) for a GPU driven by ``host``: not under ``"torch-1"`` (PyTorch 1.x, the CUDA 10
    builds of the released 1.x rows), yes otherwise (``None``: the default host, PyTorch 2.x)."""
    return host is None or host.framework != "torch-1"


def kernel_terms(f: Any, graph: Any, device: Device, params: PriorParams, *, tf32_conv: bool = True,
                 tf32_matmul: bool = False, channels_last: bool = False, autocast: str | None = None,
                 math_float32: bool | None = None, gemm_epilogue: bool = True) -> KernelTerms:
    """The device side of :func:`facts_costs` (arguments as for :func:`node_costs`): kernel times per node.
    ``gemm_epilogue``: a linear layer's bias add runs inside its GEMM (:func:`gemm_epilogue`), no kernel."""
    check_autocast(autocast)
    n = len(f.classes)
    gpu = device.kind == "gpu"
    pc = [params.op_classes[c] for c in PARAM_CLASSES]
    plan = f.autocast(graph, autocast) if gpu and autocast is not None else None
    if gpu and math_float32 is not None:  # the SDPA math path in the dtype of the deployment's PyTorch version
        plan = f.math_path(graph, autocast, bool(math_float32)) or plan
    dt = plan.dtype if plan is not None else f.dtype  # each node's run-time dtype code
    _, tensor, half = _peaks(f, device, dt, tf32_conv, tf32_matmul)
    bytes_, act_bytes, act = f.bytes.copy(), f.act_bytes, f.active
    if params.fuse_hard_activations:
        act = act & ~f.hard_inner
        bytes_ = bytes_ - f.hard_extra_bytes
    if gpu and gemm_epilogue:  # a GEMM's bias add runs in the GEMM's epilogue (cuBLASLt's, in addmm)
        act = act & ~f.gemm_bias
    if plan is not None:
        bytes_ = bytes_ * plan.bytes_scale
        act_bytes = act_bytes * plan.bytes_scale
    kernels = _class_array(pc, f, "kernels")
    if gpu and not channels_last and params.nchw_transpose_passes > 0:
        nchw = tensor & f.conv & half
        bytes_[nchw] += params.nchw_transpose_passes * act_bytes[nchw]
        kernels[nchw] += 2.0
    if gpu and f.contraction.any():
        tile, wave_exp, tile_exp = _contraction_terms(f, pc, n)
    else:
        tile, wave_exp, tile_exp = np.ones(n), np.zeros(n), np.zeros(n)
    k_half = np.where(f.contraction, _class_array(pc, f, "k_half"), 0.0)
    # FP64 kernels on CUDA cores of a class with its own FP64 efficiency: that efficiency, no wave, tile or
    # reduction-length terms
    own64 = gpu & ~tensor & (dt == 3)
    if own64.any():  # only float64 graphs pay for the lookup
        eta64 = np.array([np.nan if p.eta_compute_fp64 is None else p.eta_compute_fp64 for p in pc])[f.cls_idx]
        own64 &= ~np.isnan(eta64)
    scale = params.scale_for(device.id, device.kind, geforce=device.geforce)
    class_mult = np.array([scale.class_multiplier(c) for c in PARAM_CLASSES], dtype=np.float64)[f.cls_idx]
    # A GPU's compute scales (device and per class) are fitted on half-precision data (Accel-NASBench
    # autocast, timm amp, Vidur fp16 GEMMs): they hold for tensor-core and half-precision kernels. FP32
    # CUDA-core kernels keep the op-level constants, which were fitted on NeuSight's FP32 A100 operators
    # (applying a tensor-core fit to them made FP32 SGEMMs 2.4x too slow on the A100). A CPU's scales were
    # fitted on its own FP32 models.
    dev_c = np.where(gpu & ~tensor & ~half, 1.0, scale.compute * class_mult)
    eta_c = np.where(tensor, _class_array(pc, f, "eta_compute_tensor"), _class_array(pc, f, "eta_compute")) * dev_c
    if own64.any():
        eta_c = np.where(own64, eta64, eta_c)
        wave_exp, tile_exp, k_half = (np.where(own64, 0.0, a) for a in (wave_exp, tile_exp, k_half))
    # a GPU cannot beat its DRAM bandwidth; a CPU's bandwidth figure is a DRAM triad while most layers'
    # working sets sit in its caches, so a fitted CPU scale may exceed it
    eta_m = _class_array(pc, f, "eta_memory") * scale.memory
    eta_m = np.minimum(eta_m, 1.0) if gpu else eta_m
    # on a CPU the per-op cost is the measured dispatch; the fitted per-kernel GPU cost does not apply
    flops = f.flops
    if gpu and params.sdpa_eta_flash is not None:
        flops, bytes_, kernels, eta_c = _sdpa_terms(f, device, params, dt, autocast is not None, flops, bytes_,
                                                    kernels, eta_c, class_mult, tensor)
    inputs = _KernelInputs(
        dt=dt, tensor=tensor, flops=flops, bytes=bytes_, kernels=kernels, active=act, eta_compute=eta_c, eta_memory=eta_m,
        kernel_us=_class_array(pc, f, "kernel_us") if gpu else np.zeros(n), tile=tile, wave_exp=wave_exp,
        tile_exp=tile_exp, k_half=k_half, plan=plan, channels_last=channels_last, tf32=(tf32_conv, tf32_matmul),
        pc=pc, scale=scale)
    return _timed(inputs, f, graph, device, params)


def _sdpa_terms(f: Any, device: Device, params: PriorParams, dt: np.ndarray, autocast: bool, flops: np.ndarray,
                bytes_: np.ndarray, kernels: np.ndarray, eta_c: np.ndarray, keep: np.ndarray, tensor: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(flops, bytes, kernels, eta_compute)`` with the SDPA nodes priced by the kernel PyTorch 2.x runs
    (:mod:`~dippm_nas.prior._sdpa`): flash and memory-efficient nodes do the unmasked share of a causal score
    matrix; on tensor cores at their fitted efficiency times ``keep`` (the device's attention class multiplier;
    its overall compute multiplier, fitted on other kernels, is not applied), on CUDA cores (a GPU without
    tensor cores, float32) at the attention class's constants, which no SDPA timing fitted; math-path nodes move the score matrix (in
    float32 under autocast) and launch its kernels, at the attention class's constants."""
    shape = f.attention_shape()
    if not shape.attention.any():
        return flops, bytes_, kernels, eta_c
    code = sdpa_backend_codes(shape, device.architecture, dt)
    fused = (code == 1) | (code == 2)
    flops = np.where(fused, f.flops * shape.work_fraction, f.flops)
    eta_fused = np.where(code == 1, params.sdpa_eta_flash * mma_share(device.architecture), params.sdpa_eta_efficient)
    eta_c = np.where(fused & tensor, eta_fused * keep, eta_c)
    math = code == 3
    if math.any():
        extra_b, extra_k = math_path_score_bytes(shape.scores, _DT_SIZE[np.clip(dt, 0, 3)], autocast)
        bytes_ = np.where(math, bytes_ + extra_b, bytes_)
        kernels = np.where(math, kernels + extra_k, kernels)
    return flops, bytes_, kernels, eta_c


def retimed(k: KernelTerms, f: Any, graph: Any, device: Device, params: PriorParams) -> KernelTerms:
    """The kernels of ``k`` (timed on a GPU) re-timed on ``device``, a MIG slice view of that GPU
    (:meth:`~dippm_nas.devices.Device.mig_slice`: its peaks, SMs, DRAM bandwidth and L2 scaled, the constants
    the same): only the peaks, wave quantisation, bandwidth and L2 terms are evaluated again. The same figures
    as :func:`kernel_terms` on the slice."""
    return _timed(k.inputs, f, graph, device, params)


def _timed(x: _KernelInputs, f: Any, graph: Any, device: Device, params: PriorParams) -> KernelTerms:
    """The kernel times of ``x`` on ``device``: its peaks, wave quantisation on its SMs, its bandwidth and L2."""
    peak = _peaks(f, device, x.dt, *x.tf32)[0]
    wave = _waves(f, x.pc, device.sms) if device.kind == "gpu" and f.contraction.any() else np.ones(len(x.dt))
    with np.errstate(divide="ignore", invalid="ignore"):
        l2_frac = np.where(f.bytes > 0, np.minimum(1.0, device.l2_mib * 2**20 / f.bytes), 0.0)
    t, comp, mem = kernel_time_us(
        x.flops, x.bytes, peak_tflops=peak, bandwidth_gbps=device.bandwidth_gbps, eta_compute=x.eta_compute,
        eta_memory=x.eta_memory, kernel_us=x.kernel_us, kernels=x.kernels, wave_eff=wave, wave_exponent=x.wave_exp,
        tile_eff=x.tile, tile_exponent=x.tile_exp, reduction_k=f.reduction_k, k_half=x.k_half, l2_fraction=l2_frac,
        l2_speedup=params.l2_speedup,
    )
    if device.kind == "gpu" and params.resize_loop_ns is not None and not x.channels_last:
        iters, threads = f.serial_resizes()
        if iters.any():  # a serial resize waits on memory round trips, not on the bandwidth
            t = np.where(iters > 0, np.maximum(t, x.kernel_us * x.kernels
                                                + serial_loop_us(iters, threads, device.sms, params.resize_loop_ns)),
                         t)
    act = x.active
    terms = KernelTerms(gpu_us=np.where(act, t, 0.0), compute_us=np.where(act, comp, 0.0),
                        memory_us=np.where(act, mem, 0.0), kernels=np.where(act, x.kernels, 0.0), extra=None,
                        active=act, bytes=x.bytes, peak_tflops=peak, tensor_core=x.tensor, inputs=x)
    return _with_extra_kernels(terms, f, graph, device, params, x.plan, x.channels_last, x.dt, act, x.pc, x.scale)


def _with_extra_kernels(k: KernelTerms, f: Any, graph: Any, device: Device, params: PriorParams,
                        plan: AutocastPlan | None, channels_last: bool, dt: np.ndarray, act: np.ndarray,
                        pc: list[Any], scale: Any) -> KernelTerms:
    """``k`` with autocast's casts and the layout copies: kernels of their own (:func:`_extra_kernels`)."""
    extra = _extra_kernels(graph, f, device, params, plan, channels_last, dt, act)
    if extra is None:
        return k
    n_extra, extra_bytes = extra
    cast = _CLASS_INDEX["cast"]
    t_x, _, mem_x = kernel_time_us(
        0.0, extra_bytes, peak_tflops=device.fp32_tflops, bandwidth_gbps=device.bandwidth_gbps, eta_compute=1.0,
        eta_memory=min(pc[cast].eta_memory * scale.memory, 1.0), kernel_us=pc[cast].kernel_us, kernels=n_extra,
        l2_fraction=np.where(extra_bytes > 0, np.minimum(1.0, device.l2_mib * 2**20 / np.maximum(extra_bytes, 1.0)),
                             0.0), l2_speedup=params.l2_speedup)
    return dataclasses.replace(k, gpu_us=k.gpu_us + np.where(n_extra > 0, t_x, 0.0),
                               memory_us=k.memory_us + np.where(n_extra > 0, mem_x, 0.0),
                               kernels=k.kernels + n_extra, extra=n_extra, bytes=k.bytes + extra_bytes)


def host_times(f: Any, k: KernelTerms, device: Device, params: PriorParams, host: HostProfile | None) -> np.ndarray:
    """Host time per node, µs: with a fitted host model (GPU) its per-operator time of the node's kind plus a
    launch per further kernel, scaled to ``host``; otherwise the dispatch per op plus one launch per kernel.
    Views cost a small dispatch; the extra kernels of ``k`` each a dispatch of their own."""
    gpu = device.kind == "gpu"
    act = k.active
    kernels = k.kernels if k.extra is None else k.kernels - k.extra
    if gpu and params.host_model is not None:
        hm = params.host_model
        s = hm.scale(host if host is not None else default_host_profile())
        op_us = np.array([hm.op_us[kind] for kind in HOST_KINDS], dtype=np.float64)[f.host_kind] * s
        module_us = np.array([hm.module_us.get(kind, 0.0) for kind in HOST_KINDS], dtype=np.float64)[f.host_kind] * s
        issue = np.where(f.fused, 0.0, np.where(f.internal, _internal_dispatch_us(params, host),
                                                op_us + np.where(f.module_call, module_us, 0.0)))
        host_t = (np.where(act, issue + np.maximum(kernels - 1.0, 0.0) * hm.launch_us * s, 0.0)
                  + np.where(f.view & ~f.inner_view, op_us, 0.0))
    else:
        scale = params.scale_for(device.id, device.kind, geforce=device.geforce)
        if scale.dispatch_us is not None:
            dispatch = scale.dispatch_us
        else:
            dispatch = device.host_dispatch_us if device.host_dispatch_us is not None else params.host_dispatch_us
        launch = params.host_launch_us if gpu else 0.0
        view_us = params.host_view_us if gpu else min(params.host_view_us, dispatch)
        host_t = (np.where(act, np.where(f.fused | f.internal, 0.0, dispatch) + kernels * launch, 0.0)
                  + np.where(f.view & ~f.inner_view, view_us, 0.0))
    if k.extra is not None:
        host_t = host_t + k.extra * _internal_dispatch_us(params, host)
    return host_t
