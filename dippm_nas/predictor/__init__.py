"""Predictors: the plug-in point, the analytic stand-in, ``predict`` and ``predict_many``, and the trained
GraphSAGE predictor (load a checkpoint, featurise, infer, calibrate).

Training checkpoints is :mod:`dippm_nas.training`.
"""

from dippm_nas.predictor._api import DEFAULT_DEVICE, get_predictor, predict, predict_many, set_predictor
from dippm_nas.predictor._base import AnalyticPredictor, BasePredictor
from dippm_nas.predictor._calibrate import (ANALYTIC_IDENTITY, CALIBRATION_CLASSES, CLASS_SPREAD_LOG,
                                            SCATTER_FLOOR_LOG, Calibration, TimelineFactors, calibration_classes,
                                            calibration_path, checkpoint_identity, delete_calibration,
                                            fit_calibration, fit_timeline_factors, load_calibration,
                                            save_calibration)
from dippm_nas.predictor._checkpoint import (CHECKPOINT_DIR_ENV, HOST_DEVICE, OTHER_HOST_FLOOR_LOG,
                                             OTHER_MACHINE_FLOOR_LOG, checkpoint_dirs, find_checkpoint,
                                             host_checkpoints)
from dippm_nas.predictor._ensemble import DELTA_MARGIN, INFER_CHUNK_NODES, SageEnsemble, collate, collate_globals
from dippm_nas.predictor._gnn import GnnPredictor
from dippm_nas.predictor._meta import CHECKPOINT_FORMAT, TARGET_UNITS, TARGETS, CheckpointMeta
from dippm_nas.predictor._novelty import NoveltyFloor, correction_weight, novelty_floor_log, novelty_scores

__all__ = ["predict", "predict_many", "get_predictor", "set_predictor", "DEFAULT_DEVICE", "BasePredictor",
           "AnalyticPredictor", "GnnPredictor", "Calibration", "TimelineFactors", "fit_timeline_factors",
           "fit_calibration", "checkpoint_identity", "calibration_path", "load_calibration", "save_calibration",
           "delete_calibration", "calibration_classes", "CALIBRATION_CLASSES", "CLASS_SPREAD_LOG", "SCATTER_FLOOR_LOG",
           "ANALYTIC_IDENTITY",
           "CHECKPOINT_DIR_ENV", "HOST_DEVICE", "OTHER_HOST_FLOOR_LOG", "OTHER_MACHINE_FLOOR_LOG", "checkpoint_dirs",
           "find_checkpoint", "host_checkpoints",
           "SageEnsemble", "collate", "collate_globals", "DELTA_MARGIN", "INFER_CHUNK_NODES",
           "CheckpointMeta", "TARGETS", "TARGET_UNITS", "CHECKPOINT_FORMAT",
           "NoveltyFloor", "novelty_scores", "correction_weight", "novelty_floor_log"]
