"""``dippm-nas devices``: list the device catalogue (id, memory, bandwidth, peaks, MIG profiles)."""

from __future__ import annotations

import argparse

from dippm_nas.devices import get_device, list_devices

from dippm_nas.cli._grammar import json_text

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "devices",
        help="list the device catalogue: id, memory, bandwidth, peak TFLOP/s, MIG profiles",
        description="List every known device (built-in data files, files in $DIPPM_NAS_DEVICE_DIR). "
                    "host-cpu is measured by a short microbenchmark at first use and cached.",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of every device's full record")
    p.add_argument("--no-host", action="store_true", help="leave out host-cpu (skips its microbenchmark)")
    p.set_defaults(func=run)


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def run(args: argparse.Namespace) -> int:
    ids = [i for i in list_devices() if not (args.no_host and i == "host-cpu")]
    devices = [get_device(i) for i in ids]
    if args.json:
        print(json_text([d.to_dict() for d in devices], indent=1))
        return 0
    head = (f"{'id':<16}{'kind':<5}{'SMs':>5}{'memory GiB':>11}{'BW GB/s':>9}{'FP32':>7}{'TF32':>7}"
            f"{'FP16':>7}{'BF16':>7}{'power W':>9}  MIG profiles")
    print(head)
    print("-" * len(head))
    for d in devices:
        mig = ", ".join(f"{p.name}(x{p.max_instances})" for p in d.mig_profiles) or "no MIG"
        power = "-" if d.board_power_w is None else f"{d.board_power_w:.0f}"
        print(f"{d.id:<16}{d.kind:<5}{d.sms:>5}{d.memory_mib / 1024:>11.1f}{d.bandwidth_gbps:>9.0f}"
              f"{_fmt(d.fp32_tflops, '.2f' if d.fp32_tflops < 1 else '.1f'):>7}{_fmt(d.tf32_tensor_tflops):>7}"
              f"{_fmt(d.fp16_tensor_tflops):>7}{_fmt(d.bf16_tensor_tflops):>7}{power:>9}  {mig}")
    print("peaks: dense TFLOP/s (tensor cores for TF32/FP16/BF16, FP32 accumulation); memory: usable (nvidia-smi) "
          "where known; host-cpu: measured on this machine")
    checks = [d.id for d in devices if d.checks]
    if checks:
        print(f"figures marked 'check' (see each file's checks and sources): {', '.join(checks)}")
    return 0
