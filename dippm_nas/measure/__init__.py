"""Measuring a model's latency, energy and memory on the host CPU or a CUDA GPU.

``measure(model, spec, torch_device, settings) -> Measurement``. See :mod:`dippm_nas.measure._measurement`
for what failed rows look like, :mod:`dippm_nas.measure._cuda` and :mod:`dippm_nas.measure._cpu` for
how each figure is taken, and :mod:`dippm_nas.measure._stopping` for the stopping rule. This package
knows nothing of the predictor.
"""

from __future__ import annotations

from dippm_nas.measure._api import measure
from dippm_nas.measure._campaign import (
    CAMPAIGN_SOURCE,
    DEFAULT_SET,
    RUNTIMES,
    VALIDATION_SETS,
    CampaignItem,
    CampaignModel,
    CampaignReport,
    campaign_settings,
    plan_campaign,
    read_campaign_rows,
    run_campaign,
)
from dippm_nas.measure._cpu import CpuMeasurer
from dippm_nas.measure._cuda import MIG_ENERGY_REASON, CudaMeasurer, CudaOps
from dippm_nas.measure._interleave import RoundTiming, time_interleaved
from dippm_nas.measure._isolate import measure_isolated
from dippm_nas.measure._malloc import release_free_memory, steady_allocator
from dippm_nas.measure._liveness import ActivationReference, GpuOnlyOperatorError, reference_activation_peak
from dippm_nas.measure._measurement import (
    AUTOCAST_DTYPES,
    ENERGY_SOURCES,
    MEMORY_SOURCES,
    STATUSES,
    STOP_REASONS,
    Measurement,
    MeasureSettings,
)
from dippm_nas.measure._nvml import NvmlAdapter
from dippm_nas.measure._power import PowerSampler, trapezoid_energy_j
from dippm_nas.measure._profile import OP_PROFILE_PASSES, OpProfileWriter, profile_ops
from dippm_nas.measure._rapl import RaplCounter
from dippm_nas.measure._stopping import StoppingRule, run_until_stopped, summarize, t_quantile_975

__all__ = [
    "measure",
    "release_free_memory",
    "steady_allocator",
    "measure_isolated",
    "run_campaign",
    "plan_campaign",
    "campaign_settings",
    "read_campaign_rows",
    "CampaignModel",
    "CampaignItem",
    "CampaignReport",
    "VALIDATION_SETS",
    "DEFAULT_SET",
    "RUNTIMES",
    "CAMPAIGN_SOURCE",
    "reference_activation_peak",
    "ActivationReference",
    "GpuOnlyOperatorError",
    "time_interleaved",
    "profile_ops",
    "OpProfileWriter",
    "OP_PROFILE_PASSES",
    "RoundTiming",
    "Measurement",
    "MeasureSettings",
    "CpuMeasurer",
    "CudaMeasurer",
    "CudaOps",
    "NvmlAdapter",
    "PowerSampler",
    "RaplCounter",
    "StoppingRule",
    "run_until_stopped",
    "summarize",
    "t_quantile_975",
    "trapezoid_energy_j",
    "MIG_ENERGY_REASON",
    "STATUSES",
    "STOP_REASONS",
    "ENERGY_SOURCES",
    "MEMORY_SOURCES",
    "AUTOCAST_DTYPES",
]
