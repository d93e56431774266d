"""``gc_paused()``: the cyclic garbage collector paused for one bounded batch of work.

A batch of many graphs allocates hundreds of thousands of small containers (node tables, per-graph lists, numpy
arrays); each allocation burst starts a generational collection that walks every object the process tracks, and
a search process tracks millions (graphs, cached predictions). Measured on 300 new MBConv graphs of ~205 nodes
(`benchmarks/speed/bench_predict_space.py`, the A100 checkpoint, 2-core AMD EPYC): `predict_graphs` spent about a
quarter of its CPU time in those collections. Reference counting still frees what the batch drops; only cycles
wait, and they are collected at the next collection after the batch.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["gc_paused"]

_LOCK = threading.Lock()
_DEPTH = 0
_WAS_ENABLED = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector inside the block (nested and concurrent uses share one pause; the collector
    is enabled again when the last one leaves, if it was enabled when the first one came in)."""
    global _DEPTH, _WAS_ENABLED
    with _LOCK:
        if _DEPTH == 0:
            _WAS_ENABLED = gc.isenabled()
            gc.disable()
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _WAS_ENABLED:
                gc.enable()
