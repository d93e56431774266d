"""``dippm-nas predict-llm SPEC_OR_CONFIG --prompt N --output N --batch N... --device D... [--mig] [--json]``: one
table (or JSON list) of generation figures per device x batch (x MIG profile)."""

from __future__ import annotations

import argparse
from typing import Any

from dippm_nas.cli._grammar import (
    ListAction,
    UsageError,
    add_json_flag,
    check_name,
    device_ids,
    json_text,
    positive_int,
)
from dippm_nas.errors import DippmNasError

__all__ = ["register"]

_DEFAULT_DEVICE = "a100-sxm4-40gb"
_RUNTIMES = ("eager", "cuda-graphs", "compiled", "serving")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict-llm",
        help="LLM generation: prefill and per-token decode latency, tokens/s, J/token, KV cache, max batch per GPU "
             "and MIG profile",
        description="Predict the generation of --batch sequences of --prompt + --output tokens with a decoder on each "
                    "--device: time to first token (prefill), time per decode step, end-to-end time, tokens/s "
                    "(input + output tokens over the end-to-end time), J per generated token, the KV cache, peak "
                    "memory and the largest batch that fits. SPEC_OR_CONFIG is an architecture name (`dippm-nas "
                    "predict-llm --list`), the path of a transformers config.json (or its directory), or "
                    "package.module:callable returning a transformers config or model (code: it is imported and "
                    "run). Only the architecture is read: no weights, no download.",
    )
    p.add_argument("spec", metavar="SPEC_OR_CONFIG", nargs="?", default=None,
                   help="architecture name, config.json path, or package.module:callable")
    p.add_argument("--list", action="store_true", help="list the architecture names and exit")
    p.add_argument("--prompt", type=positive_int("--prompt"), default=512, metavar="N",
                   help="prompt tokens per sequence (default 512)")
    p.add_argument("--output", type=positive_int("--output"), default=256, metavar="N",
                   help="generated tokens per sequence (default 256)")
    p.add_argument("--batch", action=ListAction, item=positive_int("--batch"), default=[1], metavar="N",
                   help="batch sizes, e.g. --batch 1 16 64 (default 1)")
    p.add_argument("--device", action=ListAction, default=[_DEFAULT_DEVICE], metavar="D",
                   help=f"catalogue ids (default {_DEFAULT_DEVICE}; `dippm-nas devices` lists them)")
    p.add_argument("--runtime", default="eager", metavar="R",
                   help="eager (transformers in PyTorch, default), cuda-graphs (static cache, decode from a CUDA "
                        "graph), compiled (torch.compile), serving (a vLLM / TensorRT-LLM class engine)")
    p.add_argument("--engine", default=None, metavar="E", help="with --runtime serving: vllm (default) or tensorrt-llm")
    p.add_argument("--dtype", default=None, metavar="T", help="weights' dtype (default the config's): float16, "
                                                              "bfloat16, float32")
    p.add_argument("--kv-dtype", default=None, metavar="T",
                   help="KV cache dtype (default the weights'); float8_e4m3fn / float8_e5m2 with --runtime serving")
    p.add_argument("--kv-block-size", type=positive_int("--kv-block-size"), default=None, metavar="N",
                   help="tokens per KV block of a serving engine (default the engine's: vLLM 16, TensorRT-LLM 64)")
    p.add_argument("--tp", type=positive_int("--tp"), default=1, metavar="N",
                   help="with --runtime serving: tensor parallelism over N GPUs of one node (default 1); times, "
                        "tokens/s and J/token are the node's, peak memory and max batch one GPU's")
    p.add_argument("--interconnect", default=None, metavar="L",
                   help="with --tp: the link the all-reduces take, nvlink or pcie (default: the board's NVLink "
                        "when it reaches that many GPUs, else PCIe)")
    p.add_argument("--mig", action="store_true", help="add a row per MIG profile of each device that has MIG")
    add_json_flag(p, "a list with one object per device and batch (GenerationPrediction.to_dict())")
    p.set_defaults(func=run)


def _load(spec: str) -> Any:
    """The decoder SPEC_OR_CONFIG names: an architecture, a config file, or a user callable's return value."""
    from pathlib import Path

    from dippm_nas.llm import ARCHITECTURES, decoder_config
    from dippm_nas.capture import load_callable

    if spec in ARCHITECTURES or Path(spec).exists():
        return decoder_config(spec)
    if ":" in spec:
        fn = load_callable(spec, what="SPEC_OR_CONFIG", returns="a transformers config or decoder model")
        try:
            obj = fn()
        except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever user code raises is the SPEC's error
            raise DippmNasError(f"calling {spec!r} raised {type(e).__name__}: {e}") from e
        return decoder_config(obj)
    return decoder_config(check_name("architecture", spec, sorted(ARCHITECTURES)))  # unknown: the closest names


def run(args: argparse.Namespace) -> int:
    from dippm_nas.llm import (ARCHITECTURES, ENGINES, INTERCONNECTS, KV_DTYPES, WEIGHT_DTYPES, LLMWorkload,
                               predict_generation)

    if args.list:
        width = max(map(len, ARCHITECTURES))
        for name, repo in ARCHITECTURES.items():
            print(f"{name.ljust(width)}  {repo}")
        return 0
    if args.spec is None:
        raise UsageError("give SPEC_OR_CONFIG (an architecture name, a config.json path or package.module:callable); "
                         "--list shows the names")
    devices = device_ids(args.device)
    runtime = check_name("runtime", args.runtime, _RUNTIMES)
    engine = check_name("engine", args.engine, ENGINES) if args.engine is not None else None
    dtype = check_name("dtype", args.dtype, WEIGHT_DTYPES) if args.dtype is not None else None
    kv_dtype = check_name("kv dtype", args.kv_dtype, sorted(KV_DTYPES)) if args.kv_dtype is not None else None
    link = check_name("interconnect", args.interconnect, INTERCONNECTS) if args.interconnect is not None else None
    cfg = _load(args.spec)

    rows: list[dict[str, Any]] = []
    preds: list[Any] = []
    errors: list[DippmNasError] = []
    for dev in devices:
        for batch in args.batch:
            wl = LLMWorkload(args.prompt, args.output, batch, kv_dtype)
            try:
                pred = predict_generation(cfg, wl, dev, mig=args.mig, runtime=runtime, engine=engine,
                                          kv_block_size=args.kv_block_size, dtype=dtype,
                                          tensor_parallel=args.tp, interconnect=link)
            except DippmNasError as e:
                errors.append(e)
                rows.append({"model": cfg.name, "device": dev, "batch_size": batch, "error": str(e),
                             "type": type(e).__name__})
                preds.append(None)
                continue
            rows.append(pred.to_dict())
            preds.append(pred)
    if errors and len(errors) == len(rows):
        raise errors[0]
    if args.json:
        print(json_text(rows))
    else:
        _print_table(cfg.name, args, preds, rows)
    return 1 if errors else 0


def _sig(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits, thousands separated, without an exponent (4212 -> '4,212')."""
    if x == 0 or not 1e-4 <= abs(x) < 1e12:
        return f"{x:.{digits}g}"
    rounded = float(f"{x:.{digits}g}")
    decimals = max(0, digits - 1 - int(f"{abs(rounded):e}".split("e")[1]))
    return f"{rounded:,.{decimals}f}"


def _num(v: float | None, s: float | None = None, digits: int = 4) -> str:
    if v is None:
        return "-"
    return _sig(v, digits) + (f" ± {_sig(s, 2)}" if s is not None else "")


_LETTER = {"predicted": "P", "analytic": "A", "calibrated": "C", "unavailable": "-"}


def _line(where: str, batch: int, f: Any, sources: Any) -> list[str]:
    """One table row of a prediction or a MIG slice (``sources``: ``figure(name) -> Figure``)."""
    src = "/".join(_LETTER.get(sources(n).source, "?") for n in ("decode_ms_per_token", "energy_j_per_token",
                                                                   "max_batch"))
    return [where, str(batch), _num(f.prefill_ms), _num(f.decode_ms_per_token, f.decode_ms_per_token_std),
            _num(f.e2e_ms), _num(f.tokens_per_s, f.tokens_per_s_std), _num(f.energy_j_per_token),
            _num(f.peak_memory_mib), str(f.max_batch), "yes" if f.fits else "no", src]


def _print_table(model: str, args: argparse.Namespace, preds: list[Any], rows: list[dict[str, Any]]) -> None:
    head = ["device", "batch", "prefill_ms", "decode_ms/token", "e2e_ms", "tokens/s", "J/token", "peak_MiB",
            "max_batch", "fits", "source"]
    table: list[list[str]] = []
    notes: list[str] = []
    for p, r in zip(preds, rows):
        if p is None:
            table.append([r["device"], str(r["batch_size"]), *(["-"] * 8), f"failed: {r['type']}"])
            notes.append(f"failed    {r['device']} batch {r['batch_size']}: {r['type']}: {r['error']}")
            continue
        table.append(_line(p.device, p.batch_size, p, p.figure))
        if p.reason:
            notes.append(f"{p.device} batch {p.batch_size}: {p.reason}")
        for name, s in (p.mig or {}).items():
            table.append(_line(f"  {name}", p.batch_size, s, lambda n, name=name, p=p: p.figure(n, name)))
    width = [max(len(h), *(len(t[c]) for t in table)) for c, h in enumerate(head)]
    for line in (head, *table):
        print("  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(line, width))).rstrip())
    ok = [p for p in preds if p is not None]
    first = ok[0] if ok else None
    engine = f" ({first.details['engine']})" if first is not None and first.details.get("engine") else ""
    tp = f"; tensor parallel {args.tp} GPUs ({first.details.get('interconnect')})" \
        if first is not None and args.tp > 1 else ""
    print(f"{model}: prompt {args.prompt} + output {args.output} tokens per sequence; runtime {args.runtime}{engine}{tp}")
    if tp:
        print("tensor parallel: prefill, decode, e2e, tokens/s and J/token are the node's; peak_MiB and max_batch one "
              "GPU's")
    if first is not None:
        kv = first.details["kv_bytes_per_token"] / 2**20
        print(f"weights {first.weights_mib:,.0f} MiB; KV cache {kv:.4g} MiB per token "
              f"({first.kv_cache_mib_per_sequence:,.1f} MiB per sequence, {first.details['kv_dtype']})")
        print("± one σ; source (latency/energy/memory): P predicted (fitted on measurements), A analytic, "
              "- unavailable")
        if args.mig:
            print("MIG rows: one instance of the profile; J/token: the whole GPU with every instance serving, each "
                  "taking its compute slices' share of the board's power")
    for n in notes:
        print(n)
