"""Importers of public GPU measurements (``../shared/data``) into the dataset format, one module per source.

Each source is a :class:`Source` run by the one import loop :func:`run_import`. Every imported row keeps its
provenance (``source_repo``, ``commit``, ``source_file``) in ``environment`` and what its figure means in
``conditions``. Rows are keyed by their place in the public data (``row_key``), so importing a file twice, or
resuming a killed import, adds nothing twice. A row whose figure is missing in the source is stored with
``status="error"`` and the reason, never dropped; operator-level cells that were never profiled are counted in
the report.

- :func:`import_accel_nasbench`: each CSV row -> an ``mbconv`` config at resolution 256
  (:func:`search_spaces.config_from_accel_nasbench_row`), its graph captured at batch 256, and one
  measurement row per GPU (A100 40GB, RTX 3090): ``latency_ms = batch / throughput * 1000``.
- :func:`import_timm`: timm ``benchmark-infer`` rows (model, GPU, batch, samples/s, step time, precision,
  layout, compile flag); graphs captured only when timm is importable.
- :func:`import_neusight`: NeuSight operator microbenchmarks, or its per-FX-node latencies, as
  ``op_measurements`` rows.
- :func:`import_vidur`: Vidur per-operator LLM-layer time stats as ``op_measurements`` rows.
- :func:`import_ryujaehun`: per-iteration eager PyTorch timings of torchvision CNNs at batch 12
  (RTX 2080 Ti, TITAN RTX, TITAN Xp; half / float / double) -> one row per (GPU, precision, model)
  with the median iteration as ``latency_ms`` and the execution conditions the host model needs.
- :func:`import_campaign`: the rows of a ``dippm-nas gpu-campaign`` directory (measured on a GPU machine
  without TVM), their graphs captured here from the SPEC string and input spec each row records.
"""

from dippm_nas.dataset.importers._accel_nasbench import (
    ACCEL_NASBENCH_BATCH_SIZE,
    ACCEL_NASBENCH_DEVICES,
    AccelNasBenchSource,
    import_accel_nasbench,
)
from dippm_nas.dataset.importers._campaign import CampaignSource, import_campaign
from dippm_nas.dataset.importers._csv import PROVENANCE_COLUMNS, device_id
from dippm_nas.dataset.importers._neusight import NeuSightFxSource, NeuSightMicroSource, import_neusight
from dippm_nas.dataset.importers._ryujaehun import RYUJAEHUN_HOSTS, RyujaehunSource, import_ryujaehun
from dippm_nas.dataset.importers._source import TABLES, GraphRequest, ImportReport, Source, run_import
from dippm_nas.dataset.importers._timm import TimmSource, import_timm
from dippm_nas.dataset.importers._vidur import VidurSource, import_vidur

__all__ = [
    "Source", "GraphRequest", "ImportReport", "run_import", "TABLES",
    "import_accel_nasbench", "import_timm", "import_neusight", "import_vidur", "import_ryujaehun", "import_campaign",
    "AccelNasBenchSource", "TimmSource", "NeuSightMicroSource", "NeuSightFxSource", "VidurSource", "RyujaehunSource",
    "CampaignSource",
    "device_id", "PROVENANCE_COLUMNS", "RYUJAEHUN_HOSTS", "ACCEL_NASBENCH_BATCH_SIZE", "ACCEL_NASBENCH_DEVICES",
]
