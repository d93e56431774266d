"""Hostile decoder configs and workloads: every size a user can give is bounded by what a GPU can hold (or by
what every published decoder stays far below), and each bad value is an ``InvalidValueError`` naming it, the
limit and why; never a RecursionError, ZeroDivisionError, OverflowError, MemoryError or a silent float16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from _hang import within as _within
from dippm_nas.errors import DippmNasError, InvalidValueError
from dippm_nas.llm import LLMWorkload, config_from_transformers, decoder_config, predict_generation
from dippm_nas.llm._config import DTYPE_ALIASES, SIZE_LIMITS

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 128}
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "vocab_size": 100}
BLOOM = {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100}


def within(fn: Any, seconds: float = 60.0) -> Any:
    """``fn()``; the test fails if it runs longer than ``seconds`` (a size that is not bounded)."""
    return _within(fn, seconds=seconds)


@pytest.mark.parametrize("dtype", ["float8", "int8", "float64", "auto", ["float16"], 16])
def test_a_torch_dtype_that_is_not_modelled_is_an_error_never_float16(dtype: Any) -> None:
    with pytest.raises(InvalidValueError, match="torch_dtype .* is not a weights dtype modelled here; choices"):
        decoder_config({**LLAMA, "torch_dtype": dtype})
    # the weights' dtype can be chosen explicitly instead
    assert decoder_config({**LLAMA, "torch_dtype": dtype}, dtype="bfloat16").dtype == "bfloat16"


def test_dtype_spellings_are_an_explicit_mapping() -> None:
    for alias, name in DTYPE_ALIASES.items():
        assert decoder_config({**LLAMA, "torch_dtype": alias}).dtype == name
    assert decoder_config({**LLAMA, "torch_dtype": "torch.bfloat16"}).dtype == "bfloat16"
    assert decoder_config(LLAMA).dtype == "float16"  # a config naming no dtype


class _NanoCfg:
    n_layer, n_head, n_embd, vocab_size, block_size, bias = 2, 3, 64, 100, 64, True


class _NanoGPT:
    config = _NanoCfg()


@pytest.mark.parametrize("config", [
    {**GPT2, "n_head": 3},
    {**LLAMA, "num_attention_heads": 3},
    {**BLOOM, "n_head": 3},
    _NanoGPT(),
    {"n_layer": 2, "n_head": 3, "n_embd": 64, "vocab_size": 100, "block_size": 64},  # nanoGPT's fields as a dict
], ids=["gpt2-dict", "llama-dict", "bloom-dict", "nanogpt-module", "nanogpt-config-dict"])
def test_one_head_check_for_every_form_of_config(config: Any) -> None:
    class Module:
        pass

    if isinstance(config, dict) and "model_type" not in config:
        module = Module()
        module.config = config  # type: ignore[attr-defined]
        config = module
    with pytest.raises(InvalidValueError, match=r"hidden size \(64\) must be a multiple of its attention heads \(3\)"):
        decoder_config(config)
    # an explicit head_dim decides, as transformers' Llama reads it
    assert decoder_config({**LLAMA, "num_attention_heads": 3, "head_dim": 32}).head_dim == 32


@pytest.mark.parametrize("key, value, match", [
    ("num_attention_heads", 0, "num_attention_heads .* must be an int >= 1"),
    ("hidden_size", float("nan"), "hidden_size .* got nan"),
    ("hidden_size", float("inf"), "hidden_size .* got inf"),
    ("hidden_size", 64.5, "hidden_size .* got 64.5"),
    ("hidden_size", "64", "hidden_size .* got '64'"),
    ("hidden_size", True, "hidden_size .* got True"),
    ("hidden_size", 2**20 + 1, "at most 1,048,576: one 2\\*\\*20 x 2\\*\\*20 float16 weight matrix is 2 TiB"),
    ("num_hidden_layers", 10**6, "at most 1,024: the deepest published decoder has 126 blocks"),
    ("num_hidden_layers", 10**400, "an int of 1329 bits"),
    ("vocab_size", [100], "vocab_size .* got \\[100\\]"),
    ("max_position_embeddings", 2**40, "at most 2,147,483,648"),
    ("num_local_experts", float("nan"), "num_local_experts"),
    ("partial_rotary_factor", float("nan"), "partial_rotary_factor .* must be a number in \\(0, 1\\]"),
    ("sliding_window", -5, "sliding_window"),
])
def test_every_size_is_an_int_within_its_limit(key: str, value: Any, match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        within(lambda: decoder_config({**LLAMA, key: value}))


def test_size_limits_hold_for_a_decoder_config_built_directly() -> None:
    cfg = decoder_config(LLAMA)
    import dataclasses

    for field, value in (("num_layers", 10**6), ("hidden_size", 2**21), ("vocab_size", 2**25)):
        with pytest.raises(InvalidValueError, match=f"DecoderConfig.{field} must be an int >= 1 and at most"):
            dataclasses.replace(cfg, **{field: value})
    assert set(SIZE_LIMITS) == {"layers", "width", "vocab", "positions", "experts"}


def test_a_deeply_nested_config_json_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidValueError, match="nests arrays/objects 100000 levels deep"):
        decoder_config(p)
    with pytest.raises(InvalidValueError, match="nests arrays/objects"):
        decoder_config(tmp_path)  # the folder holding config.json


def test_an_alibi_prompt_beyond_the_device_memory_is_refused_with_the_physics() -> None:
    with pytest.raises(InvalidValueError, match="one sequence's KV cache alone takes .* GiB .* more than the .* GiB "
                                                "of 'a100-sxm4-40gb'; at most .* tokens per sequence fit there"):
        within(lambda: predict_generation(BLOOM, LLMWorkload(10**12, 1, 1), mig=False))
    with pytest.raises(InvalidValueError, match="KV cache alone"):
        within(lambda: predict_generation(BLOOM, LLMWorkload(8, 10**12, 1), mig=False))
    p = within(lambda: predict_generation(BLOOM, LLMWorkload(4096, 16, 1), mig=False))  # long, but it fits
    assert p.e2e_ms > 0 and p.max_batch >= 1


def test_a_serving_batch_of_billions_of_waves_is_refused_not_built() -> None:
    with pytest.raises(InvalidValueError, match="would run in 3,906,250,000 waves .* at most 100,000 waves"):
        within(lambda: predict_generation(LLAMA, LLMWorkload(8, 2, 10**12), runtime="serving", mig=False))


def test_a_huge_eager_batch_is_an_error() -> None:
    with pytest.raises(DippmNasError, match="batch_size"):
        within(lambda: predict_generation(LLAMA, LLMWorkload(8, 2, 10**12), mig=False))


@pytest.mark.parametrize("kv_dtype", [["float16"], {"float16": 1}, 16, b"float16"])
def test_a_kv_dtype_of_another_type_is_an_error(kv_dtype: Any) -> None:
    with pytest.raises(InvalidValueError, match="LLMWorkload.kv_dtype must be None"):
        LLMWorkload(8, 2, 1, kv_dtype=kv_dtype)


def test_config_from_transformers_dtype_is_checked() -> None:
    with pytest.raises(InvalidValueError, match="dtype must be one of"):
        config_from_transformers(LLAMA, dtype="float8")
    assert config_from_transformers(LLAMA, dtype="float32").dtype == "float32"
