#!/usr/bin/env python
"""Write a seeded subset of an exported dataset: at most N measurement rows per search space (family).

Used to compare "more families" with "more rows" at an equal number of training rows (docs/predictor_report.md,
"More training families"). The subset keeps the header, the graphs its rows name, and the op rows unchanged.

Usage::

    python scripts/subset_dataset.py data/host_cpu/host_cpu_amd_epyc_vm3.jsonl.xz \\
        --per-family 85 --seed 0 --out /tmp/half.jsonl.xz [--spaces resnet,vit,regnet]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from collections.abc import Sequence

from dippm_nas.dataset import iter_jsonl, open_text


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="an exported dataset (.jsonl, .jsonl.gz, .jsonl.xz)")
    ap.add_argument("--per-family", type=int, required=True, help="rows kept per search space at most")
    ap.add_argument("--spaces", default="", help="comma-separated spaces to keep (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="which rows are drawn (default 0)")
    ap.add_argument("--out", required=True, help="*.jsonl, *.jsonl.gz or *.jsonl.xz")
    args = ap.parse_args(argv)
    if args.per_family < 1:
        ap.error(f"--per-family must be >= 1, got {args.per_family}")
    wanted = {s for s in args.spaces.split(",") if s}

    graphs: dict[str, dict] = {}
    by_space: dict[str, list[dict]] = defaultdict(list)
    ops: list[dict] = []
    with open_text(args.data, "rt") as f:
        header = json.loads(f.readline())
    for rec in iter_jsonl(args.data):
        kind = rec.get("type")
        if kind == "graph":
            graphs[rec["structural_hash"]] = rec
        elif kind == "measurement":
            by_space[str(rec.get("space"))].append(rec)
        elif kind == "op_measurement":
            ops.append(rec)
    missing = sorted(wanted - set(by_space))
    if missing:
        ap.error(f"--spaces {missing} are not in {args.data}; spaces: {sorted(by_space)}")

    rng = random.Random(args.seed)
    kept: list[dict] = []
    for space in sorted(by_space):
        if wanted and space not in wanted:
            continue
        rows = by_space[space]
        kept += [rows[i] for i in sorted(rng.sample(range(len(rows)), min(args.per_family, len(rows))))]
    hashes = {r["graph_hash"] for r in kept if r.get("graph_hash")}
    with open_text(args.out, "wt") as f:
        f.write(json.dumps(header) + "\n")
        for h, g in graphs.items():
            if h in hashes:
                f.write(json.dumps(g, separators=(",", ":")) + "\n")
        for r in kept + ops:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    counts = defaultdict(int)
    for r in kept:
        counts[str(r.get("space"))] += 1
    print(f"wrote {args.out}: {len(kept)} rows ({', '.join(f'{s} {n}' for s, n in sorted(counts.items()))}), "
          f"{len(hashes)} graphs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
