"""The predictor plug-in point: :class:`BasePredictor` and the analytic stand-in."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import math

from dippm_nas._gc import gc_paused
from dippm_nas._logging import WarnOnce
from dippm_nas.deployment import AUTOCAST_DTYPES, DEPLOYMENT_RUNTIMES, GRAPH_RUNTIMES, Deployment
from dippm_nas.devices import Device, HostProfile, resolve_device
from dippm_nas.errors import DeviceError, DippmNasError, ExecutionRuntimeError, InvalidTypeError, InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.predictor._adapt import ANY_SPACE, Adaptation, AdaptationKey, check_rows_key, deployment_key, merge_rows
from dippm_nas.predictor._calibrate import (ANALYTIC_IDENTITY, Calibration, calibration_classes, calibration_details,
                                            delete_calibration, fit_timeline_factors, read_calibration,
                                            require_plausible, save_calibration)
from dippm_nas.prior import (CostStack, DeploymentSettings, advise, advise_many, deployment_settings,
                             deployment_spread, deployment_spread_many, described_offset_log, estimate, estimates_of,
                             latency_us,
                             prediction_of, resolved_settings, timeline_fields)

__all__ = ["BasePredictor", "AnalyticPredictor", "measurement_pairs", "deployment_of", "resolve_deployment",
           "BATCH_MIN_GRAPHS"]

#: From this many graphs per request on, a predictor runs the prior over the stack of graphs at once
#: (:func:`~dippm_nas.prior.estimate_many`, ``deployment_spread_many``, ``advise_many``) instead of graph by graph;
#: both give the same figures (``tests/predictor/test_predict_batched.py``). The stack pays for itself from two graphs: the
#: A100 checkpoint on new MBConv graphs of about 205 nodes took 11.7 ms per graph by the per-graph path and 6.4 ms
#: stacked for requests of two, 10.5 and 3.1 ms for eight (11.3 and 10.2 ms for one; CPU time, 2 shared cores at
#: load average 7.6-8.0, ``python benchmarks/speed/bench_predict_space.py --candidates 300 --batch-sizes 1,2,8``). A
#: single model keeps the per-graph path.
BATCH_MIN_GRAPHS = 2

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger, python_warning=True)


class BasePredictor(abc.ABC):
    """Turns operator graphs into :class:`Prediction` objects for one device.

    :func:`dippm_nas.predict` and :func:`dippm_nas.predict_many` call :meth:`predict_graphs` once per
    request with every graph of the request, so an implementation can run one batched pass.
    """

    #: The catalogue id of the device this predictor answers for.
    device: str
    #: :meth:`predict_graphs` takes the settings :func:`resolve_deployment` returns as ``deployment=`` (the shipped
    #: predictors: a request's deployment is resolved once, at its entry); a plug-in that leaves it ``False`` gets
    #: the :class:`~dippm_nas.Deployment` they resolve.
    takes_resolved_deployment: bool = False

    @property
    def resolved_device(self) -> Device:
        """The :class:`~dippm_nas.devices.Device` of :attr:`device`, resolved once per predictor: a prediction
        passes it inward instead of looking the id up again."""
        dev = self.__dict__.get("_resolved_device")
        if dev is None or dev.id != self.device:
            dev = resolve_device(self.device)
            self.__dict__["_resolved_device"] = dev
        return dev

    @abc.abstractmethod
    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str | None = None, host: HostProfile | str | None = None,
                       deployment: "Deployment | DeploymentSettings | None" = None) -> list[Prediction]:
        """One :class:`Prediction` per graph, in order.

        Args:
            graphs: validated graphs (the caller validated them).
            mig: attach the MIG advisor's answer for devices with MIG.
            k_sigma: how many standard deviations of memory the advisor adds before choosing a profile.
            runtime: execution runtime (``"eager"``, ``"cuda-graphs"``, ``"compiled"``; ``None``: eager, or the
                deployment's), recorded in ``labels["runtime"]``.
            host: the host that drives the GPU (a :class:`~dippm_nas.devices.HostProfile`, a profile file, or
                ``None``: not described).
            deployment: how inference runs (:class:`~dippm_nas.Deployment`); ``runtime`` and ``host`` build one
                when it is ``None``. What it leaves undescribed is listed in ``labels["deployment_assumed"]``.
        """

    def calibrate(self, measurements: Sequence[Any], *, persist: bool = True, runtime: str | None = None,
                  host: HostProfile | str | None = None, deployment: Deployment | None = None) -> Any:
        """Correct this predictor with a few measurements of its device (every shipped predictor implements it;
        see :meth:`AnalyticPredictor.calibrate` and :meth:`GnnPredictor.calibrate`). Called by the user, or by the
        validation loop with the measurements of its rounds.

        Raises:
            DippmNasError: this predictor cannot be calibrated (the default).
        """
        raise DippmNasError(f"{type(self).__name__} for {self.device!r} cannot be calibrated: it implements no "
                            "calibrate(); use get_predictor(device), whose predictors all do")

    def adapt(self, measurements: Sequence[Any], *, persist: bool = True, storage: str | None = None,
              space: str | None = None, runtime: str | None = None, host: HostProfile | str | None = None,
              deployment: Deployment | None = None) -> Any:
        """Adapt this predictor to measured rows of its device, for one deployment and search space; the result is
        active at once (:meth:`AnalyticPredictor.adapt`: the factor calibration; :meth:`GnnPredictor.adapt`: the
        factor calibration and residual heads on the network). Returns the active
        :class:`~dippm_nas.predictor.Adaptation`, or ``None`` with a warning when fewer than two distinct graphs
        hold a figure.

        Raises:
            DippmNasError: this predictor cannot be adapted (the default).
        """
        raise DippmNasError(f"{type(self).__name__} for {self.device!r} cannot be adapted: it implements no "
                            "adapt(); use get_predictor(device), whose predictors all do")


def deployment_of(device: "str | Device", deployment: "Deployment | DeploymentSettings | None" = None,
                  runtime: str | None = None, host: Any = None) -> tuple[Deployment, DeploymentSettings]:
    """The deployment a prediction on ``device`` (a catalogue id, or the resolved :class:`~dippm_nas.devices.Device`)
    is for, and the prior's settings of it: the one place a deployment is coerced and resolved
    (:func:`resolve_deployment` is its public face).

    ``deployment``, or one built from the ``runtime`` / ``host`` keywords: ``Deployment(runtime, host)``
    with the host profile's framework (a profile names its PyTorch generation); ``host=None`` leaves the host
    and the framework undescribed. Settings already resolved (:func:`resolve_deployment`) pass as they are (only
    the device's checks run), so an entry resolves once and hands the settings inward.

    Raises:
        ExecutionRuntimeError: an unknown runtime, one the graph predictors do not model (``"serving"``), or
            one other than ``"eager"`` on a CPU device.
        DeviceError: an unreadable host profile.
        InvalidTypeError: ``deployment`` is neither a :class:`~dippm_nas.Deployment` nor the settings of one.
        DeploymentError: ``runtime`` or ``host`` given beside a deployment that says otherwise
            (:meth:`Deployment.coerce`).
    """
    if isinstance(deployment, DeploymentSettings):
        if deployment.deployment is None:
            raise InvalidTypeError("deployment settings must be those resolve_deployment() returns (they name the "
                                   "Deployment they resolve), not settings built by hand; pass a dippm_nas.Deployment")
        if runtime is None and host is None:
            return deployment.deployment, _checked_for(deployment, resolve_device(device))
        deployment = deployment.deployment
    if deployment is not None and not isinstance(deployment, Deployment):
        raise InvalidTypeError(f"deployment must be a dippm_nas.Deployment, got {type(deployment).__name__}")
    dep = (deployment if deployment is not None and runtime is None and host is None
           else Deployment.coerce(deployment, runtime=runtime, host=host, runtimes=DEPLOYMENT_RUNTIMES))
    settings = deployment_settings(dep)  # refuses "serving" (ExecutionRuntimeError listing the runtimes)
    return dep, _checked_for(settings, resolve_device(device))


def resolve_deployment(device: "str | Device", deployment: Any = None, *, runtime: str | None = None,
                       host: Any = None) -> DeploymentSettings:
    """The deployment of a prediction on ``device``, resolved once: what an entry point (``predict``,
    ``predict_many``, ``HardwareCostModel``, the NNI tuner, the CLI) builds and passes inward.

    Args:
        device: a catalogue id or a resolved :class:`~dippm_nas.devices.Device`.
        deployment: a :class:`~dippm_nas.Deployment`, a mapping of its fields, the path of a JSON/TOML deployment
            file, settings this function returned (passed as they are), or ``None``.
        runtime, host: the ``runtime=`` / ``host=`` keywords of :func:`dippm_nas.predict`.

    Returns:
        The prior's :class:`~dippm_nas.prior.DeploymentSettings`, holding the :class:`~dippm_nas.Deployment`
        (``.deployment``) and its label (``.label``); :func:`dippm_nas.predict` takes them as ``deployment=``.

    Raises:
        DeploymentError, ExecutionRuntimeError, DeviceError, InvalidValueError: as for :func:`dippm_nas.predict`.
    """
    plain = isinstance(deployment, Deployment) and deployment.runtime in GRAPH_RUNTIMES
    if not isinstance(deployment, DeploymentSettings) and not (plain and runtime is None and host is None):
        deployment = Deployment.coerce(deployment, runtime=runtime, host=host)
        runtime = host = None
    return deployment_of(device, deployment, runtime, host)[1]


def _checked_for(settings: DeploymentSettings, dev: Device) -> DeploymentSettings:
    """``settings``, once checked against the device they predict for (a CPU runs eager, without autocast), with
    the warnings of TF32 on a GPU without it and of a framework the host model is not for (once each)."""
    if settings.runtime != "eager" and dev.kind != "gpu":
        raise ExecutionRuntimeError(f"runtime {settings.runtime!r} is modelled for GPUs; device {dev.id!r} is a CPU, "
                                    "whose predictions are for eager PyTorch (runtime='eager')")
    if settings.autocast is not None and dev.kind != "gpu":
        raise InvalidValueError(f"autocast={settings.autocast!r} is modelled for GPUs (torch.autocast('cuda')); "
                                f"device {dev.id!r} is a CPU: capture the model in the dtype it runs in instead")
    if _tf32_unsupported(settings, dev):
        _warn_once(f"tf32:{dev.id}", "the deployment asks for TF32, which %s (%s) does not have: FP32 matmuls and "
                   "convolutions are predicted on its FP32 cores, flagged details['tf32_unsupported'] = 1",
                   dev.id, dev.architecture)
    if settings.host.framework != CURRENT_FRAMEWORK:
        _warn_once(f"framework:{settings.host.framework}",
                   "the deployment runs %s, not the %s generation the host model's constants are for: its host "
                   "times are scaled by the fitted generation factor and flagged details['host_profile_mismatch'] = 1",
                   settings.host.framework, CURRENT_FRAMEWORK)
    return settings


#: The framework generation the host model's constants and the default host profile describe.
CURRENT_FRAMEWORK = "torch-2"


def execution_details(settings: DeploymentSettings, device: "str | Device | None" = None) -> dict[str, float]:
    """``details`` numbers every prediction carries about its execution: whether the framework is another
    generation than the host model's (``host_profile_mismatch``) and, on a GPU, whether it asked for TF32 the GPU
    does not have (``tf32_unsupported``: the flag is ignored). Its texts are :func:`execution_labels`."""
    dev = resolve_device(device) if device is not None else None
    out = {"host_profile_mismatch": float(settings.host.framework != CURRENT_FRAMEWORK)}
    if dev is not None and dev.kind == "gpu":
        out["tf32_unsupported"] = float(_tf32_unsupported(settings, dev))
    return out


def execution_labels(settings: DeploymentSettings, device: "str | Device | None" = None) -> dict[str, str]:
    """``labels`` every prediction carries about its execution: the runtime and the deployment's settings that
    were assumed (``deployment_assumed``: comma-joined, ``""`` when every setting is described) and those taken
    from the running process's torch (``deployment_from_process``: e.g. ``"framework,tf32 (torch 2.13.0)"``,
    ``""`` when none); both always ``""`` on a CPU device, where none of them applies."""
    cpu = device is not None and resolve_device(device).kind != "gpu"
    return {"runtime": settings.runtime, "deployment_assumed": "" if cpu else settings.assumed_label,
            "deployment_from_process": "" if cpu else settings.from_process_label}


def _tf32_unsupported(settings: DeploymentSettings, device: Any) -> bool:
    """The deployment asks for TF32 on a GPU without TF32 tensor cores (before Ampere)."""
    return settings.tf32_requested and device.kind == "gpu" and device.tf32_tensor_tflops is None


class AnalyticPredictor(BasePredictor):
    """The analytic prior (roofline + timelines + liveness) as a predictor; every source is ``"analytic"``.

    On a GPU, :meth:`calibrate` fits host, GPU and op-class GPU factors to a few measured latencies
    (:func:`~dippm_nas.predictor.fit_timeline_factors`, as :meth:`GnnPredictor.calibrate` does); latency then
    has source ``"calibrated"``, the uncalibrated figure in ``details["uncalibrated_latency_ms"]``. The
    correction is persisted under the cache directory (identity :data:`ANALYTIC_IDENTITY`) and re-applied
    when a predictor for the device is made again.

    Args:
        device: catalogue id.
        load_calibration: re-apply a persisted calibration of the device's analytic prior.
    """

    #: from this many graphs per request on, the prior runs over the stack of graphs at once
    #: (:data:`BATCH_MIN_GRAPHS`; the same figures as graph by graph)
    batch_min_graphs: int = BATCH_MIN_GRAPHS
    takes_resolved_deployment = True

    def __init__(self, device: str, *, load_calibration: bool = True) -> None:
        dev = resolve_device(device)
        self.device = dev.id
        self._resolved_device = dev  # resolved once: a prediction passes it inward
        self.calibration: Calibration | None = None
        #: the active adaptation (:meth:`adapt`; ``None`` without one)
        self.adaptation: Adaptation | None = None
        #: why the device's persisted calibration file was not applied ("" when none was ignored); while set,
        #: every prediction carries ``details["calibration_ignored"] = 1``
        self.calibration_ignored = ""
        if load_calibration and dev.kind == "gpu":
            self.calibration, self.calibration_ignored = read_calibration(self.device, self._identity())

    def _identity(self) -> str:
        return ANALYTIC_IDENTITY.format(device=self.device)

    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str | None = None, host: HostProfile | str | None = None,
                       deployment: "Deployment | DeploymentSettings | None" = None) -> list[Prediction]:
        """See :meth:`BasePredictor.predict_graphs`. From :data:`BATCH_MIN_GRAPHS` graphs on, the prior runs over
        the stack of graphs at once (:func:`~dippm_nas.prior.estimate_many`; the same figures)."""
        dev = self.resolved_device
        _, st = deployment_of(dev, deployment, runtime, host)
        if len(graphs) < self.batch_min_graphs:
            return self._predict_each(graphs, dev, st, mig, k_sigma)
        with gc_paused():
            stack = CostStack(graphs, dev)
            ests = estimates_of(stack, resolved_settings(dev, deployment=st))
            gpu = dev.kind == "gpu"
            spreads = (deployment_spread_many(stack, dev, st) if gpu and all(e.energy_j is not None for e in ests)
                       else [None] * len(ests))
            preds = [self._analytic(e, dev, sp) for e, sp in zip(ests, spreads)]
            if mig and dev.has_mig:
                advice = advise_many(preds, dev, list(graphs), k_sigma=k_sigma, deployment=st, stack=stack)
                preds = [dataclasses.replace(p, mig=a) for p, a in zip(preds, advice)]
            return [self._finish(g, p, st, e) for g, p, e in zip(graphs, preds, ests)]

    def _predict_each(self, graphs: Sequence[OperatorGraph], dev: Device, st: DeploymentSettings, mig: bool,
                      k_sigma: float) -> list[Prediction]:
        """The single-graph path: one estimate, spread and MIG advice per graph."""
        out = []
        for g in graphs:
            est = estimate(g, dev, deployment=st)
            sp = (deployment_spread(g, dev, st) if dev.kind == "gpu" and est.energy_j is not None else None)
            pred = self._analytic(est, dev, sp)
            if mig and dev.has_mig:
                pred = dataclasses.replace(pred, mig=advise(pred, dev, graph=g, k_sigma=k_sigma, deployment=st))
            out.append(self._finish(g, pred, st, est))
        return out

    def _analytic(self, est: Any, dev: Device, spread: Any) -> Prediction:
        """The prior's prediction of an estimate; on a device without power figures, energy is unavailable,
        not zero."""
        if est.energy_j is not None:
            return prediction_of(est, dev, spread=spread)
        return Prediction(
            latency_ms=est.latency_ms, energy_j=None, memory_mib=est.memory_mib,
            latency_source="analytic", energy_source="unavailable", memory_source="analytic",
            device=self.device, batch_size=est.batch_size, dtype=est.dtype,
            unknown_ops=dict(est.unknown_ops), details=est.details(), **timeline_fields(est, dev),
        )

    def _finish(self, graph: OperatorGraph, pred: Prediction, st: DeploymentSettings, est: Any) -> Prediction:
        details = {**pred.details, **execution_details(st, self.resolved_device)}
        if self.calibration_ignored:
            details["calibration_ignored"] = 1.0
        labels = {**pred.labels, **execution_labels(st, self.resolved_device)}
        return self._calibrated(graph, dataclasses.replace(pred, details=details, labels=labels), st, est)

    def _calibrated(self, graph: OperatorGraph, pred: Prediction, settings: DeploymentSettings,
                    est: Any) -> Prediction:
        """``pred`` with the calibration's timeline factors applied to its latency (unchanged without them);
        ``est``: the estimate ``pred`` was made from."""
        tf = self.calibration.timeline_factors if self.calibration is not None else None
        if tf is None or pred.latency_ms is None:
            return pred
        g, h, pre = tf.apply(est.node_time_ms * 1e3, est.node_host_ms * 1e3, est.pass_host_ms * 1e3,
                             calibration_classes(graph) if tf.class_log else None)
        # measurements made under the deployment describe it: its spread's offset and σ give way to the factors, but
        # a described deployment's offset (a pageable copy's fresh-page mixture) is physics of the row and stays
        offset, s_dep = pred.details.get("deployment_offset_log", 0.0), pred.details.get("deployment_sigma_log", 0.0)
        # an undescribed autocast is open only for a half-precision graph (a float32 one's is none)
        if [a for a in settings.assumed if a != "autocast" or graph.spec.dtype in AUTOCAST_DTYPES]:
            centre = pred.latency_ms * math.exp(-offset)
        else:
            centre = pred.latency_ms
        lat = latency_us(g, h, pre) / 1e3 * (centre / est.latency_ms if est.latency_ms > 0 else 1.0)
        std = None
        if pred.latency_ms_std is not None:
            own = math.sqrt(max((pred.latency_ms_std / pred.latency_ms) ** 2 - s_dep ** 2, 0.0))
            std = lat * math.hypot(own, tf.residual_std_log)
        host_ms, gpu_ms = float(h.sum() + pre) / 1e3, float(g.sum()) / 1e3
        details = {**pred.details, **calibration_details(tf), "uncalibrated_latency_ms": pred.latency_ms,
                   "host_ms": host_ms, "gpu_busy_ms": gpu_ms, "host_bound": float(host_ms > gpu_ms),
                   "deployment_sigma_log": 0.0, "deployment_offset_log": 0.0}
        return dataclasses.replace(pred, latency_ms=lat, latency_ms_std=std, latency_source="calibrated",
                                   host_ms=host_ms, gpu_ms=gpu_ms, details=details)

    def calibrate(self, measurements: Sequence[Any], *, persist: bool = True, runtime: str | None = None,
                  host: HostProfile | str | None = None, deployment: Deployment | None = None) -> Calibration | None:
        """Adapt the prior's GPU latency to real measurements of this device (few-shot): host, GPU and
        op-class GPU factors (see :mod:`dippm_nas.predictor._calibrate`). Energy and memory stay analytic.

        Args:
            measurements: ``(graph, Measurement)`` or ``(graph, {"latency_ms": ...})`` pairs.
            persist: write the correction to the cache directory so later predictors re-apply it.
            runtime, host, deployment: how the measured passes ran (as for :meth:`predict_graphs`).

        Returns:
            The fitted :class:`~dippm_nas.predictor.Calibration` (now active), or ``None`` with a warning when
            fewer than two measurements hold a latency: the predictions stay unchanged.

        Raises:
            DeviceError: a CPU device (its analytic latency has no timelines to correct).
            InvalidValueError: a figure that is not a finite number > 0 (named in the message), or a fit beyond
                the plausibility bounds (:func:`~dippm_nas.predictor.calibration_problems`); nothing is applied.
        """
        dev = self.resolved_device
        if dev.kind != "gpu":
            raise DeviceError(f"the analytic prior of {self.device!r} (a CPU) has no host and GPU timelines to "
                              "calibrate; calibrate a trained host-cpu checkpoint (GnnPredictor.calibrate) instead")
        pairs = measurement_pairs(measurements)
        pairs = [(g, y) for g, y in pairs if "latency_ms" in y]
        if len(pairs) < 2:
            _warn_once(f"calibrate-few:{self.device}", "calibrate() needs at least 2 measurements with a latency "
                       "> 0, got %d: the %s predictions are left unchanged", len(pairs), self.device)
            return None
        _, st = deployment_of(dev, deployment, runtime, host)
        ests = [estimate(g, dev, deployment=st) for g, _ in pairs]
        offsets = [described_offset_log(st, deployment_spread(g, dev, st)) if st.spread_open else 0.0
                   for g, _ in pairs]
        tf = fit_timeline_factors([(e.node_time_ms * 1e3, e.node_host_ms * 1e3, e.pass_host_ms * 1e3) for e in ests],
                                  [y["latency_ms"] * math.exp(-o) for (_, y), o in zip(pairs, offsets)],
                                  node_classes=[calibration_classes(g) for g, _ in pairs])
        cal = Calibration(device=self.device, checkpoint=self._identity(), coef={}, n={"latency_ms": len(pairs)},
                          timeline=dataclasses.asdict(tf))
        require_plausible(cal)
        self.calibration = cal
        if persist:
            save_calibration(cal)
            self.calibration_ignored = ""
        return cal

    def reset_calibration(self, *, persist: bool = True) -> None:
        """Drop the active calibration (and its file when ``persist``)."""
        self.calibration = None
        self.adaptation = None
        if persist:
            delete_calibration(self.device)
            self.calibration_ignored = ""

    def adapt(self, measurements: Sequence[Any], *, persist: bool = True, storage: str | None = None,
              space: str | None = None, runtime: str | None = None, host: HostProfile | str | None = None,
              deployment: Deployment | None = None) -> Adaptation | None:
        """Adapt the analytic prior to measured rows of this GPU: it has no network, so its adaptation is the factor
        calibration of :meth:`calibrate` fitted on the rows (rows of one graph averaged), with no residual heads.
        The result is active at once, for every deployment and space: the analytic predictor holds one correction
        per device.

        Args:
            measurements: ``(graph, Measurement)`` or ``(graph, {"latency_ms": ...})`` pairs (only the latency is
                corrected; energy and memory stay analytic). A ``Measurement`` of another device is an error.
            persist: write the correction as the device's calibration file (as :meth:`calibrate`), re-applied by
                every analytic predictor of the device made later.
            storage: must be ``None``: the analytic predictor keeps no adaptation store (that is a network's).
            space: recorded in the adaptation's key (default ``"any"``).
            runtime, host, deployment: how the measured passes ran (as for :meth:`predict_graphs`).

        Returns:
            The active :class:`~dippm_nas.predictor.Adaptation` (``heads`` empty; its ``calibration`` the fitted
            factors), or ``None`` with a warning when fewer than two distinct graphs hold a latency.

        Raises:
            DeviceError: a CPU device (as :meth:`calibrate`).
            InvalidValueError: ``storage`` given, a figure that is not a finite number > 0, a measurement of
                another device or deployment, or a fit beyond the plausibility bounds.
        """
        if self.resolved_device.kind != "gpu":
            raise DeviceError(f"the analytic prior of {self.device!r} (a CPU) has no host and GPU timelines to adapt; "
                              "adapt a trained host-cpu checkpoint (GnnPredictor.adapt) instead")
        if storage is not None:
            raise InvalidValueError(f"storage={storage!r}: the analytic predictor of {self.device!r} keeps no "
                                    "adaptation store; its adaptation is the device's calibration (persist=True "
                                    "writes it to the cache directory)")
        measurements = list(measurements)
        dep, _ = deployment_of(self.resolved_device, deployment, runtime, host)
        key = AdaptationKey(self.device, deployment_key(self.resolved_device, deployment=dep), space or ANY_SPACE)
        check_rows_key(measurements, key)
        pairs = measurement_pairs(measurements) if measurements else []
        rows = merge_rows([(g, y) for g, y in pairs if "latency_ms" in y], key_of=_graph_key)
        if len(rows) < 2:
            _warn_once(f"adapt-few:{self.device}", "adapt() needs at least 2 measured graphs with a latency > 0, got "
                       "%d: the %s predictions are left unchanged", len(rows), self.device)
            return None
        cal = self.calibrate(rows, persist=persist, deployment=dep)
        assert cal is not None  # two rows or more
        identity = hashlib.sha256(self._identity().encode()).hexdigest()
        self.adaptation = Adaptation(key=key, checkpoint_sha256=identity, rows=len(rows), calibration=cal)
        return self.adaptation

    def __repr__(self) -> str:
        return f"AnalyticPredictor(device={self.device!r}, calibrated={self.calibration is not None})"


_TARGET_NAMES = ("latency_ms", "energy_j", "memory_mib")


def _graph_key(graph: OperatorGraph) -> str:
    """What makes two measured rows the same graph: its structure and input spec."""
    return graph.structural_hash() + json.dumps(graph.spec.to_dict(), sort_keys=True)


def measurement_pairs(measurements: Sequence[Any]) -> list[tuple[OperatorGraph, dict[str, float]]]:
    """``(graph, {target: figure})`` of calibration measurements: ``(graph, Measurement)`` or
    ``(graph, dict)`` pairs; measurements whose status is not ``"ok"`` are skipped.

    Raises:
        InvalidTypeError: an item that is not such a pair.
        InvalidValueError: a figure that is not a finite number > 0 (named), or no pair with a figure.
    """
    if isinstance(measurements, (str, bytes, Mapping)) or not isinstance(measurements, Iterable):
        raise InvalidTypeError(f"measurements must be a list of (graph, Measurement) or (graph, {{'latency_ms': "
                               f"...}}) pairs, got {type(measurements).__name__} {measurements!r:.200}")
    out = []
    for i, item in enumerate(measurements):
        try:
            g, m = item
        except (TypeError, ValueError):
            raise InvalidTypeError(f"measurements[{i}] must be a (graph, Measurement) pair, "
                                   f"got {type(item).__name__}") from None
        if not isinstance(g, OperatorGraph):
            raise InvalidTypeError(f"measurements[{i}][0] must be an OperatorGraph, got {type(g).__name__}")
        if isinstance(m, dict):
            raw = {k: v for k, v in m.items() if k in _TARGET_NAMES and v is not None}
        else:
            if getattr(m, "status", "ok") != "ok":
                continue
            raw = {t: getattr(m, t) for t in _TARGET_NAMES if getattr(m, t, None) is not None}
        y: dict[str, float] = {}
        for k, v in raw.items():
            try:
                y[k] = float(v)
            except (TypeError, ValueError):
                raise InvalidValueError(f"measurements[{i}][{k!r}] must be a number > 0, got {v!r}") from None
        bad = {k: v for k, v in y.items() if not (math.isfinite(v) and v > 0)}
        if bad:
            raise InvalidValueError(f"measurements[{i}] has figures that are not finite numbers > 0: {bad}")
        if y:
            out.append((g, y))
    if not out:
        raise InvalidValueError("calibrate needs at least one (graph, measurement) pair with a finite figure > 0")
    return out
