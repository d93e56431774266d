"""The real-GPU campaign: a fixed, versioned validation set measured in one resumable, time-bounded run.

:func:`run_campaign` (``dippm-nas gpu-campaign --out DIR [--minutes 25] [--resume]``) measures the models of
a validation set (:data:`VALIDATION_SETS`) at each batch size, dtype and runtime with the measurers of this
package (:class:`~dippm_nas.measure.CudaMeasurer` on a GPU: CUDA events, the NVML energy counter or power
sampling where it is missing, ``torch.cuda.max_memory_reserved`` / ``max_memory_allocated`` and NVML
memory; :class:`~dippm_nas.measure.CpuMeasurer` on a CPU, which runs the whole campaign end to end without a
GPU). It needs only torch (and torchvision, timm, transformers for the set's models): no TVM, Optuna or
SQLAlchemy, so it runs from a source checkout on a bare GPU machine::

    PYTHONPATH=. python3 -m dippm_nas gpu-campaign --out campaign-h100 --minutes 25

Graphs are captured later, on a machine with TVM, from the SPEC string and input spec each row records
(``dippm-nas dataset import campaign DIR --out dataset.sqlite``).

Order. Items are measured most informative first: every model once at the most common setting (eager,
float16, batch 32), then batch 1 (launch-bound), the other dtypes, CUDA graphs at batch 1 (where they
change the most), the batch extremes, ``torch.compile``, and then the rest of the grid. Within a step the
families alternate (CNN, ViT, Swin, BERT, GPT-2, ...). A run stops starting items once ``minutes`` have
passed (an item already started finishes; its time cap is cut to what is left).

Resume. Every row has a ``row_key`` naming the set version, model, input spec, dtype, runtime and device;
``resume=True`` reads the rows already in ``DIR`` and skips them, so a resumed campaign never measures a
row twice. Without ``resume`` an existing campaign directory is refused.

Files in ``DIR`` (each at most ``max_file_mib``, 16 MiB by default):

- ``measurements-NNN.jsonl``: the dataset JSON Lines format (:mod:`dippm_nas.dataset`'s export: a header
  line, then one ``{"type": "measurement", ...}`` record per row with the ``measurements`` table's columns;
  ``graph_hash`` is ``None`` until the graphs are captured). ``config`` holds ``spec`` (the model SPEC
  string), ``input_spec`` (:meth:`InputSpec.to_dict`), ``runtime``, ``set`` and ``set_version``;
  ``environment`` the GPU, driver, CUDA, cuDNN and torch versions and the host CPU; ``conditions`` the
  runtime, the timing and ``deployment``, the :class:`~dippm_nas.Deployment` the row ran under
  (:meth:`Deployment.detect` of the measuring machine with the row's runtime, the TF32 and cuDNN flags in
  force, the settings' autocast and layout, and ``input_copy="none"``: the inputs are on the device before the
  timed region); ``extra`` the memory figures (``torch_max_reserved_mib``, ``torch_max_allocated_mib``, NVML)
  and the timing details;
- ``campaign.json``: the set, its version, the options, the machine (GPU, MIG instances, versions, host CPU),
  the detected deployment, the items planned, measured and left, updated after every row.

Runtimes: ``eager`` (the model as is), ``cuda-graphs`` (the forward captured once in a
``torch.cuda.CUDAGraph`` after three warm-up passes on a side stream, then replayed; CUDA only),
``compiled`` (``torch.compile(model)`` with its defaults; compilation happens in the warm-up, whose time
cap is raised to :data:`COMPILE_TIME_CAP_S`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import platform
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dippm_nas._deprecation import MISSING, renamed_keyword
from dippm_nas._files import check_output, open_regular, write_output
from dippm_nas._json import loads_json, read_json_file
from dippm_nas._numbers import as_int, as_real
from dippm_nas._platform import cpu_model_name
from dippm_nas.deployment import Deployment
from dippm_nas.errors import MeasurementError
from dippm_nas.measure._cpu import CpuMeasurer
from dippm_nas.measure._cuda import CudaMeasurer, parse_device
from dippm_nas.measure._measurement import Measurement, MeasureSettings
from dippm_nas.measure._nvml import NvmlAdapter
from dippm_nas.capture import load_model
from dippm_nas.spec import InputSpec
from dippm_nas.units import BYTES_PER_MIB

__all__ = [
    "CampaignModel", "CampaignItem", "CampaignReport", "VALIDATION_SETS", "DEFAULT_SET", "RUNTIMES",
    "CAMPAIGN_DTYPES", "CAMPAIGN_BATCHES", "CAMPAIGN_SOURCE", "plan_campaign", "run_campaign",
    "campaign_settings", "read_campaign_rows",
]

logger = logging.getLogger(__name__)

#: ``source`` of the campaign's rows.
CAMPAIGN_SOURCE = "gpu-campaign"
#: Runtimes a campaign can measure.
RUNTIMES: tuple[str, ...] = ("eager", "cuda-graphs", "compiled")
#: Dtypes of the default grid.
CAMPAIGN_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
#: Batch sizes of the default grid.
CAMPAIGN_BATCHES: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
#: Time cap of a ``compiled`` item's warm-up and timing, seconds (``torch.compile`` runs in the warm-up).
COMPILE_TIME_CAP_S = 240.0
#: The dataset JSON Lines format the rows are written in (the same constants as ``dippm_nas.dataset``,
#: repeated here because that package needs SQLAlchemy; a test checks they agree).
JSONL_FORMAT = "dippm-nas-dataset-jsonl"
JSONL_SCHEMA_VERSION = 1
_MANIFEST = "campaign.json"
_PART = "measurements-{:03d}.jsonl"


@dataclass(frozen=True)
class CampaignModel:
    """One model of a validation set.

    Attributes:
        name: short label, unique in the set.
        family: ``"cnn"``, ``"vit"``, ``"swin"``, ``"bert"``, ``"gpt2"`` (or ``"smoke"``).
        spec: the model SPEC string (:func:`dippm_nas.capture.load_model`) it is built from.
        inputs: the input spec without batch size and dtype: ``{"shape": [3, 224, 224]}`` or
            ``{"inputs": [{"name", "shape", "dtype", "high"}, ...]}`` (as :meth:`InputSpec.to_dict`).
        max_batch: largest batch size measured.
    """

    name: str
    family: str
    spec: str
    inputs: dict[str, Any]
    max_batch: int = 256

    def input_spec(self, batch_size: int, dtype: str) -> InputSpec:
        """The :class:`InputSpec` at ``batch_size`` and ``dtype``."""
        return InputSpec.from_dict({**self.inputs, "batch_size": batch_size, "dtype": dtype})


def _image(name: str, family: str, spec: str, size: int = 224) -> CampaignModel:
    return CampaignModel(name, family, spec, {"shape": [3, size, size]})


def _tokens(name: str, family: str, spec: str, seq: int, mask: bool) -> CampaignModel:
    inputs = [{"name": "input_ids", "shape": [seq], "dtype": "int64", "high": 30000}]
    if mask:
        inputs.append({"name": "attention_mask", "shape": [seq], "dtype": "int64", "high": 2})
    return CampaignModel(name, family, spec, {"inputs": inputs})


_CM = "dippm_nas.measure.campaign_models"
#: Validation sets by name: ``"v1"`` (the fixed real-GPU set; a change makes a new version) and
#: ``"smoke"`` (two tiny models: a dry run in seconds, on a CPU too).
VALIDATION_SETS: dict[str, tuple[str, tuple[CampaignModel, ...]]] = {
    "v1": ("1", (
        _image("resnet50", "cnn", "torchvision:resnet50"),
        _image("vit_b_16", "vit", "torchvision:vit_b_16"),
        _image("swin_t", "swin", "torchvision:swin_t"),
        _tokens("bert_base_s128", "bert", f"{_CM}:bert_base", 128, mask=True),
        _tokens("gpt2_s256", "gpt2", f"{_CM}:gpt2_small", 256, mask=False),
        _image("mobilenet_v3_large", "cnn", "torchvision:mobilenet_v3_large"),
        _image("deit_small", "vit", "timm:deit_small_patch16_224"),
        _image("swin_tiny_timm", "swin", "timm:swin_tiny_patch4_window7_224"),
        _image("efficientnet_b0", "cnn", "torchvision:efficientnet_b0"),
        _image("vit_small_timm", "vit", "timm:vit_small_patch16_224"),
        _image("convnext_tiny", "cnn", "torchvision:convnext_tiny"),
        _image("densenet121", "cnn", "torchvision:densenet121"),
        _image("regnet_y_800mf", "cnn", "torchvision:regnet_y_800mf"),
        _image("resnet18", "cnn", "torchvision:resnet18"),
        _image("vgg16", "cnn", "torchvision:vgg16"),
        _image("efficientnet_b1_timm", "cnn", "timm:efficientnet_b1"),
        _image("convnext_nano_timm", "cnn", "timm:convnext_nano"),
        _image("resnet26d_timm", "cnn", "timm:resnet26d"),
    )),
    "smoke": ("1", (
        CampaignModel("tiny_cnn", "smoke", f"{_CM}:tiny_cnn", {"shape": [3, 16, 16]}, max_batch=8),
        CampaignModel("tiny_mlp", "smoke", f"{_CM}:tiny_mlp", {"shape": [32]}, max_batch=8),
    )),
}
#: The set a campaign measures unless told otherwise.
DEFAULT_SET = "v1"

#: The grid's steps in the order they are measured: (runtime, dtype, batch); then everything else.
_PRIORITY: tuple[tuple[str, str, int], ...] = (
    ("eager", "float16", 32), ("eager", "float16", 1), ("eager", "float32", 32), ("eager", "bfloat16", 32),
    ("cuda-graphs", "float16", 1), ("eager", "float16", 256), ("eager", "float16", 8),
    ("compiled", "float16", 32), ("eager", "float32", 1), ("cuda-graphs", "float32", 1),
    ("eager", "float16", 64), ("eager", "float32", 256), ("eager", "bfloat16", 1), ("cuda-graphs", "float16", 8),
    ("compiled", "float16", 1), ("eager", "float16", 128),
)


@dataclass(frozen=True)
class CampaignItem:
    """One row to measure: a model at a batch size, dtype and runtime."""

    model: CampaignModel
    batch_size: int
    dtype: str
    runtime: str

    @property
    def spec(self) -> InputSpec:
        return self.model.input_spec(self.batch_size, self.dtype)

    def row_key(self, set_name: str, set_version: str, device_key: str) -> str:
        """The row's key: readable, unique per (set version, model, input, dtype, runtime, device)."""
        ident = json.dumps([set_name, set_version, self.model.spec, self.model.inputs, self.batch_size, self.dtype,
                            self.runtime, device_key], sort_keys=True)
        digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
        return (f"{set_name}-v{set_version}|{self.model.name}|bs{self.batch_size}|{self.dtype}|{self.runtime}|"
                f"{device_key}|{digest}")


def _family_interleaved(models: Sequence[CampaignModel]) -> list[CampaignModel]:
    """Models with the families alternating (round robin in first-seen family order)."""
    fams: OrderedDict[str, list[CampaignModel]] = OrderedDict()
    for m in models:
        fams.setdefault(m.family, []).append(m)
    out: list[CampaignModel] = []
    while any(fams.values()):
        for lst in fams.values():
            if lst:
                out.append(lst.pop(0))
    return out


def plan_campaign(models: Sequence[CampaignModel], *, runtimes: Sequence[str] = RUNTIMES,
                  dtypes: Sequence[str] = CAMPAIGN_DTYPES,
                  batches: Sequence[int] = CAMPAIGN_BATCHES) -> list[CampaignItem]:
    """Every item of the grid, most informative first (see the module docstring).

    Raises:
        MeasurementError: an unknown runtime, a bad dtype or batch size, or no models.
    """
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad:
        raise MeasurementError(f"unknown runtimes {bad}; choices: {list(RUNTIMES)}")
    bad_dt = [d for d in dtypes if d not in CAMPAIGN_DTYPES]
    if bad_dt:
        raise MeasurementError(f"unknown dtypes {bad_dt}; choices: {list(CAMPAIGN_DTYPES)}")
    try:
        batches = [as_int(b, "batch size", low=1, error=MeasurementError) for b in batches]
    except MeasurementError:
        raise MeasurementError(f"batch sizes must be ints >= 1, got {list(batches)}") from None
    if not models:
        raise MeasurementError("a campaign needs at least one model")
    ordered = _family_interleaved(models)
    steps = [s for s in _PRIORITY if s[0] in runtimes and s[1] in dtypes and s[2] in batches]
    steps += [(r, d, b) for r in RUNTIMES if r in runtimes for d in CAMPAIGN_DTYPES if d in dtypes
              for b in sorted(set(batches)) if (r, d, b) not in steps]
    return [CampaignItem(m, b, d, r) for r, d, b in steps for m in ordered if b <= m.max_batch]


@dataclass
class CampaignReport:
    """What :func:`run_campaign` did.

    Attributes:
        out: the campaign directory.
        planned: items of the grid (on this device).
        measured: rows written by this run.
        already: items skipped because an earlier run wrote them.
        left: items not reached before the time ran out.
        skipped: runtimes left out on this device, with the reason.
        by_status: rows of this run per status (``ok``, ``oom``, ``timeout``, ``error``).
        seconds: wall time of this run.
        files: the measurement files of the directory.
    """

    out: str
    planned: int = 0
    measured: int = 0
    already: int = 0
    left: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def campaign_settings(**changes: Any) -> MeasureSettings:
    """The campaign's measurement settings: 5 warm-up forwards, 10-200 timed ones, a 2 % CI target, a 20 s
    cap per item and a 1 s energy window (a row costs a few seconds), with ``changes`` applied."""
    base = dict(warmup=5, min_repeats=10, max_repeats=200, rel_ci_target=0.02, time_cap_s=20.0, energy_window_s=1.0)
    base.update(changes)
    return MeasureSettings(**base)


# ------------------------------------------------------------------------------- files
def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _parts(out: Path) -> list[Path]:
    return sorted(out.glob("measurements-*.jsonl"))


def _read_manifest(path: Path) -> dict[str, Any]:
    """A campaign's ``manifest.json`` (a JSON object).

    Raises:
        MeasurementError: unreadable, not a regular file, not JSON, or not an object.
    """
    manifest = read_json_file(path, "cannot read the campaign manifest", MeasurementError)
    if not isinstance(manifest, dict):
        raise MeasurementError(f"campaign manifest {path} must hold a JSON object, got {type(manifest).__name__}")
    return manifest


def read_campaign_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The measurement records of a campaign directory (or of one of its files), header lines checked.

    Raises:
        MeasurementError: a file that is not in the dataset JSON Lines format.
    """
    p = Path(path)
    files = _parts(p) if p.is_dir() else [p]
    for f in files:
        try:
            yield from _file_rows(f)
        except UnicodeDecodeError as e:
            raise MeasurementError(f"{f}: not UTF-8 text ({e}); a campaign file is JSON Lines") from e


def _file_rows(f: Path) -> Iterator[dict[str, Any]]:
    """The measurement records of one campaign file (a regular file: a FIFO or a device is refused)."""
    with io.TextIOWrapper(open_regular(f, "campaign file", error=MeasurementError), encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = loads_json(line, f"{f}:{lineno}", MeasurementError)
            except MeasurementError as e:
                if lineno > 1 and not line.endswith("\n"):  # a run killed mid-write: the last line is cut
                    logger.warning("%s:%d: an unfinished last line is ignored (%s)", f, lineno, e)
                    continue
                raise
            if lineno == 1:
                if not isinstance(rec, dict) or rec.get("type") != "header" or rec.get("format") != JSONL_FORMAT:
                    raise MeasurementError(f"{f}: not a {JSONL_FORMAT} file (first line {line[:80]!r})")
                continue
            if isinstance(rec, dict) and rec.get("type") == "measurement":
                yield rec


class _Writer:
    """Appends records to ``measurements-NNN.jsonl``, starting a new part before one would pass ``max_bytes``."""

    def __init__(self, out: Path, max_bytes: int, meta: dict[str, Any]) -> None:
        self.out, self.max_bytes, self.meta = out, max_bytes, meta
        parts = _parts(out)
        self.index = len(parts) - 1 if parts else 0
        self.path = parts[-1] if parts else out / _PART.format(0)
        if not self.path.exists():
            self._header()

    def _header(self) -> None:
        line = json.dumps({"type": "header", "format": JSONL_FORMAT, "schema_version": JSONL_SCHEMA_VERSION,
                           "meta": self.meta}) + "\n"
        write_output(self.path, line, "campaign part", error=MeasurementError)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        check_output(self.path, "campaign part", error=MeasurementError)  # appended to: a regular file, never a FIFO
        if self.path.stat().st_size + len(line.encode()) > self.max_bytes:
            self.index += 1
            self.path = self.out / _PART.format(self.index)
            self._header()
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _write_json(path: Path, obj: Any) -> None:
    write_output(path, json.dumps(obj, indent=1, default=str), "campaign file", error=MeasurementError)


# ------------------------------------------------------------------------------- the machine
def _device_facts(device: str) -> dict[str, Any]:
    """What the campaign records about the machine once: device name, versions, host CPU, MIG instances."""
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                             "cpu_model": cpu_model_name(), "platform": platform.platform(), "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = int(device.split(":")[1]) if ":" in device else 0
        props = torch.cuda.get_device_properties(idx)
        facts.update(gpu_name=props.name, gpu_memory_mib=props.total_memory / BYTES_PER_MIB, cuda=torch.version.cuda,
                     cudnn=torch.backends.cudnn.version(), compute_capability=list(torch.cuda.get_device_capability(idx)))
        facts.update(_nvml_facts())
    return facts


def _nvml_facts() -> dict[str, Any]:
    """Driver version and the MIG instances of every GPU NVML sees ({} with a note when NVML is missing)."""
    nvml = NvmlAdapter()
    try:
        nvml.init()
    except MeasurementError as e:
        return {"nvml": f"unavailable: {e}"}
    try:
        gpus = []
        for i in range(nvml.device_count()):
            h = nvml.handle_by_index(i)
            g: dict[str, Any] = {"index": i, "name": nvml.name(h), "uuid": nvml.uuid(h)}
            try:
                g["mig_enabled"] = nvml.mig_enabled(h)
                if g["mig_enabled"]:
                    g["mig_instances"] = [{"uuid": nvml.uuid(m), "name": nvml.name(m)}
                                          for m in nvml.mig_device_handles(h)]
            except MeasurementError as e:
                g["mig_enabled"] = f"unknown: {e}"
            gpus.append(g)
        return {"driver": nvml.driver_version(), "nvml_gpus": gpus}
    finally:
        nvml.shutdown()


def _device_key(facts: dict[str, Any]) -> str:
    name = facts.get("gpu_name") or facts.get("cpu_model") or "unknown"
    return "".join(c if c.isalnum() else "-" for c in str(name).lower()).strip("-")


# ------------------------------------------------------------------------------- the run
def _row_deployment(machine: Deployment, item: CampaignItem, settings: MeasureSettings, m: Measurement) -> Deployment:
    """The deployment a row ran under: the machine's, with the row's runtime, the TF32 and cuDNN flags the
    measurement recorded in force (else those the settings set), the settings' autocast (``"none"`` where they set
    none) and layout, and no input copy in the timed region."""
    flags = m.environment.get("flags") or {}
    tf32_matmul, tf32_conv, bench = machine.tf32_matmul, machine.tf32_conv, settings.cudnn_benchmark
    if settings.tf32 is not None:
        tf32_matmul = tf32_conv = settings.tf32
    if flags:
        tf32_matmul, tf32_conv = bool(flags["matmul_allow_tf32"]), bool(flags["cudnn_allow_tf32"])
        bench = bool(flags["cudnn_benchmark"])
    return dataclasses.replace(machine, runtime=item.runtime, tf32_matmul=tf32_matmul, tf32_conv=tf32_conv,
                               cudnn_benchmark=bench, autocast=settings.autocast or "none",
                               channels_last=settings.channels_last, input_copy="none")


def _row(item: CampaignItem, m: Measurement, key: str, set_name: str, set_version: str, device_key: str,
         facts: dict[str, Any], deployment: Deployment) -> dict[str, Any]:
    """A ``measurements`` record of the dataset JSON Lines format."""
    env = dict(m.environment)
    env.setdefault("host_cpu", facts.get("cpu_model"))
    for k in ("driver", "cuda", "cudnn", "gpu_name"):
        if k in facts:
            env.setdefault(k, facts[k])
    return {
        "type": "measurement", "source": CAMPAIGN_SOURCE, "row_key": key, "job_id": None, "graph_hash": None,
        "space": item.model.family,
        "config": {"spec": item.model.spec, "name": item.model.name, "input_spec": item.spec.to_dict(),
                   "runtime": item.runtime, "set": set_name, "set_version": set_version},
        "batch_size": item.batch_size, "dtype": item.dtype, "device": device_key,
        "latency_ms": m.latency_ms, "latency_ms_std": m.latency_ms_std, "latency_ms_median": m.latency_ms_median,
        "latency_ms_ci95": m.latency_ms_ci95, "energy_j": m.energy_j, "energy_source": m.energy_source,
        "energy_reason": m.energy_reason, "memory_mib": m.memory_mib, "memory_source": m.memory_source,
        "n_repeats": m.n_repeats, "stop_reason": m.stop_reason, "status": m.status, "reason": m.reason,
        "environment": env,
        "conditions": {"runtime": item.runtime, "weights": f"random, cast to {item.dtype} (model.half()-style)",
                       "timing": ("CUDA events around each forward" if m.device.startswith("cuda")
                                  else "time.perf_counter around each forward"),
                       "measured_device": m.device, "deployment": deployment.to_dict()},
        "extra": {"memory_parts_mib": dict(m.memory_parts_mib), "details": dict(m.details)},
        "measured_at": m.timestamp, "created_at": _utc_now(),
    }


def _failed(item: CampaignItem, device: str, status: str, reason: str) -> Measurement:
    return Measurement(latency_ms=None, latency_ms_std=None, energy_j=None, memory_mib=None, memory_source=None,
                       n_repeats=0, device=device, environment={}, status=status, reason=reason,
                       batch_size=item.batch_size, dtype=item.dtype)


def run_campaign(
    out: str | Path,
    *,
    minutes: float = 25.0,
    resume: bool = False,
    torch_device: str = "cuda",
    set_name: str = DEFAULT_SET,
    models: Sequence[CampaignModel] | None = None,
    runtimes: Sequence[str] = RUNTIMES,
    dtypes: Sequence[str] = CAMPAIGN_DTYPES,
    batches: Sequence[int] = CAMPAIGN_BATCHES,
    settings: MeasureSettings | None = None,
    max_file_mib: float = 16.0,
    measurer: Any = None,
    progress: Callable[[int, int, CampaignItem, Measurement], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    device: Any = MISSING,
    deployment: Deployment | None = None,
) -> CampaignReport:
    """Measure a validation set, most informative rows first, for at most ``minutes``; resumable.

    Args:
        out: the campaign directory (created).
        minutes: wall-time budget; no item starts after it (> 0).
        resume: continue the campaign in ``out``, skipping the rows it holds; without it an ``out`` that
            holds measurements is refused.
        torch_device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (the CPU measurer; ``cuda-graphs`` is left out).
        set_name: a key of :data:`VALIDATION_SETS`.
        models: measure these instead of the set's models (their rows still name ``set_name``).
        runtimes, dtypes, batches: the grid (see :func:`plan_campaign`).
        settings: measurement settings (default :func:`campaign_settings`; one torch thread on a CPU).
        max_file_mib: size limit of each measurement file.
        measurer: an object with ``measure(model, spec) -> Measurement`` to use instead of the CPU /
            CUDA measurer (tests).
        progress: called after each row with ``(done, todo, item, measurement)``.
        clock: seconds clock of the budget.
        device: deprecated name of ``torch_device`` (a :class:`DeprecationWarning`; removed in 0.2).
        deployment: the deployment of this machine the rows record (with each row's runtime and flags);
            default :meth:`Deployment.detect` (this torch's flags and versions, the host microbenchmark).

    Returns:
        A :class:`CampaignReport`.

    Raises:
        MeasurementError: bad arguments, an existing campaign without ``resume``, a campaign of another
            set or device in ``out``, or CUDA asked for without CUDA.
    """
    device = renamed_keyword("run_campaign", "device", "torch_device", device, torch_device, "cuda", removed_in="0.2")
    t0 = clock()
    campaign = _Campaign(out, set_name, models, device, own_measurer=measurer is None, minutes=minutes,
                         max_file_mib=max_file_mib, runtimes=runtimes, dtypes=dtypes, batches=batches)
    todo = campaign.prepare(resume, settings, deployment)
    return campaign.run(todo, measurer, progress, clock, t0)


class _Campaign:
    """One run of :func:`run_campaign`: the checked arguments and the plan (``__init__``), the directory, the
    manifest and the rows left to measure (:meth:`prepare`), then the measuring loop (:meth:`run`)."""

    def __init__(self, out: str | Path, set_name: str, models: Sequence[CampaignModel] | None, device: str, *,
                 own_measurer: bool, minutes: float, max_file_mib: float, runtimes: Sequence[str],
                 dtypes: Sequence[str], batches: Sequence[int]) -> None:
        import torch

        if set_name not in VALIDATION_SETS:
            raise MeasurementError(f"unknown validation set {set_name!r}; choices: {sorted(VALIDATION_SETS)}")
        self.minutes = as_real(minutes, "minutes", low=0, low_inclusive=False, error=MeasurementError)
        self.max_file_mib = as_real(max_file_mib, "max_file_mib", low=0, low_inclusive=False, error=MeasurementError)
        self.kind, index = parse_device(device)
        self.device = "cpu" if self.kind == "cpu" else f"cuda:{index}"
        if self.kind == "cuda" and own_measurer and not torch.cuda.is_available():
            raise MeasurementError("device 'cuda' was asked for but torch.cuda.is_available() is False; run the "
                                   "campaign on a GPU machine, or with --torch-device cpu for a dry run")
        self.set_name = set_name
        self.set_version, set_models = VALIDATION_SETS[set_name]
        self.chosen = tuple(models) if models is not None else set_models
        self.report = CampaignReport(out=str(out))
        self.runtimes = list(runtimes)
        if self.kind == "cpu" and "cuda-graphs" in self.runtimes:
            self.runtimes.remove("cuda-graphs")
            self.report.skipped["cuda-graphs"] = "CUDA graphs need a CUDA device"
        self.dtypes, self.batches = list(dtypes), list(batches)
        self.items = plan_campaign(self.chosen, runtimes=self.runtimes, dtypes=dtypes, batches=batches)
        self.out_dir = Path(out)
        self.manifest_path = self.out_dir / _MANIFEST

    def prepare(self, resume: bool, settings: MeasureSettings | None,
                deployment: Deployment | None) -> list[tuple[CampaignItem, str]]:
        """Open the directory (see :func:`_done_keys`), start the manifest and the writer; the items and row
        keys not measured yet, in plan order."""
        done_keys = _done_keys(self.out_dir, resume, self.set_name, self.set_version)
        self.done_before = len(done_keys)
        self.facts = _device_facts(self.device)
        self.dkey = _device_key(self.facts)
        self.machine = deployment if deployment is not None else Deployment.detect()
        self.settings = settings if settings is not None else campaign_settings(
            threads=1 if self.kind == "cpu" else None)
        manifest: dict[str, Any] = {
            "set": self.set_name, "set_version": self.set_version, "source": CAMPAIGN_SOURCE,
            "device_key": self.dkey, "machine": self.facts, "deployment": self.machine.to_dict(),
            "options": {"minutes": self.minutes, "device": self.device, "runtimes": self.runtimes,
                        "dtypes": self.dtypes, "batches": self.batches, "settings": self.settings.to_dict()},
            "models": [dataclasses.asdict(m) for m in self.chosen], "started_at": _utc_now(),
        }
        if self.manifest_path.exists():
            manifest["runs"] = _read_manifest(self.manifest_path).get("runs", [])
        manifest.setdefault("runs", []).append({"started_at": manifest["started_at"], "device": self.device})
        self.manifest = manifest
        self.writer = _Writer(self.out_dir, int(self.max_file_mib * BYTES_PER_MIB), {
            "created_by": "dippm-nas gpu-campaign", "set": self.set_name, "set_version": self.set_version})
        keyed = [(it, it.row_key(self.set_name, self.set_version, self.dkey)) for it in self.items]
        todo = [(it, k) for it, k in keyed if k not in done_keys]
        self.report.planned, self.report.already = len(self.items), len(self.items) - len(todo)
        return todo

    def run(self, todo: list[tuple[CampaignItem, str]], measurer: Any,
            progress: Callable[[int, int, CampaignItem, Measurement], None] | None,
            clock: Callable[[], float], t0: float) -> CampaignReport:
        """Measure ``todo`` in order until the budget (``minutes`` since ``t0``) is spent; the report."""
        report, s = self.report, self.settings
        own_measurer = measurer is None
        if own_measurer:
            measurer = CpuMeasurer(s) if self.kind == "cpu" else CudaMeasurer(s, torch_device=self.device)
        cache: OrderedDict[str, Any] = OrderedDict()
        budget_s = 60.0 * float(self.minutes)
        try:
            for n, (item, key) in enumerate(todo):
                left_s = budget_s - (clock() - t0)
                if left_s <= 0:
                    report.left = len(todo) - n
                    break
                m = _measure_one(item, measurer, s, self.device, cache, left_s)
                self.writer.write(_row(item, m, key, self.set_name, self.set_version, self.dkey, self.facts,
                                       _row_deployment(self.machine, item, s, m)))
                report.measured += 1
                report.by_status[m.status] = report.by_status.get(m.status, 0) + 1
                self._save_manifest()
                if progress is not None:
                    progress(n + 1, len(todo), item, m)
        finally:
            if own_measurer and hasattr(measurer, "close"):
                measurer.close()
        self._save_manifest(left_rows=report.left, skipped_runtimes=report.skipped)
        report.seconds = clock() - t0
        report.files = [str(p) for p in _parts(self.out_dir)]
        return report

    def _save_manifest(self, **more: Any) -> None:
        self.manifest.update(measured_rows=self.done_before + self.report.measured, planned_rows=len(self.items),
                             updated_at=_utc_now(), **more)
        _write_json(self.manifest_path, self.manifest)


def _done_keys(out_dir: Path, resume: bool, set_name: str, set_version: str) -> set[str]:
    """Create the campaign directory; the row keys it holds (a resumed campaign of the same set), else none.

    Raises:
        MeasurementError: the directory cannot be created, holds a campaign and ``resume`` is off, or holds a
            campaign of another set or set version.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MeasurementError(f"the campaign directory {str(out_dir)!r} cannot be created: {e.strerror or e}") from e
    manifest_path = out_dir / _MANIFEST
    if not (_parts(out_dir) or manifest_path.exists()):
        return set()
    if not resume:
        raise MeasurementError(f"{out_dir} already holds a campaign; pass resume=True (--resume) to continue "
                               "it, or choose another directory")
    old = _read_manifest(manifest_path) if manifest_path.exists() else {}
    if old and (old.get("set") != set_name or old.get("set_version") != set_version):
        raise MeasurementError(f"{out_dir} holds a campaign of set {old.get('set')!r} v{old.get('set_version')}, "
                               f"not {set_name!r} v{set_version}; use another directory")
    return {r["row_key"] for r in read_campaign_rows(out_dir)}


def _measure_one(item: CampaignItem, measurer: Any, settings: MeasureSettings, device: str,
                 cache: OrderedDict[str, Any], left_s: float) -> Measurement:
    """Build (or reuse) the model and measure it; a model that cannot be built is an ``error`` row."""
    model = cache.get(item.model.spec)
    if model is None:
        try:
            model = load_model(item.model.spec)
        except Exception as e:  # noqa: BLE001 - a missing package or builder error is this row's result
            return _failed(item, device, "error", f"the model could not be built: {type(e).__name__}: {e}")
        cache[item.model.spec] = model
        while len(cache) > 4:
            cache.popitem(last=False)
    cache.move_to_end(item.model.spec)
    cap = COMPILE_TIME_CAP_S if item.runtime == "compiled" else settings.time_cap_s
    s = dataclasses.replace(settings, time_cap_s=max(1.0, min(cap, left_s)))
    if hasattr(measurer, "settings"):
        measurer.settings = s
    if item.runtime == "eager":
        return measurer.measure(model, item.spec)
    from dippm_nas.measure._runtime import RuntimeModule  # an nn.Module: torch loads with a measurement

    return measurer.measure(RuntimeModule(model, item.runtime), item.spec)
