"""Numbers and flags given by users: Python ints, floats and bools and NumPy scalars alike.

A batch size read from a NumPy array (``np.int64(8)``), a budget computed with NumPy (``np.float32(5.0)``) or
a count an NNI ``quniform`` parameter hands over as ``64.0`` is the number it looks like; ``True``, NaN and
``2.9`` where a count is expected are not. Every argument and field check that takes a number goes through
these functions, so the rule is the same everywhere and the error states it with the value given; a flag
(``mig=``) takes a bool, never a truthy string.

The test is :mod:`numbers`' abstract types, which NumPy registers its scalars with (``np.integer`` is an
``Integral``, ``np.floating`` a ``Real``); ``bool`` (an ``Integral`` in Python) and ``np.bool_`` are refused.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from dippm_nas.errors import DippmNasError, InvalidTypeError, InvalidValueError

__all__ = ["is_real", "as_int", "as_real", "as_bool", "as_reals"]


def is_real(value: Any) -> bool:
    """``value`` is a real number: an int, a float or a NumPy integer or floating scalar, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)  # np.bool_ is no numbers.Real


def as_int(value: Any, what: str, *, low: int | None = None, error: type[DippmNasError] = InvalidValueError,
           hint: str = "", or_none: bool = False) -> int:
    """``int(value)`` for a whole number ``>= low``: an int, a NumPy integer, or a float with an integral value
    (``8.0``; NNI's ``quniform`` gives those).

    Args:
        value: what the user gave.
        what: its name in the message (``"batch_size"``, ``"--workers"``).
        low: the smallest value allowed, or ``None``.
        error: the error class raised (a ``DippmNasError``; a ``ValueError`` one for the messages to fit).
        hint: appended to the message.
        or_none: the caller also takes ``None`` (checked before the call); the message says so.

    Raises:
        error: a bool, a string, NaN, a non-integral float, or a value below ``low``; the message states the
            rule and the value.
    """
    ok = is_real(value) and (isinstance(value, numbers.Integral) or (math.isfinite(value) and value == int(value)))
    if ok and (low is None or value >= low):
        return int(value)
    rule = f"{what} must be an int" + (f" >= {low}" if low is not None else "") + (" or None" if or_none else "")
    if not is_real(value):
        why = f" ({type(value).__name__})"
    else:
        why = " (not a whole number)" if not ok and math.isfinite(value) else ""
    raise error(f"{rule}, got {value!r}{why}{hint}")


def as_real(value: Any, what: str, *, low: float | None = None, low_inclusive: bool = True,
            high: float | None = None, high_inclusive: bool = True,
            error: type[DippmNasError] = InvalidValueError, rule: str | None = None, hint: str = "",
            or_none: bool = False) -> float:
    """``float(value)`` for a finite real number in ``[low, high]`` (or the open ends asked for): an int, a float
    or a NumPy scalar.

    Args:
        value: what the user gave.
        what: its name in the message.
        low, high: the bounds, or ``None``; ``low_inclusive`` / ``high_inclusive`` whether they are allowed.
        error: the error class raised.
        rule: the message's rule in place of the generated one (``"{what} must be a finite number > 0"``).
        hint: appended to the message.
        or_none: the caller also takes ``None`` (checked before the call); the generated rule says so.

    Raises:
        error: a bool, a string, NaN, an infinity, or a value out of bounds; the message states the rule and
            the value.
    """
    if is_real(value):
        v = float(value)
        if math.isfinite(v) and (low is None or (v >= low if low_inclusive else v > low)) \
                and (high is None or (v <= high if high_inclusive else v < high)):
            return v
    if rule is None:
        bounds = []
        if low is not None:
            bounds.append(f"{'>=' if low_inclusive else '>'} {low:g}")
        if high is not None:
            bounds.append(f"{'<=' if high_inclusive else '<'} {high:g}")
        rule = f"{what} must be a finite number" + (f" {' and '.join(bounds)}" if bounds else "") \
            + (" or None" if or_none else "")
    why = "" if is_real(value) else f" ({type(value).__name__})"
    raise error(f"{rule}, got {value!r}{why}{hint}")


def as_bool(value: Any, what: str, *, error: type[DippmNasError] = InvalidTypeError) -> bool:
    """``value`` as a bool when it is one (``True``/``False`` or a NumPy bool): ``mig="no"`` or ``1`` is refused
    rather than read as true.

    Raises:
        error: anything else, naming the value.
    """
    if isinstance(value, bool) or type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise error(f"{what} must be True or False, got {type(value).__name__} {value!r}")


def as_reals(values: Any, what: str, *, finite: bool = True, error: type[DippmNasError] = InvalidValueError
             ) -> list[float]:
    """``values`` as a list of floats: a sequence or an array of real numbers (finite unless ``finite=False``;
    NaN and infinities are then kept).

    Raises:
        error: ``values`` is not a sequence (``None``, a number, a string, a mapping), or one item is not a real
            number (a bool, a string, ``None``) or, with ``finite``, not finite; the message names the item.
    """
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        raise error(f"{what} must be a sequence of numbers, got {type(values).__name__} {values!r:.80}")
    out = []
    for i, v in enumerate(values):
        if not is_real(v) or (finite and not math.isfinite(float(v))):
            raise error(f"{what}[{i}] must be a {'finite ' if finite else ''}number, got {v!r:.40}")
        out.append(float(v))
    return out
