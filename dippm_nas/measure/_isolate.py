"""Measuring in a fresh subprocess: a hard time limit, an exact host-memory delta, crash isolation.

``measure(..., isolate=True)`` writes a JSON request (model SPEC string, optional JSON keyword
arguments for a ``package.module:callable`` builder, input spec, device, settings) to a temporary
file, runs ``python -m dippm_nas.measure._worker REQUEST RESULT`` and reads the
:class:`Measurement` back as JSON. No pickle crosses the process boundary.

What isolation adds over an in-process measurement:

- the time limit is enforced by killing the worker, so a forward that hangs cannot block the caller
  (status ``"timeout"``);
- the worker's RSS delta is not masked by memory the caller's process freed earlier;
- a segfault or a kill by the kernel's OOM killer becomes a row (status ``"error"`` with the signal
  in the reason) instead of taking the caller down.

It costs a Python + torch start-up (seconds) per measurement.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dippm_nas import errors
from dippm_nas._deprecation import MISSING, renamed_keyword
from dippm_nas.errors import MeasurementError
from dippm_nas.measure._measurement import Measurement, MeasureSettings
from dippm_nas.spec import InputSpec

__all__ = ["measure_isolated"]

logger = logging.getLogger(__name__)

#: Seconds allowed for the worker's start-up (Python, torch import, model build) on top of the budget.
STARTUP_ALLOWANCE_S = 120.0
_STDERR_TAIL_CHARS = 1000


def _default_timeout_s(settings: MeasureSettings) -> float:
    # warm-up and timed loop share time_cap_s; the energy window and start-up come on top
    return settings.time_cap_s + 2 * settings.energy_window_s + STARTUP_ALLOWANCE_S


def _failed_row(status: str, reason: str, spec: InputSpec, device: str, settings: MeasureSettings) -> Measurement:
    return Measurement(
        latency_ms=None, latency_ms_std=None, energy_j=None, memory_mib=None, memory_source=None, n_repeats=0,
        device=device, environment={"isolated": True, "settings": settings.to_dict()},
        status=status, reason=reason, energy_reason=f"not measured: {status}",
        batch_size=spec.batch_size, dtype=spec.dtype,
    )


def _usage_error(err: dict[str, Any]) -> errors.DippmNasError:
    """The worker's usage error as this process's exception of the same class (a :class:`MeasurementError` when the
    worker named no :class:`~dippm_nas.errors.DippmNasError` class)."""
    cls = getattr(errors, err.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.DippmNasError)):
        cls = MeasurementError
    return cls(f"(in the measurement worker) {err.get('message')}")


def measure_isolated(
    model: str,
    spec: InputSpec,
    torch_device: str = "cpu",
    settings: MeasureSettings | None = None,
    *,
    model_kwargs: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    device: Any = MISSING,
) -> Measurement:
    """Measure a model built from a SPEC string in a fresh Python process.

    Args:
        model: a model SPEC string (see :func:`dippm_nas.capture.load_model`), e.g.
            ``"torchvision:resnet18"`` or ``"search_spaces.mbconv:build"``.
        spec: the input spec.
        torch_device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        settings: measurement settings (``None``: defaults).
        model_kwargs: JSON-able keyword arguments for a ``package.module:callable`` SPEC (a search
            space builder's config); ``None`` calls it without arguments.
        timeout_s: hard limit for the whole worker, seconds; default ``time_cap_s`` plus twice the
            energy window plus :data:`STARTUP_ALLOWANCE_S`.
        device: deprecated name of ``torch_device`` (a :class:`DeprecationWarning`; removed in 0.2).

    Returns:
        The worker's :class:`Measurement` (``environment["isolated"] = True``), or a failed row when
        the worker was killed, crashed or timed out.

    Raises:
        MeasurementError, ModelSpecError, DeviceError...: usage errors found by the worker are
            re-raised here with the worker's message.
    """
    device = renamed_keyword("measure_isolated", "device", "torch_device", device, torch_device, "cpu",
                             removed_in="0.2")
    settings = settings if settings is not None else MeasureSettings()
    if not isinstance(model, str):
        raise MeasurementError(
            f"isolate=True needs the model as a SPEC string (the worker builds it), got {type(model).__name__}"
        )
    if model_kwargs is not None:
        try:
            json.dumps(model_kwargs)
        except (TypeError, ValueError) as e:
            raise MeasurementError(f"model_kwargs must be JSON-able, got {model_kwargs!r}: {e}") from e
    timeout = _default_timeout_s(settings) if timeout_s is None else float(timeout_s)
    request = {"model": model, "model_kwargs": model_kwargs, "spec": spec.to_dict(), "device": str(device),
               "settings": settings.to_dict()}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).exists())
    with tempfile.TemporaryDirectory(prefix="dippm-nas-measure-") as tmp:
        req_path, res_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req_path.write_text(json.dumps(request))
        cmd = [sys.executable, "-m", "dippm_nas.measure._worker", str(req_path), str(res_path)]
        logger.debug("isolated measurement of %s: %s (timeout %.0f s)", model, cmd, timeout)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return _failed_row("timeout", f"worker killed after the hard timeout of {timeout:g} s",
                               spec, str(device), settings)
        stderr_tail = (proc.stderr or "")[-_STDERR_TAIL_CHARS:].strip()
        if stderr_tail:
            logger.debug("measurement worker stderr (tail):\n%s", stderr_tail)
        last_line = stderr_tail.splitlines()[-1] if stderr_tail else "no output on stderr"
        if proc.returncode < 0:
            sig = -proc.returncode
            name = signal.Signals(sig).name if sig in {s.value for s in signal.Signals} else str(sig)
            hint = " (the kernel OOM killer sends SIGKILL when host memory runs out)" if sig == signal.SIGKILL else ""
            return _failed_row("error", f"worker killed by signal {name}{hint}", spec, str(device), settings)
        if proc.returncode != 0 or not res_path.exists():
            return _failed_row("error", f"worker exited with status {proc.returncode}: {last_line}",
                               spec, str(device), settings)
        result = json.loads(res_path.read_text())
    if "usage_error" in result:
        raise _usage_error(result["usage_error"])
    row = Measurement.from_dict(result["measurement"])
    env_out = dict(row.environment)
    env_out["isolated"] = True
    return Measurement.from_dict({**row.to_dict(), "environment": env_out})
