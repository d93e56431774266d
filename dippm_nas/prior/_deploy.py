"""A :class:`~dippm_nas.deployment.Deployment` as the prior's settings: :func:`deployment_settings`.

The prior computes one timeline per set of concrete settings (runtime, host profile, TF32 flags, layout,
autocast, input copy). A deployment leaves some of them undescribed (``None``); for those the prior takes the
centre of what real servers run (:data:`UNKNOWN_TF32`, :data:`UNKNOWN_INPUT_COPY`, the default host profile
with the deployment's framework when only that is known) and :attr:`DeploymentSettings.assumed` lists them,
so that the σ can widen for them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dippm_nas.deployment import INPUT_COPIES, Deployment, ResolvedDeployment
from dippm_nas.devices import HostProfile, default_host_profile
from dippm_nas.errors import InvalidTypeError, InvalidValueError
from dippm_nas.prior._host import check_runtime

__all__ = ["DeploymentSettings", "deployment_settings", "input_copy_kind", "UNKNOWN_TF32", "UNKNOWN_INPUT_COPY"]

#: ``(tf32_matmul, tf32_conv)`` the point estimate assumes when neither the flags nor the framework are known:
#: PyTorch's defaults since 1.12 (``torch.backends.cuda.matmul.allow_tf32 = False``,
#: ``torch.backends.cudnn.allow_tf32 = True``).
UNKNOWN_TF32: tuple[bool, bool] = (False, True)
#: What the point estimate assumes when a deployment does not say whether the timed region holds the input's
#: host-to-device copy: none (a latency of the forward pass on an input already on the GPU).
UNKNOWN_INPUT_COPY = "none"


@dataclass(frozen=True)
class DeploymentSettings:
    """The concrete settings one prior estimate is made for.

    Attributes:
        runtime: ``"eager"``, ``"cuda-graphs"`` or ``"compiled"``.
        host: the host profile (the default profile with the deployment's framework where the host is unknown).
        tf32_matmul, tf32_conv: FP32 matmuls / convolutions may run on TF32 tensor cores.
        channels_last: activations in NHWC.
        autocast: ``None``, ``"float16"`` or ``"bfloat16"``.
        input_copy: ``"none"``, ``"pageable"`` or ``"pinned"``.
        assumed: the deployment's settings that were not described (``"host"``, ``"framework"``, ``"tf32"``,
            ``"input_copy"``) and took the centre values above.
    """

    runtime: str = "eager"
    host: HostProfile = dataclasses.field(default_factory=default_host_profile)
    tf32_matmul: bool = UNKNOWN_TF32[0]
    tf32_conv: bool = UNKNOWN_TF32[1]
    channels_last: bool = False
    autocast: str | None = None
    input_copy: str = UNKNOWN_INPUT_COPY
    assumed: tuple[str, ...] = ()

    @property
    def assumed_label(self) -> str:
        """The assumed settings joined by commas (``""`` when everything is described)."""
        return ",".join(self.assumed)


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
    """The prior's settings of a deployment: its described settings, the centre values for the others.

    Raises:
        ExecutionRuntimeError: a runtime the graph prior does not model (``"serving"``).
        InvalidTypeError: not a deployment.
    """
    if isinstance(deployment, DeploymentSettings):
        return deployment
    if isinstance(deployment, Deployment):
        deployment = deployment.resolve()
    if not isinstance(deployment, ResolvedDeployment):
        raise InvalidTypeError(f"deployment must be a dippm_nas.Deployment, got {type(deployment).__name__}")
    r = deployment
    runtime = check_runtime(r.runtime)
    host = r.host
    if host is None:
        host = default_host_profile()
        if r.framework is not None and host.framework != r.framework:
            host = dataclasses.replace(host, framework=r.framework)
    matmul = UNKNOWN_TF32[0] if r.tf32_matmul is None else r.tf32_matmul
    conv = UNKNOWN_TF32[1] if r.tf32_conv is None else r.tf32_conv
    return DeploymentSettings(runtime=runtime, host=host, tf32_matmul=matmul, tf32_conv=conv,
                              channels_last=r.channels_last, autocast=r.autocast,
                              input_copy=UNKNOWN_INPUT_COPY if r.input_copy is None else r.input_copy,
                              assumed=r.assumed)
