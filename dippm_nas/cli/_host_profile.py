"""``dippm-nas host-profile --out FILE [--name NAME] [--json]``: measure this machine as the host of a GPU."""

from __future__ import annotations

import argparse
from pathlib import Path

from dippm_nas.cli._grammar import json_text, writable_output
from dippm_nas.errors import InvalidValueError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "host-profile",
        help="measure this machine's CPU as the host that drives a GPU (a CPU-only microbenchmark, ~1 s)",
        description="Time PyTorch eager's per-operator overhead on this CPU and write a host profile (speed "
                    "relative to a 3.0 GHz server core, framework generation) that `dippm-nas predict --host FILE` "
                    "and `dippm_nas.predict(..., host=FILE)` use for the host side of eager GPU latency. Run it on "
                    "the server that will drive the GPU.",
    )
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--name", default=None, help="a label for the profile (default: the CPU model)")
    p.add_argument("--json", action="store_true", help="also print the profile as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dippm_nas.devices import measure_host_profile

    out = writable_output(args.out, "--out")  # before the benchmark
    prof = measure_host_profile(name=args.name)
    try:
        prof.save(out)
    except OSError as e:
        raise InvalidValueError(f"--out {str(out)!r} cannot be written: {e.strerror or e}") from e
    if args.json:
        print(json_text(prof.to_dict()))
    else:
        print(f"host      {prof.name} ({prof.framework}, torch {prof.torch_version})")
        print(f"speed     {prof.speed:.3g} x a 3.0 GHz server core  (microbenchmark {prof.microbench_us:.3g} µs per op)")
        print(f"wrote     {args.out}")
    return 0
