"""The batched passes against the per-graph ones on new search-space candidates, ms per graph of CPU time.

Usage::

    python benchmarks/speed/bench_batched_passes.py [--candidates 300] [--space mbconv] [--device a100-sxm4-40gb]
        [--repeats 3]

``--candidates`` random configs of ``--space`` at the Accel-NASBench setting (resolution 256, float16, batch 256)
are assembled from blocks (the blocks captured first, into a fresh conversion cache, outside the timing). Per
repeat the same configs are assembled again into new graph objects for each pass (nothing cached on a graph;
the blocks' objects are shared, as in a search), and each pass runs once on all of them:

- ``featurize`` per graph against ``featurize_many`` (the prior's estimates given to both, computed outside the
  timing);
- ``activation_liveness(retention=True, include_inputs=False)`` per graph against ``activation_liveness_many``;
- ``gpu_memory_parts`` per graph against ``gpu_memory_parts_many`` (on the batched livenesses).

Each figure is the median over ``--repeats`` of this process's CPU time (``time.process_time``) per graph; the
load average is printed before and after. The batched passes' results equal the per-graph ones
(``tests/features/test_features_many.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from benchmarks._common import load_average, machine, space_items  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=300)
    ap.add_argument("--space", default="mbconv")
    ap.add_argument("--device", default="a100-sxm4-40gb")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch

    from dippm_nas.cache import ConversionCache
    from dippm_nas.capture import assemble_many
    from dippm_nas.devices import resolve_device
    from dippm_nas.features import featurize, featurize_many
    from dippm_nas.graph import OperatorGraph
    from dippm_nas.prior import (activation_liveness, activation_liveness_many, estimate, gpu_memory_parts,
                                 gpu_memory_parts_many)

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    store = ConversionCache(f"sqlite:///{Path(tempfile.mkdtemp(prefix='dippm-bench-batched-')) / 'cache.sqlite'}")
    items = space_items(args.space, args.seed, args.candidates)

    def fresh() -> list[OperatorGraph]:
        return [r.graph for r in assemble_many(items, workers=1, cache=store) if r.ok]

    dev = resolve_device(args.device)
    graphs = fresh()
    ests = [estimate(g, dev) for g in graphs]
    featurize_many(fresh(), dev, estimates=ests)  # warm: the blocks' head encodings, imports
    print(f"machine: {machine()}; {len(graphs)} {args.space} graphs (median "
          f"{statistics.median(g.num_nodes for g in graphs):.0f} nodes); {load_average()}", flush=True)
    ctx, ws = dev.runtime_baseline_mib, dev.cublas_workspace_mib

    def per_graph_parts(gs: list[OperatorGraph]) -> object:
        return [gpu_memory_parts(g, activation_liveness(g, retention=True, include_inputs=False), context_mib=ctx,
                                 cublas_workspace_mib=ws, uses_cublas=True, uses_cudnn=True) for g in gs]

    def batched_parts(gs: list[OperatorGraph]) -> object:
        lv = activation_liveness_many(gs, retention=True, include_inputs=False)
        return gpu_memory_parts_many(gs, lv, context_mib=ctx, cublas_workspace_mib=ws,
                                     uses_cublas=[True] * len(gs), uses_cudnn=[True] * len(gs))

    passes: dict[str, Callable[[list[OperatorGraph]], object]] = {
        "featurize": lambda gs: [featurize(g, dev, estimate=e) for g, e in zip(gs, ests)],
        "featurize_many": lambda gs: featurize_many(gs, dev, estimates=ests),
        "activation_liveness": lambda gs: [activation_liveness(g, retention=True, include_inputs=False) for g in gs],
        "activation_liveness_many": lambda gs: activation_liveness_many(gs, retention=True, include_inputs=False),
        "liveness + gpu_memory_parts": per_graph_parts,
        "liveness + parts, many": batched_parts,
    }
    times: dict[str, list[float]] = {k: [] for k in passes}
    for _ in range(args.repeats):
        for name, fn in passes.items():
            gs = fresh()
            c0 = time.process_time()
            fn(gs)
            times[name].append((time.process_time() - c0) / len(gs))
    for name, ts in times.items():
        print(f"{name:28s} {statistics.median(ts) * 1e3:7.3f} ms/graph (CPU time)", flush=True)
    print(load_average())
    return 0


if __name__ == "__main__":
    sys.exit(main())
