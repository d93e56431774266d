"""A new search-space candidate's graph assembled from cached blocks, against capturing it whole.

Usage::

    python benchmarks/speed/bench_assembly.py [--quick] [--candidates 100] [--spaces mbconv,resnet] [--batch 8]
        [--dtype float32] [--workers 2] [--predict-many 10000] [--predict-space mbconv] [--cached-only]
        [--cached-repeats 50] [--cli-repeats 5] [--json OUT.json]

Per registered space that assembles from blocks (``search_spaces.BlockSearchSpace``), on ``--candidates``
distinct random configs (the space's sampler, seed 0.., batch ``--batch``, dtype ``--dtype``), in one
process with a fresh conversion cache, all measured with ``time.perf_counter`` on this machine:

- ``blocks``: distinct blocks of those candidates; the wall time of capturing the blocks of every space
  (one ``assemble_many`` call with ``--workers`` processes: the one-time cost a search pays per distinct block);
- ``assembled_ms``: per candidate, :func:`dippm_nas.capture.assemble` with its blocks cached (median of 3 calls
  per candidate, then the median and the largest over candidates). No per-candidate result is kept between
  calls: each call validates the config, plans, looks up every block and stitches the graph, as for a
  candidate never seen; ``sql_ms`` is the same with the process's decoded blocks dropped first, so each
  candidate's blocks are read back from the conversion cache (a new search process on a warm cache);
- ``whole_s``: per candidate, ``capture(model, spec, cache=False)``: its ``convert_seconds`` (``torch.export`` +
  Relax + graph build; building the model is not counted), in ``--workers`` processes (one ``capture_many``
  call for all spaces);
- ``ratio``: median ``whole_s`` / median ``assembled_ms``; ``identical``: candidates whose assembled graph has the
  whole capture's ``structural_hash`` (recomputed from the graph's JSON, not taken from the assembly shortcut),
  nodes and parameter count.

Then ``--predict-many`` candidates of ``--predict-space`` (resolution 256, float16, batch 256: the Accel-NASBench
setting of the A100 checkpoint for ``mbconv``) through ``dippm_nas.predict_many`` on ``--device``, end to end, as
``functools.partial(search_spaces.build_model, space, config)`` items (nothing is built or exported): first with
a cold cache (its blocks are captured in the call), then a second set of new candidates whose blocks are all
cached; each with its wall time, its CPU time (this process and the capture workers) and the process's peak RSS
so far. Then, on a third set, the warm path's parts in CPU time: the block reads from the conversion cache (the
process's decoded blocks dropped first), ``assemble_many`` with the blocks decoded, and the predictor's
``predict_graphs`` (the prior + coarsening + features + GNN + MIG advice on graphs it never saw); the share of
node objects the assembled graphs share; and the network alone (``predict_log_full``: the ensemble's chunked
forward) on the features of the last 4,000 of those graphs. The end-to-end line reads::

    10,000 candidates warm: <s> s (<s> s CPU); cold: <s> s (<s> s CPU); peak RSS <MiB> MiB

Last (``--cached-repeats`` > 0, or alone with ``--cached-only``), each in a fresh cache directory: a single cached
``predict`` (``dippm_nas.predict`` of the ``mbconv`` preset ``efficientnet_b0_relu`` built as a module, its blocks
cached; wall and CPU medians) and a cached CLI ``predict`` (``python -m dippm_nas predict`` of a module SPEC whose
graph is cached, in a new process each run: wall and CPU medians), each line with the command it timed.

The load average is printed with each space (the machine may be shared). The last line reads::

    assembly: <ms> ms per new candidate (worst space), <ratio>x under whole capture, <k>/<n> hash-identical

with the largest per-space median ``assembled_ms``, the smallest per-space ratio, and the identical count over
all spaces. ``--quick`` is ``--candidates 20 --predict-many 1000``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from benchmarks._common import (CANDIDATE_BATCH_SIZE, CANDIDATE_DTYPE, load_average, machine,  # noqa: E402
                                sampled_configs, write_text)


def _distinct_configs(space: Any, n: int, seed: int, max_tries: int = 50) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    s = seed
    while len(seen) < n and s < seed + n * max_tries:
        cfg = space.sample(s)
        seen.setdefault(json.dumps(cfg, sort_keys=True), cfg)
        s += 1
    return list(seen.values())


def bench_spaces(names: list[str], args: argparse.Namespace, store: Any) -> list[dict[str, Any]]:
    """Per-space figures; blocks and whole models are captured in one process pool each (a pool start costs
    seconds), so block-capture time is reported for all spaces together."""
    import search_spaces as ss
    from dippm_nas import OperatorGraph
    from dippm_nas.capture import assemble, assemble_many, block_key, capture_many, clear_block_memo

    cands: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    keys: dict[str, set[str]] = {}
    for name in names:
        space = ss.get_space(name)
        cfgs = _distinct_configs(space, args.candidates, args.seed)
        cands[name] = [(c, space.input_spec(c, batch_size=args.batch, dtype=args.dtype)) for c in cfgs]
        keys[name] = {block_key(space, b, s) for c, s in cands[name] for b in space.blocks(c).blocks}
    n_blocks = len(set().union(*keys.values()))
    print(f"capturing {n_blocks} distinct blocks of {sum(map(len, cands.values()))} candidates | {load_average()}", flush=True)
    t0 = time.perf_counter()
    first = assemble_many([(name, c, s) for name in names for c, s in cands[name]], workers=args.workers,
                          cache=store, fallback=False)
    blocks_s = time.perf_counter() - t0
    print(f"  {blocks_s:.1f} s ({blocks_s / max(n_blocks, 1):.2f} s per block, {args.workers} workers) | {load_average()}",
          flush=True)
    first_of = iter(first)

    timing: dict[str, dict[str, Any]] = {}
    for name in names:
        rs = [next(first_of) for _ in cands[name]]
        ok = [(c, s) for (c, s), r in zip(cands[name], rs) if r.ok]
        failed = [r.error for r in rs if not r.ok]

        def timed(c: dict[str, Any], s: Any, name: str = name) -> tuple[float, Any]:
            t = time.perf_counter()
            g = assemble(name, c, s, cache=store, fallback=False)
            return time.perf_counter() - t, g

        load = load_average()
        assembled_ms, graphs = [], []
        for c, s in ok:
            runs = [timed(c, s) for _ in range(3)]
            assembled_ms.append(1e3 * statistics.median(t for t, _ in runs))
            graphs.append(runs[0][1])
        clear_block_memo()
        sql_ms = [1e3 * timed(c, s)[0] for c, s in ok]
        timing[name] = {"ok": ok, "failed": failed, "graphs": graphs, "assembled_ms": assembled_ms,
                        "sql_ms": sql_ms, "load": load}

    print(f"capturing the {sum(len(t['ok']) for t in timing.values())} candidates whole | {load_average()}", flush=True)
    # builders, not modules: the workers build each model (sending hundreds of modules to a pool exhausts
    # file descriptors); the capture's own time (export + convert + graph build) excludes the build
    builders = [(functools.partial(ss.build_model, name, c), s) for name in names for c, s in timing[name]["ok"]]
    t0 = time.perf_counter()
    whole = iter(capture_many(builders, workers=args.workers, cache=False, progress=False))
    whole_total_s = time.perf_counter() - t0
    print(f"  {whole_total_s:.1f} s | {load_average()}", flush=True)

    rows = []
    for name in names:
        t = timing[name]
        rs = [next(whole) for _ in t["ok"]]
        whole_s = [r.graph.convert_seconds for r in rs if r.ok]
        identical = 0
        for g, r in zip(t["graphs"], rs):
            if not r.ok:
                t["failed"].append(f"whole capture: {r.error}")
                continue
            slow = OperatorGraph.from_dict(g.to_dict()).structural_hash()
            identical += (g.structural_hash() == slow == r.graph.structural_hash()
                          and [n.to_dict() for n in g.nodes] == [n.to_dict() for n in r.graph.nodes]
                          and g.param_count == r.graph.param_count)
        med_ms = statistics.median(t["assembled_ms"]) if t["assembled_ms"] else float("nan")
        med_whole = statistics.median(whole_s) if whole_s else float("nan")
        row = {
            "space": name, "candidates": len(cands[name]), "distinct_blocks": len(keys[name]),
            "assembled_ms_median": med_ms, "assembled_ms_max": max(t["assembled_ms"], default=float("nan")),
            "sql_ms_median": statistics.median(t["sql_ms"]) if t["sql_ms"] else float("nan"),
            "whole_s_median": med_whole, "ratio": med_whole * 1e3 / med_ms,
            "nodes_median": statistics.median(g.num_nodes for g in t["graphs"]) if t["graphs"] else 0,
            "identical": identical, "failed": t["failed"][:3], "load_while_assembling": t["load"],
        }
        rows.append(row)
        print(f"{name:15s} {row['candidates']:4d} cands {row['nodes_median']:6.0f} nodes {len(keys[name]):5d} blocks | "
              f"assembled {med_ms:6.2f} ms (max {row['assembled_ms_max']:6.2f}, from SQL {row['sql_ms_median']:6.2f}) "
              f"| whole {med_whole:5.2f} s | {row['ratio']:6.0f}x | {identical}/{row['candidates']} identical | "
              f"{t['load']}", flush=True)
        for e in t["failed"][:3]:
            print(f"    failed: {e[:300]}", flush=True)
    return rows


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended (the block-capture workers)."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def bench_predict_many(args: argparse.Namespace, store: Any) -> dict[str, Any]:
    import search_spaces as ss
    import dippm_nas
    from dippm_nas.capture import assemble_many, clear_block_memo

    space = ss.get_space(args.predict_space)
    n = args.predict_many

    def configs(offset: int, count: int) -> list[dict[str, Any]]:
        return sampled_configs(space, args.seed + offset, count)

    spec_of = functools.partial(space.input_spec, batch_size=CANDIDATE_BATCH_SIZE, dtype=CANDIDATE_DTYPE)
    predictor = dippm_nas.get_predictor(args.device)  # loaded before timing (once per process)
    out: dict[str, Any] = {"space": args.predict_space, "candidates": n, "device": args.device}
    for label, offset in (("cold", 10_000_000), ("warm", 20_000_000)):
        cfgs = configs(offset, n)
        items = [(functools.partial(ss.build_model, args.predict_space, c), spec_of(c)) for c in cfgs]
        load = load_average()
        gc.collect()
        t0, c0 = time.perf_counter(), _cpu()
        preds = dippm_nas.predict_many(items, args.device, workers=args.workers, cache=store)
        seconds, cpu = time.perf_counter() - t0, _cpu() - c0
        bad = [p for p in preds if not isinstance(p, dippm_nas.Prediction)]
        out[label] = {"seconds": seconds, "cpu_s": cpu, "failed": len(bad), "load_before": load, "load_after": load_average(),
                      "peak_rss_mib": _peak_rss_mib(), "latency_source": preds[0].latency_source if not bad else None}
        del preds, items
        print(f"predict_many {n} {args.predict_space} candidates ({label} blocks): {seconds:.1f} s end to end "
              f"({cpu:.1f} s CPU, capture workers included), {len(bad)} failed, peak RSS {_peak_rss_mib():.0f} MiB "
              f"| {load} -> {load_average()}", flush=True)
    # the warm path's parts, on new candidates: block reads from the conversion cache (the process's decoded
    # blocks dropped first), assembly, the predictor
    cfgs = configs(30_000_000, n)
    sitems = [(args.predict_space, c, spec_of(c)) for c in cfgs]
    clear_block_memo()
    gc.collect()
    c0 = _cpu()
    first = assemble_many(sitems, workers=args.workers, cache=store)  # blocks read from SQL, then assembled
    c1 = _cpu()
    del first
    gc.collect()
    c2 = _cpu()
    results = assemble_many(sitems, workers=args.workers, cache=store)  # the blocks decoded: assembly alone
    c3 = _cpu()
    graphs = [r.graph for r in results if r.ok]
    del results
    total_nodes = sum(g.num_nodes for g in graphs)
    distinct_nodes = len({id(nd) for g in graphs for nd in g.nodes})  # placed blocks shared between graphs
    predictor.predict_graphs(graphs, mig=True)
    c4 = _cpu()
    assemble_s, cache_s, predict_s = c3 - c2, max(0.0, (c1 - c0) - (c3 - c2)), c4 - c3
    # the network alone on the features the predictor just computed (the last graphs: its feature cache holds them)
    net_graphs = graphs[-min(len(graphs), 4000):]
    feats = [predictor.features(g) for g in net_graphs] if hasattr(predictor, "predict_log_full") else []
    t3 = time.perf_counter()
    if feats:
        predictor.predict_log_full(feats)
    t4 = time.perf_counter()
    out["split"] = {"assemble_cpu_s": assemble_s, "assemble_ms_per_candidate": 1e3 * assemble_s / n,
                    "cache_cpu_s": cache_s, "predict_cpu_s": predict_s,
                    "predict_graphs_per_cpu_s": len(graphs) / predict_s,
                    "network_graphs": len(feats), "network_graphs_per_s": len(feats) / (t4 - t3) if feats else None,
                    "nodes_median": statistics.median(g.num_nodes for g in graphs), "nodes": total_nodes,
                    "distinct_node_objects": distinct_nodes}
    print(f"  apart, {n} new candidates, CPU time: assembly {assemble_s:.2f} s ({1e3 * assemble_s / n:.3f} ms each), "
          f"block reads from the conversion cache {cache_s:.2f} s, predictor (predict_graphs) {predict_s:.1f} s "
          f"({len(graphs) / predict_s:.0f} graphs/s, {out['split']['nodes_median']:.0f} nodes median, "
          f"{type(predictor).__name__}) | {load_average()}", flush=True)
    print(f"  node objects: {distinct_nodes:,} distinct of the {total_nodes:,} nodes of those graphs "
          f"({100 * (1 - distinct_nodes / max(total_nodes, 1)):.0f} % shared between graphs)", flush=True)
    if feats:
        print(f"  the network alone (ensemble forward, chunked, on {len(feats)} of those graphs' features): "
              f"{len(feats) / (t4 - t3):.0f} graphs/s", flush=True)
    print(f"{n:,} candidates warm: {out['warm']['seconds']:.1f} s ({out['warm']['cpu_s']:.1f} s CPU); cold: "
          f"{out['cold']['seconds']:.1f} s ({out['cold']['cpu_s']:.1f} s CPU); peak RSS "
          f"{out['warm']['peak_rss_mib']:.0f} MiB", flush=True)
    return out


_CLI_MODEL = """import search_spaces


def mbconv_b0():
    return search_spaces.build_model("mbconv", search_spaces.get_space("mbconv").preset("efficientnet_b0_relu"))
"""


def bench_cached_predict(args: argparse.Namespace) -> dict[str, Any]:
    """A single cached ``predict`` and a cached CLI ``predict``, each in a fresh cache directory filled by a first
    call; medians of ``--cached-repeats`` calls, wall (the commands are printed with the figures)."""
    import subprocess

    import search_spaces as ss
    import dippm_nas
    from dippm_nas import InputSpec

    root = Path(tempfile.mkdtemp(prefix="dippm-bench-cached-"))
    os.environ["DIPPM_NAS_CACHE_DIR"] = str(root / "api")  # the process's default cache, before its first use
    spec = InputSpec(shape=(3, 224, 224), batch_size=32, dtype="float16")
    model = ss.build_model("mbconv", ss.get_space("mbconv").preset("efficientnet_b0_relu"))
    dippm_nas.predict(model, spec, args.device)  # fills the cache (its blocks) and loads the predictor
    wall, cpu = [], []
    for _ in range(args.cached_repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        dippm_nas.predict(model, spec, args.device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    api_ms, api_cpu_ms = 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)
    print(f"cached predict: {api_ms:.2f} ms wall, {api_cpu_ms:.2f} ms CPU (medians of {args.cached_repeats}; "
          f"dippm_nas.predict(search_spaces."
          f"build_model('mbconv', preset 'efficientnet_b0_relu'), InputSpec((3, 224, 224), batch_size=32, "
          f"dtype='float16'), {args.device!r}) on a cache that holds its blocks) | {load_average()}", flush=True)
    (root / "cli_model.py").write_text(_CLI_MODEL)
    cmd = [sys.executable, "-m", "dippm_nas", "predict", "cli_model:mbconv_b0", "--shape", "3,224,224", "--batch",
           "32", "--dtype", "float16", "--device", args.device, "--json"]
    env = {**os.environ, "DIPPM_NAS_CACHE_DIR": str(root / "cli"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    runs, cpu = [], []
    for i in range(1 + args.cli_repeats):  # the first run captures the model and fills the cache
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=root, env=env, capture_output=True, check=True)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:
            runs.append(time.perf_counter() - t0)
            cpu.append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    cli_s, cli_cpu_s = statistics.median(runs), statistics.median(cpu)
    print(f"cached CLI predict: {cli_s:.2f} s wall, {cli_cpu_s:.2f} s CPU (medians of {len(runs)}; cd {root} && "
          f"DIPPM_NAS_CACHE_DIR="
          f"{root / 'cli'} python {' '.join(cmd[1:])}; the model's graph in the cache) | {load_average()}", flush=True)
    return {"predict_ms": api_ms, "predict_cpu_ms": api_cpu_ms, "cli_s": cli_s, "cli_cpu_s": cli_cpu_s,
            "cli_command": cmd[1:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="--candidates 20 --predict-many 1000")
    ap.add_argument("--candidates", type=int, default=None, help="random configs per space (default 100)")
    ap.add_argument("--spaces", default=None, help="comma-separated spaces (default: every one that opts in)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--workers", type=int, default=2, help="capture processes (default 2)")
    ap.add_argument("--predict-many", type=int, default=None, help="candidates of the end-to-end run (default 10000; "
                                                                     "0 skips it)")
    ap.add_argument("--predict-space", default="mbconv")
    ap.add_argument("--device", default="a100-sxm4-40gb")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cached-only", action="store_true", help="only the cached predict and cached CLI predict figures")
    ap.add_argument("--cached-repeats", type=int, default=50, help="calls of the cached predict figure (0 skips it)")
    ap.add_argument("--cli-repeats", type=int, default=5, help="runs of the cached CLI predict figure")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    args.candidates = args.candidates or (20 if args.quick else 100)
    if args.predict_many is None:
        args.predict_many = 1000 if args.quick else 10_000

    import torch

    import search_spaces as ss
    from dippm_nas.cache import ConversionCache
    from dippm_nas.capture import supports_assembly

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if args.cached_only:
        print(f"machine: {machine()}; {load_average()}")
        cached = bench_cached_predict(args)
        if args.json:
            write_text(args.json, json.dumps({"machine": machine(), "args": vars(args), "cached": cached},
                                             indent=1))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="dippm-bench-assembly-"))
    store = ConversionCache(f"sqlite:///{tmp / 'cache.sqlite'}")  # a cold conversion cache
    names = args.spaces.split(",") if args.spaces else [n for n in ss.list_spaces() if supports_assembly(n)]
    print(f"machine: {machine()}; {load_average()}")
    print(f"{args.candidates} random configs per space, batch {args.batch}, {args.dtype}, {args.workers} capture "
          f"workers; cache {store.url}", flush=True)
    t_start = time.perf_counter()
    rows = bench_spaces(names, args, store)
    pm = bench_predict_many(args, store) if args.predict_many else None
    cached = bench_cached_predict(args) if args.cached_repeats else None
    worst = max(rows, key=lambda r: r["assembled_ms_median"])
    ratio = min(r["ratio"] for r in rows)
    k, n = sum(r["identical"] for r in rows), sum(r["candidates"] for r in rows)
    total = time.perf_counter() - t_start
    print(f"total {total:.0f} s; worst space {worst['space']} ({worst['assembled_ms_median']:.2f} ms); smallest "
          f"ratio {min(rows, key=lambda r: r['ratio'])['space']}; {load_average()}")
    if args.json:
        write_text(args.json, json.dumps({"machine": machine(), "args": vars(args), "spaces": rows,
                                          "predict_many": pm, "cached": cached, "total_s": total}, indent=1))
    store.close()
    print(f"assembly: {worst['assembled_ms_median']:.2f} ms per new candidate (worst space), {ratio:.0f}x under "
          f"whole capture, {k}/{n} hash-identical")
    return 0 if k == n else 1


if __name__ == "__main__":
    sys.exit(main())
