"""The package arrows: stages import only earlier stages, no import cycles, no reaching into private modules.

The imports are read with ``ast`` by ``scripts/architecture_report.py`` (nothing is imported); the stage
layers are its ``LAYERS``. Each rule is also run on a small synthetic tree that breaks it, so the checks can fail.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from _scripts import ROOT, load_script

arch = load_script("architecture_report")


@pytest.fixture(scope="module")
def imports() -> list:
    return arch.collect_imports(ROOT)


def _fmt(rows: list) -> str:
    return "\n".join(f"{i.path}:{i.line} {i.target}" for i in rows)


def test_every_library_package_has_a_stage_layer(imports: list) -> None:
    units = {arch.unit_of(i.importer) for i in imports if "/" not in i.importer}
    assert units - set(arch.LAYERS) == set(), "add the new package to LAYERS in scripts/architecture_report.py"


def test_no_package_imports_a_later_stage(imports: list) -> None:
    bad = arch.arrow_violations(imports)
    assert not bad, "imports of a later stage:\n" + _fmt(bad)


def test_no_import_cycles_even_through_function_body_imports(imports: list) -> None:
    assert arch.module_cycles(imports) == []
    assert arch.package_cycles(imports) == []


def test_no_module_imports_another_packages_private_module(imports: list) -> None:
    bad = [i for i, _ in arch.private_imports(imports) if not i.importer.startswith("tests/")]
    assert not bad, "make these names public in the owning package's __init__:\n" + _fmt(bad)


#: Modules that still import project modules inside function bodies, and why (docs/architecture.md).
LAZY_PROJECT_IMPORTS = {
    "dippm_nas/capture/_capture.py": "SQLAlchemy loads with the first cache used (gpu-campaign runs without it)",
    "dippm_nas/capture/_many.py": "the same, in the capture workers",
    "dippm_nas/capture/_key.py": "the package version, read where the conversion digest is made",
    "dippm_nas/capture/_torch.py": "the converters, loaded with TVM's torch frontend",
    "dippm_nas/capture/_assemble.py": "search_spaces imports torch: `import dippm_nas` and a cached graph's "
                                      "prediction load neither",
    "dippm_nas/capture/_source.py": "search_spaces imports torch: loaded for a candidate named by its space and "
                                    "config (ModelSource.from_space) only",
    "dippm_nas/predictor/_gnn_load.py": "the torch ensemble: a prediction through the numpy engine never loads torch",
    "dippm_nas/predictor/_adapt_store.py": "SQLAlchemy loads with the first adaptation written: a prediction that "
                                           "reads one from a SQLite file does not load it",
    "dippm_nas/measure/_campaign.py": "RuntimeModule is an nn.Module: torch loads with the first non-eager "
                                      "measurement, not with the parser of every CLI verb",
}


def test_imports_of_project_modules_are_at_module_top(imports: list) -> None:
    body = arch.function_body_imports([i for i in imports if "/" not in i.importer], arch.optional_modules(ROOT))
    bad = [i for i in body if arch.is_project(i.target) and not i.path.startswith("dippm_nas/cli/")
           and i.path not in LAZY_PROJECT_IMPORTS]
    assert not bad, "import these at the module top (a cycle is a design problem, not a reason):\n" + _fmt(bad)


def test_stage_order_of_the_flow() -> None:
    L = arch.LAYERS
    assert L["graph"] < L["capture"] < L["features"] < L["predictor"] < L["training"] < L["optuna"] < L["validation"]
    assert L["prior"] < L["features"] and L["nni"] == L["optuna"] and L["cli"] > L["validation"]
    assert L["measure"] < L["predictor"] and L["graph"] < L["predictor"]  # measure, graph know nothing of it


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_the_checks_fail_on_a_tree_that_breaks_each_rule(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pyproject.toml": '[project]\nname = "x"\n[project.optional-dependencies]\nvision = ["torchvision>=0.1"]\n',
        "dippm_nas/__init__.py": "",
        "dippm_nas/graph/__init__.py": "from dippm_nas.graph._g import G\n",
        # graph (an early stage) importing the predictor: a backwards arrow
        "dippm_nas/graph/_g.py": "from dippm_nas.predictor import P\nG = 1\n",
        "dippm_nas/predictor/__init__.py": "from dippm_nas.predictor._a import P\n",
        # _a and _b import each other, _b only inside a function: still a cycle
        "dippm_nas/predictor/_a.py": "from dippm_nas.predictor._b import B\nP = 1\n",
        "dippm_nas/predictor/_b.py": "from dippm_nas.graph import G\ndef f():\n    from dippm_nas.predictor._a import P\n    import torchvision\n"
                                     "    return P\nB = 1\n",
        # a package of no stage
        "dippm_nas/newstage/__init__.py": "from dippm_nas.graph import G\n",
        # a script reaching into a private module and taking a private name
        "scripts/s.py": "from dippm_nas.predictor._a import P\nfrom dippm_nas.graph import _hidden\n",
        # a test may use the privates of the package it tests; counted apart
        "tests/test_x.py": "from dippm_nas.predictor._a import P\n",
    })
    imps = arch.collect_imports(tmp_path)
    arrows = [(arch.unit_of(i.importer), arch.unit_of(i.target)) for i in arch.arrow_violations(imps)]
    assert ("graph", "predictor") in arrows and ("newstage", "graph") in arrows
    cycles = arch.module_cycles(imps)
    assert len(cycles) == 1 and {"dippm_nas.predictor._a", "dippm_nas.predictor._b"} <= set(cycles[0])
    assert arch.package_cycles(imps) == [["graph", "predictor"]]
    priv = {(i.importer, names) for i, names in arch.private_imports(imps)}
    assert priv == {("scripts/s.py", ("P",)), ("scripts/s.py", ("_hidden",)), ("tests/test_x.py", ("P",))}
    body = arch.function_body_imports(imps, arch.optional_modules(tmp_path))
    assert [i.target for i in body] == ["dippm_nas.predictor._a"]  # torchvision is an optional dependency


def test_the_checks_pass_on_a_tree_that_follows_the_rules(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pyproject.toml": '[project]\nname = "x"\n',
        "dippm_nas/__init__.py": "from dippm_nas.predictor import P\n",
        "dippm_nas/graph/__init__.py": "from dippm_nas.graph._g import G\n",
        "dippm_nas/graph/_g.py": "G = 1\n",
        "dippm_nas/predictor/__init__.py": "from dippm_nas.predictor._a import P\n",
        "dippm_nas/predictor/_a.py": "from dippm_nas.graph import G\nfrom dippm_nas.predictor._b import B\nP = G\n",
        "dippm_nas/predictor/_b.py": "B = 1\n",
        "scripts/s.py": "from dippm_nas.predictor import P\n",
    })
    imps = arch.collect_imports(tmp_path)
    assert arch.arrow_violations(imps) == [] and arch.module_cycles(imps) == [] and arch.package_cycles(imps) == []
    assert arch.private_imports(imps) == []


def test_every_lazy_package_face_goes_through_the_helper_the_checks_read() -> None:
    faces = arch.lazy_faces(ROOT)
    assert faces["hand_written"] == [], "declare these with dippm_nas._lazy.lazy_face:\n" + "\n".join(faces["hand_written"])
    assert {f.split(":")[0] for f in faces["helper"]} >= {"dippm_nas/__init__.py", "dippm_nas/cache/__init__.py",
                                                          "dippm_nas/predictor/__init__.py", "dippm_nas/nni/__init__.py"}


def test_a_lazy_face_is_read_as_the_imports_it_makes(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pyproject.toml": '[project]\nname = "x"\n',
        "dippm_nas/__init__.py": "",
        "dippm_nas/_lazy.py": "def lazy_face(p, m):\n    return None, None\n",
        # graph (an early stage) deferring to the predictor: a backwards arrow and, with _a's import, a cycle
        "dippm_nas/graph/__init__.py": "from dippm_nas._lazy import lazy_face\n"
                                       "__getattr__, __dir__ = lazy_face(__name__, {'dippm_nas.predictor._a': ('P',), "
                                       "'dippm_nas.predictor': ('predictor',)})\n",
        "dippm_nas/predictor/__init__.py": "from dippm_nas.predictor._a import P\n",
        "dippm_nas/predictor/_a.py": "from dippm_nas.graph import G\nP = 1\n",
        # a face written by hand: listed, since its imports cannot all be read
        "dippm_nas/mig/__init__.py": "import importlib\ndef __getattr__(name):\n    return importlib.import_module(name)\n"
                                     "class C:\n    def __getattr__(self, name):\n        return 1\n",
    })
    imps = arch.collect_imports(tmp_path)
    lazy = sorted((i.target, i.names) for i in imps if i.in_lazy_getattr and i.importer == "dippm_nas.graph")
    assert lazy == [("dippm_nas.predictor", ()), ("dippm_nas.predictor._a", ("P",))]
    arrows = {(arch.unit_of(i.importer), arch.unit_of(i.target)) for i in arch.arrow_violations(imps)}
    assert ("graph", "predictor") in arrows
    assert arch.package_cycles(imps) == [["graph", "predictor"]]
    assert arch.function_body_imports(imps, set()) == []  # deferred by a face, not a function-body import
    assert arch.lazy_faces(tmp_path) == {"helper": ["dippm_nas/graph/__init__.py:2"],
                                         "hand_written": ["dippm_nas/mig/__init__.py:2"]}
    (tmp_path / "dippm_nas/graph/__init__.py").write_text(
        "from dippm_nas._lazy import lazy_face\nNAMES = {}\n__getattr__, __dir__ = lazy_face(__name__, NAMES)\n")
    with pytest.raises(ValueError, match=r"graph/__init__.py:3: lazy_face\(\) needs a literal"):
        arch.collect_imports(tmp_path)


def test_lazy_face_loads_a_name_once_and_refuses_what_it_does_not_list(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from dippm_nas._lazy import lazy_face

    pkg = types.ModuleType("fake_face")
    pkg.__all__ = ["dumps", "json"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_face", pkg)
    getattr_, dir_ = lazy_face("fake_face", {"json": ("dumps", "json")})
    import json

    assert getattr_("dumps") is json.dumps and getattr_("json") is json  # an attribute; the module itself
    assert vars(pkg)["dumps"] is json.dumps  # stored: the next access does not come back
    assert {"dumps", "json"} <= set(dir_())
    with pytest.raises(AttributeError, match="module 'fake_face' has no attribute 'loads'"):
        getattr_("loads")
    with pytest.raises(ValueError, match="'x' is listed under both 'a' and 'b'"):
        lazy_face("fake_face", {"a": ("x",), "b": ("x",)})


def test_the_integrations_use_no_private_attribute_of_another_modules_objects() -> None:
    """``dippm_nas.optuna`` (the cost model, its bookkeeping and its background work) reaches no private attribute
    of another module's objects: each module calls the others through names they publish."""
    rows = [r for r in arch.private_uses(ROOT) if r.startswith("dippm_nas/optuna/")]
    assert rows == [], "private attributes of other modules' objects:\n" + "\n".join(rows)


def test_the_library_uses_no_private_attribute_of_another_modules_objects() -> None:
    """No module of the library reaches a private attribute of another module's objects; the third-party private
    names it uses are each listed with their reason (``INTENDED_PRIVATE_USES``), and each listed one is still used."""
    rows = arch.private_uses(ROOT)
    unexplained = [r for r in rows if arch.intended_private_use(r) is None]
    assert unexplained == [], "private attributes of other modules' objects:\n" + "\n".join(unexplained)
    used = {(r.split(" ", 1)[0].rsplit(":", 1)[0], r.split(" ", 1)[1]) for r in rows}
    stale = sorted(set(arch.INTENDED_PRIVATE_USES) - used)
    assert stale == [], f"INTENDED_PRIVATE_USES lists uses the code no longer has: {stale}"


def test_private_uses_are_found_in_a_scratch_tree(tmp_path: Path) -> None:
    """The check can fail: a module reading another object's private attribute is listed; its own, and
    ``self``'s, are not."""
    pkg = tmp_path / "dippm_nas"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(textwrap.dedent("""
        class A:
            def __init__(self):
                self._mine = 1
            def f(self, other):
                return self._mine + other._theirs + other._mine
    """))
    rows = arch.private_uses(tmp_path)
    assert [r.split(" ", 1)[1] for r in rows] == ["other._theirs"]
