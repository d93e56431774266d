"""``predict`` / ``predict_many``: model or graph in, :class:`Prediction` out, on a catalogue device."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dippm_nas._numbers import as_bool, as_int
from dippm_nas.budgets import check_k_sigma
from dippm_nas.capture import CacheArg, ModelSource, assemble, assemble_chunks, capture, capture_many
from dippm_nas.deployment import Deployment
from dippm_nas.errors import CheckpointError, DippmNasError, InputSpecError, InvalidTypeError
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.devices import HostProfile, resolve_device
from dippm_nas.predictor._base import AnalyticPredictor, BasePredictor, deployment_of
from dippm_nas.prior import DeploymentSettings
from dippm_nas.predictor._checkpoint import checkpoint_candidates
from dippm_nas.predictor._gnn import GnnPredictor
from dippm_nas.spec import InputSpec

__all__ = ["predict", "predict_many", "get_predictor", "set_predictor", "DEFAULT_DEVICE", "PREDICT_CHUNK"]

logger = logging.getLogger(__name__)

#: The device :func:`predict` answers for when none is named.
DEFAULT_DEVICE = "a100-sxm4-40gb"
#: Search-space candidates :func:`predict_many` assembles and predicts at a time (it holds at most this many of
#: their graphs, and the predictor's stacks of them, at once). Measured on 4,096 new ``mbconv`` candidates with
#: blocks cached (the ``predict_many`` setting of ``benchmarks/speed/bench_assembly.py``, one process per chunk size,
#: load average 2-3 on 2 cores): chunks of 256 / 512 / 1,024 / 2,048 took 11.9 / 11.8 / 12.5 / 13.3 s of CPU at
#: a peak RSS of 567 / 624 / 766 / 1,046 MiB.
PREDICT_CHUNK = 512

_PREDICTORS: dict[str, BasePredictor] = {}
_LOCK = threading.Lock()


def _load_trained(device: str) -> BasePredictor | None:
    """The trained predictor for ``device`` or ``None`` when no checkpoint exists.

    A checkpoint that cannot be loaded (a corrupt or incompatible file in ``$DIPPM_NAS_CHECKPOINT_DIR``)
    is skipped with a warning and the next one answers (the shipped one).

    Raises:
        CheckpointError: no candidate checkpoint could be loaded (the first error, with the others noted).
    """
    errors: list[CheckpointError] = []
    for path in checkpoint_candidates(device):
        try:
            predictor = GnnPredictor.load(path, device=device)
        except CheckpointError as e:
            errors.append(e)
            continue
        if errors:
            msg = (f"predictor checkpoint(s) for {device!r} could not be loaded ({'; '.join(map(str, errors))}); "
                   f"falling back to {path}")
            logger.debug(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
        return predictor
    if errors:
        raise CheckpointError(f"no checkpoint for {device!r} could be loaded: {'; '.join(map(str, errors))}") \
            from errors[0]
    return None


def get_predictor(device: str = DEFAULT_DEVICE) -> BasePredictor:
    """The predictor answering for ``device``, loaded once per process and cached.

    A trained checkpoint for the device is used when one exists; otherwise the analytic prior answers,
    with a warning (once per device) and every source ``"analytic"``.

    Raises:
        DeviceError: unknown device id (the message lists the catalogue).
    """
    dev_id = resolve_device(device).id
    with _LOCK:
        p = _PREDICTORS.get(dev_id)
        if p is None:
            p = _load_trained(dev_id)
            if p is None:
                msg = (f"no trained predictor checkpoint for device {dev_id!r}: answering with the analytic "
                       "prior (sources 'analytic')")
                logger.debug(msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=3)
                p = AnalyticPredictor(dev_id)
            _PREDICTORS[dev_id] = p
    return p


def set_predictor(device: str, predictor: BasePredictor | None) -> None:
    """Use ``predictor`` for ``device`` from now on (``None`` forgets it, so the next call reloads)."""
    dev_id = resolve_device(device).id
    with _LOCK:
        if predictor is None:
            _PREDICTORS.pop(dev_id, None)
        else:
            if not isinstance(predictor, BasePredictor):
                raise InvalidTypeError(f"predictor must be a BasePredictor (an AnalyticPredictor or a GnnPredictor) or "
                                       f"None, got {type(predictor).__name__}")
            _PREDICTORS[dev_id] = predictor


def _graph_of(source: ModelSource, cache: CacheArg) -> OperatorGraph:
    """The graph of ``source``: its own, assembled from a search space's cached blocks, or captured."""
    if source.graph is not None:
        return source.graph
    if source.assemblable:  # a registered search space's candidate: assembled from cached blocks (the same graph)
        return assemble(source.search_space, source.search_space_config, source.spec, cache=cache)
    return capture(source, None, cache=cache)


def _takes_deployment(predictor: BasePredictor) -> bool:
    """Whether ``predictor.predict_graphs`` has a ``deployment`` parameter (a plug-in predictor written for the
    ``runtime`` / ``host`` keywords alone has not)."""
    params = inspect.signature(predictor.predict_graphs).parameters
    return "deployment" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _predict_graphs(predictor: BasePredictor, graphs: list[OperatorGraph], *, mig: bool, k_sigma: float,
                    deployment: DeploymentSettings) -> list[Prediction]:
    """The predictor's answers for the resolved ``deployment``, each recording it in ``labels["deployment"]``: a
    shipped predictor takes the settings as they are (:attr:`BasePredictor.takes_resolved_deployment`), a plug-in
    the :class:`~dippm_nas.Deployment` they resolve."""
    dep = deployment.deployment
    assert dep is not None  # settings of _checked
    if predictor.takes_resolved_deployment:
        preds = predictor.predict_graphs(graphs, mig=mig, k_sigma=k_sigma, deployment=deployment)
    elif _takes_deployment(predictor):
        preds = predictor.predict_graphs(graphs, mig=mig, k_sigma=k_sigma, deployment=dep)
    else:
        preds = predictor.predict_graphs(graphs, mig=mig, k_sigma=k_sigma, runtime=dep.runtime, host=dep.host)
    return [p if "deployment" in p.labels
            else dataclasses.replace(p, labels={**p.labels, "deployment": deployment.label})
            for p in preds]


def predict(model_or_graph: Any, spec: InputSpec | None = None, device: str = DEFAULT_DEVICE, *,
            cache: CacheArg = True, mig: bool = True, k_sigma: float = 2.0,
            deployment: Deployment | DeploymentSettings | Mapping[str, Any] | str | Path | None = None,
            runtime: str | None = None, host: HostProfile | str | Path | None = None) -> Prediction:
    """Predicted latency, energy and memory of one model on ``device``.

    Args:
        model_or_graph: an ``nn.Module``, ONNX path, model SPEC string, zero-argument factory, :class:`OperatorGraph`
            or :class:`~dippm_nas.capture.ModelSource` (parsed once by :meth:`ModelSource.parse`). A model from a
            registered search space (built by ``search_spaces.build_model``, or the lazy
            ``functools.partial(search_spaces.build_model, name, config)``) is assembled from cached blocks
            (:func:`dippm_nas.capture.assemble`: the same graph as a whole capture, without exporting it).
        spec: the input spec (required unless a graph is given).
        device: catalogue id (``dippm-nas devices`` lists them); default ``"a100-sxm4-40gb"``.
        cache: conversion cache, as in :func:`dippm_nas.capture`.
        mig: attach the MIG advisor's answer.
        k_sigma: standard deviations of memory added before choosing the smallest fitting MIG profile.
        deployment: how inference runs on a GPU (:class:`~dippm_nas.Deployment`: runtime, host, framework,
            TF32, autocast, input copy...), a mapping of its fields, or a JSON/TOML file
            (``dippm-nas deployment --out FILE``); ``None``: nothing described but ``runtime`` and ``host``
            (what is not described is assumed: ``labels["deployment_assumed"]`` lists it); or the settings
            :func:`~dippm_nas.predictor.resolve_deployment` returned, which an entry that predicts many times
            resolves once and passes here as they are.
        runtime: shorthand for ``Deployment(runtime=...)``: ``"eager"`` (the default: PyTorch eager,
            per-operator host dispatch on the critical path), ``"cuda-graphs"`` (the same kernels replayed from
            one CUDA graph) or ``"compiled"`` (``torch.compile`` default mode: element-wise chains fused).
        host: shorthand for ``Deployment(host=...)``: a :class:`~dippm_nas.devices.HostProfile`, a profile JSON
            file (``dippm-nas host-profile --out FILE``) or ``"default"`` (a typical datacenter host).

    Returns:
        A :class:`Prediction`; each figure says its source (``"predicted"``, ``"analytic"``, ``"calibrated"``);
        ``host_ms`` and ``gpu_ms`` are the two timelines, ``labels["runtime"]`` the runtime and
        ``labels["deployment"]`` the deployment (:attr:`Deployment.label`).

    Raises:
        DeploymentError: a bad deployment (the field, the value and the choices are named), or a ``runtime`` /
            ``host`` that conflicts with it.
        ExecutionRuntimeError: an unknown runtime (the choices are listed).
        DeviceError: an unknown device or an unreadable host profile.
    """
    predictor, mig, k_sigma, dep = _checked(device, mig, k_sigma, deployment, runtime, host)  # before any capture
    graph = _graph_of(ModelSource.parse(model_or_graph, spec), cache)
    (pred,) = _predict_graphs(predictor, [graph], mig=mig, k_sigma=k_sigma, deployment=dep)
    return pred


def _checked(device: str, mig: Any, k_sigma: Any, deployment: Any, runtime: Any,
             host: Any) -> tuple[BasePredictor, bool, float, DeploymentSettings]:
    """The predictor of ``device``, ``mig``, ``k_sigma`` and the deployment resolved for the device (the one
    coercion of a request: :func:`~dippm_nas.predictor.resolve_deployment`), once every option of
    :func:`predict` / :func:`predict_many` is checked (a bad one fails before any conversion)."""
    mig = as_bool(mig, "mig")
    k_sigma = check_k_sigma(k_sigma)
    if isinstance(deployment, DeploymentSettings):  # resolved by the caller (resolve_deployment): passed as it is
        dep: Any = deployment
    else:
        dep, runtime, host = Deployment.coerce(deployment, runtime=runtime, host=host), None, None
    predictor = get_predictor(device)
    _, settings = deployment_of(predictor.resolved_device, dep, runtime, host)
    return predictor, mig, k_sigma, settings


def predict_many(items: Iterable[Any], device: str = DEFAULT_DEVICE, *, workers: int = 1,
                 cache: CacheArg = True, mig: bool = True, k_sigma: float = 2.0,
                 progress: bool = False,
                 deployment: Deployment | DeploymentSettings | Mapping[str, Any] | str | Path | None = None,
                 runtime: str | None = None,
                 host: HostProfile | str | Path | None = None) -> list[Prediction | DippmNasError]:
    """Predictions for many candidates: batched conversion, then one batched predictor pass.

    A model that comes from a registered search space (built by ``search_spaces.build_model``, or the lazy
    ``functools.partial(search_spaces.build_model, name, config)``; see
    :func:`dippm_nas.capture.space_config_of`) is not exported: its graph is assembled from cached blocks
    (:func:`dippm_nas.capture.assemble_chunks`), the same graph in milliseconds; such candidates are assembled
    and predicted :data:`PREDICT_CHUNK` at a time, so a call over many of them holds that many graphs at most.

    Args:
        items: :class:`OperatorGraph` objects, :class:`~dippm_nas.capture.ModelSource` objects or ``(model, spec)``
            pairs (``model`` in any form :func:`predict` takes).
        device, cache, mig, k_sigma, deployment, runtime, host: as for :func:`predict`.
        workers: conversion processes for the items that are not graphs yet.
        progress: show a progress bar while converting.

    Returns:
        One entry per item, in order: a :class:`Prediction`, or the :class:`DippmNasError` that stopped
        that item (a failing candidate never fails the batch).
    """
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise InvalidTypeError(f"items must be a list of OperatorGraphs, ModelSources or (model, InputSpec) pairs, "
                               f"got {type(items).__name__}")
    items = list(items)
    workers = as_int(workers, "workers", low=1, hint=" (conversion processes)")
    progress = as_bool(progress, "progress")
    predictor, mig, k_sigma, dep = _checked(device, mig, k_sigma, deployment, runtime, host)  # before any conversion
    out: list[Prediction | DippmNasError | None] = [None] * len(items)
    graphs: list[OperatorGraph | None] = [None] * len(items)
    spaced: list[tuple[int, Any]] = []
    whole: list[tuple[int, Any]] = []
    for i, it in enumerate(items):
        try:
            source = _source_of(i, it)
        except DippmNasError as e:  # a bad item fails alone
            out[i] = e
            continue
        if source.graph is not None:
            graphs[i] = source.graph
        elif source.assemblable:
            spaced.append((i, (source.search_space, source.search_space_config, source.spec)))
        else:
            whole.append((i, (source.model, source.spec)))
    # search-space candidates: assembled and predicted a chunk at a time, so at most PREDICT_CHUNK graphs are held
    for results in (assemble_chunks([it for _, it in spaced], chunk_size=PREDICT_CHUNK, workers=workers, cache=cache,
                                    progress=progress) if spaced else ()):
        done = [(spaced[r.index][0], r) for r in results]
        for i, r in done:
            if r.graph is None:
                out[i] = DippmNasError(r.error or "capture failed")
        done = [(i, r) for i, r in done if r.graph is not None]
        preds = _predict_graphs(predictor, [r.graph for _, r in done], mig=mig, k_sigma=k_sigma,
                                deployment=dep) if done else []
        for (i, _), p in zip(done, preds):
            out[i] = p
    if whole:
        for (i, _), r in zip(whole, capture_many([it for _, it in whole], workers=workers, cache=cache,
                                                 progress=progress)):
            if r.graph is not None:
                graphs[i] = r.graph
            else:
                out[i] = DippmNasError(r.error or "capture failed")
    ok = [i for i, g in enumerate(graphs) if g is not None]
    preds = (_predict_graphs(predictor, [graphs[i] for i in ok], mig=mig, k_sigma=k_sigma, deployment=dep)
             if ok else [])
    for i, p in zip(ok, preds):
        out[i] = p
    return [o for o in out]  # type: ignore[misc]


def _source_of(index: int, item: Any) -> ModelSource:
    """The :class:`ModelSource` of item ``index`` of :func:`predict_many`.

    Raises:
        InputSpecError: the item is no graph, no ModelSource and no ``(model, InputSpec)`` pair.
        ModelSpecError: the model is none of the forms :func:`predict` takes.
    """
    if isinstance(item, (OperatorGraph, ModelSource)):
        return ModelSource.parse(item)
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InputSpecError(f"item {index} must be an OperatorGraph, a ModelSource or a (model, InputSpec) pair, got "
                             f"{type(item).__name__} {repr(item)[:80]}")
    try:
        return ModelSource.parse(*item)
    except DippmNasError as e:
        raise type(e)(f"item {index}: {e}") from e
