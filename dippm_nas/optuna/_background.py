"""Background evaluation: predictions that run while the objective trains, joined when their figures are read.

Two executors serve :class:`~dippm_nas.optuna.HardwareCostModel`:

- :class:`BatchPredictor`, one thread of this process: :meth:`HardwareCostModel.evaluate` hands it the candidate
  and returns :class:`PendingValue` figures at once; the thread predicts every candidate queued when it wakes in
  one :func:`dippm_nas.predict_many` (several trials of ``study.optimize(n_jobs=...)``), records them on their
  trials, and a figure read (``float()``, a comparison, Optuna's ``tell``) waits for its trial;
- :class:`ConversionPool`, ``background_workers`` processes for :meth:`HardwareCostModel.submit`: the conversion
  (``torch.export`` + Relax) of a model in a worker process, the prediction in a finisher thread.

:class:`BackgroundWork` holds both for one cost model, started on first use. None of them holds a reference to the
cost model (the thread calls it through a weak reference), so a cost model dropped without ``close()`` is collected
and its finalizer stops them. The figures and records of a trial go through the cost model's
:class:`~dippm_nas.optuna._bookkeeping.TrialBookkeeping` (``count_wait``, ``unevaluated``, ``shape``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from dippm_nas.cache import ConversionCache, set_default_cache
from dippm_nas.capture import assemble, capture
from dippm_nas.errors import DippmNasError
from dippm_nas.optuna._bookkeeping import TrialBookkeeping
from dippm_nas.spec import InputSpec

__all__ = ["PendingEvaluation", "PendingValue", "BatchPredictor", "ConversionPool", "BackgroundWork"]

logger = logging.getLogger(__name__)


class PendingEvaluation:
    """A candidate evaluated in the background (:meth:`HardwareCostModel.submit`, or :meth:`~HardwareCostModel.evaluate`
    with ``overlap``); :meth:`result` waits for its figures, recorded on the trial."""

    def __init__(self, book: TrialBookkeeping, future: Any, values: tuple[float, ...] | None,
                 error: DippmNasError | None, trial: Any = None, constraints_func: Any = None) -> None:
        self._book, self._future, self._values, self._error = book, future, values, error
        self._trial, self._constraints_func = trial, constraints_func
        self._lock = threading.Lock()

    def done(self) -> bool:
        """Whether :meth:`result` would return without waiting."""
        return self._future is None or self._future.done()

    def values(self, timeout: float | None = None) -> tuple[float, ...]:
        """The objective values as a tuple (one per objective), once recorded on the trial.

        A prediction that failed with any error (not only a :class:`DippmNasError`: a damaged adaptation, a
        storage error) gives the values of ``on_error`` (NaN or +inf, the error recorded on the trial) when the
        evaluation has a trial and ``on_error`` is not ``"raise"``: reading a figure never raises into Optuna,
        which would leave the trial running.

        Raises:
            DippmNasError, TimeoutError: as :meth:`result`.
        """
        with self._lock:
            if self._future is not None:
                t0 = time.perf_counter()
                try:
                    self._values = self._future.result(timeout=timeout)
                except TimeoutError:
                    raise
                except Exception as e:  # noqa: BLE001 - see above
                    if isinstance(e, DippmNasError):
                        self._error = e
                    else:
                        self._error = DippmNasError(f"{type(e).__name__}: {e}")
                        self._error.__cause__ = e
                finally:
                    self._book.count_wait(time.perf_counter() - t0)
                self._future = None
                if self._error is not None and self._book.on_error != "raise" and self._trial is not None:
                    self._values = self._book.unevaluated(self._trial, self._error, self._constraints_func)
                    self._error = None
        if self._error is not None:
            raise self._error
        assert self._values is not None
        return self._values

    def result(self, timeout: float | None = None) -> float | tuple[float, ...]:
        """The objective values (a float for one objective, a tuple for several), once the prediction is
        recorded on the trial and its constraints registered.

        Args:
            timeout: seconds to wait (``None``: as long as it takes).

        Raises:
            DippmNasError: as :meth:`HardwareCostModel.evaluate` (the conversion failed or its process died,
                and ``on_error="raise"``; otherwise the values say so, as there).
            TimeoutError: not finished within ``timeout``.
        """
        return self._book.shape(self.values(timeout))


class PendingValue:
    """One objective value of a candidate predicted in the background; reading it waits for the prediction.

    ``float(v)`` (what Optuna does to an objective's return values before telling the trial), comparisons,
    arithmetic and formatting all wait, then act on the float. :meth:`HardwareCostModel.evaluate` returns these
    when it overlaps the prediction with the objective's own work.
    """

    __slots__ = ("_pending", "_index")

    def __init__(self, pending: PendingEvaluation, index: int) -> None:
        self._pending, self._index = pending, index

    def __float__(self) -> float:
        return float(self._pending.values()[self._index])

    @property
    def pending(self) -> PendingEvaluation:
        """The evaluation this value belongs to."""
        return self._pending

    def done(self) -> bool:
        """Whether reading the value would return without waiting."""
        return self._pending.done()

    def __repr__(self) -> str:
        return repr(float(self)) if self.done() else f"<PendingValue {self._index} (predicting)>"

    def __str__(self) -> str:
        return str(float(self))

    def __format__(self, spec: str) -> str:
        return format(float(self), spec)

    def __hash__(self) -> int:
        return hash(float(self))

    def __bool__(self) -> bool:
        return bool(float(self))

    def __eq__(self, other: object) -> bool:
        return float(self) == other

    def __lt__(self, other: Any) -> bool:
        return float(self) < other

    def __le__(self, other: Any) -> bool:
        return float(self) <= other

    def __gt__(self, other: Any) -> bool:
        return float(self) > other

    def __ge__(self, other: Any) -> bool:
        return float(self) >= other

    def __add__(self, other: Any) -> float:
        return float(self) + other

    def __radd__(self, other: Any) -> float:
        return other + float(self)

    def __sub__(self, other: Any) -> float:
        return float(self) - other

    def __rsub__(self, other: Any) -> float:
        return other - float(self)

    def __mul__(self, other: Any) -> float:
        return float(self) * other

    def __rmul__(self, other: Any) -> float:
        return other * float(self)

    def __truediv__(self, other: Any) -> float:
        return float(self) / other

    def __rtruediv__(self, other: Any) -> float:
        return other / float(self)

    def __neg__(self) -> float:
        return -float(self)

    def __abs__(self) -> float:
        return abs(float(self))

    def __round__(self, ndigits: int | None = None) -> float:
        return round(float(self), ndigits)

    def is_nan(self) -> bool:
        """Whether the value is NaN (the candidate could not be evaluated and ``on_error="fail"``)."""
        return math.isnan(float(self))


class BatchPredictor:
    """One thread that predicts queued candidates in batches (see the module docstring).

    Args:
        predict_batch: called in the thread with the list of queued requests; returns one result per request
            (the objective values, or the :class:`DippmNasError` of that candidate). A bound method is held through
            a weak reference: when its object is collected, queued requests fail and the thread ends.
        name: the thread's name.
    """

    def __init__(self, predict_batch: Callable[[list[Any]], list[Any]], name: str = "dippm-cost-model") -> None:
        self._predict_batch: Callable[[], Any] = (weakref.WeakMethod(predict_batch)  # type: ignore[arg-type]
                                                  if hasattr(predict_batch, "__self__") else lambda: predict_batch)
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[tuple[Any, Future]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        #: sizes of the batches predicted so far
        self.batch_sizes: list[int] = []

    def submit(self, request: Any) -> Future:
        """Queue one request; the future gets its result."""
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise DippmNasError("the cost model's background predictor is closed (HardwareCostModel.close())")
            self._queue.append((request, fut))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                batch, self._queue = self._queue, []
            self.batch_sizes.append(len(batch))
            predict_batch = self._predict_batch()
            try:
                if predict_batch is None:
                    raise DippmNasError("the cost model of this prediction was collected before it ran")
                results = predict_batch([r for r, _ in batch])
            except BaseException as e:  # noqa: BLE001 - every waiting trial gets the error, none hangs
                results = [e] * len(batch)
            finally:
                del predict_batch  # no reference to the cost model while idle
            for (_, fut), res in zip(batch, results):
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)

    def close(self, wait: bool = True) -> None:
        """Finish the queued requests, then stop the thread (``wait``: and wait for it); idempotent."""
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()


class ConversionPool:
    """Conversion processes and the finisher thread of :meth:`HardwareCostModel.submit`, started on first use.

    Args:
        workers: conversion processes.
        cache_url: the conversion cache's URL for the workers (``None``: the workers' default).
    """

    def __init__(self, workers: int, cache_url: str | None) -> None:
        self.workers, self.cache_url = workers, cache_url
        self._pool: Any = None
        self._finisher: Any = None
        self._lock = threading.Lock()

    def _executors(self) -> tuple[Any, Any]:
        with self._lock:
            if self._pool is None:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

                self._pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=mp.get_context("spawn"),
                    initializer=_init_conversion_worker, initargs=(self.cache_url,))
                if self._finisher is None:
                    self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dippm-cost-model")
            return self._pool, self._finisher

    def convert_then(self, payload: tuple[str, Any, Any], spec: InputSpec, use_cache: bool,
                     finish: Callable[..., Any], *args: Any) -> Future:
        """Convert in a worker process, then call ``finish(*args, conversion_future)`` in the finisher thread."""
        pool, finisher = self._executors()
        conversion = pool.submit(_convert_in_worker, payload, spec.to_dict(), use_cache)
        return finisher.submit(finish, *args, conversion)

    def forget_pool(self) -> None:
        """The processes died: the next conversion starts new ones."""
        with self._lock:
            self._pool = None

    def close(self, wait: bool = True) -> None:
        """Stop the processes and the thread (``wait``: and wait for them); idempotent."""
        with self._lock:
            pool, finisher = self._pool, self._finisher
            self._pool = self._finisher = None
        if finisher is not None:
            finisher.shutdown(wait=wait)
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)


class BackgroundWork:
    """The background thread and conversion processes of one cost model, each started on first use.

    Args:
        workers: conversion processes of :meth:`conversions`.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._predictor: BatchPredictor | None = None
        self._conversions: ConversionPool | None = None
        self._stopped = False

    def predictor(self, predict_batch: Callable[[list[Any]], list[Any]]) -> BatchPredictor:
        """The background thread, started with ``predict_batch`` (a bound method, held weakly) on first use."""
        with self._lock:
            if self._stopped:
                raise DippmNasError("the cost model is closed (HardwareCostModel.close()); make a new one")
            if self._predictor is None:
                self._predictor = BatchPredictor(predict_batch)
            return self._predictor

    def conversions(self, cache_url: str | None) -> ConversionPool:
        """The conversion processes (their conversion cache: ``cache_url``), made on first use."""
        with self._lock:
            if self._stopped:
                raise DippmNasError("the cost model is closed (HardwareCostModel.close()); make a new one")
            if self._conversions is None:
                self._conversions = ConversionPool(self.workers, cache_url)
            return self._conversions

    def forget_conversion_processes(self) -> None:
        """The conversion processes died: the next conversion starts new ones."""
        with self._lock:
            if self._conversions is not None:
                self._conversions.forget_pool()

    @property
    def batch_sizes(self) -> list[int]:
        """Sizes of the batches the background thread predicted so far."""
        return list(self._predictor.batch_sizes) if self._predictor is not None else []

    def close(self, wait: bool = True) -> None:
        """Finish what is queued and stop the thread and the processes; idempotent. A cost model closed once may
        start them again on its next use (``close()`` is not final); :meth:`stop_soon` is."""
        with self._lock:
            predictor, self._predictor = self._predictor, None
            pool, self._conversions = self._conversions, None
        if predictor is not None:
            predictor.close(wait)
        if pool is not None:
            pool.close(wait)

    def stop_soon(self) -> None:
        """The cost model was collected, or the interpreter exits: stop everything. The prediction thread finishes
        the batch it runs and is joined (unless this finalizer runs in it): a daemon thread left inside torch or TVM
        while the interpreter tears down aborts the process; the conversion processes are not waited for."""
        with self._lock:
            self._stopped = True
            predictor, self._predictor = self._predictor, None
            pool, self._conversions = self._conversions, None
        if predictor is not None:
            predictor.close(wait=True)
        if pool is not None:
            pool.close(wait=False)


def _init_conversion_worker(cache_url: str | None) -> None:
    """Background conversion process: one torch thread (the objective trains next door), the parent's cache."""
    import torch

    torch.set_num_threads(1)
    if cache_url is not None:
        set_default_cache(ConversionCache(cache_url))


def _convert_in_worker(payload: tuple[str, Any, Any], spec_dict: dict[str, Any],
                       use_cache: bool) -> tuple[str | None, str | None, str | None, float]:
    """Background conversion: ``(graph JSON, None, None, seconds)`` or ``(None, error type, message, seconds)``."""
    t0 = time.perf_counter()
    kind, obj, config = payload
    try:
        if kind == "space":  # assembled from cached blocks (a space that does not opt in is captured whole)
            graph = assemble(obj, config, InputSpec.from_dict(spec_dict), cache=use_cache)
        else:
            graph = capture(obj, InputSpec.from_dict(spec_dict), cache=use_cache)
        return graph.to_json(), None, None, time.perf_counter() - t0
    except DippmNasError as e:
        return None, type(e).__name__, str(e), time.perf_counter() - t0
