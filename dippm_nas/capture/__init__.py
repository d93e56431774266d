"""Capture: a model (``nn.Module``, ONNX file, SPEC string, factory) -> :class:`~dippm_nas.graph.OperatorGraph`.

What a user hands in is parsed once into a :class:`ModelSource`; SPEC strings resolve with :func:`load_model`.

Search-space candidates are assembled from cached blocks instead (:func:`assemble`, :func:`assemble_many`,
:func:`assemble_chunks`).
"""

from dippm_nas.capture._assemble import (
    BLOCK_MEMO_NODES,
    PLACED_MEMO_NODES,
    SpaceItem,
    assemble,
    assemble_chunks,
    assemble_many,
    block_key,
    clear_block_memo,
    supports_assembly,
)
from dippm_nas.capture._capture import CacheArg, capture
from dippm_nas.capture._load import (
    MAX_ONNX_BYTES,
    SPEC_FORMS,
    check_onnx_file,
    load_callable,
    load_model,
    read_onnx_file,
)
from dippm_nas.capture._source import SOURCE_KINDS, ModelSource, SourceKind, space_config_of
from dippm_nas.capture._timm_results import RESULTS_CHANGES, has_results_form
from dippm_nas.capture._key import converter_version, file_key, model_key, named_model_key
from dippm_nas.capture._many import CaptureResult, capture_many
from dippm_nas.capture._torch import MODES

__all__ = ["capture", "capture_many", "CaptureResult", "model_key", "file_key", "named_model_key", "converter_version",
           "MODES",
           "assemble", "assemble_many", "assemble_chunks", "block_key", "supports_assembly", "space_config_of",
           "clear_block_memo", "SpaceItem", "BLOCK_MEMO_NODES", "PLACED_MEMO_NODES", "CacheArg",
           "ModelSource", "SourceKind", "SOURCE_KINDS", "load_model", "load_callable", "SPEC_FORMS", "check_onnx_file",
           "read_onnx_file", "MAX_ONNX_BYTES", "RESULTS_CHANGES", "has_results_form"]
