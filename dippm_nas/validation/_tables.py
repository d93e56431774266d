"""The two SQL tables of validation: the job queue and the results.

Both hold data only — strings, numbers and JSON text; no binary column exists, so no code or pickle can
cross the queue. They live in any SQLAlchemy database, usually the Optuna storage's own.

``dippm_validation_jobs`` (one row per study, trial and device; the triple is unique, so processes that
enqueue the same Pareto trial at once make one job):

===================  ============================================================================
id                   integer primary key
study                Optuna study name
trial_number         the trial's number in the study
space                registered search-space name (``search_spaces.list_spaces()``), or ``"llm-generation"``
                     (an LLM generation: :data:`~dippm_nas.validation.GENERATION_SPACE`)
config_json          the model's JSON config in that space (a generation: its versioned job config)
spec_json            :meth:`InputSpec.to_dict` of the input to measure with (a generation: ``{}``)
device               catalogue id of the device to measure on, e.g. ``"host-cpu"``, ``"a100-sxm4-40gb"``
priority             claim order, highest first (the prediction's relative uncertainty)
predicted_json       the prediction for ``device`` the measurement is compared with (JSON)
status               ``queued`` -> ``leased`` -> ``done`` | ``failed`` (a lease that expires goes back
                     to ``queued`` until ``max_attempts``)
lease_owner          ``host:pid:uuid`` of the worker holding the lease (``NULL`` unless leased)
lease_expires_at     Unix seconds; the worker extends it while it measures (heartbeat)
attempts             claims so far
result_json          :meth:`Measurement.to_dict` (``done`` rows)
error                why the job failed (``failed`` rows)
created_at           Unix seconds
updated_at           Unix seconds
===================  ============================================================================

``dippm_validation_results`` (one row per finished measurement; ``job_id`` is unique): study,
trial_number, device, worker, status (the measurement's ``ok``/``oom``/``timeout``/``error``), fits
(``False`` on ``oom``: the model does not fit the device; ``True`` on ``ok``; ``NULL`` otherwise),
predicted/measured/error of latency (ms), energy (J) and memory (MiB) — error in percent,
``100 * (predicted - measured) / measured``, ``NULL`` when either side is missing — the prediction's
sources, ``measured_at`` (Unix seconds) and ``measurement_json``.

``dippm_validation_path_choices`` (one row per study and device): ``state_json``, the
:class:`~dippm_nas.validation.PathChoice` of ``ParetoValidator(choose_path=...)`` (which path answers the device's
predictions, and the scores that chose it) as JSON, and ``updated_at`` (Unix seconds).
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["JOBS_TABLE", "RESULTS_TABLE", "PATH_CHOICES_TABLE", "JOB_STATUSES", "metadata", "jobs", "results",
           "path_choices"]

#: Name of the job table.
JOBS_TABLE = "dippm_validation_jobs"
#: Name of the results table.
RESULTS_TABLE = "dippm_validation_results"
#: Name of the table of each study and device's path choice.
PATH_CHOICES_TABLE = "dippm_validation_path_choices"
#: Life cycle of a job.
JOB_STATUSES: tuple[str, ...] = ("queued", "leased", "done", "failed")

metadata = sa.MetaData()

jobs = sa.Table(
    JOBS_TABLE,
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study", sa.String(512), nullable=False),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("space", sa.String(128), nullable=False),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("spec_json", sa.Text, nullable=False),
    sa.Column("device", sa.String(128), nullable=False),
    sa.Column("priority", sa.Double, nullable=False, default=0.0),
    sa.Column("predicted_json", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("lease_owner", sa.String(255), nullable=True),
    sa.Column("lease_expires_at", sa.Double, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("result_json", sa.Text, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.UniqueConstraint("study", "trial_number", "device", name=f"uq_{JOBS_TABLE}_trial_device"),
    sa.CheckConstraint("status IN ('queued', 'leased', 'done', 'failed')", name=f"ck_{JOBS_TABLE}_status"),
    sa.Index(f"ix_{JOBS_TABLE}_claim", "device", "status", "priority"),
)

results = sa.Table(
    RESULTS_TABLE,
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Integer, nullable=False, unique=True),
    sa.Column("study", sa.String(512), nullable=False),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("device", sa.String(128), nullable=False),
    sa.Column("worker", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("fits", sa.Boolean, nullable=True),
    sa.Column("predicted_latency_ms", sa.Double, nullable=True),
    sa.Column("measured_latency_ms", sa.Double, nullable=True),
    sa.Column("latency_error_pct", sa.Double, nullable=True),
    sa.Column("predicted_energy_j", sa.Double, nullable=True),
    sa.Column("measured_energy_j", sa.Double, nullable=True),
    sa.Column("energy_error_pct", sa.Double, nullable=True),
    sa.Column("predicted_memory_mib", sa.Double, nullable=True),
    sa.Column("measured_memory_mib", sa.Double, nullable=True),
    sa.Column("memory_error_pct", sa.Double, nullable=True),
    sa.Column("latency_source", sa.String(16), nullable=True),
    sa.Column("measured_at", sa.Double, nullable=False),
    sa.Column("measurement_json", sa.Text, nullable=False),
    sa.Index(f"ix_{RESULTS_TABLE}_study", "study", "device"),
)

path_choices = sa.Table(
    PATH_CHOICES_TABLE,
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study", sa.String(512), nullable=False),
    sa.Column("device", sa.String(128), nullable=False),
    sa.Column("state_json", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.UniqueConstraint("study", "device", name=f"uq_{PATH_CHOICES_TABLE}_study_device"),
)
