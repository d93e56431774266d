"""The caching-allocator simulation against an independent re-implementation of PyTorch's rules, hand-worked
sequences, the workspace and module-loading rules, and its use in the GPU memory parts."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from dippm_nas.dataset import iter_jsonl
from dippm_nas.errors import InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.spec import InputSpec, dtype_bytes
from dippm_nas.prior import (AllocatorConfig, AllocEvent, activation_liveness, activation_liveness_many,
                             allocation_events, cublas_workspace_bytes, cublaslt_workspace_bytes, cuda_module_loading,
                             gpu_memory_parts, gpu_memory_parts_many, round_block, round_request, segment_bytes,
                             simulate_caching_allocator, storage_lives)
from prior.test_memory_parts import residual_graph

MIB = 2**20


# ----------------------------------------------------------------------------- an independent reference
class _Ref:
    """PyTorch's rules written differently: segments as address-ordered lists of [offset, size, used] intervals;
    the best fit found by scanning every free interval; no expandable segments."""

    def __init__(self, mss: int | None) -> None:
        self.segs: list[tuple[bool, list[list[int]]]] = []  # (small pool?, intervals)
        self.mss = mss if mss is not None else 1 << 64
        self.allocated = self.reserved = 0
        self.where: dict[int, tuple[int, int]] = {}

    def malloc(self, key: int, n: int) -> None:
        size = max(512, -(-n // 512) * 512)
        small = size <= MIB
        best = None
        for si, (sm, iv) in enumerate(self.segs):
            if sm != small:
                continue
            for k, (off, sz, used) in enumerate(iv):
                if not used and sz >= size:
                    addr = si * (1 << 40) + off
                    if best is None or (sz, addr) < best[0]:
                        best = ((sz, addr), si, k)
        if best is not None:
            sz = best[0][0]
            if (size < self.mss <= sz) or (size >= self.mss and sz >= size + 20 * MIB):
                best = None
        if best is None:
            seg = 2 * MIB if small else (20 * MIB if size < 10 * MIB else -(-size // (2 * MIB)) * 2 * MIB)
            self.segs.append((small, [[0, seg, False]]))
            self.reserved += seg
            si, k = len(self.segs) - 1, 0
        else:
            _, si, k = best
        iv = self.segs[si][1]
        off, sz, _ = iv[k]
        rest = sz - size
        if (rest >= 512) if small else (size < self.mss and rest > MIB):
            iv[k] = [off, size, True]
            iv.insert(k + 1, [off + size, rest, False])
        else:
            iv[k][2] = True
        self.allocated += iv[k][1]
        self.where[key] = (si, off)

    def free(self, key: int) -> None:
        si, off = self.where.pop(key)
        iv = self.segs[si][1]
        k = next(j for j, x in enumerate(iv) if x[0] == off)
        iv[k][2] = False
        self.allocated -= iv[k][1]
        if k + 1 < len(iv) and not iv[k + 1][2]:
            iv[k][1] += iv.pop(k + 1)[1]
        if k > 0 and not iv[k - 1][2]:
            iv[k - 1][1] += iv.pop(k)[1]


def _random_sequence(rng: random.Random, steps: int, max_mib: float) -> list[AllocEvent]:
    alive: list[int] = []
    out, key = [], 0
    for _ in range(steps):
        if alive and rng.random() < 0.45:
            k = alive.pop(rng.randrange(len(alive)))
            out.append(AllocEvent(k, 0))
        else:
            kind = rng.random()
            n = rng.randint(1, 4096) if kind < 0.3 else rng.randint(4096, int(max_mib * MIB))
            out.append(AllocEvent(key, n))
            alive.append(key)
            key += 1
    return out


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mss_mib", [None, 8.0])
def test_simulation_matches_an_independent_reimplementation(seed: int, mss_mib: float | None) -> None:
    rng = random.Random(seed)
    events = _random_sequence(rng, 300, max_mib=rng.choice([3.0, 30.0, 200.0]))
    ref = _Ref(int(mss_mib * MIB) if mss_mib else None)
    peak_alloc = peak_res = 0
    for ev in events:
        if ev.nbytes:
            ref.malloc(ev.key, ev.nbytes)
        else:
            ref.free(ev.key)
        peak_alloc, peak_res = max(peak_alloc, ref.allocated), max(peak_res, ref.reserved)
    got = simulate_caching_allocator(events, AllocatorConfig(max_split_size_mib=mss_mib))
    assert (got.allocated_bytes, got.reserved_bytes) == (peak_alloc, peak_res)


def test_hand_worked_sequence_default_and_expandable() -> None:
    ev = [AllocEvent(0, 3 * MIB), AllocEvent(1, 3 * MIB), AllocEvent(0, 0), AllocEvent(2, 2 * MIB),
          AllocEvent(3, 100), AllocEvent(4, int(19.5 * MIB))]
    # default: 3 MiB -> a 20 MiB segment split; the 2 MiB request takes the freed 3 MiB block unsplit (1 MiB left,
    # not more than 1 MiB); 100 B -> a 2 MiB small segment, 512 B block; 19.5 MiB -> its own 20 MiB segment, unsplit
    p = simulate_caching_allocator(ev)
    assert p.allocated_bytes == (3 + 3 + 20) * MIB + 512
    assert p.reserved_bytes == (20 + 20 + 2) * MIB
    assert p.segments == 3 and p.peak_event == 5
    assert p.requested_bytes == 3 * MIB + 2 * MIB + 100 + int(19.5 * MIB)
    # expandable: one large segment grows by 20 MiB pages, every split kept at 512 B
    e = simulate_caching_allocator(ev, AllocatorConfig(expandable_segments=True))
    assert e.allocated_bytes == (3 + 2) * MIB + 512 + int(19.5 * MIB)
    assert e.reserved_bytes == (40 + 2) * MIB
    assert e.pool_reserved_bytes == {"small": 2 * MIB, "large": 40 * MIB}


def test_expandable_segments_reuse_what_cudamalloc_segments_strand() -> None:
    # batch N then N + 1: the larger requests do not fit the freed slightly smaller blocks
    ev, key = [], 0
    for scale in (1.0, 1.05):
        keys = []
        for _ in range(6):
            ev.append(AllocEvent(key, int(30 * MIB * scale)))
            keys.append(key)
            key += 1
        ev += [AllocEvent(k, 0) for k in keys]
    plain = simulate_caching_allocator(ev)
    grown = simulate_caching_allocator(ev, AllocatorConfig(expandable_segments=True))
    assert plain.reserved_bytes > grown.reserved_bytes >= grown.allocated_bytes


def test_rounding_rules() -> None:
    assert round_request(1) == 512 and round_request(513) == 1024
    assert round_request(1200, 4) == 1536  # not above 512 x 4: plain 512 B rounding
    assert round_request(5000, 4) == 5120 and round_request(4096, 4) == 4096
    assert segment_bytes(MIB) == 2 * MIB and segment_bytes(MIB + 512) == 20 * MIB
    assert segment_bytes(10 * MIB) == 10 * MIB and segment_bytes(10 * MIB + 1) == 12 * MIB


def test_bad_sequences_and_settings_are_refused() -> None:
    with pytest.raises(InvalidValueError, match="not alive"):
        simulate_caching_allocator([AllocEvent(0, 0)])
    with pytest.raises(InvalidValueError, match="while alive"):
        simulate_caching_allocator([AllocEvent(0, 10), AllocEvent(0, 10)])
    with pytest.raises(InvalidValueError, match="max_split_size_mib"):
        AllocatorConfig(max_split_size_mib=0.5)
    with pytest.raises(InvalidValueError, match="key:value"):
        AllocatorConfig.from_env("expandable_segments")
    assert AllocatorConfig.from_env("expandable_segments:True,max_split_size_mb:128,backend:native") == \
        AllocatorConfig(expandable_segments=True, max_split_size_mib=128.0)


# ----------------------------------------------------------------------------- workspaces, module loading
def test_cublas_workspace_by_version_architecture_and_environment() -> None:
    assert cublas_workspace_bytes("1.13.1", (8, 0)) == 0
    assert cublas_workspace_bytes("2.1.0", (8, 0)) == (4096 * 2 + 16 * 8) * 1024
    assert cublas_workspace_bytes("2.1.0", (9, 0)) == 32 * MIB
    assert cublas_workspace_bytes("2.10.0", (10, 0)) == (4096 * 2 + 16 * 8) * 1024
    assert cublas_workspace_bytes("2.13.0", (10, 0)) == 32 * MIB
    assert cublas_workspace_bytes("2.13.0", (8, 6), {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == 128 * 1024
    assert cublas_workspace_bytes("2.13.0", (8, 6), {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"}) == \
        (4096 * 2 + 16 * 8) * 1024
    assert cublaslt_workspace_bytes("2.4.0", (8, 0)) == (MIB, False)
    assert cublaslt_workspace_bytes("2.9.0", (8, 0)) == (MIB, True)
    assert cublaslt_workspace_bytes("2.13.0", (8, 0)) == (0, True)
    assert cublaslt_workspace_bytes("2.13.0", (8, 0), {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}) == (MIB, True)
    with pytest.raises(InvalidValueError, match="MAJOR.MINOR"):
        cublas_workspace_bytes("latest", (8, 0))


def test_module_loading() -> None:
    assert cuda_module_loading("1.12.0", "11.3") == "eager"
    assert cuda_module_loading("1.13.0", "11.7") == "eager"
    assert cuda_module_loading("2.1.0", "11.8") == "lazy"
    assert cuda_module_loading("2.1.0", "12.1", {"CUDA_MODULE_LOADING": "EAGER"}) == "eager"


# ----------------------------------------------------------------------------- on graphs
def _events_peak(events: list[AllocEvent]) -> int:
    """The most bytes live at once over the events (each free gives back its allocation's bytes)."""
    live = peak = 0
    size_of: dict[int, int] = {}
    for ev in events:
        if ev.nbytes:
            size_of[ev.key] = ev.nbytes
            live += ev.nbytes
        else:
            live -= size_of.pop(ev.key)
        peak = max(peak, live)
    return peak


def test_events_of_a_graph_reproduce_the_liveness_peak() -> None:
    g = residual_graph(n=(1 << 18) + 100, blocks=4)
    sizes, alloc_at, last_use = storage_lives(g)
    events = allocation_events(sizes, alloc_at, last_use, g.num_nodes)
    peak = _events_peak(events)
    assert peak == activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
    sim = simulate_caching_allocator(events)
    assert sim.allocated_bytes >= peak and sim.reserved_bytes >= sim.allocated_bytes


@pytest.mark.parametrize("which", ["inverted_residual", "dense", "pre_norm", "post_norm", "autocast"])
def test_storage_lives_are_the_retention_liveness_of_captured_models(which: str) -> None:
    import dippm_nas
    from torch import nn

    from prior.test_memory_parts import _ConvStage, _DenseLayer, _InvertedResidual, _PostNorm, _PreNorm, _Stage

    autocast = None
    if which in ("inverted_residual", "dense"):
        model, spec = _ConvStage(_InvertedResidual if which == "inverted_residual" else _DenseLayer), \
            InputSpec(shape=(3, 32, 32), batch_size=16)
    elif which == "autocast":
        model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.ReLU(), nn.Linear(512, 10, bias=False))
        spec, autocast = InputSpec(shape=(256,), batch_size=8), "float16"
    else:
        model, spec = _Stage(_PreNorm if which == "pre_norm" else _PostNorm), InputSpec(shape=(64,), batch_size=512)
    g = dippm_nas.capture(model, spec, cache=False)
    sizes, alloc_at, last_use = storage_lives(g, autocast=autocast)
    want = activation_liveness(g, retention=True, include_inputs=False, autocast=autocast).peak_allocated_bytes
    assert _events_peak(allocation_events(sizes, alloc_at, last_use, g.num_nodes)) == want


_SEARCH_SPACE_DATA = (Path(__file__).resolve().parents[2] / "data" / "host_cpu"
                      / "host_cpu_amd_epyc_f25m17_14fam.jsonl.xz")


@pytest.fixture(scope="module")
def search_space_graphs() -> list[OperatorGraph]:
    if not _SEARCH_SPACE_DATA.exists():
        pytest.skip(f"{_SEARCH_SPACE_DATA} is absent (the repository's host-CPU measurements of the 14 families)")
    rows = (r for r in iter_jsonl(_SEARCH_SPACE_DATA) if r["type"] == "graph")
    return [OperatorGraph.from_dict(r["graph"]) for r in itertools.islice(rows, 0, 600, 4)]  # 150 graphs


@pytest.mark.parametrize("autocast", [None, "float16"])
def test_storage_lives_and_allocator_replay_on_search_space_graphs(search_space_graphs: list[OperatorGraph],
                                                                    autocast: str | None) -> None:
    """On 150 graphs of the 14 search-space families: the storages' peak is the liveness peak, and the memory
    parts' allocator figures are the public replay of those storages (weights and input held, the cuBLAS
    workspace at the first GEMM), per graph and (float32) over all graphs at once."""
    kw = {"context_mib": 700.0, "cublas_workspace_mib": 8.0}
    ws = round_block(8 * MIB)
    for g in search_space_graphs:
        lv = activation_liveness(g, retention=True, include_inputs=False, autocast=autocast)
        lives = storage_lives(g, autocast=autocast)
        assert _events_peak(allocation_events(*lives, g.num_nodes)) == lv.peak_allocated_bytes
        spec = g.spec
        parts = gpu_memory_parts(g, lv, uses_cublas=True, uses_cudnn=True, **kw)
        inputs = [round_block(math.prod((spec.batch_size, *t.shape)) * dtype_bytes(spec.tensor_dtype(t)))
                  for t in spec.tensors]
        weights = _weight_blocks_of(g)
        first_gemm = next((nd.index for nd in g.nodes if nd.op_class in ("matmul", "attention")
                           and not nd.is_constant), 0)
        ref = simulate_caching_allocator(allocation_events(*lives, g.num_nodes, held=[*weights, *inputs],
                                                           workspace_at=first_gemm, workspace_bytes=ws))
        allocated = max(ref.allocated_bytes, sum(weights) + sum(inputs) + ws + lv.peak_allocated_bytes)
        assert parts.allocated_mib == allocated / MIB
        assert parts.reserved_mib == max(ref.reserved_bytes, allocated) / MIB
    if autocast is None:
        gs = search_space_graphs
        many = gpu_memory_parts_many(gs, activation_liveness_many(gs, retention=True, include_inputs=False),
                                     uses_cublas=[True] * len(gs), uses_cudnn=[True] * len(gs), **kw)
        for g, p in zip(gs, many):
            assert p == gpu_memory_parts(g, activation_liveness(g, retention=True, include_inputs=False),
                                         uses_cublas=True, uses_cudnn=True, **kw)


def _weight_blocks_of(g: OperatorGraph) -> list[int]:
    """One block per weight tensor, scaled to ``param_bytes`` (the rule of :func:`gpu_memory_parts`)."""
    raw = [math.prod(sh) * dtype_bytes(g.spec.dtype) for nd in g.nodes if not nd.is_constant
           for sh, par in zip(nd.input_shapes, nd.input_is_param) if par and len(sh) > 0]
    if g.param_bytes <= 0:
        return []
    if sum(raw) <= 0:
        return [round_block(g.param_bytes)]
    scale = g.param_bytes / sum(raw)
    return [round_block(int(b * scale)) for b in raw if b * scale >= 1]
