"""The host side of a forward pass: per-operator host time by kind, per execution runtime.

A GPU runs a model's kernels only as fast as the host issues them. How the host issues them depends on
the **execution runtime** (:data:`RUNTIMES`):

- ``"eager"``: PyTorch eager mode. Every operator costs host time before its kernels can start (Python,
  module call, dispatcher, cuDNN/cuBLAS set-up, ``cudaLaunchKernel``): ``op_us[kind]`` per operator,
  ``module_us[kind]`` more where the operator is a module's call (:func:`module_call`), plus
  ``launch_us`` per extra kernel of an operator, plus ``iteration_us`` once per pass; when the timed region
  includes it, the input's host-to-device copy (:func:`input_copy_us`, from physics: one operator's call, the
  bytes at the board's PCIe rate from pinned memory, or at the slower of that rate and a host core's staging
  copy (``h2d_gbps``) from pageable memory, plus the first touch of each page of a freshly mapped batch
  (``h2d_fresh_page_us``); the host waits for it).
- ``"cuda-graphs"``: the same kernels replayed from one captured CUDA graph: one ``graph_launch_us`` per
  pass, no per-operator host time.
- ``"compiled"``: ``torch.compile`` (default mode): chains of element-wise, activation, normalisation and
  cast operators after a kernel become one generated kernel (convolutions and GEMMs stay library calls);
  each kernel costs ``compiled_kernel_us`` of host time, views none.

Host times are for the reference host (a 3.0 GHz server core running PyTorch 2.x) and are scaled by a
:class:`~dippm_nas.devices.HostProfile`: multiplied by ``generations[profile.framework]`` and divided by
``profile.speed``. The constants are fitted on measured eager timings (``scripts/fit/calibrate_host_model.py``;
the fit, its data and its error are recorded in the calibration file).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dippm_nas._deprecation import warn_deprecated
from dippm_nas._json import check_keys
from dippm_nas.deployment import row_deployment
from dippm_nas.devices import FRAMEWORKS, HostProfile, default_host_profile
from dippm_nas.errors import ExecutionRuntimeError, InvalidValueError

__all__ = ["RUNTIMES", "HOST_KINDS", "HostModel", "Execution", "host_kind", "module_call", "check_runtime",
           "compiled_groups",
           "input_copy_us", "PINNED_COPY_EFFICIENCY", "PAGEABLE_STAGING_GBPS", "PAGE_BYTES"]

#: The release that drops :class:`Execution`.
EXECUTION_REMOVED_IN = "0.2"
_EXECUTION_INSTEAD = ("describe how a pass runs with dippm_nas.prior.DeploymentSettings(runtime=..., host=..., "
                      "input_copy=...), a measured row's with dippm_nas.prior.row_settings(conditions, environment)")

#: Execution runtimes a prediction can be made for.
RUNTIMES: tuple[str, ...] = ("eager", "cuda-graphs", "compiled")

#: Kinds of operator with their own host time in eager mode.
HOST_KINDS: tuple[str, ...] = (
    "conv", "matmul", "attention", "elementwise", "normalization", "pool", "reduction", "memory", "view", "other",
)

#: Graph op class -> host kind.
_KIND_OF_CLASS: dict[str, str] = {
    "conv": "conv", "matmul": "matmul", "attention": "attention", "elementwise": "elementwise",
    "activation": "elementwise", "cast": "elementwise", "gather": "elementwise", "normalization": "normalization",
    "pool": "pool", "reduction": "reduction", "softmax": "reduction", "memory": "memory", "view": "view",
    "unknown": "other",
}

#: Graph op classes whose operator eager PyTorch issues through an ``nn.Module`` call (``nn.Conv2d``, the norms,
#: ``nn.ReLU`` / ``nn.GELU``, the pools); a matmul is one where it multiplies by a weight (``nn.Linear``). Element-wise
#: arithmetic, reductions, softmax, views and copies are the forward's functional calls.
_MODULE_CLASSES = frozenset({"conv", "normalization", "activation", "pool"})


def module_call(op_class: str, weight_input: bool) -> bool:
    """Whether eager PyTorch issues an operator of ``op_class`` through an ``nn.Module`` call: a convolution,
    normalisation, activation or pool, or a matmul with a weight input (``weight_input``: ``nn.Linear``)."""
    return op_class in _MODULE_CLASSES or (op_class == "matmul" and bool(weight_input))


def check_runtime(runtime: Any) -> str:
    """``runtime`` if it is one of :data:`RUNTIMES`, else :class:`~dippm_nas.errors.ExecutionRuntimeError`
    listing them."""
    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        raise ExecutionRuntimeError(f"runtime must be one of {RUNTIMES}, got {type(runtime).__name__} {runtime!r}")
    return str(runtime)


def host_kind(op_class: str) -> str:
    """The host kind of a graph op class (``"other"`` for classes without their own)."""
    return _KIND_OF_CLASS.get(op_class, "other")


@dataclass(frozen=True)
class HostModel:
    """Fitted host costs of PyTorch on the reference host (3.0 GHz server core, PyTorch 2.x), µs.

    Attributes:
        op_us: eager host time per operator, by :data:`HOST_KINDS` (dispatch, library set-up and the first
            kernel's launch).
        module_us: extra eager host time of an operator issued through an ``nn.Module`` call
            (:func:`module_call`), by :data:`HOST_KINDS` (a kind left out: 0).
        measured_op_us: framework time of one functional call per kind measured on a CPU
            (``benchmarks/measurement/host_dispatch_kinds.py``, µs on that CPU), the relative cost the fit scales
            (empty: not measured; the fit then fits one time for every kind but views).
        measured_module_us: the measured extra of a module call per kind on that CPU, µs.
        launch_us: host time of each further kernel an operator launches.
        iteration_us: fixed host time per forward pass (the Python call and the synchronisation).
        h2d_gbps: the rate a host core copies pageable memory into the driver's pinned staging buffer, GB/s
            (:data:`PAGEABLE_STAGING_GBPS`); a pageable copy runs at the slower of it and the pinned link rate.
        h2d_fixed_us: fixed host time of a pageable copy beyond the ``x.to("cuda")`` call, µs (0: none known).
        h2d_fresh_page_us: host time of the first touch of one page (:data:`PAGE_BYTES`) of a batch the process
            maps fresh for the copy (a DataLoader worker's batch in shared memory), µs on the reference host;
            measured on the released eager timings (``scripts/fit/fit_input_copy.py``), 0 when not measured.
        h2d_fresh_page_sigma_log: log-space σ of that time between hosts, measured leave one host out.
        graph_launch_us: host time to replay a captured CUDA graph (``"cuda-graphs"``).
        compiled_kernel_us: host time per kernel of a ``torch.compile`` graph (``"compiled"``).
        generations: multiplier of every host time per framework generation (``"torch-2"`` is 1).
        source: the measurements the constants were fitted on.
        command: the command that fitted them.
        metrics: the fit's figures (MAPE, the log-space σ of host-bound rows...).
    """

    op_us: Mapping[str, float]
    module_us: Mapping[str, float] = field(default_factory=dict)
    measured_op_us: Mapping[str, float] = field(default_factory=dict)
    measured_module_us: Mapping[str, float] = field(default_factory=dict)
    launch_us: float = 3.0
    iteration_us: float = 10.0
    h2d_gbps: float = 8.0
    h2d_fixed_us: float = 0.0
    h2d_fresh_page_us: float = 0.0
    h2d_fresh_page_sigma_log: float = 0.0
    graph_launch_us: float = 10.0
    compiled_kernel_us: float = 5.0
    generations: Mapping[str, float] = field(default_factory=lambda: {"torch-2": 1.0, "torch-1": 1.0})
    source: str = ""
    command: str = ""
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.op_us, Mapping):
            raise InvalidValueError(f"HostModel.op_us must be a mapping of {list(HOST_KINDS)} to µs, "
                                    f"got {self.op_us!r:.80}")
        missing = [k for k in HOST_KINDS if k not in self.op_us]
        extra = [k for k in self.op_us if k not in HOST_KINDS]
        if missing or extra:
            raise InvalidValueError(f"HostModel.op_us must have exactly the kinds {list(HOST_KINDS)}; "
                                    f"missing {missing}, unknown {extra}")
        for k, v in self.op_us.items():
            if not _finite(v) or not 0 <= v <= 10_000:
                raise InvalidValueError(f"HostModel.op_us[{k!r}] must be in [0, 10000] µs, got {v!r}")
        for name in ("module_us", "measured_op_us", "measured_module_us"):
            object.__setattr__(self, name, _kind_map(getattr(self, name), f"HostModel.{name}"))
        for name in ("launch_us", "iteration_us", "h2d_fixed_us", "graph_launch_us", "compiled_kernel_us"):
            v = getattr(self, name)
            if not _finite(v) or not 0 <= v <= 100_000:
                raise InvalidValueError(f"HostModel.{name} must be in [0, 100000] µs, got {v!r}")
        if not _finite(self.h2d_gbps) or self.h2d_gbps <= 0:
            raise InvalidValueError(f"HostModel.h2d_gbps must be a positive number, got {self.h2d_gbps!r}")
        for name in ("h2d_fresh_page_us", "h2d_fresh_page_sigma_log"):
            v = getattr(self, name)
            if not _finite(v) or not 0 <= v <= 1000:
                raise InvalidValueError(f"HostModel.{name} must be in [0, 1000], got {v!r}")
        bad = sorted(set(self.generations) - set(FRAMEWORKS))
        if bad or "torch-2" not in self.generations:
            raise InvalidValueError(f"HostModel.generations must map {list(FRAMEWORKS)} (torch-2 required) to factors, "
                                    f"got {dict(self.generations)!r}")
        for k, v in self.generations.items():
            if not _finite(v) or not 0.05 <= v <= 20:
                raise InvalidValueError(f"HostModel.generations[{k!r}] must be in [0.05, 20], got {v!r}")
        object.__setattr__(self, "op_us", {k: float(self.op_us[k]) for k in HOST_KINDS})
        object.__setattr__(self, "generations", {k: float(v) for k, v in self.generations.items()})
        object.__setattr__(self, "metrics", dict(self.metrics))

    def scale(self, profile: HostProfile) -> float:
        """The factor every reference host time is multiplied by on ``profile``'s host."""
        gen = self.generations.get(profile.framework)
        if gen is None:
            raise InvalidValueError(f"the host model has no factor for framework {profile.framework!r}; "
                                    f"it knows {sorted(self.generations)}")
        return gen / profile.speed

    def sigma_log(self) -> float:
        """Log-space σ of a host-bound latency from the fit's held-out error (0 when not recorded)."""
        v = self.metrics.get("sigma_log_host")
        return float(v) if _finite(v) and v > 0 else 0.0

    def sigma_log_gpu(self, dtype: str | None = None, *, device_fitted: bool = True) -> float:
        """Log-space σ of the prior's kernel times, from the fit's held-out GPU-bound rows (0 when not
        recorded); for a ``dtype`` with its own measured error (``metrics["sigma_log_gpu_bound_<dtype>"]``,
        e.g. float64, which no constant is fitted on), that one.

        ``device_fitted=False`` (a GPU whose efficiency multipliers were not fitted on its own measurements,
        which gets the default entry of :attr:`~dippm_nas.prior.PriorParams.device_scales`): the held-out
        GPU-bound rows of ``dtype`` alone where the fit recorded them (``metrics["sigma_log_gpu_unseen_<dtype>"]``,
        float16 and float32: the fit's held-out GPUs have no multipliers of their own, and half-precision kernels
        of an unseen GPU, on tensor cores of one rate or another or in FP32 math, miss further than its float32
        ones), and at least the measured error of an unseen GPU's efficiency, ``metrics["sigma_log_gpu_unseen"]``
        (leave-one-GPU-out over the GPUs with fitted multipliers; ``metrics["fit_gpu_unseen"]`` says on which
        rows and by which command), where recorded."""
        own = self.metrics.get(f"sigma_log_gpu_bound_{dtype}") if dtype else None
        v = own if _finite(own) and own > 0 else self.metrics.get("sigma_log_gpu_bound")
        sigma = float(v) if _finite(v) and v > 0 else 0.0
        per_dtype = self.metrics.get(f"sigma_log_gpu_unseen_{dtype}") if dtype else None
        if not device_fitted and _finite(per_dtype) and per_dtype > 0:
            sigma = float(per_dtype)  # the same held-out rows as sigma_log_gpu_bound, this precision's only
        unseen = self.metrics.get("sigma_log_gpu_unseen")
        if not device_fitted and _finite(unseen) and unseen > sigma:
            sigma = float(unseen)
        return sigma

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "<dict>") -> "HostModel":
        """Inverse of :meth:`to_dict`.

        Raises:
            DippmNasError: unknown keys or values breaking a rule.
        """
        if not isinstance(d, Mapping):
            raise InvalidValueError(f"{origin}: host_model must be an object, got {type(d).__name__}")
        check_keys(d, cls.__dataclass_fields__, f"{origin}: host_model", required=("op_us",))
        return cls(**dict(d))


#: Share of the host link's data rate (:attr:`~dippm_nas.devices.Device.pcie_gbps`) a host-to-device copy from
#: pinned memory reaches: PCIe packet and flow-control overhead at a 256-byte maximum payload; NVIDIA's
#: ``bandwidthTest`` (CUDA samples, pinned) reads about 12-13 GB/s on PCIe 3.0 x16 (15.75 GB/s) and 24-26 GB/s
#: on PCIe 4.0 x16 (31.5 GB/s) in public transcripts.
PINNED_COPY_EFFICIENCY = 0.80
#: The rate one host core copies pageable memory into the CUDA driver's pinned staging buffer, GB/s: a core keeps
#: about 10 cache-line misses in flight (the L1D fill buffers of the Intel 64 and IA-32 Architectures
#: Optimization Reference Manual), so Little's law with 64-byte lines and ~80 ns DRAM latency gives
#: 10 x 64 B / 80 ns = 8 GB/s. The driver overlaps staging with the DMA of earlier chunks, so a pageable copy runs
#: at the slower of this and the pinned link rate (which is why pageable copies gain little from PCIe 4.0).
PAGEABLE_STAGING_GBPS = 8.0
#: Bytes of a page whose first touch the host pays for in a freshly mapped batch (an x86-64 base page).
PAGE_BYTES = 4096


def input_copy_us(kind: str, nbytes: float, link_gbps: float | None, *, pageable_fixed_us: float,
                  pageable_gbps: float, pinned_fixed_us: float, fresh_page_us: float = 0.0) -> float:
    """Host time of the input's host-to-device copy inside the timed region, µs (the host waits for it).

    - ``"pinned"``: ``pinned_fixed_us`` (the ``x.to("cuda")`` call) plus the bytes at
      :data:`PINNED_COPY_EFFICIENCY` of the link's rate;
    - ``"pageable"``: the same call plus ``pageable_fixed_us``, the bytes at the slower of the host's staging
      copy (``pageable_gbps``) and the pinned link rate, and ``fresh_page_us`` for each :data:`PAGE_BYTES` page
      when the batch is mapped fresh (0 for memory the process already touched);
    - ``"none"``: 0.

    Args:
        kind: ``"none"``, ``"pageable"`` or ``"pinned"``.
        nbytes: bytes of one batch of inputs.
        link_gbps: the board's host-link rate in one direction, GB/s; ``None`` (unknown): the staging rate
            bounds both.
        pageable_fixed_us, pageable_gbps: the pageable path's extra fixed time and staging rate (the fixed time
            scaled to the host by the caller).
        pinned_fixed_us: the call's host time (scaled to the host by the caller).
        fresh_page_us: host time per page of a freshly mapped batch (scaled to the host by the caller).
    """
    if kind == "none":
        return 0.0
    pinned_gbps = link_gbps * PINNED_COPY_EFFICIENCY if link_gbps else pageable_gbps
    if kind == "pinned":
        return pinned_fixed_us + nbytes / (pinned_gbps * 1e3)
    pages = math.ceil(nbytes / PAGE_BYTES)
    return (pinned_fixed_us + pageable_fixed_us + nbytes / (min(pageable_gbps, pinned_gbps) * 1e3)
            + pages * fresh_page_us)


def _kind_map(m: Any, what: str) -> dict[str, float]:
    """``m`` as a dict of :data:`HOST_KINDS` to µs in [0, 10000], else :class:`InvalidValueError`."""
    if not isinstance(m, Mapping):
        raise InvalidValueError(f"{what} must be a mapping of {list(HOST_KINDS)} to µs, got {m!r:.80}")
    extra = [k for k in m if k not in HOST_KINDS]
    if extra:
        raise InvalidValueError(f"{what} has unknown kinds {extra}; the kinds are {list(HOST_KINDS)}")
    for k, v in m.items():
        if not _finite(v) or not 0 <= v <= 10_000:
            raise InvalidValueError(f"{what}[{k!r}] must be in [0, 10000] µs, got {v!r}")
    return {k: float(m[k]) for k in HOST_KINDS if k in m}


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def compiled_groups(classes: "list[str] | tuple[str, ...]", preds: list[list[int]], active: np.ndarray) -> np.ndarray:
    """Kernel group of each active node under ``torch.compile``: an element-wise, activation,
    normalisation or cast node whose latest active producer is such a node of a group joins that group;
    every other active node starts one. ``-1`` for inactive nodes.

    Shapes:
        ``active``: ``[num_nodes]`` bool; returns ``[num_nodes]`` int64.
    """
    fusable = {"elementwise", "activation", "normalization", "cast"}
    n = len(classes)
    group = np.full(n, -1, dtype=np.int64)
    fusable_group = np.zeros(n, dtype=bool)  # a group of fusable nodes (a generated pointwise kernel)
    last_active = np.full(n, -1, dtype=np.int64)  # for inactive nodes: the active node their value comes from
    g = 0
    for i in range(n):
        src = [last_active[p] if not active[p] else p for p in preds[i]]
        src = [s for s in src if s >= 0]
        if not active[i]:
            last_active[i] = max(src) if src else -1
            continue
        producer = max(src) if src else -1
        if classes[i] in fusable and producer >= 0 and fusable_group[group[producer]]:
            group[i] = group[producer]
        else:
            group[i] = g
            fusable_group[g] = classes[i] in fusable
            g += 1
    return group


@dataclass(frozen=True)
class Execution:
    """How a forward pass is executed and timed: the runtime, the host that drives the GPU, and whether
    the timed region includes the input's host-to-device copy.

    Deprecated (a :class:`DeprecationWarning`; removed in dippm-nas 0.2): describe how a pass runs with
    :class:`~dippm_nas.prior.DeploymentSettings` (``DeploymentSettings(runtime=..., host=..., input_copy=...)``), a
    measured row's with :func:`~dippm_nas.prior.row_settings`.

    Attributes:
        runtime: one of :data:`RUNTIMES`.
        host: the host profile.
        input_copy: the timed region includes the input's host-to-device copy.
    """

    runtime: str = "eager"
    host: HostProfile = field(default_factory=default_host_profile)
    input_copy: bool = False

    def __post_init__(self) -> None:
        warn_deprecated("dippm_nas.prior.Execution", _EXECUTION_INSTEAD, removed_in=EXECUTION_REMOVED_IN, stacklevel=4)
        check_runtime(self.runtime)
        if not isinstance(self.host, HostProfile):
            raise InvalidValueError(f"Execution.host must be a HostProfile, got {type(self.host).__name__}")
        if not isinstance(self.input_copy, bool):
            raise InvalidValueError(f"Execution.input_copy must be true or false, got {self.input_copy!r}")

    @property
    def key(self) -> str:
        """A short string naming this execution (cache keys)."""
        h = self.host
        return f"{self.runtime}|{h.name}|{h.speed:.6g}|{h.framework}|{int(self.input_copy)}"

    @classmethod
    def from_conditions(cls, conditions: Mapping[str, Any] | None,
                        environment: Mapping[str, Any] | None = None) -> "Execution":
        """The execution a dataset row's measurement was made under: the runtime, host and input copy of the row's
        :func:`~dippm_nas.deployment.row_deployment` (the one mapping of a row's recorded conditions; a copy from
        pinned or pageable memory is a copy), a host the row does not record taking the default host profile with
        the row's framework (else the profile's own).
        """
        warn_deprecated("dippm_nas.prior.Execution.from_conditions", "use dippm_nas.prior.row_settings(conditions, "
                        "environment)", removed_in=EXECUTION_REMOVED_IN, stacklevel=3)
        dep = row_deployment(conditions, environment)
        base = default_host_profile()
        host = dep.host if isinstance(dep.host, HostProfile) else dataclasses.replace(
            base, framework=dep.framework or base.framework)
        with warnings.catch_warnings():  # warned above, at the caller
            warnings.simplefilter("ignore", DeprecationWarning)
            return cls(runtime=dep.runtime, host=host, input_copy=dep.input_copy not in (None, "none"))
