"""The graded σ floor: a floor that grows with novelty (fit, format, and what σ_log makes of it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dippm_nas.errors import InvalidValueError
from dippm_nas.predictor import NoveltyFloor, novelty_floor_log
from dippm_nas.training import fit_graded_floor, split_d0


def _rows(n: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Synthetic calibration rows whose error scale grows with novelty: |N(0, 0.02 + 0.3 novelty)|."""
    rng = np.random.default_rng(seed)
    nov = rng.uniform(0.0, 1.0, n)
    err = np.abs(rng.normal(0.0, 0.02 + 0.3 * nov))
    return nov, err, np.full(n, 0.01)


def _coverage(knots, nov, err, sig) -> float:
    f = np.interp(nov, [k[0] for k in knots], [k[1] for k in knots])
    return float(np.mean(err <= 2 * np.hypot(sig, f)))


def test_graded_floor_is_monotone_and_covers_each_novelty_range_on_fresh_rows() -> None:
    nov, err, sig = _rows()
    knots = fit_graded_floor(nov, err, sig, min_rows=400)
    xs, fs = np.array([k[0] for k in knots]), np.array([k[1] for k in knots])
    assert len(knots) >= 5 and np.all(np.diff(xs) > 0) and np.all(np.diff(fs) >= 0)
    assert fs[-1] > 5 * fs[0]  # it grows with the error scale
    # rows not used for the fit: 95 % within ±2σ overall and in each third of the novelty range
    nov2, err2, sig2 = _rows(seed=1)
    assert 0.93 <= _coverage(knots, nov2, err2, sig2) <= 0.97
    for lo, hi in ((0.0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.0)):
        m = (nov2 >= lo) & (nov2 < hi)
        assert 0.91 <= _coverage(knots, nov2[m], err2[m], sig2[m]) <= 0.98
    # one scalar floor for all rows over-covers the near rows and under-covers the far ones
    f_one = np.quantile(np.sqrt(np.clip((err / 2) ** 2 - sig ** 2, 0, None)), 0.95)
    near, far = nov2 < 0.2, nov2 > 0.8
    assert np.mean(err2[near] <= 2 * np.hypot(sig2[near], f_one)) > 0.99
    assert np.mean(err2[far] <= 2 * np.hypot(sig2[far], f_one)) < 0.9


def test_graded_floor_pools_bins_that_would_decrease() -> None:
    # errors that shrink with novelty: the non-decreasing fit pools them into one floor
    rng = np.random.default_rng(0)
    nov = np.linspace(0.0, 1.0, 600)
    err = np.abs(rng.normal(0.0, 0.3 - 0.2 * nov))
    knots = fit_graded_floor(nov, err, np.zeros_like(nov), min_rows=100)
    assert len(knots) == 1 and knots[0][1] == pytest.approx(
        np.quantile(err / 2, 0.95, method="inverted_cdf"), rel=1e-6)
    # nan novelty rows are left out; too few rows for two bins give one knot
    one = fit_graded_floor(np.array([0.1, np.nan, 0.3]), np.array([0.2, 5.0, 0.2]), np.zeros(3), min_rows=50)
    assert one == ((pytest.approx(0.2), pytest.approx(0.1)),)
    with pytest.raises(InvalidValueError, match="min_rows"):
        fit_graded_floor(nov, err, err, min_rows=0)
    with pytest.raises(InvalidValueError, match="finite"):
        fit_graded_floor(np.array([np.nan]), np.array([0.1]), np.array([0.1]))


def test_graded_floor_format_and_old_scalar_metadata() -> None:
    graded = NoveltyFloor(0.5, {"latency_ms": 0.1}, "synthetic", validated_max=0.9,
                          graded_floor_log={"latency_ms": ((0.1, 0.01), (0.4, 0.1), (0.8, 0.2))})
    d = graded.to_dict()
    assert d["graded_floor_log"] == {"latency_ms": [[0.1, 0.01], [0.4, 0.1], [0.8, 0.2]]}
    assert NoveltyFloor.from_dict(d) == graded
    # linear between knots, constant beyond the ends, novel or not; nan: no novelty floor
    for nov, want in ((0.0, 0.01), (0.1, 0.01), (0.25, 0.055), (0.6, 0.15), (3.0, 0.2), (math.nan, 0.0)):
        assert graded.floor_at("latency_ms", nov) == pytest.approx(want)
    assert graded.floor_at("energy_j", 0.6) == 0.0
    # metadata without graded floors (older checkpoints): floor_log above d0, nothing at or below it
    old = {"d0": 0.5, "floor_log": {"latency_ms": 0.1}, "calibrated_on": "x"}
    assert NoveltyFloor.from_dict(old).graded_floor_log == {} and "graded_floor_log" not in NoveltyFloor.from_dict(
        old).to_dict()
    assert novelty_floor_log(old, "latency_ms", 0.5) == 0.0 and novelty_floor_log(old, "latency_ms", 0.51) == 0.1
    assert novelty_floor_log(None, "latency_ms", 0.9) == 0.0
    for bad in (((0.4, 0.1), (0.1, 0.2)), ((0.1, 0.2), (0.4, 0.1)), ((0.1, math.inf),), (), ((0.1,),)):
        with pytest.raises(InvalidValueError, match="graded_floor_log"):
            NoveltyFloor(0.5, {}, "x", graded_floor_log={"latency_ms": bad})  # type: ignore[dict-item]


def test_d0_by_source_is_the_widest_source_quantile() -> None:
    a = np.linspace(0.0, 0.1, 101)  # a large source of look-alike graphs
    b = np.linspace(0.2, 1.0, 21)  # a small, varied one
    nov = np.concatenate([a, b])
    groups = ["a"] * a.size + ["b"] * b.size
    assert split_d0(nov, groups=groups) == pytest.approx(np.quantile(b, 0.95))
    assert split_d0(nov) == pytest.approx(np.quantile(nov, 0.95))
    assert split_d0(nov) < split_d0(nov, groups=groups)
    with pytest.raises(InvalidValueError, match="one group per"):
        split_d0(nov, groups=["a"])
