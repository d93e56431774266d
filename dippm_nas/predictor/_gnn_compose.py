"""What the network's log answers become: :class:`PredictionComposer` turns a
:class:`~dippm_nas.predictor.GnnPredictor`'s log answers (and their novelty flags) into
:class:`~dippm_nas.prediction.Prediction` objects: the latency as timelines of the requested deployment (the
network's answer read as a correction of the kernel times), the calibration's factors, σ in units, the details and
labels, and the MIG advice; finished predictions are cached per (graph, options, calibration, deployment,
adaptation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dippm_nas._gc import gc_paused
from dippm_nas.deployment import Deployment
from dippm_nas.devices import HostProfile, default_host_profile
from dippm_nas.features import GraphFeatures, static_dtype_columns
from dippm_nas.graph import OperatorGraph
from dippm_nas.mig import advise, advise_many
from dippm_nas.prediction import Prediction
from dippm_nas.predictor._base import deployment_of, execution_details, execution_labels
from dippm_nas.predictor._calibrate import calibration_classes, calibration_details
from dippm_nas.predictor._gnn_infer import graph_key
from dippm_nas.predictor._meta import TARGETS
from dippm_nas.predictor._numpy_ensemble import global_arrays
from dippm_nas.prior import (CostStack, DeploymentSettings, DeploymentSpread, default_params, deployment_spread,
                             deployment_spread_many, described_offset_log, estimate as prior_estimate, estimates_of,
                             latency_us, resolved_settings)

if TYPE_CHECKING:  # pragma: no cover
    from dippm_nas.predictor._gnn import GnnPredictor

__all__ = ["PredictionComposer"]


class PredictionComposer:
    """The predictions of one :class:`~dippm_nas.predictor.GnnPredictor` (``p``) from its network's log answers.

    Attributes:
        p: the predictor (its inference, calibration, adaptations, metadata and device).
        cache: finished predictions per (graph key, MIG, k_sigma, calibration, deployment, adaptation), an LRU of
            ``cache_size`` entries.
        execution_params_memo: ``(pinned, host model, their merge)`` of :meth:`execution_params`.
    """

    def __init__(self, p: "GnnPredictor", cache_size: int) -> None:
        self.p = p
        self.cache: OrderedDict[tuple[Any, ...], Prediction] = OrderedDict()
        self.cache_size = cache_size
        self.lock = threading.Lock()
        self.execution_params_memo: tuple[Any, Any, Any] | None = None

    def clear(self) -> None:
        """Forget every finished prediction."""
        self.cache.clear()

    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str | None = None, host: HostProfile | str | None = None,
                       deployment: "Deployment | DeploymentSettings | None" = None) -> list[Prediction]:
        if not graphs:
            return []
        dep, st = deployment_of(self.p.resolved_device, deployment, runtime, host)
        adaptation = self.p.adaptations.adaptation_for(dep)
        cal = None if self.p.calibration is None else id(self.p.calibration)
        ex_key = dep.key
        ad = None if adaptation is None else id(adaptation)
        gkeys = [graph_key(g) for g in graphs]
        keys = [(gk, bool(mig), float(k_sigma), cal, ex_key, ad) for gk in gkeys]
        out: list[Prediction | None] = [self.cache.get(k) for k in keys]
        todo = [i for i, p in enumerate(out) if p is None]
        if todo:
            with gc_paused() if len(todo) >= self.p.batch_min_graphs else contextlib.nullcontext():
                self.predict_todo(graphs, todo, gkeys, keys, out, dep, st, adaptation, mig, k_sigma)
        return out  # type: ignore[return-value]

    def predict_todo(self, graphs: Sequence[OperatorGraph], todo: list[int], gkeys: list[Any], keys: list[Any],
                      out: list[Prediction | None], dep: Any, st: DeploymentSettings, adaptation: Any, mig: bool,
                      k_sigma: float) -> None:
        """The uncached part of :meth:`predict_graphs`: ``out[i]`` for every ``i`` of ``todo``, cached."""
        batch = [graphs[i] for i in todo]
        stack = CostStack(batch, self.p.resolved_device) if len(todo) >= self.p.batch_min_graphs else None
        feats = (self.p.inference.features_many(batch, [gkeys[i] for i in todo], stack) if stack is not None
                 else [self.p.features(g) for g in batch])
        mean, std, ood, nov, other_machine = self.p.predict_log_full(feats)
        unseen = self.p.dtype_unseen(global_arrays(feats))
        prior_only = self.p.prior_only(feats)
        flags = [dict(ood=bool(ood[j]), novelty=float(nov[j]), dtype_unseen=bool(unseen[j]),
                      prior_only=bool(prior_only[j]), other_machine=bool(other_machine[j]))
                 for j in range(len(todo))]
        if stack is not None:
            preds = self.predictions_stacked(batch, feats, mean, std, flags, stack, st, mig, k_sigma)
        else:
            preds = [self.prediction(g, feats[j], mean[j], std[j], mig=mig, k_sigma=k_sigma, settings=st,
                                      **flags[j]) for j, g in enumerate(batch)]
        for j, i in enumerate(todo):
            out[i] = preds[j]
        if adaptation is not None:
            self.p.adaptations.adapted([graphs[i] for i in todo], feats, todo, out, adaptation, mig, k_sigma, st)
        elif self.p.adaptations.ignored(dep):
            for i in todo:
                out[i] = dataclasses.replace(out[i], details={**out[i].details, "adaptation_ignored": 1.0})
        with self.lock:
            for i in todo:
                self.cache[keys[i]] = out[i]  # type: ignore[assignment]
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)

    def predictions_stacked(self, graphs: Sequence[OperatorGraph], feats: Sequence[GraphFeatures], mean: np.ndarray,
                             std: np.ndarray, flags: Sequence[dict[str, Any]], stack: CostStack,
                             settings: DeploymentSettings, mig: bool, k_sigma: float) -> list[Prediction]:
        """:meth:`prediction` of every graph, the prior's work over the stack at once: the requested deployment's
        estimates (their kernels shared with the features'), the spread's scenarios and the MIG slices."""
        dev = self.p.resolved_device
        params = self.execution_params()
        latency = "latency_ms" in self.p.meta.targets and dev.kind == "gpu"
        direct = _features_settings(settings) and params is self.pinned_params()
        rts: list[Any] = [None] * len(graphs)
        spreads: list[Any] = [None] * len(graphs)
        if latency and not direct:
            rts = estimates_of(stack, resolved_settings(dev, params=params, deployment=settings))
        if latency and settings.spread_open:
            factors = np.array([self.gpu_correction(f.estimate, float(m[0])) if f.estimate is not None else 1.0
                                for f, m in zip(feats, mean)])
            spreads = deployment_spread_many(stack, dev, settings, params=params, gpu_factors=factors)
        preds = [self.prediction(g, feats[j], mean[j], std[j], mig=False, k_sigma=k_sigma, settings=settings,
                                  rt=rts[j], spread=spreads[j], **flags[j]) for j, g in enumerate(graphs)]
        if mig and dev.has_mig:
            advice = advise_many(preds, dev, list(graphs), k_sigma=k_sigma, params=params, deployment=settings,
                                 stack=stack)
            preds = [dataclasses.replace(p, mig=a) for p, a in zip(preds, advice)]
        return preds

    def gpu_correction(self, est: Any, m: float) -> float:
        """The network's log answer ``m`` as a correction of the kernel times (see :meth:`timeline_parts`)."""
        prior_ms = max(float(est.latency_ms), 1e-9)
        w = min(1.0, max(0.0, float(est.gpu_busy_ms) / prior_ms))
        engine = self.p.inference.engine
        bound = float(engine.delta_max[TARGETS.index("latency_ms")]) if engine.residual_on_prior else 30.0
        delta = min(max(m - math.log(prior_ms), -bound), bound)
        return math.exp(w * delta)

    def pinned_params(self) -> Any:
        """The prior constants the features are computed with (the checkpoint's, else the package's)."""
        return self.p.prior_params if self.p.prior_params is not None else default_params()

    def execution_params(self) -> Any:
        """The prior constants of a runtime-specific estimate: the pinned ones, with the package's fitted host
        model where the pinned constants carry none (the GNN corrects kernel time; the host side is the
        host model's)."""
        pinned = self.pinned_params()
        fitted = default_params().host_model
        if pinned.host_model is None and fitted is not None:
            memo = self.execution_params_memo  # one object per (pinned, host model) pair
            if memo is not None and memo[0] is pinned and memo[1] is fitted:
                return memo[2]
            out = dataclasses.replace(pinned, host_model=fitted)
            self.execution_params_memo = (pinned, fitted, out)
            return out
        return pinned

    def timeline_parts(self, graph: OperatorGraph, est: Any, m: float, settings: DeploymentSettings,
                        rt: Any = None) -> tuple[float, np.ndarray, np.ndarray, float, dict[str, float], Any]:
        """The network's eager answer ``exp(m)`` as timelines of the deployment ``settings``.

        The network's answer is read as a correction of the kernel times: its log correction of the features'
        estimate (eager, default host), ``delta = m - log(prior)``, applies to the kernels in the share ``w`` of
        that estimate the GPU is busy, ``c = exp(w * delta)`` (a GPU-bound graph's whole correction, none of a
        host-bound one's, whose answer says little of its kernels). The kernels of the requested deployment
        (runtime, TF32 flags, layout, autocast), times ``c``, then run behind the host timeline of its runtime,
        host profile and input copy (``rt``: the prior's estimate of them, when the caller has it). Where the
        features were computed for the requested settings themselves, the latency is the network's answer.

        Returns:
            ``(latency ms, gpu_us, host_us, prefix_us, details, estimate)``: the per-node kernel times
            (corrected), host times, the host time before the first operator, and the prior's estimate of the
            requested execution (``None`` where it is the features' own).
        """
        params = self.execution_params()
        prior_ms = max(float(est.latency_ms), 1e-9)
        w = min(1.0, max(0.0, float(est.gpu_busy_ms) / prior_ms))
        c = self.gpu_correction(est, m)
        d: dict[str, float] = {"gpu_share_of_prior": w, "gpu_correction": c,
                               "host_model_fitted": float(params.host_model is not None)}
        if _features_settings(settings) and params is self.pinned_params():
            d["direct"] = 1.0
            return (math.exp(min(max(m, -30.0), 30.0)), c * est.node_time_ms * 1e3, est.node_host_ms * 1e3,
                    est.pass_host_ms * 1e3, d, None)
        if rt is None:
            rt = prior_estimate(graph, self.p.resolved_device, params=params, deployment=settings)
        g, h, pre = c * rt.node_time_ms * 1e3, rt.node_host_ms * 1e3, rt.pass_host_ms * 1e3
        return latency_us(g, h, pre) / 1e3, g, h, pre, d, rt

    def calibration_for(self, graph: OperatorGraph) -> Any:
        """The calibration that applies to ``graph``: the active one, except an adaptation's for a graph of a
        precision its rows did not run in (:meth:`~dippm_nas.predictor._adapt.Adaptation.applies_to`)."""
        cal = self.p.calibration
        ad = self.p.adaptations.adaptation
        if cal is not None and ad is not None and ad.calibration is cal and not ad.applies_to(graph):
            return None
        return cal

    def compose_latency(self, graph: OperatorGraph, est: Any, m: float, s: float, settings: DeploymentSettings,
                         rt: Any = None, spread: DeploymentSpread | None = None
                         ) -> tuple[float, float, dict[str, float], tuple[float, float], bool, Any]:
        """Latency of the deployment ``settings`` (:meth:`timeline_parts`), with the calibration's host and GPU
        factors when it has them. σ combines the network's σ on the kernel part and the host model's held-out
        σ on the host part (and the calibration's residual scatter), each weighted by how much the critical
        path moves with it, and, without a calibration, the spread of what the deployment leaves undescribed
        (:func:`~dippm_nas.prior.deployment_spread`, whose mixture also sets the centre).

        Returns:
            ``(log latency, log σ, details, (host_ms, gpu_ms), calibrated, estimate)``, ``estimate`` as for
            :meth:`timeline_parts`.
        """
        lat_ms, g, h, pre, d, rt = self.timeline_parts(graph, est, m, settings, rt)
        base_us = latency_us(g, h, pre)
        params = self.execution_params()
        # what the deployment leaves undescribed: the mixture's centre and spread (none when all is described)
        sp = spread if spread is not None else (
            deployment_spread(graph, self.p.resolved_device, settings, params=params, gpu_factor=d["gpu_correction"])
            if settings.spread_open else DeploymentSpread())
        cal = self.calibration_for(graph)
        tf = cal.timeline_factors if cal is not None else None
        extra_s = s_dep = 0.0
        if tf is None:
            lat_ms *= math.exp(sp.offset_log)
            s_dep = sp.sigma_log
            d.update(deployment_sigma_log=sp.sigma_log, deployment_offset_log=sp.offset_log)
        else:  # measurements (a calibration) describe the deployment they ran under: its factors replace the spread
            d["uncalibrated_latency_ms"] = lat_ms * math.exp(sp.offset_log)
            g, h, pre = tf.apply(g, h, pre, calibration_classes(graph) if tf.class_log else None)
            # a described pageable copy's fresh-page mixture is physics of each row's input, not an unknown the
            # factors resolve: its centre stays (the factors were fitted on rows with it divided out)
            lat_ms *= latency_us(g, h, pre) / base_us * math.exp(described_offset_log(settings, sp))
            base_us = latency_us(g, h, pre)
            extra_s = tf.residual_std_log
            d.update(calibration_details(tf))
        direct = bool(d.pop("direct", 0.0))
        if direct:  # the network's σ is the latency's
            s_g, s_h = s, 0.0
        else:
            s_host = params.host_model.sigma_log() if params.host_model is not None and tf is None else 0.0
            s_g = math.log(latency_us(math.exp(s) * g, h, pre) / base_us)
            s_h = math.log(latency_us(g, h * math.exp(s_host), pre * math.exp(s_host)) / base_us) if s_host > 0 else 0.0
        host_ms, gpu_ms = float(h.sum() + pre) / 1e3, float(g.sum()) / 1e3
        if tf is None:  # the GPU timeline's centre: the mixture's (an undescribed autocast re-prices kernels)
            gpu_ms *= math.exp(sp.gpu_offset_log)
        d.update(host_ms=host_ms, gpu_busy_ms=gpu_ms, gpu_idle_ms=max(0.0, lat_ms - gpu_ms),
                 host_bound=float(host_ms > gpu_ms), pass_host_ms=pre / 1e3)
        return math.log(lat_ms), math.hypot(s_g, s_h, extra_s, s_dep), d, (host_ms, gpu_ms), tf is not None, rt

    def prediction(self, graph: OperatorGraph, f: GraphFeatures, mean: np.ndarray, std: np.ndarray, *,
                    mig: bool, k_sigma: float, ood: bool = False, novelty: float = math.nan,
                    dtype_unseen: bool = False, prior_only: bool = False, other_machine: bool = False,
                    settings: DeploymentSettings | None = None, rt: Any = None,
                    spread: DeploymentSpread | None = None) -> Prediction:
        est = f.estimate
        dev = self.p.resolved_device
        timeline: dict[str, Any] = {"host_ms": None, "gpu_ms": None}
        composed: dict[str, float] = {}
        if dev.kind == "gpu" and est is not None:
            timeline = {"host_ms": est.host_ms, "gpu_ms": est.gpu_busy_ms}
        values: dict[str, float | None] = {}
        stds: dict[str, float | None] = {}
        sources: dict[str, str] = {}
        prior_vals = {"latency_ms": f.prior_latency_ms, "energy_j": f.prior_energy_j, "memory_mib": f.prior_memory_mib}
        kept: dict[str, float] = {}
        rt_est: Any = None  # the prior's estimate of the requested execution, where it is not the features'
        for t_i, t in enumerate(TARGETS):
            if t not in self.p.meta.targets:
                values[t], stds[t] = prior_vals[t], None
                if t == "memory_mib" and est is not None:
                    stds[t] = est.memory_mib_std  # the analytic memory's own (GPU parts; None on a CPU)
                sources[t] = "analytic" if prior_vals[t] is not None else "unavailable"
                if t == "energy_j" and prior_vals[t] is not None and est is not None:
                    # power over the requested execution's timeline (its host gaps); the power model's fit for
                    # the device's architecture says how far to trust it
                    e = rt_est if rt_est is not None and rt_est.energy_j is not None else est
                    values[t], stds[t], sources[t] = e.energy_j, e.energy_j_std, e.energy_source
                continue
            if dtype_unseen and prior_vals[t] is None:  # the prior answers and has no figure: none is made up
                values[t], stds[t], sources[t] = None, None, "unavailable"
                continue
            m = float(mean[t_i])
            s = self.p.sigma_log(t, float(std[t_i]), ood=ood, novelty=novelty, other_machine=other_machine)
            withheld = t in self.p.inference.withheld_targets(novelty)
            # dtype_unseen, a prior-only dtype, or a graph beyond the validated novelty: ``m`` is the prior's
            src = "analytic" if dtype_unseen or prior_only or withheld else "predicted"
            if src == "analytic" and t == "latency_ms" and dev.kind == "gpu":
                s = max(s, self.prior_kernel_sigma_log(est.compute_dtype if est is not None else graph.spec.dtype))
            calibrated = False
            if t == "latency_ms" and dev.kind == "gpu" and est is not None and settings is not None:
                m, s, composed, (h_ms, g_ms), calibrated, rt_est = self.compose_latency(graph, est, m, s, settings,
                                                                                       rt, spread)
                timeline = {"host_ms": h_ms, "gpu_ms": g_ms}
            if calibrated:
                src = "calibrated"
            elif (cal := self.calibration_for(graph)) is not None and t in cal.coef:
                m, s = cal.apply(t, m, s)
                src = "calibrated"
                if t in cal.kept:  # 1: the fitted correction whole; 0: the measurements' scatter hid it
                    kept[f"calibration_kept_{t}"] = float(cal.kept[t])
            m = min(max(m, -30.0), 30.0)  # exp stays finite and > 0 whatever the network says
            v = math.exp(m)
            values[t], stds[t], sources[t] = v, v * s, src
        unknown = dict(est.unknown_ops) if est is not None else dict(graph.unknown_ops)
        for op, c in f.unknown_ops.items():
            unknown.setdefault(op, c)
        details = self.details(f, composed, kept, settings, ood=ood, novelty=novelty, dtype_unseen=dtype_unseen,
                                prior_only=prior_only, other_machine=other_machine)
        pred = Prediction(
            latency_ms=values["latency_ms"], energy_j=values["energy_j"], memory_mib=values["memory_mib"],
            latency_source=sources["latency_ms"], energy_source=sources["energy_j"],
            memory_source=sources["memory_mib"], device=self.p.device, batch_size=graph.spec.batch_size,
            dtype=graph.spec.dtype, latency_ms_std=stds["latency_ms"], energy_j_std=stds["energy_j"],
            memory_mib_std=stds["memory_mib"], unknown_ops=unknown, details=details, **timeline,
            labels=execution_labels(settings if settings is not None else DeploymentSettings(), dev),
        )
        if mig and dev.has_mig:
            pred = dataclasses.replace(pred, mig=advise(pred, dev, graph=graph, k_sigma=k_sigma,
                                                        params=self.execution_params(),
                                                        deployment=settings if settings is not None
                                                        else DeploymentSettings()))
        return pred

    def details(self, f: GraphFeatures, composed: dict[str, float], kept: dict[str, float],
                 settings: DeploymentSettings | None, *, ood: bool, novelty: float, dtype_unseen: bool,
                 prior_only: bool, other_machine: bool) -> dict[str, Any]:
        """The ``details`` of a prediction from features ``f``: the prior's figures, the execution's, the
        composed latency's and the flags of the network's answer."""
        est = f.estimate
        dev = self.p.resolved_device
        details = est.details() if est is not None else {}
        details.update(composed)
        details.update(execution_details(settings if settings is not None else DeploymentSettings(), dev))
        details["prior_latency_ms"] = f.prior_latency_ms
        details["prior_memory_mib"] = f.prior_memory_mib
        details["outside_training_range"] = float(ood)
        details.update(kept)
        if self.p.calibration_ignored:
            details["calibration_ignored"] = 1.0
        if static_dtype_columns(self.p.meta.feature_style) is not None and self.p.inference.engine.residual_on_prior:
            details["dtype_unseen"] = float(dtype_unseen)
        if self.p.meta.prior_only_dtypes:
            details["prior_only_dtype"] = float(prior_only)
        if self.p.meta.host is not None:
            details["other_host"] = float(self.p.other_host is not None)
            details["other_machine"] = float(other_machine)
        if self.p.host_threads is not None:
            details["host_threads"] = float(self.p.host_threads)  # the latency is for this many torch threads
        if math.isfinite(novelty):
            details["novelty"] = novelty
            if self.p.meta.novelty is not None:
                details["novel"] = float(novelty > self.p.meta.novelty["d0"])
            for t, w in self.p.correction_weights(np.array([novelty])).items():
                # 1: the network's whole correction; 0: the prior
                details[f"correction_weight_{t}"] = 0.0 if prior_only else float(w[0])
        return details

    def prior_kernel_sigma_log(self, dtype: str) -> float:
        """The prior's measured σ of the kernel part for ``dtype`` (the dtype the kernels run in) on a GPU it was
        not fitted on (the pinned host model's ``sigma_log_gpu_bound[_<dtype>]``; on a device without efficiency
        multipliers of its own, ``sigma_log_gpu_unseen_<dtype>`` where recorded and at least an unseen GPU's
        ``sigma_log_gpu_unseen``; 0 without a host model): where the prior answers,
        the σ is at least its own measured error."""
        params = self.execution_params()
        hm = params.host_model
        return (hm.sigma_log_gpu(dtype, device_fitted=params.device_fitted(self.p.resolved_device.id))
                if hm is not None else 0.0)

    # ------------------------------------------------------------ calibration

def _features_settings(settings: DeploymentSettings) -> bool:
    """``settings`` are those the features' prior estimate is made for (eager, the default host, PyTorch's
    default TF32 flags, NCHW, no autocast, no input copy), so the network's answer is the latency itself."""
    return (settings.runtime == "eager" and settings.host == default_host_profile()
            and (settings.tf32_matmul, settings.tf32_conv) == (False, True) and not settings.channels_last
            and settings.autocast is None and settings.input_copy == "none")
