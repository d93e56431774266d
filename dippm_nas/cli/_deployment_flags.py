"""The deployment flags of the predicting verbs (``predict``, ``demo``, ``evaluate``) and of ``deployment``:
``--deployment FILE``, ``--runtime``, ``--host``, ``--framework``, ``--tf32``, ``--autocast``, ``--input-copy``.

A flag overrides the field of the ``--deployment`` file it names; a bad value, an unreadable file or a field
breaking its rule is a usage error (exit 2) that names the field, the value and the choices.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from dippm_nas.cli._grammar import UsageError, argtype, check_name
from dippm_nas.deployment import AUTOCAST_DTYPES, GRAPH_RUNTIMES, INPUT_COPIES, Deployment
from dippm_nas.devices import FRAMEWORKS, resolve_host_profile
from dippm_nas.errors import DeploymentError, DeviceError, ExecutionRuntimeError

__all__ = ["add_deployment_args", "deployment_from_args", "deployment_flags_given", "TF32_CHOICES",
           "AUTOCAST_CHOICES"]

#: ``--tf32`` values; the flag alone means ``on`` (PyTorch's ``allow_tf32`` for matmuls and convolutions).
TF32_CHOICES: tuple[str, ...] = ("on", "off")
#: ``--autocast`` values: ``none`` (no autocast; the model runs in its ``--dtype``) and the autocast dtypes.
AUTOCAST_CHOICES: tuple[str, ...] = ("none", *AUTOCAST_DTYPES)


#: The argparse destinations of the deployment flags.
_FLAG_DESTS = ("deployment", "runtime", "host", "framework", "tf32", "autocast", "input_copy")


def _runtime(text: str) -> str:
    return check_name("runtime", text.strip().lower(), GRAPH_RUNTIMES)


def add_deployment_args(p: argparse.ArgumentParser, *, files: bool = True) -> None:
    """Add the deployment flags to ``p`` (``files``: also ``--deployment FILE`` and ``--host FILE``)."""
    g = p.add_argument_group("deployment", "how inference runs on the GPU; what is not described is assumed "
                                           "(labels['deployment_assumed']). A flag overrides the field of "
                                           "--deployment FILE.")
    if files:
        g.add_argument("--deployment", metavar="FILE", default=None,
                       help="a deployment file, JSON or TOML (`dippm-nas deployment --out FILE` writes the one of "
                            "the machine it runs on)")
    g.add_argument("--runtime", metavar="R", default=None, type=argtype(_runtime),
                   help="how the model runs: eager (default; per-operator host dispatch), cuda-graphs (one graph "
                        "replay), compiled (torch.compile default mode)")
    if files:
        g.add_argument("--host", metavar="FILE", default=None,
                       help="host profile of the CPU that drives the GPU (`dippm-nas host-profile --out FILE`), or "
                            "'default' (a typical datacenter host); default: unknown")
    g.add_argument("--framework", default=None, choices=FRAMEWORKS,
                   help="PyTorch generation (sets the host model's generation and the TF32 defaults)")
    g.add_argument("--tf32", nargs="?", const="on", default=None, choices=TF32_CHOICES,
                   help="TF32 for float32 matmuls and convolutions (torch.backends.cuda.matmul.allow_tf32 and "
                        "torch.backends.cudnn.allow_tf32); the flag alone is 'on'; default: the framework's")
    g.add_argument("--autocast", default=None, choices=AUTOCAST_CHOICES,
                   help="torch.autocast around the forward (matmul, conv, linear in the low dtype; softmax, norms, "
                        "reductions in float32; casts as kernels), or none (the model runs in its --dtype); "
                        "default: unknown (a float16/bfloat16 model priced as a mixture of .half() and autocast, a "
                        "float32 model without autocast)")
    g.add_argument("--input-copy", dest="input_copy", default=None, choices=INPUT_COPIES,
                   help="whether the timed region holds x.to('cuda'): none, from pageable or from pinned memory; "
                        "default: unknown")


def _flag_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The deployment fields the flags of ``args`` set (those given), in :class:`Deployment`'s names."""
    out: dict[str, Any] = {}
    if getattr(args, "runtime", None) is not None:
        out["runtime"] = args.runtime
    if getattr(args, "host", None) is not None:
        out["host"] = resolve_host_profile(args.host)
    if getattr(args, "framework", None) is not None:
        out["framework"] = args.framework
    if getattr(args, "tf32", None) is not None:
        out["tf32_matmul"] = out["tf32_conv"] = args.tf32 == "on"
    if getattr(args, "autocast", None) is not None:
        out["autocast"] = args.autocast
    if getattr(args, "input_copy", None) is not None:
        out["input_copy"] = args.input_copy
    return out


def deployment_flags_given(args: argparse.Namespace) -> bool:
    """Whether ``--deployment`` or any deployment flag was given."""
    return any(getattr(args, name, None) is not None for name in _FLAG_DESTS)


def deployment_from_args(args: argparse.Namespace, base: Deployment | None = None) -> Deployment:
    """The deployment of the flags: ``--deployment FILE`` (else ``base``, else nothing described) with each
    given flag overriding its field.

    Raises:
        UsageError: an unreadable or malformed file, a host profile that cannot be read, or a field breaking
            its rule (the message names the field, the value and the choices).
    """
    try:
        path = getattr(args, "deployment", None)
        dep = Deployment.load(path) if path else (base or Deployment())
        changes = _flag_changes(args)
        if "host" in changes and changes.get("framework", dep.framework) is None:
            changes["framework"] = changes["host"].framework  # a host profile names its PyTorch generation
        dep = dataclasses.replace(dep, **changes)
        return Deployment.coerce(dep)
    except (DeploymentError, DeviceError, ExecutionRuntimeError) as e:
        flag = "--deployment" if getattr(args, "deployment", None) else "deployment flags"
        raise UsageError(f"{flag}: {e}") from e
