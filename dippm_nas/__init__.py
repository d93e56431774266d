"""dippm-nas: a hardware-aware cost model for neural architecture search.

Give it a model and an :class:`InputSpec`; get its operator graph (:func:`capture`) and predicted
latency, energy and memory on a GPU.
"""

from __future__ import annotations

import logging

from dippm_nas._version import __version__  # noqa: E402

from dippm_nas.capture import CaptureResult, capture, capture_many  # noqa: E402
from dippm_nas.errors import (  # noqa: E402
    CacheError,
    CheckpointError,
    DeviceError,
    DippmNasError,
    GraphCaptureError,
    GraphValidationError,
    InputShapeError,
    InputSpecError,
    InvalidValueError,
    MeasurementError,
    MissingDependencyError,
    ModelSpecError,
    OutOfMemoryError,
    SearchSpaceError,
    UnsupportedDtypeError,
    UnsupportedOpError,
    ValidationError,
)
from dippm_nas import mig, prior  # noqa: E402
from dippm_nas.devices import Device, get_device, list_devices, register_device  # noqa: E402
from dippm_nas.graph import OperatorGraph, OpNode  # noqa: E402
from dippm_nas.prediction import Prediction  # noqa: E402
from dippm_nas.predictor import get_predictor, predict, predict_many  # noqa: E402
from dippm_nas.spec import InputSpec, TensorSpec  # noqa: E402
from dippm_nas.stages import Stage, StagesPrediction, predict_stages, sum_stages  # noqa: E402

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "InputSpec", "TensorSpec", "capture", "capture_many", "CaptureResult", "predict", "predict_many",
    "get_predictor", "Device", "get_device", "list_devices", "register_device", "mig", "prior",
    "OperatorGraph", "OpNode", "Prediction", "Stage", "StagesPrediction", "predict_stages", "sum_stages",
    "DippmNasError", "InvalidValueError", "InputSpecError", "InputShapeError", "UnsupportedDtypeError",
    "ModelSpecError",
    "GraphCaptureError", "GraphValidationError", "UnsupportedOpError", "CacheError", "DeviceError",
    "MeasurementError", "OutOfMemoryError", "CheckpointError", "SearchSpaceError", "MissingDependencyError",
    "ValidationError",
]
