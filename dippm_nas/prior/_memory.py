"""Peak device memory of one forward pass: activation liveness, the PyTorch allocator, the memory parts.

Liveness (execution order = node order of the graph):

- a node's outputs are allocated when it runs and live until their last consumer has run;
- model inputs are allocated before the first node and live until their last consumer (with
  ``include_inputs=False`` they are left out: the caller holds them for the whole pass, a part of its own);
- model outputs live until the end;
- views (``op_class == "view"``) alias their input: no new memory, but they extend its life;
- constant-folded nodes (``is_constant``) and weights are not activations (weights are counted apart);
- at each node the live set includes its inputs and its freshly allocated outputs (both exist while
  the kernel runs);
- the graph is functional, so an op PyTorch runs in place (``ReLU(inplace=True)``, ``x += y``) is counted
  as allocating its output: an upper bound by at most one activation per such op.

Eager retention (``retention=True``, what the GPU prior uses). In eager PyTorch a tensor also lives while a
Python frame holds it: a module's input until the module returns (``x = self.layer1(x)`` keeps the stage
input during the whole stage; ``nn.Sequential`` keeps the current block's input during the block). The
graph has no module boundaries, so two structural rules stand in for them, over the graph's *cut*
tensors (after a cut node, its output is the only activation alive that later nodes read: a block
boundary):

- stage input: in a run of equal-sized cut tensors, the cut before the first residual block (the input of a
  ResNet stage, of a ViT's blocks) stays alive until the run's last cut;
- block input: a cut tensor read by a residual join stays alive until the next cut tensor a residual join
  reads in the same run of equal-sized cuts, the next block's input (else until the cut after the join) (a pre-norm transformer block holds its input through both of its
  residual branches; a ConvMixer block through its pointwise half).

:func:`dippm_nas.measure.reference_activation_peak` gives the exact eager figure without a GPU;
``benchmarks/accuracy_memory_liveness.py`` prints how well these rules agree with it per family.

Allocator (PyTorch's CUDA caching allocator, ``c10/cuda/CUDACachingAllocator.cpp``): every block is
rounded up to 512 B (``kMinBlockSize``); requests of at most 1 MiB (``kSmallSize``) come from 2 MiB
segments (``kSmallBuffer``); requests between 1 and 10 MiB (``kMinLargeAlloc``) from 20 MiB segments
(``kLargeBuffer``); larger ones are rounded up to 2 MiB (``kRoundLarge``). Segments are cached, so the
reserved memory of a pool is its peak use rounded up to whole segments, and the pools' peaks add up.

Memory parts on a GPU (:func:`gpu_memory_parts`), summing to the total: the CUDA context
(``runtime_baseline_mib`` of the device), the weights, the input the caller holds, the activation peak, the
cuBLAS workspace (when a matmul or attention runs), the cuDNN workspace, and the allocator's rounding
(reserved minus allocated). Each has a standard deviation; see :func:`gpu_memory_parts`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from dippm_nas.graph import OperatorGraph
from dippm_nas.spec import dtype_bytes
from dippm_nas.units import BYTES_PER_MIB

__all__ = [
    "MemoryBreakdown", "MemoryParts", "activation_liveness", "gpu_memory_parts", "round_block",
    "ACTIVATION_REL_SIGMA", "CONTEXT_REL_SIGMA", "CUDNN_WORKSPACE_SIGMA_MIB",
]

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * BYTES_PER_MIB
K_SMALL_BUFFER = 2 * BYTES_PER_MIB
K_LARGE_BUFFER = 20 * BYTES_PER_MIB
K_MIN_LARGE_ALLOC = 10 * BYTES_PER_MIB
K_ROUND_LARGE = 2 * BYTES_PER_MIB

#: Relative standard deviation of the activation peak: the root-mean-square relative error (0.190) of the
#: eager-retention liveness against the exact eager reference (:func:`dippm_nas.measure.reference_activation_peak`)
#: over 157 models: 8 of each of the 14 search-space families and 45 torchvision / timm models at batch 32
#: (``benchmarks/accuracy_memory_liveness.py``; ``docs/gpu_memory.md`` has the command and the table).
ACTIVATION_REL_SIGMA = 0.19
#: Relative standard deviation of the CUDA context (``runtime_baseline_mib``): PyTorch processes are reported
#: at 500-900 MiB of context (driver, CUDA and cuDNN versions; eager or lazy module loading), +-25 % of the
#: 700 MiB the catalogue takes; nothing here can check it without a GPU.
CONTEXT_REL_SIGMA = 0.25
#: Standard deviation of the cuDNN workspace of a graph with convolutions, MiB. The point estimate is 0:
#: in heuristic mode (``cudnn.benchmark=False``, the default) the forward algorithms cuDNN ranks first
#: need workspaces of KiB to a few MiB; with ``benchmark=True`` or unusual shapes an algorithm may take
#: tens of MiB, transiently. Not checkable without a GPU; this allowance carries it.
CUDNN_WORKSPACE_SIGMA_MIB = 32.0
#: Share of the allocator's rounding taken as its standard deviation (block splitting and reuse of cached
#: segments can make it smaller or larger than whole-segment rounding of each pool's peak).
ALLOCATOR_REL_SIGMA = 0.5


def round_block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request of ``nbytes`` (multiple of 512, 0 for 0)."""
    if nbytes <= 0:
        return 0
    return K_MIN_BLOCK * math.ceil(nbytes / K_MIN_BLOCK)


def _ceil_to(x: float, unit: int) -> float:
    return unit * math.ceil(x / unit) if x > 0 else 0.0


def _pool(blk: int) -> int:
    """0: small pool (2 MiB segments), 1: medium (20 MiB segments), 2: large (each block rounded to 2 MiB)."""
    if blk <= K_SMALL_SIZE:
        return 0
    return 1 if blk < K_MIN_LARGE_ALLOC else 2


def _reserved(pool_peaks: "list[float]") -> float:
    """Reserved bytes of the three pools' peak use (large: already rounded per block)."""
    return _ceil_to(pool_peaks[0], K_SMALL_BUFFER) + _ceil_to(pool_peaks[1], K_LARGE_BUFFER) + pool_peaks[2]


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
        pool_live_bytes: live bytes of each allocator pool while each node runs, ``[3, num_nodes]`` (small,
            medium, large; large blocks rounded up to 2 MiB).
    """

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_node: int
    live_bytes: np.ndarray
    pool_live_bytes: np.ndarray = field(default_factory=lambda: np.zeros((3, 0)))


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


def _cuts(n: int, alloc_at: list[int], last_use: list[int], storage_of: list[int | None]) -> list[tuple[int, int]]:
    """``(node index, storage)`` of each cut: after the node, its output's storage is the only one alive
    that a later node reads (consecutive positions of one storage, e.g. a node and its views, keep the last)."""
    delta = np.zeros(n + 1, dtype=np.int64)
    for a, e in zip(alloc_at, last_use):
        if e > a:
            delta[a] += 1
            delta[min(e, n)] -= 1
    across = np.cumsum(delta)[:n]
    out: list[tuple[int, int]] = []
    for i in range(n - 1):
        s = storage_of[i]
        if s is None or across[i] != 1 or not alloc_at[s] <= i < last_use[s]:
            continue
        if out and out[-1][1] == s:
            out[-1] = (i, s)
        else:
            out.append((i, s))
    return out


def _retain(graph: OperatorGraph, sizes: list[list[int]], alloc_at: list[int], last_use: list[int],
            storage_of: list[int | None], preds: list[list[int]], input_sids: dict[int, list[int]]) -> None:
    """Extend ``last_use`` in place by the two eager-retention rules of the module docstring."""
    n = graph.num_nodes
    cuts = _cuts(n, alloc_at, last_use, storage_of)
    if not cuts:
        return
    joins = [len({storage_of[p] for p in preds[i] if storage_of[p] is not None}) + len(input_sids.get(i, ())) >= 2
             for i in range(n)]
    pos = [c[0] for c in cuts]
    cut_storages = {c[1] for c in cuts}
    new_last = list(last_use)
    # block input: a cut read by a residual join lives until the next cut that a join reads (the next
    # block's input), or the cut after the join's output when none follows
    join_readers: dict[int | None, list[int]] = {}  # storage -> the joins that read it, in execution order
    for c in range(n):
        if joins[c]:
            for s in {storage_of[p] for p in preds[c]}:
                join_readers.setdefault(s, []).append(c)

    def read_by_join(k: int, s: int) -> bool:  # a join in (pos[k], min(last_use[s], n - 1)] reads s
        r = join_readers.get(s, ())
        i = bisect.bisect_right(r, pos[k])
        return i < len(r) and r[i] <= min(last_use[s], n - 1)

    skip_sources = sorted(k for k, (_, s) in enumerate(cuts) if read_by_join(k, s))
    size = [sum(sizes[s]) for _, s in cuts]
    run = [0] * len(cuts)  # runs of equal-sized cuts (a stage)
    for k in range(1, len(cuts)):
        run[k] = run[k - 1] + (size[k] != size[k - 1])
    for k, (j, sj) in enumerate(cuts[:-1]):
        if not joins[j]:
            continue
        i = bisect.bisect_right(skip_sources, k)  # the first skip source after cut k (sorted)
        nxt = skip_sources[i] if i < len(skip_sources) else len(cuts)
        end = pos[nxt] if nxt < len(cuts) and run[nxt] == run[k] else pos[k + 1]
        for p in preds[j]:
            s = storage_of[p]
            if s is not None and s != sj and s in cut_storages:
                new_last[s] = max(new_last[s], end)
    # stage input: in a run of equal-sized cuts, the cut before the first residual block lives to the run's end
    residual = [False] + [any(joins[i] for i in range(pos[k - 1] + 1, pos[k] + 1)) for k in range(1, len(cuts))]
    k = 0
    while k < len(cuts):
        e = k
        while e + 1 < len(cuts) and size[e + 1] == size[k]:
            e += 1
        first = next((r for r in range(max(k, 1), e + 1) if residual[r]), None)
        if first is not None:
            s = cuts[first - 1][1]
            new_last[s] = max(new_last[s], pos[e])
        k = e + 1
    last_use[:] = new_last


def activation_liveness(graph: OperatorGraph, *, retention: bool = False,
                        include_inputs: bool = True) -> MemoryBreakdown:
    """Peak activation memory of ``graph`` by a liveness pass in execution order.

    Args:
        graph: the captured graph.
        retention: also keep what eager PyTorch's Python frames hold (the two rules of the module
            docstring); ``False`` frees every tensor at its last use.
        include_inputs: count the model inputs as activations (until their last consumer); ``False``
            leaves them to the caller's part.

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

    consumers_of_input: dict[int, list[int]] = {}
    spec = graph.spec
    for t in spec.tensors:
        nbytes = math.prod((spec.batch_size, *t.shape)) * dtype_bytes(spec.tensor_dtype(t))
        sid = len(sizes)
        sizes.append([round_block(nbytes)] if include_inputs else [])
        cons = graph.input_consumers.get(t.name, [])
        alloc_at.append(0)
        last_use.append(max(cons) if cons else -1)
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
        return MemoryBreakdown(0, 0, -1, np.zeros(0), np.zeros((3, 0)))
    if retention:
        _retain(graph, sizes, alloc_at, last_use, storage_of, preds, consumers_of_input)
    delta = np.zeros(n + 2)
    pools = np.zeros((3, n + 2))
    for s, blocks in enumerate(sizes):
        if last_use[s] < alloc_at[s]:
            continue  # an input nobody reads
        a, e = alloc_at[s], min(last_use[s], n - 1)
        for blk in blocks:
            delta[a] += blk
            delta[e + 1] -= blk
            k = _pool(blk)
            b = _ceil_to(blk, K_ROUND_LARGE) if k == 2 else blk
            pools[k, a] += b
            pools[k, e + 1] -= b
    live = np.cumsum(delta)[:n]
    pool_live = np.cumsum(pools, axis=1)[:, :n]
    peak_node = int(np.argmax(live))
    reserved = _reserved([float(pool_live[k].max()) for k in range(3)])
    allocated = int(live[peak_node])
    return MemoryBreakdown(
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=int(max(reserved, allocated)),
        peak_node=peak_node,
        live_bytes=live,
        pool_live_bytes=pool_live,
    )


def _weight_blocks(graph: OperatorGraph) -> list[int]:
    """One block per weight tensor a node reads (scaled so they add up to ``graph.param_bytes``)."""
    per = dtype_bytes(graph.spec.dtype)
    raw = [math.prod(shape) * per for nd in graph.nodes if not nd.is_constant
           for shape, is_par in zip(nd.input_shapes, nd.input_is_param) if is_par and len(shape) > 0]
    total = float(sum(raw))
    if graph.param_bytes <= 0:
        return []
    if total <= 0:
        return [round_block(graph.param_bytes)]
    scale = graph.param_bytes / total
    return [round_block(int(b * scale)) for b in raw if b * scale >= 1]


@dataclass(frozen=True)
class MemoryParts:
    """Device memory of one forward pass on a GPU, by part, MiB; the parts add up to :attr:`total_mib`.

    Attributes:
        context_mib: CUDA context and library handles, outside the caching allocator
            (``Device.runtime_baseline_mib``).
        weights_mib: the weights, one 512 B-rounded block per tensor.
        input_mib: the input tensors the caller holds during the whole pass.
        activations_peak_mib: activations alive at the peak (eager retention liveness), 512 B blocks.
        cublas_workspace_mib: cuBLAS workspace (``Device.cublas_workspace_mib``) when a matmul or attention
            runs (allocated through the caching allocator).
        cudnn_workspace_mib: cuDNN convolution workspace (0: see :data:`CUDNN_WORKSPACE_SIGMA_MIB`).
        allocator_overhead_mib: reserved minus allocated: the segments' rounding.
        total_mib: the sum: what ``nvidia-smi`` would show for the process (context + reserved).
        allocated_mib: ``torch.cuda.max_memory_allocated`` (weights + input + activations + workspaces).
        reserved_mib: ``torch.cuda.max_memory_reserved`` (allocated + rounding).
        std_mib: standard deviation of ``total_mib`` (the parts' deviations added in quadrature).
        std_parts_mib: each part's standard deviation, MiB.
        peak_node: node index of the activation peak.
    """

    context_mib: float
    weights_mib: float
    input_mib: float
    activations_peak_mib: float
    cublas_workspace_mib: float
    cudnn_workspace_mib: float
    allocator_overhead_mib: float
    total_mib: float
    allocated_mib: float
    reserved_mib: float
    std_mib: float
    std_parts_mib: dict[str, float]
    peak_node: int

    def details(self) -> dict[str, float]:
        """The parts for :attr:`Prediction.details` (units in the keys)."""
        out = {
            "baseline_mib": self.context_mib, "weights_mib": self.weights_mib, "input_mib": self.input_mib,
            "activations_peak_mib": self.activations_peak_mib, "cublas_workspace_mib": self.cublas_workspace_mib,
            "cudnn_workspace_mib": self.cudnn_workspace_mib, "allocator_overhead_mib": self.allocator_overhead_mib,
            "allocated_mib": self.allocated_mib, "reserved_mib": self.reserved_mib, "memory_std_mib": self.std_mib,
        }
        out.update({f"memory_std_{k}": v for k, v in self.std_parts_mib.items()})
        return out


def gpu_memory_parts(graph: OperatorGraph, liveness: MemoryBreakdown, *, context_mib: float,
                     cublas_workspace_mib: float, uses_cublas: bool, uses_cudnn: bool) -> MemoryParts:
    """Memory parts of one forward pass on a GPU, with the caching allocator's pools shared by all of them.

    ``liveness`` must come from :func:`activation_liveness` with ``include_inputs=False`` (the input is a
    part of its own). Weights, input and the cuBLAS workspace stay allocated for the whole pass; each pool's
    reserved memory is the peak of those plus the pool's live activations, rounded as the module docstring
    says.

    The standard deviation adds in quadrature: the activation peak times :data:`ACTIVATION_REL_SIGMA`
    (measured against the eager reference), the context times :data:`CONTEXT_REL_SIGMA`, the cuDNN
    allowance :data:`CUDNN_WORKSPACE_SIGMA_MIB` (graphs with convolutions) and the rounding times
    :data:`ALLOCATOR_REL_SIGMA`; weights, input and the cuBLAS workspace are taken as exact.
    """
    spec = graph.spec
    weights = _weight_blocks(graph)
    inputs = [round_block(math.prod((spec.batch_size, *t.shape)) * dtype_bytes(spec.tensor_dtype(t)))
              for t in spec.tensors]
    ws = [round_block(int(cublas_workspace_mib * BYTES_PER_MIB))] if uses_cublas and cublas_workspace_mib > 0 else []
    const = [0.0, 0.0, 0.0]
    for blk in (*weights, *inputs, *ws):
        k = _pool(blk)
        const[k] += _ceil_to(blk, K_ROUND_LARGE) if k == 2 else blk
    pool_live = liveness.pool_live_bytes
    pool_peaks = [const[k] + (float(pool_live[k].max()) if pool_live.shape[1] else 0.0) for k in range(3)]
    allocated = float(sum(weights) + sum(inputs) + sum(ws) + liveness.peak_allocated_bytes)
    reserved = max(_reserved(pool_peaks), allocated)
    act_mib = liveness.peak_allocated_bytes / BYTES_PER_MIB
    overhead_mib = (reserved - allocated) / BYTES_PER_MIB
    std_parts = {
        "activations_mib": ACTIVATION_REL_SIGMA * act_mib,
        "context_mib": CONTEXT_REL_SIGMA * context_mib,
        "cudnn_workspace_mib": CUDNN_WORKSPACE_SIGMA_MIB if uses_cudnn else 0.0,
        "allocator_mib": ALLOCATOR_REL_SIGMA * overhead_mib,
    }
    return MemoryParts(
        context_mib=float(context_mib), weights_mib=sum(weights) / BYTES_PER_MIB, input_mib=sum(inputs) / BYTES_PER_MIB,
        activations_peak_mib=act_mib, cublas_workspace_mib=sum(ws) / BYTES_PER_MIB, cudnn_workspace_mib=0.0,
        allocator_overhead_mib=overhead_mib, total_mib=float(context_mib) + reserved / BYTES_PER_MIB,
        allocated_mib=allocated / BYTES_PER_MIB, reserved_mib=reserved / BYTES_PER_MIB,
        std_mib=math.sqrt(sum(v * v for v in std_parts.values())), std_parts_mib=std_parts,
        peak_node=liveness.peak_node,
    )
