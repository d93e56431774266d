"""Renamed keywords and moved names: the old form keeps working for one release with a :class:`DeprecationWarning`."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["MISSING", "renamed_keyword", "moved_names", "warn_renamed", "warn_deprecated"]

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


def moved_names(module: str, moved: dict[str, str], *, removed_in: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that serves names moved to another module, with a warning.

    The new module is imported by name on the first access of an old name, so the old module keeps no import
    of it: a name moved to a later stage of the flow leaves no backward arrow between the stages.

    Args:
        module: the old module's dotted name, for the messages.
        moved: ``{name: the dotted name of the module that defines it now}``.
        removed_in: the release that drops the old path.

    Raises:
        AttributeError: a name that neither the module nor ``moved`` has (as Python raises it).
    """

    def __getattr__(name: str) -> Any:
        target = moved.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is deprecated and will be removed in dippm-nas {removed_in}: import it "
                      f"from {target}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(target), name)

    return __getattr__


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


def warn_deprecated(old: str, instead: str, *, removed_in: str, stacklevel: int = 3) -> None:
    """Warn (``DeprecationWarning``) that ``old`` (a dotted name, which starts the message) was used; ``instead``
    says what replaces it.

    Args:
        old: the deprecated name, dotted (``"dippm_nas.prior.Execution"``).
        instead: what to use in its place, for the message.
        removed_in: the release that drops ``old``.
        stacklevel: for :func:`warnings.warn`, pointing at the caller's caller.
    """
    warnings.warn(f"{old} is deprecated and will be removed in dippm-nas {removed_in}: {instead}",
                  DeprecationWarning, stacklevel=stacklevel)
