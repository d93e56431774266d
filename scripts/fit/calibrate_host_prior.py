#!/usr/bin/env python
"""Fit the analytic prior's ``host-cpu`` device scale on measured host-CPU latencies; print before/after.

Usage::

    python scripts/fit/calibrate_host_prior.py --data data/host_cpu/host_cpu.jsonl.xz [--data MORE] \
        [--holdout resnet,vit] [--base dippm_nas/prior/calibration/fitted.json] [--out FILE] \
        [--op-profiles PROFILES.jsonl.xz]

What is fitted (a :class:`dippm_nas.prior.DeviceScale` under the key ``host-cpu``; every GPU constant of
``--base`` is kept as it is): the device's compute and memory efficiency multipliers, a compute
multiplier for each contraction class (``conv``, ``conv_depthwise``, ``matmul``, ``attention``: oneDNN's
convolutions and GEMMs reach very different shares of the CPU's measured matmul peak), and the framework
time per dispatched op (the host microbenchmark times a tiny op; a real layer costs more). A per-class
call time is not fitted: it fits the six training families better but takes the held-out resnet family from
23.6 % to 32.2 % MAPE. Loss: mean absolute log error of whole-model latency, each family
weighted equally, Adam in log space on the node costs decomposed once under the base constants.

``--holdout`` families are excluded from the fit and reported as held out (use the same families as
``dippm-nas train --split family --holdout``, and train that checkpoint with ``--prior-params`` of the
file written here, so nothing of the held-out families reaches either stage). Without ``--holdout``
every family is fitted and the figures printed are in-sample.

``--op-profiles`` (profiles of operators timed in place, written by ``dippm-nas dataset build --op-profiles``
or ``benchmarks/accuracy/host_op_table.py --profiles``) also fits an operator table (:func:`dippm_nas.prior.fit_op_table`, without the ``--holdout``
families) and stores it in the written constants under ``op_tables["host-cpu"]``: the prior's host-cpu
per-node times then come from it, and a checkpoint trained with ``--prior-params`` of that file carries it.
The before/after table is then printed for it as well ("after" = the table). ``--cache-residency``
adds the table's cache-residency model (a model whose working set fits in the cache reads its weights
faster: :attr:`dippm_nas.prior.OpTable.cache_bytes`), with the capacity and speed-up measured by
:func:`dippm_nas.devices.measure_weight_cache` when the script runs, or given as ``MIB,SPEEDUP`` (the figures of
one such measurement).

Machine facts matter: the host device's peaks are measured on the machine that runs this (cached per
CPU model, thread count and torch version); run it on the machine the dataset was measured on, with
the thread count of the measurements (1 for the shipped dataset: ``--threads``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).parent))

from calibrate_prior import kendall_tau, mape  # noqa: E402

DEVICE = "host-cpu"
#: Contraction classes with their own compute multiplier on the host.
CLASS_KNOBS = ("conv", "conv_depthwise", "matmul", "attention")
#: Fitted multipliers and times stay within these bounds (those of :class:`DeviceScale`).
MULT_BOUNDS = (0.05, 20.0)
DISPATCH_BOUNDS_US = (0.1, 1000.0)


@dataclasses.dataclass
class Decomposed:
    """Per-node work of many graphs under the base constants, so a knob vector re-prices them in O(nodes).

    Shapes: node arrays ``[total nodes]``; ``views`` ``[graphs]``.
    """

    compute_us: torch.Tensor   # compute time with every host multiplier at 1
    memory_us: torch.Tensor    # memory time with the memory multiplier at 1
    class_idx: torch.Tensor    # index into PARAM_CLASSES
    dispatched: torch.Tensor   # 1 for an op paying a dispatch, else 0
    graph_idx: torch.Tensor    # which graph each node belongs to
    views: torch.Tensor        # per graph: view ops (each costs min(host_view_us, dispatch time) on a CPU)
    view_us: float             # the constants' host_view_us


def decompose(graphs: Sequence[Any], base: Any) -> Decomposed:
    from dippm_nas.devices import resolve_device
    from dippm_nas.prior import DeviceScale
    from dippm_nas.prior import graph_facts, node_costs

    dev = resolve_device(DEVICE)
    neutral = dataclasses.replace(base, device_scales={**base.device_scales, DEVICE: DeviceScale(dispatch_us=0.0)})
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    views = []
    for gi, g in enumerate(tqdm(graphs, desc="decompose", unit="graph", leave=False)):
        c = node_costs(g, dev, neutral)
        f = graph_facts(g)
        parts["compute"].append(c.compute_us)
        parts["memory"].append(c.memory_us)
        parts["cls"].append(f.cls_idx)
        parts["disp"].append((f.active & ~f.fused).astype(np.float64))
        parts["graph"].append(np.full(len(f.cls_idx), gi))
        views.append(float(np.sum(f.view)))
    cat = {k: torch.from_numpy(np.concatenate(v)) for k, v in parts.items()}
    return Decomposed(cat["compute"].double(), cat["memory"].double(), cat["cls"].long(), cat["disp"].double(),
                      cat["graph"].long(), torch.tensor(views, dtype=torch.float64), float(base.host_view_us))


class HostKnobs(torch.nn.Module):
    """The fitted quantities, in log space and clamped to their bounds."""

    def __init__(self, dispatch0_us: float) -> None:
        super().__init__()
        z = lambda n: torch.nn.Parameter(torch.zeros(n, dtype=torch.float64))  # noqa: E731
        self.compute, self.memory, self.classes = z(1), z(1), z(len(CLASS_KNOBS))
        self.dispatch = torch.nn.Parameter(torch.full((1,), math.log(dispatch0_us), dtype=torch.float64))

    @staticmethod
    def _mult(v: torch.Tensor) -> torch.Tensor:
        return torch.exp(v).clamp(*MULT_BOUNDS)

    @staticmethod
    def _us(v: torch.Tensor) -> torch.Tensor:
        return torch.exp(v).clamp(*DISPATCH_BOUNDS_US)

    def latency_ms(self, d: Decomposed) -> torch.Tensor:
        from dippm_nas.prior import PARAM_CLASSES

        n = len(PARAM_CLASSES)
        mult = torch.ones(n, dtype=torch.float64).index_put((torch.tensor([PARAM_CLASSES.index(c) for c in CLASS_KNOBS]),),
                                                           self._mult(self.classes))
        node = torch.maximum(d.compute_us / (self._mult(self.compute) * mult[d.class_idx]),
                             d.memory_us / self._mult(self.memory)) + d.dispatched * self._us(self.dispatch)
        total = torch.zeros(len(d.views), dtype=torch.float64).index_add(0, d.graph_idx, node)
        return (total + d.views * torch.clamp(self._us(self.dispatch), max=d.view_us)) / 1000.0

    def scale(self, source: str) -> Any:
        from dippm_nas.prior import DeviceScale

        with torch.no_grad():
            cm = self._mult(self.classes).tolist()
            return DeviceScale(compute=float(self._mult(self.compute)), memory=float(self._mult(self.memory)),
                               source=source, classes=dict(zip(CLASS_KNOBS, cm)),
                               dispatch_us=float(self._us(self.dispatch)))


def fit(d: Decomposed, y_ms: np.ndarray, weight: np.ndarray, dispatch0_us: float, *, steps: int = 1500) -> HostKnobs:
    """Adam on the weighted mean absolute log error (the max() of the roofline has a subgradient)."""
    knobs = HostKnobs(dispatch0_us)
    ylog = torch.log(torch.tensor(y_ms, dtype=torch.float64))
    w = torch.tensor(weight, dtype=torch.float64)
    opt = torch.optim.Adam(knobs.parameters(), lr=0.05)
    for _ in tqdm(range(steps), desc="fit", unit="step", leave=False):
        opt.zero_grad()
        loss = (w * (torch.log(knobs.latency_ms(d)) - ylog).abs()).sum()
        loss.backward()
        opt.step()
    return knobs


def table(title: str, fams: Sequence[str], y: np.ndarray, fam: np.ndarray, before: np.ndarray, after: np.ndarray) -> None:
    print(f"  {title}")
    print(f"  {'family':<14}{'rows':>6}{'MAPE before':>13}{'MAPE after':>12}{'tau before':>12}{'tau after':>11}")
    for f in list(fams) + ["(all)"]:
        m = np.ones(len(y), bool) if f == "(all)" else fam == f
        if not m.any():
            continue
        print(f"  {f:<14}{int(m.sum()):>6}{mape(before[m], y[m]):>12.1f}%{mape(after[m], y[m]):>11.1f}%"
              f"{kendall_tau(before[m], y[m]):>12.3f}{kendall_tau(after[m], y[m]):>11.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, action="append",
                    help="host-CPU dataset (SQLite or JSONL export) with graphs; repeat for several")
    ap.add_argument("--holdout", default="", help="comma-separated families kept out of the fit")
    ap.add_argument("--base", type=Path, default=None, help="constants to start from (default: the shipped fitted ones)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the measurements (default 1)")
    ap.add_argument("--out", type=Path, default=None, help="write the constants with the fitted host-cpu scale here")
    ap.add_argument("--op-profiles", action="append", default=[], metavar="PATH",
                    help="in-place operator profiles (JSONL[.xz]) to fit a host-cpu op table on; repeatable")
    ap.add_argument("--cache-residency", nargs="?", const="measure", default=None, metavar="MIB,SPEEDUP",
                    help="with --op-profiles: a model's weights are read from cache when its working set fits "
                         "(see OpTable.cache_bytes). Alone: measure the capacity and speed-up on this run "
                         "(devices.measure_weight_cache; on the machine the profiles were measured on, idle); "
                         "or give the figures of one such measurement, e.g. 10,2.05")
    args = ap.parse_args(argv)
    if args.cache_residency and not args.op_profiles:
        ap.error("--cache-residency models the operator table's weights: it needs --op-profiles")
    torch.set_num_threads(args.threads)
    from dippm_nas.dataset import load_measurements
    from dippm_nas.devices import resolve_device
    from dippm_nas.prior import PriorParams, default_params

    t0 = time.time()
    base = PriorParams.load(args.base) if args.base else default_params()
    base = dataclasses.replace(base, device_scales={k: v for k, v in base.device_scales.items() if k != DEVICE})
    hold = {h for h in args.holdout.split(",") if h}
    rows = [mg for path in args.data for mg in load_measurements(path, device="cpu")
            if mg.measurement.get("latency_ms")]
    fam = np.array([str(mg.measurement.get("space")) for mg in rows])
    missing = sorted(hold - set(fam))
    if missing:
        ap.error(f"--holdout families {missing} are not in the data; families: {sorted(set(fam))}")
    y = np.array([float(mg.measurement["latency_ms"]) for mg in rows])
    d = decompose([mg.graph for mg in rows], base)
    train = ~np.isin(fam, sorted(hold))
    counts = {f: int(np.sum(train & (fam == f))) for f in set(fam[train])}
    w = np.array([1.0 / (len(counts) * counts[f]) if t else 0.0 for f, t in zip(fam, train)])
    dispatch0 = resolve_device(DEVICE).host_dispatch_us or base.host_dispatch_us
    knobs = fit(d, y, w, dispatch0)
    fams = sorted(set(fam))
    source = (f"host-CPU latencies measured here ({', '.join(Path(p).name for p in args.data)}; families "
              f"{', '.join(f for f in fams if f not in hold)}; threads {args.threads}); fitted by: python "
              + " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]))
    fitted = knobs.scale(source)
    with torch.no_grad():
        before = HostKnobs(dispatch0).latency_ms(d).numpy()
        after = knobs.latency_ms(d).numpy()
    loss = lambda p: float(np.sum(w * np.abs(np.log(p) - np.log(y))))  # noqa: E731
    print(f"machine: {torch.get_num_threads()} torch threads; {len(rows)} rows, fit on {int(train.sum())} "
          f"({len(counts)} families), held out {sorted(hold) or 'none'}; loss {loss(before):.4f} -> {loss(after):.4f}")
    print(f"  fitted host-cpu scale: compute x{fitted.compute:.3f}, memory x{fitted.memory:.3f}, "
          + ", ".join(f"{c} x{v:.3f}" for c, v in fitted.classes.items())
          + f"; dispatch {fitted.dispatch_us:.2f} µs (device microbenchmark: {dispatch0:.2f} µs)")
    if hold:
        table("held-out families (never in the fit)", sorted(hold), y, fam, before, after)
        m = train
        table("fitted families (in-sample)", [f for f in fams if f not in hold], y[m], fam[m], before[m], after[m])
    else:
        table("all families (in-sample: no --holdout)", fams, y, fam, before, after)
    params = dataclasses.replace(base, device_scales={**base.device_scales, DEVICE: fitted})
    if args.op_profiles:
        import json

        from dippm_nas.dataset import open_text
        from dippm_nas.prior import estimate, fit_op_table

        profiles = [json.loads(line) for path in args.op_profiles for line in open_text(path) if line.strip()]
        cache = {}
        if args.cache_residency == "measure":
            from dippm_nas.devices import measure_weight_cache

            cache_bytes, speedup = measure_weight_cache(args.threads)
            cache = {"cache_bytes": cache_bytes, "weight_cache_speedup": speedup}
            how = "measured now"
        elif args.cache_residency:
            try:
                mib, speedup = (float(v) for v in args.cache_residency.split(","))
            except ValueError:
                ap.error(f"--cache-residency takes MIB,SPEEDUP (e.g. 10,2.05) or nothing, got {args.cache_residency!r}")
            cache = {"cache_bytes": mib * 2**20, "weight_cache_speedup": speedup}
            how = "given"
        if cache:
            print(f"  cache residency ({how}): weights re-read from cache up to {cache['cache_bytes'] / 2**20:.0f} MiB "
                  f"per pass, a weight-bound GEMM {cache['weight_cache_speedup']:.2f}x faster there than from DRAM")
        op_table = fit_op_table(profiles, exclude_families=sorted(hold), **cache, source=(
            f"operators timed in place ({', '.join(Path(p).name for p in args.op_profiles)}; "
            f"{len(profiles)} profiled models, held out {sorted(hold) or 'none'}"
            + (f"; cache residency: {cache['cache_bytes'] / 2**20:.0f} MiB, weight speed-up "
               f"{cache['weight_cache_speedup']:.2f}, {how}" if cache else "") + "); " + source))
        params = dataclasses.replace(params, op_tables={**params.op_tables, DEVICE: op_table})
        with_table = np.array([estimate(mg.graph, DEVICE, params=params).latency_ms for mg in rows])
        print(f"  op table: {op_table.metrics['trees']} trees, scale {op_table.scale:.3f}, "
              f"{op_table.per_op_us:.2f} µs per op; cross-fitted MAPE on its profiled models "
              f"{op_table.metrics['cross_fitted_mape_pct']:.1f} %")
        if hold:
            table("held-out families, fitted constants -> op table", sorted(hold), y, fam, after, with_table)
            m = train
            table("fitted families, fitted constants -> op table (in-sample)", [f for f in fams if f not in hold],
                  y[m], fam[m], after[m], with_table[m])
        else:
            table("all families, fitted constants -> op table (in-sample)", fams, y, fam, after, with_table)
    print(f"done in {time.time() - t0:.0f} s")
    if args.out:
        params.save(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
