"""The path choice: after each validation round the adapted network and the calibrated analytic prior are scored on
the round's new measurements, each by its prediction made before the measurement, and the winner answers the device.

The network is a fake (its latency a fixed function of the MLP's width, which ``adapt`` replaces with the measured
truth, so a scoring that read predictions made after the reveal would always crown it); the prior is the host CPU's
analytic prior (latency growing with the width); measurements are faked (``measure_fn``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest

from dippm_nas import predict
from dippm_nas.errors import ValidationError
from dippm_nas.measure import Measurement
from dippm_nas.predictor import AnalyticPredictor, BasePredictor, get_predictor, set_predictor
from dippm_nas.spec import InputSpec
from dippm_nas.trial import TrialRecord
from dippm_nas.validation import (PATH_LABEL, JobQueue, ParetoValidator, PathChoice, PathPredictor,
                                  feasibility_agreement, order_agreement)
import search_spaces

optuna.logging.set_verbosity(optuna.logging.WARNING)

DEV = "host-cpu"
SPEC = InputSpec(shape=(4,), batch_size=2)
WIDTHS = [8, 64, 256, 1024, 2048, 4096]


class FakeNetwork(BasePredictor):
    """A 'network' predicting ``latency(width)``; once adapted it predicts the measured latency of every width it
    was told and keeps its guess for the others."""

    takes_resolved_deployment = False

    def __init__(self, latency: Callable[[int], float]) -> None:
        self.device, self.latency, self.told = DEV, latency, {}
        self.adaptation = None
        self.adapt_calls = 0

    def _width(self, graph: Any) -> int:
        return max(int(n.output_shapes[0][-1]) for n in graph.nodes if n.output_shapes and n.output_shapes[0])

    def predict_graphs(self, graphs: Sequence[Any], **kw: Any) -> list[Any]:
        out = []
        for g in graphs:
            p = AnalyticPredictor(DEV, load_calibration=False).predict_graphs([g], mig=False)[0]
            w = self._width(g)
            out.append(dataclasses.replace(p, latency_ms=self.told.get(w, self.latency(w)), latency_ms_std=None,
                                           latency_source="predicted"))
        return out

    def adapt(self, measurements: Sequence[Any], **kw: Any) -> None:
        self.adapt_calls += 1
        for g, fig in measurements:
            self.told[self._width(g)] = fig["latency_ms"]
        return None

    def use_adaptation(self, **kw: Any) -> None:
        return None

    def refresh_adaptation(self, **kw: Any) -> None:
        return None

    def reset_adaptation(self) -> None:
        return None

    def activate_adaptation(self, ad: Any) -> None:
        return None


def _ok(latency_ms: float) -> Measurement:
    return Measurement(latency_ms=latency_ms, latency_ms_std=0.01 * latency_ms, energy_j=None, memory_mib=1.5,
                       memory_source="rss_delta", n_repeats=5, device="cpu", environment={"fake": True},
                       energy_reason="no energy counter in this test", batch_size=2, dtype="float32")


def _measure(latency: Callable[[int], float]) -> Callable[..., Measurement]:
    return lambda model, spec, device, settings: _ok(latency(model.search_space_config["hidden"][0]))


def _study(widths: Sequence[int], budget: float | None = None) -> optuna.Study:
    """Trials of one MLP width each, all on the front (accuracy and latency rising together)."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, w in enumerate(widths):
        attrs = {"search_space": "mlp", "search_space_config": {"in_features": 4, "hidden": [w], "out_features": 2},
                 "input_spec": SPEC.to_dict(), "predicted_latency_ms": float(i + 1), "predicted_latency_ms_std": None,
                 "predicted_memory_mib": 1.0, "predicted_memory_mib_std": None, "predicted_energy_j": None}
        system = {}
        if budget is not None:
            attrs.update({"constraint_latency_ms": i + 1 - budget, "budget_latency_ms": budget,
                          "k_sigma_latency_ms": 0.0, "margin_latency_ms": budget - i - 1})
            system = {"constraints": [-1.0]}
        study.add_trial(optuna.trial.create_trial(values=[float(i), float(i)], user_attrs=attrs,
                                                  system_attrs=system))
    return study


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[int], float]], FakeNetwork]:
    def install(latency: Callable[[int], float]) -> FakeNetwork:
        net = FakeNetwork(latency)
        set_predictor(DEV, net)
        return net

    yield install
    set_predictor(DEV, None)


def _validator(measure: Callable[[int], float], **kw: Any) -> ParetoValidator:
    return ParetoValidator(DEV, max_per_round=3, measure_fn=_measure(measure), adapt=True, **kw)


def _predicted_path(width: int) -> tuple[str | None, float]:
    p = predict(search_spaces.build_model("mlp", {"in_features": 4, "hidden": [width], "out_features": 2}), SPEC,
                DEV, mig=False)
    return p.labels.get(PATH_LABEL), p.latency_ms


# ------------------------------------------------------------------ the rule
def test_the_yardsticks_count_what_the_search_uses() -> None:
    assert order_agreement([1, 2, 3], [10, 20, 30]) == (3.0, 3)
    assert order_agreement([3, 2, 1], [10, 20, 30]) == (0.0, 3)
    assert order_agreement([1, 1, 2], [10, 20, 20]) == (1.5, 2)  # a predicted tie counts half; a measured one not
    assert feasibility_agreement([True, False, True], [True, True, True]) == (2.0, 3)
    with pytest.raises(ValidationError, match="one prediction per measurement"):
        order_agreement([1], [1, 2])


def test_the_choice_is_prequential_with_ties_to_the_prior() -> None:
    c = PathChoice()
    assert c.path == "network" and c.network_share is None  # before any scored round: the network
    assert c.score_round([0], [1.0], {"network": [1.0], "prior": [2.0]}) == "network"  # one row: no pair counted
    assert c.score_round([1, 2, 3], [1, 2, 3], {"network": [3, 2, 1], "prior": [1, 2, 3]}) == "prior"
    assert c.score_round([1, 2, 3], [3, 2, 1], {"network": [3, 2, 1], "prior": [1, 2, 3]}) == "prior"  # seen rows
    assert c.score_round([4, 5], [1, 2], {"network": [1, 2], "prior": [2, 1]}) == "prior"  # 1/4 vs 3/4 so far
    assert c.score_round([6, 7], [1, 2], {"network": [1, 2], "prior": [2, 1]}) == "prior"  # 2/5 vs 3/5
    assert c.score_round([8, 9], [1, 2], {"network": [1, 2], "prior": [2, 1]}) == "prior"  # 3/6 vs 3/6: a tie
    assert c.score_round([10, 11], [1, 2], {"network": [1, 2], "prior": [2, 1]}) == "network"  # 4/7 vs 3/7
    assert (c.rounds, c.rounds_network) == (7, 2)
    back = PathChoice.from_dict(c.to_dict())
    assert back == c and back.to_dict()["network_share"] == pytest.approx(2 / 7)
    f = PathChoice(yardstick="feasibility")
    assert f.score_round([0, 1], [True, False], {"network": [True, True], "prior": [True, False]}) == "prior"
    with pytest.raises(ValidationError, match="yardstick must be one of"):
        PathChoice(yardstick="mape")
    with pytest.raises(ValidationError, match="needs the fields"):
        PathChoice.from_dict({"path": "prior"})
    with pytest.raises(ValidationError, match="score"):
        PathChoice.from_dict({**c.to_dict(), "score": {"network": [1, 2]}})
    with pytest.raises(ValidationError, match="one prediction per key"):
        c.score_round([1, 2], [1, 2], {"network": [1]})


# ------------------------------------------------------------------ the validator
def test_where_the_prior_orders_better_the_prior_answers_from_then_on(network: Callable, tmp_path: Path) -> None:
    """Measured latency grows with the width (as the prior has it); the network has the order backwards before each
    reveal (and the truth after it: a scoring of post-reveal predictions would choose it)."""
    net = network(lambda w: 1000.0 / w)
    measured = lambda w: 0.001 * w  # noqa: E731
    study = _study(WIDTHS)
    storage = f"sqlite:///{tmp_path / 'q.db'}"
    v = _validator(measured, storage=storage)
    assert v.choose_path  # on with adaptation
    r1 = v.run_round(study)
    assert len(r1.enqueued) == 3 and r1.measured == 3 and net.adapt_calls == 3
    jobs = JobQueue(storage).jobs(study=study.study_name, device=DEV, status="done")
    for j in jobs:  # both paths recorded before the measurement: the network's guess, not the truth it was told
        w = j.config["hidden"][0]
        assert j.predicted["paths"]["network"]["latency_ms"] == pytest.approx(1000.0 / w)
        assert j.predicted["paths"]["prior"]["latency_ms"] > 0
    assert all("prediction_path" not in j.predicted for j in jobs)  # before a scored round: the network, unwrapped
    assert r1.prediction_path == "prior" and r1.path_scores["yardstick"] == "order"
    assert r1.path_scores["score"] == {"network": [0.0, 3], "prior": [3.0, 3]}
    pp = get_predictor(DEV)
    assert isinstance(pp, PathPredictor) and pp.network is net and pp.adapt_calls == 3  # the rest is the network's
    pp.calibration = "set through the path"  # an attribute set on it is set on the network, never shadowed
    assert net.calibration == "set through the path" and "calibration" not in vars(pp)
    path, lat = _predicted_path(WIDTHS[-1])  # a new trial's figures: the calibrated prior's
    assert path == "prior" and lat != pytest.approx(1000.0 / WIDTHS[-1])
    summary = study.user_attrs["dippm_validation"]
    assert summary["prediction_path"]["path"] == "prior" and summary["prediction_path"]["rounds"] == 1
    r2 = v.run_round(study)
    assert r2.prediction_path == "prior" and r2.path_scores["score"]["prior"][1] == 6
    later = [j for j in JobQueue(storage).jobs(study=study.study_name) if j.trial_number in r2.enqueued]
    assert later and all(j.predicted["prediction_path"] == "prior" and "latency_ms_unadapted" not in j.predicted
                         for j in later)
    # the state persists with the adaptation, in the queue's database: another validator goes on with it
    set_predictor(DEV, net)
    v2 = _validator(measured, storage=storage)
    assert v2.run_round(study).prediction_path == "prior"
    assert v2.paths.choice.rounds == 3 and _predicted_path(8)[0] == "prior"


def test_where_the_network_orders_better_the_network_keeps_answering(network: Callable) -> None:
    network(lambda w: 1000.0 / w)
    v = _validator(lambda w: 100.0 / w)  # measured latency falls with the width: the prior's order is backwards
    study = _study(WIDTHS)
    r1 = v.run_round(study)
    assert r1.prediction_path == "network" and r1.path_scores["score"] == {"network": [3.0, 3], "prior": [0.0, 3]}
    path, lat = _predicted_path(WIDTHS[-1])
    assert path == "network" and lat == pytest.approx(1000.0 / WIDTHS[-1])
    rec = TrialRecord.of(predict(search_spaces.build_model(
        "mlp", {"in_features": 4, "hidden": [8], "out_features": 2}), SPEC, DEV, mig=False), {}, deployment={})
    assert rec.to_attrs()["prediction_path"] == "network"
    assert TrialRecord.from_attrs(rec.to_attrs()).prediction_path == "network"


def test_with_budgets_the_feasibility_classification_decides(network: Callable) -> None:
    """Budget 1 ms: the network orders every row right but puts them all over it; the prior, wrong in order,
    classes them as measured (all within)."""
    network(lambda w: 10.0 + w)
    study = _study(WIDTHS, budget=1.0)
    v = _validator(lambda w: 0.5 - 0.0001 * w)
    r1 = v.run_round(study)
    assert r1.path_scores["yardstick"] == "feasibility"
    assert r1.path_scores["score"]["network"] == [0.0, 3] and r1.path_scores["score"]["prior"][0] == 3.0
    assert r1.prediction_path == "prior"


def test_the_choice_can_be_turned_off_and_needs_adaptation(network: Callable) -> None:
    net = network(lambda w: 1000.0 / w)
    v = _validator(lambda w: 0.001 * w, choose_path=False)
    r = v.run_round(_study(WIDTHS))
    assert r.prediction_path is None and r.path_scores is None and get_predictor(DEV) is net
    assert "paths" not in v.queue_for(_study([8])).jobs()[0].predicted
    assert _predicted_path(8)[0] is None
    with pytest.raises(ValidationError, match="choose_path=True needs adapt=True"):
        ParetoValidator(DEV, measure_fn=_measure(lambda w: 1.0), choose_path=True)
    with pytest.raises(ValidationError, match="choose_path must be True, False or None"):
        _validator(lambda w: 1.0, choose_path="yes")
