"""What goes into a model: :class:`InputSpec`, the example input a model is captured with.

An :class:`InputSpec` describes per-sample shapes (without the batch dimension), the batch size and the
compute dtype. Models with one input use ``shape``; models with several inputs (token ids + attention mask,
say) name each one with :class:`TensorSpec`. The model itself (a module, an ONNX file, a SPEC string...) is
a :class:`dippm_nas.capture.ModelSource`.

Half precision (``float16``, ``bfloat16``) is represented as a **model cast**: the graph describes the
model as ``model.half()`` / ``model.to(torch.bfloat16)`` inference runs it, every floating-point weight
and activation in that dtype. It is not ``torch.autocast``, where matmuls and convolutions run in half
precision but reductions, softmax and normalisations stay in float32. (Mechanics: export always runs
in float32, because TVM's PyTorch frontend fixes convolution and matmul outputs to float32, and the
graph's floating-point tensors are then re-typed to the compute dtype; the operators and shapes are
the same, the bytes follow the dtype.) Integer inputs (token ids, masks)
keep the dtype their :class:`TensorSpec` gives.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dippm_nas._deprecation import moved_names
from dippm_nas._numbers import as_int
from dippm_nas.errors import InputSpecError, UnsupportedDtypeError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "MAX_INPUT_ELEMENTS",
    "COMPUTE_DTYPES",
    "TENSOR_DTYPES",
    "TensorSpec",
    "InputSpec",
    "parse_shape",
    "dtype_bytes",
]

#: The model SPEC strings and ONNX file checks live in the capture stage; their names here are deprecated aliases.
__getattr__ = moved_names(__name__, dict.fromkeys(
    ("load_model", "load_callable", "check_onnx_file", "read_onnx_file", "MAX_ONNX_BYTES"), "dippm_nas.capture"),
    removed_in="0.2")

#: Dtypes a model can be captured (and predicted) in.
COMPUTE_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
#: Dtypes an individual input tensor may have (integer inputs carry ids, masks, indices).
TENSOR_DTYPES: tuple[str, ...] = COMPUTE_DTYPES + ("int64", "int32", "bool")

#: Most elements one input tensor may have, batch included: 2**40 (about 1.1e12; 4 TiB in float32, 8x the
#: memory of the largest GPU in the catalogue even at one byte per element). Capture never allocates the
#: inputs, so this bounds what a graph can describe, not this machine's memory; a larger spec is an
#: :class:`InputSpecError`.
MAX_INPUT_ELEMENTS = 2**40

_BYTES_PER_ELEMENT: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``"float32"`` -> 4).

    Raises:
        UnsupportedDtypeError: for a name not in the table.
    """
    try:
        return _BYTES_PER_ELEMENT[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"dtype must be one of {sorted(_BYTES_PER_ELEMENT)}, got {dtype!r}"
        ) from None


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise InputSpecError(
            f"{what} must be a sequence of positive ints without the batch dimension, e.g. (3, 224, 224); "
            f"got {shape!r}" + (" (use parse_shape() for a 'C,H,W' string)" if isinstance(shape, str) else "")
        )
    try:
        return tuple(as_int(d, "dimension", low=1, error=InputSpecError) for d in shape)
    except InputSpecError:
        raise InputSpecError(f"every dimension of {what} must be an int >= 1, got {tuple(shape)!r}") from None


@dataclass(frozen=True)
class TensorSpec:
    """One named model input.

    Args:
        name: the keyword the model's ``forward`` takes this input by.
        shape: per-sample shape, without the batch dimension, e.g. ``(128,)`` for 128 tokens.
        dtype: ``"float32" | "float16" | "bfloat16" | "int64" | "int32" | "bool"``, or ``None`` to
            follow the :class:`InputSpec` compute dtype (for floating-point inputs).
        high: for integer inputs, example values are drawn from ``[0, high)`` (a vocabulary size,
            say). Defaults to 2, which suits masks and is safe for any embedding table.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str | None = None
    high: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InputSpecError(f"input name must be a Python identifier, got {self.name!r}")
        object.__setattr__(self, "shape", _check_shape(self.shape, f"shape of input {self.name!r}"))
        if self.dtype is not None and self.dtype not in TENSOR_DTYPES:
            raise UnsupportedDtypeError(
                f"dtype of input {self.name!r} must be one of {TENSOR_DTYPES} or None, got {self.dtype!r}"
            )
        object.__setattr__(self, "high", as_int(self.high, f"high of input {self.name!r}", low=1,
                                                error=InputSpecError))


@dataclass(frozen=True)
class InputSpec:
    """The example input a model is captured with.

    Args:
        shape: per-sample shape of a single-input model, without the batch dimension, e.g.
            ``(3, 224, 224)``. Exactly one of ``shape`` and ``inputs`` is given.
        batch_size: the batch dimension prepended to every input; ``>= 1``.
        dtype: compute dtype, one of :data:`COMPUTE_DTYPES`. Half precision casts the model (see the
            module docstring).
        inputs: named inputs of a several-input model, passed to ``forward`` as keywords, in order.
            A mapping ``{"input_ids": ((128,), "int64")}`` or a sequence of :class:`TensorSpec`.

    Shapes:
        - single input: ``(batch_size, *shape)``
        - named input ``t``: ``(batch_size, *t.shape)``
    """

    shape: tuple[int, ...] | None = None
    batch_size: int = 1
    dtype: str = "float32"
    inputs: tuple[TensorSpec, ...] | None = field(default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", as_int(self.batch_size, "batch_size", low=1, error=InputSpecError))
        if self.dtype not in COMPUTE_DTYPES:
            raise UnsupportedDtypeError(
                f"dtype must be one of {COMPUTE_DTYPES}, got {self.dtype!r}"
            )
        if (self.shape is None) == (self.inputs is None):
            raise InputSpecError(
                "give exactly one of shape= (single-input model) and inputs= (named inputs); "
                f"got shape={self.shape!r}, inputs={self.inputs!r}"
            )
        if self.shape is not None:
            object.__setattr__(self, "shape", _check_shape(self.shape, "shape"))
        else:
            object.__setattr__(self, "inputs", self._normalise_inputs(self.inputs))
        for t in self.tensors:
            n = math.prod((self.batch_size, *t.shape))
            if n > MAX_INPUT_ELEMENTS:
                raise InputSpecError(
                    f"input {t.name!r} of shape {(self.batch_size, *t.shape)} has {n:,} elements; an input may have "
                    f"at most MAX_INPUT_ELEMENTS = 2**40 ({MAX_INPUT_ELEMENTS:,}), batch included, more than any "
                    "device in the catalogue holds. Lower batch_size or the shape"
                )

    @staticmethod
    def _normalise_inputs(inputs: Any) -> tuple[TensorSpec, ...]:
        if isinstance(inputs, Mapping):
            out = []
            for name, v in inputs.items():
                if isinstance(v, TensorSpec):
                    out.append(v)
                elif isinstance(v, Mapping):
                    _check_keys(v, _TENSOR_KEYS[1:], ("shape",), f"inputs[{name!r}]")
                    out.append(TensorSpec(name=name, **v))
                elif isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], (str, type(None))) \
                        and isinstance(v[0], Sequence):
                    out.append(TensorSpec(name=name, shape=tuple(v[0]), dtype=v[1]))
                else:
                    out.append(TensorSpec(name=name, shape=v))
            items = tuple(out)
        elif isinstance(inputs, Sequence) and not isinstance(inputs, str) \
                and all(isinstance(t, TensorSpec) for t in inputs):
            items = tuple(inputs)
        else:
            raise InputSpecError(
                "inputs must be a mapping {name: shape | (shape, dtype) | TensorSpec} or a sequence of "
                f"TensorSpec, got {inputs!r}"
            )
        if not items:
            raise InputSpecError("inputs must name at least one input, got an empty collection")
        names = [t.name for t in items]
        if len(set(names)) != len(names):
            raise InputSpecError(f"input names must be unique, got {names}")
        return items

    # ------------------------------------------------------------------ views
    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """Every input as a :class:`TensorSpec` (a single-input spec yields one named ``x``)."""
        if self.inputs is not None:
            return self.inputs
        assert self.shape is not None
        return (TensorSpec(name="x", shape=self.shape),)

    def tensor_dtype(self, t: TensorSpec) -> str:
        """The dtype input ``t`` is created in: its own, else the compute dtype."""
        return t.dtype if t.dtype is not None else self.dtype

    def batched_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: (batch_size, *shape)}`` of every input."""
        return {t.name: (self.batch_size, *t.shape) for t in self.tensors}

    @property
    def input_bytes(self) -> int:
        """Bytes of one batch of inputs."""
        return sum(
            math.prod((self.batch_size, *t.shape)) * dtype_bytes(self.tensor_dtype(t)) for t in self.tensors
        )

    def with_batch_size(self, batch_size: int) -> "InputSpec":
        """A copy with another batch size."""
        return dataclasses.replace(self, batch_size=batch_size)

    def example_inputs(self, device: "str | torch.device" = "cpu") -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Random example tensors ``(args, kwargs)`` for ``model(*args, **kwargs)``.

        A single-input spec gives one positional tensor; named inputs are keywords.
        """
        import torch

        gen = torch.Generator(device="cpu").manual_seed(0)
        made: dict[str, Any] = {}
        for t in self.tensors:
            dt = getattr(torch, self.tensor_dtype(t))
            shape = (self.batch_size, *t.shape)
            if dt.is_floating_point:
                v = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
            elif dt == torch.bool:
                v = torch.ones(shape, dtype=torch.bool)
            else:
                v = torch.randint(0, t.high, shape, generator=gen, dtype=dt)
            made[t.name] = v.to(device)
        if self.inputs is None:
            return (made["x"],), {}
        return (), made

    # ------------------------------------------------------------ serialise
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` rebuilds the spec."""
        d: dict[str, Any] = {"batch_size": self.batch_size, "dtype": self.dtype}
        if self.shape is not None:
            d["shape"] = list(self.shape)
        else:
            d["inputs"] = [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "high": t.high} for t in self.tensors
            ]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "InputSpec":
        """Inverse of :meth:`to_dict`.

        Raises:
            InputSpecError: ``d`` is not a mapping, lacks a key (``batch_size``, ``dtype``, and ``shape`` or
                ``inputs``), has an unknown one, or a value of the wrong type or out of range (a batch size of
                2.9 is refused, never truncated); the message names the key.
        """
        if not isinstance(d, Mapping):
            raise InputSpecError(f"an InputSpec dict (InputSpec.to_dict()) must be a mapping with keys "
                                 f"{list(_SPEC_KEYS)}, got {type(d).__name__} {d!r}")
        _check_keys(d, _SPEC_KEYS, ("batch_size", "dtype"), "an InputSpec dict")
        inputs = d.get("inputs")
        if inputs is None:
            if "shape" not in d:
                raise InputSpecError(f"an InputSpec dict must have the key 'shape' (a single-input model) or "
                                     f"'inputs' (named inputs), got keys {sorted(map(str, d))}")
            return cls(shape=d["shape"], batch_size=d["batch_size"], dtype=d["dtype"])
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise InputSpecError(f"'inputs' of an InputSpec dict must be a list of {{name, shape, dtype, high}} "
                                 f"dicts, got {inputs!r}")
        tensors = []
        for i, t in enumerate(inputs):
            if not isinstance(t, Mapping):
                raise InputSpecError(f"inputs[{i}] of an InputSpec dict must be a mapping with keys "
                                     f"{list(_TENSOR_KEYS)}, got {t!r}")
            _check_keys(t, _TENSOR_KEYS, ("name", "shape"), f"inputs[{i}] of an InputSpec dict")
            tensors.append(TensorSpec(name=t["name"], shape=t["shape"], dtype=t.get("dtype"), high=t.get("high", 2)))
        return cls(inputs=tuple(tensors), batch_size=d["batch_size"], dtype=d["dtype"])


#: Keys of :meth:`InputSpec.to_dict`'s dict.
_SPEC_KEYS = ("shape", "inputs", "batch_size", "dtype")
#: Keys of one named input (:class:`TensorSpec`'s fields).
_TENSOR_KEYS = ("name", "shape", "dtype", "high")


def _check_keys(d: Mapping[Any, Any], allowed: Sequence[str], required: Sequence[str], what: str) -> None:
    """An :class:`InputSpecError` naming the first missing or unknown key of ``d``."""
    missing = [k for k in required if k not in d]
    if missing:
        raise InputSpecError(f"{what} lacks the key {missing[0]!r}; it has {sorted(map(str, d))} (keys: "
                             f"{', '.join(allowed)}; required: {', '.join(required)})")
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        raise InputSpecError(f"{what} has unknown keys {unknown}; the keys are {', '.join(allowed)}")


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse a CLI shape ``"3,224,224"`` into ``(3, 224, 224)``.

    Raises:
        InputSpecError: when a part is not a positive integer.
    """
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise InputSpecError(f"shape must be comma-separated positive ints like 3,224,224, got {text!r}") from None
    return _check_shape(shape, "shape")
