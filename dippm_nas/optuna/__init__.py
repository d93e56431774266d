"""Optuna integration: predicted hardware objectives and constraints inside an objective function.

>>> import optuna
>>> from dippm_nas.optuna import Budgets, HardwareCostModel
>>> cost = HardwareCostModel(device="a100-sxm4-40gb", budgets=Budgets(latency_ms=5.0, mig_profile="1g.5gb"))
>>> study = cost.create_study(leading={"accuracy": "maximize"})        # doctest: +SKIP
>>> def objective(trial):                                               # doctest: +SKIP
...     model = build(trial)                       # any nn.Module (or an OperatorGraph)
...     latency_ms, energy_j = cost.evaluate(trial, model, spec)
...     return train(model), latency_ms, energy_j
>>> study.optimize(objective, n_trials=100)                             # doctest: +SKIP

The cost model stays off the search's critical path: :meth:`HardwareCostModel.evaluate` hands the candidate
to a background thread (which predicts the candidates of concurrent trials together) and returns
:class:`PendingValue` figures, read by Optuna when the objective returns, by when the model has trained
(``overlap=False``: predict at once). Conversion in processes (``background_workers``) is
:meth:`HardwareCostModel.submit`::

    cost = HardwareCostModel(budgets=..., background_workers=1)
    def objective(trial):
        model = build(trial)
        pending = cost.submit(trial, model, spec)
        return (train(model), *pending.result())

For batches of asked trials, :meth:`HardwareCostModel.evaluate_many` converts and predicts ``k`` at once.

Objective values
    :meth:`HardwareCostModel.evaluate` returns the predicted figures named by ``objectives``, in that
    order (default ``("latency_ms", "energy_j")``: milliseconds per batch, joules per batch), all to be
    minimised. Put them after your own objectives: the study's directions are then
    ``[*your_directions, *cost.directions]`` and its metric names ``[*your_names, *cost.objectives]``;
    :meth:`HardwareCostModel.create_study` sets both (with ``study.set_metric_names``).

Constraints (chance constraints, :mod:`dippm_nas.budgets`; Optuna's convention: a value ``<= 0`` is feasible)
    Each budget set is met when the predicted figure plus ``k`` standard deviations is within it, and the
    constraint value is ``mean + k * std - budget`` in the figure's unit:

    - ``latency_ms``: ``latency_ms + k * latency_ms_std - budgets.latency_ms`` (ms);
    - ``energy_j``: ``energy_j + k * energy_j_std - budgets.energy_j`` (J);
    - ``memory_mib``: ``memory_mib + k * memory_mib_std`` minus the smaller of ``budgets.memory_mib`` and
      the usable memory of the MIG profile ``budgets.mig_profile`` (MiB; the MIG advisor's rule,
      :mod:`dippm_nas.mig`).

    ``k`` is ``budgets.k_sigma`` (default 1.0) or the figure's entry of ``budgets.k_sigmas``. A prediction
    without a std for a budgeted figure is checked with std 0, recorded as ``std_missing_<figure>`` and
    warned about once. Only the budgets you set become constraints, always in that order
    (:attr:`constraint_names`). On Optuna >= 5 :meth:`~HardwareCostModel.evaluate` registers them with
    ``trial.set_constraint``; on Optuna 4.x pass ``constraints_func=cost.constraints_func`` to the sampler
    (TPE, NSGA-II, NSGA-III, GP). An infeasible candidate is reported as a violation and never pruned:
    pruning it would hide it from the sampler, which then drifts toward small networks.

LLM generation
    Give an :class:`~dippm_nas.llm.LLMWorkload` instead of an ``InputSpec`` and the candidate (a ``transformers``
    config or model, a :class:`~dippm_nas.llm.DecoderConfig`) is predicted with
    :func:`dippm_nas.llm.predict_generation` for the cost model's runtime (``"serving"`` too, with ``engine``).
    Its objectives are any of :data:`LLM_OBJECTIVES` (``tokens_per_s``, ``output_tokens_per_s`` and
    ``max_batch`` are maximised, the others minimised) and its budgets the generation figures of
    :class:`~dippm_nas.budgets.Budgets` (``prefill_ms``, ``decode_ms_per_token``, ``energy_j_per_token``, and the
    minimums ``tokens_per_s`` and ``max_batch``). With ``budgets.mig_profile`` every figure is that of one
    instance of the profile. The trial's :class:`~dippm_nas.trial.TrialRecord` has a generation section: the
    user attributes ``predicted_<figure>`` and ``predicted_<figure>_std`` of every figure of
    :data:`dippm_nas.llm.GENERATION_FIGURES`, ``deployment`` and ``generation`` (the decoder, workload, engine,
    tensor parallelism, MIG profile, ``fits``, ``fit_reason`` and each figure's source).

A candidate the cost model cannot evaluate (``on_error``; default ``"fail"``)
    A model that cannot be captured or predicted (data-dependent control flow, an input that does not fit,
    an unsupported op...) never stops the study: with ``on_error="fail"`` :meth:`HardwareCostModel.evaluate`
    returns NaN for every objective, so Optuna marks the trial ``FAIL`` and goes on to the next one;
    ``on_error="infeasible"`` returns ``+inf`` for every objective and registers every constraint as
    ``+inf`` (``feasible=False``), so the trial completes as a violation the sampler steers away from;
    ``on_error="raise"`` raises the :class:`~dippm_nas.errors.DippmNasError` (the study stops unless
    ``study.optimize(catch=...)`` names it). In every case the reason is the ``cost_model_error`` user
    attribute. Any error of a prediction counts (not only a ``DippmNasError``): the trial never stays running.
    With no cost objectives (``objectives=()``) a trial cannot be failed through its values, so
    ``"fail"`` records it as ``"infeasible"`` does.

User attributes set on every evaluated trial (units in the keys; :class:`~dippm_nas.trial.TrialRecord` writes
and reads them, the NNI tuner's alike)
    ``predicted_latency_ms``, ``predicted_latency_ms_std``, ``latency_source``, ``predicted_energy_j``,
    ``predicted_energy_j_std``, ``energy_source``, ``predicted_memory_mib``, ``predicted_memory_mib_std``,
    ``memory_source`` (sources: ``"predicted"``, ``"analytic"``, ``"calibrated"``, ``"unavailable"``;
    a std is ``None`` when the source gives none), ``predicted_device``, ``mig_smallest_fit`` (``None``
    when nothing fits or the device has no MIG), ``runtime`` and ``deployment`` (the cost model's
    :class:`~dippm_nas.Deployment` as :meth:`~dippm_nas.Deployment.to_dict`), ``constraint_latency_ms`` /
    ``constraint_energy_j`` / ``constraint_memory_mib`` and, per budget set, ``budget_<figure>`` (the limit), ``k_sigma_<figure>``,
    ``margin_<figure>`` (``budget - mean - k * std``, ``>= 0`` feasible) and ``std_missing_<figure>``;
    ``feasible``, ``cost_model_s`` (seconds of
    conversion and prediction for this trial, before these attributes are written; overlapped with the
    objective, and :attr:`~HardwareCostModel.seconds` counts only the caller's waits), ``input_spec`` (:meth:`InputSpec.to_dict`), and, for models built
    by :func:`search_spaces.build_model`, ``search_space`` and ``search_space_config`` (what
    :class:`~dippm_nas.validation.ParetoValidator` rebuilds a model from; no code or pickle is stored).
    ``unknown_ops`` is added when operators had no formula. When the prediction comes from an adapted predictor
    (``predictor.adapt``, fed by :class:`~dippm_nas.validation.ParetoValidator` and ``dippm-nas
    validate-worker``): ``adaptation_version`` and ``adaptation_rows`` (the stored version and the measured rows
    it was fitted on). Before each evaluation the device's predictor loads the newest stored version for the
    device, deployment and the candidate's search space (``"any"`` for other models) from the study's storage,
    so the search follows its validation workers without a restart.
"""

from __future__ import annotations

from dippm_nas.budgets import Budgets
from dippm_nas.optuna._background import PendingEvaluation, PendingValue
from dippm_nas.optuna._compat import CONSTRAINT_API, optuna_has_set_constraint
from dippm_nas.optuna._cost_model import HardwareCostModel
from dippm_nas.optuna._objectives import LLM_OBJECTIVES, MAXIMIZED, OBJECTIVES, ON_ERROR
from dippm_nas.optuna._storage import rdb_storage
from dippm_nas.trial import TrialRecord

__all__ = [
    "Budgets",
    "HardwareCostModel",
    "PendingEvaluation",
    "PendingValue",
    "TrialRecord",
    "OBJECTIVES",
    "LLM_OBJECTIVES",
    "MAXIMIZED",
    "CONSTRAINT_API",
    "ON_ERROR",
    "optuna_has_set_constraint",
    "rdb_storage",
]
