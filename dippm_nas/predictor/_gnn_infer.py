"""Inference of :class:`~dippm_nas.predictor.GnnPredictor`: graphs to features to the network's log answers, with
each graph's novelty (how far it lies from the training graphs) and what that leaves of the correction.

:class:`GnnInference` holds the network engine (torch or numpy), the novelty reference set and the feature cache
of one predictor; the facade's public methods of the same names answer through it. What the log answers become
(timelines, calibration factors, figures in units) is :mod:`~dippm_nas.predictor._gnn_compose`'s.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dippm_nas.devices import get_device
from dippm_nas.features import GraphFeatures, featurize, featurize_many, static_dtype_columns
from dippm_nas.graph import OperatorGraph
from dippm_nas.predictor._adapt import head_inputs
from dippm_nas.predictor._gnn_load import to_torch
from dippm_nas.predictor._meta import TARGETS
from dippm_nas.predictor._novelty import correction_weight, novelty_floor_log, novelty_scores
from dippm_nas.predictor._numpy_ensemble import INFER_CHUNK_NODES, NUMPY_MAX_GRAPHS, NumpyEnsemble, global_arrays
from dippm_nas.prior import CostStack, estimates_of, resolved_settings

if TYPE_CHECKING:  # pragma: no cover
    from dippm_nas.predictor._gnn import GnnPredictor

__all__ = ["GnnInference", "graph_key"]


class GnnInference:
    """Features, log answers and novelty of one :class:`~dippm_nas.predictor.GnnPredictor` (``p``).

    Attributes:
        p: the predictor it answers for (its ``meta``, device, prior constants, host facts and calibration).
        engine: the network engine (:class:`~dippm_nas.predictor.NumpyEnsemble` or the torch engine).
        novelty_ref: standardised static features of training graphs ``[R, static_dim]`` (a tensor, or an array
            on the numpy engine), or ``None``.
        cache: features per (graph key, device), an LRU of ``cache_size`` entries.
        member_memo: within :meth:`one_network_pass`, each graph's member outputs and head inputs by the identity
            of its features.
    """

    def __init__(self, p: "GnnPredictor", engine: Any, novelty_ref: Any, cache_size: int) -> None:
        self.p = p
        self.engine = engine
        self.novelty_ref = novelty_ref
        self.cache: OrderedDict[tuple[str, str], GraphFeatures] = OrderedDict()  # (graph key, device)
        self.cache_size = cache_size
        self.lock = threading.Lock()
        self.member_memo: dict[int, tuple[np.ndarray, np.ndarray]] | None = None

    def use_torch(self) -> None:
        """Move to the torch ensemble, built from the numpy engine's weights."""
        self.engine, self.novelty_ref = to_torch(self.engine, self.p.meta, self.novelty_ref)
        self.p.clear_prediction_cache()

    def features(self, graph: OperatorGraph, device: str | None = None) -> GraphFeatures:
        """Cached feature tensors of ``graph`` on ``device`` (default: this predictor's)."""
        dev = device or self.p.device
        key = (graph_key(graph), dev)
        with self.lock:
            f = self.cache.get(key)
            if f is not None:
                self.cache.move_to_end(key)
                return f
        f = featurize(graph, self.feature_target(dev), style=self.p.meta.feature_style,
                      prior_params=self.p.prior_params)
        self.keep_features(key, f)
        return f

    def feature_target(self, dev: str) -> Any:
        """The device features are computed on: this predictor's resolved device (at a host checkpoint's thread
        count), or the id ``dev`` of another."""
        if dev != self.p.device:
            return dev
        return self.p.resolved_device if self.p.host_threads is None else get_device(dev, threads=self.p.host_threads)

    def keep_features(self, key: tuple[str, str], f: GraphFeatures) -> None:
        with self.lock:
            self.cache[key] = f
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)

    def features_many(self, graphs: Sequence[OperatorGraph], keys: Sequence[str], stack: CostStack
                       ) -> list[GraphFeatures]:
        """Features of this predictor's device for ``graphs`` (whose graph keys are ``keys``), the prior's
        estimates of those not cached made over ``stack`` at once."""
        with self.lock:
            out: list[GraphFeatures | None] = [self.cache.get((k, self.p.device)) for k in keys]
        missing = [i for i, f in enumerate(out) if f is None]
        if missing:
            target = self.feature_target(self.p.device)
            ests = estimates_of(stack, resolved_settings(target, params=self.p.prior_params))
            made = featurize_many([graphs[i] for i in missing], target, style=self.p.meta.feature_style,
                                  prior_params=self.p.prior_params, estimates=[ests[i] for i in missing],
                                  stack=stack.graph_stack if len(missing) == len(graphs) else None)
            for i, f in zip(missing, made):
                self.keep_features((keys[i], self.p.device), f)
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
        if len(feats) > NUMPY_MAX_GRAPHS and isinstance(self.engine, NumpyEnsemble):
            self.use_torch()  # its batched pass is the faster one
        engine = self.engine
        b = global_arrays(feats)
        # [B, 3] each: the members' mean and std of engine.infer, computed chunk by chunk
        memo = self.memo_of(feats)
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
        shrink = self.shrink_widths() or self.validated_max() is not None
        nov = (novelty_scores(engine.static_z(b), self.novelty_ref)
               if (novelty or shrink) and self.novelty_ref is not None else np.full(len(feats), np.nan))
        if shrink and engine.residual_on_prior:
            # far from the training graphs keep only part of the correction (see _novelty): the prior answers more
            for t, w in self.correction_weights(nov).items():
                j = TARGETS.index(t)
                wt = w.astype(mean.dtype)
                mean[:, j] = b["log_prior"][:, j] + wt * (mean[:, j] - b["log_prior"][:, j])
        graph_ood, device_ood = engine.outside_parts(b)
        if self.p.meta.host is None:  # a checkpoint of several devices: their range is a training range too
            ood, other_machine = graph_ood | device_ood, np.zeros(len(feats), dtype=bool)
        else:  # one machine seen: another one is other_host (by CPU model) or other_machine
            ood, other_machine = graph_ood, device_ood & (self.p.other_host is None)
        return mean.astype(np.float64), std.astype(np.float64), ood, nov, other_machine

    def shrink_widths(self) -> dict[str, float]:
        nf = self.p.meta.novelty
        return {} if nf is None else {t: float(c) for t, c in nf.get("shrink", {}).items()}

    def withheld_targets(self, novelty: float) -> set[str]:
        """Targets whose correction a graph of this novelty does not get (beyond ``validated_max``)."""
        vmax = self.validated_max()
        if vmax is None or not math.isfinite(novelty) or novelty <= vmax or not self.engine.residual_on_prior:
            return set()
        return set(self.p.meta.novelty["floor_log"])  # type: ignore[index]

    def validated_max(self) -> float | None:
        nf = self.p.meta.novelty
        return None if nf is None or nf.get("validated_max") is None else float(nf["validated_max"])

    def correction_weights(self, novelty: np.ndarray) -> dict[str, np.ndarray]:
        """Per shrunk target, the share of the network's correction each graph keeps (``[num_graphs]``
        in [0, 1]; see :func:`~dippm_nas.predictor._novelty.correction_weight`); 0 beyond the novelty the
        correction was validated to (``NoveltyFloor.validated_max``, every target with a novel floor);
        ``{}`` for a checkpoint with neither."""
        shrink = self.shrink_widths()
        vmax = self.validated_max()
        if not shrink and vmax is None:
            return {}
        d0 = float(self.p.meta.novelty["d0"])  # type: ignore[index]
        floored = set(self.p.meta.novelty["floor_log"])  # type: ignore[index]
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
        cols = static_dtype_columns(self.p.meta.feature_style)
        static = np.asarray(b["static"])
        g = static.shape[0]
        if cols is None or not self.engine.residual_on_prior:
            return np.zeros(g, dtype=bool)
        sl = cols[0]
        seen = self.engine.global_hi[sl] > 0.5  # the static block comes first in the range buffers
        return ((static[:, sl] > 0.5) & ~seen).any(1)

    def prior_only(self, feats: Sequence[GraphFeatures]) -> np.ndarray:
        """Per graph: is its compute dtype one of the checkpoint's ``prior_only_dtypes`` (its pinned prior answers,
        the correction withheld; ``details["prior_only_dtype"] = 1``)?

        Shapes:
            returns ``[num_graphs]`` bool.
        """
        only = set(self.p.meta.prior_only_dtypes)
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
        floor = max(self.p.meta.std_floor_log.get(target, 0.0), novelty_floor_log(self.p.meta.novelty, target, novelty))
        s = math.hypot(std_members, floor)
        calibrated = self.p.calibration is not None and self.p.calibration.has(target)
        fl = (self.p.other_host_floor_log if self.p.other_host is not None
              else self.p.other_machine_floor_log if other_machine else None)
        if fl is not None and not calibrated:
            # a target not measured across machines takes the widest measured floor
            s = math.hypot(s, fl.get(target, max(fl.values(), default=0.0)))
        if ood and self.engine.residual_on_prior:
            s = math.hypot(s, 0.5 * float(self.engine.delta_max[TARGETS.index(target)]))
        return s


    def member_outputs(self, graphs: Sequence[OperatorGraph]) -> tuple[np.ndarray, np.ndarray]:
        """Each member's log answer ``[K, G, 3]`` (before any shrink, calibration or adaptation) and what its
        residual head reads (:func:`~dippm_nas.predictor._adapt.head_inputs`, ``[K, G, hidden + static]``)."""
        return self.member_outputs_of([self.features(g) for g in graphs])

    def member_outputs_of(self, feats: Sequence[GraphFeatures]) -> tuple[np.ndarray, np.ndarray]:
        memo = self.memo_of(feats)
        if memo is not None:
            return memo
        b = global_arrays(feats)
        out, hid = self.engine.infer_hidden(feats, b)
        return out, head_inputs(hid, self.engine.static_z(b))

    def memo_of(self, feats: Sequence[GraphFeatures]) -> tuple[np.ndarray, np.ndarray] | None:
        """The member outputs and head inputs of ``feats`` kept by :meth:`one_network_pass` (``None`` unless every
        graph has them)."""
        memo = self.member_memo
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
        out, hid = self.engine.infer_hidden(feats, b)
        x = head_inputs(hid, self.engine.static_z(b))
        outer = self.member_memo
        self.member_memo = {**(outer or {}), **{id(f): (out[:, i], x[:, i]) for i, f in enumerate(feats)}}
        try:
            yield
        finally:
            self.member_memo = outer

def graph_key(graph: OperatorGraph) -> str:
    """Cache key of a graph: its structure plus its InputSpec (the static features read the spec)."""
    return graph.structural_hash() + json.dumps(graph.spec.to_dict(), sort_keys=True)
