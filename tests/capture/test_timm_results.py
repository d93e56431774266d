"""timm-results:NAME: timm models as timm's published benchmark results timed them (Hiera's global attention on 5-D
q, k, v with one mask unit, as before pytorch-image-models PR #2680)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from dippm_nas.capture import RESULTS_CHANGES, has_results_form, load_model
from dippm_nas.capture._timm_results import results_form


class MaskUnitAttention(nn.Module):  # the name and attributes of timm.models.hiera's module
    def __init__(self, use_mask_unit_attn: bool, q_stride: int, window_size: int) -> None:
        super().__init__()
        self.use_mask_unit_attn, self.q_stride, self.window_size = use_mask_unit_attn, q_stride, window_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_only_listed_families_have_a_results_form() -> None:
    assert "hiera_" in RESULTS_CHANGES
    assert has_results_form("hiera_base_224") and has_results_form("hiera_small_abswin_256")
    assert not has_results_form("vit_base_patch16_224") and not has_results_form("twins_svt_base")


def test_global_attention_runs_one_mask_unit_of_all_its_tokens() -> None:
    model = nn.Sequential(MaskUnitAttention(True, 4, 16), MaskUnitAttention(False, 4, 0),
                          MaskUnitAttention(False, 1, 0))
    assert results_form(model, "hiera_tiny_224") is model
    windowed, pooled, plain = model
    assert windowed.use_mask_unit_attn and pooled.use_mask_unit_attn and plain.use_mask_unit_attn
    model(torch.zeros(2, 196, 8))
    assert windowed.window_size == 16  # a mask-unit block keeps its windows
    assert pooled.window_size == 49 and plain.window_size == 196  # N // (q_stride * window_size) == 1
    other = nn.Sequential(MaskUnitAttention(False, 1, 0))
    results_form(other, "vit_base_patch16_224")
    assert not other[0].use_mask_unit_attn


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm (the vision extra)")
def test_timm_results_spec_builds_hiera_with_one_window_global_blocks() -> None:
    model = load_model("timm-results:hiera_tiny_224")
    blocks = [m for m in model.modules() if type(m).__name__ == "MaskUnitAttention"]
    assert blocks and all(m.use_mask_unit_attn for m in blocks)
    built = load_model("timm:hiera_tiny_224")
    globals_ = [m for m in built.modules() if type(m).__name__ == "MaskUnitAttention" and not m.use_mask_unit_attn]
    assert globals_  # the installed timm builds some global blocks, which the results form turns into one window
    built.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model(x), built(x), atol=1e-4)  # the same computation on other shapes
    assert all(m.window_size > 0 for m in blocks)
