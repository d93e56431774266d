"""capture(): PyTorch and ONNX paths, conversion modes, the cache, and every bad input."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from _models import DataDependent, TinyResNet, TinyVGG
from torch import nn

from dippm_nas import (
    GraphCaptureError,
    InputShapeError,
    InputSpec,
    InputSpecError,
    ModelSpecError,
    UnsupportedDtypeError,
    capture,
)
from dippm_nas.capture import MODES, model_key
from dippm_nas.graph import SDPA_MATH_ATTR, OperatorGraph, _formulas

SPEC = InputSpec(shape=(3, 16, 16), batch_size=2)


# ----------------------------------------------------------------------------- PyTorch path
def test_capture_restores_training_mode_and_records_mode() -> None:
    m = TinyResNet().train()
    g = capture(m, SPEC, cache=False)
    assert m.training and all(sub.training for sub in m.modules())
    assert g.mode == "export"
    assert g.mode in MODES
    assert set(g.timings) == {"export_s", "convert_s", "build_s"}
    assert g.convert_seconds > 0


def test_decomposing_fallback_is_used_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    prov = importlib.import_module("dippm_nas.capture._provenance")  # dippm_nas.capture is also a function

    real = prov.convert_tagged
    calls = []

    def flaky(ep, decompose, custom_convert_map, strip=0):
        calls.append(decompose)
        if not decompose:
            raise NotImplementedError("pretend this op needs decomposition")
        return real(ep, True, custom_convert_map, strip)

    monkeypatch.setattr(prov, "convert_tagged", flaky)
    g = capture(TinyVGG().eval(), SPEC, cache=False)
    assert calls == [False, True]
    assert g.mode == "export+decompose"
    g2 = capture(TinyVGG().eval(), SPEC, cache=False, decompose=True)
    assert g2.mode == "export+decompose"


def test_model_key_shared_by_instances_and_sensitive_to_definition() -> None:
    assert model_key(TinyResNet(), SPEC) == model_key(TinyResNet(), SPEC)
    assert model_key(TinyResNet(width=8), SPEC) != model_key(TinyResNet(width=16), SPEC)
    assert model_key(TinyResNet(), SPEC) != model_key(TinyResNet(), SPEC.with_batch_size(4))
    a, b = TinyResNet(), TinyResNet()
    b.layer1.extra_flag = True  # a scalar attribute that forward could read
    assert model_key(a, SPEC) != model_key(b, SPEC)
    # layer hyper-parameters that do not change any parameter shape still change the key
    assert model_key(nn.Conv2d(3, 4, 3, stride=1), SPEC) != model_key(nn.Conv2d(3, 4, 3, stride=2), SPEC)
    assert model_key(nn.Conv2d(3, 4, 3, padding=1), SPEC) != model_key(nn.Conv2d(3, 4, 3, padding=0), SPEC)
    assert model_key(nn.BatchNorm2d(4, eps=1e-5), SPEC) != model_key(nn.BatchNorm2d(4, eps=1e-3), SPEC)
    # a function held as an attribute enters by its code (digests are memoised per code object)
    c, d, e = TinyResNet(), TinyResNet(), TinyResNet()
    c.act = torch.nn.functional.relu
    d.act = torch.nn.functional.hardtanh
    e.act = torch.nn.functional.relu
    assert model_key(c, SPEC) != model_key(d, SPEC)
    assert model_key(c, SPEC) == model_key(e, SPEC)
    # a tuple attribute with a non-scalar element is left out, one with scalars only is in
    f, h = TinyResNet(), TinyResNet()
    f.sizes, h.sizes = (1, 2), (1, 3)
    assert model_key(f, SPEC) != model_key(h, SPEC)
    f.sizes, h.sizes = (1, object()), (1, object())
    assert model_key(f, SPEC) == model_key(h, SPEC)


# --------------------------------------------------------------------------------- ONNX path
def _export_onnx(model: nn.Module, path: Path, spec: InputSpec) -> Path:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    args, _ = spec.example_inputs()
    torch.onnx.export(model, args, str(path), dynamo=True, input_names=["x"])
    return path


def test_onnx_round_trip_equals_pytorch_path(tmp_path: Path) -> None:
    model = TinyVGG().eval()
    path = _export_onnx(model, tmp_path / "vgg.onnx", SPEC)
    g_pt = capture(model, SPEC, cache=False)
    g_onnx = capture(path, SPEC, cache=False)
    assert g_onnx.mode == "onnx"
    assert g_onnx.total_macs == g_pt.total_macs
    assert g_onnx.param_count == g_pt.param_count

    def contraction(g):
        return [(n.op, n.input_shapes, n.output_shapes, n.attrs.get("strides"), n.attrs.get("groups"))
                for n in g.nodes if n.op_class in ("conv", "matmul")]

    assert contraction(g_onnx) == contraction(g_pt)
    assert g_onnx.nodes[g_onnx.outputs[0]].output_shape == g_pt.nodes[g_pt.outputs[0]].output_shape
    # the string form of the path works too
    assert capture(str(path), SPEC, cache=False).total_macs == g_pt.total_macs


def test_onnx_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match="does not exist"):
        capture(tmp_path / "missing.onnx", SPEC, cache=False)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not protobuf")
    with pytest.raises(GraphCaptureError, match="not a valid ONNX"):
        capture(junk, SPEC, cache=False)


def test_onnx_shape_that_does_not_fit(tmp_path: Path) -> None:
    path = _export_onnx(TinyVGG().eval(), tmp_path / "vgg.onnx", SPEC)
    with pytest.raises(InputShapeError, match="does not fit"):
        capture(path, InputSpec(shape=(3, 20, 20), batch_size=2), cache=False)


# ------------------------------------------------------------------------------------ cache
def test_cache_hit_returns_identical_graph_and_skips_export(tmp_path: Path, monkeypatch) -> None:
    from dippm_nas.cache import ConversionCache

    cache = ConversionCache(f"sqlite:///{tmp_path / 'c.sqlite'}")
    first = capture(TinyResNet(), SPEC, cache=cache)
    assert not first.cache_hit

    def boom(*a, **k):
        raise AssertionError("export must not run on a cache hit")

    monkeypatch.setattr(torch.export, "export", boom)
    second = capture(TinyResNet(), SPEC, cache=cache)  # another instance, same architecture
    assert second.cache_hit
    assert second.to_dict() == first.to_dict()
    assert second.structural_hash() == first.structural_hash()
    cache.close()


# ------------------------------------------------------------------------------- bad input
def test_data_dependent_control_flow_is_a_clear_error() -> None:
    with pytest.raises(GraphCaptureError, match="data-dependent control flow"):
        capture(DataDependent(), InputSpec(shape=(4,), batch_size=2), cache=False)


@pytest.mark.parametrize("shape", [(5, 16, 16), (3, 2, 2)], ids=["channels", "too-small"])
def test_input_shape_that_does_not_fit(shape) -> None:
    with pytest.raises(InputShapeError, match="does not fit") as e:
        capture(TinyVGG(), InputSpec(shape=shape, batch_size=2), cache=False)
    assert "without the batch dimension" in str(e.value)


def test_linear_input_mismatch() -> None:
    with pytest.raises(InputShapeError):
        capture(nn.Linear(10, 5), InputSpec(shape=(7,), batch_size=2), cache=False)


def test_named_inputs_that_forward_does_not_take() -> None:
    with pytest.raises(InputShapeError, match="does not accept"):
        capture(nn.Linear(4, 4), InputSpec(inputs={"a": (4,), "b": (4,)}), cache=False)


@pytest.mark.parametrize("obj", [object(), 42, None, [nn.Linear(2, 2)]])
def test_non_module_is_rejected(obj) -> None:
    with pytest.raises(ModelSpecError, match=r"model must be one of: .*a torch.nn.Module.*got "):
        capture(obj, SPEC, cache=False)


def test_bad_spec_arguments() -> None:
    with pytest.raises(UnsupportedDtypeError, match="dtype must be one of"):
        InputSpec(shape=(3, 8, 8), dtype="float8_e4m3fn")
    with pytest.raises(UnsupportedDtypeError):
        InputSpec(shape=(3, 8, 8), dtype="int8")
    with pytest.raises(InputSpecError, match="batch_size must be an int >= 1, got 0"):
        InputSpec(shape=(3, 8, 8), batch_size=0)
    with pytest.raises(InputSpecError, match="parse_shape"):
        InputSpec(shape="3,224,224")
    with pytest.raises(InputSpecError, match="exactly one"):
        InputSpec()
    with pytest.raises(InputSpecError, match="must be a dippm_nas.InputSpec"):
        capture(TinyVGG(), (3, 16, 16))  # type: ignore[arg-type]


def test_unknown_model_spec_strings() -> None:
    with pytest.raises(ModelSpecError, match="must be one of"):
        capture("resnet50", SPEC, cache=False)
    with pytest.raises(ModelSpecError, match="cannot import module"):
        capture("no_such_package_xyz:build", SPEC, cache=False)
    with pytest.raises(ModelSpecError, match="has no attribute"):
        capture("torch.nn:NoSuchLayer", SPEC, cache=False)


def test_package_callable_spec_string() -> None:
    g = capture("_models:TinyVGG", SPEC, cache=False)
    assert g.source == "_models:TinyVGG"
    assert g.static_features().num_conv == 3


class Bucketize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("edges", torch.tensor([0.1, 0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(x, self.edges).float() * x


def test_unknown_op_stays_as_generic_node_counted_and_warned_once(monkeypatch) -> None:
    monkeypatch.setattr(_formulas, "_warned_unknown", set())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = capture(Bucketize(), InputSpec(shape=(3, 8, 8), batch_size=2), cache=False)
        capture(Bucketize(), InputSpec(shape=(3, 8, 8), batch_size=4), cache=False)
    assert g.unknown_ops == {"bucketize": 1}
    (node,) = [n for n in g.nodes if n.op == "bucketize"]
    assert not node.known and node.op_class == "unknown"
    assert node.output_shape == (2, 3, 8, 8) and node.flops == 2 * 3 * 8 * 8
    msgs = [str(x.message) for x in w if "bucketize" in str(x.message)]
    assert len(msgs) == 1


class _UnfoldAmaxPool(nn.Module):
    """unfold and adaptive_max_pool2d have no Relax converter in either mode; amax has ours."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 16 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        u = y.unfold(2, 4, 4)                                # (B, 8, 4, 16, 4)
        p = nn.functional.adaptive_max_pool2d(y, 2)           # (values, indices) inside the export
        return self.fc(u.flatten(1)) + torch.amax(y, dim=(2, 3)).sum(1, keepdim=True) + p.sum((1, 2, 3))[:, None]


def test_ops_no_mode_converts_become_opaque_unknown_nodes_with_their_shapes() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(_UnfoldAmaxPool(), SPEC, cache=False)
    assert g.mode == "export+opaque" and g.mode in MODES
    assert g.unknown_ops == {"unfold": 1, "adaptive_max_pool2d": 1}  # amax is converted exactly (to max)
    by_op = {n.op: n for n in g.nodes}
    assert by_op["unfold"].output_shapes == ((2, 8, 4, 16, 4),) and not by_op["unfold"].known
    assert by_op["adaptive_max_pool2d"].output_shapes == ((2, 8, 2, 2), (2, 8, 2, 2))
    assert by_op["adaptive_max_pool2d"].output_dtype == "float32"
    assert by_op["max"].output_shapes == ((2, 8),)
    conv = next(n.index for n in g.nodes if n.op_class == "conv")
    # dataflow kept through the opaque node: conv -> ... -> unfold -> ... -> the linear layer
    reach, frontier = {conv}, [conv]
    while frontier:
        i = frontier.pop()
        for a, b in g.edges:
            if a == i and b not in reach:
                reach.add(b)
                frontier.append(b)
    assert by_op["unfold"].index in reach
    assert any(g.nodes[b].op_class == "matmul" for a, b in g.edges if a in reach)
    # the prediction still comes, flagged
    from dippm_nas import predict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = predict(g, SPEC, device="a100-sxm4-40gb")
    assert p.unknown_ops == {"unfold": 1, "adaptive_max_pool2d": 1} and p.latency_ms > 0


def test_an_opaque_op_fed_a_tuple_keeps_the_dataflow_edges_of_its_fields() -> None:
    import types

    import torch.fx
    from tvm import relax

    from dippm_nas.capture._converters import _opaque
    from dippm_nas.graph import graph_from_relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, x))
            b = bb.emit(relax.op.multiply(x, x))
            pair = bb.emit(relax.Tuple([a, b]))                 # one fx value holding two tensors
            fx = torch.fx.Graph()
            arg_pair, arg_x = fx.placeholder("pair"), fx.placeholder("x")
            node = fx.call_function(torch.ops.aten.unfold.default, (arg_pair, arg_x))
            node.meta["val"] = torch.zeros(4, 3)
            importer = types.SimpleNamespace(env={arg_pair: pair, arg_x: x}, block_builder=bb)
            gv = bb.emit_output(_opaque("unfold")(node, importer))
        bb.emit_func_output(gv)
    g = graph_from_relax(bb.get(), InputSpec(shape=(3,), batch_size=2), mode="export+opaque")
    ops = [n.op for n in g.nodes]
    assert ops == ["add", "multiply", "unfold"]
    assert g.edges == [(0, 2), (1, 2)]                          # before the fix the tuple was dropped: no edge
    assert g.nodes[2].output_shapes == ((4, 3),) and not g.nodes[2].known


class _FrontendGaps(nn.Module):
    """Ops the stock frontend mis-converts in its fast mode (seen in timm's xcit, edgenext, hiera, poolformerv2)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.ln = nn.LayerNorm(16, bias=False)
        self.gn_weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 4, 10, 16)
        half = torch.div(torch.arange(16, dtype=torch.float32), 2, rounding_mode="floor")  # float // int
        half = half + torch.div(torch.arange(16), 2.5, rounding_mode="floor")               # int // float
        y = self.ln(x + half)
        q, k, v = self.qkv(y).reshape(x.shape[0], 4, 10, 3, 2, 8).permute(3, 0, 1, 4, 2, 5).unbind(0)
        a = nn.functional.scaled_dot_product_attention(q, k, v)      # 5-D: (B, 4, 2, 10, 8)
        g = nn.functional.group_norm(x, 2, self.gn_weight, None)     # weight, no bias
        return a.flatten(2).sum(-1) + torch.amax(g, dim=(2, 3))


def test_converters_for_frontend_gaps_keep_the_fast_mode_and_the_shapes() -> None:
    spec = InputSpec(shape=(4, 10, 16), batch_size=2)
    g = capture(_FrontendGaps().eval(), spec, cache=False)
    assert g.mode == "export" and not g.unknown_ops
    ops = [n.op for n in g.nodes]
    assert "floor_divide" in ops and "nn.layer_norm" in ops and "nn.group_norm" in ops and "max" in ops
    # a five-dimensional attention runs PyTorch's math path (the fused kernels take only 4-D q, k, v): q @ k^T,
    # softmax, @ v, the same B*U*H*Sq*Sk*(D+Dv) MACs, the score matrix in the graph
    assert not [n for n in g.nodes if n.op.startswith("nn.attention")]
    qk, av = [n for n in g.nodes if n.op == "matmul" and not any(n.input_is_param)]
    assert qk.output_shapes == ((2, 4, 2, 10, 10),) and av.output_shapes == ((2, 4, 2, 10, 8),)
    assert qk.macs + av.macs == 8 * 2 * 10 * 10 * (8 + 8)
    assert [n.op for n in g.nodes if qk.index < n.index < av.index] == ["nn.softmax"]
    # the math path's nodes are marked (their dtype follows the PyTorch version), and only they: the scalings of
    # q and k, k's transpose, both matmuls and the softmax; the mark survives a JSON round trip
    marked = [n.op for n in g.nodes if n.attrs.get(SDPA_MATH_ATTR)]
    assert marked == ["permute_dims", "multiply", "multiply", "matmul", "nn.softmax", "matmul"]
    back = OperatorGraph.from_json(g.to_json())
    assert [n.index for n in back.nodes if n.attrs.get(SDPA_MATH_ATTR)] == [
        n.index for n in g.nodes if n.attrs.get(SDPA_MATH_ATTR)]
    assert back.structural_hash() == g.structural_hash()
    # float tensor // int and int tensor // float are both float (PyTorch's promotion)
    assert [n.output_dtype for n in g.nodes if n.op == "floor_divide"] == ["float32", "float32"]
    out = _FrontendGaps().eval()(torch.randn(2, 4, 10, 16))
    assert out.shape == (2, 4)


class _MaskedAttention(nn.Module):
    """q/k/v of the input's rank (3-D: N, L, D; 4-D: B, H, L, D; 5-D: B, U, H, L, D) and a fixed mask of any
    broadcastable shape."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, q * 0.5, q + 1.0, attn_mask=self.mask)


@pytest.mark.parametrize(("shape", "mask_shape", "boolean"), [
    ((3, 2, 5, 8), (3, 2, 5, 5), False),    # 5-D, a 4-D mask: broadcasts over B, not over B*U
    ((3, 2, 5, 8), (5, 5), False),
    ((3, 2, 5, 8), (2, 1, 1, 1, 5), False),  # full rank with axes of 1
    ((3, 2, 5, 8), (1, 2, 5, 5), True),
    ((2, 5, 8), (2, 5, 5), False),           # 4-D, a lower-rank mask (the frontend takes only 4-D ones)
    ((2, 5, 8), (5, 5), True),
    ((5, 8), (2, 5, 5), False),              # 3-D (N, L, E): heads folded into the batch (samvit)
    ((5, 8), (5, 5), True),
])
def test_attention_masks_of_any_broadcastable_shape_convert_exactly(shape, mask_shape, boolean) -> None:
    import numpy as np
    import tvm
    from tvm import relax

    from dippm_nas.capture._torch import _convert, _export

    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(mask_shape, generator=gen) > 0.3 if boolean else torch.randn(mask_shape, generator=gen)
    if boolean:
        mask[..., 0] = True  # no fully masked row (PyTorch gives NaN there)
    model = _MaskedAttention(mask).eval()
    spec = InputSpec(shape=shape, batch_size=2)
    mod, mode, _ = _convert(_export(model, spec), "auto")
    assert mode == "export"  # no fallback to the slow decomposing mode
    x = torch.randn(2, *shape, generator=gen)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()))
    got = (out[0] if not hasattr(out, "numpy") else out).numpy()
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)


class _OpsWithoutFastConverter(nn.Module):
    """One op the stock fast mode has no converter for (timm's convnextv2, convmixer, convit, gcvit, vit_xp,
    resnetv2 EvoNorm; torchvision's maxvit_t); ``which`` picks it."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.conv_same = nn.Conv2d(3, 4, (4, 3), padding="same", dilation=(1, 2))  # even kernel: uneven padding
        self.conv_valid = nn.Conv2d(3, 4, 3, padding="valid", stride=2, bias=False)
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 3, 6, 8)
        if self.which == "addcmul":
            return torch.addcmul(x, x.mean(1, keepdim=True), x, value=0.5) + torch.addcmul(x, x, x)
        if self.which == "conv2d_padding":
            return self.conv_same(x).sum() + self.conv_valid(x).flatten(1)
        if self.which == "repeat_interleave":
            return torch.repeat_interleave(x, 2, dim=2).sum(1) + torch.repeat_interleave(x[:, 0], 3)[None, :8]
        if self.which == "div_":
            y = x * 2.0
            z = y + 1.0
            y.div_(z)                      # in place on an intermediate
            return y + z                   # the later read sees the divided tensor
        if self.which == "rms_norm":
            return nn.functional.rms_norm(x, (8,), self.w, 1e-5) + nn.functional.rms_norm(x, (6, 8))
        if self.which == "var":
            return x.var(dim=(2, 3), keepdim=True) + x.var(dim=1, unbiased=False)[:, None] + x.var(-1)[..., None]
        if self.which == "swapaxes":
            return torch.swapaxes(x, 1, -1) * x.swapaxes(3, 1) + x.swapaxes(-2, -1).sum((2, 3))[:, None, None, :]
        raise ValueError(self.which)


@pytest.mark.parametrize("which", ["addcmul", "conv2d_padding", "repeat_interleave", "div_", "rms_norm", "var",
                                   "swapaxes"])
def test_ops_without_a_stock_fast_converter_convert_exactly(which: str) -> None:
    import numpy as np
    import tvm
    from tvm import relax

    from dippm_nas.capture._torch import _convert, _export

    torch.manual_seed(0)
    model = _OpsWithoutFastConverter(which).eval()
    spec = InputSpec(shape=(3, 6, 8), batch_size=2)
    mod, mode, _ = _convert(_export(model, spec), "auto")
    assert mode == "export"  # no fallback to the slow decomposing mode
    x = torch.randn(2, 3, 6, 8)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()))
    got = (out[0] if not hasattr(out, "numpy") else out).numpy()
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_opaque_fallback_only_in_auto_mode_and_the_error_lists_every_attempt() -> None:
    with pytest.raises(GraphCaptureError, match="Unsupported function types"):
        capture(_UnfoldAmaxPool(), SPEC, cache=False, decompose=False)
    from dippm_nas.capture._converters import unsupported_ops

    assert unsupported_ops("AssertionError: Unsupported function types ['unfold.default', 'im2col.default']") == [
        "unfold.default", "im2col.default"]
    assert unsupported_ops("TypeError: something else") == []


def test_a_change_of_the_conversion_code_changes_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # a cache filled before a converter was added or fixed must not answer for it: the package version does
    # not move with such changes, the digest of the conversion code does
    from dippm_nas.capture import _key

    model = TinyVGG()
    before, key_before = _key.converter_version(), model_key(model, SPEC)
    assert "conversion=" in before
    monkeypatch.setattr(_key, "_CONVERSION_SOURCES", (*_key._CONVERSION_SOURCES, "capture/_key.py"))
    _key.converter_version.cache_clear()
    try:
        assert _key.converter_version() != before and model_key(model, SPEC) != key_before
    finally:
        monkeypatch.undo()
        _key.converter_version.cache_clear()
    assert _key.converter_version() == before and model_key(model, SPEC) == key_before


def test_model_key_is_stable_across_processes_and_hash_seeds() -> None:
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, %r); from _models import TinyResNet; from dippm_nas import InputSpec; "
            "from dippm_nas.capture import model_key; "
            "print(model_key(TinyResNet(), InputSpec(shape=(3, 16, 16), batch_size=2)))") % str(Path(__file__).resolve().parents[1])
    keys = set()
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "PYTHONHASHSEED": seed})
        keys.add(out.stdout.strip())
    assert keys == {model_key(TinyResNet(), SPEC)}


def test_broken_cache_warns_and_captures_anyway(tmp_path: Path) -> None:
    from dippm_nas.cache import ConversionCache

    cache = ConversionCache(f"sqlite:///{tmp_path / 'c.sqlite'}")
    cache.close()  # every later use raises CacheError
    with pytest.warns(RuntimeWarning, match="conversion cache unavailable"):
        g = capture(TinyVGG(), SPEC, cache=cache)
    assert g.num_nodes > 0 and not g.cache_hit
