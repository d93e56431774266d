"""timm transformer families on the released GPUs: the prior's latency before and after the SDPA kernel model.

Usage (the timm dataset as ``accuracy_deployment.py`` imports it; graphs captured, nothing downloaded)::

    dippm-nas dataset import timm ../shared/data/timm_benchmark_infer_gpu.csv --out timm.sqlite
    nice -n 10 python benchmarks/accuracy/accuracy_timm_transformers.py --timm timm.sqlite [--shipped] [--json OUT]

The eager AMP rows of the dataset whose model belongs to a transformer family (:data:`FAMILIES`, by timm model
name) are predicted by the analytic prior, per GPU and family, four ways: **before** (``sdpa_eta_flash`` /
``sdpa_eta_efficient`` unset: every attention node priced as a plain contraction over its whole score matrix) and
**after** (the shipped SDPA efficiencies, :mod:`dippm_nas.prior._sdpa`), each with the deployment **described**
(``accuracy_deployment.described``: eager, the row's autocast and torch version, no input copy) and **undescribed**
(``Deployment()``). The GPU's constants are those of an unseen GPU (``unseen_gpu_sigma.unseen_params``: its own
efficiency multipliers, fitted on timm rows, replaced by the geometric mean of the other GPUs'), so no constant
used was fitted on the scored GPU; ``--shipped`` keeps the GPU's own multipliers instead (in-sample: fitted on
timm rows of that GPU, these models among them or not). Leave-family-out holds by construction for the SDPA efficiencies, which are
fitted on HW-GPT-Bench's GPT rows only (``scripts/fit/fit_transformer_kernels.py``), none of them a timm family;
the other GPUs' multipliers were fitted on up to 60 timm models of every family (``calibrate_prior.py
--timm-models 60``), so they are not leave-family-out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_deployment import described  # noqa: E402  (sibling scripts)
from unseen_gpu_sigma import source_rows, unseen_params  # noqa: E402

from dippm_nas import Deployment  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.prior import default_params, predict  # noqa: E402

#: Transformer families by timm model-name prefix.
FAMILIES: dict[str, tuple[str, ...]] = {
    "vit": ("vit_", "flexivit", "vitamin"), "deit": ("deit",), "beit": ("beit",), "eva": ("eva",),
    "swin": ("swin",), "twins": ("twins",), "maxvit": ("maxvit", "maxxvit"), "metaformer": ("caformer", "convformer"),
    "efficientformer": ("efficientformer",), "nextvit": ("nextvit",), "xcit": ("xcit",), "cait": ("cait",),
    "coat": ("coat",), "crossvit": ("crossvit",), "levit": ("levit",), "pvt": ("pvt",), "volo": ("volo",),
    "hiera": ("hiera",),
}
VARIANTS = ("before", "after")
MODES = ("described", "undescribed")


def family_of(model: str) -> str | None:
    """The :data:`FAMILIES` key of a timm model name, ``None`` for a model of no transformer family."""
    return next((f for f, prefixes in FAMILIES.items() if model.startswith(prefixes)), None)


def score(rows: list[Any], shipped_scales: bool = False) -> list[dict[str, Any]]:
    """One record per transformer row: label and the four predictions (:data:`VARIANTS` x :data:`MODES`), the GPU
    predicted as unseen (``shipped_scales``: with its own fitted multipliers)."""
    shipped = default_params()
    before = dataclasses.replace(shipped, sdpa_eta_flash=None, sdpa_eta_efficient=None)
    out = []
    params: dict[tuple[str, str], Any] = {}
    for mg in rows:
        m = mg.measurement
        fam = family_of(str(m["config"]["model"]))
        if fam is None:
            continue
        dev = m["device"]
        rec: dict[str, Any] = {"model": m["config"]["model"], "family": fam, "device": dev,
                               "label_ms": float(m["latency_ms"])}
        for variant, base in (("before", before), ("after", shipped)):
            if (variant, dev) not in params:
                params[(variant, dev)] = base if shipped_scales else unseen_params(base, dev)
            p = params[(variant, dev)]
            for mode, dep in (("described", described("timm", m)), ("undescribed", Deployment())):
                rec[f"{variant}_{mode}_ms"] = predict(mg.graph, dev, params=p, deployment=dep, mig=False).latency_ms
        out.append(rec)
    return out


def _mape(recs: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([abs(r[key] / r["label_ms"] - 1) for r in recs]) * 100)


def summarise(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per GPU (all its transformer rows) and per (GPU, family): n and MAPE of every variant and mode."""
    by_gpu: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_gpu[r["device"]].append(r)
        by_cell[(r["device"], r["family"])].append(r)

    def entry(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"n": len(rs), **{f"{v}_{m}": _mape(rs, f"{v}_{m}_ms") for v in VARIANTS for m in MODES}}

    return {"gpus": {g: entry(rs) for g, rs in sorted(by_gpu.items())},
            "cells": {f"{g} {f}": entry(rs) for (g, f), rs in sorted(by_cell.items())}}


def _print(summary: dict[str, Any]) -> None:
    head = f"{'cell':30} {'n':>3} | described before → after | undescribed before → after"
    print(head)
    print("-" * len(head))
    for title, table in (("per GPU and family", summary["cells"]), ("per GPU (target ≤ 15 %)", summary["gpus"])):
        print(f"{title}:")
        for k, e in table.items():
            print(f"  {k:28} {e['n']:3d} | {e['before_described']:7.1f} % → {e['after_described']:5.1f} %     | "
                  f"{e['before_undescribed']:7.1f} % → {e['after_undescribed']:5.1f} %")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--timm", type=Path, required=True, help="timm dataset with captured graphs (SQLite)")
    ap.add_argument("--shipped", action="store_true", help="keep the GPU's own fitted multipliers (in-sample)")
    ap.add_argument("--json", type=Path, help="write the records and the summary here")
    a = ap.parse_args(argv)
    recs = score(source_rows(a.timm, "timm"), a.shipped)
    if not recs:
        raise SystemExit(f"{a.timm}: no eager timm row of a transformer family ({sorted(FAMILIES)})")
    summary = summarise(recs)
    print("GPU constants: " + ("shipped (the GPU's own multipliers, in-sample)" if a.shipped else
                               "unseen GPU (its own multipliers removed)"))
    _print(summary)
    if a.json:
        write_output(a.json, json.dumps({"summary": summary, "records": recs}, indent=1) + "\n", "--json",
                     error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
