"""Checking data read from a file against the dataclass it becomes, with pydantic.

A file's mapping (TOML or JSON) is validated against the type hints of the existing dataclass
(:class:`~dippm_nas.devices.Device`, :class:`~dippm_nas.devices.HostProfile`, the checkpoint metadata, a
calibration...) by a pydantic ``TypeAdapter`` in strict mode on the file's JSON form: every field must have
its declared type (``"8"`` is not an int, ``true`` not a number, ``"fp32_tflops"`` not a list), unknown keys
are refused at every level, and the dataclass's own ``__post_init__`` checks (ranges, rules between fields)
run as the object is built. The error is a :class:`~dippm_nas.errors.DippmNasError` subclass naming the file,
the field path (``mig_profiles[0].name``), the bad value and what is expected.

A file whose every value already has exactly its field's JSON type (what dippm-nas writes, and any valid
hand-written file) is built by a direct walk of the same type hints, without pydantic: pydantic is imported
(about 0.1 s with its first adapter, on a 2-core machine) only for a file that walk does not accept, to
accept it as pydantic's strict mode does or to say precisely what is wrong. The walk accepts a subset of
what pydantic's strict mode accepts (``tests/reliability/test_reliability_files.py`` checks both give the same object),
so a cached prediction, calibrated or not, imports no pydantic.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from dippm_nas.errors import DippmNasError, InvalidValueError

__all__ = ["from_file_data", "check_file_fields", "file_layout"]

T = TypeVar("T")

_UNIONS = (typing.Union, types.UnionType)
#: pydantic's error types of a key that should not be there, or should and is not.
_KEY_PROBLEMS = {"unexpected_keyword_argument": "unknown", "extra_forbidden": "unknown", "missing_argument": "missing",
                 "missing": "missing", "missing_keyword_only_argument": "missing"}
#: How many of a file's problems one error lists.
_MAX_LISTED = 5
#: How many characters of a bad value an error shows.
_MAX_VALUE_CHARS = 80


def from_file_data(cls: type[T], data: Any, origin: str, error: type[DippmNasError] = InvalidValueError) -> T:
    """``cls`` (a dataclass, or a :func:`file_layout`) built from ``data``, a mapping read from a file, after
    checking every field.

    Args:
        cls: the dataclass or layout.
        data: the file's mapping (JSON- or TOML-like: dicts, lists, str, numbers, bools, None).
        origin: names the file in the error (``"user file /x/gpu.toml"``).
        error: the :class:`~dippm_nas.errors.DippmNasError` subclass raised.

    Raises:
        DippmNasError: (``error``) ``<origin>: <field path> = <value>: expected <type>`` for each field of the
            wrong type, ``unknown key`` (with the choices), ``missing`` (a required field), or the message of
            the dataclass's own check.
    """
    try:
        return typing.cast(T, _exact(cls, data))
    except Exception:  # noqa: BLE001 - not exactly typed, or a rule broken: pydantic accepts it or says why
        return typing.cast(T, _validate(_adapter(cls), cls, data, origin, error))


def check_file_fields(cls: type, data: Any, fields: Collection[str], origin: str,
                      error: type[DippmNasError] = InvalidValueError) -> dict[str, Any]:
    """Check a mapping that sets some of ``cls``'s ``fields`` (a partial record, e.g. a calibration file's
    ``"global"`` section): each key must be one of ``fields`` and each value of its field's type.

    Returns:
        The mapping, its values as validated (tuples for lists of tuple fields...).

    Raises:
        DippmNasError: (``error``) as :func:`from_file_data`; the record's own checks are not run (the caller
            builds the record).
    """
    try:
        hints = _hints(cls)
        if type(data) is not dict or not set(data) <= set(fields):
            raise _NotExact
        return {k: _exact(hints[k], v) for k, v in data.items()}
    except Exception:  # noqa: BLE001 - as in from_file_data
        partial = _partial(cls, tuple(sorted(fields)))
        return dict(_validate(_adapter(partial), partial, data, origin, error))


def file_layout(name: str, fields: Mapping[str, Any]) -> type:
    """A record type of a file's layout where it is no dataclass (a calibration file's sections): the keys
    ``fields`` (``{key: type}``, keys that are not identifiers allowed), each optional, unknown keys refused.
    Imports ``typing_extensions`` (pydantic needs its ``TypedDict`` before Python 3.12)."""
    from typing_extensions import TypedDict

    layout = TypedDict(name, dict(fields), total=False)  # type: ignore[misc,operator]
    layout.__pydantic_config__ = {"extra": "forbid"}  # type: ignore[attr-defined]
    return typing.cast(type, layout)


# ------------------------------------------------------------------------------------------------ internals
class _NotExact(Exception):
    """A value that does not have exactly its declared JSON type (pydantic decides)."""


_SEQUENCES = (tuple, list, Sequence, Collection)


def _exact(tp: Any, v: Any) -> Any:
    """``v`` built as type ``tp`` when every value has exactly its declared JSON type (``bool`` is not an int,
    an int is a float, lists are tuples where a tuple is declared, objects are dataclasses), the dataclasses'
    own checks run; :class:`_NotExact` (or the check's error) otherwise."""
    if tp is Any:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        if v is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise _NotExact
        return _exact(rest[0], v)
    if tp in (str, int, bool, type(None)):
        if type(v) is not tp:
            raise _NotExact
        return v
    if tp is float:
        if type(v) not in (int, float):
            raise _NotExact
        return float(v)
    if origin in _SEQUENCES and type(v) is list:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise _NotExact
        items = [_exact(args[0] if args else Any, x) for x in v]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) and type(v) is dict and len(args) == 2 and args[0] is str:
        if not all(type(k) is str for k in v):
            raise _NotExact
        return {k: _exact(args[1], x) for k, x in v.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type) and type(v) is dict:
        hints = _hints(tp)
        required = {f.name for f in dataclasses.fields(tp) if f.init and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}  # type: ignore[misc]
        if not set(v) <= set(hints) or not required <= set(v):
            raise _NotExact
        return tp(**{k: _exact(hints[k], x) for k, x in v.items()})
    if _is_layout(tp) and type(v) is dict:  # a file_layout(): every key optional
        hints = _hints(tp)
        if not set(v) <= set(hints):
            raise _NotExact
        return {k: _exact(hints[k], x) for k, x in v.items()}
    raise _NotExact


def _is_layout(tp: Any) -> bool:
    """Whether ``tp`` is a TypedDict (a :func:`file_layout`)."""
    return isinstance(tp, type) and hasattr(tp, "__annotations__") and hasattr(tp, "__total__")


def _validate(adapter: Any, cls: type, data: Any, origin: str, error: type[DippmNasError]) -> Any:
    from pydantic import ValidationError

    try:
        text = json.dumps(data, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise error(f"{origin}: holds a value a JSON file cannot hold ({e})") from None
    try:
        return adapter.validate_json(text, strict=True)
    except ValidationError as e:
        problems = e.errors(include_url=False)
    entries: dict[tuple[Any, ...], Any] = {}  # in order: (kind, where) -> a line, or the unknown keys there
    for i, p in enumerate(problems):
        loc = tuple(p.get("loc", ()))
        kind = _KEY_PROBLEMS.get(p.get("type", ""))
        if kind is not None:
            entries.setdefault((kind, loc[:-1]), []).append(str(loc[-1]))
        else:
            entries[("problem", i)] = _problem(cls, p)
    lines = [v if kind == "problem" else _keys(cls, kind, where, v) for (kind, where), v in entries.items()]
    more = f"; and {len(lines) - _MAX_LISTED} more" if len(lines) > _MAX_LISTED else ""
    raise error(f"{origin}: " + "; ".join(lines[:_MAX_LISTED]) + more)


def _keys(cls: type, kind: str, parent: tuple[Any, ...], keys: list[str]) -> str:
    """``<where>: unknown keys [...]; choices: [...]`` or ``<where>: missing required keys [...]``."""
    where = _path(parent)
    if kind == "missing":
        return f"{where + ': ' if where else ''}missing required keys {keys}"
    choices = _field_names(_type_at(cls, parent))
    return f"{where + ': ' if where else ''}unknown keys {sorted(keys)}" + (f"; choices: {choices}" if choices else "")


def _problem(cls: type, p: Mapping[str, Any]) -> str:
    loc = tuple(p.get("loc", ()))
    path = _path(loc)
    kind = p.get("type", "")
    cause = (p.get("ctx") or {}).get("error")
    if kind == "value_error" and isinstance(cause, DippmNasError):
        return f"{path + ': ' if path else ''}{cause}"
    value = _short(p.get("input"))
    expected = _type_at(cls, loc)
    want = _describe(expected) if expected is not None else str(p.get("msg", "")).lower()
    return f"{path or 'the file'} = {value}: expected {want}"


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[:_MAX_VALUE_CHARS - 3] + "..."


def _strip_optional(tp: Any) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in _UNIONS and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


@lru_cache(maxsize=None)
def _hints(tp: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp)
        return {f.name: hints[f.name] for f in dataclasses.fields(tp) if f.init}
    if _is_layout(tp):
        return dict(typing.get_type_hints(tp))
    return {}


def _type_at(cls: type, loc: Sequence[Any]) -> Any:
    """The declared type at ``loc`` inside ``cls`` (``None`` where the walk loses it)."""
    tp: Any = cls
    for part in loc:
        tp = _strip_optional(tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        hints = _hints(tp)
        if hints:
            if part not in hints:
                return None
            tp = hints[part]
        elif origin in (tuple, list, Sequence, set, frozenset, Collection) and args:
            tp = args[0]
        elif origin in (dict, Mapping) and len(args) == 2:
            tp = args[1]
        else:
            return None
    return tp


def _field_names(tp: Any) -> list[str]:
    return sorted(_hints(_strip_optional(tp))) if tp is not None else []


_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null",
          Any: "any value"}


def _describe(tp: Any) -> str:
    """What a value of type ``tp`` looks like in a file (``"a list of strings"``, ``"a number or null"``)."""
    if tp in _NAMES:
        return _NAMES[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return " or ".join(_describe(a) for a in args)
    if origin in (tuple, list, Sequence, set, frozenset, Collection):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} values ({', '.join(_describe(a) for a in args)})"
        return f"a list of {_plural(args[0]) if args else 'values'}"
    if origin in (dict, Mapping):
        return f"a table (object) of {_plural(args[1]) if len(args) == 2 else 'values'}"
    if _hints(tp):
        return f"a table (object) with the keys {sorted(_hints(tp))}"
    return getattr(tp, "__name__", str(tp))


_PLURALS = {str: "strings", int: "integers", float: "numbers", bool: "booleans", Any: "values"}


def _plural(tp: Any) -> str:
    return _PLURALS.get(tp) or f"values ({_describe(tp)} each)"


def _forbid_extra(tp: Any, seen: set[Any]) -> None:
    """Mark ``tp`` and every dataclass reachable from its fields as refusing unknown keys (pydantic reads
    ``__pydantic_config__`` on stdlib dataclasses; their default ignores unknown keys)."""
    tp = _strip_optional(tp)
    if tp in seen:
        return
    seen.add(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type) and "__pydantic_config__" not in vars(tp):
        tp.__pydantic_config__ = {"extra": "forbid"}  # type: ignore[attr-defined]
    for sub in list(_hints(tp).values()) + list(typing.get_args(tp)):
        if sub is not Ellipsis:
            _forbid_extra(sub, seen)


@lru_cache(maxsize=None)
def _adapter(cls: Any) -> Any:
    from pydantic import TypeAdapter

    _forbid_extra(cls, set())
    return TypeAdapter(cls)


@lru_cache(maxsize=None)
def _partial(cls: type, fields: tuple[str, ...]) -> type:
    """A layout of ``fields`` of ``cls``, every key optional, unknown keys refused."""
    hints = _hints(cls)
    unknown = [f for f in fields if f not in hints]
    if unknown:
        raise InvalidValueError(f"{cls.__name__} has no fields {unknown}")
    return file_layout(f"{cls.__name__}Fields", {f: hints[f] for f in fields})
