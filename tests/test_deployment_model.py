"""How the predictors and the prior honour a Deployment (no GPU, no network, no ../shared)."""

from __future__ import annotations

import pytest

from dippm_nas import Deployment
from dippm_nas.devices import HostProfile
from dippm_nas.errors import DippmNasError, ExecutionRuntimeError
from dippm_nas.predictor import AnalyticPredictor, get_predictor
from dippm_nas.prior import DeploymentSettings, deployment_settings, estimate

from test_runtime import GPU_BOUND, HOST_BOUND

A100 = "a100-sxm4-40gb"


@pytest.mark.parametrize("predictor", ["analytic", "checkpoint"])
def test_predict_graphs_takes_a_deployment_and_records_what_it_assumed(predictor: str) -> None:
    p = AnalyticPredictor(A100, load_calibration=False) if predictor == "analytic" else get_predictor(A100)
    g = HOST_BOUND[0]
    (unknown,) = p.predict_graphs([g], mig=False)
    assert unknown.details["deployment_assumed"] == "host,framework,tf32,input_copy"
    host = HostProfile.from_clock(2.25, framework="torch-1")
    dep = Deployment(host=host, framework="torch-1", input_copy="none", tf32_matmul=False, tf32_conv=True)
    (described,) = p.predict_graphs([g], mig=False, deployment=dep)
    assert described.details["deployment_assumed"] == ""
    assert described.details["host_profile_mismatch"] == 1.0
    # the legacy keywords build the same deployment: the host profile names its framework
    (legacy,) = p.predict_graphs([g], mig=False, host=host)
    assert legacy.details["deployment_assumed"] == "input_copy"
    assert legacy.latency_ms == pytest.approx(described.latency_ms, rel=1e-9)
    assert described.latency_ms > unknown.latency_ms  # a 2.25 GHz PyTorch 1.x host is slower than the centre


def test_runtime_or_host_beside_a_contradicting_deployment_is_an_error() -> None:
    p = AnalyticPredictor(A100, load_calibration=False)
    with pytest.raises(DippmNasError, match="contradicts"):
        p.predict_graphs(HOST_BOUND[:1], runtime="compiled", deployment=Deployment(runtime="eager"))
    with pytest.raises(ExecutionRuntimeError, match="runtime must be one of"):
        p.predict_graphs(HOST_BOUND[:1], deployment=Deployment(runtime="serving"))
    with pytest.raises(DippmNasError, match="must be a dippm_nas.Deployment"):
        p.predict_graphs(HOST_BOUND[:1], deployment={"runtime": "eager"})  # type: ignore[arg-type]


def test_the_prior_takes_the_deployments_settings() -> None:
    g = GPU_BOUND[0]
    dep = Deployment(runtime="cuda-graphs", framework="torch-2", input_copy="pinned", channels_last=True)
    s = deployment_settings(dep)
    assert isinstance(s, DeploymentSettings) and s.assumed == ("host",)
    assert (s.runtime, s.input_copy, s.channels_last, s.tf32_matmul, s.tf32_conv) == ("cuda-graphs", "pinned", True,
                                                                                      False, True)
    via_dep = estimate(g, A100, deployment=dep)
    direct = estimate(g, A100, runtime="cuda-graphs", input_copy="pinned", channels_last=True)
    assert via_dep.latency_ms == pytest.approx(direct.latency_ms, rel=1e-12)
    assert via_dep.input_copy_ms > 0
