"""Per-operator CPU times measured *in place*: ``torch.profiler`` over real forward passes.

What the host prior's operator table (:mod:`dippm_nas.prior._op_table`) is learnt from. Each top-level
``aten::`` call of the forward becomes one entry ``[name, input_shapes, concrete_inputs, µs per forward,
calls per forward]``, aggregated over ``passes`` recorded forwards after ``warmup`` untimed ones; calls
with the same name, shapes and scalar arguments are summed. The times include the profiler's own
per-call cost (a few µs), which the table's fitted map absorbs.

:class:`OpProfileWriter` appends one JSON line per model to a ``.jsonl`` / ``.jsonl.xz`` file in the
layout ``fit_op_table`` and ``scripts/fit/calibrate_host_prior.py --op-profiles`` read: ``family`` (the
search space), ``latency_ms`` (the model's labelled latency), ``ops``, plus where the line came from.
"""

from __future__ import annotations

import contextlib
import json
import lzma
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from dippm_nas._files import check_output
from dippm_nas._numbers import as_int
from dippm_nas.errors import MeasurementError
from dippm_nas.spec import InputSpec

__all__ = ["profile_ops", "OpProfileWriter", "OP_PROFILE_PASSES"]

#: recorded forwards per profile (and untimed ones before them)
OP_PROFILE_PASSES = 3


def _scalar(c: Any) -> Any:
    return c if c is None or isinstance(c, (bool, int, float, str, list)) else str(c)


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 points at /dev/null inside (native code's prints; Python's stderr is flushed first)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_ops(model: Any, spec: InputSpec, *, passes: int = OP_PROFILE_PASSES, warmup: int = OP_PROFILE_PASSES,
                threads: int | None = None) -> list[list[Any]]:
    """The model's top-level ``aten::`` calls on the CPU, with their inclusive CPU time per forward.

    Args:
        model: a ``torch.nn.Module`` whose weights are on the CPU (it is not moved).
        spec: the input spec (its example inputs are fed).
        passes: recorded forwards (times are their mean); ``warmup``: untimed forwards before them.
        threads: torch intra-op threads while profiling (restored afterwards); ``None``: as set.

    Returns:
        ``[[name, input_shapes, concrete_inputs, us_per_forward, calls_per_forward], ...]`` in first-call
        order.

    Raises:
        MeasurementError: ``model`` is not a ``torch.nn.Module``, ``passes`` < 1, ``warmup`` < 0 or ``threads``
            < 1.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not isinstance(model, torch.nn.Module):
        raise MeasurementError(f"profile_ops() profiles a torch.nn.Module, got {type(model).__name__}")
    passes = as_int(passes, "passes", low=1, error=MeasurementError)
    warmup = as_int(warmup, "warmup", low=0, error=MeasurementError)
    threads = None if threads is None else as_int(threads, "threads", low=1, error=MeasurementError, or_none=True)
    args, kwargs = spec.example_inputs()
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                model(*args, **kwargs)
            with _native_stderr_silenced():  # the profiler's start/stop notices, two lines per model
                prof.__enter__()
            try:
                for _ in range(passes):
                    model(*args, **kwargs)
            finally:
                with _native_stderr_silenced():
                    prof.__exit__(None, None, None)
    finally:
        torch.set_num_threads(old)
    agg: dict[str, list[float]] = {}
    for e in prof.events():
        if e.cpu_parent is not None:
            continue
        ci = [_scalar(c) for c in (getattr(e, "concrete_inputs", None) or [])]
        a = agg.setdefault(json.dumps([e.name, e.input_shapes, ci]), [0.0, 0.0])
        a[0] += e.cpu_time_total / passes
        a[1] += 1.0 / passes
    return [json.loads(k) + v for k, v in agg.items()]


class OpProfileWriter:
    """Appends profile lines to ``path``, each flushed as it is written. With ``.xz`` each line is its own
    xz stream (readers of concatenated streams, such as :func:`dippm_nas.dataset.open_text`, read the
    file as one), so a build killed between lines leaves a readable file that a resumed build extends.
    Thread-safe. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | Path) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise MeasurementError(f"op profile file: expected a path, got {type(path).__name__} {path!r:.80}")
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MeasurementError(f"op profile file {str(path)!r}: its folder cannot be created ({e})") from e
        check_output(self.path, "op profile file", error=MeasurementError)  # a FIFO, a device, a directory
        self._xz = self.path.suffix == ".xz"
        try:
            self._fh: IO[bytes] = open(self.path, "ab")
        except OSError as e:
            raise MeasurementError(f"op profile file {str(path)!r} cannot be opened for appending ({e})") from e
        self._lock = threading.Lock()
        self.lines = 0

    def write(self, *, family: str, latency_ms: float, ops: list[list[Any]], **where: Any) -> None:
        """One model's line: its family (search space), labelled latency, ``ops`` (:func:`profile_ops`) and
        any JSON-able fields saying where it came from (``graph_hash``, ``config``, ``batch_size``...)."""
        line = (json.dumps({**where, "family": family, "latency_ms": float(latency_ms), "ops": ops}) + "\n").encode()
        blob = lzma.compress(line) if self._xz else line
        with self._lock:
            self._fh.write(blob)
            self._fh.flush()
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> "OpProfileWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

