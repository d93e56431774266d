"""Framework-side host time of one eager operator, by kind and by module call, and of whole-model forwards.

Usage (the vision venv: torch, torchvision, timm; random weights, nothing downloaded; CPU only)::

    PYTHONPATH=$PWD nice -n 10 /work/venv-vision/bin/python benchmarks/measurement/host_dispatch_kinds.py \\
        [--devices cpu] [--rounds 31] [--prior] [--json data/host_dispatch/dispatch_kinds.json]

On tiny CPU tensors (one thread, a few elements, so the kernel is a small part of a call), ``torch.no_grad()``,
eval mode:

- **single operators**: the median time of one call of each operator kind (conv2d, linear, matmul/bmm, add/mul,
  softmax, layer_norm, batch_norm, gelu/relu, pooling, the views reshape/permute/transpose/view, clone/contiguous,
  cat), called functionally (``F.conv2d``) and, where PyTorch has a module for it, through the module
  (``nn.Conv2d``): their difference is the module call's extra (``nn.Module.__call__``, its hooks check, the
  module's ``forward``);
- **whole models**: the median time of one forward at batch 1 with every width made tiny (:data:`_TINY`: the same
  operators, depths, windows and heads' views, tensors of a few channels and a few tokens: the CNNs at 32 x 32, ViT
  and DeiT at 32 x 32 (four patches), Swin and SwinV2 at 64 x 64 in windows of 2, whose stages have the same shifts
  as at their own size), and at twice those widths; ``2 t(x1) - t(x2)`` extrapolates to zero width, taking out the
  CPU kernels' share (timm resnet50, vit_small, deit_small, swin_tiny, swinv2_tiny, convnext_tiny, torchvision
  mobilenet_v2). That is the CPU-side proxy of each model's eager host time on a GPU (the framework work per
  operator is the same; a GPU adds the launches and the library set-up). ``--prior`` adds the prior's ``host_ms``
  of the full-width model (RTX 3090, eager, PyTorch 2.x, reference host) and its ratio to ViT-S's, to compare with
  the measured ratio, and the sum of the single-operator times over each captured graph.

The ``meta`` device (``--devices meta``) is no proxy: many meta kernels are Python shape functions
(``torch._meta_registrations``, the ``_refs`` decompositions), so an add or a layer norm costs hundreds of µs
there against a few on the CPU.

Each figure is the median over ``--rounds`` interleaved rounds of the per-call mean of a batch of calls, timed as the
calling thread's CPU time (``time.thread_time``; one intra-op thread), so time the process spends descheduled on a
shared machine is not counted. Times in µs (operators) and ms (models).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dippm_nas import Deployment, InputSpec  # noqa: E402
from dippm_nas.capture import capture  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.prior import HOST_KINDS, graph_facts, predict  # noqa: E402

DEFAULT_MODELS = ("resnet50", "mobilenet_v2", "vit_small_patch16_224", "deit_small_patch16_224",
                  "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "convnext_tiny")
_TORCHVISION = ("mobilenet_v2",)


def _ops(device: str) -> list[tuple[str, str, str, Callable[[], Any]]]:
    """``(name, kind, call, fn)``: each operator as one zero-argument call; ``call`` is ``"functional"``,
    ``"module"`` or ``"method"`` (a tensor method: views, clone)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    d = torch.device(device)
    x4 = torch.randn(1, 4, 4, 4, device=d)
    x3 = torch.randn(1, 8, 16, device=d)
    xp = x3.permute(0, 2, 1)
    w4 = torch.randn(4, 4, 3, 3, device=d)
    lin = nn.Linear(16, 16).to(d).eval()
    conv = nn.Conv2d(4, 4, 3, padding=1).to(d).eval()
    ln = nn.LayerNorm(16).to(d).eval()
    bn = nn.BatchNorm2d(4).to(d).eval()
    gelu, relu, sm = nn.GELU(), nn.ReLU(inplace=False), nn.Softmax(dim=-1)
    pool = nn.MaxPool2d(2)
    a, b = torch.randn(2, 8, 16, device=d), torch.randn(2, 16, 8, device=d)
    q = torch.randn(1, 2, 8, 4, device=d)
    return [
        ("conv2d", "conv", "functional", lambda: F.conv2d(x4, w4, conv.bias, padding=1)),
        ("conv2d", "conv", "module", lambda: conv(x4)),
        ("linear", "matmul", "functional", lambda: F.linear(x3, lin.weight, lin.bias)),
        ("linear", "matmul", "module", lambda: lin(x3)),
        ("matmul", "matmul", "functional", lambda: a @ b),
        ("bmm", "matmul", "functional", lambda: torch.bmm(a, b)),
        ("sdpa", "attention", "functional", lambda: F.scaled_dot_product_attention(q, q, q)),
        ("add", "elementwise", "functional", lambda: x3 + x3),
        ("mul", "elementwise", "functional", lambda: x3 * 0.5),
        ("gelu", "elementwise", "functional", lambda: F.gelu(x3)),
        ("gelu", "elementwise", "module", lambda: gelu(x3)),
        ("relu", "elementwise", "functional", lambda: F.relu(x4)),
        ("relu", "elementwise", "module", lambda: relu(x4)),
        ("softmax", "reduction", "functional", lambda: x3.softmax(-1)),
        ("softmax", "reduction", "module", lambda: sm(x3)),
        ("layer_norm", "normalization", "functional", lambda: F.layer_norm(x3, (16,), ln.weight, ln.bias)),
        ("layer_norm", "normalization", "module", lambda: ln(x3)),
        ("batch_norm", "normalization", "functional",
         lambda: F.batch_norm(x4, bn.running_mean, bn.running_var, bn.weight, bn.bias, False)),
        ("batch_norm", "normalization", "module", lambda: bn(x4)),
        ("max_pool2d", "pool", "functional", lambda: F.max_pool2d(x4, 2)),
        ("max_pool2d", "pool", "module", lambda: pool(x4)),
        ("mean", "reduction", "functional", lambda: x3.mean(-1)),
        ("reshape", "view", "method", lambda: x3.reshape(1, 2, 4, 16)),
        ("view", "view", "method", lambda: x3.view(8, 16)),
        ("permute", "view", "method", lambda: x3.permute(0, 2, 1)),
        ("transpose", "view", "method", lambda: x3.transpose(1, 2)),
        ("clone", "memory", "method", lambda: x3.clone()),
        ("contiguous", "memory", "method", lambda: xp.contiguous()),
        ("cat", "memory", "functional", lambda: torch.cat([x3, x3], -1)),
    ]


def _time_calls(fn: Callable[[], Any], calls: int) -> float:
    """Mean time of one call over ``calls`` calls, µs."""
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls * 1e6


def measure_ops(device: str, rounds: int, calls: int) -> list[dict[str, Any]]:
    """Median per-call time of every operator of :func:`_ops` on ``device``, µs (interleaved rounds)."""
    import torch

    ops = _ops(device)
    samples: list[list[float]] = [[] for _ in ops]
    with torch.no_grad():
        for _, _, _, fn in ops:
            _time_calls(fn, 20)  # warm-up
        for _ in range(rounds):
            for i, (_, _, _, fn) in enumerate(ops):
                samples[i].append(_time_calls(fn, calls))
    return [{"op": n, "kind": k, "call": c, "us": round(statistics.median(s), 3),
             "us_min": round(min(s), 3)} for (n, k, c, _), s in zip(ops, samples)]


#: Width arguments (at width multiple ``m``) that keep each model's operators (depths, heads' count of views, windows,
#: image size) but make its tensors tiny, so a CPU forward is mostly framework time.
_TINY: dict[str, Callable[[int], dict[str, Any]]] = {
    "resnet50": lambda m: {"channels": (8 * m, 16 * m, 32 * m, 64 * m), "stem_width": 8 * m},
    "vit_small_patch16_224": lambda m: {"embed_dim": 12 * m, "img_size": 32},
    "deit_small_patch16_224": lambda m: {"embed_dim": 12 * m, "img_size": 32},
    # stage resolutions 16, 8, 4, 2 in windows of 2: the last stage one window without a shift, as at 224 / 7
    "swin_tiny_patch4_window7_224": lambda m: {"embed_dim": 8 * m, "num_heads": (1, 2, 4, 8), "img_size": 64,
                                               "window_size": 2},
    "swinv2_tiny_window8_256": lambda m: {"embed_dim": 8 * m, "num_heads": (1, 2, 4, 8), "img_size": 64,
                                          "window_size": 2},
    "convnext_tiny": lambda m: {"dims": (8 * m, 16 * m, 32 * m, 64 * m)},
    "mobilenet_v2": lambda m: {"width_mult": 0.1 * m},
}

#: Convolutional models whose operators do not depend on the image size: their tiny forward runs at 32 x 32.
_ANY_SIZE = ("resnet50", "mobilenet_v2", "convnext_tiny")


def _build(name: str, device: str, width: int | None) -> tuple[Any, Any]:
    """The model (random weights, eval) and a batch-1 input; ``width``: the tiny widths of :data:`_TINY` times
    ``width`` (and their image size), ``None``: the real model at its default image size."""
    import torch

    kw = _TINY[name](width) if width is not None and name in _TINY else {}
    with torch.device(device):
        if name in _TORCHVISION:
            import torchvision
            model = getattr(torchvision.models, name)(weights=None, num_classes=10, **kw).eval()
            size: tuple[int, ...] = (3, 224, 224)
        else:
            import timm
            model = timm.create_model(name, pretrained=False, num_classes=10, **kw).eval()
            size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        if width is not None and name in _ANY_SIZE:
            size = (3, 32, 32)
        elif "img_size" in kw:
            size = (3, kw["img_size"], kw["img_size"])
        x = torch.randn(1, *size)
    return model, x


def measure_models(names: list[str], device: str, rounds: int) -> list[dict[str, Any]]:
    """Median time of one ``torch.no_grad()`` forward at batch 1 of each model on ``device`` at the tiny widths
    (``ms_x1``) and twice them (``ms_x2``), interleaved, ms; ``ms``: their extrapolation to zero width,
    ``2 ms_x1 - ms_x2`` (the CPU kernels' share, which grows with the width, taken out)."""
    import torch

    built = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in names:
            built += [_build(n, device, 1), _build(n, device, 2)]
    samples: list[list[float]] = [[] for _ in built]
    with torch.no_grad():
        for m, x in built:
            m(x)
        for _ in range(rounds):
            for i, (m, x) in enumerate(built):
                t0 = time.thread_time()
                m(x)
                samples[i].append((time.thread_time() - t0) * 1e3)
    med = [statistics.median(s) for s in samples]
    return [{"model": n, "ms": round(2 * med[2 * i] - med[2 * i + 1], 4), "ms_x1": round(med[2 * i], 4),
             "ms_x2": round(med[2 * i + 1], 4)} for i, n in enumerate(names)]


def prior_host_ms(names: list[str], kinds: dict[str, dict[str, float]] | None = None,
                  forward_ms: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The prior's ``host_ms`` of each full-width model at batch 1 (RTX 3090, eager, PyTorch 2.x, reference host),
    with its ratio to ``vit_small_patch16_224``'s where that model is among ``names``; with ``kinds``
    (:func:`kind_figures`), also the sum of the measured single-operator times over the captured graph's issued
    nodes (a module call's extra where it is one) and views (``single_op_ms``, CPU ms), and with ``forward_ms`` (the
    measured tiny forwards) its share of the measured forward."""
    recs = []
    for n in names:
        model, x = _build(n, "cpu", None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = capture(model, InputSpec(shape=tuple(x.shape[1:]), batch_size=1), cache=False)
        p = predict(g, "rtx-3090", deployment=Deployment(runtime="eager", framework="torch-2", autocast="none"), mig=False)
        rec: dict[str, Any] = {"model": n, "host_ms": round(float(p.host_ms), 3)}
        if kinds is not None:
            rec["single_op_ms"] = round(single_op_ms(g, kinds), 3)
            if forward_ms and n in forward_ms:
                rec["single_op_share_of_forward"] = round(rec["single_op_ms"] / forward_ms[n], 3)
        recs.append(rec)
    ref = {r["model"]: r["host_ms"] for r in recs}.get("vit_small_patch16_224")
    print("prior host_ms (full width, rtx-3090, eager, torch-2, reference host); ratio to vit_small_patch16_224"
          + ("; sum of the single-operator CPU times over the graph, ms, and its share of the measured forward"
             if kinds is not None else ""))
    for r in recs:
        r["ratio_to_vit_small"] = round(r["host_ms"] / ref, 3) if ref else None
        more = (f"  single-op sum {r['single_op_ms']:6.3f} ms ({r.get('single_op_share_of_forward', float('nan')):.2f}"
                " of the forward)" if "single_op_ms" in r else "")
        print(f"  {r['model']:32s} {r['host_ms']:8.2f}  x{r['ratio_to_vit_small'] or float('nan'):.2f}{more}")
    return recs


def single_op_ms(graph: Any, kinds: dict[str, dict[str, float]]) -> float:
    """Sum of the measured per-kind times (:func:`kind_figures`) over ``graph``'s issued nodes, plus a module call's
    extra at each node eager issues through a module, plus the view time at each view, ms."""
    f = graph_facts(graph)
    issued = f.active & ~f.fused & ~f.internal & ~f.hard_inner
    views = f.view & ~f.inner_view
    op = np.array([kinds["measured_op_us"][k] for k in HOST_KINDS])
    mod = np.array([kinds["measured_module_us"].get(k, 0.0) for k in HOST_KINDS])
    us = (op[f.host_kind] + np.where(f.module_call, mod[f.host_kind], 0.0)) * issued + op[f.host_kind] * views
    return float(us.sum()) / 1e3


def kind_figures(ops: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{"measured_op_us", "measured_module_us"}`` per host kind (:data:`dippm_nas.prior.HOST_KINDS`): a kind's
    functional time is the median of its operators' (``other``: of every operator but views), its module-call
    extra the median of its operators' module-minus-functional times (negative ones read 0)."""
    extra = module_extra(ops)
    kind_of = {r["op"]: r["kind"] for r in ops}
    op_us: dict[str, float] = {}
    for k in HOST_KINDS:
        us = [r["us"] for r in ops if r["call"] != "module" and (r["kind"] == k or (k == "other" and r["kind"] != "view"))]
        if not us:
            raise InvalidValueError(f"no operator of host kind {k!r} was measured")
        op_us[k] = round(float(statistics.median(us)), 3)
    module_us = {k: round(max(float(statistics.median([v for o, v in extra.items() if kind_of[o] == k])), 0.0), 3)
                 for k in HOST_KINDS if any(kind_of[o] == k for o in extra)}
    return {"measured_op_us": op_us, "measured_module_us": module_us}


def module_extra(ops: list[dict[str, Any]]) -> dict[str, float]:
    """Per operator with a module form: module-call time minus functional time, µs."""
    f = {r["op"]: r["us"] for r in ops if r["call"] == "functional"}
    return {r["op"]: round(r["us"] - f[r["op"]], 3) for r in ops if r["call"] == "module" and r["op"] in f}


def cpu_model_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (else what :mod:`platform` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", nargs="+", default=["cpu"], choices=["meta", "cpu"])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--rounds", type=int, default=31, help="interleaved rounds (the median is reported)")
    ap.add_argument("--calls", type=int, default=200, help="calls per operator per round")
    ap.add_argument("--model-rounds", type=int, default=101, help="forwards per model")
    ap.add_argument("--prior", action="store_true", help="also the prior's host_ms of each full-width model")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.model_rounds < 1:
        raise InvalidValueError(f"--rounds, --calls and --model-rounds must be >= 1, got {args.rounds}, "
                                f"{args.calls}, {args.model_rounds}")
    import torch

    torch.set_num_threads(1)
    out: dict[str, Any] = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
                           "torch": torch.__version__, "python": platform.python_version(),
                           "cpu": cpu_model_name(), "threads": 1, "devices": {}}
    for dev in args.devices:
        ops = measure_ops(dev, args.rounds, args.calls)
        print(f"\n[{dev}] operator host time, µs (median of {args.rounds} rounds x {args.calls} calls)")
        for r in ops:
            print(f"  {r['op']:12s} {r['kind']:13s} {r['call']:10s} {r['us']:8.2f}  (min {r['us_min']:.2f})")
        extra = module_extra(ops)
        print(f"[{dev}] module call minus functional, µs: {extra}")
        models = measure_models(args.models, dev, args.model_rounds)
        ref = {m["model"]: m["ms"] for m in models}
        print(f"[{dev}] forward at batch 1, ms (median of {args.model_rounds}) at the tiny widths, twice them, and "
              "extrapolated to zero width; its ratio to vit_small_patch16_224")
        for m in models:
            ratio = m["ms"] / ref["vit_small_patch16_224"] if "vit_small_patch16_224" in ref else float("nan")
            print(f"  {m['model']:32s} {m['ms_x1']:9.3f} {m['ms_x2']:9.3f} {m['ms']:9.3f}  x{ratio:.2f}")
        kinds = kind_figures(ops)
        print(f"[{dev}] per host kind, µs: {kinds}")
        out["devices"][dev] = {"ops": ops, "module_extra_us": extra, "kinds": kinds, "models": models}
        sys.stdout.flush()
    if args.prior:
        cpu = out["devices"].get("cpu")
        out["prior"] = prior_host_ms(args.models, cpu["kinds"] if cpu else None,
                                     {m["model"]: m["ms"] for m in cpu["models"]} if cpu else None)
    if args.json:
        write_output(args.json, json.dumps(out, indent=1) + "\n", "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
