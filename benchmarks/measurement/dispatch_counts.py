"""What eager PyTorch really dispatches for a timm model, against what the prior's host model charges for its graph.

Usage (the vision venv: timm, random weights, nothing downloaded; CPU only)::

    PYTHONPATH=$PWD nice -n 10 /work/venv-vision/bin/python benchmarks/measurement/dispatch_counts.py \\
        [--models swin_tiny_patch4_window7_224 swinv2_tiny_window8_256 vit_small_patch16_224] [--json OUT]

Per model, one eager forward at batch 1 on the CPU is counted three ways:

- **python**: torch calls the model's Python code makes (a ``TorchFunctionMode``: ``F.linear``, ``x.view``,
  ``x.permute``, ``F.dropout``, ... each one a Python-to-C++ call; property reads such as ``x.shape`` excluded);
- **aten kernels**: aten operators below autograd that launch a kernel on a GPU (a ``TorchDispatchMode``;
  every aten call that is not a view, so a ``reshape`` of a permuted tensor counts as its ``clone``);
- **aten views**: the aten view operators (``view``, ``permute``, ``t``, ``expand``, ...), no kernel.

The prior's count is that of :func:`dippm_nas.prior.graph_facts` on the captured graph: **issued** nodes (each
charged the host model's per-operator time: active, not a bias add fused into its GEMM, not run inside another
node's kernel (a decomposed hardswish or vector norm), not a kernel launched inside another node's dispatch) and
**views** (charged the per-view time; views taken inside another operator's dispatch, a roll's slices and an
unbind's squeezes, excluded), with the analytic ``host_ms`` of :func:`dippm_nas.prior.predict` on an RTX 3090,
eager, PyTorch 2.x, on the reference host.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dippm_nas import Deployment, InputSpec  # noqa: E402
from dippm_nas.capture import capture  # noqa: E402
from dippm_nas.errors import InvalidValueError  # noqa: E402
from dippm_nas.files import write_output  # noqa: E402
from dippm_nas.prior import graph_facts, predict  # noqa: E402

DEFAULT_MODELS = ("swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "vit_small_patch16_224")

#: aten operators that return a view (no kernel on a GPU).
ATEN_VIEWS = frozenset({
    "view", "_unsafe_view", "permute", "t", "expand", "transpose", "unsqueeze", "squeeze", "unbind", "alias",
    "split", "split_with_sizes", "slice", "select", "as_strided", "detach", "_reshape_alias", "reshape", "chunk",
    "narrow", "unflatten", "flatten", "view_as", "expand_as", "contiguous",
})

#: Python-level reads that make no dispatch.
_NOT_CALLS = frozenset({"__get__", "dim", "size", "numel", "__len__", "is_contiguous"})


def eager_counts(model: Any, x: Any) -> dict[str, Any]:
    """``{"python", "aten_kernels", "aten_views", "aten_ops"}`` of one ``torch.no_grad()`` forward of ``model`` on
    ``x`` (``aten_ops``: the ten most frequent aten operators)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Aten(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter[str] = collections.Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    class _Python(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if getattr(func, "__name__", "") not in _NOT_CALLS:
                self.calls += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        with _Aten() as aten:
            model(x)
        with _Python() as py:
            model(x)
    views = sum(c for op, c in aten.ops.items() if op in ATEN_VIEWS)
    return {"python": py.calls, "aten_kernels": sum(aten.ops.values()) - views, "aten_views": views,
            "aten_ops": dict(aten.ops.most_common(10))}


def prior_counts(graph: Any) -> dict[str, Any]:
    """``{"issued", "views", "host_ms", "issued_ops"}`` the prior charges for ``graph`` (see the module docstring)."""
    f = graph_facts(graph)
    issued = f.active & ~f.fused & ~f.internal & ~f.hard_inner
    views = f.view & ~f.inner_view
    ops = collections.Counter(n.op for n, a in zip(graph.nodes, issued.tolist()) if a)
    p = predict(graph, "rtx-3090", deployment=Deployment(runtime="eager", framework="torch-2", autocast="none"), mig=False)
    return {"issued": int(issued.sum()), "views": int(views.sum()), "host_ms": round(float(p.host_ms), 3),
            "issued_ops": dict(ops.most_common(10))}


def count(name: str) -> dict[str, Any]:
    """Eager and prior counts of the timm model ``name`` (random weights) at batch 1 and its default image size."""
    import timm
    import torch

    model = timm.create_model(name, pretrained=False).eval()
    size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
    x = torch.randn(1, *size)
    rec = {"model": name, "input": list(size), "eager": eager_counts(model, x)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec["prior"] = prior_counts(capture(model, InputSpec(shape=size, batch_size=1), cache=False))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="timm model names")
    ap.add_argument("--json", type=Path, help="write the records here")
    args = ap.parse_args(argv)
    recs = []
    print(f"{'model':34s} {'python':>7s} {'aten kern':>9s} {'aten view':>9s} | {'prior issued':>12s} "
          f"{'prior views':>11s} {'host_ms':>8s}")
    for name in args.models:
        r = count(name)
        recs.append(r)
        e, p = r["eager"], r["prior"]
        print(f"{name:34s} {e['python']:7d} {e['aten_kernels']:9d} {e['aten_views']:9d} | {p['issued']:12d} "
              f"{p['views']:11d} {p['host_ms']:8.2f}", flush=True)
        print(f"    eager aten: {e['aten_ops']}\n    prior issued: {p['issued_ops']}", flush=True)
    if args.json:
        write_output(args.json, json.dumps(recs, indent=1) + "\n", "--json", error=InvalidValueError)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
