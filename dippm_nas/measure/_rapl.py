"""Intel RAPL package energy counters for CPU measurements, where they exist.

Linux exposes one powercap domain per CPU package, ``/sys/class/powercap/intel-rapl:N`` (``N`` = 0, 1, ...
on a multi-socket host), each with ``energy_uj`` (microjoules, wrapping at ``max_energy_range_uj``); its
subzones ``intel-rapl:N:M`` (cores, uncore, DRAM) are parts of the package and are not added again, and a
top-level domain whose ``name`` is not ``package-*`` (``psys``, the whole platform on some laptops) is left
out. Many systems have none (virtual machines, AMD before the ``amd_energy`` driver, containers without
/sys/class/powercap) and recent kernels make them readable by root only; :func:`probe_rapl` then returns
``None`` and the reason, and CPU energy stays ``None``.

The counters cover whole packages: every core and every process on them, idle power included. The energy
of a window is the sum over the packages of each package's own difference, each allowing for one
wrap-around of its counter.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from dippm_nas.errors import MeasurementError

__all__ = ["RAPL_ROOT", "RaplCounter", "probe_rapl", "rapl_packages"]

#: The powercap directory holding the RAPL domains.
RAPL_ROOT = Path("/sys/class/powercap")
_UJ_PER_J = 1_000_000.0
#: A top-level RAPL domain (a package), not a subzone (``intel-rapl:0:1``) nor an MMIO one.
_PACKAGE_RE = re.compile(r"^intel-rapl:\d+$")


def rapl_packages(root: Path = RAPL_ROOT) -> list[Path]:
    """The package domains under ``root`` (``intel-rapl:N`` whose ``name`` is ``package-*`` or absent),
    in numeric order; ``[root]`` when ``root`` is itself one domain (holds ``energy_uj``)."""
    root = Path(root)
    if (root / "energy_uj").exists():
        return [root]
    try:
        found = [p for p in root.iterdir() if _PACKAGE_RE.match(p.name)]
    except OSError:
        return []
    out = []
    for p in sorted(found, key=lambda p: int(p.name.rsplit(":", 1)[1])):
        try:
            name = (p / "name").read_text().strip()
        except OSError:
            name = ""
        if not name or name.startswith("package"):
            out.append(p)
    return out


class RaplCounter:
    """Reads the energy counters of one or more RAPL package domains.

    Args:
        directories: the domain directories (each holding ``energy_uj`` and ``max_energy_range_uj``), or one.
    """

    def __init__(self, directories: Path | Sequence[Path]) -> None:
        if isinstance(directories, (str, os.PathLike)):
            directories = [directories]
        if not isinstance(directories, (list, tuple)) or not all(isinstance(d, (str, os.PathLike))
                                                                 for d in directories):
            raise MeasurementError(f"RaplCounter takes a RAPL domain directory or a list of them, got "
                                   f"{directories!r:.80}")
        dirs = [Path(d) for d in directories]
        if not dirs:
            raise MeasurementError("RaplCounter needs at least one RAPL domain directory")
        self.directories = dirs

    @staticmethod
    def _read_int(path: Path) -> int:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError) as e:
            raise MeasurementError(f"cannot read RAPL counter {path}: {e}") from e

    def read_uj(self) -> tuple[int, ...]:
        """Each package's current counter value, microjoules."""
        return tuple(self._read_int(d / "energy_uj") for d in self.directories)

    def max_range_uj(self) -> tuple[int, ...]:
        """The value each package's counter wraps at, microjoules."""
        return tuple(self._read_int(d / "max_energy_range_uj") for d in self.directories)

    def delta_j(self, start_uj: Sequence[int] | int, end_uj: Sequence[int] | int) -> float:
        """Joules between two readings (:meth:`read_uj`), summed over the packages, allowing for one
        wrap-around of each package's counter."""
        start = (start_uj,) if isinstance(start_uj, int) else tuple(start_uj)
        end = (end_uj,) if isinstance(end_uj, int) else tuple(end_uj)
        if len(start) != len(end) or len(start) != len(self.directories):
            raise MeasurementError(f"RAPL readings must give one value per package ({len(self.directories)}), "
                                   f"got {len(start)} and {len(end)}")
        total = 0
        ranges: tuple[int, ...] | None = None
        for i, (a, b) in enumerate(zip(start, end)):
            delta = b - a
            if delta < 0:
                ranges = ranges or self.max_range_uj()
                delta += ranges[i]
            total += delta
        return total / _UJ_PER_J


def probe_rapl(root: Path = RAPL_ROOT) -> tuple[RaplCounter | None, str | None]:
    """A readable counter of every RAPL package under ``root`` (or of the one domain ``root`` is), or
    ``None`` and the reason there is none."""
    packages = rapl_packages(root)
    if not packages:
        return None, f"no RAPL energy counter on this host ({Path(root) / 'intel-rapl:N'}/energy_uj does not exist)"
    counter = RaplCounter(packages)
    try:
        counter.read_uj()
    except MeasurementError as e:
        return None, f"RAPL energy counter not readable: {e}"
    return counter, None
