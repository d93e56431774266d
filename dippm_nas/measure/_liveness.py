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
kernels); ``"cuda"`` works on a CUDA-enabled torch build without a GPU, but PyTorch then cannot query the
GPU and falls back to the math attention, which materialises the scores. ``"meta"`` runs the meta kernels.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from dippm_nas.errors import MeasurementError
from dippm_nas.capture import load_model
from dippm_nas.spec import InputSpec

__all__ = ["ActivationReference", "reference_activation_peak", "CUDA_BLOCK_BYTES"]

logger = logging.getLogger(__name__)

#: Bytes the CUDA caching allocator rounds every block up to (``kMinBlockSize``).
CUDA_BLOCK_BYTES = 512


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
        peak_op: index and name of the operator after which the eager peak was reached.
        device: the fake device the pass ran on.
    """

    peak_bytes: int
    peak_block_bytes: int
    dataflow_peak_bytes: int
    input_bytes: int
    output_bytes: int
    num_ops: int
    peak_op: str
    device: str

    @property
    def peak_mib(self) -> float:
        """:attr:`peak_block_bytes` in MiB (2**20 bytes)."""
        return self.peak_block_bytes / 2**20

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _tracker_class() -> type:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _LiveStorages(TorchDispatchMode):
        """Registers each new output storage; drops dead ones after every operator; keeps the peaks."""

        def __init__(self, preexisting: set[int]) -> None:
            super().__init__()
            self.pre = preexisting
            self.live: dict[int, tuple[Any, int, int]] = {}   # storage cdata -> (weak ref, bytes, uid)
            self.size: list[int] = []
            self.born: list[int] = []
            self.last: list[int] = []
            self.ops = 0
            self.peak = self.peak_block = 0
            self.peak_op = ""

        def _sweep(self) -> None:
            for k in [k for k, v in self.live.items() if v[0].expired()]:
                del self.live[k]

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
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
                self.peak_op = f"{i}:{func}"
            self.peak_block = max(self.peak_block, sum(_block(v[1]) for v in self.live.values()))
            return out

        def uid_of(self, t: Any) -> int | None:
            entry = self.live.get(StorageWeakRef(t.untyped_storage()).cdata)
            return None if entry is None else entry[2]

        def dataflow_peak(self, keep: set[int]) -> int:
            if self.ops == 0:
                return 0
            delta = [0] * (self.ops + 1)
            for u, s in enumerate(self.size):
                end = self.ops - 1 if u in keep else self.last[u]
                delta[self.born[u]] += s
                delta[end + 1] -= s
            best = run = 0
            for d in delta[:-1]:
                run += d
                best = max(best, run)
            return best

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


def reference_activation_peak(model: Any, spec: InputSpec, *, device: str = "cpu") -> ActivationReference:
    """The activation peak of one eager forward pass of ``model`` on ``spec``, exactly, without a GPU.

    The model is run under fake tensors (see the module docstring): its weights and inputs are made as
    fake tensors of the spec's dtype on ``device`` (floating weights cast like ``model.half()``), nothing is
    computed, and the caller's model is not modified.

    Args:
        model: an ``nn.Module`` (its weights may live anywhere, ``meta`` included) or a model SPEC string
            (built on ``meta``: no weights are initialised).
        spec: the input spec (batch size, shapes, dtype).
        device: the fake device, ``"cpu"`` (default), ``"cuda"`` or ``"meta"``.

    Returns:
        An :class:`ActivationReference`.

    Raises:
        MeasurementError: not a module, or the model cannot run on fake tensors (the operator's error is
            chained).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._pytree import tree_flatten

    if not isinstance(spec, InputSpec):
        raise MeasurementError(f"spec must be a dippm_nas.InputSpec, got {spec!r}")
    if device not in ("cpu", "cuda", "meta"):
        raise MeasurementError(f"device must be 'cpu', 'cuda' or 'meta', got {device!r}")
    module = _module_of(model)
    cast = getattr(torch, spec.dtype)
    mode = FakeTensorMode()
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    with mode:
        fake_state = {
            k: torch.empty_strided(v.shape, v.stride(), dtype=cast if v.is_floating_point() else v.dtype,
                                   device=device)
            for k, v in state.items()
        }
        made: dict[str, Any] = {}
        for t in spec.tensors:
            made[t.name] = torch.empty((spec.batch_size, *t.shape), dtype=getattr(torch, spec.tensor_dtype(t)),
                                       device=device)
    args: tuple[Any, ...] = (made["x"],) if spec.inputs is None else ()
    kwargs: dict[str, Any] = {} if spec.inputs is None else made
    pre = {StorageWeakRef(t.untyped_storage()).cdata for t in [*fake_state.values(), *made.values()]}
    tracker = _tracker_class()(pre)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), mode, tracker:
            out = torch.func.functional_call(module, fake_state, args, kwargs)
    except Exception as e:  # noqa: BLE001 - any operator may lack a fake/meta kernel; say which model
        raise MeasurementError(f"the eager pass of {type(module).__name__} on fake {device} tensors failed: "
                               f"{type(e).__name__}: {e}") from e
    finally:
        module.train(was_training)
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    keep = {u for u in (tracker.uid_of(t) for t in outs) if u is not None}
    return ActivationReference(
        peak_bytes=int(tracker.peak), peak_block_bytes=int(tracker.peak_block),
        dataflow_peak_bytes=int(tracker.dataflow_peak(keep)),
        input_bytes=sum(int(t.untyped_storage().nbytes()) for t in made.values()),
        output_bytes=sum(tracker.size[u] for u in keep), num_ops=tracker.ops, peak_op=tracker.peak_op,
        device=device,
    )
