"""``dippm-nas deployment --out FILE``: this machine's :class:`~dippm_nas.Deployment` (its PyTorch's TF32 and
cuDNN flags, versions and the host microbenchmark), and its alias ``dippm-nas host-profile --out FILE``, which
writes the host part only (the host profile file that ``--host FILE`` reads)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from dippm_nas.cli._deployment_flags import add_deployment_args, deployment_from_args
from dippm_nas.cli._grammar import add_json_flag, json_text, writable_output
from dippm_nas.deployment import Deployment
from dippm_nas.devices import HostProfile

__all__ = ["register"]

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


def run(args: argparse.Namespace) -> int:
    writable_output(args.out, "--out")  # before the benchmark
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
