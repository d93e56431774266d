"""Renamed keywords: the old name keeps working for one release with a :class:`DeprecationWarning`."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["MISSING", "renamed_keyword", "warn_renamed"]

#: The default of a deprecated keyword: "not passed".
MISSING: Any = object()


def renamed_keyword(func: str, old: str, new: str, old_value: Any, new_value: Any, new_default: Any, *,
                    removed_in: str, stacklevel: int = 3) -> Any:
    """The value of keyword ``new``, taken from ``old`` (with a warning) when the caller used the old name.

    Args:
        func: the function's name, for the messages.
        old, new: the old and the new keyword.
        old_value: what the caller passed as ``old`` (:data:`MISSING` when not passed).
        new_value, new_default: what the caller passed as ``new``, and its default.
        removed_in: the release that drops ``old``.
        stacklevel: for :func:`warnings.warn`, pointing at the caller of ``func``.

    Raises:
        TypeError: both keywords were given.
    """
    if old_value is MISSING:
        return new_value
    if new_value is not new_default and new_value != new_default:
        raise TypeError(f"{func}() got both {old}= and {new}=; pass {new}= only")
    warnings.warn(f"{func}({old}=...) is deprecated and will be removed in dippm-nas {removed_in}: pass {new}= "
                  f"(in dippm-nas `device` is a catalogue id, `torch_device` a torch device)",
                  DeprecationWarning, stacklevel=stacklevel)
    return old_value


def warn_renamed(kind: str, old: str, new: str, *, removed_in: str, stacklevel: int = 3) -> None:
    """Warn (``DeprecationWarning``) that the ``kind`` named ``old`` was read or used; ``new`` replaces it.

    Args:
        kind: what is renamed, for the message (``"trial attribute"``, ``"function"``...).
        old, new: the old name and what replaces it.
        removed_in: the release that drops ``old``.
        stacklevel: for :func:`warnings.warn`, pointing at the caller's caller.
    """
    warnings.warn(f"{kind} {old!r} is deprecated and will be removed in dippm-nas {removed_in}: use {new}",
                  DeprecationWarning, stacklevel=stacklevel)
