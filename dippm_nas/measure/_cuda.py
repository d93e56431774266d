"""CUDA measurement: CUDA events around each forward, the shared stopping rule, NVML energy and memory.

Latency: ``torch.cuda.Event(enable_timing=True)`` recorded before and after each forward on the
current stream, then ``synchronize``; the event time includes any GPU idle time while the host is
still launching kernels (so host-bound small models are timed as the user would see them).

Energy (whole physical GPU, idle/static power during the window included), over a separate window of
back-to-back forwards lasting about ``settings.energy_window_s``, divided by the forwards:

- ``"nvml_energy_counter"``: difference of ``nvmlDeviceGetTotalEnergyConsumption`` (Volta and newer);
- ``"nvml_power_sampling"``: where that counter is not supported, board power sampled every
  ``settings.power_sample_interval_s`` in a thread, integrated with the trapezoid rule
  (joules = integral of watts over seconds, see :mod:`dippm_nas.measure._power`); the window's energy
  is that integral's mean power times the window's exact duration;
- ``None`` on a MIG instance: NVML cannot measure power or energy of one MIG slice, only of the
  whole GPU, which other instances share. Latency and memory are still measured; ``energy_reason``
  says why energy is missing.

Memory (pass the model on the CPU: the measurer moves a copy to the GPU, and a model already there
would be counted twice by NVML): NVML device memory "used" after the timed loop (device-wide: CUDA context, cuDNN/cuBLAS
workspaces, the caching allocator's reserved blocks, and every other process on the GPU; what DIPPM
measured) together with PyTorch's ``max_memory_reserved`` / ``max_memory_allocated`` since just
before the model was moved to the device. ``memory_mib`` is the NVML figure when NVML is available,
else ``torch_max_reserved``; every figure is kept in ``memory_parts_mib``, including
``nvml_used_before_mib`` (the device before the model arrived) so the context and other tenants can
be subtracted. On a MIG instance NVML memory is read from the instance's own handle.

All ``torch.cuda`` calls go through :class:`CudaOps`, a seam that lets the tests run this whole path
on the CPU (a "CPU twin" of the ops) with NVML faked by ``create_autospec(NvmlAdapter)``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from dippm_nas._deprecation import MISSING, renamed_keyword
from dippm_nas._logging import WarnOnce
from dippm_nas._platform import fixed_threads
from dippm_nas.errors import DeviceError, MeasurementError
from dippm_nas.measure._common import (
    ModelFault,
    base_environment,
    build_row,
    check_call,
    classify_fault,
    cuda_backend_flags,
    forward_context,
    guarded,
    latency_fields,
    prepare_inputs,
    prepare_model,
    timeout_reason,
    to_mib,
    window_forwards,
)
from dippm_nas.measure._measurement import Measurement, MeasureSettings
from dippm_nas.measure._nvml import NvmlAdapter, NvmlDevice, locate_device
from dippm_nas.measure._power import PowerSampler
from dippm_nas.measure._stopping import Clock, StoppingRule, run_until_stopped
from dippm_nas.spec import InputSpec

__all__ = ["CudaOps", "CudaMeasurer", "MIG_ENERGY_REASON", "parse_device"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger)  # a search measures thousands of models: say each thing once per process

#: Why a MIG instance's energy is not measured.
MIG_ENERGY_REASON = (
    "energy not measured on a MIG instance: NVML cannot measure power or energy of one MIG slice, "
    "only of the whole GPU, which other instances share"
)
_MJ_PER_J = 1000.0


def parse_device(device: Any) -> tuple[str, int | None]:
    """``"cpu"`` -> ``("cpu", None)``; ``"cuda"`` / ``"cuda:N"`` / ``torch.device`` -> ``("cuda", N)``.

    Raises:
        DeviceError: for anything else.
    """
    text = str(device).strip().lower()
    if text == "cpu":
        return "cpu", None
    if text == "cuda":
        return "cuda", 0
    if text.startswith("cuda:"):
        idx = text[len("cuda:"):]
        if idx.isdigit():
            return "cuda", int(idx)
    raise DeviceError(f"device must be 'cpu', 'cuda' or 'cuda:N' (N >= 0), got {device!r}")


class CudaOps:
    """The ``torch.cuda`` calls of a CUDA measurement, in one place so tests can replace them.

    Each method is called by :class:`CudaMeasurer` with the CUDA device index.
    """

    #: ``device_type`` passed to ``torch.autocast``.
    autocast_device_type: str = "cuda"

    def is_available(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def device_count(self) -> int:
        import torch

        return int(torch.cuda.device_count())

    def torch_device(self, index: int) -> Any:
        import torch

        return torch.device("cuda", index)

    @contextlib.contextmanager
    def device_context(self, index: int) -> Iterator[None]:
        """Make ``index`` the current device (events and streams live on it)."""
        import torch

        with torch.cuda.device(index):
            yield

    def synchronize(self, index: int) -> None:
        import torch

        torch.cuda.synchronize(index)

    def time_ms(self, fn: Callable[[], Any], index: int) -> float:
        """Run ``fn`` between two timing events on the current stream; milliseconds on the GPU."""
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def reset_peak_memory_stats(self, index: int) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(index)

    def max_memory_reserved(self, index: int) -> int:
        import torch

        return int(torch.cuda.max_memory_reserved(index))

    def max_memory_allocated(self, index: int) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(index))

    def empty_cache(self) -> None:
        import torch

        torch.cuda.empty_cache()

    def device_name(self, index: int) -> str:
        import torch

        return str(torch.cuda.get_device_name(index))

    def device_uuid(self, index: int) -> str | None:
        """The CUDA UUID (``"GPU-…"``/``"MIG-…"`` or bare), ``None`` when torch does not expose it."""
        import torch

        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        return str(uuid) if uuid is not None else None

    def capability(self, index: int) -> tuple[int, int]:
        import torch

        major, minor = torch.cuda.get_device_capability(index)
        return int(major), int(minor)

    def versions(self) -> dict[str, Any]:
        import torch

        return {"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}


class CudaMeasurer:
    """Measures a model's forward pass on one CUDA device (see the module docstring for methods).

    Args:
        settings: the run settings (TF32, cudnn.benchmark, channels_last, autocast are applied for
            the run, restored afterwards, and recorded).
        torch_device: ``"cuda"``, ``"cuda:N"`` or an index.
        nvml: the NVML adapter; ``None`` makes a real :class:`NvmlAdapter`. It is initialised on the
            first measurement and shut down by :meth:`close` (use the measurer as a context manager).
            When NVML cannot be initialised, the measurement goes on without NVML energy/memory and
            says why in ``energy_reason`` and ``environment["nvml"]``.
        ops: the ``torch.cuda`` calls (tests pass a CPU twin).
        clock: seconds clock for the time cap and the energy window.
        device: deprecated name of ``torch_device`` (a :class:`DeprecationWarning`; removed in 0.2).
    """

    def __init__(
        self,
        settings: MeasureSettings | None = None,
        *,
        torch_device: str | int = "cuda:0",
        nvml: NvmlAdapter | None = None,
        ops: CudaOps | None = None,
        clock: Clock = time.perf_counter,
        device: Any = MISSING,
    ) -> None:
        self.settings = settings if settings is not None else MeasureSettings()
        device = renamed_keyword("CudaMeasurer", "device", "torch_device", device, torch_device, "cuda:0",
                                 removed_in="0.2")
        if isinstance(device, int) and not isinstance(device, bool):
            device = f"cuda:{device}"
        kind, index = parse_device(device)
        if kind != "cuda" or index is None:
            raise DeviceError(f"CudaMeasurer needs a CUDA device ('cuda' or 'cuda:N'), got {device!r}")
        self.index = index
        self._nvml = nvml if nvml is not None else NvmlAdapter()
        self._nvml_state: str = "new"  # new | ready | failed
        self._nvml_reason: str | None = None
        self._nvml_device: NvmlDevice | None = None
        self._ops = ops if ops is not None else CudaOps()
        self._clock = clock

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "CudaMeasurer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut NVML down if this measurer initialised it."""
        if self._nvml_state == "ready":
            self._nvml_state = "new"
            self._nvml_device = None
            self._nvml.shutdown()

    def _nvml_ready(self) -> NvmlDevice | None:
        if self._nvml_state == "new":
            try:
                self._nvml.init()
                self._nvml_state = "ready"
                self._nvml_device = locate_device(self._nvml, self.index, self._ops.device_uuid(self.index))
            except MeasurementError as e:
                if self._nvml_state == "ready":
                    self._nvml.shutdown()
                self._nvml_state = "failed"
                self._nvml_reason = str(e)
                _warn_once("nvml-unavailable", "NVML unavailable, CUDA measurements go on without NVML "
                           "energy/memory: %s", e)
        return self._nvml_device

    # ------------------------------------------------------------------ measuring
    def measure(self, model: Any, spec: InputSpec) -> Measurement:
        """Measure ``model`` on ``spec``'s example inputs on this CUDA device.

        Returns:
            A :class:`Measurement` with ``device="cuda:N"``. Out of memory, the time cap and
            exceptions in the model are rows with ``status != "ok"`` and a ``reason``, never raised.

        Raises:
            MeasurementError: usage errors (not an ``nn.Module``, autocast/dtype conflict) or no CUDA.
            DeviceError: the device index does not exist.
        """
        s = self.settings
        check_call(model, spec, s)
        ops, idx = self._ops, self.index
        if not ops.is_available():
            raise MeasurementError(
                f"device 'cuda:{idx}' was asked for but CUDA is not available (torch.cuda.is_available() "
                "is False); measure on device='cpu' instead"
            )
        count = ops.device_count()
        if idx >= count:
            raise DeviceError(f"CUDA device index must be < {count} (devices visible), got cuda:{idx}")
        if any(p.is_cuda for p in model.parameters()):
            _warn_once("model-on-cuda", "the model passed to measure() already lives on the GPU; the measurer "
                       "runs a copy, so NVML 'used' memory counts the weights twice; pass the model on the CPU")
        nvdev = self._nvml_ready()
        env_extra: dict[str, Any] = {
            "device_kind": "cuda",
            "gpu_name": ops.device_name(idx),
            "compute_capability": list(ops.capability(idx)),
            **ops.versions(),
        }
        if nvdev is None:
            env_extra.update({"nvml": f"unavailable: {self._nvml_reason}", "mig": None})
        else:
            env_extra.update({
                "nvml": "ok",
                "driver": self._nvml_call(self._nvml.driver_version),
                "nvml_name": nvdev.name,
                "mig": nvdev.is_mig,
                "nvml_located_by": nvdev.located_by,
            })
            if nvdev.note:
                env_extra["nvml_note"] = nvdev.note
        with fixed_threads(s.threads) as threads, ops.device_context(idx), cuda_backend_flags(s) as flags:
            env = base_environment(s, threads)
            env.update(env_extra)
            env["flags"] = flags
            try:
                fields = self._run(model, spec, nvdev)
            finally:
                gc.collect()  # frames of a fault's traceback can hold activations
                ops.empty_cache()
        return build_row(
            device=f"cuda:{idx}", environment=env, batch_size=spec.batch_size, dtype=spec.dtype, **fields
        )

    def _nvml_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except MeasurementError as e:
            logger.debug("NVML query failed: %s", e)
            return None

    def _run(self, model: Any, spec: InputSpec, nvdev: NvmlDevice | None) -> dict[str, Any]:
        """Everything that touches the model; its locals (model copy, inputs) die on return."""
        s, ops, idx = self.settings, self._ops, self.index
        rule = StoppingRule.from_settings(s, self._clock)
        dev = ops.torch_device(idx)
        status, reason, stop_reason = "ok", None, None
        samples: tuple[float, ...] = ()
        energy: tuple[float | None, str | None, str | None] = (None, None, None)
        details: dict[str, float] = {}
        parts: dict[str, float] = {}
        mem_handle = nvdev.memory if nvdev is not None else None

        gc.collect()
        ops.empty_cache()
        ops.synchronize(idx)
        if mem_handle is not None:
            used = self._nvml_call(self._nvml.memory_used_bytes, mem_handle)
            if used is not None:
                parts["nvml_used_before_mib"] = to_mib(used)
        ops.reset_peak_memory_stats(idx)
        try:
            m = guarded("model preparation", prepare_model, model, spec, dev, s)
            args, kwargs = guarded("input creation", prepare_inputs, spec, dev, s)

            def forward() -> None:
                guarded("forward", m, *args, **kwargs)

            def step_ms() -> float:
                return ops.time_ms(forward, idx)

            with forward_context(ops.autocast_device_type, s):
                loop = run_until_stopped(step_ms, rule, s.warmup)
                ops.synchronize(idx)
                samples, stop_reason = loop.samples_ms, loop.stop_reason
                details.update({"elapsed_s": loop.elapsed_s, "warmup_done": float(loop.warmup_done)})
                parts.update(self._memory_parts(mem_handle))
                if not loop.complete:
                    status, reason = "timeout", timeout_reason(rule, loop.warmup_done, s.warmup)
                    energy = (None, None, "not measured: the run timed out")
                else:
                    energy = self._energy(nvdev, forward, sum(samples) / len(samples), details)
        except ModelFault as fault:
            status, reason = classify_fault(fault)
            samples = rule.samples
            energy = (None, None, f"not measured: {status}")
            logger.debug("CUDA measurement fault: %s", reason, exc_info=fault.original)
            try:
                parts.update(self._memory_parts(None))  # the peak PyTorch saw before the fault
            except Exception as e:  # a broken CUDA context after a fault: keep the row, note it
                logger.debug("memory stats unreadable after the fault: %s", e)
        memory_mib, memory_source = None, None
        if status in ("ok", "timeout"):
            if "nvml_used_mib" in parts:
                memory_mib, memory_source = parts["nvml_used_mib"], "nvml_used"
            elif "torch_max_reserved_mib" in parts:
                memory_mib, memory_source = parts["torch_max_reserved_mib"], "torch_max_reserved"
        energy_j, energy_source, energy_reason = energy
        return {
            **latency_fields(samples),
            "energy_j": energy_j,
            "energy_source": energy_source,
            "energy_reason": energy_reason,
            "memory_mib": memory_mib,
            "memory_source": memory_source,
            "memory_parts_mib": parts,
            "status": status,
            "reason": reason,
            "stop_reason": stop_reason,
            "details": details,
        }

    def _memory_parts(self, mem_handle: Any) -> dict[str, float]:
        ops, idx = self._ops, self.index
        parts = {
            "torch_max_reserved_mib": to_mib(ops.max_memory_reserved(idx)),
            "torch_max_allocated_mib": to_mib(ops.max_memory_allocated(idx)),
        }
        if mem_handle is not None:
            used = self._nvml_call(self._nvml.memory_used_bytes, mem_handle)
            if used is not None:
                parts["nvml_used_mib"] = to_mib(used)
        return parts

    def _energy(self, nvdev: NvmlDevice | None, forward: Callable[[], None], mean_ms: float,
                details: dict[str, float]) -> tuple[float | None, str | None, str | None]:
        """``(energy_j per forward, energy_source, energy_reason)`` over a separate window."""
        if nvdev is None:
            return None, None, f"energy not measured: NVML unavailable ({self._nvml_reason})"
        if nvdev.is_mig:
            return None, None, MIG_ENERGY_REASON
        s, ops, idx, nvml, gpu = self.settings, self._ops, self.index, self._nvml, nvdev.gpu
        k = window_forwards(mean_ms, s.energy_window_s)
        try:
            use_counter = nvml.energy_counter_supported(gpu)
            ops.synchronize(idx)
            if use_counter:
                e0 = nvml.total_energy_mj(gpu)
                t0 = self._clock()
                for _ in range(k):
                    forward()
                ops.synchronize(idx)
                t1 = self._clock()
                e1 = nvml.total_energy_mj(gpu)
                window_j, source = (e1 - e0) / _MJ_PER_J, "nvml_energy_counter"
            else:
                logger.debug("NVML energy counter not supported on %s; sampling power", nvdev.name)
                sampler = PowerSampler(nvml, gpu, s.power_sample_interval_s, self._clock)
                sampler.start()
                t0 = self._clock()
                try:
                    for _ in range(k):
                        forward()
                    ops.synchronize(idx)
                    t1 = self._clock()
                except BaseException:
                    with contextlib.suppress(MeasurementError):  # keep the model's fault, not the sampler's
                        sampler.stop()
                    raise
                sampler.stop()
                # mean power of the samples times the exact window: the last sample is taken after the
                # sampler thread joined, so the sampled span can run a little past the forwards
                window_j, source = sampler.mean_power_w() * (t1 - t0), "nvml_power_sampling"
                details["power_samples"] = float(sampler.n_samples)
        except MeasurementError as e:
            return None, None, f"energy not measured: {e}"
        window_s = t1 - t0
        details.update({"energy_window_s": window_s, "energy_window_forwards": float(k)})
        if window_j <= 0:
            return None, None, (
                f"energy not measured: {source} did not advance over a {window_s:.3g} s window "
                f"({k} forwards); raise energy_window_s"
            )
        if window_s > 0:
            details["mean_power_w"] = window_j / window_s
        return window_j / k, source, None
