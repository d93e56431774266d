"""``dippm-nas predict SPEC... [--device D...] [--batch N...] [--dtype T...] [--shape C,H,W | --input ...] [--json]``:
one table (or JSON list) for the grid of models x devices x batch sizes x dtypes."""

from __future__ import annotations

import argparse
from typing import Any

from dippm_nas.cli._deployment_flags import add_deployment_args, deployment_from_args
from dippm_nas.cli._grammar import (
    json_text,
    ListAction,
    Spinner,
    add_json_flag,
    add_progress_flag,
    device_ids,
    progress_enabled,
)
from dippm_nas.cli._inputs import add_input_args, describe, input_specs
from dippm_nas.errors import DippmNasError
from dippm_nas.spec import InputSpec

__all__ = ["register"]

_DEFAULT_DEVICE = "a100-sxm4-40gb"

_SPEC_HELP = ("torchvision:NAME | timm:NAME | timm-reparam:NAME | timm-results:NAME | path.onnx | "
              "package.module:callable (a SPEC is code: it is imported and run)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="predicted latency, energy, memory (with σ and source) and MIG fit of models on devices",
        description="Capture each SPEC and predict its cost on each --device, for each --batch and --dtype: one "
                    "table with a row per (model, device, batch, dtype). --json prints a JSON list with one "
                    "object per row (the Prediction's fields plus model and input). A graph already in the "
                    "conversion cache answers without exporting the model again. List flags take every value up "
                    "to the next flag: give SPEC first (predict SPEC --batch 1 8).",
    )
    p.add_argument("spec", metavar="SPEC", nargs="+", help=_SPEC_HELP)
    p.add_argument("--device", action=ListAction, default=[_DEFAULT_DEVICE], metavar="D",
                   help=f"catalogue ids, e.g. --device a100-sxm4-40gb h100-sxm5-80gb (default {_DEFAULT_DEVICE}; "
                        "`dippm-nas devices` lists them)")
    add_input_args(p)
    add_deployment_args(p)
    p.add_argument("--no-cache", action="store_true", help="do not read or write the conversion cache")
    add_json_flag(p, "a list with one object per row")
    add_progress_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    devices = device_ids(args.device)
    deployment = deployment_from_args(args)
    specs = input_specs(args)

    from dippm_nas.capture import capture
    from dippm_nas.predictor import get_predictor, predict, resolve_deployment

    rows: list[dict[str, Any]] = []
    preds: list[Any] = []  # the Prediction of each row; None where that grid point failed
    errors: list[DippmNasError] = []
    show = progress_enabled(args) and not args.json
    settings: dict[str, Any] = {}  # per device: (the device, the deployment) resolved once, or the error refusing it

    def failed(model: str, spec: InputSpec, dev: str, e: DippmNasError) -> None:
        errors.append(e)
        preds.append(None)
        rows.append({"model": model, "input": describe(spec), "device": dev, "batch_size": spec.batch_size,
                     "dtype": spec.dtype, "error": str(e), "type": type(e).__name__})

    def resolved(dev: str) -> Any:
        if dev not in settings:
            try:
                d = get_predictor(dev).resolved_device  # the device's one look-up
                settings[dev] = (d, resolve_deployment(d, deployment))
            except DippmNasError as e:
                settings[dev] = e
        if isinstance(settings[dev], DippmNasError):
            raise settings[dev]
        return settings[dev]

    for model in args.spec:
        for spec in specs:
            try:
                with Spinner(f"capturing {model} ({describe(spec)})", enabled=show):
                    graph = capture(model, spec, cache=not args.no_cache)
            except DippmNasError as e:
                for dev in devices:
                    failed(model, spec, dev, e)
                continue
            for dev in devices:
                try:
                    d, st = resolved(dev)
                    pred = predict(graph, device=d, deployment=st)
                except DippmNasError as e:
                    failed(model, spec, dev, e)
                    continue
                preds.append(pred)
                rows.append({"model": model, "input": describe(spec), **pred.to_dict()})
    if errors and len(errors) == len(rows):
        raise errors[0]  # nothing to show: the error itself (exit 1)
    if args.json:
        print(json_text(rows))
    else:
        label = next((s[1].label for s in settings.values() if not isinstance(s, DippmNasError)), None)
        _print_table(rows, preds, label if label is not None else deployment.label)
    return 1 if errors else 0


def _sig(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits, without an exponent between 1e-4 and 1e9 (181.3 -> '180')."""
    if x == 0 or not 1e-4 <= abs(x) < 1e9:
        return f"{x:.{digits}g}"
    text = f"{float(f'{x:.{digits}g}'):f}".rstrip("0").rstrip(".")
    return text


def _pm(v: float | None, s: float | None) -> str:
    if v is None:
        return "-"
    return _sig(v, 4) + (f" ± {_sig(s, 2)}" if s is not None else "")


def _print_table(rows: list[dict[str, Any]], preds: list[Any], deployment: str) -> None:
    head = ["#", "model", "device", "batch", "dtype", "latency_ms", "energy_j", "memory_mib", "MIG", "bound", "source"]
    table = []
    for i, (r, p) in enumerate(zip(rows, preds, strict=True), 1):
        if p is None:
            table.append([str(i), r["model"], r["device"], str(r["batch_size"]), r["dtype"], "-", "-", "-", "-", "-",
                          f"failed: {r['type']}"])
            continue
        mig = r["mig"].get("smallest_fit") if isinstance(r["mig"], dict) else None
        bound = "-"
        if p.host_ms is not None and p.gpu_ms is not None:
            bound = "host" if p.details.get("host_bound") else "GPU"
        table.append([str(i), r["model"], p.device, str(p.batch_size), p.dtype, _pm(p.latency_ms, p.latency_ms_std),
                      _pm(p.energy_j, p.energy_j_std), _pm(p.memory_mib, p.memory_mib_std), str(mig or "-"), bound,
                      "/".join(_SOURCE_LETTER.get(x, x) for x in (p.latency_source, p.energy_source, p.memory_source))])
    width = [max(len(h), *(len(t[c]) for t in table)) for c, h in enumerate(head)]
    right = {0, 3, 5, 6, 7}
    for line in (head, *table):
        print("  ".join(v.rjust(w) if c in right else v.ljust(w) for c, (v, w) in enumerate(zip(line, width))).rstrip())
    print("input: " + "; ".join(dict.fromkeys(r["input"] for r in rows)))
    for i, r in enumerate(rows, 1):
        if "error" in r:
            print(f"failed    row {i}: {r['type']}: {r['error']}")
    all_preds, preds = preds, [p for p in preds if p is not None]
    used = sorted({src for p in preds for src in (p.latency_source, p.energy_source, p.memory_source)})
    print(f"deployment: {deployment}")
    print("± one σ; source (latency/energy/memory): "
          + ", ".join(f"{_SOURCE_LETTER.get(u, u)} {u}" for u in used))
    print("MIG: the smallest profile that fits memory + 2σ; bound: the timeline (host dispatch or GPU) that sets "
          "the latency")
    threads = {int(p.details["host_threads"]) for p in preds if p.details.get("host_threads")}
    if threads:
        print(f"host-cpu rows: with {', '.join(map(str, sorted(threads)))} torch thread(s), as the checkpoint's "
              "measurements were made")
    unknown = {op: n for p in preds for op, n in p.unknown_ops.items()}
    if unknown:
        print(f"flagged   ops without a formula/encoder: {unknown}")
    for key, text in _FLAGS.items():
        which = [str(i) for i, p in enumerate(all_preds, 1) if p is not None and p.details.get(key)]
        if which:
            print(f"flagged   row{'s' if len(which) > 1 else ''} {','.join(which)}: {text} (details[{key!r}] = 1)")


#: one letter per Prediction source in the table's source column (latency/energy/memory)
_SOURCE_LETTER = {"predicted": "P", "analytic": "A", "calibrated": "C", "measured": "M", "unavailable": "-"}

#: details keys that widen σ, and what they mean to a reader of the text output
_FLAGS = {
    "outside_training_range": "graph-level features outside the checkpoint's training range: σ widened",
    "novel": ("graph farther from the checkpoint's training graphs than its validation graphs: σ widened (its floor "
              "grows with details['novelty'])"),
    "other_host": "host checkpoint measured on another CPU model: σ widened until calibrated on this machine",
    "other_machine": ("host checkpoint measured on another machine of this CPU model (its microbenchmark differs): "
                      "σ widened until calibrated on this machine"),
    "dtype_unseen": "a dtype the checkpoint never trained on: the analytic prior answers (σ as outside the range)",
}
