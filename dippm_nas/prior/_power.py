"""GPU power along the predicted timeline: the energy a whole-GPU meter (NVML) reads for one pass.

While node ``i`` runs its kernels for ``gpu_us[i]`` the board draws

    P_i = min(board, idle + span * (busy + tensor * r_tc[i] + fp * r_fp[i] + dram * r_dram[i]))

with ``span = board - idle`` (the device's ``board_power_w`` and ``idle_power_w``) and ``r_*`` the share of the
unit's peak the node uses while it runs: tensor-core FLOP rate over the tensor peak, CUDA-core FLOP rate over the
CUDA-core peak, DRAM traffic over the bandwidth (all in ``[0, 1]``). While the GPU waits for the host inside
the pass (eager dispatch slower than the kernels: ``gpu_idle = latency - sum(gpu_us)``) it draws
``idle + span * wait``: the clocks stay up, no kernel runs. The energy of a pass is

    E = sum_i P_i * gpu_us[i] + (idle + span * wait) * gpu_idle_us     (µs · W = µJ)

The shares (``busy``, ``tensor``, ``fp``, ``dram``, ``wait``) are dimensionless and belong to an architecture:
fitted on measured energy where an architecture has data (``calibration/power.json``, with the command that
produced it and the fit's held-out error), they scale with any board's own power range. A device whose
architecture has no fit takes the fitted shares of the closest data (the file's ``"default"`` entry) with a
wider σ, and its figures are labelled ``"analytic"`` instead of ``"predicted"``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dippm_nas._files import write_output
from dippm_nas._json import check_keys, read_json_file
from dippm_nas._schema import from_file_data
from dippm_nas.devices import Device
from dippm_nas.errors import InvalidValueError
from dippm_nas.prior._params import read_shipped_file

__all__ = ["PowerParams", "PowerTable", "NodeActivity", "node_activity", "node_power_w", "wait_power_w",
           "pass_energy_j", "power_table", "power_params_for", "utilisation_energy_j", "POWER_FORMAT"]

logger = logging.getLogger(__name__)

#: Version of the ``power.json`` layout.
POWER_FORMAT = 1
POWER_FILE = "power.json"
_SHARES = ("busy", "tensor", "fp", "dram", "wait")


@dataclass(frozen=True)
class PowerParams:
    """Power constants of one GPU architecture, as shares of a board's range above idle.

    Attributes:
        busy: share drawn whenever a kernel runs (clocks and SMs active, whatever the unit).
        tensor: added share at the full tensor-core rate.
        fp: added share at the full CUDA-core floating-point rate.
        dram: added share at the full DRAM bandwidth.
        wait: share drawn while the GPU waits for the host inside a pass.
        sigma_log: one standard deviation of the energy in log space (relative σ), from the fit's held-out error.
        fitted: the shares were fitted on measurements of this architecture (figures labelled ``"predicted"``).
        source: where the shares come from.
    """

    busy: float = 0.15
    tensor: float = 0.6
    fp: float = 0.4
    dram: float = 0.3
    wait: float = 0.1
    sigma_log: float = 0.5
    fitted: bool = False
    source: str = "uncalibrated"

    def __post_init__(self) -> None:
        for name in _SHARES:
            v = getattr(self, name)
            if not _finite(v) or not 0.0 <= v <= 4.0:
                raise InvalidValueError(f"PowerParams.{name} must be a share in [0, 4] of the board's range above "
                                        f"idle, got {v!r}")
        if not _finite(self.sigma_log) or not 0.0 <= self.sigma_log <= 5.0:
            raise InvalidValueError(f"PowerParams.sigma_log must be in [0, 5], got {self.sigma_log!r}")
        if not isinstance(self.fitted, bool):
            raise InvalidValueError(f"PowerParams.fitted must be true or false, got {self.fitted!r}")

    def shares(self) -> np.ndarray:
        """``[busy, tensor, fp, dram, wait]`` as an array (the order :meth:`with_shares` reads)."""
        return np.array([getattr(self, n) for n in _SHARES], dtype=np.float64)

    def with_shares(self, x: "np.ndarray | list[float]", **changes: Any) -> "PowerParams":
        """A copy with the five shares replaced (order of :meth:`shares`)."""
        return dataclasses.replace(self, **{n: float(v) for n, v in zip(_SHARES, x)}, **changes)


@dataclass(frozen=True)
class PowerTable:
    """The power constants of every architecture with a fit, and the default for the others.

    Attributes:
        architectures: ``{architecture: PowerParams}`` (e.g. ``"hopper"``), fitted on its measurements.
        default: the constants of an architecture without a fit (``fitted=False``, wider σ).
        source, command: the data the fit used and the command that wrote the file.
        metrics: the fit's reported figures.
    """

    architectures: Mapping[str, PowerParams] = field(default_factory=dict)
    default: PowerParams = field(default_factory=PowerParams)
    source: str = "uncalibrated"
    command: str = ""
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def for_architecture(self, architecture: str) -> PowerParams:
        """The constants of ``architecture``: its fit, else :attr:`default`."""
        return self.architectures.get(architecture.lower(), self.default)

    def to_dict(self) -> dict[str, Any]:
        return {"format": POWER_FORMAT, "source": self.source, "command": self.command,
                "architectures": {k: asdict(v) for k, v in self.architectures.items()},
                "default": asdict(self.default), "metrics": dict(self.metrics)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "<dict>", trusted: bool = False) -> "PowerTable":
        """Inverse of :meth:`to_dict`.

        Args:
            d: the power file's mapping.
            origin: where it came from, for error messages.
            trusted: the shipped file (its tests check it against the schema): built by the dataclasses' own
                checks alone. Otherwise its fields are first checked against the dataclasses' (strict types,
                unknown keys refused; :mod:`dippm_nas._schema`).

        Raises:
            DippmNasError: wrong format version, unknown keys, values of the wrong type (the field path, the
                value and the expected type named) or breaking a rule.
        """
        if not isinstance(d, Mapping):
            raise InvalidValueError(f"{origin}: a power file holds a JSON object, got {type(d).__name__}")
        if d.get("format") != POWER_FORMAT:
            raise InvalidValueError(f"{origin}: power file format must be {POWER_FORMAT}, got {d.get('format')!r}")
        if not trusted:
            from_file_data(cls, {k: v for k, v in d.items() if k != "format"}, origin)
        allowed = set(PowerParams.__dataclass_fields__)

        def params(v: Any, where: str) -> PowerParams:
            if not isinstance(v, Mapping):
                raise InvalidValueError(f"{origin}: {where} must be a mapping of {sorted(allowed)}, got {v!r}")
            check_keys(v, allowed, f"{origin}: {where}")
            return PowerParams(**v)

        archs = {str(k).lower(): params(v, f"architectures[{k!r}]") for k, v in (d.get("architectures") or {}).items()}
        default = params(d["default"], "default") if "default" in d else PowerParams()
        return cls(architectures=archs, default=default, source=str(d.get("source", "")),
                   command=str(d.get("command", "")), metrics=dict(d.get("metrics") or {}))

    def save(self, path: str | Path) -> None:
        """Write as JSON (the format :meth:`load` reads), through a temporary file renamed into place
        (:func:`dippm_nas._files.write_output`).

        Raises:
            InvalidValueError: ``path`` is a directory, a FIFO, a device or in a missing directory, or the write
                fails.
        """
        write_output(path, json.dumps(self.to_dict(), indent=1) + "\n", "power parameters file",
                     error=InvalidValueError)

    @classmethod
    def load(cls, path: str | Path) -> "PowerTable":
        """Read a ``power.json`` file."""
        p = Path(path)
        return cls.from_dict(read_json_file(p, f"cannot read power file {p}", InvalidValueError), origin=str(p))


@lru_cache(maxsize=1)
def power_table() -> PowerTable:
    """The shipped power constants (``calibration/power.json``, loaded once per process); without the file,
    the uncalibrated shares for every architecture, with a warning."""
    d = read_shipped_file(POWER_FILE, "power",
                          f"the power model's constants (dippm_nas/prior/calibration/{POWER_FILE}) are missing; "
                          "using uncalibrated shares (run benchmarks/accuracy/accuracy_energy.py --write-power to fit them)")
    if d is None:
        return PowerTable()
    return PowerTable.from_dict(d, origin=f"dippm_nas/prior/calibration/{POWER_FILE}", trusted=True)


def power_params_for(device: Device, table: PowerTable | None = None) -> PowerParams:
    """The power constants that apply to ``device`` (by its architecture)."""
    return (table if table is not None else power_table()).for_architecture(device.architecture)


@dataclass(frozen=True)
class NodeActivity:
    """What each node keeps busy while it runs, as shares of the device's peaks.

    Shapes:
        every array is ``[num_nodes]`` float64 in ``[0, 1]`` (0 for nodes without kernels).

    Attributes:
        tensor_rate: tensor-core FLOP rate over the tensor peak of the node's dtype.
        fp_rate: CUDA-core FLOP rate over the CUDA-core peak (FP16 peak for half precision where known).
        dram_rate: bytes moved per second over the DRAM bandwidth.
    """

    tensor_rate: np.ndarray
    fp_rate: np.ndarray
    dram_rate: np.ndarray


def node_activity(flops: np.ndarray, bytes_: np.ndarray, gpu_us: np.ndarray, tensor_core: np.ndarray,
                  half: np.ndarray, device: Device) -> NodeActivity:
    """Per-node unit activity from the node's work and the time the prior gives it.

    Args:
        flops: FLOPs per node; ``bytes_``: bytes read and written per node.
        gpu_us: device time per node, µs (0: the node launches nothing).
        tensor_core: bool, the node runs on tensor cores; ``half``: bool, half-precision node.
        device: the GPU (its peaks and bandwidth).

    Shapes:
        every argument and result array is ``[num_nodes]``.
    """
    f = np.asarray(flops, dtype=np.float64)
    b = np.asarray(bytes_, dtype=np.float64)
    t = np.asarray(gpu_us, dtype=np.float64)
    tc = np.asarray(tensor_core, dtype=bool)
    hf = np.asarray(half, dtype=bool)
    half_tc = device.fp16_tensor_tflops or device.bf16_tensor_tflops or device.fp32_tflops
    fp32_tc = device.tf32_tensor_tflops or device.fp32_tflops
    tc_peak = np.where(hf, half_tc, fp32_tc)
    fp_peak = np.where(hf & (device.fp16_tflops is not None), device.fp16_tflops or 0.0, device.fp32_tflops)
    with np.errstate(divide="ignore", invalid="ignore"):
        compute = np.where(t > 0, f / (np.where(tc, tc_peak, fp_peak) * 1e12) * 1e6 / t, 0.0)
        dram = np.where(t > 0, b / (device.bandwidth_gbps * 1e9) * 1e6 / t, 0.0)
    compute = np.clip(np.nan_to_num(compute), 0.0, 1.0)
    return NodeActivity(tensor_rate=np.where(tc, compute, 0.0), fp_rate=np.where(tc, 0.0, compute),
                        dram_rate=np.clip(np.nan_to_num(dram), 0.0, 1.0))


def _power_range(device: Device) -> tuple[float, float]:
    if device.board_power_w is None or device.idle_power_w is None:
        raise InvalidValueError(f"device {device.id!r} has no power figures (board_power_w, idle_power_w)")
    return float(device.idle_power_w), float(device.board_power_w) - float(device.idle_power_w)


def node_power_w(params: PowerParams, device: Device, activity: NodeActivity) -> np.ndarray:
    """Board power while each node runs, W, capped at the board limit. Shapes: ``[num_nodes]``."""
    idle, span = _power_range(device)
    share = (params.busy + params.tensor * activity.tensor_rate + params.fp * activity.fp_rate
             + params.dram * activity.dram_rate)
    return np.minimum(float(device.board_power_w), idle + span * share)  # type: ignore[arg-type]


def wait_power_w(params: PowerParams, device: Device) -> float:
    """Board power while the GPU waits for the host inside a pass, W."""
    idle, span = _power_range(device)
    return min(float(device.board_power_w), idle + span * params.wait)  # type: ignore[arg-type]


def pass_energy_j(params: PowerParams, device: Device, gpu_us: np.ndarray, activity: NodeActivity,
                  latency_us: float) -> float:
    """Energy of one pass, J: node power over each node's time plus waiting power over the host gaps.

    Args:
        params: the architecture's power constants.
        device: the GPU.
        gpu_us: device time per node, µs (``[num_nodes]``).
        activity: the nodes' unit activity (:func:`node_activity`).
        latency_us: the pass's latency on the predicted timeline, µs; the GPU waits for
            ``latency_us - sum(gpu_us)`` of it (never below 0).
    """
    t = np.asarray(gpu_us, dtype=np.float64)
    busy_uj = float((node_power_w(params, device, activity) * t).sum())
    gap_us = max(0.0, float(latency_us) - float(t.sum()))
    return (busy_uj + wait_power_w(params, device) * gap_us) * 1e-6


def utilisation_energy_j(node_time_ms: np.ndarray, node_utilisation: np.ndarray, latency_ms: float,
                         device: Device) -> float | None:
    """The single-share energy the GNN checkpoints' ``prior_energy_j`` feature was computed with, J.

    ``sum_i min(board, idle + span * u_i) * t_i + idle * gap`` with ``u_i`` the share of the limiting
    resource's peak in use: not the energy this package predicts (see :func:`pass_energy_j`), kept so
    that a checkpoint's input means what it meant in training. ``None`` for a device without power figures.
    """
    if device.board_power_w is None or device.idle_power_w is None:
        return None
    t = np.asarray(node_time_ms, dtype=np.float64) * 1e3
    u = np.asarray(node_utilisation, dtype=np.float64)
    board, idle = float(device.board_power_w), float(device.idle_power_w)
    power = np.minimum(board, idle + (board - idle) * u)
    gap = max(0.0, latency_ms * 1e3 - float(t.sum()))
    return (float((power * t).sum()) + idle * gap) * 1e-6


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
