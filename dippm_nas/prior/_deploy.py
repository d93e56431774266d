"""A :class:`~dippm_nas.deployment.Deployment` as the prior's settings: :func:`deployment_settings`.

The prior computes one timeline per set of concrete settings (runtime, host profile, TF32 flags, layout,
autocast, input copy). A deployment leaves some of them undescribed (``None``); for those the prior takes the
centre of what real servers run (:data:`UNKNOWN_TF32`, :data:`UNKNOWN_INPUT_COPY`, :data:`UNKNOWN_HOST` with
the deployment's framework when only that is known) and :attr:`DeploymentSettings.assumed` lists them; the
spread of those settings is the deployment σ (:func:`~dippm_nas.prior.deployment_spread`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from dippm_nas.deployment import INPUT_COPIES, Deployment, ResolvedDeployment, row_deployment
from dippm_nas.devices import HostProfile, default_host_profile
from dippm_nas.errors import InvalidTypeError, InvalidValueError
from dippm_nas.prior._host import Execution, check_runtime

__all__ = ["DeploymentSettings", "deployment_settings", "execution_settings", "row_settings", "input_copy_kind", "UNKNOWN_TF32", "UNKNOWN_INPUT_COPY",
           "UNKNOWN_HOST", "UNKNOWN_HOST_CLOCK_GHZ", "UNKNOWN_HOST_SIGMA_LOG", "UNKNOWN_FRAMEWORK_WEIGHTS",
           "UNKNOWN_INPUT_COPY_WEIGHTS", "PAGEABLE_FRESH_WEIGHT", "UNKNOWN_AUTOCAST_WEIGHTS"]

#: ``(tf32_matmul, tf32_conv)`` the point estimate assumes when neither the flags nor the framework are known:
#: PyTorch's defaults since 1.12 (``torch.backends.cuda.matmul.allow_tf32 = False``,
#: ``torch.backends.cudnn.allow_tf32 = True``).
UNKNOWN_TF32: tuple[bool, bool] = (False, True)
#: What the point estimate assumes when a deployment does not say whether the timed region holds the input's
#: host-to-device copy: none (a latency of the forward pass on an input already on the GPU).
UNKNOWN_INPUT_COPY = "none"
#: Median clock of an undescribed host, GHz: sqrt(2.25 x 3.4), the AMD EPYC 7742 of a DGX A100 (AMD product page:
#: 2.25 GHz base, 3.4 GHz max boost), the most common A100 server, between its base and boost clocks (one
#: dispatch thread of a busy server runs between them).
UNKNOWN_HOST_CLOCK_GHZ = math.sqrt(2.25 * 3.4)
#: Log-space σ of an undescribed host's speed: ln(3.5 / 2.0) / (2 x 1.645), the 2.0-3.5 GHz of the hosts of
#: A100/H100 servers and cloud instances (vendor specifications of their Xeon and EPYC CPUs) as the 5th-95th
#: percentile.
UNKNOWN_HOST_SIGMA_LOG = math.log(3.5 / 2.0) / (2 * 1.6448536269514722)
#: The host a prediction is centred on when the deployment does not describe one (PyTorch 2.x unless the
#: deployment names the framework).
UNKNOWN_HOST = HostProfile.from_clock(
    UNKNOWN_HOST_CLOCK_GHZ, framework="torch-2", name="undescribed-host",
    source="median of undescribed hosts: AMD EPYC 7742 of a DGX A100 between 2.25 GHz base and 3.4 GHz boost "
           "(AMD product page); spread 2.0-3.5 GHz (cloud A100/H100 hosts) in the σ",
)
#: Weights of the framework generations of an undescribed deployment: PyTorch 1.x and 2.x both run on A100
#: servers; no public survey weighs them, so equally.
UNKNOWN_FRAMEWORK_WEIGHTS: dict[str, float] = {"torch-1": 0.5, "torch-2": 0.5}
#: Weights of the input copy of an undescribed deployment: no public survey of how latencies are timed; half the
#: weight to a timed region without the copy, the other half split between the two kinds of copy.
UNKNOWN_INPUT_COPY_WEIGHTS: dict[str, float] = {"none": 0.5, "pageable": 0.25, "pinned": 0.25}
#: Weights of a half-precision graph's forms when a deployment does not say whether autocast runs: ``"none"``, the
#: model converted to the graph's dtype (``model.half()``: every kernel in it, no casts), and ``"autocast"``,
#: ``torch.autocast`` at the graph's dtype over float32 weights (casts, float32 softmax and norms). The released
#: half-precision rows hold both: autocast in three sources (timm's AMP benchmark and HW-GPT-Bench, every
#: transformer row; Accel-NASBench's CNNs), ``.half()`` in one (ryujaehun's CNNs); four sources and no survey do not
#: weigh them, so equally. A float32 graph left undescribed runs without autocast (its dtype says so): no weight
#: applies.
UNKNOWN_AUTOCAST_WEIGHTS: dict[str, float] = {"none": 0.5, "autocast": 0.5}
#: Share of pageable copies whose batch the process maps fresh (a DataLoader worker's batch in shared memory,
#: each page touched first by the copy) rather than memory it already touched (its own tensor, a ``.half()`` of a
#: batch): a pageable copy, described or not, is a mixture of the two, the fresh one's first-touch time per page
#: log-normal around the measured :attr:`~dippm_nas.prior.HostModel.h2d_fresh_page_us` with its leave-one-host-out
#: σ. No survey weighs how batches reach a timed loop, so equally.
PAGEABLE_FRESH_WEIGHT = 0.5


@dataclass(frozen=True)
class DeploymentSettings:
    """The concrete settings one prior estimate is made for.

    Attributes:
        runtime: ``"eager"``, ``"cuda-graphs"`` or ``"compiled"``.
        host: the host profile (:data:`UNKNOWN_HOST` with the deployment's framework where the host is unknown).
        tf32_matmul, tf32_conv: FP32 matmuls / convolutions may run on TF32 tensor cores.
        channels_last: activations in NHWC.
        autocast: ``None`` (no autocast), ``"float16"`` or ``"bfloat16"``; an undescribed autocast is ``None``
            here (the centre: the graph in its own dtype) with ``"autocast"`` in :attr:`assumed`.
        input_copy: ``"none"``, ``"pageable"`` or ``"pinned"``.
        assumed: the deployment's settings that were not described (``"host"``, ``"framework"``, ``"tf32"``,
            ``"input_copy"``, ``"autocast"``) and took the centre values above.
        tf32_requested: the deployment set a TF32 flag on itself (not a framework default), which a GPU
            without TF32 tensor cores ignores (flagged ``details["tf32_unsupported"]``).
        from_process: the undescribed settings taken from the running process's torch (``"framework"``,
            ``"tf32"``; :attr:`~dippm_nas.deployment.ResolvedDeployment.from_process`); no σ spans them.
        process_torch: that torch's version, ``None`` when nothing was taken from it.
        torch_version: the torch version the deployment runs
            (:attr:`~dippm_nas.deployment.ResolvedDeployment.torch_version`), ``None`` when unknown; it decides
            the dtype of the SDPA math path (:func:`~dippm_nas.prior.math_path_float32`).
        label: :attr:`~dippm_nas.deployment.ResolvedDeployment.label` of the deployment these settings resolve
            (``labels["deployment"]`` of a prediction), made once here; ``""`` for settings built by hand.
        deployment: the :class:`~dippm_nas.Deployment` these settings resolve (``None`` for settings built by hand
            or from a resolved deployment); its :attr:`~dippm_nas.Deployment.key` names the adaptation a
            prediction for it reads. Neither ``label`` nor ``deployment`` takes part in equality.
    """

    runtime: str = "eager"
    host: HostProfile = dataclasses.field(default_factory=default_host_profile)
    tf32_matmul: bool = UNKNOWN_TF32[0]
    tf32_conv: bool = UNKNOWN_TF32[1]
    channels_last: bool = False
    autocast: str | None = None
    input_copy: str = UNKNOWN_INPUT_COPY
    assumed: tuple[str, ...] = ()
    tf32_requested: bool = False
    from_process: tuple[str, ...] = ()
    process_torch: str | None = None
    torch_version: str | None = None
    label: str = dataclasses.field(default="", compare=False)
    deployment: Deployment | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def assumed_label(self) -> str:
        """The assumed settings joined by commas (``""`` when everything is described)."""
        return ",".join(self.assumed)

    @property
    def spread_open(self) -> bool:
        """Something a σ spans is open: an undescribed setting, or a pageable copy (whose batch may be mapped
        fresh or not: :data:`PAGEABLE_FRESH_WEIGHT`)."""
        return bool(self.assumed) or self.input_copy == "pageable"

    @property
    def from_process_label(self) -> str:
        """The settings taken from the running process and the torch version they were read from, e.g.
        ``"framework,tf32 (torch 2.13.0)"``; ``""`` when none."""
        return f"{','.join(self.from_process)} (torch {self.process_torch})" if self.from_process else ""


def input_copy_kind(input_copy: Any) -> str:
    """``"none"``, ``"pageable"`` or ``"pinned"`` from a bool (``True``: a copy from pageable memory, what
    ``x.to("cuda")`` of an ordinary tensor does) or one of those names.

    Raises:
        InvalidValueError: another value (the choices are listed).
    """
    if isinstance(input_copy, bool):
        return "pageable" if input_copy else "none"
    if isinstance(input_copy, str) and input_copy in INPUT_COPIES:
        return input_copy
    raise InvalidValueError(f"input_copy must be true, false or one of {INPUT_COPIES}, got {input_copy!r}")


def deployment_settings(deployment: Deployment | ResolvedDeployment | DeploymentSettings) -> DeploymentSettings:
    """The prior's settings of a deployment: its described settings, the centre values for the others. A
    :class:`DeploymentSettings` is returned as it is; a :class:`~dippm_nas.Deployment` is resolved here once
    (:meth:`~dippm_nas.Deployment.resolve`), and the settings keep it and its label.

    Raises:
        ExecutionRuntimeError: a runtime the graph prior does not model (``"serving"``).
        InvalidTypeError: not a deployment.
    """
    if isinstance(deployment, DeploymentSettings):
        return deployment
    requested = False
    described: Deployment | None = None
    if isinstance(deployment, Deployment):
        requested = bool(deployment.tf32_matmul) or bool(deployment.tf32_conv)
        described, deployment = deployment, deployment.resolve()
    if not isinstance(deployment, ResolvedDeployment):
        raise InvalidTypeError(f"deployment must be a dippm_nas.Deployment, got {type(deployment).__name__}")
    r = deployment
    runtime = check_runtime(r.runtime)
    host = r.host
    if host is None:
        host = UNKNOWN_HOST
        if r.framework is not None and host.framework != r.framework:
            host = dataclasses.replace(host, framework=r.framework)
    matmul = UNKNOWN_TF32[0] if r.tf32_matmul is None else r.tf32_matmul
    conv = UNKNOWN_TF32[1] if r.tf32_conv is None else r.tf32_conv
    return DeploymentSettings(runtime=runtime, host=host, tf32_matmul=matmul, tf32_conv=conv,
                              channels_last=r.channels_last,
                              autocast=None if r.autocast in (None, "none") else r.autocast,
                              input_copy=UNKNOWN_INPUT_COPY if r.input_copy is None else r.input_copy,
                              assumed=r.assumed, tf32_requested=requested, from_process=r.from_process,
                              process_torch=r.process_torch, torch_version=r.torch_version, label=r.label,
                              deployment=described)


def execution_settings(execution: "Execution | DeploymentSettings | None") -> DeploymentSettings | None:
    """The prior's settings of an :class:`~dippm_nas.prior.Execution` (deprecated; a measured row's runtime, host and
    input copy; PyTorch's defaults for the rest: TF32 on convolutions only, NCHW, no autocast), what ``estimate(...,
    deployment=)`` takes in place of the deprecated ``execution=``; :class:`DeploymentSettings` as they are;
    ``None`` for ``None``.

    Raises:
        InvalidTypeError: neither an :class:`~dippm_nas.prior.Execution`, :class:`DeploymentSettings` nor ``None``.
    """
    if execution is None or isinstance(execution, DeploymentSettings):
        return execution
    if not isinstance(execution, Execution):
        raise InvalidTypeError(f"execution must be a dippm_nas.prior.Execution, dippm_nas.prior.DeploymentSettings "
                               f"or None, got {type(execution).__name__}")
    return DeploymentSettings(runtime=execution.runtime, host=execution.host,
                              input_copy=input_copy_kind(execution.input_copy))


def row_settings(conditions: Mapping[str, Any] | None,
                 environment: Mapping[str, Any] | None = None) -> DeploymentSettings:
    """The prior's settings of a measured dataset row, what training, the fits and the accuracy benchmarks
    estimate it under: the runtime, host and input copy of the row's :func:`~dippm_nas.deployment.row_deployment`
    (the one mapping of a row's recorded conditions; a host the row does not record takes the default host
    profile with the row's framework, else the profile's own; a copy from pinned or pageable memory is
    ``"pageable"``) and its torch version (``versions["torch"]``, ``None`` where not recorded), PyTorch's defaults
    for the rest (TF32 on convolutions only, NCHW, no autocast).

    Raises:
        ExecutionRuntimeError: the row records a runtime outside :data:`~dippm_nas.prior.RUNTIMES`.
        InvalidValueError: malformed conditions (as :func:`~dippm_nas.deployment.row_deployment`).
    """
    dep = row_deployment(conditions, environment)
    base = default_host_profile()
    host = dep.host if isinstance(dep.host, HostProfile) else dataclasses.replace(
        base, framework=dep.framework or base.framework)
    return DeploymentSettings(runtime=check_runtime(dep.runtime), host=host,
                              input_copy=input_copy_kind(dep.input_copy not in (None, "none")),
                              torch_version=(dep.versions or {}).get("torch"))
