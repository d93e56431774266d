"""Where trained predictor checkpoints are found: ``$DIPPM_NAS_CHECKPOINT_DIR`` first, then the package's
``checkpoints/`` folder.

A GPU's checkpoint is ``<device>.pt``. The ``host-cpu`` device is whatever machine runs dippm-nas, so
several host checkpoints can sit side by side, one per CPU model they were measured on: ``host-cpu.pt``
(the default) and ``host-cpu--<name>.pt``, each with its CPU model in the metadata (``host.cpu_model``,
read from the ``.json`` sidecar). :func:`find_checkpoint` takes the one measured on this machine's CPU
model (user folder first); when none was, the default ``host-cpu.pt`` answers and its predictions are
flagged ``details["other_host"] = 1`` with a wider σ (see :data:`OTHER_HOST_FLOOR_LOG`): a CPU timing
learnt on one processor is not a measurement of another, and a few measurements here (``calibrate``)
or a dataset built and trained here fix it. On a machine of its CPU model whose host microbenchmark
differs from the one it was trained at (another VM of the same model), predictions are flagged
``details["other_machine"] = 1`` with the floor :data:`OTHER_MACHINE_FLOOR_LOG`: the same model string is
not the same speed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from dippm_nas._json import read_json_file
from dippm_nas._platform import cpu_model_name
from dippm_nas.errors import CheckpointError

__all__ = ["CHECKPOINT_DIR_ENV", "HOST_DEVICE", "OTHER_HOST_FLOOR_LOG", "OTHER_MACHINE_FLOOR_LOG", "checkpoint_dirs",
           "SHIPPED_CHECKPOINT_DIR", "is_shipped_checkpoint", "checkpoint_candidates", "find_checkpoint",
           "host_checkpoints"]

logger = logging.getLogger(__name__)

CHECKPOINT_DIR_ENV = "DIPPM_NAS_CHECKPOINT_DIR"
#: The device whose checkpoints are chosen by the CPU model of this machine.
HOST_DEVICE = "host-cpu"

#: Log-space σ floor of a host-cpu prediction made with a checkpoint measured on another CPU model and not
#: calibrated here (added in quadrature; such predictions skip the device-feature range check, since a
#: single-host checkpoint has seen one device). Measured on one pair of machines: the Intel Xeon checkpoint
#: predicting 3,300 latencies and 3,243 peak-RSS figures measured on an AMD EPYC VM (latency 23.6 % MAPE,
#: τ 0.874; memory 9.5 %, τ 0.933); the floor that puts 95 % of them within ±2σ is 0.297 (latency) and
#: 0.103 (memory); fitted on four families it covers 99.8 % / 91.4 % of the other four
#: (``python benchmarks/accuracy_other_host.py --data AMD_DATASET --checkpoint host-cpu.pt`` on the AMD
#: machine; docs/predictor_report.md, "Host CPU: another machine or another CPU"). Another pair of CPUs may
#: differ by more.
OTHER_HOST_FLOOR_LOG: dict[str, float] = {"latency_ms": 0.30, "memory_mib": 0.10}

#: Log-space σ floor of a host-cpu prediction on a machine of the checkpoint's CPU model whose host
#: microbenchmark lies outside the device features the checkpoint was trained at (another VM of the same
#: model; added in quadrature, until calibrated here, with ``details["other_machine"] = 1``). A checkpoint
#: trained on one machine has seen one value of each device feature, so without this case such a machine
#: would count as outside the training range, adding half the correction bound (σ ≈ 1.3× the figure).
#: Measured with ``python benchmarks/accuracy_other_host.py --data DATA_OF_THE_OTHER_VM --checkpoint
#: host-cpu--amd-epyc.pt --same-cpu-model`` (docs/predictor_report.md, "Host CPU: another machine or
#: another CPU"); the AMD EPYC checkpoint (trained on a third AMD VM) needs, for 95 % within ±2σ:
#:
#: - on the first AMD VM (3,300 rows, data/host_cpu/host_cpu_amd_epyc.jsonl.xz; 1.8x too slow, 15.2 %
#:   latency MAPE once that factor is removed): latency 0.472;
#: - on a second AMD VM (3,300 rows, data/host_cpu/host_cpu_amd_epyc_rounds.jsonl.xz; 1.36x too slow,
#:   9.7 % after the factor): latency 0.250;
#: - on a VM of a newer processor generation under the same model string (family 25 model 17, 280 rows
#:   measured twice, data/host_cpu/host_cpu_amd_epyc_f25m17*.jsonl.xz; 1.37x / 1.27x too slow, 9.0 / 9.7 %
#:   after the factor): 0.235 / 0.083 and 0.191 / 0.058 (latency / memory).
#:
#: Latency takes the largest need, rounded up; memory the largest measured over the AMD VM pairs, 0.147 (a
#: checkpoint trained on the first VM, on the second VM's rows). VMs sold as the same CPU model ran the same
#: models up to 1.85x apart; other VMs may differ by more.
OTHER_MACHINE_FLOOR_LOG: dict[str, float] = {"latency_ms": 0.48, "memory_mib": 0.15}


#: The folder of the checkpoints shipped with dippm-nas.
SHIPPED_CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"


def checkpoint_dirs() -> list[Path]:
    """Folders searched for ``<device>.pt`` checkpoints, user folder first."""
    dirs = []
    user = os.environ.get(CHECKPOINT_DIR_ENV)
    if user:
        dirs.append(Path(user))
    dirs.append(SHIPPED_CHECKPOINT_DIR)
    return dirs


def is_shipped_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint shipped with dippm-nas (its metadata is trusted: the tests check it
    against the schema)."""
    try:
        return Path(path).resolve().parent == SHIPPED_CHECKPOINT_DIR.resolve()
    except OSError:
        return False


def _sidecar_cpu_model(path: Path) -> str | None:
    """``host.cpu_model`` of a checkpoint's ``.json`` sidecar, or ``None`` (no sidecar, no host recorded)."""
    side = path.with_suffix(".json")
    try:
        meta = read_json_file(side, f"checkpoint sidecar {side}", CheckpointError)
    except CheckpointError as e:
        if side.exists():
            logger.warning("%s; ranked as a checkpoint of an unknown CPU model", e)
        return None
    host = meta.get("host") if isinstance(meta, dict) else None
    model = host.get("cpu_model") if isinstance(host, dict) else None
    return model if isinstance(model, str) and model else None


def host_checkpoints() -> list[tuple[Path, str | None]]:
    """Every host-cpu checkpoint in the search folders (user folder first) with the CPU model it was
    measured on (``None`` when its metadata does not say)."""
    out = []
    for d in checkpoint_dirs():
        for p in sorted(d.glob(f"{HOST_DEVICE}*.pt")):
            if p.stem == HOST_DEVICE or p.stem.startswith(f"{HOST_DEVICE}--"):
                out.append((p, _sidecar_cpu_model(p)))
    return out


def checkpoint_candidates(device: str, cpu_model: str | None = None) -> list[Path]:
    """Checkpoints that could answer for ``device``, best first (see :func:`find_checkpoint`)."""
    out: list[Path] = []
    if device == HOST_DEVICE:
        here = cpu_model or cpu_model_name()
        out += [p for p, model in host_checkpoints() if model == here]
    for d in checkpoint_dirs():
        p = d / f"{device}.pt"
        if p.is_file() and p not in out:
            out.append(p)
    return out


def find_checkpoint(device: str, *, cpu_model: str | None = None) -> Path | None:
    """Path of the checkpoint for ``device``, or ``None``.

    Args:
        device: catalogue id.
        cpu_model: for ``host-cpu``, the CPU model to match (default: this machine's).
    """
    found = checkpoint_candidates(device, cpu_model)
    return found[0] if found else None
