"""Chance constraints: a budget holds for ``mean + k_sigma * std``, one :class:`Budgets` type for Optuna and NNI."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from dippm_nas.budgets import DEFAULT_K_SIGMA, Budgets
from dippm_nas.errors import BudgetError, DippmNasError
from dippm_nas.prediction import Prediction

DEVICE = "a100-sxm4-40gb"


def pred(latency_ms: float = 12.3, latency_ms_std: float | None = 8.0, energy_j: float = 2.0,
         energy_j_std: float | None = None, memory_mib: float = 1000.0, memory_mib_std: float | None = 100.0,
         device: str = DEVICE) -> Prediction:
    return Prediction(latency_ms=latency_ms, energy_j=energy_j, memory_mib=memory_mib, latency_source="predicted",
                      energy_source="analytic", memory_source="analytic", device=device, batch_size=64,
                      dtype="float16", latency_ms_std=latency_ms_std, energy_j_std=energy_j_std,
                      memory_mib_std=memory_mib_std)


@pytest.mark.parametrize("figure,kw", [
    ("latency_ms", dict(latency_ms=12.3, latency_ms_std=8.0)),      # the resnet50 bs64: 12.3 +- 8.0 ms
    ("energy_j", dict(energy_j=2.0, energy_j_std=0.5)),
    ("memory_mib", dict(memory_mib=1000.0, memory_mib_std=100.0)),
])
def test_mean_fits_but_mean_plus_2_sigma_does_not(figure: str, kw: dict[str, float]) -> None:
    p = pred(**kw)
    mean, std = kw[figure], kw[figure + "_std"]
    budget = mean + 1.5 * std            # the mean fits, mean + 2 sigma does not
    at2 = Budgets(**{figure: budget}, k_sigma=2)
    at0 = Budgets(**{figure: budget}, k_sigma=0)
    assert not at2.feasible(p) and at0.feasible(p)
    (c2,) = at2.check(p).values()
    assert c2.value == pytest.approx(mean + 2 * std - budget) and c2.margin == pytest.approx(-c2.value)
    assert c2.mean == mean and c2.std == std and c2.k_sigma == 2 and not c2.std_missing
    v0 = at0.constraint_values(p)[figure]
    assert v0 == pytest.approx(mean - budget) and v0 < 0


def test_default_k_sigma_is_one_and_overridable_per_budget() -> None:
    assert DEFAULT_K_SIGMA == 1.0 and Budgets().k_sigma == 1.0
    p = pred()
    b = Budgets(latency_ms=21.0, memory_mib=1150.0, k_sigmas={"memory_mib": 2.0})
    checks = b.check(p)
    assert checks["latency_ms"].k_sigma == 1.0 and checks["latency_ms"].feasible        # 12.3 + 8 <= 21
    assert checks["memory_mib"].k_sigma == 2.0 and not checks["memory_mib"].feasible    # 1000 + 200 > 1150
    assert list(checks) == ["latency_ms", "memory_mib"] == list(b.names)


def test_missing_sigma_counts_as_zero_and_is_flagged(caplog: pytest.LogCaptureFixture) -> None:
    import dippm_nas.budgets

    dippm_nas.budgets._warn_once.reset()  # said once per process: another test may have said it already
    p = pred(energy_j=2.0, energy_j_std=None)
    with caplog.at_level(logging.WARNING, logger="dippm_nas.budgets"):
        (c,) = Budgets(energy_j=2.0, k_sigma=3).check(p).values()
    assert c.std is None and c.std_missing and c.bound == 2.0 and c.feasible
    assert "no standard deviation" in caplog.text


def test_memory_budget_takes_the_smaller_of_memory_mib_and_the_mig_profile() -> None:
    from dippm_nas.devices import resolve_device

    usable = next(p for p in resolve_device(DEVICE).mig_profiles if p.name == "1g.5gb").usable_memory_mib
    (c,) = Budgets(memory_mib=100_000, mig_profile="1g.5gb").check(pred()).values()
    assert c.budget == usable and c.limit_source == "mig:1g.5gb"
    (c,) = Budgets(memory_mib=500, mig_profile="1g.5gb").check(pred()).values()
    assert c.budget == 500 and c.limit_source == "memory_mib"


@pytest.mark.parametrize("kw,match", [
    (dict(k_sigma=-1.0), r"k_sigma must be a finite number >= 0.*-1\.0"),
    (dict(k_sigma=math.nan), r"k_sigma must be.*nan"),
    (dict(k_sigma=math.inf), r"k_sigma must be.*inf"),
    (dict(k_sigmas={"latency_ms": -2.0}), r"k_sigmas\['latency_ms'\] must be.*-2\.0"),
    (dict(k_sigmas={"latency": 1.0}), r"unknown budget keys \['latency'\]"),
])
def test_bad_k_sigma_and_unknown_keys_are_budget_errors(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(BudgetError, match=match) as e:
        Budgets(**kw)
    assert isinstance(e.value, DippmNasError) and isinstance(e.value, ValueError)


def test_unknown_budget_key_in_a_mapping_names_it() -> None:
    with pytest.raises(BudgetError, match=r"unknown budget keys \['max_latency'\].*latency_ms") as e:
        Budgets.from_mapping({"max_latency": 5})
    assert isinstance(e.value, ValueError)


# ------------------------------------------------------------------------------- the integrations
def test_optuna_records_mean_sigma_and_margin_with_optunas_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    optuna = pytest.importorskip("optuna")
    import dippm_nas.optuna as dop
    import dippm_nas.optuna._scheduling as cm
    from dippm_nas.spec import InputSpec

    p = pred()
    monkeypatch.setattr(cm, "predict", lambda *a, **k: p)
    spec = InputSpec(shape=(3, 224, 224), batch_size=64, dtype="float16")
    budget = 12.3 + 1.5 * 8.0
    for k, feasible in ((2.0, False), (0.0, True)):
        cost = dop.HardwareCostModel(DEVICE, budgets=Budgets(latency_ms=budget), k_sigma=k, objectives=())
        trial = optuna.create_study().ask()
        cost.evaluate(trial, "torchvision:resnet50", spec)  # predict is patched: nothing is captured
        a = trial.user_attrs
        assert a["predicted_latency_ms"] == 12.3 and a["predicted_latency_ms_std"] == 8.0
        assert a["constraint_latency_ms"] == pytest.approx(12.3 + k * 8.0 - budget)   # <= 0 feasible, in ms
        assert a["margin_latency_ms"] == pytest.approx(-a["constraint_latency_ms"])
        assert a["k_sigma_latency_ms"] == k and a["budget_latency_ms"] == budget
        assert a["std_missing_latency_ms"] is False and a["feasible"] is feasible


def test_nni_report_and_tuner_share_the_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    import dippm_nas.nni._report as rep

    p = pred()
    monkeypatch.setattr(rep, "predict", lambda *a, **k: p)
    budget = 12.3 + 1.5 * 8.0
    d2 = rep.final_metrics(0.9, "m", None, budgets=Budgets(latency_ms=budget, k_sigma=2))
    d0 = rep.final_metrics(0.9, "m", None, budgets={"latency_ms": budget, "k_sigma": 0})
    assert d2["feasible"] is False and d2["default"] == pytest.approx(0.9 * budget / (12.3 + 16.0))
    assert d0["feasible"] is True and d0["default"] == 0.9
    assert d2["margins"]["latency_ms"] == pytest.approx(budget - 12.3 - 16.0) and d2["latency_ms_std"] == 8.0


@pytest.mark.parametrize("k", [-0.5, math.nan, math.inf])
def test_every_k_sigma_entry_point_names_a_bad_value(k: float) -> None:
    from dippm_nas.mig import advise

    with pytest.raises(BudgetError, match=f"got {k!r}"):
        advise(pred(), DEVICE, k_sigma=k)
    optuna = pytest.importorskip("optuna")  # noqa: F841 - HardwareCostModel needs it
    from dippm_nas.optuna import HardwareCostModel

    with pytest.raises(BudgetError, match=f"got {k!r}"):
        HardwareCostModel(DEVICE, k_sigma=k)
