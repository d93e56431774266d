"""Declarative config schemas: what values each config key of a search space may take.

A search space declares its keys as a mapping ``{key: Param}``. :func:`check_config` fills the keys a
caller left out from the space's default config, rejects unknown keys, checks every value against its
:class:`Param` and returns a normalised copy made only of JSON types (``int``, ``float``, ``bool``,
``str``, ``list``, ``dict``), so ``json.loads(json.dumps(cfg)) == cfg`` for every valid config.

Every failure raises :class:`~dippm_nas.errors.SearchSpaceError` naming the space, the key (with its
index path for lists and nested dicts), the bad value and the allowed values.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Mapping, Sequence
from typing import Any

from dippm_nas.errors import SearchSpaceError

__all__ = ["Param", "Choice", "IntRange", "ListOf", "Struct", "check_config", "fail"]


def fail(space: str, where: str, rule: str, value: Any) -> SearchSpaceError:
    """A :class:`SearchSpaceError` for config key ``where`` of ``space`` breaking ``rule``."""
    return SearchSpaceError(f"{space} config {where} must be {rule}, got {value!r}")


class Param(abc.ABC):
    """The allowed values of one config key (or one list item / struct field)."""

    @abc.abstractmethod
    def check(self, value: Any, space: str, where: str) -> Any:
        """Return the normalised value, or raise :class:`SearchSpaceError`.

        Args:
            value: the value given in the config.
            space: search-space name, for the message.
            where: the key path, e.g. ``"'k'[3]"``, for the message.
        """

    @abc.abstractmethod
    def describe(self) -> str:
        """The rule in words, e.g. ``"one of [3, 5]"``."""


def _same_kind(value: Any, allowed: Any) -> bool:
    # bool is an int subclass and 1 == True: keep bools and numbers apart; accept an int for a float.
    if isinstance(allowed, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(allowed, bool)
    if isinstance(allowed, float):
        return isinstance(value, (int, float))
    return type(value) is type(allowed)


class Choice(Param):
    """One of a fixed set of values (ints, floats, bools or strings).

    Args:
        *values: the allowed values.
    """

    def __init__(self, *values: Any) -> None:
        if not values:
            raise ValueError("Choice needs at least one value")
        self.values = tuple(values)
        # (type, value) -> the allowed value: a hit is a value of the allowed one's own type, equal to it
        self._exact: dict[tuple[type, Any], Any] = {}
        for v in self.values:
            try:
                self._exact.setdefault((type(v), v), v)
            except TypeError:  # an unhashable choice is found by the scan below
                pass

    def check(self, value: Any, space: str, where: str) -> Any:
        try:
            return self._exact[(type(value), value)]
        except (KeyError, TypeError):  # another type (an int for a float choice), an unhashable value, or none
            pass
        for v in self.values:
            if _same_kind(value, v) and value == v:
                return v
        raise fail(space, where, self.describe(), value)

    def describe(self) -> str:
        return f"one of {list(self.values)}"


class IntRange(Param):
    """An int in ``[lo, hi]``, optionally a multiple of ``multiple_of``."""

    def __init__(self, lo: int, hi: int, multiple_of: int = 1) -> None:
        self.lo, self.hi, self.multiple_of = lo, hi, multiple_of

    def check(self, value: Any, space: str, where: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi \
                or value % self.multiple_of:
            raise fail(space, where, self.describe(), value)
        return int(value)

    def describe(self) -> str:
        mult = f" and a multiple of {self.multiple_of}" if self.multiple_of > 1 else ""
        return f"an int in [{self.lo}, {self.hi}]{mult}"


class ListOf(Param):
    """A list of ``min_len..max_len`` items, each checked by ``item`` (or by ``overrides[index]``).

    Args:
        item: the rule for every item.
        min_len: fewest items.
        max_len: most items.
        overrides: a different rule for some indices (e.g. stage 5 of the MBConv space allows 4 layers).
    """

    def __init__(self, item: Param, min_len: int, max_len: int, overrides: Mapping[int, Param] | None = None) -> None:
        self.item, self.min_len, self.max_len = item, min_len, max_len
        self.overrides = dict(overrides or {})

    def check(self, value: Any, space: str, where: str) -> Any:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) \
                or not self.min_len <= len(value) <= self.max_len:
            raise fail(space, where, self.describe(), value)
        return [self.overrides.get(i, self.item).check(v, space, f"{where}[{i}]") for i, v in enumerate(value)]

    def describe(self) -> str:
        n = f"{self.min_len}" if self.min_len == self.max_len else f"{self.min_len}..{self.max_len}"
        extra = "".join(f"; item {i}: {p.describe()}" for i, p in sorted(self.overrides.items()))
        return f"a list of {n} items, each {self.item.describe()}{extra}"


class Struct(Param):
    """A dict with exactly the given keys (no defaults, no extra keys)."""

    def __init__(self, fields: Mapping[str, Param]) -> None:
        self.fields = dict(fields)

    def check(self, value: Any, space: str, where: str) -> Any:
        if not isinstance(value, Mapping):
            raise fail(space, where, f"a dict with keys {list(self.fields)}", value)
        unknown = sorted(set(value) - set(self.fields))
        missing = [k for k in self.fields if k not in value]
        if unknown or missing:
            raise SearchSpaceError(
                f"{space} config {where} must have exactly the keys {list(self.fields)}; "
                f"unknown {unknown}, missing {missing} in {dict(value)!r}"
            )
        return {k: p.check(value[k], space, f"{where}[{k!r}]") for k, p in self.fields.items()}

    def describe(self) -> str:
        return "{" + ", ".join(f"{k!r}: {p.describe()}" for k, p in self.fields.items()) + "}"


def check_config(space: str, params: Mapping[str, Param], config: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Fill left-out keys from ``defaults``, reject unknown keys and check every value.

    Args:
        space: search-space name, for messages.
        params: the schema ``{key: Param}``.
        config: the caller's config (a mapping; keys left out take the default).
        defaults: the space's default config (complete).

    Returns:
        A new, complete, JSON-typed config dict in schema key order.

    Raises:
        SearchSpaceError: config not a mapping, an unknown key, or a value outside its rule.
    """
    if not isinstance(config, Mapping):
        raise SearchSpaceError(f"{space} config must be a dict of {sorted(params)}, got {type(config).__name__}")
    unknown = sorted(str(k) for k in config if k not in params)
    if unknown:
        raise SearchSpaceError(f"{space} config has unknown keys {unknown}; valid keys are {list(params)}")
    out: dict[str, Any] = {}
    for key, param in params.items():
        value = config[key] if key in config else copy.deepcopy(defaults[key])
        out[key] = param.check(value, space, repr(key))
    return out
