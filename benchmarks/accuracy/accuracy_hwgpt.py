"""HW-GPT-Bench: predicted GPU kernel time (``gpu_ms``) of GPT NAS candidates against the released profiler time.

Usage::

    nice -n 10 python benchmarks/accuracy/accuracy_hwgpt.py --data ../shared/data [--per-space 30] [--seed 0]
        [--json OUT]

``hwgpt_bench_gpu_latency_energy.csv`` (automl/HW-GPT-Bench, Apache-2.0): the GPT spaces ``s`` / ``m`` / ``l`` (500
architectures each, the ``hwgpt`` search space) with ``latency`` = the PyTorch profiler's summed GPU kernel time of one
forward pass at sequence 1024 (batch 8 / 4 / 1 for s / m / l, ``median`` of 10), bf16 autocast on Ampere-class and
Hopper boards, fp16 autocast on the others, float32 weights. Rows of A100 boards are never read (kept aside).

For ``--per-space`` architectures per space (drawn with ``random.Random(seed)`` from the architectures with a
latency row) the graph is assembled once (``dippm_nas.capture.assemble``, blocks cached in ``--cache``) and
predicted on every released GPU that the device catalogue holds (an H100 board's variant is not recorded: both
``h100-sxm5-80gb`` and ``h100-pcie-80gb`` are scored; the V100 and P100 are scored as ``v100-sxm2-32gb`` and
``p100-pcie-16gb``, the variants assumed in their device files) twice: **described** as the benchmark ran
(``Deployment(runtime="eager", framework="torch-2", autocast=<the row's dtype>, input_copy="none")``) and
**undescribed** (``Deployment()``), the latter two ways: the float32 graph the rows' weights are (nothing of the
run said: a float32 graph's undescribed autocast is none) and **half undescribed**, the graph captured at the row's
half dtype (``InputSpec`` ``dtype`` = the row's autocast dtype: the user says the precision and nothing else, so
the prior's ``gpu_ms`` is the mixture of a pure-half model and autocast at that dtype,
``dippm_nas.prior.UNKNOWN_AUTOCAST_WEIGHTS``). ``gpu_ms`` is compared with the row's ``median``: MAPE, Kendall τ within the
space, and the pred/label ratio (median, min, max). The shipped SDPA efficiencies (``sdpa_eta_flash``,
``sdpa_eta_efficient``) are fitted on these rows (``scripts/fit/fit_transformer_kernels.py``), so the described
column is in-sample for them; ``--leave-one-gpu-out`` adds the described figure with both efficiencies refitted
without the scored GPU's rows (``fit_transformer_kernels.fit_etas``; an H100 board's rows leave with the other
board's). Nothing else of the prior is fitted on these rows. The share of each operator class in the described
prediction (matmul, attention, normalisation, other = element-wise, casts, copies) and its Kendall τ with the ratio
over the scored architectures say which part is missed systematically.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "fit"))

import fit_transformer_kernels as ftk  # noqa: E402

HWGPT_FILE = "hwgpt_bench_gpu_latency_energy.csv"
#: released ``device`` -> catalogue ids it may be (the first present ones are scored).
RELEASED_GPUS: dict[str, tuple[str, ...]] = {
    "h100": ("h100-sxm5-80gb", "h100-pcie-80gb"), "a40": ("a40",), "a6000": ("rtx-a6000", "a6000"),
    "v100": ("v100-sxm2-32gb",),
    "P100": ("p100-pcie-16gb",), "rtx2080": ("rtx-2080",), "rtx3080": ("rtx-3080",),
}
AUTOCAST = {"bfloat16_autocast": "bfloat16", "float16_autocast": "float16"}
OP_CLASSES = ("matmul", "attention", "norm", "other")


@dataclasses.dataclass(frozen=True)
class HwGptRow:
    """One latency row of the HW-GPT-Bench file.

    Attributes:
        space: ``"s"``, ``"m"`` or ``"l"``; arch_id: e.g. ``"s-00001"``; device: the file's device name.
        autocast: ``"bfloat16"`` or ``"float16"``; batch_size: samples per pass.
        median_ms: median profiler kernel time of one forward pass, ms; config: the ``hwgpt`` config.
    """

    space: str
    arch_id: str
    device: str
    autocast: str
    batch_size: int
    median_ms: float
    config: dict[str, Any]


def read_hwgpt_rows(path: Path) -> list[HwGptRow]:
    """The latency rows of ``path`` (A100 rows are dropped before anything is read from them).

    Raises:
        InvalidValueError: a missing column, an unknown precision or a non-positive median (row named).
    """
    from dippm_nas.errors import InvalidValueError
    from search_spaces import config_from_hwgpt_row

    out: list[HwGptRow] = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            if "a100" in (row.get("device") or "").lower() or "a100" in (row.get("gpu_model") or "").lower():
                continue  # kept aside: never looked at
            if row.get("metric") != "latency":
                continue
            try:
                median, batch = float(row["median"]), int(row["batch_size"])
                autocast = AUTOCAST[row["precision"]]
            except (KeyError, ValueError) as e:
                raise InvalidValueError(f"{path}:{i}: unreadable HW-GPT-Bench latency row ({e!r}); needs median, "
                                        f"batch_size and precision in {sorted(AUTOCAST)}") from None
            if not median > 0 or batch < 1:
                raise InvalidValueError(f"{path}:{i}: median must be > 0 ms and batch_size >= 1, "
                                        f"got {median!r}, {batch!r}")
            out.append(HwGptRow(row["search_space"], row["arch_id"], row["device"], autocast, batch, median,
                                config_from_hwgpt_row(row)))
    return out


def sample_archs(rows: list[HwGptRow], per_space: int, seed: int) -> dict[str, list[str]]:
    """``per_space`` architecture ids of each space, drawn with ``random.Random(seed)`` (sorted ids first)."""
    rng = random.Random(seed)
    ids: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        ids[r.space].add(r.arch_id)
    return {s: sorted(rng.sample(sorted(ids[s]), min(per_space, len(ids[s])))) for s in sorted(ids)}


def _op_class(op: str) -> str:
    o = op.lower()
    if "attention" in o:
        return "attention"
    if "matmul" in o or "dense" in o or "linear" in o:
        return "matmul"
    if "norm" in o:
        return "norm"
    return "other"


def _shares(graph: Any, device: str, deployment: Any) -> dict[str, float]:
    """Share of each :data:`OP_CLASSES` in the analytic prior's kernel time of ``graph``."""
    from dippm_nas.prior import estimate

    est = estimate(graph, device, deployment=deployment)
    t: dict[str, float] = defaultdict(float)
    for node, ms in zip(graph.nodes, est.node_time_ms):
        t[_op_class(node.op)] += float(ms)
    total = sum(t.values()) or 1.0
    return {c: t[c] / total for c in OP_CLASSES}


def _predict_all(rows: list[HwGptRow], chosen: dict[str, list[str]], gpus: dict[str, list[str]],
                 cache: str) -> list[dict[str, Any]]:
    """One record per (row, catalogue GPU): label, described and undescribed ``gpu_ms``, op-class shares."""
    import search_spaces as ss
    from dippm_nas import Deployment, predict
    from dippm_nas.cache import ConversionCache
    from dippm_nas.capture import assemble

    keep = {a for ids in chosen.values() for a in ids}
    by_arch: dict[str, list[HwGptRow]] = defaultdict(list)
    for r in rows:
        if r.arch_id in keep and gpus.get(r.device):
            by_arch[r.arch_id].append(r)
    out: list[dict[str, Any]] = []
    conv = ConversionCache(f"sqlite:///{cache}")
    undescribed = Deployment()
    try:
        for n, arch in enumerate(sorted(by_arch), 1):
            graphs: dict[int, Any] = {}
            t0 = time.time()
            for r in by_arch[arch]:
                for dt in ("float32", r.autocast):  # one capture per architecture, batch and dtype, for every GPU
                    if (r.batch_size, dt) not in graphs:
                        spec = ss.get_space("hwgpt").input_spec(r.config, batch_size=r.batch_size, dtype=dt)
                        graphs[(r.batch_size, dt)] = assemble("hwgpt", r.config, spec, cache=conv)
                g, g_half = graphs[(r.batch_size, "float32")], graphs[(r.batch_size, r.autocast)]
                described = Deployment(runtime="eager", framework="torch-2", autocast=r.autocast, input_copy="none")
                for dev in gpus[r.device]:
                    pd = predict(g, device=dev, deployment=described, mig=False)
                    pu = predict(g, device=dev, deployment=undescribed, mig=False)
                    ph = predict(g_half, device=dev, deployment=undescribed, mig=False)
                    out.append({"space": r.space, "arch_id": arch, "released": r.device, "device": dev,
                                "label_ms": r.median_ms, "described_ms": pd.gpu_ms, "undescribed_ms": pu.gpu_ms,
                                "undescribed_half_ms": ph.gpu_ms,
                                "shares": _shares(g, dev, described)})
            print(f"[{n}/{len(by_arch)}] {arch} {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    finally:
        conv.close()
    return out


def _add_logo(recs: list[dict[str, Any]], units: list[dict[str, Any]]) -> None:
    """Add ``described_logo_ms`` to each record: its described ``gpu_ms`` with the SDPA efficiencies fitted on the
    unit records (:func:`fit_transformer_kernels.unit_records`) of the other released GPUs."""
    etas = {rel: ftk.fit_etas(units, exclude=rel) for rel in {u["released"] for u in units}}
    by_key = {(u["arch_id"], u["device"]): u for u in units}
    for r in recs:
        u = by_key[(r["arch_id"], r["device"])]
        e = etas[u["released"]]
        r["described_logo_ms"] = ftk.repriced_ms(u, e["flash"] or 1.0, e["efficient"] or 1.0)
        r["logo_etas"] = e


def _metrics(recs: list[dict[str, Any]], key: str) -> dict[str, float]:
    from scipy.stats import kendalltau

    y = np.array([r["label_ms"] for r in recs])
    p = np.array([r[key] for r in recs])
    ratio = p / y
    tau = float(kendalltau(p, y).statistic) if len(recs) > 2 else float("nan")
    return {"n": len(recs), "mape_pct": float(np.mean(np.abs(ratio - 1)) * 100), "tau": tau,
            "ratio_median": float(np.median(ratio)), "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}


def _share_tau(recs: list[dict[str, Any]]) -> dict[str, float]:
    """Kendall τ between each op class's predicted share and the described pred/label ratio."""
    from scipy.stats import kendalltau

    ratio = [r["described_ms"] / r["label_ms"] for r in recs]
    return {c: float(kendalltau([r["shares"][c] for r in recs], ratio).statistic) for c in OP_CLASSES}


def summarise(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (catalogue GPU, space): described and undescribed metrics, mean op-class shares and their τ with the
    described ratio."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        cells[(r["device"], r["space"])].append(r)
    out = []
    for (dev, space), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], "sml".index(kv[0][1]))):
        logo = ({"described_logo": _metrics(rs, "described_logo_ms")}
                if all("described_logo_ms" in r for r in rs) else {})
        out.append({"device": dev, "space": space, **logo, "described": _metrics(rs, "described_ms"),
                    "undescribed": _metrics(rs, "undescribed_ms"),
                    "undescribed_half": _metrics(rs, "undescribed_half_ms"),
                    "shares": {c: float(np.mean([r["shares"][c] for r in rs])) for c in OP_CLASSES},
                    "share_tau_with_ratio": _share_tau(rs) if len(rs) > 2 else {}})
    return out


def _print(summary: list[dict[str, Any]], missing: list[str]) -> None:
    head = (f"{'device':16} {'sp':2} {'n':>3} | {'desc MAPE':>9} {'τ':>5} {'ratio med [min,max]':>20} | "
            f"{'undesc MAPE':>11} {'τ':>5} {'ratio med':>9} | {'half undesc':>11} {'τ':>5} {'ratio med':>9} | "
            "shares mm/attn/norm/other")
    print(head)
    print("-" * len(head))
    for c in summary:
        d, u, h, s = c["described"], c["undescribed"], c["undescribed_half"], c["shares"]
        rng = f"{d['ratio_median']:.2f} [{d['ratio_min']:.2f},{d['ratio_max']:.2f}]"
        print(f"{c['device']:16} {c['space']:2} {d['n']:3d} | {d['mape_pct']:8.1f}% {d['tau']:5.2f} {rng:>20} | "
              f"{u['mape_pct']:10.1f}% {u['tau']:5.2f} {u['ratio_median']:9.2f} | "
              f"{h['mape_pct']:10.1f}% {h['tau']:5.2f} {h['ratio_median']:9.2f} | "
              + "/".join(f"{s[k]:.2f}" for k in OP_CLASSES))
    if summary and "described_logo" in summary[0]:
        print("\ndescribed, SDPA efficiencies fitted without the scored GPU (leave-one-GPU-out):")
        for c in summary:
            d = c["described_logo"]
            print(f"  {c['device']:16} {c['space']}: MAPE {d['mape_pct']:5.1f} %  τ {d['tau']:.2f}  "
                  f"ratio {d['ratio_median']:.2f} [{d['ratio_min']:.2f},{d['ratio_max']:.2f}]")
        met = [c for c in summary if c["described_logo"]["mape_pct"] <= 10 and c["described_logo"]["tau"] >= 0.9]
        print(f"  target (≤ 10 % and τ ≥ 0.9) met in {len(met)} of {len(summary)} cells")
    print("\nτ(op-class share, described ratio) per cell:")
    for c in summary:
        print(f"  {c['device']:16} {c['space']}: " + ", ".join(f"{k} {v:+.2f}" for k, v in
                                                             c["share_tau_with_ratio"].items()))
    met = [c for c in summary if c["described"]["mape_pct"] <= 10 and c["described"]["tau"] >= 0.9]
    print(f"\ntarget (≤ 10 % MAPE and τ ≥ 0.9 per GPU and space, described): met in {len(met)} of {len(summary)} "
          "cells (SDPA efficiencies in-sample)")
    if missing:
        print("released GPUs not in the device catalogue (not scored): " + ", ".join(missing))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--data", type=Path, required=True, help="folder holding " + HWGPT_FILE)
    ap.add_argument("--per-space", type=int, default=30, help="architectures per space (default 30)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the architecture sample (default 0)")
    ap.add_argument("--cache", default="/tmp/dippm_hwgpt_blocks.sqlite", help="block conversion cache (SQLite)")
    ap.add_argument("--json", type=Path, help="write the records and the summary here")
    ap.add_argument("--leave-one-gpu-out", action="store_true",
                    help="also score with the SDPA efficiencies refitted without each GPU's rows")
    a = ap.parse_args(argv)
    from dippm_nas.devices import list_devices

    catalogue = set(list_devices())
    gpus = {rel: [d for d in ids if d in catalogue] for rel, ids in RELEASED_GPUS.items()}
    missing = [rel for rel, ids in gpus.items() if not ids]
    rows = read_hwgpt_rows(a.data / HWGPT_FILE)
    chosen = sample_archs([r for r in rows if gpus.get(r.device)], a.per_space, a.seed)
    recs = _predict_all(rows, chosen, gpus, a.cache)
    if a.leave_one_gpu_out:
        _add_logo(recs, ftk.unit_records(a.data, a.per_space, a.seed, a.cache))
    summary = summarise(recs)
    print(f"HW-GPT-Bench gpu_ms vs profiler kernel time: {a.per_space} architectures per space, seed {a.seed}")
    _print(summary, missing)
    if a.json:
        from dippm_nas.errors import InvalidValueError
        from dippm_nas.files import write_output

        write_output(a.json, json.dumps({"per_space": a.per_space, "seed": a.seed, "not_in_catalogue": missing,
                                         "summary": summary, "records": recs}, indent=1) + "\n", "--json",
                     error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
