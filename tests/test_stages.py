"""Multi-stage pipelines: sums, σ, sources, and the bad inputs the helper refuses."""

from __future__ import annotations

import math
import warnings

import pytest

import dippm_nas
from dippm_nas import DippmNasError, Prediction, Stage, predict_stages, sum_stages
from dippm_nas.predictor import AnalyticPredictor, set_predictor
from test_features import tiny_graph


def pred(lat: float, e: float | None, *, dev: str = "h100-sxm5-80gb", lat_std: float | None = None,
         e_std: float | None = None, src: str = "predicted", mem: float = 100.0) -> Prediction:
    return Prediction(latency_ms=lat, energy_j=e, memory_mib=mem, latency_source="analytic",
                      energy_source="unavailable" if e is None else src, memory_source="analytic", device=dev,
                      batch_size=1, dtype="float16", latency_ms_std=lat_std, energy_j_std=e_std)


def test_diffusion_pipeline_sums_calls_and_sigma() -> None:
    te, unet, vae = pred(2.0, 0.5, e_std=0.05), pred(30.0, 10.0, e_std=1.0), pred(20.0, 6.0, e_std=0.6, mem=900.0)
    total = sum_stages([(te, 1), (unet, 25), (vae, 1)], names=["text_encoder", "unet", "vae"])
    assert total.latency_ms == pytest.approx(2 + 25 * 30 + 20)
    assert total.energy_j == pytest.approx(0.5 + 25 * 10 + 6)
    # the 25 UNet calls repeat one prediction, so their error adds up; stages add in quadrature
    assert total.energy_j_std == pytest.approx(math.sqrt(0.05 ** 2 + 25.0 ** 2 + 0.6 ** 2))
    assert total.latency_ms_std is None  # a stage without σ: no total σ
    assert total.energy_source == "predicted" and total.latency_source == "analytic"
    assert total.peak_stage_memory_mib == 900.0 and total.calls == (1, 25, 1) and total.device == "h100-sxm5-80gb"
    assert total.names == ("text_encoder", "unet", "vae") and total.to_dict()["calls"] == [1, 25, 1]


def test_llm_prefill_plus_decode_and_weakest_source() -> None:
    total = sum_stages([(pred(40.0, 12.0, e_std=1.2), 1), (pred(8.0, 2.0, e_std=0.2, src="analytic"), 128)])
    assert total.latency_ms == pytest.approx(40 + 128 * 8)
    assert total.energy_source == "analytic"  # the weakest stage decides
    no_energy = sum_stages([(pred(1.0, None, dev="host-cpu"), 3)])
    assert no_energy.energy_j is None and no_energy.energy_j_std is None and no_energy.energy_source == "unavailable"


@pytest.mark.parametrize("items, match", [
    ([], "at least one stage"),
    ([(pred(1.0, 1.0), 0)], "calls must be an int >= 1"),
    ([(pred(1.0, 1.0), -2)], "calls must be an int >= 1"),
    ([(pred(1.0, 1.0), 2.5)], "calls must be an int >= 1"),
    ([(pred(1.0, 1.0), True)], "calls must be an int >= 1"),
    ([(pred(1.0, 1.0), 1), (pred(1.0, 1.0, dev="a100-sxm4-40gb"), 1)], "one device"),
    ([("not a prediction", 1)], "must hold a Prediction"),
    ([pred(1.0, 1.0)], r"\(Prediction, calls\) pair"),
])
def test_sum_stages_refuses_bad_input(items, match) -> None:
    with pytest.raises(DippmNasError, match=match):
        sum_stages(items)


def test_predict_stages_runs_each_stage_on_one_device() -> None:
    dev = "h100-sxm5-80gb"
    set_predictor(dev, AnalyticPredictor(dev))
    try:
        g = tiny_graph()
        one = dippm_nas.predict(g, device=dev, mig=False)
        total = predict_stages([Stage(g, None, 2, name="enc"), (g, None, 3), (g, None, 1, dev)], device=dev)
        assert total.latency_ms == pytest.approx(6 * one.latency_ms)
        assert total.energy_j == pytest.approx(6 * one.energy_j)
        assert total.names == ("enc", "stage1", "stage2") and total.device == dev
        with pytest.raises(DippmNasError, match="at least one stage"):
            predict_stages([], device=dev)
        with pytest.raises(DippmNasError, match="calls must be"):
            predict_stages([(g, None, 0)], device=dev)
        with pytest.raises(DippmNasError, match="one device"):
            predict_stages([(g, None, 1, "a100-sxm4-40gb"), (g, None, 1, dev)])
        with pytest.raises(DippmNasError, match="one device"):
            predict_stages([(g, None, 1, "a100-sxm4-40gb")], device=dev)
        with pytest.raises(DippmNasError, match="must be a Stage"):
            predict_stages([(g, None)], device=dev)
    finally:
        set_predictor(dev, None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert predict_stages([(tiny_graph(), None, 1, dev)]).device == dev  # the stages' own device
    finally:
        set_predictor(dev, None)


def test_text_to_image_configs_compose_a_guided_pipeline() -> None:
    """The rebuilt ML.ENERGY pipelines (benchmarks/accuracy/configs/mlenergy_t2i): text encoder(s) at the batch, the UNet
    at twice the batch (classifier-free guidance) once per denoising step, one VAE decode."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "accuracy"))
    import _t2i_pipelines as t2i

    assert set(t2i.MODEL_OF) >= {"openjourney-v4", "stable-diffusion-2-1", "stable-diffusion-xl-base-1.0"}
    for name in t2i.MODEL_OF:
        cfg = t2i.load_config(name)
        comps = t2i.components(cfg)
        unet = next(c for c in comps if c.name == "unet")
        assert unet.batch_factor == 2 and unet.calls in (25, 26)
        assert comps[-1].name == "vae_decode" and comps[-1].calls == 1 and comps[-1].batch_factor == 1
        assert all(c.batch_factor == 1 for c in comps if c.name.startswith("text_encoder"))
        xl = cfg["unet"]["config"].get("addition_embed_type") == "text_time"
        assert cfg["vae"]["dtype"] == ("float32" if xl else "float16")  # SDXL's VAE decodes upcast
