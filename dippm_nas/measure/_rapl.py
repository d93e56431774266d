"""Intel RAPL package energy counter for CPU measurements, where one exists.

Linux exposes it as ``/sys/class/powercap/intel-rapl:0/energy_uj`` (microjoules, wraps at
``max_energy_range_uj``). Many systems have none (virtual machines, AMD before the ``amd_energy``
driver, containers without /sys/class/powercap) and recent kernels make it readable by root only;
:func:`probe_rapl` then returns ``None`` and the reason, and CPU energy stays ``None``.

The counter covers the whole CPU package: every core and every process on it, idle power included.
"""

from __future__ import annotations

from pathlib import Path

from dippm_nas.errors import MeasurementError

__all__ = ["RAPL_DIR", "RaplCounter", "probe_rapl"]

#: The package-0 RAPL domain.
RAPL_DIR = Path("/sys/class/powercap/intel-rapl:0")
_UJ_PER_J = 1_000_000.0


class RaplCounter:
    """Reads one RAPL domain's energy counter.

    Args:
        directory: the powercap domain directory holding ``energy_uj`` and ``max_energy_range_uj``.
    """

    def __init__(self, directory: Path = RAPL_DIR) -> None:
        self.directory = Path(directory)

    def _read_int(self, name: str) -> int:
        path = self.directory / name
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError) as e:
            raise MeasurementError(f"cannot read RAPL counter {path}: {e}") from e

    def read_uj(self) -> int:
        """Current counter value, microjoules."""
        return self._read_int("energy_uj")

    def max_range_uj(self) -> int:
        """The value the counter wraps at, microjoules."""
        return self._read_int("max_energy_range_uj")

    def delta_j(self, start_uj: int, end_uj: int) -> float:
        """Joules between two readings, allowing for one wrap-around of the counter."""
        delta = end_uj - start_uj
        if delta < 0:
            delta += self.max_range_uj()
        return delta / _UJ_PER_J


def probe_rapl(directory: Path = RAPL_DIR) -> tuple[RaplCounter | None, str | None]:
    """A readable RAPL counter, or ``None`` and the reason there is none."""
    path = Path(directory) / "energy_uj"
    if not path.exists():
        return None, f"no RAPL energy counter on this host ({path} does not exist)"
    counter = RaplCounter(Path(directory))
    try:
        counter.read_uj()
    except MeasurementError as e:
        return None, f"RAPL energy counter not readable: {e}"
    return counter, None
