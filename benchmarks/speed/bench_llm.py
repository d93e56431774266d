#!/usr/bin/env python
"""How fast and how lean LLM predictions are: the graphs of a 70B decoder, a 7B prediction over a grid.

Usage::

    python benchmarks/speed/bench_llm.py [--repeats 3] [--json OUT]

- ``graphs_70b``: wall time and peak Python heap (``tracemalloc``) of building the prefill graph (one prompt of
  2048 tokens) and the decode-step graph (batch 1, 2048 cached tokens) of Llama-2-70B from its config, per graph
  style, and of the prior's estimate of both on an H100;
- ``predict_7b``: wall time of ``predict_generation`` of Llama-2-7B for batches 1, 16 and 64 on an A100-80GB and
  an H100 (6 predictions), cold (the first grid of the process: imports, constants files) and warm (the median of
  ``--repeats`` more grids, each with a prompt length not seen before, so no graph or estimate is reused; a
  repeated prediction is cached and faster still), per runtime, with and without the MIG slices.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from benchmarks._common import machine, median_seconds

from dippm_nas.llm import LLMWorkload, architecture, decode_graph, predict_generation, prefill_graph
from dippm_nas.prior import DeploymentSettings, estimate
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import write_output


def graphs_70b() -> dict:
    cfg = architecture("llama-2-70b")
    out = {}
    for style in ("eager", "static", "fused"):
        tracemalloc.start()
        t0 = time.perf_counter()
        pre = prefill_graph(cfg, 1, 2048, style=style)
        dec = decode_graph(cfg, 1, 2048, style=style)
        t1 = time.perf_counter()
        estimate(pre, "h100-sxm5-80gb")
        estimate(dec, "h100-sxm5-80gb", deployment=DeploymentSettings(runtime="cuda-graphs"))
        t2 = time.perf_counter()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[style] = {"nodes": [pre.num_nodes, dec.num_nodes], "build_s": round(t1 - t0, 3),
                      "estimate_s": round(t2 - t1, 3), "peak_heap_mib": round(peak / 2**20, 1)}
    return out


def predict_7b(repeats: int) -> dict:
    out = {}
    prompts = iter(range(512, 10**6))
    for runtime in ("eager", "serving"):
        for mig in (False, True):
            def grid() -> None:
                prompt = next(prompts)  # a new graph for every grid
                for dev in ("a100-sxm4-80gb", "h100-sxm5-80gb"):
                    for b in (1, 16, 64):
                        predict_generation("llama-2-7b", LLMWorkload(prompt, 256, b), dev, runtime=runtime, mig=mig)

            t0 = time.perf_counter()
            grid()
            cold = time.perf_counter() - t0
            warm = median_seconds(grid, repeats, warmup=0)
            out[f"{runtime}{' +mig' if mig else ''}"] = {"cold_s": round(cold, 3), "warm_s": round(warm, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)
    report = {"machine": machine(), "graphs_70b": graphs_70b(), "predict_7b": predict_7b(args.repeats)}
    text = json.dumps(report, indent=1)
    if args.json:
        write_output(args.json, text + "\n", "--json", error=InvalidValueError)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
