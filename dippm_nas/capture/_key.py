"""The pre-export key: a cheap fingerprint of a model *definition* computed without exporting it.

The key hashes, for every submodule in registration order: its name, its class (module and qualified
name), every attribute of the instance that holds plain data — public or private (``self._reps = 4``),
ints, floats, bools, strings, ``None``, enums, dtypes, and tuples, lists, sets and dicts of them, nested
up to three levels: this is where PyTorch layers keep their hyper-parameters (channels, kernel size,
stride, groups, eps) and where custom blocks keep flags like ``use_residual`` or a config dict —, a digest
of a plain function held as an attribute, and, for its class and every base up to ``nn.Module``, the
bytecode and constants of every method (``forward``, ``_forward_impl``...) and its class attributes
that hold plain data; plus the name, shape and dtype of every parameter and buffer, the
:class:`~dippm_nas.InputSpec`, and the versions of dippm-nas, torch and TVM, the graph format and a
digest of our conversion code (:func:`converter_version`). ``nn.Module``'s own bookkeeping (hook dicts,
``training``) is left out. Weights' values are not hashed, so two instances of one architecture share
the key (an attribute that differs per instance, a counter or an id, makes every instance a miss).

What the key does **not** see, and so what would fool it (return a cached graph of another
architecture): control flow that reads global variables, closures or module-level constants; helper
functions outside the module's class (a free function called from ``forward`` whose code changed);
attributes held in custom objects (not plain data) or nested deeper than three levels; the values of
tensors held as plain attributes; class attributes changed after the class's first key in this process;
forward hooks and ``torch.nn.utils`` parametrizations; an instance attribute ``forward`` patched onto one
object (included only if it is a plain function). When in doubt, pass ``cache=False`` to
:func:`~dippm_nas.capture`.

The blocks a search-space candidate is assembled from are cached under their own key, made from the
space's block description instead of a module (:func:`dippm_nas.capture.block_key`, in ``_assemble.py``).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import types
from typing import TYPE_CHECKING, Any

from dippm_nas.errors import InvalidTypeError
from dippm_nas.graph import GRAPH_FORMAT_VERSION
from dippm_nas.spec import InputSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["model_key", "file_key", "converter_version", "named_model_key"]

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
    cache filled before it (the package version does not move with every such change). TVM's version is
    read from its installed distribution (``tvm.__version__`` is the same string) so that a cache lookup
    does not import TVM; a TVM without distribution metadata (a source tree on the path) is imported."""
    import torch

    from dippm_nas._version import __version__

    tvm_version = _dist_version("tvm", "apache-tvm", "tvm")
    if tvm_version is None:
        import tvm

        tvm_version = tvm.__version__
    return (f"dippm_nas={__version__};torch={torch.__version__};tvm={tvm_version};graph={GRAPH_FORMAT_VERSION};"
            f"conversion={_conversion_digest()}")


def _conversion_digest(extra: tuple[str, ...] = ()) -> str:
    """Digest of the conversion code (:data:`_CONVERSION_SOURCES`) and the ``extra`` files (a few small reads)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    for rel in (*_CONVERSION_SOURCES, *extra):
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:12]


#: SPEC prefixes whose model is fixed by the name and the installed library's version: the library's module and
#: distribution
_NAMED_LIBRARIES = {"torchvision": ("torchvision", "torchvision"), "timm": ("timm", "timm"),
                    "timm-reparam": ("timm", "timm"), "timm-results": ("timm", "timm")}


def _dist_version(module: str, *dists: str) -> str | None:
    """The version of the installed distribution that provides the importable ``module`` (found, not imported),
    or ``None`` when none of ``dists`` is installed or the module on the path is not theirs (a source tree)."""
    from importlib import metadata, util
    from pathlib import Path

    try:
        found = util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None or found.origin is None:
        return None
    where = Path(found.origin).resolve().parent
    for name in dists:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if Path(str(dist.locate_file(module))).resolve() == where:
            return dist.version
    return None


def named_model_key(spec_string: str, spec: InputSpec) -> str | None:
    """A cache key of a library model SPEC (``torchvision:NAME``, ``timm:NAME``, ``timm-reparam:NAME``,
    ``timm-results:NAME``) computed
    without building the model or importing torch, TVM or the library: the SPEC, the input spec, the installed
    versions of the library, torch, TVM and dippm-nas (read from their distributions' metadata), the graph
    format and the digest of the conversion and SPEC-resolution code. A graph stored under it is the graph
    :func:`model_key` names; :func:`~dippm_nas.capture` looks it up first, so a cached library model answers in
    milliseconds. ``None`` for any other SPEC (user code can change without a version) or when a version is
    unknown (a source tree that is not installed)."""
    from dippm_nas._version import __version__

    prefix, sep, name = spec_string.partition(":")
    libs = _NAMED_LIBRARIES.get(prefix)
    if not sep or not name or libs is None:
        return None
    versions = [_dist_version(*libs), _dist_version("torch", "torch"), _dist_version("tvm", "apache-tvm", "tvm")]
    if any(v is None for v in versions):
        return None
    text = "|".join(["named", spec_string, *map(str, versions), __version__, str(GRAPH_FORMAT_VERSION),
                     _conversion_digest(("spec.py", "capture/_load.py", "capture/_timm_results.py")), repr(sorted(spec.to_dict().items()))])
    return "named-" + hashlib.sha256(text.encode()).hexdigest()


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
            elif not name.startswith("__"):
                plain = _plain(obj)
                if plain is not None:
                    h.update(f"{name}={plain}".encode())
    got = h.hexdigest()
    _CLASS_CODE[cls] = got
    return got


_SCALAR_TYPES = frozenset({bool, int, float, str, type(None)})
#: nesting depth of containers :func:`_plain` follows
_MAX_DEPTH = 3


def _plain(v: Any, depth: int = 0) -> str | None:
    """A deterministic text of ``v`` when it is plain data (scalars, enums, dtypes, and tuples, lists, sets and
    dicts of them up to :data:`_MAX_DEPTH` levels), else ``None``."""
    t = type(v)
    if t in _SCALAR_TYPES:
        return repr(v)
    if depth >= _MAX_DEPTH:
        return None
    if t is tuple or t is list or (isinstance(v, tuple) and not hasattr(v, "_fields")):
        out = []
        for x in v:
            r = repr(x) if type(x) in _SCALAR_TYPES else _plain(x, depth + 1)
            if r is None:
                return None
            out.append(r)
        return ("[" if t is list else "(") + ",".join(out) + ("]" if t is list else ")")
    if isinstance(v, dict):
        items = []
        for k, x in v.items():
            rk, rx = _plain(k, depth + 1), _plain(x, depth + 1)
            if rk is None or rx is None:
                return None
            items.append(f"{rk}:{rx}")
        return "{" + ",".join(items) + "}"  # insertion order: forward may iterate it
    if isinstance(v, (set, frozenset)):
        members = [_plain(x, depth + 1) for x in v]
        if any(r is None for r in members):
            return None
        return "set{" + ",".join(sorted(members)) + "}"  # type: ignore[arg-type]
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if isinstance(v, tuple):  # a named tuple: its fields
        return _plain(tuple(v), depth)
    if type(v).__module__ == "torch" and type(v).__name__ in ("dtype", "device", "Size", "layout", "memory_format"):
        return str(v)
    return None


def _function_digest(code: types.CodeType) -> str:
    got = _FUNCTION_DIGEST.get(code)
    if got is None:
        h = hashlib.sha256()
        _code_digest(code, h)
        got = _FUNCTION_DIGEST[code] = h.hexdigest()[:16]
    return got


@functools.lru_cache(maxsize=1)
def _module_bookkeeping() -> frozenset[str]:
    """The instance attributes every ``nn.Module`` has (hook dicts, ``_parameters``, ``training``...)."""
    import torch

    return frozenset(vars(torch.nn.Module()))


def _scalar_attrs(module: "torch.nn.Module") -> str:
    # the key is computed on every predict(model, spec): this loop is its hot path (~300 modules per model)
    skip = _module_bookkeeping()
    parts = []
    for k, v in module.__dict__.items():
        if k in skip:
            continue
        t = type(v)
        if t in _SCALAR_TYPES:
            parts.append(f"{k}={v!r}")
        elif t is types.FunctionType:
            parts.append(f"{k}=fn:{_function_digest(v.__code__)}")
        else:
            plain = _plain(v)
            if plain is not None:
                parts.append(f"{k}={plain}")
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
    """Key of an ONNX file: its bytes, the input spec and the converter versions.

    Raises:
        InvalidTypeError: ``data`` is not bytes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidTypeError(f"file_key(): data must be the file's bytes, got {type(data).__name__}")
    h = hashlib.sha256()
    h.update(b"onnx|")
    h.update(converter_version().encode())
    h.update(repr(sorted(spec.to_dict().items())).encode())
    h.update(hashlib.sha256(data).digest())
    return h.hexdigest()
