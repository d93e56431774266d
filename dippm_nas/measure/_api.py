"""``measure(model, spec, torch_device, settings)``: one call for a CPU or CUDA measurement."""

from __future__ import annotations

from typing import Any

from dippm_nas._deprecation import MISSING, renamed_keyword
from dippm_nas.errors import MeasurementError
from dippm_nas.measure._cpu import CpuMeasurer
from dippm_nas.measure._cuda import CudaMeasurer, parse_device
from dippm_nas.measure._isolate import measure_isolated
from dippm_nas.measure._measurement import Measurement, MeasureSettings
from dippm_nas.measure._nvml import NvmlAdapter
from dippm_nas.spec import InputSpec

__all__ = ["measure"]


def measure(
    model: Any,
    spec: InputSpec,
    torch_device: Any = "cpu",
    settings: MeasureSettings | None = None,
    *,
    nvml: NvmlAdapter | None = None,
    isolate: bool = False,
    model_kwargs: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    device: Any = MISSING,
) -> Measurement:
    """Measure one forward pass of ``model`` on ``spec``'s example inputs.

    The model is copied (never modified), put in eval mode, cast to ``spec.dtype`` (float16/bfloat16
    cast the model, unless ``settings.autocast`` is set) and run under ``torch.inference_mode``:
    warm-up, then timed forwards until the 95% confidence interval of the mean latency is within
    ``settings.rel_ci_target`` (2%), ``settings.max_repeats`` or ``settings.time_cap_s``.

    Args:
        model: a ``torch.nn.Module``; with ``isolate=True`` a model SPEC string instead (see
            :func:`dippm_nas.capture.load_model`), built in the worker process.
        spec: the input spec (shapes, batch size, dtype).
        torch_device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        settings: timing-relevant settings; ``None`` means :class:`MeasureSettings` defaults. They are
            recorded in ``Measurement.environment``.
        nvml: CUDA only, an NVML adapter to use (tests pass an autospec fake); not with ``isolate``.
        isolate: measure in a fresh subprocess (hard time limit, exact host-memory delta, crash
            isolation; costs a Python + torch start-up). See :mod:`dippm_nas.measure._isolate`.
        model_kwargs: with ``isolate=True``, JSON-able keyword arguments for a
            ``package.module:callable`` SPEC (a search-space builder's config).
        timeout_s: with ``isolate=True``, the hard limit of the worker, seconds.
        device: deprecated name of ``torch_device`` (a :class:`DeprecationWarning`; removed in 0.2).

    Returns:
        A :class:`Measurement`. Faults of the model (out of memory, time cap, an exception in the
        forward) come back as rows with ``status`` ``"oom"``, ``"timeout"`` or ``"error"`` and a
        ``reason``; they are not raised.

    Raises:
        DeviceError: an unknown device string or a CUDA index that does not exist.
        MeasurementError: usage errors (not an ``nn.Module``, invalid settings, CUDA asked for
            without CUDA).

    Shapes:
        - inputs: ``spec.batched_shapes()``, i.e. ``(spec.batch_size, *shape)`` per input.
    """
    device = renamed_keyword("measure", "device", "torch_device", device, torch_device, "cpu", removed_in="0.2")
    kind, _index = parse_device(device)
    settings = settings if settings is not None else MeasureSettings()
    if isolate:
        if nvml is not None:
            raise MeasurementError("nvml= cannot cross into the isolated worker; drop it or use isolate=False")
        return measure_isolated(model, spec, str(device), settings, model_kwargs=model_kwargs, timeout_s=timeout_s)
    if model_kwargs is not None or timeout_s is not None:
        raise MeasurementError(
            "model_kwargs and timeout_s apply to isolate=True only; in-process measurements take a built "
            "nn.Module and stop at settings.time_cap_s"
        )
    if kind == "cpu":
        return CpuMeasurer(settings).measure(model, spec)
    with CudaMeasurer(settings, torch_device=str(device), nvml=nvml) as measurer:
        return measurer.measure(model, spec)
