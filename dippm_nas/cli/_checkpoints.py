"""``dippm-nas checkpoints [--device D] [--json]``: the predictor checkpoints found (the user folder
``$DIPPM_NAS_CHECKPOINT_DIR`` first, then the shipped ones), with their data, size and held-out metrics."""

from __future__ import annotations

import argparse

from dippm_nas.cli._grammar import add_json_flag, json_text

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checkpoints",
        help="list the predictor checkpoints: name (device.tag), size, data and held-out metrics",
        description="List every predictor checkpoint in $DIPPM_NAS_CHECKPOINT_DIR and the package, named "
                    "<device>.<tag>: what it predicts, its size, the data it was trained on and its held-out "
                    "metrics (from its .json sidecar); the files its metadata cites outside the repository "
                    "are marked external.",
    )
    p.add_argument("--device", default=None, help="only the checkpoints of this catalogue id")
    p.add_argument("--metrics", type=int, default=4, metavar="N",
                   help="held-out figures shown per checkpoint in the text output (default 4; --json has all)")
    add_json_flag(p, "a list with one object per checkpoint (every field, every metric and citation)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dippm_nas.devices import resolve_device
    from dippm_nas.predictor import list_checkpoints

    device = resolve_device(args.device).id if args.device is not None else None
    infos = list_checkpoints(device)
    if args.json:
        print(json_text([i.to_dict() for i in infos], indent=1))
        return 0
    if not infos:
        print("no checkpoint" + (f" for {device}" if device else "") + ": predictions come from the analytic prior")
        return 0
    for n, i in enumerate(infos):
        if n:
            print()
        where = "shipped" if i.shipped else str(i.path.parent)
        print(f"{i.name}  ({where}; {i.size_bytes / 2**20:.1f} MiB; trained {i.date or '?'}; "
              f"predicts {', '.join(i.targets) or '?'}" + (f"; CPU {i.cpu_model}" if i.cpu_model else "") + ")")
        if i.problem:
            print(f"  sidecar unreadable: {i.problem}")
            continue
        for s in i.data_sources:
            print("  " + _cut(f"data: {s}"))
        lines = i.metric_lines()
        for split, target, mape, rows, prior in lines[:max(args.metrics, 0)]:
            versus = f", the prior {prior:.2f} %" if prior is not None else ""
            print("  " + _cut(f"held out: {target} MAPE {mape:.2f} %{versus} ({rows} rows): {split}"))
        if len(lines) > args.metrics:
            print(f"  ... {len(lines) - args.metrics} more held-out figures (--metrics N, --json)")
        counts = {w: sum(c.where == w for c in i.citations) for w in ("repo", "public-data", "external")}
        print(f"  cites {counts['repo']} repository files, {counts['public-data']} public data files "
              f"(../shared/data, PROVENANCE.md),\n  {counts['external']} external files of the training machine "
              "(the record of what was run; not shipped)")
    return 0


def _cut(text: str, width: int = 116) -> str:
    return text if len(text) <= width else text[:width - 4].rstrip() + " ..."
