"""Few-shot calibration: a per-device, per-target linear correction in log space.

Given a few real measurements of one device, ``GnnPredictor.calibrate(pairs)`` fits, for every target
with labels,

    log y_calibrated = a + b * log y_predicted

with ``b`` shrunk towards 1 (ridge weight :data:`SLOPE_PRIOR`), so five measurements mostly fix the
offset and twenty can also fix the slope. The line is fitted robustly (Huber weights, so one odd label,
such as a peak-RSS figure that caught another allocation, does not move it), and then only the share of
it that the measurements can tell from their own scatter is kept:

    w = max(0, 1 - 1 / F),   F = (SSR_identity - SSR_fit) / (2 s^2),   s^2 = SSR_fit / (k - 2)

(the empirical-Bayes, positive-part James-Stein rule towards "no correction", with both sums of squares
weighted by the fit's Huber weights; ``a -> w a``, ``b -> 1 + w (b - 1)``; with k <= 2 measurements
there is no scatter to judge by and ``w = 1``). A device 1.4x off is corrected in full; five noisy labels
of a figure the predictor already gets right on average change it little. Without the shrink, five
peak-RSS measurements of one family made host-cpu memory worse on the rest of that family on every other
machine measured (e.g. 10.4 -> 13.1 % MAPE on a Zen 4 VM; docs/predictor_report.md, "Few-shot
calibration results"). :attr:`Calibration.kept` records ``w`` per target. The residual
spread of the (shrunk) fit widens the prediction's standard deviation.

On a GPU, latency is corrected on its two timelines instead of by one line: a **host factor** ``h`` and a
**GPU factor** ``g`` (:func:`fit_timeline_factors`) multiply the host times and the kernel times of each
prediction before its critical path is taken, so a host-bound model and a GPU-bound one get the correction
each needs (one factor cannot: a slower host moves only host-bound models). The factors are fitted
robustly (soft-L1) with a weak ridge towards 0 (a factor the measurements cannot see, such as the host
factor when every measured model is GPU-bound, stays near 1) in two nested levels, each shrunk by the same
evidence rule: one **overall** factor on both timelines (one parameter, ``s^2 = SSR / (k - 1)``; its share
:attr:`TimelineFactors.kept`) shrunk towards no correction, then the **host/GPU split** (``log h``,
``log g`` free; ``s^2 = SSR / (k - 2)``; its share :attr:`TimelineFactors.split_kept`) shrunk towards that
overall factor, so three measurements can already fix a common offset that they could not yet split. Two
measurements keep the two-factor fit whole; fewer leave the prediction unchanged (and say so).

On top of the common GPU factor each **op class** of :data:`CALIBRATION_CLASSES` (dense convolutions,
depthwise convolutions, other grouped convolutions, matmul/attention, and the memory-bound rest) gets its
own factor ``g_c = g * exp(d_c)`` where the measurements can tell it apart (:func:`calibration_classes`
labels the nodes; three or more measurements). The deviations ``d_c`` are fitted on the residuals the common
factors leave, with a ridge ``s^2 / CLASS_SPREAD_LOG^2`` towards 0 (``s^2``: the scatter the class fit
leaves, over its effective degrees of freedom, never below :data:`SCATTER_FLOOR_LOG`), and then each is
shrunk by its own evidence, the
positive-part rule per coefficient:

    d_c -> w_c d_c,   w_c = max(0, 1 - se_c^2 / d_c^2),   se_c^2 = s^2 [(J'J + lambda I)^-1]_cc

(``J``: the derivative of each measured model's log latency by ``d_c`` at the fit, so a class whose kernels
the measured models barely run, or run off the critical path, has a large ``se_c`` and stays at the
common factor), with ``se_c^2`` widened by ``n_c / (n_c - 1)``, ``n_c = (sum_i |J_ic|)^2 / sum_i J_ic^2`` the
effective number of measurements that run the class: a class one label alone would move (``n_c = 1``) keeps
the common factor, whatever that label's noise. :attr:`TimelineFactors.class_log`
and :attr:`TimelineFactors.class_kept` record ``w_c d_c`` and ``w_c``; ``Prediction.details`` carries the
class factors applied (``calibration_class_factor_<class>``) and their kept shares
(``calibration_class_kept_<class>``).

The correction is written as JSON to ``<cache_dir>/calibration/<device>.json`` together with the
checkpoint's identity (device, date, schema, and the CPU model of a host
checkpoint) and re-applied whenever that same checkpoint is loaded again; a file for another
checkpoint is ignored with a warning. The analytic prior of a GPU without a checkpoint
(``AnalyticPredictor.calibrate``) records :data:`ANALYTIC_IDENTITY` instead. Files written before the
op-class factors load with none. Calibrated figures have source ``"calibrated"``.

**Plausibility bounds** (:func:`calibration_problems`), the same on write and on read: every figure finite; a
line's slope ``b`` within :data:`SLOPE_BOUNDS` and its correction ``a + (b - 1) m`` within
±:data:`MAX_CORRECTION_LOG` over the log predictions ``m`` it was fitted on (:attr:`Calibration.span`; a file
without a span: at ``m = 0``, one ms, J or MiB); GPU host, GPU and op-class log factors within the same bound
(the fit's own box, so a fit never leaves it); every residual scatter within ``[0, MAX_CORRECTION_LOG]``; kept
shares within [0, 1]. A fit outside them is refused by ``calibrate()`` (an :class:`InvalidValueError` naming the
figure, the bound and the likely cause) and never written; a file outside them (hand-edited, damaged) is ignored
with a warning, and every prediction of the device says so: ``details["calibration_ignored"] = 1``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from dippm_nas._files import write_output
from dippm_nas._json import read_json_file
from dippm_nas._paths import cache_dir
from dippm_nas._schema import from_file_data
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.predictor._meta import CheckpointMeta
from dippm_nas.graph import OperatorGraph
from dippm_nas.prior import graph_facts, latency_us

__all__ = ["Calibration", "TimelineFactors", "fit_calibration", "fit_timeline_factors", "save_calibration",
           "load_calibration", "delete_calibration", "calibration_path", "calibration_classes", "calibration_details", "SLOPE_PRIOR",
           "FACTOR_PRIOR", "CALIBRATION_CLASSES", "ANALYTIC_IDENTITY", "CLASS_SPREAD_LOG", "SCATTER_FLOOR_LOG",
           "MAX_CORRECTION_LOG", "SLOPE_BOUNDS", "calibration_problems", "read_calibration", "require_plausible"]

logger = logging.getLogger(__name__)

#: Ridge weight pulling the slope towards 1 (in squared log units, like the spread of the predictions).
SLOPE_PRIOR = 0.5
#: Ridge weight pulling log host and GPU factors towards 0 (per measurement-equivalent, squared log units).
FACTOR_PRIOR = 0.05
#: Op classes whose kernels may get their own GPU factor (:func:`calibration_classes` labels the nodes):
#: dense convolutions, depthwise convolutions (at most 4 input channels per group), other grouped
#: convolutions, matmul and attention, and every other (memory-bound) kernel.
CALIBRATION_CLASSES: tuple[str, ...] = ("conv", "conv_depthwise", "conv_grouped", "matmul", "memory_bound")
#: Prior spread of a class factor around the common GPU factor, log units: the ridge on ``d_c`` is
#: ``s^2 / CLASS_SPREAD_LOG^2``. Weak on purpose (a class may run several times slower than the rest, as fp16
#: depthwise convolutions on Pascal do); the per-class evidence share does the shrinking.
CLASS_SPREAD_LOG = 1.0
#: The smallest scatter the class fit assumes, log units (repeat noise of a timed latency is about 2 %).
SCATTER_FLOOR_LOG = 0.02
#: The largest log correction a calibration may make, either way (a factor e^3 = 20.1): the box the GPU factors
#: are fitted in, and the bound on a line's correction over the predictions it was fitted on and on any fit's
#: residual scatter. The largest corrections measured in this project stay inside it -- a host CPU 1.3-1.8x off
#: (docs/predictor_report.md), fp16 depthwise convolutions on the TITAN Xp ~24x the prior, 20x the common GPU
#: factor (a class deviation at the box's edge; docs/runtime_and_host.md) -- while a fit beyond it is of
#: measurements in another unit (seconds or microseconds for ms is 1000x), of another device, or broken.
MAX_CORRECTION_LOG = 3.0
#: The range of a line's slope ``b`` (``log y = a + b log ŷ``): a prediction 10x larger is measured 3.2x to 100x
#: larger. The fit pulls ``b`` towards 1 (:data:`SLOPE_PRIOR`); a slope outside says the measurements do not
#: grow with the models' size at all, or far faster than any cost does.
SLOPE_BOUNDS: tuple[float, float] = (0.5, 2.0)

_CONTRACTION = {"matmul": "matmul", "attention": "matmul", "conv": "conv", "conv_depthwise": "conv_depthwise"}


def calibration_classes(graph: OperatorGraph) -> np.ndarray:
    """The :data:`CALIBRATION_CLASSES` entry of each node of ``graph`` (by the prior's constants class, and
    ``conv_grouped`` for a convolution with ``groups > 1`` that is not depthwise).

    Shapes:
        returns ``[num_nodes]`` str.
    """
    out = []
    for nd, c in zip(graph.nodes, graph_facts(graph).classes):
        cls = _CONTRACTION.get(c, "memory_bound")
        if cls == "conv" and int(nd.attrs.get("groups", 1) or 1) > 1:
            cls = "conv_grouped"
        out.append(cls)
    return np.array(out, dtype=object)


@dataclass(frozen=True)
class TimelineFactors:
    """Host and GPU factors of a GPU's latency, with per op-class GPU factors (see the module docstring).

    Attributes:
        host_log, gpu_log: log of the factors on host times and on kernel times (after the shrink).
        residual_std_log: scatter left by the fit, log space (widens σ).
        kept: share of the fitted overall factor (one factor on both timelines) kept (0..1).
        n: measurements used.
        class_log: ``{op class: d_c}``, the log deviation of a class of :data:`CALIBRATION_CLASSES` from the
            common GPU factor after its evidence shrink (its kernels get ``exp(gpu_log + d_c)``); empty
            when the fit had no node classes (and in files written before them).
        class_kept: ``{op class: w_c}``, the share of each class's fitted deviation kept (0..1).
        split_kept: the share of the host/GPU split around the overall factor kept (0..1; 1 in files
            written before it was recorded).
    """

    host_log: float
    gpu_log: float
    residual_std_log: float
    kept: float
    n: int
    class_log: dict[str, float] = field(default_factory=dict)
    class_kept: dict[str, float] = field(default_factory=dict)
    split_kept: float = 1.0

    @property
    def class_factors(self) -> dict[str, float]:
        """``{op class: factor on its kernel times}`` (the common GPU factor times the class's own)."""
        return {c: math.exp(self.gpu_log + d) for c, d in self.class_log.items()}

    def gpu_multiplier(self, node_classes: np.ndarray | None, num_nodes: int) -> np.ndarray | float:
        """Factor on each node's kernel time: the common one, or per node from its class."""
        if node_classes is None or not self.class_log or len(node_classes) != num_nodes:
            return math.exp(self.gpu_log)
        d = np.array([self.class_log.get(str(c), 0.0) for c in node_classes], dtype=np.float64)
        return np.exp(self.gpu_log + d)

    def apply(self, gpu_us: np.ndarray, host_us: np.ndarray, prefix_us: float,
              node_classes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
        """The corrected ``(gpu_us, host_us, prefix_us)`` of one pass (``node_classes`` from
        :func:`calibration_classes`: the class factors apply; ``None``: the common GPU factor only)."""
        h = math.exp(self.host_log)
        return gpu_us * self.gpu_multiplier(node_classes, len(gpu_us)), host_us * h, prefix_us * h

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TimelineFactors":
        """From the JSON form (:func:`dataclasses.asdict`); files without class factors load with none."""
        return cls(host_log=float(d["host_log"]), gpu_log=float(d["gpu_log"]),
                   residual_std_log=float(d["residual_std_log"]), kept=float(d["kept"]), n=int(d["n"]),
                   class_log={str(c): float(v) for c, v in (d.get("class_log") or {}).items()},
                   class_kept={str(c): float(v) for c, v in (d.get("class_kept") or {}).items()},
                   split_kept=float(d.get("split_kept", 1.0)))


def fit_timeline_factors(parts: Sequence[tuple[np.ndarray, np.ndarray, float]],
                         measured_ms: Sequence[float], *,
                         node_classes: Sequence[np.ndarray] | None = None) -> TimelineFactors:
    """Fit host and GPU factors (and op-class GPU factors) from predicted timelines and measured latencies.

    Args:
        parts: per measurement, the predicted ``(gpu_us [num_nodes], host_us [num_nodes], prefix_us)`` of the
            pass (kernel times already corrected by the network, the host times of the runtime and host).
        measured_ms: the measured latency of each, ms (> 0).
        node_classes: per measurement, the :func:`calibration_classes` of its nodes (``[num_nodes]``); with
            them, classes the measurements can tell apart get their own GPU factor; ``None``: common factors only.

    Raises:
        InvalidValueError: fewer than two measurements, lengths that differ, or a latency that is not > 0.
    """
    from scipy.optimize import least_squares

    k = len(parts)
    if k != len(measured_ms):
        raise InvalidValueError(f"parts and measured_ms must pair up, got {k} and {len(measured_ms)}")
    if node_classes is not None and len(node_classes) != k:
        raise InvalidValueError(f"node_classes must give one array per measurement, got {len(node_classes)} for {k}")
    if k < 2:
        raise InvalidValueError(f"timeline factors need at least 2 measurements, got {k}")
    y = np.array([float(v) for v in measured_ms])
    bad = [float(v) for v in y if not (math.isfinite(v) and v > 0)]
    if bad:
        raise InvalidValueError(f"measured latencies must be finite and > 0 ms, got {bad} in {list(measured_ms)}")
    ly = np.log(y)
    parts = [(np.asarray(g, dtype=np.float64), np.asarray(h, dtype=np.float64), float(pre)) for g, h, pre in parts]
    if node_classes is not None:
        sizes = [(i, len(nc), len(g)) for i, (nc, (g, _, _)) in enumerate(zip(node_classes, parts)) if len(nc) != len(g)]
        if sizes:
            raise InvalidValueError(f"node_classes must give one class per node of each measurement; (measurement, "
                                    f"classes, nodes) that differ: {sizes[:5]}")

    def resid(theta: np.ndarray) -> np.ndarray:
        h, g = math.exp(theta[0]), math.exp(theta[1])
        return np.array([math.log(latency_us(gu * g, hu * h, pre * h) / 1e3) for gu, hu, pre in parts]) - ly

    def objective(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([resid(theta), math.sqrt(FACTOR_PRIOR * k) * theta])

    box = (-MAX_CORRECTION_LOG, MAX_CORRECTION_LOG)
    fit = least_squares(objective, np.zeros(2), loss="soft_l1", f_scale=0.1, bounds=box)
    r0, r1 = resid(np.zeros(2)), resid(fit.x)
    ssr_identity, ssr = float(r0 @ r0), float(r1 @ r1)
    w, w_split, theta = 1.0, 1.0, fit.x  # k = 2: nothing to judge the fit by, kept whole
    if k > 2:
        # one overall factor first (1 parameter), its evidence share; then the host/GPU split around it
        fa = least_squares(lambda a: np.concatenate([resid(np.array([a[0], a[0]])), math.sqrt(FACTOR_PRIOR * k) * a]),
                           np.zeros(1), loss="soft_l1", f_scale=0.1, bounds=box)
        ra = resid(np.array([fa.x[0], fa.x[0]]))
        w = _share(ssr_identity - float(ra @ ra), float(ra @ ra) / (k - 1), 1)
        overall = np.array([w * fa.x[0]] * 2)
        rb = resid(overall)
        w_split = _share(float(rb @ rb) - ssr, ssr / (k - 2), 1)
        theta = overall + w_split * (fit.x - overall)
    class_log: dict[str, float] = {}
    class_kept: dict[str, float] = {}
    if node_classes is not None and k >= 3:
        class_log, class_kept = _fit_class_deviations(parts, ly, theta, node_classes)
    tf = TimelineFactors(host_log=float(theta[0]), gpu_log=float(theta[1]), residual_std_log=0.0, kept=w, n=k,
                         class_log=class_log, class_kept=class_kept, split_kept=w_split)
    ncs = list(node_classes) if node_classes is not None else [None] * k
    rw = np.array([math.log(latency_us(*tf.apply(gu, hu, pre, nc)) / 1e3) for (gu, hu, pre), nc in zip(parts, ncs)]) - ly
    s = float(np.sqrt((rw @ rw) / max(k - 1, 1)))
    return dataclasses.replace(tf, residual_std_log=s)


def _share(gain: float, s2: float, params: int) -> float:
    """The positive-part evidence share ``max(0, 1 - params * s2 / gain)`` (0 without a gain, 1 without scatter)."""
    if gain <= 0:
        return 0.0
    if s2 <= 1e-24:
        return 1.0
    return max(0.0, 1.0 - params * s2 / gain)


def _fit_class_deviations(parts: Sequence[tuple[np.ndarray, np.ndarray, float]], ly: np.ndarray,
                          theta: np.ndarray, node_classes: Sequence[np.ndarray]
                          ) -> tuple[dict[str, float], dict[str, float]]:
    """The op-class deviations ``d_c`` from the common GPU factor and their kept shares ``w_c`` (module
    docstring), for the classes some measured model runs; ``theta`` = the shrunk ``(log h, log g)``."""
    from scipy.optimize import least_squares

    k = len(parts)
    present = [c for c in CALIBRATION_CLASSES
               if any(np.any((np.asarray(nc) == c) & (gu > 0)) for nc, (gu, _, _) in zip(node_classes, parts))]
    if not present:
        return {}, {}
    h = math.exp(theta[0])
    # per measurement: kernel times grouped by class (columns of ``present``), the rest at the common factor
    masks = [np.stack([np.asarray(nc) == c for c in present]) for nc in node_classes]

    def resid(d: np.ndarray) -> np.ndarray:
        out = np.empty(k)
        for i, ((gu, hu, pre), m) in enumerate(zip(parts, masks)):
            mult = np.exp(theta[1] + d @ m.astype(np.float64))
            out[i] = math.log(latency_us(gu * mult, hu * h, pre * h) / 1e3)
        return out - ly

    p = len(present)
    rr = resid(np.zeros(p))
    s2 = max(float(rr @ rr) / max(k - 2, 1), SCATTER_FLOOR_LOG ** 2)
    d = np.zeros(p)
    a_inv = np.eye(p) * CLASS_SPREAD_LOG ** 2
    for _ in range(3):  # the ridge is s^2 / spread^2, s^2 the scatter the class fit leaves: iterate the two
        lam = s2 / CLASS_SPREAD_LOG ** 2
        fit = least_squares(lambda v: np.concatenate([resid(v), math.sqrt(lam) * v]), d,
                            bounds=(-MAX_CORRECTION_LOG, MAX_CORRECTION_LOG))
        d = fit.x
        jac = np.asarray(fit.jac)[:k]
        a_inv = np.linalg.inv(jac.T @ jac + lam * np.eye(p))
        dof = k - 2 - float(np.trace(jac @ a_inv @ jac.T))
        rf = resid(d)
        s2 = max(float(rf @ rf) / max(dof, 1.0), SCATTER_FLOOR_LOG ** 2)
    # a class run by few measurements: its deviation fits their labels' noise; widen its error by the
    # small-sample factor n / (n - 1) of its effective number of measurements (1 measurement: no evidence)
    x = np.abs(jac)
    n_eff = x.sum(0) ** 2 / np.maximum((x ** 2).sum(0), 1e-300)
    se2 = s2 * np.diag(a_inv) * np.where(n_eff > 1.0 + 1e-9, n_eff / np.maximum(n_eff - 1.0, 1e-9), np.inf)
    w = np.where(d ** 2 > 1e-30, np.clip(1.0 - se2 / np.maximum(d ** 2, 1e-30), 0.0, 1.0), 0.0)
    return ({c: float(w[j] * d[j]) for j, c in enumerate(present)}, {c: float(w[j]) for j, c in enumerate(present)})


def calibration_details(tf: TimelineFactors) -> dict[str, float]:
    """``Prediction.details`` entries of a latency corrected by ``tf``: ``calibration_host_factor``,
    ``calibration_gpu_factor`` (the common one), ``calibration_kept_latency_ms`` (the overall factor's kept
    share), ``calibration_split_kept`` (the host/GPU split's), and per op
    class with its own factor ``calibration_class_factor_<class>`` (on that class's kernel times) and
    ``calibration_class_kept_<class>`` (the share of its deviation kept)."""
    d = {"calibration_host_factor": math.exp(tf.host_log), "calibration_gpu_factor": math.exp(tf.gpu_log),
         "calibration_kept_latency_ms": tf.kept, "calibration_split_kept": tf.split_kept}
    for c, f in tf.class_factors.items():
        d[f"calibration_class_factor_{c}"] = f
        d[f"calibration_class_kept_{c}"] = float(tf.class_kept.get(c, 0.0))
    return d


_TARGETS = ("latency_ms", "energy_j", "memory_mib")


@dataclass(frozen=True)
class Calibration:
    """A fitted correction for one device.

    Attributes:
        device: catalogue id.
        checkpoint: identity of the checkpoint it was fitted for (``device@date/schema``).
        coef: ``{target: [a, b, residual_std_log]}``.
        n: ``{target: measurements used}``.
        date: ISO time of the fit.
        kept: ``{target: w}``, the share of the fitted correction kept (0..1; see the module docstring);
            empty in files written before it was recorded (their correction was kept whole).
        timeline: a GPU's latency factors (the fields of :class:`TimelineFactors`, op-class factors included);
            where present they, not ``coef["latency_ms"]``, correct latency. ``None`` in files written before
            them and for CPUs; files written before the op-class factors load with none.
        span: ``{target: [lo, hi]}``, the range of the log predictions of the measurements each line was
            fitted on (its plausibility is checked over it); empty in files written before it was recorded.
    """

    device: str
    checkpoint: str
    coef: dict[str, list[float]]
    n: dict[str, int]
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    kept: dict[str, float] = field(default_factory=dict)
    timeline: dict[str, Any] | None = None
    span: dict[str, list[float]] = field(default_factory=dict)

    def has(self, target: str) -> bool:
        return target in self.coef or (target == "latency_ms" and self.timeline is not None)

    @property
    def timeline_factors(self) -> TimelineFactors | None:
        """The GPU latency factors, or ``None``."""
        if self.timeline is None:
            return None
        return TimelineFactors.from_dict(self.timeline)

    @property
    def gpu_class_factors(self) -> dict[str, float]:
        """``{op class: factor on its kernel times}`` of a GPU's latency calibration (empty: the common GPU
        factor applies to every kernel, or no timeline factors)."""
        tf = self.timeline_factors
        return {} if tf is None else tf.class_factors

    @property
    def gpu_class_kept(self) -> dict[str, float]:
        """``{op class: share of its fitted deviation kept}`` (0..1; see :class:`TimelineFactors`)."""
        tf = self.timeline_factors
        return {} if tf is None else dict(tf.class_kept)

    def apply(self, target: str, mean_log: float, std_log: float) -> tuple[float, float]:
        """Corrected ``(mean_log, std_log)`` of one target."""
        a, b, s = self.coef[target]
        return a + b * mean_log, math.hypot(b * std_log, s)


def checkpoint_identity(meta: "CheckpointMeta") -> str:
    ident = f"{meta.device}@{meta.date}/schema{meta.feature_schema_version}/{meta.feature_style}"
    if meta.host is not None:  # host-cpu checkpoints of two CPU models can share a date
        ident += f"/cpu={meta.host['cpu_model']}"
    return ident


def fit_calibration(device: str, meta: "CheckpointMeta", pred_log: np.ndarray,
                    labels: Sequence[Mapping[str, float]], *, targets: Sequence[str] | None = None) -> Calibration:
    """Fit the correction from predictions (log, ``[n, 3]``) and measured labels (units of the targets).

    Raises:
        InvalidValueError: no target has a label.
    """
    coef: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    kept: dict[str, float] = {}
    span: dict[str, list[float]] = {}
    for t_i, t in enumerate(_TARGETS):
        if targets is not None and t not in targets:
            continue
        rows = [(float(pred_log[i, t_i]), math.log(y[t])) for i, y in enumerate(labels) if t in y and y[t] > 0]
        if not rows:
            continue
        m = np.array([r[0] for r in rows])
        y = np.array([r[1] for r in rows])
        a, b, wts = _robust_line(m, y)
        w = _evidence_share(m, y, a, b, wts)
        a, b = w * a, 1.0 + w * (b - 1.0)
        res = y - (a + b * m)
        s = float(np.sqrt((res ** 2).sum() / max(len(rows) - 1, 1))) if len(rows) > 1 else 0.0
        coef[t] = [a, b, s]
        counts[t] = len(rows)
        kept[t] = w
        span[t] = [float(m.min()), float(m.max())]
    if not coef:
        raise InvalidValueError(f"no measurement holds a label for the targets {list(targets or _TARGETS)}")
    return Calibration(device=device, checkpoint=checkpoint_identity(meta), coef=coef, n=counts, kept=kept,
                       span=span)


#: Huber tuning constant, in units of the residuals' robust scale (95 % efficiency under normal noise).
_HUBER_C = 1.345


def _ridge_line(m: np.ndarray, y: np.ndarray, wts: np.ndarray) -> tuple[float, float]:
    """Weighted least squares ``y = a + b m`` with the slope's ridge towards 1 (:data:`SLOPE_PRIOR`)."""
    tot = float(wts.sum())
    mm, ym = float(wts @ m) / tot, float(wts @ y) / tot
    mc, yc = m - mm, y - ym
    b = float(((wts * mc) @ yc + SLOPE_PRIOR) / ((wts * mc) @ mc + SLOPE_PRIOR))
    return ym - b * mm, b


def _robust_line(m: np.ndarray, y: np.ndarray, *,
                 iterations: int = 20) -> tuple[float, float, np.ndarray]:
    """:func:`_ridge_line` with Huber weights (IRLS; scale = 1.4826 x the residuals' MAD): ``(a, b,
    weights)``. Fewer than three rows, or residuals with no spread, give the plain fit (weights 1)."""
    wts = np.ones(len(m))
    a, b = _ridge_line(m, y, wts)
    if len(m) < 3:
        return a, b, wts
    for _ in range(iterations):
        r = y - (a + b * m)
        scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        if scale <= 1e-12:
            break
        new = np.minimum(1.0, _HUBER_C * scale / np.maximum(np.abs(r), 1e-12))
        a, b = _ridge_line(m, y, new)
        converged = np.allclose(new, wts, atol=1e-6)
        wts = new
        if converged:
            break
    return a, b, wts


def _evidence_share(m: np.ndarray, y: np.ndarray, a: float, b: float, wts: np.ndarray) -> float:
    """Share ``w`` of the correction ``(a, b)`` that ``k`` measurements support (module docstring): 1 with
    k <= 2 or a perfect fit, 0 when the line explains no more than the scatter it leaves. Both sums of
    squares carry the fit's Huber weights, so a label the line set aside does not count as scatter."""
    k = len(m)
    if k <= 2:
        return 1.0
    ssr_identity = float(wts @ (y - m) ** 2)
    ssr = float(wts @ (y - a - b * m) ** 2)
    gain = ssr_identity - ssr
    if gain <= 0:
        return 0.0
    s2 = ssr / (k - 2)
    if s2 <= 1e-24:
        return 1.0
    return max(0.0, 1.0 - 2.0 * s2 / gain)


#: The largest calibration file read, bytes (one with every op-class factor is under 4 KB).
MAX_CALIBRATION_FILE_BYTES = 1 << 20


def calibration_path(device: str) -> Path:
    return cache_dir() / "calibration" / f"{device}.json"


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def calibration_problems(cal: Calibration) -> list[str]:
    """Why ``cal`` is implausible (the bounds of the module docstring), one line per figure; empty when it is not.

    A fit outside the bounds is refused on write; a file outside them is ignored on read."""
    out: list[str] = []
    lim = MAX_CORRECTION_LOG
    for t, c in cal.coef.items():
        if not (isinstance(c, (list, tuple)) and len(c) == 3 and all(map(_number, c))):
            out.append(f"coef[{t!r}] must be three finite numbers [a, b, residual_std_log], got {c!r}")
            continue
        a, b, res = (float(v) for v in c)
        if not SLOPE_BOUNDS[0] <= b <= SLOPE_BOUNDS[1]:
            out.append(f"{t} slope b = {b:.4g} lies outside SLOPE_BOUNDS {list(SLOPE_BOUNDS)}")
        span = cal.span.get(t) or [0.0, 0.0]
        if not (isinstance(span, (list, tuple)) and len(span) == 2 and all(map(_number, span))):
            out.append(f"span[{t!r}] must be two finite log predictions [lo, hi], got {span!r}")
            continue
        worst = max((a + (b - 1.0) * float(m) for m in span), key=abs)
        if abs(worst) > lim:
            out.append(f"{t} correction x{math.exp(min(max(worst, -700.0), 700.0)):.3g} (log {worst:.4g}) at the "
                       f"predictions it was fitted on lies beyond x{math.exp(lim):.3g} either way "
                       f"(MAX_CORRECTION_LOG = {lim})")
        if not 0.0 <= res <= lim:
            out.append(f"{t} residual scatter {res:.4g} (log) lies outside [0, {lim}]")
    for t, w in cal.kept.items():
        if not (_number(w) and 0.0 <= w <= 1.0):
            out.append(f"kept[{t!r}] must be a share in [0, 1], got {w!r}")
    if cal.timeline is not None:
        tf = cal.timeline_factors
        assert tf is not None
        logs = {"host_log": tf.host_log, "gpu_log": tf.gpu_log,
                **{f"class_log[{c!r}]": v for c, v in tf.class_log.items()}}
        for name, v in logs.items():
            if not (math.isfinite(v) and abs(v) <= lim + 1e-9):
                out.append(f"timeline {name} = {v:.4g} lies beyond ±{lim} (MAX_CORRECTION_LOG: a factor "
                           f"x{math.exp(lim):.3g} either way)")
        if not (math.isfinite(tf.residual_std_log) and 0.0 <= tf.residual_std_log <= lim):
            out.append(f"timeline residual scatter {tf.residual_std_log:.4g} (log) lies outside [0, {lim}]")
        shares = {"kept": tf.kept, "split_kept": tf.split_kept,
                  **{f"class_kept[{c!r}]": w for c, w in tf.class_kept.items()}}
        out += [f"timeline {n} must be a share in [0, 1], got {w!r}" for n, w in shares.items() if not 0.0 <= w <= 1.0]
        unknown = sorted(set(tf.class_log) - set(CALIBRATION_CLASSES))
        if unknown:
            out.append(f"timeline classes {unknown} are not among {list(CALIBRATION_CLASSES)}")
    return out


def require_plausible(cal: Calibration) -> None:
    """Raise :class:`InvalidValueError` when ``cal`` is implausible (:func:`calibration_problems`): a fit that
    must not answer for the device, nor be written."""
    problems = calibration_problems(cal)
    if problems:
        raise InvalidValueError(
            f"the calibration of {cal.device} is implausible and was not applied: {'; '.join(problems)}. Check the "
            "measurements: latency in ms, energy in J, memory in MiB, each of a pass on this device "
            f"({sum(cal.n.values()) if cal.n else '?'} figures)")


def save_calibration(cal: Calibration) -> Path:
    """Write the calibration JSON; returns its path.

    Raises:
        InvalidValueError: ``cal`` is implausible (:func:`calibration_problems`); nothing is written.
    """
    require_plausible(cal)
    p = calibration_path(cal.device)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_output(p, json.dumps(asdict(cal), indent=1, sort_keys=True) + "\n", "calibration file",
                 error=InvalidValueError)
    logger.info("calibration of %s written to %s", cal.device, p)
    return p


def delete_calibration(device: str) -> None:
    p = calibration_path(device)
    if p.is_file():
        p.unlink()


def calibration_from_data(data: Any, origin: str) -> Calibration:
    """A :class:`Calibration` of JSON data read from outside the process (a file, a stored adaptation), its fields
    and its timeline factors checked against the dataclasses' (wrong types never reach a prediction); the rules
    between values are :func:`calibration_problems`'.

    Raises:
        InvalidValueError: naming ``origin``, the field and the value.
    """
    cal = from_file_data(Calibration, data, origin)
    tf = None if cal.timeline is None else from_file_data(TimelineFactors, cal.timeline, f"{origin}: timeline")
    unknown = sorted(set(tf.class_log) - set(CALIBRATION_CLASSES)) if tf is not None else []
    if unknown:
        raise InvalidValueError(f"{origin}: timeline classes must be among {list(CALIBRATION_CLASSES)}, got "
                                f"{unknown}")
    return cal


def read_calibration(device: str, meta: "CheckpointMeta | str") -> tuple[Calibration | None, str]:
    """The persisted calibration of ``device`` if it was fitted for this checkpoint and is plausible, and ``""``;
    else ``None`` and why the file was ignored (``""``: there is no file). Every ignored file is logged with a
    warning.

    Args:
        device: catalogue id.
        meta: the loaded checkpoint's metadata, or the identity string of what answers for the device
            (:data:`ANALYTIC_IDENTITY` formatted with the device for the analytic prior).
    """
    p = calibration_path(device)
    if not p.is_file():
        return None, ""
    origin = f"calibration file {p}"
    try:
        # the file's fields and the timeline factors' against the dataclasses' (wrong types never reach a
        # prediction); the rules between values are calibration_problems'
        cal = calibration_from_data(read_json_file(p, f"cannot read {origin}", InvalidValueError,
                                                   max_bytes=MAX_CALIBRATION_FILE_BYTES), origin)
        problems = calibration_problems(cal)
    except DippmNasError as e:
        logger.warning("ignoring unreadable calibration file %s (predictions of %s are uncalibrated until it is "
                       "fitted again): %s", p, device, e)
        return None, f"unreadable: {e}"
    ident = meta if isinstance(meta, str) else checkpoint_identity(meta)
    if cal.checkpoint != ident:
        logger.warning("ignoring calibration %s: fitted for checkpoint %s, loaded checkpoint is %s", p,
                       cal.checkpoint, ident)
        return None, f"fitted for checkpoint {cal.checkpoint}"
    if problems:
        logger.warning("ignoring implausible calibration file %s (predictions of %s carry "
                       "details['calibration_ignored'] = 1): %s", p, device, "; ".join(problems))
        return None, "implausible: " + "; ".join(problems)
    return cal, ""


def load_calibration(device: str, meta: "CheckpointMeta | str") -> Calibration | None:
    """The persisted calibration of ``device`` if it was fitted for this checkpoint and is plausible, else
    ``None`` (:func:`read_calibration`, which also says why a file was ignored)."""
    return read_calibration(device, meta)[0]


#: Identity a calibration of the analytic prior (a device without a checkpoint) is recorded with.
ANALYTIC_IDENTITY = "{device}@analytic-prior"
