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
