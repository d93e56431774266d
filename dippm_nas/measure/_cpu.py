"""CPU measurement: ``time.perf_counter`` around each forward, the shared stopping rule, a fixed
thread count, host peak-RSS delta, and RAPL package energy where a readable counter exists."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path
from typing import Any

from dippm_nas._platform import fixed_threads
from dippm_nas.errors import MeasurementError
from dippm_nas.measure._common import (
    ModelFault,
    base_environment,
    build_row,
    check_call,
    classify_fault,
    forward_context,
    guarded,
    latency_fields,
    prepare_inputs,
    prepare_model,
    timeout_reason,
    to_mib,
    window_forwards,
)
from dippm_nas.measure._malloc import release_free_memory, steady_allocator
from dippm_nas.measure._measurement import Measurement, MeasureSettings
from dippm_nas.measure._rapl import RAPL_ROOT, RaplCounter, probe_rapl
from dippm_nas.measure._rss import PeakRss
from dippm_nas.measure._stopping import Clock, StoppingRule, run_until_stopped
from dippm_nas.spec import InputSpec
from dippm_nas.units import MS_PER_S

__all__ = ["CpuMeasurer"]

logger = logging.getLogger(__name__)


def _tensor_bytes(model: Any) -> int:
    """Bytes of ``model``'s parameters and buffers (0 for a callable that is not an ``nn.Module``)."""
    tensors = [*model.parameters(), *model.buffers()] if hasattr(model, "parameters") else []
    return sum(t.numel() * t.element_size() for t in tensors)


def _checked_delta_mib(delta_bytes: int, weights: int) -> tuple[float | None, str | None]:
    """The RSS delta in MiB, or ``None`` with the reason when it is below ``weights`` bytes.

    The measurer copies (and casts) the model, so a true peak delta holds at least the copy's parameters
    and buffers (``weights``); a smaller delta means the allocator reused memory freed earlier in this
    process (a long-lived process measuring many models) and the figure would understate, often as 0.
    """
    if delta_bytes < weights:
        return None, (
            f"in-process RSS delta {to_mib(delta_bytes):.1f} MiB is below the model's own weights "
            f"{to_mib(weights):.1f} MiB (the allocator reused memory freed earlier in this process); "
            "measure with isolate=True for a host-memory figure"
        )
    return to_mib(delta_bytes), None


def _environment(s: MeasureSettings, threads: int, rapl: bool) -> dict[str, Any]:
    """The row's environment, after a garbage collection and (``cpu_allocator="steady"``) the allocator fixed and
    the free heap given back, so that earlier models' pages do not hide this one's from the RSS delta."""
    env = base_environment(s, threads)
    env.update({"device_kind": "cpu", "mig": False, "rapl": rapl,
                "allocator": steady_allocator() if s.cpu_allocator == "steady" else "as-is: requested"})
    gc.collect()
    # free pages of earlier models would hide this one's from the RSS delta (steady mode keeps them)
    env["heap_trimmed"] = release_free_memory() if s.cpu_allocator == "steady" else False
    return env


def _start_rss(env: dict[str, Any]) -> PeakRss | None:
    """A started peak-RSS reader (its method in ``env["rss_method"]``), or ``None`` with the reason there."""
    rss = PeakRss()
    try:
        rss.start()
    except MeasurementError as e:  # no /proc and no psutil: latency still measured, memory flagged
        env["rss_method"] = f"unavailable: {e}"
        return None
    env["rss_method"] = rss.method
    return rss


def _memory_fields(rss_bytes: tuple[int, int] | None, env: dict[str, Any], status: str,
                   weights_bytes: int) -> tuple[float | None, str | None, dict[str, float]]:
    """``(memory_mib, memory_reason, memory_parts_mib)`` of a run from its ``(before, peak)`` RSS bytes: the
    delta when the run got far enough (``ok`` or ``timeout``) and it holds at least the weights."""
    if rss_bytes is None:
        return None, f"no RSS reading: {env['rss_method']}", {}
    before, peak = rss_bytes
    delta = max(0, peak - before)
    parts = {"rss_before_mib": to_mib(before), "rss_peak_mib": to_mib(peak), "rss_delta_mib": to_mib(delta)}
    if status not in ("ok", "timeout"):
        return None, None, parts
    memory_mib, memory_reason = _checked_delta_mib(delta, weights_bytes)
    parts["weights_mib"] = to_mib(weights_bytes)
    return memory_mib, memory_reason, parts


class CpuMeasurer:
    """Measures a model's forward pass on the host CPU.

    Args:
        settings: the run settings; ``threads`` is fixed with ``torch.set_num_threads`` for the
            run and restored afterwards. CUDA-only settings (``tf32``, ``cudnn_benchmark``) are
            recorded but have no effect.
        clock: seconds clock for timing and the time cap (``time.perf_counter``; tests pass a fake).
        rapl: a RAPL counter to use instead of probing ``rapl_dir``.
        rapl_dir: the powercap directory whose package domains ``intel-rapl:N`` are summed (default
            ``/sys/class/powercap``), or one domain's directory.

    Memory (``memory_source="rss_delta"``): peak process RSS while the model is copied (and cast),
    the inputs made, warm-up and timed forwards run, minus the RSS just before; so weights plus
    activations plus allocator/thread-pool growth. See :mod:`dippm_nas.measure._rss` for its limits:
    process-wide, and allocator reuse of memory freed earlier can make it understate (even 0) in a
    long-lived process; measure in a fresh process when an exact figure matters.

    Energy (``energy_source="rapl_package"``): the package counters, summed over every CPU package
    (socket), over a separate window of back-to-back forwards of about ``settings.energy_window_s``,
    divided by the forwards; whole packages, all processes, idle power included. ``None`` with the reason when no readable counter.
    """

    def __init__(
        self,
        settings: MeasureSettings | None = None,
        *,
        clock: Clock = time.perf_counter,
        rapl: RaplCounter | None = None,
        rapl_dir: Path = RAPL_ROOT,
    ) -> None:
        self.settings = settings if settings is not None else MeasureSettings()
        self._clock = clock
        self._rapl = rapl
        self._rapl_dir = rapl_dir

    def measure(self, model: Any, spec: InputSpec) -> Measurement:
        """Measure ``model`` on ``spec``'s example inputs.

        Returns:
            A :class:`Measurement` with ``device="cpu"``; model faults (out of memory, time cap,
            an exception in the forward) are rows with ``status != "ok"``, never raised.

        Raises:
            MeasurementError: for usage errors (not an ``nn.Module``, autocast/dtype conflict).
        """
        import torch

        s = self.settings
        check_call(model, spec, s)
        rule = StoppingRule.from_settings(s, self._clock)
        if self._rapl is not None:
            rapl, rapl_reason = self._rapl, None
        else:
            rapl, rapl_reason = probe_rapl(self._rapl_dir)
        status, reason = "ok", None
        samples: tuple[float, ...] = ()
        stop_reason: str | None = None
        energy_j: float | None = None
        energy_reason: str | None = rapl_reason
        details: dict[str, float] = {}
        cpu = torch.device("cpu")
        with fixed_threads(s.threads) as threads:
            env = _environment(s, threads, rapl is not None)
            rss = _start_rss(env)
            weights_bytes = 0
            try:
                m = guarded("model preparation", prepare_model, model, spec, cpu, s)
                weights_bytes = _tensor_bytes(m)
                args, kwargs = guarded("input creation", prepare_inputs, spec, cpu, s)

                def forward() -> None:
                    guarded("forward", m, *args, **kwargs)

                def step_ms() -> float:
                    t0 = self._clock()
                    forward()
                    return (self._clock() - t0) * MS_PER_S

                with forward_context("cpu", s):
                    loop = run_until_stopped(step_ms, rule, s.warmup)
                    samples, stop_reason = loop.samples_ms, loop.stop_reason
                    details.update({"elapsed_s": loop.elapsed_s, "warmup_done": float(loop.warmup_done)})
                    if not loop.complete:
                        status, reason = "timeout", timeout_reason(rule, loop.warmup_done, s.warmup)
                        energy_reason = "not measured: the run timed out"
                    elif rapl is not None:
                        energy_j, energy_reason = self._rapl_energy(rapl, forward, samples, details)
            except ModelFault as fault:
                status, reason = classify_fault(fault)
                samples = rule.samples
                energy_j, energy_reason = None, f"not measured: {status}"
                logger.debug("CPU measurement fault: %s", reason, exc_info=fault.original)
            finally:
                rss_bytes = rss.stop() if rss is not None else None
        memory_mib, memory_reason, parts = _memory_fields(rss_bytes, env, status, weights_bytes)
        return build_row(
            **latency_fields(samples),
            energy_j=energy_j,
            energy_source="rapl_package" if energy_j is not None else None,
            energy_reason=energy_reason if energy_j is None else None,
            memory_mib=memory_mib,
            memory_source="rss_delta" if memory_mib is not None else None,
            memory_reason=memory_reason,
            memory_parts_mib=parts,
            device="cpu",
            environment=env,
            status=status,
            reason=reason,
            stop_reason=stop_reason,
            details=details,
            batch_size=spec.batch_size,
            dtype=spec.dtype,
        )

    def _rapl_energy(self, rapl: RaplCounter, forward: Any, samples: tuple[float, ...],
                     details: dict[str, float]) -> tuple[float | None, str | None]:
        k = window_forwards(sum(samples) / len(samples), self.settings.energy_window_s)
        try:
            e0 = rapl.read_uj()
            t0 = self._clock()
            for _ in range(k):
                forward()
            t1 = self._clock()
            e1 = rapl.read_uj()
            energy = rapl.delta_j(e0, e1)
        except MeasurementError as e:  # a counter that fails mid-run: flagged, not fatal
            return None, f"RAPL read failed: {e}"
        details.update({"energy_window_s": t1 - t0, "energy_window_forwards": float(k)})
        if energy <= 0:
            return None, f"RAPL counter did not advance over a {t1 - t0:.3g} s window"
        if t1 > t0:
            details["mean_power_w"] = energy / (t1 - t0)
        return energy / k, None
