"""benchmarks/accuracy/conformal_budgets.py's row selection (the fit itself needs measured rows and a checkpoint)."""

from __future__ import annotations


import numpy as np

from _scripts import load_script
from dippm_nas.training import split_examples


def _load():
    return load_script("conformal_budgets")


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


class _Spec:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype


class _DtypeGraph:
    def __init__(self, key: str, dtype: str) -> None:
        self.key, self.spec = key, _Spec(dtype)


class _Row:
    def __init__(self, i: int, dtype: str) -> None:
        self.graph = _DtypeGraph(f"g{i}", dtype)
        self.measurement = {"source": "ryujaehun", "latency_ms": 1.0 + i, "dtype": dtype}


class _OnePrecisionPredictor:
    """A stand-in for the GNN predictor: an adaptation applies to the dtype its rows ran in (``only``: to that dtype
    whatever the rows); a graph of another dtype keeps its unadapted prediction, flagged, as ``adapt()`` does."""

    def __init__(self, only: str | None = None) -> None:
        self.dtypes: set[str] = set()
        self.calls: list[set[str]] = []
        self.only = only
        self.calibration = None

    def graph_key(self, g: _DtypeGraph) -> str:
        return g.key

    def one_network_pass(self, graphs):
        import contextlib

        return contextlib.nullcontext()

    def reset_adaptation(self) -> None:
        self.dtypes = set()

    def clear_prediction_cache(self) -> None:
        pass

    def adapt(self, rows, persist: bool, deployment) -> None:
        self.dtypes = {self.only} if self.only else {g.spec.dtype for g, _ in rows}
        self.calls.append({g.spec.dtype for g, _ in rows})

    def predict_graphs(self, graphs, mig: bool, deployment=None):
        from dippm_nas.prediction import Prediction

        out = []
        for g in graphs:
            details = {}
            if self.dtypes:
                details = ({"adaptation_version": 1.0} if g.spec.dtype in self.dtypes
                           else {"adaptation_other_dtype": 1.0})
            out.append(Prediction(latency_ms=1.0, energy_j=None, memory_mib=1.0, latency_source="predicted",
                                  energy_source="unavailable", memory_source="analytic", device="titan-rtx",
                                  batch_size=1, dtype=g.spec.dtype, latency_ms_std=0.1, details=details))
        return out


def test_each_precision_is_adapted_on_its_own_rows_and_an_adapted_row_is_one_the_adaptation_applied_to() -> None:
    """An adaptation is of one precision: each half's rows of each dtype are adapted on rows of that dtype, so every
    precision gets adapted rows; a prediction the adaptation does not apply to (flagged ``adaptation_other_dtype``)
    keeps its described prediction and is not counted again as an adapted row."""
    c = _load()
    rows = [_Row(i, "float16" if i % 2 else "float32") for i in range(200)]
    p = _OnePrecisionPredictor()
    out = c.cell_rows(p, rows, 20, 0)
    assert len(out["described"]) == len(out["undescribed"]) == 200
    assert len(p.calls) == 4 and all(len(d) == 1 for d in p.calls)  # 2 halves x 2 dtypes, one dtype each
    assert {q.dtype for q, _, _ in out["adapted"]} == {"float16", "float32"}
    assert all("adaptation_version" in q.details for q, _, _ in out["adapted"])
    only16 = c.cell_rows(_OnePrecisionPredictor(only="float16"), rows, 20, 0)["adapted"]
    assert only16 and {q.dtype for q, _, _ in only16} == {"float16"}
