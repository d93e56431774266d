"""What a user hands to ``capture`` / ``predict`` / ``evaluate``, parsed once: :class:`ModelSource`.

A model comes in one of five forms (:data:`SOURCE_KINDS`): an :class:`~dippm_nas.graph.OperatorGraph`
already captured, an ``nn.Module``, an ONNX file, a model SPEC string (:func:`~dippm_nas.capture.load_model`)
or a zero-argument factory returning an ``nn.Module`` (a function, a class, or
``functools.partial(search_spaces.build_model, name, config)``). :meth:`ModelSource.parse` decides the form,
checks the input spec against it and reads the registered search space a candidate comes from, so the
stages after it take a typed value and never ask again what the model is.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from dippm_nas._logging import WarnOnce
from dippm_nas.capture._load import SPEC_FORMS, load_model
from dippm_nas.errors import DippmNasError, InputSpecError, ModelSpecError, SearchSpaceError
from dippm_nas.graph import OperatorGraph
from dippm_nas.spec import InputSpec

__all__ = ["ModelSource", "SourceKind", "SOURCE_KINDS", "space_config_of"]

_warn_once = WarnOnce(logging.getLogger(__name__))

#: The forms of a model: a captured graph, an ``nn.Module``, an ONNX file, a model SPEC string, a factory.
SourceKind = Literal["graph", "module", "onnx", "spec", "factory"]
SOURCE_KINDS: tuple[str, ...] = get_args(SourceKind)

#: What :meth:`ModelSource.parse` accepts, for the messages.
_FORMS = ("an OperatorGraph", "a torch.nn.Module", "a path to an .onnx file",
          f"a model SPEC string ({'; '.join(SPEC_FORMS[:3])}; package.module:callable)",
          "a zero-argument factory returning an nn.Module (a function, a class, or "
          "functools.partial(search_spaces.build_model, name, config))")


def space_config_of(model: Any) -> tuple[str, dict[str, Any]] | None:
    """``(space name, config)`` of a model that comes from a registered search space, else ``None``.

    Recognised: an ``nn.Module`` made by :meth:`search_spaces.SearchSpace.build` whose module classes and
    parameter shapes are still those it was built with (its ``search_space_signature``), and the lazy form
    ``functools.partial(search_spaces.build_model, name, config)``. A module edited in place in some other
    way (an attribute such as a stride changed) is not detected: delete its ``search_space`` attribute to
    have it captured whole.
    """
    ss = sys.modules.get("search_spaces")
    if ss is None:  # no model comes from a search space that was never imported (and torch stays unloaded)
        return None
    if isinstance(model, functools.partial):
        if model.func is ss.build_model and len(model.args) == 2 and not model.keywords \
                and isinstance(model.args[0], str) and isinstance(model.args[1], Mapping):
            return model.args[0], dict(model.args[1])
        return None
    declared = _declared_space(model)
    signature = getattr(model, "search_space_signature", None)
    if declared is None or not isinstance(signature, str):
        return None
    if ss.module_signature(model) != signature:
        _warn_once("changed:" + declared[0], "a %s model was changed after search_spaces built it (its modules or "
                   "parameter shapes differ): capturing it whole instead of assembling its config's blocks",
                   declared[0])
        return None
    return declared


def _declared_space(model: Any) -> tuple[str, dict[str, Any]] | None:
    """``(model.search_space, model.search_space_config)`` when a module carries both (set by
    :func:`search_spaces.build_model`), whether or not it was changed since."""
    name = getattr(model, "search_space", None)
    config = getattr(model, "search_space_config", None)
    if isinstance(name, str) and isinstance(config, Mapping):
        return name, dict(config)
    return None


def _is_module(obj: Any) -> bool:
    """Whether ``obj`` is an ``nn.Module`` instance (torch is never imported for the answer: no module exists
    before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _kind_of(model: Any) -> SourceKind:
    if isinstance(model, OperatorGraph):
        return "graph"
    if isinstance(model, os.PathLike) or (isinstance(model, str) and model.lower().endswith(".onnx")):
        return "onnx"
    if isinstance(model, str):
        if not model:
            raise ModelSpecError(f"model SPEC must be a non-empty string, one of: {'; '.join(SPEC_FORMS)}; got ''")
        return "spec"
    if _is_module(model):
        return "module"
    if callable(model) and not isinstance(model, (bytes, bytearray)):
        return "factory"
    raise ModelSpecError(f"model must be one of: {'; '.join(_FORMS)}; got {type(model).__name__} "
                         f"{repr(model)[:80]}")


def _checked_spec(kind: SourceKind, model: Any, spec: Any) -> InputSpec:
    """The input spec of a model of ``kind``: ``spec``, or a graph's own."""
    if spec is not None and not isinstance(spec, InputSpec):
        raise InputSpecError(f"spec must be a dippm_nas.InputSpec, e.g. InputSpec(shape=(3, 224, 224), batch_size=8), "
                             f"or None with an OperatorGraph; got {type(spec).__name__} {spec!r}")
    if kind == "graph":
        if spec is not None and spec != model.spec:
            raise InputSpecError(f"the graph was captured with {model.spec}, which differs from spec={spec}; pass "
                                 "spec=None with a graph, or capture the model again with the new spec")
        return model.spec
    if spec is None:
        raise InputSpecError(f"spec is required with a model ({kind}: InputSpec(shape=(3, 224, 224), batch_size=8)); "
                             "only an OperatorGraph carries its own")
    return spec


@dataclass(frozen=True, eq=False)
class ModelSource:
    """One model as a user hands it in, with the input spec its figures are for.

    Made by :meth:`parse` (or :meth:`from_space`); the stages after it read the fields and never inspect the
    model again.

    Attributes:
        kind: the form, one of :data:`SOURCE_KINDS`.
        model: the object as given: an :class:`OperatorGraph`, an ``nn.Module``, a :class:`~pathlib.Path` to an
            ONNX file, a SPEC string, or a factory.
        spec: the input spec (a graph's own for a graph).
        search_space: the registered search space the model is a candidate of (a
            ``functools.partial(search_spaces.build_model, name, config)`` or a module built by
            :func:`search_spaces.build_model`), else ``None``; recorded so a validator can rebuild it.
        search_space_config: the candidate's config in that space, else ``None``.
        assemblable: whether the graph is assembled from the space's cached blocks
            (:func:`~dippm_nas.capture.assemble`) rather than exported: the model is that space's candidate
            unchanged since it was built (see :func:`space_config_of`).
    """

    kind: SourceKind
    model: Any
    spec: InputSpec
    search_space: str | None = None
    search_space_config: dict[str, Any] | None = None
    assemblable: bool = False

    @classmethod
    def parse(cls, model: Any, spec: InputSpec | None = None) -> "ModelSource":
        """The :class:`ModelSource` of ``model``; torch is not imported (a module exists only once it is).

        Args:
            model: an :class:`OperatorGraph`, ``nn.Module``, ONNX path (a :class:`~os.PathLike` or a string
                ending in ``.onnx``), model SPEC string, zero-argument factory, or a :class:`ModelSource`
                (returned as it is when ``spec`` agrees).
            spec: the input spec; ``None`` (or the graph's own) with a graph, required otherwise.

        Raises:
            ModelSpecError: ``model`` is none of the forms (the forms are listed), or an empty string.
            InputSpecError: ``spec`` is not an :class:`InputSpec`, is missing with a model, or differs from a
                graph's own.
        """
        if isinstance(model, ModelSource):
            if spec is not None and spec != model.spec:
                raise InputSpecError(f"the ModelSource is for {model.spec}, which differs from spec={spec}; pass "
                                     "spec=None with a ModelSource")
            return model
        kind = _kind_of(model)
        the_spec = _checked_spec(kind, model, spec)
        if kind == "onnx":
            return cls("onnx", Path(model), the_spec)
        declared = _declared_space(model) if kind == "module" else space_config_of(model) if kind == "factory" \
            else None
        assembled = declared is not None and (kind == "factory" or space_config_of(model) is not None)
        return cls(kind, model, the_spec, *(declared or (None, None)), assemblable=assembled)

    @classmethod
    def from_space(cls, space: str, config: Mapping[str, Any], spec: InputSpec) -> "ModelSource":
        """The candidate ``config`` of the registered search space ``space``: a lazy factory
        (``functools.partial(search_spaces.build_model, space, config)``) whose graph is assembled from blocks.

        Raises:
            SearchSpaceError: ``space`` is not a registered name (the names are listed) or ``config`` is not a
                mapping.
            InputSpecError: ``spec`` is not an :class:`InputSpec`.
        """
        import search_spaces  # imports torch: loaded for a candidate named by its space and config only

        if not isinstance(config, Mapping):
            raise SearchSpaceError(f"config of search space {space!r} must be a mapping (a JSON config of the space), "
                                   f"got {type(config).__name__} {config!r}")
        search_spaces.get_space(space)  # an unknown name lists the registered ones
        return cls.parse(functools.partial(search_spaces.build_model, space, dict(config)), spec)

    # ------------------------------------------------------------------ views
    @property
    def graph(self) -> OperatorGraph | None:
        """The graph of a ``"graph"`` source, else ``None`` (it is yet to be captured or assembled)."""
        return self.model if self.kind == "graph" else None

    @property
    def label(self) -> str:
        """A short description for messages and records: the SPEC string, the ONNX file's name, the module's
        class, the factory's name (``space:config`` for a search-space candidate) or the graph's source."""
        if self.kind == "spec":
            return str(self.model)
        if self.kind == "onnx":
            return self.model.name
        if self.kind == "graph":
            return self.model.source or "OperatorGraph"
        if self.kind == "factory" and self.search_space is not None:
            return f"{self.search_space} candidate"
        target = self.model.func if isinstance(self.model, functools.partial) else self.model
        name = getattr(target, "__qualname__", None) if self.kind == "factory" else None
        return str(name or type(self.model).__name__)

    def build(self) -> Any:
        """The ``nn.Module`` to capture (eval mode for a SPEC string), or the :class:`~pathlib.Path` of an ONNX file.

        A SPEC string is resolved with :func:`~dippm_nas.capture.load_model`; a factory is called with no
        arguments.

        Raises:
            ModelSpecError: a SPEC string that does not resolve, a factory that raises or returns something other
                than an ``nn.Module``, or a ``"graph"`` source (it has no model to build).
        """
        if self.kind in ("module", "onnx"):
            return self.model
        if self.kind == "spec":
            return load_model(self.model)
        if self.kind == "graph":
            raise ModelSpecError("a graph source has no model to build: its graph is ModelSource.graph")
        try:
            built = self.model()
        except DippmNasError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the factory is user code
            raise ModelSpecError(f"the model factory {self.label} raised {type(e).__name__}: {e}") from e
        if not _is_module(built):
            raise ModelSpecError(f"the model factory {self.label} returned {type(built).__name__}, expected a "
                                 "torch.nn.Module")
        return built
