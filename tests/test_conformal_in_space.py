"""In-space conformal margins (dippm_nas/conformal.py in_space_margin, Budgets.in_space, Adaptation.conformal_scores):
an adapted prediction is bounded with the out-of-sample scores of its adaptation's own rows when there are enough for
the confidence, else with the checkpoint's calibration, labelled either way; bad scores are refused."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dippm_nas.budgets import Budgets
from dippm_nas.conformal import IN_SPACE_REGIME, fit_conformal, in_space_margin
from dippm_nas.errors import BudgetError, DippmNasError
from dippm_nas.prediction import Prediction
from dippm_nas.predictor import Adaptation, AdaptationKey

SHA = "a" * 64
KEY = AdaptationKey("rtx-3090", "eager")


def _pred(mean: float, std: float, *, adapted: Adaptation | None = None) -> Prediction:
    details = {"host_bound": 0.0}
    if adapted is not None:
        details.update(adaptation_version=float(adapted.version), adaptation_rows=float(adapted.rows))
    return Prediction(latency_ms=mean, energy_j=None, memory_mib=1.0, latency_source="calibrated",
                      energy_source="unavailable", memory_source="analytic", device="rtx-3090", batch_size=1,
                      dtype="float32", latency_ms_std=std, details=details, labels={"deployment_assumed": ""})


def _wide_calibration() -> Any:
    """A checkpoint calibration whose scores are wide (truth scattered 0.75 in log space, σ_log 0.3: scores ~ 2.5)."""
    rng = np.random.default_rng(0)

    def rows(n: int) -> list[tuple[Prediction, float]]:
        out = []
        for _ in range(n):
            m = float(rng.uniform(1, 100))
            out.append((_pred(m, 0.3 * m), m * math.exp(rng.normal(0, 0.75))))
        return out

    return fit_conformal(rows(300), rows(100), checkpoint_sha256=SHA)


def _adaptation(scores: list[float], rows: int = 20) -> Adaptation:
    return Adaptation(key=KEY, checkpoint_sha256=SHA, rows=rows, calibration=None,
                      conformal_scores={"latency_ms": scores})


def test_tight_in_space_scores_give_a_narrower_bound_than_the_checkpoint_calibration() -> None:
    cal = _wide_calibration()
    ad = _adaptation([float(v) for v in np.linspace(-0.8, 0.8, 20)])
    p = _pred(10.0, 3.0, adapted=ad)
    ckpt = Budgets(latency_ms=13.0, confidence=0.9, conformal=cal).check(p)["latency_ms"]
    ins = Budgets(latency_ms=13.0, confidence=0.9, conformal=cal, in_space=ad).check(p)["latency_ms"]
    assert ins.labels["conformal_regime_latency_ms"] == IN_SPACE_REGIME
    assert ins.labels["conformal_in_space_rows_latency_ms"] == "20"
    assert ckpt.labels["conformal_regime_latency_ms"] != IN_SPACE_REGIME
    assert ins.bound < ckpt.bound
    # the 19th smallest of 20 scores (ceil(21 * 0.9) = 19): the bound is mean * exp(q * σ/mean)
    q = sorted(ad.conformal_scores["latency_ms"])[18]
    assert ins.k_sigma == pytest.approx(q)
    assert ins.bound == pytest.approx(10.0 * math.exp(q * 0.3))
    assert ins.feasible and not ckpt.feasible
    # a predictor's active adaptation is read at each check (Budgets.for_predictor attaches the predictor)
    holder = type("P", (), {"adaptation": ad})()
    via = Budgets(latency_ms=12.0, confidence=0.9, conformal=cal, in_space=holder).check(p)["latency_ms"]
    assert via.bound == pytest.approx(ins.bound)


def test_too_few_in_space_scores_fall_back_to_the_checkpoint_calibration_labelled() -> None:
    cal = _wide_calibration()
    ad = _adaptation([0.0] * 8, rows=8)  # ceil(9 * 0.9) = 9 > 8
    p = _pred(10.0, 3.0, adapted=ad)
    chk = Budgets(latency_ms=12.0, confidence=0.9, conformal=cal, in_space=ad).check(p)["latency_ms"]
    plain = Budgets(latency_ms=13.0, confidence=0.9, conformal=cal).check(p)["latency_ms"]
    assert chk.labels["conformal_regime_latency_ms"] != IN_SPACE_REGIME
    assert "too few" in chk.labels["conformal_in_space_fallback_latency_ms"]
    assert chk.bound == pytest.approx(plain.bound)
    assert in_space_margin([0.0] * 8, 0.9) is None and in_space_margin([0.0] * 9, 0.9) is not None
    # at 0.8 the same 8 scores are enough (ceil(9 * 0.8) = 8)
    assert Budgets(latency_ms=12.0, confidence=0.8, conformal=cal, in_space=ad).check(p)["latency_ms"] \
        .labels["conformal_regime_latency_ms"] == IN_SPACE_REGIME
    # no checkpoint calibration either: the Gaussian quantile, both fallbacks said
    g = Budgets(latency_ms=12.0, confidence=0.9, in_space=ad).check(p)["latency_ms"]
    assert "conformal_in_space_fallback_latency_ms" in g.labels and "conformal_fallback_latency_ms" in g.labels


def test_an_unadapted_prediction_or_another_adaptation_keeps_the_checkpoint_calibration() -> None:
    cal = _wide_calibration()
    ad = _adaptation([0.1] * 30, rows=30)
    unadapted = Budgets(latency_ms=12.0, confidence=0.9, conformal=cal, in_space=ad).check(_pred(10.0, 3.0))
    assert unadapted["latency_ms"].labels["conformal_regime_latency_ms"] != IN_SPACE_REGIME
    assert "conformal_in_space_fallback_latency_ms" not in unadapted["latency_ms"].labels
    other = _pred(10.0, 3.0, adapted=dataclasses.replace(ad, rows=12))
    chk = Budgets(latency_ms=12.0, confidence=0.9, conformal=cal, in_space=ad).check(other)["latency_ms"]
    assert "not the one" in chk.labels["conformal_in_space_fallback_latency_ms"]


def test_a_minimum_reads_the_negated_scores() -> None:
    m = in_space_margin([float(v) for v in range(-10, 10)], 0.9, minimum=True)
    assert m is not None and m.k == pytest.approx(9.0)  # negatives -9..10: the 19th smallest is 9


@pytest.mark.parametrize("bad", [{"latency_ms": [1.0, math.nan]}, {"latency_ms": "abc"}, {"latency_ms": [True]},
                                 ["latency_ms"], {"latency_ms": [1.0, None]}])
def test_bad_in_space_scores_are_a_clear_error(bad: object) -> None:
    with pytest.raises(DippmNasError, match="conformal_scores"):
        Adaptation(key=KEY, checkpoint_sha256=SHA, rows=3, calibration=None, conformal_scores=bad)  # type: ignore[arg-type]


def test_a_bad_in_space_source_or_confidence_is_refused() -> None:
    with pytest.raises(BudgetError, match="in_space"):
        Budgets(latency_ms=1.0, confidence=0.9, in_space=object())
    with pytest.raises(BudgetError, match="between 0 and 1"):
        in_space_margin([0.0] * 20, 1.0)


def test_the_scores_travel_in_the_stored_form_and_an_old_version_reads_as_none() -> None:
    ad = _adaptation([0.5, -0.25, 1.0], rows=3)
    meta = ad.meta()
    assert meta["conformal_scores"] == {"latency_ms": [0.5, -0.25, 1.0]}
    back = Adaptation._decode(meta, ad.arrays_npz())
    assert back.conformal_scores == ad.conformal_scores
    old = {k: v for k, v in meta.items() if k != "conformal_scores"}
    assert Adaptation._decode(old, ad.arrays_npz()).conformal_scores == {}


def test_budgets_repr_leaves_the_attached_predictor_out() -> None:
    """The predictor ``for_predictor`` attaches may hold a storage URL (with its password): the budgets' repr,
    which errors and logs print, names the budgets only."""

    class _Holder:
        adaptation = None

        def __repr__(self) -> str:
            return "Holder(storage='postgresql://u:secret-pw@db/x')"

    b = Budgets(latency_ms=10.0, confidence=0.9, in_space=_Holder())
    assert "secret-pw" not in repr(b) and "latency_ms=10.0" in repr(b)
