"""The memory of the SDPA math path by PyTorch version (``dippm_nas/prior/_math_path_memory.py``): what
``_scaled_dot_product_attention_math`` holds (the scaled query to the call's end, float32 copies of half q, k, v and
float32 scores from PyTorch 2.5, the safe softmax's buffers), against the eager tracker and against the bytes of the
C++ function worked by hand; an unknown version leaves the figure as before and says so."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812

from _models import WindowAttention  # noqa: E402
from dippm_nas import InputSpec, capture  # noqa: E402
from dippm_nas.deployment import Deployment  # noqa: E402
from dippm_nas.measure import reference_activation_peak  # noqa: E402
from dippm_nas.prior import DeploymentSettings, activation_liveness, estimate, estimate_many, storage_lives  # noqa: E402

B, W, N, C, HEADS, HD = 2, 4, 64, 64, 2, 32
SPEC = InputSpec(shape=(W, N, C), batch_size=B)


@pytest.fixture(scope="module")
def graph():  # noqa: ANN201
    return capture(WindowAttention(C, HEADS), SPEC)


def _peak(g, **kw) -> int:  # noqa: ANN001
    return activation_liveness(g, retention=True, include_inputs=False, **kw).peak_allocated_bytes


def test_the_capture_marks_the_math_path(graph) -> None:  # noqa: ANN001
    marked = [nd.op for nd in graph.nodes if nd.attrs.get("sdpa_math")]
    assert marked.count("matmul") == 2 and "nn.softmax" in marked


def test_float32_math_path_matches_the_eager_tracker(graph) -> None:  # noqa: ANN001
    """Float32 on the CPU (the math path for 5-D tensors): from PyTorch 2.5 the safe softmax holds its softmax,
    the ``eq(-inf)`` matrix and the row flags while its ``where`` runs, and the tracker sees them."""
    ref = reference_activation_peak(WindowAttention(C, HEADS), SPEC)
    assert _peak(graph, torch_version=torch.__version__) == ref.peak_block_bytes
    # eager's peak is inside the safe softmax: qkv, the scaled query, the scores, the softmax, the boolean matrix,
    # the row flags, two scalars and the result
    s = B * HEADS * W * N * N
    by_hand = B * W * N * 3 * C * 4 + B * HEADS * W * N * HD * 4 + 3 * s * 4 + s + 1024 + 2 * 512
    assert ref.peak_block_bytes == by_hand


class _MaskedWindowAttention(WindowAttention):
    """The same with a mask computed from the input: additive (float) or boolean (made additive by SDPA's entry)."""

    def __init__(self, boolean: bool) -> None:
        super().__init__(C, HEADS)
        self.boolean = boolean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, w, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, w, n, 3, HEADS, HD).permute(3, 0, 4, 1, 2, 5).unbind(0)
        mask = ((x.mean(-1) > 0)[:, None, :, None, :] if self.boolean  # no local holds an intermediate
                else x.mean(-1)[:, None, :, :, None] * x.amax(-1)[:, None, :, None, :])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 3).reshape(b, w, n, c)


@pytest.mark.parametrize("boolean", [False, True])
def test_a_masked_math_path_matches_the_eager_tracker(boolean: bool) -> None:
    """The mask is an argument of the call (held to its end), added to the scores in place; a boolean one is made
    additive in the inputs' dtype first, a local of SDPA's entry."""
    model = _MaskedWindowAttention(boolean)
    g = capture(model, SPEC)
    ref = reference_activation_peak(model, SPEC)
    assert _peak(g, torch_version=torch.__version__) == ref.peak_block_bytes
    assert _peak(g) < ref.peak_block_bytes


def test_half_precision_math_path_is_float32_from_torch_2_5(graph) -> None:  # noqa: ANN001
    """Under float16 autocast on PyTorch >= 2.5 the math path holds float32 copies of q, k and v, float32
    scores, softmax and safe-softmax buffers: the bytes of ``_scaled_dot_product_attention_math``, by hand."""
    s = B * HEADS * W * N * N
    qkv_elems = B * HEADS * W * N * HD
    by_hand = (C * 3 * C * 2            # the weight's cached cast
               + B * W * N * 3 * C * 2  # qkv, float16
               + 4 * qkv_elems * 4      # query_acc, key_acc, value_acc and the scaled query, float32
               + 3 * s * 4              # the scores, the softmax, the safe softmax's result
               + s + 1024 + 2 * 512)    # eq(-inf), the row flags, two scalar tensors
    got = _peak(graph, autocast="float16", torch_version="2.5.1")
    assert got == by_hand  # (the bias's cached cast, 512 B, is the one block eager has beside these)
    assert _peak(graph, autocast="float16", torch_version="2.4.1") < _peak(graph, autocast="float16") < got


def test_unknown_version_prices_the_graph_as_captured(graph) -> None:  # noqa: ANN001
    for ac in (None, "float16"):
        assert _peak(graph, autocast=ac, torch_version=None) == _peak(graph, autocast=ac)
        assert _peak(graph, autocast=ac, torch_version="nightly") == _peak(graph, autocast=ac)
    plain = storage_lives(graph, autocast="float16")
    assert storage_lives(graph, autocast="float16", torch_version="2.13.0") != plain


def test_the_estimate_takes_the_deployment_version_and_labels_it(graph) -> None:  # noqa: ANN001
    new = estimate(graph, "a100-sxm4-40gb",
                   deployment=Deployment(autocast="float16", versions={"torch": "2.6.0"}))
    old = estimate(graph, "a100-sxm4-40gb",
                   deployment=Deployment(autocast="float16", versions={"torch": "2.4.1"}))
    undescribed = estimate(graph, "a100-sxm4-40gb", deployment=DeploymentSettings(autocast="float16"))
    assert new.memory_details["sdpa_math_version_known"] == 1.0 and new.memory_details["sdpa_math_float32"] == 1.0
    assert old.memory_details["sdpa_math_float32"] == 0.0
    assert undescribed.memory_details["sdpa_math_version_known"] == 0.0
    assert "sdpa_math_float32" not in undescribed.memory_details
    assert new.activations_peak_mib > undescribed.activations_peak_mib > old.activations_peak_mib
    assert new.activations_peak_mib == pytest.approx(
        _peak(graph, autocast="float16", torch_version="2.6.0") / 2**20)


def test_estimate_many_prices_the_math_path_as_estimate_does(graph) -> None:  # noqa: ANN001
    plain = capture(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), InputSpec(shape=(8,), batch_size=2))
    for ac, version in ((None, "2.6.0"), ("float16", "2.6.0"), ("bfloat16", "2.4.0")):
        many = estimate_many([graph, plain], "a100-sxm4-40gb",
                             deployment=Deployment(autocast=ac, versions={"torch": version}))
        assert many[0].activations_peak_mib == _peak(graph, autocast=ac, torch_version=version) / 2**20
        assert many[0].memory_details["sdpa_math_float32"] == float(version == "2.6.0")
        assert not any(k.startswith("sdpa_math") for k in many[1].memory_details)


def test_a_graph_without_a_math_path_has_no_label() -> None:
    g = capture(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), InputSpec(shape=(8,), batch_size=2))
    est = estimate(g, "a100-sxm4-40gb", deployment=Deployment(versions={"torch": "2.6.0"}))
    assert not any(k.startswith("sdpa_math") for k in est.memory_details)


class _Block(nn.Module):
    """A pre-norm block: ``x + f(norm(x))`` then ``x + g(norm(x))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.n1, self.n2, self.f, self.g = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.f(self.n1(x))
        return x + self.g(self.n2(x))


class _Transition(nn.Module):
    """A stage transition that does not read its input as a skip (Hiera's first block of a stage)."""

    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.n, self.proj, self.h = nn.LayerNorm(dim), nn.Linear(dim, out), nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.n(x)
        return self.proj(y) + self.h(y)


def _stages() -> nn.Module:
    """Blocks and transitions: each block's output goes to the next module's norm only, which makes it look like
    a post-norm layer's join (``norm(x + f(x))``) to the structural rule; the first sum of a block is freed once
    the block's second join has read it."""
    return nn.Sequential(_Block(32), _Transition(32, 64), _Block(64), _Transition(64, 64), _Block(64))


def test_a_stage_transition_is_not_a_post_norm_layer() -> None:
    spec = InputSpec(shape=(64, 32), batch_size=4)
    model = _stages()
    g = capture(model, spec)
    assert _peak(g) == reference_activation_peak(model, spec).peak_block_bytes
