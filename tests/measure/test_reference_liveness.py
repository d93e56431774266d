"""The CPU-side live-storage tracker (:func:`dippm_nas.measure.reference_activation_peak`) on tiny models whose
peaks are computed by hand: views and in-place results share their base's storage, a concatenation keeps its
inputs alive while its output is written, autocast's casted copies are counted, a GPU-only operator is refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dippm_nas.errors import MeasurementError  # noqa: E402
from dippm_nas.measure import ActivationReference, GpuOnlyOperatorError, reference_activation_peak  # noqa: E402
from dippm_nas.spec import InputSpec  # noqa: E402

N = 1024          # floats per row
T = N * 4         # bytes of one float32 row


class _ViewsInPlaceConcat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2                 # a: T bytes
        v = a.view(-1, 2)         # a view: no storage of its own
        v.add_(1)                 # in place: no storage
        b = torch.relu(a)         # b: T
        c = torch.cat([a, b])     # c: 2T, while a and b are alive: 4T, the peak
        return c[:1]              # a view of c: the output's storage is c's


class _FreedEarly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x + 1                 # T
        b = a * 3                 # T (a, b: 2T)
        del a                     # a's last reference goes: freed before the next operator
        c = torch.cat([b, b, b])  # 3T with b: 4T, the peak
        del b
        return c.sum()            # 4 bytes, c alive: 3T + 4


def test_views_in_place_and_concat_share_or_keep_storages() -> None:
    r = reference_activation_peak(_ViewsInPlaceConcat(), InputSpec(shape=(N,), batch_size=1))
    assert isinstance(r, ActivationReference)
    assert r.peak_bytes == 4 * T and r.peak_block_bytes == 4 * T          # T is a multiple of 512
    assert r.peak_op_name == "aten.cat.default" and 0 <= r.peak_op_index < r.num_ops
    assert r.peak_op == f"{r.peak_op_index}:aten.cat.default"
    assert r.output_bytes == 2 * T and r.input_bytes == T and r.autocast is None
    assert r.peak_block_mib == pytest.approx(4 * T / 2**20)


def test_a_storage_is_released_when_its_last_reference_goes() -> None:
    r = reference_activation_peak(_FreedEarly(), InputSpec(shape=(N,), batch_size=1))
    assert r.peak_bytes == 4 * T and r.peak_op_name == "aten.cat.default"
    assert r.output_bytes == 4


def test_block_rounding_of_odd_sizes() -> None:
    r = reference_activation_peak(_ViewsInPlaceConcat(), InputSpec(shape=(10,), batch_size=1))
    # a (40 B) and b (40 B) and c (80 B): 160 B, each a 512 B block: 1536 B
    assert r.peak_bytes == 160 and r.peak_block_bytes == 3 * 512


def test_cpu_autocast_counts_the_cached_weight_casts_and_the_activation_cast() -> None:
    model = nn.Linear(256, 512)
    r = reference_activation_peak(model, InputSpec(shape=(256,), batch_size=8), autocast="bfloat16")
    # at the GEMM: the input cast to bfloat16 (8x256x2), the weight's and bias's cached casts (512x256x2,
    # 512x2) and the bfloat16 output (8x512x2)
    assert r.peak_bytes == 8 * 256 * 2 + 512 * 256 * 2 + 512 * 2 + 8 * 512 * 2
    assert r.autocast == "bfloat16" and r.output_bytes == 8 * 512 * 2
    plain = reference_activation_peak(model, InputSpec(shape=(256,), batch_size=8))
    assert plain.peak_bytes == 8 * 512 * 4


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="needs a CUDA-enabled torch build (no GPU needed)")
def test_cuda_autocast_runs_layer_norm_in_float32_and_attention_fused() -> None:
    model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.LayerNorm(512, elementwise_affine=False))
    r = reference_activation_peak(model, InputSpec(shape=(256,), batch_size=8), device="cuda", autocast="float16")
    # at the layer norm: the cached weight cast (512x256x2), the float16 GEMM output held by nn.Sequential
    # (8x512x2), its float32 cast (8x512x4), the float32 output (8x512x4) and the mean and rstd (8x4 each)
    assert r.peak_bytes == 512 * 256 * 2 + 8 * 512 * 2 + 2 * 8 * 512 * 4 + 2 * 8 * 4
    assert r.output_bytes == 8 * 512 * 4

    class _Attn(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(x, x, x)

    a = reference_activation_peak(_Attn(), InputSpec(shape=(4, 512, 64), batch_size=2), device="cuda")
    scores = 2 * 4 * 512 * 512 * 4
    assert a.peak_bytes < scores  # the fused kernel: no [B, H, S, S] scores


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="needs a CUDA-enabled torch build (no GPU needed)")
def test_cuda_attention_with_a_boolean_mask_runs_the_memory_efficient_kernel() -> None:
    class _Masked(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            keep = torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool, device=x.device).tril()
            return nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=keep)

    spec = InputSpec(shape=(4, 512, 64), batch_size=2)
    a = reference_activation_peak(_Masked(), spec, device="cuda", autocast="float16")
    half_scores = 2 * 4 * 512 * 512 * 2
    # the query, key and value casts (3 x 2x4x512x64x2), the boolean mask (512x512) and its additive float16
    # copy (512x512x2) while the kernel writes its float16 output (2x4x512x64x2), and a few scalars (the
    # where's 0 and -inf, the kernel's seed and offset); no [B, H, S, S] scores
    expected = 4 * 2 * 4 * 512 * 64 * 2 + 512 * 512 + 512 * 512 * 2
    assert expected <= a.peak_bytes <= expected + 64
    assert a.peak_bytes < half_scores


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="needs a CUDA-enabled torch build (no GPU needed)")
def test_cuda_attention_on_5d_tensors_runs_the_math_path_with_its_safe_softmax() -> None:
    """5-D q, k, v (Hiera's mask units): the fused kernels take 4-D tensors only, so the math path runs, and its
    ``_safe_softmax`` holds the softmax, the ``eq(-inf)`` matrix and the row flags while its ``where`` runs."""

    class _Windows(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, heads, windows, tokens, head_dim)
            return nn.functional.scaled_dot_product_attention(x, x * 2, x * 3)

    b, h, w, n, d = 2, 2, 4, 64, 32
    r = reference_activation_peak(_Windows(), InputSpec(shape=(h, w, n, d), batch_size=b), device="cuda")
    qkv, scores = b * h * w * n * d * 4, b * h * w * n * n * 4
    # inside the safe softmax: k and v (x * 2, x * 3), the scaled query, the scores, the softmax, the boolean
    # matrix, the row flags, two scalars and the result
    assert r.peak_block_bytes == 3 * qkv + 3 * scores + scores // 4 + 1024 + 2 * 512
    assert r.peak_op_name == "aten.where.self"


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="needs a CUDA-enabled torch build (no GPU needed)")
def test_cuda_attention_on_3d_tensors_follows_this_pytorch() -> None:
    from dippm_nas.measure._liveness import _sdpa_unsqueezes_3d

    class _Folded(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B * heads, tokens, head_dim)
            return nn.functional.scaled_dot_product_attention(x, x, x)

    a = reference_activation_peak(_Folded(), InputSpec(shape=(512, 64), batch_size=8), device="cuda")
    scores = 8 * 512 * 512 * 4
    assert (a.peak_bytes < scores) == _sdpa_unsqueezes_3d()  # fused kernels where PyTorch unsqueezes to 4-D


def test_gpu_only_operator_is_refused_by_name() -> None:
    lib = torch.library.Library("dippm_reftest", "DEF")  # noqa: F841 - kept alive for the test
    lib.define("gpu_only(Tensor x) -> Tensor")
    lib.impl("gpu_only", lambda x: x.clone(), "CUDA")
    lib.impl("gpu_only", lambda x: torch.empty_like(x), "Meta")

    class _NeedsGpu(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.dippm_reftest.gpu_only(x + 1)

    with pytest.raises(GpuOnlyOperatorError, match="dippm_reftest::gpu_only"):
        reference_activation_peak(_NeedsGpu(), InputSpec(shape=(N,), batch_size=1))
    assert issubclass(GpuOnlyOperatorError, MeasurementError)


@pytest.mark.parametrize("bad", [{"device": "tpu"}, {"autocast": "float64"}, {"device": "meta", "autocast": "float16"}])
def test_bad_arguments_are_refused(bad: dict) -> None:
    with pytest.raises(MeasurementError):
        reference_activation_peak(nn.Identity(), InputSpec(shape=(4,), batch_size=1), **bad)
