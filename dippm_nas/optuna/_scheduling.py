"""When and how the cost model's candidates are predicted, and each prediction handed to the trial bookkeeping.

:class:`~dippm_nas.optuna.HardwareCostModel` holds the study's side (objectives, budgets, constraints, study set-up)
and one :class:`PredictionScheduler`, which holds the prediction's side: the device, deployment, cache and ``k`` every
prediction is for, the stored adaptation refreshed before each group, and the three ways a candidate is predicted --
at once in the caller's thread, in a batch of the background thread (:class:`~dippm_nas.optuna._background.
BatchPredictor`), or converted in a worker process and predicted in the finisher thread
(:class:`~dippm_nas.optuna._background.ConversionPool`). Each prediction (or its error) is recorded on its trial by the
:class:`~dippm_nas.optuna._bookkeeping.TrialBookkeeping`. The scheduler holds no reference to the cost model: the
callable a sampler was given (``constraints_func``) comes with each call.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from dippm_nas import errors
from dippm_nas._logging import WarnOnce
from dippm_nas._redact import redact_url
from dippm_nas.cache import default_cache
from dippm_nas.capture import ModelSource
from dippm_nas.deployment import Deployment
from dippm_nas.devices import Device
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.graph import OperatorGraph
from dippm_nas.llm import LLMWorkload, decoder_config, predict_generation
from dippm_nas.optuna._background import BackgroundWork, PendingEvaluation
from dippm_nas.optuna._bookkeeping import TrialBookkeeping
from dippm_nas.optuna._storage import storage_url_of, threads_share_storage
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import ANY_SPACE, get_predictor, predict, predict_many
from dippm_nas.spec import InputSpec

__all__ = ["PredictionScheduler", "Request", "model_source"]

logger = logging.getLogger(__name__)

_warn_once = WarnOnce(logger, python_warning=True)


def _jsonable(value: Any, what: str) -> Any:
    """``json.loads(json.dumps(value))``; a value that is not plain JSON data is an error."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidValueError(f"{what} must be plain JSON data (dicts, lists, str, numbers, bools), got {value!r}: "
                                f"{e}") from e


def model_source(model: Any, spec: InputSpec | None, space: str | None,
                 config: Mapping[str, Any] | None) -> tuple[ModelSource, str | None, Any]:
    """The candidate parsed once (:meth:`ModelSource.parse`, or :meth:`ModelSource.from_space` without a model),
    with the search space and JSON config recorded for it (given, else the model's own)."""
    if (space is None) != (config is None):
        raise InvalidValueError(f"give both space= and config= (a registered search space and its config), "
                                f"got space={space!r}, config={config!r}")
    if model is None:
        if space is None:
            raise InvalidValueError("evaluate() needs a model, or space= and config= of a registered search space")
        cfg = _jsonable(config, "config")
        return ModelSource.from_space(space, cfg, spec), space, cfg  # type: ignore[arg-type]
    source = ModelSource.parse(model, spec)
    if space is None:
        space, config = source.search_space, source.search_space_config
    return source, space, None if config is None else _jsonable(config, "config")


@dataclasses.dataclass
class Request:
    """One candidate to predict and record: the trial, the parsed candidate, the search space and config recorded
    for it, and the seconds spent on it before the prediction."""

    trial: Any
    source: ModelSource
    space: str | None
    config: Any
    seconds: float


class PredictionScheduler:
    """The prediction side of one cost model (see the module docstring).

    Args:
        device: catalogue id every prediction is for.
        deployment: how the candidates run.
        engine: the serving engine of LLM generations (``None``: the deployment's or the default).
        cache: the conversion cache, as in :func:`dippm_nas.capture`.
        k_sigma: standard deviations of memory the MIG advice of each prediction adds.
        overlap: predict a trial's candidate in the background thread when :meth:`overlaps` allows it.
        book: the cost model's trial bookkeeping (records, ``on_error``, the caller's waiting time).
        work: the cost model's background thread and conversion processes.
        resolved_device: the device the cost model resolved once (every prediction passes it inward).
        resolved_deployment: the deployment the cost model resolved once
            (:func:`~dippm_nas.predictor.resolve_deployment`; a serving deployment as given).
    """

    def __init__(self, device: str, deployment: Deployment, engine: str | None, cache: Any, k_sigma: float,
                 overlap: bool, book: TrialBookkeeping, work: BackgroundWork, *, resolved_device: Device,
                 resolved_deployment: Any) -> None:
        self.device, self.deployment, self.engine = device, deployment, engine
        self.resolved_device, self.resolved_deployment = resolved_device, resolved_deployment
        self.cache, self.k_sigma, self.overlap = cache, k_sigma, overlap
        self.on_error, self.objectives = book.on_error, book.objectives
        self._book, self._work = book, work
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ LLM generations
    def evaluate_generation(self, trial: Any, model: Any, workload: LLMWorkload,
                            constraints_func: Callable[..., Any]) -> tuple[float, ...]:
        """Predict one LLM generation at once and record it on the trial; the objective values."""
        t0 = time.perf_counter()
        try:
            pred = predict_generation(model, workload, self.resolved_device, deployment=self.deployment,
                                      engine=self.engine, mig=True)
            values = self._book.record_generation(trial, pred, time.perf_counter() - t0, constraints_func)
            try:  # the decoder's numbers, so a validator can rebuild it (random weights) and time its generation
                trial.set_user_attr("decoder_config", decoder_config(model).to_dict())
            except DippmNasError as e:  # the prediction stands; only the validator's rebuild is lost
                logger.warning("trial %s: no decoder_config user attribute (%s)", getattr(trial, "number", "?"), e)
        except Exception as e:  # noqa: BLE001 - any error fails this trial per on_error, never the study
            values = self._book.unevaluated(trial, e, constraints_func)
        finally:
            self._book.count_wait(time.perf_counter() - t0, 1)
        return values

    # ------------------------------------------------------------------ forward passes
    def overlaps(self, trial: Any) -> bool:
        """Whether :meth:`HardwareCostModel.evaluate` predicts this trial's candidate in the background (see
        ``overlap``)."""
        return (self.overlap and bool(self.objectives) and self.on_error != "raise"
                and isinstance(trial, optuna.trial.Trial) and threads_share_storage(trial.study)
                and self._book.first_time(trial))

    def predict_and_record(self, requests: list[Request], constraints_func: Callable[..., Any], *, workers: int = 1,
                           progress: bool = False, errors: str = "values", isolate: bool = False) -> list[Any]:
        """Predict the requests (one :func:`predict`, or one :func:`predict_many` for several) and record each on
        its trial. A candidate that cannot be predicted -- whatever the error: a capture that fails, a damaged
        stored adaptation, a storage error -- gives the bookkeeping's ``unevaluated`` values (``errors="values"``),
        or its error, recorded as ``cost_model_error`` (``errors="return"``; ``on_error="infeasible"`` still gives
        the +inf values). With ``isolate`` an error of one request's record (its trial finished before its record
        was written) is that request's result, and the others go on."""
        out: list[Any] = [None] * len(requests)
        by_space: dict[str | None, list[int]] = {}
        for i, r in enumerate(requests):
            by_space.setdefault(r.space, []).append(i)
        for space_name, idx in by_space.items():
            t0 = time.perf_counter()
            preds = self._predict_group([requests[i] for i in idx], space_name, workers, progress)
            share = (time.perf_counter() - t0) / len(idx)
            for i, pred in zip(idx, preds):
                out[i] = self._record_one(requests[i], pred, share, errors, isolate, constraints_func)
        return out

    def _predict_group(self, requests: list[Request], space: str | None, workers: int,
                       progress: bool) -> list[Any]:
        """The predictions of requests of one search space: a :class:`Prediction` or the exception of each."""
        try:
            self.refresh_adaptation(requests[0].trial, space)
            sources = [r.source for r in requests]  # a search-space candidate's graph is assembled from blocks
            if len(sources) == 1:
                return [predict(sources[0], None, self.device, deployment=self.resolved_deployment, cache=self.cache,
                                mig=True, k_sigma=self.k_sigma)]
            return list(predict_many(sources, self.device, workers=workers, cache=self.cache, mig=True,
                                     deployment=self.resolved_deployment, k_sigma=self.k_sigma, progress=progress))
        except Exception as e:  # noqa: BLE001 - each trial of the group fails per on_error; the study goes on
            return [e] * len(requests)

    def _record_one(self, r: Request, pred: Any, share: float, errors: str, isolate: bool,
                    constraints_func: Callable[..., Any]) -> Any:
        """Record one request's prediction (or its error) on its trial: the objective values, or the error."""
        try:
            if not isinstance(pred, Prediction):
                raise pred
            return self._book.record(r.trial, pred, r.source.spec, r.space, r.config, r.seconds + share,
                                     constraints_func)
        except Exception as e:  # noqa: BLE001 - any error of a prediction is that trial's (on_error)
            if self.on_error == "raise" and not isolate:
                self._book.unevaluated(r.trial, e, constraints_func)  # records it, raises it
            if errors == "values" or self.on_error == "infeasible":
                return self._book.unevaluated(r.trial, e, constraints_func)
            try:
                r.trial.set_user_attr("cost_model_error", f"{type(e).__name__}: {e}")
            except Exception as e2:  # noqa: BLE001 - see isolate
                return self._isolated(r, e2, isolate)
            return e if isinstance(e, DippmNasError) else DippmNasError(f"{type(e).__name__}: {e}")

    @staticmethod
    def _isolated(request: Request, error: Exception, isolate: bool) -> Exception:
        """A request's own error in the background thread (logged once), re-raised elsewhere."""
        if not isolate:
            raise error
        _warn_once("background-record", "the cost model could not record trial %s (%s: %s): return or read the "
                   "figures evaluate() returned before the objective returns (Optuna refuses writes to a finished "
                   "trial)", getattr(request.trial, "number", "?"), type(error).__name__, error)
        return error

    def refresh_adaptation(self, trial: Any, space: str | None) -> None:
        """Make the device's predictor answer with the newest stored adaptation of (device, deployment, space) in
        the study's storage (the cache directory's store for other storages); predictors without a network have
        none."""
        predictor = get_predictor(self.resolved_device)
        if not callable(getattr(predictor, "refresh_adaptation", None)):
            return
        url = storage_url_of(getattr(trial, "study", None))
        with self._lock:
            predictor.use_adaptation(storage=url, space=space or ANY_SPACE)
            try:
                predictor.refresh_adaptation(deployment=self.resolved_deployment)
            except DippmNasError as e:
                where = redact_url(url) if url is not None else "the cache directory's store"
                _warn_once(f"adapt-refresh:{where}", "the adaptations of %s in %s were not read (%s); predicting "
                           "without them", self.device, where, e)
            # any other error (a damaged store) reaches _predict_group: the trials fail per on_error

    # ------------------------------------------------------------------ background conversion
    def _worker_cache_url(self) -> str | None:
        if self.cache is True:
            return default_cache().url_with_credentials()
        if self.cache is False or self.cache is None:
            return None
        return self.cache.url_with_credentials()

    def convert_in_background(self, trial: Any, model: Any, spec: InputSpec | None, space: str | None,
                              config: Mapping[str, Any] | None,
                              constraints_func: Callable[..., Any]) -> PendingEvaluation:
        """Convert the candidate in a worker process, then predict and record it in the finisher thread
        (:meth:`HardwareCostModel.submit` with ``background_workers > 0``)."""
        t0 = time.perf_counter()
        source, space_name, cfg = model_source(model, spec, space, config)
        the_spec = source.spec
        payload = ("space", space_name, cfg) if space_name is not None else ("module", source.model, None)
        pool = self._work.conversions(self._worker_cache_url())
        done = pool.convert_then(payload, the_spec, self.cache not in (False, None), self.finish_background,
                                 trial, model, the_spec, space_name, cfg, constraints_func)
        self._book.count_wait(time.perf_counter() - t0)
        return PendingEvaluation(self._book, done, None, None, trial, constraints_func)

    def finish_background(self, trial: Any, model: Any, spec: InputSpec, space: str | None, config: Any,
                          constraints_func: Callable[..., Any], conversion: Any) -> tuple[float, ...]:
        """Finisher thread: wait for the conversion, predict, record on the trial."""
        from concurrent.futures.process import BrokenProcessPool

        t0 = time.perf_counter()
        try:
            text, etype, message, convert_s = conversion.result()
        except BrokenProcessPool as e:
            self._work.forget_conversion_processes()  # the next submit starts new processes
            err = DippmNasError(f"the background conversion process died while converting this model ({e})")
            trial.set_user_attr("cost_model_error", f"{type(err).__name__}: {err}")
            raise err from e
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable model: convert here instead, same result
            _warn_once("background-fallback", "background conversion failed (%s: %s); converting in this process "
                       "instead", type(e).__name__, e)
            return self._evaluate_now(trial, model, spec, space, config, constraints_func)
        if text is None:
            cls = getattr(errors, etype or "", None)
            cls = cls if isinstance(cls, type) and issubclass(cls, DippmNasError) else DippmNasError
            err = cls(f"(in the background conversion process) {message}")
            trial.set_user_attr("cost_model_error", f"{type(err).__name__}: {err}")
            raise err
        self.refresh_adaptation(trial, space)
        pred = predict(OperatorGraph.from_json(text), None, self.device, cache=False, mig=True, k_sigma=self.k_sigma,
                       deployment=self.resolved_deployment)
        values = self._book.record(trial, pred, spec, space, config, convert_s + (time.perf_counter() - t0),
                                   constraints_func)
        self._book.count_wait(0.0, 1)
        return values

    def _evaluate_now(self, trial: Any, model: Any, spec: InputSpec, space: str | None, config: Any,
                      constraints_func: Callable[..., Any]) -> tuple[float, ...]:
        """:meth:`evaluate` in this thread (the finisher's fallback): the objective values as a tuple."""
        request = Request(trial, ModelSource.parse(model, spec), space, config, 0.0)
        values = self.predict_and_record([request], constraints_func)[0]
        self._book.count_wait(0.0, 1)
        return values


