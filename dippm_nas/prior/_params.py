"""Constants of the analytic prior: per-op-class efficiencies and host/GPU overheads.

Two sets exist:

- :meth:`PriorParams.uncalibrated` — the physically motivated starting point: every op class reaches its
  roofline (efficiency 1), kernels cost a small fixed time, overheads are mid-range public figures:
  the prior without any fit.
- the shipped fitted file ``calibration/fitted.json`` (written by ``scripts/fit/calibrate_prior.py``),
  which names the public data it was fitted on and the command that produced it. :func:`default_params`
  loads it once per process; it falls back to the uncalibrated set, with a one-time warning, when the
  file is missing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from dippm_nas._files import write_output
from dippm_nas._json import check_keys, loads_json, read_json_file
from dippm_nas._schema import check_file_fields, file_layout, from_file_data
from dippm_nas.devices import get_device
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.prior._host import HostModel
from dippm_nas.prior._op_table import OpTable

__all__ = ["OpClassParams", "DeviceScale", "PriorParams", "default_params", "PARAM_CLASSES", "CALIBRATION_FORMAT",
           "DEFAULT_SCALE_KEY", "GEFORCE_SCALE_KEY", "default_scale_entries"]

logger = logging.getLogger(__name__)

#: Version of the calibration JSON layout.
CALIBRATION_FORMAT = 1

#: Op classes with their own constants. ``conv_depthwise`` is a pseudo-class for grouped convolutions
#: with few input channels per group, which run on CUDA cores and are memory-bound.
PARAM_CLASSES: tuple[str, ...] = (
    "conv", "conv_depthwise", "matmul", "attention", "elementwise", "activation", "normalization", "pool",
    "reduction", "softmax", "memory", "gather", "cast", "unknown",
)

CONTRACTION_CLASSES = frozenset({"conv", "matmul", "attention"})


@dataclass(frozen=True)
class OpClassParams:
    """How one op class turns FLOPs and bytes into time.

    GPU time of a node: ``kernels * kernel_us + max(flops / (peak * eta * wave_eff**wave_exponent *
    tile_eff**tile_exponent * k / (k + k_half)), bytes / (bandwidth * eta_memory))``, where ``wave_eff``
    is the share of SM-time the thread blocks fill over their waves, ``tile_eff`` the share of the
    padded output tiles that holds real outputs, and ``k`` the reduction length of the GEMM (a short
    reduction cannot keep the math pipelines busy); the last three apply to contraction ops only.

    Attributes:
        eta_compute: achieved fraction of the CUDA-core peak at full waves (may exceed 1 where a
            fast algorithm such as Winograd does fewer multiplies than the direct FLOP count).
        eta_compute_tensor: the same on the tensor-core path (half precision, TF32).
        eta_memory: achieved fraction of DRAM bandwidth.
        eta_compute_fp64: where set, the achieved fraction of the FP64 peak of the class's FP64 kernels on CUDA
            cores, without the wave, tile and reduction-length terms (at FP64 rates the math units bound these
            kernels; cuDNN runs no Winograd in FP64); ``None`` prices FP64 kernels with the FP32 constants.
            Fitted on measured FP64 timings (``scripts/fit/calibrate_fp64.py``); a calibration file without the
            key reads as ``None``.
        kernel_us: fixed GPU time per kernel (start-up, tail, tiny-kernel inefficiency), µs.
        wave_exponent: weight of wave quantisation over SMs (0 ignores it, 1 applies it fully).
        tile_exponent: weight of tile quantisation (output padded to whole tiles).
        k_half: reduction length at which a contraction reaches half its efficiency (0: no such effect).
        kernels: kernels launched per op.
        tile_m, tile_n: output tile one thread block computes, for wave quantisation.
    """

    eta_compute: float = 1.0
    eta_compute_tensor: float = 1.0
    eta_memory: float = 1.0
    eta_compute_fp64: float | None = None
    kernel_us: float = 2.0
    wave_exponent: float = 1.0
    tile_exponent: float = 1.0
    k_half: float = 0.0
    kernels: float = 1.0
    tile_m: int = 128
    tile_n: int = 128

    def __post_init__(self) -> None:
        for name in ("eta_compute", "eta_compute_tensor", "eta_memory"):
            v = getattr(self, name)
            if not _finite(v) or not 0 < v <= 4:
                raise InvalidValueError(f"OpClassParams.{name} must be in (0, 4], got {v!r}")
        v = self.eta_compute_fp64
        if v is not None and (not _finite(v) or not 0 < v <= 4):
            raise InvalidValueError(f"OpClassParams.eta_compute_fp64 must be in (0, 4] or None, got {v!r}")
        for name in ("kernel_us", "kernels", "k_half"):
            v = getattr(self, name)
            if not _finite(v) or v < 0:
                raise InvalidValueError(f"OpClassParams.{name} must be a finite number >= 0, got {v!r}")
        for name in ("wave_exponent", "tile_exponent"):
            v = getattr(self, name)
            if not _finite(v) or not 0 <= v <= 1:
                raise InvalidValueError(f"OpClassParams.{name} must be in [0, 1], got {v!r}")
        for name in ("tile_m", "tile_n"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"OpClassParams.{name} must be an int >= 1, got {v!r}")


@dataclass(frozen=True)
class DeviceScale:
    """Multipliers of one device's achieved efficiencies, fitted on whole-model measurements of it.

    Attributes:
        compute: multiplies every op class's ``eta_compute`` / ``eta_compute_tensor`` on the device; on a
            GPU only for tensor-core and half-precision kernels, the regime GPU scales are fitted in
            (FP32 CUDA-core kernels keep the op-level constants, fitted on FP32 A100 operators).
        memory: multiplies every op class's ``eta_memory`` on the device.
        source: the measurements they come from.
        classes: further compute multipliers of some op classes on this device (a CPU's convolution
            and GEMM libraries reach very different shares of its peak); classes not named keep 1.
        dispatch_us: framework time per dispatched op on this device, µs, replacing the device's own
            figure (on the host CPU the microbenchmark times a tiny op; a real layer's dispatch costs
            more); ``None`` keeps the device's figure.
    """

    compute: float = 1.0
    memory: float = 1.0
    source: str = ""
    classes: Mapping[str, float] = field(default_factory=dict)
    dispatch_us: float | None = None

    def __post_init__(self) -> None:
        for name in ("compute", "memory"):
            v = getattr(self, name)
            if not _finite(v) or not 0.05 <= v <= 20:
                raise InvalidValueError(f"DeviceScale.{name} must be in [0.05, 20], got {v!r}")
        unknown = sorted(set(self.classes) - set(PARAM_CLASSES))
        if unknown:
            raise InvalidValueError(f"DeviceScale.classes has unknown op classes {unknown}; choices: "
                                    f"{list(PARAM_CLASSES)}")
        for c, v in self.classes.items():
            if not _finite(v) or not 0.05 <= v <= 20:
                raise InvalidValueError(f"DeviceScale.classes[{c!r}] must be in [0.05, 20], got {v!r}")
        if self.dispatch_us is not None and (not _finite(self.dispatch_us) or not 0 <= self.dispatch_us <= 10_000):
            raise InvalidValueError("DeviceScale.dispatch_us must be None or in [0, 10000] µs, got "
                                    f"{self.dispatch_us!r}")
        object.__setattr__(self, "classes", {str(c): float(v) for c, v in self.classes.items()})

    def class_multiplier(self, op_class: str) -> float:
        """The compute multiplier of ``op_class`` on this device beyond :attr:`compute` (1 when not fitted)."""
        return self.classes.get(op_class, 1.0)


#: Key of :attr:`PriorParams.device_scales` used for devices without their own entry.
DEFAULT_SCALE_KEY = "*"

#: Key of :attr:`PriorParams.device_scales` used, where present, for GeForce GPUs (``Device.geforce``) without
#: their own entry: the default entry with the fitted GeForce GPUs' GEMM rate (:func:`default_scale_entries`). A
#: GeForce board's datasheet tensor peak (FP32 accumulation at half rate) is reached by cuBLAS GEMMs to a larger
#: share than a data-centre board's, so the default of every fitted GPU (which averages in the A100) prices an
#: unfitted GeForce GPU's GEMMs too slow (HW-GPT-Bench's RTX 2080 / 3080, docs/transformer_kernels.md).
GEFORCE_SCALE_KEY = "*geforce"


def default_scale_entries(scales: Mapping[str, DeviceScale], among: Sequence[str], *, note: str = ""
                          ) -> dict[str, DeviceScale]:
    """The default entries of :attr:`PriorParams.device_scales` from the fitted entries of the catalogue GPUs
    ``among``: ``"*"`` the geometric mean of their compute and memory multipliers; ``"*geforce"`` (absent when no
    GeForce GPU, ``Device.geforce``, is among them) the same with a ``matmul`` class multiplier: the GeForce GPUs'
    geometric-mean compute multiplier over the one of ``"*"``, so GEMMs on an unfitted GeForce GPU reach the share
    of its datasheet half-rate tensor peak the fitted GeForce GPUs reach; every other class keeps ``"*"``'s (an
    unfitted GeForce GPU's float16 convolutions are not faster: the RTX 2080 Ti's eager CNNs, ``GEFORCE_SCALE_KEY``).
    ``note`` is added to each entry's source (e.g. which GPU a leave-one-GPU-out left out).

    Raises:
        InvalidValueError: ``among`` is empty, names a default entry or a GPU without an entry in ``scales``.
        DeviceError: a GPU of ``among`` is not in the device catalogue.
    """
    bad = [d for d in among if d.startswith("*") or d not in scales]
    if bad or not among:
        raise InvalidValueError(f"default_scale_entries: every GPU averaged needs a fitted entry of its own; bad: "
                                f"{bad or list(among)}; fitted: {sorted(k for k in scales if not k.startswith('*'))}")
    suffix = f" ({note})" if note else ""

    def gmean(devs: Sequence[str], name: str) -> float:
        return math.exp(sum(math.log(getattr(scales[d], name)) for d in devs) / len(devs))

    star = DeviceScale(compute=gmean(among, "compute"), memory=gmean(among, "memory"),
                       source=f"geometric mean of the fitted devices ({', '.join(among)}){suffix}")
    out = {DEFAULT_SCALE_KEY: star}
    geforce = [d for d in among if get_device(d).geforce]
    if geforce:
        out[GEFORCE_SCALE_KEY] = DeviceScale(
            compute=star.compute, memory=star.memory, classes={"matmul": gmean(geforce, "compute") / star.compute},
            source=f"the default entry with the matmul multiplier of the fitted GeForce devices ({', '.join(geforce)}): "
                   f"their geometric-mean compute multiplier over the default's{suffix}")
    return out


@dataclass(frozen=True)
class PriorParams:
    """All constants of the prior.

    Attributes:
        op_classes: :class:`OpClassParams` per class of :data:`PARAM_CLASSES`.
        host_dispatch_us: framework (PyTorch eager) dispatch per operator on the host, µs. A device's
            own ``host_dispatch_us`` (measured for host-cpu) takes precedence.
        host_launch_us: host time of one kernel launch (``cudaLaunchKernel``), µs.
        host_view_us: host time of a view op (no kernel), µs.
        l2_speedup: bandwidth multiplier for the part of a node's traffic that fits in L2 (1 = no L2 model).
        nchw_transpose_passes: extra passes over a conv's activations when a half-precision
            tensor-core convolution runs on NCHW (contiguous) tensors, which cuDNN transposes to NHWC.
        fuse_hard_activations: price ``hardswish`` / ``hardsigmoid`` as the one element-wise kernel
            PyTorch runs, not as the four / three element-wise nodes (``add 3``, ``clip 0..6``,
            ``divide 6``, ``multiply``) the Relax frontend decomposes them into. A calibration file
            without the key reads as ``False``, the pricing the checkpoints trained on such a file saw;
            everything else (``uncalibrated()``, fits) starts from ``True``. The graph cannot tell
            ``F.hardswish`` from the same formula written by hand (``x * F.relu6(x + 3) / 6``, three
            eager kernels); both are priced as one.
        device_scales: per-device efficiency multipliers ``{device id: DeviceScale}``; the entry
            ``"*"`` applies to devices without one (MIG slice views use their parent's entry), the entry
            ``"*geforce"``, where present, to GeForce GPUs without one (:data:`GEFORCE_SCALE_KEY`).
        source: what the constants were fitted on (or ``"uncalibrated"``).
        command: the command that produced them.
        metrics: the fit's reported figures (MAPE, Kendall tau...), for the record.
        op_tables: per CPU device id, an :class:`~dippm_nas.prior._op_table.OpTable` learnt from operators
            timed in place on that machine; where present it gives the device's per-node times instead of
            the roofline (the constants still give memory).
        sdpa_eta_flash: achieved fraction of the dense half-precision tensor peak of PyTorch's flash attention
            kernel on Ampere (times :data:`~dippm_nas.prior._sdpa.MMA_SYNC_SHARE` on Hopper), at full
            waves, on the work it does (a causal node skips the masked half). ``None`` (a calibration file without
            the key, the checkpoints that pin one) prices attention nodes as every contraction: the class
            constants, the device scale and the whole score matrix (:mod:`~dippm_nas.prior._sdpa`).
        sdpa_eta_efficient: the same for the memory-efficient kernel (sm50+, any mask; Pascal, Volta and Turing
            always get it), of the peak the node's dtype has on the GPU; ``None`` as above.
        resize_loop_ns: time of one iteration of eager PyTorch's serial bilinear / bicubic NCHW resize kernel on a
            GPU (one memory round trip per image and channel in each of its output-pixel threads,
            :mod:`~dippm_nas.prior._resize`), ns. ``None`` (a calibration file without the key, the checkpoints that
            pin one) prices such a resize by its bytes like any element-wise node.
        host_model: per-operator host times of a GPU's driving host by kind and execution runtime, fitted
            on measured eager timings (:class:`~dippm_nas.prior._host.HostModel`); ``None`` (a calibration file
            without one, and the checkpoints that pin such a file) prices every GPU operator at
            ``host_dispatch_us`` + ``host_launch_us`` per kernel in eager mode.
    """

    op_classes: Mapping[str, OpClassParams]
    host_dispatch_us: float = 10.0
    host_launch_us: float = 3.0
    host_view_us: float = 2.0
    l2_speedup: float = 1.0
    nchw_transpose_passes: float = 2.0
    fuse_hard_activations: bool = True
    sdpa_eta_flash: float | None = None
    sdpa_eta_efficient: float | None = None
    resize_loop_ns: float | None = None
    device_scales: Mapping[str, DeviceScale] = field(default_factory=dict)
    source: str = "uncalibrated"
    command: str = ""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    op_tables: Mapping[str, OpTable] = field(default_factory=dict)
    host_model: HostModel | None = None

    def __post_init__(self) -> None:
        missing = [c for c in PARAM_CLASSES if c not in self.op_classes]
        extra = [c for c in self.op_classes if c not in PARAM_CLASSES]
        if missing or extra:
            raise InvalidValueError(
                f"PriorParams.op_classes must have exactly the classes {list(PARAM_CLASSES)}; "
                f"missing {missing}, unknown {extra}"
            )
        for name in ("host_dispatch_us", "host_launch_us", "host_view_us", "nchw_transpose_passes"):
            v = getattr(self, name)
            if not _finite(v) or v < 0:
                raise InvalidValueError(f"PriorParams.{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.fuse_hard_activations, bool):
            raise InvalidValueError(f"PriorParams.fuse_hard_activations must be true or false, got "
                                    f"{self.fuse_hard_activations!r}")
        for name in ("sdpa_eta_flash", "sdpa_eta_efficient"):
            v = getattr(self, name)
            if v is not None and (not _finite(v) or not 0 < v <= 4):
                raise InvalidValueError(f"PriorParams.{name} must be None or in (0, 4], got {v!r}")
        if (self.sdpa_eta_flash is None) != (self.sdpa_eta_efficient is None):
            raise InvalidValueError("PriorParams.sdpa_eta_flash and sdpa_eta_efficient must both be set or both "
                                    f"None, got {self.sdpa_eta_flash!r} and {self.sdpa_eta_efficient!r}")
        if self.resize_loop_ns is not None and (not _finite(self.resize_loop_ns)
                                                or not 0 < self.resize_loop_ns <= 100_000):
            raise InvalidValueError(f"PriorParams.resize_loop_ns must be None or in (0, 100000] ns, got "
                                    f"{self.resize_loop_ns!r}")
        if not _finite(self.l2_speedup) or self.l2_speedup < 1:
            raise InvalidValueError(f"PriorParams.l2_speedup must be >= 1, got {self.l2_speedup!r}")
        object.__setattr__(self, "op_classes", dict(self.op_classes))
        object.__setattr__(self, "device_scales", dict(self.device_scales))
        bad = [k for k, v in self.device_scales.items() if not isinstance(v, DeviceScale)]
        if bad:
            raise InvalidValueError(f"PriorParams.device_scales values must be DeviceScale, wrong for {bad}")
        object.__setattr__(self, "op_tables", dict(self.op_tables))
        bad = [k for k, v in self.op_tables.items() if not isinstance(v, OpTable)]
        if bad:
            raise InvalidValueError(f"PriorParams.op_tables values must be OpTable, wrong for {bad}")
        if self.host_model is not None and not isinstance(self.host_model, HostModel):
            raise InvalidValueError("PriorParams.host_model must be a HostModel or None, got "
                                    f"{type(self.host_model).__name__}")

    def scale_for(self, device_id: str, kind: str = "gpu", *, geforce: bool = False) -> DeviceScale:
        """The efficiency multipliers of a device (a MIG slice view ``<id>.mig-<profile>`` uses ``<id>``).

        The default entries are fitted on GPUs and apply to GPUs only: ``"*geforce"`` to a GeForce GPU
        (``geforce``, the device file's ``Device.geforce``) where the file has it, ``"*"`` to every other; other
        kinds without an entry of their own get no scaling.
        """
        base = device_id.split(".mig-")[0]
        if base in self.device_scales and not base.startswith("*"):
            return self.device_scales[base]
        if kind == "gpu" and geforce and GEFORCE_SCALE_KEY in self.device_scales:
            return self.device_scales[GEFORCE_SCALE_KEY]
        if kind == "gpu" and DEFAULT_SCALE_KEY in self.device_scales:
            return self.device_scales[DEFAULT_SCALE_KEY]
        return DeviceScale()

    def device_fitted(self, device_id: str) -> bool:
        """Whether ``device_id`` (a MIG slice view: its parent) has efficiency multipliers of its own in
        :attr:`device_scales`, fitted on its own measurements; ``False`` for a device that gets a default
        entry, ``"*"`` or ``"*geforce"`` (the prior's kernel σ of such a device is an unseen GPU's,
        :meth:`~dippm_nas.prior.HostModel.sigma_log_gpu`)."""
        base = device_id.split(".mig-")[0]
        return not base.startswith("*") and base in self.device_scales

    @classmethod
    def uncalibrated(cls) -> "PriorParams":
        """The prior without any fit: rooflines at efficiency 1, public mid-range overheads.

        Overheads: PyTorch eager spends ~5-25 µs of CPU time per op before its kernel runs (Python,
        pybind, dispatcher, backend), ``cudaLaunchKernel`` ~1-3 µs on CUDA 12 drivers; 10 µs and 3 µs
        are used. A GPU kernel costs a few µs of start-up and tail even when tiny: 2 µs is used.
        """
        classes = {c: OpClassParams() for c in PARAM_CLASSES}
        for c in PARAM_CLASSES:
            if c not in CONTRACTION_CLASSES:
                classes[c] = dataclasses.replace(classes[c], wave_exponent=0.0, tile_exponent=0.0)
        return cls(op_classes=classes)

    def with_class(self, op_class: str, **changes: Any) -> "PriorParams":
        """A copy with some constants of one class changed."""
        if op_class not in self.op_classes:
            raise InvalidValueError(f"unknown op class {op_class!r}; choices: {list(PARAM_CLASSES)}")
        classes = dict(self.op_classes)
        classes[op_class] = dataclasses.replace(classes[op_class], **changes)
        return dataclasses.replace(self, op_classes=classes)

    # ------------------------------------------------------------ serialise
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CALIBRATION_FORMAT,
            "source": self.source,
            "command": self.command,
            "global": {k: getattr(self, k) for k in _GLOBAL_KEYS},
            "op_classes": {c: dataclasses.asdict(p) for c, p in self.op_classes.items()},
            "devices": {k: dataclasses.asdict(v) for k, v in self.device_scales.items()},
            "metrics": dict(self.metrics),
            **({"op_tables": {k: t.to_dict() for k, t in self.op_tables.items()}} if self.op_tables else {}),
            **({"host_model": self.host_model.to_dict()} if self.host_model is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "<dict>", trusted: bool = False) -> "PriorParams":
        """Inverse of :meth:`to_dict`; classes missing from ``d`` keep their uncalibrated constants.

        Args:
            d: the calibration file's mapping.
            origin: where it came from, for error messages.
            trusted: the shipped file, or a checkpoint's metadata already checked on load: built by the
                dataclasses' own checks alone. Otherwise every section is first checked against the
                dataclasses' fields (:mod:`dippm_nas._schema`).

        Raises:
            DippmNasError: wrong format version, unknown classes or keys, values of the wrong type (the field
                path, the value and the expected type named) or breaking a rule.
        """
        if not trusted:
            _check_file(d, origin)
        if d.get("format") != CALIBRATION_FORMAT:
            raise InvalidValueError(f"{origin}: calibration format must be {CALIBRATION_FORMAT}, got "
                                    f"{d.get('format')!r}")
        base = cls.uncalibrated()
        classes = dict(base.op_classes)
        for name, values in (d.get("op_classes") or {}).items():
            if name not in classes:
                raise InvalidValueError(f"{origin}: unknown op class {name!r}; choices: {list(PARAM_CLASSES)}")
            check_keys(values, OpClassParams.__dataclass_fields__, f"{origin}: op class {name!r}")
            classes[name] = dataclasses.replace(classes[name], **values)
        glob = dict(d.get("global") or {})
        # a file without the key prices every node of a decomposed hard activation (the host checkpoints' prior)
        glob.setdefault("fuse_hard_activations", False)
        check_keys(glob, _GLOBAL_KEYS, origin, what="global")
        scales = {}
        for dev_id, v in (d.get("devices") or {}).items():
            check_keys(v, DeviceScale.__dataclass_fields__, f"{origin}: devices[{dev_id!r}]")
            scales[dev_id] = DeviceScale(**v)
        tables = {dev_id: OpTable.from_dict(t, origin=f"{origin}: op_tables[{dev_id!r}]")
                  for dev_id, t in (d.get("op_tables") or {}).items()}
        host = d.get("host_model")
        host_model = None if host is None else HostModel.from_dict(host, origin=origin)
        return cls(op_classes=classes, source=str(d.get("source", "")), command=str(d.get("command", "")),
                   metrics=dict(d.get("metrics") or {}), device_scales=scales, op_tables=tables,
                   host_model=host_model, **glob)

    def save(self, path: str | Path) -> None:
        """Write as JSON (the format :func:`load` reads), through a temporary file renamed into place
        (:func:`dippm_nas._files.write_output`).

        Raises:
            InvalidValueError: ``path`` is a directory, a FIFO, a device or in a missing directory, or the write
                fails.
        """
        write_output(path, json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n", "prior parameters file",
                     error=InvalidValueError)

    @classmethod
    def load(cls, path: str | Path) -> "PriorParams":
        """Read a calibration JSON file."""
        p = Path(path)
        return cls.from_dict(read_json_file(p, f"cannot read calibration file {p}", InvalidValueError), origin=str(p))


#: The scalar settings :meth:`PriorParams.to_dict` writes under ``"global"``.
_GLOBAL_KEYS = ("host_dispatch_us", "host_launch_us", "host_view_us", "l2_speedup", "nchw_transpose_passes",
                "fuse_hard_activations", "sdpa_eta_flash", "sdpa_eta_efficient", "resize_loop_ns")


@lru_cache(maxsize=1)
def _file_layout() -> type:
    """The layout of a calibration file (:meth:`PriorParams.to_dict`); ``global`` and each ``op_classes``
    entry set some fields of :class:`PriorParams` and :class:`OpClassParams`, checked by :func:`_check_file`."""
    return file_layout("CalibrationFile", {
        "format": int, "source": str, "command": str, "global": dict[str, Any],
        "op_classes": dict[str, dict[str, Any]], "devices": dict[str, DeviceScale], "metrics": dict[str, Any],
        "op_tables": dict[str, dict[str, Any]], "host_model": HostModel | None,
    })


def _check_file(d: Any, origin: str) -> None:
    """Check a calibration file's mapping against its layout and the fields of the dataclasses it sets.

    Raises:
        InvalidValueError: naming ``origin``, the field path, the value and what is expected.
    """
    from_file_data(_file_layout(), d, origin)
    check_file_fields(PriorParams, d.get("global") or {}, _GLOBAL_KEYS, f"{origin}: global")
    op_fields = [f.name for f in dataclasses.fields(OpClassParams)]
    for name, values in (d.get("op_classes") or {}).items():
        check_file_fields(OpClassParams, values, op_fields, f"{origin}: op_classes.{name}")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


FITTED_FILE = "fitted.json"


def read_shipped_file(name: str, what: str, missing: str) -> Any:
    """The JSON value of the shipped file ``dippm_nas/prior/calibration/<name>``; ``None``, with the warning
    ``missing`` (logged and a ``RuntimeWarning``), when the file is absent.

    Raises:
        DippmNasError: the file is not valid JSON (``what`` names it in the message).
    """
    res = resources.files("dippm_nas.prior") / "calibration" / name
    try:
        text = res.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        logger.warning(missing)
        warnings.warn(missing, RuntimeWarning, stacklevel=3)
        return None
    return loads_json(text, f"shipped {what} file {name}", DippmNasError)


@lru_cache(maxsize=1)
def default_params() -> PriorParams:
    """The shipped fitted constants (loaded once per process), else the uncalibrated set with a warning."""
    d = read_shipped_file(FITTED_FILE, "calibration",
                          f"the analytic prior's fitted constants (dippm_nas/prior/calibration/{FITTED_FILE}) are "
                          "missing; using the uncalibrated constants (run scripts/fit/calibrate_prior.py to fit them)")
    if d is None:
        return PriorParams.uncalibrated()
    return PriorParams.from_dict(d, origin=f"dippm_nas/prior/calibration/{FITTED_FILE}", trusted=True)
