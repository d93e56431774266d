"""The analytic prior: latency along two timelines, energy from utilisation, memory from liveness.

Latency. The host issues the operators one by one; each costs host time (per execution runtime and host
profile, :mod:`dippm_nas.prior._host`) on the host timeline, and its kernels run in order on one GPU stream:

    host_end[i]  = host_end[i-1] + host_us[i]
    gpu_start[i] = max(gpu_end[i-1], host_end[i])
    gpu_end[i]   = gpu_start[i] + gpu_us[i]

The forward pass ends with the last kernel: ``latency = gpu_end[-1]`` (the critical path through both
timelines). It equals the device's busy time plus the idle time the host causes: small batches in eager
mode are host-bound (``host_ms > gpu_busy_ms``). A fixed host time per pass (the call, a CUDA graph's
replay, the input's host-to-device copy when the timed region includes it) comes before the first
operator. On a CPU device the host runs the kernels itself, so the times add.

Energy. Power integrated over the same timeline (:mod:`dippm_nas.prior._power`): while node ``i`` runs,
idle power plus shares of the board's range for the busy SMs, the tensor-core and CUDA-core FLOP rates and
the DRAM traffic of the node, capped at board power; while the GPU waits for the host, a waiting share.
The shares are fitted per architecture on measured whole-GPU energy (``calibration/power.json``).

Memory. On a GPU, the parts of :func:`~dippm_nas.prior._memory.gpu_memory_parts`: ``CUDA context + weights
+ input held by the caller + activation peak (eager liveness) + cuBLAS and cuDNN workspaces + the caching
allocator's rounding`` (reserved minus allocated), with a standard deviation. On a CPU, ``weights +
activation peak (liveness, inputs included) + workspace``, no rounding and no standard deviation.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas._deprecation import MISSING
from dippm_nas.deployment import AUTOCAST_DTYPES, Deployment, ResolvedDeployment
from dippm_nas.devices import Device, HostProfile, resolve_device, resolve_host_profile
from dippm_nas.errors import GraphValidationError
from dippm_nas.graph import SDPA_MATH_ATTR, SDPA_RANK_ATTR, OperatorGraph
from dippm_nas.prior._deploy import DeploymentSettings, deployment_settings, input_copy_kind
from dippm_nas.prior._math_path import MATH_PATH_FLOAT32_SINCE, math_path_float32
from dippm_nas.prior._host import HOST_KINDS, Execution, HostModel, check_runtime, compiled_groups, input_copy_us
from dippm_nas.prior._sdpa_rank3 import fused_rank3_graph, has_rank3_math_path, sdpa_rank3_fused
from dippm_nas.prior._memory import MemoryBreakdown, activation_liveness, gpu_memory_parts
from dippm_nas.prior._nodes import check_autocast, graph_facts_many, node_costs
from dippm_nas.prior._params import PriorParams, default_params
from dippm_nas.units import BYTES_PER_MIB as MIB
from dippm_nas.prior._power import PowerTable, node_activity, pass_energy_j, power_params_for

__all__ = ["PriorEstimate", "estimate", "estimate_latency_ms", "latency_sigma_log", "latency_us", "timeline_fields"]

logger = logging.getLogger(__name__)

#: A PyTorch version on each side of :data:`~dippm_nas.prior.MATH_PATH_FLOAT32_SINCE`, by :func:`sdpa_math_mode`
#: (the liveness of an SDPA math path depends on the version through that threshold only).
_VERSION_OF_MODE = {"float32": "{}.{}".format(*MATH_PATH_FLOAT32_SINCE),
                    "inputs": "{}.{}".format(MATH_PATH_FLOAT32_SINCE[0], MATH_PATH_FLOAT32_SINCE[1] - 1)}

@dataclass(frozen=True)
class PriorEstimate:
    """What the analytic prior says about one graph on one device.

    Shapes:
        ``node_time_ms``, ``node_host_ms``, ``node_utilisation``: ``[num_nodes]`` float64.

    Attributes:
        device: device id.
        batch_size, dtype: of the graph's InputSpec.
        node_time_ms: device time of each node's kernels, ms (0 for views and constant-folded nodes);
            a node feature for the GNN.
        node_host_ms: host time to dispatch each node, ms.
        node_utilisation: share of the limiting peak each node uses while it runs.
        latency_ms: one forward pass, ms.
        host_ms: host dispatch time of the whole pass, ms.
        gpu_busy_ms: sum of kernel times, ms; ``gpu_idle_ms = latency_ms - gpu_busy_ms``.
        energy_j: energy of one pass, J; ``None`` when the device has no power figures.
        energy_j_std: one σ of ``energy_j`` (the power fit's held-out error, wider for an architecture
            without a fit), J; ``None`` without power figures.
        energy_source: ``"predicted"`` where the power model is fitted on measurements of the device's
            architecture, ``"analytic"`` otherwise, ``"unavailable"`` without power figures.
        baseline_mib, weights_mib, activations_peak_mib, workspace_mib, allocator_overhead_mib, input_mib:
            memory parts, MiB (``baseline_mib``: the CUDA context; ``workspace_mib``: cuBLAS plus cuDNN;
            ``input_mib``: the input the caller holds, GPU only: on a CPU the input is in the activations);
            ``memory_mib`` is their sum.
        memory_mib_std: standard deviation of ``memory_mib`` (GPU; ``None`` on a CPU).
        memory_details: the GPU memory parts and their deviations for :attr:`Prediction.details`.
        peak_node: node index where activations peak.
        tensor_core_fraction: share of kernel time on tensor cores.
        params_source: where the prior's constants come from.
        unknown_ops: ``{op: count}`` of nodes without a formula (generic estimates).
        runtime: the execution runtime the latency is for (``"eager"``, ``"cuda-graphs"``, ``"compiled"``).
        host_profile: name of the host profile that scaled the host times.
        pass_host_ms: host time once per pass before the first operator (call, graph replay, input copy), ms.
        input_copy_ms: the input's host-to-device copy inside it, ms (0 when not in the timed region).
        host_model_fitted: the host times come from a fitted host model (False: the legacy constants).
        autocast: the dtype autocast ran the graph's kernels in (``None``: no autocast; the kernels run in
            ``dtype``).
    """

    device: str
    batch_size: int
    dtype: str
    node_time_ms: np.ndarray
    node_host_ms: np.ndarray
    node_utilisation: np.ndarray
    latency_ms: float
    host_ms: float
    gpu_busy_ms: float
    energy_j: float | None
    baseline_mib: float
    weights_mib: float
    activations_peak_mib: float
    workspace_mib: float
    allocator_overhead_mib: float
    memory_mib: float
    peak_node: int
    tensor_core_fraction: float
    params_source: str
    unknown_ops: dict[str, int] = field(default_factory=dict)
    runtime: str = "eager"
    host_profile: str = ""
    pass_host_ms: float = 0.0
    input_copy_ms: float = 0.0
    host_model_fitted: bool = False
    input_mib: float = 0.0
    memory_mib_std: float | None = None
    memory_details: dict[str, float] = field(default_factory=dict)
    energy_j_std: float | None = None
    energy_source: str = "unavailable"
    autocast: str | None = None

    @property
    def compute_dtype(self) -> str:
        """The dtype the kernels run in: :attr:`autocast` where set, else :attr:`dtype`."""
        return self.autocast or self.dtype

    @property
    def gpu_idle_ms(self) -> float:
        """Time the device waits for the host, ms."""
        return max(0.0, self.latency_ms - self.gpu_busy_ms)

    @property
    def launch_bound(self) -> bool:
        """The host, not the device, sets the pace (typical of small batches)."""
        return self.host_ms > self.gpu_busy_ms

    def details(self) -> dict[str, float]:
        """Named scalar figures (units in the keys) for :attr:`Prediction.details`."""
        return {
            "host_ms": self.host_ms, "gpu_busy_ms": self.gpu_busy_ms, "gpu_idle_ms": self.gpu_idle_ms,
            "host_bound": float(self.launch_bound), "pass_host_ms": self.pass_host_ms,
            "input_copy_ms": self.input_copy_ms, "host_model_fitted": float(self.host_model_fitted),
            "baseline_mib": self.baseline_mib, "weights_mib": self.weights_mib,
            "activations_peak_mib": self.activations_peak_mib, "workspace_mib": self.workspace_mib,
            "allocator_overhead_mib": self.allocator_overhead_mib,
            **self.memory_details,
            "tensor_core_fraction": self.tensor_core_fraction,
            "launch_bound": float(self.launch_bound),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (arrays as lists)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["memory_details"] = dict(self.memory_details)
        for k in ("node_time_ms", "node_host_ms", "node_utilisation"):
            d[k] = [float(x) for x in d[k]]
        d["unknown_ops"] = dict(self.unknown_ops)
        d["gpu_idle_ms"] = self.gpu_idle_ms
        d["launch_bound"] = self.launch_bound
        return d


def _timelines(gpu_us: np.ndarray, host_us: np.ndarray, kind: str, prefix_us: float = 0.0) -> tuple[float, float]:
    """(latency µs, host µs) along the host and GPU-stream timelines; ``prefix_us`` of host time comes
    before the first operator."""
    if kind != "gpu":
        total = float(gpu_us.sum() + host_us.sum())
        return total, float(host_us.sum())
    if len(host_us) == 0:
        return prefix_us, prefix_us
    host_end = np.cumsum(host_us) + prefix_us
    idx = np.flatnonzero(gpu_us > 0)
    if len(idx) == 0:
        return float(host_end[-1]), float(host_end[-1])
    # gpu_end[j] = max(gpu_end[j-1], host_end[i_j]) + g[i_j]  ==  max over k <= j of (host_end[i_k] + sum g[i_k..i_j])
    g = gpu_us[idx]
    cg = np.cumsum(g)
    start_term = host_end[idx] - (cg - g)   # host_end[i_k] - sum of g before k
    gpu_end = float(start_term.max() + cg[-1])
    return max(gpu_end, float(host_end[-1])), float(host_end[-1])


def latency_us(gpu_us: np.ndarray, host_us: np.ndarray, prefix_us: float = 0.0) -> float:
    """Critical path through the host and GPU-stream timelines of a GPU device, µs.

    Shapes:
        ``gpu_us``, ``host_us``: ``[num_nodes]``.
    """
    return _timelines(np.asarray(gpu_us, dtype=np.float64), np.asarray(host_us, dtype=np.float64), "gpu",
                      prefix_us)[0]


def _pass_host_us(graph: OperatorGraph, dev: Device, p: PriorParams, runtime: str, prof: HostProfile,
                  input_copy: str, input_bytes: int | None = None, fresh_page_us: float = 0.0) -> tuple[float, float]:
    """(host time once per pass before the first operator, the input copy within it), µs (``input_bytes``: the
    graph's input bytes when the caller has them; ``fresh_page_us``: the first touch of a page of a freshly
    mapped batch on the reference host, 0 for a batch in memory the process already touched)."""
    if dev.kind != "gpu":
        return 0.0, 0.0
    hm = p.host_model if p.host_model is not None else _LEGACY_HOST
    k = hm.scale(prof)
    size = graph.spec.input_bytes if input_bytes is None else input_bytes
    copy = input_copy_us(input_copy, size, dev.pcie_gbps, pageable_fixed_us=hm.h2d_fixed_us * k,
                         pageable_gbps=hm.h2d_gbps, pinned_fixed_us=hm.op_us["memory"] * k,
                         fresh_page_us=fresh_page_us * k)
    fixed = hm.graph_launch_us * k if runtime == "cuda-graphs" else hm.iteration_us * k
    return fixed + copy, copy


def _runtime_costs(graph: OperatorGraph, dev: Device, p: PriorParams, facts: Any, gpu_us: np.ndarray,
                   host_us: np.ndarray, runtime: str, prof: HostProfile) -> tuple[np.ndarray, np.ndarray]:
    """Per-node (GPU µs, host µs) of ``runtime`` from the eager ones."""
    if runtime == "eager" or dev.kind != "gpu":
        return gpu_us, host_us
    if runtime == "cuda-graphs":
        return gpu_us, np.zeros_like(host_us)
    # compiled: one generated kernel per fused chain (its slowest member's time: one read, one write), one
    # library call per convolution/GEMM; each kernel costs the compiled launch on the host, views nothing
    hm = p.host_model if p.host_model is not None else _LEGACY_HOST
    active = facts.active & (gpu_us > 0)
    groups = compiled_groups(facts.classes, graph.predecessors(), active)
    g = np.zeros_like(gpu_us)
    h = np.zeros_like(host_us)
    first: dict[int, int] = {}
    for i in np.flatnonzero(groups >= 0):
        j = first.setdefault(int(groups[i]), int(i))
        g[j] = max(g[j], gpu_us[i])
    for j in first.values():
        h[j] = hm.compiled_kernel_us * hm.scale(prof)
    return g, h


#: Host constants used when the prior's parameters carry no fitted host model (files written before it).
_LEGACY_HOST = HostModel(op_us={k: 10.0 for k in HOST_KINDS}, iteration_us=0.0, source="uncalibrated defaults")


#: The keywords of :func:`estimate`, :func:`estimate_latency_ms`, :func:`~dippm_nas.prior.predict` and
#: :func:`~dippm_nas.prior.estimate_many` that ``deployment=`` replaces, with the values they default to: deprecated
#: (a :class:`DeprecationWarning` where one is passed), removed in dippm-nas 0.2.
LEGACY_KEYWORDS: dict[str, Any] = {"tf32_conv": True, "tf32_matmul": False, "channels_last": False, "runtime": "eager",
                                   "host": None, "input_copy": False, "execution": None, "autocast": None}
#: The release that drops :data:`LEGACY_KEYWORDS`.
LEGACY_REMOVED_IN = "0.2"


def legacy_keywords(func: str, given: Mapping[str, Any], *, stacklevel: int = 3) -> dict[str, Any]:
    """The values of :data:`LEGACY_KEYWORDS` for a call of ``func`` (``given``: what the caller passed, :data:`MISSING`
    where it passed nothing), with one :class:`DeprecationWarning` naming those it passed."""
    passed = [k for k in LEGACY_KEYWORDS if given.get(k, MISSING) is not MISSING]
    if passed:
        warnings.warn(f"dippm_nas.prior.{func}({'=, '.join(passed)}=) is deprecated and will be removed in dippm-nas "
                      f"{LEGACY_REMOVED_IN}: describe how inference runs with deployment= (a dippm_nas.Deployment, or "
                      "dippm_nas.prior.DeploymentSettings(runtime=..., host=..., tf32_conv=..., tf32_matmul=..., "
                      "channels_last=..., autocast=..., input_copy=...))", DeprecationWarning, stacklevel=stacklevel)
    return {k: (given[k] if k in passed else default) for k, default in LEGACY_KEYWORDS.items()}


def estimate(
    graph: OperatorGraph, device: Device | str, *, params: PriorParams | None = None, power: PowerTable | None = None,
    deployment: "Deployment | ResolvedDeployment | DeploymentSettings | None" = None,
    tf32_conv: Any = MISSING, tf32_matmul: Any = MISSING, channels_last: Any = MISSING, runtime: Any = MISSING,
    host: Any = MISSING, input_copy: Any = MISSING, execution: Any = MISSING, autocast: Any = MISSING,
) -> PriorEstimate:
    """Analytic latency, energy and memory of one forward pass of ``graph`` on ``device``.

    Args:
        graph: a captured model (validated here).
        device: a :class:`~dippm_nas.devices.Device` or a catalogue id.
        params: the prior's constants; default: the shipped fitted ones.
        power: the power model's constants per architecture; default: the shipped ones (``power.json``).
        deployment: how inference runs: a :class:`~dippm_nas.Deployment` (or its resolved form; its undescribed
            settings take the centre values of :func:`deployment_settings`), or the prior's
            :class:`~dippm_nas.prior.DeploymentSettings` as they are; ``None``: PyTorch eager on the default host
            profile, PyTorch's default TF32 flags (convolutions on, matmuls off), NCHW, no autocast, no input copy.
        tf32_conv, tf32_matmul, channels_last, runtime, host, input_copy, execution, autocast: deprecated
            (:data:`LEGACY_KEYWORDS`, removed in dippm-nas 0.2; a :class:`DeprecationWarning`): the settings
            ``deployment=`` describes (``host``: a :class:`~dippm_nas.devices.HostProfile`, a profile file or
            ``None``; ``input_copy``: ``"none"``, ``"pageable"``, ``"pinned"`` or a bool; ``execution``: a
            :class:`~dippm_nas.prior.Execution`). A ``deployment`` given beside them overrides what it describes.

    Raises:
        DeviceError: unknown device id (the choices are listed), or an unreadable host profile.
        ExecutionRuntimeError: unknown runtime (the choices are listed).
        UnsupportedDtypeError: the device has no peak for the graph's dtype.
        GraphValidationError: a malformed graph.
    """
    legacy = legacy_keywords("estimate", dict(tf32_conv=tf32_conv, tf32_matmul=tf32_matmul,
                                              channels_last=channels_last, runtime=runtime, host=host,
                                              input_copy=input_copy, execution=execution, autocast=autocast))
    return estimate_with(graph, device, params=params, power=power, deployment=deployment, **legacy)


def estimate_with(graph: OperatorGraph, device: Device | str, *, params: PriorParams | None, power: PowerTable | None,
                  deployment: Any, **legacy: Any) -> PriorEstimate:
    """:func:`estimate` with :data:`LEGACY_KEYWORDS` given whole (no warning: the callers that still take them,
    such as :func:`~dippm_nas.prior.predict`, warned their own caller)."""
    dev, p, prof, facts, costs, runtime, prefix_us, copy_us, latency_us, host_total_us, ac, mf, graph = (
        _latency_parts(graph, device, params=params, deployment=deployment, **legacy))
    energy = None
    if dev.has_power:
        pw = power_params_for(dev, power)
        activity = node_activity(facts.flops, facts.bytes, costs.gpu_us, costs.tensor_core,
                                 (facts.dtype == 1) | (facts.dtype == 2), dev)
        energy = (pass_energy_j(pw, dev, costs.gpu_us, activity, latency_us), pw)
    open_ = deployment is not None and "autocast" in deployment_settings(deployment).assumed
    return _finished(graph, dev, p, prof, facts, costs, runtime, prefix_us, copy_us, latency_us, host_total_us,
                     float(costs.gpu_us.sum()), energy, ac, mf, autocast_open=open_)


def _finished(graph: OperatorGraph, dev: Device, p: PriorParams, prof: HostProfile, facts: Any, costs: Any,
              runtime: str, prefix_us: float, copy_us: float, latency_us: float, host_total_us: float,
              busy_us: float, energy: tuple[float, Any] | None, autocast: str | None = None,
              math_float32: bool | None = None, *, autocast_open: bool = False) -> PriorEstimate:
    """The :class:`PriorEstimate` of one graph from its latency parts, its GPU busy time (µs) and its energy
    (``(J, the power constants)``, ``None`` without power figures): the memory parts are added here (on a GPU
    under ``autocast``, the activation peak of the autocast pass: run-time dtypes and autocast's casts; an SDPA
    math path as the deployment's PyTorch version holds it, ``math_float32``; with ``autocast_open``, an
    undescribed autocast of a half-precision graph, the larger of the pass in the graph's dtype and the pass under
    autocast at it, so that a memory budget holds for either)."""
    if dev.kind != "gpu":
        busy_us = latency_us
    energy_j = energy_std = None
    energy_source = "unavailable"
    if energy is not None:
        energy_j, pw = energy
        energy_std, energy_source = energy_j * pw.sigma_log, ("predicted" if pw.fitted else "analytic")

    if facts.memory is None:
        facts.memory = {}
    memory_std: float | None = None
    memory_details: dict[str, float] = {}
    if dev.kind == "gpu":
        parts = _gpu_parts(graph, facts, dev, autocast, math_float32)
        if autocast_open and autocast is None and graph.spec.dtype in AUTOCAST_DTYPES:
            other = _gpu_parts(graph, facts, dev, graph.spec.dtype, math_float32)
            parts = other if other.total_mib > parts.total_mib else parts
        baseline, weights_mib, input_mib = parts.context_mib, parts.weights_mib, parts.input_mib
        act_mib, workspace_mib = parts.activations_peak_mib, parts.cublas_workspace_mib + parts.cudnn_workspace_mib
        overhead_mib, total_mib = parts.allocator_overhead_mib, parts.total_mib
        memory_std, memory_details, peak_node = parts.std_mib, parts.details(), parts.peak_node
        memory_details.update(sdpa_math_details(graph, math_float32))
    else:  # a CPU: the input among the activations, no caching allocator, no context
        mem = _liveness(graph, facts.memory, "dataflow")
        baseline, weights_mib, input_mib = dev.runtime_baseline_mib, float(graph.param_bytes) / MIB, 0.0
        act_mib, workspace_mib, overhead_mib = mem.peak_allocated_bytes / MIB, 0.0, 0.0
        total_mib = baseline + weights_mib + act_mib
        peak_node = mem.peak_node

    tc = float(costs.gpu_us[costs.tensor_core].sum())
    return PriorEstimate(
        device=dev.id, batch_size=graph.spec.batch_size, dtype=graph.spec.dtype,
        node_time_ms=costs.gpu_us / 1e3, node_host_ms=costs.host_us / 1e3,
        node_utilisation=costs.utilisation,
        latency_ms=latency_us / 1e3, host_ms=host_total_us / 1e3, gpu_busy_ms=busy_us / 1e3,
        energy_j=energy_j,
        baseline_mib=baseline, weights_mib=weights_mib, activations_peak_mib=act_mib,
        workspace_mib=workspace_mib, allocator_overhead_mib=overhead_mib, memory_mib=total_mib,
        peak_node=peak_node, tensor_core_fraction=tc / busy_us if busy_us > 0 else 0.0,
        params_source=p.source, unknown_ops=facts.unknown_ops(), runtime=runtime, host_profile=prof.name,
        pass_host_ms=prefix_us / 1e3, input_copy_ms=copy_us / 1e3,
        host_model_fitted=dev.kind == "gpu" and p.host_model is not None,
        input_mib=input_mib, memory_mib_std=memory_std, memory_details=memory_details,
        energy_j_std=energy_std, energy_source=energy_source, autocast=autocast,
    )


@dataclass(frozen=True)
class ResolvedSettings:
    """The settings of one prior estimate, each resolved and checked once (:func:`resolved_settings`)."""

    device: Device
    params: PriorParams
    host: HostProfile
    runtime: str
    input_copy: str
    autocast: str | None
    tf32_conv: bool
    tf32_matmul: bool
    channels_last: bool
    math_float32: bool | None = None
    autocast_open: bool = False
    rank3_fused: bool | None = None

    @property
    def kernel_key(self) -> tuple[Any, ...]:
        """What the kernel times depend on besides the graph (of the host only its framework, which decides whether a
        linear layer's bias add is a kernel: :func:`~dippm_nas.prior._nodes.gemm_epilogue`)."""
        return (self.device.id, id(self.params), self.tf32_conv, self.tf32_matmul, self.channels_last, self.autocast,
                self.math_float32, self.rank3_fused, self.host.framework)


def resolved_settings(device: Device | str, *, tf32_conv: bool = True, tf32_matmul: bool = False,
                      channels_last: bool = False, params: PriorParams | None = None, runtime: str = "eager",
                      host: HostProfile | str | None = None, input_copy: bool | str = False,
                      execution: Execution | None = None, autocast: str | None = None,
                      deployment: Any = None) -> ResolvedSettings:
    """The keyword arguments of :func:`estimate` resolved once (``execution`` and ``deployment`` override the
    settings they describe). Errors as for :func:`estimate`."""
    if execution is not None:
        runtime, host, input_copy = execution.runtime, execution.host, execution.input_copy
    if deployment is not None:
        s = deployment_settings(deployment)
        runtime, host, input_copy, autocast = s.runtime, s.host, s.input_copy, s.autocast
        tf32_conv, tf32_matmul, channels_last = s.tf32_conv, s.tf32_matmul, s.channels_last
        math_float32, rank3_fused = math_path_float32(s.torch_version), sdpa_rank3_fused(s.torch_version)
        autocast_open = "autocast" in s.assumed
    else:
        math_float32 = rank3_fused = None
        autocast_open = False
    input_copy = input_copy_kind(input_copy)
    check_autocast(autocast)
    runtime = check_runtime(runtime)
    prof = resolve_host_profile(host)
    dev = resolve_device(device)
    p = params if params is not None else default_params()
    return ResolvedSettings(device=dev, params=p, host=prof, runtime=runtime, input_copy=input_copy,
                            autocast=autocast, tf32_conv=tf32_conv, tf32_matmul=tf32_matmul,
                            channels_last=channels_last, math_float32=math_float32, rank3_fused=rank3_fused,
                            autocast_open=autocast_open)


def checked_facts(graph: OperatorGraph, dev: Device) -> Any:
    """The :class:`~dippm_nas.prior.GraphFacts` of ``graph`` (validated on first sight), whose dtypes ``dev``
    must have a peak for.

    Raises:
        GraphValidationError: not an OperatorGraph, or a malformed one.
        UnsupportedDtypeError: the device has no peak for one of the graph's dtypes.
    """
    return checked_facts_many([graph], dev)[0]


def checked_facts_many(graphs: Sequence[OperatorGraph], dev: Device) -> list[Any]:
    """:func:`checked_facts` of every graph (the facts of those not seen yet computed together,
    :func:`~dippm_nas.prior.graph_facts_many`)."""
    for graph in graphs:
        if not isinstance(graph, OperatorGraph):
            raise GraphValidationError(f"graph must be an OperatorGraph (see dippm_nas.capture), got "
                                       f"{type(graph).__name__}")
    facts = graph_facts_many(graphs)  # validates the graphs on first sight
    for graph, f in zip(graphs, facts):
        dev.check_dtype(graph.spec.dtype)
        for dt in sorted(f.dtypes):
            dev.check_dtype(dt)
    return facts


def _latency_parts(graph: OperatorGraph, device: Device | str, *, tf32_conv: bool, tf32_matmul: bool,
                   channels_last: bool, params: PriorParams | None, runtime: str, host: HostProfile | str | None,
                   input_copy: bool | str, execution: Execution | None, autocast: str | None = None,
                   deployment: Any = None) -> tuple[Any, ...]:
    """The latency half of :func:`estimate` (validation, per-node costs, timelines), shared with
    :func:`estimate_latency_ms`: ``(device, params, host profile, facts, costs, runtime, prefix µs, input copy
    µs, latency µs, host µs, the resolved autocast dtype or None, the SDPA math path's version rule or None, the
    graph as the deployment's PyTorch runs its SDPA calls: :func:`~dippm_nas.prior._sdpa_rank3.fused_rank3_graph`
    from 2.14)``."""
    r = resolved_settings(device, tf32_conv=tf32_conv, tf32_matmul=tf32_matmul, channels_last=channels_last,
                          params=params, runtime=runtime, host=host, input_copy=input_copy, execution=execution,
                          autocast=autocast, deployment=deployment)
    dev, p, prof, runtime = r.device, r.params, r.host, r.runtime
    if r.rank3_fused and isinstance(graph, OperatorGraph):
        graph = fused_rank3_graph(graph)
    facts = checked_facts(graph, dev)
    costs = node_costs(graph, dev, p, tf32_conv=r.tf32_conv, tf32_matmul=r.tf32_matmul,
                       channels_last=r.channels_last, host=prof, autocast=r.autocast, math_float32=r.math_float32)
    table = p.op_tables.get(dev.id) if dev.kind != "gpu" else None
    if table is not None:  # operators timed in place on this machine, instead of the roofline
        comp_us, over_us, uncovered = table.node_us(graph)
        costs = dataclasses.replace(costs, gpu_us=np.where(uncovered, costs.gpu_us, comp_us),
                                    host_us=np.where(uncovered, costs.host_us, over_us))
    gpu_rt, host_rt = _runtime_costs(graph, dev, p, facts, costs.gpu_us, costs.host_us, runtime, prof)
    if gpu_rt is not costs.gpu_us or host_rt is not costs.host_us:
        costs = dataclasses.replace(costs, gpu_us=gpu_rt, host_us=host_rt)
    prefix_us, copy_us = _pass_host_us(graph, dev, p, runtime, prof, r.input_copy)
    latency_us, host_total_us = _timelines(costs.gpu_us, costs.host_us, dev.kind, prefix_us)
    return (dev, p, prof, facts, costs, runtime, prefix_us, copy_us, latency_us, host_total_us, r.autocast,
            r.math_float32, graph)


def estimate_latency_ms(
    graph: OperatorGraph, device: Device | str, *, params: PriorParams | None = None,
    deployment: "Deployment | ResolvedDeployment | DeploymentSettings | None" = None,
    tf32_conv: Any = MISSING, tf32_matmul: Any = MISSING, channels_last: Any = MISSING, runtime: Any = MISSING,
    host: Any = MISSING, input_copy: Any = MISSING, execution: Any = MISSING, autocast: Any = MISSING,
) -> float:
    """``estimate(...).latency_ms`` without the energy and memory parts (the same computation of the latency,
    for callers that need only it, such as the MIG advisor's per-slice latencies). Arguments (the deprecated
    :data:`LEGACY_KEYWORDS` among them) and errors as for :func:`estimate`."""
    legacy = legacy_keywords("estimate_latency_ms", dict(tf32_conv=tf32_conv, tf32_matmul=tf32_matmul,
                                                         channels_last=channels_last, runtime=runtime, host=host,
                                                         input_copy=input_copy, execution=execution,
                                                         autocast=autocast))
    return _latency_parts(graph, device, params=params, deployment=deployment, **legacy)[8] / 1e3


def _gpu_parts(graph: OperatorGraph, facts: Any, dev: Device, autocast: str | None = None,
               math_float32: bool | None = None) -> Any:
    """:func:`~dippm_nas.prior._memory.gpu_memory_parts` of ``graph`` on ``dev``, once per graph (cached with
    the graph's facts, keyed by everything it reads besides the graph's structure: the device's context and
    cuBLAS workspace, the input spec, the autocast dtype, the graph's provenance, which the structural hash leaves
    out, and for a graph with an SDPA math path the version rule ``math_float32``). It depends on neither the
    prior's constants nor the runtime."""
    key = gpu_parts_key(graph, dev, autocast, math_float32)
    parts = facts.memory.get(key)
    if parts is None:
        mem = _liveness(graph, facts.memory, eager_kind(autocast, graph.provenance_digest(),
                                                        sdpa_math_mode(graph, math_float32)))
        parts = gpu_memory_parts(graph, mem, context_mib=dev.runtime_baseline_mib,
                                 cublas_workspace_mib=dev.cublas_workspace_mib, uses_cublas=facts.uses_cublas,
                                 uses_cudnn=uses_cudnn(graph, facts))
        facts.memory[key] = parts
    return parts


def gpu_parts_key(graph: OperatorGraph, dev: Device, autocast: str | None = None,
                  math_float32: bool | None = None) -> tuple[Any, ...]:
    """Where a graph's facts keep its GPU memory parts on ``dev`` under ``autocast`` (see :func:`_gpu_parts`)."""
    key = ("gpu_parts", float(dev.runtime_baseline_mib), float(dev.cublas_workspace_mib), graph.spec,
           graph.param_bytes, autocast, graph.provenance_digest())
    mode = sdpa_math_mode(graph, math_float32)
    return key if mode == "none" else (*key, mode)


def sdpa_math_mode(graph: OperatorGraph, math_float32: bool | None) -> str:
    """How the memory of ``graph``'s SDPA math path is priced: ``"none"`` (no node marked
    ``attrs["sdpa_math"]``), ``"unknown"`` (the PyTorch version is not known: at the graph's dtypes, autocast's
    plan under autocast), ``"float32"`` (PyTorch >= 2.5: half-precision inputs held in float32, the safe softmax's
    buffers) or ``"inputs"`` (up to 2.4: the inputs' dtype); :mod:`~dippm_nas.prior._math_path_memory`."""
    if not any(nd.attrs.get(SDPA_MATH_ATTR) for nd in graph.nodes):
        return "none"
    if math_float32 is None:
        return "unknown"
    return "float32" if math_float32 else "inputs"


def sdpa_math_details(graph: OperatorGraph, math_float32: bool | None) -> dict[str, float]:
    """The label of an SDPA math path's memory for :attr:`PriorEstimate.memory_details` (empty without one):
    ``sdpa_math_version_known`` (0: the PyTorch version is unknown, its memory at the graph's dtypes) and, when
    known, ``sdpa_math_float32`` (1: held in float32 from PyTorch 2.5, :func:`sdpa_math_mode`); ``sdpa_rank3_fused``
    (1) where calls on 3-D inputs run on the fused kernels (PyTorch >= 2.14,
    :func:`~dippm_nas.prior._sdpa_rank3.fused_rank3_graph` gave the graph), 0 where the version is known and older."""
    mode = sdpa_math_mode(graph, math_float32)
    fused = any(nd.attrs.get(SDPA_RANK_ATTR) == 3 and nd.op_class == "attention" for nd in graph.nodes)
    out = {"sdpa_rank3_fused": 1.0} if fused else {}
    if mode == "none":
        return out
    if mode == "unknown":
        return {**out, "sdpa_math_version_known": 0.0}
    if not fused and has_rank3_math_path(graph):
        out["sdpa_rank3_fused"] = 0.0
    return {**out, "sdpa_math_version_known": 1.0, "sdpa_math_float32": float(mode == "float32")}


def eager_kind(autocast: str | None, provenance: str | None = None, sdpa_math: str = "none") -> str:
    """The liveness kind of a GPU pass: ``"eager"``, or ``"eager:float16"`` / ``"eager:bfloat16"`` under autocast;
    ``"+provenance:<digest>"`` appended for a graph with provenance (its
    :meth:`~dippm_nas.graph.OperatorGraph.provenance_digest`: the provenance rules price it; graphs of the same
    structure share their facts, keyed by the structural hash, but not this pass unless their provenance is
    the same too); ``"+sdpa_math:float32"`` / ``"+sdpa_math:inputs"`` for an SDPA math path priced by a known
    PyTorch version (:func:`sdpa_math_mode`)."""
    kind = "eager" if autocast is None else f"eager:{autocast}"
    if provenance:
        kind = f"{kind}+provenance:{provenance}"
    return f"{kind}+sdpa_math:{sdpa_math}" if sdpa_math in ("float32", "inputs") else kind


def uses_cudnn(graph: OperatorGraph, facts: Any) -> bool:
    """The graph runs a convolution (cuDNN's workspace is held), counted once per graph's facts."""
    cudnn = facts.memory.get("uses_cudnn")
    if cudnn is None:
        cudnn = facts.memory["uses_cudnn"] = any(nd.op_class == "conv" and not nd.is_constant for nd in graph.nodes)
    return cudnn


def latency_sigma_log(est: PriorEstimate, params: PriorParams | None = None, *,
                      device: Device | None = None) -> float | None:
    """Log-space σ of the prior's GPU latency: the host model's held-out σ on the host part and its
    GPU-bound σ on the kernel part (of the dtype the kernels run in, :attr:`PriorEstimate.compute_dtype`: its own
    where measured, float64; on a GPU without efficiency multipliers of its own, the held-out rows of that
    precision and at least an unseen GPU's measured σ, :meth:`HostModel.sigma_log_gpu`),
    each weighted by how much the critical path moves with it; ``None`` on a CPU device or without a fitted
    host model (no measured error to give). ``device``: the estimate's device, when the caller holds it
    resolved."""
    p = params if params is not None else default_params()
    hm = p.host_model
    dev = _device_of(est, device)
    if hm is None or dev.kind != "gpu" or est.latency_ms <= 0:
        return None
    g, h, pre = est.node_time_ms * 1e3, est.node_host_ms * 1e3, est.pass_host_ms * 1e3
    base = _timelines(g, h, "gpu", pre)[0]
    if base <= 0:
        return None
    sh, sg = hm.sigma_log(), hm.sigma_log_gpu(est.compute_dtype, device_fitted=p.device_fitted(dev.id))
    d_h = math.log(_timelines(g, h * math.exp(sh), "gpu", pre * math.exp(sh))[0] / base)
    d_g = math.log(_timelines(g * math.exp(sg), h, "gpu", pre)[0] / base)
    return math.hypot(d_h, d_g)


def timeline_fields(est: PriorEstimate, device: Device | None = None) -> dict[str, Any]:
    """``host_ms`` and ``gpu_ms`` of a :class:`~dippm_nas.prediction.Prediction` from an estimate (``None``
    on a CPU device, where the host runs the kernels); ``device``: the estimate's, when the caller holds it."""
    gpu = _device_of(est, device).kind == "gpu"
    return {"host_ms": est.host_ms if gpu else None, "gpu_ms": est.gpu_busy_ms if gpu else None}


def _device_of(est: PriorEstimate, device: Device | None) -> Device:
    """The estimate's device: ``device`` when it is that one (resolved by the caller), else looked up."""
    return device if device is not None and device.id == est.device else resolve_device(est.device)


def _liveness(graph: OperatorGraph, cache: dict[str, MemoryBreakdown], kind: str) -> MemoryBreakdown:
    """The graph's liveness pass, once per graph and kind: ``"eager"`` (GPU: eager retention, the input
    apart), ``"eager:<dtype>"`` (the same under autocast to ``dtype``, :func:`eager_kind`) or ``"dataflow"``
    (CPU: freed at last use, the input included)."""
    if kind not in cache:
        if kind == "dataflow":
            cache[kind] = activation_liveness(graph)
        else:
            head, *tags = kind.split("+")
            ac = head.partition(":")[2] or None
            math = dict(t.partition(":")[::2] for t in tags).get("sdpa_math")
            cache[kind] = activation_liveness(graph, retention=True, include_inputs=False, autocast=ac,
                                              torch_version=_VERSION_OF_MODE.get(math))
    return cache[kind]
