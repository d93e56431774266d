"""Peak device memory of one forward pass: liveness of activations plus PyTorch allocator rounding.

Rules (execution order = node order of the graph):

- a node's outputs are allocated when it runs and live until their last consumer has run;
- model inputs are allocated before the first node and live until their last consumer;
- model outputs live until the end;
- views (``op_class == "view"``) alias their input: no new memory, but they extend its life;
- constant-folded nodes (``is_constant``) and weights are not activations (weights are counted apart);
- at each node the live set includes its inputs and its freshly allocated outputs (both exist while
  the kernel runs);
- the graph is functional, so an op PyTorch runs in place (``ReLU(inplace=True)``, ``x += y``) is counted
  as allocating its output: an upper bound by at most one activation per such op.

Allocator (PyTorch's CUDA caching allocator, ``c10/cuda/CUDACachingAllocator.cpp``): every block is
rounded up to 512 B (``kMinBlockSize``); requests of at most 1 MiB (``kSmallSize``) come from 2 MiB
segments (``kSmallBuffer``); requests between 1 and 10 MiB (``kMinLargeAlloc``) from 20 MiB segments
(``kLargeBuffer``); larger ones are rounded up to 2 MiB (``kRoundLarge``). Segments are cached, so the
reserved memory of a pool is its peak use rounded up to whole segments, and the pools' peaks add up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dippm_nas.graph import OperatorGraph
from dippm_nas.spec import dtype_bytes

__all__ = ["MemoryBreakdown", "activation_liveness", "round_block", "KIB", "MIB"]

KIB = 1024
MIB = 1024 * 1024
K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MIB
K_SMALL_BUFFER = 2 * MIB
K_LARGE_BUFFER = 20 * MIB
K_MIN_LARGE_ALLOC = 10 * MIB
K_ROUND_LARGE = 2 * MIB


def round_block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request of ``nbytes`` (multiple of 512, 0 for 0)."""
    if nbytes <= 0:
        return 0
    return K_MIN_BLOCK * math.ceil(nbytes / K_MIN_BLOCK)


def _ceil_to(x: float, unit: int) -> float:
    return unit * math.ceil(x / unit) if x > 0 else 0.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Activation memory of a graph (bytes).

    Attributes:
        peak_allocated_bytes: peak of live activations, each block rounded to 512 B
            (what ``torch.cuda.max_memory_allocated`` would count for them).
        peak_reserved_bytes: segments the caching allocator holds for them (small, medium and large
            pools, each at its own peak rounded up to whole segments).
        peak_node: node index at which the allocated peak occurs (-1 for an empty graph).
        live_bytes: live allocated bytes while each node runs, ``[num_nodes]``.
    """

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_node: int
    live_bytes: np.ndarray


def _output_blocks(graph: OperatorGraph, i: int) -> list[int]:
    node = graph.nodes[i]
    if len(node.output_shapes) <= 1:
        return [round_block(node.bytes_written)]
    per_elem = dtype_bytes(node.output_dtype)
    sizes = [math.prod(s) * per_elem for s in node.output_shapes]
    total = sum(sizes)
    if total != node.bytes_written and total > 0:
        # dtypes of the extra outputs differ from the first; keep the node's byte count
        sizes = [int(round(node.bytes_written * s / total)) for s in sizes]
    return [round_block(s) for s in sizes]


def activation_liveness(graph: OperatorGraph) -> MemoryBreakdown:
    """Peak activation memory of ``graph`` by a liveness pass in execution order.

    Returns:
        the :class:`MemoryBreakdown`.
    """
    n = graph.num_nodes
    preds = graph.predecessors()
    # storage id per node (None: no memory of its own nor aliased)
    storage_of: list[int | None] = [None] * n
    sizes: list[list[int]] = []      # blocks of each storage
    alloc_at: list[int] = []         # node index at which it is allocated (0 for model inputs)
    last_use: list[int] = []         # last node index that uses it (n for model outputs)

    input_storage: dict[str, int] = {}
    consumers_of_input: dict[int, list[int]] = {}
    spec = graph.spec
    for t in spec.tensors:
        nbytes = math.prod((spec.batch_size, *t.shape)) * dtype_bytes(spec.tensor_dtype(t))
        sid = len(sizes)
        sizes.append([round_block(nbytes)])
        cons = graph.input_consumers.get(t.name, [])
        alloc_at.append(0)
        last_use.append(max(cons) if cons else -1)
        input_storage[t.name] = sid
        for c in cons:
            consumers_of_input.setdefault(c, []).append(sid)

    for node in graph.nodes:
        i = node.index
        if node.is_constant:
            continue
        if node.op_class == "view":
            live_preds = [p for p in preds[i] if storage_of[p] is not None]
            if live_preds:
                storage_of[i] = storage_of[live_preds[0]]
            elif consumers_of_input.get(i):
                storage_of[i] = consumers_of_input[i][0]
            continue
        sid = len(sizes)
        sizes.append(_output_blocks(graph, i))
        alloc_at.append(i)
        last_use.append(i)
        storage_of[i] = sid

    # extend lives through consumers (and through views, which alias)
    for node in graph.nodes:
        i = node.index
        for p in preds[i]:
            s = storage_of[p]
            if s is not None:
                last_use[s] = max(last_use[s], i)
        for s in consumers_of_input.get(i, []):
            last_use[s] = max(last_use[s], i)
    for o in graph.outputs:
        s = storage_of[o]
        if s is not None:
            last_use[s] = n  # outputs live until the end

    if n == 0:
        return MemoryBreakdown(0, 0, -1, np.zeros(0))
    delta = np.zeros(n + 2)
    small = np.zeros(n + 2)
    medium = np.zeros(n + 2)
    large = np.zeros(n + 2)
    for s, blocks in enumerate(sizes):
        if last_use[s] < alloc_at[s]:
            continue  # an input nobody reads
        a, e = alloc_at[s], min(last_use[s], n - 1)
        for blk in blocks:
            delta[a] += blk
            delta[e + 1] -= blk
            if blk <= K_SMALL_SIZE:
                pool = small
            elif blk < K_MIN_LARGE_ALLOC:
                pool = medium
            else:
                pool = large
                blk = _ceil_to(blk, K_ROUND_LARGE)
            pool[a] += blk
            pool[e + 1] -= blk
    live = np.cumsum(delta)[:n]
    peak_node = int(np.argmax(live))
    reserved = (_ceil_to(float(np.cumsum(small)[:n].max()), K_SMALL_BUFFER)
                + _ceil_to(float(np.cumsum(medium)[:n].max()), K_LARGE_BUFFER)
                + float(np.cumsum(large)[:n].max()))
    allocated = int(live[peak_node])
    return MemoryBreakdown(
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=int(max(reserved, allocated)),
        peak_node=peak_node,
        live_bytes=live,
    )
