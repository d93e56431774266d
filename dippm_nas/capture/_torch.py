"""PyTorch ``nn.Module`` -> ``torch.export`` -> Relax -> :class:`OperatorGraph`.

Nothing is computed, so nothing is allocated that capture does not need: the example inputs are fake
tensors (``FakeTensorMode``: shapes and dtypes, no storage), ``torch.export`` traces with fake copies of the
weights, and weights that are not real CPU float32 tensors (a half-precision model, a model built under
``torch.device("meta")`` or a ``FakeTensorMode``, a model on a GPU) are replaced, in a structural copy of
the model, by fake float32 CPU tensors of their shapes. Relax binds such weights as constants that carry
their shape and dtype but no data. A 7-billion-parameter decoder built on ``meta`` captures in a few GiB
of host memory, and the graph of a model is the same whether its weights are real or not.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dippm_nas.errors import DippmNasError, GraphCaptureError, InputShapeError
from dippm_nas.graph import OperatorGraph, graph_from_relax
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


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def _is_real_cpu(t: "torch.Tensor") -> bool:
    """Whether ``t`` is a tensor with data in host memory (not fake, not on ``meta`` or another device)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor) and t.device.type == "cpu"


def _prepare(model: "torch.nn.Module", fake_mode: Any) -> "torch.nn.Module":
    """The model to export: itself when its weights are real CPU tensors, floating ones in float32; else a
    structural copy whose weights are fake float32 CPU tensors of the same shapes (no data is copied).

    Export always runs in float32 (TVM's PyTorch frontend fixes convolution and matmul outputs to
    float32, so a half-precision export does not convert); the graph is re-typed to the compute
    dtype afterwards. The user's model is never modified.
    """
    import torch

    weights = [*model.parameters(), *model.buffers()]
    loose = [v for m in model.modules() for v in vars(m).values()
             if isinstance(v, torch.Tensor) and not _is_real_cpu(v)]  # plain tensor attributes not on the CPU
    if not loose and all(_is_real_cpu(t) and (not t.is_floating_point() or t.dtype == torch.float32)
                         for t in weights):
        return model
    memo: dict[int, Any] = {}
    with fake_mode:
        for t in [*weights, *loose]:
            if id(t) in memo:
                continue
            f = torch.empty(tuple(t.shape), dtype=torch.float32 if t.is_floating_point() else t.dtype, device="cpu")
            memo[id(t)] = torch.nn.Parameter(f, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else f
    try:
        return copy.deepcopy(model, memo)
    except Exception as e:  # noqa: BLE001 - any attribute deepcopy cannot copy
        raise GraphCaptureError(
            f"cannot make the fake-weight copy of {type(model).__name__} that capture exports (its weights are "
            f"half precision, on 'meta' or on another device): deepcopy failed with {type(e).__name__}: {e}. "
            "Hint: capture a float32 model on the CPU, or build it under torch.device('meta')"
        ) from e


def _tensors(obj: Any, depth: int = 0) -> list[Any]:
    """The tensors ``obj`` holds, in a fixed order: itself, the items of a tuple, list or mapping (a
    ``transformers`` ``ModelOutput`` is one), the attributes of another object (a ``Cache``: its layers' keys and
    values), a few levels deep."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 4 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return []
    if isinstance(obj, Mapping):
        items: Iterable[Any] = obj.values()
    elif isinstance(obj, (tuple, list)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return []
    return [t for item in items for t in _tensors(item, depth + 1)]


def _with_tensor_outputs(model: "torch.nn.Module") -> "torch.nn.Module":
    """``model`` itself, or, for a ``transformers`` model, a wrapper whose forward returns the tuple of the tensors
    the model's output holds: its ``ModelOutput`` may carry a ``DynamicCache`` (the default with ``use_cache``), a
    type ``torch.export`` cannot return, so a decoder captures with its cache on (the logits and every layer's keys
    and values are the graph's outputs)."""
    if not type(model).__module__.startswith("transformers."):
        return model
    import torch

    class TensorOutputs(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            return tuple(_tensors(self.inner(*args, **kwargs)))

    return TensorOutputs(model)


def _shape_hint(spec: InputSpec) -> str:
    shapes = ", ".join(f"{k}={v}" for k, v in spec.batched_shapes().items())
    return (f"the input shape does not fit the model (inputs: {shapes}; dtype {spec.dtype}). "
            "InputSpec.shape is the per-sample shape without the batch dimension, e.g. (3, 224, 224)")


def _fake_inputs(spec: InputSpec, fake_mode: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Example inputs as fake tensors (no storage): floating ones in float32, the others in their dtype."""
    import torch

    made: dict[str, Any] = {}
    with fake_mode:
        for t in spec.tensors:
            dt = getattr(torch, spec.tensor_dtype(t))
            made[t.name] = torch.empty((spec.batch_size, *t.shape), dtype=torch.float32 if dt.is_floating_point
                                       else dt)
    if spec.inputs is None:
        return (made["x"],), {}
    return (), made


class _ThreadStderr:
    """``sys.stderr`` while captures run: writes of a capturing thread go to its buffer, others' to the
    stream it replaced."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffers: dict[int, io.StringIO] = {}

    def write(self, text: str) -> int:
        buf = self.buffers.get(threading.get_ident())
        return (buf if buf is not None else self.stream).write(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.buffers:
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _stderr_kept(into: io.StringIO) -> Iterator[None]:
    """Route this thread's ``sys.stderr`` writes into ``into`` (``torch.export`` prints a failing trace's
    partial FX graph there, while the failure reaches the caller as our exception)."""
    if sys.stderr is None:  # no stream (pythonw): nothing is printed anyway
        yield
        return
    tid = threading.get_ident()
    with _stderr_lock:
        proxy = sys.stderr if isinstance(sys.stderr, _ThreadStderr) else _ThreadStderr(sys.stderr)
        proxy.buffers[tid] = into
        sys.stderr = proxy
    try:
        yield
    finally:
        with _stderr_lock:
            proxy.buffers.pop(tid, None)
            if not proxy.buffers and sys.stderr is proxy:
                sys.stderr = proxy.stream


def _export(model: "torch.nn.Module", spec: InputSpec, fake_mode: Any = None) -> Any:
    """``torch.export`` of ``model`` on fake inputs of ``spec`` (in ``fake_mode``, default a new one); a real
    model's program keeps its real weights."""
    import torch

    args, kwargs = _fake_inputs(spec, fake_mode if fake_mode is not None else _fake_mode())
    printed = io.StringIO()
    try:
        with _quiet_torch(), torch.no_grad(), _stderr_kept(printed):
            return torch.export.export(model, args, kwargs)
    except Exception as e:  # noqa: BLE001 - torch.export raises many types; each is classified below
        text = str(e)
        graph = str(getattr(e, "partial_fx_graph", "") or "")
        if graph:
            logger.debug("torch.export's partial graph of %s:\n%s", type(model).__name__, graph)
        rest = printed.getvalue().replace(graph, "").strip() if graph else printed.getvalue()
        printed.seek(0)
        printed.truncate()
        if rest:  # anything else torch printed (warnings) goes where it was meant to
            sys.stderr.write(rest + "\n")
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
    finally:
        if printed.getvalue():
            sys.stderr.write(printed.getvalue())


# ---------------------------------------------------------------- weights without data, in Relax
_binding = threading.local()


def _placeholder(tensor: "torch.Tensor") -> Any:
    """A Relax constant with ``tensor``'s shape and dtype and no data (one per tensor, so tied weights stay
    one constant), for a fake or meta tensor the frontend would otherwise copy."""
    import numpy as np
    import tvm

    memo: dict[int, Any] | None = getattr(_binding, "memo", None)
    if memo is None:  # outside capture_module: no tensor to share the constant with
        memo = {}
    got = memo.get(id(tensor))
    if got is None:
        dtype = str(tensor.dtype).replace("torch.", "")
        small = tvm.runtime.tensor(np.zeros((1,), dtype="float32" if dtype in ("bfloat16", "float8_e4m3fn",
                                                                                "float8_e5m2") else dtype))
        got = tvm.ir.GenericConst(small, tvm.relax.TensorType([int(d) for d in tensor.shape], dtype))
        memo[id(tensor)] = got
    return got


def _install_placeholder_binding() -> None:
    """Teach the Relax frontend to bind a fake or meta tensor as a data-less constant (real tensors are
    bound as before, sharing their memory through DLPack)."""
    from tvm.relax.frontend.torch import exported_program_translator as ept

    importer = getattr(ept, "ExportedProgramImporter", None)
    original = getattr(importer, "_convert_pytorch_tensor_to_tvm", None)
    if original is None or getattr(original, "_dippm_placeholders", False):
        return
    import tvm

    if not hasattr(tvm.ir, "GenericConst"):  # an older TVM: fake weights become uninitialised real ones
        def convert(tensor_value: Any) -> Any:
            return original(_materialise_empty(tensor_value))
    else:
        def convert(tensor_value: Any) -> Any:
            if _is_real_cpu(tensor_value) or tensor_value.layout != _strided():
                return original(tensor_value)
            return _placeholder(tensor_value)

    convert._dippm_placeholders = True  # type: ignore[attr-defined]
    importer._convert_pytorch_tensor_to_tvm = staticmethod(convert)


def _strided() -> Any:
    import torch

    return torch.strided


def _materialise_empty(t: "torch.Tensor") -> "torch.Tensor":
    import torch

    if _is_real_cpu(t):
        return t
    return torch.empty(tuple(t.shape), dtype=t.dtype, device="cpu")


def _convert(ep: Any, decompose: bool | str, strip: int = 0) -> tuple[Any, str, dict[Any, Any]]:
    """Relax module of ``ep``, the mode that made it and the provenance of its variables
    (:func:`~dippm_nas.capture._provenance.convert_tagged`; ``strip``: the capture's wrapper modules).

    ``"auto"`` tries the fast mode, then the decomposing one; if both fail and the fast mode named ops it
    has no converter for, it converts once more with those ops as opaque calls (mode ``"export+opaque"``:
    the ops are kept by name, shapes and inputs, and counted as unknown ops of the graph).
    """
    from dippm_nas.capture._converters import custom_convert_map, opaque_convert_map, unsupported_ops
    from dippm_nas.capture._provenance import convert_tagged

    _install_placeholder_binding()
    errors = []
    missing: list[str] = []
    tries = [False, True] if decompose == "auto" else [bool(decompose)]
    for dec in tries:
        try:
            with _quiet_torch():
                mod, tags = convert_tagged(ep, dec, None if dec else custom_convert_map(), strip)
            return mod, ("export+decompose" if dec else "export"), tags
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
                mod, tags = convert_tagged(ep, False, opaque_convert_map(missing), strip)
            logger.warning("Relax has no converter for %s: converted as opaque ops (counted as unknown ops; "
                           "their cost is a generic estimate)", ", ".join(missing))
            return mod, "export+opaque", tags
        except Exception as e:  # noqa: BLE001 - as above
            errors.append(f"opaque {missing}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    raise GraphCaptureError("TVM Relax could not convert the exported program: " + " | ".join(errors))


def _check_tensor_output(ep: Any, name: str) -> None:
    """:class:`GraphCaptureError` when the exported forward returns no tensor (``None``, a number, an empty
    tuple): a graph needs an output to measure the model by."""
    from torch.export.graph_signature import OutputKind, TensorArgument

    user = [o for o in ep.graph_signature.output_specs if o.kind == OutputKind.USER_OUTPUT]
    if not any(isinstance(o.arg, TensorArgument) for o in user):
        got = ", ".join(repr(getattr(o.arg, "value", o.arg)) for o in user) or "nothing"
        raise GraphCaptureError(f"the forward of {name} returned no tensor (it returned {got}); a model's forward "
                                "must return its output tensor, or a tuple, list or dict holding tensors")


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
    try:
        fake_mode = _fake_mode()
        with _eval_mode(model):
            prepared = _prepare(model, fake_mode)
            target = _with_tensor_outputs(prepared)
            with _eval_mode(target):
                ep = _export(target, spec, fake_mode)
        _check_tensor_output(ep, type(model).__name__)
        t1 = time.perf_counter()
        _binding.memo = {}
        try:
            mod, mode, tags = _convert(ep, decompose, strip=int(target is not prepared))
        finally:
            _binding.memo = None
        t2 = time.perf_counter()
        names = [t.name for t in spec.tensors]
        graph = graph_from_relax(mod, spec, mode=mode, input_names=names, source=type(model).__name__,
                                 model_key=model_key, float_dtype=None if spec.dtype == "float32" else spec.dtype,
                                 provenance=tags)
        graph.validate()
    except DippmNasError:
        raise
    except Exception as e:  # noqa: BLE001 - every capture failure reaches the caller as a DippmNasError
        raise GraphCaptureError(f"capturing {type(model).__name__} failed: {type(e).__name__}: {e}") from e
    t3 = time.perf_counter()
    graph.convert_seconds = t3 - t0
    graph.timings = {"export_s": t1 - t0, "convert_s": t2 - t1, "build_s": t3 - t2}
    logger.debug("captured %s: %d nodes, export %.3fs, convert %.3fs, build %.1fms", graph.source,
                 graph.num_nodes, t1 - t0, t2 - t1, (t3 - t2) * 1e3)
    return graph
