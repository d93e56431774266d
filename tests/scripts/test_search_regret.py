"""benchmarks/search/search_regret.py's core on a tiny synthetic table (the benchmark itself needs
../shared/data and a checkpoint, and runs as a script)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from _scripts import load_script
from dippm_nas.validation import order_agreement

pytest.importorskip("optuna")


def _load():
    return load_script("search_regret")


def _table(b, n: int = 300, seed: int = 0):
    """A synthetic space: 28 choices of 2-3 values; latency grows with the codes, accuracy too (a real trade-off)."""
    rng = np.random.default_rng(seed)
    choices = [["1", "4", "6"] if j % 4 == 0 else ["3", "5"] if j % 4 == 1 else ["1", "2", "3"] if j % 4 == 2
               else ["False", "True"] for j in range(28)]
    codes = np.stack([rng.integers(0, len(c), size=n) for c in choices], axis=1)
    size = codes.sum(axis=1).astype(float)
    lat = 5.0 + size * (1.0 + 0.3 * rng.random(n))
    acc = 60.0 + 10.0 * np.sqrt(size / size.max()) + rng.normal(0, 0.3, n)
    macs = size * 1e8 * (1.0 + 0.5 * rng.random(n))  # FLOPs: correlated with latency, not the same order
    return b.Table(codes, choices, acc, lat, macs)


class _Biased:
    """A cost model that is 40 % slow on half the rows, fixed by reveal (as adapting to them would)."""

    def __init__(self, table) -> None:
        self.table, self.fixed = table, False

    def estimate(self, rows):
        f = np.where(rows % 2 == 0, 1.4, 1.0)
        return self.table.latency_ms[rows] * (1.0 if self.fixed else f), np.full(len(rows), 0.05)

    def reveal(self, rows, measured_ms) -> None:
        self.fixed = True

    def reset(self) -> None:
        self.fixed = False


def test_hypervolume_and_front_of_known_points() -> None:
    b = _load()
    acc, lat = np.array([3.0, 2.0, 1.0, 2.0]), np.array([1.0, 0.5, 2.0, 0.5])
    assert b.pareto_mask(acc, lat).tolist() == [True, True, False, True]
    # reference (0, 3): the staircase (0.5..1 at 2) + (1..3 at 3) = 1 + 6
    assert b.hypervolume(acc, lat, 0.0, 3.0) == pytest.approx(7.0)
    assert b.hypervolume(acc, lat, 5.0, 3.0) == 0.0


def test_snap_finds_the_nearest_row() -> None:
    b = _load()
    t = _table(b, n=50)
    assert t.snap(t.configs[17]) == 17
    codes = t.configs[17].copy()
    codes[0] = (codes[0] + 1) % 3
    assert np.sum(t.configs[t.snap(codes)] != codes) <= 1


def test_table_refuses_bad_latencies() -> None:
    b = _load()
    t = _table(b, n=10)
    with pytest.raises(ValueError, match="latency"):
        b.Table(t.configs, t.choices, t.accuracy_pct, np.where(np.arange(10) == 3, 0.0, t.latency_ms), t.macs)


def test_the_oracle_reaches_most_of_the_front_and_a_budget_is_kept() -> None:
    b = _load()
    t = _table(b)
    budget = float(np.quantile(t.latency_ms, 0.5))
    res = b.run_all(t, {"oracle": b.Measured(t), "random": b.Measured(t), "flops": b.Flops(t), "adapted": _Biased(t)},
                    [0], 40, [None, budget], every=20, validate_max=5)
    s = b.summarise([r for r in res if r.budget_ms is None])
    assert 0.5 < s["oracle"]["hv_share_mean"] <= 1.0 + 1e-9
    assert s["random"]["hv_share_mean"] <= 1.0 + 1e-9
    sb = b.summarise([r for r in res if r.budget_ms == budget])
    # the oracle and random search measure everything: every feasible answer meets the budget
    assert sb["oracle"]["feasible_precision_mean"] == 1.0 and sb["random"]["feasible_precision_mean"] == 1.0
    assert 0.0 <= sb["flops"]["feasible_precision_mean"] <= 1.0
    assert all(r.measured_rows <= 40 for r in res)
    adapted = [r for r in res if r.method == "adapted"]
    assert all(0 < r.measured_rows <= 5 * 2 for r in adapted)  # 2 rounds (20, 40) of at most 5
    assert all(math.isnan(r.feasible_precision) for r in res if r.budget_ms is None)
    # every round's rows were predicted before their reveal (0 or ln 1.4 each): an error was recorded
    assert all(0.0 <= r.prequential_log_err <= math.log(1.4) + 1e-9 for r in adapted)
    assert all(math.isnan(r.prequential_log_err) for r in res if r.method in ("oracle", "random"))
    diag = [r for r in res if r.method == "adapted" and r.budget_ms is not None][0]
    assert 0.0 <= diag.fit_rejected_share_mean_only <= diag.fit_rejected_share <= 1.0


def test_a_validation_round_reveals_the_believed_front() -> None:
    b = _load()
    t = _table(b, n=80)
    src = _Biased(t)
    st = b._State(rows=list(range(40)))
    b._validation_round(t, src, st, None, b.BudgetRule(), validate_max=100)
    assert st.validated and src.fixed
    front = b._returned(t, src, st, None, b.BudgetRule(), False)
    assert set(int(r) for r in front) <= set(range(40))
    assert all(st.validated[r] == t.latency_ms[r] for r in st.validated)


def test_an_unknown_method_is_refused() -> None:
    b = _load()
    t = _table(b, n=20)
    with pytest.raises(ValueError, match="method must be one of"):
        b.run_study(t, "gradient", b.Measured(t), 0, 5)


def test_a_saved_report_is_reprinted_with_the_share_of_the_oracle(tmp_path: Path, capsys) -> None:
    b = _load()
    studies = [b.StudyResult("oracle", 0, None, 0.9, math.nan, 10, 100, 1.0).__dict__,
               b.StudyResult("adapted", 0, None, 0.81, math.nan, 8, 20, 2.0).__dict__]
    report = {"checkpoint": "x.pt", "seeds": 1, "trials": 200, "every": 20, "validate_max": 10, "k_sigma": 1.0,
              "devices": {"a100": {"rows": 2, "reference": [40.0, 60.0], "studies": studies,
                                   "variants": {"free": {"budget_ms": None}}}}}
    path = tmp_path / "r.json"
    path.write_text(__import__("json").dumps(report))
    assert b.main(["--from-report", str(path)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("adapted")][0]
    assert line.split()[1:5] == ["0.810", "0.810", "nan", "0.900"]  # mean, min, sd (one seed: none), vs oracle


def test_a_round_measures_the_front_when_nothing_is_believed_feasible() -> None:
    b = _load()
    t = _table(b, n=80)
    src = _Biased(t)
    st = b._State(rows=list(range(40)))
    b._validation_round(t, src, st, float(t.latency_ms.min()) / 10, b.BudgetRule(), validate_max=3)
    assert 0 < len(st.validated) <= 3 and src.fixed


def test_tpe_split_memo_changes_no_study() -> None:
    """The memo of TPE's split is a speed-up only: with it and without, every trial's row and values are the same."""
    import optuna

    b = _load()
    t = _table(b)
    budget = float(np.quantile(t.latency_ms, 0.5))

    def rows(memo: bool) -> list[tuple]:
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.TPESampler(seed=3))
        with b.tpe_split_memo() if memo else __import__("contextlib").nullcontext():
            st = b._run_trials(t, "oracle", b.Measured(t), study, 40, budget, 20, 5, b.BudgetRule())
        return [(tr.params, tr.values) for tr in study.trials] + [tuple(st.rows)]

    assert rows(True) == rows(False)


class _Guess:
    """A source off by a factor per row (``factor``: a number, or an array over the table's rows); refits change
    nothing."""

    def __init__(self, table, factor, mode: str) -> None:
        self.table, self.factor, self.mode = table, factor, mode
        self.revealed = 0

    def estimate(self, rows):
        f = self.factor[rows] if isinstance(self.factor, np.ndarray) else self.factor
        return self.table.latency_ms[rows] * f, np.full(len(rows), 0.01)

    def reveal(self, rows, measured_ms) -> None:
        self.revealed += 1

    def reset(self) -> None:
        self.revealed = 0


def test_selected_answers_with_whichever_ordered_the_new_rows_better_without_a_budget() -> None:
    b = _load()
    t = _table(b, n=60)
    rows = np.argsort(t.latency_ms)[:10]
    # scrambles the order of the rows (each row's factor flips it past its neighbour) but is nearer in |ln error|
    scramble = np.ones(len(t.latency_ms))
    scramble[rows] = np.where(np.arange(10) % 2 == 0, 1.2, 0.8)
    assert np.mean(np.abs(np.log(scramble[rows]))) < abs(math.log(1.5))
    good, pairs = order_agreement(t.latency_ms[rows] * scramble[rows], t.latency_ms[rows])
    assert pairs == 45 and good < pairs
    for net_f, prior_f, path in ((1.5, scramble, "network"), (scramble, 1.5, "prior"), (1.3, 1.05, "prior")):
        sel = b.Selected(_Guess(t, net_f, "adapt"), _Guess(t, prior_f, "calibrate"))
        sel.use_budget(None, b.BudgetRule())
        sel.reset()
        assert sel.choice.path == "network"  # before any evidence: the predictor's default path
        sel.reveal(rows, t.latency_ms[rows])
        assert sel.choice.path == path  # order right beats a smaller |ln error|; a tie of order: the prior
        assert sel.network.revealed == sel.prior.revealed == 1  # both refitted
    with pytest.raises(ValueError, match="selected needs"):
        b.Selected(_Guess(t, 1.0, "calibrate"), _Guess(t, 1.0, "calibrate"))


def test_selected_answers_with_whichever_classed_the_new_rows_better_under_a_budget() -> None:
    b = _load()
    t = _table(b, n=60)
    rows = np.arange(20)
    budget = float(np.median(t.latency_ms[rows]))
    # 1.0: every row classed right; 1.6: the rows that fit within 1/1.6 of the budget are rejected
    for net_f, prior_f, path in ((1.0, 1.6, "network"), (1.6, 1.0, "prior"), (1.0, 1.0, "prior")):
        sel = b.Selected(_Guess(t, net_f, "adapt"), _Guess(t, prior_f, "calibrate"))
        sel.use_budget(budget, b.BudgetRule(k_sigma=0.0))
        sel.reset()
        sel.reveal(rows, t.latency_ms[rows])
        assert sel.choice.path == path and sel.choice.yardstick == "feasibility"
        assert sel.choice.score["network" if path == "network" else "prior"][1] == len(rows)


def test_seed_chunks_merge_into_one_report_and_refuse_twice(tmp_path: Path, capsys) -> None:
    b = _load()
    cfg = {"checkpoint": "x.pt", "trials": 40, "every": 20, "validate_max": 5, "k_sigma": 1.0, "budget_quantile": 0.5}

    def rec(seed: int, hv: float) -> dict:
        st = [b.StudyResult(m, seed, bud, hv * (1 if m == "oracle" else 0.9), math.nan if bud is None else 1.0, 5, 9,
                            1.0).__dict__ for m in ("oracle", "adapted") for bud in (None, 30.0)]
        return {"config": cfg, "device": "a100", "seed": seed, "rows": 50, "reference": [40.0, 60.0],
                "budgets_ms": [None, 30.0], "studies": st}

    import json

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "a100_seed0.json").write_text(json.dumps(rec(0, 0.8)))
    (tmp_path / "b.json").write_text(json.dumps(rec(1, 1.0)))
    out = tmp_path / "merged.json"
    assert b.main(["--merge", str(tmp_path / "a"), str(tmp_path / "b.json"), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["seeds"] == [0, 1] and report["trials"] == 40
    summ = report["devices"]["a100"]["variants"]["budget"]["summary"]
    assert summ["oracle"]["studies"] == 2 and summ["oracle"]["hv_share_mean"] == pytest.approx(0.9)
    assert summ["adapted"]["hv_vs_oracle"] == pytest.approx(0.9)
    assert b.main(["--from-report", str(out)]) == 0
    with pytest.raises(SystemExit, match="appears in two files"):
        b.merge_records([rec(0, 0.8), rec(0, 0.8)])
    other = rec(2, 0.8)
    other["config"] = {**cfg, "trials": 200}
    with pytest.raises(SystemExit, match="different settings"):
        b.merge_records([rec(0, 0.8), other])


class _Predictor:
    """A stand-in for the cost model over a table: predicts the truth with σ 30 % of the mean; its predictions carry
    ``adaptation_version`` after ``adapt`` (as the cost model's do), so a conformal check reads the adapted regime."""

    def __init__(self, table) -> None:
        self.table, self.adapted, self.calibration = table, False, None

    def predict_graphs(self, graphs, mig=False):
        from dippm_nas.prediction import Prediction

        details = {"host_bound": 0.0, **({"adaptation_version": 1.0} if self.adapted else {})}
        return [Prediction(latency_ms=float(self.table.latency_ms[g]), energy_j=None, memory_mib=0.0,
                           latency_source="predicted", energy_source="unavailable", memory_source="analytic",
                           device="rtx-3090", batch_size=1, dtype="float32",
                           latency_ms_std=0.3 * float(self.table.latency_ms[g]), details=details,
                           labels={"deployment_assumed": "host"}) for g in graphs]

    def adapt(self, pairs, persist=False) -> None:
        self.adapted = True

    def reset_adaptation(self) -> None:
        self.adapted = False

    def clear_prediction_cache(self) -> None:
        return None


def _conformal(adapted_k: float, other_k: float):
    """A calibration whose adapted GPU-bound regime bounds at ``adapted_k`` σ_log, every other at ``other_k``."""
    from dippm_nas.conformal import ConformalCalibration

    scores = {"*|*|*": [other_k] * 40, "gpu-bound|undescribed|adapted": [adapted_k] * 40}
    return ConformalCalibration("0" * 64, {"latency_ms": scores}, {"latency_ms": {"held_out_rows": 1}})


def test_a_confidence_checks_the_budget_as_budgets_does_with_the_conformal_margin_of_the_regime() -> None:
    """``--confidence``: the bound is ``Budgets(latency_ms=..., confidence=c)``'s; adapted predictions (after a round)
    read the adapted regime's margin. Here that margin is 0 (the mean): no fitting candidate is rejected once
    adapted, where mean + 1σ rejects those within 30 % under the budget."""
    from dippm_nas.budgets import Budgets

    b = _load()
    t = _table(b, n=120)
    cal = _conformal(adapted_k=0.0, other_k=3.0)
    src = b.PredictorSource(_Predictor(t), list(range(len(t.latency_ms))), np.arange(len(t.latency_ms)), "adapt",
                            conformal=cal)
    budget = float(np.quantile(t.latency_ms, 0.5))
    rows = np.arange(20)
    before = src.checks(rows, budget, 0.9)
    want = Budgets(latency_ms=budget, confidence=0.9, conformal=cal).check(src.predictions(rows)[0])["latency_ms"]
    assert before[0].bound == pytest.approx(want.bound) and before[0].k_sigma == pytest.approx(3.0)
    assert before[0].bound == pytest.approx(t.latency_ms[0] * math.exp(3.0 * 0.3))
    src.reveal(rows, t.latency_ms[rows])
    after = src.checks(rows, budget, 0.9)
    assert all(c.k_sigma == 0.0 and c.bound == pytest.approx(t.latency_ms[r]) for c, r in zip(after, rows))
    assert after[0].labels["conformal_regime_latency_ms"] == "gpu-bound|undescribed|adapted"

    conf = b.run_study(t, "adapted", src, 0, 40, budget=budget, every=20, validate_max=5, confidence=0.9)
    ksig = b.run_study(t, "adapted", src, 0, 40, budget=budget, every=20, validate_max=5, k_sigma=1.0)
    assert conf.fit_rejected_share == 0.0 < ksig.fit_rejected_share  # mean + 0.3 mean rejects the near-budget ones
    assert conf.margin_k_mean == 0.0 and conf.adapted_regime_share == 1.0 and conf.over_admitted_share == 0.0
    assert math.isnan(ksig.margin_k_mean)
    assert conf.feasible_precision == 1.0  # the stand-in predicts the truth: nothing over budget is admitted
    # a source without a calibration (the prior) falls back to the Gaussian quantile, as Budgets does
    bare = b.PredictorSource(_Predictor(t), list(range(len(t.latency_ms))), np.arange(len(t.latency_ms)), "fixed")
    g = bare.checks(rows[:1], budget, 0.9)[0]
    assert g.k_sigma == pytest.approx(1.2815515655) and "conformal_fallback_latency_ms" in g.labels
    with pytest.raises(ValueError, match="confidence"):
        b.run_study(t, "adapted", src, 0, 5, budget=budget, confidence=1.0)


def test_the_confidence_option_is_refused_outside_zero_one_and_recorded_in_the_report(tmp_path: Path) -> None:
    b = _load()
    for bad in ("0", "1", "1.5", "nan"):
        with pytest.raises(SystemExit):
            b.main(["--data", str(tmp_path), "--graphs", str(tmp_path / "g.jsonl"), "--checkpoint",
                    str(tmp_path / "c.pt"), "--confidence", bad])
    with pytest.raises(SystemExit, match="conformal calibration"):
        b.load_conformal(tmp_path / "missing.pt")


def test_a_free_chunk_merges_with_budget_chunks_of_any_margin_and_budget_chunks_must_agree() -> None:
    """The budget check's settings (k_sigma, confidence, the calibration) do not touch studies without a budget: a
    chunk of those merges whatever they were; chunks with a budget must agree on them."""
    b = _load()
    base = {"checkpoint": "x.pt", "trials": 40, "every": 20, "validate_max": 5, "budget_quantile": 0.5}

    def rec(seed: int, budgets: list, **margin) -> dict:
        st = [b.StudyResult(m, seed, bud, 0.8, math.nan if bud is None else 1.0, 5, 9, 1.0).__dict__
              for m in ("oracle", "adapted") for bud in budgets]
        return {"config": {**base, **margin}, "device": "a100", "seed": seed, "rows": 50,
                "reference": [40.0, 60.0], "budgets_ms": budgets, "studies": st}

    free = rec(0, [None], k_sigma=1.0)  # a chunk written before the confidence setting existed
    conf = rec(0, [30.0], k_sigma=1.0, confidence=0.9, conformal="x.conformal.json")
    report = b.merge_records([free, conf])
    assert report["confidence"] == 0.9 and report["conformal"] == "x.conformal.json"
    assert set(report["devices"]["a100"]["variants"]) == {"free", "budget"}
    with pytest.raises(SystemExit, match="different settings"):
        b.merge_records([conf, rec(1, [30.0], k_sigma=1.0, confidence=0.5, conformal="x.conformal.json")])
    with pytest.raises(SystemExit, match="different settings"):
        b.merge_records([conf, rec(1, [30.0], k_sigma=1.0)])


def test_paired_differences_are_per_seed_over_the_seeds_both_ran() -> None:
    b = _load()
    rs = [b.StudyResult("adapted", s, None, hv, math.nan, 5, 9, 1.0) for s, hv in ((0, 0.9), (1, 0.8), (2, 0.7))]
    rs += [b.StudyResult("flops", s, None, hv, math.nan, 5, 9, 1.0) for s, hv in ((0, 0.85), (1, 0.85))]
    p = b.paired(rs, "adapted", "flops")
    assert p["n"] == 2 and p["wins"] == 1 and p["mean"] == pytest.approx(0.0)
    assert p["sd"] == pytest.approx(np.std([0.05, -0.05], ddof=1))
    assert b.paired(rs, "adapted", "prior") is None


class _Wide:
    """Right on the mean, with a σ of half the latency: mean + 1σ rejects every row within 1.5x of the budget."""

    def __init__(self, table) -> None:
        self.table = table

    def estimate(self, rows):
        return self.table.latency_ms[rows], 0.5 * self.table.latency_ms[rows]

    def reveal(self, rows, measured_ms) -> None:
        return None

    def reset(self) -> None:
        return None


def test_a_round_with_a_budget_also_validates_uncertain_rows_within_its_row_count() -> None:
    b = _load()
    t = _table(b, n=120)
    budget = float(np.median(t.latency_ms))
    rule = b.BudgetRule(k_sigma=1.0)
    lat = t.latency_ms
    rows = list(range(len(lat)))
    # believing nothing feasible (every bound over), a round takes the front of all rows
    assert b._returned(t, _Wide(t), b._State(rows=rows), budget, rule, False).size == 0
    front = {int(r) for r in b._returned(t, _Wide(t), b._State(rows=rows), None, rule, False)}
    uncertain = {r for r in rows if 1.5 * lat[r] > budget and abs(lat[r] - budget) < 0.5 * lat[r]}
    for quota in (0, 5):
        st = b._State(rows=rows)
        b._validation_round(t, _Wide(t), st, budget, rule, 10, quota)
        assert len(st.validated) == 10  # the round's 10 rows, never more
        extra = set(st.validated) - front
        if quota == 0:
            assert not extra  # the front only
        else:
            assert len(extra) >= 5 and extra <= uncertain  # at least 5 uncertain rows off the front
