"""The analytic prior: latency along two timelines, energy from utilisation, memory from liveness.

Latency. PyTorch eager issues the operators one by one from the host; each costs a dispatch (and a
launch per kernel) on the host timeline, and its kernels run in order on one GPU stream:

    host_end[i]  = host_end[i-1] + host_us[i]
    gpu_start[i] = max(gpu_end[i-1], host_end[i])
    gpu_end[i]   = gpu_start[i] + gpu_us[i]

The forward pass ends with the last kernel: ``latency = gpu_end[-1]`` (the critical path through both
timelines). It equals the device's busy time plus the idle time the host causes: small batches are
launch-bound (``host_ms > gpu_busy_ms``). On a CPU device the host runs the kernels itself, so the times add.

Energy. Power integrated over the same timeline (:mod:`dippm_nas.prior._power`): while node ``i`` runs,
idle power plus shares of the board's range for the busy SMs, the tensor-core and CUDA-core FLOP rates and
the DRAM traffic of the node, capped at board power; while the GPU waits for the host, a waiting share.
The shares are fitted per architecture on measured whole-GPU energy (``calibration/power.json``).

Memory. ``runtime baseline + weights + activation peak (liveness) + workspace``, with the caching
allocator's rounding reported apart (``allocator_overhead_mib``: reserved minus allocated).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas.devices import Device, resolve_device
from dippm_nas.errors import DeviceError, GraphValidationError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.prior._memory import K_LARGE_BUFFER, K_MIN_LARGE_ALLOC, K_ROUND_LARGE, MIB, activation_liveness
from dippm_nas.prior._nodes import graph_facts, node_costs
from dippm_nas.prior._params import PriorParams, default_params
from dippm_nas.prior._power import PowerTable, node_activity, pass_energy_j, power_params_for

__all__ = ["PriorEstimate", "estimate", "predict"]

logger = logging.getLogger(__name__)

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
        baseline_mib, weights_mib, activations_peak_mib, workspace_mib, allocator_overhead_mib: memory
            parts, MiB; ``memory_mib`` is their sum.
        peak_node: node index where activations peak.
        tensor_core_fraction: share of kernel time on tensor cores.
        params_source: where the prior's constants come from.
        unknown_ops: ``{op: count}`` of nodes without a formula (generic estimates).
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
    energy_j_std: float | None = None
    energy_source: str = "unavailable"

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
            "baseline_mib": self.baseline_mib, "weights_mib": self.weights_mib,
            "activations_peak_mib": self.activations_peak_mib, "workspace_mib": self.workspace_mib,
            "allocator_overhead_mib": self.allocator_overhead_mib,
            "tensor_core_fraction": self.tensor_core_fraction,
            "launch_bound": float(self.launch_bound),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (arrays as lists)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("node_time_ms", "node_host_ms", "node_utilisation"):
            d[k] = [float(x) for x in d[k]]
        d["gpu_idle_ms"] = self.gpu_idle_ms
        d["launch_bound"] = self.launch_bound
        return d


def _timelines(gpu_us: np.ndarray, host_us: np.ndarray, kind: str) -> tuple[float, float]:
    """(latency µs, host µs) along the host and GPU-stream timelines."""
    if kind != "gpu":
        total = float(gpu_us.sum() + host_us.sum())
        return total, float(host_us.sum())
    if len(host_us) == 0:
        return 0.0, 0.0
    host_end = np.cumsum(host_us)
    idx = np.flatnonzero(gpu_us > 0)
    if len(idx) == 0:
        return float(host_end[-1]), float(host_end[-1])
    # gpu_end[j] = max(gpu_end[j-1], host_end[i_j]) + g[i_j]  ==  max over k <= j of (host_end[i_k] + sum g[i_k..i_j])
    g = gpu_us[idx]
    cg = np.cumsum(g)
    start_term = host_end[idx] - (cg - g)   # host_end[i_k] - sum of g before k
    gpu_end = float(start_term.max() + cg[-1])
    return max(gpu_end, float(host_end[-1])), float(host_end[-1])


def estimate(
    graph: OperatorGraph, device: Device | str, *, tf32_conv: bool = True, tf32_matmul: bool = False,
    channels_last: bool = False, params: PriorParams | None = None, power: PowerTable | None = None,
) -> PriorEstimate:
    """Analytic latency, energy and memory of one forward pass of ``graph`` on ``device``.

    Args:
        graph: a captured model (validated here).
        device: a :class:`~dippm_nas.devices.Device` or a catalogue id.
        tf32_conv: FP32 convolutions may use TF32 tensor cores (PyTorch's default, True).
        tf32_matmul: FP32 matmuls may use TF32 (PyTorch's default, False).
        channels_last: activations are NHWC in memory (``model.to(memory_format=torch.channels_last)``);
            PyTorch's default is NCHW (False).
        params: the prior's constants; default: the shipped fitted ones.
        power: the power model's constants per architecture; default: the shipped ones (``power.json``).

    Raises:
        DeviceError: unknown device id (the choices are listed).
        UnsupportedDtypeError: the device has no peak for the graph's dtype.
        GraphValidationError: a malformed graph.
    """
    dev = resolve_device(device)
    if not isinstance(graph, OperatorGraph):
        raise GraphValidationError(f"graph must be an OperatorGraph (see dippm_nas.capture), got {type(graph).__name__}")
    facts = graph_facts(graph)  # validates the graph on first sight
    dev.check_dtype(graph.spec.dtype)
    for dt in sorted(facts.dtypes):
        dev.check_dtype(dt)
    p = params if params is not None else default_params()

    costs = node_costs(graph, dev, p, tf32_conv=tf32_conv, tf32_matmul=tf32_matmul, channels_last=channels_last)
    table = p.op_tables.get(dev.id) if dev.kind != "gpu" else None
    if table is not None:  # operators timed in place on this machine, instead of the roofline
        comp_us, over_us, uncovered = table.node_us(graph)
        costs = dataclasses.replace(costs, gpu_us=np.where(uncovered, costs.gpu_us, comp_us),
                                    host_us=np.where(uncovered, costs.host_us, over_us))
    latency_us, host_total_us = _timelines(costs.gpu_us, costs.host_us, dev.kind)
    busy_us = float(costs.gpu_us.sum())
    if dev.kind != "gpu":
        busy_us = latency_us

    energy: float | None = None
    energy_std: float | None = None
    energy_source = "unavailable"
    if dev.has_power:
        pw = power_params_for(dev, power)
        activity = node_activity(facts.flops, facts.bytes, costs.gpu_us, costs.tensor_core,
                                 (facts.dtype == 1) | (facts.dtype == 2), dev)
        energy = pass_energy_j(pw, dev, costs.gpu_us, activity, latency_us)
        energy_std, energy_source = energy * pw.sigma_log, ("predicted" if pw.fitted else "analytic")

    if facts.memory is None:
        facts.memory = activation_liveness(graph)
    mem = facts.memory
    weights_b = float(graph.param_bytes)
    uses_cublas = dev.kind == "gpu" and facts.uses_cublas
    workspace_b = dev.cublas_workspace_mib * MIB if uses_cublas else 0.0
    allocated = weights_b + mem.peak_allocated_bytes + workspace_b
    if dev.kind == "gpu":
        reserved = (_ceil(weights_b, K_ROUND_LARGE) + mem.peak_reserved_bytes
                    + (_ceil(workspace_b, K_LARGE_BUFFER) if 0 < workspace_b < K_MIN_LARGE_ALLOC
                       else _ceil(workspace_b, K_ROUND_LARGE)))
    else:
        reserved = allocated
    overhead_b = max(0.0, reserved - allocated)
    baseline = dev.runtime_baseline_mib
    total_mib = baseline + (allocated + overhead_b) / MIB

    tc = float(costs.gpu_us[costs.tensor_core].sum())
    return PriorEstimate(
        device=dev.id, batch_size=graph.spec.batch_size, dtype=graph.spec.dtype,
        node_time_ms=costs.gpu_us / 1e3, node_host_ms=costs.host_us / 1e3,
        node_utilisation=costs.utilisation,
        latency_ms=latency_us / 1e3, host_ms=host_total_us / 1e3, gpu_busy_ms=busy_us / 1e3,
        energy_j=energy,
        baseline_mib=baseline, weights_mib=weights_b / MIB, activations_peak_mib=mem.peak_allocated_bytes / MIB,
        workspace_mib=workspace_b / MIB, allocator_overhead_mib=overhead_b / MIB, memory_mib=total_mib,
        peak_node=mem.peak_node, tensor_core_fraction=tc / busy_us if busy_us > 0 else 0.0,
        params_source=p.source, unknown_ops=graph.unknown_ops, energy_j_std=energy_std, energy_source=energy_source,
    )


def _ceil(x: float, unit: int) -> float:
    return unit * math.ceil(x / unit) if x > 0 else 0.0


def predict(
    graph: OperatorGraph, device: Device | str, *, mig: bool = True, k_sigma: float = 2.0,
    tf32_conv: bool = True, tf32_matmul: bool = False, channels_last: bool = False,
    params: PriorParams | None = None, power: PowerTable | None = None,
) -> Prediction:
    """The analytic prior as a :class:`~dippm_nas.prediction.Prediction` (sources ``"analytic"``; energy
    ``"predicted"`` where the power model is fitted for the device's architecture).

    Args:
        graph, device, tf32_conv, tf32_matmul, channels_last, params, power: as for :func:`estimate`.
        mig: attach the MIG advisor's answer (devices with MIG only; see :func:`dippm_nas.mig.advise`).
        k_sigma: passed to the advisor.

    Raises:
        DeviceError: the device has no power figures, so no energy can be given (e.g. ``host-cpu``;
            use :func:`estimate`, whose ``energy_j`` is then ``None``), or an unknown device id.
        UnsupportedDtypeError, GraphValidationError: as for :func:`estimate`.
    """
    dev = resolve_device(device)
    est = estimate(graph, dev, tf32_conv=tf32_conv, tf32_matmul=tf32_matmul, channels_last=channels_last, params=params,
                   power=power)
    if est.energy_j is None:
        raise DeviceError(
            f"device {dev.id!r} has no power figures (board_power_w, idle_power_w), so the prior gives no "
            "energy and cannot fill a Prediction; use dippm_nas.prior.estimate() for latency and memory, or "
            "register a device file with power figures under $DIPPM_NAS_DEVICE_DIR"
        )
    details = est.details()
    details["params_fitted"] = float(est.params_source != "uncalibrated")
    pred = Prediction(
        latency_ms=est.latency_ms, energy_j=est.energy_j, memory_mib=est.memory_mib,
        latency_source="analytic", energy_source=est.energy_source, memory_source="analytic",  # type: ignore[arg-type]
        energy_j_std=est.energy_j_std,
        device=dev.id, batch_size=est.batch_size, dtype=est.dtype, unknown_ops=dict(est.unknown_ops),
        details=details,
    )
    if mig and dev.has_mig:
        from dippm_nas.mig import advise

        advice = advise(pred, dev, graph=graph, k_sigma=k_sigma, tf32_conv=tf32_conv, tf32_matmul=tf32_matmul,
                        channels_last=channels_last, params=params)
        pred = dataclasses.replace(pred, mig=advice)
    return pred
