#!/usr/bin/env python
"""Experiment (issue 7): do per-operator CPU times measured *in place* predict unseen families better than
the whole-model GNN does?

Usage::

    python benchmarks/accuracy/host_op_table.py --data HOST_CPU_DATASET [--data ...] --profiles prof.jsonl \
        [--per-family 30] [--seed 0] [--holdout resnet,vit] [--holdout densenet,bert] \
        [--twin resnet,vit=FAMILY_SPLIT_CHECKPOINT.pt ...]

Run it on the machine the dataset was measured on, with the CPU the labels used free of other work (e.g.
``taskset -c 0`` while nothing else runs there). Step 1 (skipped when ``--profiles`` already exists):
``--per-family`` models of each family of the dataset are rebuilt from their search-space config and run
with 1 torch thread and the steady allocator; after a warm-up, three forwards are timed (the *quick
re-timing*) and three are recorded with ``torch.profiler`` (shapes and scalar arguments of every
top-level ``aten::`` call, its inclusive CPU time per forward). One JSON line per model goes to
``--profiles``.

Step 2, for each ``--holdout`` pair of families (never used for fitting anything):

- *quick re-timing*: the models' own fresh timing, scaled by ``a·t + c`` fitted on the other families
  (relative least squares) — how far a second measurement of the same models is from the labels;
- *oracle in-place sum*: ``a·S + b·n + c`` with ``S`` the held-out models' own profiled op times and ``n``
  their op count — what a perfect per-operator model would give;
- *op table*: the package's operator table (:func:`dippm_nas.prior.fit_op_table`): a gradient-boosted
  forest of log time per call, learnt on the other families' profiled calls, and a map
  ``scale·Σ table + per_op_us·(record count)`` fitted on their sums cross-fitted by family, so nothing is
  in-sample. Calls and graph nodes both become canonical op records (kind, main input shape, second shape,
  conv/pool/mask parameters; views, scalar arithmetic and bias adds are not records); the table is
  applied to the records of the aten calls and, separately, to the model's graph from the dataset
  through the prior (:func:`dippm_nas.prior.estimate` with the table in its ``PriorParams``): what a
  prediction from a graph sees;
- *GNN twin* (``--twin PAIR=CKPT``): a checkpoint trained with ``--split family --holdout PAIR`` on
  the same data, on the same profiled rows (``dippm_nas.training.evaluate_checkpoint``).

Figures are MAPE (%) against the dataset's labels. ``--profiles`` ending in ``.xz`` is written
compressed. Fitting the table needs scikit-learn (``pip install scikit-learn``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from typing import Any

import numpy as np

_PASSES = 3


def _rows(paths: list[str]) -> list[dict[str, Any]]:
    from dippm_nas.dataset import open_text

    rows = []
    for p in paths:
        for line in open_text(p):
            d = json.loads(line)
            if d.get("type") == "measurement" and d.get("status") == "ok" and d.get("latency_ms"):
                rows.append(d)
    return rows


def _pick(rows: list[dict[str, Any]], per_family: int, seed: int) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["space"]].append(r)
    rng = random.Random(seed)
    out = []
    for fam in sorted(by):
        rs = sorted(by[fam], key=lambda r: r["row_key"])
        out += rng.sample(rs, min(per_family, len(rs)))
    return out


def _profile(picked: list[dict[str, Any]], out: Path) -> None:
    import torch
    from tqdm import tqdm

    import search_spaces as ss
    from dippm_nas.measure import OpProfileWriter, profile_ops
    from dippm_nas.measure import release_free_memory, steady_allocator

    steady_allocator()
    torch.set_num_threads(1)
    tmp = out.with_name(out.name + ".part" + (".xz" if out.suffix == ".xz" else ""))
    tmp.unlink(missing_ok=True)
    with OpProfileWriter(tmp) as fo:
        for r in tqdm(picked, desc="profile", unit="model"):
            model = ss.build_model(r["space"], r["config"])
            spec = ss.get_space(r["space"]).input_spec(r["config"], batch_size=r["batch_size"])
            args, kw = spec.example_inputs()
            with torch.inference_mode():
                for _ in range(3):
                    model(*args, **kw)
                t0 = time.perf_counter()
                for _ in range(_PASSES):
                    model(*args, **kw)
                quick_ms = (time.perf_counter() - t0) / _PASSES * 1e3
            ops = profile_ops(model, spec, passes=_PASSES, warmup=0)
            fo.write(family=r["space"], latency_ms=r["latency_ms"], ops=ops, row_key=r["row_key"],
                     graph_hash=r["graph_hash"], quick_ms=quick_ms)
            del model
            release_free_memory()
    tmp.replace(out)


def _mape(p: np.ndarray, t: np.ndarray) -> float:
    return 100.0 * float(np.mean(np.abs(p / t - 1.0)))


def _fit_rel(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Coefficients ``c`` minimising the squared relative error of ``a @ c`` against ``t``."""
    return np.linalg.lstsq(a / t[:, None], np.ones(len(t)), rcond=None)[0]


def _prepare(models: list[dict[str, Any]]) -> None:
    """Attach each model's op records (from its aten calls), in-place sum S (ms) and record count."""
    from dippm_nas.prior import aten_op_record

    for m in models:
        m["aten"] = [(r, op[3], op[4]) for op in m["ops"] if (r := aten_op_record(op[0], op[1], op[2])) is not None]
        m["S"] = sum(op[3] for op in m["ops"]) / 1e3
        m["n_aten"] = sum(c for _, _, c in m["aten"])


def _analyse(models: list[dict[str, Any]], pair: list[str], twins: dict[str, str], graphs: dict[str, Any],
             data: list[str], seed: int) -> list[dict[str, Any]]:
    import dataclasses

    from dippm_nas.prior import PriorParams, estimate, fit_op_table

    test = [m for m in models if m["family"] in pair]
    train = [m for m in models if m["family"] not in pair]
    lab_tr = np.array([m["latency_ms"] for m in train])
    table = fit_op_table(models, exclude_families=pair)
    params = dataclasses.replace(PriorParams.uncalibrated(), op_tables={"host-cpu": table})

    def design(s: list[float], n: list[float]) -> np.ndarray:
        return np.stack([np.array(s), np.array(n), np.ones(len(s))], 1)

    c_quick = _fit_rel(np.stack([np.array([m["quick_ms"] for m in train]), np.ones(len(train))], 1), lab_tr)
    c_oracle = _fit_rel(design([m["S"] for m in train], [m["n_aten"] for m in train]), lab_tr)
    gnn: dict[str, float] = {}
    ck = twins.get(",".join(sorted(pair)))
    if ck:
        from dippm_nas.training import evaluate_checkpoint

        res = evaluate_checkpoint(ck, data, device="host-cpu", split="family", heldout_families=pair, seed=seed)
        gnn = {r["key"]: r["latency_ms_pred"] for r in res["rows"] if "latency_ms_pred" in r}
    out = []
    for fam in pair:
        ms = [m for m in test if m["family"] == fam]
        if not ms:
            continue
        lab = np.array([m["latency_ms"] for m in ms])
        quick = np.stack([np.array([m["quick_ms"] for m in ms]), np.ones(len(ms))], 1) @ c_quick
        oracle = design([m["S"] for m in ms], [m["n_aten"] for m in ms]) @ c_oracle
        aten = np.array([(table.scale * table.record_us([r for r, _, _ in m["aten"]]).dot([c for _, _, c in m["aten"]])
                          + table.per_op_us * m["n_aten"]) / 1e3 for m in ms])
        row: dict[str, Any] = {"pair": ",".join(pair), "family": fam, "n": len(ms), "quick_retiming": _mape(quick, lab),
                               "oracle_inplace_sum": _mape(oracle, lab), "op_table_aten": _mape(aten, lab)}
        mg = [m for m in ms if m["graph_hash"] in graphs]
        if mg:
            pg = np.array([estimate(graphs[m["graph_hash"]], "host-cpu", params=params).latency_ms for m in mg])
            row["op_table_graph"] = _mape(pg, np.array([m["latency_ms"] for m in mg]))
        hit = [(gnn[m["graph_hash"][:12]], m["latency_ms"]) for m in ms if m["graph_hash"][:12] in gnn]
        if hit:
            h = np.array(hit)
            row["gnn_twin"] = _mape(h[:, 0], h[:, 1])
            row["gnn_twin_n"] = len(hit)
        out.append(row)
    return out


def _graphs(paths: list[str], hashes: set[str]) -> dict[str, Any]:
    from dippm_nas.dataset import open_text
    from dippm_nas.graph import OperatorGraph

    out = {}
    for p in paths:
        for line in open_text(p):
            d = json.loads(line)
            if d.get("type") == "graph" and d["structural_hash"] in hashes:
                out[d["structural_hash"]] = OperatorGraph.from_dict(d["graph"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, action="append", help="host-CPU dataset measured on this machine")
    ap.add_argument("--profiles", required=True, help="JSONL of profiles: written if missing, else reused")
    ap.add_argument("--per-family", type=int, default=30, help="models profiled per family (default 30)")
    ap.add_argument("--seed", type=int, default=0, help="model sample and twin split seed (default 0)")
    ap.add_argument("--holdout", action="append", default=None,
                    help="comma-separated families held out together (repeatable; default resnet,vit)")
    ap.add_argument("--twin", action="append", default=[], metavar="PAIR=CKPT",
                    help="family-split checkpoint trained without PAIR (e.g. resnet,vit=fam.pt)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("this experiment needs scikit-learn: pip install scikit-learn", file=sys.stderr)
        return 2
    twins = {}
    for t in args.twin:
        pair, sep, ck = t.partition("=")
        if not sep or not ck:
            ap.error(f"--twin takes PAIR=CHECKPOINT (e.g. resnet,vit=fam.pt), got {t!r}")
        twins[",".join(sorted(pair.split(",")))] = ck
    from dippm_nas.dataset import open_text

    prof = Path(args.profiles)
    if not prof.exists():
        _profile(_pick(_rows(args.data), args.per_family, args.seed), prof)
    models = [json.loads(line) for line in open_text(prof)]
    _prepare(models)
    graphs = _graphs(args.data, {m["graph_hash"] for m in models})
    fams = {m["family"] for m in models}
    result = []
    for h in args.holdout or ["resnet,vit"]:
        pair = [f for f in h.split(",") if f]
        bad = [f for f in pair if f not in fams]
        if bad:
            ap.error(f"--holdout {h}: {bad} not among the profiled families {sorted(fams)}")
        result += _analyse(models, pair, twins, graphs, args.data, args.seed)
    if args.json:
        print(json.dumps({"profiles": str(prof), "models": len(models), "rows": result}))
        return 0
    from benchmarks._common import machine

    print(f"{machine()}; {len(models)} profiled models of {len(fams)} families ({prof})")
    print("MAPE % against the labels, held-out families only")
    print(f"{'pair':16s} {'family':15s} {'n':>3s} {'quick re-timing':>15s} {'oracle in-place':>15s} "
          f"{'op table, aten':>14s} {'op table, graph':>15s} {'GNN twin':>9s}")

    def cell(r: dict[str, Any], k: str, w: int) -> str:
        return f"{r[k]:{w}.2f}" if k in r else f"{'-':>{w}s}"

    for r in result:
        print(f"{r['pair']:16s} {r['family']:15s} {r['n']:3d} {r['quick_retiming']:15.2f} "
              f"{r['oracle_inplace_sum']:15.2f} {r['op_table_aten']:14.2f} {cell(r, 'op_table_graph', 15)} "
              f"{cell(r, 'gnn_twin', 9)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
