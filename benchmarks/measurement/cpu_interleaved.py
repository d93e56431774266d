#!/usr/bin/env python
"""CPU test-retest of two timing schedules, in fresh processes: one block per model vs interleaved rounds.

Usage (from the repository root; run it on a machine with nothing else to do)::

    python benchmarks/measurement/cpu_interleaved.py [--data data/host_cpu/host_cpu_amd_epyc_rounds.jsonl.xz] [--per-family 8]
        [--processes 3] [--rounds 5] [--per-round 5] [--cpu 0]

Draws ``--per-family`` models of every family of a host-CPU dataset (``random.Random(--seed)``), then starts
``--processes`` fresh Python processes one after the other, pinned to ``--cpu``. Each builds every model and
times each one twice, with the same number of timed forwards (``rounds * per_round``):

- ``block``: model after model, 2 untimed forwards then all its timed forwards in one block (the
  one-by-one schedule of ``dippm-nas dataset build`` without ``--rounds``);
- ``rounds``: :func:`dippm_nas.measure.time_interleaved` (``dataset build --rounds``).

The processes alternate which schedule goes first. Printed per schedule and statistic (mean, median,
min of the samples): the MAPE with which one process predicts another, after removing the global factor
between the two (as ``scripts/compare_passes.py`` does), for every pair of processes, and against the
dataset's own labels. The lower, the less a figure depends on when and in which process it was taken.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks._common import machine  # noqa: E402

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from dippm_nas.measure import MeasureSettings, steady_allocator, time_interleaved
from search_spaces import build_model, get_space
steady_allocator()
items, rounds, per_round, rounds_first, out = (json.load(open(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]),
                                               sys.argv[5] == "1", sys.argv[6])
torch.set_num_threads(1)
built = [(build_model(it["space"], it["config"]).eval(),
          get_space(it["space"]).input_spec(it["config"], batch_size=it["batch_size"])) for it in items]
settings = MeasureSettings(threads=1)

def blocks():
    res = []
    with torch.inference_mode():
        for m, spec in built:
            args, kwargs = spec.example_inputs(torch.device("cpu"))
            for _ in range(2):
                m(*args, **kwargs)
            ts = []
            for _ in range(rounds * per_round):
                t0 = time.perf_counter(); m(*args, **kwargs); ts.append((time.perf_counter() - t0) * 1e3)
            res.append(ts)
    return res

def interleaved():
    return [list(t.samples_ms) for t in time_interleaved(built, settings, rounds=rounds, per_round=per_round)]

result = {}
for name in (("rounds", "block") if rounds_first else ("block", "rounds")):
    result[name] = interleaved() if name == "rounds" else blocks()
json.dump(result, open(out, "w"))
"""

_STATS = {"mean": statistics.mean, "median": statistics.median, "min": min}


def retest_mape(a: list[float], b: list[float]) -> float:
    """MAPE (%) of ``b`` as a prediction of ``a`` once the global factor between them is removed."""
    g = math.exp(statistics.median(math.log(y / x) for x, y in zip(a, b)))
    return 100 * statistics.mean(abs(y / (g * x) - 1) for x, y in zip(a, b))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "data" / "host_cpu" / "host_cpu_amd_epyc_rounds.jsonl.xz"))
    ap.add_argument("--per-family", type=int, default=8)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=0, help="CPU the timing processes are pinned to")
    args = ap.parse_args()
    if args.processes < 2:
        raise SystemExit("--processes must be at least 2 (a test-retest needs two)")
    from dippm_nas.dataset import load_measurements

    rows = load_measurements(args.data, device="cpu")
    by_family: dict[str, list] = {}
    for r in rows:
        by_family.setdefault(r.measurement["space"], []).append(r)
    rng = random.Random(args.seed)
    picked = [r for fam in sorted(by_family) for r in rng.sample(by_family[fam], min(args.per_family,
                                                                                      len(by_family[fam])))]
    items = [{"space": r.measurement["space"], "config": r.measurement["config"],
              "batch_size": r.measurement["batch_size"]} for r in picked]
    labels = [r.measurement["latency_ms"] for r in picked]
    print(f"{machine()}\n{len(items)} models ({args.per_family} per family of {args.data}); {args.processes} fresh "
          f"processes on CPU {args.cpu}; {args.rounds} x {args.per_round} timed forwards per model per schedule")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "items.json"
        spec_file.write_text(json.dumps(items))
        for p in range(args.processes):
            out = Path(tmp) / f"run{p}.json"
            subprocess.run(["taskset", "-c", str(args.cpu), sys.executable, "-c", _CHILD, str(ROOT), str(spec_file),
                            str(args.rounds), str(args.per_round), str(p % 2), str(out)], check=True)
            runs.append(json.loads(out.read_text()))
            print(f"  process {p + 1} done ({'rounds' if p % 2 else 'block'} first)")
    print(f"\n{'schedule':8s} {'statistic':9s} {'process vs process MAPE %':>36s}   vs dataset label MAPE %")
    for sched in ("block", "rounds"):
        for stat, fn in _STATS.items():
            vals = [[fn(s) for s in run[sched]] for run in runs]
            pairs = [retest_mape(vals[i], vals[j]) for i, j in itertools.combinations(range(len(vals)), 2)]
            lab = [retest_mape(labels, v) for v in vals]
            print(f"{sched:8s} {stat:9s} {' '.join(f'{x:5.2f}' for x in pairs):>36s}   "
                  f"{' '.join(f'{x:5.2f}' for x in lab)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
