"""Lazy package faces (PEP 562): names of a package imported from their modules on first access.

A package's ``__init__`` lists what it defers, module by module, and takes its module-level ``__getattr__``
and ``__dir__`` from :func:`lazy_face`::

    __getattr__, __dir__ = lazy_face(__name__, {
        "dippm_nas.devices": ("Device", "get_device"),
        "dippm_nas.mig": ("mig",),  # the module itself: the name is its last component
    })

The mapping is a literal (module strings to tuples of name strings) so that ``scripts/architecture_report.py``
reads it as the imports it stands for: each name is an import of its module, checked for stage arrows and
cycles like any other import (``tests/test_architecture.py``). A name resolved once is stored in the package's
namespace, so later accesses do not come back here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(package: str, modules: Mapping[str, Sequence[str]]
              ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of package ``package`` whose names in ``modules`` load on first access.

    Args:
        package: the package's ``__name__``.
        modules: ``{module: names}``: each name is the module's attribute of that name, or the module itself
            when the name is the module's last dotted component (``"dippm_nas.mig": ("mig",)``).

    Returns:
        ``(__getattr__, __dir__)`` to bind at the package's top level. ``__getattr__`` raises
        :class:`AttributeError` for any other name; ``__dir__`` lists the package's namespace and its ``__all__``.

    Raises:
        ValueError: a name listed under two modules.
    """
    where: dict[str, str] = {}
    for module, names in modules.items():
        for name in names:
            if name in where:
                raise ValueError(f"lazy face {package}: {name!r} is listed under both {where[name]!r} and {module!r}")
            where[name] = module

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(module)
        value = loaded if module.rsplit(".", 1)[-1] == name else getattr(loaded, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        namespace = vars(sys.modules[package])
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
