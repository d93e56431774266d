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
  as allocating its output (an upper bound by at most one activation per such op), except under eager
  retention (below).

Eager retention (``retention=True``, what the GPU prior uses). In eager PyTorch a tensor also lives while a
Python frame holds it: a module's input until the module returns (``x = self.layer1(x)`` keeps the stage
input during the whole stage; ``nn.Sequential`` keeps the current block's input during the block). The
graph has no module boundaries, so two structural rules stand in for them, over the graph's *cut*
tensors (after a cut node, its output is the only activation alive that later nodes read: a block
boundary):

- stage input: in a run of equal-sized cut tensors, the cut before the first residual block (the input of a
  ResNet stage, of a ViT's blocks) stays alive until the run's last cut;
- block input: a cut tensor read by a residual join stays alive until the first cut tensor from the join on
  that a residual join reads in the same run of equal-sized cuts, the next block's input: the join's own
  output (ResNet, ConvNeXt), else a later cut (a ConvMixer block holds its input through its pointwise half),
  else until the cut after the join.

Storages under 1/16 of the graph's largest (an attention mask, rotary tables alive through a whole encoder)
neither make nor break a cut. Further rules of eager PyTorch's frames and in-place modules, by structure
(``_frame_rules``):

- in place: ``relu`` / ``clip`` (ReLU6) / ``silu`` / ``leakyrelu`` right after a convolution (or its fused bias
  add) or a normalization that nothing else reads, a convolution's or GEMM's fused bias add, and the
  decomposed hard-swish ``x * clip(x + 3, 0, 6) / 6`` share their input's storage (torchvision's and timm's
  ``inplace=True`` activations; a GEMM's bias inside ``addmm``);
- pre-norm branch: ``x + f(norm(x))`` holds the norm's output until the join (the argument of ``f``);
- attention block: the input of a block whose first branch holds attention or softmax lives until the
  block's second join (the caller holds a block's argument until it returns);
- post-norm layer: ``norm(x + f(x))`` (BERT): the skip input of each such join lives until the next one (with
  provenance, only where the norm runs inside the module call that made the sum: not a pre-norm block's output
  read by the next block's norm alone, Hiera's stage transitions);
- inverted residual: 1x1 expand, depthwise, 1x1 project (MobileNet, MBConv): the block's input lives until
  the projection's norm, the depthwise convolution's input until its norm (``Conv2dNormActivation``);
- a concatenation normalised before a convolution (DenseNet's ``bn_function``) lives until that convolution;
- conv + norm outside residual blocks (a ``ConvNormAct`` / ``BasicConv2d`` module of its own: Inception, DLA,
  stems): the convolution's input lives until the norm (the caller holds the module's argument); inside a
  residual block, between a join's skip source and the join, blocks are written flat and rebind it;
- cross-stage partial block (CSPNet: ``split``, blocks, ``conv(cat([xs, xb]))``, norm): the split tensor, the
  concatenation, its inputs and the block's argument live until that norm (locals of the block's frame);
- a ``take`` with one scalar index (``qkv[0]``, ``x[:, 0]``) is eager's ``select``, a view of its input;
- explicit attention (``q * scale``, ``q @ k^T``, softmax, ``@ v``: Swin): the scaled query lives until the output
  matmul, and a matmul operand that is a select of a permuted tensor is copied to contiguous memory while the
  matmul runs (at the operand's run-time dtype under autocast);
- max pooling allocates its int64 indices for the duration of the operator.

Where the graph carries provenance (:attr:`~dippm_nas.graph.OpNode.module_stack` and
:attr:`~dippm_nas.graph.OpNode.inplace`: graphs captured from a PyTorch module), the rules of
:mod:`dippm_nas.prior._provenance_rules` join these: a module's argument lives until the module returns, and an
activation is in place only where the exported operator was. The in-place rule above, the inverted-residual rule
and the conv + norm rule (module arguments in disguise) then do not apply, and the stage-input rule holds a cut
only where it is a local of the frame that runs the stage (:func:`_local_of_frame`). The layout rules of
:mod:`dippm_nas.prior._layout_rules` add eager's copies: a ``reshape`` whose input's strides allow no view is a
copy with a storage of its own (its input alive as long as the copy, as it was when the copy was taken for a
view of it), and a batched ``matmul`` operand it cannot fold is copied while the matmul runs.

With ``torch_version`` (:func:`activation_liveness`; the deployment's on a GPU estimate), the nodes of an SDPA math
path (marked by the capture) hold what that version's ``_scaled_dot_product_attention_math`` holds
(:mod:`dippm_nas.prior._math_path_memory`: the call's arguments and its scaled query to its end, the mask added in
place; from PyTorch 2.5 float32 copies of half-precision q, k, v, float32 scores and softmax, the attention weights
cast back and the safe softmax's buffers); without it, those nodes are priced as any others.

Under ``autocast`` each output is sized at its run-time dtype (:func:`~dippm_nas.prior.autocast_plan`), each
activation cast lives while its operator runs and each weight cast (autocast caches them) from its first
use to the end of the pass (a weight's cast at the weight's size, :func:`_cast_weight_elems`).
:func:`activation_liveness_many` has the retention rules, not ``autocast``.
``prior.estimate`` / ``predict`` on a GPU price the pass under their ``autocast`` (or the deployment's) this way.

:func:`dippm_nas.measure.reference_activation_peak` gives the exact eager figure without a GPU;
``benchmarks/accuracy/accuracy_memory_liveness.py`` prints how well these rules agree with it per family.

Allocator (PyTorch's CUDA caching allocator, ``c10/cuda/CUDACachingAllocator.cpp``): every block is
rounded up to 512 B (``kMinBlockSize``); requests of at most 1 MiB (``kSmallSize``) come from 2 MiB
segments (``kSmallBuffer``); requests between 1 and 10 MiB (``kMinLargeAlloc``) from 20 MiB segments
(``kLargeBuffer``); larger ones are rounded up to 2 MiB (``kRoundLarge``). :class:`MemoryBreakdown`'s
``peak_reserved_bytes`` rounds each pool's peak up to whole segments (a quick bound of the liveness alone);
:func:`gpu_memory_parts` replays the allocations and frees of the storages its liveness pass was computed from
(:func:`storage_lives` lists the same ones: one computation, ``_lives``, gives both) through the simulated allocator
of :mod:`dippm_nas.prior._allocator` (best fit, splits, merges, cached segments) for ``allocated_mib`` and
``reserved_mib``.

Memory parts on a GPU (:func:`gpu_memory_parts`), summing to the total: the CUDA context
(``runtime_baseline_mib`` of the device), the weights, the input the caller holds, the activation peak, the
cuBLAS workspace (when a matmul or attention runs), the cuDNN workspace, and the allocator's overhead
(reserved minus those parts: fragmentation, segment rounding, whole blocks taken unsplit). Each has a standard deviation; see :func:`gpu_memory_parts`.
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from dippm_nas._unique import sorted_unique
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import GraphStack, OperatorGraph, OpNode, stack_graphs
from dippm_nas.prior._allocator import AllocatorConfig, AllocatorPeak, _replay_pairs
from dippm_nas.prior._autocast import AUTOCAST_LOW_CLASSES, autocast_plan
from dippm_nas.prior._layout_rules import layout_copies
from dippm_nas.prior._math_path import math_path_float32
from dippm_nas.prior._sdpa_rank3 import fused_rank3_graph, sdpa_rank3_fused
from dippm_nas.prior._math_path_memory import MathPathStorageRules, math_path_calls, math_path_storage_rules
from dippm_nas.prior._nodes import check_autocast, graph_facts
from dippm_nas.prior._provenance_rules import module_argument_rule, provenance_inplace
from dippm_nas.spec import dtype_bytes
from dippm_nas.units import BYTES_PER_MIB

__all__ = [
    "MemoryBreakdown", "MemoryParts", "activation_liveness", "activation_liveness_many", "gpu_memory_parts",
    "gpu_memory_parts_many", "round_block", "storage_lives",
    "ACTIVATION_REL_SIGMA", "ACTIVATION_REL_SIGMA_PROVENANCE", "CONTEXT_REL_SIGMA", "CUDNN_WORKSPACE_SIGMA_MIB",
]

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * BYTES_PER_MIB
K_SMALL_BUFFER = 2 * BYTES_PER_MIB
K_LARGE_BUFFER = 20 * BYTES_PER_MIB
K_MIN_LARGE_ALLOC = 10 * BYTES_PER_MIB
K_ROUND_LARGE = 2 * BYTES_PER_MIB

#: Relative standard deviation of the activation peak of a graph without provenance (format 1, ONNX, a
#: search-space candidate assembled from its blocks' graphs), priced by the structural rules alone: the
#: root-mean-square relative error (0.098) of those rules against the exact eager reference
#: (:func:`dippm_nas.measure.reference_activation_peak`) over 166 float32 rows: 110 of 30 torchvision, 20 timm
#: and 5 transformers models at two batch sizes, their graphs stripped of provenance (0.058), and 56 stored graphs
#: of the 14 search-space families (0.148); the 110 float16-autocast zoo rows (0.065) are within it.
#: ``benchmarks/accuracy/accuracy_memory_liveness.py --rows ROWS --sigma`` prints it from the benchmark's rows
#: (``docs/gpu_memory.md``, "σ of the memory", has the commands).
ACTIVATION_REL_SIGMA = 0.098
#: Relative standard deviation of the activation peak of a graph with provenance
#: (:attr:`~dippm_nas.graph.OperatorGraph.has_provenance`: a graph captured from a PyTorch module), priced by the
#: provenance rules: the RMS relative error against the same reference over the 110 zoo rows is 0.022 in float32
#: and 0.042 under float16 autocast; the larger of the two, for every precision (the largest misses, LeViT's
#: cached attention biases in both precisions and the decoders' attention under autocast, are not a matter of the
#: pass's dtype alone, and bfloat16 was not measured). ``accuracy_memory_liveness.py --rows ROWS --sigma`` prints it.
ACTIVATION_REL_SIGMA_PROVENANCE = 0.042
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


#: A storage smaller than this share of a graph's largest one does not break a cut (an attention mask alive
#: through a whole encoder leaves its blocks' boundaries cuts).
_CUT_SMALL_SHARE = 1 / 16


def _cuts(n: int, alloc_at: list[int], last_use: list[int], storage_of: list[int | None],
          sizes: list[list[int]]) -> list[tuple[int, int]]:
    """``(node index, storage)`` of each cut: after the node, its output's storage is the only one alive
    that a later node reads, small storages apart (:data:`_CUT_SMALL_SHARE`; the caller's inputs count)
    (consecutive positions of one storage, e.g. a node and its views, keep the last)."""
    tot = [sum(b) for b in sizes]
    thr = max(tot, default=0) * _CUT_SMALL_SHARE
    delta = np.zeros(n + 1, dtype=np.int64)
    for a, e, t in zip(alloc_at, last_use, tot):
        if e > a and (t >= thr or t == 0):
            delta[a] += 1
            delta[min(e, n)] -= 1
    across = np.cumsum(delta)[:n]
    out: list[tuple[int, int]] = []
    for i in range(n - 1):
        s = storage_of[i]
        if s is None or across[i] != 1 or not alloc_at[s] <= i < last_use[s] or 0 < tot[s] < thr:
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
    cuts = _cuts(n, alloc_at, last_use, storage_of, sizes)
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
        i = bisect.bisect_left(skip_sources, k)  # the first skip source from cut k on (the join's own output)
        nxt = skip_sources[i] if i < len(skip_sources) else len(cuts)
        end = pos[nxt] if nxt < len(cuts) and run[nxt] == run[k] else pos[k + 1]
        for p in preds[j]:
            s = storage_of[p]
            if s is not None and s != sj and s in cut_storages:
                new_last[s] = max(new_last[s], end)
    # stage input: in a run of equal-sized cuts, the cut before the first residual block lives to the run's end
    residual = [False] + [any(joins[i] for i in range(pos[k - 1] + 1, pos[k] + 1)) for k in range(1, len(cuts))]
    k = 0
    provenance = graph.has_provenance
    while k < len(cuts):
        e = k
        while e + 1 < len(cuts) and size[e + 1] == size[k]:
            e += 1
        first = next((r for r in range(max(k, 1), e + 1) if residual[r]), None)
        if first is not None and (not provenance or _local_of_frame(graph, preds, pos[first - 1], pos[e])):
            s = cuts[first - 1][1]
            new_last[s] = max(new_last[s], pos[e])
        k = e + 1
    last_use[:] = new_last


def _local_of_frame(graph: OperatorGraph, preds: list[list[int]], cut: int, end: int) -> bool:
    """With provenance: whether the cut tensor made at node ``cut`` is a local of the frame of the module call
    that runs the stage after it, up to node ``end``, alive until that call returns: computed in that frame
    (``h = embeds + positions``) or returned by a named child module (``embeds = self.embed_tokens(ids)``), not
    by an element of a container the frame loops over (``for blk in self.blocks: x = blk(x)``, an
    ``nn.Sequential``: the loop rebinds it, and the module-argument rule holds it as the next call's argument)."""
    nodes = graph.nodes
    frame = nodes[cut + 1].module_stack or ()
    for nd in nodes[cut + 2:end + 1]:
        st = nd.module_stack or ()
        k = 0
        while k < len(frame) and k < len(st) and frame[k] == st[k]:
            k += 1
        frame = frame[:k]
    made = nodes[_producer(nodes, preds, cut)].module_stack or ()
    if made[:len(frame)] != frame:
        return False
    return len(made) == len(frame) or not made[len(frame)].rpartition(".")[2].partition("@")[0].isdigit()


#: Activations eager PyTorch models run in place after a convolution or a normalization
#: (``nn.ReLU(inplace=True)``, ``nn.ReLU6(inplace=True)`` as ``clip``, ``nn.SiLU(inplace=True)``).
_INPLACE_ACTS = frozenset({"nn.relu", "clip", "nn.silu", "nn.leakyrelu"})
_PRE_NORMS = frozenset({"nn.layer_norm", "nn.rms_norm", "nn.group_norm"})
_FRAME_MEMO: dict[int, tuple[object, "_FrameRules"]] = {}


@dataclass(frozen=True)
class _FrameRules:
    """What eager PyTorch's frames and in-place modules do to one graph's liveness (node indices).

    ``inplace``: activations that reuse their producer's storage; ``extend``: ``(producer, until)`` pairs,
    the producer's output lives at least until node ``until``; ``scratch``: ``(node, bytes)`` alive while the
    node runs; ``copies``: ``(matmul, operand)``, a contiguous copy of the operand alive while the matmul runs;
    ``copy_views``: view nodes (``reshape``) eager runs as a copy, each with a storage of its own."""

    inplace: tuple[int, ...]
    extend: tuple[tuple[int, int], ...]
    scratch: tuple[tuple[int, int], ...] = ()
    copies: tuple[tuple[int, int], ...] = ()
    copy_views: tuple[int, ...] = ()


def _frame_rules(graph: OperatorGraph) -> _FrameRules:
    """The rules of the module docstring's "Python frames" list, memoised by the graph's identity."""
    hit = _FRAME_MEMO.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    nodes = graph.nodes
    preds = graph.predecessors()
    succ: list[list[int]] = [[] for _ in nodes]
    for i, ps in enumerate(preds):
        for q in ps:
            succ[q].append(i)
    outs = set(graph.outputs)

    fused = graph_facts(graph).fused
    provenance = graph.has_provenance
    acts = (set(provenance_inplace(nodes, preds, outs)) if provenance
            else _structural_inplace(nodes, preds, succ, outs, fused))
    inplace = tuple(sorted(acts
                           | {i for i in range(len(nodes)) if fused[i] and preds[i]}
                           | set(_selects(nodes, preds))
                           | set(_hardswish_chains(nodes, preds, succ))))
    att_extend, copies = _explicit_attention_rule(nodes, preds, succ)
    copy_views: list[int] = []
    if provenance:  # the layout rules of ``_layout_rules``: reshapes and matmul operands eager copies
        copy_views, operand_copies = layout_copies(nodes, preds)
        seen = set(copies)
        copies = copies + [c for c in operand_copies if c not in seen]
    # the inverted-residual and conv + norm rules stand in for module arguments (``Conv2dNormActivation``,
    # ``ConvNormAct``) that the module-argument rule sees where the graph has provenance
    structural = (_pre_norm_rule(nodes, preds) + _post_norm_rule(nodes, preds, succ, provenance)
                  + _attention_block_rule(nodes, preds))
    if not provenance:
        structural += _inverted_residual_rule(nodes, preds, succ) + _conv_norm_rule(nodes, preds, succ)
    extend = structural + att_extend + _concat_norm_rule(nodes, succ) + _split_concat_rule(nodes, preds, succ) \
        + (module_argument_rule(nodes, preds) if provenance else [])
    # max pooling computes its int64 indices (``max_pool2d_with_indices``) and drops them when it returns
    scratch = tuple((i, round_block(nd.output_elements * 8)) for i, nd in enumerate(nodes)
                    if nd.op.startswith("nn.max_pool") and not nd.is_constant)
    rules = _FrameRules(inplace, tuple(extend), scratch, tuple(copies), tuple(copy_views))
    if len(_FRAME_MEMO) >= _MEMO_MAX:
        _FRAME_MEMO.clear()
    _FRAME_MEMO[id(graph)] = (graph, rules)
    return rules


def _structural_inplace(nodes: "Sequence[OpNode]", preds: list[list[int]], succ: list[list[int]], outs: set[int],
                        fused: "Sequence[bool]") -> set[int]:
    """Without provenance: the activations of :data:`_INPLACE_ACTS` right after a convolution (or its fused bias)
    or a normalization that nothing else reads are taken to run in place."""
    return {i for i, nd in enumerate(nodes)
            if nd.op in _INPLACE_ACTS and len(preds[i]) == 1 and not nd.is_constant
            and (nodes[preds[i][0]].op_class in ("conv", "normalization")
                 or fused[preds[i][0]] and any(_is_conv(nodes[q]) for q in preds[preds[i][0]]))
            and succ[preds[i][0]] == [i] and preds[i][0] not in outs}


def _explicit_attention_rule(nodes: "Sequence[OpNode]", preds: list[list[int]], succ: list[list[int]]
                             ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Attention written out (``q = q * scale; attn = q @ k.transpose(-2, -1); ..; softmax(attn) @ v``: Swin's,
    MaxViT's): the scaled query is a local of the attention's frame, alive until its output matmul; an operand
    that is a view of a permuted tensor (``qkv.permute(..)[i]``) is copied to contiguous memory by ``matmul``
    while it runs. Returns the ``extend`` pairs and the ``(matmul, operand)`` copies."""
    extend: list[tuple[int, int]] = []
    copies: list[tuple[int, int]] = []
    for sm, nd in enumerate(nodes):
        if nd.op_class != "softmax" or nd.is_constant or not preds[sm]:
            continue
        m1 = preds[sm][0]
        for _ in range(8):
            if nodes[m1].op_class == "matmul" or not preds[m1]:
                break
            m1 = next((q for q in preds[m1] if not nodes[q].is_constant), preds[m1][0])
        m2 = sm
        for _ in range(4):
            nxt = [c for c in succ[m2] if nodes[c].op_class in ("matmul", "view", "cast")]
            if len(succ[m2]) != 1 or not nxt:
                break
            m2 = nxt[0]
            if nodes[m2].op_class == "matmul":
                break
        if nodes[m1].op_class != "matmul" or nodes[m2].op_class != "matmul":
            continue
        for q in preds[m1]:
            if nodes[_producer(nodes, preds, q)].op == "multiply":
                extend.append((_producer(nodes, preds, q), m2))
        copies += [(m, q) for m in (m1, m2) for q in preds[m] if _permuted_view(nodes, preds, q)]
    return extend, copies


def _permuted_view(nodes: "Sequence[OpNode]", preds: list[list[int]], i: int) -> bool:
    """Node ``i`` is a select of a permuted tensor (through views): memory ``matmul`` cannot batch in place."""
    seen_select = False
    for _ in range(6):
        nd = nodes[i]
        if nd.is_constant or nd.op_class not in ("view", "gather") or not preds[i]:
            return False
        if nd.op == "take":
            if not (len(nd.input_shapes) == 2 and nd.input_shapes[1] == ()):
                return False
            seen_select = True
        elif nd.op == "permute_dims" and seen_select:
            return True
        i = preds[i][0]
    return False


def _selects(nodes: "Sequence[OpNode]", preds: list[list[int]]) -> list[int]:
    """``take`` with one scalar index (``qkv[0]``, ``x[:, 0]``): eager PyTorch's ``select``, a view of its input."""
    return [i for i, nd in enumerate(nodes)
            if nd.op == "take" and not nd.is_constant and preds[i] and len(nd.input_shapes) == 2
            and nd.input_shapes[1] == () and len(nd.output_shape) == len(nd.input_shapes[0]) - 1]


def _hardswish_chains(nodes: "Sequence[OpNode]", preds: list[list[int]], succ: list[list[int]]) -> list[int]:
    """The nodes of ``x * clip(x + 3, 0, 6) / 6`` (hard-swish as the graph decomposes it), which eager PyTorch
    runs as one in-place ``nn.Hardswish(inplace=True)``: ``add``, ``clip``, ``divide`` and ``multiply``."""
    out = []
    for m, nd in enumerate(nodes):
        if nd.op != "multiply" or len(preds[m]) != 2:
            continue
        for x, d in (preds[m], preds[m][::-1]):
            c = preds[d][0] if nodes[d].op == "divide" and len(preds[d]) == 1 else -1
            a = preds[c][0] if c >= 0 and nodes[c].op == "clip" and len(preds[c]) == 1 else -1
            if a >= 0 and nodes[a].op == "add" and preds[a] == [x] and succ[a] == [c] and succ[c] == [d] \
                    and succ[d] == [m] and nodes[x].op_class in ("conv", "normalization") and set(succ[x]) == {a, m}:
                out += [a, c, d, m]
                break
    return out


def _producer(nodes: "Sequence[OpNode]", preds: list[list[int]], i: int) -> int:
    """The node whose storage node ``i`` aliases (through views), or ``i``."""
    while nodes[i].op_class == "view" and preds[i]:
        i = preds[i][0]
    return i


def _pre_norm_rule(nodes: "Sequence[OpNode]", preds: list[list[int]]) -> list[tuple[int, int]]:
    """A pre-norm residual branch (``x + f(norm(x))``) holds the norm's output until the join: the caller's
    frame keeps the argument of ``f`` while ``f`` runs."""
    readers: dict[int, list[int]] = {}
    for j, ps in enumerate(preds):
        src = {_producer(nodes, preds, q) for q in ps if not nodes[q].is_constant}
        if len(src) >= 2 and nodes[j].op == "add":
            for q in src:
                readers.setdefault(q, []).append(j)
    out = []
    for i, nd in enumerate(nodes):
        if nd.op in _PRE_NORMS and preds[i]:
            r = readers.get(_producer(nodes, preds, preds[i][0]), [])
            k = bisect.bisect_right(r, i)
            if k < len(r):
                out.append((i, r[k]))
    return out


def _attention_block_rule(nodes: "Sequence[OpNode]", preds: list[list[int]]) -> list[tuple[int, int]]:
    """A transformer block (``x + attn(..)`` then ``+ mlp(..)``, the first branch holding attention or starting
    with a norm): the block's input lives until the block's output is made, the second join: the caller's
    frame holds a module's argument until it returns."""
    readers: dict[int, list[int]] = {}
    for i, ps in enumerate(preds):
        for q in ps:
            readers.setdefault(_producer(nodes, preds, q), []).append(i)
    joins = []
    for j, ps in enumerate(preds):
        src = sorted({_producer(nodes, preds, q) for q in ps if not nodes[q].is_constant})
        if nodes[j].op == "add" and len(src) >= 2:
            joins.append((j, src))
    out = []
    for k, (j, src) in enumerate(joins[:-1]):
        if not (any(nodes[i].op_class in ("attention", "softmax") for i in range(src[0] + 1, j))
                or any(nodes[c].op in _PRE_NORMS for c in readers.get(src[0], ()))):
            continue
        nxt, nsrc = joins[k + 1]
        if j in nsrc:
            out.append((src[0], nxt))
    return out


def _post_norm_rule(nodes: "Sequence[OpNode]", preds: list[list[int]],
                    succ: list[list[int]], provenance: bool = False) -> list[tuple[int, int]]:
    """Post-norm sublayers (``norm(x + f(x))``, BERT): the skip input of each lives until the next post-norm
    join, so a layer's input lives through the whole layer (the caller's frame holds it until it returns).
    With ``provenance``, the norm must run inside the module call that made the sum (BERT's ``self.LayerNorm(h +
    x)``), not in the next block's (a pre-norm block whose next block does not read its output as a skip:
    Hiera's stage transitions)."""
    joins = [j for j, ps in enumerate(preds)
             if nodes[j].op == "add" and len(succ[j]) == 1 and nodes[succ[j][0]].op in _PRE_NORMS
             and len({_producer(nodes, preds, q) for q in ps if not nodes[q].is_constant}) >= 2
             and (not provenance or _norm_in_call_of(nodes[j], nodes[succ[j][0]]))]
    out = []
    for j, nxt in zip(joins, joins[1:]):
        src = min(_producer(nodes, preds, q) for q in preds[j] if not nodes[q].is_constant)
        out.append((src, nxt))
    return out


def _norm_in_call_of(add: OpNode, norm: OpNode) -> bool:
    """The norm runs inside the innermost module call the ``add`` ran in (or the add ran in no module's call)."""
    stack = add.module_stack or ()
    return not stack or stack[-1] in (norm.module_stack or ())


def _is_conv(nd: OpNode, *, depthwise: bool | None = None) -> bool:
    if nd.op_class != "conv" and not nd.op.startswith("nn.conv"):
        return False
    return depthwise is None or bool(nd.attrs.get("depthwise", False)) == depthwise


def _inverted_residual_rule(nodes: "Sequence[OpNode]", preds: list[list[int]],
                            succ: list[list[int]]) -> list[tuple[int, int]]:
    """An inverted-residual block (1x1 expand, depthwise, 1x1 project: MobileNet, MBConv) holds its input
    until its projection's normalization, and the depthwise convolution's input until the normalization
    after it: the caller's frame (an ``nn.Sequential`` such as ``Conv2dNormActivation``) keeps a module's
    input until the module returns."""
    out = []
    for d, nd in enumerate(nodes):
        if not _is_conv(nd, depthwise=True) or not preds[d]:
            continue
        i, block_in = preds[d][0], preds[d][0]
        for _ in range(8):
            if _is_conv(nodes[i]) or len(preds[i]) != 1:
                break
            i = preds[i][0]
        if _is_conv(nodes[i], depthwise=False) and list(nodes[i].attrs.get("kernel", ())) == [1, 1]:
            if not preds[i]:
                continue
            block_in = preds[i][0]
        j = d
        for _ in range(16):
            if not succ[j]:
                break
            j = max(succ[j])
            if _is_conv(nodes[j], depthwise=False) or nodes[j].op_class in ("matmul", "attention") \
                    or nodes[j].op == "add" and len(preds[j]) >= 2:
                break  # the projection, or not an inverted residual (ConvNeXt's pointwise GEMMs, a residual join)
        if not _is_conv(nodes[j], depthwise=False):
            continue
        if len(succ[j]) == 1 and nodes[succ[j][0]].op_class == "normalization":
            j = succ[j][0]
        out.append((block_in, j))
        if len(succ[d]) == 1 and nodes[succ[d][0]].op_class == "normalization":
            out.append((preds[d][0], succ[d][0]))  # the depthwise group's input, until its norm returns
    return out


def _conv_norm_rule(nodes: "Sequence[OpNode]", preds: list[list[int]],
                    succ: list[list[int]]) -> list[tuple[int, int]]:
    """A convolution and its normalization outside residual blocks (a ``ConvNormAct`` / ``BasicConv2d``
    module of its own: DLA, Inception, a stem) hold the convolution's input until the normalization returns:
    the caller's frame keeps the module's argument. Inside a residual block (between the producer of a
    join's skip input and the join) blocks are written flat (``out = self.conv2(out)``), which rebinds it."""
    inside = np.zeros(len(nodes) + 1, dtype=np.int64)
    for j, ps in enumerate(preds):
        src = sorted({_producer(nodes, preds, q) for q in ps if not nodes[q].is_constant})
        if nodes[j].op == "add" and len(src) >= 2:
            inside[src[0] + 1] += 1
            inside[j] -= 1
    inside = np.cumsum(inside)
    out = []
    for c, nd in enumerate(nodes):
        if not _is_conv(nd) or not preds[c] or len(succ[c]) != 1 or nodes[succ[c][0]].op_class != "normalization" \
                or inside[c] > 0:
            continue
        out.append((preds[c][0], succ[c][0]))
    return out


def _split_concat_rule(nodes: "Sequence[OpNode]", preds: list[list[int]],
                        succ: list[list[int]]) -> list[tuple[int, int]]:
    """A cross-stage partial block (CSPNet: ``x = conv_exp(x)``, ``xs, xb = x.split(..)``, ``xb = blocks(xb)``,
    ``conv_transition(cat([xs, xb]))``) holds its locals and its argument until it returns: the split tensor,
    the concatenation and its inputs, and the input of the convolution that made the split tensor live until
    the normalization after the concatenation's convolution."""
    out = []
    for c, nd in enumerate(nodes):
        if nd.op != "concat" or len(succ[c]) != 1 or not _is_conv(nodes[succ[c][0]]):
            continue
        v = succ[c][0]
        splits = [q for q in preds[c] if nodes[q].op == "split"]
        if not splits or len(succ[v]) != 1 or nodes[succ[v][0]].op_class != "normalization":
            continue
        end = succ[v][0]
        src = [_producer(nodes, preds, q) for q in preds[c] if not nodes[q].is_constant]
        out += [(c, end)] + [(q, end) for q in src]
        k = _producer(nodes, preds, splits[0])
        for _ in range(4):  # back through the normalization and activation to the convolution
            if _is_conv(nodes[k]) or len(preds[k]) != 1:
                break
            k = preds[k][0]
        if _is_conv(nodes[k]) and preds[k]:
            out.append((preds[k][0], end))
    return out


def _concat_norm_rule(nodes: "Sequence[OpNode]", succ: list[list[int]]) -> list[tuple[int, int]]:
    """A concatenation normalised before a convolution (DenseNet's ``conv(relu(norm(cat(features))))``) lives
    until that convolution has run: it is a local variable of the function that makes it."""
    out = []
    for c, nd in enumerate(nodes):
        if nd.op != "concat" or len(succ[c]) != 1 or nodes[succ[c][0]].op_class != "normalization":
            continue
        j = succ[c][0]
        for _ in range(4):
            if len(succ[j]) != 1:
                break
            j = succ[j][0]
            if _is_conv(nodes[j]) or nodes[j].op_class == "matmul":
                out.append((c, j))
                break
    return out


def activation_liveness(graph: OperatorGraph, *, retention: bool = False,
                        include_inputs: bool = True, autocast: str | None = None,
                        torch_version: str | None = None) -> MemoryBreakdown:
    """Peak activation memory of ``graph`` by a liveness pass in execution order.

    Args:
        graph: the captured graph.
        retention: also keep what eager PyTorch's Python frames hold (the two rules of the module
            docstring); ``False`` frees every tensor at its last use.
        include_inputs: count the model inputs as activations (until their last consumer); ``False``
            leaves them to the caller's part.
        autocast: ``None`` or ``"float16"`` / ``"bfloat16"``: the pass runs under ``torch.autocast`` (CUDA
            operator lists, :func:`~dippm_nas.prior.autocast_plan`): each output at its run-time dtype, each
            activation autocast casts for an operator alive while it runs, each weight's cached cast from
            its first use to the end of the pass.
        torch_version: the PyTorch version the pass runs on (``"2.4.1"``, ``"2.13.0+cu130"``): the nodes of an
            SDPA math path (``attrs["sdpa_math"]``) hold what that version's math path holds
            (:mod:`~dippm_nas.prior._math_path_memory`: float32 copies of half-precision q, k and v and float32
            scores from 2.5, the safe softmax's buffers, the scaled query to the call's end); ``None`` (not
            known): those nodes are priced as any others, at the graph's dtypes (autocast's plan under autocast).
            From 2.14 a call on 3-D inputs is one fused attention kernel instead
            (:func:`~dippm_nas.prior._sdpa_rank3.fused_rank3_graph`: no score matrix).

    Returns:
        the :class:`MemoryBreakdown`: the live bytes of the storages :func:`storage_lives` lists (the same
        computation), which :func:`gpu_memory_parts` replays through the caching allocator.
    """
    if sdpa_rank3_fused(torch_version):
        graph = fused_rank3_graph(graph)
    lv = _lives(graph, retention=retention, include_inputs=include_inputs, autocast=autocast,
                math_float32=math_path_float32(torch_version))
    if graph.num_nodes == 0:
        return MemoryBreakdown(0, 0, -1, np.zeros(0), np.zeros((3, 0)))
    out = _peak(lv, graph.num_nodes)
    _remember_storages(out, _block_lives(lv.sizes, lv.alloc_at, lv.last_use))
    return out


def storage_lives(graph: OperatorGraph, *, autocast: str | None = None, include_inputs: bool = False,
                  torch_version: str | None = None) -> tuple[list[list[int]], list[int], list[int]]:
    """The storages of :func:`activation_liveness` with ``retention=True``: each one's blocks (bytes, 512 B
    rounded), the node that makes it and the last node that reads it (``num_nodes``: read to the end), the
    sequence :func:`~dippm_nas.prior.allocation_events` turns into the caching allocator's requests. Both come
    from one liveness pass, so the peak of their sum over the nodes is
    ``activation_liveness(graph, retention=True, ...).peak_allocated_bytes`` (``torch_version`` as there)."""
    if sdpa_rank3_fused(torch_version):
        graph = fused_rank3_graph(graph)
    lv = _lives(graph, retention=True, include_inputs=include_inputs, autocast=autocast,
                math_float32=math_path_float32(torch_version))
    return lv.sizes, lv.alloc_at, lv.last_use


def _lives(graph: OperatorGraph, *, retention: bool, include_inputs: bool, autocast: str | None,
           math_float32: bool | None = None) -> _Lives:
    """The storages of one graph's liveness pass (the rules of the module docstring), the one computation
    behind :func:`activation_liveness` and :func:`storage_lives`; ``math_float32``: the SDPA math path's
    version rule (:func:`~dippm_nas.prior.math_path_float32`; ``None``: not applied)."""
    n = graph.num_nodes
    preds = graph.predecessors()
    rules = _frame_rules(graph) if retention and n else _FrameRules((), ())
    mp = _math_rules(graph, preds, autocast, math_float32)
    lv = _Lives([None] * n, [], [], [], {})
    _input_storages(graph, lv, include_inputs)
    _node_storages(graph, preds, lv, frozenset(rules.inplace), frozenset(rules.copy_views), mp.inplace)
    _extend_lives(graph, preds, lv)
    if n == 0:
        return lv
    if retention:
        _retain(graph, lv.sizes, lv.alloc_at, lv.last_use, lv.storage_of, preds, lv.consumers_of_input)
        for p, until in (*(e for e in rules.extend if e[0] not in mp.temporaries), *mp.extend):
            s = lv.storage_of[p]
            if s is not None:
                lv.last_use[s] = max(lv.last_use[s], until)
        for i, nbytes in rules.scratch:
            _add_storage(lv, [nbytes], i, i)
        for i in rules.copy_views:  # the copied tensor lives as long as its copy, as it did as the copy's base
            src = next((lv.storage_of[p] for p in preds[i] if lv.storage_of[p] is not None), None)
            if src is not None and lv.storage_of[i] is not None:
                lv.last_use[src] = max(lv.last_use[src], lv.last_use[lv.storage_of[i]])
    copy_sids = []
    for m, q in rules.copies:
        copy_sids.append((len(lv.sizes), q))
        _add_storage(lv, [round_block(graph.nodes[q].output_elements * dtype_bytes(graph.nodes[q].output_dtype))], m, m)
    if autocast is not None:
        _autocast_storages(graph, preds, lv, autocast, copy_sids, mp.marked)
    if mp.marked:
        _math_path_storages(lv, mp, copy_sids, graph)
    return lv


_NO_MATH = MathPathStorageRules({}, (), {}, {}, (), frozenset(), frozenset(), "none")


def _math_rules(graph: OperatorGraph, preds: list[list[int]], autocast: str | None,
                math_float32: bool | None) -> MathPathStorageRules:
    """The SDPA math path's storage rules of ``graph`` (none when the version is unknown or no node is marked)."""
    if math_float32 is None:
        return _NO_MATH
    calls = math_path_calls(graph, preds)
    if not calls:
        return _NO_MATH
    facts = graph_facts(graph)
    run = facts.dtype if autocast is None else autocast_plan(graph, autocast, facts.classes, facts.dtype,
                                                              facts.fused).dtype
    return math_path_storage_rules(graph, preds, calls, np.asarray(run), autocast, bool(math_float32))


def _math_path_storages(lv: _Lives, mp: MathPathStorageRules, copy_sids: "Sequence[tuple[int, int]]",
                        graph: OperatorGraph) -> None:
    """The math path's storages at the dtype its version runs them in, and those it holds that no node makes."""
    for i, blocks in mp.resize.items():
        s = lv.storage_of[i]
        if s is not None and lv.alloc_at[s] == i:
            lv.sizes[s] = list(blocks)
    for s, q in copy_sids:
        width = mp.copy_width.get(lv.alloc_at[s])
        if width is not None:
            lv.sizes[s] = [round_block(graph.nodes[q].output_elements * width)]
    for blocks, first, last in mp.extra:
        _add_storage(lv, list(blocks), first, last)


@dataclass(frozen=True)
class _BlockLives:
    """The allocated blocks of one graph's storages, in storage order (a storage's blocks in order): each
    block's bytes (> 0), its storage's index, the node that makes it and the last node that reads it; storages
    no node reads are left out (what :func:`~dippm_nas.prior.allocation_events` replays)."""

    blk: np.ndarray
    sid: np.ndarray
    alloc: np.ndarray
    last: np.ndarray


def _block_lives(sizes: "Sequence[Sequence[int]]", alloc_at: "Sequence[int]", last_use: "Sequence[int]",
                 ) -> _BlockLives:
    counts = np.fromiter(map(len, sizes), dtype=np.int64, count=len(sizes))
    blk = np.fromiter(chain.from_iterable(sizes), dtype=np.int64, count=int(counts.sum()))
    sid = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    alloc = np.asarray(alloc_at, dtype=np.int64)[sid]
    last = np.asarray(last_use, dtype=np.int64)[sid]
    keep = (blk > 0) & (last >= alloc)
    return _BlockLives(blk[keep], sid[keep], alloc[keep], last[keep])


#: The blocks each :class:`MemoryBreakdown` of :func:`activation_liveness` / :func:`activation_liveness_many`
#: was computed from, by the breakdown's identity while it is alive (a weak reference; the entry goes with it):
#: :func:`gpu_memory_parts` replays these through the caching allocator instead of a second liveness pass.
_STORAGES_OF: dict[int, tuple["weakref.ref[MemoryBreakdown]", _BlockLives]] = {}


def _remember_storages(mem: MemoryBreakdown, lives: _BlockLives) -> None:
    key = id(mem)
    _STORAGES_OF[key] = (weakref.ref(mem, lambda _r: _STORAGES_OF.pop(key, None)), lives)


def _storages_of(graph: OperatorGraph, mem: MemoryBreakdown) -> _BlockLives:
    """The blocks ``mem`` was computed from, or (a breakdown made elsewhere) those of :func:`storage_lives`."""
    hit = _STORAGES_OF.get(id(mem))
    if hit is not None and hit[0]() is mem:
        return hit[1]
    return _block_lives(*storage_lives(graph))


_WIDTH = {0: 4, 1: 2, 2: 2, 3: 8}


def _autocast_storages(graph: OperatorGraph, preds: list[list[int]], lv: _Lives, low: str,
                       copies: "Sequence[tuple[int, int]]" = (), inside_sdpa: frozenset[int] = frozenset()) -> None:
    """Re-size the storages to their run-time dtype under autocast to ``low`` and add autocast's casts: an
    activation cast alive while its operator runs, a weight's cast (cached by autocast) from its first use
    to the end of the pass; none for the nodes of ``inside_sdpa`` (an SDPA math path whose version is known: the
    composite runs below autocast's dispatch key)."""

    check_autocast(low)
    facts = graph_facts(graph)
    plan = autocast_plan(graph, low, facts.classes, facts.dtype, facts.fused)
    nodes, n = graph.nodes, graph.num_nodes
    low_code = {"float16": 1, "bfloat16": 2}[low]
    for i, nd in enumerate(nodes):
        s = lv.storage_of[i]
        cap, run = int(facts.dtype[i]), int(plan.dtype[i])
        if s is not None and lv.alloc_at[s] == i and cap in _WIDTH and run in _WIDTH and cap != run:
            lv.sizes[s] = [round_block(b * _WIDTH[run] // _WIDTH[cap]) for b in _output_blocks(graph, i)]
    for s, q in copies:  # a matmul's contiguous copy of an operand, at the operand's run-time dtype
        cap, run = int(facts.dtype[q]), int(plan.dtype[q])
        if cap in _WIDTH and run in _WIDTH and cap != run:
            lv.sizes[s] = [round_block(nodes[q].output_elements * _WIDTH[run])]
    for i, nd in enumerate(nodes):
        run = int(plan.dtype[i])
        if nd.is_constant or plan.casts[i] <= 0 or run not in _WIDTH or i in inside_sdpa:
            continue
        for p in preds[i]:
            rp = int(plan.dtype[p])
            if not nodes[p].is_constant and rp in _WIDTH and rp != run:
                _add_storage(lv, [round_block(nodes[p].output_elements * _WIDTH[run])], i, i)
        for t in graph.spec.tensors:
            code = {"float32": 0, "float16": 1, "bfloat16": 2}.get(graph.spec.tensor_dtype(t))
            if code is not None and code != run and i in graph.input_consumers.get(t.name, ()):
                _add_storage(lv, [round_block(math.prod((graph.spec.batch_size, *t.shape)) * _WIDTH[run])], i, i)
        if facts.classes[i] in AUTOCAST_LOW_CLASSES and int(facts.dtype[i]) != low_code:
            blocks = [round_block(e * _WIDTH[low_code]) for e in _cast_weight_elems(nodes, preds, i)]
            if blocks:
                _add_storage(lv, blocks, i, n)


def _cast_weight_elems(nodes: "Sequence[OpNode]", preds: list[list[int]], i: int) -> list[int]:
    """Elements of each weight node ``i`` reads, as autocast casts it: the weight itself, not a constant view the
    graph reads it through (Relax's ``broadcast_to`` of a ``Linear`` weight to a batched matmul, ``(8, 768, 768)``
    for a ``768 x 768`` weight, is one cast of the weight in eager PyTorch)."""
    via = {}
    for p in preds[i]:
        if not nodes[p].is_constant:
            continue
        q, least = p, math.prod(nodes[p].output_shape)
        while nodes[q].op_class == "view":
            least = min([least] + [math.prod(sh) for sh, par in zip(nodes[q].input_shapes, nodes[q].input_is_param)
                                   if par and len(sh) > 0])
            if not preds[q]:
                break
            q = preds[q][0]
        via.setdefault(nodes[p].output_shape, least)
    return [min(math.prod(sh), via.get(sh, math.prod(sh)))
            for sh, par in zip(nodes[i].input_shapes, nodes[i].input_is_param) if par and len(sh) > 0]


def _add_storage(lv: _Lives, blocks: list[int], alloc_at: int, last_use: int) -> None:
    lv.sizes.append(blocks)
    lv.alloc_at.append(alloc_at)
    lv.last_use.append(last_use)


@dataclass
class _Lives:
    """The storages of one graph's liveness pass, indexed by storage id."""

    storage_of: list[int | None]            # storage id per node (None: no memory of its own nor aliased)
    sizes: list[list[int]]                  # blocks of each storage
    alloc_at: list[int]                     # node index at which it is allocated (0 for model inputs)
    last_use: list[int]                     # last node index that uses it (n for model outputs)
    consumers_of_input: dict[int, list[int]]  # node index -> storage ids of the model inputs it reads


def _input_storages(graph: OperatorGraph, lv: _Lives, include_inputs: bool) -> None:
    """One storage per model input, alive from the start to its last consumer (no blocks unless counted)."""
    spec = graph.spec
    for t in spec.tensors:
        nbytes = math.prod((spec.batch_size, *t.shape)) * dtype_bytes(spec.tensor_dtype(t))
        sid = len(lv.sizes)
        lv.sizes.append([round_block(nbytes)] if include_inputs else [])
        cons = graph.input_consumers.get(t.name, [])
        lv.alloc_at.append(0)
        lv.last_use.append(max(cons) if cons else -1)
        for c in cons:
            lv.consumers_of_input.setdefault(c, []).append(sid)


def _node_storages(graph: OperatorGraph, preds: list[list[int]], lv: _Lives,
                   inplace: frozenset[int] = frozenset(), copy_views: frozenset[int] = frozenset(),
                   inplace_on: "dict[int, int] | None" = None) -> None:
    """One storage per computing node (and per view of ``copy_views``, which eager runs as a copy); a view
    (or an in-place activation of ``inplace``) aliases its first live producer's (or its input's) storage, a node
    of ``inplace_on`` the storage of the producer it names (``attn.add_(mask)``: the scores')."""
    inplace_on = inplace_on or {}
    for node in graph.nodes:
        i = node.index
        if node.is_constant:
            continue
        if (node.op_class == "view" and i not in copy_views) or i in inplace or i in inplace_on:
            live_preds = [p for p in ([inplace_on[i]] if i in inplace_on else preds[i]) if lv.storage_of[p] is not None]
            if live_preds:
                lv.storage_of[i] = lv.storage_of[live_preds[0]]
            elif lv.consumers_of_input.get(i):
                lv.storage_of[i] = lv.consumers_of_input[i][0]
            continue
        sid = len(lv.sizes)
        lv.sizes.append(_output_blocks(graph, i) if node.op_class != "view"
                        else [round_block(node.output_elements * dtype_bytes(node.output_dtype))])
        lv.alloc_at.append(i)
        lv.last_use.append(i)
        lv.storage_of[i] = sid


def _extend_lives(graph: OperatorGraph, preds: list[list[int]], lv: _Lives) -> None:
    """Extend lives through consumers (and through views, which alias); outputs live until the end."""
    for node in graph.nodes:
        i = node.index
        for p in preds[i]:
            s = lv.storage_of[p]
            if s is not None:
                lv.last_use[s] = max(lv.last_use[s], i)
        for s in lv.consumers_of_input.get(i, []):
            lv.last_use[s] = max(lv.last_use[s], i)
    for o in graph.outputs:
        s = lv.storage_of[o]
        if s is not None:
            lv.last_use[s] = graph.num_nodes


def _peak(lv: _Lives, n: int) -> MemoryBreakdown:
    """Live bytes after each of the ``n`` nodes, per allocator pool too, and the peak they reach."""
    delta = np.zeros(n + 2)
    pools = np.zeros((3, n + 2))
    for s, blocks in enumerate(lv.sizes):
        if lv.last_use[s] < lv.alloc_at[s]:
            continue  # an input nobody reads
        a, e = lv.alloc_at[s], min(lv.last_use[s], n - 1)
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


# ------------------------------------------------------------------ many graphs at once
@dataclass
class _Storages:
    """The storages of a stack of graphs (global ids: the inputs of every graph, then the nodes' outputs).

    ``alloc``/``last`` are node indices within the storage's graph; ``storage_of`` is ``-1`` for a node with no
    storage of its own nor aliased; ``pair_node``/``pair_sid`` list each (consumer node, input storage)."""

    graph: np.ndarray
    alloc: np.ndarray
    last: np.ndarray
    blk_sid: np.ndarray
    blk: np.ndarray
    storage_of: np.ndarray
    pair_node: np.ndarray
    pair_sid: np.ndarray


_SPEC_INPUTS: dict[object, tuple[tuple[str, int], ...]] = {}
_BLOCKS: dict[tuple[object, ...], list[int]] = {}
_MEMO_MAX = 65536


def _spec_inputs(graph: OperatorGraph) -> tuple[tuple[str, int], ...]:
    """``(name, bytes)`` of each model input, in the spec's order (memoised by the spec's value)."""
    spec = graph.spec
    out = _SPEC_INPUTS.get(spec)
    if out is None:
        out = tuple((t.name, math.prod((spec.batch_size, *t.shape)) * dtype_bytes(spec.tensor_dtype(t)))
                    for t in spec.tensors)
        if len(_SPEC_INPUTS) >= _MEMO_MAX:
            _SPEC_INPUTS.clear()
        _SPEC_INPUTS[spec] = out
    return out


def _node_blocks(node: OpNode) -> list[int]:
    """:func:`_output_blocks` of a node with several outputs (memoised by shapes, dtype and bytes)."""
    key = (node.output_shapes, node.output_dtype, node.bytes_written)
    out = _BLOCKS.get(key)
    if out is None:
        per_elem = dtype_bytes(node.output_dtype)
        sizes = [math.prod(s) * per_elem for s in node.output_shapes]
        total = sum(sizes)
        if total != node.bytes_written and total > 0:
            sizes = [int(round(node.bytes_written * s / total)) for s in sizes]
        out = [round_block(s) for s in sizes]
        if len(_BLOCKS) >= _MEMO_MAX:
            _BLOCKS.clear()
        _BLOCKS[key] = out
    return out


def _round_blocks(nbytes: np.ndarray) -> np.ndarray:
    """:func:`round_block` of each entry (int64)."""
    return np.where(nbytes > 0, (nbytes + (K_MIN_BLOCK - 1)) // K_MIN_BLOCK * K_MIN_BLOCK, 0)


def _first_per_sorted(keys: np.ndarray) -> np.ndarray:
    """Positions of the first entry of each run of equal values in the sorted ``keys``."""
    if not keys.size:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])


def _storages(st: GraphStack, include_inputs: bool, inplace: np.ndarray | None = None) -> _Storages:
    """Storages, their blocks, the view aliases and the last uses of a stack (the first half of
    :func:`activation_liveness`, over all graphs at once)."""
    offsets = st.offsets
    in_graph: list[int] = []
    in_last: list[int] = []
    in_bytes: list[int] = []
    pair_node: list[int] = []
    pair_sid: list[int] = []
    for gi, g in enumerate(st.graphs):
        off = int(offsets[gi])
        for name, nbytes in _spec_inputs(g):
            sid = len(in_graph)
            cons = g.input_consumers.get(name, [])
            in_graph.append(gi)
            in_last.append(max(cons) if cons else -1)
            in_bytes.append(nbytes)
            pair_node.extend([off + c for c in cons])
            pair_sid.extend([sid] * len(cons))
    n_in = len(in_graph)
    view = st.is_class("view") if inplace is None else st.is_class("view") | inplace
    owner = ~st.is_constant & ~view
    owners = np.flatnonzero(owner)
    storage_of = np.full(st.num_nodes, -1, dtype=np.int64)
    storage_of[owners] = n_in + np.arange(owners.size)
    graph = np.concatenate([np.asarray(in_graph, dtype=np.int64), st.graph_of[owners]])
    alloc = np.concatenate([np.zeros(n_in, dtype=np.int64), st.local[owners]])
    last = np.concatenate([np.asarray(in_last, dtype=np.int64), st.local[owners]])
    # blocks: one per input (when counted), one per single-output node, the memoised split of the others
    single = owners[st.num_outputs[owners] <= 1]
    multi = owners[st.num_outputs[owners] > 1]
    multi_blocks = [_node_blocks(st.nodes[i]) for i in multi.tolist()]
    in_sids = np.arange(n_in, dtype=np.int64) if include_inputs else np.zeros(0, dtype=np.int64)
    in_blk = _round_blocks(np.asarray(in_bytes, dtype=np.int64)) if include_inputs else np.zeros(0, dtype=np.int64)
    blk_sid = np.concatenate([in_sids, storage_of[single],
                              np.repeat(storage_of[multi], [len(b) for b in multi_blocks])]).astype(np.int64)
    blk = np.concatenate([in_blk, _round_blocks(st.bytes_written[single]),
                          np.fromiter((b for bs in multi_blocks for b in bs), dtype=np.int64)]).astype(np.int64)
    pn = np.asarray(pair_node, dtype=np.int64)
    ps = np.asarray(pair_sid, dtype=np.int64)
    _alias_views(st, view & ~st.is_constant, storage_of, pn, ps)
    # lives extend through consumers (and through views, which alias); outputs live to the end
    s = storage_of[st.src]
    ok = s >= 0
    np.maximum.at(last, s[ok], st.local[st.dst[ok]])
    np.maximum.at(last, ps, st.local[pn])
    outs = np.fromiter((int(offsets[gi]) + o for gi, g in enumerate(st.graphs) for o in g.outputs), dtype=np.int64)
    so = storage_of[outs]
    last[so[so >= 0]] = st.sizes[st.graph_of[outs[so >= 0]]]
    return _Storages(graph, alloc, last, blk_sid, blk, storage_of, pn, ps)


def _alias_views(st: GraphStack, views: np.ndarray, storage_of: np.ndarray, pair_node: np.ndarray,
                 pair_sid: np.ndarray) -> None:
    """A view's storage (in place): that of its first producer with one, else that of the first model input it
    reads, else none; iterated until no view changes (a chain of views takes one round per view)."""
    vids = np.flatnonzero(views)
    if not vids.size:
        return
    fallback = np.full(st.num_nodes, -1, dtype=np.int64)
    u, idx = np.unique(pair_node, return_index=True)  # the pairs list a graph's inputs in the spec's order
    fallback[u] = pair_sid[idx]
    sel = views[st.dst]
    vsrc, vdst = st.src[sel], st.dst[sel]
    while True:
        s = storage_of[vsrc]
        ok = s >= 0
        d_ok, s_ok = vdst[ok], s[ok]
        got = np.full(st.num_nodes, -1, dtype=np.int64)
        f = _first_per_sorted(d_ok)
        got[d_ok[f]] = s_ok[f]
        new = np.where(got[vids] >= 0, got[vids], fallback[vids])
        if np.array_equal(new, storage_of[vids]):
            return
        storage_of[vids] = new



def _retain_many(st: GraphStack, lv: _Storages) -> None:
    """:func:`_retain` over a stack: extend ``lv.last`` in place by the two eager-retention rules."""
    size = np.bincount(lv.blk_sid, weights=lv.blk, minlength=lv.graph.size)  # integers, exact in float64
    pos, cs = _cuts_many(st, lv)
    if not pos.size:
        return
    joins = _joins(st, lv)
    kc = pos.size
    cg = st.graph_of[pos]
    lpos = st.local[pos]
    first_of_graph = np.r_[True, cg[1:] != cg[:-1]]
    new_last = lv.last.copy()
    # skip sources: cuts whose storage a join reads after the cut and no later than its last use
    rd_ok = joins[st.dst] & (lv.storage_of[st.src] >= 0)
    m = int(st.sizes.max()) + 2
    rkey = sorted_unique(lv.storage_of[st.src[rd_ok]] * m + st.local[st.dst[rd_ok]])
    i = np.searchsorted(rkey, cs * m + lpos, side="right")
    hit = rkey[np.minimum(i, max(rkey.size - 1, 0))] if rkey.size else np.zeros(kc, dtype=np.int64)
    lim = np.minimum(lv.last[cs], st.sizes[cg] - 1)
    skip = (i < rkey.size) & (hit // m == cs) & (hit % m <= lim)
    csize = size[cs]
    new_run = first_of_graph | np.r_[True, csize[1:] != csize[:-1]]
    run = np.cumsum(new_run)
    # block input: a cut read by a join lives until the next skip source of its run, else the cut after the join
    idx = np.arange(kc)
    nxt_incl = np.minimum.accumulate(np.where(skip, idx, kc)[::-1])[::-1]
    nxt = nxt_incl
    same = (nxt < kc) & (run[np.minimum(nxt, kc - 1)] == run)
    last_in_graph = np.r_[first_of_graph[1:], True]
    end = np.where(same, lpos[np.minimum(nxt, kc - 1)], lpos[np.minimum(idx + 1, kc - 1)])
    cut_of = np.full(st.num_nodes, -1, dtype=np.int64)
    eligible = joins[pos] & ~last_in_graph
    cut_of[pos[eligible]] = idx[eligible]
    k = cut_of[st.dst]
    s = lv.storage_of[st.src]
    in_cut = np.zeros(lv.graph.size, dtype=bool)
    in_cut[cs] = True
    sel = (k >= 0) & (s >= 0)
    sel[sel] &= (s[sel] != cs[k[sel]]) & in_cut[s[sel]]
    np.maximum.at(new_last, s[sel], end[k[sel]])
    # stage input: in a run of equal-sized cuts, the cut before the first residual block lives to the run's end
    jc = np.r_[0, np.cumsum(joins)]
    residual = ~first_of_graph
    residual[1:] &= (jc[pos[1:] + 1] - jc[pos[:-1] + 1]) > 0
    starts = np.flatnonzero(new_run)
    ends = np.r_[starts[1:], kc] - 1
    first_res = np.minimum.reduceat(np.where(residual, idx, kc), starts)
    found = first_res <= ends
    sv = cs[first_res[found] - 1]
    np.maximum.at(new_last, sv, lpos[ends[found]])
    lv.last[:] = new_last


def _cuts_many(st: GraphStack, lv: _Storages) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_cuts` over a stack: the global node and the storage of each cut, graph after graph."""
    n_g = st.sizes
    seg = st.offsets + np.arange(st.offsets.size)  # n + 1 slots per graph
    a, e = lv.alloc, np.minimum(lv.last, n_g[lv.graph])
    size = np.bincount(lv.blk_sid, weights=lv.blk, minlength=lv.graph.size)
    gmax = np.zeros(st.num_graphs)
    np.maximum.at(gmax, lv.graph, size)
    live = (e > a) & ((size >= gmax[lv.graph] * _CUT_SMALL_SHARE) | (size == 0))
    delta = np.bincount(np.r_[seg[lv.graph[live]] + a[live], seg[lv.graph[live]] + e[live]],
                        weights=np.r_[np.ones(int(live.sum())), -np.ones(int(live.sum()))],
                        minlength=int(seg[-1]))
    across = np.cumsum(delta)[seg[st.graph_of] + st.local]
    s = lv.storage_of
    sv = np.maximum(s, 0)
    small = (size > 0) & (size < gmax[lv.graph] * _CUT_SMALL_SHARE)
    cand = (s >= 0) & (st.local < n_g[st.graph_of] - 1) & (across == 1) & (lv.alloc[sv] <= st.local) \
        & (st.local < lv.last[sv]) & ~small[sv]
    pos = np.flatnonzero(cand)
    cs = s[pos]
    g = st.graph_of[pos]
    keep = np.r_[(cs[1:] != cs[:-1]) | (g[1:] != g[:-1]), True] if pos.size else np.zeros(0, dtype=bool)
    return pos[keep], cs[keep]


def _joins(st: GraphStack, lv: _Storages) -> np.ndarray:
    """``[N]`` bool: nodes that read two or more storages (their producers' and model inputs)."""
    s = lv.storage_of[st.src]
    ok = s >= 0
    pairs = sorted_unique(st.dst[ok] * lv.graph.size + s[ok])
    count = np.bincount(pairs // lv.graph.size, minlength=st.num_nodes)
    count += np.bincount(lv.pair_node, minlength=st.num_nodes)
    return count >= 2


def _breakdowns(st: GraphStack, lv: _Storages) -> list[MemoryBreakdown]:
    """The live bytes, pools and peaks of each graph from its storages' lives."""
    n_g = st.sizes
    seg = st.offsets + np.arange(st.offsets.size)  # n + 1 slots per graph
    b_ok = lv.last[lv.blk_sid] >= lv.alloc[lv.blk_sid]
    sid, blk = lv.blk_sid[b_ok], lv.blk[b_ok]
    g = lv.graph[sid]
    a = seg[g] + lv.alloc[sid]
    e1 = seg[g] + np.minimum(lv.last[sid], n_g[g] - 1) + 1
    at = np.r_[a, e1]
    total = int(seg[-1])
    bf = blk.astype(np.float64)
    live = np.cumsum(np.bincount(at, weights=np.r_[bf, -bf], minlength=total))
    pool = np.where(blk <= K_SMALL_SIZE, 0, np.where(blk < K_MIN_LARGE_ALLOC, 1, 2))
    pb = np.where(pool == 2, (blk + (K_ROUND_LARGE - 1)) // K_ROUND_LARGE * K_ROUND_LARGE, blk).astype(np.float64)
    pools = np.cumsum(np.bincount(np.r_[pool, pool] * total + at, weights=np.r_[pb, -pb],
                                  minlength=3 * total).reshape(3, total), axis=1)
    out = []
    for gi in range(st.num_graphs):
        n = int(n_g[gi])
        if n == 0:
            out.append(MemoryBreakdown(0, 0, -1, np.zeros(0), np.zeros((3, 0))))
            continue
        lo = int(seg[gi])
        lg = live[lo:lo + n].copy()  # each graph's own arrays: a cached breakdown does not hold the batch's
        pl = pools[:, lo:lo + n].copy()
        peak = int(np.argmax(lg))
        allocated = int(lg[peak])
        reserved = _reserved([float(x) for x in pl.max(1)])
        out.append(MemoryBreakdown(allocated, int(max(reserved, allocated)), peak, lg, pl))
    return out


def activation_liveness_many(graphs: Sequence[OperatorGraph], *, retention: bool = False,
                             include_inputs: bool = True, stack: GraphStack | None = None) -> list[MemoryBreakdown]:
    """:func:`activation_liveness` of every graph, computed over all of them at once (whole-stack array
    operations instead of a Python pass per node); equal to the per-graph result.

    Args:
        graphs: the captured graphs.
        retention, include_inputs: as for :func:`activation_liveness`.
        stack: :func:`~dippm_nas.graph.stack_graphs` of ``graphs`` when the caller has it.

    Returns:
        one :class:`MemoryBreakdown` per graph, in order.
    """
    if retention and any(g.has_provenance for g in graphs):  # the provenance rules: one graph at a time
        return [activation_liveness(g, retention=True, include_inputs=include_inputs) for g in graphs]
    st = stack if stack is not None else stack_graphs(graphs)
    if not st.num_graphs:
        return []
    if not retention:
        return _remembered(st, _storages(st, include_inputs))
    rules = [_frame_rules(g) if g.num_nodes else _FrameRules((), ()) for g in st.graphs]
    inplace = np.zeros(st.num_nodes, dtype=bool)
    inplace[np.fromiter((int(st.offsets[gi]) + i for gi, r in enumerate(rules) for i in r.inplace),
                        dtype=np.int64)] = True
    lv = _storages(st, include_inputs, inplace)
    _retain_many(st, lv)
    ext = np.array([(int(st.offsets[gi]) + p, u) for gi, r in enumerate(rules) for p, u in r.extend],
                   dtype=np.int64).reshape(-1, 2)
    sid = lv.storage_of[ext[:, 0]]
    np.maximum.at(lv.last, sid[sid >= 0], ext[sid >= 0, 1])
    scr = np.array([(gi, i, b) for gi, r in enumerate(rules) for i, b in r.scratch]
                   + [(gi, m, round_block(nd.output_elements * dtype_bytes(nd.output_dtype)))
                      for gi, r in enumerate(rules) for m, q in r.copies for nd in (st.graphs[gi].nodes[q],)],
                   dtype=np.int64).reshape(-1, 3)
    if scr.size:
        new_sid = lv.graph.size + np.arange(scr.shape[0], dtype=np.int64)
        lv.graph = np.r_[lv.graph, scr[:, 0]]
        lv.alloc = np.r_[lv.alloc, scr[:, 1]]
        lv.last = np.r_[lv.last, scr[:, 1]]
        lv.blk_sid = np.r_[lv.blk_sid, new_sid]
        lv.blk = np.r_[lv.blk, scr[:, 2]]
    return _remembered(st, lv)


def _remembered(st: GraphStack, lv: _Storages) -> list[MemoryBreakdown]:
    """Each graph's breakdown, its blocks kept with it for :func:`gpu_memory_parts_many`'s replay."""
    out = _breakdowns(st, lv)
    for mem, lives in zip(out, _split_block_lives(st, lv)):
        if mem.peak_node >= 0:  # an empty graph's breakdown is not its own (nothing to replay)
            _remember_storages(mem, lives)
    return out


def _split_block_lives(st: GraphStack, lv: _Storages) -> list[_BlockLives]:
    """Each graph's :class:`_BlockLives` from a stack's storages (global storage ids keep each graph's order:
    inputs, nodes, scratch, copies)."""
    sid = lv.blk_sid
    keep = (lv.blk > 0) & (lv.last[sid] >= lv.alloc[sid])
    order = np.flatnonzero(keep)
    order = order[np.lexsort((sid[order], lv.graph[sid[order]]))]  # stable: a storage's blocks stay in order
    sid = sid[order]
    g = lv.graph[sid]
    cut = np.searchsorted(g, np.arange(st.num_graphs + 1)).tolist()
    blk, alloc, last = lv.blk[order], lv.alloc[sid], lv.last[sid]
    return [_BlockLives(blk[a:b], sid[a:b], alloc[a:b], last[a:b]) for a, b in zip(cut[:-1], cut[1:])]


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
        allocator_overhead_mib: reserved minus the parts above: the segments' rounding and the whole blocks
            unsplit requests take.
        total_mib: the sum: what ``nvidia-smi`` would show for the process (context + reserved).
        allocated_mib: ``torch.cuda.max_memory_allocated`` (weights + input + activations + workspaces, in the
            caching allocator's whole blocks; :func:`~dippm_nas.prior.simulate_caching_allocator`).
        reserved_mib: ``torch.cuda.max_memory_reserved`` (the segments the simulated allocator holds at the end).
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
                     cublas_workspace_mib: float, uses_cublas: bool, uses_cudnn: bool,
                     allocator: AllocatorConfig | None = None) -> MemoryParts:
    """Memory parts of one forward pass on a GPU, with the caching allocator's pools shared by all of them.

    ``liveness`` must come from :func:`activation_liveness` with ``retention=True, include_inputs=False`` (the
    input is a part of its own). ``allocated_mib`` and ``reserved_mib`` are what the caching allocator's
    statistics would read (:func:`~dippm_nas.prior.simulate_caching_allocator` over the pass's allocations and
    frees, :func:`~dippm_nas.prior.allocation_events`): the weights (one block per tensor) and the input first,
    the cuBLAS workspace at the first GEMM, then the activations' storages in eager order, with the allocator's
    settings ``allocator`` (default: PyTorch's). The activations' storages are those ``liveness`` was computed
    from (kept with each breakdown :func:`activation_liveness` or :func:`activation_liveness_many` returns, so
    under ``autocast`` at their run-time dtypes); for a breakdown made otherwise, :func:`storage_lives` of ``graph``.

    The standard deviation adds in quadrature: the activation peak times :func:`_activation_rel_sigma` of
    ``graph`` (measured against the eager reference: :data:`ACTIVATION_REL_SIGMA_PROVENANCE` for a graph with
    provenance, :data:`ACTIVATION_REL_SIGMA` for one without), the context times :data:`CONTEXT_REL_SIGMA`, the cuDNN
    allowance :data:`CUDNN_WORKSPACE_SIGMA_MIB` (graphs with convolutions) and the rounding times
    :data:`ALLOCATOR_REL_SIGMA`; weights, input and the cuBLAS workspace are taken as exact.
    """
    spec = graph.spec
    weights = _weight_blocks(graph)
    inputs = [round_block(math.prod((spec.batch_size, *t.shape)) * dtype_bytes(spec.tensor_dtype(t)))
              for t in spec.tensors]
    ws = [round_block(int(cublas_workspace_mib * BYTES_PER_MIB))] if uses_cublas and cublas_workspace_mib > 0 else []
    peak = _simulate(graph, liveness, [*weights, *inputs], sum(ws), allocator)
    return _parts(sum(weights), sum(inputs), sum(ws), peak, liveness, context_mib, uses_cudnn,
                  _activation_rel_sigma(graph))


def _activation_rel_sigma(graph: OperatorGraph) -> float:
    """Relative standard deviation of ``graph``'s predicted activation peak: :data:`ACTIVATION_REL_SIGMA_PROVENANCE`
    where it carries provenance (:attr:`~dippm_nas.graph.OperatorGraph.has_provenance`, the provenance rules
    price it), :data:`ACTIVATION_REL_SIGMA` where it does not (the structural rules alone)."""
    return ACTIVATION_REL_SIGMA_PROVENANCE if graph.has_provenance else ACTIVATION_REL_SIGMA


def _simulate(graph: OperatorGraph, liveness: MemoryBreakdown, held: "Sequence[int]", ws: int,
              allocator: AllocatorConfig | None) -> AllocatorPeak:
    """The caching allocator's peaks over one eager pass of ``graph``: ``held`` (weights, input) first, the cuBLAS
    workspace ``ws`` at the first GEMM, then the activations' storages ``liveness`` was computed from, in order
    (:func:`storage_lives` of ``graph`` for a breakdown made elsewhere)."""
    return _simulate_many([graph], [liveness], [np.asarray(held, dtype=np.int64)], [ws], allocator)[0]


def _first_gemm(graph: OperatorGraph) -> int:
    """Node index of the first matmul or attention (0 when none): where the cuBLAS workspace is allocated."""
    return next((nd.index for nd in graph.nodes if nd.op_class in ("matmul", "attention") and not nd.is_constant), 0)


def _simulate_many(graphs: "Sequence[OperatorGraph]", livenesses: "Sequence[MemoryBreakdown]",
                   held: "Sequence[np.ndarray]", ws: "Sequence[int]", allocator: AllocatorConfig | None,
                   ) -> list[AllocatorPeak]:
    """:func:`_simulate` of each graph: the events of :func:`~dippm_nas.prior.allocation_events` (same order;
    other keys) built for all graphs by one sort, then replayed graph by graph."""
    lives = [_storages_of(g, m) for g, m in zip(graphs, livenesses)]
    n = np.fromiter((g.num_nodes for g in graphs), dtype=np.int64, count=len(graphs))
    nb = np.fromiter((lv.blk.size for lv in lives), dtype=np.int64, count=len(lives))
    nh = np.fromiter((h.size for h in held), dtype=np.int64, count=len(held))
    bg = np.repeat(np.arange(len(graphs), dtype=np.int64), nb)
    blk = np.concatenate([lv.blk for lv in lives] + [np.zeros(0, np.int64)])
    sid = np.concatenate([lv.sid for lv in lives] + [np.zeros(0, np.int64)])
    alloc = np.concatenate([lv.alloc for lv in lives] + [np.zeros(0, np.int64)])
    last = np.concatenate([lv.last for lv in lives] + [np.zeros(0, np.int64)])
    hg = np.repeat(np.arange(len(graphs), dtype=np.int64), nh)
    hb = np.concatenate(list(held) + [np.zeros(0, np.int64)])
    wsb = np.asarray(ws, dtype=np.int64)
    wg = np.flatnonzero((wsb > 0) & (n > 0))
    fr = last < n[bg]  # storages read to the end are not freed
    hk = np.arange(hb.size, dtype=np.int64)
    bk = hb.size + np.arange(blk.size, dtype=np.int64)
    # one row per event: (graph, node, 0 workspace / 1 allocation / 2 free, storage, key); held first (node -1)
    graph = np.concatenate([hg, wg, bg, bg[fr]])
    node = np.concatenate([np.full(hb.size, -1), [_first_gemm(graphs[g]) for g in wg.tolist()], alloc, last[fr]])
    sub = np.concatenate([np.zeros(hb.size + wg.size, np.int64), np.ones(blk.size, np.int64),
                          np.full(int(fr.sum()), 2)])
    st_ = np.concatenate([hk, np.zeros(wg.size, np.int64), sid, sid[fr]])
    key = np.concatenate([hk, hb.size + blk.size + wg, bk, bk[fr]])
    nbytes = np.concatenate([hb, wsb[wg], blk, np.zeros(int(fr.sum()), np.int64)])
    ok = (nbytes > 0) | (sub == 2)
    order = np.flatnonzero(ok)
    order = order[np.lexsort((key[order], st_[order], sub[order], node[order], graph[order]))]
    cut = np.searchsorted(graph[order], np.arange(len(graphs) + 1)).tolist()
    keys, sizes = key[order].tolist(), nbytes[order].tolist()
    return [_replay_pairs(zip(keys[a:b], sizes[a:b]), allocator) for a, b in zip(cut[:-1], cut[1:])]


def _parts(weights: int, inputs: int, ws: int, peak: AllocatorPeak, liveness: MemoryBreakdown,
           context_mib: float, uses_cudnn: bool, act_rel_sigma: float) -> MemoryParts:
    """:class:`MemoryParts` from the bytes of the weights, input and cuBLAS workspace, the caching allocator's
    peaks (:func:`~dippm_nas.prior.simulate_caching_allocator`), the liveness pass and the activation peak's
    relative σ (:func:`_activation_rel_sigma`)."""
    parts_sum = float(weights + inputs + ws + liveness.peak_allocated_bytes)
    allocated = max(float(peak.allocated_bytes), parts_sum)
    reserved = max(float(peak.reserved_bytes), allocated)
    allocated_over = allocated - parts_sum  # whole blocks an unsplit request takes beyond its 512 B rounding
    act_mib = liveness.peak_allocated_bytes / BYTES_PER_MIB
    overhead_mib = (reserved - allocated + allocated_over) / BYTES_PER_MIB
    std_parts = {
        "activations_mib": act_rel_sigma * act_mib,
        "context_mib": CONTEXT_REL_SIGMA * context_mib,
        "cudnn_workspace_mib": CUDNN_WORKSPACE_SIGMA_MIB if uses_cudnn else 0.0,
        "allocator_mib": ALLOCATOR_REL_SIGMA * overhead_mib,
    }
    return MemoryParts(
        context_mib=float(context_mib), weights_mib=weights / BYTES_PER_MIB, input_mib=inputs / BYTES_PER_MIB,
        activations_peak_mib=act_mib, cublas_workspace_mib=ws / BYTES_PER_MIB, cudnn_workspace_mib=0.0,
        allocator_overhead_mib=overhead_mib, total_mib=float(context_mib) + reserved / BYTES_PER_MIB,
        allocated_mib=allocated / BYTES_PER_MIB, reserved_mib=reserved / BYTES_PER_MIB,
        std_mib=math.sqrt(sum(v * v for v in std_parts.values())), std_parts_mib=std_parts,
        peak_node=liveness.peak_node,
    )


_PARAM_ELEMS: dict[tuple[int, int], tuple[object, object, tuple[int, ...]]] = {}


def _param_elems(node: OpNode) -> tuple[int, ...]:
    """Elements of each weight tensor ``node`` reads (memoised by the identity of its shapes and flags, which
    the memo holds: assembled graphs share their blocks' objects)."""
    shapes, par = node.input_shapes, node.input_is_param
    hit = _PARAM_ELEMS.get((id(shapes), id(par)))
    if hit is None or hit[0] is not shapes or hit[1] is not par:
        if len(_PARAM_ELEMS) >= _MEMO_MAX:
            _PARAM_ELEMS.clear()
        hit = (shapes, par, tuple(math.prod(s) for s, p in zip(shapes, par) if p and len(s) > 0))
        _PARAM_ELEMS[(id(shapes), id(par))] = hit
    return hit[2]


def _weight_blocks_many(st: GraphStack) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_weight_blocks` of every graph of a stack: ``(graph of each block, block bytes)``."""
    nodes = st.nodes
    elems = [_param_elems(nodes[i]) for i in np.flatnonzero(~st.is_constant).tolist()]
    counts = np.fromiter(map(len, elems), dtype=np.int64, count=len(elems))
    g_of = np.repeat(st.graph_of[~st.is_constant], counts)
    raw = np.fromiter(chain.from_iterable(elems), dtype=np.int64, count=int(counts.sum()))
    per = np.fromiter((dtype_bytes(g.spec.dtype) for g in st.graphs), dtype=np.int64, count=st.num_graphs)
    raw = raw * per[g_of]
    total = np.bincount(g_of, weights=raw, minlength=st.num_graphs)  # integers, exact in float64
    pb = np.fromiter((g.param_bytes for g in st.graphs), dtype=np.int64, count=st.num_graphs)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(total > 0, pb / np.where(total > 0, total, 1.0), 0.0)
    scaled = raw * scale[g_of]
    keep = (scaled >= 1) & (pb[g_of] > 0) & (total[g_of] > 0)
    out_g = [g_of[keep]]
    out_b = [_round_blocks(scaled[keep].astype(np.int64))]
    whole = (pb > 0) & (total <= 0)  # no weight shapes to split the bytes by: one block
    if whole.any():
        out_g.append(np.flatnonzero(whole))
        out_b.append(_round_blocks(pb[whole]))
    return np.concatenate(out_g), np.concatenate(out_b)


def gpu_memory_parts_many(graphs: Sequence[OperatorGraph], livenesses: Sequence[MemoryBreakdown], *,
                          context_mib: float, cublas_workspace_mib: float, uses_cublas: Sequence[bool],
                          uses_cudnn: Sequence[bool], stack: GraphStack | None = None,
                          allocator: AllocatorConfig | None = None) -> list[MemoryParts]:
    """:func:`gpu_memory_parts` of every graph (one device), the weights' blocks computed over all graphs at
    once; equal to the per-graph result.

    Args:
        graphs: the graphs.
        livenesses: each graph's :func:`activation_liveness` (``include_inputs=False``), e.g. from
            :func:`activation_liveness_many`.
        context_mib, cublas_workspace_mib: the device's, as for :func:`gpu_memory_parts`.
        uses_cublas, uses_cudnn: per graph, as for :func:`gpu_memory_parts`.
        stack: :func:`~dippm_nas.graph.stack_graphs` of ``graphs`` when the caller has it.
        allocator: the caching allocator's settings, as for :func:`gpu_memory_parts`.
    """
    st = stack if stack is not None else stack_graphs(graphs)
    g_n = st.num_graphs
    if not (len(livenesses) == len(uses_cublas) == len(uses_cudnn) == g_n):
        raise InvalidValueError(f"one liveness and flag per graph: {g_n} graphs, {len(livenesses)} livenesses, "
                         f"{len(uses_cublas)} and {len(uses_cudnn)} flags")
    if not g_n:
        return []
    wg, wb = _weight_blocks_many(st)
    ins = [[round_block(b) for _, b in _spec_inputs(g)] for g in st.graphs]
    ws_blk = round_block(int(cublas_workspace_mib * BYTES_PER_MIB)) if cublas_workspace_mib > 0 else 0
    ws = np.where(np.asarray(uses_cublas, dtype=bool), ws_blk, 0).astype(np.int64)
    ig = np.repeat(np.arange(g_n), [len(b) for b in ins])
    bg = np.concatenate([wg, ig, np.flatnonzero(ws)]).astype(np.int64)
    blk = np.concatenate([wb, np.fromiter(chain.from_iterable(ins), dtype=np.int64, count=ig.size),
                          ws[ws > 0]]).astype(np.int64)
    order = np.argsort(bg[: wg.size + ig.size], kind="stable")  # weights then inputs, per graph
    held_g = bg[order]
    held_b = blk[order]
    cut = np.searchsorted(held_g, np.arange(g_n + 1))
    w_sum = np.bincount(wg, weights=wb, minlength=g_n).astype(np.int64).tolist()
    peaks = _simulate_many(st.graphs, livenesses, [held_b[cut[g]:cut[g + 1]] for g in range(g_n)], ws.tolist(),
                           allocator)
    return [_parts(w_sum[g], sum(ins[g]), int(ws[g]), peaks[g], livenesses[g], context_mib, bool(uses_cudnn[g]),
                   _activation_rel_sigma(st.graphs[g])) for g in range(g_n)]
