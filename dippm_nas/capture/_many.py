"""Batched conversion: ``capture_many(items, workers=N)`` with a process pool, the cache and a progress bar."""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from dippm_nas._numbers import as_int
from dippm_nas.capture._capture import CacheArg, ModelLike, _resolve_cache, capture, check_decompose
from dippm_nas.errors import DippmNasError, InputSpecError, ModelSpecError
from dippm_nas.graph import OperatorGraph
from dippm_nas.spec import InputSpec

__all__ = ["CaptureResult", "capture_many"]

logger = logging.getLogger(__name__)

#: An item is ``(model, spec)``; ``model`` is anything :func:`capture` takes, or a zero-argument
#: callable returning an ``nn.Module`` (e.g. ``functools.partial(search_spaces.build_model, name, config)``),
#: which lets workers build the model themselves instead of receiving it.
Item = tuple["ModelLike | Callable[[], Any]", InputSpec]


@dataclass
class CaptureResult:
    """The outcome of one item of :func:`capture_many`.

    Attributes:
        index: position of the item in the input.
        graph: the graph, or ``None`` when the item failed.
        error: ``"ErrorType: message"`` when it failed, else ``None``.
        error_type: the exception class name (``"GraphCaptureError"``, ``"InputShapeError"``...).
        cache_hit: whether the graph came from the conversion cache.
        seconds: wall time spent on this item (in its worker).
    """

    index: int
    graph: OperatorGraph | None
    error: str | None = None
    error_type: str | None = None
    cache_hit: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.graph is not None


def _materialise(model: Any) -> Any:
    """The model of an item: ``model()`` for a builder (whatever it raises is a :class:`ModelSpecError`)."""
    import torch

    if callable(model) and not isinstance(model, torch.nn.Module):
        try:
            return model()
        except DippmNasError:
            raise
        except Exception as e:  # noqa: BLE001 - the builder is user code
            name = getattr(model, "__qualname__", None) or type(model).__name__
            raise ModelSpecError(f"the item's model builder {name} raised {type(e).__name__}: {e}") from e
    return model


def _unpack(index: int, item: Any) -> tuple[Any, InputSpec]:
    """``(model, spec)`` of an item, or :class:`InputSpecError` when it is not such a pair."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InputSpecError(f"item {index} must be a (model, InputSpec) pair, got {type(item).__name__} "
                             f"{repr(item)[:80]}")
    model, spec = item
    if not isinstance(spec, InputSpec):
        raise InputSpecError(f"item {index}: the spec must be a dippm_nas.InputSpec, got {type(spec).__name__} "
                             f"{repr(spec)[:80]}")
    return model, spec


def _failed(index: int, e: BaseException, seconds: float = 0.0) -> "CaptureResult":
    return CaptureResult(index, None, f"{type(e).__name__}: {e}", type(e).__name__, seconds=seconds)


def _one(index: int, model: Any, spec: InputSpec, decompose: bool | str, use_cache: bool) -> tuple:
    """Worker body: returns plain data (graph JSON or the error), never raises."""
    t0 = time.perf_counter()
    try:
        g = capture(_materialise(model), spec, cache=use_cache, decompose=decompose)
        return index, g.to_json(), g.cache_hit, None, None, time.perf_counter() - t0, g.timings
    except Exception as e:  # noqa: BLE001 - a failing candidate must never kill the batch
        if not isinstance(e, DippmNasError):
            logger.debug("item %d failed with an unexpected %s", index, type(e).__name__, exc_info=True)
        return index, None, False, type(e).__name__, f"{type(e).__name__}: {e}", time.perf_counter() - t0, {}


def _result(raw: tuple) -> CaptureResult:
    index, text, hit, etype, err, seconds, timings = raw
    graph = None
    if text is not None:
        try:
            graph = OperatorGraph.from_json(text)
        except Exception as e:  # noqa: BLE001 - a graph that does not come back intact is this item's failure
            return _failed(index, e, seconds)
        graph.cache_hit = hit
        graph.timings = dict(timings)
    return CaptureResult(index=index, graph=graph, error=err, error_type=etype, cache_hit=hit, seconds=seconds)


def capture_many(items: Iterable[Item], *, workers: int = 1, cache: CacheArg = True,
                 decompose: bool | str = "auto", progress: bool = True,
                 start_method: str = "spawn") -> list[CaptureResult]:
    """Capture many models, in parallel processes, sharing the conversion cache.

    Per-item failures come back as results with ``error`` set; a failing candidate (an item that is not
    a ``(model, InputSpec)`` pair, a builder that raises, a worker process that crashes on it) never stops
    the batch, and neither does a conversion cache that cannot be opened (one warning, then uncached).
    Results are in input order, one per item.

    Args:
        items: ``(model, spec)`` pairs; see :data:`Item`.
        workers: processes to convert in; ``1`` converts in this process.
        cache: as in :func:`capture`; workers open the same cache (SQLite in WAL mode or any RDB), so
            a ``ConversionCache`` object is passed to workers as its URL.
        decompose: as in :func:`capture`.
        progress: show a progress bar.
        start_method: multiprocessing start method for the pool (``"spawn"`` is safe with torch/TVM threads;
            it re-imports the calling script in each worker, so a script calls this from under
            ``if __name__ == "__main__":``).

    Returns:
        One :class:`CaptureResult` per item.
    """
    from tqdm.auto import tqdm

    items = list(items)
    workers = as_int(workers, "workers", low=1, hint=" (conversion processes)")
    check_decompose(decompose)
    store = _resolve_cache(cache)
    results: list[CaptureResult | None] = [None] * len(items)
    bar = tqdm(total=len(items), desc="capturing", unit="model", disable=not progress, leave=False)
    pairs = _unpack_all(items, results, bar)
    pending = [i for i, p in enumerate(pairs) if p is not None]
    if workers == 1 or len(pending) <= 1:
        _capture_here(pending, pairs, results, bar, store, decompose)
    else:
        _capture_in_pool(pending, pairs, results, bar, store, decompose, workers, start_method)
    bar.close()
    return [r for r in results if r is not None]


def _unpack_all(items: list[Item], results: list[CaptureResult | None], bar: Any
                ) -> list[tuple[Any, InputSpec] | None]:
    """Each item as a ``(model, spec)`` pair; an item that is not one becomes a failed result (``None`` pair)."""
    pairs: list[tuple[Any, InputSpec] | None] = [None] * len(items)
    for i, item in enumerate(items):
        try:
            pairs[i] = _unpack(i, item)
        except InputSpecError as e:
            results[i] = _failed(i, e)
            bar.update(1)
    return pairs


def _capture_here(pending: list[int], pairs: list[tuple[Any, InputSpec] | None],
                  results: list[CaptureResult | None], bar: Any, store: Any, decompose: bool | str) -> None:
    """Capture the pending items one after the other in this process."""
    for i in pending:
        model, spec = pairs[i]  # type: ignore[misc]
        t0 = time.perf_counter()
        try:
            g = capture(_materialise(model), spec, cache=store if store is not None else False,
                        decompose=decompose)
            results[i] = CaptureResult(i, g, cache_hit=g.cache_hit, seconds=time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - per-item errors are results
            results[i] = _failed(i, e, time.perf_counter() - t0)
        bar.update(1)


def _capture_in_pool(pending: list[int], pairs: list[tuple[Any, InputSpec] | None],
                     results: list[CaptureResult | None], bar: Any, store: Any, decompose: bool | str,
                     workers: int, start_method: str) -> None:
    """Capture the pending items in a process pool; items in flight when a worker crashed are retried alone."""
    # Workers share the store through its URL (engines do not cross processes).
    env_url = store.url_with_credentials() if store is not None else None
    ctx = mp.get_context(start_method)
    crashed: list[int] = []
    with ProcessPoolExecutor(max_workers=min(workers, len(pending)), mp_context=ctx,
                             initializer=_init_worker, initargs=(env_url, store is not None)) as pool:
        futures: dict[Future, int] = {}
        for i in pending:
            try:
                futures[pool.submit(_one, i, pairs[i][0], pairs[i][1], decompose, store is not None)] = i  # type: ignore[index]
            except Exception as e:  # noqa: BLE001 - e.g. a pool that broke on an earlier item
                results[i] = _failed(i, e)
                bar.update(1)
        for fut in _as_completed(futures):
            i = futures[fut]
            try:
                results[i] = _result(fut.result())
            except BrokenProcessPool:
                crashed.append(i)
                continue
            except Exception as e:  # noqa: BLE001 - e.g. the model could not be sent to the worker
                results[i] = _failed(i, e)
            bar.update(1)
    # A crashed worker breaks the pool for every item in flight: retry each alone so only the
    # culprit fails.
    for i in crashed:
        results[i] = _capture_alone(i, pairs[i], ctx, env_url, store is not None, decompose)  # type: ignore[arg-type]
        bar.update(1)


def _capture_alone(i: int, pair: tuple[Any, InputSpec], ctx: Any, env_url: str | None, cached: bool,
                   decompose: bool | str) -> CaptureResult:
    """Item ``i`` in a fresh one-process pool (``WorkerCrashed`` when that process dies too)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_init_worker,
                             initargs=(env_url, cached)) as solo:
        try:
            return _result(solo.submit(_one, i, pair[0], pair[1], decompose, cached).result())
        except BrokenProcessPool:
            return CaptureResult(i, None, "WorkerCrashed: the conversion process died on this model",
                                 "WorkerCrashed")
        except Exception as e:  # noqa: BLE001 - per-item errors are results
            return _failed(i, e)


def _as_completed(futures: dict[Future, int]) -> Iterable[Future]:
    return as_completed(futures)


def _init_worker(url: str | None, use_cache: bool) -> None:
    """Point the worker's default cache at the parent's store."""
    if use_cache and url is not None:
        from dippm_nas.cache import ConversionCache, set_default_cache  # SQLAlchemy only where a cache is used

        set_default_cache(ConversionCache(url))
