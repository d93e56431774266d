"""Eager PyTorch's bilinear and bicubic resize of an NCHW tensor on a GPU: a loop over batch and channels per pixel.

``F.interpolate(x, mode="bilinear" | "bicubic")`` (``nn.Upsample``) of a contiguous NCHW tensor runs ATen's
``upsample_bilinear2d_out_frame`` / ``upsample_bicubic2d_out_frame``: one thread per *output pixel* (``H_out x W_out``
threads, 1,024 a block), each looping over every image and channel (``N x C`` iterations) and reading its 4 (16)
input values in each. The loop's loads cannot be hoisted past the previous iteration's store (the pointers may
alias), so every iteration waits for one memory round trip; with few output pixels the kernel runs on a handful
of SMs for ``N x C`` round trips, however fast the GPU's bandwidth. ``nn.Upsample(scale_factor=2, mode="bilinear")``
of a ``[1024, 1024, 7, 7]`` tensor (EfficientFormerV2's strided attention at batch 1,024) launches 196 threads and
takes about 0.3 s on an RTX 3090/4090/5090, where the same bytes move in 0.5 ms. Nearest-neighbour resizes loop over
batch and channels across a grid dimension of their own (parallel), and a channels-last input takes the NHWC
kernel (one thread per output element): neither is priced here. The bicubic kernel is priced as the bilinear one
(its 16 loads an iteration issue together; its 512-thread blocks are counted as 1,024, which matters only for outputs
of more than ``SMs x 512`` pixels); no released timing tests it.

The graph carries the resize's method and layout (the Relax ``image.resize2d`` attributes ``method`` and
``layout``); whether the input tensor is contiguous NCHW at run time is judged from its producer: a kernel's output
(an add, a convolution) is; a view (a reshape of a transpose, as in CoaT's token-to-image reshapes) may carry
channels-last strides, and PyTorch then picks the parallel NHWC kernel, so such a resize keeps the bandwidth
pricing. A channels-last deployment (``memory_layout="nhwc"``) keeps it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["SERIAL_RESIZE_METHODS", "serial_resize_loops", "serial_loop_us"]

#: Relax ``image.resize2d`` methods whose eager CUDA kernel loops over batch and channels in each thread.
SERIAL_RESIZE_METHODS = frozenset({"linear", "cubic"})
#: Threads of one block of the serial kernels (``C10_LAUNCH_BOUNDS_1(1024)``, ``min(maxThreadsPerBlock, 1024)``).
_BLOCK_THREADS = 1024


def serial_resize_loops(nodes: Sequence[Any], preds: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per node: ``(iterations per thread, threads)`` of a resize that eager PyTorch runs as the serial kernel
    (module docstring): a 2-D bilinear or bicubic resize of a 4-D NCHW tensor written by a kernel (not a view),
    output larger than one pixel per image. ``(0, 0)`` elsewhere.

    Args:
        nodes: the graph's :class:`~dippm_nas.graph.OpNode` list; ``preds``: each node's producers
            (``preds[i]``, local indices).

    Shapes:
        both results are ``[num_nodes]`` float64.
    """
    iters, threads = np.zeros(len(nodes)), np.zeros(len(nodes))
    for i, nd in enumerate(nodes):
        if nd.op != "image.resize2d" or nd.is_constant:
            continue
        a = nd.attrs
        if a.get("method") not in SERIAL_RESIZE_METHODS or str(a.get("layout", "NCHW")) != "NCHW":
            continue
        shape = next((tuple(s) for s, par in zip(nd.input_shapes, nd.input_is_param) if not par), ())
        out = tuple(nd.output_shape)
        if len(shape) != 4 or len(out) != 4 or out[2] * out[3] <= 1 or tuple(shape) == out:
            continue  # same size: PyTorch copies the input instead
        src = [q for q in preds[i] if not nodes[q].is_constant]
        if not src or any(nodes[q].op_class == "view" for q in src):
            continue  # a view's strides may be channels-last: the NHWC kernel
        iters[i] = float(shape[0] * shape[1])
        threads[i] = float(out[2] * out[3])
    return iters, threads


def serial_loop_us(iters: np.ndarray, threads: np.ndarray, sms: int, loop_ns: float) -> np.ndarray:
    """Time of the serial resize kernels, µs: ``iters`` round trips of ``loop_ns`` each, once per wave of
    1,024-thread blocks over the GPU's ``sms`` SMs (one wave unless the output has more than ``sms x 1024``
    pixels). 0 where ``iters`` is 0.

    Shapes:
        ``iters``, ``threads``: ``[num_nodes]``; the result likewise.
    """
    blocks = np.ceil(np.maximum(threads, 1.0) / _BLOCK_THREADS)
    waves = np.ceil(blocks / max(int(sms), 1))
    return np.where(iters > 0, iters * waves * loop_ns * 1e-3, 0.0)

