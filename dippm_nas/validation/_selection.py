"""Which trials a validation round takes: the front's that can be validated, and those of uncertain feasibility.

:func:`front_candidates` keeps the Pareto trials that have no job on the validation device yet and can be rebuilt
(a forward pass of a registered search space, or an LLM generation the device can hold), most uncertain first
(:func:`uncertainty_of`), and says why each other one cannot be validated; :func:`uncertain_trials` finds the finished
trials whose budget check rejects them within the margin's band (:func:`~dippm_nas.validation.uncertain_order`).
:meth:`ParetoValidator.select <dippm_nas.validation.ParetoValidator.select>` shares a round between the two
(:func:`~dippm_nas.validation.round_split`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dippm_nas.devices import resolve_device
from dippm_nas.errors import DippmNasError
from dippm_nas.trial import REBUILD_ATTRS, TrialRecord
from dippm_nas.validation._generation import decoder_of_trial, generation_job_config, generation_skip_reason
from dippm_nas.validation._uncertain import uncertain_order
from dippm_nas.validation._worker import local_gpu_count

__all__ = ["UNKNOWN_UNCERTAINTY", "uncertainty_of", "record_of", "generation_job", "front_candidates",
           "uncertain_trials"]

#: Priority of a trial whose predictions have no standard deviation (ranks before any known one).
UNKNOWN_UNCERTAINTY = 1e9


def uncertainty_of(user_attrs: dict[str, Any] | TrialRecord) -> float:
    """Largest relative std of a trial's predicted figures (its user attributes or its
    :class:`~dippm_nas.trial.TrialRecord`); :data:`UNKNOWN_UNCERTAINTY` when none is known."""
    try:
        record = user_attrs if isinstance(user_attrs, TrialRecord) else TrialRecord.from_attrs(user_attrs)
    except DippmNasError:
        return UNKNOWN_UNCERTAINTY
    rel = record.relative_std()
    return UNKNOWN_UNCERTAINTY if rel is None else rel


def _no_record_reason(user_attrs: Any, why: str) -> str:
    """Why a trial's attributes hold no record: the trial was not predicted, its prediction failed, or its
    attributes cannot be read (``why``: the reading's error)."""
    attrs = user_attrs if isinstance(user_attrs, dict) else {}
    error = attrs.get("cost_model_error") or attrs.get("dippm_error")
    if error:
        return f"its user attributes hold no prediction ({error})"
    if any(k in attrs for k in ("predicted_latency_ms", "predicted_memory_mib", "generation", "dippm_predicted")) \
            or not isinstance(user_attrs, dict):
        return f"its user attributes cannot be read ({why})"
    return (f"its user attributes hold no prediction (none of predicted_latency_ms, predicted_memory_mib or a "
            f"generation section; did its objective call HardwareCostModel.evaluate?); the rebuild needs "
            f"{list(REBUILD_ATTRS)}")


def record_of(user_attrs: dict[str, Any]) -> tuple[TrialRecord | None, str]:
    """The trial's record, or ``None`` and why when its attributes hold no prediction or are malformed."""
    try:
        return TrialRecord.from_attrs(user_attrs), ""
    except DippmNasError as e:
        return None, str(e)


def generation_job(user_attrs: dict[str, Any], record: TrialRecord, device: str,
                   local: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The job config of a generation trial, or ``None`` and why it cannot be measured on ``device`` (``local``:
    measured on this machine, whose GPU count bounds the tensor parallelism)."""
    g = record.generation
    assert g is not None
    decoder, why = decoder_of_trial(g.model, user_attrs)
    if decoder is None:
        return None, f"it is an LLM generation and {why}"
    gpus = local_gpu_count() if local and resolve_device(device).kind != "cpu" else None
    reason = generation_skip_reason(decoder, g.tensor_parallel, device, gpus)
    if reason is not None:
        return None, f"it is an LLM generation that cannot be measured on {device}: {reason}"
    try:
        return generation_job_config(decoder, g.workload, tensor_parallel=g.tensor_parallel), None
    except DippmNasError as e:
        return None, f"it is an LLM generation whose workload cannot be measured ({e})"


def front_candidates(front: Iterable[Any], known: set[int], device: str,
                     local: bool) -> tuple[list[Any], dict[int, str]]:
    """The trials of ``front`` without a job (not in ``known``) that can be validated on ``device``, most uncertain
    first (oldest first among equals), and ``{trial number: why it cannot be validated}`` of the others."""
    cands: list[tuple[Any, TrialRecord]] = []
    skipped: dict[int, str] = {}
    for t in front:
        if t.number in known:
            continue
        record, why = record_of(t.user_attrs)
        if record is None:
            reason = _no_record_reason(t.user_attrs, why)
        elif record.generation is not None:
            reason = generation_job(t.user_attrs, record, device, local)[1]
        else:
            reason = record.not_rebuildable_reason
        if reason is not None:
            skipped[t.number] = reason
            continue
        cands.append((t, record))
    cands.sort(key=lambda tr: (-uncertainty_of(tr[1]), tr[0].number))
    return [t for t, _ in cands], skipped


def _same_device(a: str | None, b: str) -> bool:
    """Whether device names ``a`` and ``b`` are one catalogue device (aliases resolved; an unknown name is compared
    as written; a record that names no device, ``None``, cannot be told apart and counts as the same)."""
    if a is None:
        return True
    try:
        return resolve_device(a).id == resolve_device(b).id
    except DippmNasError:
        return a == b


def uncertain_trials(study: Any, skip: set[int] | frozenset[int], device: str | None = None) -> list[Any]:
    """The finished trials of ``study`` (not in ``skip``) whose feasibility is uncertain and that can be rebuilt, in
    the order a round takes them (see :meth:`ParetoValidator.uncertain_trials
    <dippm_nas.validation.ParetoValidator.uncertain_trials>`). With ``device``, only trials whose budget check was
    made for that device (``predicted_device``; a trial that records none is kept): a measurement on another
    device (a stand-in) does not settle their budgets."""
    import optuna

    found: list[tuple[Any, float]] = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if t.number in skip or t.values is None:
            continue
        record, _ = record_of(t.user_attrs)
        if record is None or record.not_rebuildable_reason is not None:
            continue
        if device is not None and not _same_device(record.device, device):
            continue
        d = record.band_distance
        if d is not None and d < 1:
            found.append((t, d))
    if not found:
        return []
    directions = [d.name.lower() for d in study.directions]
    order = uncertain_order([t.values for t, _ in found], directions, [d for _, d in found])
    return [found[i][0] for i in order]
