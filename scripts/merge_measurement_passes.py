"""Merge independent measurement passes of one dataset plan: per job, keep the pass with the lowest median.

Usage (from the repository root)::

    python scripts/merge_measurement_passes.py PASS1.sqlite PASS2.sqlite [...] --out MERGED.sqlite

Each PASS is a dataset file made by ``dippm-nas dataset build`` with the same plan arguments (same plan key)
and different ``--out``. On a machine shared with other work a measurement window can catch preemption
bursts that no stopping rule removes; an independent second pass over the same models, taken at another
time, rarely catches one on the same model. Noise only ever adds time, so the pass with the lower
``latency_ms_median`` is kept whole (its mean, median, std, CI and environment: figures are never mixed
across passes), and ``extra["passes"]`` records every pass's mean and median with its file name, so
nothing is lost. The rule looks at the measurements only, never at a predictor.

The output is a copy of the first pass with the kept rows replaced; export it with
``dippm-nas dataset export MERGED.sqlite --out FILE.jsonl.xz --source measured-here``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

#: Columns copied from the kept pass (every figure of a measurement row and its context).
_COLUMNS = ("latency_ms", "latency_ms_std", "latency_ms_median", "latency_ms_ci95", "energy_j", "energy_source",
            "energy_reason", "memory_mib", "memory_source", "n_repeats", "stop_reason", "status", "reason",
            "environment", "extra", "measured_at")


def _rows(path: Path) -> tuple[str, dict[str, dict]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    plans = [r[0] for r in con.execute("SELECT DISTINCT json_extract(environment, '$.plan_key') FROM measurements")]
    out = {}
    for r in con.execute("SELECT j.candidate_key, m.* FROM measurements m JOIN jobs j ON j.id = m.job_id "
                         "WHERE m.source = 'measured-here'"):
        out[r["candidate_key"]] = dict(r)
    con.close()
    if len(plans) != 1:
        raise SystemExit(f"{path}: expected the rows of one plan, found plan keys {plans}")
    return plans[0], out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("passes", nargs="+", type=Path, help="dataset files of the same plan (two or more)")
    ap.add_argument("--out", required=True, type=Path, help="merged dataset file (a copy of the first pass)")
    args = ap.parse_args(argv)
    if len(args.passes) < 2:
        ap.error("give at least two passes")
    loaded = [_rows(p) for p in args.passes]
    if len({plan for plan, _ in loaded}) != 1:
        ap.error(f"the passes come from different plans: {[plan[:12] for plan, _ in loaded]}")
    keys = set(loaded[0][1])
    for p, (_, rows) in zip(args.passes, loaded):
        if set(rows) != keys:
            ap.error(f"{p} does not measure the same jobs as {args.passes[0]}")
    shutil.copyfile(args.passes[0], args.out)
    con = sqlite3.connect(args.out)
    kept_from = [0] * len(args.passes)
    with con:
        for key in sorted(keys):
            cands = [(rows[key], i) for i, (_, rows) in enumerate(loaded)]
            ok = [(r, i) for r, i in cands if r["status"] == "ok" and r["latency_ms_median"] is not None]
            best, idx = min(ok, key=lambda t: t[0]["latency_ms_median"]) if ok else cands[0]
            kept_from[idx] += 1
            extra = json.loads(best["extra"] or "{}")
            extra["passes"] = [{"file": args.passes[i].name, "status": r["status"], "latency_ms": r["latency_ms"],
                                "latency_ms_median": r["latency_ms_median"], "measured_at": r["measured_at"]}
                               for r, i in cands]
            extra["kept_pass"] = args.passes[idx].name
            values = {c: best[c] for c in _COLUMNS}
            values["extra"] = json.dumps(extra, separators=(",", ":"))
            sets = ", ".join(f"{c} = ?" for c in _COLUMNS)
            con.execute(f"UPDATE measurements SET {sets} WHERE id = ?", [*(values[c] for c in _COLUMNS),
                                                                         loaded[0][1][key]["id"]])
    con.close()
    for p, n in zip(args.passes, kept_from):
        print(f"{p}: kept for {n} of {len(keys)} jobs")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
