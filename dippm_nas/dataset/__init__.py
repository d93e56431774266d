"""The measured dataset: graphs by fingerprint plus measurement rows, in one SQLite file.

``build_dataset`` plans candidates from the search spaces, converts them in parallel and measures them
one at a time, resumably (:mod:`dippm_nas.dataset._builder`); the importers bring public GPU data
into the same file (:mod:`dippm_nas.dataset.importers`: one module per source, one import loop); ``load_measurements`` hands
``(graph, spec, measurement)`` examples to training; ``export_jsonl`` writes a compressed copy to commit.
The file layout is described in :mod:`dippm_nas.dataset._store`.
"""

from dippm_nas.dataset._builder import DEFAULT_BUILD_SETTINGS, BuildReport, build_dataset, measurement_row
from dippm_nas.errors import DatasetError
from dippm_nas.dataset._export import export_jsonl, iter_jsonl, open_text
from dippm_nas.dataset.importers import (
    ImportReport,
    Source,
    device_id,
    import_accel_nasbench,
    import_campaign,
    import_neusight,
    import_ryujaehun,
    import_timm,
    import_vidur,
    run_import,
)
from dippm_nas.dataset._load import MeasuredGraph, load_measurements
from dippm_nas.dataset._plan import Candidate, Plan, macs_per_sample, plan_candidates
from dippm_nas.dataset._store import JOB_STATUSES, MEASURED_HERE, SCHEMA_VERSION, DatasetStore, Job

__all__ = [
    "build_dataset",
    "BuildReport",
    "DEFAULT_BUILD_SETTINGS",
    "measurement_row",
    "plan_candidates",
    "Plan",
    "Candidate",
    "macs_per_sample",
    "DatasetStore",
    "Job",
    "JOB_STATUSES",
    "MEASURED_HERE",
    "SCHEMA_VERSION",
    "DatasetError",
    "load_measurements",
    "MeasuredGraph",
    "export_jsonl",
    "iter_jsonl",
    "open_text",
    "import_accel_nasbench",
    "import_ryujaehun",
    "import_timm",
    "import_neusight",
    "import_vidur",
    "import_campaign",
    "ImportReport",
    "device_id",
    "Source",
    "run_import",
]
