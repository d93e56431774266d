"""The batched path of the predictors gives the per-graph path's predictions; one device lookup per prediction.

- The prior over a stack of graphs (:func:`dippm_nas.prior.estimate_many`, ``deployment_spread_many``,
  ``advise_many``) against the single-graph functions, and whole ``predict_graphs`` answers of the GNN and analytic
  predictors with the stacked path (``batch_min_graphs`` low) against the per-graph path (``batch_min_graphs``
  high) on the same request, so the network sees the same batch: every field within :data:`REL`. The sample is
  two graphs of every registered search space (``tests/data/space_graphs.json.xz``: float16 at batch 2 and
  float32 at batch 8, assembled from the spaces' blocks), eager torchvision CNNs (``torchvision_graphs.json.xz``:
  resnet18, mobilenet_v2, squeezenet1_0, mnasnet0_5 and densenet121 without weights, 3x224x224 at batch 12 in
  float32 and float16, captured with torchvision 0.29.1), a timm subset (``timm_graphs.json.xz``: efficientnet_b0,
  convnext_atto, regnetx_002, vit_tiny_patch16_224 and resnet18d without weights, batch 8 float16, timm 1.0.31)
  and the graphs of ``test_inference_equality``.
- ``predict``, ``predict_many`` and ``predict_graphs`` look a device id up (``get_device`` through
  ``resolve_device``) once per call at most: the entry resolves it, the predictor holds its resolved device and
  everything inward takes the :class:`~dippm_nas.devices.Device`.
"""

from __future__ import annotations

import functools
import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from _compare import assert_close
import dippm_nas
import search_spaces as ss
from dippm_nas import Deployment
from dippm_nas.devices import default_host_profile, get_device
from dippm_nas.graph import OperatorGraph
from dippm_nas.predictor import AnalyticPredictor, set_predictor
from dippm_nas.prior import (CostStack, DeploymentSettings, advise, advise_many, deployment_settings, deployment_spread,
                             deployment_spread_many, estimate, estimate_many, prediction_of)

DATA = Path(__file__).resolve().parents[1] / "data"
#: The stacked path adds the same numbers as the per-graph one except the per-graph sums (in node order instead
#: of numpy's pairwise order) and the spread's scaled host timelines (the cumulated host times times the host's
#: speed factor instead of the cumulated scaled times): both move a figure by about 1e-16 relative per node. The
#: largest difference measured on this sample is below 1e-13; 1e-9 is the issue's bound.
REL = 1e-9
#: Log-space figures near 0 (``deployment_offset_log``) are compared to this absolute tolerance.
ABS = 1e-12


@functools.lru_cache(maxsize=1)
def _sample() -> tuple[list[OperatorGraph], list[OperatorGraph]]:
    """(float16 and float32 graphs of every space, the torchvision and timm models and the GPU sample; the float32
    ones and the host sample for the host)."""
    with lzma.open(DATA / "space_graphs.json.xz", "rt") as f:
        spaces = [OperatorGraph.from_dict(x) for x in json.load(f)["graphs"]]
    with lzma.open(DATA / "inference_graphs.json.xz", "rt") as f:
        d = json.load(f)
    vision = []
    for name in ("torchvision_graphs.json.xz", "timm_graphs.json.xz"):
        with lzma.open(DATA / name, "rt") as f:
            vision += [OperatorGraph.from_dict(x) for x in json.load(f)["graphs"]]
    gpu = spaces + vision + [OperatorGraph.from_dict(x) for x in d["gpu"]]
    host = ([g for g in spaces + vision if g.spec.dtype == "float32"]
            + [OperatorGraph.from_dict(x) for x in d["host"]])
    return gpu, host


def _dicts(preds: list[Any]) -> list[Any]:
    return [json.loads(json.dumps(p.to_dict())) for p in preds]


def test_the_sample_covers_every_registered_space() -> None:
    with lzma.open(DATA / "space_graphs.json.xz", "rt") as f:
        names = {g["source"].split(" ")[0] for g in json.load(f)["graphs"]}
    # the package's spaces (other tests register spaces of their own while the session runs)
    assert names == {n for n in ss.list_spaces() if type(ss.get_space(n)).__module__.startswith("search_spaces.")}


@pytest.mark.parametrize("kw", [{}, {"deployment": DeploymentSettings(runtime="compiled")},
                                {"deployment": DeploymentSettings(runtime="cuda-graphs", input_copy="pinned")},
                                {"deployment": Deployment()}, {"deployment": DeploymentSettings(autocast="bfloat16")}])
def test_estimate_many_equals_estimate(kw: dict[str, Any]) -> None:
    dev = get_device("a100-sxm4-40gb")
    graphs = _sample()[0]
    if getattr(kw.get("deployment"), "autocast", None):
        graphs = [g for g in graphs if g.spec.dtype == "float32"]
    got = estimate_many(graphs, dev, **kw)
    for i, (g, e) in enumerate(zip(graphs, got)):
        assert_close(json.loads(json.dumps(e.to_dict())), json.loads(json.dumps(estimate(g, dev, **kw).to_dict())),
                     rel=REL, abs_tol=ABS, path=f"[{i}]")


def test_spread_and_mig_advice_over_a_stack_equal_the_single_graph_ones() -> None:
    dev = get_device("a100-sxm4-40gb")
    graphs = _sample()[0]
    st = deployment_settings(Deployment())
    stack = CostStack(graphs, dev)
    factors = [0.8 + 0.4 * i / len(graphs) for i in range(len(graphs))]
    spreads = deployment_spread_many(stack, dev, st, gpu_factors=factors)
    for i, (g, f, sp) in enumerate(zip(graphs, factors, spreads)):
        ref = deployment_spread(g, dev, st, gpu_factor=f)
        assert sp.scenarios == ref.scenarios
        assert_close([sp.offset_log, sp.sigma_log], [ref.offset_log, ref.sigma_log], rel=REL, abs_tol=ABS,
                     path=f"[{i}]")
    preds = [prediction_of(e, dev, spread=sp) for e, sp in zip(estimate_many(graphs, dev, deployment=st), spreads)]
    got = advise_many(preds, dev, graphs, k_sigma=1.5, deployment=st, stack=stack)
    want = [advise(p, dev, graph=g, k_sigma=1.5, deployment=st) for p, g in zip(preds, graphs)]
    assert_close([a.to_dict() for a in got], [a.to_dict() for a in want], rel=REL, abs_tol=ABS)


SETTINGS = [("a100-sxm4-40gb", {}), ("a100-sxm4-40gb", {"runtime": "compiled"}),
            ("a100-sxm4-40gb", {"deployment": Deployment(host=default_host_profile(), input_copy="pinned",
                                                         channels_last=True)}),
            ("h100-sxm5-80gb", {}), ("rtx-4090", {"runtime": "cuda-graphs"}), ("host-cpu", {})]


@pytest.mark.parametrize("device,kw", SETTINGS, ids=[f"{d}-{sorted(k)}" for d, k in SETTINGS])
def test_stacked_predictions_equal_the_per_graph_ones(device: str, kw: dict[str, Any]) -> None:
    graphs = _sample()[1 if device == "host-cpu" else 0]
    answers = []
    for batch_min in (10**9, 2):  # the per-graph path, then the stacked one, each on a fresh predictor
        set_predictor(device, None)
        predictor = dippm_nas.get_predictor(device)
        predictor.batch_min_graphs = batch_min
        answers.append(_dicts(predictor.predict_graphs(graphs, **kw)))
    set_predictor(device, None)
    assert_close(answers[1], answers[0], rel=REL, abs_tol=ABS)


def test_the_analytic_predictor_stacks_too() -> None:
    graphs = _sample()[0][:12]
    ref, got = AnalyticPredictor("a100-sxm4-40gb"), AnalyticPredictor("a100-sxm4-40gb")
    ref.batch_min_graphs = 10**9
    assert_close(_dicts(got.predict_graphs(graphs)), _dicts(ref.predict_graphs(graphs)), rel=REL, abs_tol=ABS)


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Device ids looked up from now on (``resolve_device`` of an id calls ``get_device``)."""
    import dippm_nas.devices._registry as registry

    calls: list[str] = []
    real = registry.get_device

    def counting(device_id: str, **kw: Any) -> Any:
        calls.append(device_id)
        return real(device_id, **kw)

    monkeypatch.setattr(registry, "get_device", counting)
    return calls


@pytest.mark.parametrize("device", ["a100-sxm4-40gb", "h100-sxm5-80gb"])  # a GNN checkpoint; the analytic prior
def test_one_device_lookup_per_prediction(device: str, lookups: list[str]) -> None:
    graphs = _sample()[0][:10]
    set_predictor(device, None)
    predictor = dippm_nas.get_predictor(device)  # loading a predictor resolves its device: not a prediction
    lookups.clear()
    cfg = ss.get_space("mlp").validate({"in_features": 12, "hidden": [16, 8], "activation": "gelu",
                                        "norm": "batchnorm", "out_features": 3})
    model = functools.partial(ss.build_model, "mlp", cfg)
    dippm_nas.predict(model, ss.get_space("mlp").input_spec(cfg, batch_size=4), device=device)
    assert len(lookups) == 1, lookups
    for call in (lambda: dippm_nas.predict_many(graphs, device),          # stacked (10 graphs)
                 lambda: dippm_nas.predict_many(graphs[:2], device, runtime="compiled")):  # per graph
        lookups.clear()
        call()
        assert len(lookups) == 1, lookups
    lookups.clear()
    predictor.clear_prediction_cache() if hasattr(predictor, "clear_prediction_cache") else None
    predictor.predict_graphs(graphs)
    assert lookups == []
    set_predictor(device, None)
