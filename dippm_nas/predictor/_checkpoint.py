"""Where trained predictor checkpoints are found: ``$DIPPM_NAS_CHECKPOINT_DIR`` first, then the package's
``checkpoints/`` folder; what each one is (:func:`list_checkpoints`).

A checkpoint is named ``<device>.<tag>.pt`` (timm's ``name.tag``): the catalogue id it answers for and a tag
naming what it was trained on, e.g. ``a100-sxm4-40gb.accel-timm-tv.pt``; ``<device>.pt`` and
``host-cpu--<tag>.pt`` load too. A GPU's checkpoint is looked up by its device id (``<device>.pt`` before the
tagged ones). The ``host-cpu`` device is whatever machine runs dippm-nas, so several host checkpoints sit side
by side, one per CPU model they were measured on (``host.cpu_model`` in the metadata, read from the ``.json``
sidecar). :func:`find_checkpoint` takes the one measured on this machine's CPU model (user folder first); when
none was, a user's ``host-cpu.pt`` or the shipped ``host-cpu.intel-xeon.pt`` (:data:`DEFAULT_HOST_TAG`) answers
and its predictions are flagged ``details["other_host"] = 1`` with a wider σ (see :data:`OTHER_HOST_FLOOR_LOG`):
a CPU timing learnt on one processor is not a measurement of another, and a few measurements here
(``calibrate``) or a dataset built and trained here fix it. On a machine of its CPU model whose host
microbenchmark differs from the one it was trained at (another VM of the same model), predictions are flagged
``details["other_machine"] = 1`` with the floor :data:`OTHER_MACHINE_FLOOR_LOG`: the same model string is
not the same speed.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dippm_nas._json import read_json_file
from dippm_nas._platform import cpu_model_name
from dippm_nas.errors import CheckpointError

__all__ = ["CHECKPOINT_DIR_ENV", "HOST_DEVICE", "OTHER_HOST_FLOOR_LOG", "OTHER_MACHINE_FLOOR_LOG", "checkpoint_dirs",
           "SHIPPED_CHECKPOINT_DIR", "is_shipped_checkpoint", "checkpoint_candidates", "find_checkpoint",
           "host_checkpoints", "DEFAULT_HOST_TAG", "checkpoint_name", "CheckpointInfo", "Citation", "list_checkpoints",
           "cited_paths"]

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
#: (``python benchmarks/accuracy_other_host.py --data AMD_DATASET --checkpoint host-cpu.intel-xeon.pt`` on the AMD
#: machine; docs/predictor_report.md, "Host CPU: another machine or another CPU"). Another pair of CPUs may
#: differ by more.
OTHER_HOST_FLOOR_LOG: dict[str, float] = {"latency_ms": 0.30, "memory_mib": 0.10}

#: Log-space σ floor of a host-cpu prediction on a machine of the checkpoint's CPU model whose host
#: microbenchmark lies outside the device features the checkpoint was trained at (another VM of the same
#: model; added in quadrature, until calibrated here, with ``details["other_machine"] = 1``). A checkpoint
#: trained on one machine has seen one value of each device feature, so without this case such a machine
#: would count as outside the training range, adding half the correction bound (σ ≈ 1.3× the figure).
#: Measured with ``python benchmarks/accuracy_other_host.py --data DATA_OF_THE_OTHER_VM --checkpoint
#: host-cpu.amd-epyc.pt --same-cpu-model`` (docs/predictor_report.md, "Host CPU: another machine or
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


#: The tag of the shipped host-cpu checkpoint that answers on a CPU model no checkpoint was measured on (the one
#: trained on the most rows: 3,300 models of 8 families on an Intel Xeon).
DEFAULT_HOST_TAG = "intel-xeon"

_TAG = re.compile(r"[a-z0-9][a-z0-9_-]*")


def checkpoint_name(path: str | Path) -> tuple[str, str | None]:
    """``(device, tag)`` of a checkpoint file's name: ``<device>.<tag>.pt``, ``<device>.pt`` (tag ``None``) or
    ``host-cpu--<tag>.pt``.

    Raises:
        CheckpointError: ``path`` is not a path.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f"checkpoint_name(): expected a path, got {type(path).__name__} {path!r:.80}")
    stem = Path(path).name.removesuffix(".pt")
    device, dot, tag = stem.partition(".")
    if dot and _TAG.fullmatch(tag):
        return device, tag
    if stem.startswith(f"{HOST_DEVICE}--") and _TAG.fullmatch(stem[len(HOST_DEVICE) + 2:]):
        return HOST_DEVICE, stem[len(HOST_DEVICE) + 2:]
    return stem, None


def _device_checkpoints(d: Path, device: str) -> list[Path]:
    """The checkpoints of ``device`` in folder ``d``: ``<device>.pt`` first, then the tagged ones by name."""
    if not d.is_dir():
        return []
    found = [p for p in d.glob(f"{device}*.pt") if p.is_file() and checkpoint_name(p)[0] == device]
    return sorted(found, key=lambda p: (checkpoint_name(p)[1] is not None, p.name))


def host_checkpoints() -> list[tuple[Path, str | None]]:
    """Every host-cpu checkpoint in the search folders (user folder first) with the CPU model it was
    measured on (``None`` when its metadata does not say)."""
    return [(p, _sidecar_cpu_model(p)) for d in checkpoint_dirs() for p in _device_checkpoints(d, HOST_DEVICE)]


def checkpoint_candidates(device: str, cpu_model: str | None = None) -> list[Path]:
    """Checkpoints that could answer for ``device`` (a catalogue id, or ``<device>.<tag>`` for one checkpoint),
    best first (see :func:`find_checkpoint`)."""
    base, tag = checkpoint_name(device + ".pt")
    if tag is not None:
        return [p for d in checkpoint_dirs() for p in _device_checkpoints(d, base) if checkpoint_name(p)[1] == tag]
    if device != HOST_DEVICE:
        return [p for d in checkpoint_dirs() for p in _device_checkpoints(d, device)]
    here = cpu_model or cpu_model_name()
    out = [p for p, model in host_checkpoints() if model == here]
    for d in checkpoint_dirs():  # none of this CPU model: a user's host-cpu.pt, then the shipped default
        for p in (d / f"{HOST_DEVICE}.pt", d / f"{HOST_DEVICE}.{DEFAULT_HOST_TAG}.pt"):
            if p.is_file() and p not in out:
                out.append(p)
    return out


def find_checkpoint(device: str, *, cpu_model: str | None = None) -> Path | None:
    """Path of the checkpoint for ``device``, or ``None``.

    Args:
        device: catalogue id, or ``<device>.<tag>`` for the checkpoint of that name.
        cpu_model: for ``host-cpu``, the CPU model to match (default: this machine's).
    """
    found = checkpoint_candidates(device, cpu_model)
    return found[0] if found else None


# ------------------------------------------------------------------------------------------------ listing
#: Top-level folders of the dippm-nas repository: a relative path under one of them is a repository file.
REPO_FOLDERS = ("benchmarks", "data", "dippm_nas", "docs", "examples", "scripts", "search_spaces", "tests")
#: A path-like token of a metadata text: folders and a file name with an extension.
_PATH_TOKEN = re.compile(r"(?<![\w./@-])((?:\.\./|/)?(?:[\w.@-]+/)+[\w@-][\w.@-]*\.[A-Za-z][A-Za-z0-9]*)")
#: Repository files that a shipped checkpoint's metadata cites by the path they had when it was trained, and
#: where they are in this tree (the metadata keeps the command as it was run).
RELOCATED: dict[str, str] = {
    **{f"dippm_nas/predictor/checkpoints/{old}": f"dippm_nas/predictor/checkpoints/{new}" for old, new in (
        ("a100-sxm4-40gb.pt", "a100-sxm4-40gb.accel-timm-tv.pt"), ("host-cpu.pt", "host-cpu.intel-xeon.pt"),
        ("host-cpu--amd-epyc.pt", "host-cpu.amd-epyc.pt"))},
    **dict((
        ("benchmarks/calibrate_prior.py", "scripts/fit/calibrate_prior.py"),
        ("benchmarks/calibrate_host_prior.py", "scripts/fit/calibrate_host_prior.py"),
        ("benchmarks/calibrate_host_model.py", "scripts/fit/calibrate_host_model.py"),
        ("benchmarks/calibrate_fp64.py", "scripts/fit/calibrate_fp64.py"),
        ("benchmarks/prior_vidur_gemms.py", "benchmarks/accuracy/prior_vidur_gemms.py"),
        ("benchmarks/accuracy_energy.py", "benchmarks/accuracy/accuracy_energy.py"),
        ("benchmarks/dispatch_generations.py", "benchmarks/measurement/dispatch_generations.py"),
        ("scripts/fit_novelty_floor.py", "scripts/fit/fit_novelty_floor.py"),
        ("scripts/fit_novelty_twins.py", "scripts/fit/fit_novelty_twins.py"),
        ("scripts/pin_prior_keys.py", "scripts/fit/pin_prior_keys.py"),
    )),
}


@dataclass(frozen=True)
class Citation:
    """A file a checkpoint's metadata cites (in its data sources, command, notes or metric labels).

    Attributes:
        path: the path as written.
        where: ``"repo"`` (a file of this repository, relative to its root), ``"public-data"`` (the public data
            set folder ``../shared/data``, described by its ``PROVENANCE.md``, not part of the repository) or
            ``"external"`` (a file of the machine that trained it: kept as the record of what was run, not
            shipped).
        repo_path: for a ``"repo"`` citation, the file's path in this tree (``path``, or where
            :data:`RELOCATED` says it is); ``None`` otherwise.
    """

    path: str
    where: str
    repo_path: str | None = None


def cited_paths(text: str) -> list[Citation]:
    """The files ``text`` (a checkpoint's metadata JSON) cites, each once, in order of appearance."""
    out: dict[str, Citation] = {}
    for m in _PATH_TOKEN.finditer(text):
        path = m.group(1)
        if path in out:
            continue
        if path.startswith("../shared/") or "/shared/data/" in path:
            where = "public-data"
        elif not path.startswith("/") and path.split("/", 1)[0] in REPO_FOLDERS:
            where = "repo"
        else:
            where = "external"
        out[path] = Citation(path, where, RELOCATED.get(path, path) if where == "repo" else None)
    return list(out.values())


@dataclass(frozen=True)
class CheckpointInfo:
    """What :func:`list_checkpoints` says about one checkpoint file (read from its ``.json`` sidecar).

    Attributes:
        name: ``<device>.<tag>`` (or the file's stem for an untagged name).
        device, tag: from the name (:func:`checkpoint_name`).
        path: the ``.pt`` file.
        shipped: it is one of the package's checkpoints.
        size_bytes: size of the ``.pt`` file plus its sidecar, bytes.
        date: training date from the metadata (``None``: no readable sidecar).
        targets: the figures it predicts.
        cpu_model: for host-cpu checkpoints, the CPU model its labels were measured on.
        data_sources: what it was trained on, as its metadata says.
        heldout_metrics: its metadata's held-out figures (split -> target -> metric).
        citations: the files its metadata cites (:class:`Citation`).
        problem: why the sidecar could not be read (``""`` when it could).
    """

    name: str
    device: str
    tag: str | None
    path: Path
    shipped: bool
    size_bytes: int
    date: str | None = None
    targets: list[str] = field(default_factory=list)
    cpu_model: str | None = None
    data_sources: list[str] = field(default_factory=list)
    heldout_metrics: dict[str, Any] = field(default_factory=dict)
    citations: list[Citation] = field(default_factory=list)
    problem: str = ""

    def metric_lines(self) -> list[tuple[str, str, float, int, float | None]]:
        """``(split, target, MAPE %, rows, the prior's MAPE % or None)`` of every held-out figure with a MAPE, in
        the metadata's order (the prior's own entries, ``<target>_prior``, go beside their target's)."""
        out = []
        for split, by_target in self.heldout_metrics.items():
            if not isinstance(by_target, dict):
                continue
            for target, m in by_target.items():
                if target.endswith("_prior") or not isinstance(m, dict) or not _is_number(m.get("mape_pct")) \
                        or not _is_number(m.get("n")):
                    continue
                prior = by_target.get(f"{target}_prior")
                prior_mape = prior.get("mape_pct") if isinstance(prior, dict) else m.get("mape_pct_prior")
                out.append((split, target, float(m["mape_pct"]), int(m["n"]),
                            float(prior_mape) if _is_number(prior_mape) else None))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``path`` as text, citations as ``{"path", "where", "repo_path"}``)."""
        return {"name": self.name, "device": self.device, "tag": self.tag, "path": str(self.path),
                "shipped": self.shipped, "size_bytes": self.size_bytes, "date": self.date, "targets": self.targets,
                "cpu_model": self.cpu_model, "data_sources": self.data_sources,
                "heldout_metrics": self.heldout_metrics,
                "citations": [{"path": c.path, "where": c.where, "repo_path": c.repo_path} for c in self.citations],
                "problem": self.problem}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _info(path: Path) -> CheckpointInfo:
    device, tag = checkpoint_name(path)
    side = path.with_suffix(".json")
    size = path.stat().st_size + (side.stat().st_size if side.is_file() else 0)
    base = CheckpointInfo(name=device if tag is None else f"{device}.{tag}", device=device, tag=tag, path=path,
                          shipped=is_shipped_checkpoint(path), size_bytes=size)
    try:
        meta = read_json_file(side, f"checkpoint sidecar {side}", CheckpointError)
    except CheckpointError as e:
        return replace(base, problem=str(e))
    if not isinstance(meta, dict):
        return replace(base, problem=f"checkpoint sidecar {side} must hold a JSON object")
    host = meta.get("host") if isinstance(meta.get("host"), dict) else {}
    sources = meta.get("data_sources")
    metrics = meta.get("heldout_metrics")
    return replace(base, date=meta.get("date") if isinstance(meta.get("date"), str) else None,
                    targets=[t for t in meta.get("targets", {}) if isinstance(t, str)],
                    cpu_model=host.get("cpu_model") if isinstance(host.get("cpu_model"), str) else None,
                    data_sources=[s for s in sources if isinstance(s, str)] if isinstance(sources, list) else [],
                    heldout_metrics=metrics if isinstance(metrics, dict) else {},
                    citations=cited_paths(json.dumps(meta, ensure_ascii=False)))


def list_checkpoints(device: str | None = None) -> list[CheckpointInfo]:
    """Every checkpoint in the search folders (user folder first, then by name), or those of ``device``.

    Args:
        device: a catalogue id (its checkpoints only), or ``None`` for all.
    """
    out = []
    for d in checkpoint_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.pt")):
            if p.is_file() and (device is None or checkpoint_name(p)[0] == device):
                out.append(_info(p))
    return out
