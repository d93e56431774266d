"""The loop closed: every real measurement of a validation job adapts the predictor of its device.

:func:`feed_adaptation` rebuilds the job's graph from its search space, config and measured input spec
(:func:`dippm_nas.capture.assemble`, from the conversion cache) and hands the measured figures to
``predictor.adapt(..., persist=True)`` for the key (device, deployment, the job's search space), stored in the
queue's own database: the rows of every worker land there, and every process predicting for the key loads the
newest version (``GnnPredictor.refresh_adaptation``). Predictors without a network (the analytic prior) are
left to the factor calibration.
"""

from __future__ import annotations

import logging
from typing import Any

from dippm_nas.capture import assemble
from dippm_nas.deployment import Deployment
from dippm_nas.errors import DippmNasError
from dippm_nas.predictor import get_predictor
from dippm_nas.spec import InputSpec
from dippm_nas.validation._calibrate import CalibratedPredictor
from dippm_nas.validation._path_rounds import PathPredictor
from dippm_nas.validation._queue import Job

__all__ = ["feed_adaptation", "adaptable_predictor", "adapt_storage_of"]

logger = logging.getLogger(__name__)

_FIGURES = ("latency_ms", "energy_j", "memory_mib")


def adaptable_predictor(device: str) -> Any | None:
    """The device's predictor when it has a network to adapt (``adapt`` and ``refresh_adaptation``), else ``None``."""
    p = get_predictor(device)
    p = p.network if isinstance(p, PathPredictor) else p  # a chosen path's: the network behind it
    base = p.base if isinstance(p, CalibratedPredictor) else p
    return base if callable(getattr(base, "adapt", None)) and callable(getattr(base, "refresh_adaptation", None)) \
        else None


def adapt_storage_of(queue_url: str) -> str | None:
    """Where the adaptations of a queue live: its own database, or the cache directory's store for a private
    in-memory queue (whose database no other connection sees)."""
    return None if queue_url in ("sqlite://", "sqlite:///:memory:") else queue_url


def feed_adaptation(job: Job, measurement: Any, storage: str | None) -> Any | None:
    """Adapt the predictor of ``job.device`` on one ``"ok"`` measurement of the job (see the module docstring).

    Returns:
        The predictor's active adaptation, or ``None`` (not ``"ok"``, no figure, no network, or fewer than two
        measured graphs stored for the key yet); a graph that cannot be rebuilt is logged, not raised.
    """
    if getattr(measurement, "status", "ok") != "ok":
        return None
    figures = {t: float(getattr(measurement, t)) for t in _FIGURES
               if getattr(measurement, t, None) is not None and float(getattr(measurement, t)) > 0}
    predictor = adaptable_predictor(job.device)
    if not figures or predictor is None:
        return None
    try:
        graph = assemble(job.space, job.config, InputSpec.from_dict(job.spec))
    except DippmNasError as e:
        logger.warning("validation job %d (trial %d of %s) not fed to adapt(): its graph cannot be rebuilt (%s)",
                       job.id, job.trial_number, job.study, e)
        return None
    recorded = (job.predicted or {}).get("deployment")
    try:  # the deployment the job was predicted (and so measured) for; none recorded: not described
        deployment = Deployment.from_dict(recorded, origin=f"validation job {job.id}") if recorded else None
    except DippmNasError as e:
        logger.warning("validation job %d: its recorded deployment is not read (%s); adapting for an undescribed "
                       "one", job.id, e)
        deployment = None
    return predictor.adapt([(graph, figures)], persist=True, storage=storage, space=job.space,
                           deployment=deployment)
