"""Pieces the CPU and CUDA measurers share: preparing the model and inputs, the forward context,
backend flags, fault classification, the environment record and building result rows."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import platform
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dippm_nas._platform import cpu_model_name, cpu_signature
from dippm_nas.errors import MeasurementError
from dippm_nas.measure._measurement import Measurement, MeasureSettings
from dippm_nas.measure._stopping import StoppingRule, summarize
from dippm_nas.spec import InputSpec
from dippm_nas.units import BYTES_PER_MIB, MS_PER_S

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__: list[str] = []  # private helpers

logger = logging.getLogger(__name__)

_REASON_MAX_CHARS = 500


class ModelFault(Exception):
    """Internal: the user's model (or preparing it) raised ``original`` during ``phase``."""

    def __init__(self, original: Exception, phase: str) -> None:
        super().__init__(f"{phase}: {type(original).__name__}: {original}")
        self.original = original
        self.phase = phase


def guarded(phase: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; an ``Exception`` from it becomes a :class:`ModelFault` (our own bugs outside stay bugs)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # the model's fault, recorded as a row by the caller
        raise ModelFault(e, phase) from e


def _is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(e)
    # The CPU allocator raises a plain RuntimeError; cuDNN/cuBLAS report allocation failures as text.
    return isinstance(e, RuntimeError) and (
        "can't allocate memory" in text
        or "CUDA out of memory" in text
        or "CUBLAS_STATUS_ALLOC_FAILED" in text
        or "CUDNN_STATUS_ALLOC_FAILED" in text
    )


def classify_fault(fault: ModelFault) -> tuple[str, str]:
    """``(status, reason)`` of a model fault: ``"oom"`` for out-of-memory, else ``"error"``."""
    e = fault.original
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if len(text) > _REASON_MAX_CHARS:
        text = text[:_REASON_MAX_CHARS] + "..."
    status = "oom" if _is_oom(e) else "error"
    what = "out of memory" if status == "oom" else "the model raised"
    return status, f"{what} during {fault.phase}: {type(e).__name__}: {text}"


def check_call(model: Any, spec: Any, settings: MeasureSettings) -> None:
    """Validate the arguments of a measurement (usage errors raise; model faults become rows)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise MeasurementError(
            f"measure() takes a torch.nn.Module, got {type(model).__name__} "
            "(load a model SPEC string with dippm_nas.capture.load_model first; ONNX files cannot be measured)"
        )
    if not isinstance(spec, InputSpec):
        raise MeasurementError(f"spec must be a dippm_nas.InputSpec, got {type(spec).__name__}")
    if not isinstance(settings, MeasureSettings):
        raise MeasurementError(f"settings must be a MeasureSettings, got {type(settings).__name__}")
    if settings.autocast is not None and spec.dtype not in ("float32", settings.autocast):
        raise MeasurementError(
            f"with autocast={settings.autocast!r} the spec dtype must be 'float32' or {settings.autocast!r} "
            f"(the model stays float32 under torch.autocast), got {spec.dtype!r}"
        )


def prepare_model(model: "torch.nn.Module", spec: InputSpec, device: "torch.device",
                  settings: MeasureSettings) -> "torch.nn.Module":
    """A copy of ``model`` in eval mode on ``device``, cast to the spec dtype unless autocast is set.

    The caller's model is never modified (``copy.deepcopy``).
    """
    import torch

    m = copy.deepcopy(model).eval()
    if settings.autocast is None and spec.dtype != "float32":
        m = m.to(dtype=getattr(torch, spec.dtype))
    m = m.to(device)
    if settings.channels_last:
        m = m.to(memory_format=torch.channels_last)
    return m


def prepare_inputs(spec: InputSpec, device: "torch.device", settings: MeasureSettings
                   ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The spec's example inputs on ``device`` (float32 under autocast; channels_last if asked)."""
    import torch

    if settings.autocast is not None:
        spec = replace(spec, dtype="float32")
    args, kwargs = spec.example_inputs(device)
    if settings.channels_last:
        def cl(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point():
                return t.contiguous(memory_format=torch.channels_last)
            return t

        args = tuple(cl(a) for a in args)
        kwargs = {k: cl(v) for k, v in kwargs.items()}
    return args, kwargs


@contextlib.contextmanager
def forward_context(device_type: str, settings: MeasureSettings) -> Iterator[None]:
    """``torch.inference_mode()`` plus ``torch.autocast`` when ``settings.autocast`` is set."""
    import torch

    with torch.inference_mode():
        if settings.autocast is None:
            yield
        else:
            with torch.autocast(device_type=device_type, dtype=getattr(torch, settings.autocast)):
                yield


@contextlib.contextmanager
def cuda_backend_flags(settings: MeasureSettings) -> Iterator[dict[str, Any]]:
    """Set TF32 and cudnn.benchmark as the settings say; yield the flags in force; restore afterwards."""
    import torch

    cudnn = torch.backends.cudnn
    matmul = torch.backends.cuda.matmul
    saved = (cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark)
    try:
        if settings.tf32 is not None:
            cudnn.allow_tf32 = settings.tf32
            matmul.allow_tf32 = settings.tf32
        cudnn.benchmark = settings.cudnn_benchmark
        yield {
            "cudnn_allow_tf32": bool(cudnn.allow_tf32),
            "matmul_allow_tf32": bool(matmul.allow_tf32),
            "cudnn_benchmark": bool(cudnn.benchmark),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
    finally:
        cudnn.allow_tf32, matmul.allow_tf32, cudnn.benchmark = saved


def base_environment(settings: MeasureSettings, threads: int) -> dict[str, Any]:
    """JSON-able facts every measurement records."""
    import torch

    return {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": cpu_model_name(),
        "cpu_signature": cpu_signature(),
        "threads": threads,
        "settings": settings.to_dict(),
    }


def latency_fields(samples_ms: tuple[float, ...]) -> dict[str, Any]:
    """The latency fields of a row from the timed samples (all ``None`` when there are none)."""
    if not samples_ms:
        return {"latency_ms": None, "latency_ms_std": None, "latency_ms_median": None,
                "latency_ms_ci95": None, "n_repeats": 0}
    st = summarize(samples_ms)
    return {"latency_ms": st.mean_ms, "latency_ms_std": st.std_ms, "latency_ms_median": st.median_ms,
            "latency_ms_ci95": st.ci95_ms, "n_repeats": st.n}


def timeout_reason(rule: StoppingRule, warmup_done: int, warmup: int) -> str:
    return (
        f"time cap of {rule.time_cap_s:g} s reached after {rule.elapsed_s():.3g} s with {rule.n} of the "
        f"minimum {rule.min_repeats} timed forwards (warm-up {warmup_done}/{warmup} done)"
    )


def window_forwards(mean_ms: float, window_s: float) -> int:
    """Forwards that fill an energy window of ``window_s`` at ``mean_ms`` each (at least 1)."""
    if mean_ms <= 0 or not math.isfinite(mean_ms):
        return 1
    return max(1, math.ceil(window_s * MS_PER_S / mean_ms))


def to_mib(n_bytes: float) -> float:
    return n_bytes / BYTES_PER_MIB


def build_row(**kwargs: Any) -> Measurement:
    """``Measurement(**kwargs)``; logs the row at debug."""
    row = Measurement(**kwargs)
    logger.debug(
        "measured %s bs=%s dtype=%s: status=%s latency_ms=%s n=%d energy_j=%s memory_mib=%s (%s)%s",
        row.device, row.batch_size, row.dtype, row.status, row.latency_ms, row.n_repeats, row.energy_j,
        row.memory_mib, row.memory_source, f" reason={row.reason}" if row.reason else "",
    )
    return row
