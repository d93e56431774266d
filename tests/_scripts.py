"""Load a repository script (``scripts/NAME.py``, ``scripts/fit/NAME.py``) as a module, to test its functions and ``main``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` (or ``scripts/fit/<name>.py``, the fitting scripts) imported under the module name
    ``name``."""
    path = ROOT / "scripts" / f"{name}.py"
    if not path.is_file():
        path = ROOT / "scripts" / "fit" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
