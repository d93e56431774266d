"""benchmarks/accuracy/conformal_budgets.py's row selection (the fit itself needs measured rows and a checkpoint)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from dippm_nas.training import split_examples

_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"


def _load():
    sys.path.insert(0, str(_DIR))  # the script imports its sibling search_view
    spec = importlib.util.spec_from_file_location("conformal_budgets", _DIR / "conformal_budgets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


class _Graph:
    def __init__(self, key: str) -> None:
        self.key = key

    def structural_hash(self) -> str:
        return self.key


class _Example:
    def __init__(self, key: str) -> None:
        self.key = key


def test_outside_training_is_the_validation_and_test_sets_of_the_default_random_split() -> None:
    c = _load()
    keys = [f"arch{i}" for i in range(400)]
    for seed in (0, 3):
        tr, va, te = split_examples([_Example(k) for k in keys], mode="random", seed=seed)
        outside = {k for k in keys if c.outside_training(_Graph(k), seed)}
        assert outside == {e.key for e in va + te} and not outside & {e.key for e in tr}


def test_an_adapt_plan_predicts_every_row_once_never_after_adapting_on_it() -> None:
    c = _load()
    idx = np.random.default_rng(0).permutation(np.arange(100, 113))
    plan = c.adapt_plan(idx, 6, 3, np.random.default_rng(1))
    predicted = np.concatenate([p for _, p in plan])
    assert sorted(predicted.tolist()) == sorted(idx.tolist())
    for fit, pred in plan:
        assert len(fit) == 6 and not set(fit.tolist()) & set(pred.tolist()) and set(fit.tolist()) <= set(idx.tolist())
    one = c.adapt_plan(idx, 6, None, np.random.default_rng(1))  # the default: one split of the half
    assert len(one) == 1 and one[0][0].tolist() == idx[:6].tolist() and one[0][1].tolist() == idx[6:].tolist()
    assert c.adapt_plan(idx[:10], 6, None, np.random.default_rng(1)) == []  # too few rows for one split
    assert c.adapt_plan(idx[:1], 6, 3, np.random.default_rng(1)) == []  # nothing to adapt on
