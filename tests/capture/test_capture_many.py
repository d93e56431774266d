"""capture_many: batched conversion in a process pool, per-item errors as results, shared cache."""

from __future__ import annotations

import functools
from pathlib import Path

from _models import DataDependent, TinyResNet, TinyVGG

from dippm_nas import InputSpec, capture_many
from dippm_nas.cache import ConversionCache

SPEC = InputSpec(shape=(3, 16, 16), batch_size=2)


def test_serial_batch_keeps_order_and_reports_errors(tmp_path: Path) -> None:
    cache = ConversionCache(f"sqlite:///{tmp_path / 'c.sqlite'}")
    items = [(TinyVGG(), SPEC), (DataDependent(), InputSpec(shape=(4,), batch_size=2)), (TinyResNet(), SPEC),
             ("no_such_module_abc:f", SPEC)]
    res = capture_many(items, workers=1, cache=cache, progress=False)
    assert [r.index for r in res] == [0, 1, 2, 3]
    assert [r.ok for r in res] == [True, False, True, False]
    assert res[1].error_type == "GraphCaptureError" and "data-dependent" in res[1].error
    assert res[3].error_type == "ModelSpecError"
    again = capture_many(items[:1], workers=1, cache=cache, progress=False)
    assert again[0].cache_hit and again[0].graph.to_dict() == res[0].graph.to_dict()
    cache.close()


def test_process_pool_with_builders_and_a_failing_item(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    cache = ConversionCache(url)
    items = [
        (functools.partial(TinyResNet, width=8), SPEC),  # built inside the worker
        (TinyVGG(), InputSpec(shape=(5, 16, 16), batch_size=2)),  # shape does not fit
        (TinyVGG(), SPEC),
    ]
    res = capture_many(items, workers=2, cache=cache, progress=False)
    assert [r.ok for r in res] == [True, False, True]
    assert res[1].error_type == "InputShapeError"
    # the workers wrote into the shared cache: a second pass hits it from this process
    hits = capture_many([items[0], items[2]], workers=1, cache=cache, progress=False)
    assert all(r.cache_hit for r in hits)
    assert hits[0].graph.structural_hash() == res[0].graph.structural_hash()
    cache.close()
