"""Capture: a model (``nn.Module``, ONNX file, SPEC string) -> :class:`~dippm_nas.graph.OperatorGraph`."""

from dippm_nas.capture._capture import capture
from dippm_nas.capture._key import converter_version, file_key, model_key
from dippm_nas.capture._many import CaptureResult, capture_many
from dippm_nas.capture._torch import MODES

__all__ = ["capture", "capture_many", "CaptureResult", "model_key", "file_key", "converter_version", "MODES"]
