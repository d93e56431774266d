"""The pre-export key: a cheap fingerprint of a model *definition* computed without exporting it.

The key hashes, for every submodule in registration order: its name, its class (module and qualified
name), its public scalar attributes (ints, floats, bools, strings, and tuples/lists of them: this is
where PyTorch layers keep their hyper-parameters — channels, kernel size, stride, groups, eps — and where
custom blocks keep flags like ``use_residual``), and the bytecode and constants of every method its class defines (``forward``,
``_forward_impl``...) up to ``nn.Module``; plus the name, shape and dtype of every parameter and buffer,
the :class:`~dippm_nas.InputSpec`, and the versions of dippm-nas, torch and TVM, the graph format and a
digest of our conversion code (:func:`converter_version`).
Weights' values are not hashed, so two instances of one architecture share the key.

What the key does **not** see, and so what would fool it (return a cached graph of another
architecture): control flow that reads global variables, closures or module-level constants; helper
functions outside the module's class (a free function called from ``forward`` whose code changed);
attributes held in dicts or custom objects; forward hooks and ``torch.nn.utils`` parametrizations;
an instance attribute ``forward`` patched onto one object (included only if it is a plain function).
When in doubt, pass ``cache=False`` to :func:`~dippm_nas.capture`.

The blocks a search-space candidate is assembled from are cached under their own key, made from the
space's block description instead of a module (:func:`dippm_nas.capture.block_key`, in ``_assemble.py``).
"""

from __future__ import annotations

import functools
import hashlib
import types
from typing import TYPE_CHECKING, Any

from dippm_nas.graph import GRAPH_FORMAT_VERSION
from dippm_nas.spec import InputSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["model_key", "file_key", "converter_version"]

_CLASS_CODE: dict[type, str] = {}
#: code object -> digest of a function held as a module attribute (code objects are immutable)
_FUNCTION_DIGEST: dict[types.CodeType, str] = {}


#: the modules whose code decides the graph a model converts to (the frontend's converters we add or
#: replace, the export and conversion modes, the Relax-to-graph builder), relative to the package
_CONVERSION_SOURCES = ("capture/_converters.py", "capture/_torch.py", "graph/_relax.py")


@functools.lru_cache(maxsize=1)
def converter_version() -> str:
    """Versions that change the graph a model converts to: dippm-nas, torch, TVM, the graph format, and a
    digest of the conversion code itself, so that a new or fixed converter is never answered from a
    cache filled before it (the package version does not move with every such change)."""
    from pathlib import Path

    import torch
    import tvm

    from dippm_nas._version import __version__

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    for rel in _CONVERSION_SOURCES:
        h.update((root / rel).read_bytes())
    return (f"dippm_nas={__version__};torch={torch.__version__};tvm={tvm.__version__};graph={GRAPH_FORMAT_VERSION};"
            f"conversion={h.hexdigest()[:12]}")


def _const_repr(c: Any) -> str:
    """repr of a code constant that does not depend on the string-hash seed (frozensets are sorted)."""
    if isinstance(c, (frozenset, set)):
        return "{" + ",".join(sorted(_const_repr(x) for x in c)) + "}"
    if isinstance(c, tuple):
        return "(" + ",".join(_const_repr(x) for x in c) + ")"
    return repr(c)


def _code_digest(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_digest(c, h)
        else:
            h.update(_const_repr(c).encode())


def _class_code(cls: type) -> str:
    got = _CLASS_CODE.get(cls)
    if got is not None:
        return got
    import torch

    h = hashlib.sha256()
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object:
            break
        h.update(f"{klass.__module__}.{klass.__qualname__}".encode())
        for name, obj in sorted(vars(klass).items()):
            fn = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
            code = getattr(fn, "__code__", None)
            if isinstance(code, types.CodeType):
                h.update(name.encode())
                _code_digest(code, h)
    got = h.hexdigest()
    _CLASS_CODE[cls] = got
    return got


_SCALAR_TYPES = frozenset({bool, int, float, str, type(None)})


def _function_digest(code: types.CodeType) -> str:
    got = _FUNCTION_DIGEST.get(code)
    if got is None:
        h = hashlib.sha256()
        _code_digest(code, h)
        got = _FUNCTION_DIGEST[code] = h.hexdigest()[:16]
    return got


def _scalar_attrs(module: "torch.nn.Module") -> str:
    # the key is computed on every predict(model, spec): this loop is its hot path (~300 modules per model)
    parts = []
    for k, v in module.__dict__.items():
        if k[0] == "_" or k == "training":
            continue
        t = type(v)
        if t in _SCALAR_TYPES:
            parts.append(f"{k}={v!r}")
        elif t is tuple or t is list:
            for x in v:
                if type(x) not in _SCALAR_TYPES:
                    break
            else:
                parts.append(f"{k}={tuple(v)!r}")
        elif t is types.FunctionType:
            parts.append(f"{k}=fn:{_function_digest(v.__code__)}")
    return ";".join(parts)


def model_key(model: "torch.nn.Module", spec: InputSpec) -> str:
    """SHA-256 of the model definition and input spec (see the module docstring for what it covers)."""
    parts = [converter_version(), repr(sorted(spec.to_dict().items()))]
    stack = [("", model)]
    while stack:  # depth-first in registration order, like named_modules()
        name, m = stack.pop()
        parts.append(f"|{name}:{_class_code(type(m))}:{_scalar_attrs(m)}")
        for pname, p in m._parameters.items():
            if p is not None:
                parts.append(f"p{pname}{tuple(p.shape)}{p.dtype}")
        for bname, b in m._buffers.items():
            if b is not None:
                parts.append(f"b{bname}{tuple(b.shape)}{b.dtype}")
        children = [(f"{name}.{k}" if name else k, c) for k, c in m._modules.items() if c is not None]
        stack.extend(reversed(children))
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def file_key(data: bytes, spec: InputSpec) -> str:
    """Key of an ONNX file: its bytes, the input spec and the converter versions."""
    h = hashlib.sha256()
    h.update(b"onnx|")
    h.update(converter_version().encode())
    h.update(repr(sorted(spec.to_dict().items())).encode())
    h.update(hashlib.sha256(data).digest())
    return h.hexdigest()
