"""The deployment is coerced and the device looked up once per prediction, at the entry, and passed inward.

Each entry that predicts (``predict``, ``predict_many``, ``HardwareCostModel``, the NNI tuner, ``predict_generation``,
``dippm-nas predict``) is run under a profiler hook that counts the calls of:

- ``Deployment.coerce`` (a deployment, a mapping, a file or the ``runtime=`` / ``host=`` keywords to a ``Deployment``),
- ``Deployment.resolve`` (PyTorch's defaults and the running process filled in: what ``ResolvedDeployment`` holds),
- ``deployment_settings`` given anything but settings (the prior's ``DeploymentSettings`` of a deployment; settings
  passed to it come back as they are and are not counted),
- ``get_device`` (the catalogue look-up of a device id; ``resolve_device`` of a resolved ``Device`` returns it).

The hook counts by code object, so a function imported by name into another module is counted too. The
``ResolvedSettings`` each prior estimate builds from the settings (one per deployment scenario of the σ and per MIG
slice) read no deployment and look nothing up, so they are not counted.

``predict_many`` resolves once per call, not per item: every item of a call has the call's deployment and device.
``HardwareCostModel`` and the NNI tuner resolve the deployment once when made; a trial (a candidate) then coerces and
resolves nothing, and looks the device up once (the cost model, which passes its device id to ``predict``) or not at
all (the tuner, which passes the resolved device).
"""

from __future__ import annotations

import collections
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dippm_nas
import search_spaces as ss
from dippm_nas import Deployment
from dippm_nas.devices import HostProfile, get_device
from dippm_nas.prior import DeploymentSettings, deployment_settings

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # "no trained checkpoint" / "uncalibrated"

DEV = "a100-sxm4-40gb"
SPEC = ss.get_space("mlp").input_spec({"in_features": 32, "hidden": [64], "out_features": 4}, batch_size=8,
                                      dtype="float16")
DESCRIBED = Deployment(runtime="cuda-graphs", host=HostProfile.from_clock(2.25, framework="torch-1", name="epyc"),
                       tf32_matmul=True, autocast="float16", input_copy="pinned")
_WIDTHS = itertools.count(17)

_COUNTED: dict[Any, str] = {
    Deployment.coerce.__func__.__code__: "coerce",  # type: ignore[attr-defined]
    Deployment.resolve.__code__: "resolve",
    deployment_settings.__code__: "settings",
    get_device.__code__: "device_lookup",
}


class Counts(collections.Counter):
    """Calls of the coercion and look-up functions while :func:`counting` is active."""


@pytest.fixture
def counting() -> Iterator[Callable[[Callable[[], Any]], tuple[Any, Counts]]]:
    """``counting(fn)``: runs ``fn`` and returns its result with the calls it made of the counted functions."""

    def run(fn: Callable[[], Any]) -> tuple[Any, Counts]:
        counts = Counts()

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event != "call":
                return
            name = _COUNTED.get(frame.f_code)
            if name == "settings" and isinstance(frame.f_locals.get("deployment"), DeploymentSettings):
                return  # resolved settings pass through as they are
            if name is not None:
                counts[name] += 1

        old = sys.getprofile()
        sys.setprofile(hook)
        try:
            out = fn()
        finally:
            sys.setprofile(old)
        return out, counts

    yield run


def _graph() -> Any:
    """A graph no prediction has seen (the predictor's caches answer nothing for it)."""
    return dippm_nas.capture(ss.build_model("mlp", {"in_features": 32, "hidden": [next(_WIDTHS)], "out_features": 4}),
                             SPEC)


ONCE = {"coerce": 1, "resolve": 1, "settings": 1, "device_lookup": 1}


@pytest.mark.parametrize("device", [DEV, "h100-sxm5-80gb"])  # the trained A100 checkpoint; the analytic H100
@pytest.mark.parametrize("deployment", [None, DESCRIBED, DESCRIBED.to_dict()])
def test_predict_coerces_the_deployment_and_looks_the_device_up_once(counting: Any, device: str,
                                                                      deployment: Any) -> None:
    dippm_nas.predict(_graph(), device=device)  # the predictor loaded
    g = _graph()
    pred, counts = counting(lambda: dippm_nas.predict(g, device=device, deployment=deployment))
    assert dict(counts) == ONCE
    assert pred.labels["deployment"] == Deployment.coerce(deployment).label


@pytest.mark.parametrize("device", [DEV, "h100-sxm5-80gb"])
def test_predict_many_resolves_once_per_call_not_per_item(counting: Any, device: str) -> None:
    dippm_nas.predict(_graph(), device=device)
    graphs = [_graph() for _ in range(3)]  # batched: the stacked path of both predictors
    preds, counts = counting(lambda: dippm_nas.predict_many(graphs, device=device, deployment=DESCRIBED))
    assert dict(counts) == ONCE
    assert [p.labels["deployment"] for p in preds] == [DESCRIBED.label] * 3


def test_resolved_settings_pass_through_predict_without_another_coercion(counting: Any) -> None:
    dev = get_device(DEV)
    settings = dippm_nas.predictor.resolve_deployment(dev, DESCRIBED)
    g = _graph()
    pred, counts = counting(lambda: dippm_nas.predict(g, device=dev, deployment=settings))
    assert dict(counts) == {}  # nothing coerced, nothing looked up
    assert pred == dippm_nas.predict(g, device=DEV, deployment=DESCRIBED)


def test_the_cost_model_resolves_once_when_made_and_never_per_trial(counting: Any) -> None:
    from dippm_nas.optuna import HardwareCostModel

    cost, made = counting(lambda: HardwareCostModel(DEV, objectives=("latency_ms",), deployment=DESCRIBED.to_dict()))
    assert dict(made) == ONCE
    study = cost.create_study(leading={}, storage="sqlite://")
    for width in (40, 41):  # the first trial loads the predictor; count the second
        t = study.ask()
        model = ss.build_model("mlp", {"in_features": 32, "hidden": [width], "out_features": 4})
        values, counts = counting(lambda: cost.evaluate(t, model, SPEC))
        study.tell(t, values)
    assert dict(counts) == {"device_lookup": 1}  # predict() takes the cost model's device id: one look-up a trial
    assert t.user_attrs["deployment"] == DESCRIBED.to_dict()


def test_the_nni_tuner_resolves_once_when_made_and_never_per_candidate(counting: Any) -> None:
    pytest.importorskip("nni", reason="needs NNI (pip install -e '.[nni]')")
    from dippm_nas.nni import PARAMETERS_KEY, HardwareAwareTuner

    def make() -> Any:
        return HardwareAwareTuner(builder="mlp", base_config={"in_features": 32, "out_features": 4}, batch_size=8,
                                  seed=0, sampler="random", budgets={"latency_ms": 1e3}, deployment=DESCRIBED.to_dict())

    tuner, made = counting(make)
    assert dict(made) == ONCE
    tuner.update_search_space({"hidden": {"_type": "choice", "_value": [[64], [96], [128]]}})
    tuner.generate_parameters(0)  # the predictor loaded
    params, counts = counting(lambda: tuner.generate_parameters(1))
    assert dict(counts) == {}
    assert Deployment.from_dict(params[PARAMETERS_KEY]["deployment"]) == DESCRIBED


@pytest.mark.parametrize("runtime", ["eager", "serving"])
def test_predict_generation_coerces_and_looks_up_once(counting: Any, runtime: str) -> None:
    from dippm_nas.llm import LLMWorkload, predict_generation

    wl = LLMWorkload(prompt_len=128, output_len=16, batch_size=2)
    pred, counts = counting(lambda: predict_generation("llama-3-8b", wl, "h100-sxm5-80gb", runtime=runtime,
                                                       mig=False))
    assert dict(counts) == {"coerce": 1, "resolve": 1, "device_lookup": 1}  # no graph settings: the timing's own
    assert pred.details["deployment"] == Deployment(runtime=runtime).label


def test_the_cli_predict_verb_resolves_once_per_device(counting: Any, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from dippm_nas.cli import main

    f = DESCRIBED.save(tmp_path / "dep.toml")
    argv = ["predict", "mlp_once:build", "--shape", "32", "--batch", "8", "--dtype", "float16", "--json",
            "--deployment", str(f), "--device", DEV, "h100-sxm5-80gb"]
    (tmp_path / "mlp_once.py").write_text("import search_spaces as ss\n\ndef build():\n"
                                          "    return ss.build_model('mlp', {'in_features': 32, 'hidden': [23], "
                                          "'out_features': 4})\n")
    sys.path.insert(0, str(tmp_path))
    try:
        rc, counts = counting(lambda: main(argv))
    finally:
        sys.path.remove(str(tmp_path))
    assert rc == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["device"] for r in rows] == [DEV, "h100-sxm5-80gb"]
    # the file's deployment coerced once; resolved and looked up once per device, each device one prediction
    assert dict(counts) == {"coerce": 1, "resolve": 2, "settings": 2, "device_lookup": 2}
