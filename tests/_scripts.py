"""Load a repository script (``scripts/NAME.py``, ``scripts/fit/NAME.py``, ``benchmarks/*/NAME.py``) as a module, to
test its functions and ``main``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` (or ``scripts/fit/<name>.py``, the fitting scripts, or ``benchmarks/<kind>/<name>.py``)
    imported under the module name ``name``; a benchmark's folder is put on ``sys.path`` first, as running it does
    (benchmarks import their sibling scripts)."""
    found = [p for p in (ROOT / "scripts" / f"{name}.py", ROOT / "scripts" / "fit" / f"{name}.py") if p.is_file()]
    found += sorted((ROOT / "benchmarks").glob(f"*/{name}.py"))
    assert found, f"no script {name}.py under scripts/ or benchmarks/"
    path = found[0]
    if path.parent.parent.name == "benchmarks" and str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
