"""``dippm-nas inspect SPEC``: capture a model and print its operator graph summary."""

from __future__ import annotations

import argparse
import json
import time

from dippm_nas.capture import capture
from dippm_nas.spec import InputSpec, parse_shape

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="capture a model and print its operator graph (nodes, edges, ops, GFLOPs, params)",
        description="Capture SPEC (torchvision:NAME, timm:NAME, timm-reparam:NAME, a .onnx file, or "
                    "package.module:callable) to a Relax operator graph and summarise it.",
    )
    p.add_argument("spec", metavar="SPEC",
                   help="torchvision:NAME | timm:NAME | timm-reparam:NAME | path.onnx | package.module:callable")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--shape", default="3,224,224", help="per-sample input shape C,H,W (default 3,224,224)")
    p.add_argument("--dtype", default="float32", help="float32 | float16 | bfloat16 (default float32)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the conversion cache")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = InputSpec(shape=parse_shape(args.shape), batch_size=args.batch, dtype=args.dtype)
    t0 = time.perf_counter()
    graph = capture(args.spec, spec, cache=not args.no_cache)
    seconds = time.perf_counter() - t0
    summary = graph.summary()
    out = {
        "num_nodes": summary["num_nodes"],
        "num_edges": summary["num_edges"],
        "gflops": summary["gflops"],
        "params": summary["params"],
        "ops": summary["ops"],
        "mode": summary["mode"],
        "seconds": seconds,
        "cache_hit": graph.cache_hit,
        "gmacs": summary["gmacs"],
        "unknown_ops": summary["unknown_ops"],
        "structural_hash": graph.structural_hash(),
    }
    if args.json:
        print(json.dumps(out))
        return 0
    sf = graph.static_features()
    print(f"model        {args.spec}   input {tuple(spec.batched_shapes()['x'])} {spec.dtype}")
    print(f"graph        {out['num_nodes']} nodes, {out['num_edges']} dataflow edges, depth {sf.depth}")
    print(f"compute      {out['gflops']:.3f} GFLOPs ({out['gmacs']:.3f} GMACs)")
    print(f"params       {out['params']:,} ({sf.param_bytes / 2**20:.1f} MiB)   "
          f"activations {sf.activation_bytes / 2**20:.1f} MiB written")
    print(f"conversion   mode {out['mode']}, {seconds:.3f} s, cache {'hit' if out['cache_hit'] else 'miss'}")
    if out["unknown_ops"]:
        print(f"unknown ops  {out['unknown_ops']} (generic estimates, flagged)")
    print("ops          " + ", ".join(f"{op} x{n}" for op, n in out["ops"].items()))
    return 0
