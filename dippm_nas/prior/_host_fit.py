"""Fitting the host model on measured eager timings: :func:`fit_host_model`.

The GPU timeline of every row comes from the prior's roofline (its fitted GPU constants); the host timeline
is the unknown. The fit minimises a robust (soft-L1) loss of ``log(predicted / measured)`` over the rows with
five free constants on the reference host:

- ``base``: host time of an operator (every kind but views), µs;
- ``library``: extra host time of a library call (cuDNN convolution and batch norm, cuBLAS GEMM, attention), µs;
- ``view``: host time of a view, µs;

or, where the base model carries the framework time per operator kind measured on a CPU
(:attr:`HostModel.measured_op_us`, :attr:`HostModel.measured_module_us`:
``benchmarks/measurement/host_dispatch_kinds.py``), two (:data:`MEASURED_FIT_PARAMETERS`):

- ``host_scale``: reference-host µs per measured CPU µs: an operator of kind ``k`` costs
  ``host_scale · measured_op_us[k]`` plus its first kernel's launch (``launch_us``), plus
  ``host_scale · measured_module_us[k]`` where it is a module's call (:func:`~dippm_nas.prior.graph_facts`'
  ``module_call``); a view ``host_scale · measured_op_us["view"]``;
- ``library``: as above.

The input copy inside a timed region is not fitted: it comes from physics (:func:`~dippm_nas.prior.input_copy_us`:
the call, the bytes at the slower of the host's staging copy and the pinned link rate) and, for a batch the
process maps fresh (:attr:`HostRow.fresh_pages`), the measured first-touch time per page of the base model
(``h2d_fresh_page_us``, ``scripts/fit/fit_input_copy.py``).

A half-precision row on a GPU whose native FP16 rate is below its FP32 rate (Pascal's GP102: 1/64) is left out
(:attr:`HostRow.kernels_priced`, the count in ``metrics["rows_left_out_unpriced_half"]``): eager PyTorch runs its
depthwise convolutions in its own kernels there (cuDNN takes half-precision depthwise convolutions only from compute
capability 7.0, ``supportsDepthwiseConvolutionWithCuDNN``) in native half arithmetic, which the prior prices at the
native FP16 rate with an efficiency no measurement of such a kernel sets; so large a kernel time (a TITAN Xp's
float16 MnasNets and MobileNetV2 at 1.1-1.8x their float32 time), priced that loosely, would be read as host time.

A pass's fixed host time outside such a copy (``iteration_us``) is not identifiable from timings whose
timed region always holds a copy; it keeps the base model's value.

Each row's host times are scaled by its execution's host profile (speed, framework generation), so rows
from hosts of different clocks inform one set of constants.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dippm_nas.devices import resolve_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prior._deploy import DeploymentSettings, execution_settings
from dippm_nas.prior._estimate import _timelines, estimate
from dippm_nas.prior._host import HOST_KINDS, PAGE_BYTES, HostModel, input_copy_us
from dippm_nas.prior._nodes import graph_facts, node_costs
from dippm_nas.prior._params import PriorParams, default_params

__all__ = ["HostRow", "fit_host_model", "host_model_latency_ms", "FIT_PARAMETERS", "MEASURED_FIT_PARAMETERS"]

#: The constants :func:`fit_host_model` fits, in order.
FIT_PARAMETERS: tuple[str, ...] = ("base_us", "library_us", "view_us")
#: The constants it fits where the base model carries measured per-kind framework times, in order.
MEASURED_FIT_PARAMETERS: tuple[str, ...] = ("host_scale", "library_us")
_LIBRARY_KINDS = ("conv", "normalization", "matmul", "attention")


@dataclass(frozen=True)
class HostRow:
    """One measured eager pass: the graph, the device, how it was run and timed, and its latency.

    Attributes:
        graph: the captured graph.
        device: catalogue id of the GPU.
        execution: runtime (must be ``"eager"``), host profile, input copy (:func:`~dippm_nas.prior.row_settings`
            of a measured row; a deprecated :class:`~dippm_nas.prior.Execution` is converted by
            :func:`~dippm_nas.prior.execution_settings`).
        latency_ms: the measured latency of one pass, ms (> 0).
        fresh_pages: the copied batch is mapped fresh by the process (a DataLoader worker's batch in shared
            memory), so the copy touches each page first; ``False``: memory the process already touched.
    """

    graph: OperatorGraph
    device: str
    execution: DeploymentSettings
    latency_ms: float
    fresh_pages: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.execution, DeploymentSettings):
            object.__setattr__(self, "execution", execution_settings(self.execution))
        if self.execution.runtime != "eager":
            raise InvalidValueError(f"host rows must be eager timings, got runtime {self.execution.runtime!r}")
        if not (isinstance(self.latency_ms, (int, float)) and math.isfinite(self.latency_ms) and self.latency_ms > 0):
            raise InvalidValueError(f"HostRow.latency_ms must be a finite number > 0, got {self.latency_ms!r}")
        if not isinstance(self.fresh_pages, bool):
            raise InvalidValueError(f"HostRow.fresh_pages must be true or false, got {self.fresh_pages!r}")

    @property
    def kernels_priced(self) -> bool:
        """The prior prices this pass's kernels from measured efficiencies: ``False`` for a half-precision pass on
        a GPU whose native FP16 rate is below its FP32 rate (Pascal), whose native half kernels (depthwise
        convolutions outside cuDNN) are priced at that rate with an efficiency measured on other kernels;
        :func:`fit_host_model` leaves such rows out."""
        if self.graph.spec.dtype not in ("float16", "bfloat16"):
            return True
        dev = resolve_device(self.device)
        return dev.fp16_tflops is None or dev.fp16_tflops >= dev.fp32_tflops


@dataclass
class _Prepared:
    gpu_us: np.ndarray
    kind: np.ndarray       # host kind index per node, -1 for nodes without host time
    module: np.ndarray     # bool per node: issued through an nn.Module call
    extra_kernels: np.ndarray  # kernels beyond an operator's first (each costs a launch)
    input_bytes: float
    copy: bool
    fresh: bool            # the copied batch is mapped fresh
    link_gbps: float | None  # the GPU's host-link rate
    scale_no_gen: float    # 1 / speed of the row's host
    framework: str
    y_ms: float


def _prepare(rows: Sequence[HostRow], params: PriorParams) -> list[_Prepared]:
    out = []
    for r in rows:
        dev = resolve_device(r.device)
        if dev.kind != "gpu":
            raise InvalidValueError(f"host rows must be measured on a GPU, got device {dev.id!r} ({dev.kind})")
        f = graph_facts(r.graph)
        c = node_costs(r.graph, dev, params, host=r.execution.host)  # its framework: a GEMM bias a kernel or not
        issued = (f.active & ~f.fused & ~f.internal) | (f.view & ~f.inner_view)
        out.append(_Prepared(gpu_us=c.gpu_us, kind=np.where(issued, f.host_kind, -1),
                             module=issued & f.module_call & ~f.view,
                             extra_kernels=np.where(f.active, np.maximum(c.kernels - 1.0, 0.0), 0.0),
                             input_bytes=float(r.graph.spec.input_bytes), copy=r.execution.input_copy != "none",
                             fresh=bool(r.fresh_pages),
                             link_gbps=dev.pcie_gbps,
                             scale_no_gen=1.0 / r.execution.host.speed, framework=r.execution.host.framework,
                             y_ms=float(r.latency_ms)))
    return out


def _op_us(base: float, library: float, view: float) -> np.ndarray:
    v = np.full(len(HOST_KINDS), base)
    for k in _LIBRARY_KINDS:
        v[HOST_KINDS.index(k)] += library
    v[HOST_KINDS.index("view")] = view
    return v


def _measured(b: HostModel) -> bool:
    return bool(b.measured_op_us)


def _kind_us(x: np.ndarray, b: HostModel) -> tuple[np.ndarray, np.ndarray]:
    """(``op_us``, ``module_us``) per :data:`HOST_KINDS` of the fitted constants ``x`` (:data:`FIT_PARAMETERS`, or
    :data:`MEASURED_FIT_PARAMETERS` where ``b`` carries measured per-kind times)."""
    if not _measured(b):
        return _op_us(*x), np.zeros(len(HOST_KINDS))
    scale, library = x
    m = np.array([b.measured_op_us[k] for k in HOST_KINDS])
    v = scale * m + np.where(np.array(HOST_KINDS) == "view", 0.0, b.launch_us)
    for k in _LIBRARY_KINDS:
        v[HOST_KINDS.index(k)] += library
    return v, scale * np.array([b.measured_module_us.get(k, 0.0) for k in HOST_KINDS])


def _latency_ms(x: np.ndarray, p: _Prepared, generations: Mapping[str, float], b: HostModel) -> float:
    k = p.scale_no_gen * generations[p.framework]
    v, mod = _kind_us(x, b)
    kind = np.maximum(p.kind, 0)
    host = (np.where(p.kind >= 0, v[kind] + np.where(p.module, mod[kind], 0.0), 0.0)
            + p.extra_kernels * b.launch_us) * k
    copy = input_copy_us("pageable" if p.copy else "none", p.input_bytes, p.link_gbps,
                         pageable_fixed_us=b.h2d_fixed_us * k, pageable_gbps=b.h2d_gbps,
                         pinned_fixed_us=v[HOST_KINDS.index("memory")] * k,
                         fresh_page_us=b.h2d_fresh_page_us * k if p.fresh else 0.0)
    return _timelines(p.gpu_us, host, "gpu", b.iteration_us * k + copy)[0] / 1e3


def host_model_latency_ms(model: HostModel, rows: Sequence[HostRow], params: PriorParams | None = None) -> np.ndarray:
    """Predicted eager latency of each row with ``model`` (and the prior's GPU constants), ms; a row whose batch
    is mapped fresh (:attr:`HostRow.fresh_pages`) pays the first touch of its pages.

    Shapes:
        returns ``[len(rows)]`` float64.
    """
    p = params if params is not None else default_params()
    p = dataclasses.replace(p, host_model=model)
    out = []
    for r in rows:
        ms = estimate(r.graph, r.device, params=p, deployment=r.execution).latency_ms
        if r.fresh_pages and r.execution.input_copy != "none":  # the first touch of a freshly mapped batch: before any op
            pages = math.ceil(float(r.graph.spec.input_bytes) / PAGE_BYTES)
            ms += pages * model.h2d_fresh_page_us * model.scale(r.execution.host) / 1e3
        out.append(ms)
    return np.asarray(out, dtype=np.float64)


def fit_host_model(rows: Sequence[HostRow], *, params: PriorParams | None = None,
                   generations: Mapping[str, float] | None = None, base: HostModel | None = None,
                   source: str = "", command: str = "") -> HostModel:
    """Fit the eager host constants (:data:`FIT_PARAMETERS`, or :data:`MEASURED_FIT_PARAMETERS` where ``base``
    carries measured per-kind framework times) on measured rows.

    Args:
        rows: measured eager passes (at least as many as there are constants).
        params: the prior whose GPU constants give the kernel times (default: the shipped ones).
        generations: factor per framework generation (``{"torch-2": 1.0, "torch-1": f}``); the fitted
            constants are for ``"torch-2"``. Default: ``base``'s, else 1 for both.
        base: the model whose other constants (launch, CUDA-graph and compiled host times, the input copy's) are
            kept.
        source, command: recorded in the result.

    Rows whose kernels the prior does not price (:attr:`HostRow.kernels_priced`) are left out and counted.

    Returns:
        A :class:`HostModel` whose ``metrics`` hold the in-sample MAPE, the log-space residual σ and the
        fitted constants.

    Raises:
        DippmNasError: too few rows, a non-eager or non-GPU row, or a framework without a factor.
    """
    from scipy.optimize import least_squares

    p = params if params is not None else default_params()
    b = base if base is not None else (p.host_model or HostModel(op_us={k: 10.0 for k in HOST_KINDS}))
    names = MEASURED_FIT_PARAMETERS if _measured(b) else FIT_PARAMETERS
    if _measured(b) and set(b.measured_op_us) != set(HOST_KINDS):
        raise InvalidValueError(f"the base model's measured_op_us must have every kind {list(HOST_KINDS)}, got "
                                f"{sorted(b.measured_op_us)}")
    if len(rows) < len(names):
        raise InvalidValueError(f"fit_host_model needs at least {len(names)} rows, got {len(rows)}")
    gens = dict(generations if generations is not None else b.generations)
    priced = [r for r in rows if r.kernels_priced]
    if len(priced) < len(names):
        raise InvalidValueError(f"fit_host_model needs at least {len(names)} rows whose kernels the prior "
                                f"prices, got {len(priced)} of {len(rows)} (half-precision rows on a GPU with FP16 "
                                "below its FP32 rate are left out)")
    prepared = _prepare(priced, p)
    missing = sorted({q.framework for q in prepared} - set(gens))
    if missing:
        raise InvalidValueError(f"no generation factor for frameworks {missing}; given {sorted(gens)}")

    def resid(theta: np.ndarray) -> np.ndarray:
        x = np.exp(theta)
        return np.array([math.log(_latency_ms(x, q, gens, b)) - math.log(q.y_ms) for q in prepared])

    if _measured(b):
        theta0, lo, hi = np.log([3.0, 5.0]), np.log([0.01, 0.01]), np.log([100.0, 1000.0])
    else:
        theta0, lo, hi = np.log([15.0, 5.0, 3.0]), np.log([0.1, 0.01, 0.01]), np.log([1000.0, 1000.0, 200.0])
    fit = least_squares(resid, theta0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
    x = np.exp(fit.x)
    r = resid(fit.x)
    ape = np.abs(np.exp(r) - 1.0) * 100
    v, mod = _kind_us(x, b)
    op_us = dict(zip(HOST_KINDS, (float(u) for u in v)))
    module_us = {k: float(u) for k, u in zip(HOST_KINDS, mod) if u > 0}
    metrics: dict[str, Any] = {
        "rows": len(priced), "rows_left_out_unpriced_half": len(rows) - len(priced),
        "mape_pct_in_sample": float(ape.mean()), "median_ape_pct_in_sample": float(np.median(ape)),
        "sigma_log_in_sample": float(np.std(r)), "fitted": dict(zip(names, (float(u) for u in x))),
    }
    return dataclasses.replace(b, op_us=op_us, module_us=module_us, generations=gens,
                               source=source or b.source, command=command or b.command,
                               metrics={**dict(b.metrics), **metrics})
