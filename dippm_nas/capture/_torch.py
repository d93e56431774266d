"""PyTorch ``nn.Module`` -> ``torch.export`` -> Relax -> :class:`OperatorGraph`."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dippm_nas.errors import GraphCaptureError, InputShapeError
from dippm_nas.graph import OperatorGraph
from dippm_nas.graph._relax import graph_from_relax
from dippm_nas.spec import InputSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["capture_module", "MODES"]

logger = logging.getLogger(__name__)

#: Conversion modes recorded in :attr:`OperatorGraph.mode`.
MODES = ("export", "export+decompose", "export+opaque", "onnx")

# Messages of PyTorch shape checks (meta kernels, nn layers) that mean "the input does not fit".
_SHAPE_ERR = re.compile(
    r"(expected input.*channels|must have same reduction dim|mat1 and mat2|shapes cannot be multiplied|"
    r"size mismatch|Kernel size can't be greater|must match the size|The size of tensor a|"
    r"Expected .*dimension|expected .*-?D input|invalid for input of size|out of range|"
    r"Calculated padded input size|Calculated output size|shape '\[.*\]' is invalid)",
    re.IGNORECASE,
)

# torch loggers that print whole tracebacks (at ERROR level) while export probes a failing model;
# the failure reaches the caller as our exception, so they are muted for the duration of capture.
_NOISY_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes",
                  "torch._export", "torch.export", "torch._dynamo")


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    saved = []
    for name in _NOISY_LOGGERS:
        lg = logging.getLogger(name)
        saved.append((lg, lg.level))
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)


@contextlib.contextmanager
def _eval_mode(model: "torch.nn.Module") -> Iterator[None]:
    """Put every submodule in eval mode and restore each one's training flag afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, t in flags:
            m.training = t


def _prepare(model: "torch.nn.Module") -> "torch.nn.Module":
    """The model to export: itself when its floating-point weights are float32, else a float32 copy.

    Export always runs in float32 (TVM's PyTorch frontend fixes convolution and matmul outputs to
    float32, so a half-precision export does not convert); the graph is re-typed to the compute
    dtype afterwards. The user's model is never modified.
    """
    import torch

    floats = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    if all(t.dtype == torch.float32 for t in floats):
        return model
    return copy.deepcopy(model).float()


def _shape_hint(spec: InputSpec) -> str:
    shapes = ", ".join(f"{k}={v}" for k, v in spec.batched_shapes().items())
    return (f"the input shape does not fit the model (inputs: {shapes}; dtype {spec.dtype}). "
            "InputSpec.shape is the per-sample shape without the batch dimension, e.g. (3, 224, 224)")


def _fake_example_inputs(spec: InputSpec) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Example inputs as fake tensors (shape and dtype, no data), laid out as :meth:`InputSpec.example_inputs`.

    ``torch.export`` reads only their shapes and dtypes (it turns real inputs into fake ones itself), so no
    batch of real data is allocated: the input of a block deep in a model at batch 16384 would be gigabytes.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    made: dict[str, Any] = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for t in spec.tensors:
            made[t.name] = torch.empty((spec.batch_size, *t.shape), dtype=getattr(torch, spec.tensor_dtype(t)))
    if spec.inputs is None:
        return (made["x"],), {}
    return (), made


def _export(model: "torch.nn.Module", spec: InputSpec) -> Any:
    import torch

    args, kwargs = _fake_example_inputs(dataclasses.replace(spec, dtype="float32"))
    try:
        with _quiet_torch(), torch.no_grad():
            return torch.export.export(model, args, kwargs)
    except Exception as e:  # noqa: BLE001 - torch.export raises many types; each is classified below
        text = str(e)
        if "data-dependent" in text or type(e).__name__ in ("GuardOnDataDependentSymNode",
                                                              "DataDependentOutputException"):
            raise GraphCaptureError(
                f"{type(model).__name__} cannot be exported by torch.export: its forward has data-dependent "
                "control flow (a Python `if`/loop on tensor values). Hint: use torch.cond / torch.where, or "
                f"make the branch depend on shapes or constructor arguments. torch said: {text.splitlines()[0]}"
            ) from e
        if isinstance(e, (RuntimeError, ValueError, IndexError)) and _SHAPE_ERR.search(text):
            raise InputShapeError(f"{_shape_hint(spec)}. torch said: {text.splitlines()[0]}") from e
        if isinstance(e, TypeError) and ("argument" in text or "positional" in text):
            names = [t.name for t in spec.tensors]
            raise InputShapeError(
                f"{type(model).__name__}.forward does not accept the inputs of the InputSpec ({names}): "
                f"{text.splitlines()[0]}. Hint: a several-input model needs InputSpec(inputs=...) naming "
                "each forward argument"
            ) from e
        raise GraphCaptureError(
            f"torch.export failed on {type(model).__name__}: {type(e).__name__}: {text.splitlines()[0] if text else ''}"
        ) from e


def _convert(ep: Any, decompose: bool | str) -> tuple[Any, str]:
    """Relax module of ``ep`` and the mode that made it.

    ``"auto"`` tries the fast mode, then the decomposing one; if both fail and the fast mode named ops it
    has no converter for, it converts once more with those ops as opaque calls (mode ``"export+opaque"``:
    the ops are kept by name, shapes and inputs, and counted as unknown ops of the graph).
    """
    from tvm.relax.frontend.torch import from_exported_program

    from dippm_nas.capture._converters import custom_convert_map, opaque_convert_map, unsupported_ops

    errors = []
    missing: list[str] = []
    tries = [False, True] if decompose == "auto" else [bool(decompose)]
    for dec in tries:
        try:
            with _quiet_torch():
                mod = from_exported_program(ep, run_ep_decomposition=dec,
                                            custom_convert_map=None if dec else custom_convert_map())
            return mod, ("export+decompose" if dec else "export")
        except Exception as e:  # noqa: BLE001 - the Relax frontend raises assorted errors for unsupported ops
            errors.append(f"run_ep_decomposition={dec}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            if dec is False:
                missing = unsupported_ops(str(e))
            if dec is False and decompose == "auto":
                logger.info("Relax conversion without decomposition failed (%s); retrying with decomposition",
                            errors[-1])
    if missing and decompose == "auto":
        try:
            with _quiet_torch():
                mod = from_exported_program(ep, run_ep_decomposition=False,
                                            custom_convert_map=opaque_convert_map(missing))
            logger.warning("Relax has no converter for %s: converted as opaque ops (counted as unknown ops; "
                           "their cost is a generic estimate)", ", ".join(missing))
            return mod, "export+opaque"
        except Exception as e:  # noqa: BLE001 - as above
            errors.append(f"opaque {missing}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    raise GraphCaptureError("TVM Relax could not convert the exported program: " + " | ".join(errors))


def capture_module(model: "torch.nn.Module", spec: InputSpec, *, decompose: bool | str = "auto",
                   model_key: str = "") -> OperatorGraph:
    """Export ``model`` and build its graph (no cache; see :func:`dippm_nas.capture`).

    Args:
        model: the module; left in the training mode it had.
        spec: example input description.
        decompose: ``"auto"`` (no decomposition, falling back to it, then to opaque ops for what neither
            mode converts), ``False`` or ``True``.
        model_key: pre-export key to record in the graph.
    """
    t0 = time.perf_counter()
    with _eval_mode(model):
        target = _prepare(model)
        with _eval_mode(target):
            ep = _export(target, spec)
    t1 = time.perf_counter()
    mod, mode = _convert(ep, decompose)
    t2 = time.perf_counter()
    names = [t.name for t in spec.tensors]
    graph = graph_from_relax(mod, spec, mode=mode, input_names=names, source=type(model).__name__,
                             model_key=model_key, float_dtype=None if spec.dtype == "float32" else spec.dtype)
    graph.validate()
    t3 = time.perf_counter()
    graph.convert_seconds = t3 - t0
    graph.timings = {"export_s": t1 - t0, "convert_s": t2 - t1, "build_s": t3 - t2}
    logger.debug("captured %s: %d nodes, export %.3fs, convert %.3fs, build %.1fms", graph.source,
                 graph.num_nodes, t1 - t0, t2 - t1, (t3 - t2) * 1e3)
    return graph
