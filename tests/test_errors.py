"""One error tree: every error is a ``DippmNasError``; errors of bad values are also ``ValueError``."""

from __future__ import annotations

import pytest

import dippm_nas
from dippm_nas import errors
from dippm_nas.budgets import Budgets
from dippm_nas.dataset import DatasetError
from dippm_nas.devices import get_device
from dippm_nas.prior import check_runtime
from dippm_nas.stages import sum_stages


def test_every_error_class_lives_in_the_errors_module_under_one_root() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.DippmNasError) and cls.__module__ == "dippm_nas.errors"
    assert DatasetError is errors.DatasetError


@pytest.mark.parametrize("bad", [
    lambda: Budgets(latency_ms=-1.0),
    lambda: Budgets(latency_ms=1.0, k_sigma=-2.0),
    lambda: get_device("no-such-gpu"),
    lambda: check_runtime("turbo"),
    lambda: sum_stages([]),
    lambda: dippm_nas.InputSpec(shape=(3, 8, 8), batch_size=0),
])
def test_bad_values_are_catchable_as_value_error_and_as_the_root(bad) -> None:
    with pytest.raises(ValueError) as info:
        bad()
    assert isinstance(info.value, errors.DippmNasError)
    assert "got" in str(info.value) or "choices" in str(info.value) or "one of" in str(info.value)


def test_a_failure_that_is_not_a_bad_value_is_not_a_value_error() -> None:
    assert not issubclass(errors.GraphCaptureError, ValueError)
    assert not issubclass(errors.MeasurementError, ValueError)
    assert issubclass(errors.InvalidValueError, ValueError) and issubclass(errors.BudgetError, ValueError)


def test_bad_arguments_of_the_prior_and_the_calibration_are_value_errors() -> None:
    from dippm_nas.predictor import fit_timeline_factors
    from dippm_nas.prior import HostModel

    with pytest.raises(errors.InvalidValueError, match="at least 2"):
        fit_timeline_factors([], [])
    with pytest.raises(ValueError, match="op_us"):
        HostModel.from_dict({})


def test_bad_arguments_of_the_optuna_cost_model_are_value_errors() -> None:
    pytest.importorskip("optuna")
    from dippm_nas.optuna import HardwareCostModel

    cost = HardwareCostModel("host-cpu", objectives=("latency_ms",))
    with pytest.raises(errors.InvalidValueError, match="direction="):
        cost.create_study(direction="minimize")
    with pytest.raises(ValueError, match="at least one objective"):
        HardwareCostModel("host-cpu", objectives=()).create_study({})


def test_bad_arguments_of_the_nni_tuner_are_value_or_type_errors() -> None:
    pytest.importorskip("nni")
    from dippm_nas.nni import HardwareAwareTuner

    with pytest.raises(ValueError, match="batch_size"):
        HardwareAwareTuner("mlp", batch_size=0, device="host-cpu")
    with pytest.raises(ValueError, match="sampler must be one of"):
        HardwareAwareTuner("mlp", sampler="annealing", device="host-cpu")
    with pytest.raises(TypeError, match="storage must be") as info:
        HardwareAwareTuner("mlp", storage=123, device="host-cpu")
    assert isinstance(info.value, errors.InvalidTypeError)


def test_invalid_type_error_is_a_type_error_under_the_root() -> None:
    assert issubclass(errors.InvalidTypeError, TypeError) and issubclass(errors.InvalidTypeError,
                                                                         errors.DippmNasError)
    assert not issubclass(errors.InvalidTypeError, ValueError)


def test_check_keys_names_the_unknown_and_the_missing_keys() -> None:
    from dippm_nas._json import check_keys

    check_keys({"a": 1}, ("a", "b"), "f.json", required=("a",))  # fine
    with pytest.raises(ValueError, match=r"f.json: unknown keys \['c'\]; choices: \['a', 'b'\]"):
        check_keys({"a": 1, "c": 2}, ("a", "b"), "f.json")
    with pytest.raises(ValueError, match=r"f.json: profile needs \['a'\]"):
        check_keys({"b": 1}, ("a", "b"), "f.json", what="profile", required=("a",))
