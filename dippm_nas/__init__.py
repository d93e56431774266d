"""dippm-nas: a hardware-aware cost model for neural architecture search.

Give it a model and an :class:`InputSpec`; get its operator graph (:func:`capture`) and predicted
latency, energy and memory on a GPU.

``import dippm_nas`` loads neither torch, TVM nor SQLAlchemy: :func:`capture` loads what a capture needs
when it runs, and the names of the later stages (the predictor, ``predict_stages``, the devices, the prior
and MIG advice) are imported on first access (PEP 562), so a ``predict`` of a graph in the conversion cache
starts fast.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dippm_nas._lazy import lazy_face
from dippm_nas._version import __version__
# `capture` is both the subpackage and its function: bound here, before anything imports the subpackage, so
# that `dippm_nas.capture` is the function whatever is imported later
from dippm_nas.capture import CaptureResult, ModelSource, capture, capture_many
from dippm_nas.errors import (
    CacheError,
    CheckpointError,
    DeploymentError,
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
from dippm_nas.graph import OperatorGraph, OpNode
from dippm_nas.spec import InputSpec, TensorSpec

if TYPE_CHECKING:  # pragma: no cover - what __getattr__ returns, for type checkers
    from dippm_nas import llm, mig, prior
    from dippm_nas.deployment import Deployment
    from dippm_nas.devices import Device, get_device, list_devices, register_device
    from dippm_nas.llm import GenerationPrediction, LLMWorkload, predict_generation
    from dippm_nas.prediction import Prediction
    from dippm_nas.predictor import get_predictor, predict, predict_many
    from dippm_nas.stages import Stage, StagesPrediction, predict_stages, sum_stages

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "InputSpec", "TensorSpec", "ModelSource", "capture", "capture_many", "CaptureResult", "predict", "predict_many",
    "get_predictor", "Deployment", "Device", "get_device", "list_devices", "register_device", "mig", "prior",
    "OperatorGraph", "OpNode", "Prediction", "Stage", "StagesPrediction", "predict_stages", "sum_stages",
    "LLMWorkload", "predict_generation", "GenerationPrediction", "llm",
    "DippmNasError", "InvalidValueError", "InputSpecError", "InputShapeError", "UnsupportedDtypeError",
    "ModelSpecError", "DeploymentError",
    "GraphCaptureError", "GraphValidationError", "UnsupportedOpError", "CacheError", "DeviceError",
    "MeasurementError", "OutOfMemoryError", "CheckpointError", "SearchSpaceError", "MissingDependencyError",
    "ValidationError",
]

#: The names imported on first access, by the module that defines them.
__getattr__, __dir__ = lazy_face(__name__, {
    "dippm_nas.devices": ("Device", "get_device", "list_devices", "register_device"),
    "dippm_nas.prediction": ("Prediction",),
    "dippm_nas.deployment": ("Deployment",),
    "dippm_nas.predictor": ("get_predictor", "predict", "predict_many"),
    "dippm_nas.stages": ("Stage", "StagesPrediction", "predict_stages", "sum_stages"),
    "dippm_nas.mig": ("mig",),
    "dippm_nas.prior": ("prior",),
    "dippm_nas.llm": ("LLMWorkload", "predict_generation", "GenerationPrediction", "llm"),
})
