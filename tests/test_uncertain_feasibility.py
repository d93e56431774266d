"""Candidates whose feasibility is uncertain: ``budgets.band_distance``, ``ChanceCheck.uncertain``,
``TrialRecord.band_distance`` and the round's order and share (``validation.uncertain_order``, ``round_split``)."""

from __future__ import annotations

import math

import pytest

from dippm_nas.budgets import Budgets, band_distance
from dippm_nas.errors import BudgetError, ValidationError
from dippm_nas.prediction import Prediction
from dippm_nas.trial import TrialRecord
from dippm_nas.validation import default_uncertain_per_round, round_split, uncertain_order


def _prediction(mean: float, std: float) -> Prediction:
    return Prediction(latency_ms=mean, latency_ms_std=std, energy_j=None, memory_mib=10.0, memory_mib_std=None,
                      device="rtx-3090", batch_size=1, dtype="float32", latency_source="predicted", energy_source="unavailable",
                      memory_source="analytic")


def test_band_distance_is_the_gap_in_margins() -> None:
    assert band_distance(10, 12, 11) == pytest.approx(0.5)  # mean within, bound over
    assert band_distance(10, 12, 9) == pytest.approx(0.5)  # mean over by half the margin
    assert band_distance(10, 12, 13) == pytest.approx(1.5)  # within by more than the margin: feasible
    assert band_distance(10, 10, 10) == 0.0 and band_distance(10, 10, 11) == math.inf  # no margin: never unsure
    assert band_distance(10, math.inf, 3) == 0.0  # a bound that cannot bound: every budget unsure
    assert band_distance(20, 18, 19) == pytest.approx(0.5)  # a minimum (bound below the mean)
    for bad in ((math.nan, 1, 1), (1, math.nan, 1), (1, 2, math.inf), ("1", 2, 3), (1, None, 2)):
        with pytest.raises(BudgetError):
            band_distance(*bad)


def test_a_check_is_uncertain_only_when_it_rejects_within_the_band() -> None:
    b = Budgets(latency_ms=10.0, k_sigma=1.0)
    unsure = b.check(_prediction(9.0, 2.0))["latency_ms"]  # bound 11: rejected, mean within
    assert not unsure.feasible and unsure.uncertain and unsure.band_distance == pytest.approx(0.5)
    over = b.check(_prediction(11.0, 2.0))["latency_ms"]  # mean over by half a margin
    assert over.uncertain
    firm = b.check(_prediction(16.0, 2.0))["latency_ms"]  # over by 3 margins
    assert not firm.uncertain and firm.band_distance == pytest.approx(3.0)
    fits = b.check(_prediction(5.0, 2.0))["latency_ms"]
    assert fits.feasible and not fits.uncertain
    assert not Budgets(latency_ms=10.0, k_sigma=0.0).check(_prediction(11.0, 2.0))["latency_ms"].uncertain


def test_a_record_is_uncertain_when_every_rejected_budget_is_within_its_band() -> None:
    b = Budgets(latency_ms=10.0, memory_mib=9.0, k_sigma=1.0)
    p = Prediction(latency_ms=9.0, latency_ms_std=2.0, energy_j=None, memory_mib=10.0, memory_mib_std=0.5,
                   device="rtx-3090", batch_size=1, dtype="float32", latency_source="predicted", energy_source="unavailable",
                   memory_source="analytic")
    rec = TrialRecord.of(p, b.check(p), deployment={})
    # latency: 1 / 2 of its margin; memory: mean 10 over 9 by 2 margins of 0.5: firmly over
    assert rec.band_distance == pytest.approx(2.0)
    back = TrialRecord.from_attrs(rec.to_attrs())
    assert back.band_distance == pytest.approx(2.0)
    only_latency = TrialRecord.of(p, Budgets(latency_ms=10.0).check(p), deployment={})
    assert only_latency.band_distance == pytest.approx(0.5)
    assert TrialRecord.of(p, Budgets(latency_ms=50.0).check(p), deployment={}).band_distance is None  # feasible
    assert TrialRecord.of(p, {}, deployment={}).band_distance is None  # no budget


def test_uncertain_order_takes_the_undominated_nearest_the_budget_first() -> None:
    values = [[5, 9], [4, 9.5], [6, 11], [9, 20], [1, 1]]
    dist = [0.4, 0.2, 0.5, 3.0, math.inf]
    # 1 is dominated by 0 (less accurate, slower); 3 and 4 are not uncertain
    assert uncertain_order(values, ["maximize", "minimize"], dist) == [0, 2, 1]
    assert uncertain_order(values, ["MINIMIZE", "minimize"], dist) == [1, 0, 2]  # 1 dominates 0 when both minimised
    assert uncertain_order([], ["minimize"], []) == []
    for bad in (([[1, 2]], ["up", "minimize"], [0.1]), ([[1, 2]], "minimize", [0.1]),
                ([[1, 2]], ["minimize", "minimize"], [0.1, 0.2]), ([[1]], ["minimize", "minimize"], [0.1]),
                ([[1, 2]], ["minimize", "minimize"], [math.nan]), ([[1, 2]], ["minimize", "minimize"], [-1.0]),
                ([[math.nan, 2]], ["minimize", "minimize"], [0.1]), (None, ["minimize"], [0.1])):
        with pytest.raises(ValidationError):
            uncertain_order(*bad)


def test_round_split_never_measures_more_than_the_round() -> None:
    assert round_split(5, 5, 10, 5) == (5, 5)
    assert round_split(2, 9, 10, 5) == (2, 8)  # the front has fewer: the uncertain fill
    assert round_split(9, 1, 10, 5) == (9, 1)  # fewer uncertain: the front fills
    assert round_split(9, 9, 10, 0) == (9, 0)
    assert round_split(0, 0, 3, 1) == (0, 0)
    for f, u, m, q in ((5, 5, 10, 11), (-1, 0, 3, 1), (1, 1, 0, 0), (1, 1, 3, 1.5)):
        with pytest.raises(ValidationError):
            round_split(f, u, m, q)
    assert [default_uncertain_per_round(m) for m in (1, 2, 3, 10)] == [0, 0, 1, 3]
