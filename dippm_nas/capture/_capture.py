"""The public ``capture`` entry point: any model form (a :class:`ModelSource`) -> cached :class:`OperatorGraph`."""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union

from dippm_nas.capture._key import file_key, model_key, named_model_key
from dippm_nas.capture._onnx import capture_onnx, read_onnx_bytes
from dippm_nas.capture._source import ModelSource
from dippm_nas.capture._torch import capture_module
from dippm_nas.cache import read_default_sqlite
from dippm_nas.errors import (
    CacheError,
    DippmNasError,
    GraphCaptureError,
    InvalidTypeError,
    InvalidValueError,
)
from dippm_nas.graph import OperatorGraph
from dippm_nas.spec import InputSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from dippm_nas.cache import ConversionCache

__all__ = ["capture", "ModelLike", "CacheArg"]

logger = logging.getLogger(__name__)

#: What :func:`capture` accepts as a model (the forms of :class:`ModelSource`).
ModelLike = Union["torch.nn.Module", str, os.PathLike, OperatorGraph, ModelSource, Callable[[], Any]]
#: ``True``: the process-wide default cache; ``False``/``None``: no cache; or a ConversionCache.
CacheArg = Union[bool, None, "ConversionCache"]


_warned_cache: set[str] = set()


def _warn_cache_down(e: Exception) -> None:
    """A broken cache must not stop a search: warn once per message and carry on without it. One channel: a
    ``RuntimeWarning`` (the CLI prints warnings through its log), logged at DEBUG only (see
    :mod:`dippm_nas._logging`)."""
    text = str(e)
    if text not in _warned_cache:
        _warned_cache.add(text)
        msg = f"conversion cache unavailable, capturing without it: {text}"
        logger.debug(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def check_decompose(decompose: object) -> None:
    """:class:`InvalidValueError` unless ``decompose`` is ``"auto"``, ``True`` or ``False``."""
    if not (decompose == "auto" or isinstance(decompose, bool)):
        raise InvalidValueError(f"decompose must be 'auto' (decompose only when the fast export cannot be converted), "
                                f"True or False, got {decompose!r}")


def _resolve_cache(cache: CacheArg) -> "ConversionCache | None":
    """The store of ``cache``; ``None`` (with one warning) when the default cache cannot be opened.

    Raises:
        InvalidTypeError: ``cache`` is not a bool, ``None`` or a cache object (a ``get`` and a ``put``).
    """
    if not isinstance(cache, bool) and cache is not None \
            and not (callable(getattr(cache, "get", None)) and callable(getattr(cache, "put", None))):
        raise InvalidTypeError(f"cache must be True (the default conversion cache), False or None (no cache), or a "
                               f"dippm_nas.cache.ConversionCache; got {type(cache).__name__} {cache!r}")
    if cache is None or cache is False:
        return None
    if cache is True:
        # SQLAlchemy loads with the first cache used, so that `gpu-campaign` runs where it is not installed
        from dippm_nas.cache import default_cache

        try:
            return default_cache()
        except CacheError as e:
            _warn_cache_down(e)
            return None
    return cache


def _lookup(store: ConversionCache, key: str) -> tuple[OperatorGraph | None, ConversionCache | None]:
    """``store.get(key)`` and the store to go on with: ``None`` (uncached from here on) when it is down."""
    try:
        return store.get(key), store
    except CacheError as e:
        _warn_cache_down(e)
        return None, None


def _served(hit: OperatorGraph, t0: float) -> OperatorGraph:
    """A cached graph marked as a hit, with the lookup's time."""
    hit.cache_hit = True
    hit.timings = {"lookup_s": time.perf_counter() - t0}
    return hit


def capture(model: ModelLike, spec: InputSpec | None, *, cache: CacheArg = True,
            decompose: bool | str = "auto") -> OperatorGraph:
    """Capture a model as an :class:`OperatorGraph` (one node per Relax operator call).

    PyTorch modules go through ``torch.export`` and Relax's ``from_exported_program`` without
    decomposition, falling back to the decomposing mode when that fails (``graph.mode`` says which).
    ONNX files go through Relax's ONNX frontend. A cheap pre-export key of the model definition
    is looked up in the conversion cache first, so a hit skips export entirely.

    Args:
        model: an ``nn.Module``, a path to an ``.onnx`` file, a model SPEC string (``torchvision:NAME``,
            ``timm:NAME``, ``package.module:callable``), a zero-argument factory returning an ``nn.Module``,
            a :class:`ModelSource`, or an :class:`OperatorGraph` (returned as it is).
        spec: the example input (shape without batch, batch size, dtype; or named inputs); ``None`` only with
            a graph or a :class:`ModelSource`.
        cache: ``True`` for the default cache (see :mod:`dippm_nas.cache`), ``False`` for none, or a
            ``ConversionCache``.
        decompose: ``"auto"``, or force ``False``/``True`` for ``run_ep_decomposition``.

    Returns:
        The validated graph; ``graph.cache_hit`` tells whether it came from the cache.

    Raises:
        ModelSpecError: ``model`` is none of the accepted forms, an unknown SPEC / missing file, or a factory
            that fails.
        InputSpecError: ``spec`` is not an InputSpec; InputShapeError when the shape does not fit.
        GraphCaptureError: export or conversion failed (data-dependent control flow, unsupported op...).
    """
    source = ModelSource.parse(model, spec)
    check_decompose(decompose)
    if source.graph is not None:
        return source.graph
    t0 = time.perf_counter()
    # a library SPEC (torchvision:NAME...) is looked up by name first: a hit builds no model
    named = named_model_key(source.model, source.spec) if source.kind == "spec" and decompose == "auto" else None
    if named is not None and cache is True:
        hit = read_default_sqlite(named)  # the default SQLite file, read without SQLAlchemy
        if hit is not None:
            return _served(hit, t0)
    store = _resolve_cache(cache)
    t0 = time.perf_counter()
    if named is not None and store is not None:
        hit, store = _lookup(store, named)
        if hit is not None:
            return _served(hit, t0)
    built = source.build()
    key = file_key(read_onnx_bytes(built), source.spec) if source.kind == "onnx" else model_key(built, source.spec)
    if decompose != "auto":
        key = f"{key}:decompose={int(bool(decompose))}"

    if store is not None:
        hit, store = _lookup(store, key)
        if hit is not None:
            _put_named(store, named, hit)
            return _served(hit, t0)
    graph = _convert(source, built, decompose, key)
    if store is not None:
        try:
            store.put(key, graph)
        except CacheError as e:
            _warn_cache_down(e)
        _put_named(store, named, graph)
    graph.cache_hit = False
    return graph


def _convert(source: ModelSource, built: Any, decompose: bool | str, key: str) -> OperatorGraph:
    """The graph of ``built`` (the module or ONNX path of ``source``), converted now."""
    if source.kind == "onnx":
        try:
            return capture_onnx(built, source.spec, source=source.label, model_key=key)
        except DippmNasError:
            raise
        except Exception as e:  # noqa: BLE001 - every capture failure reaches the caller as a DippmNasError
            raise GraphCaptureError(f"capturing {source.label} failed: {type(e).__name__}: {e}") from e
    graph = capture_module(built, source.spec, decompose=decompose, model_key=key)
    if source.kind == "spec":
        graph.source = source.label
    return graph


def _put_named(store: "ConversionCache", named: str | None, graph: OperatorGraph) -> None:
    if named is None:
        return
    try:
        store.put(named, graph)
    except CacheError as e:
        _warn_cache_down(e)
