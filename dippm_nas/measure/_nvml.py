"""The one small adapter between dippm-nas and NVML (``pynvml`` from the ``nvidia-ml-py`` package).

Every NVML call the measurers make goes through :class:`NvmlAdapter`, so tests replace it with
``unittest.mock.create_autospec(NvmlAdapter, instance=True)`` and need no GPU. NVML errors are
re-raised as :class:`~dippm_nas.errors.MeasurementError` ``from`` the original. "Not supported"
answers that have a meaning (no energy counter before Volta, no MIG on this GPU) are returned as
``False`` by the ``*_supported`` / ``mig_enabled`` queries instead of raising.

Units: energy in millijoules, power in milliwatts, memory in bytes, as NVML reports them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from dippm_nas._logging import WarnOnce
from dippm_nas.errors import MeasurementError

__all__ = ["NvmlAdapter", "NvmlDevice", "locate_device"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger)


class NvmlAdapter:
    """Thin wrapper of the NVML calls a measurement needs. Handles are opaque objects."""

    def __init__(self) -> None:
        self._nvml: Any = None

    # ------------------------------------------------------------------ plumbing
    def _lib(self) -> Any:
        if self._nvml is None:
            raise MeasurementError("NvmlAdapter.init() must be called before any other NVML query")
        return self._nvml

    def _call(self, what: str, fn: str, *args: Any) -> Any:
        nv = self._lib()
        try:
            return getattr(nv, fn)(*args)
        except nv.NVMLError as e:
            raise MeasurementError(f"NVML {what} failed ({fn}): {e}") from e

    def _is_code(self, e: BaseException, *names: str) -> bool:
        nv = self._lib()
        return isinstance(e, nv.NVMLError) and any(
            getattr(e, "value", None) == getattr(nv, name, object()) for name in names
        )

    # ------------------------------------------------------------------ lifecycle
    def init(self) -> None:
        """Load and initialise NVML (reference-counted by NVML itself; pair with :meth:`shutdown`).

        Raises:
            MeasurementError: no NVML library (no NVIDIA driver) or the driver refused.
        """
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise MeasurementError(
                f"NVML needs the package nvidia-ml-py ({e}); install it with: pip install 'dippm-nas[gpu]' "
                "(or pip install nvidia-ml-py)"
            ) from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise MeasurementError(f"NVML could not be initialised (is an NVIDIA driver installed?): {e}") from e
        self._nvml = pynvml

    def shutdown(self) -> None:
        """Release NVML; a no-op when :meth:`init` did not succeed."""
        if self._nvml is None:
            return
        nv, self._nvml = self._nvml, None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as e:
            raise MeasurementError(f"NVML shutdown failed: {e}") from e

    # ------------------------------------------------------------------ devices
    def driver_version(self) -> str:
        """The NVIDIA driver version string, e.g. ``"550.54.15"``."""
        return str(self._call("driver version query", "nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        """Number of physical GPUs NVML sees (ignores ``CUDA_VISIBLE_DEVICES``)."""
        return int(self._call("device count query", "nvmlDeviceGetCount"))

    def handle_by_index(self, index: int) -> Any:
        """Handle of the physical GPU at NVML ``index``."""
        return self._call(f"handle lookup of GPU {index}", "nvmlDeviceGetHandleByIndex", index)

    def uuid(self, handle: Any) -> str:
        """``"GPU-…"`` for a GPU, ``"MIG-…"`` for a MIG instance."""
        return str(self._call("UUID query", "nvmlDeviceGetUUID", handle))

    def name(self, handle: Any) -> str:
        """Product name, e.g. ``"NVIDIA A100-SXM4-40GB"`` (with the profile for a MIG instance)."""
        return str(self._call("name query", "nvmlDeviceGetName", handle))

    def mig_enabled(self, handle: Any) -> bool:
        """True when MIG mode is currently enabled on this physical GPU; False when the GPU has no MIG."""
        nv = self._lib()
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError as e:
            if self._is_code(e, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return False
            raise MeasurementError(f"NVML MIG mode query failed: {e}") from e
        return bool(current == nv.NVML_DEVICE_MIG_ENABLE)

    def mig_device_handles(self, handle: Any) -> list[Any]:
        """Handles of the MIG instances that exist on this physical GPU (empty slots skipped)."""
        nv = self._lib()
        count = int(self._call("MIG device count query", "nvmlDeviceGetMaxMigDeviceCount", handle))
        out = []
        for i in range(count):
            try:
                out.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            except nv.NVMLError as e:
                if self._is_code(e, "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"):
                    continue
                raise MeasurementError(f"NVML MIG device lookup {i} failed: {e}") from e
        return out

    # ------------------------------------------------------------------ readings
    def energy_counter_supported(self, handle: Any) -> bool:
        """True when the total-energy counter exists (Volta and newer, whole GPU only)."""
        nv = self._lib()
        try:
            nv.nvmlDeviceGetTotalEnergyConsumption(handle)
        except nv.NVMLError as e:
            if self._is_code(e, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return False
            raise MeasurementError(f"NVML total-energy query failed: {e}") from e
        return True

    def total_energy_mj(self, handle: Any) -> int:
        """Energy the GPU consumed since the driver was loaded, millijoules."""
        return int(self._call("total-energy query", "nvmlDeviceGetTotalEnergyConsumption", handle))

    def power_mw(self, handle: Any) -> int:
        """Current board power draw, milliwatts (NVML averages it over a short driver-defined window)."""
        return int(self._call("power query", "nvmlDeviceGetPowerUsage", handle))

    def memory_used_bytes(self, handle: Any) -> int:
        """Device memory "used" (``nvmlDeviceGetMemoryInfo().used``), bytes: every process and context."""
        return int(self._call("memory query", "nvmlDeviceGetMemoryInfo", handle).used)


@dataclass(frozen=True)
class NvmlDevice:
    """Where the NVML readings of one CUDA device come from.

    Attributes:
        gpu: handle of the physical GPU (energy and power are only measurable for it).
        memory: handle whose "used" memory belongs to the CUDA device (the MIG instance itself on
            MIG), or ``None`` when it cannot be attributed.
        is_mig: True when the CUDA device is a MIG instance.
        name: NVML product name of ``memory`` (or of ``gpu`` when ``memory`` is ``None``).
        located_by: ``"uuid"`` (exact) or ``"index"`` (fallback; wrong under a reordering
            ``CUDA_VISIBLE_DEVICES``).
        note: why something could not be attributed, else ``None``.
    """

    gpu: Any
    memory: Any
    is_mig: bool
    name: str
    located_by: str
    note: str | None = None


def _norm_uuid(u: str) -> str:
    u = u.strip().lower()
    for prefix in ("mig-gpu-", "mig-", "gpu-"):
        if u.startswith(prefix):
            return u[len(prefix):]
    return u


def locate_device(nvml: NvmlAdapter, index: int, uuid: str | None) -> NvmlDevice:
    """Find the NVML handles of CUDA device ``index`` whose CUDA UUID is ``uuid``.

    The UUID is matched against every GPU and every MIG instance NVML sees; without a UUID (or
    without a match) NVML index ``index`` is used and a warning is logged once.

    Args:
        nvml: an initialised adapter.
        index: the torch CUDA device index.
        uuid: ``str(torch.cuda.get_device_properties(index).uuid)`` or ``None``.
    """
    if uuid:
        want = _norm_uuid(uuid)
        for i in range(nvml.device_count()):
            gpu = nvml.handle_by_index(i)
            mig = nvml.mig_enabled(gpu)
            if _norm_uuid(nvml.uuid(gpu)) == want:
                if mig:
                    return NvmlDevice(
                        gpu, None, True, nvml.name(gpu), "uuid",
                        note="the CUDA device matched a GPU in MIG mode but not one of its instances; "
                             "NVML memory cannot be attributed to this instance",
                    )
                return NvmlDevice(gpu, gpu, False, nvml.name(gpu), "uuid")
            if mig:
                for handle in nvml.mig_device_handles(gpu):
                    if _norm_uuid(nvml.uuid(handle)) == want:
                        return NvmlDevice(gpu, handle, True, nvml.name(handle), "uuid")
        _warn_once(f"nouuid:{uuid}", "CUDA device %d (UUID %s) not found by NVML UUID; using NVML index %d",
                   index, uuid, index)
    gpu = nvml.handle_by_index(index)
    if nvml.mig_enabled(gpu):
        return NvmlDevice(
            gpu, None, True, nvml.name(gpu), "index",
            note="GPU is in MIG mode and the instance could not be identified by UUID; "
                 "NVML memory cannot be attributed to this instance",
        )
    return NvmlDevice(gpu, gpu, False, nvml.name(gpu), "index")
