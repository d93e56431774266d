"""The σ of an unseen GPU's kernel times: leave-one-GPU-out over the GPUs with fitted efficiency multipliers.

Usage (from the repository root; the data paths are arguments, nothing is downloaded; the import commands are
in ``benchmarks/accuracy/accuracy_deployment.py``'s docstring)::

    python benchmarks/accuracy/unseen_gpu_sigma.py --timm timm.sqlite --accel accel.sqlite [--json out.json] \\
        [--write dippm_nas/prior/calibration/fitted.json]

A GPU without efficiency multipliers of its own gets the calibration's default entry (``device_scales["*"]``):
the geometric mean of the GPUs ``scripts/fit/calibrate_prior.py`` fitted on Accel-NASBench (A100, RTX 3090) and
timm ``benchmark-infer`` rows (RTX 3090/4090/5090) (:data:`DEFAULT_ENTRY_GPUS`); a GeForce GPU the GeForce entry
(``device_scales["*geforce"]``, the geometric mean of the fitted GeForce GPUs). Each of those GPUs in turn is
predicted as an unseen one: its own multipliers removed and the others' geometric means in their place
(:func:`unseen_params`). Its rows are priced as the fit priced them (the graph as captured, in
float16; the recorded layout; eager; no input copy; the default host), and the log error of the rows the prior
calls GPU-bound is that GPU's unseen-GPU error, bias included. σ is the root mean square over the (GPU, source)
cells, each cell's mean square weighing equally (the RTX 3090's 400 Accel-NASBench rows do not outweigh its
timm rows).

``--write`` records it as the host model's ``metrics["sigma_log_gpu_unseen"]`` with ``metrics["fit_gpu_unseen"]``
(the command, the rows, the per-cell figures):
:meth:`dippm_nas.prior.HostModel.sigma_log_gpu` gives a device without its own multipliers at least this σ on
its kernels. Derived from: the fitted GPUs' rows (the shared op-class constants were fitted on them too, so the
figure is if anything low). Scored on, by ``accuracy_deployment.py``: the eager torchvision timings of GPUs with
no multipliers of their own (RTX 2080 Ti, TITAN RTX, TITAN Xp); its timm cells, which are rows this figure is
derived from, get :func:`nested_sigma` instead (the same measure over the fitted GPUs other than the scored one).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fewshot_timm import held_out_params  # noqa: E402  (sibling script)

from dippm_nas.dataset import load_measurements  # noqa: E402
from dippm_nas.devices import get_device  # noqa: E402
from dippm_nas.prior import DeploymentSettings, PriorParams, default_params, estimate  # noqa: E402
from dippm_nas.training import DEVICE_ALIASES  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402

#: The GPUs whose fitted efficiency multipliers the default entry ``"*"`` of the shipped calibration is the
#: geometric mean of (``scripts/fit/calibrate_prior.py``; the entry's ``source`` names them). The Hopper entries,
#: fitted on ML.ENERGY pipelines by ``benchmarks/accuracy/accuracy_energy.py``, and ``a100-pcie-40gb`` (a copy of
#: the SXM4 entry) are not among them.
DEFAULT_ENTRY_GPUS: tuple[str, ...] = ("a100-sxm4-40gb", "rtx-3090", "rtx-4090", "rtx-5090")
#: The sources whose rows the GPUs of :data:`DEFAULT_ENTRY_GPUS` were fitted on.
FITTED_SOURCES: tuple[str, ...] = ("accel-nasbench", "timm")


@dataclass(frozen=True)
class Row:
    """One measured forward pass of a fitted GPU, as the fit priced it."""

    graph: Any
    latency_ms: float
    channels_last: bool


def unseen_params(base: PriorParams, device: str, among: Sequence[str] = DEFAULT_ENTRY_GPUS) -> PriorParams:
    """``base`` with ``device`` predicted as a GPU without multipliers of its own: its entry removed, the default
    entries the geometric means of the GPUs of ``among`` other than it (:func:`fewshot_timm.held_out_params`). With the default ``among``, checks first
    that the shipped default entry is the geometric mean of :data:`DEFAULT_ENTRY_GPUS`."""
    if tuple(among) == DEFAULT_ENTRY_GPUS:
        star = base.device_scales.get("*")
        fitted = [base.device_scales.get(g) for g in DEFAULT_ENTRY_GPUS]
        if star is None or not all(fitted) or not all(
                math.isclose(getattr(star, f), math.exp(float(np.mean([math.log(getattr(s, f)) for s in fitted]))),
                             rel_tol=1e-6) for f in ("compute", "memory")):
            raise SystemExit(f"the calibration's default device scale is not the geometric mean of "
                             f"{DEFAULT_ENTRY_GPUS}; update DEFAULT_ENTRY_GPUS to the GPUs it averages")
    return held_out_params(base, device, among=[g for g in among if g != device])


def source_rows(path: Path, source: str) -> list[Any]:
    """The ``ok`` rows of a dataset with a captured graph and a latency (timm: the eager ones)."""
    return [mg for mg in load_measurements(path, source=source, status="ok")
            if mg.graph is not None and mg.measurement.get("latency_ms")
            and (source != "timm" or str(mg.measurement.get("conditions", {}).get("torch_compile")) == "eager")]


def fitted_cells(rows_by_source: Mapping[str, Sequence[Any]],
                 gpus: Iterable[str] = DEFAULT_ENTRY_GPUS) -> dict[tuple[str, str], list[Row]]:
    """The rows of ``gpus`` by (catalogue device, source), from the sources of :data:`FITTED_SOURCES`."""
    wanted = set(gpus)
    cells: dict[tuple[str, str], list[Row]] = {}
    for source, rows in rows_by_source.items():
        if source not in FITTED_SOURCES:
            continue
        for mg in rows:
            m = mg.measurement
            device = DEVICE_ALIASES.get(m["device"], m["device"])
            if device not in wanted:
                continue
            c = m.get("conditions") or {}
            cl = bool(c.get("channels_last")) or c.get("memory_layout") == "nhwc"
            cells.setdefault((device, source), []).append(Row(mg.graph, float(m["latency_ms"]), cl))
    return cells


def unseen_errors(cells: Mapping[tuple[str, str], Sequence[Row]], base: PriorParams,
                  among: Sequence[str]) -> dict[tuple[str, str], np.ndarray]:
    """Per cell of a GPU of ``among``: the log error (predicted / measured) of its GPU-bound rows with that GPU
    predicted as an unseen one (the default entry the geometric mean of the other GPUs of ``among``)."""
    out: dict[tuple[str, str], np.ndarray] = {}
    for (device, source), rows in sorted(cells.items()):
        if device not in among:
            continue
        params = unseen_params(base, device, among)
        errs = []
        for r in rows:
            est = estimate(r.graph, device, params=params, deployment=DeploymentSettings(channels_last=r.channels_last))
            if not est.launch_bound:
                errs.append(math.log(est.latency_ms / r.latency_ms))
        out[(device, source)] = np.array(errs)
    return out


def sigma_of(errors: Mapping[tuple[str, str], np.ndarray]) -> float:
    """Root mean square of the cells' mean squares (each cell weighing equally)."""
    ms = [float(np.mean(np.square(e))) for e in errors.values() if len(e)]
    if not ms:
        raise SystemExit("no GPU-bound rows of a fitted GPU: give --timm and/or --accel with their rows")
    return math.sqrt(float(np.mean(ms)))


def nested_sigma(cells: Mapping[tuple[str, str], Sequence[Row]], base: PriorParams, held_out: str) -> float:
    """The unseen-GPU σ measured without ``held_out``: leave-one-GPU-out over the other fitted GPUs, each with
    the geometric mean of the rest (neither ``held_out``'s rows nor its multipliers enter)."""
    among = [g for g in DEFAULT_ENTRY_GPUS if g != held_out]
    return sigma_of(unseen_errors(cells, base, among))


def sigma_by_geforce(errors: Mapping[tuple[str, str], np.ndarray]) -> dict[str, float]:
    """:func:`sigma_of` over the cells of GeForce GPUs (``Device.geforce``, the GPUs ``"*geforce"`` prices) and over
    the others apart: ``{"geforce": σ, "other": σ}``, a key only where its cells have GPU-bound rows."""
    out: dict[str, float] = {}
    for key, want in (("geforce", True), ("other", False)):
        part = {c: e for c, e in errors.items() if get_device(c[0]).geforce == want and len(e)}
        if part:
            out[key] = sigma_of(part)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timm", type=Path, help="dataset with the timm benchmark-infer rows (graphs captured)")
    ap.add_argument("--accel", type=Path, help="dataset with the Accel-NASBench rows (graphs captured)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--write", type=Path, default=None,
                    help="calibration JSON whose host_model.metrics get sigma_log_gpu_unseen and its record")
    args = ap.parse_args(argv)
    paths = {s: p for s, p in (("timm", args.timm), ("accel-nasbench", args.accel)) if p is not None}
    if not paths:
        ap.error("give at least one of --timm, --accel")
    base = default_params()
    cells = fitted_cells({s: source_rows(p, s) for s, p in paths.items()})
    errors = unseen_errors(cells, base, DEFAULT_ENTRY_GPUS)
    sigma = sigma_of(errors)
    per_cell = {f"{d} {s}": {"rows": int(len(cells[(d, s)])), "gpu_bound_rows": int(len(e)),
                             "rms_log": float(np.sqrt(np.mean(np.square(e)))) if len(e) else math.nan,
                             "mean_log": float(np.mean(e)) if len(e) else math.nan}
                for (d, s), e in errors.items()}
    for key, v in per_cell.items():
        print(f"{key:32s} GPU-bound {v['gpu_bound_rows']:3d}/{v['rows']:3d}  mean log error {v['mean_log']:+.3f}  "
              f"RMS {v['rms_log']:.3f}")
    nested = {g: nested_sigma(cells, base, g) for g in DEFAULT_ENTRY_GPUS if any(d == g for d, _ in cells)}
    print(f"unseen-GPU σ (log, RMS over {len(errors)} cells): {sigma:.3f}; without each GPU: "
          + ", ".join(f"{g} {v:.3f}" for g, v in nested.items()))
    by_line = sigma_by_geforce(errors)
    print("by board line (cells of GeForce GPUs / of the others): "
          + ", ".join(f"{k} {v:.3f}" for k, v in by_line.items()))
    report = {"sigma_log_gpu_unseen": sigma, "cells": per_cell, "nested": nested, "by_geforce": by_line}
    if args.json is not None:
        write_output(args.json, json.dumps(report, indent=1) + "\n", "--json", error=InvalidValueError)
        print(f"wrote {args.json}")
    if args.write is not None:
        cmd = "python " + shlex.join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])])
        d = json.loads(args.write.read_text(encoding="utf-8"))
        if d.get("host_model") is None:
            raise SystemExit(f"{args.write} has no host_model to record the σ in")
        rows = "; ".join(f"{k}: {v['gpu_bound_rows']} GPU-bound rows, RMS {v['rms_log']:.3f}, mean "
                         f"{v['mean_log']:+.3f}" for k, v in per_cell.items())
        d["host_model"]["metrics"].update({
            "sigma_log_gpu_unseen": sigma,
            "fit_gpu_unseen": (f"{cmd}: leave-one-GPU-out over {', '.join(DEFAULT_ENTRY_GPUS)} (the GPUs the "
                               "default device scale is the geometric mean of), each predicted with the others' "
                               "geometric mean (a GeForce GPU: the \"*geforce\" entry, with the other fitted GeForce "
                               "GPUs' GEMM rate); RMS log error (predicted / measured) of GPU-bound rows, cells "
                               f"weighing equally: {rows}"),
        })
        write_output(args.write, json.dumps(d, indent=1) + "\n", "--write", error=InvalidValueError)
        print(f"wrote sigma_log_gpu_unseen into {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
