"""Fuzzing a public callable or class from its signature: one parameter hostile, the others a plain baseline.

Each parameter is classified by its annotation (the text, so ``from __future__ import annotations`` and
``TYPE_CHECKING`` imports need no resolving): a number, a flag, a text, a path, a container, a mapping, an
object dippm-nas builds (``OperatorGraph``, ``InputSpec``, ``Device``...), or anything. An example draws which
parameter is hostile and a value for its class (``fuzz_hostile``): numbers and texts of the wrong type, non-finite
and huge numbers, special files for paths, deep and wrong containers. A parameter typed as an object dippm-nas
builds, a container of such objects or a numpy array is given values of its type only (a small valid object
of :data:`FIXTURES`, an empty container, a non-finite or empty float array): passing a non-graph where a graph
is required is a programming error Python's own ``TypeError`` reports, while every value a user writes (numbers,
names, paths, plain lists and mappings, configs) must meet a clear error, whatever its type.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st

import fuzz_hostile as H

#: The kinds of parameter, from the annotation's text.
_PATH = re.compile(r"\b(Path|PathLike)\b")
_SEQ = re.compile(r"^\s*(Sequence|list|tuple|Iterable|Collection|set|frozenset)\b")
_MAP = re.compile(r"^\s*(Mapping|dict|MutableMapping)\b")
_PLAIN = {"int", "float", "bool", "str", "bytes", "None", "Any", "object", "Path", "PathLike", "Literal",
          "Sequence", "Mapping", "list", "tuple", "dict", "Iterable", "Callable", "Collection", "set", "frozenset",
          "Optional", "Union", "os", "PathLike[str]", "type", "Iterator", "TextIO", "IO", "MutableMapping",
          "Any", "str", "float", "int", "bool", "np", "numpy", "ndarray", "Literal", "Callable", "Sequence",
          "Shape", "SourceKind"}


@cache
def _spec() -> Any:
    from dippm_nas.spec import InputSpec
    return InputSpec(shape=(4,), batch_size=2)


@cache
def _graph() -> Any:
    from dippm_nas.graph import synthetic_resnet_graph
    return synthetic_resnet_graph(1)


@cache
def _device() -> Any:
    from dippm_nas.devices import get_device
    return get_device("a100-sxm4-40gb")


@cache
def _decoder() -> Any:
    from dippm_nas.llm import decoder_config
    return decoder_config("llama-2-7b")


def _module() -> Any:
    import torch
    return torch.nn.Linear(4, 2)


def _workload() -> Any:
    from dippm_nas.llm import LLMWorkload
    return LLMWorkload(prompt_len=8, output_len=2, batch_size=1)


def _item() -> Any:
    return (_module(), _spec())


def _deployment() -> Any:
    from dippm_nas.deployment import Deployment
    return Deployment()


#: Small valid objects for parameters typed as objects dippm-nas builds (by the class name in the annotation).
FIXTURES: dict[str, Callable[[], Any]] = {
    "InputSpec": _spec, "OperatorGraph": _graph, "Device": _device, "DecoderConfig": _decoder,
    "Module": _module, "nn.Module": _module, "ModelLike": _module, "Deployment": _deployment,
    "LLMWorkload": _workload, "Item": _item,
}


@dataclass(frozen=True)
class Param:
    name: str
    kind: str          # int float bool str path seq map object any
    fixture: str = ""  # the FIXTURES key of an `object` parameter, "" when none fits
    required: bool = False
    positional_only: bool = False
    keyword_only: bool = False
    optional: bool = False  # None is a valid value


def classify(annotation: Any) -> tuple[str, str]:
    """``(kind, fixture)`` of an annotation (its text): a value a user writes wins over an object alternative
    (``Device | str`` takes a hostile text)."""
    if annotation is inspect.Parameter.empty:
        return "any", ""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = text.strip("'\" ")
    alternatives = [a.strip() for a in re.split(r"\|(?![^\[]*\])", text)]
    if any(re.search(r"\b(ndarray|NDArray|ArrayLike)\b", a) for a in alternatives):
        return "array", ""
    if any(re.match(r"(?:\w+\.)*Callable\b", a) for a in alternatives):
        return "object", ""  # a function the caller passes: code, not a value
    if any(_PATH.search(a) for a in alternatives):
        return "path", ""
    for a in alternatives:
        if _SEQ.match(a) or _MAP.match(a):
            inner = re.findall(r"[A-Za-z_][\w.]*", a[a.find("[") + 1:] if "[" in a else "")
            objects = [n for n in inner if n.split(".")[-1] not in _PLAIN]
            if objects:  # a container of objects dippm-nas builds: only empty and one-element ones
                name = objects[0].split(".")[-1]
                direct = inner and inner[0].split(".")[-1] == name  # Sequence[X], not Sequence[tuple[X, Y]]
                return "objseq", (name if name in FIXTURES and direct else "")
            return ("seq" if _SEQ.match(a) else "map"), ""
    bare = {re.sub(r"\[.*", "", a) for a in alternatives} - {"None"}
    bare = {"str" if b == "SourceKind" else b for b in bare}
    for k in ("float", "int", "bool", "str"):
        if k in bare:
            return k, ""
    for a in alternatives:
        for name in FIXTURES:
            if re.fullmatch(rf"(?:\w+\.)*{re.escape(name)}", a):
                return "object", name
    if bare and not bare <= _PLAIN:
        return "object", ""  # a dippm-nas or library object with no fixture
    return "any", ""


def params_of(obj: Any) -> list[Param]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    if dataclasses.is_dataclass(obj) and all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                             for p in sig.parameters.values()):
        sig = inspect.Signature([  # a dataclass whose __init__ takes **kwargs and checks them: its fields
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type,
                              default=inspect.Parameter.empty if f.default is dataclasses.MISSING
                              and f.default_factory is dataclasses.MISSING else None)
            for f in dataclasses.fields(obj) if f.init])
    out = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        kind, fixture = classify(p.annotation)
        ann = p.annotation if isinstance(p.annotation, str) else str(p.annotation)
        out.append(Param(p.name, kind, fixture, required=p.default is p.empty,
                         positional_only=p.kind is p.POSITIONAL_ONLY, keyword_only=p.kind is p.KEYWORD_ONLY,
                         optional="None" in ann or p.default is None))
    return out


def hostile(kind: str) -> st.SearchStrategy[Any]:
    """Hostile values of a parameter kind; paths are drawn as ``("path", KIND)`` and made by the scene."""
    if kind == "int":
        return H.int_values()
    if kind == "float":
        return H.float_values()
    if kind == "bool":
        return st.sampled_from(("yes", 2, H.Opaque(), "false"))
    if kind == "str":
        return H.text_values()
    if kind == "path":
        return st.one_of(H.read_kinds().map(lambda k: ("path", k)),
                         st.sampled_from((None, 5, H.Opaque(), "")))
    if kind in ("seq", "map"):
        return H.nested_values()
    if kind == "array":
        return H.arrays()
    if kind == "objseq":
        return st.sampled_from(([], ()))
    return H.any_values()


def baseline(p: Param, sc: H.Scene, obj: Any = None) -> Any:
    """A plain value of a parameter that is not the hostile one (a path a writer writes: a new file)."""
    if p.kind == "object":
        return FIXTURES[p.fixture]() if p.fixture else None
    if p.kind == "objseq":
        return [FIXTURES[p.fixture]()] if p.fixture else []
    if p.kind == "path":
        return str(sc.name(".out")) if obj is not None and writes(obj, p.name) else str(sc.input_file(b"{}\n"))
    if p.kind == "array":
        import numpy as np
        return np.ones(3)
    return {"int": 1, "float": 1.0, "bool": False, "str": "x", "seq": [], "map": {}, "any": None}.get(p.kind)


def fuzzable(params: list[Param]) -> list[Param]:
    """The parameters an example may make hostile: every one a user writes (not an object dippm-nas builds, nor
    a flag, whose truthiness is Python's)."""
    return [p for p in params if p.kind not in ("object", "bool") and not (p.kind == "objseq" and not p.fixture)]


def materialize(value: Any, sc: H.Scene, others: list[Any], *, output: bool = False) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "path":
        target = next((o for o in others if isinstance(o, str) and H.is_regular(o)), None)
        return sc.special(value[1], target=None if target is None else Path(target), output=output)
    return value


def writes(obj: Any, name: str) -> bool:
    """Whether parameter ``name`` of ``obj`` names a file it writes (by the parameter's or the function's name)."""
    return name in ("out", "output", "dest", "out_dir") or getattr(obj, "__name__", "").startswith(
        ("save", "write", "export"))


def needs_objects(obj: Any) -> list[str]:
    """The required parameters of ``obj`` typed as objects dippm-nas builds that have no fixture."""
    return [p.name for p in params_of(obj) if p.required and p.kind in ("object", "objseq") and not p.fixture]


def signature_strategy(obj: Any) -> st.SearchStrategy[tuple[str, Any]] | None:
    """``(parameter name, hostile value)`` draws for ``obj``, or None when it takes nothing a user writes."""
    ps = fuzzable(params_of(obj))
    if not ps:
        return None
    return st.sampled_from(ps).flatmap(lambda p: hostile(p.kind).map(lambda v, n=p.name: (n, v)))


def call_with(obj: Any, drawn: tuple[str, Any], sc: H.Scene) -> Callable[[], Any]:
    """The call of ``obj`` with the drawn parameter hostile and every other required one at its baseline."""
    name, value = drawn
    params = params_of(obj)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    base = {p.name: baseline(p, sc, obj) for p in params if p.required and p.name != name}
    value = materialize(value, sc, list(base.values()), output=writes(obj, name))
    for p in params:
        if p.name == name:
            v = value
        elif p.required:
            v = base[p.name]
        else:
            continue
        if p.positional_only:
            args.append(v)
        else:
            kwargs[p.name] = v
    return lambda: obj(*args, **kwargs)
