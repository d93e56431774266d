"""Fit the prior's FP64 efficiency of convolutions and GEMMs on measured float64 eager timings.

Usage (from the repository root; the data path is an argument, nothing is downloaded)::

    PYTHONPATH=. .venv-vision/bin/dippm-nas dataset import ryujaehun \\
        ../shared/data/ryujaehun_torchvision_eager_bs12_turing_pascal.csv --out ryujaehun.sqlite
    python scripts/fit/calibrate_fp64.py --data ryujaehun.sqlite [--out dippm_nas/prior/calibration/fitted.json]

With the FP32 constants, float64 CNNs read 0.4-0.5x of their measured time for VGG and wide ResNets (dense 3x3
convolutions: the FP32 efficiency includes Winograd, which cuDNN does not run in FP64) and 1.1-1.7x for MnasNet,
ShuffleNet and DenseNet (the wave, tile and reduction-length terms of fast FP32 kernels, while FP64 kernels are
bound by the math units). One efficiency for FP64 convolutions and GEMMs on CUDA cores, without those terms
(``OpClassParams.eta_compute_fp64`` of ``conv`` and ``matmul``), is fitted by least squares in log space on the
float64 rows. It is scored leave-one-GPU-out (fitted on the other GPUs' rows, the held-out GPU's rows
predicted); the RMS log error of those held-out predictions is the float64 σ of the kernel part
(``host_model.metrics["sigma_log_gpu_bound_float64"]``, see :func:`dippm_nas.prior.latency_sigma_log`).
``--out`` writes both into the calibration file and keeps everything else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import minimize_scalar

from dippm_nas.dataset import load_measurements
from dippm_nas.prior import HostRow, PriorParams, default_params, estimate, row_settings
from dippm_nas.errors import InvalidValueError
from dippm_nas.files import write_output

#: op classes whose FP64 kernels get the fitted efficiency
CLASSES = ("conv", "matmul")


def with_fp64_efficiency(params: PriorParams, eta: float | None) -> PriorParams:
    """``params`` with ``eta_compute_fp64 = eta`` on :data:`CLASSES`."""
    oc = dict(params.op_classes)
    for c in CLASSES:
        oc[c] = dataclasses.replace(oc[c], eta_compute_fp64=eta)
    return dataclasses.replace(params, op_classes=oc)


def predict_ms(rows: list[HostRow], params: PriorParams) -> np.ndarray:
    return np.array([estimate(r.graph, r.device, params=params, deployment=r.execution).latency_ms for r in rows])


def fit_eta(rows: list[HostRow], params: PriorParams) -> float:
    """The efficiency minimising the mean squared log error over ``rows``."""
    y = np.array([r.latency_ms for r in rows])

    def loss(log_eta: float) -> float:
        return float(np.mean(np.log(predict_ms(rows, with_fp64_efficiency(params, math.exp(log_eta))) / y) ** 2))

    res = minimize_scalar(loss, bounds=(math.log(0.05), math.log(2.0)), method="bounded", options={"xatol": 1e-3})
    return float(math.exp(res.x))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="dataset file with the ryujaehun rows (graphs captured)")
    ap.add_argument("--out", type=Path, default=None,
                    help="calibration JSON to write the fitted efficiency and the float64 σ into")
    args = ap.parse_args(argv)

    rows = [HostRow(mg.graph, mg.measurement["device"],
                    row_settings(mg.measurement.get("conditions"), mg.measurement.get("environment")),
                    float(mg.measurement["latency_ms"]))
            for mg in load_measurements(args.data, source="ryujaehun") if mg.spec.dtype == "float64"]
    if not rows:
        print(f"no float64 rows of source 'ryujaehun' in {args.data}", file=sys.stderr)
        return 1
    base = with_fp64_efficiency(default_params(), None)  # the FP32 constants, whatever the file holds
    devices = sorted({r.device for r in rows})
    print(f"{len(rows)} float64 rows on {devices}; MAPE with the FP32 constants -> with the fitted FP64 efficiency")
    held = []
    for dev in devices:
        train = [r for r in rows if r.device != dev]
        test = [r for r in rows if r.device == dev]
        eta = fit_eta(train, base)
        y = np.array([r.latency_ms for r in test])
        before = predict_ms(test, base) / y
        after = predict_ms(test, with_fp64_efficiency(base, eta)) / y
        held += list(np.log(after))
        print(f"  held out {dev:12s} eta {eta:.3f}  MAPE {np.mean(np.abs(before - 1)) * 100:5.1f} % -> "
              f"{np.mean(np.abs(after - 1)) * 100:5.1f} %  (median predicted / measured {np.median(before):.2f} -> "
              f"{np.median(after):.2f})")
    sigma = float(np.sqrt(np.mean(np.square(held))))
    eta = fit_eta(rows, base)
    print(f"held-out RMS log error (the float64 σ): {sigma:.3f}; efficiency fitted on all {len(rows)} rows: {eta:.3f}")

    if args.out is not None:
        d = json.loads(args.out.read_text(encoding="utf-8"))
        for c in CLASSES:
            d["op_classes"][c]["eta_compute_fp64"] = eta
        if d.get("host_model") is not None:
            cmd = "python " + shlex.join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])])
            d["host_model"]["metrics"]["sigma_log_gpu_bound_float64"] = sigma
            d["host_model"]["metrics"]["fit_float64"] = (
                f"{cmd}: eta_compute_fp64 of {', '.join(CLASSES)} fitted on {len(rows)} float64 rows "
                f"({', '.join(devices)}); sigma_log_gpu_bound_float64 is the RMS log error leave-one-GPU-out")
        write_output(args.out, json.dumps(d, indent=1) + "\n", "--out", error=InvalidValueError)
        print(f"wrote eta_compute_fp64 and the float64 σ into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
