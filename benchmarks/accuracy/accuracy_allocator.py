"""The caching allocator's figures (``allocated_mib`` / ``reserved_mib``) and LLM serving memory against vLLM's
profile-run arithmetic.

Three parts (``--parts``):

- ``zoo``: for torchvision models at the given batch sizes, the activation peak of the eager liveness, what
  ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` would read by the simulated caching
  allocator (PyTorch's defaults and ``expandable_segments:True``), and the fragmentation (reserved over allocated).
  Analytic figures: nothing here is measured.
- ``measured``: predicted against measured ``torch_max_allocated_mib`` / ``torch_max_reserved_mib`` of the
  campaign rows under ``--campaign DIR`` (``dippm-nas gpu-campaign`` output), and a scan of ``--data`` for any
  measured max_memory_allocated / reserved column (its PROVENANCE.md says none of its sources measures per-model
  GPU memory).
- ``llm``: Llama-2-7B (1 GPU), Llama-2-70B (4 GPUs) and Mixtral-8x7B (2 GPUs) on H100 SXM under vLLM: the
  prediction's weights, profile run, KV budget and blocks per GPU, and the blocks vLLM's own formula gives from
  the same profiled peak (``num_gpu_blocks = (total * gpu_memory_utilization - peak) // cache_block_size``, with
  ``cache_block_size = block_size * layers * 2 * kv_heads / TP * head_dim * bytes`` computed here from the config).

Run::

    PYTHONPATH=$PWD nice -n 10 /work/venv-vision/bin/python benchmarks/accuracy/accuracy_allocator.py \\
        --parts zoo,measured,llm --data /work/shared/data
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from dippm_nas.capture import capture, load_model
from dippm_nas.devices import get_device
from dippm_nas.llm import LLMWorkload, architecture, predict_generation, vllm_gpu_blocks
from dippm_nas.measure import read_campaign_rows
from dippm_nas.prior import AllocatorConfig, activation_liveness, estimate, gpu_memory_parts, graph_facts
from dippm_nas.spec import InputSpec

DEFAULT_ZOO = "resnet50,densenet121,mobilenet_v2,efficientnet_b0,vgg16,vit_b_16,swin_t,convnext_tiny"
LLM_CASES = (("llama-2-7b", 1), ("llama-2-70b", 4), ("mixtral-8x7b", 2))


def zoo(names: list[str], batches: list[int], device: str) -> None:
    import torchvision  # noqa: PLC0415  (an optional dependency of this benchmark only)

    dev = get_device(device)
    print(f"\n## Allocator figures, torchvision, float32, {device} (analytic; nothing measured)\n")
    print("| model | batch | weights MiB | activations MiB | allocated MiB | reserved MiB | reserved / allocated "
          "| reserved, expandable MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        for b in batches:
            g = capture(getattr(torchvision.models, name)(), InputSpec(shape=(3, 224, 224), batch_size=b), cache=False)
            lv = activation_liveness(g, retention=True, include_inputs=False)
            facts = graph_facts(g)
            convs = any(nd.op_class == "conv" for nd in g.nodes)
            kw = dict(context_mib=dev.runtime_baseline_mib, cublas_workspace_mib=dev.cublas_workspace_mib,
                      uses_cublas=facts.uses_cublas, uses_cudnn=convs)
            p = gpu_memory_parts(g, lv, **kw)
            e = gpu_memory_parts(g, lv, allocator=AllocatorConfig(expandable_segments=True), **kw)
            print(f"| {name} | {b} | {p.weights_mib:.1f} | {p.activations_peak_mib:.1f} | {p.allocated_mib:.1f} | "
                  f"{p.reserved_mib:.1f} | {p.reserved_mib / p.allocated_mib:.3f} | {e.reserved_mib:.1f} |")


def measured(campaign: Path | None, data: Path | None) -> None:
    print("\n## Against measured max_memory_allocated / max_memory_reserved\n")
    if data is not None:
        hits = []
        for f in sorted(data.glob("*.csv")):
            with f.open(newline="") as fh:
                header = next(csv.reader(fh), [])
            cols = [c for c in header if "max_memory" in c.lower() or "reserved" in c.lower()
                    or "allocated" in c.lower()]
            if cols:
                hits.append(f"{f.name}: {cols}")
        print(f"- {data}: " + ("; ".join(hits) if hits else
                               "no column of measured max_memory_allocated / reserved in any CSV"))
    if campaign is None:
        print("- no --campaign DIR given: no measured rows to compare")
        return
    rows = [r for r in read_campaign_rows(campaign) if r.get("status") == "ok"
            and "torch_max_allocated_mib" in (r.get("extra") or {}).get("memory_parts_mib", {})]
    if not rows:
        print(f"- {campaign}: no ok row with torch_max_allocated_mib")
        return
    print("| model | device | batch | dtype | allocated pred / meas MiB | reserved pred / meas MiB |")
    print("|---|---|---|---|---|---|")
    errs: list[tuple[float, float]] = []
    for r in rows:
        cfg = r["config"]
        spec = InputSpec.from_dict(cfg["input_spec"])
        g = capture(load_model(cfg["spec"]), spec, cache=False)
        est = estimate(g, r["device"])
        ma = r["extra"]["memory_parts_mib"]
        pa, pr = est.memory_details["allocated_mib"], est.memory_details["reserved_mib"]
        a, rs = ma["torch_max_allocated_mib"], ma["torch_max_reserved_mib"]
        errs.append((pa / a - 1, pr / rs - 1))
        print(f"| {cfg['name']} | {r['device']} | {r['batch_size']} | {r['dtype']} | {pa:.1f} / {a:.1f} | "
              f"{pr:.1f} / {rs:.1f} |")
    for i, what in enumerate(("allocated", "reserved")):
        e = [x[i] for x in errs]
        print(f"- {what}: MAPE {100 * sum(map(abs, e)) / len(e):.1f} %, bias {100 * sum(e) / len(e):+.1f} %, "
              f"{len(e)} rows")


def llm(device: str) -> None:
    dev = get_device(device)
    print(f"\n## vLLM on {device}: the prediction against vLLM's block formula (gpu_memory_utilization 0.9, "
          "block 16)\n")
    print("| model | TP | weights / GPU MiB | profile tokens x seqs | activations MiB | KV budget MiB | blocks "
          "(prediction) | blocks (vLLM formula) | KV tokens | engine reserved MiB | CUDA graph pool MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, tp in LLM_CASES:
        cfg = architecture(name)
        p = predict_generation(cfg, LLMWorkload(1024, 256, 8), device, runtime="serving", engine="vllm",
                               tensor_parallel=tp, mig=False)
        d = p.details
        kv_heads = max(1, cfg.num_kv_heads // tp)
        block_bytes = 16 * cfg.num_layers * 2 * kv_heads * cfg.head_dim * 2  # float16 / bfloat16 KV
        peak = d["weights_mib"] + d["workspace_mib"] + d["activations_mib"]
        ref = vllm_gpu_blocks(dev.memory_mib, 0.9, peak, block_bytes)
        print(f"| {name} | {tp} | {d['weights_mib']:.0f} | {d['profile_tokens']:.0f} x {d['profile_sequences']:.0f} | "
              f"{d['activations_mib']:.0f} | {d['kv_budget_mib']:.0f} | {d['kv_blocks']} | {ref} | {16 * ref:,} | "
              f"{d['engine_reserved_mib']:.0f} | {d['cuda_graph_pool_mib']:.0f} |")
        if d["kv_blocks"] != ref:
            print(f"  MISMATCH for {name}: {d['kv_blocks']} != {ref}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="zoo,measured,llm", help="comma-separated: zoo, measured, llm")
    ap.add_argument("--zoo", default=DEFAULT_ZOO, help="torchvision model names")
    ap.add_argument("--batches", default="8,32", help="batch sizes of the zoo")
    ap.add_argument("--device", default="a100-sxm4-40gb", help="device of the zoo")
    ap.add_argument("--llm-device", default="h100-sxm5-80gb", help="device of the LLM part")
    ap.add_argument("--campaign", type=Path, default=None, help="a gpu-campaign output directory")
    ap.add_argument("--data", type=Path, default=None, help="the public data directory to scan")
    a = ap.parse_args(argv)
    parts = set(a.parts.split(","))
    if "zoo" in parts:
        zoo(a.zoo.split(","), [int(x) for x in a.batches.split(",")], a.device)
    if "measured" in parts:
        measured(a.campaign, a.data)
    if "llm" in parts:
        llm(a.llm_device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
