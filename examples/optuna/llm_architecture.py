"""Search a decoder's architecture for tokens/s per watt under a time-per-token SLO on a MIG slice.

Each trial picks layers, width, heads, KV heads and the FFN width of a Llama-style decoder, builds it with
``transformers`` on the ``meta`` device (shapes only: no weights, nothing downloaded, seconds on this CPU) and
asks dippm-nas how it serves a batch on one instance of a MIG profile (default ``1g.10gb`` of an H100 80GB):

- objectives: parameters (maximised: the capacity a bigger model buys) and energy per generated token
  (minimised: tokens/s per watt is its inverse);
- chance constraints (mean + 1σ within budget): the mean time per decode step within ``--slo-ms``, the whole
  batch held at once (``max_batch >= --batch``), and the memory within the slice.

Usage::

    python examples/optuna/llm_architecture.py --trials 40 [--device h100-sxm5-80gb --profile 1g.10gb]
        [--slo-ms 40] [--prompt 512 --output 256 --batch 8] [--runtime serving] [--storage sqlite:///llm.db]
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import optuna

from dippm_nas.llm import LLMWorkload
from dippm_nas.optuna import Budgets, HardwareCostModel, optuna_has_set_constraint


def build(trial: optuna.Trial, vocab: int = 32000) -> Any:
    """A Llama-style decoder of the trial's architecture, on the meta device (no weights)."""
    try:
        import torch
        import transformers
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise SystemExit(f"this example builds transformers models: pip install 'dippm-nas[dev]' ({e})") from e
    heads = trial.suggest_categorical("heads", [8, 16, 32])
    head_dim = trial.suggest_categorical("head_dim", [64, 128])
    kv = trial.suggest_categorical("kv_heads", [1, 2, 4, 8])
    kv = min(kv, heads)
    width = heads * head_dim
    ffn = trial.suggest_categorical("ffn_mult", [2.0, 2.75, 3.5, 4.0])
    cfg = transformers.LlamaConfig(
        hidden_size=width, num_hidden_layers=trial.suggest_int("layers", 8, 40, step=4), num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, intermediate_size=int(ffn * width) // 256 * 256,
        vocab_size=vocab, max_position_embeddings=4096, dtype="float16")
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            return transformers.LlamaForCausalLM(cfg)


def main(argv: list[str] | None = None) -> optuna.Study:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--device", default="h100-sxm5-80gb")
    ap.add_argument("--profile", default="1g.10gb", help="the MIG profile one instance serves on")
    ap.add_argument("--slo-ms", type=float, default=40.0, help="most mean time per decode step (ms)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8, help="sequences served together (all must fit at once)")
    ap.add_argument("--runtime", default="serving", help="serving (vLLM class), eager, cuda-graphs or compiled")
    ap.add_argument("--storage", default=None, help="an Optuna storage URL (default: in memory)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cost = HardwareCostModel(args.device, Budgets(decode_ms_per_token=args.slo_ms, max_batch=args.batch,
                                                  mig_profile=args.profile),
                             objectives=("energy_j_per_token",), runtime=args.runtime)
    sampler_kw: dict[str, Any] = {"seed": args.seed}
    if not optuna_has_set_constraint():  # Optuna 4: constraints reach the sampler through constraints_func
        sampler_kw["constraints_func"] = cost.constraints_func
    study = cost.create_study(leading={"params": "maximize"}, storage=args.storage,
                              sampler=optuna.samplers.TPESampler(**sampler_kw))
    workload = LLMWorkload(args.prompt, args.output, args.batch)

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        model = build(trial)
        params = float(sum(p.numel() for p in model.parameters()))
        trial.set_user_attr("params", params)
        return (params, cost.evaluate(trial, model, workload))

    study.optimize(objective, n_trials=args.trials)

    print(f"{args.trials} trials; {args.device} {args.profile}, {args.runtime}; decode <= {args.slo_ms} ms per token "
          f"(mean + 1σ), {args.batch} sequences of {args.prompt} + {args.output} tokens held at once")
    print(f"{'#':>3}  {'params':>8}  {'layers':>6}  {'width':>5}  {'heads':>5}  {'kv':>3}  {'ffn':>4}  "
          f"{'ms/token':>8}  {'tokens/s':>8}  {'tok/s/W':>7}  {'max_b':>5}  feasible")
    for t in sorted(study.best_trials, key=lambda t: -t.values[0]):
        a, p = t.user_attrs, t.params
        print(f"{t.number:>3}  {a['params'] / 1e9:>7.2f}B  {p['layers']:>6}  {p['heads'] * p['head_dim']:>5}  "
              f"{p['heads']:>5}  {min(p['kv_heads'], p['heads']):>3}  {p['ffn_mult']:>4}  "
              f"{a['predicted_decode_ms_per_token']:>8.2f}  {a['predicted_output_tokens_per_s']:>8.0f}  "
              f"{1.0 / a['predicted_energy_j_per_token']:>7.1f}  {a['predicted_max_batch']:>5}  {a['feasible']}")
    print("tok/s/W: generated tokens per joule of the whole GPU with every instance of the profile serving "
          "(its compute slices' share of the board's power)")
    return study


if __name__ == "__main__":
    main()
