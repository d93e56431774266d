"""Where the timm transformer cells miss: which deployment field, which GPU multiplier, which board.

Usage (the timm dataset as ``accuracy_timm_transformers.py`` reads it; the released CSV for the cross-GPU part)::

    nice -n 10 python benchmarks/accuracy/timm_transformer_misses.py --timm timm.sqlite \\
        --data ../shared/data [--json OUT]

Three diagnostics, nothing fitted:

- **fields**: every eager AMP transformer row (:func:`accuracy_timm_transformers.family_of`) predicted with the GPU
  as an unseen one (``unseen_gpu_sigma.unseen_params``), described (``accuracy_deployment.described``), then with
  one described field changed (autocast ``"none"``: a ``.half()`` model; the input copy undescribed; the torch
  version the running process's), undescribed, and undescribed with only ``autocast="float16"`` said: which field
  of the undescribed deployment moves each GPU's MAPE.
- **multipliers**: the unseen GPU with its own fitted ``memory`` or ``compute`` multiplier put back (one at a
  time; in-sample for that multiplier), and the shipped constants: which multiplier the unseen-GPU miss is.
- **boards** (``--data``): the released eager AMP NCHW rows of every model timed on two boards with the same
  PyTorch build tag (RTX 3090 / 4090 at pt240, RTX 4090 / 5090 and RTX 5090 / RTX PRO 6000 Max-Q at pt291), the
  throughput ratio binned by the row's MACs per activation (timm's ``infer_gmacs`` / ``infer_macts``): at the
  memory-bound end the ratio over the datasheet bandwidth ratio is what one board gets per datasheet byte against
  the other, at the compute-bound end the same for the datasheet half-precision tensor rate. No graph is needed.
- **versions** (``--data``): the RTX 4090 rows of the dataset timed under PyTorch 2.9.1 whose model the released CSV
  also has at 2.4 on the same board and batch: the measured step-time change against the predicted one (shipped
  constants, described, the torch version set to 2.4.0 and 2.9.1), the prediction's change split into the SDPA math
  path's matmuls and its other nodes (the math path runs in float32 from 2.5), and the factor on those matmuls that
  would close the gap.
- **autocast on CNN cells** (``--ryujaehun`` / ``--accel``, the datasets ``accuracy_deployment.py`` reads): the
  MAPE of every float16 row, the other fields undescribed, as a ``.half()`` model, with ``autocast="float16"`` said
  and with autocast undescribed too (shipped constants): which released cells an autocast left undescribed moves.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_deployment import described  # noqa: E402  (sibling scripts)
from accuracy_timm_transformers import family_of  # noqa: E402
from unseen_gpu_sigma import source_rows, unseen_params  # noqa: E402

from dippm_nas import Deployment  # noqa: E402
from dippm_nas.dataset import load_measurements  # noqa: E402
from dippm_nas.devices import get_device  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.graph import SDPA_MATH_ATTR  # noqa: E402
from dippm_nas.training import DEVICE_ALIASES  # noqa: E402
from dippm_nas.prior import (GEFORCE_SCALE_KEY, PriorParams, default_params, node_costs, predict,  # noqa: E402
                             resolved_settings)

#: The deployments of the fields diagnostic, in print order.
FIELDS = ("described", "autocast off", "copy undescribed", "torch undescribed", "undescribed",
          "undescribed + autocast")
#: The constants of the multipliers diagnostic, in print order.
CONSTANTS = ("unseen", "unseen + own memory", "unseen + own compute", "unseen, GeForce compute every class", "shipped")
#: The GeForce GPUs with fitted multipliers (the GeForce entry's source).
GEFORCE_FITTED = ("rtx-3090", "rtx-4090", "rtx-5090")
#: Board pairs of the cross-GPU diagnostic: (CSV GPU name, catalogue id) twice and the PyTorch build tag of both.
PAIRS: tuple[tuple[str, str, str, str, str], ...] = (
    ("NVIDIA GeForce RTX 3090", "rtx-3090", "NVIDIA GeForce RTX 4090", "rtx-4090", "pt240"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090", "NVIDIA GeForce RTX 5090", "rtx-5090", "pt291"),
    ("NVIDIA GeForce RTX 5090", "rtx-5090", "NVIDIA RTX PRO 6000 Blackwell Max-Q", "", "pt291"),
)
#: Percentiles of MACs per activation that bound the bins.
BIN_EDGES = (0, 10, 25, 50, 75, 90, 100)


def field_deployments(d: Deployment) -> dict[str, Deployment]:
    """The deployments of :data:`FIELDS` for a row described as ``d``."""
    return {
        "described": d,
        "autocast off": dataclasses.replace(d, autocast="none"),
        "copy undescribed": dataclasses.replace(d, input_copy=None),
        "torch undescribed": dataclasses.replace(d, versions=None, framework=None),
        "undescribed": Deployment(),
        "undescribed + autocast": Deployment(autocast="float16"),
    }


def constant_params(base: PriorParams, device: str) -> dict[str, PriorParams]:
    """The constants of :data:`CONSTANTS` for ``device`` (a fitted GeForce GPU): unseen, unseen with its own memory
    or compute multiplier in its unseen entry (the GeForce entry with the other GPUs' geometric means), unseen with
    the other fitted GeForce GPUs' geometric-mean compute multiplier for every class (the GeForce entry scales
    only ``matmul`` so), shipped."""
    un = unseen_params(base, device)
    own, gf = base.device_scales[device], un.device_scales[GEFORCE_SCALE_KEY]
    others = [g for g in GEFORCE_FITTED if g != device and g in base.device_scales]
    geforce = math.exp(float(np.mean([math.log(base.device_scales[g].compute) for g in others])))

    def with_entry(entry: Any) -> PriorParams:
        return dataclasses.replace(un, device_scales={**un.device_scales, device: entry})

    return {"unseen": un, "unseen + own memory": with_entry(dataclasses.replace(gf, memory=own.memory)),
            "unseen + own compute": with_entry(dataclasses.replace(gf, compute=own.compute, classes={})),
            "unseen, GeForce compute every class": with_entry(dataclasses.replace(gf, compute=geforce, classes={})),
            "shipped": base}


def mape(ratios: Sequence[float]) -> float:
    """Mean absolute percentage error of predicted / measured ratios, %."""
    return float(np.mean([abs(r - 1.0) for r in ratios]) * 100) if ratios else float("nan")


def score_rows(rows: list[Any]) -> list[dict[str, Any]]:
    """One record per transformer row: its label and the predicted / measured ratio of every field deployment
    (unseen-GPU constants) and of the described and undescribed deployments under every constant set."""
    base = default_params()
    consts: dict[str, dict[str, PriorParams]] = {}
    out = []
    for mg in rows:
        m = mg.measurement
        fam = family_of(str(m["config"]["model"]))
        dev = m["device"]
        if fam is None or dev not in base.device_scales:
            continue
        cs = consts.setdefault(dev, constant_params(base, dev))
        lab = float(m["latency_ms"])
        rec: dict[str, Any] = {"model": m["config"]["model"], "family": fam, "device": dev, "label_ms": lab}
        deps = field_deployments(described("timm", m))
        for name, dep in deps.items():
            pred = predict(mg.graph, dev, params=cs["unseen"], deployment=dep, mig=False)
            rec[f"field {name}"] = pred.latency_ms / lab
        for cname, p in cs.items():
            for mode in ("described", "undescribed"):
                rec[f"{cname} {mode}"] = predict(mg.graph, dev, params=p, deployment=deps[mode],
                                                 mig=False).latency_ms / lab
        rec["classes"] = class_shares(mg.graph, dev, cs["unseen"], deps["described"], lab)
        out.append(rec)
    return out


def class_shares(graph: Any, device: str, params: PriorParams, deployment: Deployment,
                 label_ms: float) -> dict[str, float]:
    """Predicted kernel time per op class and per bound (``"compute-bound"`` / ``"memory-bound"``: the node's
    larger roofline term) over the measured time, for one row and deployment."""
    r = resolved_settings(device, params=params, deployment=deployment)
    c = node_costs(graph, r.device, params, tf32_conv=r.tf32_conv, tf32_matmul=r.tf32_matmul,
                   channels_last=r.channels_last, host=r.host, autocast=r.autocast, math_float32=r.math_float32)
    out: dict[str, float] = defaultdict(float)
    for i, cls in enumerate(c.classes):
        ms = float(c.gpu_us[i]) / 1e3 / label_ms
        out[cls] += ms
        out["compute-bound" if c.compute_us[i] >= c.memory_us[i] else "memory-bound"] += ms
    return {k: round(v, 4) for k, v in out.items() if v > 0}


def summarise_rows(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE per GPU of every field deployment and constant set, and per (GPU, family) the described and undescribed
    ratios (unseen constants) of each row."""
    by_gpu: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_gpu[r["device"]].append(r)
    keys = [f"field {f}" for f in FIELDS] + [f"{c} {m}" for c in CONSTANTS for m in ("described", "undescribed")]
    gpus = {g: {"n": len(rs), **{k: mape([r[k] for r in rs]) for k in keys}} for g, rs in sorted(by_gpu.items())}
    rows = [{k: r[k] for k in ("device", "family", "model", "classes")} | {k: round(r[f"field {k}"], 3) for k in FIELDS}
            for r in sorted(recs, key=lambda r: (r["family"], r["model"], r["device"]))]
    return {"gpus": gpus, "rows": rows}


def board_pairs(csv_path: Path) -> list[dict[str, Any]]:
    """The cross-GPU diagnostic (module docstring) from the released timm CSV."""
    t: dict[tuple[str, str, str, str], tuple[float, float]] = {}
    with open(csv_path, newline="") as fh:
        for r in csv.DictReader(fh):
            if (r["torch_compile"], r["precision"], r["memory_layout"]) != ("eager", "amp", "nchw"):
                continue
            try:
                sps, macs, acts = float(r["infer_samples_per_sec"]), float(r["infer_gmacs"]), float(r["infer_macts"])
            except ValueError:
                continue
            if sps > 0 and macs > 0 and acts > 0:
                t[(r["model"], r["infer_img_size"], r["gpu"], r["torch_version_tag"])] = (sps, macs / acts)
    out = []
    for g1, id1, g2, id2, tag in PAIRS:
        both = [(a, t[(m, s, g2, tg)]) for (m, s, g, tg), a in t.items()
                if g == g1 and tg == tag and (m, s, g2, tg) in t]
        if not both:
            continue
        x = np.log10([a[1] for a, _ in both])
        y = np.array([b[0] / a[0] for a, b in both])
        edges = np.percentile(x, BIN_EDGES)
        bins = []
        for lo, hi in zip(edges[:-1], edges[1:]):
            sel = (x >= lo) & (x <= hi)
            bins.append({"log10_macs_per_act": [round(float(lo), 2), round(float(hi), 2)], "n": int(sel.sum()),
                         "median": float(np.median(y[sel])), "p25": float(np.percentile(y[sel], 25)),
                         "p75": float(np.percentile(y[sel], 75))})
        entry: dict[str, Any] = {"pair": f"{g1} -> {g2}", "tag": tag, "models": len(both), "bins": bins}
        if id1 and id2:
            d1, d2 = get_device(id1), get_device(id2)
            entry["bandwidth_ratio"] = d2.bandwidth_gbps / d1.bandwidth_gbps
            entry["fp16_tensor_ratio"] = d2.fp16_tensor_tflops / d1.fp16_tensor_tflops
            entry["per_byte"] = bins[0]["median"] / entry["bandwidth_ratio"]
            entry["per_flop"] = bins[-1]["median"] / entry["fp16_tensor_ratio"]
        out.append(entry)
    return out


def version_deltas(rows: list[Any], csv_path: Path) -> list[dict[str, Any]]:
    """The versions diagnostic (module docstring): one record per RTX 4090 pt291 transformer row with a pt240 twin."""
    pt240: dict[tuple[str, str], tuple[float, float]] = {}
    with open(csv_path, newline="") as fh:
        for r in csv.DictReader(fh):
            if ((r["gpu"], r["torch_version_tag"], r["torch_compile"], r["precision"], r["memory_layout"])
                    == ("NVIDIA GeForce RTX 4090", "pt240", "eager", "amp", "nchw") and r["infer_step_time"]):
                pt240[(r["model"], r["infer_img_size"])] = (float(r["infer_step_time"]), float(r["infer_batch_size"]))
    base = default_params()
    out = []
    for mg in rows:
        m = mg.measurement
        key = (str(m["config"]["model"]), str(m["config"]["img_size"]))
        if (m["device"] != "rtx-4090" or m["conditions"].get("torch_version_tag") != "pt291"
                or family_of(key[0]) is None or key not in pt240 or pt240[key][1] != float(m["batch_size"])):
            continue
        pred, split = {}, {}
        for v in ("2.4.0", "2.9.1"):
            dep = dataclasses.replace(described("timm", m), versions={"torch": v})
            pred[v] = predict(mg.graph, "rtx-4090", params=base, deployment=dep, mig=False).latency_ms
            split[v] = _math_path_ms(mg.graph, base, dep)
        mm, other = (split["2.9.1"][k] - split["2.4.0"][k] for k in (0, 1))
        measured, predicted = float(m["latency_ms"]) - pt240[key][0], pred["2.9.1"] - pred["2.4.0"]
        out.append({"model": key[0], "measured_pt240_ms": pt240[key][0], "measured_pt291_ms": float(m["latency_ms"]),
                    "predicted_pt240_ms": pred["2.4.0"], "predicted_pt291_ms": pred["2.9.1"],
                    "measured_change_ms": measured, "predicted_change_ms": predicted, "math_matmul_change_ms": mm,
                    "math_other_change_ms": other,
                    "matmul_factor": 1 + (measured - predicted) / mm if mm > 0 else None})
    return out


def _math_path_ms(graph: Any, params: PriorParams, deployment: Deployment) -> tuple[float, float]:
    """Kernel time of the SDPA math path's matmuls and of its other nodes on the RTX 4090, ms."""
    r = resolved_settings("rtx-4090", params=params, deployment=deployment)
    c = node_costs(graph, r.device, params, tf32_conv=r.tf32_conv, tf32_matmul=r.tf32_matmul,
                   channels_last=r.channels_last, host=r.host, autocast=r.autocast, math_float32=r.math_float32)
    mm = other = 0.0
    for i, nd in enumerate(graph.nodes):
        if nd.attrs.get(SDPA_MATH_ATTR):
            if nd.op == "matmul":
                mm += float(c.gpu_us[i]) / 1e3
            else:
                other += float(c.gpu_us[i]) / 1e3
    return mm, other


def autocast_moves(path: Path, source: str) -> dict[str, dict[str, float]]:
    """Per device, the MAPE of the float16 rows of ``path`` (a ``source`` dataset with graphs) with every field but
    autocast undescribed and autocast said as ``"none"`` (a ``.half()`` model), said as ``"float16"``, and left
    undescribed too (the mixture of the two; shipped constants)."""
    base = default_params()
    cells: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for mg in load_measurements(path, source=source, status="ok"):
        m = mg.measurement
        if mg.graph is None or not m.get("latency_ms") or str(m.get("dtype")) != "float16":
            continue
        dev, lab = DEVICE_ALIASES.get(m["device"], m["device"]), float(m["latency_ms"])
        cells[dev].append(tuple(predict(mg.graph, dev, params=base, deployment=d, mig=False).latency_ms / lab
                                for d in (Deployment(autocast="none"), Deployment(autocast="float16"), Deployment())))
    return {dev: {"n": len(v), "half": mape([r[0] for r in v]), "autocast said": mape([r[1] for r in v]),
                  "undescribed": mape([r[2] for r in v])} for dev, v in sorted(cells.items())}


def _print(summary: dict[str, Any], boards: list[dict[str, Any]]) -> None:
    print("MAPE per GPU, unseen-GPU constants, one field of the described deployment at a time:")
    print(f"  {'GPU':9} {'n':>3} " + " ".join(f"{f:>22}" for f in FIELDS))
    for g, e in summary["gpus"].items():
        print(f"  {g:9} {e['n']:3d} " + " ".join(f"{e['field ' + f]:20.1f} %" for f in FIELDS))
    print("\nMAPE per GPU, described / undescribed, by GPU constants:")
    print(f"  {'GPU':9} " + " ".join(f"{c[:24]:>24}" for c in CONSTANTS))
    for g, e in summary["gpus"].items():
        print(f"  {g:9} " + " ".join(f"{e[c + ' described']:9.1f} % / {e[c + ' undescribed']:5.1f} %   "
                                      for c in CONSTANTS))
    print("\npredicted / measured per row (unseen-GPU constants):")
    for r in summary["rows"]:
        print(f"  {r['device']:9} {r['family']:15} {r['model'][:34]:34} " + " ".join(f"{r[f]:5.2f}" for f in FIELDS))
    print("\npredicted kernel time over measured, described, unseen-GPU constants: by bound, then the largest classes:")
    for r in summary["rows"]:
        c = dict(r["classes"])
        bounds = f"compute {c.pop('compute-bound', 0.0):.2f} memory {c.pop('memory-bound', 0.0):.2f}"
        top = " ".join(f"{k} {v:.2f}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])[:5])
        print(f"  {r['device']:9} {r['model'][:30]:30} {bounds} | {top}")
    for b in boards:
        print(f"\n{b['pair']} ({b['tag']}, {b['models']} models): throughput ratio by MACs per activation"
              + (f"; datasheet bandwidth ratio {b['bandwidth_ratio']:.3f}, FP16 tensor ratio "
                 f"{b['fp16_tensor_ratio']:.3f}; per datasheet byte {b['per_byte']:.3f}, per datasheet FLOP "
                 f"{b['per_flop']:.3f}" if "per_byte" in b else ""))
        for x in b["bins"]:
            lo, hi = x["log10_macs_per_act"]
            print(f"  10^[{lo:5.2f}, {hi:5.2f}] n={x['n']:4d} median {x['median']:.3f} "
                  f"(p25 {x['p25']:.3f}, p75 {x['p75']:.3f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--timm", type=Path, required=True, help="timm dataset with captured graphs (SQLite)")
    ap.add_argument("--data", type=Path, help="the shared data folder (timm_benchmark_infer_gpu.csv), for boards")
    ap.add_argument("--ryujaehun", type=Path, help="ryujaehun dataset with graphs, for the autocast-on-CNN check")
    ap.add_argument("--accel", type=Path, help="Accel-NASBench dataset with graphs, for the same check")
    ap.add_argument("--json", type=Path, help="write the records and the summaries here")
    a = ap.parse_args(argv)
    rows = source_rows(a.timm, "timm")
    recs = score_rows(rows)
    if not recs:
        raise SystemExit(f"{a.timm}: no eager timm row of a transformer family on a GPU with fitted multipliers")
    summary = summarise_rows(recs)
    boards = board_pairs(a.data / "timm_benchmark_infer_gpu.csv") if a.data else []
    versions = version_deltas(rows, a.data / "timm_benchmark_infer_gpu.csv") if a.data else []
    _print(summary, boards)
    if versions:
        print("\nRTX 4090, PyTorch 2.4 -> 2.9.1 (same batch), shipped constants, described:")
    for v in versions:
        factor = f"{v['matmul_factor']:.2f}" if v["matmul_factor"] is not None else "-"
        print(f"  {v['model'][:30]:30} measured {v['measured_pt240_ms']:7.1f} -> {v['measured_pt291_ms']:7.1f} "
              f"({v['measured_change_ms']:+6.1f}) ms, predicted {v['predicted_pt240_ms']:7.1f} -> "
              f"{v['predicted_pt291_ms']:7.1f} ({v['predicted_change_ms']:+6.1f}: math-path matmuls "
              f"{v['math_matmul_change_ms']:+5.1f}, its other nodes {v['math_other_change_ms']:+5.1f}); matmul "
              f"factor closing the gap {factor}")
    cnn = {src: autocast_moves(path, src) for src, path in (("ryujaehun", a.ryujaehun), ("accel-nasbench", a.accel))
           if path is not None}
    for src, cells in cnn.items():
        for dev, e in cells.items():
            print(f"{src} {dev} float16 rows: {e['n']}, MAPE as .half() {e['half']:.1f} %, with autocast said "
                  f"{e['autocast said']:.1f} %, autocast undescribed {e['undescribed']:.1f} %")
    if a.json:
        out = {"summary": summary, "boards": boards, "versions": versions, "cnn_autocast": cnn, "records": recs}
        write_output(a.json, json.dumps(out, indent=1) + "\n", "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
