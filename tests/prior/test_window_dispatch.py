"""Host dispatches of a window-attention block (Swin's): the prior charges eager PyTorch's calls, not the frontend's
decomposition of them (``benchmarks/measurement/dispatch_counts.py`` compares whole timm models)."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tvm")

from dippm_nas import InputSpec  # noqa: E402
from dippm_nas.capture import capture  # noqa: E402
from dippm_nas.prior import estimate, graph_facts  # noqa: E402


class _WindowAttention(torch.nn.Module):
    """Swin's window partition, qkv projection, ``unbind``, scaled scores with a bias, softmax and window reverse."""

    def __init__(self, dim: int = 16, heads: int = 2, window: int = 4) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.bias = torch.nn.Parameter(torch.zeros(heads, window * window, window * window))

    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        b, h, w, c = x.shape
        ws = self.window
        x = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, ws * ws, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * 0.5) @ k.transpose(-2, -1) + self.bias
        y = (attn.softmax(-1) @ v).transpose(1, 2).reshape(n, ws * ws, c)
        y = self.proj(y).view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        return y


def _eager_aten_ops(model: "torch.nn.Module", x: "torch.Tensor") -> collections.Counter:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Count() as c:
        model(x)
    return c.ops


def test_an_unbind_is_one_dispatch_and_its_squeezes_cost_no_host_time() -> None:
    model = _WindowAttention().eval()
    ops = _eager_aten_ops(model, torch.randn(1, 8, 8, 16))
    assert ops["unbind"] == 1 and ops["squeeze"] == 0          # eager: one unbind call, no squeeze
    g = capture(model, InputSpec(shape=(8, 8, 16), batch_size=1), cache=False)
    f = graph_facts(g)
    squeezes = [i for i, n in enumerate(g.nodes) if n.op == "squeeze"]
    splits = [i for i, n in enumerate(g.nodes) if n.op == "split"]
    assert len(splits) == 1 and len(squeezes) == 3             # the frontend's unbind: a split and three squeezes
    assert f.inner_view[squeezes].all() and not f.inner_view[splits].any()
    host_us = estimate(g, "rtx-3090").node_host_ms * 1e3
    assert (host_us[squeezes] == 0).all() and host_us[splits[0]] > 0
    # the prior charges no more kernel-launching operators than eager dispatches kernels
    issued = int((f.active & ~f.fused & ~f.internal).sum())
    views = {"view", "_unsafe_view", "permute", "t", "expand", "transpose", "unsqueeze", "squeeze", "unbind", "alias",
             "_reshape_alias", "slice", "select", "split"}
    assert issued <= sum(c for op, c in ops.items() if op not in views)


class _CosineScores(torch.nn.Module):
    """SwinV2's cosine attention scores: ``F.normalize(q) @ F.normalize(k).T``."""

    def forward(self, q: "torch.Tensor") -> "torch.Tensor":
        f = torch.nn.functional
        return f.normalize(q, dim=-1) @ f.normalize(q * 2.0, dim=-1).transpose(-2, -1)


def test_a_vector_norm_is_one_kernel_and_one_dispatch() -> None:
    model = _CosineScores().eval()
    ops = _eager_aten_ops(model, torch.randn(1, 4, 16, 8))
    assert ops["linalg_vector_norm"] == 2 and ops["abs"] == 0 and ops["pow"] == 0
    g = capture(model, InputSpec(shape=(4, 16, 8), batch_size=1), cache=False)
    f = graph_facts(g)
    names = [n.op for n in g.nodes]
    inner = [names[i] for i in range(len(names)) if f.hard_inner[i]]
    assert sorted(inner) == ["abs", "abs", "power", "power", "power", "power"]  # the sums stay: one kernel per norm
    e = estimate(g, "rtx-3090")
    inner_idx = [i for i in range(len(names)) if f.hard_inner[i]]
    assert (e.node_host_ms[inner_idx] == 0).all() and (e.node_time_ms[inner_idx] == 0).all()
    sums = [i for i, n in enumerate(names) if n == "sum"]
    assert (e.node_host_ms[sums] > 0).all() and (e.node_time_ms[sums] > 0).all()
