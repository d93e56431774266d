"""Predictors: the plug-in point, the analytic stand-in, ``predict`` and ``predict_many``."""

from dippm_nas.predictor._api import DEFAULT_DEVICE, get_predictor, predict, predict_many, set_predictor
from dippm_nas.predictor._base import AnalyticPredictor, BasePredictor
from dippm_nas.predictor._calibrate import Calibration, TimelineFactors, fit_timeline_factors
from dippm_nas.predictor._gnn import GnnPredictor

__all__ = ["predict", "predict_many", "get_predictor", "set_predictor", "DEFAULT_DEVICE", "BasePredictor",
           "AnalyticPredictor", "GnnPredictor", "Calibration", "TimelineFactors", "fit_timeline_factors"]
