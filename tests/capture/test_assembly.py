"""Assembly of search-space candidates from cached blocks: exactness against whole captures, caching, bad input.

Every opted-in space is checked on a tiny config (fast); ``-m slow`` adds random configs of each space.
``benchmarks/speed/bench_assembly.py`` checks 100 random configs per space.
"""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from torch import nn

import dippm_nas
import search_spaces as ss
from dippm_nas import InputSpec, OperatorGraph
from dippm_nas.cache import ConversionCache
from dippm_nas.capture import (
    _assemble,
    assemble,
    assemble_chunks,
    assemble_many,
    block_key,
    capture,
    clear_block_memo,
    space_config_of,
    supports_assembly,
)
from dippm_nas.errors import GraphCaptureError, InputSpecError, InvalidValueError, SearchSpaceError
from dippm_nas.graph import node_columns
from dippm_nas.optuna import HardwareCostModel
from search_spaces import Block, BlockInput, BlockPlan, BlockSearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: Registered spaces that do not assemble from blocks (and why: docs/search_space_assembly.md). None today.
NOT_OPTED_IN: set[str] = set()

#: A small config of each space that still has every kind of block (first / later blocks of a stage,
#: residuals, multi-input blocks) so its whole capture takes well under a second.
TINY: dict[str, dict[str, Any]] = {
    "mbconv": {"e": [1, 4, 6, 1, 4, 6, 1], "k": [3, 5, 3, 5, 3, 5, 3], "l": [1, 2, 1, 1, 1, 1, 1],
               "se": [True, False, True, False, True, False, True], "resolution": 32, "num_classes": 10},
    "resnet": {"block": "bottleneck", "depths": [2, 1], "widths": [8, 16], "stem": "imagenet", "stem_width": 8,
               "groups": 2, "width_per_group": 64, "resolution": 33, "num_classes": 10},
    "regnet": {"depths": [1, 2], "widths": [16, 32], "group_width": 8, "bottleneck_ratio": 1.0, "se": True,
               "stem_width": 8, "resolution": 32, "num_classes": 10},
    "mobilenetv3": {"stem_width": 8, "blocks": [{"k": 3, "exp": 8, "out": 8, "se": True, "act": "relu", "s": 1},
                                                {"k": 5, "exp": 24, "out": 16, "se": False, "act": "hardswish", "s": 2},
                                                {"k": 3, "exp": 32, "out": 16, "se": True, "act": "hardswish", "s": 1}],
                    "head_width": 32, "classifier_width": 16, "resolution": 32, "num_classes": 10},
    "efficientnetv2": {"stem_width": 8, "stages": [
        {"type": "fused", "expand": 1, "kernel": 3, "stride": 1, "out": 8, "layers": 2, "se": False},
        {"type": "fused", "expand": 2, "kernel": 3, "stride": 2, "out": 16, "layers": 1, "se": False},
        {"type": "mbconv", "expand": 2, "kernel": 3, "stride": 2, "out": 24, "layers": 2, "se": True}],
        "head_width": 32, "resolution": 32, "num_classes": 10},
    "densenet": {"growth_rate": 4, "block_layers": [2, 1], "init_width": 8, "bn_size": 2, "compression": 0.5,
                 "stem": "cifar", "resolution": 16, "num_classes": 10},
    "convnext": {"depths": [1, 2], "widths": [8, 16], "kernel_size": 3, "mlp_ratio": 2, "patch_size": 2,
                 "layer_scale": True, "resolution": 16, "num_classes": 10},
    "vgg": {"stage_depths": [1, 2], "widths": [8, 16], "batch_norm": True, "pool_size": 2,
            "classifier_widths": [16], "resolution": 16, "num_classes": 10},
    "convmixer": {"dim": 16, "depth": 2, "kernel_size": 3, "patch_size": 4, "activation": "gelu", "resolution": 16,
                  "num_classes": 10},
    "mixer": {"patch_size": 4, "hidden": 16, "depth": 2, "tokens_mlp_dim": 8, "channels_mlp_dim": 32,
              "resolution": 16, "num_classes": 10},
    "vit": {"patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 2, "qkv_bias": False,
            "pool": "cls", "attention": "explicit", "resolution": 16, "num_classes": 10},
    "vitc": {"patch_size": 4, "stem_widths": [8, 16], "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 2,
             "qkv_bias": True, "pool": "mean", "attention": "sdpa", "resolution": 16, "num_classes": 10},
    "bert": {"vocab_size": 50, "seq_len": 8, "max_position": 16, "type_vocab_size": 2, "hidden": 16, "depth": 2,
             "num_heads": 2, "intermediate": 32, "attention": "explicit", "num_classes": 3},
    "mlp": {"in_features": 12, "hidden": [16, 8], "activation": "gelu", "norm": "batchnorm", "out_features": 3},
    "hwgpt": {"embed_dim": 32, "depth": 3, "num_heads": [1, 2, 1], "mlp_ratio": [2, 3, 2], "bias": True, "seq_len": 8,
              "vocab_size": 50, "head_size": 16, "rotary_dims": 4},
    "demo_cnn": {"resolution": 8, "widths": [8, 16], "blocks": [2, 1], "kernel_size": 3, "batchnorm": False,
                 "activation": "silu", "in_channels": 1, "num_classes": 10},
}

OPTED_IN = sorted(n for n in ss.list_spaces() if n not in NOT_OPTED_IN)


@pytest.fixture
def cache(tmp_path: Path) -> Any:
    clear_block_memo()
    c = ConversionCache(f"sqlite:///{tmp_path / 'blocks.sqlite'}")
    yield c
    c.close()
    clear_block_memo()


def _assert_same_graph(assembled: OperatorGraph, whole: OperatorGraph) -> None:
    """The assembled graph is the whole capture's, field by field (not just the hash)."""
    assert assembled.structural_hash() == whole.structural_hash()
    assert OperatorGraph.from_dict(assembled.to_dict()).structural_hash() == whole.structural_hash()  # no shortcut
    # provenance apart: the whole capture's nodes carry their module stacks, an assembled graph's none
    assert not assembled.has_provenance
    assert [n.to_dict() for n in assembled.nodes] == [
        {k: v for k, v in n.to_dict().items() if k not in ("ms", "ip")} for n in whole.nodes]
    assert assembled.edges == whole.edges and assembled.outputs == whole.outputs
    assert assembled.input_consumers == whole.input_consumers
    assert (assembled.param_count, assembled.param_bytes) == (whole.param_count, whole.param_bytes)
    assert assembled.mode == whole.mode and assembled.spec == whole.spec
    assembled.validate()
    # the node columns it carries (its blocks', concatenated) are the ones read from its own nodes
    own, carried = node_columns(OperatorGraph.from_dict(assembled.to_dict())), node_columns(assembled)
    assert own.keys() == carried.keys()
    assert all(own[k].dtype == carried[k].dtype and (own[k] == carried[k]).all() for k in own)


def test_every_registered_space_opts_in_or_is_listed() -> None:
    # the package's own spaces, as a fresh process registers them (tests may register more in this one)
    code = "import json, search_spaces; print(json.dumps(search_spaces.list_spaces()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    shipped = set(json.loads(out.stdout))
    assert shipped == set(TINY) | NOT_OPTED_IN
    assert {n for n in shipped if supports_assembly(n)} == set(TINY)
    assert not any(supports_assembly(n) for n in NOT_OPTED_IN)


@pytest.mark.parametrize("name", OPTED_IN)
def test_assembled_graph_is_the_whole_capture(name: str, cache: ConversionCache) -> None:
    space = ss.get_space(name)
    cfg = space.validate(TINY[name])
    spec = space.input_spec(cfg, batch_size=2, dtype="float16" if len(name) % 2 else "float32")
    g = assemble(name, cfg, spec, cache=cache, fallback=False)
    assert g.source == f"{name} (assembled from {len(space.blocks(cfg).blocks)} blocks)" and not g.cache_hit
    _assert_same_graph(g, capture(space.build(cfg), spec, cache=False))
    again = assemble(name, cfg, spec, cache=cache, fallback=False)
    assert again.cache_hit and again.structural_hash() == g.structural_hash()


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTED_IN)
def test_random_configs_assemble_exactly(name: str, cache: ConversionCache) -> None:
    space = ss.get_space(name)
    for seed in range(5):
        cfg = space.sample(seed)
        spec = space.input_spec(cfg, batch_size=random.Random(seed).choice((1, 4)),
                                dtype=("float32", "float16")[seed % 2])
        results = assemble_many([(name, cfg, spec)], cache=cache, fallback=False)
        assert results[0].ok, results[0].error
        _assert_same_graph(results[0].graph, capture(space.build(cfg), spec, cache=False))


def test_blocks_are_cached_under_their_own_key_and_captured_once(cache: ConversionCache,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    space = ss.get_space("vit")
    cfg = {**TINY["vit"], "depth": 4}
    spec = space.input_spec(cfg, batch_size=2)
    calls: list[Any] = []
    real = _assemble.capture
    monkeypatch.setattr(_assemble, "capture", lambda m, s, **kw: calls.append(type(m).__name__) or real(m, s, **kw))
    g = assemble("vit", cfg, spec, cache=cache)
    assert sorted(calls) == ["TransformerBlock", "ViTEmbed", "ViTHead"]  # 4 layers, one capture
    plan = space.blocks(cfg)
    keys = {block_key("vit", b, spec) for b in plan.blocks}
    assert len(keys) == 3 and all(k.startswith("block:") for k in keys)
    assert all(cache.get(k) is not None for k in keys)
    # another batch size is another block
    assert block_key("vit", plan.blocks[1], spec.with_batch_size(4)) not in keys

    # a fresh process (nothing decoded) reads the blocks from the conversion cache; nothing is captured
    clear_block_memo()
    monkeypatch.setattr(_assemble, "capture", lambda *a, **k: pytest.fail("a cached block was captured again"))
    again = assemble("vit", cfg, spec, cache=cache)
    assert again.cache_hit and again.structural_hash() == g.structural_hash()
    # a deeper candidate of the same blocks needs no capture either
    deeper = assemble("vit", {**cfg, "depth": 6}, spec, cache=cache)
    assert deeper.num_nodes > g.num_nodes


def test_config_outside_the_space_names_the_key_and_its_values(cache: ConversionCache) -> None:
    spec = InputSpec(shape=(3, 32, 32), batch_size=1)
    bad = {**TINY["mbconv"], "e": [7, 4, 6, 1, 4, 6, 1]}
    with pytest.raises(SearchSpaceError, match=r"'e'\[0\] must be one of \[1, 4, 6\], got 7"):
        assemble("mbconv", bad, spec, cache=cache)
    with pytest.raises(SearchSpaceError, match=r"unknown keys \['depthz'\]; valid keys are"):
        assemble("resnet", {"depthz": [1]}, spec, cache=cache)
    with pytest.raises(SearchSpaceError, match="unknown search space 'nope'; choices"):
        assemble("nope", {}, spec, cache=cache)
    with pytest.raises(InputSpecError, match="spec must be a dippm_nas.InputSpec"):
        assemble("mbconv", TINY["mbconv"], "3,32,32", cache=cache)  # type: ignore[arg-type]
    res = assemble_many([("mbconv", bad, spec), ("mbconv", TINY["mbconv"], spec)], cache=cache)
    assert [r.ok for r in res] == [False, True]
    assert res[0].error_type == "SearchSpaceError" and "one of [1, 4, 6]" in res[0].error


# ------------------------------------------------------------------ a user's own space
class _Stage(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class _Head(nn.Module):
    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


class _DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


class _ConvStack(nn.Module):
    def __init__(self, widths: list[int], num_classes: int, bad: bool = False) -> None:
        super().__init__()
        self.stages = nn.Sequential(*[_Stage(a, b) for a, b in zip([3, *widths], widths)])
        self.bad = _DataDependent() if bad else None
        self.head = _Head(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(x)
        if self.bad is not None:
            x = self.bad(x)
        return self.head(x)


class ConvStackSpace(BlockSearchSpace):
    """The example of docs/search_space_assembly.md (plus a block that cannot be exported, for the tests)."""

    name = "convstack_test"
    params = {"widths": ss.ListOf(ss.IntRange(4, 64), 1, 4), "bad": ss.Choice(True, False),
              "resolution": ss.IntRange(8, 256), "num_classes": ss.IntRange(1, 100)}

    def default_config(self) -> dict[str, Any]:
        return {"widths": [8, 16], "bad": False, "resolution": 16, "num_classes": 10}

    def _build(self, cfg: dict[str, Any]) -> nn.Module:
        return _ConvStack(cfg["widths"], cfg["num_classes"], cfg["bad"])

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        return {"widths": [rng.choice((8, 16))], "bad": False, "resolution": 16, "num_classes": 10}

    def _blocks(self, cfg: dict[str, Any]) -> BlockPlan:
        side, cin, parts = cfg["resolution"], 3, []
        for w in cfg["widths"]:
            parts.append(("stage", {"cin": cin, "cout": w}, (cin, side, side)))
            cin, side = w, (side + 1) // 2
        if cfg["bad"]:
            parts.append(("bad", {}, (cin, side, side)))
        parts.append(("head", {"cin": cin, "num_classes": cfg["num_classes"]}, (cin, side, side)))
        return BlockPlan.chain(parts)

    def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
        if kind == "stage":
            return _Stage(params["cin"], params["cout"])
        if kind == "bad":
            return _DataDependent()
        return _Head(params["cin"], params["num_classes"])


def test_a_users_space_assembles_exactly(cache: ConversionCache) -> None:
    space = ConvStackSpace()
    cfg = space.validate({"widths": [8, 16, 8]})
    spec = space.input_spec(cfg, batch_size=3)
    g = assemble(space, cfg, spec, cache=cache, fallback=False)
    _assert_same_graph(g, capture(space.build(cfg), spec, cache=False))
    assert len(space.code_digest()) == 20 and space.code_digest() != ss.get_space("mbconv").code_digest()


def test_a_failing_block_fails_only_the_candidates_that_use_it(cache: ConversionCache) -> None:
    space = ConvStackSpace()
    good, bad = space.validate({"widths": [8]}), space.validate({"widths": [8], "bad": True})
    spec = space.input_spec(good, batch_size=2)
    res = assemble_many([(space, bad, spec), (space, good, spec)], cache=cache)
    assert [r.ok for r in res] == [False, True]
    assert res[0].error_type == "GraphCaptureError"
    assert "block 1 (bad {} on x(8, 8, 8)) could not be captured" in res[0].error
    assert "data-dependent control flow" in res[0].error
    _assert_same_graph(res[1].graph, capture(space.build(good), spec, cache=False))
    with pytest.raises(GraphCaptureError, match="block 1 \\(bad"):
        assemble(space, bad, spec, cache=cache)


def test_spec_other_than_the_spaces_is_captured_whole_or_refused(cache: ConversionCache) -> None:
    cfg = ss.get_space("resnet").validate(TINY["resnet"])
    spec = InputSpec(shape=(3, 40, 40), batch_size=2)  # the config says 33 x 33
    g = assemble("resnet", cfg, spec, cache=cache)
    assert "assembled" not in g.source
    assert g.structural_hash() == capture(ss.build_model("resnet", cfg), spec, cache=False).structural_hash()
    with pytest.raises(InputSpecError, match="assembly needs the space's own input"):
        assemble("resnet", cfg, spec, cache=cache, fallback=False)


def test_space_without_blocks_is_captured_whole(cache: ConversionCache) -> None:
    class Plain(ss.SearchSpace):
        name = "plain_test"
        params = {"width": ss.IntRange(2, 16)}

        def default_config(self) -> dict[str, Any]:
            return {"width": 4}

        def _build(self, cfg: dict[str, Any]) -> nn.Module:
            return nn.Sequential(nn.Linear(3, cfg["width"]), nn.ReLU())

        def _sample(self, rng: random.Random) -> dict[str, Any]:
            return {"width": 4}

        def input_spec(self, config: Any, batch_size: int = 1, dtype: str = "float32") -> InputSpec:
            return InputSpec(shape=(3,), batch_size=batch_size, dtype=dtype)

    space = Plain()
    assert not supports_assembly(space)
    g = assemble(space, {"width": 5}, InputSpec(shape=(3,), batch_size=2), cache=cache)
    assert g.num_nodes >= 2 and "assembled" not in g.source
    with pytest.raises(SearchSpaceError, match="does not assemble candidates from blocks.*'mbconv'"):
        assemble(space, {"width": 5}, InputSpec(shape=(3,), batch_size=2), cache=cache, fallback=False)


def test_a_broken_plan_is_named(cache: ConversionCache) -> None:
    class Broken(ConvStackSpace):
        name = "broken_test"

        def _blocks(self, cfg: dict[str, Any]) -> BlockPlan:
            stage = Block("stage", {"cin": 3, "cout": 8}, (BlockInput((1, 0), (3, 16, 16)),))
            return BlockPlan((stage, stage), ((1, 0),))

    with pytest.raises(SearchSpaceError, match=r"block 0 \(stage\) reads \(1, 0\); a source must be"):
        Broken().blocks({})

    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x.relu()  # the first output is the input passed through: no node produces it

    class PassThrough(ConvStackSpace):
        name = "passthrough_test"

        def _blocks(self, cfg: dict[str, Any]) -> BlockPlan:
            pair = Block("pair", {}, (BlockInput("x", (3, 16, 16)),), num_outputs=2)
            head = Block("head", {"cin": 3, "num_classes": 2}, (BlockInput((0, 1), (3, 16, 16)),))
            return BlockPlan((pair, head), ((1, 0),))

        def _build_block(self, kind: str, params: dict[str, Any]) -> nn.Module:
            return Pair() if kind == "pair" else super()._build_block(kind, params)

    space = PassThrough()
    with pytest.raises(GraphCaptureError, match="block 0 \\(pair.*1 output node\\(s\\) where its plan says 2"):
        assemble(space, {}, space.input_spec(space.validate({})), cache=cache, fallback=False)


def test_space_config_of_tells_space_models_apart() -> None:
    cfg = ss.get_space("mlp").validate(TINY["mlp"])
    model = ss.build_model("mlp", cfg)
    assert space_config_of(model) == ("mlp", cfg)
    assert space_config_of(model.half()) == ("mlp", cfg)  # a cast keeps the structure
    assert space_config_of(functools.partial(ss.build_model, "mlp", cfg)) == ("mlp", cfg)
    assert space_config_of(functools.partial(ss.build_model, "mlp", cfg, seed=3)) is None
    assert space_config_of(nn.Linear(2, 2)) is None
    model.net[0] = nn.Linear(12, 17)  # changed after building: its config no longer describes it
    assert space_config_of(model) is None


@pytest.mark.filterwarnings("ignore:no trained predictor checkpoint")
def test_predict_many_and_evaluate_assemble_space_models(cache: ConversionCache,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import dippm_nas.predictor._api as api

    cfg = ss.get_space("mlp").validate(TINY["mlp"])
    spec = ss.get_space("mlp").input_spec(cfg, batch_size=4)
    expected = dippm_nas.predict(capture(ss.build_model("mlp", cfg), spec, cache=False), device="h100-sxm5-80gb")
    monkeypatch.setattr(api, "capture_many", lambda *a, **k: pytest.fail("a space model was exported whole"))
    preds = dippm_nas.predict_many([(ss.build_model("mlp", cfg), spec),
                                    (functools.partial(ss.build_model, "mlp", cfg), spec)],
                                   device="h100-sxm5-80gb", cache=cache)
    assert [p.latency_ms for p in preds] == pytest.approx([expected.latency_ms] * 2)

    cost = HardwareCostModel(device="h100-sxm5-80gb", cache=cache)
    study = cost.create_study()
    trial = study.ask()
    values = cost.evaluate(trial, space="mlp", config=cfg, spec=spec)
    assert values[0] == pytest.approx(expected.latency_ms)
    assert trial.user_attrs["search_space"] == "mlp" and trial.user_attrs["search_space_config"] == cfg
    bad = study.ask()
    with pytest.raises(SearchSpaceError, match=r"'norm' must be one of"):
        cost.evaluate(bad, space="mlp", config={**cfg, "norm": "groupnorm"}, spec=spec)
    assert "SearchSpaceError" in bad.user_attrs["cost_model_error"]


def test_blocks_in_mixed_conversion_modes_are_not_stitched(cache: ConversionCache) -> None:
    space = ConvStackSpace()
    cfg = space.validate({"widths": [8, 8]})
    spec = space.input_spec(cfg, batch_size=2)
    g = assemble(space, cfg, spec, cache=cache)
    preps = [_assemble._MEMO.get(block_key(space, b, spec)) for b in space.blocks(cfg).blocks]
    assert all(p is not None and p.mode == "export" for p in preps)
    preps[-1].mode = "export+decompose"  # as if the head alone had needed the decomposing fallback
    with pytest.raises(GraphCaptureError, match=r"modes \['export', 'export\+decompose'\]"):
        assemble(space, cfg, spec, cache=cache, fallback=False)
    whole = assemble(space, cfg, spec, cache=cache)  # a whole capture decomposes everything or nothing
    assert "assembled" not in whole.source and whole.structural_hash() == g.structural_hash()
    for p in preps:
        p.mode = "export+decompose"
    assert assemble(space, cfg, spec, cache=cache, fallback=False).mode == "export+decompose"
    preps[0].mode = "export+opaque"
    for p in preps[1:]:
        p.mode = "export"
    assert assemble(space, cfg, spec, cache=cache, fallback=False).mode == "export+opaque"


def test_assemble_chunks_gives_assemble_many_results_a_chunk_at_a_time(cache: ConversionCache,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    space = ss.get_space("mlp")
    cfgs = [space.validate({**TINY["mlp"], "hidden": h}) for h in ([16, 8], [8], [16, 8], [12, 4], [8])]
    items: list[Any] = [("mlp", c, space.input_spec(c, batch_size=2)) for c in cfgs]
    items.insert(2, ("mlp", {**cfgs[0], "norm": "groupnorm"}, items[0][2]))  # outside the space: fails alone
    whole = [r.graph for r in assemble_many(items, cache=cache)]
    captured = []
    real = _assemble._capture_items
    monkeypatch.setattr(_assemble, "_capture_items", lambda its, *a: captured.append(len(its)) or real(its, *a))
    clear_block_memo()
    chunks = list(assemble_chunks(items, chunk_size=2, cache=False))
    assert len(captured) == 1  # every missing block captured in one pass, before the first chunk
    assert [[r.index for r in c] for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    results = [r for c in chunks for r in c]
    assert "SearchSpaceError" in (results[2].error or "") and results[2].graph is None
    for r, g in zip(results, whole):
        if r.index != 2:
            _assert_same_graph(r.graph, g)
    with pytest.raises(InvalidValueError, match="chunk_size"):
        next(assemble_chunks(items, chunk_size=0))


def test_candidates_share_placed_block_nodes_within_the_bound(cache: ConversionCache,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    space = ss.get_space("mlp")
    a, b = (space.validate({**TINY["mlp"], "hidden": h}) for h in ([16, 8], [16, 4]))
    ga, gb = (assemble("mlp", c, space.input_spec(c, batch_size=2), cache=cache) for c in (a, b))
    # the first layer sits at offset 0 in both: its nodes are the same (frozen) objects, later ones differ
    assert ga.nodes[0] is gb.nodes[0] and ga.nodes[-1] is not gb.nodes[-1]
    whole = capture(ss.build_model("mlp", b), space.input_spec(b, batch_size=2), cache=False)
    _assert_same_graph(gb, whole)
    clear_block_memo()
    monkeypatch.setattr(_assemble, "PLACED_MEMO_NODES", 0)  # nothing kept: each candidate gets its own nodes
    gc_, gd = (assemble("mlp", a, space.input_spec(a, batch_size=2), cache=cache) for _ in range(2))
    assert gc_.nodes[0] is not gd.nodes[0] and gc_.structural_hash() == gd.structural_hash() == ga.structural_hash()
    assert _assemble._placed_nodes == 0


def test_a_graph_that_passed_validation_is_checked_again_once_its_lists_change(cache: ConversionCache) -> None:
    from dippm_nas.errors import GraphValidationError

    space = ss.get_space("mlp")
    cfg = space.validate(TINY["mlp"])
    g = assemble("mlp", cfg, space.input_spec(cfg, batch_size=2), cache=cache)
    assert g._passed()  # assembled graphs keep the rules by construction: the prior does not check them again
    OperatorGraph.from_dict(g.to_dict()).validate()  # and they do keep them
    g.edges = [*g.edges, (1, 0)]  # a new list: checked again, and the backward edge named
    with pytest.raises(GraphValidationError, match=r"edge \(1, 0\) goes backwards"):
        g.validate()
    g.edges = sorted(g.edges[:-1])
    g.validate()
    g.edges.append((g.num_nodes - 1, 0))  # the same list, longer: checked again
    with pytest.raises(GraphValidationError, match="goes backwards"):
        g.validate()
