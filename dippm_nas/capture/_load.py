"""Model SPEC strings and ONNX files: the forms of a model that name it rather than hold it.

``load_model`` builds the ``nn.Module`` a SPEC string names (``torchvision:NAME``, ``timm:NAME``,
``timm-reparam:NAME``, ``timm-results:NAME``, ``package.module:callable``) or checks the ONNX file it points to;
``load_callable`` resolves ``package.module:callable`` without calling it. :class:`~dippm_nas.capture.ModelSource` parses
every form a user hands in and calls these for the named ones.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dippm_nas._files import file_size, read_file
from dippm_nas._optional import require
from dippm_nas.capture._timm_results import results_form
from dippm_nas.errors import ModelSpecError

__all__ = ["MAX_ONNX_BYTES", "SPEC_FORMS", "check_onnx_file", "read_onnx_file", "load_model", "load_callable"]

#: Largest ONNX file read, bytes: 2 GiB, protobuf's limit on one serialised message, which an ``.onnx`` file
#: is. A model with more weights keeps them as external data (``onnx.save(model, path,
#: save_as_external_data=True)``): its ``.onnx`` file holds the graph and stays small, and the tensors are read
#: from their own files beside it.
MAX_ONNX_BYTES = 2**31
#: What the message of an ONNX file over :data:`MAX_ONNX_BYTES` adds.
_ONNX_HINT = (" (protobuf's 2 GiB limit on one ONNX message); a larger model keeps its weights as external data "
              "(onnx.save(model, path, save_as_external_data=True)), which is read from its own files beside the "
              ".onnx file")



def check_onnx_file(path: str | os.PathLike[str]) -> int:
    """The size in bytes of the ONNX file ``path``: a regular file (symlinks followed) of at most
    :data:`MAX_ONNX_BYTES`. Nothing is read.

    Raises:
        ModelSpecError: a missing path, a FIFO, device, directory or other non-regular file, or a file over
            the limit; the message names the path and what it is.
    """
    return file_size(path, "ONNX file", max_bytes=MAX_ONNX_BYTES, error=ModelSpecError, hint=_ONNX_HINT)


def read_onnx_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the ONNX file ``path``, checked as by :func:`check_onnx_file` on the open file.

    Raises:
        ModelSpecError: as :func:`check_onnx_file`, or a read error.
    """
    return read_file(path, "ONNX file", max_bytes=MAX_ONNX_BYTES, error=ModelSpecError, hint=_ONNX_HINT)


# ----------------------------------------------------------------- model SPEC strings
#: The forms of a model SPEC string, for the messages.
SPEC_FORMS = (
    "torchvision:NAME (e.g. torchvision:resnet50)",
    "timm:NAME (e.g. timm:resnet18)",
    "timm-reparam:NAME (the timm model after timm's reparameterize_model, e.g. timm-reparam:mobileone_s0)",
    "timm-results:NAME (the timm model as timm's published benchmark results timed it, "
    "e.g. timm-results:hiera_base_224)",
    "a path to an .onnx file",
    "package.module:callable (a function or class returning an nn.Module)",
)


def load_model(spec: str) -> "Any":
    """Resolve a model SPEC string to a model (``nn.Module``) or an ONNX file path.

    Models are built with random weights: capture needs the architecture, never trained weights,
    and nothing is downloaded.

    Args:
        spec: ``torchvision:NAME``, ``timm:NAME``, ``timm-reparam:NAME``, ``path/to/model.onnx`` or
            ``package.module:callable``. ``timm-reparam:NAME`` is the inference form timm deploys and
            benchmarks with ``--reparam``: ``timm.utils.model.reparameterize_model`` fuses RepVGG/MobileOne
            branches and conv+BN pairs (RepVGG, MobileOne, FastViT, RepViT, RepGhost, LeViT...); for a
            model without such modules it is the same model as ``timm:NAME``. ``timm-results:NAME`` is the model
            timm's published ``benchmark-infer`` results timed: ``timm:NAME`` with the kernel changes timm made
            since undone (:data:`~dippm_nas.capture._timm_results.RESULTS_CHANGES`; a model without any is the
            same model as ``timm:NAME``).

    Returns:
        An ``nn.Module`` in eval mode, or a :class:`pathlib.Path` for an ONNX file.

    Only ``package.module:callable`` imports and runs code you name: the module is imported with the
    working directory appended to ``sys.path`` (so a file there never shadows an installed package), the
    callable must be a function or class outside the standard library, and it is called with no
    arguments. A SPEC string is code: resolve only SPEC strings you would run as Python.

    Raises:
        ModelSpecError: malformed spec, unknown model name, missing file or callable, a standard-library
            or builtin callable, or anything the callable raises or returns other than an ``nn.Module``.
        MissingDependencyError: torchvision/timm not installed.
    """
    if not isinstance(spec, str) or not spec:
        raise ModelSpecError(f"model SPEC must be a non-empty string, one of: {'; '.join(SPEC_FORMS)}; got {spec!r}")
    if spec.lower().endswith(".onnx"):
        check_onnx_file(spec)
        return Path(spec)
    prefix, sep, name = spec.partition(":")
    if not sep or not name:
        raise ModelSpecError(f"model SPEC must be one of: {'; '.join(SPEC_FORMS)}; got {spec!r}")
    if prefix == "torchvision":
        require("torchvision", "vision", f"building {spec}")
        import torchvision.models as tv_models
        available = tv_models.list_models()
        if name not in available:
            raise ModelSpecError(
                f"torchvision has no model {name!r}; choices include {', '.join(sorted(available)[:20])}, ..."
            )
        return tv_models.get_model(name, weights=None).eval()
    if prefix in ("timm", "timm-reparam", "timm-results"):
        timm = require("timm", "vision", f"building {spec}")
        if not timm.is_model(name):
            raise ModelSpecError(f"timm has no model {name!r}; see timm.list_models() for the choices")
        model = timm.create_model(name, pretrained=False).eval()
        if prefix == "timm-reparam":
            from timm.utils.model import reparameterize_model

            model = reparameterize_model(model, inplace=True).eval()
        if prefix == "timm-results":
            model = results_form(model, name)
        return model
    return _call_user_callable(spec, prefix, name)


def _defining_module(obj: Any) -> str:
    """The module that defines callable ``obj`` (its class's for an instance with ``__call__``)."""
    if isinstance(obj, functools.partial):
        return _defining_module(obj.func)
    if isinstance(obj, (types.FunctionType, type)):
        return str(getattr(obj, "__module__", "") or "")
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                        types.WrapperDescriptorType, types.MethodDescriptorType)):
        return str(getattr(obj, "__module__", None) or "builtins")
    return str(getattr(type(obj), "__module__", "") or "")


def _is_standard_library(module: str) -> bool:
    top = module.split(".")[0]
    return top in sys.stdlib_module_names or top in ("builtins", "__main__", "")


def load_callable(spec: str, *, what: str = "model SPEC",
                  returns: str = "an nn.Module") -> Callable[..., Any]:
    """Resolve ``package.module:callable`` to the callable it names, without calling it.

    The module is imported with the working directory appended to ``sys.path`` (a file there never
    shadows an installed package); the callable must be a function or class outside the standard
    library. A SPEC string is code: resolve only SPEC strings you would run as Python.

    Args:
        spec: ``package.module:callable`` (``callable`` may be dotted: ``module:Class.factory``).
        what: what the string is, for the messages (``"model SPEC"``, ``"model_factory"``...).
        returns: what the callable should return, for the messages.

    Returns:
        The callable.

    Raises:
        ModelSpecError: not of the form ``package.module:callable``, a module that cannot be imported (or
            raises while importing), a missing attribute (the module's public callables are listed), not a
            callable, or a standard-library or builtin callable.
    """
    form = f"'package.module:callable' (a function or class returning {returns})"
    if not isinstance(spec, str):
        raise ModelSpecError(f"{what} must be {form}, got {type(spec).__name__} {spec!r}")
    prefix, sep, name = spec.partition(":")
    if not sep or not prefix or not name or any(not p.isidentifier() for p in (*prefix.split("."),
                                                                                 *name.split("."))):
        raise ModelSpecError(f"{what} must be {form}, got {spec!r}")
    if _is_standard_library(prefix):
        raise ModelSpecError(
            f"{what} {spec!r} names the Python standard library ({prefix.split('.')[0]!r}); "
            f"package.module:callable must name your own code, a function or class returning {returns}"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # after every installed package: a file here never shadows one
    try:
        module = importlib.import_module(prefix)
    except ImportError as e:
        raise ModelSpecError(f"cannot import module {prefix!r} of {what} {spec!r}: {e}") from e
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the module's own code failed while importing
        raise ModelSpecError(f"importing module {prefix!r} of {what} {spec!r} raised "
                             f"{type(e).__name__}: {e}") from e
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            choices = sorted(k for k, v in vars(module).items() if not k.startswith("_") and callable(v)
                             and _defining_module(v) == module.__name__)
            raise ModelSpecError(f"module {prefix!r} has no attribute {name!r} ({what} {spec!r}); "
                                 f"callables defined there: {choices}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelSpecError(f"{spec!r} must name a callable returning {returns}, got {type(obj).__name__}")
    where = _defining_module(obj)
    if _is_standard_library(where) or isinstance(obj, types.BuiltinFunctionType):
        raise ModelSpecError(
            f"{spec!r} is {type(obj).__name__} {getattr(obj, '__name__', obj)!r} defined in {where or 'no module'!r} "
            "(the Python standard library or a builtin); package.module:callable must name a function or class "
            f"of your code that returns {returns}"
        )
    return obj


def _call_user_callable(spec: str, prefix: str, name: str) -> Any:
    """``package.module:callable``: resolve it (:func:`load_callable`), call it with no arguments;
    anything it raises or returns other than an ``nn.Module`` is a :class:`ModelSpecError`."""
    obj = load_callable(spec)
    try:
        model = obj()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever user code raises is the SPEC's error
        raise ModelSpecError(f"calling {spec!r} raised {type(e).__name__}: {e}") from e
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ModelSpecError(f"{spec!r} returned {type(model).__name__}, expected a torch.nn.Module")
    return model.eval()
