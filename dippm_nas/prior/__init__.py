"""The analytic prior: per-node roofline times, host/GPU timelines, energy and liveness memory.

:func:`estimate` gives the full :class:`PriorEstimate` (per-node times for the GNN's features, the
memory parts); on a CPU whose :class:`PriorParams` carry an :class:`OpTable` (operators timed in place on
that machine, :func:`fit_op_table`) the per-node times come from the table instead of the roofline;
:func:`predict` wraps it as a :class:`~dippm_nas.prediction.Prediction` with sources
``"analytic"`` and the MIG advice. On a GPU the latency is the critical path through the host and GPU
timelines of an execution runtime (:data:`RUNTIMES`: eager, CUDA graphs, ``torch.compile``), with host
times from a fitted :class:`HostModel` scaled to a :class:`~dippm_nas.devices.HostProfile`. Energy is power integrated over the predicted timeline
(:class:`PowerParams` per architecture, fitted on measured GPU energy where an architecture has data:
:func:`power_table`), so its source is ``"predicted"`` for such an architecture.

For many graphs at once, :class:`CostStack` concatenates their node tables and :func:`estimate_many`,
:func:`deployment_spread_many` and :func:`advise_many` run each stage once over the stack (the same figures as graph
by graph); MIG slices re-time the whole GPU's kernel terms (:func:`retimed`).
"""

from dippm_nas.prior._estimate import (
    PriorEstimate,
    ResolvedSettings,
    resolved_settings,
    estimate,
    estimate_latency_ms,
    latency_sigma_log,
    latency_us,
    timeline_fields,
)
from dippm_nas.prior._deploy import (PAGEABLE_FRESH_WEIGHT, UNKNOWN_FRAMEWORK_WEIGHTS, UNKNOWN_HOST, UNKNOWN_HOST_CLOCK_GHZ,
                                     UNKNOWN_HOST_SIGMA_LOG, UNKNOWN_INPUT_COPY, UNKNOWN_INPUT_COPY_WEIGHTS, UNKNOWN_TF32,
                                     UNKNOWN_AUTOCAST_WEIGHTS,
                                     DeploymentSettings, deployment_settings, execution_settings, row_settings,
                                     input_copy_kind)
from dippm_nas.prior._spread import DeploymentSpread, deployment_spread, deployment_spread_many, described_offset_log
from dippm_nas.prior._stack import CostStack, StackedFacts, estimate_many, estimates_of, stacked_timelines
from dippm_nas.prior._host import (HOST_KINDS, PAGE_BYTES, PAGEABLE_STAGING_GBPS, PINNED_COPY_EFFICIENCY, RUNTIMES,
                                   Execution, HostModel, check_runtime, input_copy_us)
from dippm_nas.prior._host_fit import (FIT_PARAMETERS, MEASURED_FIT_PARAMETERS, HostRow, fit_host_model,
                                      host_model_latency_ms)
from dippm_nas.prior._memory import (MemoryBreakdown, MemoryParts, activation_liveness, activation_liveness_many,
                                     gpu_memory_parts, gpu_memory_parts_many, round_block, storage_lives)
from dippm_nas.prior._allocator import (AllocatorConfig, AllocatorPeak, AllocEvent, allocation_events,
                                        cublas_workspace_bytes, cublaslt_workspace_bytes, cuda_module_loading,
                                        parse_torch_version, round_request, segment_bytes, simulate_caching_allocator)
from dippm_nas.prior._op_table import OpTable, aten_op_record, fit_op_table, graph_op_records, working_set_bytes
from dippm_nas.prior._nodes import (KernelTerms, NodeCosts, check_autocast, clear_graph_facts, facts_costs, graph_facts,
                                    graph_facts_many, kernel_terms, kernel_time_us, node_costs, retimed, wave_efficiency)
from dippm_nas.prior._mig import DIPPM_LADDER, MigAdvice, ProfileAdvice, advise, advise_many, mig_fit_violations
from dippm_nas.prior._mig import RULES as MIG_RULES
from dippm_nas.prior._params import (DEFAULT_SCALE_KEY, GEFORCE_SCALE_KEY, PARAM_CLASSES, DeviceScale, OpClassParams,
                                     PriorParams, default_params, default_scale_entries)
from dippm_nas.prior._power import (
    NodeActivity,
    PowerParams,
    PowerTable,
    node_activity,
    node_power_w,
    pass_energy_j,
    power_params_for,
    power_table,
    utilisation_energy_j,
    wait_power_w,
)
from dippm_nas.prior._predict import predict, prediction_of
from dippm_nas.prior._math_path import MATH_PATH_FLOAT32_SINCE, math_path_float32
from dippm_nas.prior._sdpa_rank3 import SDPA_RANK3_FUSED_SINCE, fused_rank3_graph, has_rank3_math_path, sdpa_rank3_fused
from dippm_nas.prior._sdpa import MMA_SYNC_SHARE, SDPA_BACKENDS, AttentionShape, attention_shape, sdpa_backend_codes

__all__ = [
    "estimate", "estimate_many", "estimate_latency_ms", "predict", "prediction_of", "ResolvedSettings", "resolved_settings",
    "CostStack", "StackedFacts", "estimates_of", "stacked_timelines", "deployment_spread_many", "advise_many", "mig_fit_violations", "PriorEstimate", "latency_us", "latency_sigma_log", "timeline_fields",
    "RUNTIMES", "HOST_KINDS", "Execution", "HostModel", "check_runtime", "input_copy_us", "PINNED_COPY_EFFICIENCY", "PAGEABLE_STAGING_GBPS", "PAGE_BYTES",
    "DeploymentSettings", "deployment_settings", "execution_settings", "row_settings", "input_copy_kind", "UNKNOWN_TF32", "UNKNOWN_INPUT_COPY",
    "UNKNOWN_HOST", "UNKNOWN_HOST_CLOCK_GHZ", "UNKNOWN_HOST_SIGMA_LOG", "UNKNOWN_FRAMEWORK_WEIGHTS",
    "UNKNOWN_INPUT_COPY_WEIGHTS", "PAGEABLE_FRESH_WEIGHT", "UNKNOWN_AUTOCAST_WEIGHTS", "DeploymentSpread", "deployment_spread", "described_offset_log",
    "HostRow", "fit_host_model", "host_model_latency_ms", "FIT_PARAMETERS", "MEASURED_FIT_PARAMETERS",
    "PriorParams", "OpClassParams", "DeviceScale", "PARAM_CLASSES", "default_params", "DEFAULT_SCALE_KEY", "GEFORCE_SCALE_KEY",
    "default_scale_entries",
    "node_costs", "NodeCosts", "facts_costs", "KernelTerms", "kernel_terms", "retimed", "check_autocast",
    "graph_facts", "graph_facts_many", "clear_graph_facts", "kernel_time_us", "wave_efficiency",
    "activation_liveness", "activation_liveness_many", "MemoryBreakdown", "round_block", "gpu_memory_parts",
    "gpu_memory_parts_many", "MemoryParts", "storage_lives",
    "AllocatorConfig", "AllocatorPeak", "AllocEvent", "allocation_events", "simulate_caching_allocator", "round_request",
    "segment_bytes", "cublas_workspace_bytes", "cublaslt_workspace_bytes", "cuda_module_loading", "parse_torch_version",
    "OpTable", "fit_op_table", "aten_op_record", "graph_op_records", "working_set_bytes",
    "PowerParams", "PowerTable", "NodeActivity", "power_table", "power_params_for", "node_activity", "node_power_w",
    "wait_power_w", "pass_energy_j", "utilisation_energy_j",
    "advise", "MigAdvice", "ProfileAdvice", "MIG_RULES", "DIPPM_LADDER",
    "SDPA_BACKENDS", "MMA_SYNC_SHARE", "AttentionShape", "attention_shape", "sdpa_backend_codes",
    "MATH_PATH_FLOAT32_SINCE", "math_path_float32",
    "SDPA_RANK3_FUSED_SINCE", "sdpa_rank3_fused", "has_rank3_math_path", "fused_rank3_graph",
]
