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

Checkpoints are read and written by :meth:`GnnPredictor.load` and :meth:`GnnPredictor.save`; their
metadata is :class:`~dippm_nas.predictor.CheckpointMeta`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dippm_nas._files import check_output, output_path, write_output
from dippm_nas._gc import gc_paused
from dippm_nas._logging import WarnOnce
from dippm_nas._platform import cpu_model_name
from dippm_nas._redact import redact_url
from dippm_nas.errors import CheckpointError, DippmNasError, InvalidTypeError, InvalidValueError
from dippm_nas.features import GraphFeatures, featurize, featurize_many, static_dtype_columns
from dippm_nas.graph import OperatorGraph
from dippm_nas.prediction import Prediction
from dippm_nas.deployment import Deployment
from dippm_nas.devices import HostProfile, default_host_profile, get_device, resolve_device
from dippm_nas.mig import advise, advise_many
from dippm_nas.predictor._adapt import (ANY_SPACE, HANDOVER_ROWS, Adaptation, AdaptationKey, apply_adaptation,
                                        check_rows_key, deployment_key, fit_adaptation, head_inputs)
from dippm_nas.predictor._adapt_store import default_adapt_url, open_adaptation_store, read_newest
from dippm_nas.predictor._base import (BATCH_MIN_GRAPHS, BasePredictor, deployment_of, execution_details,
                                       execution_labels, measurement_pairs)
from dippm_nas.predictor._calibrate import (Calibration, calibration_classes, calibration_details,
                                            checkpoint_identity, delete_calibration, fit_calibration,
                                            fit_timeline_factors, read_calibration, require_plausible,
                                            save_calibration)
from dippm_nas.predictor._checkpoint import OTHER_HOST_FLOOR_LOG, OTHER_MACHINE_FLOOR_LOG, is_shipped_checkpoint
from dippm_nas.predictor._numpy_ensemble import (INFER_CHUNK_NODES, NUMPY_MAX_GRAPHS, NumpyEnsemble, checkpoint_digest,
                                                  derived_weights_path, global_arrays, read_derived_weights,
                                                  write_derived_weights)
from dippm_nas.predictor._meta import TARGETS, CheckpointMeta
from dippm_nas.prior import (CostStack, DeploymentSettings, DeploymentSpread, PriorParams, default_params,
                             deployment_spread, deployment_spread_many, estimate as prior_estimate, estimates_of,
                             latency_us, resolved_settings)
from dippm_nas.predictor._novelty import correction_weight, novelty_floor_log, novelty_scores

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from dippm_nas.predictor._ensemble import SageEnsemble

__all__ = ["GnnPredictor"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger, python_warning=True)

#: What :meth:`GnnPredictor.load` accepts as ``engine``.
_ENGINES = ("auto", "torch", "numpy")


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

    def __init__(self, model: "SageEnsemble | NumpyEnsemble", meta: CheckpointMeta, device: str | None = None, *,
                 feature_cache_size: int = 4096, load_calibration: bool = True,
                 novelty_ref: "torch.Tensor | np.ndarray | None" = None) -> None:
        self._engine: Any = model if isinstance(model, NumpyEnsemble) else _torch_engine(model)
        self.meta = meta
        #: standardised static features of training graphs ``[R, static_dim]`` (novelty scores; a tensor, or
        #: an array on the numpy engine), or None
        self.novelty_ref = novelty_ref
        self._resolved_device = resolve_device(device or meta.device)  # once: a prediction passes it inward
        self.device = self._resolved_device.id
        self._cache: OrderedDict[tuple[str, str], GraphFeatures] = OrderedDict()  # (graph key, device)
        self._pred_cache: OrderedDict[tuple[Any, ...], Prediction] = OrderedDict()
        self._cache_size = feature_cache_size
        self._lock = threading.Lock()
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
        #: the active :class:`~dippm_nas.predictor.Adaptation` (see :meth:`adapt`), or ``None``
        self.adaptation: Adaptation | None = None
        #: where adaptations are read and written (a SQLAlchemy URL; ``None``: the cache directory's SQLite file)
        self.adaptation_storage: str | None = None
        #: the search space whose adaptation this predictor answers with (``"any"``: every space)
        self.adaptation_space: str = ANY_SPACE
        #: why a stored adaptation was set aside (checksum, key or checkpoint hash) or not read, else ``None``
        self.adaptation_flag: str | None = None
        #: deployment keys whose stored adaptation was not read, or set aside and not refitted: their predictions
        #: carry ``details["adaptation_ignored"] = 1`` (why: :attr:`adaptation_flag`)
        self._adaptation_ignored: set[str] = set()
        #: SHA-256 of the checkpoint file this predictor was loaded from (``None``: built in memory)
        self.checkpoint_sha256: str | None = None
        #: the checkpoint file it was loaded from (``None``: built in memory); its conformal calibration lies beside it
        self.checkpoint_path: Path | None = None
        self._adaptation_looked: set[str] = set()  # deployment keys whose stored adaptation was looked up
        # within one_network_pass: each graph's member outputs and head inputs, by the identity of its features
        self._member_memo: dict[int, tuple[np.ndarray, np.ndarray]] | None = None
        self._load_adaptations = load_calibration
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
    @property
    def model(self) -> "SageEnsemble":
        """The torch ensemble (a numpy-engine predictor builds it from its weights and keeps it from now on)."""
        if isinstance(self._engine, NumpyEnsemble):
            self._use_torch()
        return self._engine.model

    @model.setter
    def model(self, value: "SageEnsemble") -> None:
        self._engine = _torch_engine(value)
        self._pred_cache.clear()

    @property
    def engine(self) -> str:
        """``"torch"`` or ``"numpy"``: which implementation of the network answers (the same figures)."""
        return "numpy" if isinstance(self._engine, NumpyEnsemble) else "torch"

    def _use_torch(self) -> None:
        """Move to the torch ensemble, built from the numpy engine's weights."""
        import torch

        m = self.meta
        model = _torch_ensemble().SageEnsemble(m.node_dim, m.static_dim, m.device_dim, m.hidden, m.layers,
                                               m.members, m.residual_on_prior)
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in self._engine.state_dict().items()})
        if isinstance(self.novelty_ref, np.ndarray):
            self.novelty_ref = torch.from_numpy(self.novelty_ref.copy())
        self._engine = _torch_engine(model)
        self._pred_cache.clear()

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
        if engine not in _ENGINES:
            raise InvalidValueError(f"engine must be one of {_ENGINES}, got {engine!r}")
        path = Path(path)
        try:
            digest = checkpoint_digest(path)
        except OSError as e:
            raise CheckpointError(f"cannot read predictor checkpoint {path}: {type(e).__name__}: {e}") from e
        if engine == "numpy" or (engine == "auto" and "torch" not in sys.modules):
            derived = read_derived_weights(digest)
            if derived is None and engine == "numpy":
                cls._load_torch(path, digest, device, load_calibration=False)  # writes the derived file
                derived = read_derived_weights(digest)
            if derived is not None:
                try:
                    return cls._from_arrays(path, derived, device, **kwargs)._hashed(digest, path)
                except CheckpointError as e:  # the torch path reads the checkpoint itself (and rewrites the file)
                    if engine == "numpy":
                        raise
                    logger.info("predictor: derived weights of %s not used: %s", path, e)
            elif engine == "numpy":
                raise CheckpointError(f"the derived weights of {path} could not be written to "
                                      f"{derived_weights_path(digest)} (is the cache directory writable?)")
        return cls._load_torch(path, digest, device, **kwargs)._hashed(digest, path)

    def _hashed(self, digest: str, path: Path | None = None) -> "GnnPredictor":
        self.checkpoint_sha256 = digest
        self.checkpoint_path = path
        return self

    @classmethod
    def _from_arrays(cls, path: Path, derived: tuple[dict[str, np.ndarray], str, np.ndarray | None],
                     device: str | None, **kwargs: Any) -> "GnnPredictor":
        state, meta_json, ref = derived
        meta = _checked_meta(path, meta_json, device)
        if ref is not None and (ref.ndim != 2 or ref.shape[1] != meta.static_dim):
            raise CheckpointError(f"checkpoint {path} novelty_ref must be a [R, {meta.static_dim}] array, "
                                  f"got {ref.shape}")
        engine = NumpyEnsemble(state, meta)
        logger.info("loaded predictor checkpoint %s (device %s, targets %s; numpy engine)", path, meta.device,
                    list(meta.targets))
        return cls(engine, meta, device, novelty_ref=ref, **kwargs)

    @classmethod
    def _load_torch(cls, path: Path, digest: str, device: str | None, **kwargs: Any) -> "GnnPredictor":
        import torch

        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is a checkpoint error
            raise CheckpointError(f"cannot read predictor checkpoint {path}: {_load_error_text(e)}") from e
        if not isinstance(blob, dict) or "meta" not in blob or "state" not in blob:
            raise CheckpointError(f"checkpoint {path} must hold a dict with 'meta' and 'state', got {type(blob).__name__}")
        meta = _checked_meta(path, blob["meta"], device)
        model = _torch_ensemble().SageEnsemble(meta.node_dim, meta.static_dim, meta.device_dim, meta.hidden,
                                               meta.layers, meta.members, meta.residual_on_prior)
        try:
            model.load_state_dict(blob["state"])
        except RuntimeError as e:
            raise CheckpointError(f"checkpoint {path} weights do not match its metadata: {e}") from e
        ref = blob.get("novelty_ref")
        if ref is not None and (not isinstance(ref, torch.Tensor) or ref.dim() != 2 or ref.shape[1] != meta.static_dim):
            raise CheckpointError(f"checkpoint {path} novelty_ref must be a [R, {meta.static_dim}] tensor, "
                                  f"got {getattr(ref, 'shape', type(ref).__name__)}")
        if read_derived_weights(digest) is None:
            write_derived_weights(digest, {k: v.detach().numpy() for k, v in model.state_dict().items()},
                                  blob["meta"], None if ref is None else ref.detach().to(torch.float32).numpy())
        logger.info("loaded predictor checkpoint %s (device %s, targets %s)", path, meta.device, list(meta.targets))
        return cls(model, meta, device, novelty_ref=ref, **kwargs)

    def save(self, path: str | Path) -> None:
        """Write ``path`` (``.pt``) and its ``.json`` metadata sidecar, each through a temporary file renamed
        into place (:func:`dippm_nas._files.output_path`).

        Raises:
            CheckpointError: ``path`` or its sidecar is a directory, a FIFO, a device or a dangling symbolic
                link, or the write fails.
        """
        import torch

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        blob: dict[str, Any] = {"meta": self.meta.to_json(), "state": state}
        if self.novelty_ref is not None:
            blob["novelty_ref"] = torch.as_tensor(self.novelty_ref).detach().to(torch.float32).clone()
        check_output(path.with_suffix(".json"), "checkpoint sidecar", error=CheckpointError)
        with output_path(path, "checkpoint", error=CheckpointError) as tmp:
            torch.save(blob, tmp)
        write_output(path.with_suffix(".json"), self.meta.to_json() + "\n", "checkpoint sidecar",
                     error=CheckpointError)

    # ------------------------------------------------------------- features
    def features(self, graph: OperatorGraph, device: str | None = None) -> GraphFeatures:
        """Cached feature tensors of ``graph`` on ``device`` (default: this predictor's)."""
        dev = device or self.device
        key = (_graph_key(graph), dev)
        with self._lock:
            f = self._cache.get(key)
            if f is not None:
                self._cache.move_to_end(key)
                return f
        f = featurize(graph, self._feature_target(dev), style=self.meta.feature_style, prior_params=self.prior_params)
        self._keep_features(key, f)
        return f

    def _feature_target(self, dev: str) -> Any:
        """The device features are computed on: this predictor's resolved device (at a host checkpoint's thread
        count), or the id ``dev`` of another."""
        if dev != self.device:
            return dev
        return self.resolved_device if self.host_threads is None else get_device(dev, threads=self.host_threads)

    def _keep_features(self, key: tuple[str, str], f: GraphFeatures) -> None:
        with self._lock:
            self._cache[key] = f
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _features_many(self, graphs: Sequence[OperatorGraph], keys: Sequence[str], stack: CostStack
                       ) -> list[GraphFeatures]:
        """Features of this predictor's device for ``graphs`` (whose graph keys are ``keys``), the prior's
        estimates of those not cached made over ``stack`` at once."""
        with self._lock:
            out: list[GraphFeatures | None] = [self._cache.get((k, self.device)) for k in keys]
        missing = [i for i, f in enumerate(out) if f is None]
        if missing:
            target = self._feature_target(self.device)
            ests = estimates_of(stack, resolved_settings(target, params=self.prior_params))
            made = featurize_many([graphs[i] for i in missing], target, style=self.meta.feature_style,
                                  prior_params=self.prior_params, estimates=[ests[i] for i in missing],
                                  stack=stack.graph_stack if len(missing) == len(graphs) else None)
            for i, f in zip(missing, made):
                self._keep_features((keys[i], self.device), f)
                out[i] = f
        return out  # type: ignore[return-value]

    def predict_log(self, feats: Sequence[GraphFeatures], *,
                    chunk_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Ensemble mean and std of the log targets.

        Args:
            feats: feature sets (from :meth:`features`).
            chunk_nodes: node budget per chunk of :meth:`SageEnsemble.infer` (speed only); default
                :data:`INFER_CHUNK_NODES`.

        Shapes:
            returns ``mean [num_graphs, 3]`` and ``std [num_graphs, 3]`` (members' std, no floor).
        """
        mean, std, _ = self.predict_log_ood(feats, chunk_nodes=chunk_nodes)
        return mean, std

    def predict_log_ood(self, feats: Sequence[GraphFeatures], *,
                        chunk_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`predict_log` plus, per graph, whether it lies outside the training range (``[num_graphs]`` bool)."""
        mean, std, ood, _, _ = self.predict_log_full(feats, chunk_nodes=chunk_nodes, novelty=False)
        return mean, std, ood

    def predict_log_full(self, feats: Sequence[GraphFeatures], *, chunk_nodes: int | None = None,
                         novelty: bool = True
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`predict_log_ood` plus each graph's novelty score (``[num_graphs]`` float; ``nan`` without a
        reference set, or with ``novelty=False`` unless the checkpoint shrinks novel graphs' corrections:
        then the scores are computed anyway and every ``predict_log*`` method returns the shrunk mean, see
        :mod:`dippm_nas.predictor._novelty`) and whether a host
        checkpoint runs on another machine of its CPU model (``[num_graphs]`` bool: its device features lie
        outside the training range; always ``False`` for other checkpoints and on another CPU model).

        A host checkpoint's ``ood`` covers the graph's own features only: it has seen one machine, so
        another machine's device features are its own case (``other_host`` or the last array), with a
        measured floor, not half the correction bound."""
        if len(feats) > NUMPY_MAX_GRAPHS and isinstance(self._engine, NumpyEnsemble):
            self._use_torch()  # its batched pass is the faster one
        engine = self._engine
        b = global_arrays(feats)
        # [B, 3] each: the members' mean and std of engine.infer, computed chunk by chunk
        memo = self._memo_of(feats)
        if memo is not None:  # an adaptation's fit: its one pass of the network
            out = memo[0]
            mean, std = out.mean(0), (out.std(0) if out.shape[0] > 1 else np.zeros_like(out[0]))
        else:
            mean, std = engine.mean_std(feats, b, chunk_nodes=chunk_nodes or INFER_CHUNK_NODES)
        unseen = self.dtype_unseen(b) | self.prior_only(feats)
        if unseen.any():
            # the network's correction is not identified for a dtype it never trained on (its one-hot input
            # never varied), nor valid for one whose prior constants were pinned after training: the answer is
            # the prior, the centre of the correction's bound
            mean[unseen] = b["log_prior"][unseen]
        shrink = self._shrink_widths() or self._validated_max() is not None
        nov = (novelty_scores(engine.static_z(b), self.novelty_ref)
               if (novelty or shrink) and self.novelty_ref is not None else np.full(len(feats), np.nan))
        if shrink and engine.residual_on_prior:
            # far from the training graphs keep only part of the correction (see _novelty): the prior answers more
            for t, w in self.correction_weights(nov).items():
                j = TARGETS.index(t)
                wt = w.astype(mean.dtype)
                mean[:, j] = b["log_prior"][:, j] + wt * (mean[:, j] - b["log_prior"][:, j])
        graph_ood, device_ood = engine.outside_parts(b)
        if self.meta.host is None:  # a checkpoint of several devices: their range is a training range too
            ood, other_machine = graph_ood | device_ood, np.zeros(len(feats), dtype=bool)
        else:  # one machine seen: another one is other_host (by CPU model) or other_machine
            ood, other_machine = graph_ood, device_ood & (self.other_host is None)
        return mean.astype(np.float64), std.astype(np.float64), ood, nov, other_machine

    def _shrink_widths(self) -> dict[str, float]:
        nf = self.meta.novelty
        return {} if nf is None else {t: float(c) for t, c in nf.get("shrink", {}).items()}

    def _withheld_targets(self, novelty: float) -> set[str]:
        """Targets whose correction a graph of this novelty does not get (beyond ``validated_max``)."""
        vmax = self._validated_max()
        if vmax is None or not math.isfinite(novelty) or novelty <= vmax or not self._engine.residual_on_prior:
            return set()
        return set(self.meta.novelty["floor_log"])  # type: ignore[index]

    def _validated_max(self) -> float | None:
        nf = self.meta.novelty
        return None if nf is None or nf.get("validated_max") is None else float(nf["validated_max"])

    def correction_weights(self, novelty: np.ndarray) -> dict[str, np.ndarray]:
        """Per shrunk target, the share of the network's correction each graph keeps (``[num_graphs]``
        in [0, 1]; see :func:`~dippm_nas.predictor._novelty.correction_weight`); 0 beyond the novelty the
        correction was validated to (``NoveltyFloor.validated_max``, every target with a novel floor);
        ``{}`` for a checkpoint with neither."""
        shrink = self._shrink_widths()
        vmax = self._validated_max()
        if not shrink and vmax is None:
            return {}
        d0 = float(self.meta.novelty["d0"])  # type: ignore[index]
        floored = set(self.meta.novelty["floor_log"])  # type: ignore[index]
        targets = set(shrink) | (floored if vmax is not None else set())
        out = {}
        for t in sorted(targets, key=TARGETS.index):
            w = correction_weight(novelty, d0, shrink[t]) if t in shrink else np.ones(len(novelty))
            if vmax is not None:
                w = np.where(np.asarray(novelty, dtype=np.float64) > vmax, 0.0, w)
            out[t] = w
        return out

    def dtype_unseen(self, b: dict[str, Any]) -> np.ndarray:
        """Per graph of :func:`collate_globals` ``b``: is its compute dtype one no training graph had?

        Such a graph gets the analytic prior as its figure (source ``"analytic"``, or ``"calibrated"``
        after a calibration) and ``details["dtype_unseen"] = 1``: a checkpoint has no basis for a
        correction of a dtype none of its training graphs had. Needs ``residual_on_prior``
        and a feature style with the dtype one-hot.

        Shapes:
            returns ``[num_graphs]`` bool.
        """
        cols = static_dtype_columns(self.meta.feature_style)
        static = np.asarray(b["static"])
        g = static.shape[0]
        if cols is None or not self._engine.residual_on_prior:
            return np.zeros(g, dtype=bool)
        sl = cols[0]
        seen = self._engine.global_hi[sl] > 0.5  # the static block comes first in the range buffers
        return ((static[:, sl] > 0.5) & ~seen).any(1)

    def prior_only(self, feats: Sequence[GraphFeatures]) -> np.ndarray:
        """Per graph: is its compute dtype one of the checkpoint's ``prior_only_dtypes`` (its pinned prior answers,
        the correction withheld; ``details["prior_only_dtype"] = 1``)?

        Shapes:
            returns ``[num_graphs]`` bool.
        """
        only = set(self.meta.prior_only_dtypes)
        return np.array([bool(only) and f.estimate is not None and f.estimate.dtype in only for f in feats],
                        dtype=bool)

    def sigma_log(self, target: str, std_members: float, *, ood: bool = False, novelty: float = math.nan,
                  other_machine: bool = False) -> float:
        """The log-space σ of one prediction: the members' spread, the validation floor (the floor the
        checkpoint gives this ``novelty`` instead where that is larger: its graded floor, or its novel-graph
        floor above ``d0``; :func:`~dippm_nas.predictor._novelty.novelty_floor_log`), for a
        host checkpoint not calibrated here the cross-host floor on another CPU model
        (:data:`~dippm_nas.predictor._checkpoint.OTHER_HOST_FLOOR_LOG`) or, with ``other_machine`` (another
        machine of its CPU model), the other-machine floor
        (:data:`~dippm_nas.predictor._checkpoint.OTHER_MACHINE_FLOOR_LOG`), and, outside the training range,
        half the correction bound (the correction is only known to lie within it)."""
        floor = max(self.meta.std_floor_log.get(target, 0.0), novelty_floor_log(self.meta.novelty, target, novelty))
        s = math.hypot(std_members, floor)
        calibrated = self.calibration is not None and self.calibration.has(target)
        fl = (self.other_host_floor_log if self.other_host is not None
              else self.other_machine_floor_log if other_machine else None)
        if fl is not None and not calibrated:
            # a target not measured across machines takes the widest measured floor
            s = math.hypot(s, fl.get(target, max(fl.values(), default=0.0)))
        if ood and self._engine.residual_on_prior:
            s = math.hypot(s, 0.5 * float(self._engine.delta_max[TARGETS.index(target)]))
        return s

    def predict_graphs(self, graphs: Sequence[OperatorGraph], *, mig: bool = True, k_sigma: float = 2.0,
                       runtime: str | None = None, host: HostProfile | str | None = None,
                       deployment: Deployment | None = None) -> list[Prediction]:
        if not graphs:
            return []
        dep, st = deployment_of(self.resolved_device, deployment, runtime, host)
        adaptation = self._adaptation_for(dep)
        cal = None if self.calibration is None else id(self.calibration)
        ex_key = dep.key
        ad = None if adaptation is None else id(adaptation)
        gkeys = [_graph_key(g) for g in graphs]
        keys = [(gk, bool(mig), float(k_sigma), cal, ex_key, ad) for gk in gkeys]
        out: list[Prediction | None] = [self._pred_cache.get(k) for k in keys]
        todo = [i for i, p in enumerate(out) if p is None]
        if todo:
            with gc_paused() if len(todo) >= self.batch_min_graphs else contextlib.nullcontext():
                self._predict_todo(graphs, todo, gkeys, keys, out, dep, st, adaptation, mig, k_sigma)
        return out  # type: ignore[return-value]

    def _predict_todo(self, graphs: Sequence[OperatorGraph], todo: list[int], gkeys: list[Any], keys: list[Any],
                      out: list[Prediction | None], dep: Any, st: DeploymentSettings, adaptation: Any, mig: bool,
                      k_sigma: float) -> None:
        """The uncached part of :meth:`predict_graphs`: ``out[i]`` for every ``i`` of ``todo``, cached."""
        batch = [graphs[i] for i in todo]
        stack = CostStack(batch, self.resolved_device) if len(todo) >= self.batch_min_graphs else None
        feats = (self._features_many(batch, [gkeys[i] for i in todo], stack) if stack is not None
                 else [self.features(g) for g in batch])
        mean, std, ood, nov, other_machine = self.predict_log_full(feats)
        unseen = self.dtype_unseen(global_arrays(feats))
        prior_only = self.prior_only(feats)
        flags = [dict(ood=bool(ood[j]), novelty=float(nov[j]), dtype_unseen=bool(unseen[j]),
                      prior_only=bool(prior_only[j]), other_machine=bool(other_machine[j]))
                 for j in range(len(todo))]
        if stack is not None:
            preds = self._predictions_stacked(batch, feats, mean, std, flags, stack, st, mig, k_sigma)
        else:
            preds = [self._prediction(g, feats[j], mean[j], std[j], mig=mig, k_sigma=k_sigma, settings=st,
                                      **flags[j]) for j, g in enumerate(batch)]
        for j, i in enumerate(todo):
            out[i] = preds[j]
        if adaptation is not None:
            self._adapted([graphs[i] for i in todo], feats, todo, out, adaptation, mig, k_sigma, st)
        elif (self._adaptation_ignored
              and deployment_key(self.resolved_device, deployment=dep) in self._adaptation_ignored):
            for i in todo:
                out[i] = dataclasses.replace(out[i], details={**out[i].details, "adaptation_ignored": 1.0})
        with self._lock:
            for i in todo:
                self._pred_cache[keys[i]] = out[i]  # type: ignore[assignment]
            while len(self._pred_cache) > self._cache_size:
                self._pred_cache.popitem(last=False)

    def _predictions_stacked(self, graphs: Sequence[OperatorGraph], feats: Sequence[GraphFeatures], mean: np.ndarray,
                             std: np.ndarray, flags: Sequence[dict[str, Any]], stack: CostStack,
                             settings: DeploymentSettings, mig: bool, k_sigma: float) -> list[Prediction]:
        """:meth:`_prediction` of every graph, the prior's work over the stack at once: the requested deployment's
        estimates (their kernels shared with the features'), the spread's scenarios and the MIG slices."""
        dev = self.resolved_device
        params = self._execution_params()
        latency = "latency_ms" in self.meta.targets and dev.kind == "gpu"
        direct = _features_settings(settings) and params is self._pinned_params()
        rts: list[Any] = [None] * len(graphs)
        spreads: list[Any] = [None] * len(graphs)
        if latency and not direct:
            rts = estimates_of(stack, resolved_settings(dev, params=params, deployment=settings))
        if latency and settings.spread_open:
            factors = np.array([self._gpu_correction(f.estimate, float(m[0])) if f.estimate is not None else 1.0
                                for f, m in zip(feats, mean)])
            spreads = deployment_spread_many(stack, dev, settings, params=params, gpu_factors=factors)
        preds = [self._prediction(g, feats[j], mean[j], std[j], mig=False, k_sigma=k_sigma, settings=settings,
                                  rt=rts[j], spread=spreads[j], **flags[j]) for j, g in enumerate(graphs)]
        if mig and dev.has_mig:
            advice = advise_many(preds, dev, list(graphs), k_sigma=k_sigma, params=params, deployment=settings,
                                 stack=stack)
            preds = [dataclasses.replace(p, mig=a) for p, a in zip(preds, advice)]
        return preds

    def _gpu_correction(self, est: Any, m: float) -> float:
        """The network's log answer ``m`` as a correction of the kernel times (see :meth:`_timeline_parts`)."""
        prior_ms = max(float(est.latency_ms), 1e-9)
        w = min(1.0, max(0.0, float(est.gpu_busy_ms) / prior_ms))
        engine = self._engine
        bound = float(engine.delta_max[TARGETS.index("latency_ms")]) if engine.residual_on_prior else 30.0
        delta = min(max(m - math.log(prior_ms), -bound), bound)
        return math.exp(w * delta)

    def _pinned_params(self) -> Any:
        """The prior constants the features are computed with (the checkpoint's, else the package's)."""
        return self.prior_params if self.prior_params is not None else default_params()

    def _execution_params(self) -> Any:
        """The prior constants of a runtime-specific estimate: the pinned ones, with the package's fitted host
        model where the pinned constants carry none (the GNN corrects kernel time; the host side is the
        host model's)."""
        pinned = self._pinned_params()
        fitted = default_params().host_model
        if pinned.host_model is None and fitted is not None:
            memo = self.__dict__.get("_execution_params_memo")  # one object per (pinned, host model) pair
            if memo is not None and memo[0] is pinned and memo[1] is fitted:
                return memo[2]
            out = dataclasses.replace(pinned, host_model=fitted)
            self._execution_params_memo = (pinned, fitted, out)
            return out
        return pinned

    def _timeline_parts(self, graph: OperatorGraph, est: Any, m: float, settings: DeploymentSettings,
                        rt: Any = None) -> tuple[float, np.ndarray, np.ndarray, float, dict[str, float], Any]:
        """The network's eager answer ``exp(m)`` as timelines of the deployment ``settings``.

        The network's answer is read as a correction of the kernel times: its log correction of the features'
        estimate (eager, default host), ``delta = m - log(prior)``, applies to the kernels in the share ``w`` of
        that estimate the GPU is busy, ``c = exp(w * delta)`` (a GPU-bound graph's whole correction, none of a
        host-bound one's, whose answer says little of its kernels). The kernels of the requested deployment
        (runtime, TF32 flags, layout, autocast), times ``c``, then run behind the host timeline of its runtime,
        host profile and input copy (``rt``: the prior's estimate of them, when the caller has it). Where the
        features were computed for the requested settings themselves, the latency is the network's answer.

        Returns:
            ``(latency ms, gpu_us, host_us, prefix_us, details, estimate)``: the per-node kernel times
            (corrected), host times, the host time before the first operator, and the prior's estimate of the
            requested execution (``None`` where it is the features' own).
        """
        params = self._execution_params()
        prior_ms = max(float(est.latency_ms), 1e-9)
        w = min(1.0, max(0.0, float(est.gpu_busy_ms) / prior_ms))
        c = self._gpu_correction(est, m)
        d: dict[str, float] = {"gpu_share_of_prior": w, "gpu_correction": c,
                               "host_model_fitted": float(params.host_model is not None)}
        if _features_settings(settings) and params is self._pinned_params():
            d["direct"] = 1.0
            return (math.exp(min(max(m, -30.0), 30.0)), c * est.node_time_ms * 1e3, est.node_host_ms * 1e3,
                    est.pass_host_ms * 1e3, d, None)
        if rt is None:
            rt = prior_estimate(graph, self.resolved_device, params=params, deployment=settings)
        g, h, pre = c * rt.node_time_ms * 1e3, rt.node_host_ms * 1e3, rt.pass_host_ms * 1e3
        return latency_us(g, h, pre) / 1e3, g, h, pre, d, rt

    def _compose_latency(self, graph: OperatorGraph, est: Any, m: float, s: float, settings: DeploymentSettings,
                         rt: Any = None, spread: DeploymentSpread | None = None
                         ) -> tuple[float, float, dict[str, float], tuple[float, float], bool, Any]:
        """Latency of the deployment ``settings`` (:meth:`_timeline_parts`), with the calibration's host and GPU
        factors when it has them. σ combines the network's σ on the kernel part and the host model's held-out
        σ on the host part (and the calibration's residual scatter), each weighted by how much the critical
        path moves with it, and, without a calibration, the spread of what the deployment leaves undescribed
        (:func:`~dippm_nas.prior.deployment_spread`, whose mixture also sets the centre).

        Returns:
            ``(log latency, log σ, details, (host_ms, gpu_ms), calibrated, estimate)``, ``estimate`` as for
            :meth:`_timeline_parts`.
        """
        lat_ms, g, h, pre, d, rt = self._timeline_parts(graph, est, m, settings, rt)
        base_us = latency_us(g, h, pre)
        params = self._execution_params()
        # what the deployment leaves undescribed: the mixture's centre and spread (none when all is described)
        sp = spread if spread is not None else (
            deployment_spread(graph, self.resolved_device, settings, params=params, gpu_factor=d["gpu_correction"])
            if settings.spread_open else DeploymentSpread())
        tf = self.calibration.timeline_factors if self.calibration is not None else None
        extra_s = s_dep = 0.0
        if tf is None:
            lat_ms *= math.exp(sp.offset_log)
            s_dep = sp.sigma_log
            d.update(deployment_sigma_log=sp.sigma_log, deployment_offset_log=sp.offset_log)
        else:  # measurements (a calibration) describe the deployment they ran under: its factors replace the spread
            d["uncalibrated_latency_ms"] = lat_ms * math.exp(sp.offset_log)
            g, h, pre = tf.apply(g, h, pre, calibration_classes(graph) if tf.class_log else None)
            lat_ms *= latency_us(g, h, pre) / base_us
            base_us = latency_us(g, h, pre)
            extra_s = tf.residual_std_log
            d.update(calibration_details(tf))
        direct = bool(d.pop("direct", 0.0))
        if direct:  # the network's σ is the latency's
            s_g, s_h = s, 0.0
        else:
            s_host = params.host_model.sigma_log() if params.host_model is not None and tf is None else 0.0
            s_g = math.log(latency_us(math.exp(s) * g, h, pre) / base_us)
            s_h = math.log(latency_us(g, h * math.exp(s_host), pre * math.exp(s_host)) / base_us) if s_host > 0 else 0.0
        host_ms, gpu_ms = float(h.sum() + pre) / 1e3, float(g.sum()) / 1e3
        d.update(host_ms=host_ms, gpu_busy_ms=gpu_ms, gpu_idle_ms=max(0.0, lat_ms - gpu_ms),
                 host_bound=float(host_ms > gpu_ms), pass_host_ms=pre / 1e3)
        return math.log(lat_ms), math.hypot(s_g, s_h, extra_s, s_dep), d, (host_ms, gpu_ms), tf is not None, rt

    def _prediction(self, graph: OperatorGraph, f: GraphFeatures, mean: np.ndarray, std: np.ndarray, *,
                    mig: bool, k_sigma: float, ood: bool = False, novelty: float = math.nan,
                    dtype_unseen: bool = False, prior_only: bool = False, other_machine: bool = False,
                    settings: DeploymentSettings | None = None, rt: Any = None,
                    spread: DeploymentSpread | None = None) -> Prediction:
        est = f.estimate
        dev = self.resolved_device
        timeline: dict[str, Any] = {"host_ms": None, "gpu_ms": None}
        composed: dict[str, float] = {}
        if dev.kind == "gpu" and est is not None:
            timeline = {"host_ms": est.host_ms, "gpu_ms": est.gpu_busy_ms}
        values: dict[str, float | None] = {}
        stds: dict[str, float | None] = {}
        sources: dict[str, str] = {}
        prior_vals = {"latency_ms": f.prior_latency_ms, "energy_j": f.prior_energy_j, "memory_mib": f.prior_memory_mib}
        kept: dict[str, float] = {}
        rt_est: Any = None  # the prior's estimate of the requested execution, where it is not the features'
        for t_i, t in enumerate(TARGETS):
            if t not in self.meta.targets:
                values[t], stds[t] = prior_vals[t], None
                if t == "memory_mib" and est is not None:
                    stds[t] = est.memory_mib_std  # the analytic memory's own (GPU parts; None on a CPU)
                sources[t] = "analytic" if prior_vals[t] is not None else "unavailable"
                if t == "energy_j" and prior_vals[t] is not None and est is not None:
                    # power over the requested execution's timeline (its host gaps); the power model's fit for
                    # the device's architecture says how far to trust it
                    e = rt_est if rt_est is not None and rt_est.energy_j is not None else est
                    values[t], stds[t], sources[t] = e.energy_j, e.energy_j_std, e.energy_source
                continue
            if dtype_unseen and prior_vals[t] is None:  # the prior answers and has no figure: none is made up
                values[t], stds[t], sources[t] = None, None, "unavailable"
                continue
            m = float(mean[t_i])
            s = self.sigma_log(t, float(std[t_i]), ood=ood, novelty=novelty, other_machine=other_machine)
            withheld = t in self._withheld_targets(novelty)
            # dtype_unseen, a prior-only dtype, or a graph beyond the validated novelty: ``m`` is the prior's
            src = "analytic" if dtype_unseen or prior_only or withheld else "predicted"
            if src == "analytic" and t == "latency_ms" and dev.kind == "gpu":
                s = max(s, self._prior_kernel_sigma_log(graph.spec.dtype))
            calibrated = False
            if t == "latency_ms" and dev.kind == "gpu" and est is not None and settings is not None:
                m, s, composed, (h_ms, g_ms), calibrated, rt_est = self._compose_latency(graph, est, m, s, settings,
                                                                                       rt, spread)
                timeline = {"host_ms": h_ms, "gpu_ms": g_ms}
            if calibrated:
                src = "calibrated"
            elif self.calibration is not None and t in self.calibration.coef:
                m, s = self.calibration.apply(t, m, s)
                src = "calibrated"
                if t in self.calibration.kept:  # 1: the fitted correction whole; 0: the measurements' scatter hid it
                    kept[f"calibration_kept_{t}"] = float(self.calibration.kept[t])
            m = min(max(m, -30.0), 30.0)  # exp stays finite and > 0 whatever the network says
            v = math.exp(m)
            values[t], stds[t], sources[t] = v, v * s, src
        unknown = dict(est.unknown_ops) if est is not None else dict(graph.unknown_ops)
        for op, c in f.unknown_ops.items():
            unknown.setdefault(op, c)
        details = self._details(f, composed, kept, settings, ood=ood, novelty=novelty, dtype_unseen=dtype_unseen,
                                prior_only=prior_only, other_machine=other_machine)
        pred = Prediction(
            latency_ms=values["latency_ms"], energy_j=values["energy_j"], memory_mib=values["memory_mib"],
            latency_source=sources["latency_ms"], energy_source=sources["energy_j"],
            memory_source=sources["memory_mib"], device=self.device, batch_size=graph.spec.batch_size,
            dtype=graph.spec.dtype, latency_ms_std=stds["latency_ms"], energy_j_std=stds["energy_j"],
            memory_mib_std=stds["memory_mib"], unknown_ops=unknown, details=details, **timeline,
            labels=execution_labels(settings if settings is not None else DeploymentSettings(), dev),
        )
        if mig and dev.has_mig:
            pred = dataclasses.replace(pred, mig=advise(pred, dev, graph=graph, k_sigma=k_sigma,
                                                        params=self._execution_params(),
                                                        deployment=settings if settings is not None
                                                        else DeploymentSettings()))
        return pred

    def _details(self, f: GraphFeatures, composed: dict[str, float], kept: dict[str, float],
                 settings: DeploymentSettings | None, *, ood: bool, novelty: float, dtype_unseen: bool,
                 prior_only: bool, other_machine: bool) -> dict[str, Any]:
        """The ``details`` of a prediction from features ``f``: the prior's figures, the execution's, the
        composed latency's and the flags of the network's answer."""
        est = f.estimate
        dev = self.resolved_device
        details = est.details() if est is not None else {}
        details.update(composed)
        details.update(execution_details(settings if settings is not None else DeploymentSettings(), dev))
        details["prior_latency_ms"] = f.prior_latency_ms
        details["prior_memory_mib"] = f.prior_memory_mib
        details["outside_training_range"] = float(ood)
        details.update(kept)
        if self.calibration_ignored:
            details["calibration_ignored"] = 1.0
        if static_dtype_columns(self.meta.feature_style) is not None and self._engine.residual_on_prior:
            details["dtype_unseen"] = float(dtype_unseen)
        if self.meta.prior_only_dtypes:
            details["prior_only_dtype"] = float(prior_only)
        if self.meta.host is not None:
            details["other_host"] = float(self.other_host is not None)
            details["other_machine"] = float(other_machine)
        if self.host_threads is not None:
            details["host_threads"] = float(self.host_threads)  # the latency is for this many torch threads
        if math.isfinite(novelty):
            details["novelty"] = novelty
            if self.meta.novelty is not None:
                details["novel"] = float(novelty > self.meta.novelty["d0"])
            for t, w in self.correction_weights(np.array([novelty])).items():
                # 1: the network's whole correction; 0: the prior
                details[f"correction_weight_{t}"] = 0.0 if prior_only else float(w[0])
        return details

    def _prior_kernel_sigma_log(self, dtype: str) -> float:
        """The prior's measured σ of the kernel part for ``dtype`` on a GPU it was not fitted on (the pinned
        host model's ``sigma_log_gpu_bound[_<dtype>]``; on a device without efficiency multipliers of its own,
        at least an unseen GPU's ``sigma_log_gpu_unseen``; 0 without a host model): where the prior answers,
        the σ is at least its own measured error."""
        params = self._execution_params()
        hm = params.host_model
        return (hm.sigma_log_gpu(dtype, device_fitted=params.device_fitted(self.resolved_device.id))
                if hm is not None else 0.0)

    # ------------------------------------------------------------ calibration
    def calibrate(self, measurements: Sequence[Any], *, persist: bool = True, runtime: str | None = None,
                  host: HostProfile | str | None = None,
                  deployment: Deployment | None = None) -> "Calibration | None":
        """Adapt to real measurements of this device (few-shot); see :mod:`dippm_nas.predictor._calibrate`.

        On a GPU, latency gets a host factor and a GPU factor (the measured models' own timelines tell a slower
        host from slower kernels), and op classes the measured models tell apart their own GPU factor
        (``Calibration.gpu_class_factors``); energy and memory, and every target of a CPU device, a line in log
        space. Fewer than two measurements with a label leave the predictions unchanged, with a warning. From
        :data:`~dippm_nas.predictor.HANDOVER_ROWS` measurements on, it hands over to :meth:`adapt` (the factors
        plus the residual heads; stored in the adaptation store when ``persist``) and returns the factors of
        that adaptation.

        Args:
            measurements: ``(graph, Measurement)`` pairs, or ``(graph, {"latency_ms": ..., ...})`` pairs.
            persist: write the correction to the cache directory so later loads re-apply it.
            runtime, host, deployment: how the measured passes ran (as for :meth:`predict_graphs`).

        Returns:
            The fitted :class:`~dippm_nas.predictor._calibrate.Calibration` (now active), or ``None`` with a
            warning when fewer than two measurements hold a label: the predictions stay unchanged.

        Raises:
            InvalidValueError: a figure that is not a finite number > 0, or a fit beyond the plausibility
                bounds (:func:`~dippm_nas.predictor.calibration_problems`: e.g. a latency in seconds or 1e-300
                ms); nothing is applied or written.
        """
        pairs = measurement_pairs(measurements)
        if len(pairs) >= HANDOVER_ROWS:
            ad = self.adapt(measurements, persist=persist, runtime=runtime, host=host, deployment=deployment)
            return None if ad is None else ad.calibration
        if len(pairs) < 2:
            _warn_once(f"calibrate-few:{self.device}", "calibrate() needs at least 2 measurements with a figure "
                       "> 0, got %d: the %s predictions are left unchanged", len(pairs), self.device)
            return None
        cal = self.fit_factor_calibration(pairs, runtime, host, deployment=deployment)
        self.calibration = cal
        self._pred_cache.clear()
        if persist:
            save_calibration(cal)
            self.calibration_ignored = ""
        return cal

    def fit_factor_calibration(self, pairs: Sequence[tuple[OperatorGraph, dict[str, float]]],
                               runtime: str | None = None, host: HostProfile | str | None = None, *,
                               deployment: Deployment | None = None) -> Calibration:
        """The factor calibration of :meth:`calibrate` fitted on ``(graph, {target: value})`` pairs (at least
        two) measured under ``deployment`` (or the legacy ``runtime`` / ``host``), from the uncalibrated network;
        nothing is activated or written.

        Raises:
            DippmNasError: no pair holds a label of the checkpoint's targets.
            InvalidValueError: the fit lies beyond the plausibility bounds
                (:func:`~dippm_nas.predictor.calibration_problems`).
        """
        _, st = deployment_of(self.device, deployment, runtime, host)
        saved, self.calibration = self.calibration, None
        try:
            feats = [self.features(g) for g, _ in pairs]
            mean, _ = self.predict_log(feats)
            targets = list(self.meta.targets)
            timeline = None
            if resolve_device(self.device).kind == "gpu" and "latency_ms" in targets:
                idx = [i for i, (_, y) in enumerate(pairs) if "latency_ms" in y and feats[i].estimate is not None]
                if len(idx) >= 2:
                    parts = []
                    for i in idx:
                        _, g, h, pre, _, _ = self._timeline_parts(pairs[i][0], feats[i].estimate, float(mean[i, 0]),
                                                                  st)
                        parts.append((g, h, pre))
                    tf = fit_timeline_factors(parts, [pairs[i][1]["latency_ms"] for i in idx],
                                              node_classes=[calibration_classes(pairs[i][0]) for i in idx])
                    timeline = dataclasses.asdict(tf)
                    targets.remove("latency_ms")
        finally:
            self.calibration = saved
        labels = [{k: v for k, v in y.items() if k in targets} for _, y in pairs]
        if any(labels):
            cal = dataclasses.replace(fit_calibration(self.device, self.meta, mean, labels, targets=targets),
                                      timeline=timeline)
        elif timeline is not None:
            cal = Calibration(device=self.device, checkpoint=checkpoint_identity(self.meta), coef={}, n={},
                              timeline=timeline)
        else:
            raise DippmNasError(f"no measurement holds a label for the targets {list(self.meta.targets)}")
        require_plausible(cal)
        return cal

    # ------------------------------------------------------------ adaptation
    def adapt(self, measurements: Sequence[Any], *, persist: bool = True, storage: str | None = None,
              space: str | None = None, runtime: str | None = None, host: HostProfile | str | None = None,
              deployment: Deployment | None = None) -> Adaptation | None:
        """Fine-tune the ensemble to measured rows of this device (see :mod:`dippm_nas.predictor._adapt`): the
        factor calibration, and a residual head per member on its last hidden layer, the amount chosen by
        leave-one-out cross-validation on the rows. The result is active at once for this deployment and space.

        Args:
            measurements: ``(graph, Measurement)`` or ``(graph, {"latency_ms": ..., "memory_mib": ...})`` pairs
                (any subset of the targets; rows of one graph are averaged). A ``Measurement`` of another device
                is an error.
            persist: add the rows to the adaptation store of the key (device, deployment, space) and refit on
                every row stored for it; the new version is what every process predicting for the key loads.
                ``False``: fit on ``measurements`` alone, in this process only.
            storage: the store's SQLAlchemy URL (a study's storage); default :attr:`adaptation_storage`, else
                ``<cache dir>/adaptations.sqlite``.
            space: the search space the rows come from (default :attr:`adaptation_space`, ``"any"``).
            runtime, host, deployment: how the measured passes ran (as for :meth:`predict_graphs`); part of the
                key the adaptation is stored and looked up under.

        Returns:
            The active :class:`~dippm_nas.predictor.Adaptation`, or ``None`` with a warning when fewer than two
            distinct graphs hold a figure (the predictions stay unchanged).

        Raises:
            InvalidTypeError: ``measurements`` is not a list of pairs (``None``, a string, a mapping...).
            InvalidValueError: a figure that is not a finite number > 0, or a measurement of another device.
            AdaptationError: the store cannot be opened or written (its URL named with the password masked).
        """
        if isinstance(measurements, (str, bytes, Mapping)) or not isinstance(measurements, Iterable):
            raise InvalidTypeError(f"adapt() takes a list of (graph, Measurement) or (graph, {{'latency_ms': ...}}) "
                                   f"pairs, got {type(measurements).__name__}")
        _check_storage_and_space(storage, space)
        measurements = list(measurements)
        pairs = measurement_pairs(measurements) if measurements else []
        dep, _ = deployment_of(self.device, deployment, runtime, host)
        if storage is not None:
            self.adaptation_storage = storage
        if space is not None:
            self.adaptation_space = space
        key = AdaptationKey(self.device, deployment_key(self.device, deployment=dep), self.adaptation_space)
        check_rows_key(measurements, key)
        if persist:
            ad = self._adapt_stored(key, pairs, dep)
        else:
            ad = fit_adaptation(self, pairs, key, dep)
        if ad is None:
            _warn_once(f"adapt-few:{self.device}", "adapt() needs at least 2 measured graphs with a figure > 0, got "
                       "%d: the %s predictions are left unchanged", len(pairs), self.device)
            return None
        self.activate_adaptation(ad)
        return ad

    def _adapt_stored(self, key: AdaptationKey, pairs: Sequence[tuple[OperatorGraph, dict[str, float]]],
                      deployment: Deployment) -> Adaptation | None:
        """Store ``pairs`` under ``key`` and fit on every stored row; refit while rows arrived meanwhile."""
        store = open_adaptation_store(self.adaptation_storage)
        try:
            store.add_rows(key.digest, key.to_json(), [(g, _graph_key(g), y) for g, y in pairs])
            ad = None
            for _ in range(8):
                rows, ignored = store.rows_checked(key.digest)
                ad = fit_adaptation(self, rows, key, deployment)
                if ad is None:
                    return None
                ad = dataclasses.replace(ad, rows_ignored=ignored)
                v = store.save(key.digest, key.to_json(), ad.checkpoint_sha256, ad.rows, ad.meta(), ad.arrays_npz())
                ad = dataclasses.replace(ad, version=v)
                if store.row_count(key.digest) <= len(rows) + ignored:
                    break
            return ad
        finally:
            store.close()

    def activate_adaptation(self, ad: Adaptation) -> None:
        """Answer with ``ad`` (its factor calibration and heads) from now on, in this process."""
        self.adaptation = ad
        self.calibration = ad.calibration
        self._adaptation_looked.add(ad.key.deployment)
        self._adaptation_ignored.discard(ad.key.deployment)
        self._pred_cache.clear()

    def use_adaptation(self, *, storage: str | None = None, space: str = ANY_SPACE) -> None:
        """Answer with the newest stored adaptation of ``space`` in ``storage`` (looked up at the next
        prediction, and again by :meth:`refresh_adaptation`). A store that cannot be read then is flagged, never
        raised (:meth:`_load_stored_adaptation`).

        Raises:
            InvalidTypeError: ``storage`` is not a URL string or ``None``, or ``space`` not a non-empty string.
        """
        _check_storage_and_space(storage, space, space_required=True)
        if (storage, space) != (self.adaptation_storage, self.adaptation_space):
            self.adaptation_storage, self.adaptation_space = storage, space
            self._adaptation_looked.clear()
            self._adaptation_ignored.clear()
            self._pred_cache.clear()
            if self.adaptation is not None:
                self.reset_adaptation()

    def refresh_adaptation(self, *, runtime: str | None = None, host: HostProfile | str | None = None,
                           deployment: Deployment | None = None) -> Adaptation | None:
        """Load the newest stored version for this device, deployment and :attr:`adaptation_space` when it is
        newer than the active one (a search picks up what its validation workers fitted); returns the active one."""
        dep, _ = deployment_of(self.device, deployment, runtime, host)
        self._adaptation_looked.discard(deployment_key(self.device, deployment=dep))
        return self._adaptation_for(dep)

    def reset_adaptation(self) -> None:
        """Drop the active adaptation (and its calibration) in this process; the store keeps it."""
        if self.adaptation is not None and self.calibration is self.adaptation.calibration:
            self.calibration = None
        self.adaptation = None
        self._pred_cache.clear()

    def graph_key(self, graph: OperatorGraph) -> str:
        """What makes two measured rows the same graph (structure and input spec)."""
        return _graph_key(graph)

    def clear_prediction_cache(self) -> None:
        self._pred_cache.clear()

    def member_outputs(self, graphs: Sequence[OperatorGraph]) -> tuple[np.ndarray, np.ndarray]:
        """Each member's log answer ``[K, G, 3]`` (before any shrink, calibration or adaptation) and what its
        residual head reads (:func:`~dippm_nas.predictor._adapt.head_inputs`, ``[K, G, hidden + static]``)."""
        return self._member_outputs([self.features(g) for g in graphs])

    def _member_outputs(self, feats: Sequence[GraphFeatures]) -> tuple[np.ndarray, np.ndarray]:
        memo = self._memo_of(feats)
        if memo is not None:
            return memo
        b = global_arrays(feats)
        out, hid = self._engine.infer_hidden(feats, b)
        return out, head_inputs(hid, self._engine.static_z(b))

    def _memo_of(self, feats: Sequence[GraphFeatures]) -> tuple[np.ndarray, np.ndarray] | None:
        """The member outputs and head inputs of ``feats`` kept by :meth:`one_network_pass` (``None`` unless every
        graph has them)."""
        memo = self._member_memo
        if not memo or not feats or not all(id(f) in memo for f in feats):
            return None
        rows = [memo[id(f)] for f in feats]
        return np.stack([r[0] for r in rows], 1), np.stack([r[1] for r in rows], 1)

    @contextlib.contextmanager
    def one_network_pass(self, graphs: Sequence[OperatorGraph]) -> Iterator[None]:
        """Within the block, the network runs once on ``graphs``: every prediction of graphs among them reuses
        their members' outputs (fitting an adaptation on them needs them three times; a benchmark scoring subsets
        of one space, many more). The predictor's feature cache must hold them all."""
        feats = [self.features(g) for g in graphs]
        b = global_arrays(feats)
        out, hid = self._engine.infer_hidden(feats, b)
        x = head_inputs(hid, self._engine.static_z(b))
        outer = self._member_memo
        self._member_memo = {**(outer or {}), **{id(f): (out[:, i], x[:, i]) for i, f in enumerate(feats)}}
        try:
            yield
        finally:
            self._member_memo = outer

    def checkpoint_hash(self) -> str:
        """SHA-256 of the checkpoint file (:attr:`checkpoint_sha256`), or of the weights of one built in memory."""
        if self.checkpoint_sha256 is not None:
            return self.checkpoint_sha256
        h = hashlib.sha256()
        for k, v in sorted(self._engine.state_dict().items()):
            h.update(k.encode())
            h.update(np.ascontiguousarray(v, dtype=np.float32).tobytes())
        return h.hexdigest()

    def _adaptation_for(self, deployment: Deployment) -> Adaptation | None:
        """The adaptation that applies to a request for ``deployment`` (the stored one looked up once per
        deployment), or ``None``."""
        dep = deployment_key(self.resolved_device, deployment=deployment)  # type: ignore[arg-type]
        if dep not in self._adaptation_looked and self._load_adaptations:
            self._adaptation_looked.add(dep)
            self._load_stored_adaptation(AdaptationKey(self.device, dep, self.adaptation_space), deployment)
        ad = self.adaptation
        return ad if ad is not None and ad.key.deployment == dep else None

    def _load_stored_adaptation(self, key: AdaptationKey, deployment: Deployment) -> None:
        """Activate the newest stored version of ``key`` when newer than the active one. A store that cannot be
        read, and a version whose checksum, key or checkpoint hash does not match or that does not decode, are
        flagged (:attr:`adaptation_flag`, one warning) and never raise; a version set aside is refitted from the
        stored rows on this checkpoint, and without a refit the key's predictions carry
        ``details["adaptation_ignored"] = 1``."""
        where = redact_url(self.adaptation_storage or default_adapt_url())
        try:
            stored = read_newest(self.adaptation_storage, key.digest)
        except DippmNasError as e:
            self._ignore_adaptation(key, f"the adaptations in {where} were not read: {e}")
            _warn_once(f"adapt-read:{where}:{key.digest}", "adaptations in %s not read: %s; the %s predictions are "
                       "unadapted and flagged details['adaptation_ignored'] = 1", where, e, self.device)
            return
        if stored is None or (self.adaptation is not None and self.adaptation.key == key
                              and self.adaptation.version >= stored.version):
            return
        why = None
        try:
            ad = Adaptation.from_stored(stored, key)
            if ad.checkpoint_sha256 != self.checkpoint_hash():
                why = (f"version {stored.version} was fitted on checkpoint {ad.checkpoint_sha256[:12]}..., this one is "
                       f"{self.checkpoint_hash()[:12]}...")
        except InvalidValueError as e:
            why = f"version {stored.version}: {e}"
        if why is None:
            self.activate_adaptation(ad)
            return
        self.adaptation_flag = why
        _warn_once(f"adapt-bad:{key.digest}:{stored.version}", "stored adaptation of %s (%s) in %s set aside: %s; "
                   "refitting it from its stored rows on this checkpoint", self.device, key.space, where, why)
        try:
            refit = self._adapt_stored(key, [], deployment)
        except DippmNasError as e:
            self._ignore_adaptation(key, f"{why}; not refitted: {e}")
            _warn_once(f"adapt-refit:{key.digest}", "the adaptation of %s could not be refitted (%s): predictions "
                       "stay unadapted, flagged details['adaptation_ignored'] = 1", self.device, e)
            return
        if refit is None:
            self._ignore_adaptation(key, f"{why}; fewer than 2 sound stored rows to refit it on")
        else:
            self.activate_adaptation(refit)

    def _ignore_adaptation(self, key: AdaptationKey, why: str) -> None:
        """Flag ``key``'s predictions: ``details["adaptation_ignored"] = 1`` while no adaptation applies (an older
        active one stays, flagged ``details["adaptation_flagged"] = 1``); ``why``: :attr:`adaptation_flag`."""
        self.adaptation_flag = why
        self._adaptation_ignored.add(key.deployment)
        self._pred_cache.clear()

    def _adapted(self, graphs: Sequence[OperatorGraph], feats: Sequence[GraphFeatures], todo: Sequence[int],
                 out: list[Any], ad: Adaptation, mig: bool, k_sigma: float, settings: DeploymentSettings) -> None:
        """``out[todo]`` with the adaptation's heads applied (in place)."""
        member_out = hidden = None
        if ad.has_heads:
            member_out, hidden = self._member_outputs(feats)
        preds = apply_adaptation(ad, [out[i] for i in todo], member_out, hidden)
        dev = self.resolved_device
        for i, g, p in zip(todo, graphs, preds):
            if self.adaptation_flag is not None:
                p = dataclasses.replace(p, details={**p.details, "adaptation_flagged": 1.0})
            if mig and dev.has_mig and "memory_mib" in ad.heads and ad.heads["memory_mib"].ridge is not None:
                p = dataclasses.replace(p, mig=advise(p, dev, graph=g, k_sigma=k_sigma,
                                                      params=self._execution_params(), deployment=settings))
            out[i] = p

    def reset_calibration(self, *, persist: bool = True) -> None:
        """Drop the active calibration (and its file when ``persist``)."""
        self.calibration = None
        self._pred_cache.clear()
        if persist:
            delete_calibration(self.device)
            self.calibration_ignored = ""

    def __repr__(self) -> str:
        return (f"GnnPredictor(device={self.device!r}, targets={list(self.meta.targets)}, "
                f"members={self.meta.members}, calibrated={self.calibration is not None})")


def _check_storage_and_space(storage: Any, space: Any, *, space_required: bool = False) -> None:
    """``storage`` a SQLAlchemy URL (string or ``URL``) or ``None``, ``space`` a non-empty string (or ``None``
    unless ``space_required``).

    Raises:
        InvalidTypeError: naming the argument and what it got (a URL never shown: it may hold a password).
    """
    if storage is not None and not (isinstance(storage, str) and storage) and not hasattr(storage, "render_as_string"):
        raise InvalidTypeError(f"storage must be a SQLAlchemy URL string (e.g. 'sqlite:////path/adaptations.sqlite') "
                               f"or None, got {type(storage).__name__}")
    if (space is not None or space_required) and not (isinstance(space, str) and space):
        raise InvalidTypeError(f"space must be a search-space name or {ANY_SPACE!r}, got {space!r:.100}")


def _torch_ensemble() -> Any:
    """The torch ensemble's module, imported with the first torch ensemble: a prediction through the numpy
    engine never loads torch."""
    from dippm_nas.predictor import _ensemble

    return _ensemble


def _torch_engine(model: "SageEnsemble") -> Any:
    return _torch_ensemble().TorchEngine(model)


#: The part of torch's refusal of a non-weights object that names it ("Unsupported global: GLOBAL argparse.Namespace").
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _load_error_text(e: Exception) -> str:
    """What ``torch.load(weights_only=True)`` raised, without torch's advice to load the file with
    ``weights_only=False`` or to allow-list its classes: either would run code a checkpoint file carries, and a
    predictor checkpoint holds tensors and plain data only."""
    text = str(e)
    if "weights_only" not in text and "Weights only load failed" not in text:
        return f"{type(e).__name__}: {text}"
    m = _UNSUPPORTED_GLOBAL.search(text)
    what = f"an object of class {m.group(1)}" if m else "an object that is not tensors or plain data"
    return (f"it holds {what}, and predictor checkpoints are read with torch.load(weights_only=True), which "
            "never unpickles objects (they can run code); a checkpoint written by GnnPredictor.save or "
            "`dippm-nas train` holds tensors and plain data only: write it again with one of those")


def _checked_meta(path: Path, meta_json: Any, device: str | None) -> CheckpointMeta:
    """The checked metadata of checkpoint ``path``, which must answer for ``device`` (when given)."""
    meta = CheckpointMeta.from_json(meta_json, origin=f"checkpoint {path}", trusted=is_shipped_checkpoint(path))
    meta.check()
    if device is not None and resolve_device(device).id != meta.device:
        raise CheckpointError(f"checkpoint {path.name} is for device {meta.device!r}, asked for {device!r}")
    return meta


def _features_settings(settings: DeploymentSettings) -> bool:
    """``settings`` are those the features' prior estimate is made for (eager, the default host, PyTorch's
    default TF32 flags, NCHW, no autocast, no input copy), so the network's answer is the latency itself."""
    return (settings.runtime == "eager" and settings.host == default_host_profile()
            and (settings.tf32_matmul, settings.tf32_conv) == (False, True) and not settings.channels_last
            and settings.autocast is None and settings.input_copy == "none")


def _graph_key(graph: OperatorGraph) -> str:
    """Cache key of a graph: its structure plus its InputSpec (the static features read the spec)."""
    return graph.structural_hash() + json.dumps(graph.spec.to_dict(), sort_keys=True)
