"""The prior over a stack of graphs: one pass of array operations instead of one per graph.

A search scores hundreds of candidates per request; their per-node figures are independent of each other, so
the node tables of every graph are concatenated (:class:`StackedFacts`), timed once
(:func:`~dippm_nas.prior.facts_costs`: the same per-node formulas as :func:`~dippm_nas.prior.node_costs`) and
split by offsets. The host and GPU-stream timelines of every graph run at once on a ``[graphs, max_nodes]``
zero-padded table (:func:`stacked_timelines`): a cumulative sum along each row adds the same numbers in the
same order as the single-graph timeline, and a padded node launches nothing and costs no host time, so each row's
critical path is the one :func:`~dippm_nas.prior.latency_us` gives.

:func:`estimate_many` returns what :func:`~dippm_nas.prior.estimate` returns for each graph (the same figures to
rounding: ``tests/predictor/test_predict_batched.py`` checks 1e-9 relative); :class:`CostStack` keeps the kernel and host
times of one stack per setting, so the features' estimate, the requested deployment's, its spread's scenarios and
the MIG slices of one request time each graph's kernels once per distinct setting.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from dippm_nas.devices import Device, HostProfile
from dippm_nas.graph import GraphStack, OperatorGraph, stack_graphs
from dippm_nas.prior._autocast import AutocastPlan
from dippm_nas.prior._deploy import DeploymentSettings
from dippm_nas.prior._estimate import (LEGACY_KEYWORDS, PriorEstimate, ResolvedSettings, _finished, _liveness,
                                       _pass_host_us, _runtime_costs, checked_facts_many, eager_kind, estimate,
                                       gpu_parts_key, legacy_keywords,
                                       resolved_settings, sdpa_math_mode, uses_cudnn)
from dippm_nas.prior._nodes import (KernelTerms, NodeCosts, costs_of_terms, gemm_epilogue, host_times, kernel_terms,
                                    retimed)
from dippm_nas.prior._sdpa import AttentionShape
from dippm_nas.prior._sdpa_rank3 import fused_rank3_graph
from dippm_nas.prior._memory import activation_liveness_many, gpu_memory_parts_many
from dippm_nas.prior._power import node_activity, node_power_w, power_params_for, wait_power_w

__all__ = ["StackedFacts", "CostStack", "Timelines", "estimate_many", "estimates_of", "stacked_timelines"]

#: The per-node arrays of :class:`~dippm_nas.prior.GraphFacts` the node costs read.
_ARRAYS = ("cls_idx", "active", "view", "fused", "gemm_bias", "inner_view", "internal", "hard_inner", "hard_extra_bytes",
           "host_kind", "module_call", "conv", "contraction", "dtype", "flops", "bytes", "act_bytes", "reduction_k")


class StackedFacts:
    """The :class:`~dippm_nas.prior.GraphFacts` of many graphs as one node table (what
    :func:`~dippm_nas.prior.facts_costs` reads), with the offsets that split it back.

    Args:
        graphs: validated graphs; ``facts``: their facts, in order.

    Shapes:
        every per-node array is ``[total_nodes]``; ``offsets`` is ``[num_graphs + 1]``.
    """

    def __init__(self, graphs: Sequence[OperatorGraph], facts: Sequence[Any]) -> None:
        self.graphs = list(graphs)
        self.parts = list(facts)
        lens = np.array([len(f.classes) for f in self.parts], dtype=np.int64)
        self.lens = lens
        self.offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        for name in _ARRAYS:
            setattr(self, name, np.concatenate([getattr(f, name) for f in self.parts]))
        self.classes = tuple(itertools.chain.from_iterable(f.classes for f in self.parts))
        self.memory = None
        self._tiles: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._plans: dict[Any, Any] = {}
        self._width = int(lens.max()) if len(lens) else 0
        # which cells of the row-major [num_graphs, max_nodes] table hold a node
        self._mask = np.arange(self._width)[None, :] < lens[:, None]
        self._input_bytes: list[int] | None = None

    def __len__(self) -> int:
        return len(self.parts)

    def _concat(self, key: Any, per_graph: Any) -> Any:
        if key not in self._plans:
            self._plans[key] = np.concatenate([per_graph(f, g) for f, g in zip(self.parts, self.graphs)])
        return self._plans[key]

    def tiles(self, tile_m: int, tile_n: int) -> tuple[np.ndarray, np.ndarray]:
        """(thread blocks, tile efficiency) per node, as :meth:`GraphFacts.tiles`."""
        key = (tile_m, tile_n)
        if key not in self._tiles:
            parts = [f.tiles(tile_m, tile_n) for f in self.parts]
            self._tiles[key] = (np.concatenate([t for t, _ in parts]), np.concatenate([e for _, e in parts]))
        return self._tiles[key]

    def reshape_copies(self) -> np.ndarray:
        return self._concat("reshape_copies", lambda f, g: f.reshape_copies())

    def native_depthwise(self) -> np.ndarray:
        return self._concat("native_depthwise", lambda f, g: f.native_depthwise())

    def channels_last_copies(self, graph: Any = None) -> np.ndarray:
        return self._concat("channels_last", lambda f, g: f.channels_last_copies(g))

    def autocast(self, graph: Any, low: str) -> AutocastPlan:
        """Every graph's :class:`AutocastPlan` under autocast to ``low``, concatenated."""
        key = ("autocast", low)
        if key not in self._plans:
            plans = [f.autocast(g, low) for f, g in zip(self.parts, self.graphs)]
            self._plans[key] = AutocastPlan(*(np.concatenate([getattr(p, n) for p in plans])
                                              for n in ("dtype", "bytes_scale", "casts", "cast_bytes")))
        return self._plans[key]

    def math_path(self, graph: Any, low: str | None, float32: bool) -> AutocastPlan | None:
        """Every graph's :meth:`GraphFacts.math_path` concatenated (a graph without a math path: its autocast
        plan, or its captured dtypes); ``None`` when no graph has a math path."""
        key = ("math_path", low, float32)
        if key not in self._plans:
            plans = [f.math_path(g, low, float32) for f, g in zip(self.parts, self.graphs)]
            if all(p is None for p in plans):
                self._plans[key] = None
            else:
                full = [p if p is not None else f.autocast(g, low) if low is not None else
                        AutocastPlan(f.dtype, np.ones(len(f.dtype)), np.zeros(len(f.dtype)), np.zeros(len(f.dtype)))
                        for p, f, g in zip(plans, self.parts, self.graphs)]
                self._plans[key] = AutocastPlan(*(np.concatenate([getattr(p, n) for p in full])
                                                  for n in ("dtype", "bytes_scale", "casts", "cast_bytes")))
        return self._plans[key]

    def serial_resizes(self) -> tuple[np.ndarray, np.ndarray]:
        """Every graph's :meth:`GraphFacts.serial_resizes`, concatenated."""
        if "serial_resizes" not in self._plans:
            parts = [f.serial_resizes() for f in self.parts]
            self._plans["serial_resizes"] = (np.concatenate([p[0] for p in parts]),
                                             np.concatenate([p[1] for p in parts]))
        return self._plans["serial_resizes"]

    def attention_shape(self) -> AttentionShape:
        """Every graph's :class:`~dippm_nas.prior._sdpa.AttentionShape`, concatenated."""
        if "attention_shape" not in self._plans:
            parts = [f.attention_shape() for f in self.parts]
            self._plans["attention_shape"] = AttentionShape(*(np.concatenate([getattr(p, n) for p in parts])
                                                              for n in ("attention", "masked", "head_dim",
                                                                        "work_fraction", "scores")))
        return self._plans["attention_shape"]

    def input_bytes(self) -> list[int]:
        """Bytes of one batch of each graph's inputs."""
        if self._input_bytes is None:
            self._input_bytes = [g.spec.input_bytes for g in self.graphs]
        return self._input_bytes

    def split(self, values: np.ndarray) -> list[np.ndarray]:
        """``values`` (``[total_nodes]``) cut into one array per graph."""
        o = self.offsets
        return [values[o[i]:o[i + 1]] for i in range(len(self.parts))]

    def padded(self, values: np.ndarray) -> np.ndarray:
        """``values`` (``[total_nodes]``) as a zero-padded ``[num_graphs, max_nodes]`` table."""
        out = np.zeros((len(self.parts), self._width))
        out[self._mask] = values
        return out

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per graph, the sum of its nodes' ``values`` (in node order; a graph's own ``np.sum`` adds pairwise,
        which rounds differently by about 1e-16 relative per node)."""
        if len(self.parts) == 0:
            return np.zeros(0)
        out = np.add.reduceat(values, np.minimum(self.offsets[:-1], max(len(values) - 1, 0))) if len(values) else \
            np.zeros(len(self.parts))
        return np.where(self.lens > 0, out, 0.0)


def stacked_timelines(stack: StackedFacts, gpu_us: np.ndarray, host_us: np.ndarray, kind: str,
                      prefix_us: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per graph, (latency µs, host µs) along the host and GPU-stream timelines (see
    :func:`~dippm_nas.prior.latency_us`); ``prefix_us``: each graph's host time before its first operator.

    Shapes:
        ``gpu_us``, ``host_us``: ``[total_nodes]``; ``prefix_us``: ``[num_graphs]`` or a scalar; returns two
        ``[num_graphs]`` arrays.
    """
    if kind != "gpu":
        host = stack.sums(host_us)
        return stack.sums(gpu_us) + host, host
    return Timelines(stack, gpu_us, host_us).latency(prefix_us=prefix_us)


class Timelines:
    """The host and GPU-stream timelines of every graph of a stack as ``[num_graphs, max_nodes]`` tables, for
    evaluating them under many host speeds and pass prefixes (the deployment spread's scenarios).

    Args:
        stack: the graphs; gpu_us, host_us: per node, µs (``[total_nodes]``).
        host: another :class:`Timelines` whose host timeline this one shares (``host_us`` is then unused).
    """

    def __init__(self, stack: StackedFacts, gpu_us: np.ndarray, host_us: np.ndarray | None = None,
                 host: "Timelines | None" = None) -> None:
        self.stack = stack
        g = stack.padded(gpu_us)
        cg = np.cumsum(g, axis=1)
        # gpu_end = max over launched kernels k of (host_end[k] - kernel time before k) + all kernel time
        self._before = np.where(g > 0, cg - g, np.inf)
        self._total = cg[:, -1] if g.shape[1] else np.zeros(len(stack))
        self._busy = (g > 0).any(axis=1)
        self._host = host._host if host is not None else np.cumsum(stack.padded(host_us), axis=1)
        self._last = np.maximum(stack.lens - 1, 0)

    def latency(self, host_scale: np.ndarray | float = 1.0,
                prefix_us: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Per graph (latency µs, host µs) with the host times multiplied by ``host_scale`` (per graph or one)
        and ``prefix_us`` of host time before the first operator. A scale other than 1 multiplies the cumulated
        host times (the same sums to about 1e-16 relative)."""
        n = len(self.stack)
        prefix = np.broadcast_to(np.asarray(prefix_us, dtype=np.float64), (n,))
        scale = np.asarray(host_scale, dtype=np.float64)
        h = self._host if scale.ndim == 0 and float(scale) == 1.0 else self._host * (
            scale[:, None] if scale.ndim else scale)
        h = h + prefix[:, None]
        if h.shape[1] == 0:
            return prefix.copy(), prefix.copy()
        host_end = np.where(self.stack.lens > 0, h[np.arange(n), self._last], prefix)
        gpu_end = (h - self._before).max(axis=1) + self._total
        return np.where(self._busy, np.maximum(gpu_end, host_end), host_end), host_end


class CostStack:
    """Node costs of one stack of graphs, kept per setting: the kernel times per (device, constants, TF32 flags,
    layout, autocast) and the host times per host on top, so that every estimate of a request (the features', the
    deployment's, its spread's scenarios, the MIG slices) times each graph's kernels once per distinct setting.

    Args:
        graphs: the graphs (validated here, as :func:`~dippm_nas.prior.estimate` does).
        device: the resolved device their dtypes are checked against.
    """

    def __init__(self, graphs: Sequence[OperatorGraph], device: Device) -> None:
        facts = checked_facts_many(graphs, device)
        self.facts = StackedFacts(graphs, facts)
        self._graph_stack: GraphStack | None = None
        self._kernels: dict[tuple[Any, ...], KernelTerms] = {}
        self._costs: dict[tuple[Any, ...], NodeCosts] = {}
        self._device = device
        self._fused: CostStack | None = None

    def kernels(self, r: ResolvedSettings, device: Device | None = None) -> KernelTerms:
        """Kernel terms of every node under ``r`` (on ``device``, a MIG slice view say, instead of ``r``'s)."""
        if r.rank3_fused and self.fused_rank3() is not self:  # the graphs as that PyTorch runs them, same nodes
            return self.fused_rank3().kernels(r, device)
        dev = r.device if device is None else device
        key = (dev.id, *r.kernel_key[1:])
        if key not in self._kernels:
            self._kernels[key] = kernel_terms(self.facts, None, dev, r.params, tf32_conv=r.tf32_conv,
                                              tf32_matmul=r.tf32_matmul, channels_last=r.channels_last,
                                              autocast=r.autocast, math_float32=r.math_float32,
                                              gemm_epilogue=gemm_epilogue(r.host))
        return self._kernels[key]

    def fused_rank3(self) -> "CostStack":
        """The stack of the graphs as PyTorch >= 2.14 runs them (calls on 3-D SDPA inputs fused:
        :func:`~dippm_nas.prior._sdpa_rank3.fused_rank3_graph`, same nodes), built once; ``self`` when no graph has
        such a call."""
        if self._fused is None:
            graphs = [fused_rank3_graph(g) for g in self.facts.graphs]
            same = all(a is b for a, b in zip(graphs, self.facts.graphs))
            self._fused = self if same else CostStack(graphs, self._device)
        return self._fused

    @property
    def graph_stack(self) -> GraphStack:
        """The graphs' node table for the liveness and feature passes (:func:`~dippm_nas.graph.stack_graphs`),
        built on first use."""
        if self._graph_stack is None:
            self._graph_stack = stack_graphs(self.facts.graphs)
        return self._graph_stack

    def on_slice(self, r: ResolvedSettings, device: Device) -> ResolvedSettings:
        """``r`` on ``device``, a MIG slice view of ``r``'s GPU, whose kernel terms are the GPU's re-timed
        (:func:`~dippm_nas.prior.retimed`: peaks, waves, bandwidth and L2 only)."""
        key = (device.id, *r.kernel_key[1:])
        if key not in self._kernels:
            self._kernels[key] = retimed(self.kernels(r), self.facts, None, device, r.params)
        return dataclasses.replace(r, device=device)

    def gpu_us(self, r: ResolvedSettings) -> np.ndarray:
        """Kernel µs per node of ``r``'s runtime (without the host times where the runtime leaves them)."""
        return self.kernels(r).gpu_us if r.runtime != "compiled" else self.runtime_costs(r)[0]

    def costs(self, r: ResolvedSettings) -> NodeCosts:
        """:class:`NodeCosts` of every node under ``r`` (eager; ``[total_nodes]`` arrays)."""
        key = (*r.kernel_key, r.host)
        if key not in self._costs:
            k = self.kernels(r)
            self._costs[key] = costs_of_terms(self.facts, k, r.device, r.params,
                                              host_times(self.facts, k, r.device, r.params, r.host))
        return self._costs[key]

    def runtime_costs(self, r: ResolvedSettings) -> tuple[np.ndarray, np.ndarray, NodeCosts]:
        """(GPU µs, host µs) per node of ``r``'s runtime (see :func:`~dippm_nas.prior.estimate`), and the eager
        costs they come from."""
        c = self.costs(r)
        dev = r.device
        if r.runtime == "eager" or dev.kind != "gpu":
            return c.gpu_us, c.host_us, c
        if r.runtime == "cuda-graphs":
            return c.gpu_us, np.zeros_like(c.host_us), c
        parts = [_runtime_costs(gr, dev, r.params, f, g, h, r.runtime, r.host)
                 for gr, f, g, h in zip(self.facts.graphs, self.facts.parts, self.facts.split(c.gpu_us),
                                        self.facts.split(c.host_us))]
        return np.concatenate([g for g, _ in parts]), np.concatenate([h for _, h in parts]), c

    def prefixes(self, r: ResolvedSettings, host: HostProfile | None = None,
                 input_copy: str | None = None, fresh_page_us: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Per graph, (host µs before the first operator, the input copy within it) for ``r`` (with another
        host or input copy when given; ``fresh_page_us``: a pageable batch's first touch per page, reference
        host)."""
        prof = r.host if host is None else host
        copy = r.input_copy if input_copy is None else input_copy
        sizes = self.facts.input_bytes()
        by_size: dict[int, tuple[float, float]] = {}
        for g, b in zip(self.facts.graphs, sizes):  # a batch of one space shares a few input sizes
            if b not in by_size:
                by_size[b] = _pass_host_us(g, r.device, r.params, r.runtime, prof, copy, b, fresh_page_us)
        return np.array([by_size[b][0] for b in sizes]), np.array([by_size[b][1] for b in sizes])


def estimate_many(graphs: Sequence[OperatorGraph], device: Device | str, *, stack: CostStack | None = None,
                  power: Any = None, **settings: Any) -> list[PriorEstimate]:
    """:func:`~dippm_nas.prior.estimate` of every graph, in one pass of array operations.

    Args:
        graphs: captured graphs (validated here).
        device: a :class:`~dippm_nas.devices.Device` or a catalogue id.
        stack: the :class:`CostStack` of ``graphs`` to reuse (its kernel times per setting); default: a new one.
        power: the power model's constants per architecture (default: the shipped ones).
        settings: the keyword arguments of :func:`~dippm_nas.prior.estimate` (``params``, ``deployment``; its
            deprecated ``tf32_conv``, ``runtime``, ``host``... warn as there).

    Returns:
        One :class:`~dippm_nas.prior.PriorEstimate` per graph, in order.

    Raises:
        As :func:`~dippm_nas.prior.estimate`.
    """
    legacy = legacy_keywords("estimate_many", {k: settings.pop(k) for k in list(settings) if k in LEGACY_KEYWORDS})
    r = resolved_settings(device, **settings, **legacy)
    if stack is None:
        stack = CostStack(graphs, r.device)
    return estimates_of(stack, r, power)


def estimates_of(stack: CostStack, r: ResolvedSettings, power: Any = None) -> list[PriorEstimate]:
    """The estimates of every graph of ``stack`` under the resolved settings ``r`` (see :func:`estimate_many`)."""
    if r.rank3_fused:
        stack = stack.fused_rank3()
    dev, p, st = r.device, r.params, stack.facts
    table = p.op_tables.get(dev.id) if dev.kind != "gpu" else None
    if table is not None:  # operators timed in place on this machine: the single-graph path reads the table
        table_settings = DeploymentSettings(runtime=r.runtime, host=r.host, input_copy=r.input_copy)
        return [estimate(g, dev, params=p, power=power, deployment=table_settings) for g in st.graphs]
    _memory_of(stack, dev, r.autocast, r.math_float32)
    gpu_us, host_us, eager = stack.runtime_costs(r)
    prefix, copy = stack.prefixes(r)
    latency, host_total = stacked_timelines(st, gpu_us, host_us, dev.kind, prefix)
    busy = st.sums(gpu_us)
    energies: list[Any] = [None] * len(st)
    if dev.has_power:
        pw = power_params_for(dev, power)
        activity = node_activity(st.flops, st.bytes, gpu_us, eager.tensor_core, (st.dtype == 1) | (st.dtype == 2),
                                 dev)
        busy_uj = st.sums(node_power_w(pw, dev, activity) * gpu_us)
        wait = wait_power_w(pw, dev)
        energies = [((b + wait * max(0.0, float(lat) - float(t))) * 1e-6, pw)
                    for b, lat, t in zip(busy_uj, latency, busy)]
    out = []
    for i, (g, f) in enumerate(zip(st.graphs, st.parts)):
        a, b = st.offsets[i], st.offsets[i + 1]
        costs = NodeCosts(gpu_us=gpu_us[a:b], host_us=host_us[a:b], compute_us=eager.compute_us[a:b],
                          memory_us=eager.memory_us[a:b], kernels=eager.kernels[a:b],
                          utilisation=eager.utilisation[a:b], tensor_core=eager.tensor_core[a:b], classes=f.classes)
        out.append(_finished(g, dev, p, r.host, f, costs, r.runtime, float(prefix[i]), float(copy[i]),
                             float(latency[i]), float(host_total[i]), float(busy[i]), energies[i], r.autocast,
                             r.math_float32, autocast_open=r.autocast_open))
    return out


def _memory_of(stack: CostStack, dev: Device, autocast: str | None = None,
               math_float32: bool | None = None) -> None:
    """Each graph's liveness pass (and on a GPU its memory parts), kept with its facts as the single-graph
    estimate keeps them, the missing ones computed over all graphs at once (under ``autocast`` on a GPU, and for
    a graph whose SDPA math path is priced by a known PyTorch version, graph by graph:
    :func:`~dippm_nas.prior.activation_liveness_many` has neither)."""
    st = stack.facts
    gpu = dev.kind == "gpu"
    kinds = [eager_kind(autocast, g.provenance_digest(), sdpa_math_mode(g, math_float32)) if gpu else "dataflow"
             for g in st.graphs]
    for f in st.parts:
        if f.memory is None:
            f.memory = {}
    todo = _firsts([i for i, f in enumerate(st.parts) if kinds[i] not in f.memory], st, kinds)
    alone = [i for i in todo if gpu and (autocast is not None or "+sdpa_math:" in kinds[i])]
    for i in alone:
        _liveness(st.graphs[i], st.parts[i].memory, kinds[i])
    todo = [i for i in todo if i not in set(alone)]
    if todo:
        whole = stack.graph_stack if len(todo) == len(st) else None
        for i, m in zip(todo, activation_liveness_many([st.graphs[i] for i in todo], retention=gpu,
                                                       include_inputs=not gpu, stack=whole)):
            st.parts[i].memory[kinds[i]] = m
    if not gpu:
        return
    keys = [gpu_parts_key(g, dev, autocast, math_float32) for g in st.graphs]
    todo = _firsts([i for i, (f, k) in enumerate(zip(st.parts, keys)) if k not in f.memory], st, keys)
    if todo:
        graphs = [st.graphs[i] for i in todo]
        parts = gpu_memory_parts_many(
            graphs, [st.parts[i].memory[kinds[i]] for i in todo], context_mib=dev.runtime_baseline_mib,
            cublas_workspace_mib=dev.cublas_workspace_mib, uses_cublas=[st.parts[i].uses_cublas for i in todo],
            uses_cudnn=[uses_cudnn(st.graphs[i], st.parts[i]) for i in todo],
            stack=stack.graph_stack if len(todo) == len(st) else None)
        for i, p in zip(todo, parts):
            st.parts[i].memory[keys[i]] = p


def _firsts(idx: list[int], st: StackedFacts, keys: "Sequence[Any]") -> list[int]:
    """``idx`` without the graphs whose facts and key (of what is computed into the facts) an earlier one of them
    shares (a graph twice in a request; a graph with provenance and one of the same structure without share
    their facts, not their keys)."""
    seen: set[tuple[int, Any]] = set()
    out = []
    for i in idx:
        if (id(st.parts[i]), keys[i]) not in seen:
            seen.add((id(st.parts[i]), keys[i]))
            out.append(i)
    return out
