#!/usr/bin/env python
"""Experiment (issue 7): do per-operator CPU times measured *in place* predict unseen families better than
the whole-model GNN does?

Usage::

    python benchmarks/host_op_table.py --data HOST_CPU_DATASET [--data ...] --profiles prof.jsonl \
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
- *op table*: the same map on ``Ŝ``, the sum of op times predicted by a gradient-boosted regressor
  trained on the other families' profiled calls; the map is fitted on the other families' cross-fitted
  ``Ŝ`` (4 folds by family), so nothing is in-sample. Calls and graph nodes both become *canonical op
  records* (kind, main input shape, second shape, conv/pool/mask parameters; views, scalar arithmetic and
  bias adds are not records), and the table is applied to the records of the aten calls and, separately,
  to those derived from the dataset's graph of the model (what a prediction from a graph would see);
- *GNN twin* (``--twin PAIR=CKPT``): a checkpoint trained with ``--split family --holdout PAIR`` on
  the same data, on the same profiled rows (``dippm_nas.predictor._evaluate.evaluate_checkpoint``).

Figures are MAPE (%) against the dataset's labels. The op table is an analysis here, not (yet) part of
the package's predictor. Needs scikit-learn (``pip install scikit-learn``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

_PASSES = 3
_CONV = ("aten::conv1d", "aten::conv2d", "aten::convolution")


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


def _scalar(c: Any) -> Any:
    return c if c is None or isinstance(c, (bool, int, float, str, list)) else str(c)


def _profile(picked: list[dict[str, Any]], out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from tqdm import tqdm

    import search_spaces as ss
    from dippm_nas.measure._malloc import release_free_memory, steady_allocator

    steady_allocator()
    torch.set_num_threads(1)
    tmp = out.with_suffix(out.suffix + ".part")
    with open(tmp, "w") as fo:
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
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    for _ in range(_PASSES):
                        model(*args, **kw)
            agg: dict[str, list[float]] = {}
            for e in prof.events():
                if e.cpu_parent is not None:
                    continue
                ci = [_scalar(c) for c in (getattr(e, "concrete_inputs", None) or [])]
                a = agg.setdefault(json.dumps([e.name, e.input_shapes, ci]), [0.0, 0.0])
                a[0] += e.cpu_time_total / _PASSES
                a[1] += 1 / _PASSES
            fo.write(json.dumps({"row_key": r["row_key"], "graph_hash": r["graph_hash"], "family": r["space"],
                                 "latency_ms": r["latency_ms"], "quick_ms": quick_ms,
                                 "ops": [json.loads(k) + v for k, v in agg.items()]}) + "\n")
            del model, prof
            release_free_memory()
    tmp.replace(out)


# ---------------------------------------------------------------- canonical op records
# An op record is (kind, x, w, p): the main input's shape, a second shape (weight, other operand, keys),
# 8 numeric parameters, the same whether it comes from an aten call or from a Relax node of the graph.
# Views, scalar arithmetic and bias adds (inside aten::conv2d / aten::linear) are not records.

_ATEN_KIND = {
    "aten::conv1d": "conv", "aten::conv2d": "conv", "aten::convolution": "conv", "aten::linear": "linear",
    "aten::matmul": "matmul", "aten::bmm": "matmul", "aten::mm": "matmul",
    "aten::scaled_dot_product_attention": "sdpa", "aten::batch_norm": "bn", "aten::layer_norm": "ln",
    "aten::relu": "relu", "aten::gelu": "gelu", "aten::silu": "silu", "aten::sigmoid": "sigmoid",
    "aten::tanh": "tanh", "aten::hardswish": "hard", "aten::hardsigmoid": "hard", "aten::hardtanh": "hard",
    "aten::relu6": "hard", "aten::add": "add", "aten::sub": "add", "aten::mul": "mul", "aten::div": "mul",
    "aten::max_pool2d": "maxpool", "aten::avg_pool2d": "avgpool", "aten::adaptive_avg_pool2d": "gap",
    "aten::softmax": "softmax", "aten::cat": "cat", "aten::embedding": "embedding", "aten::mean": "mean",
}
_RELAX_KIND = {
    "nn.conv2d": "conv", "nn.conv1d": "conv", "nn.attention": "sdpa", "nn.attention_bias": "sdpa",
    "nn.batch_norm": "bn", "nn.layer_norm": "ln", "nn.relu": "relu", "nn.gelu": "gelu",
    "nn.gelu_tanh": "gelu", "nn.silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh", "clip": "hard",
    "add": "add", "subtract": "add", "multiply": "mul", "divide": "mul", "nn.max_pool2d": "maxpool",
    "nn.avg_pool2d": "avgpool", "nn.adaptive_avg_pool2d": "gap", "nn.softmax": "softmax", "concat": "cat",
    "mean": "mean",
}
KINDS = sorted(set(_ATEN_KIND.values()) | {"linear", "embedding", "other"})
Record = tuple[str, list[int], list[int], list[float]]


def _p8(*vals: Any) -> list[float]:
    flat: list[float] = []
    for v in vals:
        flat += [float(t) for t in (v if isinstance(v, (list, tuple)) else [v])]
    return (flat + [0.0] * 8)[:8]


def _two(v: Any, default: int) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) and v else [default]
    return [int(v[0]), int(v[-1])]


def _aten_record(op: list[Any]) -> Record | None:
    name, raw, ci = op[0], op[1], op[2]
    kind = _ATEN_KIND.get(name)
    if kind is None:
        return None
    shp = [[int(v) for v in s] if isinstance(s, list) else [] for s in raw]
    x = shp[0] if shp else []
    y = shp[1] if len(shp) > 1 else []
    arg = (lambda i: ci[i] if len(ci) > i else None)
    if kind in ("add", "mul"):
        if not x or not y:  # scalar arithmetic
            return None
        x, y = (x, y) if math.prod(x) >= math.prod(y) else (y, x)
        return kind, x, y, _p8()
    if kind == "conv":
        if len(x) == 3:  # conv1d as a 2-D conv of height 1
            x, y = [x[0], x[1], 1, x[2]], [y[0], y[1], 1, y[2]]
            return kind, x, y, _p8([1, _two(arg(3), 1)[0]], [0, _two(arg(4), 0)[0]], [1, _two(arg(5), 1)[0]],
                                   arg(6) or 1)
        return kind, x, y, _p8(_two(arg(3), 1), _two(arg(4), 0), _two(arg(5), 1), arg(6) or 1)
    if kind == "sdpa":
        return kind, x, y, _p8(1 if len(shp) > 3 and shp[3] else 0)
    if kind in ("maxpool", "avgpool"):
        k = _two(arg(1), 1)
        return kind, x, [], _p8(k, _two(arg(2), k[0]) if arg(2) else k, _two(arg(3), 0))
    if kind == "gap":
        return kind, x, [], _p8(_two(arg(1), 1))
    if kind == "embedding":
        return kind, x, [math.prod(y)] if y else [], _p8()
    if kind == "cat":
        return kind, [], [], _p8()  # the profiler does not record a tensor list's shapes
    if kind in ("linear", "matmul"):
        return kind, x, y, _p8()
    return kind, x, [], _p8()


def _graph_records(graph: Any) -> list[Record]:
    preds = graph.predecessors()
    out: list[Record] = []
    for n in graph.nodes:
        ins = [list(s) for s in n.input_shapes]
        if n.op == "take" and n.input_is_param and n.input_is_param[0] and len(ins) > 1:
            out.append(("embedding", ins[0], [math.prod(ins[1])], _p8()))  # also on a buffer of positions
            continue
        if n.is_constant:
            continue
        act = [s for s, par in zip(ins, n.input_is_param) if not par]
        x = ins[0] if ins else []
        if n.op == "matmul":
            if len(n.input_is_param) > 1 and n.input_is_param[1] and len(ins[1]) == 2:
                out.append(("linear", x, [ins[1][1], ins[1][0]], _p8()))
            else:
                out.append(("matmul", x, ins[1], _p8()))
            continue
        if n.op == "take":
            continue  # a select of an activation (a view)
        kind = _RELAX_KIND.get(n.op)
        if kind is None:
            continue
        a = n.attrs
        if kind in ("add", "mul"):
            if len(ins) < 2 or not ins[0] or not ins[1]:
                continue  # scalar arithmetic
            src = [graph.nodes[i] for i in preds[n.index] if not graph.nodes[i].is_constant]
            if any(n.input_is_param) and kind == "add" and src and src[0].op in ("nn.conv2d", "nn.conv1d", "matmul"):
                continue  # bias add: inside aten::conv2d / aten::linear
            if n.op == "multiply" and ins[0] == ins[1] and any(
                    s.op == "divide" and any(graph.nodes[j].op == "clip" for j in preds[s.index]) for s in src):
                continue  # x * hardsigmoid(x): inside aten::hardswish
            y = ins[1]
            x, y = (x, y) if math.prod(x) >= math.prod(y) else (y, x)
            out.append((kind, x, y, _p8()))
        elif kind == "conv":
            pad = a.get("padding", [0, 0])
            if len(x) == 3:
                out.append((kind, [x[0], x[1], 1, x[2]], [ins[1][0], ins[1][1], 1, ins[1][2]],
                            _p8([1, _two(a.get("strides"), 1)[0]], [0, int(pad[0]) if pad else 0],
                                [1, _two(a.get("dilation"), 1)[0]], a.get("groups", 1))))
            else:
                out.append((kind, x, ins[1], _p8(_two(a.get("strides"), 1), [int(pad[0]), int(pad[1])]
                                                 if len(pad) > 1 else [0, 0], _two(a.get("dilation"), 1),
                                                 a.get("groups", 1))))
        elif kind == "sdpa":
            q, k = ins[0], ins[1]  # Relax: (batch, seq, heads, dim); aten: (batch, heads, seq, dim)
            out.append((kind, [q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]],
                        _p8(1 if n.op == "nn.attention_bias" else 0)))
        elif kind in ("maxpool", "avgpool"):
            pad = a.get("padding", [0, 0])
            out.append((kind, x, [], _p8(_two(a.get("pool_size"), 1), _two(a.get("strides"), 1),
                                         [int(pad[0]), int(pad[1])] if len(pad) > 1 else [0, 0])))
        elif kind == "gap":
            out.append((kind, x, [], _p8(_two(a.get("output_size"), 1))))
        elif kind == "cat":
            out.append((kind, [], [], _p8()))
        else:
            out.append((kind, act[0] if act else x, [], _p8()))
    return out


def _flops(kind: str, x: list[int], w: list[int], p: list[float]) -> float:
    """Multiply-add FLOPs of the dense kinds (2 per MAC); 0 for the rest."""
    if not x or not w:
        return 0.0
    if kind == "conv" and len(x) == 4 and len(w) == 4:
        sp = 1
        for j in range(2):
            o = (x[2 + j] + 2 * int(p[2 + j]) - int(p[4 + j]) * (w[2 + j] - 1) - 1) // max(int(p[j]), 1) + 1
            sp *= max(o, 1)
        return 2.0 * x[0] * w[0] * sp * math.prod(w[1:])
    if kind == "linear":
        return 2.0 * math.prod(x) * w[0]
    if kind == "matmul":
        return 2.0 * math.prod(x) * w[-1]
    if kind == "sdpa":
        return 4.0 * math.prod(x) * w[-2]
    return 0.0


def _features(r: Record) -> list[float]:
    kind, x, w, p = r
    d0 = ([0] * 4 + x)[-4:]
    d1 = ([0] * 4 + w)[-4:]
    return [float(KINDS.index(kind)), math.log1p(math.prod(x) if x else 0), math.log1p(math.prod(w) if w else 0),
            float(len(x)), *[math.log1p(v) for v in d0], *[math.log1p(v) for v in d1], *p,
            math.log1p(_flops(kind, x, w, p))]


def _mape(p: np.ndarray, t: np.ndarray) -> float:
    return 100.0 * float(np.mean(np.abs(p / t - 1.0)))


def _fit_rel(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Coefficients ``c`` minimising the squared relative error of ``a @ c`` against ``t``."""
    return np.linalg.lstsq(a / t[:, None], np.ones(len(t)), rcond=None)[0]


class _OpTable:
    """A gradient-boosted regressor of log per-call time of an op record, fitted on profiled aten calls."""

    def __init__(self, models: list[dict[str, Any]]) -> None:
        from sklearn.ensemble import HistGradientBoostingRegressor

        x, y, w = [], [], []
        for m in models:
            for rec, us, calls in m["aten"]:
                x.append(_features(rec))
                y.append(math.log(max(us / max(calls, 1e-9), 0.05)))
                w.append(calls)
        self.reg = HistGradientBoostingRegressor(max_iter=600, learning_rate=0.08, max_leaf_nodes=63,
                                                 min_samples_leaf=5, categorical_features=[0], random_state=0)
        self.reg.fit(np.array(x), np.array(y), sample_weight=np.array(w))

    def total_ms(self, recs: list[Record], calls: list[float]) -> float:
        if not recs:
            return 0.0
        t = np.exp(self.reg.predict(np.array([_features(r) for r in recs])))
        return float(np.sum(t * np.array(calls)) / 1e3)


def _prepare(models: list[dict[str, Any]], graphs: dict[str, Any]) -> None:
    """Attach each model's aten records, graph records, in-place sum S (ms) and op counts."""
    for m in models:
        m["aten"] = [(r, op[3], op[4]) for op in m["ops"] if (r := _aten_record(op)) is not None]
        m["S"] = sum(op[3] for op in m["ops"]) / 1e3
        m["n_aten"] = sum(c for _, _, c in m["aten"])
        g = graphs.get(m["graph_hash"])
        m["graph"] = _graph_records(g) if g is not None else None


def _tables(train: list[dict[str, Any]], folds: int = 4) -> tuple[_OpTable, dict[int, _OpTable]]:
    """The table on all training models, and per training model a table fitted without its family's fold."""
    fams = sorted({m["family"] for m in train})
    cross: dict[int, _OpTable] = {}
    for k in range(folds):
        fold = set(fams[k::folds])
        if fold:
            tab = _OpTable([m for m in train if m["family"] not in fold])
            cross.update({id(m): tab for m in train if m["family"] in fold})
    return _OpTable(train), cross


def _analyse(models: list[dict[str, Any]], pair: list[str], twins: dict[str, str],
             data: list[str], seed: int) -> list[dict[str, Any]]:
    test = [m for m in models if m["family"] in pair]
    train = [m for m in models if m["family"] not in pair]
    lab_tr = np.array([m["latency_ms"] for m in train])
    table, cross = _tables(train)

    def s_aten(tab: _OpTable, m: dict[str, Any]) -> float:
        return tab.total_ms([r for r, _, _ in m["aten"]], [c for _, _, c in m["aten"]])

    def s_graph(tab: _OpTable, m: dict[str, Any]) -> float:
        return tab.total_ms(m["graph"], [1.0] * len(m["graph"]))

    def design(s: list[float], n: list[float]) -> np.ndarray:
        return np.stack([np.array(s), np.array(n), np.ones(len(s))], 1)

    c_quick = _fit_rel(np.stack([np.array([m["quick_ms"] for m in train]), np.ones(len(train))], 1), lab_tr)
    c_oracle = _fit_rel(design([m["S"] for m in train], [m["n_aten"] for m in train]), lab_tr)
    c_aten = _fit_rel(design([s_aten(cross[id(m)], m) for m in train], [m["n_aten"] for m in train]), lab_tr)
    tr_g = [m for m in train if m["graph"] is not None]
    c_graph = _fit_rel(design([s_graph(cross[id(m)], m) for m in tr_g], [len(m["graph"]) for m in tr_g]),
                       np.array([m["latency_ms"] for m in tr_g])) if tr_g else None
    gnn: dict[str, float] = {}
    ck = twins.get(",".join(sorted(pair)))
    if ck:
        from dippm_nas.predictor._evaluate import evaluate_checkpoint

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
        aten = design([s_aten(table, m) for m in ms], [m["n_aten"] for m in ms]) @ c_aten
        row: dict[str, Any] = {"pair": ",".join(pair), "family": fam, "n": len(ms), "quick_retiming": _mape(quick, lab),
                               "oracle_inplace_sum": _mape(oracle, lab), "op_table_aten": _mape(aten, lab)}
        mg = [m for m in ms if m["graph"] is not None]
        if mg and c_graph is not None:
            pg = design([s_graph(table, m) for m in mg], [len(m["graph"]) for m in mg]) @ c_graph
            row["op_table_graph"] = _mape(pg, np.array([m["latency_ms"] for m in mg]))
            row["graph_vs_aten_records"] = float(np.median([len(m["graph"]) / max(m["n_aten"], 1) for m in mg]))
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
    prof = Path(args.profiles)
    if not prof.exists():
        _profile(_pick(_rows(args.data), args.per_family, args.seed), prof)
    models = [json.loads(line) for line in open(prof)]
    _prepare(models, _graphs(args.data, {m["graph_hash"] for m in models}))
    fams = {m["family"] for m in models}
    result = []
    for h in args.holdout or ["resnet,vit"]:
        pair = [f for f in h.split(",") if f]
        bad = [f for f in pair if f not in fams]
        if bad:
            ap.error(f"--holdout {h}: {bad} not among the profiled families {sorted(fams)}")
        result += _analyse(models, pair, twins, args.data, args.seed)
    if args.json:
        print(json.dumps({"profiles": str(prof), "models": len(models), "rows": result}))
        return 0
    from _common import machine

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
