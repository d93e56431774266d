"""The validation loop's side of the path choice (:mod:`dippm_nas.validation._path_choice`).

:class:`PathPredictor` answers a device's predictions through the chosen path, naming it in
``labels["prediction_path"]``: the (adapted) network, or the analytic prior with its factors calibrated on the
study's measurements; everything else (``adapt``, ``refresh_adaptation``, ``adaptation``...) is the network's.
:class:`PathRounds` is what a :class:`~dippm_nas.validation.ParetoValidator` with ``choose_path`` keeps: each job's
pre-reveal predictions of both paths (:meth:`PathRounds.paths_of`, stored in the job's ``predicted["paths"]``), the
scoring of each round's newly measured jobs, the prior's refit, and the state in the queue's database.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

from dippm_nas.capture import assemble
from dippm_nas.deployment import Deployment
from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError, ValidationError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import AnalyticPredictor, BasePredictor, get_predictor, set_predictor
from dippm_nas.spec import InputSpec
from dippm_nas.trial import TrialRecord
from dippm_nas.validation._calibrate import CalibratedPredictor, fit_calibration
from dippm_nas.validation._path_choice import PATH_LABEL, PREDICTION_PATHS, PathChoice
from dippm_nas.validation._queue import Job, JobQueue

__all__ = ["PathPredictor", "PathRounds", "BUDGET_FIGURES"]

logger = logging.getLogger(__name__)

#: The forward-pass figures a budget can bound, whose feasibility the ``"feasibility"`` yardstick classifies.
BUDGET_FIGURES: tuple[str, ...] = ("latency_ms", "energy_j", "memory_mib")


#: what a :class:`PathPredictor` holds itself; any other attribute is the network's
_OWN = frozenset({"network", "prior", "path", "device", "_resolved_device"})


class PathPredictor(BasePredictor):
    """A device's predictions through the chosen path (see the module docstring).

    Args:
        network: the device's predictor with a network (adapted by the validation loop).
        prior: the analytic prior with its calibrated factors.
        path: one of :data:`~dippm_nas.validation.PREDICTION_PATHS`.
    """

    def __init__(self, network: BasePredictor, prior: BasePredictor, path: str = "network") -> None:
        if path not in PREDICTION_PATHS:
            raise ValidationError(f"path must be one of {PREDICTION_PATHS}, got {path!r}")
        self.__dict__.update(network=network, prior=prior, path=path, device=network.device)

    def __getattr__(self, name: str) -> Any:  # the network's adaptation, calibration, cache...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["network"], name)

    def __setattr__(self, name: str, value: Any) -> None:  # ``p.calibration = ...`` sets the network's
        if name in _OWN:
            self.__dict__[name] = value
        else:
            setattr(self.network, name, value)

    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str | None = None, host: Any = None, deployment: Any = None) -> list[Prediction]:
        src = self.network if self.path == "network" else self.prior
        extra = {} if deployment is None else {"deployment": deployment}
        preds = src.predict_graphs(graphs, mig=mig, k_sigma=k_sigma, runtime=runtime, host=host, **extra)
        return [dataclasses.replace(p, labels={**p.labels, PATH_LABEL: self.path}) for p in preds]

    def calibrate(self, measurements: Sequence[Any], **kwargs: Any) -> Any:
        """The network's :meth:`~dippm_nas.predictor.BasePredictor.calibrate`."""
        return self.network.calibrate(measurements, **kwargs)

    def adapt(self, measurements: Sequence[Any], **kwargs: Any) -> Any:
        """The network's :meth:`~dippm_nas.predictor.BasePredictor.adapt`."""
        return self.network.adapt(measurements, **kwargs)

    def __repr__(self) -> str:
        return f"PathPredictor({self.network!r}, prior={self.prior!r}, path={self.path!r})"


def _figures(p: Prediction) -> dict[str, float | None]:
    return {"latency_ms": p.latency_ms, "latency_ms_std": p.latency_ms_std, "energy_j": p.energy_j,
            "energy_j_std": p.energy_j_std, "memory_mib": p.memory_mib, "memory_mib_std": p.memory_mib_std,
            "latency_ms_uncalibrated": float(p.details.get("uncalibrated_latency_ms", p.latency_ms))}


def _admitted(fig: dict[str, Any], limits: dict[str, float], k_sigmas: dict[str, float]) -> bool:
    """Whether a path's figures pass every budget as ``Budgets`` checks one: mean + k σ (σ missing: the mean)."""
    for name, limit in limits.items():
        mean = fig.get(name)
        if mean is None:
            continue
        std = fig.get(f"{name}_std") or 0.0
        if mean + k_sigmas.get(name, 0.0) * std > limit:
            return False
    return True


def _fits(job: Job, limits: dict[str, float]) -> bool:
    """Whether the measurement meets every budget it has a figure of (a CPU's RSS delta is not a peak memory)."""
    r = job.result or {}
    for name, limit in limits.items():
        v = r.get(name)
        if v is None or (name == "memory_mib" and r.get("memory_source") == "rss_delta"):
            continue
        if float(v) > limit:
            return False
    return True


class PathRounds:
    """What a validator with ``choose_path`` keeps (see the module docstring).

    Args:
        device: the validation device's catalogue id.
        deployment: the validation deployment (every prediction is for it).
        budgets_apply: whether the trials' budgets apply to the measured figures (no ``batch_size`` / ``dtype``
            override): only then is the yardstick the feasibility classification.
    """

    def __init__(self, device: str, deployment: Deployment, *, budgets_apply: bool) -> None:
        self.device, self.deployment, self.budgets_apply = device, deployment, budgets_apply
        self.choice: PathChoice | None = None
        self.prior: BasePredictor = AnalyticPredictor(device, load_calibration=False)
        self._graphs: dict[int, OperatorGraph] = {}
        self._loaded: set[str] = set()

    def load(self, queue: JobQueue, study: str) -> None:
        """Read the study's stored state once (a resumed study goes on with its choice, installed at once; without
        one the device's predictor stays as it is until a round scores the paths)."""
        if study in self._loaded:
            return
        self._loaded.add(study)
        state = queue.path_choice(study, self.device)
        if state is not None:
            self.choice = PathChoice.from_dict(state)
            self.prior = self._fit_prior(queue.jobs(study=study, device=self.device, status="done"))
            logger.info("prediction path on %s read from the queue: %s", self.device, self.choice.describe())
            self.install()

    @property
    def path(self) -> str:
        return "network" if self.choice is None else self.choice.path

    def state(self) -> dict[str, Any] | None:
        """The choice as a round report and the summary show it (:meth:`PathChoice.to_dict` without ``seen``);
        ``None`` before a round scored the paths."""
        return None if self.choice is None else {k: v for k, v in self.choice.to_dict().items() if k != "seen"}

    def install(self) -> None:
        """Make :func:`dippm_nas.predict` answer the device through the chosen path."""
        current = get_predictor(self.device)
        network = current.network if isinstance(current, PathPredictor) else current
        set_predictor(self.device, PathPredictor(network, self.prior, self.path))

    def paths_of(self, network: BasePredictor, space: str, config: dict[str, Any], spec: InputSpec,
                 record: TrialRecord) -> dict[str, Any]:
        """Both paths' predictions of a job, made now, before its measurement (``predicted["paths"]``), and the
        trial's budgets where they apply to the measurement."""
        graph = assemble(space, config, spec)
        out: dict[str, Any] = {}
        for name, p in (("network", network), ("prior", self.prior)):
            out[name] = _figures(p.predict_graphs([graph], mig=False, deployment=self.deployment)[0])
        limits = {n: float(v) for n, v in record.limits.items() if n in BUDGET_FIGURES} if self.budgets_apply else {}
        if limits:
            out["limits"] = limits
            out["k_sigmas"] = {n: float(record.k_sigmas.get(n, 0.0)) for n in limits}
        return out

    def after_round(self, queue: JobQueue, study: str) -> PathChoice | None:
        """Score the round's newly measured jobs, refit the prior on every measurement, install the winner and
        store the state; ``None`` while no job with both paths' predictions was measured."""
        done = queue.jobs(study=study, device=self.device, status="done")
        scored = [j for j in done if (j.result or {}).get("status") == "ok" and isinstance(j.predicted.get("paths"),
                                                                                            dict)
                  and (j.result or {}).get("latency_ms")]
        if not scored and self.choice is None:
            return None
        if self.choice is None:
            self.choice = PathChoice(yardstick="feasibility" if any("limits" in j.predicted["paths"] for j in scored)
                                     else "order")
        new = [j for j in scored if str(j.trial_number) not in self.choice.seen]
        if self.choice.yardstick == "order":
            truth: list[Any] = [float(j.result["latency_ms"]) for j in new]
            said = {p: [float(j.predicted["paths"][p]["latency_ms"]) for j in new] for p in PREDICTION_PATHS}
        else:
            new = [j for j in new if "limits" in j.predicted["paths"]]
            truth = [_fits(j, j.predicted["paths"]["limits"]) for j in new]
            said = {p: [_admitted(j.predicted["paths"][p], j.predicted["paths"]["limits"],
                                  j.predicted["paths"]["k_sigmas"]) for j in new] for p in PREDICTION_PATHS}
        before = self.choice.path
        self.choice.score_round([j.trial_number for j in new], truth, said)
        self.prior = self._fit_prior(done)
        self.install()
        queue.save_path_choice(study, self.device, self.choice.to_dict())
        log = logger.warning if before != self.choice.path and self.choice.path == "prior" else logger.info
        log("prediction path on %s after %d new measurements: %s", self.device, len(new), self.choice.describe())
        return self.choice

    def _graph(self, job: Job) -> OperatorGraph:
        g = self._graphs.get(job.id)
        if g is None:
            g = self._graphs[job.id] = assemble(job.space, job.config, InputSpec.from_dict(job.spec))
        return g

    def _fit_prior(self, jobs: Sequence[Job]) -> BasePredictor:
        """The analytic prior with its factors fitted on the ``"ok"`` measurements (from its own uncalibrated
        predictions, so refitting never compounds): on a GPU its host, GPU and op-class factors, elsewhere one
        latency factor; fewer than two measurements, or a fit refused: the prior as it is, logged."""
        ok = [j for j in jobs if (j.result or {}).get("status") == "ok" and (j.result or {}).get("latency_ms")
              and isinstance(j.predicted.get("paths"), dict)]
        prior = AnalyticPredictor(self.device, load_calibration=False)
        if len(ok) < 2:
            return prior
        try:
            if resolve_device(self.device).kind == "gpu":
                pairs = [(self._graph(j), {"latency_ms": float(j.result["latency_ms"])}) for j in ok]
                prior.calibrate(pairs, persist=False, deployment=self.deployment)
                return prior
            raw = [dataclasses.replace(j, predicted={"latency_ms": j.predicted["paths"]["prior"][
                "latency_ms_uncalibrated"]}) for j in ok]
            return CalibratedPredictor(prior, fit_calibration(raw, self.device, min_rows=2))
        except (DippmNasError, KeyError, TypeError, ValueError) as e:
            logger.info("the prior's factors on %s were not refitted (%s): the prior as it is", self.device, e)
            return prior


