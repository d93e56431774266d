"""The search-space registry: :class:`SearchSpace`, ``@register_space`` and the lookup functions.

A search space is a parametrised model family: a schema of JSON-able config keys, a builder that turns a
config into an ``nn.Module``, a seeded sampler and the :class:`~dippm_nas.spec.InputSpec` a built model
takes. A name and a config are all it takes to rebuild a model — configs are plain JSON, nothing is
pickled.
"""

from __future__ import annotations

import abc
import copy
import hashlib
import logging
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from dippm_nas.errors import SearchSpaceError
from dippm_nas.spec import InputSpec
from search_spaces._params import Param, check_config

__all__ = [
    "BATCH_SIZES",
    "SearchSpace",
    "register_space",
    "get_space",
    "list_spaces",
    "build_model",
    "sample_batch_size",
    "module_signature",
    "as_rng",
    "make_divisible",
    "weighted_choice",
    "log_uniform_int",
]

logger = logging.getLogger(__name__)

#: Batch sizes :func:`sample_batch_size` draws from (powers of two, 1..256).
BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)

_REGISTRY: dict[str, "SearchSpace"] = {}


def as_rng(rng: "random.Random | int") -> random.Random:
    """A :class:`random.Random` from a seed (``int``) or the generator itself.

    Raises:
        SearchSpaceError: for anything else (``bool`` included).
    """
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, int) and not isinstance(rng, bool):
        return random.Random(rng)
    raise SearchSpaceError(f"rng must be a random.Random or an int seed, got {type(rng).__name__}: {rng!r}")


class SearchSpace(abc.ABC):
    """Base class of a parametrised model family.

    Subclasses set :attr:`params` (the config schema) and implement :meth:`default_config`,
    :meth:`_build` and :meth:`_sample`; they override :meth:`input_spec` when the input is not an
    image of side ``config["resolution"]``, and :meth:`_check` for rules across keys.

    Call order: :meth:`build` calls :meth:`validate` (schema, then :meth:`_check`), then :meth:`_build`
    under a fixed torch seed, then puts the model in eval mode. :meth:`sample` calls :meth:`_sample`,
    then :meth:`validate`, so a sampled config is always inside the space.

    Attributes:
        name: registry name, set by :func:`register_space`.
        params: ``{key: Param}``, the config schema (key order is the canonical order).
        presets: named reference configs (ImageNet-scale models of the literature).
    """

    name: str = ""
    params: ClassVar[Mapping[str, Param]] = {}
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    # ------------------------------------------------------------------ to implement
    @abc.abstractmethod
    def default_config(self) -> dict[str, Any]:
        """A complete, valid config; keys left out of a config passed to :meth:`build` take these values."""

    @abc.abstractmethod
    def _build(self, config: dict[str, Any]) -> nn.Module:
        """Build the model from a validated, complete config."""

    @abc.abstractmethod
    def _sample(self, rng: random.Random) -> dict[str, Any]:
        """Draw a config (it is validated by :meth:`sample`)."""

    def _check(self, config: dict[str, Any]) -> None:
        """Rules across keys (e.g. equal list lengths); raise :class:`SearchSpaceError`."""

    # ------------------------------------------------------------------ public
    def validate(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``config`` against the space and return the complete, normalised config.

        Keys left out take their :meth:`default_config` value; lists come back as lists. The result
        survives ``json.loads(json.dumps(...))`` unchanged.

        Raises:
            SearchSpaceError: unknown key, value outside its allowed values (the message names the key,
                the value and the allowed values), or keys that contradict each other.
        """
        # the defaults are made (a deep copy, for most spaces) only when a key is left out
        complete = isinstance(config, Mapping) and all(k in config for k in self.params)
        cfg = check_config(self.name, self.params, config, {} if complete else self.default_config())
        self._check(cfg)
        return cfg

    def build(self, config: Mapping[str, Any], *, seed: int | None = 0) -> nn.Module:
        """Build the model a config describes, in eval mode.

        Args:
            config: a config of this space (see :attr:`params`); left-out keys take defaults.
            seed: torch seed for the (random) weight initialisation, so the same config gives the same
                weights; ``None`` draws from torch's global generator. The global generator's state is
                not changed when a seed is given.

        Returns:
            An ``nn.Module`` in eval mode. Its ``search_space`` and ``search_space_config`` attributes
            record the space name and the complete config, ``search_space_signature`` its
            :func:`module_signature` (so a model changed after building is told apart from its config).

        Raises:
            SearchSpaceError: the config is outside the space, or the builder itself failed (the
                original exception is chained).
        """
        cfg = self.validate(config)
        try:
            if seed is None:
                model = self._build(cfg)
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    model = self._build(cfg)
        except SearchSpaceError:
            raise
        except Exception as e:  # a builder bug or a config the schema let through: say which
            raise SearchSpaceError(f"building {self.name} from config {cfg!r} failed: {type(e).__name__}: {e}") from e
        model.eval()
        model.search_space = self.name
        model.search_space_config = copy.deepcopy(cfg)
        model.search_space_signature = module_signature(model)
        return model

    def sample(self, rng: "random.Random | int") -> dict[str, Any]:
        """Draw a config, deterministically from ``rng``.

        Args:
            rng: a :class:`random.Random` (advanced in place) or an int seed.

        Returns:
            A complete, JSON-able config of this space.
        """
        return self.validate(self._sample(as_rng(rng)))

    def input_spec(self, config: Mapping[str, Any], batch_size: int = 1, dtype: str = "float32") -> InputSpec:
        """The input a model built from ``config`` takes.

        The default is an RGB image of side ``config["resolution"]``.

        Args:
            config: a config of this space.
            batch_size: the batch dimension, ``>= 1``.
            dtype: compute dtype (``"float32"``, ``"float16"``, ``"bfloat16"``).

        Shapes:
            - ``x``: ``(batch_size, 3, resolution, resolution)``
        """
        cfg = self.validate(config)
        return InputSpec(shape=(3, cfg["resolution"], cfg["resolution"]), batch_size=batch_size, dtype=dtype)

    def preset(self, name: str) -> dict[str, Any]:
        """A named reference config (see :attr:`presets`), complete and validated.

        Raises:
            SearchSpaceError: unknown preset name; the message lists the presets.
        """
        if name not in self.presets:
            raise SearchSpaceError(f"{self.name} has no preset {name!r}; presets: {sorted(self.presets)}")
        return self.validate(self.presets[name])

    def __repr__(self) -> str:
        return f"<SearchSpace {self.name!r}: keys {list(self.params)}>"


def module_signature(model: nn.Module) -> str:
    """A short digest of a module's structure: its submodules' classes and its parameters' and buffers' names
    and shapes, in registration order (not their values or dtypes: a model cast to half precision keeps it).

    :meth:`SearchSpace.build` records it as ``model.search_space_signature``; a model whose signature no
    longer matches was changed after building (a layer replaced, pruned or fused), so its config no longer
    describes it.
    """
    parts = []  # hashed as one text: the digest of the pieces' concatenation
    for name, m in model.named_modules():
        cls = type(m)
        parts.append(f"|{name}:{cls.__module__}.{cls.__qualname__}")
        for pname, p in m._parameters.items():
            if p is not None:
                parts.append(f"p{pname}{tuple(p.shape)}")
        for bname, b in m._buffers.items():
            if b is not None:
                parts.append(f"b{bname}{tuple(b.shape)}")
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:32]


_S = TypeVar("_S")


def register_space(name: str):
    """Class decorator registering a :class:`SearchSpace` under ``name``.

    A class is instantiated once (no arguments) and that instance is what :func:`get_space` returns;
    an instance may be registered directly. The instance's ``name`` is set to ``name``.

    Raises:
        SearchSpaceError: ``name`` is already registered, or the object is not a SearchSpace.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise SearchSpaceError(f"search-space name must be a Python identifier, got {name!r}")

    def deco(obj: _S) -> _S:
        instance = obj() if isinstance(obj, type) else obj
        if not isinstance(instance, SearchSpace):
            raise SearchSpaceError(f"@register_space({name!r}) needs a SearchSpace subclass, got {obj!r}")
        if name in _REGISTRY:
            raise SearchSpaceError(
                f"search space {name!r} is already registered (by {type(_REGISTRY[name]).__qualname__}); "
                "names must be unique"
            )
        if instance in _REGISTRY.values():
            raise SearchSpaceError(
                f"this {type(instance).__qualname__} object is already registered as {instance.name!r}; "
                f"register a new instance to use the name {name!r}"
            )
        instance.name = name
        _REGISTRY[name] = instance
        logger.debug("registered search space %s", name)
        return obj

    return deco


def list_spaces() -> list[str]:
    """Names of the registered search spaces, sorted."""
    return sorted(_REGISTRY)


def get_space(name: str) -> SearchSpace:
    """The registered search space called ``name``.

    Raises:
        SearchSpaceError: unknown name; the message lists the registered ones.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise SearchSpaceError(f"unknown search space {name!r}; choices: {list_spaces()}") from None


def build_model(name: str, config: Mapping[str, Any], *, seed: int | None = 0) -> nn.Module:
    """Build model ``config`` of search space ``name`` (eval mode); see :meth:`SearchSpace.build`."""
    return get_space(name).build(config, seed=seed)


def sample_batch_size(
    rng: "random.Random | int",
    choices: Sequence[int] = BATCH_SIZES,
    *,
    max_batch_size: int | None = None,
) -> int:
    """Draw a batch size, log-uniformly (each choice equally likely, choices being powers of two).

    Args:
        rng: a :class:`random.Random` or an int seed.
        choices: the batch sizes to draw from (ints >= 1).
        max_batch_size: drop choices above this (e.g. to keep a large model's activations small).

    Raises:
        SearchSpaceError: empty choices, a choice < 1, or no choice <= ``max_batch_size``.
    """
    r = as_rng(rng)
    bad = [c for c in choices if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if bad or not choices:
        raise SearchSpaceError(f"batch-size choices must be a non-empty sequence of ints >= 1, got {list(choices)}")
    allowed = [c for c in choices if max_batch_size is None or c <= max_batch_size]
    if not allowed:
        raise SearchSpaceError(f"no batch size in {list(choices)} is <= max_batch_size={max_batch_size}")
    return r.choice(allowed)


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round ``value`` to the nearest multiple of ``divisor``, never more than 10 % below it.

    The TF/torchvision ``_make_divisible`` rule used by MobileNet-style channel counts.
    """
    min_value = divisor if min_value is None else min_value
    new = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


def weighted_choice(rng: random.Random, choices: Sequence[Any], weights: Sequence[float]) -> Any:
    """One of ``choices`` drawn with relative ``weights`` (helper for samplers)."""
    return rng.choices(list(choices), weights=list(weights), k=1)[0]


def log_uniform_int(rng: random.Random, lo: int, hi: int, multiple_of: int = 1) -> int:
    """An int in ``[lo, hi]`` drawn log-uniformly and rounded to ``multiple_of`` (helper for samplers)."""
    v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    v = int(round(v / multiple_of)) * multiple_of
    return max(lo, min(hi, v))
