"""Predictors: the plug-in point, the analytic stand-in, ``predict`` and ``predict_many``, and the trained
GraphSAGE predictor (load a checkpoint, featurise, infer, calibrate).

Training checkpoints is :mod:`dippm_nas.training`.

The torch ensemble and its batching (``SageEnsemble``, ``TorchEngine``, ``collate``, ``collate_globals``,
``DELTA_MARGIN``) are imported on first access (PEP 562), so that a prediction through the numpy engine
(:class:`NumpyEnsemble`) never loads torch; so is ``AdaptationStore`` (SQLAlchemy), so that a prediction that
reads an adaptation from a SQLite file never loads SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dippm_nas._lazy import lazy_face
from dippm_nas.predictor._adapt import (ANY_SPACE, HANDOVER_ROWS, HEAD_MIN_ROWS, RIDGE_GRID, Adaptation, AdaptationKey,
                                        ResidualHead, deployment_key, fit_residual_head)
from dippm_nas.predictor._adapt_store import default_adapt_url
from dippm_nas.predictor._api import DEFAULT_DEVICE, PREDICT_CHUNK, get_predictor, predict, predict_many, set_predictor
from dippm_nas.predictor._base import BATCH_MIN_GRAPHS, AnalyticPredictor, BasePredictor, resolve_deployment
from dippm_nas.predictor._calibrate import (ANALYTIC_IDENTITY, CALIBRATION_CLASSES, CLASS_SPREAD_LOG,
                                            MAX_CORRECTION_LOG, SCATTER_FLOOR_LOG, SLOPE_BOUNDS, Calibration,
                                            TimelineFactors, calibration_classes, calibration_path,
                                            calibration_problems, checkpoint_identity, delete_calibration,
                                            fit_calibration, fit_timeline_factors, load_calibration,
                                            read_calibration, save_calibration)
from dippm_nas.predictor._checkpoint import (CHECKPOINT_DIR_ENV, DEFAULT_HOST_TAG, HOST_DEVICE, OTHER_HOST_FLOOR_LOG,
                                             OTHER_MACHINE_FLOOR_LOG, CheckpointInfo, Citation, checkpoint_dirs,
                                             checkpoint_name, find_checkpoint, host_checkpoints, list_checkpoints)
from dippm_nas.predictor._gnn import GnnPredictor
from dippm_nas.predictor._meta import CHECKPOINT_FORMAT, TARGET_UNITS, TARGETS, CheckpointMeta
from dippm_nas.predictor._novelty import NoveltyFloor, correction_weight, novelty_floor_log, novelty_scores
from dippm_nas.predictor._numpy_ensemble import (INFER_CHUNK_NODES, NUMPY_MAX_GRAPHS, NumpyEnsemble, checkpoint_digest,
                                                  derived_weights_path, global_arrays)

if TYPE_CHECKING:  # pragma: no cover - what __getattr__ returns, for type checkers
    from dippm_nas.predictor._adapt_sql import AdaptationStore
    from dippm_nas.predictor._ensemble import DELTA_MARGIN, SageEnsemble, TorchEngine, collate, collate_globals

__all__ = ["predict", "predict_many", "get_predictor", "set_predictor", "DEFAULT_DEVICE", "PREDICT_CHUNK",
           "BasePredictor", "resolve_deployment",
           "BATCH_MIN_GRAPHS",
           "AnalyticPredictor", "GnnPredictor", "Calibration", "TimelineFactors", "fit_timeline_factors",
           "fit_calibration", "checkpoint_identity", "calibration_path", "load_calibration", "save_calibration",
           "delete_calibration", "calibration_classes", "CALIBRATION_CLASSES", "CLASS_SPREAD_LOG", "SCATTER_FLOOR_LOG",
           "ANALYTIC_IDENTITY", "MAX_CORRECTION_LOG", "SLOPE_BOUNDS", "calibration_problems", "read_calibration",
           "CHECKPOINT_DIR_ENV", "HOST_DEVICE", "OTHER_HOST_FLOOR_LOG", "OTHER_MACHINE_FLOOR_LOG", "checkpoint_dirs",
           "find_checkpoint", "host_checkpoints", "DEFAULT_HOST_TAG", "CheckpointInfo", "Citation", "checkpoint_name",
           "list_checkpoints",
           "SageEnsemble", "TorchEngine", "collate", "collate_globals", "DELTA_MARGIN", "INFER_CHUNK_NODES",
           "NumpyEnsemble", "NUMPY_MAX_GRAPHS", "global_arrays", "checkpoint_digest", "derived_weights_path",
           "CheckpointMeta", "TARGETS", "TARGET_UNITS", "CHECKPOINT_FORMAT",
           "NoveltyFloor", "novelty_scores", "correction_weight", "novelty_floor_log",
           "Adaptation", "AdaptationKey", "ResidualHead", "AdaptationStore", "fit_residual_head", "deployment_key",
           "default_adapt_url", "HANDOVER_ROWS", "HEAD_MIN_ROWS", "RIDGE_GRID", "ANY_SPACE"]

#: The names of the torch ensemble module and of the SQLAlchemy adaptation store, imported on first access.
__getattr__, __dir__ = lazy_face(__name__, {
    "dippm_nas.predictor._ensemble": ("SageEnsemble", "TorchEngine", "collate", "collate_globals", "DELTA_MARGIN"),
    "dippm_nas.predictor._adapt_sql": ("AdaptationStore",),
})
