"""How well the prior's activation liveness agrees with eager PyTorch, per family (no GPU needed).

For each model, the label is :func:`dippm_nas.measure.reference_activation_peak`: the model runs eagerly on
fake tensors under a dispatch mode that tracks live storages (exact eager liveness, Python frames'
references included). The prediction is the GPU prior's ``activations_peak_mib``
(:func:`dippm_nas.prior.activation_liveness` with eager retention, inputs apart); the dataflow liveness
(free at last use) is printed beside it. Per family: MAPE, bias (mean signed error), max error, and the
root-mean-square relative error over everything, the figure ``ACTIVATION_REL_SIGMA`` in
``dippm_nas/prior/_memory.py`` is taken from.

Models: the search-space families of a dataset export with graphs (``--dataset``, ``--per-family`` rows of
each, rebuilt from their configs), and torchvision / timm models captured here (``--torchvision``,
``--timm``: comma-separated names; needs torchvision / timm, e.g. ``/work/main/.venv-vision``)::

    PYTHONPATH=$PWD /work/main/.venv-vision/bin/python benchmarks/accuracy/accuracy_memory_liveness.py \\
        --dataset data/host_cpu/host_cpu_amd_epyc_f25m17_14fam.jsonl.xz --per-family 8 \\
        --torchvision resnet50,vit_b_16,densenet121 --batch 32 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._common import machine  # noqa: E402
from dippm_nas.graph import OperatorGraph  # noqa: E402
from dippm_nas.measure import reference_activation_peak  # noqa: E402
from dippm_nas.prior import activation_liveness  # noqa: E402
from dippm_nas.spec import InputSpec  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402

MIB = 2**20

#: Torchvision and timm models of the report (``--torchvision default`` / ``--timm default``).
DEFAULT_TORCHVISION = ("resnet18,resnet50,resnet101,wide_resnet50_2,resnext50_32x4d,vgg16,vgg11_bn,densenet121,"
                       "densenet169,mobilenet_v2,mobilenet_v3_large,mobilenet_v3_small,efficientnet_b0,"
                       "efficientnet_v2_s,convnext_tiny,regnet_y_800mf,regnet_x_1_6gf,mnasnet1_0,"
                       "shufflenet_v2_x1_0,squeezenet1_0,alexnet,googlenet,vit_b_16,swin_t,maxvit_t")
DEFAULT_TIMM = ("vit_small_patch16_224,deit_tiny_patch16_224,swin_tiny_patch4_window7_224,convnext_nano,"
                "efficientnet_b1,mobilenetv3_large_100,resnet26d,regnety_008,mixer_b16_224,convmixer_768_32,"
                "levit_128,poolformer_s12,coat_lite_tiny,ghostnet_100,rexnet_100,cspresnet50,dla34,"
                "hrnet_w18_small,inception_v3,xception41")


def predicted(graph: OperatorGraph) -> tuple[float, float]:
    """(eager-retention peak, dataflow peak) of the graph's activations, bytes (inputs apart)."""
    eager = activation_liveness(graph, retention=True, include_inputs=False).peak_allocated_bytes
    flow = activation_liveness(graph, include_inputs=False).peak_allocated_bytes
    return float(eager), float(flow)


def search_space_rows(dataset: Path, per_family: int, seed: int) -> list[dict[str, Any]]:
    import search_spaces as ss

    from dippm_nas.dataset import iter_jsonl

    graphs: dict[str, Any] = {}
    rows = []
    for r in iter_jsonl(dataset):
        if r["type"] == "graph":
            graphs[r["structural_hash"]] = r["graph"]
        elif r["type"] == "measurement" and r.get("graph_hash"):
            rows.append(r)
    random.Random(seed).shuffle(rows)
    out, count, seen = [], {}, set()
    for r in rows:
        sp, h = r["space"], r["graph_hash"]
        if count.get(sp, 0) >= per_family or h in seen or h not in graphs:
            continue
        g = OperatorGraph.from_dict(graphs[h])
        try:
            ref = reference_activation_peak(ss.build_model(sp, r["config"]), g.spec)
        except Exception as e:  # noqa: BLE001 - a benchmark reports what it skipped and goes on
            print(f"  skipped {sp} {r['config']}: {type(e).__name__}: {e}")
            continue
        seen.add(h)
        count[sp] = count.get(sp, 0) + 1
        out.append({"family": sp, "name": f"{sp}#{count[sp]} bs{g.spec.batch_size}", "ref": ref, "graph": g})
    return out


def zoo_rows(prefix: str, names: list[str], batch: int) -> list[dict[str, Any]]:
    import dippm_nas

    out = []
    for name in names:
        spec = InputSpec(shape=(3, 224, 224), batch_size=batch)
        t0 = time.perf_counter()
        try:
            ref = reference_activation_peak(f"{prefix}:{name}", spec)
            g = dippm_nas.capture(f"{prefix}:{name}", spec)
        except Exception as e:  # noqa: BLE001
            print(f"  skipped {prefix}:{name}: {type(e).__name__}: {e}")
            continue
        out.append({"family": prefix, "name": f"{prefix}:{name} bs{batch}", "ref": ref, "graph": g})
        print(f"  {prefix}:{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_family: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        eager, flow = predicted(r["graph"])
        ref = float(r["ref"].peak_block_bytes)
        r.update(pred=eager, flow=flow, err=(eager - ref) / ref, flow_err=(flow - ref) / ref, ref_bytes=ref)
        by_family.setdefault(r["family"], []).append(r)
    print(f"\n{'family':<14}{'n':>4}{'MAPE %':>9}{'bias %':>9}{'max %':>9}{'dataflow MAPE %':>17}   worst model")
    summary: dict[str, Any] = {"machine": machine(), "families": {}, "models": []}
    for fam, rs in sorted(by_family.items()):
        errs = [r["err"] for r in rs]
        worst = max(rs, key=lambda r: abs(r["err"]))
        mape = 100 * sum(abs(e) for e in errs) / len(errs)
        fmape = 100 * sum(abs(r["flow_err"]) for r in rs) / len(rs)
        print(f"{fam:<14}{len(rs):>4}{mape:>9.1f}{100 * sum(errs) / len(errs):>+9.1f}{100 * worst['err']:>+9.1f}"
              f"{fmape:>17.1f}   {worst['name']} ({worst['pred'] / MIB:.2f} vs {worst['ref_bytes'] / MIB:.2f} MiB)")
        summary["families"][fam] = {"n": len(rs), "mape_pct": mape, "bias_pct": 100 * sum(errs) / len(errs),
                                    "max_err_pct": 100 * worst["err"], "dataflow_mape_pct": fmape}
    errs = [r["err"] for r in rows]
    rms = math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else math.nan
    mape = 100 * sum(abs(e) for e in errs) / len(errs) if errs else math.nan
    fmape = 100 * sum(abs(r["flow_err"]) for r in rows) / len(rows) if rows else math.nan
    print(f"\nall {len(rows)} models: MAPE {mape:.1f} % (dataflow liveness {fmape:.1f} %), RMS relative error "
          f"{rms:.3f} (ACTIVATION_REL_SIGMA)")
    summary.update(n=len(rows), mape_pct=mape, dataflow_mape_pct=fmape, rms_rel_err=rms)
    summary["models"] = [{"family": r["family"], "name": r["name"], "reference_mib": r["ref_bytes"] / MIB,
                          "predicted_mib": r["pred"] / MIB, "dataflow_mib": r["flow"] / MIB} for r in rows]
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=None, help="export with graphs of search-space models")
    ap.add_argument("--per-family", type=int, default=8, help="distinct graphs per search-space family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torchvision", default="", help="comma-separated names, or 'default'")
    ap.add_argument("--timm", default="", help="comma-separated names, or 'default'")
    ap.add_argument("--batch", type=int, default=32, help="batch of the torchvision / timm models (3x224x224)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    rows: list[dict[str, Any]] = []
    if args.dataset is not None:
        rows += search_space_rows(args.dataset, args.per_family, args.seed)
    tv = DEFAULT_TORCHVISION if args.torchvision == "default" else args.torchvision
    tm = DEFAULT_TIMM if args.timm == "default" else args.timm
    rows += zoo_rows("torchvision", [n for n in tv.split(",") if n], args.batch)
    rows += zoo_rows("timm", [n for n in tm.split(",") if n], args.batch)
    if not rows:
        ap.error("nothing to compare: give --dataset and/or --torchvision / --timm")
    summary = report(rows)
    if args.json is not None:
        write_output(args.json, json.dumps(summary, indent=1), "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    sys.exit(main())
