"""Build the Accel-NASBench training file of the ``a100-sxm4-40gb`` checkpoint (graphs + measured labels).

Usage (from the repository root; the data path is an argument, nothing is downloaded)::

    python scripts/build_accel_graphs.py --data ../shared/data --out accel_stitched.jsonl [--verify 100]

Capturing each of the 5,138 networks with ``torch.export`` costs 8-25 s on a 2-core machine (hours), yet
the networks are made of only ~170 distinct pieces: the stem, every (stage, first/later layer, expansion,
kernel, squeeze-excite) MBConv layer at its input shape, and the head. This script captures each piece
once (``capture_many``, conversion cache) and stitches each network's graph from its pieces in execution
order: node ids offset, each piece's input consumers fed by the previous piece's output, parameter counts
summed. ``--verify N`` also captures the first N networks whole and checks that each stitched graph has
the same ``structural_hash`` (100 of 100 checked).

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

PieceKey = Any  # "stem", "head" or ("layer", c_in, c_out, expansion, kernel, stride, se)


def _head_module() -> Any:
    import torch
    from torch import nn

    from search_spaces._layers import ConvBNAct
    from search_spaces._mbconv import _DROPOUT, _HEAD_CH, MBCONV_STAGES

    class Head(nn.Module):
        """The network's head alone: 1x1 conv, pool, dropout, classifier (as in ``MBConvNet``)."""

        def __init__(self) -> None:
            super().__init__()
            self.head = ConvBNAct(MBCONV_STAGES[-1][1], _HEAD_CH, 1, act="relu")
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.dropout = nn.Dropout(_DROPOUT)
            self.fc = nn.Linear(_HEAD_CH, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.dropout(torch.flatten(self.pool(self.head(x)), 1)))

    return Head()


def build_piece(key: PieceKey) -> Any:
    """The module of one piece (seeded: weights do not enter the graph, but keep runs identical)."""
    import torch

    from search_spaces._layers import ConvBNAct
    from search_spaces._mbconv import _STEM_CH, MBConv

    torch.manual_seed(0)
    if key == "stem":
        return ConvBNAct(3, _STEM_CH, 3, stride=2, act="relu").eval()
    if key == "head":
        return _head_module().eval()
    return MBConv(*key[1:]).eval()


def pieces_of(cfg: dict[str, Any]) -> list[tuple[PieceKey, tuple[int, int, int]]]:
    """The pieces of one network in execution order, each with its input shape (C, H, W)."""
    from search_spaces._mbconv import MBCONV_STAGES

    side = RESOLUTION // 2  # after the stride-2 stem
    out: list[tuple[PieceKey, tuple[int, int, int]]] = [("stem", (3, RESOLUTION, RESOLUTION))]
    for i, (c_in, c_out, stride) in enumerate(MBCONV_STAGES):
        for j in range(cfg["l"][i]):
            ci, st = (c_in, stride) if j == 0 else (c_out, 1)
            out.append((("layer", ci, c_out, cfg["e"][i], cfg["k"][i], st, bool(cfg["se"][i])), (ci, side, side)))
            side = (side + st - 1) // st
    out.append(("head", (MBCONV_STAGES[-1][1], side, side)))
    return out


def stitch(parts: Sequence[Any]) -> Any:
    """One network's :class:`OperatorGraph` from its piece graphs in execution order."""
    import dippm_nas as dn
    from dippm_nas.graph import OperatorGraph, OpNode

    nodes, edges, offset = [], [], 0
    prev_out: int | None = None
    consumers0: dict[str, list[int]] = {}
    param_count = param_bytes = 0
    for g in parts:
        for n in g.nodes:
            d = n.to_dict()
            d["i"] += offset
            nodes.append(OpNode.from_dict(d))
        edges += [(s + offset, t + offset) for s, t in g.edges]
        if len(g.input_consumers) != 1 or len(g.outputs) != 1:
            raise ValueError(f"a piece must have one input and one output, got inputs {list(g.input_consumers)} "
                             f"and outputs {g.outputs}")
        ((name, consumers),) = g.input_consumers.items()
        if prev_out is None:
            consumers0 = {name: list(consumers)}
        else:
            edges += [(prev_out, c + offset) for c in consumers]
        prev_out = g.outputs[0] + offset
        param_count += g.param_count
        param_bytes += g.param_bytes
        offset += g.num_nodes
    assert prev_out is not None
    spec = dn.InputSpec(shape=(3, RESOLUTION, RESOLUTION), batch_size=BATCH_SIZE, dtype=DTYPE)
    return OperatorGraph(nodes=nodes, edges=sorted(set(edges)), input_consumers=consumers0, outputs=[prev_out],
                         spec=spec, param_count=param_count, param_bytes=param_bytes, mode=parts[0].mode,
                         source="mbconv (stitched from per-layer captures)").validate()


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
    from dippm_nas.capture import capture_many

    csv_path = args.data / CSV_NAME
    if not csv_path.is_file():
        ap.error(f"{csv_path} not found: --data must be the directory holding {CSV_NAME}")
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))[: args.limit]
    cfgs = [ss.config_from_accel_nasbench_row(r, resolution=RESOLUTION) for r in rows]
    shapes: dict[PieceKey, tuple[int, int, int]] = {}
    for c in cfgs:
        shapes.update(pieces_of(c))
    keys = list(shapes)
    logger.info("%d networks, %d distinct pieces", len(cfgs), len(keys))
    items = [(functools.partial(build_piece, k), dn.InputSpec(shape=shapes[k], batch_size=BATCH_SIZE, dtype=DTYPE))
             for k in keys]
    t0 = time.perf_counter()
    piece = {}
    for k, r in zip(keys, capture_many(items, workers=args.workers, progress=True)):
        if r.graph is None:
            logger.error("piece %s failed to capture: %s", k, r.error)
            return 1
        piece[k] = r.graph
    logger.info("captured %d pieces in %.0f s", len(piece), time.perf_counter() - t0)

    stitched: dict[str, Any] = {}
    n_rows = 0
    with args.out.open("w") as f:
        f.write(json.dumps({"type": "header", "format": "dippm-nas-dataset-jsonl", "schema_version": 1,
                            "meta": {"created_by": "scripts/build_accel_graphs.py", "source_csv": CSV_NAME}}) + "\n")
        for i, (r, c) in enumerate(zip(rows, cfgs)):
            g = stitch([piece[k] for k, _ in pieces_of(c)])
            h = g.structural_hash()
            if h not in stitched:
                stitched[h] = g
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
    logger.info("wrote %s: %d graphs, %d measurement rows", args.out, len(stitched), n_rows)

    if args.verify:
        whole = [(functools.partial(ss.build_model, "mbconv", c),
                  dn.InputSpec(shape=(3, RESOLUTION, RESOLUTION), batch_size=BATCH_SIZE, dtype=DTYPE))
                 for c in cfgs[: args.verify]]
        same = 0
        for c, r in zip(cfgs, capture_many(whole, workers=args.workers, progress=True)):
            if r.graph is None:
                logger.error("whole network failed to capture: %s", r.error)
                return 1
            same += r.graph.structural_hash() in stitched
        logger.info("verify: %d of %d whole captures have an identical stitched graph", same, len(whole))
        if same != len(whole):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
