"""The CPU that drives a GPU: :class:`HostProfile`, its default, its file format and its microbenchmark.

Eager PyTorch spends host time on every operator (Python, the dispatcher, cuDNN/cuBLAS set-up,
``cudaLaunchKernel``) before its kernels can run; at small batches that host time, not the GPU, sets the
latency. How long it takes depends on the CPU and on the framework generation. A :class:`HostProfile`
names both:

- ``speed``: single-thread speed of the host relative to a reference 3.0 GHz server core (host times
  divide by it). A profile built from a clock (:meth:`HostProfile.from_clock`) takes ``clock / 3.0``;
  a measured one (:func:`measure_host_profile`, ``dippm-nas host-profile``) converts the median
  per-operator time of a CPU-only eager microbenchmark with :data:`REFERENCE_MICROBENCH_US`.
- ``framework``: ``"torch-2"`` (PyTorch 2.x) or ``"torch-1"`` (PyTorch 1.x); the prior's host model
  holds one factor per generation.

Profiles are JSON files (:meth:`HostProfile.save`, :func:`load_host_profile`), never pickle.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dippm_nas._files import write_output
from dippm_nas._json import read_json_file
from dippm_nas._platform import cpu_model_name
from dippm_nas._schema import from_file_data
from dippm_nas.errors import DeviceError

__all__ = [
    "HostProfile", "FRAMEWORKS", "REFERENCE_CLOCK_GHZ", "REFERENCE_MICROBENCH_US", "DEFAULT_HOST_PROFILE",
    "default_host_profile", "load_host_profile", "resolve_host_profile", "measure_host_profile",
    "framework_of_version",
]

logger = logging.getLogger(__name__)

#: Framework generations the host model knows.
FRAMEWORKS: tuple[str, ...] = ("torch-2", "torch-1")
#: Clock of the reference host core, GHz: ``speed = clock_ghz / REFERENCE_CLOCK_GHZ``.
REFERENCE_CLOCK_GHZ = 3.0
#: Per-operator time of :func:`measure_host_profile`'s microbenchmark on a reference 3.0 GHz core running
#: PyTorch 2.x, µs. Anchored on the development machine: 4.84-4.87 µs in three runs there (AMD EPYC, family 26
#: model 2, ``cpu MHz`` 2596, torch 2.13.0+cpu, Python 3.11; ``measure_host_profile()``), scaled to 3.0 GHz by
#: the clock ratio (host time taken as inversely proportional to the clock): 4.85 x 2.596 / 3.0.
REFERENCE_MICROBENCH_US = 4.20
_FORMAT = 1
#: The largest host profile file read, bytes (one :meth:`HostProfile.save` writes is under 1 KB).
MAX_HOST_PROFILE_BYTES = 1 << 20


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def framework_of_version(version: str) -> str:
    """The framework generation of a torch version string (``"2.13.0+cpu"`` -> ``"torch-2"``).

    Raises:
        DeviceError: a version string that does not start with a major number.
    """
    head = str(version).strip().split(".")[0]
    if not head.isdigit():
        raise DeviceError(f"torch version must look like '2.13.0', got {version!r}")
    return "torch-1" if int(head) < 2 else "torch-2"


@dataclass(frozen=True)
class HostProfile:
    """The host CPU and framework that drive a GPU.

    Attributes:
        name: a label, e.g. ``"datacenter-default"`` or the CPU model.
        speed: single-thread speed relative to the reference 3.0 GHz core (> 0); host time ∝ 1 / speed.
        framework: one of :data:`FRAMEWORKS`.
        cpu_model: CPU model string, when known.
        clock_ghz: maximum clock, GHz, when known.
        microbench_us: median per-operator time of the eager microbenchmark, µs (measured profiles).
        torch_version: the torch version the profile describes or was measured with.
        source: where the figures come from.
    """

    name: str
    speed: float = 1.0
    framework: str = "torch-2"
    cpu_model: str = ""
    clock_ghz: float | None = None
    microbench_us: float | None = None
    torch_version: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DeviceError(f"HostProfile.name must be a non-empty string, got {self.name!r}")
        if not _finite(self.speed) or not 0.05 <= self.speed <= 20:
            raise DeviceError(f"HostProfile.speed must be a number in [0.05, 20] (1 = a 3.0 GHz server core), "
                              f"got {self.speed!r}")
        if self.framework not in FRAMEWORKS:
            raise DeviceError(f"HostProfile.framework must be one of {FRAMEWORKS}, got {self.framework!r}")
        for name in ("clock_ghz", "microbench_us"):
            v = getattr(self, name)
            if v is not None and (not _finite(v) or v <= 0):
                raise DeviceError(f"HostProfile.{name} must be a positive number or None, got {v!r}")

    @classmethod
    def from_clock(cls, clock_ghz: float, *, framework: str = "torch-2", name: str | None = None,
                   source: str = "") -> "HostProfile":
        """A profile whose speed is ``clock_ghz / 3.0`` (a core of similar design at another clock)."""
        if not _finite(clock_ghz) or clock_ghz <= 0:
            raise DeviceError(f"clock_ghz must be a positive number, got {clock_ghz!r}")
        return cls(name=name or f"{clock_ghz:g} GHz host", speed=clock_ghz / REFERENCE_CLOCK_GHZ,
                   framework=framework, clock_ghz=float(clock_ghz), source=source)

    def to_dict(self) -> dict[str, Any]:
        return {"format": _FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: Any, *, origin: str = "<dict>") -> "HostProfile":
        """Inverse of :meth:`to_dict`.

        The fields are checked against the dataclass's (:mod:`dippm_nas._schema`): a value of the wrong type,
        an unknown or a missing key is an error naming ``origin``, the field, the value and what is expected.

        Raises:
            DeviceError: not a mapping, another format, unknown keys or values breaking a rule.
        """
        if not isinstance(d, dict):
            raise DeviceError(f"{origin}: a host profile must be a JSON object, got {type(d).__name__}")
        if d.get("format") != _FORMAT:
            raise DeviceError(f"{origin}: host profile format must be {_FORMAT}, got {d.get('format')!r}")
        return from_file_data(cls, {k: v for k, v in d.items() if k != "format"}, origin, DeviceError)

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (what :func:`load_host_profile` reads), through a temporary file renamed
        into place (:func:`dippm_nas._files.write_output`).

        Raises:
            DeviceError: ``path`` is a directory, a FIFO, a device (``/dev/full``), a dangling symbolic link or
                in a missing directory, or the write fails.
        """
        write_output(path, json.dumps(self.to_dict(), indent=1) + "\n", "host profile file", error=DeviceError)


#: A typical datacenter GPU server's host: a server core boosting to ~3.3 GHz (the EPYC 7742 of a DGX
#: A100 boosts to 3.4 GHz, the Xeon Platinum 8275CL of a p4d instance to 3.6, the EPYC 7V12 of an ND A100
#: v4 to 3.3) running PyTorch 2.x.
DEFAULT_HOST_PROFILE = HostProfile.from_clock(
    3.3, framework="torch-2", name="datacenter-default",
    source="typical boost clock of A100/H100 server hosts (AMD EPYC 7742 3.4 GHz, Xeon Platinum 8275CL 3.6 GHz, "
           "EPYC 7V12 3.3 GHz; vendor specifications); PyTorch 2.x",
)


def default_host_profile() -> HostProfile:
    """The host profile predictions use unless told otherwise: :data:`DEFAULT_HOST_PROFILE`."""
    return DEFAULT_HOST_PROFILE


def load_host_profile(path: str | Path) -> HostProfile:
    """Read a host profile JSON file (written by :meth:`HostProfile.save` or ``dippm-nas host-profile``).

    Only a regular file of at most :data:`MAX_HOST_PROFILE_BYTES` is read (a FIFO or a device is refused,
    never waited on).

    Raises:
        DeviceError: unreadable file, not a regular file, too large, not JSON (or nested deeper than
            :data:`~dippm_nas._json.MAX_JSON_DEPTH`), or a malformed profile (the field, value and expected
            type named).
    """
    p = Path(path)
    return HostProfile.from_dict(read_json_file(p, f"cannot read host profile {str(p)!r}", DeviceError,
                                                max_bytes=MAX_HOST_PROFILE_BYTES),
                                 origin=f"host profile {str(p)!r}")


def resolve_host_profile(host: "HostProfile | str | Path | None") -> HostProfile:
    """A :class:`HostProfile` from a profile, ``None``/``"default"`` (the default) or a JSON file path.

    Raises:
        DeviceError: a path that cannot be read as a profile, or another type.
    """
    if host is None:
        return DEFAULT_HOST_PROFILE
    if isinstance(host, HostProfile):
        return host
    if isinstance(host, str) and host in ("default", DEFAULT_HOST_PROFILE.name):
        return DEFAULT_HOST_PROFILE
    if isinstance(host, str) and not host.strip():
        raise DeviceError(f"host {host!r}: an empty string is not a host profile; host must be None (not "
                          f"described), 'default' (the {DEFAULT_HOST_PROFILE.name!r} profile), a HostProfile, or the "
                          "path of a file written by `dippm-nas host-profile --out FILE`")
    if isinstance(host, (str, Path)):
        return load_host_profile(host)
    raise DeviceError(f"host must be None (not described), 'default' (the {DEFAULT_HOST_PROFILE.name!r} profile), a "
                      f"HostProfile, or the path of a file written by `dippm-nas host-profile --out FILE`; got "
                      f"{type(host).__name__} {host!r}")


def measure_host_profile(*, repeats: int = 60, iterations: int = 20, name: str | None = None) -> HostProfile:
    """Measure this machine's host profile with a CPU-only eager microbenchmark (about a second).

    The microbenchmark runs a small ``Conv2d -> BatchNorm2d -> ReLU`` stack eagerly on a tiny CPU tensor
    (one torch thread, ``no_grad``, eval mode), where every operator's time is framework overhead, and
    takes the fastest of ``repeats`` runs of the time per operator (the CPU's own speed, not the load
    other processes put on it). Speed is
    :data:`REFERENCE_MICROBENCH_US` divided by it. The figure is the CPU-side dispatch of this torch
    build; CUDA dispatch adds device work (stream, launch) that scales with the same CPU speed.

    Raises:
        DeviceError: ``repeats`` or ``iterations`` below 1.
    """
    import torch

    if repeats < 1 or iterations < 1:
        raise DeviceError(f"repeats and iterations must be >= 1, got {repeats}, {iterations}")
    layers = 8
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
    net = torch.nn.Sequential(*mods).eval()
    x = torch.randn(1, 8, 2, 2)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for _ in range(20):
                net(x)
            per_op = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(iterations):
                    net(x)
                per_op.append((time.perf_counter() - t0) / (iterations * len(mods)) * 1e6)
    finally:
        torch.set_num_threads(old_threads)
    us = min(per_op)
    cpu = cpu_model_name()
    return HostProfile(
        name=name or cpu or "measured host", speed=min(20.0, max(0.05, REFERENCE_MICROBENCH_US / us)),
        framework=framework_of_version(torch.__version__), cpu_model=cpu, clock_ghz=_clock_ghz(),
        microbench_us=us, torch_version=torch.__version__,
        source=f"measured by dippm_nas.devices.measure_host_profile on {cpu or 'this machine'} "
               f"(fastest of {repeats} x {iterations} passes of a {len(mods)}-operator eager stack)",
    )


def _clock_ghz() -> float | None:
    """This machine's CPU clock from /proc/cpuinfo (the first ``cpu MHz``), GHz; None where unavailable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("cpu mhz"):
                    v = float(line.split(":", 1)[1]) / 1000.0
                    return v if v > 0 else None
    except (OSError, ValueError):
        return None
    return None
