"""Serving engines corrected from a few measured runs: the constants are recovered, stored per (device, engine,
version) and read back; bad input is a clear error."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from dippm_nas.errors import AdaptationError, InvalidValueError
from dippm_nas.llm import (DecoderConfig, LLMWorkload, MeasuredServingRun, adapt_engine, adapted_engine,
                           decode_graph, decoder_config, predict_generation, serving_engine)
from dippm_nas.prior._nodes import contraction_tiles

pytest.importorskip("scipy")


def tiny(layers: int = 2) -> DecoderConfig:
    return DecoderConfig(name=f"tiny{layers}", model_type="llama", num_layers=layers, hidden_size=256, num_heads=8,
                         num_kv_heads=4, head_dim=32, intermediate_size=512, vocab_size=1000, max_positions=4096,
                         rotary_dim=32)


def _measured(cfg: DecoderConfig, shapes: list[tuple[int, int, int]], truth) -> list[MeasuredServingRun]:
    out = []
    for prompt, output, batch in shapes:
        p = predict_generation(cfg, LLMWorkload(prompt, output, batch), "l4", runtime="serving", engine=truth,
                               mig=False)
        out.append(MeasuredServingRun(cfg, prompt, output, batch, e2e_ms=p.e2e_ms, tpot_ms=p.decode_ms_per_token))
    return out


def test_a_new_version_is_recovered_from_five_runs_and_stored(tmp_path) -> None:
    truth = dataclasses.replace(serving_engine("vllm"), step_us=4000.0, seq_us=150.0, decode_gpu_scale=1.3)
    shapes = [(128, 32, 1), (256, 64, 4), (512, 32, 16), (128, 128, 8), (1024, 16, 2)]
    runs = _measured(tiny(), shapes, truth)
    ad = adapt_engine(runs, device="l4", engine="vllm", version="9.9", storage=tmp_path)
    assert ad.constants["step_us"] == pytest.approx(4000.0, rel=0.05)
    assert ad.constants["seq_us"] == pytest.approx(150.0, rel=0.1)
    assert ad.constants["decode_gpu_scale"] == pytest.approx(1.3, rel=0.05)
    assert ad.runs == 5 and ad.heldout_mape_pct < 2.0 and ad.sigma_log < 0.02
    eng = adapted_engine("l4", "vllm", "9.9", storage=tmp_path)
    assert eng is not None and eng.fitted and eng.sigma_log == pytest.approx(ad.sigma_log)
    # another model on the same GPU and version: predicted as the new version runs it
    other = tiny(layers=6)
    wl = LLMWorkload(384, 48, 12)
    want = predict_generation(other, wl, "l4", runtime="serving", engine=truth, mig=False).e2e_ms
    got = predict_generation(other, wl, "l4", runtime="serving", engine=eng, mig=False).e2e_ms
    shipped = predict_generation(other, wl, "l4", runtime="serving", engine="vllm", mig=False).e2e_ms
    assert abs(got / want - 1) < 0.03 < abs(shipped / want - 1)
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["device"] == "l4" and doc["version"] == "9.9" and len(doc["measured_runs"]) == 5


def test_nothing_stored_and_bad_files(tmp_path) -> None:
    assert adapted_engine("l4", "vllm", "0.1", storage=tmp_path) is None
    (tmp_path / "l4__vllm__0.2.json").write_text('{"format": 7}')
    with pytest.raises(AdaptationError, match="not an engine adaptation"):
        adapted_engine("l4", "vllm", "0.2", storage=tmp_path)
    for text in ("[1, 2]", "{not json", '{"format": 1, "constants": [1]}'):
        (tmp_path / "l4__vllm__0.3.json").write_text(text)
        with pytest.raises(AdaptationError, match="not an engine adaptation"):
            adapted_engine("l4", "vllm", "0.3", storage=tmp_path)


@pytest.mark.parametrize("make, words", [
    (lambda: MeasuredServingRun("llama-2-7b", 128, 128, 1, e2e_ms=0.0), "e2e_ms"),
    (lambda: MeasuredServingRun("llama-2-7b", 128, 128, 1, e2e_ms=5.0, tpot_ms=math.nan), "tpot_ms"),
    (lambda: MeasuredServingRun("llama-2-7b", 0, 128, 1, e2e_ms=5.0), "prompt_len"),
    (lambda: adapt_engine([], device="l4", engine="vllm", version="1"), "non-empty"),
    (lambda: adapt_engine([MeasuredServingRun("llama-2-7b", 8, 8, 1, e2e_ms=5.0)], device="l4", engine="sglang",
                          version="1"), "engine"),
    (lambda: adapt_engine([MeasuredServingRun("llama-2-7b", 8, 8, 1, e2e_ms=5.0)], device="l4", engine="vllm",
                          version=""), "version"),
])
def test_bad_adaptation_input(make, words: str) -> None:
    with pytest.raises(InvalidValueError, match=words):
        make()


def test_a_deployment_naming_the_version_uses_the_stored_adaptation(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    truth = dataclasses.replace(serving_engine("vllm"), step_us=5000.0, seq_us=50.0, decode_gpu_scale=1.1)
    runs = _measured(tiny(), [(128, 32, 1), (256, 64, 4), (512, 32, 16), (128, 128, 8)], truth)
    adapt_engine(runs, device="l4", engine="vllm", version="0.9.1")
    wl = LLMWorkload(256, 32, 4)
    kw = dict(runtime="serving", mig=False)
    want = predict_generation(tiny(4), wl, "l4", engine=truth, **kw)
    got = predict_generation(tiny(4), wl, "l4", deployment={"runtime": "serving", "versions": {"vllm": "0.9.1"}},
                             mig=False)
    other = predict_generation(tiny(4), wl, "l4", deployment={"runtime": "serving", "versions": {"vllm": "0.4.0"}},
                               mig=False)
    assert got.details["engine_adaptation"] == "l4, vllm 0.9.1" and other.details["engine_adaptation"] is None
    assert abs(got.e2e_ms / want.e2e_ms - 1) < 0.03 < abs(other.e2e_ms / want.e2e_ms - 1)
    # elsewhere (another GPU) the adaptation does not apply
    h100 = predict_generation(tiny(4), wl, "h100-sxm5-80gb",
                              deployment={"runtime": "serving", "versions": {"vllm": "0.9.1"}}, mig=False)
    assert h100.details["engine_adaptation"] is None


def test_runs_that_confirm_no_correction_keep_the_starting_engine(tmp_path) -> None:
    """Runs the starting engine predicts up to a ±8 % scatter with no trend: the guard keeps the starting constants
    (shrink 0) and σ is the runs' own held-out error, not a fit that chased the scatter."""
    base = serving_engine("vllm")
    shapes = [(128, 32, 1), (256, 64, 4), (512, 32, 16), (128, 128, 8), (1024, 16, 2)]
    runs = [dataclasses.replace(r, e2e_ms=r.e2e_ms * f, tpot_ms=None)
            for r, f in zip(_measured(tiny(), shapes, base), (1.08, 0.92, 1.08, 0.92, 1.08))]
    ad = adapt_engine(runs, device="l4", engine="vllm", version="noise", storage=tmp_path)
    assert ad.shrink == 0.0
    assert ad.constants == {n: getattr(base, n) for n in ad.constants}
    assert ad.sigma_log == pytest.approx(math.log(1.08), rel=0.05)
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["shrink"] == 0.0


def test_the_guard_is_never_worse_held_out_than_no_correction(tmp_path) -> None:
    """An anchor the step model misreads (its times off by a factor growing with the prompt): whatever the guard
    keeps, its held-out error is at most the starting engine's on those runs."""
    base = serving_engine("vllm")
    shapes = [(128, 32, 1), (256, 64, 4), (512, 32, 16), (1024, 128, 8), (2048, 16, 2)]
    runs = [dataclasses.replace(r, e2e_ms=r.e2e_ms * (1 + r.prompt_len / 1024), tpot_ms=None)
            for r in _measured(tiny(), shapes, base)]
    ad = adapt_engine(runs, device="l4", engine="vllm", version="odd", storage=tmp_path)
    start = math.sqrt(sum(math.log(1 + r.prompt_len / 1024) ** 2 for r in runs) / len(runs))
    assert 0.0 <= ad.shrink <= 1.0 and ad.sigma_log <= start + 1e-9


def test_runs_the_step_model_misreads_correct_nothing(tmp_path, caplog) -> None:
    """Held out far beyond the starting engine's σ (a quirk no step constant describes): the starting constants are
    kept, with a warning that says why."""
    base = dataclasses.replace(serving_engine("vllm"), sigma_log=0.01)
    shapes = [(128, 32, 1), (256, 64, 4), (512, 32, 16), (1024, 128, 8), (2048, 16, 2)]
    runs = [dataclasses.replace(r, e2e_ms=r.e2e_ms * f, tpot_ms=None)
            for r, f in zip(_measured(tiny(), shapes, base), (2.0, 2.3, 1.8, 2.2, 1.9))]
    with caplog.at_level("WARNING", logger="dippm_nas.llm._engine_adapt"):
        ad = adapt_engine(runs, device="l4", engine="vllm", version="quirk", base=base, storage=tmp_path)
    assert ad.shrink == 0.0 and ad.constants == {n: getattr(base, n) for n in ad.constants}
    assert "misreads" in caplog.text and ad.sigma_log > 0.03


def test_an_anchor_off_by_no_more_than_the_engine_sigma_moves_nothing(tmp_path) -> None:
    """Runs consistently 10 % slower than the starting engine, whose σ (0.2) says any one model is off by more:
    the runs are no evidence against the engine's constants; with σ 0.02 they are, and the correction is kept."""
    shapes = [(128, 32, 1), (256, 64, 4), (512, 32, 16), (1024, 128, 8), (2048, 16, 2)]
    for sigma, moved in ((0.2, False), (0.02, True)):
        base = dataclasses.replace(serving_engine("vllm"), sigma_log=sigma)
        runs = [dataclasses.replace(r, e2e_ms=r.e2e_ms * 1.1, tpot_ms=None) for r in _measured(tiny(), shapes, base)]
        ad = adapt_engine(runs, device="l4", engine="vllm", version=f"s{sigma}", base=base, storage=tmp_path)
        assert (ad.shrink > 0.5) is moved, (sigma, ad.shrink)
        assert (ad.constants != {n: getattr(base, n) for n in ad.constants}) is moved


def test_vllm_decode_attention_is_a_block_per_sequence_head_and_partition() -> None:
    """vLLM's paged attention: a batch-1 step barely grows with the cache (a bandwidth-bound read), while the output
    tiling (no partition) grows it; bad partitions are clear errors."""
    cfg = decoder_config("llama-3-8b", dtype="float16")
    g = decode_graph(cfg, 2, 1500, style="fused", kv_partition=512)
    att = [n for n in g.nodes if n.op_class == "attention"]
    assert att and contraction_tiles(att[0], 128, 128) == (2 * 32 * 3, 1.0)
    tiled = [n for n in decode_graph(cfg, 2, 1500, style="fused").nodes if n.op_class == "attention"]
    assert contraction_tiles(tiled[0], 128, 128)[0] == 1
    vllm = serving_engine("vllm")
    assert vllm.decode_kv_partition == 512 and serving_engine("tensorrt-llm").decode_kv_partition is None

    def per_token(eng, n):
        return predict_generation(cfg, LLMWorkload(n, n, 1), "h100-sxm5-80gb", runtime="serving", engine=eng,
                                  mig=False).decode_ms_per_token
    tiling = dataclasses.replace(vllm, decode_kv_partition=None)
    assert per_token(vllm, 2048) / per_token(vllm, 128) < 1.05 < per_token(tiling, 2048) / per_token(tiling, 128)
    with pytest.raises(InvalidValueError, match="kv_partition"):
        decode_graph(cfg, 1, 8, style="fused", kv_partition=0)
    with pytest.raises(InvalidValueError, match="decode_kv_partition"):
        dataclasses.replace(vllm, decode_kv_partition=-1)
