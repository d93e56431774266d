"""σ for what a deployment does not describe: :func:`deployment_spread`.

A prediction whose deployment leaves the host, the framework generation, the TF32 flags or the input copy
undescribed is a prediction for any server that could run it. The latency is evaluated along the host and GPU
timelines (:func:`~dippm_nas.prior.latency_us`) at the quantiles of what real GPU servers run, and the
mixture's log-mean and log-spread become the prediction's centre and its deployment σ:

- **host** (undescribed): the single-thread speed of the CPU that dispatches the operators, log-normal over
  clocks around :data:`~dippm_nas.prior.UNKNOWN_HOST` (the most common A100 server) with σ
  :data:`~dippm_nas.prior.UNKNOWN_HOST_SIGMA_LOG`; evaluated at the three Gauss-Hermite nodes of the log-normal
  (exact for its first five moments);
- **framework** (undescribed): PyTorch 1.x and 2.x with equal weight (both run on A100 servers; no public
  survey weighs them), each with its host-model generation factor and, where the TF32 flags are not described
  either, its TF32 defaults (1.7-1.11: matmuls and convolutions on TF32; >= 1.12: convolutions only), which move
  float32 graphs;
- **input copy** (undescribed): none, pageable, pinned with weights
  :data:`~dippm_nas.prior.UNKNOWN_INPUT_COPY_WEIGHTS`;
- **autocast** (undescribed) of a float16 / bfloat16 graph: the model in the graph's dtype (``model.half()``)
  and ``torch.autocast`` at that dtype, with weights :data:`~dippm_nas.prior.UNKNOWN_AUTOCAST_WEIGHTS` (a
  float32 graph runs without autocast: nothing to span);
- **a pageable copy's batch** (described or not): memory the process already touched, or a batch mapped fresh
  whose pages the copy touches first (a DataLoader worker's), with weight
  :data:`~dippm_nas.prior.PAGEABLE_FRESH_WEIGHT`, the first-touch time per page log-normal around the measured
  ``HostModel.h2d_fresh_page_us`` with its leave-one-host-out σ (three Gauss-Hermite nodes).

Host times are linear in the host's speed factor for every runtime (per-operator dispatch, graph replay,
compiled launches, the fixed parts of the copy), so a scenario re-scales the host timeline; only a TF32
or autocast variant re-prices kernels. A described setting contributes nothing but a pageable copy's batch: with everything
described and no pageable copy the spread is 0 and the prediction's σ is the model's own.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dippm_nas.devices import Device, HostProfile, resolve_device
from dippm_nas.graph import OperatorGraph
from dippm_nas.deployment import AUTOCAST_DTYPES
from dippm_nas.prior._deploy import (PAGEABLE_FRESH_WEIGHT, UNKNOWN_AUTOCAST_WEIGHTS, UNKNOWN_FRAMEWORK_WEIGHTS,
                                     UNKNOWN_HOST_SIGMA_LOG, UNKNOWN_INPUT_COPY_WEIGHTS, deployment_settings)
from dippm_nas.prior._estimate import _latency_parts, _pass_host_us, _timelines, resolved_settings
from dippm_nas.prior._params import PriorParams, default_params
from dippm_nas.prior._stack import CostStack, Timelines

__all__ = ["DeploymentSpread", "deployment_spread", "deployment_spread_many", "described_offset_log"]

#: Gauss-Hermite nodes (in σ) and weights of a normal distribution, three points.
_GH_NODES = ((-math.sqrt(3.0), 1.0 / 6.0), (0.0, 2.0 / 3.0), (math.sqrt(3.0), 1.0 / 6.0))
#: TF32 defaults ``(matmul, conv)`` by framework generation (see :func:`dippm_nas.deployment.tf32_defaults`).
_TF32_OF = {"torch-1": (True, True), "torch-2": (False, True)}


@dataclass(frozen=True)
class DeploymentSpread:
    """The latency of a partly described deployment as a mixture over what it leaves open.

    Attributes:
        offset_log: log of the mixture's geometric-mean latency over the latency of the centre settings
            (:func:`~dippm_nas.prior.deployment_settings`); 0 when everything is described.
        sigma_log: log-space standard deviation of the mixture; 0 when everything is described.
        scenarios: timelines evaluated.
        gpu_offset_log: log of the mixture's geometric-mean GPU busy time (the kernels' sum) over the centre
            settings'; it moves only with the settings that re-price kernels (TF32 of an undescribed framework,
            an undescribed autocast), and sets the centre of a prediction's ``gpu_ms``.
        autocast_open: the mixture spans the graph's forms under an undescribed autocast (a float16 / bfloat16
            graph: ``model.half()`` and ``torch.autocast``); ``False`` for a float32 graph, whose undescribed
            autocast is none.
    """

    offset_log: float = 0.0
    sigma_log: float = 0.0
    scenarios: int = 1
    gpu_offset_log: float = 0.0
    autocast_open: bool = False


def described_offset_log(settings: Any, spread: DeploymentSpread) -> float:
    """The part of ``spread``'s centre offset that a calibration keeps: all of it when the deployment is described
    (its spread is then only the pageable copy's fresh-page mixture, physics of each row's input bytes that one
    host and one GPU factor cannot absorb), none when something is undescribed (measured rows resolve it). An
    undescribed autocast counts only where the mixture spans it (:attr:`DeploymentSpread.autocast_open`)."""
    open_ = [a for a in getattr(settings, "assumed", ()) if a != "autocast" or spread.autocast_open]
    return spread.offset_log if not open_ else 0.0


def deployment_spread(graph: OperatorGraph, device: Device | str, deployment: Any, *,
                      params: PriorParams | None = None, gpu_factor: float = 1.0) -> DeploymentSpread:
    """Centre offset and σ of the latency over the settings ``deployment`` leaves undescribed.

    Args:
        graph: the captured graph.
        device: a GPU (a CPU device has no deployment spread: ``DeploymentSpread()``).
        deployment: a :class:`~dippm_nas.Deployment`, its resolved form or its :class:`DeploymentSettings`.
        params: the prior's constants (default: the shipped ones).
        gpu_factor: a correction of the kernel times (a checkpoint's), applied in every scenario.

    Shapes:
        the scenarios' timelines are ``[num_nodes]`` arrays of the graph.
    """
    s = deployment_settings(deployment)
    dev = resolve_device(device)
    if dev.kind != "gpu" or not s.spread_open:
        return DeploymentSpread()
    p = params if params is not None else default_params()
    hm = p.host_model
    fp32 = graph.spec.dtype == "float32" and s.autocast is None
    autocasts = _autocasts(s, graph.spec.dtype)
    ref = dataclasses.replace(s.host, speed=1.0, framework="torch-2")  # host times at factor 1, rescaled below
    kernels: dict[tuple[tuple[bool, bool], str | None], tuple[np.ndarray, np.ndarray]] = {}

    def parts(tf32: tuple[bool, bool], autocast: str | None) -> tuple[np.ndarray, np.ndarray]:
        if (tf32, autocast) not in kernels:
            v = dataclasses.replace(s, tf32_matmul=tf32[0], tf32_conv=tf32[1], autocast=autocast, host=ref)
            costs = _latency_parts(graph, dev, tf32_conv=v.tf32_conv, tf32_matmul=v.tf32_matmul,
                                   channels_last=False, params=p, runtime="eager", host=None, input_copy=False,
                                   execution=None, deployment=v)[4]
            kernels[(tf32, autocast)] = (costs.gpu_us * gpu_factor, costs.host_us)
        return kernels[(tf32, autocast)]

    def latency(tf32: tuple[bool, bool], autocast: str | None, host: HostProfile, copy: tuple[str, float]) -> float:
        g, h_ref = parts(tf32, autocast)
        k = hm.scale(host) if hm is not None else 1.0 / host.speed
        prefix, _ = _pass_host_us(graph, dev, p, s.runtime, host, copy[0], None, copy[1])
        return _timelines(g, h_ref * k, "gpu", prefix)[0]

    centre = latency((s.tf32_matmul, s.tf32_conv), s.autocast, s.host, (s.input_copy, 0.0))
    scenarios = _scenarios(s, fp32, hm, autocasts)
    logs = [math.log(latency(tf32, ac, host, copy)) for tf32, ac, host, copy, _ in scenarios]
    weights = [w for *_, w in scenarios]
    lg, w = np.array(logs), np.array(weights)
    w = w / w.sum()
    mu = float(np.sum(w * lg))
    sigma = float(np.sqrt(np.sum(w * (lg - mu) ** 2)))
    busy = np.array([float(parts(tf32, ac)[0].sum()) for tf32, ac, *_ in scenarios])
    busy_c = float(parts((s.tf32_matmul, s.tf32_conv), s.autocast)[0].sum())
    gpu_off = float(np.sum(w * np.log(busy))) - math.log(busy_c) if busy_c > 0 and (busy > 0).all() else 0.0
    return DeploymentSpread(offset_log=mu - math.log(centre) if centre > 0 else 0.0, sigma_log=sigma,
                            scenarios=len(logs), gpu_offset_log=gpu_off, autocast_open=len(autocasts) > 1)


def _autocasts(s: Any, dtype: str) -> dict[str | None, float]:
    """``{autocast: weight}`` of a graph of ``dtype`` under the settings ``s``: the described autocast (``None``:
    none), or, undescribed, the graph in its own dtype and autocast at it
    (:data:`~dippm_nas.prior.UNKNOWN_AUTOCAST_WEIGHTS`) for a half-precision graph, none for a float32 one."""
    if "autocast" not in set(s.assumed) or s.autocast is not None or dtype not in AUTOCAST_DTYPES:
        return {s.autocast: 1.0}
    return {None: UNKNOWN_AUTOCAST_WEIGHTS["none"], dtype: UNKNOWN_AUTOCAST_WEIGHTS["autocast"]}


def _copies(s: Any, hm: Any) -> list[tuple[tuple[str, float], float]]:
    """``((input copy, first-touch µs per page on the reference host), weight)`` of the copies the mixture
    spans: the undescribed copy's kinds (or the described one), a pageable one split into a batch in touched
    memory and a freshly mapped batch (:data:`~dippm_nas.prior.PAGEABLE_FRESH_WEIGHT`, the per-page time at the
    Gauss-Hermite nodes of its measured log-normal)."""
    kinds = dict(UNKNOWN_INPUT_COPY_WEIGHTS) if "input_copy" in set(s.assumed) else {s.input_copy: 1.0}
    page = float(getattr(hm, "h2d_fresh_page_us", 0.0) or 0.0)
    sigma = float(getattr(hm, "h2d_fresh_page_sigma_log", 0.0) or 0.0)
    out: list[tuple[tuple[str, float], float]] = []
    for kind, w in kinds.items():
        if kind != "pageable" or page <= 0:
            out.append(((kind, 0.0), w))
            continue
        out.append(((kind, 0.0), w * (1.0 - PAGEABLE_FRESH_WEIGHT)))
        out += [((kind, page * math.exp(z * sigma)), w * PAGEABLE_FRESH_WEIGHT * w_z) for z, w_z in _GH_NODES]
    return out


def _scenarios(s: Any, fp32: bool, hm: Any = None, autocasts: dict[str | None, float] | None = None
               ) -> list[tuple[tuple[bool, bool], str | None, HostProfile, tuple[str, float], float]]:
    """``(TF32 flags, autocast, host, (input copy, first-touch µs per page), weight)`` of every scenario of the
    mixture over what ``s`` leaves open (``hm``: the host model, whose measured first-touch time spreads a
    pageable copy; ``autocasts``: the graph's :func:`_autocasts`, default the described autocast), in the order
    :func:`deployment_spread` evaluates them."""
    unknown = set(s.assumed)
    frameworks = (dict(UNKNOWN_FRAMEWORK_WEIGHTS) if "framework" in unknown else {s.host.framework: 1.0})
    speeds = ([(s.host.speed * math.exp(z * UNKNOWN_HOST_SIGMA_LOG), w) for z, w in _GH_NODES]
              if "host" in unknown else [(s.host.speed, 1.0)])
    copies = dict(_copies(s, hm))
    acs = autocasts if autocasts is not None else {s.autocast: 1.0}
    out = []
    for fw, w_fw in frameworks.items():
        tf32 = _TF32_OF[fw] if ("tf32" in unknown and fp32) else (s.tf32_matmul, s.tf32_conv)
        for ac, w_ac in acs.items():
            for speed, w_sp in speeds:
                host = dataclasses.replace(s.host, speed=speed, framework=fw)
                for copy, w_c in copies.items():
                    out.append((tf32, ac, host, copy, w_fw * w_ac * w_sp * w_c))
    return out


def deployment_spread_many(stack: CostStack, device: Device, deployment: Any, *, params: PriorParams | None = None,
                           gpu_factors: np.ndarray | None = None) -> list[DeploymentSpread]:
    """:func:`deployment_spread` of every graph of ``stack`` (a :class:`~dippm_nas.prior.CostStack`), each
    scenario's timelines evaluated for all graphs at once.

    Args:
        stack: the graphs' node costs (kernel times per setting are shared with the request's other estimates).
        device: the resolved device; deployment, params: as for :func:`deployment_spread`.
        gpu_factors: each graph's correction of its kernel times (``[num_graphs]``; default 1).
    """
    s = deployment_settings(deployment)
    st = stack.facts
    if device.kind != "gpu" or not s.spread_open:
        return [DeploymentSpread() for _ in range(len(st))]
    p = params if params is not None else default_params()
    hm = p.host_model
    factors = np.ones(len(st)) if gpu_factors is None else np.asarray(gpu_factors, dtype=np.float64)
    per_node = np.repeat(factors, st.lens)
    ref = dataclasses.replace(s.host, speed=1.0, framework="torch-2")  # host times at factor 1, rescaled below
    kernels: dict[tuple[tuple[bool, bool], str | None], Timelines] = {}
    busy: dict[tuple[tuple[bool, bool], str | None], np.ndarray] = {}  # each graph's GPU busy µs per setting
    base = resolved_settings(device, params=p, deployment=s)

    def latency(tf32: tuple[bool, bool], autocast: str | None, host: HostProfile, copy: tuple[str, float]
                ) -> np.ndarray:
        if (tf32, autocast) not in kernels:
            v = dataclasses.replace(s, tf32_matmul=tf32[0], tf32_conv=tf32[1], autocast=autocast, host=ref)
            g, h, _ = stack.runtime_costs(resolved_settings(device, params=p, deployment=v))
            kernels[(tf32, autocast)] = Timelines(st, g * per_node, h)
            busy[(tf32, autocast)] = st.sums(g * per_node)
        k = hm.scale(host) if hm is not None else 1.0 / host.speed
        prefix, _ = stack.prefixes(base, host=host, input_copy=copy[0], fresh_page_us=copy[1])
        return kernels[(tf32, autocast)].latency(k, prefix)[0]

    centre = latency((s.tf32_matmul, s.tf32_conv), s.autocast, s.host, (s.input_copy, 0.0))
    # graphs grouped by what their mixture spans: float32 without autocast (TF32 open), and each dtype's autocasts
    groups = [(g.spec.dtype == "float32" and s.autocast is None, tuple(_autocasts(s, g.spec.dtype).items()))
              for g in st.graphs]
    out = {}
    for kind in dict.fromkeys(groups):
        sc = _scenarios(s, kind[0], hm, dict(kind[1]))
        lg = np.log(np.array([latency(tf32, ac, host, copy) for tf32, ac, host, copy, _ in sc]))  # [scenarios, graphs]
        w = np.array([w for *_, w in sc])
        w = w / w.sum()
        mu = np.sum(w[:, None] * lg, axis=0)
        sigma = np.sqrt(np.sum(w[:, None] * (lg - mu) ** 2, axis=0))
        b = np.array([busy[(tf32, ac)] for tf32, ac, *_ in sc])  # [scenarios, graphs]
        with np.errstate(divide="ignore", invalid="ignore"):
            gmu = np.sum(w[:, None] * np.log(b), axis=0)
        out[kind] = (mu, sigma, len(sc), gmu)
    busy_c = busy[((s.tf32_matmul, s.tf32_conv), s.autocast)]
    res = []
    for i in range(len(st)):
        mu, sigma, n, gmu = out[groups[i]]
        c, bc = float(centre[i]), float(busy_c[i])
        g_off = float(gmu[i]) - math.log(bc) if bc > 0 and math.isfinite(float(gmu[i])) else 0.0
        res.append(DeploymentSpread(offset_log=float(mu[i]) - math.log(c) if c > 0 else 0.0,
                                    sigma_log=float(sigma[i]), scenarios=n, gpu_offset_log=g_off,
                                    autocast_open=len(groups[i][1]) > 1))
    return res
