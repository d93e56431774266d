"""The input flags of ``predict`` and ``inspect``: ``--batch``, ``--dtype``, and ``--shape`` or ``--input``.

Shapes are per sample, without the batch dimension; ``--batch`` is prepended to every input:
``--shape 3,224,224 --batch 8`` is one float tensor of shape (8, 3, 224, 224), and
``--input input_ids:128:int64 --input attention_mask:128:int64 --batch 8`` two int64 tensors of shape (8, 128),
passed to ``forward`` as keywords in that order.
"""

from __future__ import annotations

import argparse
from typing import Any

from dippm_nas.cli._grammar import ListAction, UsageError, check_name, positive_int
from dippm_nas.spec import COMPUTE_DTYPES, TENSOR_DTYPES, InputSpec, TensorSpec, parse_shape
from dippm_nas.errors import InputSpecError

__all__ = ["add_input_args", "input_specs", "parse_input", "DEFAULT_SHAPE"]

DEFAULT_SHAPE = "3,224,224"


def _dtype(text: str) -> str:
    return check_name("dtype", text.strip().lower(), COMPUTE_DTYPES)


def parse_input(text: str) -> TensorSpec:
    """``NAME:SHAPE[:DTYPE[:HIGH]]`` -> :class:`TensorSpec`: ``input_ids:128:int64``, ``pixel_values:3x224x224``,
    ``input_ids:1x128:int64:30522`` (integer values drawn from [0, HIGH), e.g. a vocabulary size; default 2).
    SHAPE is per sample (``128`` or ``1x128`` or ``1,128``), without the batch dimension. Without DTYPE the input
    follows ``--dtype``."""
    parts = text.split(":")
    if len(parts) < 2 or len(parts) > 4 or not parts[0] or not parts[1]:
        raise UsageError(f"--input takes NAME:SHAPE[:DTYPE[:HIGH]] like input_ids:128:int64, got {text!r}")
    name, shape_text = parts[0], parts[1]
    dtype = parts[2].strip().lower() if len(parts) > 2 and parts[2] else None
    if dtype is not None:
        check_name("dtype", dtype, TENSOR_DTYPES)
    high = 2
    if len(parts) == 4:
        try:
            high = int(parts[3])
        except ValueError:
            raise UsageError(f"--input {text!r}: HIGH must be an int >= 1 (e.g. a vocabulary size)") from None
    try:
        return TensorSpec(name=name, shape=parse_shape(shape_text), dtype=dtype, high=high)
    except InputSpecError as e:
        raise UsageError(f"--input {text!r}: {e}") from None


def add_input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", action=ListAction, item=positive_int("--batch"), default=[1], metavar="N",
                   help="batch sizes, e.g. --batch 1 8 64 or --batch 1,8,64 (default 1)")
    p.add_argument("--dtype", action=ListAction, item=_dtype, default=["float32"], metavar="T",
                   help=f"compute dtypes, of {', '.join(COMPUTE_DTYPES)} (default float32; a list like --batch)")
    p.add_argument("--shape", default=None,
                   help=f"per-sample shape of a single-input model, C,H,W or CxHxW (default {DEFAULT_SHAPE})")
    p.add_argument("--input", action="append", default=None, type=str, metavar="NAME:SHAPE[:DTYPE[:HIGH]]",
                   help="a named model input, repeatable, in forward's keyword order, e.g. input_ids:128:int64; "
                        "SHAPE is per sample (128 or 1x128), the batch is prepended; integer values are drawn "
                        "from [0, HIGH) (default 2: safe for any embedding); instead of --shape")


def input_specs(args: argparse.Namespace) -> list[InputSpec]:
    """One :class:`InputSpec` per (batch, dtype) of the flags, batch-major."""
    if args.input and args.shape is not None:
        raise UsageError("give --shape (one input) or --input NAME:SHAPE[:DTYPE] (named inputs), not both")
    kw: dict[str, Any]
    if args.input:
        tensors = tuple(parse_input(t) for t in args.input)
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            raise UsageError(f"--input names must be unique, got {names}")
        kw = {"inputs": tensors}
    else:
        try:
            kw = {"shape": parse_shape(args.shape or DEFAULT_SHAPE)}
        except InputSpecError as e:
            raise UsageError(f"--shape: {e}") from None
    try:
        return [InputSpec(batch_size=b, dtype=d, **kw) for b in args.batch for d in args.dtype]
    except InputSpecError as e:
        raise UsageError(str(e)) from None


def describe(spec: InputSpec) -> str:
    """``(8, 3, 224, 224) float32`` or ``input_ids (8, 128) int64, attention_mask (8, 128) int64``."""
    if spec.inputs is None:
        return f"{tuple(spec.batched_shapes()['x'])} {spec.dtype}"
    return ", ".join(f"{t.name} {(spec.batch_size, *t.shape)} {spec.tensor_dtype(t)}" for t in spec.tensors)
