"""timm models as timm's published ``benchmark-infer`` results timed them: :func:`results_form`.

The released results (``results/benchmark-infer-*.csv`` of pytorch-image-models, the timm rows of the dataset)
were timed with the timm of their day. Where a later timm changed which kernels a model runs, a graph captured
from the installed timm prices a model that was not timed. :data:`RESULTS_CHANGES` names those changes; a
``timm-results:NAME`` SPEC (:func:`dippm_nas.capture.load_model`) builds ``timm:NAME`` and undoes them, so the
graph is the one the results timed.

- **Hiera's global attention** (``hiera_*``): pytorch-image-models PR #2680 (2026-03) made
  ``MaskUnitAttention``'s global blocks call ``F.scaled_dot_product_attention`` on 4-D, contiguous q, k, v (the
  flash kernel); before it they went through the mask-unit path with one window, 5-D ``[B, heads, 1, N, D]``,
  which every fused SDPA kernel refuses, so PyTorch ran its math path (float32 from PyTorch 2.5). Undone by
  giving each global block the mask-unit path with a window of all its tokens (``window_size = N /
  q_stride``: one window), which is the same computation on the same 5-D shapes. Evidence in the released rows:
  on one RTX 4090, hiera_base_224 takes 410.6 ms at PyTorch 2.4 and 661.7 ms at 2.9.1 (hiera_small_224 279.9 ->
  449.9 ms), while the other models move by a few per cent; the prior predicts +75 ms with 4-D global blocks and
  +195 ms with the 5-D ones (docs/transformer_kernels.md).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESULTS_CHANGES", "has_results_form", "results_form"]

#: timm model-name prefixes whose kernels changed after the published results, and the change.
RESULTS_CHANGES: dict[str, str] = {
    "hiera_": "global attention on 5-D q, k, v with one mask unit (SDPA math path), as before "
              "pytorch-image-models PR #2680",
}


def has_results_form(name: str) -> bool:
    """Whether timm model ``name`` ran other kernels in the published results than the installed timm builds
    (:data:`RESULTS_CHANGES`)."""
    return isinstance(name, str) and name.startswith(tuple(RESULTS_CHANGES))


def results_form(model: Any, name: str) -> Any:
    """``model`` (``timm.create_model(name)``) with the changes of :data:`RESULTS_CHANGES` undone, in place; a
    model of no listed family is returned as is."""
    if name.startswith("hiera_"):
        _hiera_one_window(model)
    return model


def _hiera_one_window(model: Any) -> None:
    """Each global-attention ``MaskUnitAttention`` of a Hiera model runs the mask-unit path with one window of
    all its tokens (its window size set from the input's token count before each call)."""
    for mod in model.modules():
        if type(mod).__name__ != "MaskUnitAttention" or getattr(mod, "use_mask_unit_attn", True):
            continue
        mod.use_mask_unit_attn = True
        mod.register_forward_pre_hook(_one_window)


def _one_window(mod: Any, args: tuple[Any, ...]) -> None:
    """Forward pre-hook: the window of ``mod`` holds every token of its input ``[B, N, C]`` (after pooling)."""
    mod.window_size = int(args[0].shape[1]) // int(mod.q_stride)
