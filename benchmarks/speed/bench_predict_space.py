"""The predictor on new search-space candidates: ``predict_graphs`` graphs/s, by wall and by CPU time.

Usage::

    python benchmarks/speed/bench_predict_space.py [--candidates 1000] [--space mbconv] [--device a100-sxm4-40gb]
        [--repeats 3] [--no-mig] [--batch-sizes 1,2,8] [--json OUT.json]

``--candidates`` random configs of ``--space`` at the Accel-NASBench setting of the A100 checkpoint (resolution
256, float16, batch 256) are assembled from blocks (captured first, into a fresh conversion cache); then, per
repeat, a fresh predictor (nothing in its caches) runs ``predict_graphs`` on all of them (analytic prior,
coarsening, features, GNN, latency composition, MIG advice unless ``--no-mig``), and the network alone
(``predict_log_full``) on their features. ``predict_graphs`` keeps the prior's per-graph facts (op classes,
liveness) of earlier repeats, as a search that revisits graphs does; ``predict_graphs new`` forgets them before
each repeat (``dippm_nas.prior.clear_graph_facts``), as for candidates never seen. Each figure is the median over
``--repeats`` of graphs per second of wall time and of this process's CPU time (``time.process_time``): on a
machine shared with other jobs the CPU figure is the one that does not depend on how much of a core the process
got; ``cpu_share`` (CPU / wall) says how much it got. ``non-network`` is the CPU time per graph of
``predict_graphs`` minus the network's. The load average is printed before and after, and the process's peak
resident memory (``ru_maxrss``) at the end. ``--batch-sizes`` also times requests of those many new graphs by the
per-graph path and by the stacked one (``batch_min_graphs``; best of five requests, CPU µs per graph): where
:data:`~dippm_nas.predictor.BATCH_MIN_GRAPHS` comes from.

To compare two versions of the code on the same machine and load, run it once from each checkout
(``PYTHONPATH=<checkout> python benchmarks/speed/bench_predict_space.py``), back to back.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from benchmarks._common import load_average, machine, space_items, write_text  # noqa: E402


def _paths_by_size(graphs: list[Any], args: Any, sizes: list[int], set_predictor: Any, get_predictor: Any,
                   clear_graph_facts: Any) -> dict[str, dict[str, float]]:
    """CPU µs per graph of requests of ``n`` new graphs, per-graph path and stacked path (best of five)."""
    res: dict[str, dict[str, float]] = {}
    for n in sizes:
        row = {}
        for label, batch_min in (("per_graph", 10**9), ("stacked", 1)):
            best = float("inf")
            for rep in range(5):
                clear_graph_facts()
                set_predictor(args.device, None)
                predictor = get_predictor(args.device)
                predictor.batch_min_graphs = batch_min
                chunk = [graphs[(rep * n + i) % len(graphs)] for i in range(n)]
                c0 = time.process_time()
                predictor.predict_graphs(chunk, mig=not args.no_mig)
                best = min(best, (time.process_time() - c0) / n)
            row[label] = best * 1e6
        res[str(n)] = row
        print(f"requests of {n:4d}: per-graph path {row['per_graph']:7.0f} µs/graph, stacked {row['stacked']:7.0f} "
              f"µs/graph (CPU)", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=1000)
    ap.add_argument("--space", default="mbconv")
    ap.add_argument("--device", default="a100-sxm4-40gb")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-mig", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="block capture processes")
    ap.add_argument("--batch-sizes", default="", help="comma-separated request sizes to time both paths at")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    import dippm_nas
    from dippm_nas.cache import ConversionCache
    from dippm_nas.capture import assemble_many
    from dippm_nas.predictor import set_predictor

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    store = ConversionCache(f"sqlite:///{Path(tempfile.mkdtemp(prefix='dippm-bench-predict-')) / 'cache.sqlite'}")
    items = space_items(args.space, args.seed, args.candidates)
    graphs = [r.graph for r in assemble_many(items, workers=args.workers, cache=store) if r.ok]
    store.close()
    print(f"machine: {machine()}; {len(graphs)} {args.space} graphs (median "
          f"{statistics.median(g.num_nodes for g in graphs):.0f} nodes); {load_average()}", flush=True)

    import dippm_nas.prior

    # absent from versions before it (run this script against an older checkout to compare): no "new" figure then
    clear_graph_facts = getattr(dippm_nas.prior, "clear_graph_facts", None)
    rows: dict[str, list[tuple[float, float]]] = {"predict_graphs": [], "predict_graphs new": [], "network": []}
    for rep in range(args.repeats * (2 if clear_graph_facts is not None else 1)):
        new = clear_graph_facts is not None and rep % 2 == 1
        if new:
            clear_graph_facts()
        set_predictor(args.device, None)  # a fresh predictor: no cached features or predictions
        predictor = dippm_nas.get_predictor(args.device)
        w0, c0 = time.perf_counter(), time.process_time()
        predictor.predict_graphs(graphs, mig=not args.no_mig)
        rows["predict_graphs new" if new else "predict_graphs"].append((time.perf_counter() - w0,
                                                                       time.process_time() - c0))
        if hasattr(predictor, "predict_log_full") and not new:
            feats = [predictor.features(g) for g in graphs[-4000:]]  # held by its feature cache
            w0, c0 = time.perf_counter(), time.process_time()
            predictor.predict_log_full(feats)
            rows["network"].append((time.perf_counter() - w0, time.process_time() - c0))
    out: dict[str, Any] = {"machine": machine(), "args": vars(args), "graphs": len(graphs)}
    for name, runs in rows.items():
        if not runs:
            continue
        n = len(graphs) if name != "network" else min(len(graphs), 4000)
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        out[name] = {"graphs_per_s_wall": n / wall, "graphs_per_s_cpu": n / cpu, "cpu_share": cpu / wall}
        print(f"{name:19s} {n / wall:7.0f} graphs/s (wall), {n / cpu:7.0f} graphs/s (CPU time), CPU share "
              f"{cpu / wall:.2f}", flush=True)
    if "network" in out:
        for name in (n for n in ("predict_graphs", "predict_graphs new") if n in out):
            rest_us = (1.0 / out[name]["graphs_per_s_cpu"] - 1.0 / out["network"]["graphs_per_s_cpu"]) * 1e6
            out[name]["non_network_us_per_graph"] = rest_us
            print(f"non-network ({name}): {rest_us:.0f} µs CPU per graph")
    sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    if sizes and clear_graph_facts is not None:
        out["batch_sizes"] = _paths_by_size(graphs, args, sizes, set_predictor, dippm_nas.get_predictor,
                                            clear_graph_facts)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    out["peak_rss_mib"] = peak_mib
    print(f"peak RSS {peak_mib:.0f} MiB")
    print(load_average())
    if args.json:
        write_text(args.json, json.dumps(out, indent=1), "--json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
