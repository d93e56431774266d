"""Memory as PyTorch holds it: the GPU parts add up, the eager reference liveness, memory σ, the MIG margin."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from dippm_nas.devices import get_device
from dippm_nas.graph import OperatorGraph, OpNode
from dippm_nas.measure import reference_activation_peak
from dippm_nas.mig import advise
from dippm_nas.prediction import Prediction
from dippm_nas.prior import (activation_liveness, activation_liveness_many, clear_graph_facts, estimate, estimate_many,
                             predict)
from dippm_nas.prior._memory import (ACTIVATION_REL_SIGMA, ACTIVATION_REL_SIGMA_PROVENANCE, CONTEXT_REL_SIGMA,
                                    CUDNN_WORKSPACE_SIGMA_MIB)
from dippm_nas.spec import InputSpec, dtype_bytes

MIB = 2**20
PARTS = ("baseline_mib", "weights_mib", "input_mib", "activations_peak_mib", "cublas_workspace_mib",
         "cudnn_workspace_mib", "allocator_overhead_mib")


def op(i: int, name: str, cls: str, out: list[tuple[int, ...]], ins: list[tuple[int, ...]],
       par: list[bool] | None = None, dtype: str = "float32") -> OpNode:
    par_t = tuple(par) if par is not None else (False,) * len(ins)
    eb = dtype_bytes(dtype)
    return OpNode(index=i, op=name, op_class=cls, output_shapes=tuple(out), output_dtype=dtype,
                  input_shapes=tuple(ins), input_is_param=par_t, attrs={}, flops=sum(math.prod(s) for s in out),
                  macs=0, bytes_read=sum(math.prod(s) for s in ins) * eb,
                  bytes_written=0 if cls == "view" else sum(math.prod(s) for s in out) * eb,
                  param_bytes=sum(math.prod(s) for s, p in zip(ins, par_t) if p) * eb)


def residual_graph(n: int = 1 << 18, blocks: int = 3, batch: int = 1) -> OperatorGraph:
    """x -> stem -> [a = relu(h); b = linear(a); h = h + b] * blocks -> out, all tensors of ``n`` floats:
    a stage of residual blocks behind a stem (the stem's output is the stage input)."""
    shape = (n,)
    nodes = [op(0, "matmul", "matmul", [shape], [shape, (64, 64)], [False, True])]
    edges = []
    prev = 0
    for _ in range(blocks):
        i = len(nodes)
        nodes.append(op(i, "nn.relu", "activation", [shape], [shape]))
        nodes.append(op(i + 1, "matmul", "matmul", [shape], [shape, (64, 64)], [False, True]))
        nodes.append(op(i + 2, "add", "elementwise", [shape], [shape, shape]))
        edges += [(prev, i), (i, i + 1), (i + 1, i + 2), (prev, i + 2)]
        prev = i + 2
    last = len(nodes)
    nodes.append(op(last, "nn.relu", "activation", [shape], [shape]))
    edges.append((prev, last))
    pb = sum(nd.param_bytes for nd in nodes)
    return OperatorGraph(nodes=nodes, edges=sorted(edges), input_consumers={"x": [0]}, outputs=[last],
                         spec=InputSpec(shape=shape, batch_size=batch, dtype="float32"),
                         param_count=pb // 4, param_bytes=pb, mode="export").validate()


# ----------------------------------------------------------------------------- the parts
@pytest.mark.parametrize("device", ["a100-sxm4-40gb", "h100-sxm5-80gb", "rtx-4090"])
def test_gpu_parts_sum_to_the_total_and_are_in_the_details(device: str) -> None:
    g = residual_graph()
    e = estimate(g, device)
    p = predict(g, device, mig=False)
    parts = [p.details[k] for k in PARTS]
    assert all(v >= 0 for v in parts)
    assert sum(parts) == pytest.approx(p.memory_mib) == pytest.approx(e.memory_mib)
    assert p.details["reserved_mib"] == pytest.approx(p.memory_mib - p.details["baseline_mib"])
    assert p.details["allocated_mib"] == pytest.approx(p.details["reserved_mib"] - p.details["allocator_overhead_mib"])
    dev = get_device(device)
    assert p.details["baseline_mib"] == dev.runtime_baseline_mib
    assert p.details["input_mib"] == pytest.approx((1 << 18) * 4 / MIB)      # n floats
    assert p.details["cublas_workspace_mib"] == pytest.approx(dev.cublas_workspace_mib)  # matmuls run
    assert p.details["weights_mib"] == pytest.approx(g.param_bytes / MIB)


def test_the_caller_held_input_is_a_part_not_an_activation() -> None:
    g = residual_graph()
    t = (1 << 18) * 4
    with_input = activation_liveness(g).live_bytes
    without = activation_liveness(g, include_inputs=False).live_bytes
    assert with_input[0] - without[0] == t and list(with_input[1:]) == list(without[1:])  # read by the stem only
    e = estimate(g, "a100-sxm4-40gb")
    assert e.input_mib == pytest.approx(t / MIB)  # held by the caller for the whole pass: a part of its own


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.lin(torch.relu(h))  # no local variable holds the branch (torchvision rebinds ``out``)


class _PreNorm(nn.Module):
    """A pre-norm transformer block's two residual branches (the block input is held through both; each
    norm's output is the argument of the branch's module, held until it returns: an MLP module, as in
    torchvision's and timm's ViT)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.n1, self.f1 = nn.LayerNorm(d), nn.Linear(d, d)
        self.n2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.f1(self.n1(x))
        return x + self.mlp(self.n2(x))


class _PostNorm(nn.Module):
    """A post-norm (BERT) layer: its input, held by the caller, lives through both sublayers."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.f1, self.n1 = nn.Linear(d, d), nn.LayerNorm(d)
        self.mlp, self.n2 = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d)), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.n1(x + self.f1(x))
        return self.n2(h + self.mlp(h))


class _Stage(nn.Module):
    def __init__(self, block: type, d: int = 256, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Linear(64, d)
        self.blocks = nn.Sequential(*[block(d) for _ in range(blocks)])
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)         # x holds the stem's output while the blocks run
        x = self.blocks(x)
        return self.head(x)


def _cbr(cin: int, cout: int, groups: int = 1, k: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU6(inplace=True))


class _InvertedResidual(nn.Module):
    """MobileNetV2's block without a residual: its input is held until the projection's norm returns, the
    depthwise group's input until its norm returns (``Conv2dNormActivation`` is an ``nn.Sequential``); the
    ReLU6 runs in place."""

    def __init__(self, c: int, e: int = 6) -> None:
        super().__init__()
        self.conv = nn.Sequential(_cbr(c, c * e), _cbr(c * e, c * e, groups=c * e, k=3),
                                  nn.Conv2d(c * e, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c))  # as torchvision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class _DenseLayer(nn.Module):
    """DenseNet's layer: the concatenation is a local variable held until the bottleneck convolution returns."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm, self.relu = nn.BatchNorm2d(2 * c), nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(2 * c, 4 * c, 1, bias=False)
        self.out = nn.Conv2d(4 * c, c, 3, padding=1, bias=False)

    def bottleneck(self, a: torch.Tensor) -> torch.Tensor:  # DenseNet's ``bn_function``
        cat = torch.cat([a, a * 2], 1)
        return self.conv(self.relu(self.norm(cat)))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.cat([a, self.out(self.bottleneck(a))], 1)  # DenseNet's features are read again


class _CrossStage(nn.Module):
    """CSPNet's cross-stage partial block: ``x``, the split halves and ``xb`` are locals held until the
    transition returns, its argument too."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.exp, self.blocks = _cbr(c, 4 * c), _cbr(2 * c, 2 * c, k=3)
        self.trans_b, self.trans = _cbr(2 * c, 2 * c), _cbr(4 * c, 2 * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.exp(x)
        xs, xb = x.split(x.shape[1] // 2, dim=1)
        xb = self.trans_b(self.blocks(xb)).contiguous()
        return self.trans(torch.cat([xs, xb], dim=1))


class _ConvStage(nn.Module):
    def __init__(self, block: type, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.block = block(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.stem(x)).mean()


@pytest.mark.parametrize("block", [_InvertedResidual, _DenseLayer, _CrossStage])
def test_frame_rules_agree_with_the_eager_reference_on_conv_blocks(block: type) -> None:
    import dippm_nas

    spec = InputSpec(shape=(3, 32, 32), batch_size=16)
    g = dippm_nas.capture(_ConvStage(block), spec, cache=False)
    ref = reference_activation_peak(_ConvStage(block), spec)
    flow = activation_liveness(g, include_inputs=False).peak_allocated_bytes
    eager = activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
    assert flow < ref.peak_block_bytes        # the dataflow liveness misses the frame's reference
    # the inverted-residual / concatenation / conv-norm / CSP rules close the gap (up to the graph's batch-norm statistics
    # outputs, 512 B blocks that eager PyTorch does not allocate in eval mode)
    assert eager == pytest.approx(ref.peak_block_bytes, rel=1e-3)
    assert activation_liveness_many([g], retention=True, include_inputs=False)[0].peak_allocated_bytes == eager


def test_a_conv_norm_module_holds_its_argument_until_the_norm_returns() -> None:
    import dippm_nas

    # Inception's / DLA's ``BasicConv2d`` chain outside residual blocks: each ``conv, norm, act`` is a module
    # of its own (nested in an ``nn.Sequential``), so the caller holds its argument until the norm returns
    model = nn.Sequential(_cbr(3, 8, k=3), _cbr(8, 32, k=3), _cbr(32, 32, k=3), _cbr(32, 8, k=3))
    spec = InputSpec(shape=(3, 32, 32), batch_size=16)
    g = dippm_nas.capture(model, spec, cache=False)
    ref = reference_activation_peak(model, spec)
    eager = activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
    assert activation_liveness(g, include_inputs=False).peak_allocated_bytes < ref.peak_block_bytes
    assert eager == pytest.approx(ref.peak_block_bytes, rel=1e-3)
    assert activation_liveness_many([g], retention=True, include_inputs=False)[0].peak_allocated_bytes == eager


class _WindowAttention(nn.Module):
    """Swin's attention written out: ``qkv.permute(..)[i]`` selects are views of the projection, the scaled
    query a local until the output matmul, and ``matmul`` copies the permuted key and value to contiguous
    memory while it runs."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * (d // self.heads) ** -0.5
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))


class _Select(nn.Module):
    """``h[:, 0]`` is a view: the whole of ``h`` lives while the selected part is read."""

    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d, 8 * d), nn.Linear(d, 4 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).reshape(x.shape[0], 8, -1)[:, 0]) * 2


@pytest.mark.parametrize(("model", "shape"), [(_WindowAttention, (49, 64)), (_Select, (256,))])
def test_selects_are_views_and_explicit_attention_copies_permuted_operands(model: type, shape: tuple) -> None:
    import dippm_nas

    spec = InputSpec(shape=shape, batch_size=64)
    g = dippm_nas.capture(model(), spec, cache=False)
    ref = reference_activation_peak(model(), spec)
    eager = activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
    assert eager == pytest.approx(ref.peak_block_bytes, rel=1e-3)
    assert activation_liveness_many([g], retention=True, include_inputs=False)[0].peak_allocated_bytes == eager


@pytest.mark.parametrize("block", [_Block, _PreNorm, _PostNorm])
def test_eager_retention_agrees_with_the_eager_reference(block: type) -> None:
    import dippm_nas

    spec = InputSpec(shape=(64,), batch_size=512)
    g = dippm_nas.capture(_Stage(block), spec, cache=False)
    ref = reference_activation_peak(_Stage(block), spec)
    flow = activation_liveness(g, include_inputs=False).peak_allocated_bytes
    eager = activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
    assert flow == ref.dataflow_peak_bytes < ref.peak_block_bytes   # the graph is the eager trace's dataflow
    assert eager == ref.peak_block_bytes                            # and the retention rules close the gap
    assert activation_liveness_many([g], retention=True, include_inputs=False)[0].peak_allocated_bytes == eager


def test_cpu_memory_keeps_the_dataflow_liveness_with_the_input_and_no_sigma() -> None:
    g = residual_graph()
    e = estimate(g, "host-cpu")
    flow = activation_liveness(g).peak_allocated_bytes / MIB
    assert e.activations_peak_mib == pytest.approx(flow) and e.input_mib == 0.0
    assert e.memory_mib == pytest.approx(e.baseline_mib + g.param_bytes / MIB + flow)
    assert e.memory_mib_std is None and e.allocator_overhead_mib == 0.0


# ----------------------------------------------------------------------------- sigma
def test_analytic_gpu_memory_has_a_sigma_from_its_parts() -> None:
    g = residual_graph()
    p = predict(g, "a100-sxm4-40gb", mig=False)
    d = p.details
    expected = math.sqrt((ACTIVATION_REL_SIGMA * d["activations_peak_mib"]) ** 2
                         + (CONTEXT_REL_SIGMA * d["baseline_mib"]) ** 2 + (0.5 * d["allocator_overhead_mib"]) ** 2)
    assert p.memory_mib_std == pytest.approx(expected) and d["memory_std_mib"] == p.memory_mib_std
    assert d["memory_std_cudnn_workspace_mib"] == 0.0  # no convolution here


def with_provenance(g: OperatorGraph) -> OperatorGraph:
    """``g`` with each node's provenance: one module (``blocks``) the whole pass runs in, nothing in place."""
    d = g.to_dict()
    for nd in d["nodes"]:
        nd["ms"], nd["ip"] = ["blocks"], 0
    return OperatorGraph.from_dict(d)


def test_activation_sigma_is_the_provenance_rules_own_where_the_graph_carries_provenance() -> None:
    plain = residual_graph()
    prov = with_provenance(plain)
    assert not plain.has_provenance and prov.has_provenance
    assert ACTIVATION_REL_SIGMA_PROVENANCE < ACTIVATION_REL_SIGMA
    dev = "a100-sxm4-40gb"
    for ac in (None, "float16"):
        many = estimate_many([plain, prov, plain], dev, autocast=ac)  # the stacked path, mixed
        for g, rel, m in ((plain, ACTIVATION_REL_SIGMA, many[0]), (prov, ACTIVATION_REL_SIGMA_PROVENANCE, many[1]),
                          (plain, ACTIVATION_REL_SIGMA, many[2])):
            d = predict(g, dev, mig=False, autocast=ac).details
            assert d["activations_peak_mib"] > 0
            assert d["memory_std_activations_mib"] == pytest.approx(rel * d["activations_peak_mib"])
            assert m.memory_mib_std == pytest.approx(d["memory_std_mib"])
    p_plain, p_prov = (predict(g, dev, mig=False) for g in (plain, prov))
    assert p_prov.memory_mib_std < p_plain.memory_mib_std


def test_gnn_predictor_passes_the_analytic_memory_sigma_through() -> None:
    import dippm_nas

    p = dippm_nas.predict(residual_graph(), None, "a100-sxm4-40gb")
    assert p.memory_source == "analytic" and p.memory_mib_std is not None and p.memory_mib_std > 0


def test_convolutions_add_the_cudnn_allowance() -> None:
    n, c = 4, 8
    node = OpNode(index=0, op="nn.conv2d", op_class="conv", output_shapes=((n, c, 16, 16),), output_dtype="float32",
                  input_shapes=((n, c, 16, 16), (c, c, 3, 3)), input_is_param=(False, True), attrs={"groups": 1},
                  flops=1, macs=1, bytes_read=1, bytes_written=n * c * 256 * 4, param_bytes=c * c * 9 * 4)
    g = OperatorGraph(nodes=[node], edges=[], input_consumers={"x": [0]}, outputs=[0],
                      spec=InputSpec(shape=(c, 16, 16), batch_size=n), param_count=c * c * 9,
                      param_bytes=c * c * 9 * 4, mode="export").validate()
    d = predict(g, "a100-sxm4-40gb", mig=False).details
    assert d["memory_std_cudnn_workspace_mib"] == CUDNN_WORKSPACE_SIGMA_MIB and d["cudnn_workspace_mib"] == 0.0


# ----------------------------------------------------------------------------- MIG margin
def _pred(memory_mib: float, std: float | None) -> Prediction:
    return Prediction(latency_ms=1.0, energy_j=0.1, memory_mib=memory_mib, latency_source="analytic",
                      energy_source="analytic", memory_source="analytic", device="a100-sxm4-40gb", batch_size=1,
                      dtype="float16", memory_mib_std=std)


def test_mig_fit_with_little_headroom_is_never_silent() -> None:
    usable = next(p for p in get_device("a100-sxm4-40gb").mig_profiles if p.name == "1g.5gb").usable_memory_mib
    no_std = advise(_pred(usable - 190.0, None), "a100-sxm4-40gb")
    a = no_std.profile("1g.5gb")
    assert a.fits and no_std.memory_std_missing and "no margin" in a.note and "190 MiB headroom" in a.note
    with_std = advise(_pred(usable - 190.0, 200.0), "a100-sxm4-40gb")  # k_sigma 1: 190 MiB < 1 sigma
    assert not with_std.profile("1g.5gb").fits and with_std.smallest_fit == "1g.10gb"
    assert not with_std.memory_std_missing and with_std.profile("1g.10gb").note == ""


# ----------------------------------------------------------------------------- the eager reference
class _HoldsLocals(nn.Module):
    """``a`` stays bound to a local after its last use: eager keeps it, a dataflow liveness frees it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2
        b = a + 1
        v = b.view(-1)           # a view: no new storage
        v.relu_()                # in place: no new storage
        c = b * 3
        return c.sum()


def test_reference_tracks_python_frames_views_and_in_place_ops() -> None:
    n = 1024
    r = reference_activation_peak(_HoldsLocals(), InputSpec(shape=(n,), batch_size=1))
    t = n * 4
    assert r.peak_bytes == 3 * t + 4            # a, b, c and the sum's 4 bytes (x is the caller's)
    assert r.peak_block_bytes == 3 * t + 512    # each storage rounded to 512 B
    assert r.dataflow_peak_bytes == 2 * t       # at c: b and c; a freed after b
    assert r.input_bytes == t and r.output_bytes == 4 and r.device == "cpu"


def test_reference_needs_no_real_weights_and_casts_like_half() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    r = reference_activation_peak(model, InputSpec(shape=(256,), batch_size=8, dtype="float16"))
    # at the ReLU: its input (held by nn.Sequential until the ReLU returns) and its output, 8x512 fp16 each
    assert r.peak_bytes == 2 * 8 * 512 * 2 and r.input_bytes == 8 * 256 * 2 and r.output_bytes == 8 * 10 * 2


def test_autocast_liveness_counts_run_time_dtypes_and_casts() -> None:
    import dippm_nas

    model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.ReLU(), nn.Linear(512, 10, bias=False))
    spec = InputSpec(shape=(256,), batch_size=8)
    g = dippm_nas.capture(model, spec, cache=False)
    m = activation_liveness(g, retention=True, include_inputs=False, autocast="float16")
    # at the second GEMM: the first weight's cached cast (512x256x2 B), the ReLU's float16 output (8x512x2),
    # the second weight's cast (10x512x2) and the float16 output (8x10x2 -> one 512 B block); the input's
    # cast (8x256x2) lived only while the first GEMM ran
    assert m.peak_allocated_bytes == 512 * 256 * 2 + 8 * 512 * 2 + 10 * 512 * 2 + 512
    if torch.backends.cuda.is_built():  # the CUDA-autocast reference needs a CUDA-enabled build, no GPU
        ref = reference_activation_peak(model, spec, device="cuda", autocast="float16")
        assert ref.peak_block_bytes == m.peak_allocated_bytes
    fp32 = activation_liveness(g, retention=True, include_inputs=False)
    assert fp32.peak_allocated_bytes == 2 * 8 * 512 * 4


def test_estimate_and_predict_price_the_autocast_pass() -> None:
    import dippm_nas

    model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.ReLU(), nn.Linear(512, 10, bias=False))
    g = dippm_nas.capture(model, InputSpec(shape=(256,), batch_size=8), cache=False)
    for ac in (None, "float16"):
        want = activation_liveness(g, retention=True, include_inputs=False, autocast=ac).peak_allocated_bytes / 2**20
        e = estimate(g, "a100-sxm4-40gb", autocast=ac)
        assert e.activations_peak_mib == pytest.approx(want)
        assert [m.activations_peak_mib for m in estimate_many([g, g], "a100-sxm4-40gb", autocast=ac)] == \
            pytest.approx([want, want])
        assert predict(g, "a100-sxm4-40gb", mig=False, autocast=ac).details["activations_peak_mib"] == \
            pytest.approx(want)
    # the float16 pass holds the first weight's cached cast: more than the float32 activations here
    assert estimate(g, "a100-sxm4-40gb", autocast="float16").activations_peak_mib > \
        estimate(g, "a100-sxm4-40gb").activations_peak_mib


def _with_stacks(g: OperatorGraph, stacks: Callable[[int], list[str]]) -> OperatorGraph:
    d = g.to_dict()
    for i, nd in enumerate(d["nodes"]):
        nd["ms"], nd["ip"] = stacks(i), 0
    return OperatorGraph.from_dict(d)


def test_graphs_of_one_structure_with_different_module_stacks_do_not_share_their_memory() -> None:
    """The facts are cached by the structural hash, which leaves provenance out: the liveness priced from one
    graph's module stacks must not answer for another's (a stem whose output the caller's frame holds while the
    stages run, against one module around the whole pass)."""
    plain = residual_graph()
    one = with_provenance(plain)
    stem = _with_stacks(plain, lambda i: ["stem"] if i <= 1 else ["stages", f"stages.{(i - 2) // 3}"])
    assert one.structural_hash() == stem.structural_hash()
    assert one.provenance_digest() != stem.provenance_digest() and plain.provenance_digest() is None
    own = {id(g): activation_liveness(g, retention=True, include_inputs=False).peak_allocated_bytes
           for g in (one, stem)}
    assert own[id(one)] != own[id(stem)]
    dev = "a100-sxm4-40gb"
    for order in ((one, stem), (stem, one)):
        clear_graph_facts()
        many = estimate_many(list(order), dev)
        for g, m in zip(order, many):
            d = predict(g, dev, mig=False).details
            assert d["activations_peak_mib"] == pytest.approx(own[id(g)] / 2**20)
            assert m.memory_mib == pytest.approx(predict(g, dev, mig=False).memory_mib)
