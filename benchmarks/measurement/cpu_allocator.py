#!/usr/bin/env python
"""CPU timing with glibc's allocator as it is vs fixed (``MeasureSettings.cpu_allocator``), in fresh processes.

Usage::

    taskset -c 0 python benchmarks/measurement/cpu_allocator.py [--space mbconv] [--processes 3] [--blocks 6]

Picks one model of the host-CPU dataset (``random.Random(1)`` over the family's rows, the same model the
figures in ``dippm_nas/measure/_malloc.py`` quote), then starts ``--processes`` fresh Python processes per
mode; each builds the model, warms it up (5 forwards) and prints the median of ``--blocks`` blocks of 15
timed forwards on 1 thread. The spread across processes in ``steady`` mode is this machine's
process-to-process noise; the gap between the modes is the page-fault cost the steady allocator removes.
Run it on a core no other job uses.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, statistics, sys, time, torch
sys.path.insert(0, sys.argv[4])
if sys.argv[1] == "steady":
    from dippm_nas.measure import steady_allocator
    steady_allocator()
from search_spaces import build_model
torch.set_num_threads(1)
m = build_model(sys.argv[2], json.loads(sys.argv[3])["config"]).eval()
x = torch.randn(*json.loads(sys.argv[3])["input_shape"])
meds = []
with torch.inference_mode():
    for _ in range(5):
        m(x)
    for _ in range(int(sys.argv[5])):
        ts = []
        for _ in range(15):
            t0 = time.perf_counter(); m(x); ts.append((time.perf_counter() - t0) * 1e3)
        meds.append(statistics.median(ts))
print(json.dumps(meds))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "data" / "host_cpu" / "host_cpu.jsonl.xz"))
    ap.add_argument("--space", default="mbconv")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=6)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from dippm_nas.dataset import load_measurements

    row = random.Random(1).choice(load_measurements(args.data, space=args.space))
    arg = json.dumps({"config": row.measurement["config"], "input_shape": list(row.graph.nodes[0].input_shapes[0])})
    print(f"{args.space} {row.measurement['config']} batch {row.measurement['batch_size']}; "
          f"dataset label {row.measurement['latency_ms']:.2f} ms")
    for mode in ("as-is", "steady"):
        per = []
        for _ in range(args.processes):
            out = subprocess.run([sys.executable, "-c", _CHILD, mode, args.space, arg, str(ROOT), str(args.blocks)],
                                 capture_output=True, text=True, check=True)
            meds = json.loads(out.stdout.strip().splitlines()[-1])
            per.append(statistics.median(meds))
            print(f"  {mode:6s} process: block medians {', '.join(f'{v:.2f}' for v in meds)} ms")
        print(f"{mode:6s} median over processes {statistics.median(per):.2f} ms (range {min(per):.2f}-{max(per):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
