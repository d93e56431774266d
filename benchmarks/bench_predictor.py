"""Predictor speed: batched GNN graphs/s, cold end-to-end graphs/s, cached ``predict`` ms.

Usage::

    python benchmarks/bench_predictor.py --data DATASET [--checkpoint CKPT.pt] [--graphs 1024] [--threads 2]

DATASET is a dataset file (SQLite or JSONL export) whose graphs are used as inputs; its labels are not
read. Figures are medians of ``--repeats`` runs after a warm-up, on this machine (printed first).

- ``gnn_graphs_per_s``: one batched ensemble pass over ``--graphs`` graphs whose features are cached
  (what a search pays for architectures it has seen, or after the features are computed);
- ``cold_graphs_per_s``: ``predict_graphs`` on graphs never seen (analytic prior + coarsening + features +
  GNN, no MIG advice), in batches of ``--graphs``;
- ``cached_predict_ms``: ``dippm_nas.predict(model, spec)`` on a model whose graph is in the conversion
  cache and whose prediction is in the predictor's LRU (includes the model key and cache lookup and
  the MIG advice, which is cached with the prediction).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import machine, median_seconds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="dataset file whose graphs are the inputs")
    ap.add_argument("--checkpoint", default=None, help="checkpoint .pt (default: the shipped a100-sxm4-40gb one)")
    ap.add_argument("--device", default="a100-sxm4-40gb")
    ap.add_argument("--graphs", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from dippm_nas.dataset import load_measurements
    from dippm_nas.predictor import get_predictor
    from dippm_nas.predictor._gnn import GnnPredictor

    pred = GnnPredictor.load(args.checkpoint, device=args.device) if args.checkpoint else get_predictor(args.device)
    seen, graphs = set(), []
    for mg in load_measurements(args.data):
        h = mg.graph.structural_hash()
        if h not in seen:
            seen.add(h)
            graphs.append(mg.graph)
        if len(graphs) >= 2 * args.graphs:
            break
    warm, cold = graphs[: args.graphs], graphs[args.graphs: 2 * args.graphs]
    print(f"machine: {machine()}")
    print(f"predictor: {pred!r}; {len(warm)} graphs, mean {statistics.mean(len(pred.features(g).x) for g in warm):.1f} "
          f"kernels/graph (operator nodes: {statistics.mean(g.num_nodes for g in warm):.1f})")
    feats = [pred.features(g) for g in warm]
    t = median_seconds(lambda: pred.predict_log(feats), args.repeats)
    print(f"gnn_graphs_per_s      {len(feats) / t:10.0f}   (batched ensemble pass, {pred.meta.members} members, "
          f"hidden {pred.meta.hidden})")
    if len(cold) >= 16:
        t0 = time.perf_counter()
        pred.predict_graphs(cold, mig=False)
        dt = time.perf_counter() - t0
        print(f"cold_graphs_per_s     {len(cold) / dt:10.0f}   (prior + features + GNN, {len(cold)} unseen graphs)")

    import search_spaces as ss

    from dippm_nas import InputSpec, predict

    cfg = ss.get_space("mbconv").default_config()
    model = ss.build_model("mbconv", cfg)
    spec = InputSpec(shape=(3, 224, 224), batch_size=32, dtype="float16")
    predict(model, spec, device=args.device)  # capture once (fills the conversion cache) and warm the LRU
    t = median_seconds(lambda: predict(model, spec, device=args.device), max(args.repeats, 20))
    print(f"cached_predict_ms     {t * 1e3:10.2f}   (predict(model, spec): model key + cache lookup + cached prediction)")
    g = warm[0]
    t = median_seconds(lambda: predict(g, device=args.device), max(args.repeats, 20))
    print(f"cached_graph_predict_ms {t * 1e3:8.3f}   (predict(graph))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
