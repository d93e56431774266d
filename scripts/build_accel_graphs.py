"""Build the Accel-NASBench training file of the ``a100-sxm4-40gb`` checkpoint (graphs + measured labels).

Usage (from the repository root; the data path is an argument, nothing is downloaded)::

    python scripts/build_accel_graphs.py --data ../shared/data --out accel_stitched.jsonl [--verify 100]

Capturing each of the 5,138 networks with ``torch.export`` costs 8-25 s on a 2-core machine (hours), yet
the networks are made of only ~170 distinct blocks: the stem, every (stage, first/later layer, expansion,
kernel, squeeze-excite) MBConv layer at its input shape, and the head. ``mbconv`` is a
``search_spaces.BlockSearchSpace``, so :func:`dippm_nas.capture.assemble_many` captures each block once
(conversion cache) and assembles each network's graph from its blocks. ``--verify N`` also captures the
first N networks whole and checks that each assembled graph has the same ``structural_hash``.

The output is the dataset JSONL format read by ``dippm-nas train/evaluate`` and
:func:`dippm_nas.dataset.load_measurements`: one ``graph`` record per distinct network and one
``measurement`` record per (network, GPU) with ``latency_ms = 256 / throughput * 1000`` (the published
throughput is images/s at batch 256 or 128 -- not recorded per row -- with fp16 autocast and channels_last
at 256x256, see ../shared/docs/accel_nasbench_space.md). Graphs are captured at batch 256, float16.
The file is derived from public data: keep it outside the repository.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

logger = logging.getLogger("build_accel_graphs")

RESOLUTION = 256
BATCH_SIZE = 256
DTYPE = "float16"
CSV_NAME = "accel_nasbench_mnasnet_space_throughput.csv"
#: (dataset device id, throughput column prefix) of the two GPUs Accel-NASBench measured.
DEVICES = (("a100-40gb", "throughput_a100__throughput"), ("rtx-3090", "throughput_3090__throughput"))
LABEL_NOTE = ("batch 256 / throughput (images/s) * 1000; throughput measured with fp16 autocast, channels_last, "
              "batch 256 or 128 (not recorded per row)")

def _float_or_none(text: str | None) -> float | None:
    try:
        v = float(text) if text else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help=f"directory holding {CSV_NAME}")
    ap.add_argument("--out", required=True, type=Path, help="output JSONL file")
    ap.add_argument("--limit", type=int, default=None, help="only the first N networks (smoke runs)")
    ap.add_argument("--workers", type=int, default=2, help="capture processes (default 2)")
    ap.add_argument("--verify", type=int, default=0, metavar="N",
                    help="also capture the first N networks whole and compare structural hashes")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    import dippm_nas as dn
    import search_spaces as ss
    from dippm_nas.capture import assemble_many, capture_many
    from dippm_nas.errors import InvalidValueError
    from dippm_nas.files import output_path

    csv_path = args.data / CSV_NAME
    if not csv_path.is_file():
        ap.error(f"{csv_path} not found: --data must be the directory holding {CSV_NAME}")
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))[: args.limit]
    cfgs = [ss.config_from_accel_nasbench_row(r, resolution=RESOLUTION) for r in rows]
    spec = dn.InputSpec(shape=(3, RESOLUTION, RESOLUTION), batch_size=BATCH_SIZE, dtype=DTYPE)
    t0 = time.perf_counter()
    results = assemble_many([("mbconv", c, spec) for c in cfgs], workers=args.workers, progress=True, fallback=False)
    bad = [r for r in results if not r.ok]
    if bad:
        logger.error("%d networks could not be assembled; the first: %s", len(bad), bad[0].error)
        return 1
    logger.info("%d networks assembled in %.0f s", len(cfgs), time.perf_counter() - t0)

    assembled: dict[str, Any] = {}
    n_rows = 0
    with output_path(args.out, "--out", error=InvalidValueError, inputs=[csv_path]) as tmp, tmp.open("w") as f:
        f.write(json.dumps({"type": "header", "format": "dippm-nas-dataset-jsonl", "schema_version": 1,
                            "meta": {"created_by": "scripts/build_accel_graphs.py", "source_csv": CSV_NAME}}) + "\n")
        for i, (r, c, res) in enumerate(zip(rows, cfgs, results)):
            g = res.graph
            h = g.structural_hash()
            if h not in assembled:
                assembled[h] = g
                f.write(json.dumps({"type": "graph", "structural_hash": h, "space": "mbconv", "config": c,
                                    "graph": g.to_dict()}, separators=(",", ":")) + "\n")
            for dev, col in DEVICES:
                thr = _float_or_none(r.get(f"{col}_mean"))
                if thr is None or thr <= 0:
                    continue  # this GPU has no published figure for the network: no row, nothing invented
                f.write(json.dumps({
                    "type": "measurement", "graph_hash": h, "space": "mbconv", "config": c,
                    "batch_size": BATCH_SIZE, "dtype": DTYPE, "device": dev,
                    "latency_ms": BATCH_SIZE / thr * 1000.0, "latency_ms_std": None, "energy_j": None,
                    "memory_mib": None, "status": "ok", "source": "accel-nasbench", "row_key": f"{i}:{dev}",
                    "conditions": {"latency": LABEL_NOTE},
                    "extra": {"throughput_std": _float_or_none(r.get(f"{col}_std")), "csv_row": i},
                }, separators=(",", ":")) + "\n")
                n_rows += 1
    logger.info("wrote %s: %d graphs, %d measurement rows", args.out, len(assembled), n_rows)

    if args.verify:
        whole = [(functools.partial(ss.build_model, "mbconv", c), spec) for c in cfgs[: args.verify]]
        same = 0
        for c, r in zip(cfgs, capture_many(whole, workers=args.workers, progress=True)):
            if r.graph is None:
                logger.error("whole network failed to capture: %s", r.error)
                return 1
            same += r.graph.structural_hash() in assembled
        logger.info("verify: %d of %d whole captures have an identical assembled graph", same, len(whole))
        if same != len(whole):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
