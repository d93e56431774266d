"""Predictor speed: batched GNN graphs/s, cold end-to-end graphs/s, cached ``predict`` ms.

Usage::

    python benchmarks/speed/bench_predictor.py --data DATASET [--checkpoint CKPT.pt --device DEV] [--graphs 1024]
        [--threads 1,2] [--min-nodes 250] [--gnn-only] [--reference]

DATASET is a dataset file (SQLite or JSONL export) whose graphs are used as inputs; its labels are not
read. Figures are medians of ``--repeats`` runs after a warm-up, on this machine (printed first), with
the size of the graphs they ran on: mean operator nodes (the captured graph) and mean kernel nodes
(the coarsened graph the GNN runs on). ``--min-nodes`` / ``--max-nodes`` select graphs by operator
nodes, e.g. ``--min-nodes 250`` for the "~300-node graphs" figure.

- ``gnn_graphs_per_s``: one batched ensemble pass (``predict_log``) over ``--graphs`` graphs whose features
  are cached (what a search pays for architectures it has seen, or after the features are computed),
  once per ``--threads`` value; ``cpu_graphs_per_s`` divides by the process CPU time instead of the wall
  time and ``cpu_share`` is CPU / wall: with one thread a share well below 1 means other processes
  share the core and the wall figure understates the pass;
- ``gnn_forward_graphs_per_s`` (``--reference``): the same pass through ``collate`` + ``SageEnsemble.forward``,
  the training path (one whole-batch graph, no chunking);
- ``cold_graphs_per_s``: ``predict_graphs`` on graphs never seen (analytic prior + coarsening + features +
  GNN, no MIG advice), in batches of ``--graphs``. A host prior with an operator table memoises each
  operator record's time, so graphs sharing operators with graphs seen before (candidates of one search
  space) are cheaper; the second figure clears that memo first (the first graphs of a process);
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from benchmarks._common import machine, median_seconds  # noqa: E402


def _timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall seconds and median process CPU seconds of ``fn`` over ``repeats`` runs after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="dataset file whose graphs are the inputs")
    ap.add_argument("--checkpoint", default=None, help="checkpoint .pt (default: the shipped one of --device)")
    ap.add_argument("--device", default="a100-sxm4-40gb")
    ap.add_argument("--graphs", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts for the GNN pass")
    ap.add_argument("--min-nodes", type=int, default=0, help="only graphs with at least this many operator nodes")
    ap.add_argument("--max-nodes", type=int, default=None, help="only graphs with at most this many operator nodes")
    ap.add_argument("--chunk-nodes", type=int, default=None, help="node budget per chunk of the inference pass")
    ap.add_argument("--reference", action="store_true", help="also time collate + forward (the training path)")
    ap.add_argument("--gnn-only", action="store_true", help="skip the cold and cached predict figures")
    args = ap.parse_args()
    threads = [int(t) for t in str(args.threads).split(",") if t.strip()]

    import torch

    torch.set_num_threads(threads[0])
    from dippm_nas.dataset import load_measurements
    from dippm_nas.predictor import get_predictor
    from dippm_nas.predictor import INFER_CHUNK_NODES, GnnPredictor, collate

    from dippm_nas.devices import resolve_device
    from dippm_nas.errors import UnsupportedDtypeError

    pred = GnnPredictor.load(args.checkpoint, device=args.device) if args.checkpoint else get_predictor(args.device)
    dev = resolve_device(args.device)

    def runs(dtype: str) -> bool:
        try:
            dev.check_dtype(dtype)
            return True
        except UnsupportedDtypeError:
            return False

    seen, graphs, skipped = set(), [], 0
    for mg in load_measurements(args.data):
        g = mg.graph
        if g.num_nodes < args.min_nodes or (args.max_nodes is not None and g.num_nodes > args.max_nodes):
            continue
        if not runs(g.spec.dtype):  # e.g. float16 graphs on host-cpu: the prior (a feature) refuses them
            skipped += 1
            continue
        h = g.structural_hash()
        if h not in seen:
            seen.add(h)
            graphs.append(g)
        if len(graphs) >= 2 * args.graphs:
            break
    if not graphs:
        print(f"no graph of {args.data} has {args.min_nodes}..{args.max_nodes or 'any'} operator nodes and a dtype "
              f"{args.device} runs ({skipped} rows of other dtypes skipped)")
        return 1
    warm, cold = graphs[: args.graphs], graphs[args.graphs: 2 * args.graphs]
    chunk = args.chunk_nodes or INFER_CHUNK_NODES
    print(f"machine: {machine()}")
    feats = [pred.features(g) for g in warm]
    ops = [g.num_nodes for g in warm]
    kern = [len(f.x) for f in feats]
    sel = f"operator nodes >= {args.min_nodes}" if args.min_nodes else "all sizes"
    if args.max_nodes is not None:
        sel += f", <= {args.max_nodes}"
    if skipped:
        sel += f"; {skipped} rows of dtypes {args.device} cannot run skipped"
    print(f"predictor: {pred!r}, {pred.meta.members} members, hidden {pred.meta.hidden}, "
          f"{pred.meta.layers} SAGE blocks")
    print(f"graphs: {len(warm)} unique graphs of {Path(args.data).name} ({sel}); operator nodes mean "
          f"{statistics.mean(ops):.1f} (min {min(ops)}, max {max(ops)}); kernel nodes after coarsening mean "
          f"{statistics.mean(kern):.1f} (min {min(kern)}, max {max(kern)}); chunk {chunk} kernel nodes")
    for nt in threads:
        torch.set_num_threads(nt)
        w, c = _timed(lambda: pred.predict_log(feats, chunk_nodes=chunk), args.repeats)
        print(f"gnn_graphs_per_s      {len(feats) / w:10.0f}   ({nt} thread{'s' if nt > 1 else ''}; "
              f"cpu_graphs_per_s {len(feats) / c:.0f}, cpu_share {c / w:.2f})")
        if args.reference:
            def ref() -> None:
                with torch.no_grad():
                    pred.model(collate(feats))

            w, c = _timed(ref, max(1, args.repeats // 2))
            print(f"gnn_forward_graphs_per_s {len(feats) / w:7.0f}   ({nt} thread{'s' if nt > 1 else ''}; collate + "
                  f"forward, the training path; cpu_graphs_per_s {len(feats) / c:.0f}, cpu_share {c / w:.2f})")
    torch.set_num_threads(threads[0])
    if args.gnn_only:
        return 0
    if len(cold) >= 16:
        tables = list(getattr(pred.prior_params, "op_tables", {}).values())
        half = len(cold) // 2
        for label, part, clear in (("", cold[:half], False), (" (op-table memo cleared first)", cold[half:], True)):
            if clear and not tables:
                break
            for tb in tables if clear else ():
                tb.clear_memo()
            t0 = time.perf_counter()
            pred.predict_graphs(part, mig=False)
            dt = time.perf_counter() - t0
            print(f"cold_graphs_per_s     {len(part) / dt:10.0f}   (prior + features + GNN, {len(part)} unseen graphs"
                  f"{label})")

    import search_spaces as ss

    from dippm_nas import InputSpec, predict

    cfg = ss.get_space("mbconv").default_config()
    model = ss.build_model("mbconv", cfg)
    dtype = "float16" if runs("float16") else "float32"  # host-cpu: no half-precision peak in its catalogue entry
    spec = InputSpec(shape=(3, 224, 224), batch_size=32, dtype=dtype)
    predict(model, spec, device=args.device)  # capture once (fills the conversion cache) and warm the LRU
    t = median_seconds(lambda: predict(model, spec, device=args.device), max(args.repeats, 20))
    print(f"cached_predict_ms     {t * 1e3:10.2f}   (predict(model, spec), {dtype}: model key + cache lookup + "
          f"cached prediction)")
    g = warm[0]
    t = median_seconds(lambda: predict(g, device=args.device), max(args.repeats, 20))
    print(f"cached_graph_predict_ms {t * 1e3:8.3f}   (predict(graph))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
