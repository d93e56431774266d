"""Lazy import of optional heavy dependencies with an install hint."""

from __future__ import annotations

import importlib
from types import ModuleType

from dippm_nas.errors import MissingDependencyError

__all__ = ["require"]


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra that provides it.

    Args:
        module: dotted module name, e.g. ``"torchvision"``.
        extra: the dippm-nas extra that installs it, e.g. ``"vision"``.
        feature: what the caller wanted to do, for the message.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(
            f"{feature} needs the optional package {module!r}, which is not installed "
            f"({e}). Install it with: pip install 'dippm-nas[{extra}]'"
        ) from e
