"""NNI integration: hardware-aware HPO and NAS without a GPU in the loop.

- Budgets: :class:`Budgets` (the same type as :mod:`dippm_nas.optuna`'s, from :mod:`dippm_nas.budgets`),
  chance constraints ``mean + k_sigma * std <= budget`` with ``k_sigma`` 1.0 by default.
  :class:`Constraints` (``max_latency_ms``...) is its deprecated former name.
- Trial side: :func:`report` sends ``{'default', 'accuracy', 'latency_ms', 'energy_j', 'memory_mib',
  'constraints', 'mig', ...}`` with ``nni.report_final_result``; ``default`` is accuracy with a budget
  penalty (:func:`scalarize`, MnasNet's reward) because NNI tuners optimise only ``metric['default']``;
  ``constraints`` holds each budget's chance check (absolute units, ``<= 0`` feasible, as in Optuna).
- Tuner side: :class:`HardwareAwareTuner`, a multi-objective tuner over Optuna's samplers that predicts each
  candidate's cost and skips predicted-infeasible ones before they cost a trial (``CustomAlgorithmConfig(
  class_name="dippm_nas.nni.HardwareAwareTuner", ...)``). The model comes from a registered search space
  (``builder``) or any ``model_factory`` (``package.module:callable``); the study can live in an Optuna
  storage, so ``nnictl resume`` continues it. Trials rebuild the model with :func:`model_from_parameters`
  and :func:`report` reads the tuner's budgets from the trial's parameters (:func:`tuner_settings`).
- Search spaces: :func:`parse_search_space` accepts every NNI type (:data:`SUPPORTED_TYPES`, nested
  choices included) with NNI's meaning (:func:`quantize` is its ``q`` rounding).
- NAS: :class:`DippmProfiler`, an ``nni.nas.profiler.Profiler`` for ``Chain(strategy, Filter(...))``, and
  the example space :class:`TinyConvSpace`.
- Network: NNI's manager listens on every interface with no option to change it; :func:`loopback_only`
  keeps it on 127.0.0.1 for the local training service (see ``examples/nni/README.md``).

NNI is optional: ``pip install 'dippm-nas[nni]'`` (HPO) or ``'dippm-nas[nas]'`` (NAS, adds the lightning
packages NNI's NAS imports). The names that need NNI import it on first use and say what to install when
it is missing; :func:`final_metrics`, :func:`scalarize`, :class:`Budgets`, the search-space helpers
(they need Optuna, a core dependency) and the network helpers do not need it.
"""

from __future__ import annotations

from dippm_nas._lazy import lazy_face
from dippm_nas.budgets import Budgets
from dippm_nas.nni._network import LOOPBACK_PRELOAD_JS, free_port, loopback_only, write_loopback_preload
from dippm_nas.nni._report import METRIC_KEYS, final_metrics, mig_label, report, tuner_settings
from dippm_nas.nni._scalarize import Constraints, scalarize
from dippm_nas.nni._space import (
    PARAMETERS_KEY, SUPPORTED_TYPES, model_from_parameters, parse_search_space, quantize, spec_from_parameters,
)

__all__ = [
    "report", "final_metrics", "METRIC_KEYS", "mig_label", "tuner_settings", "Budgets", "Constraints", "scalarize",
    "HardwareAwareTuner", "TunerStats", "STATS_FILE_NAME", "model_from_parameters", "spec_from_parameters", "parse_search_space",
    "SUPPORTED_TYPES", "quantize", "PARAMETERS_KEY",
    "DippmProfiler", "TinyConvSpace",
    "loopback_only", "write_loopback_preload", "LOOPBACK_PRELOAD_JS", "free_port",
]

# Names whose modules import NNI (and, for NAS, the lightning packages): loaded on first access, so that
# `import dippm_nas.nni` works without NNI and NNI's dispatcher can still import the tuner by class path.
__getattr__, __dir__ = lazy_face(__name__, {
    "dippm_nas.nni._tuner": ("HardwareAwareTuner", "TunerStats", "STATS_FILE_NAME"),
    "dippm_nas.nni._profiler": ("DippmProfiler",),
    "dippm_nas.nni._example_space": ("TinyConvSpace",),
})
