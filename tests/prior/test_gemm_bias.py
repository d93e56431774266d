"""A linear layer's bias add runs in its GEMM's epilogue on a GPU (cuBLASLt via ``addmm``), a convolution's bias
and a bias after a GEMM of a permuted (non-contiguous) input are kernels of their own."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import dippm_nas  # noqa: E402
from dippm_nas.prior import estimate  # noqa: E402
from dippm_nas.spec import InputSpec  # noqa: E402

GPU = "rtx-4090"


class _Linear(torch.nn.Module):
    def __init__(self, permuted: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 256)
        self.permuted = permuted

    def forward(self, x: Any) -> Any:
        return torch.relu(self.fc(x.transpose(1, 2) if self.permuted else x))


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x: Any) -> Any:
        return torch.relu(self.conv(x))


def _bias_adds(graph: Any) -> list[int]:
    return [nd.index for nd in graph.nodes if nd.op == "add" and any(nd.input_is_param)]


def _capture(model: Any, shape: tuple[int, ...], batch: int) -> Any:
    return dippm_nas.capture(model.eval(), InputSpec(shape=shape, batch_size=batch, dtype="float32"), cache=False)


def test_a_linear_bias_on_a_contiguous_input_costs_no_kernel_on_a_gpu() -> None:
    g = _capture(_Linear(permuted=False), (128, 64), 64)
    (add,) = _bias_adds(g)
    e = estimate(g, GPU)
    assert e.node_time_ms[add] == 0.0 and e.node_host_ms[add] == 0.0
    assert e.node_time_ms[g.nodes[add].index - 1] > 0  # the GEMM itself is priced
    cpu = estimate(g, "host-cpu")
    assert cpu.node_time_ms[add] > 0  # a CPU's linear adds its bias in a pass of its own


def test_a_bias_after_a_permuted_input_or_a_convolution_is_a_kernel() -> None:
    g = _capture(_Linear(permuted=True), (64, 128), 64)
    (add,) = _bias_adds(g)
    assert estimate(g, GPU).node_time_ms[add] > 0
    c = _capture(_Conv(), (64, 32, 32), 16)
    (cadd,) = _bias_adds(c)
    assert estimate(c, GPU).node_time_ms[cadd] > 0


def test_under_pytorch_1_the_bias_is_a_kernel_and_stacked_estimates_agree() -> None:
    from dippm_nas import Deployment
    from dippm_nas.prior import estimate_many

    g = _capture(_Linear(permuted=False), (128, 64), 64)
    (add,) = _bias_adds(g)
    old = estimate(g, GPU, deployment=Deployment(framework="torch-1"))
    new = estimate(g, GPU, deployment=Deployment(framework="torch-2"))
    assert old.node_time_ms[add] > 0 and new.node_time_ms[add] == 0.0
    for dep, one in ((Deployment(framework="torch-1"), old), (Deployment(framework="torch-2"), new)):
        (many,) = estimate_many([g], GPU, deployment=dep)
        assert many.latency_ms == pytest.approx(one.latency_ms, rel=1e-9)
