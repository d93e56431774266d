"""The job a validation round enqueues for a chosen trial, with the prediction its measurement is compared with.

A forward-pass trial's job is its search-space config and input spec (:func:`job_spec`: the validator's
``batch_size`` / ``dtype`` overrides applied), with the prediction for the validation device and deployment
(:func:`predicted_for`), made with the newest stored adaptation of its space (:func:`use_adaptation`) and, where an
adaptation answered, the figures without it. An LLM-generation trial's job is its generation job config with the
generation prediction for the device (:func:`enqueue_generation`).
"""

from __future__ import annotations

from typing import Any

from dippm_nas.deployment import Deployment
from dippm_nas.errors import DippmNasError, ValidationError
from dippm_nas.predictor import predict
from dippm_nas.spec import InputSpec
from dippm_nas.trial import TrialRecord
from dippm_nas.validation._adapt import adapt_storage_of, adaptable_predictor
from dippm_nas.validation._generation import GENERATION_SPACE, predicted_generation, read_generation_job
from dippm_nas.validation._path_choice import PATH_LABEL
from dippm_nas.validation._queue import JobQueue
from dippm_nas.validation._selection import generation_job, uncertainty_of
import search_spaces

__all__ = ["job_spec", "use_adaptation", "predicted_for", "enqueue_generation"]


def job_spec(record: TrialRecord, batch_size: int | None, dtype: str | None) -> dict[str, Any]:
    """The input spec a forward-pass trial is measured (and predicted) with: the trial's, with ``batch_size`` and
    ``dtype`` in place of its own where given."""
    assert record.input_spec is not None
    spec = record.input_spec.to_dict()
    if batch_size is not None:
        spec["batch_size"] = batch_size
    if dtype is not None:
        spec["dtype"] = dtype
    return spec


def use_adaptation(device: str, adapt: bool, queue: JobQueue, space: str, deployment: Deployment) -> Any:
    """The device's adaptable predictor, set to the newest stored adaptation of ``space`` in the queue's store
    (``None`` without ``adapt`` or without a network)."""
    predictor = adaptable_predictor(device) if adapt else None
    if predictor is not None:
        predictor.use_adaptation(storage=adapt_storage_of(queue.url_with_credentials()), space=space)
        predictor.refresh_adaptation(deployment=deployment)
    return predictor


def predicted_for(device: str, deployment: Deployment, adapt: bool, space: str, config: dict[str, Any],
                  spec_dict: dict[str, Any]) -> dict[str, Any]:
    """The prediction for the validation device the measurement is compared with (the job's ``predicted``)."""
    spec = InputSpec.from_dict(spec_dict)
    p = predict(search_spaces.build_model(space, config), spec, device, mig=False, deployment=deployment)
    out = {
        "device": p.device, "batch_size": p.batch_size,
        "latency_ms": p.latency_ms, "latency_ms_std": p.latency_ms_std, "latency_source": p.latency_source,
        "energy_j": p.energy_j, "energy_j_std": p.energy_j_std, "energy_source": p.energy_source,
        "memory_mib": p.memory_mib, "memory_mib_std": p.memory_mib_std, "memory_source": p.memory_source,
    }
    raw = p.details.get("uncalibrated_latency_ms")
    out["latency_ms_uncalibrated"] = float(raw) if raw is not None else p.latency_ms
    predictor = adaptable_predictor(device) if adapt else None
    ad = getattr(predictor, "adaptation", None)
    path = p.labels.get(PATH_LABEL)
    if path is not None:  # the path that answered (choose_path); the prior's figures owe nothing to adaptation
        out[PATH_LABEL] = path
        ad = None if path == "prior" else ad
    if ad is not None:  # the same candidate predicted without the adaptation: what it changed
        out["adaptation_version"], out["adaptation_rows"] = ad.version, ad.rows
        predictor.reset_adaptation()
        try:
            p0 = predict(search_spaces.build_model(space, config), spec, device, mig=False)
        finally:
            predictor.activate_adaptation(ad)
        out["latency_ms_unadapted"] = p0.latency_ms
        out["memory_mib_unadapted"] = p0.memory_mib
    if p.details.get("host_threads"):  # a host-cpu figure is for this many torch threads: measure at it
        out["host_threads"] = int(p.details["host_threads"])
    out["deployment"] = deployment.to_dict()
    return out


def enqueue_generation(queue: JobQueue, study: str, trial: Any, record: TrialRecord, device: str,
                       local: bool) -> tuple[bool, str | None]:
    """Enqueue a generation trial with its prediction for ``device``: ``(enqueued, why it is skipped)``; not
    enqueued and no reason when another process was first."""
    config, why = generation_job(trial.user_attrs, record, device, local)
    try:
        if config is None:
            raise ValidationError(why or "no job config")
        decoder, wl, tp = read_generation_job(config)
        predicted = predicted_generation(decoder, wl, tp, device)
        job_id = queue.enqueue(study=study, trial_number=trial.number, space=GENERATION_SPACE, config=config,
                               spec={}, device=device, predicted=predicted, priority=uncertainty_of(record))
    except DippmNasError as e:
        return False, str(e) if config is None else f"its generation job failed ({e})"
    return job_id is not None, None
