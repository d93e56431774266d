"""Choose how to serve a decoder: GPU type, GPU count (tensor parallelism), MIG profile, engine, batch limit and KV
dtype, for cost per million generated tokens and energy per token, under time-to-first-token and time-per-output-
token objectives held with a margin of k σ. Prints the Pareto set with each configuration's figures and σ.

    python examples/optuna/llm_serving_config.py --model llama-3-70b --prompt 512 1024 2048 --output 256 512 \\
        --rate 4 --devices h100-sxm5-80gb a100-sxm4-80gb h200-sxm-141gb \\
        --price h100-sxm5-80gb=3.0 a100-sxm4-80gb=1.8 h200-sxm-141gb=3.8 --ttft-ms 2000 --tpot-ms 60 --trials 500

Prices are yours (USD per GPU-hour); the figures above are an example, not quotes. ``--batch N`` instead of
``--rate`` scores a closed batch of N requests. ``--json OUT`` keeps the whole result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.files import write_output
from dippm_nas.llm import ServingSLO, ServingTraffic
from dippm_nas.optuna import serving_config_search


def _prices(items: list[str]) -> float | dict[str, float]:
    if len(items) == 1 and "=" not in items[0]:
        return float(items[0])
    out = {}
    for it in items:
        dev, sep, val = it.partition("=")
        if not sep:
            raise SystemExit(f"--price: give one number, or DEVICE=PRICE for each device; got {it!r}")
        out[dev] = float(val)
    return out


def _fmt(v: float | None, s: float | None = None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" + (f" ± {s:.2g}" if s is not None else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-70b", help="architecture name or config.json path")
    ap.add_argument("--prompt", type=int, nargs="+", default=[512], help="prompt lengths (samples)")
    ap.add_argument("--output", type=int, nargs="+", default=[256], help="output lengths (samples)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--rate", type=float, default=None, help="requests per second")
    g.add_argument("--batch", type=int, default=None, help="a closed batch of N requests")
    ap.add_argument("--devices", nargs="+", default=["h100-sxm5-80gb", "a100-sxm4-80gb", "h200-sxm-141gb"])
    ap.add_argument("--price", nargs="+", required=True, help="USD per GPU-hour: one number, or DEVICE=PRICE each")
    ap.add_argument("--ttft-ms", type=float, default=None, help="time-to-first-token objective, ms")
    ap.add_argument("--tpot-ms", type=float, default=None, help="time-per-output-token objective, ms")
    ap.add_argument("--k-sigma", type=float, default=1.0, help="margin in σ of each objective (default 1)")
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mig", action="store_true", help="do not offer MIG profiles")
    ap.add_argument("--json", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    try:
        traffic = ServingTraffic(args.prompt if len(args.prompt) > 1 else args.prompt[0],
                                 args.output if len(args.output) > 1 else args.output[0],
                                 batch_size=args.batch, request_rate_per_s=args.rate if args.batch is None else None)
        slo = ServingSLO(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, k_sigma=args.k_sigma)
        res = serving_config_search(args.model, traffic, devices=args.devices, price_per_gpu_hour=_prices(args.price),
                                    slo=slo, mig=not args.no_mig, n_trials=args.trials, seed=args.seed)
    except DippmNasError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.model}: {res.trials} trials, {len(res.evaluated)} configurations, {res.elapsed_s:.1f} s; "
          f"{sum(res.infeasible.values())} infeasible")
    head = ["device", "tp", "mig", "engine", "seqs", "kv", "replicas", "conc", "ttft_ms", "tpot_ms", "$/Mtok", "J/tok"]
    print("  ".join(head))
    for e in res.pareto:
        c = e.config
        print("  ".join([c.device, str(c.tensor_parallel), c.mig_profile or "-", c.engine, str(c.max_num_seqs),
                         c.kv_dtype or "auto", str(e.replicas), str(e.concurrency), _fmt(e.ttft_ms, e.ttft_ms_std),
                         _fmt(e.tpot_ms, e.tpot_ms_std),
                         _fmt(e.cost_usd_per_million_tokens, e.cost_usd_per_million_tokens_std),
                         _fmt(e.energy_j_per_token, e.energy_j_per_token_std)]))
    for reason, n in sorted(res.infeasible.items(), key=lambda kv: -kv[1])[:8]:
        print(f"infeasible x{n}: {reason}")
    if args.json:
        write_output(args.json, json.dumps(res.to_dict(), indent=1) + "\n", "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
