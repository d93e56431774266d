"""Exact activation liveness of an eager forward pass, without a GPU: :func:`reference_activation_peak`.

The model runs eagerly, operator by operator, under ``torch._subclasses.fake_tensor.FakeTensorMode``: every
tensor is a fake one (shape, dtype, device, storage size; no data), so nothing is computed and nothing is
allocated, whatever the model's size. A ``TorchDispatchMode`` sees each ATen operator PyTorch dispatches,
registers the storage of every output that did not exist before, and after each operator drops the storages
whose last reference has gone (a weak reference per storage). What is alive is exactly what eager PyTorch
keeps alive: the operator's inputs and outputs, and every tensor a Python frame still holds (a module's input
held by its caller until the call returns, ``identity = x`` in a residual block, a local variable such as
DenseNet's concatenated features). That last part is what a dataflow liveness (free at last use) misses.

Weights and the caller's inputs are not counted (they exist before the pass); views share their base's
storage and are counted once; in-place operators (``relu_``) allocate nothing. Inside-operator scratch
memory (cuDNN / cuBLAS workspaces) is not seen: it is not a tensor PyTorch dispatches.

Device. The fake tensors live on ``device``: ``"cpu"`` (default) dispatches as a CPU would, e.g. fused
scaled-dot-product attention without the ``[B, H, S, S]`` score matrix (as the CUDA flash / memory-efficient
kernels); ``"cuda"`` works on a CUDA-enabled torch build without a GPU: PyTorch's CUDA operators are
dispatched (cuDNN batch norm, max pooling with indices), and ``F.scaled_dot_product_attention`` is routed to
the flash / memory-efficient operator a GPU would pick, a boolean mask included (without a GPU PyTorch would
fall back to the math attention, which materialises the scores); query, key and value that are not 4-D run
PyTorch's math path as on a GPU (3-D ones as 4-D where this PyTorch unsqueezes them), and its ``_safe_softmax``
(PyTorch >= 2.5) is tracked operator by operator, its intermediates included. ``"meta"`` runs the meta kernels. On ``"cpu"``, an operator that
has a CUDA kernel only is refused with :class:`GpuOnlyOperatorError`, which names it.

Autocast. ``autocast="float16"`` / ``"bfloat16"`` runs the pass under ``torch.autocast`` on the fake
device (CUDA's operator lists on ``"cuda"``, enabled directly since ``torch.autocast`` refuses CUDA without a
GPU). The fake parameters require grad as a model's do, so autocast caches their casts for the whole pass
as it does in eager inference: those casts count, from creation to the end of the pass.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dippm_nas.errors import MeasurementError
from dippm_nas.capture import load_model
from dippm_nas.spec import InputSpec

__all__ = ["ActivationReference", "GpuOnlyOperatorError", "reference_activation_peak", "CUDA_BLOCK_BYTES",
           "REFERENCE_AUTOCAST_DTYPES"]

logger = logging.getLogger(__name__)

#: Bytes the CUDA caching allocator rounds every block up to (``kMinBlockSize``).
CUDA_BLOCK_BYTES = 512


#: ``autocast`` values :func:`reference_activation_peak` accepts (besides ``None``).
REFERENCE_AUTOCAST_DTYPES: tuple[str, ...] = ("float16", "bfloat16")


class GpuOnlyOperatorError(MeasurementError):
    """The CPU-side tracker met an operator PyTorch implements for CUDA only (the message names it)."""


def _block(nbytes: int) -> int:
    return CUDA_BLOCK_BYTES * math.ceil(nbytes / CUDA_BLOCK_BYTES) if nbytes > 0 else 0


@dataclass(frozen=True)
class ActivationReference:
    """Activation memory of one eager forward pass, tracked storage by storage.

    Attributes:
        peak_bytes: most bytes of storages made during the pass that were alive at once (eager liveness:
            Python frames' references included), sampled after each operator.
        peak_block_bytes: the same peak with each storage rounded up to 512 B, what
            ``torch.cuda.max_memory_allocated`` would add for them.
        dataflow_peak_bytes: the peak if every storage were freed right after its last use by an
            operator (outputs of the model kept to the end): the lower bound a graph liveness reaches.
        input_bytes: bytes of the caller's input tensors (held for the whole pass, not in the peaks).
        output_bytes: bytes of the storages the model returns.
        num_ops: ATen operators dispatched.
        peak_op: ``"index:name"`` of the operator after which the eager peak was reached.
        device: the fake device the pass ran on.
        peak_op_index: index (in dispatch order, from 0) of that operator; -1 when no storage was made.
        peak_op_name: its ATen name, e.g. ``"aten.convolution.default"``.
        autocast: ``None`` or the ``torch.autocast`` dtype the pass ran under (``"float16"``/``"bfloat16"``).
    """

    peak_bytes: int
    peak_block_bytes: int
    dataflow_peak_bytes: int
    input_bytes: int
    output_bytes: int
    num_ops: int
    peak_op: str
    device: str
    peak_op_index: int = -1
    peak_op_name: str = ""
    autocast: str | None = None

    @property
    def peak_mib(self) -> float:
        """:attr:`peak_block_bytes` in MiB (2**20 bytes)."""
        return self.peak_block_bytes / 2**20

    @property
    def peak_block_mib(self) -> float:
        """:attr:`peak_block_bytes` in MiB (the figure the prior's ``activations_peak_mib`` is held to)."""
        return self.peak_block_bytes / 2**20

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _gpu_only(func: Any) -> bool:
    """Whether ATen operator ``func`` has a CUDA kernel and no CPU nor composite one (cannot run on a CPU)."""
    import torch

    name = func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        cuda = has(name, "CUDA")
    except RuntimeError:  # an operator without a dispatcher entry (``prim::device``): not a kernel
        return False
    return cuda and not any(has(name, k) for k in _CPU_KEYS)


_CPU_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
             "CompositeImplicitAutograd")


def _dataflow_peak(size: list[int], born: list[int], last: list[int], ops: int, keep: set[int]) -> int:
    """Peak bytes if each storage lived from its birth to its last use (those of ``keep`` to the end)."""
    if ops == 0:
        return 0
    delta = [0] * (ops + 1)
    for u, s in enumerate(size):
        end = ops - 1 if u in keep else last[u]
        delta[born[u]] += s
        delta[end + 1] -= s
    best = run = 0
    for d in delta[:-1]:
        run += d
        best = max(best, run)
    return best


def _safe_softmax_tracked(run: Any, types: Any, x: Any, dim: int, dtype: Any = None) -> Any:
    """``aten._safe_softmax`` (the SDPA math path's softmax from PyTorch 2.5) as its composite kernel runs it
    (``_safe_softmax`` in ``aten/src/ATen/native/transformers/attention.cpp``), each operator through ``run`` (the
    tracker's dispatch, so each is tracked): ``softmax``, ``eq(-inf)`` and ``all`` over the scores, ``where``; the
    softmax, the boolean matrix and the row flags are alive until the ``where`` returns (dispatched as one
    operator, its intermediates would not be seen)."""
    import torch

    aten = torch.ops.aten
    src = x if dtype is None else run(aten._to_copy.default, types, (x,), {"dtype": dtype})
    out = run(aten._softmax.default, types, (src, dim, False))
    opts = {"dtype": out.dtype, "device": out.device}
    neg_inf = run(aten.scalar_tensor.default, types, (-math.inf,), opts)
    masked = run(aten.eq.Tensor, types, (x, neg_inf))
    masked_rows = run(aten.all.dim, types, (masked, dim, True))
    zero = run(aten.scalar_tensor.default, types, (0.0,), opts)
    return run(aten.where.self, types, (masked_rows, zero, out))


def _tracker_class() -> type:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _LiveStorages(TorchDispatchMode):
        """Registers each new output storage; drops dead ones after every operator; keeps the peaks."""

        def __init__(self, preexisting: set[int], check_cpu: bool) -> None:
            super().__init__()
            self.pre = preexisting
            self.check_cpu = check_cpu
            self.checked: dict[Any, bool] = {}
            self.live: dict[int, tuple[Any, int, int]] = {}   # storage cdata -> (weak ref, bytes, uid)
            self.size: list[int] = []
            self.born: list[int] = []
            self.last: list[int] = []
            self.ops = 0
            self.peak = self.peak_block = 0
            self.peak_index = -1
            self.peak_name = ""

        def _sweep(self) -> None:
            for k in [k for k, v in self.live.items() if v[0].expired()]:
                del self.live[k]

        def _refuse_gpu_only(self, func: Any) -> None:
            bad = self.checked.get(func)
            if bad is None:
                bad = self.checked[func] = _gpu_only(func)
            if bad:
                raise GpuOnlyOperatorError(
                    f"the model needs {func.name()}, an operator PyTorch implements for CUDA only (no CPU or "
                    f"composite kernel): the CPU-side tracker cannot run it on device 'cpu'; use device='cuda' "
                    f"(a CUDA-enabled torch build, no GPU needed) or replace the operator")

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.name() == "aten::_safe_softmax":
                return _safe_softmax_tracked(self.__torch_dispatch__, types, *args, **(kwargs or {}))
            if self.check_cpu:
                self._refuse_gpu_only(func)
            out = func(*args, **(kwargs or {}))
            i = self.ops
            self.ops += 1
            self._sweep()  # a storage freed before this operator may have left its address to a new one
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor):
                    entry = self.live.get(StorageWeakRef(t.untyped_storage()).cdata)
                    if entry is not None:
                        self.last[entry[2]] = i
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                if ref.cdata in self.pre:
                    continue
                entry = self.live.get(ref.cdata)
                if entry is None:
                    uid = len(self.size)
                    self.live[ref.cdata] = (ref, int(st.nbytes()), uid)
                    self.size.append(int(st.nbytes()))
                    self.born.append(i)
                    self.last.append(i)
                else:
                    self.last[entry[2]] = i
            cur = sum(v[1] for v in self.live.values())
            if cur > self.peak:
                self.peak = cur
                self.peak_index, self.peak_name = i, str(func)
            self.peak_block = max(self.peak_block, sum(_block(v[1]) for v in self.live.values()))
            return out

        def uid_of(self, t: Any) -> int | None:
            entry = self.live.get(StorageWeakRef(t.untyped_storage()).cdata)
            return None if entry is None else entry[2]

    return _LiveStorages


def _module_of(model: Any) -> Any:
    import torch

    if isinstance(model, str):
        try:
            with torch.device("meta"):  # no weight initialisation: shapes are all the pass needs
                built = load_model(model)
        except Exception as e:  # noqa: BLE001 - some builders compute on their weights (reparameterisation)
            logger.debug("building %s on meta failed (%s: %s); building it on the CPU", model, type(e).__name__, e)
            built = load_model(model)
        model = built
    if not isinstance(model, torch.nn.Module):
        raise MeasurementError(f"model must be a torch.nn.Module or a model SPEC string, got {type(model).__name__}")
    return model


@contextlib.contextmanager
def _fused_attention(unsqueeze_3d: bool = False) -> Iterator[None]:
    """``F.scaled_dot_product_attention`` on fake CUDA tensors as a GPU runs it, for the duration.

    Without a GPU, PyTorch's backend choice for CUDA tensors falls back to the math attention, which
    materialises the ``[B, H, S, S]`` scores; a GPU runs the fused kernels, which do not. While this context
    is open, ``torch.nn.functional.scaled_dot_product_attention`` (the name ``nn.MultiheadAttention``,
    ``transformers`` and ``timm`` call) calls the fused operator directly: flash attention for float16 /
    bfloat16 without a mask and a head size of at most 256, else the memory-efficient one (float32, a mask).
    A boolean mask is first turned into an additive one of the query's dtype (``where(mask, 0, -inf)``, as
    PyTorch's ``scaled_dot_product_attention`` does before it picks a kernel, on any device), which the
    memory-efficient kernel then takes, as on a GPU (flash attention takes no mask). Dropout or grouped-query
    attention goes to PyTorch unchanged. Under autocast the query, key and value are cast first, as autocast
    casts them for this operator. Query, key and value that are not 4-D go to PyTorch's math path
    (``_scaled_dot_product_attention_math``), as on a GPU (the fused kernels take 4-D tensors only), except 3-D
    ones where this PyTorch runs them as 4-D (``unsqueeze_3d``, :func:`_sdpa_unsqueezes_3d`): the fused kernels then.
    """
    import torch
    import torch.nn.functional as F  # noqa: N812

    sdpa = F.scaled_dot_product_attention
    aten = torch.ops.aten
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")

    def fused(*args: Any, **kwargs: Any) -> Any:
        a = {**dict(zip(names, args)), **kwargs}
        q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
        if q.device.type != "cuda" or a.get("dropout_p", 0.0) or a.get("enable_gqa", False):
            return sdpa(*args, **kwargs)
        if all(t.dim() == 3 for t in (q, k, v)) and unsqueeze_3d:  # run as 4-D, as this PyTorch does
            m3 = mask.unsqueeze(0) if mask is not None and mask.dim() == 3 else mask
            return fused(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=m3,
                         is_causal=a.get("is_causal", False), scale=a.get("scale")).squeeze(0)
        if any(t.dim() != 4 for t in (q, k, v)):  # the fused kernels take 4-D q, k, v only: PyTorch's math path
            return sdpa(*args, **kwargs)
        if torch.is_autocast_enabled("cuda"):
            low = torch.get_autocast_dtype("cuda")
            q, k, v = (t.to(low) if t.is_floating_point() and t.dtype != low else t for t in (q, k, v))
            mask = mask.to(low) if mask is not None and mask.is_floating_point() and mask.dtype != low else mask
        if mask is not None and mask.dtype == torch.bool:
            zero = torch.scalar_tensor(0.0, dtype=q.dtype, device=q.device)
            mask = torch.where(mask, zero, torch.scalar_tensor(-math.inf, dtype=q.dtype, device=q.device))
        causal, scale = bool(a.get("is_causal", False)), a.get("scale")
        if q.dtype in (torch.float16, torch.bfloat16) and mask is None and q.shape[-1] <= 256:
            return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[0]
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, False, 0.0, causal, scale=scale)[0]

    F.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


@functools.lru_cache(maxsize=1)
def _sdpa_unsqueezes_3d() -> bool:
    """Whether this PyTorch's ``F.scaled_dot_product_attention`` runs 3-D query, key and value as 4-D (an
    ``unsqueeze(0)`` of each before the backend choice, so that a GPU runs the fused kernels on them; later
    versions do): seen on a tiny fake CUDA call, its first operator."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class _First(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.namespace == "aten":
                seen.append(func.name())
            return func(*args, **(kwargs or {}))

    try:
        with FakeTensorMode():
            q = torch.empty(2, 4, 8, device="cuda")
            with _First():
                F.scaled_dot_product_attention(q, q, q)
    except Exception as e:  # noqa: BLE001 - a build without CUDA: no fake CUDA tensors, the CPU path is PyTorch's
        logger.debug("no fake CUDA SDPA call (%s: %s)", type(e).__name__, e)
        return False
    return bool(seen) and seen[0].startswith("aten::unsqueeze")


@contextlib.contextmanager
def _autocast(device: str, dtype: str | None) -> Iterator[None]:
    """``torch.autocast(device, dtype)`` around the pass; on ``"cuda"`` enabled directly, as
    ``torch.autocast.__enter__`` does, since its constructor refuses CUDA when no GPU is present."""
    import torch

    if dtype is None:
        yield
        return
    low = getattr(torch, dtype)
    if device == "cpu":
        with torch.autocast("cpu", dtype=low):
            yield
        return
    prev = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), torch.is_autocast_cache_enabled())
    torch.set_autocast_enabled(device, True)
    torch.set_autocast_dtype(device, low)
    torch.set_autocast_cache_enabled(True)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device, prev[0])
        torch.set_autocast_dtype(device, prev[1])
        torch.set_autocast_cache_enabled(prev[2])


def _fakes(module: Any, spec: InputSpec, mode: Any, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fake weights and buffers of ``module`` (floating ones in the spec's dtype; parameters requiring grad,
    as a model's do, so that autocast caches their casts as it does in eager) and the fake inputs."""
    import torch

    cast = getattr(torch, spec.dtype)
    params = dict(module.named_parameters())
    state = {**params, **dict(module.named_buffers())}
    with mode:
        fake_state = {}
        for k, v in state.items():
            t = torch.empty_strided(v.shape, v.stride(), dtype=cast if v.is_floating_point() else v.dtype,
                                    device=device)
            fake_state[k] = t.requires_grad_(k in params and v.requires_grad and t.is_floating_point())
        made = {t.name: torch.empty((spec.batch_size, *t.shape), dtype=getattr(torch, spec.tensor_dtype(t)),
                                    device=device) for t in spec.tensors}
    return fake_state, made


def _check_args(spec: Any, device: str, autocast: str | None) -> None:
    if not isinstance(spec, InputSpec):
        raise MeasurementError(f"spec must be a dippm_nas.InputSpec, got {spec!r}")
    if device not in ("cpu", "cuda", "meta"):
        raise MeasurementError(f"device must be 'cpu', 'cuda' or 'meta', got {device!r}")
    if autocast is not None and autocast not in REFERENCE_AUTOCAST_DTYPES:
        raise MeasurementError(f"autocast must be None or one of {REFERENCE_AUTOCAST_DTYPES}, got {autocast!r}")
    if autocast is not None and device == "meta":
        raise MeasurementError("autocast needs device 'cpu' or 'cuda' (PyTorch has no autocast for 'meta')")


def reference_activation_peak(model: Any, spec: InputSpec, *, device: str = "cpu",
                              autocast: str | None = None) -> ActivationReference:
    """The activation peak of one eager forward pass of ``model`` on ``spec``, exactly, without a GPU.

    The model is run under ``torch.no_grad()`` and fake tensors (see the module docstring): its weights and
    inputs are made as fake tensors of the spec's dtype on ``device`` (floating weights cast like
    ``model.half()``), nothing is computed, and the caller's model is not modified. With ``autocast`` the
    pass runs under ``torch.autocast(device, dtype=autocast)`` (keep the spec's dtype ``float32``): its casted
    copies of activations are counted from creation to release, and those of the weights, which autocast
    caches, until the pass ends. On ``"cuda"``, PyTorch's CUDA operator lists apply (layer norm and softmax
    in float32, ...), and scaled-dot-product attention runs the fused kernels a GPU runs.

    Args:
        model: an ``nn.Module`` (its weights may live anywhere, ``meta`` included) or a model SPEC string
            (built on ``meta``: no weights are initialised).
        spec: the input spec (batch size, shapes, dtype).
        device: the fake device, ``"cpu"`` (default), ``"cuda"`` (a CUDA-enabled torch build, no GPU needed)
            or ``"meta"``.
        autocast: ``None`` (default), ``"float16"`` or ``"bfloat16"``.

    Returns:
        An :class:`ActivationReference`.

    Raises:
        GpuOnlyOperatorError: on ``"cpu"``, the model dispatches an operator that has a CUDA kernel only
            (the message names it).
        MeasurementError: not a module, a bad argument, or the model cannot run on fake tensors (the
            operator's error is chained).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._pytree import tree_flatten

    _check_args(spec, device, autocast)
    module = _module_of(model)
    mode = FakeTensorMode()
    fake_state, made = _fakes(module, spec, mode, device)
    args: tuple[Any, ...] = (made["x"],) if spec.inputs is None else ()
    kwargs: dict[str, Any] = {} if spec.inputs is None else made
    pre = {StorageWeakRef(t.untyped_storage()).cdata for t in [*fake_state.values(), *made.values()]}
    tracker = _tracker_class()(pre, check_cpu=device == "cpu")
    fused = _fused_attention(_sdpa_unsqueezes_3d()) if device == "cuda" else contextlib.nullcontext()
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), mode, tracker, fused, _autocast(device, autocast):
            out = torch.func.functional_call(module, fake_state, args, kwargs)
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    except GpuOnlyOperatorError:
        raise
    except Exception as e:  # noqa: BLE001 - any operator may lack a fake/meta kernel; say which model
        raise MeasurementError(f"the eager pass of {type(module).__name__} on fake {device} tensors failed: "
                               f"{type(e).__name__}: {e}") from e
    finally:
        module.train(was_training)
    keep = {u for u in (tracker.uid_of(t) for t in outs) if u is not None}
    return ActivationReference(
        peak_bytes=int(tracker.peak), peak_block_bytes=int(tracker.peak_block),
        dataflow_peak_bytes=int(_dataflow_peak(tracker.size, tracker.born, tracker.last, tracker.ops, keep)),
        input_bytes=sum(int(t.untyped_storage().nbytes()) for t in made.values()),
        output_bytes=sum(tracker.size[u] for u in keep), num_ops=tracker.ops,
        peak_op=f"{tracker.peak_index}:{tracker.peak_name}", device=device, peak_op_index=tracker.peak_index,
        peak_op_name=tracker.peak_name, autocast=autocast,
    )
