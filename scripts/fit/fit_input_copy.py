"""Measure what the eager CNN timings' loop really copies, and the first-touch time of a freshly mapped batch.

Usage (from the repository root; the data path is an argument, nothing is downloaded)::

    python scripts/fit/fit_input_copy.py --csv ../shared/data/ryujaehun_torchvision_eager_bs12_turing_pascal.csv \\
        [--write dippm_nas/prior/calibration/fitted.json] [--json out.json]

The ryujaehun/pytorch-gpu-benchmark loop times ``model(img.to('cuda'))`` after ``img = getattr(img, precision)()``
outside the timed region, ``img`` being a batch of a DataLoader with 8 workers (PROVENANCE.md): a **float32** batch
is the workers' own tensor in shared memory, mapped into the process for this batch, so the copy touches each of its
pages first; a **float16** batch is a fresh ``.half()`` of it, written by the process before the timed region. The
models PROVENANCE.md names host-bound at batch 12 (the mobilenet, shufflenet and mnasnet families) issue the same
operators in both precisions, so on their rows ``float32 - float16`` is the copy's difference alone: the physics
(:func:`dippm_nas.prior.input_copy_us`: the extra bytes at the slower of a host core's staging copy and the pinned
PCIe rate) plus the first touch of the float32 batch's pages. A pair whose float16 time is above its float32 time
has half-precision kernels on its critical path (the TITAN Xp's 1/64-rate FP16) and is left out.

Per host: the median difference over its pairs, the physics part, and the rest per 4 KiB page, converted to the
reference host (times the host model's scale of the recorded clock and PyTorch 1.x). The first-touch time is the
geometric mean over the hosts; its σ the RMS log error of each host predicted by the geometric mean of the others
(leave one host out). ``--write`` sets ``host_model.h2d_fresh_page_us``, ``h2d_fresh_page_sigma_log``,
``h2d_gbps`` (:data:`~dippm_nas.prior.PAGEABLE_STAGING_GBPS`) and ``h2d_fixed_us`` (0) in the calibration file and
records this command and the per-host figures in ``metrics["fit_input_copy"]``; refit the host model after it
(``scripts/fit/calibrate_host_model.py``), which keeps them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dippm_nas.dataset.importers import RYUJAEHUN_HOSTS  # noqa: E402
from dippm_nas.devices import HostProfile, resolve_device  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.prior import PAGE_BYTES, PAGEABLE_STAGING_GBPS, PINNED_COPY_EFFICIENCY, default_params  # noqa: E402

#: GPU name in the CSV -> catalogue id.
DEVICES = {"GeForce RTX 2080 Ti": "rtx-2080-ti", "TITAN RTX": "titan-rtx", "TITAN Xp": "titan-xp"}
#: The families PROVENANCE.md names host (dispatch) bound at batch 12 in every precision.
HOST_BOUND_FAMILIES = ("mobilenet", "shufflenet", "mnasnet")
#: Bytes of one float32 / float16 batch: 12 x 3 x 224 x 224 elements.
BATCH_ELEMENTS = 12 * 3 * 224 * 224


_DTYPES = {"half": "float16", "float": "float32", "double": "float64"}


def read_medians(path: Path) -> dict[tuple[str, str, str], float]:
    """``{(device id, model, dtype): median latency ms}`` of the inference rows (what the dataset import stores)."""
    acc: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["mode"] == "inference" and r["gpu"] in DEVICES:
                acc[(DEVICES[r["gpu"]], r["model"], _DTYPES[r["precision"]])].append(float(r["latency_ms"]))
    return {k: float(np.median(v)) for k, v in acc.items()}


def per_host(medians: dict[tuple[str, str, str], float], hm: Any = None) -> dict[str, dict[str, Any]]:
    """Each host's measured copy difference, its physics part and the first-touch time per page (``medians``:
    :func:`read_medians`' form; ``hm``: the host model whose scale converts to the reference host)."""
    hm = hm if hm is not None else default_params().host_model
    out = {}
    for gpu, device in DEVICES.items():
        models = sorted({m for d, m, _ in medians if d == device and m.startswith(HOST_BOUND_FAMILIES)})
        pairs = {m: medians[(device, m, "float32")] - medians[(device, m, "float16")] for m in models
                 if (device, m, "float32") in medians and (device, m, "float16") in medians}
        if not pairs:
            continue
        kept = {m: d for m, d in pairs.items() if d >= 0}
        link = resolve_device(device).pcie_gbps
        rate = min(PAGEABLE_STAGING_GBPS, link * PINNED_COPY_EFFICIENCY)  # GB/s = bytes / µs / 1e3
        b32, b16 = 4 * BATCH_ELEMENTS, 2 * BATCH_ELEMENTS
        physics_ms = (b32 - b16) / (rate * 1e3) / 1e3
        measured_ms = float(np.median(list(kept.values())))
        pages = math.ceil(b32 / PAGE_BYTES)
        page_us = max(measured_ms - physics_ms, 0.0) * 1e3 / pages
        clock = float(RYUJAEHUN_HOSTS[gpu]["clock_ghz"])
        scale = hm.scale(HostProfile.from_clock(clock, framework="torch-1"))
        out[device] = {"pairs": len(kept), "left_out": sorted(set(pairs) - set(kept)), "clock_ghz": clock,
                       "fp32_minus_fp16_ms": measured_ms, "physics_ms": physics_ms, "pages": pages,
                       "page_us_on_host": page_us, "page_us_reference": page_us / scale}
    return out


def summarise(hosts: dict[str, dict[str, Any]], without: str | None = None) -> dict[str, Any]:
    """The geometric mean of the hosts' reference first-touch times and its leave-one-host-out σ (``without``: a
    host left out of both, as a held-out GPU's fold needs)."""
    logs = {d: math.log(h["page_us_reference"]) for d, h in hosts.items()
            if h["page_us_reference"] > 0 and d != without}
    centre = math.exp(float(np.mean(list(logs.values()))))
    errs = {d: v - float(np.mean([w for e, w in logs.items() if e != d])) for d, v in logs.items()}
    return {"h2d_fresh_page_us": centre, "h2d_fresh_page_sigma_log": float(np.sqrt(np.mean(np.square(list(errs.values()))))),
            "held_out_log_error": errs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", required=True, type=Path, help="ryujaehun_torchvision_eager_bs12_turing_pascal.csv")
    ap.add_argument("--write", type=Path, default=None, help="calibration JSON whose host_model gets the constants")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    hosts = per_host(read_medians(args.csv))
    summary = summarise(hosts)
    for d, h in hosts.items():
        print(f"{d:12s} {h['clock_ghz']:.1f} GHz  {h['pairs']} pairs (left out {h['left_out']}): fp32 - fp16 "
              f"{h['fp32_minus_fp16_ms']:.2f} ms, physics {h['physics_ms']:.2f} ms, first touch "
              f"{h['page_us_on_host']:.2f} µs/page on the host = {h['page_us_reference']:.2f} µs on the reference "
              f"host; held out: log error {summary['held_out_log_error'].get(d, math.nan):+.2f}")
    print(f"first touch per page (reference host): {summary['h2d_fresh_page_us']:.3f} µs, σ (leave one host out) "
          f"{summary['h2d_fresh_page_sigma_log']:.2f} in log")
    report = {"hosts": hosts, **summary, "staging_gbps": PAGEABLE_STAGING_GBPS}
    if args.json is not None:
        write_output(args.json, json.dumps(report, indent=1) + "\n", "--json", error=InvalidValueError)
    if args.write is not None:
        cal = json.loads(args.write.read_text(encoding="utf-8"))
        hm = cal["host_model"]
        hm.update(h2d_fresh_page_us=summary["h2d_fresh_page_us"],
                  h2d_fresh_page_sigma_log=summary["h2d_fresh_page_sigma_log"], h2d_gbps=PAGEABLE_STAGING_GBPS,
                  h2d_fixed_us=0.0)
        command = "python scripts/fit/fit_input_copy.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
        hm.setdefault("metrics", {})["fit_input_copy"] = (
            f"{command}: first touch per 4 KiB page of a freshly mapped batch from float32 - float16 of the "
            "host-bound families (mobilenet, shufflenet, mnasnet) minus the physics of the extra bytes; "
            + "; ".join(f"{d}: {h['pairs']} pairs, {h['fp32_minus_fp16_ms']:.2f} ms - {h['physics_ms']:.2f} ms "
                        f"-> {h['page_us_reference']:.2f} µs/page (reference host)" for d, h in hosts.items())
            + f"; geometric mean {summary['h2d_fresh_page_us']:.3f} µs, leave-one-host-out σ "
              f"{summary['h2d_fresh_page_sigma_log']:.2f}")
        write_output(args.write, json.dumps(cal, indent=1) + "\n", "--write", error=InvalidValueError)
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
