"""Measure the code's architecture: size per package, largest modules and functions, import arrows.

Reads the repository's Python files with :mod:`ast` (nothing is imported or run) and reports:

- lines per package (``dippm_nas.X`` for each subpackage or top-level module, ``search_spaces``, ``scripts``, ...);
- the largest modules and functions (by lines, blank and comment lines included);
- import cycles between library modules (all executed imports: module top and function bodies;
  ``if TYPE_CHECKING:`` imports left out) and between packages;
- private imports: a module outside package ``X`` importing ``X._y`` (or a ``_name`` from ``X``), counted
  for the library, scripts, benchmarks and examples (``tests/`` reported on its own line);
- lazy package faces (PEP 562): each name a ``lazy_face(__name__, {module: names})`` call of
  :mod:`dippm_nas._lazy` defers is read as an import of its module, made on first access (so it counts for
  stage arrows and cycles like any import); a module-level ``__getattr__`` written by hand is listed, since the
  imports it makes cannot be read;
- function-body imports that are not optional dependencies (the ``[project.optional-dependencies]`` of
  ``pyproject.toml``), leaving out the lazy faces;
- stage arrows: an import of a package of a later stage (:data:`LAYERS`);
- private attributes of another module's objects (``obj._name``) used in the library, the project's own apart from
  the third-party private names used on purpose (:data:`INTENDED_PRIVATE_USES`, each with its reason);
- ``duplicates`` pairs when the ``duplicates`` tool is on ``PATH``;
- the library's call sites of the functions that coerce a deployment (``Deployment.coerce``,
  ``deployment_settings``, ``deployment_of``, ``resolve_deployment``; ``Deployment.resolve()`` cannot be told from
  ``Path.resolve()`` without types) and look a device up (``resolve_device``, ``get_device``), per function and in how
  many files (what one prediction runs is counted by ``tests/test_deployment_resolved_once.py``).

usage: python scripts/architecture_report.py [--root DIR] [--json OUT] [--top N]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

LIBRARY_ROOTS = ("dippm_nas", "search_spaces")
OTHER_ROOTS = ("scripts", "benchmarks", "examples", "tests")

# Stage layers: a package may import its own layer and lower ones, never a higher one. The flow reads
# capture → graph → features → prior/predictor → objectives (optuna, nni, budgets) → validation; the layers
# are the import direction of that flow (capture imports graph, the predictor imports capture to predict a model).
LAYERS: dict[str, int] = {
    # foundation: no stage of the flow
    "errors": 0, "_version": 0, "_logging": 0, "_optional": 0, "_paths": 0, "_platform": 0, "_sql": 0, "_redact": 0,
    "_compress": 0, "_lazy": 0, "_gc": 0, "_unique": 0,
    "_json": 0, "_numbers": 0, "_files": 0, "_toml": 0, "files": 0, "_schema": 0, "_lock": 0, "_deprecation": 0,
    "units": 0, "spec": 0,
    # what a graph is, where it runs, what a prediction is and the budgets it is checked against
    "graph": 1, "devices": 1, "prediction": 1, "conformal": 1, "budgets": 2,
    # how inference runs (devices: the host profile)
    "deployment": 2,
    # stores and model families (graph, devices)
    "cache": 2, "search_spaces": 2,
    # the analytic prior and MIG advice (graph, devices, budgets)
    "prior": 3, "mig": 3,
    # the record of a predicted trial the integrations write and validation reads (prediction, budgets, spec)
    "trial": 3,
    # capture: a model source to a graph (spec, graph, cache); measure: a model source run on a device (capture's
    # model sources and SPEC strings)
    "capture": 4, "measure": 4,
    # features of a graph (graph, devices, prior)
    "features": 5,
    # the predictor: load a checkpoint, featurise, infer, calibrate (features, prior, capture)
    "predictor": 6, "stages": 6,
    # LLM generation: prefill and decode-step graphs from a decoder's config, timed by the prior (capture, prior)
    "llm": 7,
    # the dataset (capture, measure, search spaces) and training (predictor, dataset)
    "dataset": 7, "training": 8,
    # objectives users call: Optuna and NNI
    "optuna": 9, "nni": 9,
    # validation of a search's Pareto front (measure, predictor, cache)
    "validation": 10,
    # the verbs and the public face
    "cli": 11, "__main__": 11, "__init__": 11,
}


@dataclass(frozen=True)
class Import:
    """One imported module (one row per ``import`` target or ``from ... import`` statement)."""

    importer: str  # dotted module name, or the file path for a script
    path: str
    line: int
    target: str  # dotted module name the statement loads
    names: tuple[str, ...]  # names taken by ``from target import ...``
    in_function: bool
    type_checking: bool
    in_lazy_getattr: bool


def module_name(root: Path, path: Path) -> str:
    """Dotted module name of a library file, or its path relative to ``root`` for anything else."""
    rel = path.relative_to(root)
    if rel.parts[0] in LIBRARY_ROOTS:
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)
    return rel.as_posix()


def python_files(root: Path) -> list[Path]:
    """The repository's Python files under the library and the other roots, caches and venvs left out."""
    out: list[Path] = []
    for top in LIBRARY_ROOTS + OTHER_ROOTS:
        for p in sorted((root / top).rglob("*.py")):
            if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts):
                out.append(p)
    return out


def _is_package(root: Path, dotted: str) -> bool:
    return (root / Path(*dotted.split(".")) / "__init__.py").is_file()


def _is_module(root: Path, dotted: str) -> bool:
    base = root / Path(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _resolve_relative(importer: str, is_pkg: bool, level: int, module: str | None) -> str:
    parts = importer.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


#: The helper whose calls declare a lazy package face (``dippm_nas._lazy.lazy_face``).
LAZY_FACE_HELPER = "lazy_face"


def _lazy_face_modules(node: ast.Call, where: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` of a ``lazy_face(__name__, {module: (names...)})`` call.

    Raises:
        ValueError: the mapping is not a literal of module strings to tuples (or lists) of name strings, so the
            imports it stands for cannot be read.
    """
    mapping = node.args[1] if len(node.args) > 1 else None
    out: list[tuple[str, tuple[str, ...]]] = []
    ok = isinstance(mapping, ast.Dict)
    if ok:
        for k, v in zip(mapping.keys, mapping.values):  # type: ignore[union-attr]
            ok = ok and isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, (ast.Tuple, ast.List))
            names = [e.value for e in v.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)] if ok else []
            ok = ok and len(names) == len(v.elts)  # type: ignore[union-attr]
            if ok:
                out.append((k.value, tuple(names)))  # type: ignore[union-attr]
    if not ok:
        raise ValueError(f"{where}:{node.lineno}: {LAZY_FACE_HELPER}() needs a literal {{'module': ('name', ...)}} "
                         "as its second argument, so that the architecture checks can read the imports it makes")
    return out


class _Visitor(ast.NodeVisitor):
    def __init__(self, root: Path, path: Path, importer: str) -> None:
        self.root, self.path, self.importer = root, path, importer
        self.is_pkg = path.name == "__init__.py"
        self.depth = 0
        self.lazy = 0
        self.classes = 0
        self.tc = 0
        self.imports: list[Import] = []
        #: line of a module-level ``def __getattr__`` (a lazy face written by hand), or 0
        self.hand_written_getattr = 0
        #: line of the first ``lazy_face(...)`` call, or 0
        self.lazy_face_line = 0

    def _add(self, node: ast.AST, target: str, names: tuple[str, ...]) -> None:
        self.imports.append(Import(self.importer, str(self.path.relative_to(self.root)), node.lineno, target, names,
                                   self.depth > 0, self.tc > 0, self.lazy > 0))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        lazy = self.depth == 0 and self.classes == 0 and node.name == "__getattr__"
        if lazy:
            self.hand_written_getattr = node.lineno
        self.depth += 1
        self.lazy += lazy
        self.generic_visit(node)
        self.lazy -= lazy
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes += 1
        self.generic_visit(node)
        self.classes -= 1

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if called == LAZY_FACE_HELPER:
            rel = str(self.path.relative_to(self.root))
            for module, names in _lazy_face_modules(node, rel):
                attrs = tuple(n for n in names if n != module.rsplit(".", 1)[-1])
                self.lazy_face_line = self.lazy_face_line or node.lineno
                if attrs:
                    self.imports.append(Import(self.importer, rel, node.lineno, module, attrs, True, self.tc > 0, True))
                if len(attrs) < len(names) or not names:  # the module itself
                    self.imports.append(Import(self.importer, rel, node.lineno, module, (), True, self.tc > 0, True))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        is_tc = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        if is_tc:
            self.tc += 1
            for child in node.body:
                self.visit(child)
            self.tc -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name, ())

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = _resolve_relative(self.importer, self.is_pkg, node.level, node.module)
        else:
            base = node.module or ""
        names = tuple(a.name for a in node.names)
        plain = [n for n in names if not _is_module(self.root, f"{base}.{n}")]
        if plain or not names:
            self._add(node, base, tuple(plain))
        for n in names:
            if n not in plain:
                self._add(node, f"{base}.{n}", ())


def _visit(root: Path, path: Path) -> _Visitor:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    v = _Visitor(root, path, module_name(root, path))
    v.visit(tree)
    return v


def collect_imports(root: Path) -> list[Import]:
    """Every import statement of the repository's Python files, and each module a lazy face defers to."""
    out: list[Import] = []
    for path in python_files(root):
        out.extend(_visit(root, path).imports)
    return out


def lazy_faces(root: Path) -> dict[str, list[str]]:
    """The library's lazy package faces as ``path:line``: ``"helper"`` (a ``lazy_face`` call the checks read) and
    ``"hand_written"`` (a module-level ``def __getattr__``, whose imports the checks cannot all read)."""
    out: dict[str, list[str]] = {"helper": [], "hand_written": []}
    for path in python_files(root):
        if path.relative_to(root).parts[0] in LIBRARY_ROOTS:
            v = _visit(root, path)
            rel = path.relative_to(root)
            if v.lazy_face_line:
                out["helper"].append(f"{rel}:{v.lazy_face_line}")
            if v.hand_written_getattr:
                out["hand_written"].append(f"{rel}:{v.hand_written_getattr}")
    return out


def unit_of(name: str) -> str:
    """The package an importer or target belongs to: ``dippm_nas.X`` → ``X``, ``search_spaces``, ``scripts``..."""
    if "/" in name:
        return name.split("/")[0]
    parts = name.split(".")
    if parts[0] == "dippm_nas":
        return parts[1] if len(parts) > 1 else "__init__"
    return parts[0]


def is_project(target: str) -> bool:
    return target.split(".")[0] in LIBRARY_ROOTS


def private_owner(target: str) -> str | None:
    """The package whose private module ``target`` is (``dippm_nas.predictor._gnn`` → ``dippm_nas.predictor``)."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if i > 0 and part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _inside(importer: str, package: str) -> bool:
    return "/" not in importer and (importer == package or importer.startswith(package + "."))


def private_imports(imports: list[Import]) -> list[tuple[Import, tuple[str, ...]]]:
    """Imports of another package's private module, or of ``_names`` from another package's module.

    Returns (import, the private names it takes): for a private module, all the names it takes (or the module).
    """
    out: list[tuple[Import, tuple[str, ...]]] = []
    for imp in imports:
        if not is_project(imp.target):
            continue
        owner = private_owner(imp.target)
        if owner is not None and not _inside(imp.importer, owner):
            out.append((imp, imp.names or (imp.target.rsplit(".", 1)[-1],)))
            continue
        priv = tuple(n for n in imp.names if n.startswith("_") and not n.startswith("__"))
        pkg = imp.target if owner is None else owner
        if priv and not _inside(imp.importer, pkg):
            out.append((imp, priv))
    return out


def optional_modules(root: Path) -> set[str]:
    """Top-level module names of the optional dependencies in pyproject.toml (and the stdlib-like ones they need)."""
    dist_to_module = {"nvidia-ml-py": "pynvml", "scikit-learn": "sklearn", "psycopg2-binary": "psycopg2",
                      "pytorch-lightning": "pytorch_lightning", "lightning-utilities": "lightning_utilities"}
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mods: set[str] = set()
    for reqs in data["project"].get("optional-dependencies", {}).values():
        for req in reqs:
            dist = re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip()
            if dist and not dist.startswith("dippm-nas"):
                mods.add(dist_to_module.get(dist, dist.replace("-", "_")))
    return mods - {"setuptools"}


def function_body_imports(imports: list[Import], optional: set[str]) -> list[Import]:
    """Executed imports inside function bodies of a non-optional module (lazy ``__getattr__`` faces left out)."""
    return [i for i in imports if i.in_function and not i.in_lazy_getattr and not i.type_checking
            and i.target.split(".")[0] not in optional]


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (or a self loop), Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def _library_edges(imports: list[Import]) -> list[tuple[str, str]]:
    """(importer, target) of every executed import of a library module by a library module."""
    return [(i.importer, i.target) for i in imports
            if "/" not in i.importer and not i.type_checking and is_project(i.target)]


def module_cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles between library modules through executed imports (each edge goes to the module the statement names)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in _library_edges(imports):
        if a != b:
            graph[a].add(b)
    return _sccs(graph)


def package_cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles between packages (units) of the library through executed imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in ((unit_of(a), unit_of(b)) for a, b in _library_edges(imports)):
        if a != b and b != "__init__":
            graph[a].add(b)
    return _sccs(graph)


def arrow_violations(imports: list[Import], layers: dict[str, int] = LAYERS) -> list[Import]:
    """Library imports of a package of a later stage (a higher layer). Unknown packages count as violations."""
    out = []
    for imp in imports:
        if "/" in imp.importer or imp.type_checking or not is_project(imp.target):
            continue
        a, b = unit_of(imp.importer), unit_of(imp.target)
        if a != b and layers.get(b, 99) > layers.get(a, -1):
            out.append(imp)
    return out


@dataclass
class Sizes:
    lines_per_package: dict[str, int]
    largest_modules: list[tuple[str, int]]
    largest_functions: list[tuple[str, int]]
    largest_classes: list[tuple[str, int]]


def sizes(root: Path, top: int) -> Sizes:
    """Lines per package, and the ``top`` largest modules and functions of the library."""
    per: dict[str, int] = defaultdict(int)
    modules: list[tuple[str, int]] = []
    funcs: list[tuple[str, int]] = []
    classes: list[tuple[str, int]] = []
    for path in python_files(root):
        text = path.read_text(encoding="utf-8")
        n = text.count("\n")
        name = module_name(root, path)
        unit = unit_of(name)
        per[f"dippm_nas.{unit}" if name.startswith("dippm_nas") else unit] += n
        if "/" in name:
            continue
        modules.append((str(path.relative_to(root)), n))
        tree = ast.parse(text)

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    q = f"{prefix}{child.name}"
                    funcs.append((f"{path.relative_to(root)}:{q}", (child.end_lineno or 0) - child.lineno + 1))
                    walk(child, q + ".")
                elif isinstance(child, ast.ClassDef):
                    classes.append((f"{path.relative_to(root)}:{prefix}{child.name}",
                                    (child.end_lineno or 0) - child.lineno + 1))
                    walk(child, f"{prefix}{child.name}.")

        walk(tree, "")
    return Sizes(dict(sorted(per.items(), key=lambda kv: -kv[1])),
                 sorted(modules, key=lambda kv: -kv[1])[:top], sorted(funcs, key=lambda kv: -kv[1])[:top],
                 sorted(classes, key=lambda kv: -kv[1])[:top])


def _defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, methods, assigned names and attributes (``x._a = ...``),
    and the names it imports."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute):
                        out.add(sub.attr)
                    elif isinstance(sub, ast.Name):
                        out.add(sub.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def private_uses(root: Path) -> list[str]:
    """Uses, in the library, of a private attribute (``obj._name``, not ``self`` / ``cls`` / ``super()``) that the
    module does not define itself: a private of another module's object (or of a third-party object), one
    ``path:line obj._name`` row each."""
    rows = []
    for path in python_files(root):
        name = module_name(root, path)
        if "/" in name:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = _defined_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            a = node.attr
            if not a.startswith("_") or (a.startswith("__") and a.endswith("__")) or a in defined:
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                continue
            rows.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(v)}.{a}")
    return rows


_ARGPARSE = "argparse names the class of `add_subparsers()` privately; a type annotation, nothing is called"
_TVM = ("TVM's ExportedProgramImporter publishes no lowering helpers: the custom converters (attention with a "
        "boolean mask, layer norm, conv2d padding, in-place division) reuse its own to emit the same Relax ops")
_MODULE_DICTS = ("the model's own registration dicts, in registration order and with repeats: `named_children()` "
                 "drops a child registered twice and `named_parameters()` can be overridden, either would change "
                 "the key of a model whose graph is cached")
#: Private names of third-party libraries the library uses on purpose, ``(path, "obj._name")``: the reason.
#: :func:`private_uses` lists them; the report counts them apart from the project's own (which must be 0).
INTENDED_PRIVATE_USES: dict[tuple[str, str], str] = {
    **{(f"dippm_nas/cli/{m}.py", "argparse._SubParsersAction"): _ARGPARSE
       for m in ("_checkpoints", "_dataset", "_demo", "_deployment", "_devices", "_evaluate", "_gpu_campaign",
                 "_inspect", "_predict", "_predict_llm", "_train", "_validate_worker")},
    ("dippm_nas/cli/_dataset.py", "verbs._choices_actions"):
        "argparse has no public way to leave an alias out of the help's list of sub-commands",
    **{("dippm_nas/capture/_converters.py", f"importer.{n}"): _TVM
       for n in ("_scaled_dot_product_attention", "_layer_norm_impl", "_conv2d_impl", "_binary_op")},
    **{("dippm_nas/capture/_key.py", f"m.{n}"): _MODULE_DICTS for n in ("_parameters", "_buffers", "_modules")},
    **{("search_spaces/_registry.py", f"m.{n}"): "a module's own parameters and buffers, as registered: an "
       "overridden `named_parameters()` would change the signature recorded on every built model"
       for n in ("_parameters", "_buffers")},
    ("dippm_nas/measure/_liveness.py", "torch._C"): "torch publishes no test of a kernel for a dispatch key",
    ("dippm_nas/measure/_liveness.py", "torch._C._dispatch_has_kernel_for_dispatch_key"):
        "torch publishes no test of a kernel for a dispatch key",
    ("dippm_nas/measure/_liveness.py", "aten._scaled_dot_product_flash_attention"):
        "the aten operator's own name (its overload is what the flash kernel runs)",
    ("dippm_nas/measure/_liveness.py", "aten._scaled_dot_product_efficient_attention"):
        "the aten operator's own name (its overload is what the memory-efficient kernel runs)",
    **{("dippm_nas/measure/_liveness.py", f"aten.{n}"): "the aten operator `_safe_softmax`'s composite kernel "
       "calls, run one by one so that the tracker sees each one's output" for n in ("_softmax", "_to_copy")},
    ("dippm_nas/nni/_tuner.py", "ft._trial_id"): "Optuna's `Trial(study, trial_id)` needs the storage id, which a "
                                                  "FrozenTrial keeps only as `_trial_id`",
    ("dippm_nas/prior/_op_table.py", "reg._predictors"):
        "scikit-learn publishes no arrays of a fitted HistGradientBoostingRegressor's trees",
    ("dippm_nas/prior/_op_table.py", "reg._baseline_prediction"):
        "scikit-learn publishes no baseline of a fitted HistGradientBoostingRegressor",
}


def intended_private_use(row: str) -> str | None:
    """The reason a row of :func:`private_uses` is an intended use of a third-party private name, or ``None``."""
    where, expr = row.split(" ", 1)
    return INTENDED_PRIVATE_USES.get((where.rsplit(":", 1)[0], expr))


def duplicate_pairs(root: Path) -> int | None:
    """The number of pairs the ``duplicates`` tool lists for the tree, or None when it is not installed."""
    exe = shutil.which("duplicates")
    if exe is None:
        return None
    res = subprocess.run([exe, "--repo", str(root), "--seconds", "120"], capture_output=True, text=True, check=False)
    first = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
    if first.startswith("no duplicates"):
        return 0
    m = re.match(r"\D*(\d+)\s+pair", first)
    return int(m.group(1)) if m else None


#: The functions a deployment is coerced or resolved through, and those a device id is looked up through.
COERCIONS = ("coerce", "deployment_settings", "deployment_of", "resolve_deployment")
LOOKUPS = ("resolve_device", "get_device")


def call_sites(root: Path) -> dict[str, dict[str, int]]:
    """Library call sites of :data:`COERCIONS` and :data:`LOOKUPS`: ``{name: {"calls": n, "files": m}}``
    (``coerce`` as ``Deployment.coerce(...)`` or ``cls.coerce(...)``)."""
    calls: dict[str, int] = defaultdict(int)
    files: dict[str, set[str]] = defaultdict(set)
    for path in python_files(root):
        if "/" in module_name(root, path):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "coerce" and not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                                         and f.value.id in ("Deployment", "cls")):
                continue
            if name in COERCIONS or name in LOOKUPS:
                calls[name] += 1
                files[name].add(str(path.relative_to(root)))
    return {n: {"calls": calls[n], "files": len(files[n])} for n in (*COERCIONS, *LOOKUPS)}


def report(root: Path, top: int = 10, with_duplicates: bool = True) -> dict[str, object]:
    """Everything the script measures, as a JSON-ready dict."""
    imports = collect_imports(root)
    optional = optional_modules(root)
    priv = private_imports(imports)
    lib_or_tools = [(i, n) for i, n in priv if not i.importer.startswith("tests/")]
    in_tests = [(i, n) for i, n in priv if i.importer.startswith("tests/")]
    body = function_body_imports([i for i in imports if "/" not in i.importer], optional)
    body_tools = function_body_imports([i for i in imports if "/" in i.importer and not i.importer.startswith("tests/")],
                                       optional)
    s = sizes(root, top)
    uses = private_uses(root)
    return {
        "lines_per_package": s.lines_per_package,
        "largest_modules": s.largest_modules,
        "largest_functions": s.largest_functions,
        "largest_classes": s.largest_classes,
        "private_uses": [u for u in uses if intended_private_use(u) is None],
        "intended_private_uses": [f"{u} ({intended_private_use(u)})" for u in uses
                                  if intended_private_use(u) is not None],
        "module_cycles": module_cycles(imports),
        "package_cycles": package_cycles(imports),
        "private_imports": {"statements": len(lib_or_tools), "names": sum(len(n) for _, n in lib_or_tools),
                            "rows": [f"{i.path}:{i.line} {i.target} {','.join(n)}" for i, n in lib_or_tools]},
        "private_imports_tests": {"statements": len(in_tests), "names": sum(len(n) for _, n in in_tests)},
        "function_body_imports": {"library": len(body), "scripts_benchmarks_examples": len(body_tools),
                                  "library_of_project_modules": sum(is_project(i.target) for i in body),
                                  "rows": [f"{i.path}:{i.line} {i.target}" for i in body]},
        "arrow_violations": [f"{i.path}:{i.line} {unit_of(i.importer)} -> {unit_of(i.target)} ({i.target})"
                             for i in arrow_violations(imports)],
        "lazy_faces": lazy_faces(root),
        "duplicate_pairs": duplicate_pairs(root) if with_duplicates else None,
        "call_sites": call_sites(root),
    }


def _summary(r: dict[str, object]) -> str:
    lines = ["| measure | value |", "|---|---|"]
    lpp = r["lines_per_package"]
    assert isinstance(lpp, dict)
    for k, v in lpp.items():
        lines.append(f"| lines: `{k}` | {v} |")
    for k, v in r["largest_modules"]:  # type: ignore[union-attr]
        lines.append(f"| module `{k}` | {v} |")
    for k, v in r["largest_functions"]:  # type: ignore[union-attr]
        lines.append(f"| function `{k}` | {v} |")
    for k, v in r["largest_classes"]:  # type: ignore[union-attr]
        lines.append(f"| class `{k}` | {v} |")
    mc, pc = r["module_cycles"], r["package_cycles"]
    lines.append(f"| import cycles between modules | {len(mc)}: {'; '.join(' ⇄ '.join(c) for c in mc)} |")  # type: ignore
    lines.append(f"| import cycles between packages | {len(pc)}: {'; '.join(' ⇄ '.join(c) for c in pc)} |")  # type: ignore
    p, pt = r["private_imports"], r["private_imports_tests"]
    lines.append(f"| private imports (library, scripts, benchmarks, examples): statements / names | "
                 f"{p['statements']} / {p['names']} |")  # type: ignore[index]
    lines.append(f"| private imports in tests: statements / names | {pt['statements']} / {pt['names']} |")  # type: ignore
    b = r["function_body_imports"]
    lines.append(f"| function-body imports of project modules (library) | {b['library_of_project_modules']} |")  # type: ignore
    lines.append(f"| function-body imports, not optional deps: library / scripts+benchmarks+examples | "
                 f"{b['library']} / {b['scripts_benchmarks_examples']} |")  # type: ignore[index]
    lines.append(f"| stage-arrow violations (import of a later stage) | {len(r['arrow_violations'])} |")  # type: ignore
    lines.append(f"| private attributes of another module's objects used (library) | {len(r['private_uses'])} |")  # type: ignore
    lines.append(f"| third-party private names used on purpose, each with its reason (`--rows`) | "
                 f"{len(r['intended_private_uses'])} |")  # type: ignore[arg-type]
    lf = r["lazy_faces"]
    lines.append(f"| lazy package faces: through `lazy_face` / written by hand | {len(lf['helper'])} / "  # type: ignore
                 f"{len(lf['hand_written'])} |")  # type: ignore[index]
    d = r["duplicate_pairs"]
    lines.append(f"| `duplicates` pairs | {'n/a' if d is None else d} |")
    cs = r["call_sites"]
    for group, names in (("deployment coercion", COERCIONS), ("device look-up", LOOKUPS)):
        lines.append(f"| {group} call sites (library): calls / files | " + "; ".join(
            f"`{n}` {cs[n]['calls']} / {cs[n]['files']}" for n in names) + " |")  # type: ignore[index]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--json", type=Path, help="write the full report (with every row) to this file")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--no-duplicates", action="store_true", help="skip the duplicates tool")
    ap.add_argument("--rows", action="store_true", help="also list every private import, body import, violation")
    args = ap.parse_args(argv)
    r = report(args.root.resolve(), args.top, not args.no_duplicates)
    print(_summary(r))
    if args.rows:
        for key in ("private_imports", "function_body_imports"):
            for row in r[key]["rows"]:  # type: ignore[index]
                print(f"{key}: {row}")
        for row in r["private_uses"]:  # type: ignore[union-attr]
            print(f"private_use: {row}")
        for row in r["intended_private_uses"]:  # type: ignore[union-attr]
            print(f"intended_private_use: {row}")
        for row in r["arrow_violations"]:  # type: ignore[union-attr]
            print(f"arrow: {row}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=1, default=list) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
