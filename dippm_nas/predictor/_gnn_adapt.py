"""Calibration and adaptation of :class:`~dippm_nas.predictor.GnnPredictor`: measured rows of its device become a
factor calibration, or an :class:`~dippm_nas.predictor.Adaptation` (the factors and the residual heads) kept in
the adaptation store, and stored adaptations become the active one.

:class:`GnnAdaptation` holds what one predictor knows of its adaptations: the active one, the store and search
space it reads, the deployments looked up and those whose stored version was set aside; the facade's public
methods of the same names (``calibrate``, ``adapt``, ``use_adaptation``...) answer through it. A store that cannot
be read, and a stored version that does not check, are flagged in the predictions, never raised at them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dippm_nas._logging import WarnOnce
from dippm_nas._redact import redact_url
from dippm_nas.deployment import Deployment
from dippm_nas.devices import HostProfile
from dippm_nas.errors import DippmNasError, InvalidTypeError, InvalidValueError
from dippm_nas.features import GraphFeatures
from dippm_nas.graph import OperatorGraph
from dippm_nas.mig import advise
from dippm_nas.predictor._adapt import (ANY_SPACE, HANDOVER_ROWS, Adaptation, AdaptationKey, apply_adaptation,
                                        check_rows_key, deployment_key, fit_adaptation)
from dippm_nas.predictor._adapt_store import default_adapt_url, open_adaptation_store, read_newest
from dippm_nas.predictor._base import deployment_of, measurement_pairs
from dippm_nas.predictor._calibrate import (Calibration, calibration_classes, checkpoint_identity,
                                            delete_calibration, fit_calibration, fit_timeline_factors,
                                            require_plausible, save_calibration)
from dippm_nas.predictor._gnn_infer import graph_key
from dippm_nas.prior import DeploymentSettings, DeploymentSpread, described_offset_log, deployment_spread

if TYPE_CHECKING:  # pragma: no cover
    from dippm_nas.predictor._gnn import GnnPredictor

__all__ = ["GnnAdaptation", "check_storage_and_space"]

logger = logging.getLogger(__name__)
_warn_once = WarnOnce(logger, python_warning=True)


class GnnAdaptation:
    """Calibration and adaptations of one :class:`~dippm_nas.predictor.GnnPredictor` (``p``).

    Attributes:
        p: the predictor (its calibration, features, log answers and prediction cache).
        adaptation: the active :class:`~dippm_nas.predictor.Adaptation`, or ``None``.
        adaptation_storage: where adaptations are read and written (a SQLAlchemy URL; ``None``: the cache
            directory's SQLite file).
        adaptation_space: the search space whose adaptation the predictor answers with (``"any"``: every space).
        adaptation_flag: why a stored adaptation was set aside (checksum, key or checkpoint hash) or not read,
            else ``None``.
        ignored_keys: deployment keys whose stored adaptation was not read, or set aside and not refitted: their
            predictions carry ``details["adaptation_ignored"] = 1``.
        looked: deployment keys whose stored adaptation was looked up.
        load_adaptations: look stored adaptations up at all (``False`` for a predictor built without its
            persisted calibration).
    """

    def __init__(self, p: "GnnPredictor", *, load_adaptations: bool) -> None:
        self.p = p
        self.adaptation: Adaptation | None = None
        self.adaptation_storage: str | None = None
        self.adaptation_space: str = ANY_SPACE
        self.adaptation_flag: str | None = None
        self.ignored_keys: set[str] = set()
        self.looked: set[str] = set()
        self.load_adaptations = load_adaptations

    def ignored(self, deployment: Deployment) -> bool:
        """Whether the predictions for ``deployment`` carry ``details["adaptation_ignored"] = 1``."""
        return bool(self.ignored_keys) and deployment_key(self.p.resolved_device, deployment=deployment) \
            in self.ignored_keys

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
            _warn_once(f"calibrate-few:{self.p.device}", "calibrate() needs at least 2 measurements with a figure "
                       "> 0, got %d: the %s predictions are left unchanged", len(pairs), self.p.device)
            return None
        cal = self.fit_factor_calibration(pairs, runtime, host, deployment=deployment)
        self.p.calibration = cal
        self.p.clear_prediction_cache()
        if persist:
            save_calibration(cal)
            self.p.calibration_ignored = ""
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
        _, st = deployment_of(self.p.resolved_device, deployment, runtime, host)
        saved, self.p.calibration = self.p.calibration, None
        try:
            feats = [self.p.features(g) for g, _ in pairs]
            mean, _ = self.p.predict_log(feats)
            targets = list(self.p.meta.targets)
            timeline = None
            if self.p.resolved_device.kind == "gpu" and "latency_ms" in targets:
                idx = [i for i, (_, y) in enumerate(pairs) if "latency_ms" in y and feats[i].estimate is not None]
                if len(idx) >= 2:
                    parts, ys = [], []
                    for i in idx:
                        _, g, h, pre, d, _ = self.p.composer.timeline_parts(pairs[i][0], feats[i].estimate,
                                                                            float(mean[i, 0]), st)
                        parts.append((g, h, pre))
                        sp = (deployment_spread(pairs[i][0], self.p.resolved_device, st,
                                                params=self.p.composer.execution_params(),
                                                gpu_factor=d["gpu_correction"]) if st.spread_open
                              else DeploymentSpread())
                        # a described copy's mixture stays in the prediction: the factors fit the rest
                        ys.append(pairs[i][1]["latency_ms"] * math.exp(-described_offset_log(st, sp)))
                    tf = fit_timeline_factors(parts, ys,
                                              node_classes=[calibration_classes(pairs[i][0]) for i in idx])
                    timeline = dataclasses.asdict(tf)
                    targets.remove("latency_ms")
        finally:
            self.p.calibration = saved
        labels = [{k: v for k, v in y.items() if k in targets} for _, y in pairs]
        if any(labels):
            cal = dataclasses.replace(fit_calibration(self.p.device, self.p.meta, mean, labels, targets=targets),
                                      timeline=timeline)
        elif timeline is not None:
            cal = Calibration(device=self.p.device, checkpoint=checkpoint_identity(self.p.meta), coef={}, n={},
                              timeline=timeline)
        else:
            raise DippmNasError(f"no measurement holds a label for the targets {list(self.p.meta.targets)}")
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
        check_storage_and_space(storage, space)
        measurements = list(measurements)
        pairs = measurement_pairs(measurements) if measurements else []
        dep, _ = deployment_of(self.p.resolved_device, deployment, runtime, host)
        if storage is not None:
            self.adaptation_storage = storage
        if space is not None:
            self.adaptation_space = space
        key = AdaptationKey(self.p.device, deployment_key(self.p.resolved_device, deployment=dep),
                            self.adaptation_space)
        check_rows_key(measurements, key)
        if persist:
            ad = self.adapt_stored(key, pairs, dep)
        else:
            ad = fit_adaptation(self.p, pairs, key, dep)
        if ad is None:
            _warn_once(f"adapt-few:{self.p.device}", "adapt() needs at least 2 measured graphs with a figure > 0, got "
                       "%d: the %s predictions are left unchanged", len(pairs), self.p.device)
            return None
        self.activate_adaptation(ad)
        return ad

    def adapt_stored(self, key: AdaptationKey, pairs: Sequence[tuple[OperatorGraph, dict[str, float]]],
                      deployment: Deployment) -> Adaptation | None:
        """Store ``pairs`` under ``key`` and fit on every stored row; refit while rows arrived meanwhile."""
        store = open_adaptation_store(self.adaptation_storage)
        try:
            store.add_rows(key.digest, key.to_json(), [(g, graph_key(g), y) for g, y in pairs])
            ad = None
            for _ in range(8):
                rows, ignored = store.rows_checked(key.digest)
                ad = fit_adaptation(self.p, rows, key, deployment)
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
        self.p.calibration = ad.calibration
        self.looked.add(ad.key.deployment)
        self.ignored_keys.discard(ad.key.deployment)
        self.p.clear_prediction_cache()

    def use_adaptation(self, *, storage: str | None = None, space: str = ANY_SPACE) -> None:
        """Answer with the newest stored adaptation of ``space`` in ``storage`` (looked up at the next
        prediction, and again by :meth:`refresh_adaptation`). A store that cannot be read then is flagged, never
        raised (:meth:`load_stored_adaptation`).

        Raises:
            InvalidTypeError: ``storage`` is not a URL string or ``None``, or ``space`` not a non-empty string.
        """
        check_storage_and_space(storage, space, space_required=True)
        if (storage, space) != (self.adaptation_storage, self.adaptation_space):
            self.adaptation_storage, self.adaptation_space = storage, space
            self.looked.clear()
            self.ignored_keys.clear()
            self.p.clear_prediction_cache()
            if self.adaptation is not None:
                self.reset_adaptation()

    def refresh_adaptation(self, *, runtime: str | None = None, host: HostProfile | str | None = None,
                           deployment: Deployment | None = None) -> Adaptation | None:
        """Load the newest stored version for this device, deployment and :attr:`adaptation_space` when it is
        newer than the active one (a search picks up what its validation workers fitted); returns the active one."""
        dep, _ = deployment_of(self.p.resolved_device, deployment, runtime, host)
        self.looked.discard(deployment_key(self.p.resolved_device, deployment=dep))
        return self.adaptation_for(dep)

    def reset_adaptation(self) -> None:
        """Drop the active adaptation (and its calibration) in this process; the store keeps it."""
        if self.adaptation is not None and self.p.calibration is self.adaptation.calibration:
            self.p.calibration = None
        self.adaptation = None
        self.p.clear_prediction_cache()


    def adaptation_for(self, deployment: Deployment) -> Adaptation | None:
        """The adaptation that applies to a request for ``deployment`` (the stored one looked up once per
        deployment), or ``None``."""
        dep = deployment_key(self.p.resolved_device, deployment=deployment)  # type: ignore[arg-type]
        if dep not in self.looked and self.load_adaptations:
            self.looked.add(dep)
            self.load_stored_adaptation(AdaptationKey(self.p.device, dep, self.adaptation_space), deployment)
        ad = self.adaptation
        return ad if ad is not None and ad.key.deployment == dep else None

    def load_stored_adaptation(self, key: AdaptationKey, deployment: Deployment) -> None:
        """Activate the newest stored version of ``key`` when newer than the active one. A store that cannot be
        read, and a version whose checksum, key or checkpoint hash does not match or that does not decode, are
        flagged (:attr:`adaptation_flag`, one warning) and never raise; a version set aside is refitted from the
        stored rows on this checkpoint, and without a refit the key's predictions carry
        ``details["adaptation_ignored"] = 1``."""
        where = redact_url(self.adaptation_storage or default_adapt_url())
        try:
            stored = read_newest(self.adaptation_storage, key.digest)
        except DippmNasError as e:
            self.ignore_adaptation(key, f"the adaptations in {where} were not read: {e}")
            _warn_once(f"adapt-read:{where}:{key.digest}", "adaptations in %s not read: %s; the %s predictions are "
                       "unadapted and flagged details['adaptation_ignored'] = 1", where, e, self.p.device)
            return
        if stored is None or (self.adaptation is not None and self.adaptation.key == key
                              and self.adaptation.version >= stored.version):
            return
        why = None
        try:
            ad = Adaptation.from_stored(stored, key)
            if ad.checkpoint_sha256 != self.p.checkpoint_hash():
                why = (f"version {stored.version} was fitted on checkpoint {ad.checkpoint_sha256[:12]}..., this one is "
                       f"{self.p.checkpoint_hash()[:12]}...")
        except InvalidValueError as e:
            why = f"version {stored.version}: {e}"
        if why is None:
            self.activate_adaptation(ad)
            return
        self.adaptation_flag = why
        _warn_once(f"adapt-bad:{key.digest}:{stored.version}", "stored adaptation of %s (%s) in %s set aside: %s; "
                   "refitting it from its stored rows on this checkpoint", self.p.device, key.space, where, why)
        try:
            refit = self.adapt_stored(key, [], deployment)
        except DippmNasError as e:
            self.ignore_adaptation(key, f"{why}; not refitted: {e}")
            _warn_once(f"adapt-refit:{key.digest}", "the adaptation of %s could not be refitted (%s): predictions "
                       "stay unadapted, flagged details['adaptation_ignored'] = 1", self.p.device, e)
            return
        if refit is None:
            self.ignore_adaptation(key, f"{why}; fewer than 2 sound stored rows to refit it on")
        else:
            self.activate_adaptation(refit)

    def ignore_adaptation(self, key: AdaptationKey, why: str) -> None:
        """Flag ``key``'s predictions: ``details["adaptation_ignored"] = 1`` while no adaptation applies (an older
        active one stays, flagged ``details["adaptation_flagged"] = 1``); ``why``: :attr:`adaptation_flag`."""
        self.adaptation_flag = why
        self.ignored_keys.add(key.deployment)
        self.p.clear_prediction_cache()

    def adapted(self, graphs: Sequence[OperatorGraph], feats: Sequence[GraphFeatures], todo: Sequence[int],
                 out: list[Any], ad: Adaptation, mig: bool, k_sigma: float, settings: DeploymentSettings) -> None:
        """``out[todo]`` with the adaptation's heads applied (in place); a graph of a precision its rows did not run
        in keeps its unadapted prediction, flagged ``details["adaptation_other_dtype"] = 1``."""
        fit = [j for j, g in enumerate(graphs) if ad.applies_to(g)]
        for j in set(range(len(graphs))) - set(fit):
            out[todo[j]] = dataclasses.replace(out[todo[j]], details={**out[todo[j]].details,
                                                                      "adaptation_other_dtype": 1.0})
        if len(fit) < len(graphs):
            graphs, feats, todo = [graphs[j] for j in fit], [feats[j] for j in fit], [todo[j] for j in fit]
        if not todo:
            return
        member_out = hidden = None
        if ad.has_heads:
            member_out, hidden = self.p.inference.member_outputs_of(feats)
        preds = apply_adaptation(ad, [out[i] for i in todo], member_out, hidden)
        dev = self.p.resolved_device
        for i, g, p in zip(todo, graphs, preds):
            if self.adaptation_flag is not None:
                p = dataclasses.replace(p, details={**p.details, "adaptation_flagged": 1.0})
            if mig and dev.has_mig and "memory_mib" in ad.heads and ad.heads["memory_mib"].ridge is not None:
                p = dataclasses.replace(p, mig=advise(p, dev, graph=g, k_sigma=k_sigma,
                                                      params=self.p.composer.execution_params(), deployment=settings))
            out[i] = p

    def reset_calibration(self, *, persist: bool = True) -> None:
        """Drop the active calibration (and its file when ``persist``)."""
        self.p.calibration = None
        self.p.clear_prediction_cache()
        if persist:
            delete_calibration(self.p.device)
            self.p.calibration_ignored = ""


def check_storage_and_space(storage: Any, space: Any, *, space_required: bool = False) -> None:
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

