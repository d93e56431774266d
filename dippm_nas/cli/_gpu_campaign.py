"""``dippm-nas gpu-campaign``: measure the fixed validation set on this machine's GPU, resumably, in a time budget.

Runs from a source checkout with only torch (plus torchvision, timm, transformers for the set's models):
``PYTHONPATH=. python3 -m dippm_nas gpu-campaign --out DIR``. See :mod:`dippm_nas.measure._campaign` and
``docs/gpu_campaign.md``.
"""

from __future__ import annotations

import argparse
from typing import Any

from dippm_nas.cli._grammar import (
    MAX_THREADS,
    json_text,
    DeprecatedFlag,
    ListAction,
    add_json_flag,
    add_torch_device,
    check_name,
    float_flag,
    int_flag,
    positive_int,
    writable_output,
)
from dippm_nas.measure import (
    DEFAULT_SET,
    RUNTIMES,
    VALIDATION_SETS,
    CampaignItem,
    Measurement,
    campaign_settings,
    run_campaign,
)
from dippm_nas.spec import COMPUTE_DTYPES

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gpu-campaign",
        help="measure the fixed validation set on this GPU (latency, energy, memory), resumable, time-bounded",
        description="Measure a fixed, versioned validation set (torchvision and timm CNNs, ViT, Swin, a BERT-base "
                    "encoder, a GPT-2-size decoder; batch 1-256; float16, bfloat16, float32; eager, CUDA graphs, "
                    "torch.compile) with CUDA events, the NVML energy counter and PyTorch's peak memory, most "
                    "informative rows first, for at most --minutes. Writes dataset JSON Lines files (<= 16 MiB "
                    "each) and campaign.json to --out; capture the graphs later with "
                    "'dippm-nas dataset import campaign DIR --out FILE' on a machine with TVM.",
    )
    p.add_argument("--out", required=True, help="campaign directory (created)")
    p.add_argument("--minutes", type=float_flag("--minutes", low=0, low_inclusive=False), default=25.0,
                   help="wall-time budget, minutes (default 25)")
    p.add_argument("--resume", action="store_true", help="continue the campaign in --out, skipping measured rows")
    add_torch_device(p, "cuda", "torch device to measure on: cuda | cuda:N | cpu (a dry run on the CPU measurer)")
    p.add_argument("--set", dest="set_name", default=DEFAULT_SET, choices=sorted(VALIDATION_SETS),
                   help=f"validation set (default {DEFAULT_SET}; 'smoke': two tiny models)")
    p.add_argument("--runtime", "--runtimes", dest="runtimes", action=ListAction, default=list(RUNTIMES),
                   item=lambda t: check_name("runtime", t, RUNTIMES),
                   metavar="R", help=f"runtimes, of {', '.join(RUNTIMES)} (a list; default all)")
    p.add_argument("--dtype", "--dtypes", dest="dtypes", action=ListAction, default=None, metavar="T",
                   item=lambda t: check_name("dtype", t, COMPUTE_DTYPES),
                   help="dtypes (a list; default float16 bfloat16 float32)")
    p.add_argument("--batch", dest="batches", action=ListAction, item=positive_int("--batch"), default=None,
                   metavar="N", help="batch sizes, e.g. --batch 1 8 32 or 1,8,32 (default 1 8 32 64 128 256)")
    p.add_argument("--batches", dest="batches", action=DeprecatedFlag, new="--batch",
                   convert=lambda t: [positive_int("--batches")(v) for v in t.split(",") if v.strip()])
    p.add_argument("--time-cap", type=float_flag("--time-cap", low=0, low_inclusive=False), default=20.0,
                   help="seconds per row, warm-up included (default 20)")
    p.add_argument("--threads", type=int_flag("--threads", low=1, high=MAX_THREADS), default=None,
                   help="torch threads while measuring (default: as is on a GPU, 1 with --torch-device cpu)")
    p.add_argument("--max-file-mib", type=float_flag("--max-file-mib", low=0, low_inclusive=False), default=16.0,
                   help="size limit of each output file (default 16)")
    add_json_flag(p, "the report as one object at the end")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    writable_output(args.out, "--out", directory=True)  # before the first measurement, not after the campaign
    kw: dict[str, Any] = {}
    if args.dtypes is not None:
        kw["dtypes"] = args.dtypes
    if args.batches is not None:
        kw["batches"] = args.batches

    def progress(done: int, todo: int, item: CampaignItem, m: Measurement) -> None:
        lat = f"{m.latency_ms:.3f} ms" if m.latency_ms is not None else "-"
        mem = f"{m.memory_mib:.0f} MiB" if m.memory_mib is not None else "-"
        energy = f"{m.energy_j:.4g} J" if m.energy_j is not None else "-"
        why = f" ({m.reason[:120]})" if m.reason else ""
        print(f"[{done}/{todo}] {item.model.name} bs{item.batch_size} {item.dtype} {item.runtime}: {m.status} "
              f"{lat} {energy} {mem}{why}", flush=True)

    threads = args.threads if args.threads is not None else (1 if args.torch_device == "cpu" else None)
    report = run_campaign(args.out, minutes=args.minutes, resume=args.resume, torch_device=args.torch_device,
                          set_name=args.set_name, runtimes=args.runtimes,
                          settings=campaign_settings(time_cap_s=args.time_cap, threads=threads),
                          max_file_mib=args.max_file_mib,
                          progress=None if args.json else progress, **kw)
    if args.json:
        print(json_text(report.to_dict(), indent=1))
    else:
        print(f"{report.measured} rows measured ({report.by_status}), {report.already} already there, "
              f"{report.left} left for a later --resume; {report.planned} planned; {report.seconds:.0f} s; "
              f"files: {', '.join(report.files)}")
        for rt, why in report.skipped.items():
            print(f"runtime {rt} left out: {why}")
    return 0
