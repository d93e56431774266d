"""The layout rules of the eager liveness (graphs with provenance): a ``reshape`` of a tensor whose strides
allow no view is a copy, and so is a batched ``matmul`` operand that cannot be folded; PyTorch's own
``Tensor.view`` decides which, and the reference tracker agrees on a window partition."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dippm_nas import InputSpec, capture  # noqa: E402
from dippm_nas.measure import reference_activation_peak  # noqa: E402
from dippm_nas.prior import activation_liveness  # noqa: E402
from dippm_nas.prior._layout_rules import view_strides  # noqa: E402


@pytest.mark.parametrize("shape,perm,new", [
    ((8, 8, 7, 8, 7, 96), (0, 1, 3, 2, 4, 5), (512, 7, 7, 96)),
    ((2, 3, 4), (0, 2, 1), (2, 12)),
    ((2, 3, 4), (0, 1, 2), (6, 4)),
    ((5, 3, 4), (1, 0, 2), (15, 4)),
    ((5, 1, 4), (1, 0, 2), (5, 4)),
    ((4, 6), (1, 0), (2, 3, 4)),
    ((2, 3, 1, 4), (0, 2, 1, 3), (2, 1, 12)),
])
def test_view_strides_is_pytorchs_view(shape: tuple, perm: tuple, new: tuple) -> None:
    t = torch.empty(shape).permute(perm)
    try:
        expected = tuple(t.view(new).stride())
    except RuntimeError:  # no view: reshape copies
        expected = None
    assert view_strides(tuple(t.shape), tuple(t.stride()), new) == expected


class _Windows(nn.Module):
    """Swin's window partition before a linear layer: ``view`` / ``permute`` / ``reshape`` copies."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        y = x * 2.0
        win = y.view(b, h // 4, 4, w // 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, c)
        return self.fc(win)


def test_a_reshape_that_cannot_view_is_a_copy_as_in_eager() -> None:
    spec = InputSpec(shape=(8, 8, 16), batch_size=4)
    model = _Windows()
    ref = reference_activation_peak(model, spec)
    g = capture(model, spec)
    got = activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
    t = 4 * 8 * 8 * 16 * 4
    # eager at the linear layer: ``y``, its windowed copy and the linear's output
    assert ref.peak_block_bytes == 3 * t
    assert got == ref.peak_block_bytes
