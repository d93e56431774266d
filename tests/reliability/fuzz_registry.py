"""The fuzz registry: every public entry point of dippm-nas, each with its hostile inputs or a reason it needs none.

Three kinds of entry point are enumerated from the code, never from a list here:

- the public names: ``__all__`` of ``dippm_nas`` and of every public module or package under it
  (:func:`public_names`; a name re-exported by several faces is one entry point);
- every CLI verb and every option or positional argument that takes a value, read from the argparse parser of
  ``dippm_nas/cli/_main.py`` (:func:`cli_surfaces`);
- the readers of a file or a database row are not names; they are registered here by what they read
  (``reader:...``), and the CLI options and functions that take a path reach them as well.

``tests/reliability/test_fuzz_registry.py`` fails when an enumerated name, verb or option has no entry here
(register a new one: a generic entry, a custom strategy, or an exemption with its reason), and checks the
property of every entry (``fuzz_hostile.run_case``).

Run the registry without pytest to count what the cases give (the before/after table of docs/reliability.md)::

    PYTHONPATH=. python tests/reliability/fuzz_registry.py --examples 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import math
import os
import pkgutil
import sqlite3
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import fuzz_generic as G  # noqa: E402
import fuzz_hostile as H  # noqa: E402

Call = Callable[[Any, H.Scene], Callable[[], Any]]


@dataclass(frozen=True)
class Entry:
    """One registered entry point: its hostile inputs and how to call it, or the reason it needs none."""

    name: str
    strategy: st.SearchStrategy[Any] | None = None
    call: Call | None = None
    reason: str = ""
    oracle: Callable[[Any], str | None] | None = None
    #: inputs tried on every run before the drawn ones (Hypothesis's explicit examples): the special files
    examples: tuple[Any, ...] = ()

    @property
    def exempt(self) -> bool:
        return bool(self.reason)


def _names(block: str) -> list[str]:
    return [n if n.startswith("dippm_nas") else f"dippm_nas.{n}" for n in block.split()]


def _resolve(path: str) -> Any:
    """The object of a public path ``dippm_nas.face.name`` (the longest importable module prefix)."""
    parts = path.split(".")
    with contextlib.suppress(ImportError, AttributeError):  # a name before a submodule of the same name
        return getattr(importlib.import_module(".".join(parts[:-1])), parts[-1])
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


# =============================================================================================== enumeration
def public_faces() -> dict[str, Any]:
    """``{module name: module}`` of ``dippm_nas`` and every public module or package under it with ``__all__``."""
    import dippm_nas

    faces: dict[str, Any] = {"dippm_nas": dippm_nas}
    for m in pkgutil.walk_packages(dippm_nas.__path__, "dippm_nas."):
        if any(p.startswith("_") for p in m.name.split(".")):
            continue
        mod = importlib.import_module(m.name)
        if hasattr(mod, "__all__"):
            faces[m.name] = mod
    return faces


def _identity(obj: Any, path: str) -> str:
    if inspect.ismodule(obj):
        return "module:" + obj.__name__
    if (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)) and hasattr(obj, "__qualname__"):
        return f"{obj.__module__}.{obj.__qualname__}"
    return path  # a constant: each public path is its own entry


def public_names(faces: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """``{identity: [public paths]}`` of every name in a face's ``__all__``; one identity per object."""
    out: dict[str, list[str]] = {}
    for face, mod in (faces or public_faces()).items():
        for n in mod.__all__:
            path = f"{face}.{n}"
            out.setdefault(_identity(getattr(mod, n), path), []).append(path)
    return out


def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...],
                                                                                  argparse.ArgumentParser]]:
    yield path, parser
    for a in parser._actions:  # argparse's own record of the parser's arguments
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _verbs(sub, (*path, name))


def cli_surfaces(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.Action]:
    """``{"cli:VERB OPTION": action}`` of every verb (``"cli:VERB"``) and every option or positional argument that
    takes a value (``nargs`` not 0), read from the parser ``dippm_nas.cli._main.build_parser`` builds."""
    if parser is None:
        from dippm_nas.cli._main import build_parser
        parser = build_parser()
    out: dict[str, argparse.Action] = {}
    for path, p in _verbs(parser, ()):
        has_sub = any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
        if path and not has_sub:
            out["cli:" + " ".join(path)] = argparse.Action([], dest="verb")
        for a in p._actions:
            if isinstance(a, (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction)):
                continue
            if a.nargs == 0 or (a.option_strings and a.nargs is None and a.const is not None and a.type is None
                                and not a.choices and isinstance(a, argparse._StoreConstAction)):
                continue
            flag = a.option_strings[-1] if a.option_strings else a.dest.upper()
            out["cli:" + " ".join((*path, flag)).strip()] = a
    return out


# =============================================================================================== API entries
#: Constants: values, not entry points (nothing a user passes reaches them).
CONSTANTS = _names("""
    __version__ budgets.BUDGET_FIGURES budgets.BUDGET_KEYS budgets.DEFAULT_K_SIGMA budgets.LLM_BUDGET_FIGURES
    budgets.MINIMUM_FIGURES cache.CACHE_DIR_ENV cache.CACHE_SECRET_ENV cache.CACHE_TABLE cache.CACHE_URL_ENV
    cache.COLUMNS cache.MAX_GRAPH_JSON_BYTES cache.TABLE_NAME capture.BLOCK_MEMO_NODES capture.MAX_ONNX_BYTES
    capture.MODES capture.PLACED_MEMO_NODES capture.RESULTS_CHANGES capture.SOURCE_KINDS capture.SPEC_FORMS
    dataset.DEFAULT_BUILD_SETTINGS
    dataset.JOB_STATUSES dataset.MEASURED_HERE dataset.SCHEMA_VERSION dataset.importers.ACCEL_NASBENCH_BATCH_SIZE
    dataset.importers.ACCEL_NASBENCH_DEVICES dataset.importers.PROVENANCE_COLUMNS dataset.importers.RYUJAEHUN_HOSTS
    dataset.importers.TABLES deployment.AUTOCAST_DTYPES deployment.DEPLOYMENT_RUNTIMES deployment.GRAPH_RUNTIMES
    deployment.INPUT_COPIES devices.CACHE_DIR_ENV devices.DEFAULT_HOST_PROFILE devices.DEVICE_DIR_ENV
    devices.DEVICE_KINDS devices.FRAMEWORKS devices.PCIE_LANE_GBPS features.ATTR_WIDTH
    features.FEATURE_SCHEMA_VERSION features.FUSABLE_CLASSES features.MANY_MIN_GRAPHS features.STYLES
    features.TOKENS graph.GRAPH_FORMAT_VERSION graph.OPAQUE_PREFIX graph.SDPA_MATH_ATTR graph.SDPA_MATH_NAME graph.SDPA_RANK_ATTR graph.OP_CLASSES graph.READABLE_GRAPH_FORMATS
    graph.STRUCTURAL_HASH_VERSION llm.ARCHITECTURES
    llm.DEFAULT_DEVICE llm.ENGINES llm.ENGINES_FILE llm.FRONTENDS llm.GENERATION_FIGURES llm.KV_DTYPES
    llm.LLM_RUNTIMES llm.MODEL_TYPES llm.STYLES llm.WEIGHT_DTYPES measure.AUTOCAST_DTYPES measure.CAMPAIGN_SOURCE
    measure.DEFAULT_SET measure.ENERGY_SOURCES measure.MEMORY_SOURCES measure.MIG_ENERGY_REASON
    measure.OP_PROFILE_PASSES measure.RUNTIMES measure.STATUSES measure.STOP_REASONS measure.VALIDATION_SETS
    mig.DIPPM_LADDER mig.RULES nni.LOOPBACK_PRELOAD_JS nni.METRIC_KEYS nni.PARAMETERS_KEY nni.STATS_FILE_NAME
    nni.SUPPORTED_TYPES optuna.CONSTRAINT_API optuna.LLM_OBJECTIVES optuna.MAXIMIZED optuna.OBJECTIVES
    optuna.ON_ERROR prediction.SOURCES predictor.ANALYTIC_IDENTITY predictor.ANY_SPACE predictor.BATCH_MIN_GRAPHS
    predictor.CALIBRATION_CLASSES predictor.CHECKPOINT_DIR_ENV predictor.CHECKPOINT_FORMAT
    predictor.CLASS_SPREAD_LOG predictor.DEFAULT_DEVICE predictor.DEFAULT_HOST_TAG predictor.DELTA_MARGIN
    predictor.HANDOVER_ROWS predictor.HEAD_MIN_ROWS predictor.HOST_DEVICE predictor.INFER_CHUNK_NODES
    predictor.MAX_CORRECTION_LOG predictor.NUMPY_MAX_GRAPHS predictor.OTHER_HOST_FLOOR_LOG
    predictor.OTHER_MACHINE_FLOOR_LOG predictor.PREDICT_CHUNK predictor.RIDGE_GRID predictor.SCATTER_FLOOR_LOG
    predictor.SLOPE_BOUNDS predictor.TARGETS predictor.TARGET_UNITS prior.DIPPM_LADDER prior.FIT_PARAMETERS prior.MEASURED_FIT_PARAMETERS
    prior.HOST_KINDS prior.MIG_RULES prior.PARAM_CLASSES prior.PINNED_COPY_EFFICIENCY prior.RUNTIMES
    prior.UNKNOWN_FRAMEWORK_WEIGHTS prior.UNKNOWN_HOST prior.UNKNOWN_HOST_CLOCK_GHZ prior.UNKNOWN_HOST_SIGMA_LOG
    prior.UNKNOWN_INPUT_COPY prior.UNKNOWN_INPUT_COPY_WEIGHTS prior.UNKNOWN_AUTOCAST_WEIGHTS prior.UNKNOWN_TF32 spec.COMPUTE_DTYPES
    spec.MAX_INPUT_ELEMENTS spec.TENSOR_DTYPES training.COVERAGE training.DEVICE_ALIASES training.GRADED_MIN_ROWS
    training.MAX_REFERENCE training.NOVELTY_QUANTILE training.SHRINK_GRID training.SPLIT_MODES trial.ATTR_ALIASES
    trial.FIGURES trial.REBUILD_ATTRS units.BYTES_PER_KIB units.BYTES_PER_MIB units.MIB_PER_GIB units.MS_PER_S
    units.US_PER_MS units.US_PER_S validation.CALIBRATION_METHODS validation.DEFAULT_LEASE_S
    validation.DEFAULT_MAX_ATTEMPTS validation.JOBS_TABLE validation.JOB_STATUSES validation.MODES
    validation.RESULTS_TABLE validation.SUMMARY_ATTR validation.UNKNOWN_UNCERTAINTY validation.GENERATION_SPACE
    validation.GENERATION_JOB_VERSION validation.GENERATION_ENGINES validation.DIRECTIONS
    validation.PREDICTION_PATHS validation.PATH_YARDSTICKS validation.PATH_LABEL validation.PATH_CHOICES_TABLE
    conformal.CONFIDENCES conformal.CONFORMAL_FORMAT conformal.MIN_REGIME_ROWS conformal.WIDEST_REGIME
    conformal.IN_SPACE_REGIME
    llm.ADAPTED_CONSTANTS llm.INTERCONNECTS llm.SERVING_FIGURES optuna.SERVING_OBJECTIVES prior.PAGEABLE_FRESH_WEIGHT
    prior.PAGEABLE_STAGING_GBPS prior.PAGE_BYTES trial.GENERATION_ALIASES prior.SDPA_BACKENDS prior.MMA_SYNC_SHARE prior.MATH_PATH_FLOAT32_SINCE prior.SDPA_RANK3_FUSED_SINCE
    prior.DEFAULT_SCALE_KEY prior.GEFORCE_SCALE_KEY
""")
#: Type aliases: names for annotations, not callables a user calls.
TYPE_ALIASES = _names("capture.CacheArg capture.SourceKind capture.SpaceItem prediction.Source")
#: Exception classes: raised by dippm-nas, not called with a user's input.
EXCEPTIONS = _names("""
    CacheError CheckpointError DeploymentError DeviceError DippmNasError GraphCaptureError GraphValidationError
    InputShapeError InputSpecError InvalidValueError MeasurementError MissingDependencyError ModelSpecError
    OutOfMemoryError SearchSpaceError UnsupportedDtypeError UnsupportedOpError ValidationError cli.UsageError
    dataset.DatasetError errors.AdaptationError errors.BudgetError errors.ExecutionRuntimeError errors.InvalidTypeError
    measure.GpuOnlyOperatorError
""")
#: Modules re-exported as names: their own names are registered under their own faces.
MODULES = _names("llm mig prior")
#: Records dippm-nas returns (a user reads their fields; the functions that build them are fuzzed).
RECORDS = _names("""
    CaptureResult GenerationPrediction Prediction StagesPrediction budgets.ChanceCheck dataset.BuildReport
    dataset.Candidate dataset.ImportReport dataset.Job dataset.MeasuredGraph dataset.Plan
    dataset.importers.GraphRequest deployment.ResolvedDeployment features.GraphFeatures features.KernelGraph
    graph.GraphStack graph.NodeCost graph.StaticFeatures llm.EngineTable llm.Figure llm.GenerationExecution
    llm.GenerationSlice llm.KVCapacity measure.ActivationReference measure.CampaignItem measure.CampaignReport
    measure.RoundTiming mig.MigAdvice mig.ProfileAdvice nni.TunerStats optuna.PendingEvaluation optuna.PendingValue
    prediction.Details predictor.Adaptation predictor.CheckpointInfo predictor.Citation predictor.NoveltyFloor
    prior.CostStack prior.DeploymentSpread prior.KernelTerms prior.MemoryBreakdown prior.MemoryParts
    prior.NodeActivity prior.NodeCosts prior.PriorEstimate prior.ResolvedSettings prior.StackedFacts
    validation.CalibrationCheck validation.Job validation.RoundReport validation.ValidationRecord
    validation.ValidationSummary conformal.ConformalMargin deployment.RunningTorch llm.EngineAdaptation
    llm.ServingEstimate optuna.ServingSearchResult trial.GenerationRecord validation.GenerationMeasurement
    prior.AttentionShape
    prior.AllocatorPeak
""")
#: Public names fuzzed from their signature (fuzz_generic): one parameter a user writes hostile at a time.
GENERIC = _names("""
    Deployment Device InputSpec LLMWorkload ModelSource OpNode Stage TensorSpec budgets.Budgets
    dataset.importers.AccelNasBenchSource dataset.importers.CampaignSource dataset.importers.NeuSightFxSource
    dataset.importers.NeuSightMicroSource dataset.importers.RyujaehunSource dataset.importers.TimmSource
    dataset.importers.VidurSource devices.HostProfile devices.MigProfile llm.DecoderConfig llm.ServingEngine
    measure.CampaignModel measure.CpuMeasurer measure.CudaMeasurer measure.MeasureSettings measure.Measurement
    measure.OpProfileWriter measure.RaplCounter measure.StoppingRule nni.Constraints nni.DippmProfiler
    nni.HardwareAwareTuner optuna.HardwareCostModel optuna.TrialRecord predictor.AdaptationKey
    predictor.AnalyticPredictor predictor.Calibration predictor.CheckpointMeta predictor.ResidualHead
    predictor.TimelineFactors prior.DeploymentSettings prior.DeviceScale prior.Execution
    prior.HostModel prior.OpClassParams prior.OpTable prior.PowerParams prior.PowerTable training.Example
    training.TrainConfig validation.Calibration validation.ParetoValidator budgets.check_k_sigma
    capture.assemble capture.block_key capture.file_key capture.has_results_form capture.load_callable
    capture.load_model
    capture.named_model_key capture.space_config_of capture.supports_assembly capture_many cli.parse_devices
    dataset.build_dataset dataset.device_id dataset.import_accel_nasbench dataset.import_campaign
    dataset.import_neusight dataset.import_ryujaehun dataset.import_vidur dataset.macs_per_sample
    dataset.plan_candidates deployment.tf32_defaults prior.math_path_float32 prior.sdpa_rank3_fused devices.device_from_dict devices.framework_of_version
    devices.resolve_device devices.resolve_host_profile devices.unregister_device
    features.featurize features.featurize_many features.get_op_encoder features.node_dim features.static_dim
    features.static_dtype_columns features.unregister_op_encoder get_device get_predictor graph.adopt_node_columns
    graph.graph_from_relax graph.op_class_of graph.stack_graphs graph.synthetic_resnet_graph
    llm.architecture llm.causal_keys_per_query llm.config_from_transformers llm.contiguous_capacity llm.decode_graph
    llm.expected_active_experts llm.kv_cache_bytes llm.kv_dtype_bytes llm.paged_kv_bytes llm.prefill_graph
    llm.resolve_execution llm.serving_engine measure.measure measure.measure_isolated measure.profile_ops
    measure.reference_activation_peak measure.run_campaign measure.summarize measure.t_quantile_975
    measure.trapezoid_energy_j nni.final_metrics nni.model_from_parameters nni.parse_search_space nni.quantize
    nni.report nni.spec_from_parameters nni.tuner_settings nni.write_loopback_preload optuna.rdb_storage predict
    predict_generation predict_many predictor.calibration_path predictor.checkpoint_digest predictor.checkpoint_name
    predictor.correction_weight predictor.delete_calibration predictor.deployment_key predictor.derived_weights_path
    predictor.find_checkpoint predictor.fit_residual_head predictor.fit_timeline_factors predictor.novelty_floor_log
    predictor.resolve_deployment
    prior.activation_liveness_many prior.aten_op_record
    prior.check_autocast prior.check_runtime prior.deployment_spread prior.estimate prior.estimate_latency_ms
    deployment.row_deployment prior.row_settings
    prior.estimate_many prior.fit_op_table prior.graph_facts_many prior.input_copy_kind
    prior.input_copy_us prior.latency_us prior.node_activity prior.predict
    prior.resolved_settings prior.round_block prior.utilisation_energy_j register_device
    spec.dtype_bytes spec.parse_shape training.evaluate_checkpoint training.fit_graded_floor
    training.fit_novel_floor training.fit_shrink_width training.fit_std_floor training.regression_metrics
    training.scatter_png training.split_d0 training.split_fraction training.timm_family training.train_predictor
    training.write_report validation.device_is_here validation.torch_device_for validation.uncertainty_of
    conformal.check_confidence conformal.conformal_path conformal.wider_regimes conformal.conformal_score
    conformal.fit_conformal conformal.in_space_margin conformal.check_in_space_scores llm.MeasuredServingRun llm.ServingConfig llm.ServingSLO llm.ServingTraffic
    llm.TensorParallel llm.adapt_engine llm.shard_config mig.mig_fit_violations validation.measure_generation
    validation.generation_job_config validation.generation_skip_reason validation.predicted_generation
    prior.AllocatorConfig prior.AllocEvent prior.cublas_workspace_bytes prior.cublaslt_workspace_bytes
    prior.cuda_module_loading prior.parse_torch_version llm.vllm_gpu_blocks
    budgets.band_distance validation.uncertain_order validation.round_split validation.default_uncertain_per_round
    validation.PathChoice validation.order_agreement validation.feasibility_agreement
""")
#: Public callables that take no argument: each reads the environment (fuzzed as a ``reader:`` entry) or nothing.
NO_ARGUMENT = {
    **dict.fromkeys(_names("cache.cache_dir cache.default_cache cache.default_cache_url cache.read_default_sqlite"),
                    "takes no argument; reads DIPPM_NAS_CACHE_DIR / DIPPM_NAS_CACHE_URL: reader:cache env"),
    **dict.fromkeys(_names("list_devices"), "takes no argument; reads DIPPM_NAS_DEVICE_DIR: reader:device toml"),
    **dict.fromkeys(_names("predictor.checkpoint_dirs"),
                    "takes no argument; reads DIPPM_NAS_CHECKPOINT_DIR: reader:checkpoint metadata"),
    **dict.fromkeys(_names("llm.engine_table"), "takes no argument; reads the shipped engines file only"),
    **dict.fromkeys(_names("deployment.running_torch"), "takes no argument; reads the running process's torch"),
    **dict.fromkeys(_names("""capture.clear_block_memo features.registered_ops features.reset_unknown_op_counts
                           features.unknown_op_counts graph.known_ops prior.clear_graph_facts prior.default_params
                           measure.release_free_memory optuna.optuna_has_set_constraint validation.worker_id
                           devices.cpu_model_name nni.free_port predictor.default_adapt_url capture.converter_version
                           devices.cpu_signature features.device_dim measure.steady_allocator nni.loopback_only
                           predictor.host_checkpoints prior.power_table measure.campaign_settings"""),
                    "takes no argument and reads nothing a user writes"),
    **dict.fromkeys(_names("devices.default_host_profile devices.host_facts devices.measure_host_profile "
                           "devices.measure_weight_cache"),
                    "measures this host (seconds of CPU); its cache file is read by reader:host benchmark cache"),
}
#: Public names whose parameters are all objects dippm-nas builds (no value a user writes reaches them; the
#: functions and readers building those objects are fuzzed), or abstract bases and hardware handles.
OBJECT_ONLY = {
    **dict.fromkeys(_names("""cache.fresh_copy capture.model_key cli.add_split_args features.encode_op
                           graph.node_columns nni.mig_label predictor.TorchEngine predictor.calibration_classes
                           predictor.calibration_problems predictor.checkpoint_identity predictor.save_calibration
                           prior.deployment_settings prior.graph_facts prior.latency_sigma_log prior.node_power_w
                           prior.power_params_for prior.prediction_of prior.timeline_fields prior.wait_power_w
                           training.is_timm validation.CalibratedPredictor validation.apply_calibration validation.PathPredictor
                           features.device_features features.coarsen prior.activation_liveness
                           prior.described_offset_log measure.campaign_models.LastHidden prior.storage_lives
                           prior.fused_rank3_graph prior.has_rank3_math_path"""),
                    "takes only objects dippm-nas builds (a graph, an estimate, a calibration, a device...)"),
    **dict.fromkeys(_names("predictor.BasePredictor dataset.Source"), "an abstract base class"),
    **dict.fromkeys(_names("measure.CudaOps measure.NvmlAdapter"),
                    "a handle on the GPU's runtime or NVML; takes no argument (exercised by the measure tests)"),
    **dict.fromkeys(_names("""measure.campaign_models.bert_base measure.campaign_models.gpt2_small
                           measure.campaign_models.tiny_cnn measure.campaign_models.tiny_mlp nni.TinyConvSpace"""),
                    "a model builder of the validation set or an example space; takes no argument"),
}
#: Public names whose required parameters include objects dippm-nas builds that the registry has no small
#: valid instance of (fuzz_generic.FIXTURES): a prediction, a predictor, features, examples, a stack of facts,
#: a queue, a source. The values a user writes reach them through the functions and readers building those.
NEEDS_OBJECTS = dict.fromkeys(_names("""
    OperatorGraph features.OpEncoder measure.PowerSampler predictor.GnnPredictor predictor.NumpyEnsemble
    prior.HostRow prior.PriorParams budgets.trial_attrs capture.assemble_chunks capture.assemble_many
    dataset.measurement_row dataset.run_import features.register_op_encoder llm.paged_capacity
    measure.plan_campaign measure.run_until_stopped measure.time_interleaved mig.advise mig.advise_many
    nni.scalarize predict_stages predictor.collate predictor.collate_globals predictor.fit_calibration
    predictor.global_arrays predictor.set_predictor prior.deployment_spread_many prior.estimates_of
    prior.facts_costs prior.fit_host_model prior.gpu_memory_parts prior.gpu_memory_parts_many
    prior.host_model_latency_ms prior.kernel_terms prior.node_costs prior.pass_energy_j prior.retimed
    prior.stacked_timelines prior.working_set_bytes sum_stages training.attach_novelty_reference
    training.evaluate_examples training.evaluate_predictions training.featurize_examples training.few_shot_curve
    training.heldout_timm_families training.labels_log training.metrics_table training.reference_set
    training.split_examples training.train_ensemble validation.calibrate_predictor validation.check_calibration
    validation.fit_calibration validation.summarize conformal.regime_of conformal.conformal_for
    llm.evaluate_serving llm.resolve_tensor_parallel optuna.serving_config_search prior.simulate_caching_allocator
    prior.execution_settings prior.default_scale_entries
"""), "its required parameters include objects dippm-nas builds with no fixture; fuzzed through their builders")
#: Numeric kernels and formulas the stages call with values they have checked: vectorised over nodes (a check
#: per call would cost on every prediction), or the torch module a checkpoint holds. A user's values reach them
#: through capture, estimate, predict and train (fuzzed); calling one directly with a value of another type
#: is a programming error Python or numpy reports.
KERNELS = dict.fromkeys(_names("""
    graph.cost_of prior.kernel_time_us prior.wave_efficiency prior.graph_op_records predictor.novelty_scores
    predictor.SageEnsemble prior.attention_shape prior.sdpa_backend_codes
    predictor.SageEnsemble prior.allocation_events prior.round_request prior.segment_bytes
"""), "a numeric kernel or formula the stages call with checked values; fuzzed through capture, estimate, "
      "predict and train")
#: Public names with a strategy of their own below (``CUSTOM``).
#: Public names fuzzed through a reader or credential entry below rather than from their signature.
THROUGH = {
    **dict.fromkeys(_names("cli.main"), "the CLI: every verb and option is a cli: entry"),
    **dict.fromkeys(_names("capture.check_onnx_file capture.read_onnx_file"), "reader:onnx file"),
    **dict.fromkeys(_names("dataset.iter_jsonl dataset.open_text dataset.export_jsonl"), "reader:jsonl"),
    **dict.fromkeys(_names("dataset.load_measurements dataset.DatasetStore"), "reader:dataset rows"),
    **dict.fromkeys(_names("dataset.import_timm"), "reader:importer csv"),
    **dict.fromkeys(_names("devices.load_host_profile"), "reader:host profile"),
    **dict.fromkeys(_names("llm.decoder_config"), "reader:llm config.json"),
    **dict.fromkeys(_names("measure.read_campaign_rows"), "reader:campaign rows"),
    **dict.fromkeys(_names("predictor.list_checkpoints"), "reader:checkpoint metadata"),
    **dict.fromkeys(_names("predictor.load_calibration predictor.read_calibration"), "reader:calibration file"),
    **dict.fromkeys(_names("predictor.AdaptationStore"), "reader:adaptation store rows"),
    **dict.fromkeys(_names("cache.ConversionCache cache.set_default_cache"), "reader:cache rows"),
    **dict.fromkeys(_names("validation.JobQueue validation.ValidationWorker"), "reader:job-queue rows"),
    **dict.fromkeys(_names("training.load_examples"), "reader:training examples"),
    **dict.fromkeys(_names("conformal.ConformalCalibration"), "reader:conformal calibration"),
    **dict.fromkeys(_names("llm.adapted_engine"), "reader:engine adaptation"),
}


def _generic(path: str) -> Entry:
    try:
        obj = _resolve(path)
    except (ImportError, AttributeError):
        return Entry(path, reason="not public in this tree (registered for another version)")
    strategy = G.signature_strategy(obj)
    if strategy is None:
        return Entry(path)  # neither a strategy nor a reason: the coverage test names it
    paths = [p.name for p in G.fuzzable(G.params_of(obj)) if p.kind == "path"]
    examples = ((paths[0], ("path", "fifo")), (paths[0], ("path", "symlink_to_input"))) if paths else ()
    return Entry(path, strategy, lambda drawn, sc, obj=obj: G.call_with(obj, drawn, sc), examples=examples)


# =============================================================================================== readers
def _env(**env: str | None) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def cm() -> Iterator[None]:
        old = {k: os.environ.get(k) for k in env}
        try:
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return cm()


def _file_of(kind: str, sc: H.Scene, suffix: str, body: str | None = None) -> str:
    """A path of ``kind``; ``"text"`` writes ``body`` into a regular file (an input, hashed)."""
    if kind == "text":
        return str(sc.input_file(body or "", suffix))
    return sc.special(kind, suffix)


def _docs(*texts: str) -> st.SearchStrategy[tuple[str, str | None]]:
    """A special file kind, or a regular file holding one of ``texts``."""
    return st.one_of(H.read_kinds().map(lambda k: (k, None)), st.sampled_from(texts).map(lambda t: ("text", t)))


_JSON_BAD = ('{"a": NaN}', "[]", "null", '{"name": 5}', '"x"', "{" * 3, '{"a": 1e999}', "\ufeff{}",
             json.dumps({"x" * 200: [None] * 5}), "[" * 70 + "]" * 70)
_TOML_BAD = ("a = [" * 60 + "]" * 60, "runtime = 5", 'runtime = "eager"\nrunime = 1', "[[x]]\n[x]", "= 1",
             'versions = {torch = "\u00b2"}', 'versions = {torch = "' + "9" * 5000 + '"}', "x = nan", "x = 1e999",
             "runtime = \"eager\"\n" * 2)


def _reader(name: str, strategy: st.SearchStrategy[Any], call: Call, examples: tuple[Any, ...] = ()) -> Entry:
    return Entry(name, strategy, call, examples=examples)


_FILE_EXAMPLES = (("fifo", None), ("deep_json", None), ("symlink_to_input", None))


def _deployment_file(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.deployment import Deployment
    kind, body = drawn
    path = _file_of(kind, sc, ".toml", body)
    return lambda: Deployment.load(path)


def _place(kind: str, body: str | None, sc: H.Scene, dest: Path) -> None:
    """Put a file of ``kind`` at ``dest`` (a name a reader finds by listing a folder)."""
    if kind == "text":
        dest.write_text(body or "")
        sc.inputs.append(dest)
    elif kind in ("dev_null", "nul_name"):
        dest.symlink_to("/dev/null")
    elif kind != "missing":
        src = Path(sc.special(kind, dest.suffix))
        if kind in ("dangling_symlink", "symlink_to_input"):
            dest.symlink_to(os.readlink(src))
        else:
            os.replace(src, dest)
            if kind == "fifo":
                sc.fifos.append(dest)


def _device_toml(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    """A user device folder (``DIPPM_NAS_DEVICE_DIR``) whose ``lab.toml`` is of the drawn kind."""
    kind, body = drawn
    d = sc.root / "devices"
    d.mkdir()
    _place(kind, None if body is None else 'id = "lab"\n' + body, sc, d / "lab.toml")

    def run() -> Any:
        from dippm_nas import devices
        with _env(DIPPM_NAS_DEVICE_DIR=str(d)):
            ids = devices.list_devices()
            return devices.get_device("lab") if "lab" in ids else ids
    return run


def _host_profile(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.devices import load_host_profile
    kind, body = drawn
    path = _file_of(kind, sc, ".json", body)
    return lambda: load_host_profile(path)


def _calibration_file(drawn: tuple[str, str | None, str], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.prior import PowerTable, PriorParams
    kind, body, which = drawn
    path = _file_of(kind, sc, ".json", body)
    return lambda: (PriorParams if which == "prior" else PowerTable).load(path)


def _checkpoint_meta(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    """A user checkpoint folder (``DIPPM_NAS_CHECKPOINT_DIR``) whose metadata sidecar is of the drawn kind."""
    kind, body = drawn
    d = sc.root / "ckpt"
    d.mkdir()
    _place(kind, body, sc, d / "a100-sxm4-40gb.user.json")
    (d / "a100-sxm4-40gb.user.pt").write_bytes(b"not a checkpoint")

    def run() -> Any:
        from dippm_nas.predictor import list_checkpoints
        with _env(DIPPM_NAS_CHECKPOINT_DIR=str(d)):
            return list_checkpoints("a100-sxm4-40gb")
    return run


def _conformal_file(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.conformal import ConformalCalibration
    kind, body = drawn
    path = _file_of(kind, sc, ".json", body)
    return lambda: ConformalCalibration.load(path)


def _engine_adaptation(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    """A stored engine adaptation (``adapted_engine``'s folder) whose file is of the drawn kind."""
    from dippm_nas.llm import adapted_engine
    kind, body = drawn
    folder = sc.root / "engines"
    folder.mkdir(exist_ok=True)
    _place(kind, body, sc, folder / "h100-sxm5-80gb__vllm__0.6.0.json")
    return lambda: adapted_engine("h100-sxm5-80gb", "vllm", "0.6.0", storage=folder)


def _onnx(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.capture import check_onnx_file
    kind, body = drawn
    path = _file_of(kind, sc, ".onnx", body)
    return lambda: check_onnx_file(path)


def _jsonl(drawn: tuple[str, str | None, str], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.dataset import iter_jsonl
    kind, body, _ = drawn
    path = _file_of(kind, sc, ".jsonl", body)
    return lambda: list(iter_jsonl(path))


def _campaign_rows(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.measure import read_campaign_rows
    kind, body = drawn
    path = _file_of(kind, sc, ".jsonl", body)
    return lambda: list(read_campaign_rows(path))


def _examples(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.training import load_examples
    kind, body = drawn
    path = _file_of(kind, sc, ".jsonl", body)
    return lambda: load_examples([path])


def _importer_csv(drawn: tuple[str, str | None], sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.dataset import import_timm
    kind, body = drawn
    path = _file_of(kind, sc, ".csv", body)
    out = sc.root / "imported.sqlite"
    return lambda: import_timm(path, out, capture_graphs=False, workers=0, progress=False)


def _llm_config(drawn: Any, sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.llm import decoder_config
    kind, body = drawn
    if kind == "dict":
        return lambda: _llm_checked(body, decoder_config(body))
    path = _file_of(kind, sc, ".json", body)
    return lambda: decoder_config(path)


#: config.json keys and the DecoderConfig fields they become (each a positive int).
_LLM_SIZES = {"hidden_size": "hidden_size", "num_attention_heads": "num_heads", "num_hidden_layers": "num_layers",
              "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}
_DTYPE_SPELLINGS = {"float16", "bfloat16", "float32", "half", "fp16", "bf16", "float", "fp32"}


def _llm_checked(given: dict[str, Any], cfg: Any) -> H.Checked:
    """The oracle of a config dict that was accepted: a weights dtype or a size read as another value."""
    dtype = given.get("torch_dtype")
    if isinstance(dtype, str) and dtype not in _DTYPE_SPELLINGS:
        return H.Checked(cfg, f"torch_dtype {dtype!r} read as {getattr(cfg, 'dtype', None)!r}")
    for key, field in _LLM_SIZES.items():
        v = given.get(key)
        if type(v) is not int:  # noqa: E721 - a bool, a float or a text accepted as a size
            return H.Checked(cfg, f"{key} = {v!r:.40} read as {getattr(cfg, field, None)!r}")
    return H.Checked(cfg)


_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
          "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 128}


def _llm_configs() -> st.SearchStrategy[Any]:
    keys = st.sampled_from(sorted(_LLAMA) + ["torch_dtype", "n_head", "rope_scaling", "num_local_experts"])
    values = st.one_of(H.scalars(), st.sampled_from(("float8", "bfloat17", [], {}, H.deep_dict(200), 10**12)))
    edited = st.tuples(keys, values).map(lambda kv: {**_LLAMA, kv[0]: kv[1]})
    as_dict = edited.map(lambda d: ("dict", d))
    as_file = st.one_of(edited.map(lambda d: ("text", json.dumps(d, default=str))),
                        _docs(*_JSON_BAD))
    return st.one_of(as_dict, as_file)


def _trial_attrs() -> st.SearchStrategy[Any]:
    keys = st.sampled_from(("latency_ms", "energy_j", "memory_mib", "latency_sigma_log", "source", "device",
                            "relative_std", "cost_model_error", "dippm_nas"))
    return st.one_of(st.sampled_from((None, [], "attrs", H.deep_dict(100))),
                     st.dictionaries(keys, st.one_of(H.scalars(), H.nested_values()), max_size=4))


def _trial_record(drawn: Any, sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.trial import TrialRecord
    return lambda: TrialRecord.from_attrs(drawn)


def _cache_env(drawn: tuple[str, str], sc: H.Scene) -> Callable[[], Any]:
    var, kind = drawn
    value = sc.special(kind, "") if kind not in ("url_garbage",) else "nosuchdb+nodriver://x/y"

    def run() -> Any:
        from dippm_nas.cache import default_cache, set_default_cache
        env = {"DIPPM_NAS_CACHE_DIR": value} if var == "dir" else {"DIPPM_NAS_CACHE_URL": value}
        with _env(**env):
            set_default_cache(None)
            try:
                c = default_cache()
                return c if c is None else c.stats()
            finally:
                set_default_cache(None)
    return run


# --------------------------------------------------------------------------------------------- database rows
_ROW_VALUES = (None, "", "garbage", "[" * 200 + "]" * 200, b"\x00\xff" * 50, -1, 10**18, 1e308, "NaN",
               '{"a": NaN}', "null", "{}", "[]", '"x"')


def damage(db: Path, draw: tuple[int, int, Any]) -> str:
    """Overwrite one column of every row of one table of SQLite file ``db`` (``draw``: table index, column
    index, value); returns what it did."""
    ti, ci, value = draw
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                            "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        if not tables:
            return "no table"
        t = tables[ti % len(tables)]
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
        c = cols[ci % len(cols)]
        try:
            con.execute(f'UPDATE "{t}" SET "{c}" = ?', (value,))
        except sqlite3.IntegrityError:
            con.execute(f'UPDATE "{t}" SET "{c}" = ?', ("garbage",))
        con.commit()
        return f"{t}.{c} = {value!r:.40}"
    finally:
        con.close()


def _row_damage() -> st.SearchStrategy[Any]:
    whole = H.read_kinds().map(lambda k: ("file", k))
    row = st.tuples(st.integers(0, 20), st.integers(0, 30), st.sampled_from(_ROW_VALUES)).map(lambda d: ("row", d))
    return st.one_of(whole, row)


def _sqlite_of(drawn: Any, sc: H.Scene, make: Callable[[Path], None]) -> Path | str:
    """A database file: damaged rows of one ``make`` wrote, or a special file in its place."""
    how, what = drawn
    if how == "file":
        return sc.special(what, ".sqlite")
    p = sc.root / "db.sqlite"
    make(p)
    damage(p, what)
    return p


def _adapt_rows(drawn: Any, sc: H.Scene) -> Callable[[], Any]:
    def make(p: Path) -> None:
        _honest_adaptation(f"sqlite:///{p}")
    db = _sqlite_of(drawn, sc, make)

    def run() -> Any:
        from dippm_nas.graph import synthetic_resnet_graph
        from dippm_nas.predictor import get_predictor
        pred = get_predictor("a100-sxm4-40gb")
        if not hasattr(pred, "use_adaptation"):
            return H.Flagged("no GNN checkpoint answers for the device")
        pred.use_adaptation(storage=f"sqlite:///{db}")
        try:
            return pred.predict_graphs([synthetic_resnet_graph(2)])
        finally:
            _forget_adaptation(pred)
    return run


def _forget_adaptation(pred: Any) -> None:
    for attr in ("_adaptation", "_adapt_storage", "_adaptations"):
        if hasattr(pred, attr):
            with contextlib.suppress(Exception):
                setattr(pred, attr, None)
    from dippm_nas.predictor import set_predictor
    set_predictor("a100-sxm4-40gb", None)


def _honest_adaptation(url: str) -> None:
    """An adaptation stored the honest way (``adapt`` of a few measured graphs)."""
    from dippm_nas.graph import synthetic_resnet_graph
    from dippm_nas.predictor import GnnPredictor, get_predictor, set_predictor
    pred = get_predictor("a100-sxm4-40gb")
    if not isinstance(pred, GnnPredictor):
        return
    rows = []
    for i in range(1, 9):
        g = synthetic_resnet_graph(i)
        rows.append((g, {"latency_ms": 1.0 + i}))
    with contextlib.suppress(Exception):
        pred.adapt(rows, storage=url)
    set_predictor("a100-sxm4-40gb", None)


def _cache_rows(drawn: Any, sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.cache import ConversionCache
    from dippm_nas.graph import synthetic_resnet_graph

    def make(p: Path) -> None:
        c = ConversionCache(f"sqlite:///{p}")
        c.put("k1", synthetic_resnet_graph(1))
        c.close()
    db = _sqlite_of(drawn, sc, make)

    def run() -> Any:
        c = ConversionCache(f"sqlite:///{db}")
        try:
            return c.get("k1"), c.stats()
        finally:
            c.close()
    return run


def _dataset_rows(drawn: Any, sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.dataset import DatasetStore

    def make(p: Path) -> None:
        from dippm_nas.graph import synthetic_resnet_graph
        s = DatasetStore(p)
        g = synthetic_resnet_graph(1)
        s.add_graphs([(g, "m", None)])
        with contextlib.suppress(Exception):
            s.add_measurements([{"structural_hash": g.structural_hash, "device": "host-cpu", "latency_ms": 1.0,
                                 "status": "ok", "source": "measured-here"}])
        with contextlib.suppress(Exception):
            s.close()
    db = _sqlite_of(drawn, sc, make)
    if isinstance(db, Path):
        sc.inputs.append(db)

    def run() -> Any:
        from dippm_nas.dataset import load_measurements
        s = DatasetStore(db, create=False)
        try:
            return s.stats(), list(s.iter_measurements()), load_measurements(db, status=None)
        finally:
            with contextlib.suppress(Exception):
                s.close()
    return run


def _queue_rows(drawn: Any, sc: H.Scene) -> Callable[[], Any]:
    from dippm_nas.validation import JobQueue

    def make(p: Path) -> None:
        q = JobQueue(f"sqlite:///{p}")
        q.enqueue(study="s", trial_number=0, space="mlp", config={"in_features": 4},
                  spec={"shape": [4], "batch_size": 2, "dtype": "float32"}, device="a100-sxm4-40gb",
                  predicted={"latency_ms": 1.0})
        q.close()
    db = _sqlite_of(drawn, sc, make)

    def run() -> Any:
        q = JobQueue(f"sqlite:///{db}")
        try:
            return q.jobs(), q.counts(), q.results(), q.claim("a100-sxm4-40gb", "fuzz")
        finally:
            q.close()
    return run


def _capture(drawn: tuple[str, Any], sc: H.Scene) -> Callable[[], Any]:
    """``capture(model, spec)``: a model given as a text (``module:callable``, a file) or a spec of another type."""
    from dippm_nas import capture
    which, value = drawn
    if which == "model":
        if isinstance(value, tuple):
            value = sc.special(value[1], ".py")
        return lambda: capture(value, G.FIXTURES["InputSpec"]())
    return lambda: capture(G.FIXTURES["Module"](), value)


def _writer(which: str) -> Call:
    """``dippm_nas.files``: a hostile output path (a write kind, or a value of another type), with one input
    that ``symlink_to_input`` names (it must never change)."""
    def call(value: Any, sc: H.Scene) -> Callable[[], Any]:
        from dippm_nas import files
        from dippm_nas.errors import InvalidValueError
        src = sc.input_file(b"the writer's input\n", ".txt")
        path = sc.special(value, ".txt", target=src) if isinstance(value, str) and value in H.WRITE_KINDS else value
        kw = {"error": InvalidValueError, "inputs": [src]}
        if which == "check_output":
            return lambda: files.check_output(path, "--out", **kw)
        if which == "write_output":
            return lambda: files.write_output(path, "text", "--out", **kw)

        def through() -> Any:
            with files.output_path(path, "--out", **kw) as tmp:
                tmp.write_text("text")
        return through
    return call


def _write_targets() -> st.SearchStrategy[Any]:
    return st.one_of(H.write_kinds(), st.sampled_from((None, 5, H.Opaque(), "", b"bytes")))


_MODEL_TEXTS = ("os:system", "builtins:exit", "no_such_module_fz:build", "torchvision.models:resnet18x", ":",
                "a:b:c", "", "\x00", "x" * 5000, "torch.nn:Linear")
CUSTOM: dict[str, Entry] = {e.name: e for e in (
    *(Entry(f"dippm_nas.files.{w}", _write_targets(), _writer(w))
      for w in ("check_output", "output_path", "write_output")),
    Entry("dippm_nas.capture", st.one_of(
        st.tuples(st.just("model"), st.one_of(st.sampled_from(_MODEL_TEXTS), H.read_kinds().map(lambda k: ("p", k)),
                                              H.scalars())),
        st.tuples(st.just("spec"), st.one_of(H.scalars(), H.nested_values()))), _capture),
)}

READERS: dict[str, Entry] = {e.name: e for e in (
    _reader("reader:deployment file", _docs(*_TOML_BAD, *_JSON_BAD), _deployment_file, _FILE_EXAMPLES),
    _reader("reader:device toml", _docs(*_TOML_BAD), _device_toml, _FILE_EXAMPLES),
    _reader("reader:host profile", _docs(*_JSON_BAD), _host_profile, _FILE_EXAMPLES),
    _reader("reader:calibration file", st.tuples(H.read_kinds(), st.none(), st.sampled_from(("prior", "power")))
            | st.tuples(st.just("text"), st.sampled_from(_JSON_BAD), st.sampled_from(("prior", "power"))),
            _calibration_file),
    _reader("reader:checkpoint metadata", _docs(*_JSON_BAD), _checkpoint_meta, _FILE_EXAMPLES),
    _reader("reader:conformal calibration", _docs(*_JSON_BAD, '{"format": 1, "checkpoint_sha256": "x"}',
                                                   '{"format": 1, "checkpoint_sha256": "x", "scores": {"latency_ms": '
                                                   '{"all": ["a"]}}, "coverage": {}}'),
            _conformal_file, _FILE_EXAMPLES),
    _reader("reader:engine adaptation", _docs(*_JSON_BAD, '{"format": 1, "constants": []}'), _engine_adaptation,
            _FILE_EXAMPLES),
    _reader("reader:onnx file", _docs("garbage", "\x08\x07" * 100), _onnx, _FILE_EXAMPLES),
    _reader("reader:jsonl", st.tuples(H.read_kinds(), st.none(), st.just(""))
            | st.tuples(st.just("text"), st.sampled_from(_JSON_BAD), st.just("")), _jsonl,
            (("fifo", None, ""), ("deep_json", None, ""))),
    _reader("reader:campaign rows", _docs(*_JSON_BAD), _campaign_rows, _FILE_EXAMPLES),
    _reader("reader:training examples", _docs(*_JSON_BAD), _examples, _FILE_EXAMPLES),
    _reader("reader:importer csv", _docs("a,b\n1,2\n", "\x00,\x00\n", "model,latency_ms\nx,nan\n"), _importer_csv,
            _FILE_EXAMPLES),
    _reader("reader:llm config.json", _llm_configs(), _llm_config),
    _reader("reader:trial attrs", _trial_attrs(), _trial_record),
    _reader("reader:cache env", st.tuples(st.sampled_from(("dir", "url")),
                                          st.sampled_from(("fifo", "dev_null", "dangling_symlink", "empty",
                                                           "garbage", "url_garbage"))), _cache_env),
    _reader("reader:adaptation store rows", _row_damage(), _adapt_rows),
    _reader("reader:cache rows", _row_damage(), _cache_rows),
    _reader("reader:dataset rows", _row_damage(), _dataset_rows),
    _reader("reader:job-queue rows", _row_damage(), _queue_rows),
)}


# =============================================================================================== the CLI
#: Per verb: the arguments that make the rest of a command valid and quick (a hostile value is added to them).
#: ``{tmp}`` is the example's folder; ``{ds}`` a dataset file there (an input: its bytes must not change).
CLI_BASE: dict[str, list[str]] = {
    "inspect": ["inspect", "no_such_module_fz:build", "--shape", "4"],
    "dataset build": ["dataset", "build", "--space", "no-such-space", "--out", "{tmp}/built.sqlite", "--n", "1"],
    "dataset import": ["dataset", "import", "timm", "{tmp}/missing.csv", "--out", "{tmp}/imported.sqlite"],
    "dataset info": ["dataset", "info", "{ds}"],
    "dataset stats": ["dataset", "stats", "{ds}"],
    "dataset export": ["dataset", "export", "{ds}", "--out", "{tmp}/export.jsonl"],
    "train": ["train", "--data", "{tmp}/missing.jsonl", "--out", "{tmp}/model.pt"],
    "evaluate": ["evaluate", "--data", "{tmp}/missing.jsonl"],
    "checkpoints": ["checkpoints"],
    "predict": ["predict", "no_such_module_fz:build", "--shape", "4"],
    "predict-llm": ["predict-llm", "llama-2-7b", "--prompt", "8", "--output", "2"],
    "deployment": ["deployment", "--out", "{tmp}/d.toml"],
    "host-profile": ["host-profile", "--out", "{tmp}/h.json", "--name", "fuzz"],
    "devices": ["devices"],
    "demo": ["demo", "--trials", "1", "--seconds", "0.5", "--device", "no-such-device"],
    "validate-worker": ["validate-worker", "--storage", "sqlite:///{tmp}/q.sqlite", "--device", "no-such-device",
                        "--max-jobs", "1", "--idle-exit", "0.1"],
    "gpu-campaign": ["gpu-campaign", "--out", "{tmp}/campaign", "--minutes", "0.01", "--torch-device", "cuda:7"],
}

#: Every CLI verb and every option or positional argument that takes a value, with the kind of value it takes
#: (how a hostile value is drawn: ``number``, ``text``, ``choice``, ``spec`` a model, ``path`` a file read,
#: ``out`` a file written, ``url`` a storage URL). A verb or option the parser has and this table lacks fails
#: the coverage test.
CLI_OPTIONS: dict[str, str] = {
    "inspect": "SPEC:spec --batch:text --dtype:text --shape:text --input:text",
    "devices": "",
    "dataset build": ("--space:text --n:number --candidates:path --torch-device:number --device:text --batch:text "
        "--dtype:text --out:out --seed:number --mac-budget:number --workers:number --chunk:number "
        "--pin-cpu:number --threads:number --cpu-allocator:choice --warmup:number --min-repeats:number "
        "--max-repeats:number --rel-ci:number --time-cap:number --rounds:number --op-profiles:path "
        "--retry-failed:text"),
    "dataset import": "KIND:choice CSV:path --out:out --workers:number --limit:number",
    "dataset info": "PATH:path",
    "dataset stats": "PATH:path",
    "dataset export": "PATH:path --out:out --source:text",
    "train": ("--data:path --device:number --train-devices:text --split:choice --holdout:text "
        "--holdout-frac:number --seed:number --out:out --hidden:number --layers:number --members:number "
        "--epochs:number --patience:number --batch-size:number --lr:number --correction-penalty:text "
        "--style:choice --time-budget:number --targets:text --threads:number --source-note:text "
        "--report:out --dtypes:text --prior-params:path"),
    "evaluate": ("--data:path --device:number --train-devices:text --split:choice --holdout:text "
        "--holdout-frac:number --seed:number --checkpoint:path --out:out --png:out --eval-device:number "
        "--json-out:out --json:text --calibrate:text --deployment:path --runtime:number --host:path "
        "--framework:choice --tf32:choice --autocast:choice --input-copy:choice"),
    "checkpoints": "--device:text --metrics:number",
    "predict": ("SPEC:spec --device:text --batch:text --dtype:text --shape:text --input:text --deployment:path "
        "--runtime:number --host:path --framework:choice --tf32:choice --autocast:choice "
        "--input-copy:choice"),
    "predict-llm": ("SPEC:spec --prompt:number --output:number --batch:text --device:text --runtime:text "
        "--engine:text --dtype:text --kv-dtype:text --kv-block-size:number --tp:number --interconnect:text"),
    "deployment": ("--out:out --name:text --runtime:number --framework:choice --tf32:choice --autocast:choice "
        "--input-copy:choice"),
    "host-profile": "--out:out --name:text",
    "demo": ("--trials:number --seconds:number --out:out --storage:url --study-name:text --seed:number "
        "--sampler:choice --train-seconds:number --epochs:number --device:text --dtype:choice "
        "--batch:number --deployment:path --runtime:number --host:path --framework:choice --tf32:choice "
        "--autocast:choice --input-copy:choice --mig-profile:text --latency-budget-ms:number "
        "--validate-every:number --validate-max:number --validate-batch:number --background:number "
        "--threads:number"),
    "validate-worker": ("--storage:url --device:text --torch-device:number --cuda-device:text --study:text "
        "--max-jobs:number --idle-exit:number --poll:number --lease:number --max-attempts:number "
        "--warmup:number --min-repeats:number --max-repeats:number --time-cap:number --threads:number "
        "--rounds:number --rounds-batch:number"),
    "gpu-campaign": ("--out:out --minutes:number --torch-device:number --device:text --set:choice --runtimes:text "
        "--dtypes:text --batch:text --batches:text --time-cap:number --threads:number "
        "--max-file-mib:number"),
}

#: The value kinds of CLI options: how a hostile value is drawn for each.
_CLI_TEXT = ("", "\x00", "x" * 5000, "-", "--", "nan", "inf", "-1", "0", "1e400", "9" * 400, "0x10", "1,,2",
             " ", "\u202e", "a b", "=", "../../x")


_CLI_NUMBERS = ("nan", "inf", "-inf", "-1", "0", "1e400", "9" * 400, "0x10", "1.5", "", "two", "1,2", "-0")
_CLI_URLS = ("sqlite:///", "nosuchdb://x", "postgresql://u:p@127.0.0.1:notaport/db", "sqlite:////nonexistent/dir/x.db",
             "", "::", "x" * 5000)


def _cli_value(kind: str) -> st.SearchStrategy[Any]:
    """Hostile texts for an option of ``kind`` (CLI_OPTIONS), plus special files for a path."""
    texts = st.sampled_from(_CLI_TEXT)
    if kind == "number":
        return st.one_of(st.sampled_from(_CLI_NUMBERS), texts)
    if kind == "url":
        return st.one_of(st.sampled_from(_CLI_URLS), texts)
    if kind == "spec":
        return st.one_of(st.sampled_from(_MODEL_TEXTS), texts, H.read_kinds().map(lambda k: ("path", k)))
    if kind == "path":
        return st.one_of(texts, H.read_kinds().map(lambda k: ("path", k)))
    if kind == "out":
        return st.one_of(texts, H.write_kinds().map(lambda k: ("path", k)))
    return st.one_of(texts, st.text(max_size=12))


#: The file ending a verb's path option expects (a special file is named so, to get past the ending's check).
_SUFFIX = {"dataset export": ".jsonl", "deployment": ".toml", "train": ".pt", "dataset import": ".csv"}


def _writes(flag: str) -> bool:
    return flag.lower() in ("--out", "--report", "--png", "--json-out")


def _dataset_file(sc: H.Scene) -> Path:
    from dippm_nas.dataset import DatasetStore
    from dippm_nas.graph import synthetic_resnet_graph
    p = sc.root / "ds.sqlite"
    s = DatasetStore(p)
    s.add_graphs([(synthetic_resnet_graph(1), "m", None)])
    with contextlib.suppress(Exception):
        s.close()
    sc.inputs.append(p)
    return p


def _cli_call(surface: str, action: argparse.Action) -> Call:
    words = surface[len("cli:"):].split()
    flag = words[-1] if action.option_strings or (action.dest.upper() == words[-1]) else ""
    verb = " ".join(words[:-1]) if flag else " ".join(words)

    def call(value: Any, sc: H.Scene) -> Callable[[], Any]:
        ds = _dataset_file(sc) if verb.startswith("dataset") else None
        if isinstance(value, tuple):
            value = sc.special(value[1], _SUFFIX.get(verb, ".json"), target=ds, output=_writes(flag))
        base = [w.format(tmp=sc.root, ds=ds) for w in CLI_BASE[verb]]
        if not flag:
            argv = base
        elif action.option_strings:
            argv = [*base, flag, value] if action.nargs != "?" else [*base, f"{flag}={value}"]
        else:  # a positional: the hostile value replaces the base's
            argv = _replace_positional(base, verb, action, value)
        return lambda: _run_cli(argv)
    return call


def _replace_positional(base: list[str], verb: str, action: argparse.Action, value: str) -> list[str]:
    n = len(verb.split())
    rest = base[n:]
    positionals = [i for i, w in enumerate(rest) if not w.startswith("-") and (i == 0 or not rest[i - 1]
                                                                             .startswith("--"))]
    index = {"spec": 0, "kind": 0, "csv": 1, "path": 0}.get(action.dest, 0)
    if positionals and index < len(positionals):
        rest[positionals[index]] = value
    else:
        rest.insert(0, value)
    return base[:n] + rest


class CliExit(int):
    """The exit status of a CLI run (an int the classifier reads)."""


def _run_cli(argv: list[str]) -> Any:
    from dippm_nas.cli import main
    import logging
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        rc = main(argv)
    finally:  # main()'s logging.basicConfig adds a handler to stderr, which the next run would reuse
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
    if rc not in (0, 1, 2):
        raise AssertionError(f"exit status {rc}, expected 0, 1 or 2")
    if rc in (1, 2):
        raise _CliError(rc)
    return CliExit(rc)


class _CliError(Exception):
    def __init__(self, rc: int) -> None:
        super().__init__(f"exit {rc}")
        self.rc = rc


def _cli_table() -> dict[str, str]:
    """``{"cli:VERB": "verb", "cli:VERB FLAG": kind}`` of :data:`CLI_OPTIONS`."""
    out = {}
    for verb, options in CLI_OPTIONS.items():
        out[f"cli:{verb}"] = "verb"
        for item in options.split():
            flag, _, kind = item.partition(":")
            out[f"cli:{verb} {flag}"] = kind
    return out


def cli_entries(surfaces: dict[str, argparse.Action]) -> dict[str, Entry]:
    """The entries of the surfaces :data:`CLI_OPTIONS` registers (a surface it lacks gets none)."""
    out = {}
    for surface, kind in _cli_table().items():
        action = surfaces.get(surface)
        if action is None:
            out[surface] = Entry(surface, reason="not in this parser (registered for another version)")
            continue
        verb = surface[len("cli:"):] if kind == "verb" else surface[len("cli:"):].rsplit(" ", 1)[0]
        if verb not in CLI_BASE:
            out[surface] = Entry(surface)  # no base command: the coverage test names it
            continue
        strategy = st.just(None) if kind == "verb" else _cli_value(kind)
        examples = {"out": (("path", "symlink_to_input"), ("path", "fifo")),
                    "path": (("path", "fifo"), ("path", "deep_json"))}.get(kind, ())
        out[surface] = Entry(surface, strategy, _cli_call(surface, action), examples=examples)
    return out


# =============================================================================================== credentials
def _pw_urls() -> list[str]:
    return [f"postgresql+psycopg2://fuzzer:{H.PASSWORD}@127.0.0.1:1/dippm",
            f"postgresql+psycopg2://fuzzer:{H.PASSWORD}@127.0.0.1:notaport/dippm",
            f"mysql+nosuchdriver://fuzzer:{H.PASSWORD}@127.0.0.1/dippm",
            f"postgresql://fuzzer:{H.PASSWORD}@[::1/dippm"]


def _cred_adapt(url: str) -> list[Any]:
    from dippm_nas.predictor import AdaptationStore
    s = AdaptationStore(url)
    return [s, lambda: s.rows("k"), lambda: s.newest("k"), s.close]


def _cred_queue(url: str) -> list[Any]:
    from dippm_nas.validation import JobQueue
    q = JobQueue(url)
    return [q, q.jobs, lambda: q.claim("a100-sxm4-40gb", "fuzz")]


def _cred_cache(url: str) -> list[Any]:
    from dippm_nas.cache import ConversionCache
    c = ConversionCache(url)
    return [c, lambda: c.get("k"), c.stats]


def _cred_rdb(url: str) -> list[Any]:
    from dippm_nas.optuna import rdb_storage
    return [rdb_storage(url)]


def _cred_worker(url: str) -> list[Any]:
    from dippm_nas.validation import JobQueue, ValidationWorker
    q = JobQueue(url)
    w = ValidationWorker(q, "host-cpu")
    return [w, lambda: w.run_one()]


def _cred_cost_model(url: str) -> list[Any]:
    from dippm_nas.optuna import HardwareCostModel
    m = HardwareCostModel("a100-sxm4-40gb", cache=url)
    return [m, lambda: m.create_study(storage=url)]


def _cred_use_adaptation(url: str) -> list[Any]:
    from dippm_nas.graph import synthetic_resnet_graph
    from dippm_nas.predictor import get_predictor, set_predictor
    pred = get_predictor("a100-sxm4-40gb")
    if not hasattr(pred, "use_adaptation"):
        return []
    try:
        pred.use_adaptation(storage=url)
        return [pred, lambda: pred.predict_graphs([synthetic_resnet_graph(1)])]
    finally:
        set_predictor("a100-sxm4-40gb", None)


def _cred_adapt_call(url: str) -> list[Any]:
    from dippm_nas.graph import synthetic_resnet_graph
    from dippm_nas.predictor import get_predictor, set_predictor
    pred = get_predictor("a100-sxm4-40gb")
    if not hasattr(pred, "adapt"):
        return []
    rows = [(synthetic_resnet_graph(i), {"latency_ms": 1.0 + i}) for i in range(1, 4)]
    try:
        return [lambda: pred.adapt(rows, storage=url)]
    finally:
        set_predictor("a100-sxm4-40gb", None)


#: Every object or call that holds a storage URL: its repr, str, raised messages, logs and warnings.
CREDENTIALS: dict[str, Callable[[str], list[Any]]] = {
    "dippm_nas.predictor.AdaptationStore": _cred_adapt,
    "dippm_nas.validation.JobQueue": _cred_queue,
    "dippm_nas.cache.ConversionCache": _cred_cache,
    "dippm_nas.optuna.rdb_storage": _cred_rdb,
    "dippm_nas.validation.ValidationWorker": _cred_worker,
    "dippm_nas.optuna.HardwareCostModel": _cred_cost_model,
    "dippm_nas.predictor.GnnPredictor.use_adaptation": _cred_use_adaptation,
    "dippm_nas.predictor.GnnPredictor.adapt": _cred_adapt_call,
}


def credential_case(name: str, url: str) -> H.Result:
    """Build ``name``'s object with ``url``, call its methods; ``leaked`` when the password shows anywhere."""
    texts: list[str] = []

    def go() -> None:
        try:
            parts = CREDENTIALS[name](url)
        except BaseException as e:  # noqa: BLE001 - the message is what is checked
            texts.extend((str(e), repr(e), str(e.__cause__ or ""), str(e.__context__ or "")))
            return
        for p in parts:
            if callable(p) and not hasattr(p, "__dict__") or inspect.ismethod(p) or inspect.isfunction(p):
                try:
                    r = p()
                    texts.extend((repr(r), str(r)))
                except BaseException as e:  # noqa: BLE001
                    texts.extend((str(e), repr(e), str(e.__cause__ or ""), str(e.__context__ or "")))
            else:
                texts.extend((repr(p), str(p)))

    with H.scene() as sc:
        res = H.run_case(go, sc, deadline_s=60.0)
    texts += res.messages
    hits = [t for t in texts if H.PASSWORD in t]
    if hits:
        return H.Result("leaked", hits[0][:300], texts)
    if res.outcome in ("crash", "hang"):
        return res
    return H.Result("clear error", "no password in any text", texts)


# =============================================================================================== the registry
def build_registry(surfaces: dict[str, argparse.Action] | None = None) -> dict[str, Entry]:
    reg: dict[str, Entry] = {}
    for names, reason in ((CONSTANTS, "a constant: a value, not an entry point"),
                          (TYPE_ALIASES, "a type alias for annotations"),
                          (EXCEPTIONS, "an exception class: raised by dippm-nas, not given a user's input"),
                          (MODULES, "a module: its names are registered under its own face"),
                          (RECORDS, "a record dippm-nas returns; the functions building it are fuzzed")):
        for n in names:
            reg[n] = Entry(n, reason=reason)
    for n, reason in {**NO_ARGUMENT, **OBJECT_ONLY, **NEEDS_OBJECTS, **KERNELS, **THROUGH}.items():
        reg[n] = Entry(n, reason=f"fuzzed as {reason}" if reason.startswith("reader:") else reason)
    for n in GENERIC:
        reg[n] = _generic(n)
    reg.update(CUSTOM)
    reg.update(READERS)
    reg.update(cli_entries(surfaces if surfaces is not None else cli_surfaces()))
    return reg


def missing(registry: dict[str, Entry], names: dict[str, list[str]], surfaces: dict[str, argparse.Action]
            ) -> list[str]:
    """Public names, verbs and options with no entry, and entries with neither a strategy nor a reason."""
    out = [paths[0] for paths in names.values() if not any(p in registry for p in paths)]
    out += [s for s in surfaces if s not in registry]
    out += [e.name + " (no strategy and no reason)" for e in registry.values()
            if not e.exempt and (e.strategy is None or e.call is None)]
    return sorted(out)


def run_entry(entry: Entry, profile: Any, *, record: Callable[[H.Result], None]) -> None:
    """Draw hostile inputs for ``entry`` under ``profile`` (Hypothesis settings, or a number of examples drawn
    derandomized) and hand each result to ``record``."""
    from hypothesis import HealthCheck, Phase, example, given, settings

    if isinstance(profile, int):
        profile = settings(max_examples=profile, deadline=None, database=None, derandomize=True,
                           phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))

    def one(value: Any) -> None:
        with H.scene() as sc:
            res = H.run_case(entry.call(value, sc), sc, oracle=entry.oracle)
        record(classify_cli(res) if entry.name.startswith("cli:") else res)

    for value in reversed(entry.examples):
        one = example(value=value)(one)
    profile(given(value=entry.strategy)(one))()


def classify_cli(res: H.Result) -> H.Result:
    """A CLI run's exit 1 or 2 is the verb's clear error; anything escaping ``main`` is a crash."""
    if res.outcome == "crash" and res.detail.startswith("_CliError"):
        return H.Result("clear error", res.detail.replace("_CliError: ", ""), res.messages)
    return res


def _public_here(path: str) -> bool:
    try:
        _resolve(path)
    except (ImportError, AttributeError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=5)
    ap.add_argument("--only", default="", help="run the entries whose name contains this text")
    ap.add_argument("--json", type=Path, help="write every case's outcome here")
    args = ap.parse_args(argv)
    import tempfile

    from hypothesis.configuration import set_hypothesis_home_dir
    os.environ["DIPPM_NAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="dippm-fuzz-cache-")  # never the user's cache
    set_hypothesis_home_dir(tempfile.mkdtemp(prefix="dippm-fuzz-hypothesis-"))  # nothing in the repository
    os.environ.pop("DIPPM_NAS_CACHE_URL", None)
    surfaces = cli_surfaces()
    reg = build_registry(surfaces)
    gaps = missing(reg, public_names(), surfaces)
    counts = dict.fromkeys(H.OUTCOMES, 0)
    bad: dict[str, list[str]] = {}
    for e in reg.values():
        if e.exempt or e.strategy is None or args.only not in e.name:
            continue
        if e.name.startswith("dippm_nas.") and not _public_here(e.name):
            continue  # a name this tree does not have (the registry run against an older tree)
        def rec(r: H.Result, name: str = e.name) -> None:
            counts[r.outcome] += 1
            if r.outcome in H.BAD:
                bad.setdefault(name, []).append(str(r)[:240])
        try:
            run_entry(e, args.examples, record=rec)
        except Exception as ex:  # noqa: BLE001 - a strategy or a set-up that fails is reported, not fatal
            bad.setdefault(e.name, []).append(f"set-up failed: {type(ex).__name__}: {ex}"[:240])
            counts["crash"] += 1
        print(f"{e.name}: {len(bad.get(e.name, []))} bad", file=sys.stderr, flush=True)
    for name in ((n for n in CREDENTIALS if args.only in n)):
        for url in _pw_urls():
            r = credential_case(name, url)
            counts[r.outcome] += 1
            if r.outcome in H.BAD:
                bad.setdefault(f"credential:{name}", []).append(str(r)[:240])
    fuzzed = sum(1 for e in reg.values() if not e.exempt)
    print(json.dumps({"entries": len(reg), "fuzzed": fuzzed, "exempt": len(reg) - fuzzed,
                      "unregistered": gaps, "cases": sum(counts.values()), "counts": counts}, indent=1))
    for name, items in sorted(bad.items()):
        print(f"{name}: {items[0]}" + (f"  (+{len(items) - 1} more)" if len(items) > 1 else ""))
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "bad": bad}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
