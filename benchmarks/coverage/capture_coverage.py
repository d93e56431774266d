"""Which well-known models capture, and how: fast mode, decomposing fallback, or with opaque (unknown) ops.

Prints one line per model (mode, nodes, unknown ops, seconds in all with the export and the Relax conversion
apart, or the error) and the totals. Random weights, nothing is downloaded; needs torchvision and/or timm
(``.venv-vision``).

    .venv-vision/bin/python benchmarks/coverage/capture_coverage.py --torchvision            # every classification + segmentation model
    .venv-vision/bin/python benchmarks/coverage/capture_coverage.py --timm halonet26t,xcit_nano_12_p16_384 [--batch 8]
    .venv-vision/bin/python benchmarks/coverage/capture_coverage.py --timm-csv timm_subset.csv   # the models of a timm CSV (column model, infer_img_size)
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dippm_nas.capture import capture  # noqa: E402
from dippm_nas.spec import InputSpec  # noqa: E402


def _torchvision() -> Iterator[tuple[str, Callable[[], Any], int | None]]:
    import torchvision

    for name in torchvision.models.list_models(module=torchvision.models):
        yield name, (lambda n=name: torchvision.models.get_model(n, weights=None)), 299 if "inception" in name else 224
    for name in torchvision.models.list_models(module=torchvision.models.segmentation):
        yield (f"segmentation.{name}",
               lambda n=name: torchvision.models.get_model(n, weights=None, weights_backbone=None), 224)


def _timm(names: list[tuple[str, int | None]]) -> Iterator[tuple[str, Callable[[], Any], int | None]]:
    import timm

    for name, img in names:
        yield name, (lambda n=name: timm.create_model(n, pretrained=False)), img


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torchvision", action="store_true", help="every torchvision classification and segmentation model")
    ap.add_argument("--timm", default="", help="comma-separated timm model names (their default image size)")
    ap.add_argument("--timm-csv", type=Path, default=None, help="a CSV with columns model and infer_img_size")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    timm_names: list[tuple[str, int | None]] = [(n, None) for n in args.timm.split(",") if n]
    if args.timm_csv:
        with open(args.timm_csv, newline="") as f:
            timm_names += list(dict.fromkeys((r["model"], int(r["infer_img_size"])) for r in csv.DictReader(f)))
    if not (args.torchvision or timm_names):
        ap.error("give --torchvision, --timm or --timm-csv")
    sources = [*(_torchvision() if args.torchvision else ()), *(_timm(timm_names) if timm_names else ())]
    modes: collections.Counter[str] = collections.Counter()
    failed = []
    warnings.filterwarnings("ignore")
    for name, build, img in sources:
        t0 = time.perf_counter()
        try:
            model = build()
            size = img or int(getattr(model, "default_cfg", {}).get("input_size", (3, 224, 224))[-1])
            g = capture(model, InputSpec(shape=(3, size, size), batch_size=args.batch, dtype=args.dtype), cache=False)
        except Exception as e:  # noqa: BLE001 - every failure is reported, the sweep goes on
            failed.append(name)
            print(f"FAIL {name:36s} {type(e).__name__}: {str(e).splitlines()[0][:240] if str(e) else ''}", flush=True)
            continue
        modes[g.mode] += 1
        print(f"ok   {name:36s} {g.mode:16s} nodes {g.num_nodes:5d}  unknown {g.unknown_ops or '-'}  "
              f"{time.perf_counter() - t0:.1f} s (export {g.timings['export_s']:.2f} s, convert "
              f"{g.timings['convert_s']:.2f} s)", flush=True)
    total = sum(modes.values()) + len(failed)
    print(f"captured {sum(modes.values())} of {total}: " + ", ".join(f"{m} {c}" for m, c in modes.most_common())
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
