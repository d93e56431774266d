"""PyTorch's CUDA caching allocator, simulated block by block, and the memory PyTorch holds outside it.

What ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` read after a forward pass depends on the
sequence of tensor allocations and frees, not only on the largest set alive at once: a freed block is cached, a
later request takes the smallest cached block that fits and splits it, a new segment is only asked of CUDA when no
cached block fits. :func:`simulate_caching_allocator` replays a sequence of allocations and frees
(:func:`allocation_events` builds it from the prior's eager liveness, :mod:`dippm_nas.prior._memory`) with
the rules of ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x; read at pytorch/pytorch commit
001074d25084fdb87a799823e395a50f5ec044d3):

- every request is rounded up to 512 B (``kMinBlockSize``; ``round_size``), or to the next of ``N`` divisions
  between powers of two with ``roundup_power2_divisions:N``;
- requests of at most 1 MiB (``kSmallSize``) go to the small pool, the others to the large pool; a new segment
  (``get_allocation_size``) is 2 MiB (``kSmallBuffer``) for a small request, 20 MiB (``kLargeBuffer``) for a request
  under 10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
- the cached block a request takes is the smallest free block of its pool at least as large (ties: the lowest
  address; ``BlockComparatorSize``); with ``max_split_size_mb`` a block at or above that size serves no smaller
  request and a request at or above it only a block less than 20 MiB larger (``get_free_block``);
- a block is split when the rest is at least 512 B (small pool, or ``expandable_segments``) or, in the large pool,
  more than 1 MiB and the request under ``max_split_size`` (``should_split``); a freed block merges with free
  neighbours of its segment (``free_block`` / ``try_merge_blocks``);
- ``allocated`` counts whole blocks (a 19.5 MiB request takes a 20 MiB block unsplit: 20 MiB allocated);
  ``reserved`` counts segments (``cudaMalloc``), which a forward pass never returns (no ``empty_cache``);
- ``expandable_segments:True``: one segment per pool that grows by mapping pages, 2 MiB for the small pool and
  20 MiB for the large one (Note [Expandable Segments]); ``reserved`` is the mapped pages; a request first takes a
  cached block, else the free end of the segment grows by the pages the request lacks (``find_expandable_block``,
  ``map_block``).

Not simulated: several streams (blocks are per stream), CUDA graph private pools, ``garbage_collection_threshold``
and the out-of-memory path (``release_cached_blocks``): the simulation assumes the device has room.

Outside the blocks of tensors, PyTorch holds (:func:`cublas_workspace_bytes`, :func:`cublaslt_workspace_bytes`):

- cuBLAS's workspace, through the caching allocator at the first GEMM, one per handle and stream and kept to the
  end of the process (``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``parseChosenWorkspaceSize``):
  ``CUBLAS_WORKSPACE_CONFIG=:SIZE:COUNT[:SIZE:COUNT...]`` gives ``sum(SIZE KiB x COUNT)``; unset, ``:4096:2:16:8``
  (8.125 MiB) and 32 MiB on Hopper (``sm_90``, pytorch/pytorch#91564, PyTorch 2.0) and, from PyTorch 2.11, on
  Blackwell (compute capability 10 and 12, pytorch/pytorch#175344). Before PyTorch 2.0 cuBLAS allocated its own
  workspace outside the allocator (pytorch/pytorch#83461 / #86167 moved it in);
- cuBLASLt's workspace (GEMMs with a fused bias, ``addmm``): ``CUBLASLT_WORKSPACE_SIZE`` KiB, 1024 by default
  (pytorch/pytorch#73439, #101145); allocated for each call and freed after it up to PyTorch 2.7, one kept per
  handle and stream from 2.8 (pytorch/pytorch#156495), and from 2.11 the cuBLAS workspace serves it
  (``TORCH_CUBLASLT_UNIFIED_WORKSPACE``, on by default, pytorch/pytorch#168175): no bytes of its own unless
  ``CUBLASLT_WORKSPACE_SIZE`` exceeds the cuBLAS workspace.

The CUDA context is outside the allocator and outside both figures: :func:`cuda_module_loading` says whether the
process loads its kernels lazily (``CUDA_MODULE_LOADING=LAZY``: opt-in from CUDA 11.7, the default on Linux from
CUDA 12.2, and set by PyTorch's own ``torch.cuda`` import when unset from PyTorch 2.0), which decides whether the
catalogue's eager-loading context figure (``Device.runtime_baseline_mib``) holds; nothing here measures the lazy
figure, so it stays the device's calibratable constant.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dippm_nas.errors import InvalidValueError
from dippm_nas.units import BYTES_PER_MIB

__all__ = [
    "AllocatorConfig", "AllocatorPeak", "AllocEvent", "simulate_caching_allocator", "allocation_events",
    "round_request", "segment_bytes", "cublas_workspace_bytes", "cublaslt_workspace_bytes", "cuda_module_loading",
    "parse_torch_version",
]

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20
#: Address space of one expandable segment (never exhausted here: the simulation assumes room).
_EXPANDABLE_SPAN = 1 << 50


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``).

    Attributes:
        expandable_segments: ``expandable_segments:True``.
        max_split_size_mib: ``max_split_size_mb``; ``None``: unlimited (PyTorch's default).
        roundup_power2_divisions: ``roundup_power2_divisions:N`` (one value for every size); 0 or 1: off.
    """

    expandable_segments: bool = False
    max_split_size_mib: float | None = None
    roundup_power2_divisions: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.expandable_segments, bool):
            raise InvalidValueError(f"AllocatorConfig.expandable_segments must be a bool, got "
                                    f"{self.expandable_segments!r}")
        m = self.max_split_size_mib
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m)
                              or m <= 1):
            raise InvalidValueError(f"AllocatorConfig.max_split_size_mib must be a number > 1 MiB or None "
                                    f"(PyTorch refuses 1 MiB and less), got {m!r}")
        d = self.roundup_power2_divisions
        if isinstance(d, bool) or not isinstance(d, int) or d < 0 or (d > 1 and d & (d - 1)):
            raise InvalidValueError(f"AllocatorConfig.roundup_power2_divisions must be 0, 1 or a power of two, "
                                    f"got {d!r}")

    @property
    def max_split_bytes(self) -> int:
        """``max_split_size`` in bytes (unlimited: the largest ``size_t``)."""
        return (1 << 64) - 1 if self.max_split_size_mib is None else int(self.max_split_size_mib * BYTES_PER_MIB)

    @classmethod
    def from_env(cls, value: str | None) -> "AllocatorConfig":
        """The settings of a ``PYTORCH_CUDA_ALLOC_CONF`` value (``"expandable_segments:True,max_split_size_mb:128"``).

        Keys the simulation does not model (``garbage_collection_threshold``, ``backend``, ...) are ignored.

        Raises:
            InvalidValueError: an entry that is not ``key:value``, or a value the key does not take.
        """
        if value is None or not value.strip():
            return cls()
        kw: dict[str, object] = {}
        for item in value.split(","):
            key, sep, val = (s.strip() for s in item.partition(":"))
            if not sep or not key:
                raise InvalidValueError(f"PYTORCH_CUDA_ALLOC_CONF entries are key:value separated by commas, got "
                                        f"{item!r} in {value!r}")
            if key == "expandable_segments":
                if val not in ("True", "False"):
                    raise InvalidValueError(f"expandable_segments takes True or False, got {val!r}")
                kw["expandable_segments"] = val == "True"
            elif key == "max_split_size_mb":
                kw["max_split_size_mib"] = _number(val, key)
            elif key == "roundup_power2_divisions":
                if not val.isdigit():
                    raise InvalidValueError(f"roundup_power2_divisions takes one integer here (the per-size list "
                                            f"[..] form is not modelled), got {val!r}")
                kw["roundup_power2_divisions"] = int(val)
        return cls(**kw)  # type: ignore[arg-type]


def _number(text: str, key: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InvalidValueError(f"{key} takes a number, got {text!r}") from None
    return v


def round_request(nbytes: int, divisions: int = 0) -> int:
    """``round_size`` of the allocator: ``nbytes`` rounded up to 512 B, or to the next of ``divisions`` steps
    between two powers of two when ``divisions > 1`` and ``nbytes > 512 * divisions``."""
    if nbytes < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if divisions > 1 and nbytes > K_MIN_BLOCK * divisions:
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = nbytes & ~(step - 1)
        return nbytes if low == nbytes else low + step
    return K_MIN_BLOCK * -(-nbytes // K_MIN_BLOCK)


def segment_bytes(size: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc`` gets for a rounded request of ``size`` bytes."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


@dataclass(frozen=True)
class AllocEvent:
    """One step of an allocation sequence: ``nbytes > 0`` allocates tensor ``key``, ``nbytes == 0`` frees it."""

    key: int
    nbytes: int

    def __post_init__(self) -> None:
        for name in ("key", "nbytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidValueError(f"AllocEvent.{name} must be an int >= 0 (nbytes 0 frees the key), got {v!r}")


@dataclass(frozen=True)
class AllocatorPeak:
    """What the caching allocator's statistics read after a sequence.

    Attributes:
        allocated_bytes: peak of ``allocated_bytes.all`` (``torch.cuda.max_memory_allocated``): whole blocks.
        reserved_bytes: peak of ``reserved_bytes.all`` (``torch.cuda.max_memory_reserved``): segments or mapped pages.
        requested_bytes: peak of the requests' own sizes, unrounded (``requested_bytes.all``).
        peak_event: index of the event at which ``allocated_bytes`` peaks (-1 for an empty sequence).
        segments: ``cudaMalloc`` calls (new segments), or page mappings with expandable segments.
        pool_reserved_bytes: reserved bytes of the small and the large pool at the end, ``{"small": .., "large": ..}``.
    """

    allocated_bytes: int
    reserved_bytes: int
    requested_bytes: int
    peak_event: int
    segments: int
    pool_reserved_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def allocated_mib(self) -> float:
        return self.allocated_bytes / BYTES_PER_MIB

    @property
    def reserved_mib(self) -> float:
        return self.reserved_bytes / BYTES_PER_MIB


class _Block:
    __slots__ = ("addr", "size", "allocated", "prev", "next", "mapped", "pool")

    def __init__(self, addr: int, size: int, pool: "_Pool", mapped: bool = True) -> None:
        self.addr, self.size, self.pool, self.mapped = addr, size, pool, mapped
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """The free (cached) blocks of one pool, ordered by ``(size, address)``; the pages of its expandable segment."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], _Block] = {}
        self.reserved = 0
        self.tail: _Block | None = None  # the unmapped rest of the expandable segment

    def insert(self, b: _Block) -> None:
        k = (b.size, b.addr)
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = (b.size, b.addr)
        i = bisect.bisect_left(self.keys, k)
        del self.keys[i]
        del self.blocks[k]


class _Allocator:
    """The rules of the module docstring over one stream."""

    def __init__(self, config: AllocatorConfig) -> None:
        self.cfg = config
        self.mss = config.max_split_bytes
        self.small, self.large = _Pool(True), _Pool(False)
        self.next_addr = 0
        self.allocated = self.requested = self.segments = 0

    @property
    def reserved(self) -> int:
        return self.small.reserved + self.large.reserved

    def malloc(self, nbytes: int) -> _Block:
        size = round_request(nbytes, self.cfg.roundup_power2_divisions)
        pool = self.small if size <= K_SMALL_SIZE else self.large
        block = self._free_block(pool, size)
        if block is None:
            block = self._expand(pool, size) if self.cfg.expandable_segments else self._new_segment(pool, size)
        rest = block.size - size
        split = rest >= K_MIN_BLOCK if (pool.small or self.cfg.expandable_segments) else \
            (size < self.mss and rest > K_SMALL_SIZE)
        if split:
            remaining = _Block(block.addr + size, rest, pool)
            remaining.prev, remaining.next = block, block.next
            if block.next is not None:
                block.next.prev = remaining
            block.next = remaining
            block.size = size
            pool.insert(remaining)
        block.allocated = True
        self.allocated += block.size
        self.requested += nbytes
        return block

    def free(self, block: _Block, nbytes: int) -> None:
        block.allocated = False
        self.allocated -= block.size
        self.requested -= nbytes
        pool = block.pool
        for other in (block.prev, block.next):
            if other is not None and not other.allocated and other.mapped == block.mapped:
                self._merge(block, other, pool)
        pool.insert(block)

    def _merge(self, dst: _Block, src: _Block, pool: _Pool) -> None:
        if src.mapped:
            pool.remove(src)
        if dst.prev is src:
            dst.addr, dst.prev = src.addr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src is pool.tail:
            pool.tail = dst

    def _free_block(self, pool: _Pool, size: int) -> _Block | None:
        keys = pool.keys
        i = bisect.bisect_left(keys, (size, -1))
        if i == len(keys):
            return None
        if self.cfg.expandable_segments:  # best fit by the size a block can grow to (``expandable_size``)
            def grow(j: int) -> int:
                b = pool.blocks[keys[j]]
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while i + 1 < len(keys) and grow(i + 1) < grow(i):
                i += 1
        b = pool.blocks[keys[i]]
        if size < self.mss <= b.size:
            return None
        if size >= self.mss and b.size >= size + K_LARGE_BUFFER:
            return None
        pool.remove(b)
        return b

    def _new_segment(self, pool: _Pool, size: int) -> _Block:
        alloc = segment_bytes(size)
        b = _Block(self.next_addr, alloc, pool)
        self.next_addr += alloc
        pool.reserved += alloc
        self.segments += 1
        return b

    def _expand(self, pool: _Pool, size: int) -> _Block:
        """``try_allocate_expandable_block``: the segment's free end (a free mapped block before the unmapped
        rest, or the rest itself) grows by whole pages until it holds ``size``; returns it out of the pool."""
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        if pool.tail is None:
            pool.tail = _Block(self.next_addr, _EXPANDABLE_SPAN, pool, mapped=False)
            self.next_addr += _EXPANDABLE_SPAN
        tail = pool.tail
        cand = tail.prev if tail.prev is not None and not tail.prev.allocated else None
        need = page * -(-(size - (cand.size if cand is not None else 0)) // page)
        pool.reserved += need
        self.segments += 1
        tail.addr += need
        tail.size -= need
        if cand is not None:  # the free end grows into the new pages
            pool.remove(cand)
            cand.size += need
            return cand
        mapped = _Block(tail.addr - need, need, pool)
        mapped.prev, mapped.next = tail.prev, tail
        if tail.prev is not None:
            tail.prev.next = mapped
        tail.prev = mapped
        return mapped


def simulate_caching_allocator(events: Iterable[AllocEvent], config: AllocatorConfig | None = None) -> AllocatorPeak:
    """Replay ``events`` through the caching allocator (the rules of the module docstring); the peaks its
    statistics read.

    Args:
        events: allocations (``nbytes > 0``, a new ``key``) and frees (``nbytes == 0``, a ``key`` alive).
        config: the allocator's settings (default: PyTorch's).

    Raises:
        InvalidValueError: a key allocated twice, a free of a key not alive, or a negative size.
    """
    return _replay_pairs(((ev.key, ev.nbytes) for ev in events), config)


def _replay_pairs(pairs: Iterable[tuple[int, int]], config: AllocatorConfig | None = None) -> AllocatorPeak:
    """:func:`simulate_caching_allocator` of ``(key, nbytes)`` pairs (the fields of :class:`AllocEvent`, without
    building one object per event: the batched memory parts replay thousands)."""
    cfg = config or AllocatorConfig()
    sim = _Allocator(cfg)
    alive: dict[int, tuple[_Block, int]] = {}
    peak_alloc = peak_res = peak_req = 0
    peak_event = -1
    for i, (key, nbytes) in enumerate(pairs):
        if nbytes < 0:
            raise InvalidValueError(f"event {i}: nbytes must be >= 0 (0 frees the key), got {nbytes}")
        if nbytes:
            if key in alive:
                raise InvalidValueError(f"event {i}: key {key} is allocated while alive; free it first")
            alive[key] = (sim.malloc(nbytes), nbytes)
            if sim.allocated > peak_alloc:
                peak_alloc, peak_event = sim.allocated, i
            peak_res = max(peak_res, sim.reserved)
            peak_req = max(peak_req, sim.requested)
        else:
            hit = alive.pop(key, None)
            if hit is None:
                raise InvalidValueError(f"event {i}: free of key {key}, which is not alive")
            sim.free(*hit)
    return AllocatorPeak(allocated_bytes=peak_alloc, reserved_bytes=peak_res, requested_bytes=peak_req,
                         peak_event=peak_event, segments=sim.segments,
                         pool_reserved_bytes={"small": sim.small.reserved, "large": sim.large.reserved})


def allocation_events(sizes: Sequence[Sequence[int]], alloc_at: Sequence[int], last_use: Sequence[int],
                      num_nodes: int, *, held: Sequence[int] = (), workspace_at: int | None = None,
                      workspace_bytes: int = 0) -> list[AllocEvent]:
    """The allocations and frees of one eager forward pass, in order, from the storages of a liveness pass
    (:func:`~dippm_nas.prior.storage_lives`: each storage's blocks, the node that makes it, the last node that
    reads it):

    - ``held`` first (the weights, one block per tensor, and the input the caller holds), never freed;
    - at each node, the storages it makes (in storage order), then, after it, the frees of the storages it read
      last; a storage read to the end (``last_use >= num_nodes``: the model's outputs) is not freed;
    - ``workspace_bytes`` (the cuBLAS workspace) allocated before node ``workspace_at`` (the first GEMM), kept.
    """
    if not len(sizes) == len(alloc_at) == len(last_use):
        raise InvalidValueError(f"one size list, allocation node and last use per storage: {len(sizes)}, "
                                f"{len(alloc_at)} and {len(last_use)}")
    events = [AllocEvent(k, int(b)) for k, b in enumerate(held) if b > 0]
    key = len(held)
    at: dict[int, list[int]] = {}
    end: dict[int, list[int]] = {}
    for s, (a, e) in enumerate(zip(alloc_at, last_use)):
        if e < a or not any(sizes[s]):
            continue
        at.setdefault(a, []).append(s)
        if e < num_nodes:
            end.setdefault(e, []).append(s)
    keys: dict[int, list[int]] = {}
    for i in range(num_nodes):
        if workspace_at == i and workspace_bytes > 0:
            events.append(AllocEvent(key, int(workspace_bytes)))
            key += 1
        for s in at.get(i, ()):
            blocks = [b for b in sizes[s] if b > 0]
            keys[s] = list(range(key, key + len(blocks)))
            events.extend(AllocEvent(k, int(b)) for k, b in zip(keys[s], blocks))
            key += len(blocks)
        for s in end.get(i, ()):
            events.extend(AllocEvent(k, 0) for k in keys.pop(s))
    return events


_VERSION = re.compile(r"^\s*(\d+)\.(\d+)")


def parse_torch_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.13.0+cu126"`` -> ``(2, 13)``).

    Raises:
        InvalidValueError: a string that does not start with ``MAJOR.MINOR``.
    """
    m = _VERSION.match(version) if isinstance(version, str) else None
    if m is None:
        raise InvalidValueError(f"a torch version is 'MAJOR.MINOR[.PATCH][+local]' (e.g. '2.13.0'), got {version!r}")
    return int(m.group(1)), int(m.group(2))


def torch_at_least(version: str | None, since: tuple[int, int]) -> bool | None:
    """Whether torch ``version`` is at least ``since`` (``(major, minor)``); ``None`` when the version is ``None`` or
    has no ``MAJOR.MINOR`` (unknown: the caller keeps its version-free rule)."""
    if version is None:
        return None
    try:
        return parse_torch_version(version) >= since
    except InvalidValueError:
        return None


_WS_CONFIG = re.compile(r":([0-9]+):([0-9]+)")


def _capability(cc: object) -> int:
    """The major number of a ``(major, minor)`` compute capability."""
    ok = isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in cc)
    if not ok or cc[0] < 1 or cc[1] < 0:  # type: ignore[index]
        raise InvalidValueError(f"compute_capability is (major, minor) ints, e.g. (9, 0) for H100, got {cc!r}")
    return cc[0]  # type: ignore[no-any-return]


def _env(env: object) -> Mapping[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InvalidValueError(f"env maps variable names to texts (like os.environ), got {env!r:.80}")
    return env


def cublas_workspace_bytes(torch_version: str, compute_capability: tuple[int, int],
                           env: Mapping[str, str] | None = None) -> int:
    """Bytes of the cuBLAS workspace PyTorch allocates through its caching allocator (module docstring).

    Args:
        torch_version: e.g. ``"2.13.0"``.
        compute_capability: the GPU's ``(major, minor)``, e.g. ``(9, 0)`` for H100.
        env: the process's environment (``CUBLAS_WORKSPACE_CONFIG``); ``None``: unset.

    Returns:
        0 before PyTorch 2.0 (cuBLAS's own workspace, outside the allocator).
    """
    ver = parse_torch_version(torch_version)
    major = _capability(compute_capability)
    e = _env(env)
    if ver < (2, 0):
        return 0
    big = major == 9 or (ver >= (2, 11) and major in (10, 12))
    default = 4096 * 8 * 1024 if big else 4096 * 1024 * 2 + 16 * 1024 * 8
    val = e.get("CUBLAS_WORKSPACE_CONFIG")
    if val is None:
        return default
    parts = _WS_CONFIG.findall(val)
    if not parts:  # PyTorch warns and keeps its default
        return default
    return sum(int(size) * 1024 * int(count) for size, count in parts)


def cublaslt_workspace_bytes(torch_version: str, compute_capability: tuple[int, int],
                             env: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """Bytes cuBLASLt's workspace adds to the cuBLAS one, and whether they stay allocated (module docstring).

    Returns:
        ``(bytes, persistent)``: before PyTorch 2.8 a block allocated and freed around each cuBLASLt GEMM
        (``persistent=False``); from 2.8 one kept per handle and stream; from 2.11 none beyond the cuBLAS
        workspace (the unified workspace) unless ``CUBLASLT_WORKSPACE_SIZE`` asks for more, or
        ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=0`` keeps it apart.
    """
    ver = parse_torch_version(torch_version)
    _capability(compute_capability)
    e = _env(env)
    raw = e.get("CUBLASLT_WORKSPACE_SIZE")
    kib = int(raw) if raw is not None and raw.strip().isdigit() and ver >= (2, 1) else 1024
    lt = kib * 1024
    if ver < (2, 8):
        return lt, False
    unified = e.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1" if ver >= (2, 11) else "0") not in ("0", "false", "False")
    if unified:
        return max(0, lt - cublas_workspace_bytes(torch_version, compute_capability, env)), True
    return lt, True


def cuda_module_loading(torch_version: str, cuda_version: str, env: Mapping[str, str] | None = None) -> str:
    """``"lazy"`` or ``"eager"``: how the process loads its CUDA kernels (module docstring).

    Args:
        torch_version: e.g. ``"2.13.0"``.
        cuda_version: the CUDA runtime torch was built with, e.g. ``"12.6"``.
        env: the process's environment (``CUDA_MODULE_LOADING``); ``None``: unset.
    """
    cuda = parse_torch_version(cuda_version)
    torch_ver = parse_torch_version(torch_version)
    val = _env(env).get("CUDA_MODULE_LOADING")
    if cuda < (11, 7):
        return "eager"
    if val is not None:
        return "lazy" if val.upper() == "LAZY" else "eager"
    if torch_ver >= (2, 0) or cuda >= (12, 2):
        return "lazy"
    return "eager"
