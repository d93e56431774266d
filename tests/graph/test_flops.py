"""FLOPs from per-node formulas: equal to torch.utils.flop_counter where it is right, right where it is not."""

from __future__ import annotations

import pytest
import torch
from _models import TinyBert, TinyMobileNet, TinyResNet, TinyVGG, TinyViT
from torch.utils.flop_counter import FlopCounterMode

from dippm_nas import InputSpec, capture


def _counter_flops(model: torch.nn.Module, spec: InputSpec) -> int:
    args, kwargs = spec.example_inputs()
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(*args, **kwargs)
    return int(fc.get_total_flops())


@pytest.mark.parametrize("factory", [TinyResNet, TinyMobileNet, TinyVGG], ids=["resnet", "mobilenet", "vgg"])
@pytest.mark.parametrize("batch", [1, 3])
def test_cnn_flops_equal_flop_counter(factory, batch) -> None:
    model = factory().eval()
    spec = InputSpec(shape=(3, 16, 16), batch_size=batch)
    g = capture(model, spec, cache=False)
    assert 2 * g.total_macs == _counter_flops(model, spec)
    # total FLOPs also count the element-wise work, so they are strictly larger
    assert g.total_flops > 2 * g.total_macs


def _vit_expected_macs(model: TinyViT, batch: int) -> int:
    dim = model.head.in_features
    seq = model.tokens + 1
    heads = model.layers[0].heads
    mlp = model.layers[0].fc1.out_features
    patch_k = model.patch.kernel_size[0] * model.patch.kernel_size[1] * 3
    macs = batch * model.tokens * dim * patch_k
    for _ in model.layers:
        macs += batch * seq * dim * 3 * dim  # qkv
        macs += 2 * batch * heads * seq * seq * (dim // heads)  # q@k^T and attn@v
        macs += batch * seq * dim * dim  # proj
        macs += 2 * batch * seq * dim * mlp  # mlp
    macs += batch * dim * 10  # head on the class token
    return macs


def test_vit_attention_flops_by_formula() -> None:
    model = TinyViT().eval()
    spec = InputSpec(shape=(3, 32, 32), batch_size=2)
    g = capture(model, spec, cache=False)
    assert g.total_macs == _vit_expected_macs(model, 2)
    att = [n for n in g.nodes if n.op_class == "attention"]
    assert len(att) == len(model.layers)
    a = att[0]
    assert (a.attrs["seq_q"], a.attrs["seq_k"], a.attrs["heads"], a.attrs["head_dim"]) == (17, 17, 4, 8)
    # flop_counter under no_grad on CPU does not count every attention (the issue this formula fixes)
    assert _counter_flops(model, spec) < 2 * g.total_macs


def test_bert_like_encoder_flops_by_formula() -> None:
    model = TinyBert().eval()
    spec = InputSpec(inputs={"input_ids": ((16,), "int64"), "attention_mask": ((16,), "int64")}, batch_size=2)
    g = capture(model, spec, cache=False)
    # the boolean padding mask goes through our SDPA converter, not the slow decomposing fallback
    assert g.mode == "export"
    assert sum(n.op_class == "attention" for n in g.nodes) == len(model.layers)
    b, s, d, h = 2, 16, 32, 4
    mlp = model.layers[0].fc1.out_features
    per_layer = b * s * d * 3 * d + 2 * b * h * s * s * (d // h) + b * s * d * d + 2 * b * s * d * mlp
    expected = len(model.layers) * per_layer + b * d * d  # + pooler on the first token
    assert g.total_macs == expected
    assert sorted(g.input_consumers) == ["attention_mask", "input_ids"]
    assert all(g.input_consumers[k] for k in g.input_consumers)


def test_half_precision_halves_bytes_not_flops() -> None:
    model = TinyResNet().eval()
    g32 = capture(model, InputSpec(shape=(3, 16, 16), batch_size=2), cache=False)
    g16 = capture(model, InputSpec(shape=(3, 16, 16), batch_size=2, dtype="float16"), cache=False)
    gbf = capture(model, InputSpec(shape=(3, 16, 16), batch_size=2, dtype="bfloat16"), cache=False)
    assert g16.total_flops == g32.total_flops == gbf.total_flops
    assert g16.param_bytes * 2 == g32.param_bytes
    assert all(n.output_dtype == "float16" for n in g16.nodes)
    assert all(n.output_dtype == "bfloat16" for n in gbf.nodes)
    assert sum(n.bytes_written for n in g16.nodes) * 2 == sum(n.bytes_written for n in g32.nodes)
    assert next(model.parameters()).dtype == torch.float32  # the user's model is untouched
