"""The ``hwgpt`` space (HW-GPT-Bench's GPT): build, capture, parameter formula, row reader, Optuna suggest."""

from __future__ import annotations

import pytest
import torch

import search_spaces as ss
from dippm_nas.errors import SearchSpaceError

TINY = {"embed_dim": 32, "depth": 2, "num_heads": [1, 2], "mlp_ratio": [2, 3], "bias": True, "seq_len": 16,
        "vocab_size": 100, "head_size": 16, "rotary_dims": 4}
#: a released row (HW-GPT-Bench s-00004) and its published parameter count
ROW = {"n_embd": "384", "n_layer": "11", "n_head_per_layer": "8;12;12;8;12;12;4;8;8;8;4",
       "mlp_ratio_per_layer": "3;3;2;3;4;4;4;3;4;4;4", "bias": "True", "head_size": "64",
       "padded_vocab_size": "50254", "seq_len": "1024"}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("bias", [False, True])
def test_tiny_config_builds_and_its_count_is_the_formula(bias: bool) -> None:
    cfg = {**TINY, "bias": bias}
    model = ss.build_model("hwgpt", cfg)
    assert sum(p.numel() for p in model.parameters()) == ss.hwgpt_param_count(cfg)
    # by hand: 2 tables, per layer qkv+proj, SwiGLU, 2 LayerNorms (+ biases), final LayerNorm
    e, v = 32, 100
    hand = 2 * v * e + 2 * e + sum(4 * h * 16 * e + 3 * r * e * e + 4 * e for h, r in ((1, 2), (2, 3)))
    if bias:
        hand += sum(3 * h * 16 + e + 2 * r * e + e for h, r in ((1, 2), (2, 3)))
    assert ss.hwgpt_param_count(cfg) == hand
    args, kwargs = ss.get_space("hwgpt").input_spec(cfg, batch_size=2).example_inputs()
    assert model(*args, **kwargs).shape == (2, 16, 100)


def test_tiny_config_captures() -> None:
    from dippm_nas import capture

    cfg = ss.get_space("hwgpt").validate(TINY)
    g = capture(ss.build_model("hwgpt", cfg), ss.get_space("hwgpt").input_spec(cfg, batch_size=2), cache=False)
    # the graph counts constants too: each block's float32 rotary cos/sin tables (seq_len x rotary_dims)
    assert g.param_count == ss.hwgpt_param_count(cfg) + cfg["depth"] * 2 * cfg["seq_len"] * cfg["rotary_dims"]
    assert any("attention" in n.op for n in g.nodes)


def test_causal_rope_attention_is_causal() -> None:
    model = ss.build_model("hwgpt", TINY)
    ids = torch.randint(0, 100, (1, 16))
    changed = ids.clone()
    changed[0, 10] = (ids[0, 10] + 1) % 100
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.allclose(a[0, :10], b[0, :10]) and not torch.allclose(a[0, 10:], b[0, 10:])


def test_row_reader_matches_the_published_count() -> None:
    cfg = ss.config_from_hwgpt_row(ROW)
    assert cfg["depth"] == 11 and cfg["num_heads"][1] == 12 and cfg["bias"] is True
    assert ss.hwgpt_param_count(cfg) == 64_915_968  # the row's ``params`` column


@pytest.mark.parametrize("change,match", [
    ({"bias": "yes"}, r"'bias' must be 'True' or 'False', got 'yes'"),
    ({"n_layer": "x"}, r"'n_layer' must be an integer, got 'x'"),
    ({"n_head_per_layer": "8;a"}, r"'n_head_per_layer' must be integers joined by ';'"),
    ({"n_layer": "10"}, r"'num_heads' must have 'depth' \(10\) items, got 11"),
])
def test_row_reader_rejects_bad_rows(change: dict, match: str) -> None:
    with pytest.raises(SearchSpaceError, match=match):
        ss.config_from_hwgpt_row({**ROW, **change})


def test_row_reader_names_missing_columns() -> None:
    row = {k: v for k, v in ROW.items() if k != "head_size"}
    with pytest.raises(SearchSpaceError, match=r"lacks columns \['head_size'\]"):
        ss.config_from_hwgpt_row(row)


def test_bad_config_is_rejected() -> None:
    with pytest.raises(SearchSpaceError, match=r"'rotary_dims' must be <= 'head_size' \(16\), got 32"):
        ss.get_space("hwgpt").validate({**TINY, "rotary_dims": 32})


@pytest.mark.parametrize("space", ["s", "m", "l"])
def test_suggest_gives_a_config_of_the_benchmark_space(space: str) -> None:
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    cfg = ss.suggest_hwgpt(study.ask(), space)
    c = ss.HWGPT_CHOICES[space]
    assert cfg["embed_dim"] in c["embed_dim"] and cfg["depth"] in c["depth"]
    assert set(cfg["num_heads"]) <= set(c["num_heads"]) and len(cfg["mlp_ratio"]) == cfg["depth"]
    small = {**cfg, "seq_len": 8, "vocab_size": 50}  # buildable on a CPU in a test
    model = ss.build_model("hwgpt", small)
    assert sum(p.numel() for p in model.parameters()) == ss.hwgpt_param_count(small)


def test_suggest_rejects_an_unknown_space() -> None:
    with pytest.raises(SearchSpaceError, match=r"must be one of \['l', 'm', 's'\], got 'xl'"):
        ss.suggest_hwgpt(object(), "xl")


def test_sample_is_in_the_space_and_deterministic() -> None:
    space = ss.get_space("hwgpt")
    assert space.sample(5) == space.sample(5)
    assert len(space.sample(5)["num_heads"]) == space.sample(5)["depth"]
