"""Fit the prior's eager host model on measured eager GPU timings and write it into the calibration file.

Usage (from the repository root; the data path is an argument, nothing is downloaded)::

    PYTHONPATH=. .venv-vision/bin/dippm-nas dataset import ryujaehun \\
        ../shared/data/ryujaehun_torchvision_eager_bs12_turing_pascal.csv --out ryujaehun.sqlite
    python scripts/fit/calibrate_host_model.py --data ryujaehun.sqlite \\
        --torch1-factor 1.0 --torch1-source "..." --out dippm_nas/prior/calibration/fitted.json

It fits :data:`dippm_nas.prior.FIT_PARAMETERS` (with ``--dispatch-kinds data/host_dispatch/dispatch_kinds.json``,
:data:`dippm_nas.prior.MEASURED_FIT_PARAMETERS`: a host scale of the per-kind framework times measured on a CPU by
``benchmarks/measurement/host_dispatch_kinds.py``, plus a module call's measured extra; not the shipped fit, see
docs/runtime_and_host.md) (the input copy's constants are physics and
``scripts/fit/fit_input_copy.py``'s, kept from the ``--out`` file; the float32 rows' batches are mapped fresh,
the float16 ones not) on the fp16 and fp32 rows (fp64 rows are GPU-bound and
left out), scores the fit leave-one-GPU-out (the constants refitted without that GPU's rows) and records
the held-out log-space σ (RMS log error) of host-bound rows as ``metrics["sigma_log_host"]`` (the σ of
the host part of a prediction) and of GPU-bound rows as ``metrics["sigma_log_gpu_bound"]`` (the σ of the
kernel part where no checkpoint corrects it: the prior on GPUs it was not fitted on), and the GPU-bound rows of
each precision apart as ``metrics["sigma_log_gpu_unseen_float16"]`` and ``["sigma_log_gpu_unseen_float32"]``
(none of the three GPUs has efficiency multipliers of its own: the kernel σ a GPU without them gets in that
precision, :meth:`dippm_nas.prior.HostModel.sigma_log_gpu`). Only the ``host_model`` key of
the output file is replaced; the float64 σ that ``scripts/fit/calibrate_fp64.py`` and the unseen-GPU σ that
``benchmarks/accuracy/unseen_gpu_sigma.py`` record there are kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from dippm_nas.dataset import load_measurements
from dippm_nas.prior import (HOST_KINDS, HostModel, HostRow, PriorParams, default_params, estimate,
                             fit_host_model, host_model_latency_ms, row_settings)
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import write_output


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="dataset file with the ryujaehun rows")
    ap.add_argument("--torch1-factor", type=float, required=True,
                    help="host-time factor of PyTorch 1.x over 2.x (measured by benchmarks/measurement/dispatch_generations.py)")
    ap.add_argument("--torch1-source", default="", help="where the factor comes from (recorded)")
    ap.add_argument("--dispatch-kinds", type=Path, default=None,
                    help="framework time per operator kind measured on a CPU "
                         "(benchmarks/measurement/host_dispatch_kinds.py --json): fit a host scale of those times "
                         "instead of one time for every kind")
    ap.add_argument("--out", type=Path, default=None, help="calibration JSON whose host_model key is replaced")
    args = ap.parse_args(argv)

    # a float32 batch is the DataLoader workers' tensor, mapped fresh; a float16 one a .half() the process wrote
    rows = [HostRow(mg.graph, mg.measurement["device"],
                    row_settings(mg.measurement.get("conditions"), mg.measurement.get("environment")),
                    float(mg.measurement["latency_ms"]), fresh_pages=mg.spec.dtype == "float32")
            for mg in load_measurements(args.data, source="ryujaehun") if mg.spec.dtype in ("float16", "float32")]
    devices = sorted({r.device for r in rows})
    # the input copy's constants come from physics and scripts/fit/fit_input_copy.py (kept from --out's host model)
    copy_keys = ("h2d_gbps", "h2d_fixed_us", "h2d_fresh_page_us", "h2d_fresh_page_sigma_log")
    old = (json.loads(args.out.read_text(encoding="utf-8")).get("host_model") or {}) if args.out is not None else {}
    measured = measured_kinds(args.dispatch_kinds) if args.dispatch_kinds is not None else {}
    base = HostModel(op_us={k: 10.0 for k in HOST_KINDS}, generations={"torch-2": 1.0, "torch-1": args.torch1_factor},
                     **measured, **{k: old[k] for k in copy_keys if k in old})
    params = default_params()
    # leave-one-GPU-out: the held-out σ of host-bound rows
    held_r, held_bound, held_dtype = [], [], []
    for dev in devices:
        train = [r for r in rows if r.device != dev]
        test = [r for r in rows if r.device == dev]
        m = fit_host_model(train, params=params, base=base)
        pr = host_model_latency_ms(m, test, params)
        y = np.array([r.latency_ms for r in test])
        bound = [estimate(r.graph, r.device, params=_with(params, m),
                          deployment=r.execution).launch_bound for r in test]
        held_r += list(np.log(pr / y))
        held_bound += bound
        held_dtype += [r.graph.spec.dtype for r in test]
        ape = np.abs(pr / y - 1) * 100
        print(f"leave out {dev}: MAPE {ape.mean():.1f} % (median {np.median(ape):.1f} %), host-bound rows {sum(bound)}/{len(bound)}")
    r = np.array(held_r)
    b = np.array(held_bound)
    sigma_host = float(np.sqrt(np.mean(r[b] ** 2))) if b.any() else float(np.sqrt(np.mean(r ** 2)))
    sigma_gpu = float(np.sqrt(np.mean(r[~b] ** 2))) if (~b).any() else float(np.sqrt(np.mean(r ** 2)))
    sigma_all = float(np.sqrt(np.mean(r ** 2)))
    sigma_unseen = gpu_bound_sigma_by_dtype(r, b, np.array(held_dtype))
    print(f"held-out log σ (RMS log error): host-bound rows {sigma_host:.3f}, GPU-bound rows {sigma_gpu:.3f}, "
          f"all rows {sigma_all:.3f}; GPU-bound rows by precision "
          + ", ".join(f"{k[len('sigma_log_gpu_unseen_'):]} {v:.3f}" for k, v in sigma_unseen.items()))

    cmd = "python " + shlex.join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])])
    model = fit_host_model(
        rows, params=params, base=base, command=cmd,
        source=("ryujaehun/pytorch-gpu-benchmark@3f47a9e2 (MIT): eager PyTorch 1.x timings of 32 torchvision CNNs at "
                "batch 12, fp16 and fp32, on RTX 2080 Ti, TITAN RTX and TITAN Xp (median of 50 iterations, input copy "
                "inside the timed region); host clocks from the runs' system_info.txt; torch-1 factor: "
                + (args.torch1_source or f"{args.torch1_factor}")
                + "; launch_us, iteration_us, graph_launch_us and compiled_kernel_us are analytic public mid-range "
                  "figures (cudaLaunchKernel 2-4 µs, cudaGraphLaunch ~10 µs, a Python call ~10 µs), not fitted"),
    )
    model = dataclasses.replace(model, metrics={**model.metrics, "sigma_log_host": sigma_host,
                                                "sigma_log_gpu_bound": sigma_gpu,
                                                "sigma_log_heldout_all": sigma_all, **sigma_unseen,
                                                "heldout": "leave-one-GPU-out over " + ", ".join(devices)})
    print(json.dumps(model.to_dict(), indent=1))
    if args.out is not None:
        d = json.loads(args.out.read_text(encoding="utf-8"))
        kept = {k: v for k, v in (d.get("host_model") or {}).get("metrics", {}).items()
                if k.endswith("_float64") or k in ("sigma_log_gpu_unseen", "fit_gpu_unseen", "fit_input_copy")}
        d["host_model"] = model.to_dict()
        d["host_model"]["metrics"].update(kept)
        write_output(args.out, json.dumps(d, indent=1) + "\n", "--out", error=InvalidValueError)
        print(f"wrote host_model into {args.out}")
    return 0


def gpu_bound_sigma_by_dtype(err: np.ndarray, host_bound: np.ndarray, dtypes: np.ndarray) -> dict[str, float]:
    """``{"sigma_log_gpu_unseen_<dtype>": RMS}`` of the held-out GPU-bound rows' log errors ``err`` of each dtype
    (``host_bound``: the rows the prior calls host-bound, left out): the kernel σ of a GPU without efficiency
    multipliers of its own in that precision (:meth:`dippm_nas.prior.HostModel.sigma_log_gpu`); a dtype without
    GPU-bound rows gets no key."""
    out: dict[str, float] = {}
    for dtype in sorted(set(dtypes.tolist())):
        rows = (dtypes == dtype) & ~host_bound
        if rows.any():
            out[f"sigma_log_gpu_unseen_{dtype}"] = float(np.sqrt(np.mean(err[rows] ** 2)))
    return out


def measured_kinds(path: Path) -> dict[str, dict[str, float]]:
    """``{"measured_op_us", "measured_module_us"}`` per host kind: the ``kinds`` of the CPU run in
    ``benchmarks/measurement/host_dispatch_kinds.py``'s JSON."""
    try:
        kinds = json.loads(path.read_text(encoding="utf-8"))["devices"]["cpu"]["kinds"]
        return {"measured_op_us": dict(kinds["measured_op_us"]), "measured_module_us": dict(kinds["measured_module_us"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidValueError(f"--dispatch-kinds {path}: not a host_dispatch_kinds.py JSON with a cpu run ({e!r})") from e


def _with(params: PriorParams, model: HostModel) -> PriorParams:
    return dataclasses.replace(params, host_model=model)


if __name__ == "__main__":
    raise SystemExit(main())
