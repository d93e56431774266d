"""MIG advice: which Multi-Instance GPU profiles a model fits (the public face and its rules: :mod:`dippm_nas.mig`)."""


from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from dippm_nas._logging import WarnOnce
from dippm_nas.budgets import DEFAULT_K_SIGMA, check_k_sigma
from dippm_nas.devices import Device, MigProfile, resolve_device
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.prior._estimate import _latency_parts, latency_us, resolved_settings
from dippm_nas.prior._params import PriorParams
from dippm_nas.prior._stack import CostStack, Timelines

__all__ = ["advise", "advise_many", "MigAdvice", "ProfileAdvice", "RULES", "DIPPM_LADDER", "mig_fit_violations"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger)

Rule = Literal["dippm-nas", "dippm"]
#: Fit rules :func:`advise` knows.
RULES: tuple[str, ...] = ("dippm-nas", "dippm")
#: (compute slices, memory slices) of the profiles DIPPM's rule chooses from.
DIPPM_LADDER: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (3, 4), (7, 8))


@dataclass(frozen=True)
class ProfileAdvice:
    """The advisor's answer for one MIG profile.

    Attributes:
        profile: profile name, e.g. ``"1g.5gb"``.
        compute_slices, memory_slices: the profile's share of the GPU (of 7 and of 8).
        sms: SMs of the instance.
        memory_limit_mib: the memory the fit is checked against (usable memory for ``dippm-nas``,
            nominal memory for ``dippm``), MiB.
        fits: whether the model fits under the rule.
        memory_headroom_mib: ``memory_limit_mib`` minus the memory needed (negative when it does not fit), MiB.
        instances_per_gpu: instances of this profile one GPU holds.
        latency_ms: predicted latency of one batch on one instance, ms (``None`` when unknown).
        latency_basis: ``"corrected"`` (the whole GPU's prediction, its corrected kernels and host timeline,
            with each kernel re-timed on the slice's SMs, DRAM bandwidth and L2 share), ``"scaled"`` (an
            upper bound from the prediction's totals, without the graph), or ``"unknown"``.
        throughput_samples_per_s: aggregate samples/s of ``instances_per_gpu`` instances (``None`` when
            the latency is unknown).
        reason: why it does not fit or is not eligible ("" otherwise).
        note: what a fit rests on when it has no margin for the prediction's error (no memory std);
            "" otherwise.
    """

    profile: str
    compute_slices: int
    memory_slices: int
    sms: int
    memory_limit_mib: float
    fits: bool
    memory_headroom_mib: float
    instances_per_gpu: int
    latency_ms: float | None
    latency_basis: str
    throughput_samples_per_s: float | None
    reason: str = ""
    note: str = ""


@dataclass(frozen=True)
class MigAdvice:
    """The advisor's answer for one prediction on one device.

    Attributes:
        device: device id.
        supported: whether the device has MIG at all.
        rule: the fit rule used (one of :data:`RULES`).
        k_sigma: the uncertainty multiplier (``dippm-nas`` rule only).
        memory_needed_mib: memory the fit is checked with (prediction plus ``k_sigma`` std when known), MiB.
        memory_std_mib: the prediction's memory std, MiB (``None`` when it has none).
        memory_std_missing: the prediction has no memory std, so fits were checked without a margin.
        profiles: one :class:`ProfileAdvice` per profile, in the device's order.
        smallest_fit: name of the smallest fitting profile, ``None`` when none fits.
        reason: why there is no fit (or no MIG); "" when there is one.
    """

    device: str
    supported: bool
    rule: str
    k_sigma: float
    memory_needed_mib: float
    memory_std_mib: float | None
    profiles: tuple[ProfileAdvice, ...]
    smallest_fit: str | None
    reason: str = ""
    memory_std_missing: bool = False

    @property
    def fitting(self) -> list[str]:
        """Names of every profile the model fits."""
        return [p.profile for p in self.profiles if p.fits]

    def profile(self, name: str) -> ProfileAdvice:
        """The advice for one profile (the choices are listed when the name is unknown)."""
        for p in self.profiles:
            if p.profile == name:
                return p
        raise InvalidValueError(f"no MIG profile {name!r} in this advice; choices: "
                                f"{[p.profile for p in self.profiles]}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        d = asdict(self)
        d["profiles"] = [asdict(p) for p in self.profiles]
        return d


def _timelines_of(graph: "OperatorGraph", device: Device, options: dict[str, Any]) -> tuple[Any, Any, float]:
    """(kernel µs, host µs, host µs before the first operator) of ``graph`` on ``device`` (a slice view too)."""
    parts = _latency_parts(graph, device, **options)
    return parts[4].gpu_us, parts[4].host_us, parts[6]


def _corrections(prediction: Prediction, prior_busy_us: float, prior_host_us: float) -> tuple[float, float]:
    """(kernel, host) corrections of ``prediction`` over the prior's timelines: its GPU busy time over the
    prior's, its host time over the prior's (1 where either is unknown)."""
    busy, host = prediction.details.get("gpu_busy_ms"), prediction.details.get("host_ms")
    c = float(busy) * 1e3 / prior_busy_us if busy is not None and prior_busy_us > 0 else 1.0
    k = float(host) * 1e3 / prior_host_us if host is not None and prior_host_us > 0 else 1.0
    return c, k


def _slice_latency(
    prediction: Prediction, device: Device, profile: MigProfile, graph: "OperatorGraph | None",
    options: dict[str, Any], whole: tuple[Any, Any, float] | None,
) -> tuple[float | None, str]:
    if graph is not None and whole is not None:
        # the whole GPU's prediction, its kernels re-timed on the slice: each kernel's prior time on the slice
        # over its prior time on the whole GPU, the prediction's correction of the kernels (its GPU busy time
        # over the prior's) and of the host timeline kept as they are
        g_w, h, pre = whole
        g_s, _, _ = _timelines_of(graph, device.mig_slice(profile), options)
        c, k = _corrections(prediction, float(g_w.sum()), float(h.sum() + pre))
        l_w = latency_us(c * g_w, k * h, k * pre)
        l_s = latency_us(c * g_s, k * h, k * pre)
        return _corrected(prediction, l_s, l_w)
    return _scaled_latency(prediction, device, profile)


def _corrected(prediction: Prediction, l_s: float, l_w: float) -> tuple[float, str]:
    return float(prediction.latency_ms) * (l_s / l_w if l_w > 0 else 1.0), "corrected"


def _scaled_latency(prediction: Prediction, device: Device, profile: MigProfile) -> tuple[float | None, str]:
    """Without the graph: the prediction's device time scaled by the slice's worse resource ratio."""
    if prediction.device != device.id:
        return None, "unknown"
    sm_ratio = device.sms / device.profile_sms(profile)
    mem_ratio = 8.0 / profile.memory_slices
    worse = max(sm_ratio, mem_ratio)
    busy = prediction.details.get("gpu_busy_ms")
    host = prediction.details.get("host_ms")
    if busy is not None and host is not None:
        return max(float(host), float(busy) * worse), "scaled"
    return prediction.latency_ms * worse, "scaled"


def advise(
    prediction: Prediction, device: Device | str, *, k_sigma: float = DEFAULT_K_SIGMA, rule: Rule = "dippm-nas",
    graph: "OperatorGraph | None" = None, tf32_conv: bool = True, tf32_matmul: bool = False,
    channels_last: bool = False, params: "PriorParams | None" = None, runtime: str = "eager",
    host: Any = None, input_copy: bool | str = False, autocast: str | None = None, deployment: Any = None,
) -> MigAdvice:
    """For every MIG profile of ``device``: fits or not, headroom, latency and throughput on the slice.

    Args:
        prediction: a :class:`~dippm_nas.prediction.Prediction` of the model on the full GPU.
        device: a MIG-capable device or its id (other devices get ``supported=False`` with a reason).
        k_sigma: memory safety margin in standard deviations of ``memory_mib_std`` (``dippm-nas`` rule);
            default 1.0. Must be >= 0.
        rule: ``"dippm-nas"`` (usable memory, uncertainty, every profile) or ``"dippm"`` (DIPPM's
            memory-only ladder with inclusive bounds); see the module docstring.
        graph: the captured graph; when given, a slice's latency is the prediction with its kernels re-timed on
            the slice (``latency_basis="corrected"``).
        tf32_conv, tf32_matmul, channels_last, params, runtime, host, input_copy, autocast, deployment: passed to
            the prior for slice latencies (as for :func:`~dippm_nas.prior.estimate`).

    Returns:
        A :class:`MigAdvice`; ``smallest_fit`` is ``None`` with a ``reason`` when nothing fits, so a
        search loop can read it without a try/except.

    Raises:
        DippmNasError: ``prediction`` is not a Prediction, or an unknown ``rule``.
        BudgetError: ``k_sigma`` negative or not finite.
        DeviceError: unknown device id (the choices are listed).
    """
    k_sigma, dev = _checked(prediction, device, k_sigma, rule)
    options = {"tf32_conv": tf32_conv, "tf32_matmul": tf32_matmul, "channels_last": channels_last, "params": params,
               "runtime": runtime, "host": host, "input_copy": input_copy, "autocast": autocast,
               "deployment": deployment, "execution": None}
    whole = (_timelines_of(graph, dev, options) if graph is not None and prediction.device == dev.id and dev.has_mig
             else None)
    latencies = [_slice_latency(prediction, dev, p, graph, options, whole) for p in dev.mig_profiles]
    return _advice(prediction, dev, k_sigma, rule, latencies)


def _checked(prediction: Any, device: Device | str, k_sigma: Any, rule: Any) -> tuple[float, Device]:
    if not isinstance(prediction, Prediction):
        raise InvalidValueError(f"prediction must be a dippm_nas.Prediction, got {type(prediction).__name__}")
    k_sigma = check_k_sigma(k_sigma)  # BudgetError (a DippmNasError and a ValueError) naming a bad value
    if rule not in RULES:
        raise InvalidValueError(f"rule must be one of {RULES}, got {rule!r}")
    return k_sigma, resolve_device(device)


def advise_many(predictions: "list[Prediction]", device: Device, graphs: "list[OperatorGraph]", *,
                k_sigma: float = DEFAULT_K_SIGMA, rule: Rule = "dippm-nas", params: "PriorParams | None" = None,
                deployment: Any = None, stack: "CostStack | None" = None) -> list[MigAdvice]:
    """:func:`advise` of each prediction with its graph (``latency_basis="corrected"``), the slices' kernels
    re-timed for all graphs at once.

    Args:
        predictions: one :class:`~dippm_nas.prediction.Prediction` per graph, on ``device`` (the whole GPU).
        device: the resolved MIG-capable device; graphs: the predictions' graphs, in order.
        k_sigma, rule, params, deployment: as for :func:`advise`.
        stack: the :class:`~dippm_nas.prior.CostStack` of ``graphs`` (default: a new one).

    Raises:
        As :func:`advise`.
    """
    checked = [_checked(p, device, k_sigma, rule) for p in predictions]
    if not device.has_mig or not predictions:
        return [_advice(p, device, k, rule, []) for p, (k, _) in zip(predictions, checked)]
    stack = stack if stack is not None else CostStack(graphs, device)
    st = stack.facts
    r = resolved_settings(device, params=params, deployment=deployment)
    g_w, h, _ = stack.runtime_costs(r)
    pre, _ = stack.prefixes(r)
    ck = np.array([_corrections(p, b, hs + float(q)) for p, b, hs, q in
                   zip(predictions, st.sums(g_w), st.sums(h), pre)]).reshape(-1, 2)
    c = np.repeat(ck[:, 0], st.lens)
    whole = Timelines(st, c * g_w, h)
    l_w = whole.latency(ck[:, 1], ck[:, 1] * pre)[0]
    per_profile = []
    for prof in device.mig_profiles:
        g_s = stack.gpu_us(stack.on_slice(r, device.mig_slice(prof)))
        per_profile.append(Timelines(st, c * g_s, host=whole).latency(ck[:, 1], ck[:, 1] * pre)[0])
    out = []
    rows = np.array(per_profile).T.tolist()  # [graphs][profiles]
    for pred, (ks, _), whole_us, slices_us in zip(predictions, checked, l_w.tolist(), rows):
        lat = ([_corrected(pred, l_s, whole_us) for l_s in slices_us] if pred.device == device.id
               else [_scaled_latency(pred, device, prof) for prof in device.mig_profiles])
        out.append(_advice(pred, device, ks, rule, lat))
    return out


def _advice(prediction: Prediction, dev: Device, k_sigma: float, rule: str,
            latencies: "list[tuple[float | None, str]]") -> MigAdvice:
    """The advice of ``prediction`` on ``dev`` given each profile's ``(latency ms, basis)``."""
    std = prediction.memory_mib_std
    std_missing = rule == "dippm-nas" and std is None
    if std_missing and dev.has_mig:
        _warn_once(f"no-memory-std:{prediction.memory_source}",
                   "the memory prediction (source %r) has no standard deviation: MIG fits are checked on the "
                   "mean, with no margin for its error (MigAdvice.memory_std_missing)", prediction.memory_source)
    if rule == "dippm":
        need = float(prediction.memory_mib)
    else:
        need = float(prediction.memory_mib) + (k_sigma * std if std is not None else 0.0)
    if not dev.has_mig:
        return MigAdvice(device=dev.id, supported=False, rule=rule, k_sigma=float(k_sigma), memory_needed_mib=need,
                         memory_std_mib=std, profiles=(), smallest_fit=None,
                         reason=f"device {dev.id!r} does not support MIG")

    out: list[ProfileAdvice] = []
    for p, (latency, basis) in zip(dev.mig_profiles, latencies):
        if rule == "dippm":
            limit = p.memory_gib * 1024.0
            on_ladder = (p.compute_slices, p.memory_slices) in DIPPM_LADDER and not p.media_extensions
        else:
            limit = p.usable_memory_mib
            on_ladder = True
        fits = need <= limit
        thr = (p.max_instances * prediction.batch_size / (latency / 1e3)) if latency and latency > 0 else None
        if not fits:
            margin = f" (memory {prediction.memory_mib:.0f} MiB + {k_sigma:g} x std {std:.0f} MiB)" \
                if (rule == "dippm-nas" and std is not None) else ""
            reason = f"needs {need:.0f} MiB{margin} > {limit:.0f} MiB {'usable' if rule == 'dippm-nas' else 'nominal'}"
        elif not on_ladder:
            reason = "fits, but not on DIPPM's profile ladder (1g/1, 2g/2, 3g/4, 7g/8 slices)"
        else:
            reason = ""
        note = (f"fits with {limit - need:.0f} MiB headroom and no margin for the prediction's error (the "
                f"{prediction.memory_source} memory figure has no std)") if fits and std_missing else ""
        out.append(ProfileAdvice(
            profile=p.name, compute_slices=p.compute_slices, memory_slices=p.memory_slices,
            sms=dev.profile_sms(p), memory_limit_mib=limit, fits=fits, memory_headroom_mib=limit - need,
            instances_per_gpu=p.max_instances, latency_ms=latency, latency_basis=basis,
            throughput_samples_per_s=thr, reason=reason, note=note,
        ))

    eligible = [(a, p) for a, p in zip(out, dev.mig_profiles) if a.fits and a.reason == ""]
    if eligible:
        best = min(eligible, key=lambda ap: (ap[0].memory_limit_mib, ap[1].compute_slices, ap[1].media_extensions))
        return MigAdvice(device=dev.id, supported=True, rule=rule, k_sigma=float(k_sigma), memory_needed_mib=need,
                         memory_std_mib=std, profiles=tuple(out), smallest_fit=best[0].profile,
                         memory_std_missing=std_missing)
    largest = max(out, key=lambda a: a.memory_limit_mib)
    reason = (f"none fits: the model needs {need:.0f} MiB but the largest profile {largest.profile} offers "
              f"{largest.memory_limit_mib:.0f} MiB ({'usable' if rule == 'dippm-nas' else 'nominal'})")
    return MigAdvice(device=dev.id, supported=True, rule=rule, k_sigma=float(k_sigma), memory_needed_mib=need,
                     memory_std_mib=std, profiles=tuple(out), smallest_fit=None, reason=reason,
                     memory_std_missing=std_missing)


def mig_fit_violations(advice: MigAdvice, required_mib: float) -> list[str]:
    """The profiles ``advice`` says fit whose memory limit is below ``required_mib``: recommendations that
    would run out of memory if the model needs ``required_mib`` (e.g. the eager reference's activation peak
    plus the weights, the input and the CUDA context). Empty when every fit holds it.

    Raises:
        InvalidValueError: ``required_mib`` negative or not finite, or ``advice`` not a :class:`MigAdvice`.
    """
    if not isinstance(advice, MigAdvice):
        raise InvalidValueError(f"advice must be a MigAdvice, got {type(advice).__name__}")
    if isinstance(required_mib, bool) or not isinstance(required_mib, (int, float)) or not math.isfinite(required_mib) \
            or required_mib < 0:
        raise InvalidValueError(f"required_mib must be a finite number >= 0 (MiB), got {required_mib!r}")
    return [p.profile for p in advice.profiles if p.fits and p.memory_limit_mib < required_mib]
