"""How inference really runs: :class:`Deployment`.

A model's latency on a GPU depends on more than the graph and the board: the execution runtime (PyTorch
eager, a CUDA-graph replay, ``torch.compile``, or an LLM serving engine), the host CPU and framework
generation that dispatch each operator, whether FP32 GEMMs and convolutions may run on TF32 tensor cores,
autocast, whether the timed region holds the input's host-to-device copy, the memory layout and cuDNN's
autotuner. A :class:`Deployment` names each of these; a field left ``None`` is *not described*, and the
predictor widens σ for it instead of assuming one fast answer (:meth:`Deployment.resolve` says what is known
and :attr:`ResolvedDeployment.assumed` what is not).

PyTorch's defaults where a field is ``None`` and the framework generation is known (PyTorch documentation,
"TensorFloat-32 (TF32) on Ampere (and later) devices", ``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``):

======================  ==================  =================
torch version           ``tf32_matmul``     ``tf32_conv``
======================  ==================  =================
< 1.7                   off (no TF32)       off (no TF32)
1.7 - 1.11              on                  on
>= 1.12 (``torch-2``)   off                 on
======================  ==================  =================

``"torch-1"`` without a version means 1.7-1.11 (the PyTorch 1.x releases of the Ampere years).

A framework that is not described (neither ``framework`` nor ``versions["torch"]``) is the **running
process's**: the torch this Python runs (read as :meth:`Deployment.detect` reads it, :func:`running_torch`), the
best evidence of what a search's models run on; the TF32 flags that are not described are that process's
(``torch.backends.cuda.matmul.allow_tf32`` / ``torch.backends.cudnn.allow_tf32`` where torch is imported, the
version's defaults otherwise). :attr:`ResolvedDeployment.from_process` names the fields taken so and
:attr:`ResolvedDeployment.process_torch` the version; a prediction records them in
``labels["deployment_from_process"]``. Without torch installed both stay unknown (assumed, σ over both
generations).
``cudnn_benchmark`` defaults to off (``torch.backends.cudnn.benchmark = False``).

``autocast`` left ``None`` is not described (``"none"`` says there is no autocast): a float32 graph is priced
without autocast (its dtype is the evidence: autocast of a float32 model would be said), a float16 / bfloat16
graph as a mixture of ``model.half()`` and ``torch.autocast`` at the graph's dtype (weights
:data:`dippm_nas.prior.UNKNOWN_AUTOCAST_WEIGHTS`), and :attr:`ResolvedDeployment.assumed` names ``"autocast"``.
A deployment file of format 1 with ``"autocast": null`` is read so too (format 1 meant no autocast by it).

Deployments are JSON or TOML files (:meth:`Deployment.save`, :meth:`Deployment.load`), never pickle; unknown
keys are refused. :meth:`Deployment.detect` reads them off the server that drives the GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import math
import re
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dippm_nas._files import write_output
from dippm_nas._json import canonical_json, check_keys, read_json_file
from dippm_nas._toml import read_toml_file
from dippm_nas.devices import (FRAMEWORKS, HostProfile, default_host_profile, load_host_profile, measure_host_profile,
                               resolve_host_profile)
from dippm_nas.errors import DeploymentError, DippmNasError, ExecutionRuntimeError

__all__ = [
    "Deployment", "ResolvedDeployment", "DEPLOYMENT_RUNTIMES", "GRAPH_RUNTIMES", "AUTOCAST_DTYPES",
    "INPUT_COPIES", "tf32_defaults", "running_torch", "RunningTorch", "row_deployment",
]

#: Runtimes of a forward pass the graph predictors model.
GRAPH_RUNTIMES: tuple[str, ...] = ("eager", "cuda-graphs", "compiled")
#: Every runtime a deployment may name: the graph runtimes and ``"serving"`` (an LLM serving engine of the
#: vLLM / TensorRT-LLM class: paged and flash attention, fused kernels, CUDA graphs for decode), which only
#: :func:`dippm_nas.llm.predict_generation` models.
DEPLOYMENT_RUNTIMES: tuple[str, ...] = (*GRAPH_RUNTIMES, "serving")
#: The dtypes ``autocast`` may name (besides ``"none"``, no autocast, and ``None``, not described).
AUTOCAST_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
#: Every described ``autocast``: no autocast, or one of :data:`AUTOCAST_DTYPES`.
_AUTOCASTS: tuple[str, ...] = ("none", *AUTOCAST_DTYPES)
#: ``input_copy`` choices besides ``None`` (not described): no copy in the timed region, a copy from pageable
#: memory (``x.to("cuda")`` of an ordinary tensor), a copy from pinned memory.
INPUT_COPIES: tuple[str, ...] = ("none", "pageable", "pinned")
#: The deployment file format written: 2, where ``autocast: null`` is not described and ``"none"`` is no autocast.
#: Format 1 (``autocast: null`` meant no autocast) is still read, its null as not described. The format is part of
#: :attr:`Deployment.key`, so nothing stored under a format-1 key (an adaptation) is read for a deployment now.
_FORMAT = 2
_FORMATS = (1, 2)
_BOOL_FIELDS = ("tf32_matmul", "tf32_conv", "cudnn_benchmark")
#: The longest ``versions`` name or value, characters ("2.3.1+cu121" has 11).
MAX_VERSION_CHARS = 128
#: Digits of a version's major or minor number that are read as a number.
_MAX_MAJOR_DIGITS = 6
#: The largest deployment file read, bytes (one :meth:`Deployment.save` writes is under 1 KB).
MAX_DEPLOYMENT_FILE_BYTES = 1 << 20


def tf32_defaults(framework: str | None, torch_version: str | None = None) -> tuple[bool | None, bool | None]:
    """PyTorch's default ``(tf32_matmul, tf32_conv)`` for a framework generation or a torch version.

    Args:
        framework: ``"torch-1"``, ``"torch-2"`` or ``None`` (unknown).
        torch_version: a torch version string (``"1.10.0+cu113"``); it decides over ``framework`` when given.

    Returns:
        ``(None, None)`` when neither is known.
    """
    if torch_version:
        parts = str(torch_version).split("+")[0].split(".")
        major = minor = -1
        if all(p.isascii() and p.isdigit() and len(p) <= _MAX_MAJOR_DIGITS for p in parts[:2]):
            major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
        if major >= 0:
            if (major, minor) < (1, 7):
                return False, False
            if (major, minor) < (1, 12):
                return True, True
            return False, True
    if framework == "torch-1":
        return True, True
    if framework == "torch-2":
        return False, True
    return None, None


@dataclass(frozen=True)
class RunningTorch:
    """The torch of the running process: its version and, where torch is imported, its TF32 flags.

    Attributes:
        version: the version without its local tag (``"2.13.0"``).
        framework: ``"torch-1"`` or ``"torch-2"``.
        tf32_matmul, tf32_conv: ``torch.backends.cuda.matmul.allow_tf32`` / ``torch.backends.cudnn.allow_tf32``
            of the process (where torch is imported), else the version's defaults.
    """

    version: str
    framework: str
    tf32_matmul: bool
    tf32_conv: bool


def running_torch() -> RunningTorch | None:
    """The torch of the running process (``None`` when torch is not installed or its version unreadable).

    The version is that of the imported module where torch is imported, else the installed distribution's
    (nothing is imported); the TF32 flags are the imported module's, else the version's defaults
    (:func:`tf32_defaults`).
    """
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", None) if torch is not None else _installed_torch_version()
    if not isinstance(version, str) or _framework_of(version) is None:
        return None
    version = str(version).split("+")[0]
    matmul, conv = tf32_defaults(None, version)
    try:
        if torch is not None:
            matmul = bool(torch.backends.cuda.matmul.allow_tf32)
            conv = bool(torch.backends.cudnn.allow_tf32)
    except (AttributeError, RuntimeError):  # a partly imported or stripped torch: the version's defaults
        pass
    return RunningTorch(version=version, framework=_framework_of(version),  # type: ignore[arg-type]
                        tf32_matmul=bool(matmul), tf32_conv=bool(conv))


@functools.lru_cache(maxsize=1)
def _installed_torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _framework_of(version: str) -> str | None:
    head = str(version).strip().split(".")[0]
    if not (head.isascii() and head.isdigit()) or len(head) > _MAX_MAJOR_DIGITS:  # "²".isdigit() is true
        return None
    return "torch-1" if int(head) < 2 else "torch-2"


@dataclass(frozen=True)
class ResolvedDeployment:
    """A :class:`Deployment` with PyTorch's defaults filled in where the framework decides them.

    Attributes:
        runtime: one of :data:`DEPLOYMENT_RUNTIMES`.
        host: the host profile, ``None`` when not described (its framework is :attr:`framework` when known).
        framework: ``"torch-1"``, ``"torch-2"`` or ``None``.
        tf32_matmul, tf32_conv: whether FP32 matmuls / convolutions may use TF32; ``None`` when unknown.
        autocast: ``"none"``, ``"float16"`` or ``"bfloat16"``; ``None`` when unknown.
        input_copy: one of :data:`INPUT_COPIES`, ``None`` when unknown.
        channels_last: the model and input are in channels-last layout.
        cudnn_benchmark: cuDNN's autotuner is on.
        assumed: the settings that were not described and that a prediction has to assume (``"host"``,
            ``"framework"``, ``"tf32"``, ``"input_copy"``, ``"autocast"``), in this order; a setting taken from the
            running process is not among them.
        from_process: the settings that were not described and were taken from the running process's torch
            (``"framework"``, ``"tf32"``; :func:`running_torch`), in this order.
        process_torch: that torch's version where anything was taken from it, else ``None``.
        torch_version: the torch version the deployment runs: ``versions["torch"]`` where described, else the
            running process's where the framework was taken from it, else ``None`` (a framework or host profile
            named without a version). What depends on the minor version reads it (the SDPA math path's dtype,
            :func:`dippm_nas.prior.math_path_float32`).
    """

    runtime: str
    host: HostProfile | None
    framework: str | None
    tf32_matmul: bool | None
    tf32_conv: bool | None
    autocast: str | None
    input_copy: str | None
    channels_last: bool
    cudnn_benchmark: bool
    assumed: tuple[str, ...]
    from_process: tuple[str, ...] = ()
    process_torch: str | None = None
    torch_version: str | None = None

    @property
    def label(self) -> str:
        """A short text of these settings (what ``labels["deployment"]`` of a prediction holds), e.g. ``"eager, host
        unknown, framework torch-2, tf32 matmul off conv on, input copy unknown"``."""
        r = self
        framework = r.framework or "unknown"
        if "framework" in r.from_process:
            framework += f" (running process, torch {r.process_torch})"
        parts = [r.runtime, f"host {r.host.name} (x{r.host.speed:.3g})" if r.host is not None else "host unknown",
                 f"framework {framework}"]
        if r.tf32_matmul is None or r.tf32_conv is None:
            parts.append("tf32 unknown")
        elif r.tf32_matmul == r.tf32_conv:
            parts.append(f"tf32 {'on' if r.tf32_matmul else 'off'}")
        else:
            parts.append(f"tf32 matmul {'on' if r.tf32_matmul else 'off'} conv {'on' if r.tf32_conv else 'off'}")
        if r.autocast is None:
            parts.append("autocast unknown")
        elif r.autocast != "none":
            parts.append(f"autocast {r.autocast}")
        parts.append("input copy unknown" if r.input_copy is None else f"input copy {r.input_copy}")
        parts += [name for name in ("channels_last", "cudnn_benchmark") if getattr(r, name)]
        return ", ".join(parts)


@dataclass(frozen=True)
class Deployment:
    """How inference runs; ``None`` = not described (the prediction assumes it and widens σ).

    Attributes:
        runtime: ``"eager"`` (PyTorch eager, default), ``"cuda-graphs"``, ``"compiled"`` (``torch.compile``) or
            ``"serving"`` (an LLM serving engine; :func:`dippm_nas.llm.predict_generation` only).
        host: the CPU and framework that drive the GPU: a :class:`~dippm_nas.devices.HostProfile`, the path of
            a profile file (``dippm-nas deployment --out`` / ``host-profile --out``; read at construction), or
            ``None`` (unknown: σ spans the hosts of real GPU servers).
        framework: ``"torch-1"`` or ``"torch-2"``; sets the host model's generation and the TF32 defaults.
            When ``None``, taken from ``versions["torch"]`` if given.
        tf32_matmul: ``torch.backends.cuda.matmul.allow_tf32``; ``None``: the framework's default.
        tf32_conv: ``torch.backends.cudnn.allow_tf32``; ``None``: the framework's default.
        autocast: ``"float16"`` or ``"bfloat16"``: ``torch.autocast`` around the forward (matmul, convolution
            and linear in the low dtype; softmax, layer norm, reductions, exp/log in float32; casts as kernels),
            unlike ``model.half()``; ``"none"``: no autocast (the model runs in its own dtype); ``None``: not
            described (a half-precision graph is priced as a mixture of ``model.half()`` and autocast, a float32
            graph without autocast).
        input_copy: ``"none"``, ``"pageable"`` or ``"pinned"``: the timed region holds ``x.to("cuda")`` from
            pageable or pinned memory; ``None``: unknown.
        channels_last: the model and input use ``torch.channels_last``.
        cudnn_benchmark: ``torch.backends.cudnn.benchmark``; ``None``: PyTorch's default (off).
        versions: optional version strings, e.g. ``{"torch": "2.3.1", "cuda": "12.1", "cudnn": "8902"}``.

    Raises:
        DeploymentError: an unknown choice, a wrong type or an unreadable host file (the message names the
            field, the value and the choices).
    """

    runtime: str = "eager"
    host: HostProfile | str | Path | None = None
    framework: str | None = None
    tf32_matmul: bool | None = None
    tf32_conv: bool | None = None
    autocast: str | None = None
    input_copy: str | None = None
    channels_last: bool = False
    cudnn_benchmark: bool | None = None
    versions: Mapping[str, str] | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "Deployment":
        fields = list(cls.__dataclass_fields__)
        unknown = {k: v for k, v in kwargs.items() if k not in cls.__dataclass_fields__}
        if unknown:
            got = ", ".join(f"{k}={v!r}"[:80] for k, v in sorted(unknown.items(), key=lambda kv: str(kv[0])))
            raise DeploymentError(f"Deployment has no field {got}; fields: {fields}")
        if len(args) > len(fields):
            raise DeploymentError(f"Deployment takes at most {len(fields)} positional fields {fields}, got {len(args)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if not isinstance(self.runtime, str) or self.runtime not in DEPLOYMENT_RUNTIMES:
            raise DeploymentError(f"Deployment.runtime must be one of {DEPLOYMENT_RUNTIMES}, got {self.runtime!r}")
        host = self.host
        if isinstance(host, (str, Path)) and not isinstance(host, bool):
            if not str(host).strip():
                raise DeploymentError("Deployment.host must be a HostProfile, the path of a host profile file "
                                      "or None (unknown), got an empty string")
            try:
                host = load_host_profile(host)
            except DippmNasError as e:
                raise DeploymentError(f"Deployment.host: {e}") from e
            object.__setattr__(self, "host", host)
        elif host is not None and not isinstance(host, HostProfile):
            raise DeploymentError(f"Deployment.host must be a HostProfile, the path of a host profile file or None "
                                  f"(unknown), got {type(host).__name__}")
        if self.framework is not None and self.framework not in FRAMEWORKS:
            raise DeploymentError(f"Deployment.framework must be one of {FRAMEWORKS} or None, got {self.framework!r}")
        for name in _BOOL_FIELDS:
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise DeploymentError(f"Deployment.{name} must be true, false or None (PyTorch's default), got {v!r}")
        if not isinstance(self.channels_last, bool):
            raise DeploymentError(f"Deployment.channels_last must be true or false, got {self.channels_last!r}")
        if self.autocast is not None and self.autocast not in _AUTOCASTS:
            raise DeploymentError(f"Deployment.autocast must be None (not described) or one of {_AUTOCASTS}, "
                                  f"got {self.autocast!r}")
        if self.input_copy is not None and self.input_copy not in INPUT_COPIES:
            raise DeploymentError(f"Deployment.input_copy must be None or one of {INPUT_COPIES}, "
                                  f"got {self.input_copy!r}")
        if self.versions is not None:
            object.__setattr__(self, "versions", types.MappingProxyType(_checked_versions(self.versions)))
        if isinstance(self.host, HostProfile):
            _check_text(self.host.to_dict(), "Deployment.host")

    def __hash__(self) -> int:
        return hash(self.key)

    # -- what is known ---------------------------------------------------------------------------------------

    def resolve(self) -> ResolvedDeployment:
        """The effective settings: PyTorch's defaults where the framework (or torch version) decides them, the
        host profile carrying the deployment's framework, and the list of what is still assumed."""
        torch_v = (self.versions or {}).get("torch")
        framework = self.framework or (_framework_of(torch_v) if torch_v else None)
        host = self.host
        from_process: list[str] = []
        proc = running_torch() if framework is None and not isinstance(host, HostProfile) else None
        d_matmul, d_conv = tf32_defaults(framework, torch_v)
        if proc is not None:  # the undescribed framework is the running process's, and so are its TF32 flags
            framework, d_matmul, d_conv = proc.framework, proc.tf32_matmul, proc.tf32_conv
            from_process.append("framework")
        if isinstance(host, HostProfile) and framework is not None and host.framework != framework:
            host = dataclasses.replace(host, framework=framework)
        tf32_matmul = self.tf32_matmul if self.tf32_matmul is not None else d_matmul
        tf32_conv = self.tf32_conv if self.tf32_conv is not None else d_conv
        if proc is not None and (self.tf32_matmul is None or self.tf32_conv is None):
            from_process.append("tf32")
        assumed = []
        if host is None:
            assumed.append("host")
        if framework is None:
            assumed.append("framework")
        if tf32_matmul is None or tf32_conv is None:
            assumed.append("tf32")
        if self.input_copy is None:
            assumed.append("input_copy")
        if self.autocast is None:
            assumed.append("autocast")
        return ResolvedDeployment(
            runtime=self.runtime, host=host, framework=framework,  # type: ignore[arg-type]
            tf32_matmul=tf32_matmul, tf32_conv=tf32_conv, autocast=self.autocast, input_copy=self.input_copy,
            channels_last=self.channels_last, cudnn_benchmark=bool(self.cudnn_benchmark), assumed=tuple(assumed),
            from_process=tuple(from_process), process_torch=proc.version if proc is not None else None,
            torch_version=torch_v if torch_v else proc.version if proc is not None else None,
        )

    @property
    def label(self) -> str:
        """A short text of the effective settings (what ``labels["deployment"]`` of a prediction holds), e.g. ``"eager, host
        unknown, framework torch-2, tf32 matmul off conv on, input copy unknown"``: :attr:`ResolvedDeployment.label`
        of :meth:`resolve`; :attr:`key` names the deployment exactly."""
        return self.resolve().label

    @property
    def key(self) -> str:
        """A stable text naming this deployment (part of the prediction cache key and of a stored adaptation's
        key): canonical JSON of :meth:`to_dict`, whose ``format`` (2) keeps a key written under format 1, where
        ``autocast: null`` meant no autocast, from naming a deployment whose autocast is not described."""
        return canonical_json(self.to_dict())

    @classmethod
    def coerce(cls, value: Any = None, *, runtime: str | None = None, host: Any = None,
               runtimes: tuple[str, ...] = GRAPH_RUNTIMES) -> "Deployment":
        """The deployment a caller means: ``value`` with the ``runtime=`` / ``host=`` keywords folded in.

        Args:
            value: a :class:`Deployment`, a mapping of its fields (:meth:`from_dict`), the path of a JSON or TOML
                deployment file (:meth:`load`), or ``None`` (nothing described but ``runtime`` and ``host``).
            runtime: the ``runtime=`` keyword of an entry point (``None``: not given).
            host: the ``host=`` keyword: a :class:`~dippm_nas.devices.HostProfile`, a profile file, ``"default"``
                (the default datacenter profile) or ``None`` (not given); its framework describes the
                deployment's where that is ``None``.
            runtimes: the runtimes the caller models: :data:`GRAPH_RUNTIMES` (default; the graph predictors of
                :func:`dippm_nas.predict`) or :data:`DEPLOYMENT_RUNTIMES`.

        Raises:
            DeploymentError: ``value`` of another type, a field breaking its rule, an unreadable file, a runtime
                outside ``runtimes``, or a ``runtime`` / ``host`` keyword that conflicts with what ``value``
                describes (give one of them).
            ExecutionRuntimeError: a ``runtime`` keyword outside ``runtimes`` (the choices are listed).
            DeviceError: a ``host`` keyword that cannot be read as a host profile.
        """
        if value is None:
            dep = cls()
        elif isinstance(value, Deployment):
            dep = value
        elif isinstance(value, Mapping):
            dep = cls.from_dict(value, origin="deployment")
        elif isinstance(value, (str, Path)) and not isinstance(value, bool):
            if not str(value).strip():
                raise DeploymentError("deployment must be a Deployment, a mapping of its fields or the path of a "
                                      "JSON/TOML deployment file, got an empty string")
            dep = cls.load(value)
        else:
            raise DeploymentError(f"deployment must be a Deployment, a mapping of its fields, the path of a JSON/TOML "
                                  f"deployment file or None, got {type(value).__name__}: {value!r}")
        if runtime is not None:
            if not isinstance(runtime, str) or runtime not in runtimes:
                got = repr(runtime) if isinstance(runtime, str) else f"{type(runtime).__name__} {runtime!r}"
                raise ExecutionRuntimeError(f"runtime must be one of {runtimes}, got {got}")
            if value is not None and dep.runtime != runtime:
                raise DeploymentError(f"runtime={runtime!r} conflicts with the deployment's runtime {dep.runtime!r}; "
                                      "give the runtime in the deployment only")
            dep = dataclasses.replace(dep, runtime=runtime)
        if dep.runtime not in runtimes:
            raise DeploymentError(f"Deployment.runtime must be one of {runtimes} here, got {dep.runtime!r}"
                                  + (" (an LLM serving engine: dippm_nas.llm.predict_generation)"
                                     if dep.runtime == "serving" else ""))
        if host is not None:
            prof = resolve_host_profile(host)
            if dep.host is not None and dep.host != prof:
                raise DeploymentError(f"host={prof.name!r} conflicts with the deployment's host {dep.host.name!r}; "
                                      "give the host in the deployment only")
            # a host profile names its PyTorch generation: it describes the framework the deployment leaves open
            dep = dataclasses.replace(dep, host=prof, framework=dep.framework or prof.framework)
        return dep

    # -- files ------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the host as its profile's dict), what :meth:`from_dict` reads."""
        host = self.host.to_dict() if isinstance(self.host, HostProfile) else None
        return {
            "format": _FORMAT, "runtime": self.runtime, "host": host, "framework": self.framework,
            "tf32_matmul": self.tf32_matmul, "tf32_conv": self.tf32_conv, "autocast": self.autocast,
            "input_copy": self.input_copy, "channels_last": self.channels_last,
            "cudnn_benchmark": self.cudnn_benchmark,
            "versions": dict(self.versions) if self.versions is not None else None,
        }

    @classmethod
    def from_dict(cls, d: Any, *, origin: str = "<dict>") -> "Deployment":
        """Inverse of :meth:`to_dict`; missing keys take their defaults, ``format`` may be left out.

        Raises:
            DeploymentError: not a mapping, another format, unknown keys, or a field breaking its rule.
        """
        if not isinstance(d, Mapping):
            raise DeploymentError(f"{origin}: a deployment must be an object, got {type(d).__name__}")
        fields = dict(d)
        fmt = fields.pop("format", _FORMAT)
        if isinstance(fmt, bool) or fmt not in _FORMATS:
            raise DeploymentError(f"{origin}: deployment format must be one of {_FORMATS}, got {fmt!r}")
        check_keys(fields, cls.__dataclass_fields__, origin, what="deployment", error=DeploymentError)
        host = fields.get("host")
        if isinstance(host, Mapping):
            try:
                fields["host"] = HostProfile.from_dict(dict(host), origin=f"{origin}: host")
            except DippmNasError as e:
                raise DeploymentError(str(e)) from e
        for name, v in fields.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise DeploymentError(f"{origin}: Deployment.{name} must be finite, got {v!r}")
        try:
            return cls(**fields)
        except DeploymentError as e:
            raise DeploymentError(f"{origin}: {e}") from e

    def save(self, path: str | Path) -> Path:
        """Write the deployment to ``path``: TOML when it ends in ``.toml``, JSON otherwise; :meth:`load` reads
        back an equal deployment. The file is written to a temporary file renamed into place
        (:func:`dippm_nas._files.write_output`).

        Returns:
            The path written.

        Raises:
            DeploymentError: ``path`` is a directory, a FIFO, a device (``/dev/full``), a dangling symbolic link
                or in a missing directory, or the write fails (a full disk); the old file is left as it was.
        """
        if not isinstance(path, (str, Path)) or not str(path).strip():
            raise DeploymentError(f"Deployment.save: path must be a non-empty str or Path, got {path!r}")
        p = Path(path)
        text = _to_toml(self.to_dict()) if p.suffix.lower() == ".toml" else json.dumps(self.to_dict(), indent=1) + "\n"
        write_output(p, text, "deployment file", error=DeploymentError)
        return p

    @classmethod
    def load(cls, path: str | Path) -> "Deployment":
        """Read a deployment file written by :meth:`save` or ``dippm-nas deployment --out`` (JSON or TOML).

        Both formats are read as :func:`dippm_nas._json.read_json_file` reads JSON: a regular file (a FIFO or
        a device is refused, never waited on) of at most :data:`MAX_DEPLOYMENT_FILE_BYTES`, nested at most
        :data:`~dippm_nas._json.MAX_JSON_DEPTH` levels.

        Raises:
            DeploymentError: an unreadable file, not a regular file, too large or too deeply nested, bad syntax,
                unknown keys or a field breaking its rule.
        """
        p = Path(path)
        what = f"cannot read deployment {str(p)!r}"
        if p.suffix.lower() == ".toml":
            data: Any = read_toml_file(p, what, DeploymentError, max_bytes=MAX_DEPLOYMENT_FILE_BYTES)
        else:
            data = read_json_file(p, what, DeploymentError, max_bytes=MAX_DEPLOYMENT_FILE_BYTES)
        return cls.from_dict(data, origin=str(p))

    # -- this machine -----------------------------------------------------------------------------------------

    @classmethod
    def detect(cls, *, runtime: str = "eager", measure_host: bool = True) -> "Deployment":
        """The deployment of this machine's PyTorch: its TF32 and cuDNN-autotuner flags, the torch / CUDA /
        cuDNN versions and (``measure_host``) the host microbenchmark (about a second). Run it on the server
        that drives the GPU; ``autocast`` and ``input_copy`` are properties of a script, not of the machine,
        and stay as given (``None``: not described).

        """
        import torch

        versions = {"torch": str(torch.__version__).split("+")[0]}
        if getattr(torch.version, "cuda", None):
            versions["cuda"] = str(torch.version.cuda)
        try:
            cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        except (RuntimeError, AttributeError):  # a CPU build without cuDNN
            cudnn = None
        if cudnn:
            versions["cudnn"] = str(cudnn)
        host = measure_host_profile() if measure_host else None
        return cls(
            runtime=runtime, host=host, framework=_framework_of(versions["torch"]),
            tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32), tf32_conv=bool(torch.backends.cudnn.allow_tf32),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark), versions=versions,
        )


def _unwritable_char(text: str) -> str | None:
    """The first character of ``text`` that a UTF-8 file cannot hold (a lone surrogate), else ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return text[e.start]
    return None


def _check_text(d: Mapping[str, Any], where: str) -> None:
    """Every string of a (one-level) dict is text a UTF-8 file can hold."""
    for k, v in d.items():
        if isinstance(v, str) and _unwritable_char(v) is not None:
            raise DeploymentError(f"{where}.{k} must be text a UTF-8 file can hold, got {v!r} (a lone surrogate "
                                  f"{_unwritable_char(v)!r})")


def _checked_versions(versions: Any) -> dict[str, str]:
    """``versions`` sorted by name, each name and value a string of 1..MAX_VERSION_CHARS characters that a
    UTF-8 file can hold; ``versions["torch"]`` starting with a major number."""
    if not isinstance(versions, Mapping):
        raise DeploymentError(f"Deployment.versions must be a mapping of names to version strings or None, "
                              f"got {type(versions).__name__}")
    bad = {k: v for k, v in versions.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise DeploymentError(f"Deployment.versions must map names to version strings, got {bad!r}")
    for k, v in versions.items():
        for what, text in (("name", k), ("value", v)):
            if not 1 <= len(text) <= MAX_VERSION_CHARS or _unwritable_char(text) is not None:
                shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text):,} characters)"
                raise DeploymentError(f"Deployment.versions: each {what} must be 1 to {MAX_VERSION_CHARS} characters "
                                      f"of text a UTF-8 file can hold (no lone surrogates), got {shown!r}")
    torch_v = versions.get("torch")
    if torch_v is not None and _framework_of(torch_v) is None:
        shown = torch_v if len(torch_v) <= 40 else f"{torch_v[:40]}..."
        raise DeploymentError(f"Deployment.versions['torch'] must look like '2.3.1' (an ASCII major number of at "
                              f"most {_MAX_MAJOR_DIGITS} digits first), got {shown!r}")
    return dict(sorted(versions.items()))


#: TOML basic-string escapes of the characters that must be escaped (TOML 1.0, "String").
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str) -> str:
    """A TOML basic string holding ``text``: quote, backslash and control characters (U+0000-U+001F, U+007F)
    escaped, everything else as it is."""
    out = []
    for ch in text:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # finite (checked): "1e+16", "0.1"... are TOML floats
    return _toml_string(str(v))


def _to_toml(d: Mapping[str, Any]) -> str:
    """TOML of a deployment's dict: scalars first, then the ``host`` and ``versions`` tables, every key a quoted
    string (a version name may hold any character); ``None`` left out (TOML has no null; a missing key is
    ``None`` on reading)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if v is not None and not isinstance(v, Mapping)]
    for name, table in d.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{name}]"]
            lines += [f"{_toml_string(k)} = {_toml_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"


#: ``torch.compile`` backends a row's ``torch_compile`` condition (timm's benchmark files) names for a compiled run.
_COMPILED_TAGS = ("dynamo", "inductor", "true")
#: A torch version written in a row's ``framework`` text (Accel-NASBench: ``"PyTorch 1.12.0, torchvision 0.13.0"``).
_PYTORCH_TEXT = re.compile(r"pytorch\s+(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)


def row_deployment(conditions: Mapping[str, Any] | None, environment: Mapping[str, Any] | None = None, *,
                   dtype: str | None = None) -> Deployment:
    """The :class:`Deployment` a measured dataset row records: the one mapping of a row's conditions that training,
    the fits (:func:`dippm_nas.prior.row_settings` reads it) and the accuracy benchmarks use.

    Read from ``conditions`` (what the importers of :mod:`dippm_nas.dataset` write): ``runtime`` (or timm's
    ``torch_compile``: ``dynamo`` / ``inductor`` / ``true`` -> ``"compiled"``, else ``"eager"``), ``framework``
    (``"torch-1"`` / ``"torch-2"``, or a text naming ``PyTorch X.Y.Z``, which gives ``versions["torch"]``), timm's
    ``torch_version_tag`` (``pt240`` -> torch 2.4.0; a torch version also names the framework), ``input_copy`` (true: a copy from pageable memory; one of
    :data:`INPUT_COPIES`; not recorded: ``"none"``, a forward pass on an input already on the GPU, how the imported
    sources time it), ``autocast`` (a dtype name, or true: the row's ``dtype``; not recorded: ``"none"``, the model
    run in the row's dtype, as the imported sources without an autocast condition ran it), ``memory_layout == "nhwc"`` or
    ``channels_last``, ``cudnn_benchmark``; from ``environment``: ``host_clock_ghz`` (the host, its framework the
    row's, else the default profile's), ``cuda`` and ``cudnn`` versions. What a row does not record stays
    undescribed (``None``).

    Raises:
        DeploymentError: conditions or environment that are not mappings, or a recorded value outside its field's
            choices (the field and the choices are named).
    """
    for name, value in (("conditions", conditions), ("environment", environment)):
        if value is not None and not isinstance(value, Mapping):
            raise DeploymentError(f"a row's {name} must be a mapping (the JSON object the dataset stores) or None, "
                                  f"got {type(value).__name__}")
    c = dict(conditions or {})
    env = dict(environment or {})
    runtime = c.get("runtime")
    if runtime is None:
        runtime = "compiled" if str(c.get("torch_compile", "")).lower() in _COMPILED_TAGS else "eager"
    recorded = c.get("framework")
    framework = recorded if recorded in FRAMEWORKS else None
    versions: dict[str, str] = {}
    text = _PYTORCH_TEXT.search(recorded) if isinstance(recorded, str) and framework is None else None
    tag = str(c.get("torch_version_tag") or "")
    if text is not None:
        versions["torch"] = text.group(1)
    elif tag.startswith("pt") and tag[2:3].isdigit():
        version = _torch_version_of_tag(tag)
        if version is not None:
            versions["torch"] = version
        elif framework is None:
            framework = "torch-1" if tag[2] == "1" else "torch-2"
    if framework is None and "torch" in versions:
        framework = _framework_of(versions["torch"])
    for name in ("cuda", "cudnn"):
        if env.get(name):
            versions[name] = str(env[name])
    clock = env.get("host_clock_ghz")
    host = None
    if isinstance(clock, (int, float)) and not isinstance(clock, bool) and math.isfinite(clock) and clock > 0:
        host = HostProfile.from_clock(float(clock), framework=framework or default_host_profile().framework)
    copy = c.get("input_copy")
    autocast = c.get("autocast")
    return Deployment(
        runtime=str(runtime), host=host, framework=framework, input_copy=(
            "none" if copy is None or copy is False else "pageable" if copy is True else copy),
        autocast=dtype if autocast is True else (autocast or "none"),
        channels_last=c.get("memory_layout") == "nhwc" or bool(c.get("channels_last")),
        cudnn_benchmark=None if c.get("cudnn_benchmark") is None else bool(c.get("cudnn_benchmark")),
        versions=versions or None)


def _torch_version_of_tag(tag: str) -> str | None:
    """timm's result-file tag of the torch version: ``pt113`` -> ``1.13``, ``pt240`` -> ``2.4.0`` (torch 1.x: the
    minor's digits; 2.x: one digit each for minor and patch); ``None`` otherwise."""
    if not (tag.startswith("pt") and tag[2:].isdigit() and len(tag) >= 4):
        return None
    major, rest = tag[2], tag[3:]
    if major == "1":
        return f"1.{rest}"
    return f"{major}.{rest[0]}.{rest[1:] or 0}" if len(rest) >= 2 else f"{major}.{rest}.0"
