"""``dippm-nas inspect SPEC [--batch N...] [--dtype T...] [--shape C,H,W | --input ...] [--json]``: capture a model
and print its operator graph summary, one per batch size and dtype."""

from __future__ import annotations

import argparse
import time
from typing import Any

from dippm_nas.cli._grammar import Spinner, add_json_flag, add_progress_flag, json_text, progress_enabled
from dippm_nas.cli._inputs import add_input_args, describe, input_specs

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="capture a model and print its operator graph (nodes, edges, ops, GFLOPs, params)",
        description="Capture SPEC (torchvision:NAME, timm:NAME, timm-reparam:NAME, timm-results:NAME, a .onnx file, or "
                    "package.module:callable) to a Relax operator graph and summarise it, once per --batch and "
                    "--dtype. --json prints a JSON list with one object per graph.",
    )
    p.add_argument("spec", metavar="SPEC",
                   help="torchvision:NAME | timm:NAME | timm-reparam:NAME | timm-results:NAME | path.onnx | "
                        "package.module:callable")
    add_input_args(p)
    p.add_argument("--no-cache", action="store_true", help="do not read or write the conversion cache")
    add_json_flag(p, "a list with one object per graph")
    add_progress_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    specs = input_specs(args)

    from dippm_nas.capture import capture

    outs: list[dict[str, Any]] = []
    for spec in specs:
        t0 = time.perf_counter()
        with Spinner(f"capturing {args.spec} ({describe(spec)})", enabled=progress_enabled(args) and not args.json):
            graph = capture(args.spec, spec, cache=not args.no_cache)
        seconds = time.perf_counter() - t0
        summary = graph.summary()
        out = {
            "model": args.spec,
            "input": describe(spec),
            "batch_size": spec.batch_size,
            "dtype": spec.dtype,
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
        outs.append(out)
        if args.json:
            continue
        sf = graph.static_features()
        if len(outs) > 1:
            print()
        print(f"model        {args.spec}   input {out['input']}")
        print(f"graph        {out['num_nodes']} nodes, {out['num_edges']} dataflow edges, depth {sf.depth}")
        print(f"compute      {out['gflops']:.3f} GFLOPs ({out['gmacs']:.3f} GMACs)")
        print(f"params       {out['params']:,} ({sf.param_bytes / 2**20:.1f} MiB)   "
              f"activations {sf.activation_bytes / 2**20:.1f} MiB written")
        print(f"conversion   mode {out['mode']}, {seconds:.3f} s, cache {'hit' if out['cache_hit'] else 'miss'}")
        if out["unknown_ops"]:
            print(f"unknown ops  {out['unknown_ops']} (generic estimates, flagged)")
        print("ops          " + ", ".join(f"{op} x{n}" for op, n in out["ops"].items()))
    if args.json:
        print(json_text(outs))
    return 0
