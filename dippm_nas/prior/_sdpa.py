"""Which kernel eager PyTorch runs for a captured attention node, and what that kernel costs beyond its FLOPs.

A graph's ``nn.attention`` / ``nn.attention_bias`` node is a call of ``F.scaled_dot_product_attention`` (SDPA),
which exists from PyTorch 2.0 on, so its kernel is what PyTorch 2.x's SDPA dispatcher picks
(``torch/backends/cuda`` and ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, PyTorch 2.0-2.5):

- **flash** (FlashAttention-2 since 2.2): float16 / bfloat16 inputs, head dim a multiple of 8 and at most 256,
  no arbitrary mask, on sm80 and newer (Ampere, Ada, Hopper, Blackwell);
- **memory-efficient** (xformers' CUTLASS kernel): any floating dtype but float64, sm50 and newer (so every
  catalogued Pascal, Volta and Turing GPU), an additive mask allowed (PyTorch >= 2.1), e.g. timm Swin's relative
  position bias;
- **math**: everything else (float64, half precision with a head dim not a multiple of 8). The math path is the
  composite ``softmax(q @ k^T * scale) @ v``: it writes the ``B x N x S_q x S_k`` score matrix, and under autocast
  runs the softmax in float32 (``softmax`` is on autocast's float32 list), so the scores are cast up and back.

Flash and memory-efficient kernels skip the key blocks above the diagonal of a causal mask, so a causal node does
about half the score work: ``(1 + block / S_k) / 2`` of it with ``block`` = :data:`CAUSAL_BLOCK` keys per block.
A model that writes attention out by hand (``q @ k.transpose(-2, -1)``, ``softmax``, ``@ v``) is captured as those
matmul and softmax nodes and priced as such: its score traffic is in the graph.

``nn.MultiheadAttention`` calls SDPA from its Python path when ``need_weights=False`` (PyTorch >= 2.0) and the
explicit ``bmm`` / ``softmax`` path when weights are returned; its inference fast path
(``torch._native_multi_head_attention``, eval mode without grad) also calls SDPA. Both are captured as the ops they
run, so no rule is needed here.

The efficiencies of the flash and memory-efficient kernels are fitted (``scripts/fit/fit_transformer_kernels.py``);
the math path uses the attention class's constants with the score traffic added. The FlashAttention-2 kernel
PyTorch ships issues Ampere ``mma.sync`` instructions, not Hopper's ``wgmma``, so on Hopper it reaches a smaller
share of the dense peak (FlashAttention-3 paper, Shah et al. 2024: FA2 at 35 % of an H100's peak against about
70 % of an A100's): :data:`MMA_SYNC_SHARE`. Blackwell is left at 1: the GeForce boards (sm120) have no ``wgmma``
either, so their peak is an ``mma.sync`` peak, and no released B200 attention timing says what FA2 reaches there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SDPA_BACKENDS", "CAUSAL_BLOCK", "MMA_SYNC_SHARE", "FLASH_ARCHITECTURES", "AttentionShape",
           "attention_shape", "sdpa_backend_codes", "mma_share", "math_path_score_bytes"]

#: Backends of PyTorch 2.x SDPA, by the codes :func:`sdpa_backend_codes` returns.
SDPA_BACKENDS: tuple[str, ...] = ("none", "flash", "efficient", "math")
#: Keys per block a fused causal kernel skips or computes whole (FlashAttention-2 forward: 128 on sm80 for head
#: dim <= 64, 64 to 128 above; the CUTLASS memory-efficient kernel: 64 or 128).
CAUSAL_BLOCK = 128
#: Share of the dense tensor peak the ``mma.sync`` instructions of PyTorch's FlashAttention-2 reach on Hopper
#: against Ampere (FlashAttention-3 paper: FA2 35 % utilisation on H100 vs ~70 % on A100).
MMA_SYNC_SHARE = 0.5
#: Architectures whose GPUs run PyTorch's flash kernel (sm80 and newer).
FLASH_ARCHITECTURES = frozenset({"ampere", "ada", "hopper", "blackwell"})
_WGMMA_ARCHITECTURES = frozenset({"hopper"})


@dataclass(frozen=True)
class AttentionShape:
    """Per node of a graph, what the SDPA rules read (0 / False on every other node).

    Shapes:
        every array is ``[num_nodes]``.

    Attributes:
        attention: the node is an SDPA call (``nn.attention`` or ``nn.attention_bias``).
        masked: it takes an additive mask (``nn.attention_bias``): no flash kernel.
        head_dim: the query/key head dim.
        work_fraction: the share of the score matrix a fused kernel computes (1, or about 1/2 when causal).
        scores: ``B x N x S_q x S_k`` score elements.
    """

    attention: np.ndarray
    masked: np.ndarray
    head_dim: np.ndarray
    work_fraction: np.ndarray
    scores: np.ndarray


def attention_shape(nodes: list) -> AttentionShape:
    """The :class:`AttentionShape` of ``nodes`` (a graph's :class:`~dippm_nas.graph.OpNode` list)."""
    n = len(nodes)
    att, masked = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    head, frac, scores = np.zeros(n), np.ones(n), np.zeros(n)
    for i, nd in enumerate(nodes):
        if not nd.op.startswith("nn.attention") or len(nd.input_shapes) < 3 or len(nd.input_shapes[0]) != 4:
            continue
        b, sq, heads, h = nd.input_shapes[0]
        sk = nd.input_shapes[1][1]
        att[i], masked[i], head[i] = True, nd.op == "nn.attention_bias", float(h)
        scores[i] = float(b) * heads * sq * sk
        if nd.attrs.get("causal_mask") not in (None, ""):
            frac[i] = 0.5 * (1.0 + min(1.0, CAUSAL_BLOCK / max(float(sk), 1.0)))
    return AttentionShape(att, masked, head, frac, scores)


def sdpa_backend_codes(shape: AttentionShape, architecture: str, dt: np.ndarray) -> np.ndarray:
    """Per node, the index into :data:`SDPA_BACKENDS` of the kernel PyTorch 2.x runs (0 on non-attention nodes).

    Args:
        shape: the graph's :class:`AttentionShape`.
        architecture: the GPU's architecture (``Device.architecture``).
        dt: each node's run-time dtype code (0 float32, 1 float16, 2 bfloat16, 3 float64).
    """
    half = (dt == 1) | (dt == 2)
    aligned = np.mod(shape.head_dim, 8) == 0
    flash = (shape.attention & half & aligned & (shape.head_dim <= 256) & ~shape.masked
             & (architecture in FLASH_ARCHITECTURES))
    efficient = shape.attention & ~flash & (dt >= 0) & (dt <= 2) & (aligned | ~half)
    out = np.where(shape.attention, 3, 0)
    out = np.where(efficient, 2, out)
    return np.where(flash, 1, out)


def mma_share(architecture: str) -> float:
    """:data:`MMA_SYNC_SHARE` on Hopper, 1 elsewhere (the flash kernel's share of the dense peak)."""
    return MMA_SYNC_SHARE if architecture in _WGMMA_ARCHITECTURES else 1.0


def math_path_score_bytes(scores: np.ndarray, width: np.ndarray, autocast: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes, kernels)`` the math path adds per node beyond q, k, v and the output: the score matrix written by
    ``q @ k^T``, read and written by the scale and the softmax, read by ``@ v``; under autocast the softmax runs
    in float32, so a cast up before it and a cast down after it (each reading one width and writing the other).
    ``width`` is the node's run-time element size in bytes."""
    base = scores * width * 6.0  # written by q@k^T, scale read+write, softmax read+write, read by @v
    kernels = np.full(scores.shape, 3.0)  # scale, softmax, the second bmm (the first is the node's own kernel)
    if autocast:
        # softmax in float32: cast up (w + 4), softmax at 4 bytes instead of w (2 * (4 - w)), cast down (4 + w)
        base = base + scores * ((width + 4.0) + 2.0 * (4.0 - width) + (4.0 + width))
        kernels = kernels + 2.0
    return base, kernels
