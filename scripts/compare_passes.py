#!/usr/bin/env python
"""Test-retest of two measurement passes of one dataset plan: how well one pass predicts the other.

Usage (from the repository root)::

    python scripts/compare_passes.py PASS_A.sqlite PASS_B.sqlite [--column latency_ms_median]

Either file may also be a dataset export (``.jsonl`` or ``.jsonl.xz``, e.g. the ``data/host_cpu`` files).

Prints, over the rows both passes measured (``status='ok'``, matched by space, config and batch size): the
median B/A ratio with its 5th-95th percentiles, the share of rows differing by more than 10 %, and the MAPE
of B as a "prediction" of A after removing the global factor between the passes (a predictor could learn
that factor), overall and per family. This is the error a perfect predictor would show against one pass.
Per family it also prints the family's own factor relative to the global one and the MAPE after it: a
family-wide shift between passes is label noise that no predictor of an unseen family can learn.

Columns: ``latency_ms`` (mean), ``latency_ms_median``, ``memory_mib``; for passes built with ``--rounds``
also ``latency_ms_min`` (the rounds' fastest forward) and ``own_block.latency_ms`` /
``own_block.latency_ms_median`` (the model's own one-by-one block, measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: --column -> the SQL expression reading it (figures kept in ``extra`` are read with SQLite's json_extract)
_COLUMNS = {
    "latency_ms": "latency_ms",
    "latency_ms_median": "latency_ms_median",
    "memory_mib": "memory_mib",
    "latency_ms_min": "json_extract(extra, '$.latency_ms_min')",
    "own_block.latency_ms": "json_extract(extra, '$.own_block.latency_ms')",
    "own_block.latency_ms_median": "json_extract(extra, '$.own_block.latency_ms_median')",
}


def _export_value(row: dict, column: str) -> float | None:
    if column in ("latency_ms", "latency_ms_median", "memory_mib"):
        return row.get(column)
    v: object = row.get("extra") or {}
    for part in (["latency_ms_min"] if column == "latency_ms_min" else ["own_block", column.split(".", 1)[1]]):
        v = v.get(part) if isinstance(v, dict) else None
    return v  # type: ignore[return-value]


def _rows(path: str, column: str) -> dict[tuple, float]:
    out = {}
    if path.endswith((".jsonl", ".jsonl.xz")):
        from dippm_nas.dataset import iter_jsonl

        for row in iter_jsonl(path):  # checks the export's header and schema version
            if row.get("type") != "measurement" or row.get("status") != "ok":
                continue
            v = _export_value(row, column)
            if v is not None and v > 0:
                out[(row["space"], json.dumps(row["config"], sort_keys=True), row["batch_size"])] = float(v)
        return out
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for space, config, bs, v in con.execute(
            f"SELECT space, config, batch_size, {_COLUMNS[column]} FROM measurements WHERE status = 'ok'"):
        if v is not None and v > 0:
            cfg = json.dumps(json.loads(config) if isinstance(config, str) else config, sort_keys=True)
            out[(space, cfg, bs)] = float(v)
    con.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--column", default="latency_ms_median", choices=tuple(_COLUMNS))
    args = ap.parse_args(argv)
    a, b = _rows(args.a, args.column), _rows(args.b, args.column)
    keys = sorted(set(a) & set(b))
    if not keys:
        raise SystemExit("the two files have no measured row in common (same plan?)")
    r = np.array([b[k] / a[k] for k in keys])
    g = float(np.exp(np.median(np.log(r))))
    ape = np.abs(r / g - 1)
    print(f"{len(keys)} rows in common; {args.column} B/A: median {np.median(r):.3f} "
          f"(5-95 % {np.percentile(r, 5):.3f}-{np.percentile(r, 95):.3f}); differ by > 10 %: {np.mean(np.abs(r - 1) > 0.1):.1%}")
    print(f"test-retest MAPE (global factor {g:.3f} removed): {100 * ape.mean():.2f} %, median APE {100 * np.median(ape):.2f} %")
    fam: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        fam[k[0]].append(i)
    within = np.empty(len(keys))
    for f, idx in sorted(fam.items()):
        rf = r[idx] / g
        gf = float(np.exp(np.median(np.log(rf))))
        within[idx] = np.abs(rf / gf - 1)
        print(f"  {f:14s} MAPE {100 * ape[idx].mean():6.2f} %  family factor {gf:.3f}, "
              f"MAPE after it {100 * within[idx].mean():6.2f} %  ({len(idx)} rows)")
    print(f"after each family's own factor: MAPE {100 * within.mean():.2f} %, median APE {100 * np.median(within):.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
