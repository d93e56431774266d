"""The GraphSAGE predictor: :class:`GnnPredictor`, a trained ensemble answering for one device.

The prediction is the mean of the ensemble's members (:mod:`~dippm_nas.predictor._ensemble`) in log
space and its standard deviation ``sqrt(std_members**2 + floor**2)`` (``floor`` fitted on the
validation split so that about 95% of validation labels fall within ±2σ), turned into units with
the delta method (``std_ms = latency_ms * std_log``). A graph whose graph-level features (size, batch,
dtype, prior totals, device) fall outside the training range gets ``0.5 * delta_max`` added in
quadrature (the correction is then only known to lie within its bound) and
``details["outside_training_range"] = 1``. A host-cpu checkpoint has seen one machine, so its range check
covers the graph's own features only: on another CPU model it adds the measured cross-host floor,
flagged ``details["other_host"] = 1``; on a machine of its CPU model whose host microbenchmark lies outside
the device features it was trained at (another VM of the same model) the measured other-machine floor,
flagged ``details["other_machine"] = 1`` (see :mod:`~dippm_nas.predictor._checkpoint`).
A graph whose compute dtype no training graph had (bfloat16 for the A100 checkpoint) gets the
prior itself, the centre of the correction's bound, with that σ: the network's correction is not
identified for a one-hot input that never varied (source ``"analytic"``, ``details["dtype_unseen"] = 1``).
So does a graph farther from every training graph than any held-out row the correction was checked on
(``NoveltyFloor.validated_max``; source ``"analytic"``, ``details["correction_weight_<target>"] = 0``).

The predictor is composed of one part per form the data takes: checkpoint files to a network engine
(:mod:`~dippm_nas.predictor._gnn_load`: :meth:`GnnPredictor.load`, :meth:`GnnPredictor.save`; the metadata is
:class:`~dippm_nas.predictor.CheckpointMeta`), graphs to features and log answers with their novelty
(:class:`~dippm_nas.predictor._gnn_infer.GnnInference`, :attr:`GnnPredictor.inference`), log answers to
predictions (:class:`~dippm_nas.predictor._gnn_compose.PredictionComposer`, :attr:`GnnPredictor.composer`), and
measured rows to a calibration or a stored adaptation (:class:`~dippm_nas.predictor._gnn_adapt.GnnAdaptation`,
:attr:`GnnPredictor.adaptations`). :class:`GnnPredictor` keeps every public name and answers through them.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dippm_nas._logging import WarnOnce
from dippm_nas._platform import cpu_model_name
from dippm_nas.deployment import Deployment
from dippm_nas.devices import HostProfile, resolve_device
from dippm_nas.features import GraphFeatures
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.predictor._adapt import ANY_SPACE, Adaptation
from dippm_nas.predictor._base import BATCH_MIN_GRAPHS, BasePredictor
from dippm_nas.predictor._calibrate import Calibration, read_calibration
from dippm_nas.predictor._checkpoint import OTHER_HOST_FLOOR_LOG, OTHER_MACHINE_FLOOR_LOG
from dippm_nas.predictor._gnn_adapt import GnnAdaptation
from dippm_nas.predictor._gnn_compose import PredictionComposer
from dippm_nas.predictor._gnn_infer import GnnInference, graph_key
from dippm_nas.predictor._gnn_load import load_checkpoint, save_checkpoint, torch_engine, weights_sha256
from dippm_nas.predictor._meta import CheckpointMeta
from dippm_nas.predictor._numpy_ensemble import NumpyEnsemble
from dippm_nas.prior import PriorParams

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from dippm_nas.predictor._ensemble import SageEnsemble

__all__ = ["GnnPredictor"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger, python_warning=True)

class GnnPredictor(BasePredictor):
    """A trained GraphSAGE ensemble answering for one device.

    Figures of targets in ``meta.targets`` have source ``"predicted"`` (``"calibrated"`` once
    :meth:`calibrate` has run for the device); the other targets come from the analytic prior
    (``"analytic"``), or ``"unavailable"`` for energy on a device without power figures. Energy from the
    prior carries the power model's source and σ: ``"predicted"`` where the power model is fitted on
    measurements of the device's architecture.

    Features of a graph are cached per (structure, device), and finished predictions per (structure,
    MIG options, calibration), each in an LRU of ``feature_cache_size`` entries, so a search that
    revisits an architecture pays a dictionary lookup.

    The network runs in an *engine*: the torch :class:`~dippm_nas.predictor.SageEnsemble` (``model``), or,
    in a process that has not loaded torch, its numpy twin
    (:class:`~dippm_nas.predictor.NumpyEnsemble`, the same figures to 3e-5 relative) on the checkpoint's
    derived weights file. Reading :attr:`model`, or a request of more than
    :data:`~dippm_nas.predictor.NUMPY_MAX_GRAPHS` graphs, moves a numpy-engine predictor to the torch
    ensemble for good.
    """

    #: from this many new graphs per request on, the prior's stages run over the stack of graphs at once
    #: (:data:`~dippm_nas.predictor.BATCH_MIN_GRAPHS`; the same figures as graph by graph)
    batch_min_graphs: int = BATCH_MIN_GRAPHS
    takes_resolved_deployment = True  # predict_graphs takes resolve_deployment()'s settings as they are

    def __init__(self, model: "SageEnsemble | NumpyEnsemble", meta: CheckpointMeta, device: str | None = None, *,
                 feature_cache_size: int = 4096, load_calibration: bool = True,
                 novelty_ref: "torch.Tensor | np.ndarray | None" = None) -> None:
        self.meta = meta
        self._resolved_device = resolve_device(device or meta.device)  # once: a prediction passes it inward
        self.device = self._resolved_device.id
        #: the prediction's parts (one per form the data takes; see the module docstring)
        self.composer = PredictionComposer(self, feature_cache_size)
        self.inference = GnnInference(self, model if isinstance(model, NumpyEnsemble) else torch_engine(model),
                                      novelty_ref, feature_cache_size)
        self.adaptations = GnnAdaptation(self, load_adaptations=load_calibration)
        #: the analytic prior's constants pinned in the checkpoint (``None``: the package's), which its
        #: features and prior were computed with; featurise evaluation data with them
        self.prior_params: Any = None
        if meta.prior_params is not None:
            # checked with the metadata on load (CheckpointMeta.from_json), or written by training
            self.prior_params = PriorParams.from_dict(meta.prior_params, origin="checkpoint", trusted=True)
        self.calibration: Calibration | None = None
        #: why the device's persisted calibration file was not applied ("" when none was ignored); while set,
        #: every prediction carries ``details["calibration_ignored"] = 1``
        self.calibration_ignored = ""
        if load_calibration:
            self.calibration, self.calibration_ignored = read_calibration(self.device, self.meta)
        #: SHA-256 of the checkpoint file this predictor was loaded from (``None``: built in memory)
        self.checkpoint_sha256: str | None = None
        #: the checkpoint file it was loaded from (``None``: built in memory); its conformal calibration lies beside it
        self.checkpoint_path: Path | None = None
        #: the CPU model a host-cpu checkpoint was measured on when this machine's differs, else ``None``
        self.other_host: str | None = None
        #: the cross-host σ floor per target this predictor adds while ``other_host`` is set (a copy of
        #: :data:`~dippm_nas.predictor._checkpoint.OTHER_HOST_FLOOR_LOG`; ``benchmarks/accuracy/accuracy_other_host.py``
        #: empties it to measure the σ without it)
        self.other_host_floor_log: dict[str, float] = {}
        #: the σ floor per target a host checkpoint adds on a machine of its CPU model whose device features
        #: lie outside its training range (a copy of
        #: :data:`~dippm_nas.predictor._checkpoint.OTHER_MACHINE_FLOOR_LOG`; ``benchmarks/accuracy/accuracy_other_host.py
        #: --same-cpu-model`` empties it to measure the σ without it)
        self.other_machine_floor_log: dict[str, float] = {}
        #: torch thread count the host is featurised at (the labels'), or ``None`` (the caller's count)
        self.host_threads: int | None = None if meta.host is None else meta.host.get("threads")
        if meta.host is not None and cpu_model_name() != meta.host["cpu_model"]:
            self.other_host = meta.host["cpu_model"]
            self.other_host_floor_log = dict(OTHER_HOST_FLOOR_LOG)
            _warn_once(f"other-host:{self.other_host}",
                       "the %s checkpoint was measured on %r, this machine is %r: its predictions are flagged "
                       "details['other_host'] = 1 with a wider σ; calibrate it with a few measurements made here "
                       "(predictor.calibrate, or the validator's auto-calibration), or measure a dataset here and "
                       "train a checkpoint (dippm-nas dataset build --device cpu ..., dippm-nas train --device "
                       "host-cpu ...; data/host_cpu/README.md has the commands)",
                       self.device, self.other_host, cpu_model_name())
        elif meta.host is not None:
            self.other_machine_floor_log = dict(OTHER_MACHINE_FLOOR_LOG)

    # ------------------------------------------------------------------ io

    # ------------------------------------------------------------------ io
    @property
    def model(self) -> "SageEnsemble":
        """The torch ensemble (a numpy-engine predictor builds it from its weights and keeps it from now on)."""
        if isinstance(self.inference.engine, NumpyEnsemble):
            self.inference.use_torch()
        return self.inference.engine.model

    @model.setter
    def model(self, value: "SageEnsemble") -> None:
        self.inference.engine = torch_engine(value)
        self.clear_prediction_cache()

    @property
    def engine(self) -> str:
        """``"torch"`` or ``"numpy"``: which implementation of the network answers (the same figures)."""
        return "numpy" if isinstance(self.inference.engine, NumpyEnsemble) else "torch"

    @property
    def novelty_ref(self) -> "torch.Tensor | np.ndarray | None":
        """Standardised static features of training graphs ``[R, static_dim]`` (novelty scores; a tensor, or an
        array on the numpy engine), or ``None``."""
        return self.inference.novelty_ref

    @novelty_ref.setter
    def novelty_ref(self, value: "torch.Tensor | np.ndarray | None") -> None:
        self.inference.novelty_ref = value

    @classmethod
    def load(cls, path: str | Path, device: str | None = None, *, engine: str = "auto",
             **kwargs: Any) -> "GnnPredictor":
        """Load a checkpoint written by :meth:`save` (``torch.load(weights_only=True)``).

        In a process that has not imported torch, the checkpoint's derived weights file (plain numpy arrays in
        the cache directory, named by the checkpoint's SHA-256; see
        :mod:`~dippm_nas.predictor._numpy_ensemble`) is read instead and the numpy engine answers; a
        checkpoint loaded through torch writes that file when it is missing.

        Args:
            path: the ``.pt`` file.
            device: the device it must answer for (checked against the metadata); default: the metadata's.
            engine: ``"auto"`` (default: the numpy engine where torch is not imported yet and the derived file
                is there, else torch), ``"torch"``, or ``"numpy"`` (the derived file, written through torch
                first when it is missing).

        Raises:
            CheckpointError: unreadable file, bad metadata, schema/width mismatch, other device.
            InvalidValueError: an unknown ``engine``.
        """
        def build(model: Any, meta: CheckpointMeta, ref: Any) -> "GnnPredictor":
            return cls(model, meta, device, novelty_ref=ref, **kwargs)

        predictor, digest, path = load_checkpoint(path, device, engine, build)
        #: SHA-256 of the checkpoint file this predictor was loaded from, and the file
        predictor.checkpoint_sha256, predictor.checkpoint_path = digest, path
        return predictor

    def save(self, path: str | Path) -> None:
        """Write ``path`` (``.pt``) and its ``.json`` metadata sidecar, each through a temporary file renamed
        into place (:func:`dippm_nas._files.output_path`).

        Raises:
            CheckpointError: ``path`` or its sidecar is a directory, a FIFO, a device or a dangling symbolic
                link, or the write fails.
        """
        save_checkpoint(self.model, self.meta, self.novelty_ref, path)

    def checkpoint_hash(self) -> str:
        """SHA-256 of the checkpoint file (:attr:`checkpoint_sha256`), or of the weights of one built in memory."""
        if self.checkpoint_sha256 is not None:
            return self.checkpoint_sha256
        return weights_sha256(self.inference.engine)

    # ------------------------------------------------------------- inference (GnnInference)
    def features(self, graph: OperatorGraph, device: str | None = None) -> GraphFeatures:
        """Cached feature tensors of ``graph`` on ``device`` (default: this predictor's)."""
        return self.inference.features(graph, device)

    def predict_log(self, feats: Sequence[GraphFeatures], *,
                    chunk_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Ensemble mean and std of the log targets (:meth:`GnnInference.predict_log
        <dippm_nas.predictor._gnn_infer.GnnInference.predict_log>`)."""
        return self.inference.predict_log(feats, chunk_nodes=chunk_nodes)

    def predict_log_ood(self, feats: Sequence[GraphFeatures], *,
                        chunk_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`predict_log` plus, per graph, whether it lies outside the training range (``[num_graphs]`` bool)."""
        return self.inference.predict_log_ood(feats, chunk_nodes=chunk_nodes)

    def predict_log_full(self, feats: Sequence[GraphFeatures], *, chunk_nodes: int | None = None,
                         novelty: bool = True
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`predict_log_ood` plus each graph's novelty score and whether a host checkpoint runs on another
        machine of its CPU model (:meth:`GnnInference.predict_log_full
        <dippm_nas.predictor._gnn_infer.GnnInference.predict_log_full>`)."""
        return self.inference.predict_log_full(feats, chunk_nodes=chunk_nodes, novelty=novelty)

    def correction_weights(self, novelty: np.ndarray) -> dict[str, np.ndarray]:
        """Per shrunk target, the share of the network's correction each graph keeps (:meth:`GnnInference.\
correction_weights <dippm_nas.predictor._gnn_infer.GnnInference.correction_weights>`)."""
        return self.inference.correction_weights(novelty)

    def dtype_unseen(self, b: dict[str, Any]) -> np.ndarray:
        """Per graph of :func:`collate_globals` ``b``: is its compute dtype one no training graph had
        (:meth:`GnnInference.dtype_unseen <dippm_nas.predictor._gnn_infer.GnnInference.dtype_unseen>`)?"""
        return self.inference.dtype_unseen(b)

    def prior_only(self, feats: Sequence[GraphFeatures]) -> np.ndarray:
        """Per graph: is its compute dtype one of the checkpoint's ``prior_only_dtypes``?"""
        return self.inference.prior_only(feats)

    def sigma_log(self, target: str, std_members: float, *, ood: bool = False, novelty: float = math.nan,
                  other_machine: bool = False) -> float:
        """The log-space σ of one prediction (:meth:`GnnInference.sigma_log
        <dippm_nas.predictor._gnn_infer.GnnInference.sigma_log>`)."""
        return self.inference.sigma_log(target, std_members, ood=ood, novelty=novelty, other_machine=other_machine)

    def member_outputs(self, graphs: Sequence[OperatorGraph]) -> tuple[np.ndarray, np.ndarray]:
        """Each member's log answer ``[K, G, 3]`` (before any shrink, calibration or adaptation) and what its
        residual head reads (:func:`~dippm_nas.predictor._adapt.head_inputs`, ``[K, G, hidden + static]``)."""
        return self.inference.member_outputs(graphs)

    @contextlib.contextmanager
    def one_network_pass(self, graphs: Sequence[OperatorGraph]) -> Iterator[None]:
        """Within the block, the network runs once on ``graphs``: every prediction of graphs among them reuses
        their members' outputs. The predictor's feature cache must hold them all."""
        with self.inference.one_network_pass(graphs):
            yield

    def graph_key(self, graph: OperatorGraph) -> str:
        """What makes two measured rows the same graph (structure and input spec)."""
        return graph_key(graph)

    # ------------------------------------------------------------- predictions (PredictionComposer)
    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str | None = None, host: HostProfile | str | None = None,
                       deployment: Deployment | None = None) -> list[Prediction]:
        return self.composer.predict_graphs(graphs, mig=mig, k_sigma=k_sigma, runtime=runtime, host=host,
                                            deployment=deployment)

    def clear_prediction_cache(self) -> None:
        self.composer.clear()

    # ------------------------------------------------------------- calibration and adaptation (GnnAdaptation)
    def calibrate(self, measurements: Sequence[Any], *, persist: bool = True, runtime: str | None = None,
                  host: HostProfile | str | None = None,
                  deployment: Deployment | None = None) -> "Calibration | None":
        """Adapt to real measurements of this device (few-shot; :meth:`GnnAdaptation.calibrate
        <dippm_nas.predictor._gnn_adapt.GnnAdaptation.calibrate>` says how, what it returns and raises)."""
        return self.adaptations.calibrate(measurements, persist=persist, runtime=runtime, host=host,
                                          deployment=deployment)

    def fit_factor_calibration(self, pairs: Sequence[tuple[OperatorGraph, dict[str, float]]],
                               runtime: str | None = None, host: HostProfile | str | None = None, *,
                               deployment: Deployment | None = None) -> Calibration:
        """The factor calibration of :meth:`calibrate` fitted on ``(graph, {target: value})`` pairs, nothing
        activated or written (:meth:`GnnAdaptation.fit_factor_calibration
        <dippm_nas.predictor._gnn_adapt.GnnAdaptation.fit_factor_calibration>`)."""
        return self.adaptations.fit_factor_calibration(pairs, runtime, host, deployment=deployment)

    def reset_calibration(self, *, persist: bool = True) -> None:
        """Drop the active calibration (and its file when ``persist``)."""
        self.adaptations.reset_calibration(persist=persist)

    def adapt(self, measurements: Sequence[Any], *, persist: bool = True, storage: str | None = None,
              space: str | None = None, runtime: str | None = None, host: HostProfile | str | None = None,
              deployment: Deployment | None = None) -> Adaptation | None:
        """Fine-tune the ensemble to measured rows of this device: the factor calibration and a residual head
        per member, active at once (:meth:`GnnAdaptation.adapt <dippm_nas.predictor._gnn_adapt.GnnAdaptation.adapt>`
        says what each argument does, what it returns and raises)."""
        return self.adaptations.adapt(measurements, persist=persist, storage=storage, space=space, runtime=runtime,
                                      host=host, deployment=deployment)

    def activate_adaptation(self, ad: Adaptation) -> None:
        """Answer with ``ad`` (its factor calibration and heads) from now on, in this process."""
        self.adaptations.activate_adaptation(ad)

    def use_adaptation(self, *, storage: str | None = None, space: str = ANY_SPACE) -> None:
        """Answer with the newest stored adaptation of ``space`` in ``storage`` (:meth:`GnnAdaptation.\
use_adaptation <dippm_nas.predictor._gnn_adapt.GnnAdaptation.use_adaptation>`).

        Raises:
            InvalidTypeError: ``storage`` is not a URL string or ``None``, or ``space`` not a non-empty string.
        """
        self.adaptations.use_adaptation(storage=storage, space=space)

    def refresh_adaptation(self, *, runtime: str | None = None, host: HostProfile | str | None = None,
                           deployment: Deployment | None = None) -> Adaptation | None:
        """Load the newest stored version for this device, deployment and :attr:`adaptation_space` when it is
        newer than the active one; returns the active one."""
        return self.adaptations.refresh_adaptation(runtime=runtime, host=host, deployment=deployment)

    def reset_adaptation(self) -> None:
        """Drop the active adaptation (and its calibration) in this process; the store keeps it."""
        self.adaptations.reset_adaptation()

    @property
    def adaptation(self) -> Adaptation | None:
        """The active :class:`~dippm_nas.predictor.Adaptation` (see :meth:`adapt`), or ``None``."""
        return self.adaptations.adaptation

    @adaptation.setter
    def adaptation(self, value: Adaptation | None) -> None:
        self.adaptations.adaptation = value

    @property
    def adaptation_storage(self) -> str | None:
        """Where adaptations are read and written (a SQLAlchemy URL; ``None``: the cache directory's SQLite file)."""
        return self.adaptations.adaptation_storage

    @adaptation_storage.setter
    def adaptation_storage(self, value: str | None) -> None:
        self.adaptations.adaptation_storage = value

    @property
    def adaptation_space(self) -> str:
        """The search space whose adaptation this predictor answers with (``"any"``: every space)."""
        return self.adaptations.adaptation_space

    @adaptation_space.setter
    def adaptation_space(self, value: str) -> None:
        self.adaptations.adaptation_space = value

    @property
    def adaptation_flag(self) -> str | None:
        """Why a stored adaptation was set aside (checksum, key or checkpoint hash) or not read, else ``None``;
        while a deployment's predictions have no adaptation for it they carry ``details["adaptation_ignored"] = 1``."""
        return self.adaptations.adaptation_flag

    @adaptation_flag.setter
    def adaptation_flag(self, value: str | None) -> None:
        self.adaptations.adaptation_flag = value

    def __repr__(self) -> str:
        return (f"GnnPredictor(device={self.device!r}, targets={list(self.meta.targets)}, "
                f"members={self.meta.members}, calibrated={self.calibration is not None})")
