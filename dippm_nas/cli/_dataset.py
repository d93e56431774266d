"""``dippm-nas dataset build|import|info|export``: build, import into, summarise and export dataset files
(``stats`` is a hidden alias of ``info``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from dippm_nas._numbers import as_int
from dippm_nas.cli._grammar import (
    json_text,
    ListAction,
    UsageError,
    add_json_flag,
    add_progress_flag,
    add_torch_device,
    check_name,
    float_flag,
    int_flag,
    positive_int,
    writable_output,
)
from dippm_nas._json import read_json_file
from dippm_nas.errors import DatasetError, MeasurementError
from dippm_nas.spec import COMPUTE_DTYPES

__all__ = ["register"]

logger = logging.getLogger(__name__)

_IMPORTERS = ("accel-nasbench", "timm", "ryujaehun", "neusight", "vidur", "campaign")
_FAMILIES = ("mbconv", "resnet", "mobilenetv3", "densenet", "convnext", "vit", "bert", "mlp")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dataset",
        help="build a measured dataset, import public measurements, summarise or export a dataset file",
        description="Dataset files are SQLite: graphs by structural hash plus measurement rows "
                    "(see dippm_nas.dataset).",
    )
    verbs = p.add_subparsers(dest="dataset_verb", metavar="SUBCOMMAND")
    verbs.required = True
    _register_build(verbs)
    _register_import(verbs)
    _register_info_export(verbs)


def _register_build(verbs: argparse._SubParsersAction) -> None:
    """``dataset build``: its flags."""
    b = verbs.add_parser(
        "build", help="sample, convert and measure models of search spaces (resumable)",
        description="Plan N candidates from the seed, convert them in parallel (conversion cache), measure "
                    "them one at a time. Rerun the same command to resume a killed build.",
    )
    b.add_argument("--space", action=ListAction, default=None, metavar="NAME",
                   help="search space names (a list: 'mlp resnet' or 'mlp,resnet'), or 'all' (the families "
                        f"{','.join(_FAMILIES)})")
    b.add_argument("--n", type=int_flag("--n", low=1), default=None,
                   help="candidates to plan (split evenly over the spaces)")
    b.add_argument("--candidates", type=Path, action="append", default=[], metavar="PATH",
                   help="instead of --space/--n: measure these models (repeatable): a dataset export "
                        "(.jsonl[.gz|.xz]; each measurement row's space, config and batch size, once) or a JSON "
                        "list of {space, config, batch_size}; e.g. the same models again, or on another machine")
    add_torch_device(b, "cpu", "torch device to measure on: cpu | cuda | cuda:N (default cpu)")
    b.add_argument("--batch", action=ListAction, item=positive_int("--batch"), default=[1, 8, 32], metavar="N",
                   help="batch sizes to draw from, e.g. --batch 1 8 32 or --batch 1,8,32 (default 1 8 32)")
    b.add_argument("--dtype", default="float32", help=f"{' | '.join(COMPUTE_DTYPES)} (default float32)")
    b.add_argument("--out", required=True, type=Path, help="dataset SQLite file (created or resumed)")
    b.add_argument("--seed", type=int_flag("--seed"), default=0, help="plan seed (default 0)")
    b.add_argument("--mac-budget", type=float_flag("--mac-budget", low=0, note="0: no limit"), default=300.0,
                   help="largest MMACs per batch (MACs per sample x batch) planned; 0 = no limit (default 300)")
    b.add_argument("--workers", type=int_flag("--workers", low=1), default=2, help="conversion processes (default 2)")
    b.add_argument("--chunk", type=int_flag("--chunk", low=1), default=256,
                   help="jobs converted per round (default 256)")
    b.add_argument("--no-overlap", action="store_true", help="do not convert the next round while measuring")
    b.add_argument("--pin-cpu", type=int_flag("--pin-cpu", low=0), default=None,
                   help="pin measurement to this CPU and conversion to the others (default: no pinning)")
    b.add_argument("--threads", type=int_flag("--threads", low=1), default=1,
                   help="torch threads while measuring (default 1)")
    b.add_argument("--cpu-allocator", choices=("steady", "as-is"), default="steady",
                   help="CPU timing: 'steady' (default) fixes glibc malloc's thresholds so freed activations are "
                        "reused, not faulted in again; 'as-is' leaves the allocator alone (MeasureSettings.cpu_allocator)")
    b.add_argument("--warmup", type=int_flag("--warmup", low=0), default=2, help="untimed forwards (default 2)")
    b.add_argument("--min-repeats", type=int_flag("--min-repeats", low=2), default=5,
                   help="timed forwards at least (default 5)")
    b.add_argument("--max-repeats", type=int_flag("--max-repeats", low=2), default=30,
                   help="timed forwards at most (default 30)")
    b.add_argument("--rel-ci", type=float_flag("--rel-ci", low=0, low_inclusive=False), default=0.05,
                   help="stop when the 95%% CI half-width is within this fraction of the mean (default 0.05)")
    b.add_argument("--time-cap", type=float_flag("--time-cap", low=0, low_inclusive=False), default=2.0,
                   help="seconds of warm-up + timing per measurement (default 2)")
    b.add_argument("--isolate", action="store_true",
                   help="measure each model in a fresh subprocess (hard time limit, crash isolation; slower)")
    b.add_argument("--rounds", type=int_flag("--rounds", low=0, note="0: off"), default=0,
                   help="CPU: time each chunk's latencies again in this many interleaved rounds (one untimed and "
                        "--min-repeats timed forwards per model per round) after measuring the models one by one; "
                        "far steadier on a shared machine than one block per model (default 0: off)")
    b.add_argument("--op-profiles", type=Path, default=None, metavar="PATH",
                   help="CPU: also run each ok model under torch.profiler and append its operators' in-place times "
                        "to PATH (.jsonl or .jsonl.xz), with the row's latency: what the host prior's operator "
                        "table is fitted on (scripts/fit/calibrate_host_prior.py --op-profiles); about 6 extra "
                        "forwards per model")
    b.add_argument("--retry-failed", default="",
                   help="comma-separated statuses (timeout,oom,error) whose failed jobs are measured again")
    b.add_argument("--no-cache", action="store_true", help="do not use the conversion cache")
    add_progress_flag(b)
    add_json_flag(b, "the build report")
    b.set_defaults(func=run_build)


def _register_import(verbs: argparse._SubParsersAction) -> None:
    """``dataset import``: its flags."""
    i = verbs.add_parser(
        "import", help="import public measurements (../shared/data CSVs) into a dataset file",
        description="accel-nasbench: graph (MBConv space, 256x256) + A100/RTX 3090 latency per batch; "
                    "timm: benchmark rows (graphs only when timm is installed); ryujaehun: eager torchvision "
                    "timings at batch 12 (graphs only when torchvision is installed); neusight, vidur: "
                    "operator-level rows; campaign: a 'dippm-nas gpu-campaign' directory (its graphs are "
                    "captured here from the recorded model SPECs).",
    )
    i.add_argument("kind", choices=_IMPORTERS, help="which public dataset the CSV is")
    i.add_argument("csv", type=Path, help="the CSV file (campaign: the campaign directory)")
    i.add_argument("--out", required=True, type=Path, help="dataset SQLite file (created or extended)")
    i.add_argument("--workers", type=int_flag("--workers", low=1), default=2, help="conversion processes (default 2)")
    i.add_argument("--limit", type=int_flag("--limit", low=1), default=None, help="import only the first N rows")
    i.add_argument("--no-graphs", action="store_true", help="accel-nasbench/timm/ryujaehun: store rows without capturing graphs")
    i.add_argument("--no-cache", action="store_true", help="do not use the conversion cache")
    add_progress_flag(i)
    add_json_flag(i, "the import report (printed as JSON either way)")
    i.set_defaults(func=run_import)


def _register_info_export(verbs: argparse._SubParsersAction) -> None:
    """``dataset info`` (``stats`` a hidden alias) and ``dataset export``: their flags."""
    # one verb; `stats` is kept as a hidden alias
    s = verbs.add_parser("info", aliases=["stats"], help="summarise a dataset file (counts by source, device, "
                         "space, batch)")
    s.add_argument("path", type=Path, help="dataset SQLite file")
    add_json_flag(s, "one JSON object")
    s.add_argument("--markdown", action="store_true",
                   help="print Markdown tables of ok rows (space x batch size) per source and device")
    s.set_defaults(func=run_info)
    _hide_alias(verbs, "stats")

    e = verbs.add_parser("export", help="export graphs + measurement rows to compressed JSON Lines")
    e.add_argument("path", type=Path, help="dataset SQLite file")
    e.add_argument("--out", required=True, type=Path, help="*.jsonl, *.jsonl.gz or *.jsonl.xz")
    e.add_argument("--source", default=None, help="only rows of this source (e.g. measured-here)")
    add_json_flag(e, "the counts")
    e.set_defaults(func=run_export)


def _hide_alias(verbs: argparse._SubParsersAction, alias: str) -> None:
    """Leave ``alias`` out of the help's list of sub-commands (it still parses)."""
    for action in verbs._choices_actions:
        if action.metavar:
            action.metavar = str(action.metavar).replace(f" ({alias})", "")


def _spaces(names: list[str]) -> list[str]:
    """The search spaces of ``--space`` (``all``: the families), checked against the registry."""
    import search_spaces as ss

    if names == ["all"]:
        return list(_FAMILIES)
    known = ss.list_spaces()
    return [check_name("search space", n, known) for n in names]


def _read_candidates(paths: list[Path], dtype: str) -> list[dict[str, Any]]:
    """``{space, config, batch_size}`` of each distinct model in ``paths`` (exports or JSON lists), in order;
    rows of a space this installation cannot build (imported public rows: ``timm``...) are left out, with
    a note on stderr."""
    import search_spaces as ss

    from dippm_nas.dataset import iter_jsonl
    from dippm_nas._json import canonical_json

    known = set(ss.list_spaces())
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str, int]] = set()
    skipped: dict[str, int] = {}
    for path in paths:
        if path.suffix == ".json":
            items = read_json_file(path, f"cannot read the candidates file {str(path)!r}", DatasetError)
            if not isinstance(items, list):
                raise DatasetError(f"{path}: a JSON candidates file holds a list of {{space, config, batch_size}}")
        else:
            items = [r for r in iter_jsonl(path) if r.get("type") == "measurement"]
            bad = sorted({str(r.get("dtype")) for r in items if r.get("space") in known} - {dtype})
            if bad:
                raise UsageError(f"{path} has rows of dtype {bad}; this build measures --dtype {dtype}: pass the "
                                    "rows' dtype (one build per dtype)")
        for it in items:
            if not isinstance(it, dict) or "space" not in it or "config" not in it:
                raise DatasetError(f"{path}: each candidate needs 'space' and 'config', got {it!r:.200}")
            if it["space"] not in known:
                skipped[it["space"]] = skipped.get(it["space"], 0) + 1
                continue
            if "batch_size" in it:
                it = {**it, "batch_size": as_int(it["batch_size"], f"{path}: batch_size of {it['space']!r}", low=1,
                                                 error=DatasetError)}
            key = (it["space"], canonical_json(it["config"]), it.get("batch_size", 0))
            if key not in seen:
                seen.add(key)
                out.append({k: it[k] for k in ("space", "config", "batch_size") if k in it})
    if skipped:
        print(f"left out rows of spaces that cannot be built here: {skipped}", file=sys.stderr)
    if not out:
        raise DatasetError(f"no buildable candidates in {[str(p) for p in paths]}")
    return out


def run_build(args: argparse.Namespace) -> int:
    from dippm_nas.dataset import build_dataset
    from dippm_nas.measure import MeasureSettings

    check_name("dtype", args.dtype, COMPUTE_DTYPES)
    try:
        settings = MeasureSettings(warmup=args.warmup, min_repeats=args.min_repeats, max_repeats=args.max_repeats,
                                   rel_ci_target=args.rel_ci, time_cap_s=args.time_cap, threads=args.threads,
                                   cpu_allocator=args.cpu_allocator)
    except MeasurementError as e:
        raise UsageError(str(e)) from e
    budget = None if args.mac_budget <= 0 else int(round(args.mac_budget * 1e6))
    if bool(args.candidates) == (args.space is not None or args.n is not None):
        raise UsageError("give either --space and --n (sample candidates) or --candidates PATH (measure those), "
                            f"got --space {args.space!r}, --n {args.n!r}, --candidates {[str(c) for c in args.candidates]}")
    if not args.candidates and (args.space is None or args.n is None):
        raise UsageError(f"--space and --n go together, got --space {args.space!r}, --n {args.n!r}")
    spaces = _spaces(args.space) if args.space else []
    candidates = _read_candidates(args.candidates, args.dtype) if args.candidates else None
    report = build_dataset(
        args.out, spaces=spaces, n=args.n or 0, candidates=candidates, torch_device=args.torch_device,
        batch_sizes=args.batch,
        dtype=args.dtype, seed=args.seed, settings=settings, mac_budget=budget, workers=args.workers,
        chunk_size=args.chunk, overlap=not args.no_overlap, pin_cpu=args.pin_cpu,
        cache=not args.no_cache, progress=not args.no_progress,
        retry_failed=[s.strip() for s in args.retry_failed.split(",") if s.strip()], isolate=args.isolate,
        rounds=args.rounds, op_profiles=args.op_profiles,
    )
    if args.json:
        print(json_text(dataclasses.asdict(report)))
        return 0 if report.open == 0 else 1
    print(f"{report.path}: plan {report.plan_key[:12]} ({'resumed' if report.resumed else 'new'}), "
          f"{report.planned} planned: {report.done} done, {report.failed} failed, {report.open} open; "
          f"this run measured {report.measured_now}, failed {report.failed_now} in {report.seconds:.0f} s"
          + (f"; {report.profiled_now} operator profiles appended to {args.op_profiles}" if args.op_profiles else ""))
    return 0 if report.open == 0 else 1


def run_import(args: argparse.Namespace) -> int:
    import dippm_nas.dataset as imp

    common: dict[str, Any] = {"limit": args.limit, "progress": not args.no_progress}
    if args.kind == "accel-nasbench":
        report = imp.import_accel_nasbench(args.csv, args.out, workers=args.workers, cache=not args.no_cache,
                                           capture_graphs=not args.no_graphs, **common)
    elif args.kind == "timm":
        report = imp.import_timm(args.csv, args.out, workers=args.workers, cache=not args.no_cache,
                                 capture_graphs=None if not args.no_graphs else False, **common)
    elif args.kind == "ryujaehun":
        report = imp.import_ryujaehun(args.csv, args.out, workers=args.workers, cache=not args.no_cache,
                                      capture_graphs=None if not args.no_graphs else False, **common)
    elif args.kind == "campaign":
        report = imp.import_campaign(args.csv, args.out, workers=args.workers, cache=not args.no_cache,
                                     capture_graphs=not args.no_graphs, **common)
    elif args.kind == "neusight":
        report = imp.import_neusight(args.csv, args.out, **common)
    else:
        report = imp.import_vidur(args.csv, args.out, **common)
    print(json_text(report.as_dict(), indent=2))
    return 0


def run_info(args: argparse.Namespace) -> int:
    from dippm_nas.dataset import DatasetStore

    with DatasetStore(args.path, create=False) as store:
        st = store.stats()
    if args.json:
        print(json_text(st))
        return 0
    if args.markdown:
        print(_markdown(st))
        return 0
    print(f"dataset      {st['path']} (schema {st['schema_version']})")
    print(f"graphs       {st['graphs']}")
    if st["jobs"]:
        print("jobs         " + ", ".join(f"{k} {v}" for k, v in st["jobs"].items()))
    print("measurements (source / device / status: rows)")
    for r in st["measurements"]:
        print(f"  {r['source']:16s} {r['device']:20s} {r['status']:8s} {r['count']}")
    print(f"ok rows with a graph: {st['ok_with_graph']}")
    if st["ok_by_space"]:
        print("ok rows by space")
        for r in st["ok_by_space"]:
            print(f"  {r['source']:16s} {r['device']:20s} {str(r['space']):14s} {r['count']}")
    if st["ok_by_batch"]:
        print("ok rows by batch size")
        for r in st["ok_by_batch"]:
            print(f"  {r['source']:16s} {r['device']:20s} {str(r['batch_size']):>6s} {r['count']}")
    if st["op_measurements"]:
        print("operator rows (source / device: rows)")
        for r in st["op_measurements"]:
            print(f"  {r['source']:16s} {r['device']:28s} {r['count']}")
    return 0


def _markdown(st: dict[str, Any]) -> str:
    """``ok`` rows as one ``space x batch size`` table per (source, device), with totals."""
    groups: dict[tuple[str, str], dict[tuple[str, int], int]] = {}
    for r in st["ok_by_space_batch"]:
        groups.setdefault((r["source"], r["device"]), {})[(str(r["space"]), r["batch_size"])] = r["count"]
    out = []
    for (source, device), cells in groups.items():
        spaces = sorted({s for s, _ in cells})
        batches = sorted({b for _, b in cells if b is not None})
        out.append(f"**{source}** on **{device}**: ok rows by family and batch size\n")
        out.append("| family | " + " | ".join(f"bs {b}" for b in batches) + " | total |")
        out.append("|---|" + "---:|" * (len(batches) + 1))
        for s in spaces:
            row = [cells.get((s, b), 0) for b in batches]
            out.append(f"| {s} | " + " | ".join(str(v) for v in row) + f" | {sum(row)} |")
        col = [sum(cells.get((s, b), 0) for s in spaces) for b in batches]
        out.append("| **total** | " + " | ".join(str(v) for v in col) + f" | **{sum(col)}** |")
        out.append("")
    failed = st["failed_by_reason"]
    if failed:
        out.append("| failed rows: source | status | family | rows |")
        out.append("|---|---|---|---:|")
        out += [f"| {r['source']} | {r['status']} | {r['space']} | {r['count']} |" for r in failed]
    return "\n".join(out)


def run_export(args: argparse.Namespace) -> int:
    from dippm_nas.dataset import export_jsonl

    writable_output(args.out, "--out", inputs=[args.path])
    counts = export_jsonl(args.path, args.out, source=args.source)
    size = args.out.stat().st_size
    if args.json:
        print(json_text({"path": str(args.out), **counts, "size_bytes": size}))
        return 0
    print(f"{args.out}: {counts['graphs']} graphs, {counts['measurements']} measurement rows, "
          f"{counts['op_measurements']} operator rows, {size / 2**20:.2f} MiB", file=sys.stdout)
    return 0
