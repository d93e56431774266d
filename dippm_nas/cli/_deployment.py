"""``dippm-nas deployment --out FILE``: this machine's :class:`~dippm_nas.Deployment` (its PyTorch's TF32 and
cuDNN flags, versions and the host microbenchmark), and its alias ``dippm-nas host-profile --out FILE``, which
writes the host part only (the host profile file that ``--host FILE`` reads)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from dippm_nas.cli._deployment_flags import add_deployment_args, deployment_from_args
from dippm_nas.cli._grammar import UsageError, add_json_flag, json_text
from dippm_nas.deployment import Deployment
from dippm_nas.devices import HostProfile

__all__ = ["register", "check_writable"]

_RUN_ON = "Run it on the server that drives the GPU."


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "deployment",
        help="describe how inference runs on this machine (PyTorch's TF32/cuDNN flags, versions, host speed)",
        description="Read this machine's PyTorch flags (TF32 for matmuls and convolutions, cuDNN's autotuner) and "
                    "versions, time the host microbenchmark (~1 s) and write the deployment file that `dippm-nas "
                    "predict --deployment FILE` and `dippm_nas.predict(..., deployment=FILE)` read: JSON, or TOML "
                    "when FILE ends in .toml. Autocast and the input copy belong to a script, not a machine: give "
                    f"them as flags. {_RUN_ON}",
    )
    p.add_argument("--out", type=Path, required=True, help="file to write (.json or .toml)")
    p.add_argument("--name", default=None, help="a label for the host (default: the CPU model)")
    add_deployment_args(p, files=False)
    add_json_flag(p, "the deployment as one object")
    p.set_defaults(func=run, form="deployment")

    a = sub.add_parser(
        "host-profile",
        help="alias of `deployment` that writes the host profile only (the file --host FILE reads)",
        description="Time PyTorch eager's per-operator overhead on this CPU and write the host profile (speed "
                    "relative to a 3.0 GHz server core, framework generation) that `dippm-nas predict --host FILE`, "
                    "`dippm_nas.predict(..., host=FILE)` and `Deployment(host=FILE)` read: the host part of "
                    f"`dippm-nas deployment`, as JSON. {_RUN_ON}",
    )
    a.add_argument("--out", type=Path, required=True, help="JSON file to write")
    a.add_argument("--name", default=None, help="a label for the profile (default: the CPU model)")
    a.add_argument("--json", action="store_true", help="also print the profile as one JSON object")
    a.set_defaults(func=run, form="host")


def check_writable(path: Path, flag: str = "--out") -> None:
    """Refuse (a :class:`UsageError`) an output path that cannot be written: a directory, a missing parent
    directory, or no write permission; checked before the work, so a long measurement is never lost."""
    parent = path.parent
    if path.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is a directory; give a file path")
    if not parent.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: its directory {str(parent)!r} does not exist")
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        raise UsageError(f"{flag} {str(path)!r} is not writable ({'the file' if path.exists() else 'its directory'} "
                         "denies writing)")


def run(args: argparse.Namespace) -> int:
    check_writable(args.out)
    detected = Deployment.detect()
    host = detected.host
    assert host is not None  # detect() measured it
    if args.name:
        host = dataclasses.replace(host, name=args.name)
    if args.form == "host":
        host.save(args.out)
        if args.json:
            print(json_text(host.to_dict()))
        else:
            _print_host(host)
            print(f"wrote     {args.out} (a host profile: --host FILE; `dippm-nas deployment --out FILE` also "
                  "records the TF32 flags and versions)")
        return 0
    dep = deployment_from_args(args, base=dataclasses.replace(detected, host=host))
    dep.save(args.out)
    if args.json:
        print(json_text(dep.to_dict()))
        return 0
    _print_host(host)
    print(f"versions  {', '.join(f'{k} {v}' for k, v in (dep.versions or {}).items())}")
    print(f"settings  {dep.label}")
    print(f"wrote     {args.out}")
    return 0


def _print_host(host: HostProfile) -> None:
    print(f"host      {host.name} ({host.framework}, torch {host.torch_version})")
    print(f"speed     {host.speed:.3g} x a 3.0 GHz server core  (microbenchmark {host.microbench_us:.3g} µs per op)")
