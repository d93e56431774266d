"""Device catalogue: GPUs from spec sheets (one TOML file each) and the measured host CPU.

>>> from dippm_nas.devices import get_device, list_devices
>>> get_device("a100-sxm4-40gb").fp16_tensor_tflops
312.0

User devices: drop ``<id>.toml`` files (same keys as the built-in files) into a directory named by
``$DIPPM_NAS_DEVICE_DIR``, or call :func:`register_device`.

Calibrating a device's observed constants (``idle_power_w``, ``runtime_baseline_mib``) from your own
measurements: register a copy under a new id, e.g.
``register_device(dataclasses.replace(get_device("a100-sxm4-40gb"), id="lab-a100", runtime_baseline_mib=512.0))``.
"""

from dippm_nas._platform import cpu_model_name, cpu_signature
from dippm_nas.devices._device import DEVICE_KINDS, PCIE_LANE_GBPS, Device, MigProfile, device_from_dict
from dippm_nas.devices._host import CACHE_DIR_ENV, host_facts, measure_weight_cache
from dippm_nas.devices._host_profile import (
    DEFAULT_HOST_PROFILE,
    FRAMEWORKS,
    HostProfile,
    default_host_profile,
    framework_of_version,
    load_host_profile,
    measure_host_profile,
    resolve_host_profile,
)
from dippm_nas.devices._registry import (
    DEVICE_DIR_ENV,
    get_device,
    list_devices,
    register_device,
    resolve_device,
    unregister_device,
)

__all__ = [
    "Device", "MigProfile", "DEVICE_KINDS", "PCIE_LANE_GBPS", "device_from_dict",
    "get_device", "list_devices", "register_device", "unregister_device", "resolve_device",
    "DEVICE_DIR_ENV", "CACHE_DIR_ENV", "host_facts", "measure_weight_cache", "cpu_model_name", "cpu_signature",
    "HostProfile", "FRAMEWORKS", "DEFAULT_HOST_PROFILE", "default_host_profile", "load_host_profile",
    "resolve_host_profile", "measure_host_profile", "framework_of_version",
]
