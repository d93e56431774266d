"""Validation: measure the Pareto front of a search and compare it with the predictions.

:class:`ParetoValidator` is an Optuna study callback; it enqueues Pareto trials in a SQL job table
(:class:`JobQueue`) and measures them here or leaves them to ``dippm-nas validate-worker`` on the
machine that has the device (:class:`ValidationWorker`). Results land in a SQL results table
(:class:`ValidationRecord`) and a :class:`ValidationSummary` in the study's user attributes;
:class:`Calibration` corrects the measured device's latency predictions, and :func:`check_calibration` measures
how much it helped on jobs it was not fitted on. Besides the front, a round measures candidates whose feasibility
is uncertain (:func:`uncertain_order`, :func:`round_split`; ``ParetoValidator(uncertain_per_round=...)``). With
adaptation, each round scores the adapted network against the calibrated analytic prior on its newly measured
candidates, and the winner answers the device's predictions (:class:`PathChoice`, :class:`PathPredictor`;
``ParetoValidator(choose_path=...)``). An LLM-generation trial is measured too: time to first token and
decode ms per token (:func:`measure_generation`; vLLM where importable on CUDA, else transformers' ``generate``).
"""

from dippm_nas.errors import ValidationError
from dippm_nas.validation._calibrate import (
    CALIBRATION_METHODS,
    CalibratedPredictor,
    Calibration,
    CalibrationCheck,
    apply_calibration,
    calibrate_predictor,
    check_calibration,
    fit_calibration,
)
from dippm_nas.validation._generation import (
    GENERATION_ENGINES,
    GENERATION_JOB_VERSION,
    GENERATION_SPACE,
    GenerationMeasurement,
    generation_job_config,
    generation_skip_reason,
    measure_generation,
    predicted_generation,
)
from dippm_nas.validation._path_choice import (
    PATH_LABEL,
    PATH_YARDSTICKS,
    PREDICTION_PATHS,
    PathChoice,
    feasibility_agreement,
    order_agreement,
)
from dippm_nas.validation._path_rounds import PathPredictor
from dippm_nas.validation._queue import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    Job,
    JobQueue,
    ValidationRecord,
    worker_id,
)
from dippm_nas.validation._summary import ValidationSummary, summarize
from dippm_nas.validation._tables import JOB_STATUSES, JOBS_TABLE, PATH_CHOICES_TABLE, RESULTS_TABLE
from dippm_nas.validation._uncertain import DIRECTIONS, default_uncertain_per_round, round_split, uncertain_order
from dippm_nas.validation._validator import (
    MODES,
    SUMMARY_ATTR,
    UNKNOWN_UNCERTAINTY,
    ParetoValidator,
    RoundReport,
    uncertainty_of,
)
from dippm_nas.validation._worker import ValidationWorker, device_is_here, torch_device_for

__all__ = [
    "ParetoValidator", "RoundReport", "MODES", "SUMMARY_ATTR", "UNKNOWN_UNCERTAINTY", "uncertainty_of",
    "JobQueue", "Job", "ValidationRecord", "worker_id", "DEFAULT_LEASE_S", "DEFAULT_MAX_ATTEMPTS",
    "JOB_STATUSES", "JOBS_TABLE", "RESULTS_TABLE", "PATH_CHOICES_TABLE",
    "PathChoice", "PathPredictor", "PREDICTION_PATHS", "PATH_YARDSTICKS", "PATH_LABEL", "order_agreement",
    "feasibility_agreement",
    "ValidationWorker", "device_is_here", "torch_device_for",
    "ValidationSummary", "summarize",
    "Calibration", "CalibratedPredictor", "fit_calibration", "apply_calibration", "CalibrationCheck",
    "check_calibration", "calibrate_predictor", "CALIBRATION_METHODS",
    "GENERATION_SPACE", "GENERATION_JOB_VERSION", "GENERATION_ENGINES", "GenerationMeasurement", "measure_generation",
    "generation_job_config", "generation_skip_reason", "predicted_generation",
    "DIRECTIONS", "default_uncertain_per_round", "round_split", "uncertain_order",
    "ValidationError",
]
