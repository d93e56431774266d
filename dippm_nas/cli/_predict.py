"""``dippm-nas predict SPEC --device D --batch N --shape C,H,W --dtype T [--runtime R] [--host FILE] [--json]``."""

from __future__ import annotations

import argparse
import json

from dippm_nas.prior import RUNTIMES
from dippm_nas.spec import InputSpec, parse_shape

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="predicted latency, energy, memory (with std and source) and MIG fit of a model on a device",
        description="Capture SPEC (torchvision:NAME, timm:NAME, timm-reparam:NAME, a .onnx file, or "
                    "package.module:callable) and "
                    "predict its cost on DEVICE. --json prints the Prediction's fields as one JSON object.",
    )
    p.add_argument("spec", metavar="SPEC",
                   help="torchvision:NAME | timm:NAME | timm-reparam:NAME | path.onnx | package.module:callable")
    p.add_argument("--device", default="a100-sxm4-40gb", help="catalogue device id (default a100-sxm4-40gb; "
                   "`dippm-nas devices` lists them)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--shape", default="3,224,224", help="per-sample input shape C,H,W (default 3,224,224)")
    p.add_argument("--dtype", default="float32", help="float32 | float16 | bfloat16 (default float32)")
    p.add_argument("--runtime", default="eager", choices=RUNTIMES,
                   help="how the model runs on the GPU: eager (default; per-operator host dispatch), cuda-graphs "
                        "(one graph replay), compiled (torch.compile default mode)")
    p.add_argument("--host", default=None, metavar="FILE",
                   help="host profile JSON of the CPU that drives the GPU (`dippm-nas host-profile --out FILE`); "
                        "default: a typical datacenter GPU server")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the conversion cache")
    p.add_argument("--json", action="store_true", help="print one JSON object with the Prediction's fields")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dippm_nas.predictor import predict

    spec = InputSpec(shape=parse_shape(args.shape), batch_size=args.batch, dtype=args.dtype)
    pred = predict(args.spec, spec, device=args.device, cache=not args.no_cache, runtime=args.runtime, host=args.host)
    if args.json:
        print(json.dumps(pred.to_dict()))
        return 0

    def pm(v: float | None, s: float | None, unit: str, src: str) -> str:
        if v is None:
            return f"unavailable ({src})"
        return f"{v:.4g} {unit}" + (f" ± {s:.2g}" if s is not None else "") + f"   [{src}]"

    print(f"model     {args.spec}   batch {spec.batch_size}, shape {spec.shape}, {spec.dtype}, device {pred.device}")
    print(f"latency   {pm(pred.latency_ms, pred.latency_ms_std, 'ms', pred.latency_source)}")
    threads = pred.details.get("host_threads")
    if threads:
        print(f"          with {int(threads)} torch thread(s), as the checkpoint's measurements were made")
    if pred.host_ms is not None and pred.gpu_ms is not None:
        bound = "host-bound" if pred.details.get("host_bound") else "GPU-bound"
        print(f"          {args.runtime}: host {pred.host_ms:.4g} ms, GPU {pred.gpu_ms:.4g} ms ({bound})")
    print(f"energy    {pm(pred.energy_j, pred.energy_j_std, 'J', pred.energy_source)}")
    print(f"memory    {pm(pred.memory_mib, pred.memory_mib_std, 'MiB', pred.memory_source)}")
    if pred.mig is not None:
        d = pred.mig.to_dict() if hasattr(pred.mig, "to_dict") else pred.mig
        print(f"MIG       smallest fit: {d.get('smallest_fit')}" + (f" ({d.get('reason')})" if d.get("reason") else ""))
    if pred.unknown_ops:
        print(f"flagged   ops without a formula/encoder: {pred.unknown_ops}")
    for key, text in _FLAGS.items():
        if pred.details.get(key):
            print(f"flagged   {text} (details[{key!r}] = 1)")
    return 0


#: details keys that widen σ, and what they mean to a reader of the text output
_FLAGS = {
    "outside_training_range": "graph-level features outside the checkpoint's training range: σ widened",
    "novel": "graph unlike the checkpoint's training graphs: σ widened to the novel-graph floor",
    "other_host": "host checkpoint measured on another CPU model: σ widened until calibrated on this machine",
    "other_machine": ("host checkpoint measured on another machine of this CPU model (its microbenchmark differs): "
                      "σ widened until calibrated on this machine"),
    "dtype_unseen": "a dtype the checkpoint never trained on: the analytic prior answers (σ as outside the range)",
}
