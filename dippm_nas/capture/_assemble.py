"""Assemble a search-space candidate's :class:`OperatorGraph` from cached block graphs, without exporting it.

A space that subclasses :class:`search_spaces.BlockSearchSpace` says how a config splits into blocks
(:class:`search_spaces.BlockPlan`). Each distinct block -- its kind and hyper-parameters, its input shapes
and dtypes, the candidate's batch size and compute dtype -- is captured once (``torch.export`` -> Relax, as
:func:`~dippm_nas.capture` does for a whole model) and stored in the conversion cache under its own key
(:func:`block_key`); a candidate's graph is then stitched from its blocks' graphs: node ids offset in
execution order, each block input's consumers fed by the node that produced it, parameter counts summed.
The result is the whole capture's graph (same :meth:`~OperatorGraph.structural_hash`, same nodes, same
parameter count), which ``tests/capture/test_assembly.py`` checks on random configs of every space that opts in.

What a block key covers: ``"block"``, the converter versions (:func:`~dippm_nas.capture.converter_version`),
the space's name and :meth:`~search_spaces.BlockSearchSpace.code_digest` (for the built-in families, the
source of every module of ``search_spaces``), the block's kind, its params as canonical JSON, the name,
shape, dtype and value bound of each input, the number of outputs, the batch size and the compute dtype.
What would fool it: a block whose graph depends on something else (a global, a file the digest does not
read) -- the contract of :mod:`search_spaces._blocks` rules that out; pass ``cache=False`` when in doubt.

Conversion modes: a candidate whose blocks all convert in the fast mode is assembled in that mode
(``"export"``, or ``"export+opaque"`` when some blocks keep ops the frontend cannot convert as opaque nodes,
as the whole capture then does); if all blocks needed the decomposing fallback, the candidate is assembled
in ``"export+decompose"``. A mix of the fast mode and the decomposing one is not what a whole capture gives
(it decomposes the whole model once one op needs it), so such a candidate is captured whole instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dippm_nas._gc import gc_paused
from dippm_nas._logging import WarnOnce
from dippm_nas._numbers import as_int
from dippm_nas.capture._capture import CacheArg, _resolve_cache, _warn_cache_down, capture
from dippm_nas.capture._key import converter_version
from dippm_nas.capture._many import CaptureResult, capture_many
from dippm_nas.errors import (
    CacheError, DippmNasError, GraphCaptureError, InputSpecError, InvalidValueError, SearchSpaceError,
)
from dippm_nas.graph import STRUCTURAL_HASH_VERSION, OperatorGraph, OpNode, adopt_node_columns
from dippm_nas.spec import InputSpec, TensorSpec
if TYPE_CHECKING:  # pragma: no cover
    import torch

    from dippm_nas.cache import ConversionCache

__all__ = ["assemble", "assemble_many", "assemble_chunks", "block_key", "supports_assembly",
           "clear_block_memo", "SpaceItem", "BLOCK_MEMO_NODES", "PLACED_MEMO_NODES"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger)

#: An item of :func:`assemble_many`: ``(space, config, spec)``; ``space`` is a registered name or a
#: :class:`search_spaces.SearchSpace`, ``config`` a JSON config of it, ``spec`` the candidate's input.
SpaceItem = tuple[Any, Mapping[str, Any], InputSpec]

#: Bound on the nodes of the block graphs this process keeps decoded (least recently used dropped first).
BLOCK_MEMO_NODES = 400_000

_FAST_MODES = frozenset({"export", "export+opaque"})


# ---------------------------------------------------------------------- spaces
def _search_spaces() -> Any:
    # search_spaces imports torch (every family is an nn.Module): imported when first needed, so that
    # `import dippm_nas` and the prediction of a cached graph load neither
    import search_spaces

    return search_spaces


def _resolve_space(space: Any) -> Any:
    ss = _search_spaces()
    if isinstance(space, str):
        return ss.get_space(space)
    if isinstance(space, ss.SearchSpace):
        return space
    raise SearchSpaceError(f"space must be a registered search-space name (one of {ss.list_spaces()}) or a "
                           f"search_spaces.SearchSpace, got {type(space).__name__}: {space!r}")


def supports_assembly(space: Any) -> bool:
    """Whether candidates of ``space`` (a name or a :class:`~search_spaces.SearchSpace`) are assembled from blocks.

    Raises:
        SearchSpaceError: an unknown space name (the registered ones are listed).
    """
    return isinstance(_resolve_space(space), _search_spaces().BlockSearchSpace)


def _shapes_of(spec: InputSpec) -> list[tuple[str, tuple[int, ...], str]]:
    return [(t.name, t.shape, spec.tensor_dtype(t)) for t in spec.tensors]


# ---------------------------------------------------------------------- keys
@functools.lru_cache(maxsize=64)
def _space_digest(space: Any) -> str:
    return f"{space.name}|{space.code_digest()}|{converter_version()}"


def _block_spec(block: Any, spec: InputSpec) -> InputSpec:
    """The :class:`InputSpec` a block is captured with (inputs named as the plan names them)."""
    model_inputs = {t.name: t for t in spec.tensors}
    tensors = []
    for inp in block.inputs:
        src = model_inputs.get(inp.source) if isinstance(inp.source, str) else None
        dtype = inp.dtype if inp.dtype is not None else (src.dtype if src is not None else None)
        high = src.high if src is not None else 2
        tensors.append(TensorSpec(name=inp.name, shape=tuple(inp.shape), dtype=dtype, high=high))
    if len(tensors) == 1 and tensors[0].dtype is None:  # one float input: positional (nn.Sequential blocks)
        return InputSpec(shape=tensors[0].shape, batch_size=spec.batch_size, dtype=spec.dtype)
    return InputSpec(inputs=tuple(tensors), batch_size=spec.batch_size, dtype=spec.dtype)


def _key_of(space: Any, block: Any, bspec: InputSpec) -> str:
    parts = [
        "block", _space_digest(space), block.kind, json.dumps(block.params, sort_keys=True, separators=(",", ":")),
        str(block.num_outputs), str(bspec.batch_size), bspec.dtype,
        *(f"{t.name}{t.shape}{bspec.tensor_dtype(t)}<{t.high}" for t in bspec.tensors),
        "pos" if bspec.inputs is None else "kw",
    ]
    return "block:" + hashlib.sha256("|".join(parts).encode()).hexdigest()


#: (space digest, kind, params JSON, outputs, batch, dtype, model inputs, block inputs) -> (block spec, key):
#: everything :func:`_block_spec` and :func:`_key_of` read, so a hit is their answer
_SPEC_KEYS: dict[tuple[Any, ...], tuple[InputSpec, str]] = {}
_SPEC_KEYS_MAX = 1 << 16


_SCALARS = (bool, int, float, str, type(None))


def _params_memo_key(params: Mapping[str, Any]) -> Any:
    """What stands for a block's params in the :data:`_SPEC_KEYS` memo: ``(name, type, value)`` of each when all
    are scalars (the type keeps ``True``, ``1`` and ``1.0`` apart, as the key's JSON does), else the params'
    canonical JSON."""
    items = tuple(params.items())
    if all(type(v) in _SCALARS for _, v in items):
        return tuple(sorted((k, type(v).__name__, v) for k, v in items))
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def _spec_and_key(space: Any, block: Any, spec: InputSpec, memo_key: tuple[Any, ...]) -> tuple[InputSpec, str]:
    hit = _SPEC_KEYS.get(memo_key)
    if hit is None:
        bspec = _block_spec(block, spec)
        hit = (bspec, _key_of(space, block, bspec))
        if len(_SPEC_KEYS) >= _SPEC_KEYS_MAX:
            _SPEC_KEYS.clear()
        _SPEC_KEYS[memo_key] = hit
    return hit


def block_key(space: Any, block: Any, spec: InputSpec) -> str:
    """The conversion-cache key of one block of a candidate (see the module docstring for what it covers).

    Args:
        space: a :class:`search_spaces.BlockSearchSpace` or its registered name.
        block: a :class:`search_spaces.Block` of one of its plans.
        spec: the candidate's input spec (its batch size and compute dtype apply to the block).
    """
    s = _resolve_space(space)
    return _key_of(s, block, _block_spec(block, spec))


# ---------------------------------------------------------------------- prepared blocks
class _Prepared:
    """A block graph made ready for stitching (shared, read-only)."""

    __slots__ = ("graph", "nodes", "edges", "consumers", "outputs", "n", "param_count", "param_bytes", "mode", "frag",
                 "placed")

    def __init__(self, g: OperatorGraph, input_names: Sequence[str], num_outputs: int) -> None:
        if len(g.outputs) != num_outputs:
            raise GraphCaptureError(
                f"the block's graph has {len(g.outputs)} output node(s) where its plan says {num_outputs}: a block "
                "must return distinct tensors it computes (not an input passed through)")
        #: the block's graph: its node columns (dippm_nas.graph.node_columns, computed once) are those of every
        #: placement, whose nodes differ from its own only in their index
        self.graph = g
        # provenance left out: a block's module stacks are its own module's, not the candidate's (an assembled
        # graph is priced by the structural liveness rules, as a graph without provenance is)
        self.nodes = [n.__dict__ if n.module_stack is None and n.inplace is None
                      else {**n.__dict__, "module_stack": None, "inplace": None} for n in g.nodes]
        self.edges = list(g.edges)
        self.consumers = [list(g.input_consumers.get(name, ())) for name in input_names]
        self.outputs = list(g.outputs)
        self.n = g.num_nodes
        self.param_count = g.param_count
        self.param_bytes = g.param_bytes
        self.mode = g.mode
        #: offset -> (nodes, edges) of this block placed at that node offset, shared by every candidate that has
        #: it there (nodes are frozen; see :func:`_placed`)
        self.placed: dict[int, tuple[list[OpNode], list[tuple[int, int]]]] = {}
        # The nodes' part of OperatorGraph.structural_hash's payload (it holds no node index).
        self.frag = ",".join(
            json.dumps([n.op, [list(s) for s in n.output_shapes], n.output_dtype, [list(s) for s in n.input_shapes],
                        [int(b) for b in n.input_is_param], dict(n.attrs)], sort_keys=True, separators=(",", ":"))
            for n in g.nodes)


class _Memo:
    """Process-wide LRU of prepared blocks, bounded by their node count."""

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = max_nodes
        self._d: OrderedDict[str, _Prepared] = OrderedDict()
        self._nodes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> _Prepared | None:
        with self._lock:
            p = self._d.get(key)
            if p is not None:
                self._d.move_to_end(key)
            return p

    def put(self, key: str, p: _Prepared) -> None:
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._nodes -= old.n
            self._d[key] = p
            self._nodes += p.n
            while self._nodes > self.max_nodes and len(self._d) > 1:
                _, q = self._d.popitem(last=False)
                self._nodes -= q.n
                _release_placed(q)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._nodes = 0


_MEMO = _Memo(BLOCK_MEMO_NODES)


def clear_block_memo() -> None:
    """Forget the block graphs this process holds decoded (the conversion cache keeps them)."""
    global _placed_nodes
    _MEMO.clear()
    with _placed_lock:
        _placed_nodes = 0  # blocks a running call still holds keep their placements, uncounted until it ends


#: Bound on the nodes of placed block copies (:func:`_placed`) this process keeps, over all blocks; past it a
#: placement is made for its candidate alone. Its memory is that of 400,000 decoded nodes, the bound of
#: :data:`BLOCK_MEMO_NODES`.
PLACED_MEMO_NODES = 400_000
_placed_nodes = 0
_placed_lock = threading.Lock()


def _placed(p: _Prepared, off: int) -> tuple[list[OpNode], list[tuple[int, int]]]:
    """The nodes (``index`` from ``off``) and internal edges of block ``p`` placed at node offset ``off``.

    Candidates of a space share most (block, offset) pairs (a stage's first layers sit at the same offsets in
    many candidates), so a placement is kept with its block and shared: an :class:`OpNode` is frozen, and a
    graph that shares nodes with another is the graph it would be with copies. Sharing also keeps the memory
    of many assembled graphs to their edges and node lists."""
    global _placed_nodes
    hit = p.placed.get(off)
    if hit is not None:
        return hit
    new = object.__new__
    set_dict = object.__setattr__
    nodes = []
    i = off
    for d in p.nodes:
        node = new(OpNode)
        nd = d.copy()
        nd["index"] = i
        set_dict(node, "__dict__", nd)
        nodes.append(node)
        i += 1
    edges = [(s + off, t + off) for s, t in p.edges] if off else p.edges
    placed = (nodes, edges)
    with _placed_lock:
        if off not in p.placed and _placed_nodes + p.n <= PLACED_MEMO_NODES:
            _placed_nodes += p.n
            p.placed[off] = placed
    return placed


def _release_placed(p: _Prepared) -> None:
    """Uncount the placements of a block the memo dropped (they go with it)."""
    global _placed_nodes
    with _placed_lock:
        _placed_nodes = max(0, _placed_nodes - p.n * len(p.placed))


# ---------------------------------------------------------------------- stitching
_hash_checked = False
_hash_fast = True
_hash_lock = threading.Lock()


def _payload_hash(edges: list[tuple[int, int]], inputs: dict[str, list[int]], outputs: list[int],
                  preps: Sequence[_Prepared]) -> str:
    """:meth:`OperatorGraph.structural_hash` from the blocks' node fragments (no per-node JSON work)."""
    frags = ",".join(p.frag for p in preps if p.frag)
    # str() of a list of int pairs, "[(0, 1), (0, 2)]", made the JSON "[[0,1],[0,2]]" in C
    edges_json = str(edges).replace("(", "[").replace(")", "]").replace(" ", "")
    text = ('{"edges":' + edges_json + ',"inputs":'
            + json.dumps(inputs, sort_keys=True, separators=(",", ":")) + ',"nodes":[' + frags + '],"outputs":'
            + json.dumps(outputs, separators=(",", ":")) + ',"v":' + json.dumps(STRUCTURAL_HASH_VERSION) + "}")
    return hashlib.sha256(text.encode()).hexdigest()


def _stitch(space_name: str, plan: Any, preps: Sequence[_Prepared], spec: InputSpec, mode: str) -> OperatorGraph:
    global _hash_checked, _hash_fast
    t0 = time.perf_counter()
    names = [t.name for t in spec.tensors]
    nodes: list[OpNode] = []
    edges: list[tuple[int, int]] = []
    consumers: dict[str, list[int]] = {name: [] for name in names}
    out_nodes: list[list[int]] = []
    off = 0
    for block, p in zip(plan.blocks, preps):
        block_nodes, block_edges = _placed(p, off)
        nodes.extend(block_nodes)
        edges.extend(block_edges)
        for inp, cons in zip(block.inputs, p.consumers):
            src = inp.source
            if isinstance(src, str):
                consumers[src].extend([c + off for c in cons])
            else:
                producer = out_nodes[src[0]][src[1]]
                edges.extend([(producer, c + off) for c in cons])
        out_nodes.append([o + off for o in p.outputs])
        off += p.n
    edges = sorted(set(edges))
    inputs = {k: sorted(set(v)) for k, v in consumers.items()}
    outputs: list[int] = []
    for b, o in plan.outputs:
        node_id = out_nodes[b][o]
        if node_id not in outputs:
            outputs.append(node_id)
    g = OperatorGraph(
        nodes=nodes, edges=edges, input_consumers=inputs, outputs=outputs, spec=spec,
        param_count=sum(p.param_count for p in preps), param_bytes=sum(p.param_bytes for p in preps),
        mode=mode, source=f"{space_name} (assembled from {len(preps)} blocks)",
    )
    if _hash_fast:
        fast = _payload_hash(edges, inputs, outputs, preps)
        if not _hash_checked:
            with _hash_lock:  # once per process: the fast hash must be OperatorGraph's own
                slow = OperatorGraph.from_dict(g.to_dict()).structural_hash()
                _hash_checked = True
                if slow != fast:
                    _hash_fast = False
                    logger.warning("assembled graphs: the structural-hash shortcut disagrees with "
                                   "OperatorGraph.structural_hash; hashing each graph in full instead")
    # valid by construction: every block graph was validated, offsets keep indices in order and edges forward,
    # and the edges are deduplicated (OperatorGraph.validate would pass; it is not run again); the hash of the
    # shortcut is OperatorGraph's own (checked once per process above)
    g.mark_valid(structural_hash=fast if _hash_fast else None)
    # the node columns the predictor's batched passes read: the blocks' own, concatenated (not read node by node)
    adopt_node_columns(g, [p.graph for p in preps])
    g.convert_seconds = time.perf_counter() - t0
    g.timings = {"assemble_s": g.convert_seconds}
    return g


def _candidate_key(space: Any, cfg: Mapping[str, Any], spec: InputSpec) -> str:
    text = "|".join(("candidate", _space_digest(space), json.dumps(cfg, sort_keys=True, separators=(",", ":")),
                     json.dumps(spec.to_dict(), sort_keys=True)))
    return "assembled:" + hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------- capture of missing pieces
def _build_block(space: Any, block: Any) -> "torch.nn.Module":
    """Zero-argument builder target for :func:`capture_many` (picklable: the space travels by its class)."""
    return space.build_block(block)


def _build_whole(space: Any, config: Mapping[str, Any]) -> "torch.nn.Module":
    return space.build(config)


def _capture_items(items: list[tuple[Any, InputSpec]], workers: int, cache: Any,
                   progress: bool) -> list[OperatorGraph | DippmNasError]:
    """Capture zero-argument builders; each entry is the graph or the error that stopped it."""
    if not items:
        return []
    if workers == 1 or len(items) == 1:
        out: list[OperatorGraph | DippmNasError] = []
        for build, spec in items:
            try:
                out.append(capture(build(), spec, cache=cache))
            except DippmNasError as e:
                out.append(e)
            except Exception as e:  # noqa: BLE001 - a failing builder is that item's error, not the batch's
                err = GraphCaptureError(f"{type(e).__name__}: {e}")
                err.__cause__ = e
                out.append(err)
        return out
    results = capture_many(items, workers=workers, cache=cache, progress=progress)
    return [r.graph if r.graph is not None else GraphCaptureError(r.error or "capture failed") for r in results]


def _describe(block: Any) -> str:
    shapes = ", ".join(f"{inp.name}{tuple(inp.shape)}" for inp in block.inputs)
    return f"{block.kind} {json.dumps(block.params, sort_keys=True)} on {shapes}"


# ---------------------------------------------------------------------- public
def assemble_many(items: Iterable[SpaceItem], *, workers: int = 1, cache: CacheArg = True,
                  progress: bool = False, fallback: bool = True) -> list[CaptureResult]:
    """Graphs of many search-space candidates, assembled from blocks (each distinct block captured once).

    Blocks missing from this process and from the conversion cache are captured first (``workers``
    processes, as :func:`~dippm_nas.capture_many`) and stored under :func:`block_key`; then each candidate's
    graph is stitched from its blocks in milliseconds. A block whose capture fails fails only the
    candidates that use it, with the block and the reason in their error; a config outside its space
    fails only itself (a :class:`SearchSpaceError` naming the key and its allowed values).

    Args:
        items: ``(space, config, spec)`` triples (:data:`SpaceItem`); ``spec`` is the candidate's input, as
            ``space.input_spec(config, batch_size, dtype)`` gives it.
        workers: processes that capture missing blocks (``1``: in this process).
        cache: as in :func:`~dippm_nas.capture`; ``False`` also bypasses this process's decoded blocks, so
            every block of the call is captured afresh.
        progress: show a progress bar while capturing.
        fallback: capture a candidate whole when its space does not opt in to assembly
            (:func:`supports_assembly`), when ``spec`` is not the space's input for the config, or when its
            blocks convert in mixed modes; ``False`` makes those candidates errors instead.

    Returns:
        One :class:`~dippm_nas.capture.CaptureResult` per item, in order (``error`` set when it failed);
        an assembled graph's ``source`` says ``"<space> (assembled from N blocks)"`` and ``cache_hit`` is
        true when every block came from a cache.
    """
    items = list(items)
    workers = as_int(workers, "workers", low=1, hint=" (conversion processes)")
    t0 = time.perf_counter()
    out = _assemble_items(items, workers, cache, progress, fallback)
    seconds = time.perf_counter() - t0
    return [_as_result(i, o, seconds / max(len(items), 1)) for i, o in enumerate(out)]


def assemble_chunks(items: Iterable[SpaceItem], *, chunk_size: int = 1024, workers: int = 1, cache: CacheArg = True,
                    progress: bool = False, fallback: bool = True) -> Iterator[list[CaptureResult]]:
    """:func:`assemble_many`'s results, ``chunk_size`` candidates at a time, for a caller that consumes each chunk
    (predicts it, say) before asking for the next, and so holds at most ``chunk_size`` graphs at once.

    Every item is planned and every missing block captured (one capture pass, ``workers`` processes) before the
    first chunk comes back; each chunk's candidates are stitched when it is asked for. Each result's ``index``
    is its item's position in ``items``; chunks follow the items' order, except that candidates captured whole
    (see ``fallback``) come last, in a chunk of their own.

    Args:
        items, workers, cache, progress, fallback: as for :func:`assemble_many`.
        chunk_size: candidates per chunk, ``>= 1``. Default 1024.

    Yields:
        Lists of :class:`~dippm_nas.capture.CaptureResult`; every item's result comes exactly once.
    """
    items = list(items)
    workers = as_int(workers, "workers", low=1, hint=" (conversion processes)")
    chunk_size = as_int(chunk_size, "chunk_size", low=1, hint=" (candidates per chunk)")
    for chunk in _assembled_chunks(items, workers, cache, progress, fallback, chunk_size):
        yield [_as_result(i, g) for i, g in chunk]


def _as_result(i: int, g: OperatorGraph | DippmNasError, error_seconds: float = 0.0) -> CaptureResult:
    """The :class:`CaptureResult` of item ``i``: its graph (with the graph's own seconds), or its error."""
    if isinstance(g, OperatorGraph):
        return CaptureResult(i, g, cache_hit=g.cache_hit, seconds=g.convert_seconds)
    return CaptureResult(i, None, f"{type(g).__name__}: {g}", type(g).__name__, seconds=error_seconds)


def _assemble_items(items: list[Any], workers: int, cache: CacheArg, progress: bool,
                    fallback: bool) -> list[OperatorGraph | DippmNasError]:
    """The work of :func:`assemble_many`: each item's graph, or the error that stopped it."""
    out: list[OperatorGraph | DippmNasError | None] = [None] * len(items)
    for chunk in _assembled_chunks(items, workers, cache, progress, fallback, max(len(items), 1)):
        for i, g in chunk:
            out[i] = g
    return out  # type: ignore[return-value]


def _assembled_chunks(items: list[Any], workers: int, cache: CacheArg, progress: bool, fallback: bool,
                      chunk_size: int) -> Iterator[list[tuple[int, OperatorGraph | DippmNasError]]]:
    """``(index, graph or error)`` of every item, ``chunk_size`` items at a time: every item planned and every
    missing block captured before the first chunk (one capture pass), each chunk's candidates stitched when it
    is asked for; the candidates captured whole come last, in one chunk."""
    run = _Run(cache)
    errors: dict[int, DippmNasError] = {}
    plans: dict[int, tuple[Any, Any, Any, list[str], InputSpec]] = {}
    whole: list[tuple[int, Any, dict[str, Any], InputSpec]] = []
    with gc_paused():  # many small acyclic objects: the collector would rescan them all
        for i, item in enumerate(items):
            try:
                plan_entry = run.plan(item, fallback)
            except DippmNasError as e:
                errors[i] = e
                continue
            if plan_entry[0] == "whole":
                whole.append((i, plan_entry[1], plan_entry[2], plan_entry[3]))
            else:
                plans[i] = plan_entry[1:]
    run.fetch(workers, progress)
    for start in range(0, len(items), chunk_size):
        chunk: list[tuple[int, OperatorGraph | DippmNasError]] = []
        with gc_paused():  # many small acyclic objects: the collector would rescan them all
            for i in range(start, min(start + chunk_size, len(items))):
                if i in errors:
                    chunk.append((i, errors.pop(i)))
                elif i in plans:
                    space, cfg, plan, keys, spec = plans.pop(i)  # dropped once stitched
                    g = run.candidate(space, cfg, plan, keys, spec, fallback)
                    if g is None:
                        whole.append((i, space, cfg, spec))
                    else:
                        chunk.append((i, g))
        if chunk:
            yield chunk
    if whole:
        graphs = _capture_items([(functools.partial(_build_whole, s, c), spec) for _, s, c, spec in whole],
                                workers, run.cache_arg, progress)
        yield [(i, g) for (i, *_), g in zip(whole, graphs)]


def assemble(space: Any, config: Mapping[str, Any], spec: InputSpec, *, cache: CacheArg = True,
             fallback: bool = True) -> OperatorGraph:
    """The graph of one search-space candidate, assembled from its blocks (see :func:`assemble_many`).

    Args:
        space: a registered search-space name or a :class:`search_spaces.SearchSpace`.
        config: a config of that space (left-out keys take its defaults).
        spec: the candidate's input, e.g. ``space.input_spec(config, batch_size=8, dtype="float16")``.
        cache: as in :func:`~dippm_nas.capture`.
        fallback: capture the model whole when the space does not opt in, the spec is not the space's, or
            the blocks convert in mixed modes; ``False`` raises instead.

    Returns:
        The candidate's graph: the same :meth:`~OperatorGraph.structural_hash`, nodes and parameter count as
        ``capture(search_spaces.build_model(space, config), spec)``.

    Raises:
        SearchSpaceError: an unknown space, or a config outside it (the key and its allowed values named).
        InputSpecError: ``spec`` is not an :class:`InputSpec` (or, with ``fallback=False``, not the space's input).
        GraphCaptureError: a block (named, with its reason) or the whole model could not be captured.
    """
    (r,) = _assemble_items([(space, config, spec)], 1, cache, False, fallback)
    if isinstance(r, DippmNasError):
        raise r
    return r


class _Run:
    """One :func:`assemble_many` call: plans, the blocks they need, and where each came from."""

    def __init__(self, cache: CacheArg) -> None:
        self.cache_arg = cache
        self.use_memo = cache is not False and cache is not None
        self.store: ConversionCache | None = _resolve_cache(cache)
        self.prepared: dict[str, _Prepared] = {}
        self.from_cache: set[str] = set()
        self.failed: dict[str, DippmNasError] = {}
        self.needed: dict[str, tuple[Any, Any, InputSpec]] = {}

    def plan(self, item: Any, fallback: bool) -> tuple:
        """``("whole", space, cfg, spec)`` or ``("blocks", space, cfg, plan, keys, spec)``; raises for bad input."""
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise InvalidValueError(f"an item must be (space, config, spec), got {item!r}")
        space_arg, config, spec = item
        if not isinstance(spec, InputSpec):
            raise InputSpecError(f"spec must be a dippm_nas.InputSpec, e.g. space.input_spec(config, batch_size=8), "
                                 f"got {spec!r}")
        space = _resolve_space(space_arg)
        cfg = space.validate(config)
        ss = _search_spaces()
        if not isinstance(space, ss.BlockSearchSpace):
            if not fallback:
                opted = [n for n in ss.list_spaces() if isinstance(ss.get_space(n), ss.BlockSearchSpace)]
                raise SearchSpaceError(f"search space {space.name!r} does not assemble candidates from blocks (it is "
                                       f"not a search_spaces.BlockSearchSpace); the ones that do: {opted}")
            return ("whole", space, cfg, spec)
        expected = space.input_spec(cfg, batch_size=spec.batch_size, dtype=spec.dtype)
        if _shapes_of(expected) != _shapes_of(spec):
            if not fallback:
                raise InputSpecError(f"{space.name} config takes inputs {_shapes_of(expected)}, the spec gives "
                                     f"{_shapes_of(spec)}; assembly needs the space's own input")
            return ("whole", space, cfg, spec)
        plan = space.blocks(cfg, validated=True)
        keys = []
        digest = _space_digest(space)
        model_inputs = tuple((t.name, t.dtype, t.high) for t in spec.tensors)
        for block in plan.blocks:
            bspec, key = _spec_and_key(space, block, spec, (
                digest, block.kind, _params_memo_key(block.params), block.num_outputs, spec.batch_size, spec.dtype,
                model_inputs, tuple((i.name, tuple(i.shape), i.dtype, i.source if isinstance(i.source, str) else None)
                                    for i in block.inputs)))
            keys.append(key)
            if key not in self.prepared and key not in self.needed:
                p = _MEMO.get(key) if self.use_memo else None
                if p is not None:
                    self.prepared[key] = p
                    self.from_cache.add(key)
                else:
                    self.needed[key] = (space, block, bspec)
        return ("blocks", space, cfg, plan, keys, spec)

    def _store_get(self, key: str) -> OperatorGraph | None:
        if self.store is None:
            return None
        try:
            return self.store.get(key)
        except CacheError as e:
            _warn_cache_down(e)
            self.store = None
            return None

    def _store_put(self, key: str, g: OperatorGraph) -> None:
        if self.store is None:
            return
        try:
            self.store.put(key, g)
        except CacheError as e:
            _warn_cache_down(e)
            self.store = None

    def _accept(self, key: str, g: OperatorGraph, space: Any, block: Any, bspec: InputSpec) -> bool:
        try:
            p = _Prepared(g, [t.name for t in bspec.tensors], block.num_outputs)
        except GraphCaptureError as e:
            self.failed[key] = e
            return False
        self.prepared[key] = p
        if self.use_memo:
            _MEMO.put(key, p)
        return True

    def candidate(self, space: Any, cfg: dict[str, Any], plan: Any, keys: list[str], spec: InputSpec,
                  fallback: bool) -> OperatorGraph | DippmNasError | None:
        """The stitched graph of a planned candidate whose blocks were fetched, the error that stops it, or
        ``None`` when it is to be captured whole (its blocks converted in mixed modes, with ``fallback``)."""
        failed = [(j, self.failed[k]) for j, k in enumerate(keys) if k in self.failed]
        if failed:
            j, err = failed[0]
            more = f" (and {len(failed) - 1} more of its blocks)" if len(failed) > 1 else ""
            e = GraphCaptureError(f"{space.name} candidate: block {j} ({_describe(plan.blocks[j])}) could not "
                                  f"be captured{more}: {type(err).__name__}: {err}")
            e.__cause__ = err
            return e
        preps = [self.prepared[k] for k in keys]
        modes = {p.mode for p in preps}
        if modes <= _FAST_MODES:
            mode = "export+opaque" if "export+opaque" in modes else "export"
        elif modes == {"export+decompose"}:
            mode = "export+decompose"
        elif fallback:
            logger.info("%s candidate: its blocks converted in modes %s; capturing it whole", space.name,
                        sorted(modes))
            return None
        else:
            return GraphCaptureError(
                f"{space.name} candidate: its blocks converted in modes {sorted(modes)}, which a whole capture "
                "would not mix; pass fallback=True to capture it whole")
        g = _stitch(space.name, plan, preps, spec, mode)
        g.model_key = _candidate_key(space, cfg, spec)
        g.cache_hit = all(k in self.from_cache for k in keys)
        return g

    def fetch(self, workers: int, progress: bool) -> None:
        """Every needed block: from the conversion cache, else captured (and stored)."""
        todo = []
        for key, (space, block, bspec) in self.needed.items():
            g = self._store_get(key)
            if g is not None and self._accept(key, g, space, block, bspec):
                self.from_cache.add(key)
            elif key not in self.failed:
                todo.append(key)
        if todo:
            logger.info("capturing %d blocks", len(todo))
            items = [(functools.partial(_build_block, self.needed[k][0], self.needed[k][1]), self.needed[k][2])
                     for k in todo]
            for key, g in zip(todo, _capture_items(items, workers, False, progress)):
                space, block, bspec = self.needed[key]
                if isinstance(g, OperatorGraph):
                    if self._accept(key, g, space, block, bspec):
                        self._store_put(key, g)
                else:
                    self.failed[key] = g
        self.needed.clear()
