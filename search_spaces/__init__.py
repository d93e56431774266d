"""Search spaces: parametrised model families with JSON configs, a name registry and seeded samplers.

A search space is a model family whose members are described by a plain JSON config. A space name and a
config are all it takes to rebuild a model (``json.loads(json.dumps(config))`` round-trips; nothing is
pickled). Each space validates configs (errors name the bad key, value and allowed values), samples
configs deterministically from a seed, and says which :class:`~dippm_nas.spec.InputSpec` its models take.

Usage::

    import search_spaces as ss

    space = ss.get_space("resnet")
    cfg = space.sample(seed)                       # JSON-able dict
    model = ss.build_model("resnet", cfg)          # nn.Module, eval mode, weights seeded
    spec = space.input_spec(cfg, batch_size=ss.sample_batch_size(seed))
    ss.build_model("resnet", {"depths": [9]})      # SearchSpaceError: 'depths' and 'widths' lengths differ

Families (``list_spaces()``) and their config keys (keys left out take the family's default):

==============  ==============================================================================  ====================
name            config keys                                                                     input
==============  ==============================================================================  ====================
mbconv          e, k, l, se (7 per-stage lists; Accel-NASBench MnasNet space, **exact**),        image, resolution
                resolution, num_classes
resnet          block (basic|bottleneck), depths, widths, stem (imagenet|cifar), stem_width,     image, resolution
                groups, width_per_group, resolution, num_classes
mobilenetv3     stem_width, blocks ([{k, exp, out, se, act, s}, ...]), head_width,               image, resolution
                classifier_width, resolution, num_classes
densenet        growth_rate, block_layers, init_width, bn_size, compression, stem, resolution,   image, resolution
                num_classes
convnext        depths, widths, kernel_size, mlp_ratio, patch_size, layer_scale, resolution,     image, resolution
                num_classes
vit             patch_size, embed_dim, depth, num_heads, mlp_ratio, qkv_bias, pool (cls|mean),   image, resolution
                attention (sdpa|explicit), resolution, num_classes
bert            vocab_size, seq_len, max_position, type_vocab_size, hidden, depth, num_heads,    named int64
                intermediate, attention (sdpa|explicit), num_classes                            input_ids +
                                                                                                attention_mask
mlp             in_features, hidden (list of widths), activation, norm, out_features             (in_features,)
regnet          depths, widths, group_width, bottleneck_ratio, se (RegNetY), stem_width,         image, resolution
                resolution, num_classes
vgg             stage_depths, widths, batch_norm, pool_size, classifier_widths, resolution,      image, resolution
                num_classes
efficientnetv2  stem_width, stages ([{type (fused|mbconv), expand, kernel, stride, out,          image, resolution
                layers, se}, ...]), head_width, resolution, num_classes
convmixer       dim, depth, kernel_size, patch_size, activation (relu|gelu), resolution,         image, resolution
                num_classes
mixer           patch_size, hidden, depth, tokens_mlp_dim, channels_mlp_dim, resolution,         image, resolution
                num_classes
vitc            patch_size, stem_widths (conv stem), embed_dim, depth, num_heads, mlp_ratio,     image, resolution
                qkv_bias, pool, attention, resolution, num_classes
hwgpt           embed_dim, depth, num_heads (per layer), mlp_ratio (per layer), bias, seq_len,   named int64
                vocab_size, head_size, rotary_dims (HW-GPT-Bench's lit-gpt GPT, **exact** count) input_ids
==============  ==============================================================================  ====================

Image families take one float tensor ``(batch, 3, resolution, resolution)``. ``bert`` (transformer
encoder over tokens) takes the named inputs ``input_ids`` and ``attention_mask``, both int64
``(batch, seq_len)``, through ``InputSpec(inputs=...)``; ``vit`` is the transformer encoder over image
patches. ``mlp`` takes ``(batch, in_features)``.

Each space's ``presets`` hold reference configs. The ImageNet-scale ones (``resnet18/34/50/101``,
``resnext50_32x4d``, ``wide_resnet50_2``, ``mobilenet_v3_large/small``, ``densenet121/169``,
``convnext_tiny/small``, ``vit_b_16``, and ``bert_base`` = HF ``BertModel``) have exactly the parameter
counts of the torchvision / Hugging Face models of those names (the main ones are tested);
``efficientnet_b0_relu`` is torchvision's ``efficientnet_b0`` with ReLU/Hardsigmoid (same count). So do
``regnet_{x,y}_{400mf,800mf,1_6gf}``, ``vgg11/11_bn/13/16/16_bn/19``, ``efficientnet_v2_s`` (torchvision),
``convmixer_768_32/1536_20`` and ``mixer_s16_224/b16_224`` (timm); ``vitc_1gf/4gf`` follow the ViT_C
paper's stems and carry no count claim. The
CIFAR presets use 1x1-conv projection shortcuts, not the papers' zero-padding ones. The samplers mostly draw
small-to-medium nets (resolutions 32..256, scaled widths) so thousands can be measured on a CPU;
:func:`sample_batch_size` draws a batch size.

HW-GPT-Bench: :func:`config_from_hwgpt_row` maps a row of ``hwgpt_bench_gpu_latency_energy.csv`` to an ``hwgpt``
config (its ``params`` column equals :func:`hwgpt_param_count`); :func:`suggest_hwgpt` draws one of the benchmark's
spaces ``s`` / ``m`` / ``l`` (:data:`HWGPT_CHOICES`) from an Optuna trial.

Accel-NASBench: :func:`config_from_accel_nasbench_row` maps a row of the dataset CSV
(``arch_block{i}_{e,k,l,se}``) to an ``mbconv`` config; use ``resolution=224`` for its mmacs/mparams
and ``resolution=256`` for its GPU throughput. Built models reproduce the published MACs (thop rules) and
parameter counts exactly.

All models use only ops ``torch.export`` handles with static shapes (no data-dependent control flow)
and are returned in eval mode with weights seeded from ``seed`` (default 0).

The ``demo_cnn`` family trains on scikit-learn's 8x8 digits in seconds: :func:`load_digits`,
:func:`train_digits` and :func:`suggest_demo_cnn` (an Optuna trial's config) serve ``dippm-nas demo`` and
``examples/optuna/``.

Add a family with::

    @register_space("myfamily")
    class MySpace(SearchSpace):
        params = {"width": IntRange(8, 512)}
        def default_config(self): ...
        def _build(self, config): ...
        def _sample(self, rng): ...

Every registered family is a :class:`BlockSearchSpace`: ``space.blocks(config)`` splits a config into blocks
(:class:`BlockPlan`), and dippm-nas assembles a candidate's operator graph from blocks captured once
(:func:`dippm_nas.capture.assemble`) instead of exporting the model. Subclass :class:`BlockSearchSpace` and
implement ``_blocks`` and ``_build_block`` to opt a family of your own in (``docs/search_space_assembly.md``).
"""

from __future__ import annotations

# Importing the family modules registers them.
from search_spaces import _bert, _convnext, _densenet, _mbconv, _mlp, _mobilenetv3, _resnet, _vit  # noqa: F401
from search_spaces import _demo_cnn  # noqa: F401
from search_spaces import _convmixer, _efficientnetv2, _mixer, _regnet, _vgg, _vitc  # noqa: F401
from search_spaces import _hwgpt  # noqa: F401
from search_spaces._hwgpt import HWGPT_CHOICES, hwgpt_param_count
from search_spaces._hwgpt_bench import HWGPT_BENCH_COLUMNS, config_from_hwgpt_row, suggest_hwgpt
from search_spaces._mbconv import (
    ACCEL_NASBENCH_COLUMNS,
    MBCONV_STAGES,
    accel_nasbench_row_from_config,
    config_from_accel_nasbench_row,
)
from search_spaces._bert import BertEncoder
from search_spaces._digits import Digits, DigitsTraining, load_digits, suggest_demo_cnn, train_digits
from search_spaces._blocks import Block, BlockInput, BlockPlan, BlockSearchSpace, Source
from search_spaces._layers import TransformerBlock
from search_spaces._params import Choice, IntRange, ListOf, Param, Struct
from search_spaces._registry import (
    BATCH_SIZES,
    SearchSpace,
    build_model,
    get_space,
    list_spaces,
    module_signature,
    register_space,
    sample_batch_size,
)

__all__ = [
    "SearchSpace",
    "BlockSearchSpace",
    "Block",
    "BlockInput",
    "BlockPlan",
    "Source",
    "module_signature",
    "register_space",
    "get_space",
    "list_spaces",
    "build_model",
    "sample_batch_size",
    "BATCH_SIZES",
    "Param",
    "Choice",
    "IntRange",
    "ListOf",
    "Struct",
    "config_from_accel_nasbench_row",
    "accel_nasbench_row_from_config",
    "ACCEL_NASBENCH_COLUMNS",
    "MBCONV_STAGES",
    "BertEncoder",
    "TransformerBlock",
    "Digits",
    "DigitsTraining",
    "load_digits",
    "train_digits",
    "suggest_demo_cnn",
    "HWGPT_CHOICES",
    "HWGPT_BENCH_COLUMNS",
    "hwgpt_param_count",
    "config_from_hwgpt_row",
    "suggest_hwgpt",
]
