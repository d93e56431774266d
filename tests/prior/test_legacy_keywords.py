"""The keywords of ``prior.estimate()`` (and ``estimate_latency_ms``, ``estimate_many``, ``prior.predict``) that
``deployment=`` replaces keep working with a ``DeprecationWarning`` until dippm-nas 0.2, with the same figures as the
``DeploymentSettings`` that describe the same settings; the library itself passes none of them."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import pytest

import dippm_nas
import search_spaces as ss
from dippm_nas.devices import HostProfile
from dippm_nas.prior import (DeploymentSettings, Execution, estimate, estimate_latency_ms, estimate_many,
                             execution_settings, predict, row_settings)

DEV = "a100-sxm4-40gb"
HOST = HostProfile.from_clock(3.0, framework="torch-2", name="h3")
LEGACY: dict[str, Any] = {"runtime": "cuda-graphs", "host": HOST, "tf32_matmul": True, "tf32_conv": False,
                          "channels_last": True, "input_copy": "pinned", "autocast": "float16"}
SETTINGS = DeploymentSettings(runtime="cuda-graphs", host=HOST, tf32_matmul=True, tf32_conv=False,
                              channels_last=True, input_copy="pinned", autocast="float16")


def _same(a: Any, b: Any) -> bool:
    """Two prior estimates are equal field by field (the per-node arrays element by element)."""
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    return da.keys() == db.keys() and all(np.array_equal(da[k], db[k]) if isinstance(da[k], np.ndarray)
                                          else da[k] == db[k] for k in da)


@pytest.fixture(scope="module")
def graph() -> Any:
    cfg = {"in_features": 32, "hidden": [64], "out_features": 4}
    return dippm_nas.capture(ss.build_model("mlp", cfg), ss.get_space("mlp").input_spec(cfg, batch_size=8,
                                                                                          dtype="float32"))


def test_each_legacy_keyword_warns_and_gives_the_settings_figures(graph: Any) -> None:
    named = r"tf32_conv=, tf32_matmul=, channels_last=, runtime=, host=, input_copy=, autocast="
    with pytest.warns(DeprecationWarning, match=rf"prior\.estimate\({named}\).*removed in dippm-nas 0\.2"):
        old = estimate(graph, DEV, **LEGACY)
    assert _same(old, estimate(graph, DEV, deployment=SETTINGS))
    with pytest.warns(DeprecationWarning, match=r"estimate_latency_ms\(tf32_conv=\)"):
        assert estimate_latency_ms(graph, DEV, tf32_conv=False) == \
            estimate_latency_ms(graph, DEV, deployment=DeploymentSettings(tf32_conv=False))
    with pytest.warns(DeprecationWarning, match=r"estimate_many\(runtime=\)"):
        (many,) = estimate_many([graph], DEV, runtime="compiled")
    assert many.latency_ms == pytest.approx(estimate(graph, DEV, deployment=DeploymentSettings(runtime="compiled"))
                                            .latency_ms, rel=1e-12)
    with pytest.warns(DeprecationWarning, match=r"prior\.predict\(tf32_conv=.*runtime=, host="):
        p_old = predict(graph, DEV, **LEGACY)
    p_new = predict(graph, DEV, deployment=SETTINGS)  # adds the deployment's spread (none: all is described)
    assert (p_old.latency_ms, p_old.energy_j, p_old.memory_mib, p_old.mig) == \
        (p_new.latency_ms, p_new.energy_j, p_new.memory_mib, p_new.mig)
    assert p_new.details["deployment_sigma_log"] == 0.0


def test_execution_keyword_warns_and_execution_settings_replace_it(graph: Any) -> None:
    with pytest.warns(DeprecationWarning, match=r"dippm_nas\.prior\.Execution is deprecated"):
        ex = Execution(runtime="compiled", host=HOST, input_copy=True)
    with pytest.warns(DeprecationWarning, match=r"estimate\(execution=\)"):
        old = estimate(graph, DEV, execution=ex)
    assert _same(old, estimate(graph, DEV, deployment=execution_settings(ex)))
    assert execution_settings(None) is None
    assert execution_settings(SETTINGS) is SETTINGS
    with pytest.raises(dippm_nas.errors.InvalidTypeError, match="Execution"):
        execution_settings("compiled")  # type: ignore[arg-type]


def test_the_library_passes_no_legacy_keyword(graph: Any) -> None:
    from dippm_nas.features import featurize, featurize_many
    from dippm_nas.llm import LLMWorkload, predict_generation

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        estimate(graph, DEV, deployment=SETTINGS)
        predict(graph, DEV, deployment=SETTINGS)
        featurize(graph, DEV, execution=DeploymentSettings(runtime="compiled"))
        featurize_many([graph, graph], DEV, execution=DeploymentSettings(runtime="compiled"))
        predict_generation("llama-7b", LLMWorkload(prompt_len=64, output_len=8, batch_size=1), "h100-sxm5-80gb",
                           runtime="cuda-graphs", mig=False)
        dippm_nas.predict(graph, device="h100-sxm5-80gb", deployment=dippm_nas.Deployment(runtime="compiled"))


def test_execution_and_from_conditions_warn_and_row_settings_equal_them() -> None:
    conditions = {"runtime": "cuda-graphs", "input_copy": "pinned", "framework": "torch-1"}
    with pytest.warns(DeprecationWarning, match=r"dippm_nas\.prior\.Execution\.from_conditions is deprecated") as rec:
        ex = Execution.from_conditions(conditions)
    assert len(rec) == 1 and rec[0].filename == __file__  # one warning, at the caller (what filterwarnings matches)
    with pytest.warns(DeprecationWarning, match=r"dippm_nas\.prior\.Execution is deprecated") as rec:
        Execution(runtime="compiled")
    assert len(rec) == 1 and rec[0].filename == __file__
    assert (ex.runtime, ex.input_copy, ex.host.framework) == ("cuda-graphs", True, "torch-1")
    assert row_settings(conditions) == execution_settings(ex)
    assert row_settings(None) == DeploymentSettings(input_copy="none")
