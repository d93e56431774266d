"""Tests of ``search_spaces``: registry, config validation, samplers, Accel-NASBench exactness, and
build + forward + capture of every family at two sizes."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import search_spaces as ss
from dippm_nas.errors import SearchSpaceError
from search_spaces._layers import SqueezeExcite
from search_spaces._registry import _REGISTRY

@pytest.fixture(autouse=True)
def _one_thread():
    """Intra-op threads spin against each other on a busy 2-core machine (10x slower forwards): use one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


FAMILIES = (
    "bert", "convmixer", "convnext", "densenet", "efficientnetv2", "mbconv", "mixer", "mlp", "mobilenetv3",
    "regnet", "resnet", "vgg", "vit", "vitc",
)


# --------------------------------------------------------------------------- thop counting rules
def thop_macs(model: nn.Module, x: torch.Tensor) -> int:
    """MACs as thop 0.1.1 counts them (the rules of the Accel-NASBench ``mmacs`` column).

    conv: output elements x (cin / groups) x kh x kw (bias ignored); Linear: in_features x output
    elements; BatchNorm: 2 x input elements, doubled when affine; AdaptiveAvgPool: (kernel + 1) x output
    elements; everything else (ReLU, Hardsigmoid, Dropout, multiply, add) 0.
    """
    total = [0]

    def conv(m: nn.Conv2d, i: Any, o: torch.Tensor) -> None:
        total[0] += o.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def bn(m: nn.BatchNorm2d, i: Any, o: torch.Tensor) -> None:
        total[0] += 2 * i[0].numel() * (2 if m.affine else 1)

    def linear(m: nn.Linear, i: Any, o: torch.Tensor) -> None:
        total[0] += m.in_features * o.numel()

    def adaptive_avg(m: nn.AdaptiveAvgPool2d, i: Any, o: torch.Tensor) -> None:
        kernel = (i[0].shape[2] * i[0].shape[3]) // (o.shape[2] * o.shape[3])
        total[0] += (kernel + 1) * o.numel()

    hooks = {nn.Conv2d: conv, nn.BatchNorm2d: bn, nn.Linear: linear, nn.AdaptiveAvgPool2d: adaptive_avg}
    handles = [m.register_forward_hook(hooks[type(m)]) for m in model.modules() if type(m) in hooks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return total[0]


def _stages(text: str) -> dict[str, list]:
    """``"6/3/1/N 4/5/2/Y ..."`` (e/k/l/se per stage) -> mbconv config lists."""
    parts = [s.split("/") for s in text.split()]
    return {"e": [int(p[0]) for p in parts], "k": [int(p[1]) for p in parts], "l": [int(p[2]) for p in parts],
            "se": [p[3] == "Y" for p in parts]}


# Rows of accel_nasbench_mnasnet_space_throughput.csv (afzalxo/Accel-NASBench @42603572, result_<row>.json):
# e/k/l/se per stage 0..6, published mmacs, mparams. Rows 1141 and 4204 are the smallest and largest
# mmacs of the 5,138 rows; 2021 has SE in every stage; 5137 uses l = 4 in stage 5.
ANB_ROWS = {
    0: ("6/3/1/N 4/5/2/N 6/3/3/N 6/5/3/N 6/5/2/N 1/3/2/N 1/3/2/N", 415.361072, 2.501160),
    1: ("6/3/1/N 1/5/3/N 6/3/2/N 6/3/1/N 4/3/2/N 6/5/1/N 4/5/2/N", 372.732640, 3.444360),
    1000: ("1/3/1/N 4/5/1/N 1/3/2/N 1/3/3/N 1/3/2/N 4/3/1/N 4/5/1/N", 120.466528, 2.304144),
    1141: ("1/3/3/N 1/3/1/N 1/5/2/N 1/5/1/N 4/3/1/N 1/3/1/N 1/3/1/N", 84.141456, 1.858544),
    2021: ("6/3/2/Y 1/5/3/Y 1/5/1/Y 1/5/2/Y 4/3/1/Y 1/5/2/Y 4/5/1/Y", 308.152640, 2.399896),
    2500: ("1/5/3/N 1/3/2/N 4/5/3/Y 6/3/3/N 6/5/1/N 6/5/3/N 6/3/1/N", 287.642112, 3.837178),
    4204: ("6/5/3/N 4/5/2/N 6/3/1/N 1/3/1/Y 4/5/1/Y 6/3/4/Y 6/3/3/Y", 718.968488, 7.637218),
    5137: ("1/5/2/Y 6/5/3/N 4/5/3/Y 1/3/3/Y 4/3/1/N 4/5/4/Y 1/5/3/Y", 314.499704, 3.633820),
}
# Conv + linear MMACs at 224 of some of those rows, from the spec doc (accel_nasbench_space.md §5).
ANB_CONV_LINEAR_MMACS = {0: 375.724, 1000: 109.859, 5137: 286.601}


@pytest.mark.parametrize("row", sorted(ANB_ROWS))
def test_mbconv_reproduces_published_macs_and_params(row: int) -> None:
    text, mmacs, mparams = ANB_ROWS[row]
    model = ss.build_model("mbconv", {**_stages(text), "resolution": 224})
    params = sum(p.numel() for p in model.parameters())
    assert params == round(mparams * 1e6), f"row {row}: {params} parameters, published {mparams} M"
    macs = thop_macs(model, torch.randn(1, 3, 224, 224))
    assert macs == round(mmacs * 1e6), f"row {row}: {macs} MACs (thop rules), published {mmacs} M"


@pytest.mark.parametrize("row", sorted(ANB_CONV_LINEAR_MMACS))
def test_mbconv_conv_plus_linear_macs(row: int) -> None:
    model = ss.build_model("mbconv", {**_stages(ANB_ROWS[row][0]), "resolution": 224}).to("meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, 3, 224, 224, device="meta"))  # shapes only: no arithmetic needed
    counts = counter.get_flop_counts()["Global"]
    assert set(map(str, counts)) <= {"aten.convolution", "aten.addmm"}, counts
    mmacs = sum(counts.values()) / 2 / 1e6  # flop_counter counts 2 FLOPs per MAC
    assert mmacs == pytest.approx(ANB_CONV_LINEAR_MMACS[row], abs=5e-4)


def test_mbconv_skeleton_and_se_squeeze_follow_the_spec() -> None:
    cfg = {"e": [6] * 7, "k": [3] * 7, "l": [2, 2, 2, 2, 2, 4, 2], "se": [True] * 7}
    model = ss.build_model("mbconv", cfg)
    squeezes = [m.fc1.out_channels for m in model.modules() if isinstance(m, SqueezeExcite)]
    # sq = max(1, cin // 4) from each layer's input channels: first layers 8,4,6,10,20,28,48, later 4,6,...,80
    firsts, laters = [8, 4, 6, 10, 20, 28, 48], [4, 6, 10, 20, 28, 48, 80]
    expected = [s for i in range(7) for s in [firsts[i]] + [laters[i]] * (cfg["l"][i] - 1)]
    assert squeezes == expected
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 1000)
    assert model.stages[5][0].block[1][0].stride == (2, 2) and model.stages[5][1].block[1][0].stride == (1, 1)


def test_config_from_accel_nasbench_row() -> None:
    row = {"mmacs": "415.361072", "val_top1": "59.368"}
    for i, stage in enumerate("6/3/1/N 4/5/2/N 6/3/3/N 6/5/3/N 6/5/2/N 1/3/2/N 1/3/2/N".split()):
        e, k, n, se = stage.split("/")
        row.update({f"arch_block{i}_e": e, f"arch_block{i}_k": k, f"arch_block{i}_l": n,
                    f"arch_block{i}_se": "True" if se == "Y" else "False"})
    cfg = ss.config_from_accel_nasbench_row(row, resolution=256)
    assert cfg == {**_stages(ANB_ROWS[0][0]), "resolution": 256, "num_classes": 1000}
    back = ss.accel_nasbench_row_from_config(cfg)
    assert list(back) == list(ss.ACCEL_NASBENCH_COLUMNS)
    assert ss.config_from_accel_nasbench_row(back, resolution=256) == cfg

    with pytest.raises(SearchSpaceError, match=r"missing \['arch_block3_se'\]"):
        ss.config_from_accel_nasbench_row({k: v for k, v in row.items() if k != "arch_block3_se"})
    with pytest.raises(SearchSpaceError, match=r"'l'\[0\] must be one of \[1, 2, 3\], got 4"):
        ss.config_from_accel_nasbench_row({**row, "arch_block0_l": "4"})
    with pytest.raises(SearchSpaceError, match="arch_block2_se"):
        ss.config_from_accel_nasbench_row({**row, "arch_block2_se": "maybe"})
    with pytest.raises(SearchSpaceError, match="arch_block2_k"):
        ss.config_from_accel_nasbench_row({**row, "arch_block2_k": "3.5"})


# Parameter counts published by torchvision (weights meta "num_params") and Hugging Face (bert-base-uncased
# BertModel); efficientnet_b0 = the Accel-NASBench anchor (ReLU/Hardsigmoid do not change the count).
PRESET_PARAMS = [
    ("mbconv", "efficientnet_b0_relu", 5_288_548),
    ("resnet", "resnet18", 11_689_512),
    ("resnet", "resnet50", 25_557_032),
    ("resnet", "resnext50_32x4d", 25_028_904),
    ("mobilenetv3", "mobilenet_v3_large", 5_483_032),
    ("mobilenetv3", "mobilenet_v3_small", 2_542_856),
    ("densenet", "densenet121", 7_978_856),
    ("convnext", "convnext_tiny", 28_589_128),
    ("vit", "vit_b_16", 86_567_656),
    ("bert", "bert_base", 109_482_240),
    # counted on torchvision 0.29.1 / timm models built without weights
    ("regnet", "regnet_x_400mf", 5_495_976),
    ("regnet", "regnet_y_400mf", 4_344_144),
    ("regnet", "regnet_y_1_6gf", 11_202_430),
    ("vgg", "vgg11", 132_863_336),
    ("vgg", "vgg11_bn", 132_868_840),
    ("vgg", "vgg16", 138_357_544),
    ("efficientnetv2", "efficientnet_v2_s", 21_458_488),
    ("convmixer", "convmixer_768_32", 21_110_248),
    ("convmixer", "convmixer_1536_20", 51_625_960),
    ("mixer", "mixer_s16_224", 18_528_264),
    ("mixer", "mixer_b16_224", 59_880_472),
]


@pytest.mark.parametrize("space,preset,params", PRESET_PARAMS)
def test_presets_have_published_parameter_counts(space: str, preset: str, params: int) -> None:
    model = ss.build_model(space, ss.get_space(space).preset(preset), seed=None)
    assert sum(p.numel() for p in model.parameters()) == params


def test_every_preset_validates() -> None:
    for name in ss.list_spaces():
        space = ss.get_space(name)
        for preset in space.presets:
            assert space.preset(preset) == space.validate(space.preset(preset))
    with pytest.raises(SearchSpaceError, match="presets:.*resnet50"):
        ss.get_space("resnet").preset("resnet51")


# --------------------------------------------------------------------------- registry
def test_registry_lists_every_family() -> None:
    # the registry is open: other modules (the demo, tests) register spaces of their own beside these
    assert set(FAMILIES) <= set(ss.list_spaces())
    for name in FAMILIES:
        assert ss.get_space(name).name == name


def test_unknown_space_lists_choices() -> None:
    with pytest.raises(SearchSpaceError, match=r"unknown search space 'resnet9'; choices: \['bert'"):
        ss.get_space("resnet9")
    with pytest.raises(SearchSpaceError, match="unknown search space"):
        ss.build_model("nope", {})


class _TinySpace(ss.SearchSpace):
    params = {"width": ss.IntRange(1, 64)}

    def default_config(self) -> dict[str, Any]:
        return {"width": 4}

    def _build(self, config: dict[str, Any]) -> nn.Module:
        return nn.Linear(config["width"], 1)

    def _sample(self, rng: random.Random) -> dict[str, Any]:
        return {"width": rng.randint(1, 64)}

    def input_spec(self, config: dict[str, Any], batch_size: int = 1, dtype: str = "float32"):
        from dippm_nas.spec import InputSpec

        return InputSpec(shape=(self.validate(config)["width"],), batch_size=batch_size, dtype=dtype)


def test_register_and_duplicate_registration() -> None:
    try:
        ss.register_space("tiny_test_space")(_TinySpace)
        assert "tiny_test_space" in ss.list_spaces()
        model = ss.build_model("tiny_test_space", {"width": 8})
        assert model.in_features == 8 and not model.training
        assert model.search_space == "tiny_test_space" and model.search_space_config == {"width": 8}
        with pytest.raises(SearchSpaceError, match="already registered"):
            ss.register_space("tiny_test_space")(_TinySpace)
        with pytest.raises(SearchSpaceError, match="already registered"):
            ss.register_space("resnet")(_TinySpace)
        with pytest.raises(SearchSpaceError, match="already registered as 'resnet'"):
            ss.register_space("resnet_again")(ss.get_space("resnet"))
    finally:
        _REGISTRY.pop("tiny_test_space", None)
        _REGISTRY.pop("resnet_again", None)
    with pytest.raises(SearchSpaceError, match="needs a SearchSpace subclass"):
        ss.register_space("not_a_space")(dict)
    with pytest.raises(SearchSpaceError, match="identifier"):
        ss.register_space("bad name")
    assert "not_a_space" not in ss.list_spaces()


def test_builder_that_raises_gives_search_space_error() -> None:
    class Broken(_TinySpace):
        def _build(self, config: dict[str, Any]) -> nn.Module:
            raise RuntimeError("kaboom")

    with pytest.raises(SearchSpaceError, match="failed: RuntimeError: kaboom") as info:
        Broken().build({"width": 3})
    assert isinstance(info.value.__cause__, RuntimeError)


# --------------------------------------------------------------------------- validation
BAD_CONFIGS = [
    ("mbconv", {"k": [3, 5, 3, 7, 3, 3, 3]}, r"'k'\[3\] must be one of \[3, 5\], got 7"),
    ("mbconv", {"l": [1, 1, 1, 1, 1, 4, 4]}, r"'l'\[6\] must be one of \[1, 2, 3\], got 4"),
    ("mbconv", {"e": [1, 4, 6]}, r"'e' must be a list of 7 items"),
    ("mbconv", {"se": [1, 0, 0, 0, 0, 0, 0]}, r"'se'\[0\] must be one of \[True, False\], got 1"),
    ("mbconv", {"resolution": 16}, r"'resolution' must be an int in \[32, 1024\], got 16"),
    ("resnet", {"depths": [2, 2], "widths": [64]}, "same length"),
    ("resnet", {"depths": [True, 2, 2, 2]}, r"'depths'\[0\] must be an int"),
    ("resnet", {"block": "basic", "groups": 32}, "groups=1"),
    ("resnet", {"widths": [60, 128, 256, 512]}, r"'widths'\[0\] must be an int in \[8, 1024\] and a multiple of 8"),
    ("resnet", {"block": "resnext"}, r"'block' must be one of \['basic', 'bottleneck'\], got 'resnext'"),
    ("mobilenetv3", {"blocks": [{"k": 3, "exp": 16, "out": 16, "se": False, "act": "relu"}]},
     r"'blocks'\[0\] must have exactly the keys.*missing \['s'\]"),
    ("mobilenetv3", {"blocks": [{"k": 4, "exp": 16, "out": 16, "se": False, "act": "relu", "s": 1}]},
     r"'blocks'\[0\]\['k'\] must be one of \[3, 5, 7\], got 4"),
    ("mobilenetv3", {"head_width": 8}, "'head_width' must be >="),
    ("densenet", {"compression": 0.3}, r"'compression' must be one of \[0.25, 0.5, 0.75, 1.0\], got 0.3"),
    ("densenet", {"stem": "cifar", "block_layers": [1] * 5, "resolution": 8}, "resolution"),
    ("densenet", {"block_layers": [1] * 5, "resolution": 32}, "too small"),
    ("convnext", {"resolution": 16}, r"must be >= patch_size x 2\^\(stages-1\) = 32"),
    ("vit", {"embed_dim": 100}, r"'embed_dim' must be a multiple of 'num_heads' \(12\), got 100"),
    ("vit", {"resolution": 200}, r"multiple of 'patch_size' \(16\), got 200"),
    ("bert", {"seq_len": 600}, r"'seq_len' must be <= 'max_position' \(512\), got 600"),
    ("mlp", {"activation": "swish"}, r"one of \['relu', 'gelu', 'silu', 'tanh'\], got 'swish'"),
    ("mlp", {"hidden": "64,64"}, r"'hidden' must be a list"),
    ("regnet", {"depths": [1, 2, 7], "widths": [32, 64, 160, 400]}, "same length"),
    ("regnet", {"widths": [32, 64, 160, 400], "group_width": 24},
     r"'widths'\[0\] = 32: its bottleneck width .* multiple of 'group_width' \(24\)"),
    ("regnet", {"bottleneck_ratio": 0.3}, r"'bottleneck_ratio' must be one of \[0.25, 0.5, 1.0\], got 0.3"),
    ("regnet", {"resolution": 16}, r"'resolution' must be >= 2\^\(stages\+1\) = 32"),
    ("vgg", {"stage_depths": [1, 1, 2]}, "same length"),
    ("vgg", {"resolution": 16}, r"'resolution' must be >= 2\^stages = 32"),
    ("vgg", {"classifier_widths": 4096}, r"'classifier_widths' must be a list"),
    ("efficientnetv2", {"stages": [{"type": "fused", "expand": 4, "kernel": 3, "stride": 2, "out": 32, "layers": 1,
                                    "se": True}]},
     r"'stages'\[0\]\['se'\] must be False for a 'fused' stage"),
    ("efficientnetv2", {"stem_width": 20}, r"'stem_width' must be an int in \[8, 256\] and a multiple of 8, got 20"),
    ("convmixer", {"kernel_size": 8}, r"'kernel_size' must be one of \[3, 5, 7, 9, 11, 13, 15\], got 8"),
    ("convmixer", {"patch_size": 32, "resolution": 16}, r"'resolution' must be >= 'patch_size' \(32\), got 16"),
    ("mixer", {"resolution": 200}, r"multiple of 'patch_size' \(16\), got 200"),
    ("mixer", {"hidden": 4}, r"'hidden' must be an int in \[8, 4096\], got 4"),
    ("vitc", {"patch_size": 8}, r"'stem_widths' must have log2\('patch_size'\) = 3 items for patch_size 8, got 4"),
    ("vitc", {"embed_dim": 100}, r"'embed_dim' must be a multiple of 'num_heads' \(6\), got 100"),
]


@pytest.mark.parametrize("space,config,message", BAD_CONFIGS)
def test_config_outside_space_is_rejected(space: str, config: dict, message: str) -> None:
    with pytest.raises(SearchSpaceError, match=message):
        ss.build_model(space, config)


@pytest.mark.parametrize("space", FAMILIES)
def test_unknown_keys_and_non_dicts_rejected(space: str) -> None:
    with pytest.raises(SearchSpaceError, match=r"unknown keys \['widht'\]; valid keys are"):
        ss.get_space(space).validate({"widht": 3})
    with pytest.raises(SearchSpaceError, match="config must be a dict"):
        ss.get_space(space).validate([("resolution", 32)])


# --------------------------------------------------------------------------- samplers
@pytest.mark.parametrize("space", FAMILIES)
def test_sampler_is_deterministic_json_and_in_space(space: str) -> None:
    s = ss.get_space(space)
    configs = [s.sample(seed) for seed in range(12)]
    assert configs[5] == s.sample(5) == s.sample(random.Random(5))
    assert len({json.dumps(c, sort_keys=True) for c in configs}) >= 8, "sampler barely varies"
    for c in configs:
        assert json.loads(json.dumps(c)) == c
        assert s.validate(c) == c
    rng = random.Random(1)
    assert s.sample(rng) != s.sample(rng)  # a Random is advanced in place
    with pytest.raises(SearchSpaceError, match="rng must be a random.Random or an int seed"):
        s.sample("seed")


def test_samplers_vary_sizes() -> None:
    """Resolutions, widths and depths vary across seeds (the dataset must be diverse)."""
    for name, key in (("resnet", "resolution"), ("resnet", "widths"), ("resnet", "depths"),
                      ("mbconv", "resolution"), ("mbconv", "k"), ("convnext", "kernel_size"),
                      ("vit", "embed_dim"), ("vit", "depth"), ("bert", "seq_len"), ("mlp", "hidden"),
                      ("densenet", "growth_rate"), ("mobilenetv3", "blocks")):
        values = {json.dumps(ss.get_space(name).sample(seed)[key]) for seed in range(30)}
        assert len(values) >= 3, f"{name} sampler draws too few {key}: {values}"


def test_sample_batch_size() -> None:
    draws = [ss.sample_batch_size(seed) for seed in range(200)]
    assert set(draws) == set(ss.BATCH_SIZES)
    assert ss.sample_batch_size(3) == ss.sample_batch_size(random.Random(3))
    assert all(ss.sample_batch_size(s, max_batch_size=8) <= 8 for s in range(50))
    assert ss.sample_batch_size(0, choices=(3,)) == 3
    with pytest.raises(SearchSpaceError, match="no batch size"):
        ss.sample_batch_size(0, max_batch_size=0)
    with pytest.raises(SearchSpaceError, match="ints >= 1"):
        ss.sample_batch_size(0, choices=(0, 2))


# --------------------------------------------------------------------------- build / forward / capture
# Two sizes per family: a tiny one and a small-to-medium one; they cover every option value of the
# families' choice keys between them (activations, SE, attention implementations, stems, pooling...).
SIZES: dict[str, tuple[dict, dict]] = {
    "mbconv": (
        {"e": [1] * 7, "k": [3] * 7, "l": [1] * 7, "se": [False] * 7, "resolution": 32},
        {"e": [1, 4, 6, 4, 6, 4, 6], "k": [3, 5, 3, 5, 3, 5, 3], "l": [1, 2, 1, 1, 1, 4, 1],
         "se": [True, False, True, False, True, False, True], "resolution": 64, "num_classes": 10},
    ),
    "resnet": (
        {"block": "basic", "depths": [1, 1], "widths": [8, 16], "stem": "cifar", "stem_width": 8,
         "resolution": 16, "num_classes": 10},
        {"block": "bottleneck", "depths": [1, 2, 1], "widths": [16, 32, 64], "stem": "imagenet", "stem_width": 16,
         "groups": 8, "width_per_group": 4, "resolution": 64, "num_classes": 100},
    ),
    "mobilenetv3": (
        {"stem_width": 8, "blocks": [{"k": 3, "exp": 8, "out": 8, "se": False, "act": "relu", "s": 1}],
         "head_width": 16, "classifier_width": 16, "resolution": 16, "num_classes": 10},
        {"stem_width": 16, "blocks": [
            {"k": 3, "exp": 16, "out": 16, "se": True, "act": "relu", "s": 2},
            {"k": 5, "exp": 48, "out": 24, "se": False, "act": "hardswish", "s": 2},
            {"k": 7, "exp": 72, "out": 24, "se": True, "act": "hardswish", "s": 1}],
         "head_width": 96, "classifier_width": 64, "resolution": 64, "num_classes": 100},
    ),
    "densenet": (
        {"growth_rate": 4, "block_layers": [1, 1], "init_width": 8, "bn_size": 1, "stem": "cifar",
         "resolution": 16, "num_classes": 10},
        {"growth_rate": 8, "block_layers": [2, 3, 2], "init_width": 16, "bn_size": 2, "compression": 0.75,
         "stem": "imagenet", "resolution": 64, "num_classes": 100},
    ),
    "convnext": (
        {"depths": [1, 1], "widths": [8, 16], "kernel_size": 3, "mlp_ratio": 1, "patch_size": 2,
         "layer_scale": False, "resolution": 16, "num_classes": 10},
        {"depths": [1, 1, 2, 1], "widths": [16, 32, 64, 128], "kernel_size": 7, "mlp_ratio": 4, "patch_size": 4,
         "layer_scale": True, "resolution": 64, "num_classes": 100},
    ),
    "vit": (
        {"patch_size": 8, "embed_dim": 16, "depth": 1, "num_heads": 1, "mlp_ratio": 1, "qkv_bias": False,
         "pool": "mean", "attention": "explicit", "resolution": 16, "num_classes": 10},
        {"patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 4, "qkv_bias": True,
         "pool": "cls", "attention": "sdpa", "resolution": 64, "num_classes": 100},
    ),
    "bert": (
        {"vocab_size": 100, "seq_len": 8, "max_position": 16, "hidden": 16, "depth": 1, "num_heads": 1,
         "intermediate": 32, "attention": "explicit", "num_classes": 2},
        {"vocab_size": 1000, "seq_len": 32, "max_position": 64, "hidden": 64, "depth": 2, "num_heads": 4,
         "intermediate": 128, "attention": "sdpa", "num_classes": 0},
    ),
    "mlp": (
        {"in_features": 8, "hidden": [], "out_features": 2},
        {"in_features": 64, "hidden": [128, 64], "activation": "gelu", "norm": "layernorm", "out_features": 10},
    ),
    "regnet": (
        {"depths": [1, 1], "widths": [16, 32], "group_width": 8, "bottleneck_ratio": 0.25, "se": False,
         "stem_width": 8, "resolution": 16, "num_classes": 10},
        {"depths": [1, 2, 2, 1], "widths": [32, 64, 128, 256], "group_width": 16, "bottleneck_ratio": 0.5,
         "se": True, "stem_width": 16, "resolution": 64, "num_classes": 100},
    ),
    "vgg": (
        {"stage_depths": [1, 1], "widths": [8, 16], "batch_norm": False, "pool_size": 1, "classifier_widths": [],
         "resolution": 16, "num_classes": 10},
        {"stage_depths": [1, 2, 2], "widths": [16, 32, 64], "batch_norm": True, "pool_size": 2,
         "classifier_widths": [128, 128], "resolution": 64, "num_classes": 100},
    ),
    "efficientnetv2": (
        {"stem_width": 8, "stages": [
            {"type": "fused", "expand": 1, "kernel": 3, "stride": 1, "out": 8, "layers": 1, "se": False},
            {"type": "mbconv", "expand": 2, "kernel": 3, "stride": 2, "out": 16, "layers": 1, "se": True},
        ], "head_width": 32, "resolution": 32, "num_classes": 10},
        {"stem_width": 16, "stages": [
            {"type": "fused", "expand": 1, "kernel": 3, "stride": 1, "out": 16, "layers": 2, "se": False},
            {"type": "fused", "expand": 4, "kernel": 5, "stride": 2, "out": 24, "layers": 2, "se": False},
            {"type": "mbconv", "expand": 1, "kernel": 7, "stride": 2, "out": 32, "layers": 1, "se": False},
            {"type": "mbconv", "expand": 6, "kernel": 3, "stride": 1, "out": 32, "layers": 2, "se": True},
            {"type": "mbconv", "expand": 3, "kernel": 5, "stride": 2, "out": 64, "layers": 2, "se": True},
        ], "head_width": 256, "resolution": 64, "num_classes": 100},
    ),
    "convmixer": (
        {"dim": 16, "depth": 1, "kernel_size": 3, "patch_size": 4, "activation": "relu", "resolution": 32,
         "num_classes": 10},
        {"dim": 64, "depth": 4, "kernel_size": 9, "patch_size": 2, "activation": "gelu", "resolution": 32,
         "num_classes": 100},
    ),
    "mixer": (
        {"patch_size": 8, "hidden": 16, "depth": 1, "tokens_mlp_dim": 8, "channels_mlp_dim": 32, "resolution": 16,
         "num_classes": 10},
        {"patch_size": 8, "hidden": 64, "depth": 2, "tokens_mlp_dim": 32, "channels_mlp_dim": 256, "resolution": 64,
         "num_classes": 100},
    ),
    "vitc": (
        {"patch_size": 4, "stem_widths": [8, 16], "embed_dim": 16, "depth": 1, "num_heads": 1, "mlp_ratio": 1,
         "qkv_bias": False, "pool": "mean", "attention": "explicit", "resolution": 16, "num_classes": 10},
        {"patch_size": 16, "stem_widths": [16, 32, 64, 128], "embed_dim": 64, "depth": 2, "num_heads": 4,
         "mlp_ratio": 4, "qkv_bias": True, "pool": "cls", "attention": "sdpa", "resolution": 64, "num_classes": 100},
    ),
}
CASES = [(name, i) for name in FAMILIES for i in (0, 1)]


def _expected_out(space: str, cfg: dict) -> int:
    if space == "bert":
        return cfg["num_classes"] or cfg["hidden"]
    return cfg["out_features"] if space == "mlp" else cfg["num_classes"]


@pytest.mark.parametrize("space,size", CASES)
def test_family_builds_and_runs(space: str, size: int) -> None:
    s = ss.get_space(space)
    cfg = s.validate(SIZES[space][size])
    model = ss.build_model(space, cfg)
    assert not any(m.training for m in model.modules())
    spec = s.input_spec(cfg, batch_size=2)
    args, kwargs = spec.example_inputs()
    with torch.no_grad():
        out = model(*args, **kwargs)
        again = model(*args, **kwargs)
    assert out.shape == (2, _expected_out(space, cfg))
    assert torch.isfinite(out).all()
    assert torch.equal(out, again), "eval-mode forward must be deterministic"


def test_two_sizes_differ_in_size() -> None:
    for space, (small, larger) in SIZES.items():
        n = [sum(p.numel() for p in ss.build_model(space, c).parameters()) for c in (small, larger)]
        assert n[0] < n[1], f"{space}: {n}"


@pytest.mark.parametrize("space", FAMILIES)
def test_json_round_trip_rebuilds_the_same_model(space: str) -> None:
    s = ss.get_space(space)
    cfg = SIZES[space][1]
    m1 = s.build(cfg)
    m2 = ss.build_model(space, json.loads(json.dumps(cfg)))
    sd1, sd2 = m1.state_dict(), m2.state_dict()
    assert list(sd1) == list(sd2)
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1), "same config + seed must give the same weights"
    assert repr(m1) == repr(m2)
    assert m1.search_space_config == s.validate(cfg) == json.loads(json.dumps(m1.search_space_config))
    m3 = s.build(cfg, seed=1)
    assert any(not torch.equal(sd1[k], v) for k, v in m3.state_dict().items() if v.is_floating_point())


def test_input_specs() -> None:
    spec = ss.get_space("bert").input_spec(SIZES["bert"][1], batch_size=4)
    assert [t.name for t in spec.tensors] == ["input_ids", "attention_mask"]
    assert [t.dtype for t in spec.tensors] == ["int64", "int64"]
    assert spec.tensors[0].high == 1000 and spec.batched_shapes()["input_ids"] == (4, 32)
    assert ss.get_space("mlp").input_spec(SIZES["mlp"][1], 3).batched_shapes() == {"x": (3, 64)}
    spec = ss.get_space("resnet").input_spec(SIZES["resnet"][1], 5, dtype="float16")
    assert spec.batched_shapes() == {"x": (5, 3, 64, 64)} and spec.dtype == "float16"


def test_bert_attention_mask_is_applied() -> None:
    cfg = SIZES["bert"][0]
    for impl in ("explicit", "sdpa"):
        model = ss.build_model("bert", {**cfg, "attention": impl})
        ids = torch.randint(0, 100, (1, 8))
        full = torch.ones(1, 8, dtype=torch.int64)
        pad = full.clone()
        pad[0, 4:] = 0
        ids2 = ids.clone()
        ids2[0, 4:] = 7  # changing padded tokens must not change the output
        with torch.no_grad():
            a, b, c = model(ids, pad), model(ids2, pad), model(ids, full)
        assert torch.allclose(a, b, atol=1e-5) and not torch.allclose(a, c, atol=1e-5)


def test_attention_implementations_agree() -> None:
    for space in ("vit", "vitc", "bert"):
        cfg = SIZES[space][1]
        s = ss.get_space(space)
        args, kwargs = s.input_spec(cfg, 2).example_inputs()
        with torch.no_grad():
            a = s.build({**cfg, "attention": "sdpa"})(*args, **kwargs)
            b = s.build({**cfg, "attention": "explicit"})(*args, **kwargs)
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("space,size", CASES)
def test_family_captures(space: str, size: int) -> None:
    from dippm_nas.capture import capture

    s = ss.get_space(space)
    cfg = SIZES[space][size]
    graph = capture(ss.build_model(space, cfg), s.input_spec(cfg, batch_size=2), cache=False)
    assert graph.nodes
    unknown = sorted({n.op for n in graph.nodes if not n.known})
    assert not unknown, f"{space}: ops without a formula: {unknown}"
    compute = {n.op_class for n in graph.nodes} & {"conv", "matmul", "attention"}
    assert compute, f"{space}: no conv/matmul/attention node in {[n.op for n in graph.nodes]}"
