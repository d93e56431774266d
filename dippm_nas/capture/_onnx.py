"""ONNX file -> Relax ONNX frontend -> :class:`OperatorGraph`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from dippm_nas._optional import require
from dippm_nas.errors import GraphCaptureError, InputShapeError
from dippm_nas.graph import OperatorGraph, graph_from_relax
from dippm_nas.capture._load import check_onnx_file, read_onnx_file
from dippm_nas.spec import InputSpec

__all__ = ["capture_onnx", "read_onnx_bytes"]

logger = logging.getLogger(__name__)


def read_onnx_bytes(path: str | Path) -> bytes:
    """The bytes of an ONNX file: a regular file of at most :data:`~dippm_nas.capture.MAX_ONNX_BYTES`
    (:func:`~dippm_nas.capture.read_onnx_file`).

    Raises:
        ModelSpecError: a missing path, a FIFO, device, directory or other non-regular file, or one over the
            limit (the message says what to do).
    """
    return read_onnx_file(path)


def capture_onnx(path: str | Path, spec: InputSpec, *, source: str = "", model_key: str = "") -> OperatorGraph:
    """Convert an ONNX file (weights inline or in external-data files beside it) with the Relax ONNX frontend.

    The spec's inputs are matched to the ONNX graph inputs (initializers excluded) by name, or by
    position for a single-input spec. Dynamic dimensions are fixed from the spec.

    Raises:
        ModelSpecError: ``path`` is not a regular file of at most :data:`~dippm_nas.capture.MAX_ONNX_BYTES`.
        GraphCaptureError: the bytes are not a valid ONNX model, or Relax cannot convert it.
        InputShapeError: the spec names inputs the file does not have, or shapes that contradict it.
    """
    check_onnx_file(path)  # before onnx opens it: never a FIFO, a device or a file past protobuf's limit
    onnx = require("onnx", "onnx", "reading ONNX files")
    from tvm.relax.frontend.onnx import from_onnx

    t0 = time.perf_counter()
    try:
        onnx.checker.check_model(str(path))
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - onnx raises DecodeError, ValidationError, ...
        raise GraphCaptureError(f"{source or 'the file'} is not a valid ONNX model: {type(e).__name__}: {e}") from e
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    tensors = spec.tensors
    if spec.inputs is None:
        if len(graph_inputs) != 1:
            raise InputShapeError(
                f"the ONNX model has {len(graph_inputs)} inputs {[i.name for i in graph_inputs]}; "
                "describe each one with InputSpec(inputs={name: shape, ...})"
            )
        names = [graph_inputs[0].name]
    else:
        available = [i.name for i in graph_inputs]
        missing = [t.name for t in tensors if t.name not in available]
        if missing or len(tensors) != len(available):
            raise InputShapeError(
                f"InputSpec inputs {[t.name for t in tensors]} must match the ONNX inputs {available}"
            )
        names = [t.name for t in tensors]
    shape_dict = {}
    dtype_dict = {}
    for name, t in zip(names, tensors):
        shape = [spec.batch_size, *t.shape]
        decl = next(i for i in graph_inputs if i.name == name)
        dims = decl.type.tensor_type.shape.dim
        fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if len(fixed) != len(shape) or any(f is not None and f != s for f, s in zip(fixed, shape)):
            raise InputShapeError(
                f"ONNX input {name!r} is declared with shape {[f if f is not None else '?' for f in fixed]}, "
                f"which does not fit the InputSpec shape {shape}"
            )
        shape_dict[name] = shape
        elem = decl.type.tensor_type.elem_type
        dtype_dict[name] = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else spec.tensor_dtype(t)
    t1 = time.perf_counter()
    try:
        mod = from_onnx(model, shape_dict=shape_dict, dtype_dict=dtype_dict)
    except Exception as e:  # noqa: BLE001 - the Relax ONNX frontend raises assorted errors
        raise GraphCaptureError(f"TVM Relax could not convert the ONNX model: {type(e).__name__}: {e}") from e
    t2 = time.perf_counter()
    graph = graph_from_relax(mod, spec, mode="onnx", input_names=[t.name for t in tensors], source=source,
                             model_key=model_key, float_dtype=spec.dtype)
    graph.validate()
    t3 = time.perf_counter()
    graph.convert_seconds = t3 - t0
    graph.timings = {"export_s": t1 - t0, "convert_s": t2 - t1, "build_s": t3 - t2}
    return graph
